"""``jobs``: the most objects a copy has in flight. A number given is kept even while
a slow link has the copy widened (the widening is for parts then); with none given
(the default, 32) objects widen with the link as parts do, up to four times that."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from s3_loop_front import LoopFront
from tensorstream.copy.engine import copy

MiB = 1 << 20


class PacedRecorder(LoopFront):
    """A loopback HTTP server sending each object 64 KiB every 8 ms (8 MB/s a
    connection: the link, not the process, is the limit, so a copy widens) and
    recording the most GETs it had in flight at once."""

    shutdown_timeout = 0.1

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects = objects
        self.in_flight = 0
        self.most = 0
        self.port = 0
        super().__init__()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        body = self.objects.get(request.path.lstrip("/"))
        if body is None:
            return web.Response(status=404)
        headers = {"Content-Length": str(len(body)), "ETag": f'"{hash(body) & 0xffffff:x}"',
                   "Accept-Ranges": "bytes", "Last-Modified": "Mon, 07 Dec 2026 08:00:00 GMT"}
        if request.method == "HEAD":
            return web.Response(headers=headers)
        start, end = 0, len(body)
        if "Range" in request.headers:  # bytes=a-b
            a, b = request.headers["Range"].removeprefix("bytes=").split("-")
            start, end = int(a), min(int(b) + 1, len(body))
            headers.update({"Content-Length": str(end - start),
                            "Content-Range": f"bytes {start}-{end - 1}/{len(body)}"})
        resp = web.StreamResponse(status=206 if "Range" in request.headers else 200,
                                  headers=headers)
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            await resp.prepare(request)
            for at in range(start, end, 64 << 10):
                await resp.write(body[at:min(at + (64 << 10), end)])
                await asyncio.sleep(0.008)
            await resp.write_eof()
        finally:
            self.in_flight -= 1
        return resp

    def __enter__(self) -> PacedRecorder:  # type: ignore[override]
        self.port = int(super().__enter__().rpartition(":")[2])
        return self

    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{self.port}/{name}" for name in self.objects]


@pytest.fixture
def paced() -> Iterator[PacedRecorder]:
    objects = {f"o{i:02d}.bin": os.urandom(2 * MiB + i) for i in range(14)}
    with PacedRecorder(objects) as server:
        yield server


def _copied(server: PacedRecorder, out: Path, **kw: object) -> None:
    result = copy(server.urls(), f"{out}/", **kw)  # type: ignore[arg-type]
    assert result.ok and result.files == len(server.objects), result.errors
    for name, body in server.objects.items():
        assert (out / name).read_bytes() == body


@pytest.mark.parametrize("jobs", [1, 2])
def test_jobs_given_is_the_most_objects_in_flight_on_a_slow_link(
        paced: PacedRecorder, tmp_path: Path, jobs: int) -> None:
    # (It widened the objects with the parts: --jobs 1 had 13 objects in flight here.)
    _copied(paced, tmp_path / "out", jobs=jobs, concurrency=2)
    assert paced.most == jobs


def test_with_no_jobs_given_objects_widen_with_the_link(
        paced: PacedRecorder, tmp_path: Path) -> None:
    # The neighbour: the default (32 objects) still goes past --concurrency's 2 reads.
    _copied(paced, tmp_path / "out", concurrency=2)
    assert paced.most > 2


def test_cp_jobs_1_copies_one_object_at_a_time(paced: PacedRecorder, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    from tensorstream.cli.main import main

    out = tmp_path / "out"
    assert main(["cp", "-q", "--jobs", "1", "--concurrency", "2", *paced.urls(), f"{out}/"]) == 0
    assert paced.most == 1
    assert sorted(p.name for p in out.iterdir()) == sorted(paced.objects)


@pytest.mark.parametrize("flag,value", [("--jobs", "0"), ("--jobs", "-3"),
                                        ("--concurrency", "0")])
def test_cp_refuses_a_count_below_one_by_name(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              flag: str, value: str) -> None:
    from tensorstream.cli.main import main

    (tmp_path / "a").write_bytes(b"abc")
    assert main(["cp", flag, value, str(tmp_path / "a"), str(tmp_path / "b")]) == 2
    assert f"{flag} must be at least 1 (got {value})" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


def test_cp_with_a_huge_jobs_copies(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tensorstream.cli.main import main

    src = tmp_path / "src"
    src.mkdir()
    for i in range(5):
        (src / f"{i}.bin").write_bytes(os.urandom(1000 + i))
    assert main(["cp", "-q", "-r", "--jobs", "1000000", f"{src}/", f"{tmp_path / 'out'}/"]) == 0
    for i in range(5):
        assert (tmp_path / "out" / f"{i}.bin").read_bytes() == (src / f"{i}.bin").read_bytes()
