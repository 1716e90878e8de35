"""What the exchange point needs of an overlay: join two endpoints of a cross-domain link where no layer-2
path exists between their domains, and take the join down again. The IPOP-style overlay
(`federation/overlay/`, issue 10) is to provide it; sep.yaml names the implementation as
`overlay: "module:factory"` (the factory is called with the `overlay_options:` mapping). Without one, a
request whose cross-domain link has no layer-2 path is refused with UNSUPPORTED before anything is
allocated, saying so: the exchange point never pretends to have joined a link it has not."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class Endpoint:
    """One end of a link to join: the domain's AM URN, the node and interface client ids, and what the domain's
    manifest says about them (login host, the interface's IP address, the sliver URN)."""

    domain: str
    node: str
    interface: str
    sliver_urn: str = ""
    host: str = ""
    ip: str = ""


class Overlay(Protocol):
    def join(self, slice_urn: str, link_id: str, a: Endpoint, b: Endpoint) -> Mapping[str, Any]:
        """Make `a` and `b` reach each other; return what to record (shown in Describe's output)."""
        ...

    def leave(self, slice_urn: str, link_id: str) -> None:
        """Undo `join` (harmless if it was never made)."""
        ...


class OverlayUnavailable(Exception):
    """No overlay is configured, or the configured one cannot be loaded; the message says which."""


MISSING = ("no overlay is configured for this exchange point (sep.yaml `overlay:`); the IPOP-style overlay of "
           "federation/overlay/ is not available yet, so links without a layer-2 path cannot be joined")


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
