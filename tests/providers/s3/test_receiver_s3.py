"""The blocking S3 data plane's tests again with the shared receiver asked for
(one epoll thread; see tests/providers/http/test_receiver.py). moto's server
closes the connection after every answer, so its bodies take the fallback
(the socket belongs to the response's file object alone: the reading thread
receives it); S3 and HTTP share the one ranged GET, whose receiver path the
HTTP tests cover against a keep-alive server."""

from __future__ import annotations

import pytest
import test_blocking_s3 as blocking

from tensorstream.providers._http import receiver as receiver_mod

pytestmark = pytest.mark.usefixtures("isolated_env")


@pytest.fixture(autouse=True)
def shared(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(receiver_mod, "SHARED_DEFAULT", True)


test_signed_ranges_from_many_threads_shared = blocking.test_signed_ranges_from_many_threads
test_pinned_and_past_the_end_shared = blocking.test_pinned_and_past_the_end
test_tls_needs_the_ca_bundle_shared = blocking.test_tls_needs_the_ca_bundle

