"""tensorizer's and torch's exceptions as tensorstream errors naming the file.

Used where a load raises: :func:`tensorstream.deserialize` and friends while the
deserializer is built, and the deserializer itself when a lazy load (or any
later access) reads a tensor. Malformed or truncated files are left to
:class:`~tensorstream.tensorizer.checked.CheckedSource`; here: decryption,
hashes, memory, and torch/tensorizer runtime failures.
"""

from __future__ import annotations

from typing import Any

from tensorizer.serialization import CryptographyError, HashMismatchError

from ..errors import IntegrityError, LoadError, TensorstreamError
from ..uri import redact_text

__all__ = ["DecryptionError", "TensorHashMismatchError", "translate"]


class DecryptionError(TensorstreamError, PermissionError, CryptographyError):
    """Encrypted tensors could not be decrypted: wrong key or passphrase, or
    encryption settings that do not match the file. Never contains the key."""


class TensorHashMismatchError(IntegrityError, HashMismatchError):
    """``verify_hash=True`` found a tensor whose bytes do not match its stored hash."""


def translate(exc: BaseException, where: str, *, decrypted: bool = False,
              keyed: bool = True) -> BaseException | None:
    """``exc`` as the tensorstream error to raise instead (chain ``exc`` as its
    cause), or ``None`` to raise ``exc`` itself. Any URI in ``exc``'s message is
    redacted first, since the chain prints it. ``decrypted``: other tensors of the
    file were decrypted with the same key (a failure is then damage, not the key);
    ``keyed``: the load was given decryption parameters at all."""
    if isinstance(exc, TensorstreamError):
        return None
    if isinstance(exc, CryptographyError) and not keyed:
        _scrub(exc)
        return DecryptionError(
            f"{where} is encrypted and no key was given: pass encryption=Encryption(keyfile=URI "
            "| passphrase=... | key=...) (tensorstream.tensorizer.Encryption; vLLM's "
            "encryption_keyfile is a keyfile) or tensorizer's DecryptionParams")
    mapped = _translate_foreign(exc, where, decrypted)
    if mapped is not None:
        _scrub(exc)
    return mapped


def _scrub(exc: BaseException) -> None:
    """Redact URIs and secret query parameters in a foreign exception's message
    (it is chained, so tracebacks and ``repr(err.__cause__)`` print it)."""
    try:
        exc.args = tuple(redact_text(a) if isinstance(a, str) else a for a in exc.args)
    except Exception:  # an exception type with read-only args: leave it
        pass


def _out_of_memory(exc: BaseException) -> bool:
    import torch

    oom: Any = getattr(torch, "OutOfMemoryError", ())
    return isinstance(exc, MemoryError) or bool(oom and isinstance(exc, oom))


def _translate_foreign(exc: BaseException, where: str, decrypted: bool) -> BaseException | None:
    if isinstance(exc, CryptographyError):
        if decrypted:  # the key is right: an authentication failure now is the data's
            return DecryptionError(
                f"could not decrypt {where}: its encrypted data is damaged (other tensors "
                f"decrypted with the same key) ({redact_text(str(exc))})")
        return DecryptionError(
            f"could not decrypt {where}: wrong key or passphrase, encryption settings that "
            f"do not match the file, or damaged encrypted data ({redact_text(str(exc))})"
        )
    if isinstance(exc, HashMismatchError):
        return TensorHashMismatchError(f"verify_hash failed for {where}: {redact_text(str(exc))}")
    if _out_of_memory(exc):
        return LoadError(
            f"out of memory while loading {where} ({type(exc).__name__}); free memory, load "
            "fewer tensors (filter_func=...), lazy_load=True, or a smaller dtype"
        )
    if isinstance(exc, RuntimeError | NotImplementedError | AssertionError):
        # torch's device/dtype errors and tensorizer's runtime checks.
        return LoadError(
            f"loading {where} failed in {_origin(exc)}: "
            f"{type(exc).__name__}: {redact_text(str(exc))}"
        )
    return None


def _origin(exc: BaseException) -> str:
    """The package ``exc`` was raised in: that of the innermost frame of its traceback
    (torch raises builtin ``RuntimeError``s: the message said "failed in builtins"), else
    that of its type, else "torch or tensorizer"."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    name = str(tb.tb_frame.f_globals.get("__name__") or "") if tb is not None else ""
    if not name or name == "builtins":
        name = type(exc).__module__
    top = name.split(".")[0]
    return top if top and top != "builtins" else "torch or tensorizer"
