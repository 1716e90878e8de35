"""The house as docs/architecture.md draws it: each actor in its own package, speaking to the others only
through the protocol, and a shared kernel that knows no actor.

An import across actors couples one actor to another's internals (its policy module, its records, its
drivers), which is what the protocol is for; this test reads every module's imports (AST, so imports inside
functions count too) and fails naming the file, the line and the import."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The actors: the AM API edge, the slice manager, the authority with its substrate drivers, the broker, and
# operations (dashboard, metrics, snapshots, accounting, quotas). `deployment/` wires them (it alone may import
# them all), as do the command line and the tests.
ACTORS = ("am", "slice_manager", "authority", "broker", "operations")
# What every actor may use: the shared kernel and the libraries of the field (RSpec, NDL, stitching, the
# FPGA model), and the protocol the actors speak.
SHARED = ("slicex", "protocol", "resources", "rspec", "stitching", "fpga_aggregate", "clearinghouse", "federation")
# Edges still crossing an actor boundary, each with the reason it is allowed. The test fails when one of these
# disappears too, so the list only shrinks and stays true.
ALLOWED: dict[tuple[str, str], str] = {}


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
    return found


def _crossings(packages: tuple[str, ...], forbidden: tuple[str, ...]) -> list[tuple[str, int, str]]:
    out = []
    for pkg in packages:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            for line, module in _imports(path):
                top = module.split(".")[0]
                if top in forbidden and top != pkg:
                    out.append((str(path.relative_to(ROOT)), line, module))
    return out


def test_no_actor_imports_another_actor_except_through_the_protocol():
    crossings = _crossings(ACTORS, ACTORS)
    unexplained = [c for c in crossings if (c[0], c[2]) not in ALLOWED]
    assert unexplained == [], "imports across actors (use protocol/):\n" + "\n".join(
        f"  {f}:{line}: {m}" for f, line, m in unexplained)
    gone = set(ALLOWED) - {(f, m) for f, _, m in crossings}
    assert not gone, f"allowed crossings that no longer exist (remove them from ALLOWED): {sorted(gone)}"


def test_the_shared_kernel_and_the_libraries_import_no_actor():
    libraries = tuple(p for p in SHARED if (ROOT / p).is_dir()) + ("fpga-aggregate",)
    crossings = _crossings(libraries, (*ACTORS, "deployment"))
    allowed_substrate_helpers = {  # host-network helpers the overlay and the experiment runner share with netns
        "authority.substrate", "authority.substrate.hostnet", "authority.substrate.netns_plan", "am.api"}
    crossings = [c for c in crossings if c[2] not in allowed_substrate_helpers]
    assert crossings == [], "\n".join(f"  {f}:{line}: {m}" for f, line, m in crossings)


def test_every_package_named_in_the_architecture_exists_and_is_installed():
    setup = (ROOT / "setup.py").read_text()
    for pkg in (*ACTORS, "deployment", *SHARED):
        if pkg == "protocol" and not (ROOT / pkg).exists():
            continue  # not yet
        assert (ROOT / pkg / "__init__.py").exists() or pkg == "fpga_aggregate", pkg
        assert f'"{pkg}"' in setup or not (ROOT / pkg).exists(), f"{pkg} is not in setup.py's PACKAGES"
