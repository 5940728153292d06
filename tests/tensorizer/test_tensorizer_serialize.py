"""``tensorstream.serialize`` of tensorizer files: atomic writes, tensorizer's own writer
options taken, and what would make no readable file refused by name with nothing written."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from tensorizer import TensorDeserializer, TensorSerializer
from tensorizer_models import (
    TensorBackend,
    assert_same,
    make_model,
    state,
)

from tensorstream import errors
from tensorstream.tensorizer.load import (
    InvalidArgumentError,
    deserialize,
    serialize,
)


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
