"""Secrets out of third-party log records and error chains (``tensorstream/_log_redaction.py``):
header dumps masked, and the text around them kept."""

from __future__ import annotations

import base64
import hashlib
import logging
import traceback
from types import SimpleNamespace

import pytest

from tensorstream._log_redaction import install_secret_filter, mask_secrets, scrub_chain
from tensorstream.errors import NotFoundError
from tensorstream.testing.http_headers import request_repr
from tensorstream.testing.s3_server import MotoS3Server


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


_SSE_C = ("x-amz-server-side-encryption-customer-key", "x-amz-server-side-encryption-customer-key-MD5",
          "x-amz-copy-source-server-side-encryption-customer-key",
          "x-amz-copy-source-server-side-encryption-customer-key-MD5")


@pytest.mark.parametrize("name", [*_SSE_C, "X-Amz-Security-Token", "x-api-key"])
@pytest.mark.parametrize("dump", [
    "{{'{name}': b'CANARY/x+y==', 'x-amz-server-side-encryption-customer-algorithm': 'AES256'}}",
    "host:s3\n{lower}:CANARY/x+y==\nx-amz-server-side-encryption-customer-algorithm:AES256",
    "{name}: CANARY/x+y==\r\nx-amz-server-side-encryption-customer-algorithm: AES256",
])
def test_sse_c_keys_and_tokens_are_masked_in_header_dumps(name: str, dump: str) -> None:
    """An SSE-C key (the object's encryption key itself) and its MD5 were shown whole in
    botocore's header dumps and canonical requests; the algorithm beside them stays."""
    text = dump.format(name=name, lower=name.lower())
    shown = mask_secrets(text)
    assert "CANARY" not in shown and "***" in shown
    assert name.lower() in shown.lower() and "customer-algorithm" in shown
    assert "AES256" in shown


def test_signed_header_names_and_the_algorithm_stay() -> None:
    """Neighbours: the SignedHeaders list names the headers (no values) and is kept."""
    text = ("SignedHeaders=host;x-amz-server-side-encryption-customer-key;"
            "x-amz-server-side-encryption-customer-key-md5, x-amz-server-side-encryption: AES256")
    assert mask_secrets(text) == text


def test_a_botocore_debug_log_of_an_sse_c_copy_holds_no_key(
        moto_s3: MotoS3Server, caplog: pytest.LogCaptureFixture) -> None:
    """A real SSE-C PutObject and CopyObject through botocore at DEBUG, against moto's
    server: no record shows the key or its MD5 (base64), as sent in the headers."""
    install_secret_filter()
    key = bytes(range(32))
    sent = [base64.b64encode(key).decode(), base64.b64encode(hashlib.md5(key).digest()).decode()]
    moto_s3.create_bucket("ssec")
    caplog.set_level(logging.DEBUG, logger="botocore")
    moto_s3.client.put_object(Bucket="ssec", Key="a", Body=b"x", SSECustomerAlgorithm="AES256",
                              SSECustomerKey=key)
    moto_s3.client.copy_object(Bucket="ssec", Key="b", CopySource={"Bucket": "ssec", "Key": "a"},
                               CopySourceSSECustomerAlgorithm="AES256",
                               CopySourceSSECustomerKey=key, SSECustomerAlgorithm="AES256",
                               SSECustomerKey=key)
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "x-amz-copy-source-server-side-encryption-customer-key" in text.lower()
    for value in sent:
        assert value not in text


def test_an_error_chain_quoting_an_sse_c_key_is_masked() -> None:
    """A third-party error whose text holds a header dump (aiohttp's does) is printed
    masked once the chain is scrubbed."""
    dump = {"x-amz-server-side-encryption-customer-key": "CAN" + "ARY=="}
    try:
        try:
            raise RuntimeError(f"400: {dump}")
        except RuntimeError as exc:
            raise NotFoundError("s3://b/k: no such object") from exc
    except NotFoundError as exc:
        scrubbed = scrub_chain(exc)
    text = "".join(traceback.format_exception(scrubbed))
    assert "CANARY" not in text and "customer-key': '***'" in text


def test_request_reprs_of_the_test_servers_mask_sse_c_keys() -> None:
    """The test servers' request reprs hide the same headers (one list)."""
    record = SimpleNamespace(method="PUT", path="/b/k", status=200, headers={
        "x-amz-server-side-encryption-customer-key": "CANARY==",
        "X-Amz-Copy-Source-Server-Side-Encryption-Customer-Key-MD5": "CANARY==",
        "x-amz-server-side-encryption-customer-algorithm": "AES256"})
    shown = request_repr(record)
    assert "CANARY" not in shown and "AES256" in shown


@pytest.mark.parametrize(("text", "shown"), [
    ("'SSECustomerKey': 'CANARY/x+y==', 'SSECustomerAlgorithm': 'AES256'",
     "'SSECustomerKey': ***, 'SSECustomerAlgorithm': 'AES256'"),
    ("'CopySourceSSECustomerKey': b'CAN\\'ARY, x: }', 'SSECustomerKeyMD5': 'CANARY=='}",
     "'CopySourceSSECustomerKey': ***, 'SSECustomerKeyMD5': ***}"),
])
def test_sse_c_keys_as_botocore_parameters_are_masked(text: str, shown: str) -> None:
    """botocore logs a call's parameters at DEBUG before they become headers; a key given
    as bytes may hold quotes, commas or colons and is masked whole."""
    assert mask_secrets(text) == shown


@pytest.fixture
def fresh_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """The registry of secrets in use, empty for the test and put back after it."""
    from tensorstream import _log_redaction
    for name in ("_REGISTERED", "_PER_REQUEST"):
        if hasattr(_log_redaction, name):
            monkeypatch.setattr(_log_redaction, name, {})


def test_a_long_run_over_presigned_urls_keeps_its_credentials_masked(fresh_registry: None) -> None:
    """10,000 reads of distinct presigned URLs each remember their signature; the
    registry stays bounded, and neither forgets a credential registered at the start (a
    Redis password redis-py may log) nor the signature of the URL still being read."""
    from tensorstream import _log_redaction
    from tensorstream._log_redaction import register_secret
    from tensorstream.providers.http.provider import HTTPProvider

    register_secret("CANARY-redis-password")
    provider = HTTPProvider("http://127.0.0.1:9")
    in_use = "/m.bin?X-Amz-Signature=CANARYINUSE0001&X-Amz-Date=20261207T000000Z"
    for i in range(10_000):
        provider._url(f"/s{i}.bin?X-Amz-Signature=sig{i:064x}&X-Amz-Credential=AKIA%2F{i}")
        if i % 50 == 0:  # (a file being read sends its URL with each part)
            provider._url(in_use)
    remembered = sum(len(v) for k, v in vars(_log_redaction).items()
                     if k in ("_REGISTERED", "_PER_REQUEST"))
    assert remembered <= 512
    shown = mask_secrets("AUTH failed: CANARY-redis-password; 403 CANARYINUSE0001")
    assert "CANARY" not in shown, shown


def test_a_record_logged_while_a_secret_is_registered_does_not_hang(
        fresh_registry: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A record made on the registering thread while it holds the registry (a finalizer
    the collector runs there, aiohttp's "Unclosed client session") is masked under that
    lock: a plain lock hung the thread for ever."""
    import threading

    from tensorstream import _log_redaction
    from tensorstream._log_redaction import register_secret

    class Logging(dict):  # type: ignore[type-arg]
        def __setitem__(self, key: str, value: None) -> None:
            logging.getLogger("botocore.hooks").warning("finalizer ran: %s", key)
            super().__setitem__(key, value)

    monkeypatch.setattr(_log_redaction, "_PER_REQUEST", Logging({"CANARY-earlier-0123": None}))
    install_secret_filter()
    done = threading.Event()

    def register() -> None:
        register_secret("CANARY-0123456789", per_request=True)
        done.set()

    threading.Thread(target=register, daemon=True).start()
    assert done.wait(10), "registering a secret hung"
