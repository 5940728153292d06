"""pytest plugin: mocked S3, HTTP and Redis backends as fixtures (see docs/testing.md).

Registered through the ``pytest11`` entry point, so any project that installs
tensorstream (with its ``test`` extra) gets, with no conftest:

* ``tensorstream_s3`` -- moto's S3 server checking signatures, behind an HTTP
  fault proxy; a fresh bucket per test; AWS/S3 environment variables and config
  files isolated; ``@pytest.mark.tensorstream_s3(auth=False)`` for a server that
  accepts any key;
* ``tensorstream_http`` -- an aiohttp object server (Range, ETag); mark a test
  ``@pytest.mark.tensorstream_http(tls=True, token=True)`` for TLS (trustme CA
  in ``.ca_bundle``) and/or bearer auth;
* ``tensorstream_redis`` -- Debian's ``redis-server`` when installed, else
  fakeredis (``.kind`` says which), behind a TCP fault proxy;
  ``@pytest.mark.tensorstream_redis(password=True, acl_user=True, tls=True)``
  for a ``redis-server`` with a password, an ACL user and/or TLS;
* ``tensorstream_backend`` -- each of the above in turn (ids ``s3``, ``http``, ``redis``).

Every marker also takes ``env=True``: the backend's :attr:`~.Backend.env`
(``AWS_*``/``S3_*``, ``REDIS_*``, ``TENSORSTREAM_HTTP_TOKEN``...) is set for the
test, so loaders that read the environment reach it unmodified
(``backend.apply_env(monkeypatch)`` does the same from inside a test).

Servers live for the whole session and start on first use; every test gets
its own bucket or key prefix, and faults are reset after it, pass or fail.
This module imports only pytest at import time, so it costs nothing in test
runs that do not use it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from .backends import Backend, BackendServers, HTTPBackend, RedisBackend, S3Backend

REAL_REDIS_MARK = "tensorstream_real_redis"
HTTP_MARK = "tensorstream_http"
S3_MARK = "tensorstream_s3"
REDIS_MARK = "tensorstream_redis"
_MARK_ARGS = {
    S3_MARK: {"auth", "env"},
    HTTP_MARK: {"tls", "token", "env"},
    REDIS_MARK: {"password", "acl_user", "tls", "env"},
}
_ENV_PREFIXES = ("AWS_", "S3_", "REDIS_")
#: Single variables that carry credentials to an HTTP server (HOME's ~/.netrc is sandboxed too).
_ENV_NAMES = ("TENSORSTREAM_HTTP_TOKEN", "TENSORSTREAM_HTTP_TOKEN_HOSTS", "NETRC", "REDISCLI_AUTH")


def _rewrite_only_the_test_helpers() -> None:
    """Take the library out of pytest's assertion rewriting; keep ``tensorstream.testing``.

    pytest rewrites every package of a distribution that declares a ``pytest11``
    entry point, so with this plugin installed it recompiled all of tensorstream
    through ``ast`` on import in every test run, also a project's that never
    uses the fixtures. The library imports some modules on first use in worker
    threads, and two threads using ``ast`` at once can raise ``SystemError: AST
    constructor recursion depth mismatch`` on CPython 3.11 (gh-106905): a test
    failed now and then for it. The library's own asserts need no rewriting;
    the conformance checks in ``tensorstream.testing`` keep pytest's messages.
    Best effort: pytest keeps the marks in a private set."""
    for finder in sys.meta_path:
        marked = getattr(finder, "_must_rewrite", None)
        if type(finder).__name__ != "AssertionRewritingHook" or not isinstance(marked, set):
            continue
        if "tensorstream" in marked:
            marked.discard("tensorstream")
            marked.add(__name__.rpartition(".")[0])  # tensorstream.testing
            cache = getattr(finder, "_marked_for_rewrite_cache", None)
            if isinstance(cache, dict):
                cache.clear()


_rewrite_only_the_test_helpers()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("tensorstream", "tensorstream mocked backends")
    group.addoption(
        "--tensorstream-require-real-redis", action="store_true", default=False,
        help="fail (instead of using fakeredis) when redis-server is not installed",
    )
    group.addoption(
        "--tensorstream-redis", choices=("auto", "real", "fake"), default=None,
        help="which Redis serves tensorstream_redis: redis-server if installed (auto), "
             "always redis-server (real), or always fakeredis (fake)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{REAL_REDIS_MARK}: this test needs Debian's redis-server, not fakeredis"
    )
    config.addinivalue_line(
        "markers", f"{HTTP_MARK}(tls=False, token=None, env=False): configure the "
                   "tensorstream_http server (token=True makes one up)"
    )
    config.addinivalue_line(
        "markers", f"{S3_MARK}(auth=True, env=False): auth=False serves S3 without "
                   "signature checks; env=True sets AWS_*/S3_* for the test"
    )
    config.addinivalue_line(
        "markers", f"{REDIS_MARK}(password=None, acl_user=None, tls=False, env=False): a "
                   "redis-server with a password (True makes one up), an ACL user and/or TLS"
    )


@pytest.fixture(scope="session")
def tensorstream_servers(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[BackendServers]:
    """The session's lazily started servers (used by the backend fixtures)."""
    from .backends import BackendServers

    mode = request.config.getoption("--tensorstream-redis") or "auto"
    if request.config.getoption("--tensorstream-require-real-redis"):
        mode = "real"
    servers = BackendServers(redis=mode)
    servers.sandbox = str(tmp_path_factory.mktemp("tensorstream-sandbox"))
    try:
        yield servers
    finally:
        servers.close()


class _Sandbox:
    """One test's empty ``HOME``, and whether the environment is isolated yet."""

    def __init__(self, home: str) -> None:
        self.home = home
        self.isolated = False


@pytest.fixture
def _tensorstream_home(tensorstream_servers: BackendServers) -> Iterator[_Sandbox]:
    """An empty ``HOME`` (holding the empty AWS config file) for one test, removed
    after it. One directory for the session let a ``~/.netrc`` or credentials file
    that a test wrote reach every later test."""
    import shutil
    import tempfile

    home = tempfile.mkdtemp(prefix="home-", dir=tensorstream_servers.sandbox)
    outside = _take_boto3_default_session()
    try:
        yield _Sandbox(home)
    finally:
        boto3: Any = sys.modules.get("boto3")
        if boto3 is not None:
            boto3.DEFAULT_SESSION = outside
        shutil.rmtree(home, ignore_errors=True)


def _take_boto3_default_session() -> Any:
    """Set boto3's process-wide default session aside for one test; returns it.

    ``boto3.client()`` uses that session, which keeps the credentials it first
    found: serving code written so (the environment mode) used the keys of a
    session made before the test (the developer's own, sent to the test server)
    or by an earlier test (another server's). The test makes its own in its
    isolated environment; the one set aside is put back after it (``None`` too:
    the test's must not reach later tests)."""
    boto3: Any = sys.modules.get("boto3")  # not imported here: it costs a second and may be absent
    if boto3 is None:
        return None
    outside = boto3.DEFAULT_SESSION
    boto3.DEFAULT_SESSION = None
    return outside


def _isolate(monkeypatch: pytest.MonkeyPatch, sandbox: _Sandbox) -> None:
    """No real credentials or endpoints in, nothing out: ``AWS_*``/``S3_*``/``REDIS_*``,
    ``TENSORSTREAM_HTTP_TOKEN`` (and its ``_HOSTS``), ``NETRC`` and ``REDISCLI_AUTH`` removed, AWS
    config files empty, ``HOME``
    an empty directory, no instance metadata, and no proxy from the environment for
    loopback traffic."""
    from .s3_server import isolated_s3_env

    # Once per test: a second backend fixture isolating again removed the variables
    # the first one's env=True (or the test) had just set.
    if sandbox.isolated:
        return
    sandbox.isolated = True
    for name in list(os.environ):
        if name.startswith(_ENV_PREFIXES) or name in _ENV_NAMES:
            monkeypatch.delenv(name, raising=False)
    for name, value in isolated_s3_env(sandbox.home).items():
        monkeypatch.setenv(name, value)
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.setenv(name, "127.0.0.1,localhost")


def _closing(backend: Backend, monkeypatch: pytest.MonkeyPatch, env: bool) -> Iterator[Any]:
    try:
        if env:
            backend.apply_env(monkeypatch)
        yield backend
    finally:
        errors = backend.faults.hook_errors
        backend.close()
    if errors:
        # A hook runs on the proxy's loop: what it raised only failed that request or
        # connection, which the client's retry hid. It fails the test here instead.
        raise AssertionError(f"a fault hook on {backend.name}'s faults.raw raised "
                             f"{len(errors)} time(s) during the test; the first: "
                             f"{errors[0]!r}") from errors[0]


#: Settings that are switches: a string such as ``"no"`` would be taken as true.
_BOOL_ARGS = ("auth", "tls", "env")
#: Settings that take ``True`` (made up), ``False``/``None`` (none) or the string itself.
_SECRET_ARGS = ("token", "password")


def _settings(request: pytest.FixtureRequest, mark: str) -> dict[str, Any]:
    """The markers' keywords (module, class, test: the closest wins), then indirect
    parametrisation's dict (which wins over them).

    Anything else is refused rather than ignored: a positional marker argument
    (``tensorstream_s3(False)``) or a non-dict parameter used to leave the
    default server in place, so the test silently ran against the wrong one."""
    names = ", ".join(sorted(_MARK_ARGS[mark]))
    kwargs: dict[str, Any] = {}
    # Every marker, the module's, then the class's, then the test's own (each overrides
    # the one before): only the closest was read, so a test's own marker silently dropped
    # its class's tls=True or its module's env=True.
    for marker in reversed(list(request.node.iter_markers(mark))):
        if marker.args:
            raise TypeError(f"{mark} takes keyword arguments only ({names}), not "
                            f"{', '.join(map(repr, marker.args))}: e.g. {mark}(tls=True)")
        kwargs.update(marker.kwargs)
    if hasattr(request, "param"):
        if not isinstance(request.param, dict):
            raise TypeError(f"indirect parametrisation of {mark} takes a dict of {names}, "
                            f"not {request.param!r}: e.g. [{{'tls': True}}]")
        kwargs.update(request.param)
    unknown = set(kwargs) - _MARK_ARGS[mark]
    if unknown:
        raise TypeError(f"{mark} takes {names}, not {', '.join(sorted(unknown))}")
    for name in _BOOL_ARGS:
        if name in kwargs and not isinstance(kwargs[name], bool):
            raise TypeError(f"{mark}({name}=...) takes True or False, not {kwargs[name]!r}")
    # Checked here, not where the server starts: password=123 failed there as "'int'
    # object is not iterable", token=123 only at the test's first read.
    for name in _SECRET_ARGS:
        if name in kwargs and not isinstance(kwargs[name], (bool, str, type(None))):
            raise TypeError(f"{mark}({name}=...) takes True, False or a string, "
                            f"not {kwargs[name]!r}")
    user = kwargs.get("acl_user")
    pair = (isinstance(user, (tuple, list)) and len(user) == 2
            and all(isinstance(x, str) for x in user))
    if not (pair or isinstance(user, (bool, str, type(None)))):
        raise TypeError(f"{mark}(acl_user=...) takes True, False, a user name or a "
                        f"(name, password) pair of strings, not {user!r}")
    return kwargs


@pytest.fixture
def tensorstream_s3(
    tensorstream_servers: BackendServers, monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest, _tensorstream_home: _Sandbox,
) -> Iterator[S3Backend]:
    """A fresh bucket on moto's S3 server, reached through a fault proxy.

    The server checks SigV4 signatures: only ``options``' keys (or ``env``'s)
    are accepted, a wrong key or secret fails as on real S3.
    ``@pytest.mark.tensorstream_s3(auth=False)`` gives a server that accepts
    any key. The environment is isolated for the test (as for every backend
    fixture): ``AWS_*``/``S3_*``/``REDIS_*`` variables are removed, AWS config
    and credential files point at an empty file, ``HOME`` at an empty
    directory and instance metadata is disabled; all restored after the test.
    """
    kwargs = _settings(request, S3_MARK)
    env = bool(kwargs.pop("env", False))
    backend = _started(lambda: tensorstream_servers.s3(**kwargs))
    _isolate(monkeypatch, _tensorstream_home)
    yield from _closing(backend, monkeypatch, env)


@pytest.fixture
def tensorstream_http(
    tensorstream_servers: BackendServers, monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest, _tensorstream_home: _Sandbox,
) -> Iterator[HTTPBackend]:
    """A key prefix on an aiohttp object server with Range and ETag support.

    Configure with ``@pytest.mark.tensorstream_http(tls=True, token=True)`` or
    indirect parametrisation with a dict of the same keywords.
    """
    kwargs = _settings(request, HTTP_MARK)
    env = bool(kwargs.pop("env", False))
    backend = _started(lambda: tensorstream_servers.http(**kwargs))
    _isolate(monkeypatch, _tensorstream_home)
    yield from _closing(backend, monkeypatch, env)


@pytest.fixture
def tensorstream_redis(
    tensorstream_servers: BackendServers, monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest, _tensorstream_home: _Sandbox,
) -> Iterator[RedisBackend]:
    """A key prefix on Redis (``.kind``: ``"redis-server"`` or ``"fakeredis"``),
    reached through a TCP fault proxy.

    ``@pytest.mark.tensorstream_real_redis`` or ``--tensorstream-require-real-redis``
    make a missing ``redis-server`` an error instead of a fallback.
    ``@pytest.mark.tensorstream_redis(password=True, acl_user=True, tls=True)``
    (any of them) gives a ``redis-server`` with a password, an ACL user and/or
    TLS; ``options`` and ``env`` carry the credentials and CA bundle.
    """
    kwargs = _settings(request, REDIS_MARK)
    env = bool(kwargs.pop("env", False))
    secured = any(kwargs.get(k) for k in ("password", "acl_user", "tls"))
    if secured:
        from .redis_server import redis_available

        if not redis_available():
            pytest.fail(f"{REDIS_MARK}({', '.join(sorted(kwargs))}) needs Debian's redis-server "
                        "(fakeredis has no TLS or ACL users): apt-get install redis-server",
                        pytrace=False)
    require_real = (request.node.get_closest_marker(REAL_REDIS_MARK) is not None
                    or request.config.getoption("--tensorstream-require-real-redis"))
    backend = _started(lambda: tensorstream_servers.redis(**kwargs))
    if require_real and backend.kind != "redis-server":
        backend.close()
        # Which of the two, and what to do about it: the message named both, and no fix.
        why = ("--tensorstream-redis=fake was given: drop it"
               if tensorstream_servers.redis_mode == "fake" else
               "redis-server and redis-cli are not on PATH: apt-get install redis-server")
        pytest.fail(f"this test requires Debian's redis-server (tensorstream_real_redis), "
                    f"but {why}", pytrace=False)
    _isolate(monkeypatch, _tensorstream_home)
    yield from _closing(backend, monkeypatch, env)


def _started(backend: Callable[[], Any]) -> Any:
    """``backend()``, or this test's one-line error when its server did not start
    (now or earlier in the session: the failure sticks, see ``start_once``)."""
    from .redis_server import RedisUnavailable
    from .start_once import ServerStartError

    try:
        return backend()
    except ServerStartError as exc:
        failed = exc
    # (Out of the except block: pytest would show the chain of causes, tracebacks and all.)
    if isinstance(failed.cause, RedisUnavailable):
        # --tensorstream-redis=real without redis-server: say so and how to fix it.
        pytest.fail("--tensorstream-redis=real (or --tensorstream-require-real-redis) "
                    "needs Debian's redis-server and redis-cli on PATH, which has "
                    "neither: apt-get install redis-server, or drop the option to use "
                    "fakeredis", pytrace=False)
    # The cause in one line, without a traceback through the plugin's internals.
    pytest.fail(str(failed), pytrace=False)


@pytest.fixture(params=["s3", "http", "redis"])
def tensorstream_backend(request: pytest.FixtureRequest) -> Backend:
    """Each mocked backend in turn (ids ``s3``, ``http``, ``redis``). Faults a
    backend cannot inject (e.g. ``status_script`` on Redis) skip the test."""
    backend: Backend = request.getfixturevalue(f"tensorstream_{request.param}")
    backend.faults.on_unsupported = _skip
    return backend


def _skip(message: str) -> None:
    pytest.skip(message)
