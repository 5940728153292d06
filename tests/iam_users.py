"""IAM users on the moto server, for tests of what a key that may do less sees."""

from __future__ import annotations

import json
import secrets
from typing import Any


def iam_user_keys(server: Any, name: str, statements: list[dict[str, Any]]) -> dict[str, str]:
    """The keys (``s3_access_key_id``, ``s3_secret_access_key``) of a new IAM user of the
    moto ``server`` (``name``: the start of its name), whose one policy holds
    ``statements``."""
    import boto3

    iam = boto3.session.Session().client(
        "iam", endpoint_url=server.endpoint_url, aws_access_key_id=server.access_key_id,
        aws_secret_access_key=server.secret_access_key, region_name=server.region)
    user = f"{name}-{secrets.token_hex(4)}"
    iam.create_user(UserName=user)
    iam.put_user_policy(UserName=user, PolicyName="p", PolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": statements}))
    key = iam.create_access_key(UserName=user)["AccessKey"]
    return {"s3_access_key_id": key["AccessKeyId"],
            "s3_secret_access_key": key["SecretAccessKey"]}
