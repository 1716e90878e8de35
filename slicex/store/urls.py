"""Redis Sentinel store URLs: `redis+sentinel://[:PASSWORD@]HOST:PORT[,HOST:PORT...]/MASTER[/DB][?OPTIONS]`.

The hosts are the sentinels (any one that answers names the primary of MASTER, the name the sentinels monitor
it by); DB is the database number on the primary (0 by default); PASSWORD, if any, is the Redis servers'
(`requirepass`), not the sentinels'. OPTIONS: `replicas=N` (how many replicas must acknowledge each write
before it is answered, by WAIT; 1 by default, 0 for none) and `wait_ms=M` (how long a write waits for them,
1000 by default). A pure parser: a wrong URL is a ValueError saying what is wrong and what it should be,
which slicex.yaml's check turns into a configuration error naming the key."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qsl, unquote

SENTINEL_SCHEME = "redis+sentinel://"
DEFAULT_SENTINEL_PORT = 26379
FORM = "redis+sentinel://HOST:PORT[,HOST:PORT...]/MASTER[/DB]"


@dataclass(frozen=True)
class SentinelUrl:
    """Where the sentinels are, which primary they watch, and what a write waits for."""

    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int = 0
    password: str | None = None
    replicas: int = 1
    wait_ms: int = 1000

    def shown(self) -> str:
        """The URL as messages and logs show it (no password)."""
        hosts = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in self.sentinels)
        auth = ":***@" if self.password else ""
        return f"{SENTINEL_SCHEME}{auth}{hosts}/{self.master}/{self.db}"


def hide_password(url: str) -> str:
    """`url` with any password in it starred (for error messages about a URL that may not even parse)."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest.split("/", 1)[0]:
        return url
    userinfo, _at, tail = rest.partition("@")
    user = userinfo.partition(":")[0]
    return f"{scheme}://{user}:***@{tail}"


def is_sentinel_url(url: str) -> bool:
    return url.startswith(SENTINEL_SCHEME)


def _host_port(text: str) -> tuple[str, int]:
    """One sentinel: `HOST:PORT`, `[IPv6]:PORT`, or a bare host (port 26379)."""
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or not host or (rest and not rest.startswith(":")):
            raise ValueError(f"sentinel {text!r}: an IPv6 address is written [ADDRESS]:PORT")
        port_text = rest[1:] if rest else ""
    else:
        host, _sep, port_text = text.partition(":")
        if ":" in port_text:
            raise ValueError(f"sentinel {text!r}: write an IPv6 address as [ADDRESS]:PORT")
    if not host:
        raise ValueError(f"sentinel {text!r} has no host")
    if not port_text:
        return host, DEFAULT_SENTINEL_PORT
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"sentinel {text!r}: the port must be a number from 1 to 65535")
    return host, int(port_text)


def _option(name: str, value: str, low: int, high: int) -> int:
    if not value.isdigit() or not low <= int(value) <= high:
        raise ValueError(f"option {name}={value!r}: a whole number from {low} to {high}")
    return int(value)


def parse_sentinel_url(url: str) -> SentinelUrl:
    """The parts of a `redis+sentinel://` URL; ValueError saying what is wrong (the password never shown)."""
    if not is_sentinel_url(url):
        raise ValueError(f"not a Sentinel store URL: it starts with {SENTINEL_SCHEME}")
    rest, _q, query = url[len(SENTINEL_SCHEME):].partition("?")
    if "#" in rest or "#" in query:
        raise ValueError(f"a Sentinel store URL has no #fragment; use {FORM}")
    netloc, _slash, path = rest.partition("/")
    password = None
    if "@" in netloc:
        userinfo, _at, netloc = netloc.rpartition("@")
        _user, _colon, secret = userinfo.partition(":")
        password = unquote(secret) or None
    if not netloc:
        raise ValueError(f"no sentinel named: use {FORM}")
    sentinels = tuple(_host_port(part.strip()) for part in netloc.split(","))
    if len(set(sentinels)) != len(sentinels):
        raise ValueError("a sentinel is named twice")
    parts = path.split("/") if path else []
    if parts and parts[-1] == "":
        parts.pop()  # a trailing slash
    if not parts or not parts[0]:
        raise ValueError(f"no master name: the name the sentinels monitor the primary by (`sentinel monitor "
                         f"NAME ...`) follows the hosts; use {FORM}")
    if len(parts) > 2:
        raise ValueError(f"too many path parts {'/'.join(parts)!r}: use {FORM}")
    db = 0
    if len(parts) == 2:
        if not parts[1].isdigit():
            raise ValueError(f"database {parts[1]!r}: a number (0 by default) after the master name")
        db = int(parts[1])
    options = {"replicas": 1, "wait_ms": 1000}
    for key, value in parse_qsl(query, keep_blank_values=True, strict_parsing=False):
        if key == "replicas":
            options[key] = _option(key, value, 0, 16)
        elif key == "wait_ms":
            options[key] = _option(key, value, 1, 60000)
        else:
            raise ValueError(f"unknown option {key!r}: the options are replicas=N and wait_ms=M")
    return SentinelUrl(sentinels, unquote(parts[0]), db, password, options["replicas"], options["wait_ms"])
