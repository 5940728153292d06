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
