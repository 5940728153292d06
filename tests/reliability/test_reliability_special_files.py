"""Reliability: opening something that is not a regular file never blocks (issue 15, class 2).

A FIFO with no writer, a Unix socket, a character device and a directory are refused at
once by every door that opens a local path: ``open``, ``stat``, ``read_range``, the
provider's unpinned reads, ``deserialize``'s local fast path, ``cp`` and the s3cmd config
file. Each call runs in a thread that must finish within a few seconds; a call that blocks
on the FIFO is released (by opening its write end) and fails the test."""

from __future__ import annotations

import os
import socket
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import tensorstream
from tensorstream import _loop, errors
from tensorstream.cli.main import main as cli_main

pytestmark = [pytest.mark.usefixtures("isolated_env"), pytest.mark.timeout(120)]


@pytest.fixture(params=["fifo", "socket", "chardev", "directory"])
def special(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    kind = request.param
    if kind == "fifo":
        path = tmp_path / "weights.fifo"
        os.mkfifo(path)
        yield path
    elif kind == "socket":
        path = tmp_path / "weights.sock"
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        sock.listen(1)
        yield path
        sock.close()
    elif kind == "chardev":
        yield Path("/dev/zero")  # endless zeros: read as a model it would never end
    else:
        path = tmp_path / "weights.d"
        path.mkdir()
        yield path


def _finishes(fn: Callable[[], Any], path: Path, seconds: float = 10) -> BaseException | None:
    """Run ``fn`` in a thread; return what it raised (None if it returned). Fails the
    test if it is still running after ``seconds`` (then unblocks a FIFO open)."""
    box: list[BaseException | None] = []

    def run() -> None:
        try:
            fn()
            box.append(None)
        except BaseException as exc:  # reported to the test
            box.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        if path.is_fifo():
            with open(path, "wb"):  # release the blocked open so the thread ends
                pass
        thread.join(5)
        pytest.fail(f"opening {path} blocked for more than {seconds}s")
    return box[0]


def _refused(exc: BaseException | None, path: Path) -> None:
    assert isinstance(exc, errors.TensorstreamError), repr(exc)
    assert isinstance(exc, OSError | ValueError)


def test_open_stat_and_read_range_refuse_at_once(special: Path) -> None:
    _refused(_finishes(lambda: tensorstream.open(str(special)).read(1), special), special)
    _refused(_finishes(lambda: _loop.run_sync(tensorstream.stat(str(special))), special),
             special)
    _refused(_finishes(
        lambda: _loop.run_sync(tensorstream.read_range(str(special), 0, 1)), special), special)


def test_unpinned_provider_read_refuses_without_a_prior_stat(special: Path) -> None:
    async def read() -> None:
        async with tensorstream.get_provider(str(special.parent)) as provider:
            buf = memoryview(bytearray(8))
            await provider.readinto(str(special), 0, buf)

    _refused(_finishes(lambda: _loop.run_sync(read()), special), special)


def test_deserialize_local_fast_path_refuses_at_once(special: Path) -> None:
    pytest.importorskip("tensorizer")
    for kwargs in ({}, {"lazy_load": True, "num_readers": 2}):
        _refused(_finishes(lambda kw=kwargs: tensorstream.deserialize(  # type: ignore[misc]
            str(special), device="cpu", **kw), special), special)


def test_cp_from_a_special_file_fails_without_blocking(special: Path, tmp_path: Path) -> None:
    dest = tmp_path / "out.bin"
    code: list[int] = []
    exc = _finishes(lambda: code.append(cli_main(["cp", str(special), str(dest)])), special)
    assert exc is None and code and code[0] != 0
    assert not dest.exists()


def test_a_fifo_or_device_destination_is_never_replaced(tmp_path: Path) -> None:
    fifo = tmp_path / "dest.fifo"
    os.mkfifo(fifo)

    def write() -> None:
        with tensorstream.open(str(fifo), "wb") as f:
            f.write(b"weights")

    exc = _finishes(write, fifo)
    assert isinstance(exc, errors.TensorstreamError) and "not a regular file" in str(exc)
    assert fifo.is_fifo()


def test_s3cmd_config_that_is_a_fifo_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "s3cfg"
    os.mkfifo(fifo)
    exc = _finishes(lambda: tensorstream.open("s3://bucket/key", s3_config_path=str(fifo),
                                              s3_endpoint="http://127.0.0.1:9"), fifo)
    assert isinstance(exc, errors.ConfigurationError) and "s3_config_path" in str(exc)


@pytest.mark.parametrize("variable", ["SSL_CERT_FILE", "REQUESTS_CA_BUNDLE"])
def test_a_ca_bundle_from_the_environment_that_is_a_fifo_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variable: str) -> None:
    fifo = tmp_path / "ca.pem"
    os.mkfifo(fifo)
    monkeypatch.setenv(variable, str(fifo))
    exc = _finishes(lambda: tensorstream.open("https://127.0.0.1:9/model.tensors"), fifo)
    assert isinstance(exc, errors.ConfigurationError) and "not a regular file" in str(exc)


@pytest.mark.parametrize("command", ["cp", "sync"])
def test_special_files_in_a_source_folder_are_named_by_kind_and_skipped(
        command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # As aws s3 sync ("Skipping file ... File is character special device, block special
    # device, FIFO, or socket", exit 2): never opened, nothing of them at DST; exit 3
    # (partial), as for every object skipped for a problem.
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    (src / "a.bin").write_bytes(b"weights")
    os.mkfifo(src / "f.fifo")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(src / "s.sock"))
    kinds = {"f.fifo": "a FIFO", "s.sock": "a socket"}
    try:
        os.mknod(src / "zero.chr", 0o600 | stat.S_IFCHR, os.makedev(1, 5))
        os.mknod(src / "loop.blk", 0o600 | stat.S_IFBLK, os.makedev(7, 0))
        kinds.update({"zero.chr": "a character device", "loop.blk": "a block device"})
    except PermissionError:
        pass  # (not root: FIFO and socket only)
    (src / "z.link").symlink_to(src / "f.fifo")  # followed: what it leads to is named
    kinds["z.link"] = "a FIFO"
    code: list[int] = []
    args = [command, str(src), str(dst)] + (["--recursive"] if command == "cp" else [])
    try:
        exc = _finishes(lambda: code.append(cli_main(args)), src / "f.fifo")
    finally:
        sock.close()
    assert exc is None and code == [3]
    err = capsys.readouterr().err
    for name, kind in kinds.items():
        assert f"skipped {src / name}: {kind} (not a regular file)" in err, err
    assert sorted(p.name for p in dst.iterdir()) == ["a.bin"]
