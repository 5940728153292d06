"""Ctrl-C during a stall: a command waiting on a server that accepted and went
silent (``timeout_idle`` far away) ends at once with 130 and its one line, and
``cp`` leaves no partial file (HTTP, S3, Redis; ``cat``, ``cp``, ``ls``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from signals import signals_as_from_a_terminal
from tensorstream.testing.backends import Backend

pytestmark = pytest.mark.usefixtures("isolated_env")


def _stall(store: Backend, kind: str) -> None:
    if kind == "http":
        store.faults.raw.stall_after_headers = 8.0
    elif kind == "s3":
        store.faults.latency(8.0)
    else:
        store.faults.raw.stall = True


@pytest.mark.parametrize("command", ["cat", "cp", "ls"])
@pytest.mark.parametrize("kind", ["http", "s3", "redis"])
def test_ctrl_c_during_a_stall_ends_the_command_at_once(
        request: pytest.FixtureRequest, tmp_path: Path, kind: str, command: str) -> None:
    if kind == "http" and command == "ls":
        pytest.skip("HTTP(S) has no listing")
    store: Backend = request.getfixturevalue(f"tensorstream_{kind}")
    key = f"stall-{uuid.uuid4().hex[:10]}/o.bin"
    store.put(key, os.urandom(1000))
    uri = store.uri(key)
    out = tmp_path / "out"
    out.mkdir()
    args = {"cat": [uri], "cp": [uri, str(out / "o.bin")],
            "ls": [uri.rpartition("/")[0] + "/"]}[command]
    env: dict[str, Any] = {**os.environ, **store.env, "PYTHONPATH": os.pathsep.join(sys.path)}
    _stall(store, kind)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tensorstream", command, *args, "--timeout-idle", "60"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
        preexec_fn=signals_as_from_a_terminal)
    time.sleep(2.0)  # started, and waiting on the silent server
    assert proc.poll() is None, proc.communicate()[1]
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert time.monotonic() - sent < 3.0
    assert proc.returncode == 130, err
    assert "interrupted by SIGINT" in err and "Traceback" not in err, err
    assert list(out.iterdir()) == []
