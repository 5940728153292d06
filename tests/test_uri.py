"""URI parsing (the redaction of secrets: tests/test_uri_redaction.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import tensorstream
from tensorstream import errors
from tensorstream.uri import parse_uri, redact, redact_text, windows_path_hint


def test_local_forms() -> None:
    assert parse_uri("/tmp/x.tensors").path == "/tmp/x.tensors"
    assert parse_uri("file:///tmp/x.tensors").path == "/tmp/x.tensors"
    assert parse_uri("rel/x").path == os.path.abspath("rel/x")
    assert parse_uri("/tmp/x").scheme == "file"


def test_s3() -> None:
    u = parse_uri("s3://bucket/dir/model.tensors")
    assert (u.scheme, u.bucket, u.key, u.path) == ("s3", "bucket", "dir/model.tensors",
                                                   "bucket/dir/model.tensors")


def test_http_keeps_query_in_path() -> None:
    u = parse_uri("https://host:8443/a/b.tensors?X-Amz-Signature=abc&x=1")
    assert u.host == "host" and u.port == 8443
    assert u.path == "/a/b.tensors?X-Amz-Signature=abc&x=1"
    assert "abc" not in repr(u) and "abc" not in str(u)


@pytest.mark.parametrize(
    "uri,user,password,key,db",
    [
        ("redis://localhost:6379/prefix", None, None, "prefix", None),
        ("redis://:pw@localhost/k", None, "pw", "k", None),
        ("redis://alice:pw@localhost:7000/a/b?db=3", "alice", "pw", "a/b", "3"),
        ("rediss://secretonly@host/k", None, "secretonly", "k", None),
    ],
)
def test_redis(uri: str, user: str | None, password: str | None, key: str, db: str | None) -> None:
    u = parse_uri(uri)
    assert (u.username, u.password, u.key, u.query.get("db")) == (user, password, key, db)
    if password:
        assert password not in repr(u)
        assert password not in u.redacted()


@pytest.mark.parametrize("uri", ["redis://h:6379/0", "redis://:pw@h/15", "rediss://h/2/",
                                 "redis://h/007"])
def test_a_redis_path_that_redis_py_reads_as_the_database_is_refused(uri: str) -> None:
    """redis-py's from_url and redis-cli -u read redis://host:6379/0 as database 0;
    tensorstream read the key "0" (of database 0): "database 15" read or wrote key 15.
    Refused, naming both spellings; ?db= or %3N say which is meant."""
    with pytest.raises(errors.InvalidURIError) as info:
        parse_uri(uri)
    said = str(info.value)
    n = uri.rstrip("/").rsplit("/", 1)[1]
    assert f"the path /{n} is the database number for redis-py" in said, said
    assert f"/KEY?db={n}" in said and f"/{n}?db=0" in said and "pw" not in said, said
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(("uri", "key", "db"), [
    ("redis://h/0?db=0", "0", "0"), ("redis://h/15?db=3", "15", "3"), ("redis://h/%30", "0", None),
    ("redis://h/0/model.tensors", "0/model.tensors", None), ("redis://h/v0", "v0", None),
    ("redis://h/?db=15", "", "15"), ("redis://h/", "", None)])
def test_a_redis_key_made_of_digits_is_said_unambiguously(uri: str, key: str,
                                                          db: str | None) -> None:
    u = parse_uri(uri)
    assert (u.key, u.query.get("db")) == (key, db)
    # a copy names such a key in a URI of its own: it parses back to that key
    for name in ("0", "42/", "0/x", "1a"):
        again = parse_uri(u.with_path(name))
        assert (again.key, again.query.get("db")) == (name, db), u.with_path(name)


@pytest.mark.parametrize(
    "bad", ["", "s3://", "s3:/bucket/key", "http://", "redis://:pw@/k", "redis://h/k?db=x",
            "redis://h/k?db=1&db=2", "redis://h/k?db=1&cluster=1&db=1",
            "file://remotehost/x", " /x", "http://h:notaport/x"],
)
def test_malformed_raises_value_error_naming_forms(bad: str) -> None:
    with pytest.raises(errors.InvalidURIError) as info:
        parse_uri(bad)
    assert isinstance(info.value, ValueError)


def test_unknown_scheme_falls_through_to_fsspec_shape() -> None:
    u = parse_uri("memory:///a/b")
    assert u.scheme == "memory"


@given(st.text(max_size=200))
def test_parser_never_crashes_unexpectedly(text: str) -> None:
    try:
        parse_uri(text)
    except errors.InvalidURIError:
        pass


@pytest.mark.parametrize("uri", [
    "redis://loader:p@ss:w/rd@127.0.0.1:6379/k",
    "redis://loader:WRONGp@ss:w/rd%41#?&xy@127.0.0.1:6379/k",
    "rediss://:p@ss:x/y@cache/k?db=1",
    "https://user:p@ss:w/rd@host/path",
])
def test_a_password_with_an_at_sign_and_a_slash_is_refused_unseen(uri: str) -> None:
    """A password holding '@' and then '/' unescaped ended at that '/': the URI was
    refused as "invalid port in 'redis://loader:***@ss:w/rd@127.0.0.1...'", the
    password's tail in the message."""
    with pytest.raises(errors.InvalidURIError, match="percent-encode '/'") as info:
        parse_uri(uri)
    for shown in (str(info.value), redact(uri, cautious=True), redact_text(f"got {uri} here")):
        assert not any(tail in shown for tail in ("@ss", "w/rd", "x/y", "xy")), shown


@pytest.mark.parametrize("uri,host,key", [
    ("redis://u:p@[::1]:6379/k", "::1", "k"),
    ("redis://:pw@host/a@b", "host", "a@b"),
    ("redis://u:pw@host:6379/key:with@at/x", "host", "key:with@at/x"),
])
def test_an_at_sign_in_a_key_is_still_the_key(uri: str, host: str, key: str) -> None:
    parsed = parse_uri(uri)
    assert (parsed.host, parsed.key) == (host, key)


@pytest.mark.parametrize("uri", ["file://localhost/tmp/x", "file://LocalHost/tmp/x",
                                 "file://127.0.0.1/tmp/x"])
def test_file_uri_of_this_machine_as_curl_takes_it(uri: str) -> None:
    assert parse_uri(uri).path == "/tmp/x"


def test_file_uri_escapes_are_bytes_of_the_name(tmp_path: Path) -> None:
    # %FF%FE named the file "\ufffd\ufffd" (another file, or a copy published
    # under a name nobody asked for); curl reads the bytes 0xFF 0xFE.
    name = os.fsdecode(b"w\xff\xfe.bin")
    (tmp_path / name).write_bytes(b"weights")
    parsed = parse_uri(f"file://{tmp_path}/w%FF%FE.bin")
    assert os.fsencode(parsed.path) == os.fsencode(str(tmp_path)) + b"/w\xff\xfe.bin"
    assert open(parsed.path, "rb").read() == b"weights"
    assert parse_uri(f"file://{tmp_path}/%C3%A9%20x").path == f"{tmp_path}/\u00e9 x"


def test_file_uri_with_a_nul_byte_is_refused() -> None:
    # It was a bare ValueError("embedded null byte") from the first system call.
    with pytest.raises(errors.InvalidURIError, match="%00"):
        parse_uri("file:///tmp/a%00b")


def test_a_path_ending_in_a_space_is_refused_saying_how_to_name_it(tmp_path: Path) -> None:
    (tmp_path / "model ").write_bytes(b"w")
    with pytest.raises(errors.InvalidURIError, match="%20"):
        parse_uri(f"{tmp_path}/model ")
    assert open(parse_uri(f"file://{tmp_path}/model%20").path, "rb").read() == b"w"


@pytest.mark.parametrize("uri", ["redis://h:7000/0?cluster=true", "rediss://h/5?cluster=1"])
def test_a_redis_cluster_path_of_digits_is_refused_with_spellings_that_keep_the_cluster(
        uri: str) -> None:
    """The spellings the refusal offers are copied as they are: they dropped
    ?cluster=true, and redis://h:7000/0?db=0 talked to one node of the cluster as a
    plain server (MOVED for most keys)."""
    with pytest.raises(errors.InvalidURIError) as info:
        parse_uri(uri)
    said = str(info.value)
    cluster = uri.rsplit("cluster=", 1)[1]
    n = uri.split("?")[0].rsplit("/", 1)[1]
    for spelling in (f"/KEY?db={n}&cluster={cluster}", f"/{n}?db=0&cluster={cluster}",
                     f"/?db={n}&cluster={cluster}"):
        assert spelling in said, said
    # and each one parses, naming the key it says it names
    base = uri.split("?")[0].rsplit("/", 1)[0]
    again = parse_uri(f"{base}/{n}?db=0&cluster={cluster}")
    assert (again.key, again.query) == (n, {"db": "0", "cluster": cluster})


def test_whitespace_at_the_ends_of_a_uri() -> None:
    """An S3 key may end in whitespace and S3 decodes no %20: that is its only spelling.
    Elsewhere (and before any URI) it is a stray, refused with how to name such a file."""
    assert parse_uri("s3://b/k ").key == "k "
    assert parse_uri("S3://b/dir/k\t").key == "dir/k\t"
    for stray in (" s3://b/k", "s3://b ", "/tmp/x ", "redis://h/k ",
                  "http://h/k ", "file:///tmp/x "):
        with pytest.raises(errors.InvalidURIError, match="whitespace"):
            parse_uri(stray)


@pytest.mark.parametrize("path", ["C:\\models\\m.tensors", "C:/models/m.tensors", "d:\\m.bin",
                                  "\\\\server\\share\\m.bin"])
def test_a_windows_path_is_said_to_be_one_where_it_is_not_found(path: str, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # A new user's Windows path names a file of that name in the current directory here.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(errors.NotFoundError, match="looks like a Windows path") as caught:
        tensorstream.deserialize(path, "cpu")
    assert str(tmp_path) in str(caught.value)  # where it looked


@pytest.mark.parametrize("path", ["/srv/models/m.tensors", "/tmp/ab:c/m", "/tmp/a\\b",
                                  "/tmp/model:v1/x"])
def test_a_posix_path_gets_no_windows_hint(path: str) -> None:
    assert windows_path_hint(path) == ""
