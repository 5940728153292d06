"""An fsspec protocol that cannot be set up fails with a ConfigurationError that
says what to do, without chaining the filesystem's own message (it may quote
option values)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import fsspec
import pytest
from fsspec.spec import AbstractFileSystem

import tensorstream
from tensorstream import errors

SECRET = "canary-fsspec-secret-7Qx"


class _NeedsHost(AbstractFileSystem):
    protocol = "tsneedshost"

    def __init__(self, host: str, **kwargs: object) -> None:
        super().__init__(**kwargs)


class _RefusesValue(AbstractFileSystem):
    protocol = "tsrefuses"

    def __init__(self, token: str = "", **kwargs: object) -> None:
        raise ValueError(f"bad token {token!r}")


@pytest.fixture(autouse=True)
def _protocols() -> None:
    fsspec.register_implementation("tsneedshost", _NeedsHost, clobber=True)
    fsspec.register_implementation("tsrefuses", _RefusesValue, clobber=True)
    fsspec.register_implementation("tsmissingpkg", "tensorstream_no_such_module.FS",
                                   clobber=True, errtxt="install tensorstream-no-such-module")


def _chain(exc: BaseException | None) -> str:
    text = ""
    while exc is not None:
        text += f"{type(exc).__name__}: {exc}\n"
        exc = exc.__cause__ or exc.__context__
    return text


def test_a_protocol_whose_package_is_missing_names_it() -> None:
    with pytest.raises(errors.ConfigurationError, match="needs a package") as info:
        tensorstream.open("tsmissingpkg://bucket/key", "rb")
    assert "tensorstream-no-such-module" in str(info.value)


def test_a_filesystem_missing_an_option_says_which_and_how_to_pass_it() -> None:
    with pytest.raises(errors.ConfigurationError, match="storage_options") as info:
        tensorstream.open("tsneedshost://bucket/key", "rb")
    assert "host" in str(info.value)
    assert not isinstance(info.value.__cause__, TypeError)


def test_a_refused_option_value_never_reaches_the_error() -> None:
    with pytest.raises(errors.ConfigurationError) as info:
        tensorstream.open("tsrefuses://bucket/key", "rb",
                          storage_options={"token": SECRET})
    assert SECRET not in _chain(info.value)
    assert SECRET not in repr(info.value)


def test_a_filesystem_that_fails_to_start_prints_no_finalizer_traceback(
        tmp_path: Path) -> None:
    """``cp FILE ftp:///y``: FTPFileSystem's __init__ fails (no host), then its __del__
    raises AttributeError, which Python printed as 'Exception ignored in ...' and a
    traceback above the one-line refusal. Now the refusal is the only output."""
    src = tmp_path / "a.bin"
    src.write_bytes(b"a")
    proc = subprocess.run([sys.executable, "-m", "tensorstream", "cp", str(src), "ftp:///y"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "could not set up the ftp:// filesystem" in lines[0], lines


class _FailsOtherwise(AbstractFileSystem):
    protocol = "tsfailsotherwise"

    def __init__(self, **kwargs: object) -> None:
        raise RuntimeError("no")


@pytest.mark.parametrize("uri", ["tsneedshost://bucket/key", "tsrefuses://bucket/key",
                                 "tsfailsotherwise://bucket/key"])
def test_a_set_up_error_says_fsspec_once(uri: str) -> None:
    """The message read ``fsspec: fsspec could not set up the ...`` (the service's prefix
    and the message's own word): one prefix now, for each way a set-up fails."""
    fsspec.register_implementation("tsfailsotherwise", _FailsOtherwise, clobber=True)
    with pytest.raises(errors.ConfigurationError) as info:
        tensorstream.open(uri, "rb")
    assert str(info.value).startswith("fsspec: could not set up the ts"), str(info.value)
    assert str(info.value).count("fsspec") == 1, str(info.value)
