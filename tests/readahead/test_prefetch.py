"""The read-ahead engine against a real HTTP server on loopback: late binding
at read boundaries (bytes land in the caller's buffer without a copy), and the
link probe (a fast link stays narrow, a paced one goes wide)."""

from __future__ import annotations

import itertools
import os

import tensorstream
from tensorstream.testing.http_server import HTTPTestServer

MiB = 1 << 20


def _put(server: HTTPTestServer, size: int) -> tuple[str, bytes]:
    key = f"prefetch-{os.urandom(4).hex()}"
    data = os.urandom(size)
    server.put(key, data)
    return server.url(key), data


def test_reads_at_boundaries_land_straight_in_the_callers_buffer(
        http_server: HTTPTestServer) -> None:
    url, data = _put(http_server, 12 * MiB + 300)
    # A tensorizer-like layout: a 100-byte header, 6 MiB of data, a header, the rest.
    bounds = [0, 100, 100 + 6 * MiB, 200 + 6 * MiB, len(data)]
    with tensorstream.open(url, part_size=1 * MiB, stream_reads=False) as f:
        f.set_read_boundaries(bounds)
        out = []
        for lo, hi in itertools.pairwise(bounds):
            buf = bytearray(hi - lo)
            assert f.readinto(buf) == len(buf)
            out.append(bytes(buf))
        stats = f.read_stats()
    assert b"".join(out) == data
    assert stats["phase"] == "settled" and stats["readahead"] == 0  # loopback is fast
    # Everything but the small headers was received straight into the buffers.
    assert stats["direct_bytes"] >= len(data) - 300
    assert stats["copied_bytes"] <= 300


def test_without_boundaries_unaligned_reads_are_still_exact(http_server: HTTPTestServer) -> None:
    url, data = _put(http_server, 5 * MiB + 7)
    with tensorstream.open(url, part_size=1 * MiB) as f:
        got = [f.read(n) for n in (3, MiB + 11, 2 * MiB, 10 * MiB)]
    assert b"".join(got) == data


def test_a_paced_link_goes_wide_and_reads_ahead(http_server: HTTPTestServer) -> None:
    url, data = _put(http_server, 6 * MiB)
    key = url.rsplit("/", 1)[1]
    http_server.faults.key = key
    http_server.faults.rate_limit = 4 * MiB  # per response: a slow, far-away store
    try:
        with tensorstream.open(url, part_size=128 << 10, concurrency=16) as f:
            got = bytearray()
            while chunk := f.read(256 << 10):
                got += chunk
            stats = f.read_stats()
    finally:
        http_server.faults.reset()
    assert bytes(got) == data
    assert stats["active"] > 4, stats
    assert stats["readahead"] > 0, stats
    assert stats["copied_bytes"] > 0


def test_one_tensorizer_reader_also_cuts_requests_at_tensors(
        http_server: HTTPTestServer, tmp_path: object) -> None:
    """With ``num_readers=1`` tensorizer never asks to reopen the stream; the
    tensor boundaries still reach the read-ahead, so tensor data is received
    straight into the tensors (only headers and tails are copied)."""
    import torch

    from tensor_files import random_state, tensorizer_bytes
    from tensorstream.tensorizer.hook import StreamTensorDeserializer

    sd = random_state(4, 4, (1024, 512))
    data = tensorizer_bytes(sd, tmp_path)
    key = f"prefetch-{os.urandom(4).hex()}"
    http_server.put(key, data)
    with tensorstream.open(http_server.url(key), part_size=1 * MiB, stream_reads=False) as f:
        d = StreamTensorDeserializer(f, device="cpu", num_readers=1)
        for name, tensor in sd.items():
            assert torch.equal(d[name], tensor)
        d.close()
        stats = f.read_stats()
    assert stats["direct_bytes"] > 0.9 * len(data), stats
