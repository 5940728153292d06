"""Fixtures for the s3 backend: moto's server on loopback (session-scoped),
checking signatures so a wrong key or secret is refused like real S3."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tensorstream.testing.s3_server import MotoS3Server

S3_BUCKET = "tensorstream-tests"


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
