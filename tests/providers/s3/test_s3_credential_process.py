"""A profile's ``credential_process`` that never exits: botocore waits for it forever
(``communicate()`` without a timeout), so a load, a listing or ``describe_credentials``
hung. Now it is stopped after ``s3_credential_process_timeout`` seconds (default 60, the
AWS SDK for Go v2's), the process is killed, and the error names the profile, the file
and the setting, never what the process printed."""

from __future__ import annotations

import contextlib
import os
import pty
import select
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from s3_credential_sources import everything_said

import tensorstream
from fixtures_s3 import S3_BUCKET
from tensorstream import errors
from tensorstream.testing.s3_server import MotoS3Server

CANARY = "canary-PROCESS-secret-0123456789"
LIMIT = 1.0


def _hanging_process(tmp_path: Path, config: Path, *, use_exec: bool) -> Path:
    """A credential_process that prints half its JSON (with a secret), records its pid,
    then waits forever (``exec``: as itself; else in a grandchild holding its pipes)."""
    pids = tmp_path / "pids"
    script = tmp_path / "credentials.sh"
    # the grandchild's pid goes to another file: the test ends it (it is not tensorstream's)
    wait = "exec sleep 600" if use_exec else f"sleep 600 &\necho $! >> {pids}.grandchild\nwait"
    script.write_text(f"#!/bin/sh\necho $$ >> {pids}\n"
                      f"echo '{{\"Version\": 1, \"SecretAccessKey\": \"{CANARY}\",'\n{wait}\n")
    script.chmod(0o755)
    config.write_text(f"[profile slow]\ncredential_process = {script}\n")
    return pids


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture
def grandchildren(tmp_path: Path) -> Iterator[None]:
    """Ends the scripts' own children (tensorstream kills the process it started)."""
    yield
    found = tmp_path / "pids.grandchild"
    for pid in found.read_text().split() if found.exists() else ():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)


@pytest.fixture
def aws_config(isolated_env: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = isolated_env / "aws-config"
    monkeypatch.setenv("AWS_CONFIG_FILE", str(path))
    return path


def _paths(moto_s3: MotoS3Server) -> dict[str, Callable[[], Awaitable[Any]]]:
    uri = f"s3://{S3_BUCKET}/key"
    opts = {"s3_endpoint": moto_s3.endpoint_url, "s3_profile": "slow", "retries": 3,
            "s3_credential_process_timeout": LIMIT}

    async def stat() -> Any:  # the blocking data plane's signing client
        return await tensorstream.stat(uri, **opts)

    async def listing() -> Any:  # aiobotocore's client
        async with tensorstream.get_provider(uri, **opts) as provider:
            return [_ async for _ in provider.list(S3_BUCKET + "/")]

    async def describe() -> Any:  # botocore's chain, run synchronously
        return tensorstream.describe_credentials(uri, **opts)

    def read() -> Any:
        with tensorstream.open(uri, **opts) as f:
            return f.read()

    async def sync_open() -> Any:
        return read()

    return {"stat": stat, "list": listing, "describe": describe, "open": sync_open}


@pytest.mark.parametrize("path", ["stat", "list", "describe", "open"])
@pytest.mark.parametrize("use_exec", [True, False], ids=["exec", "grandchild"])
async def test_a_credential_process_that_never_exits_is_stopped_and_named(
        grandchildren: None, aws_config: Path, moto_s3: MotoS3Server, tmp_path: Path, path: str,
        use_exec: bool) -> None:
    pids = _hanging_process(tmp_path, aws_config, use_exec=use_exec)
    started = time.monotonic()
    with pytest.raises(TimeoutError) as info:
        await _paths(moto_s3)[path]()
    elapsed = time.monotonic() - started
    assert isinstance(info.value, errors.StorageTimeoutError)
    message = str(info.value)
    for said in ("profile 'slow'", str(aws_config), "credential_process",
                 "s3_credential_process_timeout", "1 s"):
        assert said in message, said
    assert CANARY not in everything_said(info.value)
    # run once (not retried as a temporary error), and killed
    started_pids = [int(p) for p in pids.read_text().split()]
    assert len(started_pids) == 1 and elapsed < 10 * LIMIT, (started_pids, elapsed)
    assert _gone(started_pids[0])
    if not use_exec and not _has_terminal():  # (with one, the process stays in its group)
        # the script's own child (a sleep: the program a wrapper script runs) was left
        # running, holding the pipes, for as long as it liked
        grandchild = int((tmp_path / "pids.grandchild").read_text())
        assert _dead_soon(grandchild), f"the credential_process's child {grandchild} still runs"


def _dead_soon(pid: int, within: float = 5.0) -> bool:
    """Gone, or a zombie (killed; its reaping is up to whoever adopted it)."""
    deadline = time.monotonic() + within
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except FileNotFoundError:
            state = "gone" if _gone(pid) else "?"
        if state in ("gone", "Z", "X"):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def test_the_timeout_option_is_validated(aws_config: Path) -> None:
    with pytest.raises(errors.ConfigurationError, match="s3_credential_process_timeout"):
        tensorstream.open(f"s3://{S3_BUCKET}/k", s3_credential_process_timeout=0)


@pytest.mark.parametrize("path", ["stat", "list", "describe"])
async def test_a_source_profiles_credential_process_that_never_exits_is_stopped_too(
        aws_config: Path, moto_s3: MotoS3Server, tmp_path: Path, path: str) -> None:
    # A role profile whose keys come from its source_profile's credential_process (the
    # usual SSO/vault setup): botocore's role provider builds that process provider
    # itself, and it waited for the process forever.
    pids = tmp_path / "pids"
    script = tmp_path / "credentials.sh"
    script.write_text(f"#!/bin/sh\necho $$ >> {pids}\n"
                      f"echo '{{\"Version\": 1, \"SecretAccessKey\": \"{CANARY}\",'\n"
                      "exec sleep 30\n")
    script.chmod(0o755)
    aws_config.write_text("[profile slow]\nrole_arn = arn:aws:iam::123456789012:role/reader\n"
                          "source_profile = base\n"
                          f"[profile base]\ncredential_process = {script}\n")
    started = time.monotonic()
    with pytest.raises(TimeoutError) as info:
        await _paths(moto_s3)[path]()
    elapsed = time.monotonic() - started
    message = str(info.value)
    for said in ("profile 'base'", str(aws_config), "credential_process",
                 "s3_credential_process_timeout"):
        assert said in message, (said, message)
    assert CANARY not in everything_said(info.value)
    started_pids = [int(p) for p in pids.read_text().split()]
    assert len(started_pids) == 1 and elapsed < 10 * LIMIT, (started_pids, elapsed)
    assert _gone(started_pids[0])


@pytest.mark.parametrize("command", ["credentials", "ls", "cat"])
def test_the_cli_takes_the_credential_process_timeout(
        aws_config: Path, moto_s3: MotoS3Server, tmp_path: Path, command: str) -> None:
    """s3_credential_process_timeout had no flag: a CLI user waited the default minute,
    and the error told them of an option the CLI did not take. The flag bounds it on
    every command, and the error names it."""
    import subprocess
    import sys

    pids = _hanging_process(tmp_path, aws_config, use_exec=True)
    target = f"s3://{S3_BUCKET}/" + ("" if command == "ls" else "key")
    started = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "tensorstream", command, "--s3-credential-process-timeout", "1",
         "--profile", "slow", "--endpoint-url", moto_s3.endpoint_url, target],
        capture_output=True, text=True, timeout=60, env={**os.environ,
                                                          "AWS_CONFIG_FILE": str(aws_config)})
    elapsed = time.monotonic() - started
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "did not finish within 1 s" in r.stderr, r.stderr
    assert "--s3-credential-process-timeout SECONDS" in r.stderr, r.stderr
    assert "s3_credential_process_timeout" not in r.stderr and CANARY not in r.stderr
    assert elapsed < 30, elapsed
    assert all(_gone(int(p)) for p in pids.read_text().split())


def _has_terminal() -> bool:
    try:
        os.close(os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY))
    except OSError:
        return False
    return True


def _in_a_terminal(argv: list[str], env: dict[str, str], answer: bytes,
                   within: float = 30.0) -> tuple[int, str]:
    """``argv`` run with a pseudo-terminal as its controlling terminal (as from a shell),
    typing ``answer`` at the first ``code:`` prompt; its exit status and what it showed."""
    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - the child
        os.execve(argv[0], argv, env)
    shown, typed, deadline = b"", False, time.monotonic() + within
    try:
        while time.monotonic() < deadline:
            if not select.select([fd], [], [], 0.2)[0]:
                continue
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            shown += chunk
            if not typed and b"code:" in shown:
                os.write(fd, answer)
                typed = True
    finally:
        os.close(fd)
        if time.monotonic() >= deadline:
            os.kill(pid, signal.SIGKILL)
        status = os.waitpid(pid, 0)[1]
    return os.waitstatus_to_exitcode(status), shown.decode(errors="replace")


#: A credential_process asking for an MFA code on the terminal.
_MFA_PROMPT = """#!/bin/sh
printf 'MFA code: ' > /dev/tty || exit 3
read code < /dev/tty
printf '{"Version": 1, "AccessKeyId": "AKIA%s", "SecretAccessKey": "s"}' "$code"
"""


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="no pseudo-terminals here")
def test_a_credential_process_prompting_on_the_terminal_gets_its_answer(
        aws_config: Path, tmp_path: Path) -> None:
    """An MFA prompt of the credential_process on /dev/tty (Python's getpass, `read <
    /dev/tty`): botocore's run has the terminal, tensorstream's ran the process in a
    session of its own, where /dev/tty does not open, and every credential failed."""
    script = tmp_path / "mfa.sh"
    script.write_text(_MFA_PROMPT)
    script.chmod(0o755)
    aws_config.write_text(f"[profile mfa]\ncredential_process = {script}\n")
    env = {**os.environ, "AWS_CONFIG_FILE": str(aws_config)}
    code, shown = _in_a_terminal(
        [sys.executable, "-m", "tensorstream", "credentials", "--profile", "mfa",
         "--endpoint-url", "http://127.0.0.1:9", f"s3://{S3_BUCKET}/key"], env, b"424242\n")
    assert code == 0, shown
    assert "MFA code: 424242" in shown, shown
    assert "credential_process (botocore custom-process)" in shown, shown


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="no pseudo-terminals here")
def test_a_credential_process_under_a_terminal_is_still_stopped_at_its_timeout(
        aws_config: Path, tmp_path: Path) -> None:
    pids = _hanging_process(tmp_path, aws_config, use_exec=True)
    env = {**os.environ, "AWS_CONFIG_FILE": str(aws_config)}
    started = time.monotonic()
    code, shown = _in_a_terminal(
        [sys.executable, "-m", "tensorstream", "credentials", "--profile", "slow",
         "--s3-credential-process-timeout", "1", "--endpoint-url", "http://127.0.0.1:9",
         f"s3://{S3_BUCKET}/key"], env, b"")
    assert code == 1 and "did not finish within 1 s" in shown, (code, shown)
    assert time.monotonic() - started < 20
    assert all(_gone(int(p)) for p in pids.read_text().split())


_FORK_WHILE_RUNNING = """\
import os, sys, threading, time
import tensorstream

def describe():
    try:
        tensorstream.describe_credentials(URI, s3_profile="slow",
                                          s3_credential_process_timeout=4)
    except Exception as exc:
        print("describe:", type(exc).__name__, flush=True)

t = threading.Thread(target=describe)
t.start()
while not (os.path.exists(PIDS) and open(PIDS).read().strip()):
    time.sleep(0.02)
pid = int(open(PIDS).read().split()[0])
child = os.fork()
if child == 0:
    sys.exit(0)  # an ordinary exit: its atexit handlers run
os.waitpid(child, 0)
time.sleep(0.3)
try:
    state = open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()[0]
except FileNotFoundError:  # killed, and reaped by the thread waiting for it
    state = "X"
print("after the fork's exit:", "gone" if state in "ZX" else "running", flush=True)
t.join()
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_child_exiting_leaves_the_parents_credential_process_alone(
        aws_config: Path, tmp_path: Path) -> None:
    """A child forked while a thread waits for a credential_process (a DataLoader or
    multiprocessing worker, a daemon's fork) and exiting normally ran the atexit hook it
    inherited and killed its parent's process: the parent's load failed at once."""
    import subprocess

    pids = _hanging_process(tmp_path, aws_config, use_exec=True)
    script = f"URI = {f's3://{S3_BUCKET}/key'!r}\nPIDS = {str(pids)!r}\n" + _FORK_WHILE_RUNNING
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "AWS_CONFIG_FILE": str(aws_config)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["after the fork's exit: running",
                                     "describe: StorageTimeoutError"], r.stdout
    assert all(_gone(int(p)) for p in pids.read_text().split())


def _counting_process(tmp_path: Path, config: Path, moto_s3: MotoS3Server,
                      expiration: str | None) -> Path:
    """A credential_process printing moto's keys (with ``expiration``, if any), one line
    to ``runs`` per run."""
    runs = tmp_path / "runs"
    fields = {"Version": 1, "AccessKeyId": moto_s3.access_key_id,
              "SecretAccessKey": moto_s3.secret_access_key}
    if expiration is not None:
        fields["Expiration"] = expiration
    import json

    script = tmp_path / "counting.sh"
    script.write_text(f"#!/bin/sh\necho run >> {runs}\ncat <<'EOF'\n{json.dumps(fields)}\nEOF\n")
    script.chmod(0o755)
    config.write_text(f"[profile counted]\ncredential_process = {script}\n")
    return runs


def _when(seconds: float) -> str:
    import datetime

    return (datetime.datetime.now(datetime.timezone.utc)
            + datetime.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.mark.parametrize("expiration, runs_expected", [
    (None, 1), ("far", 1), ("soon", "each"),
], ids=["no-expiration", "an-hour-left", "ten-minutes-left"])
async def test_a_credential_process_runs_once_for_every_provider_while_its_keys_are_good(
        aws_config: Path, moto_s3: MotoS3Server, tmp_path: Path, expiration: str | None,
        runs_expected: Any) -> None:
    """Each provider's session (a shard's open, a read's, a listing's) ran the
    credential_process again: an MFA prompt per shard, a vault asked per file. Its output
    is reused while its keys are good; keys botocore would refresh at once are not."""
    when = {None: None, "far": _when(3600), "soon": _when(600)}[expiration]
    runs = _counting_process(tmp_path, aws_config, moto_s3, when)
    moto_s3.client.put_object(Bucket=S3_BUCKET, Key="reuse/a", Body=b"a")
    moto_s3.client.put_object(Bucket=S3_BUCKET, Key="reuse/b", Body=b"b")
    opts = {"s3_endpoint": moto_s3.endpoint_url, "s3_profile": "counted"}
    for key in ("a", "b"):  # two providers, each with its own sessions
        assert await tensorstream.read_range(f"s3://{S3_BUCKET}/reuse/{key}", 0, 1,
                                             **opts) == key.encode()
    async with tensorstream.get_provider(f"s3://{S3_BUCKET}/reuse/", **opts) as provider:
        assert len([_ async for _ in provider.list(f"{S3_BUCKET}/reuse/")]) == 2
    with tensorstream.open(f"s3://{S3_BUCKET}/reuse/a", **opts) as f:
        assert f.read() == b"a"
    ran = len(runs.read_text().split())
    if runs_expected == "each":
        assert ran >= 3, ran
    else:
        assert ran == runs_expected, ran
