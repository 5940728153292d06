"""Conformance tests of the operations a provider declares: atomic writes,
listing and deletion, honest capabilities (a declared operation works, any other
fails in the layer with :class:`~tensorstream.errors.UnsupportedOperationError`)
and validated options. Part of
:class:`~tensorstream.testing.conformance.ProviderConformance`."""

from __future__ import annotations

import asyncio
import os

import pytest

import tensorstream
from tensorstream import errors
from tensorstream.providers.base import Capabilities

from .conformance_base import _PAYLOAD, ConformanceBase, ConformanceTarget, _key, _path, _same

__all__ = ["ConformanceOperations"]


class ConformanceOperations(ConformanceBase):
    """Writes, list and delete as declared; capabilities and options honest."""

    # -- writes -------------------------------------------------------------
    def test_write_then_read_back(self, target: ConformanceTarget, caps: Capabilities) -> None:
        if not caps.write:
            pytest.skip("provider is read-only")
        uri = target.uri(_key("written"))
        with tensorstream.open(uri, "wb", **target.options) as w:
            for i in range(0, len(_PAYLOAD), 1 << 20):
                w.write(_PAYLOAD[i : i + (1 << 20)])
        with tensorstream.open(uri, **target.options) as f:
            _same(f.read(), _PAYLOAD, "the bytes written and read back")

    def test_write_is_atomic_on_error(self, target: ConformanceTarget,
                                      caps: Capabilities) -> None:
        if not caps.write:
            pytest.skip("provider is read-only")
        uri = target.uri(_key("aborted"))
        with pytest.raises(RuntimeError, match="boom"):
            with tensorstream.open(uri, "wb", **target.options) as w:
                w.write(_PAYLOAD[: 2 << 20])
                raise RuntimeError("boom")
        with pytest.raises(FileNotFoundError):
            tensorstream.open(uri, **target.options)

    def test_overwrite_replaces_whole_object(self, target: ConformanceTarget,
                                             caps: Capabilities) -> None:
        if not caps.write:
            pytest.skip("provider is read-only")
        uri = target.uri(_key("overwritten"))
        for payload in (b"first version" * 1000, b"second" * 10):
            with tensorstream.open(uri, "wb", **target.options) as w:
                w.write(payload)
            with tensorstream.open(uri, **target.options) as f:
                assert f.read() == payload

    def test_empty_object(self, target: ConformanceTarget, caps: Capabilities) -> None:
        if not caps.write:
            pytest.skip("provider is read-only")
        uri = target.uri(_key("empty"))
        with tensorstream.open(uri, "wb", **target.options):
            pass
        with tensorstream.open(uri, **target.options) as f:
            assert f.size == 0
            assert f.read() == b""

    # -- list / delete --------------------------------------------------------
    @pytest.mark.asyncio
    async def test_list_and_delete(self, target: ConformanceTarget, caps: Capabilities) -> None:
        if not (caps.list and caps.delete):
            pytest.skip("provider cannot list and delete")
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

    # -- capabilities ------------------------------------------------------------
    @pytest.mark.asyncio
    async def test_capabilities_are_honest(
        self, target: ConformanceTarget, stored: tuple[str, bytes], caps: Capabilities
    ) -> None:
        """Every declared operation works; every other one fails in the layer,
        with :class:`UnsupportedOperationError`."""
        uri, data = stored
        path = _path(uri)
        async with tensorstream.get_provider(uri, **self._opts(target)) as p:
            if caps.blocking_reads:
                buf = bytearray(1000)
                assert await asyncio.to_thread(p.readinto_blocking, path, 7, memoryview(buf)) \
                    == len(buf)
                _same(buf, data[7:1007])
            else:
                with pytest.raises(errors.UnsupportedOperationError):
                    p.readinto_blocking(path, 0, memoryview(bytearray(1)))
            if caps.range_streams:
                body = await asyncio.to_thread(p.open_range_blocking, path, 5, 5 + 3000)
                try:
                    buf = bytearray(3000)
                    assert await asyncio.to_thread(body.readinto, memoryview(buf)[:1000]) == 1000
                    assert body.position == 1005
                    assert await asyncio.to_thread(body.readinto, memoryview(buf)[1000:]) == 2000
                    _same(buf, data[5:3005])
                finally:
                    body.close()
            elif not p.capabilities.range_streams:
                with pytest.raises(errors.UnsupportedOperationError):
                    p.open_range_blocking(path, 0, 1)
            if not caps.write:
                with pytest.raises(errors.UnsupportedOperationError):
                    p.open_writer(_path(target.uri(_key("refused"))))
            if not caps.list:
                with pytest.raises(errors.UnsupportedOperationError):
                    p.list(path)
            if not caps.delete:
                with pytest.raises(errors.UnsupportedOperationError):
                    await p.delete(path)

    # -- options ------------------------------------------------------------------
    @pytest.mark.asyncio
    async def test_options_are_validated(
        self, target: ConformanceTarget, stored: tuple[str, bytes]
    ) -> None:
        uri, _ = stored
        with pytest.raises(errors.ConfigurationError, match="no_such_option"):
            await tensorstream.stat(uri, no_such_option=1, **target.options)
        for bad in ({"retries": 0}, {"part_size": 0}, {"stream_reads": "sometimes"},
                    {"timeout_idle": 0}, {"timeout_idle": -1}, {"timeout_connect": "abc"},
                    {"concurrency": 2.5}, {"readahead": -1}):
            # checked where parsed, for every provider alike, naming the option
            with pytest.raises(errors.ConfigurationError, match=next(iter(bad))):
                await tensorstream.stat(uri, **{**target.options, **bad})
