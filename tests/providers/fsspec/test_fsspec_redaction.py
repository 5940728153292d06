"""Errors of the fsspec adapter name the object as a URI, redacted like every other
(``memory://u:***@h/x``): the adapter's paths carry no scheme, and a userinfo password in
them (``u:pw@h/x``) went out as it was, in the message, its context and its cause."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Callable
from typing import Any

import fsspec
import pytest

import tensorstream
from tensorstream import _loop, errors

SECRET = "canary-fsspec-pw-4Rz"


def _chain(exc: BaseException | None) -> str:
    text = ""
    while exc is not None:
        text += f"{type(exc).__name__}: {exc} {exc!r}\n"
        exc = exc.__cause__ or exc.__context__
    return text


@pytest.fixture
def base() -> str:
    """A fresh memory:// folder whose name holds user info with a password."""
    return f"memory://u:{SECRET}@h-{uuid.uuid4().hex[:8]}"


def _stat(uri: str) -> Any:
    with tensorstream.open(uri) as f:
        return f.size


def _rm(uri: str) -> None:
    async def go() -> None:
        async with tensorstream.get_provider(uri) as p:
            await p.delete(uri.split("://", 1)[1])

    _loop.run_sync(go())


@pytest.mark.parametrize("action", [_stat, _rm], ids=["open", "delete"])
def test_a_missing_object_is_named_redacted_with_its_scheme(
        base: str, action: Callable[[str], Any]) -> None:
    with pytest.raises(errors.NotFoundError) as info:
        action(f"{base}/x")
    text = _chain(info.value)
    assert SECRET not in text
    assert f"memory://u:***@{base.split('@')[1]}/x" in str(info.value)


def test_a_folder_opened_as_an_object_is_named_redacted(base: str) -> None:
    fs = fsspec.filesystem("memory")
    fs.pipe_file(f"{base.split('://')[1]}/dir/a", b"a")
    with pytest.raises(errors.NotFoundError, match="is a directory") as info:
        _stat(f"{base}/dir")
    assert SECRET not in _chain(info.value)
    assert "memory://u:***@" in str(info.value)


def test_an_object_is_still_read_and_written_under_such_a_name(base: str) -> None:
    """The neighbour: the name is the object's, secret and all; only what is shown hides it."""
    with tensorstream.open(f"{base}/y", "wb") as f:
        f.write(b"abc")
    with tensorstream.open(f"{base}/y") as f:
        assert f.read() == b"abc"
    assert fsspec.filesystem("memory").cat_file(f"{base.split('://')[1]}/y") == b"abc"


def test_the_cli_error_shows_the_uri_redacted() -> None:
    uri = f"memory://u:{SECRET}@h/nothing-here"
    proc = subprocess.run([sys.executable, "-m", "tensorstream", "cat", uri],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert SECRET not in proc.stderr + proc.stdout
    assert "memory://u:***@h/nothing-here" in proc.stderr, proc.stderr


def test_an_object_that_changed_while_read_is_named_redacted(base: str) -> None:
    fs = fsspec.filesystem("memory")
    path = f"{base.split('://')[1]}/z"
    fs.pipe_file(path, b"a" * 1000)
    with tensorstream.open(f"{base}/z", readahead=0, part_size=100) as f:
        assert f.read(100) == b"a" * 100
        fs.pipe_file(path, b"b" * 1001)
        with pytest.raises(errors.ObjectChangedError) as info:
            f.read(100)
    assert SECRET not in _chain(info.value)
    assert "memory://u:***@" in str(info.value)


def test_an_object_info_of_such_a_name_masks_the_password_in_its_repr(base: str) -> None:
    fs = fsspec.filesystem("memory")
    fs.pipe_file(f"{base.split('://')[1]}/w", b"w")

    async def stat() -> Any:
        async with tensorstream.get_provider(f"{base}/w") as p:
            return await p.stat(f"{base.split('://')[1]}/w")

    info = _loop.run_sync(stat())
    assert info.size == 1 and SECRET in info.path  # the name itself is the object's
    assert SECRET not in repr(info) and "u:***@h-" in repr(info)


@pytest.mark.parametrize("where", ["d", "f/g"], ids=["a folder", "under a file"])
def test_a_write_fsspec_refuses_keeps_its_type_and_names_the_uri_redacted(
        base: str, where: str) -> None:
    """fsspec's own IsADirectoryError/FileExistsError said ``/u:pw@h/d`` as it was."""
    fs = fsspec.filesystem("memory")
    root = base.split("://")[1]
    fs.pipe_file(f"{root}/f", b"f")
    fs.mkdir(f"{root}/d")
    with pytest.raises(OSError) as info:
        with tensorstream.open(f"{base}/{where}", "wb") as f:
            f.write(b"a")
    assert isinstance(info.value, IsADirectoryError | FileExistsError)
    assert SECRET not in _chain(info.value)
    # the name fsspec gave: the folder, or the file in the way of one
    assert f"memory://u:***@{base.split('@')[1]}/{where[0]}" in str(info.value)
