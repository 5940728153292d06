"""S3 provider against moto's server: conformance, reads pinned to one version,
atomic multipart writes, list, delete."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

import tensorstream
from fixtures_s3 import S3_BUCKET
from tensorstream import errors
from tensorstream.testing.backends import S3Backend
from tensorstream.testing.conformance import ConformanceTarget, ProviderConformance
from tensorstream.testing.s3_server import MotoS3Server

MiB = 1 << 20


def _key(name: str) -> str:
    return f"test-s3/{name}-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def s3(moto_s3: MotoS3Server, isolated_env: Path) -> MotoS3Server:
    """The moto server, with the test's environment free of real credentials."""
    return moto_s3


class TestS3Conformance(ProviderConformance):
    """moto behind the plugin's fault proxy (cuts, stalls, trickles, replacements)."""

    @pytest.fixture
    def target(self, tensorstream_s3: S3Backend) -> ConformanceTarget:
        return ConformanceTarget.from_backend(tensorstream_s3)


# -- writes ---------------------------------------------------------------------
def test_small_write_is_one_put_large_write_is_multipart(s3: MotoS3Server) -> None:
    small, large = _key("small"), _key("large")
    with tensorstream.open(f"s3://{S3_BUCKET}/{small}", "wb", **s3.options()) as w:
        w.write(b"x" * 1000)
    payload = os.urandom(12 * MiB + 7)
    with tensorstream.open(f"s3://{S3_BUCKET}/{large}", "wb", **s3.options(part_size=5 * MiB)) as w:
        for i in range(0, len(payload), 3 * MiB):
            w.write(payload[i : i + 3 * MiB])
    assert s3.get(S3_BUCKET, small) == b"x" * 1000
    assert s3.get(S3_BUCKET, large) == payload
    # A multipart object's ETag ends in "-<number of parts>".
    assert "-" not in s3.client.head_object(Bucket=S3_BUCKET, Key=small)["ETag"]
    assert s3.client.head_object(Bucket=S3_BUCKET, Key=large)["ETag"].endswith('-3"')
    assert s3.open_multipart_uploads(S3_BUCKET, "test-s3/") == []


def test_big_object_written_with_open_reads_back_exactly(s3: MotoS3Server) -> None:
    """200 MiB through ``tensorstream.open(..., "wb")`` and back, byte-exact."""
    key = _key("200mib")
    uri = f"s3://{S3_BUCKET}/{key}"
    block = os.urandom(4 * MiB)
    blocks = 50
    with tensorstream.open(uri, "wb", **s3.options()) as w:
        for i in range(blocks):
            w.write(block[i:] + block[:i])  # every block different
    # Large parts: moto copies the whole object for every ranged GET.
    with tensorstream.open(uri, **s3.options(part_size=32 * MiB, concurrency=4)) as f:
        assert f.size == blocks * len(block)
        got = bytearray(f.size)
        assert f.readinto(got) == len(got)
    view = memoryview(got)
    for i in range(blocks):
        assert view[i * len(block) : (i + 1) * len(block)] == block[i:] + block[:i], f"block {i}"
    assert s3.open_multipart_uploads(S3_BUCKET, key) == []
    s3.client.delete_object(Bucket=S3_BUCKET, Key=key)


def test_exception_inside_with_leaves_no_object_and_no_upload(s3: MotoS3Server) -> None:
    key = _key("killed")
    with pytest.raises(RuntimeError, match="killed"):
        with tensorstream.open(f"s3://{S3_BUCKET}/{key}", "wb", **s3.options()) as w:
            for _ in range(3):
                w.write(os.urandom(8 * MiB))  # parts are uploading by now
            raise RuntimeError("killed mid-way")
    assert not s3.exists(S3_BUCKET, key)
    assert s3.open_multipart_uploads(S3_BUCKET, key) == []


async def test_cancelled_write_leaves_no_object_and_no_upload(s3: MotoS3Server) -> None:
    key = _key("cancelled")
    parts_started = asyncio.Event()

    async def upload() -> None:
        async with tensorstream.get_provider(f"s3://{S3_BUCKET}/{key}", **s3.options()) as p:
            async with p.open_writer(f"{S3_BUCKET}/{key}") as w:
                for i in range(100):
                    await w.write(os.urandom(5 * MiB))
                    if i == 2:
                        parts_started.set()

    task = asyncio.create_task(upload())
    await asyncio.wait_for(parts_started.wait(), 30)
    assert s3.open_multipart_uploads(S3_BUCKET, key) == [key]  # the upload really is open
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not s3.exists(S3_BUCKET, key)
    assert s3.open_multipart_uploads(S3_BUCKET, key) == []


def test_failed_part_aborts_the_upload(s3: MotoS3Server) -> None:
    """The upload is aborted behind the writer's back: the next part fails, the
    write raises, and nothing is published or left open."""
    bucket = f"doomed-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(bucket)
    with pytest.raises(errors.TensorstreamError):
        with tensorstream.open(f"s3://{bucket}/k", "wb", **s3.options()) as w:
            w.write(os.urandom(9 * MiB))
            for upload in s3.client.list_multipart_uploads(Bucket=bucket).get("Uploads", []):
                s3.client.abort_multipart_upload(Bucket=bucket, Key="k", UploadId=upload["UploadId"])
            w.write(os.urandom(9 * MiB))
    assert not s3.exists(bucket, "k")


# -- reads ----------------------------------------------------------------------
def test_object_replaced_between_parts_raises_object_changed(s3: MotoS3Server) -> None:
    key = _key("replaced")
    first, second = os.urandom(2 * MiB), os.urandom(2 * MiB)
    s3.put(S3_BUCKET, key, first)
    opts = s3.options(readahead=64 << 10, part_size=256 << 10, retries=2,
                      stream_reads=False)
    with tensorstream.open(f"s3://{S3_BUCKET}/{key}", **opts) as f:
        assert f.read(1000) == first[:1000]
        s3.put(S3_BUCKET, key, second)
        with pytest.raises(errors.ObjectChangedError):
            f.read()  # parallel ranged reads, each pinned with If-Match


async def test_readinto_rejects_wrong_etag(s3: MotoS3Server) -> None:
    key = _key("pinned")
    s3.put(S3_BUCKET, key, b"abc" * 1000)
    async with tensorstream.get_provider(f"s3://{S3_BUCKET}/{key}", **s3.options()) as p:
        info = await p.stat(f"{S3_BUCKET}/{key}")
        buf = bytearray(10)
        assert await p.readinto(f"{S3_BUCKET}/{key}", 3, memoryview(buf), etag=info.etag) == 10
        assert bytes(buf) == (b"abc" * 1000)[3:13]
        with pytest.raises(errors.ObjectChangedError):
            await p.readinto(f"{S3_BUCKET}/{key}", 0, memoryview(buf), etag='"0000"')


async def test_missing_bucket_and_bad_paths(s3: MotoS3Server) -> None:
    with pytest.raises(FileNotFoundError):
        await tensorstream.stat("s3://no-such-bucket-here/x", **s3.options())
    # A bare bucket says what to add (it said only "S3 paths are bucket/key, got '...'").
    for uri in (f"s3://{S3_BUCKET}", f"s3://{S3_BUCKET}/"):
        with pytest.raises(errors.InvalidURIError,
                           match=f"s3://{S3_BUCKET}/ is a bucket, not an object; add the "
                                 rf"object's key \(tensorstream ls s3://{S3_BUCKET}/ lists"):
            await tensorstream.stat(uri, **s3.options())
    # A listing or a write names the bucket that is missing (a HEAD's 404 cannot tell).
    async with tensorstream.get_provider("s3://no-such-bucket-here/", **s3.options()) as p:
        with pytest.raises(errors.NotFoundError, match="no such bucket 'no-such-bucket-here'"):
            [i async for i in p.list("no-such-bucket-here/x/")]
    with pytest.raises(errors.NotFoundError, match="no such bucket 'no-such-bucket-here'"):
        with tensorstream.open("s3://no-such-bucket-here/k", "wb", **s3.options()) as w:
            w.write(b"x")


async def test_a_prefix_given_for_an_object_says_to_name_the_file(s3: MotoS3Server) -> None:
    """``deserialize("s3://b/llama/")`` (a folder, not the file) said only "no such object
    (404)"; a key ending in '/' that is no object says it is a prefix."""
    prefix = _key("folder")
    s3.put(S3_BUCKET, f"{prefix}/model.tensors", b"x")
    with pytest.raises(errors.NotFoundError,
                       match=rf"no such object \(404\); a key ending in '/' names a prefix, "
                             rf"not an object: add the file's name \(tensorstream ls "
                             rf"s3://{S3_BUCKET}/{prefix}/ lists them\)"):
        await tensorstream.stat(f"s3://{S3_BUCKET}/{prefix}/", **s3.options())
    # Neighbours: a missing key without the '/' says nothing of prefixes; a folder
    # marker object ("dir/", as the S3 console makes) is an object like any other.
    with pytest.raises(errors.NotFoundError) as info:
        await tensorstream.stat(f"s3://{S3_BUCKET}/{prefix}/nope", **s3.options())
    assert "prefix" not in str(info.value)
    s3.put(S3_BUCKET, f"{prefix}/marker/", b"")
    info_ = await tensorstream.stat(f"s3://{S3_BUCKET}/{prefix}/marker/", **s3.options())
    assert info_.size == 0


async def test_a_missing_object_says_where_to_look(s3: MotoS3Server) -> None:
    """A typo in the key or the bucket of a read (``cat``, ``deserialize``) said only "no
    such object (404)": a HEAD's 404 does not say which is missing. It names the listing
    that tells (which says "no such bucket" for a bucket typo)."""
    prefix = _key("typo")
    s3.put(S3_BUCKET, f"{prefix}/model.bin", b"x")
    hint = ("no such object (404); 'tensorstream ls {}' lists what is there (a 404 does "
            "not say whether the key or the bucket is missing)")
    for uri, listing in ((f"s3://{S3_BUCKET}/{prefix}/model.bni", f"s3://{S3_BUCKET}/{prefix}/"),
                         (f"s3://{S3_BUCKET}x/{prefix}/model.bin", f"s3://{S3_BUCKET}x/{prefix}/"),
                         (f"s3://{S3_BUCKET}/nope-{prefix[-10:]}", f"s3://{S3_BUCKET}/")):
        with pytest.raises(errors.NotFoundError) as info:
            await tensorstream.stat(uri, **s3.options())
        assert str(info.value).endswith(hint.format(listing)), str(info.value)
    with pytest.raises(errors.NotFoundError, match=f"no such bucket '{S3_BUCKET}x'"):
        async with tensorstream.get_provider(f"s3://{S3_BUCKET}x/", **s3.options()) as p:
            [i async for i in p.list(f"{S3_BUCKET}x/{prefix}/")]


async def test_an_endpoint_nobody_listens_on_is_named(s3: MotoS3Server) -> None:
    """A port typo in the endpoint: the error says where it tried to connect (it said
    "s3 stat b/k: ... connection failed (ConnectionRefusedError: ...)", no address)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    options = s3.options(s3_endpoint=f"http://127.0.0.1:{port}", retries=2,
                         backoff_initial=0.01)
    with pytest.raises(errors.RetriesExhaustedError,
                       match=f"cannot connect to 127.0.0.1:{port} \\(ConnectionRefusedError"):
        await tensorstream.stat(f"s3://{S3_BUCKET}/x", **options)
    async with tensorstream.get_provider(f"s3://{S3_BUCKET}/", **options) as p:
        with pytest.raises(errors.RetriesExhaustedError, match=f"127.0.0.1:{port}"):
            [i async for i in p.list(f"{S3_BUCKET}/x/")]


async def test_unknown_checksum_mode_is_rejected(s3: MotoS3Server) -> None:
    with pytest.raises(errors.ConfigurationError, match="s3_checksum"):
        await tensorstream.stat(f"s3://{S3_BUCKET}/x", **s3.options(s3_checksum="sometimes"))


def test_when_required_checksum_mode_writes_and_reads(s3: MotoS3Server) -> None:
    """The mode for S3-compatible servers that reject the new default checksums."""
    key = _key("nochecksum")
    payload = os.urandom(11 * MiB)
    opts = s3.options(s3_checksum="when_required", part_size=5 * MiB)
    with tensorstream.open(f"s3://{S3_BUCKET}/{key}", "wb", **opts) as w:
        w.write(payload)
    with tensorstream.open(f"s3://{S3_BUCKET}/{key}", **opts) as f:
        assert f.read() == payload
    assert "ChecksumAlgorithm" not in str(s3.client.head_object(Bucket=S3_BUCKET, Key=key))


# -- list / delete ----------------------------------------------------------------
async def test_list_is_paginated_and_sorted(s3: MotoS3Server) -> None:
    base = _key("many")
    names = [f"{base}/{i:05d}" for i in range(1005)]  # more than one 1000-key page
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: s3.client.put_object(Bucket=S3_BUCKET, Key=k, Body=b"z"), names))
    async with tensorstream.get_provider(f"s3://{S3_BUCKET}/{base}", **s3.options()) as p:
        found = [info async for info in p.list(f"{S3_BUCKET}/{base}/")]
    assert [i.path for i in found] == [f"{S3_BUCKET}/{n}" for n in names]
    assert all(i.size == 1 and i.etag for i in found)


async def test_delete_missing_object_raises(s3: MotoS3Server) -> None:
    async with tensorstream.get_provider(f"s3://{S3_BUCKET}/x", **s3.options()) as p:
        with pytest.raises(FileNotFoundError):
            await p.delete(f"{S3_BUCKET}/{_key('never-there')}")


def test_provider_repr_and_pickle_hide_secrets(s3: MotoS3Server) -> None:
    import pickle

    provider: Any = tensorstream.get_provider(f"s3://{S3_BUCKET}/x", **s3.options())
    text = repr(provider) + repr(provider.inner) + repr(provider.inner.credentials)
    assert s3.secret_access_key not in text and s3.access_key_id not in text
    assert "option s3_access_key_id/s3_secret_access_key" in text
    with pytest.raises(TypeError):
        pickle.dumps(provider.inner)


@pytest.mark.parametrize("sequential", [False, True])
def test_a_version_id_in_the_uri_that_is_no_key_says_versions_are_not_read(
        moto_s3: MotoS3Server, isolated_env: Path, sequential: bool) -> None:
    """s3fs reads s3://b/k?versionId=v as a version of k; here it is the key
    'k?versionId=v' (aws-cli's rule), and that key being absent says why."""
    moto_s3.put(S3_BUCKET, "versioned.bin", b"now")
    with pytest.raises(errors.NotFoundError, match=r"'\?versionId=' included .*version.* not "
                                            r"supported"):
        tensorstream.open(f"s3://{S3_BUCKET}/versioned.bin?versionId=3HL4kqtJlcpXroDTDmJ",
                          sequential=sequential, **moto_s3.options()).read()
