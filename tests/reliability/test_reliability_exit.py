"""Reliability: nothing a writer started outlives the process (issue 15, class 6).

A fresh interpreter opens an S3 writer on moto's server, writes enough for a multipart
upload (parts in flight), and exits without closing it: normally, by an uncaught
exception, and with the writer still referenced from a global (so no finaliser runs
before exit). The upload must be aborted while tensorstream's I/O loop is still alive:
``ListMultipartUploads`` shows nothing, and no object appears. The same for a local
writer's temporary file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fixtures_s3 import S3_BUCKET
from reliability_helpers import run_python, unique
from tensorstream.testing.http_server import HTTPTestServer
from tensorstream.testing.s3_server import MotoS3Server

pytestmark = [pytest.mark.usefixtures("isolated_env"), pytest.mark.timeout(180)]

ENDINGS = {
    "normal exit": "",
    "uncaught exception": "raise SystemExit('boom')",
    "error in main code": "raise RuntimeError('the application failed')",
}


def _uploads(server: MotoS3Server, key: str) -> list[dict[str, object]]:
    listing = server.client.list_multipart_uploads(Bucket=S3_BUCKET, Prefix=key)
    return list(listing.get("Uploads", []))


@pytest.mark.parametrize("ending", list(ENDINGS))
def test_an_s3_writer_open_at_exit_aborts_its_multipart_upload(
        moto_s3_public: MotoS3Server, ending: str) -> None:
    key = unique("exit")
    opts = moto_s3_public.options()
    out = run_python(f"""
        import tensorstream
        WRITER = tensorstream.open("s3://{S3_BUCKET}/{key}", "wb", **{opts!r})
        WRITER.write(b"x" * (12 << 20))  # two 5 MiB parts uploading, one filling
        WRITER._flush_pending()
        assert WRITER._writer.inner._upload_id is not None
        print("UPLOAD STARTED", flush=True)
        {ENDINGS[ending]}
    """, timeout=120)
    assert "UPLOAD STARTED" in out.stdout, out.stderr
    assert _uploads(moto_s3_public, key) == [], "the multipart upload outlived the process"
    keys = moto_s3_public.client.list_objects_v2(Bucket=S3_BUCKET, Prefix=key).get("KeyCount")
    assert keys == 0, "a half-written object was published"


def test_a_committed_s3_object_is_not_touched_at_exit(moto_s3_public: MotoS3Server) -> None:
    key = unique("exit-ok")
    opts = moto_s3_public.options()
    out = run_python(f"""
        import tensorstream
        W = tensorstream.open("s3://{S3_BUCKET}/{key}", "wb", **{opts!r})
        W.write(b"y" * (11 << 20))
        W.close()
    """, timeout=120)
    assert out.returncode == 0, out.stderr
    assert moto_s3_public.get(S3_BUCKET, key) == b"y" * (11 << 20)
    assert _uploads(moto_s3_public, key) == []


def test_a_local_writer_open_at_exit_leaves_no_temp_file(tmp_path: Path) -> None:
    folder = tmp_path / "dest"
    folder.mkdir()
    dest = folder / "model.tensors"
    out = run_python(f"""
        import tensorstream
        W = tensorstream.open({str(dest)!r}, "wb")
        W.write(b"z" * (9 << 20))
        W._flush_pending()
        print("WRITING", flush=True)
    """, timeout=60)
    assert "WRITING" in out.stdout, out.stderr
    assert sorted(p.name for p in folder.iterdir()) == []


def test_a_read_cut_short_by_the_exit_says_so(redis_server: object) -> None:
    """Daemon threads still reading (Redis: read-ahead on worker threads) when the
    interpreter exits: the process exits promptly, and a read that cannot go on says
    the interpreter is exiting. It said "reader was closed" of a reader nobody closed."""
    from tensorstream.testing.redis_server import RedisServer

    assert isinstance(redis_server, RedisServer)
    key = unique()
    redis_server.put(key, b"\x5a" * (32 << 20))
    code = r"""
import sys, threading, time
import tensorstream
def read():
    f = tensorstream.open(sys.argv[1])
    while True:
        f.seek(0)
        while f.read(1 << 20):
            pass
for _ in range(2):
    threading.Thread(target=read, daemon=True).start()
time.sleep(0.5)
print("exiting", flush=True)
"""
    for _ in range(3):
        proc = run_python(code, timeout=60, args=[redis_server.url(key)])
        assert proc.returncode == 0 and proc.stdout.strip() == "exiting", proc.stderr
        assert "reader was closed" not in proc.stderr, proc.stderr


_AFTER_MAIN = r"""
import sys, threading, time
import tensorstream
with tensorstream.open(sys.argv[1]) as f:  # the program used tensorstream already
    f.read(10)
def load():
    try:
        with tensorstream.open(sys.argv[1]) as f:
            f.read()
        print("loaded", flush=True)
    except BaseException as exc:
        print(f"{type(exc).__name__}: {exc}", flush=True)
threading.Thread(target=load, name="loader").start()  # not a daemon: Python waits for it
"""


@pytest.mark.parametrize("kind", ["local", "http"])
def test_a_load_in_a_thread_the_main_thread_did_not_wait_for_says_to_join_it(
        tmp_path: Path, http_server: HTTPTestServer, kind: str) -> None:
    """A thread that loads while the main thread returns (Python waits for it at exit,
    but its thread pools take no new work by then): the load fails with an error that
    says why and what to do. It was a bare RuntimeError of concurrent.futures or
    threading ("cannot schedule new futures after shutdown", "can't register atexit
    after shutdown")."""
    data = os.urandom(1 << 20)
    if kind == "local":
        (tmp_path / "m.bin").write_bytes(data)
        url = str(tmp_path / "m.bin")
    else:
        key = unique()
        http_server.put(key, data)
        url = http_server.url(key)
    proc = run_python(_AFTER_MAIN, timeout=60, args=[url])
    assert proc.returncode == 0, proc.stderr
    said = proc.stdout.strip()
    # (a load that starts before the main thread's exit begins simply succeeds)
    assert said == "loaded" or ("main thread" in said and "join()" in said), said
