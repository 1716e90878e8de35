"""Actors over the network, derived from their declarations (protocol/api.py): a proxy class whose methods
are exactly the protocol's and send each argument in its wire form (slicex/codec.py), and a server's handler
table that decodes each argument on arrival (a malformed one is BADARGS), calls the local actor and encodes
its answer. The transport (mutual TLS, faults back to GENI errors, outages as UNAVAILABLE/TIMEDOUT) is
slicex/actor_rpc.py's.

A message is sent as its method's arguments in declaration order. A broker or authority in its own process
runs its own clock (deployment/service.py ActorProcess): the `now` a caller sends is only a hint."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Mapping
from functools import cache
from typing import Any, TypeVar

from protocol.api import AUTHORITY, OPERATOR, SLICE_MANAGER, AuthorityApi, BrokerApi
from slicex.actor_rpc import ActorClient
from slicex.codec import MalformedMessage, decode, encode

Api = TypeVar("Api")


@cache
def methods(api: type) -> dict[str, inspect.Signature]:
    """The protocol's methods (name -> signature with resolved types, `self` left out), in declaration order."""
    out = {}
    for name, fn in vars(api).items():
        if name.startswith("_") or not inspect.isfunction(fn):
            continue
        hints = typing.get_type_hints(fn)
        sig = inspect.signature(fn)
        params = [p.replace(annotation=hints[p.name]) for p in list(sig.parameters.values())[1:]]
        out[name] = sig.replace(parameters=params, return_annotation=hints["return"])
    return out


def callers_of(api: type, kind: str) -> frozenset[str]:
    """The methods of `api` a caller of `kind` (SLICE_MANAGER, AUTHORITY) may call."""
    return frozenset(name for name in methods(api) if kind in getattr(vars(api)[name], "callers", ()))


def handlers(api: type, actor: Any) -> dict[str, Callable[..., Any]]:
    """The server side of `api` over the local `actor`: one handler per protocol method, taking and answering
    wire forms."""
    return {name: _handler(name, sig, actor) for name, sig in methods(api).items()}


def _handler(name: str, sig: inspect.Signature, actor: Any) -> Callable[..., Any]:
    params = list(sig.parameters.values())

    def handle(*wire: Any) -> Any:
        if len(wire) > len(params):
            raise MalformedMessage(f"{name}: takes {len(params)} arguments, {len(wire)} given")
        args = []
        for p, w in zip(params, wire, strict=False):
            args.append(decode(w, p.annotation, f"{name}: {p.name}"))
        for p in params[len(wire):]:
            if p.default is inspect.Parameter.empty:
                raise MalformedMessage(f"{name}: {p.name} is missing")
        return encode(getattr(actor, name)(*args), sig.return_annotation)

    handle.__name__ = name
    return handle


def proxy_class(api: type, name: str) -> type:
    """A class with exactly `api`'s methods, each sending its arguments through an ActorClient (`self.client`)
    and decoding the answer."""
    def method(method_name: str, sig: inspect.Signature) -> Callable[..., Any]:
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            bound = sig.bind(*args, **kwargs)
            bound.apply_defaults()
            wire = [encode(bound.arguments[p.name], p.annotation) for p in sig.parameters.values()]
            return decode(self.client.call(method_name, *wire), sig.return_annotation,
                          f"{self.client.name}.{method_name} answer")

        call.__name__ = call.__qualname__ = method_name
        call.__signature__ = sig  # type: ignore[attr-defined]
        call.__doc__ = vars(api)[method_name].__doc__
        return call

    def __init__(self: Any, client: ActorClient) -> None:
        self.client = client

    namespace: dict[str, Any] = {"__init__": __init__, "__doc__": f"{api.__name__} of an actor in another process.",
                                 "__module__": __name__}
    namespace.update({n: method(n, sig) for n, sig in methods(api).items()})
    return type(name, (), namespace)


RemoteBroker: Callable[[ActorClient], BrokerApi] = proxy_class(BrokerApi, "RemoteBroker")
RemoteAuthority: Callable[[ActorClient], AuthorityApi] = proxy_class(AuthorityApi, "RemoteAuthority")


def broker_handlers(broker: BrokerApi) -> dict[str, Callable[..., Any]]:
    """The broker's methods as a network actor (slicex.actor_rpc.ActorServer)."""
    return handlers(BrokerApi, broker)


def authority_handlers(authority: AuthorityApi) -> dict[str, Callable[..., Any]]:
    """The authority's methods as a network actor (slicex.actor_rpc.ActorServer)."""
    return handlers(AuthorityApi, authority)


def broker_callers(slice_manager: str, authority: str) -> Mapping[str, frozenset[str]]:
    """The broker actor server's callers (certificate URN) and the methods each may call."""
    return {slice_manager: callers_of(BrokerApi, SLICE_MANAGER), authority: callers_of(BrokerApi, AUTHORITY)}


def authority_callers(slice_manager: str, operator: str) -> Mapping[str, frozenset[str]]:
    """The authority actor server's callers: the slice manager for leases, and its operator (the authority's
    own certificate) for maintenance orders."""
    return {slice_manager: callers_of(AuthorityApi, SLICE_MANAGER), operator: callers_of(AuthorityApi, OPERATOR)}
