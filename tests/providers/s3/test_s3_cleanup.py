"""The removal of what a failed write or copy made (:mod:`tensorstream.providers.s3.cleanup`)
against a real S3 (moto on loopback): exactly what it wrote, and what is gone is gone."""

from __future__ import annotations

import asyncio
from typing import Any

from fixtures_s3 import S3_BUCKET, s3_provider
from s3_loop_front import LoopFront, pass_on, send_back
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


class _Conflict(LoopFront):
    """moto behind a front that answers the first conditional DELETE ``409
    ConditionalRequestConflict``, as S3 does when another request changed the object
    while the delete was being applied."""

    def __init__(self, upstream: str) -> None:
        super().__init__()
        self.upstream = upstream
        self.conflicts = 0

    async def _forward(self, request: Any) -> Any:
        body = await request.read()
        if request.method == "DELETE" and "If-Match" in request.headers and not self.conflicts:
            self.conflicts += 1
            return await send_back(request, 409, {"Content-Type": "application/xml"}, (
                b"<Error><Code>ConditionalRequestConflict</Code><Message>A conflicting "
                b"operation occurred.</Message></Error>"), None)
        return await send_back(request, *await pass_on(request, self.upstream, body))


def test_a_conditional_delete_that_lost_to_another_request_leaves_the_key(moto_s3: Any) -> None:
    # S3 answers 409 ConditionalRequestConflict when a PUT or DELETE of the key succeeded
    # while the conditional delete was applied: the key is another writer's now, as after
    # a 412. It was an unexplained error ("could not be removed"), not "left".
    with _Conflict(moto_s3.endpoint_url) as url:
        async def run() -> bool:
            async with s3_provider(moto_s3, s3_endpoint=url) as s3:
                def call(op: str, **kwargs: Any) -> Any:
                    return s3._call(op, f"{S3_BUCKET}/cleanup/conflict", **kwargs)

                await call("put_object", Bucket=S3_BUCKET, Key="cleanup/conflict", Body=b"x")
                head = await call("head_object", Bucket=S3_BUCKET, Key="cleanup/conflict")
                return await delete_written(call, S3_BUCKET, "cleanup/conflict", None,
                                            head["ETag"])

        assert asyncio.run(run()) is False
    assert moto_s3.client.get_object(Bucket=S3_BUCKET, Key="cleanup/conflict")["Body"].read() == b"x"
