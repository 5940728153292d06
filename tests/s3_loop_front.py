"""A test server on a loop thread of its own: the tests' fronts to moto that answer as
S3 does where moto does not, and the tests' own small servers (each one's ``_forward``
says how it answers); a front's request passed on to moto as it came (:func:`pass_on`)
and moto's answer sent back (:func:`send_back`)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

MiB = 1 << 20


class LoopFront:
    """An aiohttp server on loopback, on its own loop thread, handing every request to
    :meth:`_forward`; ``with front as url:`` serves at ``url`` until the block ends.
    ``shutdown_timeout``: how long the end waits for answers still being sent (a front
    that stalls on purpose sets it short)."""

    shutdown_timeout = 60.0

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    async def _forward(self, request: Any) -> Any:
        raise NotImplementedError

    def __enter__(self) -> str:
        from aiohttp import web

        self.thread.start()

        async def start() -> str:
            app = web.Application(client_max_size=64 * MiB)
            app.router.add_route("*", "/{tail:.*}", self._forward)
            self.runner = web.AppRunner(app, access_log=None,
                                        shutdown_timeout=self.shutdown_timeout)
            await self.runner.setup()
            await web.TCPSite(self.runner, "127.0.0.1", 0).start()
            return f"http://127.0.0.1:{self.runner.addresses[0][1]}"

        return asyncio.run_coroutine_threadsafe(start(), self.loop).result(30)

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


#: Headers of a message's framing: each side of a front sets its own.
_FRAMING = ("content-length", "transfer-encoding")


async def pass_on(request: Any, upstream: str,
                  body: bytes) -> tuple[int, dict[str, str], bytes, int | None]:
    """``request`` (with ``body``) sent on to ``upstream`` as it came (its path and query
    as signed, undecoded, no redirect followed): the answer's status, its headers less
    those of its framing, its body and its Content-Length."""
    from aiohttp import ClientSession
    from yarl import URL

    headers = {k: v for k, v in request.headers.items() if k.lower() not in _FRAMING}
    async with ClientSession(auto_decompress=False) as session, session.request(
            request.method, URL(upstream + request.raw_path, encoded=True),
            headers=headers, data=body or None, allow_redirects=False) as up:
        answer = await up.read()
        out = {k: v for k, v in up.headers.items()
               if k.lower() not in (*_FRAMING, "connection", "content-encoding")}
        return up.status, out, answer, up.content_length


async def send_back(request: Any, status: int, headers: dict[str, str], answer: bytes,
                    length: int | None) -> Any:
    """The answer to ``request``: ``answer`` with ``headers``, its Content-Length
    ``length`` for a HEAD (the object's; no body), else the body's."""
    from aiohttp import web

    resp = web.StreamResponse(status=status, headers=headers)
    resp.content_length = length if request.method == "HEAD" else len(answer)
    await resp.prepare(request)
    if request.method != "HEAD":
        await resp.write(answer)
    return resp
