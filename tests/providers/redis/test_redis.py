"""Redis provider: conformance (plain, tensorizer layout, TLS, cluster), auth and TLS."""

from __future__ import annotations

import os
import pickle
import warnings

import pytest

import tensorstream
from fixtures_redis import ACL_PASSWORD, ACL_USER, REDIS_PASSWORD
from tensorstream import _loop, errors
from tensorstream.providers.base import Pin
from tensorstream.providers.redis.provider import InsecureTLSWarning
from tensorstream.testing.backends import RedisBackend
from tensorstream.testing.conformance import ConformanceTarget, ProviderConformance
from tensorstream.testing.redis_server import RedisCluster, RedisServer

SMALL_CHUNKS = {"redis_chunk_size": 256 << 10}


class TestRedisConformance(ProviderConformance):
    """Objects stored as plain strings by the server helper; written as manifests."""

    @pytest.fixture
    def target(self, redis_server: RedisServer) -> ConformanceTarget:
        return ConformanceTarget(uri=redis_server.url, put=redis_server.put, options=SMALL_CHUNKS)


class TestRedisManifestConformance(ProviderConformance):
    """Manifest objects (tensorstream's layout) behind the plugin's TCP fault proxy."""

    @pytest.fixture
    def target(self, tensorstream_redis: RedisBackend) -> ConformanceTarget:
        return ConformanceTarget.from_backend(tensorstream_redis, **SMALL_CHUNKS)


class TestRedisTensorizerLayoutConformance(ProviderConformance):
    """Objects stored the way tensorizer's to_redis does (``key:header:0``, ``key:data:N``)."""

    @pytest.fixture
    def target(self, redis_server: RedisServer) -> ConformanceTarget:
        def put(key: str, data: bytes) -> None:
            redis_server.put_tensorizer_layout(key, data, piece=700_001)

        return ConformanceTarget(uri=redis_server.url, put=put, options=SMALL_CHUNKS)


class TestRedisTLSConformance(ProviderConformance):
    @pytest.fixture
    def target(self, redis_tls_server: RedisServer) -> ConformanceTarget:
        return ConformanceTarget(
            uri=redis_tls_server.url,
            put=redis_tls_server.put,
            options={**SMALL_CHUNKS, "ca_bundle": redis_tls_server.ca_file},
        )


class TestRedisClusterConformance(ProviderConformance):
    @pytest.fixture
    def target(self, redis_cluster: RedisCluster) -> ConformanceTarget:
        return ConformanceTarget(uri=redis_cluster.url, put=redis_cluster.put, options=SMALL_CHUNKS)


# -- authentication ------------------------------------------------------------------
def _roundtrip(uri: str, **options: object) -> bytes:
    with tensorstream.open(uri, "wb", **options) as w:
        w.write(b"secret weights")
    with tensorstream.open(uri, **options) as f:
        return f.read()


def test_requirepass_via_uri_option_and_env(
    redis_auth_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    srv = redis_auth_server
    assert _roundtrip(srv.url("auth/uri", password=REDIS_PASSWORD)) == b"secret weights"
    assert _roundtrip(srv.url("auth/opt"), redis_password=REDIS_PASSWORD) == b"secret weights"
    monkeypatch.setenv("REDIS_PASSWORD", REDIS_PASSWORD)
    assert _roundtrip(srv.url("auth/env")) == b"secret weights"


def test_redis_clis_password_variable_comes_after_ours(
    redis_auth_server: RedisServer, monkeypatch: pytest.MonkeyPatch, isolated_env: object
) -> None:
    srv = redis_auth_server
    monkeypatch.setenv("REDISCLI_AUTH", REDIS_PASSWORD)  # what redis-cli users already set
    assert _roundtrip(srv.url("auth/env")) == b"secret weights"
    assert "env REDISCLI_AUTH" in str(tensorstream.describe_credentials(srv.url("auth/env")))
    monkeypatch.setenv("REDIS_PASSWORD", "wrong-env-password")
    with pytest.raises(errors.PermissionDeniedError, match="password from env REDIS_PASSWORD"):
        tensorstream.open(srv.url("auth/env"))


def test_passwords_and_user_names_with_special_characters(isolated_env: object) -> None:
    """Percent-encoded in the URI, or given as options, and never shown. (The test
    server could not start with such a password: its config line split at the space.)"""
    pw, user, user_pw = 'p@ss:w/rd%41#?& "x"\\', "us:er@x/%", "a b#c"
    with RedisServer(password=pw, acl_users={user: user_pw}) as srv:
        assert _roundtrip(srv.url("special/d", password=pw)) == b"secret weights"
        assert _roundtrip(srv.url("special/u", user=user, password=user_pw)) == b"secret weights"
        assert _roundtrip(srv.url("special/o"), redis_username=user,
                          redis_password=user_pw) == b"secret weights"
        with pytest.raises(errors.PermissionDeniedError) as info:
            tensorstream.open(srv.url("special/d", password=pw + "x"))
        shown = str(info.value) + repr(info.value.__cause__)
        assert "w/rd" not in shown and "rd%2541" not in shown


def test_acl_user(redis_auth_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    srv = redis_auth_server
    uri = srv.url("auth/acl", user=ACL_USER, password=ACL_PASSWORD)
    assert _roundtrip(uri) == b"secret weights"
    monkeypatch.setenv("REDIS_USERNAME", ACL_USER)
    monkeypatch.setenv("REDIS_PASSWORD", "wrong-env-password")
    # options > URI > env: the right password in the option wins over the env var
    assert _roundtrip(srv.url("auth/acl2"), redis_password=ACL_PASSWORD) == b"secret weights"


def test_missing_password_is_permission_error(redis_auth_server: RedisServer,
                                              isolated_env: object) -> None:
    with pytest.raises(PermissionError) as info:
        tensorstream.open(redis_auth_server.url("auth/none"))
    assert isinstance(info.value, errors.PermissionDeniedError)
    # It said "... as the default user, no password: NOAUTH ...", not where it looked.
    assert ("no password (looked in: option redis_password, URI userinfo, env REDIS_PASSWORD, "
            "env REDISCLI_AUTH)") in str(info.value)
    # ... and how to give one (it ended with the server's "HELLO must be called with the
    # client already authenticated, otherwise the HELLO AUTH <user> <pass> option ...").
    assert str(info.value).endswith("; give the password in the URI's user info (before the @ "
                                    "of the host), as redis_password= or in REDIS_PASSWORD "
                                    "(tensorstream: --redis-password)")


def test_a_write_without_the_password_warns_of_no_staged_chunks(
        redis_auth_server: RedisServer, isolated_env: object,
        caplog: pytest.LogCaptureFixture) -> None:
    """A write (``cp`` into Redis) with no password printed ``could not remove staged
    chunks of 'k': Redis authentication failed ...`` before its error: the same error
    twice, and a hint of leftovers where the server had taken no command at all."""
    with pytest.raises(errors.PermissionDeniedError, match="authentication failed"):
        with tensorstream.open(redis_auth_server.url("auth/w"), "wb") as f:
            f.write(b"x" * 1000)
    assert "could not remove staged chunks" not in caplog.text


def test_a_write_refused_after_staging_still_warns_of_its_chunks(
        redis_server: RedisServer, isolated_env: object,
        caplog: pytest.LogCaptureFixture) -> None:
    """The neighbour: a user that may SET but not publish nor delete left chunks staged
    (they expire), and the warning says so."""
    with redis_server.client() as admin:
        admin.execute_command("ACL", "SETUSER", "half", "on", ">half-pw", "~*", "+@all", "-del",
                              "-unlink", "-eval", "-evalsha", "-fcall", "-hset", "-multi")
    try:
        with pytest.raises(errors.PermissionDeniedError):
            with tensorstream.open(redis_server.url("half/w", user="half", password="half-pw"),
                                   "wb") as f:
                f.write(b"x" * 1000)
    finally:
        with redis_server.client() as admin:
            admin.execute_command("ACL", "DELUSER", "half")
    assert "could not remove staged chunks of 'half/w'" in caplog.text


@pytest.mark.parametrize("how", ["uri", "option", "env", "acl"])
def test_wrong_password_is_typed_and_never_shown(
    redis_auth_server: RedisServer, monkeypatch: pytest.MonkeyPatch, isolated_env: object,
    how: str,
) -> None:
    canary = "Canary-Pw-7731"
    srv = redis_auth_server
    uri, opts = srv.url("auth/x"), {}
    if how == "uri":
        uri = srv.url("auth/x", password=canary)
    elif how == "option":
        opts = {"redis_password": canary}
    elif how == "env":
        monkeypatch.setenv("REDIS_PASSWORD", canary)
    else:
        uri = srv.url("auth/x", user=ACL_USER, password=canary)
    with pytest.raises(errors.PermissionDeniedError) as info:
        tensorstream.open(uri, retries=3, **opts)
    exc = info.value
    assert isinstance(exc, PermissionError) and not exc.temporary
    texts = [str(exc), repr(exc), str(exc.__cause__), repr(exc.__cause__)]
    assert all(canary not in t for t in texts), texts
    assert "authentication failed" in str(exc)
    assert "give the password" not in str(exc)  # one was given: it is the wrong one
    provider = tensorstream.get_provider(uri, **opts)
    assert canary not in repr(provider) and canary not in repr(provider.inner)
    with pytest.raises(TypeError):
        pickle.dumps(provider.inner)


def test_a_server_at_maxclients_says_which_knobs_there_are(isolated_env: object) -> None:
    """'Redis connection failed: max number of clients reached' named no way out. With
    no connection at all to be had, a lower concurrency would not help either: it
    says every connection was refused, and to wait or raise maxclients."""
    with RedisServer() as srv, srv.client() as admin:
        srv.put("full/k", b"x" * 100)
        admin.config_set("maxclients", "1")  # this admin connection is the one
        with pytest.raises(errors.RetriesExhaustedError) as info:
            tensorstream.open(srv.url("full/k"), retries=2, backoff_initial=0.01)
        last = info.value.last_error
        assert isinstance(last, errors.ConnectionFailedError) and last.temporary
        assert "refused every connection" in str(last) and "raise maxclients" in str(last)


def test_unreachable_server_is_temporary_connection_error(isolated_env: object) -> None:
    from tensorstream.testing.redis_server import free_port

    with pytest.raises(errors.TensorstreamError) as info:
        tensorstream.open(f"redis://127.0.0.1:{free_port()}/k", retries=2, backoff_initial=0.01)
    assert isinstance(info.value, errors.RetriesExhaustedError)
    assert isinstance(info.value.last_error, errors.ConnectionFailedError)


# -- TLS -------------------------------------------------------------------------------
def test_tls_untrusted_certificate_refused(redis_tls_server: RedisServer,
                                           isolated_env: object) -> None:
    with pytest.raises(errors.ConnectionFailedError) as info:
        tensorstream.open(redis_tls_server.url("tls/x"), retries=3)
    assert "certificate" in str(info.value).lower()
    assert not info.value.temporary  # not retried: a bad certificate does not heal


def test_plain_text_to_a_tls_port_says_use_rediss(redis_tls_server: RedisServer,
                                                  isolated_env: object) -> None:
    """The mirror of rediss:// to a plain-text port: redis:// to a TLS-only port was
    "Connection reset by peer", retried as a server restart would be."""
    uri = redis_tls_server.url("tls/x").replace("rediss://", "redis://")
    with pytest.raises(errors.ConnectionFailedError, match=r"speaks TLS.*use rediss://") as info:
        tensorstream.open(uri, retries=3)
    assert not info.value.temporary


def test_tls_ca_bundle_accepted_and_insecure_warns(redis_tls_server: RedisServer) -> None:
    srv = redis_tls_server
    assert _roundtrip(srv.url("tls/ok"), ca_bundle=srv.ca_file) == b"secret weights"
    with pytest.warns(InsecureTLSWarning, match="insecure"):
        assert _roundtrip(srv.url("tls/insecure"), insecure=True) == b"secret weights"


def test_tls_hostname_mismatch_refused(isolated_env: object) -> None:
    """A certificate from a trusted CA, issued for another name. (This test used
    127.0.0.2, where nothing listens: it passed on "connection refused", and the
    error for a real mismatch said to pass ca_bundle, which was passed.)"""
    with RedisServer(tls=True, tls_cert_names=("cache.example",)) as srv:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(errors.ConnectionFailedError) as info:
                tensorstream.open(srv.url("tls/x"), ca_bundle=srv.ca_file, retries=3)
        assert "not valid for '127.0.0.1'" in str(info.value)
        assert "names another host" in str(info.value)
        assert "ca_bundle" not in str(info.value)
        assert not info.value.temporary
        # with verification off the same server serves: the name was the only problem
        with pytest.warns(InsecureTLSWarning):
            assert _roundtrip(srv.url("tls/ok"), insecure=True) == b"secret weights"


def test_tls_client_certificate(redis_mtls_server: RedisServer) -> None:
    srv = redis_mtls_server
    with pytest.raises(errors.TensorstreamError):
        tensorstream.open(srv.url("mtls/x"), ca_bundle=srv.ca_file, retries=1)
    cert, key = srv.issue_client_cert()
    opts = {"ca_bundle": srv.ca_file, "client_cert": cert, "client_key": key}
    assert _roundtrip(srv.url("mtls/ok"), **opts) == b"secret weights"


def test_db_selection(redis_server: RedisServer) -> None:
    uri2 = redis_server.url("dbsel", db=2)
    assert _roundtrip(uri2) == b"secret weights"
    with pytest.raises(FileNotFoundError):
        tensorstream.open(redis_server.url("dbsel", db=3))
    assert _roundtrip(redis_server.url("dbsel4"), redis_db=4) == b"secret weights"
    with redis_server.client(db=4) as c:
        assert c.exists("dbsel4") == 1


def test_a_broken_blocking_read_names_the_generation_it_came_from(
        tensorstream_redis: RedisBackend) -> None:
    """So the layer resumes it pinned to that generation, whatever its caller pinned."""
    data = os.urandom(20 << 20)
    tensorstream_redis.put("gen", data, chunk_size=1 << 20)
    uri = tensorstream_redis.uri("gen")
    path = tensorstream.parse_uri(uri).path
    p = tensorstream.get_provider(uri)
    try:
        info = _loop.run_sync(p.stat(path))
        tensorstream_redis.faults.drop_after(10 << 20, times=1)  # inside the second batch
        buf = bytearray(len(data))
        with pytest.raises(errors.IncompleteReadError) as broken:
            p.inner.readinto_blocking(path, 0, memoryview(buf), pin=Pin.of(info))
        got = broken.value.received
        assert got > 0 and buf[:got] == data[:got]
        assert broken.value.served == Pin(size=len(data), etag=info.etag)
    finally:
        _loop.run_sync(p.close())



@pytest.mark.parametrize(("query", "match"), [
    ("db=99999999999999", "db in the URI must be an integer >= 0 and <= 65536"),
    ("db=%C2%B2", "db in the URI must be an integer"),  # '²' passed str.isdigit()
    ("cluster=maybe", "cluster in the URI must be true or false"),
])
def test_the_uri_s_options_are_checked_like_the_options(query: str, match: str) -> None:
    # ?db=99999999999999 failed only at the server's SELECT; ?cluster=maybe meant False
    with pytest.raises(errors.ConfigurationError, match=match):
        tensorstream.get_provider(f"redis://127.0.0.1:1/k?{query}")
    fine = tensorstream.get_provider("redis://127.0.0.1:1/k?db=3&cluster=no")
    assert "db=3" in repr(fine)
    _loop.run_sync(fine.close())
