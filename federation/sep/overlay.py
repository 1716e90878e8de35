"""What the exchange point needs of an overlay: join two endpoints of a cross-domain link where no layer-2
path exists between their domains, and take the join down again. `federation/sep/overlay_netns.py`
provides it over the IPOP-style overlay of `federation/overlay/`; sep.yaml names the implementation as
`overlay: "module:factory"` (the factory is called with the `overlay_options:` mapping, plus `log_dir`, a
directory beside sep.yaml for its files, unless the mapping names one). Without one, a
request whose cross-domain link has no layer-2 path is refused with UNSUPPORTED before anything is
allocated, saying so: the exchange point never pretends to have joined a link it has not."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class Endpoint:
    """One end of a link to join: the domain's AM URN, the node and interface client ids, the node's sliver URN
    (from the domain's manifest), the address the request gave the interface ("" if none), and the link's
    capacity in kbps (0: none asked for), which the overlay holds what this end sends to."""

    domain: str
    node: str
    interface: str
    sliver_urn: str = ""
    host: str = ""
    ip: str = ""
    capacity_kbps: int = 0


class Overlay(Protocol):
    def admit(self, link_id: str, addresses: Mapping[str, str], capacity_kbps: int) -> None:
        """Raise a GeniError (BADARGS for the request, UNSUPPORTED for this host) when `join` could not make
        this link as asked: called at Allocate, so nothing is allocated for a link Provision would fail on.
        `addresses`: interface client id -> the address the request gives it."""
        ...

    def join(self, slice_urn: str, link_id: str, a: Endpoint, b: Endpoint) -> Mapping[str, Any]:
        """Make `a` and `b` reach each other; return what to record (shown in Describe's output)."""
        ...

    def leave(self, slice_urn: str, link_id: str, joined: Mapping[str, Any]) -> None:
        """Undo `join`; `joined` is what join returned (kept in the exchange point's record, so a restarted
        exchange point can take down what an earlier one made)."""
        ...


class OverlayUnavailable(Exception):
    """No overlay is configured, or the configured one cannot be loaded; the message says which."""


MISSING = ("no overlay is configured for this exchange point (sep.yaml `overlay:`, e.g. "
           "federation.sep.overlay_netns:make_overlay), so links without a layer-2 path cannot be joined")


def load_overlay(spec: str | None, options: Mapping[str, Any] | None = None) -> Overlay | None:
    """The overlay named `module:factory`, or None when none is configured."""
    if not spec:
        return None
    module, _, factory = spec.partition(":")
    try:
        made = getattr(importlib.import_module(module), factory or "make_overlay")(dict(options or {}))
    except (ImportError, AttributeError) as exc:
        raise OverlayUnavailable(f"overlay {spec!r} cannot be loaded: {exc}") from None
    return made
