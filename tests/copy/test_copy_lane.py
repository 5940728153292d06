"""The lane (:mod:`tensorstream.copy.lane`): objects of one part into local
files, each run start to end by one worker thread, against the real HTTP test
server; its thread slots and the width that moves them."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tensorstream.copy import width
from tensorstream.copy.engine import FileOutcome, copy, copy_async
from tensorstream.copy.lane import ThreadSlots
from tensorstream.copy.width import Width

KiB = 1 << 10


class Recorder:
    """A progress listener that records which thread told it what, and fails
    if two of its methods ever run at once (the engine serializes them)."""

    def __init__(self) -> None:
        self.started: dict[str, str] = {}
        self.sizes: dict[str, int] = {}
        self.received: dict[str, int] = {}
        self.finished: dict[str, tuple[str, bool]] = {}
        self.done: list[FileOutcome] = []
        self.overlaps = 0
        self._inside = False

    def _enter(self) -> None:
        if self._inside:
            self.overlaps += 1
        self._inside = True
        time.sleep(0.0005)  # widen the window an unserialized call would hit

    def start(self, files: int, total_bytes: int) -> None:
        pass

    def file_started(self, name: str, size: int) -> None:
        self._enter()
        self.started[name] = threading.current_thread().name
        self.sizes[name] = size
        self._inside = False

    def advance(self, name: str, nbytes: int) -> None:
        self.received[name] = self.received.get(name, 0) + nbytes

    def receiving(self) -> bool:
        """Whether some object has started and its bytes are not all in."""
        return any(self.received.get(name, 0) < size for name, size in list(self.sizes.items()))

    def file_finished(self, name: str, ok: bool) -> None:
        self._enter()
        self.finished[name] = (threading.current_thread().name, ok)
        self._inside = False

    def file_done(self, outcome: FileOutcome) -> None:
        self._enter()
        self.done.append(outcome)
        self._inside = False


def _put(server: Any, prefix: str, sizes: dict[str, int]) -> dict[str, bytes]:
    data = {name: os.urandom(size) for name, size in sizes.items()}
    for name, blob in data.items():
        server.put(f"{prefix}/{name}", blob)
    return data


def test_objects_of_one_part_run_start_to_end_on_worker_threads(
        tmp_path: Path, http_server: Any, http_reset: None) -> None:
    # Thirty one-part objects go through the lane (started and finished on one
    # worker thread each, never the event loop's); an empty object and one of
    # several parts take the event loop's path beside them. Every byte lands.
    prefix = f"lane-{os.urandom(4).hex()}"
    sizes = {f"{i:02d}.bin": 1 + i * 2111 for i in range(30)}  # all under a part
    sizes.update({"empty.bin": 0, "multi.bin": 3 * 64 * KiB + 5})
    data = _put(http_server, prefix, sizes)
    rec = Recorder()
    out = tmp_path / "out"
    result = copy([http_server.url(f"{prefix}/{n}") for n in sorted(data)], f"{out}/",
                  part_size=64 * KiB, concurrency=4, progress=rec)
    assert result.ok and result.verified and result.files == 32, result.errors
    for name, blob in data.items():
        assert (out / name).read_bytes() == blob
    assert sorted(p.name for p in out.iterdir()) == sorted(data)  # no temp file left
    assert rec.overlaps == 0
    labels = {n: http_server.url(f"{prefix}/{n}") for n in data}
    loop_thread = rec.started[labels["multi.bin"]]
    assert not loop_thread.startswith("tensorstream-http")
    assert rec.started[labels["empty.bin"]] == loop_thread
    for name in sizes:
        if name in ("empty.bin", "multi.bin"):
            continue
        thread = rec.started[labels[name]]
        assert thread.startswith("tensorstream-http"), (name, thread)
        assert rec.finished[labels[name]] == (thread, True)
    assert sorted(o.src for o in rec.done) == sorted(labels.values())
    assert all(o.status == "copied" and o.verified for o in rec.done)
    assert sorted(o.src for o in result.outcomes) == sorted(labels.values())


def test_one_failed_object_in_the_lane_does_not_stop_the_others(
        tmp_path: Path, http_server: Any, http_reset: None) -> None:
    # One destination is a directory (refused before a byte is read), one body
    # is cut part-way (resumed exactly); the rest are copied.
    prefix = f"lanefail-{os.urandom(4).hex()}"
    data = _put(http_server, prefix, {f"{i}.bin": 48 * KiB + i for i in range(12)})
    out = tmp_path / "out"
    (out / "3.bin").mkdir(parents=True)
    http_server.faults.key = f"{prefix}/7.bin"
    http_server.faults.drop_after = 20 * KiB
    http_server.faults.drop_times = 1
    result = copy([http_server.url(f"{prefix}/{n}") for n in sorted(data)], f"{out}/",
                  part_size=64 * KiB, concurrency=3)
    assert result.files == 11 and len(result.errors) == 1, result.errors
    assert "3.bin" in result.errors[0] and "directory" in result.errors[0]
    assert http_server.faults.dropped == 1
    for name, blob in data.items():
        if name != "3.bin":
            assert (out / name).read_bytes() == blob
    assert (out / "3.bin").is_dir() and list((out / "3.bin").iterdir()) == []
    statuses = sorted(o.status for o in result.outcomes)
    assert statuses == ["copied"] * 11 + ["failed"]


def test_an_answer_that_names_no_version_is_checked_before_it_is_published(
        tmp_path: Path, http_server: Any, http_reset: None) -> None:
    # A server with neither ETag nor Last-Modified: nothing ties the GET to the
    # version the copy planned from, so the lane hands the object to the event
    # loop, which compares the source's validators again (a second HEAD after
    # the GET) before the file appears.
    prefix = f"lanenover-{os.urandom(4).hex()}"
    data = _put(http_server, prefix, {"a.bin": 40 * KiB, "b.bin": 41 * KiB})
    key = f"{prefix}/a.bin"
    http_server.faults.key = key
    http_server.faults.no_etag = True
    http_server.faults.no_last_modified = True
    out = tmp_path / "out"
    result = copy([http_server.url(f"{prefix}/{n}") for n in sorted(data)], f"{out}/",
                  part_size=64 * KiB, concurrency=2)
    assert result.ok and result.files == 2, result.errors
    for name, blob in data.items():
        assert (out / name).read_bytes() == blob
    requests = [r for r in http_server.requests if r.path.endswith(key)]
    methods = [r.method for r in requests]
    assert methods.index("GET") < len(methods) - 1 and methods[-1] == "HEAD", methods
    other = [r.method for r in http_server.requests if r.path.endswith(f"{prefix}/b.bin")]
    assert other == ["HEAD", "GET"]  # named its version: no check after


def test_a_cancelled_lane_copy_leaves_only_whole_files(
        tmp_path: Path, http_server: Any, http_reset: None) -> None:
    # Bodies paced to 400 KB/s: the copy is cancelled while an object's body is
    # on its way. What is under a name is whole; no temp file is left; objects
    # in flight are reported interrupted, never failed. (Cancelled after a fixed
    # 0.6 s, the objects in flight could all be in their publish, which a
    # cancel does not stop, on a loaded disk whose fsyncs took that long: then
    # none was interrupted.)
    prefix = f"lanecancel-{os.urandom(4).hex()}"
    data = _put(http_server, prefix, {f"{i:02d}.bin": 100 * KiB for i in range(16)})
    http_server.faults.rate_limit = 400_000
    out = tmp_path / "out"
    rec = Recorder()

    async def main() -> None:
        task = asyncio.ensure_future(copy_async(
            [http_server.url(f"{prefix}/{n}") for n in sorted(data)], f"{out}/",
            part_size=128 * KiB, concurrency=2, jobs=2, progress=rec))
        deadline = time.monotonic() + 30
        while not (rec.done and rec.receiving()) and time.monotonic() < deadline:
            await asyncio.sleep(0.005)  # one object whole, another's body on its way
        assert rec.done and rec.receiving(), (rec.sizes, rec.received)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    names = sorted(p.name for p in out.iterdir())
    assert all(not n.startswith(".") for n in names), names
    for name in names:
        assert (out / name).read_bytes() == data[name]
    statuses = [o.status for o in rec.done]
    assert "interrupted" in statuses and "failed" not in statuses, statuses
    assert 0 < statuses.count("copied") == len(names) < len(data)


def test_thread_slots_wait_and_follow_the_width() -> None:
    slots = ThreadSlots(1)
    slots.take()
    assert slots.locked()
    got = threading.Event()

    def taker() -> None:
        slots.take()
        got.set()

    t = threading.Thread(target=taker)
    t.start()
    assert not got.wait(0.1)  # no permit free: waits
    grown: list[int] = []
    slots.on_release = lambda: grown.append(slots.total)
    slots.release()  # the width adds one
    assert got.wait(5) and grown == [2]
    t.join()

    async def narrow() -> None:
        await slots.acquire()  # taken back at once, though both are in use

    asyncio.run(narrow())
    assert slots.total == 1 and slots.locked()
    slots.give()
    assert slots.locked()  # one holder left and one permit: still full
    slots.give()
    assert not slots.locked()
    with pytest.raises(ValueError):
        ThreadSlots(-1)


def test_the_width_moves_lane_slots_with_the_others() -> None:
    async def main() -> None:
        jobs, reads = asyncio.Semaphore(16), asyncio.Semaphore(width.START)
        lane_jobs, lane_reads = ThreadSlots(16), ThreadSlots(width.START)
        w = Width([jobs, reads, lane_jobs, lane_reads], 16, widest=2,
                  start=([reads, lane_reads], width.START))
        for _ in range(width.START):
            lane_reads.take()
        assert w.full()  # the lane alone can be the limit
        assert w.widen() == 16 - width.START
        assert lane_reads.total == 16 and lane_jobs.total == 16 and reads._value == 16
        assert w.widen() == 16 and lane_reads.total == lane_jobs.total == 32
        assert w.narrow() == 8
        await asyncio.sleep(0)
        assert lane_reads.total == lane_jobs.total == 24 and jobs._value == 24
        await w.close()

    asyncio.run(main())


def test_the_lane_over_https_and_moto_s3(tmp_path: Path, https_server: Any,
                                         moto_s3: Any) -> None:
    # TLS sockets (their decrypted bytes buffered where epoll cannot see
    # them) and S3's signed GETs of a listed prefix, through the lane.
    data = {f"{i}.bin": os.urandom(20 * KiB + 997 * i) for i in range(9)}
    prefix = f"lanetls-{os.urandom(4).hex()}"
    for name, blob in data.items():
        https_server.put(f"{prefix}/{name}", blob)
    out = tmp_path / "https"
    result = copy([https_server.url(f"{prefix}/{n}") for n in sorted(data)], f"{out}/",
                  part_size=64 * KiB, concurrency=3, ca_bundle=https_server.ca_bundle_path)
    assert result.ok and result.verified and result.files == 9, result.errors
    for name, blob in data.items():
        assert (out / name).read_bytes() == blob

    bucket = f"lane-{os.urandom(3).hex()}"
    moto_s3.create_bucket(bucket)
    for name, blob in data.items():
        moto_s3.put(bucket, f"{prefix}/{name}", blob)
    out = tmp_path / "s3"
    result = copy(f"s3://{bucket}/{prefix}/", f"{out}/", recursive=True, part_size=64 * KiB,
                  concurrency=3, **moto_s3.options())
    assert result.ok and result.verified and result.files == 9, result.errors
    for name, blob in data.items():
        assert (out / name).read_bytes() == blob
    assert sorted(p.name for p in out.iterdir()) == sorted(data)
