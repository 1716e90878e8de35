"""Every XML-RPC surface of slicex is served through the one endpoint helper (slicex/endpoint.py): no module
but the helper and the server it stands on dispatches XML-RPC calls itself.

Read from the source (AST), so a new surface written with its own dispatcher — xmlrpc.server, a subclass of
the shared server or its request handler, a server built with its own dispatch function, or a dispatch
function put on a server by hand — fails here."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVER_MODULES = {"slicex/tls_xmlrpc.py", "slicex/endpoint.py"}
FLOORS = {"bench/tls_floor.py"}
"""Not slicex's surfaces: the naive xmlrpc.server slicex is benchmarked against, on purpose its own dispatcher."""
SERVERS = {"XmlRpcServer", "TlsXmlRpcServer"}
SURFACES = {"deployment/service.py", "federation/sep/server.py", "clearinghouse/chapi_edge.py", "stitching/server.py",
            "slicex/actor_rpc.py"}


def _sources() -> dict[str, ast.Module]:
    out = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT).as_posix()
        if rel.split("/")[0] in {".venv", "tests", "build"} or "/." in f"/{rel}":
            continue
        out[rel] = ast.parse(path.read_text(), rel)
    return out


def _name(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _own_dispatchers(tree: ast.Module) -> list[str]:
    """What in one module serves XML-RPC other than through the helper."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] + [getattr(node, "module", "") or ""]
            if any(n and (n.startswith("xmlrpc.server") or n.startswith("SimpleXMLRPC")) for n in names):
                found.append(f"line {node.lineno}: imports xmlrpc.server")
        elif isinstance(node, ast.ClassDef):
            bases = {_name(b) for b in node.bases}
            if bases & (SERVERS | {"_Handler"}):
                found.append(f"line {node.lineno}: class {node.name} subclasses the shared server or its handler")
        elif isinstance(node, ast.Call) and _name(node.func) in SERVERS:
            positional = 2 if _name(node.func) == "TlsXmlRpcServer" else 1
            if len(node.args) > positional or {k.arg for k in node.keywords} & {"dispatch", "reject"}:
                found.append(f"line {node.lineno}: builds a server with its own dispatch function")
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                    if isinstance(t, ast.Attribute) and t.attr in {"dispatch", "reject"}:
                        found.append(f"line {node.lineno}: sets a server's {t.attr} by hand")
    return found


def test_no_module_but_the_helper_dispatches_xml_rpc():
    offenders = {rel: found for rel, tree in _sources().items()
                 if rel not in SERVER_MODULES | FLOORS and (found := _own_dispatchers(tree))}
    assert not offenders, f"serve these through slicex/endpoint.py (Endpoint, XmlRpcServer.answer): {offenders}"


def test_every_surface_answers_with_an_endpoint():
    """The servers slicex runs (AM v3 and v2 and the slice authority in a deployment, the exchange point, the
    CH API, the path service, the actors' RPC) each get their surface with `answer`."""
    sources = _sources()
    builds = {rel for rel, tree in sources.items() if rel not in SERVER_MODULES
              and any(isinstance(n, ast.Call) and _name(n.func) in SERVERS for n in ast.walk(tree))}
    answers = {rel for rel, tree in sources.items()
               if any(isinstance(n, ast.Call) and _name(n.func) == "answer" for n in ast.walk(tree))}
    assert builds == SURFACES, "a new XML-RPC server: serve it through slicex/endpoint.py and list it here"
    assert builds <= answers


def test_the_check_sees_a_dispatcher_of_its_own():
    own = ast.parse("from slicex.tls_xmlrpc import TlsXmlRpcServer\n"
                    "s = TlsXmlRpcServer(addr, ctx, lambda m, p, c: None, lambda msg, too_big=False: None)\n"
                    "s.dispatch = other\n"
                    "class H(_Handler): pass\n"
                    "from xmlrpc.server import SimpleXMLRPCServer\n")
    assert len(_own_dispatchers(own)) == 4
