"""Time and peak RSS of ``tensorstream convert`` against loading everything first.

    python -m benchmarks.convert_memory --size-mib 512 --rounds 3 --out docs/benchmarks/convert

Contenders, each in its own fresh process, alternating A B A B per scenario:

* ``convert``: ``tensorstream.convert(SRC, DST)`` (streamed tensor by tensor; the same
  code as ``tensorstream convert``), and with ``durable=False`` (``--no-fsync``: the
  destination is not waited onto the disk, as the other contender does not);
* ``load-all``: what a script does without it (and what vLLM's ``tensorize_vllm_model.py``
  does by building the model): every tensor in memory first -- ``safetensors.torch.load_file``
  (local) or ``tensorstream.safetensors.load`` (S3), then tensorizer's
  ``write_state_dict``; back: ``TensorDeserializer`` (eager) then ``safetensors.torch.save_file``.

Scenarios: safetensors -> tensorizer and back, the source a local file or an S3 object
(nginx answering path-style S3 on loopback, as in the throughput benchmarks); the
destination a local file. Peak RSS from GNU time (``%M``, the whole process); time inside
the process (the conversion) and of the whole process. Every output is verified against
the model's tensor checksum. Writes ``OUT.json`` and ``OUT.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .model import MiB, ensure_model, tensor_checksum
from .servers import bench_aws_env, start_nginx

BUCKET = "bench"


def _naive(src: str, dst: str, endpoint: str | None) -> None:
    """The load-all contender (run in its own process); prints its in-process seconds."""
    from safetensors.torch import load_file, save_file
    from tensorizer import TensorSerializer

    import tensorstream
    import tensorstream.safetensors
    import tensorstream.tensorizer.load  # imports outside the timed part

    t0 = time.perf_counter()
    if dst.endswith(".tensors"):
        sd = (tensorstream.safetensors.load(src, s3_endpoint=endpoint) if endpoint
              else load_file(src))
        ser = TensorSerializer(dst)
        ser.write_state_dict(sd)
        ser.close()
    else:
        opts = {"s3_endpoint": endpoint} if endpoint else {}
        with tensorstream.deserialize(src, "cpu", **opts) as d:
            sd = {k: v.detach() for k, v in d.items()}
        save_file(sd, dst)
    print(json.dumps({"seconds": time.perf_counter() - t0}))


def _stream(src: str, dst: str, endpoint: str | None, durable: bool = True) -> None:
    """The convert contender: the same imports first, then ``tensorstream.convert`` timed."""
    import safetensors.torch  # noqa: F401
    import tensorizer  # noqa: F401

    import tensorstream
    import tensorstream.conversion.to_safetensors
    import tensorstream.conversion.to_tensorizer

    t0 = time.perf_counter()
    tensorstream.convert(src, dst, overwrite=True, durable=durable,
                         **({"src_options": {"s3_endpoint": endpoint}} if endpoint else {}))
    print(json.dumps({"seconds": time.perf_counter() - t0}))


def _run(argv: list[str], env: dict[str, str]) -> tuple[float, float, float]:
    """(in-process seconds, whole-process seconds, peak RSS MiB) of one process."""
    t0 = time.perf_counter()
    with tempfile.NamedTemporaryFile("r", suffix=".rss") as rss:
        proc = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", rss.name, sys.executable,
                               *argv], capture_output=True, text=True, env=env)
        whole = time.perf_counter() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"{argv} failed:\n{proc.stderr[-3000:]}")
        peak = int(rss.read().strip().splitlines()[-1]) / 1024
    return float(json.loads(proc.stdout.strip().splitlines()[-1])["seconds"]), whole, peak


def _verify(path: str, expect: str) -> bool:
    if path.endswith(".tensors"):
        from tensorizer import TensorDeserializer

        with TensorDeserializer(path, device="cpu") as d:
            return tensor_checksum((k, v.detach()) for k, v in d.items()) == expect
    from safetensors.torch import load_file

    return tensor_checksum(load_file(path).items()) == expect


def main(argv: list[str] | None = None) -> int:
    if argv is None and sys.argv[1:2] in (["naive"], ["stream"], ["stream-nofsync"]):
        endpoint = sys.argv[4] if len(sys.argv) > 4 else None
        if sys.argv[1] == "naive":
            _naive(sys.argv[2], sys.argv[3], endpoint)
        else:
            _stream(sys.argv[2], sys.argv[3], endpoint, durable=sys.argv[1] == "stream")
        return 0
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=512)
    ap.add_argument("--shape", default="llama")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "tensorstream-bench"))
    ap.add_argument("--out", default="docs/benchmarks/convert")
    args = ap.parse_args(argv)
    manifest = ensure_model(Path(args.cache), args.size_mib * MiB, shape=args.shape)
    model = Path(manifest["dir"])
    expect = manifest["tensors_checksum"]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="convert-bench-") as tmp:
        work = Path(tmp)
        root = work / "www"
        (root / BUCKET).mkdir(parents=True)
        for name in ("model.safetensors", "model.tensors"):
            os.symlink(model / name, root / BUCKET / name)
        env = bench_aws_env(work)
        with start_nginx(root, work / "nginx") as nginx:
            for f in ("model.safetensors", "model.tensors"):  # warm the page cache
                (model / f).read_bytes()
            for src_name in ("local", "s3"):
                for direction, (src_file, suffix) in {
                        "safetensors -> tensorizer": ("model.safetensors", ".tensors"),
                        "tensorizer -> safetensors": ("model.tensors", ".safetensors")}.items():
                    src = (str(model / src_file) if src_name == "local"
                           else f"s3://{BUCKET}/{src_file}")
                    endpoint = nginx.url if src_name == "s3" else None
                    samples: dict[str, list[tuple[float, float, float]]] = {
                        "convert": [], "convert --no-fsync": [], "load-all": []}
                    for _ in range(args.rounds):
                        for contender in samples:
                            dst = str(work / f"out{suffix}")
                            mode = {"convert": "stream", "convert --no-fsync": "stream-nofsync",
                                    "load-all": "naive"}[contender]
                            cmd = ["-m", "benchmarks.convert_memory", mode, src, dst,
                                   *([endpoint] if endpoint else [])]
                            samples[contender].append(_run(cmd, env))
                            if not _verify(dst, expect):
                                raise RuntimeError(f"{contender} {direction} {src_name}: wrong "
                                                   "tensors")
                            os.unlink(dst)
                    for contender, got in samples.items():
                        row = {"source": src_name, "direction": direction,
                               "contender": contender,
                               "seconds": round(statistics.median(g[0] for g in got), 2),
                               "seconds_range": [round(min(g[0] for g in got), 2),
                                                 round(max(g[0] for g in got), 2)],
                               "process_seconds": round(statistics.median(g[1] for g in got), 2),
                               "peak_rss_mib": round(statistics.median(g[2] for g in got)),
                               "peak_rss_range": [round(min(g[2] for g in got)),
                                                  round(max(g[2] for g in got))]}
                        rows.append(row)
                        print(json.dumps(row), flush=True)
    header = (f"{platform.node()} ({os.cpu_count()} CPUs), python {platform.python_version()}, "
              f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {args.shape} model, "
              f"{manifest['tensor_count']} tensors, {manifest['tensor_bytes'] / MiB:.0f} MiB "
              f"(largest {manifest['tensor_max_bytes'] / MiB:.1f} MiB); {args.rounds} rounds, "
              "fresh process each, alternating; medians (min-max); every output verified; "
              "S3 = nginx on loopback answering path-style S3; destination a local file")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"header": header, "rows": rows}, indent=1))
    lines = [f"_{header}_", "",
             "| source | direction | contender | convert s | process s | peak RSS MiB |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lo, hi = r["seconds_range"]
        rlo, rhi = r["peak_rss_range"]
        lines.append(f"| {r['source']} | {r['direction']} | {r['contender']} | {r['seconds']} "
                     f"({lo}-{hi}) | {r['process_seconds']} | {r['peak_rss_mib']} "
                     f"({rlo}-{rhi}) |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
