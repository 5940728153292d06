"""Fixtures that fit existing code: the environment mode, S3 signature checks,
Redis with a password / ACL user / TLS, documented clients and raw faults, and
an async test (issue 18)."""

from __future__ import annotations

import os

import pytest

import tensorstream
from tensorstream.errors import (
    MissingCredentialsError,
    PermissionDeniedError,
    ProtocolError,
    TensorstreamError,
)

pytest_plugins = ["pytester"]


def serving_code_load(uri: str) -> bytes:
    """How serving code is written: no options, credentials from the environment."""
    with tensorstream.open(uri) as f:
        return f.read()


# -- environment mode ---------------------------------------------------------------


def test_s3_env_mode_reaches_the_bucket_with_unmodified_code(tensorstream_s3, monkeypatch):
    tensorstream_s3.put("m.bin", b"weights")
    with pytest.raises(TensorstreamError):  # isolated: no endpoint, no keys
        serving_code_load(tensorstream_s3.uri("m.bin"))
    env = tensorstream_s3.apply_env(monkeypatch)
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_REGION",
            "S3_ENDPOINT_URL", "S3_ACCESS_KEY_ID", "S3_SECRET_ACCESS_KEY"} <= set(env)
    assert serving_code_load(tensorstream_s3.uri("m.bin")) == b"weights"
    # vLLM's names reach TensorizerConfig's stream too.
    cfg = tensorstream.TensorizerConfig(tensorizer_uri=tensorstream_s3.uri("m.bin"))
    with cfg.open_stream() as f:
        assert f.read() == b"weights"


@pytest.mark.tensorstream_s3(env=True)
def test_s3_env_marker(tensorstream_s3):
    tensorstream_s3.put("m.bin", b"x" * 1000)
    assert serving_code_load(tensorstream_s3.uri("m.bin")) == b"x" * 1000


@pytest.mark.tensorstream_http(tls=True, token=True, env=True)
def test_http_env_marker_gives_token_and_ca(tensorstream_http):
    tensorstream_http.put("m.bin", b"secure")
    assert serving_code_load(tensorstream_http.uri("m.bin")) == b"secure"
    assert tensorstream_http.requests[-1].headers["Authorization"] == f"Bearer {tensorstream_http.token}"


@pytest.mark.tensorstream_http(tls=True, env=True)
def test_http_env_reaches_requests_and_urllib_over_tls(tensorstream_http, monkeypatch):
    # requests trusts certifi's CAs and reads REQUESTS_CA_BUNDLE, never SSL_CERT_FILE:
    # serving code fetching with requests failed with CERTIFICATE_VERIFY_FAILED.
    import urllib.request

    import requests

    tensorstream_http.put("m.bin", b"secure")
    url = tensorstream_http.uri("m.bin")
    assert requests.get(url, timeout=30).content == b"secure"
    with requests.Session() as session:
        assert session.get(url, timeout=30).content == b"secure"
    with urllib.request.urlopen(url, timeout=30) as answer:
        assert answer.read() == b"secure"
    env = tensorstream_http.env
    assert env["REQUESTS_CA_BUNDLE"] == env["CURL_CA_BUNDLE"] == tensorstream_http.ca_bundle


@pytest.mark.tensorstream_http(tls=True, env=True)
@pytest.mark.tensorstream_redis(tls=True, env=True)
def test_two_tls_backends_env_trust_both_cas(tensorstream_http, tensorstream_redis):
    # The second backend's SSL_CERT_FILE replaced the first's: its reads failed verification.
    import requests

    assert tensorstream_http.ca_bundle != tensorstream_redis.ca_bundle
    tensorstream_http.put("m.bin", b"h")
    tensorstream_redis.put("m.bin", b"r")
    assert serving_code_load(tensorstream_http.uri("m.bin")) == b"h"
    assert serving_code_load(tensorstream_redis.uri("m.bin")) == b"r"
    assert requests.get(tensorstream_http.uri("m.bin"), timeout=30).content == b"h"


def test_env_is_undone_after_the_test():
    import os

    assert not any(n.startswith(("AWS_ENDPOINT", "S3_", "REDIS_")) for n in os.environ)


def test_isolation_does_not_outlive_the_test(pytester, monkeypatch):
    # The plugin's boto3 client came from boto3.client(), which makes boto3's
    # process-wide default session inside the test's isolated environment: a later
    # test's own boto3.client() then had the empty AWS config cached, not its own.
    import tensorstream

    src = os.path.dirname(os.path.dirname(os.path.abspath(tensorstream.__file__)))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]))
    pytester.makepyfile(test_after="""
        import boto3

        def test_uses_s3(tensorstream_s3):
            tensorstream_s3.put("a", b"x")
            assert tensorstream_s3.get("a") == b"x"

        def test_later_boto3_reads_its_own_config(tmp_path, monkeypatch):
            config = tmp_path / "config"
            config.write_text("[default]\\nregion = eu-west-3\\n")
            monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
            for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
                monkeypatch.delenv(name, raising=False)
            assert boto3.DEFAULT_SESSION is None
            assert boto3.client("s3").meta.region_name == "eu-west-3"
    """)
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(passed=2)


def test_plain_boto3_in_env_mode_gets_each_tests_keys(pytester, monkeypatch):
    # boto3.client() takes boto3's process-wide default session, which keeps the
    # credentials it first found: a loader written so got the keys of the session made
    # before the tests (the developer's own, sent to the test server) or by the first
    # test (another server's), and failed with InvalidAccessKeyId.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAOUTSIDECANARY")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "outside-secret")
    pytester.makepyfile(test_boto3_env="""
        import boto3
        import pytest

        boto3.client("s3", region_name="us-east-1")  # the default session, with the outside keys

        def load(bucket, key):  # unmodified serving code
            return boto3.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()

        @pytest.mark.tensorstream_s3(auth=False, env=True)
        def test_a_open_server(tensorstream_s3):
            tensorstream_s3.put("m", b"a")
            assert load(tensorstream_s3.bucket, "m") == b"a"
            assert "AKIAOUTSIDECANARY" not in tensorstream_s3.requests[-1].headers["Authorization"]

        @pytest.mark.tensorstream_s3(env=True)
        def test_b_signed_server(tensorstream_s3):
            tensorstream_s3.put("m", b"b")
            assert load(tensorstream_s3.bucket, "m") == b"b"

        def test_c_after_them_the_outside_session_is_back():
            assert boto3.DEFAULT_SESSION.get_credentials().access_key == "AKIAOUTSIDECANARY"
    """)
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(passed=3)


# -- S3 signature checks --------------------------------------------------------------


def test_home_and_aws_files_are_fresh_for_each_test(pytester):
    # HOME and the empty AWS files were one directory for the whole session: a
    # ~/.netrc or credentials file one test wrote reached every later test (the
    # netrc's password was sent to the next test's HTTP server).
    pytester.makepyfile("""
        import os, pathlib
        import tensorstream

        def test_a_writes_home(tensorstream_http):
            home = pathlib.Path.home()
            (home / ".netrc").write_text("machine 127.0.0.1 login bob password hunter2\\n")
            with open(os.environ["AWS_SHARED_CREDENTIALS_FILE"], "w") as f:
                f.write("[default]\\naws_access_key_id=LEAK\\naws_secret_access_key=LEAK\\n")

        def test_b_sees_none_of_it(tensorstream_http, tensorstream_s3):
            assert not (pathlib.Path.home() / ".netrc").exists()
            assert pathlib.Path(os.environ["AWS_SHARED_CREDENTIALS_FILE"]).read_text() == ""
            tensorstream_http.put("k", b"x")
            with tensorstream.open(tensorstream_http.uri("k"), **tensorstream_http.options) as f:
                assert f.read() == b"x"
            sent = {h.lower() for h in tensorstream_http.requests[-1].headers}
            assert "authorization" not in sent
    """)
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(passed=2)


def test_s3_checks_signatures_by_default(tensorstream_s3):
    tensorstream_s3.put("m.bin", b"data")
    assert tensorstream_s3.auth
    wrong = {**tensorstream_s3.options, "s3_secret_access_key": "not-the-secret"}
    with pytest.raises(PermissionDeniedError, match="refused"):
        with tensorstream.open(tensorstream_s3.uri("m.bin"), **wrong) as f:
            f.read()
    with tensorstream.open(tensorstream_s3.uri("m.bin"), **tensorstream_s3.options) as f:
        assert f.read() == b"data"


@pytest.mark.tensorstream_s3(auth=False)
def test_s3_without_signature_checks_accepts_any_key(tensorstream_s3):
    tensorstream_s3.put("m.bin", b"data")
    assert not tensorstream_s3.auth
    wrong = {**tensorstream_s3.options, "s3_secret_access_key": "anything"}
    with tensorstream.open(tensorstream_s3.uri("m.bin"), **wrong) as f:
        assert f.read() == b"data"


def test_s3_ignore_range_works_with_signatures_on(tensorstream_s3):
    tensorstream_s3.put("m.bin", bytes(range(256)) * 4096)
    tensorstream_s3.faults.ignore_range()
    with pytest.raises(ProtocolError):
        with tensorstream.open(tensorstream_s3.uri("m.bin"), **tensorstream_s3.options,
                               stream_reads=False) as f:
            f.seek(1000)
            f.read(5000)


def test_s3_client_and_extra_buckets(tensorstream_s3):
    other = tensorstream_s3.create_bucket()
    tensorstream_s3.client.put_object(Bucket=other, Key="a", Body=b"via boto3")
    with tensorstream.open(f"s3://{other}/a", **tensorstream_s3.options) as f:
        assert f.read() == b"via boto3"
    names = {b["Name"] for b in tensorstream_s3.client.list_buckets()["Buckets"]}
    assert {other, tensorstream_s3.bucket} <= names


def test_s3_versioned_buckets_are_removed_after_the_test(tensorstream_servers):
    # Only current objects were deleted: a bucket with versioning on kept its old
    # versions, could not be deleted (silently), and a later test's
    # create_bucket("same-name") got that bucket with another test's objects.
    backend = tensorstream_servers.s3()
    client = backend.client
    named = backend.create_bucket("ts-versioned-named")
    for bucket in (backend.bucket, named):
        client.put_bucket_versioning(Bucket=bucket,
                                     VersioningConfiguration={"Status": "Enabled"})
        for body in (b"v1", b"v2"):
            client.put_object(Bucket=bucket, Key="m", Body=body)
        client.delete_object(Bucket=bucket, Key="m")  # a delete marker too
    backend.close()
    names = {b["Name"] for b in client.list_buckets()["Buckets"]}
    assert not {backend.bucket, named} & names


# -- Redis with a password, an ACL user, TLS ----------------------------------------------


@pytest.mark.tensorstream_redis(password=True)
def test_redis_with_a_password(tensorstream_redis, monkeypatch):
    tensorstream_redis.put("m.bin", b"locked")
    assert tensorstream_redis.password and tensorstream_redis.password not in tensorstream_redis.uri("m.bin")
    with pytest.raises(PermissionDeniedError):
        serving_code_load(tensorstream_redis.uri("m.bin"))
    with tensorstream.open(tensorstream_redis.uri("m.bin"), **tensorstream_redis.options) as f:
        assert f.read() == b"locked"
    tensorstream_redis.apply_env(monkeypatch)
    assert serving_code_load(tensorstream_redis.uri("m.bin")) == b"locked"
    assert tensorstream_redis.client.ping()


@pytest.mark.tensorstream_redis(password=True, acl_user=True, env=True)
def test_redis_with_an_acl_user(tensorstream_redis):
    tensorstream_redis.put("m.bin", b"acl")
    assert tensorstream_redis.username == "tensorstream-test"
    assert serving_code_load(tensorstream_redis.uri("m.bin")) == b"acl"
    wrong = {**tensorstream_redis.options, "redis_password": "wrong"}
    with pytest.raises(PermissionDeniedError):
        with tensorstream.open(tensorstream_redis.uri("m.bin"), **wrong) as f:
            f.read()


@pytest.mark.tensorstream_redis(tls=True, password=True)
def test_redis_over_tls(tensorstream_redis):
    data = bytes(range(256)) * 8192
    tensorstream_redis.put("m.bin", data)
    uri = tensorstream_redis.uri("m.bin")
    assert uri.startswith("rediss://") and tensorstream_redis.ca_bundle
    with tensorstream.open(uri, **tensorstream_redis.options) as f:
        assert f.read() == data
    tensorstream_redis.faults.drop_after(300_000, times=1)  # faults still apply over TLS
    with tensorstream.open(uri, **tensorstream_redis.options) as f:
        assert f.read() == data


@pytest.mark.tensorstream_redis(tls=True)
def test_replacement_under_redis_tls_is_refused_not_silently_skipped(tensorstream_redis):
    # The proxy spots a read by its command bytes, which TLS encrypts: the object
    # used to be never replaced, so a test of "replaced between reads" saw no change.
    from tensorstream.testing.backends import UnsupportedFault

    assert not tensorstream_redis.faults.supports("replace_between_reads")
    with pytest.raises(UnsupportedFault, match="encrypted"):
        tensorstream_redis.faults.replace_between_reads("m.bin", b"new")
    assert tensorstream_redis.faults.supports("drop_after")


def test_unsecured_redis_needs_no_credentials(tensorstream_redis):
    tensorstream_redis.put("m.bin", b"open")
    assert tensorstream_redis.options == {} and "REDIS_PASSWORD" not in tensorstream_redis.env
    assert serving_code_load(tensorstream_redis.uri("m.bin")) == b"open"


def test_unknown_marker_argument_is_an_error(pytester):
    pytester.makepyfile("""
        import pytest

        @pytest.mark.tensorstream_redis(pasword=True)
        def test_x(tensorstream_redis):
            pass
    """)
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*tensorstream_redis takes acl_user, env, password, tls, not pasword*"])


def test_settings_that_would_be_ignored_are_errors(pytester):
    # Each of these used to run the test against the default server (no TLS, auth on).
    pytester.makepyfile("""
        import pytest

        @pytest.mark.tensorstream_s3(False)
        def test_positional(tensorstream_s3):
            pass

        @pytest.mark.parametrize("tensorstream_http", [True], indirect=True)
        def test_not_a_dict(tensorstream_http):
            pass

        @pytest.mark.tensorstream_http(tls="yes")
        def test_not_a_bool(tensorstream_http):
            pass

        @pytest.mark.parametrize("tensorstream_http", [{"tls": True}], indirect=True)
        def test_a_dict_still_works(tensorstream_http):
            assert tensorstream_http.ca_bundle

        def test_backend_still_works(tensorstream_backend):
            pass
    """)
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(errors=3, passed=4)
    result.stdout.fnmatch_lines([
        "*tensorstream_s3 takes keyword arguments only (auth, env), not False*",
        "*indirect parametrisation of tensorstream_http takes a dict of env, tls, token, not True*",
        "*tensorstream_http(tls=...) takes True or False, not 'yes'*",
    ])


def test_a_class_or_module_marker_combines_with_the_tests_own(pytester):
    # Only the closest marker was read: a test's own tensorstream_http(token=True) in a
    # class marked tls=True silently got a server without TLS, and a module's env=True
    # was lost on a test marked auth=False (its loader then found no credentials).
    pytester.makepyfile("""
        import os
        import pytest

        pytestmark = pytest.mark.tensorstream_s3(env=True)

        @pytest.mark.tensorstream_s3(auth=False)
        def test_module_and_test(tensorstream_s3):
            assert not tensorstream_s3.auth
            assert os.environ["AWS_ENDPOINT_URL"] == tensorstream_s3.options["s3_endpoint"]

        @pytest.mark.tensorstream_http(tls=True, token="outer")
        class TestHTTPS:
            @pytest.mark.tensorstream_http(token="inner")
            def test_class_and_test(self, tensorstream_http):
                assert tensorstream_http.ca_bundle  # the class's TLS
                assert tensorstream_http.token == "inner"  # the test's own wins

            @pytest.mark.tensorstream_http(tls=False)
            def test_a_test_can_turn_it_off(self, tensorstream_http):
                assert tensorstream_http.ca_bundle is None
                assert tensorstream_http.token == "outer"
    """)
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    # In a process of its own: an in-process run that imports trustme (cryptography) for
    # the first time has it taken out of sys.modules after, and a later one re-imports it
    # over cryptography's compiled part ("curve must be an EllipticCurve instance").
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(passed=3)


def test_a_credential_setting_of_the_wrong_type_says_what_it_takes(pytester):
    # password=123 failed deep in the server's start ("'int' object is not iterable"),
    # acl_user with three items as "too many values to unpack", and token=123 made a
    # server whose options tensorstream then refused, at the test's first read.
    pytester.makepyfile("""
        import pytest

        @pytest.mark.tensorstream_http(token=123)
        def test_token(tensorstream_http):
            pass

        @pytest.mark.tensorstream_redis(password=123)
        def test_password(tensorstream_redis):
            pass

        @pytest.mark.tensorstream_redis(acl_user=("u", "p", "x"))
        def test_acl_user(tensorstream_redis):
            pass

        @pytest.mark.tensorstream_redis(acl_user=["loader", "pw"])
        def test_a_pair_as_a_list_still_works(tensorstream_redis):
            assert (tensorstream_redis.username, tensorstream_redis.password) == ("loader", "pw")
    """)
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(errors=3, passed=1)
    result.stdout.fnmatch_lines([
        "*tensorstream_http(token=...) takes True, False or a string, not 123*",
        "*tensorstream_redis(password=...) takes True, False or a string, not 123*",
        "*tensorstream_redis(acl_user=...) takes True, False, a user name or a (name, password) "
        "pair of strings, not ('u', 'p', 'x')*",
    ])


# -- every fault, and async tests -------------------------------------------------------


def test_raw_faults_beyond_the_common_ones(tensorstream_http):
    tensorstream_http.put("m.bin", b"z" * 100_000)
    tensorstream_http.faults.raw.wrong_content_range = True
    with pytest.raises(ProtocolError):
        with tensorstream.open(tensorstream_http.uri("m.bin"), **tensorstream_http.options,
                               stream_reads=False) as f:
            f.seek(10)
            f.read(1000)


async def test_async_read_range(tensorstream_backend):
    # pyproject: asyncio_mode = "auto" (else mark it @pytest.mark.asyncio)
    tensorstream_backend.put("m.bin", b"0123456789")
    got = await tensorstream.read_range(tensorstream_backend.uri("m.bin"), 2, 5,
                                        **tensorstream_backend.options)
    assert got == b"234"


def test_missing_credentials_names_where_it_looked(tensorstream_s3):
    tensorstream_s3.put("m.bin", b"x")
    with pytest.raises(MissingCredentialsError):
        serving_code_load(tensorstream_s3.uri("m.bin"))


@pytest.mark.tensorstream_s3(env=True)
def test_env_mode_survives_a_second_backend_fixture(tensorstream_s3, tensorstream_http):
    # The second fixture isolated the environment again and removed AWS_* that the
    # first one's env=True had just set: the loader found no credentials.
    tensorstream_s3.put("m.bin", b"weights")
    assert serving_code_load(tensorstream_s3.uri("m.bin")) == b"weights"


@pytest.mark.tensorstream_redis(env=True)
def test_redis_env_mode_survives_a_second_backend_fixture(tensorstream_redis, tensorstream_s3):
    tensorstream_redis.put("m.bin", b"weights")
    assert serving_code_load(tensorstream_redis.uri("m.bin")) == b"weights"
    assert os.environ["REDIS_URL"] == tensorstream_redis.env["REDIS_URL"]


@pytest.fixture
def token_hosts_elsewhere(monkeypatch):
    # (set before the backend fixture: its isolation must take it out)
    monkeypatch.setenv("TENSORSTREAM_HTTP_TOKEN_HOSTS", "hub.elsewhere.example")


@pytest.mark.tensorstream_http(token=True, env=True)
def test_http_env_token_reaches_the_test_server_whatever_hosts_the_outer_env_names(
        token_hosts_elsewhere, tensorstream_http):
    # A developer's TENSORSTREAM_HTTP_TOKEN_HOSTS kept the env token from the test's server.
    assert "TENSORSTREAM_HTTP_TOKEN_HOSTS" not in os.environ
    tensorstream_http.put("m.bin", b"x")
    assert serving_code_load(tensorstream_http.uri("m.bin")) == b"x"
    assert tensorstream_http.requests[-1].headers["Authorization"] == f"Bearer {tensorstream_http.token}"
