"""What an S3 write makes of the dates of the answers to its look (``HEAD``) after a
``PutObject`` or ``CompleteMultipartUpload`` whose answer was lost: the object is this
write's only if its ``Last-Modified``, on S3's clock (the answer's ``Date``), is not older
than the write. A server whose ``Date`` is garbled, missing or beyond any calendar, or
whose clock is hours off ours: the write never crashes on the header, never reports an
older object for its success, and one that landed is not reported failed. A reverse
proxy in front of the fault proxy and moto rewrites the answers' dates and loses the
answer to the first publishing request after moto applied it."""

from __future__ import annotations

import datetime
import email.utils
import os
import time
from typing import Any

import pytest

import tensorstream
from s3_loop_front import LoopFront, pass_on, send_back

MiB = 1 << 20
RETRY = {"retries": 3, "backoff_initial": 0.01, "backoff_max": 0.05}


class _Dates(LoopFront):
    """Every answer's ``Date`` (and a HEAD's ``Last-Modified``) moved by ``shift`` seconds,
    or ``Date`` replaced by ``date`` (``""``: left out); the first PutObject or
    CompleteMultipartUpload of the key is applied by moto and answered 500."""

    def __init__(self, upstream: str, key_path: str, *, shift: float = 0.0,
                 date: str | None = None) -> None:
        super().__init__()
        self.upstream, self.key_path, self.shift, self.date = upstream, key_path, shift, date
        self.lost = 0
        self.publishes = 0

    def _moved(self, value: str) -> str:
        when = email.utils.parsedate_to_datetime(value)
        return email.utils.format_datetime(when + datetime.timedelta(seconds=self.shift),
                                           usegmt=True)

    async def _forward(self, request: Any) -> Any:
        status, out, answer, length = await pass_on(request, self.upstream, await request.read())
        publishing = request.path == self.key_path and (
            (request.method == "PUT" and "partNumber" not in request.query)
            or (request.method == "POST" and "uploadId" in request.query))
        if publishing:
            self.publishes += 1
        for name in list(out):
            if name.lower() == "date":
                del out[name]
            elif name.lower() == "last-modified" and self.shift:
                out[name] = self._moved(out[name])
        if self.date is None:
            out["Date"] = self._moved(email.utils.formatdate(usegmt=True))
        elif self.date:
            out["Date"] = self.date
        if publishing and status == 200 and not self.lost:
            self.lost += 1
            return await send_back(request, 500, {"Content-Type": "application/xml"},
                                   b"<Error><Code>InternalError</Code></Error>", None)
        return await send_back(request, status, out, answer, length)


HOSTILE_DATES = {
    "beyond any calendar": "Mon, 07 Dec 99999999999999999999 15:00:00 GMT",
    "garbled": "yesterday, about noon",
    "without a zone": "Mon, 07 Dec 2026 15:00:00 -0000",
    "missing": "",
}


@pytest.mark.parametrize("size", [100_000, 6 * MiB])
@pytest.mark.parametrize("date", list(HOSTILE_DATES))
def test_a_write_whose_look_has_a_hostile_date_lands_once(
        tensorstream_s3: Any, size: int, date: str) -> None:
    """The answer to the publish lost after moto applied it; the look's ``Date`` cannot
    be read (a year of twenty digits raised a bare OverflowError out of the write, its
    abort too). S3's clock is then taken to be ours (moto's is): the object is this
    write's, and the write succeeds without a second publish."""
    b = tensorstream_s3
    b.put("k.bin", b"previous version")
    data = os.urandom(size)
    with _Dates(b.proxy.url, f"/{b.bucket}/k.bin", date=HOSTILE_DATES[date]) as endpoint:
        opts = {**b.options, **RETRY, "part_size": 5 * MiB, "s3_endpoint": endpoint}
        with tensorstream.open(b.uri("k.bin"), "wb", **opts) as w:
            w.write(data)
    assert b.get("k.bin") == data
    assert b.server.open_multipart_uploads(b.bucket, "k.bin") == []


@pytest.mark.parametrize("shift", [-3 * 3600.0, 3 * 3600.0, 0.0])
@pytest.mark.parametrize("size", [100_000, 6 * MiB])
def test_a_server_clock_hours_off_ours_still_knows_its_write(
        tensorstream_s3: Any, size: int, shift: float) -> None:
    """S3's clock three hours behind or ahead of ours (its ``Date`` and ``Last-Modified``
    alike): the object the lost answer's publish made is still this write's, so it is not
    published again and the write succeeds."""
    b = tensorstream_s3
    b.put("k.bin", b"previous version")
    data = os.urandom(size)
    front = _Dates(b.proxy.url, f"/{b.bucket}/k.bin", shift=shift)
    with front as endpoint:
        opts = {**b.options, **RETRY, "part_size": 5 * MiB, "s3_endpoint": endpoint}
        with tensorstream.open(b.uri("k.bin"), "wb", **opts) as w:
            w.write(data)
    assert front.lost == 1 and front.publishes == 1
    assert b.get("k.bin") == data
    assert b.server.open_multipart_uploads(b.bucket, "k.bin") == []




class _SlowLook(LoopFront):
    """Every ``HEAD`` of the key answered ``delay`` seconds after moto answered it (its
    ``Date`` stamped at once, as S3 stamps it, the answer slow on its way back); the
    first publishing request of the key turned away with 503 SlowDown before moto sees
    it (``applied=False``), or applied by moto and answered 500 (``applied=True``)."""

    shutdown_timeout = 5.0

    def __init__(self, upstream: str, key_path: str, *, delay: float, applied: bool) -> None:
        super().__init__()
        self.upstream, self.key_path, self.delay, self.applied = upstream, key_path, delay, applied
        self.failed = 0
        self.publishes = 0
        self.looks = 0

    async def _forward(self, request: Any) -> Any:
        import asyncio

        body = await request.read()
        publishing = request.path == self.key_path and (
            (request.method == "PUT" and "partNumber" not in request.query)
            or (request.method == "POST" and "uploadId" in request.query))
        if publishing and not self.failed and not self.applied:
            self.failed += 1
            return await send_back(request, 503, {"Content-Type": "application/xml"},
                                   b"<Error><Code>SlowDown</Code></Error>", None)
        status, out, answer, length = await pass_on(request, self.upstream, body)
        if publishing:
            self.publishes += 1
            if status == 200 and not self.failed:
                self.failed += 1
                return await send_back(request, 500, {"Content-Type": "application/xml"},
                                       b"<Error><Code>InternalError</Code></Error>", None)
        if request.method == "HEAD" and request.path == self.key_path:
            self.looks += 1
            await asyncio.sleep(self.delay)
        return await send_back(request, status, out, answer, length)


@pytest.mark.parametrize("size", [100_000, 6 * MiB])
def test_a_slow_look_does_not_take_an_older_object_for_this_write(
        tensorstream_s3: Any, size: int) -> None:
    """The key held these very bytes, written 3 s before this write began; its publish was
    turned away (503), and the look before sending it again came back 3 s late. S3's
    clock was read from when the answer came, 3 s after S3 stamped its ``Date``: the
    window slid 3 s back, took the older object for this write's and sent nothing again
    (its Content-Type never applied). Now S3's clock is bounded by when the look was sent:
    the older object is not this write's, and the publish is sent again."""
    b = tensorstream_s3
    data = os.urandom(size)
    opts = {**b.options, **RETRY, "part_size": 5 * MiB}
    with tensorstream.open(b.uri("k.bin"), "wb", **opts) as w:
        w.write(data)  # (the earlier upload, in the same parts)
    time.sleep(3.1)  # (Last-Modified is in whole seconds)
    front = _SlowLook(b.proxy.url, f"/{b.bucket}/k.bin", delay=3.0, applied=False)
    with front as endpoint:
        with tensorstream.open(b.uri("k.bin"), "wb", content_type="application/json",
                               **{**opts, "s3_endpoint": endpoint}) as w:
            w.write(data)
    assert front.failed == 1 and front.looks >= 1 and front.publishes == 1
    head = b.server.client.head_object(Bucket=b.bucket, Key="k.bin")
    assert head["ContentType"] == "application/json"
    assert b.get("k.bin") == data
    assert b.server.open_multipart_uploads(b.bucket, "k.bin") == []


@pytest.mark.parametrize("size", [100_000, 6 * MiB])
def test_a_slow_look_still_knows_the_write_s3_applied(tensorstream_s3: Any, size: int) -> None:
    """The neighbour: the publish applied by S3, its answer lost, the look 3 s late: the
    object is still this write's (bounded by the look's send time, not widened by its
    round trip, yet not narrowed past the write), and it is not published again."""
    b = tensorstream_s3
    b.put("k.bin", b"previous version")
    data = os.urandom(size)
    front = _SlowLook(b.proxy.url, f"/{b.bucket}/k.bin", delay=3.0, applied=True)
    with front as endpoint:
        opts = {**b.options, **RETRY, "part_size": 5 * MiB, "s3_endpoint": endpoint}
        with tensorstream.open(b.uri("k.bin"), "wb", **opts) as w:
            w.write(data)
    assert front.failed == 1 and front.publishes == 1 and front.looks >= 1
    assert b.get("k.bin") == data
    assert b.server.open_multipart_uploads(b.bucket, "k.bin") == []
