"""What a test left on the session's servers outside its own bucket or key prefix.

Serving code run in the environment mode writes where it likes: its own Redis
key built from ``REDIS_URL``, a key in another database, a bucket it creates
with boto3. The backends delete their own bucket or prefix at a test's end;
these snapshots let them also remove what the test added anywhere else, so the
next test finds the servers as this one found them (as moto's ``mock_aws`` and
pytest-redis's ``redisdb`` give each test a fresh store).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["RedisKeys", "s3_buckets"]

#: The databases of a Redis server (redis-server's default; the plugin's keep it).
_DATABASES = 16
_BATCH = 1000


def s3_buckets(client: Any) -> set[str]:
    """The names of every bucket on the server of a boto3 S3 ``client``."""
    return {b["Name"] for b in client.list_buckets().get("Buckets", [])}


class RedisKeys:
    """The keys of every database of one Redis server when a test started.

    ``connect(db)`` returns a ``redis.Redis`` with admin access to database ``db``."""

    def __init__(self, connect: Callable[[int], Any]) -> None:
        self._connect = connect
        self._before = self._keys()

    def _keys(self) -> dict[int, set[bytes]]:
        client = self._connect(0)
        try:  # one round trip: which databases hold keys (fakeredis has no INFO keyspace)
            pipe = client.pipeline(transaction=False)
            for db in range(_DATABASES):
                pipe.execute_command("SELECT", db)
                pipe.dbsize()
            sizes = pipe.execute()[1::2]
        finally:
            client.close()
        keys: dict[int, set[bytes]] = {}
        for db, size in enumerate(sizes):
            if size:
                client = self._connect(db)
                try:
                    keys[db] = set(client.scan_iter(count=_BATCH))
                finally:
                    client.close()
        return keys

    def delete_new(self) -> None:
        """Delete every key that was not there when the test started."""
        for db, keys in self._keys().items():
            new = list(keys - self._before.get(db, set()))
            if not new:
                continue
            client = self._connect(db)
            try:
                for i in range(0, len(new), _BATCH):
                    client.delete(*new[i:i + _BATCH])
            finally:
                client.close()
