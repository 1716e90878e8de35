"""A multi-host lab on one machine: simulated hosts (network namespaces, each its own address) joined by
shaped veth fibres, optionally through a NAT, each able to run its own `slicex up`. docs/lab.md describes it.

The Python API, for tests and benches:

    from lab import running, line
    with running(line("ab", hosts=2, rate_mbit=1000, nat=True), redis_url) as lab:
        h1 = lab.hosts["h1"]                  # .name, .namespace, .address
        h1.run(["ping", "-c1", lab.hosts["h2"].address])
        home = h1.make_home("h1.lab")         # a slicex home listening on h1's address
        h1.slicex(home, "up", "--detach")     # `python -m cli --home … up --detach` inside h1
        h1.am_url(home)                       # https://<h1's address>:<am_port>/
    lab.cable("h1", "trunk0", "h2", "trunk0")  # a layer-2 circuit (stitching trunk) between two hosts

Leaving the block runs `slicex down` on every home made with make_home, ends whatever still runs in the
lab's namespaces, and removes the namespaces, links and relay."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml

from lab import edge
from lab.plan import Fibre, HostPlan, LabPlan, LabSpec, LabSpecError, Nat, line, plan

__all__ = ["Fibre", "Lab", "LabHost", "LabSpec", "LabSpecError", "Nat", "line", "plan", "running"]


@dataclass
class LabHost:
    """One simulated host: its namespace and address, and a way to run commands (and slicex) there."""

    plan: HostPlan
    lab_dir: Path
    redis_url: str | None = None  # the operator's Redis as this host reaches it (None: no relay)

    @property
    def name(self) -> str:
        return self.plan.name

    @property
    def namespace(self) -> str:
        return self.plan.namespace

    @property
    def address(self) -> str:
        return self.plan.address

    def env(self, home: Path | None = None) -> dict[str, str]:
        """The caller's environment with this tree first on PYTHONPATH, the relayed Redis and `home`."""
        env = edge.tree_env()
        if self.redis_url:
            env["SLICEX_REDIS_URL"] = self.redis_url
        else:
            env.pop("SLICEX_REDIS_URL", None)
        if home is not None:
            env["SLICEX_HOME"] = str(home)
        return env

    def run(self, argv: list[str], timeout: float = 60, check: bool = False, home: Path | None = None,
            input: str | None = None) -> subprocess.CompletedProcess:
        """`argv` inside this host (its network namespace; edge.inside says why not `ip netns exec`)."""
        out = subprocess.run([*edge.inside(self.namespace), *argv], capture_output=True, text=True,
                             timeout=timeout, env=self.env(home), input=input)
        if check and out.returncode != 0:
            raise RuntimeError(f"{self.name}: `{' '.join(argv)}` exited {out.returncode}: "
                               f"{(out.stderr or out.stdout).strip()[-2000:]}")
        return out

    def popen(self, argv: list[str], **kwargs) -> subprocess.Popen:
        return subprocess.Popen([*edge.inside(self.namespace), *argv], env=self.env(kwargs.pop("home", None)),
                                **kwargs)

    def slicex(self, home: Path, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
        """`slicex --home HOME ARGS` on this host (a home made by make_home is taken down with the lab)."""
        return self.run([sys.executable, "-m", "cli", "--home", str(home), *args], timeout=timeout, check=check,
                        home=home)

    def make_home(self, authority: str, name: str = "home", users: tuple[str, ...] = ("alice",),
                  **config) -> Path:
        """A slicex home for this host: its CA for `authority`, serving on the host's address, with `users`;
        `config` adds slicex.yaml keys (store, substrate_driver, ports, …)."""
        home = edge.home_dir(self.lab_dir, self.name, name)
        home.mkdir(parents=True, exist_ok=True)
        self.slicex(home, "ca", "init", "--authority", authority)
        doc = yaml.safe_load((home / "slicex.yaml").read_text()) or {}
        doc.update({"host": self.address, **config})
        (home / "slicex.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        for user in users:
            self.slicex(home, "user", "add", user)
        return home

    def joined_home(self, home: Path, actors: LabHost) -> Path:
        """A copy of `home` (made on `actors`' host: its CA, users, keys, deployment id) for this host, serving
        on this host's address and calling the broker and the authority on `actors`' address: the home of an
        AM worker (or a standby actor) that joins a distributed deployment from another host."""
        joined = home.parent.parent / self.name / "home"
        shutil.copytree(home, joined, ignore=shutil.ignore_patterns("run", "logs", "*.log"))
        doc = yaml.safe_load((joined / "slicex.yaml").read_text())
        doc.update({"host": self.address,
                    "broker_url": f"https://{actors.address}:{doc.get('broker_port', 8002)}/",
                    "authority_url": f"https://{actors.address}:{doc.get('authority_port', 8003)}/"})
        (joined / "slicex.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        return joined

    def am_url(self, home: Path) -> str:
        doc = yaml.safe_load((home / "slicex.yaml").read_text()) or {}
        return f"https://{self.address}:{doc.get('am_port', 8001)}/"


@dataclass
class Lab:
    plan: LabPlan
    hosts: dict[str, LabHost]

    @property
    def operator_address(self) -> str:
        return self.plan.operator_address

    def cable(self, a: str, a_if: str, b: str, b_if: str, rate_mbit: float | None = None) -> None:
        """A layer-2 circuit from host a's interface `a_if` to host b's `b_if` (edge.add_cable): a stitching
        trunk between two hosts' switches; it goes with the lab."""
        edge.add_cable(self.plan, a, a_if, b, b_if, rate_mbit)


@contextmanager
def running(spec: LabSpec, redis_url: str | None = None) -> Iterator[Lab]:
    """A lab up for the block (with the operator's Redis relayed to its hosts when `redis_url` is given), and
    gone after it."""
    p = edge.up(spec, redis_url)
    relayed = edge.hosts_redis_url(p, redis_url) if redis_url else None
    lab = Lab(p, {h.name: LabHost(h, edge.state_dir(spec.name), relayed) for h in p.hosts})
    try:
        yield lab
    finally:
        edge.down(spec.name)
