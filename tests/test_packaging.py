"""Installs that resolve quickly: the test extra names one aiobotocore/boto3 pair
whose botocore ranges meet, so pip takes the first candidate of each instead of
walking back through boto3 releases; the README's torch line is the CPU build
CI uses."""

from __future__ import annotations

import re
import sys
from importlib.metadata import requires, version
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - pytest depends on tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def _extra(name: str) -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["optional-dependencies"][name]]
    return {r.name: r for r in reqs}


def _botocore_range(dist: str) -> Requirement:
    (req,) = [Requirement(r) for r in requires(dist) or []
              if Requirement(r).name == "botocore" and not Requirement(r).marker]
    return req


def _bounds(req: Requirement) -> tuple[Version, Version]:
    lows = [Version(s.version) for s in req.specifier if s.operator in (">=", "==")]
    highs = [Version(s.version) for s in req.specifier if s.operator in ("<", "==")]
    assert lows and highs, f"{req} needs a lower and an upper bound"
    return max(lows), min(highs)


def test_test_extra_pins_one_matching_boto3_aiobotocore_pair() -> None:
    test = _extra("test")
    boto3, aiobotocore = test["boto3"], test["aiobotocore"]
    b_lo, b_hi = _bounds(boto3)
    _bounds(aiobotocore)  # bounded too: a new aiobotocore moves botocore's range
    # The installed pair is the one the pins name ...
    assert Version(version("boto3")) in boto3.specifier
    assert Version(version("aiobotocore")) in aiobotocore.specifier
    # ... and boto3 X.Y.Z needs botocore >= X.Y.Z (they are released in lockstep): every
    # boto3 the pin allows must find its botocore inside aiobotocore's range.
    ab_lo, ab_hi = _bounds(_botocore_range("aiobotocore"))
    assert b_lo >= ab_lo and b_hi <= ab_hi, (
        f"boto3 {boto3.specifier} needs botocore outside aiobotocore's {ab_lo}..{ab_hi}")
    boto3_needs = _botocore_range("boto3")
    assert Version(version("botocore")) in boto3_needs.specifier


def test_readme_torch_line_is_the_pin_ci_installs_first() -> None:
    # The first command installs torch pinned, before tensorstream (so no range pulls another
    # build), from the configured index as .ci/run does; PyTorch's CPU index is named for
    # machines that reach PyPI directly (behind no network, asking it costs minutes of retries).
    readme = (ROOT / "README.md").read_text()
    line = next(s for s in readme.splitlines() if "pip install torch==" in s)
    pinned = re.search(r"torch==([\d.]+)", line)
    constraints = (ROOT / ".ci" / "constraints.txt").read_text()
    assert pinned and f"torch=={pinned.group(1)}" in constraints
    assert line.index("pip install torch==") < line.index("pip install -e .")
    ci = (ROOT / ".ci" / "run").read_text()
    assert f"pip install -q torch=={pinned.group(1)}" in ci
    assert "https://download.pytorch.org/whl/cpu" in readme


def _closure(extras: tuple[str, ...]) -> set[str]:
    """The distributions ``pip install 'tensorstream[extras]'`` installs (normalized names),
    from the installed packages' metadata (markers evaluated for this interpreter)."""
    from importlib.metadata import PackageNotFoundError

    def norm(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    todo = [Requirement(r) for r in project["dependencies"]]
    todo += [Requirement(r) for e in extras for r in project["optional-dependencies"][e]]
    seen: set[str] = set()
    while todo:
        req = todo.pop()
        if norm(req.name) in seen or norm(req.name) == "tensorstream":
            continue
        seen.add(norm(req.name))
        try:
            wanted = requires(req.name) or []
        except PackageNotFoundError:
            continue
        for text in wanted:
            sub = Requirement(text)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in
                                         ("", *sorted(req.extras))):
                todo.append(sub)
    return seen


def _packages_distributions() -> dict[str, list[str]]:
    """Top-level module -> the distributions that install it, as Python 3.11's
    ``importlib.metadata.packages_distributions``: 3.10's reads only ``top_level.txt``,
    which wheels built by anything but setuptools (aiobotocore, fsspec, hypothesis...)
    lack, so there it mapped them to nothing; the modules are inferred from the files."""
    import inspect
    from importlib.metadata import distributions

    found: dict[str, list[str]] = {}
    for dist in distributions():
        declared = (dist.read_text("top_level.txt") or "").split()
        inferred = {f.parts[0] if len(f.parts) > 1 else inspect.getmodulename(str(f))
                    for f in dist.files or [] if f.suffix in (".py", ".so", ".pyd")}
        for module in set(declared) | {m for m in inferred if m and "." not in m}:
            found.setdefault(module, []).append(dist.metadata["Name"])
    return found


def test_what_the_tests_import_is_in_the_extras_tox_installs() -> None:
    # tox.ini installs tensorstream[test,docs]: a module the tests import from elsewhere (the
    # bench extra, a developer's venv) made 'tox' fail to collect them, or skip them unseen.
    import ast

    tests = ROOT / "tests"
    local = {"tests", "tensorstream", "benchmarks", "conftest"} | {
        p.stem for p in tests.rglob("*.py")}
    imported: dict[str, str] = {}
    for path in tests.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0
                     and node.module else [])
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in local:
                    imported.setdefault(top, str(path.relative_to(ROOT)))
    importorskip = re.compile(r'importorskip\("(\w+)')
    for path in tests.rglob("*.py"):
        for top in importorskip.findall(path.read_text()):
            imported.setdefault(top, str(path.relative_to(ROOT)))
    installed = _closure(("test", "docs"))
    dists = _packages_distributions()
    # tomli: pytest's own dependency below Python 3.11 (tomllib: the standard library's from
    # 3.11, which 3.10's sys.stdlib_module_names does not list; imported under a version
    # check). fuse (fusepy, with libfuse 2): tests/case_folding_fs.py, run as a process of
    # its own; its one test is skipped, saying why, where it is missing (no kernel
    # filesystem that folds case is at hand).
    optional = {"tomli", "tomllib", "fuse"}
    missing = {
        module: where for module, where in sorted(imported.items())
        if module not in optional and module not in local
        and not any(re.sub(r"[-_.]+", "-", d).lower() in installed for d in dists.get(module, []))
    }
    assert not missing, f"tests import what tensorstream[test,docs] does not install: {missing}"


def _pins() -> list[tuple[str, Requirement]]:
    """Every exact pin CI installs: the extras' ``==`` and .ci/constraints.txt's lines."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = [(f"pyproject.toml [{extra}]", Requirement(r))
            for extra, reqs in project["optional-dependencies"].items() for r in reqs]
    for line in (ROOT / ".ci" / "constraints.txt").read_text().splitlines():
        if line.split("#")[0].strip():
            pins.append((".ci/constraints.txt", Requirement(line.split("#")[0])))
    return [(where, r) for where, r in pins if str(r.specifier).startswith("==")]


def test_every_pin_that_applies_to_python_310_installs_there() -> None:
    # requires-python is >=3.10, but CI runs 3.11: a pin of a release that dropped 3.10
    # (redis 8.2, sybil 10, mkdocs-material 9.8...) made .ci/run's install fail with
    # ResolutionImpossible on 3.10. Such a pin must carry python_version >= "3.11" and name a
    # release for 3.10 beside it. Checked from the installed release's Requires-Python,
    # for each pin that is what this interpreter installed.
    from importlib.metadata import PackageNotFoundError, metadata

    from packaging.specifiers import SpecifierSet

    py310 = {"python_version": "3.10", "python_full_version": "3.10.13"}
    wrong = []
    for where, req in _pins():
        if req.marker is not None and not req.marker.evaluate(py310):
            continue
        try:
            meta = metadata(req.name)
        except PackageNotFoundError:
            continue
        if Version(meta["Version"]) not in req.specifier:
            continue
        needs = meta["Requires-Python"]
        if needs and "3.10.13" not in SpecifierSet(needs):
            wrong.append(f"{where}: {req} (Requires-Python {needs})")
    assert not wrong, f"pins Python 3.10 cannot install: {wrong}"


def test_each_pin_applies_once_per_python() -> None:
    # Two pins of one distribution (one per Python) must not both apply to one interpreter.
    for env in ({"python_version": "3.10"}, {"python_version": "3.11"}, {"python_version": "3.13"}):
        seen: dict[tuple[str, str], Requirement] = {}
        for where, req in _pins():
            if req.marker is None or req.marker.evaluate(env):
                key = (where, req.name.lower())
                assert key not in seen, f"{where}: {seen[key]} and {req} both apply to {env}"
                seen[key] = req
