"""Every lock a module of tensorstream keeps is new in a forked child.

A child forked while another thread of the program held one (a load or copy in
the background when ``multiprocessing``, a DataLoader or vLLM forks its workers)
has only the forking thread: the lock stays held there for ever, and the child's
first call that takes it hangs. Each module renews its locks, and those of its
module-level objects, after a fork (``os.register_at_fork``); the sweep finds
them all, so a new one cannot be missed. Then, each in such a child, the calls behind the four that were not
renewed: S3's data loader (a new S3 client), cp/sync's endpoint check and part
buffers, the umask where ``/proc`` does not show it (macOS), a durable copy's
directory fsyncs.
"""

from __future__ import annotations

import json

import pytest

from reliability_helpers import FORK_WHILE_HELD, run_python

_HOLD_AND_FORK = FORK_WHILE_HELD + r"""
import importlib, json, pkgutil, threading
import tensorstream
KINDS = (type(threading.Lock()), type(threading.RLock()), threading.Condition,
         threading.Semaphore)
held_at_fork = {}
for info in pkgutil.walk_packages(tensorstream.__path__, "tensorstream."):
    if info.name.endswith("__main__"):
        continue
    try:
        module = importlib.import_module(info.name)
    except ImportError:
        continue  # an optional dependency that is not installed
    for name, value in vars(module).items():
        if isinstance(value, KINDS):
            held_at_fork[f"{info.name}.{name}"] = (lambda m=module, n=name: getattr(m, n), value)
        elif type(value).__module__.startswith("tensorstream") and hasattr(value, "__dict__"):
            for attr, inner in vars(value).items():  # an object of the module's own
                if isinstance(inner, KINDS):
                    held_at_fork[f"{info.name}.{name}.{attr}"] = (
                        lambda m=module, n=name, a=attr: getattr(getattr(m, n), a), inner)
def child():
    stuck = []
    for full, (now, _) in sorted(held_at_fork.items()):
        lock = now()
        if lock.acquire(blocking=False):
            lock.release()
        else:
            stuck.append(full)
    return {"found": len(held_at_fork), "stuck": stuck}
unique = {id(lock): lock for _, lock in held_at_fork.values()}
print(json.dumps(fork_while_held(list(unique.values()), child)))
"""


def test_every_module_lock_is_new_in_a_child_forked_while_another_thread_held_it() -> None:
    proc = run_python(_HOLD_AND_FORK, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["found"] >= 10, out  # the sweep found the modules' locks
    assert out["stuck"] == [], out


_CALL_IN_CHILD = FORK_WHILE_HELD + r"""
import json, os, sys, threading
which = sys.argv[1]
if which == "s3 session":     # the S3 provider's botocore data loader
    import botocore.session
    from tensorstream.providers.s3 import session as module
    lock = module._loader_lock
    def call():
        module.shared_data_loader(botocore.session.Session())
elif which == "servers":      # whether two endpoints are one server (cp/sync)
    from tensorstream.copy import servers as module
    lock = module._LOCK
    def call():
        module.same_server(module.server("redis", "localhost", 6379),
                           module.server("redis", "127.0.0.1", 6379))
elif which == "receive":      # the buffers a copy receives parts into
    from tensorstream.copy import receive as module
    lock = module._free_lock
    def call():
        module._give_back(module._take_chunk())
elif which == "umask":        # the umask, where /proc does not show it
    from tensorstream import _umask as module
    lock = module._lock
    real_open = open
    def call():
        def no_proc(path, *args, **kwargs):
            if path == "/proc/self/status":
                raise FileNotFoundError(path)
            return real_open(path, *args, **kwargs)
        module.open = no_proc
        module.current_umask()
elif which == "directory sync":  # a durable copy's fsync of the directory it renamed into
    from tensorstream.copy import sinks as module
    lock = module.directory_sync._cond
    fd = os.open(os.getcwd(), os.O_RDONLY)
    st = os.fstat(fd)  # (and a thread of the parent amid that directory's fsync at the fork)
    module.directory_sync._dirs[(st.st_dev, st.st_ino)] = [1, 0, 1]
    def call():
        module.directory_sync.sync(fd)
def child():
    call()
    return {"ok": True}
print(json.dumps(fork_while_held([lock], child)))
"""


@pytest.mark.parametrize("which", ["s3 session", "servers", "receive", "umask",
                                   "directory sync"])
def test_a_child_forked_while_another_thread_held_the_lock_goes_on(which: str) -> None:
    proc = run_python(_CALL_IN_CHILD, timeout=60, args=[which])
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"ok": True}

