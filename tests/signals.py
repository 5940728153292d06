"""Child-process set-up for tests that signal a CLI run."""

from __future__ import annotations

import signal


def signals_as_from_a_terminal() -> None:
    """In the child (``preexec_fn``): SIGINT and SIGHUP as a terminal's command has
    them. A test run started in the background of a script or under ``nohup``
    passes them on ignored; Python then never raises KeyboardInterrupt, and the
    CLI leaves an ignored SIGHUP ignored (so that ``nohup tensorstream cp``
    outlives its terminal)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
