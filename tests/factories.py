"""Small factories for test data (RSpecs)."""

from __future__ import annotations

RSPEC3 = "http://www.geni.net/resources/rspec/3"


def request_rspec(nodes: list[dict] | None = None, links: list[dict] | None = None, kind: str = "request",
                  extra: str = "") -> str:
    """A GENI v3 request. nodes: {client_id, component_id?, sliver_type?, image?, exclusive?, ifaces: [..]};
    links: {client_id, ifaces: [...], capacity?, vlantag?}."""
    out = [f'<rspec xmlns="{RSPEC3}" type="{kind}">']
    for n in nodes or []:
        attrs = f'client_id="{n["client_id"]}"'
        if n.get("component_id"):
            attrs += f' component_id="{n["component_id"]}"'
        if n.get("component_manager_id"):
            attrs += f' component_manager_id="{n["component_manager_id"]}"'
        if "exclusive" in n:
            attrs += f' exclusive="{str(n["exclusive"]).lower()}"'
        body = ""
        if n.get("sliver_type"):
            img = f'<disk_image name="{n["image"]}"/>' if n.get("image") else ""
            body += f'<sliver_type name="{n["sliver_type"]}">{img}</sliver_type>'
        for i in n.get("ifaces", []):
            body += f'<interface client_id="{i}"/>'
        body += n.get("extra", "")
        out.append(f"<node {attrs}>{body}</node>")
    for lk in links or []:
        attrs = f'client_id="{lk["client_id"]}"'
        if lk.get("vlantag"):
            attrs += f' vlantag="{lk["vlantag"]}"'
        body = "".join(f'<interface_ref client_id="{i}"/>' for i in lk["ifaces"])
        if lk.get("capacity"):
            a, b = lk["ifaces"][:2]
            body += f'<property source_id="{a}" dest_id="{b}" capacity="{lk["capacity"]}"/>'
        out.append(f"<link {attrs}>{body}</link>")
    out.append(extra)
    out.append("</rspec>")
    return "\n".join(out)


def vm(client_id: str, **kw) -> dict:
    return {"client_id": client_id, "sliver_type": kw.pop("sliver_type", "default-vm"), **kw}


def three_node_lan() -> str:
    return request_rspec(
        [vm("n1", ifaces=["n1:if0"]), vm("n2", ifaces=["n2:if0"]), vm("n3", ifaces=["n3:if0"])],
        [{"client_id": "lan0", "ifaces": ["n1:if0", "n2:if0", "n3:if0"]}])
