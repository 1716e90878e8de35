"""The experiment runner: create a topology through the AM API as an experimenter's client does, measure it
from inside its nodes, delete it, and repeat; report success rate, time to ready and per-link spread.

A client of the aggregate, not part of it (hence a package of its own beside am/, as omni is beside gcf):
- client.py   the AM API v3 and slice authority calls with the user's certificate (CreateSlice, Allocate,
              Provision, geni_start, Status polling, Describe, Delete), each failure tagged with its step
- nodes.py    NodeExec: run a command inside a node (`ip netns exec` on a netns aggregate's host, or ssh
              through the manifest's login service) and the topology a manifest describes
- measure.py  ping RTT and iperf3 TCP/UDP (throughput, jitter, loss) between the ends of each link
- pinned.py   a slice's exact placement (hosts, ports, VLANs) from its manifest, and the bound request that
              re-creates it
- report.py   CSV/JSON results, the summary, PNG plots
- runner.py   the loop (progress bar; every failure recorded with its step, never hidden) and the CLI
"""
