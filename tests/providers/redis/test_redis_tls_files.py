"""A CA bundle a ``rediss://`` client cannot load: said at once, naming the file, as on
HTTP(S) and S3 (redis-py loads it on each connect, and its error was retried)."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import tensorstream
from tensorstream import errors
from tensorstream.providers.redis.provider import RedisProvider
from tensorstream.testing.redis_server import RedisCluster, RedisServer


def _not_pem(tmp_path: Path) -> Path:
    bundle = tmp_path / "bundle.crt"
    bundle.write_text("not a certificate\n")
    return bundle


def test_a_ca_bundle_that_is_not_pem_is_said_at_once(redis_tls_server: RedisServer,
                                                     tmp_path: Path) -> None:
    """It was "gave up after 3 attempts: ... [X509: NO_CERTIFICATE_OR_CRL_FOUND]"."""
    srv = redis_tls_server
    srv.put("tls-files/k", b"over TLS")
    bundle = _not_pem(tmp_path)
    t0 = time.monotonic()
    with pytest.raises(errors.ConfigurationError, match="cannot load the CA bundle") as info:
        tensorstream.open(srv.url("tls-files/k"), ca_bundle=str(bundle), retries=3).close()
    assert str(bundle) in str(info.value) and "PEM" in str(info.value)
    assert time.monotonic() - t0 < 2  # not retried
    with pytest.raises(errors.ConfigurationError, match="cannot load the CA bundle"):
        _loop_read(srv.url("tls-files/k"), ca_bundle=str(bundle))
    # the good bundle still reads (the refusal is about the file, not the server)
    with tensorstream.open(srv.url("tls-files/k"), ca_bundle=srv.ca_file) as f:
        assert f.read() == b"over TLS"


def _loop_read(uri: str, **options: object) -> bytes:
    """The asyncio front door (its own clients)."""
    return asyncio.run(tensorstream.read_range(uri, 0, 4, retries=3, **options))


def test_a_provider_made_with_a_missing_or_bad_ca_bundle_is_refused(tmp_path: Path) -> None:
    """Made directly (no option checks on the way), a missing file was found only on
    connecting; neither is looked at for redis:// (no TLS)."""
    for ca in (tmp_path / "missing.pem", _not_pem(tmp_path)):
        with pytest.raises(errors.ConfigurationError, match=re.escape(f"cannot load the CA bundle {ca}")):
            RedisProvider("127.0.0.1", 6379, tls=True, ca_bundle=str(ca))
        RedisProvider("127.0.0.1", 6379, tls=False, ca_bundle=str(ca))


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_a_ca_directory_is_trusted(redis_tls_server: RedisServer, tmp_path: Path) -> None:
    """HTTP(S) and S3 take a directory hashed by 'openssl rehash' (as requests' verify=
    does); Redis retried "Error 21 ... Is a directory". (A cluster: below.)"""
    srv = redis_tls_server
    srv.put("tls-files/dir", b"trusted by a directory")
    certs = tmp_path / "certs"
    certs.mkdir()
    shutil.copy(srv.ca_file, certs / "ca.pem")
    subprocess.run(["openssl", "rehash", str(certs)], check=True, capture_output=True)
    with tensorstream.open(srv.url("tls-files/dir"), ca_bundle=str(certs)) as f:
        assert f.read() == b"trusted by a directory"
    assert _loop_read(srv.url("tls-files/dir"), ca_bundle=str(certs)) == b"trus"
    # an empty directory trusts nothing: the server's certificate is refused, not retried
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(errors.ConnectionFailedError) as info:
        tensorstream.open(srv.url("tls-files/dir"), ca_bundle=str(empty), retries=3)
    assert not info.value.temporary


@pytest.fixture(scope="module")
def redis_tls_cluster(redis_tmp: str) -> Iterator[RedisCluster]:
    """A real 3-primary Redis Cluster serving TLS only (its bus too)."""
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        pytest.skip("redis-server/redis-cli not installed (apt-get install redis-server)")
    with RedisCluster(3, tmp_dir=redis_tmp, tls=True) as cluster:
        yield cluster


def _rehashed(ca_file: str, where: Path) -> Path:
    where.mkdir()
    shutil.copy(ca_file, where / "ca.pem")
    subprocess.run(["openssl", "rehash", str(where)], check=True, capture_output=True)
    return where


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_a_ca_directory_is_trusted_by_a_cluster_too(redis_tls_cluster: RedisCluster,
                                                    tmp_path: Path) -> None:
    """``rediss://...?cluster=true`` with ``ca_bundle=<a directory>`` was refused ("redis-py's
    cluster client takes only a PEM file": its asyncio client has no ``ssl_ca_path``). The
    directory's certificates (the names 'openssl rehash' gives them, as OpenSSL looks
    them up) are trusted as the certificates' data now, as a single server trusts the
    directory; a PEM file still works, and a directory without such a name, or another
    CA's, trusts nothing."""
    assert redis_tls_cluster.ca_file is not None
    keys = [f"tls-dir/{n}" for n in ("a", "b", "c", "d")]  # over several hash slots
    for k in keys:
        redis_tls_cluster.put(k, k.encode() * 3)
    certs = _rehashed(redis_tls_cluster.ca_file, tmp_path / "certs")
    for ca in (str(certs), redis_tls_cluster.ca_file):
        for k in keys:
            with tensorstream.open(redis_tls_cluster.url(k), ca_bundle=ca) as f:
                assert f.read() == k.encode() * 3
    unhashed = tmp_path / "unhashed"
    unhashed.mkdir()
    shutil.copy(redis_tls_cluster.ca_file, unhashed / "ca.pem")  # no 'openssl rehash'
    with pytest.raises(errors.ConfigurationError, match=r"unhashed.*openssl rehash"):
        tensorstream.open(redis_tls_cluster.url(keys[0]), ca_bundle=str(unhashed))
    trustme = pytest.importorskip("trustme")
    other = tmp_path / "other.pem"
    trustme.CA().cert_pem.write_to_path(str(other))
    elsewhere = _rehashed(str(other), tmp_path / "elsewhere")
    with pytest.raises(errors.ConnectionFailedError) as info:
        tensorstream.open(redis_tls_cluster.url(keys[0]), ca_bundle=str(elsewhere), retries=2)
    assert not info.value.temporary
