"""Provider.read_range (every provider's, through the policy layer): a range the
object does not have raises InvalidRangeError before a buffer of its length is
allocated, positions are integers, and no error carries a presigned secret."""

from __future__ import annotations

import resource
import uuid
from pathlib import Path
from typing import Any

import pytest

import tensorstream
from tensorstream import errors
from tensorstream.providers.base import CHECKED_READ_RANGE
from tensorstream.testing.http_server import HTTPTestServer

DATA = bytes(range(256)) * 40


@pytest.fixture(params=["local", "http"])
def uri(request: pytest.FixtureRequest, tmp_path: Path, http_server: HTTPTestServer) -> str:
    if request.param == "local":
        (tmp_path / "o.bin").write_bytes(DATA)
        return str(tmp_path / "o.bin")
    key = f"range-{uuid.uuid4().hex[:8]}.bin"
    http_server.put(key, DATA)
    return http_server.url(key) + "?X-Amz-Signature=sig-canary&X-Amz-Credential=cred-canary"


@pytest.mark.parametrize("end", [CHECKED_READ_RANGE + 1, 1 << 50, 1 << 62])
async def test_a_huge_range_past_the_end_raises_without_allocating_it(uri: str, end: int) -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(errors.InvalidRangeError, match="past the end of a 10240-byte") as info:
        await tensorstream.read_range(uri, 0, end)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < CHECKED_READ_RANGE / (1 << 20), grown_mib
    said = f"{info.value} {info.value!r} {vars(info.value)}"
    assert "sig-canary" not in said and "cred-canary" not in said


@pytest.mark.parametrize(("start", "end"), [(1.5, 3), ("0", "3"), (None, 3), (0, None),
                                            (True, 3), (0, False)])
async def test_positions_are_integers(uri: str, start: Any, end: Any) -> None:
    # the error names the argument ("'float' object cannot be interpreted as an integer"
    # said neither which nor what), and True is no byte 1
    name = "start" if not isinstance(start, int) or isinstance(start, bool) else "end"
    with pytest.raises(TypeError, match=f"{name} must be an integer byte offset, got"):
        await tensorstream.read_range(uri, start, end)


async def test_the_neighbours_still_read(uri: str) -> None:
    import numpy

    assert await tensorstream.read_range(uri, 0, len(DATA)) == DATA
    assert await tensorstream.read_range(uri, numpy.int64(5), numpy.int32(9)) == DATA[5:9]
    assert await tensorstream.read_range(uri, 7, 7) == b""
    with pytest.raises(errors.InvalidRangeError) as info:
        await tensorstream.read_range(uri, 9, 5)
    assert "sig-canary" not in f"{info.value} {vars(info.value)}"
