"""The mocked S3 backend: a fresh bucket on the session's moto server, reached
through an HTTP fault proxy (see :mod:`tensorstream.testing.backends`)."""

from __future__ import annotations

import contextlib
from typing import Any

from .backend import Backend, unique_name
from .faults import _S3ProxyFaults
from .http_proxy import HTTPFaultProxy
from .leftovers import s3_buckets

__all__ = ["S3Backend"]


class S3Backend(Backend):
    """A fresh bucket on the session's moto server, reached through a fault proxy.

    ``auth``: whether the server checks SigV4 signatures (the default): a wrong
    key or secret is refused as real S3 refuses it.
    """

    name = "s3"
    kind = "moto"

    def __init__(self, server: Any, proxy: HTTPFaultProxy) -> None:
        self.server = server
        self.proxy = proxy
        self.auth = bool(server.auth)
        self.bucket = unique_name("ts-test-")
        self._buckets = [self.bucket]
        self._before = s3_buckets(server.client)  # a bucket the test makes itself goes too
        server.create_bucket(self.bucket)
        self.faults = _S3ProxyFaults(self)

    def uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{key.lstrip('/')}"

    @property
    def options(self) -> dict[str, Any]:
        return self.server.options(s3_endpoint=self.proxy.url)

    @property
    def env(self) -> dict[str, str]:
        opts = self.options
        env = {
            "AWS_ACCESS_KEY_ID": opts["s3_access_key_id"],
            "AWS_SECRET_ACCESS_KEY": opts["s3_secret_access_key"],
            "AWS_REGION": opts["s3_region"],
            "AWS_DEFAULT_REGION": opts["s3_region"],
            "AWS_ENDPOINT_URL": opts["s3_endpoint"],
            "AWS_ENDPOINT_URL_S3": opts["s3_endpoint"],
            # vLLM's and tensorizer's names
            "S3_ACCESS_KEY_ID": opts["s3_access_key_id"],
            "S3_SECRET_ACCESS_KEY": opts["s3_secret_access_key"],
            "S3_ENDPOINT_URL": opts["s3_endpoint"],
        }
        if opts.get("ca_bundle"):
            env["AWS_CA_BUNDLE"] = opts["ca_bundle"]
        return env

    @property
    def client(self) -> Any:
        """A boto3 S3 client with the server's keys, straight to moto (no faults)."""
        return self.server.client

    def create_bucket(self, name: str | None = None) -> str:
        """Create another bucket (removed with its objects after the test); returns its name."""
        bucket = name or unique_name("ts-test-")
        self.server.create_bucket(bucket)
        self._buckets.append(bucket)
        return bucket

    @property
    def requests(self) -> list[Any]:
        """Requests the fault proxy saw (``method``, ``path``, ``headers``, ``status``)."""
        return self.proxy.requests

    def put(self, key: str, data: bytes) -> None:
        self.server.put(self.bucket, key.lstrip("/"), bytes(data))

    def get(self, key: str) -> bytes:
        try:
            return bytes(self.server.get(self.bucket, key.lstrip("/")))
        except self.server.client.exceptions.NoSuchKey as exc:
            raise KeyError(key) from exc

    def close(self) -> None:
        self.proxy.cancel_requests()  # before the reset: none goes on under the next test's faults
        super().close()
        self.proxy.clear_log()
        client = self.server.client
        buckets = list(self._buckets)
        with contextlib.suppress(Exception):  # best effort, as below
            buckets += sorted(s3_buckets(client) - self._before - set(buckets))
        for bucket in buckets:
            try:
                for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
                    keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
                    if keys:
                        client.delete_objects(Bucket=bucket, Delete={"Objects": keys})
                # Then every version and delete marker: with versioning on, the deletes
                # above only add markers, and the bucket (not empty) used to outlive the
                # test, handing its objects to a later create_bucket of the same name.
                for page in client.get_paginator("list_object_versions").paginate(Bucket=bucket):
                    versions = [{"Key": v["Key"], "VersionId": v["VersionId"]}
                                for v in page.get("Versions", []) + page.get("DeleteMarkers", [])]
                    if versions:
                        client.delete_objects(Bucket=bucket, Delete={"Objects": versions})
                for up in client.list_multipart_uploads(Bucket=bucket).get("Uploads", []):
                    client.abort_multipart_upload(Bucket=bucket, Key=up["Key"],
                                                  UploadId=up["UploadId"])
                client.delete_bucket(Bucket=bucket)
            except Exception:  # best effort: generated bucket names are never reused
                pass
