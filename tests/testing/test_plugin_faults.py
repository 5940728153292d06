"""Fault semantics the same on every backend: when a fault starts counting, what
it replaces with, and that nothing of one test's faults reaches the next."""

from __future__ import annotations

import asyncio
import contextlib

import tensorstream
from tensorstream.errors import InvalidRangeError, ObjectChangedError

OLD, NEW = b"old!" * 1000, b"new!" * 1000


def read_once(backend, key: str, size: int) -> bytes:
    """One read of ``size`` bytes: one GET (one GETRANGE on Redis), no read-ahead."""
    return asyncio.run(tensorstream.read_range(backend.uri(key), 0, size, **backend.options))


def read_replacing(backend, key: str, size: int) -> None:
    """The read before which the object is replaced. What it gets depends on the
    backend (Redis has read the old manifest already: ObjectChangedError; a shorter
    new object: InvalidRangeError); the replacement is what the tests look at."""
    with contextlib.suppress(ObjectChangedError, InvalidRangeError):
        read_once(backend, key, size)


def test_replace_between_reads_counts_reads_from_when_it_is_set(tensorstream_backend):
    # On HTTP, reads made before the fault was set counted: a test that read the
    # object once (to check it) had it replaced before its next read, not the one after.
    b = tensorstream_backend
    b.put("k", OLD)
    assert read_once(b, "k", len(OLD)) == OLD
    assert read_once(b, "k", len(OLD)) == OLD
    b.faults.replace_between_reads("k", NEW)
    assert read_once(b, "k", len(OLD)) == OLD  # the first read after the fault: the old object
    assert b.get("k") == OLD
    read_replacing(b, "k", len(OLD))
    assert b.get("k") == NEW
    assert read_once(b, "k", len(NEW)) == NEW


def test_replace_between_reads_twice_in_one_test_replaces_twice(tensorstream_backend):
    # On HTTP the second fault never replaced anything (the first had been spent).
    b = tensorstream_backend
    b.put("k", OLD)
    b.faults.replace_between_reads("k", NEW)
    assert read_once(b, "k", len(OLD)) == OLD
    read_replacing(b, "k", len(OLD))
    assert b.get("k") == NEW
    b.faults.replace_between_reads("k", b"third")
    assert read_once(b, "k", len(NEW)) == NEW
    read_replacing(b, "k", len(NEW))
    assert b.get("k") == b"third"


def test_replace_between_reads_with_empty_bytes_empties_the_object(tensorstream_backend):
    # On HTTP, b"" (falsy) fell back to the default replacement, the old bytes inverted.
    b = tensorstream_backend
    b.put("k", OLD)
    b.faults.replace_between_reads("k", b"")
    assert read_once(b, "k", len(OLD)) == OLD
    read_replacing(b, "k", len(OLD))
    assert b.get("k") == b""
    with tensorstream.open(b.uri("k"), **b.options) as f:
        assert f.read() == b""
