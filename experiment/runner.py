"""The experiment loop: create a topology through the AM API, wait until it is ready, measure every link
from inside its nodes, delete it; N times, with a progress bar. Each repetition is a record: its step
times, time to ready, placement, measurements, and, when a step failed, which step and the error (the
slice is still deleted, and a failed delete is recorded too). Nothing is retried behind the user's back.

    from experiment.runner import Experiment, run
    reps = run(Experiment(client, request_xml, repetitions=20, execs=netns_execs(prefix)), out_dir)
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from experiment import pinned, report
from experiment.client import AmClient, Slice, StepError
from experiment.measure import MeasureError, measure_pair
from experiment.nodes import ManifestNode, NodeExec, node_memory, topology


@dataclass
class Experiment:
    client: AmClient
    request: str
    repetitions: int
    execs: Callable[[dict[str, ManifestNode]], dict[str, NodeExec]]
    duration: float = 3.0  # seconds of each iperf3 test
    pings: int = 10
    udp_mbps: float | None = None  # default: the link's capacity, else 10
    ready_timeout: float = 120.0
    pin: bool = False  # re-create the first repetition's placement in every later one
    placement: dict[str, Any] | None = None  # a recorded placement to re-create in every repetition
    name: str = field(default_factory=lambda: "e" + uuid.uuid4().hex[:6])


def _timed(times: dict[str, float], step: str, fn: Callable[[], Any]) -> Any:
    t0 = time.monotonic()
    try:
        return fn()
    finally:
        times[step] = round(time.monotonic() - t0, 4)


def measure_links(manifest: str, execs: dict[str, NodeExec], exp: Experiment) -> list[dict[str, Any]]:
    """Every pair of every link of the manifest: RTT samples, TCP, UDP throughput/jitter/loss."""
    _nodes, links = topology(manifest)
    out = []
    for link in links:
        rate = exp.udp_mbps or (link.capacity_kbps / 1000 if link.capacity_kbps else 10.0)
        for src, dst in link.pairs():
            if not dst.address:
                raise MeasureError(f"link {link.client_id}: interface {dst.interface} has no address in the manifest")
            m = measure_pair(execs[src.node], execs[dst.node], dst.address, exp.duration, exp.pings, rate)
            out.append({"link": link.client_id, "src": src.node, "dst": dst.node, "address": dst.address,
                        "capacity_mbps": link.capacity_kbps / 1000 if link.capacity_kbps else None, **m})
    return out


def repetition(exp: Experiment, rep: int, request: str) -> dict[str, Any]:
    """One create → ready → measure → delete cycle, as a record."""
    times: dict[str, float] = {}
    rec: dict[str, Any] = {"rep": rep, "slice": f"{exp.name}-{rep}", "ok": False, "failed_step": None,
                           "error": None, "times": times, "time_to_ready_s": None, "links": []}
    c = exp.client
    s: Slice | None = None
    allocated = False
    step = "create_slice"
    try:
        s = _timed(times, "create_slice", lambda: c.create_slice(rec["slice"]))
        t0 = time.monotonic()
        step = "allocate"
        _timed(times, "allocate", lambda: c.allocate(s, request))
        allocated = True
        step = "provision"
        t_provision = time.monotonic()
        manifest = _timed(times, "provision", lambda: c.provision(s))
        step = "start"
        _timed(times, "start", lambda: c.start(s))
        step = "ready"
        _timed(times, "ready", lambda: c.wait_ready(s, exp.ready_timeout))
        rec["time_to_ready_s"] = round(time.monotonic() - t0, 4)
        rec["provision_to_ready_s"] = round(time.monotonic() - t_provision, 4)
        step = "describe"
        manifest = c.describe(s)
        rec["node_memory_bytes"] = node_memory(manifest)  # each node idle: booted, nothing measured yet
        rec["placement"] = pinned.placement_of(manifest)
        if exp.placement is not None:
            step = "pinning"
            diff = pinned.differences(exp.placement, manifest)
            if diff:
                raise StepError("pinning", "the slice was not re-created where recorded: " + "; ".join(diff))
        step = "measure"
        nodes, _links = topology(manifest)
        rec["links"] = _timed(times, "measure", lambda: measure_links(manifest, exp.execs(nodes), exp))
        rec["ok"] = True
    except StepError as exc:
        rec.update(ok=False, failed_step=exc.step, error=exc.message, geni_code=exc.code)
    except Exception as exc:  # noqa: BLE001 - a measurement or parsing failure is a result, recorded with its step
        rec.update(ok=False, failed_step=step, error=f"{type(exc).__name__}: {exc}")
    finally:
        if s is not None and allocated:
            try:
                _timed(times, "delete", lambda: c.delete(s))
            except StepError as exc:
                rec["ok"] = False
                rec["failed_step"] = rec["failed_step"] or "delete"
                rec["error"] = (rec["error"] + "; then " if rec["error"] else "") + f"delete: {exc.message}"
    return rec


def run(exp: Experiment, out: Path | None = None, progress: bool = True) -> list[dict[str, Any]]:
    """All repetitions; with `out`, the CSV/JSON/plots written there (rewritten after each repetition, so an
    interrupted run keeps what it measured)."""
    if out is not None:  # before any repetition: a missing package stops the run, not its last step
        report.require("matplotlib", "the experiment's plots")
    tqdm = report.require("tqdm", "the progress bar (--quiet runs without it)").tqdm if progress else None

    reps: list[dict[str, Any]] = []
    request = pinned.pin_request(exp.request, exp.placement) if exp.placement else exp.request
    meta = {"experiment": exp.name, "repetitions": exp.repetitions, "duration_s": exp.duration,
            "pings": exp.pings, "pinned": bool(exp.placement) or exp.pin, "request": exp.request}
    bar = tqdm(total=exp.repetitions, desc=f"experiment {exp.name}", unit="rep") if tqdm else None
    for rep in range(exp.repetitions):
        rec = repetition(exp, rep, request)
        reps.append(rec)
        if exp.pin and exp.placement is None and rec["ok"]:
            exp.placement = rec["placement"]  # later repetitions re-create exactly this one
            request = pinned.pin_request(exp.request, exp.placement)
            meta["placement"] = exp.placement
            if out is not None:
                out.mkdir(parents=True, exist_ok=True)
                pinned.save(exp.placement, out / "placement.json")
        ok = sum(r["ok"] for r in reps)
        if bar is not None:  # the count and ok=k/n change together: the bar never shows 1/5 beside ok=2/2
            ready = rec["time_to_ready_s"]
            bar.set_postfix(ok=f"{ok}/{len(reps)}", ready="-" if ready is None else f"{ready:.2f}s", refresh=False)
            bar.update(1)
            bar.refresh()
        if out is not None:
            report.write(out, reps, meta, with_plots=rep == exp.repetitions - 1)
    if bar is not None:
        bar.close()
    return reps


# ---- the command line: slicex experiment ------------------------------------------------------------------------
def add_command(sub: Any) -> None:
    """`slicex experiment` (added to cli/main.py's subcommands)."""
    p = sub.add_parser("experiment", help="create a topology N times through the AM API, measure RTT/TCP/UDP per "
                                          "link inside its nodes, delete; CSV, JSON, plots (docs/experiments.md)")
    p.add_argument("rspec", help="request RSpec file")
    p.add_argument("-n", "--repetitions", type=int, default=20)
    p.add_argument("-o", "--out", default="experiment-results", help="directory for CSV, JSON and PNG files")
    p.add_argument("--user", help="whose certificate and ssh key (default: alice, else the first user)")
    p.add_argument("--exec", choices=("auto", "netns", "ssh"), default="auto",
                   help="how commands reach the nodes: ip netns exec (netns aggregate on this host, root) or ssh "
                        "through the manifest's login service; auto: netns when it can")
    p.add_argument("--duration", type=float, default=3.0, help="seconds of each iperf3 test (TCP, then UDP)")
    p.add_argument("--pings", type=int, default=10, help="pings per link (0.2 s apart)")
    p.add_argument("--udp-mbps", type=float, help="UDP send rate (default: the link's capacity, else 10)")
    p.add_argument("--ready-timeout", type=float, default=120.0)
    p.add_argument("--pin", action="store_true", help="record the first repetition's placement (placement.json) "
                                                      "and re-create it identically in every later one")
    p.add_argument("--placement", help="re-create a recorded placement: placement.json, or a manifest RSpec")
    p.add_argument("--am-url")
    p.add_argument("--sa-url")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_experiment)


def _urls(home: Any) -> tuple[str, str]:
    """The running deployment's URLs (its pid file), else the configured ports."""
    from slicex import procs

    rec = procs.read(home.pid_file)
    if rec is not None and rec.info.get("am_url"):
        return rec.info["sa_url"], rec.info["am_url"]
    cfg = home.config()
    return f"https://{cfg.host}:{cfg.sa_port}/", f"https://{cfg.host}:{cfg.am_port}/"


def netns_prefix(home: Any) -> str | None:
    """The object prefix of this home's netns deployment (as deployment/service.py derives it), None if not netns."""
    import os

    from deployment.service import netns_prefix as prefix_of

    cfg = home.config()
    if cfg.substrate_driver != "netns" or os.geteuid() != 0:
        return None
    return prefix_of(cfg, home)


def cmd_experiment(args: Any) -> int:
    from experiment.nodes import netns_execs, ssh_execs
    from slicex.home import Home

    home = Home(Path(args.home)) if getattr(args, "home", None) else Home()
    users = home.users()
    if not users:
        print("no users yet: run `slicex user add NAME` first", flush=True)
        return 2
    user = args.user or ("alice" if "alice" in users else users[0])
    sa_url, am_url = _urls(home)
    client = AmClient(args.am_url or am_url, args.sa_url or sa_url, str(home.user_cert(user)),
                      str(home.user_key(user)), home.config().authority, user,
                      [home.user_ssh_pub(user).read_text().strip()] if home.user_ssh_pub(user).exists() else [])
    prefix = netns_prefix(home) if args.exec in ("auto", "netns") else None
    if args.exec == "netns" and prefix is None:
        print("--exec netns needs root and a home whose slicex.yaml says substrate_driver: netns", flush=True)
        return 2
    key = home.user_ssh_key(user)
    if prefix is None:
        key.chmod(0o600)
    execs = netns_execs(prefix) if prefix else ssh_execs(user, str(key))
    placement = None
    if args.placement:
        text = Path(args.placement).read_text()
        placement = pinned.placement_of(text) if text.lstrip().startswith("<") else pinned.load(Path(args.placement))
    exp = Experiment(client, Path(args.rspec).read_text(), args.repetitions, execs, args.duration, args.pings,
                     args.udp_mbps, args.ready_timeout, args.pin, placement)
    out = Path(args.out)
    reps = run(exp, out, progress=not args.quiet)
    print(report.summary_text(report.summary(reps)))
    print(f"results: {out}/results.json, repetitions.csv, links.csv; plots: time-to-ready.png, "
          f"throughput-cdf.png, rtt-box.png")
    return 0 if reps and all(r["ok"] for r in reps) else 1
