"""``tensorstream cp``/``sync`` between two remote stores (S3, Redis, HTTP), as an operator
staging models types them: the real CLI in a subprocess against moto and redis-server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cli_env import cli, s3_env
from fixtures_s3 import S3_BUCKET
from remote_destination import assert_left_as_it_was


def two_profiles(server: Any, tmp_path: Path) -> dict[str, str]:
    """``s3_env`` with a credentials file of two profiles, ``reader`` and ``writer``, that
    both hold ``server``'s keys (a read-only and a read-write key of one account)."""
    env = s3_env(server, tmp_path)
    creds = tmp_path / "aws" / "two-profiles"
    creds.write_text("".join(
        f"[{name}]\naws_access_key_id = {server.access_key_id}\n"
        f"aws_secret_access_key = {server.secret_access_key}\n" for name in ("reader", "writer")))
    env["AWS_SHARED_CREDENTIALS_FILE"] = str(creds)
    return env


#: Side flags that leave both sides on the one endpoint of ``--endpoint-url``.
def one_endpoint_flags(server: Any) -> list[list[str]]:
    return [["--src-region", server.region],
            ["--dst-endpoint-url", server.endpoint_url],
            ["--src-profile", "reader", "--dst-profile", "writer"]]


@pytest.mark.parametrize("flags", range(3))
def test_side_flags_on_one_endpoint_never_sync_delete_the_source(
        tmp_path: Path, moto_s3: Any, flags: int) -> None:
    """``sync --delete s3://b/p/sub/ s3://b/p/`` is refused (it would delete SRC), but
    with a side flag that names no other endpoint (``--src-profile reader --dst-profile
    writer`` on one account, ``--src-region``, ``--dst-endpoint-url`` of the same server)
    the two sides were taken for two stores: the sync ran and deleted the source."""
    env = two_profiles(moto_s3, tmp_path)
    side = one_endpoint_flags(moto_s3)[flags]
    base = f"side{flags}"
    for key in (f"{base}/p/sub/a", f"{base}/p/b"):
        moto_s3.put(S3_BUCKET, key, b"x")
    r = cli("--endpoint-url", moto_s3.endpoint_url, "sync", "--delete", *side,
            f"s3://{S3_BUCKET}/{base}/p/sub/", f"s3://{S3_BUCKET}/{base}/p/", env=env)
    assert r.returncode == 2, r.stderr
    assert "it would delete the source itself" in r.stderr and r.stdout == ""
    assert moto_s3.exists(S3_BUCKET, f"{base}/p/sub/a")
    assert moto_s3.exists(S3_BUCKET, f"{base}/p/b")


@pytest.mark.parametrize("flags", range(3))
def test_side_flags_on_one_endpoint_never_copy_an_object_onto_itself(
        tmp_path: Path, moto_s3: Any, flags: int) -> None:
    """``cp s3://b/k s3://b/k`` is refused as the same object (aws s3 cp refuses it too);
    with a side flag that names no other endpoint it rewrote the object from itself, and
    ``cp -r``/``sync`` of a prefix into a prefix under it went a level deeper each run."""
    env = two_profiles(moto_s3, tmp_path)
    side = one_endpoint_flags(moto_s3)[flags]
    base = f"self{flags}"
    moto_s3.put(S3_BUCKET, f"{base}/x.bin", b"original")
    before = moto_s3.client.head_object(Bucket=S3_BUCKET, Key=f"{base}/x.bin")
    uri = f"s3://{S3_BUCKET}/{base}/x.bin"
    r = cli("--endpoint-url", moto_s3.endpoint_url, "cp", *side, uri, uri, env=env)
    assert r.returncode == 1 and "same object" in r.stderr, r.stderr
    after = moto_s3.client.head_object(Bucket=S3_BUCKET, Key=f"{base}/x.bin")
    assert after["LastModified"] == before["LastModified"]
    r = cli("--endpoint-url", moto_s3.endpoint_url, "sync", *side, f"s3://{S3_BUCKET}/{base}/",
            f"s3://{S3_BUCKET}/{base}/bk/", env=env)
    assert r.returncode == 1 and "cannot copy a prefix into itself" in r.stderr, r.stderr
    assert not moto_s3.exists(S3_BUCKET, f"{base}/bk/x.bin")


def test_one_bucket_name_on_two_endpoints_is_two_places(tmp_path: Path, moto_s3: Any) -> None:
    """The neighbour: the same bucket and key on two servers are two objects; each server
    is given its own key pair (a profile per side) and sees only its own."""
    from tensorstream.testing.s3_server import MotoS3Server

    with MotoS3Server(auth=True) as other:
        other.create_bucket(S3_BUCKET)
        env = s3_env(moto_s3, tmp_path)
        creds = tmp_path / "aws" / "per-endpoint"
        creds.write_text(
            f"[here]\naws_access_key_id = {moto_s3.access_key_id}\n"
            f"aws_secret_access_key = {moto_s3.secret_access_key}\n"
            f"[there]\naws_access_key_id = {other.access_key_id}\n"
            f"aws_secret_access_key = {other.secret_access_key}\n")
        env["AWS_SHARED_CREDENTIALS_FILE"] = str(creds)
        # (each server refuses the other's key: InvalidAccessKeyId)
        data = os.urandom(7 << 20)
        moto_s3.put(S3_BUCKET, "twin/p/sub/m.bin", data)
        moto_s3.put(S3_BUCKET, "twin/p/keep.bin", b"k")
        sides = ["--src-endpoint-url", moto_s3.endpoint_url, "--src-profile", "here",
                 "--dst-endpoint-url", other.endpoint_url, "--dst-profile", "there"]
        uri = f"s3://{S3_BUCKET}/twin/p/sub/m.bin"
        r = cli("cp", *sides, "--part-size", "5M", uri, uri, env=env)
        assert r.returncode == 0, r.stderr
        assert other.get(S3_BUCKET, "twin/p/sub/m.bin") == data
        r = cli("sync", "--delete", *sides, f"s3://{S3_BUCKET}/twin/p/sub/",
                f"s3://{S3_BUCKET}/twin/p/", env=env)
        assert r.returncode == 0, r.stderr
        assert other.get(S3_BUCKET, "twin/p/m.bin") == data
        assert not other.exists(S3_BUCKET, "twin/p/sub/m.bin")  # DST's own, extraneous there
        assert moto_s3.get(S3_BUCKET, "twin/p/sub/m.bin") == data  # the source: untouched
        assert moto_s3.get(S3_BUCKET, "twin/p/keep.bin") == b"k"


@pytest.mark.parametrize("to", ["s3", "redis"])
def test_sigterm_mid_copy_between_remotes_leaves_the_old_object_and_no_upload(
        tmp_path: Path, moto_s3: Any, redis_server: Any, http_server: Any, http_reset: None,
        to: str) -> None:
    """Killed (SIGTERM) once parts of the new object are at the destination (an S3
    multipart upload open, Redis chunks staged), the copy aborts them: the object under the
    final name is still the old one, no upload is left open and no chunk is left behind."""
    import signal
    import time

    from signals import signals_as_from_a_terminal

    env = s3_env(moto_s3, tmp_path)
    key = f"term-{to}/m.bin"
    http_server.put(key, os.urandom(12 << 20))
    http_server.faults.key = key
    http_server.faults.rate_limit = 2 << 20  # 6 s per 12 MiB stream: killed part way
    old = b"the old object"
    if to == "s3":
        moto_s3.put(S3_BUCKET, key, old)
        dst = f"s3://{S3_BUCKET}/{key}"

        def staged() -> bool:
            return bool(moto_s3.open_multipart_uploads(S3_BUCKET, key))
    else:
        redis_server.put(key, old)
        dst = redis_server.url(key)

        def staged() -> bool:
            with redis_server.client() as c:
                return len(c.keys(f"{key}*")) > 1
    proc = subprocess.Popen([sys.executable, "-m", "tensorstream", "--endpoint-url",
                             moto_s3.endpoint_url, "cp", "--part-size", "5M", "--concurrency",
                             "2", http_server.url(key), dst], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=signals_as_from_a_terminal)
    deadline = time.monotonic() + 60
    while not staged():
        assert time.monotonic() < deadline and proc.poll() is None, "nothing was staged"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert "no partial object was left behind" in err
    assert_left_as_it_was(to, key, old, moto_s3, redis_server)


def test_sync_and_cp_into_a_folder_of_another_redis_database(redis_server: Any) -> None:
    """``sync SRC redis://h/b?db=2`` failed before anything was read ("Redis db must be a
    number, got '.../b?db=2/'"): sync made DST a folder by adding '/' after the query.
    ``cp OBJ 'redis://h/d/?db=2'`` wrote the folder's own key ``d/`` (refused: "names a
    folder") instead of ``d/m.bin``: a '/' before the query was not seen."""
    key = f"dbs-{os.getpid()}"
    with redis_server.client(db=1) as c:
        c.set(f"{key}/a/m.bin", b"weights")
    for dst in (f"{key}/b", f"{key}/c/"):
        r = cli("sync", redis_server.url(f"{key}/a/", db=1), redis_server.url(dst, db=2))
        assert r.returncode == 0, r.stderr
        assert "copied 1 file" in r.stderr
        r = cli("sync", redis_server.url(f"{key}/a/", db=1), redis_server.url(dst, db=2))
        assert r.returncode == 0 and "1 already there and unchanged" in r.stderr, r.stderr
    r = cli("cp", redis_server.url(f"{key}/a/m.bin", db=1), redis_server.url(f"{key}/d/", db=2))
    assert r.returncode == 0, r.stderr
    with redis_server.client(db=2) as c:
        assert sorted(k for k in c.keys(f"{key}/*") if b":" not in k) == [
            f"{key}/{d}/m.bin".encode() for d in "bcd"]
    with redis_server.client(db=0) as c:
        assert c.keys(f"{key}/*") == []  # nothing went to database 0


def test_one_endpoint_spelled_two_ways_never_sync_deletes_the_source(
        tmp_path: Path, moto_s3: Any) -> None:
    """Host names are case-insensitive: ``--dst-endpoint-url http://LOCALHOST:port`` is the
    server of ``--endpoint-url http://localhost:port``, but the two spellings were taken for
    two stores and ``sync --delete s3://b/p/sub/ s3://b/p/`` deleted its own source."""
    env = s3_env(moto_s3, tmp_path)
    port = moto_s3.endpoint_url.rsplit(":", 1)[1]
    for key in ("spelled/p/sub/a", "spelled/p/b"):
        moto_s3.put(S3_BUCKET, key, b"x")
    r = cli("--endpoint-url", f"http://localhost:{port}", "sync", "--delete",
            "--dst-endpoint-url", f"http://LOCALHOST:{port}",
            f"s3://{S3_BUCKET}/spelled/p/sub/", f"s3://{S3_BUCKET}/spelled/p/", env=env)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "it would delete the source itself" in r.stderr
    assert moto_s3.exists(S3_BUCKET, "spelled/p/sub/a") and moto_s3.exists(S3_BUCKET, "spelled/p/b")
