"""Programming the bridge's OpenFlow rules: the os-ken controller process (authority/substrate/osken_app.py), or
`ovs-ofctl`, as the operator chooses (slicex.yaml `netns: {controller: os-ken | ovs-ofctl}`, default os-ken). A
host where the chosen one cannot run is refused with the reason; nothing falls back by itself, so the rules'
path is always the one the operator asked for. Both take the whole rule set of a bridge
(authority/substrate/flows.py) and return once the switch holds it, so a sliver reported ready really forwards."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from authority.substrate.flows import COOKIE, Flow
from authority.substrate.ovs import OvsSwitch
from slicex.errors import BadArgs, ServerError, Unsupported

CONTROLLERS = ("os-ken", "ovs-ofctl")
DEFAULT_CONTROLLER = "os-ken"


class FlowProgrammer(Protocol):
    name: str

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def controller_target(self) -> str | None:
        """What the bridge's `set-controller` points at (None: no controller, rules pushed directly)."""

    def apply(self, bridge: str, dpid: int, flows: Sequence[Flow]) -> None:
        """Bring the bridge to exactly these rules (this programmer's cookie); return once it holds them."""


def osken_available() -> str | None:
    """None if os-ken imports here, else why not."""
    try:
        import os_ken.base.app_manager  # noqa: F401
        import os_ken.ofproto.ofproto_v1_3  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any failure means: os-ken cannot run here
        return f"{type(exc).__name__}: {exc}"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class OsKenController:
    """The os-ken application as a child process of its own (it survives this process only until its
    deployment stops it; a restarted deployment adopts it by its pid file)."""

    name = "os-ken"

    def __init__(self, run_dir: Path, timeout: float = 30.0):
        self.run_dir = Path(run_dir)
        self.state = self.run_dir / "flows-state.json"
        self.ack = self.run_dir / "flows-ack.json"
        self.pid_file = self.run_dir / "osken.pid"
        self.port_file = self.run_dir / "osken.port"
        self.timeout = timeout
        self._generation = 0

    def _pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text())
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            return None
        return pid if b"authority.substrate.osken_app" in cmd and str(self.state).encode() in cmd else None

    def start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if self.state.exists():
            self._generation = int(json.loads(self.state.read_text()).get("generation", 0))
        if self._pid() is not None and self.port_file.exists():
            return
        for _attempt in range(3):
            port = _free_port()
            log = open(self.run_dir / "osken.log", "ab")
            proc = subprocess.Popen([sys.executable, "-m", "authority.substrate.osken_app", "--state", str(self.state),
                                     "--ack", str(self.ack), "--listen", f"127.0.0.1:{port}"],
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                    cwd=str(Path(__file__).resolve().parents[2]))
            log.close()
            deadline = time.monotonic() + self.timeout
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                    break
                except OSError:
                    time.sleep(0.1)
            if proc.poll() is None:
                self.pid_file.write_text(str(proc.pid))
                self.port_file.write_text(str(port))
                return
        raise ServerError(f"the os-ken controller did not start; see {self.run_dir / 'osken.log'}")

    def stop(self) -> None:
        pid = self._pid()
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and self._pid() == pid:
                try:
                    if os.waitpid(pid, os.WNOHANG)[0] == pid:
                        break
                except ChildProcessError:
                    pass
                time.sleep(0.05)
            if self._pid() == pid:
                os.kill(pid, signal.SIGKILL)
        self.pid_file.unlink(missing_ok=True)
        self.port_file.unlink(missing_ok=True)

    def controller_target(self) -> str | None:
        return f"tcp:127.0.0.1:{self.port_file.read_text().strip()}"

    def apply(self, bridge: str, dpid: int, flows: Sequence[Flow]) -> None:
        state = json.loads(self.state.read_text()) if self.state.exists() else {"bridges": {}}
        self._generation = max(self._generation, int(state.get("generation", 0))) + 1
        state["generation"] = self._generation
        state["bridges"][str(dpid)] = [f.to_doc() for f in flows]
        fd, tmp = tempfile.mkstemp(dir=self.run_dir, prefix=".state")
        with os.fdopen(fd, "w") as f:
            json.dump(state, f)
        os.replace(tmp, self.state)
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            try:
                if int(json.loads(self.ack.read_text()).get(str(dpid), 0)) >= self._generation:
                    return
            except (OSError, ValueError):
                pass
            time.sleep(0.02)
        why = "the controller is not running" if self._pid() is None else "the switch is not connected to it"
        raise ServerError(f"the OpenFlow controller (os-ken) did not confirm the rules of bridge {bridge} within "
                          f"{self.timeout:.0f} s ({why}); see {self.run_dir / 'osken.log'}")


class OfctlProgrammer:
    """Rules pushed with `ovs-ofctl replace-flows` (only the differences are sent), for operators who choose no
    controller process (or hosts without os-ken). The bridge then has no controller."""

    name = "ovs-ofctl"

    def __init__(self, ovs: OvsSwitch):
        self.ovs = ovs

    def start(self) -> None:
        return None

    def stop(self) -> None:
        return None

    def controller_target(self) -> str | None:
        return None

    def apply(self, bridge: str, dpid: int, flows: Sequence[Flow]) -> None:
        with tempfile.NamedTemporaryFile("w", dir=self.ovs.run_dir, suffix=".flows", delete=False) as f:
            f.write("\n".join(fl.to_ofctl() for fl in flows) + "\n")
        try:
            self.ovs.ofctl("replace-flows", bridge, f.name)
        finally:
            os.unlink(f.name)
        # the datapath keeps forwarding on flows it cached from removed rules until its revalidator runs; a
        # stopped link must stop at once (a ping right after geni_stop went through, now and then)
        self.ovs.appctl("revalidator/purge")


def flow_programmer(controller: str, run_dir: Path, ovs: OvsSwitch, timeout: float) -> FlowProgrammer:
    """The programmer the operator chose; an unknown name or an os-ken that cannot be imported is refused here
    (at construction, before anything on the host changes), never replaced by the other one."""
    if controller not in CONTROLLERS:
        raise BadArgs(f"netns controller {controller!r}: one of {', '.join(CONTROLLERS)}")
    if controller == "ovs-ofctl":
        return OfctlProgrammer(ovs)
    why = osken_available()
    if why:
        raise Unsupported(f"the os-ken controller cannot be imported here ({why}); pip install os-ken, or choose "
                          f"`netns: {{controller: ovs-ofctl}}` in slicex.yaml")
    return OsKenController(run_dir, timeout)


def cookie_flows(ovs: OvsSwitch, bridge: str) -> list[str]:
    """The rules of this programmer's cookie on a bridge, as ovs-ofctl prints them (tests, operators)."""
    out = ovs.ofctl("dump-flows", bridge, f"cookie={COOKIE:#x}/-1")
    return [line.strip() for line in out.splitlines() if "cookie=" in line]
