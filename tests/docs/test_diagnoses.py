"""docs/cli.md's "Diagnoses" table quotes what a user reads when something is wrong: each row
is reproduced here, by the CLI in a child process against moto's S3 server on loopback, and
the message (its placeholders filled in) must be on stderr, with the exit status the page
gives. A reworded error, or a row the table gains without a case here, fails this test."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli_env import s3_env
from tensorstream.testing.s3_server import MotoS3Server

ROOT = Path(__file__).resolve().parents[2]


def _rows() -> dict[str, tuple[str, int | None]]:
    """``{what went wrong: (message, documented exit status or None)}``."""
    text = (ROOT / "docs" / "cli.md").read_text()
    table = text[text.index("## Diagnoses"):]
    table = table[:table.index("\n## ")]
    rows = {}
    for line in table.splitlines()[4:]:
        if not line.startswith("|"):
            continue
        what, said = (c.strip() for c in line.strip("|").split("|"))
        message = re.match(r"`(.+?)`(?=$| \(| —)", said)
        assert message, f"a Diagnoses row without a quoted message: {line}"
        status = re.search(r"\(exit (\d)\)", said)
        rows[what] = (message.group(1), int(status.group(1)) if status else None)
    return rows


@pytest.fixture(scope="module")
def s3() -> Iterator[MotoS3Server]:
    with MotoS3Server(auth=True) as server:
        server.create_bucket("bkt")
        server.put("bkt", "p/one.bin", b"1")
        yield server


def _cli(env: dict[str, str], cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tensorstream", *argv], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=120)


def test_every_diagnosis_reads_as_documented(s3: MotoS3Server, tmp_path: Path) -> None:
    env = {**s3_env(s3, tmp_path), "PYTHONPATH": str(ROOT / "src")}
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        free = sock.getsockname()[1]
    endpoint = ["--endpoint-url", s3.endpoint_url]
    models = tmp_path / "models" / "llama"
    models.mkdir(parents=True)
    (models / "a.bin").write_bytes(b"a")
    # what went wrong -> (command, {placeholder in the message: what it is here}, exit status)
    cases = {
        "endpoint without a scheme": (["--endpoint-url", "minio:9000", "ls", "s3://"], {}, 2),
        "destination bucket missing": (["cp", *endpoint, "models/llama/a.bin", "s3://x/a.bin"],
                                       {"http://...": s3.endpoint_url}, 1),
        "a directory without `-r`": (["cp", "models/llama", "out/"],
                                     {"/models/llama": str(models)}, 1),
        "a prefix without `-r`": (["cp", *endpoint, "s3://bkt/p", "out/"],
                                  {"s3://b/p": "s3://bkt/p"}, 1),
        "object onto itself": (["cp", "models/llama/a.bin", "models/llama/a.bin"], {}, 1),
        "`sync X X`": (["sync", "models/llama", "models/llama/"], {"X and X": "... and ..."}, 2),
        "a typo in the key or the bucket (`cat`, `stat`, a load)": (
            ["cat", *endpoint, "s3://bkt/p/one.bni"], {"s3://b/p/": "s3://bkt/p/"}, 1),
        "no S3 credentials anywhere": (["ls", *endpoint, "s3://bkt/p/"], {}, 2),
        "another tool's command (`copy`, `list`, `mv`, `du`) or flag (`-R`), or a typo (`snyc`)": (
            ["copy", "models/llama/a.bin", "out/"], {}, 2),
        "a typo in the scheme (`s4://`, `htps://`)": (["cp", "s4://bkt/p/one.bin", "out/"], {}, 2),
        "a Windows path (`C:\\models\\m.tensors`)": (["cp", "C:\\models\\m.tensors", "out/"],
                                                 {}, 1),
        "a port or host typo (nothing listens there)": (
            ["cat", "--endpoint-url", f"http://127.0.0.1:{free}", "--retries", "1",
             "s3://bkt/p/one.bin"], {"127.0.0.1:9001": f"127.0.0.1:{free}"}, 1),
        "a directory or prefix into one inside it": (
            ["sync", *endpoint, "s3://bkt/p", "s3://bkt/p/bk"], {"s3://b/": "s3://bkt/"}, 1),
    }
    keyless = {k: v for k, v in env.items() if k not in ("AWS_ACCESS_KEY_ID",
                                                          "AWS_SECRET_ACCESS_KEY")}
    rows = _rows()
    assert set(rows) == set(cases), "docs/cli.md's Diagnoses rows and this test's cases differ"
    for what, (message, documented_status) in rows.items():
        argv, fill, status = cases[what]
        for placeholder, value in fill.items():
            message = message.replace(placeholder, value)
        done = _cli(env if what != "no S3 credentials anywhere" else keyless, tmp_path, *argv)
        # A "..." left in the message stands for anything (the places searched, an errno).
        quoted = ".*?".join(re.escape(part) for part in message.rstrip(".").split("..."))
        assert re.search(quoted, done.stderr), (what, message, done.stderr)
        assert done.returncode == (documented_status or status), (what, done.stderr)
        assert not os.path.exists(tmp_path / "out"), what  # nothing was copied
