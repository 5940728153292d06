"""Reliability: a damaged tensorizer file never loads as if it were whole (issue 15, class 1).

Every backend (the local fast path, local through the provider, HTTP, S3, Redis) and every
mode (eager and ``lazy_load``, one reader and two) checks the file's tensor index against
the object's size before any tensor is handed out, and reads every tensor completely or
raises. Damaged files raise one error, :class:`tensorstream.errors.MalformedFileError` (a
``ValueError``), naming the redacted URI and the sizes: never ``struct.error``,
``TypeError``, ``MemoryError``, and never a tensor whose tail is zeros."""

from __future__ import annotations

import itertools
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
pytest.importorskip("tensorizer")

import tensorizer.serialization as _tz  # noqa: E402

import tensorstream  # noqa: E402
from fixtures_s3 import S3_BUCKET  # noqa: E402
from reliability_helpers import CANARY_QUERY, FAST, unique  # noqa: E402
from tensor_files import random_state, tensorizer_bytes  # noqa: E402
from tensorstream import errors  # noqa: E402
from tensorstream.testing.http_server import HTTPTestServer  # noqa: E402
from tensorstream.testing.redis_server import RedisServer  # noqa: E402
from tensorstream.testing.s3_server import MotoS3Server  # noqa: E402

pytestmark = [pytest.mark.usefixtures("isolated_env", "http_reset"), pytest.mark.timeout(240)]

STATE = random_state(15, 4, (64, 32))
MODES = [{"num_readers": 1}, {"num_readers": 2}, {"lazy_load": True, "num_readers": 1},
         {"lazy_load": True, "num_readers": 2}]


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return tensorizer_bytes(STATE, tmp_path_factory.mktemp("whole"))


def _index_end(data: bytes) -> int:
    """The byte just past the last tensor's data, from a whole file's own index."""
    import io as _io

    from tensorizer import TensorDeserializer

    with TensorDeserializer(_io.BytesIO(data), device="cpu", lazy_load=True) as d:
        return max(e.data_offset + e.data_length for e in d._metadata.values())


def _load(uri: str, mode: dict[str, Any], **options: Any) -> dict[str, Any]:
    with tensorstream.deserialize(uri, device="cpu", **mode, **options) as sd:
        return {k: v.clone() for k, v in sd.items()}


Store = Callable[[bytes], tuple[str, dict[str, Any]]]


@pytest.fixture(params=["local-fast", "local-provider", "http", "s3", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """Put bytes somewhere; returns (URI, options) to load them from."""
    kind = request.param

    def put(data: bytes) -> tuple[str, dict[str, Any]]:
        name = unique("m") + ".tensors"
        if kind in ("local-fast", "local-provider"):
            path = tmp_path / name
            path.write_bytes(data)
            # any option leaves the plain-file fast path for the provider's reader
            return str(path), ({} if kind == "local-fast" else {"readahead": 1 << 20})
        if kind == "http":
            server: HTTPTestServer = request.getfixturevalue("http_server")
            server.put(name, data)
            return server.url(name) + f"?token={CANARY_QUERY}", dict(FAST)
        if kind == "s3":
            s3: MotoS3Server = request.getfixturevalue("moto_s3_public")
            s3.put(S3_BUCKET, name, data)
            return f"s3://{S3_BUCKET}/{name}", {**s3.options(), **FAST}
        redis: RedisServer = request.getfixturevalue("redis_server")
        redis.put(name, data)
        return redis.url(name), {}

    return put


def _assert_malformed(exc: BaseException, actual: int, expected: int | None = None) -> None:
    assert isinstance(exc, errors.MalformedFileError), repr(exc)
    assert isinstance(exc, ValueError)
    assert exc.actual_size == actual
    if expected is not None:
        assert exc.expected_size == expected
        assert str(expected) in str(exc)
    assert str(actual) in str(exc)
    assert CANARY_QUERY not in str(exc) and CANARY_QUERY not in repr(exc)


@pytest.mark.parametrize("mode", MODES, ids=["eager-1", "eager-2", "lazy-1", "lazy-2"])
def test_a_truncated_file_is_refused_before_any_tensor_is_handed_out(
        store: Store, whole: bytes, mode: dict[str, Any]) -> None:
    need = _index_end(whole)
    for cut, known in ((40, True), (len(whole) - need + 1, True), (len(whole) // 2, False)):
        data = whole[:-cut]
        uri, opts = store(data)
        with pytest.raises(errors.MalformedFileError) as info:
            tensorstream.deserialize(uri, device="cpu", **mode, **opts)  # lazy: at once too
        # (cut in half, the file ends inside its own index: what it needs is unknown)
        _assert_malformed(info.value, len(data), need if known else None)
        assert "tensorizer" in str(info.value)
        assert "m-" in str(info.value)  # the object is named


def test_the_whole_file_still_loads_exactly(store: Store, whole: bytes) -> None:
    uri, opts = store(whole)
    for mode in MODES:
        got = _load(uri, mode, **opts)
        assert set(got) == set(STATE)
        assert all(torch.equal(got[k], STATE[k]) for k in STATE)


def _damaged_headers(whole: bytes) -> dict[str, bytes]:
    """Files whose headers lie: each field tensorizer trusts, set to nonsense."""
    import io as _io

    from tensorizer import TensorDeserializer

    with TensorDeserializer(_io.BytesIO(whole), device="cpu", lazy_load=True) as d:
        entries = sorted(d._metadata.values(), key=lambda e: e.offset)
        meta_len_at = d._tensors_begin - len(d._metadata_raw)
    first = entries[0]
    out: dict[str, bytes] = {}

    def patch(at: int, value: bytes) -> bytes:
        return whole[:at] + value + whole[at + len(value):]

    out["empty"] = b""
    out["magic only"] = whole[:5]
    out["not tensorizer"] = b"PK\x03\x04" + whole[4:]
    out["index length 2**62"] = patch(meta_len_at, struct.pack("<Q", 1 << 62))
    out["index length past the end"] = patch(meta_len_at, struct.pack("<Q", len(whole)))
    out["tensor header length 2**40"] = patch(first.offset, struct.pack("<Q", 1 << 40))
    out["tensor header length 1"] = patch(first.offset, struct.pack("<Q", 1))
    out["cut inside the index"] = whole[:meta_len_at + 20]
    out["cut inside a tensor header"] = whole[:first.offset + 12]
    # The file header's tensor count (its last field), lowered and raised: a load must not
    # silently drop the index's later tensors, or invent ones from its zero padding.
    count_at = (len(_tz.TENSORIZER_MAGIC) + _tz._FileHeader.version_number_format.size
                + _tz._FileHeader.format.size - 8)
    (count,) = struct.unpack_from("<Q", whole, count_at)
    out["tensor count one"] = patch(count_at, struct.pack("<Q", 1))
    out["tensor count one less"] = patch(count_at, struct.pack("<Q", count - 1))
    out["tensor count one more"] = patch(count_at, struct.pack("<Q", count + 1))
    out["tensor count 2**40"] = patch(count_at, struct.pack("<Q", 1 << 40))
    # A tensor's own header disagreeing with the index: tensorizer builds the tensor from
    # its header (name, dtype, shape) with as many bytes as the index says (verify_hash's
    # hashes cover the header too, but a load without it took the header on trust).
    second = entries[1]

    def in_header(entry: Any, old: bytes, new: bytes) -> bytes:
        at = whole.index(old, entry.offset, entry.data_offset)
        return patch(at, new)

    out["tensor header shape"] = in_header(first, struct.pack("<II", 64, 32),
                                           struct.pack("<II", 64, 16))
    out["tensor header name"] = in_header(second, b"w1", b"w0")
    out["tensor header dtype"] = in_header(first, b"<f4", b"<i4")
    # ... and both agreeing on a shape that is not the data's size (the first tensor's
    # entry comes first in the index): the first 64 x 16 of 64 x 32 floats were returned.
    for label, dims in (("smaller", (64, 16)), ("larger", (64, 64))):
        shape, new = struct.pack("<II", 64, 32), struct.pack("<II", *dims)
        both = bytearray(in_header(first, shape, new))
        at = both.index(shape, meta_len_at)
        both[at:at + len(new)] = new
        out[f"index and header shape {label}"] = bytes(both)
    return out


@pytest.mark.parametrize("damage", ["empty", "magic only", "not tensorizer", "index length 2**62",
                                    "index length past the end", "tensor header length 2**40",
                                    "tensor header length 1", "cut inside the index",
                                    "cut inside a tensor header", "tensor count one",
                                    "tensor count one less", "tensor count one more",
                                    "tensor count 2**40", "tensor header shape",
                                    "tensor header name", "tensor header dtype",
                                    "index and header shape smaller",
                                    "index and header shape larger"])
def test_damaged_headers_raise_one_error_naming_the_file(
        store: Store, whole: bytes, damage: str) -> None:
    data = _damaged_headers(whole)[damage]
    uri, opts = store(data)
    for mode in (MODES[0], MODES[3]):
        with pytest.raises(errors.TensorstreamError) as info:
            _load(uri, mode, **opts)
        _assert_malformed(info.value, len(data))


def test_a_local_file_truncated_while_loading_raises_never_zeros(tmp_path: Path,
                                                                 whole: bytes) -> None:
    for opts in ({}, {"readahead": 0}):
        path = tmp_path / unique("m")
        path.write_bytes(whole)
        with tensorstream.deserialize(str(path), device="cpu", lazy_load=True, num_readers=1,
                                      **opts) as sd:
            first = next(iter(STATE))
            assert torch.equal(sd[first], STATE[first])
            os.truncate(path, len(whole) - 40)  # in place: same inode
            with pytest.raises((errors.MalformedFileError, errors.ObjectChangedError)):
                for k in STATE:
                    sd[k].clone()


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(cut=st.integers(0, 1200) | st.integers(1 << 10, 40 << 10),
       flips=st.lists(st.tuples(st.integers(0, 1199), st.integers(0, 255)), max_size=3),
       mode=st.sampled_from(MODES))
def test_any_damage_gives_the_exact_tensors_or_a_tensorstream_error(
        tmp_path: Path, whole: bytes, cut: int, flips: list[tuple[int, int]],
        mode: dict[str, Any]) -> None:
    data = bytearray(whole[:len(whole) - cut] if cut else whole)
    for at, value in flips:
        if at < len(data):
            data[at] = value
    path = tmp_path / "fuzzed.tensors"
    path.write_bytes(bytes(data))
    try:
        got = _load(str(path), mode, verify_hash=True)
    except errors.TensorstreamError:
        return
    assert set(got) == set(STATE)
    assert all(torch.equal(got[k], STATE[k]) for k in STATE)


def test_every_byte_of_an_encrypted_tensor_header_damaged(tmp_path: Path) -> None:
    """Each byte of an encrypted file's first tensor header set to 0xEE, and with its low
    bit flipped: the exact tensors or one tensorstream error (an unknown crypt-info chunk
    type was a bare KeyError; a nonce count flipped to 0 was tensorizer's UnboundLocalError
    "crypto", raised by its _stream_decrypt's finally over the ValueError saying why)."""
    from tensorizer import DecryptionParams, TensorDeserializer

    key = bytes(range(32))
    path = tmp_path / "enc.tensors"
    tensorstream.serialize(STATE, str(path), encryption=key)
    whole = path.read_bytes()
    with TensorDeserializer(str(path), device="cpu", lazy_load=True,
                            encryption=DecryptionParams.from_key(key)) as d:
        first = min(d._metadata.values(), key=lambda e: e.offset)
    kinds = set()
    for at, flip in itertools.product(range(first.offset, first.data_offset), (False, True)):
        data = bytearray(whole)
        data[at] = data[at] ^ 0x01 if flip else 0xEE if data[at] != 0xEE else 0x11
        path.write_bytes(bytes(data))
        try:
            got = _load(str(path), MODES[0], encryption=key)
        except errors.TensorstreamError as exc:
            assert "enc.tensors" in str(exc), exc
            kinds.add(type(exc).__name__)
            continue
        assert all(torch.equal(got[k], STATE[k]) for k in STATE), at
    assert "MalformedFileError" in kinds
