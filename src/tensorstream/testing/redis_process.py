"""The ``redis-server`` child processes behind :mod:`tensorstream.testing.redis_server`:
each started through the watchdog with its own config file (secrets in a 0600 file, never
in argv), waited for until it answers PING, and started again on other ports while
another process took one first."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import Any

from . import watchdog

START_TIMEOUT = 15.0
#: Ports tried before start-up gives up: a port free when picked can be taken by
#: another process before redis-server binds it.
_PORT_ATTEMPTS = 5


class RedisUnavailable(RuntimeError):
    """``redis-server`` is not installed (tests skip on this, and only this)."""


def redis_available() -> bool:
    """Whether ``redis-server`` and ``redis-cli`` are on ``PATH``."""
    return shutil.which("redis-server") is not None and shutil.which("redis-cli") is not None


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisProcess:
    """One redis-server child with its own config file and temp dir."""

    def __init__(self, config: dict[str, str], workdir: str, name: str) -> None:
        if not redis_available():
            raise RedisUnavailable("redis-server/redis-cli not found on PATH (apt-get install redis-server)")
        conf = os.path.join(workdir, f"{name}.conf")
        lines = [f"{k} {v}" for k, v in config.items()]
        lines += ["bind 127.0.0.1", "save \"\"", "appendonly no", f"dir {workdir}",
                  "protected-mode no", f"logfile {os.path.join(workdir, name + '.log')}"]
        fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("\n".join(lines) + "\n")
        self.log = os.path.join(workdir, name + ".log")
        self.conf = conf
        self.workdir = workdir
        # Through the watchdog: if this process is killed (no teardown runs), the
        # server dies with it instead of outliving the test run. Its own session,
        # so stop() kills both at once. Run by path (it needs only the standard
        # library): the child finds it whatever its sys.path and working directory.
        self.proc = subprocess.Popen(
            [sys.executable, watchdog.__file__, "redis-server", conf],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True,
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self) -> str:
        try:
            with open(self.log, errors="replace") as f:
                return f.read()[-2000:]
        except OSError:
            return ""

    def discard(self) -> None:
        """Stop it and remove its files (start-up tries another port)."""
        self.stop()
        for path in (self.conf, self.log):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def stop(self) -> None:
        # Closing the watchdog's stdin makes it kill the server, reap it and exit.
        # (Killing both at once would leave the server a zombie under an init that
        # does not reap, as in many containers.) SIGKILL to the group if it hangs.
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except OSError:  # pragma: no cover - the pipe is already broken
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


def conf_arg(value: str) -> str:
    """``value`` as one argument of a redis.conf line: a password or user name
    with a space, ``"`` or ``#`` split the line (redis-server exited at start)."""
    out = []
    for ch in value:
        if ch in '\\"':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


class _PortTaken(RuntimeError):
    """Another process took the port between its pick and redis-server's bind."""


#: What redis-server logs when its port is taken (then it exits).
_BIND_FAILED = ("Address already in use", "Failed listening on port")


def wait_ready(proc: RedisProcess, make_client: Any) -> None:
    """Wait until ``proc`` answers PING; :class:`_PortTaken` if its port was taken."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    deadline = time.monotonic() + START_TIMEOUT
    last: Exception | None = None
    while time.monotonic() < deadline:
        said = proc.log_tail()
        if any(m in said for m in _BIND_FAILED):  # (it exits next)
            raise _PortTaken(said)
        if not proc.alive():
            raise RuntimeError(f"redis-server exited at start:\n{proc.log_tail()}")
        try:
            # (short waits, no retries: whatever took the port may accept and never answer)
            with make_client(socket_timeout=1, socket_connect_timeout=1,
                             retry=Retry(NoBackoff(), 0)) as c:
                c.ping()
                # (whoever took the port may be a redis-server too: ours works in its dir)
                served = c.config_get("dir").get("dir")
            if os.path.realpath(str(served)) != os.path.realpath(proc.workdir):
                raise _PortTaken(f"another redis-server answers there (dir {served})")
            return
        except _PortTaken:
            raise
        except Exception as exc:  # polling until it answers
            last = exc
            time.sleep(0.05)
    raise RuntimeError(f"redis-server did not start: {last}\n{proc.log_tail()}")


def on_a_free_port(start: Any) -> RedisProcess:
    """``start(attempt)`` (which picks its ports, starts and waits), again with new
    ports while another process took one first; at most :data:`_PORT_ATTEMPTS`."""
    for attempt in range(_PORT_ATTEMPTS):
        try:
            return start(attempt)  # type: ignore[no-any-return]
        except _PortTaken as exc:
            last = exc
    raise RuntimeError(f"redis-server found no free port in {_PORT_ATTEMPTS} tries; the "
                       f"last one: {last}")
