"""Streamed sequential reads (``tensorstream.readahead.streamed``) against real servers
on loopback: one request per run of reads, exact bytes through skips, jumps and
forks, a cut body resumed exactly and pinned, and the opt-out."""

from __future__ import annotations

import concurrent.futures
import os
from typing import Any

import pytest

import tensorstream
from fixtures_http import count_held_reads
from fixtures_s3 import S3_BUCKET
from reliability_helpers import FAST, unique
from tensorstream import _loop, errors
from tensorstream.providers.base import Pin
from tensorstream.readahead.streamed import SequentialStream
from tensorstream.testing.http_server import HTTPTestServer
from tensorstream.testing.proxy import HTTPFaultProxy
from tensorstream.testing.s3_server import MotoS3Server
from tensorstream.uri import parse_uri

MiB = 1 << 20


#: A well-behaved http_server, its faults reset before and after each test.
pytestmark = pytest.mark.usefixtures("http_server", "http_reset")


def _put(server: HTTPTestServer, size: int) -> tuple[str, str, bytes]:
    key = f"stream-{os.urandom(4).hex()}"
    data = os.urandom(size)
    server.put(key, data)
    return key, server.url(key), data


def test_sequential_reads_share_one_pinned_request(http_server: HTTPTestServer) -> None:
    key, url, data = _put(http_server, 6 * MiB + 123)
    with tensorstream.open(url) as f:
        got = [f.read(n) for n in (100, 3 * MiB, 50, 2 * MiB, 10 * MiB)]
        stats = f.read_stats()
    assert b"".join(got) == data
    gets = http_server.requests_for(key, "GET")
    assert len(gets) == 1
    assert gets[0].headers["Range"] == f"bytes=0-{len(data) - 1}"
    assert gets[0].headers["If-Match"] == http_server.etag(key)
    assert gets[0].headers["Accept-Encoding"] == "identity"
    assert stats["phase"] == "stream" and stats["streams"] == 1
    assert stats["direct_bytes"] == len(data) and stats["copied_bytes"] == 0


def test_skips_jumps_and_backward_seeks_are_exact(http_server: HTTPTestServer) -> None:
    key, url, data = _put(http_server, 8 * MiB)
    with tensorstream.open(url) as f:
        assert f.read(100) == data[:100]
        f.seek(500_000, os.SEEK_CUR)  # a filtered tensor: read past, same request
        assert f.read(1000) == data[500_100:501_100]
        assert len(http_server.requests_for(key, "GET")) == 1
        f.seek(6 * MiB)  # a jump: a ranged read, then a new stream for what follows
        assert f.read(1000) == data[6 * MiB : 6 * MiB + 1000]
        assert f.read(5000) == data[6 * MiB + 1000 : 6 * MiB + 6000]
        f.seek(10)  # backwards
        assert f.read(50) == data[10:60]
        assert f.read() == data[60:]


def test_random_access_stays_on_ranged_requests(http_server: HTTPTestServer) -> None:
    """A lazy load's pattern (jump, header, data, jump...) opens no new streams:
    a stream closed early costs its connection."""
    _, url, data = _put(http_server, 8 * MiB)
    with tensorstream.open(url) as f:
        assert f.read(100) == data[:100]  # the first read opens a stream
        for at in (6 * MiB, 3 * MiB, 7 * MiB, 2 * MiB):
            f.seek(at)
            assert f.read(100) == data[at : at + 100]
            assert f.read(300_000) == data[at + 100 : at + 300_100]
        assert f.read_stats()["streams"] == 1
        assert f.read(1000) == data[2 * MiB + 300_100 : 2 * MiB + 301_100]
        # A run of reads streams, from where the ranged requests' bytes end.
        assert f.read(2 * MiB) == data[2 * MiB + 301_100 : 4 * MiB + 301_100]
        assert f.read_stats()["streams"] == 2


def test_a_fork_streams_up_to_its_end_hint(http_server: HTTPTestServer) -> None:
    key, url, data = _put(http_server, 4 * MiB)
    with tensorstream.open(url) as f, f.fork(end=3 * MiB) as fork:
        fork.seek(1 * MiB)
        assert fork.read(2 * MiB) == data[MiB : 3 * MiB]
        assert fork.read() == data[3 * MiB :]  # past the hint still works
    ranges = [r.headers["Range"] for r in http_server.requests_for(key, "GET")]
    assert ranges[0] == f"bytes={MiB}-{3 * MiB - 1}"


def test_a_cut_stream_is_resumed_exactly_with_if_match(http_server: HTTPTestServer) -> None:
    key, url, data = _put(http_server, 3 * MiB)
    http_server.faults.key = key
    http_server.faults.drop_after, http_server.faults.drop_times = 300_000, 1
    with tensorstream.open(url, **FAST) as f:
        assert f.read() == data
    gets = http_server.requests_for(key, "GET")
    assert http_server.faults.dropped == 1 and len(gets) == 2
    assert gets[1].headers["Range"] == f"bytes=300000-{len(data) - 1}"
    assert gets[1].headers["If-Match"] == http_server.etag(key)


def test_a_stream_cut_while_skipping_never_counts_skipped_bytes(
        http_server: HTTPTestServer) -> None:
    key, url, data = _put(http_server, 2 * MiB)
    http_server.faults.key = key
    http_server.faults.drop_after, http_server.faults.drop_times = 300_000, 1
    with tensorstream.open(url, **FAST) as f:
        assert f.read(100) == data[:100]
        f.seek(600_000)  # skipped by reading the stream: it breaks half-way through
        assert f.read(1000) == data[600_000:601_000]
        assert f.read() == data[601_000:]
    assert http_server.faults.dropped == 1


def test_a_permanent_error_opening_a_stream_is_raised_at_once(
        http_server: HTTPTestServer) -> None:
    key, url, _ = _put(http_server, 1 * MiB)
    with tensorstream.open(url, **FAST) as f:
        http_server.faults.key = key
        http_server.faults.status_script = [403]
        with pytest.raises(errors.PermissionDeniedError):
            f.read()
    assert len(http_server.requests_for(key, "GET")) == 1  # not retried, not re-asked by range


@pytest.mark.parametrize("ignore_if_match", [False, True])
def test_an_object_replaced_under_a_cut_stream_is_never_mixed(
        http_server: HTTPTestServer, ignore_if_match: bool) -> None:
    key, url, data = _put(http_server, 3 * MiB)
    http_server.faults.key = key
    http_server.faults.drop_after, http_server.faults.drop_times = 300_000, 1
    http_server.faults.replace_after_requests = 1  # the resumed request sees a new version
    http_server.faults.ignore_if_match = ignore_if_match
    with tensorstream.open(url, **FAST) as f:
        assert f.read(1000) == data[:1000]
        with pytest.raises(errors.ObjectChangedError):
            f.read()


def test_stream_reads_can_be_turned_off(http_server: HTTPTestServer) -> None:
    key, url, data = _put(http_server, 3 * MiB)
    with tensorstream.open(url, stream_reads="false", part_size=MiB) as f:
        assert f.read() == data
        assert f.read_stats()["phase"] != "stream" and f.read_stats()["streams"] == 0
    assert len(http_server.requests_for(key, "GET")) > 1
    with pytest.raises(errors.ConfigurationError, match="stream_reads"):
        tensorstream.open(url, stream_reads="sometimes")


def test_s3_sequential_reads_stream_one_signed_request(moto_s3_public: MotoS3Server) -> None:
    key = unique()
    data = os.urandom(5 * MiB + 17)
    moto_s3_public.put(S3_BUCKET, key, data)
    with HTTPFaultProxy(moto_s3_public.endpoint_url) as proxy:
        opts = moto_s3_public.options(s3_endpoint=proxy.url)
        with tensorstream.open(f"s3://{S3_BUCKET}/{key}", **opts) as f:
            got = [f.read(n) for n in (64, 2 * MiB, 10, 4 * MiB)]
            etag = f.etag
        gets = [r for r in proxy.requests if r.method == "GET"]
    assert b"".join(got) == data
    assert len(gets) == 1
    assert gets[0].headers["Range"] == f"bytes=0-{len(data) - 1}"
    assert gets[0].headers["If-Match"] == etag
    assert "Authorization" in gets[0].headers  # signed (moto checks the signature)


def test_a_tensorizer_load_streams_one_request_per_reader(
        http_server: HTTPTestServer, tmp_path: object) -> None:
    import torch

    from tensor_files import random_state, tensorizer_bytes
    from tensorstream.tensorizer.hook import reader_count

    sd = random_state(5, 8, (512, 512))
    key = f"stream-{os.urandom(4).hex()}"
    http_server.put(key, tensorizer_bytes(sd, tmp_path))
    with tensorstream.deserialize(http_server.url(key), device="cpu", num_readers=2) as d:
        assert reader_count(d) == 2  # (a whole load: two fetcher threads, one parser)
        for name, tensor in sd.items():
            assert torch.equal(d[name], tensor)
    # The first reader streams the index and its half, the fork streams the other half.
    assert len(http_server.requests_for(key, "GET")) == 2


class _RecordingExecutor(concurrent.futures.ThreadPoolExecutor):
    """A thread pool that remembers the sizes of the buffers it was asked to help with."""

    def __init__(self) -> None:
        super().__init__(max_workers=1)
        self.helped: list[int] = []

    def submit(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def, override]
        self.helped.append(len(args[0]))
        return super().submit(fn, *args, **kwargs)


def _stream_for(url: str, helper: concurrent.futures.Executor) -> tuple[SequentialStream, Any]:
    provider = tensorstream.get_provider(url)
    path = parse_uri(url).path
    info = _loop.run_sync(provider.stat(path))
    stream = SequentialStream(provider, path, info.size, Pin.of(info), limit=info.size,
                              helper=helper)
    return stream, provider


def test_large_streamed_reads_have_their_pages_faulted_in_by_a_helper(
        http_server: HTTPTestServer) -> None:
    _, url, data = _put(http_server, 12 * MiB + 10)
    helper = _RecordingExecutor()
    stream, provider = _stream_for(url, helper)
    try:
        buf = bytearray(len(data))
        view = memoryview(buf)
        assert stream.read(0, view[:10], sequential=False, first=True) == 10
        assert stream.read(10, view[10:], sequential=True) == 12 * MiB
        assert bytes(buf) == data
        assert helper.helped == [12 * MiB]  # the small read is not worth a helper
        assert stream.opened == 1 and stream.open_seconds > 0
    finally:
        stream.close()
        helper.shutdown()
        _loop.run_sync(provider.close())


def test_a_stream_tells_how_much_of_a_read_had_not_arrived(http_server: HTTPTestServer) -> None:
    """The controller's signal for a stream: a paced link leaves the socket
    empty when a read starts; a fast one has filled it while the reader was busy."""
    import time

    key, url, data = _put(http_server, 4 * MiB)
    helper = _RecordingExecutor()
    stream, provider = _stream_for(url, helper)
    try:
        buf = memoryview(bytearray(len(data)))
        assert stream.read(0, buf[:100], sequential=False, first=True) == 100
        assert stream.short is None  # too small to measure
        time.sleep(0.3)  # a busy reader: the fast link fills the socket meanwhile
        assert stream.read(100, buf[100 : 100 << 10], sequential=True) == (100 << 10) - 100
        assert stream.short is not None and stream.short < 0.5
        stream.close()
        http_server.faults.key, http_server.faults.rate_limit = key, 1 * MiB
        assert stream.read(1 * MiB, buf[MiB : 2 * MiB], sequential=False, first=True) == MiB
        assert stream.short is not None and stream.short > 0.5  # the link is the limit
        assert bytes(buf[: 100 << 10]) == data[: 100 << 10]
        assert bytes(buf[MiB : 2 * MiB]) == data[MiB : 2 * MiB]
    finally:
        stream.close()
        helper.shutdown()
        _loop.run_sync(provider.close())


def _header_pattern(size: int) -> list[int]:
    """A tensorizer-like run of reads: two small header reads, then data."""
    out, at, i = [], 0, 0
    while at < size:
        for n in (8, 120 + i % 50, 30_000 + 997 * (i % 7)):
            out.append(n)
            at += n
        i += 1
    return out


def test_small_reads_that_arrived_are_served_from_the_stream_exactly(
        http_server: HTTPTestServer, monkeypatch: pytest.MonkeyPatch) -> None:
    served = count_held_reads(monkeypatch)
    key, url, data = _put(http_server, 2 * MiB + 77)
    buf = bytearray(64 << 10)
    with tensorstream.open(url) as f:
        got = bytearray()
        for n in _header_pattern(len(data)):
            view = memoryview(buf)[:n]
            k = f.readinto(view)
            assert k == min(n, len(data) - len(got))  # never short but at the end
            got += view[:k]
        assert f.tell() == len(data)
        assert f.read(10) == b"" and f.readinto(bytearray(10)) == 0  # at EOF, as a file
        assert len(http_server.requests_for(key, "GET")) == 1
        f.seek(len(data) - 5)
        assert f.read(10) == data[-5:]
    assert bytes(got) == data
    assert sum(served) > len(data) // 2  # the fast path served most bytes


def test_held_reads_ask_the_socket_once_per_stretch_that_arrived(
        http_server: HTTPTestServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bytes known to have arrived stay arrived: small reads inside them ask the
    kernel nothing (a FIONREAD per tensor header was a tenth of a small-tensor load);
    the reader's small-read buffer asks once per fill."""
    import fcntl

    served = count_held_reads(monkeypatch)
    asked: list[int] = []
    ioctl = fcntl.ioctl

    def counted(fd: int, request: int, arg: bytes) -> bytes:
        asked.append(request)
        return ioctl(fd, request, arg)

    monkeypatch.setattr(fcntl, "ioctl", counted)
    _, url, data = _put(http_server, 4 * MiB)
    reads = _header_pattern(len(data))
    with tensorstream.open(url) as f:
        got = bytearray()
        for n in reads:
            got += f.read(n)
    assert bytes(got) == data
    assert sum(served) > len(data) // 2 and len(asked) < len(reads) // 10


def test_held_reads_across_a_cut_stream_are_resumed_exactly(
        http_server: HTTPTestServer, monkeypatch: pytest.MonkeyPatch) -> None:
    served = count_held_reads(monkeypatch)
    key, url, data = _put(http_server, 1 * MiB)
    http_server.faults.key = key
    http_server.faults.drop_after, http_server.faults.drop_times = 300_000, 1
    with tensorstream.open(url, **FAST) as f:
        got = b"".join(f.read(1000) for _ in range(len(data) // 1000 + 1))
    assert got == data
    assert served and http_server.faults.dropped == 1
    gets = http_server.requests_for(key, "GET")
    assert gets[-1].headers["If-Match"] == http_server.etag(key)


@pytest.mark.parametrize("ignore_if_match", [False, True])
def test_held_reads_of_an_object_replaced_under_a_cut_stream_are_never_mixed(
        http_server: HTTPTestServer, monkeypatch: pytest.MonkeyPatch,
        ignore_if_match: bool) -> None:
    served = count_held_reads(monkeypatch)
    key, url, data = _put(http_server, 1 * MiB)
    http_server.faults.key = key
    http_server.faults.drop_after, http_server.faults.drop_times = 300_000, 1
    http_server.faults.replace_after_requests = 1  # the resumed request sees a new version
    http_server.faults.ignore_if_match = ignore_if_match
    got = bytearray()
    with tensorstream.open(url, **FAST) as f, pytest.raises(errors.ObjectChangedError):
        while True:
            piece = f.read(1000)
            assert piece == data[len(got) : len(got) + len(piece)]  # the old version only
            got += piece
            if not piece:
                break
    assert served and 0 < len(got) <= 300_000
