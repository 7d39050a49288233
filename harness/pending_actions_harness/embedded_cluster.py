"""A private Redis Cluster, for the tests and the benchmark: ``redis-server --cluster-enabled
yes`` processes on free ports (AOF, fsync always), joined with ``redis-cli --cluster create``,
or, where redis-cli is missing, with CLUSTER ADDSLOTSRANGE / MEET / REPLICATE sent from
Python."""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from pending_actions.embedded import MEMORY_SETTINGS, find_redis_server
from pending_actions.procs import Child, ChildExited, await_ready

SLOTS = 16384


def _cmd(client: redis.Redis, *args: Any) -> Any:
    return client.execute_command(*args)  # type: ignore[no-untyped-call]


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free too, both below the kernel's
    ephemeral range: a client socket's local port is drawn from that range and could take a
    bus port between this check and the node's start."""
    rng = random.Random()
    top = min(_ephemeral_low(), 55_535) - 10_000
    while True:
        port = rng.randrange(10_000, max(top, 10_001))
        try:
            for p in (port, port + 10_000):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
            return port
        except OSError:
            continue


@dataclass
class Node:
    port: int
    directory: Path
    # its process, through procs like every child of ours: in a process group of its own and
    # SIGTERMed when its parent dies, so a killed test or bench leaves no node behind
    child: Child | None = None

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return None if self.child is None else self.child.proc

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=10)

    def start(self, fsync: str) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.child = Child(f"redis cluster node on {self.port}", [
            find_redis_server(), "--port", str(self.port), "--bind", "127.0.0.1",
            "--dir", str(self.directory), "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "3000",
            # failovers are the test's to make (CLUSTER FAILOVER TAKEOVER), at a known moment
            "--cluster-replica-no-failover", "yes",
            "--appendonly", "yes", "--appendfsync", fsync, "--save", "", *MEMORY_SETTINGS,
        ], log_path=self.directory / "redis.log").spawn()
        try:
            await_ready(self.child, self._answers, 10)
        except (ChildExited, TimeoutError):
            raise RuntimeError(f"redis cluster node on {self.port} did not start") from None

    def _answers(self, seconds: float) -> bool:
        """Ready once the node answers on its port (it boots with no event to wait on)."""
        assert self.child is not None
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        try:
            client.ping()
            return True
        except (redis.ConnectionError, redis.BusyLoadingError):
            self.child.wait(min(seconds, 0.05))
            return False
        finally:
            client.close()

    def restart(self, fsync: str) -> None:
        """Start again on the same port and data (nodes.conf): a master that was failed over
        comes back as a replica of the node that took its slots."""
        self.kill()
        self.start(fsync)

    def kill(self) -> None:
        if self.child is not None:
            self.child.kill()


@dataclass
class Cluster:
    directory: Path
    masters: int = 3
    replicas: int = 0
    fsync: str = "always"
    nodes: list[Node] = field(default_factory=list)

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes) + "/"

    def start(self) -> Cluster:
        count = self.masters * (1 + self.replicas)
        self.nodes = [Node(cluster_port(), self.directory / f"node{i}") for i in range(count)]
        for node in self.nodes:
            node.start(self.fsync)
        if shutil.which("redis-cli"):
            subprocess.run(
                ["redis-cli", "--cluster", "create",
                 *[f"127.0.0.1:{n.port}" for n in self.nodes],
                 "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
        else:
            self._create_by_hand()
        self.wait_ok()
        self.wait_replicas()
        return self

    def wait_replicas(self, timeout: float = 30.0) -> None:
        """Until every master has its replicas online (synced): a WAIT counts only those."""
        def synced() -> bool:
            for port in self.master_ports():
                info = self.node(port).client().info("replication")
                online = sum(1 for k, v in info.items()
                             if k.startswith("slave") and isinstance(v, dict)
                             and v.get("state") == "online")
                if online < self.replicas:
                    return False
            return True

        self._wait(synced, timeout)

    def _create_by_hand(self) -> None:
        """What ``redis-cli --cluster create`` does: equal slot ranges to the masters, every
        node meets the first, each replica follows its master."""
        masters, rest = self.nodes[:self.masters], self.nodes[self.masters:]
        for i, node in enumerate(masters):
            low, high = i * SLOTS // self.masters, (i + 1) * SLOTS // self.masters - 1
            _cmd(node.client(), "CLUSTER", "ADDSLOTSRANGE", low, high)
        for node in self.nodes[1:]:
            _cmd(node.client(), "CLUSTER", "MEET", "127.0.0.1", self.nodes[0].port)
        self._wait(lambda: all(len(_cmd(n.client(), "CLUSTER", "NODES")
                                    .splitlines()) == len(self.nodes) for n in self.nodes))
        for i, node in enumerate(rest):
            master_id = _cmd(masters[i % self.masters].client(), "CLUSTER", "MYID")
            _cmd(node.client(), "CLUSTER", "REPLICATE", master_id)

    def wait_ok(self, timeout: float = 30.0) -> None:
        def ok() -> bool:
            for node in self.live_nodes():
                info = _cmd(node.client(), "CLUSTER", "INFO")
                text = info.decode() if isinstance(info, bytes) else str(info)
                if "cluster_state:ok" not in text:
                    return False
            return True

        self._wait(ok, timeout)

    @staticmethod
    def _wait(check: object, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not check():  # type: ignore[operator]
            if time.monotonic() > deadline:
                raise TimeoutError("the cluster did not settle")
            time.sleep(0.1)

    def live_nodes(self) -> list[Node]:
        return [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]

    def roles(self) -> dict[int, tuple[str, int | None]]:
        """port -> ("master", None) or ("slave", master port), as the live nodes see it."""
        out: dict[int, tuple[str, int | None]] = {}
        for node in self.live_nodes():
            role = _cmd(node.client(), "ROLE")
            kind = role[0].decode()
            out[node.port] = (kind, int(role[2]) if kind == "slave" else None)
        return out

    def master_ports(self) -> list[int]:
        return sorted(p for p, (kind, _m) in self.roles().items() if kind == "master")

    def replica_of(self, port: int) -> Node:
        for node in self.live_nodes():
            kind, master = self.roles()[node.port]
            if kind == "slave" and master == port:
                return node
        raise LookupError(f"no replica of {port}")

    def node(self, port: int) -> Node:
        return next(n for n in self.nodes if n.port == port)

    def stop(self) -> None:
        for node in self.nodes:
            node.kill()
