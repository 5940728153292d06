"""Servers the harness starts on free loopback ports and always stops.

The links of the matrix (each answers HTTP ``GET``/``HEAD``/``Range`` and
path-style S3 -- ``HEAD``/ranged ``GET`` of ``/bucket/key`` with any signature
ignored, and ``ListObjectsV2`` of ``/bucket?list-type=2&prefix=...``):

* ``loopback``: nginx with a generated config serving a directory, unlimited.
  Bucket-level requests (listings) go to a ``plain`` static server beside it,
  which writes nginx's ``ETag`` format so listings and ``HEAD`` agree.
* ``paced``: aiohttp ``FileResponse`` (sendfile) that sets ``SO_MAX_PACING_RATE``
  on every connection, so the kernel paces each connection at ``rate`` bytes/s
  from the first byte.
* ``bucket``: a token bucket per connection -- ``burst`` bytes at full speed,
  then ``rate`` bytes/s; an idle connection earns its burst back at ``rate``.
  The body is written in 256 KiB chunks with sleeps, as a shaping proxy would.
* ``ttfb``: every request (``HEAD``, ``GET``, listing) waits 20-50 ms
  (uniform, seeded) before its first byte, then is unlimited (sendfile).
* ``moto``: moto's S3 server (correct, slow: small objects only).

Links the matrix does not run by default (``--links store,step,shared,limited``):
shapes an independent harness may use, to check that nothing was tuned to the
five above.

* ``store``: an object store's shape: every request waits 20-50 ms before its
  first byte (as ``ttfb``) and every connection is then paced at ``rate``
  (as ``paced``).
* ``step``: a link whose speed changes while a load runs: each connection's
  rate alternates every 0.5 s between ``rate`` / 4 and ``rate`` x 2 (one
  clock for all connections), written in 256 KiB chunks with sleeps.
* ``shared``: one cap for all connections together (``rate`` x 16 bytes/s in
  all, a shared token bucket), none per connection: more connections add
  nothing.
* ``tls``: the ``loopback`` link over HTTPS (nginx, TLS 1.2/1.3, a certificate
  for 127.0.0.1 from a throwaway CA whose certificate contenders trust through
  ``SSL_CERT_FILE``, ``CURL_CA_BUNDLE`` and ``AWS_CA_BUNDLE``): real object
  stores are HTTPS, and decrypting is work the other links never ask for.
* ``limited``: at most 8 requests in flight; any beyond get S3's ``503
  SlowDown`` at once (as S3 answers a prefix that is asked too much), the
  rest are paced at ``rate`` per connection (256 KiB chunks with sleeps).

Plus Debian's ``redis-server`` (no persistence). Static servers run as their
own process: ``python -m benchmarks.servers static ROOT PORT --mode MODE ...``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

__all__ = [
    "LINKS",
    "Server",
    "bench_aws_env",
    "PortTaken",
    "free_port",
    "owns_port",
    "serve_on_a_free_port",
    "start_link",
    "start_moto",
    "start_nginx",
    "start_paced",
    "start_redis",
    "start_static",
]

LINKS = ("loopback", "paced", "bucket", "ttfb", "moto")

SO_MAX_PACING_RATE = getattr(socket, "SO_MAX_PACING_RATE", 47)


def bench_aws_env(work: Path) -> dict[str, str]:
    """The environment for a child that talks to local S3 stand-ins (nginx, moto):
    dummy credentials, and no AWS config file or instance-metadata lookup that would
    make the run depend on the machine."""
    return {**os.environ, "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
            "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_CONFIG_FILE": str(work / "none"),
            "AWS_SHARED_CREDENTIALS_FILE": str(work / "none")}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: Ports a server start tries: one free when picked may be taken by another
#: process before the server binds it.
_PORT_ATTEMPTS = 5


class PortTaken(RuntimeError):
    """Another process took the port between its pick and the server's bind."""


def _listening_inodes(port: int) -> set[str]:
    """The socket inodes listening on TCP ``port`` (from /proc/net)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if int(cols[1].rsplit(":", 1)[1], 16) == port and cols[3] == "0A":  # LISTEN
                found.add(cols[9])
    return found


def _holds(pid: int, inodes: set[str]) -> bool:
    """Whether process ``pid`` or one of its children holds one of the sockets."""
    pids = [pid]
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                pids += [int(c) for c in f.read().split()]
    except OSError:
        pass
    for p in pids:
        try:
            for fd in os.listdir(f"/proc/{p}/fd"):
                link = os.readlink(f"/proc/{p}/fd/{fd}")
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    return True
        except OSError:
            continue
    return False


def owns_port(pid: int, port: int) -> bool:
    """Whether ``pid`` (or a child) is what listens on ``port``; True where /proc
    cannot tell (another system)."""
    if not os.path.isdir("/proc/net"):
        return True
    inodes = _listening_inodes(port)
    return bool(inodes) and _holds(pid, inodes)


def serve_on_a_free_port(name: str, argv_for: Callable[[int], Sequence[str]],
                         **popen: object) -> Server:
    """A :class:`Server` named ``name`` running ``argv_for(port)`` on a free port,
    started again on another while a port is taken before the bind (bounded)."""
    last: PortTaken | None = None
    for _ in range(_PORT_ATTEMPTS):
        port = free_port()
        try:
            return Server(name, argv_for(port), port, **popen)
        except PortTaken as exc:
            last = exc
    raise RuntimeError(f"{name} found no free port in {_PORT_ATTEMPTS} tries: {last}")


class Server:
    """A child process serving on ``port``; ``stop()`` is idempotent and always kills."""

    def __init__(self, name: str, argv: Sequence[str], port: int, **popen: object) -> None:
        self.name = name
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self._log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            list(argv),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C reaches the harness, which stops us
            **popen,  # type: ignore[call-overload]
        )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                said = self.log_tail()
                if "address already in use" in said.lower():
                    raise PortTaken(f"{self.name} on {self.port}: {said[-300:]}")
                raise RuntimeError(f"{self.name} exited early:\n{said}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    pass
            except OSError:
                time.sleep(0.05)
                continue
            # (what answers may be another process that took the port first: this
            # server then exits, or retries its bind, as nginx does for 2.5 s)
            if owns_port(self.proc.pid, self.port):
                return
            time.sleep(0.05)
        if not owns_port(self.proc.pid, self.port) and _listening_inodes(self.port):
            raise PortTaken(f"another process listens on {self.port}")
        raise RuntimeError(f"{self.name} did not listen on {self.port} in {timeout}s")

    def log_tail(self) -> str:
        self._log.seek(0)
        return self._log.read()[-2000:].decode(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, 15)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait(5)
        self._log.close()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


_NGINX_CONF = """\
{user}
worker_processes {workers};
daemon off;
master_process on;
pid {work}/nginx.pid;
error_log {work}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {work}/body;
    proxy_temp_path {work}/proxy;
    fastcgi_temp_path {work}/fastcgi;
    uwsgi_temp_path {work}/uwsgi;
    scgi_temp_path {work}/scgi;
    default_type application/octet-stream;
    sendfile on;
    tcp_nopush on;
    keepalive_requests 1000000;
    keepalive_timeout 120s;
    etag on;
    server {{
        listen 127.0.0.1:{port}{ssl};
        {certs}
        root {root};
        location / {{ }}
        # bucket-level S3 requests (ListObjectsV2, HEAD bucket): the static helper answers
        location ~ ^/[^/]+/?$ {{ {bucket_ops} }}
    }}
}}
"""


def start_nginx(root: Path, work: Path, workers: int | None = None, bucket_ops: str | None = None,
                tls: bool = False) -> Server:
    """nginx serving ``root`` on a free port (unlimited: the loopback link); bucket-level
    requests are proxied to ``bucket_ops`` (a static server's URL) when given. ``tls``:
    HTTPS with a certificate for 127.0.0.1 from a throwaway CA (trustme), whose
    certificate is ``work / "ca.pem"``."""
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    work.mkdir(parents=True, exist_ok=True)
    certs = ""
    if tls:
        import trustme

        ca = trustme.CA()
        cert = ca.issue_cert("127.0.0.1", "localhost")
        ca.cert_pem.write_to_path(str(work / "ca.pem"))
        cert.private_key_and_cert_chain_pem.write_to_path(str(work / "server.pem"))
        certs = (f"ssl_certificate {work}/server.pem; ssl_certificate_key {work}/server.pem; "
                 "ssl_protocols TLSv1.2 TLSv1.3;")
    conf = work / "nginx.conf"

    def argv(port: int) -> list[str]:
        conf.write_text(
            _NGINX_CONF.format(
                user="user root;" if os.geteuid() == 0 else "",
                workers=workers or os.cpu_count() or 1,
                work=work,
                port=port,
                root=root,
                bucket_ops=f"proxy_pass {bucket_ops};" if bucket_ops else "return 404;",
                ssl=" ssl" if tls else "",
                certs=certs,
            )
        )
        return [nginx, "-e", str(work / "error.log"), "-c", str(conf)]

    srv = serve_on_a_free_port("nginx", argv)
    if tls:
        srv.url = f"https://127.0.0.1:{srv.port}"
    return srv


def start_static(
    root: Path,
    mode: str = "plain",
    *,
    rate: int = 0,
    burst: int = 0,
    ttfb: tuple[float, float] = (0.02, 0.05),
    etag: str = "aiohttp",
    request_log: Path | None = None,
) -> Server:
    """The aiohttp static server in ``mode`` (plain, paced, bucket, ttfb) on a free port.
    ``request_log``: append one line per request (arrival and answer times, method,
    path, Range) to this file."""
    def argv(port: int) -> list[str]:
        out = [sys.executable, "-m", "benchmarks.servers", "static", str(root), str(port),
               "--mode", mode]
        out += ["--rate", str(rate), "--burst", str(burst), "--etag", etag]
        out += ["--ttfb", f"{ttfb[0]},{ttfb[1]}"]
        if request_log is not None:
            out += ["--request-log", str(request_log)]
        return out

    return serve_on_a_free_port(mode, argv, cwd=str(Path(__file__).resolve().parent.parent))


def start_paced(root: Path, rate: int) -> Server:
    """The paced static server: every connection capped at ``rate`` bytes/s by the kernel."""
    return start_static(root, "paced", rate=rate)


def start_redis(work: Path) -> Server:
    """Debian's redis-server, no persistence, on a free port."""
    work.mkdir(parents=True, exist_ok=True)
    return serve_on_a_free_port("redis", lambda port: [
        shutil.which("redis-server") or "/usr/bin/redis-server",
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        str(work),
        "--protected-mode",
        "no",
        "--proto-max-bulk-len",
        "2gb",
        "--client-output-buffer-limit",
        "normal 0 0 0",
    ])


def start_moto() -> Server:
    """moto's S3 server (correct but slow: small objects only)."""
    exe = Path(sys.executable).with_name("moto_server")
    return serve_on_a_free_port("moto", lambda port: [str(exe), "-H", "127.0.0.1", "-p",
                                                      str(port)])


def measure_one_connection(url: str, nbytes: int = 16 << 20) -> float:
    """Bytes/s of one connection reading ``nbytes`` (to check the cap holds)."""
    req = urllib.request.Request(url, headers={"Range": f"bytes=0-{nbytes - 1}"})
    start = time.perf_counter()
    got = 0
    with urllib.request.urlopen(req, timeout=120) as resp:
        while chunk := resp.read(1 << 20):
            got += len(chunk)
    return got / (time.perf_counter() - start)


class _Link:
    """A link's servers as one context manager (nginx also needs its listing helper)."""

    def __init__(self, servers: list[Server], url: str, note: str = "",
                 env: Mapping[str, str] | None = None) -> None:
        self.servers = servers
        self.url = url
        self.note = note
        #: What a client needs in its environment to use the link (trust for ``tls``).
        self.env = dict(env or {})

    def stop(self) -> None:
        for s in reversed(self.servers):
            s.stop()

    def __enter__(self) -> _Link:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_link(
    link: str,
    root: Path,
    work: Path,
    *,
    rate: int = 25_000_000,
    burst: int = 8 << 20,
    ttfb: tuple[float, float] = (0.02, 0.05),
) -> _Link:
    """Start the servers of ``link`` (one of :data:`LINKS`) serving ``root``."""
    if link == "loopback":
        helper = start_static(root, "plain", etag="nginx")
        try:
            nginx = start_nginx(root, work / "nginx", bucket_ops=helper.url)
        except BaseException:
            helper.stop()
            raise
        return _Link([helper, nginx], nginx.url, "nginx, unlimited")
    if link == "moto":
        moto = start_moto()
        return _Link([moto], moto.url, "moto S3 server")
    if link == "paced":
        s = start_static(root, "paced", rate=rate)
        return _Link([s], s.url, f"SO_MAX_PACING_RATE {rate / 1e6:g} MB/s per connection")
    if link == "bucket":
        s = start_static(root, "bucket", rate=rate, burst=burst)
        return _Link(
            [s], s.url, f"token bucket per connection: {burst >> 20} MiB burst, then {rate / 1e6:g} MB/s"
        )
    if link == "ttfb":
        s = start_static(root, "ttfb", ttfb=ttfb)
        return _Link([s], s.url, f"{ttfb[0] * 1e3:g}-{ttfb[1] * 1e3:g} ms before the first byte, unlimited")
    if link == "tls":
        helper = start_static(root, "plain", etag="nginx")
        try:
            nginx = start_nginx(root, work / "nginx-tls", bucket_ops=helper.url, tls=True)
        except BaseException:
            helper.stop()
            raise
        ca = str(work / "nginx-tls" / "ca.pem")
        return _Link([helper, nginx], nginx.url, "nginx over HTTPS (TLS 1.2/1.3), unlimited",
                     env={"SSL_CERT_FILE": ca, "CURL_CA_BUNDLE": ca, "AWS_CA_BUNDLE": ca,
                          "REQUESTS_CA_BUNDLE": ca})
    if link == "store":
        s = start_static(root, "store", rate=rate, ttfb=ttfb)
        return _Link([s], s.url, f"{ttfb[0] * 1e3:g}-{ttfb[1] * 1e3:g} ms before the first byte, "
                     f"then {rate / 1e6:g} MB/s per connection")
    if link == "step":
        s = start_static(root, "step", rate=rate)
        return _Link([s], s.url, f"per connection {rate / 4e6:g} and {rate * 2 / 1e6:g} MB/s, "
                     f"alternating every {_STEP_PERIOD:g} s")
    if link == "shared":
        s = start_static(root, "shared", rate=rate)
        return _Link([s], s.url, f"{rate * _SHARED_CONNECTIONS / 1e6:g} MB/s for all connections "
                     "together, none per connection")
    if link == "limited":
        s = start_static(root, "limited", rate=rate)
        return _Link([s], s.url, f"{_LIMITED_IN_FLIGHT} requests in flight at most (503 SlowDown "
                     f"beyond), each paced at {rate / 1e6:g} MB/s")
    raise ValueError(f"unknown link {link!r}")


# -- the static server (child process) ------------------------------------------
_CHUNK = 256 << 10
#: ``step``: seconds between rate changes.
_STEP_PERIOD = 0.5
#: ``shared``: the cap for all connections, in multiples of ``rate``.
_SHARED_CONNECTIONS = 16
#: ``limited``: requests in flight before 503 SlowDown.
_LIMITED_IN_FLIGHT = 8
_SLOW_DOWN = ("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SlowDown</Code>"
              "<Message>Please reduce your request rate.</Message></Error>")


def _etag(st: os.stat_result, style: str) -> str:
    if style == "nginx":  # nginx: hex mtime seconds - hex size
        return f'"{int(st.st_mtime):x}-{st.st_size:x}"'
    return f'"{st.st_mtime_ns:x}-{st.st_size:x}"'  # aiohttp FileResponse


def _list_xml(base: Path, bucket: str, query: Mapping[str, str], etag: str) -> str:
    """A ListObjectsV2 answer for ``bucket`` (a directory under ``base``)."""
    import datetime
    from xml.sax.saxutils import escape

    prefix = query.get("prefix", "")
    delim = query.get("delimiter", "")
    start_after = query.get("continuation-token") or query.get("start-after", "")
    max_keys = int(query.get("max-keys", "1000"))
    root = base / bucket
    keys = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    contents: list[str] = []
    prefixes: list[str] = []
    truncated = False
    last = ""
    for key in keys:
        if not key.startswith(prefix) or key <= start_after:
            continue
        if len(contents) + len(prefixes) >= max_keys:
            truncated = True
            break
        rest = key[len(prefix) :]
        if delim and delim in rest:
            cp = prefix + rest.split(delim, 1)[0] + delim
            if cp not in prefixes:
                prefixes.append(cp)
            last = key
            continue
        st = (root / key).stat()
        mtime = datetime.datetime.fromtimestamp(st.st_mtime, datetime.timezone.utc)
        contents.append(
            f"<Contents><Key>{escape(key)}</Key><LastModified>{mtime:%Y-%m-%dT%H:%M:%S.000Z}"
            f"</LastModified><ETag>{escape(_etag(st, etag))}</ETag><Size>{st.st_size}</Size>"
            "<StorageClass>STANDARD</StorageClass></Contents>"
        )
        last = key
    more = f"<NextContinuationToken>{escape(last)}</NextContinuationToken>" if truncated else ""
    enc = "<EncodingType>url</EncodingType>" if query.get("encoding-type") == "url" else ""
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
        f"<Name>{escape(bucket)}</Name><Prefix>{escape(prefix)}</Prefix>"
        + (f"<Delimiter>{escape(delim)}</Delimiter>" if delim else "")
        + f"<KeyCount>{len(contents) + len(prefixes)}</KeyCount><MaxKeys>{max_keys}</MaxKeys>{enc}"
        f"<IsTruncated>{'true' if truncated else 'false'}</IsTruncated>{more}"
        + "".join(contents)
        + "".join(f"<CommonPrefixes><Prefix>{escape(p)}</Prefix></CommonPrefixes>" for p in prefixes)
        + "</ListBucketResult>"
    )


def _static_main(argv: list[str]) -> None:
    import argparse
    import asyncio
    import random

    from aiohttp import web

    p = argparse.ArgumentParser(prog="python -m benchmarks.servers static")
    p.add_argument("root")
    p.add_argument("port", type=int)
    p.add_argument("--mode", choices=["plain", "paced", "bucket", "ttfb", "store", "step", "shared",
                                      "limited"], default="plain")
    p.add_argument("--rate", type=int, default=0)
    p.add_argument("--burst", type=int, default=0)
    p.add_argument("--ttfb", default="0.02,0.05")
    p.add_argument("--etag", choices=["aiohttp", "nginx"], default="aiohttp")
    p.add_argument("--request-log", default=None)
    a = p.parse_args(argv)
    # Line-buffered: a reader of the log sees each request as soon as it is answered.
    reqlog = open(a.request_log, "a", buffering=1) if a.request_log else None
    base = Path(a.root).resolve()
    lo, hi = (float(x) for x in a.ttfb.split(","))
    rng = random.Random(0)
    buckets: dict[int, list[float]] = {}  # id(transport) -> [tokens, last refill]
    in_flight = [0]

    def take(key: int, want: int) -> float:
        """Seconds to wait before sending ``want`` bytes on connection ``key``."""
        now = time.monotonic()
        if a.mode == "step":  # no burst: the rate of the current period, per connection
            fast = int(now / _STEP_PERIOD) % 2
            rate = a.rate * 2 if fast else a.rate / 4
            state = buckets.setdefault(key, [now, now])  # [next free time, -]
            state[0] = max(state[0], now) + want / rate
            return max(0.0, state[0] - want / rate - now)
        if a.mode == "shared":  # one bucket for every connection, a small burst
            key = 0
            rate = a.rate * _SHARED_CONNECTIONS
            state = buckets.setdefault(key, [float(_CHUNK), now])
            tokens = min(float(_CHUNK), state[0] + (now - state[1]) * rate)
            state[1] = now
            state[0] = tokens - want
            return 0.0 if state[0] >= 0 else -state[0] / rate
        state = buckets.setdefault(key, [float(a.burst), now])
        tokens = min(float(a.burst), state[0] + (now - state[1]) * a.rate)
        state[1] = now
        state[0] = tokens - want  # may go negative: the debt is paid by waiting
        return 0.0 if state[0] >= 0 else -state[0] / a.rate

    async def shaped(request: web.Request, path: Path) -> web.StreamResponse:
        st = path.stat()
        size = st.st_size
        try:
            rng_ = request.http_range
        except ValueError:
            raise web.HTTPRequestRangeNotSatisfiable(headers={"Content-Range": f"bytes */{size}"}) from None
        start, stop = rng_.start, rng_.stop
        partial = start is not None or stop is not None
        if start is None:
            start = 0
        elif start < 0:
            start, stop = max(0, size + start), size
        stop = size if stop is None else min(stop, size)
        if partial and start >= size:
            raise web.HTTPRequestRangeNotSatisfiable(headers={"Content-Range": f"bytes */{size}"})
        resp = web.StreamResponse(status=206 if partial else 200)
        resp.headers["ETag"] = _etag(st, a.etag)
        resp.headers["Accept-Ranges"] = "bytes"
        resp.headers["Content-Type"] = "application/octet-stream"
        resp.last_modified = st.st_mtime
        if partial:
            resp.headers["Content-Range"] = f"bytes {start}-{stop - 1}/{size}"
        resp.content_length = stop - start
        await resp.prepare(request)
        if request.method == "HEAD":
            return resp
        key = id(request.transport)
        fd = os.open(path, os.O_RDONLY)
        try:
            off = start
            while off < stop:
                n = min(_CHUNK, stop - off)
                wait = take(key, n)
                if wait > 0:
                    await asyncio.sleep(wait)
                await resp.write(os.pread(fd, n, off))
                off += n
        finally:
            os.close(fd)
        await resp.write_eof()
        return resp

    async def handle(request: web.Request) -> web.StreamResponse:
        if a.mode != "limited":
            return await answer(request)
        if in_flight[0] >= _LIMITED_IN_FLIGHT:
            return web.Response(status=503, text=_SLOW_DOWN, content_type="application/xml")
        in_flight[0] += 1
        try:
            return await answer(request)
        finally:
            in_flight[0] -= 1

    async def answer(request: web.Request) -> web.StreamResponse:
        arrived = time.time()
        if a.mode in ("ttfb", "store"):
            await asyncio.sleep(rng.uniform(lo, hi))
        if reqlog is not None:  # wall clock: compared with the client's
            reqlog.write(f"{arrived:.6f} {time.time():.6f} {request.method} {request.path} "
                         f"{request.headers.get('Range', '-')}\n")
        parts = request.match_info["tail"].split("/", 1)
        if len(parts) == 1 or not parts[1]:  # bucket level: ListObjectsV2, HEAD bucket
            if not (base / parts[0]).is_dir():
                raise web.HTTPNotFound()
            if request.method == "HEAD":
                return web.Response(status=200)
            xml = _list_xml(base, parts[0], request.query, a.etag)
            return web.Response(text=xml, content_type="application/xml")
        if a.mode in ("paced", "store"):
            sock = request.transport.get_extra_info("socket") if request.transport else None
            if sock is not None:
                # Set on every request: cheap, and covers every accepted connection.
                sock.setsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE, a.rate)
        path = (base / request.match_info["tail"]).resolve()
        if base not in path.parents or not path.is_file():
            raise web.HTTPNotFound()
        if a.mode in ("bucket", "step", "shared", "limited") or a.etag == "nginx":
            # (limited: the body is sent inside the handler, so it counts as in flight)
            return await shaped(request, path)
        return web.FileResponse(path, chunk_size=1 << 20)

    app = web.Application()
    app.router.add_get("/{tail:.+}", handle, allow_head=True)
    web.run_app(app, host="127.0.0.1", port=a.port, print=None, access_log=None)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "static":
        _static_main(sys.argv[2:])
    elif len(sys.argv) == 5 and sys.argv[1] == "paced":
        _static_main([sys.argv[2], sys.argv[3], "--mode", "paced", "--rate", sys.argv[4]])
    else:
        sys.exit("usage: python -m benchmarks.servers static ROOT PORT [--mode plain|paced|bucket|ttfb] ...")
