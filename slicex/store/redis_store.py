"""Redis store: shared state for several processes (AM API workers, actors on other hosts).

Same behaviour as the SQLite store. Documents are hashes per table; claims are keys whose value is the
owner; `claim_all` runs as one Lua script, so it is atomic across every client of the server. A server that
does not answer is UNAVAILABLE (11) or TIMEDOUT (8), never a crash."""

from __future__ import annotations

import json
from typing import Any

import redis

from slicex.errors import TimedOut, Unavailable

_CLAIM_ALL = """
for i, key in ipairs(KEYS) do
  local owner = redis.call('GET', key)
  if owner and owner ~= ARGV[1] then return 0 end
end
for i, key in ipairs(KEYS) do
  redis.call('SET', key, ARGV[1])
  redis.call('SADD', ARGV[2], key)
end
return 1
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('SREM', ARGV[2], KEYS[1])
  return 1
end
return 0
"""


class RedisStore:
    def __init__(self, url: str, prefix: str = "slicex", timeout: float = 5.0):
        self.url = url
        self.prefix = prefix
        self._r = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout,
                                       decode_responses=True)
        self._claim_all = self._r.register_script(_CLAIM_ALL)
        self._release = self._r.register_script(_RELEASE)

    def _call(self, fn):
        try:
            return fn()
        except redis.exceptions.TimeoutError as exc:
            raise TimedOut(f"Redis at {self.url} did not answer in time: {exc}; retry shortly") from None
        except redis.exceptions.ConnectionError as exc:
            raise Unavailable(f"Redis at {self.url} is not answering: {exc}; retry when it is back") from None

    def _t(self, table: str) -> str:
        return f"{self.prefix}:doc:{table}"

    def _c(self, key: str) -> str:
        return f"{self.prefix}:claim:{key}"

    def _o(self, owner: str) -> str:
        return f"{self.prefix}:owner:{owner}"

    def get(self, table: str, key: str) -> dict[str, Any] | None:
        raw = self._call(lambda: self._r.hget(self._t(table), key))
        return json.loads(raw) if raw else None

    def put(self, table: str, key: str, doc: dict[str, Any]) -> None:
        self._call(lambda: self._r.hset(self._t(table), key, json.dumps(doc, sort_keys=True)))

    def delete(self, table: str, key: str) -> bool:
        return bool(self._call(lambda: self._r.hdel(self._t(table), key)))

    def scan(self, table: str) -> list[dict[str, Any]]:
        items = self._call(lambda: self._r.hgetall(self._t(table)))
        return [json.loads(items[k]) for k in sorted(items)]

    def claim(self, key: str, owner: str) -> bool:
        return self.claim_all([key], owner)

    def claim_all(self, keys: list[str], owner: str) -> bool:
        if not keys:
            return True
        return bool(self._call(lambda: self._claim_all(keys=[self._c(k) for k in keys], args=[owner, self._o(owner)])))

    def release(self, key: str, owner: str) -> bool:
        return bool(self._call(lambda: self._release(keys=[self._c(key)], args=[owner, self._o(owner)])))

    def release_owner(self, owner: str) -> int:
        return sum(self.release(k, owner) for k in self.claims_of(owner))

    def owner_of(self, key: str) -> str | None:
        return self._call(lambda: self._r.get(self._c(key)))

    def claims_of(self, owner: str) -> list[str]:
        n = len(self._c(""))
        return sorted(k[n:] for k in self._call(lambda: self._r.smembers(self._o(owner))))

    def all_claims(self, prefix: str = "") -> dict[str, str]:
        pattern = self._c(prefix) + "*"
        keys = list(self._call(lambda: list(self._r.scan_iter(match=pattern, count=1000))))
        if not keys:
            return {}
        owners = self._call(lambda: self._r.mget(keys))
        n = len(self._c(""))
        return {k[n:]: o for k, o in zip(keys, owners, strict=True) if o is not None}

    def flush(self) -> None:
        """Delete everything under this store's prefix (tests)."""
        for k in self._call(lambda: list(self._r.scan_iter(match=f"{self.prefix}:*", count=1000))):
            self._r.delete(k)

    def close(self) -> None:
        self._r.close()
