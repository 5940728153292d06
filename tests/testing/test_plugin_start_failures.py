"""The plugin when a session server cannot start: the first failure sticks for the
session, and every test that asks for that server gets one error naming the cause."""

from __future__ import annotations

import os
import stat

import pytest

import tensorstream

pytest_plugins = ["pytester"]

_SRC = os.path.dirname(os.path.dirname(os.path.abspath(tensorstream.__file__)))


@pytest.fixture(autouse=True)
def _quiet_ini(pytester):
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")


def _broken_servers(pytester, monkeypatch) -> str:
    """moto's package raising on import and a ``redis-server`` whose port is always
    taken, each counting its starts in the returned file (``redis-cli`` stays real)."""
    tries = pytester.path / "tries.txt"
    missing = pytester.mkdir("missing")
    (missing / "moto").mkdir()
    (missing / "moto" / "__init__.py").write_text(
        f"with open({str(tries)!r}, 'a') as f:\n    f.write('moto\\n')\n"
        "raise ModuleNotFoundError(\"No module named 'moto'\", name='moto')\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(missing), _SRC, os.environ.get("PYTHONPATH", "")]))
    bin_dir = pytester.mkdir("bin")
    fake = bin_dir / "redis-server"
    # What redis-server logs (then it exits) when another process holds its port.
    fake.write_text(f"""#!/bin/sh
echo redis-server >> {tries}
log=$(sed -n 's/^logfile //p' "$1")
echo "# Warning: Could not create server TCP listening socket 127.0.0.1:1: bind: \
Address already in use" >> "$log"
echo "# Failed listening on port 1 (tcp), aborting." >> "$log"
exit 1
""")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", os.pathsep.join([str(bin_dir), os.environ["PATH"]]))
    return str(tries)


def test_a_server_that_cannot_start_is_tried_once_per_session(pytester, monkeypatch):
    # Every test that asked for a server that had failed to start started it again:
    # moto's child for each S3 test, five ports' worth of redis-server for each Redis
    # test (slow), and N tracebacks of the same failure through the plugin.
    tries = _broken_servers(pytester, monkeypatch)
    pytester.makepyfile(test_broken="""
        import pytest

        @pytest.mark.parametrize("i", range(3))
        def test_s3(tensorstream_s3, i):
            pass

        @pytest.mark.parametrize("i", range(3))
        def test_redis(tensorstream_redis, i):
            pass

        def test_http(tensorstream_http):  # a server that starts is not affected
            pass
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly",
                                           "--tensorstream-redis=real")
    result.assert_outcomes(passed=1, errors=6)
    with open(tries) as f:
        started = f.read().split()
    assert started.count("moto") == 1
    assert started.count("redis-server") == 5  # the first test's five ports, then no more
    output = "\n".join(result.outlines)

    def lines(start: str) -> int:
        return sum(line.startswith(start) for line in result.outlines)

    # One error per test, naming the cause; no traceback through the plugin, no chain
    # of causes (the first test's captured stderr still has the child's own).
    assert lines("moto S3 server did not start: ModuleNotFoundError") == 1, output
    assert lines("the moto S3 server failed to start earlier in this session") == 2, output
    assert lines("redis-server found no free port in 5 tries") == 1, output
    assert lines("the session's Redis failed to start earlier in this session") == 2, output
    for noise in ("plugin.py:", "backends.py:", "start_once.py:", "direct cause",
                  "During handling"):
        assert noise not in output, output
    result.stdout.fnmatch_lines([
        "*ERROR at setup of test_s3?0?*",
        "moto S3 server did not start: ModuleNotFoundError: No module named 'moto' "
        "(*pip install 'tensorstream[[]test]'*",
        "*ERROR at setup of test_s3?1?*",
        "the moto S3 server failed to start earlier in this session*: moto S3 server did "
        "not start: ModuleNotFoundError: No module named 'moto'*",
        "*ERROR at setup of test_redis?0?*",
        "redis-server found no free port in 5 tries*Address already in use*",
        "*ERROR at setup of test_redis?1?*",
        "the session's Redis failed to start earlier*redis-server found no free port*",
    ])


def test_each_configuration_fails_or_starts_on_its_own(pytester, monkeypatch):
    # A failure sticks to the server that failed: S3 without signature checks is
    # another moto server and tried once more; a Redis failure leaves S3 alone.
    tries = _broken_servers(pytester, monkeypatch)
    pytester.makepyfile(test_configs="""
        import pytest

        def test_signed(tensorstream_s3):
            pass

        @pytest.mark.tensorstream_s3(auth=False)
        def test_unsigned(tensorstream_s3):
            pass

        @pytest.mark.tensorstream_s3(auth=False)
        def test_unsigned_again(tensorstream_s3):
            pass
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(errors=3)
    with open(tries) as f:
        assert f.read().split() == ["moto", "moto"]


def test_under_xdist_each_worker_tries_once_and_says_so_once_per_test(pytester, monkeypatch):
    # Each pytest-xdist worker is a session of its own: its own try, its own sticky
    # failure; each test's error still comes once, naming the cause.
    tries = _broken_servers(pytester, monkeypatch)
    pytester.makepyfile(test_broken="""
        import pytest

        @pytest.mark.parametrize("i", range(6))
        def test_s3(tensorstream_s3, i):
            pass

        def test_http(tensorstream_http):
            pass
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly",
                                           "-n", "2")
    result.assert_outcomes(passed=1, errors=6)
    with open(tries) as f:
        started = f.read().split().count("moto")
    assert 1 <= started <= 2  # at most once per worker
    output = "\n".join(result.outlines)
    first = sum(line.startswith("moto S3 server did not start: ModuleNotFoundError")
                for line in result.outlines)
    again = sum(line.startswith("the moto S3 server failed to start earlier in this session")
                for line in result.outlines)
    assert (first, again) == (started, 6 - started), output
