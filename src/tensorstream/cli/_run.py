"""What every subcommand shares: the one-line error, exit statuses, running a coroutine with signals."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Awaitable, Callable

from ..uri import redact_text

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "PROG", "print_error", "run_async"]

PROG = "tensorstream"
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def print_error(message: str) -> None:
    """Print ``message`` as one redacted line on stderr, prefixed with the program name."""
    text = " ".join(redact_text(message).split())  # always one line
    print(f"{PROG}: error: {text}", file=sys.stderr)


def run_async(fn: Callable[[], Awaitable[int]]) -> int:
    """Run ``fn()`` on a fresh loop; SIGINT/SIGTERM cancel it so cleanup runs.

    Cancellation unwinds the copy engine: temp files are removed, multipart
    uploads aborted, then the exit status is 128 + the signal number.
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
        print_error(f"interrupted by {signal.Signals(signum).name}; nothing partial was left behind")
        return 128 + signum
