"""Servers the harness starts on free loopback ports and always stops.

* nginx with a generated config serving a directory (``loopback`` profile). It
  also answers path-style S3 ``HEAD``/ranged ``GET`` (``/bucket/key``, the
  signature in the query string or headers is ignored) with ``ETag``.
* the paced server (``capped`` profile): aiohttp ``FileResponse`` (sendfile,
  HEAD, Range, ETag) that sets ``SO_MAX_PACING_RATE`` on every connection, so the
  kernel paces each connection at ``rate`` bytes/s. Run as its own process:
  ``python -m benchmarks.servers paced ROOT PORT RATE``.
* Debian's ``redis-server`` (no persistence) and moto's S3 server (writes).
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
from collections.abc import Sequence
from pathlib import Path

__all__ = ["Server", "free_port", "start_moto", "start_nginx", "start_paced", "start_redis"]

SO_MAX_PACING_RATE = getattr(socket, "SO_MAX_PACING_RATE", 47)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
                raise RuntimeError(f"{self.name} exited early:\n{self.log_tail()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
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
        listen 127.0.0.1:{port};
        root {root};
        location / {{ }}
    }}
}}
"""


def start_nginx(root: Path, work: Path, workers: int | None = None) -> Server:
    """nginx serving ``root`` on a free port (unlimited: the loopback profile)."""
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    work.mkdir(parents=True, exist_ok=True)
    port = free_port()
    conf = work / "nginx.conf"
    conf.write_text(
        _NGINX_CONF.format(
            user="user root;" if os.geteuid() == 0 else "",
            workers=workers or os.cpu_count() or 1,
            work=work,
            port=port,
            root=root,
        )
    )
    return Server("nginx", [nginx, "-e", str(work / "error.log"), "-c", str(conf)], port)


def start_paced(root: Path, rate: int) -> Server:
    """The paced static server: every connection capped at ``rate`` bytes/s by the kernel."""
    port = free_port()
    argv = [sys.executable, "-m", "benchmarks.servers", "paced", str(root), str(port), str(rate)]
    return Server("paced", argv, port, cwd=str(Path(__file__).resolve().parent.parent))


def start_redis(work: Path) -> Server:
    """Debian's redis-server, no persistence, on a free port."""
    work.mkdir(parents=True, exist_ok=True)
    port = free_port()
    argv = [
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
    ]
    return Server("redis", argv, port)


def start_moto() -> Server:
    """moto's S3 server (correct but slow: small objects only)."""
    port = free_port()
    exe = Path(sys.executable).with_name("moto_server")
    argv = [str(exe), "-H", "127.0.0.1", "-p", str(port)]
    return Server("moto", argv, port)


def measure_one_connection(url: str, nbytes: int = 16 << 20) -> float:
    """Bytes/s of one connection reading ``nbytes`` (to check the cap holds)."""
    req = urllib.request.Request(url, headers={"Range": f"bytes=0-{nbytes - 1}"})
    start = time.perf_counter()
    got = 0
    with urllib.request.urlopen(req, timeout=120) as resp:
        while chunk := resp.read(1 << 20):
            got += len(chunk)
    return got / (time.perf_counter() - start)


# -- the paced server (child process) -------------------------------------------
def _paced_main(root: str, port: int, rate: int) -> None:
    from aiohttp import web

    base = Path(root).resolve()

    async def handle(request: web.Request) -> web.StreamResponse:
        sock = request.transport.get_extra_info("socket") if request.transport else None
        if sock is not None:
            # Set on every request: cheap, and covers every accepted connection.
            sock.setsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE, rate)
        path = (base / request.match_info["tail"]).resolve()
        if base not in path.parents or not path.is_file():
            raise web.HTTPNotFound()
        return web.FileResponse(path, chunk_size=1 << 20)

    app = web.Application()
    app.router.add_get("/{tail:.+}", handle, allow_head=True)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "paced":
        _paced_main(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        sys.exit("usage: python -m benchmarks.servers paced ROOT PORT RATE")
