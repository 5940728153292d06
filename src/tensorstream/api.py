"""Front doors: ``get_provider``, ``open``, ``read_range``, ``stat``."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Literal, overload

from . import _loop
from .config import COMMON_OPTIONS, _flag, option_hint, split_options
from .errors import ConfigurationError
from .layers.stack import PolicyProvider
from .providers.base import BodyStream, ObjectInfo
from .providers.registry import resolve_provider_class, unknown_option_names
from .uri import ParsedURI, check_file_destination, parse_uri

if TYPE_CHECKING:  # the file objects (and their read-ahead) load on first open()
    from .file import StreamReader
    from .stream_writer import StreamWriter

__all__ = ["get_provider", "open", "read_range", "stat"]

def get_provider(uri: str | os.PathLike[str] | ParsedURI, **options: Any) -> PolicyProvider:
    """A provider for ``uri``'s location, wrapped in the shared policies.

    The result is an async context manager; close it (``await p.close()``)
    when done. Objects inside it are addressed by ``parse_uri(uri).path``.

    >>> p = get_provider("/tmp")  # doctest: +SKIP
    """
    parsed = parse_uri(uri)
    cls = resolve_provider_class(parsed.scheme)
    common, rest = split_options(options)
    # An option another service understands is ignored (one option dict can serve a cp between
    # two backends); anything else is a typo and is rejected. (Other services' option names
    # are looked up only for an option this one does not take: importing their config
    # modules is a noticeable part of a short command's start-up.)
    foreign = set(rest) - COMMON_OPTIONS - cls.option_names
    unknown = sorted(unknown_option_names(foreign)) if foreign else []
    if unknown:
        accepted = cls.option_names | COMMON_OPTIONS
        named = ", ".join(f"{name}{option_hint(name, accepted)}" for name in unknown)
        raise ConfigurationError(
            f"unknown option(s) {named} for {cls.service}; "
            f"it accepts {', '.join(sorted(accepted))}"
        )
    own = {k: v for k, v in rest.items() if k in cls.option_names}
    inner = cls.from_uri(parsed, config=common, **own)
    return PolicyProvider(inner, common)


async def stat(uri: str | os.PathLike[str] | ParsedURI, **options: Any) -> ObjectInfo:
    """Size, ETag and mtime of the object at ``uri``."""
    parsed = parse_uri(uri)
    async with get_provider(parsed, **options) as provider:
        return await provider.stat(parsed.path)


async def read_range(
    uri: str | os.PathLike[str] | ParsedURI, start: int, end: int, **options: Any
) -> bytes:
    """Bytes ``[start, end)`` of the object at ``uri`` (end exclusive); raises if past the end."""
    parsed = parse_uri(uri)
    async with get_provider(parsed, **options) as provider:
        return await provider.read_range(parsed.path, start, end)


@overload
def open(
    uri: str | os.PathLike[str] | ParsedURI, mode: Literal["rb"] = "rb", *,
    sequential: bool = False, **options: Any
) -> StreamReader: ...
@overload
def open(
    uri: str | os.PathLike[str] | ParsedURI, mode: Literal["wb"], *,
    sequential: bool = False, **options: Any
) -> StreamWriter: ...
def open(  # mirrors builtins.open on purpose
    uri: str | os.PathLike[str] | ParsedURI, mode: str = "rb", *,
    sequential: bool = False, **options: Any
) -> StreamReader | StreamWriter:
    """Open the object at ``uri`` as a binary file.

    ``"rb"``: a seekable reader that ``tensorizer.TensorDeserializer`` accepts.
    ``"wb"``: an atomic writer; the object appears on ``close()``. To S3 it takes
    ``content_type=``, ``cache_control=`` and ``metadata={"key": "value"}`` (user
    metadata), checked by S3's rules (printable US-ASCII, 2 KB of user metadata).

    ``sequential=True`` (``"rb"``): the caller will read from byte 0 onward (a
    whole tensorizer load). Over HTTP(S) and S3 the open is then one ``GET`` of
    ``bytes=0-``, whose answer gives the size and validators and whose body is
    the reader's first stream: no ``HEAD`` before the first byte. An answer that
    cannot stand in for the ``HEAD`` falls back to it. Leave it off for a reader
    that reads a few ranges (a filtered load): that ``GET`` asks for every byte.

    >>> with tensorstream.open("s3://bucket/model.tensors", sequential=True) as f:  # doctest: +SKIP
    ...     deserializer = TensorDeserializer(f, device="cuda")
    """
    parsed = parse_uri(uri)
    if mode not in ("rb", "wb", "r", "w"):
        raise ValueError(f"mode must be 'rb' or 'wb', got {mode!r}")
    # sequential="false" was truthy: one GET of every byte for a reader of a few ranges
    sequential = _flag("sequential", sequential)
    writer_options: dict[str, Any] = {}
    if mode in ("wb", "w"):
        check_file_destination(parsed)
        writer_options = _object_metadata(parsed, options)
    provider = get_provider(parsed, **options)
    if mode in ("rb", "r"):
        from .file import StreamReader  # (and the read-ahead: not for a writer)

        first: BodyStream | None = None
        try:
            # Asked for: one GET from byte 0 gives the size, the validators and
            # the stream the load reads first (a HEAD before it is a round trip).
            got = provider.open_whole_blocking(parsed.path) if sequential else None
            if got is not None:
                info, first = got
            else:
                info = _loop.run_sync(provider.stat(parsed.path))
        except BaseException:
            _loop.run_sync(provider.close())
            raise
        return StreamReader(provider, parsed, info, first=first)
    return _writer(provider, parsed, **writer_options)


def _object_metadata(parsed: ParsedURI, options: dict[str, Any]) -> dict[str, Any]:
    """``open(..., "wb", content_type=, cache_control=, metadata=)``: taken out of
    ``options`` as the S3 writer's ``metadata`` (nothing is guessed from the key, as
    for ``aws s3 cp - s3://...``)."""
    fields = {k: options.pop(k) for k in ("content_type", "cache_control", "metadata")
              if k in options}
    if not fields:
        return {}
    from .copy.metadata import stream_writer_options
    from .providers.s3.metadata import MetadataOptions

    return stream_writer_options(MetadataOptions(**fields), parsed.scheme)


def _writer(provider: PolicyProvider, parsed: ParsedURI, **writer_options: Any) -> StreamWriter:
    """``open(..., "wb")`` on ``provider``; ``writer_options`` go to its ``open_writer``
    (``mode=0o600``: a local file readable by its owner only, for secrets)."""
    from .stream_writer import StreamWriter

    try:
        writer = provider.open_writer(parsed.path, **writer_options)
    except BaseException:
        _loop.run_sync(provider.close())
        raise
    return StreamWriter(provider, parsed, writer)


def open_secret(uri: str | os.PathLike[str] | ParsedURI, **options: Any) -> StreamWriter:
    """``open(uri, "wb")`` for a secret (a key file): a local file is created
    readable by its owner only (0600), whatever the umask."""
    parsed = parse_uri(uri)
    check_file_destination(parsed)
    return _writer(get_provider(parsed, **options), parsed, mode=0o600)
