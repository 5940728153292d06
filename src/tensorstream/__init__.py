"""tensorstream: move model weights between storage and accelerators.

One ranged-read interface over local disk, HTTP(S), S3 and Redis; a seekable
file object that feeds ``tensorizer.TensorDeserializer``; ``tensorstream cp``.

>>> import tensorstream
>>> with tensorstream.open("s3://bucket/model.tensors") as f:  # doctest: +SKIP
...     ...
"""

import _signal  # (the C module: ``signal`` would first import enum)
import sys as _sys

try:  # (built into the interpreter: no Python code runs to import it)
    from posix import _exit as _exit_now
except ImportError:  # Windows
    from nt import _exit as _exit_now  # type: ignore[no-redef,attr-defined]


def _started_with(args: list[str]) -> tuple[str, str]:
    """How the interpreter's command line ``args`` (``sys.orig_argv``) runs a program:
    ``("module", name)`` for ``-m name`` (after options, grouped or not: ``-Im name``,
    ``-Imname``, ``-X dev -m name``), ``("code", "")`` for ``-c``, ``("script", path)``,
    or ``("", "")`` (interactive)."""
    i = 1
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return ("script", args[i + 1]) if i + 1 < len(args) else ("", "")
        if arg == "-" or not arg.startswith("-"):
            return "script", arg
        if arg.startswith("--"):  # --check-hash-based-pycs MODE; the others take none
            i += 2 if arg == "--check-hash-based-pycs" else 1
            continue
        for j in range(1, len(arg)):
            rest = arg[j + 1:]
            if arg[j] == "m":
                return "module", rest or (args[i + 1] if i + 1 < len(args) else "")
            if arg[j] == "c":
                return "code", ""
            if arg[j] in "XW":  # takes a value: the rest of the group, else the next word
                i += 0 if rest else 1
                break
        i += 1
    return "", ""


def _launched_as_command() -> bool:
    """Whether this process is the ``tensorstream`` command: ``sys.argv[0]`` is
    its console script, or runpy is importing this package for ``python [options]
    -m tensorstream`` (``sys.argv[0]`` is ``-m`` until then). A program of one's
    own importing the library is not, nor a ``multiprocessing`` child of the
    command (it is handed the parent's ``sys.argv``; its interpreter runs ``-c``)."""
    argv = getattr(_sys, "argv", None)  # (an embedding interpreter may have none)
    argv0 = argv[0] if argv else ""
    started = _started_with(list(getattr(_sys, "orig_argv", None) or []))
    if argv0 == "-m":
        return started == ("module", "tensorstream")
    named = argv0.replace("\\", "/").rpartition("/")[2].removesuffix(".exe") == "tensorstream"
    return named and started[0] != "code"


def _exit_interrupted(signum: int = 2, frame: object = None) -> None:
    """The command's SIGINT handler while it starts: its one line for Ctrl-C,
    then the process ends with status 130.

    Start-up imports for a good part of a second, before the command line's own
    handling (:func:`tensorstream.cli.main.main`, which puts Python's handler
    back) is imported; a ``KeyboardInterrupt`` there ended the command with a
    traceback. Nothing is imported here: a second Ctrl-C finds nothing to interrupt.
    The process ends at once, not by ``SystemExit``: the signal may come inside a
    finalizer or a weakref callback of the imports (importlib's module locks), where
    an exception is printed as "Exception ignored" and the start went on; nothing has
    been written or begun yet that an exit would leave half-done."""
    try:
        _sys.stderr.write("tensorstream: error: interrupted by SIGINT\n")
        _sys.stderr.flush()
    except (OSError, ValueError):  # no stderr (a closed terminal)
        pass
    _exit_now(130)


# SIGINT is held back while this module decides whether it is the command and sets
# the command's handler: one that comes meanwhile is delivered after, to the handler
# that is then in place (it was a traceback through this module). The mask is read
# before it is changed, and changed inside the try: an exception at any line between
# (a program's own signal handler raising) cannot leave SIGINT blocked for good.
_hold = getattr(_signal, "pthread_sigmask", None)  # (not on Windows)
_held = _hold(_signal.SIG_BLOCK, ()) if _hold is not None else None
try:
    if _hold is not None:
        _hold(_signal.SIG_BLOCK, {_signal.SIGINT})
    # Before any import below: Ctrl-C during them is handled (unless it is ignored).
    if _launched_as_command() and _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler:
        try:
            _signal.signal(_signal.SIGINT, _exit_interrupted)
        except ValueError:  # imported off the main thread: only that one may set it
            pass
finally:
    if _hold is not None and _held is not None:
        _hold(_signal.SIG_SETMASK, _held)

from typing import TYPE_CHECKING as _TYPE_CHECKING  # noqa: E402
from typing import Any as _Any  # noqa: E402

from . import errors  # noqa: E402

__version__ = "0.1.0"

# Everything but ``errors`` is imported on first use: ``import tensorstream``
# stays cheap (no dataclasses, asyncio loop machinery, tenacity, read-ahead,
# entry points; no torch, tensorizer or botocore), and a program or a
# short-lived ``tensorstream cp`` pays only for what it reaches.
_LAZY = {
    "BodyStream": "tensorstream.providers.base",
    "Capabilities": "tensorstream.providers.base",
    "ObjectInfo": "tensorstream.providers.base",
    "Provider": "tensorstream.providers.base",
    "Writer": "tensorstream.providers.base",
    "ParsedURI": "tensorstream.uri",
    "parse_uri": "tensorstream.uri",
    "redact": "tensorstream.uri",
    "get_provider": "tensorstream.api",
    "open": "tensorstream.api",
    "read_range": "tensorstream.api",
    "stat": "tensorstream.api",
    "StreamReader": "tensorstream.file",
    "StreamWriter": "tensorstream.stream_writer",
    "register": "tensorstream.providers.registry",
    "registered_schemes": "tensorstream.providers.registry",
    "describe_credentials": "tensorstream.credentials.describe",
    "deserialize": "tensorstream.tensorizer.load",
    "load_into_module": "tensorstream.tensorizer.load",
    "serialize": "tensorstream.tensorizer.save",
    "TensorizerConfig": "tensorstream.tensorizer.config",
    "convert": "tensorstream.conversion.api",
    "inspect": "tensorstream.inspection",
    "ModelInfo": "tensorstream.inspection",
}


#: Subpackages reached as attributes (``tensorstream.safetensors.load(...)``), imported on first use.
_LAZY_MODULES = {"safetensors"}


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | _LAZY_MODULES)


def __getattr__(name: str) -> _Any:
    if name in _LAZY_MODULES:
        import importlib

        return importlib.import_module(f"tensorstream.{name}")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tensorstream' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


if _TYPE_CHECKING:  # pragma: no cover
    from . import safetensors as safetensors
    from .api import get_provider, open, read_range, stat
    from .conversion.api import convert
    from .credentials.describe import describe_credentials
    from .file import StreamReader
    from .inspection import ModelInfo, inspect
    from .providers.base import BodyStream, Capabilities, ObjectInfo, Provider, Writer
    from .providers.registry import register, registered_schemes
    from .stream_writer import StreamWriter
    from .tensorizer.config import TensorizerConfig
    from .tensorizer.load import deserialize, load_into_module
    from .tensorizer.save import serialize
    from .uri import ParsedURI, parse_uri, redact

__all__ = [
    "BodyStream",
    "Capabilities",
    "ModelInfo",
    "ObjectInfo",
    "ParsedURI",
    "Provider",
    "StreamReader",
    "StreamWriter",
    "TensorizerConfig",
    "Writer",
    "__version__",
    "convert",
    "describe_credentials",
    "deserialize",
    "errors",
    "get_provider",
    "inspect",
    "load_into_module",
    "open",
    "parse_uri",
    "read_range",
    "redact",
    "register",
    "registered_schemes",
    "serialize",
    "stat",
]
