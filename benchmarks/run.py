"""``python -m benchmarks.run``: tensorstream side by side with its peers, in one run.

Starts its own servers on free ports (and always stops them, also on Ctrl-C),
generates a synthetic model, warms caches, runs every contender in a fresh
process alternately for ``--rounds``, verifies each result, and writes JSON,
Markdown and a PNG plot. See ``docs/benchmarks.md`` and ``--help``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from . import contenders, model, report, servers
from .contenders import BUCKET, KEY, Contender, Setup

REPO = Path(__file__).resolve().parent.parent
UNITS = {
    "": 1,
    "k": 1e3,
    "m": 1e6,
    "g": 1e9,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "kb": 1e3,
    "mb": 1e6,
    "gb": 1e9,
}


def parse_size(text: str) -> int:
    """``1GiB``, ``256MiB``, ``25m`` (10**6), ``1073741824``."""
    match = re.fullmatch(r"\s*([\d.]+)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in UNITS:
        raise argparse.ArgumentTypeError(f"bad size {text!r}")
    return int(float(match.group(1)) * UNITS[match.group(2).lower()])


def _csv(choices: list[str]) -> Any:
    def parse(text: str) -> list[str]:
        items = choices if text == "all" else [t.strip() for t in text.split(",") if t.strip()]
        bad = set(items) - set(choices)
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {sorted(bad)}; choose from {choices}")
        return items

    return parse


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__)
    p.add_argument("--size", type=parse_size, default=None, help="model size (default 1GiB)")
    p.add_argument("--rounds", type=int, default=None, help="rounds (default 3)")
    p.add_argument("--profile", type=_csv(["loopback", "capped"]), default=None)
    p.add_argument(
        "--cap",
        type=parse_size,
        default=parse_size("25m"),
        help="per-connection cap of the capped profile, bytes/s (default 25m)",
    )
    p.add_argument("--scenario", type=_csv(["load", "raw", "copy"]), default=None)
    p.add_argument("--backend", type=_csv(["local", "http", "s3", "redis"]), default=None)
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", type=Path, default=None, help="write rows here")
    p.add_argument("--markdown", type=Path, default=None, help="write the table here")
    p.add_argument("--plot", type=Path, default=None, help="PNG (default: beside --markdown)")
    p.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "tensorstream-bench")
    p.add_argument("--timeout", type=float, default=900, help="seconds per contender run")
    p.add_argument("--quick", action="store_true", help="256MiB, 1 round, fewer contenders (CI smoke test)")
    a = p.parse_args(argv)
    a.size = a.size or parse_size("256MiB" if a.quick else "1GiB")
    a.rounds = a.rounds or (1 if a.quick else 3)
    a.profile = a.profile or (["loopback"] if a.quick else ["loopback", "capped"])
    a.scenario = a.scenario or ["load", "raw", "copy"]
    a.backend = a.backend or ["local", "http", "s3", "redis"]
    return a


def child_env(home: Path) -> dict[str, str]:
    """Environment for contenders: dummy S3 keys, no real credentials or config files."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "S3_", "REDIS_", "TENSORSTREAM_"))
    }
    home.mkdir(parents=True, exist_ok=True)
    env.update(
        HOME=str(home),
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench-secret",
        AWS_REGION="us-east-1",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_EC2_METADATA_DISABLED="true",
        AWS_CONFIG_FILE=str(home / "aws-config"),
        AWS_SHARED_CREDENTIALS_FILE=str(home / "aws-creds"),
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
    )
    return env


def run_once(c: Contender, env: dict[str, str], timeout: float) -> dict[str, Any]:
    """Run one contender in a fresh process; time it, collect its peak RSS, verify it."""
    if c.dest:
        Path(c.dest).unlink(missing_ok=True)
    env = dict(env)
    if c.s3_endpoint:
        env.update(
            BENCH_S3_ENDPOINT=c.s3_endpoint,
            AWS_ENDPOINT_URL=c.s3_endpoint,
            AWS_ENDPOINT_URL_S3=c.s3_endpoint,
            S3_ENDPOINT_URL=c.s3_endpoint,
        )
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        sink = subprocess.DEVNULL if c.discard_stdout else out
        proc = subprocess.Popen(c.argv, stdout=sink, stderr=err, stdin=subprocess.DEVNULL, env=env, cwd=REPO)
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        finally:
            timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    res: dict[str, Any] = {"process_seconds": wall, "peak_rss_mib": usage.ru_maxrss / 1024}
    if proc.returncode != 0:
        tail = " ".join(stderr.strip().splitlines()[-3:])[-300:]
        return {**res, "seconds": None, "error": f"exit {proc.returncode}: {tail}"}
    line = next((x for x in stdout.splitlines() if x.startswith("BENCH-RESULT ")), None)
    if line:
        res.update(json.loads(line[len("BENCH-RESULT ") :]))
    else:  # an external tool: the whole process is the operation
        res.update(seconds=wall, bytes=c.bytes, note="external process: time = whole process")
        if c.argv[0] == "curl":
            t, n = stdout.split()
            res.update(seconds=float(t), bytes=int(float(n)), note="curl time_total")
    try:
        res["verified"] = verify(c, res)
    except Exception as exc:  # a broken check marks the row unverified; the run goes on
        res.update(verified=False, error=f"verification failed: {exc!r}"[:300])
    return res


def verify(c: Contender, res: dict[str, Any]) -> bool:
    if c.verify == "worker":
        return bool(res.get("checksum") == c.expect)
    if c.verify == "size":
        return bool(res.get("bytes") == c.bytes)
    if c.verify == "file":
        ok = model.file_checksum(c.dest or "") == c.expect if c.dest and Path(c.dest).exists() else False
        return ok
    if c.verify == "tensor-file":
        return bool(_child("tensor-file", c.dest or "", c.expect))
    if c.verify == "s3-object":  # moto wants signed requests: boto3 in a child
        return bool(_child("s3-object", c.s3_endpoint or "", f"{BUCKET}/upload.bin", c.expect))
    return False


def _child(*args: str) -> Any:
    """Run ``python -m benchmarks.model ARGS`` and return its JSON result."""
    p = subprocess.run(
        [sys.executable, "-m", "benchmarks.model", *args], cwd=REPO, capture_output=True, text=True
    )
    line = next((x for x in p.stdout.splitlines() if x.startswith("BENCH-RESULT ")), None)
    if p.returncode != 0 or line is None:
        raise RuntimeError(f"benchmarks.model {args[0]} failed:\n{p.stderr[-2000:]}")
    return json.loads(line[len("BENCH-RESULT ") :])


def _warm(paths: list[Path]) -> None:
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while f.read(64 << 20):
                pass


def _cpu_busy(interval: float = 0.25) -> float:
    """Fraction of all CPUs busy over ``interval`` seconds (Linux; 0.0 elsewhere)."""
    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return idle, sum(fields)

    try:
        idle0, total0 = sample()
        time.sleep(interval)
        idle1, total1 = sample()
    except OSError:
        return 0.0
    total = max(1, total1 - total0)
    return 1.0 - (idle1 - idle0) / total


def _settle(timeout: float = 15.0) -> None:
    """Before each timed run: flush dirty pages (the copies write 512 MiB files)
    and wait until the machine is idle (moto finishing an upload, writeback), so
    that no contender pays for the previous one's aftermath."""
    os.sync()
    deadline = time.monotonic() + timeout
    while _cpu_busy() > 0.10 and time.monotonic() < deadline:
        pass


def run_profile(
    args: argparse.Namespace,
    profile: str,
    manifest: dict[str, Any],
    stack: contextlib.ExitStack,
    notes: list[str],
) -> list[dict[str, Any]]:
    tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=f"tsbench-{profile}-")))
    root = tmp / "root"
    (root / BUCKET).mkdir(parents=True)
    src = Path(manifest["dir"]) / "model.tensors"
    try:
        os.link(src, root / BUCKET / KEY)
    except OSError:
        shutil.copyfile(src, root / BUCKET / KEY)
    if profile == "loopback":
        http = stack.enter_context(servers.start_nginx(root, tmp / "nginx"))
    else:
        http = stack.enter_context(servers.start_paced(root, args.cap))
        rate = servers.measure_one_connection(f"{http.url}/{BUCKET}/{KEY}", 16 << 20)
        notes.append(
            f"capped: one connection measured at {rate / 1e6:.1f} MB/s (cap {args.cap / 1e6:.0f} MB/s)"
        )
    _warm([src, Path(manifest["dir"]) / "model.safetensors"])
    redis_port = ts_key = moto_url = small = None
    if profile == "loopback" and "redis" in args.backend:
        r = stack.enter_context(servers.start_redis(tmp / "redis"))
        redis_port = r.port
        want = None if contenders.provider_missing("redis") else KEY
        problem = _child("redis", str(r.port), str(src), want or "")
        if problem:
            notes.append(problem)
        ts_key = want if want and not problem else "model"
    if profile == "loopback" and "s3" in args.backend and "copy" in args.scenario and not args.quick:
        moto = stack.enter_context(servers.start_moto())
        moto_url = moto.url
        req = urllib.request.Request(f"{moto_url}/{BUCKET}", method="PUT")
        urllib.request.urlopen(req, timeout=60).close()
        small = tmp / "small.bin"
        with open(src, "rb") as f:
            small.write_bytes(f.read(min(64 << 20, manifest["file_size"])))
    setup = Setup(
        profile=profile,
        manifest=manifest,
        root=root,
        work=tmp,
        http=http.url,
        redis_port=redis_port,
        ts_redis_key=ts_key,
        moto=moto_url,
        small_file=small,
        device=args.device,
        quick=args.quick,
    )
    plan = contenders.plan(setup, args.backend, args.scenario)
    for c in plan:
        if c.verify == "s3-object" and small is not None:
            c.expect = model.bytes_checksum([small.read_bytes()])
    env = child_env(tmp / "home")
    runs: list[list[dict[str, Any]]] = [[] for _ in plan]
    for rnd in range(args.rounds):
        for i in round_order(plan, rnd):
            c = plan[i]
            if c.skip:
                continue
            _settle(timeout=2.0 if args.quick else 15.0)  # quick: CI smoke runs
            res = run_once(c, env, args.timeout)
            runs[i].append(res)
            status = "ok" if res.get("verified") else ("UNVERIFIED" if res.get("seconds") else "FAILED")
            secs = f"{res['seconds']:.3f}s" if res.get("seconds") else res.get("error", "")
            print(f"[{profile} r{rnd + 1}] {c.scenario}/{c.backend} {c.name}: {secs} {status}", flush=True)
    rows = []
    for c, rs in zip(plan, runs, strict=True):
        key = dict(
            scenario=c.scenario,
            backend=c.backend,
            profile=profile,
            contender=c.name,
            tensorstream=c.is_tensorstream,
        )
        row = report.aggregate(key, rs, c.bytes, c.skip)
        if c.note:
            row["note"] = f"{c.note}; {row['note']}".strip("; ")
        rows.append(row)
    return rows


def round_order(plan: list[Contender], rnd: int) -> list[int]:
    """Indices of ``plan`` in the order round ``rnd`` runs them: contenders
    alternate (A B C, A B C, ...) within each scenario and backend, and the
    group's starting contender rotates each round (A B C, B C A, C A B), so
    whatever the first run after another group pays (its memory being freed,
    caches) is spread over every contender instead of always landing on one."""
    groups: dict[tuple[str, str], list[int]] = {}
    for i, c in enumerate(plan):
        groups.setdefault((c.scenario, c.backend), []).append(i)
    order: list[int] = []
    for members in groups.values():
        k = rnd % len(members)
        order += members[k:] + members[:k]
    return order


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM behaves like Ctrl-C, so the ExitStack below always stops the servers.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"generating/reusing the {args.size >> 20} MiB model under {args.cache} ...", flush=True)
    manifest = _child("model", str(args.cache), str(args.size), "0")
    notes: list[str] = []
    rows: list[dict[str, Any]] = []
    for profile in args.profile:
        with contextlib.ExitStack() as stack:  # stops this profile's servers, also on Ctrl-C
            rows += run_profile(args, profile, manifest, stack, notes)
    header: dict[str, Any] = {
        "started": started,
        "machine": report.machine_info(),
        "model": model.summary(manifest),
        "settings": (
            f"rounds {args.rounds}, profiles {'+'.join(args.profile)}, cap "
            f"{args.cap / 1e6:g} MB/s per connection (capped), device {args.device}, "
            f"peers' ranged reads {8} MiB, tensorstream defaults"
            + (", quick" if args.quick else "")
            + ("; " + "; ".join(notes) if notes else "")
        ),
    }
    plot = None
    if args.markdown or args.plot:
        target = args.plot or args.markdown.with_suffix(".png")
        plot = report.write_plot(target, rows)
        if plot is None:
            header["settings"] += "; plot skipped (matplotlib not installed)"
    if args.json:
        report.write_json(args.json, header, rows)
    if args.markdown:
        rel = os.path.relpath(plot, args.markdown.parent) if plot else None
        report.write_markdown(args.markdown, header, rows, rel)
    sys.stdout.write(report.markdown(header, rows, None))
    return 0 if all(r["verified"] or r["status"] == "skipped" for r in rows) else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
