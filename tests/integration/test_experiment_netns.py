"""The experiment runner against `slicex up --substrate netns`, as an experimenter runs it: a 3-node LAN
at 10 Mbit/s created, measured from inside its nodes (ping, iperf3 TCP and UDP) and deleted 3 times, the
later repetitions pinned to the first one's placement (hosts, ports, VLAN); CSV, JSON and plots written;
a repetition whose node fails is recorded with its step and error and its slice still deleted; the CLI
over ssh through the login service; nothing left on the host."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from experiment import report
from experiment.client import AmClient
from experiment.nodes import netns_execs
from experiment.runner import Experiment, run
from slicex import procs
from tests.factories import request_rspec, vm
from tests.integration.conftest import AUTHORITY
from tests.integration.netns_support import have_iperf3
from tests.integration.test_netns_login import netns_up  # noqa: F401 - the fixture


def lan3(extra_n3: str = "") -> str:
    ifaces = ["n1:if0", "n2:if0", "n3:if0"]
    return request_rspec([vm("n1", ifaces=[ifaces[0]]), vm("n2", ifaces=[ifaces[1]]),
                          vm("n3", ifaces=[ifaces[2]], extra=extra_n3)],
                         [{"client_id": "lan0", "ifaces": ifaces, "capacity": 10_000}])


def test_runner_repeats_a_pinned_3_node_lan_measures_it_and_records_failures(netns_up, tmp_path):  # noqa: F811
    if not have_iperf3():
        pytest.skip("needs iperf3 (scripts/system-deps.sh installs it)")
    home, up, prefix = netns_up
    up.start()
    info = procs.read(home.pid_file).info
    client = AmClient(info["am_url"], info["sa_url"], str(home.user_cert("alice")), str(home.user_key("alice")),
                      AUTHORITY, "alice", [home.user_ssh_pub("alice").read_text().strip()])
    out = tmp_path / "results"
    exp = Experiment(client, lan3(), 3, netns_execs(prefix), duration=2, pings=3, pin=True)  # 2 s: 1 omitted
    reps = run(exp, out, progress=False)
    assert [r["ok"] for r in reps] == [True] * 3, [r["error"] for r in reps]
    first = reps[0]["placement"]
    assert first["links"]["lan0"] and all(r["placement"] == first for r in reps)  # re-created identically
    assert json.loads((out / "placement.json").read_text()) == first
    for r in reps:
        assert {(m["src"], m["dst"]) for m in r["links"]} == {("n1", "n2"), ("n1", "n3")}
        for m in r["links"]:
            # the 10 Mbit/s LAN, enforced by tc: of its order (unshaped, this veth carries thousands of Mbit/s).
            # No window: a loaded host only lowers the figure (a `make test` run measured 8.997, and iperf3's
            # receiver total once said 12.0 for a 2 s test whose omitted first second filled the queue); both
            # ends' token buckets are read in tests/integration/test_netns_am.py
            assert 0 < m["tcp_mbps"] < 20, m
            assert m["rtt_ms"] and m["ping_loss_pct"] == 0 and m["udp_jitter_ms"] is not None
            assert m["udp_loss_pct"] is not None
    s = json.loads((out / "results.json").read_text())["summary"]
    assert s["success_rate"] == 1.0 and s["time_to_ready_s"]["p50"] is not None
    assert s["time_to_ready_s"]["p95"] is None  # 3 samples cannot support a p95
    assert set(s["links"]) == {"lan0 n1->n2", "lan0 n1->n3"}
    for name in ("repetitions.csv", "links.csv", "summary.txt", "time-to-ready.png", "throughput-cdf.png",
                 "rtt-box.png"):
        assert (out / name).stat().st_size > 0, name
    assert len((out / "links.csv").read_text().splitlines()) == 1 + 3 * 2
    print("\n" + report.summary_text(s))

    # a node whose execute service fails: recorded at step "ready" with the command, the slice deleted
    bad = Experiment(client, lan3('<services><execute shell="sh" command="exit 7"/></services>'), 1,
                     netns_execs(prefix), duration=1, pings=2, ready_timeout=20)
    [rec] = run(bad, progress=False)
    assert not rec["ok"] and rec["failed_step"] == "ready" and "exited with 7" in rec["error"], rec
    assert "delete" in rec["times"]

    # the command line, over ssh through the manifest's login service, one repetition
    rspec = tmp_path / "lan3.xml"
    rspec.write_text(lan3())
    cli = subprocess.run([sys.executable, "-m", "cli", "--home", str(home.root), "experiment", str(rspec),
                          "-n", "1", "--exec", "ssh", "--duration", "1", "--pings", "2", "--quiet",
                          "-o", str(tmp_path / "cli")], capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stdout + cli.stderr
    assert "success rate 100%" in cli.stdout
    [row] = json.loads((tmp_path / "cli" / "results.json").read_text())["repetitions"]
    # this run checks the ssh path and that its measurement is recorded; a one-second iperf3 on a loaded host
    # is mostly slow start (CI measured 7.9), so accuracy is asserted on the pinned runs above
    assert 0 < row["links"][0]["tcp_mbps"] < 20

    from authority.substrate.netns import NetnsDriver

    assert NetnsDriver(prefix).leftovers() == []
