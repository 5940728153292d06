"""tensorizer front door: load tensorizer files from any backend, serialize to any backend.

Imported lazily (torch and tensorizer are heavy). See docs/load-a-model.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._compat import lazy_exports

if TYPE_CHECKING:  # pragma: no cover
    from .config import TensorizerConfig
    from .crypto import DecryptionError, Encryption, TensorHashMismatchError, generate_keyfile
    from .load import (
        DEFAULT_LOCAL_NUM_READERS,
        DEFAULT_NUM_READERS,
        DeviceUnavailableError,
        InvalidArgumentError,
        LoadError,
        MetaTensorError,
        ModuleLoadResult,
        ModuleMismatchError,
        QuantizationWarning,
        deserialize,
        is_vllm_tensorized,
        load_into_module,
        serialize,
    )
    from .sharding import is_sharded, shard_uri
    from .stats import LoadStats

_WHERE = {
    "DEFAULT_LOCAL_NUM_READERS": "load",
    "DEFAULT_NUM_READERS": "load",
    "DecryptionError": "crypto",
    "DeviceUnavailableError": "load",
    "Encryption": "crypto",
    "InvalidArgumentError": "load",
    "LoadError": "load",
    "LoadStats": "stats",
    "MetaTensorError": "load",
    "ModuleLoadResult": "load",
    "ModuleMismatchError": "load",
    "QuantizationWarning": "load",
    "TensorHashMismatchError": "crypto",
    "TensorizerConfig": "config",
    "deserialize": "load",
    "generate_keyfile": "crypto",
    "is_sharded": "sharding",
    "is_vllm_tensorized": "load",
    "load_into_module": "load",
    "serialize": "load",
    "shard_uri": "sharding",
}

__all__ = [
    "DEFAULT_LOCAL_NUM_READERS",
    "DEFAULT_NUM_READERS",
    "DecryptionError",
    "DeviceUnavailableError",
    "Encryption",
    "InvalidArgumentError",
    "LoadError",
    "LoadStats",
    "MetaTensorError",
    "ModuleLoadResult",
    "ModuleMismatchError",
    "QuantizationWarning",
    "TensorHashMismatchError",
    "TensorizerConfig",
    "deserialize",
    "generate_keyfile",
    "is_sharded",
    "is_vllm_tensorized",
    "load_into_module",
    "serialize",
    "shard_uri",
]


__getattr__ = lazy_exports(__name__, _WHERE)
