"""Assemble and run one embedded deployment: the AM API endpoint and the slice authority in one process,
state in the store named by the config (SQLite by default), the reaper on the actor clock."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from am.api import AggregateManager, AmIdentity, AmPolicy
from am.api_v2 import AggregateManagerV2
from authority.actor import Authority, SubstrateDriver, as_driver
from authority.substrate.emulated import EmulatedDriver, FailurePlan
from authority.substrate.fpga import FpgaDriver
from broker.broker import Broker
from broker.policy import policy_named
from clearinghouse import chapi_edge
from clearinghouse.slice_authority import SaPolicy, SliceAuthority
from deployment.actors import (
    Caller,
    active_actor,
    actor_server,
    aggregate_name,
    authority_client,
    broker_client,
    embedded_actors,
    home_keys_and_names,
    make_authority,
    make_broker,
)
from fpga_aggregate.backend import EmulatedFpgaBackend, FpgaBackend
from fpga_aggregate.bitstreams import BitstreamCatalogue
from fpga_aggregate.boards import boards_from_config
from operations.dashboard import Aggregate, Dashboard, DashboardServer, start_dashboard, tls_context
from operations.ledger import ledger_for
from operations.metrics import for_slice_manager as metrics_for
from operations.snapshot import publishers_for
from protocol.api import AuthorityApi, BrokerApi
from resources import InUse, usage_counts
from rspec.advertisement import AdvertisementCache, Usage
from rspec.substrate import QEMU_VM, Substrate, SubstrateError, VmSize, default_substrate, load_substrate
from slice_manager.actor import ActorSliceManager
from slice_manager.peer_gate import held_slivers, wanted_nodes
from slicex import pki
from slicex.actor_rpc import ActorServer
from slicex.clock import Clock, SystemClock
from slicex.config import ConfigError, NetnsOptions, SlicexConfig
from slicex.credentials import CredentialVerifier
from slicex.devpki import actor_urn, roots_bundle
from slicex.errors import GeniError, Refused
from slicex.home import Home
from slicex.logs import Traced
from slicex.store import Store, open_store
from slicex.tls_xmlrpc import TlsXmlRpcServer, server_context
from slicex.trust_roots import PeerTrust

if TYPE_CHECKING:
    from authority.substrate.images import ImageCatalogue

log = logging.getLogger("slicex.service")


def substrate_driver(substrate: Substrate, bitstreams: BitstreamCatalogue, fpga_backend: FpgaBackend,
                     failures: FailurePlan | None = None, base: SubstrateDriver | None = None) -> SubstrateDriver:
    """The authority's driver: `base` (a host driver such as netns) or the emulated substrate, with FPGA
    boards programmed through `fpga_backend` when the substrate has any."""
    driver = base or as_driver(EmulatedDriver(substrate, failures))
    if not substrate.fpga_boards:
        return driver
    return FpgaDriver(driver, boards_from_config(substrate.fpga_boards), bitstreams, fpga_backend)


def slice_members_in(store: Store) -> Callable[[str], list[str]]:
    """The members of a slice this deployment's slice authority holds (none for other authorities' slices)."""
    from clearinghouse.chapi import members_of
    from clearinghouse.slice_authority import SLICES
    from slicex.store.ownership import Actor, scoped

    edge = scoped(store, Actor.DEPLOYMENT)

    def members(slice_urn: str) -> list[str]:
        record = edge.get(SLICES, slice_urn.lower())
        return list(members_of(record)) if record else []

    return members


def deployment_substrate(cfg: SlicexConfig) -> Substrate:
    """The substrate this deployment offers: the operator's file (or the demo rack) and, on the netns
    substrate, the node images of the host's catalogue in place of the file's (a container boots only what
    the catalogue holds)."""
    from dataclasses import replace

    from resources.public_port import host_ports_offered

    substrate = load_substrate(cfg.substrate) if cfg.substrate else default_substrate(cfg.authority)
    clash = host_ports_offered(substrate, own_ports(cfg))
    if clash:
        raise SubstrateError(f"{cfg.substrate or 'the built-in substrate'}: public_ports would hand nodes ports of "
                             f"this host: {'; '.join(clash)}; give public_ports a range of its own")
    if cfg.substrate_driver == "openstack" and substrate.public_ports:
        raise SubstrateError(f"{cfg.substrate}: public_ports are forwarded by the netns driver (and shown by the "
                             f"emulated one); the openstack driver has no gateway: remove public_ports")
    if cfg.substrate_driver != "netns":
        return substrate
    from authority.substrate.images import offered_images

    catalogue, default_image = node_images(cfg.netns)
    from authority.substrate.vm_image import vm_form

    default = catalogue.get(default_image)
    return replace(substrate, images=offered_images(catalogue, substrate.authority, default_image),
                   vm_sizes=with_qemu_vm(substrate.vm_sizes, default is not None and
                                         vm_form(default.rootfs.parent) is not None))


def with_qemu_vm(sizes: tuple[VmSize, ...], vm_image: bool) -> tuple[VmSize, ...]:
    """The netns substrate's sliver types: the substrate file's, and `qemu-vm` (a VM with its own kernel,
    authority/substrate/vm.py) where the file defines no VM size of its own, this host has QEMU and the
    default image its VM form (`vm_image`; `slicex image build` makes it)."""
    from authority.substrate.vm_image import qemu_missing

    if any(s.machine == "qemu" for s in sizes) or not vm_image or qemu_missing():
        return sizes
    return (*sizes, QEMU_VM)


def own_ports(cfg: SlicexConfig) -> dict[int, str]:
    """The TCP ports this deployment's servers and its store listen on (port -> which)."""
    from urllib.parse import urlsplit

    ports = {cfg.sa_port: "sa_port", cfg.am_port: "am_port", cfg.am_v2_endpoint_port() or 0: "am_v2_port",
             cfg.chapi_endpoint_port(): "chapi_port", cfg.broker_port: "broker_port",
             cfg.authority_port: "authority_port", cfg.dashboard_port or 0: "dashboard_port",
             cfg.scs.port if cfg.scs else 0: "scs.port"}
    if cfg.store and cfg.store.startswith(("redis://", "rediss://")):  # a Sentinel store's hosts are its sentinels
        try:
            ports[urlsplit(cfg.store).port or 6379] = "the Redis store"
        except ValueError:
            pass  # the store's own parser says what is wrong with it
    return {p: what for p, what in ports.items() if p}


class AdvertisedImages:
    """The substrate as ListResources advertises it now: on the netns substrate with the catalogue's images as
    they are at this call, so an image a user made public (or deleted) since the start is advertised (or gone)
    at once. A new substrate object only when the images changed: the advertisement cache is keyed on it."""

    def __init__(self, substrate: Substrate, offered: Callable[[], tuple] | None):
        self._substrate = substrate
        self._offered = offered

    def substrate(self) -> Substrate:
        if self._offered is None:
            return self._substrate
        from dataclasses import replace

        images = self._offered()
        current = self._substrate
        if images != current.images:
            current = self._substrate = replace(current, images=images)
        return current


def advertised_images(cfg: SlicexConfig, substrate: Substrate) -> AdvertisedImages:
    if cfg.substrate_driver != "netns":
        return AdvertisedImages(substrate, None)
    from authority.substrate.images import offered_images

    catalogue, default_image = node_images(cfg.netns)
    return AdvertisedImages(substrate, lambda: offered_images(catalogue, substrate.authority, default_image))


def node_images(opts: NetnsOptions) -> tuple[ImageCatalogue, str]:
    """The netns driver's image catalogue and the image a node boots when its request names none."""
    from pathlib import Path

    from authority.substrate.images import DEFAULT_DIR, DEFAULT_IMAGE, ImageCatalogue

    return ImageCatalogue(Path(opts.images_dir or DEFAULT_DIR)), opts.default_image or DEFAULT_IMAGE


def user_image_resolver(cfg: SlicexConfig, authority: str) -> Callable[[str, str], str | None] | None:
    """On the netns substrate, what the slice manager vouches for to the broker: the URN of a catalogue image
    a user may boot that the substrate does not offer everyone (their snapshots, others' public ones)."""
    if cfg.substrate_driver != "netns":
        return None
    from authority.substrate.images import usable_image

    catalogue, _default = node_images(cfg.netns)
    return lambda owner, spelled: usable_image(catalogue, authority, owner, spelled)


def user_images(cfg: SlicexConfig, authority: str) -> Any:
    """On the netns substrate, the catalogue as ListImages and DeleteImage see it (authority/substrate/images.py
    UserImages); None elsewhere (those answer UNSUPPORTED)."""
    if cfg.substrate_driver != "netns":
        return None
    from authority.substrate.images import UserImages

    catalogue, _default = node_images(cfg.netns)
    return UserImages(catalogue, authority)


def node_datasets(opts: NetnsOptions) -> Any:
    """The host's persistent datasets (authority/substrate/datasets.py), where slicex.yaml puts them."""
    from pathlib import Path

    from authority.substrate.datasets import DEFAULT_DIR, DatasetStore

    return DatasetStore(Path(opts.datasets_dir or DEFAULT_DIR))


def user_datasets(cfg: SlicexConfig) -> Any:
    """On the netns substrate, the datasets as ListDatasets and DeleteDataset see them; None elsewhere."""
    if cfg.substrate_driver != "netns":
        return None
    from authority.substrate import hostnet
    from authority.substrate.datasets import UserDatasets

    return UserDatasets(node_datasets(cfg.netns), busy=lambda ns: ns in hostnet.namespaces())


def netns_prefix(cfg: SlicexConfig, home: Home) -> str:
    """The prefix of this deployment's host objects on the netns substrate: `netns.prefix`, else its id's."""
    from authority.substrate.netns_plan import deployment_prefix

    return cfg.netns.prefix or deployment_prefix(cfg.deployment_key(home.root))


def host_driver(cfg: SlicexConfig, home: Home) -> Any:
    """The driver that makes real slivers on this host when slicex.yaml says `substrate_driver: netns`
    (`slicex up --substrate netns` records it), else None. Options under `netns:`: `prefix` of every host
    object (default from the deployment id), `run_dir` of the private Open vSwitch, `controller` (os-ken, the
    default, or ovs-ofctl; refused where the chosen one cannot run), `switch_dir` of an Open vSwitch shared with
    other aggregates on this host."""
    if cfg.substrate_driver == "emulated":
        return None
    if cfg.substrate_driver == "openstack":
        return openstack_driver(cfg, home)
    from pathlib import Path

    from authority.substrate.netns import NetnsDriver
    from authority.substrate.netns_plan import RackLayout

    opts = cfg.netns
    # switch_dir: one Open vSwitch shared by several aggregates on this host, their bridges joined by veth
    # trunks the driver makes from the substrate's external links (docs/substrate-netns.md, "Several aggregates")
    substrate = load_substrate(cfg.substrate) if cfg.substrate else None
    unknown = sorted(set(opts.switch_hosts) - {sw.name for sw in (substrate.switches if substrate else ())})
    if unknown:
        raise ConfigError(f"netns.switch_hosts names {', '.join(unknown)}, not a switch of the substrate file "
                      f"({cfg.substrate or 'none given'}); name switches as its 'switches:' does")
    cables = {e.local_port: e.remote_port for e in substrate.external_links} if substrate else {}
    images, default_image = node_images(opts)

    def path(value: str | None) -> Path | None:
        return Path(value) if value else None

    return NetnsDriver(netns_prefix(cfg, home), path(opts.run_dir), opts.controller,
                       switch_dir=path(opts.switch_dir), cables=cables, state_dir=path(opts.state_dir),
                       images=images, default_image=default_image, pids_max=opts.pids_max,
                       install_sources=list(opts.install_sources), install_max_bytes=opts.install_max_mb * 2**20,
                       public_address=opts.public_address or cfg.host, public_host=cfg.advertised_host(),
                       image_quota_bytes=opts.image_quota_mb * 2**20, datasets=node_datasets(opts),
                       dataset_quota_mb=opts.dataset_quota_mb, login_ports=opts.login_port_ranges(),
                       layers_dir=path(opts.layers_dir), layers_reserve_mb=opts.layers_reserve_mb,
                       layout=RackLayout.of(substrate, opts.switch_hosts) if substrate else None)  # a bridge per switch


def layers_dir(cfg: SlicexConfig, home: Home) -> Any:
    """Where this deployment's netns nodes keep their disks (netns.layers_dir, else `layers` in the state dir)."""
    from pathlib import Path

    from authority.substrate.netns import STATE_ROOT

    state = Path(cfg.netns.state_dir or STATE_ROOT / f"slicex-{netns_prefix(cfg, home)}")
    return Path(cfg.netns.layers_dir) if cfg.netns.layers_dir else state / "layers"


def shared_disk_note(cfg: SlicexConfig, home: Home) -> str | None:
    """On the netns substrate, what `slicex up` says when the aggregate's own state (its home: the store, logs,
    the CA) shares a file system with the nodes' disks: nodes may then fill it up to the layers' reserve (the
    authority admits a node only while the nodes' disks fit its free space less netns.layers_reserve_mb), so
    a file system of its own for netns.layers_dir is safer (docs/operator-guide.md)."""
    if cfg.substrate_driver != "netns":
        return None
    from pathlib import Path

    paths = [home.root]
    if str(cfg.store).startswith("sqlite:///"):
        db = Path(str(cfg.store)[len("sqlite:///"):])  # sqlite:////abs/state.db, or relative to the home
        paths.append(db if db.is_absolute() else home.root / db)
    layers = layers_dir(cfg, home)
    shared = [p for p in paths if same_file_system(p, layers)]
    if not shared:
        return None
    return (f"note: the nodes' disks ({layers}) share a file system with {', '.join(map(str, shared))}; nodes "
            f"are admitted only while their disks fit its free space less netns.layers_reserve_mb "
            f"({cfg.netns.layers_reserve_mb} MB), but a file system of its own for netns.layers_dir keeps the "
            f"aggregate's state apart from what nodes write (docs/operator-guide.md, \"Node disks\")")


def same_file_system(a: Any, b: Any) -> bool:
    """Whether two paths (or their nearest existing parents) are on one file system."""
    import os
    from pathlib import Path

    def device(p: Path) -> int:
        p = Path(p).absolute()
        while not p.exists() and p != p.parent:
            p = p.parent
        return os.stat(p).st_dev

    return device(a) == device(b)


def openstack_driver(cfg: SlicexConfig, home: Home) -> Any:
    """The OpenStack driver of `substrate_driver: openstack`, from the `openstack:` section (cloud: a
    clouds.yaml entry, physical_network, flavors, images; docs/substrate-openstack.md). openstacksdk is
    imported only when it starts, so a missing one is reported by `slicex up`, naming the extra to install."""
    from authority.substrate.netns_plan import deployment_prefix
    from authority.substrate.openstack import OpenStackDriver
    from authority.substrate.openstack_plan import OpenStackSettings

    prefix = deployment_prefix(cfg.deployment_key(home.root))
    return OpenStackDriver(OpenStackSettings.from_config(cfg.openstack, prefix))


def start_host_driver(driver: Any, authority: Authority) -> None:
    """Start a host driver (its switch and controller) and reconcile the host with the authority's leases,
    before the authority serves: leftovers of a crash go, live slivers are adopted."""
    if driver is None:
        return
    driver.start()
    report = driver.reconcile(authority.live_slivers())
    log.info("%s: adopted %d slivers, removed %d leftover objects", driver.description.split(":")[0],
             len(report["adopted"]), len(report["removed"]))


def warm_caches() -> None:
    """Start-up work done once, in one thread, before a process serves: compile every schema slicex
    validates with (libxml2's first schema compile is not thread-safe, and a corrupted one breaks Allocate
    until restart). ServerError if this process cannot validate requests: it must not serve."""
    from rspec import fpga_ext, validate

    validate.warm()
    with validate.compile_lock:
        fpga_ext.schema()


STORE_CHECK_SECONDS = 1.0
LEDGER_SWEEP_SECONDS = 60.0
"""How often the reaper runs a step of the ledger's rotating check (`Ledger.sweep`: the next page of open usage
records, each against the slice manager's record of its sliver), which ends the usage of slivers that failed
inside a call: a pass over every open record takes open / LEDGER_SWEEP_PAGE steps (10,000 slivers: 20 minutes),
and no step reads more than a page. Not at start (a start reads only unfinished work). Every tick runs the
ledger's `settle`, which reads only the usage of the slivers the tick ended and of those whose expiry passed
(another worker's reaper ended them)."""
LEDGER_SWEEP_PAGE = 500


def guarded(store: Store | None, cfg: SlicexConfig) -> Any:
    """The process's store (`store`, else the one slicex.yaml names) behind the deployment guard: the record
    to expect is slicex.yaml's `deployment_id` (set by `slicex up`); the disk watched, a file SQLite store's."""
    from slicex.store.guard import GuardedStore, sqlite_dir
    from slicex.store.redis_store import redact

    url = str(cfg.store)
    return GuardedStore(store or open_store(url), cfg.deployment_id or None, redact(url),
                        None if store is not None else sqlite_dir(url))


def bind_store(store: Store, deployment_id: str, home: Home, create: bool, migrating: bool = False) -> bool:
    """Refuse to run on a store that is not this deployment's. The deployment's id (from slicex.yaml) is
    written into its store only when `create` says so (a home's first `slicex up`, or `slicex up
    --init-store`); every other process, `up` or an actor started by hand, checks it. An actor that reads
    another store (another URL, SQLite instead of Redis) stops here instead of splitting the deployment's
    state in two, and an `up` on a store that lost its data (a Redis restarted empty) stops instead of
    adopting it. True when this call wrote the record."""
    from slicex.store.guard import DEPLOYMENT_TABLE, RECORD_KEY
    from slicex.store.redis_store import redact

    url = redact(str(home.config().store))
    doc = store.get(DEPLOYMENT_TABLE, RECORD_KEY)
    if doc is None:
        if not create:
            raise Refused(f"the store {url} has no deployment record, so it is not this deployment's store "
                          f"({home.root}), or it lost its data (wiped, a Redis restarted without persistence). "
                          f"Check `store` in {home.config_file} and SLICEX_STORE and restore the store's data; "
                          f"if that data is gone for good, `slicex up --init-store` starts this deployment on "
                          f"it empty")
        store.put(DEPLOYMENT_TABLE, RECORD_KEY, {"id": deployment_id, "home": str(home.root)})
        return True
    if doc.get("id") != deployment_id:
        raise Refused(f"the store {url} belongs to deployment {doc.get('id')} (home {doc.get('home')}), not to "
                      f"this one ({deployment_id}, home {home.root}). Point `store` in {home.config_file} at "
                      f"this deployment's store, or give this deployment a store of its own")
    if not create and not migrating:  # `slicex up` (`migrating`) migrates it next; any other process checks
        from deployment.migrations import STEPS
        from slicex.store.migration import check

        check(store, STEPS, url)
    return False


@dataclass(frozen=True)
class AmWorker:
    """Which of `count` AM worker processes this one is (`slicex up --distributed --workers N`). They listen on
    the same AM API ports (v3 and v2) with SO_REUSEPORT, the kernel spreading new connections over them, and
    share the Redis store, the broker and the authority. Index 0 is `slicex up`'s own process: it alone also
    serves the slice authority, the CH API and the dashboard."""

    index: int = 0
    count: int = 1
    joined_at: str = ""  # a worker on another host (`slicex am-worker --join`): the address it serves on

    @classmethod
    def joined(cls, host: str) -> AmWorker:
        """The one AM worker of a host other than the actors' (`slicex am-worker --join`): not the first (no
        slice authority, CH API or dashboard), alone on its own address (no port shared)."""
        return cls(1, 1, host)

    def sm_name(self, base: str) -> str:
        """The slice manager's name in this worker: the deployment's for the first, `<base>-w<index>` for the
        others, `<base>-at-<address>` for one joined from another host (the homes are copies, so `sm_name`
        and the host name may be the same on both). Each must differ (a slice manager releases the
        reservation locks its name holds when it starts, so a shared name would let one worker drop
        another's) and stay the same across a restart (so a restarted worker takes its own unfinished work
        back at once)."""
        if self.joined_at:
            return f"{base}-at-{self.joined_at}"
        return base if self.index == 0 else f"{base}-w{self.index}"


@dataclass
class Endpoints:
    sa_url: str
    am_url: str
    am_v2_url: str = ""  # AM API v2 (for omni's stitcher in its default mode); "" when `am_v2_port: null`


class EmbeddedDeployment:
    """Everything `slicex up` runs, built from $SLICEX_HOME."""

    def __init__(self, home: Home, clock: Clock | None = None, sa_port: int | None = None,
                 am_port: int | None = None, failures: FailurePlan | None = None, store: Store | None = None,
                 substrate: Substrate | None = None, broker_url: str | None = None,
                 authority_url: str | None = None, worker: AmWorker | None = None):
        """`worker`: one of several AM workers on one port (distributed only); the first, alone, by default."""
        self.home = home
        self.worker = worker or AmWorker()
        first = self.worker.index == 0
        if self.worker.count > 1 and not broker_url:
            raise ValueError("several AM workers share a broker and an authority: the distributed deployment's")
        self.cfg = home.config()
        self.clock = clock or SystemClock()
        self.authority = self.cfg.authority
        host = self.cfg.host
        # writes stop while the store lacks this deployment's record or the disk refuses them (slicex.store.guard)
        self.store = guarded(store, self.cfg)
        self.substrate = substrate or deployment_substrate(self.cfg)
        self.ledger = ledger_for(self.cfg, self.store, self.substrate)  # slicex.yaml `quotas:` checked before serving
        self.bitstreams = BitstreamCatalogue(self.store, home.root / "bitstreams")
        self.fpga_backend = EmulatedFpgaBackend()
        # real slivers on this host (netns) when configured; in the distributed deployment the authority
        # actor's process owns them
        self.host_driver = None if broker_url else host_driver(self.cfg, home)
        self.driver = substrate_driver(self.substrate, self.bitstreams, self.fpga_backend, failures, self.host_driver)
        if broker_url and self.cfg.substrate_driver == "netns":  # what GetVersion says the substrate is
            from authority.substrate.netns import DESCRIPTION, vm_description
            from authority.substrate.vm import cached_probe

            # KVM or TCG as the authority actor's driver probed it on this host (when it has already)
            self.driver.description = DESCRIPTION + vm_description(cached_probe())
        if broker_url and self.cfg.substrate_driver == "openstack":
            from authority.substrate.openstack import DESCRIPTION as OPENSTACK

            self.driver.description = OPENSTACK
        # Each actor its own key (devpki): the broker's signs tickets, the authority's signs leases, the AM's
        # is only this process's TLS identity. Keys persist across restarts, so what was signed before still
        # verifies; a home from an older version gets the missing ones here.
        keys, name = home_keys_and_names(home, self.authority)
        policy = policy_named(self.cfg.broker_policy)
        self.actor_servers: list[ActorServer] = []  # the in-process broker and authority, served
        if broker_url:  # scaled out: broker and authority are processes of their own, called over mutual TLS
            caller, timeout = Caller.of_home(home, "am"), self.cfg.actor_timeout_seconds
            # whichever broker and authority hold their role's lease (standbys, deployment/leadership.py)
            self.broker: BrokerApi = broker_client(broker_url, caller, self.authority, timeout,
                                                   active_actor(self.store, "broker"))
            self.authority_actor: AuthorityApi = authority_client(authority_url, caller, self.authority, timeout,
                                                                  active_actor(self.store, "authority"))
            # the authority actor's process delegates its own inventory (ActorProcess); this process never acts
            # for it
        else:
            # the authority delegates as in the distributed deployment: a document signed with its key, which
            # the broker verifies (the broker is in this process, so it answers at once)
            self.broker, self.authority_actor = embedded_actors(self.store, keys, self.substrate, self.driver,
                                                                authority_name=name, policy=policy, clock=self.clock)
            # served as in the distributed deployment, so operators' messages (`slicex maintenance`, `slicex
            # plan`) reach the running actors whichever deployment runs them: on this host only, at any free
            # port (the pid record names it), so AM workers sharing a store each serve their own
            self.actor_servers = [actor_server(role, actor, home, self.authority, ("127.0.0.1", 0))
                                  for role, actor in (("broker", self.broker), ("authority", self.authority_actor))]
        trust = pki.TrustStore([home.trusted_roots], namespaces=self.cfg.trusted_root_namespaces)
        # federation peers (slicex.yaml `peers:`): their roots, bound to their namespaces, refreshed if configured
        self.peer_trust = PeerTrust.for_deployment(home.root, self.cfg, trust, (str(home.am_cert), str(home.am_key)))
        self.verifier = CredentialVerifier(trust)
        am_policy = AmPolicy(allocation_lifetime=timedelta(minutes=self.cfg.am.allocation_lifetime_minutes),
                             default_lease=timedelta(hours=self.cfg.am.default_lease_hours),
                             max_lease=timedelta(days=self.cfg.am.max_lease_days),
                             operators=frozenset(self.cfg.operators))
        ca_file = str(self.peer_trust.extend_bundle(roots_bundle(home)))
        # the slice authority (and the CH API below) in the first AM worker only
        self._sa_server = TlsXmlRpcServer((host, self.cfg.sa_port if sa_port is None else sa_port),
                                          server_context(str(home.sa_cert), str(home.sa_key), ca_file)) \
            if first else None
        shared = self.worker.count > 1  # every worker binds the AM API ports with SO_REUSEPORT
        self._am_server = TlsXmlRpcServer((host, self.cfg.am_port if am_port is None else am_port),
                                          server_context(str(home.am_cert), str(home.am_key), ca_file),
                                          reuse_port=shared)
        # AM API v2 (am/api_v2.py) on a port of its own: omni's stitcher needs a "2" URL that really speaks v2
        v2_port = self.cfg.am_v2_endpoint_port() if am_port is None else 0
        self._am_v2_server = None if v2_port is None else TlsXmlRpcServer(
            (host, int(v2_port)), server_context(str(home.am_cert), str(home.am_key), ca_file), reuse_port=shared)
        self.endpoints = self._urls(host)  # where this process listens (and its own checks call)
        # what it tells clients (GetVersion, ListAggregates, the CH API): `public_hostname` when set, so jFed and
        # federation peers are never handed a loopback URL; the same ports
        self.advertised = self._urls(self.cfg.advertised_host())
        # The slice manager's name locks the reservations it works on; the same name after a restart takes its
        # own unfinished work back at once (AM workers sharing a store differ by port or by `sm_name`).
        # in-process actors log each call under their own logger, as actor servers do (slicex.logs)
        traced = (self.broker, self.authority_actor) if broker_url else \
            (Traced("broker", self.broker), Traced("authority", self.authority_actor))
        self.sm = ActorSliceManager(self.store, self.substrate, *traced,
                                    name=self.worker.sm_name(self.cfg.sm_name or
                                                             f"sm-{socket.gethostname()}-{self._am_server.port}"),
                                    image_policy=self.cfg.image_policy, bitstreams=self.bitstreams,
                                    images=user_image_resolver(self.cfg, self.substrate.authority),
                                    run_actor_clocks=not broker_url,
                                    tick=timedelta(seconds=self.cfg.tick_seconds),
                                    lease_key=keys.authority.public_key())
        self.am_urn = aggregate_name(self.authority)
        # snapshots of the actors this process runs, for the dashboard (operations/snapshot.py); remote actors publish
        # their own from their processes
        self.publishers = publishers_for(self.store, self.sm, *((None, None) if broker_url
                                                                 else (self.broker, self.authority_actor)),
                                         on_demand=True)
        self._ads = AdvertisementCache()
        self._usage: tuple[InUse, Usage] | None = None  # the broker's last answer of what is in use, summed
        self._advertised = advertised_images(self.cfg, self.substrate)
        # this deployment's own registry: /metrics on the dashboard's port (operations/metrics.py)
        self.metrics = metrics_for(self.substrate, self.sm, self.clock.now,
                                   self.cfg.metrics_interval_seconds)
        self._checks: dict[str, str] = {}  # the store guard's last verdict (health(), the reaper's tick)
        self._checked_at = 0.0
        self._swept_at: float | None = None  # when the ledger's rotating check last ran a step
        self.metrics.watch_health(lambda: self._checks)
        self.am = AggregateManager(AmIdentity(self.am_urn, self.advertised.am_url, self.cfg.advertised_host(),
                                              self.driver.description, v2_url=self.advertised.am_v2_url),
                                   self.sm, self.verifier, self.clock, self._advertise, am_policy,
                                   metrics=self.metrics, dry_run=self.sm.dry_run,
                                   find_slot=self.sm.find_slot)
        self.am.peers = self.peer_trust.gate(self.am_urn, held_slivers(self.sm), wanted_nodes(self.substrate))
        self.peer_trust.watch_tls(*(s.context for s in (self._am_server, self._am_v2_server) if s is not None))
        self.am.ledger = self.ledger  # usage records and service levels; the reaper ends expired usage
        self.sm.ledger = self.ledger  # an Update's commit and revert end the usage they remove (slice_manager/updater.py)
        self.am.slice_members = slice_members_in(self.store)  # who geni_users may name besides the caller
        self.am.images = user_images(self.cfg, self.substrate.authority)  # ListImages, DeleteImage
        self.am.datasets = user_datasets(self.cfg)  # ListDatasets, DeleteDataset
        self.am_v2 = AggregateManagerV2(self.am, self.advertised.am_v2_url)
        sa_policy = SaPolicy(slice_lifetime=timedelta(days=self.cfg.sa.slice_lifetime_days),
                             max_slice_lifetime=timedelta(days=self.cfg.sa.max_slice_lifetime_days))
        self.sa = SliceAuthority(self.authority, home.sa_cert.read_bytes(), home.sa_key.read_bytes(),
                                 home.ca_cert.read_bytes(), home.ca_key.read_bytes(), self.store, self.clock,
                                 {self.am_urn: self.advertised.am_url}, self.advertised.sa_url, sa_policy) \
            if first else None
        # the Common Federation API (CH, SA, MA at /CH /SA /MA) for omni's `chapi` framework and geni-lib,
        # on its own port, over the same slice records (docs/federation.md)
        self.chapi = None if self.sa is None else chapi_edge.serve(
            home, self.sa, host, self.cfg.chapi_endpoint_port() if sa_port is None else 0, ca_file,
            {self.am_urn: self.advertised.am_url}, public_host=self.cfg.public_hostname)
        # each surface through the one endpoint helper (slicex/endpoint.py), once its handler exists
        self._am_server.answer(self.am.endpoint())
        if self._am_v2_server is not None:
            self._am_v2_server.answer(self.am_v2.endpoint())
        if self._sa_server is not None and self.sa is not None:
            self._sa_server.answer(self.sa.endpoint())
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._dashboard: DashboardServer | None = None

    def authority_name(self) -> str:
        return aggregate_name(self.authority)

    def _urls(self, host: str) -> Endpoints:
        """The URLs of this process's servers under `host` (an AM worker other than the first serves no slice
        authority: the first's port, from the configuration)."""
        sa_port = self._sa_server.port if self._sa_server else self.cfg.sa_port
        return Endpoints(f"https://{host}:{sa_port}/", f"https://{host}:{self._am_server.port}/",
                         f"https://{host}:{self._am_v2_server.port}/" if self._am_v2_server else "")

    # ---- edges -------------------------------------------------------------------------------------------------
    def _advertise(self, available_only: bool, now: datetime, window: Any = None) -> str:
        # the broker's availability answer; over a future window (ListResources geni_start_time) for that term
        used = self.sm.in_use(now, window) if window else self.sm.in_use(now)
        known = self._usage
        if known is not None and known[0] is used:  # the broker's state is unchanged: the same answer object
            usage = known[1]
        else:  # once per change of the broker's state: its claim counters per pool, and the units it names
            cores, mem, taken, vlans = usage_counts(used.units, used.counts)
            usage = Usage(cores=cores, memory_mb=mem, taken=taken, vlans=vlans)
            if not window:
                self._usage = (used, usage)
        return self._ads.get(self._advertised.substrate(), usage, now, available_only)

    # ---- lifecycle -------------------------------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        """Can this process serve? Each check is "ok" or the reason it cannot (what the dashboard's /health
        and `slicex status` report)."""
        from rspec import validate

        checks: dict[str, str] = {}
        try:
            validate.check()
            checks["rspec"] = "ok"
        except GeniError as exc:
            checks["rspec"] = exc.message
        checks.update(self._check_store())
        return {"serving": all(v == "ok" for v in checks.values()), "checks": checks}

    def _check_store(self) -> dict[str, str]:
        """The store guard's checks (a read of the deployment record and a write); writes stop while one
        fails."""
        self._checks = self.store.check(f"am:{self.sm.name}")
        self._checked_at = time.monotonic()
        return self._checks

    def start(self) -> Endpoints:
        warm_caches()
        if self.host_driver is not None:
            start_host_driver(self.host_driver, self.authority_actor)
        self._tick()  # the first reaper pass before anything answers: expired slivers never look taken
        self._threads = [s.start_background() for s in (self._sa_server, self._am_server) if s is not None]
        for server in self.actor_servers:
            server.start()
        if self._am_v2_server is not None:
            self._threads.append(self._am_v2_server.start_background())
        if self.chapi is not None:
            self._threads.append(self.chapi.start())
        self.peer_trust.start()
        reaper = threading.Thread(target=self._reap_loop, name="reaper", daemon=True)
        reaper.start()
        self._threads.append(reaper)
        for p in self.publishers:
            p.tick(self.clock.now())
        if self.cfg.dashboard_port is not None and self.worker.index == 0:
            dashboard = Dashboard(self.substrate, Aggregate(self.am_urn, self.advertised.am_url, self.driver.description),
                                  self.store, self.clock.now, self.health, self.metrics, self.cfg.peers,
                                  self.am.policy.operators, self._operator_shutdown, publishers=self.publishers)
            tls = tls_context(str(self.home.am_cert), str(self.home.am_key), str(self.home.ca_cert)) \
                if self.cfg.dashboard_tls else None
            self._dashboard = start_dashboard(self.cfg.host, self.cfg.dashboard_port, dashboard, tls)
        log.info("slice authority at %s, aggregate at %s", self.endpoints.sa_url, self.endpoints.am_url)
        return self.endpoints

    def _reap_loop(self) -> None:
        tick = self.cfg.tick_seconds
        while not self._stop.wait(tick):
            self._tick()

    def _tick(self) -> None:
        """One pass of the reaper, after the store guard's check (at most once a second): nothing is reaped
        while writes are refused, and a lost deployment record or a full disk is noticed without a caller."""
        try:
            if time.monotonic() - self._checked_at >= STORE_CHECK_SECONDS:
                self._check_store()
            if self.store.fault is None:
                gone = self.sm.reap(self.clock.now())
                if gone:
                    log.info("reaped %d expired slivers", len(gone))
                # usage of the slivers this tick ended, and of those expired (the time index)
                self.ledger.settle(gone, self.sm.holds, self.clock.now())
                if self._swept_at is None:  # the first tick: the first step a period later
                    self._swept_at = time.monotonic()
                if time.monotonic() - self._swept_at >= LEDGER_SWEEP_SECONDS:
                    self._swept_at = time.monotonic()  # one page of the rotating check, slowly
                    self.ledger.sweep(self.sm.holds, self.clock.now(), LEDGER_SWEEP_PAGE)
        except Exception:  # noqa: BLE001 - the reaper must keep running
            log.exception("reaper failed; will retry next tick")
        if self.store.fault is None:  # the dashboard's snapshots: when changed, else every few seconds
            for p in self.publishers:
                p.tick(self.clock.now())

    def _operator_shutdown(self, slice_urn: str, operator: str) -> None:
        """An operator's Shutdown from the dashboard (verified client certificate, `operators:`)."""
        from slicex.urn import canonical_urn

        urn, now = canonical_urn(slice_urn, "slice"), self.clock.now()
        self.sm.shutdown(urn, now)
        if self.am.ledger is not None:  # as the AM API's Shutdown does: the slice's usage records end
            self.am.ledger.shut_down(urn, now)

    def stop(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self.peer_trust.stop()
        for server in (self._sa_server, self._am_server, self._am_v2_server):
            if server is not None:
                server.close()
        for actor in self.actor_servers:
            actor.stop()
        if self.chapi is not None:
            self.chapi.close()
        if self._dashboard is not None:
            self._dashboard.close()
        if self.host_driver is not None:
            self.host_driver.shutdown()
        self.store.close()

    @property
    def actor_urls(self) -> dict[str, str]:
        """Where this process serves its broker and authority (embedded); empty when they run elsewhere."""
        return {f"{server.name}_url": server.url for server in self.actor_servers}

    @property
    def dashboard_url(self) -> str | None:
        """Where the read-only operator dashboard listens; None when disabled or its port was taken."""
        return self._dashboard.url if self._dashboard is not None else None


class ActorProcess:
    """One actor (broker or authority) served over mutual TLS, for the scaled-out deployment."""

    def __init__(self, home: Home, role: str, port: int | None = None, store: Store | None = None,
                 clock: Clock | None = None, failures: FailurePlan | None = None, broker_url: str | None = None):
        """`broker_url`: where the authority delegates (default: slicex.yaml's, `Config.actor_url`)."""
        from authority.actor import Delegator

        cfg = home.config()
        self.host_driver: Any = None  # the authority's netns driver, when configured
        self.delegator: Delegator | None = None  # the authority's delegation to its broker
        authority = cfg.authority
        am_urn = actor_urn(authority, "am")  # also the name of the aggregate's inventory in tickets and leases
        self.store = guarded(store, cfg)  # its writes stop too while the deployment record is lost
        self.clock = clock or SystemClock()
        if role not in ("broker", "authority"):
            raise ValueError(f"unknown actor {role!r}: broker or authority")
        keys, _ = home_keys_and_names(home, authority)
        self.actor: Broker | Authority
        if role == "broker":
            # delegations are accepted only signed with the authority actor's key
            self.actor = make_broker(self.store, keys, am_urn, clock=self.clock, policy=policy_named(cfg.broker_policy))
        else:
            substrate = deployment_substrate(cfg)
            self.host_driver = host_driver(cfg, home)
            driver = substrate_driver(substrate, BitstreamCatalogue(self.store, home.root / "bitstreams"),
                                      EmulatedFpgaBackend(), failures, self.host_driver)
            # it delegates its own inventory, as the authority actor (its certificate) calling the broker
            url = broker_url or cfg.actor_url("broker")
            to = broker_client(url, Caller.of_home(home, "authority"), authority, cfg.actor_timeout_seconds,
                               active_actor(self.store, "broker"))
            self.actor = make_authority(self.store, keys, am_urn, substrate, driver, clock=self.clock, broker=to)
            self.delegator = Delegator(self.actor, to)
        self.tick_seconds = cfg.tick_seconds
        self.publishers = publishers_for(self.store, broker=self.actor, on_demand=True) if role == "broker" else \
            publishers_for(self.store, authority=self.actor, on_demand=True)
        self._stop = threading.Event()
        default_port = cfg.broker_port if role == "broker" else cfg.authority_port
        self.server = actor_server(role, self.actor, home, authority, (cfg.host, default_port if port is None else port))

    def _tick_loop(self) -> None:
        """The actor's own clock: the broker drops promises whose term ended and serves its queue; the
        authority closes expired leases."""
        tick = self.actor.tick if isinstance(self.actor, Broker) else self.actor.reap
        checked_at = 0.0
        while not self._stop.wait(self.tick_seconds):
            try:
                if time.monotonic() - checked_at >= STORE_CHECK_SECONDS:
                    checked_at = time.monotonic()
                    self.store.check(f"actor:{self.server.name}")
                if self.store.fault is None:
                    tick(self.clock.now())
            except Exception:  # noqa: BLE001 - the clock must keep running (a store outage passes)
                log.exception("%s clock failed; will retry next tick", self.server.name)
            if self.store.fault is None:
                for p in self.publishers:
                    p.tick(self.clock.now())

    @property
    def url(self) -> str:
        return self.server.url

    def start(self) -> str:
        warm_caches()
        if self.host_driver is not None:
            start_host_driver(self.host_driver, self.actor)
        self.server.start()
        threading.Thread(target=self._tick_loop, name=f"{self.server.name}-clock", daemon=True).start()
        if self.delegator is not None:  # once now; until the broker answers, again with backoff
            self.delegator.start()
        return self.url

    def stop(self) -> None:
        self._stop.set()
        if self.delegator is not None:
            self.delegator.stop()
        self.server.stop()
        if self.host_driver is not None:
            self.host_driver.shutdown()
