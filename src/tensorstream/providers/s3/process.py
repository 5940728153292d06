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
"""

from __future__ import annotations

import asyncio
import atexit
import os
import signal
import subprocess
import weakref
from collections.abc import Callable
from typing import Any

from ...errors import StorageTimeoutError
from .profile import profile_setting_file

__all__ = ["DEFAULT_CREDENTIAL_PROCESS_TIMEOUT", "bound_credential_process"]

#: Seconds a ``credential_process`` may run (the AWS SDK for Go v2's default).
DEFAULT_CREDENTIAL_PROCESS_TIMEOUT = 60.0
_METHOD = "custom-process"


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


if hasattr(os, "register_at_fork"):
    # A forked child's processes are its parent's: its exit (atexit) must not kill them.
    os.register_at_fork(after_in_child=_RUNNING.clear)


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

    def __init__(self, limit: float, profile: str, *args: Any, **kwargs: Any) -> None:
        self._limit, self._profile = limit, profile
        self._own_group = os.name == "posix" and not _has_terminal()
        if self._own_group:
            kwargs.setdefault("start_new_session", True)
        super().__init__(*args, **kwargs)
        _RUNNING.add(self)

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
            return super().communicate(input, timeout=self._limit)
        except subprocess.TimeoutExpired:
            pass  # raised below, outside this block: the expired exception holds
            # what the process printed so far, and would be chained as the context
        except BaseException:  # KeyboardInterrupt: no process left behind
            self.stop()
            raise
        self.stop()
        raise _timeout_error(self._profile, self._limit)

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

    def __init__(self, proc: _BoundedPopen) -> None:
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


def _popen(limit: float, profile: str) -> Callable[..., Any]:
    def popen(*args: Any, **kwargs: Any) -> _BoundedPopen:
        return _BoundedPopen(limit, profile, *args, **kwargs)
    return popen


def _apopen(limit: float, profile: str) -> Callable[..., Any]:
    async def popen(*args: Any, **kwargs: Any) -> _AsyncProcess:
        # asyncio's signature: the program and its arguments as separate arguments
        return _AsyncProcess(_BoundedPopen(limit, profile, list(args), **kwargs))
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
