"""A real Redis Cluster on loopback for tests and benchmarks: N masters (+ one replica each
if asked), every node a ``RedisServer`` of its own (AOF always, own dir, free port), wired
with the CLUSTER commands (ADDSLOTS, MEET, REPLICATE) instead of ``redis-cli --cluster``,
so the embedded 6.2 binary, which ships without redis-cli, works too. Stopped by pid."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from workers.dev.ports import free_port
from workers.dev.redis_server import RedisServer

SLOTS = 16384
# Short, so a killed master is failed over within a couple of seconds.
NODE_TIMEOUT_MS = 1000
# Redis puts a node's cluster bus on its port + 10000.
CLUSTER_BUS_OFFSET = 10000


def _wait(check: object, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():  # type: ignore[operator]
                return
        except redis.RedisError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"cluster: {what} within {timeout}s")
        time.sleep(0.05)


class LocalCluster:
    def __init__(self, binary: str, root: Path, *, masters: int = 3, replicas: bool = False):
        args = [
            "--cluster-enabled", "yes", "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
            "--repl-diskless-sync-delay", "0",
        ]  # fmt: skip
        n = masters * (2 if replicas else 1)
        self.nodes = [
            RedisServer(
                binary,
                root / f"node{i}",
                port=free_port(bus_offset=CLUSTER_BUS_OFFSET),
                extra_args=[*args, "--cluster-config-file", f"nodes-{i}.conf"],
            )
            for i in range(n)
        ]
        self.n_masters = masters

    @property
    def url(self) -> str:
        """A live node's URL: the cluster client finds the others from it."""
        return next(node for node in self.nodes if node.running).url

    def seeds(self, *first: RedisServer) -> str:
        """Every node's URL, comma-separated (``first`` leading): a seed list for
        ``EFFECTQ_REDIS_URL``."""
        nodes = [*first, *(n for n in self.nodes if n not in first)]
        return ",".join(node.url for node in nodes)

    def start(self) -> LocalCluster:
        for node in self.nodes:
            node.start()
        clients = [node.client(decode_responses=True) for node in self.nodes]
        per = SLOTS // self.n_masters
        for i, client in enumerate(clients[: self.n_masters]):
            end = SLOTS if i == self.n_masters - 1 else (i + 1) * per
            client.execute_command("CLUSTER ADDSLOTS", *range(i * per, end))
        for epoch, client in enumerate(clients, start=1):
            # Distinct config epochs before the nodes meet, as redis-cli --cluster create
            # sets them: with all at 0 the first failover waits on epoch collisions.
            client.execute_command("CLUSTER SET-CONFIG-EPOCH", epoch)
        for client in clients[1:]:
            client.execute_command("CLUSTER MEET", "127.0.0.1", self.nodes[0].port)
        _wait(lambda: all(len(self._known(c)) == len(clients) for c in clients), "all nodes meet")
        for master, replica in zip(clients, clients[self.n_masters :], strict=False):
            master_id = master.execute_command("CLUSTER MYID")
            replica.execute_command("CLUSTER REPLICATE", master_id)
        self.wait_ok()
        return self

    @staticmethod
    def _known(client: redis.Redis) -> dict[str, object]:
        return client.execute_command("CLUSTER NODES")  # type: ignore[no-any-return]

    def heal(self) -> None:
        """Start every node that is down again and wait until the cluster is whole."""
        for node in self.nodes:
            if not node.running:
                node.start()
        self.wait_ok()

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Every live node sees the cluster up and every replica is in sync."""

        def ok() -> bool:
            for node in self.nodes:
                if not node.running:
                    continue
                info = node.client(decode_responses=True).execute_command("CLUSTER INFO")
                if info.get("cluster_state") != "ok":
                    return False
            return True

        _wait(ok, "cluster_state:ok on every live node", timeout)

        # A replica that never synced is not eligible to take over: wait for every link.
        def synced() -> bool:
            for node in self.nodes:
                if node.running:
                    info = node.client().info("replication")
                    if info["role"] == "slave" and info.get("master_link_status") != "up":
                        return False
            return True

        _wait(synced, "every replica in sync", timeout)

    def client(self, **kw: object) -> redis.RedisCluster:
        return redis.RedisCluster(
            host="127.0.0.1", port=next(n for n in self.nodes if n.running).port,
            decode_responses=True,
            retry=Retry(NoBackoff(), 3), **kw,  # type: ignore[arg-type]
        )  # fmt: skip

    def master_of(self, key: str) -> RedisServer:
        """The node serving ``key``'s slot now (as the cluster tells a fresh client)."""
        client = self.client()
        try:
            port = client.get_node_from_key(key).port
        finally:
            client.close()  # called in polling loops: do not leave a pool per call
        return next(node for node in self.nodes if node.port == int(port))

    def masters(self) -> list[RedisServer]:
        return [
            n
            for n in self.nodes
            if n.running and n.client().info("replication")["role"] == "master"
        ]

    def replica_of(self, master: RedisServer) -> RedisServer:
        for node in self.nodes:
            if node.running and node is not master:
                info = node.client().info("replication")
                if info["role"] == "slave" and int(info["master_port"]) == master.port:
                    return node
        raise LookupError(f"no live replica of {master!r}")

    def fail_over(self, master: RedisServer) -> RedisServer:
        """SIGKILL ``master``; return its replica once that serves the slots and every live
        node sees the cluster ok."""
        replica = self.replica_of(master)
        master.kill()
        _wait(lambda: replica in self.masters(), "the replica promoted")
        self.wait_ok()
        return replica

    def rejoin(self, node: RedisServer) -> None:
        """Restart a killed node (it comes back as a replica) and wait for a healthy cluster."""
        node.start()
        self.wait_ok()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


@contextmanager
def local_cluster(
    binary: str, root: Path, *, masters: int = 3, replicas: bool = False
) -> Iterator[LocalCluster]:
    cluster = LocalCluster(binary, root, masters=masters, replicas=replicas)
    try:
        yield cluster.start()
    finally:
        cluster.stop()
