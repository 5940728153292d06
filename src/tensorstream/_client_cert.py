"""What a server's TLS alert says about the client certificate, in words a user can act on.

A server that requires a client certificate (redis-server's ``tls-auth-clients yes``, Go
servers such as MinIO, ``openssl s_server -Verify``) ends the handshake with an alert
when it gets none, or one it does not trust; nginx instead answers 400 with a page that
says so (:func:`client_cert_answer`). OpenSSL reports only
the alert's name (``[SSL: TLSV13_ALERT_CERTIFICATE_REQUIRED] tlsv13 alert certificate
required``), and the error went on to advise a CA bundle, which is about the *server's*
certificate.

The files every protocol's TLS loads are checked here too (:func:`ca_context`,
:func:`load_client_cert`), so a CA bundle or client certificate that cannot be loaded
reads the same on HTTP(S), S3 and Redis: a :class:`ConfigurationError` naming the file.
"""

from __future__ import annotations

import os
import re
import ssl

from .errors import ConfigurationError

__all__ = ["CLIENT_CERT_OPTIONS", "NGINX_NO_CERTIFICATE", "ca_context", "ca_directory_data",
           "client_cert_advice", "client_cert_answer", "load_client_cert"]

#: How every protocol with client certificates takes one.
CLIENT_CERT_OPTIONS = ("client_cert=<PEM file> (and client_key=<PEM file> when the key is "
                       "not in the certificate file)")

#: OpenSSL's words (lower case) for TLS 1.3's "no certificate" alert (TLS 1.2 servers
#: send handshake_failure).
_REQUIRED = "alert certificate required"
#: Alerts a server sends about the certificate it got.
_REFUSED = ("alert bad certificate", "alert unknown ca", "alert certificate unknown",
            "alert certificate expired", "alert certificate revoked",
            "alert unsupported certificate", "alert access denied")
_HANDSHAKE = "alert handshake failure"


def _chain_text(exc: BaseException) -> str:
    parts, seen = [], set()
    node: BaseException | None = exc
    while node is not None and id(node) not in seen:
        seen.add(id(node))
        parts.append(str(node))
        node = node.__cause__ or node.__context__
    return " ".join(parts)


def _required(how: str) -> str:
    return f"the server requires a TLS client certificate and got none: pass {how}"


def _refused(how: str) -> str:
    return ("the server refused the TLS client certificate (none given, or one it does "
            f"not trust, expired, or for another use): pass one issued by a CA the server "
            f"trusts with {how}")


#: What nginx (``ssl_verify_client on``) answers with a 400 instead of an alert.
NGINX_NO_CERTIFICATE = "No required SSL certificate was sent"
_NGINX_BAD_CERTIFICATE = "The SSL certificate error"


def client_cert_answer(body: bytes, how: str = CLIENT_CERT_OPTIONS) -> str | None:
    """The advice for a 400 answer whose body is nginx's about the client
    certificate (it answers instead of ending the handshake); ``None`` otherwise."""
    text = body[:4096].decode("latin-1").lower()
    if NGINX_NO_CERTIFICATE.lower() in text:
        return f"{_required(how)} (nginx: '{NGINX_NO_CERTIFICATE}')"
    if _NGINX_BAD_CERTIFICATE.lower() in text:
        return f"{_refused(how)} (nginx: '{_NGINX_BAD_CERTIFICATE}')"
    return None


def client_cert_advice(exc: BaseException, how: str = CLIENT_CERT_OPTIONS) -> str | None:
    """The advice for a TLS alert about the client certificate in ``exc`` (or its
    chain), saying how to give one (``how``); ``None`` when it is not such an alert."""
    text = _chain_text(exc).lower()
    if _REQUIRED in text:
        return _required(how)
    if any(alert in text for alert in _REFUSED):
        return _refused(how)
    if _HANDSHAKE in text:
        return ("the server ended the TLS handshake: it may require a client certificate "
                f"(pass {how}), or share no TLS version or cipher with this client")
    return None


def ca_context(ca: str | None) -> ssl.SSLContext:
    """A default client context trusting ``ca`` (a PEM file of CA certificates, or a
    directory of them hashed by ``openssl rehash``; ``None``: the system's), or the
    :class:`ConfigurationError` naming it: OpenSSL's own error named no file, and
    Redis, which loads it on each connect, retried it as a connection failure."""
    try:
        if ca is not None and os.path.isdir(ca):
            # requests' verify=<dir> and SSL_CERT_DIR take one; cafile= refuses it
            return ssl.create_default_context(capath=ca)
        return ssl.create_default_context(cafile=ca)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigurationError(
            f"cannot load the CA bundle {ca} ({type(exc).__name__}: {exc}): it must be a PEM "
            "file of CA certificates, or a directory of them hashed by 'openssl rehash'"
        ) from None


#: The names 'openssl rehash' gives a directory's certificates, which OpenSSL's lookup
#: in a CA directory reads (``.rN``: revocation lists, not trusted certificates).
_HASHED_CERT = re.compile(r"[0-9a-f]{8}\.[0-9]+")
_PEM_CERT = re.compile(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.S)


def ca_directory_data(directory: str) -> str:
    """The certificates a CA directory (hashed by 'openssl rehash') trusts, as PEM text,
    for a client that takes CA data and no directory (redis-py's asyncio cluster client:
    ``ssl_ca_data``, no ``ssl_ca_path``); or the :class:`ConfigurationError` naming the
    directory when it holds none under such a name (it would trust nothing)."""
    pems: list[str] = []
    try:
        names = sorted(n for n in os.listdir(directory) if _HASHED_CERT.fullmatch(n))
        for name in names:
            with open(os.path.join(directory, name), encoding="ascii", errors="replace") as f:
                pems += _PEM_CERT.findall(f.read())
    except OSError as exc:
        raise ConfigurationError(f"cannot read the CA directory {directory} "
                                 f"({type(exc).__name__}: {exc.strerror})") from None
    if not pems:
        raise ConfigurationError(
            f"the CA directory {directory} holds no certificate under the names 'openssl "
            f"rehash' gives (<hash>.0): run 'openssl rehash {directory}', or pass a PEM file")
    data = "\n".join(pems) + "\n"
    try:  # what OpenSSL would refuse at each connect, said once, naming the directory
        ssl.create_default_context(cadata=data)
    except ssl.SSLError as exc:
        raise ConfigurationError(f"cannot load the certificates of the CA directory "
                                 f"{directory} ({exc})") from None
    return data


def load_client_cert(ctx: ssl.SSLContext, cert: str, key: str | None) -> None:
    """Load the client certificate ``cert`` (and its key ``key``) into ``ctx``, or
    raise the :class:`ConfigurationError` that names both files and what is wrong.

    Every protocol loads through here, so an encrypted key, a key of another
    certificate or a file that is no PEM reads the same (Redis retried them as
    connection failures). The pass phrase callback refuses: without one OpenSSL
    prompts on the terminal, and a service waits there."""
    try:
        ctx.load_cert_chain(cert, key, password=_no_password)
    except (ssl.SSLError, OSError, ValueError) as exc:
        with_key = f" and key {key}" if key else ""
        raise ConfigurationError(
            f"cannot load the client certificate {cert}{with_key} "
            f"({type(exc).__name__}: {exc}): both must be PEM files, the key not encrypted; "
            "pass client_key= when the key is not in the certificate file"
        ) from None


def _no_password() -> str:
    raise ValueError("the client key is encrypted (tensorstream takes no pass phrase)")
