"""The one ``PutObject`` of a small S3 object (``open(uri, "wb")``, ``cp`` of a small file,
``save``) that fails with a temporary error (a 503 SlowDown, a 500, a cut connection) is
sent again under the retry policy, as an ``UploadPart`` is and as boto3, s3fs and the aws
CLI do: before, the write raised. An attempt S3 may have applied (its answer lost) is
looked at first: an object holding exactly these bytes is the success it was, and is not
written again. The neighbour: a large write's ``CompleteMultipartUpload``, the same way.
moto's server behind the package's fault proxy; the proxy records every request and the
status its client got."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest

import tensorstream
from tensorstream.copy.engine import copy
from tensorstream.errors import PermissionDeniedError, TensorstreamError

#: Short waits: the policy's attempts and backoff, not its defaults' seconds.
RETRY = {"retries": 3, "backoff_initial": 0.01, "backoff_max": 0.05}


def _write(b: Any, how: str, key: str, data: bytes, tmp_path: Path, **options: Any) -> None:
    """``data`` to ``key`` by ``open(uri, "wb")`` or by ``cp`` of a local file (its
    ``PutObject`` carries the source's Content-MD5); a failure raises."""
    opts = {**b.options, **RETRY, **options}
    if how == "write":
        with tensorstream.open(b.uri(key), "wb", **opts) as w:
            w.write(data)
        return
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    r = copy(str(src), b.uri(key), **opts)
    if not r.ok:
        raise CopyFailed("; ".join(r.errors))


class CopyFailed(Exception):
    """``cp`` failed (its result's errors)."""


def _puts(b: Any, key: str) -> list[int]:
    """The statuses the PutObject requests of ``key`` got, in order."""
    return [q.status for q in b.requests if q.method == "PUT" and q.path == f"/{b.bucket}/{key}"]


@pytest.mark.parametrize("how", ["write", "cp"])
@pytest.mark.parametrize("status", [503, 500])
def test_a_put_answered_a_5xx_once_is_sent_again_and_lands_exactly(
        tensorstream_s3: Any, tmp_path: Path, how: str, status: int) -> None:
    """One 503 SlowDown (or 500) to the PutObject: it raised; now the write is sent once
    more and the object holds exactly its bytes (the previous version replaced)."""
    b = tensorstream_s3
    b.put("k.bin", b"previous version")
    data = os.urandom(100_000)
    b.faults.raw.path_prefix = f"/{b.bucket}/k.bin"
    b.faults.raw.status_script = [status]
    _write(b, how, "k.bin", data, tmp_path)
    assert _puts(b, "k.bin") == [status, 200]
    assert b.get("k.bin") == data


@pytest.mark.parametrize("how", ["write", "cp"])
def test_a_put_that_keeps_failing_fails_after_the_retry_budget(
        tensorstream_s3: Any, tmp_path: Path, how: str) -> None:
    """503 to every request of the key: ``retries`` PutObjects in all, then the write
    raises the temporary error, and the previous version is untouched (a new key: no
    object)."""
    b = tensorstream_s3
    b.put("old.bin", b"previous version")
    for key in ("old.bin", "new.bin"):
        b.faults.raw.path_prefix = f"/{b.bucket}/{key}"
        b.faults.raw.status_script = [503] * 50  # (the HEADs between are refused too)
        with pytest.raises((TensorstreamError, CopyFailed), match="SlowDown") as e:
            _write(b, how, key, os.urandom(1000), tmp_path)
        assert how == "cp" or e.value.temporary  # type: ignore[union-attr]
        assert _puts(b, key) == [503] * RETRY["retries"]
        b.faults.raw.status_script = []
    assert b.get("old.bin") == b"previous version"
    with pytest.raises(KeyError):
        b.get("new.bin")


def test_a_put_is_sent_once_with_one_attempt_or_on_a_refusal(
        tensorstream_s3: Any, tmp_path: Path) -> None:
    """The neighbours: ``retries=1`` sends it once (the 503 raised), and a refusal (403)
    is never sent again, whatever the budget."""
    b = tensorstream_s3
    b.faults.raw.path_prefix = f"/{b.bucket}/once.bin"
    b.faults.raw.status_script = [503]
    with pytest.raises(TensorstreamError, match="SlowDown"):
        _write(b, "write", "once.bin", b"x" * 1000, tmp_path, retries=1)
    assert _puts(b, "once.bin") == [503]
    b.faults.raw.path_prefix = f"/{b.bucket}/denied.bin"
    b.faults.raw.status_script = [403]
    with pytest.raises(PermissionDeniedError):
        _write(b, "write", "denied.bin", b"x" * 1000, tmp_path)
    assert _puts(b, "denied.bin") == [403]
    with pytest.raises(KeyError):
        b.get("once.bin")


@pytest.mark.parametrize("how", ["write", "cp"])
@pytest.mark.parametrize("cuts", [2, 3])
def test_a_put_cut_before_s3_had_it_is_sent_again(
        tensorstream_s3: Any, tmp_path: Path, how: str, cuts: int) -> None:
    """The connection cut before the body reached S3, ``cuts`` times in a row (aiohttp
    itself sends a cut PUT once more, so two cuts reached the writer, which raised): the
    writer looks (the previous version is there, not its bytes) and sends it again."""
    b = tensorstream_s3
    b.put("k.bin", b"previous version")
    data = os.urandom(100_000)
    seen: list[str] = []

    async def cut(method: str, path: str) -> None:
        if method == "PUT" and path == f"/{b.bucket}/k.bin":
            seen.append(method)
            if len(seen) <= cuts:
                raise ConnectionResetError("cut by the test")

    b.faults.raw.before_forward = cut
    _write(b, how, "k.bin", data, tmp_path)
    assert b.get("k.bin") == data
    assert b.faults.raw.hook_errors == []
    assert len(seen) == cuts + 1, seen


@pytest.mark.parametrize("how", ["write", "cp"])
def test_a_put_s3_applied_whose_answer_was_cut_is_not_sent_again(
        tensorstream_s3: Any, tmp_path: Path, how: str) -> None:
    """S3 stored the body and the connection was cut before its answer (twice: aiohttp
    sends it once more itself). The writer looks before it sends again: the object holds
    exactly its bytes (the ETag is their MD5), so the write succeeded and nothing more is
    sent (that resend could land over what another writer stored meanwhile)."""
    b = tensorstream_s3
    b.put("k.bin", b"previous version")
    data = os.urandom(100_000)
    seen: list[str] = []

    async def applied_then_cut(method: str, path: str) -> None:
        if method == "PUT" and path == f"/{b.bucket}/k.bin":
            seen.append(method)
            await asyncio.get_running_loop().run_in_executor(None, b.put, "k.bin", data)
            raise ConnectionResetError("cut by the test after S3 stored it")

    b.faults.raw.before_forward = applied_then_cut
    _write(b, how, "k.bin", data, tmp_path)
    assert b.get("k.bin") == data
    assert b.faults.raw.hook_errors == []
    assert seen == ["PUT", "PUT"], seen  # (aiohttp's own two; none by the writer)


async def test_a_write_stopped_while_its_put_waits_to_be_sent_again_sends_nothing_more(
        tensorstream_s3: Any) -> None:
    """The neighbour of the abort: a 503 with ``Retry-After: 2`` (honoured: the resend
    waits), and the commit cancelled meanwhile (Ctrl-C, a ``cp`` stopped). The abort is
    final: no PutObject goes after it, and the previous version stays."""
    b = tensorstream_s3
    b.put("k.bin", b"previous version")
    b.faults.raw.path_prefix = f"/{b.bucket}/k.bin"
    b.faults.raw.status_script, b.faults.raw.retry_after = [503], 2
    opts = {**b.options, **RETRY, "backoff_max": 5.0}  # (the wait: Retry-After's, capped)
    async with tensorstream.get_provider(b.uri("k.bin"), **opts) as provider:
        writer = provider.open_writer(b.uri("k.bin").removeprefix("s3://"))
        await writer.write(os.urandom(1000))
        commit = asyncio.ensure_future(writer.commit())
        for _ in range(200):
            if _puts(b, "k.bin"):
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)  # (in the resend's wait)
        assert not commit.done()
        commit.cancel()
        with pytest.raises(asyncio.CancelledError):
            await commit
        await asyncio.sleep(2.5)  # past the Retry-After
    assert _puts(b, "k.bin") == [503]
    assert b.get("k.bin") == b"previous version"


def _completes(b: Any, key: str) -> list[int]:
    """The statuses the CompleteMultipartUpload requests of ``key`` got, in order."""
    return [q.status for q in b.requests
            if q.method == "POST" and q.path.split("?")[0] == f"/{b.bucket}/{key}"
            and "uploadId" in q.path]


@pytest.mark.parametrize("how", ["write", "cp"])
def test_a_complete_answered_503_once_is_sent_again_and_lands_exactly(
        tensorstream_s3: Any, tmp_path: Path, how: str) -> None:
    """The multipart neighbour: one 503 to the CompleteMultipartUpload (its parts all in)
    failed the write and aborted the upload; it is now looked at (the previous version,
    not this upload's ETag) and sent again, and the object holds exactly the bytes."""
    b = tensorstream_s3
    b.put("big.bin", b"previous version")
    data = os.urandom(11 << 20)
    b.faults.raw.path_prefix = f"/{b.bucket}/big.bin"
    b.faults.raw.query = "uploadId"
    b.faults.raw.status_script = [200, 200, 200, 503]  # three parts, then the complete
    _write(b, how, "big.bin", data, tmp_path, part_size=5 << 20)
    assert _completes(b, "big.bin") == [503, 200]
    assert b.get("big.bin") == data
    assert b.server.open_multipart_uploads(b.bucket, "big.bin") == []


def test_a_complete_that_keeps_failing_fails_after_the_budget_and_aborts(
        tensorstream_s3: Any, tmp_path: Path) -> None:
    """... and one answered 503 every time fails after ``retries`` attempts: the upload is
    aborted, the previous version stays."""
    b = tensorstream_s3
    b.put("big.bin", b"previous version")
    b.faults.raw.path_prefix = f"/{b.bucket}/big.bin"
    b.faults.raw.query = "uploadId"
    b.faults.raw.status_script = [200, 200, 200] + [503] * RETRY["retries"]
    with pytest.raises(TensorstreamError, match="SlowDown"):
        _write(b, "write", "big.bin", os.urandom(11 << 20), tmp_path, part_size=5 << 20)
    assert _completes(b, "big.bin") == [503] * RETRY["retries"]
    assert b.get("big.bin") == b"previous version"
    assert b.server.open_multipart_uploads(b.bucket, "big.bin") == []


def _content_type(b: Any, key: str) -> str:
    return str(b.server.client.head_object(Bucket=b.bucket, Key=key)["ContentType"])


@pytest.mark.parametrize("size", [100_000, 11 << 20])
def test_an_older_object_of_the_same_bytes_is_not_taken_for_this_write(
        tensorstream_s3: Any, size: int) -> None:
    """The key already held these very bytes (an earlier upload of the same file: the
    same ETag, in one piece or in the same parts), written before this write began. A
    503 to the PutObject (or the CompleteMultipartUpload), then the look: that older
    object was taken for this write, which reported success without being sent again --
    its Content-Type (and metadata, storage class, encryption) never applied, and a
    multipart write's upload left open with all its parts. Now an object older than the
    write is not its success: it is sent again, and nothing is left open."""
    b = tensorstream_s3
    data = os.urandom(size)
    opts = {**b.options, **RETRY, "part_size": 5 << 20}
    with tensorstream.open(b.uri("k.bin"), "wb", **opts) as w:
        w.write(data)  # (the earlier upload, in the same parts)
    assert _content_type(b, "k.bin") != "application/json"
    time.sleep(3.1)  # (S3's Last-Modified is in whole seconds)
    b.faults.raw.path_prefix = f"/{b.bucket}/k.bin"
    if size > 5 << 20:
        b.faults.raw.query = "uploadId"
        b.faults.raw.status_script = [200, 200, 200, 503]  # three parts, then the complete
    else:
        b.faults.raw.status_script = [503]
    with tensorstream.open(b.uri("k.bin"), "wb", content_type="application/json", **opts) as w:
        w.write(data)
    assert (_completes(b, "k.bin")[-2:] if size > 5 << 20 else _puts(b, "k.bin")[-2:]) == [
        503, 200]
    assert _content_type(b, "k.bin") == "application/json"
    assert b.get("k.bin") == data
    assert b.server.open_multipart_uploads(b.bucket, "k.bin") == []


def _creates(b: Any, key: str) -> list[int]:
    """The statuses the CreateMultipartUpload requests of ``key`` got, in order."""
    return [q.status for q in b.requests
            if q.method == "POST" and q.path.split("?")[0] == f"/{b.bucket}/{key}"
            and "uploadId" not in q.path]


@pytest.mark.parametrize("how", ["write", "cp"])
@pytest.mark.parametrize("status", [503, 500])
def test_a_create_answered_a_5xx_once_is_sent_again_and_lands_exactly(
        tensorstream_s3: Any, tmp_path: Path, how: str, status: int) -> None:
    """One 503 SlowDown (or 500) to the CreateMultipartUpload failed the write, though
    every later request (each part, the complete) is sent again on one: the create now
    is too, under the same policy, and nothing is left open."""
    b = tensorstream_s3
    b.put("big.bin", b"previous version")
    data = os.urandom(11 << 20)
    b.faults.raw.path_prefix = f"/{b.bucket}/big.bin"
    b.faults.raw.query = "uploads"
    b.faults.raw.status_script = [status]
    _write(b, how, "big.bin", data, tmp_path, part_size=5 << 20)
    assert _creates(b, "big.bin") == [status, 200]
    assert b.get("big.bin") == data
    assert b.server.open_multipart_uploads(b.bucket, "big.bin") == []


def test_a_create_that_keeps_failing_fails_after_the_budget(
        tensorstream_s3: Any, tmp_path: Path) -> None:
    """... and one answered 503 every time fails after ``retries`` attempts, with nothing
    left open and the previous version in place; one attempt sends it once."""
    b = tensorstream_s3
    b.put("big.bin", b"previous version")
    b.faults.raw.path_prefix = f"/{b.bucket}/big.bin"
    b.faults.raw.query = "uploads"
    b.faults.raw.status_script = [503] * RETRY["retries"]
    with pytest.raises(TensorstreamError, match="SlowDown"):
        _write(b, "write", "big.bin", os.urandom(11 << 20), tmp_path, part_size=5 << 20)
    assert _creates(b, "big.bin") == [503] * RETRY["retries"]
    b.faults.raw.status_script = [503]
    with pytest.raises(TensorstreamError, match="SlowDown"):
        _write(b, "write", "big.bin", os.urandom(11 << 20), tmp_path, part_size=5 << 20,
               retries=1)
    assert _creates(b, "big.bin") == [503] * (RETRY["retries"] + 1)
    assert b.get("big.bin") == b"previous version"
    assert b.server.open_multipart_uploads(b.bucket, "big.bin") == []
