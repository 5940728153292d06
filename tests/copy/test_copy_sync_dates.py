"""``sync`` from local files to S3, whose dates are whole seconds: a file modified in the
second of its upload is not copied again, and a change is never skipped for it. moto's
server behind the package's fault proxy, which records every request."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from s3_encrypting_front import EncryptingFront
from sync_runs import local_folder, sync

MiB = 1 << 20


def _writes(b: Any) -> list[str]:
    return [q.path for q in b.requests if q.method in ("PUT", "POST")]


def _into_its_upload_second(b: Any, src: Path, name: str, at: float = 0.5) -> None:
    """Date the file ``at`` s into the second S3 dates its copy (S3's LastModified is
    that second's start): as a file written just before its upload, in the same second."""
    second = b.server.client.head_object(Bucket=b.bucket, Key=f"dst/{name}")["LastModified"]
    when = second.timestamp() + at
    os.utime(src / name, (when, when))


@pytest.mark.parametrize("size", [1000, 6 * MiB], ids=["one PUT", "in parts"])
def test_a_file_modified_in_the_second_of_its_upload_is_not_copied_again(
        tensorstream_s3: Any, tmp_path: Path, size: int) -> None:
    """The file's date has nanoseconds, its copy's whole seconds: a file written in the
    second it was uploaded looked newer than its copy, and the second sync copied it
    again. In that second the dates cannot tell, so the file's MD5 (of its parts, in the
    part size a copy uploads) is compared with the copy's ETag: equal, nothing is sent."""
    b = tensorstream_s3
    src = local_folder(tmp_path, {"m.bin": os.urandom(size)})
    options = {**b.options, "part_size": 5 * MiB}
    assert sync(str(src), b.uri("dst/"), options) == {"m.bin": "copied"}
    _into_its_upload_second(b, src, "m.bin")
    b.proxy.clear_log()
    assert sync(str(src), b.uri("dst/"), options) == {"m.bin": "skipped"}
    assert _writes(b) == []


@pytest.mark.parametrize("size", [1000, 6 * MiB], ids=["one PUT", "in parts"])
def test_a_same_size_change_in_the_second_of_the_upload_is_copied(
        tensorstream_s3: Any, tmp_path: Path, size: int) -> None:
    """The neighbour: the file rewritten after its upload, same size, in the same second
    (its date no later than the copy's at whole seconds): its bytes differ from the copy's
    ETag, so it is copied."""
    b = tensorstream_s3
    src = local_folder(tmp_path, {"m.bin": os.urandom(size)})
    options = {**b.options, "part_size": 5 * MiB}
    assert sync(str(src), b.uri("dst/"), options) == {"m.bin": "copied"}
    new = os.urandom(size)
    (src / "m.bin").write_bytes(new)
    _into_its_upload_second(b, src, "m.bin", at=0.9)
    assert sync(str(src), b.uri("dst/"), options) == {"m.bin": "copied"}
    assert b.get("dst/m.bin") == new


def test_the_dates_still_decide_outside_that_second(tensorstream_s3: Any,
                                                    tmp_path: Path) -> None:
    """A file dated a second after its copy is copied (no read of it); one dated a
    second before is not."""
    b = tensorstream_s3
    src = local_folder(tmp_path, {"new.bin": b"n" * 1000, "old.bin": b"o" * 1000})
    assert sync(str(src), b.uri("dst/"), b.options) == {"new.bin": "copied",
                                                         "old.bin": "copied"}
    _into_its_upload_second(b, src, "new.bin", at=1.0)
    _into_its_upload_second(b, src, "old.bin", at=-1.0)
    assert sync(str(src), b.uri("dst/"), b.options) == {"new.bin": "copied",
                                                         "old.bin": "skipped"}


@pytest.mark.tensorstream_s3(auth=False)
def test_in_that_second_an_encrypted_copy_whose_etag_cannot_tell_is_copied_again(
        tensorstream_s3: Any, tmp_path: Path) -> None:
    """Under SSE-KMS the copy's ETag is no MD5: in the second of its upload nothing tells
    a change from none, and the file is copied again rather than a change skipped."""
    b = tensorstream_s3
    src = local_folder(tmp_path, {"m.bin": os.urandom(1000)})
    with EncryptingFront(b.proxy.url, {"x-amz-server-side-encryption": "aws:kms"}) as front:
        options = {**b.options, "s3_endpoint": front.url}
        assert sync(str(src), b.uri("dst/"), options) == {"m.bin": "copied"}
        _into_its_upload_second(b, src, "m.bin")
        assert sync(str(src), b.uri("dst/"), options) == {"m.bin": "copied"}
