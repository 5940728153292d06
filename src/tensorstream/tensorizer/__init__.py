"""tensorizer front door: load tensorizer files from any backend, serialize to any backend.

Imported lazily (torch and tensorizer are heavy). See docs/load-a-model.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._compat import lazy_exports

if TYPE_CHECKING:  # pragma: no cover
    from .arguments import (
        DeviceUnavailableError,
        InvalidArgumentError,
        MetaTensorError,
        ModuleMismatchError,
        QuantizationWarning,
    )
    from .config import TensorizerConfig
    from .crypto import DecryptionError, Encryption, TensorHashMismatchError, generate_keyfile
    from .load import (
        DEFAULT_LOCAL_NUM_READERS,
        DEFAULT_NUM_READERS,
        LoadError,
        deserialize,
        is_vllm_tensorized,
        load_into_module,
    )
    from .module import ModuleLoadResult
    from .save import serialize
    from .sharding import is_sharded, shard_uri
    from .stats import LoadStats

_WHERE = {
    "DEFAULT_LOCAL_NUM_READERS": "load",
    "DEFAULT_NUM_READERS": "load",
    "DecryptionError": "crypto",
    "DeviceUnavailableError": "arguments",
    "Encryption": "crypto",
    "InvalidArgumentError": "arguments",
    "LoadError": "load",
    "LoadStats": "stats",
    "MetaTensorError": "arguments",
    "ModuleLoadResult": "module",
    "ModuleMismatchError": "arguments",
    "QuantizationWarning": "arguments",
    "TensorHashMismatchError": "crypto",
    "TensorizerConfig": "config",
    "deserialize": "load",
    "generate_keyfile": "crypto",
    "is_sharded": "sharding",
    "is_vllm_tensorized": "load",
    "load_into_module": "load",
    "serialize": "save",
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
