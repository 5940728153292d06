"""A failed multipart upload (``cp``/``sync`` to S3, ``open(..., "wb")``) waits for its
parts still in flight before it aborts: S3 goes on storing a part whose request it has,
whether the client hung up or not, and one stored after the ``AbortMultipartUpload``
is left behind, billed (AWS: abort again). moto's server behind the package's fault
proxy, which records every request in the order moto answered it; the proxy holds one
part a second after its body arrived, as S3 does a part it is still storing."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path
from typing import Any

import pytest

import tensorstream
from s3_parts import copy_cancelled_while_held, hold_one_part
from tensorstream.copy.engine import copy
from tensorstream.errors import TensorstreamError

MiB = 1 << 20


def _check_nothing_after_the_abort(b: Any) -> None:
    time.sleep(1.5)  # for a request S3 had to be answered, whatever the writer did
    key = f"/{b.bucket}/dst/m.bin"
    log = [(q.method, q.path, q.status) for q in b.requests if q.path.split("?")[0] == key]
    aborts = [i for i, (m, p, _) in enumerate(log) if m == "DELETE" and "uploadId" in p]
    assert aborts, log
    assert not [q for q in log[aborts[0]:] if q[0] == "PUT"], log
    assert b.server.open_multipart_uploads(b.bucket) == []
    assert not b.server.exists(b.bucket, "dst/m.bin")


def test_a_failed_cp_upload_waits_for_its_parts_in_flight_before_the_abort(
        tensorstream_s3: Any, tmp_path: Path) -> None:
    """``cp`` of a local file in parts: one part refused while another was being stored
    cancelled that one on this side and aborted at once; the part S3 had landed after the
    abort. Now no part request is answered after the abort, and no upload is left."""
    b = tensorstream_s3
    src = tmp_path / "m.bin"
    src.write_bytes(os.urandom(10 * MiB) + b"end")
    hold_one_part(b, "dst/m.bin")
    r = copy(str(src), b.uri("dst/m.bin"), part_size=5 * MiB, concurrency=3, **b.options)
    assert not r.ok and r.errors, r
    _check_nothing_after_the_abort(b)


def test_a_failed_streamed_write_waits_for_its_parts_in_flight_before_the_abort(
        tensorstream_s3: Any) -> None:
    """``open(uri, "wb")``: the same, for parts of a write whose size is not known."""
    b = tensorstream_s3
    hold_one_part(b, "dst/m.bin")
    with pytest.raises(TensorstreamError), tensorstream.open(
            b.uri("dst/m.bin"), "wb", part_size=5 * MiB, concurrency=4, **b.options) as w:
        for _ in range(4):
            w.write(os.urandom(5 * MiB))
            time.sleep(0.2)  # (each part on its way before the next one)
    _check_nothing_after_the_abort(b)


def test_a_part_that_fails_after_another_was_refused_is_not_sent_again(
        tensorstream_s3: Any, tmp_path: Path) -> None:
    """The neighbour: parts in flight whose connections are cut (a temporary error) after
    another part was refused are not sent again by the writer, nor is any part started:
    the upload is being aborted. aiohttp itself sends a PUT once more on a cut connection
    (RFC 9112 9.3.1.1: an idempotent request), inside the part's request, which the writer
    waits for: so at most twice each, none after the abort, no part or upload left."""
    b = tensorstream_s3
    src = tmp_path / "m.bin"
    src.write_bytes(os.urandom(10 * MiB) + b"end")
    b.faults.raw.path_prefix = f"/{b.bucket}/dst/m.bin"
    b.faults.raw.status_script = [200, 403]  # CreateMultipartUpload, the first part
    seen: list[str] = []

    async def cut_every_part_late(method: str, path: str) -> None:
        seen.append(method)
        if method == "PUT":
            if seen.count("PUT") <= 2:  # (the two parts not refused: held while it is)
                await asyncio.sleep(1.0)
            raise ConnectionResetError("cut by the test")

    b.faults.raw.before_forward = cut_every_part_late
    b.proxy.clear_log()
    r = copy(str(src), b.uri("dst/m.bin"), part_size=5 * MiB, concurrency=3, **b.options)
    assert not r.ok, r
    time.sleep(1.5)
    assert "DELETE" in seen and "PUT" not in seen[seen.index("DELETE"):], seen
    assert 2 <= seen.count("PUT") <= 4, seen  # (the writer's retries would add more)
    assert b.faults.raw.hook_errors == []
    _check_nothing_after_the_abort(b)


def test_ctrl_c_waits_for_the_parts_in_flight_before_the_abort(tensorstream_s3: Any,
                                                              tmp_path: Path) -> None:
    """Ctrl-C (the copy's task cancelled) while a part is being stored: the same, the part
    S3 has is waited for, then the upload aborted; none is left."""
    b = tensorstream_s3
    src = tmp_path / "m.bin"
    src.write_bytes(os.urandom(10 * MiB) + b"end")
    b.proxy.clear_log()
    result = copy_cancelled_while_held(b, str(src), "dst/m.bin", "PUT", once=True,
                                       part_size=5 * MiB, concurrency=3)
    assert [o.status for o in result.outcomes] == ["interrupted"]
    _check_nothing_after_the_abort(b)


def _cut_a_part_once(where: str) -> Any:
    """A TCP proxy's ``on_client_data`` hook that cuts one UploadPart's connection once:
    at its headers (before its body was read) or after 1 MiB of its body."""
    state = {"cut": False, "body": -1}

    async def hook(data: bytes) -> None:
        if state["cut"]:
            return
        if data.startswith(b"PUT ") and b"partNumber=" in data[:1000]:
            state["body"] = 0
            cut = where == "headers"
        else:
            state["body"] += len(data) if state["body"] >= 0 else 0
            cut = where == "body" and state["body"] > MiB
        if cut:
            state["cut"] = True
            raise ConnectionResetError("cut by the test")

    hook.state = state  # type: ignore[attr-defined]
    return hook


@pytest.mark.parametrize("refused", [False, True])
@pytest.mark.parametrize("where", ["headers", "body"])
def test_a_part_cut_before_or_during_its_body_is_sent_again_whole(
        tensorstream_s3: Any, where: str, refused: bool) -> None:
    """The neighbours of the cut above: a part whose connection is cut before its body was
    read, or after part of it, is sent again (by aiohttp, which rewinds the body, or by the
    writer's retry) and the object is exact, no upload left; when another part is refused
    meanwhile, nothing is sent after the abort and nothing is left."""
    from tensorstream.testing.proxy import TCPFaultProxy

    b = tensorstream_s3
    data = os.urandom(10 * MiB) + b"end"
    if refused:
        b.faults.raw.path_prefix = f"/{b.bucket}/dst/m.bin"
        # The upload, a part, the next two: a part whose connection is cut mid-body took
        # its status when its headers came (a 403 that then reaches nobody).
        b.faults.raw.status_script = [200, 200, 403, 403]
    b.proxy.clear_log()
    with TCPFaultProxy("127.0.0.1", b.proxy.port) as tcp:
        hook = tcp.faults.on_client_data = _cut_a_part_once(where)
        options = b.server.options(s3_endpoint=f"http://127.0.0.1:{tcp.port}")
        with contextlib.ExitStack() as stack:
            if refused:
                stack.enter_context(pytest.raises(TensorstreamError))
            with tensorstream.open(b.uri("dst/m.bin"), "wb", part_size=5 * MiB,
                                   concurrency=3, **options) as w:
                w.write(data)
        assert hook.state["cut"] and tcp.faults.hook_errors == []
    if refused:
        _check_nothing_after_the_abort(b)
    else:
        assert b.get("dst/m.bin") == data
        assert b.server.open_multipart_uploads(b.bucket) == []
