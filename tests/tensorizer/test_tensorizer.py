"""tensorizer integration: load from every backend, serialize, encryption, hashes, shards.

Backends come from the ``backend`` fixture (one ``TensorBackend`` per
storage service); adding one is a new branch in ``_make_backend``.
"""

from __future__ import annotations

import dataclasses
import io
import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from tensorizer import DecryptionParams, EncryptionParams, TensorDeserializer, TensorSerializer

import tensorstream
from fixtures_s3 import S3_BUCKET
from tensorstream import errors
from tensorstream.tensorizer.hook import forks
from tensorstream.tensorizer.load import (
    DecryptionError,
    Encryption,
    InvalidArgumentError,
    MetaTensorError,
    ModuleMismatchError,
    QuantizationWarning,
    TensorHashMismatchError,
    deserialize,
    generate_keyfile,
    is_vllm_tensorized,
    load_into_module,
    serialize,
)
from tensorstream.tensorizer.local import LocalTensorDeserializer
from tensorstream.tensorizer.remote import RemoteTensorDeserializer

# Cheap Argon2id settings: the tests check wiring, not key-stretching strength.
FAST_KDF = {"opslimit": EncryptionParams.OpsLimit.MIN, "memlimit": EncryptionParams.MemLimit.MIN}


class TinyNet(torch.nn.Module):
    """A small real model: ~1.3 MB of weights in tensors of very different sizes."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(512, 256)
        self.proj = torch.nn.Linear(256, 512)
        self.norm = torch.nn.LayerNorm(512)
        self.head = torch.nn.Linear(512, 32)
        self.register_buffer("scale", torch.tensor([0.5, 2.0]))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.norm(torch.relu(self.proj(self.embed(ids))))
        return self.head(x) * self.scale[0] + self.scale[1]


def make_model(seed: int = 0) -> TinyNet:
    torch.manual_seed(seed)
    return TinyNet().eval()


def state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same(loaded: Any, expected: dict[str, torch.Tensor]) -> None:
    # tensorizer's write_module names a top-level module's own tensors ".name"
    names = {k.lstrip("."): k for k in loaded}
    assert sorted(names) == sorted(expected)
    for name, tensor in expected.items():
        got = loaded[names[name]]
        assert got.dtype == tensor.dtype and got.shape == tensor.shape, name
        assert torch.equal(got.cpu(), tensor), name


# -- backends -------------------------------------------------------------------


@dataclasses.dataclass
class TensorBackend:
    """Where test files are put: ``put(key, bytes)`` then read ``uri(key)``."""

    name: str
    uri: Callable[[str], str]
    put: Callable[[str, bytes], None]
    options: dict[str, Any]
    writable: bool


def _make_backend(name: str, request: pytest.FixtureRequest, tmp_path: Path) -> TensorBackend:
    if name == "local":
        root = tmp_path / "store"
        root.mkdir()
        return TensorBackend(
            "local", lambda k: str(root / k), lambda k, d: (root / k).write_bytes(d), {}, True
        )
    if name == "http":
        server = request.getfixturevalue("http_server")
        prefix = f"t{abs(hash(request.node.nodeid)) % 10**8}/"
        return TensorBackend(
            "http",
            lambda k: server.url(prefix + k),
            lambda k, d: server.put(prefix + k, d),
            dict(server.options),
            False,
        )
    if name == "s3":
        s3 = request.getfixturevalue("moto_s3")
        request.getfixturevalue("isolated_env")
        prefix = f"tensorizer/t{abs(hash(request.node.nodeid)) % 10**8}/"
        return TensorBackend(
            "s3",
            lambda k: f"s3://{S3_BUCKET}/{prefix}{k}",
            lambda k, d: s3.put(S3_BUCKET, prefix + k, d),
            s3.options(),
            True,
        )
    if name == "redis":
        server = request.getfixturevalue("redis_server")
        prefix = f"tensorizer-t{abs(hash(request.node.nodeid)) % 10**8}/"
        return TensorBackend(
            "redis",
            lambda k: server.url(prefix + k),
            lambda k, d: server.put(prefix + k, d),
            {},
            True,
        )
    raise AssertionError(name)


@pytest.fixture(params=["local", "http", "s3", "redis"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> TensorBackend:
    return _make_backend(request.param, request, tmp_path)


def _tensorizer_bytes(obj: Any, path: Path, encryption: Any = None) -> bytes:
    s = TensorSerializer(str(path), encryption=encryption)
    if isinstance(obj, torch.nn.Module):
        s.write_module(obj)
    else:
        s.write_state_dict(obj)
    s.close()
    return path.read_bytes()


def _tensorstream_bytes(obj: Any, path: Path, encryption: Any = None) -> bytes:
    serialize(obj, path, encryption=encryption)
    return path.read_bytes()


PRODUCERS = {"tensorstream": _tensorstream_bytes, "tensorizer": _tensorizer_bytes}


@pytest.fixture(params=sorted(PRODUCERS))
def producer(request: pytest.FixtureRequest) -> Callable[..., bytes]:
    return PRODUCERS[request.param]


# -- plain loads -------------------------------------------------------------------


def test_roundtrip_every_tensor_equal(backend: TensorBackend, producer: Any, tmp_path: Path) -> None:
    model = make_model()
    backend.put("m.tensors", producer(model, tmp_path / "src.tensors"))
    with deserialize(backend.uri("m.tensors"), "cpu", **backend.options) as sd:
        assert isinstance(sd, TensorDeserializer)
        assert_same(sd, state(model))
        # An eager load releases the stream (and its connections) once all is read.
        # Local paths are read through a plain OS file (tensorizer's fastest source).
        local = backend.uri("m.tensors").startswith(("/", "file:"))
        expected = io.BufferedReader if local and not backend.options else tensorstream.StreamReader
        # (tensorizer reads it through the CheckedSource that checks every read)
        assert isinstance(sd._file.inner, expected) and sd._file.inner.closed
    with deserialize(backend.uri("m.tensors"), "cpu", lazy_load=True, **backend.options) as sd:
        stream = sd._file.inner
        assert not stream.closed
    assert stream.closed, "closing the deserializer closes the stream"


def test_nested_state_dict_roundtrip(tmp_path: Path) -> None:
    nested = {"a": {"w": torch.arange(10.0), "b": [torch.ones(3), torch.zeros(2)]}}
    serialize(nested, tmp_path / "n.tensors")
    with deserialize(tmp_path / "n.tensors", "cpu") as sd:
        assert torch.equal(sd["a"]["w"], nested["a"]["w"])
        assert torch.equal(sd["a"]["b"][0], torch.ones(3))


def test_filter_func_lazy_load_and_dtype(backend: TensorBackend, producer: Any,
                                         tmp_path: Path) -> None:
    model = make_model()
    expected = state(model)
    backend.put("m.tensors", producer(model, tmp_path / "src.tensors"))
    uri = backend.uri("m.tensors")

    with deserialize(uri, "cpu", filter_func=lambda n: n.endswith("weight"),
                     **backend.options) as sd:
        assert_same(sd, {k: v for k, v in expected.items() if k.endswith("weight")})

    with deserialize(uri, "cpu", lazy_load=True, **backend.options) as sd:
        assert not sd._file.closed
        # Fetched on access, in file order: tensorizer 2.12 cannot lazily go back
        # to a tensor before one already read (with any source).
        for name in list(sd):
            assert torch.equal(sd[name], expected[name.lstrip(".")]), name

    with deserialize(uri, "cpu", dtype=torch.float16, **backend.options) as sd:
        for k in sd:
            assert sd[k].dtype == torch.float16
            assert torch.equal(sd[k], expected[k.lstrip(".")].to(torch.float16)), k


def test_num_readers_really_run_in_parallel(
    backend: TensorBackend, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    model = make_model()
    backend.put("m.tensors", _tensorstream_bytes(model, tmp_path / "src.tensors"))
    import threading

    lock = threading.Lock()
    open_forks = [0]
    peak = [0]
    threads: set[str] = set()
    original_fork = tensorstream.StreamReader.fork

    def counting_fork(self: tensorstream.StreamReader, **kwargs: Any) -> tensorstream.StreamReader:
        fork = original_fork(self, **kwargs)
        with lock:
            threads.add(threading.current_thread().name)
            open_forks[0] += 1
            peak[0] = max(peak[0], open_forks[0])

        def closed() -> None:
            with lock:
                open_forks[0] -= 1

        fork._on_close = closed
        return fork

    monkeypatch.setattr(tensorstream.StreamReader, "fork", counting_fork)
    fetchers: set[str] = set()
    real_readinto = tensorstream.StreamReader.readinto

    def readinto(self: tensorstream.StreamReader, b: Any) -> int:
        name = threading.current_thread().name
        if name.startswith("tensorstream-fetch-share-"):
            with lock:
                fetchers.add(name)
        return real_readinto(self, b)

    monkeypatch.setattr(tensorstream.StreamReader, "readinto", readinto)
    with deserialize(backend.uri("m.tensors"), "cpu", num_readers=4, **backend.options) as sd:
        assert_same(sd, state(model))
        if backend.name == "local" and not backend.options:
            # A plain OS file onto the CPU: threads fill the tensors on tensorizer's own
            # descriptor (tests/tensorizer/test_tensorizer_local.py); tensorizer runs one reader.
            assert isinstance(sd, LocalTensorDeserializer) and sd._num_readers == 1
            assert isinstance(sd._file.inner, io.BufferedReader) and not threads
            return
        if isinstance(sd, RemoteTensorDeserializer):
            # A whole remote load onto the CPU: four fetcher threads read the file (the
            # opened stream and three forks), tensorizer's one reader thread parses.
            assert sd._num_readers == 1 and sd._ts_fetchers == 4
            # (one share per fetcher, at most one per block of the file: this model has few)
            assert 2 <= len(fetchers) == len(forks(sd)) + 1 <= 4, fetchers
            assert peak[0] >= 2, "forked readers were open at the same time"
            assert open_forks[0] == 0, "every fork was closed"
            return
        assert sd._num_readers == 4
        assert sd._reopen is not None, "tensorizer can reopen the source: no silent 1 reader"
    assert len(threads) == 3, "readers 1..3 reopen through StreamReader.fork, each in its thread"
    if backend.name != "local":
        # Local reads are so fast that forks may finish before the next opens.
        assert peak[0] >= 2, "forked readers were open at the same time"
    assert open_forks[0] == 0, "every fork was closed"


# -- encryption ------------------------------------------------------------------------


def test_keyfile_encryption(backend: TensorBackend, producer: Any, tmp_path: Path) -> None:
    model = make_model()
    if producer is _tensorstream_bytes:
        keyfile = tmp_path / "new.key"
        data = producer(model, tmp_path / "src.tensors", Encryption(keyfile=str(keyfile)))
        key = keyfile.read_bytes()  # generated because it did not exist
    else:
        params = EncryptionParams.random()
        key = params.key
        data = producer(model, tmp_path / "src.tensors", params)
    assert len(key) == 32
    backend.put("m.tensors", data)
    backend.put("m.key", key)

    enc = Encryption(keyfile=backend.uri("m.key"))
    with deserialize(backend.uri("m.tensors"), "cpu", encryption=enc, **backend.options) as sd:
        assert_same(sd, state(model))

    backend.put("wrong.key", bytes(32))
    wrong = Encryption(keyfile=backend.uri("wrong.key"))
    with pytest.raises(DecryptionError) as info:
        deserialize(backend.uri("m.tensors"), "cpu", encryption=wrong, **backend.options)
    assert isinstance(info.value, PermissionError)
    assert isinstance(info.value, errors.TensorstreamError)
    assert key.hex() not in str(info.value) and "wrong key" in str(info.value)

    # No key given: said so, with how to give one (was "wrong key or passphrase").
    with pytest.raises(DecryptionError, match="is encrypted and no key was given: pass "
                                              r"encryption=Encryption\(keyfile="):
        deserialize(backend.uri("m.tensors"), "cpu", **backend.options)
    with pytest.raises(DecryptionError, match="no key was given"):
        deserialize(backend.uri("m.tensors"), "cpu", lazy_load=True, **backend.options)["w"]


def test_damaged_ciphertext_is_told_from_a_wrong_key(backend: TensorBackend,
                                                     tmp_path: Path) -> None:
    """A tensor failing authentication after others decrypted with the same key is damage
    (the key is right; was "wrong key or passphrase"); a failure of the first is either."""
    model = make_model()
    params = EncryptionParams.random()
    data = bytearray(_tensorstream_bytes(model, tmp_path / "src.tensors", params))
    with TensorDeserializer(io.BytesIO(bytes(data)), device="cpu", lazy_load=True,
                            encryption=DecryptionParams.from_key(params.key)) as d:
        last = max((e for e in d._metadata.values() if e.data_length), key=lambda e: e.offset)
    data[last.data_offset + last.data_length // 2] ^= 0x10  # the last tensor's ciphertext
    backend.put("bad.tensors", bytes(data))
    uri = backend.uri("bad.tensors")
    for mode in ({"num_readers": 1}, {"num_readers": 2}, {"lazy_load": True}):
        # (Two readers: the second may fail before the first decrypted anything, and
        # then cannot tell either.)
        told = "damaged" if mode.get("num_readers") == 2 else "encrypted data is damaged"
        with pytest.raises(DecryptionError, match=told) as info:
            with deserialize(uri, "cpu", encryption=params.key, **mode,
                             **backend.options) as sd:
                for name in sd:  # (lazy: in file order)
                    sd[name]
        assert "bad.tensors" in str(info.value) and params.key.hex() not in str(info.value)
    with pytest.raises(DecryptionError, match="wrong key or passphrase") as info:
        deserialize(uri, "cpu", encryption=bytes(32), **backend.options)
    assert "damaged encrypted data" in str(info.value)  # the first tensor cannot tell


def test_passphrase_encryption(backend: TensorBackend, tmp_path: Path) -> None:
    model = make_model()
    secret = "correct horse battery staple"
    data = _tensorstream_bytes(model, tmp_path / "src.tensors",
                               Encryption(passphrase=secret, **FAST_KDF))
    backend.put("m.tensors", data)
    uri = backend.uri("m.tensors")
    with deserialize(uri, "cpu", encryption=Encryption(passphrase=secret),
                     **backend.options) as sd:
        assert_same(sd, state(model))
    with pytest.raises(DecryptionError) as info:
        deserialize(uri, "cpu", encryption=Encryption(passphrase="wrong"), **backend.options)
    assert secret not in str(info.value) and "wrong" not in repr(Encryption(passphrase="wrong"))


def test_keyfile_written_and_read_through_tensorstream(tmp_path: Path) -> None:
    enc = generate_keyfile(str(tmp_path / "k.key"))
    assert len((tmp_path / "k.key").read_bytes()) == 32
    model = make_model()
    serialize(model, tmp_path / "m.tensors", encryption=enc)
    assert b"\x00" * 0 in (tmp_path / "m.tensors").read_bytes()
    with deserialize(tmp_path / "m.tensors", "cpu", encryption=enc) as sd:
        assert_same(sd, state(model))
    # An existing key file is reused, never overwritten.
    before = (tmp_path / "k.key").read_bytes()
    serialize(model, tmp_path / "m2.tensors", encryption=Encryption(keyfile=str(tmp_path / "k.key")))
    assert (tmp_path / "k.key").read_bytes() == before
    (tmp_path / "bad.key").write_bytes(b"short")
    with pytest.raises(errors.ConfigurationError, match="32"):
        deserialize(tmp_path / "m.tensors", "cpu", encryption=Encryption(keyfile=str(tmp_path / "bad.key")))


def test_ranks_creating_one_key_file_at_once_all_write_readable_files(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranks serializing at once with a key file that did not exist yet each created it
    with a key of its own; the last one written stayed, and the other ranks' shards were
    published encrypted with keys nobody had (30 of 40 in a probe of 10 x 4 ranks)."""
    import threading

    from tensorstream.tensorizer import TensorizerConfig
    from tensorstream.tensorizer import save as save_module

    keyfile = tmp_path / "m.key"
    cfg = TensorizerConfig(tensorizer_uri=str(tmp_path / "m-rank-%03d.tensors"),
                           encryption_keyfile=str(keyfile))
    # Deterministic: while rank 0 writes its tensors, rank 1 creates the key file anew
    # (its own missing-file branch), as a rank that found no key file a moment earlier does.
    real = save_module._write_tensors
    other = []

    def rank_1_meanwhile(obj: Any, path: str, params: Any, *rest: Any) -> None:
        real(obj, path, params, *rest)
        if not other:
            other.append(generate_keyfile(str(keyfile)))

    monkeypatch.setattr(save_module, "_write_tensors", rank_1_meanwhile)
    cfg.serialize({"w": torch.zeros(5)}, rank=0, world_size=2)
    monkeypatch.undo()
    assert other, "the key file was replaced while rank 0 wrote"
    with cfg.deserialize("cpu", rank=0, world_size=2) as sd:
        assert torch.equal(sd["w"], torch.zeros(5))

    # And for real: four ranks at once, in threads, with a fresh key file each round.
    for round_ in range(3):
        cfg = TensorizerConfig(tensorizer_uri=str(tmp_path / f"r{round_}-%03d.tensors"),
                               encryption_keyfile=str(tmp_path / f"r{round_}.key"))
        barrier = threading.Barrier(4)

        def rank(r: int, cfg: TensorizerConfig = cfg, barrier: Any = barrier) -> None:
            barrier.wait()
            cfg.serialize({"w": torch.full((100,), float(r))}, rank=r, world_size=4)

        threads = [threading.Thread(target=rank, args=(r,)) for r in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for r in range(4):
            with cfg.deserialize("cpu", rank=r, world_size=4) as sd:
                assert torch.equal(sd["w"], torch.full((100,), float(r)))


def test_an_encryption_naming_a_key_file_pickles_whole_or_not_at_all() -> None:
    """Unpickled, it lost its keyfile_options (the key file was read with other options)
    and a presigned key file URL came back with '***' for its signature."""
    enc = Encryption(keyfile="s3://b/m.key", keyfile_options={"timeout_idle": 5})
    back = pickle.loads(pickle.dumps(enc))
    assert (back.keyfile, back.keyfile_options) == ("s3://b/m.key", {"timeout_idle": 5})
    for secret in (Encryption(keyfile="https://h/k?X-Amz-Signature=canary-sig"),
                   Encryption(keyfile="s3://b/k", keyfile_options={"s3_secret_access_key": "c"})):
        with pytest.raises(TypeError, match="refusing to pickle"):
            pickle.dumps(secret)


def test_a_key_that_is_no_bytes_or_a_key_for_a_plain_file_is_said(tmp_path: Path) -> None:
    """A 32-character str key was taken: a load said "wrong key", a save raised
    tensorizer's bare TypeError. A key given for a file that is not encrypted said
    "wrong key or passphrase" first."""
    with pytest.raises(errors.ConfigurationError, match="key must be 32 bytes"):
        Encryption(key="k" * 32)  # type: ignore[arg-type]
    plain = tmp_path / "plain.tensors"
    serialize({"w": torch.ones(3)}, plain)
    for mode in ({}, {"lazy_load": True}):
        with pytest.raises(DecryptionError, match="is not encrypted, but a key was given"):
            deserialize(plain, "cpu", encryption=bytes(32), **mode)


def test_an_encryption_of_the_wrong_kind_is_a_configuration_error(tmp_path: Path) -> None:
    """``Encryption(passphrase=12345)`` was taken, then a load raised tensorizer's bare
    ``TypeError`` ("Invalid source type") and a save another; ``opslimit="x"`` or
    ``memlimit=0`` made a save a bare ``TypeError``/``ValueError``; ``encryption={"key": ...,
    "extra": 1}`` a bare ``TypeError`` from the constructor. Each is a
    ``ConfigurationError`` naming the field, before anything is read or written, and none
    shows the passphrase or the key."""
    secret = "hunter2-never-shown"
    plain = tmp_path / "plain.tensors"
    serialize({"w": torch.ones(3)}, plain)
    out = tmp_path / "out.tensors"
    bad: list[tuple[Any, str]] = [
        (lambda: Encryption(passphrase=12345), "passphrase must be a str"),  # type: ignore[arg-type]
        (lambda: Encryption(passphrase=secret, opslimit="x"), "opslimit must be"),  # type: ignore[arg-type]
        (lambda: Encryption(passphrase=secret, memlimit=2.5), "memlimit must be"),  # type: ignore[arg-type]
        (lambda: Encryption(passphrase=secret, opslimit=True), "opslimit must be"),
        (lambda: Encryption(passphrase=secret, opslimit=0), "opslimit 0 is out of"),
        (lambda: Encryption(passphrase=secret, memlimit=1), "memlimit 1 is out of"),
        (lambda: {"key": bytes(range(32)), "extra": 1}, "unknown field extra"),
        (lambda: {"passphrase": secret, "opslimt": 1}, "unknown field opslimt"),
    ]
    for make, message in bad:
        for save in (False, True):
            with pytest.raises(errors.ConfigurationError, match=message) as info:
                if save:
                    serialize({"w": torch.ones(3)}, out, encryption=make())
                else:
                    deserialize(plain, "cpu", encryption=make())
            shown = "".join(str(e) + repr(e.args) for e in (info.value, info.value.__cause__,
                                                           info.value.__context__) if e)
            assert secret not in shown and bytes(range(32)).hex() not in shown, shown
            assert not out.exists()
    # bytes are a passphrase too (tensorizer takes them); the limits' presets are numbers
    spec = Encryption(passphrase=secret.encode(), opslimit=EncryptionParams.OpsLimit.MIN,
                      memlimit=EncryptionParams.MemLimit.MIN)
    serialize({"w": torch.ones(3)}, out, encryption=spec)
    with deserialize(out, "cpu", encryption=Encryption(passphrase=secret)) as sd:
        assert torch.equal(sd["w"], torch.ones(3))


def test_a_key_file_on_another_host_gets_none_of_the_model_host_s_credentials(
        http_token_server: Any, http_server: Any, http_reset: None, tmp_path: Path) -> None:
    """The model's options went to any key file: an HTTP model's token and headers were
    sent to the key file's host. On the model's host (S3: any bucket) they still apply;
    keyfile_options still say what to send anywhere."""
    key = bytes(range(32))
    serialize({"w": torch.ones(4)}, tmp_path / "m.tensors", encryption=key)
    http_token_server.put("m.tensors", (tmp_path / "m.tensors").read_bytes())
    http_token_server.put("m.key", key)
    http_server.put("m.key", key)
    opts = {**http_token_server.options, "headers": {"X-Api-Key": "canary-api-key"}}
    for keyfile in (Encryption(keyfile=http_server.url("m.key")),
                    Encryption(keyfile=http_token_server.url("m.key"))):
        with deserialize(http_token_server.url("m.tensors"), "cpu", encryption=keyfile,
                         **opts) as sd:
            assert torch.equal(sd["w"], torch.ones(4))
    seen = [r.headers for r in http_server.requests]
    assert seen and not any("Authorization" in h or "X-Api-Key" in h for h in seen)
    http_server.clear_log()
    given = Encryption(keyfile=http_server.url("m.key"), keyfile_options={"headers": {"X-K": "v"}})
    with deserialize(http_token_server.url("m.tensors"), "cpu", encryption=given, **opts):
        pass
    assert all(r.headers.get("X-K") == "v" for r in http_server.requests)


def test_a_key_file_on_s3_beside_a_local_model_is_read_with_the_s3_options(
        moto_s3: Any, tmp_path: Path) -> None:
    # (vLLM's TensorizerConfig: a local model, --encryption-keyfile s3://..., --s3-* flags)
    key = bytes(range(32))
    serialize({"w": torch.ones(4)}, tmp_path / "m.tensors", encryption=key)
    moto_s3.put(S3_BUCKET, "local-model.key", key)
    enc = Encryption(keyfile=f"s3://{S3_BUCKET}/local-model.key")
    with deserialize(tmp_path / "m.tensors", "cpu", encryption=enc, **moto_s3.options()) as sd:
        assert torch.equal(sd["w"], torch.ones(4))


def test_encryption_spec_validation_and_secrecy() -> None:
    with pytest.raises(errors.ConfigurationError, match="exactly one"):
        Encryption()
    with pytest.raises(errors.ConfigurationError, match="exactly one"):
        Encryption(passphrase="a", key=bytes(32))
    with pytest.raises(errors.ConfigurationError):
        Encryption(key=b"short")
    key_spec = Encryption(key=bytes(range(32)))
    assert bytes(range(32)).hex() not in repr(key_spec)
    with pytest.raises(TypeError):
        pickle.dumps(Encryption(passphrase="s3cret"))
    with pytest.raises(errors.ConfigurationError, match="Encryption"):
        deserialize("/nonexistent", "cpu", encryption="a string is ambiguous")


# -- integrity ----------------------------------------------------------------------------


def test_verify_hash_catches_a_flipped_byte(backend: TensorBackend, producer: Any,
                                            tmp_path: Path) -> None:
    model = make_model()
    data = bytearray(producer(model, tmp_path / "src.tensors"))
    backend.put("good.tensors", bytes(data))
    with deserialize(backend.uri("good.tensors"), "cpu", verify_hash=True,
                     **backend.options) as sd:
        assert_same(sd, state(model))

    weight = model.head.weight.detach().numpy().tobytes()
    at = bytes(data).index(weight) + 100
    data[at] ^= 0x40
    backend.put("bad.tensors", bytes(data))
    with pytest.raises(TensorHashMismatchError) as info:
        deserialize(backend.uri("bad.tensors"), "cpu", verify_hash=True, **backend.options)
    assert isinstance(info.value, errors.IntegrityError)
    # A lazy load reads the tensor when it is asked for, after deserialize returned: the
    # same error, naming the file, with tensorizer's as its cause.
    for readers in (1, 2):
        with deserialize(backend.uri("bad.tensors"), "cpu", verify_hash=True, lazy_load=True,
                         num_readers=readers, **backend.options) as sd:
            with pytest.raises(TensorHashMismatchError, match=r"bad\.tensors") as info:
                sd["head.weight"]
    assert isinstance(info.value, errors.IntegrityError)
    assert type(info.value.__cause__).__module__.startswith("tensorizer")
    # Without verification the corruption goes unnoticed: that is what the flag is for.
    with deserialize(backend.uri("bad.tensors"), "cpu", **backend.options) as sd:
        assert not torch.equal(sd["head.weight"], model.head.weight)


def test_not_a_tensorizer_file_and_missing_object(tmp_path: Path) -> None:
    (tmp_path / "x.bin").write_bytes(b"hello world" * 10)
    with pytest.raises(ValueError, match="tensorizer"):
        deserialize(tmp_path / "x.bin", "cpu")
    with pytest.raises(FileNotFoundError):
        deserialize(tmp_path / "nope.tensors", "cpu")


# -- modules ----------------------------------------------------------------------------


def test_load_into_module_gives_identical_outputs(backend: TensorBackend, producer: Any,
                                                  tmp_path: Path) -> None:
    model = make_model(seed=1)
    backend.put("m.tensors", producer(model, tmp_path / "src.tensors"))
    with torch.device("meta"):
        empty = TinyNet()
    result = load_into_module(empty, backend.uri("m.tensors"), "cpu", **backend.options)
    assert result.loaded == len(model.state_dict())
    assert (result.missing_keys, result.unexpected_keys, result.mismatched_keys) == ([], [], [])
    ids = torch.randint(0, 512, (4, 7))
    with torch.no_grad():
        assert torch.equal(empty.eval()(ids), model(ids))


def test_load_into_module_names_tensors_left_on_meta(tmp_path: Path) -> None:
    model = make_model()
    sd = state(model)
    del sd["head.bias"], sd["scale"]
    serialize(sd, tmp_path / "partial.tensors")
    # write_state_dict files cannot fill modules in tensorizer; use a module file
    partial = make_model()
    del partial.head.bias
    partial.head.register_parameter("bias", None)
    serialize(partial, tmp_path / "partial-module.tensors")
    with torch.device("meta"):
        empty = TinyNet()
    with pytest.raises(MetaTensorError, match=r"head\.bias") as info:
        load_into_module(empty, tmp_path / "partial-module.tensors", "cpu")
    assert isinstance(info.value, ValueError)


def test_a_state_dict_name_with_a_leading_dot_does_not_fill_a_module(tmp_path: Path) -> None:
    # every leading "." was stripped (meant for write_module's top-level ".weight"), so the
    # state-dict tensor "..w" filled the parameter "w"
    serialize({"..w": torch.ones(2)}, tmp_path / "m.tensors")
    module = torch.nn.Module()
    module.w = torch.nn.Parameter(torch.zeros(2))
    with pytest.raises(ModuleMismatchError, match=r"missing from the file \(1\): w;.*\.\.w"):
        load_into_module(module, tmp_path / "m.tensors", "cpu")
    assert torch.equal(module.w, torch.zeros(2))


def test_quantized_module_warns(tmp_path: Path) -> None:
    class Quantish(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qweight = torch.nn.Parameter(torch.ones(4, 4, dtype=torch.int8),
                                              requires_grad=False)

    m = Quantish()
    serialize(m, tmp_path / "q.tensors")
    target = Quantish()
    with pytest.warns(QuantizationWarning):
        load_into_module(target, tmp_path / "q.tensors", "cpu")
    assert torch.equal(target.qweight, m.qweight)


def test_vllm_marker_detected_from_open_deserializer(tmp_path: Path) -> None:
    model = make_model()
    serialize(model, tmp_path / "plain.tensors")
    model.register_parameter(
        "vllm_tensorized_marker",
        torch.nn.Parameter(torch.tensor((1,), device="meta"), requires_grad=False),
    )
    _tensorizer_bytes(model, tmp_path / "vllm.tensors")
    with deserialize(tmp_path / "vllm.tensors", "cpu", lazy_load=True) as sd:
        assert is_vllm_tensorized(sd)
    with deserialize(tmp_path / "plain.tensors", "cpu", lazy_load=True) as sd:
        assert not is_vllm_tensorized(sd)


# -- serialize ------------------------------------------------------------------------------


def test_serialize_is_atomic_and_leaves_no_temp_files(tmp_path: Path) -> None:
    dst = tmp_path / "m.tensors"
    dst.write_bytes(b"old contents")
    with pytest.raises(TypeError, match="state dict"):
        serialize(object(), dst)  # type: ignore[arg-type]
    assert dst.read_bytes() == b"old contents"
    assert sorted(os.listdir(tmp_path)) == ["m.tensors"]
    model = make_model()
    assert serialize(model, dst) == str(dst)
    assert sorted(os.listdir(tmp_path)) == ["m.tensors"]
    with deserialize(dst, "cpu") as sd:
        assert_same(sd, state(model))
    with pytest.raises(FileNotFoundError):
        serialize(model, tmp_path / "no-such-dir" / "m.tensors")
    with pytest.raises(errors.ConfigurationError, match="unknown option"):
        serialize(model, tmp_path / "x.tensors", not_an_option=1)


def test_serialize_to_read_only_backend_fails_cleanly(http_server: Any, tmp_path: Path) -> None:
    import tempfile

    before = set(os.listdir(tempfile.gettempdir()))
    with pytest.raises(errors.TensorstreamError):
        serialize(make_model(), http_server.url("ro/m.tensors"), **http_server.options)
    leftovers = {n for n in set(os.listdir(tempfile.gettempdir())) - before
                 if n.startswith("tensorstream-serialize-")}
    assert not leftovers


# -- sharding -----------------------------------------------------------------------------


def test_two_rank_sharded_roundtrip(tmp_path: Path) -> None:
    template = str(tmp_path / "model-rank-%03d.tensors")
    shards = {rank: state(make_model(seed=rank)) for rank in range(2)}
    for rank, sd in shards.items():
        written = serialize(sd, template, rank=rank, world_size=2)
        assert written.endswith(f"model-rank-{rank:03d}.tensors")
    assert sorted(os.listdir(tmp_path)) == ["model-rank-000.tensors", "model-rank-001.tensors"]
    for rank, sd in shards.items():
        with deserialize(template, "cpu", rank=rank, world_size=2) as loaded:
            assert_same(loaded, sd)
    with pytest.raises(errors.ConfigurationError, match="%03d"):
        serialize(shards[0], tmp_path / "model.tensors", rank=1, world_size=2)


def test_a_rank_template_with_more_shards_than_ranks_is_refused(
        backend: TensorBackend, tmp_path: Path) -> None:
    """A model saved as 3 shards loaded by 2 ranks: ranks 0 and 1 loaded shards 000 and 001
    and shard 002's weights were lost without a word (a single process loading the
    template took shard 000 alone). The load is refused now, naming the shard no rank
    loads and both counts; as many ranks as shards load as before."""
    for rank in range(3):
        backend.put(f"m-rank-{rank:03d}.tensors", _tensorizer_bytes(
            {"w": torch.full((4,), float(rank))}, tmp_path / f"src{rank}.tensors"))
    template = backend.uri("m-rank-%03d.tensors")
    for rank in range(2):
        with pytest.raises(errors.ConfigurationError) as caught:
            deserialize(template, "cpu", rank=rank, world_size=2, **backend.options)
        said = str(caught.value)
        assert "m-rank-002.tensors" in said and "2 ranks" in said, said
        assert "tensor_parallel_size" in said and "at least 3" in said, said
    with pytest.raises(errors.ConfigurationError, match=r"m-rank-001\.tensors"):
        deserialize(template, "cpu", **backend.options)  # one process: a world of one
    for rank in range(3):  # as many ranks as shards
        with deserialize(template, "cpu", rank=rank, world_size=3, **backend.options) as sd:
            assert torch.equal(sd["w"], torch.full((4,), float(rank)))
    # rank= alone does not say how many ranks there are: loaded as before
    with deserialize(template, "cpu", rank=1, **backend.options) as sd:
        assert torch.equal(sd["w"], torch.full((4,), 1.0))
    # a shard's own name (no template) is one file, on purpose
    with deserialize(backend.uri("m-rank-000.tensors"), "cpu", **backend.options) as sd:
        assert torch.equal(sd["w"], torch.zeros(4))



def test_saving_fewer_shards_over_more_says_the_stale_ones_are_left(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A model saved by 3 ranks, then again by 2: shard 002 stayed, and the load of the
    new model is refused (more shards than ranks). Rank 0's save says so at once."""
    template = str(tmp_path / "m-rank-%03d.tensors")
    for rank in range(3):
        serialize({"w": torch.zeros(2)}, template, rank=rank, world_size=3)
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
    for rank in (1, 0):  # the warning comes from rank 0 alone
        caplog.clear()
        serialize({"w": torch.ones(2)}, template, rank=rank, world_size=2)
        said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert bool(said) == (rank == 0), said
    assert "m-rank-002.tensors is left from an earlier save with more ranks" in said[0], said
    assert "delete it" in said[0], said
    with pytest.raises(errors.ConfigurationError, match="m-rank-002"):
        deserialize(template, "cpu", rank=0, world_size=2)
    (tmp_path / "m-rank-002.tensors").unlink()
    with deserialize(template, "cpu", rank=0, world_size=2) as sd:
        assert torch.equal(sd["w"], torch.ones(2))


# -- devices ----------------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", 0])
def test_load_to_cuda(backend: TensorBackend, device: str, tmp_path: Path) -> None:
    model = make_model()
    backend.put("m.tensors", _tensorstream_bytes(model, tmp_path / "src.tensors"))
    with deserialize(backend.uri("m.tensors"), device, num_readers=2, **backend.options) as sd:
        for name, tensor in state(model).items():
            assert sd[name].device.type == "cuda"
            assert torch.equal(sd[name].cpu(), tensor)
    with torch.device("meta"):
        empty = TinyNet()
    load_into_module(empty, backend.uri("m.tensors"), device, **backend.options)
    ids = torch.randint(0, 512, (2, 5))
    with torch.no_grad():
        assert torch.equal(empty.eval()(ids.to(device)).cpu(), model(ids))


def test_tensorizer_s_no_op_arguments_are_taken_as_tensorizer_takes_them(
        backend: TensorBackend, tmp_path: Path) -> None:
    # TensorDeserializer keeps plaid_mode and plaid_mode_buffers "for backwards
    # compatibility; has no effect": a call (or vLLM deserialization_kwargs) written for it
    # was refused here as "unknown option(s) plaid_mode for s3".
    from tensorstream.tensorizer import TensorizerConfig

    model = make_model()
    backend.put("m.tensors", _tensorizer_bytes(model, tmp_path / "src.tensors"))
    uri = backend.uri("m.tensors")
    with deserialize(uri, "cpu", plaid_mode=True, plaid_mode_buffers=4,
                     **backend.options) as sd:
        assert_same(sd, state(model))
    with torch.device("meta"):
        empty = TinyNet()
    load_into_module(empty, uri, "cpu", plaid_mode=False, **backend.options)
    assert torch.equal(empty.head.weight, model.head.weight)
    cfg = TensorizerConfig(tensorizer_uri=uri, stream_kwargs=backend.options,
                           deserialization_kwargs={"plaid_mode": True})
    with cfg.deserialize("cpu") as sd:
        assert_same(sd, state(model))
    # a misspelling of them is still refused
    with pytest.raises(errors.ConfigurationError, match="plaid_mod"):
        deserialize(uri, "cpu", plaid_mod=True, **backend.options)


@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
def test_a_filter_func_that_selects_no_tensor_is_said_not_a_damaged_file(
        backend: TensorBackend, tmp_path: Path, lazy: bool) -> None:
    # tensorizer itself fails with "max_workers must be greater than 0"; this said
    # "... is not a whole tensorizer file" (MalformedFileError) of a sound file.
    backend.put("m.tensors", _tensorizer_bytes(make_model(), tmp_path / "src.tensors"))
    for selects_nothing in (lambda n: False, lambda n: None, lambda n: ""):
        with pytest.raises(errors.ConfigurationError,
                           match=r"filter_func selected none of the \d+ tensors in .*m\.tensors"
                           ) as info:
            deserialize(backend.uri("m.tensors"), "cpu", filter_func=selects_nothing,
                        lazy_load=lazy, **backend.options)
        assert isinstance(info.value, ValueError)  # what tensorizer's own error is
        assert not isinstance(info.value, errors.MalformedFileError)
    # a filter that selects one tensor still loads it
    with deserialize(backend.uri("m.tensors"), "cpu", filter_func=lambda n: n == "head.bias",
                     lazy_load=lazy, **backend.options) as sd:
        assert list(sd) == ["head.bias"]


@pytest.mark.parametrize("bad", [5, "w0", ["head.weight"]])
def test_a_filter_func_that_is_not_a_function_is_a_configuration_error(
        tmp_path: Path, bad: Any) -> None:
    dst = tmp_path / "m.tensors"
    serialize(make_model(), dst)
    with pytest.raises(errors.ConfigurationError, match="filter_func must be a function") as info:
        deserialize(dst, "cpu", filter_func=bad)
    # tensorizer's TensorDeserializer raises TypeError here: what its users catch
    assert isinstance(info.value, InvalidArgumentError) and isinstance(info.value, TypeError)


def test_serialize_takes_write_module_s_include_non_persistent_buffers(
        backend: TensorBackend, tmp_path: Path) -> None:
    # TensorSerializer.write_module(m, include_non_persistent_buffers=False) had no
    # equivalent: serialize() refused it as "unknown option(s) ... for s3".
    if not backend.writable:
        pytest.skip("a read-only backend")
    model = make_model()
    model.register_buffer("rope", torch.arange(6.0), persistent=False)
    for include in (True, False):
        theirs = TensorSerializer(str(tmp_path / f"theirs-{include}.tensors"))
        theirs.write_module(model, include_non_persistent_buffers=include)
        theirs.close()
        uri = serialize(model, backend.uri(f"m-{include}.tensors"),
                        include_non_persistent_buffers=include, **backend.options)
        with TensorDeserializer(str(tmp_path / f"theirs-{include}.tensors"),
                                device="cpu") as expected, \
                deserialize(uri, "cpu", **backend.options) as sd:
            assert list(sd) == list(expected)
            assert (".rope" in sd) is include
            for name in expected:
                assert torch.equal(sd[name], expected[name]), name
    with pytest.raises(errors.ConfigurationError, match="include_non_persistent_buffers"):
        serialize(state(model), backend.uri("sd.tensors"),
                  include_non_persistent_buffers=False, **backend.options)
    only_scratch = torch.nn.Module()
    only_scratch.register_buffer("scratch", torch.ones(2), persistent=False)
    with pytest.raises(InvalidArgumentError, match="only tensors are non-persistent"):
        serialize(only_scratch, backend.uri("none.tensors"),
                  include_non_persistent_buffers=False, **backend.options)


def test_serialize_takes_tensorserializer_s_limit_cpu_concurrency(tmp_path: Path) -> None:
    # TensorSerializer(f, limit_cpu_concurrency=n) had no equivalent: serialize() refused
    # it as "unknown option(s) limit_cpu_concurrency for file".
    model = make_model()
    theirs = TensorSerializer(str(tmp_path / "theirs.tensors"), limit_cpu_concurrency=1)
    theirs.write_module(model)
    theirs.close()
    serialize(model, tmp_path / "ours.tensors", limit_cpu_concurrency=1)
    assert (tmp_path / "ours.tensors").read_bytes() == (tmp_path / "theirs.tensors").read_bytes()
    # tensorizer's TypeError and ValueError, before anything is written
    with pytest.raises(InvalidArgumentError, match="limit_cpu_concurrency") as info:
        serialize(model, tmp_path / "x.tensors", limit_cpu_concurrency=1.5)
    assert isinstance(info.value, TypeError) and isinstance(info.value, errors.ConfigurationError)
    for bad in (0, -1):
        with pytest.raises(errors.ConfigurationError, match="limit_cpu_concurrency"):
            serialize(model, tmp_path / "x.tensors", limit_cpu_concurrency=bad)
    assert not (tmp_path / "x.tensors").exists()


@pytest.mark.parametrize("obj", [{}, {"a": {}}, {"a": 5}, torch.nn.Sequential(), [], ()],
                         ids=["empty", "nested-empty", "no-tensor", "empty-module", "list", "tuple"])
def test_nothing_to_serialize_writes_nothing(tmp_path: Path, obj: Any) -> None:
    # tensorizer cannot read a file without tensors: refuse it before writing one.
    with pytest.raises(errors.TensorstreamError, match="without any tensor") as info:
        serialize(obj, tmp_path / "m.tensors")
    assert isinstance(info.value, TypeError)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("obj", [{"a": torch.ones(2), "b": 5}, {1: torch.ones(2)}],
                         ids=["a-value-not-a-tensor", "a-key-not-a-string"])
def test_what_tensorizer_cannot_write_is_named_and_writes_nothing(tmp_path: Path, obj: Any) -> None:
    with pytest.raises(errors.TensorstreamError, match="serialize") as info:
        serialize(obj, tmp_path / "m.tensors")
    assert isinstance(info.value, TypeError)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("obj", [{"": torch.ones(2), "w": torch.ones(1)},
                                 {"x" * 65536: torch.ones(1)}, {"é" * 32768: torch.ones(1)},
                                 {"a": {"x" * 65536: torch.ones(1)}}],
                         ids=["an-empty-name", "a-name-over-64-KiB", "a-name-over-64-KiB-in-utf8",
                              "a-nested-name-over-64-KiB"])
def test_a_name_tensorizer_cannot_hold_is_named_and_writes_nothing(
        tmp_path: Path, obj: Any) -> None:
    # "" wrote a file that neither deserialize nor tensorizer reads ("Invalid empty tensor
    # path"); a name over 65535 UTF-8 bytes raised a bare struct.error from tensorizer.
    with pytest.raises(errors.TensorstreamError, match="serialize") as info:
        serialize(obj, tmp_path / "m.tensors")
    assert isinstance(info.value, TypeError)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("obj", [
    {"a": torch.ones(2), "b": {"c": torch.eye(2).to_sparse()}},
    [torch.ones(1), torch.eye(2).to_sparse_csr()],
], ids=["nested-sparse-coo", "sparse-csr-in-a-list"])
def test_a_sparse_tensor_is_named_and_writes_nothing(tmp_path: Path, obj: Any) -> None:
    # tensorizer raised torch's bare RuntimeError "unsupported memory format option Contiguous".
    with pytest.raises(errors.TensorstreamError, match=r"tensor '(b\.c|1)' is not dense") as info:
        serialize(obj, tmp_path / "m.tensors")
    assert isinstance(info.value, TypeError)
    assert os.listdir(tmp_path) == []


def test_an_empty_tensor_tensorizer_cannot_encrypt_is_named_and_writes_nothing(
        tmp_path: Path) -> None:
    with pytest.raises(errors.TensorstreamError, match="tensorizer cannot write") as info:
        serialize({"a": torch.ones(2), "e": torch.ones(0)}, tmp_path / "m.tensors",
                  encryption=b"k" * 32)
    assert isinstance(info.value, TypeError)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(("given", "meant"), [("lazy_lod", "lazy_load"),
                                              ("num_reader", "num_readers"),
                                              ("verfy_hash", "verify_hash")])
def test_a_misspelt_argument_names_the_one_meant(tmp_path: Path, given: str, meant: str) -> None:
    # It reached open() as a storage option: "unknown option(s) lazy_lod for file; it accepts
    # backoff_initial, ..." listed only storage options and guessed nothing
    uri = str(tmp_path / "m.tensors")
    tensorstream.serialize({"w": torch.ones(2)}, uri)
    with pytest.raises(errors.ConfigurationError,
                       match=f"unknown argument {given} \\(did you mean {meant}\\?\\) for "
                             "tensorstream.deserialize"):
        tensorstream.deserialize(uri, "cpu", **{given: True})
    with pytest.raises(errors.ConfigurationError,
                       match=r"encrypton \(did you mean encryption\?\) for tensorstream.serialize"):
        tensorstream.serialize({"w": torch.ones(2)}, str(tmp_path / "n.tensors"), encrypton=None)
    assert not (tmp_path / "n.tensors").exists()
    # a storage option's near spelling is still answered by open(), with its guess
    with pytest.raises(errors.ConfigurationError, match=r"timeout_idl \(did you mean timeout_idle"):
        tensorstream.deserialize(uri, "cpu", timeout_idl=1)
