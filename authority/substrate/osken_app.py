"""The netns substrate's OpenFlow controller: an os-ken application, run as a process of its own
(`python -m authority.substrate.osken_app --state F --ack A --listen SOCKET`).

The driver declares the rules it wants for each bridge in a JSON state file ({generation, bridges: {dpid:
[flow docs]}}, written atomically); this app brings every connected switch to that state with the smallest
change (add the new rules, strictly delete the gone ones, never a flush that would drop other slices'
traffic), follows with a barrier, and on the barrier's reply records the generation the switch holds in the
ack file, which the driver waits for. A switch that (re)connects is cleared of this app's rules (by cookie)
and given the whole state: a controller restart or a switch restart converges by itself."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from authority.substrate.flows import COOKIE, Flow

log = logging.getLogger("slicex.osken")


def _make_app_class(state_path: Path, ack_path: Path):
    from os_ken.base import app_manager
    from os_ken.controller import ofp_event
    from os_ken.controller.handler import CONFIG_DISPATCHER, DEAD_DISPATCHER, MAIN_DISPATCHER, set_ev_cls
    from os_ken.lib import hub
    from os_ken.ofproto import ofproto_v1_3

    class SlicexFlows(app_manager.OSKenApp):
        OFP_VERSIONS = [ofproto_v1_3.OFP_VERSION]

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.dps: dict[int, object] = {}
            self.installed: dict[int, set[Flow]] = {}
            self.pending: dict[tuple[int, int], int] = {}  # (dpid, barrier xid) -> generation
            self.acked: dict[str, int] = {}
            self.dirty = True
            self.mtime = 0.0
            hub.spawn(self._watch)

        # ---- switch events ---------------------------------------------------------------------------------
        @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
        def _features(self, ev):
            dp = ev.msg.datapath
            parser, ofp = dp.ofproto_parser, dp.ofproto
            dp.send_msg(parser.OFPFlowMod(dp, cookie=COOKIE, cookie_mask=0xFFFFFFFFFFFFFFFF, table_id=ofp.OFPTT_ALL,
                                          command=ofp.OFPFC_DELETE, out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY))
            self.dps[dp.id] = dp
            self.installed[dp.id] = set()
            self.dirty = True
            log.info("switch %016x connected", dp.id)

        @set_ev_cls(ofp_event.EventOFPStateChange, [DEAD_DISPATCHER])
        def _gone(self, ev):
            dp = ev.datapath
            if dp.id is not None and self.dps.get(dp.id) is dp:
                del self.dps[dp.id]
                self.installed.pop(dp.id, None)
                log.info("switch %016x disconnected", dp.id)

        @set_ev_cls(ofp_event.EventOFPBarrierReply, MAIN_DISPATCHER)
        def _barrier(self, ev):
            dp = ev.msg.datapath
            gen = self.pending.pop((dp.id, ev.msg.xid), None)
            if gen is not None:
                self.acked[str(dp.id)] = gen
                tmp = ack_path.with_suffix(".tmp")
                tmp.write_text(json.dumps(self.acked))
                os.replace(tmp, ack_path)

        @set_ev_cls(ofp_event.EventOFPErrorMsg, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
        def _error(self, ev):
            log.error("switch %016x refused a message: type=%s code=%s", ev.msg.datapath.id, ev.msg.type,
                      ev.msg.code)

        # ---- the state file --------------------------------------------------------------------------------
        def _watch(self):
            while True:
                hub.sleep(0.05)
                try:
                    mtime = state_path.stat().st_mtime
                except FileNotFoundError:
                    continue
                if mtime == self.mtime and not self.dirty:
                    continue
                try:
                    state = json.loads(state_path.read_text())
                except (OSError, ValueError):
                    continue  # being replaced: next turn
                self.mtime, self.dirty = mtime, False
                for dpid_s, docs in state.get("bridges", {}).items():
                    dp = self.dps.get(int(dpid_s))
                    if dp is not None:
                        self._converge(dp, {Flow.from_doc(d) for d in docs}, int(state.get("generation", 0)))

        def _converge(self, dp, want: set[Flow], generation: int) -> None:
            have = self.installed.setdefault(dp.id, set())
            for f in sorted(have - want, key=lambda f: -f.priority):
                dp.send_msg(self._mod(dp, f, delete=True))
            for f in sorted(want - have, key=lambda f: f.priority):
                dp.send_msg(self._mod(dp, f, delete=False))
            self.installed[dp.id] = set(want)
            barrier = dp.ofproto_parser.OFPBarrierRequest(dp)
            dp.send_msg(barrier)
            self.pending[(dp.id, barrier.xid)] = generation

        @staticmethod
        def _mod(dp, f: Flow, delete: bool):
            parser, ofp = dp.ofproto_parser, dp.ofproto
            fields = {}
            for k, v in f.match:
                fields[k] = tuple(v) if isinstance(v, (list, tuple)) else v
            match = parser.OFPMatch(**fields)
            if delete:
                return parser.OFPFlowMod(dp, cookie=COOKIE, cookie_mask=0xFFFFFFFFFFFFFFFF, table_id=f.table,
                                         command=ofp.OFPFC_DELETE_STRICT, priority=f.priority, match=match,
                                         out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY)
            actions = []
            for a, v in f.actions:
                if a == "output":
                    actions.append(parser.OFPActionOutput(int(v)))
                elif a == "push_vlan":
                    actions.append(parser.OFPActionPushVlan(int(v)))
                elif a == "set_vlan_vid":
                    actions.append(parser.OFPActionSetField(vlan_vid=ofp.OFPVID_PRESENT | int(v)))
                elif a == "pop_vlan":
                    actions.append(parser.OFPActionPopVlan())
            inst = [parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, actions)] if actions else []
            if f.goto is not None:
                inst.append(parser.OFPInstructionGotoTable(f.goto))
            return parser.OFPFlowMod(dp, cookie=COOKIE, table_id=f.table, command=ofp.OFPFC_ADD,
                                     priority=f.priority, match=match, instructions=inst)

    return SlicexFlows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--state", required=True, help="JSON file of the rules wanted (written by the driver)")
    p.add_argument("--ack", required=True, help="JSON file this app writes: generation applied per switch")
    p.add_argument("--listen", required=True,
                   help="where to accept OpenFlow connections: a Unix socket path (the switch connects to "
                        "unix:PATH), or HOST:PORT for TCP")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    from os_ken import cfg
    from os_ken.base import app_manager

    # os-ken's server takes a host whose directory exists as a Unix socket path (the port is then unused)
    host, port = (args.listen, "6653") if "/" in args.listen else args.listen.rsplit(":", 1)
    if "/" in host:
        Path(host).unlink(missing_ok=True)
    cfg.CONF(args=["--ofp-listen-host", host, "--ofp-tcp-listen-port", port], project="os_ken")
    app_cls = _make_app_class(Path(args.state), Path(args.ack))
    manager = app_manager.AppManager.get_instance()
    load = manager.load_app
    manager.load_app = lambda name: app_cls if name == "slicex_flows" else load(name)  # type: ignore[method-assign]
    manager.load_apps(["slicex_flows"])  # and the services it depends on (the OpenFlow handler)
    services = manager.instantiate_apps(**manager.create_contexts())
    from os_ken.lib import hub

    try:
        hub.joinall(services)
    finally:
        manager.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
