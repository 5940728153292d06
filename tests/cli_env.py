"""The environment for a CLI child that talks to the test S3 server, and a run of the CLI
in a child."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tensorstream.testing.s3_server import isolated_s3_env


def s3_env(server: Any, tmp_path: Path) -> dict[str, str]:
    """This process's environment with the AWS files isolated under ``tmp_path``
    and ``server``'s keys and region."""
    (tmp_path / "aws").mkdir(exist_ok=True)
    env = {**os.environ, **isolated_s3_env(tmp_path / "aws")}
    env.update(AWS_ACCESS_KEY_ID=server.access_key_id,
               AWS_SECRET_ACCESS_KEY=server.secret_access_key, AWS_DEFAULT_REGION=server.region)
    return env


def cli(*argv: str, env: dict[str, str] | None = None, **kw: Any
        ) -> subprocess.CompletedProcess[str]:
    """``python -m tensorstream ARGV`` in a child, its output captured as text."""
    return subprocess.run([sys.executable, "-m", "tensorstream", *argv], capture_output=True,
                          text=True, timeout=120, env=env, **kw)


def files_under(root: Path) -> dict[str, bytes]:
    """Every file under ``root``, by its path relative to ``root``, with its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}
