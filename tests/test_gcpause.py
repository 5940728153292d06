"""The collector is paused while a load builds its tensors, and only then:
nested and overlapping loads resume it when the last one ends, a collector the
caller disabled stays disabled, a failed load resumes it too. Through the
front doors (``deserialize``, ``safetensors.load``) over a real HTTP server
and a local file: no automatic collection runs inside a load of many tensors
even with a threshold of one allocation."""

from __future__ import annotations

import gc
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

import tensorstream
from reliability_helpers import run_python
from tensor_files import tensorizer_bytes
from tensorstream import _gcpause
from tensorstream import safetensors as ts_safetensors
from tensorstream.testing.http_server import HTTPTestServer


@pytest.fixture(autouse=True)
def _collector_restored() -> Iterator[None]:
    enabled, threshold = gc.isenabled(), gc.get_threshold()
    yield
    gc.set_threshold(*threshold)
    (gc.enable if enabled else gc.disable)()


def test_paused_inside_and_resumed_after() -> None:
    gc.enable()
    with _gcpause.paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_nested_and_overlapping_loads_resume_when_the_last_ends() -> None:
    gc.enable()
    inside, leave = threading.Event(), threading.Event()

    def other_load() -> None:
        with _gcpause.paused():
            inside.set()
            leave.wait(10)

    t = threading.Thread(target=other_load)
    with _gcpause.paused():
        t.start()
        assert inside.wait(10)
        with _gcpause.paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # (the inner one ended; two still run)
    assert not gc.isenabled()  # the other thread's load still runs
    leave.set()
    t.join(10)
    assert gc.isenabled()


def test_a_collector_the_caller_disabled_stays_disabled() -> None:
    gc.disable()
    with _gcpause.paused():
        pass
    assert not gc.isenabled()


def test_a_failed_load_resumes_it() -> None:
    gc.enable()
    with pytest.raises(ValueError), _gcpause.paused():
        raise ValueError("the load failed")
    assert gc.isenabled()


def _state(count: int = 300) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(5)
    return {f"t{i}": torch.randn(16 + i % 7, 33, generator=gen) for i in range(count)}


def _collections_during(load: Any) -> tuple[Any, int]:
    """``load()``'s result and how many automatic collections ran inside it (with
    a threshold of one allocation, hundreds would run if nothing paused them)."""
    seen = 0

    def count(phase: str, info: dict[str, Any]) -> None:
        nonlocal seen
        if phase == "start":
            seen += 1

    load()  # (first use imports modules and builds caches: not the load's own work)
    gc.enable()
    gc.set_threshold(1, 1, 1)
    gc.callbacks.append(count)
    try:
        out = load()
    finally:
        gc.callbacks.remove(count)
        gc.set_threshold(700, 10, 10)
    return out, seen


def _same(got: Any, state: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(state)
    for name, want in state.items():
        assert torch.equal(got[name], want), name


@pytest.mark.parametrize("where", ["http", "local"])
def test_deserialize_runs_no_collection_while_it_builds_the_tensors(
        where: str, http_server: HTTPTestServer, tmp_path: Path) -> None:
    state = _state()
    data = tensorizer_bytes(state, tmp_path)
    if where == "http":
        key = f"gcpause-{os.urandom(4).hex()}.tensors"
        http_server.put(key, data)
        uri = http_server.url(key)
    else:
        uri = str(tmp_path / "state.tensors")
    d, seen = _collections_during(lambda: tensorstream.deserialize(uri, device="cpu"))
    try:
        _same(d, state)
        # Opening the stream and parsing the index run before the pause (a few
        # hundred at most); unpaused, building the tensors ran 3,000-15,000.
        assert seen < 1000, seen
        assert gc.isenabled()
    finally:
        d.close()


@pytest.mark.parametrize("where", ["http", "local"])
def test_safetensors_load_runs_no_collection_while_it_builds_the_tensors(
        where: str, http_server: HTTPTestServer, tmp_path: Path) -> None:
    state = _state()
    path = tmp_path / "m.safetensors"
    save_file(state, str(path))
    if where == "http":
        key = f"gcpause-{os.urandom(4).hex()}.safetensors"
        http_server.put(key, path.read_bytes())
        uri = http_server.url(key)
    else:
        uri = str(path)
    sd, seen = _collections_during(lambda: ts_safetensors.load(uri, "cpu"))
    _same(sd, state)
    assert seen < 1000, seen
    assert gc.isenabled()


_FORK_DURING_LOAD = r"""
import gc, json, os, sys, threading, time
import tensorstream.safetensors as ts_safetensors
from tensorstream import _gcpause
url, local, enabled = sys.argv[1], sys.argv[2], sys.argv[3] == "on"
(gc.enable if enabled else gc.disable)()
loaded = []
t = threading.Thread(target=lambda: loaded.append(len(ts_safetensors.load(url, "cpu"))))
t.start()
deadline = time.monotonic() + 30
while not _gcpause._holders and time.monotonic() < deadline:  # until the load has paused it
    time.sleep(0.001)
r, w = os.pipe()
pid = os.fork()
if pid == 0:  # the load's thread is the parent's: it does not exist here
    out = {"at_start": gc.isenabled()}
    out["tensors"] = len(ts_safetensors.load(local, "cpu"))
    out["after_own_load"] = gc.isenabled()
    os.write(w, json.dumps(out).encode())
    os._exit(0)
os.close(w)
os.waitpid(pid, 0)
child = json.loads(os.read(r, 1 << 16) or b"{}")
t.join(60)
print(json.dumps({"child": child, "parent": gc.isenabled(), "loaded": loaded}))
"""


@pytest.mark.parametrize("collector", ["on", "off"])
def test_a_child_forked_during_a_load_collects_garbage(tmp_path: Path, collector: str) -> None:
    """A process forked (``multiprocessing``'s fork, a DataLoader's workers) while
    another thread loads: the child's collector runs as the parent's did before
    the load, and after the child's own loads too (one the program turned off
    stays off). It stayed disabled for the child's life (the parent's load, which
    would have resumed it, does not go on there)."""
    state = _state(40)
    path = tmp_path / "m.safetensors"
    save_file(state, str(path))
    data = path.read_bytes()
    with HTTPTestServer() as server:
        server.put("slow.safetensors", data)
        server.faults.rate_limit = max(1, len(data) // 2)  # the load takes ~2 s
        proc = run_python(_FORK_DURING_LOAD, timeout=90,
                          args=[server.url("slow.safetensors"), str(path), collector])
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    on = collector == "on"
    assert out == {"child": {"at_start": on, "tensors": 40, "after_own_load": on},
                   "parent": on, "loaded": [40]}, out
