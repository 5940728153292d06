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
from .api import get_provider, open, read_range, stat
from .file import StreamReader, StreamWriter
from .providers.base import BodyStream, Capabilities, ObjectInfo, Provider, Writer
from .providers.registry import register, registered_schemes
from .uri import ParsedURI, parse_uri, redact

__version__ = "0.1.0"

# Heavier front doors (torch/tensorizer, botocore) are imported on first use.
_LAZY = {
    "describe_credentials": "tensorstream.credentials.describe",
    "deserialize": "tensorstream.tensorizer.load",
    "load_into_module": "tensorstream.tensorizer.load",
    "serialize": "tensorstream.tensorizer.load",
    "TensorizerConfig": "tensorstream.tensorizer.config",
}


def __getattr__(name: str) -> _Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tensorstream' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


if _TYPE_CHECKING:  # pragma: no cover
    from .credentials.describe import describe_credentials
    from .tensorizer.config import TensorizerConfig
    from .tensorizer.load import deserialize, load_into_module, serialize

__all__ = [
    "BodyStream",
    "Capabilities",
    "ObjectInfo",
    "ParsedURI",
    "Provider",
    "StreamReader",
    "StreamWriter",
    "TensorizerConfig",
    "Writer",
    "__version__",
    "describe_credentials",
    "deserialize",
    "errors",
    "get_provider",
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
