"""tensorizer loads of a local file onto the CPU: threads fill the tensors chunk by chunk
(tensorstream.tensorizer.local). Byte-exact against tensorizer's own load for every dtype
and across chunk and thread boundaries; the chunked path is really taken (one tensor
shared by several threads); hashes, encryption, filter_func, lazy loads and dtype keep
tensorizer's meaning; a failed or truncated read hands out nothing; a file replaced by
rename is not mixed in; what the fast path does not cover falls back to tensorizer's
own readers."""

from __future__ import annotations

import itertools
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from tensorizer import DecryptionParams, EncryptionParams, TensorDeserializer, TensorSerializer
from tests.tensor_files import disk_fails_at, same_bytes

import tensorstream
from tensorstream import errors
from tensorstream.readahead import arena, localfill
from tensorstream.tensorizer import local
from tensorstream.tensorizer.hook import StreamTensorDeserializer
from tensorstream.tensorizer.load import DecryptionError, Encryption, TensorHashMismatchError

CHUNK = 1000  # odd: chunks cross pages, elements and tensors at odd offsets


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(localfill, "CHUNK", CHUNK)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    base = torch.randn(31, 17, generator=g)
    out: dict[str, torch.Tensor] = {}
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8,
                  torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool,
                  torch.complex64, torch.float8_e4m3fn, torch.float8_e5m2):
        if dtype.is_floating_point:
            t = base.to(dtype)
        elif dtype.is_complex:
            t = torch.complex(base, -base).to(dtype)
        elif dtype == torch.bool:
            t = base > 0
        else:
            t = torch.randint(0, 100, (31, 17), generator=g).to(dtype)
        out[f"d.{str(dtype).removeprefix('torch.')}"] = t
    out["scalar"] = torch.tensor(-2.5, dtype=torch.float64)  # 0-dim
    out["empty"] = torch.empty(0, 3)
    out["odd"] = torch.arange(4093, dtype=torch.int8)  # no multiple of the chunk
    out["big"] = torch.randn(3001, 7, generator=g)  # many chunks
    out["tail.empty"] = torch.empty(0, dtype=torch.int16)  # (an empty opaque dtype: tensorizer fails)
    return out


STATE = _state()


def _write(path: Path, state: dict[str, torch.Tensor] = STATE, encryption: Any = None) -> Path:
    ser = TensorSerializer(str(path), encryption=encryption)
    ser.write_state_dict(state)
    ser.close()
    return path


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return _write(tmp_path / "m.tensors")


def _theirs(path: Path, **kwargs: Any) -> dict[str, torch.Tensor]:
    with TensorDeserializer(str(path), device="cpu", **kwargs) as d:
        return {k: v.clone() for k, v in d.items()}


class _Spy:
    """Counts the chunk reads (thread by thread) and tensorizer's reads that the
    threads had already filled."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.lock = threading.Lock()
        self.chunks: list[tuple[int, int, int]] = []  # (thread, offset, bytes read)
        self.reads: list[tuple[int, list[int]]] = []  # (offset, each buffer's bytes)
        self.received: list[int] = []
        real_read, real_received = local.LocalRun.read_at, local.LocalRun.received

        def read_at(run: Any, offset: int, buffers: Any) -> None:
            with self.lock:
                self.chunks.append((threading.get_ident(), offset, sum(b.nbytes for b in buffers)))
                self.reads.append((offset, [b.nbytes for b in buffers]))
            real_read(run, offset, buffers)

        def received(run: Any, pos: int, view: memoryview) -> bool:
            hit = real_received(run, pos, view)
            if hit:
                with self.lock:
                    self.received.append(pos)
            return hit

        monkeypatch.setattr(local.LocalRun, "read_at", read_at)
        monkeypatch.setattr(local.LocalRun, "received", received)


def _data_spans(path: Path, names: Any = None, **kwargs: Any) -> dict[int, int]:
    with TensorDeserializer(str(path), device="cpu", lazy_load=True, **kwargs) as d:
        return {e.data_offset: e.data_length for e in d._metadata.values()
                if e.data_length and (names is None or e.name.normalize_() in names)}


@pytest.mark.parametrize("readers", [None, 1, 2, 3, 7])
def test_every_dtype_is_byte_identical_to_tensorizers_own_load(
        model: Path, readers: int | None, monkeypatch: pytest.MonkeyPatch) -> None:
    spy = _Spy(monkeypatch)
    want = _theirs(model)
    with tensorstream.deserialize(model, device="cpu", num_readers=readers) as got:
        assert isinstance(got, local.LocalTensorDeserializer)
        assert sorted(got) == sorted(want)
        for name in want:
            assert same_bytes(got[name], want[name]), name
            assert same_bytes(got[name], STATE[name]), name
    spans = _data_spans(model)
    # every tensor's data came from the chunk reads, none from tensorizer's own readinto
    assert sorted(spy.received) == sorted(spans)
    # each data byte was read once; the reads past it are the headers between gathered tensors
    assert _data_bytes_read(spy, spans) == sum(spans.values())
    assert max(n for _, _, n in spy.chunks) <= CHUNK
    assert _local_threads() == []  # the helper threads have returned


def _data_bytes_read(spy: _Spy, spans: dict[int, int]) -> int:
    """Bytes of the chunk reads that lie in tensor data (each read is one file range)."""
    total = 0
    for _, offset, n in spy.chunks:
        for begin, size in spans.items():
            total += max(0, min(offset + n, begin + size) - max(offset, begin))
    return total


def test_small_neighbouring_tensors_are_read_together(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # 60 tensors of 40-400 bytes: a chunk of 1000 gathers a few at a time, with the
    # header between two of them read into scratch, never into a tensor.
    g = torch.Generator().manual_seed(9)
    state = {f"t{i:02d}": torch.randint(-9, 9, (10 + (i * 7) % 90,), generator=g,
                                        dtype=torch.int32) for i in range(60)}
    path = _write(tmp_path / "small.tensors", state)
    spy = _Spy(monkeypatch)
    with tensorstream.deserialize(path, device="cpu", num_readers=2) as got:
        assert isinstance(got, local.LocalTensorDeserializer)
        for name, t in state.items():
            assert same_bytes(got[name], t), name
    spans = _data_spans(path)
    assert _data_bytes_read(spy, spans) == sum(spans.values())
    assert len(spy.reads) < len(spans) // 2  # gathered: far fewer reads than tensors
    gathered = [sizes for _, sizes in spy.reads if len(sizes) > 1]
    assert gathered and all(len(sizes) % 2 for sizes in gathered)  # tensor, header, tensor ...
    assert all(sum(sizes) <= CHUNK for _, sizes in spy.reads)
    for offset, sizes in spy.reads:  # the buffers of a read: data spans and the gaps between
        pos = offset
        for k, n in enumerate(sizes):
            assert (pos in spans and spans[pos] == n) == (k % 2 == 0), (offset, sizes)
            pos += n


def test_a_tensor_of_a_chunk_or_more_is_never_gathered(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    state = {"a": torch.arange(50, dtype=torch.int32), "big": torch.arange(300, dtype=torch.int32),
             "b": torch.arange(60, dtype=torch.int32), "c": torch.arange(70, dtype=torch.int32)}
    path = _write(tmp_path / "mixed.tensors", state)
    spy = _Spy(monkeypatch)
    with tensorstream.deserialize(path, device="cpu") as got:
        for name, t in state.items():
            assert same_bytes(got[name], t), name
    spans = _data_spans(path)
    big = next(o for o, n in spans.items() if n == 1200)
    for offset, sizes in spy.reads:
        if offset <= big < offset + sum(sizes):
            assert len(sizes) == 1  # read on its own, in pieces of a chunk
    assert any(len(sizes) == 3 for _, sizes in spy.reads)  # b and c, with c's header between


@pytest.mark.skipif(arena._madvise is None or not arena._thp_enabled(),
                    reason="no transparent huge pages")
def test_tensors_live_in_one_mapping_each_with_its_own_storage(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # readahead.arena: where huge pages are free and cheap the fast path fills one
    # mapping, yet every tensor is a storage of its own, as tensorizer's own load hands out.
    monkeypatch.setattr(arena, "huge_pages_free", lambda nbytes: True)
    monkeypatch.setattr(arena, "DEAR_NS_PER_MIB", 10**12)  # their cost depends on the host
    monkeypatch.setattr(arena, "SLOW_NS_PER_MIB", 10**12)
    state = {**STATE, "huge.page": torch.arange(3 << 18, dtype=torch.float32) % 251}
    path = _write(tmp_path / "big.tensors", state)
    with tensorstream.deserialize(path, device="cpu") as got:
        loaded = dict(got)
    stored = [t for t in loaded.values() if t.numel()]
    assert all(t.untyped_storage().nbytes() == t.nbytes for t in stored)  # not the mapping's
    ptrs = sorted((t.data_ptr(), t.nbytes) for t in stored)
    assert all(a + n <= b for (a, n), (b, _) in itertools.pairwise(ptrs))
    assert loaded["huge.page"].data_ptr() % (2 << 20) == 0  # on a huge page of its own
    # one mapping (no malloc arena holds them all), packed within alignment
    first, last = ptrs[0][0], ptrs[-1][0] + ptrs[-1][1]
    assert last - first <= sum(n for _, n in ptrs) + (2 << 20) + len(ptrs) * arena.ALIGN
    save_file({k: v.contiguous() for k, v in loaded.items()}, tmp_path / "again.safetensors")
    for name in state:
        assert same_bytes(loaded[name], state[name]), name


def test_memory_tensorizer_allocated_itself_is_read_as_before(
        model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Correctness never rests on the arming: if tensorizer's torch.empty is not given the
    # threads' memory (its internals changed), its own reads fill its own memory.
    spy = _Spy(monkeypatch)
    monkeypatch.setattr(local.LocalRun, "arm", lambda self, header: None)
    with tensorstream.deserialize(model, device="cpu", num_readers=2) as got:
        assert all(same_bytes(got[k], STATE[k]) for k in STATE)
    assert spy.received == [] and spy.chunks  # filled, but nothing taken from the fill


def test_one_tensor_is_shared_by_several_threads(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # The huge shape: tensorizer gives a file of one tensor one reader, whatever
    # num_readers says; here its chunks are read by two threads at the same time.
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(2)))
    one = {"w": torch.randn(200_000, generator=torch.Generator().manual_seed(1))}
    path = _write(tmp_path / "one.tensors", one)
    barrier = threading.Barrier(2, timeout=10)
    seen: set[int] = set()
    real = local.LocalRun.read_at

    def read_at(run: Any, offset: int, buf: memoryview) -> None:
        me = threading.get_ident()
        if me not in seen:
            seen.add(me)
            barrier.wait()  # both threads read chunks at the same time (else: broken)
        real(run, offset, buf)

    monkeypatch.setattr(local.LocalRun, "read_at", read_at)
    with tensorstream.deserialize(path, device="cpu") as got:
        assert torch.equal(got["w"], one["w"])
        assert got.stats.readers == 2
    assert len(seen) == 2


def test_threads_never_outnumber_the_cpus(model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    spy = _Spy(monkeypatch)
    with tensorstream.deserialize(model, device="cpu", num_readers=8) as got:
        assert got.stats.readers == 1
        assert all(same_bytes(got[k], STATE[k]) for k in STATE)
    assert len({t for t, _, _ in spy.chunks}) == 1


def test_filter_lazy_load_and_dtype_read_only_what_is_asked(
        model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spy = _Spy(monkeypatch)
    keep = {"big", "d.bfloat16", "scalar"}
    with tensorstream.deserialize(model, device="cpu", filter_func=lambda n: n in keep,
                                  dtype=torch.float16) as got:
        assert set(got) == keep
        for k in keep:
            assert torch.equal(got[k], STATE[k].to(torch.float16)), k
    assert sorted(spy.received) == sorted(_data_spans(model, keep))
    spy.received.clear()
    spy.chunks.clear()
    with tensorstream.deserialize(model, device="cpu", lazy_load=True) as lazy:
        assert spy.chunks == []  # nothing read before a tensor is asked for
        # (in file order: tensorizer's lazy load of a file on one reader cannot go back)
        first = next(iter(lazy))
        assert same_bytes(lazy[first], STATE[first])
        assert spy.received == list(_data_spans(model, {first}))
        assert all(same_bytes(lazy[k], STATE[k]) for k in lazy)


@pytest.mark.parametrize("eager", [True, False])
def test_encrypted_files_are_decrypted_in_place(tmp_path: Path, eager: bool,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    spy = _Spy(monkeypatch)
    key = os.urandom(32)
    state = {k: v for k, v in STATE.items() if v.numel()}  # (tensorizer cannot encrypt empty ones)
    path = _write(tmp_path / "enc.tensors", state, encryption=EncryptionParams(key))
    with tensorstream.deserialize(path, device="cpu", encryption=Encryption(key=key),
                                  lazy_load=not eager, verify_hash=True) as got:
        assert all(same_bytes(got[k], state[k]) for k in got) and len(got) == len(state)
    # (encryption chunks: maybe several reads per tensor)
    assert set(spy.received) >= set(_data_spans(path, encryption=DecryptionParams.from_key(key)))
    with pytest.raises(DecryptionError):
        tensorstream.deserialize(path, device="cpu", encryption=Encryption(key=os.urandom(32)))


def _flip_in(path: Path, name: str) -> None:
    (offset,) = _data_spans(path, {name})
    data = bytearray(path.read_bytes())
    data[offset + 5] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_hash_mismatch_raises_when_hashes_are_verified(model: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    spy = _Spy(monkeypatch)
    _flip_in(model, "big")
    with pytest.raises(TensorHashMismatchError, match="big"):
        tensorstream.deserialize(model, device="cpu", verify_hash=True)
    assert spy.received, "the fast path was taken"
    with tensorstream.deserialize(model, device="cpu") as got:  # tensorizer: no check asked
        assert not torch.equal(got["big"], STATE["big"])


def _local_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("tensorstream-local")]


@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("fail_at", [1, 7, 40])
def test_a_failed_read_hands_out_no_tensor_it_touched(
        model: Path, lazy: bool, fail_at: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(2)))
    disk_fails_at(monkeypatch, local, fail_at)
    got: dict[str, torch.Tensor] = {}
    with pytest.raises(OSError, match="Input/output error"):
        if not lazy:
            got.update(tensorstream.deserialize(model, device="cpu", num_readers=2))
        else:
            with tensorstream.deserialize(model, device="cpu", lazy_load=True) as d:
                for k in d:  # lazily, one tensor after the other
                    got[k] = d[k]
    assert lazy or not got
    for name, t in got.items():  # whatever was handed out is complete
        assert same_bytes(t, STATE[name]), name
    assert _local_threads() == []  # every helper thread has returned


def test_a_file_truncated_while_loading_raises_never_zeros(model: Path) -> None:
    size = model.stat().st_size
    with tensorstream.deserialize(model, device="cpu", lazy_load=True) as sd:
        assert same_bytes(sd["d.float32"], STATE["d.float32"])
        os.truncate(model, size - 40)  # in place: same inode
        with pytest.raises((errors.MalformedFileError, errors.ObjectChangedError)):
            for k in STATE:
                sd[k].clone()


def test_a_file_replaced_by_rename_is_not_mixed_in(model: Path, tmp_path: Path) -> None:
    other = {k: torch.zeros_like(v) for k, v in STATE.items()}
    fresh = _write(tmp_path / "other.tensors", other)
    with tensorstream.deserialize(model, device="cpu", lazy_load=True) as sd:
        first = sd["d.float32"].clone()
        os.replace(fresh, model)  # the path now names another file
        rest = {k: sd[k] for k in STATE}
    assert same_bytes(first, STATE["d.float32"])
    assert all(same_bytes(rest[k], STATE[k]) for k in STATE)


def _other_version(tmp_path: Path) -> bytes:
    """A file of the same tensors (so of the same layout and size), other values."""
    other = {k: (~v.view(torch.uint8)).view(v.dtype) if v.element_size() == 1 else v + 1
             for k, v in STATE.items()}
    return _write(tmp_path / "other.tensors", other).read_bytes()


def test_a_file_rewritten_in_place_while_loading_lazily_raises_never_mixes(
        model: Path, tmp_path: Path) -> None:
    # Nothing compared the file with itself: a lazy load read its first tensors
    # from one version and the rest from the other (same size, same layout).
    other = _other_version(tmp_path)
    with tensorstream.deserialize(model, device="cpu", lazy_load=True) as sd:
        assert same_bytes(sd["d.float32"], STATE["d.float32"])
        with open(model, "r+b") as f:  # in place: same inode, same size
            f.write(other)
        with pytest.raises(errors.ObjectChangedError, match="changed while"):
            for k in STATE:
                sd[k].clone()


def test_a_file_rewritten_in_place_while_loading_raises_never_mixes(
        model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The threads' chunk reads (preadv) checked nothing either: an eager load
    # handed out tensors of both versions. Rewritten after the first chunk.
    other = _other_version(tmp_path)
    real, calls = os.preadv, []

    def preadv(fd: int, buffers: Any, offset: int, *flags: int) -> int:
        calls.append(offset)
        if len(calls) == 2:
            with open(model, "r+b") as f:
                f.write(other)
        return real(fd, buffers, offset, *flags)

    monkeypatch.setattr(os, "preadv", preadv)
    with pytest.raises(errors.ObjectChangedError, match="changed while"):
        tensorstream.deserialize(model, device="cpu", num_readers=2)
    assert len(calls) >= 2 and _local_threads() == []


def _put_back_mtime(path: Path, data: bytes) -> None:
    """Rewrite ``path`` in place with ``data`` and put its old mtime back, as
    ``rsync -t``/``cp -p``/``tar -x`` do (after a pause: the file clock is coarse)."""
    st = path.stat()
    time.sleep(0.05)
    with open(path, "r+b") as f:
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_a_rewrite_that_put_the_old_mtime_back_raises_never_mixes(
        model: Path, tmp_path: Path) -> None:
    # The version was mtime, size and inode, all three the same after such a
    # rewrite: the load handed out tensors of both files.
    other = _other_version(tmp_path)
    with tensorstream.deserialize(model, device="cpu", lazy_load=True) as sd:
        assert same_bytes(sd["d.float32"], STATE["d.float32"])
        _put_back_mtime(model, other)
        with pytest.raises(errors.ObjectChangedError, match="rsync -t"):
            for k in STATE:
                sd[k].clone()


def test_a_chmod_while_loading_raises_never_mixes(model: Path) -> None:
    # A chmod cannot be told from cp -p's rewrite in place (mode and old mtime put back).
    with tensorstream.deserialize(model, device="cpu", lazy_load=True) as sd:
        assert same_bytes(sd["d.float32"], STATE["d.float32"])
        time.sleep(0.05)
        model.chmod(0o600)  # the change time and the mode move
        with pytest.raises(errors.ObjectChangedError, match="chmod"):
            for k in STATE:
                sd[k].clone()


def test_load_into_module_takes_the_fast_path(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    spy = _Spy(monkeypatch)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 300), torch.nn.Linear(300, 8))
    tensorstream.serialize(net, tmp_path / "net.tensors")
    with torch.device("meta"):
        empty = torch.nn.Sequential(torch.nn.Linear(64, 300), torch.nn.Linear(300, 8))
    result = tensorstream.load_into_module(empty, tmp_path / "net.tensors", "cpu")
    assert result.loaded == 4 and spy.received
    assert all(torch.equal(a, b) for a, b in zip(empty.state_dict().values(),
                                                 net.state_dict().values(), strict=True))


# -- what the fast path leaves to tensorizer's own readers ------------------------------


def test_fast_path_is_a_plain_local_file_onto_the_cpu(model: Path) -> None:
    from tensorstream.distributed.memory import MemorySource

    with open(model, "rb") as f:
        assert local.fast_path(f, "cpu") and local.fast_path(f, torch.device("cpu"))
        # CUDA loads go through tensorizer's pinned staging buffer: its readers
        assert not local.fast_path(f, "cuda") and not local.fast_path(f, "cuda:1")
        assert local.fast_path(f, None) == (not torch.cuda.is_available())
    with tensorstream.open(str(model), "rb") as reader:
        assert not local.fast_path(reader, "cpu")
    assert not local.fast_path(MemorySource.__new__(MemorySource), "cpu")


def test_options_keep_the_providers_reader(model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spy = _Spy(monkeypatch)
    with tensorstream.deserialize(model, device="cpu", readahead=1 << 20) as got:
        assert type(got) is StreamTensorDeserializer
        assert all(same_bytes(got[k], STATE[k]) for k in STATE)
    assert spy.chunks == []


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_loads_keep_tensorizers_readers(model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spy = _Spy(monkeypatch)
    with tensorstream.deserialize(model, device="cuda") as got:
        assert type(got) is StreamTensorDeserializer
        assert all(same_bytes(got[k].cpu(), STATE[k]) for k in STATE)
    assert spy.chunks == []


def test_meta_tensors_are_zero_filled_by_tensorizer(tmp_path: Path) -> None:
    state = {"a": torch.randn(100, 7), "m": torch.empty(50, 9, device="meta"),
             "b": torch.arange(3000, dtype=torch.int32)}
    path = _write(tmp_path / "meta.tensors", state)
    want = _theirs(path)
    with tensorstream.deserialize(path, device="cpu") as got:
        assert isinstance(got, local.LocalTensorDeserializer)
        assert all(same_bytes(got[k], want[k]) for k in want)
        assert not got["m"].any()
