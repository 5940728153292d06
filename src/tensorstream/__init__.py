"""tensorstream: move model weights between storage and accelerators.

One ranged-read interface over local disk, HTTP(S), S3 and Redis; a seekable
file object that feeds ``tensorizer.TensorDeserializer``; ``tensorstream cp``.

>>> import tensorstream
>>> with tensorstream.open("s3://bucket/model.tensors") as f:  # doctest: +SKIP
...     ...
"""


from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from . import errors
from .providers.base import BodyStream, Capabilities, ObjectInfo, Provider, Writer
from .uri import ParsedURI, parse_uri, redact

__version__ = "0.1.0"

# Front doors are imported on first use: ``import tensorstream`` stays cheap
# (no asyncio loop machinery, tenacity, read-ahead, entry points; no torch,
# tensorizer or botocore), which a short-lived ``tensorstream cp`` pays for.
_LAZY = {
    "get_provider": "tensorstream.api",
    "open": "tensorstream.api",
    "read_range": "tensorstream.api",
    "stat": "tensorstream.api",
    "StreamReader": "tensorstream.file",
    "StreamWriter": "tensorstream.file",
    "register": "tensorstream.providers.registry",
    "registered_schemes": "tensorstream.providers.registry",
    "describe_credentials": "tensorstream.credentials.describe",
    "deserialize": "tensorstream.tensorizer.load",
    "load_into_module": "tensorstream.tensorizer.load",
    "serialize": "tensorstream.tensorizer.load",
    "TensorizerConfig": "tensorstream.tensorizer.config",
    "convert": "tensorstream.conversion.api",
    "inspect": "tensorstream.inspection",
    "ModelInfo": "tensorstream.inspection",
}


#: Subpackages reached as attributes (``tensorstream.safetensors.load(...)``), imported on first use.
_LAZY_MODULES = {"safetensors"}


def __getattr__(name: str) -> _Any:
    if name in _LAZY_MODULES:
        import importlib

        return importlib.import_module(f"tensorstream.{name}")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tensorstream' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


if _TYPE_CHECKING:  # pragma: no cover
    from . import safetensors as safetensors
    from .api import get_provider, open, read_range, stat
    from .conversion.api import convert
    from .credentials.describe import describe_credentials
    from .file import StreamReader, StreamWriter
    from .inspection import ModelInfo, inspect
    from .providers.registry import register, registered_schemes
    from .tensorizer.config import TensorizerConfig
    from .tensorizer.load import deserialize, load_into_module, serialize

__all__ = [
    "BodyStream",
    "Capabilities",
    "ModelInfo",
    "ObjectInfo",
    "ParsedURI",
    "Provider",
    "StreamReader",
    "StreamWriter",
    "TensorizerConfig",
    "Writer",
    "__version__",
    "convert",
    "describe_credentials",
    "deserialize",
    "errors",
    "get_provider",
    "inspect",
    "load_into_module",
    "open",
    "parse_uri",
    "read_range",
    "redact",
    "register",
    "registered_schemes",
    "serialize",
    "stat",
]
