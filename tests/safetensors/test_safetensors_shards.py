"""tensorstream.safetensors.load of a sharded checkpoint on every backend: from its index or
its folder, a set of shards with one missing or cut told by name, an index that names a
missing tensor or points outside its folder refused."""

from __future__ import annotations

import json
import re
import secrets
from pathlib import Path
from typing import Any

import pytest

import tensorstream
from stores import Store, make_store
from tensorstream.errors import (
    MalformedFileError,
    NotFoundError,
)

torch = pytest.importorskip("torch")
st_torch = pytest.importorskip("safetensors.torch")

from sharded_checkpoint import write_sharded  # noqa: E402  (needs torch)

from tensor_files import same_bytes  # noqa: E402  (needs torch)

ts_st = tensorstream.safetensors


@pytest.fixture(params=["local", "http", "s3", "redis", "mem"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    return make_store(request.param, request, tmp_path / "store")


def test_sharded_checkpoint_from_its_index(backend: Store, tmp_path: Path) -> None:
    tensors = write_sharded(backend, tmp_path, extra_in_shard=True)
    uri = backend.uri("ckpt/model.safetensors.index.json")
    got = ts_st.load(uri, **backend.options)
    assert sorted(got) == sorted(tensors)
    for name, t in tensors.items():
        assert same_bytes(got[name], t), name
    streamed = dict(ts_st.iter_tensors(uri, **backend.options))
    assert sorted(streamed) == sorted(tensors)
    assert all(same_bytes(streamed[n], t) for n, t in tensors.items())
    some = ts_st.load(uri, filter=["layers.3.w"], **backend.options)
    assert list(some) == ["layers.3.w"]


@pytest.mark.parametrize("name", ["local", "s3", "mem"])
def test_sharded_checkpoint_from_its_folder(name: str, request: pytest.FixtureRequest,
                                            tmp_path: Path) -> None:
    backend = make_store(name, request, tmp_path / "store")
    tensors = write_sharded(backend, tmp_path)
    folder = backend.uri("ckpt/")
    got = ts_st.load(folder, **backend.options)
    assert sorted(got) == sorted(tensors)
    assert all(same_bytes(got[n], t) for n, t in tensors.items())


@pytest.mark.parametrize("name", ["s3", "mem"])
def test_a_prefix_named_without_its_slash_says_to_add_it(name: str,
                                                         request: pytest.FixtureRequest,
                                                         tmp_path: Path) -> None:
    """``load("s3://b/llama")`` (a checkpoint's prefix, HF-style) said only "no such object",
    where ``inspect`` and ``convert`` say to end a prefix with '/'; ``iter_tensors`` and
    ``open`` too."""
    backend = make_store(name, request, tmp_path / "store")
    write_sharded(backend, tmp_path)
    bare = backend.uri("ckpt")
    for call in (lambda: ts_st.load(bare, **backend.options),
                 lambda: dict(ts_st.iter_tensors(bare, **backend.options)),
                 lambda: ts_st.open(bare, **backend.options)):
        with pytest.raises(NotFoundError, match="to load the checkpoint in a folder or prefix, "
                                                "end it with '/'") as info:
            call()
        assert str(info.value).endswith(f"{bare}/")
    # Neighbours: a file's name gets no hint; with its '/' the prefix loads.
    with pytest.raises(NotFoundError) as info:
        ts_st.load(backend.uri("ckpt/none.safetensors"), **backend.options)
    assert "end it with" not in str(info.value)
    assert len(ts_st.load(f"{bare}/", **backend.options)) > 1


@pytest.mark.parametrize("name", ["local", "s3"])
def test_a_folder_missing_a_numbered_shard_is_not_loaded_in_part(
        name: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """A folder without an index whose shards are numbered ``-0000N-of-0000M`` (a download or
    copy cut short) loaded the shards it held and returned without the others' tensors:
    every door (``load``, ``iter_tensors``, ``open``, ``inspect``). It is a
    ``NotFoundError`` naming the missing shards. Complete sets and other names load."""
    backend = make_store(name, request, tmp_path / "store")
    one, two = {"a": torch.ones(2)}, {"b": torch.zeros(3)}
    backend.put("cut/model-00001-of-00003.safetensors", st_torch.save(one))
    backend.put("cut/model-00003-of-00003.safetensors", st_torch.save(two))
    backend.put("cut/extra.safetensors", st_torch.save({"c": torch.ones(1)}))
    folder = backend.uri("cut/")
    calls = [lambda: ts_st.load(folder, **backend.options),
             lambda: dict(ts_st.iter_tensors(folder, **backend.options)),
             lambda: ts_st.open(folder, **backend.options).keys(),
             lambda: tensorstream.inspect(folder, **backend.options)]
    for call in calls:
        with pytest.raises(NotFoundError, match=r"model-00002-of-00003\.safetensors") as info:
            call()
        assert "2 of the 3" in str(info.value)
    backend.put("cut/model-00002-of-00003.safetensors", st_torch.save({"d": torch.ones(4)}))
    assert sorted(ts_st.load(folder, **backend.options)) == ["a", "b", "c", "d"]


def test_a_zero_based_set_of_shards_is_whole_when_it_holds_0_to_m_minus_1(
        tmp_path: Path) -> None:
    """Some tools number shards from 0 (``model-00000-of-00001.safetensors``): such a
    complete set was refused since last session as missing ``-00001-of-00001`` (or the
    last of several), though every shard is there. A set holding ``-00000-`` is counted
    from 0; one missing a shard in it is still refused, naming it."""
    single = tmp_path / "single"
    single.mkdir()
    (single / "model-00000-of-00001.safetensors").write_bytes(st_torch.save({"a": torch.ones(2)}))
    assert sorted(ts_st.load(str(single))) == ["a"]
    several = tmp_path / "several"
    several.mkdir()
    for n in (0, 2):
        (several / f"model-0000{n}-of-00003.safetensors").write_bytes(
            st_torch.save({f"t{n}": torch.ones(1)}))
    with pytest.raises(NotFoundError, match=r"model-00001-of-00003\.safetensors"):
        ts_st.load(str(several))
    (several / "model-00001-of-00003.safetensors").write_bytes(
        st_torch.save({"t1": torch.ones(1)}))
    assert sorted(ts_st.load(str(several))) == ["t0", "t1", "t2"]


@pytest.mark.parametrize(("total", "present", "missing", "from_0"), [
    (2, [1], ["00002"], ["00000"]),  # numbered from 0, its -00000- missing (or from 1: -00002-)
    (3, [1, 2], ["00003"], ["00000"]),  # from 1 missing the last (or from 0 the first)
    (3, [2], ["00001", "00003"], ["00000", "00001"]),  # two missing, either way
    (3, [2, 3], ["00001"], None),  # from 1 (it holds -00003-), missing the first
    (4, [4], ["00001", "00002", "00003"], None),
    (2, [0], ["00001"], None),  # from 0 (it holds -00000-), missing the last
    (3, [0, 2], ["00001"], None),
])


def test_a_cut_set_of_shards_names_the_shards_it_lacks(
        tmp_path: Path, total: int, present: list[int], missing: list[str],
        from_0: list[str] | None) -> None:
    """A set numbered from 0 missing its ``-00000-`` shard (``model-00001-of-00002`` alone)
    was said to lack ``model-00002-of-00002``, a name no shard of it has. Where the names
    left cannot tell a set numbered from 0 from one numbered from 1 (neither ``-00000-``
    nor ``-0000M-of-0000M`` is there), both readings' missing shards are named; otherwise
    the one reading's."""
    for n in present:
        (tmp_path / f"model-{n:05d}-of-{total:05d}.safetensors").write_bytes(
            st_torch.save({f"t{n}": torch.ones(1)}))
    with pytest.raises(NotFoundError) as info:
        ts_st.load(str(tmp_path))
    message = str(info.value)
    assert f"holds {len(present)} of the {total} shards" in message
    named = re.findall(r"model-(\d{5})-of-\d{5}\.safetensors", message)
    head, _, alternative = message.partition("numbered from 0")
    assert re.findall(r"model-(\d{5})-of-", head) == missing, message
    if from_0 is None:
        assert not alternative, message
    else:
        assert re.findall(r"model-(\d{5})-of-", alternative) == from_0, message
    assert set(named) == set(missing) | set(from_0 or ()), message


def test_a_dangling_link_in_a_folder_is_a_missing_shard(tmp_path: Path) -> None:
    """A Hugging Face cache snapshot is links into ``blobs/``; a link whose blob is gone
    (an interrupted download, a cache clean-up) was left out of the folder's files, and
    the load returned without its tensors. It is a shard that is not found."""
    snap = tmp_path / "snapshot"
    snap.mkdir()
    st_torch.save_file({"a": torch.ones(2)}, str(tmp_path / "blob1"))
    (snap / "model.safetensors").symlink_to(tmp_path / "blob1")
    (snap / "lm_head.safetensors").symlink_to(tmp_path / "blob-gone")
    for call in (lambda: ts_st.load(snap), lambda: dict(ts_st.iter_tensors(snap)),
                 lambda: ts_st.open(snap).keys(), lambda: tensorstream.inspect(snap)):
        with pytest.raises(NotFoundError, match=r"lm_head\.safetensors"):
            call()


def test_index_naming_a_missing_tensor_fails(tmp_path: Path) -> None:
    st_torch.save_file({"a": torch.ones(2)}, str(tmp_path / "s1.safetensors"))
    index = {"weight_map": {"a": "s1.safetensors", "b": "s1.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(MalformedFileError, match=r"s1\.safetensors lacks 1 tensor.*'?b"):
        ts_st.load(tmp_path / "model.safetensors.index.json")


@pytest.mark.parametrize("shard", ["../evil.safetensors", "/etc/passwd", "s3://b/k",
                                   "a/../../x.safetensors", "", 7,
                                   "s\ud800.safetensors", "s\0.safetensors"])


def test_index_cannot_point_outside_its_folder(tmp_path: Path, shard: Any,
                                               http_server: Any, http_reset: None) -> None:
    """(A lone surrogate, ``"\\ud800"`` in the JSON, raised a bare UnicodeEncodeError.)"""
    index = json.dumps({"weight_map": {"a": shard}})
    (tmp_path / "model.safetensors.index.json").write_text(index)
    key = f"ix{secrets.token_hex(4)}/model.safetensors.index.json"
    http_server.put(key, index.encode())
    for uri in (tmp_path / "model.safetensors.index.json", http_server.url(key)):
        for attempt in (ts_st.load, ts_st.open, tensorstream.inspect):
            with pytest.raises(MalformedFileError, match=r"model\.safetensors\.index\.json"):
                attempt(uri)


def test_filtered_load_opens_only_the_shards_it_needs(tmp_path: Path,
                                                     request: pytest.FixtureRequest) -> None:
    backend = make_store("local", request, tmp_path / "store")
    tensors = write_sharded(backend, tmp_path)
    folder = Path(backend.uri("ckpt/"))
    (folder / "model-00003-of-00003.safetensors").write_bytes(b"garbage")
    index = folder / "model.safetensors.index.json"
    got = ts_st.load(index, filter=["embed"])  # in shard 1
    assert list(got) == ["embed"] and same_bytes(got["embed"], tensors["embed"])
    with pytest.raises(MalformedFileError, match="model-00003-of-00003"):
        ts_st.load(index)


def test_a_shard_the_index_names_that_is_missing_names_the_index_and_its_tensors(
        backend: Store, tmp_path: Path) -> None:
    """A shard an index names that is not there (a download or a copy cut short) said only
    "no such file" of the shard (``load``, ``iter_tensors``, ``open(...).get_tensor``,
    ``convert``, ``inspect``): not which index named it, nor which tensors were to come from it. It
    still is a ``NotFoundError`` naming the shard, and names both now. The shards that
    are there still load."""
    write_sharded(backend, tmp_path)
    index = json.loads(backend.get("ckpt/model.safetensors.index.json"))
    index["weight_map"].update({"lm_head.w": "gone.safetensors", "norm.w": "gone.safetensors"})
    backend.put("ckpt/model.safetensors.index.json", json.dumps(index).encode())
    uri = backend.uri("ckpt/model.safetensors.index.json")
    calls = [lambda: ts_st.load(uri, **backend.options),
             lambda: dict(ts_st.iter_tensors(uri, **backend.options)),
             lambda: ts_st.open(uri, **backend.options).get_tensor("norm.w"),
             lambda: tensorstream.convert(uri, str(tmp_path / "out.tensors"),
                                          src_options=backend.options),
             lambda: tensorstream.inspect(uri, **backend.options)]
    for call in calls:
        with pytest.raises(NotFoundError) as info:
            call()
        message = str(info.value)
        assert "gone.safetensors" in message, message
        assert re.search(r"model\.safetensors\.index\.json puts 2 tensors there: "
                         r"'lm_head\.w', 'norm\.w'", message), message
    assert sorted(ts_st.load(uri, filter=["embed"], **backend.options)) == ["embed"]


@pytest.mark.parametrize("name", ["local", "s3"])
def test_an_index_naming_no_tensors_is_refused_unless_nothing_was_asked(
        name: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """An index whose weight_map is empty (``{}``) made load return {} and iter_tensors and
    open yield nothing, without a word (convert refused it); each says the index names no
    tensors now. A filter that asks for nothing (``filter=[]``) still gets nothing."""
    backend = make_store(name, request, tmp_path / "store")
    st_torch.save_file({"a": torch.ones(2)}, str(tmp_path / "s1.safetensors"))
    backend.put("ckpt/s1.safetensors", (tmp_path / "s1.safetensors").read_bytes())
    backend.put("ckpt/model.safetensors.index.json",
                json.dumps({"metadata": {"total_size": 0}, "weight_map": {}}).encode())
    for uri in (backend.uri("ckpt/model.safetensors.index.json"), backend.uri("ckpt/")):
        for call, kwargs in ((ts_st.load, {}), (ts_st.iter_tensors, {}),
                             (ts_st.load, {"filter": ["a"]}), (ts_st.open, {})):
            with pytest.raises(MalformedFileError, match="names no tensors") as err:
                list(call(uri, **kwargs, **backend.options))  # type: ignore[operator]
            assert "model.safetensors.index.json" in str(err.value)
        assert ts_st.load(uri, filter=[], **backend.options) == {}
        assert list(ts_st.iter_tensors(uri, filter=(), **backend.options)) == []
