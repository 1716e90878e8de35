"""The omni configuration a deployment hands its users (framework `gcf`, DESIGN §4)."""

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

[{user}]
urn = urn:publicid:IDN+{authority}+user+{user}
keys = {home.user_ssh_pub(user)}

[aggregate_nicknames]
slicex = urn:publicid:IDN+{authority}+authority+am,{am_url}
"""


def write(home: Home, user: str, authority: str, sa_url: str, am_url: str) -> Path:
    home.omni_config.write_text(render(home, user, authority, sa_url, am_url))
    return home.omni_config
