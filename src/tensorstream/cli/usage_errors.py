"""argparse's usage errors without the secrets they quote.

argparse echoes what it could not take: ``unrecognized arguments: --tokn=<token>``,
``ambiguous option: --s3-s=<secret> could match ...``, ``invalid choice:
'http://u:<password>@h'`` (a storage option's value put before the command). The
command line's parser (:class:`Parser`, which every command's parser inherits) prints
such a message as every other error is printed (redacted, escaped, one line), with the
value of every option that is secret (``--token``, ``--redis-password``, ``--header``...),
unknown or ambiguous (a mistyped secret option) given on the command line withheld.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from .._log_redaction import withhold
from ._run import EXIT_USAGE
from .output import error_line

__all__ = ["Parser", "withhold_option_values"]

#: Options whose values are credentials though their names say no secret word.
_SECRET_OPTIONS = frozenset({"--header", "--proxy"})


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Every option string of ``parser`` and of its commands' parsers, with its action."""
    out: dict[str, argparse.Action] = {}
    seen: set[int] = set()

    def walk(p: argparse.ArgumentParser) -> None:
        if id(p) in seen:
            return
        seen.add(id(p))
        for action in p._actions:
            for option in action.option_strings:
                out.setdefault(option, action)
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    walk(sub)

    walk(parser)
    return out


def _withheld(name: str, options: dict[str, argparse.Action]) -> bool:
    """Whether the value given to option ``name`` is kept out of a usage error: the
    option is secret, or it names no one option (unknown, ambiguous: a mistyped one)."""
    action = options.get(name)
    if action is None and name.startswith("--") and len(name) > 2:  # argparse's abbreviations
        matches = {id(a): a for o, a in options.items() if o.startswith(name)}
        action = next(iter(matches.values())) if len(matches) == 1 else None
    if action is None:
        return True
    if action.nargs == 0:  # a flag: what follows is no value of it
        return False
    from ..credentials.base import is_secret_name  # (a usage error's path only)

    return any(is_secret_name(o) or o in _SECRET_OPTIONS for o in action.option_strings)


def _names_option(word: str, options: dict[str, argparse.Action]) -> bool:
    """Whether ``word`` is an option of the parser (as given, abbreviated, ``=value``)."""
    name = word.partition("=")[0]
    if name in options:
        return True
    return name.startswith("--") and len(name) > 2 and len(
        {id(a) for o, a in options.items() if o.startswith(name)}) == 1


def withhold_option_values(message: str, argv: Sequence[str],
                           options: dict[str, argparse.Action]) -> str:
    """``message`` with the values ``argv`` gives to secret, unknown or ambiguous
    options (``--token=<t>``, ``--tokn <t>``, ``--tokn -<t>``) shown as ``***``.

    Words after ``--`` are looked at too: argparse echoes the ones a command takes no
    place for (``stat K -- --token=<t>``: unrecognized arguments)."""
    separate: list[str] = []
    for i, word in enumerate(argv):
        if not word.startswith("-") or word in ("-", "--"):
            continue
        name, eq, _value = word.partition("=")
        if not _withheld(name, options):
            continue
        if eq:
            message = message.replace(word, f"{name}=***")
        elif i + 1 < len(argv) and argv[i + 1] not in ("-", "--") and not _names_option(
                argv[i + 1], options) and name not in _NOT_TAKEN and name != "-R":
            # (those are flags: no value follows; -R is GNU cp's -r)
            # (a value may start with '-': a url-safe token; argparse then echoes it
            # beside the unknown option, as it does any other)
            separate.append(argv[i + 1])
    return withhold(message, tuple(sorted(separate, key=len, reverse=True)))


_UNRECOGNIZED = "unrecognized arguments: "
_RESUME = "cp -r --resume skips what is already complete at DST"
#: Flags of aws s3 sync, s5cmd and rclone that are not taken, and what to do instead.
_NOT_TAKEN = {
    "--size-only": "sync copies what differs in size, then in ETag between two S3 stores, "
                   "then in date; see docs/cli.md#sync",
    "--exact-timestamps": "a local or Redis copy carries its source's date, and sync copies "
                          "it again when the dates differ; see docs/cli.md#sync",
    "--delete-excluded": "--delete never deletes what --exclude leaves out, as aws s3 sync; "
                         "to delete by pattern: rm -r --exclude '*' --include GLOB DST",
    "--ignore-existing": _RESUME,
    "--no-clobber": _RESUME,
    # (how an aws user changes metadata, in place too; REPLACE was taken for the source)
    "--metadata-directive": "--content-type, --cache-control or --metadata replace the "
                            "source's fields (aws's REPLACE, in place too), none given copies "
                            "them (COPY); leave it out",
}


#: Other tools' names for a command (aws s3, s5cmd, rclone, GNU coreutils) -> ours.
_COMMAND_SYNONYMS = {"copy": "cp", "copyto": "cp", "download": "cp", "upload": "cp",
                     "get": "cp", "put": "cp", "mv": "cp (then rm: there is no move)",
                     "move": "cp (then rm: there is no move)", "list": "ls", "lsf": "ls",
                     "lsd": "ls", "dir": "ls", "du": "ls -rh --summarize", "remove": "rm",
                     "delete": "rm", "del": "rm", "deletefile": "rm", "purge": "rm -r",
                     "head": "stat", "info": "stat", "size": "stat", "show": "inspect",
                     "creds": "credentials", "whoami": "credentials"}
_INVALID_COMMAND = re.compile(r"^argument COMMAND: invalid choice: '([^']*)'")


class Parser(argparse.ArgumentParser):
    """The command line's parser: its usage errors quote no secret (see the module)."""

    _given: tuple[str, ...] = ()

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[Any, list[str]]:
        self._given = tuple(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        message = withhold_option_values(message, self._given, _options(self))
        message += self._meant(message)  # (names only what is still shown: never a value)
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {error_line(message)}\n")

    def _command_parsers(self) -> list[argparse.ArgumentParser]:
        """This parser and the parser of the command given, if any."""
        out: list[argparse.ArgumentParser] = [self]
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                command = next((w for w in self._given if w in action.choices), None)
                if command is not None:
                    out.append(action.choices[command])
        return out

    def _unknown_before_command(self, difflib: Any) -> str:
        """For ``--redis-pasword PW cp ...``: argparse took the unknown option's value for
        the command; say which option was unknown and the one meant (never the value)."""
        options = _options(self)
        takes_value = False  # the word before is a known option that takes one
        for word in self._given:
            name = word.partition("=")[0]
            if not word.startswith("-"):
                if not takes_value:
                    return ""  # the command's place: what follows it is no option before it
                takes_value = False
                continue
            if _names_option(name, options):
                action = options.get(name)
                takes_value = "=" not in word and (action is None or action.nargs != 0)
                continue
            if "=" in word or not name.startswith("--"):
                continue
            close = difflib.get_close_matches(name, [o for o in options if o.startswith("--")],
                                              n=1, cutoff=0.7)
            meant = f"; did you mean {close[0]}?" if close else ""
            return f" ({name} is no option, so its value was taken for the command{meant})"
        return ""

    def _meant(self, message: str) -> str:
        """`` (did you mean --dryrun?)`` for the mistyped options of an ``unrecognized
        arguments`` error, among the options of this parser and of the command given
        (another command's option would be refused as well)."""
        import difflib  # (a usage error's path only)

        invalid = _INVALID_COMMAND.match(message)
        if invalid is not None:  # `tensorstream copy`, `tensorstream snyc`: the one meant
            word = invalid.group(1).lower()
            choices = [c for a in self._actions if isinstance(a, argparse._SubParsersAction)
                       for c in a.choices]
            suggestion = _COMMAND_SYNONYMS.get(word) or next(
                iter(difflib.get_close_matches(word, choices, n=1, cutoff=0.6)), None)
            if suggestion:
                return f" (did you mean {suggestion}?)"
            return self._unknown_before_command(difflib)
        if not message.startswith(_UNRECOGNIZED):
            return ""

        accepted = [o for a in self._actions for o in a.option_strings if o.startswith("--")]
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                command = next((w for w in self._given if w in action.choices), None)
                if command is not None:
                    accepted += [o for a in action.choices[command]._actions
                                 for o in a.option_strings if o.startswith("--")]
        # (a word after "--" is a name the command line says is no option: a file "--log")
        given = self._given[:self._given.index("--")] if "--" in self._given else self._given
        options = {word.partition("=")[0] for word in given}
        meant, foreign = [], []
        words = message[len(_UNRECOGNIZED):].split()
        for word in words:
            name = word.partition("=")[0]
            if name.startswith("--") and name not in accepted and name in options:
                if name in _NOT_TAKEN:  # (another tool's flag: what to do instead)
                    foreign.append(name)
                    continue
                close = difflib.get_close_matches(name.replace("_", "-"), accepted, n=1,
                                                  cutoff=0.7)
                meant += [(close[0], name)] if close else []
        if "-R" in words and "-R" in options and "-r" in {
                o for p in self._command_parsers() for a in p._actions for o in a.option_strings}:
            meant.append(("-r", "-R"))  # GNU cp's and rsync's spelling
        said = []
        if len(meant) == 1:
            said.append(f"did you mean {meant[0][0]}?")
        elif meant:
            said.append("did you mean " + ", ".join(f"{a} for {b}" for a, b in meant) + "?")
        if len(words) == 1 and foreign:
            said.append(f"not taken: {_NOT_TAKEN[foreign[0]]}")
        else:
            said += [f"{name} is not taken: {_NOT_TAKEN[name]}" for name in foreign]
        return f" ({'; '.join(said)})" if said else ""
