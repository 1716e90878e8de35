"""A Redis that Sentinel manages, as slicex's tests, benchmarks and lab run it: one primary, its replicas and
sentinels, each a `redis-server` process of its own (`--sentinel` for a sentinel), on the addresses and ports
given, each optionally run through a command prefix (`ip netns exec HOST` in the lab). It writes their
configuration files, starts them, waits until the sentinels agree on the primary, and kills any of them
like a crash. An operator's deployment does the same with the distribution's services (docs/operator-guide.md)."""

from __future__ import annotations

import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

MASTER = "slicex"


@dataclass(frozen=True)
class Node:
    """One process: where it listens, and what runs it (a prefix such as `ip netns exec h1`)."""

    host: str
    port: int
    wrap: tuple[str, ...] = ()


@dataclass
class RedisHa:
    """The processes of a Sentinel-managed Redis under `root` (their files and logs)."""

    root: Path
    primary: Node
    replicas: list[Node]
    sentinels: list[Node]
    master: str = MASTER
    down_after_ms: int = 1000
    failover_timeout_ms: int = 5000
    min_replicas_to_write: int = 0
    priorities: dict[Node, int] = field(default_factory=dict)  # replica-priority (lower: promoted first)
    procs: dict[Node, subprocess.Popen] = field(default_factory=dict)

    def url(self, db: int = 0, **options: int) -> str:
        """The store URL every slicex process is given (`redis+sentinel://`)."""
        hosts = ",".join(f"{s.host}:{s.port}" for s in self.sentinels)
        query = "&".join(f"{k}={v}" for k, v in options.items())
        return f"redis+sentinel://{hosts}/{self.master}/{db}" + (f"?{query}" if query else "")

    def start(self, timeout: float = 20) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self._server(self.primary, None)
        for node in self.replicas:
            self._server(node, self.primary)
        for node in self.sentinels:
            self._sentinel(node)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._ready():
                return
            time.sleep(0.1)
        raise RuntimeError(f"the sentinels did not see {self.primary} with {len(self.replicas)} replicas within "
                           f"{timeout:.0f} s; see {self.root}")

    def _spawn(self, node: Node, args: list[str], name: str) -> None:
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115 - the process keeps it
        self.procs[node] = subprocess.Popen([*node.wrap, "redis-server", *args], stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        log.close()

    def _server(self, node: Node, primary: Node | None) -> None:
        name = f"redis-{node.host}-{node.port}"
        (self.root / name).mkdir(exist_ok=True)
        args = ["--port", str(node.port), "--bind", node.host, "--dir", str(self.root / name), "--save", "",
                "--appendonly", "no", "--protected-mode", "no", "--repl-timeout", "5", "--repl-diskless-sync-delay", "0"]
        if self.min_replicas_to_write:
            args += ["--min-replicas-to-write", str(self.min_replicas_to_write), "--min-replicas-max-lag", "3"]
        if node in self.priorities:
            args += ["--replica-priority", str(self.priorities[node])]
        if primary is not None:
            args += ["--replicaof", primary.host, str(primary.port)]
        self._spawn(node, args, name)

    def restart(self, node: Node) -> None:
        """Start a killed server again, as a replica of the primary the sentinels name now (they would make
        it one anyway)."""
        now = self.primary_now()
        self._server(node, self.node_at(now) if now and now != (node.host, node.port) else None)

    def _sentinel(self, node: Node) -> None:
        name = f"sentinel-{node.host}-{node.port}"
        conf = self.root / f"{name}.conf"  # a sentinel rewrites its own file: one each
        conf.write_text(f"port {node.port}\nbind {node.host}\nprotected-mode no\ndir {self.root}\n"
                        f"sentinel monitor {self.master} {self.primary.host} {self.primary.port} "
                        f"{len(self.sentinels) // 2 + 1}\n"
                        f"sentinel down-after-milliseconds {self.master} {self.down_after_ms}\n"
                        f"sentinel failover-timeout {self.master} {self.failover_timeout_ms}\n"
                        f"sentinel parallel-syncs {self.master} 1\n")
        self._spawn(node, [str(conf), "--sentinel"], name)

    def _ready(self) -> bool:
        """Every sentinel names the primary, knows its replicas and the other sentinels."""
        try:
            for s in self.sentinels:
                state = redis.Redis(s.host, s.port, socket_timeout=1, decode_responses=True).sentinel_master(
                    self.master)
                if (state["ip"], int(state["port"])) != (self.primary.host, self.primary.port) or \
                        int(state["num-slaves"]) < len(self.replicas) or \
                        int(state["num-other-sentinels"]) < len(self.sentinels) - 1:
                    return False
            info = redis.Redis(self.primary.host, self.primary.port, socket_timeout=1,
                               decode_responses=True).info("replication")
            online = [v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)
                      and v.get("state") == "online"]
            return len(online) >= len(self.replicas)
        except (redis.RedisError, OSError):
            return False

    def primary_now(self) -> tuple[str, int] | None:
        """The primary as the first sentinel that answers names it (None: none answers)."""
        for s in self.sentinels:
            try:
                host, port = redis.Redis(s.host, s.port, socket_timeout=1, decode_responses=True).sentinel_get_master_addr_by_name(
                    self.master)
                return str(host), int(port)
            except (redis.RedisError, OSError, TypeError):
                continue
        return None

    def node_at(self, address: tuple[str, int]) -> Node:
        return next(n for n in (self.primary, *self.replicas) if (n.host, n.port) == address)

    def kill(self, node: Node, sig: int = signal.SIGKILL) -> None:
        """Kill one process like a crash (SIGKILL), or stop/continue it (SIGSTOP, SIGCONT)."""
        proc = self.procs[node]
        proc.send_signal(sig)
        if sig == signal.SIGKILL:
            proc.wait(10)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
