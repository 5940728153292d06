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
    f"sync --size-only={SECRET} a b",               # another tool's flag, given a value
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


@pytest.mark.parametrize(("line", "shown"), [
    ("cp --dry-run a b", "unrecognized arguments: --dry-run (did you mean --dryrun?)"),
    ("cp --recusive s3://b/p/ out/", "unrecognized arguments: --recusive (did you mean "
                                     "--recursive?)"),
    ("ls --log s3://b/", "unrecognized arguments: --log (did you mean --long?)"),
    ("cp a b --endpoint_url http://h", "unrecognized arguments: --endpoint_url *** (did you "
                                       "mean --endpoint-url?)"),  # (an unknown's value withheld)
    ("cp --recusive a b --dry-run", "unrecognized arguments: --recusive --dry-run (did you "
                                    "mean --recursive for --recusive, --dryrun for --dry-run?)"),
    # a word withheld as the value of an unknown option is never named
    ("cp a b --tokn --recusive", "unrecognized arguments: --tokn *** (did you mean --token?)"),
    (f"cp --tokn={SECRET} a b", "unrecognized arguments: --tokn=*** (did you mean --token?)"),
])
def test_a_mistyped_option_names_the_one_meant(line: str, shown: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """``cp --dry-run`` (s5cmd's spelling), ``--recusive``, ``ls --log``: argparse said only
    ``unrecognized arguments: ...``; the library's options name the one meant already."""
    assert main(shlex.split(line)) == 2
    assert shown in capsys.readouterr().err


@pytest.mark.parametrize(("line", "shown"), [
    ("sync --size-only a b", "unrecognized arguments: --size-only (not taken: sync copies what "
                             "differs in size,"),
    ("sync a b --exact-timestamps", "(not taken: a local or Redis copy carries its source's "
                                    "date,"),
    ("sync --delete --delete-excluded --exclude '*.tmp' a b",
     "(not taken: --delete never deletes what --exclude leaves out, as aws s3 sync; "),
    ("cp -r --ignore-existing a b", "(not taken: cp -r --resume skips "),
    ("cp -r --no-clobber a b", "(not taken: cp -r --resume skips "),
    ("sync --size-only --dry-run a b", "unrecognized arguments: --size-only --dry-run (did you "
                                       "mean --dryrun?; --size-only is not taken: sync copies"),
])
def test_an_aws_s5cmd_or_rclone_sync_flag_says_what_sync_does_instead(
        line: str, shown: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``sync --size-only`` (aws, s5cmd, rclone), ``--exact-timestamps`` (aws),
    ``--delete-excluded`` (rclone), ``--ignore-existing``/``--no-clobber``: argparse said only
    ``unrecognized arguments: --size-only``, nothing of what sync compares instead or of
    the flag to use (docs/cli.md's table says it; the error did not)."""
    assert main(shlex.split(line)) == 2
    assert shown in capsys.readouterr().err


@pytest.mark.parametrize("line", [
    "cp a b --bogus",            # nothing close
    "ls --dryrun s3://b/",       # rm's and cp's flag, not ls's: not offered
    "stat a b c",                # no option at all
])
def test_no_option_is_offered_where_none_is_meant(line: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(shlex.split(line)) == 2
    assert "did you mean" not in capsys.readouterr().err


@pytest.mark.parametrize("line", [
    "ls /tmp/ -- --log",         # a second path, called --log
    "stat k -- --jsn",
    "stat -- k --jsn",
])
def test_a_word_after_the_double_dash_is_no_mistyped_option(
        line: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A word after ``--`` is a name, never an option (a file called ``--log``): argparse
    has no place for it, but the error went on ``(did you mean --long?)``, an option the
    command line had said this word was not. The words before ``--`` are still offered
    their option (``ls --log s3://b/`` above)."""
    assert main(shlex.split(line)) == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --" in err and "did you mean" not in err, err


@pytest.mark.parametrize("line", [
    "cp --metadata-directive REPLACE --content-type x/y s3://b/k s3://b/k",
    "cp --metadata-directive=COPY s3://b/k s3://b/j",
    "sync --metadata-directive REPLACE --metadata a=1 s3://b/p/ s3://b/p/",
])
def test_aws_s_metadata_directive_says_how_tensorstream_does_it(
        line: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``aws s3 cp --metadata-directive REPLACE`` is how an aws user changes an object's
    metadata (in place too); here it was ``unrecognized arguments: --metadata-directive
    s3://b/k s3://b/k`` (REPLACE taken for the source) and no word of what to type. The
    error now says that the fields given replace the source's, as REPLACE, and that it is
    to be left out."""
    assert main(shlex.split(line)) == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --metadata-directive" in err, err
    assert ("not taken: --content-type, --cache-control or --metadata replace the source's "
            "fields (aws's REPLACE, in place too), none given copies them (COPY); leave it "
            "out") in err, err


@pytest.mark.parametrize(("line", "meant"), [
    ("copy a b", "did you mean cp?"),            # aws/rclone's word for it
    ("download s3://b/k .", "did you mean cp?"),
    ("list s3://", "did you mean ls?"),
    ("delete s3://b/k", "did you mean rm?"),
    ("mv a b", "did you mean cp (then rm: there is no move)?"),
    ("du s3://b/", "did you mean ls -rh --summarize?"),   # s5cmd's
    ("snyc a b", "did you mean sync?"),          # a typo
    ("CP a b", "did you mean cp?"),
    ("cp -R a b", "did you mean -r?"),           # GNU cp's
    ("cp -R --dry-run a b", "did you mean --dryrun for --dry-run, -r for -R?"),
])
def test_another_tool_s_command_or_a_typo_names_the_one_meant(
        line: str, meant: str, capsys: pytest.CaptureFixture[str]) -> None:
    # A new user's first command: the error says what to type, not only what was wrong.
    assert main(shlex.split(line)) == 2
    assert meant in capsys.readouterr().err


@pytest.mark.parametrize(("line", "said"), [
    (f"--redis-pasword {SECRET} cp a b",
     "--redis-pasword is no option, so its value was taken for the command; "
     "did you mean --redis-password?"),
    ("--bogus-thing x cp a b", "--bogus-thing is no option, so its value was taken for the command)"),
])
def test_an_unknown_option_before_the_command_is_named(
        line: str, said: str, capsys: pytest.CaptureFixture[str]) -> None:
    # argparse took the unknown option's value for the command: `invalid choice: '***'`
    # said nothing of the option mistyped.
    assert main(shlex.split(line)) == 2
    err = capsys.readouterr().err
    assert said in err and SECRET not in err


@pytest.mark.parametrize("line", ["xyzzy a b"])
def test_a_command_like_none_suggests_nothing(line: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(shlex.split(line)) == 2
    err = capsys.readouterr().err
    assert "did you mean" not in err and SECRET not in err


def test_an_unknown_option_after_the_command_word_is_not_blamed(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["xyzzy", "--bogus"]) == 2
    assert "is no option" not in capsys.readouterr().err
