"""The CLI run with its stderr on a pseudo-terminal (as a person at a terminal runs
it: a progress bar is drawn there only), and what that terminal received."""

from __future__ import annotations

import os
import subprocess
import sys


def spawn_on_terminal(argv: list[str], columns: int) -> tuple[subprocess.Popen[bytes], int]:
    """``python -m tensorstream *argv``, its stderr a new pseudo-terminal of ``columns``
    columns (24 rows), stdin and stdout ``/dev/null``: the process and the terminal's
    side to read (:func:`read_to_end`)."""
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "tensorstream", *argv],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    return proc, master


def read_to_end(master: int) -> bytes:
    """What the terminal receives until the process's side is closed (the read then ends,
    or fails with EIO); ``master`` is closed."""
    chunks = []
    while True:
        try:
            b = os.read(master, 65536)
        except OSError:
            break
        if not b:
            break
        chunks.append(b)
    os.close(master)
    return b"".join(chunks)
