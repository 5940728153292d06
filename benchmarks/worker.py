"""One contender run in a fresh process: ``python -m benchmarks.worker '<json spec>'``.

Imports happen before the clock starts; the clock covers open -> last tensor
materialised (load) or first request -> last byte in memory/on disk (raw, copy).
Verification (checksums) runs after the clock stops. Prints one JSON line:
``seconds``, ``bytes``, ``checksum``, ``baseline_rss_mib`` (after imports),
``peak_rss_mib`` (``getrusage`` high-water mark), ``minor_faults`` (page faults
inside the clock: how the memory the run filled was faulted in -- 4 KiB pages,
huge pages, or memory the process had already) and ``note``.

Secrets never travel in argv: S3 keys come from ``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` in the environment.
"""

from __future__ import annotations

import json
import mmap
import os
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.model import bytes_checksum, tensor_checksum

PART = 8 << 20  # parts for the ranged-read peers (tensorstream's default part size)


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _s3_env() -> tuple[str, str, str]:
    return (
        os.environ["BENCH_S3_ENDPOINT"],
        os.environ["AWS_ACCESS_KEY_ID"],
        os.environ["AWS_SECRET_ACCESS_KEY"],
    )


def _ts_options(spec: dict[str, Any]) -> dict[str, Any]:
    opts = dict(spec.get("options") or {})
    if spec["uri"].startswith("s3://"):
        endpoint, key, secret = _s3_env()
        opts.update(
            s3_endpoint=endpoint,
            s3_access_key_id=key,
            s3_secret_access_key=secret,
            s3_addressing_style="path",
            s3_region="us-east-1",
        )
    return opts


def _ts_preload(uri: str) -> None:
    """Import the provider for ``uri`` before the clock starts, as every peer's
    imports are (tensorizer imports boto3 and redis at ``import tensorizer``).
    Best effort: the module layout may move, and a missing helper only costs
    tensorstream the import time inside its clock."""
    try:
        from tensorstream.providers.registry import resolve_provider_class
        from tensorstream.uri import parse_uri

        resolve_provider_class(parse_uri(uri).scheme)
    except ImportError:
        pass


def _ranges(size: int) -> tuple[list[int], list[int]]:
    starts = list(range(0, size, PART))
    return starts, [min(s + PART, size) for s in starts]


# -- load to device -------------------------------------------------------------
def ts_load(spec: dict[str, Any]) -> Callable[[], tuple[int, Callable[[], str], str]]:
    import tensorstream

    opts = _ts_options(spec)
    _ts_preload(spec["uri"])
    try:
        deserialize = tensorstream.deserialize
        note = "tensorstream.deserialize"
    except (AttributeError, ImportError):
        deserialize = None
        note = "TensorDeserializer(tensorstream.open(uri))"

    def run() -> tuple[int, Callable[[], str], str]:
        if deserialize is not None:
            d = deserialize(spec["uri"], device=spec["device"], **opts)
        else:
            from tensorizer import TensorDeserializer

            d = TensorDeserializer(tensorstream.open(spec["uri"], **opts), device=spec["device"])
        n = sum(t.numel() * t.element_size() for t in d.values())
        return n, lambda: tensor_checksum(d.items()), note

    return run


def ts_st_load(spec: dict[str, Any]) -> Callable[[], tuple[int, Callable[[], str], str]]:
    """tensorstream's safetensors loader on the ``.safetensors`` file of the same tensors."""
    from tensorstream import safetensors as ts_safetensors

    opts = _ts_options(spec)
    _ts_preload(spec["uri"])

    load = ts_safetensors.load  # a lazy attribute: resolve (and import torch) before the clock
    if spec["uri"].startswith("s3://"):
        # The S3 provider's botocore modules (0.6 s of a 2 s load here when imported inside the
        # clock): the tensorizer-file row has them from ``import tensorizer`` (boto3) and the
        # Run:ai streamer loads its own S3 library before its clock.
        import botocore.auth
        import botocore.config
        import botocore.credentials
        import botocore.session  # noqa: F401

    def run() -> tuple[int, Callable[[], str], str]:
        sd = load(spec["uri"], spec["device"], **opts)
        n = sum(t.numel() * t.element_size() for t in sd.values())
        return n, lambda: tensor_checksum(sd.items()), "tensorstream.safetensors.load"

    return run


def tz_load(spec: dict[str, Any]) -> Callable[[], tuple[int, Callable[[], str], str]]:
    from tensorizer import TensorDeserializer

    def run() -> tuple[int, Callable[[], str], str]:
        d = TensorDeserializer(spec["uri"], device=spec["device"], num_readers=spec.get("readers"))
        n = sum(t.numel() * t.element_size() for t in d.values())
        return n, lambda: tensor_checksum(d.items()), f"num_readers={d._num_readers}"

    return run


def st_load(spec: dict[str, Any]) -> Callable[[], tuple[int, Callable[[], str], str]]:
    import torch
    from safetensors.torch import load_file

    def run() -> tuple[int, Callable[[], str], str]:
        sd = load_file(spec["uri"], device=spec["device"])
        if spec["device"] == "cpu":  # load_file maps the file lazily: copy into own memory
            sd = {k: torch.empty_like(v).copy_(v) for k, v in sd.items()}
        n = sum(t.numel() * t.element_size() for t in sd.values())
        return n, lambda: tensor_checksum(sd.items()), "load_file + copy into own memory"

    return run


def runai_load(spec: dict[str, Any]) -> Callable[[], tuple[int, Callable[[], str], str]]:
    """The Run:ai Model Streamer on the safetensors file of the same tensors (local or
    ``s3://``; settings come from its environment variables, set by the harness).
    Its tensors are owned by the caller (``owned=True``, its default): no copy."""
    from runai_model_streamer import SafetensorsStreamer

    def run() -> tuple[int, Callable[[], str], str]:
        sd: dict[str, Any] = {}
        with SafetensorsStreamer() as streamer:
            streamer.stream_file(spec["uri"], device=spec["device"])
            for name, tensor in streamer.get_tensors():
                sd[name] = tensor
        n = sum(t.numel() * t.element_size() for t in sd.values())
        knobs = ", ".join(
            f"{k.removeprefix('RUNAI_STREAMER_')}={v}"
            for k, v in sorted(os.environ.items())
            if k in ("RUNAI_STREAMER_CONCURRENCY", "RUNAI_STREAMER_FS_STRATEGY")
        )
        return n, lambda: tensor_checksum(sd.items()), f"SafetensorsStreamer {knobs or 'defaults'}"

    return run


# -- raw ranged read into memory --------------------------------------------------
def _into_buffer(fill: Callable[[memoryview], None], size: int) -> tuple[int, Callable[[], str]]:
    buf = mmap.mmap(-1, size)  # fresh, not pre-faulted, like a tensor's memory
    view = memoryview(buf)
    fill(view)
    return size, lambda: bytes_checksum([view])


def ts_raw(spec: dict[str, Any]) -> Callable[[], tuple[int, Callable[[], str], str]]:
    import tensorstream

    opts = _ts_options(spec)
    _ts_preload(spec["uri"])

    def run() -> tuple[int, Callable[[], str], str]:
        with tensorstream.open(spec["uri"], **opts) as f:
            n, check = _into_buffer(lambda v: _readinto_all(f, v), f.size)
        return n, check, "open(uri).readinto(buffer)"

    return run


def _readinto_all(f: Any, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = f.readinto(view[got:])
        if not n:
            raise EOFError(f"short read: {got} of {len(view)}")
        got += n


def file_raw(spec: dict[str, Any]) -> Callable[[], tuple[int, Callable[[], str], str]]:
    def run() -> tuple[int, Callable[[], str], str]:
        with open(spec["uri"], "rb", buffering=0) as f:
            n, check = _into_buffer(lambda v: _readinto_all(f, v), os.fstat(f.fileno()).st_size)
        return n, check, "open(path).readinto(buffer)"

    return run


def tz_raw(spec: dict[str, Any]) -> Callable[[], tuple[int, Callable[[], str], str]]:
    from tensorizer.stream_io import open_stream

    def run() -> tuple[int, Callable[[], str], str]:
        with open_stream(spec["uri"], "rb") as f:
            n, check = _into_buffer(lambda v: _readinto_all(f, v), spec["size"])
        return n, check, "stream_io.open_stream(uri).readinto(buffer)"

    return run


def _s3fs() -> Any:
    import s3fs

    endpoint, key, secret = _s3_env()
    return s3fs.S3FileSystem(key=key, secret=secret, client_kwargs={"endpoint_url": endpoint})


def s3fs_read(spec: dict[str, Any]) -> Callable[[], tuple[int, Callable[[], str], str]]:
    def run() -> tuple[int, Callable[[], str], str]:
        with _s3fs().open(spec["path"], "rb") as f:
            data = f.read()
        return len(data), lambda: bytes_checksum([data]), "S3FileSystem.open().read()"

    return run


def s3fs_cat_ranges(spec: dict[str, Any]) -> Callable[[], tuple[int, Callable[[], str], str]]:
    def run() -> tuple[int, Callable[[], str], str]:
        starts, ends = _ranges(spec["size"])
        parts = _s3fs().cat_ranges([spec["path"]] * len(starts), starts, ends)
        n = sum(len(p) for p in parts)
        return n, lambda: bytes_checksum(parts), f"cat_ranges, {PART >> 20} MiB ranges"

    return run


def obstore_ranges(spec: dict[str, Any]) -> Callable[[], tuple[int, Callable[[], str], str]]:
    import obstore
    from obstore.store import HTTPStore, S3Store

    def run() -> tuple[int, Callable[[], str], str]:
        if spec["uri"].startswith("s3://"):
            endpoint, key, secret = _s3_env()
            store: Any = S3Store(
                spec["path"].split("/", 1)[0],
                endpoint=endpoint,
                access_key_id=key,
                secret_access_key=secret,
                region="us-east-1",
                virtual_hosted_style_request=False,
                client_options={"allow_http": True},
            )
            path = spec["path"].split("/", 1)[1]
        else:
            base, path = spec["uri"].rsplit("/", 1)
            store = HTTPStore.from_url(base, client_options={"allow_http": True})
        starts, ends = _ranges(spec["size"])
        parts = obstore.get_ranges(store, path, starts=starts, ends=ends)
        n = sum(len(memoryview(p)) for p in parts)
        return n, lambda: bytes_checksum(parts), f"get_ranges, {PART >> 20} MiB ranges"

    return run


def boto3_get(spec: dict[str, Any]) -> Callable[[], tuple[int, Callable[[], str], str]]:
    import boto3

    endpoint, key, secret = _s3_env()
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        region_name="us-east-1",
    )
    bucket, key_ = spec["path"].split("/", 1)

    def run() -> tuple[int, Callable[[], str], str]:
        data = client.get_object(Bucket=bucket, Key=key_)["Body"].read()
        return len(data), lambda: bytes_checksum([data]), "get_object()['Body'].read()"

    return run


# -- copy -----------------------------------------------------------------------
def s3fs_get(spec: dict[str, Any]) -> Callable[[], tuple[int, Callable[[], str], str]]:
    def run() -> tuple[int, Callable[[], str], str]:
        # get_file: get() first lists the prefix, which the nginx stand-in cannot answer
        _s3fs().get_file(spec["path"], spec["dest"])
        return os.path.getsize(spec["dest"]), lambda: "", "S3FileSystem.get_file()"

    return run


def s3fs_get_tree(spec: dict[str, Any]) -> Callable[[], tuple[int, Callable[[], str], str]]:
    def run() -> tuple[int, Callable[[], str], str]:
        _s3fs().get(spec["path"], spec["dest"], recursive=True)
        n = sum(p.stat().st_size for p in Path(spec["dest"]).rglob("*") if p.is_file())
        return n, lambda: "", "S3FileSystem.get(recursive=True)"

    return run


def s3fs_put(spec: dict[str, Any]) -> Callable[[], tuple[int, Callable[[], str], str]]:
    def run() -> tuple[int, Callable[[], str], str]:
        _s3fs().put(spec["src"], spec["path"])
        return os.path.getsize(spec["src"]), lambda: "", "S3FileSystem.put()"

    return run


def redis_py_cp(spec: dict[str, Any]) -> Callable[[], tuple[int, Callable[[], str], str]]:
    """redis-py: GET tensorizer's chunk keys in offset order into a file (as its loader does).
    (tensorizer's RedisStreamFile fails on large unaligned sequential reads, so not that.)"""
    import redis

    def run() -> tuple[int, Callable[[], str], str]:
        client = redis.Redis(port=spec["port"])
        keys = sorted(
            client.scan_iter(f"{spec['key']}:*", count=1000), key=lambda k: int(k.rsplit(b":", 1)[1])
        )
        with open(spec["dest"], "wb") as dst:
            for k in keys:
                data = client.get(k)
                assert isinstance(data, bytes), k
                dst.write(data)
        client.close()
        return os.path.getsize(spec["dest"]), lambda: "", "redis-py GET per chunk -> file"

    return run


KINDS: dict[str, Callable[[dict[str, Any]], Callable[[], tuple[int, Callable[[], str], str]]]] = {
    "ts-load": ts_load,
    "tz-load": tz_load,
    "st-load": st_load,
    "ts-raw": ts_raw,
    "file-raw": file_raw,
    "tz-raw": tz_raw,
    "s3fs-read": s3fs_read,
    "s3fs-cat-ranges": s3fs_cat_ranges,
    "obstore-ranges": obstore_ranges,
    "boto3-get": boto3_get,
    "s3fs-get": s3fs_get,
    "s3fs-get-tree": s3fs_get_tree,
    "runai-load": runai_load,
    "ts-st-load": ts_st_load,
    "s3fs-put": s3fs_put,
    "redis-py-cp": redis_py_cp,
}


def _cuda_ready(device: str | None) -> Callable[[], None]:
    """For a load onto a CUDA device: the context made before the clock starts (the
    first CUDA call of a process takes it, ~0.2-1 s, which no loader should be timed
    for), and what stops the clock only once every copy a loader queued has landed
    (a loader may return with asynchronous copies in flight). A no-op elsewhere."""
    if not device or not str(device).startswith("cuda"):
        return lambda: None
    import torch

    torch.empty(1, device=device)
    torch.cuda.synchronize(device)
    return lambda: torch.cuda.synchronize(device)


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    if spec["kind"].endswith("-load"):
        # Every loader ends in torch tensors and every peer imports torch at its own import;
        # a loader that imports it lazily must not pay torch's import inside its clock.
        import torch  # noqa: F401
    run = KINDS[spec["kind"]](spec)  # imports and clients: before the clock
    sync = _cuda_ready(spec.get("device"))
    baseline = _rss_mib()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    start = time.perf_counter()
    nbytes, check, note = run()
    sync()
    seconds = time.perf_counter() - start
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    checksum = check()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out = {
        "seconds": seconds,
        "bytes": nbytes,
        "checksum": checksum,
        "baseline_rss_mib": round(baseline, 1),
        "peak_rss_mib": round(peak, 1),
        "minor_faults": faults,
        "note": note,
    }
    print("BENCH-RESULT " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
