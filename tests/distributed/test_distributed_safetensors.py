"""safetensors loads shared by a gloo group: 2 and 4 spawned ranks against the real
HTTP test server, moto S3 and redis-server (one file and an index's shards);
bytes counted by a TCP proxy in front of each server."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from dist_scenarios import break_rank, digest, steps

from fixtures_s3 import S3_BUCKET
from tensorstream.testing.distributed import run_ranks
from tensorstream.testing.proxy import TCPFaultProxy

st_torch = pytest.importorskip("safetensors.torch")

#: Per rank besides its share: the header read (64 KiB) and request/response headers.
SLACK_PER_RANK = 96 << 10


def _state() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(21)
    out = {f"blocks.{i}.w": torch.randn(256, 256, generator=gen) for i in range(10)}
    out["embed"] = torch.randn(1200, 512, generator=gen).to(torch.bfloat16)  # > a 4-rank share
    out["norm"] = torch.ones(7)
    out["steps"] = torch.arange(5)
    out["empty"] = torch.empty(0, 3)
    out["flag"] = torch.tensor(True)
    return out


@pytest.fixture(scope="module")
def files() -> dict[str, Any]:
    state = _state()
    one = st_torch.save(state)
    names = sorted(state)
    halves = [{k: state[k] for k in names[::2]}, {k: state[k] for k in names[1::2]}]
    shards = [st_torch.save(h) for h in halves]
    index = {"metadata": {}, "weight_map": {k: f"model-0000{i + 1}-of-00002.safetensors"
                                            for i, h in enumerate(halves) for k in h}}
    return {"one": one, "shards": shards, "index": json.dumps(index).encode(),
            "digests": {k: digest(v) for k, v in state.items()}}


class Target:
    def __init__(self, label: str, uri: str, options: dict[str, Any], proxy: TCPFaultProxy,
                 size: int) -> None:
        self.label, self.uri, self.options, self.proxy, self.size = label, uri, options, proxy, size

    def step(self, **extra: Any) -> dict[str, Any]:
        return {"label": self.label, "uri": self.uri, "options": self.options,
                "kind": "safetensors", **extra}


@pytest.fixture(scope="module")
def targets(files: dict[str, Any], http_server: Any, moto_s3: Any,
            redis_server: Any) -> Iterator[dict[str, Target]]:
    data = files["one"]
    key = f"dist-{uuid.uuid4().hex}"
    http_server.put(f"{key}/model.safetensors", data)
    for i, shard in enumerate(files["shards"]):
        http_server.put(f"{key}/model-0000{i + 1}-of-00002.safetensors", shard)
    http_server.put(f"{key}/model.safetensors.index.json", files["index"])
    moto_s3.put(S3_BUCKET, f"{key}.safetensors", data)
    redis_server.put(f"{key}.safetensors", data)
    ports = {"http": http_server.port, "s3": moto_s3.port, "redis": redis_server.port,
             "index": http_server.port}
    proxies = {name: TCPFaultProxy("127.0.0.1", port).start() for name, port in ports.items()}
    try:
        yield {
            "http": Target("http", f"http://127.0.0.1:{proxies['http'].port}/{key}/model.safetensors",
                           {}, proxies["http"], len(data)),
            "s3": Target("s3", f"s3://{S3_BUCKET}/{key}.safetensors",
                         moto_s3.options(s3_endpoint=f"http://127.0.0.1:{proxies['s3'].port}"),
                         proxies["s3"], len(data)),
            "redis": Target("redis", f"redis://127.0.0.1:{proxies['redis'].port}/{key}.safetensors",
                            {}, proxies["redis"], len(data)),
            "index": Target("index", f"http://127.0.0.1:{proxies['index'].port}/{key}/"
                            "model.safetensors.index.json", {}, proxies["index"],
                            sum(map(len, files["shards"])) + len(files["index"])),
        }
    finally:
        for proxy in proxies.values():
            proxy.stop()


def _check(results: list[Any], label: str, expected: dict[str, str]) -> None:
    for r in results:
        got = r.value[label]
        assert "error" not in got, (r.rank, got)
        assert got["digests"] == expected, f"rank {r.rank} {label}: tensors differ"


def _check_one_copy(target: Target, world: int, files: int = 1) -> None:
    pulled = target.proxy.faults.bytes_down
    assert target.size <= pulled <= target.size + files * world * SLACK_PER_RANK, (
        f"{target.label}: the group pulled {pulled} bytes for {target.size} bytes "
        f"({pulled / target.size:.2f} copies)")


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [2, 4])
def test_ranks_share_safetensors_loads(targets: dict[str, Target], files: dict[str, Any],
                                       world: int) -> None:
    """Every backend, a sharded checkpoint (index) and iter_tensors: each rank gets
    every tensor byte-identical to safetensors' own, the group pulls one copy;
    then one rank's failure is every rank's DistributedLoadError."""
    expected = files["digests"]
    for t in targets.values():
        t.proxy.faults.reset()
    http = targets["http"]
    missing = http.uri.replace("model.safetensors", "nothing.safetensors")
    todo = [t.step() for t in targets.values()] + [
        {"label": "iter", "kind": "iter", "uri": targets["s3"].uri,
         "options": targets["s3"].options},
        {"label": "filtered", "kind": "safetensors", "uri": http.uri,
         "kwargs": {"filter": ["embed", "norm"]}},
        {"label": "one-missing", "kind": "safetensors",
         "uri": [http.uri] * (world - 1) + [missing]},
    ]
    results = run_ranks(steps, world, todo, timeout=240)
    assert all(r.ok for r in results), [(r.rank, r.error, r.traceback) for r in results]
    for name in targets:
        _check(results, name, expected)
    _check(results, "iter", expected)
    _check(results, "filtered", {k: expected[k] for k in ("embed", "norm")})
    _check_one_copy(targets["redis"], world)
    _check_one_copy(targets["index"], world, files=3)
    for r in results:
        failed = r.value["one-missing"]
        assert "DistributedLoadError" in failed["types"], failed
        assert failed["failed_ranks"] == [world - 1], failed
        assert "NotFoundError" in failed["error"]


@pytest.mark.timeout(120)
def test_more_than_memory_or_the_allowance_is_refused_by_every_rank(tmp_path: Any) -> None:
    """Every wanted tensor is allocated in host memory before the exchange: a header
    claiming 512 GiB (a sparse file here) was the allocator's bare RuntimeError, and
    max_tensor_bytes= was ignored with group=."""
    n = 1 << 39
    body = json.dumps({"big": {"dtype": "F32", "shape": [n // 4],
                               "data_offsets": [0, n]}}).encode()
    huge = tmp_path / "huge.safetensors"
    with open(huge, "wb") as f:
        f.write(len(body).to_bytes(8, "little") + body)
        f.truncate(8 + len(body) + n)
    small = tmp_path / "small.safetensors"
    st_torch.save_file({"w": torch.ones(64)}, str(small))
    results = run_ranks(steps, 2, [
        {"label": "huge", "kind": "safetensors", "uri": str(huge)},
        {"label": "allowance", "kind": "safetensors", "uri": str(small),
         "kwargs": {"max_tensor_bytes": 100}},
        {"label": "iter-huge", "kind": "iter", "uri": str(huge)},
    ], timeout=90)
    assert all(r.ok for r in results), [(r.rank, r.error, r.traceback) for r in results]
    for r in results:
        for label in ("huge", "allowance", "iter-huge"):
            failed = r.value[label]
            assert "DistributedLoadError" in failed.get("types", []), (label, failed)
            assert failed["failed_ranks"] == [0, 1], failed
            assert failed["error"].count("InsufficientMemoryError") == 2, failed
        assert "max_tensor_bytes=100" in r.value["allowance"]["error"]


@pytest.mark.slow
@pytest.mark.timeout(150)
@pytest.mark.parametrize(("kind", "how"), [("safetensors", "hang"),
                                           ("iter", "exit-in-exchange")])
def test_a_rank_that_dies_or_hangs_fails_the_others_in_bounded_time(
        tmp_path: Any, kind: str, how: str) -> None:
    """A sharded checkpoint (index, two shards read by a pool of threads) shared by 3
    ranks: rank 1 stops answering while it reads its share, or exits once the exchange
    has begun. The other ranks raise DistributedLoadError within the group_timeout of 3 s
    (a dead peer's closed connection at once) instead of waiting forever, as a tensorizer
    group load's do."""
    gen = torch.Generator().manual_seed(3)
    state = {f"t{i}": torch.randn(300_000, generator=gen) for i in range(4)}
    names = sorted(state)
    halves = (names[:2], names[2:])
    for i, part in enumerate(halves):
        st_torch.save_file({k: state[k] for k in part},
                           str(tmp_path / f"model-0000{i + 1}-of-00002.safetensors"))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        k: f"model-0000{i + 1}-of-00002.safetensors" for i, part in enumerate(halves)
        for k in part}}))
    step = {"label": "st", "kind": kind, "uri": str(tmp_path / "model.safetensors.index.json"),
            "kwargs": {"group_timeout": 3.0}}
    results = run_ranks(break_rank, 3, step, 1, how, timeout=60)
    for r in (results[0], results[2]):
        assert r.raised("DistributedLoadError"), (r.rank, r.error, r.traceback)
        assert r.seconds < 9, r.seconds
        assert not r.hung
    assert not results[1].hung
