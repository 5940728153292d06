"""S3's multipart limits (10,000 parts of 5 MiB..5 GiB, 5 TiB an object) for
writes of known size (``cp``) and of unknown size (``open(uri, "wb")``):
the arithmetic for 60 GiB..5 TiB objects, and real moto uploads that reach a
lowered part limit. Before: a stream's parts doubled every 1000, which held
only 4.88 TiB from 5 MiB parts (part 10,001 failed after hours); the part
limit was S3's to find; grown parts kept every upload slot (25 x 2.5 GiB)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

import tensorstream
from fixtures_s3 import S3_BUCKET
from tensorstream.copy.engine import copy_async
from tensorstream.errors import UnsupportedOperationError
from tensorstream.providers.s3 import parts
from tensorstream.providers.s3.writer import S3Writer
from tensorstream.testing.s3_server import MotoS3Server

MiB, GiB, TiB = 1 << 20, 1 << 30, 1 << 40


@pytest.mark.parametrize("base", [1, 5 * MiB, 8 * MiB, 64 * MiB, 5 * GiB])
def test_a_stream_of_ten_thousand_parts_holds_five_tib_from_any_first_part(base: int) -> None:
    assert parts.streaming_capacity(base) >= parts.MAX_OBJECT_SIZE
    sizes = [parts.streaming_part_size(i, base) for i in range(parts.MAX_PARTS)]
    assert all(parts.MIN_PART_SIZE <= s <= parts.MAX_PART_SIZE for s in sizes)
    assert sizes == sorted(sizes)


def test_the_old_schedule_fell_short_of_five_tib() -> None:
    # Doubling every 1000 parts from 5 MiB held 4.88 TiB: the neighbour that failed.
    assert parts.streaming_capacity(5 * MiB, grow_every=1000) < parts.MAX_OBJECT_SIZE


@pytest.mark.parametrize("size", [60 * GiB, 600 * GiB, 5 * TiB - 1, 5 * TiB])
def test_known_sizes_up_to_five_tib_fit_ten_thousand_parts(size: int) -> None:
    for wanted in (1, 8 * MiB, 5 * GiB):
        part = parts.known_size_part(size, wanted)
        assert parts.MIN_PART_SIZE <= part <= parts.MAX_PART_SIZE
        assert -(-size // part) <= parts.MAX_PARTS
        assert part == max(wanted, parts.MIN_PART_SIZE) or -(-size // (part - 1)) > parts.MAX_PARTS


def test_a_known_size_over_five_tib_is_refused_before_anything_is_sent() -> None:
    sent: list[str] = []

    async def call(op: str, **kw: Any) -> dict[str, Any]:
        sent.append(op)
        return {}

    writer = S3Writer(call, "b", "k", part_size=8 * MiB, max_in_flight=4, checksum=False)
    assert writer.part_size_for(5 * TiB, 8 * MiB) == -(-5 * TiB // 10_000)
    with pytest.raises(UnsupportedOperationError, match="5 TiB") as info:
        writer.part_size_for(5 * TiB + 1, 8 * MiB)
    assert "shards" in str(info.value) and "b/k" in str(info.value)
    assert sent == []


def test_grown_parts_take_more_upload_slots_so_memory_stays_bounded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A fake S3 counts the bytes of parts uploading at once; parts double every 2."""
    monkeypatch.setattr(S3Writer, "grow_every", 2)
    state = {"now": 0, "peak": 0, "parts": 0}

    async def call(op: str, **kw: Any) -> dict[str, Any]:
        if op == "create_multipart_upload":
            return {"UploadId": "U"}
        if op == "upload_part":
            body = kw["Body"]
            n = len(body if isinstance(body, (bytes, bytearray)) else body.read())
            state["now"] += n
            state["peak"] = max(state["peak"], state["now"])
            state["parts"] += 1
            await asyncio.sleep(0.01)
            state["now"] -= n
            return {"ETag": '"e"'}
        return {}

    async def main() -> None:
        w = S3Writer(call, "b", "k", part_size=5 * MiB, max_in_flight=8, checksum=False)
        chunk = bytes(MiB)
        for _ in range(5 * 2 + 10 * 2 + 20 * 2 + 40 * 2):  # 2 parts of 5, 10, 20, 40 MiB
            await w.write(chunk)
        await w.commit()

    asyncio.run(main())
    assert state["parts"] == 8
    # 8 slots of 5 MiB: 40 MiB, but two parts of any size may always go at once.
    assert state["peak"] <= max(8 * 5 * MiB, 2 * 40 * MiB), state


@pytest.fixture
def s3(moto_s3: MotoS3Server, isolated_env: Path) -> MotoS3Server:
    return moto_s3


def _part_count(s3: MotoS3Server, key: str) -> int:
    etag = s3.client.head_object(Bucket=S3_BUCKET, Key=key)["ETag"].strip('"')
    return int(etag.split("-")[1]) if "-" in etag else 1


def test_a_stream_past_the_part_limit_fails_before_the_extra_part_and_leaves_nothing(
        s3: MotoS3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(S3Writer, "max_parts", 2)
    monkeypatch.setattr(S3Writer, "grow_every", 1)  # 5 MiB, then 10 MiB: 15 MiB fit
    data = os.urandom(15 * MiB)
    fits = f"s3://{S3_BUCKET}/parts/fits"
    with tensorstream.open(fits, "wb", **s3.options(part_size=5 * MiB)) as w:
        w.write(data)
    assert s3.get(S3_BUCKET, "parts/fits") == data
    assert _part_count(s3, "parts/fits") == 2

    over = f"s3://{S3_BUCKET}/parts/over"
    with pytest.raises(UnsupportedOperationError, match="more than S3's 2 parts hold") as info, \
            tensorstream.open(over, "wb", **s3.options(part_size=5 * MiB)) as w:
        w.write(data + b"x")
    assert "shards" in str(info.value)
    assert not s3.exists(S3_BUCKET, "parts/over")
    assert s3.open_multipart_uploads(S3_BUCKET, "parts/") == []


def test_cp_of_a_known_size_takes_larger_parts_to_stay_under_the_part_limit(
        s3: MotoS3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(S3Writer, "max_parts", 2)
    data = os.urandom(13 * MiB)  # 5 MiB parts would be 3
    src = tmp_path / "big.bin"
    src.write_bytes(data)
    dst = f"s3://{S3_BUCKET}/parts/cp.bin"
    result = asyncio.run(copy_async(str(src), dst, part_size=5 * MiB, **s3.options()))
    assert not result.errors, result.errors
    assert s3.get(S3_BUCKET, "parts/cp.bin") == data
    assert _part_count(s3, "parts/cp.bin") == 2


def test_a_stream_past_five_tib_within_the_part_limit_fails_before_the_part_that_crosses_it(
        s3: MotoS3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    # 10,000 growing parts hold 9 TiB, S3 one object 5 TiB: a stream of 6 TiB sent every
    # part and was refused only by CompleteMultipartUpload (EntityTooLarge), hours later.
    monkeypatch.setattr(S3Writer, "max_object_size", 12 * MiB)  # S3's 5 TiB, lowered
    data = os.urandom(12 * MiB)
    fits = f"s3://{S3_BUCKET}/limit/fits"
    with tensorstream.open(fits, "wb", **s3.options(part_size=5 * MiB)) as w:
        w.write(data)
    assert s3.get(S3_BUCKET, "limit/fits") == data

    over = f"s3://{S3_BUCKET}/limit/over"
    sent: list[int] = []
    with pytest.raises(UnsupportedOperationError, match="more than S3 stores in one object") \
            as info, tensorstream.open(over, "wb", **s3.options(part_size=5 * MiB)) as w:
        for _ in range(4):  # the third 5 MiB part would cross the limit
            w.write(data[:5 * MiB])
            sent.append(5)
    assert "shards" in str(info.value) and sum(sent) <= 15
    assert not s3.exists(S3_BUCKET, "limit/over")
    assert s3.open_multipart_uploads(S3_BUCKET, "limit/") == []
