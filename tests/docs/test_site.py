"""The documentation site (MkDocs, Material theme, mkdocstrings API reference)
builds with ``--strict``: a broken link, a page missing from the nav or a
docstring mkdocstrings cannot render fails the build, and this test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_site_builds_strictly(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1",
           "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    # The API reference really comes from the docstrings.
    for anchor in ("tensorstream.tensorizer.load.deserialize",
                   "tensorstream.tensorizer.load.load_into_module",
                   "tensorstream.tensorizer.save.serialize",
                   "tensorstream.tensorizer.stats.LoadStats", "tensorstream.api.open",
                   "tensorstream.errors.TensorstreamError",
                   "tensorstream.testing.backends.Backend.apply_env",
                   "tensorstream.credentials.describe.describe_credentials",
                   "tensorstream.copy.engine.copy_async", "tensorstream.copy.result.CopyResult",
                   "tensorstream.tensorizer.sharding.shard_uri"):
        assert f'id="{anchor}"' in api, anchor
    assert "every load logs one INFO line" in api.lower() or "one INFO line" in api
    for page in ("quickstart", "load-a-model", "testing", "s3", "reliability"):
        assert (tmp_path / "site" / page / "index.html").is_file(), page
