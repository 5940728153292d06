"""``python -m benchmarks.minimal_copy ENDPOINT BUCKET PREFIX DEST [THREADS]``:
the least a Python folder copy can do, as a reference row for ``cp`` cells.

Lists ``PREFIX`` (ListObjectsV2, unsigned: the harness's servers do not ask
for a signature), then ``THREADS`` threads, each with one keep-alive
``http.client`` connection, ``GET`` whole objects, receive them through a
1 MiB buffer and ``pwrite`` it with ``O_DIRECT`` into a new temp file,
``fsync`` and rename it. No signing, retries, checks, resume or progress: it
shows how fast Python itself can go on a cell (docs/benchmarks.md, "Session
20"), never a peer to beat. The harness verifies what it wrote.
"""

from __future__ import annotations

import errno
import http.client
import mmap
import os
import sys
import threading
import urllib.parse
import xml.etree.ElementTree as ET

_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"
_CHUNK = 1 << 20


def _list(conn: http.client.HTTPConnection, bucket: str, prefix: str) -> list[tuple[str, int]]:
    keys: list[tuple[str, int]] = []
    token = ""
    while True:
        query = {"list-type": "2", "prefix": prefix}
        if token:
            query["continuation-token"] = token
        conn.request("GET", f"/{bucket}?{urllib.parse.urlencode(query)}")
        resp = conn.getresponse()
        body = resp.read()
        if resp.status != 200:
            raise SystemExit(f"listing failed: HTTP {resp.status}")
        root = ET.fromstring(body)
        for item in root.iter(f"{_NS}Contents"):
            keys.append((item.findtext(f"{_NS}Key") or "", int(item.findtext(f"{_NS}Size") or 0)))
        token = root.findtext(f"{_NS}NextContinuationToken") or ""
        if root.findtext(f"{_NS}IsTruncated") != "true" or not token:
            return keys


def _open_temp(path: str) -> tuple[int, bool]:
    """A new temp file, ``O_DIRECT`` where the filesystem has it (tmpfs: ``EINVAL``)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    direct = getattr(os, "O_DIRECT", 0)
    if direct:
        try:
            return os.open(path, flags | direct, 0o644), True
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
    return os.open(path, flags, 0o644), False


def _receive(resp: http.client.HTTPResponse, size: int, tmp: str, buf: memoryview) -> None:
    """The body into ``tmp``: whole pages ``O_DIRECT``, an unaligned tail through the
    page cache (a second, ordinary descriptor), then ``fsync``."""
    fd, direct = _open_temp(tmp)
    try:
        pos = 0
        while pos < size:
            n = resp.readinto(buf[: min(_CHUNK, size - pos)])
            if not n:
                raise SystemExit(f"{tmp}: the body ended early")
            if direct and n % 4096:
                os.close(fd)
                fd, direct = os.open(tmp, os.O_WRONLY), False
            os.pwrite(fd, buf[:n], pos)
            pos += n
        os.fsync(fd)
    finally:
        os.close(fd)


def _copy(url: urllib.parse.SplitResult, bucket: str, prefix: str, dest: str,
          todo: list[tuple[str, int]], lock: threading.Lock) -> None:
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port)
    buf = memoryview(mmap.mmap(-1, _CHUNK, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS))
    while True:
        with lock:
            if not todo:
                return
            key, size = todo.pop()
        name = key[len(prefix):]
        conn.request("GET", f"/{bucket}/{urllib.parse.quote(key)}")
        resp = conn.getresponse()
        if resp.status != 200:
            raise SystemExit(f"{key}: HTTP {resp.status}")
        folder = os.path.join(dest, os.path.dirname(name))
        os.makedirs(folder, exist_ok=True)
        tmp = os.path.join(folder, f".{os.path.basename(name)}.tmp")
        _receive(resp, size, tmp, buf)
        os.rename(tmp, os.path.join(dest, name))


def main(argv: list[str]) -> None:
    endpoint, bucket, prefix, dest = argv[:4]
    threads = int(argv[4]) if len(argv) > 4 else 32
    url = urllib.parse.urlsplit(endpoint)
    os.makedirs(dest, exist_ok=True)
    todo = _list(http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port), bucket, prefix)
    lock = threading.Lock()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            _copy(url, bucket, prefix, dest, todo, lock)
        except BaseException as exc:  # reported by the exit status
            errors.append(exc)

    workers = [threading.Thread(target=run)
               for _ in range(min(threads, max(1, len(todo))))]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if errors:
        raise SystemExit(f"minimal copy failed: {errors[0]}")


if __name__ == "__main__":
    main(sys.argv[1:])
