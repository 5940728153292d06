"""What every subcommand shares: the one-line error, exit statuses, running a coroutine with signals."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Awaitable, Callable, Iterator, Sequence
from types import FrameType
from typing import Any

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_PARTIAL", "EXIT_USAGE", "PROG", "Terminated",
           "print_error", "run_async", "sigterm_interrupts"]

PROG = "tensorstream"
#: 0 all done; 1 failed (nothing done, or one object); 2 usage or configuration;
#: 3 partial: some objects done, others failed or were skipped for a problem.
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_PARTIAL = 0, 1, 2, 3
#: Signals whose default action would end the process with no cleanup: a
#: command catches them as it catches Ctrl-C (SIGHUP: the terminal or SSH
#: session went away). SIGHUP set to be ignored (``nohup``) stays ignored.
_ENDING = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


def print_error(message: str, names: Sequence[str] = ()) -> None:
    """Print ``message`` as one redacted, escaped line on stderr, prefixed with the program
    name; ``names`` (the command's objects and paths) are escaped as names
    (:func:`.output.error_line`)."""
    from .output import error_line

    text = error_line(message, names)
    try:
        print(f"{PROG}: error: {text}", file=sys.stderr)
    except (OSError, ValueError):  # stderr is gone (a hung-up terminal, a closed pipe)
        pass


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised in the main thread of a synchronous command as
    Ctrl-C raises :class:`KeyboardInterrupt`; ``signum`` gives the exit status
    (128 + it)."""

    def __init__(self, signum: int = int(signal.SIGTERM)) -> None:
        super().__init__()
        self.signum = signum


def _caught(sig: signal.Signals) -> bool:
    """Whether the command should catch ``sig``: always, but for a SIGHUP that is
    ignored (``nohup`` sets it so, and the command must then outlive its
    terminal). SIGINT and SIGTERM are caught even where a shell started the
    command with them ignored (a background job of a script), as before."""
    return sig != getattr(signal, "SIGHUP", None) or signal.getsignal(sig) is not signal.SIG_IGN


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """While the block runs, SIGTERM and SIGHUP raise :class:`Terminated` in the
    main thread.

    Their default action ends the process at once: no ``finally`` runs, so a
    synchronous command (``convert``) left its temporary files and an open
    multipart upload behind. Raised as an interrupt, the cleanup Ctrl-C gets
    runs. A second such signal during that cleanup ends the process as before.
    """
    restore: dict[signal.Signals, Callable[[int, FrameType | None], Any] | int] = {}

    def raise_terminated(signum: int, frame: FrameType | None) -> None:
        for sig, previous in restore.items():
            signal.signal(sig, previous)
        raise Terminated(signum)

    try:
        for sig in _ENDING:
            if _caught(sig):
                previous = signal.getsignal(sig)
                # None: a handler set outside Python; the default is the nearest.
                restore[sig] = signal.SIG_DFL if previous is None else previous
                signal.signal(sig, raise_terminated)
    except ValueError:  # not the main thread (a test calling main() from a worker thread)
        yield
        return
    try:
        yield
    finally:
        for sig, previous in restore.items():
            signal.signal(sig, previous)


def run_async(fn: Callable[[], Awaitable[int]],
              interrupted: Callable[[], str] | None = None) -> int:
    """Run ``fn()`` on a fresh loop; SIGINT, SIGTERM and SIGHUP cancel it so cleanup runs
    (one set to be ignored, as ``nohup`` sets SIGHUP, stays ignored).

    Cancellation unwinds the copy engine: temp files are removed (or kept for
    ``--resume``), multipart uploads aborted, then the exit status is 128 +
    the signal number. ``interrupted()`` says what was left behind, after the
    cleanup ran.
    """
    received: list[int] = []

    async def runner() -> int:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None

        def on_signal(signum: int) -> None:
            received.append(signum)
            task.cancel()

        installed = []
        for sig in (signal.SIGINT, *_ENDING):
            if not _caught(sig):
                continue
            try:
                loop.add_signal_handler(sig, on_signal, int(sig))
                installed.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):
                pass  # not the main thread (e.g. called from a test's worker thread)
        try:
            return await fn()
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)

    try:
        return asyncio.run(runner())
    except (asyncio.CancelledError, KeyboardInterrupt):
        signum = received[0] if received else int(signal.SIGINT)
        what = interrupted() if interrupted is not None else ""
        print_error(f"interrupted by {signal.Signals(signum).name}" + (f"; {what}" if what else ""))
        return 128 + signum
