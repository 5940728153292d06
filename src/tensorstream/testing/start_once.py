"""A session server's start, once: its failure sticks for the session.

The plugin's servers start when a test first asks for one. One that failed to
start was started again for every later test that asked for it (moto's child,
redis-server's five ports, each time), and each failed with the same long
traceback. :class:`StartOnce` keeps the first failure and raises it again at
once, as one :class:`ServerStartError` that names the cause.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

__all__ = ["ServerStartError", "StartOnce"]


class ServerStartError(RuntimeError):
    """A session server did not start (:attr:`cause`: what its start raised); raised
    again, at once, to every later test that asks for the same server."""

    def __init__(self, server: str, cause: Exception, *, again: bool = False) -> None:
        self.server = server
        self.cause = cause
        # Our own errors already name the server, the cause and what to do; others do not.
        ours = type(cause) is RuntimeError and str(cause)
        text = str(cause) if ours else f"{server} did not start: {type(cause).__name__}: {cause}"
        if again:
            text = (f"{server} failed to start earlier in this session and is not tried "
                    f"again (the first test that asked for it shows its output): {text}")
        super().__init__(text)


class StartOnce:
    """Each server's start, by key: run once; a failure is kept and raised again."""

    def __init__(self) -> None:
        self._failed: dict[Hashable, Exception] = {}

    def __call__(self, key: Hashable, server: str, start: Callable[[], Any]) -> Any:
        """``start()``'s result, or :class:`ServerStartError` (at once when ``key``
        failed before). The caller keeps what started: only failures are kept here."""
        failed = self._failed.get(key)
        if failed is not None:
            raise ServerStartError(server, failed, again=True) from failed
        try:
            return start()
        except Exception as exc:  # (not KeyboardInterrupt: Ctrl-C is no failed start)
            self._failed[key] = exc
            raise ServerStartError(server, exc) from exc

    def forget(self) -> None:
        """Forget the failures (the servers were closed: a new session may try again)."""
        self._failed.clear()
