"""Multipart copies made by S3 (``UploadPartCopy``) when something goes wrong: a store
that has no ``UploadPartCopy`` (or no ``CopyObject``) loses only that way of copying for
the run; a copy that fails waits for its parts still in flight before it aborts the
upload, so none lands after the abort and none is left behind. moto's server behind the
package's fault proxy, which records every request in the order moto answered it."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

import pytest

from tensorstream.copy.engine import copy

MiB = 1 << 20


def _put_in_parts(backend: Any, key: str, parts: list[bytes]) -> None:
    c = backend.client
    upload = c.create_multipart_upload(Bucket=backend.bucket, Key=key)["UploadId"]
    done = [{"PartNumber": n, "ETag": c.upload_part(Bucket=backend.bucket, Key=key,
                                                    UploadId=upload, PartNumber=n,
                                                    Body=body)["ETag"]}
            for n, body in enumerate(parts, 1)]
    c.complete_multipart_upload(Bucket=backend.bucket, Key=key, UploadId=upload,
                                MultipartUpload={"Parts": done})


def _copy_requests(backend: Any, key: str) -> list[Any]:
    """Requests that asked S3 to copy into ``key`` (CopyObject, UploadPartCopy)."""
    return [q for q in backend.requests if q.path.split("?")[0] == f"/{backend.bucket}/{key}"
            and any(h.lower() == "x-amz-copy-source" for h in q.headers)]


def test_a_store_without_upload_part_copy_still_copies_objects_in_one_piece(
        tensorstream_s3: Any, caplog: pytest.LogCaptureFixture) -> None:
    """501 to UploadPartCopy turned every copy by S3 off for the rest of the run: objects
    stored in one piece, which one CopyObject copies, were streamed through this machine
    too. Now only the multipart copies are (one warning): the later multipart object goes
    straight to the streamed copy, one-piece objects are still copied by S3, and the upload
    the refused copy opened is aborted."""
    b = tensorstream_s3
    big = {f"src/m{i}.bin": [os.urandom(5 * MiB), os.urandom(1000)] for i in (1, 2)}
    for key, parts in big.items():
        _put_in_parts(b, key, parts)
    b.put("src/z-small.bin", b"small")
    b.faults.raw.path_prefix = f"/{b.bucket}/dst/m1.bin"
    b.faults.raw.status_script = [200, 501]  # CreateMultipartUpload, then UploadPartCopy
    b.proxy.clear_log()
    with caplog.at_level(logging.WARNING, logger="tensorstream.copy"):
        r = copy(b.uri("src/"), b.uri("dst/"), recursive=True, jobs=1, concurrency=1,
                 **b.options)
    assert r.ok and r.files == 3, r.errors
    by_name = {o.src.rsplit("/", 1)[-1]: o for o in r.outcomes}
    assert by_name["z-small.bin"].server_side and by_name["z-small.bin"].verified
    assert not by_name["m1.bin"].server_side and not by_name["m2.bin"].server_side
    assert _copy_requests(b, "dst/m2.bin") == []  # not asked again
    lines = [rec for rec in caplog.records if "through this machine" in rec.getMessage()]
    assert len(lines) == 1 and "UploadPartCopy" in lines[0].getMessage(), caplog.records
    for key, parts in big.items():
        assert b.get(key.replace("src/", "dst/")) == b"".join(parts)
    assert b.get("dst/z-small.bin") == b"small"
    assert b.server.open_multipart_uploads(b.bucket) == []


def test_a_store_without_copy_object_still_copies_objects_in_parts(
        tensorstream_s3: Any, caplog: pytest.LogCaptureFixture) -> None:
    """The neighbour: 501 to CopyObject streams the objects stored in one piece; an object
    uploaded in parts is still copied by S3 (UploadPartCopy is another operation)."""
    b = tensorstream_s3
    b.put("src/a-small.bin", b"a")
    b.put("src/b-small.bin", b"b")
    parts = [os.urandom(5 * MiB), os.urandom(1000)]
    _put_in_parts(b, "src/m.bin", parts)
    b.faults.raw.path_prefix = f"/{b.bucket}/dst/a-small.bin"
    b.faults.raw.status_script = [501]
    b.proxy.clear_log()
    with caplog.at_level(logging.WARNING, logger="tensorstream.copy"):
        r = copy(b.uri("src/"), b.uri("dst/"), recursive=True, jobs=1, **b.options)
    assert r.ok and r.files == 3, r.errors
    by_name = {o.src.rsplit("/", 1)[-1]: o for o in r.outcomes}
    assert not by_name["a-small.bin"].server_side and not by_name["b-small.bin"].server_side
    assert by_name["m.bin"].server_side and by_name["m.bin"].verified_by == "ETag"
    assert _copy_requests(b, "dst/b-small.bin") == []
    assert b.get("dst/m.bin") == b"".join(parts) and b.get("dst/b-small.bin") == b"b"
    lines = [rec for rec in caplog.records if "through this machine" in rec.getMessage()]
    assert len(lines) == 1 and "CopyObject" in lines[0].getMessage(), caplog.records


def test_a_failed_multipart_copy_waits_for_its_parts_in_flight_before_the_abort(
        tensorstream_s3: Any) -> None:
    """One part refused while another is still being copied by S3: the copy cancelled the
    part in flight on its side and aborted the upload at once, but S3 goes on with a
    request it has (here: it reaches moto a second later), and a part can land after the
    AbortMultipartUpload (S3's documentation: abort again). Now the copy stops starting
    parts, waits for those in flight, then aborts: no part request is answered after the
    abort, and no upload is left."""
    b = tensorstream_s3
    _put_in_parts(b, "src/m.bin", [os.urandom(5 * MiB), os.urandom(5 * MiB), os.urandom(1000)])
    key = f"/{b.bucket}/dst/m.bin"
    b.faults.raw.path_prefix = key
    # CreateMultipartUpload, the first part (held a second), the second refused.
    b.faults.raw.status_script = [200, 200, 403]
    held: list[str] = []

    async def hold_the_first_part(method: str, path: str) -> None:
        if method == "PUT" and not held:
            held.append(path)
            await asyncio.sleep(1.0)

    b.faults.raw.before_forward = hold_the_first_part
    b.proxy.clear_log()
    r = copy(b.uri("src/m.bin"), b.uri("dst/m.bin"), concurrency=3, **b.options)
    assert not r.ok and "refused" in r.errors[0], r.errors
    time.sleep(1.5)  # for a request S3 had to be answered, whatever the copy did
    log = [(q.method, q.path, q.status) for q in b.requests
           if q.path.split("?")[0] == key]
    aborts = [i for i, (m, p, _) in enumerate(log) if m == "DELETE" and "uploadId" in p]
    assert aborts, log
    assert not [q for q in log[aborts[0]:] if q[0] == "PUT"], log
    assert b.server.open_multipart_uploads(b.bucket) == []
    assert not b.server.exists(b.bucket, "dst/m.bin")
