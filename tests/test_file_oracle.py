"""StreamReader against ``open(path, "rb")`` as the oracle: random sequences of
``seek`` (every whence, negative and past-EOF positions), ``read`` (-1, 0, n),
``readinto``, ``read1``, ``readinto1``, ``peek``, ``readline``, ``tell`` and
``read_ranges`` (against the file's bytes: a file has none) give the
same bytes and positions over every backend the fixtures start (local, HTTP,
S3 on moto, Redis). A seek the oracle refuses is refused here too, and leaves
the position where it was in both."""

from __future__ import annotations

import io
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tensorstream
from tensorstream.errors import InvalidRangeError

pytestmark = pytest.mark.timeout(300)

# Lines of every length (readline), not aligned to the small-read buffer or a part.
DATA = b"".join(os.urandom(n % 97) + b"\n" for n in range(400)) + os.urandom(200_003)
PART = 32 << 10  # several requests per read-ahead window, many per object

positions = st.one_of(st.integers(-2 * len(DATA), 2 * len(DATA)),
                      st.sampled_from([0, 1, len(DATA) - 1, len(DATA), len(DATA) + 1, -1]))
sizes = st.one_of(st.integers(-1, 70_000), st.sampled_from([None, -1, 0, 1, len(DATA)]))
ops = st.lists(st.one_of(
    st.tuples(st.just("seek"), positions, st.sampled_from([io.SEEK_SET, io.SEEK_CUR,
                                                           io.SEEK_END])),
    st.tuples(st.sampled_from(["read", "readline"]), sizes),
    st.tuples(st.just("read1"), st.sampled_from([-1, 0, 1, 5000, 70_000])),
    st.tuples(st.sampled_from(["readinto", "readinto1"]), st.integers(0, 70_000)),
    st.tuples(st.just("peek"), st.integers(0, 10)),
    st.tuples(st.just("readlines"), st.integers(-1, 3000)),
    st.tuples(st.just("read_ranges"), st.lists(st.tuples(
        st.integers(0, len(DATA) + 10), st.integers(0, 40_000)), max_size=4)),
    st.tuples(st.just("tell")),
), min_size=1, max_size=25)


@pytest.fixture(params=["local", "http", "s3", "redis", "http-sequential", "s3-sequential"])
def opened(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """A function that opens a fresh reader of DATA on the backend (``-sequential``:
    its first stream opened with it), and the oracle's path."""
    oracle = tmp_path / "oracle.bin"
    oracle.write_bytes(DATA)
    backend, _, sequential = request.param.partition("-")
    if backend == "local":
        uri, options = str(oracle), {}
    else:
        target = request.getfixturevalue(f"tensorstream_{backend}")
        key = f"oracle-{uuid.uuid4().hex[:8]}.bin"
        target.put(key, DATA)
        uri, options = target.uri(key), target.options
    yield (lambda: tensorstream.open(uri, part_size=PART, sequential=bool(sequential),
                                     **options)), oracle


def _apply(f: Any, op: tuple[Any, ...]) -> Any:
    name, *args = op
    if name == "seek":
        try:
            return f.seek(*args)
        except (OSError, ValueError):  # a negative position: ValueError here, as BytesIO
            return "refused"
    if name == "read_ranges":  # random access beside the position (a file's pread)
        if not isinstance(f, tensorstream.StreamReader):
            if any(length and offset + length > len(DATA) for offset, length in args[0]):
                return "refused"
            return [DATA[offset:offset + length] for offset, length in args[0]]
        buffers = [bytearray(length) for _offset, length in args[0]]
        try:
            f.read_ranges([(offset, buf) for (offset, _), buf in zip(args[0], buffers,
                                                                     strict=True)])
        except InvalidRangeError:
            return "refused"
        return [bytes(buf) for buf in buffers]
    if name in ("readinto", "readinto1"):
        buf = bytearray(args[0])
        n = getattr(f, name)(buf)
        assert n or not args[0] or f.tell() >= len(DATA)
        return n, bytes(buf[:n])
    if name == "read1":  # at least one byte unless at EOF, at most the size asked for
        got = f.read1(*args)
        assert got or not args[0] or f.tell() >= len(DATA)
        assert args[0] < 0 or len(got) <= args[0]
        return len(got), got
    if name == "peek":  # at least one byte unless at EOF; how many more is the buffer's
        got = f.peek(*args)
        return got[:1]
    return getattr(f, name)(*args)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(script=ops)
def test_every_read_and_seek_matches_a_local_file(opened: Any, script: list[tuple[Any, ...]]
                                                  ) -> None:
    open_reader, oracle = opened
    with open_reader() as f, open(oracle, "rb") as want:
        for step, op in enumerate(script):
            got = _apply(f, op)
            if op[0] in ("read1", "readinto1"):
                # A buffered file's read1 may stop at its buffer's end: the oracle
                # reads as many as this reader's returned.
                got, expected = got[1], want.read(got[0])
            else:
                expected = _apply(want, op)
            assert got == expected, (step, op)
            assert f.tell() == want.tell(), (step, op)


COUNTERS = b"".join(i.to_bytes(8, "big") for i in range(40_000))  # each 8 bytes say where


@pytest.mark.parametrize("backend", ["local", "http", "s3", "redis"])
def test_threads_sharing_a_reader_each_get_the_bytes_they_moved_past(
        backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """As a plain file: reads of several threads take turns, each returns the
    bytes at the position it moved past, and together they read every byte once."""
    if backend == "local":
        (tmp_path / "c.bin").write_bytes(COUNTERS)
        uri, options = str(tmp_path / "c.bin"), {}
    else:
        target = request.getfixturevalue(f"tensorstream_{backend}")
        key = f"threads-{uuid.uuid4().hex[:8]}.bin"
        target.put(key, COUNTERS)
        uri, options = target.uri(key), target.options
    seen: list[int] = []
    errors: list[BaseException] = []

    def reader(f: Any, size: int) -> None:
        try:
            while chunk := f.read(size):
                at = int.from_bytes(chunk[:8], "big") * 8
                assert chunk == COUNTERS[at:at + len(chunk)]
                seen.extend(range(at, at + len(chunk), 8))
        except BaseException as exc:  # reported by the test's own thread
            errors.append(exc)

    import threading

    with tensorstream.open(uri, part_size=PART, **options) as f:
        threads = [threading.Thread(target=reader, args=(f, size))
                   for size in (8, 800, 8 * 1000, 8 * 9000)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    assert not errors, errors
    assert sorted(seen) == list(range(0, len(COUNTERS), 8))
