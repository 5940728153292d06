"""TensorizerConfig (vLLM-compatible) and rank templates."""

from __future__ import annotations

import argparse
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch

import tensorstream
from tensorstream import errors
from tensorstream.tensorizer import Encryption, TensorizerConfig, generate_keyfile, serialize
from tensorstream.tensorizer.sharding import is_sharded, shard_uri


def test_dir_and_uri_derivation() -> None:
    cfg = TensorizerConfig(tensorizer_dir="s3://bucket/opt-125m/")
    assert cfg.tensorizer_uri == "s3://bucket/opt-125m/model.tensors"
    with pytest.warns(UserWarning, match="'ignored' is not the directory of tensorizer_uri"):
        cfg = TensorizerConfig(tensorizer_uri="s3://bucket/x/model-rank-%03d.tensors",
                               tensorizer_dir="ignored")
    assert cfg.tensorizer_dir == "s3://bucket/x" and cfg.is_sharded
    redis = TensorizerConfig(tensorizer_uri="redis://:pw@localhost:6379/model.tensors?db=2")
    assert "pw" not in repr(redis)
    with pytest.raises(errors.ConfigurationError, match="tensorizer_dir"):
        TensorizerConfig()


def test_vllm_s_lora_dir_names_the_adapter_file(tmp_path: Path) -> None:
    # a vLLM config's keys (model_loader_extra_config) were a TypeError:
    # "unexpected keyword argument 'lora_dir'"
    cfg = TensorizerConfig(lora_dir=str(tmp_path / "lora"))
    assert cfg.tensorizer_uri == str(tmp_path / "lora" / "adapter_model.tensors")
    (tmp_path / "lora").mkdir()
    cfg.serialize({"lora_A": torch.ones(2, 3)})
    with cfg.deserialize("cpu") as sd:
        assert torch.equal(sd["lora_A"], torch.ones(2, 3))
    assert pickle.loads(pickle.dumps(cfg)).tensorizer_uri == cfg.tensorizer_uri
    with_uri = TensorizerConfig(tensorizer_uri="s3://b/m.tensors", lora_dir="s3://b/lora")
    assert (with_uri.tensorizer_uri, with_uri.lora_dir) == ("s3://b/m.tensors", "s3://b/lora")
    with pytest.raises(errors.ConfigurationError, match="tensorizer_dir and lora_dir"):
        TensorizerConfig(tensorizer_dir="s3://b/d", lora_dir="s3://b/lora")
    secret = TensorizerConfig(lora_dir="https://u:canary-pw@h/lora")
    assert "canary-pw" not in repr(secret)
    with pytest.raises(TypeError, match="secrets"):
        pickle.dumps(secret)


def test_a_device_in_the_deserialization_kwargs_is_the_default_device(tmp_path: Path) -> None:
    # vLLM hands deserialization_kwargs to TensorDeserializer, so they may hold its device;
    # here that was "deserialize() got multiple values for argument 'device'"
    uri = str(tmp_path / "m.tensors")
    serialize({"w": torch.ones(3)}, uri)
    cfg = TensorizerConfig(tensorizer_uri=uri, deserialization_kwargs={"device": "cpu"})
    with cfg.deserialize() as sd:
        assert sd["w"].device.type == "cpu"
    with pytest.raises(errors.ConfigurationError, match="not a torch device"):
        cfg.deserialize("no-such-device")  # the call's device wins
    module = torch.nn.Module()
    module.register_buffer("w", torch.zeros(3))
    cfg.load_into_module(module)
    assert torch.equal(module.w, torch.ones(3))


def test_cli_flags_match_vllm() -> None:
    parser = TensorizerConfig.add_cli_args(argparse.ArgumentParser())
    args = parser.parse_args([
        "--tensorizer-uri", "s3://b/m.tensors", "--num-readers", "4", "--verify-hash",
        "--encryption-keyfile", "s3://b/m.key", "--s3-access-key-id", "AKIDEXAMPLE",
        "--s3-secret-access-key", "sekrit-canary", "--s3-endpoint", "http://127.0.0.1:9",
    ])
    cfg = TensorizerConfig.from_cli_args(args)
    assert (cfg.tensorizer_uri, cfg.num_readers, cfg.verify_hash) == ("s3://b/m.tensors", 4, True)
    assert cfg.encryption_keyfile == "s3://b/m.key"
    assert cfg.stream_options() == {
        "s3_access_key_id": "AKIDEXAMPLE",
        "s3_secret_access_key": "sekrit-canary",
        "s3_endpoint": "http://127.0.0.1:9",
    }
    assert "sekrit-canary" not in repr(cfg) and "sekrit-canary" not in str(cfg)
    with pytest.raises(TypeError, match="secrets"):
        pickle.dumps(cfg)
    # vLLM's --vllm-tensorized (older command lines) was "unrecognized arguments"
    flagged = parser.parse_args(["--tensorizer-uri", "/m", "--vllm-tensorized"])
    assert TensorizerConfig.from_cli_args(flagged).vllm_tensorized is True
    defaults = TensorizerConfig.from_cli_args(parser.parse_args(["--tensorizer-uri", "/m"]))
    assert defaults.verify_hash is None and defaults.num_readers is None


def test_env_fallbacks_reach_stream_options(isolated_env: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("S3_ACCESS_KEY_ID", "env-id")
    monkeypatch.setenv("S3_SECRET_ACCESS_KEY", "env-secret")
    monkeypatch.setenv("S3_ENDPOINT_URL", "http://127.0.0.1:1")
    cfg = TensorizerConfig(tensorizer_uri="s3://b/m.tensors", s3_access_key_id="arg-id",
                           stream_kwargs={"timeout_idle": 5})
    assert cfg.stream_options() == {
        "timeout_idle": 5,
        "s3_access_key_id": "arg-id",  # explicit beats the environment
        "s3_secret_access_key": "env-secret",  # the pair's other half (vLLM's fallback)
    }  # S3_ENDPOINT_URL: read by the S3 provider, at its level below the options
    described = str(tensorstream.describe_credentials("s3://b/m.tensors", **cfg.stream_options()))
    assert "http://127.0.0.1:1" in described and "env-secret" not in described
    assert "env-secret" not in repr(cfg)
    # No secret held by the config itself: it pickles (and re-reads env in the child).
    assert pickle.loads(pickle.dumps(cfg)).stream_options() == cfg.stream_options()


def test_the_s3_variables_stay_below_the_options(isolated_env: Path,
                                                monkeypatch: pytest.MonkeyPatch,
                                                moto_s3_public: Any) -> None:
    """Copied into the options, S3_ACCESS_KEY_ID/S3_SECRET_ACCESS_KEY outranked what the
    options said: stream_kwargs anonymous=True was "contradicting" keys nobody gave as
    options, and a local model's options were never empty (no local fast path)."""
    from fixtures_s3 import S3_BUCKET
    from tensorstream.tensorizer.local import LocalTensorDeserializer

    monkeypatch.setenv("S3_ACCESS_KEY_ID", "env-id")
    monkeypatch.setenv("S3_SECRET_ACCESS_KEY", "env-secret")
    moto_s3_public.client.put_object(Bucket=S3_BUCKET, Key="public.tensors", Body=b"|TZR|...",
                                     ACL="public-read")
    public = TensorizerConfig(tensorizer_uri=f"s3://{S3_BUCKET}/public.tensors",
                              s3_endpoint=moto_s3_public.endpoint_url,
                              stream_kwargs={"anonymous": True})
    assert public.stream_options() == {"anonymous": True,
                                       "s3_endpoint": moto_s3_public.endpoint_url}
    with public.open_stream() as f:
        assert f.read(5) == b"|TZR|"
    profile = TensorizerConfig(tensorizer_uri="s3://b/m", stream_kwargs={"s3_profile": "p"})
    assert profile.stream_options() == {"s3_profile": "p"}  # the profile is not outranked
    local = isolated_env / "m.tensors"
    serialize({"w": torch.arange(3.0)}, local)
    with TensorizerConfig(tensorizer_uri=str(local)).deserialize("cpu") as sd:
        assert isinstance(sd, LocalTensorDeserializer)
        assert torch.equal(sd["w"], torch.arange(3.0))


def test_config_load_and_serialize_local(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 4))
    generate_keyfile(str(tmp_path / "m.key"))
    cfg = TensorizerConfig(tensorizer_dir=str(tmp_path), encryption_keyfile=str(tmp_path / "m.key"),
                           num_readers=2, verify_hash=True,
                           deserialization_kwargs={"lazy_load": True})
    assert cfg.serialize(model) == str(tmp_path / "model.tensors")
    with cfg.deserialize("cpu") as sd:
        # a local CPU load: num_readers is the threads that fill it (tensorizer/local.py)
        assert sd._lazy_load and sd._ts_requested == 2
        for k, v in model.state_dict().items():
            assert torch.equal(sd[k], v)
    with torch.device("meta"):
        empty = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 4))
    cfg.load_into_module(empty, "cpu")
    x = torch.randn(3, 16)
    assert torch.equal(empty(x), model(x))
    with cfg.open_stream() as f:
        assert f.read(5) == b"|TZR|"


def test_sharded_config(tmp_path: Path) -> None:
    cfg = TensorizerConfig(tensorizer_uri=str(tmp_path / "model-rank-%03d.tensors"))
    cfg.verify_with_parallel_config(4)
    for rank in range(2):
        cfg.serialize({"w": torch.full((3,), float(rank))}, rank=rank, world_size=2)
    with cfg.deserialize("cpu", rank=1, world_size=2) as sd:
        assert torch.equal(sd["w"], torch.full((3,), 1.0))
    with pytest.raises(errors.ConfigurationError, match="rank template"):
        TensorizerConfig(tensorizer_uri="/m.tensors").verify_with_parallel_config(2)


def test_rank_templates() -> None:
    assert is_sharded("s3://b/model-rank-%03d.tensors") and not is_sharded("s3://b/m.tensors")
    assert shard_uri("s3://b/model-rank-%03d.tensors", rank=7, world_size=8) == \
        "s3://b/model-rank-007.tensors"
    assert shard_uri("/m-%05d.tensors", rank=0) == "/m-00000.tensors"
    assert shard_uri("/m.tensors") == "/m.tensors"
    assert shard_uri("/m.tensors", rank=0, world_size=1) == "/m.tensors"
    with pytest.raises(errors.ConfigurationError, match="model-rank-%03d"):
        shard_uri("/m.tensors", rank=0, world_size=2)
    # A rank counted from 1 is the usual cause: the error says the ranks there are.
    with pytest.raises(errors.ConfigurationError, match="ranks run from 0 to 1"):
        shard_uri("/m-%03d.tensors", rank=2, world_size=2)
    with pytest.raises(errors.ConfigurationError, match="world_size must be 1 or more"):
        shard_uri("/m-%03d.tensors", rank=0, world_size=0)


@pytest.mark.parametrize("template", ["%01000000d", "%09999999999999999999d", "%0" + "9" * 5000 + "d"])
def test_a_rank_template_wider_than_any_rank_is_refused(tmp_path: Path, template: str) -> None:
    # "%099999999d" made a file name of 100 million digits; wider, a bare ValueError
    uri = str(tmp_path / f"m-{template}.tensors")
    with pytest.raises(errors.ConfigurationError, match="wider than 32 digits"):
        tensorstream.deserialize(uri, device="cpu", rank=0, world_size=2)
    with pytest.raises(errors.ConfigurationError, match="wider than 32 digits"):
        serialize({"w": torch.ones(2)}, uri, rank=0, world_size=2)
    assert list(tmp_path.iterdir()) == []
    assert shard_uri("/m-%032d.t", rank=3, world_size=4) == "/m-" + "0" * 31 + "3.t"


@pytest.mark.parametrize("rank", [1.5, "1", True])
def test_a_rank_that_is_not_an_integer_is_refused(tmp_path: Path, rank: object) -> None:
    # 1.5 was truncated into rank 1's file name; "1" was a bare TypeError
    with pytest.raises(errors.ConfigurationError, match="rank must be an integer"):
        shard_uri("/m-%03d.tensors", rank=rank, world_size=2)  # type: ignore[arg-type]
    with pytest.raises(errors.ConfigurationError, match="world_size must be an integer"):
        shard_uri("/m-%03d.tensors", rank=0, world_size=2.0)  # type: ignore[arg-type]


def test_encryption_from_config_uses_stream_options(tmp_path: Path) -> None:
    cfg = TensorizerConfig(tensorizer_uri=str(tmp_path / "m.tensors"),
                           encryption_keyfile=str(tmp_path / "fresh.key"))
    enc = cfg.deserializer_options()["encryption"]
    assert isinstance(enc, Encryption) and enc.keyfile == str(tmp_path / "fresh.key")
    serialize({"w": torch.ones(2)}, tmp_path / "m.tensors", **cfg.serializer_options())
    assert (tmp_path / "fresh.key").stat().st_size == 32
    with cfg.deserialize("cpu") as sd:
        assert torch.equal(sd["w"], torch.ones(2))


@pytest.mark.parametrize("kwargs", [
    {"tensorizer_uri": "https://h/m.tensors?X-Amz-Signature=canary-sig"},
    {"tensorizer_uri": "https://u:canary-pw@h/m.tensors"},
    {"tensorizer_dir": "redis://:canary-pw@h/k"},
    {"tensorizer_dir": "s3://b/d", "s3_endpoint": "http://u:canary-pw@h"},
    {"tensorizer_dir": "s3://b/d", "deserialization_kwargs": {"encryption": b"canary-key" * 4}},
    {"tensorizer_dir": "s3://b/d", "serialization_kwargs": {"encryption": b"canary-key" * 4}},
    {"tensorizer_dir": "s3://b/d",
     "deserialization_kwargs": {"s3_secret_access_key": "canary-pass"}},
    {"tensorizer_dir": "https://h/d", "stream_kwargs": {"headers": {"X-Api-Key": "canary-k"}}},
    {"tensorizer_dir": "https://h/d",
     "stream_kwargs": {"headers": {"Authorization": "Bearer canary-t"}}},
    {"tensorizer_dir": "ftp:///d", "stream_kwargs": {"storage_options": {"password": "canary"}}},
])
def test_a_config_holding_a_secret_anywhere_is_masked_and_refuses_to_pickle(
        kwargs: dict[str, Any]) -> None:
    """Raw key bytes in ``*_kwargs`` were shown by repr(); they, a URI's password and a
    presigned signature were pickled (the docs: a config holding a secret refuses).
    So were HTTP header values (credentials: an API key, an Authorization) and a
    secret nested in fsspec's ``storage_options``."""
    cfg = TensorizerConfig(**kwargs)
    assert "canary" not in repr(cfg) and "canary" not in str(cfg)
    with pytest.raises(TypeError, match="secrets"):
        pickle.dumps(cfg)


def test_a_config_whose_encryption_names_a_key_file_still_pickles() -> None:
    from tensorstream.tensorizer.crypto import Encryption

    cfg = TensorizerConfig(tensorizer_dir="s3://b/d",
                           deserialization_kwargs={"encryption": Encryption(keyfile="s3://b/k")})
    assert "s3://b/k" in repr(cfg)
    back = pickle.loads(pickle.dumps(cfg))
    assert back.deserializer_options()["encryption"].keyfile == "s3://b/k"


@pytest.mark.parametrize("uri", ["/m-%03d-%03d.tensors", "/r%03d/m-%03d.tensors"])
def test_a_name_with_two_rank_templates_is_refused(tmp_path: Path, uri: str) -> None:
    # Only the first was filled in: rank 2 read "/r002/m-%03d.tensors", a file no rank wrote
    for rank, world_size in ((2, 4), (0, 1), (None, None)):
        with pytest.raises(errors.ConfigurationError, match="holds 2 rank templates"):
            shard_uri(uri, rank=rank, world_size=world_size)
    with pytest.raises(errors.ConfigurationError, match="holds 2 rank templates"):
        serialize({"w": torch.ones(2)}, str(tmp_path) + uri, rank=0, world_size=2)
    assert list(tmp_path.iterdir()) == []


def test_an_escaped_percent_is_printf_s_not_a_template() -> None:
    # "%%03d" is the text "%03d" (printf, and vLLM's uri % rank): it was read as '%' plus a
    # template, and rank 2 of 4 read "m-%002.t"
    assert not is_sharded("/m-%%03d.t")
    with pytest.raises(errors.ConfigurationError, match="no rank template"):
        shard_uri("/m-%%03d.t", rank=2, world_size=4)
    assert shard_uri("/m-%%03d.t") == "/m-%%03d.t"  # no template: the name as given
    assert shard_uri("/100%%-m-%03d.t", rank=2, world_size=4) == "/100%-m-002.t"
    assert shard_uri("/m-%%%03d.t", rank=2, world_size=4) == "/m-%002.t"


@pytest.mark.parametrize("placeholder", ["%d", "%s", "%3d", "%i", "%05i", "{rank}", "{}",
                                         "{rank:03d}", "{:03d}"])
def test_a_placeholder_that_is_not_filled_is_named(placeholder: str) -> None:
    # "{rank}" (str.format's) and "%i" were "has no rank template" with no word on why
    with pytest.raises(errors.ConfigurationError,
                       match=f"'{placeholder}' is not one: only a zero-padded %0Nd"):
        shard_uri(f"/m-{placeholder}.t", rank=1, world_size=2)


@pytest.mark.parametrize("world_size", ["2", 0, -1, 2.0, True, None])
def test_a_tensor_parallel_size_that_is_no_size_is_refused(world_size: Any) -> None:
    # "2" was a bare TypeError from '>'; 0 and -1 passed as if they were 1
    cfg = TensorizerConfig(tensorizer_uri="/m-%03d.tensors")
    with pytest.raises(errors.ConfigurationError, match="tensor parallel size must be an integer"):
        cfg.verify_with_parallel_config(world_size)


@pytest.mark.parametrize(("field", "value", "match"), [
    ("tensorizer_uri", 123, "tensorizer_uri must be a URI or a path"),
    ("tensorizer_dir", 5, "tensorizer_dir must be a URI or a path"),
    ("encryption_keyfile", 3, "encryption_keyfile must be a URI or a path"),
    ("s3_secret_access_key", 123, "s3_secret_access_key must be a string"),
    ("s3_endpoint", b"http://x", "s3_endpoint must be a string"),
    ("stream_kwargs", [("timeout_idle", 1)], "stream_kwargs must be a mapping"),
])
def test_a_field_of_the_wrong_type_is_refused_when_the_config_is_made(
        field: str, value: Any, match: str) -> None:
    # an int URI was a bare TypeError, an int dir an AttributeError; the others failed
    # only when the stream opened
    kwargs = {"tensorizer_uri": "s3://b/m.tensors", field: value}
    if field == "tensorizer_dir":
        kwargs.pop("tensorizer_uri")
    with pytest.raises(errors.ConfigurationError, match=match):
        TensorizerConfig(**kwargs)


@pytest.mark.parametrize("keyfile", ["", "  "])
def test_an_empty_keyfile_is_refused_never_taken_for_no_encryption(tmp_path: Path,
                                                                   keyfile: str) -> None:
    # encryption_keyfile="" (--encryption-keyfile "$KEYFILE", the variable unset) meant no
    # encryption: serialize wrote the tensors in the clear without a word
    with pytest.raises(errors.ConfigurationError, match="encryption_keyfile is empty"):
        TensorizerConfig(tensorizer_uri=str(tmp_path / "m.tensors"), encryption_keyfile=keyfile)
    parser = TensorizerConfig.add_cli_args(argparse.ArgumentParser())
    args = parser.parse_args(["--tensorizer-uri", str(tmp_path / "m.tensors"),
                              "--encryption-keyfile", keyfile])
    with pytest.raises(errors.ConfigurationError, match="encryption_keyfile is empty"):
        TensorizerConfig.from_cli_args(args)
    assert list(tmp_path.iterdir()) == []


def test_a_path_object_is_taken_for_every_location_field(tmp_path: Path) -> None:
    cfg = TensorizerConfig(tensorizer_dir=tmp_path, encryption_keyfile=tmp_path / "k")
    assert cfg.tensorizer_uri == f"{tmp_path}/model.tensors"
    assert cfg.encryption_keyfile == str(tmp_path / "k")


def test_an_option_given_twice_with_different_values_is_refused(tmp_path: Path) -> None:
    # The field lost to stream_kwargs without a word; stream_kwargs against
    # deserialization_kwargs was "got multiple values for keyword argument"
    with pytest.raises(errors.ConfigurationError, match="s3_endpoint is given twice"):
        TensorizerConfig(tensorizer_uri="s3://b/m", s3_endpoint="http://a:1",
                         stream_kwargs={"s3_endpoint": "http://b:1"})
    with pytest.raises(errors.ConfigurationError,
                       match=r"timeout_idle is given twice.*deserialization_kwargs"):
        TensorizerConfig(tensorizer_uri="s3://b/m", stream_kwargs={"timeout_idle": 4},
                         deserialization_kwargs={"timeout_idle": 3})
    with pytest.raises(errors.ConfigurationError, match="s3_secret_access_key is given twice") \
            as info:
        TensorizerConfig(tensorizer_uri="s3://b/m", s3_secret_access_key="SECRET1",
                         stream_kwargs={"s3_secret_access_key": "SECRET2"})
    assert "SECRET" not in str(info.value)
    # the same value twice is no conflict; an option given to the call overrides
    uri = str(tmp_path / "m.tensors")
    serialize({"w": torch.arange(3.0)}, uri)
    cfg = TensorizerConfig(tensorizer_uri=uri, stream_kwargs={"timeout_idle": 4},
                           deserialization_kwargs={"timeout_idle": 4})
    assert torch.equal(cfg.deserialize("cpu", timeout_idle=5)["w"], torch.arange(3.0))


def test_a_dir_that_is_not_the_uri_s_directory_is_said() -> None:
    # the dir was replaced by the URI's without a word (vLLM warns and takes the URI's)
    with pytest.warns(UserWarning, match="is not the directory of tensorizer_uri"):
        cfg = TensorizerConfig(tensorizer_uri="s3://b/x/model.tensors", tensorizer_dir="s3://b/y")
    assert cfg.tensorizer_dir == "s3://b/x"
    # the same directory (as a rebuilt or unpickled config gives it) says nothing
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cfg = TensorizerConfig(tensorizer_uri="s3://b/x/m.tensors", tensorizer_dir="s3://b/x/")
        assert cfg.tensorizer_dir == "s3://b/x"
        assert pickle.loads(pickle.dumps(cfg)).tensorizer_uri == "s3://b/x/m.tensors"


@pytest.mark.parametrize("kwargs", ["serialization_kwargs", "deserialization_kwargs"])
def test_a_keyfile_and_an_encryption_in_the_kwargs_contradict(tmp_path: Path, kwargs: str) -> None:
    # serialization_kwargs={"encryption": None} replaced the keyfile's: tensors written in clear
    with pytest.raises(errors.ConfigurationError, match=f"encryption_keyfile and {kwargs}"):
        TensorizerConfig(tensorizer_uri=str(tmp_path / "m.tensors"),
                         encryption_keyfile=str(tmp_path / "k"), **{kwargs: {"encryption": None}})
    assert list(tmp_path.iterdir()) == []


def test_no_rank_under_a_launcher_or_with_a_world_size_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # torchrun before init_process_group: every process took rank 0 and read rank 0's
    # file (a tensor-parallel shard: same shapes on every rank, nothing noticed) or wrote
    # over it; world_size=4 without rank= alike
    template = str(tmp_path / "m-%03d.tensors")
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(errors.ConfigurationError, match=r"RANK=2, WORLD_SIZE=4.*pass rank="):
        shard_uri(template)
    with pytest.raises(errors.ConfigurationError, match="no rank"):
        tensorstream.deserialize(template, device="cpu")
    with pytest.raises(errors.ConfigurationError, match="no rank"):
        serialize({"w": torch.ones(2)}, template)
    assert list(tmp_path.iterdir()) == []
    assert shard_uri(template, rank=2) == str(tmp_path / "m-002.tensors")  # told: as before
    assert shard_uri("/m.tensors") == "/m.tensors"  # no template: a load of its own
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert shard_uri(template) == str(tmp_path / "m-000.tensors")
    monkeypatch.delenv("WORLD_SIZE")
    with pytest.raises(errors.ConfigurationError, match="no rank: world_size is 4"):
        shard_uri(template, world_size=4)
    assert shard_uri(template, world_size=1) == str(tmp_path / "m-000.tensors")


def test_a_misspelt_key_is_refused_when_the_config_is_made_naming_it() -> None:
    """A misspelt key of a vLLM config (``model_loader_extra_config``) was taken: in
    ``stream_kwargs``/``deserialization_kwargs`` it failed at the first load, in
    ``serialization_kwargs`` at the first save, and until then the config's repr showed
    its value (``serialization_kwargs={'encrypton': b'<the key>'}``). A misspelt field was
    Python's bare TypeError. Each is refused when the config is made, named (with the
    name meant), its value never shown."""
    key = b"K3y!" * 8
    cases: list[tuple[dict[str, Any], str]] = [
        ({"stream_kwargs": {"s3_secret_acess_key": "SECRETCANARY"}},
         "stream_kwargs: unknown option s3_secret_acess_key "
         r"\(did you mean s3_secret_access_key\?\)"),
        ({"deserialization_kwargs": {"verfy_hash": True}},
         r"deserialization_kwargs: unknown argument verfy_hash \(did you mean verify_hash\?\)"),
        ({"serialization_kwargs": {"encrypton": key}},
         r"serialization_kwargs: unknown argument encrypton \(did you mean encryption\?\)"),
        ({"deserialization_kwargs": {"encrypton": key}},
         r"deserialization_kwargs: unknown argument encrypton \(did you mean encryption\?\)"),
        ({"stream_kwargs": {"not_an_option": "SECRETCANARY"}},
         "stream_kwargs: unknown option not_an_option; it takes .*s3_endpoint"),
        ({"s3_secret_acess_key": "SECRETCANARY"},
         r"unknown field s3_secret_acess_key \(did you mean s3_secret_access_key\?\) "
         "for TensorizerConfig; it takes .*tensorizer_uri"),
    ]
    for extra, told in cases:
        with pytest.raises(errors.ConfigurationError, match=told) as info:
            TensorizerConfig(tensorizer_uri="s3://b/m.tensors", **extra)
        shown = str(info.value) + repr(info.value)
        assert "SECRETCANARY" not in shown and "K3y!" not in shown, shown
    with pytest.raises(TypeError, match="unknown field dtpye"):  # Python's kind, as before
        TensorizerConfig(tensorizer_uri="s3://b/m.tensors", dtpye="float16")  # type: ignore[call-arg]


@pytest.mark.parametrize(("field", "told"), [
    ("model_class", r"cfg\.load_into_module\(model, device\)"),
    ("hf_config", r"cfg\.load_into_module\(model, device\)"),
    ("dtype", r"deserialization_kwargs=\{'dtype': \.\.\.\}"),
])
def test_a_field_vllm_s_loader_fills_says_what_stands_for_it(field: str, told: str) -> None:
    # A config dict carried over from vLLM (its model_class, hf_config, dtype) was "unknown
    # field" with the list of fields: now what to do instead, still a TypeError.
    with pytest.raises(TypeError, match=f"{field} is a field of vLLM's TensorizerConfig.*{told}"):
        TensorizerConfig(tensorizer_uri="s3://b/m.tensors", **{field: torch.float16})


def test_every_key_a_load_or_save_takes_is_still_taken(tmp_path: Path) -> None:
    """The neighbours: each kwargs takes its call's arguments, the options of any
    service (one config serves an S3 key file beside a local model) and tensorizer's
    no-op arguments; a config made from a dict of every field still loads."""
    uri = str(tmp_path / "m.tensors")
    serialize({"w": torch.arange(4.0)}, uri)
    cfg = TensorizerConfig(**{
        "tensorizer_uri": uri, "num_readers": 1, "verify_hash": True,
        "stream_kwargs": {"timeout_idle": 9, "s3_region": "eu-west-1", "redis_db": 0,
                          "sequential": False},
        "deserialization_kwargs": {"lazy_load": True, "dtype": "float64", "device": "cpu",
                                   "plaid_mode": True, "strict": True, "filter_func": None},
        "serialization_kwargs": {"include_non_persistent_buffers": True,
                                 "limit_cpu_concurrency": 2, "part_size": "8MiB"},
    })
    with cfg.deserialize() as sd:
        assert torch.equal(sd["w"], torch.arange(4.0, dtype=torch.float64))
    assert cfg.serialize({"w": torch.ones(2)}) == uri
    # open_stream's sequential (an argument of tensorstream.open) is left to it; given
    # to deserialize itself it is named (both were a bare TypeError, "multiple values")
    with cfg.open_stream() as f:
        assert f.size == (tmp_path / "m.tensors").stat().st_size
    with pytest.raises(errors.ConfigurationError, match="sequential is an argument of "
                                                        r"tensorstream\.open"):
        tensorstream.deserialize(uri, "cpu", sequential=True)


def test_every_argument_of_tensorizer_s_own_calls_is_taken_or_named_as_tensorizer_s() -> None:
    """vLLM hands a config's ``stream_kwargs`` to tensorizer's ``stream_io.open_stream``,
    its ``deserialization_kwargs`` to ``TensorDeserializer`` and its
    ``serialization_kwargs`` to ``TensorSerializer``, so a config written for vLLM may hold
    any of their arguments. Each argument the installed tensorizer's calls take is taken,
    or refused as tensorizer's, saying what to use instead (``force_http``, ``buffer_size``
    and ``compress_tensors`` were "unknown", as a misspelling is, with no word on what to
    do); never its value. A tensorizer that adds an argument fails here, not its users."""
    import inspect

    from tensorizer import TensorDeserializer, TensorSerializer, stream_io

    from tensorstream.tensorizer.arguments import TENSORIZER_NOT_TAKEN

    calls = {"stream_kwargs": (stream_io.open_stream, {"path_uri"}),
             "deserialization_kwargs": (TensorDeserializer.__init__, {"self", "file_obj"}),
             "serialization_kwargs": (TensorSerializer.__init__, {"self", "file_obj"})}
    for field, (call, given) in calls.items():
        takes = {n for n, p in inspect.signature(call).parameters.items()
                 if n not in given and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
        listed = TENSORIZER_NOT_TAKEN.get(field, ("", {}))[1]
        assert set(listed) <= takes, f"{field}: no longer tensorizer's: {set(listed) - takes}"
        for name in sorted(takes):
            value = "SECRETCANARY" if name in listed else None
            try:
                TensorizerConfig(tensorizer_uri="s3://b/m.tensors", **{field: {name: value}})
            except errors.ConfigurationError as exc:
                said = str(exc) + repr(exc)
                assert name in listed, f"{field}: tensorizer's {name} refused as unknown: {exc}"
                assert f"{field}: {name} is an argument of tensorizer's" in said, said
                assert listed[name] in said and "SECRETCANARY" not in said, said
            else:
                assert name not in listed, f"{field}: {name} is taken, yet listed as not"
