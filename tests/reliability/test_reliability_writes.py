"""Reliability: the write path under hostile use (adversarial review of writes).

``tensorstream.open(uri, "wb")`` promises an atomic object: every byte written
by the process that opened it, published by its ``close()``, or nothing. These
tests attack that promise where the caller's own process does something odd
(``os.fork()`` with a writer open), against real servers on loopback (local
disk, moto's S3 server, Debian's ``redis-server``)."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import tensorstream
import tensorstream.safetensors
from fixtures_s3 import S3_BUCKET
from reliability_helpers import run_python, unique
from tensorstream import errors
from tensorstream.testing.redis_server import RedisServer
from tensorstream.testing.s3_server import MotoS3Server

pytestmark = [pytest.mark.usefixtures("isolated_env"), pytest.mark.timeout(180)]


def _local(tmp_path: Path, request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    return str(tmp_path / unique("fork")), {}


def _s3(tmp_path: Path, request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    server: MotoS3Server = request.getfixturevalue("moto_s3_public")
    return f"s3://{S3_BUCKET}/{unique('fork')}", server.options()


def _redis(tmp_path: Path, request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    server: RedisServer = request.getfixturevalue("redis_server")
    return server.url(unique("fork")), {}


BACKENDS: dict[str, Callable[[Path, pytest.FixtureRequest], tuple[str, dict[str, Any]]]] = {
    "local": _local, "s3": _s3, "redis": _redis,
}

# The parent has bytes out (a temp file, parts uploading, chunks staged), forks
# three children that each misuse the inherited writer, then finishes its write.
_FORK_CODE = r"""
import json, os, sys
import tensorstream
import tensorstream.safetensors

uri, opts = sys.argv[1], json.loads(sys.argv[2])
A, B = b"a" * (9 << 20), b"b" * (3 << 20)

def visible():
    try:
        return tensorstream.open(uri, **opts).size
    except FileNotFoundError:
        return None

def child(act, exit=os._exit):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        out = {}
        try:
            act(out)
        except BaseException as exc:
            out["error"] = f"{type(exc).__name__}: {exc}"
        os.write(w, json.dumps(out).encode())
        exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    got = json.loads(os.read(r, 1 << 16) or b"{}")
    got["visible"] = visible()
    return got

def attempt(out, name, fn):
    try:
        fn()
        out[name] = "ok"
    except Exception as exc:
        out[name] = type(exc).__name__

f = tensorstream.open(uri, "wb", **opts)
f.write(A)
f._flush_pending()  # the parent's bytes are out: temp file, parts, staged chunks

def write_then_close(out):
    attempt(out, "write", lambda: (f.write(b"c" * (9 << 20)), f._flush_pending()))
    attempt(out, "close", f.close)

def abort(out):
    attempt(out, "abort", f.abort)

def leave_with_block(out):
    # A child that runs on through the parent's `with` block, left by an
    # exception (an abort), then exits normally with a loop of its own running
    # (its exit aborts the writers still open).
    tensorstream.open(tensorstream.__file__).close()
    try:
        with f:
            raise RuntimeError("the child is done")
    except RuntimeError:
        out["left"] = True

results = {"close": child(write_then_close), "abort": child(abort),
           "exit": child(leave_with_block, exit=sys.exit)}
f.write(B)
f.close()
with tensorstream.open(uri, **opts) as r:
    data = r.read()
results["final"] = [len(data), data == A + B]
print(json.dumps(results))
"""


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_a_forked_child_never_publishes_or_discards_the_parents_writer(
        backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """``os.fork()`` with a writer open: the child's ``close()`` published the
    parent's object half-written (local: the parent's temp file renamed under the
    parent, whose ``close`` then failed; S3: a ``PutObject`` of the bytes buffered
    so far), and its ``abort``/exit deleted the parent's staged Redis chunks.
    Now a writer is its opener's: in a child, ``write``/``close`` raise
    ``UnsupportedOperationError`` and ``abort`` (or leaving a ``with`` block)
    only lets go of the child's copy; the parent publishes exactly its bytes."""
    uri, opts = BACKENDS[backend](tmp_path, request)
    proc = run_python(_FORK_CODE, timeout=150, args=[uri, json.dumps(opts)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["close"] == {"write": "UnsupportedOperationError",
                            "close": "UnsupportedOperationError", "visible": None}, out
    assert out["abort"] == {"abort": "ok", "visible": None}, out
    assert out["exit"] == {"left": True, "visible": None}, out
    assert out["final"] == [(12 << 20), True], out
    if backend == "s3":
        server: MotoS3Server = request.getfixturevalue("moto_s3_public")
        key = uri.split("/", 3)[3]
        uploads = server.client.list_multipart_uploads(Bucket=S3_BUCKET, Prefix=key)
        assert not uploads.get("Uploads"), "a multipart upload was left behind"


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_serialize_never_replaces_a_fifo_or_a_directory_at_a_local_destination(
        tmp_path: Path, kind: str) -> None:
    """``tensorstream.serialize`` to a local path renamed its temp file over a FIFO
    (the node was gone, replaced by a regular file), and onto a directory failed
    only after every tensor was written, with a bare ``IsADirectoryError``. As the
    local writer: refused by name before anything is written, left as it was."""
    (tmp_path / "out").mkdir()
    dest = tmp_path / "out" / "model.tensors"
    if kind == "fifo":
        os.mkfifo(dest)
    else:
        dest.mkdir()
    with pytest.raises(errors.TensorstreamError,
                       match="not a regular file" if kind == "fifo" else "is a directory"):
        tensorstream.serialize({"w": torch.arange(8.0)}, str(dest))
    assert (dest.is_fifo() if kind == "fifo" else dest.is_dir())
    assert os.listdir(tmp_path / "out") == ["model.tensors"], "a temp file was left behind"


_UMASK_CODE = r"""
import json, os, sys
import torch
import tensorstream
import tensorstream.safetensors
import tensorstream.safetensors

d = sys.argv[1]
os.umask(0o077)  # private files (this fresh interpreter only)
sd = {"w": torch.arange(8.0)}
modes = {}
with tensorstream.open(os.path.join(d, "raw.bin"), "wb") as f:
    f.write(b"weights")
tensorstream.serialize(sd, os.path.join(d, "model.tensors"))
tensorstream.safetensors.save(sd, os.path.join(d, "model.safetensors"))
tensorstream.convert(os.path.join(d, "model.tensors"), os.path.join(d, "conv.safetensors"))
tensorstream.convert(os.path.join(d, "model.safetensors"), os.path.join(d, "conv.tensors"))
for name in sorted(os.listdir(d)):
    modes[name] = oct(os.stat(os.path.join(d, name)).st_mode & 0o777)
print(json.dumps(modes))
"""


def test_local_serialize_and_convert_keep_the_umask(tmp_path: Path) -> None:
    """Under umask 077, ``open(path, "wb")`` and ``safetensors.save`` made 0600 files,
    but ``serialize`` and ``convert`` to a local path chmod-ed theirs to 0644: a
    model meant to be private was readable by every user. Every local write now
    gives 0666 less the umask."""
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    proc = run_python(_UMASK_CODE, timeout=120, args=[str(out_dir)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    modes = json.loads(proc.stdout.strip().splitlines()[-1])
    assert modes == dict.fromkeys(["conv.safetensors", "conv.tensors", "model.safetensors",
                                   "model.tensors", "raw.bin"], "0o600"), modes


def _write_bytes(uri: str, **opts: Any) -> None:
    with tensorstream.open(uri, "wb", **opts) as f:
        f.write(b"weights")


_WRITERS: dict[str, Callable[..., object]] = {
    "open": _write_bytes,
    "safetensors.save": lambda uri, **o: tensorstream.safetensors.save({"w": torch.ones(2)}, uri,
                                                                        **o),
    "serialize": lambda uri, **o: tensorstream.serialize({"w": torch.ones(2)}, uri, **o),
}


@pytest.mark.parametrize("how", list(_WRITERS))
@pytest.mark.parametrize("form", ["{d}/newname/", "file://{d}/newname/", "{d}/newname/."])
def test_a_local_destination_that_names_a_directory_is_refused(
        tmp_path: Path, how: str, form: str) -> None:
    """``open("dir/newname/", "wb")`` (and ``save``, ``serialize``) wrote a *file*
    named ``newname``: the path was made absolute, which drops the slash. A path
    ending in ``/`` (or ``/.``) names a directory, as ``builtins.open`` says
    (``IsADirectoryError``): it is refused by name and nothing is created."""
    out = tmp_path / "out"
    out.mkdir()
    uri = form.format(d=out)
    with pytest.raises(errors.TensorstreamError, match="names a directory"):
        _WRITERS[how](uri)
    assert os.listdir(out) == []


@pytest.mark.parametrize("how", list(_WRITERS))
@pytest.mark.parametrize("form", ["s3-folder", "redis-folder", "redis-no-key"])
def test_a_remote_destination_that_names_a_folder_is_refused(
        request: pytest.FixtureRequest, how: str, form: str) -> None:
    """``open("s3://b/dir/", "wb")`` (and ``save``, ``serialize``) wrote an object
    under the key ``dir/``, which listings and ``cp -r`` take for a folder;
    ``redis://host/`` wrote one under the empty key. Refused by name, as a local
    directory is; nothing is created."""
    if form == "s3-folder":
        s3: MotoS3Server = request.getfixturevalue("moto_s3_public")
        prefix = unique("folder")
        uri, opts = f"s3://{S3_BUCKET}/{prefix}/", s3.options()
    else:
        redis: RedisServer = request.getfixturevalue("redis_server")
        prefix = unique("folder") if form == "redis-folder" else ""
        uri, opts = redis.url(f"{prefix}/" if prefix else ""), {}
    with pytest.raises(errors.InvalidURIError, match="names a folder"):
        _WRITERS[how](uri, **opts)
    if form == "s3-folder":
        assert not s3.exists(S3_BUCKET, f"{prefix}/")
    else:
        with redis.client() as c:
            assert c.exists(f"{prefix}/" if prefix else "") == 0


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_concurrent_writes_from_threads_each_land_whole(
        backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Four threads write to one writer at once. Each ``write`` call's bytes must
    land together, as with ``builtins.open(..., "wb")`` (a buffered file holds a
    lock): two flushes ran in the provider at once and interleaved (S3: parts
    filled from both; Redis: chunks), so a write's bytes were split by another's."""
    block = (1 << 20) + 13  # not a multiple of any part or chunk size
    uri, opts = BACKENDS[backend](tmp_path, request)
    f = tensorstream.open(uri, "wb", **opts)
    failures: list[BaseException] = []

    def worker(tag: int) -> None:
        try:
            for i in range(8):
                f.write(bytes([tag * 16 + i]) * block)
        except BaseException as exc:  # seen by the assertion below
            failures.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    f.close()
    assert not failures, failures
    with tensorstream.open(uri, **opts) as r:
        data = r.read()
    assert len(data) == 32 * block
    seen = set()
    for pos in range(0, len(data), block):
        piece = data[pos:pos + block]
        assert piece.count(piece[0]) == block, f"a write was split at byte {pos}"
        seen.add(piece[0])
    assert seen == {t * 16 + i for t in range(4) for i in range(8)}


def test_a_new_key_file_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    """A key file that ``serialize`` (``Encryption(keyfile=...)`` that does not exist
    yet) or ``generate_keyfile`` writes was 0644 under the usual umask 022: every
    local user could read the key that encrypts the model. It is 0600 now, as
    ``ssh-keygen`` writes private keys; the model file keeps 0666 less the umask."""
    from tensorstream._umask import current_umask
    from tensorstream.tensorizer import Encryption, generate_keyfile

    out = tmp_path / "out"
    out.mkdir()
    sd = {"w": torch.arange(4.0)}
    tensorstream.serialize(sd, str(out / "m.tensors"),
                           encryption=Encryption(keyfile=str(out / "new.key")))
    generate_keyfile(str(out / "gen.key"))
    assert (out / "new.key").stat().st_mode & 0o777 == 0o600
    assert (out / "gen.key").stat().st_mode & 0o777 == 0o600
    assert (out / "m.tensors").stat().st_mode & 0o777 == 0o666 & ~current_umask()
    back = tensorstream.deserialize(str(out / "m.tensors"),
                                    encryption=Encryption(keyfile=str(out / "new.key")))
    assert torch.equal(back["w"], sd["w"])
