"""``TensorizerConfig``: vLLM's tensorizer options, wired to tensorstream.

Field and flag names match vLLM's ``TensorizerConfig`` so a vLLM user's
settings carry over. Unlike vLLM, the ``S3_ACCESS_KEY_ID`` /
``S3_SECRET_ACCESS_KEY`` / ``S3_ENDPOINT_URL`` fallbacks really reach the
stream (read by the S3 provider at their level of its order, below the
options), and any tensorstream URI works, ``redis://`` included.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..config import COMMON_OPTIONS, VALIDATORS, _text, option_hint, validate_options
from ..credentials.base import mask
from ..errors import ConfigurationError
from ..uri import redact
from ._secrets import holds_secret as _holds_secret
from ._secrets import secret_name as _secret_name
from .sharding import is_sharded, shard_uri

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from tensorizer import TensorDeserializer

    from ..file import StreamReader, StreamWriter
    from .load import ModuleLoadResult

__all__ = ["TensorizerConfig", "UnknownFieldError"]


class UnknownFieldError(ConfigurationError, TypeError):
    """A ``TensorizerConfig`` field that does not exist (a misspelt key of a config
    dict): a ``ConfigurationError`` naming it, and the ``TypeError`` Python raises for
    an unexpected keyword argument."""

#: Field -> environment variable consulted when the field is unset (vLLM's names).
ENV_FALLBACKS = {
    "s3_access_key_id": "S3_ACCESS_KEY_ID",
    "s3_secret_access_key": "S3_SECRET_ACCESS_KEY",
    "s3_endpoint": "S3_ENDPOINT_URL",
}
_KEY_PAIR = ("s3_access_key_id", "s3_secret_access_key")


def _masked_mapping(d: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if d is None:
        return None
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping) and (k == "headers" or _secret_name(k)):
            # every value: HTTP's headers, credentials={"u": ..., "p": ...}
            out[k] = {name: mask(str(value)) for name, value in v.items()}
        elif isinstance(v, Mapping):
            out[k] = _masked_mapping(v)
        else:
            out[k] = mask(str(v)) if _holds_secret(k, v) else v
    return out


#: Fields of vLLM's ``TensorizerConfig`` that vLLM's model loader fills for itself (the
#: module to build, its dtype) and tensorstream's config does not take, with what stands
#: for each here: a config dict carried over from vLLM says so, not "unknown field".
VLLM_FIELDS_NOT_TAKEN = {
    "model_class": "tensorstream loads into a module you build: cfg.load_into_module(model, "
                   "device) (build it on the meta device to allocate nothing twice)",
    "hf_config": "tensorstream loads into a module you build from it: "
                 "cfg.load_into_module(model, device)",
    "dtype": "give it to the load: deserialization_kwargs={'dtype': ...}, or "
             "cfg.deserialize(device, dtype=...)",
}


@dataclasses.dataclass(repr=False)
class TensorizerConfig:
    """vLLM-compatible tensorizer settings.

    ``tensorizer_dir`` alone means ``<dir>/model.tensors``, ``lora_dir`` alone
    ``<lora_dir>/adapter_model.tensors`` (a LoRA adapter's file); given
    ``tensorizer_uri``, ``tensorizer_dir`` is derived from it (vLLM's rules).
    ``stream_kwargs`` are extra :func:`tensorstream.open` options,
    ``deserialization_kwargs`` extra :func:`tensorstream.deserialize`
    arguments (``dtype``, ``lazy_load``, ``encryption``...) and
    ``serialization_kwargs`` extra :func:`tensorstream.serialize` arguments.

    >>> cfg = TensorizerConfig(tensorizer_dir="s3://bucket/opt-125m")
    >>> cfg.tensorizer_uri
    's3://bucket/opt-125m/model.tensors'
    """

    tensorizer_uri: str | None = None
    tensorizer_dir: str | None = None
    vllm_tensorized: bool | None = None
    verify_hash: bool | None = None
    num_readers: int | None = None
    encryption_keyfile: str | None = None
    s3_access_key_id: str | None = None
    s3_secret_access_key: str | None = None
    s3_endpoint: str | None = None
    lora_dir: str | None = None
    stream_kwargs: dict[str, Any] | None = None
    deserialization_kwargs: dict[str, Any] | None = None
    serialization_kwargs: dict[str, Any] | None = None

    def __new__(cls, *args: Any, **kwargs: Any) -> TensorizerConfig:
        # A misspelt field of a config dict (vLLM's model_loader_extra_config) was
        # Python's bare "unexpected keyword argument"; named here with the field meant.
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - fields)
        vllm_own = [n for n in unknown if n in VLLM_FIELDS_NOT_TAKEN]
        if vllm_own:  # vLLM's loader sets these itself; say what stands for each here
            name = vllm_own[0]
            raise UnknownFieldError(
                f"{name} is a field of vLLM's TensorizerConfig that tensorstream's does not "
                f"take: {VLLM_FIELDS_NOT_TAKEN[name]}")
        if unknown:
            name = unknown[0]
            raise UnknownFieldError(
                f"unknown field {name[:60]}{option_hint(name, fields)} for TensorizerConfig; "
                f"it takes {', '.join(f.name for f in dataclasses.fields(cls))}")
        return super().__new__(cls)

    def __post_init__(self) -> None:
        # Checked here, where the config is made, not at the first load: an int URI was a
        # bare TypeError, a pathlib.Path tensorizer_dir an AttributeError, and a non-string
        # key or keyfile failed only when the stream opened.
        self.tensorizer_uri = _path_or_uri("tensorizer_uri", self.tensorizer_uri)
        self.tensorizer_dir = _path_or_uri("tensorizer_dir", self.tensorizer_dir)
        # vLLM's field (TypeError "unexpected keyword argument 'lora_dir'" for a vLLM
        # config's keys): the directory of a LoRA adapter's adapter_model.tensors
        self.lora_dir = _path_or_uri("lora_dir", self.lora_dir)
        self.encryption_keyfile = _path_or_uri("encryption_keyfile", self.encryption_keyfile)
        if self.encryption_keyfile is not None and not self.encryption_keyfile.strip():
            # taken for "no encryption": serialize wrote the tensors in the clear
            # (--encryption-keyfile "$KEYFILE" with the variable unset)
            raise ConfigurationError(
                "encryption_keyfile is empty: give the key file's path or URI, or leave it "
                "out (None) to write and read the tensors unencrypted")
        for name in ENV_FALLBACKS:
            if getattr(self, name) is not None:
                _text(name, getattr(self, name))
        for name in ("stream_kwargs", "deserialization_kwargs", "serialization_kwargs"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, Mapping):
                raise ConfigurationError(
                    f"{name} must be a mapping of option name to value, got "
                    f"{type(value).__name__}")
        _refuse_unknown_keys(self.stream_kwargs, self.deserialization_kwargs,
                             self.serialization_kwargs)
        if self.tensorizer_uri:
            derived = self.tensorizer_uri.rsplit("/", 1)[0] if "/" in self.tensorizer_uri else ""
            if self.tensorizer_dir and self.tensorizer_dir.rstrip("/") != derived.rstrip("/"):
                # The given dir was replaced by the URI's without a word. vLLM takes the URI's
                # too (its configs carry both), and says so: a warning, not an error.
                warnings.warn(
                    f"tensorizer_dir {redact(self.tensorizer_dir)!r} is not the directory of "
                    f"tensorizer_uri {redact(self.tensorizer_uri)!r}; the URI's is used",
                    UserWarning, stacklevel=3)
            self.tensorizer_dir = derived
        elif self.tensorizer_dir and self.lora_dir:
            raise ConfigurationError(
                "tensorizer_dir and lora_dir each name the file to use (<dir>/model.tensors, "
                "<lora_dir>/adapter_model.tensors): give one, or tensorizer_uri")
        elif self.tensorizer_dir:
            self.tensorizer_uri = f"{self.tensorizer_dir.rstrip('/')}/model.tensors"
        elif self.lora_dir:
            self.tensorizer_uri = f"{self.lora_dir.rstrip('/')}/adapter_model.tensors"
            self.tensorizer_dir = self.lora_dir.rstrip("/")
        else:
            raise ConfigurationError(
                "TensorizerConfig needs tensorizer_uri (e.g. s3://bucket/model.tensors), "
                "tensorizer_dir (the file is then <dir>/model.tensors) or lora_dir "
                "(<lora_dir>/adapter_model.tensors)"
            )
        # Checked here, where the config is made, not at the first load.
        checked = validate_options({"num_readers": self.num_readers,
                                    "verify_hash": self.verify_hash,
                                    "vllm_tensorized": self.vllm_tensorized})
        self.num_readers, self.verify_hash = checked["num_readers"], checked["verify_hash"]
        self.vllm_tensorized = checked["vllm_tensorized"]
        self.stream_kwargs = validate_options(dict(self.stream_kwargs or {}))
        self.deserialization_kwargs = validate_options(dict(self.deserialization_kwargs or {}))
        self.serialization_kwargs = dict(self.serialization_kwargs or {})
        self._refuse_conflicts()

    def _refuse_conflicts(self) -> None:
        """One option given two different values: the ``s3_*`` field and ``stream_kwargs``
        (``stream_kwargs`` silently won), or ``stream_kwargs`` and the ``*_kwargs`` of the
        call it goes with (a bare "got multiple values for keyword argument")."""
        stream = self.stream_kwargs or {}
        for name in ENV_FALLBACKS:
            given = getattr(self, name)
            if given is not None and name in stream and stream[name] != given:
                # the values are not shown: one may be a secret
                raise ConfigurationError(
                    f"{name} is given twice with different values: as the field and in "
                    "stream_kwargs; give it once")
        for kwargs in ("deserialization_kwargs", "serialization_kwargs"):
            other = getattr(self, kwargs) or {}
            if self.encryption_keyfile and "encryption" in other:
                # the kwargs' encryption replaced the keyfile's without a word: with
                # encryption=None, serialize wrote the tensors unencrypted
                raise ConfigurationError(
                    f"encryption_keyfile and {kwargs}['encryption'] both say how to "
                    "encrypt; give one")
            for name in sorted(other.keys() & stream.keys()):
                if other[name] != stream[name]:
                    raise ConfigurationError(
                        f"{name} is given twice with different values: in stream_kwargs and "
                        f"in {kwargs}; give it once")

    # -- presentation: secrets never shown or pickled -------------------------
    def __repr__(self) -> str:
        shown = []
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name == "s3_secret_access_key":
                v = mask(v) if v else None
            elif f.name in ("tensorizer_uri", "tensorizer_dir", "encryption_keyfile",
                            "s3_endpoint", "lora_dir") and isinstance(v, str):
                v = redact(v)
            elif isinstance(v, dict):
                v = _masked_mapping(v)
            shown.append(f"{f.name}={v!r}")
        return f"TensorizerConfig({', '.join(shown)})"

    __str__ = __repr__

    def __reduce__(self) -> Any:
        kwargs = (self.stream_kwargs, self.deserialization_kwargs, self.serialization_kwargs)
        if self.s3_secret_access_key or any(
            _holds_secret(k, v) for d in kwargs for k, v in (d or {}).items()
        ) or any(  # a URI's password or presigned signature
            isinstance(v, str) and redact(v) != v
            for v in (self.tensorizer_uri, self.tensorizer_dir, self.encryption_keyfile,
                      self.s3_endpoint, self.lora_dir)
        ):
            raise TypeError(
                "refusing to pickle a TensorizerConfig holding secrets; pass them through "
                "the environment (S3_SECRET_ACCESS_KEY) in the receiving process instead"
            )
        # Not dataclasses.asdict: it turned an Encryption in *_kwargs into a plain dict.
        return (_rebuild, ({f.name: getattr(self, f.name) for f in dataclasses.fields(self)},))

    # -- derived settings ------------------------------------------------------
    @property
    def is_sharded(self) -> bool:
        """True when ``tensorizer_uri`` holds a rank template such as ``%03d``."""
        return is_sharded(self.tensorizer_uri or "")

    def _uri(self) -> str:
        assert self.tensorizer_uri is not None  # __post_init__ requires one
        return self.tensorizer_uri

    def uri_for(self, rank: int | None = None, world_size: int | None = None) -> str:
        """``tensorizer_uri`` with the rank template filled in."""
        assert self.tensorizer_uri is not None
        return shard_uri(self.tensorizer_uri, rank=rank, world_size=world_size)

    def verify_with_parallel_config(self, world_size: int) -> None:
        """Raise unless a world size above 1 comes with a rank template (vLLM's check)."""
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            # "2" was a bare TypeError from '>', and 0 or -1 passed as if it were 1
            raise ConfigurationError(
                f"tensor parallel size must be an integer >= 1, got {world_size!r}")
        if world_size > 1 and not self.is_sharded:
            raise ConfigurationError(
                f"tensor parallel size is {world_size} but tensorizer_uri has no rank template; "
                "use a zero-padded one such as 'model-rank-%03d.tensors'"
            )

    def stream_options(self) -> dict[str, Any]:
        """Options for :func:`tensorstream.open`: ``stream_kwargs`` plus the ``s3_*``
        fields given. Their variables (``S3_ACCESS_KEY_ID``, ``S3_SECRET_ACCESS_KEY``,
        ``S3_ENDPOINT_URL``) are read by the S3 provider, at their own level of its order
        (below options, above ``AWS_*``); only the half of a key pair given as a field
        takes its other half from its variable (vLLM's fallback, field by field)."""
        opts = dict(self.stream_kwargs or {})
        given = {name: getattr(self, name) for name in ENV_FALLBACKS if getattr(self, name)}
        # Copied into the options, the variables outranked what the options say: with
        # stream_kwargs anonymous=True they were "contradicting" keys, an s3_profile lost
        # to them, an error blamed options never given, and a local model's options
        # were never empty (no local fast path).
        if sum(name in given or name in opts for name in _KEY_PAIR) == 1:
            for name in _KEY_PAIR:
                value = os.environ.get(ENV_FALLBACKS[name])
                if name not in given and name not in opts and value:
                    given[name] = value
        for name, value in given.items():
            opts.setdefault(name, value)
        return opts

    def _load_options(self) -> dict[str, Any]:
        """:meth:`stream_options` for a load or a save, less ``sequential``: an argument
        of :meth:`open_stream` (``tensorstream.open``); a load chooses its reads itself
        (it was a bare TypeError there, "got multiple values for keyword argument")."""
        opts = self.stream_options()
        opts.pop("sequential", None)
        return opts

    def deserializer_options(self) -> dict[str, Any]:
        """Keyword arguments for :func:`tensorstream.deserialize` (options excluded)."""
        kw: dict[str, Any] = {}
        if self.num_readers is not None:
            kw["num_readers"] = self.num_readers
        if self.verify_hash is not None:
            kw["verify_hash"] = bool(self.verify_hash)
        if self.encryption_keyfile:
            from .crypto import Encryption

            kw["encryption"] = Encryption(keyfile=self.encryption_keyfile)
        kw.update(self.deserialization_kwargs or {})
        return kw

    def serializer_options(self) -> dict[str, Any]:
        """Keyword arguments for :func:`tensorstream.serialize` (options excluded)."""
        kw: dict[str, Any] = {}
        if self.encryption_keyfile:
            from .crypto import Encryption

            kw["encryption"] = Encryption(keyfile=self.encryption_keyfile)
        kw.update(self.serialization_kwargs or {})
        return kw

    # -- actions ---------------------------------------------------------------
    def open_stream(
        self, mode: str = "rb", *, rank: int | None = None, world_size: int | None = None
    ) -> StreamReader | StreamWriter:
        """``tensorstream.open`` of this rank's file with :meth:`stream_options`."""
        from ..api import open as ts_open

        return ts_open(self.uri_for(rank, world_size), mode, **self.stream_options())  # type: ignore[call-overload,no-any-return]

    def deserialize(
        self,
        device: str | torch.device | int | None = None,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        **overrides: Any,
    ) -> TensorDeserializer:
        """:func:`tensorstream.deserialize` with these settings."""
        from .load import deserialize

        # one dict, the call's overrides last: an option given here and in stream_kwargs
        # was a TypeError ("got multiple values for keyword argument")
        kw = {**self._load_options(), **self.deserializer_options(), **overrides}
        device = _device(device, kw)
        if "strict" not in overrides:  # load_into_module's, in the kwargs both share
            kw.pop("strict", None)
        # deserialize() fills the rank template: with group= an untemplated URI is one file
        # for the group (uri_for() refused it: "world size is 2 but ... no rank template")
        return deserialize(self._uri(), device, rank=rank, world_size=world_size, **kw)

    def load_into_module(
        self,
        module: torch.nn.Module,
        device: str | torch.device | int | None = None,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        **overrides: Any,
    ) -> ModuleLoadResult:
        """:func:`tensorstream.load_into_module` with these settings."""
        from .load import load_into_module

        kw = {**self._load_options(), **self.deserializer_options(), **overrides}
        device = _device(device, kw)
        return load_into_module(module, self._uri(), device, rank=rank, world_size=world_size,
                                **kw)

    def serialize(
        self, obj: Any, *, rank: int | None = None, world_size: int | None = None
    ) -> str:
        """:func:`tensorstream.serialize` ``obj`` to this rank's URI; returns the URI."""
        from .load import serialize

        kw = {**self._load_options(), **self.serializer_options()}
        return serialize(obj, self.uri_for(rank, world_size), **kw)

    # -- command line ------------------------------------------------------------
    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        """Register vLLM's tensorizer flags on ``parser`` (in a "tensorizer options" group)."""
        g = parser.add_argument_group("tensorizer options")
        g.add_argument("--tensorizer-uri", default=None,
                       help="tensorizer file: a path or an http(s)://, s3:// or redis:// URI; "
                            "may hold a rank template such as model-rank-%%03d.tensors")
        g.add_argument("--tensorizer-dir", default=None,
                       help="directory URI holding model.tensors (instead of --tensorizer-uri)")
        g.add_argument("--verify-hash", action="store_true", default=None,
                       help="check every tensor against the hash stored in the file")
        g.add_argument("--encryption-keyfile", default=None,
                       help="URI of the binary key file used to decrypt (or encrypt) tensors")
        # vLLM's flag until it detected vLLM files itself: its command lines still carry it
        g.add_argument("--vllm-tensorized", action="store_true", default=None,
                       help="accepted for vLLM's command lines; a vLLM-serialized file is "
                            "detected (is_vllm_tensorized)")
        g.add_argument("--num-readers", type=int, default=None,
                       help="parallel readers (default: tensorstream's)")
        g.add_argument("--s3-access-key-id", default=None,
                       help="S3 access key id (default: $S3_ACCESS_KEY_ID, then AWS's chain)")
        g.add_argument("--s3-secret-access-key", default=None,
                       help="S3 secret key (default: $S3_SECRET_ACCESS_KEY, then AWS's chain)")
        g.add_argument("--s3-endpoint", default=None,
                       help="S3 endpoint URL (default: $S3_ENDPOINT_URL, then AWS's)")
        return parser

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> TensorizerConfig:
        """Build from parsed flags (any attribute named like a field is used)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{n: getattr(args, n) for n in names if getattr(args, n, None) is not None})


def _path_or_uri(name: str, value: Any) -> str | None:
    """``value`` as a string: a URI, a path or a ``PathLike``; ``None`` stays ``None``."""
    if value is None:
        return None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise ConfigurationError(
            f"{name} must be a URI or a path (str or os.PathLike), got {type(value).__name__}")
    return _text(name, value)


def _refuse_unknown_keys(stream: Mapping[str, Any] | None,
                         deserialization: Mapping[str, Any] | None,
                         serialization: Mapping[str, Any] | None) -> None:
    """A key of a ``*_kwargs`` that neither its call nor any service takes: named, with the
    name meant, when the config is made. It failed only at the first load or save, and
    until then the repr showed its value (``{'encrypton': b'<the key>'}``). Names only:
    a value may be a secret."""
    import inspect

    from ..api import open as ts_open
    from ..providers.registry import known_option_names, unknown_option_names
    from .arguments import TENSORIZER_NO_OPS, TENSORIZER_NOT_TAKEN
    from .load import deserialize, load_into_module, serialize

    def own(*fronts: Any) -> set[str]:
        return {n for front in fronts for n, p in inspect.signature(front).parameters.items()
                if p.kind is inspect.Parameter.KEYWORD_ONLY}

    loads = own(deserialize, load_into_module) | set(TENSORIZER_NO_OPS) | {"device"}
    for field, given, takes, what in (
            ("stream_kwargs", stream, own(ts_open), "option"),
            ("deserialization_kwargs", deserialization, loads, "argument"),
            ("serialization_kwargs", serialization, own(serialize), "argument")):
        left = {str(k) for k in (given or {})} - takes - COMMON_OPTIONS - VALIDATORS.keys()
        unknown = sorted(unknown_option_names(left)) if left else []
        if unknown:
            name = unknown[0]
            call, instead = TENSORIZER_NOT_TAKEN.get(field, ("", {}))
            if name in instead:
                raise ConfigurationError(f"{field}: {name} is an argument of tensorizer's "
                                         f"{call} that tensorstream does not take: "
                                         f"{instead[name]}")
            options = known_option_names() | COMMON_OPTIONS
            listed = (", ".join(sorted(takes | options)) if what == "option" else
                      f"{', '.join(sorted(takes))} and the options of tensorstream.open")
            raise ConfigurationError(
                f"{field}: unknown {what} {name[:60]}{option_hint(name, takes | options)}; "
                f"it takes {listed}")


def _device(device: Any, kw: dict[str, Any]) -> Any:
    """The call's ``device``, else ``deserialization_kwargs``' (taken out of ``kw``): vLLM
    passes its deserialization_kwargs to TensorDeserializer, whose ``device`` they may hold;
    here that was a TypeError ("got multiple values for argument 'device'")."""
    given = kw.pop("device", None)
    return given if device is None else device


def _rebuild(state: dict[str, Any]) -> TensorizerConfig:
    return TensorizerConfig(**state)
