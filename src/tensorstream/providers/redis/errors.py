"""The one place where redis-py errors become tensorstream errors."""

from __future__ import annotations

import asyncio
import ssl

from redis import exceptions as rex

from ..._client_cert import client_cert_advice
from ..._log_redaction import withhold, withhold_args
from ...errors import (
    ConnectionFailedError,
    PermissionDeniedError,
    ProtocolError,
    ServiceUnavailableError,
    StorageTimeoutError,
    TensorstreamError,
)
from ...uri import redact_text

__all__ = ["closed_by_server", "map_redis_error", "plain_text_instead_of_tls", "REDIS_ERRORS",
           "tls_instead_of_plain_text"]

#: Exceptions :func:`map_redis_error` understands (what providers catch).
REDIS_ERRORS: tuple[type[BaseException], ...] = (
    rex.RedisError,
    rex.RedisClusterException,
    OSError,
    asyncio.TimeoutError,
)

#: OpenSSL's "Hostname mismatch" / "IP address mismatch, certificate is not valid for ...".
_NAME_MISMATCH = ("mismatch", "doesn't match", "not valid for")
_TLS_MARKERS = ("CERTIFICATE_VERIFY_FAILED", "certificate verify failed", "Hostname mismatch",
                "hostname mismatch", "doesn't match")


def _tls_verification_failed(exc: BaseException) -> bool:
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, ssl.SSLCertVerificationError):
            return True
        if any(m in str(cur) for m in _TLS_MARKERS):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


_GIVE_PASSWORD = ("give the password in the URI's user info (before the @ of the host), as "
                  "redis_password= or in REDIS_PASSWORD (tensorstream: --redis-password)")
_CHECK_PASSWORD = ("check the password (not shown) and the user name: the server refused the "
                   "pair, or the user is disabled")
_LOG_IN = ("log in as a user allowed to run it: give its name and password (user:password@ in "
           "the URI, or redis_username= and redis_password=; tensorstream: --redis-username, "
           "--redis-password)")
_GRANT = ("the user logged in but may not run it or touch that key: grant it to the user "
          "(ACL SETUSER <user> +<command> ~<key pattern>), or log in as one who may")


def map_redis_error(exc: BaseException, *, who: str = "",
                    secrets: tuple[str, ...] = ()) -> TensorstreamError:
    """Map a redis-py / socket error to a tensorstream error (temporary where retrying helps).

    ``who`` describes the credentials (``user 'x' (from ...), password from
    env REDIS_PASSWORD``) and never contains a secret. redis-py's own
    messages carry no passwords, but a server's may (it is echoed back):
    ``secrets`` (the password) are masked in the message and in ``exc``;
    URIs go through :func:`redact_text`.
    """
    if isinstance(exc, TensorstreamError):
        return exc
    withhold_args(exc, secrets)  # a server echoing the password (WRONGPASS <it>)
    text = withhold(redact_text(str(exc)), secrets) or type(exc).__name__
    # The advice follows what was sent (a password is in ``secrets`` exactly when one was
    # sent) and the refusal's class, never the server's words: Redis 7's ACL replies, a
    # proxy's and an old server's differ, and each had got another's advice.
    sent = bool(secrets)
    auth = (rex.AuthenticationError, rex.AuthenticationWrongNumberOfArgsError)
    if isinstance(exc, auth) or text.startswith(("NOAUTH", "WRONGPASS")):
        return PermissionDeniedError(
            f"Redis authentication failed as {who or 'the default user'}: {text}; "
            + (_CHECK_PASSWORD if sent else _GIVE_PASSWORD))
    if isinstance(exc, (rex.NoPermissionError, rex.AuthorizationError)):
        return PermissionDeniedError(f"Redis refused the command for {who or 'the default user'}"
                                     f": {text}; " + (_GRANT if sent else _LOG_IN))
    if isinstance(exc, (rex.TimeoutError, asyncio.TimeoutError, TimeoutError)):
        # redis-py says which: "Timeout connecting to server", "Timeout reading from ..."
        which = "connect" if "connecting" in text.lower() else "idle"
        return StorageTimeoutError(f"Redis did not answer in time: {text}", timeout=which)
    if _tls_verification_failed(exc):
        # A CA already trusted does not help a certificate issued for another name.
        hint = ("the certificate names another host: connect by a name it holds"
                if any(m in text for m in _NAME_MISMATCH)
                else "pass ca_bundle=<file> to trust a private CA")
        err = ConnectionFailedError(f"TLS certificate verification failed: {text}; {hint} "
                                    "(insecure=True disables verification)")
        err.temporary = False  # a wrong certificate does not fix itself
        return err
    if (advice := client_cert_advice(exc)) is not None:  # tls-auth-clients yes
        err = ConnectionFailedError(f"Redis TLS handshake failed: {text}; {advice}")
        err.temporary = False  # nor does a missing client certificate
        return err
    if isinstance(exc, rex.OutOfMemoryError):
        return ServiceUnavailableError(f"Redis is out of memory (maxmemory): {text}")
    if isinstance(exc, (rex.BusyLoadingError, rex.TryAgainError, rex.ClusterDownError,
                        rex.ReadOnlyError)):
        return ServiceUnavailableError(f"Redis is temporarily unavailable: {text}")
    if isinstance(exc, rex.ClusterError):
        # redis-py stopped following MOVED/ASK redirections ("TTL exhausted"): slots on
        # the move between nodes (a resharding), whose redirections it can lose track of
        # with several pipelines in flight. That ends: sent again. (Its text quotes the
        # command, a chunk's bytes included: not repeated.)
        return ServiceUnavailableError(
            "Redis Cluster kept redirecting the command (MOVED/ASK: slots moving between "
            "nodes?) until redis-py gave up (TTL exhausted)")
    if "max number of clients reached" in text:
        # Still temporary (other clients may leave), but a retry of the same width mostly
        # meets the same limit: say which knobs there are.
        return ConnectionFailedError(
            f"Redis refused a new connection: {text} (the server's maxclients); open fewer at "
            "once (concurrency=N, or --concurrency/--jobs for cp) or raise maxclients")
    if isinstance(exc, (rex.ConnectionError, rex.RedisClusterException, OSError)):
        return ConnectionFailedError(f"Redis connection failed: {text}")
    if isinstance(exc, rex.ResponseError):
        return ProtocolError(f"Redis answered with an error: {text}")
    return ProtocolError(f"Redis client error: {type(exc).__name__}: {text}")


async def plain_text_instead_of_tls(host: str, port: int, timeout: float = 2.0) -> bool:
    """Whether ``host:port`` answers a plain-text ``PING`` (a TLS client there would wait
    for a handshake reply that never comes, until its connect timeout)."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except (OSError, asyncio.TimeoutError):
        return False
    try:
        writer.write(b"PING\r\n")
        line = await asyncio.wait_for(reader.readline(), timeout)
        return line.startswith((b"+PONG", b"-NOAUTH", b"-ERR", b"-WRONGPASS"))
    except (OSError, asyncio.TimeoutError):
        return False
    finally:
        writer.close()


def closed_by_server(exc: BaseException) -> bool:
    """Whether ``exc`` is the server dropping the connection (a reset, or end of
    stream): not a refused connect or a timeout, which a TLS probe cannot explain."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, (ConnectionRefusedError, TimeoutError, rex.TimeoutError)):
            return False
        if isinstance(cur, (ConnectionResetError, BrokenPipeError)) or (
                isinstance(cur, rex.ConnectionError) and "closed by server" in str(cur)):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


async def tls_instead_of_plain_text(host: str, port: int, timeout: float = 2.0) -> bool:
    """Whether ``host:port`` completes a TLS handshake (certificate not checked:
    this only tells which protocol the port speaks; nothing is sent over it)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        _reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, ssl=ctx), timeout)
    except (OSError, ssl.SSLError, asyncio.TimeoutError):
        return False
    writer.close()
    try:
        await asyncio.wait_for(writer.wait_closed(), timeout)
    except (OSError, ssl.SSLError, asyncio.TimeoutError):
        pass
    return True
