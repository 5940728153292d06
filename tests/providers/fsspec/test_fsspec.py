"""The generic fsspec fallback (``memory://``): the conformance suite, and the
pinning layer standing in for a backend that cannot pin its reads."""

from __future__ import annotations

import uuid

import fsspec
import pytest

import tensorstream
from tensorstream import errors
from tensorstream.providers.base import Pin
from tensorstream.providers.fsspec.provider import FsspecProvider
from tensorstream.testing.conformance import ConformanceTarget, ProviderConformance


class TestFsspecMemoryConformance(ProviderConformance):
    @pytest.fixture
    def target(self) -> ConformanceTarget:
        fs = fsspec.filesystem("memory")
        root = f"/ts-conformance-{uuid.uuid4().hex[:8]}"

        def put(key: str, data: bytes) -> None:
            fs.pipe_file(f"{root}/{key}", data)

        return ConformanceTarget(uri=lambda key: f"memory://{root}/{key}", put=put)


def test_fsspec_declares_no_pinning_and_the_layer_pins_by_stat() -> None:
    assert not FsspecProvider.capabilities.pinned_reads
    fs = fsspec.filesystem("memory")
    path = f"/ts-pin-{uuid.uuid4().hex[:8]}/obj"
    fs.pipe_file(path, b"a" * 1000)
    uri = f"memory://{path}"
    with tensorstream.open(uri, readahead=0, part_size=100) as f:
        assert not f.capabilities.range_streams  # streams cannot be checked read by read
        assert f.read(100) == b"a" * 100
        fs.pipe_file(path, b"b" * 1000)  # same size, another version
        with pytest.raises(errors.ObjectChangedError):
            f.read(100)


async def test_unversioned_reads_are_checked_by_size() -> None:
    fs = fsspec.filesystem("memory")
    path = f"/ts-size-{uuid.uuid4().hex[:8]}/obj"
    fs.pipe_file(path, b"a" * 1000)
    async with tensorstream.get_provider(f"memory://{path}") as p:
        with pytest.raises(errors.ObjectChangedError, match="size 1000, was 999"):
            await p.readinto(path, 0, memoryview(bytearray(10)), pin=Pin(size=999))
