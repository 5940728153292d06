"""What every subcommand shares: the one-line error, exit statuses, running a coroutine with signals."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Awaitable, Callable, Iterator
from types import FrameType

from ..uri import redact_text

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_PARTIAL", "EXIT_USAGE", "PROG", "Terminated",
           "print_error", "run_async", "sigterm_interrupts"]

PROG = "tensorstream"
#: 0 all done; 1 failed (nothing done, or one object); 2 usage or configuration;
#: 3 partial: some objects done, others failed or were skipped for a problem.
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_PARTIAL = 0, 1, 2, 3


def print_error(message: str) -> None:
    """Print ``message`` as one redacted, escaped line on stderr, prefixed with the program name."""
    from .output import cli_terms, escape

    text = " ".join(escape(cli_terms(redact_text(message))).split())  # always one line
    print(f"{PROG}: error: {text}", file=sys.stderr)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread of a synchronous command as Ctrl-C raises
    :class:`KeyboardInterrupt`; ``signum`` gives the exit status (128 + it)."""

    signum = int(signal.SIGTERM)


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """While the block runs, SIGTERM raises :class:`Terminated` in the main thread.

    Its default action ends the process at once: no ``finally`` runs, so a
    synchronous command (``convert``) left its temporary files and an open
    multipart upload behind. Raised as an interrupt, the cleanup Ctrl-C gets
    runs. A second SIGTERM during that cleanup ends the process as before.
    """
    previous = signal.getsignal(signal.SIGTERM)
    restore = signal.SIG_DFL if previous is None else previous  # None: set outside Python

    def raise_terminated(signum: int, frame: FrameType | None) -> None:
        signal.signal(signal.SIGTERM, restore)
        raise Terminated

    try:
        signal.signal(signal.SIGTERM, raise_terminated)
    except ValueError:  # not the main thread (a test calling main() from a worker thread)
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, restore)


def run_async(fn: Callable[[], Awaitable[int]],
              interrupted: Callable[[], str] | None = None) -> int:
    """Run ``fn()`` on a fresh loop; SIGINT/SIGTERM cancel it so cleanup runs.

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
        for sig in (signal.SIGINT, signal.SIGTERM):
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
