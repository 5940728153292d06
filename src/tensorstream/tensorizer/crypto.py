"""Encryption for tensorizer files: key files at any URI, random keys, passphrases.

Built on tensorizer's ``EncryptionParams``/``DecryptionParams`` (libsodium
via libnacl). Key files are read and written through tensorstream, so
``keyfile="s3://bucket/model.key"`` works like a local path.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from tensorizer import DecryptionParams, EncryptionParams

from ..errors import ConfigurationError, NotFoundError, ObjectChangedError
from ..uri import redact
from ._secrets import holds_secret
from .foreign import DecryptionError, TensorHashMismatchError

__all__ = [
    "DecryptionError",
    "Encryption",
    "KEY_BYTES",
    "TensorHashMismatchError",
    "as_decryption",
    "as_encryption",
    "generate_keyfile",
]

#: Length of a tensorizer (XSalsa20-Poly1305) key.
KEY_BYTES = 32
#: Reads of a key file that is replaced while it is read.
_READ_TRIES = 3




@dataclasses.dataclass(frozen=True, repr=False)
class Encryption:
    """How to encrypt (``serialize``) or decrypt (``deserialize``) tensors.

    Give exactly one of:

    * ``keyfile`` -- URI of a file holding a 32-byte binary key (vLLM's
      ``encryption_keyfile``). When serializing to a key file that does not
      exist yet, a random key is generated and written there first.
    * ``passphrase`` -- a string turned into a key with Argon2id
      (``EncryptionParams.from_string``); the salt and cost are stored in the
      file, so only the passphrase is needed to load. ``opslimit``/``memlimit``
      tune the cost when serializing (default: libsodium's "moderate").
    * ``key`` -- the 32 raw key bytes.

    ``keyfile_options`` are tensorstream options for the key file; by default
    the options of the model's URI are used.

    >>> Encryption(passphrase="correct horse")
    Encryption(passphrase=***)
    """

    keyfile: str | None = None
    passphrase: str | None = None
    key: bytes | None = None
    keyfile_options: Mapping[str, Any] | None = None
    opslimit: int | None = None
    memlimit: int | None = None

    def __post_init__(self) -> None:
        given = [n for n in ("keyfile", "passphrase", "key") if getattr(self, n) is not None]
        if len(given) != 1:
            raise ConfigurationError(
                "Encryption needs exactly one of keyfile=, passphrase= or key= "
                f"(got {', '.join(given) or 'none'})"
            )
        if self.passphrase is not None and not isinstance(self.passphrase, str | bytes):
            # (passphrase=12345 was taken; a load then raised tensorizer's bare TypeError)
            raise ConfigurationError(f"Encryption passphrase must be a str (or bytes), got "
                                     f"{type(self.passphrase).__name__}")
        if self.passphrase is not None and not self.passphrase:
            raise ConfigurationError("Encryption passphrase must not be empty")
        for name, least in (("opslimit", EncryptionParams.OpsLimit.MIN),
                            ("memlimit", EncryptionParams.MemLimit.MIN)):
            _check_limit(name, getattr(self, name), least)
        if self.key is not None and (not isinstance(self.key, bytes | bytearray)
                                     or len(self.key) != KEY_BYTES):
            # (a 32-character str was taken: a load said "wrong key", a save raised
            # tensorizer's TypeError; the value is not shown)
            raise ConfigurationError(
                f"Encryption key must be {KEY_BYTES} bytes, got {type(self.key).__name__}"
                + (f" of length {len(self.key)}" if isinstance(self.key, bytes | bytearray)
                   else "") + "; a passphrase is Encryption(passphrase=...)")

    def __repr__(self) -> str:
        if self.keyfile is not None:
            return f"Encryption(keyfile={redact(self.keyfile)!r})"
        return "Encryption(passphrase=***)" if self.passphrase is not None else "Encryption(key=***)"

    __str__ = __repr__

    def __reduce__(self) -> Any:
        if self.keyfile is None:
            raise TypeError("refusing to pickle an Encryption holding a key or passphrase")
        if redact(self.keyfile) != self.keyfile or any(
                holds_secret(str(k), v) for k, v in (self.keyfile_options or {}).items()):
            # It came back with the URI's password or signature as "***" and without its
            # keyfile_options: a key file read with other credentials, or not at all.
            raise TypeError(
                "refusing to pickle an Encryption whose key file URI or keyfile_options hold "
                "a secret; give the receiving process its credentials through the environment")
        return (_rebuild, (self.keyfile, self.keyfile_options))

    def _keyfile_opts(self, options: Mapping[str, Any], model: Any = None) -> dict[str, Any]:
        """The options the key file is read (or written) with: ``keyfile_options``, else
        the model's when the key file is on the model's service (S3: any bucket;
        HTTP(S), Redis: the same host and port), else the model's less those of its service.
        The model's options went to any key file: an HTTP model's token and headers were
        sent to the key file's host."""
        if self.keyfile_options is not None:
            return dict(self.keyfile_options)
        if model is not None and self.keyfile is not None and not _same_service(
                self.keyfile, model):
            # less the model service's own options (its token, headers, password); the
            # rest may be for the key file's (s3_* beside a local model, vLLM's config)
            own = _service_options(model)
            return {k: v for k, v in options.items() if k not in own}
        return dict(options)

    def encryption_params(self, options: Mapping[str, Any],
                          model: Any = None) -> EncryptionParams:
        """tensorizer ``EncryptionParams`` for writing to ``model`` (a URI) with
        ``options``; may create the key file."""
        if self.passphrase is not None:
            try:
                return EncryptionParams.from_string(
                    self.passphrase, opslimit=self.opslimit, memlimit=self.memlimit
                )
            except ValueError as exc:  # over libsodium's maximum: its range, no secret
                raise ConfigurationError(
                    f"Encryption: {str(exc).replace(str(self.passphrase), '***')}") from None
        if self.key is not None:
            return EncryptionParams(self.key)
        assert self.keyfile is not None
        opts = self._keyfile_opts(options, model)
        try:
            return EncryptionParams(read_key(self.keyfile, **opts))
        except NotFoundError:
            params = EncryptionParams.random()
            write_key(self.keyfile, params.key, **opts)
            return params

    def decryption_params(self, options: Mapping[str, Any],
                          model: Any = None) -> DecryptionParams:
        """tensorizer ``DecryptionParams`` for reading ``model`` (a URI) with ``options``."""
        if self.passphrase is not None:
            return DecryptionParams.from_string(self.passphrase)
        if self.key is not None:
            return DecryptionParams.from_key(self.key)
        assert self.keyfile is not None
        return DecryptionParams.from_key(
            read_key(self.keyfile, **self._keyfile_opts(options, model)))


def _check_limit(name: str, value: Any, least: int) -> None:
    """``opslimit``/``memlimit``: ``None`` or a whole number from libsodium's minimum (a
    string, a float or a bool made a save fail with tensorizer's bare ``TypeError``, a
    number under the minimum with its bare ``ValueError``)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigurationError(
            f"Encryption {name} must be a whole number (e.g. EncryptionParams."
            f"{'OpsLimit' if name == 'opslimit' else 'MemLimit'}.INTERACTIVE) or None, "
            f"got {type(value).__name__}")
    if value < least:
        raise ConfigurationError(f"Encryption {name} {int(value)} is out of range: "
                                 f"at least {int(least)}")


def _rebuild(keyfile: str, keyfile_options: Mapping[str, Any] | None) -> Encryption:
    return Encryption(keyfile=keyfile, keyfile_options=keyfile_options)


def read_key(uri: str, **options: Any) -> bytes:
    """The binary key stored at ``uri`` (checked to be 32 bytes)."""
    from ..api import open as ts_open

    for attempt in range(_READ_TRIES):
        try:
            with ts_open(uri, "rb", **options) as f:
                if f.size != KEY_BYTES:
                    raise ConfigurationError(
                        f"key file {redact(uri)!r} holds {f.size} bytes; a tensorizer key is "
                        f"{KEY_BYTES} raw bytes (write one with tensorstream.generate_keyfile)"
                        + (_held_as_text(f.read()) if f.size <= 128 else ""))
                return f.read()
        except ObjectChangedError:
            # replaced while read (another rank creating it): the new one, read whole
            if attempt == _READ_TRIES - 1:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def _held_as_text(data: bytes) -> str:
    """What a key file of the wrong size seems to hold, when it is the key written as text
    (hex, base64, a line break after it: an editor or ``echo``): said, never shown."""
    import base64
    import binascii
    import string

    text = data.strip()
    if len(text) == KEY_BYTES:
        return (f": its {KEY_BYTES} bytes have whitespace around them (a line break an editor "
                "or echo added?); write the key's bytes alone")
    if len(text) == 2 * KEY_BYTES and all(chr(c) in string.hexdigits for c in text):
        return (f": it holds {2 * KEY_BYTES} hexadecimal digits, the key written as text; write "
                f"the {KEY_BYTES} bytes they encode (bytes.fromhex)")
    try:
        decoded = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return ""
    return (f": it holds the key in base64; write the {KEY_BYTES} bytes it decodes to"
            if len(decoded) == KEY_BYTES else "")


def write_key(uri: str, key: bytes, **options: Any) -> None:
    """Store ``key`` at ``uri`` atomically; a local key file is 0600 (the umask's
    usual 0644 let every local user read the key)."""
    from ..api import open_secret

    with open_secret(uri, **options) as f:
        f.write(key)


def generate_keyfile(uri: str, **options: Any) -> Encryption:
    """Write a new random key to ``uri`` and return ``Encryption(keyfile=uri)``."""
    write_key(uri, EncryptionParams.random().key, **options)
    return Encryption(keyfile=uri, keyfile_options=options or None)


def current_key(value: Any, options: Mapping[str, Any], model: Any = None) -> bytes | None:
    """The key the key file of ``value`` (the ``encryption=`` of a save to ``model``)
    holds now; ``None`` when ``value`` names no key file."""
    enc = _coerce(value)
    if not isinstance(enc, Encryption) or enc.keyfile is None:
        return None
    return read_key(enc.keyfile, **enc._keyfile_opts(options, model))


def _same_service(keyfile: str, model: Any) -> bool:
    """Whether ``keyfile`` is read from the service ``model`` is (so its options apply)."""
    from ..uri import parse_uri

    try:
        k, m = parse_uri(keyfile), parse_uri(model)
    except Exception:  # an unparsable key file URI fails where it is opened
        return True
    if k.scheme != m.scheme:
        return False
    if k.scheme in ("s3", "file"):  # S3 options name an endpoint and an account, not a bucket
        return True
    default = _DEFAULT_PORTS.get(k.scheme)
    return ((k.host or "").lower() == (m.host or "").lower()
            and (k.port or default) == (m.port or default))


_DEFAULT_PORTS = {"http": 80, "https": 443, "redis": 6379, "rediss": 6379}


def _service_options(model: Any) -> frozenset[str]:
    """The option names the service of ``model`` (a URI) takes (none known: every name)."""
    from ..providers.registry import _config_module, resolve_provider_class
    from ..uri import parse_uri

    try:
        scheme = parse_uri(model).scheme
        module = _config_module(scheme)
        if module is not None:
            return frozenset(module.OPTIONS)
        return frozenset(resolve_provider_class(scheme).option_names)
    except Exception:  # a provider that does not load: send the key file nothing
        return _EVERY_NAME


class _Every(frozenset[str]):
    def __contains__(self, item: object) -> bool:
        return True


_EVERY_NAME = _Every()


def _coerce(value: Any) -> Encryption | EncryptionParams | DecryptionParams | None:
    if value is None or isinstance(value, (Encryption, EncryptionParams, DecryptionParams)):
        return value
    if isinstance(value, (bytes, bytearray)):
        return Encryption(key=bytes(value))
    if isinstance(value, Mapping):
        known = {f.name for f in dataclasses.fields(Encryption)}
        unknown = sorted(str(k) for k in value if k not in known)
        if unknown:  # names only: the values may be a key or a passphrase
            raise ConfigurationError(
                f"encryption: unknown field{'s' if len(unknown) > 1 else ''} "
                f"{', '.join(k[:60] for k in unknown)}; an Encryption takes "
                f"{', '.join(sorted(known))}")
        return Encryption(**value)
    raise ConfigurationError(
        f"encryption must be an Encryption(keyfile=... | passphrase=... | key=...), a 32-byte key "
        f"or tensorizer Encryption/DecryptionParams, not {type(value).__name__}"
    )


def as_decryption(value: Any, options: Mapping[str, Any],
                  model: Any = None) -> DecryptionParams | None:
    """Turn the ``encryption=`` argument of a load of ``model`` into ``DecryptionParams``."""
    enc = _coerce(value)
    if enc is None or isinstance(enc, DecryptionParams):
        return enc
    if isinstance(enc, EncryptionParams):
        return DecryptionParams.from_key(enc.key)
    return enc.decryption_params(options, model)


def as_encryption(value: Any, options: Mapping[str, Any],
                  model: Any = None) -> EncryptionParams | None:
    """Turn the ``encryption=`` argument of a save to ``model`` into ``EncryptionParams``."""
    enc = _coerce(value)
    if enc is None or isinstance(enc, EncryptionParams):
        return enc
    if isinstance(enc, DecryptionParams):
        raise ConfigurationError("serialize needs EncryptionParams, not DecryptionParams")
    return enc.encryption_params(options, model)
