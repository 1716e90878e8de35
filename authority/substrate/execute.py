"""Post-boot `execute` services of netns nodes (rspec `<services><execute shell= command=/>`).

At every geni_start (and geni_restart) the node's services run one after the other inside its container, as
the node's first slice user (else `nobody`), in that user's home. Their output and exit codes stay inside the
node (`/var/lib/slicex-services/<n>.out`, `<n>.rc`, the user's own files); the aggregate reads them only
through the container (`NodeContainer.attach`: the node's root reads regular files only, a tail of bounded
size, within a deadline), never by following a path on the host that a user could point elsewhere. The node
is geni_configuring while they run, geni_ready once all exited 0, and geni_failed naming the first that did
not (or that was interrupted). The manifest shows each service's state, exit code and the tail of its output."""

from __future__ import annotations

import base64
import binascii
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass

from authority.substrate.container import RESULTS_SCRIPT, SERVICES_SCRIPT, NodeContainer, write_atomic
from authority.substrate.login import Account, _alive, _kill
from slicex.errors import BadArgs

SHELLS = {"sh": "/bin/sh", "bash": "/bin/bash", "/bin/sh": "/bin/sh", "/bin/bash": "/bin/bash",
          "/usr/bin/bash": "/usr/bin/bash"}
OUTPUT_TAIL = 4000  # characters of output the manifest shows per service
RESULTS_LIMIT = 64 * 1024  # bytes the aggregate reads of one results answer, whatever the node prints
IN_NODE_DIR = "/var/lib/slicex-services"
MARKER = "slicex-services"  # in the command line of the host's lxc-attach (its pid check)

# as the node's root: a fresh results directory owned by the user, then the services as that user
_AS_USER = """D=$1; U=$2; shift 2
rm -rf "$D"; mkdir -p "$D"; chown "$U" "$D"; chmod 700 "$D"
H=$(getent passwd "$U" | cut -d: -f6); [ -d "$H" ] || H=$D
exec setpriv --reuid="$U" --regid="$(id -g "$U")" --init-groups --inh-caps=-all \
  env -i HOME="$H" USER="$U" LOGNAME="$U" PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 \
  /bin/sh -c "$SERVICES" sx "$D" "$@"
"""


@dataclass(frozen=True)
class Service:
    shell: str  # as requested ("sh")
    command: str


def services_of(details: Mapping, client_id: str = "") -> list[Service]:
    """The node's execute services from its details; an unknown shell is refused when the node is created,
    not discovered when the command fails."""
    out = []
    for s in details.get("execute") or ():
        shell, command = str(s.get("shell") or "sh"), str(s.get("command") or "")
        if shell not in SHELLS:
            raise BadArgs(f"node {client_id}: execute shell {shell!r} is not offered here (use sh or bash)")
        if not command.strip():
            raise BadArgs(f"node {client_id}: an execute service has an empty command")
        out.append(Service(shell, command))
    return out


def parse_results(text: str, services: list[Service]) -> dict[int, tuple[int | None, str]]:
    """The node's answer to RESULTS_SCRIPT: per service index (exit code or None, output tail). Lines that
    do not parse are ignored: the answer comes from inside the node."""
    out: dict[int, tuple[int | None, str]] = {}
    for line in text.splitlines():
        parts = line.split(" ")
        if len(parts) != 3 or not parts[0].isdigit() or int(parts[0]) >= len(services):
            continue
        rc = int(parts[1]) if parts[1].isdigit() and len(parts[1]) <= 6 else None
        try:
            output = "" if parts[2] == "-" else base64.b64decode(parts[2], validate=True).decode(errors="replace")
        except (binascii.Error, ValueError):
            output = ""
        out[int(parts[0])] = (rc, output[-OUTPUT_TAIL:])
    return out


class NodeServices:
    """The execute services of one node: started and read through its container; the host keeps only the
    pid of the lxc-attach that runs them and the last results it read (both in the container's root-only
    directory)."""

    def __init__(self, container: NodeContainer):
        self.container = container
        self.pid_file = container.dir / "services.pid"
        self.state_file = container.dir / "services.json"

    def start(self, services: list[Service], user: Account | None) -> None:
        """Run `services` afresh (results of an earlier boot are dropped)."""
        self.stop()
        self.state_file.unlink(missing_ok=True)
        if not services:
            return
        pairs = [x for s in services for x in (SHELLS[s.shell], s.command)]
        proc = self.container.spawn(["/usr/bin/env", f"SERVICES={SERVICES_SCRIPT}", "/bin/sh", "-c", _AS_USER, MARKER,
                                     IN_NODE_DIR, user.name if user else "nobody", *pairs],
                                    self.pid_file, self.container.dir / "services.log")
        # until the child is lxc-attach (its command line names the runner), a Status would find no runner and
        # no exit codes, and take the services for interrupted
        deadline = time.monotonic() + 5
        while proc.poll() is None and not self.running() and time.monotonic() < deadline:
            time.sleep(0.005)
        self._save({"started": True, "results": None})

    def _save(self, state: dict) -> None:
        """By rename: a Status reading it at the same moment sees the old state or the new, never half."""
        write_atomic(self.state_file, json.dumps(state))

    def running(self) -> bool:
        return _alive(self.pid_file, MARKER) is not None

    def stop(self) -> None:
        _kill(self.pid_file, MARKER)

    def results(self, services: list[Service]) -> list[dict]:
        """Per service: shell, command, state (not started | waiting | running | exited | interrupted), exit
        code, output. Read inside the node while it runs; once all ended, the last answer is kept."""
        try:
            state = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            state = {"started": False, "results": None}
        if state.get("results") is not None and len(state["results"]) == len(services):
            return state["results"]
        alive = self.running()
        found: dict[int, tuple[int | None, str]] = {}
        if state.get("started") and self.container.running():
            rc, out = self.container.attach(["/bin/sh", "-c", RESULTS_SCRIPT, "sx", IN_NODE_DIR, str(len(services)),
                                             str(OUTPUT_TAIL * 4)], timeout=5, limit=RESULTS_LIMIT)
            if rc == 0:
                found = parse_results(out.decode(errors="replace"), services)
        results = []
        current = True
        for n, s in enumerate(services):
            code, output = found.get(n, (None, ""))
            r: dict = {"shell": s.shell, "command": s.command, "exit_code": code, "output": output}
            if code is not None:
                r["state"] = "exited"
            elif not state.get("started"):
                r["state"] = "not started"
            elif alive:
                r["state"] = "running" if current else "waiting"
                current = False
            else:
                r["state"] = "interrupted"
            results.append(r)
        if state.get("started") and not alive and all(r["state"] in ("exited", "interrupted") for r in results):
            self._save({"started": True, "results": results})
        return results


def verdict(results: list[dict]) -> tuple[str, str]:
    """("running" | "failed" | "done", why) over a node's service results."""
    for n, r in enumerate(results):
        if r["state"] == "interrupted":
            return "failed", f"execute service {n + 1} (`{r['command']}`) was interrupted before it finished"
        if r["state"] == "exited" and r["exit_code"] != 0:
            last = (r["output"].strip().splitlines() or [""])[-1][:200]
            return "failed", (f"execute service {n + 1} (`{r['command']}`) exited with {r['exit_code']}"
                              + (f": {last}" if last else ""))
    if any(r["state"] in ("running", "waiting", "not started") for r in results):
        return "running", ""
    return "done", ""

