"""Atomic S3 writes: one PUT for small objects, a concurrent multipart upload for
large ones, aborted on any failure or cancellation (no orphaned parts).

Memory is bounded: at most ``max_in_flight`` parts are uploading while one more
fills. The object appears only when ``CompleteMultipartUpload`` (or the single
PUT) succeeds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import tenacity

from ... import _loop
from ...errors import TensorstreamError
from ..base import Writer

__all__ = ["MIN_PART_SIZE", "S3Writer"]

log = logging.getLogger("tensorstream.s3")

MIN_PART_SIZE = 5 << 20  # S3's minimum for every part but the last
_MAX_PART_SIZE = 5 << 30
_GROW_EVERY = 1000  # double the part size every 1000 parts: 10,000 parts reach > 5 TiB


_ABORT_ATTEMPTS = 3


class S3Writer(Writer):
    """Writer for one S3 object. ``call(op, **kwargs)`` runs a client operation
    and raises tensorstream errors (the provider maps them)."""

    def __init__(
        self,
        call: Callable[..., Awaitable[dict[str, Any]]],
        bucket: str,
        key: str,
        *,
        part_size: int,
        max_in_flight: int,
        checksum: bool,
    ) -> None:
        self._call = call
        self._bucket = bucket
        self._key = key
        self._part_size = max(part_size, MIN_PART_SIZE)
        self._max_in_flight = max(1, max_in_flight)
        self._checksum = checksum
        self._buf = bytearray()
        self._part_number = 0
        self._upload_id: str | None = None
        self._create: asyncio.Task[dict[str, Any]] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._parts: dict[int, dict[str, Any]] = {}
        self._slots: asyncio.Semaphore | None = None
        self._error: BaseException | None = None
        self._abort_task: asyncio.Task[None] | None = None
        self._state = "open"

    def __repr__(self) -> str:
        return f"S3Writer({self._bucket}/{self._key}, parts={self._part_number}, {self._state})"

    def _next_part_size(self) -> int:
        return min(self._part_size << ((self._part_number) // _GROW_EVERY), _MAX_PART_SIZE)

    def _check_open(self) -> None:
        if self._state != "open":
            raise ValueError(f"write to an S3 writer that is {self._state}")

    # -- Writer ---------------------------------------------------------------
    async def write(self, data: bytes | bytearray | memoryview) -> None:
        self._check_open()
        try:
            view = memoryview(data).cast("B")
            while view:
                size = self._next_part_size()
                room = size - len(self._buf)
                self._buf += view[:room]
                view = view[room:]
                if len(self._buf) >= size:
                    part, self._buf = self._buf, bytearray()
                    await self._start_part(part)
        except BaseException:
            await self.abort()
            raise

    async def commit(self) -> None:
        if self._state == "committed":
            return
        self._check_open()
        try:
            if self._create is None:
                body, self._buf = bytes(self._buf), bytearray()
                await self._call("put_object", Bucket=self._bucket, Key=self._key, Body=body)
            else:
                if self._buf:
                    part, self._buf = self._buf, bytearray()
                    await self._start_part(part)
                await asyncio.gather(*self._tasks)
                if self._error is not None:
                    raise self._error
                parts = [self._parts[n] for n in range(1, self._part_number + 1)]
                # botocore turns a 200 whose body is an <Error> into a ClientError here.
                await self._call(
                    "complete_multipart_upload", Bucket=self._bucket, Key=self._key,
                    UploadId=self._upload_id, MultipartUpload={"Parts": parts},
                )
            self._state = "committed"
        except BaseException:
            await self.abort()
            raise

    async def abort(self) -> None:
        if self._state in ("committed",):
            return
        self._state = "aborted"
        self._buf = bytearray()
        if self._abort_task is None:
            self._abort_task = asyncio.ensure_future(self._abort_remote())
        # Shielded: cleanup finishes even if the caller is being cancelled.
        await asyncio.shield(self._abort_task)

    # -- internals --------------------------------------------------------------
    async def _start_part(self, body: bytearray) -> None:
        if self._error is not None:
            raise self._error
        if self._create is None:
            kwargs: dict[str, Any] = {"ChecksumAlgorithm": "CRC32"} if self._checksum else {}
            self._create = asyncio.ensure_future(
                self._call("create_multipart_upload", Bucket=self._bucket, Key=self._key, **kwargs)
            )
            _loop.abort_at_exit(self)  # still open at interpreter exit: abort the upload
            self._slots = asyncio.Semaphore(self._max_in_flight)
        if self._upload_id is None:
            # Shielded so a cancellation here still lets abort() learn the id.
            self._upload_id = str((await asyncio.shield(self._create))["UploadId"])
        assert self._slots is not None
        await self._slots.acquire()
        self._part_number += 1
        self._tasks.append(asyncio.ensure_future(self._upload_part(self._part_number, body)))

    async def _upload_part(self, number: int, body: bytearray) -> None:
        assert self._slots is not None
        try:
            kwargs: dict[str, Any] = {"ChecksumAlgorithm": "CRC32"} if self._checksum else {}
            resp = await self._call(
                "upload_part", Bucket=self._bucket, Key=self._key, UploadId=self._upload_id,
                PartNumber=number, Body=body, **kwargs,
            )
            part: dict[str, Any] = {"PartNumber": number, "ETag": resp["ETag"]}
            if self._checksum and resp.get("ChecksumCRC32"):
                part["ChecksumCRC32"] = resp["ChecksumCRC32"]
            self._parts[number] = part
        except Exception as exc:
            if self._error is None:
                self._error = exc
        finally:
            self._slots.release()

    async def _abort_remote(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        upload_id = self._upload_id
        if upload_id is None and self._create is not None:
            try:
                upload_id = str((await self._create)["UploadId"])
            except BaseException:
                upload_id = None
        if upload_id is None:
            return
        try:
            # Idempotent, and what keeps storage from filling with orphaned parts:
            # retried on temporary errors (a connection the cancelled parts broke).
            async for attempt in tenacity.AsyncRetrying(
                stop=tenacity.stop_after_attempt(_ABORT_ATTEMPTS),
                wait=tenacity.wait_random_exponential(multiplier=0.05, max=1.0),
                retry=tenacity.retry_if_exception(
                    lambda e: isinstance(e, TensorstreamError) and e.temporary),
                reraise=True,
            ):
                with attempt:
                    await self._call("abort_multipart_upload", Bucket=self._bucket,
                                     Key=self._key, UploadId=upload_id)
        except TensorstreamError as exc:
            log.warning("could not abort multipart upload %s of %s/%s: %s (a bucket lifecycle "
                        "rule for incomplete uploads removes it)", upload_id, self._bucket,
                        self._key, exc)
