"""Run a server command that dies with the test process.

``python .../tensorstream/testing/watchdog.py redis-server redis.conf`` starts the
command and kills it as soon as its own standard input reaches end of file.
The test process starts it with ``stdin=PIPE`` and holds the only write end:
however that process ends -- teardown, or a SIGTERM/SIGKILL from a CI job
timeout or the OOM killer, where no teardown runs -- the pipe closes and the
server goes with it, instead of living on as an orphan holding its port.
The watchdog exits with the server's status (128 + N for a signal N). It uses
only the standard library, so it runs by path, without tensorstream on ``sys.path``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

__all__ = ["main"]


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python watchdog.py COMMAND [ARG...]", file=sys.stderr)
        return 2
    child = subprocess.Popen(argv, stdin=subprocess.DEVNULL)

    def watch() -> None:
        try:
            while os.read(0, 4096):
                pass
        except OSError:
            pass
        child.kill()

    threading.Thread(target=watch, name="watchdog", daemon=True).start()
    code = child.wait()
    return code if code >= 0 else 128 - code


if __name__ == "__main__":  # pragma: no cover - runs as a child
    sys.exit(main(sys.argv[1:]))
