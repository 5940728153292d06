"""Every anonymous mapping tensorstream makes for its buffers is private.

``mmap.mmap(-1, n)`` without flags is a *shared* anonymous map: shmem, whose
first touch of each page costs more than a private page's (docs/benchmarks.md,
"Paced folder `cp`: where the extra CPU per MiB goes"). Buffers are touched
once per byte moved, so none may be made that way."""

from __future__ import annotations

import ast
from pathlib import Path

import tensorstream

SRC = Path(tensorstream.__file__).parent


def _anonymous_maps_without_private(tree: ast.AST) -> list[int]:
    bad = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "mmap" and node.args):
            continue
        first = node.args[0]
        anonymous = (isinstance(first, ast.UnaryOp) and isinstance(first.op, ast.USub)
                     and isinstance(first.operand, ast.Constant) and first.operand.value == 1)
        if not anonymous:
            continue
        flags = next((k.value for k in node.keywords if k.arg == "flags"), None)
        if flags is None or "MAP_PRIVATE" not in ast.unparse(flags):
            bad.append(node.lineno)
    return bad


def test_every_anonymous_map_is_private() -> None:
    found = {str(p.relative_to(SRC)): lines for p in sorted(SRC.rglob("*.py"))
             if (lines := _anonymous_maps_without_private(ast.parse(p.read_text())))}
    assert found == {}, f"shared anonymous maps (pass flags=MAP_PRIVATE | MAP_ANONYMOUS): {found}"


def test_the_check_finds_a_shared_map() -> None:
    assert _anonymous_maps_without_private(ast.parse("import mmap\nmmap.mmap(-1, 10)\n")) == [2]
    assert _anonymous_maps_without_private(ast.parse(
        "import mmap\nmmap.mmap(-1, 10, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)\n")) == []
