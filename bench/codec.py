"""Which codec for the one typed model (issue 33): pydantic v2's `TypeAdapter` against msgspec, beside the
repository's own codec (slicex/codec.py over msgspec; a type not yet a Struct writes its own `to_doc`/`from_doc`,
named "hand-written"), on a 10-node `Demands` round trip and on each record kind the store holds per live sliver.

A round trip is encode (typed value -> JSON bytes) then decode (JSON bytes -> typed value, validated on the
way in: pydantic and msgspec check every field's type; the repository's codec as it is used: the document
the store writes, and the value read back from it). Each
is timed over --rounds rounds after a warm-up, best of --repeat, in microseconds per round trip, with the JSON
bytes each writes. Output: a table, then one JSON object per measurement per line.

Run: .venv/bin/python bench/codec.py [--rounds 2000] [--repeat 5] [--json FILE]"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import machine, report  # noqa: E402

URN = "urn:publicid:IDN+bench.slicex"


def _rspec(nodes: int) -> str:
    """A request of `nodes` small VMs in a chain of links (each node an interface per link it is on)."""
    parts = ['<rspec xmlns="http://www.geni.net/resources/rspec/3" type="request">']
    for i in range(nodes):
        ifaces = "".join(f'<interface client_id="n{i}:if{j}"/>' for j in (i - 1, i) if 0 <= j < nodes - 1)
        parts.append(f'<node client_id="n{i}" exclusive="false"><sliver_type name="small"/>{ifaces}</node>')
    for j in range(nodes - 1):
        parts.append(f'<link client_id="l{j}"><interface_ref client_id="n{j}:if{j}"/>'
                     f'<interface_ref client_id="n{j + 1}:if{j}"/></link>')
    return "".join(parts) + "</rspec>"


def samples() -> dict[str, tuple[type, Any, Callable[[Any], Any], Callable[[Any], Any]]]:
    """Record kind -> (its type, a value as the store holds it for one small VM, the repository's encode to a
    document, and decode from one)."""
    from operations.accounting import UsageRecord
    from protocol.messages import Demand, Demands, NodeDemand, SliverDetails, SliverSpec, demands_of
    from resources.kind import Amounts
    from rspec.request import parse_request
    from slice_manager import reservation as rs
    from slice_manager.records import Record
    from slicex.codec import decode, encode
    from slicex.ticket import Lease, Ticket

    def codec(tp: type) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
        return encode, lambda d: decode(d, tp, tp.__name__)

    request = replace(parse_request(_rspec(10)), xml="")
    rids = {e.client_id: f"{URN}+sliver+{i:016x}" for i, e in enumerate([*request.nodes, *request.links])}
    demands = demands_of(request, rids)
    start = datetime(2026, 12, 2, 12, tzinfo=UTC)
    end = start + timedelta(days=1)
    sliver, group = f"{URN}+sliver+04e95502c7e248bf", "ticket:3d36d85b3c614e3190b8496e01d6711f"
    units = (f"core:{URN}+node+r01h3:13", *(f"mem:{URN}+node+r01h3:{i}" for i in range(52, 56)))
    ticket = Ticket(f"{group}/{sliver}", "broker", "sm-vm-39891", sliver, units, start, end, 2, "M" * 96,
                    authority=f"{URN}+authority+am")
    lease = Lease(ticket.id, f"{URN}+authority+am", ticket.id, "sm-vm-39891", sliver, units, start, end, 2, "M" * 96)
    details = SliverDetails(cores=1, disk_gb=20, disk_image=f"{URN}+image+ubuntu-22.04", exclusive=False,
                            host="r01h3", hostname="n2.fill38.bench.slicex", interfaces={}, logins=[],
                            memory_mb=2048, sliver_type="small", vm_size="small")
    spec = SliverSpec(sliver, "node", "n2", units, (), details)
    one = demands_of(replace(request, nodes=request.nodes[:1], links=()), {"n0": sliver})
    record = Record(sliver, f"{URN}+slice+fill38", f"{URN}+user+bench", "n2", "node", f"{URN}+node+r01h3", group,
                    rs.Reservation(sliver, rs.ACTIVE, rs.NONE, None, 2, "", 3, "node n2 (small)", gate="redeem",
                                   end=end),
                    Demand(NodeDemand.of(one.request.nodes[0]), 1),
                    details, ticket, lease, [], "", True, False, False,
                    "0cb9fc20-1ac9-4148-8118-add57dd4e8ad")
    usage = UsageRecord(sliver, f"{URN}+slice+fill38", f"{URN}+user+bench", "node", "n2",
                        Amounts(cores=1, memory_mb=2048, disk_gb=20, nodes=1), start, end)
    return {
        "Demands (10 nodes, 9 links)": (Demands, demands, *codec(Demands)),
        "sm record (1 VM)": (Record, record, Record.to_doc, Record.from_doc),
        "ticket (5 units)": (Ticket, ticket, *codec(Ticket)),
        "lease (5 units)": (Lease, lease, *codec(Lease)),
        "sliver spec (1 VM)": (SliverSpec, spec, *codec(SliverSpec)),
        "usage record": (UsageRecord, usage, *codec(UsageRecord)),
    }


def _best(fn: Callable[[], Any], rounds: int, repeat: int) -> float:
    """Microseconds per call: the best of `repeat` runs of `rounds` calls (after one warm-up run)."""
    best = float("inf")
    for i in range(repeat + 1):
        t0 = time.perf_counter()
        for _ in range(rounds):
            fn()
        took = (time.perf_counter() - t0) / rounds * 1e6
        if i:
            best = min(best, took)
    return best


def codecs(tp: type, to_doc: Callable[[Any], Any], from_doc: Callable[[Any], Any]) -> dict[str, Callable[[], Any]]:
    """Codec name -> a maker of (encode: value -> bytes, decode: bytes -> value) (making one may fail: a codec
    that cannot carry the type)."""
    def repository() -> tuple[Any, Any]:
        from slicex.store.codec import _DECODER, _json

        return (lambda v: _json(to_doc(v)), lambda b: from_doc(_DECODER.decode(b)))  # as the store writes and reads

    def pydantic() -> tuple[Any, Any]:
        from pydantic import TypeAdapter

        adapter = TypeAdapter(tp)
        return adapter.dump_json, adapter.validate_json

    def msgspec() -> tuple[Any, Any]:
        import msgspec

        return msgspec.json.Encoder().encode, msgspec.json.Decoder(tp).decode

    return {"repository": repository, "pydantic": pydantic, "msgspec": msgspec}


def run(rounds: int, repeat: int) -> list[dict[str, Any]]:
    rows = []
    for kind, (tp, value, to_doc, from_doc) in samples().items():
        for name, make in codecs(tp, to_doc, from_doc).items():
            try:
                encode, decode = make()
                wire = encode(value)
                back = decode(wire)
            except Exception as exc:  # noqa: BLE001 - a codec that cannot carry the type is a finding, not a crash
                rows.append({"bench": "codec", "kind": kind, "codec": name, "error": f"{type(exc).__name__}: {exc}"[:120]})
                continue
            same = back == value if not hasattr(value, "indexed") else json.loads(encode(back)) == json.loads(wire)
            rows.append({"bench": "codec", "kind": kind, "codec": name, "bytes": len(wire), "same": same,
                         "encode_us": round(_best(lambda e=encode, v=value: e(v), rounds, repeat), 1),
                         "decode_us": round(_best(lambda d=decode, w=wire: d(w), rounds, repeat), 1)})
            rows[-1]["round_trip_us"] = round(rows[-1]["encode_us"] + rows[-1]["decode_us"], 1)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("--rounds", type=int, default=2000, help="round trips per timed run (default 2000)")
    ap.add_argument("--repeat", type=int, default=5, help="timed runs; the best counts (default 5)")
    ap.add_argument("--json", metavar="FILE", help="also write the JSON lines to FILE")
    args = ap.parse_args()
    rows = run(args.rounds, args.repeat)
    report(rows, ["kind", "codec", "round_trip_us", "encode_us", "decode_us", "bytes", "same", "error"],
           title=f"Codec round trips (best of {args.repeat} x {args.rounds}; {machine()})")
    if args.json:
        Path(args.json).write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
