"""Redis store: shared state for several processes (AM API workers, actors on other hosts).

Same behaviour as the SQLite store (tests/integration/test_store_contract.py runs one contract against both).
Documents are one hash per table, with two sorted sets beside it written in the same Lua script as the
document: its keys (score 0, so a key-prefix scan is a lexicographic range: it reads only the matching keys)
and its time index (score: the document's `due`); the key index only for the tables read by prefix
(slicex/store/ownership.py `KEY_INDEXED`). A claim is a field of its namespace's hash (key → owner), a member
of its owner's set and a field of its counter's hash. Every write (`put`, `delete`, `claim_all`, `release`,
`release_owner`, `reown`, the layout steps) is one Lua script, so each is atomic across every client of the
server: two workers can never both win a key. A server that does not answer is UNAVAILABLE (11) or TIMEDOUT (8) with the URL (password removed) in the message, never a crash.

On a Redis that Sentinel manages (`redis+sentinel://`, slicex.store.urls) the client asks the sentinels where
the primary is and follows a failover: a call that meets one (the primary gone, or demoted, before the
sentinels promote a replica) is BUSY (14) with the reason, to be retried in seconds. Every write is one Lua
script followed, on the same connection, by WAIT for `replicas` replicas: a write is answered only once a
replica holds it, so a failover (which promotes the most up-to-date replica) keeps it. A primary with no
replica in sync (none connected, or the only one still loading its first copy) takes writes alone, logged:
no replica could be promoted with them either."""

from __future__ import annotations

import copy
import json
import logging
import re
import time
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.commands.core import Script

from slicex.errors import Busy, DbError, TimedOut, Unavailable
from slicex.store import counter_of, namespace_of
from slicex.store.codec import decode, encode
from slicex.store.ownership import KEY_INDEXED, TALLIED
from slicex.store.urls import SentinelUrl, is_sentinel_url, parse_sentinel_url

log = logging.getLogger("slicex.store")

# Every claim script's ARGV: owner, the prefix of the claim keys of the layout before (migration only), the
# namespace hash prefix, the owner's set, the counters' hash, the counter hash prefix, the owner set prefix.
# A claim is a field of its namespace's hash (field: the claim key, value: its owner; `claims_in` reads a
# namespace without scanning the keyspace, `owner_of` one field) and a member of its owner's set (the key, so
# a set of a few keys stays a small listpack). Before issue 33 each claim was also a key of its own
# (`<prefix>:claim:<key>` → owner) and owner sets held those key names: `_MIGRATE_CLAIMS` drops them.
_FENCE = """
local fence_key, fence_token = ARGV[#ARGV - 1], ARGV[#ARGV]
if fence_key ~= '' and redis.call('GET', fence_key) ~= fence_token then
  return redis.error_reply('FENCED the lease this write was made under (token ' .. fence_token .. ') was taken over')
end
"""
"""Every write script starts here. Its last two ARGV are a fence: a key and the token its writer holds ('' '':
none). The write happens only while the key still holds that token, in the same script, so an actor that lost
its lease (paused, cut off) cannot write once another took it over (slicex.store.redis_store.RedisStore.fenced)."""
_NAMESPACE_OF = """
local function ns_of(k)
  return ARGV[3] .. (string.match(k, '^([^:]*):') or '')
end
"""
# Claim counters (slicex.store.counter_of): ARGV[5] is the hash counter → claims it holds, ARGV[6] the prefix of
# each counter's hash of its claims (key → owner), so `claims_under` reads one pool. A counter moves only when
# its hash gains or loses the field, in the same script as the claim: claiming twice counts once.
_CHANGED = """
local claim_gen = nil
local function changed(c)
  if not claim_gen then claim_gen = redis.call('INCR', ARGV[5] .. '-gen') end
  redis.call('ZADD', ARGV[5] .. '-changed', claim_gen, c)
end
"""
"""Per counter, the claims generation of its last change (a sorted set beside the counters' hash, scored by
generation; one INCR of the generation per script): a reader asks for the counters changed after the
generation it last saw (`claim_changes`) and reads only those."""
_COUNTING = """
local function counted(k, owner)
  local c = string.match(k, '^(.*):[^:]*$')
  if c and redis.call('HSET', ARGV[6] .. c, k, owner) == 1 then
    redis.call('HINCRBY', ARGV[5], c, 1)
    changed(c)
  end
end
local function uncounted(k)
  local c = string.match(k, '^(.*):[^:]*$')
  if c and redis.call('HDEL', ARGV[6] .. c, k) == 1 then
    if redis.call('HINCRBY', ARGV[5], c, -1) <= 0 then redis.call('HDEL', ARGV[5], c) end
    changed(c)
  end
end
"""
_COUNTERS = _CHANGED + _COUNTING
_CLAIM_ALL = _FENCE + _NAMESPACE_OF + _COUNTERS + """
for i, k in ipairs(KEYS) do
  local owner = redis.call('HGET', ns_of(k), k)
  if owner and owner ~= ARGV[1] then return 0 end
end
for i, k in ipairs(KEYS) do
  redis.call('HSET', ns_of(k), k, ARGV[1])
  redis.call('SADD', ARGV[4], k)
  counted(k, ARGV[1])
end
return 1
"""
_RELEASE = _FENCE + _NAMESPACE_OF + _COUNTERS + """
local n = 0
for i, k in ipairs(KEYS) do
  if redis.call('HGET', ns_of(k), k) == ARGV[1] then
    redis.call('HDEL', ns_of(k), k)
    redis.call('SREM', ARGV[4], k)
    uncounted(k)
    n = n + 1
  end
end
return n
"""
_RELEASE_OWNER = _FENCE + _NAMESPACE_OF + _COUNTERS + """
local n = 0
for i, k in ipairs(redis.call('SMEMBERS', ARGV[4])) do
  if redis.call('HGET', ns_of(k), k) == ARGV[1] then
    redis.call('HDEL', ns_of(k), k)
    uncounted(k)
    n = n + 1
  end
end
redis.call('DEL', ARGV[4])
return n
"""
_TALLY = """
local function tally(json, sign, prefix)
  for counter, fields in pairs(cjson.decode(json)) do
    for field, n in pairs(fields) do
      if redis.call('HINCRBY', prefix .. counter, field, sign * n) == 0 then redis.call('HDEL', prefix .. counter, field) end
    end
  end
end
"""
"""Add (sign 1) or take out (-1) a document's tally ({counter: {field: n}}, JSON) from the counters' hashes."""
_PUT = _FENCE + _TALLY + """
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
if ARGV[4] == '1' then redis.call('ZADD', KEYS[2], 0, ARGV[1]) end
if ARGV[3] == '' then redis.call('ZREM', KEYS[3], ARGV[1]) else redis.call('ZADD', KEYS[3], ARGV[3], ARGV[1]) end
if ARGV[7] == '1' then
  local old = redis.call('HGET', KEYS[4], ARGV[1])
  if old then tally(old, -1, ARGV[6]) end
  if ARGV[5] ~= '' then
    tally(ARGV[5], 1, ARGV[6])
    redis.call('HSET', KEYS[4], ARGV[1], ARGV[5])
  elseif old then
    redis.call('HDEL', KEYS[4], ARGV[1])
  end
end
return 1
"""
"""A document, its index entries and its tally (KEYS: the table's hash, key index, time index, tallies by key;
ARGV: key, encoded document, due or '', '1' when its table keeps a key index, the tally's JSON or '', the
counters' hash prefix, '1' when its table keeps tallies), in one script: atomic, and a single command that
WAIT can follow on the same connection."""
_DELETE = _FENCE + _TALLY + """
local n = redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
local old = redis.call('HGET', KEYS[4], ARGV[1])
if old then
  tally(old, -1, ARGV[2])
  redis.call('HDEL', KEYS[4], ARGV[1])
end
return n
"""
_LEASE_TAKE = """
local held = redis.call('GET', KEYS[1])
if held and held ~= ARGV[3] then return false end
local token = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. token, 'PX', ARGV[2])
return token
"""
"""Take a lease (KEYS: the lease, its fence; ARGV: holder, ttl ms, the value it may replace or ''): only when
it is free (or still holds exactly ARGV[3]: a holder known dead); a new fencing token every time."""
_LEASE_RENEW = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] or redis.call('GET', KEYS[2]) ~= ARGV[3] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""
_LEASE_DROP = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
_REOWN = _FENCE + _NAMESPACE_OF + _CHANGED + """
local n = 0
for i, k in ipairs(redis.call('SMEMBERS', ARGV[4])) do
  if redis.call('HGET', ns_of(k), k) == ARGV[1] then
    redis.call('HSET', ns_of(k), k, ARGV[8])
    redis.call('SADD', ARGV[7] .. ARGV[8], k)
    local c = string.match(k, '^(.*):[^:]*$')
    if c and redis.call('HEXISTS', ARGV[6] .. c, k) == 1 then
      redis.call('HSET', ARGV[6] .. c, k, ARGV[8])
      changed(c)
    end
    n = n + 1
  end
end
redis.call('DEL', ARGV[4])
return n
"""
"""Give every claim of one owner (ARGV[1]) to another (ARGV[8]) in one script: its namespace hash, both
owners' sets and its counter's hash (the counts do not change)."""
_MIGRATE_CLAIMS = _FENCE + _NAMESPACE_OF + """
local n = 0
for i, key in ipairs(redis.call('KEYS', ARGV[9])) do
  local owner = redis.call('GET', key)
  local k = string.sub(key, #ARGV[2] + 1)
  if owner and not redis.call('HGET', ns_of(k), k) then redis.call('HSET', ns_of(k), k, owner) end
  redis.call('DEL', key)
  n = n + 1
end
for i, set in ipairs(redis.call('KEYS', ARGV[10])) do
  for j, m in ipairs(redis.call('SMEMBERS', set)) do
    if string.sub(m, 1, #ARGV[2]) == ARGV[2] then
      redis.call('SREM', set, m)
      redis.call('SADD', set, string.sub(m, #ARGV[2] + 1))
    end
  end
end
return n
"""
"""The claims of the layout before issue 33 (a key per claim, owner sets of those key names): each claim
kept in its namespace hash (where `_INDEX_ONCE` put it), its key dropped, owner sets of bare claim keys.
Idempotent: a second run finds no claim key and no prefixed member."""
_INDEX_ONCE = _FENCE + """
if redis.call('EXISTS', KEYS[1]) == 1 then return -1 end
local n = 0
for i, key in ipairs(redis.call('KEYS', ARGV[4])) do
  local owner = redis.call('GET', key)
  if owner then
    local k = string.sub(key, #ARGV[2] + 1)
    redis.call('HSET', ARGV[3] .. (string.match(k, '^([^:]*):') or ''), k, owner)
    n = n + 1
  end
end
redis.call('SET', KEYS[1], '1')
return n
"""
"""Index the claims a store written before namespace indexes holds (once per store: the marker key says it
was done; `flush` removes it with everything else)."""
_KEYS_ONCE = _FENCE + """
if redis.call('EXISTS', KEYS[1]) == 1 then return -1 end
local n = 0
for i, table in ipairs(redis.call('KEYS', ARGV[1])) do
  local name = string.sub(table, #ARGV[2] + 1)
  for j, key in ipairs(redis.call('HKEYS', table)) do
    redis.call('ZADD', ARGV[3] .. name, 0, key)
    n = n + 1
  end
end
redis.call('SET', KEYS[1], '1')
return n
"""
"""Index the document keys of a store written before key indexes (once per store, like `_INDEX_ONCE`): one
script, so no put or delete of another client lands between reading a table and indexing it."""
_COUNT_ALL = _FENCE + _NAMESPACE_OF + "local function changed(c) end\n" + _COUNTING + """
if ARGV[7] ~= 'force' and redis.call('EXISTS', KEYS[1]) == 1 then return -1 end
redis.call('DEL', ARGV[5])
for i, key in ipairs(redis.call('KEYS', ARGV[8])) do redis.call('DEL', key) end
local n = 0
for i, ns in ipairs(redis.call('KEYS', ARGV[4])) do
  local all = redis.call('HGETALL', ns)
  for j = 1, #all, 2 do
    counted(all[j], all[j + 1])
    n = n + 1
  end
end
redis.call('SET', KEYS[1], '1')
return n
"""
"""Count the claims of a store written before claim counters (once per store, as `_INDEX_ONCE`), or recount
every counter from the claims (`force`: a repair). No claim changes, so no counter is marked changed."""


def redact(url: str) -> str:
    """The URL without its password, for messages and logs."""
    if is_sentinel_url(url):
        try:
            return parse_sentinel_url(url).shown()
        except ValueError:
            head, at, tail = url.partition("@")
            return "redis+sentinel://***@" + tail if at else url
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def _glob_escape(text: str) -> str:
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


FAILING_OVER = ("READONLY", "NOREPLICAS", "MASTERDOWN", "LOADING", "TRYAGAIN")
"""Refusals of a Redis server that mean its role is changing (demoted, no replica in reach, still loading)."""


class Fenced(Busy):
    """A write refused because the lease it was made under was taken over (the writer is no longer the active
    actor): BUSY, for the caller retries and reaches the active one."""


def redis_call(shown: str, fn, sentinel: bool = False):
    """Run one Redis operation; its failures become GENI errors naming the server (`shown`, password redacted).
    On a Sentinel store (`sentinel`), losing the primary means a failover is under way: BUSY, retry in seconds."""
    try:
        return fn()
    except redis.exceptions.TimeoutError as exc:
        if sentinel:
            raise Busy(_failing_over(shown, exc)) from None
        raise TimedOut(f"Redis at {shown} did not answer in time: {exc}; retry shortly") from None
    except redis.exceptions.ConnectionError as exc:
        if sentinel:
            raise Busy(_failing_over(shown, exc)) from None
        raise Unavailable(f"Redis at {shown} is not answering: {exc}; retry when it is back") from None
    except redis.exceptions.ResponseError as exc:
        said = str(exc).rpartition("of pipeline caused error: ")[2]  # a pipeline's error names its command first
        if said.startswith("FENCED"):
            raise Fenced(f"this actor is no longer the active one, its write was refused: {said}; retry (the "
                         f"active one answers)") from None
        if sentinel and said.startswith(FAILING_OVER):
            raise Busy(_failing_over(shown, said)) from None
        raise DbError(f"Redis at {shown} refused an operation: {exc}") from None
    except redis.exceptions.RedisError as exc:
        raise DbError(f"Redis at {shown} refused an operation: {exc}") from None


def _failing_over(shown: str, exc: Exception | str) -> str:
    return (f"the store's primary ({shown}) is failing over to a replica ({exc}); retry in a few seconds, "
            f"once the sentinels have promoted one")


class RedisStore:
    def __init__(self, url: str, prefix: str = "slicex", timeout: float = 5.0):
        self.url = url
        self.prefix = prefix
        self._shown = redact(url)
        self.sentinel: SentinelUrl | None = None
        try:
            if is_sentinel_url(url):
                self.sentinel = parse_sentinel_url(url)
                self._r = _sentinel_client(self.sentinel, timeout, decode_responses=True)
                self._rb = _sentinel_client(self.sentinel, timeout, decode_responses=False)
            else:
                self._r = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout,
                                               decode_responses=True, health_check_interval=30)
                self._rb = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout,
                                                decode_responses=False, health_check_interval=30)
            # documents are bytes (slicex/store/codec.py): `_rb` reads them without decoding them as text
        except ValueError as exc:
            form = "redis+sentinel://HOST:PORT[,HOST:PORT...]/MASTER[/DB]" if is_sentinel_url(url) else \
                "redis://HOST:PORT/DB"
            raise DbError(f"bad Redis URL {self._shown}: {exc}; use {form}") from None
        self._acks = self.sentinel.replicas if self.sentinel else 0  # replicas each write waits for (WAIT)
        self._alone_until = 0.0  # until then the primary is known to have no replica: writes skip WAIT
        self._fence = ["", ""]  # the fence key and token every write carries (none: `fenced` sets them)
        self._lease_take = self._r.register_script(_LEASE_TAKE)
        self._lease_renew = self._r.register_script(_LEASE_RENEW)
        self._lease_drop = self._r.register_script(_LEASE_DROP)
        self._put = self._r.register_script(_PUT)
        self._delete = self._r.register_script(_DELETE)
        self._claim_all = self._r.register_script(_CLAIM_ALL)
        self._release = self._r.register_script(_RELEASE)
        self._release_owner = self._r.register_script(_RELEASE_OWNER)
        self._index_once = self._r.register_script(_INDEX_ONCE)
        self._keys_once = self._r.register_script(_KEYS_ONCE)
        self._count_all = self._r.register_script(_COUNT_ALL)
        self._reown = self._r.register_script(_REOWN)
        self._migrate_claims = self._r.register_script(_MIGRATE_CLAIMS)

    def _call(self, fn):
        return redis_call(self._shown, fn, sentinel=self.sentinel is not None)

    def _write(self, script: Script, keys: list[str], args: list[str]) -> Any:
        """Run one write script; on a Sentinel store, answered only once `replicas` replicas acknowledged it
        (WAIT on the same connection, one round trip with the script). Not acknowledged in `wait_ms`: BUSY
        (the write may be on the primary alone; every write of the actors is idempotent, a retry redoes it)."""
        args = [*args, *self._fence]
        if self._alone_until and time.monotonic() >= self._alone_until:  # alone a second ago: still? (1 RTT)
            self._alone_until = time.monotonic() + 1.0 if self._replicas_online() == 0 else 0.0
        if not self._acks or self._alone_until:
            return self._call(lambda: script(keys=keys, args=args))

        def with_wait() -> tuple[Any, int]:
            for _attempt in range(2):  # a primary that lacks the script (a new one after a failover) loads it
                pipe = self._r.pipeline(transaction=False)
                pipe.evalsha(script.sha, len(keys), *keys, *args)
                pipe.wait(self._acks, self.sentinel.wait_ms)
                try:
                    result, acked = pipe.execute()
                    return result, int(acked)
                except redis.exceptions.NoScriptError:
                    self._r.script_load(script.script)
            raise DbError(f"Redis at {self._shown} does not keep the store's scripts")

        result, acked = self._call(with_wait)
        if acked >= self._acks:
            return result
        if self._replicas_online() == 0:  # none in sync: nothing a failover could promote with this write on it
            log.warning("the store's primary (%s) has no replica in sync: writes are kept by the primary alone "
                        "until one is", self._shown)
            self._alone_until = time.monotonic() + 1.0
            return result
        raise Busy(f"the store's replicas ({self._shown}) did not acknowledge a write within "
                   f"{self.sentinel.wait_ms} ms ({acked} of {self._acks}); retry in a few seconds")

    def _replicas_online(self) -> int:
        """The primary's replicas in sync with it (a replica still loading its first copy acknowledges nothing)."""
        info = self._call(lambda: self._r.info("replication"))
        return sum(1 for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)
                   and v.get("state") == "online")

    def _t(self, table: str) -> str:
        return f"{self.prefix}:doc:{table}"

    def _k(self, table: str) -> str:
        return f"{self.prefix}:keys:{table}"

    def _d(self, table: str) -> str:
        return f"{self.prefix}:due:{table}"

    def _c(self, key: str) -> str:
        return f"{self.prefix}:claim:{key}"

    def _o(self, owner: str) -> str:
        return f"{self.prefix}:owner:{owner}"

    def _n(self, namespace: str) -> str:
        return f"{self.prefix}:ns:{namespace}"

    def _args(self, owner: str, *more: str) -> list[str]:
        """ARGV of the claim scripts (`_NAMESPACE_OF`): owner, the layout-before claim key prefix, namespace
        hash prefix, the owner's set, counters' hash, counter hash prefix, owner set prefix, then the script's
        own."""
        return [owner, self._c(""), self._n(""), self._o(owner), self._counts(), self._pool(""), self._o(""), *more]

    def _counts(self) -> str:
        return f"{self.prefix}:claim-counts"

    def _pool(self, counter: str) -> str:
        return f"{self.prefix}:pool:{counter}"

    def ping(self) -> None:
        """Raise Unavailable/TimedOut unless the server answers (start-up checks)."""
        self._call(self._r.ping)

    # ---- leases: one active actor per role, fenced ------------------------------------------------------------
    def _lease_keys(self, name: str) -> list[str]:
        return [f"{self.prefix}:lease:{name}", f"{self.prefix}:fence:{name}"]

    def take_lease(self, name: str, holder: str, ttl_ms: int, replacing: str = "") -> int | None:
        """The lease `name` for `holder` with a new fencing token (returned), if it is free, or still holds
        exactly `replacing` (the value of a holder known to be dead); None when another holds it."""
        token = self._call(lambda: self._lease_take(keys=self._lease_keys(name), args=[holder, ttl_ms, replacing]))
        return None if token is None else int(token)

    def renew_lease(self, name: str, holder: str, token: int, ttl_ms: int) -> bool:
        """Extend the lease while `holder` still holds it with `token`; False once it lapsed or was taken."""
        value = f"{holder}|{token}"
        return bool(self._call(lambda: self._lease_renew(keys=self._lease_keys(name), args=[value, ttl_ms, token])))

    def drop_lease(self, name: str, holder: str, token: int) -> None:
        """Give the lease up (a clean stop): the next contender takes it at once instead of after its TTL."""
        self._call(lambda: self._lease_drop(keys=self._lease_keys(name), args=[f"{holder}|{token}"]))

    def lease_of(self, name: str) -> tuple[str, int, float] | None:
        """Who holds lease `name` (holder, token, seconds left), or None when it is free."""
        pipe = self._r.pipeline(transaction=False)
        pipe.get(self._lease_keys(name)[0])
        pipe.pttl(self._lease_keys(name)[0])
        value, pttl = self._call(pipe.execute)
        if value is None:
            return None
        holder, _sep, token = value.rpartition("|")
        return holder, int(token), max(0, int(pttl)) / 1000

    def fenced(self, name: str, token: int) -> RedisStore:
        """This store (the same client) whose every write is refused (Fenced, BUSY) unless lease `name` still
        carries `token`: checked inside each write's script, so no write of a leader that lost its lease
        lands, however long it was paused."""
        view = copy.copy(self)
        view._fence = [self._lease_keys(name)[1], str(token)]
        return view

    # ---- documents -------------------------------------------------------------------------------------------
    def get(self, table: str, key: str) -> dict[str, Any] | None:
        raw = self._call(lambda: self._rb.hget(self._t(table), key))
        return decode(raw) if raw else None

    def put(self, table: str, key: str, doc: dict[str, Any], due: float | None = None,
            tally: Mapping[str, Mapping[str, int]] | None = None) -> None:
        if tally and table not in TALLIED:
            raise ValueError(f"table {table} keeps no tallies (slicex/store/ownership.py TALLIED)")
        counts = json.dumps({c: {f: int(n) for f, n in fields.items() if n} for c, fields in tally.items()},
                            sort_keys=True) if tally else ""
        self._write(self._put, [self._t(table), self._k(table), self._d(table), self._tallied(table)],
                    [key, encode(doc), "" if due is None else repr(float(due)), "1" if table in KEY_INDEXED else "",
                     counts, self._tally(""), "1" if table in TALLIED else ""])

    def delete(self, table: str, key: str) -> bool:
        return bool(self._write(self._delete, [self._t(table), self._k(table), self._d(table), self._tallied(table)],
                                [key, self._tally("")]))

    def _tallied(self, table: str) -> str:
        return f"{self.prefix}:tally-of:{table}"

    def _tally(self, counter: str) -> str:
        return f"{self.prefix}:tally:{counter}"

    def tallies(self, counter: str) -> dict[str, int]:
        found = self._call(lambda: self._r.hgetall(self._tally(counter)))
        return {f: int(n) for f, n in found.items() if int(n)}

    def scan(self, table: str, prefix: str = "") -> list[dict[str, Any]]:
        if prefix and table not in KEY_INDEXED:  # no key index: the hash's matching fields, sorted by key
            found = self._call(lambda: list(self._rb.hscan_iter(self._t(table), match=_glob_escape(prefix) + "*",
                                                                count=1000)))
            return [decode(v) for _k, v in sorted(found)]
        if prefix:  # a range of the table's key index: only the matching documents are read
            start = prefix.encode()  # UTF-8 never holds byte 0xff: every key with the prefix sorts below prefix+0xff
            keys = self._call(lambda: self._r.zrangebylex(self._k(table), b"[" + start, b"(" + start + b"\xff"))
            texts = self._call(lambda: self._rb.hmget(self._t(table), keys)) if keys else []
            return [decode(t) for t in texts if t is not None]  # None: deleted between the two reads
        items = self._call(lambda: self._rb.hgetall(self._t(table)))
        return [decode(items[k]) for k in sorted(items)]

    def due(self, table: str, until: float, limit: int | None = None) -> list[tuple[str, float]]:
        found = self._call(lambda: self._r.zrangebyscore(self._d(table), "-inf", until, start=0,
                                                         num=-1 if limit is None else limit, withscores=True))
        return [(k, float(at)) for k, at in found]

    def page(self, table: str, cursor: str, limit: int) -> tuple[list[dict[str, Any]], str]:
        """A table with a key index: the next `limit` keys after `cursor` (a lexicographic range), then their
        documents. Another: one HSCAN step of its hash (about `limit` fields; a small hash answers whole)."""
        if table in KEY_INDEXED:
            start = b"(" + cursor.encode() if cursor else b"-"
            keys = self._call(lambda: self._r.zrangebylex(self._k(table), start, b"+", start=0, num=limit))
            texts = self._call(lambda: self._rb.hmget(self._t(table), keys)) if keys else []
            return [decode(t) for t in texts if t is not None], (keys[-1] if len(keys) == limit else "")
        nxt, found = self._call(lambda: self._rb.hscan(self._t(table), int(cursor or 0), count=limit))
        return [decode(v) for v in found.values()], ("" if int(nxt) == 0 else str(int(nxt)))

    def reindex(self) -> int:
        """Bring a store of an older layout to this one: every claim in its namespace's hash and its own key
        dropped (issue 33), owner sets of bare claim keys, every document key of a table read by prefix in its
        key index (the others' key indexes dropped), every claim counted again. A migration step
        (deployment/migrations.py): each script is one atomic Redis call and may run any number of times."""
        everything = _glob_escape(self._c("")) + "*"
        claims = self._write(self._index_once, [f"{self.prefix}:ns-indexed"], [*self._args("")[:3], everything])
        docs = self._write(self._keys_once, [f"{self.prefix}:keys-indexed"],
                           [_glob_escape(self._t("")) + "*", self._t(""), self._k("")])
        dropped = self._write(self._migrate_claims, [],
                              self._args("", "", everything, _glob_escape(self._o("")) + "*"))
        self._recount()
        unused = [k for k in self._call(lambda: list(self._r.scan_iter(match=_glob_escape(self._k("")) + "*")))
                  if k[len(self._k("")):] not in KEY_INDEXED]
        if unused:
            self._call(lambda: self._r.unlink(*unused))
        return max(int(claims), 0) + max(int(docs), 0) + int(dropped)

    def _recount(self) -> None:
        """Every counter and counter hash rebuilt from the namespace hashes, in one script."""
        self._write(self._count_all, [f"{self.prefix}:counted"],
                    [*self._args("")[:3], _glob_escape(self._n("")) + "*", self._counts(), self._pool(""), "force",
                     _glob_escape(self._pool("")) + "*"])

    # ---- claims ----------------------------------------------------------------------------------------------
    def claim(self, key: str, owner: str) -> bool:
        return self.claim_all([key], owner)

    def claim_all(self, keys: list[str], owner: str) -> bool:
        if not keys:
            return True
        return bool(self._write(self._claim_all, list(keys), self._args(owner)))

    def release(self, key: str, owner: str) -> bool:
        return self.release_all([key], owner) > 0

    def release_all(self, keys: list[str], owner: str) -> int:
        wanted = sorted(set(keys))
        if not wanted:
            return 0
        return int(self._write(self._release, wanted, self._args(owner)))

    def release_owner(self, owner: str) -> int:
        return int(self._write(self._release_owner, [self._o(owner)], self._args(owner)))

    def reown(self, owner: str, new_owner: str) -> int:
        return int(self._write(self._reown, [self._o(owner), self._o(new_owner)], self._args(owner, new_owner)))

    def owner_of(self, key: str) -> str | None:
        return self._call(lambda: self._r.hget(self._n(namespace_of(key)), key))

    def claims_of(self, owner: str) -> list[str]:
        return sorted(self._call(lambda: self._r.smembers(self._o(owner))))

    def claims_in(self, namespaces: Iterable[str]) -> dict[str, str]:
        """One round trip: the hash of each namespace, pipelined (after a one-off index of older claims)."""
        wanted = sorted(set(namespaces))
        if not wanted:
            return {}
        pipe = self._r.pipeline(transaction=False)
        for ns in wanted:
            pipe.hgetall(self._n(ns))
        out: dict[str, str] = {}
        for found in self._call(pipe.execute):
            out.update(found)
        return out

    def all_claims(self, prefix: str = "") -> dict[str, str]:
        """Every claim (starting with `prefix`): the namespace hashes, read whole (tests and diagnostics)."""
        hashes = self._call(lambda: list(self._r.scan_iter(match=_glob_escape(self._n("")) + "*", count=1000)))
        out: dict[str, str] = {}
        for h in hashes:
            out.update((k, o) for k, o in self._call(lambda h=h: self._r.hgetall(h)).items() if k.startswith(prefix))
        return out

    # ---- claim counters ----------------------------------------------------------------------------------------
    def claim_counts(self, prefix: str = "") -> dict[str, int]:
        """Counter → claims it holds (counters starting with `prefix`): one hash, kept by the claim scripts."""
        counts = self._call(lambda: self._r.hgetall(self._counts()))
        return {c: int(n) for c, n in counts.items() if c.startswith(prefix) and int(n) > 0}

    def claims_under(self, counter: str) -> dict[str, str]:
        return dict(self._call(lambda: self._r.hgetall(self._pool(counter))))

    def claim_changes(self, since: int) -> tuple[int, list[str]]:
        """The store's claims generation now and the counters whose claims changed after generation `since`
        (one MULTI: the generation and a range of a sorted set, as many members as counters changed)."""
        pipe = self._r.pipeline(transaction=True)
        pipe.get(self._counts() + "-gen")
        pipe.zrangebyscore(self._counts() + "-changed", f"({since}", "+inf")
        gen, changed = self._call(pipe.execute)
        return int(gen or 0), list(changed)

    def recount_claims(self, repair: bool = False) -> dict[str, int]:
        """Every counter recomputed from the claims themselves (a scan of the keyspace: start-up checks and
        tests); with `repair`, the kept counters and each counter's hash are rebuilt from them in one script."""
        if repair:
            self._recount()
        counts: dict[str, int] = {}
        for key in self.all_claims():
            c = counter_of(key)
            if c:
                counts[c] = counts.get(c, 0) + 1
        return counts

    # ---- housekeeping ----------------------------------------------------------------------------------------
    def flush(self) -> int:
        """Delete everything under this store's prefix (tests, benchmarks); other prefixes are untouched."""
        keys = self._call(lambda: list(self._r.scan_iter(match=_glob_escape(self.prefix) + ":*", count=1000)))
        for i in range(0, len(keys), 500):
            self._call(lambda batch=keys[i:i + 500]: self._r.unlink(*batch))
        return len(keys)

    def close(self) -> None:
        self._r.close()
        self._rb.close()


def _sentinel_client(url: SentinelUrl, timeout: float, decode_responses: bool) -> redis.Redis:
    """A client of the primary the sentinels name now: a connection lost (or refused as READONLY by a demoted
    primary) asks them again, so it follows a failover. Short timeouts and one retry (which asks the
    sentinels again): a primary cut off by a partition drops packets instead of refusing them, and a call
    must answer BUSY in seconds, not wait out the default retries. A sentinel that does not answer within a
    second is passed over for the next."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry
    from redis.sentinel import Sentinel

    quick = min(timeout, 1.0)
    sentinels = Sentinel(list(url.sentinels), sentinel_kwargs={"socket_timeout": quick,
                                                               "socket_connect_timeout": quick})
    return sentinels.master_for(url.master, db=url.db, password=url.password,
                                socket_timeout=max(min(timeout, 3.0), url.wait_ms / 1000 + 1),
                                socket_connect_timeout=quick, retry=Retry(NoBackoff(), 1),
                                decode_responses=decode_responses, health_check_interval=30)
