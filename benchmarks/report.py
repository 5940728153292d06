"""Aggregate rounds into rows, and write them as JSON, Markdown and a PNG plot."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
from collections.abc import Iterable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["aggregate", "machine_info", "write_json", "write_markdown", "write_plot"]

MiB = 1 << 20


def aggregate(
    key: Mapping[str, Any], runs: list[dict[str, Any]], nbytes: int, skip: str | None
) -> dict[str, Any]:
    """One JSON row from the rounds of one contender (``runs`` empty when skipped)."""
    row: dict[str, Any] = dict(key)
    ok = [r for r in runs if r.get("seconds") is not None]
    if skip or not ok:
        errors = sorted({r["error"] for r in runs if r.get("error")})
        row.update(
            seconds_median=None,
            seconds_min=None,
            seconds_max=None,
            gbps_median=None,
            process_seconds_median=None,
            peak_rss_mib=None,
            baseline_rss_mib=None,
            verified=False,
            rounds=len(runs),
            status="skipped" if skip else "failed",
            note=skip or "; ".join(errors)[:300],
        )
        return row
    secs = [r["seconds"] for r in ok]
    med = statistics.median(secs)
    notes = sorted({r["note"] for r in ok if r.get("note")} | {r["error"] for r in runs if r.get("error")})
    rss = [r["peak_rss_mib"] for r in ok if r.get("peak_rss_mib") is not None]
    base = [r["baseline_rss_mib"] for r in ok if r.get("baseline_rss_mib") is not None]
    row.update(
        seconds_median=round(med, 4),
        seconds_min=round(min(secs), 4),
        seconds_max=round(max(secs), 4),
        gbps_median=round(nbytes / med / 1e9, 4) if med > 0 else None,
        process_seconds_median=round(statistics.median(r["process_seconds"] for r in ok), 3),
        peak_rss_mib=round(max(rss), 1) if rss else None,
        baseline_rss_mib=round(statistics.median(base), 1) if base else None,
        verified=len(ok) == len(runs) and all(r.get("verified") for r in ok),
        rounds=len(runs),
        status="ok" if len(ok) == len(runs) else "partly failed",
        note="; ".join(notes)[:300],
    )
    return row


def ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Speed of tensorstream relative to each peer in the same scenario/backend/profile
    (``peer median seconds / tensorstream median seconds``; > 1 means tensorstream is faster)."""
    out = []
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["scenario"], r["backend"], r["profile"]), []).append(r)
    for (scenario, backend, profile), group in groups.items():
        ts = [r for r in group if r.get("tensorstream") and r["seconds_median"]]
        if not ts:
            continue
        t = ts[0]["seconds_median"]
        peers = [r for r in group if not r.get("tensorstream") and r["seconds_median"]]
        for p in peers:
            out.append(
                dict(
                    scenario=scenario,
                    backend=backend,
                    profile=profile,
                    peer=p["contender"],
                    ratio=round(p["seconds_median"] / t, 2),
                )
            )
        tz = [p for p in peers if p["contender"].startswith("tensorizer num_readers")]
        if tz:
            best = min(tz, key=lambda p: p["seconds_median"])
            out.append(
                dict(
                    scenario=scenario,
                    backend=backend,
                    profile=profile,
                    peer=f"best tensorizer ({best['contender'].split()[-1]})",
                    ratio=round(best["seconds_median"] / t, 2),
                )
            )
    return out


def _version(cmd: list[str]) -> str:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
        return (p.stdout + p.stderr).strip().splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return "n/a"


def machine_info() -> dict[str, Any]:
    mem = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
    cpu = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    pkgs = {}
    for name in (
        "tensorstream",
        "torch",
        "tensorizer",
        "safetensors",
        "s3fs",
        "obstore",
        "boto3",
        "awscli",
        "aiohttp",
        "redis",
    ):
        try:
            pkgs[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pkgs[name] = "not installed"
    return {
        "cpus": os.cpu_count(),
        "cpu_model": cpu,
        "ram_gib": round(mem / (1 << 30), 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "packages": pkgs,
        "nginx": _version(["nginx", "-v"]),
        "redis_server": _version(["redis-server", "--version"]),
        "curl": _version(["curl", "--version"]),
    }


def write_json(path: Path, header: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"header": header, "rows": rows, "ratios": ratios(rows)}, indent=1))


def _fmt(v: Any, spec: str = ".3f") -> str:
    return "-" if v is None else format(v, spec)


def _rss(r: dict[str, Any]) -> str:
    peak, base = r.get("peak_rss_mib"), r.get("baseline_rss_mib")
    if peak is None:
        return "-"
    return f"{peak:.0f} (+{peak - base:.0f})" if base is not None else f"{peak:.0f}"


def markdown(header: dict[str, Any], rows: list[dict[str, Any]], plot: str | None) -> str:
    m = header["machine"]
    pk = ", ".join(f"{k} {v}" for k, v in m["packages"].items())
    lines = [
        f"Run {header['started']} — {m['cpus']} CPUs ({m['cpu_model']}), {m['ram_gib']} GiB RAM, "
        f"kernel {m['kernel']}, Python {m['python']}; {m['nginx']}; {m['redis_server']}.",
        "",
        f"Packages: {pk}.",
        "",
        f"Model: {header['model']}. Settings: {header['settings']}.",
        "",
        "Times are medians of the operation measured inside a fresh process (min-max across "
        "rounds); `process s` is the whole process (imports and verification included); "
        "peak RSS is the process's high-water mark (in brackets: above the RSS after imports; "
        "for external tools it includes the harness's ~30-90 MiB, which the kernel carries "
        "into a spawned child). `verified`: every round's result matched the generator's "
        "checksum (tensors, or bytes for raw reads and copies).",
        "",
        "| scenario | backend | profile | contender | s (median) | min-max | GB/s | process s "
        "| peak RSS MiB | verified | note |",
        "|---|---|---|---|---:|---|---:|---:|---:|---|---|",
    ]
    for r in rows:
        name = f"**{r['contender']}**" if r.get("tensorstream") else r["contender"]
        if r["status"] == "skipped":
            lines.append(
                f"| {r['scenario']} | {r['backend']} | {r['profile']} | {name} "
                f"| skipped | | | | | | {r['note']} |"
            )
            continue
        spread = f"{_fmt(r['seconds_min'])}-{_fmt(r['seconds_max'])}"
        verified = "yes" if r["verified"] else "**NO**"
        lines.append(
            f"| {r['scenario']} | {r['backend']} | {r['profile']} | {name} "
            f"| {_fmt(r['seconds_median'])} | {spread} | {_fmt(r['gbps_median'], '.2f')} "
            f"| {_fmt(r['process_seconds_median'], '.2f')} | {_rss(r)} "
            f"| {verified} | {r['note']} |"
        )
    rat = ratios(rows)
    if rat:
        lines += [
            "",
            "Speed ratios (peer median time / tensorstream median time; > 1: tensorstream is faster):",
            "",
            "| scenario | backend | profile | peer | ratio |",
            "|---|---|---|---|---:|",
        ]
        lines += [
            f"| {r['scenario']} | {r['backend']} | {r['profile']} | {r['peer']} | {r['ratio']:.2f}x |"
            for r in rat
        ]
    if plot:
        lines += ["", f"![GB/s per contender]({plot})"]
    return "\n".join(lines) + "\n"


def write_markdown(path: Path, header: dict[str, Any], rows: list[dict[str, Any]], plot: str | None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(markdown(header, rows, plot))


def write_plot(path: Path, rows: Iterable[dict[str, Any]]) -> str | None:
    """A bar chart of GB/s per contender, one panel per scenario/profile; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    panels: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        if r.get("gbps_median"):
            panels.setdefault((r["scenario"], r["profile"]), []).append(r)
    if not panels:
        return None
    heights = [max(2.0, 0.28 * len(v) + 1) for v in panels.values()]
    fig, axes = plt.subplots(
        len(panels), 1, figsize=(9, sum(heights)), gridspec_kw={"height_ratios": heights}, squeeze=False
    )
    for ax, ((scenario, profile), group) in zip(axes[:, 0], panels.items(), strict=True):
        labels = [f"{r['backend']}: {r['contender']}" for r in group]
        values = [r["gbps_median"] for r in group]
        colors = ["tab:orange" if r.get("tensorstream") else "tab:blue" for r in group]
        ax.barh(labels[::-1], values[::-1], color=colors[::-1])
        ax.set_title(f"{scenario} — {profile}", fontsize=10)
        ax.set_xlabel("GB/s (median, inside the process)")
        ax.tick_params(axis="y", labelsize=8)
        for i, v in enumerate(values[::-1]):
            ax.text(v, i, f" {v:.2f}", va="center", fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


if __name__ == "__main__":
    # Re-render a Markdown table from a JSON written by ``benchmarks.run``:
    # python -m benchmarks.report RESULTS.json OUT.md [PLOT.png]
    import sys

    data = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    plot = write_plot(Path(sys.argv[3]), data["rows"]) if len(sys.argv) > 3 else None
    write_markdown(out, data["header"], data["rows"], os.path.relpath(plot, out.parent) if plot else None)
