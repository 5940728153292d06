"""Secrets out of third-party log records and error chains (``tensorstream/_log_redaction.py``):
header dumps masked, and the text around them kept."""

from __future__ import annotations

import pytest

from tensorstream._log_redaction import mask_secrets


@pytest.mark.parametrize(("text", "shown"), [
    ("http stat /m?X-Amz-Security-Token=CANARY&versionId=3: HTTP 404",
     "http stat /m?X-Amz-Security-Token=***&versionId=3: HTTP 404"),
    ("{'X-Amz-Security-Token': b'CANARY/x+y==', 'Range': 'bytes=0-1'}",
     "{'X-Amz-Security-Token': b'***', 'Range': 'bytes=0-1'}"),
    ("x-amz-security-token:CANARY\nhost;x-amz-date", "x-amz-security-token:***\nhost;x-amz-date"),
    ("{'Authorization': b'AWS4-HMAC-SHA256 Credential=CANARY, Signature=ab', 'Range': 'bytes=0-1'}",
     "{'Authorization': b'***', 'Range': 'bytes=0-1'}"),
    ("Authorization: Bearer CANARY\nnext line: kept", "Authorization: ***\nnext line: kept"),
    ("Proxy-Authorization: Basic CANARY\nkept", "Proxy-Authorization: ***\nkept"),
])
def test_a_masked_header_keeps_the_text_around_it(text: str, shown: str) -> None:
    """A session token in a URL took the rest of it and the ': why' after it with it
    (``?X-Amz-Security-Token=*** HTTP 404``: cp's error lost ``&versionId=3`` and its ':'),
    and an ``Authorization:`` line took every line after it up to a quote."""
    assert mask_secrets(text) == shown
