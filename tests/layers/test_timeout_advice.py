"""A timeout's error says which timeout ran out, its value and what to raise it to
(the option and the command line's flag), whichever provider and front door met it.

Before, a stalled server gave "timed out after 0 bytes" (HTTP(S), S3), "no data from
... within the idle timeout" or "Redis did not answer in time: Timeout reading from
...": nothing said that ``timeout_idle`` (or ``timeout_connect``) was the limit, how
long it was, or that it can be raised (boto3 and ``aws s3 cp`` say "Read timeout on
endpoint URL" just as little).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import tensorstream
from reliability_helpers import FullBacklogListener
from tensorstream import errors
from tensorstream.testing.backends import Backend

pytestmark = pytest.mark.usefixtures("isolated_env")

FAST = {"backoff_initial": 0.01, "backoff_max": 0.05}


def _stalled(request: pytest.FixtureRequest, kind: str) -> tuple[Backend, str]:
    """A backend holding an object, whose answers (from now on) never come."""
    store: Backend = request.getfixturevalue(f"tensorstream_{kind}")
    key = f"stall-{uuid.uuid4().hex[:10]}.bin"
    store.put(key, os.urandom(1000))
    if kind == "http":
        store.faults.raw.stall_after_headers = 3.0
    elif kind == "s3":
        store.faults.latency(3.0)
    else:
        store.faults.raw.stall = True
    return store, key


@pytest.mark.parametrize("door", ["open", "read_range"])
@pytest.mark.parametrize("kind", ["http", "s3", "redis"])
def test_a_stall_names_timeout_idle_its_value_and_what_to_raise_it_to(
        request: pytest.FixtureRequest, kind: str, door: str) -> None:
    store, key = _stalled(request, kind)
    options = {**store.options, "timeout_idle": 0.3, "retries": 2, **FAST}
    with pytest.raises(errors.RetriesExhaustedTimeoutError) as info:
        if door == "open":
            with tensorstream.open(store.uri(key), **options) as f:
                f.read()
        else:
            asyncio.run(tensorstream.read_range(store.uri(key), 0, 1000, **options))
    text = str(info.value)
    assert "timeout_idle=0.3 s" in text, text
    assert "timeout_idle=0.6" in text and "--timeout-idle 0.6" in text, text
    assert info.value.last_error.message in text  # the last attempt's error, advice and all


@pytest.fixture
def full_backlog() -> Iterator[FullBacklogListener]:
    with FullBacklogListener() as listener:
        yield listener


@pytest.mark.parametrize("kind", ["http", "s3", "redis"])
def test_a_connect_timeout_names_timeout_connect(full_backlog: FullBacklogListener,
                                                  kind: str) -> None:
    port = full_backlog.port
    uri, options = {
        "http": (f"http://127.0.0.1:{port}/m", {}),
        "s3": ("s3://bucket/m", {"s3_endpoint": f"http://127.0.0.1:{port}",
                                 "s3_access_key_id": "AKIDEXAMPLE",
                                 "s3_secret_access_key": "not-a-real-secret",
                                 "s3_region": "us-east-1"}),
        "redis": (f"redis://127.0.0.1:{port}/m", {}),
    }[kind]
    with pytest.raises(TimeoutError) as info:
        asyncio.run(tensorstream.stat(uri, timeout_connect=0.25, retries=1, **options))
    text = str(info.value)
    assert "timeout_connect=0.25 s" in text and "--timeout-connect 0.5" in text, text


def test_a_total_deadline_names_timeout_total_and_its_value(
        request: pytest.FixtureRequest) -> None:
    store, key = _stalled(request, "http")
    with pytest.raises(TimeoutError) as info, tensorstream.open(
            store.uri(key), timeout_total=0.5, timeout_idle=5, **FAST) as f:
        f.read()
    text = str(info.value)
    assert "timeout_total=0.5 s" in text and "timeout_total=1" in text, text


def test_the_command_line_says_which_flag_to_raise(request: pytest.FixtureRequest,
                                                    tmp_path: Path) -> None:
    store, key = _stalled(request, "http")
    env: dict[str, Any] = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(
        [sys.executable, "-m", "tensorstream", "cat", store.uri(key), "--timeout-idle", "0.3",
         "--retries", "1"], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 1
    assert "timeout_idle=0.3 s" in proc.stderr and "--timeout-idle 0.6" in proc.stderr, proc.stderr


def _client_sockets(port: int) -> list[Any]:
    """This process's open TCP sockets to ``port`` (the client's side only)."""
    import psutil

    return [c for c in psutil.Process().net_connections("tcp")
            if c.raddr and c.raddr.port == port]


@pytest.mark.parametrize("kind", ["http", "s3", "redis"])
def test_stalled_reads_leave_no_socket_or_thread_behind(request: pytest.FixtureRequest,
                                                         kind: str) -> None:
    """After each timed-out read (``open().read`` and ``read_range``, five rounds), no
    connection to the stalled server stays open in the client (it was dropped, never
    pooled) and no thread is left per failed read (a worker pool may still grow a
    little: two threads of slack for ten failed reads)."""
    import threading
    from urllib.parse import urlsplit

    store, key = _stalled(request, kind)
    options = {**store.options, "timeout_idle": 0.2, "retries": 1, **FAST}
    where = options.get("s3_endpoint") or store.uri(key)
    port = urlsplit(where).port
    assert port
    first = None
    for _ in range(5):
        with pytest.raises(TimeoutError), tensorstream.open(store.uri(key), **options) as f:
            f.read()
        with pytest.raises(TimeoutError):
            asyncio.run(tensorstream.read_range(store.uri(key), 0, 1000, **options))
        assert _client_sockets(port) == []
        first = first or threading.active_count()
    assert threading.active_count() <= first + 2, (first, threading.enumerate())


@pytest.mark.parametrize("command", ["cat", "cp"])
def test_the_command_line_bounds_a_trickle_with_timeout_total(
        request: pytest.FixtureRequest, tmp_path: Path, command: str) -> None:
    """A server trickling a byte every 0.2 s is never idle: only ``timeout_total``
    stops it, and the command line had no way to set it (``cat``/``cp`` of such an
    object ran for as long as the server trickled). ``--timeout-total`` bounds each
    read, retries included, and the error names it."""
    store: Backend = request.getfixturevalue("tensorstream_http")
    key = f"trickle-{uuid.uuid4().hex[:10]}.bin"
    store.put(key, os.urandom(4096))
    store.faults.rate_limit(5)
    env: dict[str, Any] = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = [str(tmp_path / "out.bin")] if command == "cp" else []
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "tensorstream", command, store.uri(key), *out,
         "--timeout-total", "1", "--timeout-idle", "5"],
        capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert time.monotonic() - started < 8
    assert "timeout_total=1 s" in proc.stderr and "--timeout-total 2" in proc.stderr, proc.stderr
    assert not (tmp_path / "out.bin").exists()


def test_the_command_line_refuses_a_nonsense_timeout_total() -> None:
    env: dict[str, Any] = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-m", "tensorstream", "cat", "http://127.0.0.1:9/x",
                           "--timeout-total", "-1"], capture_output=True, text=True, env=env,
                          timeout=60)
    assert proc.returncode == 2 and "timeout" in proc.stderr, proc.stderr
