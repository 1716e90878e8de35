"""The shared forwarding table: one two-bank SRAM image serving several virtual routers (DESIGN §8).

Layout (DIR-24-8-BASIC adapted to 19 + 13 bits):
  L1 bank  2^19 entries × 36 bits, indexed by the top 19 address bits (an L1 *location*):
           flag(1) | port(3) | next hop(32). flag=1: the 32-bit field is the index of an L2 set.
  L2 bank  sets of 2^13 entries (port(3) | next hop(32)), indexed by the low 13 address bits, one per L1 entry
           whose router has prefixes longer than /19 there. Port 7 means "no route" in either bank.
  CAM      the Conflict CAM: ternary entries (VID, prefix, length, indirect index). The first router to need an
           L1 location holds it directly. When another router needs it, that router's entries for the whole
           aligned range `prefix/length` (in L1 bits) are relocated, first fit, to a block of free locations
           starting at the indirect index; a lookup of that router inside the range reads
           `index + (location - prefix)`. A range is the smallest aligned block holding the router's
           conflicting locations under its outermost covering prefix, so one conflicting prefix costs one
           CAM entry however many locations it covers.
  Owner    a 3-bit tag per L1 location (on-chip block RAM, 2^19 × 3 bits): free, the router holding it
           directly (VID + 1), or 7 for relocated blocks. DESIGN §8 leaves open what a router gets at a
           location another router holds when it has no route there; the tag answers "no route", which is
           what makes every lookup an exact longest-prefix match.
  Default  a default-route register per VID (on-chip, 35 bits each) answers where the image says "no route":
           a router's /0 then costs no SRAM, where expanded it would claim every L1 location and leave no room
           for any other router.

Per router the compiler keeps its routes (the reference for deletes), the best prefix of length <= 19 at
each location and the longer prefixes per location, so inserts and deletes rewrite only the locations and
L2 sets their prefix covers. Relocation blocks are searched first-fit from 224.0.0.0 (multicast and reserved
space, routed by no unicast table), wrapping around."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

L1_BITS = 19
L2_BITS = 13
L1_SIZE = 1 << L1_BITS
L2_SET = 1 << L2_BITS
NO_ROUTE = 7
FREE = 0
INDIRECT = 7  # owner tag of relocated blocks; routers 0..5 are tagged 1..6
MAX_ROUTERS = 6
L2_SETS_PER_BANK = L1_SIZE // L2_SET  # one 18-Mbit bank of 2^19 36-bit words holds 64 sets
RELOCATION_BASE = 0xE0000000 >> L2_BITS
CAM_LENGTH_BITS = 5


class TableFull(Exception):
    """The SRAM image or the CAM has no room for what was asked."""


class Route(NamedTuple):
    port: int
    next_hop: int


@dataclass(frozen=True)
class CamEntry:
    vid: int
    prefix: int  # first L1 location of the relocated range (19 bits)
    length: int  # prefix length in L1 bits: the range covers 2^(19 - length) locations
    index: int  # indirect index: the L1 location the range was relocated to

    @property
    def size(self) -> int:
        return 1 << (L1_BITS - self.length)


def _prefix_key(prefix: int, length: int) -> int:
    return prefix >> (32 - length) << (32 - length) if length else 0


class SharedFib:
    """The compiled image plus what the compiler needs to update it incrementally.

    `l2_sets` defaults to one SRAM bank (64 sets); a larger value models a board with more L2 memory."""

    def __init__(self, routers: int = 4, l2_sets: int = L2_SETS_PER_BANK, cam_entries: int = 16384,
                 relocation_base: int = RELOCATION_BASE):
        if not 1 <= routers <= MAX_ROUTERS:
            raise ValueError(f"the 3-bit owner tag supports 1-{MAX_ROUTERS} routers, not {routers}")
        self.routers = routers
        self.l2_capacity = l2_sets
        self.cam_capacity = cam_entries
        # the image
        self.l1_flag = np.zeros(L1_SIZE, dtype=bool)
        self.l1_port = np.zeros(L1_SIZE, dtype=np.uint8)
        self.l1_nh = np.zeros(L1_SIZE, dtype=np.uint32)
        self.owner = np.zeros(L1_SIZE, dtype=np.uint8)
        self.l2_port = np.empty((l2_sets, L2_SET), dtype=np.uint8)  # pages are touched only when a set is used
        self.l2_nh = np.empty((l2_sets, L2_SET), dtype=np.uint32)
        self._l2_next = 0
        self._l2_free: list[int] = []
        # the Conflict CAM, as regions: id → (vid, first location, length, indirect index)
        self.reg_vid = np.zeros(cam_entries, dtype=np.int8)
        self.reg_start = np.zeros(cam_entries, dtype=np.int64)
        self.reg_len = np.zeros(cam_entries, dtype=np.int8)
        self.reg_base = np.zeros(cam_entries, dtype=np.int64)
        self._reg_free = list(range(cam_entries - 1, -1, -1))
        self.cam: dict[tuple[int, int, int], int] = {}  # (vid, length, prefix >> (19 - length)) → region id
        self._cam_lengths = [Counter() for _ in range(routers)]
        self.block_of = np.full(L1_SIZE, -1, dtype=np.int32)  # region id whose block holds this location
        self.region_of = np.full((routers, L1_SIZE), -1, dtype=np.int32)  # software mirror of the CAM match
        # per router: routes, best prefix <= /19 per location, longer prefixes per location
        self.routes: list[dict[tuple[int, int], tuple[int, int]]] = [{} for _ in range(routers)]  # → (port, nh)
        self.short_len = np.full((routers, L1_SIZE), -1, dtype=np.int8)
        self.short_port = np.zeros((routers, L1_SIZE), dtype=np.uint8)
        self.short_nh = np.zeros((routers, L1_SIZE), dtype=np.uint32)
        self.long: list[dict[int, dict[tuple[int, int], tuple[int, int]]]] = [{} for _ in range(routers)]
        self.has_long = np.zeros((routers, L1_SIZE), dtype=bool)
        self._short_lengths = [Counter() for _ in range(routers)]  # lengths 1..19 present
        self.default: list[Route | None] = [None] * routers
        # first-fit search order for relocation blocks
        self.relocation_base = relocation_base % L1_SIZE
        self._order = np.roll(np.arange(L1_SIZE, dtype=np.int64), -self.relocation_base)
        self._hint = 0  # no free location before this position of the search order

    # ---- routes ------------------------------------------------------------------------------------------------
    def insert(self, vid: int, prefix: int, length: int, port: int, next_hop: int) -> None:
        """Add or replace a route; raise TableFull (and leave the table as it was) when it does not fit."""
        self._check(vid, length, port)
        key = (_prefix_key(prefix, length), length)
        before = self.routes[vid].get(key)
        try:
            self._insert(vid, key, (port, next_hop & 0xFFFFFFFF))
        except TableFull:
            self._delete(vid, key)
            if before is not None:
                self._insert(vid, key, before)
            raise

    def delete(self, vid: int, prefix: int, length: int) -> bool:
        """Remove a route; shorter prefixes it shadowed take its addresses back. False if it was not there."""
        self._check(vid, length, 0)
        return self._delete(vid, (_prefix_key(prefix, length), length))

    def load(self, vid: int, routes: list[tuple[int, int, int, int]]) -> None:
        """Compile a whole table for a router that has none yet, vectorised; same result as inserting each."""
        self._check(vid, 0, 0)
        if self.routes[vid]:
            raise ValueError(f"virtual router {vid} already has routes; insert them one by one")
        arr = np.array(routes, dtype=np.int64).reshape(-1, 4)
        if len(arr) and not ((arr[:, 1] >= 0).all() and (arr[:, 1] <= 32).all()):
            raise ValueError("prefix lengths must be 0-32")
        if len(arr) and not ((arr[:, 2] >= 0).all() and (arr[:, 2] < NO_ROUTE).all()):
            raise ValueError("ports must fit the 3-bit port field (0-6; 7 means no route)")
        shift = np.where(arr[:, 1] > 0, 32 - arr[:, 1], 32)
        keys = zip(((arr[:, 0] & 0xFFFFFFFF) >> shift << shift).tolist(), arr[:, 1].tolist(), strict=True)
        table = dict(zip(keys, zip(arr[:, 2].tolist(), (arr[:, 3] & 0xFFFFFFFF).tolist(), strict=True), strict=True))
        self.routes[vid] = table
        self.default[vid] = _route(table.get((0, 0)))
        groups: dict[int, list[tuple[int, int, int]]] = {}
        for (p, length), (port, nh) in table.items():
            if 0 < length <= L1_BITS:
                groups.setdefault(length, []).append((p >> L2_BITS, port, nh))
        self._short_lengths[vid] = Counter({length: len(g) for length, g in groups.items()})
        for length in sorted(groups):  # longer prefixes overwrite shorter ones
            g = np.array(groups[length], dtype=np.int64)
            size = 1 << (L1_BITS - length)
            idx = (g[:, :1] + np.arange(size, dtype=np.int64)).ravel()
            self.short_len[vid, idx] = length
            self.short_port[vid, idx] = np.repeat(g[:, 1], size)
            self.short_nh[vid, idx] = np.repeat(g[:, 2], size)
        longs = self.long[vid]
        for k, r in table.items():
            if k[1] > L1_BITS:
                longs.setdefault(k[0] >> L2_BITS, {})[k] = r
        if longs:
            self.has_long[vid, np.fromiter(longs, dtype=np.int64, count=len(longs))] = True
        try:
            self._sync(vid, np.flatnonzero(self._needed(vid, slice(None))))
        except TableFull:
            self.clear(vid)
            raise

    def clear(self, vid: int) -> None:
        """Remove every route of a router (its virtual network left the FPGA)."""
        self._check(vid, 0, 0)
        self.routes[vid] = {}
        self.default[vid] = None
        self.long[vid] = {}
        self._short_lengths[vid] = Counter()
        self.short_len[vid] = -1
        self.has_long[vid] = False
        self._sync(vid, np.flatnonzero((self.owner == vid + 1) | (self.region_of[vid] >= 0)))

    # ---- lookups ------------------------------------------------------------------------------------------------
    def lookup(self, vid: int, address: int) -> Route | None:
        """One lookup as the hardware does it: CAM, else the owner tag; then L1, then L2 if flagged."""
        loc = address >> L2_BITS
        slot = None
        for length in self._cam_lengths[vid]:
            r = self.cam.get((vid, length, loc >> (L1_BITS - length)))
            if r is not None:
                slot = int(self.reg_base[r]) + loc - int(self.reg_start[r])
                break
        if slot is None:
            if self.owner[loc] != vid + 1:
                return self.default[vid]
            slot = loc
        if self.l1_flag[slot]:
            s, low = int(self.l1_nh[slot]), address & (L2_SET - 1)
            port = int(self.l2_port[s, low])
            return self.default[vid] if port == NO_ROUTE else Route(port, int(self.l2_nh[s, low]))
        port = int(self.l1_port[slot])
        return self.default[vid] if port == NO_ROUTE else Route(port, int(self.l1_nh[slot]))

    def lookup_many(self, vid: int, addresses: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(port, next hop) per address; port NO_ROUTE where there is no route. Vectorised over the image."""
        addr = np.asarray(addresses).astype(np.int64)
        loc = addr >> L2_BITS
        reg = self.region_of[vid, loc]
        inreg = reg >= 0
        r = np.where(inreg, reg, 0)
        slot = np.where(inreg, self.reg_base[r] + loc - self.reg_start[r], loc)
        hit = inreg | (self.owner[loc] == vid + 1)
        port = np.full(addr.shape, NO_ROUTE, dtype=np.uint8)
        nh = np.zeros(addr.shape, dtype=np.uint32)
        flag = hit & self.l1_flag[slot]
        leaf = hit & ~flag
        port[leaf] = self.l1_port[slot[leaf]]
        nh[leaf] = self.l1_nh[slot[leaf]]
        if flag.any():
            sets = self.l1_nh[slot[flag]].astype(np.int64)
            low = addr[flag] & (L2_SET - 1)
            port[flag] = self.l2_port[sets, low]
            nh[flag] = self.l2_nh[sets, low]
        miss = port == NO_ROUTE
        default = self.default[vid]
        port[miss] = NO_ROUTE if default is None else default.port
        nh[miss] = 0 if default is None else default.next_hop
        return port, nh

    # ---- reporting and export --------------------------------------------------------------------------------
    def cam_entries(self) -> list[CamEntry]:
        return [CamEntry(int(self.reg_vid[r]), int(self.reg_start[r]), int(self.reg_len[r]), int(self.reg_base[r]))
                for r in sorted(self.cam.values(), key=lambda r: (self.reg_vid[r], self.reg_start[r]))]

    def cam_entry_bits(self) -> int:
        """VID + prefix (19 L1 bits: ranges are whole L1 locations) + length (5) + indirect index (19)."""
        return self.vid_bits + L1_BITS + CAM_LENGTH_BITS + L1_BITS

    @property
    def vid_bits(self) -> int:
        return max(1, (self.routers - 1).bit_length())

    def stats(self) -> dict[str, float]:
        """Overlap (share of prefixes with an L1 location another router also needs), CAM and bank use."""
        needed = self._needed_all()
        count = needed.sum(axis=0, dtype=np.int16)
        shared = total = 0
        for v in range(self.routers):
            if not self.routes[v]:
                continue
            keys = np.array(list(self.routes[v]), dtype=np.int64)
            lo = keys[:, 0] >> L2_BITS
            hi = lo + np.where(keys[:, 1] <= L1_BITS, 1 << (L1_BITS - np.minimum(keys[:, 1], L1_BITS)), 1)
            hi[keys[:, 1] == 0] = 0  # a default route lives in its register, not in the image
            others = np.concatenate([[0], np.cumsum((count - needed[v]) > 0)])
            shared += int(np.count_nonzero(others[hi] - others[lo] > 0))
            total += len(keys)
        return {"prefixes": total, "overlap_pct": 100.0 * shared / total if total else 0.0,
                "overlapping_prefixes": shared, "cam_entries": len(self.cam),
                "cam_entry_bits": self.cam_entry_bits(), "cam_bits": len(self.cam) * self.cam_entry_bits(),
                "relocated_locations": int(np.count_nonzero(self.owner == INDIRECT)),
                "l1_used": int(np.count_nonzero(self.owner)), "l2_sets_used": self._l2_next - len(self._l2_free)}

    def export(self, directory: str | Path) -> dict[str, str]:
        """Write the banks, owner tags and CAM as files a hardware loader could write to the board."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        l1 = (self.l1_flag.astype(np.uint64) << np.uint64(35)) | (self.l1_port.astype(np.uint64) << np.uint64(32)) \
            | self.l1_nh.astype(np.uint64)
        used = self._l2_next
        l2 = (self.l2_port[:used].astype(np.uint64) << np.uint64(32)) | self.l2_nh[:used].astype(np.uint64)
        for k in self._l2_free:  # free sets hold stale words; write them as "no route"
            l2[k] = np.uint64(NO_ROUTE) << np.uint64(32)
        l1.astype("<u8").tofile(d / "sram_l1.bin")
        l2.astype("<u8").tofile(d / "sram_l2.bin")
        self.owner.tofile(d / "owner_tags.bin")
        entries = self.cam_entries()
        cam = np.array([_pack_cam(e) for e in entries], dtype="<u8")
        cam.tofile(d / "conflict_cam.bin")
        description = {
            "format": "slicex shared FIB v2", "routers": self.routers,
            "default_routes": [None if r is None else {"port": r.port, "next_hop": r.next_hop} for r in self.default],
            "sram_l1.bin": {"entries": L1_SIZE, "word": "little-endian uint64 holding 36 bits",
                            "fields": "flag<<35 | port<<32 | next_hop (flag: next_hop is an L2 set index)"},
            "sram_l2.bin": {"sets": used, "set_entries": L2_SET, "word": "little-endian uint64 holding 35 bits",
                            "fields": "port<<32 | next_hop", "no_route_port": NO_ROUTE},
            "owner_tags.bin": {"entries": L1_SIZE, "word": "uint8", "values": "0 free, VID+1 direct, 7 relocated"},
            "conflict_cam.bin": {"entries": len(entries), "word": "little-endian uint64",
                                 "fields": f"vid<<{L1_BITS + CAM_LENGTH_BITS + L1_BITS} | prefix<<"
                                           f"{CAM_LENGTH_BITS + L1_BITS} | length<<{L1_BITS} | index",
                                 "entry_bits": self.cam_entry_bits(),
                                 "match": "vid equal and location >> (19-length) == prefix >> (19-length); "
                                          "slot = index + location - prefix"},
            "lookup": "location = address >> 13; slot from the CAM, else location if owner tag is VID+1, "
                      "else no route; L1[slot], and L2[L1.next_hop][address & 0x1fff] when flagged; port 7 = no route, "
                      "where the VID's default route register answers"}
        (d / "fib.json").write_text(json.dumps(description, indent=1))
        return {k: str(d / k) for k in ("sram_l1.bin", "sram_l2.bin", "owner_tags.bin", "conflict_cam.bin",
                                        "fib.json")}

    # ---- internals: route state ------------------------------------------------------------------------------
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
        return (lo, lo + 1) if length >= L1_BITS else (lo, lo + (1 << (L1_BITS - length)))

    def _insert(self, vid: int, key: tuple[int, int], route: tuple[int, int]) -> None:
        prefix, length = key
        if length == 0:
            self.routes[vid][key] = route
            self.default[vid] = Route(*route)
            return
        if key not in self.routes[vid] and length <= L1_BITS:
            self._short_lengths[vid][length] += 1
        self.routes[vid][key] = route
        lo, hi = self._span(prefix, length)
        if length <= L1_BITS:
            better = self.short_len[vid, lo:hi] <= length
            self.short_len[vid, lo:hi][better] = length
            self.short_port[vid, lo:hi][better] = route[0]
            self.short_nh[vid, lo:hi][better] = route[1]
            self._sync(vid, np.flatnonzero(better) + lo)
        else:
            self.long[vid].setdefault(lo, {})[key] = route
            self.has_long[vid, lo] = True
            self._sync(vid, np.array([lo], dtype=np.int64), key)

    def _delete(self, vid: int, key: tuple[int, int]) -> bool:
        if self.routes[vid].pop(key, None) is None:
            return False
        prefix, length = key
        if length == 0:
            self.default[vid] = None
            return True
        lo, hi = self._span(prefix, length)
        if length <= L1_BITS:
            self._short_lengths[vid][length] -= 1
            if not self._short_lengths[vid][length]:
                del self._short_lengths[vid][length]
            won = np.flatnonzero(self.short_len[vid, lo:hi] == length) + lo
            ancestor = self._ancestor(vid, prefix, length)
            if ancestor is None:
                self.short_len[vid, won] = -1
            else:
                alen, (port, nh) = ancestor
                self.short_len[vid, won] = alen
                self.short_port[vid, won] = port
                self.short_nh[vid, won] = nh
            self._sync(vid, won)
        else:
            here = self.long[vid][lo]
            del here[key]
            if not here:
                del self.long[vid][lo]
                self.has_long[vid, lo] = False
            self._sync(vid, np.array([lo], dtype=np.int64), key)
        return True

    def _ancestor(self, vid: int, prefix: int, length: int) -> tuple[int, tuple[int, int]] | None:
        for alen in sorted((n for n in self._short_lengths[vid] if n < length), reverse=True):
            r = self.routes[vid].get((_prefix_key(prefix, alen), alen))
            if r is not None:
                return alen, r
        return None

    def _needed(self, vid: int, locs) -> np.ndarray:
        return (self.short_len[vid, locs] >= 0) | self.has_long[vid, locs]

    def _needed_all(self) -> np.ndarray:
        return (self.short_len >= 0) | self.has_long

    def _outermost(self, vid: int, loc: int) -> int:
        """Length of the shortest prefix <= /19 of `vid` covering `loc`, or 19 if only longer ones do."""
        for length in sorted(self._short_lengths[vid]):
            if (_prefix_key(loc << L2_BITS, length), length) in self.routes[vid]:
                return length
        return L1_BITS

    # ---- internals: placing a router's entries ------------------------------------------------------------------
    def _sync(self, vid: int, locs: np.ndarray, changed: tuple[int, int] | None = None) -> None:
        """Make the image give router `vid` its current content at each location in `locs`. `changed` names
        the one prefix longer than /19 that changed, so an existing L2 set is repainted only where it covers."""
        if not len(locs):
            return
        if len(locs) == 1 and self._sync_one(vid, int(locs[0]), changed):
            return
        reg = self.region_of[vid, locs]
        inreg = reg >= 0
        if inreg.any():
            rl, rr = locs[inreg], reg[inreg]
            self._write(vid, rl, self.reg_base[rr] + rl - self.reg_start[rr])
            for r in np.unique(rr).tolist():
                self._release_if_empty(r)
        rest = locs[~inreg]
        if not len(rest):
            return
        need = self._needed(vid, rest)
        mine = self.owner[rest] == vid + 1
        self._vacate(rest[~need & mine])
        want = rest[need]
        if not len(want):
            return
        own = self.owner[want]
        direct = want[(own == FREE) | (own == vid + 1)]
        self.owner[direct] = vid + 1  # claimed first, so a block moved below cannot land on them
        evict = want[own == INDIRECT]
        for slot in evict.tolist():
            if self.owner[slot] == INDIRECT:
                self._move_block(int(self.block_of[slot]))
                freed = evict[self.owner[evict] == FREE]
                self.owner[freed] = vid + 1
        claimed = np.sort(np.concatenate([direct, evict]))
        self._write(vid, claimed, claimed)
        conflict = want[(own != FREE) & (own != vid + 1) & (own != INDIRECT)]
        if len(conflict):
            self._relocate(vid, conflict)

    def _sync_one(self, vid: int, loc: int, changed: tuple[int, int] | None) -> bool:
        """The common single-location cases without array overhead; False when relocation is needed."""
        r = int(self.region_of[vid, loc])
        if r >= 0:
            self._write_one(vid, loc, int(self.reg_base[r]) + loc - int(self.reg_start[r]), changed)
            if self.short_len[vid, loc] < 0 and not self.has_long[vid, loc]:
                self._release_if_empty(r)
            return True
        own = int(self.owner[loc])
        if self.short_len[vid, loc] < 0 and not self.has_long[vid, loc]:
            if own == vid + 1:
                self._vacate(np.array([loc], dtype=np.int64))
            return True
        if own == FREE or own == vid + 1:
            self.owner[loc] = vid + 1
            self._write_one(vid, loc, loc, changed)
            return True
        return False

    def _write_one(self, vid: int, loc: int, slot: int, changed: tuple[int, int] | None) -> None:
        if self.has_long[vid, loc]:
            if changed is not None and self.l1_flag[slot]:
                self._repaint(vid, loc, int(self.l1_nh[slot]), changed)
            else:
                self._write_set(vid, loc, slot)
            return
        if self.l1_flag[slot]:
            self._free_set(int(self.l1_nh[slot]))
            self.l1_flag[slot] = False
        if self.short_len[vid, loc] >= 0:
            self.l1_port[slot] = self.short_port[vid, loc]
            self.l1_nh[slot] = self.short_nh[vid, loc]
        else:
            self.l1_port[slot] = NO_ROUTE
            self.l1_nh[slot] = 0

    def _repaint(self, vid: int, loc: int, k: int, changed: tuple[int, int]) -> None:
        """Rewrite L2 set k only where prefix `changed` (inserted or deleted) covers: its own route or its
        longest remaining ancestor, then the longer prefixes inside it."""
        prefix, length = changed
        here = self.long[vid][loc]
        base = None
        for alen in range(length, L1_BITS, -1):
            base = here.get((_prefix_key(prefix, alen), alen))
            if base is not None:
                break
        if base is None:
            base = (int(self.short_port[vid, loc]), int(self.short_nh[vid, loc])) \
                if self.short_len[vid, loc] >= 0 else (NO_ROUTE, 0)
        a = prefix & (L2_SET - 1)
        b = a + (1 << (32 - length))
        ports, nhs = self.l2_port[k], self.l2_nh[k]
        ports[a:b], nhs[a:b] = base
        inner = [(key, r) for key, r in here.items() if key[1] > length and key[0] >> (32 - length) == prefix >> (32 - length)]
        for (p, plen), (port, nh) in sorted(inner, key=_by_length):
            c = p & (L2_SET - 1)
            ports[c:c + (1 << (32 - plen))] = port
            nhs[c:c + (1 << (32 - plen))] = nh

    def _write(self, vid: int, locs: np.ndarray, slots: np.ndarray) -> None:
        """Write router `vid`'s content for `locs` into L1 `slots` (and their L2 sets)."""
        longs = self.has_long[vid, locs]
        leaf_locs, leaf_slots = locs[~longs], slots[~longs]
        if len(leaf_slots):
            for s in leaf_slots[self.l1_flag[leaf_slots]].tolist():
                self._free_set(int(self.l1_nh[s]))
            self.l1_flag[leaf_slots] = False
            has = self.short_len[vid, leaf_locs] >= 0
            self.l1_port[leaf_slots] = np.where(has, self.short_port[vid, leaf_locs], NO_ROUTE)
            self.l1_nh[leaf_slots] = np.where(has, self.short_nh[vid, leaf_locs], 0)
        for loc, slot in zip(locs[longs].tolist(), slots[longs].tolist(), strict=True):
            self._write_set(vid, loc, slot)

    def _write_set(self, vid: int, loc: int, slot: int) -> None:
        k = int(self.l1_nh[slot]) if self.l1_flag[slot] else self._alloc_set()
        ports, nhs = self.l2_port[k], self.l2_nh[k]
        if self.short_len[vid, loc] >= 0:
            ports[:] = self.short_port[vid, loc]
            nhs[:] = self.short_nh[vid, loc]
        else:
            ports[:] = NO_ROUTE
            nhs[:] = 0
        for (p, length), (port, nh) in sorted(self.long[vid][loc].items(), key=_by_length):
            a = p & (L2_SET - 1)
            b = a + (1 << (32 - length))
            ports[a:b] = port
            nhs[a:b] = nh
        self.l1_flag[slot] = True
        self.l1_port[slot] = 0
        self.l1_nh[slot] = k

    def _alloc_set(self) -> int:
        if self._l2_free:
            return self._l2_free.pop()
        if self._l2_next >= self.l2_capacity:
            raise TableFull(f"L2 bank full: all {self.l2_capacity} sets of {L2_SET} entries are in use (one per "
                            f"L1 location where a router has prefixes longer than /{L1_BITS})")
        self._l2_next += 1
        return self._l2_next - 1

    def _free_set(self, k: int) -> None:
        self._l2_free.append(k)

    def _clear_slots(self, slots: np.ndarray) -> None:
        """Free L1 locations (and their L2 sets)."""
        if not len(slots):
            return
        for s in slots[self.l1_flag[slots]].tolist():
            self._free_set(int(self.l1_nh[s]))
        self.l1_flag[slots] = False
        self.owner[slots] = FREE
        self.block_of[slots] = -1
        self._hint = min(self._hint, int(((slots - self.relocation_base) % L1_SIZE).min()))

    def _vacate(self, locs: np.ndarray) -> None:
        self._clear_slots(locs)

    # ---- internals: relocation and the CAM -----------------------------------------------------------------------
    def _relocate(self, vid: int, locs: np.ndarray) -> None:
        """Router `vid` needs `locs`, which other routers hold: relocate ranges covering them, one per scope."""
        groups: dict[tuple[int, int], list[int]] = {}
        for loc in locs.tolist():
            length = self._outermost(vid, loc)
            groups.setdefault((loc >> (L1_BITS - length), length), []).append(loc)
        for group in groups.values():
            self._new_ranges(vid, np.array(group, dtype=np.int64))

    def _new_ranges(self, vid: int, xs: np.ndarray) -> None:
        """Relocate the smallest aligned range holding `xs`; halve it while no free block is large enough."""
        k = (int(xs[0]) ^ int(xs[-1])).bit_length()
        start, n = int(xs[0]) >> k << k, 1 << k
        if not self._reg_free:
            raise TableFull(f"Conflict CAM full ({self.cam_capacity} entries)")
        base = self._alloc_block(n)
        if base is None:
            if n == 1:
                raise TableFull("no free L1 location left to relocate a conflicting entry to")
            mid = start + n // 2
            for half in (xs[xs < mid], xs[xs >= mid]):
                if len(half):
                    self._new_ranges(vid, half)
            return
        locs = np.arange(start, start + n, dtype=np.int64)
        for r in np.unique(self.region_of[vid, locs]).tolist():
            if r >= 0:  # a smaller range of this router inside: absorbed
                self._dissolve(r)
        self._vacate(locs[self.owner[locs] == vid + 1])
        r = self._reg_free.pop()
        length = L1_BITS - k
        self.reg_vid[r], self.reg_start[r], self.reg_len[r], self.reg_base[r] = vid, start, length, base
        self.cam[(vid, length, start >> k)] = r
        self._cam_lengths[vid][length] += 1
        slots = np.arange(base, base + n, dtype=np.int64)
        self.owner[slots] = INDIRECT
        self.block_of[slots] = r
        self.region_of[vid, locs] = r
        self._write(vid, locs, slots)

    def _release_if_empty(self, r: int) -> None:
        vid, start = int(self.reg_vid[r]), int(self.reg_start[r])
        n = 1 << (L1_BITS - int(self.reg_len[r]))
        if not self._needed(vid, slice(start, start + n)).any():
            self._dissolve(r)

    def _dissolve(self, r: int) -> None:
        """Drop a CAM entry and free its block; the router's locations in the range are then not placed."""
        vid, start, length, base = int(self.reg_vid[r]), int(self.reg_start[r]), int(self.reg_len[r]), \
            int(self.reg_base[r])
        n = 1 << (L1_BITS - length)
        self._clear_slots(np.arange(base, base + n, dtype=np.int64))
        self.region_of[vid, start:start + n] = -1
        del self.cam[(vid, length, start >> (L1_BITS - length))]
        self._cam_lengths[vid][length] -= 1
        if not self._cam_lengths[vid][length]:
            del self._cam_lengths[vid][length]
        self._reg_free.append(r)

    def _move_block(self, r: int) -> None:
        """A relocated block sits where a router now needs its own location: move the block elsewhere."""
        old = int(self.reg_base[r])
        n = 1 << (L1_BITS - int(self.reg_len[r]))
        new = self._alloc_block(n)  # the old block is tagged INDIRECT, so never chosen
        if new is None:
            raise TableFull(f"no free block of {n} L1 locations to move a relocated range to")
        src, dst = slice(old, old + n), slice(new, new + n)
        self.l1_flag[dst], self.l1_port[dst], self.l1_nh[dst] = self.l1_flag[src], self.l1_port[src], self.l1_nh[src]
        self.owner[dst] = INDIRECT
        self.block_of[dst] = r
        self.l1_flag[src] = False  # its L2 sets moved with it
        self._clear_slots(np.arange(old, old + n, dtype=np.int64))
        self.reg_base[r] = new

    def _alloc_block(self, n: int) -> int | None:
        """First free run of n consecutive L1 locations in search order (from the relocation base, wrapping;
        a block never wraps), or None. Searched in windows so a nearly empty table answers at once."""
        pos, width = self._hint, max(4096, 4 * n)
        while pos < L1_SIZE:
            window = self._order[pos:pos + width + n - 1]
            if len(window) < n:
                break
            free = self.owner[window] == FREE
            if n == 1:
                hits = np.flatnonzero(free)
            else:
                c = np.concatenate([[0], np.cumsum(free, dtype=np.int32)])
                hits = np.flatnonzero((c[n:] - c[:-n] == n) & (window[n - 1:] - window[:len(window) - n + 1] == n - 1))
            if len(hits):
                if n == 1:
                    self._hint = pos + int(hits[0])
                return int(window[hits[0]])
            pos += width
        if n == 1:
            self._hint = L1_SIZE
        return None


def _by_length(item: tuple[tuple[int, int], tuple[int, int]]) -> int:
    return item[0][1]


def _route(r: tuple[int, int] | None) -> Route | None:
    return None if r is None else Route(*r)


def _pack_cam(e: CamEntry) -> int:
    return (e.vid << (L1_BITS + CAM_LENGTH_BITS + L1_BITS)) | (e.prefix << (CAM_LENGTH_BITS + L1_BITS)) \
        | (e.length << L1_BITS) | e.index


class ExportedImage:
    """Lookups straight from the exported files, as a hardware loader would see them (checks the export)."""

    def __init__(self, directory: str | Path):
        d = Path(directory)
        desc = json.loads((d / "fib.json").read_text())
        self.routers = int(desc["routers"])
        self.default = [None if r is None else Route(r["port"], r["next_hop"]) for r in desc["default_routes"]]
        self.l1 = np.fromfile(d / "sram_l1.bin", dtype="<u8")
        self.l2 = np.fromfile(d / "sram_l2.bin", dtype="<u8").reshape(-1, L2_SET)
        self.owner = np.fromfile(d / "owner_tags.bin", dtype=np.uint8)
        self.cam: list[CamEntry] = []
        for w in np.fromfile(d / "conflict_cam.bin", dtype="<u8").tolist():
            self.cam.append(CamEntry(w >> (L1_BITS + CAM_LENGTH_BITS + L1_BITS),
                                     (w >> (CAM_LENGTH_BITS + L1_BITS)) & (L1_SIZE - 1),
                                     (w >> L1_BITS) & ((1 << CAM_LENGTH_BITS) - 1), w & (L1_SIZE - 1)))

    def lookup(self, vid: int, address: int) -> Route | None:
        loc = address >> L2_BITS
        slot = next((e.index + loc - e.prefix for e in self.cam
                     if e.vid == vid and loc >> (L1_BITS - e.length) == e.prefix >> (L1_BITS - e.length)), None)
        if slot is None:
            if self.owner[loc] != vid + 1:
                return self.default[vid]
            slot = loc
        word = int(self.l1[slot])
        if word >> 35 & 1:
            word = int(self.l2[word & 0xFFFFFFFF, address & (L2_SET - 1)])
        port = word >> 32 & 7
        return self.default[vid] if port == NO_ROUTE else Route(port, word & 0xFFFFFFFF)
