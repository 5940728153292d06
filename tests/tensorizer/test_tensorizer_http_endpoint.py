"""A plain-text S3 endpoint (MinIO, moto on http://) works on every tensorizer path.

tensorizer's own stream layer refuses one ("Non-HTTPS endpoint URLs are not allowed",
``stream_io._enforce_scheme``) unless ``force_http``; tensorstream never hands an endpoint
to tensorizer (it reads and writes through its own S3 provider), so an ``http://``
endpoint, however it is given, must reach the server, and a scheme-less one (https://,
as tensorizer means it) to a plain-text server must say to write http://. (tensorizer's
``force_http`` in a config's ``stream_kwargs`` is refused saying to write http://:
test_tensorizer_config.py.)"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import pytest
import torch

import tensorstream
from tensorstream import errors
from tensorstream.tensorizer import TensorizerConfig

from fixtures_s3 import S3_BUCKET  # isort: skip

_MODEL = {"w": torch.arange(12.0).reshape(3, 4), "b": torch.arange(5, dtype=torch.int16)}


def _same(got: Any) -> None:
    assert sorted(got.keys()) == sorted(_MODEL)
    for name, t in _MODEL.items():
        assert torch.equal(got[name].to("cpu"), t), name


@pytest.mark.parametrize("given", ["config", "vllm-env", "options"])
def test_an_http_endpoint_serves_save_load_and_key_file(
        isolated_env: Path, monkeypatch: pytest.MonkeyPatch, moto_s3: Any, given: str) -> None:
    endpoint = moto_s3.endpoint_url
    assert endpoint.startswith("http://")
    prefix = f"http-endpoint-{given}-{secrets.token_hex(4)}"
    uri, keyfile = f"s3://{S3_BUCKET}/{prefix}/m.tensors", f"s3://{S3_BUCKET}/{prefix}/m.key"
    moto_s3.client.put_object(Bucket=S3_BUCKET, Key=f"{prefix}/m.key",
                              Body=secrets.token_bytes(32))
    keys = {"s3_access_key_id": moto_s3.access_key_id,
            "s3_secret_access_key": moto_s3.secret_access_key}
    if given == "options":  # tensorstream's own calls
        opts = {**keys, "s3_endpoint": endpoint, "s3_region": moto_s3.region}
        enc = tensorstream.tensorizer.Encryption(keyfile=keyfile)
        tensorstream.serialize(_MODEL, uri, encryption=enc, **opts)
        with tensorstream.deserialize(uri, "cpu", encryption=enc, **opts) as d:
            _same(d)
        return
    if given == "vllm-env":  # vLLM's and tensorizer's variables, nothing in the config
        monkeypatch.setenv("S3_ENDPOINT_URL", endpoint)
        monkeypatch.setenv("S3_ACCESS_KEY_ID", moto_s3.access_key_id)
        monkeypatch.setenv("S3_SECRET_ACCESS_KEY", moto_s3.secret_access_key)
        cfg = TensorizerConfig(tensorizer_uri=uri, encryption_keyfile=keyfile)
    else:  # vLLM's TensorizerConfig fields
        cfg = TensorizerConfig(tensorizer_uri=uri, encryption_keyfile=keyfile,
                               s3_endpoint=endpoint, **keys)
    monkeypatch.setenv("AWS_REGION", moto_s3.region)
    cfg.serialize(_MODEL)
    with cfg.deserialize("cpu") as d:
        _same(d)
    module = torch.nn.Module()
    module.w = torch.nn.Parameter(torch.zeros(3, 4))
    module.register_buffer("b", torch.zeros(5, dtype=torch.int16))
    cfg.load_into_module(module, "cpu")
    _same(module.state_dict())


def test_an_endpoint_without_a_scheme_to_a_plain_text_server_says_write_http(
        isolated_env: Path, moto_s3: Any) -> None:
    # tensorizer's and vLLM's s3_endpoint without a scheme means https://
    bare = moto_s3.endpoint_url.removeprefix("http://")
    cfg = TensorizerConfig(tensorizer_uri=f"s3://{S3_BUCKET}/none.tensors", s3_endpoint=bare,
                           s3_access_key_id=moto_s3.access_key_id,
                           s3_secret_access_key=moto_s3.secret_access_key,
                           stream_kwargs={"s3_region": moto_s3.region, "retries": 1})
    with pytest.raises(errors.TensorstreamError,
                       match=r"plain text, not TLS.*use http:// instead of https://"):
        cfg.deserialize("cpu")

