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

from slicex.config import SlicexConfig, load_config, parse_config

# What a new home's slicex.yaml spells out (every other key keeps its default until the operator sets it).
WRITTEN_KEYS = ("authority", "host", "sa_port", "am_port", "broker_port", "authority_port", "actor_timeout_seconds",
                "store", "substrate", "image_policy", "am", "sa", "tick_seconds", "trusted_root_namespaces",
                "broker_policy", "dashboard_port", "operators")


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

    def config(self) -> SlicexConfig:
        """This home's slicex.yaml, checked (ConfigError naming a wrong key), with the store resolved:
        SLICEX_STORE (set by `slicex up --distributed` for its processes), else the file's, else state.db."""
        cfg = load_config(self.config_file)
        store = os.environ.get("SLICEX_STORE") or cfg.store or f"sqlite:///{self.root / 'state.db'}"
        return cfg.model_copy(update={"store": store})

    def write_default_config(self, **overrides: Any) -> None:
        if self.config_file.exists():
            return
        self.root.mkdir(parents=True, exist_ok=True)
        cfg = parse_config(overrides, self.config_file.name).model_dump(mode="json")
        written = {k: cfg[k] for k in (*WRITTEN_KEYS, *(k for k in overrides if k not in WRITTEN_KEYS))}
        self.config_file.write_text("# slicex deployment config (see docs/operator-guide.md, Configuration reference)\n"
                                    + yaml.safe_dump(written, sort_keys=False))

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
