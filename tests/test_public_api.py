"""What users import must not break: the exact public surface, entry points and documented paths."""

from __future__ import annotations

import importlib
import subprocess
import sys
import types
import warnings
from importlib.metadata import entry_points

import pytest

import tensorstream

EXPECTED_ALL = [
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


def test_all_is_exact_and_sorted() -> None:
    assert tensorstream.__all__ == EXPECTED_ALL
    assert tensorstream.__all__ == sorted(tensorstream.__all__)


def test_every_exported_name_resolves() -> None:
    for name in tensorstream.__all__:
        assert getattr(tensorstream, name) is not None, name


def test_no_public_name_outside_all() -> None:
    public = {n for n, v in vars(tensorstream).items()
              if not n.startswith("_") and not isinstance(v, types.ModuleType)}
    assert public <= set(tensorstream.__all__)


def test_entry_points_and_console_script_resolve() -> None:
    from tensorstream.providers.registry import ENTRY_POINT_GROUP

    assert ENTRY_POINT_GROUP == "tensorstream.providers"
    (plugin,) = [ep for ep in entry_points(group="pytest11") if ep.name == "tensorstream"]
    assert plugin.load().__name__ == "tensorstream.testing.plugin"
    (script,) = [ep for ep in entry_points(group="console_scripts") if ep.name == "tensorstream"]
    assert callable(script.load())


@pytest.mark.parametrize("module", [
    "tensorstream.api",
    "tensorstream.config",
    "tensorstream.errors",
    "tensorstream.file",
    "tensorstream.uri",
    "tensorstream.copy",
    "tensorstream.tensorizer",
    "tensorstream.safetensors",
    "tensorstream.layers",
    "tensorstream.readahead",
    "tensorstream.providers.base",
    "tensorstream.providers.registry",
    "tensorstream.providers.local",
    "tensorstream.providers.http",
    "tensorstream.providers.s3",
    "tensorstream.providers.redis",
    "tensorstream.providers.fsspec",
    "tensorstream.credentials.describe",
    "tensorstream.distributed",
    "tensorstream.testing.distributed",
    "tensorstream.testing.conformance",
    "tensorstream.testing.faults",
    "tensorstream.testing.plugin",
])
def test_documented_modules_import(module: str) -> None:
    importlib.import_module(module)


@pytest.mark.parametrize(("old", "name"), [
    ("tensorstream.policy", "PolicyProvider"),
    ("tensorstream.prefetch", "Prefetcher"),
    ("tensorstream.tensorizer_io", "deserialize"),
    ("tensorstream.tensorizer_io", "TensorizerConfig"),
    ("tensorstream.keys", "safe_relative_key"),
    ("tensorstream.copy_sinks", "BufferPool"),
    ("tensorstream.providers.fsspec_adapter", "FsspecProvider"),
    ("tensorstream.credentials.s3", "resolve_s3_credentials"),
    ("tensorstream.credentials.http", "resolve_http_credentials"),
    ("tensorstream.credentials.redis", "resolve_redis_credentials"),
])
def test_moved_modules_keep_a_warning_shim(old: str, name: str) -> None:
    code = (f"import warnings; warnings.simplefilter('error');\n"
            f"try:\n    import {old}\nexcept DeprecationWarning as w:\n    print('warned', w)\n"
            f"warnings.simplefilter('ignore'); import {old} as m; getattr(m, {name!r})")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "warned" in out.stdout and "moved to" in out.stdout


def test_registry_strings_of_builtin_providers_import() -> None:
    from tensorstream.providers import registry

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for scheme in ("file", "http", "https", "s3", "redis", "rediss"):
            assert registry.resolve_provider_class(scheme).__name__.endswith("Provider")


def test_safetensors_front_door_surface() -> None:
    import tensorstream.safetensors as st

    assert st.__all__ == ["DEFAULT_NUM_READERS", "MAX_HEADER_SIZE", "SafeOpen", "SafeSlice",
                          "iter_tensors", "load", "open", "save"]
    for name in st.__all__:
        assert getattr(st, name) is not None, name
    assert callable(st.load) and callable(st.save) and callable(st.open)
