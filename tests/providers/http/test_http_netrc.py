"""The host's entry of a netrc file: found whatever the case of its name (curl compares
them so; host names know no case), and the source of a ``default`` entry named as
that, not as a ``machine`` line the file does not have."""

from __future__ import annotations

import base64
import uuid
from pathlib import Path

import pytest

import tensorstream
from tensorstream.testing.http_server import HTTPTestServer

pytestmark = pytest.mark.usefixtures("isolated_env", "http_reset")

DATA = b"netrc data " * 100


def _basic(login: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{login}:{password}".encode()).decode()


def _by_name(server: HTTPTestServer) -> tuple[str, str]:
    """A key on ``server`` and its URL under the host name ``localhost``."""
    key = f"netrc-{uuid.uuid4().hex[:10]}.bin"
    server.put(key, DATA)
    port = server.url(key).split("://", 1)[1].split("/", 1)[0].rpartition(":")[2]
    return key, f"http://localhost:{port}/{key}"


@pytest.mark.parametrize("machine", ["LocalHost", "LOCALHOST"])
def test_a_netrc_machine_is_found_whatever_its_case(
        http_server: HTTPTestServer, isolated_env: Path, machine: str) -> None:
    # Was: no entry found, the request went without Authorization (a bare 401).
    key, url = _by_name(http_server)
    netrc = isolated_env / "home" / ".netrc"
    netrc.write_text(f"machine {machine} login alice password netrc-canary\n")
    with tensorstream.open(url) as f:
        assert f.read(10) == DATA[:10]
    assert http_server.requests_for(key)[-1].headers["Authorization"] == _basic(
        "alice", "netrc-canary")
    report = str(tensorstream.describe_credentials(url))
    assert f"{netrc} [machine {machine}]" in report and "netrc-canary" not in report


def test_a_netrc_default_entry_is_named_as_the_default(
        http_server: HTTPTestServer, isolated_env: Path) -> None:
    # Was named "[machine localhost]", a line the file does not have.
    key, url = _by_name(http_server)
    netrc = isolated_env / "home" / ".netrc"
    netrc.write_text("machine other.example login bob password other-pw\n"
                     "default login anon password netrc-canary\n")
    with tensorstream.open(url) as f:
        f.read(10)
    assert http_server.requests_for(key)[-1].headers["Authorization"] == _basic(
        "anon", "netrc-canary")
    report = str(tensorstream.describe_credentials(url))
    assert f"{netrc} [default]" in report and "[machine" not in report
    assert "netrc-canary" not in report
