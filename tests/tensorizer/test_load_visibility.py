"""What a load says about itself and how it fails: ``load_into_module`` for every
tensorizer file (strict and not), one INFO line + ``stats`` per load, DEBUG
read-path lines, and torch/tensorizer failures as tensorstream errors (issue 18)."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tensorstream import errors
from tensorstream.tensorizer import (
    DeviceUnavailableError,
    InvalidArgumentError,
    LoadError,
    LoadStats,
    MetaTensorError,
    ModuleMismatchError,
    deserialize,
    load_into_module,
    serialize,
)
from tensorstream.testing.http_server import HTTPTestServer
from torch_devices import DEFAULTS, default_device, unusable_devices


class Net(torch.nn.Module):
    def __init__(self, hidden: int = 64) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(100, hidden)
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(hidden, hidden) for _ in range(2)])
        self.register_buffer("scale", torch.tensor([0.5, 2.0]))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = torch.relu(block(x))
        return x * self.scale[0] + self.scale[1]


def _model(seed: int = 0, hidden: int = 64) -> Net:
    torch.manual_seed(seed)
    return Net(hidden).eval()


def _meta(hidden: int = 64) -> Net:
    with torch.device("meta"):
        return Net(hidden)


@pytest.fixture
def served(http_server: HTTPTestServer, http_reset: None, request: pytest.FixtureRequest) -> Any:
    """Put a file on the HTTP test server; returns ``put(key, path) -> uri``."""
    prefix = f"vis{abs(hash(request.node.nodeid)) % 10**8}/"

    def put(key: str, path: Path) -> str:
        http_server.put(prefix + key, path.read_bytes())
        return http_server.url(prefix + key)

    return put


# -- load_into_module ----------------------------------------------------------------


@pytest.mark.parametrize("written_from", ["module", "state_dict"])
def test_load_into_module_fills_a_meta_module_from_either_kind_of_file(
    tmp_path: Path, served: Any, written_from: str,
) -> None:
    model = _model(1)
    serialize(model if written_from == "module" else model.state_dict(), tmp_path / "m.tensors")
    uri = served("m.tensors", tmp_path / "m.tensors")
    target = _meta()
    result = load_into_module(target, uri, "cpu")
    assert result.loaded == len(model.state_dict())
    assert (result.missing_keys, result.unexpected_keys, result.mismatched_keys) == ([], [], [])
    ids = torch.randint(0, 100, (3, 5))
    with torch.no_grad():
        assert torch.equal(target.eval()(ids), model(ids))
    assert isinstance(target.blocks[0].weight, torch.nn.Parameter)
    assert target.blocks[0].weight.requires_grad  # as the module declared it
    assert "scale" in dict(target.named_buffers())


def test_a_load_that_fails_part_way_leaves_the_module_as_it_was_unless_lazy(
    tmp_path: Path, served: Any,
) -> None:
    """A failure after some tensors were read (here the last tensor's hash) leaves an eager
    load's module as it was: nothing goes into it before every tensor is in. A lazy load
    puts each tensor in as it reads it (that is what keeps its memory low): the tensors read
    before the failure are in, as docs/load-a-model.md says; the error names the file."""
    model = _model(1)
    serialize(model, tmp_path / "m.tensors")
    data = bytearray((tmp_path / "m.tensors").read_bytes())
    last = model.blocks[1].weight.detach().numpy().tobytes()
    data[bytes(data).index(last) + 100] ^= 0x40
    (tmp_path / "bad.tensors").write_bytes(bytes(data))
    for uri in (tmp_path / "bad.tensors", served("bad.tensors", tmp_path / "bad.tensors")):
        for kw in ({}, {"num_readers": 1}, {"filter_func": lambda name: True}):
            target = _model(2)
            before = {k: v.clone() for k, v in target.state_dict().items()}
            with pytest.raises(errors.IntegrityError, match=r"bad\.tensors"):
                load_into_module(target, uri, "cpu", verify_hash=True, **kw)
            after = target.state_dict()
            assert [k for k in before if not torch.equal(before[k], after[k])] == [], kw
        target = _model(2)
        with pytest.raises(errors.IntegrityError, match=r"bad\.tensors"):
            load_into_module(target, uri, "cpu", verify_hash=True, lazy_load=True)
        assert torch.equal(target.embed.weight, model.embed.weight)  # read before the failure


def test_strict_names_every_missing_unexpected_and_mismatched_tensor(tmp_path: Path) -> None:
    sd = _model().state_dict()
    del sd["blocks.1.bias"]  # missing from the file
    sd["extra.weight"] = torch.ones(3)  # not in the module
    sd["embed.weight"] = torch.ones(100, 32)  # wrong shape
    serialize(sd, tmp_path / "m.tensors")
    target = _meta()
    with pytest.raises(ModuleMismatchError) as info:
        load_into_module(target, tmp_path / "m.tensors", "cpu")
    err = info.value
    assert isinstance(err, errors.TensorstreamError) and isinstance(err, ValueError)
    assert isinstance(err, MetaTensorError)
    assert err.missing_keys == ["blocks.1.bias"]
    assert err.unexpected_keys == ["extra.weight"]
    assert err.mismatched_keys == [("embed.weight", (100, 64), (100, 32))]
    message = str(err)
    for needle in ("blocks.1.bias", "extra.weight", "embed.weight", "[100, 64]", "[100, 32]",
                   str(tmp_path / "m.tensors"), "strict=False"):
        assert needle in message
    # Nothing was put into the module.
    assert all(p.device.type == "meta" for p in target.parameters())


def test_not_strict_loads_what_fits_and_returns_the_rest(tmp_path: Path) -> None:
    model = _model(2)
    sd = model.state_dict()
    del sd["blocks.1.bias"]
    sd["extra.weight"] = torch.ones(3)
    sd["embed.weight"] = torch.ones(100, 32)
    serialize(sd, tmp_path / "m.tensors")
    target = _model(3)  # a real module: what is not loaded keeps its values
    before_bias = target.blocks[1].bias.detach().clone()
    before_embed = target.embed.weight.detach().clone()
    result = load_into_module(target, tmp_path / "m.tensors", strict=False)
    assert result.missing_keys == ["blocks.1.bias"]
    assert result.unexpected_keys == ["extra.weight"]
    assert result.mismatched_keys == [("embed.weight", (100, 64), (100, 32))]
    assert result.loaded == len(model.state_dict()) - 2
    assert torch.equal(target.blocks[0].weight, model.blocks[0].weight)
    assert torch.equal(target.blocks[1].bias, before_bias)
    assert target.embed.weight.shape == (100, 64) and torch.equal(target.embed.weight, before_embed)
    assert not hasattr(target, "extra")


# -- stats and logs ------------------------------------------------------------------


def _load_lines(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "tensorstream.load" and r.levelno == level]


def test_one_info_line_and_stats_per_load_over_http(
    tmp_path: Path, served: Any, http_server: HTTPTestServer, caplog: pytest.LogCaptureFixture,
) -> None:
    model = _model(hidden=256)
    serialize(model, tmp_path / "m.tensors")
    size = (tmp_path / "m.tensors").stat().st_size
    uri = served("m.tensors", tmp_path / "m.tensors") + "?X-Amz-Signature=s3cr3tsig"
    http_server.faults.status_script = [503]  # one retry, counted
    caplog.set_level(logging.DEBUG, logger="tensorstream")
    with deserialize(uri, "cpu", backoff_initial=0.01) as sd:
        stats = sd.stats
        assert len(sd) == len(model.state_dict())
    info = _load_lines(caplog, logging.INFO)
    assert len(info) == 1, info
    line = info[0]
    assert "s3cr3tsig" not in caplog.text
    assert isinstance(stats, LoadStats)
    assert stats.uri in line and "X-Amz-Signature" in stats.uri
    assert stats.bytes >= size - 4096 and stats.seconds > 0 and stats.gb_per_s > 0
    assert stats.retries == 1 and stats.requests >= 2
    assert stats.path.split("+")[0] in ("streamed", "ranged")
    assert stats.readers >= 1 and stats.tensors == len(model.state_dict())
    for needle in (f"{stats.bytes / 1e6:.1f} MB", "GB/s", f"path={stats.path}",
                   f"readers={stats.readers}", f"requests={stats.requests}", "retries=1"):
        assert needle in line
    debug = _load_lines(caplog, logging.DEBUG)
    assert any("reader(s)" in m and "http provider" in m for m in debug), debug


def test_lazy_load_logs_when_closed_and_local_file_path(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    serialize(_model(), tmp_path / "m.tensors")
    caplog.set_level(logging.INFO, logger="tensorstream.load")
    with deserialize(tmp_path / "m.tensors", "cpu", lazy_load=True) as sd:
        sd["embed.weight"]
        assert _load_lines(caplog, logging.INFO) == []
    (line,) = _load_lines(caplog, logging.INFO)
    assert "path=local-file" in line and str(tmp_path / "m.tensors") in line
    result = load_into_module(_meta(), tmp_path / "m.tensors", "cpu")
    assert result.stats is not None and result.stats.path == "local-file"
    assert result.stats.bytes == (tmp_path / "m.tensors").stat().st_size
    assert len(_load_lines(caplog, logging.INFO)) == 2


# -- errors ----------------------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_cuda_without_cuda_is_one_clear_error_before_any_request(
    tmp_path: Path, served: Any, http_server: HTTPTestServer,
) -> None:
    serialize(_model(), tmp_path / "m.tensors")
    uri = served("m.tensors", tmp_path / "m.tensors")
    http_server.clear_log()
    with pytest.raises(DeviceUnavailableError, match=r"CUDA is not available.*device='cpu'") as info:
        deserialize(uri, "cuda")
    assert isinstance(info.value, errors.ConfigurationError) and isinstance(info.value, ValueError)
    assert isinstance(info.value, RuntimeError)  # what tensorizer raises, and its users catch
    assert http_server.requests == []
    with pytest.raises(DeviceUnavailableError):
        load_into_module(_meta(), uri, "cuda:0")


@pytest.mark.parametrize("default", DEFAULTS)
def test_a_load_under_a_default_device_reads_onto_the_device_asked(
    tmp_path: Path, served: Any, default: str,
) -> None:
    """A model is built under ``with torch.device("meta"):`` (or after
    ``torch.set_default_device``), and the weights are often loaded right there.
    tensorizer's own ``TensorDeserializer(path, device="cpu")`` loads onto the CPU;
    ``deserialize`` of a local file (eager or lazy) and of a remote one (eager) said the
    file was damaged ("not a whole tensorizer file: TypeError: can't convert meta device
    type tensor to numpy"): its memory was allocated on the default device."""
    model = _model(3)
    want = model.state_dict()
    serialize(want, tmp_path / "m.tensors")
    uri = served("m.tensors", tmp_path / "m.tensors")
    for source in (tmp_path / "m.tensors", uri):
        for kw in ({}, {"lazy_load": True}, {"num_readers": 1}, {"verify_hash": True}):
            with default_device(default), deserialize(source, "cpu", **kw) as sd:
                got = dict(sd)
            assert set(got) == set(want), kw
            for k, t in got.items():
                assert t.device.type == "cpu" and torch.equal(t, want[k]), (source, kw, k)
        target = _meta()
        with torch.device("meta"):
            load_into_module(target, source, "cpu")
        assert torch.equal(target.embed.weight, model.embed.weight)


@pytest.mark.parametrize("device", unusable_devices())
def test_a_device_this_torch_cannot_use_is_one_clear_error_before_any_request(
    tmp_path: Path, served: Any, http_server: HTTPTestServer, device: str,
) -> None:
    """``device="mps"`` on a machine without MPS (a name torch knows, a backend it lacks)
    was a ``LoadError`` ("failed in builtins: RuntimeError: PyTorch is not linked with
    support for mps devices") once the file was being read; it is a
    ``DeviceUnavailableError`` before any request, as ``"cuda"`` without CUDA is."""
    serialize(_model(), tmp_path / "m.tensors")
    uri = served("m.tensors", tmp_path / "m.tensors")
    http_server.clear_log()
    for call in (lambda: deserialize(uri, device), lambda: deserialize(uri, device, lazy_load=True),
                 lambda: load_into_module(_meta(), uri, device),
                 lambda: deserialize(tmp_path / "m.tensors", device)):
        with pytest.raises(DeviceUnavailableError,
                           match=f"device='{device}' was requested but this torch cannot use it"):
            call()
    assert http_server.requests == []
    with deserialize(uri, "meta") as sd:  # the meta device is no such device
        assert all(t.is_meta for t in sd.values())


def test_unknown_device_names_the_option(tmp_path: Path) -> None:
    serialize(_model(), tmp_path / "m.tensors")
    with pytest.raises(errors.ConfigurationError, match="device='gpu0'") as info:
        deserialize(tmp_path / "m.tensors", "gpu0")
    # torch.device("gpu0") is a RuntimeError, tensorizer's TensorDeserializer's too
    assert isinstance(info.value, RuntimeError)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
@pytest.mark.parametrize(("device", "shown"), [(0, "0"), (1, "1"), ("cuda", "'cuda'"),
                                               (torch.device("cuda", 1), "'cuda:1'"),
                                               (np.int64(0), "0")])
def test_an_index_is_a_cuda_device_refused_before_any_request_without_cuda(
    tmp_path: Path, served: Any, http_server: HTTPTestServer, device: Any, shown: str,
) -> None:
    """``device=0`` (cuda:0 to torch and to tensorizer's ``TensorDeserializer``) said
    "device=0 is not a torch device" (torch's "Cannot access accelerator device" without
    one); it is told as ``'cuda'`` is, before any request."""
    serialize(_model(), tmp_path / "m.tensors")
    uri = served("m.tensors", tmp_path / "m.tensors")
    http_server.clear_log()
    for call in (lambda: deserialize(uri, device), lambda: deserialize(uri, device, lazy_load=True),
                 lambda: load_into_module(_meta(), uri, device),
                 lambda: deserialize(tmp_path / "m.tensors", device=device)):
        with pytest.raises(DeviceUnavailableError,
                           match=f"device={re.escape(shown)} was requested but CUDA is not "
                                 "available.*device='cpu'"):
            call()
    assert http_server.requests == []


@pytest.mark.parametrize(("device", "message"), [
    (True, "device=True is a bool, not a device"),
    (False, "device=False is a bool, not a device"),
    (-1, r"device=-1 is not a device index \(an index is 0 or more\)"),
    (1.5, "device=1.5 is not a torch device"),
    (np.False_, "device=False is a bool, not a device"),
    (np.int32(-2), r"device=-2 is not a device index \(an index is 0 or more\)"),
])
def test_a_bool_or_a_negative_index_is_not_a_device(tmp_path: Path, device: Any,
                                                    message: str) -> None:
    """``True`` is an int to Python but no index (torch refuses it too): each is said
    with what to pass instead, as the ConfigurationError and RuntimeError it was."""
    serialize(_model(), tmp_path / "m.tensors")
    for call in (lambda: deserialize(tmp_path / "m.tensors", device),
                 lambda: load_into_module(_meta(), tmp_path / "m.tensors", device)):
        with pytest.raises(DeviceUnavailableError, match=message + ".*an index N") as info:
            call()
        assert isinstance(info.value, errors.ConfigurationError)
        assert isinstance(info.value, RuntimeError)


@pytest.mark.parametrize("device", ["cpu", "cpu:0", torch.device("cpu")])
def test_every_cpu_spelling_loads(tmp_path: Path, device: Any) -> None:
    model = _model(5)
    serialize(model, tmp_path / "m.tensors")
    with deserialize(tmp_path / "m.tensors", device) as sd:
        assert all(t.device.type == "cpu" for t in sd.values())
        assert torch.equal(sd["embed.weight"], model.embed.weight)
    target = _meta()
    load_into_module(target, tmp_path / "m.tensors", device)
    assert torch.equal(target.blocks[1].weight, model.blocks[1].weight)


def test_a_torch_failure_names_the_package_it_came_from(tmp_path: Path) -> None:
    """torch raises builtin exceptions: a cast tensorizer cannot make said "loading ...
    failed in builtins: RuntimeError: ..."; it names the package where it was raised."""
    serialize(_model(), tmp_path / "m.tensors")
    with pytest.raises(LoadError, match=r"m\.tensors failed in torch: RuntimeError: Only Tensors"):
        deserialize(tmp_path / "m.tensors", "cpu", dtype=torch.int32)


def test_torch_failures_become_load_errors_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A GPU running out of memory cannot be produced on CPU CI: torch's own
    # exception is raised where tensorizer allocates, the translation is real.
    from tensorstream.tensorizer.hook import StreamTensorDeserializer

    serialize(_model(), tmp_path / "m.tensors")

    def oom(self: Any, keys: Any, verify_hash: Any = None) -> Any:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(StreamTensorDeserializer, "_bulk_load", oom)
    with pytest.raises(LoadError, match="out of memory while loading") as info:
        deserialize(tmp_path / "m.tensors", "cpu")
    assert str(tmp_path / "m.tensors") in str(info.value)
    assert isinstance(info.value, RuntimeError) and isinstance(info.value, errors.TensorstreamError)
    assert isinstance(info.value.__cause__, torch.OutOfMemoryError)

    secret = "S3CRET" + "SIG"  # built here so the traceback's source lines do not hold it

    def leaky(self: Any, keys: Any, verify_hash: Any = None) -> Any:
        raise RuntimeError(f"fetch of https://h.example/m?X-Amz-Signature={secret} failed")

    monkeypatch.setattr(StreamTensorDeserializer, "_bulk_load", leaky)
    with pytest.raises(LoadError, match=r"loading .* failed") as info:
        deserialize(tmp_path / "m.tensors", "cpu")
    import traceback

    shown = "".join(traceback.format_exception(info.value)) + repr(info.value.__cause__)
    assert secret not in shown and "X-Amz-Signature" in shown


def test_wrong_arguments_are_named(tmp_path: Path) -> None:
    serialize(_model(), tmp_path / "m.tensors")
    with pytest.raises(errors.ConfigurationError, match="dtype='half-ish' is not a torch dtype"):
        deserialize(tmp_path / "m.tensors", "cpu", dtype="half-ish")
    for wrong_kind in (5, object(), torch.float16.itemsize):
        # tensorizer raises TypeError for a dtype that is no dtype: still one here
        with pytest.raises(InvalidArgumentError, match="is not a torch dtype") as info:
            deserialize(tmp_path / "m.tensors", "cpu", dtype=wrong_kind)
        assert isinstance(info.value, errors.ConfigurationError)
    with deserialize(tmp_path / "m.tensors", "cpu", dtype="float16") as sd:  # a name works
        assert sd["embed.weight"].dtype == torch.float16
    with pytest.raises(InvalidArgumentError, match="not int") as info:
        serialize(42, tmp_path / "x.tensors")  # type: ignore[arg-type]
    assert isinstance(info.value, TypeError) and isinstance(info.value, errors.TensorstreamError)
    assert not (tmp_path / "x.tensors").exists()
    with pytest.raises(InvalidArgumentError, match="not dict"):
        load_into_module({"a": 1}, tmp_path / "m.tensors")  # type: ignore[arg-type]


def test_an_open_file_object_is_told_where_it_can_go(tmp_path: Path) -> None:
    # TensorDeserializer reads any binary file object; deserialize() said only "expected
    # a URI string or path, got BufferedReader" (a ValueError, for an argument of the
    # wrong kind).
    import io

    serialize(_model(), tmp_path / "m.tensors")
    with open(tmp_path / "m.tensors", "rb") as f:
        for source in (f, io.BytesIO(b"x")):
            for front in (lambda s: deserialize(s, "cpu"),
                          lambda s: load_into_module(_meta(), s, "cpu")):
                with pytest.raises(InvalidArgumentError,
                                   match=r"not a (BufferedReader|BytesIO).*TensorDeserializer"
                                   ) as info:
                    front(source)
                assert isinstance(info.value, TypeError)
                assert isinstance(info.value, errors.InvalidURIError)  # as it was
