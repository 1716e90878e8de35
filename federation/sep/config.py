"""sep.yaml: where the exchange point listens, its identity, whom it trusts, where it keeps its record, and
the domains it spans. Relative paths are read beside the file. Errors name the file and the key to fix."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from federation.sep.relay import Domain
from federation.sep.split import domain_key

KEYS = {"urn", "host", "port", "url", "cert", "key", "trusted_roots", "trusted_root_namespaces", "store",
        "timeout_seconds", "retry_seconds", "aggregates", "overlay", "overlay_options"}


class SepConfigError(ValueError):
    """A sep.yaml that cannot be used, saying what to change."""


@dataclass
class SepConfig:
    cert: Path
    key: Path
    trusted_roots: list[Path]
    domains: list[Domain]
    store: str                        # redis://HOST:PORT/DB, sqlite:///PATH, or a SQLite file beside sep.yaml
    host: str = "127.0.0.1"
    port: int = 8010
    url: str = ""                     # the URL GetVersion reports (default https://host:port/)
    trusted_root_namespaces: dict[str, Any] = field(default_factory=dict)
    timeout_seconds: float = 120.0    # per call to a domain; past it the domain counts as not answering
    retry_seconds: float = 5.0        # how often unfinished rollbacks are tried again
    overlay: str | None = None        # "module:factory" of the overlay (federation/sep/overlay.py)
    overlay_options: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None

    @property
    def by_key(self) -> dict[str, Domain]:
        return {domain_key(d.urn): d for d in self.domains}


def load_config(path: str | Path) -> SepConfig:
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as exc:
        raise SepConfigError(f"{p}: cannot read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise SepConfigError(f"{p}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise SepConfigError(f"{p}: expected key: value pairs")
    extra = set(data) - KEYS
    if extra:
        raise SepConfigError(f"{p}: unknown key(s) {', '.join(sorted(extra))}; allowed: {', '.join(sorted(KEYS))}")
    base = p.parent

    def file(key: str) -> Path:
        if not data.get(key):
            raise SepConfigError(f"{p}: '{key}:' is required")
        return (base / str(data[key])).resolve()

    aggs = data.get("aggregates")
    if not isinstance(aggs, list) or not aggs:
        raise SepConfigError(f"{p}: 'aggregates:' must list the domains' AMs, each {{urn: AM_URN, url: AM_URL}}")
    domains = []
    for n, a in enumerate(aggs, 1):
        if not isinstance(a, dict) or not a.get("urn") or not a.get("url") or set(a) - {"urn", "url"}:
            raise SepConfigError(f"{p}: aggregate #{n}: give urn and url (only)")
        domains.append(Domain(str(a["urn"]), str(a["url"])))
    keys = [domain_key(d.urn) for d in domains]
    if len(set(keys)) != len(keys):
        raise SepConfigError(f"{p}: two aggregates share one authority; each domain is one AM")
    roots = data.get("trusted_roots") or []
    if isinstance(roots, str):
        roots = [roots]
    if not roots:
        raise SepConfigError(f"{p}: 'trusted_roots:' must name the domains' root certificates (files or directories)")
    store = str(data.get("store") or "sep.db")
    if "://" not in store:  # a SQLite file, beside sep.yaml unless absolute
        store = f"sqlite://{(base / store).resolve()}"
    try:
        return SepConfig(file("cert"), file("key"), [(base / str(r)).resolve() for r in roots], domains, store,
                         str(data.get("host") or "127.0.0.1"), int(data.get("port", 8010)), str(data.get("url") or ""),
                         dict(data.get("trusted_root_namespaces") or {}), float(data.get("timeout_seconds", 120)),
                         float(data.get("retry_seconds", 5)), data.get("overlay") or None,
                         dict(data.get("overlay_options") or {}), p)
    except (TypeError, ValueError) as exc:
        raise SepConfigError(f"{p}: {exc}") from None
