"""The command line is parsed building only the command it names, with the result
(namespace, usage errors, help) of the whole tree."""

from __future__ import annotations

import argparse
import contextlib
import io
import shlex
from typing import Any

import pytest

from tensorstream.cli.main import COMMANDS, build_parser, parse_command_line

LINES = [
    "cp -r s3://a/ /tmp/x",
    "--endpoint-url http://h cp s3://a/b c",
    "sync --delete a s3://b/",
    "ls -l s3://x",
    "cat --range 0-3 s3://a/b",
    "rm -r --dryrun --exclude '*' s3://a/",
    "stat --json s3://a/b",
    "inspect --json x",
    "convert a b",
    "credentials --json s3://a/",
    "--profile prod credentials s3://a/",
    "--profile credentials ls s3://x",
    "credentials",
    "--debug cp a b",
    "cp --debug -q --no-verify a b c",
    # an option's value that is also a command's name
    "--profile cp ls s3://x",
    "--profile ls cp a b",
    "--profile rm --endpoint-url http://h cat s3://a/b",
    # usage errors: the same message and status
    "cp a",
    "cp",
    "cp --nope a b",
    "ls --recursiv s3://x",
    "nope a b",
    "--profile cp",
    "",
    "cp a b --range 0-3",
]


def _parse(parse: Any, argv: list[str]) -> tuple[object, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            got: object = vars(parse(argv))
        except SystemExit as exc:
            got = ("exit", exc.code)
    return got, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("line", LINES)
def test_the_same_namespace_and_errors_as_the_whole_tree(line: str) -> None:
    argv = shlex.split(line)
    assert _parse(parse_command_line, argv) == _parse(build_parser().parse_args, argv)


@pytest.mark.parametrize("line", ["--help", "cp --help", "cp -h", "ls --hel", "--version"])
def test_help_is_the_whole_tree(line: str) -> None:
    argv = shlex.split(line)
    got = _parse(parse_command_line, argv)
    assert got == _parse(build_parser().parse_args, argv)
    assert got[0] == ("exit", 0) and got[1]


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_only_the_named_command_is_built() -> None:
    whole = _subparsers(build_parser())
    for command in COMMANDS:
        built = _subparsers(build_parser(command))
        assert list(built) == list(whole)  # the same choices, in the same order
        for name, sub in built.items():
            flags = {s for a in sub._actions for s in a.option_strings}
            if name == command:
                assert flags == {s for a in whole[name]._actions for s in a.option_strings}
            else:
                assert not flags, (command, name)


def test_every_command_is_in_the_table() -> None:
    # `credentials` was missing from COMMANDS: its line built every command's parser
    # (and a word "credentials" elsewhere on a line was not taken as the command).
    assert list(COMMANDS) == list(_subparsers(build_parser()))
    assert _subparsers(build_parser("credentials"))  # builds, the others stood in


def test_credentials_builds_only_its_own_parser() -> None:
    built = _subparsers(build_parser("credentials"))
    with_options = [name for name, sub in built.items()
                    if {s for a in sub._actions for s in a.option_strings}]
    assert with_options == ["credentials"]
