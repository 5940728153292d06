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
            )

Tests are enabled by the provider's declared capabilities (writes, list,
delete, blocking reads, range streams), never by what the target says: a
capability that is declared is exercised, one that is not must fail in the
layer with :class:`~tensorstream.errors.UnsupportedOperationError`.

Beyond ranges and writes, the suite holds every provider to the contract of
the layers: a read of an object replaced between reads raises
:class:`~tensorstream.errors.ObjectChangedError` (async, blocking and streamed
paths), a broken body reports the bytes it delivered
(``IncompleteReadError.received``) and is resumed exactly, ``timeout_total``
and ``timeout_idle`` cut off a server that trickles or stalls, and options are
validated. Tests that need fault injection run when the target has ``faults``
(a :class:`tensorstream.testing.backends.Faults`, e.g.
``ConformanceTarget.from_backend(tensorstream_s3)`` with the pytest plugin's
backends); they are skipped otherwise.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import tensorstream
from tensorstream import errors
from tensorstream.providers.base import Capabilities, Pin

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
    #: Deprecated and ignored: writes, list and delete are gated by the
    #: provider's declared capabilities.
    writable: bool = True
    listable: bool = True
    #: Fault controls of the backend (:class:`tensorstream.testing.backends.Faults`:
    #: ``drop_after``, ``latency``, ``rate_limit``, ``replace_between_reads``,
    #: ``reset``, ``supports``), for the fault tests; ``None`` skips them.
    faults: Any = None

    @classmethod
    def from_backend(cls, backend: Any, **options: Any) -> ConformanceTarget:
        """A target for one of the pytest plugin's mocked backends
        (``tensorstream_s3``, ``tensorstream_http``, ``tensorstream_redis``),
        faults included."""
        return cls(uri=backend.uri, put=backend.put, options={**backend.options, **options},
                   faults=backend.faults)


def _key(prefix: str = "obj") -> str:
    return f"conformance/{prefix}-{uuid.uuid4().hex[:12]}"


_PAYLOAD = os.urandom((3 << 20) + 12345)  # > a few parts, not part-aligned
#: A second version of an object, of the same size (the size alone cannot tell).
_PAYLOAD_V2 = bytes(b ^ 0x5A for b in _PAYLOAD)
MiB = 1 << 20
#: Slack over a deadline for the time an operation may take to give up.
_SLACK = 2.0


def _path(uri: str) -> str:
    return tensorstream.parse_uri(uri).path


def _same(got: bytes | bytearray | memoryview, want: bytes, what: str = "the bytes read") -> None:
    """Fail with a short message when ``got`` differs from ``want``: the
    offset of the first difference, not a diff of megabytes."""
    got = bytes(got)
    if got == want:
        return
    at = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b),
              min(len(got), len(want)))
    pytest.fail(f"{what} differ from the object's: {len(got)} bytes against {len(want)}, "
                f"first difference at byte {at}", pytrace=False)


def _capabilities(uri: str) -> Capabilities:
    from tensorstream.providers.registry import resolve_provider_class

    return resolve_provider_class(tensorstream.parse_uri(uri).scheme).capabilities


class ProviderConformance:
    """Every provider passes these. Subclasses provide a ``target`` fixture."""

    # Small parts so multi-part code paths run on small objects.
    transfer_options: dict[str, Any] = {
        "part_size": 256 << 10,
        "concurrency": 8,
        "readahead": 128 << 10,
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

    @pytest.fixture
    def caps(self, target: ConformanceTarget) -> Capabilities:
        """What the provider under test declares."""
        return _capabilities(target.uri(_key("caps")))

    @pytest.fixture
    def faults(self, target: ConformanceTarget) -> Iterator[Any]:
        """The target's fault controls (the test is skipped without them); reset after."""
        if target.faults is None:
            pytest.skip("the target has no fault injection (ConformanceTarget.faults)")
        target.faults.reset()
        yield target.faults
        target.faults.reset()

    @staticmethod
    def _need(faults: Any, *names: str) -> None:
        for name in names:
            if not faults.supports(name):
                pytest.skip(f"the backend cannot inject {name}")

    @staticmethod
    def _need_versions(info: tensorstream.ObjectInfo) -> None:
        if not Pin.of(info).validated:
            pytest.skip("the backend reports neither an ETag nor a Last-Modified for this "
                        "object: a replacement of the same size cannot be detected")

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
