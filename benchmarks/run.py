"""``python -m benchmarks.run``: the benchmark matrix, tensorstream side by side with its peers.

Every cell of links x model shapes x scenarios runs in one invocation. The
harness starts its own servers on free loopback ports (and always stops them,
also on Ctrl-C), generates the synthetic models and copy objects (cached),
warms the page cache (and each run's files again right before it), runs each
link's first contender once untimed, runs every
contender in a fresh process -- contenders of
a cell alternate and the cell's first contender rotates every round and from
cell to cell -- verifies
every result, and writes JSON, Markdown and one PNG plot per scenario. See
``docs/benchmarks.md`` and ``--help``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import fnmatch
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
LINKS = ["loopback", "paced", "bucket", "ttfb", "moto", "local"]
#: Links run only when named (``benchmarks.servers``: shapes not to be tuned to).
EXTRA_LINKS = ["store", "step", "shared", "limited", "tls"]
SHAPES = [s for s in model.SHAPES if s not in model.EXTRA_SHAPES]
SCENARIOS = ["load", "copy", "startup", "raw"]
BACKENDS = ["local", "http", "s3", "redis"]

#: The group of served files the copy and start-up cells read.
COPY_FILES = "copy objects"


def parse_size(text: str) -> int:
    """``1GiB``, ``256MiB``, ``25m`` (10**6), ``1073741824``."""
    match = re.fullmatch(r"\s*([\d.]+)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in UNITS:
        raise argparse.ArgumentTypeError(f"bad size {text!r}")
    return int(float(match.group(1)) * UNITS[match.group(2).lower()])


def _csv(choices: list[str], extra: tuple[str, ...] = ()) -> Any:
    """Comma-separated ``choices`` (``all``: every one), or ``extra`` ones named."""
    def parse(text: str) -> list[str]:
        items = choices if text == "all" else [t.strip() for t in text.split(",") if t.strip()]
        bad = set(items) - set(choices) - set(extra)
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {sorted(bad)}; choose from "
                                             f"{choices + list(extra)}")
        return items

    return parse


def _folder(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"(\d+)x(.+)", text)
    if not match:
        raise argparse.ArgumentTypeError(f"bad folder {text!r}: COUNTxSIZE, e.g. 100x4MiB")
    return int(match.group(1)), parse_size(match.group(2))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__)
    p.add_argument("--size", type=parse_size, default=None, help="model size (default 1GiB; quick 256MiB)")
    p.add_argument("--rounds", type=int, default=None, help="rounds (default 3; quick 1)")
    p.add_argument("--links", "--link", type=_csv(LINKS, tuple(EXTRA_LINKS)), default=None,
                   help=f"{','.join(LINKS)} or all; also {','.join(EXTRA_LINKS)} (never in all)")
    p.add_argument("--shapes", "--shape", type=_csv(SHAPES, tuple(model.EXTRA_SHAPES)), default=None,
                   help=f"{','.join(SHAPES)} or all; also {','.join(model.EXTRA_SHAPES)} (never in all)")
    p.add_argument(
        "--scenarios",
        "--scenario",
        type=_csv(SCENARIOS),
        default=None,
        help="load,copy,startup (default) and raw",
    )
    p.add_argument(
        "--backends", "--backend", type=_csv(BACKENDS), default=None, help="local,http,s3 (default) and redis"
    )
    p.add_argument(
        "--contenders",
        type=_csv(list(contenders.GROUPS + contenders.OPTIONAL_GROUPS)),
        default=None,
        help=f"contender groups to run: {','.join(contenders.GROUPS)} (default), "
        f"optional {','.join(contenders.OPTIONAL_GROUPS)}, or all",
    )
    p.add_argument("--cap", type=parse_size, default=parse_size("25m"), help="per-connection cap, bytes/s")
    p.add_argument(
        "--burst", type=parse_size, default=parse_size("8MiB"), help="token bucket burst per connection"
    )
    p.add_argument("--ttfb", default="20,50", help="time to first byte, ms: MIN,MAX (default 20,50)")
    p.add_argument("--moto-size", type=parse_size, default=None, help="model size on moto (default 32MiB)")
    p.add_argument(
        "--moto-shapes", type=_csv(SHAPES), default=None, help="shapes on moto (default llama,small)"
    )
    p.add_argument("--copy-size", type=parse_size, default=None, help="the one-object copy (default --size)")
    p.add_argument("--folder", type=_folder, default=None, help="folder copy COUNTxSIZE (default 100x4MiB)")
    p.add_argument(
        "--copy-links", type=_csv(LINKS, tuple(EXTRA_LINKS)), default=None,
        help="links for copies (default loopback,paced)",
    )
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", type=Path, default=None, help="write rows here")
    p.add_argument("--markdown", type=Path, default=None, help="write the tables here")
    p.add_argument("--plot", type=Path, default=None, help="PNG prefix (default: beside --markdown)")
    p.add_argument("--title", default="", help="a line for the header (e.g. 'before: main at abc123')")
    p.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "tensorstream-bench")
    p.add_argument("--timeout", type=float, default=600, help="seconds per contender run")
    p.add_argument(
        "--budget",
        type=float,
        default=0,
        help="minutes: start no run after this; what did not run is reported as not run (0: no limit)",
    )
    p.add_argument("--settle", type=float, default=0.5, help="max seconds to wait for an idle CPU per run")
    p.add_argument("--warmup", type=int, default=1,
                   help="untimed runs of each link's first contender before its first round (default 1)")
    p.add_argument(
        "--baseline",
        metavar="SRC",
        help="another checkout's src/: its tensorstream.deserialize (and, with ts-safetensors, its "
        "safetensors.load) runs beside this tree's in every load cell, its cp in every copy and "
        "startup cell ('... (baseline)', alternating like every contender; never a peer)",
    )
    p.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="PATTERN",
        help="skip contenders whose 'scenario/link/shape/backend/contender' matches this glob "
        "(repeatable; e.g. 'load/paced/*/http/tensorizer num_readers=1'); they are reported as skipped",
    )
    p.add_argument(
        "--list", action="store_true", help="print the plan (every contender of every cell), run nothing"
    )
    p.add_argument("--quick", action="store_true", help="256MiB, 1 round, fewer tensorizer reader counts")
    a = p.parse_args(argv)
    a.size = a.size or parse_size("256MiB" if a.quick else "1GiB")
    a.rounds = a.rounds or (1 if a.quick else 3)
    a.links = a.links or LINKS
    a.shapes = a.shapes or SHAPES
    a.scenarios = a.scenarios or ["load", "copy", "startup"]
    a.backends = a.backends or ["local", "http", "s3"]
    a.contenders = tuple(a.contenders or contenders.GROUPS)
    a.moto_size = a.moto_size or parse_size("8MiB" if a.quick else "32MiB")
    a.moto_shapes = [s for s in (a.moto_shapes or ["llama", "small"])]
    a.copy_size = a.copy_size or a.size
    a.folder = a.folder or ((10, 1 << 20) if a.quick else (100, 4 << 20))
    a.copy_links = a.copy_links or ["loopback", "paced"]
    lo, hi = (float(x) / 1e3 for x in a.ttfb.split(","))
    a.ttfb_s = (lo, hi)
    return a


def child_env(home: Path) -> dict[str, str]:
    """Environment for contenders: dummy S3 keys, no real credentials or config files,
    this tree's ``src`` first on the path (the harness measures the code beside it)."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "S3_", "REDIS_", "TENSORSTREAM_"))
    }
    # Bytecode as an installed package has it (pip compiles on install): with
    # PYTHONDONTWRITEBYTECODE (set on shared machines) every child compiled the
    # tree's ~50 modules again, ~0.06-0.1 s of each tensorstream process. The
    # trees are compiled once before the runs (compile_trees).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    home.mkdir(parents=True, exist_ok=True)
    paths = [str(REPO / "src"), str(REPO)] if (REPO / "src").is_dir() else [str(REPO)]
    env.update(
        HOME=str(home),
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench-secret",
        AWS_REGION="us-east-1",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_EC2_METADATA_DISABLED="true",
        AWS_CONFIG_FILE=str(home / "aws-config"),
        AWS_SHARED_CREDENTIALS_FILE=str(home / "aws-creds"),
        PYTHONPATH=os.pathsep.join(filter(None, [*paths, env.get("PYTHONPATH")])),
    )
    return env


def compile_trees(trees: list[str]) -> None:
    """Write the bytecode of these source trees (``__pycache__``, ignored by git)
    before any timed run, so no contender's first round pays for compiling."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    for tree in trees:
        if Path(tree).is_dir():
            subprocess.run([sys.executable, "-m", "compileall", "-q", tree], env=env,
                           stdout=subprocess.DEVNULL, check=False)


def _clear(c: Contender) -> None:
    if not c.dest:
        return
    dest = Path(c.dest)
    if dest.is_dir():
        shutil.rmtree(dest)
    else:
        dest.unlink(missing_ok=True)


def run_once(c: Contender, env: dict[str, str], timeout: float) -> dict[str, Any]:
    """Run one contender in a fresh process; time it, collect its peak RSS, verify it."""
    _clear(c)
    env = dict(env)
    if c.s3_endpoint:
        env.update(
            BENCH_S3_ENDPOINT=c.s3_endpoint,
            AWS_ENDPOINT_URL=c.s3_endpoint,
            AWS_ENDPOINT_URL_S3=c.s3_endpoint,
            S3_ENDPOINT_URL=c.s3_endpoint,
        )
    env.update(c.env)
    # An external tool's peak RSS comes from GNU time: the kernel carries the forking
    # process's RSS high-water mark across exec, so wait4 would report the harness's own
    # peak for a tool smaller than it (s5cmd: ~20 MiB). Workers report their own.
    gnu_time = Path("/usr/bin/time")
    external = c.argv[1:3] != ["-m", "benchmarks.worker"] and gnu_time.exists()
    rss_file = tempfile.NamedTemporaryFile(prefix="tsbench-rss-", delete=False) if external else None
    argv = c.argv
    if rss_file is not None:
        rss_file.close()
        argv = [str(gnu_time), "-q", "-f", "%M", "-o", rss_file.name, *c.argv]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        sink = subprocess.DEVNULL if c.discard_stdout else out
        proc = subprocess.Popen(argv, stdout=sink, stderr=err, stdin=subprocess.DEVNULL, env=env, cwd=REPO)
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
    if rss_file is not None:
        try:
            res["peak_rss_mib"] = int(Path(rss_file.name).read_text().split()[-1]) / 1024
        except (OSError, ValueError, IndexError):
            pass  # keep wait4's figure
        finally:
            Path(rss_file.name).unlink(missing_ok=True)
    if proc.returncode != 0:
        if wall >= timeout:
            return {**res, "seconds": None, "error": f"timed out after {timeout:.0f} s"}
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
        if not res["verified"]:
            res["error"] = "result does not match the expected checksum"
    except Exception as exc:  # a broken check marks the row unverified; the run goes on
        res.update(verified=False, error=f"verification failed: {exc!r}"[:300])
    _clear(c)  # the next contender starts from the same empty destination and free disk
    return res


def verify(c: Contender, res: dict[str, Any]) -> bool:
    if c.verify == "worker":
        return bool(res.get("checksum") == c.expect)
    if c.verify == "size":
        return bool(res.get("bytes") == c.bytes)
    if c.verify == "exit":
        return True  # a failed exit is reported as an error before verification
    if c.verify == "file":
        return bool(c.dest and Path(c.dest).is_file() and model.file_checksum(c.dest) == c.expect)
    if c.verify == "folder":
        return model.verify_folder(c.dest or "", c.expect)
    if c.verify == "tensor-file":
        return bool(_child("tensor-file", c.dest or "", c.expect))
    return False


def _child(*args: str) -> Any:
    """Run ``python -m benchmarks.model ARGS`` and return its JSON result (heavy work
    stays out of the harness: the kernel carries its RSS high-water mark into children)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"), str(REPO), env.get("PYTHONPATH")]))
    p = subprocess.run(
        [sys.executable, "-m", "benchmarks.model", *args], cwd=REPO, capture_output=True, text=True, env=env
    )
    line = next((x for x in p.stdout.splitlines() if x.startswith("BENCH-RESULT ")), None)
    if p.returncode != 0 or line is None:
        raise RuntimeError(f"benchmarks.model {args[0]} failed:\n{p.stderr[-2000:]}")
    return json.loads(line[len("BENCH-RESULT ") :])


def _warm(paths: list[Path]) -> None:
    """Read ``paths`` into the page cache (one reused buffer: a file already there
    costs its copy only, ~0.05 s per 512 MiB)."""
    buf = bytearray(8 << 20)
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while f.readinto(buf):
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


def _settle(timeout: float) -> None:
    """Before each timed run: flush dirty pages (copies write hundreds of MiB) and
    wait (up to ``timeout``) for the machine to go idle, so that no contender pays
    for the previous one's aftermath. Other users of a shared machine keep it busy:
    the wait is bounded, and alternation spreads what remains over every contender."""
    os.sync()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _cpu_busy() > 0.10:
        pass


def _warm_up(plan: list[Contender], env: dict[str, str], args: argparse.Namespace) -> None:
    """Run the link's first runnable contender ``--warmup`` times and discard the
    results: the first runs after a link's servers start and its files are read
    into the page cache were slow for every contender (docs/benchmarks.md,
    "Session 22"), and without this they fell on whichever contender the first
    cell ran first."""
    first = next((c for c in plan if not c.skip and not c.alias_of), None)
    if first is None:
        return
    for _ in range(args.warmup):
        if time.monotonic() > args.stop_at:
            return
        _settle(timeout=min(args.settle, 0.5) if args.quick else args.settle)
        res = run_once(first, env, args.timeout)
        secs = f"{res['seconds']:.3f}s" if res.get("seconds") else res.get("error", "")
        where = f"{first.scenario}/{first.link}/{first.shape}/{first.backend}"
        print(f"[warm-up {time.strftime('%H:%M:%S')}] {where} {first.name}: {secs} (discarded)",
              flush=True)


def _link_files(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def _serve_tree(root: Path, manifests: dict[str, dict[str, Any]],
                blobs: dict[str, Any] | None) -> dict[str, list[Path]]:
    """Hard-link the models and copy objects under ``root/bench``; return the files,
    by what reads them: each shape's model files under its name, the copy objects
    under ``COPY_FILES``."""
    files: dict[str, list[Path]] = {}
    for shape, m in manifests.items():
        for name in (KEY, "model.safetensors"):
            src = Path(m["dir"]) / name
            _link_files(src, root / BUCKET / shape / name)
            files.setdefault(shape, []).append(src)
    if blobs:
        bdir = Path(blobs["dir"])
        copied = files.setdefault(COPY_FILES, [])
        for name in (blobs["object"]["name"], blobs["one_mib"]["name"]):
            _link_files(bdir / name, root / BUCKET / name)
            copied.append(bdir / name)
        for name in blobs["folder"]["files"]:
            _link_files(bdir / "folder" / name, root / BUCKET / blobs["folder"]["name"] / name)
            copied.append(bdir / "folder" / name)
    return files


def _read_by(c: Contender, files: dict[str, list[Path]]) -> list[Path]:
    """The files ``c``'s run reads (its shape's model files, or the copy objects)."""
    if c.scenario in ("copy", "startup"):
        return files.get(COPY_FILES, [])
    return files.get(c.shape, [])


def run_link(
    args: argparse.Namespace,
    link: str,
    manifests: dict[str, dict[str, Any]],
    blobs: dict[str, Any] | None,
    stack: contextlib.ExitStack,
    notes: list[str],
) -> list[dict[str, Any]]:
    tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=f"tsbench-{link}-")))
    root = tmp / "root"
    (root / BUCKET).mkdir(parents=True)
    scenarios = [s for s in args.scenarios if s != "copy" or link in args.copy_links]
    if link == "moto":
        scenarios = [s for s in scenarios if s == "load"]
        manifests = {s: m for s, m in manifests.items() if s in args.moto_shapes}
    copies = blobs if ("copy" in scenarios or "startup" in scenarios) and link != "local" else None
    files = _serve_tree(root, manifests, copies)
    url = None
    link_env: dict[str, str] = {}
    redis_port = None
    if args.list or args.stopped:  # the plan only: no servers, no runs
        url = None if link == "local" else "http://127.0.0.1:0"
    elif link != "local":
        srv = stack.enter_context(
            servers.start_link(link, root, tmp, rate=args.cap, burst=args.burst, ttfb=args.ttfb_s)
        )
        url = srv.url
        link_env = srv.env
        if link in ("paced", "bucket", "ttfb", *EXTRA_LINKS) and link not in ("limited", "tls"):
            shape = next(iter(manifests))
            rate = servers.measure_one_connection(f"{url}/{BUCKET}/{shape}/{KEY}", 32 << 20)
            notes.append(f"{link} ({srv.note}): one connection read 32 MiB at {rate / 1e6:.1f} MB/s")
        else:
            notes.append(f"{link}: {srv.note}")
        if link == "moto":
            objects = {
                f"{BUCKET}/{shape}/{name}": str(Path(m["dir"]) / name)
                for shape, m in manifests.items()
                for name in (KEY, "model.safetensors")
            }
            _child("moto-upload", url, json.dumps(objects))  # moto takes any keys
        if link == "loopback" and "redis" in args.backends and "load" in scenarios:
            r = stack.enter_context(servers.start_redis(tmp / "redis"))
            redis_port = r.port
            for shape, m in manifests.items():
                problem = _child("redis", str(r.port), str(Path(m["dir"]) / KEY), shape, f"tz-{shape}")
                if problem:
                    notes.append(problem)
    if not (args.list or args.stopped):
        _warm([f for group in files.values() for f in group])
    setup = Setup(
        link=link,
        manifests=manifests,
        blobs=copies,
        root=root,
        work=tmp,
        url=url,
        device=args.device,
        quick=args.quick,
        groups=args.contenders,
        redis_port=redis_port,
        baseline=args.baseline,
    )
    plan = contenders.plan(setup, scenarios, list(manifests), args.backends)
    for c in plan:
        where = "/".join((*c.cell, c.name))
        hit = next((pat for pat in args.exclude if fnmatch.fnmatchcase(where, pat)), None)
        if hit and not c.skip:
            c.skip, c.alias_of = f"excluded from this run (--exclude '{hit}')", None
    resolve_aliases(plan)
    env = {**child_env(tmp / "home"), **link_env}
    runs: list[list[dict[str, Any]]] = [[] for _ in plan]
    if args.list:
        for c in plan:
            state = f"skipped: {c.skip}" if c.skip else (f"= {c.alias_of}" if c.alias_of else "runs")
            print(f"{'/'.join(c.cell)} {c.name}: {state}")
        return []
    _warm_up(plan, env, args)
    for rnd in range(args.rounds):
        for i in round_order(plan, rnd):
            c = plan[i]
            if c.skip or c.alias_of:
                continue
            if time.monotonic() > args.stop_at:
                args.stopped = True
                break
            # This run's files are read again first: a kernel that reclaims pages idle for
            # a minute (DAMON here: 60 s) had let rounds after the first find them on disk,
            # whichever contender came first (docs/benchmarks.md, session 29).
            _warm(_read_by(c, files))
            _settle(timeout=min(args.settle, 0.5) if args.quick else args.settle)
            res = run_once(c, env, args.timeout)
            runs[i].append(res)
            status = "ok" if res.get("verified") else ("UNVERIFIED" if res.get("seconds") else "FAILED")
            secs = f"{res['seconds']:.3f}s" if res.get("seconds") else res.get("error", "")
            where = f"{c.scenario}/{c.link}/{c.shape}/{c.backend}"
            print(f"[r{rnd + 1} {time.strftime('%H:%M:%S')}] {where} {c.name}: {secs} {status}", flush=True)
        if args.stopped:
            break
    for c, rs in zip(plan, runs, strict=True):
        if args.stopped and not rs and not c.skip and not c.alias_of:
            c.skip = f"not run: the run's --budget of {args.budget:g} min ran out"
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    for c, rs in zip(plan, runs, strict=True):
        key = dict(
            scenario=c.scenario,
            link=c.link,
            shape=c.shape,
            backend=c.backend,
            contender=c.name,
            family=c.family,
            tensorstream=c.is_tensorstream,
        )
        if c.alias_of:
            continue
        row = report.aggregate(key, rs, c.bytes, c.skip)
        if c.note:
            row["note"] = f"{c.note}; {row['note']}".strip("; ")
        rows[(*c.cell, c.name)] = row
    out = []
    for c in plan:  # aliases copy their target's numbers, in plan order
        if c.alias_of:
            target = rows.get((*c.cell, c.alias_of))
            row = dict(target) if target else report.aggregate({}, [], c.bytes, f"alias of {c.alias_of}")
            row.update(
                scenario=c.scenario,
                link=c.link,
                shape=c.shape,
                backend=c.backend,
                contender=c.name,
                family=c.family,
                tensorstream=False,
                status="alias",
                alias_of=c.alias_of,
                note=c.note,
            )
            out.append(row)
        else:
            out.append(rows[(*c.cell, c.name)])
    return out


def resolve_aliases(plan: list[Contender]) -> None:
    """An alias (the same configuration as another contender of its cell, measured once)
    whose target does not run -- absent, excluded or skipped -- runs itself, and the other
    aliases of that target point at it instead."""
    runs = {(*c.cell, c.name) for c in plan if not c.skip and not c.alias_of}
    moved: dict[tuple[str, ...], str] = {}
    for c in plan:
        if not c.alias_of or c.skip:
            continue
        key = (*c.cell, c.alias_of)
        if key in runs:
            continue
        if key in moved:
            c.alias_of = moved[key]
        else:
            moved[key] = c.name
            c.alias_of = None
            c.note = f"{c.note}; measured here ({key[-1]} does not run)".strip("; ")


def round_order(plan: list[Contender], rnd: int) -> list[int]:
    """Indices of ``plan`` in the order round ``rnd`` runs them: contenders
    alternate within each cell; the cell's first contender rotates with the
    round *and* from cell to cell (so a one-round matrix does not start every
    cell with the same contender), and odd rounds run the rest backwards (A B C,
    B A C, C A B, A C B, ...), so whatever the first run after another cell
    pays (its memory being freed, caches) is spread over every contender
    instead of always landing on one, and no contender always runs right after
    the same other one (measured: a ``cp`` right after s5cmd's took 3.2 s, the
    next one 2.0 s, 4 fixed-order rounds)."""
    groups: dict[tuple[str, ...], list[int]] = {}
    for i, c in enumerate(plan):
        groups.setdefault(c.cell, []).append(i)
    order: list[int] = []
    for cell_no, members in enumerate(groups.values()):
        k = (rnd + cell_no) % len(members)
        turn = members[k:] + members[:k]
        order += [turn[0], *turn[:0:-1]] if rnd % 2 else turn
    return order


def _git(*args: str) -> str:
    try:
        return subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM behaves like Ctrl-C, so the ExitStacks below always stop the servers.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    t0 = time.monotonic()
    args.stop_at = t0 + args.budget * 60 if args.budget > 0 else float("inf")
    args.stopped = False
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    shapes = list(dict.fromkeys(args.shapes + (args.moto_shapes if "moto" in args.links else [])))
    print(f"models ({', '.join(shapes)}, {args.size >> 20} MiB) under {args.cache} ...", flush=True)
    manifests = {s: _child("model", str(args.cache), str(args.size), "0", s) for s in args.shapes}
    moto_manifests = {}
    if "moto" in args.links and "load" in args.scenarios:
        moto_manifests = {
            s: _child("model", str(args.cache), str(args.moto_size), "0", s) for s in args.moto_shapes
        }
    blobs = None
    if {"copy", "startup"} & set(args.scenarios):
        count, each = args.folder
        blobs = _child("blobs", str(args.cache), str(args.copy_size), str(count), str(each))
    notes: list[str] = []
    rows: list[dict[str, Any]] = []
    if not args.list:
        compile_trees([str(REPO / "src"), *([args.baseline] if args.baseline else [])])
    for link in args.links:
        with contextlib.ExitStack() as stack:  # stops this link's servers, also on Ctrl-C
            ms = moto_manifests if link == "moto" else manifests
            rows += run_link(args, link, ms, blobs, stack, notes)
    if args.list:
        return 0
    commit = _git("rev-parse", "--short", "HEAD")
    subject = _git("log", "-1", "--format=%s")[:80]
    header: dict[str, Any] = {
        "title": args.title,
        "started": started,
        "minutes": round((time.monotonic() - t0) / 60, 1),
        "commit": commit,
        "commit_subject": subject,
        "machine": report.machine_info(),
        "models": {s: model.summary(m) for s, m in manifests.items()},
        "moto_models": {s: model.summary(m) for s, m in moto_manifests.items()},
        "copies": (
            f"one object of {args.copy_size >> 20} MiB; a folder of {args.folder[0]} x "
            f"{args.folder[1] >> 20} MiB; a 1 MiB object (startup)"
            if blobs
            else ""
        ),
        "settings": (
            f"rounds {args.rounds}; links {'+'.join(args.links)} (copies on {'+'.join(args.copy_links)}); "
            f"shapes {'+'.join(args.shapes)}; scenarios {'+'.join(args.scenarios)}; backends "
            f"{'+'.join(args.backends)}; cap {args.cap / 1e6:g} MB/s per connection (paced, bucket), burst "
            f"{args.burst >> 20} MiB (bucket), time to first byte {args.ttfb} ms (ttfb); moto: "
            f"{'+'.join(args.moto_shapes)} at {args.moto_size >> 20} MiB; device {args.device}; "
            "tensorstream defaults"
            + (f"; budget {args.budget:g} min" if args.budget else "")
            + ("; STOPPED at the budget: later runs are reported as not run" if args.stopped else "")
            + (", quick" if args.quick else "")
            + (f"; excluded: {', '.join(repr(x) for x in args.exclude)}" if args.exclude else "")
        ),
        "notes": notes,
    }
    plots: dict[str, str] = {}
    if args.markdown or args.plot:
        prefix = args.plot or args.markdown.with_suffix(".png")
        plots = report.write_plots(prefix, rows)
        if not plots:
            header["notes"].append("plots skipped (matplotlib not installed, or nothing measured)")
    if args.json:
        report.write_json(args.json, header, rows)
    if args.markdown:
        rel = {k: os.path.relpath(v, args.markdown.parent) for k, v in plots.items()}
        report.write_markdown(args.markdown, header, rows, rel)
    sys.stdout.write(report.markdown(header, rows, {}))
    return 0 if all(r.get("verified") or r["status"] in ("skipped", "alias") for r in rows) else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
