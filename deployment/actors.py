"""The one place actors are built and wired together.

`slicex up` (embedded and distributed), `slicex actor`, the CLI's maintenance and plan, and the tests all
build their broker, authority and slice manager here, so what the tests run is what users run: the same
keys, the same delegation signed by the authority and verified by the broker, and every actor on a clock."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes

from slicex.clock import Clock
from slicex.devpki import actor_urn
from slicex.ticket import load_signing_key

if TYPE_CHECKING:
    from authority.actor import Authority
    from broker.broker import Broker
    from protocol.api import BrokerApi
    from protocol.remote import RemoteAuthority, RemoteBroker
    from rspec.substrate import Substrate
    from slice_manager.actor import ActorSliceManager
    from slicex.actor_rpc import ActorServer
    from slicex.home import Home
    from slicex.store import Store


def aggregate_name(authority: str) -> str:
    """The aggregate's URN: the name its authority delegates under and signs leases as."""
    return actor_urn(authority, "am")


@dataclass(frozen=True)
class ActorKeys:
    """The signing keys of one deployment's broker (tickets) and authority (leases, delegations), and the
    public keys each actor verifies the other with."""

    broker: PrivateKeyTypes
    authority: PrivateKeyTypes

    @classmethod
    def of_home(cls, home: Home) -> ActorKeys:
        """The keys `slicex ca init` issued (devpki); they persist, so what was signed before still verifies."""
        return cls(load_signing_key(home.broker_key.read_bytes()), load_signing_key(home.authority_key.read_bytes()))

    @classmethod
    def generated(cls) -> ActorKeys:
        """Fresh keys of the kind a new home gets (devpki.ACTOR_KEY_KINDS), for a deployment that lives in one
        test."""
        from cryptography.hazmat.primitives.asymmetric import ec

        return cls(*(ec.generate_private_key(ec.SECP256R1()) for _ in range(2)))

    @classmethod
    def given(cls, broker: Any = None, authority: Any = None) -> ActorKeys:
        """PEM bytes or loaded keys; a missing one is generated."""
        fresh = cls.generated() if broker is None or authority is None else None

        def load(k: Any, default: Any) -> Any:
            return default if k is None else load_signing_key(k) if isinstance(k, bytes) else k

        return cls(load(broker, fresh and fresh.broker), load(authority, fresh and fresh.authority))


def make_broker(store: Store, keys: ActorKeys, authority_name: str, *, policy: Any = None,
                clock: Clock | None) -> Broker:
    """The broker: accepts delegations only signed with the authority's key; decides by its own clock
    (`clock` None only in tests of the core that drive time through the `now` of each call)."""
    from broker.broker import Broker

    return Broker("broker", store, keys.broker, policy=policy, authority=authority_name,
                  authority_keys={authority_name: keys.authority.public_key()}, clock=clock)


def make_authority(store: Store, keys: ActorKeys, authority_name: str, substrate: Substrate, driver: Any, *,
                   clock: Clock | None, broker: BrokerApi | None = None) -> Authority:
    """The authority over `substrate`: signs leases and delegations, trusts tickets of the broker's key only.
    `driver` None: it only delegates and reclaims (no slivers). `broker`: where its maintenance orders go
    before it has delegated (`export_to` sets it too)."""
    from authority.actor import Authority
    from resources import export_substrate

    return Authority(authority_name, driver, {"broker": keys.broker.public_key()}, store=store, key=keys.authority,
                     inventory=export_substrate(substrate, authority_name, "broker"), clock=clock, broker=broker)


def broker_at_rest(store: Store, substrate: Substrate, authority_name: str, policy: Any) -> Broker:
    """A broker for one command while no deployment runs (`slicex plan`): over the store's calendar when a
    broker was ever delegated to there, else over the authority's whole export. It holds no key, so it cannot
    sign a ticket, and it only answers dry runs, which write nothing."""
    from broker.broker import Broker
    from resources import export_substrate
    from slicex.store.sqlite_store import SqliteStore

    broker = Broker("broker", store, None, policy=policy, authority=authority_name)
    if broker.delegated():
        return broker
    fresh = Broker("broker", SqliteStore(":memory:"), None, policy=policy, authority=authority_name)
    fresh.accept(export_substrate(substrate, authority_name, "broker"))
    return fresh


def embedded_actors(store: Store, keys: ActorKeys, substrate: Substrate, driver: Any, *, authority_name: str = "",
                    policy: Any = None, clock: Clock | None) -> tuple[Broker, Authority]:
    """A broker and an authority in one process on one store, the authority's inventory delegated to the
    broker as a signed document the broker verifies (as between processes)."""
    name = authority_name or aggregate_name(substrate.authority)
    broker = make_broker(store, keys, name, policy=policy, clock=clock)
    authority = make_authority(store, keys, name, substrate, driver, clock=clock)
    authority.export_to(broker)
    return broker, authority


def embedded_slice_manager(store: Store, substrate: Substrate, driver: Any, *, keys: ActorKeys | None = None,
                           policy: Any = None, authority_name: str = "", clock: Clock | None = None,
                           **options: Any) -> ActorSliceManager:
    """The three actors of an embedded deployment, reached through the slice manager: the library form of
    `slicex up` for programs and tests. `options` are the slice manager's (name, image policy, tick, ...).
    Without a `clock` the broker and the authority take each call's `now` as the time, which tests of the
    core use to drive time; `slicex up` passes its system clock."""
    from slice_manager.actor import ActorSliceManager

    keys = keys or ActorKeys.generated()
    broker, authority = embedded_actors(store, keys, substrate, driver, authority_name=authority_name,
                                        policy=policy, clock=clock)
    return ActorSliceManager(store, substrate, broker, authority, lease_key=keys.authority.public_key(), **options)


@dataclass(frozen=True)
class Caller:
    """Who calls a remote actor: a certificate and key of this deployment, and the deployment CA alone as the
    root its servers must chain to (a federation peer's CA may vouch for users, never for our actors)."""

    cert: str
    key: str
    ca: str

    @classmethod
    def of_home(cls, home: Home, role: str) -> Caller:
        """`role`: "am" (the slice manager's identity), "authority" or "broker"."""
        cert, key = {"am": (home.am_cert, home.am_key), "authority": (home.authority_cert, home.authority_key),
                     "broker": (home.broker_cert, home.broker_key)}[role]
        return cls(str(cert), str(key), str(home.ca_cert))


def broker_client(url: str, caller: Caller, authority: str, timeout: float,
                  locate: Callable[[], str | None] | None = None) -> RemoteBroker:
    """The broker actor at `url` (or wherever `locate` says the active one is), pinned to this deployment's
    broker certificate."""
    from protocol.remote import RemoteBroker
    from slicex.actor_rpc import ActorClient

    return RemoteBroker(ActorClient("broker", url, caller.cert, caller.key, caller.ca, actor_urn(authority, "broker"),
                                    timeout=timeout, locate=locate))


def authority_client(url: str, caller: Caller, authority: str, timeout: float,
                     locate: Callable[[], str | None] | None = None) -> RemoteAuthority:
    """The authority actor at `url` (or wherever `locate` says the active one is), pinned to this deployment's
    authority certificate."""
    from protocol.remote import RemoteAuthority
    from slicex.actor_rpc import ActorClient

    return RemoteAuthority(ActorClient("authority", url, caller.cert, caller.key, caller.ca,
                                       actor_urn(authority, "authority"), timeout=timeout, locate=locate))


def active_actor(store: Store, role: str) -> Callable[[], str | None]:
    """Where the active `role` actor serves, as its lease's holder published it (deployment/leadership.py)."""
    from deployment.leadership import active_url

    return lambda: active_url(store, role)


def actor_server(role: str, actor: Any, home: Home, authority: str, address: tuple[str, int]) -> ActorServer:
    """The broker or the authority served over mutual TLS with its own certificate: its handlers and who may
    call what, both derived from the protocol. Callers are authenticated against the deployment CA alone (a
    federation peer's CA may vouch for users, never for a caller of actor methods)."""
    from protocol.remote import authority_callers, authority_handlers, broker_callers, broker_handlers
    from slicex.actor_rpc import ActorServer

    am_urn = aggregate_name(authority)
    if role == "broker":  # the slice manager asks for promises; the authority delegates and reclaims
        handlers, callers = broker_handlers(actor), broker_callers(am_urn, actor_urn(authority, "authority"))
    else:  # the slice manager asks for leases; the operator (the authority's own key) orders maintenance
        handlers, callers = authority_handlers(actor), authority_callers(am_urn, actor_urn(authority, "authority"))
    own = Caller.of_home(home, role)
    return ActorServer(role, handlers, callers, address, own.cert, own.key, own.ca)


def home_keys_and_names(home: Home, authority: str) -> tuple[ActorKeys, str]:
    """A home's actor keys (issuing what an older home lacks) and its aggregate's name."""
    from slicex.devpki import ensure_actor_identities

    ensure_actor_identities(home, authority)
    return ActorKeys.of_home(home), aggregate_name(authority)
