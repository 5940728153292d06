"""tensorstream.safetensors onto a device: every spelling of one, a default device, CUDA
(and its absence said before any read), and arguments that make no sense refused before
reading."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import tensorstream
from tensorstream.errors import ConfigurationError

torch = pytest.importorskip("torch")
st_torch = pytest.importorskip("safetensors.torch")
np = pytest.importorskip("numpy")

from tensor_files import same_bytes  # noqa: E402  (needs torch)
from torch_devices import DEFAULTS, default_device, unusable_devices  # noqa: E402  (needs torch)

ts_st = tensorstream.safetensors


@pytest.mark.parametrize("device", ["gpu", "", "cuda:x"])
def test_a_device_torch_does_not_know_is_a_configuration_error(tmp_path: Path,
                                                               device: str) -> None:
    """As the tensorizer loaders say it; torch's bare RuntimeError named no option."""
    path = tmp_path / "d.safetensors"
    ts_st.save({"a": torch.ones(2)}, path)
    calls = [lambda: ts_st.load(path, device), lambda: ts_st.open(path, device),
             lambda: list(ts_st.iter_tensors(path, device))]
    for call in calls:
        with pytest.raises(ConfigurationError, match=f"device={device!r} is not a torch device"):
            call()


@pytest.mark.parametrize("default", DEFAULTS)
def test_a_load_under_a_default_device_reads_onto_the_device_asked(
        http_server: Any, http_reset: None, tmp_path: Path, default: str) -> None:
    """A model is built under ``with torch.device("meta"):`` (or after
    ``torch.set_default_device``), and the weights are often loaded right there.
    ``safetensors.torch.load_file`` and ``safe_open`` load onto the CPU as asked;
    ``load``, ``open(...).get_tensor``/``get_slice`` raised torch's bare ``TypeError``
    ("can't convert meta device type tensor to numpy"): their memory was allocated
    on the default device. It is allocated on the CPU, whatever the default."""
    gen = torch.Generator().manual_seed(7)
    tensors = {"a": torch.randn(1000, generator=gen), "b": torch.arange(70000, dtype=torch.int32),
               "c": torch.randn(3, 3, generator=gen).half(), "e": torch.zeros(0, 2)}
    ts_st.save(tensors, tmp_path / "m.safetensors")
    http_server.put("dflt.safetensors", (tmp_path / "m.safetensors").read_bytes())
    for uri, opts in ((tmp_path / "m.safetensors", {}),
                      (http_server.url("dflt.safetensors"), http_server.options)):
        for name in ("load", "load cpu", "iter_tensors", "get_tensor", "get_slice"):
            with default_device(default):
                got = _read_all(name, uri, opts)
            want = {k: v[:2] if name == "get_slice" else v for k, v in tensors.items()}
            assert set(got) == set(want), name
            for k, t in got.items():
                assert t.device.type == "cpu" and same_bytes(t, want[k]), (name, k)


def _read_all(how: str, uri: Any, opts: dict[str, Any]) -> dict[str, Any]:
    """Every tensor of ``uri``, read ``how`` (the first two rows of each for get_slice)."""
    if how == "load":
        return ts_st.load(uri, **opts)
    if how == "load cpu":
        return ts_st.load(uri, "cpu", num_readers=1, **opts)
    if how == "iter_tensors":
        return dict(ts_st.iter_tensors(uri, **opts))
    with ts_st.open(uri, **opts) as f:
        names = f.keys()
        if how == "get_tensor":
            return {k: f.get_tensor(k) for k in names}
        return {k: f.get_slice(k)[:2] for k in names}


@pytest.mark.parametrize("device", unusable_devices())
def test_a_device_this_torch_cannot_use_is_refused_before_reading(
        http_server: Any, http_reset: None, device: str) -> None:
    """``device="mps"`` on a machine without MPS (a name torch knows, a backend it lacks)
    raised torch's bare ``RuntimeError``/``NotImplementedError`` from every loader, after
    the header was read; it is a ``ConfigurationError`` naming the device, before any
    request, as ``"cuda"`` without CUDA is."""
    http_server.put("dev.safetensors", st_torch.save({"a": torch.ones(2)}))
    uri = http_server.url("dev.safetensors")
    http_server.clear_log()
    opts = http_server.options
    calls = [lambda: ts_st.load(uri, device, **opts), lambda: ts_st.open(uri, device, **opts),
             lambda: list(ts_st.iter_tensors(uri, device, **opts))]
    for call in calls:
        with pytest.raises(ConfigurationError,
                           match=f"device='{device}' was requested but this torch cannot use it"):
            call()
    assert http_server.requests == []
    assert ts_st.load(uri, "meta", **opts)["a"].is_meta  # the meta device is no such device


@pytest.mark.parametrize(("option", "value", "message"), [
    ("filter", "a", r"filter='a' is one string; pass a collection of names \(filter=\['a'\]\)"),
    ("filter", b"a", "is one string"),
    ("filter", 5, "filter must be a predicate on tensor names or a collection of names, got int"),
    ("dtype", "float16", "dtype='float16' is not a floating-point torch.dtype"),
    ("dtype", torch.int32, "dtype=torch.int32 is not a floating-point torch.dtype"),
    ("dtype", torch.bool, "dtype=torch.bool is not"),
    ("num_readers", "two", "num_readers must be an integer"),
    ("num_readers", 2.5, "num_readers must be an integer"),
    ("num_readers", True, "num_readers must be an integer"),
])


def test_arguments_that_make_no_sense_are_refused_before_reading(
        tmp_path: Path, option: str, value: Any, message: str) -> None:
    """filter="a" loaded nothing (a string is a collection of its characters);
    dtype="float16" failed after every byte was read, with torch's "Invalid device
    string"; dtype=torch.int32 turned the float weights into integers; num_readers
    of 2.5 or True was taken as is, "two" a bare TypeError. Each is now a
    ConfigurationError naming it, before the file is opened."""
    path = tmp_path / "a.safetensors"
    ts_st.save({"a": torch.ones(2), "b": torch.ones(3)}, path)
    calls = [lambda **kw: ts_st.load(path, **kw),
             lambda **kw: ts_st.load(tmp_path / "missing.safetensors", **kw)]
    if option != "num_readers":  # (iter_tensors takes none)
        calls += [lambda **kw: list(ts_st.iter_tensors(path, **kw)),
                  lambda **kw: list(ts_st.iter_tensors(tmp_path / "missing.safetensors", **kw))]
    for call in calls:
        with pytest.raises(ConfigurationError, match=message):
            call(**{option: value})
    # what makes sense still loads
    assert set(ts_st.load(path, filter=["a"], dtype=torch.float16, num_readers="2")) == {"a"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without CUDA")
def test_cuda_without_cuda_is_a_clear_error_before_reading(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="CUDA is not available"):
        ts_st.load(tmp_path / "not-even-there.safetensors", device="cuda")


def _device_calls(path: Path, device: Any) -> list[Callable[[], Any]]:
    return [lambda: ts_st.load(path, device), lambda: ts_st.open(path, device),
            lambda: list(ts_st.iter_tensors(path, device)),
            lambda: ts_st.load(path, device=device, filter=["a"])]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without CUDA")
@pytest.mark.parametrize(("device", "shown"), [(0, "0"), (1, "1"), ("cuda", "'cuda'"),
                                               ("cuda:1", "'cuda:1'"),
                                               (torch.device("cuda", 0), "'cuda:0'"),
                                               (np.int64(0), "0"), (np.uint8(1), "1")])


def test_an_index_is_a_cuda_device_refused_early_without_cuda(tmp_path: Path, device: Any,
                                                             shown: str) -> None:
    """``device=0`` (an index, as torch and tensorizer take it: cuda:0) said "device=0 is
    not a torch device" (torch's "Cannot access accelerator device" without one); it is
    told as ``'cuda'`` is: CUDA is not available, before anything is read. A numpy integer
    (``np.int64(0)``) is an index too, as torch takes it (it was "not a torch device")."""
    path = tmp_path / "d.safetensors"
    ts_st.save({"a": torch.ones(2)}, path)
    for call in _device_calls(path, device):
        with pytest.raises(ConfigurationError,
                           match=f"device={re.escape(shown)} was requested but CUDA is not "
                                 "available.*device='cpu'"):
            call()
    for call in _device_calls(tmp_path / "missing.safetensors", device):  # nothing is read
        with pytest.raises(ConfigurationError, match="CUDA is not available"):
            call()


@pytest.mark.parametrize(("device", "message"), [
    (True, "device=True is a bool, not a device"),
    (False, "device=False is a bool, not a device"),
    (-1, r"device=-1 is not a device index \(an index is 0 or more\)"),
    (1.0, "device=1.0 is not a torch device"),
    (np.True_, "device=True is a bool, not a device"),
    (np.int64(-1), r"device=-1 is not a device index \(an index is 0 or more\)"),
    (torch.tensor(0), r"device=tensor\(0\) is not a torch device"),  # torch refuses it too
])


def test_a_bool_or_a_negative_index_is_not_a_device(tmp_path: Path, device: Any,
                                                    message: str) -> None:
    """``True`` is an int to Python: it is no index (torch refuses it too). Each is said
    with what to pass instead, before anything is read. numpy's bool and a negative numpy
    integer are said as Python's are (they were "not a torch device")."""
    path = tmp_path / "d.safetensors"
    ts_st.save({"a": torch.ones(2)}, path)
    for call in _device_calls(path, device):
        with pytest.raises(ConfigurationError, match=message + ".*an index N"):
            call()


@pytest.mark.parametrize("device", ["cpu", "cpu:0", torch.device("cpu"), "meta"])
def test_every_cpu_spelling_and_meta_load(tmp_path: Path, device: Any) -> None:
    path = tmp_path / "d.safetensors"
    want = {"a": torch.arange(6.0), "b": torch.ones(2, 3, dtype=torch.int8)}
    ts_st.save(want, path)
    kind = torch.device(device).type
    got = ts_st.load(path, device)
    assert set(got) == set(want) and all(t.device.type == kind for t in got.values())
    if kind == "cpu":
        assert all(torch.equal(got[k], want[k]) for k in want)
    with ts_st.open(path, device) as f:
        assert f.get_tensor("b").device.type == kind
    assert [t.device.type for _, t in ts_st.iter_tensors(path, device)] == [kind, kind]


def test_a_meta_load_reads_the_header_only(http_server: Any, http_reset: None) -> None:
    """``device="meta"`` (tensors without data) read every byte of the file, then dropped
    them: a meta load of a remote checkpoint took as long as a real one (``load``,
    ``iter_tensors``, ``open(...).get_tensor``, ``get_slice``). Only the header's first read is made
    now; names, dtypes, shapes and ``dtype=`` casts are what they were."""
    tensors = {"a": torch.randn(1 << 20), "b": torch.arange(1 << 20, dtype=torch.int32),
               "c": torch.randn(3).half(), "e": torch.zeros(0, 2)}
    http_server.put("meta.safetensors", st_torch.save(tensors))  # 8 MiB
    uri, opts = http_server.url("meta.safetensors"), http_server.options

    def get_each(f: Any) -> dict[str, Any]:
        names = f.keys()
        return {k: f.get_tensor(k) for k in names}

    calls: list[tuple[Callable[[], dict[str, Any]], Any]] = [
        (lambda: ts_st.load(uri, "meta", **opts), None),
        (lambda: ts_st.load(uri, "meta", dtype=torch.float16, **opts), torch.float16),
        (lambda: dict(ts_st.iter_tensors(uri, torch.device("meta"), **opts)), None),
        (lambda: get_each(ts_st.open(uri, "meta", **opts)), None),
        (lambda: {k: ts_st.open(uri, "meta", **opts).get_slice(k)[1:][::2]
                  for k in tensors}, "rows")]
    for call, cast in calls:
        http_server.clear_log()
        got = call()
        if cast == "rows":  # get_slice: the rows it selects
            tensors_now = {k: t[1:][::2] for k, t in tensors.items()}
            cast = None
        else:
            tensors_now = tensors
        assert {k: (t.device.type, t.dtype, t.shape) for k, t in got.items()} == {
            k: ("meta", cast if cast and t.is_floating_point() else t.dtype, t.shape)
            for k, t in tensors_now.items()}
        ends = [int(r.headers["Range"].rpartition("-")[2]) for r in http_server.requests
                if r.method == "GET"]
        assert ends and max(ends) < 1 << 20, ends  # the first MiB: the header's read
    assert same_bytes(ts_st.load(uri, **opts)["b"], tensors["b"])  # the neighbour: the CPU
