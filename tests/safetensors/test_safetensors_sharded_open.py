"""tensorstream.safetensors.open on a sharded checkpoint (index or folder): keys from the
index, tensors and slices from the shard the index names, shards opened lazily; an
HTTP(S) index keeps its query string (tokens, signatures) for the shard URIs."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import tensorstream
from stores import Store, make_store
from tensorstream.errors import MalformedFileError, PermissionDeniedError
from tensorstream.testing.http_server import HTTPTestServer

torch = pytest.importorskip("torch")
st_torch = pytest.importorskip("safetensors.torch")

from sharded_checkpoint import write_sharded  # noqa: E402  (needs torch)

from tensor_files import same_bytes  # noqa: E402  (needs torch)

ts_st = tensorstream.safetensors

SHARD1 = "model-00001-of-00003.safetensors"
SHARD3 = "model-00003-of-00003.safetensors"


@pytest.fixture(params=["local", "http", "s3", "mem"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    return make_store(request.param, request, tmp_path / "store")


def test_open_sharded_index_routes_every_tensor(backend: Store, tmp_path: Path) -> None:
    tensors = write_sharded(backend, tmp_path, extra_in_shard=True)
    with ts_st.open(backend.uri("ckpt/model.safetensors.index.json"), **backend.options) as f:
        assert f.keys() == sorted(tensors)
        assert len(f.shards) == 3
        for name, t in tensors.items():
            assert same_bytes(f.get_tensor(name), t), name
        # the stale copy in another shard is never what comes back
        assert f.shard_of("embed").endswith(SHARD1)
        assert same_bytes(f.get_slice("layers.5.w")[3:7, 8:16], tensors["layers.5.w"][3:7, 8:16])
        assert f.get_slice("embed").get_shape() == [300, 64]
        assert f.metadata() is None  # the shards have none
        assert sorted(f.offset_keys()) == sorted(tensors)
        with pytest.raises(KeyError, match="nope"):
            f.get_tensor("nope")


def test_open_sharded_opens_only_the_shards_it_reads(http_server: HTTPTestServer,
                                                     http_reset: None, tmp_path: Path,
                                                     request: pytest.FixtureRequest) -> None:
    backend = make_store("http", request, tmp_path / "store")
    tensors = write_sharded(backend, tmp_path)
    index = backend.uri("ckpt/model.safetensors.index.json")
    prefix = index.split("/")[-3]  # the test's unique folder on the server
    with ts_st.open(index, **backend.options) as f:
        assert f.keys() == sorted(tensors)
        assert not any("model-0000" in r.path for r in http_server.requests), \
            "keys() must come from the index alone"
        assert same_bytes(f.get_tensor("layers.5.w"), tensors["layers.5.w"])  # in shard 3
        touched = {r.path.rsplit("/", 1)[-1] for r in http_server.requests
                   if "model-0000" in r.path}
        assert touched == {SHARD3}, touched
    assert http_server.requests_for(f"{prefix}/ckpt/{SHARD3}", "GET")


def test_open_sharded_folder(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    backend = make_store("local", request, tmp_path / "store")
    tensors = write_sharded(backend, tmp_path)
    with ts_st.open(backend.uri("ckpt/")) as f:
        assert f.keys() == sorted(tensors)
        assert all(same_bytes(f.get_tensor(n), t) for n, t in tensors.items())


def test_open_folder_of_files_without_index(tmp_path: Path) -> None:
    st_torch.save_file({"a": torch.ones(3)}, str(tmp_path / "one.safetensors"),
                       metadata={"format": "pt"})
    st_torch.save_file({"b": torch.zeros(2, 2)}, str(tmp_path / "two.safetensors"))
    with ts_st.open(tmp_path) as f:
        assert f.keys() == ["a", "b"]
        assert f.metadata() == {"format": "pt"}  # the first file's
        assert f.get_tensor("b").equal(torch.zeros(2, 2))
        assert f.shard_of("a").endswith("one.safetensors")
    st_torch.save_file({"a": torch.ones(1)}, str(tmp_path / "three.safetensors"))
    with pytest.raises(MalformedFileError, match="'a' is in more than one file"):
        ts_st.open(tmp_path)


@pytest.mark.parametrize("num_readers", [1, 3])
def test_a_tensor_in_two_files_of_a_folder_names_both(tmp_path: Path, num_readers: int) -> None:
    """A folder without an index whose files both hold ``a``: ``load`` and
    ``iter_tensors`` said "tensor 'a' is in more than one file" and named no file
    (``open`` named only the folder); each names both files now."""
    st_torch.save_file({"a": torch.ones(3), "b": torch.ones(1)}, str(tmp_path / "one.safetensors"))
    st_torch.save_file({"a": torch.ones(1)}, str(tmp_path / "two.safetensors"))
    calls = [lambda: ts_st.load(tmp_path, num_readers=num_readers),
             lambda: list(ts_st.iter_tensors(tmp_path)), lambda: ts_st.open(tmp_path)]
    for call in calls:
        with pytest.raises(MalformedFileError, match="'a' is in more than one file") as info:
            call()
        assert re.search(r"one\.safetensors and .*two\.safetensors|two\.safetensors and "
                         r".*one\.safetensors", str(info.value)), str(info.value)


def test_open_sharded_shard_lacking_a_tensor(tmp_path: Path) -> None:
    st_torch.save_file({"a": torch.ones(2)}, str(tmp_path / "s1.safetensors"))
    index = {"weight_map": {"a": "s1.safetensors", "b": "s1.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with ts_st.open(tmp_path / "model.safetensors.index.json") as f:
        assert f.keys() == ["a", "b"]
        assert f.get_tensor("a").equal(torch.ones(2))
        with pytest.raises(MalformedFileError, match=r"s1\.safetensors lacks tensor 'b'"):
            f.get_tensor("b")


def test_open_closed_refuses_new_shards(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    backend = make_store("local", request, tmp_path / "store")
    write_sharded(backend, tmp_path)
    f = ts_st.open(backend.uri("ckpt/model.safetensors.index.json"))
    f.close()
    with pytest.raises(ValueError, match="closed"):
        f.get_tensor("embed")


# -- an HTTP(S) index with a query string ---------------------------------------------

SIG = "sig-7d1e-canary-never-print"


@pytest.fixture(scope="module")
def signed_server() -> Iterator[HTTPTestServer]:
    """Every request must carry ``?sig=SIG`` (403 otherwise), like a shared signed URL."""
    with HTTPTestServer(query={"sig": SIG}) as server:
        yield server


def _put_signed(server: HTTPTestServer, tmp_path: Path) -> tuple[str, dict[str, Any]]:
    g = torch.Generator().manual_seed(11)
    tensors = {"a": torch.randn(40, 8, generator=g), "b": torch.arange(10, dtype=torch.int32)}
    for i, name in enumerate(tensors):
        path = tmp_path / f"s{i}.safetensors"
        st_torch.save_file({name: tensors[name]}, str(path))
        server.put(f"q/s {i}.safetensors", path.read_bytes())  # a space: quoted in the URI
    index = {"weight_map": {"a": "s 0.safetensors", "b": "s 1.safetensors"}}
    server.put("q/model.safetensors.index.json", json.dumps(index).encode())
    return server.url("q/model.safetensors.index.json") + f"?sig={SIG}", tensors


def test_http_index_keeps_its_query_string(signed_server: HTTPTestServer,
                                           tmp_path: Path) -> None:
    uri, tensors = _put_signed(signed_server, tmp_path)
    signed_server.clear_log()
    got = ts_st.load(uri)
    assert sorted(got) == ["a", "b"] and all(same_bytes(got[n], tensors[n]) for n in tensors)
    shard_requests = [r for r in signed_server.requests if "s%200" in r.path]
    assert shard_requests and all(r.path.endswith(f"?sig={SIG}") for r in shard_requests)
    assert all(r.status in (200, 206) for r in signed_server.requests)
    assert dict(ts_st.iter_tensors(uri)).keys() == {"a", "b"}
    with ts_st.open(uri) as f:
        assert same_bytes(f.get_tensor("b"), tensors["b"])
        assert SIG not in f.shard_of("b") and "***" in f.shard_of("b")


def test_http_shard_without_the_query_is_refused(signed_server: HTTPTestServer,
                                                 tmp_path: Path) -> None:
    # The server does require the query: a shard URI that lost it fails (as it did before).
    _put_signed(signed_server, tmp_path)
    with pytest.raises(PermissionDeniedError):
        ts_st.load(signed_server.url("q/s%200.safetensors"), retries=1)
    assert ts_st.load(signed_server.url("q/s%200.safetensors") + f"?sig={SIG}").keys() == {"a"}


@pytest.mark.parametrize("entry", [ts_st.open, ts_st.load], ids=["open", "load"])
def test_an_index_naming_too_many_shards_is_refused_before_any_is_opened(
        entry: Any, http_server: HTTPTestServer, http_reset: None, tmp_path: Path,
        request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    # Was: every shard opened (a request each) before failing on one that is missing.
    monkeypatch.setattr("tensorstream.safetensors.sources.MAX_SHARDS", 20)
    backend = make_store("http", request, tmp_path / "store")
    shards = {f"t{i}": f"s{i // 2}.safetensors" for i in range(42)}  # 21 distinct shards
    backend.put("ckpt/model.safetensors.index.json", json.dumps({"weight_map": shards}).encode())
    with pytest.raises(MalformedFileError,
                       match=r"model\.safetensors\.index\.json: .*21 distinct shard.*the 20"):
        entry(backend.uri("ckpt/model.safetensors.index.json"), **backend.options)
    assert not any(".safetensors" in r.path and "index" not in r.path
                   for r in http_server.requests)


def test_redis_checkpoint_shards_keep_the_password_and_their_exact_keys(
        redis_auth_server: Any, isolated_env: None) -> None:
    """The shards of a checkpoint on Redis (index or folder) are opened with the index
    URI's user and password, at exactly the keys named: they were opened with no
    password (``PermissionDeniedError``), and a key with ``%``, ``#`` or ``?`` (given
    escaped) was put back unescaped: ``c%252Fk/`` read ``c/k/...`` (another key, a
    decoy here), ``c%23k/`` was refused; so was a shard named ``s%41`` read as ``sA``."""
    import secrets
    import urllib.parse

    from fixtures_redis import ACL_PASSWORD, ACL_USER, REDIS_PASSWORD

    srv = redis_auth_server
    real, decoy = st_torch.save({"a": torch.ones(3)}), st_torch.save({"a": torch.zeros(3)})
    for folder in ["plain", "c%2Fk", "c#k", "c?k", "c k%"]:
        folder += secrets.token_hex(3)
        srv.put(f"{folder}/s%41.safetensors", real)
        srv.put(f"{folder}/sA.safetensors", decoy)  # what s%41 unescaped names
        if urllib.parse.unquote(folder) != folder:  # the key c%2Fk unescaped names
            srv.put(urllib.parse.unquote(folder) + "/s%41.safetensors", decoy)
        index = json.dumps({"weight_map": {"a": "s%41.safetensors"}}).encode()
        srv.put(f"{folder}/model.safetensors.index.json", index)
        escaped = urllib.parse.quote(folder, safe="")
        for key in (f"{escaped}/model.safetensors.index.json", f"{escaped}/"):
            for auth in ({"password": REDIS_PASSWORD}, {"user": ACL_USER, "password": ACL_PASSWORD}):
                uri = srv.url(key, **auth)
                assert ts_st.load(uri)["a"].equal(torch.ones(3)), (folder, key)
                assert dict(ts_st.iter_tensors(uri))["a"].equal(torch.ones(3))
                with ts_st.open(uri) as f:
                    assert f.get_tensor("a").equal(torch.ones(3))
                    assert all(auth["password"] not in s for s in f.shards)
