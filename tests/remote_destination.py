"""What a failed copy into S3 or Redis must leave: the old object, whole, and nothing
staged beside it (no open multipart upload, no chunk keys)."""

from __future__ import annotations

from typing import Any

from fixtures_s3 import S3_BUCKET


def assert_left_as_it_was(to: str, key: str, old: bytes, moto_s3: Any, redis_server: Any) -> None:
    """``key`` on ``to`` ("s3" or "redis") still holds ``old`` and nothing else was left."""
    if to == "s3":
        assert moto_s3.get(S3_BUCKET, key) == old
        assert moto_s3.open_multipart_uploads(S3_BUCKET, key) == []
    else:
        assert redis_server.get(key) == old
        with redis_server.client() as c:
            assert c.keys(f"{key}*") == [key.encode()]
