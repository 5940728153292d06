"""One data plane per protocol: every front door that reads HTTP(S) or S3
(``open``, ``read_range``, the async ``readinto``/``stat``, ``cat``, ``cp``)
sends its requests through ``http.client`` (``providers/_http/range_get.py``).

Checked by behaviour, in a fresh process per backend: aiohttp and aiobotocore
are never even imported by a read, botocore never sends a request of its own
(it only resolves URLs and signs), and the HTTP server sees no aiohttp
client. A second GET implementation coming back fails these tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from fixtures_s3 import S3_BUCKET
from tensorstream.testing.http_server import HTTPTestServer
from tensorstream.testing.s3_server import MotoS3Server

pytestmark = pytest.mark.usefixtures("isolated_env")

DATA = os.urandom((3 << 20) + 12345)

# Runs in a fresh interpreter: every front door reads URI with OPTIONS.
_CLIENT = r"""
import asyncio, io, json, os, sys, tempfile
uri, options, size = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
sent = []
import botocore.httpsession as hs  # third-party: record any request botocore sends itself
_send = hs.URLLib3Session.send
def send(self, request):
    sent.append(f"{request.method} {request.url.split('?')[0]}")
    return _send(self, request)
hs.URLLib3Session.send = send
import tensorstream
from tensorstream.cli.main import main
from tensorstream.copy import copy
digests = {}
import hashlib
h = lambda b: hashlib.sha256(b).hexdigest()
with tensorstream.open(uri, **options) as f:
    digests["open"] = h(f.read())
digests["read_range"] = h(asyncio.run(tensorstream.read_range(uri, 0, size, **options)))
async def provider_reads():
    parsed = tensorstream.parse_uri(uri)
    async with tensorstream.get_provider(parsed, **options) as p:
        info = await p.stat(parsed.path)
        buf = bytearray(info.size)
        await p.readinto(parsed.path, 0, memoryview(buf), etag=info.etag)
        return h(buf)
digests["readinto"] = asyncio.run(provider_reads())
flags = []
for k, v in options.items():
    flags += ["--" + k.replace("_", "-"), str(v)]
out = tempfile.TemporaryFile()
saved = sys.stdout
wrapper = sys.stdout = io.TextIOWrapper(out, write_through=True)
try:
    rc_cat = main(["cat", *flags, uri])
finally:
    sys.stdout = saved
    wrapper.flush()
    wrapper.detach()
out.seek(0)
digests["cat"] = h(out.read())
dst = tempfile.mkdtemp()
result = copy(uri, dst + "/", **options)
assert result.ok, result.errors
(name,) = os.listdir(dst)
with open(os.path.join(dst, name), "rb") as f:
    digests["cp"] = h(f.read())
print(json.dumps({
    "digests": digests,
    "aiohttp": "aiohttp" in sys.modules,
    "aiobotocore": "aiobotocore" in sys.modules,
    "botocore_client": "botocore.client" in sys.modules,
    "botocore_sent": sent,
    "rc_cat": rc_cat,
}))
"""


def _run_client(uri: str, options: dict[str, object], tmp_path: Path) -> dict[str, object]:
    script = tmp_path / "client.py"
    script.write_text(_CLIENT)
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, str(script), uri, json.dumps(options),
                           str(len(DATA))], capture_output=True, text=True, env=env,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _check(result: dict[str, object]) -> None:
    import hashlib

    want = hashlib.sha256(DATA).hexdigest()
    assert result["digests"] == dict.fromkeys(
        ("open", "read_range", "readinto", "cat", "cp"), want)
    assert result["rc_cat"] == 0
    # No second data plane: the async client libraries are never loaded by a read.
    assert result["aiohttp"] is False
    assert result["aiobotocore"] is False


def test_http_front_doors_use_one_plane(http_server: HTTPTestServer, tmp_path: Path) -> None:
    key = f"plane/{uuid.uuid4().hex}.bin"
    http_server.put(key, DATA)
    http_server.clear_log()
    result = _run_client(http_server.url(key), dict(http_server.options), tmp_path)
    _check(result)
    seen = http_server.requests_for(key)
    assert seen, "no request reached the server"
    agents = {r.headers.get("User-Agent", "") for r in seen}
    assert not any("aiohttp" in a.lower() for a in agents), agents
    assert {r.method for r in seen} <= {"GET", "HEAD"}


def test_s3_front_doors_use_one_plane(moto_s3: MotoS3Server, tmp_path: Path) -> None:
    key = f"plane/{uuid.uuid4().hex}.bin"
    moto_s3.put(S3_BUCKET, key, DATA)
    result = _run_client(f"s3://{S3_BUCKET}/{key}", moto_s3.options(), tmp_path)
    _check(result)
    # botocore signs; it sends nothing itself (no HEAD, no GET). With static keys,
    # a path-style endpoint and a region, not even a botocore client is built.
    assert result["botocore_sent"] == []
    assert result["botocore_client"] is False
