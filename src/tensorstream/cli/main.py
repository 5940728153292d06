"""``tensorstream`` command line: ``cp``, ``sync``, ``convert``, ``ls``, ``stat``, ``cat``, ``rm``,
``credentials``, ``inspect``.

Exit status: 0 success, 1 a failure (nothing copied, not found...), 2 usage
or configuration error, 3 partial success (some objects done, some failed),
128+N when stopped by signal N (cleanup done). Errors are one line on
stderr, secrets redacted, control characters escaped; ``--debug`` adds
tracebacks. A reader that goes away (``tensorstream cat ... | head``) ends
the command quietly with status 0.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import traceback
from collections.abc import Sequence
from typing import NoReturn

from .. import __version__
from ..errors import ConfigurationError, InvalidURIError, UnknownSchemeError
from ..uri import redact_text
from . import convert, cp, inspect_model, ls, objects
from ._run import EXIT_FAILED, EXIT_OK, EXIT_USAGE, PROG, print_error
from .options import add_storage_options

__all__ = ["build_parser", "entry", "main"]

_USAGE_ERRORS = (ConfigurationError, InvalidURIError, UnknownSchemeError, argparse.ArgumentTypeError)

DESCRIPTION = """\
Move model weights between local disk, HTTP(S), S3 and Redis: fast (parallel
ranged reads), verified (checksums), atomic (no partial objects) and resumable."""

EPILOG = """\
examples:
  tensorstream cp s3://models/llama/model.tensors /models/
  tensorstream cp -r s3://models/llama/ /models/llama/
  tensorstream sync --delete ./llama/ s3://models/llama/
  tensorstream --endpoint-url http://minio:9000 ls s3://
  tensorstream cp --resume https://host/model.tensors ./model.tensors
  tensorstream ls -l s3://models/llama/
  tensorstream cat --range 0-1023 s3://models/llama/model.tensors | xxd | head
  tensorstream convert s3://models/llama/ s3://models/llama/model.tensors
  tensorstream inspect s3://models/llama/model.safetensors

Storage options go before or after the command. Run 'tensorstream COMMAND
--help' for a command's options.

exit status: 0 done, 1 failed, 2 usage or configuration error, 3 partial
(some objects done, others failed), 130/143/129 interrupted by
SIGINT/SIGTERM/SIGHUP."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description=DESCRIPTION, epilog=EPILOG,
        usage=f"{PROG} [storage options] COMMAND [options] ...",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    add_storage_options(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", prog=PROG)
    sub.required = True
    common = argparse.ArgumentParser(add_help=False)
    for p in (parser, common):  # before or after the command
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show tracebacks and DEBUG logs (secrets stay redacted)")
    cp.add_parser(sub, common)
    convert.add_parser(sub, common)
    ls.add_parser(sub, common)
    objects.add_parsers(sub, common)
    inspect_model.add_parser(sub, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tensorstream`` console script; returns the exit status."""
    debug = False
    try:
        _handle_sigint_here()
        parser = build_parser()
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:  # argparse: --help (0) or usage error (2)
            return int(exc.code) if isinstance(exc.code, int) else EXIT_USAGE
        debug = bool(getattr(args, "debug", False))
        if debug:
            logging.basicConfig(level=logging.DEBUG, stream=sys.stderr,
                                format="%(asctime)s %(name)s %(levelname)s %(message)s")
        return int(args.handler(args))
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM/SIGHUP in a synchronous command
        signum = getattr(exc, "signum", int(signal.SIGINT))
        print_error(f"interrupted by {signal.Signals(signum).name}")
        return 128 + signum
    except BrokenPipeError:
        # `tensorstream cat ... | head`: the reader went away, which is how it
        # says it has enough. Exit 0 (pipefail stays happy) and point stdout at
        # /dev/null so the interpreter's final flush does not complain.
        from .output import quiet_if_closed

        quiet_if_closed(sys.stdout)
        return EXIT_OK
    except Exception as exc:
        if debug:
            print(redact_text(traceback.format_exc()), file=sys.stderr, end="")
        print_error(str(exc) or type(exc).__name__)
        return EXIT_USAGE if isinstance(exc, _USAGE_ERRORS) else EXIT_FAILED


def _handle_sigint_here() -> None:
    """Ctrl-C is a ``KeyboardInterrupt`` again (caught by :func:`main`, or a
    command's own handling) instead of the start-up exit the package set
    (``tensorstream._exit_interrupted``) while the command line was imported."""
    from .. import _exit_interrupted

    try:
        if signal.getsignal(signal.SIGINT) is _exit_interrupted:
            signal.signal(signal.SIGINT, signal.default_int_handler)
    except ValueError:  # not the main thread (a test calling main() from a worker)
        pass


def entry() -> NoReturn:
    """The process entry point (``tensorstream`` console script, ``python -m
    tensorstream``): :func:`main`, then leave without the interpreter's teardown.

    By then the command is over: every destination is closed (and fsynced), every
    worker thread idle. What remains of a normal exit is finalising every module
    and object and joining the idle worker threads: 38-47 ms of a 100-object
    ``cp`` at load 10 (up to 0.2 s at load 9), longer than its listing. Output
    is flushed and ``atexit`` handlers (logging, the I/O loop's aborts of
    writers left open) still run; then the process ends with ``os._exit``.
    """
    import atexit
    import os

    code = main()
    try:
        atexit._run_exitfuncs()
        atexit._clear()  # ran: an ordinary exit after a failure below must not repeat them
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BrokenPipeError:  # the reader left (`... | head`): as main() does
                from .output import quiet_if_closed

                quiet_if_closed(stream)
    except BaseException:  # anything unexpected: the ordinary exit, teardown included
        sys.exit(code)
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    entry()
