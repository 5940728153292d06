"""Bind mounts for tests, in a mount namespace of the test's own (``unshare -rm``: a user
namespace, no root needed where the kernel allows it): nothing outside the test sees them."""

from __future__ import annotations

import subprocess
from pathlib import Path


def can_bind_mount(tmp_path: Path) -> bool:
    """Whether ``unshare -rm mount --bind`` works here (a kernel or a container may not
    allow user namespaces: the tests that need it are skipped there)."""
    a, b = tmp_path / "ns-a", tmp_path / "ns-b"
    a.mkdir()
    b.mkdir()
    try:
        return subprocess.run(["unshare", "-rm", "mount", "--bind", str(a), str(b)],
                              capture_output=True, timeout=30, check=False).returncode == 0
    except OSError:
        return False
