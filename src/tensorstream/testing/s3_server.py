"""A real S3 endpoint on loopback for tests: moto's server, optionally over HTTPS
and optionally checking signatures.

moto's in-process decorator (``mock_aws``) patches botocore's sync HTTP stack
and cannot be reached by aiobotocore, so tests talk to moto's
``ThreadedMotoServer`` over a socket instead. It runs in a child process:

* its request handling does not compete for the test process's GIL (moto is
  slow, about 40 MB/s, and the machines running tests are small);
* signature checking (``auth=True``) flips a process-wide moto setting, which
  must not leak into other tests using moto in the test process.

With ``auth=True`` the server holds one IAM user whose keys are
``access_key_id``/``secret_access_key``; any other key or a wrong secret is
refused (``InvalidAccessKeyId`` / ``SignatureDoesNotMatch``).

>>> with MotoS3Server() as s3:                      # doctest: +SKIP
...     s3.create_bucket("models")
...     s3.put("models", "a.bin", b"data")
...     tensorstream.open("s3://models/a.bin", **s3.options()).read()
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["MotoS3Server", "isolated_s3_env"]

_START_TIMEOUT = 60.0
#: What a failed start adds: the usual cause is moto's server extra not installed.
_INSTALL_HINT = ("a missing module means tensorstream's test extra is not installed: "
                 "pip install 'tensorstream[test]' (moto[server])")


class MotoS3Server:
    """moto's S3 server on ``127.0.0.1`` and a free port, in a child process.

    ``tls=True`` serves HTTPS with a certificate from a throwaway trustme CA
    whose PEM is at :attr:`ca_bundle_path`. ``auth=True`` makes the server
    check SigV4 signatures against one IAM user (see the module docstring).
    ``tmp_dir``: where its temporary directory goes (default: the system's).
    """

    def __init__(self, *, tls: bool = False, auth: bool = True, region: str = "us-east-1",
                 tmp_dir: str | None = None, require_client_cert: bool = False) -> None:
        self.tls = tls or require_client_cert
        self.require_client_cert = require_client_cert
        #: A client certificate and key of the server's CA (``require_client_cert``).
        self.client_cert_path: str | None = None
        self.client_key_path: str | None = None
        self.tmp_dir = tmp_dir
        self.auth = auth
        self.region = region
        self.port = 0
        self.access_key_id = "testing"
        self.secret_access_key = "testing"
        self.ca_bundle_path: str | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._client: Any = None

    def __repr__(self) -> str:
        state = f"port={self.port}" if self._proc else "stopped"
        return f"MotoS3Server(tls={self.tls}, auth={self.auth}, {state})"

    # -- lifecycle ------------------------------------------------------------
    def start(self) -> MotoS3Server:
        """Start the child process and wait until it answers."""
        if self._proc is not None:
            return self
        self._tmp = tempfile.TemporaryDirectory(prefix="tensorstream-moto-", dir=self.tmp_dir)
        args = [sys.executable, "-m", "tensorstream.testing.s3_server", "--region", self.region]
        if self.auth:
            args.append("--auth")
        if self.tls:
            cert, key, ca, client = _make_certificate(Path(self._tmp.name))
            self.ca_bundle_path = ca
            args += ["--certfile", cert, "--keyfile", key]
            if self.require_client_cert:
                self.client_cert_path, self.client_key_path = client
                args += ["--client-ca", ca]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "S3_"))}
        env.update(isolated_s3_env(self._tmp.name))
        # stdin: a pipe only this process writes to; the child exits when it closes,
        # so a test run killed without teardown leaves no moto server behind.
        self._proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        try:
            info = self._read_ready_line()
        except BaseException:
            self.stop()
            raise
        self.port = int(info["port"])
        self.access_key_id = info["access_key_id"]
        self.secret_access_key = info["secret_access_key"]
        return self

    def _read_ready_line(self) -> dict[str, Any]:
        assert self._proc is not None and self._proc.stdout is not None
        deadline = time.monotonic() + _START_TIMEOUT
        line = b""
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or self._proc.poll() is not None:
                raise RuntimeError(f"moto S3 server did not start (its stderr, above, says "
                                   f"why; {_INSTALL_HINT})")
            ready, _, _ = select.select([self._proc.stdout], [], [], left)
            if ready:
                chunk = os.read(self._proc.stdout.fileno(), 4096)
                if not chunk:
                    raise RuntimeError(f"moto S3 server exited during start-up (its stderr, "
                                       f"above, says why; {_INSTALL_HINT})")
                line += chunk
        info = dict(json.loads(line))
        if "error" in info:  # what the child failed on, so the error names it
            raise RuntimeError(f"moto S3 server did not start: {info['error']} ({_INSTALL_HINT})")
        return info

    def stop(self) -> None:
        """Stop the server and remove its temporary files. Idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover
                proc.kill()
                proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
        self._client = None

    def __enter__(self) -> MotoS3Server:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- addresses and options ----------------------------------------------
    @property
    def endpoint_url(self) -> str:
        scheme = "https" if self.tls else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    def options(self, **extra: Any) -> dict[str, Any]:
        """tensorstream options reaching this server with its valid keys."""
        opts: dict[str, Any] = {
            "s3_endpoint": self.endpoint_url,
            "s3_access_key_id": self.access_key_id,
            "s3_secret_access_key": self.secret_access_key,
            "s3_region": self.region,
        }
        if self.ca_bundle_path:
            opts["ca_bundle"] = self.ca_bundle_path
        if self.client_cert_path:
            opts.update(client_cert=self.client_cert_path, client_key=self.client_key_path)
        opts.update(extra)
        return opts

    # -- direct access (boto3, bypassing tensorstream) -------------------------
    @property
    def client(self) -> Any:
        """A boto3 S3 client with the server's valid keys."""
        if self._client is None:
            import boto3
            from botocore.config import Config

            # A session of its own: boto3.client() makes boto3's process-wide default
            # session, which then kept the AWS config of the moment (under the plugin,
            # a test's isolated, empty one) for every later boto3.client() of the run.
            self._client = boto3.session.Session().client(
                "s3",
                endpoint_url=self.endpoint_url,
                aws_access_key_id=self.access_key_id,
                aws_secret_access_key=self.secret_access_key,
                region_name=self.region,
                verify=self.ca_bundle_path if self.tls else True,
                config=Config(s3={"addressing_style": "path"}, retries={"total_max_attempts": 2},
                              client_cert=(self.client_cert_path, self.client_key_path)
                              if self.client_cert_path else None),
            )
        return self._client

    def create_bucket(self, name: str) -> None:
        """Create ``name`` (no error if it already exists)."""
        try:
            self.client.create_bucket(Bucket=name)
        except self.client.exceptions.BucketAlreadyOwnedByYou:
            pass

    def put(self, bucket: str, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=bucket, Key=key, Body=data)

    def get(self, bucket: str, key: str) -> bytes:
        return bytes(self.client.get_object(Bucket=bucket, Key=key)["Body"].read())

    def exists(self, bucket: str, key: str) -> bool:
        try:
            self.client.head_object(Bucket=bucket, Key=key)
        except self.client.exceptions.ClientError as exc:
            if exc.response["ResponseMetadata"]["HTTPStatusCode"] == 404:
                return False
            raise
        return True

    def open_multipart_uploads(self, bucket: str, prefix: str = "") -> list[str]:
        """Keys with a multipart upload still open (never completed or aborted)."""
        resp = self.client.list_multipart_uploads(Bucket=bucket, Prefix=prefix)
        return [u["Key"] for u in resp.get("Uploads", [])]


def isolated_s3_env(directory: str | os.PathLike[str]) -> dict[str, str]:
    """Environment variables that keep botocore away from real credentials.

    Config and credentials files point at an empty file inside ``directory``
    and instance metadata is disabled. Callers should also drop every other
    ``AWS_*``/``S3_*`` variable (``isolated_env`` in the tests does).
    """
    empty = Path(directory) / "empty-aws-config"
    empty.write_text("")
    return {
        "AWS_CONFIG_FILE": str(empty),
        "AWS_SHARED_CREDENTIALS_FILE": str(empty),
        "AWS_EC2_METADATA_DISABLED": "true",
        "HOME": str(directory),
    }


def _make_certificate(directory: Path) -> tuple[str, str, str, tuple[str, str]]:
    """Server certificate, key, CA, and a client certificate and key of that CA."""
    from .extras import trustme as _trustme

    trustme = _trustme()
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_path, key_path, ca_path = (directory / n for n in ("cert.pem", "key.pem", "ca.pem"))
    cert.private_key_pem.write_to_path(str(key_path))
    cert.cert_chain_pems[0].write_to_path(str(cert_path))
    for extra in cert.cert_chain_pems[1:]:
        extra.write_to_path(str(cert_path), append=True)
    ca.cert_pem.write_to_path(str(ca_path))
    client = ca.issue_cert("tensorstream-client")
    client_cert, client_key = directory / "client.pem", directory / "client.key"
    client.cert_chain_pems[0].write_to_path(str(client_cert))
    client.private_key_pem.write_to_path(str(client_key))
    return str(cert_path), str(key_path), str(ca_path), (str(client_cert), str(client_key))


# -- the child process ---------------------------------------------------------
_ADMIN_POLICY = json.dumps(
    {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
)


def _serve(argv: list[str]) -> None:  # pragma: no cover - runs in the child
    import argparse
    import logging
    import ssl

    from moto import settings
    from moto.moto_server.threaded_moto_server import ThreadedMotoServer
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    from tensorstream.testing.s3_query_auth import QueryAuth

    parser = argparse.ArgumentParser()
    parser.add_argument("--region", default="us-east-1")
    parser.add_argument("--auth", action="store_true")
    parser.add_argument("--certfile")
    parser.add_argument("--keyfile")
    parser.add_argument("--client-ca")
    args = parser.parse_args(argv)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no access log on stderr

    ssl_context = None
    if args.certfile:
        ssl_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ssl_context.load_cert_chain(args.certfile, args.keyfile)
        if args.client_ca:  # mutual TLS: a client certificate of this CA is required
            ssl_context.load_verify_locations(args.client_ca)
            ssl_context.verify_mode = ssl.CERT_REQUIRED

    # moto checks only an Authorization header: presigned URLs go through QueryAuth.
    app = QueryAuth(DomainDispatcherApplication(create_backend_app), args.region)

    class _Server(ThreadedMotoServer):
        # moto's own entry point, plus werkzeug's ssl_context for HTTPS.
        def _server_entry(self) -> None:
            self._server = make_server(
                self._ip_address, self._port, app, True,
                request_handler=MotoRequestHandler, ssl_context=ssl_context,
            )
            self._server_ready_event.set()
            self._server.serve_forever()

    server = _Server(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    _host, port = server.get_host_and_port()
    keys = {"access_key_id": "testing", "secret_access_key": "testing"}
    if args.auth:
        keys = _create_admin_keys(args.region)
        app.keys = (keys["access_key_id"], keys["secret_access_key"])
        settings.INITIAL_NO_AUTH_ACTION_COUNT = 0  # from now on every request is checked
    sys.stdout.write(json.dumps({"port": port, **keys}) + "\n")
    sys.stdout.flush()
    try:  # until the parent closes our stdin, on purpose or by dying
        while os.read(0, 4096):
            pass
    except (KeyboardInterrupt, OSError):
        pass


def _create_admin_keys(region: str) -> dict[str, str]:  # pragma: no cover - child
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.iam.models import iam_backends

    iam = iam_backends[DEFAULT_ACCOUNT_ID]["global"]
    iam.create_user(region, "tensorstream-tests", "/", tags=[])
    iam.put_user_policy("tensorstream-tests", "admin", _ADMIN_POLICY)
    key = iam.create_access_key("tensorstream-tests")
    return {"access_key_id": key.access_key_id, "secret_access_key": key.secret_access_key}


def _main() -> None:  # pragma: no cover - child
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        _serve(sys.argv[1:])
    except Exception as exc:
        # On the ready line's place: the parent's error then names the cause (a missing
        # module, a port) for every test, not only in the first one's captured stderr.
        sys.stdout.write(json.dumps({"error": f"{type(exc).__name__}: {exc}"}) + "\n")
        sys.stdout.flush()
        raise


if __name__ == "__main__":  # pragma: no cover
    _main()

