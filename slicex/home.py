"""$SLICEX_HOME: where all of slicex's state lives (certificates, keys, config, database, logs).

Layout:
  slicex.yaml              deployment config (authority, host, ports, store, substrate, limits)
  ca/ca.pem ca/ca.key      development root CA
  trusted_roots/           CA certificates this deployment trusts (its own + federation peers')
  am/ sa/                  aggregate and slice authority certificates and keys
  broker/ authority/       broker (signs tickets) and authority (signs leases) actor certificates and keys
  <user>-cert.pem -key.pem user certificate and key (beside omni_config), <user>-ssh.pub ssh key
  <user>-ssh               the ssh private key (`<user>-ssh.key` in homes made before: still read)
  omni_config              ready-to-use omni configuration
  state.db                 SQLite store (embedded default)
  run/slicex.pid logs/     background process bookkeeping"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

DEFAULT_CONFIG: dict[str, Any] = {
    "authority": "slicex.local",
    "host": "127.0.0.1",
    "sa_port": 8000,
    "am_port": 8001,
    "broker_port": 8002,  # distributed deployment: broker actor
    "authority_port": 8003,  # distributed deployment: authority actor
    "actor_timeout_seconds": 30,  # distributed deployment: an actor call not answered by then is TIMEDOUT
    "store": None,  # default sqlite:///$SLICEX_HOME/state.db
    "substrate": None,  # default: the built-in emulated rack
    "image_policy": "reject",  # reject | default: what to do with disk images this aggregate lacks
    "am": {"allocation_lifetime_minutes": 10, "default_lease_hours": 24, "max_lease_days": 30},
    "sa": {"slice_lifetime_days": 7, "max_slice_lifetime_days": 60},
    "tick_seconds": 1.0,
    # trusted_roots/<file> -> the URN namespace(s) that root may vouch for; a root not listed vouches for the
    # authority in its own URN (urn:publicid:IDN+<ns>+authority+ca) and its sub-authorities only.
    "trusted_root_namespaces": {},
    "broker_policy": "first-fit",  # first-fit | best-fit | worst-fit
    "dashboard_port": 8004,  # read-only operator dashboard, plain HTTP on `host` (0: any free port; null: off)
    "operators": [],  # user URNs that may Shutdown any slice with their own user credential
}


def home_dir() -> Path:
    return Path(os.environ.get("SLICEX_HOME", Path.home() / ".slicex")).expanduser().resolve()


@dataclass
class Home:
    root: Path = field(default_factory=home_dir)

    def __post_init__(self) -> None:
        self.root = Path(self.root)

    @property
    def config_file(self) -> Path:
        return self.root / "slicex.yaml"

    def config(self) -> dict[str, Any]:
        cfg = {k: (dict(v) if isinstance(v, dict) else v) for k, v in DEFAULT_CONFIG.items()}
        if self.config_file.exists():
            loaded = yaml.safe_load(self.config_file.read_text()) or {}
            for k, v in loaded.items():
                if isinstance(v, dict) and isinstance(cfg.get(k), dict):
                    cfg[k].update(v)
                else:
                    cfg[k] = v
        if os.environ.get("SLICEX_STORE"):
            cfg["store"] = os.environ["SLICEX_STORE"]  # set by `slicex up --distributed` for its processes
        if not cfg["store"]:
            cfg["store"] = f"sqlite:///{self.root / 'state.db'}"
        return cfg

    def write_default_config(self, **overrides: Any) -> None:
        if self.config_file.exists():
            return
        self.root.mkdir(parents=True, exist_ok=True)
        cfg = {k: v for k, v in DEFAULT_CONFIG.items()}
        cfg.update(overrides)
        self.config_file.write_text("# slicex deployment config (see docs/operator-guide.md)\n"
                                    + yaml.safe_dump(cfg, sort_keys=False))

    # paths
    ca_cert = property(lambda self: self.root / "ca" / "ca.pem")
    ca_key = property(lambda self: self.root / "ca" / "ca.key")
    trusted_roots = property(lambda self: self.root / "trusted_roots")
    am_cert = property(lambda self: self.root / "am" / "am.pem")
    am_key = property(lambda self: self.root / "am" / "am.key")
    sa_cert = property(lambda self: self.root / "sa" / "sa.pem")
    sa_key = property(lambda self: self.root / "sa" / "sa.key")
    broker_cert = property(lambda self: self.root / "broker" / "broker.pem")
    broker_key = property(lambda self: self.root / "broker" / "broker.key")
    authority_cert = property(lambda self: self.root / "authority" / "authority.pem")
    authority_key = property(lambda self: self.root / "authority" / "authority.key")
    omni_config = property(lambda self: self.root / "omni_config")
    pid_file = property(lambda self: self.root / "run" / "slicex.pid")
    log_file = property(lambda self: self.root / "logs" / "slicex.log")
    roots_bundle = property(lambda self: self.root / "run" / "trusted-roots.pem")

    def user_cert(self, name: str) -> Path:
        return self.root / f"{name}-cert.pem"

    def user_key(self, name: str) -> Path:
        return self.root / f"{name}-key.pem"

    def user_ssh_pub(self, name: str) -> Path:
        return self.root / f"{name}-ssh.pub"

    def user_ssh_private(self, name: str) -> Path:
        """Where `slicex user add` writes the private ssh key: the public key's path minus `.pub`, the name
        ssh tooling derives from it (omni's readyToLogin.py among them)."""
        return self.root / f"{name}-ssh"

    def user_ssh_key(self, name: str) -> Path:
        """The user's private ssh key to read: `<user>-ssh`, or `<user>-ssh.key` in homes made before."""
        key, legacy = self.user_ssh_private(name), self.root / f"{name}-ssh.key"
        return legacy if legacy.exists() and not key.exists() else key

    def users(self) -> list[str]:
        return sorted(p.name[: -len("-cert.pem")] for p in self.root.glob("*-cert.pem"))
