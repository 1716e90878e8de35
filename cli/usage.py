"""`slicex usage`: who used what over a period, per user or per project, from the deployment's usage records
(operations/ledger.py): a table on stdout, optionally a CSV file and a plot (matplotlib, from the `experiment` extra,
imported only when a plot is asked for).

`cli/main.py` only calls `add_command(subparsers)`."""

from __future__ import annotations

import argparse
import csv
import sys
from datetime import UTC, date, datetime, time
from pathlib import Path

from operations.accounting import HOUR, UsageRecord, UsageRow, aggregate, held_over_time
from operations.ledger import usage_records
from slicex.clock import parse_time, rfc3339
from slicex.errors import BadArgs, GeniError
from slicex.home import Home

HEADINGS = ("slivers", "core-h", "mem GB-h", "node-h", "VLAN-h", "Mbps-h", "FPGA-h", "disk GB-h")


def when(text: str) -> datetime:
    """An RFC 3339 time, or a date (its midnight UTC)."""
    try:
        return parse_time(text)
    except BadArgs:
        pass
    try:
        return datetime.combine(date.fromisoformat(text), time(0), UTC)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a date (2030-01-31) nor an RFC 3339 time "
                                         f"(2030-01-31T12:00:00Z)") from None


def table(rows: list[UsageRow], by: str, period_from: datetime, period_to: datetime) -> str:
    """The report as text: one line per user or project, resource-hours within the period."""
    width = max([len(by)] + [len(r.who) for r in rows])
    lines = [f"usage by {by} from {rfc3339(period_from)} to {rfc3339(period_to)}",
             f"{by:<{width}}  " + "  ".join(f"{h:>9}" for h in HEADINGS)]
    for r in rows:
        lines.append(f"{r.who:<{width}}  {r.slivers:>9}  " + "  ".join(f"{v:>9.2f}" for v in r.values()[2:]))
    if not rows:
        lines.append("(no slivers lived in this period)")
    return "\n".join(lines)


def write_csv(path: Path, rows: list[UsageRow], by: str, period_from: datetime, period_to: datetime) -> None:
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["by", *UsageRow.COLUMNS, "from", "to"])
        for r in rows:
            out.writerow([by, *r.values(), rfc3339(period_from), rfc3339(period_to)])


def plot(path: Path, records: list[UsageRecord], rows: list[UsageRow], by: str, period_from: datetime,
         period_to: datetime, now: datetime) -> None:
    """Core-hours and node-hours per user or project (bars), and cores held over the period (steps)."""
    try:
        import matplotlib
    except ImportError:
        raise BadArgs("--plot needs matplotlib, which is in the experiment extra: pip install 'slicex[experiment]'") \
            from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (bars, steps) = plt.subplots(2, 1, figsize=(10, 8))
    names = [r.who.rsplit("+", 1)[-1] for r in rows]
    xs = range(len(rows))
    bars.bar([x - 0.2 for x in xs], [r.core_hours for r in rows], width=0.4, label="core-hours")
    bars.bar([x + 0.2 for x in xs], [r.node_hours for r in rows], width=0.4, label="node-hours")
    bars.set_xticks(list(xs), names, rotation=20, ha="right")
    bars.set_title(f"usage by {by}, {rfc3339(period_from)} to {rfc3339(period_to)}")
    bars.legend()
    for who, series in sorted(held_over_time(records, by, "cores", period_from, period_to, now).items()):
        times = [t for t, _ in series] + [period_to]
        levels = [v for _, v in series] + [series[-1][1]]
        steps.step(times, levels, where="post", label=who.rsplit("+", 1)[-1])
    steps.set_ylabel("cores held")
    steps.legend(loc="upper left", fontsize="small")
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def cmd_usage(args: argparse.Namespace) -> int:
    """Exit 0 with the report; 2 when the period or the store is wrong, or a plot cannot be drawn."""
    from slicex.store import open_store
    from slicex.store.ownership import Actor, scoped

    home = Home(Path(args.home)) if args.home else Home()
    now = datetime.now(UTC).replace(microsecond=0)
    try:
        store = open_store(str(home.config().store))
        try:
            records = usage_records(scoped(store, Actor.OPERATIONS))
        finally:
            store.close()
        period_to = args.to or now
        period_from = args.start or min((r.start for r in records), default=period_to - 30 * 24 * HOUR)
        rows = aggregate(records, args.by, period_from, period_to, now)
        print(table(rows, args.by, period_from, period_to))
        if args.csv:
            write_csv(Path(args.csv), rows, args.by, period_from, period_to)
            print(f"wrote {args.csv}")
        if args.plot:
            plot(Path(args.plot), records, rows, args.by, period_from, period_to, now)
            print(f"wrote {args.plot}")
    except GeniError as exc:
        print(f"slicex usage: {exc.message}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"slicex usage: {exc}", file=sys.stderr)
        return 2
    return 0


def add_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("usage", help="who used what: resource-hours per user or project over a period, from the "
                                     "usage records of the deployment's store (docs/operator-guide.md)")
    p.add_argument("--from", dest="start", type=when, help="period start: a date or RFC 3339 time (default: the "
                                                          "first record)")
    p.add_argument("--to", type=when, help="period end (default: now; live slivers count until now)")
    p.add_argument("--by", choices=["user", "project"], default="user", help="group by owner or by project")
    p.add_argument("--csv", metavar="FILE", help="also write the table as CSV")
    p.add_argument("--plot", metavar="FILE.png", help="also draw core- and node-hours and cores held over time "
                                                      "(needs matplotlib: the experiment extra)")
    p.set_defaults(func=cmd_usage)
