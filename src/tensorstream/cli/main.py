"""``tensorstream`` command line: ``cp``, ``ls``, ``stat``, ``cat``, ``rm``, ``credentials``.

Exit status: 0 success, 1 a failure (some object not copied, not found...),
2 usage or configuration error, 128+N when stopped by signal N (cleanup done).
Errors are one line on stderr, secrets redacted; ``--debug`` adds tracebacks.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
import traceback
from collections.abc import Awaitable, Callable, Sequence

from .. import __version__
from ..errors import ConfigurationError, InvalidURIError, UnknownSchemeError
from ..uri import redact_text
from . import cp, ls, objects

__all__ = ["main", "build_parser"]

PROG = "tensorstream"
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
_USAGE_ERRORS = (ConfigurationError, InvalidURIError, UnknownSchemeError, argparse.ArgumentTypeError)

DESCRIPTION = """\
Move model weights between local disk, HTTP(S), S3 and Redis: fast (parallel
ranged reads), verified (checksums), atomic (no partial objects) and resumable."""

EPILOG = """\
examples:
  tensorstream cp s3://models/llama/model.tensors /models/
  tensorstream cp -r s3://models/llama/ /models/llama/
  tensorstream cp --resume https://host/model.tensors ./model.tensors
  tensorstream ls -l s3://models/llama/
  tensorstream cat --range 0-1023 s3://models/llama/model.tensors | xxd | head

Run 'tensorstream COMMAND --help' for a command's options."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true",
                        help="show tracebacks and DEBUG logs (secrets stay redacted)")
    cp.add_parser(sub, common)
    ls.add_parser(sub, common)
    objects.add_parsers(sub, common)
    return parser


def _error(message: str) -> None:
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
        _error(f"interrupted by {signal.Signals(signum).name}; nothing partial was left behind")
        return 128 + signum


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tensorstream`` console script; returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help (0) or usage error (2)
        return int(exc.code) if isinstance(exc.code, int) else EXIT_USAGE
    debug = bool(getattr(args, "debug", False))
    if debug:
        logging.basicConfig(level=logging.DEBUG, stream=sys.stderr,
                            format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        return int(args.handler(args))
    except KeyboardInterrupt:
        _error("interrupted")
        return 128 + int(signal.SIGINT)
    except BrokenPipeError:
        return EXIT_FAILED  # `tensorstream cat ... | head`: the reader went away
    except Exception as exc:
        if debug:
            print(redact_text(traceback.format_exc()), file=sys.stderr, end="")
        _error(str(exc) or type(exc).__name__)
        return EXIT_USAGE if isinstance(exc, _USAGE_ERRORS) else EXIT_FAILED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
