"""What a Redis refusal advises (``providers/redis/errors.py``) follows what was sent (a
password or none) and the class of the refusal (authentication, ``NOPERM``), never the
words of the server's reply: a real ``redis-server`` with ACL users."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import tensorstream
from tensorstream import errors
from tensorstream.testing.redis_server import RedisServer

GIVE_PASSWORD = "give the password in the URI's user info"
#: What a user refused a command is told to do, by what was sent.
LOG_IN = "log in as a user allowed to run it"
GRANT = "ACL SETUSER"

pytestmark = pytest.mark.usefixtures("isolated_env")

#: Reads need these (TYPE, HGETALL, STRLEN, GETRANGE, GET): a user without them is refused.
_READS = ("-type", "-get", "-hgetall", "-strlen", "-getrange")


@pytest.fixture(scope="module")
def acl_server() -> Iterator[RedisServer]:
    """A server with a password, a user 'alice' and a user 'bob' who may not read."""
    with RedisServer(password="default-pw", acl_users={"alice": "alice-pw"}) as srv:
        srv.put("advice/k", b"weights")
        with srv.client() as admin:
            admin.execute_command("ACL", "SETUSER", "bob", "on", ">bob-pw", "~*", "+@all",
                                  *_READS)
        yield srv


@pytest.fixture(scope="module")
def open_server() -> Iterator[RedisServer]:
    """A server without a password whose default user may not read (Redis 7 ACL)."""
    with RedisServer() as srv:
        srv.put("advice/k", b"weights")
        with srv.client() as admin:
            admin.execute_command("ACL", "SETUSER", "default", *_READS)
        yield srv


def _refusal(uri: str, **options: object) -> str:
    with pytest.raises(errors.PermissionDeniedError) as info:
        tensorstream.open(uri, retries=1, **options).read()
    return str(info.value)


def test_no_permission_without_a_password_says_to_log_in_as_another_user(
        open_server: RedisServer) -> None:
    """``-NOPERM`` to the default user, no password sent: it said only the server's 'this
    user has no permissions to run the 'type' command', no way out."""
    said = _refusal(open_server.url("advice/k"))
    assert "no permissions" in said and "no password" in said
    assert LOG_IN in said and "redis_username=" in said and "redis_password=" in said
    assert GIVE_PASSWORD not in said and GRANT not in said


def test_no_permission_with_a_password_says_to_grant_it(acl_server: RedisServer) -> None:
    """``-NOPERM`` to a user who logged in with a password: the password is right; the user
    needs the command (or another user)."""
    said = _refusal(acl_server.url("advice/k", user="bob", password="bob-pw"))
    assert "no permissions" in said and "password from URI userinfo" in said
    assert GRANT in said and "'bob'" in said
    assert GIVE_PASSWORD not in said and LOG_IN not in said


@pytest.mark.parametrize(("user", "password", "advice"), [
    (None, None, GIVE_PASSWORD),  # NOAUTH (HELLO before AUTH)
    ("alice", None, GIVE_PASSWORD),  # WRONGPASS: a user name, no password
    ("alice", "wrong-pw", "check the password"),  # WRONGPASS: the password is wrong
    (None, "wrong-pw", "check the password"),  # WRONGPASS for the default user
])
def test_an_authentication_refusal_advises_by_what_was_sent(
        acl_server: RedisServer, user: str | None, password: str | None, advice: str) -> None:
    options = {"redis_username": user} if user else {}
    said = _refusal(acl_server.url("advice/k", password=password), **options)
    assert "authentication failed" in said and advice in said, said
    for other in {GIVE_PASSWORD, "check the password", LOG_IN, GRANT} - {advice}:
        assert other not in said, said
    assert "wrong-pw" not in said
