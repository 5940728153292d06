"""Which uploads a ``CreateMultipartUpload`` whose answers were lost made
(:func:`tensorstream.providers.s3.lost_upload.abort_lost_upload`), told from another
writer's by when S3 initiated them: within each lost try's own seconds. S3 is played by
a function answering the three calls it is sent (its listing's ``Date``, the uploads'
``Initiated`` dates), so the seconds between tries can be as long as a retry policy's."""

from __future__ import annotations

import asyncio
import datetime
import email.utils
import time
from typing import Any

from tensorstream.providers.s3.lost_upload import abort_lost_upload


def _s3(initiated: dict[str, float], aborted: list[str]) -> Any:
    async def call(op: str, **kwargs: Any) -> dict[str, Any]:
        if op == "list_multipart_uploads":
            return {"ResponseMetadata": {"HTTPHeaders": {
                        "date": email.utils.formatdate(time.time(), usegmt=True)}},
                    "Uploads": [{"Key": "k", "UploadId": upload_id,
                                 "Initiated": datetime.datetime.fromtimestamp(
                                     at, datetime.timezone.utc)}
                                for upload_id, at in initiated.items()]}
        if op == "list_parts":
            return {}  # (none has a part yet)
        assert op == "abort_multipart_upload", op
        aborted.append(kwargs["UploadId"])
        return {}
    return call


def test_an_upload_started_between_two_tries_is_another_writers() -> None:
    # Two tries lost 10 s apart (the retry policy's wait between them): an upload another
    # writer of the key started in that wait was aborted with the lost one (two tries
    # lost, two uploads found), its write then failing on NoSuchUpload.
    t0 = time.time() - 60
    aborted: list[str] = []
    initiated = {"lost": t0 + 0.5, "another": t0 + 6, "answered": t0 + 10.5,
                 "later": t0 + 30}
    got = asyncio.run(abort_lost_upload(_s3(initiated, aborted), "b", "k",
                                        [(t0, t0 + 1), (t0 + 10, t0 + 11)], keep="answered"))
    assert got == aborted == ["lost"]


def test_each_lost_try_s_upload_is_aborted_but_the_one_answered() -> None:
    t0 = time.time() - 60
    aborted: list[str] = []
    initiated = {"first": t0 + 0.5, "second": t0 + 10.2, "answered": t0 + 20.3}
    tries = [(t0, t0 + 1), (t0 + 10, t0 + 11), (t0 + 20, t0 + 21)]
    got = asyncio.run(abort_lost_upload(_s3(initiated, aborted), "b", "k", tries[:2],
                                        keep="answered"))
    assert sorted(got) == sorted(aborted) == ["first", "second"]
    assert asyncio.run(abort_lost_upload(_s3(initiated, []), "b", "k", [])) == []
