"""Conformance tests of reading: ``stat``, ranges, ``readinto``, the sync file
object (against :class:`io.BytesIO`, by property), the sequential open (one GET
for a whole load) and a reader shared by threads. Part of
:class:`~tensorstream.testing.conformance.ProviderConformance`."""

from __future__ import annotations

import io
import threading
from typing import Any

import pytest

import tensorstream
from tensorstream import errors

from .conformance_base import (
    _PAYLOAD,
    _PAYLOAD_V2,
    ConformanceBase,
    ConformanceTarget,
    _key,
    _same,
)

try:  # Hypothesis is a test dependency, not a runtime one.
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
except ImportError:  # pragma: no cover
    given = None  # type: ignore[assignment]

__all__ = ["ConformanceReads"]


class ConformanceReads(ConformanceBase):
    """Every read path returns exactly the object's bytes, of one version."""

    # -- stat ---------------------------------------------------------------
    @pytest.mark.asyncio  # runs under pytest-asyncio's default strict mode too
    async def test_stat_reports_size(self, target: ConformanceTarget, stored: tuple[str, bytes]) -> None:
        uri, data = stored
        info = await tensorstream.stat(uri, **target.options)
        assert info.size == len(data)

    @pytest.mark.asyncio
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
    @pytest.mark.asyncio
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
        _same(got, data[start:end])

    @pytest.mark.asyncio
    async def test_empty_range(self, target: ConformanceTarget, stored: tuple[str, bytes]) -> None:
        uri, _ = stored
        assert await tensorstream.read_range(uri, 10, 10, **target.options) == b""

    @pytest.mark.asyncio
    async def test_range_past_end_raises(
        self, target: ConformanceTarget, stored: tuple[str, bytes]
    ) -> None:
        uri, data = stored
        with pytest.raises(errors.InvalidRangeError):
            await tensorstream.read_range(uri, len(data) - 10, len(data) + 10, **target.options)
        with pytest.raises(ValueError):
            await tensorstream.read_range(uri, 5, 2, **target.options)

    @pytest.mark.asyncio
    async def test_readinto_fills_exactly(
        self, target: ConformanceTarget, stored: tuple[str, bytes]
    ) -> None:
        uri, data = stored
        async with tensorstream.get_provider(uri, **self._opts(target)) as provider:
            path = tensorstream.parse_uri(uri).path
            buf = bytearray(b"\xaa" * (len(data) - 100))
            n = await provider.readinto(path, 50, memoryview(buf))
            assert n == len(buf)
            _same(buf, data[50 : len(data) - 50])

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
            _same(big, data[1234 : 1234 + len(big)])
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

    # -- the sequential open (one GET for a whole load, where the provider has it) ---
    def test_sequential_open_reads_like_bytesio(
        self, target: ConformanceTarget, stored: tuple[str, bytes]
    ) -> None:
        """``open(uri, sequential=True)`` (what a whole load opens with) is a
        file like any other: backward seeks, reads past the end, a short buffer."""
        uri, data = stored
        ref = io.BytesIO(data)
        with tensorstream.open(uri, sequential=True, **self._opts(target)) as f:
            assert f.size == len(data)
            assert f.read(100_000) == ref.read(100_000)
            assert f.seek(10) == ref.seek(10)  # back into what the first body gave
            assert f.read(5000) == ref.read(5000)
            assert f.seek(len(data) + 7) == ref.seek(len(data) + 7)
            assert f.read(10) == ref.read(10) == b""
            assert f.seek(-3, io.SEEK_END) == ref.seek(-3, io.SEEK_END)
            a, b = bytearray(10), bytearray(10)
            assert f.readinto(a) == ref.readinto(b) == 3
            assert a == b
            f.seek(1)
            _same(f.read(), data[1:])
            assert f.tell() == len(data)
        with pytest.raises(ValueError):
            f.read(1)

    def test_sequential_open_is_pinned_to_one_version(self, target: ConformanceTarget) -> None:
        """The object replaced after the first GET of a sequential open: every
        later read is of the version that GET reported, or ObjectChangedError."""
        key = _key("pinned-sequential")
        target.put(key, _PAYLOAD)
        uri = target.uri(key)
        half = len(_PAYLOAD) // 2
        with tensorstream.open(uri, sequential=True, **self._opts(target)) as f:
            self._need_versions(f.info)
            head = f.read(1000)
            target.put(key, _PAYLOAD_V2)
            try:
                middle = f.read(half - 1000)  # from the first body, if it is still open
                f.seek(len(_PAYLOAD) - 5000)  # a jump: a new request
                tail = f.read()
            except errors.ObjectChangedError:
                return
        _same(head, _PAYLOAD[:1000])
        _same(middle, _PAYLOAD[1000:half], "a read returned bytes of two versions: they")
        _same(tail, _PAYLOAD[-5000:], "a read returned bytes of two versions: they")

    def test_sequential_open_resumes_a_cut_body_exactly(
        self, target: ConformanceTarget, stored: tuple[str, bytes], faults: Any
    ) -> None:
        """The first body of a sequential open cut part-way: the read resumes
        and returns exactly the object's bytes."""
        self._need(faults, "drop_after")
        uri, data = stored
        faults.drop_after(300_000, times=1)
        with tensorstream.open(uri, sequential=True, **self._opts(target),
                               backoff_initial=0.01) as f:
            _same(f.read(), data)

    def test_sequential_open_replaced_mid_body_is_never_mixed(
        self, target: ConformanceTarget, faults: Any
    ) -> None:
        """The first body cut part-way and the object replaced before the rest
        is read: the old version's bytes or ObjectChangedError, never a mix."""
        self._need(faults, "drop_after", "replace_between_reads")
        key = _key("mid-body-sequential")
        target.put(key, _PAYLOAD)
        uri = target.uri(key)
        faults.drop_after(300_000, times=1)
        faults.replace_between_reads(key, _PAYLOAD_V2)
        try:
            with tensorstream.open(uri, sequential=True, **self._opts(target),
                                   backoff_initial=0.01) as f:
                self._need_versions(f.info)
                got = f.read()
        except errors.ObjectChangedError:
            return
        if got not in (_PAYLOAD, _PAYLOAD_V2):
            pytest.fail("a read returned bytes of two versions", pytrace=False)

    @pytest.mark.parametrize("sequential", [False, True], ids=["open", "sequential-open"])
    def test_a_reader_shared_by_threads_reads_each_piece_once(
        self, target: ConformanceTarget, stored: tuple[str, bytes], sequential: bool
    ) -> None:
        """Threads sharing one file object: each ``read(n)`` returns the ``n``
        bytes at one position; together they read every byte once."""
        uri, data = stored
        piece = 64 << 10
        offsets = {data[i:i + piece]: i for i in range(0, len(data), piece)}
        got: list[int] = []
        problems: list[BaseException] = []
        with tensorstream.open(uri, sequential=sequential, **self._opts(target)) as f:
            def work() -> None:
                try:
                    while chunk := f.read(piece):
                        if chunk not in offsets:
                            raise AssertionError(f"a read of {len(chunk)} bytes matched "
                                                 "no position of the object")
                        got.append(offsets[chunk])
                except BaseException as exc:  # reported below
                    problems.append(exc)

            threads = [threading.Thread(target=work) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
        assert not problems, problems[0]
        assert sorted(got) == sorted(offsets.values()), "pieces read twice or never"
