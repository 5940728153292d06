"""Reliability: short, wrong or changing data (issue 9, cases 5-12).

A read returns exactly the bytes asked for or raises: never short, never
zero-padded, never a mix of two versions.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from urllib.parse import quote

import pytest

import tensorstream
from fixtures_s3 import S3_BUCKET
from reliability_helpers import (
    FAST,
    ONE_PART,
    SMALL_PARTS,
    FlippingTCPProxy,
    RawHTTPServer,
    put_http,
    raw_object_responder,
    unique,
)
from tensorstream import errors
from tensorstream.testing.http_server import HTTPTestServer
from tensorstream.testing.proxy import HTTPFaultProxy, TCPFaultProxy
from tensorstream.testing.redis_server import RedisServer
from tensorstream.testing.s3_server import MotoS3Server

pytestmark = [pytest.mark.usefixtures("isolated_env", "http_reset"), pytest.mark.timeout(90)]

DATA = os.urandom(600_000)


# -- 5. cut at k -> resumed from k with Range and If-Match ----------------------------
async def test_http_body_cut_at_k_is_resumed_from_k_with_if_match(
        http_server: HTTPTestServer) -> None:
    key, url = put_http(http_server, DATA)
    k = 123_457
    http_server.faults.drop_after, http_server.faults.drop_times = k, 1
    got = await tensorstream.read_range(url, 1000, 500_000, **ONE_PART)
    assert got == DATA[1000:500_000]
    gets = [r for r in http_server.requests_for(key, "GET")]
    assert [g.headers["Range"] for g in gets] == [
        "bytes=1000-499999", f"bytes={1000 + k}-499999"]
    assert gets[1].headers["If-Match"] == http_server.etag(key)


def test_s3_body_cut_at_k_is_resumed_from_k_with_if_match(moto_s3_public: MotoS3Server) -> None:
    key = unique()
    moto_s3_public.put(S3_BUCKET, key, DATA)
    with HTTPFaultProxy(moto_s3_public.endpoint_url) as proxy:
        proxy.faults.drop_after, proxy.faults.drop_times = 100_000, 1
        opts = moto_s3_public.options(s3_endpoint=proxy.url)
        with tensorstream.open(f"s3://{S3_BUCKET}/{key}", **ONE_PART, **opts) as f:
            etag = f.etag
            assert f.read() == DATA
        gets = [r for r in proxy.requests if r.method == "GET"]
    assert len(gets) == 2 and proxy.faults.dropped == 1
    assert gets[1].headers["Range"] == f"bytes=100000-{len(DATA) - 1}"
    assert gets[1].headers["If-Match"] == etag


def test_redis_connection_cut_mid_read_gives_exact_bytes_or_error(
        redis_server: RedisServer) -> None:
    key = unique()
    with tensorstream.open(redis_server.url(key), "wb", redis_chunk_size=64 << 10) as w:
        w.write(DATA)
    with TCPFaultProxy(redis_server.host, redis_server.port) as proxy:
        proxy.faults.drop_after, proxy.faults.drop_times, proxy.faults.use_rst = 200_000, 1, True
        url = f"redis://127.0.0.1:{proxy.port}/{key}"
        with tensorstream.open(url, **ONE_PART) as f:
            assert f.read() == DATA
        assert proxy.faults.dropped == 1
        proxy.faults.drop_times = None  # cut every connection: an error, never short bytes
        with pytest.raises(errors.TensorstreamError):
            with tensorstream.open(url, retries=2, **ONE_PART) as f:
                f.read()


# -- 6. cut on every attempt -> error, never short ----------------------------------
async def test_http_body_cut_every_attempt_raises_never_short(http_server: HTTPTestServer) -> None:
    _, url = put_http(http_server, DATA)
    http_server.faults.drop_after = 50_000
    with pytest.raises(errors.RetriesExhaustedError) as info:
        await tensorstream.read_range(url, 0, len(DATA), retries=3, **ONE_PART)
    assert isinstance(info.value.last_error, errors.IncompleteReadError)


def test_sync_reader_never_returns_short_bytes(http_server: HTTPTestServer) -> None:
    _, url = put_http(http_server, DATA)
    with tensorstream.open(url, retries=2, **SMALL_PARTS) as f:
        http_server.faults.drop_after = 10_000
        buf = bytearray(len(DATA))
        with pytest.raises(errors.TensorstreamError):
            f.readinto(buf)
        assert f.tell() == 0  # a failed read does not advance
        http_server.faults.reset()
        assert f.read() == DATA  # and the file stays usable


def test_s3_body_cut_every_attempt_raises(moto_s3_public: MotoS3Server) -> None:
    key = unique()
    moto_s3_public.put(S3_BUCKET, key, DATA)
    with HTTPFaultProxy(moto_s3_public.endpoint_url) as proxy:
        opts = moto_s3_public.options(s3_endpoint=proxy.url)
        with tensorstream.open(f"s3://{S3_BUCKET}/{key}", retries=3, **ONE_PART, **opts) as f:
            proxy.faults.drop_after = 50_000
            with pytest.raises(errors.RetriesExhaustedError):
                f.read()


# -- 7. truncation without Content-Length --------------------------------------------
async def test_chunked_body_cut_is_detected(http_server: HTTPTestServer) -> None:
    _, url = put_http(http_server, DATA)
    http_server.faults.no_content_length = True
    http_server.faults.drop_after = 70_000
    with pytest.raises(errors.RetriesExhaustedError):
        await tensorstream.read_range(url, 0, len(DATA), retries=2, **ONE_PART)


async def test_eof_delimited_body_cut_is_detected() -> None:
    """``Connection: close`` with neither Content-Length nor chunking: a clean FIN
    after k bytes looks like the end of the body; only the range says it is not."""
    respond = raw_object_responder(DATA, cut_at=10_000)
    with RawHTTPServer(respond) as server:
        with pytest.raises(errors.RetriesExhaustedError) as info:
            await tensorstream.read_range(server.url("m"), 0, 100_000, retries=3, **ONE_PART)
        assert isinstance(info.value.last_error, errors.IncompleteReadError)
        ranges = [h["range"] for m, h in server.requests if m == "GET"]
    assert ranges == ["bytes=0-99999", "bytes=10000-99999", "bytes=20000-99999"]


async def test_eof_delimited_body_cut_once_is_resumed_exactly() -> None:
    respond = raw_object_responder(DATA, cut_at=33_333, cut_times=1)
    with RawHTTPServer(respond) as server:
        got = await tensorstream.read_range(server.url("m"), 7, 400_007, **ONE_PART)
        gets = [h for m, h in server.requests if m == "GET"]
    assert got == DATA[7:400_007]
    assert gets[1]["range"] == f"bytes={7 + 33_333}-400006" and gets[1]["if-match"] == '"v1"'


# -- 8. range ignored, or a Content-Range that differs -----------------------------
@pytest.mark.parametrize("fault", ["ignore_range", "wrong_content_range"])
async def test_http_range_not_honoured_is_an_error(http_server: HTTPTestServer,
                                                   fault: str) -> None:
    key, url = put_http(http_server, DATA)
    setattr(http_server.faults, fault, True)
    with pytest.raises(errors.ProtocolError):
        await tensorstream.read_range(url, 10, 1000, **FAST)
    assert len(http_server.requests_for(key, "GET")) == 1  # not retried: it would not help


@pytest.mark.parametrize("content_range", [
    lambda f, last, t: f"bytes {f + 1}-{last + 1}/{t}",   # shifted
    lambda f, last, t: f"bytes {f}-{last - 1}/{t}",       # shorter
    lambda f, last, t: "bytes */*",                       # meaningless
    lambda f, last, t: "",                                # missing on a 206
])
async def test_raw_content_range_mismatch_is_an_error(content_range: object) -> None:
    respond = raw_object_responder(DATA, content_range=content_range)  # type: ignore[arg-type]
    with RawHTTPServer(respond) as server:
        with pytest.raises(errors.ProtocolError):
            await tensorstream.read_range(server.url("m"), 100, 2000, **FAST)


def test_s3_range_ignored_by_a_middlebox_is_an_error(moto_s3_public: MotoS3Server) -> None:
    key = unique()
    moto_s3_public.put(S3_BUCKET, key, DATA)
    with HTTPFaultProxy(moto_s3_public.endpoint_url) as proxy:
        proxy.faults.ignore_range = True
        opts = moto_s3_public.options(s3_endpoint=proxy.url)
        with tensorstream.open(f"s3://{S3_BUCKET}/{key}", **SMALL_PARTS, **opts) as f:
            f.seek(1000)
            with pytest.raises(errors.TensorstreamError):
                f.read(200_000)


# -- 9. gzip on a ranged response -------------------------------------------------
async def test_gzip_ranged_response_is_refused(http_server: HTTPTestServer) -> None:
    _, url = put_http(http_server, DATA)
    http_server.faults.gzip = True
    with pytest.raises(errors.ProtocolError, match="gzip"):
        await tensorstream.read_range(url, 0, 5000, **FAST)
    assert all(r.headers.get("Accept-Encoding") == "identity" for r in http_server.requests)


# -- 10. overwritten between parts --------------------------------------------------
@pytest.mark.parametrize("ignore_if_match", [False, True])
def test_http_object_replaced_between_parts_is_never_mixed(
        http_server: HTTPTestServer, ignore_if_match: bool) -> None:
    _, url = put_http(http_server, DATA)
    with tensorstream.open(url, **SMALL_PARTS) as f:
        head = f.read(1000)
        http_server.faults.replace_after_requests = 0
        http_server.faults.ignore_if_match = ignore_if_match
        with pytest.raises(errors.ObjectChangedError):
            f.read()
    assert head == DATA[:1000]


def test_forked_parallel_readers_are_pinned_to_one_version(http_server: HTTPTestServer) -> None:
    key, url = put_http(http_server, DATA)
    with tensorstream.open(url, **SMALL_PARTS) as f:
        readers = [f.fork() for _ in range(3)]
        assert readers[0].read(10) == DATA[:10]
        http_server.put(key, os.urandom(len(DATA)))  # a new version, same size
        for r in readers:
            r.seek(len(DATA) // 2)
            with pytest.raises(errors.ObjectChangedError):
                r.read(100_000)
            r.close()


def test_s3_object_overwritten_between_parts_is_never_mixed(
        moto_s3_public: MotoS3Server) -> None:
    key = unique()
    moto_s3_public.put(S3_BUCKET, key, DATA)
    with HTTPFaultProxy(moto_s3_public.endpoint_url) as proxy:
        opts = moto_s3_public.options(s3_endpoint=proxy.url)
        with tensorstream.open(f"s3://{S3_BUCKET}/{key}", **SMALL_PARTS, **opts) as f:
            assert f.read(1000) == DATA[:1000]
            moto_s3_public.put(S3_BUCKET, key, os.urandom(len(DATA)))
            with pytest.raises(errors.ObjectChangedError):
                f.read()
        assert any("If-Match" in r.headers for r in proxy.requests if r.method == "GET")


def test_redis_object_overwritten_between_reads_is_never_mixed(redis_server: RedisServer) -> None:
    key = unique()
    url = redis_server.url(key)
    with tensorstream.open(url, "wb", redis_chunk_size=64 << 10) as w:
        w.write(DATA)
    with tensorstream.open(url, **SMALL_PARTS) as f:
        assert f.read(1000) == DATA[:1000]
        with tensorstream.open(url, "wb", redis_chunk_size=64 << 10) as w:
            w.write(os.urandom(len(DATA)))
        with pytest.raises(errors.ObjectChangedError):
            f.read()


# -- 11. local truncation, Redis chunk deleted, Redis glob characters --------------------
def test_local_file_truncated_mid_read_raises_never_zero_fills(tmp_path: Path) -> None:
    path = tmp_path / "m.bin"
    path.write_bytes(DATA)
    with tensorstream.open(path, **SMALL_PARTS) as f:
        assert f.read(1000) == DATA[:1000]
        with open(path, "r+b") as raw:
            raw.truncate(len(DATA) // 2)
        with pytest.raises(errors.ObjectChangedError):
            f.read()


def test_local_file_truncated_during_a_large_read(tmp_path: Path) -> None:
    """Truncated while parts are in flight: the read raises or (if it won the race)
    returns the original bytes; it never returns zeros where data was."""
    blob = os.urandom(16 << 20)
    for i in range(3):
        path = tmp_path / f"m{i}.bin"
        path.write_bytes(blob)
        with tensorstream.open(path, part_size=256 << 10, concurrency=4) as f:
            timer = threading.Timer(0.002 * (i + 1), os.truncate, (path, 1 << 20))
            timer.start()
            try:
                got = f.read()
            except errors.ObjectChangedError:
                got = None
            finally:
                timer.join()
        assert got is None or got == blob


def test_redis_chunk_deleted_mid_read_raises(redis_server: RedisServer) -> None:
    key = unique()
    url = redis_server.url(key)
    with tensorstream.open(url, "wb", redis_chunk_size=64 << 10) as w:
        w.write(DATA)
    with redis_server.client() as c:
        chunks = sorted(k for k in c.scan_iter(match=f"{key}:*"))
    assert len(chunks) > 4
    with tensorstream.open(url, **SMALL_PARTS) as f:
        assert f.read(1000) == DATA[:1000]
        with redis_server.client() as c:
            c.delete(chunks[len(chunks) // 2])
        with pytest.raises(errors.TensorstreamError) as info:
            f.read()
    assert isinstance(info.value, (errors.ObjectChangedError, errors.NotFoundError))


def test_redis_prefix_with_glob_characters_matches_only_itself(redis_server: RedisServer) -> None:
    base = unique("glob")
    names = ["a*b/x", "a?b/x", "a[b]/x", "aXb/x", "a\\b/x", "ab/x"]

    def url(name: str) -> str:  # '?' must be percent-encoded in a URI path
        return redis_server.url(quote(f"{base}/{name}", safe="/"))

    for name in names:
        with tensorstream.open(url(name), "wb") as w:
            w.write(name.encode())

    async def listing(prefix: str) -> list[str]:
        async with tensorstream.get_provider(redis_server.url(base)) as p:
            return [i.path async for i in p.list(f"{base}/{prefix}")]

    from tensorstream import _loop

    for name in names:
        prefix = name[:-1]  # "a*b/" etc.
        assert _loop.run_sync(listing(prefix)) == [f"{base}/{name}"], prefix
        with tensorstream.open(url(name)) as f:
            assert f.read() == name.encode()
    # A glob in a *tensorizer-layout* key (no manifest) must not pick up its neighbours.
    redis_server.put_tensorizer_layout(f"{base}/t?", b"Q" * 1000, piece=300)
    redis_server.put_tensorizer_layout(f"{base}/tX", b"Z" * 5000, piece=300)
    with tensorstream.open(url("t?")) as f:
        assert f.read() == b"Q" * 1000


# -- 12. a flipped byte: verify_hash and cp verification --------------------------------
def _flip_tensor_byte(path: Path, needle: bytes) -> None:
    raw = bytearray(path.read_bytes())
    at = raw.find(needle)
    assert at > 0
    raw[at + len(needle) // 2] ^= 0x01
    path.write_bytes(bytes(raw))


def test_flipped_tensor_byte_is_caught_by_verify_hash(tmp_path: Path,
                                                      http_server: HTTPTestServer) -> None:
    torch = pytest.importorskip("torch")
    from tensorstream.tensorizer import load as tensorizer_io

    weights = torch.arange(4096, dtype=torch.float32).reshape(64, 64) + 0.5
    path = tmp_path / "m.tensors"
    tensorizer_io.serialize({"w": weights, "b": torch.ones(8)}, str(path))
    with tensorizer_io.deserialize(str(path), device="cpu", verify_hash=True) as sd:
        assert torch.equal(sd["w"], weights)  # intact: passes
    _flip_tensor_byte(path, weights[32].numpy().tobytes())
    with pytest.raises(tensorizer_io.TensorHashMismatchError):
        with tensorizer_io.deserialize(str(path), device="cpu", verify_hash=True) as sd:
            sd["w"]
    key = unique()
    http_server.put(key, path.read_bytes())  # the same corrupt file over HTTP
    with pytest.raises(tensorizer_io.TensorHashMismatchError):
        with tensorizer_io.deserialize(http_server.url(key), device="cpu",
                                       verify_hash=True) as sd:
            sd["w"]


def test_cp_verification_catches_a_byte_flipped_on_the_way_to_redis(
        tmp_path: Path, redis_server: RedisServer) -> None:
    """A proxy flips one byte of the data going to Redis: cp's read-back check fails,
    the destination is removed and the exit status is non-zero."""
    from tensorstream.cli.main import main

    marker = b"FLIP-ME-IF-YOU-CAN-" * 4
    blob = os.urandom(300_000) + marker + os.urandom(300_000)
    src = tmp_path / "src.bin"
    src.write_bytes(blob)
    key = unique()
    proxy = FlippingTCPProxy(redis_server.host, redis_server.port, marker)
    with proxy:
        rc = main(["cp", "--quiet", str(src), f"redis://127.0.0.1:{proxy.port}/{key}"])
    assert proxy.flipped == 1, "the fault was not injected"
    assert rc != 0
    with redis_server.client() as c:
        assert not list(c.scan_iter(match=f"{key}*")), "a corrupt destination was left behind"
    # Without the fault the same copy succeeds and is byte-exact.
    assert main(["cp", "--quiet", str(src), redis_server.url(key)]) == 0
    with tensorstream.open(redis_server.url(key)) as f:
        assert f.read() == blob


@pytest.mark.parametrize("ignore_if_match", [False, True])
def test_read_ahead_never_mixes_versions(http_server: HTTPTestServer, ignore_if_match: bool) -> None:
    """With read-ahead in flight when the object is replaced, the rest is either
    the old version (already fetched, pinned) or an ObjectChangedError."""
    from reliability_helpers import SMALL_PARTS_READAHEAD

    for _ in range(5):
        _, url = put_http(http_server, DATA)
        with tensorstream.open(url, **SMALL_PARTS_READAHEAD) as f:
            head = f.read(1000)
            http_server.faults.replace_after_requests = 0
            http_server.faults.ignore_if_match = ignore_if_match
            try:
                rest = f.read()
            except errors.ObjectChangedError:
                pass
            else:
                assert head + rest == DATA
        http_server.faults.reset()
