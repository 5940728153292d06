"""What :func:`~tensorstream.tensorizer.load.deserialize`, ``load_into_module`` and
``serialize`` check in their arguments before any byte is read or written, and the
errors they raise for them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from .._devices import parse, shown, unusable, unusable_message
from ..config import COMMON_OPTIONS, VALIDATORS, option_hint
from ..errors import ConfigurationError, InvalidURIError, TensorstreamError

__all__ = [
    "TENSORIZER_NOT_TAKEN",
    "TENSORIZER_NO_OPS",
    "DeviceUnavailableError",
    "InvalidArgumentError",
    "MetaTensorError",
    "ModuleMismatchError",
    "QuantizationWarning",
    "WrongKindOption",
    "WrongKindSource",
    "check_cpu_limit",
    "check_device",
    "check_dtype",
    "refuse_misspelt_arguments",
]


class MetaTensorError(TensorstreamError, ValueError):
    """Parameters or buffers were left on the ``meta`` device after loading."""


class ModuleMismatchError(MetaTensorError):
    """The module and the file do not hold the same tensors (``strict=True``).

    ``missing_keys`` (in the module, not in the file), ``unexpected_keys`` (in
    the file, not in the module) and ``mismatched_keys`` (``(name,
    module_shape, file_shape)``) list every difference. A subclass of
    :class:`MetaTensorError`, which a module built on ``meta`` would otherwise
    end in.
    """

    def __init__(self, message: str, *, missing_keys: list[str], unexpected_keys: list[str],
                 mismatched_keys: list[tuple[str, tuple[int, ...], tuple[int, ...]]]) -> None:
        super().__init__(message)
        self.missing_keys = missing_keys
        self.unexpected_keys = unexpected_keys
        self.mismatched_keys = mismatched_keys


class DeviceUnavailableError(ConfigurationError, RuntimeError):
    """The requested device does not exist here (``cuda`` without CUDA, a name torch
    does not know). Also a ``RuntimeError``: what tensorizer's ``TensorDeserializer``
    (and ``torch.device``) raise for the same call, and its users catch."""


class InvalidArgumentError(TensorstreamError, TypeError):
    """An argument of the wrong kind (``serialize(42, ...)``, a module that is not
    an ``nn.Module``); the message names the argument and what it takes."""


class WrongKindOption(InvalidArgumentError, ConfigurationError):
    """A ``deserialize`` argument of the wrong kind (``filter_func=5``, ``dtype=5``):
    the ``TypeError`` tensorizer's ``TensorDeserializer`` raises for it, and the
    ``ConfigurationError`` tensorstream raised before."""


class WrongKindSource(InvalidArgumentError, InvalidURIError):
    """A source ``deserialize`` does not read (an open file object): the ``TypeError``
    of an argument of the wrong kind, and the ``InvalidURIError`` it raised before."""


class QuantizationWarning(UserWarning):
    """Loading tensorizer weights into a quantized module may not work."""


def check_device(device: str | torch.device | int | None) -> torch.device | None:
    """The device, parsed; a clear error for a name torch does not know or a
    device this machine lacks (before any byte is read)."""
    if device is None:
        return None
    dev = parse(device, DeviceUnavailableError)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = ("this torch was built without CUDA" if torch.version.cuda is None
                   else "no CUDA device is visible (driver, CUDA_VISIBLE_DEVICES)")
            raise DeviceUnavailableError(
                f"device={shown(device)} was requested but CUDA is not available: {why}; "
                "use device='cpu', or install a CUDA build of torch on a machine with a GPU"
            )
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise DeviceUnavailableError(
                f"device={shown(device)} was requested but only {count} CUDA device(s) "
                f"are visible (cuda:0..cuda:{count - 1})"
            )
    lacking = unusable(dev)
    if lacking is not None:  # said before any request, not as a LoadError at the first tensor
        raise DeviceUnavailableError(unusable_message(device, lacking))
    return dev


def check_dtype(dtype: Any) -> torch.dtype | None:
    """``dtype`` as a ``torch.dtype``; ``"float16"``/``"torch.float16"`` are accepted."""
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str):
        found = getattr(torch, dtype.removeprefix("torch."), None)
        if isinstance(found, torch.dtype):
            return found
    raise (ConfigurationError if isinstance(dtype, str) else WrongKindOption)(
        f"dtype={dtype!r} is not a torch dtype; use e.g. torch.float16 or 'bfloat16'"
    )


#: Arguments tensorizer's ``TensorDeserializer`` still takes, "left for backwards
#: compatibility; has no effect": calls (and vLLM ``deserialization_kwargs``) written for
#: it pass them, and they are taken here the same way.
TENSORIZER_NO_OPS = ("plaid_mode", "plaid_mode_buffers")

#: Arguments of tensorizer's own calls that a vLLM config's ``*_kwargs`` may carry over
#: (vLLM hands ``stream_kwargs`` to ``stream_io.open_stream``, ``serialization_kwargs`` to
#: ``TensorSerializer``) and tensorstream does not take, with what to do instead: refused
#: as tensorizer's, not as a misspelling ("unknown option force_http; it takes ..."). The
#: tests check every argument of the installed tensorizer's calls is taken or listed here.
TENSORIZER_NOT_TAKEN: dict[str, tuple[str, dict[str, str]]] = {
    "stream_kwargs": ("stream_io.open_stream", {
        "mode": "the mode is the call's own: cfg.open_stream('wb')",
        "buffer_size": "tensorstream sizes its reads itself (part_size, concurrency); "
                       "leave it out",
        "force_http": "give s3_endpoint as an http:// URL instead",
        "begin": "a load reads the whole file; leave it out",
        "end": "a load reads the whole file; leave it out",
        "s3_region_name": "tensorstream's name for it is s3_region",
        "s3_signature_version": "tensorstream signs with SigV4 (anonymous=True sends "
                                "unsigned requests); leave it out",
        "certificate_handling": "give ca_bundle (a CA file) or insecure=True instead",
    }),
    "serialization_kwargs": ("TensorSerializer", {
        "compress_tensors": "tensorstream writes tensors uncompressed, as vLLM reads "
                            "them; leave it out",
    }),
}


def refuse_misspelt_arguments(options: Mapping[str, Any], front: Callable[..., Any]) -> None:
    """A ``ConfigurationError`` for an option that is a near spelling of one of ``front``'s
    own arguments (``lazy_lod``): it reached ``open`` as a storage option, whose error
    listed the storage options and guessed nothing."""
    unknown = set(options) - COMMON_OPTIONS - VALIDATORS.keys()
    if not unknown:
        return
    import inspect

    from ..providers.registry import known_option_names

    own = {n for n, p in inspect.signature(front).parameters.items()
           if p.kind is inspect.Parameter.KEYWORD_ONLY}
    for name in sorted(unknown - known_option_names()):
        hint = option_hint(name, own)
        if hint:
            raise ConfigurationError(
                f"unknown argument {name}{hint} for tensorstream.{front.__name__}; it takes "
                f"{', '.join(sorted(own))} and the options of tensorstream.open")


def check_cpu_limit(limit: Any) -> int | None:
    """``limit_cpu_concurrency``, checked before anything is written (tensorizer raises
    the same TypeError/ValueError only once the destination is open)."""
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise WrongKindOption(
            f"limit_cpu_concurrency must be a whole number of threads or None, not "
            f"{type(limit).__name__}")
    if limit < 1:
        raise ConfigurationError(
            f"limit_cpu_concurrency must be at least 1 (or None: one thread per CPU), "
            f"got {limit}")
    return limit
