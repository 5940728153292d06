"""Conformance tests of the layers' contract on every provider: an object
replaced between reads or mid-body is never mixed (:class:`ObjectChangedError`),
a broken body reports the bytes it delivered and is resumed exactly, and
``timeout_total``/``timeout_idle`` cut off a server that trickles or stalls.
The fault tests need the target's ``faults``. Part of
:class:`~tensorstream.testing.conformance.ProviderConformance`."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import tensorstream
from tensorstream import errors
from tensorstream.providers.base import Capabilities, Pin

from .conformance_base import (
    _PAYLOAD,
    _PAYLOAD_V2,
    _SLACK,
    ConformanceBase,
    ConformanceTarget,
    _key,
    _path,
    _same,
)

__all__ = ["ConformanceLayers"]


class ConformanceLayers(ConformanceBase):
    """Pinning, the resume contract and deadlines."""

    # -- pinning ------------------------------------------------------------------
    @pytest.mark.asyncio
    async def test_object_replaced_between_reads_is_never_mixed(
        self, target: ConformanceTarget, caps: Capabilities
    ) -> None:
        """A read pinned to the version seen by ``stat`` raises
        :class:`ObjectChangedError` once the object is replaced (by another of
        the same size), on every read path the provider declares."""
        key = _key("replaced")
        target.put(key, _PAYLOAD)
        uri = target.uri(key)
        path = _path(uri)
        half = len(_PAYLOAD) // 2
        async with tensorstream.get_provider(uri, **self._opts(target)) as p:
            info = await p.stat(path)
            self._need_versions(info)
            pin = Pin.of(info)
            first = bytearray(half)
            await p.readinto(path, 0, memoryview(first), pin=pin)
            _same(first, _PAYLOAD[:half])
            target.put(key, _PAYLOAD_V2)
            rest = memoryview(bytearray(len(_PAYLOAD) - half))
            with pytest.raises(errors.ObjectChangedError):
                await p.readinto(path, half, rest, pin=pin)
            if caps.blocking_reads:
                with pytest.raises(errors.ObjectChangedError):
                    await asyncio.to_thread(p.readinto_blocking, path, half, rest, pin=pin)
            if p.capabilities.range_streams:
                def stream() -> None:
                    body = p.open_range_blocking(path, half, len(_PAYLOAD), pin=pin)
                    try:
                        body.readinto(rest)
                    finally:
                        body.close()

                with pytest.raises(errors.ObjectChangedError):
                    await asyncio.to_thread(stream)

    def test_open_file_is_pinned_to_one_version(self, target: ConformanceTarget) -> None:
        """The file object: bytes of one version, or ObjectChangedError."""
        key = _key("pinned-file")
        target.put(key, _PAYLOAD)
        uri = target.uri(key)
        with tensorstream.open(uri, **{**self._opts(target), "readahead": 0}) as f:
            self._need_versions(f.info)
            head = f.read(1000)
            target.put(key, _PAYLOAD_V2)
            f.seek(len(_PAYLOAD) // 2)
            try:
                tail = f.read()
            except errors.ObjectChangedError:
                return
        _same(head, _PAYLOAD[:1000])
        _same(tail, _PAYLOAD[len(_PAYLOAD) // 2 :], "a read returned bytes of two versions: they")

    @pytest.mark.asyncio
    async def test_object_replaced_mid_body_is_never_mixed(
        self, target: ConformanceTarget, faults: Any
    ) -> None:
        """A body cut part-way, the object replaced before the rest is read: the
        resumed read must not stitch the new version onto the old one."""
        self._need(faults, "drop_after", "replace_between_reads")
        key = _key("mid-body")
        target.put(key, _PAYLOAD)
        uri = target.uri(key)
        path = _path(uri)
        async with tensorstream.get_provider(uri, **self._opts(target),
                                             backoff_initial=0.01) as p:
            info = await p.stat(path)
            self._need_versions(info)
            faults.drop_after(300_000, times=1)
            faults.replace_between_reads(key, _PAYLOAD_V2)
            buf = bytearray(len(_PAYLOAD))
            try:
                await p.readinto(path, 0, memoryview(buf), pin=Pin.of(info))
            except errors.ObjectChangedError:
                return
            if buf not in (_PAYLOAD, _PAYLOAD_V2):
                pytest.fail("a read returned bytes of two versions", pytrace=False)
            pytest.fail("the object was replaced under the read, which returned without error")

    # -- the resume contract -------------------------------------------------------
    @pytest.mark.asyncio
    async def test_broken_body_reports_received_and_is_resumed(
        self, target: ConformanceTarget, stored: tuple[str, bytes], faults: Any
    ) -> None:
        """``IncompleteReadError.received`` counts valid bytes at the start of
        the buffer, and the layer resumes from there: exact bytes, fewer bytes
        fetched again than the whole read."""
        self._need(faults, "drop_after")
        uri, data = stored
        path = _path(uri)
        p = tensorstream.get_provider(uri, **self._opts(target), backoff_initial=0.01)
        async with p:
            info = await p.stat(path)
            faults.drop_after(1_000_000, times=1)
            buf = bytearray(len(data))
            try:  # the provider itself, below the layer that resumes
                await p.inner.readinto(path, 0, memoryview(buf), **(
                    {"pin": Pin.of(info)} if p.inner.capabilities.pinned_reads else {}))
            except errors.IncompleteReadError as exc:
                assert 0 <= exc.received < len(data)
                _same(buf[: exc.received], data[: exc.received],
                      "IncompleteReadError.received counts bytes that are not valid: they")
            except errors.TensorstreamError as exc:
                assert exc.temporary, f"a cut body raised a permanent {type(exc).__name__}"
            faults.drop_after(1_000_000, times=1)
            buf = bytearray(len(data))
            assert await p.readinto(path, 0, memoryview(buf), pin=Pin.of(info)) == len(data)
            _same(buf, data)

    # -- deadlines -----------------------------------------------------------------
    @pytest.mark.parametrize("path_kind", ["async", "blocking", "streamed"])
    def test_a_trickle_is_cut_at_the_total_deadline(
        self, target: ConformanceTarget, faults: Any, caps: Capabilities, path_kind: str
    ) -> None:
        self._need(faults, "rate_limit")
        if path_kind == "blocking" and not caps.blocking_reads:
            pytest.skip("no blocking reads declared")
        if path_kind == "streamed" and not caps.range_streams:
            pytest.skip("no range streams declared")
        key = _key("trickle")
        target.put(key, _PAYLOAD[:64 << 10])
        uri = target.uri(key)
        opts = {**target.options, "timeout_total": 1.0, "timeout_idle": 10, "retries": 3}
        faults.rate_limit(20)  # a byte every 50 ms: never idle, never done
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            self._read_whole(uri, path_kind, opts)
        elapsed = time.monotonic() - started
        assert elapsed < 1.0 + _SLACK, f"timeout_total=1 gave up after {elapsed:.1f} s"

    @pytest.mark.parametrize("path_kind", ["async", "blocking"])
    def test_a_stall_is_cut_at_the_idle_timeout(
        self, target: ConformanceTarget, faults: Any, caps: Capabilities, path_kind: str
    ) -> None:
        self._need(faults, "latency")
        if path_kind == "blocking" and not caps.blocking_reads:
            pytest.skip("no blocking reads declared")
        key = _key("stall")
        target.put(key, _PAYLOAD[:4096])
        uri = target.uri(key)
        opts = {**target.options, "timeout_idle": 0.5, "retries": 1}
        info = asyncio.run(tensorstream.stat(uri, **opts))  # before the stall
        faults.latency(30)
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            self._read_whole(uri, path_kind, opts, info=info)
        elapsed = time.monotonic() - started
        assert elapsed < 0.5 + _SLACK, f"timeout_idle=0.5 gave up after {elapsed:.1f} s"

    @staticmethod
    def _read_whole(uri: str, path_kind: str, options: dict[str, Any],
                    info: tensorstream.ObjectInfo | None = None) -> bytes:
        path = _path(uri)

        async def run() -> bytes:
            async with tensorstream.get_provider(uri, **options) as p:
                size = info.size if info is not None else (await p.stat(path)).size
                buf = bytearray(size)
                if path_kind == "async":
                    await p.readinto(path, 0, memoryview(buf))
                elif path_kind == "blocking":
                    await asyncio.to_thread(p.readinto_blocking, path, 0, memoryview(buf))
                else:
                    def stream() -> None:
                        body = p.open_range_blocking(path, 0, size)
                        try:
                            body.readinto(memoryview(buf))
                        finally:
                            body.close()

                    await asyncio.to_thread(stream)
                return bytes(buf)

        return asyncio.run(run())
