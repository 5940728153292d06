"""``python -m benchmarks.distributed``: N ranks load one model, with and without ``group=``.

Issue 20's scenario. The harness serves the synthetic model from the ``paced``
link (every connection capped by the kernel, ``--cap`` bytes/s) and, each
round, starts N fresh rank processes (gloo over ``tcp://127.0.0.1``) for each
contender, alternating them and rotating which goes first:

* ``group``: ``tensorstream.deserialize(uri, group="auto")`` -- the ranks read
  the model once between them and exchange it over gloo;
* ``independent``: every rank ``tensorstream.deserialize(uri)`` on its own
  (today's load; each rank pulls the whole model).

``--format safetensors`` loads ``model.safetensors`` with
``tensorstream.safetensors.load`` instead.

Each rank imports everything and joins the group before the clock; the clock
starts after a barrier and stops when the last rank has its tensors (a second
barrier): ``load_s`` is that group time (the slowest rank). ``process_s`` is
the whole run, from starting the processes to the last exit (imports, group
set-up). ``pulled`` is what the ranks received from storage, summed over the
ranks (each load's ``stats.bytes``: the provider's counters; tensorizer only);
``served`` is what the server wrote meanwhile (its ``wchar`` in
``/proc/PID/io``: sendfile bodies and headers). Every rank's
tensors are checksummed against the model's manifest after the clock.

Prints a Markdown table (``--markdown`` writes it, ``--json`` the rows).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from . import model, servers
from .run import parse_size

CONTENDERS = ("group", "independent")


# -- one rank (child process) ---------------------------------------------------------
def _rank_main(argv: list[str]) -> None:  # pragma: no cover - runs in the rank process
    rank, world, port = (int(x) for x in argv[:3])
    uri, contender, out = argv[3], argv[4], argv[5]
    safetensors = uri.endswith(".safetensors")
    import datetime

    import torch.distributed as dist

    import tensorstream
    import tensorstream.safetensors.reader
    import tensorstream.tensorizer.load
    from tensorstream.providers.registry import resolve_provider_class
    from tensorstream.uri import parse_uri

    resolve_provider_class(parse_uri(uri).scheme)
    if os.environ.get("BENCH_DIST_DEBUG"):  # each step's time, from every rank
        import logging

        logging.basicConfig(level=logging.WARNING, format=f"rank {rank}: %(message)s")
        logging.getLogger("tensorstream.distributed").setLevel(logging.DEBUG)
        logging.getLogger("tensorstream.load").setLevel(logging.INFO)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=900))
    dist.barrier()
    start = time.perf_counter()
    loaded: Any
    if safetensors:
        loaded = tensorstream.safetensors.load(uri, group="auto" if contender == "group" else None)
    elif contender == "group":
        loaded = tensorstream.deserialize(uri, device="cpu", group="auto")
    else:  # today's load; rank/world_size say "this file is this process's own"
        loaded = tensorstream.deserialize(uri, device="cpu", rank=0, world_size=1)
    mine = time.perf_counter() - start
    dist.barrier()
    group_s = time.perf_counter() - start
    stats = None if safetensors else loaded.stats
    checksum = model.tensor_checksum(loaded.items())
    with open(out, "w") as f:
        json.dump({"rank": rank, "rank_s": mine, "load_s": group_s,
                   "bytes": stats.bytes if stats else None,
                   "path": stats.path if stats else contender, "checksum": checksum}, f)
    if not safetensors:
        loaded.close()
    dist.destroy_process_group()


# -- the harness ------------------------------------------------------------------------
def _served(pid: int) -> int:
    """Bytes the server process has written so far (``wchar``: its sendfile bodies
    and headers): what storage served, counted on the server's side."""
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            if line.startswith("wchar:"):
                return int(line.split()[1])
    raise RuntimeError("no wchar in /proc/PID/io")


def _run_once(ranks: int, uri: str, contender: str, timeout: float,
              server_pid: int) -> dict[str, Any]:
    served = _served(server_pid)
    with tempfile.TemporaryDirectory(prefix="ts-bench-dist-") as folder:
        port = servers.free_port()
        outs = [os.path.join(folder, f"rank-{r}.json") for r in range(ranks)]
        started = time.perf_counter()
        procs = [subprocess.Popen([sys.executable, "-m", "benchmarks.distributed", "rank",
                                   str(r), str(ranks), str(port), uri, contender, outs[r]])
                 for r in range(ranks)]
        try:
            codes = [p.wait(timeout) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        process_s = time.perf_counter() - started
        if any(codes):
            raise RuntimeError(f"{contender}: rank exit codes {codes}")
        rows = [json.loads(Path(o).read_text()) for o in outs]
    return {"contender": contender, "load_s": max(r["load_s"] for r in rows),
            "slowest_rank_s": max(r["rank_s"] for r in rows), "process_s": process_s,
            "served": _served(server_pid) - served,
            "pulled": None if rows[0]["bytes"] is None else sum(r["bytes"] for r in rows),
            "paths": sorted({r["path"] for r in rows}),
            "checksums": [r["checksum"] for r in rows]}


def _median(rows: list[dict[str, Any]], key: str) -> tuple[float, float, float]:
    values = [r[key] for r in rows]
    return statistics.median(values), min(values), max(values)


def _table(args: argparse.Namespace, manifest: dict[str, Any], rows: list[dict[str, Any]],
           note: str) -> str:
    size = manifest["safetensors_size" if args.format == "safetensors" else "file_size"]
    lines = [
        f"{args.ranks} ranks (gloo, CPU), {args.format} `{manifest['shape']}` model of "
        f"{size / 2**20:.0f} MiB ({manifest['tensor_count']} tensors), {note}; "
        f"{args.rounds} rounds, contenders alternating in fresh processes; "
        f"load average before: {os.getloadavg()[0]:.2f}.",
        "",
        "| contender | load (median, min-max) | whole run (median) | served by storage "
        "| copies of the model | verified |",
        "|---|---|---|---|---|---|",
    ]
    medians = {}
    for c in CONTENDERS:
        mine = [r for r in rows if r["contender"] == c]
        if not mine:
            continue
        med, lo, hi = _median(mine, "load_s")
        medians[c] = med
        pulled = statistics.median(r["served"] for r in mine)
        ok = all(r["verified"] for r in mine)
        lines.append(f"| {c} | {med:.2f} s ({lo:.2f}-{hi:.2f}) "
                     f"| {_median(mine, 'process_s')[0]:.2f} s | {pulled / 2**20:.0f} MiB "
                     f"| {pulled / size:.2f} | {'yes' if ok else 'NO'} |")
    if len(medians) == 2:
        lines += ["", f"independent / group load time: "
                      f"{medians['independent'] / medians['group']:.2f}x"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.distributed", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--size", type=parse_size, default=parse_size("512MiB"))
    p.add_argument("--shape", choices=list(model.SHAPES), default="llama")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--format", choices=["tensorizer", "safetensors"], default="tensorizer",
                   help="deserialize() a tensorizer file or safetensors.load() (default tensorizer)")
    p.add_argument("--cap", type=parse_size, default=parse_size("25m"),
                   help="per-connection cap of the paced link, bytes/s")
    p.add_argument("--timeout", type=float, default=900, help="seconds per run")
    p.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "tensorstream-bench")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--markdown", type=Path, default=None)
    args = p.parse_args(argv)
    manifest = model.ensure_model(args.cache, args.size, 0, args.shape)
    root = Path(manifest["dir"])
    with tempfile.TemporaryDirectory(prefix="ts-bench-dist-work-") as work, \
            servers.start_link("paced", root.parent, Path(work), rate=args.cap) as link:
        name = "model.safetensors" if args.format == "safetensors" else "model.tensors"
        uri = f"{link.url}/{root.name}/{name}"  # the server serves /<folder>/<file>
        with open(root / name, "rb") as f:  # warm the page cache
            while f.read(64 << 20):
                pass
        rows = []
        for i in range(args.rounds):
            order = CONTENDERS[i % 2:] + CONTENDERS[: i % 2]
            for contender in order:
                row = _run_once(args.ranks, uri, contender, args.timeout,
                                link.servers[0].proc.pid)
                row["round"] = i
                row["verified"] = all(c == manifest["tensors_checksum"] for c in row["checksums"])
                del row["checksums"]
                rows.append(row)
                print(json.dumps(row), flush=True)
        table = _table(args, manifest, rows, f"paced link ({link.note})")
    print(table)
    if args.json:
        args.json.write_text(json.dumps({"manifest": manifest, "rows": rows}, indent=1))
    if args.markdown:
        args.markdown.write_text(table)
    return 0 if all(r["verified"] for r in rows) else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "rank":
        _rank_main(sys.argv[2:])
    else:
        sys.exit(main())
