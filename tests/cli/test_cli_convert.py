"""``tensorstream convert`` end to end in a subprocess: JSON result, exit statuses, key files,
passphrases from the environment, --overwrite, S3 flags, secrets never printed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import cli_env
from fixtures_s3 import S3_BUCKET
from signals import signals_as_from_a_terminal
from terminals import read_to_end, spawn_on_terminal

torch = pytest.importorskip("torch")
st_torch = pytest.importorskip("safetensors.torch")


def cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``tensorstream convert ARGV`` by the shared runner, ``env`` over this process's."""
    return cli_env.cli("convert", *argv, env={**os.environ, **(env or {})})


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return sorted(a) == sorted(b) and all(
        a[k].dtype == b[k].dtype and a[k].reshape(-1).view(torch.uint8).equal(
            b[k].reshape(-1).view(torch.uint8)) for k in a)


WANT = {"w": torch.arange(12, dtype=torch.bfloat16).reshape(3, 4), "b": torch.ones(3)}


def test_round_trip_with_a_key_file_json_and_overwrite(tmp_path: Path) -> None:
    st_torch.save_file(WANT, str(tmp_path / "m.safetensors"), metadata={"format": "pt", "k": "v"})
    key = tmp_path / "m.key"
    p = cli("--json", "--keyfile", str(key), str(tmp_path / "m.safetensors"),
            str(tmp_path / "m.tensors"))
    assert p.returncode == 0, p.stderr
    result = json.loads(p.stdout)
    assert result["tensors"] == 2 and result["encrypted"] is True
    assert result["dst_format"] == "tensorizer" and "k" in result["notes"][0]
    assert key.stat().st_size == 32  # a new random key was written there

    p = cli("--keyfile", str(key), str(tmp_path / "m.tensors"), str(tmp_path / "out") + "/")
    assert p.returncode == 1 and "destination directory does not exist" in p.stderr
    (tmp_path / "out").mkdir()
    p = cli("--keyfile", str(key), str(tmp_path / "m.tensors"), str(tmp_path / "out") + "/")
    assert p.returncode == 0, p.stderr
    assert "tensorizer -> safetensors, 2 tensors" in p.stdout
    assert same(st_torch.load_file(str(tmp_path / "out" / "m.safetensors")), WANT)

    p = cli("--keyfile", str(key), str(tmp_path / "m.tensors"), str(tmp_path / "out") + "/")
    assert p.returncode == 1 and "exists; pass --overwrite" in p.stderr
    assert "Traceback" not in p.stderr
    p = cli("--overwrite", "--no-fsync", "-q", "--keyfile", str(key), str(tmp_path / "m.tensors"),
            str(tmp_path / "out") + "/")
    assert p.returncode == 0 and p.stdout == "" and p.stderr == ""

    p = cli(str(tmp_path / "m.tensors"), str(tmp_path / "nokey.safetensors"))
    assert p.returncode == 1 and "is encrypted and no key was given: pass --keyfile URI or " \
        "--passphrase-env NAME" in p.stderr, p.stderr
    assert not (tmp_path / "nokey.safetensors").exists()


def test_passphrase_from_the_environment_is_never_printed(tmp_path: Path) -> None:
    st_torch.save_file(WANT, str(tmp_path / "m.safetensors"))
    secret = "sk-canary-convert-never-print"
    env = {"MODEL_PASS": secret}
    p = cli("--passphrase-env", "MODEL_PASS", str(tmp_path / "m.safetensors"),
            str(tmp_path / "m.tensors"), env=env)
    assert p.returncode == 0, p.stderr
    p = cli("--debug", "--passphrase-env", "MODEL_PASS", str(tmp_path / "m.tensors"),
            str(tmp_path / "m2.safetensors"), env={"MODEL_PASS": "wrong"})
    assert p.returncode == 1 and "could not decrypt" in p.stderr
    p = cli("--passphrase-env", "MODEL_PASS", str(tmp_path / "m.tensors"),
            str(tmp_path / "m2.safetensors"), env=env)
    assert p.returncode == 0 and secret not in p.stdout + p.stderr
    assert same(st_torch.load_file(str(tmp_path / "m2.safetensors")), WANT)
    p = cli("--passphrase-env", "UNSET_VAR_X", str(tmp_path / "m.tensors"),
            str(tmp_path / "m3.safetensors"))
    assert p.returncode == 2 and "UNSET_VAR_X" in p.stderr


def _package_root() -> str:
    """The folder holding the tensorstream under test (a relative PYTHONPATH breaks in cwd=)."""
    import tensorstream

    return os.path.dirname(os.path.dirname(os.path.abspath(tensorstream.__file__)))


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    st_torch.save_file(WANT, str(tmp_path / "m.safetensors"))
    p = cli(str(tmp_path / "m.safetensors"), str(tmp_path / "same.safetensors"))
    assert p.returncode == 2 and "tensorstream cp" in p.stderr
    p = cli("--keyfile", "k", "--passphrase-env", "X", "a", "b")
    assert p.returncode == 2 and "not allowed with" in p.stderr
    p = cli(str(tmp_path / "m.safetensors"))
    assert p.returncode == 2
    # "-" is stdin/stdout for cp; convert wrote a file named "-" in the current directory
    for argv in ((str(tmp_path / "m.safetensors"), "-"), ("-", str(tmp_path / "x.tensors"))):
        p = subprocess.run([sys.executable, "-m", "tensorstream", "convert", *argv],
                           capture_output=True, text=True, timeout=120, cwd=tmp_path,
                           env={**os.environ, "PYTHONPATH": _package_root()})
        assert p.returncode == 2 and "not stdin or stdout" in p.stderr, p.stderr
    assert sorted(os.listdir(tmp_path)) == ["m.safetensors"]


def test_s3_to_s3_with_storage_flags(moto_s3: Any, isolated_env: Path, tmp_path: Path) -> None:
    prefix = "cli-convert/"
    moto_s3.put(S3_BUCKET, prefix + "m.safetensors", st_torch.save(WANT))
    opts = moto_s3.options()
    env = {"AWS_ACCESS_KEY_ID": opts["s3_access_key_id"],
           "AWS_SECRET_ACCESS_KEY": opts["s3_secret_access_key"]}
    p = cli("--endpoint-url", opts["s3_endpoint"], "--region", opts["s3_region"], "--json",
            f"s3://{S3_BUCKET}/{prefix}m.safetensors", f"s3://{S3_BUCKET}/{prefix}", env=env)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["dst"] == f"s3://{S3_BUCKET}/{prefix}m.tensors"
    assert opts["s3_secret_access_key"] not in p.stdout + p.stderr
    import io

    from tensorizer import TensorDeserializer

    blob = moto_s3.get(S3_BUCKET, prefix + "m.tensors")
    with TensorDeserializer(io.BytesIO(blob), device="cpu") as d:
        assert same({k: d[k].detach() for k in d.keys()}, WANT)  # noqa: SIM118


def test_progress_bar_on_a_terminal_only(tmp_path: Path) -> None:
    st_torch.save_file(WANT, str(tmp_path / "m.safetensors"))
    proc, master = spawn_on_terminal(["convert", str(tmp_path / "m.safetensors"),
                                      str(tmp_path / "m.tensors")], columns=100)
    shown = read_to_end(master)
    assert proc.wait(timeout=120) == 0
    assert "m.tensors: 100%" in shown.decode(errors="replace")
    p = cli(str(tmp_path / "m.safetensors"), str(tmp_path / "m2.tensors"))  # stderr a pipe
    assert p.returncode == 0 and "%" not in p.stderr


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
@pytest.mark.parametrize("remote", [False, True])
def test_a_signal_mid_conversion_leaves_nothing(
        tmp_path: Path, http_server: Any, http_reset: None, moto_s3: Any, isolated_env: Path,
        sig: signal.Signals, remote: bool) -> None:
    """SIGTERM (what `kill`, systemd and Kubernetes send) ended the process at once: the
    temporary file beside a local destination, the local copy in TMPDIR and the open S3
    multipart upload of a remote one stayed behind, and the status was -15. It is now
    cleaned up as Ctrl-C is, and the status is 128 + the signal; SIGHUP (the terminal
    or SSH session closed) too."""
    key = f"slow-convert/{sig.name}-{remote}.safetensors"
    http_server.put(key, st_torch.save({f"w{i}": torch.randn(64, 1024) for i in range(8)}))
    http_server.faults.key = key
    http_server.faults.rate_limit = 256 << 10  # 2 MiB: ~8 s
    tmp = tmp_path / "tmpdir"
    out = tmp_path / "out"
    tmp.mkdir()
    out.mkdir()
    opts = moto_s3.options()
    dst = f"s3://{S3_BUCKET}/cli-signal/{sig.name}.tensors" if remote else str(out / "m.tensors")
    started = (lambda: any(tmp.iterdir())) if remote else (lambda: any(out.iterdir()))
    env = {**os.environ, "TMPDIR": str(tmp), "AWS_ACCESS_KEY_ID": opts["s3_access_key_id"],
           "AWS_SECRET_ACCESS_KEY": opts["s3_secret_access_key"]}
    proc = subprocess.Popen([sys.executable, "-m", "tensorstream", "convert", "--endpoint-url",
                             opts["s3_endpoint"], http_server.url(key), dst],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=signals_as_from_a_terminal)
    deadline = time.monotonic() + 60
    while not started():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    time.sleep(0.3)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, err
    assert f"interrupted by {sig.name}" in err and "Traceback" not in err
    assert list(out.iterdir()) == [] and list(tmp.iterdir()) == []
    if remote:
        assert not moto_s3.exists(S3_BUCKET, f"cli-signal/{sig.name}.tensors")
        assert moto_s3.open_multipart_uploads(S3_BUCKET, "cli-signal/") == []


def test_a_damaged_source_fails_and_writes_nothing_unless_no_verify_hash(tmp_path: Path) -> None:
    want = {"a": torch.arange(4096, dtype=torch.float32)}
    st_torch.save_file(want, str(tmp_path / "m.safetensors"))
    assert cli("-q", str(tmp_path / "m.safetensors"), str(tmp_path / "m.tensors")).returncode == 0
    blob = bytearray((tmp_path / "m.tensors").read_bytes())
    blob[blob.find(want["a"].numpy().tobytes()) + 100] ^= 0x01
    (tmp_path / "bad.tensors").write_bytes(bytes(blob))
    p = cli(str(tmp_path / "bad.tensors"), str(tmp_path / "out.safetensors"))
    assert p.returncode == 1 and "verify_hash failed" in p.stderr and "'a'" in p.stderr, p.stderr
    assert "--no-verify-hash converts it" in p.stderr
    assert "Traceback" not in p.stderr and not (tmp_path / "out.safetensors").exists()
    p = cli("--no-verify-hash", str(tmp_path / "bad.tensors"), str(tmp_path / "out.safetensors"))
    assert p.returncode == 0, p.stderr  # the damage converted, as asked
    assert not same(st_torch.load_file(str(tmp_path / "out.safetensors")), want)
    p = cli(str(tmp_path / "m.tensors"), str(tmp_path / "ok.safetensors"))
    assert p.returncode == 0, p.stderr
    assert same(st_torch.load_file(str(tmp_path / "ok.safetensors")), want)
