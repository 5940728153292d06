"""Fault controls of the mocked backends (:mod:`tensorstream.testing.backends`).

Every backend's ``faults`` is a :class:`Faults`; the subclasses here map its
common methods onto the server or proxy underneath (the HTTP test server
itself, an HTTP proxy in front of moto, a TCP proxy in front of Redis).
Import them from :mod:`tensorstream.testing.backends`, which re-exports
:class:`Faults` and :class:`UnsupportedFault`.
"""

from __future__ import annotations

import asyncio
import difflib
import math
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from ..errors import ConfigurationError

if TYPE_CHECKING:
    from .http_backend import HTTPBackend
    from .redis_backend import RedisBackend
    from .s3_backend import S3Backend

__all__ = ["FAULT_NAMES", "Faults", "UnsupportedFault"]

FAULT_NAMES = ("latency", "rate_limit", "drop_after", "status_script", "ignore_range",
               "replace_between_reads")


class UnsupportedFault(NotImplementedError):
    """A fault that makes no sense for a backend (e.g. an HTTP status on Redis)."""


def _seconds(fault: str, value: Any) -> float:
    """A finite, non-negative number of seconds (a negative or NaN one used to be
    taken as "no delay", an infinite one hung every request)."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if isinstance(value, bool) or not math.isfinite(seconds) or seconds < 0:
        raise ConfigurationError(f"faults.{fault}: {value!r} is not a number of seconds "
                                 "(finite, 0 or more)")
    return seconds


def _count(fault: str, value: Any, *, least: int) -> int:
    """A whole number >= ``least`` (a fraction would be truncated, e.g. a rate of 0.5
    to 0, which meant no cap at all)."""
    whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if isinstance(value, bool) or not whole:
        raise ConfigurationError(f"faults.{fault}: {value!r} is not a whole number")
    if value < least:
        raise ConfigurationError(f"faults.{fault}: {value!r} is less than {least}")
    return int(value)


def _statuses(statuses: Any) -> list[int]:
    """HTTP error/redirect statuses to script (2xx entries mean "then succeed")."""
    if isinstance(statuses, (int, str, bytes)) or not hasattr(statuses, "__iter__"):
        raise ConfigurationError(f"faults.status_script takes a list of statuses, e.g. "
                                 f"[503, 503, 200], not {statuses!r}")
    out = []
    for status in statuses:
        if isinstance(status, bool) or not isinstance(status, int) or not 200 <= status <= 599:
            raise ConfigurationError(f"faults.status_script: {status!r} is not an HTTP status "
                                     "from 200 to 599")
        out.append(status)
    return out


# ------------------------------------------------------------------ faults
class Faults:
    """Fault controls shared by every backend. Methods chain and apply to the
    next requests; :meth:`reset` (automatic between tests) restores good service.

    * ``latency(s)`` -- every request waits ``s`` seconds first;
    * ``rate_limit(bps)`` -- what the server sends (each response body, each Redis
      connection's answers) is paced to ``bps`` bytes/s; uploads are not;
    * ``drop_after(n, times=None)`` -- response bodies/connections are cut after the
      server sent ``n`` bytes, on the next ``times`` of them (``None``: all); uploads
      are not cut;
    * ``status_script([503, 503])`` -- the next requests get these statuses (HTTP, S3);
    * ``ignore_range()`` -- ranged GETs are answered 200 with the whole body (HTTP, S3);
    * ``replace_between_reads(key, data)`` -- the object is replaced after its first read.
    """

    #: Faults this backend cannot inject, with the reason.
    unsupported: ClassVar[dict[str, str]] = {}

    def __init__(self, backend: str, raw: Any) -> None:
        self.backend = backend
        #: The fault settings and counters of the server or proxy underneath.
        self._f = raw
        #: Called with a message for an unsupported fault; the default raises
        #: :class:`UnsupportedFault` (the plugin's ``tensorstream_backend`` skips instead).
        self.on_unsupported: Callable[[str], Any] | None = None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} of {self.backend}>"

    #: The only attributes a test may set (the rest are methods or read-only).
    _SETTABLE: ClassVar[frozenset[str]] = frozenset({"backend", "_f", "_b", "on_unsupported"})

    def __getattr__(self, name: str) -> Any:
        # Only called for a name that is not there (``faults.lantency(1)``): pytest
        # printed the internal class's name and no hint.
        if name.startswith("_"):
            raise AttributeError(name)
        public = [n for n in dir(type(self)) if not n.startswith("_")]
        close = difflib.get_close_matches(name, public, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise AttributeError(f"faults.{name}: no such fault; {hint}the common faults are "
                             f"{', '.join(FAULT_NAMES)}; a backend's own settings are on "
                             f"faults.raw (here {type(self._f).__name__})")

    def __setattr__(self, name: str, value: Any) -> None:
        # ``faults.latency = 0.5`` used to shadow the method and inject nothing;
        # ``faults.gzip = True`` (a setting of faults.raw) was stored and ignored.
        if name not in self._SETTABLE:
            if name in FAULT_NAMES:
                raise AttributeError(f"faults.{name} is a method: call faults.{name}(...), "
                                     f"e.g. faults.latency(0.5)")
            raise AttributeError(f"faults.{name} is not a fault of the common API "
                                 f"({', '.join(FAULT_NAMES)}); a backend's own settings are "
                                 f"on faults.raw (here {type(self._f).__name__}), "
                                 f"e.g. faults.raw.{name} = ...")
        super().__setattr__(name, value)

    def supports(self, fault: str) -> bool:
        """Whether ``fault`` (a method name above) can be injected on this backend."""
        if fault not in FAULT_NAMES:
            raise ValueError(f"unknown fault {fault!r}; known: {', '.join(FAULT_NAMES)}")
        return self._why_unsupported(fault) is None

    def _why_unsupported(self, fault: str) -> str | None:
        """Why ``fault`` cannot be injected here, or ``None`` when it can."""
        return self.unsupported.get(fault)

    def _check(self, fault: str) -> None:
        why = self._why_unsupported(fault)
        if why is not None:
            msg = f"{self.backend} backend: {fault} does not apply ({why})"
            if self.on_unsupported is not None:
                self.on_unsupported(msg)
            raise UnsupportedFault(msg)

    # Values are checked before the fault applies: a bad one raises
    # ConfigurationError (a ValueError) naming the fault, never a silent no-op.
    def latency(self, seconds: float) -> Faults:
        seconds = _seconds("latency", seconds)
        self._check("latency")
        self._latency(seconds)
        return self

    def rate_limit(self, bytes_per_second: int) -> Faults:
        bps = _count("rate_limit", bytes_per_second, least=1)
        self._check("rate_limit")
        self._rate_limit(bps)
        return self

    def drop_after(self, n_bytes: int, *, times: int | None = None) -> Faults:
        n = _count("drop_after", n_bytes, least=0)
        times = None if times is None else _count("drop_after(times=)", times, least=1)
        self._check("drop_after")
        self._drop_after(n, times)
        return self

    def status_script(self, statuses: list[int], *, retry_after: float | None = None) -> Faults:
        """Answer the next ``len(statuses)`` requests with these statuses (then serve
        normally); a 2xx entry serves its request normally (``[200, 503]``: the second
        request fails), a trailing one just means "then succeed"."""
        script = _statuses(statuses)
        # Only trailing 2xx entries go: dropping them all made [200, 503] fail the
        # first request instead of the second.
        while script and 200 <= script[-1] < 300:
            script.pop()
        if retry_after is not None:
            retry_after = _seconds("status_script(retry_after=)", retry_after)
        self._check("status_script")
        self._status_script(script, retry_after)
        return self

    def ignore_range(self) -> Faults:
        self._check("ignore_range")
        self._ignore_range()
        return self

    def replace_between_reads(self, key: str, new_data: bytes) -> Faults:
        self._check("replace_between_reads")
        self._replace_between_reads(key, bytes(new_data))
        return self

    def reset(self) -> None:
        """Back to a well-behaved backend."""
        self._f.reset()

    @property
    def raw(self) -> Any:
        """The fault settings of the server or proxy underneath, for the faults
        beyond the common ones (``docs/testing.md`` lists them per backend):
        HTTP's ``HTTPFaults`` (``wrong_content_range``, ``gzip``,
        ``stall_after_headers``...), S3's ``HTTPProxyFaults``, Redis's
        ``TCPFaults`` (``use_rst``, ``refuse``, ``stall``...). Reset after each test."""
        return self._f

    @property
    def dropped(self) -> int:
        """How many connections/responses ``drop_after`` has cut so far."""
        return int(self._f.dropped)

    @property
    def hook_errors(self) -> list[BaseException]:
        """What a hook on :attr:`raw` (S3's ``before_forward``, Redis's ``on_client_data``)
        raised other than ``ConnectionError``; the pytest plugin fails the test with
        the first at its teardown."""
        return list(getattr(self._f, "hook_errors", []))

    @property
    def pending_statuses(self) -> list[int]:
        """Scripted statuses not yet served (empty once the script has played out)."""
        return list(getattr(self._f, "status_script", []))

    # Every server/proxy underneath names these settings alike.
    def _latency(self, seconds: float) -> None:
        self._f.latency = seconds

    def _rate_limit(self, bps: int) -> None:
        self._f.rate_limit = bps

    def _drop_after(self, n: int, times: int | None) -> None:
        self._f.drop_after, self._f.drop_times = n, times

    def _status_script(self, statuses: list[int], retry_after: float | None) -> None:
        self._f.status_script, self._f.retry_after = list(statuses), retry_after

    def _ignore_range(self) -> None:
        self._f.ignore_range = True

    def _replace_between_reads(self, key: str, data: bytes) -> None:
        raise NotImplementedError


class _HTTPServerFaults(Faults):
    """Faults of :class:`~tensorstream.testing.http_server.HTTPTestServer` itself."""

    def __init__(self, backend: HTTPBackend) -> None:
        super().__init__("http", backend.server.faults)
        self._b = backend

    def _replace_between_reads(self, key: str, data: bytes) -> None:
        # The server counts GETs of one key (its fault filter), so other faults
        # set in the same test then apply to this key only.
        self._f.key = self._b.key(key)
        self._f.replace_after_requests = 1
        self._f.replace_with = data
        # Counted from now, as on S3 and Redis: the GETs made before (the server
        # counts them all) had the next read replaced, and a second fault never fired.
        self._f.gets, self._f.replaced = 0, False


class _S3ProxyFaults(Faults):
    """Faults applied by an HTTP proxy in front of moto."""

    def __init__(self, backend: S3Backend) -> None:
        super().__init__("s3", backend.proxy.faults)
        self._b = backend

    # Downloads only, as docs/testing.md says: the proxy paced and cut every answer, so a
    # multipart upload's XML answers were cut by drop_after(10) and the write failed.
    # (faults.raw's settings alone still act on every answer.)
    def _rate_limit(self, bps: int) -> None:
        self._f.rate_limit, self._f.shaped_methods = bps, ("GET",)

    def _drop_after(self, n: int, times: int | None) -> None:
        self._f.drop_after, self._f.drop_times, self._f.shaped_methods = n, times, ("GET",)

    def _ignore_range(self) -> None:
        self._f.ignore_range = True
        if self._b.auth:
            # Range is signed: stripping it would fail the signature check. The proxy
            # keeps it and answers 200 with the whole object itself.
            def whole(path: str) -> bytes:
                # ``path`` is already decoded (aiohttp's request.path): decoding it
                # again read x%41y.bin's answer from xAy.bin.
                bucket, _, key = path.lstrip("/").partition("/")
                return bytes(self._b.server.get(bucket, key))

            self._f.whole_body = whole

    def _replace_between_reads(self, key: str, data: bytes) -> None:
        target = f"/{self._b.bucket}/{key.lstrip('/')}"
        replace_once = _ReplaceOnce(lambda: self._b.put(key, data))

        async def hook(method: str, path: str) -> None:
            if method == "GET" and path == target:
                await replace_once.on_read()

        self._f.before_forward = hook


class _RedisProxyFaults(Faults):
    """Faults applied by a TCP proxy in front of the Redis server."""

    unsupported: ClassVar[dict[str, str]] = {
        "status_script": "Redis has no HTTP statuses",
        "ignore_range": "Redis has no Range header",
    }

    def __init__(self, backend: RedisBackend) -> None:
        super().__init__("redis", backend.proxy.faults)
        self._b = backend

    def _why_unsupported(self, fault: str) -> str | None:
        if fault == "replace_between_reads" and self._b.tls:
            # It spots a read by the command bytes going through the proxy; under TLS
            # they are encrypted, so the object would silently never be replaced.
            return "the TCP proxy sees only encrypted bytes with tls=True"
        return super()._why_unsupported(fault)

    def _replace_between_reads(self, key: str, data: bytes) -> None:
        # A "read" is a burst of client bytes with GETRANGE on one of the object's chunk
        # keys, a whole RESP argument "<path>:<generation>:<offset>". A bare "<path>:"
        # substring also matched the chunks of "<path>:v2", so reading another key
        # replaced this one before its first read.
        path = self._b.key(key).encode("utf-8", "surrogateescape")
        chunk_arg = re.compile(rb"\r\n" + re.escape(path) + rb":[0-9a-f]{16}:\d+\r\n")
        replace_once = _ReplaceOnce(lambda: self._b.put(key, data))

        async def hook(chunk: bytes) -> None:
            if b"GETRANGE" in chunk.upper() and chunk_arg.search(chunk):
                await replace_once.on_read()

        self._f.on_client_data = hook


class _ReplaceOnce:
    """Replace an object just before its second read; later reads wait for it."""

    def __init__(self, replace: Callable[[], None]) -> None:
        self._replace = replace
        self._reads = 0
        self._done: asyncio.Event | None = None

    async def on_read(self) -> None:
        self._reads += 1
        if self._done is None:
            self._done = asyncio.Event()
        if self._reads == 2:
            try:
                await asyncio.get_running_loop().run_in_executor(None, self._replace)
            finally:
                self._done.set()
        elif self._reads > 2:
            await self._done.wait()
