"""`install` services of netns nodes: tar archives from the operator's file servers, unpacked inside the node.

GENI's `<services><install url="..." install_path="/local"/></services>`: at every boot, before the execute
services, the archive at `url` is unpacked into `install_path` inside the node, as the node's first user (the
directory is made for them when it does not exist). Nodes have no route off their links, so the aggregate
fetches the archive, and only from the URL prefixes its operator lists (`netns: {install_sources: [...]}`):
an aggregate that fetched whatever URL a request names would fetch the host's own services for anyone (Redis
and the actors listen on 127.0.0.1). It reads at most `max_bytes`, gives up after `timeout`, follows no
redirect, and pipes the bytes into `tar` run inside the node; the node's answer is bounded like any other."""

from __future__ import annotations

import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from authority.substrate.container import NodeContainer
from slicex.errors import BadArgs, ServerError

DEFAULT_MAX_BYTES = 256 * 2**20
# as the node's root: make the directory (the user's when it is new), then unpack as the user
_UNPACK = """P=$1; U=$2
if [ ! -e "$P" ]; then mkdir -p "$P" && chown "$U" "$P"; fi
shift 2
exec setpriv --reuid="$U" --regid="$(id -g "$U")" --init-groups --inh-caps=-all tar -x "$@" -C "$P" -f - 2>&1
"""
# tar does not recognise compression on its standard input: the host tells it, from the archive's first bytes
COMPRESSION = ((b"\x1f\x8b", "-z"), (b"BZh", "-j"), (b"\xfd7zXZ\x00", "-J"), (b"\x28\xb5\x2f\xfd", "--zstd"))


def compression_flag(head: bytes) -> list[str]:
    """tar's option for an archive starting with `head` (none for a plain tar)."""
    return next(([flag] for magic, flag in COMPRESSION if head.startswith(magic)), [])


@dataclass(frozen=True)
class Install:
    url: str
    path: str


def allowed_source(url: str, sources: Iterable[str]) -> bool:
    """Whether `url` lies under one of the operator's prefixes: the same scheme and host, a path below the
    prefix's (so `http://files.example` admits neither `http://files.example.evil` nor another port)."""
    u = urllib.parse.urlsplit(url)
    if u.scheme not in ("http", "https") or not u.netloc or u.username or u.password:
        return False
    for source in sources:
        s = urllib.parse.urlsplit(source)
        base = s.path if s.path.endswith("/") else s.path + "/"
        if (u.scheme, u.netloc.lower()) == (s.scheme, s.netloc.lower()) and (u.path + "/").startswith(base):
            return True
    return False


def installs_of(details: Mapping, client_id: str, sources: Iterable[str]) -> list[Install]:
    """The node's install services, refused when the node is created rather than discovered at boot: a URL
    outside the operator's sources, a relative or odd install path."""
    sources = list(sources)
    out = []
    for n, s in enumerate(details.get("install") or (), start=1):
        url, path = str(s.get("url") or ""), str(s.get("install_path") or "")
        if not path.startswith("/") or "\0" in path or "\n" in path or len(path) > 1024:
            raise BadArgs(f"node {client_id}: install service {n}: install_path {path!r} must be an absolute path")
        if not allowed_source(url, sources):
            where = ", ".join(sources) or "none are configured (netns: install_sources in slicex.yaml)"
            raise BadArgs(f"node {client_id}: install service {n}: {url!r} is not on a file server this aggregate "
                          f"fetches from ({where})")
        out.append(Install(url, path))
    return out


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001 - urllib's signature
        raise urllib.error.HTTPError(req.full_url, code, f"redirected to {newurl}: not followed", headers, fp)


def fetch(url: str, max_bytes: int = DEFAULT_MAX_BYTES, timeout: float = 60.0) -> Path:
    """The archive at `url` in a temporary file (the caller removes it); at most `max_bytes`, no redirect."""
    opener = urllib.request.build_opener(_NoRedirect)
    out = Path(tempfile.mkstemp(prefix="slicex-install-")[1])
    try:
        with opener.open(urllib.request.Request(url, headers={"User-Agent": "slicex"}), timeout=timeout) as r, \
                open(out, "wb") as f:
            size = 0
            while chunk := r.read(1 << 16):
                size += len(chunk)
                if size > max_bytes:
                    raise ServerError(f"{url} is larger than {max_bytes // 2**20} MB (netns: install_max_mb)")
                f.write(chunk)
        return out
    except urllib.error.HTTPError as exc:
        out.unlink(missing_ok=True)
        raise ServerError(f"fetching {url}: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        out.unlink(missing_ok=True)
        raise ServerError(f"fetching {url}: {getattr(exc, 'reason', None) or exc}") from None
    except ServerError:
        out.unlink(missing_ok=True)
        raise


def install_all(container: NodeContainer, installs: list[Install], user: str, client_id: str,
                max_bytes: int = DEFAULT_MAX_BYTES) -> None:
    """Fetch and unpack each archive in turn inside the node as `user`; the first that fails stops the boot,
    named with tar's or the server's reason."""
    for n, inst in enumerate(installs, start=1):
        archive = fetch(inst.url, max_bytes)
        try:
            with open(archive, "rb") as f:
                flag = compression_flag(f.read(8))
            rc, out = container.attach(["/bin/sh", "-c", _UNPACK, "slicex-install", inst.path, user, *flag],
                                       timeout=120, limit=16 * 1024, stdin=archive)
        finally:
            archive.unlink(missing_ok=True)
        if rc != 0:
            why = out.decode(errors="replace").strip().splitlines()[-1:] or ["cut off"]
            raise ServerError(f"node {client_id}: install service {n} ({inst.url} into {inst.path}) failed"
                              f"{'' if rc is None else f' with {rc}'}: {why[0][:300]}")
