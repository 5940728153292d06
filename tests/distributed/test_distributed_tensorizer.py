"""tensorizer loads shared by a gloo group: 2 and 4 spawned ranks against the real
HTTP test server, moto S3 and redis-server; bytes counted by a TCP proxy in front
of each server; failures of one rank raised on every rank."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from dist_scenarios import break_rank, digest, peak_rss, steps

import tensorstream
from fixtures_s3 import S3_BUCKET
from tensor_files import tensorizer_bytes
from tensorstream.testing.distributed import run_ranks
from tensorstream.testing.proxy import TCPFaultProxy

#: What one rank may pull besides its share: the file's header and tensor index
#: (tensorizer reserves 256 KiB for it here), and request/response headers.
SLACK_PER_RANK = 320 << 10


def _state() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(20)
    sizes = [65536] * 12 + [393216, 3, 1000, 131072]  # one tensor larger than a 4-rank share
    return {f"layer{i}.w": torch.randn(n, generator=gen) for i, n in enumerate(sizes)}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, dict[str, str]]:
    state = _state()
    data = tensorizer_bytes(state, tmp_path_factory.mktemp("dist"))
    return data, {k: digest(v) for k, v in state.items()}


class Target:
    """One object on one server, reached through a byte-counting proxy."""

    def __init__(self, label: str, uri: str, options: dict[str, Any], proxy: TCPFaultProxy,
                 size: int) -> None:
        self.label, self.uri, self.options, self.proxy, self.size = label, uri, options, proxy, size

    def step(self, **extra: Any) -> dict[str, Any]:
        return {"label": self.label, "uri": self.uri, "options": self.options, **extra}


@pytest.fixture(scope="module")
def targets(model: tuple[bytes, dict[str, str]], http_server: Any, moto_s3: Any,
            redis_server: Any) -> Iterator[dict[str, Target]]:
    data, _ = model
    key = f"dist-{uuid.uuid4().hex}.tensors"
    http_server.put(key, data)
    moto_s3.put(S3_BUCKET, key, data)
    redis_server.put(key, data)
    proxies = {name: TCPFaultProxy("127.0.0.1", port).start() for name, port in
               (("http", http_server.port), ("s3", moto_s3.port), ("redis", redis_server.port))}
    try:
        out = {
            "http": Target("http", f"http://127.0.0.1:{proxies['http'].port}/{key}", {},
                           proxies["http"], len(data)),
            "s3": Target("s3", f"s3://{S3_BUCKET}/{key}",
                         moto_s3.options(s3_endpoint=f"http://127.0.0.1:{proxies['s3'].port}"),
                         proxies["s3"], len(data)),
            "redis": Target("redis", f"redis://127.0.0.1:{proxies['redis'].port}/{key}", {},
                            proxies["redis"], len(data)),
        }
        yield out
    finally:
        for proxy in proxies.values():
            proxy.stop()


def _check_loaded(results: list[Any], label: str, expected: dict[str, str]) -> None:
    for r in results:
        got = r.value[label]
        assert "error" not in got, (r.rank, got)
        assert got["digests"] == expected, f"rank {r.rank} {label}: tensors differ"


def _check_one_copy(target: Target, world: int) -> None:
    pulled = target.proxy.faults.bytes_down
    assert target.size <= pulled <= target.size + world * SLACK_PER_RANK, (
        f"{target.label}: the group pulled {pulled} bytes for a {target.size}-byte object "
        f"({pulled / target.size:.2f} copies)")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_ranks_http_s3_redis(targets: dict[str, Target], model: tuple[bytes, dict[str, str]],
                                 http_server: Any, tmp_path: Any) -> None:
    """Each backend loaded once by 2 ranks; a rank template still gives each rank
    its own file; load_into_module takes group= too."""
    _, expected = model
    shard_digests = []
    prefix = f"shard-{uuid.uuid4().hex}"
    for r in range(2):
        state = {"w": torch.full((1000,), float(r)), "b": torch.arange(r + 3.0)}
        http_server.put(f"{prefix}-{r:03d}.tensors", tensorizer_bytes(state, tmp_path))
        shard_digests.append({k: digest(v) for k, v in state.items()})
    sharded_uri = http_server.url(f"{prefix}-%03d.tensors")
    key = bytes(range(32))
    encrypted = tmp_path / "encrypted.tensors"
    tensorstream.serialize(_state(), encrypted, encryption=key)
    plain = tmp_path / "plain.tensors"
    plain.write_bytes(model[0])
    single = tensorstream.deserialize(targets["http"].uri, device="cpu")
    assert {k: digest(single[k]) for k in single} == expected
    single.close()
    for t in targets.values():
        t.proxy.faults.reset()
    shapes = {k: list(v.shape) for k, v in _state().items()}
    todo = [t.step() for t in targets.values()] + [
        {"label": "sharded", "uri": sharded_uri},
        {"label": "module", "kind": "module", "uri": targets["redis"].uri, "shapes": shapes},
        # rank 1's module lacks a tensor: it refused while rank 0 went on (and would wait
        # at its next collective); every rank raises now
        {"label": "module-differs", "kind": "module", "uri": str(plain),
         "shapes": [shapes, {k: v for k, v in shapes.items() if k != sorted(shapes)[0]}]},
        # decryption, hashes and filter_func behave as in a load of its own
        {"label": "encrypted", "uri": str(encrypted),
         "kwargs": {"encryption": key, "verify_hash": True}},
        {"label": "wrong-key", "uri": str(encrypted), "kwargs": {"encryption": bytes(32)}},
        {"label": "filtered", "uri": str(plain), "kwargs": {"filter_func": "only_layer1"}},
    ]
    results = run_ranks(steps, 2, todo, timeout=240)
    assert all(r.ok for r in results), [(r.rank, r.error, r.traceback) for r in results]
    for r in results:  # a rank template: each rank read its own file
        assert r.value["sharded"]["digests"] == shard_digests[r.rank], r.value["sharded"]
        assert r.value["module"]["digests"] == expected
        assert r.value["module"]["loaded"] == len(expected)
        differs = r.value["module-differs"]
        assert "DistributedLoadError" in differs["types"] and differs["failed_ranks"] == [1]
        assert "ModuleMismatchError" in differs["error"], differs
        assert r.value["encrypted"]["digests"] == expected  # a local file, decrypted, verified
        wrong = r.value["wrong-key"]
        assert "DistributedLoadError" in wrong["types"] and wrong["failed_ranks"] == [0, 1]
        assert "DecryptionError" in wrong["error"], wrong
        assert r.value["filtered"].get("digests") == {
            k: v for k, v in expected.items() if k.startswith("layer1")}, r.value["filtered"]
    for name, t in targets.items():
        _check_loaded(results, name, expected)
        if name != "redis":  # the Redis proxy also carried load_into_module
            _check_one_copy(t, 2)
        for r in results:
            stats = r.value[name]["stats"]
            assert stats["path"] == "group", stats
            assert stats["bytes"] < t.size * 0.75  # this rank pulled about half


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_four_ranks_and_collective_failures(targets: dict[str, Target],
                                            model: tuple[bytes, dict[str, str]]) -> None:
    """4 ranks in one spawn: each backend loaded once by the group; then one rank
    asks for a missing object (every rank raises, naming it); a group of one is
    a load of its own; load_into_module shares the load too."""
    _, expected = model
    for t in targets.values():
        t.proxy.faults.reset()
    http = targets["http"]
    missing = http.uri.rsplit("/", 1)[0] + "/no-such-object.tensors"
    todo = [t.step() for t in targets.values()] + [
        {"label": "one-missing", "uri": [http.uri, missing, http.uri, http.uri]},
        {"label": "solo", "uri": http.uri, "group": "solo"},
        {"label": "after-failure", "uri": http.uri},
    ]
    results = run_ranks(steps, 4, todo, timeout=240)
    assert all(r.ok for r in results), [(r.rank, r.error, r.traceback) for r in results]
    for name, t in targets.items():
        _check_loaded(results, name, expected)
        if name != "http":  # the HTTP proxy also carried the steps below
            _check_one_copy(t, 4)
    for r in results:
        failed = r.value["one-missing"]
        assert "DistributedLoadError" in failed["types"] and "LoadError" in failed["types"]
        assert failed["failed_ranks"] == [1], failed
        assert "rank 1: NotFoundError" in failed["error"], failed
        assert failed["seconds"] < 20
        assert r.value["solo"]["digests"] == expected
        assert not r.value["solo"]["stats"]["path"].startswith("group"), r.value["solo"]
        assert r.value["after-failure"]["digests"] == expected  # the group still works


@pytest.mark.timeout(120)
def test_a_file_larger_than_memory_past_its_tensors_loads_holding_only_its_tensors(
        model: tuple[bytes, dict[str, str]], tmp_path: Path) -> None:
    """A 1 TiB object (sparse here; a server's Content-Length alike) whose tensors
    end in its first MB: the group held the whole file and refused it; it holds
    the bytes tensorizer reads now, as a load without group= does. A file whose
    tensors do not fit is still refused:
    tests/distributed/test_distributed_filtered.py."""
    path = tmp_path / "huge.tensors"
    with open(path, "wb") as f:
        f.write(model[0])
        f.truncate(1 << 40)
    results = run_ranks(steps, 2, [{"label": "huge", "uri": str(path)}], timeout=90)
    assert all(r.ok for r in results), [(r.rank, r.error, r.traceback) for r in results]
    for r in results:
        assert r.value["huge"].get("digests") == model[1], r.value["huge"]


@pytest.mark.timeout(120)
@pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK),
                    reason="needs /proc/self/clear_refs to reset the peak RSS")
def test_each_rank_holds_at_most_twice_the_model_during_a_group_load(tmp_path: Path) -> None:
    """docs/distributed.md: a CPU load holds the group's buffer of the file's bytes and
    the tensors built from it, so host memory peaks near twice the model, plus at most
    one 64 MiB staging buffer for the exchange. Measured per rank (peak RSS, reset
    before the load) for a 46 MiB model on 2 gloo ranks: at most twice the model and
    48 MiB (measured: 91.7 MiB on each rank; the same load without group=: 46.1 MiB)."""
    mib = 1 << 20
    gen = torch.Generator().manual_seed(3)
    state = {f"t{i}": torch.randn(n, generator=gen)
             for i, n in enumerate([4 * mib, 4 * mib, 3 * mib, mib // 4, 1000] + [5000] * 40)}
    path = tmp_path / "m.tensors"
    path.write_bytes(tensorizer_bytes(state, tmp_path))
    model = sum(t.numel() * t.element_size() for t in state.values())
    del state
    results = run_ranks(peak_rss, 2, str(path), "auto", timeout=90)
    assert all(r.ok for r in results), [(r.rank, r.error, r.traceback) for r in results]
    for r in results:
        grew = r.value["peak"] - r.value["before"]
        assert r.value["held"] == model, r.value
        assert model <= grew <= 2 * model + 48 * mib, (r.rank, grew / mib, model / mib)


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["exit", "hang", "exit-in-exchange"])
def test_a_rank_that_dies_or_hangs_fails_the_others_in_bounded_time(
        targets: dict[str, Target], how: str) -> None:
    """Rank 1 exits (os._exit) or stops answering while reading its share: the
    other ranks raise DistributedLoadError (gloo sees the closed connection at
    once; a silent rank trips group_timeout=3) instead of waiting forever."""
    step = targets["http"].step(kwargs={"group_timeout": 3.0})
    results = run_ranks(break_rank, 3, step, 1, how, timeout=60)
    for r in (results[0], results[2]):
        assert r.raised("DistributedLoadError"), (r.rank, r.error, r.traceback)
        assert r.seconds < 9, r.seconds
        assert not r.hung
    assert results[1].value is None and not results[1].hung


@pytest.mark.cuda
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                    reason="NCCL needs two CUDA devices (one per rank)")
def test_two_ranks_nccl_to_cuda(targets: dict[str, Target],
                                model: tuple[bytes, dict[str, str]]) -> None:
    """NCCL: the shares travel through the CUDA staging buffer; each rank's tensors
    land on its own GPU, identical to a single-process load."""
    _, expected = model
    http = targets["http"]
    http.proxy.faults.reset()
    todo = [{"label": "cuda", "uri": http.uri, "device": "cuda:{rank}"}]
    results = run_ranks(steps, 2, todo, timeout=240, backend="nccl")
    assert all(r.ok for r in results), [(r.rank, r.error, r.traceback) for r in results]
    _check_loaded(results, "cuda", expected)
    _check_one_copy(http, 2)


@pytest.mark.timeout(120)
def test_a_key_file_one_rank_cannot_read_fails_every_rank(
        model: tuple[bytes, dict[str, str]], tmp_path: Path) -> None:
    """Rank 1's key file is missing (a node without it, another rank's credentials):
    reading it raised NotFoundError on rank 1 alone, before the group's first
    collective, so rank 1 went on to its next load and rank 0's first collective
    was answered by that load's ("the ranks do not see the same object", then a
    broken group). Every rank raises DistributedLoadError naming rank 1's error
    now, and the group still loads afterwards."""
    from tensorstream.tensorizer import Encryption

    key = bytes(range(32))
    (tmp_path / "good.key").write_bytes(key)
    encrypted = tmp_path / "encrypted.tensors"
    tensorstream.serialize(_state(), encrypted, encryption=key)
    plain = tmp_path / "plain.tensors"
    plain.write_bytes(model[0])
    todo = [
        {"label": "key", "uri": str(encrypted),
         "kwargs": [{"encryption": Encryption(keyfile=str(tmp_path / "good.key"))},
                    {"encryption": Encryption(keyfile=str(tmp_path / "missing.key"))}]},
        {"label": "after", "uri": str(plain)},
    ]
    results = run_ranks(steps, 2, todo, timeout=90, group_timeout=20)
    assert all(r.ok for r in results), [(r.rank, r.error, r.traceback) for r in results]
    for r in results:
        failed = r.value["key"]
        assert "DistributedLoadError" in failed.get("types", []), (r.rank, failed)
        assert failed["failed_ranks"] == [1], (r.rank, failed)
        assert "rank 1: NotFoundError" in failed["error"], failed
        assert "missing.key" in failed["error"], failed
        assert r.value["after"].get("digests") == model[1], (r.rank, r.value["after"])


@pytest.mark.timeout(120)
def test_a_rank_without_the_key_or_with_another_fails_every_rank_saying_so(
        model: tuple[bytes, dict[str, str]], tmp_path: Path) -> None:
    """An encrypted file loaded by a group where one rank gave no key: every rank raised
    DistributedLoadError quoting tensorizer's bare "rank 1: CryptographyError: Tensor is
    encrypted, but decryption was not requested" (a load of its own says the file is
    encrypted and how to pass the key). It says so now, and the neighbours keep their
    words: a wrong key, a key for a file that is not encrypted, no key on any rank."""
    from tensorstream.tensorizer import Encryption

    (tmp_path / "good.key").write_bytes(bytes(range(32)))
    (tmp_path / "wrong.key").write_bytes(bytes(32))
    encrypted = tmp_path / "encrypted.tensors"
    tensorstream.serialize(_state(), encrypted, encryption=bytes(range(32)))
    plain = tmp_path / "plain.tensors"
    plain.write_bytes(model[0])
    good, wrong = (Encryption(keyfile=str(tmp_path / n)) for n in ("good.key", "wrong.key"))
    todo = [
        {"label": "none-on-1", "uri": str(encrypted), "kwargs": [{"encryption": good}, {}]},
        {"label": "none", "uri": str(encrypted)},
        {"label": "wrong-on-1", "uri": str(encrypted),
         "kwargs": [{"encryption": good}, {"encryption": wrong}]},
        {"label": "plain-keyed-on-0", "uri": str(plain), "kwargs": [{"encryption": good}, {}]},
        {"label": "after", "uri": str(encrypted), "kwargs": {"encryption": good}},
    ]
    results = run_ranks(steps, 2, todo, timeout=90, group_timeout=20)
    assert all(r.ok for r in results), [(r.rank, r.error, r.traceback) for r in results]
    told = {"none-on-1": ([1], "rank 1: DecryptionError: "),
            "none": ([0, 1], "rank 1: DecryptionError: "),
            "wrong-on-1": ([1], "rank 1: DecryptionError: could not decrypt"),
            "plain-keyed-on-0": ([0], "rank 0: DecryptionError: ")}
    for r in results:
        for label, (ranks, said) in told.items():
            failed = r.value[label]
            assert "DistributedLoadError" in failed.get("types", []), (r.rank, label, failed)
            assert failed["failed_ranks"] == ranks, (r.rank, label, failed)
            assert said in failed["error"] and "CryptographyError" not in failed["error"], failed
        for label in ("none-on-1", "none"):
            assert "is encrypted and no key was given" in r.value[label]["error"]
        assert "wrong key or passphrase" in r.value["wrong-on-1"]["error"]
        assert "is not encrypted, but a key was given" in r.value["plain-keyed-on-0"]["error"]
        assert "digests" in r.value["after"], (r.rank, r.value["after"])


@pytest.mark.timeout(120)
def test_a_tensorizer_config_shares_a_load_with_group(
        model: tuple[bytes, dict[str, str]], tmp_path: Path) -> None:
    """TensorizerConfig(...).deserialize(device, group="auto") (vLLM's settings, one file
    for the group) was refused on every rank: the config filled the rank template itself
    and said "world size is 2 but ... has no rank template". It is a group load now; a
    templated config still gives each rank its own file."""
    plain = tmp_path / "plain.tensors"
    plain.write_bytes(model[0])
    shard_digests = []
    for r in range(2):
        state = {"w": torch.full((10,), float(r))}
        (tmp_path / f"shard-{r:03d}.tensors").write_bytes(tensorizer_bytes(state, tmp_path))
        shard_digests.append({k: digest(v) for k, v in state.items()})
    todo = [{"label": "config", "kind": "config", "uri": str(plain)},
            {"label": "sharded", "kind": "config", "uri": str(tmp_path / "shard-%03d.tensors")}]
    results = run_ranks(steps, 2, todo, timeout=90, group_timeout=20)
    assert all(r.ok for r in results), [(r.rank, r.error, r.traceback) for r in results]
    for r in results:
        got = r.value["config"]
        assert got.get("digests") == model[1], (r.rank, got)
        assert got["stats"]["path"] == "group", got["stats"]
        assert r.value["sharded"].get("digests") == shard_digests[r.rank], r.value["sharded"]


GIB = 1 << 30


def test_a_group_buffer_and_the_tensors_beside_it_are_checked_as_one_sum() -> None:
    """A group load onto the CPU holds the file's bytes (its buffer) and the tensors built
    from them at once; each was compared with the memory available alone, so 6 GiB of
    buffer and 6 GiB of tensors passed both checks with 10 GiB available. Their sum is
    refused now, in the words of a refused group load; tensors elsewhere (``beside=0``: a
    GPU, or ``max_tensor_bytes=`` vouching for them) leave the buffer alone as before."""
    from tensorstream.distributed.tensorizer import check_buffer

    with pytest.raises(tensorstream.errors.InsufficientMemoryError) as info:
        check_buffer(6 * GIB, 6 * GIB, "s3://b/m.tensors", 3, available=10 * GIB)
    said = str(info.value)
    assert said.startswith("s3://b/m.tensors: its 3 tensor(s) to load claim 12884901888 bytes "
                           "(12 GiB) with the file's headers (a group load holds them in "
                           "memory; 6442450944 bytes (6 GiB) of it for the tensors built from "
                           "them, held at once), more than the 10737418240 bytes (10 GiB) cpu "
                           "memory available; nothing was allocated."), said
    assert "load it without group=" in said
    assert info.value.claimed == 12 * GIB and info.value.limit == 10 * GIB
    check_buffer(6 * GIB, 0, "s3://b/m.tensors", 3, available=10 * GIB)
    check_buffer(6 * GIB, 4 * GIB, "s3://b/m.tensors", 3, available=10 * GIB)
    with pytest.raises(tensorstream.errors.InsufficientMemoryError, match="claim 11811160064 "
                       r"bytes \(11 GiB\) with the file's headers \(a group load holds them "
                       r"in memory\), more than"):
        check_buffer(11 * GIB, 0, "s3://b/m.tensors", 3, available=10 * GIB)


def test_only_tensors_on_the_cpu_without_an_allowance_are_summed_with_the_buffer() -> None:
    from tensorstream.tensorizer.deserializing import _held_beside

    assert _held_beside(5 * GIB, torch.device("cpu"), None) == 5 * GIB
    assert _held_beside(5 * GIB, torch.device("cuda", 0), None) == 0
    assert _held_beside(5 * GIB, torch.device("cpu"), 8 * GIB) == 0
