"""Real Redis servers on loopback for tests: plain, password, ACL user, TLS, 3-node cluster.

Runs Debian's ``redis-server`` as child processes (own process group, temp
dir, ``save ''``, ``appendonly no``); secrets go into a 0600 config file,
never into argv. Always torn down: use them as context managers.

>>> with RedisServer(password="s3cret") as srv:  # doctest: +SKIP
...     srv.put("model", b"bytes")
...     tensorstream.open(srv.url("model")).read()
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from types import TracebackType
from typing import Any

from ..uri import redis_key_path
from .redis_process import (
    START_TIMEOUT,
    RedisProcess,
    RedisUnavailable,
    conf_arg,
    free_port,
    on_a_free_port,
    redis_available,
    wait_ready,
)

__all__ = ["RedisCluster", "RedisServer", "RedisUnavailable", "free_port", "redis_available"]


class _DirectValues:
    """Values written and read straight through a server's :meth:`client` (no
    tensorstream involved): :class:`RedisServer`'s and :class:`RedisCluster`'s."""

    def client(self) -> Any:
        raise NotImplementedError

    def put(self, key: str, data: bytes) -> None:
        """Store ``data`` as a plain string at ``key`` (no tensorstream involved)."""
        with self.client() as c:
            c.set(key, data)

    def put_tensorizer_layout(self, key: str, data: bytes, piece: int = 1 << 20) -> None:
        """Store ``data`` the way ``to_redis`` does: ``key:header:0``, ``key:data:<offset>``..."""
        with self.client() as c:
            store_tensorizer_layout(c, key, data, piece)

    def get(self, key: str) -> bytes | None:
        with self.client() as c:
            value = c.get(key)
            return bytes(value) if value is not None else None


class RedisServer(_DirectValues):
    """One ``redis-server`` on a free loopback port.

    ``password`` sets ``requirepass`` (the default user); ``acl_users`` maps
    extra user names to passwords (full access to all keys); ``tls=True``
    serves TLS only (trustme CA in :attr:`ca_file`), with ``tls_auth_clients``
    ``"no"``, ``"optional"`` or ``"yes"`` (client certificates from :attr:`ca`);
    the server's certificate names ``tls_cert_names`` (give others to test a
    host name mismatch: the server still listens on 127.0.0.1). ``tmp_dir``: where
    its temporary directory goes (default: the system's).
    """

    def __init__(self, *, password: str | None = None, acl_users: dict[str, str] | None = None,
                 tls: bool = False, tls_auth_clients: str = "no",
                 tls_cert_names: tuple[str, ...] = ("localhost", "127.0.0.1"),
                 tmp_dir: str | None = None) -> None:
        self.password = password
        self.tmp_dir = tmp_dir
        self.acl_users = dict(acl_users or {})
        self.tls = tls
        self.tls_auth_clients = tls_auth_clients
        self.tls_cert_names = tuple(tls_cert_names)
        self.host = "127.0.0.1"
        self.port = 0
        self.ca: Any = None
        self.ca_file = ""
        self._dir: str | None = None
        self._proc: RedisProcess | None = None
        self._admin_cert: tuple[str, str] | None = None

    def __repr__(self) -> str:
        return f"<RedisServer {self.host}:{self.port} tls={self.tls}>"

    def start(self) -> RedisServer:
        """Start the server and wait until it answers PING (idempotent); returns ``self``."""
        if self._proc is not None:
            # A second server over the first left the first, its port and its directory
            # out of stop()'s reach: they outlived the with-block.
            return self
        self._dir = tempfile.mkdtemp(prefix="tensorstream-redis-", dir=self.tmp_dir)
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        assert self._dir is not None
        base: dict[str, str] = {}
        if self.tls:
            base.update(self._tls_config())
            base["port"] = "0"
        if self.password:
            base["requirepass"] = conf_arg(self.password)
        for user, pw in self.acl_users.items():
            base[f"user {conf_arg(user)}"] = f"on {conf_arg('>' + pw)} ~* &* +@all"

        def start(attempt: int) -> RedisProcess:
            assert self._dir is not None
            self.port = free_port()
            config = {**base, ("tls-port" if self.tls else "port"): str(self.port)}
            proc = self._proc = RedisProcess(config, self._dir, "redis")
            try:
                wait_ready(proc, self.client)
            except BaseException:
                proc.discard()
                self._proc = None
                raise
            return proc

        self._proc = on_a_free_port(start)

    def _tls_config(self) -> dict[str, str]:
        from .extras import trustme as _trustme

        trustme = _trustme()
        assert self._dir is not None
        self.ca = trustme.CA()
        cert = self.ca.issue_cert(*self.tls_cert_names)
        self.ca_file = os.path.join(self._dir, "ca.pem")
        self.ca.cert_pem.write_to_path(self.ca_file)
        cert_file, key_file = os.path.join(self._dir, "cert.pem"), os.path.join(self._dir, "key.pem")
        cert.cert_chain_pems[0].write_to_path(cert_file)
        cert.private_key_pem.write_to_path(key_file)
        self._admin_cert = self.issue_client_cert("admin")
        return {"tls-cert-file": cert_file, "tls-key-file": key_file,
                "tls-ca-cert-file": self.ca_file, "tls-auth-clients": self.tls_auth_clients}

    def issue_client_cert(self, name: str = "client") -> tuple[str, str]:
        """``(cert_file, key_file)`` of a client certificate signed by the test CA."""
        assert self.ca is not None and self._dir is not None
        cert = self.ca.issue_cert(f"{name}@example.org")
        cf, kf = os.path.join(self._dir, f"{name}-cert.pem"), os.path.join(self._dir, f"{name}-key.pem")
        cert.cert_chain_pems[0].write_to_path(cf)
        cert.private_key_pem.write_to_path(kf)
        return cf, kf

    def stop(self) -> None:
        """Kill the server and remove its temp dir. Idempotent."""
        if self._proc is not None:
            self._proc.stop()
            self._proc = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- helpers ----------------------------------------------------------------
    def url(self, key: str = "", *, user: str | None = None, password: str | None = None,
            db: int | None = None) -> str:
        """``redis[s]://[user:password@]127.0.0.1:port/key[?db=N]`` (credentials only if given)."""
        scheme = "rediss" if self.tls else "redis"
        auth = ""
        if user or password:
            from urllib.parse import quote

            auth = f"{quote(user or '', safe='')}:{quote(password or '', safe='')}@"
        q = f"?db={db}" if db is not None else ""
        path = redis_key_path(key, db_given=db is not None)
        return f"{scheme}://{auth}{self.host}:{self.port}/{path}{q}"

    def client(self, **kwargs: Any) -> Any:
        """A synchronous ``redis.Redis`` with admin (default user) access."""
        import redis

        kw: dict[str, Any] = {"host": self.host, "port": self.port, "password": self.password,
                              "socket_timeout": 10, "socket_connect_timeout": 5}
        if self.tls:
            # (the admin client connects to 127.0.0.1 whatever the certificate names)
            kw.update(ssl=True, ssl_ca_certs=self.ca_file,
                      ssl_check_hostname=self.host in self.tls_cert_names)
            if self._admin_cert:
                kw.update(ssl_certfile=self._admin_cert[0], ssl_keyfile=self._admin_cert[1])
        kw.update(kwargs)
        return redis.Redis(**kw)


def store_tensorizer_layout(client: Any, key: str, data: bytes, piece: int) -> None:
    """Write ``data`` as uneven to_redis-style pieces with a sync client."""
    first = min(len(data), max(1, piece // 3))
    client.set(f"{key}:header:0", data[:first])
    for off in range(first, len(data), piece):
        client.set(f"{key}:data:{off}", data[off : off + piece])


class RedisCluster(_DirectValues):
    """A 3-primary Redis Cluster (no replicas) on free loopback ports.

    ``tmp_dir``: where its temporary directory (the nodes' configuration files) goes
    (default: the system's), as :class:`RedisServer`'s: under pytest's ``tmp_path_factory``
    a killed run's directory is pruned with its base temp instead of left for good.
    ``tls=True``: every node and the cluster bus serve TLS only (trustme CA in
    :attr:`ca_file`; the nodes' certificate names ``localhost`` and ``127.0.0.1``).
    """

    def __init__(self, nodes: int = 3, *, tmp_dir: str | os.PathLike[str] | None = None,
                 tls: bool = False) -> None:
        self.nodes = nodes
        self.tmp_dir = None if tmp_dir is None else os.fspath(tmp_dir)
        self.tls = tls
        self.host = "127.0.0.1"
        self.ports: list[int] = []
        #: The test CA's certificate (PEM) with ``tls=True``, once started.
        self.ca_file: str | None = None
        self._dir: str | None = None
        self._procs: list[RedisProcess] = []

    @property
    def port(self) -> int:
        return self.ports[0]

    def __repr__(self) -> str:
        return f"<RedisCluster {self.host}:{self.ports}>"

    def start(self) -> RedisCluster:
        """Start the nodes and join them into a cluster (idempotent); returns ``self``."""
        if self._procs:
            return self
        self._dir = tempfile.mkdtemp(prefix="tensorstream-rcluster-", dir=self.tmp_dir)
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        assert self._dir is not None
        import redis

        self.ports = []
        tls = self._tls_config() if self.tls else {}
        for i in range(self.nodes):
            def start(attempt: int, i: int = i) -> RedisProcess:
                assert self._dir is not None
                port, bus = free_port(), free_port()
                config = {**tls, ("tls-port" if self.tls else "port"): str(port),
                          "cluster-enabled": "yes", "cluster-port": str(bus),
                          "cluster-config-file": os.path.join(self._dir, f"nodes-{i}-{attempt}.conf"),
                          "cluster-node-timeout": "5000"}
                proc = RedisProcess(config, self._dir, f"node{i}")
                try:
                    wait_ready(proc, lambda **kw: redis.Redis(host=self.host, port=port,
                                                               **self._ssl(), **kw))
                except BaseException:
                    proc.discard()
                    raise
                self.ports.append(port)
                return proc

            self._procs.append(on_a_free_port(start))
        addrs = [f"{self.host}:{p}" for p in self.ports]
        done = subprocess.run(
            ["redis-cli", *(["--tls", "--cacert", self.ca_file] if self.ca_file else []),
             "--cluster", "create", *addrs, "--cluster-replicas", "0", "--cluster-yes"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, timeout=60,
        )
        if done.returncode != 0:  # (CalledProcessError kept what redis-cli said to itself)
            said = done.stdout.decode(errors="replace").strip()[-2000:]
            raise RuntimeError(f"redis-cli --cluster create exited {done.returncode}:\n{said}")
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            ok = 0
            for p in self.ports:
                with redis.Redis(host=self.host, port=p, **self._ssl()) as c:
                    info = c.cluster("info")
                    state = info.get("cluster_state") if isinstance(info, dict) else info
                    ok += str(state).find("ok") >= 0
            if ok == self.nodes:
                return
            time.sleep(0.1)
        raise RuntimeError("Redis Cluster did not reach cluster_state:ok")

    def _tls_config(self) -> dict[str, str]:
        """The nodes' TLS settings (TLS only, the cluster bus too), the CA written out."""
        from .extras import trustme as _trustme

        assert self._dir is not None
        ca = _trustme().CA()
        cert = ca.issue_cert("localhost", "127.0.0.1")
        self.ca_file = os.path.join(self._dir, "ca.pem")
        ca.cert_pem.write_to_path(self.ca_file)
        cert_file, key_file = os.path.join(self._dir, "cert.pem"), os.path.join(self._dir, "key.pem")
        cert.cert_chain_pems[0].write_to_path(cert_file)
        cert.private_key_pem.write_to_path(key_file)
        return {"port": "0", "tls-cluster": "yes", "tls-cert-file": cert_file,
                "tls-key-file": key_file, "tls-ca-cert-file": self.ca_file,
                "tls-auth-clients": "no"}

    def _ssl(self) -> dict[str, Any]:
        """A redis-py client's TLS arguments for the nodes ({} without TLS)."""
        return {"ssl": True, "ssl_ca_certs": self.ca_file} if self.tls else {}

    def stop(self) -> None:
        for proc in self._procs:
            proc.stop()
        self._procs = []
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> RedisCluster:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def url(self, key: str = "") -> str:
        """``redis[s]://127.0.0.1:port/key?cluster=true`` (any node bootstraps the client)."""
        path = redis_key_path(key, db_given=False)
        scheme = "rediss" if self.tls else "redis"
        return f"{scheme}://{self.host}:{self.ports[0]}/{path}?cluster=true"

    def client(self) -> Any:
        """A synchronous ``redis.cluster.RedisCluster``."""
        from redis.cluster import RedisCluster as SyncCluster

        return SyncCluster(host=self.host, port=self.ports[0], **self._ssl())
