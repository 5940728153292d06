"""Sequential round trips from open to the first tensor byte, per loader.

Starts the static server in ``ttfb`` mode (every request waits 20-50 ms before
its answer, as object stores do) with a request log, then loads a cached
benchmark model in fresh processes, alternating: tensorstream from this tree,
tensorstream from ``--baseline`` (another tree's ``src``), and tensorizer with
``num_readers`` 1 and 2. For each load it prints the server's requests relative
to the client's ``open`` and the time the first request covering byte 0 was
answered (the first byte of the header, and of the tensors that follow it in
the same body). That time is latency-bound, so it stays readable on a busy
machine; the whole-load time printed beside it is CPU-bound and is not.

    PYTHONPATH=src python -m benchmarks.roundtrips --shapes small,mixed \\
        --backends http,s3 --rounds 3 --baseline /work/main/src
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from .servers import bench_aws_env, start_static

CACHE = Path("/tmp/tensorstream-bench")

_CHILD = r"""
import json, sys, time
spec = json.loads(sys.argv[1])
uri = spec["uri"]
if spec["who"] == "tensorizer":
    from tensorizer import TensorDeserializer
    t0 = time.time()  # the endpoint comes from the environment, as in benchmarks.run
    d = TensorDeserializer(uri, device="cpu", num_readers=spec["readers"])
else:
    import tensorizer  # noqa: F401  (imported before the clock, as in benchmarks.worker)
    import tensorstream
    import tensorstream.tensorizer.load  # noqa: F401
    from tensorstream.providers.registry import resolve_provider_class
    from tensorstream.uri import parse_uri
    resolve_provider_class(parse_uri(uri).scheme)
    opts = {}
    if uri.startswith("s3://"):
        opts = dict(s3_endpoint=spec["endpoint"], s3_access_key_id="bench",
                    s3_secret_access_key="bench", s3_addressing_style="path", s3_region="us-east-1")
    t0 = time.time()
    d = tensorstream.deserialize(uri, device="cpu", **opts)
n = sum(t.numel() * t.element_size() for t in d.values())
print(json.dumps({"t0": t0, "t1": time.time(), "bytes": n}))
"""


def _requests(log: Path, t0: float, t1: float) -> list[tuple[float, float, str]]:
    out = []
    for line in log.read_text().splitlines():
        arrived, answered, method, _path, rng = line.split(" ", 4)
        if t0 <= float(arrived) <= t1:
            out.append((float(arrived) - t0, float(answered) - t0, f"{method} {rng}"))
    return out


def _first_byte(reqs: list[tuple[float, float, str]]) -> tuple[float, int]:
    """When the first GET covering byte 0 was answered, and how many requests
    were answered before it."""
    for i, (_arrived, answered, what) in enumerate(reqs):
        if what.startswith("GET") and (what.endswith(" -") or what.split()[-1].startswith("bytes=0-")):
            return answered, i
    return float("nan"), len(reqs)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.roundtrips")
    p.add_argument("--shapes", default="small,mixed")
    p.add_argument("--size", type=int, default=536870912)
    p.add_argument("--backends", default="http,s3")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--baseline", default=None, help="another tree's src/ to run beside this one")
    p.add_argument("--readers", default="1,2", help="tensorizer num_readers ('' for none)")
    p.add_argument("--verbose", action="store_true", help="print every load's requests")
    a = p.parse_args(argv)
    here = str(Path(__file__).resolve().parent.parent / "src")
    whos: list[tuple[str, str | None, int | None]] = [("tensorstream", here, None)]
    if a.baseline:
        whos.append(("baseline", a.baseline, None))
    whos += [("tensorizer", None, int(r)) for r in a.readers.split(",") if r]
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "requests.log"
        with start_static(CACHE, "ttfb", request_log=log) as srv:
            env = {**bench_aws_env(Path(tmp)), "AWS_ENDPOINT_URL": srv.url,
                   "AWS_ENDPOINT_URL_S3": srv.url, "S3_ENDPOINT_URL": srv.url}
            for shape in a.shapes.split(","):
                bucket = f"model-{shape}-{a.size}-0"
                for backend in a.backends.split(","):
                    uri = f"{srv.url}/{bucket}/model.tensors" if backend == "http" else f"s3://{bucket}/model.tensors"
                    results: dict[str, list[tuple[float, float, int]]] = {}
                    for _ in range(a.rounds):
                        for who, src, readers in whos:
                            name = who if readers is None else f"{who} num_readers={readers}"
                            cenv = dict(env)
                            if src is not None:
                                cenv["PYTHONPATH"] = src + os.pathsep + os.path.dirname(src)
                            spec = {"who": "tensorizer" if readers else "ts", "uri": uri,
                                    "endpoint": srv.url, "readers": readers}
                            out = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(spec)],
                                                 env=cenv, capture_output=True, text=True)
                            if out.returncode:
                                sys.exit(f"{name} failed on {uri}:\n{out.stderr[-2000:]}")
                            r = json.loads(out.stdout.strip().splitlines()[-1])
                            reqs = _requests(log, r["t0"], r["t1"])
                            first, before = _first_byte(reqs)
                            results.setdefault(name, []).append((first, r["t1"] - r["t0"], before))
                            if a.verbose:
                                print(f"{shape} {backend} {name}: load {r['t1'] - r['t0']:.3f} s")
                                for arrived, answered, what in reqs:
                                    print(f"    +{arrived * 1e3:7.1f} ms -> answered "
                                          f"+{answered * 1e3:7.1f} ms  {what}")
                    print(f"\n{shape} {backend} (load average {os.getloadavg()[0]:.1f})")
                    for name, rows in results.items():
                        firsts = [f * 1e3 for f, _, _ in rows]
                        loads = [t for _, t, _ in rows]
                        print(f"  {name:28s} first byte {statistics.median(firsts):6.1f} ms "
                              f"(min {min(firsts):.1f})  requests before it {rows[0][2]}  "
                              f"load {statistics.median(loads):.3f} s (min {min(loads):.3f})")


if __name__ == "__main__":
    main()
