"""A reverse proxy to moto that answers as S3 does under server-side encryption whose
ETags are no MD5 of the bytes (SSE-KMS, DSSE-KMS, SSE-C); moto answers MD5 ETags
whatever the encryption.

Every ETag of an object under ``prefix`` (``/bucket/key``; all objects by default) is
answered as 32 other hex digits (``-N`` kept for a multipart object): in the ETag header
of a PUT/POST/HEAD/GET, in the ``<ETag>`` of a CopyObject, UploadPart(Copy) or
CompleteMultipartUpload, and in a listing's ``<Contents>``. As on S3, one object keeps
its ETag (HEAD, GET and listing agree), and two objects of the same bytes get two. The
encryption ``headers`` are added to the answers about such objects. ETags a request
sends back (``If-Match``, ``x-amz-copy-source-if-match``, the parts listed in a
CompleteMultipartUpload) are mapped to moto's own before it sees them; a request whose
signed header was so mapped (``If-Match`` of a conditional delete) is signed again with
``keys`` (access key, secret key, region) where given, else moto refuses its signature.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import threading
from urllib.parse import unquote

MiB = 1 << 20
_ETAG = re.compile(r'([0-9a-f]{32})(-\d+)?')
_XML_ETAG = re.compile(rb"<ETag>(&quot;|\")?([0-9a-f]{32})(-\d+)?(&quot;|\")?</ETag>")
_CONTENTS = re.compile(rb"<Contents>.*?</Contents>", re.S)
_KEY = re.compile(rb"<Key>(.*?)</Key>", re.S)


class EncryptingFront:
    """A reverse proxy to moto answering as S3 does under ``headers`` (e.g.
    ``{"x-amz-server-side-encryption": "aws:kms"}``) for the objects under ``prefix``.

    ``methods`` records every request's method, ``writes`` the ``(method, path)`` of
    every PUT/POST; ``url`` is the endpoint to give tensorstream (after ``__enter__``)."""

    def __init__(self, upstream: str, headers: dict[str, str], prefix: str = "/",
                 keys: tuple[str, str, str] | None = None) -> None:
        self.upstream, self.headers, self.prefix, self.keys = upstream, headers, prefix, keys
        self.methods: list[str] = []
        self.writes: list[tuple[str, str]] = []
        self._real: dict[bytes, bytes] = {}  # an ETag answered -> moto's own
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _fake(self, path: str, real: bytes, salt: str = "") -> bytes:
        """The ETag answered for moto's ``real`` one of the object at ``path``: stable for
        that object, another for another object (or part: ``salt``)."""
        fake = hashlib.sha256(f"{path}\0{salt}\0".encode() + real).hexdigest()[:32].encode()
        self._real[fake] = real
        return fake

    def _back(self, text: bytes) -> bytes:
        for fake, real in self._real.items():
            text = text.replace(fake, real)
        return text

    def _run(self) -> None:
        from aiohttp import ClientSession, web
        from yarl import URL

        async def forward(request: web.Request) -> web.StreamResponse:
            self.methods.append(request.method)
            if request.method in ("PUT", "POST"):
                self.writes.append((request.method, request.path))
            body = self._back(await request.read())
            headers = {k: self._back(v.encode()).decode() for k, v in request.headers.items()
                       if k.lower() not in ("content-length", "transfer-encoding")}
            if self.keys is not None and any(
                    v != request.headers[k] for k, v in headers.items()):
                headers = self._signed(request.method, request.raw_path, headers, body)
            async with ClientSession(auto_decompress=False) as session, session.request(
                    request.method, URL(self.upstream + request.raw_path, encoded=True),
                    headers=headers, data=body or None, allow_redirects=False) as up:
                answer = await up.read()
                length = up.content_length
                out = {k: v for k, v in up.headers.items()
                       if k.lower() not in ("content-length", "transfer-encoding", "connection",
                                            "content-encoding")}
            path = request.path
            part = (f"{request.query.get('uploadId')}/{request.query['partNumber']}"
                    if "partNumber" in request.query else "")
            is_object = "/" in path.lstrip("/").rstrip("/")
            if up.status in (200, 206) and path.startswith(self.prefix) and is_object:
                out.update(self.headers)
                for name in [k for k in out if k.lower() == "etag"]:
                    m = _ETAG.search(out[name])
                    if m is not None:
                        fake = self._fake(path, m.group(1).encode(), part).decode()
                        out[name] = f'"{fake}{m.group(2) or ""}"'
                if request.method in ("PUT", "POST"):
                    answer = _XML_ETAG.sub(
                        lambda m: b"<ETag>&quot;" + self._fake(path, m.group(2), part)
                        + (m.group(3) or b"") + b"&quot;</ETag>", answer)
            elif up.status == 200 and request.method == "GET" and "list-type" in request.query:
                answer = _CONTENTS.sub(lambda m: self._listed(path, m.group(0)), answer)
            resp = web.StreamResponse(status=up.status, headers=out)
            resp.content_length = length if request.method == "HEAD" else len(answer)
            await resp.prepare(request)
            if request.method != "HEAD":
                await resp.write(answer)
            return resp

        async def start() -> None:
            app = web.Application(client_max_size=64 * MiB)
            app.router.add_route("*", "/{tail:.*}", forward)
            runner = web.AppRunner(app)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self._runner = runner

        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(start())
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._runner.cleanup())

    def _signed(self, method: str, raw_path: str, headers: dict[str, str],
                body: bytes) -> dict[str, str]:
        """``headers`` signed anew (SigV4, :attr:`keys`) for the request as sent on."""
        from botocore.auth import S3SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials

        assert self.keys is not None
        access, secret, region = self.keys
        kept = {k: v for k, v in headers.items()
                if k.lower() not in ("authorization", "x-amz-date", "x-amz-content-sha256")}
        req = AWSRequest(method=method, url=self.upstream + raw_path, headers=kept,
                         data=body or None)
        S3SigV4Auth(Credentials(access, secret), "s3", region).add_auth(req)
        return dict(req.headers.items())

    def _listed(self, bucket_path: str, contents: bytes) -> bytes:
        """One ``<Contents>`` of a listing, its ETag answered as the object's HEAD answers it."""
        key = _KEY.search(contents)
        if key is None:
            return contents
        path = "/" + bucket_path.strip("/") + "/" + unquote(key.group(1).decode())
        if not path.startswith(self.prefix):
            return contents
        return _XML_ETAG.sub(lambda m: b"<ETag>&quot;" + self._fake(path, m.group(2))
                             + (m.group(3) or b"") + b"&quot;</ETag>", contents)

    def __enter__(self) -> EncryptingFront:
        self._thread.start()
        assert self._ready.wait(30)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
