"""Local safetensors loads: several threads fill the tensors chunk by chunk
(safetensors/_local.py). Byte-exact across chunk and thread boundaries, in file
order for iter_tensors, and a failed read hands out no tensor it touched."""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path
from typing import Any

import pytest
from tests.tensor_files import disk_fails_at, one_per_dtype, same_bytes

from tensorstream.readahead import localfill as _local

torch = pytest.importorskip("torch")
st_torch = pytest.importorskip("safetensors.torch")
ts_st = pytest.importorskip("tensorstream.safetensors")


def _tensors() -> dict[str, Any]:
    g = torch.Generator().manual_seed(3)
    out = one_per_dtype(g, (31, 17), "d.")
    out["scalar"] = torch.tensor(-2.5, dtype=torch.float64)  # 0-dim
    out["empty"] = torch.empty(0, 3, dtype=torch.float32)
    out["odd"] = torch.arange(4093, dtype=torch.int8)  # not a multiple of any chunk
    out["big"] = torch.randn(3001, 7, generator=g)  # many chunks
    out["tail.empty"] = torch.empty(0, dtype=torch.bfloat16)
    return out


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> int:
    """Chunks of an odd size: they cross tensors' pages and elements at odd offsets."""
    monkeypatch.setattr(_local, "CHUNK", 1000)
    return 1000


@pytest.fixture
def model(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    path = tmp_path / "m.safetensors"
    st_torch.save_file(_tensors(), str(path))
    return path, st_torch.load_file(str(path))


@pytest.mark.parametrize("readers", [1, 2, 3, 7])
def test_chunked_threads_are_byte_identical(model: tuple[Path, dict[str, Any]],
                                            small_chunks: int, readers: int,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    path, want = model
    got = ts_st.load(path, num_readers=readers)
    assert sorted(got) == sorted(want)
    for name in want:
        assert same_bytes(got[name], want[name]), name


def test_iter_tensors_keeps_file_order_with_threads(model: tuple[Path, dict[str, Any]],
                                                    small_chunks: int,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(4)))
    path, want = model
    with ts_st.open(path) as f:
        order = f.offset_keys()
    got = list(ts_st.iter_tensors(path))
    assert [n for n, _ in got] == order
    assert all(same_bytes(t, want[n]) for n, t in got)


def test_threads_are_bounded_by_cpus_chunks_and_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert _local.workers(0, 1 << 30) == 1  # one CPU: one thread, whatever is asked
    assert _local.workers(8, 1 << 30) == 1
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    assert _local.workers(0, 1 << 30) == _local.MAX_WORKERS
    assert _local.workers(16, 1 << 30) == 16
    assert _local.workers(16, _local.CHUNK * 3) == 3  # no idle thread
    assert _local.workers(0, 0) == 1


def test_local_reads_use_several_threads(model: tuple[Path, dict[str, Any]], small_chunks: int,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import threading


    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(2)))
    from tensorstream.providers.local import provider as local

    threads: set[int] = set()
    real = local._preadv_exact
    barrier = threading.Barrier(2, timeout=5)

    def spy(fd: int, p: str, offset: int, buffers: Any, etag: Any) -> int:
        me = threading.get_ident()
        if sum(b.nbytes for b in buffers) <= small_chunks and me not in threads:
            threads.add(me)
            barrier.wait()  # two threads read chunks at the same time (else: broken)
        return int(real(fd, p, offset, buffers, etag))

    monkeypatch.setattr(local, "_preadv_exact", spy)
    path, want = model
    got = ts_st.load(path, num_readers=2)
    assert len(threads) == 2
    assert all(same_bytes(got[n], want[n]) for n in want)


@pytest.mark.parametrize("how", ["load", "iter_tensors"])
@pytest.mark.parametrize("fail_at", [1, 5, 40])
def test_a_failed_read_hands_out_no_tensor_it_touched(
        model: tuple[Path, dict[str, Any]], small_chunks: int, how: str, fail_at: int,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tensorstream.providers.local import provider as local

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(2)))
    path, want = model
    disk_fails_at(monkeypatch, local, fail_at + 1)  # (the first call reads the header)
    got: list[tuple[str, Any]] = []
    with pytest.raises(OSError, match="Input/output error"):
        if how == "load":
            got.extend(ts_st.load(path, num_readers=2).items())
        else:
            for item in ts_st.iter_tensors(path):
                got.append(item)
    assert how == "iter_tensors" or not got
    for name, t in got:  # whatever was handed out is complete
        assert same_bytes(t, want[name]), name


def test_local_reads_fault_their_buffer_in_first(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import mmap

    from tensorstream.providers.local import provider as local

    seen: list[int] = []
    real = local.populate

    def spy(view: memoryview, *, piece: int = 0) -> None:
        seen.append(view.nbytes)
        assert piece >= view.nbytes  # one call, before the copy (not raced back to front)
        real(view, piece=piece)

    monkeypatch.setattr(local, "populate", spy)
    data = os.urandom(3 << 20)
    (tmp_path / "blob").write_bytes(data)
    buf = mmap.mmap(-1, len(data) - 5)  # fresh pages, an odd length
    p = local.LocalProvider()
    p.readinto_blocking(str(tmp_path / "blob"), 5, memoryview(buf))
    assert seen == [len(data) - 5]
    assert bytes(buf) == data[5:]


@pytest.mark.parametrize("readers", [1, 2])
def test_cpu_tensors_are_mapped_before_the_threads_read(model: tuple[Path, dict[str, Any]],
                                                       small_chunks: int, readers: int,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # Mapping memory waits for the other threads' MADV_POPULATE_WRITE calls: every CPU
    # tensor of a load is allocated first (readahead.arena), before any read.
    from tensorstream.safetensors import reader

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(2)))
    from tensorstream.providers.local import provider as local

    events: list[str] = []
    real_arena, real_read = reader.Arena, local._preadv_exact

    def mapping(sizes: Any, **kwargs: Any) -> Any:
        events.append("map")
        return real_arena(sizes, **kwargs)

    def read(fd: int, p: str, offset: int, buffers: Any, etag: Any) -> int:
        if offset > 8:  # a chunk (not the header)
            events.append("read")
        return int(real_read(fd, p, offset, buffers, etag))

    monkeypatch.setattr(reader, "Arena", mapping)
    monkeypatch.setattr(local, "_preadv_exact", read)
    path, want = model
    got = ts_st.load(path, num_readers=readers)
    assert all(same_bytes(got[n], want[n]) for n in want)
    assert events[0] == "map" and events.count("map") == 1 and "read" in events


def test_tensors_in_one_mapping_are_separate_and_can_be_saved_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Where huge pages are free and cheap, load's tensors share one mapping (readahead.arena)
    # but each has a storage of its own: save_file refuses tensors that share one.
    from tensorstream.readahead import arena

    if arena._madvise is None or not arena._thp_enabled():
        pytest.skip("no transparent huge pages")
    monkeypatch.setattr(arena, "huge_pages_free", lambda nbytes: True)
    monkeypatch.setattr(arena, "DEAR_NS_PER_MIB", 10**12)  # their cost depends on the host
    monkeypatch.setattr(arena, "SLOW_NS_PER_MIB", 10**12)
    want = {**_tensors(), "huge.page": torch.arange(3 << 18, dtype=torch.float32) % 251}
    path = tmp_path / "big.safetensors"
    st_torch.save_file(want, str(path))
    got = ts_st.load(path, num_readers=2)
    assert all(same_bytes(got[n], want[n]) for n in want)
    stored = sorted((t.data_ptr(), t.nbytes) for t in got.values() if t.numel())
    assert all(t.untyped_storage().nbytes() == t.nbytes for t in got.values() if t.numel())
    assert all(a + n <= b for (a, n), (b, _) in itertools.pairwise(stored))
    assert got["huge.page"].data_ptr() % (2 << 20) == 0
    assert stored[-1][0] + stored[-1][1] - stored[0][0] <= (
        sum(n for _, n in stored) + (2 << 20) + len(stored) * arena.ALIGN)  # one mapping
    st_torch.save_file(got, str(tmp_path / "again.safetensors"))
    again = st_torch.load_file(str(tmp_path / "again.safetensors"))
    assert all(same_bytes(again[n], want[n]) for n in want)


def test_iter_tensors_maps_tensors_as_it_goes(model: tuple[Path, dict[str, Any]],
                                              small_chunks: int,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # A consumer of iter_tensors may free each tensor: nothing is mapped far ahead.
    from tensorstream.safetensors.reader import SafetensorsFile

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(2)))
    from tensorstream.providers.local import provider as local

    events: list[str] = []
    real_alloc, real_read = SafetensorsFile.allocate, local._preadv_exact
    monkeypatch.setattr(SafetensorsFile, "allocate", lambda self, t, *, pin=False: (
        events.append("alloc"), real_alloc(self, t, pin=pin))[1])

    def read(fd: int, p: str, offset: int, buffers: Any, etag: Any) -> int:
        if offset > 8:  # a chunk (not the header)
            events.append("read")
        return int(real_read(fd, p, offset, buffers, etag))

    monkeypatch.setattr(local, "_preadv_exact", read)
    path, want = model
    got = dict(ts_st.iter_tensors(path))
    assert all(same_bytes(got[n], want[n]) for n in want)
    assert 0 < events.index("read") < len(want)



def test_iter_tensors_keeps_no_tensor_its_consumer_dropped(tmp_path: Path, small_chunks: int,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The chunk fill kept every tensor it had allocated until the file's end, so a
    consumer freeing each tensor still held the whole file (peak RSS 516 MiB over
    imports for a 512 MiB file of 32 MiB tensors)."""
    import gc
    import weakref

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(2)))
    path = tmp_path / "m.safetensors"
    st_torch.save_file({f"t{i:02}": torch.full((700,), float(i)) for i in range(40)}, str(path))
    seen: list[weakref.ref[Any]] = []
    for i, (name, tensor) in enumerate(ts_st.iter_tensors(path)):
        assert name == f"t{i:02}" and tensor[0].item() == i
        seen.append(weakref.ref(tensor))
        del tensor
        gc.collect()
        # the queue and the threads' chunks hold a few tensors ahead, none behind
        assert all(ref() is None for ref in seen[:-1]), i


def _many(tmp_path: Path, count: int = 600) -> tuple[Path, dict[str, Any]]:
    want = {f"t{i}": torch.full((100 + i % 7,), float(i)) for i in range(count)}
    path = tmp_path / "many.safetensors"
    st_torch.save_file(want, str(path))
    return path, want


@pytest.mark.parametrize("how", ["load", "iter_tensors"])
def test_small_tensors_are_gathered_into_few_reads(tmp_path: Path, how: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # One read through the reader's layers per tensor cost more than the copy for
    # thousands of small tensors: neighbours share one preadv (at most 256 buffers).
    from tensorstream.providers.local import provider as local

    path, want = _many(tmp_path)
    calls: list[int] = []
    real = local._preadv_exact

    def spy(fd: int, p: str, offset: int, buffers: Any, etag: Any) -> int:
        calls.append(len(buffers))
        return int(real(fd, p, offset, buffers, etag))

    monkeypatch.setattr(local, "_preadv_exact", spy)
    got = ts_st.load(path) if how == "load" else dict(ts_st.iter_tensors(path))
    assert all(same_bytes(got[n], want[n]) for n in want)
    assert len(calls) <= 1 + -(-len(want) // 255), calls  # the header, then gathered chunks


def test_options_keep_every_read_in_the_readers_layers(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # A deadline (or any option beyond the read-ahead's) is the reader's: its reads
    # go through the layers that keep it, one per tensor as before.
    import tensorstream

    path, want = _many(tmp_path, 50)
    reads = [0]
    real = tensorstream.StreamReader.readinto

    def spy(self: Any, b: Any) -> int:
        reads[0] += 1
        return real(self, b)

    monkeypatch.setattr(tensorstream.StreamReader, "readinto", spy)
    got = ts_st.load(path, timeout_total=60)
    assert all(same_bytes(got[n], want[n]) for n in want)
    assert reads[0] >= len(want)


@pytest.mark.parametrize("mtime_shift", [10**9, 0])
@pytest.mark.parametrize("how", ["load", "iter_tensors"])
def test_a_file_changed_in_place_while_loading_raises(
        model: tuple[Path, dict[str, Any]], small_chunks: int, how: str, mtime_shift: int,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The descriptor holds the version the header was read from: a write in place
    # after the load began is caught by the fstat around every gathered read, also
    # one that put the old mtime back (mtime_shift 0: rsync -t, cp -p), by its ctime.
    from tensorstream.errors import ObjectChangedError
    from tensorstream.providers.local import provider as local

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(2)))
    path, want = model
    calls = [0]
    real = local._preadv_exact

    def spy(fd: int, p: str, offset: int, buffers: Any, etag: Any) -> int:
        calls[0] += 1
        if calls[0] == 3:  # the header's read, a chunk, then this one
            st = path.stat()
            last = path.read_bytes()[-1:]
            time.sleep(0.05)  # (the file clock is coarse)
            with open(path, "r+b") as f:  # the same byte, written again in place
                f.seek(st.st_size - 1)
                f.write(last)
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + mtime_shift))
        return int(real(fd, p, offset, buffers, etag))

    monkeypatch.setattr(local, "_preadv_exact", spy)
    got: list[tuple[str, Any]] = []
    with pytest.raises(ObjectChangedError, match="changed while it was being read"):
        if how == "load":
            got.extend(ts_st.load(path, num_readers=2).items())
        else:
            got.extend(ts_st.iter_tensors(path))
    assert how == "iter_tensors" or not got
    for name, t in got:  # whatever was handed out is complete
        assert same_bytes(t, want[name]), name
