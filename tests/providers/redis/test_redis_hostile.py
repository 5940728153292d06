"""A hostile Redis server (a raw RESP server on loopback) lying in its
replies: a ``STRLEN`` that is negative or huge, a manifest whose mtime is
no date, a ``GETRANGE`` answered with an integer. Each is a ProtocolError,
never an empty read, a bare TypeError/OverflowError or a MemoryError."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import socketserver
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import tensorstream
from tensorstream.cli.main import main
from tensorstream.errors import IntegrityError, ProtocolError

pytestmark = [pytest.mark.usefixtures("isolated_env"),
              pytest.mark.filterwarnings("ignore:Server/proxy")]

DATA = os.urandom(1000)
Reply = bytes | Callable[[list[bytes]], bytes]


def _bulk(b: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(b), b)


def _getrange(args: list[bytes]) -> bytes:
    return _bulk(DATA[int(args[2]):int(args[3]) + 1])


#: A well-behaved server's answers: the key holds DATA as a string.
HONEST: dict[str, Reply] = {
    "hello": b"-ERR unknown command 'HELLO'\r\n", "type": b"+string\r\n",
    "hgetall": b"*0\r\n", "strlen": b":1000\r\n", "getrange": _getrange,
}


class RawRedis:
    """Answers each command by name from ``replies`` (``+OK`` otherwise)."""

    def __init__(self, replies: dict[str, Reply]) -> None:
        outer = self
        self.replies = replies

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                while line := self.rfile.readline():
                    if not line.startswith(b"*"):
                        continue
                    args = []
                    for _ in range(int(line[1:])):
                        size = int(self.rfile.readline()[1:])
                        args.append(self.rfile.read(size + 2)[:-2])
                    reply = outer.replies.get(args[0].decode().lower(), b"+OK\r\n")
                    self.wfile.write(reply(args) if callable(reply) else reply)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = Server(("127.0.0.1", 0), Handler)
        self.url = f"redis://127.0.0.1:{self._server.server_address[1]}/k"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def serve() -> Iterator[Callable[[dict[str, Reply]], str]]:
    servers: list[RawRedis] = []

    def start(lies: dict[str, Reply]) -> str:
        servers.append(RawRedis({**HONEST, **lies}))
        return servers[-1].url
    yield start
    for server in servers:
        server.close()


def _read(url: str) -> bytes:
    with tensorstream.open(url, retries=1) as f:
        return f.read()


@pytest.mark.parametrize("length", [b":-5\r\n", b":99999999999999999\r\n"],
                         ids=["negative", "huge"])
def test_a_strlen_that_is_no_length_is_a_protocol_error(
        serve: Callable[[dict[str, Reply]], str], length: bytes) -> None:
    # negative: read() returned b'' (an empty object); huge: MemoryError in read()
    with pytest.raises(ProtocolError, match="Redis reported the length"):
        _read(serve({"strlen": length}))


@pytest.mark.parametrize("mtime", [b"nan", b"inf", b"1e300", b"-1e300"])
def test_a_manifest_whose_mtime_is_no_date_is_corrupt(
        serve: Callable[[dict[str, Reply]], str], mtime: bytes) -> None:
    fields = [b"tensorstream", b"1", b"size", b"1000", b"chunk_size", b"1000",
              b"generation", b"0123456789abcdef", b"mtime", mtime]
    manifest = b"*%d\r\n" % len(fields) + b"".join(_bulk(f) for f in fields)
    with pytest.raises(ProtocolError, match="corrupt tensorstream manifest"):
        _read(serve({"type": b"+hash\r\n", "hgetall": manifest}))


def test_a_getrange_answered_with_an_integer_is_a_protocol_error(
        serve: Callable[[dict[str, Reply]], str]) -> None:
    with pytest.raises(ProtocolError, match="not bytes"):  # was TypeError: no len()
        _read(serve({"getrange": b":5\r\n"}))


@pytest.mark.parametrize("reply", [b":5\r\n", b"*1\r\n$3\r\nabc\r\n",
                                   b"*2\r\n$3\r\nabc\r\n:7\r\n"],
                         ids=["integer", "one-of-two", "integer-inside"])
def test_an_mget_of_chunks_answered_oddly_is_a_protocol_error(
        serve: Callable[[dict[str, Reply]], str], reply: bytes) -> None:
    # Whole small chunks are fetched with one MGET: its answer is checked as GETRANGE's is.
    fields = [b"tensorstream", b"1", b"size", b"6", b"chunk_size", b"3", b"generation",
              b"0123456789abcdef"]
    manifest = b"*%d\r\n" % len(fields) + b"".join(_bulk(f) for f in fields)
    with pytest.raises(ProtocolError, match=r"MGET|not bytes"):
        _read(serve({"type": b"+hash\r\n", "hgetall": manifest, "mget": reply}))


PASSWORD = "hunter2-Tr0ub4dor"


@pytest.mark.parametrize("lies", [
    {"hello": f"-WRONGPASS {PASSWORD} is not the password\r\n".encode(),
     "auth": f"-WRONGPASS {PASSWORD} is not the password\r\n".encode()},
    {"getrange": f"-ERR you sent {PASSWORD}\r\n".encode()},
], ids=["auth", "getrange"])
def test_a_server_echoing_the_password_has_it_masked(
        serve: Callable[[dict[str, Reply]], str], lies: dict[str, Reply],
        caplog: pytest.LogCaptureFixture) -> None:
    url = serve(lies).replace("redis://", f"redis://:{PASSWORD}@")
    caplog.set_level(logging.DEBUG)
    with pytest.raises(tensorstream.errors.TensorstreamError) as info:
        _read(url)
    # redis-py's DEBUG log of the error reply had it (its message, not tensorstream's)
    assert PASSWORD not in caplog.text
    chain: list[BaseException] = []
    exc: BaseException | None = info.value
    while exc is not None and len(chain) < 10:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    shown = " | ".join(f"{e} {e!r}" for e in chain)
    assert PASSWORD not in shown
    assert "***" in str(info.value)


def test_a_scan_whose_cursor_comes_back_is_a_protocol_error(
        serve: Callable[[dict[str, Reply]], str]) -> None:
    # Was a loop until the idle timeout, piling up the repeated keys meanwhile.
    url = serve({"type": b"+none\r\n", "hgetall": b"*0\r\n", "strlen": b":0\r\n",
                 "scan": b"*2\r\n$1\r\n7\r\n*1\r\n" + _bulk(b"k:t:0")})
    with pytest.raises(ProtocolError, match="SCAN loops"), \
            tensorstream.open(url, retries=1, timeout_idle=2) as f:
        f.read()


@pytest.mark.parametrize("length", [b"$3\r\nabc\r\n", b"$0\r\n\r\n", b"+1e3\r\n"],
                         ids=["abc", "empty", "float"])
def test_a_staged_chunk_strlen_that_is_no_integer_is_a_length_mismatch(
        serve: Callable[[dict[str, Reply]], str], length: bytes) -> None:
    # Was a bare ValueError from int(); now the error a wrong length gives: nothing published.
    # The chunk is staged and read back in a transaction (MULTI, SET, GET, EXEC): honestly.
    staged = {"multi": b"+OK\r\n", "set": b"+QUEUED\r\n", "get": b"+QUEUED\r\n",
              "exec": b"*2\r\n+OK\r\n" + _bulk(DATA)}
    url = serve({**staged, "type": b"+none\r\n", "persist": b":1\r\n", "strlen": length})

    async def write() -> None:
        provider = tensorstream.get_provider(url, retries=1)
        try:
            writer = provider.open_writer(url.rsplit("/", 1)[-1])
            size = writer.part_size_for(len(DATA), len(DATA))
            assert size is not None
            await writer.write_part(0, memoryview(DATA), md5=b"")
            await writer.commit_parts(1, sha256=hashlib.sha256(DATA).hexdigest())
        finally:
            await provider.close()
    with pytest.raises(IntegrityError, match="does not have the length written"):
        asyncio.run(asyncio.wait_for(write(), 10))


def test_ls_skips_a_key_with_a_bogus_strlen_naming_it_and_lists_the_rest(
        serve: Callable[[dict[str, Reply]], str], caplog: pytest.LogCaptureFixture,
        capsys: pytest.CaptureFixture[str]) -> None:
    # Was: the one bad key failed the whole `ls redis://...` with a ProtocolError.
    def strlen(args: list[bytes]) -> bytes:
        return b":-5\r\n" if args[1] == b"bad" else b":1000\r\n"
    keys = [b"bad", b"good", b"more"]
    url = serve({"type": b"+string\r\n", "strlen": strlen,
                 "scan": b"*2\r\n$1\r\n0\r\n*3\r\n" + b"".join(_bulk(k) for k in keys)})
    with caplog.at_level(logging.WARNING, logger="tensorstream.redis"):
        code = main(["ls", url.rsplit("/", 1)[0] + "/"])
    out = capsys.readouterr().out
    assert code == 0
    assert "good" in out and "more" in out and "bad" not in out
    assert any("'bad'" in r.getMessage() and "-5" in r.getMessage() for r in caplog.records)


def test_ls_skips_a_broken_tensorizer_group_with_a_warning_naming_it(
        serve: Callable[[dict[str, Reply]], str], caplog: pytest.LogCaptureFixture,
        capsys: pytest.CaptureFixture[str]) -> None:
    # Was skipped with a debug log only: an object missing from `ls` without a word.
    def type_(args: list[bytes]) -> bytes:
        return b"+none\r\n" if args[1] == b"m" else b"+string\r\n"
    keys = [b"m:header:0", b"m:data:500", b"good"]  # m's bytes 10-499 are missing
    url = serve({"type": type_, "strlen": b":10\r\n",
                 "scan": b"*2\r\n$1\r\n0\r\n*3\r\n" + b"".join(_bulk(k) for k in keys)})
    with caplog.at_level(logging.WARNING, logger="tensorstream.redis"):
        code = main(["ls", url.rsplit("/", 1)[0] + "/"])
    out = capsys.readouterr().out
    assert code == 0 and [line.split()[-1] for line in out.splitlines()] == ["good"]
    assert any(r.levelno == logging.WARNING and "'m'" in r.getMessage() for r in caplog.records)


def test_sync_delete_from_a_listing_with_a_bogus_strlen_fails_and_deletes_nothing(
        serve: Callable[[dict[str, Reply]], str], tmp_path: Path) -> None:
    # Only `ls` skips the lying key: a sync listing without it would delete its copy.
    def strlen(args: list[bytes]) -> bytes:
        return b":-5\r\n" if args[1] == b"bad" else b":1000\r\n"
    url = serve({"type": b"+string\r\n", "strlen": strlen,
                 "scan": b"*2\r\n$1\r\n0\r\n*2\r\n" + _bulk(b"bad") + _bulk(b"good")})
    (tmp_path / "bad").write_bytes(b"kept")
    code = main(["sync", "--delete", url.rsplit("/", 1)[0] + "/", str(tmp_path)])
    assert code != 0
    assert (tmp_path / "bad").read_bytes() == b"kept"


def test_sync_delete_from_a_listing_with_a_broken_tensorizer_group_deletes_nothing(
        serve: Callable[[dict[str, Reply]], str], tmp_path: Path) -> None:
    # Was skipped (a debug log) in every listing: sync --delete removed the group's copy.
    def type_(args: list[bytes]) -> bytes:
        return b"+none\r\n" if args[1] == b"m" else b"+string\r\n"
    keys = [b"m:header:0", b"m:data:500", b"good"]  # m's bytes 10-499 are missing
    url = serve({"type": type_, "strlen": b":10\r\n",
                 "scan": b"*2\r\n$1\r\n0\r\n*3\r\n" + b"".join(_bulk(k) for k in keys)})
    (tmp_path / "m").write_bytes(b"kept")
    code = main(["sync", "--delete", url.rsplit("/", 1)[0] + "/", str(tmp_path)])
    assert code != 0
    assert (tmp_path / "m").read_bytes() == b"kept"


CORRUPT_MANIFEST = b"*6\r\n" + b"".join(_bulk(f) for f in [
    b"tensorstream", b"1", b"size", b"-5", b"chunk_size", b"1000"])


def _with_a_corrupt_manifest(serve: Callable[[dict[str, Reply]], str]) -> str:
    def type_(args: list[bytes]) -> bytes:
        return b"+hash\r\n" if args[1] in (b"k", b"mine") else b"+string\r\n"

    def hgetall(args: list[bytes]) -> bytes:  # "mine": a hash of the user's own
        return CORRUPT_MANIFEST if args[1] == b"k" else b"*2\r\n" + _bulk(b"a") + _bulk(b"b")
    keys = [b"k", b"mine", b"good"]
    return serve({"type": type_, "hgetall": hgetall, "strlen": b":10\r\n",
                  "scan": b"*2\r\n$1\r\n0\r\n*3\r\n" + b"".join(_bulk(k) for k in keys)})


def test_ls_skips_a_corrupt_manifest_with_a_warning_naming_it(
        serve: Callable[[dict[str, Reply]], str], caplog: pytest.LogCaptureFixture,
        capsys: pytest.CaptureFixture[str]) -> None:
    url = _with_a_corrupt_manifest(serve)
    with caplog.at_level(logging.WARNING, logger="tensorstream.redis"):
        code = main(["ls", url.rsplit("/", 1)[0] + "/"])
    out = capsys.readouterr().out
    assert code == 0 and [line.split()[-1] for line in out.splitlines()] == ["good"]
    assert [r.getMessage() for r in caplog.records if "'k'" in r.getMessage()]
    assert not [r for r in caplog.records if "'mine'" in r.getMessage()]


def test_sync_delete_from_a_listing_with_a_corrupt_manifest_deletes_nothing(
        serve: Callable[[dict[str, Reply]], str], tmp_path: Path) -> None:
    # Was left out of every listing without a word: sync --delete removed its copy.
    url = _with_a_corrupt_manifest(serve)
    (tmp_path / "k").write_bytes(b"kept")
    code = main(["sync", "--delete", url.rsplit("/", 1)[0] + "/", str(tmp_path)])
    assert code != 0
    assert (tmp_path / "k").read_bytes() == b"kept"


def test_a_batch_read_back_names_the_chunk_that_came_back_other(
        serve: Callable[[dict[str, Reply]], str]) -> None:
    # Small chunks are staged and read back in batches (one MULTI of SET/GET pairs):
    # each reply is compared with its own chunk, and the one that differs is named.
    data = os.urandom(8 << 10)
    store: dict[bytes, bytes] = {}
    queued: list[bytes | None] = []

    def set_(args: list[bytes]) -> bytes:
        store[args[1]] = args[2]
        queued.append(None)
        return b"+QUEUED\r\n"

    def get(args: list[bytes]) -> bytes:
        queued.append(args[1])
        return b"+QUEUED\r\n"

    def exec_(args: list[bytes]) -> bytes:
        out = [b"+OK\r\n" if key is None else
               _bulk(store[key][:-1] + bytes([store[key][-1] ^ 1]) if key.endswith(b":5120")
                     else store[key])
               for key in queued]
        queued.clear()
        return b"*%d\r\n%s" % (len(out), b"".join(out))

    url = serve({"type": b"+none\r\n", "multi": b"+OK\r\n", "set": set_, "get": get,
                 "exec": exec_})

    async def write() -> None:
        provider = tensorstream.get_provider(url, retries=1, redis_chunk_size=1 << 10)
        try:
            writer = provider.open_writer(url.rsplit("/", 1)[-1])
            assert writer.part_size_for(len(data), len(data)) == len(data)
            await writer.write_part(0, memoryview(data), md5=b"")
        finally:
            await provider.close()
    with pytest.raises(IntegrityError, match=r"for bytes 5120-6143 of 'k'"):
        asyncio.run(asyncio.wait_for(write(), 10))
    assert len(store) == 8  # one batch
