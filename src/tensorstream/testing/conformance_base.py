"""What every group of conformance tests shares: :class:`ConformanceTarget`
(how the suite reaches a backend), the payloads, byte comparisons that fail
with the first differing offset, and :class:`ConformanceBase`, the fixtures and
helpers of :class:`~tensorstream.testing.conformance.ProviderConformance`."""

from __future__ import annotations

import dataclasses
import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import tensorstream
from tensorstream.providers.base import Capabilities, Pin

__all__ = ["ConformanceBase", "ConformanceTarget"]


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


class ConformanceBase:
    """The fixtures and helpers of the suite. Subclasses provide a ``target`` fixture."""

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
