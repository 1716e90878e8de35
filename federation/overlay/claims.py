"""The overlay's Redis edge: address claims as an atomic put-if-absent with expiry, and namespace
configurations. Holds no policy: `core` decides what to claim and what an answer means.

Keys (under a prefix, `slicex:overlay` by default):
  <prefix>:ns:<namespace>              the namespace configuration (JSON); defined once, no expiry
  <prefix>:addr:<namespace>:<address>  the claim: value = the holder (JSON), expiry = the lease

A claim is one Lua script, so it is atomic across every client of the server: absent (never claimed,
released, or expired, since Redis never returns an expired key) -> SET with PX lease, WON; present with our
exact value -> PEXPIRE, RENEWED; present with another value -> TAKEN, and the current holder is returned.
Release is compare-and-delete. Redis's own expiry is the one clock every claimant shares."""

from __future__ import annotations

from ipaddress import IPv4Address

import redis

from federation.overlay.core import Holder, NamespaceConfig, Outcome
from slicex.errors import BadArgs, DbError, SearchFailed
from slicex.store.redis_store import redact, redis_call

DEFAULT_PREFIX = "slicex:overlay"

_CLAIM = """
local cur = redis.call('GET', KEYS[1])
if not cur then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return {1, ARGV[1]}
end
if cur == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {2, cur}
end
return {0, cur}
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""
_OUTCOMES = {1: Outcome.WON, 2: Outcome.RENEWED, 0: Outcome.TAKEN}


class RedisClaims:
    """Claims and namespace configurations in one Redis database. Thread-safe (redis-py pools connections)."""

    def __init__(self, url: str, prefix: str = DEFAULT_PREFIX, timeout: float = 5.0):
        self.url = url
        self.prefix = prefix
        self._shown = redact(url)
        try:
            self._r = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout,
                                           decode_responses=True)
        except ValueError as exc:
            raise DbError(f"bad Redis URL {self._shown}: {exc}; use redis://HOST:PORT/DB") from None
        self._claim = self._r.register_script(_CLAIM)
        self._release = self._r.register_script(_RELEASE)

    def _call(self, fn):
        return redis_call(self._shown, fn)

    def _ns(self, namespace: str) -> str:
        return f"{self.prefix}:ns:{namespace}"

    def _addr(self, namespace: str, address: IPv4Address) -> str:
        return f"{self.prefix}:addr:{namespace}:{address}"

    def ping(self) -> None:
        self._call(self._r.ping)

    # ---- namespaces ------------------------------------------------------------------------------------------
    def define(self, config: NamespaceConfig) -> NamespaceConfig:
        """Define a namespace (first writer wins). Defining it again with the same settings is a no-op; with
        other settings it is refused, since live claims were made under the first ones."""
        text = config.to_json()
        if self._call(lambda: self._r.set(self._ns(config.name), text, nx=True)):
            return config
        existing = self.namespace(config.name)
        if existing != config:
            raise BadArgs(f"namespace {config.name} is already defined as {existing.network}, lease "
                          f"{existing.lease:g} s; delete it first or use those settings")
        return existing

    def namespace(self, name: str) -> NamespaceConfig:
        text = self._call(lambda: self._r.get(self._ns(name)))
        if text is None:
            raise SearchFailed(f"namespace {name} does not exist; define it first (python -m federation.overlay "
                               f"define {name} NETWORK)")
        return NamespaceConfig.from_json(name, text)

    def undefine(self, name: str) -> int:
        """Delete a namespace and every claim in it (slice teardown). Returns how many keys went."""
        keys = [self._ns(name)] + self._call(
            lambda: list(self._r.scan_iter(match=self._glob(name), count=1000)))
        return int(self._call(lambda: self._r.delete(*keys)))

    def _glob(self, namespace: str) -> str:
        escaped = "".join("\\" + c if c in "*?[]\\" else c for c in f"{self.prefix}:addr:{namespace}:")
        return escaped + "*"

    # ---- claims ----------------------------------------------------------------------------------------------
    def claim(self, namespace: str, address: IPv4Address, holder: Holder, lease: float) -> tuple[Outcome, Holder]:
        """Put-if-absent (or renew) with expiry `lease` seconds. Returns the outcome and the holder now."""
        ms = max(1, round(lease * 1000))
        code, value = self._call(lambda: self._claim(keys=[self._addr(namespace, address)],
                                                     args=[holder.encode(), ms]))
        return _OUTCOMES[int(code)], (holder if int(code) else Holder.decode(value))

    def release(self, namespace: str, address: IPv4Address, holder: Holder) -> bool:
        """Free the address if (and only if) `holder` still holds it."""
        return bool(self._call(lambda: self._release(keys=[self._addr(namespace, address)],
                                                     args=[holder.encode()])))

    def lookup(self, namespace: str, address: IPv4Address) -> Holder | None:
        text = self._call(lambda: self._r.get(self._addr(namespace, address)))
        return None if text is None else Holder.decode(text)

    def remaining(self, namespace: str, address: IPv4Address) -> float | None:
        """Seconds left on the claim by the server's clock, or None when the address is free."""
        ms = int(self._call(lambda: self._r.pttl(self._addr(namespace, address))))
        return None if ms < 0 else ms / 1000

    def holders(self, namespace: str) -> dict[IPv4Address, Holder]:
        keys = self._call(lambda: list(self._r.scan_iter(match=self._glob(namespace), count=1000)))
        if not keys:
            return {}
        values = self._call(lambda: self._r.mget(keys))
        return {IPv4Address(k.rsplit(":", 1)[1]): Holder.decode(v)
                for k, v in zip(keys, values, strict=True) if v is not None}

    def close(self) -> None:
        self._r.close()
