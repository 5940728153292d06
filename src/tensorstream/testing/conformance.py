"""The provider conformance suite, shipped in the package so third-party
providers can run the same tests as the built-in ones.

Use it by subclassing :class:`ProviderConformance` and supplying one fixture::

    from tensorstream.testing.conformance import ConformanceTarget, ProviderConformance

    class TestMyProvider(ProviderConformance):
        @pytest.fixture
        def target(self, my_server) -> ConformanceTarget:
            return ConformanceTarget(
                uri=lambda key: f"my://{my_server.address}/{key}",
                put=my_server.put,          # stores bytes without tensorstream
                options={"token": "..."},
                writable=True,
            )

Tests are enabled by the provider's capabilities (writes, list, delete).
"""

from __future__ import annotations

import dataclasses
import io
import os
import uuid
from collections.abc import Callable
from typing import Any

import pytest

import tensorstream
from tensorstream import errors

try:  # Hypothesis is a test dependency, not a runtime one.
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
except ImportError:  # pragma: no cover
    given = None  # type: ignore[assignment]

__all__ = ["ConformanceTarget", "ProviderConformance"]


@dataclasses.dataclass
class ConformanceTarget:
    """How the suite reaches one backend."""

    #: Build a URI for an object key.
    uri: Callable[[str], str]
    #: Store ``data`` under ``key`` *without* going through tensorstream.
    put: Callable[[str, bytes], None]
    #: Storage options passed to every tensorstream call.
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: Whether ``open(uri, "wb")`` is supported.
    writable: bool = True
    #: Whether ``provider.list`` / ``delete`` are supported.
    listable: bool = True


def _key(prefix: str = "obj") -> str:
    return f"conformance/{prefix}-{uuid.uuid4().hex[:12]}"


_PAYLOAD = os.urandom((3 << 20) + 12345)  # > a few parts, not part-aligned


class ProviderConformance:
    """Every provider passes these. Subclasses provide a ``target`` fixture."""

    # Small parts so multi-part code paths run on small objects.
    transfer_options: dict[str, Any] = {
        "part_size": 256 << 10,
        "min_part_size": 64 << 10,
        "concurrency": 8,
        "readahead": 128 << 10,
        "large_read": 64 << 10,
    }

    @pytest.fixture
    def target(self) -> ConformanceTarget:  # pragma: no cover - overridden
        raise NotImplementedError("conformance subclasses must define a `target` fixture")

    @pytest.fixture
    def stored(self, target: ConformanceTarget) -> tuple[str, bytes]:
        key = _key()
        target.put(key, _PAYLOAD)
        return target.uri(key), _PAYLOAD

    def _opts(self, target: ConformanceTarget) -> dict[str, Any]:
        return {**self.transfer_options, **target.options}

    # -- stat ---------------------------------------------------------------
    async def test_stat_reports_size(self, target: ConformanceTarget, stored: tuple[str, bytes]) -> None:
        uri, data = stored
        info = await tensorstream.stat(uri, **target.options)
        assert info.size == len(data)

    async def test_missing_object_raises_file_not_found(self, target: ConformanceTarget) -> None:
        uri = target.uri(_key("missing"))
        with pytest.raises(FileNotFoundError):
            await tensorstream.stat(uri, **target.options)
        with pytest.raises(FileNotFoundError):
            await tensorstream.read_range(uri, 0, 1, **target.options)
        with pytest.raises(FileNotFoundError):
            tensorstream.open(uri, **target.options)

    # -- ranges -------------------------------------------------------------
    @pytest.mark.parametrize(
        "where", ["start", "middle", "end", "whole", "one_byte_at_end"]
    )
    async def test_read_range(
        self, target: ConformanceTarget, stored: tuple[str, bytes], where: str
    ) -> None:
        uri, data = stored
        n = len(data)
        start, end = {
            "start": (0, 1000),
            "middle": (n // 3, n // 3 + 777_777),
            "end": (n - 4096, n),
            "whole": (0, n),
            "one_byte_at_end": (n - 1, n),
        }[where]
        got = await tensorstream.read_range(uri, start, end, **self._opts(target))
        assert got == data[start:end]

    async def test_empty_range(self, target: ConformanceTarget, stored: tuple[str, bytes]) -> None:
        uri, _ = stored
        assert await tensorstream.read_range(uri, 10, 10, **target.options) == b""

    async def test_range_past_end_raises(
        self, target: ConformanceTarget, stored: tuple[str, bytes]
    ) -> None:
        uri, data = stored
        with pytest.raises(errors.InvalidRangeError):
            await tensorstream.read_range(uri, len(data) - 10, len(data) + 10, **target.options)
        with pytest.raises(ValueError):
            await tensorstream.read_range(uri, 5, 2, **target.options)

    async def test_readinto_fills_exactly(
        self, target: ConformanceTarget, stored: tuple[str, bytes]
    ) -> None:
        uri, data = stored
        async with tensorstream.get_provider(uri, **self._opts(target)) as provider:
            path = tensorstream.parse_uri(uri).path
            buf = bytearray(b"\xaa" * (len(data) - 100))
            n = await provider.readinto(path, 50, memoryview(buf))
            assert n == len(buf)
            assert buf == data[50 : len(data) - 50]

    # -- the sync file object -------------------------------------------------
    def test_sync_file_reads_like_bytesio(
        self, target: ConformanceTarget, stored: tuple[str, bytes]
    ) -> None:
        uri, data = stored
        ref = io.BytesIO(data)
        with tensorstream.open(uri, **self._opts(target)) as f:
            assert f.readable() and f.seekable() and not f.writable()
            assert f.read(10) == ref.read(10)
            assert f.seek(-100, io.SEEK_END) == ref.seek(-100, io.SEEK_END)
            assert f.read() == ref.read()
            assert f.read(5) == b""
            f.seek(1234)
            big = bytearray(len(data) - 2000)
            assert f.readinto(big) == len(big)
            assert big == data[1234 : 1234 + len(big)]
            assert f.tell() == 1234 + len(big)

    def test_random_access_matches_bytesio(
        self, target: ConformanceTarget, stored: tuple[str, bytes]
    ) -> None:
        if given is None:  # pragma: no cover
            pytest.skip("hypothesis is not installed")
        uri, data = stored
        opts = self._opts(target)
        ops = st.lists(
            st.one_of(
                st.tuples(st.just("seek"), st.integers(0, len(data) + 10)),
                st.tuples(st.just("read"), st.integers(0, 600_000)),
                st.tuples(st.just("readinto"), st.integers(0, 600_000)),
            ),
            max_size=8,
        )

        @settings(max_examples=15, deadline=None,
                  suppress_health_check=list(HealthCheck))
        @given(ops)
        def check(sequence: list[tuple[str, int]]) -> None:
            ref = io.BytesIO(data)
            with tensorstream.open(uri, **opts) as f:
                for op, arg in sequence:
                    if op == "seek":
                        assert f.seek(arg) == ref.seek(arg)
                    elif op == "read":
                        assert f.read(arg) == ref.read(arg)
                    else:
                        a, b = bytearray(arg), bytearray(arg)
                        assert f.readinto(a) == ref.readinto(b)
                        assert a == b
                    assert f.tell() == ref.tell()

        check()

    # -- writes -------------------------------------------------------------
    def test_write_then_read_back(self, target: ConformanceTarget) -> None:
        if not target.writable:
            pytest.skip("provider is read-only")
        uri = target.uri(_key("written"))
        with tensorstream.open(uri, "wb", **target.options) as w:
            for i in range(0, len(_PAYLOAD), 1 << 20):
                w.write(_PAYLOAD[i : i + (1 << 20)])
        with tensorstream.open(uri, **target.options) as f:
            assert f.read() == _PAYLOAD

    def test_write_is_atomic_on_error(self, target: ConformanceTarget) -> None:
        if not target.writable:
            pytest.skip("provider is read-only")
        uri = target.uri(_key("aborted"))
        with pytest.raises(RuntimeError, match="boom"):
            with tensorstream.open(uri, "wb", **target.options) as w:
                w.write(_PAYLOAD[: 2 << 20])
                raise RuntimeError("boom")
        with pytest.raises(FileNotFoundError):
            tensorstream.open(uri, **target.options)

    def test_overwrite_replaces_whole_object(self, target: ConformanceTarget) -> None:
        if not target.writable:
            pytest.skip("provider is read-only")
        uri = target.uri(_key("overwritten"))
        for payload in (b"first version" * 1000, b"second" * 10):
            with tensorstream.open(uri, "wb", **target.options) as w:
                w.write(payload)
            with tensorstream.open(uri, **target.options) as f:
                assert f.read() == payload

    def test_empty_object(self, target: ConformanceTarget) -> None:
        if not target.writable:
            pytest.skip("provider is read-only")
        uri = target.uri(_key("empty"))
        with tensorstream.open(uri, "wb", **target.options):
            pass
        with tensorstream.open(uri, **target.options) as f:
            assert f.size == 0
            assert f.read() == b""

    # -- list / delete --------------------------------------------------------
    async def test_list_and_delete(self, target: ConformanceTarget) -> None:
        if not target.listable:
            pytest.skip("provider cannot list")
        base = _key("tree")
        for name in ("a", "b/c"):
            target.put(f"{base}/{name}", b"x")
        root = tensorstream.parse_uri(target.uri(base))
        async with tensorstream.get_provider(root, **target.options) as provider:
            found = [i async for i in provider.list(root.path + "/")]
            assert [i.path for i in found] == sorted(i.path for i in found)
            assert sorted(os.path.basename(i.path) for i in found) == ["a", "c"]
            assert all(i.size == 1 for i in found)
            victim = tensorstream.parse_uri(target.uri(f"{base}/a")).path
            await provider.delete(victim)
            with pytest.raises(FileNotFoundError):
                await provider.stat(victim)
