"""tensorizer files encrypted (``Encryption``: a key file at any URI, a passphrase, raw
key bytes) loaded from every backend: wrong keys told from damaged ciphertext, key files
written once by many ranks, and options and credentials that never leak."""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
from tensorizer import DecryptionParams, EncryptionParams, TensorDeserializer
from tensorizer_models import (
    FAST_KDF,
    TensorBackend,
    assert_same,
    make_model,
    state,
    tensorstream_bytes,
)

from fixtures_s3 import S3_BUCKET
from tensorstream import errors
from tensorstream.tensorizer.load import (
    DecryptionError,
    Encryption,
    deserialize,
    generate_keyfile,
    serialize,
)


def test_keyfile_encryption(backend: TensorBackend, producer: Any, tmp_path: Path) -> None:
    model = make_model()
    if producer is tensorstream_bytes:
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
    data = bytearray(tensorstream_bytes(model, tmp_path / "src.tensors", params))
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
    data = tensorstream_bytes(model, tmp_path / "src.tensors",
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


def test_a_key_file_holding_the_key_as_text_says_so_never_showing_it(tmp_path: Path) -> None:
    """A key file written as text (the key in hex or base64, or with a line break after
    it, as `echo` or an editor leaves) said only "holds 64 bytes; a tensorizer key is 32
    raw bytes". It now says what the file seems to hold and what to write, and never
    shows the key; a file of other bytes says what it said."""
    import base64

    key = bytes(range(100, 132))
    serialize({"w": torch.ones(3)}, tmp_path / "m.tensors", encryption=key)
    cases = {
        key + b"\n": "whitespace around them",
        b"\n" + key: "whitespace around them",
        key.hex().encode(): "64 hexadecimal digits",
        key.hex().upper().encode() + b"\r\n": "64 hexadecimal digits",
        base64.b64encode(key): "in base64",
        base64.b64encode(key) + b"\n": "in base64",
    }
    for i, (held, said) in enumerate(cases.items()):
        (tmp_path / f"{i}.key").write_bytes(held)
        with pytest.raises(errors.ConfigurationError, match=said) as info:
            deserialize(tmp_path / "m.tensors", "cpu",
                        encryption=Encryption(keyfile=str(tmp_path / f"{i}.key")))
        text = str(info.value)
        assert "32 raw bytes" in text, text
        for shown in (key.hex(), key.hex().upper(), base64.b64encode(key).decode(), repr(key)):
            assert shown not in text and shown not in repr(info.value), text
    for other in (b"short", bytes(64), b"z" * 44, bytes(1000)):
        (tmp_path / "other.key").write_bytes(other)
        with pytest.raises(errors.ConfigurationError,
                           match=rf"holds {len(other)} bytes; a tensorizer key is 32 raw bytes "
                                 r"\(write one with tensorstream.generate_keyfile\)$"):
            deserialize(tmp_path / "m.tensors", "cpu",
                        encryption=Encryption(keyfile=str(tmp_path / "other.key")))
