"""Ctrl-C while a ``tensorstream`` process is still starting (importing).

Each test starts a real interpreter the way a user's shell does (the console
script, ``python -m tensorstream``), with SIGINT as a terminal leaves it
(:mod:`signals`), and delivers a real SIGINT. The moments are made exact by a
``sitecustomize`` that sends the process SIGINT as a chosen module starts
importing; a sweep of timed signals from the parent covers the moments between.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from signals import signals_as_from_a_terminal

_SRC = str(Path(__file__).resolve().parents[2] / "src")
#: What pip writes as the ``tensorstream`` console script.
_CONSOLE_SCRIPT = """\
import sys
from tensorstream.cli import entry
if __name__ == '__main__':
    sys.argv[0] = sys.argv[0].removesuffix('.exe')
    sys.exit(entry())
"""
#: Sends SIGINT to the process when the module named by TS_TEST_SIGINT_AT starts importing.
_SITECUSTOMIZE = """\
import linecache, os, signal, sys, weakref

class _InterruptAt:
    def find_spec(self, name, path=None, target=None):
        if name == os.environ.get("TS_TEST_SIGINT_AT"):
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, _InterruptAt())


# SIGINT inside a weakref callback (as importlib's module locks have), as the module
# named by TS_TEST_SIGINT_IN_CALLBACK starts importing.
class _InterruptInACallback:

    kept = []

    def find_spec(self, name, path=None, target=None):
        if name == os.environ.get("TS_TEST_SIGINT_IN_CALLBACK"):
            sys.meta_path.remove(self)

            class Gone:
                pass

            def callback(ref):
                os.kill(os.getpid(), signal.SIGINT)
                for _ in range(1000):  # the handler runs here, inside the callback
                    pass

            gone = Gone()
            self.kept.append(weakref.ref(gone, callback))
            del gone
        return None


sys.meta_path.insert(0, _InterruptInACallback())

if os.environ.get("TS_TEST_SIGINT_DECIDING"):  # as tensorstream/__init__ decides
    def _tracer(frame, event, arg):
        name = frame.f_code.co_filename
        if not name.endswith(os.path.join("tensorstream", "__init__.py")):
            return None
        line = linecache.getline(name, frame.f_lineno)
        if event == "line" and line.startswith("    if _launched_as_command()"):
            sys.settrace(None)
            frame.f_trace = None
            os.kill(os.getpid(), signal.SIGINT)
        return _tracer

    sys.settrace(_tracer)
"""
_CLEAN = "tensorstream: error: interrupted by SIGINT"


@pytest.fixture
def launch(tmp_path: Path) -> dict[str, object]:
    """The console script, and an environment with the signalling sitecustomize."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    script = tmp_path / "bin" / "tensorstream"
    script.parent.mkdir()
    script.write_text(_CONSOLE_SCRIPT)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), _SRC, env.get("PYTHONPATH", "")])
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.bin").write_bytes(b"a" * 100)
    return {"script": str(script), "env": env, "listed": str(tmp_path / "data")}


def _run(argv: list[str], env: dict[str, str], at: str | None) -> subprocess.CompletedProcess[str]:
    env = dict(env)
    if at is not None:
        env["TS_TEST_SIGINT_AT"] = at
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120,
                          check=False, preexec_fn=signals_as_from_a_terminal)


#: Modules first imported at successive moments of a start: inside ``import
#: tensorstream`` (the package the console script imports first), then the
#: command line, its parser, a command's own imports once it runs.
_MOMENTS = ["tensorstream.errors", "tensorstream.providers.base", "tensorstream.uri",
            "tensorstream.cli", "tensorstream.cli.main", "argparse", "tensorstream.cli.options",
            "tensorstream.api", "tensorstream.copy.engine"]


@pytest.mark.parametrize("at", _MOMENTS)
def test_ctrl_c_while_the_console_script_starts_is_the_clean_interrupt(
        launch: dict[str, object], at: str) -> None:
    proc = _run([sys.executable, str(launch["script"]), "ls", str(launch["listed"])],
                launch["env"], at)  # type: ignore[arg-type]
    assert proc.stderr.splitlines() == [_CLEAN], proc.stderr
    assert proc.returncode == 130
    assert proc.stdout == ""


@pytest.mark.parametrize("at", ["tensorstream.errors", "tensorstream.uri", "tensorstream.__main__",
                                "tensorstream.cli.main"])
def test_ctrl_c_while_python_m_tensorstream_starts_is_the_clean_interrupt(
        launch: dict[str, object], at: str) -> None:
    proc = _run([sys.executable, "-m", "tensorstream", "ls", str(launch["listed"])],
                launch["env"], at)  # type: ignore[arg-type]
    assert proc.stderr.splitlines() == [_CLEAN], proc.stderr
    assert proc.returncode == 130


@pytest.mark.skipif(not hasattr(signal, "pthread_sigmask"), reason="no signal masks here")
def test_ctrl_c_while_the_package_decides_it_is_the_command_is_the_clean_interrupt(
        launch: dict[str, object]) -> None:
    # The moment between the package's first line and the command's handler (deciding
    # from sys.argv whether this is the command): a Ctrl-C there was a traceback through
    # tensorstream/__init__.py. It is held back until the handler is in place.
    env = {**launch["env"], "TS_TEST_SIGINT_DECIDING": "1"}  # type: ignore[dict-item]
    proc = _run([sys.executable, str(launch["script"]), "ls", str(launch["listed"])], env, None)
    assert proc.stderr.splitlines() == [_CLEAN], proc.stderr
    assert proc.returncode == 130


def test_a_library_import_still_gets_a_ctrl_c_that_came_while_it_decided(
        launch: dict[str, object]) -> None:
    env = {**launch["env"], "TS_TEST_SIGINT_DECIDING": "1"}  # type: ignore[dict-item]
    proc = _run([sys.executable, "-c", "import tensorstream; print('not interrupted')"], env, None)
    assert "KeyboardInterrupt" in proc.stderr and "not interrupted" not in proc.stdout
    assert proc.returncode == -signal.SIGINT


def test_without_ctrl_c_the_runs_are_unchanged(launch: dict[str, object]) -> None:
    env: dict[str, str] = launch["env"]  # type: ignore[assignment]
    for argv in ([sys.executable, str(launch["script"])], [sys.executable, "-m", "tensorstream"]):
        proc = _run([*argv, "ls", str(launch["listed"])], env, None)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split() == ["a.bin"]


def test_a_program_importing_the_library_still_gets_its_keyboardinterrupt(
        launch: dict[str, object], tmp_path: Path) -> None:
    # Only the command line turns Ctrl-C into its one line: a program of one's
    # own (here named prog.py) sees KeyboardInterrupt as from any import.
    prog = tmp_path / "prog.py"
    prog.write_text("try:\n    import tensorstream\nexcept KeyboardInterrupt:\n"
                    "    print('caught')\n")
    proc = _run([sys.executable, str(prog)], launch["env"], "tensorstream.errors")  # type: ignore[arg-type]
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "caught"
    assert _CLEAN not in proc.stderr


def test_importing_the_library_leaves_sigint_alone(launch: dict[str, object]) -> None:
    code = ("import signal, sys, tensorstream, tensorstream.cli.main\n"
            "sys.exit(signal.getsignal(signal.SIGINT) is not signal.default_int_handler)")
    proc = _run([sys.executable, "-c", code], launch["env"], None)  # type: ignore[arg-type]
    assert proc.returncode == 0, proc.stderr


def test_the_package_imports_off_the_main_thread_and_without_argv(
        launch: dict[str, object]) -> None:
    # A program run as ``tensorstream`` (a frozen or wrapped command) importing the
    # package from a worker thread, and an embedding with no sys.argv: the start-up
    # handler cannot be (or need not be) set there; ``import tensorstream`` raised
    # ValueError ("signal only works in main thread") and AttributeError.
    in_a_thread = ("import sys, threading\nsys.argv[0] = '/usr/bin/tensorstream'\nfailed = []\n"
                   "def load():\n    try:\n        import tensorstream\n"
                   "    except BaseException as exc:\n        failed.append(repr(exc))\n"
                   "t = threading.Thread(target=load)\nt.start()\nt.join()\n"
                   "print(failed or 'imported')\n")
    no_argv = "import sys\ndel sys.argv\nimport tensorstream\nprint('imported')\n"
    for code in (in_a_thread, no_argv):
        proc = _run([sys.executable, "-c", code], launch["env"], None)  # type: ignore[arg-type]
        assert proc.stdout.strip() == "imported", proc.stdout + proc.stderr


@pytest.mark.parametrize("at", ["tensorstream.cli.main", "argparse", "tensorstream.cli.options"])
def test_ctrl_c_inside_a_callback_of_the_imports_is_the_clean_interrupt(
        launch: dict[str, object], at: str) -> None:
    # A SIGINT handled inside a weakref callback or a finalizer (importlib's module
    # locks have one): the handler's SystemExit was printed as "Exception ignored in
    # <function _get_module_lock.<locals>.cb>" with a traceback, and the command went on.
    env = dict(launch["env"])  # type: ignore[call-overload]
    env["TS_TEST_SIGINT_IN_CALLBACK"] = at
    proc = subprocess.run([sys.executable, str(launch["script"]), "ls", str(launch["listed"])],
                          capture_output=True, text=True, env=env, timeout=120, check=False,
                          preexec_fn=signals_as_from_a_terminal)
    assert proc.stderr.splitlines() == [_CLEAN], proc.stderr
    assert (proc.returncode, proc.stdout) == (130, "")


def test_ctrl_c_at_any_moment_of_the_first_second_never_shows_a_traceback(
        launch: dict[str, object]) -> None:
    # A real terminal's timing: SIGINT from outside after 0-0.9 s. Each run ends
    # in the clean interrupt or a finished listing, or, for a signal before any
    # of tensorstream's code runs, as the interpreter's start goes then (killed
    # by SIGINT with nothing printed, its own "Failed to import the site module"
    # or "Failed checking if argv[0] is an import path entry"): never a
    # traceback through tensorstream.
    env: dict[str, str] = launch["env"]  # type: ignore[assignment]
    outcomes = set()
    for delay in (0.0, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.45, 0.6, 0.9):
        child = subprocess.Popen([sys.executable, str(launch["script"]), "ls",
                                  str(launch["listed"])], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=env,
                                 preexec_fn=signals_as_from_a_terminal)
        time.sleep(delay)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=120)
        if child.returncode == 130:
            assert err.splitlines() == [_CLEAN], (delay, err)
        else:  # finished, or the interpreter's own start before any of tensorstream's code
            assert child.returncode in (0, 1, -signal.SIGINT), (delay, child.returncode, err)
            assert f"{os.sep}tensorstream{os.sep}" not in err, (delay, err)
            if child.returncode == 0:
                assert out.split() == ["a.bin"], (delay, out, err)
        outcomes.add(child.returncode)
    assert outcomes  # (which ones depends on the machine's speed)


@pytest.mark.parametrize("flags", [["-Bm"], ["-B", "-m"], ["-sBm"], ["-X", "utf8", "-m"],
                                   ["-Xutf8", "-Bm"], ["-W", "default", "-m"]])
def test_python_options_before_m_tensorstream_still_make_the_command(
        launch: dict[str, object], flags: list[str]) -> None:
    """python -Im tensorstream (isolated mode, options grouped with -m) was not taken for
    the command: Ctrl-C while it started ended it with a traceback."""
    proc = _run([sys.executable, *flags, "tensorstream", "ls", str(launch["listed"])],
                launch["env"], "tensorstream.cli.main")  # type: ignore[arg-type]
    assert proc.stderr.splitlines() == [_CLEAN], proc.stderr
    assert proc.returncode == 130


@pytest.mark.parametrize("orig", [["-Im", "tensorstream"], ["-Imtensorstream"], ["-I", "-m", "tensorstream"],
                                  ["-IX", "dev", "-m", "tensorstream"], ["-I", "-m", "tensorstream.demo"],
                                  ["-I", "-c", "pass", "-m", "tensorstream"],
                                  ["-X", "-m", "-m", "json"]])
def test_how_runpy_starts_the_package_under_options(launch: dict[str, object],
                                                    orig: list[str]) -> None:
    # What runpy shows the package while it imports it for python [options] -m NAME:
    # sys.argv[0] is "-m", sys.orig_argv the interpreter's own command line. (-I itself
    # ignores PYTHONPATH, so this checkout cannot be started under it here.)
    code = ("import signal, sys\n"
            f"sys.argv, sys.orig_argv = ['-m'], [sys.executable, *{orig!r}]\n"
            "import tensorstream\n"
            "print(signal.getsignal(signal.SIGINT) is tensorstream._exit_interrupted)\n")
    proc = _run([sys.executable, "-c", code], launch["env"], None)  # type: ignore[arg-type]
    want = "tensorstream" in orig[-1] and "tensorstream." not in orig[-1] and "-c" not in orig
    assert proc.stdout.strip() == str(want), (orig, proc.stdout, proc.stderr)


def test_python_isolated_mode_is_the_command_where_it_can_be_started(tmp_path: Path) -> None:
    # -I ignores PYTHONPATH: only an installed tensorstream starts this way, and only
    # this checkout's is tested
    where = subprocess.run([sys.executable, "-I", "-c", "import tensorstream; "
                            "print(tensorstream.__file__)"], capture_output=True, text=True)
    if not where.stdout.startswith(_SRC):
        pytest.skip(f"python -I imports another tensorstream: {where.stdout.strip()}")
    (tmp_path / "d").mkdir()
    proc = _run([sys.executable, "-Im", "tensorstream", "ls", str(tmp_path)], dict(os.environ),
                None)
    assert proc.returncode == 0 and proc.stdout.split() == ["d/"], proc.stderr


def test_a_child_process_of_the_command_gets_pythons_sigint_handler(
        launch: dict[str, object], tmp_path: Path) -> None:
    """A multiprocessing (spawn) child of the console script (a demo's server, a pool)
    is handed the parent's sys.argv, so it took itself for the command and installed
    the start-up handler: Ctrl-C there printed the command's line and exit 130 instead
    of the KeyboardInterrupt its own code expects."""
    parent = tmp_path / "bin" / "tensorstream"  # the console script's name
    parent.write_text(
        "import multiprocessing, signal, sys\n"
        "def report(q):\n"
        "    import tensorstream\n"
        "    q.put(signal.getsignal(signal.SIGINT) is signal.default_int_handler)\n"
        "if __name__ == '__main__':\n"
        "    import tensorstream\n"
        "    mine = signal.getsignal(signal.SIGINT) is tensorstream._exit_interrupted\n"
        "    ctx = multiprocessing.get_context('spawn')\n"
        "    q = ctx.Queue()\n"
        "    p = ctx.Process(target=report, args=(q,))\n"
        "    p.start()\n"
        "    print(mine, q.get(timeout=60))\n"
        "    p.join()\n")
    proc = _run([sys.executable, str(parent)], launch["env"], None)  # type: ignore[arg-type]
    assert proc.stdout.split() == ["True", "True"], proc.stdout + proc.stderr


#: A program whose own SIGALRM handler raises (pytest-timeout's, a deadline of
#: one's own) at the first line of tensorstream/__init__.py that starts with AT,
#: once SIGINT is held back.
_ALARM_WHILE_HELD = """\
import linecache, os, signal, sys

def _alarm(signum, frame):
    raise TimeoutError("deadline")

signal.signal(signal.SIGALRM, _alarm)

def _tracer(frame, event, arg):
    name = frame.f_code.co_filename
    if not name.endswith(os.path.join("tensorstream", "__init__.py")):
        return None
    if event == "line" and linecache.getline(name, frame.f_lineno).startswith(AT):
        sys.settrace(None)
        frame.f_trace = None
        os.kill(os.getpid(), signal.SIGALRM)
    return _tracer

sys.settrace(_tracer)
try:
    import tensorstream
except TimeoutError:
    print("timed out")
blocked = signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])
print("SIGINT blocked" if blocked else "SIGINT deliverable")
"""


@pytest.mark.skipif(not hasattr(signal, "pthread_sigmask"), reason="no signal masks here")
@pytest.mark.parametrize("at", ["def _started_with", "def _launched_as_command",
                                "def _exit_interrupted", "try:", "    if _launched_as_command()"])
def test_an_exception_while_sigint_is_held_back_leaves_it_deliverable(
        launch: dict[str, object], tmp_path: Path, at: str) -> None:
    # An exception from a program's own signal handler at a line while the package held
    # SIGINT back, before the try that restores it: SIGINT stayed blocked in the main
    # thread for the rest of the process (Ctrl-C did nothing).
    prog = tmp_path / "prog.py"
    prog.write_text(f"AT = {at!r}\n" + _ALARM_WHILE_HELD)
    proc = _run([sys.executable, str(prog)], launch["env"], None)  # type: ignore[arg-type]
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["timed out", "SIGINT deliverable"], proc.stdout
