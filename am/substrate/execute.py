"""Post-boot `execute` services of netns nodes (rspec `<services><execute shell= command=/>`).

At every geni_start (and geni_restart) the node's services run one after the other inside its namespace, in
its own UTS namespace (so `hostname` is the node's), as the node's first slice user (else `nobody`), never as
root: a namespace shares the host's kernel and file system. Each one's output goes to
`<base>/<ns>/exec/<n>.out` and its exit code to `<n>.rc`; the node is geni_configuring while they run,
geni_ready once all exited 0, and geni_failed naming the first that did not (or that was interrupted).
The manifest shows each service's state, exit code and the tail of its output."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from am.substrate.login import NODE_GID, Account, _alive, _kill
from slicex.errors import BadArgs

SHELLS = {"sh": "/bin/sh", "bash": "/bin/bash", "/bin/sh": "/bin/sh", "/bin/bash": "/bin/bash",
          "/usr/bin/bash": "/usr/bin/bash"}
OUTPUT_TAIL = 4000  # characters of output the manifest shows per service
NOBODY = 65534


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


def runner_script(services: list[Service], d: Path) -> str:
    """A shell script running each service in turn, recording output and exit code; pure."""
    lines = ["#!/bin/sh", 'cd "$HOME" || cd /']
    for n, s in enumerate(services):
        cmd, out, rc = (shlex.quote(os.fspath(d / f"{n}.{ext}")) for ext in ("cmd", "out", "rc"))
        lines.append(f'{SHELLS[s.shell]} -c "$(cat {cmd})" </dev/null >{out} 2>&1; echo $? >{rc}.tmp; '
                     f"mv {rc}.tmp {rc}")
    return "\n".join(lines) + "\n"


class NodeServices:
    """The execute services of one node, in `<base>/<netns>/exec/`."""

    def __init__(self, base: Path, netns: str, hostname: str):
        self.node_dir = base / netns
        self.dir = self.node_dir / "exec"
        self.netns = netns
        self.hostname = hostname

    def start(self, services: list[Service], user: Account | None) -> None:
        """Run `services` afresh (results of an earlier boot are dropped)."""
        self.stop()
        if not services:
            return
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        uid, name = (user.uid, user.name) if user else (NOBODY, "nobody")
        home = self.node_dir / "home" / name if user else self.dir
        for n, s in enumerate(services):
            (self.dir / f"{n}.cmd").write_text(s.command)
        (self.dir / "run.sh").write_text(runner_script(services, self.dir))
        (self.dir / "services").write_text("\n".join(f"{s.shell}\t{s.command!r}" for s in services))
        for p in [self.dir, *self.dir.iterdir()]:
            os.chown(p, uid, NODE_GID)
        env = ["env", "-i", f"HOME={home}", f"USER={name}", f"LOGNAME={name}", "PATH=/usr/local/bin:/usr/bin:/bin",
               "LANG=C.UTF-8"]
        as_user = ["setpriv", f"--reuid={uid}", f"--regid={NODE_GID}", "--clear-groups", "--inh-caps=-all"]
        script = 'hostname "$1" && shift && exec "$@"'
        proc = subprocess.Popen(["ip", "netns", "exec", self.netns, "unshare", "--uts", "sh", "-c", script, "sx",
                                 self.hostname, *as_user, *env, "/bin/sh", str(self.dir / "run.sh")],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=open(self.node_dir / "exec.log", "ab"), start_new_session=True)
        (self.node_dir / "exec.pid").write_text(f"{proc.pid}\n")

    def running(self) -> bool:
        return _alive(self.node_dir / "exec.pid", str(self.dir / "run.sh")) is not None

    def stop(self) -> None:
        _kill(self.node_dir / "exec.pid", str(self.dir / "run.sh"))

    def results(self, services: list[Service]) -> list[dict]:
        """Per service: shell, command, state (waiting | running | exited | interrupted), exit code, output."""
        out = []
        alive = self.running()
        started = self.dir.exists()
        current = True
        for n, s in enumerate(services):
            rc_file, out_file = self.dir / f"{n}.rc", self.dir / f"{n}.out"
            r: dict = {"shell": s.shell, "command": s.command, "exit_code": None, "output": ""}
            if out_file.exists():
                text = out_file.read_text(errors="replace")
                r["output"] = text[-OUTPUT_TAIL:]
            if rc_file.exists():
                try:
                    r["exit_code"] = int(rc_file.read_text().strip())
                    r["state"] = "exited"
                except ValueError:
                    r["state"] = "interrupted"
            elif not started:
                r["state"] = "not started"
            elif alive:
                r["state"] = "running" if current else "waiting"
                current = False
            else:
                r["state"] = "interrupted"
            out.append(r)
        return out


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
