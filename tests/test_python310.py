"""Nothing in src/ or tests/ needs a Python newer than 3.10 (``requires-python = ">=3.10"``).

ruff and mypy are told 3.10, but neither sees every case (mypy checks src/ only, and a name
imported from a module is not checked against its version by ruff), and CI runs one newer
interpreter: a ``typing.Self`` or a ``tomllib`` would pass here and fail at import on 3.10.
This reads every module's syntax tree for the 3.11+ names and syntax a recent habit brings in;
a use under ``if sys.version_info >= (3, 11):`` (or newer) is allowed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: module -> names it has only from 3.11 on (3.12, 3.13 too), with what to use instead.
NEWER: dict[str, dict[str, str]] = {
    "typing": dict.fromkeys(
        ("Self", "LiteralString", "Never", "assert_never", "assert_type", "reveal_type",
         "Required", "NotRequired", "Unpack", "TypeVarTuple", "dataclass_transform",
         "get_overloads", "clear_overloads", "override", "TypeAliasType", "ReadOnly", "TypeIs"),
        "3.11+: annotate with the class name (or a TypeVar bound to it)"),
    "datetime": {"UTC": "3.11+: datetime.timezone.utc"},
    "asyncio": dict.fromkeys(("TaskGroup", "timeout", "timeout_at", "Runner", "Barrier"),
                             "3.11+: asyncio.gather / asyncio.wait_for"),
    "hashlib": {"file_digest": "3.11+: read the file in chunks into hashlib.new(...)"},
    "enum": dict.fromkeys(("StrEnum", "ReprEnum", "verify", "member", "nonmember",
                           "global_enum", "EnumCheck", "FlagBoundary"),
                          "3.11+: class E(str, Enum)"),
    "contextlib": {"chdir": "3.11+: os.chdir in try/finally"},
    "itertools": {"batched": "3.12+: slice in a loop"},
    "operator": {"call": "3.11+: call it"},
    "math": dict.fromkeys(("cbrt", "exp2"), "3.11+: x ** (1 / 3), 2 ** x"),
    "sys": {"exception": "3.11+: sys.exc_info()[1]"},
    "logging": {"getLevelNamesMapping": "3.11+: logging._nameToLevel"},
    "re": {"NOFLAG": "3.11+: 0"},
    "inspect": {"markcoroutinefunction": "3.12+: an async def"},
    "wsgiref": {"types": "3.11+: annotate with typing.Any"},
}
MODULES = {"tomllib": "3.11+: tomli below 3.11 (if sys.version_info >= (3, 11): ... else ...)"}
#: methods of built-in types that 3.10 lacks, whatever object they are called on.
METHODS = {"add_note": "3.11+ (BaseException.add_note): put the context in the message"}
BUILTINS = {"ExceptionGroup": "3.11+ (the exceptiongroup backport below)",
            "BaseExceptionGroup": "3.11+ (the exceptiongroup backport below)"}


def _newer_guard(node: ast.If) -> bool:
    """``if sys.version_info >= (3, 11...)``: its body may use what 3.11 has."""
    test = node.test
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Attribute)
            and test.left.attr == "version_info" and isinstance(test.ops[0], ast.GtE)
            and isinstance(test.comparators[0], ast.Tuple)
            and [getattr(e, "value", None) for e in test.comparators[0].elts][:2] >= [3, 11])


def _catches_builtin_timeout(node: ast.Try) -> bool:
    """Whether a handler of ``node`` names the builtin ``TimeoutError`` (and not
    ``asyncio.TimeoutError``, which 3.10 raises from ``asyncio.wait_for``)."""
    for handler in node.handlers:
        kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        names = [k.id if isinstance(k, ast.Name) else ast.unparse(k) for k in kinds if k]
        if "TimeoutError" in names and "asyncio.TimeoutError" not in names:
            return True
    return False


def newer_than_310(source: str, where: str) -> list[str]:
    """Every use in ``source`` of a name or syntax Python 3.10 does not have."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        # Under 3.10 itself, 3.11 syntax (``except*``) does not parse: that is the finding.
        return [f"{where}:{e.lineno}: syntax this Python cannot parse: {e.msg}"]
    aliases: dict[str, str] = {}  # local name -> module, for ``import asyncio as aio``
    found: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _newer_guard(node):
            for child in node.orelse:
                visit(child)
            return
        line = f"{where}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name] = a.name
                if a.name in MODULES:
                    found.append(f"{line}: import {a.name}: {MODULES[a.name]}")
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module in MODULES:
                found.append(f"{line}: from {node.module}: {MODULES[node.module]}")
            for a in node.names:
                why = NEWER.get(node.module, {}).get(a.name)
                if why:
                    found.append(f"{line}: {node.module}.{a.name}: {why}")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            module = aliases.get(node.value.id)
            why = NEWER.get(module or "", {}).get(node.attr)
            if why:
                found.append(f"{line}: {module}.{node.attr}: {why}")
        elif isinstance(node, ast.Name) and node.id in BUILTINS and isinstance(node.ctx, ast.Load):
            found.append(f"{line}: {node.id}: {BUILTINS[node.id]}")
        elif type(node).__name__ == "TryStar":
            found.append(f"{line}: except*: 3.11+")
        if isinstance(node, ast.Try) and _catches_builtin_timeout(node) and any(
                isinstance(n, ast.Call) and getattr(n.func, "attr", getattr(n.func, "id", ""))
                == "wait_for" for stmt in node.body for n in ast.walk(stmt)):
            found.append(f"{line}: except TimeoutError around asyncio.wait_for: 3.11+ "
                         "(before, it raises asyncio.TimeoutError, not a TimeoutError)")
        if isinstance(node, ast.Attribute) and node.attr in METHODS:
            found.append(f"{line}: .{node.attr}: {METHODS[node.attr]}")
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


FILES = sorted(p for top in ("src", "tests") for p in (ROOT / top).rglob("*.py"))


def test_nothing_needs_python_311() -> None:
    found = [hit for path in FILES
             for hit in newer_than_310(path.read_text(), str(path.relative_to(ROOT)))]
    assert not found, "requires-python is >=3.10, but these need 3.11+:\n" + "\n".join(found)


@pytest.mark.parametrize("source", [
    "from typing import Any, Self\n",
    "import typing\nx: typing.Self\n",
    "import tomllib\n",
    "import datetime as dt\nnow = dt.datetime.now(dt.UTC)\n",
    "import asyncio\nasync def f():\n    async with asyncio.TaskGroup() as g: pass\n",
    "import hashlib\nhashlib.file_digest(f, 'md5')\n",
    "raise ExceptionGroup('x', [ValueError()])\n",
    "try:\n    pass\nexcept* ValueError:\n    pass\n",
    "from enum import StrEnum\n",
    "try:\n    pass\nexcept ValueError as e:\n    e.add_note('x')\n    raise\n",
    "import re\nre.compile('a', re.NOFLAG)\n",
    "import asyncio\nasync def f(e):\n    try:\n        await asyncio.wait_for(e.wait(), 1)\n"
    "    except TimeoutError:\n        pass\n",
])
def test_the_check_sees_each_kind(source: str) -> None:
    assert newer_than_310(source, "x.py")


@pytest.mark.parametrize("source", [
    "import sys\nif sys.version_info >= (3, 11):\n    import tomllib\nelse:\n    import tomli as tomllib\n",
    "import datetime\nnow = datetime.datetime.now(datetime.timezone.utc)\n",
    "import asyncio\nasyncio.wait_for(x, 1)\n",
    "class Self: pass\n",
    "import asyncio\nasync def f(e):\n    try:\n        await asyncio.wait_for(e.wait(), 1)\n"
    "    except asyncio.TimeoutError:\n        pass\n",
    "import socket\ntry:\n    socket.create_connection(('h', 1), 1)\nexcept TimeoutError:\n    pass\n",
])
def test_the_check_leaves_310_code_alone(source: str) -> None:
    assert newer_than_310(source, "x.py") == []
