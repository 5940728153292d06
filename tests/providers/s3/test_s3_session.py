"""What the S3 provider shares between clients in one process (botocore's data
loader) and what it never shares (credentials), against moto checking SigV4."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

import tensorstream
from fixtures_s3 import S3_BUCKET
from tensorstream import errors
from tensorstream.providers.s3.session import shared_data_loader
from tensorstream.testing.s3_server import MotoS3Server


def _session() -> object:
    from aiobotocore.session import AioSession

    return AioSession()


async def test_clients_share_the_loader_but_never_credentials(
        moto_s3: MotoS3Server, isolated_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = f"session/{uuid.uuid4().hex[:10]}"
    moto_s3.put(S3_BUCKET, key, b"hello")
    uri = f"s3://{S3_BUCKET}/{key}"
    # Keys from options, and keys found by botocore's chain (a profile per provider).
    (isolated_env / "creds").write_text(
        f"[good]\naws_access_key_id = {moto_s3.access_key_id}\n"
        f"aws_secret_access_key = {moto_s3.secret_access_key}\n"
        f"[bad]\naws_access_key_id = {moto_s3.access_key_id}\n"
        "aws_secret_access_key = not-the-secret\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(isolated_env / "creds"))
    endpoint = {"s3_endpoint": moto_s3.endpoint_url, "s3_region": moto_s3.region}
    good = [moto_s3.options(), {**endpoint, "s3_profile": "good"}]
    bad = [moto_s3.options(s3_secret_access_key="not-the-secret"),
           {**endpoint, "s3_profile": "bad"}]
    # Interleaved, in one process and one loop: each client signs with its own keys.
    for opts in [good[0], bad[0], good[1], bad[1], good[0], good[1]]:
        if opts in good:
            assert await tensorstream.read_range(uri, 0, 5, **opts) == b"hello"
        else:
            with pytest.raises(errors.PermissionDeniedError):
                await tensorstream.read_range(uri, 0, 5, **opts)
    assert shared_data_loader(_session()) is shared_data_loader(_session())


def test_loader_is_not_inherited_across_fork() -> None:
    parent = shared_data_loader(_session())
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            fresh = shared_data_loader(_session())
            again = shared_data_loader(_session())
            os.write(write, b"ok" if fresh is not parent and again is fresh else b"shared")
        finally:
            os._exit(0)
    os.close(write)
    try:
        answer = os.read(read, 16)
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    assert answer == b"ok"
    assert shared_data_loader(_session()) is parent  # the parent keeps its own


def test_loader_follows_aws_data_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    default = shared_data_loader(_session())
    monkeypatch.setenv("AWS_DATA_PATH", str(tmp_path))
    custom = shared_data_loader(_session())
    assert custom is not default and str(tmp_path) in custom.search_paths
