"""A process forked while another thread was inside the HTTP data plane (a load in
the background when ``multiprocessing``, a DataLoader or vLLM forks its workers):
the child has only the forking thread, so a lock another thread held at the fork
is held there for ever. The child's first read through an inherited reader, or a
fresh one, waited on it for ever; it now reads (the child's locks are new)."""

from __future__ import annotations

import json
import os

import pytest

from reliability_helpers import run_python
from tensorstream.testing.http_server import HTTPTestServer

_CODE = r"""
import json, os, sys, threading, time
import tensorstream
from tensorstream.providers._http import receiver, threads, throttle
url, which = sys.argv[1], sys.argv[2]
f = tensorstream.open(url, part_size=256 << 10)
data = f.read()
locks = {
    "pool": lambda: f._provider.inner._pool._lock,           # the reader's connections
    "provider": lambda: f._provider.inner._pool_lock,        # ... and how they are made
    "throttle": lambda: throttle._lock,                      # every origin's gate
    "receiver": lambda: receiver._receiver_lock,             # the receiving thread
    "threads": lambda: threads._executor_lock,               # async callers' threads
}
lock = locks[which]()
held, release = threading.Event(), threading.Event()
def hold():  # another thread of the program, inside tensorstream at the fork
    with lock:
        held.set()
        release.wait()
threading.Thread(target=hold, daemon=True).start()
held.wait()
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    out = {}
    try:
        f.seek(0)
        out["inherited"] = f.read() == data
        with tensorstream.open(url) as g:
            out["fresh"] = g.read() == data
        import asyncio
        out["async"] = asyncio.run(tensorstream.read_range(url, 0, 1000)) == data[:1000]
    except BaseException as exc:
        out["error"] = repr(exc)
    os.write(w, json.dumps(out).encode())
    os._exit(0)
os.close(w)
deadline = time.monotonic() + 20
while not os.waitpid(pid, os.WNOHANG)[0]:
    if time.monotonic() > deadline:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        break
    time.sleep(0.05)
release.set()
print(json.dumps(json.loads(os.read(r, 1 << 16) or b'{"hung": true}')))
"""


@pytest.mark.parametrize("which", ["pool", "provider", "throttle", "receiver", "threads"])
def test_a_child_forked_while_another_thread_held_a_lock_reads(
        http_server: HTTPTestServer, which: str) -> None:
    key = f"fork-lock-{os.urandom(4).hex()}"
    http_server.put(key, os.urandom(2 << 20))
    proc = run_python(_CODE, timeout=60, args=[http_server.url(key), which])
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"inherited": True, "fresh": True, "async": True}, out
