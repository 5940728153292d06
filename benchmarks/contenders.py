"""Which contenders run, in which scenario, backend and profile, and how.

A :class:`Contender` is either a worker spec (``python -m benchmarks.worker``)
or an external command (curl, cat, ``aws s3 cp``, ``tensorstream cp``).
A contender whose tool is missing is kept with ``skip`` set to the reason, so
the report lists it as skipped instead of silently dropping it.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import shutil
import sys
from pathlib import Path
from typing import Any

__all__ = ["Contender", "Setup", "plan"]

BUCKET = "bench"
KEY = "model.tensors"
READERS = (None, 1, 2, 4, 8, 16)
QUICK_READERS = (None, 4)


@dataclasses.dataclass
class Setup:
    """Where everything lives for one profile (filled in by the runner)."""

    profile: str
    manifest: dict[str, Any]
    root: Path  # served directory: root/bench/model.tensors
    work: Path  # scratch for copies
    http: str  # base URL of nginx or the paced server
    redis_port: int | None
    ts_redis_key: str | None  # key tensorstream reads (its own manifest layout if written)
    moto: str | None
    small_file: Path | None  # source for local -> S3 (moto) writes
    device: str
    quick: bool


@dataclasses.dataclass
class Contender:
    scenario: str  # load | raw | copy
    backend: str  # local | http | s3 | redis
    name: str
    argv: list[str]
    expect: str  # expected checksum ('' when checked from `dest`)
    verify: str  # worker | file | tensor-file | s3-object | size
    dest: str | None = None
    bytes: int = 0
    skip: str | None = None
    is_tensorstream: bool = False
    s3_endpoint: str | None = None
    note: str = ""
    discard_stdout: bool = False  # an external tool writing the object to stdout (cat)


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def provider_missing(scheme: str) -> str | None:
    mod = {"file": "local", "http": "http", "s3": "s3", "redis": "redis"}[scheme]
    if not _has(f"tensorstream.providers.{mod}"):
        return f"tensorstream.providers.{mod} not available yet"
    return None


def cli_missing() -> str | None:
    return None if _has("tensorstream.cli.main") else "tensorstream cp (tensorstream.cli.main) not available"


def _worker(kind: str, **spec: Any) -> list[str]:
    return [sys.executable, "-m", "benchmarks.worker", json.dumps({"kind": kind, **spec})]


def _ts_cli(*args: str) -> list[str]:
    exe = Path(sys.executable).with_name("tensorstream")
    if exe.exists():
        return [str(exe), *args]
    return [sys.executable, "-c", "from tensorstream.cli.main import main; main()", *args]


def _aws() -> str | None:
    exe = Path(sys.executable).with_name("aws")
    return str(exe) if exe.exists() else shutil.which("aws")


def plan(s: Setup, backends: list[str], scenarios: list[str]) -> list[Contender]:
    """Every contender for one profile (local and Redis run in ``loopback`` only)."""
    m = s.manifest
    out: list[Contender] = []
    model = str(Path(m["dir"]) / "model.tensors")
    http_uri = f"{s.http}/{BUCKET}/{KEY}"
    s3_uri = f"s3://{BUCKET}/{KEY}"
    s3_path = f"{BUCKET}/{KEY}"
    size = m["file_size"]
    dev = s.device
    readers = QUICK_READERS if s.quick else READERS
    loop = s.profile == "loopback"
    redis_tz = f"redis://127.0.0.1:{s.redis_port}/model"
    redis_ts = f"redis://127.0.0.1:{s.redis_port}/0/{s.ts_redis_key}"

    def add(scenario: str, backend: str, name: str, argv: list[str], **kw: Any) -> None:
        kw.setdefault("expect", m["tensors_checksum"] if scenario == "load" else m["file_checksum"])
        kw.setdefault("verify", "worker")
        kw.setdefault("bytes", m["tensor_bytes"] if scenario == "load" else size)
        if backend == "s3":
            kw.setdefault("s3_endpoint", s.http)
        out.append(Contender(scenario, backend, name, argv, **kw))

    def tz_name(r: int | None) -> str:
        return "tensorizer (default readers)" if r is None else f"tensorizer num_readers={r}"

    if "load" in scenarios:
        targets = [
            ("local", "file", model, model),
            ("http", "http", http_uri, http_uri),
            ("s3", "s3", s3_uri, s3_uri),
            ("redis", "redis", redis_ts, redis_tz),
        ]
        for backend, scheme, ts_uri, tz_uri in targets:
            if backend not in backends or (backend in ("local", "redis") and not loop):
                continue
            if backend == "redis" and s.redis_port is None:
                continue
            add(
                "load",
                backend,
                "tensorstream",
                _worker("ts-load", uri=ts_uri, device=dev),
                skip=provider_missing(scheme),
                is_tensorstream=True,
            )
            for r in readers:
                add("load", backend, tz_name(r), _worker("tz-load", uri=tz_uri, device=dev, readers=r))
            if backend == "local":
                st = str(Path(m["dir"]) / "model.safetensors")
                add(
                    "load",
                    backend,
                    "safetensors load_file",
                    _worker("st-load", uri=st, device=dev),
                    skip=None if _has("safetensors") else "safetensors not installed",
                )

    if "raw" in scenarios:
        if "local" in backends and loop:
            add(
                "raw",
                "local",
                "tensorstream",
                _worker("ts-raw", uri=model),
                skip=provider_missing("file"),
                is_tensorstream=True,
            )
            add("raw", "local", "python readinto", _worker("file-raw", uri=model))
            add(
                "raw",
                "local",
                "cat > /dev/null",
                ["cat", model],
                verify="size",
                expect="",
                discard_stdout=True,
            )
        if "http" in backends:
            add(
                "raw",
                "http",
                "tensorstream",
                _worker("ts-raw", uri=http_uri),
                skip=provider_missing("http"),
                is_tensorstream=True,
            )
            add(
                "raw",
                "http",
                "obstore get_ranges (HTTPStore)",
                _worker("obstore-ranges", uri=http_uri, size=size),
                skip=None if _has("obstore") else "obstore not installed",
            )
            add("raw", "http", "tensorizer stream (curl)", _worker("tz-raw", uri=http_uri, size=size))
            add(
                "raw",
                "http",
                "curl > /dev/null",
                ["curl", "-sf", "-o", "/dev/null", "-w", "%{time_total} %{size_download}", http_uri],
                verify="size",
                expect="",
                skip=None if shutil.which("curl") else "curl not installed",
            )
        if "s3" in backends:
            add(
                "raw",
                "s3",
                "tensorstream",
                _worker("ts-raw", uri=s3_uri),
                skip=provider_missing("s3"),
                is_tensorstream=True,
            )
            add("raw", "s3", "s3fs open().read()", _worker("s3fs-read", uri=s3_uri, path=s3_path))
            add(
                "raw",
                "s3",
                "s3fs cat_ranges",
                _worker("s3fs-cat-ranges", uri=s3_uri, path=s3_path, size=size),
            )
            add(
                "raw",
                "s3",
                "obstore get_ranges (S3Store)",
                _worker("obstore-ranges", uri=s3_uri, path=s3_path, size=size),
                skip=None if _has("obstore") else "obstore not installed",
            )
            add("raw", "s3", "boto3 get_object", _worker("boto3-get", uri=s3_uri, path=s3_path))
        if "redis" in backends and loop and s.redis_port is not None:
            add(
                "raw",
                "redis",
                "tensorstream",
                _worker("ts-raw", uri=redis_ts),
                skip=provider_missing("redis"),
                is_tensorstream=True,
            )

    if "copy" in scenarios:
        dest = str(s.work / "copy.out")
        aws = _aws()
        if "s3" in backends:
            ts_skip = provider_missing("s3") or cli_missing()
            add(
                "copy",
                "s3",
                "tensorstream cp",
                _ts_cli("cp", s3_uri, dest),
                verify="file",
                dest=dest,
                is_tensorstream=True,
                skip=ts_skip,
            )
            add(
                "copy",
                "s3",
                "aws s3 cp",
                [aws or "aws", "s3", "cp", "--only-show-errors", "--endpoint-url", s.http, s3_uri, dest],
                verify="file",
                dest=dest,
                skip=None if aws else "awscli not installed",
            )
            add(
                "copy",
                "s3",
                "s3fs get_file",
                _worker("s3fs-get", path=s3_path, dest=dest),
                verify="file",
                dest=dest,
            )
        if "redis" in backends and loop and s.redis_port is not None:
            add(
                "copy",
                "redis",
                "tensorstream cp",
                _ts_cli("cp", redis_ts, dest),
                verify="file",
                dest=dest,
                is_tensorstream=True,
                skip=provider_missing("redis") or cli_missing(),
            )
            add(
                "copy",
                "redis",
                "redis-py GET chunks -> file",
                _worker("redis-py-cp", port=s.redis_port, key="model", dest=dest),
                verify="tensor-file",
                dest=dest,
                expect=m["tensors_checksum"],
            )
        if "s3" in backends and loop and s.moto and s.small_file is not None:
            src = str(s.small_file)
            n = s.small_file.stat().st_size
            up = f"s3://{BUCKET}/upload.bin"
            kw: dict[str, Any] = dict(
                verify="s3-object", bytes=n, s3_endpoint=s.moto, note="to moto (slow server; small object)"
            )
            kw["expect"] = ""
            add(
                "copy",
                "local->s3",
                "tensorstream cp",
                _ts_cli("cp", src, up),
                is_tensorstream=True,
                skip=provider_missing("s3") or cli_missing(),
                **kw,
            )
            add(
                "copy",
                "local->s3",
                "aws s3 cp",
                [aws or "aws", "s3", "cp", "--only-show-errors", "--endpoint-url", s.moto, src, up],
                skip=None if aws else "awscli not installed",
                **kw,
            )
            add(
                "copy",
                "local->s3",
                "s3fs put",
                _worker("s3fs-put", src=src, path=f"{BUCKET}/upload.bin"),
                **kw,
            )
    return out
