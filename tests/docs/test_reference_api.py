"""What the docs say about the Python API and the source tree, checked against the code
(tests/docs/test_reference.py does the CLI, the defaults and the variables):

* every public name of the packages a user imports (``tensorstream`` and its
  ``safetensors``, ``tensorizer``, ``copy`` and ``conversion`` front doors) is in the API
  reference (docs/api.md), and every argument of ``convert`` and ``copy_async`` is
  described where a user looks for it;
* docs/index.md's source tree names every package and public module of src/tensorstream
  (test_reference.py checks the other way: what it names exists), and its table of pages
  every page of docs/;
* every table of a page is one table (a line between two rows breaks it);
* the examples the pages cannot run (``<!-- skip: next ... -->``) still use no name that
  nothing defines: a copied example must not fail on a missing import.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SRC = ROOT / "src" / "tensorstream"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]

FRONT_DOORS = ("tensorstream", "tensorstream.safetensors", "tensorstream.tensorizer",
               "tensorstream.copy", "tensorstream.conversion")

#: Names the pages use for what the reader supplies ("your model", "your bytes").
PLACEHOLDERS = {"model", "serialized_bytes"}


def _whole_modules(api: str) -> set[str]:
    """The modules docs/api.md renders whole (``::: module`` without a ``members:`` list)."""
    return {m.group(1) for m in re.finditer(r"^::: ([\w.]+)\n(?!    options:\n      members)",
                                             api + "\n", re.M)}


@pytest.mark.parametrize("package", FRONT_DOORS)
def test_every_public_name_of_a_front_door_is_in_the_api_reference(package: str) -> None:
    api = (DOCS / "api.md").read_text()
    whole = _whole_modules(api)
    module = importlib.import_module(package)
    missing = [n for n in module.__all__ if n != "__version__"
               and not re.search(rf"(?<![\w]){n}\b", api)
               and getattr(getattr(module, n), "__module__", None) not in whole]
    assert not missing, f"{package}.__all__ names docs/api.md leaves out: {missing}"


def test_every_argument_of_convert_is_on_its_page() -> None:
    import tensorstream

    text = (DOCS / "convert.md").read_text()
    params = [p for p in inspect.signature(tensorstream.convert).parameters
              if p not in ("src", "dst", "options")]
    missing = [p for p in params if not re.search(rf"`{p}`|\b{p}=", text)]
    assert not missing, f"docs/convert.md does not describe convert's {missing}"


def test_every_argument_of_copy_async_is_in_its_docstring() -> None:
    # The API reference is all a Python user of tensorstream.copy gets (cli.md is the flags).
    from tensorstream.copy import copy_async, engine

    doc = (inspect.getdoc(copy_async) or "") + (inspect.getdoc(engine) or "")
    missing = [p for p in inspect.signature(copy_async).parameters
               if not re.search(rf"``{p}\b", doc)]
    assert not missing, f"copy_async's docstring does not describe {missing}"


def _tree() -> str:
    m = re.search(r"```text\nsrc/tensorstream/\n(.*?)```", (DOCS / "index.md").read_text(), re.S)
    assert m, "docs/index.md no longer draws src/tensorstream/"
    return m.group(1)


def _moved() -> set[str]:
    """The modules docs/index.md lists as moved (deprecated names that still import)."""
    m = re.search(r"Modules that moved before this first release \((.*?)\)", " ".join(
        (DOCS / "index.md").read_text().split()))
    assert m, "docs/index.md no longer lists the modules that moved"
    return set(re.findall(r"`(?:tensorstream\.)?(\w+)`", m.group(1)))


def test_the_source_tree_names_every_package_and_public_module() -> None:
    tree = _tree()
    folders = set(re.findall(r"^\s+(\w+)/", tree, re.M))
    top_lines = " ".join(line for line in tree.splitlines() if not re.match(r"\s+\w+/", line))
    packages = {p.parent.name for p in SRC.glob("*/__init__.py")}
    assert packages - folders == set(), (
        f"docs/index.md's source tree leaves out the packages {sorted(packages - folders)}")
    public = {p.name for p in SRC.glob("*.py") if not p.name.startswith("_")}
    moved = {f"{n}.py" for n in _moved()}
    left_out = sorted(public - moved - set(re.findall(r"\w+\.py", top_lines)))
    assert not left_out, f"docs/index.md's source tree leaves out the modules {left_out}"


def _skipped_python(page: Path) -> list[tuple[int, str, str]]:
    """``(line, source, what the page ran before it)`` of each skipped Python block."""
    text = page.read_text()
    out = []
    for m in re.finditer(r"<!--\s*skip:\s*next[^>]*-->\s*\n```python[^\n]*\n(.*?)```", text, re.S):
        before = "\n".join(re.findall(r"```python[^\n]*\n(.*?)```", text[: m.start()], re.S))
        out.append((text[: m.start()].count("\n") + 2, m.group(1), before))
    return out


def _bound(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return names


def _undefined(source: str, before: str) -> list[str]:
    tree = ast.parse(source)
    known = _bound(tree) | _bound(ast.parse(before)) | set(dir(builtins)) | PLACEHOLDERS
    return sorted({n.id for n in ast.walk(tree)
                   if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)} - known)


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_skipped_examples_define_what_they_use(page: Path) -> None:
    for line, source, before in _skipped_python(page):
        undefined = _undefined(source, before)
        assert not undefined, f"{page.name}:{line}: the example uses {undefined} and defines none"


def test_the_undefined_name_check_sees_a_missing_import() -> None:
    assert _undefined("import torch.distributed as dist\ntorch.cuda.device_count()\n", "") == [
        "torch"]
    assert _undefined("x = torch.ones(1)\n", "import torch\n") == []


def test_the_overview_s_page_table_names_every_page() -> None:
    text = (DOCS / "index.md").read_text()
    table = "\n".join(line for line in text.splitlines() if line.startswith("| ["))
    linked = set(re.findall(r"\]\(([\w-]+\.md)\)", table))
    pages = {p.name for p in DOCS.glob("*.md")} - {"index.md"}
    assert not pages - linked, f"docs/index.md's table of pages leaves out {sorted(pages - linked)}"


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_table_is_one_table(page: Path) -> None:
    # A paragraph or a blank line inside a table ends it: the rows after it render as text
    # full of pipes (providers.md's shared options lost six rows that way).
    lines, inside = page.read_text().splitlines(), False
    for i, line in enumerate(lines):
        if re.match(r"\s*(`{3,}|~{3,})", line):
            inside = not inside
        if inside or not line.startswith("|") or (i and lines[i - 1].startswith("|")):
            continue
        following = lines[i + 1] if i + 1 < len(lines) else ""
        assert re.match(r"\|\s*:?-{3,}", following), (
            f"{page.name}:{i + 1}: table rows without a header row (a line between rows?): "
            f"{line[:60]!r}")


def test_every_fixture_of_the_plugin_is_on_the_testing_page() -> None:
    import tensorstream.testing.plugin as plugin

    text = (DOCS / "testing.md").read_text()
    fixtures = [name for name, obj in vars(plugin).items() if not name.startswith("_") and (
        type(obj).__name__ == "FixtureFunctionDefinition"  # pytest >= 8.4
        or hasattr(obj, "_fixture_function_marker"))]
    assert fixtures, "no fixture found in tensorstream.testing.plugin"
    missing = [n for n in fixtures if f"`{n}`" not in text]
    assert not missing, f"docs/testing.md does not name the plugin's fixtures {missing}"
