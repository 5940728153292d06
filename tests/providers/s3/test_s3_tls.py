"""S3 over TLS (moto's server behind a test CA): an untrusted certificate is refused by
default, accepted with ca_bundle, and insecure=True accepts it with a warning."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

import tensorstream
from fixtures_s3 import S3_BUCKET
from tensorstream import errors
from tensorstream.testing.s3_server import MotoS3Server


@pytest.fixture
def tls(moto_s3_tls: MotoS3Server, isolated_env: Path) -> MotoS3Server:
    moto_s3_tls.put(S3_BUCKET, "tls.bin", b"over https")
    return moto_s3_tls


def _read_tls(server: MotoS3Server, **extra: Any) -> bytes:
    opts = server.options(**extra)
    if "ca_bundle" in extra and extra["ca_bundle"] is None:
        opts.pop("ca_bundle")
    with tensorstream.open(f"s3://{S3_BUCKET}/tls.bin", **opts) as f:
        return f.read()


def test_untrusted_certificate_is_refused_by_default(tls: MotoS3Server) -> None:
    with pytest.raises(ConnectionError, match="ca_bundle") as info:
        _read_tls(tls, ca_bundle=None, retries=3)
    assert not isinstance(info.value, errors.RetriesExhaustedError)  # not retried


def test_certificate_accepted_with_ca_bundle(tls: MotoS3Server) -> None:
    assert _read_tls(tls) == b"over https"


def test_insecure_accepts_and_warns(tls: MotoS3Server) -> None:
    with pytest.warns(errors.InsecureTLSWarning, match="insecure"):
        assert _read_tls(tls, ca_bundle=None, insecure=True) == b"over https"


def test_no_warning_without_insecure(tls: MotoS3Server) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _read_tls(tls) == b"over https"
