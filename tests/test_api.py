"""Public API surface, error hierarchy, options, shared policies and the I/O loop."""

from __future__ import annotations

import asyncio
import inspect
import pickle
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import pytest

import tensorstream
from tensorstream import _loop, errors
from tensorstream.config import RetryConfig, split_options, validate_options
from tensorstream.layers.stack import PolicyProvider
from tensorstream.providers.base import Capabilities, ObjectInfo, Pin, Provider


def test_all_is_exact_and_importable() -> None:
    for name in tensorstream.__all__:
        assert getattr(tensorstream, name) is not None, name
    public = {n for n in dir(tensorstream) if not n.startswith("_")}
    modules = {n for n in public if inspect.ismodule(getattr(tensorstream, n))}
    assert public - modules <= set(tensorstream.__all__)
    assert set(tensorstream.__all__) <= set(dir(tensorstream))


def test_importing_the_package_loads_only_its_errors() -> None:
    """``import tensorstream`` is what every program and every ``tensorstream cp`` pays
    first: the rest (dataclasses, pathlib, the providers' base, URIs) comes on first use."""
    import subprocess
    import sys

    code = ("import sys; before = set(sys.modules); import tensorstream\n"
            "new = set(sys.modules) - before\n"
            "print(sorted(m for m in new if m.startswith('tensorstream')))\n"
            "print(sorted(m for m in ('dataclasses', 'inspect', 'pathlib', 'asyncio', 'threading',\n"
            "                          'datetime', 'urllib.parse') if m in new))\n"
            "assert tensorstream.parse_uri('s3://b/k').bucket == 'b'\n"
            "assert tensorstream.Provider.__module__ == 'tensorstream.providers.base'\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    ours, heavy = out.stdout.splitlines()
    assert ours == "['tensorstream', 'tensorstream.errors']"
    assert heavy == "[]"


@pytest.mark.parametrize(
    "cls,builtin",
    [
        (errors.NotFoundError, FileNotFoundError),
        (errors.PermissionDeniedError, PermissionError),
        (errors.StorageTimeoutError, TimeoutError),
        (errors.InvalidURIError, ValueError),
        (errors.ConfigurationError, ValueError),
        (errors.ObjectChangedError, OSError),
        (errors.ConnectionFailedError, ConnectionError),
    ],
)
def test_errors_subclass_builtins(cls: type, builtin: type) -> None:
    assert issubclass(cls, errors.TensorstreamError) and issubclass(cls, builtin)


def test_error_context_and_pickle() -> None:
    exc = errors.NotFoundError("no such key").with_context(service="s3", operation="stat",
                                                           path="b/k")
    assert str(exc) == "s3 stat b/k: no such key"
    clone = pickle.loads(pickle.dumps(exc))
    assert type(clone) is errors.NotFoundError and str(clone) == str(exc)


def test_unknown_scheme_lists_registered() -> None:
    with pytest.raises(errors.UnknownSchemeError, match="s3"):
        tensorstream.get_provider("nosuchscheme-xyz://a/b")


def test_unknown_option_is_rejected(tmp_path: Any) -> None:
    with pytest.raises(errors.ConfigurationError, match="s3_acess_key"):
        tensorstream.get_provider(str(tmp_path), s3_acess_key="x")
    # options of other backends are accepted and ignored (one dict serves a cp)
    tensorstream.get_provider(str(tmp_path), s3_region="us-east-1")


@pytest.mark.parametrize(("uri", "given", "meant"), [
    ("s3://b/k", "endpoint_url", "s3_endpoint"),  # boto3 / s3fs
    ("s3://b/k", "region_name", "s3_region"),
    ("s3://b/k", "aws_secret_access_key", "s3_secret_access_key"),
    ("s3://b/k", "anon", "anonymous"),  # s3fs
    ("s3://b/k", "verify", "ca_bundle or insecure"),
    ("s3://b/k", "s3_endpont", "s3_endpoint"),  # a typo
    ("https://h/k", "verify_ssl", "insecure"),  # aiohttp
    ("https://h/k", "timeout", "timeout_total"),
    ("redis://h/k", "password", "redis_password"),  # redis-py
    ("redis://h/k", "db", "redis_db"),
])
def test_an_unknown_option_names_the_one_meant(uri: str, given: str, meant: str) -> None:
    with pytest.raises(errors.ConfigurationError) as info:
        tensorstream.get_provider(uri, **{given: "secret-value-1"})
    assert f"{given} (did you mean {meant}?)" in str(info.value)
    assert "secret-value-1" not in str(info.value)


def test_an_unknown_option_with_nothing_like_it_gets_no_guess() -> None:
    with pytest.raises(errors.ConfigurationError) as info:
        tensorstream.get_provider("s3://b/k", banana=1)
    assert "did you mean" not in str(info.value)
    # a name only another service takes is not suggested for this one
    with pytest.raises(errors.ConfigurationError) as info:
        tensorstream.get_provider("https://h/k", password="x")
    assert "redis_password" not in str(info.value).split(";")[0]


def test_split_options_validates() -> None:
    common, rest = split_options({"part_size": 1024, "retries": 2, "token": "x"})
    assert common.transfer.part_size == 1024 and common.retry.attempts == 2
    assert rest == {"token": "x"}
    with pytest.raises(ValueError):
        RetryConfig(attempts=0)


class FlakyProvider(Provider):
    """An in-memory provider whose reads break in scripted ways."""

    service = "flaky"
    capabilities: ClassVar[Capabilities] = Capabilities()

    def __init__(self, data: bytes, script: list[str]) -> None:
        self.data = data
        self.script = list(script)
        self.calls: list[tuple[int, int]] = []

    @classmethod
    def from_uri(cls, uri: Any, **options: Any) -> Provider:
        raise NotImplementedError

    async def stat(self, path: str) -> ObjectInfo:
        return ObjectInfo(path=path, size=len(self.data), etag="v1")

    async def readinto(self, path: str, offset: int, buffer: memoryview, *,
                       pin: Pin | None = None) -> int:
        self.calls.append((offset, len(buffer)))
        action = self.script.pop(0) if self.script else "ok"
        if action == "cut":
            half = len(buffer) // 2
            buffer[:half] = self.data[offset : offset + half]
            raise errors.IncompleteReadError("cut", received=half)
        if action == "503":
            raise errors.ServiceUnavailableError("slow down", retry_after=0.01)
        if action == "404":
            raise errors.NotFoundError("gone")
        buffer[:] = self.data[offset : offset + len(buffer)]
        return len(buffer)


def _policy(inner: Provider, attempts: int = 4) -> PolicyProvider:
    common, _ = split_options({"retries": attempts, "backoff_initial": 0.001,
                               "backoff_max": 0.01})
    return PolicyProvider(inner, common)


async def test_resume_continues_from_last_byte() -> None:
    data = bytes(range(256)) * 100
    inner = FlakyProvider(data, ["cut", "cut"])
    buf = bytearray(len(data))
    await _policy(inner).readinto("x", 0, memoryview(buf))
    assert buf == data
    # each retry starts where the previous attempt stopped
    assert [c[0] for c in inner.calls] == [0, len(data) // 2, len(data) // 2 + len(data) // 4]


async def test_retry_then_give_up_names_attempts() -> None:
    inner = FlakyProvider(b"x" * 10, ["503"] * 10)
    with pytest.raises(errors.RetriesExhaustedError) as info:
        await _policy(inner, attempts=3).read_range("x", 0, 10)
    assert info.value.attempts == 3 and "3 attempts" in str(info.value)
    assert "flaky read" in str(info.value)


async def test_permanent_errors_are_not_retried() -> None:
    inner = FlakyProvider(b"x" * 10, ["404"])
    with pytest.raises(FileNotFoundError):
        await _policy(inner).read_range("x", 0, 10)
    assert len(inner.calls) == 1


async def test_faulty_reads_come_back_exact() -> None:
    data = bytes(range(256)) * 4096
    inner = FlakyProvider(data, ["ok", "cut", "503", "ok", "cut"] * 3)
    policy = _policy(inner, attempts=6)
    buf = bytearray(len(data))
    for start in range(0, len(data), 64 << 10):
        await policy.readinto("x", start, memoryview(buf)[start : start + (64 << 10)])
    assert buf == data


def test_policy_wrapper_forwards_every_provider_method() -> None:
    methods = {n for n, v in vars(Provider).items() if callable(v) and not n.startswith("__")}
    methods -= {"from_uri"}
    overridden = {n for n in vars(PolicyProvider)}
    assert methods <= overridden, methods - overridden


def test_sync_api_inside_running_loop_does_not_deadlock(tmp_path: Any) -> None:
    p = tmp_path / "x"
    p.write_bytes(b"abc")

    async def inside() -> bytes:
        with tensorstream.open(p) as f:  # sync API from a thread running its own loop
            return f.read()

    assert asyncio.run(inside()) == b"abc"


def test_sync_api_from_io_thread_raises_at_once(tmp_path: Any) -> None:
    p = tmp_path / "x"
    p.write_bytes(b"abc")

    async def on_io_thread() -> str:
        try:
            tensorstream.open(p)
        except RuntimeError as exc:
            return str(exc)
        return "no error"

    msg = _loop.run_sync(on_io_thread(), timeout=10)
    assert "own I/O thread" in msg


def test_stream_reader_is_not_picklable(tmp_path: Any) -> None:
    p = tmp_path / "x"
    p.write_bytes(b"abc")
    with tensorstream.open(p) as f, pytest.raises(TypeError):
        pickle.dumps(f)


def test_fork_child_can_use_tensorstream(tmp_path: Any) -> None:
    import os
    import subprocess
    import sys

    p = tmp_path / "x"
    p.write_bytes(b"abcdef")
    code = f"""
import os, sys, tensorstream
with tensorstream.open({str(p)!r}) as f: assert f.read() == b"abcdef"
pid = os.fork()
if pid == 0:
    with tensorstream.open({str(p)!r}) as f:
        os._exit(0 if f.read() == b"abcdef" else 3)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""
    proc = subprocess.run([sys.executable, "-c", code], timeout=60, env=os.environ.copy())
    assert proc.returncode == 0


def test_a_writer_does_not_import_the_read_side(tmp_path: Any) -> None:
    """``open(uri, "wb")`` imports the writer, not the reader and its read-ahead (tens of
    milliseconds of a short-lived process that only writes)."""
    import os
    import subprocess
    import sys

    p = tmp_path / "x"
    code = f"""
import sys, tensorstream
with tensorstream.open({str(p)!r}, "wb") as f:
    f.write(b"abc")
loaded = [m for m in ("tensorstream.file", "tensorstream.readahead.ranged") if m in sys.modules]
assert not loaded, loaded
with tensorstream.open({str(p)!r}) as f:
    assert f.read() == b"abc"
"""
    proc = subprocess.run([sys.executable, "-c", code], timeout=60, env=os.environ.copy(),
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


async def _agen() -> AsyncIterator[int]:  # keeps the AsyncIterator import used in typing
    yield 1


@pytest.mark.parametrize("name", ["min_part_size", "large_read"])
def test_options_that_nothing_reads_warn_and_are_dropped(name: str) -> None:
    with pytest.warns(DeprecationWarning, match=name):
        common, rest = split_options({name: 1 << 20, "part_size": 1 << 20})
    assert name not in rest and not hasattr(common.transfer, name)



@pytest.mark.parametrize(("given", "bytes_"), [
    ("8MiB", 8 << 20), ("64M", 64 << 20), ("1GiB", 1 << 30), ("1.5G", 3 << 29), (" 4 mib ", 4 << 20),
    ("2097152", 2 << 20), (2 << 20, 2 << 20), ("512k", 512 << 10),
])
def test_byte_options_take_sizes_with_units(given: Any, bytes_: int) -> None:
    common, _ = split_options({"part_size": given, "readahead": given})
    assert common.transfer.part_size == bytes_ and common.transfer.readahead == bytes_
    assert validate_options({"redis_chunk_size": given})["redis_chunk_size"] == bytes_


@pytest.mark.parametrize("bad", ["10XB", "-1", "8 MiB MiB", "", "MiB", "1e3", "0x10"])
def test_a_size_that_is_not_one_names_the_option_and_the_form(bad: str) -> None:
    with pytest.raises(errors.ConfigurationError, match="part_size must be") as info:
        split_options({"part_size": bad})
    assert "8MiB" in str(info.value) or "integer" in str(info.value)


@pytest.mark.parametrize("bad", ["maybe", 2, None, "sequential"])
def test_sequential_is_a_flag(tmp_path: Any, bad: Any) -> None:
    # any truthy value was taken: "false" asked for one GET of every byte
    (tmp_path / "o.bin").write_bytes(b"0123456789")
    for good in ("false", "no", 0, "true", True):
        with tensorstream.open(tmp_path / "o.bin", sequential=good) as f:
            assert f.read() == b"0123456789"
    with pytest.raises(errors.ConfigurationError, match="sequential must be true or false"):
        tensorstream.open(tmp_path / "o.bin", sequential=bad)
