"""StreamReader/StreamWriter behave as io's binary files where code relies on it:
integer positions, io.UnsupportedOperation for what a mode cannot do, and the
BufferedIOBase names (read1, readinto1, peek) that wrappers and parsers ask for."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import tensorstream
from reader_threads import close_under_readers, read_until_closed
from tensorstream.testing.http_server import HTTPTestServer

DATA = bytes(range(256)) * 64 + b"line1\nline2\n\nend"


@pytest.fixture(params=["local", "http", "http-sequential"])
def reader(request: pytest.FixtureRequest, tmp_path: Path,
           http_server: HTTPTestServer) -> Iterator[Any]:
    if request.param == "local":
        (tmp_path / "obj.bin").write_bytes(DATA)
        f = tensorstream.open(str(tmp_path / "obj.bin"))
    else:
        key = f"file-api/{request.node.name}.bin"
        http_server.put(key, DATA)
        f = tensorstream.open(http_server.url(key), sequential=request.param.endswith("sequential"))
    with f:
        yield f


@pytest.mark.parametrize("bad", [1.5, "5", None, 2.0])
def test_seek_takes_integers_only(reader: Any, bad: Any) -> None:
    reader.seek(7)
    with pytest.raises(TypeError):
        reader.seek(bad)
    with pytest.raises(TypeError):
        reader.seek(0, 1.0)
    assert reader.tell() == 7 and reader.read(3) == DATA[7:10]


def test_seek_and_read_take_anything_with_index(reader: Any) -> None:
    import numpy

    assert reader.seek(numpy.int64(3)) == 3 and isinstance(reader.tell(), int)
    assert reader.read(numpy.int32(4)) == DATA[3:7]
    with pytest.raises(TypeError):
        reader.read(2.5)
    assert reader.tell() == 7


def test_read1_readinto1_and_peek(reader: Any) -> None:
    assert reader.read1(5) == DATA[:5]
    buf = bytearray(4)
    assert reader.readinto1(buf) == 4 and buf == DATA[5:9]
    assert reader.peek(3)[:3] == DATA[9:12] and reader.tell() == 9  # peek does not move
    assert reader.peek()[:1] == DATA[9:10]
    assert reader.read(3) == DATA[9:12]
    reader.seek(-4, io.SEEK_END)
    assert reader.peek(100) == b"\nend" and reader.read1() == b"\nend"
    assert reader.peek() == b"" and reader.read1(10) == b""


def test_text_and_buffered_wrappers_read_it(reader: Any) -> None:
    reader.seek(len(DATA) - 16)
    text = io.TextIOWrapper(reader, encoding="latin-1", newline="")
    assert text.readlines() == ["line1\n", "line2\n", "\n", "end"]
    text.detach()
    reader.seek(0)
    assert io.BufferedReader(reader, 1000).read() == DATA


def test_lines_are_read_a_chunk_at_a_time(reader: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Iteration and readline read a chunk and move back to the line's end: io's own
    readline asked an unbuffered file for one byte at a time (a peek and a read each),
    a minute for the lines of a 1 MB local file."""
    reads: list[int] = []
    real = type(reader)._readinto

    def counted(self: Any, b: Any) -> int:
        reads.append(len(memoryview(b)))
        return real(self, b)

    monkeypatch.setattr(type(reader), "_readinto", counted)
    reader.seek(len(DATA) - 16)
    assert list(reader) == [b"line1\n", b"line2\n", b"\n", b"end"]
    assert len(reads) <= 5, reads  # one a line, and the one that finds the end
    reader.seek(len(DATA) - 16)
    assert reader.readline(3) == b"lin" and reader.readline(0) == b""
    assert reader.readline(None) == b"e1\n" and reader.readlines(1) == [b"line2\n"]
    assert reader.readline(-1) == b"\n" and reader.tell() == len(DATA) - 3
    reader.seek(0)  # a line longer than the first chunk
    assert reader.readline() == DATA[: DATA.index(b"\n") + 1]


def test_the_lines_of_a_chunk_are_read_from_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The next lines are in the chunk a readline read: each line read a chunk of its own
    (9 s for the 200,000 lines of a 5 MB local file). Lines spanning chunks, a last line
    without its newline, ``readline(size)`` and seeks back and forth read as open()'s."""
    data = b"".join(b"%d\r\n" % i for i in range(20000)) + b"x" * 9000 + b"\nlast"
    (tmp_path / "lines.txt").write_bytes(data)
    reads: list[int] = []
    with tensorstream.open(str(tmp_path / "lines.txt")) as f:
        real = type(f)._readinto

        def counted(self: Any, b: Any) -> int:
            reads.append(len(memoryview(b)))
            return real(self, b)

        monkeypatch.setattr(type(f), "_readinto", counted)
        assert list(f) == data.splitlines(keepends=True)
        assert len(reads) <= len(data) // 8192 + 4, len(reads)
        oracle = io.BytesIO(data)
        for step in ([5, 2, -1], [len(data) - 20000, 3, 9000, -1, -1], [3, 7, -1], [0, 0, 1]):
            f.seek(step[0])
            oracle.seek(step[0])
            for size in step[1:]:
                assert f.readline(size) == oracle.readline(size)
                assert f.tell() == oracle.tell()
            assert f.read(3) == oracle.read(3)
        f.seek(len(data) - 20)
        assert f.readlines() == data[len(data) - 20:].splitlines(keepends=True)


def test_a_failed_readline_moves_nothing(reader: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    real = type(reader)._readinto
    calls: list[int] = []

    def second_fails(self: Any, b: Any) -> int:
        calls.append(1)
        if len(calls) == 2:
            raise OSError("the link went down")
        return real(self, b)

    from tensorstream import readonly_file

    reader.seek(11)  # a line of 256 bytes, longer than a chunk
    monkeypatch.setattr(readonly_file, "LINE_CHUNK", 100)
    monkeypatch.setattr(type(reader), "_readinto", second_fails)
    with pytest.raises(OSError, match="link went down"):
        reader.readline()
    assert reader.tell() == 11
    monkeypatch.undo()
    assert reader.readline() == DATA[11:267] and DATA[266:267] == b"\n"


def test_a_reader_cannot_write_or_truncate(reader: Any) -> None:
    for call in (lambda: reader.write(b"x"), lambda: reader.truncate(0),
                 lambda: reader.writelines([b"x"]), lambda: reader.fileno()):
        with pytest.raises(io.UnsupportedOperation):
            call()
    assert reader.read() == DATA  # nothing changed


def test_a_writer_cannot_read(tmp_path: Path) -> None:
    with tensorstream.open(str(tmp_path / "w.bin"), "wb") as w:
        w.write(b"abc")
        for call in (w.read, lambda: w.readinto(bytearray(2)), w.readline):
            with pytest.raises(io.UnsupportedOperation, match="not readable"):
                call()
        w.write(b"def")
    assert (tmp_path / "w.bin").read_bytes() == b"abcdef"


def test_a_strided_buffer_is_refused_and_the_reader_still_reads(reader: Any) -> None:
    import numpy

    reader.read(3)
    for strided in (memoryview(bytearray(10))[::2], numpy.zeros((4, 4), numpy.uint8)[:, ::2]):
        with pytest.raises(TypeError, match="contiguous"):
            reader.readinto(strided)
        with pytest.raises(TypeError, match="contiguous"):
            reader.read_ranges([(0, strided)])
    # Over HTTP the refused buffer reached the socket and killed the reader's stream:
    # every later read raised "read from a closed or finished range body".
    assert reader.tell() == 3 and reader.read() == DATA[3:]


class _Interrupted(Exception):
    pass


@pytest.mark.parametrize("sequential", [True, False])
def test_an_interrupted_read_leaves_the_reader_usable(
    http_server: HTTPTestServer, http_reset: None, sequential: bool
) -> None:
    """An exception raised in the middle of a read (Ctrl-C in a notebook) fails
    that read only; the next reads are exact."""
    import os
    import signal

    data = os.urandom(1 << 20)
    http_server.put("file-api/interrupted.bin", data)

    def interrupt(signum: int, frame: Any) -> None:
        raise _Interrupted

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        http_server.faults.rate_limit = 512 << 10
        with tensorstream.open(http_server.url("file-api/interrupted.bin"),
                               sequential=sequential) as f:
            assert f.read(1000) == data[:1000]
            signal.setitimer(signal.ITIMER_REAL, 0.3)
            with pytest.raises(_Interrupted):
                f.read()
            http_server.faults.rate_limit = None
            assert f.tell() == 1000 and f.read() == data[1000:]
            f.seek(0)
            assert f.read() == data
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_a_closed_file_answers_only_closed(tmp_path: Path) -> None:
    """As io's files: after close() every method but ``closed`` raises ValueError (readable,
    seekable, writable, and a writer's tell and flush answered as if it were open)."""
    writer = tensorstream.open(str(tmp_path / "w.bin"), "wb")
    writer.write(b"abc")
    writer.close()
    reader = tensorstream.open(str(tmp_path / "w.bin"))
    reader.close()
    for f in (writer, reader):
        assert f.closed
        for call in (f.readable, f.seekable, f.writable, f.tell, f.flush):
            with pytest.raises(ValueError, match="closed file"):
                call()
        f.close()  # a second close is a no-op


def test_positions_given_to_a_reader_are_integers(reader: Any) -> None:
    """As seek(): read_ranges' offsets went out as "bytes=1.5-2.5" (S3: "the server ignored
    the Range header", HTTP: "the object changed", Redis: a ProtocolError), and a float
    readahead end made every later read raise TypeError."""
    import numpy

    from tensorstream.errors import InvalidRangeError

    for bad in (1.5, "1"):
        with pytest.raises(TypeError):
            reader.read_ranges([(bad, bytearray(2))])
        with pytest.raises(TypeError):
            reader.set_readahead_end(bad)
        with pytest.raises(TypeError):
            reader.expect(bad, bytearray(2))
        with pytest.raises(TypeError):
            reader.set_read_boundaries([0, bad])
        with pytest.raises(TypeError):
            reader.fork(end=bad)
    with pytest.raises(InvalidRangeError, match="negative offset -5"):
        reader.read_ranges([(-5, bytearray(2))])
    for call in (lambda: reader.set_readahead_end(-1), lambda: reader.fork(end=-1),
                 lambda: reader.expect(-1, bytearray(2))):
        with pytest.raises(ValueError, match="negative"):
            call()
    buf = bytearray(4)
    reader.read_ranges([(numpy.int64(3), buf)])
    assert buf == DATA[3:7]
    reader.set_readahead_end(numpy.int64(100))
    assert reader.read() == DATA  # nothing above left the reader unusable


def test_closing_a_local_reader_waits_for_reads_of_other_threads(tmp_path: Path) -> None:
    """A local reader closed while other threads read (``readinto`` and ``read_ranges``):
    each read returns its exact bytes or raises ValueError, as a closed file. The close
    closed the descriptors under the reads: a bare ``OSError`` (EBADF), or the bytes of
    whatever file reused the number."""
    import os

    data = os.urandom(16 << 20)
    path = tmp_path / "big.bin"
    path.write_bytes(data)
    for trial in range(20):
        f = tensorstream.open(str(path))
        errors: list[BaseException] = []

        def by_readinto(f: Any = f, errors: list[BaseException] = errors) -> None:
            read_until_closed(f, data, errors, 1 << 20)

        def by_ranges(f: Any = f, errors: list[BaseException] = errors) -> None:
            buf = bytearray(1 << 20)
            try:
                for i in range(16):
                    f.read_ranges([(i << 20, buf)])
                    assert buf == data[i << 20 : (i + 1) << 20]
            except ValueError:
                return
            except BaseException as exc:  # reported below
                errors.append(exc)

        close_under_readers(f, [by_readinto, by_readinto, by_ranges], 0.001 * (trial % 5))
        assert not errors, f"trial {trial}: {errors!r}"


@pytest.mark.parametrize("kind", ["http", "local"])
def test_a_dropped_reader_collected_on_the_io_thread_closes_its_connections(
        kind: str, http_server: HTTPTestServer, tmp_path: Path) -> None:
    """The garbage collector may finalize a dropped reader (one in a reference cycle)
    on tensorstream's I/O thread, where its close could not wait for the provider's
    (run_sync refuses there): the close raised, unseen, and its connections stayed open."""
    if kind == "local":
        (tmp_path / "obj.bin").write_bytes(DATA)
        f = tensorstream.open(str(tmp_path / "obj.bin"))
    else:
        http_server.put("file-api/collected.bin", DATA)
        f = tensorstream.open(http_server.url("file-api/collected.bin"))
    f.read(100)
    held = [f]
    del f
    assert _collected_on_the_io_thread(held)


@pytest.mark.parametrize("kind", ["http", "redis"])
def test_a_fork_reading_on_after_its_reader_closed_leaves_no_connection_open(
        kind: str, request: pytest.FixtureRequest) -> None:
    """The connection pool a reader shares with its forks is closed with the last of
    them: closed with the reader, a fork reading on opened connections of its own that
    nothing closed (ResourceWarning: unclosed socket, at the exit)."""
    import os

    data = os.urandom(1 << 20)
    if kind == "redis":
        server = request.getfixturevalue("redis_server")
        server.put("file-api/forked", data)
        uri = server.url("file-api/forked")
    else:
        server = request.getfixturevalue("http_server")
        server.put("file-api/forked.bin", data)
        uri = server.url("file-api/forked.bin")
    f = tensorstream.open(uri)
    closed = _counting_closes(f._provider)
    fork, second = f.fork(), f.fork()
    second.close()
    f.close()
    assert not closed  # a fork is still open
    assert fork.read() == data
    fork.close()
    fork.close()
    assert closed == [True]


def test_a_dropped_writer_collected_on_the_io_thread_is_discarded(tmp_path: Path) -> None:
    """The garbage collector may finalize a dropped writer (one in a reference cycle) on
    tensorstream's I/O thread, where its abort could not wait for the loop: the abort
    raised, unseen, and its temp file (an upload, staged chunks) was left behind."""
    dest = tmp_path / "out.bin"
    f = tensorstream.open(str(dest), "wb")
    f.write(DATA)
    f.flush()
    held = [f]
    del f
    assert _collected_on_the_io_thread(held)
    assert not dest.exists()
    assert list(tmp_path.iterdir()) == [], "the writer's temp file was left behind"


def _collected_on_the_io_thread(held: list[Any]) -> bool:
    """Drop the file in ``held`` (the caller's only reference) in a reference cycle, have the garbage
    collector free it on tensorstream's I/O thread, and say whether its provider was
    closed there (what its finalizer starts runs on that loop once the collection yields)."""
    import asyncio
    import gc

    from tensorstream import _loop

    f = held.pop()
    closed = _counting_closes(f._provider)
    was_enabled = gc.isenabled()
    gc.disable()  # (collected on the I/O thread below, not wherever an allocation is)
    f.itself = f  # a cycle: only the garbage collector frees it
    del f

    async def collect() -> None:
        gc.collect()
        for _ in range(100):
            if closed:
                return
            await asyncio.sleep(0.05)

    try:
        _loop.run_sync(collect(), timeout=30)
    finally:
        if was_enabled:
            gc.enable()
    return bool(closed)


def _counting_closes(provider: Any) -> list[bool]:
    """A list that gets one entry each time ``provider`` is closed (its close wrapped)."""
    real_close = provider.close
    closed: list[bool] = []

    async def close() -> None:
        await real_close()
        closed.append(True)

    provider.close = close
    return closed
