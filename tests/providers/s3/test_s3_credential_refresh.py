"""Temporary keys that expire in the middle of a load: one provider goes on with the keys
its profile's ``credential_process`` gives next, on the blocking read path (its signing
client) and on aiobotocore's (listings), and never sends the revoked ones again."""

from __future__ import annotations

import json
import secrets
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from s3_credential_sources import Sources

import tensorstream
from fixtures_s3 import S3_BUCKET
from tensorstream.testing.s3_server import MotoS3Server

#: Seconds until the first keys enter botocore's refresh window (15 minutes before
#: their Expiration), so the first reads sign with them and later ones refresh.
FRESH_FOR = 3


def _user(server: MotoS3Server) -> tuple[str, str, str, object]:
    """A new IAM user allowed all of S3: its name, key id, secret, and the IAM client."""
    import boto3

    iam = boto3.session.Session().client(
        "iam", endpoint_url=server.endpoint_url, aws_access_key_id=server.access_key_id,
        aws_secret_access_key=server.secret_access_key, region_name=server.region)
    name = f"rotating-{secrets.token_hex(4)}"
    iam.create_user(UserName=name)
    iam.put_user_policy(UserName=name, PolicyName="p", PolicyDocument=json.dumps({
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
    key = iam.create_access_key(UserName=name)["AccessKey"]
    return name, key["AccessKeyId"], key["SecretAccessKey"], iam


def _keys(key_id: str, secret: str, expires: datetime) -> str:
    return json.dumps({"Version": 1, "AccessKeyId": key_id, "SecretAccessKey": secret,
                       "Expiration": expires.strftime("%Y-%m-%dT%H:%M:%SZ")})


async def test_keys_that_expire_mid_load_are_refreshed_and_the_load_goes_on(
        sources: Sources, moto_s3: MotoS3Server, tmp_path: Path) -> None:
    data = bytes(range(256)) * 64
    moto_s3.put(S3_BUCKET, "rotating.bin", data)
    first_user, first_id, first_secret, iam = _user(moto_s3)
    _, next_id, next_secret, _ = _user(moto_s3)
    now = datetime.now(timezone.utc)
    soon = now + timedelta(minutes=15, seconds=FRESH_FOR)
    ran = tmp_path / "ran"
    script = tmp_path / "credentials.sh"
    script.write_text(
        "#!/bin/sh\n"
        f"if [ -e {ran} ]; then echo '{_keys(next_id, next_secret, now + timedelta(hours=1))}'\n"
        f"else touch {ran}; echo '{_keys(first_id, first_secret, soon)}'; fi\n")
    script.chmod(0o755)
    sources.aws_config.write_text(f"[profile rotating]\ncredential_process = {script}\n")
    uri = f"s3://{S3_BUCKET}/rotating.bin"
    async with tensorstream.get_provider(uri, s3_endpoint=moto_s3.endpoint_url,
                                         s3_profile="rotating", retries=1) as provider:
        path = f"{S3_BUCKET}/rotating.bin"
        half = bytearray(len(data) // 2)
        assert await provider.readinto(path, 0, memoryview(half)) == len(half)
        assert [i.path async for i in provider.list(S3_BUCKET + "/rot")] == [path]
        # The first keys are revoked (their session ended) and enter the refresh window.
        iam.delete_access_key(UserName=first_user, AccessKeyId=first_id)  # type: ignore[attr-defined]
        time.sleep(FRESH_FOR + 1)
        rest = bytearray(len(data) - len(half))
        assert await provider.readinto(path, len(half), memoryview(rest)) == len(rest)
        assert bytes(half + rest) == data
        assert [i.path async for i in provider.list(S3_BUCKET + "/rot")] == [path]
