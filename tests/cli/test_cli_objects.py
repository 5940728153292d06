"""``tensorstream stat | cat | rm`` (cli/objects.py) as operators script them: refusals,
ranges, ``--json`` for every outcome; the real CLI in a subprocess."""

from __future__ import annotations

import subprocess
import sys
from typing import Any


def cli(*argv: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tensorstream", *argv], capture_output=True,
                          text=True, timeout=120, **kw)


def test_rm_r_of_the_root_directory_is_refused() -> None:
    # GNU rm's --preserve-root: every file on the machine is never what was meant.
    for target in ("/", "file:///", "//", "/tmp/..", "/."):
        r = cli("rm", "-r", "--dryrun", target)
        assert r.returncode == 2, (target, r.stderr[-300:])
        assert r.stdout == "" and "refusing" in r.stderr and "Traceback" not in r.stderr

