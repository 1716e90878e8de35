"""The experiment runner's pure parts: parsing ping and iperf3 output, the topology of a manifest, pinned
placement (record, bind a request, compare), the summary's percentiles and spread, the files written, the
progress bar, and the docs showing what it prints."""

from __future__ import annotations

import json

import pytest

from experiment import pinned, report
from experiment.measure import MeasureError, parse_iperf3, parse_ping
from experiment.nodes import topology
from rspec.request import parse_request
from tests.factories import request_rspec, vm

PING = """PING 10.10.0.2 (10.10.0.2) 56(84) bytes of data.
64 bytes from 10.10.0.2: icmp_seq=1 ttl=64 time=0.412 ms
64 bytes from 10.10.0.2: icmp_seq=2 ttl=64 time=1.05 ms

--- 10.10.0.2 ping statistics ---
2 packets transmitted, 2 received, 0% packet loss, time 201ms
rtt min/avg/max/mdev = 0.412/0.731/1.050/0.319 ms
"""

MANIFEST = """<rspec xmlns="http://www.geni.net/resources/rspec/3" type="manifest">
<node client_id="n1" component_id="urn:publicid:IDN+x+node+h1" component_manager_id="urn:publicid:IDN+x+authority+am"
      sliver_id="urn:publicid:IDN+x+sliver+a1">
  <interface client_id="n1:if0" component_id="urn:publicid:IDN+x+interface+h1:eth1"><ip address="10.10.0.1"/></interface>
  <services><login authentication="ssh-keys" hostname="127.0.0.1" port="40001" username="alice"/></services></node>
<node client_id="n2" component_id="urn:publicid:IDN+x+node+h2" sliver_id="urn:publicid:IDN+x+sliver+a2">
  <interface client_id="n2:if0" component_id="urn:publicid:IDN+x+interface+h2:eth1"><ip address="10.10.0.2"/></interface></node>
<node client_id="n3" component_id="urn:publicid:IDN+x+node+h1" sliver_id="urn:publicid:IDN+x+sliver+a3">
  <interface client_id="n3:if0"><ip address="10.10.0.3"/></interface></node>
<link client_id="lan0" vlantag="1007"><interface_ref client_id="n1:if0"/><interface_ref client_id="n2:if0"/>
  <interface_ref client_id="n3:if0"/><property source_id="n1:if0" dest_id="n2:if0" capacity="10000"/></link>
</rspec>"""


def test_ping_samples_and_loss():
    assert parse_ping(PING) == {"rtt_ms": [0.412, 1.05], "ping_loss_pct": 0.0}
    with pytest.raises(MeasureError):
        parse_ping("connect: Network is unreachable")


def test_iperf3_tcp_counts_what_the_receiver_got_and_udp_gives_jitter_and_loss():
    tcp = {"end": {"sum_sent": {"bits_per_second": 11e6}, "sum_received": {"bits_per_second": 9.6e6}}}
    assert parse_iperf3(json.dumps(tcp), udp=False) == {"tcp_mbps": 9.6}
    udp = {"end": {"sum": {"bits_per_second": 9.9e6, "jitter_ms": 0.8, "lost_percent": 1.5}}}
    assert parse_iperf3(json.dumps(udp), udp=True) == {"udp_mbps": 9.9, "udp_jitter_ms": 0.8, "udp_loss_pct": 1.5}
    with pytest.raises(MeasureError, match="unable to connect"):
        parse_iperf3(json.dumps({"error": "unable to connect to server"}), udp=False)


def test_topology_pairs_a_lan_from_its_first_end_and_reads_logins():
    nodes, links = topology(MANIFEST)
    assert nodes["n1"].logins == (("alice", "127.0.0.1", 40001),) and nodes["n2"].sliver_id.endswith("a2")
    [lan] = links
    assert lan.capacity_kbps == 10000
    assert [(a.node, b.node, b.address) for a, b in lan.pairs()] == [("n1", "n2", "10.10.0.2"),
                                                                      ("n1", "n3", "10.10.0.3")]


def test_a_pinned_request_asks_for_the_recorded_hosts_ports_and_vlan():
    placement = pinned.placement_of(MANIFEST)
    assert placement["links"] == {"lan0": 1007}
    assert placement["interfaces"]["n1:if0"].endswith("h1:eth1") and "n3:if0" not in placement["interfaces"]
    ifaces = ["n1:if0", "n2:if0", "n3:if0"]
    request = request_rspec([vm(f"n{k}", ifaces=[ifaces[k - 1]]) for k in (1, 2, 3)],
                            [{"client_id": "lan0", "ifaces": ifaces}])
    bound = parse_request(pinned.pin_request(request, placement))
    assert [n.component_id for n in bound.nodes] == ["urn:publicid:IDN+x+node+h1", "urn:publicid:IDN+x+node+h2",
                                                     "urn:publicid:IDN+x+node+h1"]
    assert bound.nodes[1].interfaces[0].component_id.endswith("h2:eth1") and bound.links[0].vlan_tag == 1007
    assert pinned.differences(placement, MANIFEST) == []
    moved = MANIFEST.replace('vlantag="1007"', 'vlantag="1008"').replace("node+h2", "node+h3")
    assert pinned.differences(placement, moved) == ["node n2: recorded urn:publicid:IDN+x+node+h2, got "
                                                    "urn:publicid:IDN+x+node+h3", "link lan0: recorded 1007, got 1008"]


def _rep(k: int, ok: bool = True, tcp: float = 9.6) -> dict:
    links = [{"link": "lan0", "src": "n1", "dst": "n2", "address": "10.10.0.2", "rtt_ms": [0.5, 0.7],
              "ping_loss_pct": 0.0, "tcp_mbps": tcp, "udp_mbps": 9.9, "udp_jitter_ms": 1.0, "udp_loss_pct": 0.0}]
    return {"rep": k, "slice": f"e-{k}", "ok": ok, "failed_step": None if ok else "provision",
            "error": None if ok else "Provision answered code 1: latency needs sch_netem", "times": {"allocate": 0.1},
            "time_to_ready_s": 1.0 + k / 10 if ok else None, "links": links if ok else []}


def test_summary_reports_p95_only_with_20_samples_and_failures_with_their_step():
    reps = [_rep(k, tcp=9.5 + k / 100) for k in range(19)] + [_rep(19, ok=False)]
    s = report.summary(reps)
    assert s["success_rate"] == 0.95 and s["failures_by_step"] == {"provision": 1}
    assert s["failures"][0]["error"].endswith("sch_netem")
    assert s["time_to_ready_s"]["n"] == 19 and s["time_to_ready_s"]["p95"] is None
    assert report.summary([_rep(k) for k in range(20)])["time_to_ready_s"]["p95"] == pytest.approx(2.8)
    tcp = s["links"]["lan0 n1->n2"]["tcp_mbps"]
    assert tcp["n"] == 19 and tcp["min"] == 9.5 and tcp["max"] == pytest.approx(9.68)
    assert "n/a (n=19)" in report.summary_text(s) and "failed at provision: 1" in report.summary_text(s)


def test_write_makes_csv_json_and_the_three_plots(tmp_path):
    reps = [_rep(0), _rep(1), _rep(2, ok=False)]
    report.write(tmp_path, reps, {"experiment": "t"})
    assert json.loads((tmp_path / "results.json").read_text())["summary"]["succeeded"] == 2
    rows = (tmp_path / "repetitions.csv").read_text().splitlines()
    assert rows[0].startswith("rep,slice,ok,failed_step,error") and "provision" in rows[3]
    assert len((tmp_path / "links.csv").read_text().splitlines()) == 3
    for png in ("time-to-ready.png", "throughput-cdf.png", "rtt-box.png"):
        assert (tmp_path / png).read_bytes()[:4] == b"\x89PNG"


def test_the_throughput_cdf_rises_from_zero_and_carries_the_links_capacity():
    reps = [_rep(k, tcp=t) for k, t in enumerate((9.7, 9.5, 9.6))]
    for r in reps:
        r["links"][0]["capacity_mbps"] = 10.0
    xs, ys, capacity = report.throughput_cdf(reps)["lan0 n1->n2"]
    assert xs == [9.5, 9.5, 9.6, 9.7] and ys == pytest.approx([0, 1 / 3, 2 / 3, 1])
    assert capacity == 10.0
    del reps[0]["links"][0]["capacity_mbps"]  # a link the request gave no capacity: none drawn
    for r in reps[1:]:
        r["links"][0]["capacity_mbps"] = None
    assert report.throughput_cdf(reps)["lan0 n1->n2"][2] is None


def test_every_percentile_the_samples_cannot_support_reads_the_same():
    """"p95 n/a (n=5)" on one line and "p95 -" on the next said one thing two ways."""
    reps = [_rep(k) for k in range(5)]
    for r in reps:
        r.update(provision_to_ready_s=0.5, node_memory_bytes={"n1": 2**20})
    text = report.summary_text(report.summary(reps))
    lines = [line for line in text.splitlines() if "p95" in line]
    assert len(lines) == 3 and all("p95 n/a (n=5)" in line for line in lines), text
    assert "p95 -" not in text


def test_the_progress_bar_counts_a_repetition_when_it_counts_it_in_ok(monkeypatch, capsys):
    """tqdm advanced after the loop body while ok=k/n was set inside it: `1/5 ... ok=2/2`."""
    from experiment import runner

    outcomes = iter([True, False, True])
    monkeypatch.setattr(runner, "repetition", lambda exp, rep, request: _rep(rep, ok=next(outcomes)))
    runner.run(runner.Experiment(None, "<rspec/>", 3, lambda nodes: {}), out=None, progress=True)
    shown = [s for s in capsys.readouterr().err.replace("\r", "\n").splitlines() if "ok=" in s]
    assert shown
    for s in shown:
        done = s.split("|")[-1].split("/")[0].strip()  # "...| 2/3 [00:00<00:00, ..., ok=1/2, ready=-]"
        counted = s.split("ok=")[1].split("/")[1].split(",")[0].split("]")[0]
        assert done == counted, s
    assert any(" 3/3 " in s and "ok=2/3" in s for s in shown), shown


def test_docs_show_every_kind_of_line_the_runner_prints():
    """docs/experiments.md left out lines the runner prints (provision to ready, idle node memory, ...)."""
    from pathlib import Path

    reps = [_rep(k) for k in range(4)] + [_rep(4, ok=False)]
    for r in reps[:4]:
        r.update(provision_to_ready_s=0.5, node_memory_bytes={"n1": 2**20})
    printed = report.summary_text(report.summary(reps)).splitlines()
    doc = (Path(__file__).resolve().parents[2] / "docs" / "experiments.md").read_text()
    kinds = ("repetitions ", "time to ready (", "provision to ready (", "idle node memory (", "failed at ",
             "  rep ", "link  ", "lan0 n1->n2  ")
    for line in printed:
        kind = next((k for k in kinds if line.startswith(k)), None)
        assert kind is not None, f"a line this test does not know (document it, then add it here): {line!r}"
        assert kind in doc, f"docs/experiments.md does not show the line {line!r}"
    assert "\nresults: " in doc and "ok=" in doc  # the last line, and the progress bar
