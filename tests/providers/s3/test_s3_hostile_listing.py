"""A hostile S3 endpoint's ListObjectsV2 answers (a raw server on loopback):
a continuation token given twice must end the listing with an error, not
loop forever; sizes and dates that are not sizes and dates are
ProtocolErrors naming the key, never a bare ValueError or a negative size."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

import tensorstream
from reliability_helpers import RawHTTPServer
from tensorstream.cli.main import main
from tensorstream.errors import ProtocolError

pytestmark = pytest.mark.usefixtures("isolated_env")

MODIFIED = "2026-01-01T00:00:00.000Z"
Respond = Callable[[str, dict[str, str], int], bytes]


def _listing(*contents: tuple[str, str, str], token: str | None = None,
             truncated: bool | None = None) -> Respond:
    items = "".join(f"<Contents>{f'<Key>{k}</Key>' if k else ''}<Size>{s}</Size><ETag>&quot;e"
                    f"&quot;</ETag><LastModified>{m}</LastModified></Contents>"
                    for k, s, m in contents)
    more = f"<IsTruncated>{'true' if truncated or token else 'false'}</IsTruncated>"
    if token:
        more += f"<NextContinuationToken>{token}</NextContinuationToken>"
    body = ('<?xml version="1.0"?><ListBucketResult xmlns="http://s3.amazonaws.com/doc/'
            f'2006-03-01/"><Name>b</Name>{more}{items}</ListBucketResult>').encode()

    def respond(method: str, headers: dict[str, str], attempt: int) -> bytes:
        return (f"HTTP/1.1 200 OK\r\nContent-Type: application/xml\r\nContent-Length: "
                f"{len(body)}\r\nConnection: close\r\n\r\n").encode() + body
    return respond


def _options(server: RawHTTPServer) -> dict[str, object]:
    return {"s3_endpoint": f"http://127.0.0.1:{server.port}", "s3_access_key_id": "AKIAEXAMPLE",
            "s3_secret_access_key": "wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY",
            "s3_region": "us-east-1", "retries": 1}


def _list(respond: Respond, limit: int = 50) -> list[tuple[str, int]]:
    async def go() -> list[tuple[str, int]]:
        found: list[tuple[str, int]] = []
        with RawHTTPServer(respond) as server:
            provider = tensorstream.get_provider("s3://b/", **_options(server))
            async for info in provider.list("b/"):
                found.append((info.path, info.size))
                if len(found) > limit:  # the old code listed the same page forever
                    break
            await provider.close()
        return found
    return asyncio.run(asyncio.wait_for(go(), 10))


def test_a_listing_that_repeats_its_continuation_token_is_refused() -> None:
    with pytest.raises(ProtocolError, match="loops"):
        _list(_listing(("a", "1", MODIFIED), token="same"))


def test_ls_of_a_listing_that_loops_fails_instead_of_printing_forever(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    with RawHTTPServer(_listing(("a", "1", MODIFIED), token="same")) as server:
        code = main(["ls", "s3://b/", "--endpoint-url", f"http://127.0.0.1:{server.port}"])
        asked = len(server.requests)
    err = capsys.readouterr().err
    assert code != 0 and "loops" in err
    assert asked == 2  # the second page repeated the first one's token


@pytest.mark.parametrize(("size", "modified"), [
    ("abc", MODIFIED), ("-5", MODIFIED), ("9" * 5000, MODIFIED), ("1", "yesterday"),
], ids=["size-abc", "size-negative", "size-5000-digits", "date-yesterday"])
def test_a_listing_entry_that_is_not_a_size_or_date_names_its_key(size: str,
                                                                    modified: str) -> None:
    with pytest.raises(ProtocolError, match=r"key 'weights\.bin'") as info:
        _list(_listing(("weights.bin", size, modified)))
    assert len(str(info.value)) < 300


def test_ls_of_the_buckets_when_one_has_no_name_says_so(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # Was a bare KeyError: the CLI printed just "error: 'Name'".
    body = (b"<ListAllMyBucketsResult><Buckets><Bucket><CreationDate>2026-01-01T00:00:00Z"
            b"</CreationDate></Bucket></Buckets></ListAllMyBucketsResult>")

    def respond(method: str, headers: dict[str, str], attempt: int) -> bytes:
        return (f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                ).encode() + body
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    with RawHTTPServer(respond) as server:
        code = main(["ls", "s3://", "--endpoint-url", f"http://127.0.0.1:{server.port}"])
    assert code != 0
    assert "a bucket without a name" in capsys.readouterr().err


def test_a_truncated_listing_without_a_continuation_token_is_refused() -> None:
    # Was the end of the listing: a part of it passed off as all of it.
    with pytest.raises(ProtocolError, match="truncated but gives no continuation token"):
        _list(_listing(("a", "1", MODIFIED), truncated=True))


def test_a_listing_entry_without_a_key_is_refused() -> None:
    # Was listed as the key "" (the prefix itself, "b/"), of the size given.
    with pytest.raises(ProtocolError, match="without a key"):
        _list(_listing(("", "1", MODIFIED)))


def _empty_pages_then(last: Respond) -> Respond:
    """Empty truncated pages, each with a fresh token, until ``last`` answers
    (after 5 of them: the test lowers the cap to 5 or 6)."""
    def respond(method: str, headers: dict[str, str], attempt: int) -> bytes:
        return last(method, headers, attempt) if attempt == 5 else \
            _listing(token=f"t{attempt}")(method, headers, attempt)
    return respond


def test_a_listing_of_empty_pages_with_fresh_tokens_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Was listed forever: every token new, so the repeated-token check never fired.
    monkeypatch.setattr("tensorstream.providers.s3.lister._LIST_EMPTY_PAGES", 5)
    with pytest.raises(ProtocolError, match=r"s3 list b/: .*5 truncated pages in a row"):
        _list(_empty_pages_then(_listing(("a", "1", MODIFIED))))


def test_a_few_empty_truncated_pages_are_listed_through(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Real S3 may answer empty truncated pages: below the cap they are followed.
    monkeypatch.setattr("tensorstream.providers.s3.lister._LIST_EMPTY_PAGES", 6)
    assert _list(_empty_pages_then(_listing(("a", "1", MODIFIED)))) == [("b/a", 1)]


def test_the_count_of_empty_pages_starts_again_after_an_entry(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tensorstream.providers.s3.lister._LIST_EMPTY_PAGES", 3)

    def respond(method: str, headers: dict[str, str], attempt: int) -> bytes:
        if attempt == 5:  # after 2 empty, 1 entry, 2 empty pages
            return _listing(("z", "2", MODIFIED))(method, headers, attempt)
        contents = (("a", "1", MODIFIED),) if attempt == 2 else ()
        return _listing(*contents, token=f"t{attempt}")(method, headers, attempt)
    assert _list(respond) == [("b/a", 1), ("b/z", 2)]
