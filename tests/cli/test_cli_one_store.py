"""``tensorstream sync --delete``/``cp`` where both sides name one store under two
names (``127.0.0.1`` and ``localhost``, a host in capitals, a trailing dot, the default
port written out): the real CLI in a subprocess against moto, redis-server and local
directories. Taken for two stores, ``sync --delete`` of a prefix into the prefix above
it deleted its own source."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from cli_env import cli, s3_env

S3_BUCKET = "tensorstream-tests"


def s3_aliases(url: str) -> list[str]:
    """Other names of the endpoint ``http://127.0.0.1:PORT``."""
    port = url.rpartition(":")[2]
    return [f"http://localhost:{port}", f"HTTP://LOCALHOST:{port}/", f"http://localhost.:{port}",
            f"http://127.0.0.1:{port}/", f"http://[::ffff:127.0.0.1]:{port}"]


@pytest.mark.parametrize("alias", range(5))
def test_sync_delete_through_another_name_of_the_s3_endpoint_keeps_the_source(
        tmp_path: Path, moto_s3: Any, alias: int) -> None:
    """``--dst-endpoint-url http://localhost:P`` with the source on ``http://127.0.0.1:P``
    (one moto server): ``sync --delete s3://b/p/sub/ s3://b/p/`` deleted the source."""
    env = s3_env(moto_s3, tmp_path)
    base = f"s3alias{alias}"
    for key in (f"{base}/p/sub/a", f"{base}/p/b"):
        moto_s3.put(S3_BUCKET, key, b"x")
    r = cli("--endpoint-url", moto_s3.endpoint_url, "sync", "--delete",
            "--dst-endpoint-url", s3_aliases(moto_s3.endpoint_url)[alias],
            f"s3://{S3_BUCKET}/{base}/p/sub/", f"s3://{S3_BUCKET}/{base}/p/", env=env)
    assert r.returncode == 2, r.stderr
    assert "it would delete the source itself" in r.stderr and r.stdout == ""
    assert moto_s3.get(S3_BUCKET, f"{base}/p/sub/a") == b"x"
    assert moto_s3.get(S3_BUCKET, f"{base}/p/b") == b"x"


def test_cp_of_an_s3_object_onto_itself_through_another_name_is_refused(
        tmp_path: Path, moto_s3: Any) -> None:
    """``cp s3://b/k s3://b/k`` with ``--dst-endpoint-url http://localhost:P`` rewrote the
    object from itself; now it is refused as the same object, as without the flag."""
    env = s3_env(moto_s3, tmp_path)
    moto_s3.put(S3_BUCKET, "s3self/x.bin", b"original")
    before = moto_s3.client.head_object(Bucket=S3_BUCKET, Key="s3self/x.bin")
    uri = f"s3://{S3_BUCKET}/s3self/x.bin"
    r = cli("--endpoint-url", moto_s3.endpoint_url, "cp", "--dst-endpoint-url",
            s3_aliases(moto_s3.endpoint_url)[0], uri, uri, env=env)
    assert r.returncode == 1 and "same object" in r.stderr, r.stderr
    after = moto_s3.client.head_object(Bucket=S3_BUCKET, Key="s3self/x.bin")
    assert after["LastModified"] == before["LastModified"]
    assert moto_s3.get(S3_BUCKET, "s3self/x.bin") == b"original"


def test_localhost_of_another_s3_server_is_another_store(tmp_path: Path, moto_s3: Any) -> None:
    """The neighbour: ``localhost`` on another port is another server; the sync runs and
    deletes only the destination's extraneous objects."""
    from tensorstream.testing.s3_server import MotoS3Server

    with MotoS3Server(auth=False) as other:
        other.create_bucket(S3_BUCKET)
        env = s3_env(moto_s3, tmp_path)
        moto_s3.put(S3_BUCKET, "two/p/sub/m.bin", b"weights")
        other.put(S3_BUCKET, "two/p/stale.bin", b"old")
        port = other.endpoint_url.rpartition(":")[2]
        r = cli("--endpoint-url", moto_s3.endpoint_url, "sync", "--delete",
                "--dst-endpoint-url", f"http://localhost:{port}",
                f"s3://{S3_BUCKET}/two/p/sub/", f"s3://{S3_BUCKET}/two/p/", env=env)
        assert r.returncode == 0, r.stderr
        assert other.get(S3_BUCKET, "two/p/m.bin") == b"weights"
        assert not other.exists(S3_BUCKET, "two/p/stale.bin")
        assert moto_s3.get(S3_BUCKET, "two/p/sub/m.bin") == b"weights"


def redis_aliases(server: Any, key: str) -> list[str]:
    return [f"redis://localhost:{server.port}/{key}", f"redis://LOCALHOST.:{server.port}/{key}",
            f"redis://[::ffff:127.0.0.1]:{server.port}/{key}?db=0"]


@pytest.mark.parametrize("alias", range(3))
def test_sync_delete_through_another_name_of_the_redis_server_keeps_the_source(
        redis_server: Any, alias: int) -> None:
    """``sync --delete redis://127.0.0.1:P/k/sub/ redis://localhost:P/k/`` deleted the
    source (one server under two names was taken for two)."""
    key = f"ralias{alias}-{os.getpid()}"
    with redis_server.client() as c:
        c.set(f"{key}/sub/a", b"x")
        c.set(f"{key}/b", b"y")
    r = cli("sync", "--delete", redis_server.url(f"{key}/sub/"),
            redis_aliases(redis_server, f"{key}/")[alias])
    assert r.returncode == 2, r.stderr
    assert "it would delete the source itself" in r.stderr
    with redis_server.client() as c:
        assert c.get(f"{key}/sub/a") == b"x" and c.get(f"{key}/b") == b"y"


def test_redis_key_onto_itself_through_another_name_is_refused(redis_server: Any) -> None:
    key = f"rself-{os.getpid()}/m.bin"
    with redis_server.client() as c:
        c.set(key, b"weights")
    r = cli("cp", redis_server.url(key), f"redis://localhost:{redis_server.port}/{key}")
    assert r.returncode == 1 and "same object" in r.stderr, r.stderr
    with redis_server.client() as c:
        assert c.get(key) == b"weights"


def test_another_database_of_the_redis_server_under_another_name_is_another_store(
        redis_server: Any) -> None:
    """The neighbour: ``localhost`` with ``?db=2`` is another database: the sync runs."""
    key = f"rdb-{os.getpid()}"
    with redis_server.client() as c:
        c.set(f"{key}/sub/a", b"x")
    with redis_server.client(db=2) as c:
        c.set(f"{key}/stale", b"old")
    r = cli("sync", "--delete", redis_server.url(f"{key}/sub/"),
            f"redis://localhost:{redis_server.port}/{key}/?db=2")
    assert r.returncode == 0, r.stderr
    r = cli("cat", redis_server.url(f"{key}/a", db=2))
    assert r.returncode == 0 and r.stdout == "x", r.stderr
    with redis_server.client(db=2) as c:
        assert not c.exists(f"{key}/stale")
    with redis_server.client() as c:
        assert c.get(f"{key}/sub/a") == b"x"


@pytest.mark.parametrize("via", ["src", "dst"])
def test_sync_delete_through_a_symlinked_directory_keeps_the_source(
        tmp_path: Path, via: str) -> None:
    """A local directory reached through a symlink on one side is still the directory."""
    real = tmp_path / "real"
    (real / "sub").mkdir(parents=True)
    (real / "sub" / "a").write_bytes(b"x")
    (real / "b").write_bytes(b"y")
    (tmp_path / "link").symlink_to(real, target_is_directory=True)
    src = tmp_path / ("link" if via == "src" else "real") / "sub"
    dst = tmp_path / ("real" if via == "src" else "link")
    r = cli("sync", "--delete", f"{src}/", f"{dst}/")
    assert r.returncode == 2, r.stderr
    assert "it would delete the source itself" in r.stderr
    assert (real / "sub" / "a").read_bytes() == b"x" and (real / "b").read_bytes() == b"y"
