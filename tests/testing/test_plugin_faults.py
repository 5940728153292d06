"""Fault semantics the same on every backend: when a fault starts counting, what
it replaces with, and that nothing of one test's faults or objects reaches the next."""

from __future__ import annotations

import asyncio
import contextlib

import tensorstream
from tensorstream.errors import InvalidRangeError, ObjectChangedError

pytest_plugins = ["pytester"]

OLD, NEW = b"old!" * 1000, b"new!" * 1000


def read_once(backend, key: str, size: int) -> bytes:
    """One read of ``size`` bytes: one GET (one GETRANGE on Redis), no read-ahead."""
    return asyncio.run(tensorstream.read_range(backend.uri(key), 0, size, **backend.options))


def read_replacing(backend, key: str, size: int) -> None:
    """The read before which the object is replaced. What it gets depends on the
    backend (Redis has read the old manifest already: ObjectChangedError; a shorter
    new object: InvalidRangeError); the replacement is what the tests look at."""
    with contextlib.suppress(ObjectChangedError, InvalidRangeError):
        read_once(backend, key, size)


def test_replace_between_reads_counts_reads_from_when_it_is_set(tensorstream_backend):
    # On HTTP, reads made before the fault was set counted: a test that read the
    # object once (to check it) had it replaced before its next read, not the one after.
    b = tensorstream_backend
    b.put("k", OLD)
    assert read_once(b, "k", len(OLD)) == OLD
    assert read_once(b, "k", len(OLD)) == OLD
    b.faults.replace_between_reads("k", NEW)
    assert read_once(b, "k", len(OLD)) == OLD  # the first read after the fault: the old object
    assert b.get("k") == OLD
    read_replacing(b, "k", len(OLD))
    assert b.get("k") == NEW
    assert read_once(b, "k", len(NEW)) == NEW


def test_replace_between_reads_twice_in_one_test_replaces_twice(tensorstream_backend):
    # On HTTP the second fault never replaced anything (the first had been spent).
    b = tensorstream_backend
    b.put("k", OLD)
    b.faults.replace_between_reads("k", NEW)
    assert read_once(b, "k", len(OLD)) == OLD
    read_replacing(b, "k", len(OLD))
    assert b.get("k") == NEW
    b.faults.replace_between_reads("k", b"third")
    assert read_once(b, "k", len(NEW)) == NEW
    read_replacing(b, "k", len(NEW))
    assert b.get("k") == b"third"


def test_replace_between_reads_with_empty_bytes_empties_the_object(tensorstream_backend):
    # On HTTP, b"" (falsy) fell back to the default replacement, the old bytes inverted.
    b = tensorstream_backend
    b.put("k", OLD)
    b.faults.replace_between_reads("k", b"")
    assert read_once(b, "k", len(OLD)) == OLD
    read_replacing(b, "k", len(OLD))
    assert b.get("k") == b""
    with tensorstream.open(b.uri("k"), **b.options) as f:
        assert f.read() == b""


def test_a_request_still_in_flight_when_its_test_ends_does_not_reach_the_next(pytester):
    # A request the client gave up on (a timeout test's, under latency or a stall) went
    # on in the session's server once its test had ended: it took the next test's
    # scripted status, drop or hook, and showed up in that test's ``requests``.
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    pytester.makepyfile(test_stale="""
        import socket, time
        import pytest

        SENT = {}

        def gives_up_on_a_slow_request(b):
            b.faults.latency(3)
            port = b.proxy.port if b.name == "s3" else b.server.port
            with socket.create_connection(("127.0.0.1", port)) as s:
                s.sendall(b"HEAD /stale HTTP/1.1\\r\\nHost: 127.0.0.1\\r\\n\\r\\n")
                time.sleep(0.5)  # the server has it, and waits
            SENT[b.name] = time.monotonic()

        def starts_clean(b):
            b.faults.status_script([403])
            time.sleep(max(0.0, SENT[b.name] + 3.5 - time.monotonic()))  # past that latency
            assert b.faults.pending_statuses == [403]
            assert b.requests == []

        def test_s3_a(tensorstream_s3):
            gives_up_on_a_slow_request(tensorstream_s3)

        def test_s3_b(tensorstream_s3):
            starts_clean(tensorstream_s3)

        def test_http_a(tensorstream_http):
            gives_up_on_a_slow_request(tensorstream_http)

        def test_http_b(tensorstream_http):
            starts_clean(tensorstream_http)
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly", "-q",
                                           "-W", "error")
    result.assert_outcomes(passed=4)


def test_a_redis_command_still_held_back_when_its_test_ends_is_never_run(pytester):
    # The same on Redis: a command the TCP proxy held back under latency (its client
    # gave up) was sent on to Redis during the next test, and wrote there.
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    pytester.makepyfile(test_stale_redis="""
        import socket, time

        SENT = []

        def test_a_gives_up_on_a_slow_command(tensorstream_redis):
            tensorstream_redis.faults.latency(3)
            with socket.create_connection(("127.0.0.1", tensorstream_redis.proxy.port)) as s:
                s.sendall(b"*3\\r\\n$3\\r\\nSET\\r\\n$5\\r\\nstale\\r\\n$1\\r\\na\\r\\n")
                time.sleep(0.5)  # the proxy has it, and waits
            SENT.append(time.monotonic())

        def test_b_starts_clean(tensorstream_redis):
            time.sleep(max(0.0, SENT[0] + 3.5 - time.monotonic()))  # past that latency
            assert tensorstream_redis.client.get("stale") is None
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly", "-q",
                                           "-W", "error")
    result.assert_outcomes(passed=2)


def test_what_a_test_wrote_outside_its_namespace_is_gone_in_the_next(pytester):
    # Serving code in the environment mode writes where it likes (its own Redis key from
    # REDIS_URL, its own bucket): that stayed on the session's servers, so the next test
    # found the previous test's model, keys and buckets.
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    pytester.makepyfile(test_leftovers="""
        import os
        import boto3, redis
        import pytest
        import tensorstream

        def redis_uri(key):
            return f"{os.environ['REDIS_URL'].rsplit('/', 1)[0]}/{key}"

        @pytest.mark.tensorstream_redis(env=True)
        def test_redis_a(tensorstream_redis):
            with tensorstream.open(redis_uri("cache/model.bin"), "wb") as f:
                f.write(b"from a")
            redis.Redis.from_url(os.environ["REDIS_URL"]).set("plain", b"a")
            redis.Redis.from_url(os.environ["REDIS_URL"], db=3).set("other-db", b"a")

        @pytest.mark.tensorstream_redis(env=True)
        def test_redis_b(tensorstream_redis):
            with pytest.raises(FileNotFoundError):
                tensorstream.open(redis_uri("cache/model.bin"))
            assert redis.Redis.from_url(os.environ["REDIS_URL"]).keys() == []
            assert redis.Redis.from_url(os.environ["REDIS_URL"], db=3).keys() == []

        @pytest.mark.tensorstream_s3(env=True)
        def test_s3_a(tensorstream_s3):
            client = boto3.session.Session().client("s3")
            client.create_bucket(Bucket="models")
            client.put_object(Bucket="models", Key="m", Body=b"a")

        @pytest.mark.tensorstream_s3(env=True)
        def test_s3_b(tensorstream_s3):
            client = boto3.session.Session().client("s3")
            names = [b["Name"] for b in client.list_buckets()["Buckets"]]
            assert names == [tensorstream_s3.bucket]
            assert tensorstream_s3.create_bucket("models") == "models"
            assert client.list_objects_v2(Bucket="models").get("Contents", []) == []
    """)
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:randomly", "-q")
    result.assert_outcomes(passed=4)
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:randomly", "-q",
                                "--tensorstream-redis=fake", "-k", "redis")
    result.assert_outcomes(passed=2, deselected=2)


def test_s3_drop_after_cuts_downloads_not_a_multipart_uploads_answers(tensorstream_s3):
    # docs/testing.md: an upload is neither paced nor cut by the common faults. On S3 the
    # small XML answers of a multipart upload (CreateMultipartUpload: ~280 bytes) were
    # cut by drop_after(10), and the write failed ("cannot reach").
    b = tensorstream_s3
    data = bytes(range(256)) * (5 * 4096 + 1)  # just over 5 MiB: two parts of 5 MiB
    b.faults.drop_after(10, times=1)
    with tensorstream.open(b.uri("w"), "wb", part_size=5 << 20, **b.options) as f:
        f.write(data)
    assert b.get("w") == data
    assert [r.method for r in b.requests].count("POST") == 2  # a multipart upload it was
    assert b.faults.dropped == 0
    assert read_once(b, "w", len(data)) == data  # a download is cut (and resumed)
    assert b.faults.dropped == 1
