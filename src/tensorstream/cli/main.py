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
from typing import Any, NoReturn

from .. import __version__
from ..errors import ConfigurationError, InvalidURIError, UnknownSchemeError
from ..uri import redact_text
from . import convert, cp, inspect_model, ls, objects
from ._run import EXIT_FAILED, EXIT_OK, EXIT_USAGE, PROG, print_error
from .options import add_storage_options
from .usage_errors import Parser

__all__ = ["build_parser", "entry", "main", "parse_command_line"]

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


#: The commands, each with the module that adds its parser.
COMMANDS = {"cp": cp.add_parser, "sync": cp.add_parser, "convert": convert.add_parser,
            "ls": ls.add_parser, "stat": objects.add_parsers, "cat": objects.add_parsers,
            "rm": objects.add_parsers, "credentials": objects.add_parsers,
            "inspect": inspect_model.add_parser}


class _StandIn:
    """What a command's builder gets for a command the line does not name: every
    call (``add_argument``, ``set_defaults``, an argument group's) is dropped."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: self


class _OnlyOne:
    """``add_subparsers()``'s object, building only ``wanted``'s parser in full; every
    other command gets a stand-in of the same name and help (the choices and the
    command list in usage errors stay the same) that takes whatever follows it and
    marks the parse as needing the whole tree."""

    def __init__(self, sub: Any, wanted: str) -> None:
        self._sub, self._wanted = sub, wanted

    def add_parser(self, name: str, **kwargs: Any) -> Any:
        if name == self._wanted:
            return self._sub.add_parser(name, **kwargs)
        stand_in = self._sub.add_parser(name, help=kwargs.get("help"), add_help=False)
        stand_in.add_argument("rest", nargs=argparse.REMAINDER)
        stand_in.set_defaults(stand_in=True)
        return _StandIn()


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser; with ``command`` (one of :data:`COMMANDS`), only that
    command's options are built: every command's ~40 options take a short command's
    start-up more time than its first request."""
    parser = Parser(  # (each command's parser is one too: argparse makes them of its class)
        prog=PROG, description=DESCRIPTION, epilog=EPILOG,
        usage=f"{PROG} [storage options] COMMAND [options] ...",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    add_storage_options(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", prog=PROG)
    sub.required = True
    common = Parser(add_help=False)
    for p in (parser, common):  # before or after the command
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show tracebacks and DEBUG logs (secrets stay redacted)")
    builders = sub if command is None else _OnlyOne(sub, command)
    for add in dict.fromkeys(COMMANDS.values()):  # each module once, in this order
        add(builders, common)
    return parser


def _named_command(argv: Sequence[str]) -> str | None:
    """The first word of ``argv`` that names a command; ``None`` (build every command)
    when there is none or help is asked for (``-h``, ``--help`` or an abbreviation)."""
    named = None
    for word in argv:
        if word == "-h" or (len(word) > 3 and "--help".startswith(word)):
            return None
        if named is None and word in COMMANDS:
            named = word
    return named


def parse_command_line(argv: Sequence[str]) -> argparse.Namespace:
    """``argv`` parsed as :func:`build_parser`'s whole tree parses it (the same
    namespace, the same usage errors), building only the command it names when it can."""
    command = _named_command(argv)
    if command is None:
        return build_parser().parse_args(argv)
    parser = build_parser(command)
    args, extras = parser.parse_known_args(argv)
    if getattr(args, "stand_in", False):  # an option's value was that word: `--profile cp ls`
        return build_parser().parse_args(argv)
    if extras:  # argparse's own message
        parser.parse_args(argv)
    return args


class _EscapedFormatter(logging.Formatter):
    """A log record's message with its unprintable characters escaped
    (:func:`.output.escape`)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        from .output import escape

        return escape(super().formatMessage(record))


class _DebugFormatter(logging.Formatter):
    """``--debug``'s records, each line escaped but kept a line (a record holding a
    traceback or a multi-line dump reads as it was written), so a key or a server's
    text in one cannot repaint the terminal."""

    def format(self, record: logging.LogRecord) -> str:
        return _escaped_lines(super().format(record))


def _escaped_lines(text: str) -> str:
    from .output import escape

    return "\n".join(escape(line) for line in text.split("\n"))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tensorstream`` console script; returns the exit status."""
    debug = False
    args: argparse.Namespace | None = None
    try:
        _handle_sigint_here()
        try:
            args = parse_command_line(sys.argv[1:] if argv is None else list(argv))
        except SystemExit as exc:  # argparse: --help (0) or usage error (2)
            return int(exc.code) if isinstance(exc.code, int) else EXIT_USAGE
        debug = bool(getattr(args, "debug", False))
        if debug:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(_DebugFormatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
            logging.basicConfig(level=logging.DEBUG, handlers=[handler])
        elif logging.lastResort is not None:
            # Warnings reach stderr through logging's last resort (no handler is set):
            # escaped, as every line for people is, a key named in one cannot repaint
            # the terminal or forge a line.
            logging.lastResort.setFormatter(_EscapedFormatter())
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
            # (escaped line by line: the error's text is a key's or a server's)
            print(_escaped_lines(redact_text(traceback.format_exc())), file=sys.stderr, end="")
        print_error(str(exc) or type(exc).__name__, _named(args) if args is not None else ())
        return EXIT_USAGE if isinstance(exc, _USAGE_ERRORS) else EXIT_FAILED


def _named(args: argparse.Namespace) -> list[str]:
    """The objects and paths a command line names (its positional arguments): an error
    names them escaped as its lines name them, backslashes doubled."""
    named = [getattr(args, dest, None) for dest in ("uri", "src", "dst")]
    return [n for n in [*named, *(getattr(args, "paths", None) or ())] if isinstance(n, str)]


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
