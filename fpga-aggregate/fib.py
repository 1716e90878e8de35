"""The shared forwarding table: one two-bank SRAM image serving several virtual routers (DESIGN §8).

Layout (DIR-24-8-BASIC adapted to 19+13 bits):
  L1 bank  2^19 entries × 36 bits, indexed by the top 19 address bits:
           flag(1) | port(3) | next hop(32); flag=1 means the 32-bit field is the index of an L2 set.
  L2 bank  sets of 2^13 entries (port(3) | next hop(32)), indexed by the low 13 bits, for locations where
           a router has prefixes longer than /19.
  CAM      (VID, L1 location) → indirect L1 index: when a second router needs an L1 location another router
           already holds, its entry is relocated first-fit to a location nobody uses and the CAM redirects.
  Owner    a 3-bit tag per L1 location (on-chip block RAM: 2^19 × 3 bits) naming the router that holds it
           directly, or INDIRECT for relocation targets. DESIGN §8 leaves open what a router without a route
           at a location another router holds gets; with the tag it gets "no route", so lookups are exact LPM.
Port value 7 marks "no route" inside an L2 set. Inserts and deletes are incremental: only the L1 locations
a prefix covers are recomputed."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

L1_BITS = 19
L2_BITS = 13
L1_SIZE = 1 << L1_BITS
L2_SET = 1 << L2_BITS
NO_ROUTE = 7
FREE = 0
INDIRECT = 7  # owner tag of relocation targets (VIDs 0..5 are stored as 1..6)
MAX_ROUTERS = 6


class TableFull(Exception):
    """The SRAM image or the CAM has no room for what was asked."""


@dataclass(frozen=True)
class Route:
    port: int
    next_hop: int


def _prefix_key(prefix: int, length: int) -> int:
    return prefix >> (32 - length) << (32 - length) if length else 0


class SharedFib:
    def __init__(self, routers: int = 4, l2_sets: int = 64, cam_entries: int = 65536):
        if not 1 <= routers <= MAX_ROUTERS:
            raise ValueError(f"the 3-bit owner tag supports 1-{MAX_ROUTERS} routers, not {routers}")
        self.routers = routers
        self.l2_capacity = l2_sets
        self.cam_capacity = cam_entries
        self.l1_flag = np.zeros(L1_SIZE, dtype=bool)
        self.l1_port = np.zeros(L1_SIZE, dtype=np.uint8)
        self.l1_nh = np.zeros(L1_SIZE, dtype=np.uint32)
        self.owner = np.zeros(L1_SIZE, dtype=np.uint8)
        # the L2 bank, allocated lazily by the OS (np.empty); a set is initialised when first used
        self.l2_port = np.empty((l2_sets, L2_SET), dtype=np.uint8)
        self.l2_nh = np.empty((l2_sets, L2_SET), dtype=np.uint32)
        self.l2_len = np.empty((l2_sets, L2_SET), dtype=np.int8)  # software mirror: length of the prefix used
        self.l2_next = 0
        self.l2_free: list[int] = []
        self.cam: dict[tuple[int, int], int] = {}
        self.cam_by_slot: dict[int, tuple[int, int]] = {}  # indirect slot → (vid, home location)
        self.cam_mirror = np.full((routers, L1_SIZE), -1, dtype=np.int32)  # software mirror for vector lookups
        # per router: the best prefix of length <= 19 at each location, and the long prefixes per location
        self.short_len = np.full((routers, L1_SIZE), -1, dtype=np.int8)
        self.short_port = np.zeros((routers, L1_SIZE), dtype=np.uint8)
        self.short_nh = np.zeros((routers, L1_SIZE), dtype=np.uint32)
        self.long: list[dict[int, dict[tuple[int, int], Route]]] = [defaultdict(dict) for _ in range(routers)]
        self.has_long = np.zeros((routers, L1_SIZE), dtype=bool)
        self.routes: list[dict[tuple[int, int], Route]] = [{} for _ in range(routers)]
        self.slot_of: list[dict[int, int]] = [{} for _ in range(routers)]  # location → slot holding it
        self.l2_of_slot: dict[int, int] = {}
        self._free_cursor = 0

    # ---- public API -----------------------------------------------------------------------------------------
    def insert(self, vid: int, prefix: int, length: int, port: int, next_hop: int) -> None:
        self._check(vid, length, port)
        key = (_prefix_key(prefix, length), length)
        route = Route(port, next_hop)
        self.routes[vid][key] = route
        lo, hi = self._span(*key)
        if length <= L1_BITS:
            seg = self.short_len[vid, lo:hi]
            better = seg <= length
            self.short_len[vid, lo:hi][better] = length
            self.short_port[vid, lo:hi][better] = port
            self.short_nh[vid, lo:hi][better] = next_hop
        else:
            self.long[vid][lo][key] = route
            self.has_long[vid, lo] = True
            s = self._l2_set_of(vid, lo)
            if s is not None:  # incremental: only the entries this prefix now wins
                a, b = self._l2_span(*key)
                win = self.l2_len[s, a:b] <= length
                self.l2_port[s, a:b][win] = port
                self.l2_nh[s, a:b][win] = next_hop
                self.l2_len[s, a:b][win] = length
                return
        self._refresh(vid, lo, hi)

    def delete(self, vid: int, prefix: int, length: int) -> bool:
        self._check(vid, length, 0)
        key = (_prefix_key(prefix, length), length)
        if self.routes[vid].pop(key, None) is None:
            return False
        lo, hi = self._span(*key)
        if length <= L1_BITS:
            ancestor = self._ancestor(vid, key[0], length)
            seg = self.short_len[vid, lo:hi] == length
            if ancestor is None:
                self.short_len[vid, lo:hi][seg] = -1
            else:
                (alen, aroute) = ancestor
                self.short_len[vid, lo:hi][seg] = alen
                self.short_port[vid, lo:hi][seg] = aroute.port
                self.short_nh[vid, lo:hi][seg] = aroute.next_hop
        else:
            self.long[vid][lo].pop(key, None)
            if not self.long[vid][lo]:
                del self.long[vid][lo]
                self.has_long[vid, lo] = False
            else:
                s = self._l2_set_of(vid, lo)
                if s is not None:  # incremental: entries it won fall back to its longest remaining ancestor
                    a, b = self._l2_span(*key)
                    lost = self.l2_len[s, a:b] == length
                    alen, aport, anh = self._long_ancestor(vid, lo, key[0], length)
                    self.l2_port[s, a:b][lost] = aport
                    self.l2_nh[s, a:b][lost] = anh
                    self.l2_len[s, a:b][lost] = alen
                    return True
        self._refresh(vid, lo, hi)
        return True

    def lookup(self, vid: int, address: int) -> Route | None:
        loc = address >> L2_BITS
        slot = self.cam.get((vid, loc))
        if slot is None:
            if self.owner[loc] != vid + 1:
                return None
            slot = loc
        if self.l1_flag[slot]:
            s = int(self.l1_nh[slot])
            port = int(self.l2_port[s, address & (L2_SET - 1)])
            return None if port == NO_ROUTE else Route(port, int(self.l2_nh[s, address & (L2_SET - 1)]))
        return Route(int(self.l1_port[slot]), int(self.l1_nh[slot]))

    def lookup_many(self, vid: int, addresses: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(port, next hop) per address; port NO_ROUTE where there is no route. Vectorised over the image."""
        addr = addresses.astype(np.uint32)
        loc = (addr >> L2_BITS).astype(np.int64)
        cam = self.cam_mirror[vid, loc]
        direct = self.owner[loc] == vid + 1
        slot = np.where(cam >= 0, cam, loc)
        hit = (cam >= 0) | direct
        port = np.full(addr.shape, NO_ROUTE, dtype=np.uint8)
        nh = np.zeros(addr.shape, dtype=np.uint32)
        flag = self.l1_flag[slot] & hit
        leaf = hit & ~flag
        port[leaf] = self.l1_port[slot[leaf]]
        nh[leaf] = self.l1_nh[slot[leaf]]
        if flag.any():
            sets = self.l1_nh[slot[flag]].astype(np.int64)
            low = (addr[flag] & (L2_SET - 1)).astype(np.int64)
            port[flag] = self.l2_port[sets, low]
            nh[flag] = self.l2_nh[sets, low]
        return port, nh

    # ---- reporting and export --------------------------------------------------------------------------------
    def cam_entry_bits(self) -> int:
        vid_bits = max(1, (self.routers - 1).bit_length())
        return vid_bits + L1_BITS + L1_BITS

    def stats(self) -> dict[str, float]:
        shared = 0
        total = 0
        needed = (self.short_len >= 0) | self.has_long
        count = needed.sum(axis=0)
        for v in range(self.routers):
            others = count - needed[v]
            for (p, length) in self.routes[v]:
                lo, hi = self._span(p, length)
                total += 1
                if others[lo:hi].any():
                    shared += 1
        return {"prefixes": total, "overlap_pct": 100.0 * shared / total if total else 0.0,
                "cam_entries": len(self.cam), "cam_entry_bits": self.cam_entry_bits(),
                "cam_bits": len(self.cam) * self.cam_entry_bits(), "l2_sets_used": len(self.l2_of_slot),
                "l1_used": int(np.count_nonzero(self.owner))}

    def export(self, directory: str | Path) -> dict[str, str]:
        """Write the banks and the CAM as files a hardware loader could write to the board."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        l1 = (self.l1_flag.astype(np.uint64) << 35) | (self.l1_port.astype(np.uint64) << 32) | self.l1_nh
        used = self.l2_next
        l2 = (self.l2_port[:used].astype(np.uint64) << 32) | self.l2_nh[:used]
        l1.astype("<u8").tofile(d / "sram_l1.bin")
        l2.astype("<u8").tofile(d / "sram_l2.bin")
        self.owner.tofile(d / "owner_tags.bin")
        cam = np.array([(v, loc, slot) for (v, loc), slot in sorted(self.cam.items())], dtype="<u4").reshape(-1, 3)
        cam.tofile(d / "conflict_cam.bin")
        description = {"format": "slicex shared FIB v1", "l1_entries": L1_SIZE, "l1_entry": "flag<<35|port<<32|nh",
                       "l2_set_entries": L2_SET, "l2_sets": used, "l2_entry": "port<<32|nh (port 7 = no route)",
                       "word": "little-endian uint64 per 36-bit entry", "owner_tags": "uint8: 0 free, vid+1, 7 indirect",
                       "cam": "uint32 triples (vid, l1 location, indirect index)", "cam_entries": len(self.cam),
                       "routers": self.routers}
        (d / "fib.json").write_text(json.dumps(description, indent=1))
        return {k: str(d / k) for k in ("sram_l1.bin", "sram_l2.bin", "owner_tags.bin", "conflict_cam.bin", "fib.json")}

    # ---- internals --------------------------------------------------------------------------------------------
    def _check(self, vid: int, length: int, port: int) -> None:
        if not 0 <= vid < self.routers:
            raise ValueError(f"virtual router {vid} does not exist (0-{self.routers - 1})")
        if not 0 <= length <= 32:
            raise ValueError(f"prefix length {length} is not 0-32")
        if not 0 <= port < NO_ROUTE:
            raise ValueError(f"port {port} does not fit the 3-bit port field (0-6; 7 means no route)")

    @staticmethod
    def _span(prefix: int, length: int) -> tuple[int, int]:
        lo = prefix >> L2_BITS
        if length >= L1_BITS:
            return lo, lo + 1
        return lo, lo + (1 << (L1_BITS - length))

    @staticmethod
    def _l2_span(prefix: int, length: int) -> tuple[int, int]:
        a = prefix & (L2_SET - 1)
        return a, a + (1 << (32 - length))

    def _l2_set_of(self, vid: int, loc: int) -> int | None:
        slot = self.slot_of[vid].get(loc)
        if slot is None or not self.l1_flag[slot]:
            return None
        return self.l2_of_slot.get(slot)

    def _long_ancestor(self, vid: int, loc: int, prefix: int, length: int) -> tuple[int, int, int]:
        """(length, port, next hop) of the longest route covering `prefix` shorter than `length`."""
        for alen in range(length - 1, L1_BITS, -1):
            r = self.long[vid][loc].get((_prefix_key(prefix, alen), alen))
            if r is not None:
                return alen, r.port, r.next_hop
        base = int(self.short_len[vid, loc])
        if base < 0:
            return -1, NO_ROUTE, 0
        return base, int(self.short_port[vid, loc]), int(self.short_nh[vid, loc])

    def _ancestor(self, vid: int, prefix: int, length: int) -> tuple[int, Route] | None:
        for alen in range(length - 1, -1, -1):
            r = self.routes[vid].get((_prefix_key(prefix, alen), alen))
            if r is not None:
                return alen, r
        return None

    def _refresh(self, vid: int, lo: int, hi: int) -> None:
        """Rewrite router `vid`'s entries for L1 locations lo..hi-1 from its routes."""
        has_short = self.short_len[vid, lo:hi] >= 0
        owners = self.owner[lo:hi]
        simple = ~self.has_long[vid, lo:hi] & (self.cam_mirror[vid, lo:hi] < 0)
        fast = simple & has_short & ((owners == FREE) | (owners == vid + 1))
        idx = np.nonzero(fast)[0] + lo
        if len(idx):
            self._release_l2(vid, idx)
            self.owner[idx] = vid + 1
            self.l1_flag[idx] = False
            self.l1_port[idx] = self.short_port[vid, idx]
            self.l1_nh[idx] = self.short_nh[vid, idx]
            for i in idx.tolist():
                self.slot_of[vid][i] = i
        for k in np.nonzero(~fast)[0].tolist():
            self._place(vid, lo + k)

    def _release_l2(self, vid: int, slots: np.ndarray) -> None:
        flagged = slots[self.l1_flag[slots] & (self.owner[slots] == vid + 1)]
        for s in flagged.tolist():
            self._free_l2(s)

    def _free_l2(self, slot: int) -> None:
        s = self.l2_of_slot.pop(slot, None)
        if s is not None:
            self.l2_port[s] = NO_ROUTE
            self.l2_free.append(s)

    def _content(self, vid: int, loc: int) -> tuple | None:
        """What router `vid` needs at `loc`: (is_l2, port, nh, l2 ports, l2 next hops), or None."""
        long = self.long[vid].get(loc)
        base_len = int(self.short_len[vid, loc])
        if not long:
            if base_len < 0:
                return None
            return False, int(self.short_port[vid, loc]), int(self.short_nh[vid, loc]), None, None
        ports = np.full(L2_SET, NO_ROUTE, dtype=np.uint8)
        nhs = np.zeros(L2_SET, dtype=np.uint32)
        lens = np.full(L2_SET, base_len, dtype=np.int8)
        if base_len >= 0:
            ports[:] = self.short_port[vid, loc]
            nhs[:] = self.short_nh[vid, loc]
        for (p, length), r in sorted(long.items(), key=lambda kv: kv[0][1]):
            a, b = self._l2_span(p, length)
            ports[a:b] = r.port
            nhs[a:b] = r.next_hop
            lens[a:b] = length
        return True, 0, 0, ports, (nhs, lens)

    def _place(self, vid: int, loc: int) -> None:
        content = self._content(vid, loc)
        current = self.slot_of[vid].get(loc)
        if content is None:
            if current is not None:
                self._vacate(vid, loc, current)
            return
        if current is None:
            if self.owner[loc] == FREE:
                current = loc
            elif self.owner[loc] == INDIRECT:
                self._evict_indirect(loc)
                current = loc
            else:
                current = self._relocate(vid, loc)
            self.owner[current] = vid + 1 if current == loc else INDIRECT
            self.slot_of[vid][loc] = current
        self._write(current, content)

    def _write(self, slot: int, content) -> None:
        is_l2, port, nh, ports, nhs = content
        if not is_l2:
            self._free_l2(slot)
            self.l1_flag[slot] = False
            self.l1_port[slot] = port
            self.l1_nh[slot] = nh
            return
        s = self.l2_of_slot.get(slot)
        if s is None:
            s = self._alloc_l2()
            self.l2_of_slot[slot] = s
        self.l2_port[s] = ports
        self.l2_nh[s] = nhs[0]
        self.l2_len[s] = nhs[1]
        self.l1_flag[slot] = True
        self.l1_port[slot] = 0
        self.l1_nh[slot] = s

    def _alloc_l2(self) -> int:
        if self.l2_free:
            return self.l2_free.pop()
        if self.l2_next >= self.l2_capacity:
            raise TableFull(f"L2 bank full: all {self.l2_capacity} sets of {L2_SET} entries hold prefixes longer "
                            f"than /{L1_BITS}")
        self.l2_next += 1
        return self.l2_next - 1

    def _free_slot(self) -> int:
        """First free L1 location at or after the cursor (first-fit, wrapping), scanning in windows."""
        window = 8192
        for k in range(0, L1_SIZE + window, window):
            base = (self._free_cursor + k) % L1_SIZE
            free = np.flatnonzero(self.owner[base:base + window] == FREE)
            if len(free):
                slot = int(free[0]) + base
                self._free_cursor = slot
                return slot
        raise TableFull("no free L1 location left to relocate a conflicting entry to")

    def _relocate(self, vid: int, loc: int) -> int:
        if len(self.cam) >= self.cam_capacity:
            raise TableFull(f"Conflict CAM full ({self.cam_capacity} entries)")
        slot = self._free_slot()
        self.cam[(vid, loc)] = slot
        self.cam_by_slot[slot] = (vid, loc)
        self.cam_mirror[vid, loc] = slot
        return slot

    def _vacate(self, vid: int, loc: int, slot: int) -> None:
        self._free_l2(slot)
        self.owner[slot] = FREE
        self.l1_flag[slot] = False
        del self.slot_of[vid][loc]
        if self.cam.pop((vid, loc), None) is not None:
            self.cam_by_slot.pop(slot, None)
            self.cam_mirror[vid, loc] = -1
        self._free_cursor = min(self._free_cursor, slot)

    def _evict_indirect(self, loc: int) -> None:
        """Location `loc` is now needed directly: move the relocated entry living there elsewhere."""
        (vid, home) = self.cam_by_slot.pop(loc)
        new = self._free_slot_excluding(loc)
        self.owner[new] = INDIRECT
        self.l1_flag[new] = self.l1_flag[loc]
        self.l1_port[new] = self.l1_port[loc]
        self.l1_nh[new] = self.l1_nh[loc]
        if loc in self.l2_of_slot:
            self.l2_of_slot[new] = self.l2_of_slot.pop(loc)
        self.cam[(vid, home)] = new
        self.cam_by_slot[new] = (vid, home)
        self.cam_mirror[vid, home] = new
        self.slot_of[vid][home] = new
        self.owner[loc] = FREE

    def _free_slot_excluding(self, loc: int) -> int:
        self.owner[loc] = INDIRECT  # keep it out of the search
        return self._free_slot()
