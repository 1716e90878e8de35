"""slicex.yaml as one typed model: every key with its type, its default and what it is for, written once.

`Home.config()` reads the file through `load_config`; every process of a deployment and every command reads
typed attributes from the `SlicexConfig` it returns, so a default lives here and nowhere else. A key the model
does not know is refused naming its path (a typo would otherwise change nothing and say nothing), and so is a
value of the wrong type, naming the type expected: `ConfigError`, a one-line message. `slicex config` prints
the reference table built from this model (docs/operator-guide.md, "Configuration reference").

The file's format is unchanged: a home written before this model loads as it did."""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any, Literal, get_args, get_origin
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from slicex.errors import BadArgs


class ConfigError(BadArgs):
    """A slicex.yaml that cannot be used; the message names the key and what it must be."""


class Section(BaseModel):
    """A mapping of slicex.yaml: unknown keys refused, values read-only once loaded."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class AmLimits(Section):
    allocation_lifetime_minutes: float = Field(10, gt=0, description="how long an allocation lives unprovisioned")
    default_lease_hours: float = Field(24, gt=0, description="a sliver's lease when the request names no end")
    max_lease_days: float = Field(30, gt=0, description="the longest lease the aggregate grants")


class SaLimits(Section):
    slice_lifetime_days: float = Field(7, gt=0, description="a new slice's lifetime")
    max_slice_lifetime_days: float = Field(60, gt=0, description="the longest a slice may be renewed to")


class NetnsOptions(Section):
    """`substrate_driver: netns` (docs/substrate-netns.md)."""

    prefix: str | None = Field(None, description="prefix of every host object (default: from the deployment id)")
    run_dir: str | None = Field(None, description="directory of the private Open vSwitch")
    controller: Literal["os-ken", "ovs-ofctl"] = Field(
        "os-ken", description="what programs the switch: the os-ken controller, or ovs-ofctl (refused if missing)")
    switch_dir: str | None = Field(None, description="an Open vSwitch shared with other aggregates on this host")
    switch_hosts: dict[str, str] = Field({}, description="substrate switch -> the network namespace its Open "
                                         "vSwitch runs in (a rack on another lab host, docs/lab.md)")
    state_dir: str | None = Field(None, description="where node containers keep their state")
    images_dir: str | None = Field(None, description="the node image catalogue (default: the host's)")
    default_image: str | None = Field(None, description="the image a node boots when the request names none")
    pids_max: int = Field(1024, gt=0, description="processes a node container may run")
    install_sources: list[str] = Field([], description="URLs a node's install services may fetch from")
    install_max_mb: int = Field(256, gt=0, description="the largest install download, in MB")
    public_address: str | None = Field(
        None, description="where nodes' public ports listen (the gateway; default: `host`); the substrate's "
                          "public_ports are the ports, the manifest names `public_hostname`")
    login_ports: list[int | str] = Field(
        [], description="TCP ports nodes' login relays listen on, `LOW-HIGH` ranges or single ports (a firewall "
                        "opens these); none: any free port the kernel gives")
    image_quota_mb: int = Field(4096, gt=0, description="what one user's images (CreateImage) may hold, in MB")
    datasets_dir: str | None = Field(None, description="where persistent datasets are kept (default: the host's)")
    dataset_quota_mb: int = Field(10240, gt=0, description="what one user's datasets may hold together, in MB")
    layers_dir: str | None = Field(None, description="where nodes' disks (their writable layers) live (default: "
                                   "`layers` in state_dir); best a file system of its own")
    layers_reserve_mb: int = Field(2048, ge=0, description="MB kept free on the layers' file system: a node is made "
                                   "only while the nodes' disks fit its free space less this")


    @field_validator("login_ports")
    @classmethod
    def _login_port_ranges(cls, value: list[int | str]) -> list[int | str]:
        port_ranges(value)  # refused, naming the range, unless every one is a port range
        return value

    def login_port_ranges(self) -> tuple[tuple[int, int], ...]:
        return port_ranges(self.login_ports)


def port_ranges(values: list[int | str]) -> tuple[tuple[int, int], ...]:
    """`["30000-30099", 30200]` -> ((30000, 30099), (30200, 30200)): sorted, each within 1-65535, low first,
    none overlapping; ValueError naming the one that is not."""
    out: list[tuple[int, int]] = []
    for v in values:
        lo, _, hi = str(v).strip().partition("-")
        try:
            low, high = int(lo), int(hi or lo)
        except ValueError:
            raise ValueError(f"{v!r} is not a port or a LOW-HIGH range of ports (e.g. 30000-30099)") from None
        if not 1 <= low <= high <= 65535:
            raise ValueError(f"{v!r} is not within 1-65535, low first")
        clash = next((f"{a}-{b}" for a, b in out if low <= b and a <= high), None)
        if clash:
            raise ValueError(f"{v!r} overlaps {clash}")
        out.append((low, high))
    return tuple(sorted(out))


class OpenStackOptions(Section):
    """`substrate_driver: openstack` (docs/substrate-openstack.md)."""

    cloud: str = Field("", description="the clouds.yaml entry to use (required by the openstack driver)")
    physical_network: str = Field("", description="the provider network of VLAN links (required)")
    flavors: dict[str, str] = Field({}, description="sliver type / VM size -> Nova flavor")
    images: dict[str, str] = Field({}, description="disk image URN or name -> Glance image")
    default_image: str = Field("", description="the Glance image of a node that names none")
    management_network: str = Field("", description="an existing network every server also joins")
    prefix: str = Field("", description="prefix of every OpenStack object (default: from the deployment id)")


class ScsOptions(Section):
    """The path service (`scs:`, docs/stitching.md)."""

    topology: str = Field(description="the stitching topology file (relative: in $SLICEX_HOME)")
    host: str | None = Field(None, description="address to serve on (default: `host`)")
    port: int = Field(8081, ge=0, description="port to serve on")


class QuotaLimits(Section):
    """At most this much held at once; null lifts a limit the default sets."""

    cores: int | None = Field(None, ge=0, description="cores")
    memory_mb: int | None = Field(None, ge=0, description="MB of memory")
    nodes: int | None = Field(None, ge=0, description="nodes")
    vlans: int | None = Field(None, ge=0, description="VLANs")
    bandwidth_kbps: int | None = Field(None, ge=0, description="kbps of link bandwidth")
    fpgas: int | None = Field(None, ge=0, description="FPGA slivers")
    public_ports: int | None = Field(None, ge=0, description="public ports of the gateway")
    disk_gb: int | None = Field(None, ge=0, description="GB of node disk (the sliver types' disk_gb)")
    lease_hours: float | None = Field(None, ge=0, description="the longest lease, in hours")


class Quotas(Section):
    """Service levels (docs/operator-guide.md §11): user or project URN (or `default`) -> limits."""

    users: dict[str, QuotaLimits] | None = Field(None, description="limits per user URN")
    projects: dict[str, QuotaLimits] | None = Field(None, description="limits per project URN")

    def document(self) -> dict[str, Any]:
        """The section as written (a limit left out differs from one set to null: the default's applies)."""
        return self.model_dump(exclude_unset=True)


class SlicexConfig(Section):
    """The whole of slicex.yaml."""

    authority: str = Field("slicex.local", description="this deployment's URN authority (namespace)")
    host: str = Field("127.0.0.1", description="the address every server listens on")
    public_hostname: str | None = Field(
        None, description="the DNS name clients reach this deployment by: the URLs GetVersion, ListAggregates "
        "and omni configs give, and the AM certificate's DNS name (default: `host`)")
    sa_port: int = Field(8000, ge=0, description="slice authority (0: any free port)")
    am_port: int = Field(8001, ge=0, description="AM API v3 (0: any free port)")
    am_v2_port: int | Literal["auto"] | None = Field(
        "auto", description="AM API v2 (auto: am_port + 5; null: no v2 endpoint)")
    chapi_port: int | None = Field(None, ge=0, description="CH API (null: sa_port + 7)")
    broker_port: int = Field(8002, ge=0, description="broker actor (distributed deployment)")
    authority_port: int = Field(8003, ge=0, description="authority actor (distributed deployment)")
    broker_url: str | None = Field(None, description="where the AM workers reach the broker actor (default: "
                                   "https://<host>:<broker_port>/; an AM worker on another host names the "
                                   "broker's host here)")
    authority_url: str | None = Field(None, description="where the AM workers reach the authority actor "
                                      "(default: https://<host>:<authority_port>/)")
    actor_timeout_seconds: float = Field(30, gt=0, description="an actor call not answered by then is TIMEDOUT")
    store: str | None = Field(None, description="redis://HOST:PORT/DB, redis+sentinel://HOST:PORT[,HOST:PORT...]"
                              "/MASTER[/DB] (a Redis that Sentinel fails over) or sqlite:///PATH (default: state.db)")
    substrate: str | None = Field(None, description="the substrate file (default: the built-in emulated rack)")
    substrate_driver: Literal["emulated", "netns", "openstack"] = Field(
        "emulated", description="what makes slivers (`slicex up --substrate` records it)")
    image_policy: Literal["reject", "default"] = Field(
        "reject", description="what to do with a disk image this aggregate lacks")
    am: AmLimits = Field(AmLimits(), description="the aggregate's limits")
    sa: SaLimits = Field(SaLimits(), description="the slice authority's limits")
    tick_seconds: float = Field(1.0, gt=0, description="how often timers (expiry, retries) run")
    trusted_root_namespaces: dict[str, str | list[str]] = Field(
        {}, description="trusted_roots/<file> -> the URN namespace(s) that root may vouch for")
    broker_policy: Literal["first-fit", "best-fit", "worst-fit"] = Field(
        "first-fit", description="how the broker picks a host")
    dashboard_port: int | None = Field(8004, ge=0, description="operator dashboard (0: any free port; null: off)")
    dashboard_tls: bool = Field(False, description="serve the dashboard over HTTPS with the AM's certificate")
    operators: list[str] = Field([], description="user URNs that may Shutdown any slice")
    metrics_interval_seconds: float = Field(5, ge=0, description="how long /metrics caches a store scan (0: none)")
    log_format: Literal["text", "json"] = Field("text", description="log lines of `slicex up` and `slicex actor`")
    gil_switch_interval_ms: float = Field(
        1.0, gt=0, le=100, description="how long a Python thread keeps the interpreter lock (slicex/runtime.py)")
    sm_name: str | None = Field(None, description="the slice manager's name (default: sm-<hostname>-<am port>)")
    netns: NetnsOptions = Field(NetnsOptions(), description="options of the netns driver")
    openstack: OpenStackOptions = Field(OpenStackOptions(), description="options of the openstack driver")
    scs: ScsOptions | None = Field(None, description="serve the stitching path service (docs/stitching.md)")
    quotas: Quotas | None = Field(None, description="service levels per user and project")
    peers: dict[str, dict[str, Any]] = Field(
        {}, description="federation peers (docs/federation.md; checked by slicex/peers.py)")
    deployment_id: str | None = Field(None, description="written by the first `slicex up`")
    deployment_stores: list[str] = Field([], description="stores this home has run on (written by `slicex up`)")

    @field_validator("substrate_driver", mode="before")
    @classmethod
    def _unset_driver_is_emulated(cls, value: Any) -> Any:
        return "emulated" if value is None else value

    @field_validator("public_hostname")
    @classmethod
    def _a_public_name(cls, value: str | None) -> str | None:
        """A bare host name (no scheme, port or path), and not a loopback one: it is what federation testers
        (jFed) and peers are told to connect to."""
        if value is None:
            return None
        name = value.strip().rstrip(".").lower()
        if not re.fullmatch(r"[a-z0-9]([a-z0-9-]{0,62}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,62}[a-z0-9])?)*", name):
            raise ValueError("a DNS name such as am.testbed.example.org (no scheme, port or path)")
        if name == "localhost" or name.endswith(".localhost") or name.startswith("127."):
            raise ValueError("a name others can reach, not a loopback one (leave the key out to advertise `host`)")
        return name

    @field_validator("am", "sa", "netns", "openstack", "trusted_root_namespaces", "peers", "operators",
                     "deployment_stores", mode="before")
    @classmethod
    def _null_section_is_empty(cls, value: Any, info: Any) -> Any:
        """`netns:` with nothing under it is the empty section, as it always was."""
        if value is not None:
            return value
        return [] if info.field_name in ("operators", "deployment_stores") else {}

    @field_validator("store")
    @classmethod
    def _a_sentinel_url_parses(cls, value: str | None) -> str | None:
        """A Sentinel store URL is checked here, so a wrong one stops `slicex up` naming the key."""
        from slicex.store.urls import is_sentinel_url, parse_sentinel_url

        if value is not None and is_sentinel_url(value):
            parse_sentinel_url(value)
        return value

    @field_validator("broker_url", "authority_url")
    @classmethod
    def _actor_url_is_https(cls, value: str | None) -> str | None:
        """Actors speak mutual TLS only: a URL of another scheme, or with no host, could never be called."""
        if value is None:
            return None
        parts = urlsplit(value)
        if parts.scheme != "https" or not parts.hostname or parts.port is None:
            raise ValueError(f"{value!r}: an actor URL is https://HOST:PORT/")
        return value

    def actor_url(self, role: str) -> str:
        """Where the broker or the authority actor is called: `broker_url`/`authority_url` when set (an AM
        worker on another host than the actors), else this host's `host` and the actor's port."""
        given = self.broker_url if role == "broker" else self.authority_url
        return given or f"https://{self.host}:{self.broker_port if role == 'broker' else self.authority_port}/"

    def advertised_host(self) -> str:
        """The host name the URLs this deployment hands out carry: `public_hostname`, else where it listens."""
        return self.public_hostname or self.host

    def am_v2_endpoint_port(self) -> int | None:
        """The AM API v2 port: as set, None when off, else the AM's + 5 (0, any free port, when the AM's is 0)."""
        if self.am_v2_port != "auto":
            return self.am_v2_port
        return self.am_port + 5 if self.am_port else 0

    def chapi_endpoint_port(self) -> int:
        """The CH API port: as set, else the slice authority's + 7 (8007 by default; 0 when the SA's is 0)."""
        if self.chapi_port is not None:
            return self.chapi_port
        return self.sa_port + 7 if self.sa_port else 0

    def deployment_key(self, root: Path) -> str:
        """What names this deployment's host objects: its id, or its home before the first `up` wrote one."""
        return self.deployment_id or str(Path(root).resolve())


# ---- reading ----------------------------------------------------------------------------------------------------
def load_config(path: Path) -> SlicexConfig:
    """The configuration in `path` (all defaults when there is no file); ConfigError naming the key."""
    name = Path(path).name
    try:
        doc = yaml.safe_load(Path(path).read_text()) if Path(path).exists() else None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{name}: not valid YAML: {' '.join(str(exc).split())}") from None
    if doc is not None and not isinstance(doc, dict):
        raise ConfigError(f"{name}: expected key: value pairs, got {type(doc).__name__}")
    return parse_config(doc or {}, name)


def parse_config(doc: dict[str, Any], name: str = "slicex.yaml") -> SlicexConfig:
    try:
        return SlicexConfig.model_validate(doc)
    except ValidationError as exc:
        raise ConfigError(f"{name}: " + "; ".join(_explain(e) for e in exc.errors())) from None


def _explain(error: Any) -> str:
    """One pydantic error as the operator should read it: the key's dotted path, then what is wrong."""
    loc = [str(p) for p in error["loc"]]
    key = ".".join(loc)
    if error["type"] == "extra_forbidden":
        known = list(_fields_at(SlicexConfig, loc[:-1]))
        close = difflib.get_close_matches(loc[-1], known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else f" (known here: {', '.join(known)})" if known else ""
        return f"unknown key {key!r}{hint}"
    if error["type"] == "missing":
        return f"{key!r} is required"
    given = error["input"]
    if key == "store" and isinstance(given, str):  # never a password in a message
        from slicex.store.urls import hide_password

        given = hide_password(given)
    return f"{key!r}: {error['msg'][0].lower() + error['msg'][1:]}, got {given!r}"


def _fields_at(model: type[BaseModel], loc: list[str]) -> dict[str, Any]:
    """The keys the model allows at a path (empty where the keys are free, as under `peers`)."""
    parts = iter(loc)
    for part in parts:
        field = model.model_fields.get(part)
        nested = _model_of(field.annotation) if field else None
        if nested is None:
            return {}
        model, keyed = nested
        if keyed and next(parts, None) is None:  # the free key itself (a URN under quotas.users)
            return {}
    return dict(model.model_fields)


def _model_of(annotation: Any) -> tuple[type[BaseModel], bool] | None:
    """The section model a field holds, and whether it holds one per free key (`dict[str, Model]`)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is dict:
        inner = _model_of(args[1])
        return (inner[0], True) if inner else None
    for arg in args if origin is not None and origin is not list else ():
        found = _model_of(arg)
        if found is not None:
            return found
    return None


# ---- the reference ----------------------------------------------------------------------------------------------
def reference(model: type[BaseModel] = SlicexConfig, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """Every key as (dotted path, type, default, description), nested sections flattened: the table
    `slicex config` prints and docs/operator-guide.md carries."""
    rows = []
    for key, field in model.model_fields.items():
        nested = _model_of(field.annotation)
        kind = "section" if nested else _type_name(field.annotation)
        default = "required" if field.is_required() else "" if nested else yaml.safe_dump(
            field.default, default_flow_style=True).strip().removesuffix("...").strip()
        rows.append((prefix + key, kind, default, field.description or ""))
        if nested is not None:
            section, keyed = nested
            rows += reference(section, f"{prefix}{key}.{'<URN>.' if keyed else ''}")
    return rows


def _type_name(annotation: Any) -> str:
    args = get_args(annotation)
    if get_origin(annotation) is Literal:
        return " | ".join(str(a) for a in args)
    if args and get_origin(annotation) not in (list, dict):
        return " | ".join(_type_name(a) for a in args)
    if annotation is type(None):
        return "null"
    return getattr(annotation, "__name__", str(annotation)) if not args else str(annotation).replace("typing.", "")


def reference_table() -> str:
    """The reference as a Markdown table."""
    lines = ["| key | type | default | what it is for |", "|---|---|---|---|"]
    lines += [f"| `{k}` | {t.replace('|', '/')} | {f'`{d}`' if d else ''} | {what} |" for k, t, d, what in reference()]
    return "\n".join(lines) + "\n"
