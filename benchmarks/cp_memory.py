"""Peak RSS of ``tensorstream cp`` for big objects, every pair of backends.

    python -m benchmarks.cp_memory --sizes 1,4 --out docs/benchmarks/cp_memory

Each copy runs as its own ``python -m tensorstream cp`` process; its peak
resident set comes from GNU ``time`` (``%M``), so it covers the whole
process: interpreter, imports, part buffers, client libraries. Sources:
a local file, nginx serving it over HTTP and as path-style S3 (nginx ignores
the signature, as in the throughput benchmarks), Redis. Destinations: a local
directory, moto's S3 server (slow, so large sizes take a while), Redis. Every
copy must exit 0 (``cp`` checks the size and verifies the copy itself); a
failure is recorded with its error line. Writes ``OUT.json`` and ``OUT.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .servers import bench_aws_env, start_moto, start_nginx, start_redis

BUCKET = "bench"
GiB = 1 << 30


def _write_source(path: Path, size: int) -> None:
    block = os.urandom(64 << 20)
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(left, len(block))
            f.write(block[:n])
            left -= n


def _cp(argv: list[str], env: dict[str, str]) -> tuple[int, float, float, str]:
    """(exit status, peak RSS MiB, seconds, stderr tail) of one ``tensorstream cp`` process.

    The peak comes from GNU time (``%M``), not from this process's ``wait4``:
    Linux keeps a forked child's pre-exec peak, which would be this (larger)
    harness's own RSS.
    """
    t0 = time.perf_counter()
    with tempfile.NamedTemporaryFile("r", suffix=".rss") as rss_file:
        proc = subprocess.run(
            [
                "/usr/bin/time",
                "-f",
                "%M",
                "-o",
                rss_file.name,
                sys.executable,
                "-m",
                "tensorstream",
                "cp",
                "--no-progress",
                *argv,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
        )
        peak_kib = int(rss_file.read().strip().splitlines()[-1])
    err = proc.stderr.decode(errors="replace")
    return proc.returncode, peak_kib / 1024, time.perf_counter() - t0, err[-2000:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1,4", help="GiB, comma separated (default 1,4)")
    ap.add_argument("--sources", default="local,http,s3,redis")
    ap.add_argument("--dests", default="local,redis,s3")
    ap.add_argument("--skip", default="", help="pairs to leave out, e.g. s3@4,redis>redis@4")
    ap.add_argument("--out", default="docs/benchmarks/cp_memory")
    ap.add_argument("--merge", action="store_true",
                    help="replace only the pairs run now in an existing OUT.json")
    ap.add_argument("--moto-timeout-idle", type=float, default=600.0,
                    help="--timeout-idle for copies to moto: its ranged GETs of a large "
                         "multipart object (the read-back) take minutes (default 600)")
    args = ap.parse_args(argv)
    sizes = [float(s) for s in args.sizes.split(",")]
    skip = {s for s in args.skip.split(",") if s}
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="cpmem-") as tmp:
        work = Path(tmp)
        root = work / "www"
        (root / BUCKET).mkdir(parents=True)
        env = bench_aws_env(work)
        with (
            start_nginx(root, work / "nginx") as nginx,
            start_redis(work / "redis") as redis,
            start_moto() as moto,
        ):
            nginx_url = f"http://127.0.0.1:{nginx.port}"
            moto_url = f"http://127.0.0.1:{moto.port}"
            redis_url = f"redis://127.0.0.1:{redis.port}"
            import boto3

            boto3.client(
                "s3",
                endpoint_url=moto_url,
                aws_access_key_id="bench",
                aws_secret_access_key="bench",
                region_name="us-east-1",
            ).create_bucket(Bucket=BUCKET)
            for gib in sizes:
                size = int(gib * GiB)
                src_file = root / BUCKET / "src.bin"
                _write_source(src_file, size)
                srcs = {
                    "local": ([str(src_file)], []),
                    "http": ([f"{nginx_url}/{BUCKET}/src.bin"], []),
                    "s3": ([f"s3://{BUCKET}/src.bin"], ["--src-endpoint-url", nginx_url]),
                    "redis": ([f"{redis_url}/src.bin"], []),
                }
                if "redis" in args.sources.split(","):
                    rc, _, _, err = _cp([str(src_file), f"{redis_url}/src.bin"], env)
                    assert rc == 0, err
                for s_name in args.sources.split(","):
                    for d_name in args.dests.split(","):
                        tag = f"{s_name}>{d_name}@{gib:g}"
                        if tag in skip or f"{d_name}@{gib:g}" in skip:
                            continue
                        dst_dir = work / "out"
                        dst_dir.mkdir(exist_ok=True)
                        dst, dst_opts = {
                            "local": (str(dst_dir / "dst.bin"), []),
                            "redis": (f"{redis_url}/dst.bin", []),
                            "s3": (f"s3://{BUCKET}/dst.bin",
                                   ["--dst-endpoint-url", moto_url, "--timeout-idle",
                                    str(args.moto_timeout_idle)]),
                        }[d_name]
                        src, src_opts = srcs[s_name]
                        rc, rss, secs, err = _cp([*src_opts, *dst_opts, *src, dst], env)
                        row = {
                            "source": s_name,
                            "destination": d_name,
                            "gib": gib,
                            "exit": rc,
                            "peak_rss_mib": round(rss),
                            "seconds": round(secs, 1),
                        }
                        if rc != 0:
                            errors = [x for x in err.splitlines() if "error:" in x]
                            row["error"] = (errors or err.strip().splitlines() or [""])[-1]
                        rows.append(row)
                        print(json.dumps(row), flush=True)
                        # free the destination's memory (Redis, moto) before the next pair
                        if d_name == "local":
                            (dst_dir / "dst.bin").unlink(missing_ok=True)
                        else:
                            subprocess.run(
                                [sys.executable, "-m", "tensorstream", "rm", *dst_opts, dst],
                                env=env,
                                capture_output=True,
                            )
                if "redis" in args.sources.split(","):
                    subprocess.run(
                        [sys.executable, "-m", "tensorstream", "rm", f"{redis_url}/src.bin"],
                        env=env,
                        capture_output=True,
                    )
                src_file.unlink()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.merge and out.with_suffix(".json").exists():
        # Keep the earlier run's other pairs (e.g. a rerun of the moto pairs only).
        new = {(r["source"], r["destination"], r["gib"]) for r in rows}
        old = json.loads(out.with_suffix(".json").read_text())["rows"]
        rows = [r for r in old if (r["source"], r["destination"], r["gib"]) not in new] + rows
        rows.sort(key=lambda r: (r["gib"], r["source"], r["destination"]))
    header = (
        f"{platform.node()} ({os.cpu_count()} CPUs), python {platform.python_version()}, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; default cp settings "
        "(--concurrency 32, --part-size 8M); peak RSS of the whole cp process (GNU time %M)"
    )
    out.with_suffix(".json").write_text(json.dumps({"header": header, "rows": rows}, indent=1))
    lines = [
        f"_{header}_",
        "",
        "| source -> destination | size | peak RSS | seconds | exit |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['source']} -> {r['destination']} | {r['gib']:g} GiB | "
            f"{r['peak_rss_mib']} MiB | {r['seconds']} | {r['exit']} |"
        )
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
