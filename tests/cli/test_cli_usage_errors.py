"""Usage errors quote no secret (``tensorstream/cli/usage_errors.py``): argparse echoed what it
could not take, a mistyped secret option's value or a storage option's URI included."""

from __future__ import annotations

import shlex

import pytest

from tensorstream.cli.main import main

SECRET = "CANARY-s3cr3t-v4lu3"


@pytest.mark.parametrize("line", [
    f"cp --tokn={SECRET} a b",                      # unrecognized arguments: --tokn=<secret>
    f"cp a b --s3-secret-acess-key {SECRET}",       # unrecognized arguments: ... <secret>
    f"cp --s3-s={SECRET} a b",                      # ambiguous option: --s3-s=<secret> could match
    f"--s3-s={SECRET} cp a b",
    f"cp --s3-session-tokenx={SECRET} a b",
    f"--src-endpoint-url http://u:{SECRET}@h cp a b",   # invalid choice: 'http://u:<secret>@h'
    f"--redis-pasword {SECRET} cp a b",                 # invalid choice: '<secret>'
    f"cat --tokn {SECRET} s3://b/k",
    f"stat --head={SECRET} s3://b/k",                   # an abbreviation of --header
    f"ls --header 'X-Api-Key: {SECRET}' --bogus s3://b/",
    f"cp a b --tokn -{SECRET}",                      # a value starting with '-' (url-safe)
    f"--tokn -{SECRET} cp a b",
    f"cp a b --s3-secret-acess-key -{SECRET} --bogus",
    f"stat s3://b/k -- --token={SECRET}",           # no place for it after '--': echoed
    f"stat s3://b/k -- --tokn {SECRET}",
    f"stat -- s3://b/k --tokn={SECRET}",
])
def test_a_usage_error_never_quotes_a_secret(line: str, capsys: pytest.CaptureFixture[str]) -> None:
    """argparse printed ``unrecognized arguments: --tokn=<token>``, ``ambiguous option:
    --s3-s=<secret> could match ...`` and ``invalid choice: 'http://u:<password>@h'``."""
    assert main(shlex.split(line)) == 2
    out, err = capsys.readouterr()
    assert "error:" in err and SECRET not in out + err


@pytest.mark.parametrize(("line", "shown"), [
    ("cp --part-size 8X a b", "'8X'"),
    ("cp a b c --jobs=many", "'many'"),
    ("stat a b c", "unrecognized arguments: b c"),
    ("nosuch x", "invalid choice: 'nosuch'"),
    ("cp --dryrun=yes a b", "ignored explicit argument 'yes'"),
    # the word after an unknown option is kept where it is an option of the command
    ("cp a b --bogus --recursive --nosuch", "unrecognized arguments: --bogus --nosuch"),
    ("stat a -- b c", "unrecognized arguments: b c"),
])
def test_a_usage_error_still_shows_what_was_wrong(line: str, shown: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(shlex.split(line)) == 2
    assert shown in capsys.readouterr().err
