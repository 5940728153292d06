"""tensorizer integration: load from every backend, hashes, modules, shards, devices.

Backends come from the ``backend`` fixture (conftest.py: one ``TensorBackend`` per storage service,
``tensorizer_models.make_backend``). Encryption: test_tensorizer_encryption.py;
``serialize``: test_tensorizer_serialize.py.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from tensorizer import TensorDeserializer
from tensorizer_models import (
    TensorBackend,
    TinyNet,
    assert_same,
    make_model,
    state,
    tensorizer_bytes,
    tensorstream_bytes,
)

import tensorstream
from tensorstream import errors
from tensorstream.tensorizer.hook import forks
from tensorstream.tensorizer.load import (
    InvalidArgumentError,
    MetaTensorError,
    ModuleMismatchError,
    QuantizationWarning,
    TensorHashMismatchError,
    deserialize,
    is_vllm_tensorized,
    load_into_module,
    serialize,
)
from tensorstream.tensorizer.local import LocalTensorDeserializer
from tensorstream.tensorizer.remote import RemoteTensorDeserializer


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
    backend.put("m.tensors", tensorstream_bytes(model, tmp_path / "src.tensors"))
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


def test_a_safetensors_file_or_index_given_to_deserialize_says_what_to_call(
        backend: TensorBackend, tmp_path: Path) -> None:
    # A new user's first mistake: "Not a tensorizer file" said nothing of what it was.
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(3)}, str(tmp_path / "m.safetensors"))
    backend.put("m.safetensors", (tmp_path / "m.safetensors").read_bytes())
    backend.put("index.json", b'{"weight_map": {"w": "m.safetensors"}}')
    backend.put("x.bin", b"hello world" * 10)
    for key, what in (("m.safetensors", "it is a safetensors file"),
                      ("index.json", r"it is JSON \(a safetensors index\?\)")):
        for lazy in (False, True):
            with pytest.raises(errors.MalformedFileError,
                               match=f"{what}: load it with tensorstream.safetensors.load"):
                deserialize(backend.uri(key), "cpu", lazy_load=lazy, **backend.options)
    with pytest.raises(errors.MalformedFileError) as caught:
        deserialize(backend.uri("x.bin"), "cpu", **backend.options)
    assert "it is" not in str(caught.value)  # only where the bytes say so


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
    tensorizer_bytes(model, tmp_path / "vllm.tensors")
    with deserialize(tmp_path / "vllm.tensors", "cpu", lazy_load=True) as sd:
        assert is_vllm_tensorized(sd)
    with deserialize(tmp_path / "plain.tensors", "cpu", lazy_load=True) as sd:
        assert not is_vllm_tensorized(sd)


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
        backend.put(f"m-rank-{rank:03d}.tensors", tensorizer_bytes(
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


def test_a_missing_shard_names_its_rank_the_template_and_what_to_do(
        backend: TensorBackend, tmp_path: Path) -> None:
    """4 ranks loading a model saved as 2 shards (or one whose shard 001 is missing): rank 2
    got a bare "no such file: .../m-rank-002.tensors", which said neither that it was its
    shard of a template nor what to do. It is still a NotFoundError (a FileNotFoundError),
    now naming the rank, the world size, the template, and the fix: as many ranks as
    shards, or restore the shard; a template that names no shard at all says to check it."""
    backend.put("m-rank-000.tensors", tensorizer_bytes({"w": torch.zeros(4)},
                                                       tmp_path / "src.tensors"))
    template = backend.uri("m-rank-%03d.tensors")
    secrets = [v for v in backend.options.values() if isinstance(v, str) and len(v) >= 8]
    for rank in (1, 2):
        with pytest.raises(errors.NotFoundError) as caught:
            deserialize(template, "cpu", rank=rank, world_size=4, **backend.options)
        said = str(caught.value)
        assert f"m-rank-{rank:03d}.tensors" in said and f"rank {rank} of 4" in said, said
        assert "m-rank-%03d.tensors" in said and "tensor_parallel_size" in said, said
        assert "m-rank-000.tensors exists" in said, said
        assert isinstance(caught.value, FileNotFoundError)
        assert not [v for v in secrets if v in said], said
    other = backend.uri("elsewhere-%03d.tensors")  # a wrong name: no shard of it at all
    for rank in (0, 1):
        with pytest.raises(errors.NotFoundError) as caught:
            deserialize(other, "cpu", rank=rank, world_size=2, **backend.options)
        said = str(caught.value)
        assert f"rank {rank} of 2" in said and "check the folder and the name" in said, said
        assert "elsewhere-000.tensors" in said, said
    # a second placeholder that is no template stays in the name: said too
    with pytest.raises(errors.NotFoundError) as caught:
        deserialize(backend.uri("{rank}/m-rank-%03d.tensors"), "cpu", rank=1, world_size=2,
                    **backend.options)
    assert "'{rank}' in it is no rank template and was read as it is" in str(caught.value)
    with deserialize(template, "cpu", rank=0, world_size=1, **backend.options) as sd:
        assert torch.equal(sd["w"], torch.zeros(4))


@pytest.mark.parametrize(("name", "instead"), [
    ("m-rank-%d.tensors", "'%01d' in place of '%d'"),
    ("m-rank-{rank}.tensors", "'%01d' in place of '{rank}'"),
    ("m-rank-{rank:03d}.tensors", "'%03d' in place of '{rank:03d}'"),
    ("m-rank-%3d.tensors", "a zero-padded %0Nd in place of '%3d'"),
])
def test_a_name_with_a_placeholder_that_is_no_template_says_so_when_missing(
        tmp_path: Path, name: str, instead: str) -> None:
    """printf's %d and str.format's {rank} are no rank templates (vLLM fills only
    %0Nd): a process loading "m-rank-%d.tensors" read that name as it is and got a bare
    "no such file". It is still a NotFoundError, now saying the placeholder was taken
    as text and what to write (%01d writes the digits %d does)."""
    with pytest.raises(errors.NotFoundError) as caught:
        deserialize(str(tmp_path / name), "cpu")
    said = str(caught.value)
    assert "is not, so the name was read as it is" in said and f"write {instead}" in said, said
    # a name that is there is read as it is, placeholder and all
    (tmp_path / name).write_bytes(tensorizer_bytes({"w": torch.ones(2)}, tmp_path / "s.tensors"))
    with deserialize(str(tmp_path / name), "cpu") as sd:
        assert torch.equal(sd["w"], torch.ones(2))
    # with no placeholder in the name, the error is the file's own
    with pytest.raises(errors.NotFoundError) as caught:
        deserialize(str(tmp_path / "absent.tensors"), "cpu")
    assert "rank template" not in str(caught.value)


def test_a_template_print_is_the_same_for_one_template_spelt_two_ways(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ranks of a group compare their templates' prints (shards of two saves must not
    load side by side): a path, its file:// URI and a relative path from its folder are
    one template (file:///m/x-%03d.tensors was parsed as "/m/x-\\x03d.tensors"), as are
    presigned URLs whose tokens differ; another folder or name is another."""
    from tensorstream.tensorizer.sharding import template_print

    monkeypatch.chdir(tmp_path)
    spellings = [str(tmp_path / "x-%03d.tensors"), f"file://{tmp_path}/x-%03d.tensors",
                 "x-%03d.tensors", "./x-%03d.tensors"]
    assert len({template_print(u) for u in spellings}) == 1
    assert template_print(str(tmp_path / "y-%03d.tensors")) != template_print(spellings[0])
    signed = "https://h/x-%03d.tensors?X-Amz-Signature="
    assert template_print(signed + "ab" * 32) == template_print(signed + "cd" * 32)
    assert template_print(signed + "ab" * 32) != template_print("https://h/y-%03d.tensors")


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
    backend.put("m.tensors", tensorstream_bytes(model, tmp_path / "src.tensors"))
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
    backend.put("m.tensors", tensorizer_bytes(model, tmp_path / "src.tensors"))
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
    backend.put("m.tensors", tensorizer_bytes(make_model(), tmp_path / "src.tensors"))
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
