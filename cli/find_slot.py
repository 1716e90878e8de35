"""`slicex find-slot REQUEST.xml --hours 6 [--after T] [--within D]`: when can I have this request for that
long? An experimenter's question, so it is asked as experimenters ask the aggregate anything: over mutual TLS
with the user's certificate and a user credential from the slice authority, as AM API v3 ListResources with
the `slicex_find_slot` option (am/find_slot.py); the broker's calendar answers (broker/slots.py). The same
question goes through omni with `--omni-options FILE` (the options file `omni listresources --optionsfile`
reads).

Exit 0: a slot (printed with how to allocate it); 1: no slot in the window (what is short, from when); 2: the
question or the request is wrong, or the aggregate cannot be reached.

`cli/main.py` only calls `add_command(subparsers)`."""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import xmlrpc.client
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from cli.usage import when
from rspec.slot import read_slot
from slicex.clock import rfc3339
from slicex.home import Home
from slicex.tls_xmlrpc import client

RSPEC_V3 = {"type": "GENI", "version": "3"}
NO_SLOT = {24, 25, 26}  # VLAN_UNAVAILABLE, INSUFFICIENT_BANDWIDTH, INSUFFICIENT_NODES: nothing fits in the window
UNITS = {"m": timedelta(minutes=1), "h": timedelta(hours=1), "d": timedelta(days=1), "w": timedelta(weeks=1)}
LONGEST = timedelta(days=3660)
"""The longest --hours or --within the command sends (ten years): far past any aggregate's booking horizon
(am.max_lease, which refuses a longer question itself, naming it), short enough that no arithmetic on it
overflows."""


def span(text: str) -> timedelta:
    """A length of time: 90m, 36h, 2d, 1w, or a number of hours; at most LONGEST."""
    m = re.fullmatch(r"\s*(\d{1,12}(?:\.\d{1,12})?)\s*([mhdw]?)\s*", text)
    if not m or float(m.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a length of time (e.g. 90m, 36h, 2d, 1w)")
    unit = UNITS[m.group(2) or "h"]
    if float(m.group(1)) > LONGEST / unit:
        raise argparse.ArgumentTypeError(f"{text!r} is longer than {LONGEST.days} days, more than any aggregate books")
    return float(m.group(1)) * unit


def hours(text: str) -> float:
    """--hours: a positive, finite number of hours, at most LONGEST."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of hours") from None
    if not (math.isfinite(value) and 0 < value <= LONGEST / timedelta(hours=1)):
        raise argparse.ArgumentTypeError(f"--hours must be positive and at most {LONGEST / timedelta(hours=1):g} "
                                         f"({LONGEST.days} days), not {text!r}")
    return value


def question(rspec: str, hours: float, after: datetime | None, within: timedelta | None,
             now: datetime) -> dict[str, Any]:
    """The slicex_find_slot option for the request: the duration, and the window [after, after + within] when
    given (else the aggregate's: from now to its booking horizon)."""
    q: dict[str, Any] = {"rspec": rspec, "duration_seconds": int(round(hours * 3600))}
    if after is not None:
        q["earliest_start"] = rfc3339(after)
    if within is not None:
        q["latest_end"] = rfc3339(max(after or now, now) + within)
    return q


def slot_text(slot: dict[str, Any], request_path: str) -> str:
    """The slot for a terminal: when, where each node and link would go, and how to allocate it."""
    lines = [f"earliest slot: {rfc3339(slot['start'])} to {rfc3339(slot['end'])} "
             f"({slot['tried']} start time{'s' * (slot['tried'] != 1)} weighed)"]
    for n in slot["nodes"]:
        lines.append(f"  node {n['client_id']:<12} -> {n.get('host', '?')}"
                     f"{' (site ' + n['site'] + ')' if n.get('site') else ''}")
    for lk in slot["links"]:
        lines.append(f"  link {lk['client_id']:<12} -> {lk.get('switch', 'no switch')}"
                     f"{' VLAN ' + lk['vlan_tag'] if lk.get('vlan_tag') else ''}")
    lines.append(f"allocate it with the options geni_start_time={rfc3339(slot['start'])} "
                 f"geni_end_time={rfc3339(slot['end'])} (request {request_path}); Allocate books it if nothing "
                 f"else was booked in between")
    return "\n".join(lines)


def cmd_find_slot(args: argparse.Namespace) -> int:
    home = Home(Path(args.home)) if args.home else Home()
    try:
        rspec = Path(args.request).read_text()
    except OSError as exc:
        print(f"slicex find-slot: cannot read {args.request}: {exc}", file=sys.stderr)
        return 2
    if not 0 < args.hours <= LONGEST / timedelta(hours=1):
        print(f"slicex find-slot: --hours must be positive and at most {LONGEST.days} days", file=sys.stderr)
        return 2
    try:
        option = question(rspec, args.hours, args.after, args.within, datetime.now(UTC).replace(microsecond=0))
    except OverflowError:
        print("slicex find-slot: --after plus --within is past the last time a calendar can name", file=sys.stderr)
        return 2
    if args.omni_options:
        Path(args.omni_options).write_text(json.dumps({"slicex_find_slot": option}, indent=1) + "\n")
        print(f"wrote {args.omni_options}: omni -V3 -a AM_URL listresources --optionsfile {args.omni_options}")
        return 0
    users = home.users()
    user = args.user or ("alice" if "alice" in users else users[0] if users else "")
    if not user or not home.user_cert(user).exists():
        print(f"slicex find-slot: no user {args.user or ''} in {home.root} (slicex user add NAME)", file=sys.stderr)
        return 2
    cfg = home.config()
    am_url = args.am or f"https://{cfg.host}:{cfg.am_port}/"
    sa_url = args.sa or f"https://{cfg.host}:{cfg.sa_port}/"
    cert, key = str(home.user_cert(user)), str(home.user_key(user))
    try:
        credential = client(sa_url, cert, key, timeout=args.timeout).CreateUserCredential(
            home.user_cert(user).read_text())
        reply = client(am_url, cert, key, timeout=args.timeout).ListResources(
            [{"geni_type": "geni_sfa", "geni_version": "3", "geni_value": credential}],
            {"geni_rspec_version": RSPEC_V3, "slicex_find_slot": option})
    except (OSError, xmlrpc.client.Error) as exc:
        print(f"slicex find-slot: the aggregate at {am_url} (or its slice authority {sa_url}) did not answer: {exc}",
              file=sys.stderr)
        return 2
    geni_code = reply.get("code", {}).get("geni_code")
    if geni_code != 0:
        print(f"slicex find-slot: {'no slot' if geni_code in NO_SLOT else 'refused'} (GENI code {geni_code}): "
              f"{reply.get('output', '')}", file=sys.stderr)
        return 1 if geni_code in NO_SLOT else 2
    slot = read_slot(reply["value"])
    if args.json:
        print(json.dumps({**slot, "start": rfc3339(slot["start"]), "end": rfc3339(slot["end"])}, indent=1))
    else:
        print(slot_text(slot, args.request))
    return 0


def add_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "find-slot", help="when can I have this request for that long? The earliest start at which the whole "
                          "request fits for --hours, from the broker's calendar (asked of the running aggregate as "
                          "the user, over mutual TLS: ListResources with slicex_find_slot)",
        description="Asks the aggregate (AM API v3 ListResources with the slicex_find_slot option, your certificate "
                    "and a user credential from the slice authority) for the earliest start at which every node "
                    "and link of REQUEST fits for --hours, weighing the window's start and every time a reservation "
                    "ends in it. Then Allocate with geni_start_time and geni_end_time as printed. Exit 0: a slot; "
                    "1: none in the window (what is short, from when); 2: a wrong question or no answer.")
    p.add_argument("request", help="request RSpec (GENI v3)")
    p.add_argument("--hours", type=hours, required=True, help="how long the whole request is needed")
    p.add_argument("--after", type=when, help="earliest start: an RFC 3339 time or a date (default: now)")
    p.add_argument("--within", type=span, help="search window from --after (or now): 90m, 36h, 2d, 1w (default: "
                                               "up to the aggregate's booking horizon, am.max_lease)")
    p.add_argument("--user", help="whose certificate asks (default alice, else the home's first user)")
    p.add_argument("--am", help="AM API v3 URL (default: this home's aggregate)")
    p.add_argument("--sa", help="slice authority URL for the user credential (default: this home's)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for each answer")
    p.add_argument("--json", action="store_true", help="the slot as JSON")
    p.add_argument("--omni-options", metavar="FILE", help="write the question as an omni options file instead "
                                                          "(omni listresources --optionsfile FILE) and exit")
    p.set_defaults(func=cmd_find_slot)
