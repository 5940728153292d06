"""A bounded wait for a profile's ``credential_process``.

botocore and aiobotocore wait for the process forever (``communicate()`` without a
timeout): one that never exits (a prompt nobody answers, a vault that does not answer)
hung a load or a ``cp`` with no word. The AWS SDK for Go v2 stops it after one minute
(``processcreds.DefaultTimeout``); so does tensorstream, by default. The process is
killed, and the error names the profile, the file and the setting, never the command's
output (it may hold keys).

:func:`bound_credential_process` swaps botocore's provider in a session's chain for the
same class built with a ``popen`` that enforces the limit (``popen`` is the providers'
constructor argument for this; the chain keeps its order).

What the process printed is reused, in this process, by every provider for the same
profile and command while its keys are good (:data:`REUSE_MARGIN` before their
``Expiration``; for ever without one, as botocore never refreshes those): each
provider's session (a shard's, a read's and a listing's) ran it again, one MFA prompt
per shard. Concurrent first runs wait for one (at most its time limit).
"""

from __future__ import annotations

import asyncio
import atexit
import datetime
import json
import os
import signal
import subprocess
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from ...errors import StorageTimeoutError
from .profile import profile_setting_file

__all__ = ["DEFAULT_CREDENTIAL_PROCESS_TIMEOUT", "REUSE_MARGIN", "bound_credential_process",
           "forget_outputs"]

#: Seconds a ``credential_process`` may run (the AWS SDK for Go v2's default).
DEFAULT_CREDENTIAL_PROCESS_TIMEOUT = 60.0
_METHOD = "custom-process"
#: An output is reused until this long before its ``Expiration``: botocore refreshes keys
#: from 15 minutes before they expire, and would run the process again at once.
REUSE_MARGIN = 16 * 60.0

#: Output of a successful run, by (profile, command): (stdout, reusable until: monotonic).
_OUTPUTS: dict[tuple[str, tuple[str, ...]], tuple[bytes, float]] = {}
#: One run at a time per (profile, command): concurrent first runs wait for the first.
_RUN_LOCKS: dict[tuple[str, tuple[str, ...]], threading.Lock] = {}
_TABLE_LOCK = threading.Lock()


def forget_outputs() -> None:
    """Drop every reused output (the next provider runs its process again)."""
    with _TABLE_LOCK:
        _OUTPUTS.clear()


def _reusable_until(stdout: bytes) -> float | None:
    """Until when (``time.monotonic()``) an output may be reused: keys of version 1 with
    no ``Expiration`` for ever, else until :data:`REUSE_MARGIN` before it; None when the
    output is not such keys (botocore then says why, each time)."""
    try:
        parsed = json.loads(stdout.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(parsed, dict) or parsed.get("Version") != 1 or not (
            parsed.get("AccessKeyId") and parsed.get("SecretAccessKey")):
        return None
    expiration = parsed.get("Expiration")
    if expiration is None:
        return float("inf")
    try:
        when = datetime.datetime.fromisoformat(str(expiration).replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        return None
    left = (when - datetime.datetime.now(datetime.timezone.utc)).total_seconds()
    return time.monotonic() + left - REUSE_MARGIN if left > REUSE_MARGIN else None


def _reused(key: tuple[str, tuple[str, ...]]) -> bytes | None:
    with _TABLE_LOCK:
        found = _OUTPUTS.get(key)
        if found is not None and time.monotonic() < found[1]:
            return found[0]
        _OUTPUTS.pop(key, None)
        return None


def _run_lock(key: tuple[str, tuple[str, ...]]) -> threading.Lock:
    with _TABLE_LOCK:
        return _RUN_LOCKS.setdefault(key, threading.Lock())


def _key(profile: str, args: tuple[Any, ...]) -> tuple[str, tuple[str, ...]]:
    argv = args[0] if len(args) == 1 and isinstance(args[0], (list, tuple)) else args
    return profile, tuple(str(a) for a in argv)


class _Printed:
    """A finished run's face (``returncode`` 0, ``communicate()``), for reused output."""

    returncode = 0

    def __init__(self, stdout: bytes) -> None:
        self._stdout = stdout

    def communicate(self, input: Any = None, timeout: float | None = None) -> Any:  # noqa: A002
        return self._stdout, b""

    def kill_group(self) -> None:
        pass


def _timeout_error(profile: str, timeout: float) -> StorageTimeoutError:
    where = profile_setting_file(profile, "credential_process", os.environ)
    err = StorageTimeoutError(
        f"AWS profile {profile!r} ({where}): its credential_process did not finish within "
        f"{timeout:g} s and was stopped; make it exit (a prompt waiting for input?), or allow "
        "it longer with the option s3_credential_process_timeout")
    err.temporary = False  # the retry layer would run it again, as long each time
    return err


#: Processes started and not yet stopped or reaped: their groups are killed at exit
#: (a Ctrl-C does not reach a session of their own from the terminal).
_RUNNING: weakref.WeakSet[_BoundedPopen] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for proc in list(_RUNNING):
        proc.kill_group()


def _after_fork_in_child() -> None:
    # A forked child's processes are its parent's: its exit (atexit) must not kill them;
    # and a thread of the parent (none here) may have held a lock.
    global _TABLE_LOCK
    _RUNNING.clear()
    _TABLE_LOCK = threading.Lock()
    _RUN_LOCKS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _has_terminal() -> bool:
    """Whether this process has a controlling terminal (``/dev/tty`` opens)."""
    try:
        fd = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK)  # (a serial line)
    except OSError:  # ENXIO: none (a service, CI, nohup, a pipe)
        return False
    os.close(fd)
    return True


class _BoundedPopen(subprocess.Popen):  # type: ignore[type-arg]
    """``communicate()`` waits at most ``limit`` seconds, then kills the child and,
    without a terminal, every process it started (a wrapper script's program holding
    its pipes ran on): the child leads a session and process group of its own, which
    is killed whole. With a terminal it stays in ours: a prompt for an MFA code that
    opens ``/dev/tty`` (Python's ``getpass``, ``read < /dev/tty``) needs it as its
    controlling terminal, and Ctrl-C reaches the whole group from the terminal."""

    def __init__(self, limit: float, profile: str, *args: Any,
                 held: threading.Lock | None = None,
                 remember: tuple[str, tuple[str, ...]] | None = None, **kwargs: Any) -> None:
        self._limit, self._profile = limit, profile
        #: The run lock this run holds (released when it ends) and its output's key.
        self._held, self._remember = held, remember
        self._own_group = os.name == "posix" and not _has_terminal()
        if self._own_group:
            kwargs.setdefault("start_new_session", True)
        try:
            super().__init__(*args, **kwargs)
        except BaseException:
            self._let_go()
            raise
        _RUNNING.add(self)

    def _let_go(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            held.release()

    def kill_group(self) -> None:
        """SIGKILL the child's process group, or the child alone where it has none."""
        if self.returncode is not None:
            return  # reaped: its pid (the group's id) may name another process by now
        try:
            if self._own_group:
                os.killpg(self.pid, signal.SIGKILL)  # the group outlives its leader
            else:
                self.kill()
        except (ProcessLookupError, PermissionError):
            pass  # the whole group is gone already

    def communicate(self, input: Any = None, timeout: float | None = None) -> Any:  # noqa: A002
        try:
            try:
                out = super().communicate(input, timeout=self._limit)
            except subprocess.TimeoutExpired:
                pass  # raised below, outside this block: the expired exception holds
                # what the process printed so far, and would be chained as the context
            except BaseException:  # KeyboardInterrupt: no process left behind
                self.stop()
                raise
            else:
                until = _reusable_until(out[0]) if (
                    self.returncode == 0 and self._remember and isinstance(out[0], bytes)) else None
                if until is not None and self._remember is not None:
                    with _TABLE_LOCK:
                        _OUTPUTS[self._remember] = (out[0], until)
                return out
            self.stop()
            raise _timeout_error(self._profile, self._limit)
        finally:
            self._let_go()

    def stop(self) -> None:
        """Kill the child and its process group, and reap it. Its pipes are closed,
        not drained."""
        self.kill_group()  # its children too, even once it has exited itself
        self.wait()
        _RUNNING.discard(self)
        for pipe in (self.stdin, self.stdout, self.stderr):
            if pipe is not None:
                pipe.close()


class _AsyncProcess:
    """The face aiobotocore's provider expects of ``asyncio.create_subprocess_exec``'s
    process, over a :class:`_BoundedPopen` waited for in a thread."""

    def __init__(self, proc: _BoundedPopen | _Printed) -> None:
        self._proc = proc

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode

    async def communicate(self, input: Any = None) -> Any:  # noqa: A002
        try:
            return await asyncio.to_thread(self._proc.communicate, input)
        except asyncio.CancelledError:
            self._proc.kill_group()  # the thread's communicate() then returns
            raise


def _start(limit: float, profile: str, argv: list[str], kwargs: dict[str, Any]
           ) -> _BoundedPopen | _Printed:
    """The output a run for ``(profile, argv)`` printed while its keys are good, else a
    new run (holding the key's run lock until it ends: a concurrent first run waits for
    it, at most its time limit, then runs anyway)."""
    key = _key(profile, (argv,))
    found = _reused(key)
    if found is not None:
        return _Printed(found)
    lock = _run_lock(key)
    held = lock.acquire(timeout=limit)
    found = _reused(key)
    if found is not None:
        if held:
            lock.release()
        return _Printed(found)
    return _BoundedPopen(limit, profile, argv, held=lock if held else None, remember=key,
                         **kwargs)


def _popen(limit: float, profile: str) -> Callable[..., Any]:
    def popen(*args: Any, **kwargs: Any) -> _BoundedPopen | _Printed:
        argv = list(args[0]) if len(args) == 1 and isinstance(args[0], (list, tuple)) else list(args)
        return _start(limit, profile, argv, kwargs)
    return popen


def _apopen(limit: float, profile: str) -> Callable[..., Any]:
    async def popen(*args: Any, **kwargs: Any) -> _AsyncProcess:
        # asyncio's signature: the program and its arguments as separate arguments
        # (a wait for another run's lock happens in a thread, off the event loop)
        return _AsyncProcess(await asyncio.to_thread(_start, limit, profile, list(args), kwargs))
    return popen


def bound_credential_process(session: Any, timeout: float) -> None:
    """Make the ``credential_process`` provider of ``session``'s chain (a botocore or
    aiobotocore session) stop the process after ``timeout`` seconds."""
    resolver = session.get_component("credential_provider")
    profile = session.get_config_variable("profile") or "default"  # as botocore names it
    for index, provider in enumerate(resolver.providers):
        if getattr(provider, "METHOD", None) != _METHOD:
            continue
        is_async = asyncio.iscoroutinefunction(provider.load)
        popen = (_apopen if is_async else _popen)(timeout, profile)
        resolver.providers[index] = type(provider)(
            profile_name=profile, load_config=lambda: session.full_config, popen=popen)
    for provider in resolver.providers:
        _bound_source_profiles(provider, session, timeout)


def _bound_source_profiles(provider: Any, session: Any, timeout: float) -> None:
    """The same limit for a role's ``source_profile`` whose keys come from its own
    ``credential_process``: botocore's role provider builds that process provider
    itself (``ProfileProviderBuilder``), without a ``popen``, and it waited forever."""
    builder: Any = getattr(provider, "_profile_provider_builder", None)
    make = getattr(builder, "_create_process_provider", None)
    if make is None:
        return
    kind = type(make(profile_name="default"))  # (botocore's or aiobotocore's class)
    is_async = asyncio.iscoroutinefunction(kind.load)

    def create(profile_name: str) -> Any:
        popen = (_apopen if is_async else _popen)(timeout, profile_name)
        return kind(profile_name=profile_name, load_config=lambda: session.full_config,
                    popen=popen)

    builder._create_process_provider = create
