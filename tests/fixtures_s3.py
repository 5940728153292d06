"""Fixtures for the s3 backend: moto's server on loopback (session-scoped),
checking signatures so a wrong key or secret is refused like real S3."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from tensorstream.testing.s3_server import MotoS3Server

if TYPE_CHECKING:
    from tensorstream.providers.s3.provider import S3Provider

S3_BUCKET = "tensorstream-tests"


def s3_provider(server: MotoS3Server, **extra: Any) -> S3Provider:
    """An ``S3Provider`` of ``S3_BUCKET`` on ``server`` (``extra``: more of its options)."""
    from tensorstream.config import split_options
    from tensorstream.providers.s3.provider import S3Provider
    from tensorstream.uri import parse_uri

    common, own = split_options(server.options(**extra))
    return S3Provider.from_uri(parse_uri(f"s3://{S3_BUCKET}/x"), config=common, **own)


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[MotoS3Server]:
    """HTTP moto server with SigV4 checking and the bucket ``S3_BUCKET``."""
    with MotoS3Server(auth=True) as server:
        server.create_bucket(S3_BUCKET)
        yield server


@pytest.fixture(scope="session")
def moto_s3_tls() -> Iterator[MotoS3Server]:
    """HTTPS moto server (trustme certificate at ``ca_bundle_path``)."""
    with MotoS3Server(tls=True, auth=True) as server:
        server.create_bucket(S3_BUCKET)
        yield server


@pytest.fixture(scope="session")
def moto_s3_public() -> Iterator[MotoS3Server]:
    """HTTP moto server that checks no signatures (a public bucket, for anonymous reads)."""
    with MotoS3Server(auth=False) as server:
        server.create_bucket(S3_BUCKET)
        yield server
