"""Object names in what the CLI prints for people: exactly the name, escaped where it
holds what a terminal would act on. Real moto on loopback; the CLI in a child process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cli_env import cli, s3_env
from fixtures_s3 import S3_BUCKET


def test_an_error_names_a_key_with_its_runs_of_spaces(tmp_path: Path, moto_s3: Any) -> None:
    """``cat 's3://b/a  b'`` (two spaces) said ``no such object`` about ``a b``, another
    key (the line's words were joined by one space), and a key's trailing spaces were
    dropped. The error names the key as it is; a long key is still clipped."""
    env = s3_env(moto_s3, tmp_path)
    moto_s3.put(S3_BUCKET, "names/a b", b"the neighbour")
    for key in ("names/a  b", "names/a b  ", "names/a   b.bin"):
        r = cli("cat", f"s3://{S3_BUCKET}/{key}", "--endpoint-url", moto_s3.endpoint_url,
                env=env)
        assert r.returncode == 1
        assert f"{key}: no such object" in r.stderr, r.stderr
    long = "names/" + "x" * 1000
    r = cli("cat", f"s3://{S3_BUCKET}/{long}", "--endpoint-url", moto_s3.endpoint_url, env=env)
    assert r.returncode == 1 and "characters]..." in r.stderr and len(r.stderr) < 1000


def test_a_backslash_t_and_a_tab_in_keys_print_apart(tmp_path: Path, moto_s3: Any) -> None:
    """``ls`` printed a key holding a backslash and ``t`` (``a\\tb``, S3 stores it) and one
    holding a tab the same, ``a\\tb`` (a newline likewise: moto's server takes no key with
    one): the backslash itself is escaped now, so the first prints ``a\\\\tb``, the second
    ``a\\tb``; ``cp``'s lines the same, ``--json`` keeps both exact. A name with neither
    prints as it is."""
    env = s3_env(moto_s3, tmp_path)
    ep = ("--endpoint-url", moto_s3.endpoint_url)
    names = {"back\\tslash.bin": "back\\\\tslash.bin", "a\ttab.bin": "a\\ttab.bin",
             "plain.bin": "plain.bin"}
    for name in names:
        moto_s3.put(S3_BUCKET, f"esc/{name}", b"x")
    r = cli("ls", *ep, f"s3://{S3_BUCKET}/esc/", env=env)
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.splitlines()) == sorted(names.values())
    r = cli("ls", "--json", *ep, f"s3://{S3_BUCKET}/esc/", env=env)
    assert {json.loads(x)["key"] for x in r.stdout.splitlines()} == set(names)
    r = cli("cp", "-r", *ep, f"s3://{S3_BUCKET}/esc/", f"s3://{S3_BUCKET}/esc-copy/", env=env)
    assert r.returncode == 0, r.stderr
    for shown in names.values():
        src, dst = f"s3://{S3_BUCKET}/esc/{shown}", f"s3://{S3_BUCKET}/esc-copy/{shown}"
        assert any(line.startswith(f"copy: {src} -> {dst}") for line in r.stdout.splitlines()), \
            r.stdout


def test_ls_cat_and_rm_errors_name_a_key_escaped_as_their_lines_do(
        tmp_path: Path, moto_s3: Any) -> None:
    """An error raised by ``ls``, ``cat``, ``rm`` or ``stat`` (a missing key, a folder
    given to ``cat``) printed a backslash in the name as it is (``s3://b/esc/back\\nslash``,
    as a key holding a newline prints), where ``ls``' and ``cp``'s lines double it; the
    copy's own error lines doubled it only where the line opens with it. Every error line
    doubles it now, wherever it names it (the context's ``bucket/key`` too), and a key
    holding a newline still prints ``\\n``: the two print apart."""
    env = s3_env(moto_s3, tmp_path)
    ep = ("--endpoint-url", moto_s3.endpoint_url)
    moto_s3.put(S3_BUCKET, "esc-ls/d\\x/in.bin", b"x")
    back, newline = f"s3://{S3_BUCKET}/esc-ls/back\\nslash", f"s3://{S3_BUCKET}/esc-ls/a\nb"
    runs = [("ls", back), ("ls", back + "/"), ("ls", back + "*"), ("cat", back),
            ("rm", back), ("rm", "-r", back + "/"), ("stat", back),
            ("cat", f"s3://{S3_BUCKET}/esc-ls/d\\x/"), ("cp", back, str(tmp_path / "o"))]
    for argv in runs:
        r = cli(*argv, *ep, env=env)
        assert r.returncode != 0, (argv, r)
        doubled = r.stderr.count("\\\\")
        assert doubled >= 1 and r.stderr.count("\\") == 2 * doubled, (argv, r.stderr)
    r = cli("cat", newline, *ep, env=env)
    assert r.returncode == 1 and "esc-ls/a\\nb" in r.stderr and "\\\\" not in r.stderr, r
    # --json keeps the name exact (rm's failed line).
    r = cli("rm", "--json", back, *ep, env=env)
    assert json.loads(r.stdout.splitlines()[0])["uri"] == back, r
