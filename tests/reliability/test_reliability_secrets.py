"""Reliability: secrets never leak; TLS verified by default; redirects are safe
(issue 9, cases 19-21)."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import pickle
import re
import subprocess
import sys
import traceback
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import tensorstream
from fixtures_s3 import S3_BUCKET
from reliability_helpers import (
    CANARY_ARG,
    CANARY_ENV,
    CANARY_FILE,
    CANARY_QUERY,
    CANARY_USERINFO,
    FAST,
    MismatchedTLSServer,
    leaked,
    run_python,
    unique,
)
from tensorstream import _loop, errors
from tensorstream.testing.http_server import HTTPTestServer
from tensorstream.testing.redis_server import RedisServer
from tensorstream.testing.s3_server import MotoS3Server

pytestmark = [pytest.mark.usefixtures("isolated_env", "http_reset"), pytest.mark.timeout(90)]

DATA = os.urandom(50_000)


def _exposures(exc: BaseException | None, *objects: Any) -> str:
    """Every text an attacker-readable channel could show for ``exc`` and ``objects``."""
    parts: list[str] = []
    if exc is not None:
        parts += [str(exc), repr(exc), "".join(traceback.format_exception(exc))]
        try:
            parts.append(repr(pickle.loads(pickle.dumps(exc))))
            parts.append(pickle.dumps(exc).decode("latin-1"))
        except Exception as pickle_error:  # refusing to pickle is fine
            parts.append(repr(pickle_error))
    for obj in objects:
        parts.append(repr(obj))
        parts.append(str(obj))
        try:
            parts.append(pickle.dumps(obj).decode("latin-1"))
        except Exception as pickle_error:
            parts.append(repr(pickle_error))
    return "\n".join(parts)


@pytest.fixture
def debug_logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """DEBUG records of *every* logger (root), including botocore, aiohttp and redis."""
    caplog.set_level(logging.DEBUG)  # root
    for name in ("botocore", "aiobotocore", "aiohttp", "redis", "urllib3", "s3fs", "tensorstream"):
        logging.getLogger(name).setLevel(logging.DEBUG)
    yield caplog
    for name in ("botocore", "aiobotocore", "aiohttp", "redis", "urllib3", "s3fs", "tensorstream"):
        logging.getLogger(name).setLevel(logging.NOTSET)


def _read(uri: str, **options: Any) -> tuple[bytes | None, BaseException | None, Any]:
    """Open and read ``uri``; returns (bytes or None, exception or None, provider repr source)."""
    try:
        with tensorstream.open(uri, **options) as f:
            return f.read(), None, f
    except BaseException as exc:
        return None, exc, None


# -- 19. canaries through every channel ---------------------------------------------
@pytest.mark.parametrize("channel", ["arg", "env", "userinfo", "query"])
def test_http_canary_never_leaks(http_server: HTTPTestServer, debug_logs: Any,
                                 monkeypatch: pytest.MonkeyPatch, channel: str) -> None:
    key = unique()
    http_server.put(key, DATA)
    base, opts = http_server.url(key), dict(FAST)
    if channel == "arg":
        opts["token"] = CANARY_ARG
    elif channel == "env":
        monkeypatch.setenv("TENSORSTREAM_HTTP_TOKEN", CANARY_ENV)
    elif channel == "userinfo":
        base = base.replace("http://", f"http://user:{CANARY_USERINFO}@")
    else:
        base += f"?X-Amz-Signature={CANARY_QUERY}&token={CANARY_QUERY}"
    got, exc, f = _read(base, **opts)
    assert exc is None and got == DATA
    seen = [_exposures(None, f, f._provider, f._provider.inner, tensorstream.uri.parse_uri(base))]
    # What stat() reports: its path is the URL's path and query (the repr showed the signature).
    seen += [repr(f.info), str(f.info), repr(asyncio.run(tensorstream.stat(base, **opts)))]
    # Failures: 404, then 503 until the attempts run out (retry logs, chained errors).
    for status in (404, 503):
        http_server.faults.status_script = [status] * 3
        _, exc, _ = _read(base, retries=3, **opts)
        assert isinstance(exc, errors.TensorstreamError)
        seen.append(_exposures(exc, getattr(exc, "last_error", None)))
        http_server.faults.reset()
    seen.append(debug_logs.text)
    assert "retrying" in debug_logs.text  # the DEBUG logs were really captured
    assert not leaked("\n".join(seen)), "a canary leaked"


def _s3_options(server: MotoS3Server, channel: str, tmp_path: Path,
                monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    opts: dict[str, Any] = {"s3_endpoint": server.endpoint_url, "s3_region": "us-east-1", **FAST}
    if channel == "arg":
        opts.update(s3_access_key_id="AKIACANARYARG", s3_secret_access_key=CANARY_ARG,
                    s3_session_token=CANARY_ARG + "-token")
    elif channel == "env":
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIACANARYENV")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", CANARY_ENV)
        monkeypatch.setenv("AWS_SESSION_TOKEN", CANARY_ENV + "-token")
    else:  # config file (s3cmd format, tensorizer's convention)
        cfg = tmp_path / "s3cfg"
        cfg.write_text(f"[default]\naccess_key = AKIACANARYFILE\nsecret_key = {CANARY_FILE}\n")
        opts["s3_config_path"] = str(cfg)
    return opts


@pytest.mark.parametrize("channel", ["arg", "env", "file"])
def test_s3_canary_never_leaks(moto_s3_public: MotoS3Server, debug_logs: Any, tmp_path: Path,
                               monkeypatch: pytest.MonkeyPatch, channel: str) -> None:
    key = unique()
    moto_s3_public.put(S3_BUCKET, key, DATA)
    opts = _s3_options(moto_s3_public, channel, tmp_path, monkeypatch)
    got, exc, f = _read(f"s3://{S3_BUCKET}/{key}", **opts)
    assert exc is None and got == DATA, exc
    seen = [_exposures(None, f._provider, f._provider.inner)]
    _, exc, _ = _read(f"s3://{S3_BUCKET}/{key}-missing", **opts)
    assert isinstance(exc, errors.NotFoundError)
    seen.append(_exposures(exc))
    seen.append(debug_logs.text)
    assert any(r.name.startswith("botocore") for r in debug_logs.records)
    text = "\n".join(seen)
    where = [text[max(0, text.index(c) - 80): text.index(c) + 20] for c in leaked(text)]
    assert not where, f"canary leaked: {where}"


@pytest.mark.parametrize("channel", ["arg", "env", "userinfo"])
def test_redis_canary_never_leaks(redis_auth_server: RedisServer, debug_logs: Any,
                                  monkeypatch: pytest.MonkeyPatch, channel: str) -> None:
    """A *wrong* canary password: the rejection error is where leaks happen."""
    base, opts = redis_auth_server.url(unique()), {"retries": 2, **FAST}
    if channel == "arg":
        opts["redis_password"] = CANARY_ARG
    elif channel == "env":
        monkeypatch.setenv("REDIS_PASSWORD", CANARY_ENV)
    else:
        base = base.replace("redis://", f"redis://:{CANARY_USERINFO}@")
    _, exc, _ = _read(base, **opts)
    assert isinstance(exc, PermissionError), repr(exc)

    async def provider_repr() -> str:
        p = tensorstream.get_provider(base, **opts)
        try:
            return _exposures(None, p, p.inner)
        finally:
            await p.close()

    seen = [_exposures(exc), _loop.run_sync(provider_repr()), debug_logs.text]
    assert not leaked("\n".join(seen))


def test_cli_output_and_progress_never_show_canaries(
        http_server: HTTPTestServer, tmp_path: Path) -> None:
    key = unique()
    http_server.put(key, DATA)
    src = http_server.url(key).replace("http://", f"http://u:{CANARY_USERINFO}@")
    # (and under a name no list knows: every query value is hidden)
    query = f"?X-Amz-Signature={CANARY_QUERY}&zz9={CANARY_QUERY}"
    missing = src.replace(key, key + "-missing") + query
    src += query
    env = {"TENSORSTREAM_HTTP_TOKEN": CANARY_ENV, "AWS_SECRET_ACCESS_KEY": CANARY_ENV}
    runs = []
    for args in (["cp", "--json", "--token", CANARY_ARG, src, str(tmp_path / "ok.bin")],
                 ["cp", "--token", CANARY_ARG, missing, str(tmp_path / "missing.bin")],
                 ["cp", "-r", src, str(tmp_path / "r")],
                 ["ls", src]):
        runs.append(run_python("import sys; from tensorstream.cli.main import main; "
                               "sys.exit(main(sys.argv[1:]))", args=args, env=env, timeout=60))
    assert runs[0].returncode == 0 and (tmp_path / "ok.bin").read_bytes() == DATA
    assert runs[1].returncode != 0 and runs[1].stderr
    out = "\n".join(r.stdout + r.stderr for r in runs)
    assert not leaked(out, (CANARY_ENV, CANARY_USERINFO, CANARY_QUERY)), out
    # The token given on the command line is not echoed back either.
    assert CANARY_ARG not in out

    # Progress bars (tqdm) name each file: redacted.
    from tensorstream.cli.progress import TqdmProgress
    from tensorstream.copy.engine import copy

    stream = io.StringIO()
    progress = TqdmProgress(stream)
    result = copy(src, str(tmp_path / "p.bin"), progress=progress, token=CANARY_ARG)
    progress.close()
    assert result.ok and stream.getvalue()
    assert not leaked(stream.getvalue() + repr(result.to_dict()))


#: The one child tensorstream may have outside ``tensorstream.testing``: a profile's
#: ``credential_process``, started by botocore with the profile's own command line
#: (nothing of ours in its argv); ``providers/s3/process.py`` only bounds the wait for it.
_BOTOCORE_CHILD = "providers/s3/process.py"


def test_tensorstream_starts_no_child_processes() -> None:
    """Nothing outside ``tensorstream.testing`` spawns a process, so no child argv can
    carry a secret (tensorizer's own stream layer shells out to curl; we do not)."""
    root = Path(tensorstream.__file__).parent
    pattern = re.compile(r"\b(subprocess|os\.(exec|spawn|posix_spawn|system|popen))\b")
    offenders = [str(p.relative_to(root)) for p in root.rglob("*.py")
                 if "testing" not in p.parts and pattern.search(p.read_text())]
    assert offenders == [_BOTOCORE_CHILD]
    # ... and it passes botocore's command on as botocore gave it, adding nothing.
    bounded = (root / _BOTOCORE_CHILD).read_text()
    assert "_BoundedPopen(limit, profile, argv, held=lock if held else None, remember=key,\n" \
        "                         **kwargs)" in bounded
    assert "argv = list(args[0]) if len(args) == 1 and isinstance(args[0], (list, tuple)) " \
        "else list(args)" in bounded
    assert "_start, limit, profile, list(args), kwargs" in bounded


# -- 20. TLS: untrusted refused, CA bundle accepted, insecure warns, hostname mismatch ------
def _tls_target(kind: str, request: pytest.FixtureRequest) -> tuple[str, str, dict[str, Any]]:
    """(uri, ca_bundle, extra options) for a TLS server of ``kind`` holding ``DATA``."""
    key = unique()
    if kind == "https":
        srv: Any = request.getfixturevalue("https_server")
        srv.put(key, DATA)
        return srv.url(key), srv.ca_bundle_path, {}
    if kind == "s3":
        srv = request.getfixturevalue("moto_s3_tls")
        srv.put(S3_BUCKET, key, DATA)
        opts = srv.options()
        ca = opts.pop("ca_bundle")
        return f"s3://{S3_BUCKET}/{key}", ca, opts
    srv = request.getfixturevalue("redis_tls_server")
    srv.put(key, DATA)
    return srv.url(key), srv.ca_file, {}


@pytest.mark.parametrize("kind", ["https", "s3", "rediss"])
def test_tls_is_verified_by_default(kind: str, request: pytest.FixtureRequest) -> None:
    uri, ca, opts = _tls_target(kind, request)
    with pytest.raises(ConnectionError) as info:  # untrusted: refused, not retried
        with tensorstream.open(uri, retries=3, **FAST, **opts) as f:
            f.read()
    assert not isinstance(info.value, errors.RetriesExhaustedError)
    with tensorstream.open(uri, ca_bundle=ca, **opts) as f:
        assert f.read() == DATA
    with pytest.warns(errors.InsecureTLSWarning):
        with tensorstream.open(uri, insecure=True, **opts) as f:
            assert f.read() == DATA


@pytest.mark.parametrize("kind", ["https", "s3", "rediss"])
def test_tls_hostname_mismatch_is_refused(kind: str, tmp_path: Path) -> None:
    server = MismatchedTLSServer(str(tmp_path))
    try:
        uri = {"https": f"https://127.0.0.1:{server.port}/m",
               "s3": "s3://bucket/m",
               "rediss": f"rediss://127.0.0.1:{server.port}/m"}[kind]
        opts: dict[str, Any] = {}
        if kind == "s3":
            opts = {"s3_endpoint": f"https://127.0.0.1:{server.port}", "s3_region": "us-east-1",
                    "s3_access_key_id": "AKIDEXAMPLE", "s3_secret_access_key": "x"}
        with pytest.raises(ConnectionError) as info:
            with tensorstream.open(uri, ca_bundle=server.ca_bundle_path, retries=3,
                                   timeout_connect=5, **FAST, **opts):
                pass
        assert not isinstance(info.value, errors.RetriesExhaustedError)
        assert server.handshakes >= 1  # it got as far as the TLS handshake
    finally:
        server.close()


def test_insecure_is_never_taken_from_the_environment(https_server: HTTPTestServer,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    key = unique()
    https_server.put(key, DATA)
    for name in ("TENSORSTREAM_INSECURE", "PYTHONHTTPSVERIFY", "CURL_INSECURE"):
        monkeypatch.setenv(name, "0" if name == "PYTHONHTTPSVERIFY" else "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error", errors.InsecureTLSWarning)
        with pytest.raises(ConnectionError):
            with tensorstream.open(https_server.url(key), **FAST) as f:
                f.read()


# -- 21. redirects ------------------------------------------------------------------
async def test_cross_origin_redirect_drops_credentials(http_token_server: HTTPTestServer,
                                                       http_server: HTTPTestServer) -> None:
    key = unique()
    http_server.put(key, DATA)
    http_token_server.faults.redirect_to = http_server.base_url
    got = await tensorstream.read_range(http_token_server.url(key), 0, 100, token=CANARY_ARG,
                                        headers={"X-Api-Key": CANARY_ARG})
    assert got == DATA[:100]
    seen = http_server.requests_for(key)
    assert seen and all(CANARY_ARG not in str(dict(r.headers)) for r in seen)


async def test_https_to_http_downgrade_drops_credentials(https_server: HTTPTestServer,
                                                         http_server: HTTPTestServer) -> None:
    key = unique()
    http_server.put(key, DATA)
    https_server.faults.redirect_to = http_server.base_url
    got = await tensorstream.read_range(https_server.url(key), 0, 100, token=CANARY_ARG,
                                        ca_bundle=https_server.ca_bundle_path)
    assert got == DATA[:100]
    assert all("Authorization" not in r.headers for r in http_server.requests_for(key))


@pytest.mark.parametrize("target", ["http://169.254.169.254", "http://[fe80::1]",
                                    "http://[::ffff:169.254.169.254]"])
async def test_redirect_to_link_local_is_refused(http_server: HTTPTestServer,
                                                 target: str) -> None:
    key = unique()
    http_server.put(key, DATA)
    http_server.faults.redirect_to = target
    with pytest.raises(errors.PermissionDeniedError, match="link-local"):
        await tensorstream.read_range(http_server.url(key), 0, 10, retries=3, **FAST)
    assert len(http_server.requests_for(key)) == 1


async def test_redirect_to_link_local_is_followed_when_allowed(
        http_server: HTTPTestServer) -> None:
    """Allowed: the redirect is followed. The target is fe80::1 scoped to the loopback
    interface, where nothing listens and nothing leaves the machine (never 169.254.x.x)."""
    key = unique()
    http_server.put(key, DATA)
    http_server.faults.redirect_to = "http://[fe80::1%25lo]:9"
    with pytest.raises(errors.TensorstreamError) as info:
        await tensorstream.read_range(http_server.url(key), 0, 10, retries=1,
                                      allow_private_redirects=True, timeout_connect=2, **FAST)
    assert not isinstance(info.value, errors.PermissionDeniedError)


def test_child_argv_never_carries_secrets() -> None:
    """Process listings show argv: a child started by a user's script with a
    tensorstream URI in its arguments sees only what the user passed; tensorstream
    itself adds none (see test_tensorstream_starts_no_child_processes). Here we
    check the redacted form is what tensorstream hands out for such use."""
    uri = f"redis://:{CANARY_USERINFO}@h:1/k?db=0"
    parsed = tensorstream.uri.parse_uri(uri)
    proc = subprocess.run([sys.executable, "-c", "import sys; print(sys.argv[1])", str(parsed)],
                          capture_output=True, text=True, timeout=30)
    assert CANARY_USERINFO not in proc.stdout and "***" in proc.stdout
