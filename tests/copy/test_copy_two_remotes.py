"""Copies between remote stores whose URIs differ only in what configures the connection:
a Redis database (``?db=N``) and the user of a URI (``redis://user:pw@host``). Real
redis-server on loopback; the engine in-process, as ``tensorstream.copy`` is called."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

import pytest

from fixtures_s3 import S3_BUCKET
from iam_users import iam_user_keys
from remote_destination import assert_left_as_it_was
from tensorstream.copy.engine import copy

MiB = 1 << 20


def _key() -> str:
    return f"cp2r-{secrets.token_hex(4)}"


def test_sources_in_two_redis_databases_are_each_read_from_their_own(
        tmp_path: Path, redis_server: Any) -> None:
    """Every source on one host shared the provider made first (one per host and port): the
    object of ``?db=2`` was read from database 1 and copied as if it were the one asked for."""
    key = _key()
    for db in (1, 2):
        with redis_server.client(db=db) as c:
            c.set(f"{key}/a.bin", f"a of database {db}".encode())
            c.set(f"{key}/b.bin", f"b of database {db}".encode())
    got = tmp_path / "out"
    r = copy([redis_server.url(f"{key}/a.bin", db=1), redis_server.url(f"{key}/b.bin", db=2)],
             str(got) + "/")
    assert r.ok, r.errors
    assert (got / "a.bin").read_bytes() == b"a of database 1"
    assert (got / "b.bin").read_bytes() == b"b of database 2"


def test_one_key_from_one_redis_database_into_another(redis_server: Any) -> None:
    """``cp redis://h/k?db=1 redis://h/k`` copies database 1's object into database 0: it
    was refused as "the same object" (one key, one host), or read from database 0."""
    key = f"{_key()}/m.bin"
    with redis_server.client(db=1) as c:
        c.set(key, b"from database 1")
    r = copy(redis_server.url(key, db=1), redis_server.url(key))
    assert r.ok, r.errors
    from tensorstream import open as ts_open
    with ts_open(redis_server.url(key)) as f:
        assert f.read() == b"from database 1"
    r = copy(redis_server.url(key, db=1), redis_server.url(key, db=1))
    assert not r.ok and "same object" in r.errors[0]  # the neighbour: still refused


def test_each_side_is_sent_its_own_redis_user(redis_server: Any) -> None:
    """``cp redis://reader:pw@h/src/k redis://writer:pw@h/dst/k``: both sides were sent the
    destination's user (the provider was shared by host and port), so a reader allowed only
    ``src/*`` and a writer allowed only ``dst/*`` failed with NOPERM."""
    key = _key()
    reader, writer = f"reader-{key}", f"writer-{key}"
    with redis_server.client() as c:
        c.execute_command("ACL", "SETUSER", reader, "on", ">rpw", f"~{key}/src/*", "+@all")
        c.execute_command("ACL", "SETUSER", writer, "on", ">wpw", f"~{key}/dst/*", "+@all")
        c.set(f"{key}/src/m.bin", b"weights")
    try:
        r = copy(redis_server.url(f"{key}/src/m.bin", user=reader, password="rpw"),
                 redis_server.url(f"{key}/dst/m.bin", user=writer, password="wpw"))
        assert r.ok, r.errors
        with redis_server.client() as c:
            assert c.exists(f"{key}/dst/m.bin")
    finally:
        with redis_server.client() as c:
            c.execute_command("ACL", "DELUSER", reader, writer)


@pytest.mark.parametrize("to", ["s3", "redis"])
def test_a_source_replaced_mid_copy_publishes_nothing_at_a_remote_destination(
        tensorstream_backend: Any, moto_s3: Any, redis_server: Any, to: str) -> None:
    """Each source backend (S3, HTTP, Redis) replaced after its first read, copied into S3
    and Redis one part at a time: the copy fails saying the source changed, the old object
    at the destination stays, and no multipart upload or staged chunk is left."""
    b = tensorstream_backend
    size = 12 * MiB
    b.put("m.bin", os.urandom(size))
    b.faults.replace_between_reads("m.bin", os.urandom(size))
    key = f"{_key()}/m.bin"
    old = b"the old object"
    if to == "s3":
        moto_s3.put(S3_BUCKET, key, old)
        dst, dst_options = f"s3://{S3_BUCKET}/{key}", moto_s3.options()
    else:
        redis_server.put(key, old)
        dst, dst_options = redis_server.url(key), {}
    r = copy(b.uri("m.bin"), dst, src_options=b.options, dst_options=dst_options,
             concurrency=1, part_size=5 * MiB)
    assert not r.ok and r.files == 0
    assert "changed" in r.errors[0], r.errors
    assert_left_as_it_was(to, key, old, moto_s3, redis_server)


def test_sync_between_s3_stores_skips_a_copy_whose_etag_has_another_part_layout(
        moto_s3: Any) -> None:
    """An object uploaded in one PUT (its ETag an MD5: boto3's put_object, a console upload)
    or in parts of another size (s5cmd's 50 MB, rclone's 5 MiB) gets an ETag of other parts
    when ``cp`` writes it in its own parts: ``sync`` compared the two ETags, found them
    different and copied the whole object again on every run. ETags of different part
    layouts say nothing; the dates decide then, as for ``aws s3 sync``. Comparable ETags
    (of one piece each) still decide: a changed source of the same size is copied."""
    from tensorstream.copy.select import unchanged
    from tensorstream.providers.base import ObjectInfo

    base = _key()
    moto_s3.put(S3_BUCKET, f"{base}/m/one-put.bin", os.urandom(20 * MiB))
    runs = []
    for _ in range(2):
        r = copy(f"s3://{S3_BUCKET}/{base}/m/", f"s3://{S3_BUCKET}/{base}/n/", recursive=True,
                 skip_unchanged=True, **moto_s3.options())
        assert r.ok, r.errors
        runs.append([o.status for o in r.outcomes])
    assert runs == [["copied"], ["skipped"]]

    def info(etag: str, mtime: float) -> ObjectInfo:
        return ObjectInfo(path="k", size=10, etag=etag, mtime=mtime)

    md5, other = '"' + "a" * 32 + '"', '"' + "b" * 32 + '"'
    parts3, parts3b = '"' + "c" * 32 + '-3"', '"' + "d" * 32 + '-3"'
    # Comparable ETags decide, whatever the dates.
    assert unchanged(info(md5, 1), info(md5, 0), same_kind=True)
    assert not unchanged(info(md5, 0), info(other, 1), same_kind=True)
    # Another layout, or parts whose sizes are unknown (the same count): the dates decide.
    assert unchanged(info(parts3, 0), info(parts3b, 1), same_kind=True)
    assert not unchanged(info(parts3, 2), info(parts3b, 1), same_kind=True)
    assert unchanged(info(md5, 0), info(parts3, 1), same_kind=True)
    assert not unchanged(info(md5, 2), info(parts3, 1), same_kind=True)
    assert unchanged(info('"' + "e" * 32 + '-2"', 0), info(parts3, 1), same_kind=True)


def _write_only_key(server: Any, bucket: str) -> dict[str, Any]:
    """Options with the keys of a new IAM user that may only put objects into ``bucket``
    (an upload-only key: no ListBucket, no GetObject)."""
    # Every object action but reads on the bucket's objects, nothing on the bucket itself
    # (no listing). AWS covers the multipart calls by s3:PutObject; moto names them apart.
    return server.options(**iam_user_keys(server, "writer", [
        {"Effect": "Allow", "Action": "s3:*", "Resource": f"arn:aws:s3:::{bucket}/*"},
        {"Effect": "Deny", "Action": "s3:GetObject", "Resource": f"arn:aws:s3:::{bucket}/*"}]))


def test_a_destination_key_that_may_only_put_objects_is_enough_for_cp(moto_s3: Any) -> None:
    """``cp SRC s3://drop/in/`` with an upload-only destination key (s3:PutObject, as a drop
    bucket hands out) failed as a whole, ``copy()`` raising PermissionDeniedError: the check
    that the bucket exists lists it, which such a key may not. ``aws s3 cp`` needs no more
    than PutObject; a listing refused now leaves the check to the upload itself."""
    drop = f"drop-{secrets.token_hex(4)}"
    moto_s3.create_bucket(drop)
    base = _key()
    small, large = os.urandom(1000), os.urandom(7 * MiB)  # one PUT; a multipart upload
    moto_s3.put(S3_BUCKET, f"{base}/s.bin", small)
    moto_s3.put(S3_BUCKET, f"{base}/l.bin", large)
    r = copy(f"s3://{S3_BUCKET}/{base}/", f"s3://{drop}/in/", recursive=True,
             src_options=moto_s3.options(), dst_options=_write_only_key(moto_s3, drop),
             part_size=5 * MiB)
    assert r.ok and r.files == 2, r.errors
    assert moto_s3.get(drop, "in/s.bin") == small and moto_s3.get(drop, "in/l.bin") == large
    # The neighbour: a key that may list still learns of a missing bucket before a byte is read.
    r = copy(f"s3://{S3_BUCKET}/{base}/s.bin", "s3://no-such-drop-bucket/in/",
             **moto_s3.options())
    assert not r.ok and "does not exist" in r.errors[0]


def test_one_store_is_told_by_the_endpoint_the_options_resolve_to(
        isolated_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What ``cp``/``sync`` take for one store (a same-object copy and ``sync --delete`` of
    SRC inside DST refused): a profile's ``endpoint_url`` in ~/.aws/config counts as the
    endpoint it names; a region or a key pair per side names no other store; one Redis
    server's two databases are two."""
    from tensorstream.copy.places import same_store
    from tensorstream.uri import parse_uri

    config = isolated_env / "aws-config"
    config.write_text("".join(f"[profile {name}]\nendpoint_url = http://127.0.0.1:{port}\n"
                              for name, port in (("here", 1111), ("there", 2222),
                                                 ("alias", 1111))))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    s3, other = parse_uri("s3://b/p/"), parse_uri("s3://c/p/")
    keys = {"s3_access_key_id": "AKIDEXAMPLE", "s3_secret_access_key": "x"}
    cases = [
        (s3, s3, {"s3_profile": "here"}, {"s3_profile": "there"}, False),
        (s3, s3, {"s3_profile": "here"}, {"s3_profile": "alias"}, True),
        (s3, s3, {"s3_profile": "here"}, {"s3_endpoint": "http://127.0.0.1:1111/"}, True),
        # one server however spelled: host case, the scheme's default port
        (s3, s3, {"s3_endpoint": "https://MinIO.example"},
         {"s3_endpoint": "https://minio.example:443/"}, True),
        (s3, s3, {"s3_endpoint": "http://minio.example"},
         {"s3_endpoint": "http://minio.example:443"}, False),
        (s3, s3, {}, {"s3_profile": "here"}, False),  # AWS and another endpoint
        (s3, s3, {"s3_region": "eu-west-1"}, keys, True),  # AWS both: bucket names are global
        # two buckets of one endpoint: one store (S3 copies between them); their objects
        # are told apart by bucket and key, so neither is taken for the other
        (s3, other, {}, {}, True),
        (s3, other, {}, {"s3_profile": "here"}, False),
        # AWS's own endpoint named on one side (as cp --help shows): AWS both, in any
        # region or form (sync --delete of a prefix under DST deleted its source)
        (s3, s3, {"s3_endpoint": "https://s3.amazonaws.com"}, {}, True),
        (s3, s3, {"s3_endpoint": "https://s3.us-east-1.amazonaws.com"},
         {"s3_endpoint": "https://s3-eu-west-1.amazonaws.com/"}, True),
        (s3, s3, {"s3_endpoint": "https://s3.dualstack.eu-west-1.amazonaws.com"}, {}, True),
        (s3, s3, {"s3_endpoint": "https://s3.amazonaws.com.evil.example"}, {}, False),
        (s3, s3, {"s3_endpoint": "https://s3express-use1-az4.us-east-1.amazonaws.com"}, {},
         False),
    ]
    redis = parse_uri("redis://127.0.0.1:6379/k")
    cases += [
        (redis, parse_uri("redis://127.0.0.1:6379/k?db=0"), {}, {"redis_password": "p"}, True),
        (redis, parse_uri("redis://127.0.0.1:6379/k?db=1"), {}, {}, False),
        (redis, redis, {}, {"redis_db": 1}, False),
        (redis, parse_uri("redis://127.0.0.1:6380/k"), {}, {}, False),
    ]
    for src, dst, src_options, dst_options, same in cases:
        assert same_store(src, dst, src_options, dst_options) is same, (
            src, dst, src_options, dst_options)


def test_one_store_is_decided_once_per_pair_not_per_object(
        moto_s3: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Resolving an S3 endpoint reads the AWS and s3cmd files (~0.8 ms): decided for every
    object, a 5,000-object ``sync`` with side options spent seconds planning."""
    import tensorstream.providers.s3.config as s3_config

    base = _key()
    for i in range(40):
        moto_s3.put(S3_BUCKET, f"{base}/m/{i}.bin", b"x")
    calls = []
    real = s3_config.resolve_s3_credentials

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(s3_config, "resolve_s3_credentials", counted)
    r = copy(f"s3://{S3_BUCKET}/{base}/m/", f"s3://{S3_BUCKET}/{base}/n/", recursive=True,
             dryrun=True, src_options={"retries": 4}, **moto_s3.options())
    assert r.ok and len(r.outcomes) == 40, r.errors
    assert len(calls) <= 6, len(calls)  # the providers' own, and one pair's
