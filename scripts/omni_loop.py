"""Repeat an omni experiment N times against a slicex aggregate and check the inventory comes back intact.

Each cycle: createslice → allocate (3-node LAN by default) → provision → poa geni_start → status → delete,
all through stock omni. Before and after, the advertisement is fetched and compared (timestamps aside):
the loop fails if a single core, node or VLAN is still held. Per-cycle timings go to a JSON file and a plot.

Usage: python scripts/omni_loop.py --omni "$INTEROP/py2/bin/python $INTEROP/geni-tools/src/omni.py"
       [--cycles 50] [--config $SLICEX_HOME/omni_config] [--rspec FILE] [--plot loop.png]"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

THREE_NODE_LAN = """<rspec xmlns="http://www.geni.net/resources/rspec/3" type="request">
<node client_id="n1"><sliver_type name="default-vm"/><interface client_id="n1:if0"/></node>
<node client_id="n2"><sliver_type name="default-vm"/><interface client_id="n2:if0"/></node>
<node client_id="n3"><sliver_type name="default-vm"/><interface client_id="n3:if0"/></node>
<link client_id="lan0"><interface_ref client_id="n1:if0"/><interface_ref client_id="n2:if0"/>
<interface_ref client_id="n3:if0"/></link>
</rspec>"""


def omni(base: list[str], *args: str) -> str:
    proc = subprocess.run(base + list(args), capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0 or re.search(r"Failed|ERROR|error code|geni_code\W+[1-9]", out.split("Result Summary")[-1]):
        raise RuntimeError(f"omni {' '.join(args)} failed:\n{out[-3000:]}")
    return out


def inventory(base: list[str], outdir: Path) -> str:
    """The advertisement with its timestamps removed."""
    prefix = outdir / "ad"
    omni(base, "-a", "slicex", "-V3", "listresources", "-o", "-p", str(prefix))
    files = sorted(outdir.glob("ad*"), key=lambda p: p.stat().st_mtime)
    text = files[-1].read_text()
    for f in files:
        f.unlink()
    return re.sub(r'(generated|expires|lastUpdateTime)="[^"]*"', "", text)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--omni", required=True, help="command that runs omni, e.g. 'python2 .../src/omni.py'")
    p.add_argument("--config", default=str(Path(os.environ.get("SLICEX_HOME", Path.home() / ".slicex")) / "omni_config"))
    p.add_argument("--cycles", type=int, default=50)
    p.add_argument("--rspec", help="request RSpec (default: a 3-node LAN)")
    p.add_argument("--out", default="omni-loop.json", help="per-cycle timings (JSON)")
    p.add_argument("--plot", default="omni-loop.png", help="plot of per-step times per cycle")
    args = p.parse_args()
    try:  # not in the core install: the `experiment` extra
        import matplotlib  # noqa: F401 - checked now, used for the plot at the end
        from tqdm import tqdm
    except ImportError as exc:
        sys.exit(f"omni_loop needs {exc.name!r} (progress bar and plot): pip install 'slicex[experiment]'")
    base = shlex.split(args.omni) + ["-c", args.config]
    with tempfile.TemporaryDirectory() as tmp:
        tmpdir = Path(tmp)
        rspec = Path(args.rspec) if args.rspec else tmpdir / "req.xml"
        if not args.rspec:
            rspec.write_text(THREE_NODE_LAN)
        before = inventory(base, tmpdir)
        results = []
        steps = [("createslice", lambda s: ["createslice", s]),
                 ("allocate", lambda s: ["-a", "slicex", "-V3", "allocate", s, str(rspec)]),
                 ("provision", lambda s: ["-a", "slicex", "-V3", "provision", s]),
                 ("poa geni_start", lambda s: ["-a", "slicex", "-V3", "poa", s, "geni_start"]),
                 ("status", lambda s: ["-a", "slicex", "-V3", "status", s]),
                 ("delete", lambda s: ["-a", "slicex", "-V3", "delete", s])]
        failures = 0
        for i in tqdm(range(args.cycles), desc="omni cycles", unit="cycle"):
            name = f"loop{int(time.time()) % 100000}x{i}"
            timings = {}
            try:
                for step, argv in steps:
                    t0 = time.perf_counter()
                    omni(base, *argv(name))
                    timings[step] = time.perf_counter() - t0
                results.append({"cycle": i, "ok": True, **timings})
            except RuntimeError as exc:
                failures += 1
                results.append({"cycle": i, "ok": False, "error": str(exc)[-500:], **timings})
                tqdm.write(f"cycle {i} failed: {str(exc)[:300]}")
        after = inventory(base, tmpdir)
    Path(args.out).write_text(json.dumps(results, indent=1))
    _plot(results, [s for s, _ in steps], args.plot)
    intact = before == after
    print(f"{args.cycles - failures} of {args.cycles} cycles succeeded; inventory "
          f"{'unchanged' if intact else 'CHANGED'} afterwards; timings in {args.out}, plot in {args.plot}")
    print(json.dumps({"bench": "omni_loop", "cycles": args.cycles, "succeeded": args.cycles - failures,
                      "inventory_intact": intact}))
    return 0 if failures == 0 and intact else 1


def _plot(results: list[dict], steps: list[str], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    bottom = [0.0] * len(results)
    for step in steps:
        values = [r.get(step, 0.0) for r in results]
        ax.bar([r["cycle"] for r in results], values, bottom=bottom, label=step)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_xlabel("cycle")
    ax.set_ylabel("seconds (omni wall time)")
    ax.set_title("omni create → delete cycles against slicex")
    ax.legend(fontsize=8, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
