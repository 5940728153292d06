"""Typed configuration shared by every provider: timeouts, retries, transfer sizes.

Each value object has ``DEFAULT_*`` constants and is built from the flat
keyword options users pass (``tensorstream.open(uri, timeout_idle=5)``) by
:func:`split_options`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import stat
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .errors import ConfigurationError

__all__ = [
    "COMMON_OPTIONS",
    "DEFAULT_CONCURRENCY",
    "DEFAULT_PART_SIZE",
    "RetryConfig",
    "Timeouts",
    "TransferConfig",
    "split_options",
    "validate_options",
]

MiB = 1 << 20
DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_IDLE_TIMEOUT = 30.0
DEFAULT_ATTEMPTS = 5
DEFAULT_BACKOFF_INITIAL = 0.1
DEFAULT_BACKOFF_MAX = 10.0
DEFAULT_PART_SIZE = 2 * MiB
DEFAULT_CONCURRENCY = 32
DEFAULT_READAHEAD = 64 * MiB


@dataclasses.dataclass(frozen=True)
class Timeouts:
    """Connect and idle (time-between-bytes) timeouts, in seconds.

    There is deliberately no whole-request timeout: a 10 GiB read may take
    minutes, but no socket may sit silent for longer than ``idle``.
    ``total`` bounds one operation *including retries* when set.
    """

    connect: float = DEFAULT_CONNECT_TIMEOUT
    idle: float = DEFAULT_IDLE_TIMEOUT
    total: float | None = None


@dataclasses.dataclass(frozen=True)
class RetryConfig:
    """Retry policy: jittered exponential backoff on temporary errors only."""

    attempts: int = DEFAULT_ATTEMPTS
    backoff_initial: float = DEFAULT_BACKOFF_INITIAL
    backoff_max: float = DEFAULT_BACKOFF_MAX

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ConfigurationError("retries: attempts must be >= 1")


@dataclasses.dataclass(frozen=True)
class TransferConfig:
    """How large reads are split: part size, concurrency and read-ahead."""

    part_size: int = DEFAULT_PART_SIZE
    concurrency: int = DEFAULT_CONCURRENCY
    readahead: int = DEFAULT_READAHEAD
    #: Sequential reads on a fast link come from one streamed request per run
    #: of reads (HTTP, S3) instead of a request per part.
    stream_reads: bool = True

    def __post_init__(self) -> None:
        if self.part_size < 1 or self.concurrency < 1:
            raise ConfigurationError("part_size and concurrency must be >= 1")


#: Option names every provider accepts (consumed by the shared layers).
COMMON_OPTIONS = frozenset(
    {
        "timeout_connect",
        "timeout_idle",
        "timeout_total",
        "retries",
        "backoff_initial",
        "backoff_max",
        "part_size",
        "concurrency",
        "readahead",
        "stream_reads",
    }
) | frozenset({"min_part_size", "large_read"})

#: Options of 0.1 that nothing reads any more: accepted with a DeprecationWarning until 0.3.
DEPRECATED_OPTIONS = frozenset({"min_part_size", "large_read"})


@dataclasses.dataclass(frozen=True)
class CommonConfig:
    timeouts: Timeouts
    retry: RetryConfig
    transfer: TransferConfig


def _flag(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigurationError(f"{name} must be true or false, got {_shown(value)}")


def _shown(value: Any) -> str:
    """A value for an error message: short, and never a secret (only numbers,
    flags and sizes are validated with their value shown)."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _number(name: str, value: Any, *, integer: bool, minimum: float, strict: bool = False,
            maximum: float | None = None) -> Any:
    """``value`` as an int/float within bounds, or a ConfigurationError naming ``name``.

    Numbers and numeric strings (CLI, config files) are accepted; booleans, NaN,
    infinities and non-integral values for integer options are not.
    """
    what = "an integer" if integer else "a number"
    bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
    if maximum is not None:
        bound += f" and <= {int(maximum)}"
    problem = f"{name} must be {what} {bound}, got {_shown(value)}"
    if isinstance(value, bool) or value is None:
        raise ConfigurationError(problem)
    try:
        number = float(value) if not isinstance(value, int) else value
    except (TypeError, ValueError):
        raise ConfigurationError(problem) from None
    if isinstance(number, float):
        if not math.isfinite(number):
            raise ConfigurationError(problem)
        if integer:
            if not number.is_integer():
                raise ConfigurationError(problem)
            number = int(number)
    if (number <= minimum if strict else number < minimum) or (
            maximum is not None and number > maximum):
        raise ConfigurationError(problem)
    return int(number) if integer else float(number)


def _text(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ConfigurationError(f"{name} must be a string, got {type(value).__name__}")
    if any(c in value for c in "\r\n\x00"):
        # would end up in a header or a request line; the value itself is never shown
        raise ConfigurationError(f"{name} must not contain line breaks or NUL characters")
    return value


def _proxy(name: str, value: Any) -> str | bool:
    """An ``http://`` proxy URL, or ``False`` for none (the URL may hold a password:
    never shown; :mod:`.providers._http.proxies` checks the rest)."""
    if value is False:
        return False
    text = _text(name, value)
    if text.strip().lower() in ("0", "false", "no", "off"):  # a config file's or CLI's False
        return False
    if not text.strip():
        raise ConfigurationError(f"{name} must be an http:// proxy URL, or False for no proxy")
    return text


def _local_path(name: str, value: Any) -> str:
    """A path that exists and is a regular file (or a directory, for CA paths):
    a FIFO or a device would block or stream forever when read."""
    path = _text(name, os.fspath(value) if isinstance(value, os.PathLike) else value)
    try:
        st = os.stat(os.path.expanduser(path))
    except OSError as exc:
        if name in ("client_cert", "client_key") and ":" in path:
            # curl's --cert FILE:PASSWORD: what follows the colon is a pass phrase
            head = path.partition(":")[0]
            raise ConfigurationError(
                f"{name}: cannot use {head!r}:... ({exc.strerror}; what follows the ':' is "
                "not shown: if it is a pass phrase (curl's FILE:PASSWORD), none is taken: "
                "give the file alone, with its key not encrypted (openssl pkey -in KEY "
                "-out KEY.pem decrypts one)") from None
        raise ConfigurationError(f"{name}: cannot use {path!r} ({exc.strerror})") from None
    if not (stat.S_ISREG(st.st_mode) or (name == "ca_bundle" and stat.S_ISDIR(st.st_mode))):
        raise ConfigurationError(f"{name}: {path!r} is not a regular file")
    return path


def _headers(name: str, value: Any) -> Mapping[str, str]:
    if not isinstance(value, Mapping):
        raise ConfigurationError(f"{name} must be a mapping of header name to value")
    for key, item in value.items():
        if isinstance(key, str) and ":" in key:
            # "X-Api-Key: <key>" given as the name: its value is a secret, never shown
            raise ConfigurationError(f"{name}: invalid header name {_shown(key.split(':')[0])}"
                                     "... (with a ':'; the rest is not shown): pass the name "
                                     "alone, and the value as its value")
        if not isinstance(key, str) or not _HEADER_NAME.fullmatch(key):
            raise ConfigurationError(f"{name}: invalid header name {_shown(key)}")
        if not isinstance(item, str) or any(c in item for c in "\r\n\x00"):
            # never echo the value: headers carry API keys
            raise ConfigurationError(
                f"{name}[{key!r}]: a header value must be a string without line breaks")
    return value


def _choice(*allowed: str) -> Callable[[str, Any], str]:
    def check(name: str, value: Any) -> str:
        if value not in allowed:
            raise ConfigurationError(
                f"{name} must be one of {', '.join(allowed)}, got {_shown(value)}")
        return str(value)

    return check


_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # (fullmatch: '$' passes "\n")
_MAX_COUNT = 1 << 16
_MAX_SIZE = 1 << 50  # 1 PiB: beyond any object store's object or part


def _int(minimum: int, maximum: int = _MAX_SIZE) -> Callable[[str, Any], int]:
    return lambda name, v: int(_number(name, v, integer=True, minimum=minimum, maximum=maximum))


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(i?b?)\s*$", re.IGNORECASE)


def parse_byte_size(text: str) -> int | None:
    """``"8M"``, ``"64MiB"``, ``"1.5G"``, ``"1048576"`` -> bytes (binary units, as the
    CLI's sizes); ``None`` when ``text`` is not a size."""
    m = _SIZE.match(text)
    if not m:
        return None
    scale = 1 << (10 * " kmgtp".index((m.group(2) or " ").lower()))
    return int(float(m.group(1)) * scale)


def _bytes(minimum: int, maximum: int = _MAX_SIZE) -> Callable[[str, Any], int]:
    """A byte count: a number, or a size string with a unit ("64MiB", "8M", "1GiB")."""
    def check(name: str, value: Any) -> int:
        if isinstance(value, str) and not value.strip().isdigit():
            parsed = parse_byte_size(value)
            if parsed is None:
                raise ConfigurationError(
                    f"{name} must be a byte count or a size like 8MiB, 64M or 1GiB, "
                    f"got {_shown(value)}")
            value = parsed
        return int(_number(name, value, integer=True, minimum=minimum, maximum=maximum))
    return check


def _positive_seconds(name: str, value: Any) -> float:
    return float(_number(name, value, integer=False, minimum=0, strict=True, maximum=10 ** 7))


def _seconds(name: str, value: Any) -> float:
    return float(_number(name, value, integer=False, minimum=0, maximum=10 ** 7))


#: Every built-in option and its check: the one place options are validated
#: (a provider sees only values that passed). Third-party providers' own
#: options are not in here and reach them unchanged.
VALIDATORS: dict[str, Callable[[str, Any], Any]] = {
    "timeout_connect": _positive_seconds,
    "timeout_idle": _positive_seconds,
    "timeout_total": lambda n, v: None if v is None else _positive_seconds(n, v),
    "retries": _int(1, _MAX_COUNT),
    "backoff_initial": _seconds,
    "backoff_max": _seconds,
    "part_size": _bytes(1),
    "min_part_size": _bytes(1),
    "concurrency": _int(1, _MAX_COUNT),
    "readahead": _bytes(0),
    "large_read": _bytes(0),
    "stream_reads": _flag,
    "insecure": _flag,
    "anonymous": _flag,
    "allow_private_redirects": _flag,
    "redis_cluster": _flag,
    "redis_db": _int(0, _MAX_COUNT),
    "redis_chunk_size": _bytes(1),
    "headers": _headers,
    "token": _text,
    "s3_access_key_id": _text,
    "s3_secret_access_key": _text,
    "s3_session_token": _text,
    "s3_endpoint": _text,
    "s3_region": _text,
    "s3_profile": _text,
    "s3_credential_process_timeout": _positive_seconds,
    "s3_addressing_style": _choice("path", "virtual", "auto"),
    "redis_username": _text,
    "redis_password": _text,
    "ca_bundle": _local_path,
    "proxy": _proxy,
    "client_cert": _local_path,
    "client_key": _local_path,
    "s3_config_path": _local_path,
    # tensorizer loading (tensorstream.deserialize): a string "false" must not mean True
    "num_readers": _int(1, 1024),
    "verify_hash": _flag,
    "lazy_load": _flag,
    "max_tensor_bytes": _bytes(0),
    "vllm_tensorized": _flag,
}


def validate_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` with every built-in option checked and normalised (numbers
    as numbers, flags as bools); a :class:`ConfigurationError` names the
    first option that makes no sense. ``None`` means "not given"."""
    out = dict(options)
    for name, value in options.items():
        check = VALIDATORS.get(name)
        if check is not None and (value is not None or name == "timeout_total"):
            out[name] = check(name, value)
    return out


def split_options(options: dict[str, Any]) -> tuple[CommonConfig, dict[str, Any]]:
    """Split flat options into the shared config and the provider's own options.

    Every option is validated first (:func:`validate_options`)."""
    opts = validate_options(options)
    for name in sorted(DEPRECATED_OPTIONS & opts.keys()):
        opts.pop(name)
        warnings.warn(f"option {name} no longer has an effect (the read-ahead engine sizes its "
                      "requests itself); it goes away in tensorstream 0.3",
                      DeprecationWarning, stacklevel=3)

    def get(name: str, default: Any) -> Any:
        value = opts.pop(name, None)
        return default if value is None else value

    t = Timeouts(
        connect=get("timeout_connect", DEFAULT_CONNECT_TIMEOUT),
        idle=get("timeout_idle", DEFAULT_IDLE_TIMEOUT),
        total=get("timeout_total", None),
    )
    r = RetryConfig(
        attempts=get("retries", DEFAULT_ATTEMPTS),
        backoff_initial=get("backoff_initial", DEFAULT_BACKOFF_INITIAL),
        backoff_max=get("backoff_max", DEFAULT_BACKOFF_MAX),
    )
    x = TransferConfig(
        part_size=get("part_size", DEFAULT_PART_SIZE),
        concurrency=get("concurrency", DEFAULT_CONCURRENCY),
        readahead=get("readahead", DEFAULT_READAHEAD),
        stream_reads=get("stream_reads", True),
    )
    return CommonConfig(t, r, x), opts


#: Option names users bring from boto3, s3fs, obstore, aiohttp and redis-py, and ours.
_FAMILIAR_OPTIONS: dict[str, str | tuple[str, ...]] = {
    "endpoint_url": "s3_endpoint", "endpoint": "s3_endpoint", "aws_endpoint_url": "s3_endpoint",
    "aws_access_key_id": "s3_access_key_id", "access_key_id": "s3_access_key_id",
    "key": "s3_access_key_id",
    "aws_secret_access_key": "s3_secret_access_key", "secret_access_key": "s3_secret_access_key",
    "secret": "s3_secret_access_key",
    "aws_session_token": "s3_session_token", "session_token": "s3_session_token",
    "region_name": "s3_region", "region": "s3_region", "aws_region": "s3_region",
    "profile": "s3_profile", "profile_name": "s3_profile", "aws_profile": "s3_profile",
    "addressing_style": "s3_addressing_style", "virtual_hosted_style_request": "s3_addressing_style",
    "anon": "anonymous", "skip_signature": "anonymous",
    "verify": ("ca_bundle", "insecure"), "ssl_ca_certs": "ca_bundle", "cafile": "ca_bundle",
    "verify_ssl": "insecure", "ssl": "insecure", "allow_invalid_certificates": "insecure",
    "proxies": "proxy", "proxy_url": "proxy", "https_proxy": "proxy", "http_proxy": "proxy",
    "cert": "client_cert", "ssl_certfile": "client_cert", "ssl_keyfile": "client_key",
    "username": "redis_username", "password": "redis_password", "db": "redis_db",
    "cluster": "redis_cluster", "bearer_token": "token",
    "max_concurrency": "concurrency", "max_pool_connections": "concurrency",
    "num_workers": "concurrency", "max_connections": "concurrency",
    "timeout": "timeout_total", "connect_timeout": "timeout_connect",
    "read_timeout": "timeout_idle", "socket_timeout": "timeout_idle",
    "max_attempts": "retries", "num_retries": "retries", "max_retries": "retries",
    "multipart_chunksize": "part_size", "chunk_size": "part_size", "block_size": "part_size",
}


def option_hint(name: str, accepted: Iterable[str]) -> str:
    """`` (did you mean X?)`` for an unknown option ``name`` when one of
    ``accepted`` is what the user meant (a name from boto3, s3fs, obstore,
    aiohttp or redis-py, or a near spelling); else ``""``."""
    import difflib  # only on this error path: not paid by `import tensorstream`

    accepted = sorted(accepted)
    familiar = _FAMILIAR_OPTIONS.get(name.lower(), ())
    guesses = [g for g in ((familiar,) if isinstance(familiar, str) else familiar) if g in accepted]
    if not guesses:
        guesses = difflib.get_close_matches(name.lower(), accepted, n=1, cutoff=0.75)
    return f" (did you mean {' or '.join(guesses)}?)" if guesses else ""
