"""``tensorstream`` command line: ``cp``, ``ls``, ``stat``, ``cat``, ``rm``, ``credentials``.

Exit status: 0 success, 1 a failure (some object not copied, not found...),
2 usage or configuration error, 128+N when stopped by signal N (cleanup done).
Errors are one line on stderr, secrets redacted; ``--debug`` adds tracebacks.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import traceback
from collections.abc import Sequence

from .. import __version__
from ..errors import ConfigurationError, InvalidURIError, UnknownSchemeError
from ..uri import redact_text
from . import cp, ls, objects
from ._run import EXIT_FAILED, EXIT_USAGE, PROG, print_error

__all__ = ["main", "build_parser"]

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
        print_error("interrupted")
        return 128 + int(signal.SIGINT)
    except BrokenPipeError:
        return EXIT_FAILED  # `tensorstream cat ... | head`: the reader went away
    except Exception as exc:
        if debug:
            print(redact_text(traceback.format_exc()), file=sys.stderr, end="")
        print_error(str(exc) or type(exc).__name__)
        return EXIT_USAGE if isinstance(exc, _USAGE_ERRORS) else EXIT_FAILED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
