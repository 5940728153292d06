"""What ``cp``/``sync``/``rm`` print: escaped names, human sizes, one line per file, JSON lines.

Everything printed for people goes through :func:`escape`, so an object
named with terminal escape sequences or newlines shows as ``\\x1b[2J`` or
``a\\nb`` and can neither repaint the screen nor fake a line of output.
``--json`` output is exact instead (JSON escapes control characters itself).
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from ..copy.select import FileOutcome
from ..uri import redact_text

__all__ = ["Reporter", "cli_terms", "error_line", "escape", "escape_name", "human_rate", "human_size",
           "quiet_if_closed"]

#: Library advice in errors (``ca_bundle=<PEM path>``) said as the flag a CLI user types.
_CLI_TERMS: list[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]]] = [
    (re.compile(r"\bca_bundle=<[^>]*>"), "--ca-bundle FILE"),
    (re.compile(r"\binsecure=True\b"), "--no-verify-ssl"),
    (re.compile(r"\bclient_cert=<[^>]*>"), "--client-cert FILE"),
    (re.compile(r"\bclient_key=<[^>]*>"), "--client-key FILE"),
    (re.compile(r"\bclient_key=(?=\s)"), "--client-key FILE"),
    (re.compile(r"\bclient_key needs client_cert\b"), "--client-key needs --client-cert"),
    (re.compile(r"^(client_cert|client_key|ca_bundle)(?=: )"),
     lambda m: "--" + m.group(1).replace("_", "-")),
    (re.compile(r"\bthe option s3_credential_process_timeout\b"),
     "--s3-credential-process-timeout SECONDS"),
    (re.compile(r"\bs3_endpoint\b"), "--endpoint-url"),
    (re.compile(r"\(--endpoint-url\) "), ""),
]


def cli_terms(text: str) -> str:
    """``text`` with library option advice turned into command-line flags.

    >>> cli_terms("pass ca_bundle=<PEM path> (insecure=True skips verification)")
    'pass --ca-bundle FILE (--no-verify-ssl skips verification)'
    """
    for pattern, flag in _CLI_TERMS:
        text = pattern.sub(flag, text)
    return text


def escape(text: str) -> str:
    r"""``text`` with control and other unprintable characters escaped, Python style.

    >>> escape("a\nb\x1b[2Jc")
    'a\\nb\\x1b[2Jc'
    """
    if text.isprintable():
        return text
    out = []
    for c in text:
        if c.isprintable():
            out.append(c)
        elif c in "\n\r\t":
            out.append({"\n": "\\n", "\r": "\\r", "\t": "\\t"}[c])
        elif ord(c) < 0x100:
            out.append(f"\\x{ord(c):02x}")
        else:
            out.append(f"\\u{ord(c):04x}" if ord(c) < 0x10000 else f"\\U{ord(c):08x}")
    return "".join(out)


def escape_name(name: str) -> str:
    r"""A name (a key, a path, a URI) as :func:`escape` shows it, its backslashes doubled:
    a key holding a backslash and ``n`` and one holding a newline printed the same,
    ``a\nb``. Prose (an error, whose names are quoted reprs) goes through :func:`escape`.

    >>> print(escape_name("a\\nb"), escape_name("a\nb"), escape_name("win\\w.bin"))
    a\\nb a\nb win\\w.bin
    """
    return escape(name.replace("\\", "\\\\"))


#: A word of an error line longer than this is shown clipped in the middle
#: (a 20 kB URL or key named twice made a 40 kB line).
_LONGEST_WORD = 300


#: A word of an escaped line: all but its spaces (the only whitespace escape leaves).
_WORD = re.compile(r"[^ ]+")


def _clipped(word: str) -> str:
    if len(word) <= _LONGEST_WORD:
        return word
    head, tail = word[:160], word[-100:]
    return f"{head}...[{len(word) - len(head) - len(tail):,} characters]...{tail}"


def error_line(text: str, names: Sequence[str] = ()) -> str:
    r"""An error or warning for the terminal: secrets redacted, unprintable characters
    escaped, on one line, each overlong word (a URL, a key) clipped in the middle.
    ``--json`` output keeps the whole text. Each of ``names`` (the objects and paths the
    line is about) is escaped as the copy lines and ``ls`` escape names, its backslashes
    doubled, wherever the text names it (whole, without its trailing ``/``, or a URI's
    ``bucket/key`` as an error's context says it), so ``a\\nb: failed`` and
    ``a<newline>b: failed`` print apart, and a name reads the same all along the line.

    >>> print(error_line("win\\w.bin: refused", ["win\\w.bin"]))
    win\\w.bin: refused
    >>> print(error_line("a\nb: x", ["a\nb"]), error_line("a\\nb: x", ["a\\nb"]))
    a\nb: x a\\nb: x
    >>> print(error_line("s3 stat b/k\\n: no such key: s3://b/k\\n", ["s3://b/k\\n"]))
    s3 stat b/k\\n: no such key: s3://b/k\\n
    """
    text = redact_text(text)
    forms = sorted(_name_forms(names), key=len, reverse=True)
    if forms:  # (a name without a backslash escapes as the prose does: nothing to tell)
        pieces = re.split("(" + "|".join(map(re.escape, forms)) + ")", text)
        line = "".join(escape_name(piece) if i % 2 else escape(cli_terms(piece))
                       for i, piece in enumerate(pieces))
    else:
        line = escape(cli_terms(text))
    # (escaped, it holds no line break; its spaces are kept as they are: a key's run of
    # spaces joined as one named another key)
    return _WORD.sub(lambda m: _clipped(m.group()), line)


def _name_forms(names: Sequence[str]) -> set[str]:
    """The ways an error's text spells ``names`` that :func:`escape_name` shows other than
    :func:`escape` does (those holding a backslash), redacted as the text is."""
    forms: set[str] = set()
    for name in names:
        if not name or "\\" not in name:
            continue
        shown = redact_text(name)
        spellings = {shown, shown.rstrip("/")}
        if "://" in shown:  # (an error's context names s3://b/k as b/k)
            spellings |= {w.partition("://")[2] for w in list(spellings)}
        elif not shown.startswith("-"):
            spellings.add(os.path.abspath(shown))  # (a local path typed relative)
        forms |= {w for w in spellings if "\\" in w}
    return forms


def human_size(n: float) -> str:
    """Binary units, three significant digits: ``999 B``, ``1.5 KiB``, ``4.00 GiB``."""
    if n < 1024:
        return f"{int(n)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        n /= 1024
        if n < 1000 or unit == "PiB":
            digits = 0 if n >= 100 else 1 if n >= 10 else 2
            return f"{n:.{digits}f} {unit}"
    raise AssertionError("unreachable")


def human_rate(nbytes: int, seconds: float) -> str:
    """``human_size(nbytes / seconds) + "/s"``; empty when too short to mean anything."""
    if seconds < 0.001 or nbytes <= 0:
        return ""
    return human_size(nbytes / seconds) + "/s"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


class Reporter:
    """Prints each object's outcome as it happens; counts what happened for the summary.

    ``mode`` is ``text`` (``copy: SRC -> DST`` on stdout), ``json`` (one JSON
    object per file on stdout) or ``errors`` (only errors and warnings, on
    stderr: ``--only-show-errors``) or ``quiet`` (errors only).
    """

    def __init__(self, mode: str, *, verb: str = "copy", dryrun: bool = False,
                 out: TextIO | None = None, err: TextIO | None = None,
                 bars: Any = None) -> None:
        self.mode = mode
        self.verb = verb
        self.dryrun = dryrun
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.bars = bars
        self.printed_errors: set[str] = set()
        self.counts: dict[str, int] = {}
        self.problems = 0  # failures and skips that were not asked for
        #: Streams whose reader went away (broken pipe): nothing more is written there.
        self.closed: set[TextIO] = set()

    # -- printing ---------------------------------------------------------------
    def _write(self, line: str, stream: TextIO) -> None:
        if stream in self.closed:
            return
        try:
            if self.bars is not None:
                self.bars.write(line, stream)
            else:
                print(line, file=stream, flush=True)
        except BrokenPipeError:
            # Whoever read our output went away (`cp ... | head`). The copy is
            # the job, not its log: it goes on, its exit status still tells
            # the truth, only the printing to that stream stops.
            self.closed.add(stream)
            quiet_if_closed(stream)

    def line(self, text: str) -> None:
        if self.mode == "text":
            self._write(text, self.out)

    def warning(self, text: str, *, problem: bool = False) -> None:
        """``tensorstream: text`` on stderr; ``problem`` (it makes the exit status non-zero:
        a broken symlink skipped) is said in ``--quiet`` mode too, as errors are."""
        if self.mode in ("text", "errors", "json") or problem:
            self._write(f"tensorstream: {escape(redact_text(text))}", self.err)

    def error(self, text: str, names: Sequence[str] = ()) -> None:
        """``tensorstream: error: text`` on stderr, once; the one of ``names`` (the
        objects' labels) that ``text`` opens with is escaped as a name (:func:`error_line`)."""
        if text in self.printed_errors:
            return
        self.printed_errors.add(text)
        self._write(f"tensorstream: error: {error_line(text, names)}", self.err)

    def json(self, obj: dict[str, Any]) -> None:
        if self.mode == "json":
            self._write(json.dumps(obj, sort_keys=True), self.out)

    # -- events (a ProgressListener: bars get the byte counts) -------------------
    def start(self, files: int, total_bytes: int) -> None:
        if self.bars is not None:
            self.bars.start(files, total_bytes)

    def file_started(self, name: str, size: int) -> None:
        if self.bars is not None:
            self.bars.file_started(name, size)

    def advance(self, name: str, nbytes: int) -> None:
        if self.bars is not None:
            self.bars.advance(name, nbytes)

    def phase(self, name: str, what: str) -> None:
        if self.bars is not None:
            self.bars.phase(name, what)

    def verified(self, name: str, nbytes: int) -> None:
        if self.bars is not None:
            self.bars.verified(name, nbytes)

    def file_finished(self, name: str, ok: bool) -> None:
        if self.bars is not None:
            self.bars.file_finished(name, ok)

    def close(self) -> None:
        if self.bars is not None:
            self.bars.close()
            self.bars = None

    def file_done(self, o: FileOutcome) -> None:
        """Optional :class:`~tensorstream.copy.engine.ProgressListener` event."""
        kind = o.status
        if kind == "skipped":
            kind = "unchanged" if o.reason == "unchanged" else "skipped"
        self.counts[kind] = self.counts.get(kind, 0) + 1
        if kind == "copied":
            self.counts["bytes"] = self.counts.get("bytes", 0) + o.size
        if self.mode == "json":  # to_dict is dataclasses.asdict: not for every quiet object
            self.json({"op": self.verb, **o.to_dict()})
        src, dst = escape_name(o.src), escape_name(o.dst)
        if kind == "copied":
            resumed = f" (resumed: {human_size(o.resumed_bytes)} were there)" \
                if o.resumed_bytes else ""
            how = ""
            if o.server_side:  # (said how it was checked, or that it was not)
                how = (f" (copied by S3, {o.verified_by} compared)" if o.verified_by
                       else " (copied by S3, not verified)")
            self.line(f"{self.verb}: {src} -> {dst}{resumed}{how}")
        elif kind == "dryrun":
            self.line(f"(dryrun) {self.verb}: {src} -> {dst}")
        elif kind == "skipped":
            if o.error:
                self.problems += 1
            self.warning(f"skipped {escape_name(o.src)}: {o.reason}",
                         problem=o.error is not None)
        elif kind == "failed":
            self.problems += 1
            self.error(o.error or f"{o.src} -> {o.dst}: failed",
                       (f"{o.src} -> {o.dst}", o.src))

    def deleted(self, uri: str, *, dryrun: bool, error: str | None = None) -> None:
        """One ``delete: URI`` line (``rm``, ``sync --delete``)."""
        status = "failed" if error else ("dryrun" if dryrun else "deleted")
        self.counts[f"delete-{status}"] = self.counts.get(f"delete-{status}", 0) + 1
        self.json({"op": "delete", "uri": redact_text(uri), "status": status,
                   **({"error": redact_text(error)} if error else {})})
        if error:
            self.problems += 1
            self.error(error, (f"delete {uri}", f"delete {redact_text(uri)}"))
        else:
            self.line(f"{'(dryrun) ' if dryrun else ''}delete: {escape_name(redact_text(uri))}")

    # -- the end ----------------------------------------------------------------
    def summary(self, *, seconds: float, verified: bool, resumed_bytes: int = 0,
                server_side_bytes: int = 0, extra_errors: int = 0) -> str:
        """One line saying only what happened: ``copied 3 files (1.20 GiB) in ...``.
        The rate is of the bytes that went through this machine: not those kept from
        an earlier run (``resumed_bytes``) nor those S3 copied itself."""
        c = self.counts
        parts = []
        if c.get("copied"):
            moved = c.get("bytes", 0)
            rate = human_rate(moved - resumed_bytes - server_side_bytes, seconds)
            done = f"copied {_plural(c['copied'], 'file')} ({human_size(moved)})"
            took = f"{seconds:.2f}" if seconds < 10 else f"{seconds:.0f}"
            done += f" in {took} s" + (f", {rate}" if rate else "")
            if server_side_bytes:
                done += (", all copied by S3" if server_side_bytes >= moved else
                         f", {human_size(server_side_bytes)} of it copied by S3")
            if verified:
                done += ", verified"
            parts.append(done)
        if c.get("dryrun"):
            parts.append(f"(dryrun) would copy {_plural(c['dryrun'], 'file')}")
        if c.get("unchanged"):
            parts.append(f"{c['unchanged']} already there and unchanged")
        if c.get("delete-deleted"):
            parts.append(f"deleted {_plural(c['delete-deleted'], 'object')}")
        if c.get("delete-dryrun"):
            parts.append(f"(dryrun) would delete {_plural(c['delete-dryrun'], 'object')}")
        if c.get("skipped"):
            parts.append(f"{c['skipped']} skipped")
        failed = c.get("failed", 0) + c.get("delete-failed", 0) + extra_errors
        if failed:
            parts.append(f"{failed} failed")
        return "; ".join(parts) if parts else "nothing to copy"

    def print_summary(self, text: str) -> None:
        if self.mode == "text":
            self._write(text, self.err)


def quiet_if_closed(stream: TextIO) -> None:
    """Point ``stream``'s file descriptor at /dev/null after a broken pipe, so
    what is still buffered (and the interpreter's flush at exit) goes nowhere
    instead of raising again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, stream.fileno())
        finally:
            os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass  # not a real file (a test's StringIO): nothing is flushed at exit
