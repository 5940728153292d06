"""A hostile S3 endpoint's ListObjectsV2 answers (a raw server on loopback):
a continuation token given twice must end the listing with an error, not
loop forever; sizes and dates that are not sizes and dates are
ProtocolErrors naming the key, never a bare ValueError or a negative size."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

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


# -- keys in S3's order: each key once, a listing that repeats itself ends ---------------
def _pages(*pages: tuple[str, ...], bucket_pages_forever: bool = False) -> Respond:
    """``pages[i]`` answers request ``i`` (each with a fresh token but the last; with
    ``bucket_pages_forever`` the last page is answered again and again, fresh tokens)."""
    def respond(method: str, headers: dict[str, str], attempt: int) -> bytes:
        i = min(attempt, len(pages) - 1)
        more = bucket_pages_forever or attempt < len(pages) - 1
        return _listing(*((k, "1", MODIFIED) for k in pages[i]),
                        token=f"t{attempt}" if more else None)(method, headers, attempt)
    return respond


def test_a_listing_that_answers_the_same_page_with_fresh_tokens_ends_with_an_error() -> None:
    # Was listed forever: each page gave 'a' and 'b' again (every token new, every page
    # holding entries, so neither the repeated-token nor the empty-pages check fired).
    found, error = _given_then_error(_pages(("a", "b"), bucket_pages_forever=True))
    assert "not in S3's order" in str(error) and "'a'" in str(error), str(error)
    assert found == ["b/a", "b/b"]


def _given_then_error(respond: Respond) -> tuple[list[str], ProtocolError]:
    """The paths listed before the listing failed, and its error."""
    found: list[str] = []

    async def go() -> None:
        with RawHTTPServer(respond) as server:
            provider = tensorstream.get_provider("s3://b/", **_options(server))
            try:
                async for info in provider.list("b/"):
                    found.append(info.path)
                    assert len(found) < 50, "listed on and on"
            finally:
                await provider.close()

    with pytest.raises(ProtocolError) as info:
        asyncio.run(asyncio.wait_for(go(), 10))
    return found, info.value


@pytest.mark.parametrize("pages", [
    (("a", "c"), ("a", "d")),   # a later page goes back to a key given before
    (("a", "b"), ("b", "c")),   # a later page repeats the last key given
    (("a", "a"),),              # a key twice within a page
    (("a", "b"), ("c", "d"), ("a", "b")),  # a page given again, two pages later
    (("b", "a"), ("c", "d"), ("b", "a")),  # the same, in a store of its own order
], ids=["later-page-goes-back", "later-page-repeats", "page-repeats", "page-again",
        "page-again-own-order"])
def test_a_key_out_of_order_or_given_again_is_refused_not_listed_twice(
        pages: tuple[tuple[str, ...], ...]) -> None:
    found, error = _given_then_error(_pages(*pages))
    assert "not in S3's order" in str(error)
    assert len(found) == len(set(found))


@pytest.mark.parametrize("pages", [
    (("a", "c"), ("b", "d")),   # a later page starts before the last key given
    (("b", "a"),),              # out of order within a page
    (("m", "c"), ("x", "a"), ("q",)),
], ids=["later-page-before", "page-out-of-order", "pseudo-random"])
def test_a_store_listing_in_an_order_of_its_own_lists_each_key_once(
        pages: tuple[tuple[str, ...], ...], caplog: pytest.LogCaptureFixture) -> None:
    """Some S3-compatible stores list in an order of their own (Storj's gateway: that of
    its encrypted names): each such listing failed ("not in S3's order") since keys had
    to come in S3's; a key given by neither its page nor the one before is listed now
    (said in the log), a key or a page given again still refused (above)."""
    caplog.set_level("INFO", logger="tensorstream.s3")
    assert [p for p, _ in _list(_pages(*pages))] == [f"b/{k}" for page in pages for k in page]
    assert "order of its own" in caplog.text


def test_keys_in_order_across_pages_are_listed_each_once() -> None:
    # The neighbour: ascending across pages (a/ prefix keys, '.' < '/', unicode) lists whole.
    pages = (("a.txt", "a/b"), ("a/c", "z"), ("\u00e9",))
    assert [p for p, _ in _list(_pages(*pages))] == [f"b/{k}" for k in
                                                      ("a.txt", "a/b", "a/c", "z", "\u00e9")]


def test_the_same_page_repeated_with_its_token_still_says_the_listing_loops() -> None:
    # The token is checked before the page's entries are given: 'a' is not given twice.
    found, error = _given_then_error(_listing(("a", "1", MODIFIED), token="same"))
    assert "loops" in str(error) and found == ["b/a"]


def test_a_directory_bucket_lists_its_keys_in_the_order_given() -> None:
    # S3 Express One Zone lists a directory bucket in no order: not refused there.
    bucket = "models--use1-az4--x-s3"

    async def go() -> list[str]:
        with RawHTTPServer(_pages(("b", "a"), ("c",))) as server:
            async with tensorstream.get_provider(f"s3://{bucket}/", **_options(server)) as p:
                return [info.path async for info in p.list(f"{bucket}/")]
    assert asyncio.run(asyncio.wait_for(go(), 10)) == [f"{bucket}/{k}" for k in "bac"]


def _ok(body: bytes) -> Respond:
    def respond(method: str, headers: dict[str, str], attempt: int) -> bytes:
        return (f"HTTP/1.1 200 OK\r\nContent-Type: application/xml\r\nContent-Length: "
                f"{len(body)}\r\nConnection: close\r\n\r\n").encode() + body
    return respond


@pytest.mark.parametrize("body", [
    b'<html xmlns="http://www.w3.org/1999/xhtml"><body><p>Sign in to the proxy</p></body></html>',
    b"<ListAllMyBucketsResult><Buckets/></ListAllMyBucketsResult>",
], ids=["xhtml-page", "another-answer"])
@pytest.mark.parametrize("client", ["data-plane", "botocore"])
def test_a_200_that_is_no_listing_is_refused_not_taken_for_an_empty_one(
        body: bytes, client: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Was an empty listing: `ls` printed nothing and exited 0, `sync --delete` from it
    # would delete every object of the destination.
    respond = _ok(body)
    if client == "botocore":  # (keys from a profile: the listing goes through botocore)
        shared = tmp_path / "credentials"
        shared.write_text("[p]\naws_access_key_id = AKIAEXAMPLE\n"
                          "aws_secret_access_key = wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY\n")
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(shared))

        async def go() -> list[str]:
            with RawHTTPServer(respond) as server:
                async with tensorstream.get_provider(
                        "s3://b/", s3_endpoint=f"http://127.0.0.1:{server.port}",
                        s3_profile="p", s3_region="us-east-1", retries=1) as p:
                    return [i.path async for i in p.list("b/")]
        with pytest.raises(ProtocolError, match="not a ListObjectsV2 answer") as info:
            asyncio.run(asyncio.wait_for(go(), 20))
    else:
        with pytest.raises(ProtocolError, match="not a ListObjectsV2 answer") as info:
            _list(respond)
    assert "Sign in" not in str(info.value) and len(str(info.value)) < 300


@pytest.mark.parametrize(("code", "error"), [
    ("AccessDenied", tensorstream.errors.PermissionDeniedError),
    ("InternalError", tensorstream.errors.ServiceUnavailableError),  # temporary: retried
], ids=["AccessDenied", "InternalError"])
def test_an_error_in_a_200_listing_is_s3s_error(code: str, error: type[Exception]) -> None:
    # The neighbour: S3's own <Error> in a 200 (a gateway's) is the error it names.
    body = f'<?xml version="1.0"?><Error><Code>{code}</Code><Message>m</Message></Error>'
    with pytest.raises(error):
        _list(_ok(body.encode()))


@pytest.mark.parametrize("body", [
    b'<html xmlns="http://www.w3.org/1999/xhtml"><body><p>Sign in to the proxy</p></body></html>',
    b"<ListBucketResult><Name>b</Name></ListBucketResult>",
], ids=["xhtml-page", "another-answer"])
def test_ls_of_the_buckets_from_a_200_that_is_no_bucket_list_says_so(
        body: bytes, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # Was no bucket at all: `ls s3://` printed nothing and exited 0.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    with RawHTTPServer(_ok(body)) as server:
        code = main(["ls", "s3://", "--endpoint-url", f"http://127.0.0.1:{server.port}"])
    err = capsys.readouterr().err
    assert code != 0 and "not a ListBuckets answer" in err and "Sign in" not in err


@pytest.mark.parametrize("body", [
    b'<ListAllMyBucketsResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Owner>'
    b"<ID>x</ID></Owner><Buckets></Buckets></ListAllMyBucketsResult>",
    b"<ListAllMyBucketsResult><Buckets/></ListAllMyBucketsResult>",
    b"<ListAllMyBucketsResult><Owner><ID>x</ID></Owner></ListAllMyBucketsResult>",
], ids=["s3", "no-owner", "no-buckets-element"])
def test_ls_of_no_buckets_at_all_lists_nothing(
        body: bytes, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # The neighbour: an account without a bucket is no error.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    with RawHTTPServer(_ok(body)) as server:
        code = main(["ls", "s3://", "--endpoint-url", f"http://127.0.0.1:{server.port}"])
    out = capsys.readouterr()
    assert code == 0 and out.out == "", out.err
