"""The omni configuration a deployment hands its users: framework `gcf` (the slice authority's own protocol,
DESIGN §4) or `chapi` (the Common Federation API: CH, SA and MA on the CH API port, docs/federation.md)."""

from __future__ import annotations

from pathlib import Path

from slicex.home import Home


def render(home: Home, user: str, authority: str, sa_url: str, am_url: str) -> str:
    return f"""# omni configuration for slicex (written by `slicex`; framework gcf)
# Use:  omni -c {home.omni_config} -a slicex -V3 getversion
[omni]
default_cf = slicex
users = {user}
default_project =

[slicex]
type = gcf
authority = {authority}
ch = {sa_url}
sa = {sa_url}
cert = {home.user_cert(user)}
key = {home.user_key(user)}

{_tail(home, user, authority, am_url)}"""


def render_chapi(home: Home, user: str, authority: str, chapi_url: str, am_url: str, project: str | None,
                 path: Path | None = None) -> str:
    """omni's `chapi` framework with the CH, SA and MA URLs given (no service lookups needed) and the v1 method
    names omni speaks by default. Without a project, `useprojects = false`: slices are then
    `urn:publicid:IDN+<authority>+slice+<name>`, the same ones the gcf framework makes."""
    base = chapi_url.rstrip("/")
    projects = f"default_project = {project}" if project else "useprojects = false"
    return f"""# omni configuration for slicex (written by `slicex omni-config --framework chapi`)
# Use:  omni -c {path or home.omni_config} createslice NAME   (then -a slicex -V3 allocate NAME request.xml ...)
[omni]
default_cf = slicex
users = {user}

[slicex]
type = chapi
authority = {authority}
ch = {base}/CH
sa = {base}/SA
ma = {base}/MA
cert = {home.user_cert(user)}
key = {home.user_key(user)}
{projects}

{_tail(home, user, authority, am_url)}"""


def _tail(home: Home, user: str, authority: str, am_url: str) -> str:
    return f"""[{user}]
urn = urn:publicid:IDN+{authority}+user+{user}
keys = {home.user_ssh_pub(user)}

[aggregate_nicknames]
slicex = urn:publicid:IDN+{authority}+authority+am,{am_url}
"""


def write(home: Home, user: str, authority: str, sa_url: str, am_url: str) -> Path:
    home.omni_config.write_text(render(home, user, authority, sa_url, am_url))
    return home.omni_config


def write_chapi(home: Home, user: str, authority: str, chapi_url: str, am_url: str, project: str | None,
                path: Path | None = None) -> Path:
    target = path or home.omni_config
    target.write_text(render_chapi(home, user, authority, chapi_url, am_url, project, target))
    return target
