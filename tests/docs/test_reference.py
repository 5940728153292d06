"""The reference facts of README.md and docs/ checked against the code, both ways, so that
drift fails here rather than reaching a user:

* every ``--flag`` docs/cli.md names exists in the parser, and every flag of the parser
  (hidden ``--src-*``/``--dst-*`` ones included) is in docs/cli.md;
* the synopsis at the top of docs/cli.md gives each command only flags it takes, and the
  ``convert`` table lists exactly ``convert``'s own flags;
* the defaults docs/cli.md and docs/providers.md state are the code's;
* every environment variable the code reads is in docs/providers.md's table, and every one
  the table names is read;
* every relative link of README.md names a file that exists (mkdocs checks docs/ itself).

docs/test_docs_examples.py runs the examples; this file checks what examples cannot show.
"""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

import pytest

from tensorstream import config
from tensorstream.cli.main import build_parser
from tensorstream.cli.options import FLAGS, SIDE_FLAGS
from tensorstream.copy import engine

ROOT = Path(__file__).resolve().parents[2]
CLI_MD = ROOT / "docs" / "cli.md"
PROVIDERS_MD = ROOT / "docs" / "providers.md"
SRC = ROOT / "src" / "tensorstream"

#: Flags docs/cli.md names that are other tools' (the comparison table, the benchmark's own
#: options), not tensorstream's: each must still be in the page, and never in the parser.
OTHER_TOOLS = {
    "--dry-run": "rclone's and s5cmd's name for --dryrun",
    "--size-only": "aws s3 sync's, s5cmd's and rclone's, which sync does not take",
    "--exact-timestamps": "aws s3 sync's, which sync does not take",
    "--delete-excluded": "rclone's, which sync does not take",
    "--follow-symlinks": "aws s3's default, beside --no-follow-symlinks",
    "--if-size-differ": "s5cmd's, beside cp --resume",
    "--ignore-existing": "rclone's, beside cp --resume",
    "--preserve-root": "GNU rm's, which rm -r / follows",
    "--noproxy": "curl's, beside --no-proxy",
    "--key": "curl's, beside --client-key",
    "--sources": "python -m benchmarks.cp_memory's option",
    "--dests": "python -m benchmarks.cp_memory's option",
    "--sizes": "python -m benchmarks.cp_memory's option",
    "--metadata-directive": "aws s3 cp's, beside an in-place cp --metadata",
}

#: Upper-case string constants in src/tensorstream that are not environment variables.
NOT_VARIABLES = re.compile(
    r"CERTIFICATE_VERIFY_FAILED|WRONG_VERSION_NUMBER|DEFAULT_\w+|\w+_TENSORIZER_VERSION|F[68]_\w+"
    r"|MAX_HEADER_SIZE|NON_GROUP_MEMBER|OPAQUE_DTYPE_SEP|O_\w+|TENSORIZER_MAGIC"
    r"|DEEP_ARCHIVE|INTELLIGENT_TIERING")  # (S3 storage classes)

#: Read by name pattern, never as a literal: ``*_proxy`` (tensorstream/providers/_http/proxies.py).
PATTERN_READ = {"HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "NO_PROXY"}


def _parser_flags(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
                  ) -> dict[tuple[str, ...], set[str]]:
    """``{command path: its option strings}``, subcommands included."""
    out: dict[tuple[str, ...], set[str]] = {path: set()}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out.update(_parser_flags(sub, (*path, name)))
        else:
            out[path].update(action.option_strings)
    return out


PARSER = _parser_flags(build_parser())
ALL_FLAGS = set().union(*PARSER.values())


def _long_flags(text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])--[a-zA-Z][\w-]*", text))


def _documented_side_names() -> list[str]:
    """The NAMEs of docs/cli.md's "``--src-NAME`` and ``--dst-NAME`` for NAME in ..."."""
    m = re.search(r"`--src-NAME` and `--dst-NAME` for NAME in (.*?):", CLI_MD.read_text(), re.S)
    assert m, "docs/cli.md no longer says which NAMEs --src-NAME/--dst-NAME take"
    return re.findall(r"`([\w-]+)`", m.group(1))


def test_every_documented_flag_exists() -> None:
    text = CLI_MD.read_text()
    named = {f for f in _long_flags(text) if not re.fullmatch(r"--(src|dst)-(NAME)?", f)}
    unknown = sorted(named - ALL_FLAGS - set(OTHER_TOOLS))
    assert not unknown, f"docs/cli.md names flags no command takes: {unknown}"
    for flag, why in OTHER_TOOLS.items():
        assert flag in named, f"{flag} ({why}) is no longer in docs/cli.md: drop it from OTHER_TOOLS"
        assert flag not in ALL_FLAGS, f"{flag} is a tensorstream flag now: drop it from OTHER_TOOLS"


def test_every_flag_is_documented() -> None:
    names = _documented_side_names()
    assert names == [n for n, _dest, _type in SIDE_FLAGS], (
        "docs/cli.md's list of --src-NAME/--dst-NAME names differs from SIDE_FLAGS")
    documented = _long_flags(CLI_MD.read_text()) | {
        f"--{side}-{name}" for side in ("src", "dst") for name in names}
    short = {f for f in ALL_FLAGS if not f.startswith("--")}
    missing = sorted(ALL_FLAGS - short - documented)
    assert not missing, f"flags of the parser that docs/cli.md does not mention: {missing}"
    text = CLI_MD.read_text()
    undocumented_short = sorted(f for f in short if not re.search(rf"(?<![\w-]){f}(?![\w-])", text))
    assert not undocumented_short, f"short flags docs/cli.md does not mention: {undocumented_short}"


def _synopsis() -> list[tuple[str, set[str]]]:
    """``(command, flags)`` of each line of the synopsis block that opens docs/cli.md."""
    block = re.search(r"```text\n(.*?)```", CLI_MD.read_text(), re.S)
    assert block
    out = []
    for line in block.group(1).splitlines():
        m = re.match(r"tensorstream (\w+) (.*?)\s{2,}", line)
        assert m, f"not a synopsis line: {line!r}"
        out.append((m.group(1), set(re.findall(r"(?<![\w-])-{1,2}[a-zA-Z][\w-]*", m.group(2)))))
    return out


def test_the_synopsis_names_every_command_with_its_own_flags() -> None:
    lines = _synopsis()
    assert sorted(c for c, _ in lines) == sorted(p[0] for p in PARSER if p), (
        "docs/cli.md's synopsis does not list exactly the commands of the parser")
    for command, flags in lines:
        wrong = sorted(flags - PARSER[(command,)])
        assert not wrong, f"docs/cli.md's synopsis gives {command} flags it does not take: {wrong}"


def test_the_convert_table_lists_convert_s_own_flags() -> None:
    text = CLI_MD.read_text()
    table = text[text.index("## convert"):text.index("## Output")]
    rows = {f for line in table.splitlines() if line.startswith("| `-")
            for f in re.findall(r"`(--?[\w-]+)", line.split("|")[1])}
    own = {f for f in PARSER[("convert",)] - PARSER[()] if not f.startswith(("--src-", "--dst-"))}
    assert rows == own, f"convert's table: {sorted(rows)}; convert's own flags: {sorted(own)}"


def _defaults(command: str) -> dict[str, object]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {a.dest: a.default for a in sub.choices[command]._actions}


def test_the_documented_copy_defaults_are_the_parser_s() -> None:
    text = " ".join(CLI_MD.read_text().split())
    cp = _defaults("cp")
    part = re.search(r"`--part-size` parts \(default (\d+)M\)", text)
    conc = re.search(r"`--concurrency` parts are in flight \(default (\d+)\)", text)
    jobs = re.search(r"`--jobs` objects at once \(default (\d+)\)", text)
    assert part and conc and jobs, "docs/cli.md no longer states cp's defaults where it did"
    assert int(part.group(1)) << 20 == cp["part_size"] == engine.DEFAULT_PART_SIZE
    assert int(conc.group(1)) == cp["concurrency"] == engine.DEFAULT_CONCURRENCY
    # No --jobs (None): DEFAULT_JOBS objects, widened with the link; a number given is kept.
    assert int(jobs.group(1)) == engine.DEFAULT_JOBS and cp["jobs"] is None
    for flag, value in (("--timeout-connect", config.DEFAULT_CONNECT_TIMEOUT),
                        ("--timeout-idle", config.DEFAULT_IDLE_TIMEOUT),
                        ("--retries", config.DEFAULT_ATTEMPTS)):
        help_ = next(h for flags, _d, _t, h in FLAGS if flag in flags)
        assert f"(default {value:g})" in help_, (flag, help_)


def test_the_documented_option_defaults_are_the_code_s() -> None:
    rows = {}
    for line in PROVIDERS_MD.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            rows[cells[0]] = cells[1]
    mib = 1 << 20
    expected = {
        "`timeout_connect`": f"{config.DEFAULT_CONNECT_TIMEOUT:g} s",
        "`timeout_idle`": f"{config.DEFAULT_IDLE_TIMEOUT:g} s",
        "`retries`": f"{config.DEFAULT_ATTEMPTS}",
        "`backoff_initial`, `backoff_max`":
            f"{config.DEFAULT_BACKOFF_INITIAL:g} s, {config.DEFAULT_BACKOFF_MAX:g} s",
        "`part_size`": f"{config.DEFAULT_PART_SIZE // mib} MiB",
        "`concurrency`": f"{config.DEFAULT_CONCURRENCY}",
        "`readahead`": f"{config.DEFAULT_READAHEAD // mib} MiB",
    }
    for option, default in expected.items():
        assert rows.get(option) == default, (option, rows.get(option), default)


def _variables_read(root: Path = SRC) -> set[str]:
    """Upper-case string literals of the package at ``root`` (its testing servers aside, which
    set variables for tests), less the constants that are not variables."""
    found: set[str] = set()
    for path in root.rglob("*.py"):
        if "testing" in path.relative_to(root).parts:
            continue
        tree = ast.parse(path.read_text())
        exported = {id(node) for stmt in tree.body if isinstance(stmt, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == "__all__" for t in stmt.targets)
                    for node in ast.walk(stmt.value)}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and id(node) not in exported
                    and re.fullmatch(r"[A-Z][A-Z0-9]*(_[A-Z0-9]+)+|NETRC|RANK", node.value)
                    and not NOT_VARIABLES.fullmatch(node.value)):
                found.add(node.value)
    return found | PATTERN_READ


def _variables_documented() -> set[str]:
    text = PROVIDERS_MD.read_text()
    section = text[text.index("## Environment variables"):]
    section = section[:section.index("\n## ")] if "\n## " in section else section
    names: set[str] = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            names |= set(re.findall(r"`([A-Z][A-Z0-9_]+)`", line.split("|")[1]))
    return names


def test_every_variable_read_is_documented_and_every_documented_one_read() -> None:
    read, documented = _variables_read(), _variables_documented()
    assert not read - documented, (
        f"read by the code, missing from docs/providers.md's table: {sorted(read - documented)} "
        "(or add a constant that is no variable to NOT_VARIABLES)")
    # AWS_ROLE_ARN is named beside AWS_WEB_IDENTITY_TOKEN_FILE: botocore reads the pair
    unread = documented - read - {"AWS_ROLE_ARN"}
    assert not unread, f"in docs/providers.md's table, read nowhere: {sorted(unread)}"


def test_the_variable_check_sees_a_new_variable(tmp_path: Path) -> None:
    # A variable read directly or through a constant is found; exported names, other
    # constants and the testing servers' variables are not.
    (tmp_path / "testing").mkdir()
    (tmp_path / "testing" / "env.py").write_text('ENV = {"AWS_SET_FOR_TESTS": "1"}\n')
    (tmp_path / "mod.py").write_text(
        'import os\n__all__ = ["EXPORTED_NAME"]\nTOKEN_ENV = "TS_NEW_TOKEN"\n'
        'os.environ.get("TS_NEW_VAR")\nos.environ.get(TOKEN_ENV)\nflag = os.O_DIRECT\n'
        'kind = "O_DIRECT"\n')
    found = _variables_read(tmp_path) - PATTERN_READ
    assert found == {"TS_NEW_VAR", "TS_NEW_TOKEN"}
    assert not found & _variables_documented()


@pytest.mark.parametrize("target", sorted(set(re.findall(
    r"\]\(((?!https?:|#)[^)#\s]+)", (ROOT / "README.md").read_text()))))
def test_readme_links_resolve(target: str) -> None:
    assert (ROOT / target).exists(), f"README.md links to {target}, which does not exist"


def _helps() -> dict[str, str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {"tensorstream": parser.format_help(),
            **{name: p.format_help() for name, p in sub.choices.items()}}


def test_every_help_names_the_interrupted_statuses_the_docs_do() -> None:
    # SIGHUP (the terminal closed) ends a command with 129 as SIGINT does with 130.
    import signal

    statuses = "/".join(str(128 + s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP))
    assert f"{statuses} interrupted by SIGINT/SIGTERM/SIGHUP" in " ".join(CLI_MD.read_text().split())
    for command, help_ in _helps().items():
        text = " ".join(help_.split())
        if "interrupted" in text:
            assert f"{statuses} interrupted" in text, f"tensorstream {command} --help: {text[-300:]}"
    assert " 130/143 " not in " ".join(CLI_MD.read_text().split())


def _documented_call(page: str, name: str) -> str:
    """The first ``name(...)`` in backticks on docs/``page``, with its lines joined."""
    text = " ".join((ROOT / "docs" / page).read_text().split())
    m = re.search(rf"`{re.escape(name)}\((.*?)\)`", text)
    assert m, f"docs/{page} no longer shows {name}(...)"
    return m.group(1)


def _real_call(fn: object) -> str:
    import inspect

    parts, star = [], False
    for p in inspect.signature(fn).parameters.values():  # type: ignore[arg-type]
        if p.kind is p.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        if p.kind is p.VAR_KEYWORD:
            parts.append(f"**{p.name}")
        elif p.default is p.empty:
            parts.append(p.name)
        else:
            parts.append(f"{p.name}={p.default!r}".replace("'", '"'))
    return ", ".join(parts)


def _signatures() -> list[tuple[str, str, object]]:
    import tensorstream
    from tensorstream import safetensors

    return [("load-a-model.md", "deserialize", tensorstream.deserialize),
            ("safetensors.md", "load", safetensors.load),
            ("safetensors.md", "iter_tensors", safetensors.iter_tensors),
            ("safetensors.md", "open", safetensors.open),
            ("safetensors.md", "save", safetensors.save)]


@pytest.mark.parametrize(("page", "name", "fn"), _signatures(), ids=lambda v: getattr(v, "__name__", v))
def test_documented_signatures_are_the_code_s(page: str, name: str, fn: object) -> None:
    assert _documented_call(page, name) == _real_call(fn)


@pytest.mark.parametrize(("page", "name", "fn"), _signatures()[:3], ids=lambda v: getattr(v, "__name__", v))
def test_every_argument_has_a_row(page: str, name: str, fn: object) -> None:
    import inspect

    text = (ROOT / "docs" / page).read_text()
    rows = {n for line in text.splitlines() if line.startswith("| `")
            for n in re.findall(r"`(\*{0,2}\w+)`", line.split("|")[1])}
    params = {("**" if p.kind is p.VAR_KEYWORD else "") + p.name
              for p in inspect.signature(fn).parameters.values()}  # type: ignore[arg-type]
    missing = sorted(params - rows - {"uri"} if name == "deserialize" else params - rows)
    assert not missing, f"docs/{page}: arguments of {name} without a row: {missing}"


def test_the_overview_names_every_command() -> None:
    row = next(line for line in (ROOT / "docs" / "index.md").read_text().splitlines()
               if line.startswith("| [cli.md]"))
    named = set(re.findall(r"`(?:tensorstream )?(\w+)`", row))
    assert named == {p[0] for p in PARSER if p}, f"docs/index.md's cli.md row: {row}"


def test_every_test_the_docs_cite_exists() -> None:
    # reliability.md proves each promise by naming a test: a renamed test must not leave it
    # naming nothing. A name is a test function, a test file, or (ending in _) a prefix.
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    text = "\n".join(p.read_text() for p in pages)
    cited = set(re.findall(r"\btest_[a-z0-9_]+", text))
    defined: set[str] = set()
    files: set[str] = set()
    for folder in ("tests", "src/tensorstream/testing", "benchmarks", "examples"):
        for path in (ROOT / folder).rglob("*.py"):
            files.add(path.stem)
            defined |= set(re.findall(r"def (test_\w+)", path.read_text()))
    defined |= set(re.findall(r"def (test_\w+)", text))  # the pages' own example tests
    missing = sorted(n for n in cited - defined - files
                     if not (n.endswith("_") and any(d.startswith(n) for d in defined)))
    assert not missing, f"the docs cite tests that do not exist: {missing}"


def test_every_option_is_documented() -> None:
    # Every keyword a provider accepts: the shared ones in providers.md, each backend's own on
    # providers.md or its backend page.
    from tensorstream.config import COMMON_OPTIONS
    from tensorstream.providers.registry import known_option_names

    shared = PROVIDERS_MD.read_text()
    pages = shared + "".join((ROOT / "docs" / f"{n}.md").read_text() for n in ("http", "s3", "redis"))
    missing = sorted(n for n in COMMON_OPTIONS if f"`{n}`" not in shared)
    assert not missing, f"shared options docs/providers.md does not document: {missing}"
    missing = sorted(n for n in known_option_names() if f"`{n}" not in pages)
    assert not missing, f"provider options no page documents: {missing}"


def _command_lines(text: str) -> list[str]:
    """The ``tensorstream ...`` commands of ``text`` (``$ `` prompts, pipes, ``#`` comments
    and ``\\`` continuations taken off)."""
    out = []
    for line in re.sub(r"\\\n\s*", " ", text).splitlines():
        line = line.strip().removeprefix("$ ")
        if line.startswith("tensorstream "):
            out.append(line.split(" | ")[0])
    return out


def _parses(command: str) -> str | None:
    """None if the parser takes ``command``, else what it said."""
    import contextlib
    import io
    import shlex

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            build_parser().parse_args(shlex.split(command, comments=True)[1:])
    except SystemExit:
        return err.getvalue().strip().splitlines()[-1]
    return None


def test_every_example_in_help_parses() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    commands = [c for p in (parser, *sub.choices.values()) for c in _command_lines(p.epilog or "")]
    assert len(commands) > 20
    bad = {c: why for c in commands if (why := _parses(c))}
    assert not bad, f"--help examples the parser refuses: {bad}"


def test_every_command_s_help_shows_examples_of_itself() -> None:
    # A new user reads `tensorstream COMMAND --help` first: each one shows how it is typed
    # (the count above would not notice a command whose examples were dropped).
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    bare = {name: [c for c in _command_lines(p.epilog or "")
                   if re.search(rf"(^|\s)tensorstream( --?\S+)* {name}\b", c)]
            for name, p in sub.choices.items()}
    assert not [n for n, lines in bare.items() if not lines], (
        f"commands whose --help shows no example of themselves: "
        f"{[n for n, lines in bare.items() if not lines]}")


def test_every_command_line_example_parses() -> None:
    # Examples the pages cannot run (placeholder hosts, transcripts) are still parsed: a
    # renamed flag, or one given to a command that does not take it, fails here.
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    commands = [(p.name, c) for p in pages
                for _lang, body in re.findall(r"```(sh|console|bash)\n(.*?)```", p.read_text(), re.S)
                for c in _command_lines(body)]
    assert len(commands) > 40
    bad = {f"{page}: {c}": why for page, c in commands if (why := _parses(c))}
    assert not bad, f"command-line examples the parser refuses: {bad}"


def test_every_public_name_is_in_the_api_reference() -> None:
    import tensorstream

    api = (ROOT / "docs" / "api.md").read_text()
    missing = [n for n in tensorstream.__all__
               if n != "__version__" and not re.search(rf"(?<![\w.]){n}\b|\.{n}\b", api)]
    assert not missing, f"tensorstream.__all__ names docs/api.md leaves out: {missing}"


def test_the_backend_pages_state_the_code_s_defaults() -> None:
    from tensorstream.providers.redis import provider as redis
    from tensorstream.providers.s3 import process

    mib, kib = 1 << 20, 1 << 10
    redis_md = " ".join((ROOT / "docs" / "redis.md").read_text().split())
    assert (f"chunk size for writes (default {redis.DEFAULT_CHUNK_SIZE // mib} MiB, "
            f"{redis._MIN_CHUNK // kib} KiB..{redis._MAX_CHUNK // mib} MiB") in redis_md
    s3_md = (ROOT / "docs" / "s3.md").read_text()
    timeout = f"{process.DEFAULT_CREDENTIAL_PROCESS_TIMEOUT:g}"
    assert f"| `s3_credential_process_timeout` | `{timeout}` |" in s3_md
    assert f"`s3_credential_process_timeout` seconds (default {timeout}," in " ".join(s3_md.split())
    import inspect

    from tensorstream.providers.s3.provider import S3Provider

    checksum = inspect.signature(S3Provider.__init__).parameters["checksum"].default
    assert f"| `s3_checksum` | `{checksum}` |" in s3_md


def test_the_overview_s_source_tree_names_files_that_exist() -> None:
    text = (ROOT / "docs" / "index.md").read_text()
    tree = re.search(r"```text\nsrc/tensorstream/\n(.*?)```", text, re.S)
    assert tree, "docs/index.md no longer draws src/tensorstream/"
    missing = []
    for line in tree.group(1).splitlines():
        folder = re.match(r"\s+(\w+)/\s", line)
        where = SRC / folder.group(1) if folder else SRC
        for name in re.findall(r"(?<![\w/])(\w+\.py)\b", line):
            if not (where / name).exists():
                missing.append(f"{where.relative_to(SRC.parent)}/{name}")
        for sub in re.findall(r"(?<![\w.])(\w+)/(?=\s)", line)[1 if folder else 0:]:
            if not (where / sub).is_dir():
                missing.append(f"{where.relative_to(SRC.parent)}/{sub}/")
    assert not missing, f"docs/index.md's source tree names what is not there: {missing}"
