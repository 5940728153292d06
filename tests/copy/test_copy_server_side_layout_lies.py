"""A copy made by S3 in the source's own parts (``HEAD ?partNumber=N`` for each part's
byte range) when the answers lie: a part's ``Content-Range`` empty (``bytes 5-4/SIZE``) or
backwards. An empty range sent no ``CopySourceRange`` at all, so S3 copied the whole
source as that part; where the copy's ETag cannot be compared with the source's (SSE-KMS)
that object, twice the source's size, was published over the previous version. A range
that is no part of the object is no layout: the copy is made in its own parts, exactly.
A reverse proxy in front of the fault proxy and moto rewrites the answers."""

from __future__ import annotations

import os
from typing import Any

import pytest

from s3_loop_front import LoopFront, pass_on, send_back
from s3_parts import put_in_parts
from tensorstream.copy.engine import copy

MiB = 1 << 20


class _LyingParts(LoopFront):
    """Answers ``HEAD ?partNumber=2`` and ``=3`` with the ranges ``ranges`` gives them (by
    part number), and CreateMultipartUpload as under SSE-KMS (whose ETags are no MD5s)."""

    def __init__(self, upstream: str, ranges: dict[str, str]) -> None:
        super().__init__()
        self.upstream, self.ranges = upstream, ranges

    async def _forward(self, request: Any) -> Any:
        status, out, answer, length = await pass_on(request, self.upstream, await request.read())
        number = request.query.get("partNumber")
        if request.method == "HEAD" and number in self.ranges and status == 206:
            out = {k: v for k, v in out.items() if k.lower() != "content-range"}
            out["Content-Range"] = self.ranges[number]
        if request.method == "POST" and "uploads" in request.query:
            out["x-amz-server-side-encryption"] = "aws:kms"
        return await send_back(request, status, out, answer, length)


@pytest.mark.parametrize("lie", ["empty", "backwards", "none"])
def test_a_part_range_that_is_no_part_is_no_layout(tensorstream_s3: Any, lie: str) -> None:
    b = tensorstream_s3
    parts = [os.urandom(5 * MiB), os.urandom(5 * MiB), os.urandom(1000)]
    data = b"".join(parts)
    put_in_parts(b, "src/m.bin", parts)
    b.put("dst/m.bin", b"previous version")
    size, five = len(data), 5 * MiB
    # part 2 claims no bytes (or fewer than none), part 3 the rest from where it ends: the
    # ranges still follow one another from 0 to the end
    end = five if lie == "empty" else five - 1
    ranges = {"2": f"bytes {five}-{end - 1}/{size}", "3": f"bytes {end}-{size - 1}/{size}"}
    if lie == "none":  # (the neighbour: true answers, the source's layout followed)
        ranges = {}
    with _LyingParts(b.proxy.url, ranges) as endpoint:
        r = copy(b.uri("src/m.bin"), b.uri("dst/m.bin"), part_size=5 * MiB,
                 **{**b.options, "s3_endpoint": endpoint})
    assert r.ok, r.errors
    assert b.get("dst/m.bin") == data
    assert b.server.open_multipart_uploads(b.bucket) == []
