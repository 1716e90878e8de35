"""qemu-vm nodes of the netns substrate: time to ready and memory per idle VM, beside a container node.

Per run, through the driver as the authority calls it (authority/substrate/netns.py, one node on a LAN):
  provision  create: namespace, veth, tap and redirects, the qcow2 overlay, the boot record (a container:
             its layer file system, overlay and configuration)
  ready      geni_start until Status is geni_ready (a VM's sshd answered with its banner at the login relay's
             end; Status polled every 0.5 s)
  guest      the guest's own uptime when its init started sshd (from its console log): kernel and init
  memory     the node's cgroup memory (page cache of files left out) after --idle seconds
  rss        QEMU's resident memory at the same moment
  delete     destroy: QEMU killed, overlay, taps, namespace gone
One VM at a time (a TCG boot takes a core). KVM where the driver's probe boot showed it works, else TCG: which
is in each row.

Run (root): .venv/bin/python bench/vm_boot.py [--runs N] [--idle S] [--nodes container,qemu] [--json PATH]
Prints a table, then one JSON object per measurement per line (and all of them to --json PATH)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from authority.substrate.netns import NetnsDriver  # noqa: E402
from authority.substrate.vm import NodeVM  # noqa: E402
from bench._common import machine, report  # noqa: E402
from protocol.messages import SliverSpec  # noqa: E402

NOW = datetime.now(UTC)


def specs(tag: str, machine_kind: str) -> tuple[SliverSpec, SliverSpec]:
    ref = "n1:if0"
    link = SliverSpec(f"urn:{tag}:lan", "link", "lan0", labels=(("vlan", 1000),),
                      details={"capacity_kbps": 0, "subnet": "10.10.0", "interface_refs": [ref]})
    details = {"interfaces": {ref: {"component_id": "x", "ip": "", "netmask": ""}}, "cores": 1, "memory_mb": 512,
               "disk_gb": 10, "slice_urn": f"urn:publicid:IDN+bench+slice+{tag}"}
    if machine_kind == "qemu":
        details["machine"] = "qemu"
    return link, SliverSpec(f"urn:{tag}:n1", "node", "n1", labels=(("vlan", 1000),), details=details)


def rss_kib(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total


def one(driver: NetnsDriver, kind: str, idle: float) -> dict:
    tag = f"b{uuid.uuid4().hex[:6]}"
    link, node = specs(tag, kind)
    status = {link.id: driver.create(link, NOW)}
    t0 = time.monotonic()
    status[node.id] = driver.create(node, NOW)
    t1 = time.monotonic()
    driver.modify(link, status[link.id], "geni_start", NOW)
    status[node.id] = driver.modify(node, status[node.id], "geni_start", NOW)
    while driver.status(node, status[node.id], NOW)[0] == "geni_configuring":  # a VM booting
        time.sleep(0.5)
    t2 = time.monotonic()
    plan = driver._node_plan(node)
    box = driver._container(plan)
    guest = None
    if isinstance(box, NodeVM):
        line = next((x for x in box.console().splitlines() if "ready after" in x), "")
        guest = float(line.split("ready after")[1].split()[0]) if line else None
    time.sleep(idle)
    memory = box.usage().get("memory_bytes", 0) / 2**20
    rss = rss_kib(box.pids()) / 1024
    t3 = time.monotonic()
    driver.destroy(node, status[node.id], NOW)
    t4 = time.monotonic()
    driver.destroy(link, status[link.id], NOW)
    return {"node": kind, "accel": status[node.id].get("accel", "-") if kind == "qemu" else "-",
            "provision_s": t1 - t0, "ready_s": t2 - t1, "guest_s": guest, "memory_mib": memory, "rss_mib": rss,
            "delete_s": t4 - t3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--idle", type=float, default=10.0, help="seconds idle before memory is read")
    ap.add_argument("--nodes", default="container,qemu", help="node kinds measured, in turn (default both)")
    ap.add_argument("--json", help="also write every measurement to this file")
    args = ap.parse_args()
    print(f"vm_boot: {machine()}", flush=True)
    driver = NetnsDriver(f"b{uuid.uuid4().hex[:4]}")
    rows: list[dict] = []
    try:
        driver.start()
        print(driver.description.split("; ")[-1], flush=True)
        for kind in args.nodes.split(","):
            for _ in range(args.runs):
                rows.append(one(driver, kind, args.idle))
                print(json.dumps(rows[-1]), flush=True)
    finally:
        driver.reconcile([])
        driver.shutdown(remove=True)
    table = []
    for kind in args.nodes.split(","):
        mine = [r for r in rows if r["node"] == kind]
        out = {"node": kind, "accel": mine[0]["accel"] if mine else "-", "samples": len(mine)}
        for key in ("provision_s", "ready_s", "guest_s", "memory_mib", "rss_mib", "delete_s"):
            vals = [r[key] for r in mine if r[key] is not None]
            if vals:
                out[key] = f"{statistics.median(vals):.2f} ({min(vals):.2f}-{max(vals):.2f})"
        table.append(out)
    report(table, ["node", "accel", "samples", "provision_s", "ready_s", "guest_s", "memory_mib", "rss_mib",
                   "delete_s"], title="p50 (min-max) per node kind", json_lines=False)
    for r in rows:
        print(json.dumps(r, sort_keys=True))
    if args.json:
        Path(args.json).write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))


if __name__ == "__main__":
    main()
