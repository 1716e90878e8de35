"""Dry-run placement at the AM edge: will a request fit, where would each node and link go, and for what does
not fit, what is short (asked vs available, by resource and site). Nothing is claimed, booked or written.

The broker answers it: the slice manager sends the same demands as Allocate in a `place` message with
`dry_run` (protocol/api.py `BrokerApi.place`), and the broker's policy plans them over its own calendar in its
collecting mode (broker/placement.py `plan`, `report`); so a plan that fits is where Allocate would put the
request if nothing changes in between. The answer is plain data (XML-RPC friendly): `slicex plan` prints it,
Allocate with `slicex_dry_run` returns it as its `value`."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from protocol.api import BrokerApi
from protocol.messages import demands_of
from slicex.term import Term


def plan_at_home(home: Any, rspec_xml: str, now: datetime, user: str | None = None,
                 broker: BrokerApi | None = None) -> dict[str, Any]:
    """`slicex plan`: the dry run as the deployment's AM would answer Allocate with `slicex_dry_run` now. The
    `place` message with `dry_run` goes to `broker` (the running broker actor, in either deployment) when
    given; else, with nothing running, to a broker at rest over the store (deployment/actors.py)."""
    from broker.policy import policy_named
    from deployment.actors import aggregate_name, broker_at_rest
    from deployment.service import deployment_substrate
    from fpga_aggregate.bitstreams import BitstreamCatalogue
    from rspec.request import parse_request
    from slicex.store import open_store

    cfg = home.config()
    substrate = deployment_substrate(cfg)
    name = aggregate_name(cfg.authority)
    whole = parse_request(rspec_xml)
    request = whole.for_aggregate(name)
    if substrate.external_links:
        from stitching.am_hops import apply_hops

        request = apply_hops(substrate, request, whole)
    store = open_store(str(cfg.store))
    try:
        if broker is None:
            broker = broker_at_rest(store, substrate, name, policy_named(cfg.broker_policy))
        parts: dict[str, str] = {}
        if user:
            owner = f"urn:publicid:IDN+{cfg.authority}+user+{user}"
            parts = {b.ref: b.part for b in BitstreamCatalogue(store, home.root / "bitstreams").list(owner)}
        end = now + timedelta(minutes=cfg.am.allocation_lifetime_minutes)
        names = {e.client_id: e.client_id for e in (*request.nodes, *request.links)}
        demands = demands_of(request, names, cfg.image_policy, parts)
        return dict(broker.place("slicex-plan", demands, Term(now, end), now, dry_run=True, authority=name).report or {})
    finally:
        store.close()


def plan_text(answer: Mapping[str, Any]) -> str:
    """The dry-run answer for a terminal: the summary, a line per node and link placed, and per element that
    does not fit its reason and what is short."""
    lines = [str(answer["summary"])]
    for n in answer["nodes"]:
        size = f" {n['vm_size']} ({n['cores']} cores, {n['memory_mb']} MB)" if n.get("vm_size") else \
            f" {n.get('sliver_type', '')}"
        lines.append(f"  node {n['client_id']:<12} -> {n['host']}{' (site ' + n['site'] + ')' if n['site'] else ''}"
                     f"{size}")
    for lk in answer["links"]:
        tag = f" VLAN {lk['vlan_tag']}" if lk["vlan_tag"] != "" else " (no VLAN)"
        on = f"switch {', '.join(lk['switches']) or lk['switch']}" if lk["switch"] else "no switch"
        lines.append(f"  link {lk['client_id']:<12} -> {on}{tag} between {', '.join(lk['endpoints'])}")
    for s in answer["short"]:
        lines.append(f"  short {s['kind']} {s['client_id']}: {s['error'] + ': ' if s['error'] else ''}{s['reason']}")
        for need in s["needs"]:
            where = ", ".join(f"{k} {need[k]}" for k in ("site", "switch", "interface") if need.get(k))
            lines.append(f"      {need['resource']}{' at ' + where if where else ''}: asked {need['asked']}, "
                         f"available {need['available']}")
    return "\n".join(lines)
