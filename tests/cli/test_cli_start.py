"""What a whole ``tensorstream cp`` process does before and besides its copy.

Each test runs the command in a fresh interpreter (what a user's shell runs),
S3 (moto, signatures checked) to a local directory, and looks at the process
from inside: child processes started, modules imported. Start-up is a fixed
cost of every copy (issue 16: a folder of 100 x 4 MiB against s5cmd).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from fixtures_s3 import S3_BUCKET
from tensorstream.testing.s3_server import MotoS3Server

pytestmark = pytest.mark.usefixtures("isolated_env")

# Runs in a fresh interpreter: records child processes (audit events) while
# `tensorstream cp ARGS...` runs, then prints what it saw as one JSON line.
_CLIENT = r"""
import json, sys
spawned = []
def hook(event, args):
    if event in ("subprocess.Popen", "os.posix_spawn", "os.fork", "os.exec", "os.system"):
        spawned.append(f"{event} {args[0]!r}"[:200])
sys.addaudithook(hook)
from tensorstream.cli.main import main
rc = main(sys.argv[1:])
print(json.dumps({"rc": rc, "spawned": spawned, "modules": sorted(sys.modules)}))
"""


def _run_cp(moto: MotoS3Server, tmp_path: Path, *argv: str) -> dict[str, object]:
    script = tmp_path / "client.py"
    script.write_text(_CLIENT)
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2] / "src") + os.pathsep + \
        env.get("PYTHONPATH", "")
    flags: list[str] = []
    for k, v in moto.options().items():
        flags += ["--" + k.replace("_", "-"), str(v)]
    proc = subprocess.run([sys.executable, str(script), "cp", "--quiet", *flags, *argv],
                          capture_output=True, text=True, env=env, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["rc"] == 0
    return result


@pytest.fixture
def folder(moto_s3: MotoS3Server) -> tuple[str, dict[str, bytes]]:
    prefix = f"start/{uuid.uuid4().hex}"
    data = {f"{i:02d}.bin": os.urandom(50_000 + i) for i in range(3)}
    for name, body in data.items():
        moto_s3.put(S3_BUCKET, f"{prefix}/{name}", body)
    return f"s3://{S3_BUCKET}/{prefix}/", data


def test_cp_starts_no_child_process(moto_s3: MotoS3Server, tmp_path: Path,
                                    folder: tuple[str, dict[str, bytes]]) -> None:
    # ctypes.util.find_library("c") (the read-ahead's madvise, imported by the
    # local provider) ran `ldconfig -p` in a child process: 28-41 ms of every cp.
    src, data = folder
    dst = tmp_path / "out"
    result = _run_cp(moto_s3, tmp_path, "-r", src, f"{dst}/")
    assert result["spawned"] == []
    assert {p.name: p.read_bytes() for p in dst.iterdir()} == data


def test_cp_that_never_fails_imports_no_retry_loop(moto_s3: MotoS3Server, tmp_path: Path,
                                                  folder: tuple[str, dict[str, bytes]]) -> None:
    # Every call's first attempt runs outside the retry loop, so tenacity is only
    # imported once a call has failed.
    src, data = folder
    dst = tmp_path / "out"
    result = _run_cp(moto_s3, tmp_path, "-r", src, f"{dst}/")
    modules = result["modules"]
    assert isinstance(modules, list) and "tensorstream.copy.engine" in modules
    assert not [m for m in modules if m == "tenacity" or m.startswith("tenacity.")]
    assert "tensorstream.layers.retrying" not in modules
    assert {p.name: p.read_bytes() for p in dst.iterdir()} == data


def test_cp_from_s3_imports_no_other_service_config(moto_s3: MotoS3Server, tmp_path: Path,
                                                   folder: tuple[str, dict[str, bytes]]) -> None:
    # The local destination is handed the S3 options too: they are looked up in the S3
    # config (loaded, and their prefix says so), not in every service's.
    src, data = folder
    dst = tmp_path / "out"
    result = _run_cp(moto_s3, tmp_path, "-r", src, f"{dst}/")
    modules = result["modules"]
    assert isinstance(modules, list) and "tensorstream.providers.s3.config" in modules
    others = ("tensorstream.providers.http.config", "tensorstream.providers.redis.config",
              "tensorstream.providers.fsspec.config", "tensorstream.credentials.report")
    assert [m for m in others if m in modules] == []
    assert {p.name: p.read_bytes() for p in dst.iterdir()} == data


# A process entry point as the console script runs it, with an object that says
# when the interpreter finalises it and an atexit handler that says it ran.
_ENTRY = r"""
import atexit, sys
class Canary:
    def __del__(self):
        sys.stderr.write("finalised\n")
canary = Canary()
atexit.register(lambda: sys.stderr.write("atexit ran\n"))
from tensorstream.cli.main import entry
sys.argv = ["tensorstream", *sys.argv[1:]]
entry()
"""


def test_entry_skips_teardown_but_flushes_and_runs_atexit(tmp_path: Path) -> None:
    # The process ends with os._exit after main(): no finalisation of modules
    # and objects (38-47 ms of a 100-object cp at load 10), but buffered output
    # and atexit handlers are not lost, and the exit status is main()'s.
    src = tmp_path / "src"
    src.mkdir()
    names = [f"f{i:03d}.bin" for i in range(40)]
    for name in names:
        (src / name).write_bytes(name.encode())
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2] / "src") + os.pathsep + \
        env.get("PYTHONPATH", "")
    ok = subprocess.run([sys.executable, "-c", _ENTRY, "cp", "--json", "-r", f"{src}/",
                         f"{tmp_path / 'dst'}/"], capture_output=True, text=True, env=env,
                        timeout=120, check=False)
    assert ok.returncode == 0, ok.stderr
    lines = [json.loads(line) for line in ok.stdout.splitlines()]  # every line, complete
    assert lines[-1]["op"] == "summary" and lines[-1]["files"] == len(names)
    assert "atexit ran" in ok.stderr
    assert "finalised" not in ok.stderr
    failed = subprocess.run([sys.executable, "-c", _ENTRY, "cp", str(tmp_path / "missing"),
                             str(tmp_path / "x")], capture_output=True, text=True, env=env,
                            timeout=120, check=False)
    assert failed.returncode == 1
    assert "no such file" in failed.stderr and "atexit ran" in failed.stderr


def test_python_m_exit_status_and_broken_pipe(tmp_path: Path) -> None:
    # `python -m tensorstream` goes through entry(): statuses unchanged, and a
    # reader that leaves early still ends the command quietly with status 0.
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2] / "src") + os.pathsep + \
        env.get("PYTHONPATH", "")
    usage = subprocess.run([sys.executable, "-m", "tensorstream", "cp", "only-one"],
                           capture_output=True, text=True, env=env, timeout=120, check=False)
    assert usage.returncode == 2
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(8 << 20))
    cat = subprocess.Popen([sys.executable, "-m", "tensorstream", "cat", str(big)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert cat.stdout is not None and cat.stderr is not None
    assert len(cat.stdout.read(1000)) == 1000
    cat.stdout.close()  # the reader goes away
    err = cat.stderr.read()
    assert cat.wait(timeout=120) == 0, err
    assert b"Traceback" not in err and b"Exception ignored" not in err


_GC_STATE = r"""
import atexit, gc, json, sys
atexit.register(lambda: sys.stderr.write(json.dumps(
    {"frozen": gc.get_freeze_count(), "enabled": gc.isenabled()}) + "\n"))
from tensorstream.cli import entry
sys.argv = ["tensorstream", *sys.argv[1:]]
entry()
"""


def test_entry_imports_with_the_collector_paused_then_freezes(tmp_path: Path) -> None:
    # The process entry imports the command line without cyclic collections
    # (nothing to collect: 7% of the import CPU) and freezes what it imported,
    # so collections during the command do not walk it; the collector is on
    # again while the command runs. Importing the package alone changes nothing.
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2] / "src") + os.pathsep + \
        env.get("PYTHONPATH", "")
    (tmp_path / "a.bin").write_bytes(b"a" * 1000)
    proc = subprocess.run([sys.executable, "-c", _GC_STATE, "cp", "--quiet",
                           str(tmp_path / "a.bin"), str(tmp_path / "b.bin")],
                          capture_output=True, text=True, env=env, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    state = json.loads(proc.stderr.strip().splitlines()[-1])
    assert state["enabled"] is True
    assert state["frozen"] > 10_000  # the modules' functions, classes, dicts...
    plain = subprocess.run([sys.executable, "-c", "import gc, tensorstream.cli.main; "
                            "print(gc.get_freeze_count(), gc.isenabled())"],
                           capture_output=True, text=True, env=env, timeout=120, check=True)
    assert plain.stdout.split() == ["0", "True"]


def test_cp_imports_no_module_only_sync_or_a_usage_error_needs(
        moto_s3: MotoS3Server, tmp_path: Path, folder: tuple[str, dict[str, bytes]]) -> None:
    # The same-second date check is sync's, the secret option names a usage error's:
    # imported at start, they were part of every cp's start-up.
    src, data = folder
    dst = tmp_path / "out"
    result = _run_cp(moto_s3, tmp_path, "-r", src, f"{dst}/")
    modules = result["modules"]
    assert isinstance(modules, list) and "tensorstream.cli.usage_errors" in modules
    assert "tensorstream.copy.sync_dates" not in modules
    assert "tensorstream.cli.sync_delete" not in modules  # (sync --delete's, imported there)
    assert {p.name: p.read_bytes() for p in dst.iterdir()} == data
