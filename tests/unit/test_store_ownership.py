"""The ownership declaration covers the code base and the docs: every table name and claim namespace the code
uses has an owner in slicex/store/ownership.py, docs/architecture.md's table is the declaration's, and the
broker's placement reads its own claims only (no listing of every claim in the store)."""

from __future__ import annotations

import ast
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric import rsa

from broker.broker import Broker
from protocol.messages import demands_of
from resources import export_substrate
from rspec.request import parse_request
from rspec.substrate import default_substrate
from slicex.clock import ManualClock
from slicex.inventory import UNIT_KINDS
from slicex.store.ownership import KEY_INDEXED, OWNERSHIP, markdown_table
from slicex.store.sqlite_store import SqliteStore
from slicex.term import Term
from tests.factories import request_rspec, vm

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = {"get", "put", "delete", "scan"}
CLAIMS = {"claim", "claim_all", "release", "owner_of"}
SKIP = {".venv", "tests", "build", ".git"}


def _module_of(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = ["fpga_aggregate" if p == "fpga-aggregate" else p for p in rel.parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources() -> dict[str, tuple[Path, ast.Module]]:
    out = {}
    for path in ROOT.rglob("*.py"):
        if SKIP & set(path.relative_to(ROOT).parts):
            continue
        out[_module_of(path)] = (path, ast.parse(path.read_text()))
    return out


def _constants(sources: dict[str, tuple[Path, ast.Module]]) -> dict[str, dict[str, str]]:
    """Per module, its names bound to a string: module-level assignments, then names imported from a module."""
    own = {m: {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
               and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
               for t in n.targets if isinstance(t, ast.Name)} for m, (_, tree) in sources.items()}
    out = {m: dict(names) for m, names in own.items()}
    for m, (_, tree) in sources.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in own:
                for alias in node.names:
                    if alias.name in own[node.module]:
                        out[m][alias.asname or alias.name] = own[node.module][alias.name]
    return out


def _store_calls(names: set[str]):
    """(module, call, its first argument, the module's string names) of every store call of these methods."""
    sources = _sources()
    constants = _constants(sources)
    for m, (path, tree) in sources.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in names \
                    and node.args and "store" in ast.unparse(node.func.value).lower():
                yield f"{path.relative_to(ROOT)}:{node.lineno}", node.args[0], constants[m]


def test_every_table_the_code_uses_has_an_owner():
    declared = {h.name for h in OWNERSHIP if not h.claims}
    seen, unresolved, undeclared = set(), [], []
    for where, arg, names in _store_calls(DOCUMENTS):
        table = arg.value if isinstance(arg, ast.Constant) else names.get(getattr(arg, "id", ""))
        if table is None:
            unresolved.append(f"{where}: {ast.unparse(arg)}")
        elif table not in declared:
            undeclared.append(f"{where}: {table}")
        seen.add(table)
    # chapi_authority's one loop over a tuple of its tables is the only table chosen at run time
    assert [u for u in unresolved if "chapi_authority" not in u] == []
    assert undeclared == [], "tables with no owner in slicex/store/ownership.py"
    assert len(seen - {None}) >= 25


NAMESPACE_HEAD = re.compile(r"^([a-z][a-z_-]*):$")


def _key_heads(tree: ast.Module) -> set[str]:
    """Namespaces a module spells as the head of a key: a string `name:` or an f-string starting `name:{`."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
            node = node.values[0]
        elif not isinstance(node, ast.Constant):
            continue
        if isinstance(node.value, str) and (m := NAMESPACE_HEAD.match(node.value)):
            out.add(m.group(1))
    return out


def test_every_claim_namespace_the_code_uses_has_an_owner():
    """Modules that claim (and the resource kinds, resources/*.py, which name the units the broker claims):
    every key head they spell is a declared namespace."""
    declared = {h.name for h in OWNERSHIP if h.claims}
    sources = _sources()
    claiming = {where.split(":")[0] for where, _, _ in _store_calls(CLAIMS)} | {
        str(p.relative_to(ROOT)) for p in (ROOT / "resources").glob("*.py")}
    heads = {str(path.relative_to(ROOT)): _key_heads(tree) for path, tree in sources.values()
             if str(path.relative_to(ROOT)) in claiming}
    assert {"sm-lock", "leased", "sa_slice", "ch_project", "quota-lock", "core", "vlan"} <= set().union(*heads.values())
    owners = {"ticket"}  # the broker's ticket groups (`ticket:<hex>`) own claims; they are not claim keys
    assert {f: h - declared - owners for f, h in heads.items() if h - declared - owners} == {}


def test_the_architecture_doc_shows_the_declaration():
    assert markdown_table() in (ROOT / "docs" / "architecture.md").read_text(), \
        "docs/architecture.md's ownership table differs from slicex.store.ownership.markdown_table()"


class Listing(SqliteStore):
    """A store that notes which claims are listed."""

    def __init__(self) -> None:
        super().__init__(":memory:")
        self.listed: list[Any] = []

    def claims_in(self, namespaces):
        self.listed.append(sorted(namespaces))
        return super().claims_in(namespaces)

    def all_claims(self, prefix: str = "") -> dict[str, str]:
        self.listed.append(f"all_claims({prefix!r})")
        return super().all_claims(prefix)


def test_placement_reads_the_brokers_own_claims_and_no_other_actors():
    sub = default_substrate("t.org")
    store = Listing()
    store.claim_all(["leased:core:x:0", "sm-lock:r", "sa_slice:s", "quota-lock:u"], "others")
    broker = Broker("broker", store, rsa.generate_private_key(public_exponent=65537, key_size=2048),
                    authority="auth")
    broker.accept(export_substrate(sub, "auth", "broker"))
    now = ManualClock().now()
    demands = demands_of(parse_request(request_rspec([vm("a")])), {"a": "r-a"})
    got = broker.place("sm", demands, Term(now, now + timedelta(minutes=10)), now)
    assert got.tickets["r-a"].units
    # a placement reads the pools it asks about (`claims_under`), never a listing of other namespaces
    assert all(listed == sorted(UNIT_KINDS) for listed in store.listed), store.listed


def test_every_table_read_by_prefix_keeps_a_key_index():
    """A prefix scan of a table outside KEY_INDEXED still answers on Redis (HSCAN), but reads the whole hash:
    every table the code scans by prefix is declared."""
    sources = _sources()
    constants = _constants(sources)
    scanned = set()
    for m, (_path, tree) in sources.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "scan" \
                    and len(node.args) > 1 and "store" in ast.unparse(node.func.value).lower():
                arg = node.args[0]
                scanned.add(arg.value if isinstance(arg, ast.Constant) else constants[m].get(getattr(arg, "id", "")))
    assert scanned - {None} and scanned <= KEY_INDEXED, scanned - KEY_INDEXED
