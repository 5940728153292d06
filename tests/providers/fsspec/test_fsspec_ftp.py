"""An fsspec protocol whose filesystem takes its host from the URL (``ftp://``), against a
real FTP server on loopback (pyftpdlib): every URI failed with ``FTPFileSystem.__init__()
missing 'host'`` (the adapter passed fsspec only storage_options, not the URL's parts)."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

import tensorstream
from tensorstream import errors

with warnings.catch_warnings():  # pyftpdlib imports asyncore/asynchat (deprecated in 3.11)
    warnings.simplefilter("ignore", DeprecationWarning)
    pytest.importorskip("pyftpdlib")
    from pyftpdlib.authorizers import DummyAuthorizer
    from pyftpdlib.handlers import FTPHandler
    from pyftpdlib.servers import FTPServer

PASSWORD = "canary-ftp-pw-8Lm"


@pytest.fixture
def ftp(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """``ftp://u:PASSWORD@127.0.0.1:PORT`` serving ``tmp_path/root``, and that folder."""
    root = tmp_path / "root"
    root.mkdir()
    authorizer = DummyAuthorizer()
    authorizer.add_user("u", PASSWORD, str(root), perm="elradfmwMT")
    handler = type("Handler", (FTPHandler,), {"authorizer": authorizer})
    logging.getLogger("pyftpdlib").setLevel(logging.WARNING)
    server = FTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever,
                              kwargs={"timeout": 0.05, "handle_exit": False}, daemon=True)
    thread.start()
    try:
        yield f"ftp://u:{PASSWORD}@127.0.0.1:{server.address[1]}", root
    finally:
        server.close_all()
        thread.join(10)


def test_an_object_is_written_read_listed_and_deleted(ftp: tuple[str, Path]) -> None:
    base, root = ftp
    data = bytes(range(256)) * 40
    with tensorstream.open(f"{base}/d/a.bin", "wb") as f:
        f.write(data)
    assert (root / "d" / "a.bin").read_bytes() == data
    (root / "d" / "b.bin").write_bytes(b"b")
    with tensorstream.open(f"{base}/d/a.bin") as f:
        assert f.size == len(data)
        assert f.read() == data

    async def listing_and_delete() -> list[tuple[str, int]]:
        async with tensorstream.get_provider(f"{base}/d/") as p:
            infos = [o async for o in p.list(f"{base.split('://')[1]}/d/")]
            # the listed name holds the user info: its repr masks the password
            assert PASSWORD not in repr(infos) and "u:***@127.0.0.1" in repr(infos)
            found = [(o.path, o.size) for o in infos]
            # a listed name is read and deleted as it is listed (the host kept)
            assert (await p.stat(found[1][0])).size == 1
            await p.delete(found[1][0])
            return found

    from tensorstream import _loop

    found = _loop.run_sync(listing_and_delete())
    host = base.split("://")[1]
    assert found == [(f"{host}/d/a.bin", len(data)), (f"{host}/d/b.bin", 1)]
    assert not (root / "d" / "b.bin").exists()


def test_a_missing_object_is_not_found_and_named_redacted(ftp: tuple[str, Path]) -> None:
    base, _ = ftp
    with pytest.raises(errors.NotFoundError) as info:
        tensorstream.open(f"{base}/nothing")
    assert PASSWORD not in str(info.value) and PASSWORD not in repr(info.value)
    assert "ftp://u:***@127.0.0.1:" in str(info.value)


def test_the_cli_copies_to_and_from_ftp(ftp: tuple[str, Path], tmp_path: Path) -> None:
    base, root = ftp
    src = tmp_path / "m.bin"
    src.write_bytes(b"m" * 5000)
    for args in (["cp", str(src), f"{base}/m.bin"],
                 ["cp", f"{base}/m.bin", str(tmp_path / "back.bin")]):
        proc = subprocess.run([sys.executable, "-m", "tensorstream", *args],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert PASSWORD not in proc.stdout + proc.stderr
    assert (root / "m.bin").read_bytes() == (tmp_path / "back.bin").read_bytes() == b"m" * 5000
    # many files at once (cp -r, sync): one connection, its transfers one at a time; they
    # failed in parallel on FTPFileSystem's one control connection
    tree = tmp_path / "tree"
    for i in range(6):
        (tree / f"s{i % 2}").mkdir(parents=True, exist_ok=True)
        (tree / f"s{i % 2}" / f"f{i}.bin").write_bytes(bytes([i]) * (1000 + i))
    for args in (["cp", "-r", f"{tree}/", f"{base}/t/"], ["sync", f"{tree}/", f"{base}/u/"],
                 ["cp", "-r", f"{base}/t/", f"{tmp_path}/back/"]):
        proc = subprocess.run([sys.executable, "-m", "tensorstream", *args],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
    for copy in (root / "t", root / "u", tmp_path / "back"):
        got = {p.relative_to(copy): p.read_bytes() for p in copy.rglob("*") if p.is_file()}
        assert got == {p.relative_to(tree): p.read_bytes() for p in tree.rglob("*")
                       if p.is_file()}, copy
    proc = subprocess.run([sys.executable, "-m", "tensorstream", "ls", f"{base}/"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert PASSWORD not in proc.stdout + proc.stderr
    assert "m.bin" in proc.stdout, proc.stdout


def test_a_server_that_cannot_be_reached_is_one_clear_line(tmp_path: Path) -> None:
    """Nothing listens on the port: a connection error naming the URI (redacted), not a
    traceback (nor the 'Exception ignored' of FTPFileSystem's finalizer)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    src = tmp_path / "a.bin"
    src.write_bytes(b"a")
    proc = subprocess.run([sys.executable, "-m", "tensorstream", "cp", str(src),
                           f"ftp://u:{PASSWORD}@127.0.0.1:{port}/y"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "could not connect" in lines[0], lines
    assert f"ftp://u:***@127.0.0.1:{port}" in lines[0] and PASSWORD not in proc.stderr


def test_a_wrong_password_is_refused_without_showing_it(ftp: tuple[str, Path]) -> None:
    base, _ = ftp
    with pytest.raises(errors.TensorstreamError) as info:
        tensorstream.open(base.replace(PASSWORD, "wrong-pw-3Qa") + "/x")
    assert "wrong-pw-3Qa" not in str(info.value) and PASSWORD not in str(info.value)
