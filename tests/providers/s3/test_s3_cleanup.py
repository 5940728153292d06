"""The removal of what a failed write or copy made (:mod:`tensorstream.providers.s3.cleanup`)
against a real S3 (moto on loopback): exactly what it wrote, and what is gone is gone."""

from __future__ import annotations

import asyncio
from typing import Any

from fixtures_s3 import S3_BUCKET, s3_provider
from tensorstream.providers.s3.cleanup import delete_written


def test_what_is_gone_already_is_gone_not_a_failure(moto_s3: Any) -> None:
    # S3 answers a conditional delete of a key that holds nothing 404 NoSuchKey (a
    # delete by key: 204): the object a failed write made, deleted by another since,
    # was reported "could not be removed ...: it is there".
    async def run() -> tuple[bool, bool]:
        async with s3_provider(moto_s3) as s3:
            def call(op: str, **kwargs: Any) -> Any:
                return s3._call(op, f"{S3_BUCKET}/cleanup/k", **kwargs)

            await call("put_object", Bucket=S3_BUCKET, Key="cleanup/k", Body=b"x")
            head = await call("head_object", Bucket=S3_BUCKET, Key="cleanup/k")
            first = await delete_written(call, S3_BUCKET, "cleanup/k", None, head["ETag"])
            again = await delete_written(call, S3_BUCKET, "cleanup/k", None, head["ETag"])
            return first, again

    assert asyncio.run(run()) == (True, True)
