"""slicex's own multi-aggregate allocation, as an experimenter's SDK drives it (the experiment runner and the
federation exchange point use it too): one request with stitched links across aggregates becomes per-AM
Allocate calls over the AM API, all or nothing.

The path and the tags come from the path service (`compute_path` over a topology in process, or a `slicex scs`
/ GENI SCS URL): it intersects ranges along runs of non-translating hops, splits runs at translating hops and
falls back to Q-in-Q (stitching/negotiate.py). Each aggregate then gets the whole service RSpec (it takes only
its own hops: stitching/am_hops.py), in the workflow's dependency order, so a hop that imports its tag gets
the tag its upstream aggregate actually assigned. An aggregate answering VLAN_UNAVAILABLE (24) — another
slice took the tag since the path service looked — releases everything allocated so far and asks the path
service again excluding that tag (as omni's stitcher does); any other failure releases everything and is
raised with the aggregate, the GENI code and its words.

What each stitched link became is read back from the aggregates' manifests (`link_modes`): `direct` (one tag
end to end), `translated` (an aggregate changes the tag between its hops) or `qinq` (an 802.1ad S-tag over a
C-tag, the `qinq:qinq` element of the hops that push and pop)."""

from __future__ import annotations

import xmlrpc.client
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from lxml import etree

from slicex.xmlsafe import parse_xml
from stitching.model import Topology
from stitching.scs import QINQ, STITCH2, compute_path

L2SC = "switchingCapabilitySpecificInfo_L2sc"


class StitchFailure(Exception):
    """The stitched allocation failed and everything it had allocated was released. `code` is the GENI code
    (of the path service or of the aggregate named by `aggregate`)."""

    def __init__(self, message: str, code: int, aggregate: str = ""):
        super().__init__(message)
        self.message, self.code, self.aggregate = message, code, aggregate


@dataclass(frozen=True)
class HopResult:
    """One hop of a stitched link as its aggregate's manifest reports it."""

    urn: str
    aggregate_url: str
    tag: int  # the outer tag on the hop's wire (the S-tag on a Q-in-Q hop)
    translation: bool
    c_tag: int | None = None  # Q-in-Q: the customer tag inside (push/pop hops only)
    s_tag: int | None = None
    qinq_action: str = ""


@dataclass(frozen=True)
class LinkResult:
    link_id: str
    mode: str  # "direct" | "translated" | "qinq"
    hops: tuple[HopResult, ...]


@dataclass
class Stitched:
    """What a successful allocation holds: the manifest of every aggregate (by AM URL, in the order they were
    called) and each stitched link's hops and mode, read from those manifests."""

    manifests: dict[str, str]
    links: dict[str, LinkResult]
    service_rspec: str
    rounds: int
    codes: list[tuple[str, int]] = field(default_factory=list)  # (AM URL, geni_code) of every Allocate


def _local(el: Any) -> str:
    return etree.QName(el).localname if isinstance(el.tag, str) else ""


def _l2(root: etree._Element, hop_urn: str) -> etree._Element | None:
    for link in root.iter(f"{{{STITCH2}}}link"):
        if (link.get("id") or "").lower() == hop_urn.lower():
            return next((c for c in link.iter() if _local(c) == L2SC), None)
    return None


def _asked(doc: etree._Element, hop_urn: str) -> list[tuple[str, int]]:
    """(hop URN, tag) for what an Allocate asked of a hop: its wire tag, and the C-tag inside at a Q-in-Q
    end (hop exclusions apply to a port's 802.1Q and S-tag spaces alike, so either may be the one taken)."""
    l2 = _l2(doc, hop_urn)
    text = (l2.findtext(f"{{{STITCH2}}}suggestedVLANRange") or "").strip() if l2 is not None else ""
    out = [(hop_urn, int(text))] if text.isdigit() else []
    q = l2.getparent().getparent().getparent().find(f"{{{QINQ}}}qinq") if l2 is not None else None
    if q is not None and (q.get("c_tag") or "").isdigit():
        out.append((hop_urn, int(q.get("c_tag"))))
    return out


def _flatten(deps: list[dict[str, Any]], out: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """hop URN -> {url, imports, upstream hop URNs}: the first mention wins (as the stitcher reads it)."""
    for d in deps:
        out.setdefault(d["hop_urn"], {"url": d["aggregate_url"], "imports": bool(d.get("import_vlans")),
                                      "upstream": [x["hop_urn"] for x in d.get("dependencies", [])]})
        _flatten(d.get("dependencies", []), out)
    return out


def _order(hops: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Aggregate URLs, each after every aggregate it imports a tag from."""
    urls = list(dict.fromkeys(h["url"] for h in hops.values()))
    order: list[str] = []
    while len(order) < len(urls):
        ready = [u for u in urls if u not in order and all(
            hops[up]["url"] in order or hops[up]["url"] == u
            for h in hops.values() if h["url"] == u for up in h["upstream"])]
        if not ready:
            raise StitchFailure(f"the path service's workflow has a dependency loop between {', '.join(urls)}", 2)
        order.append(ready[0])
    return order


def link_modes(manifests: Mapping[str, str], service_rspec: str,
               owners: Mapping[str, str] | None = None) -> dict[str, LinkResult]:
    """Each stitched link of the service RSpec with its hops as the aggregates' manifests report them, and its
    mode: qinq when a hop carries `qinq:qinq`, translated when the wire tag changes along the path, else
    direct. `owners` (hop URN -> AM URL, from the workflow) says whose manifest reports a hop (every manifest
    copies the whole path); without it, the manifest whose hop shows one assigned tag. A hop no manifest
    reports is an error (an aggregate did not take its hop)."""
    svc = parse_xml(service_rspec, "service RSpec")
    docs = {url: parse_xml(m, f"manifest of {url}") for url, m in manifests.items()}
    out: dict[str, LinkResult] = {}
    for path in svc.iter(f"{{{STITCH2}}}path"):
        hops: list[HopResult] = []
        for hop in path.iter(f"{{{STITCH2}}}hop"):
            link = hop.find(f"{{{STITCH2}}}link")
            urn = link.get("id") if link is not None else ""
            found = None
            owner = (owners or {}).get(urn or "")
            for url, doc in docs.items():
                if owner is not None and url != owner:
                    continue
                for m_path in doc.iter(f"{{{STITCH2}}}path"):
                    if m_path.get("id") != path.get("id"):
                        continue
                    for m_link in m_path.iter(f"{{{STITCH2}}}link"):
                        if (m_link.get("id") or "").lower() != (urn or "").lower():
                            continue
                        l2 = next((c for c in m_link.iter() if _local(c) == L2SC), None)
                        tag = (l2.findtext(f"{{{STITCH2}}}suggestedVLANRange") or "").strip() if l2 is not None else ""
                        if not tag.isdigit() or (l2.findtext(f"{{{STITCH2}}}vlanRangeAvailability") or "").strip() != tag:
                            continue  # not this aggregate's hop (the manifest copies the whole path)
                        q = m_link.find(f"{{{QINQ}}}qinq")
                        edge = q.find(f"{{{QINQ}}}edge") if q is not None else None
                        found = HopResult(urn or "", url, int(tag),
                                          (l2.findtext(f"{{{STITCH2}}}vlanTranslation") or "").strip() == "true",
                                          int(q.get("c_tag")) if q is not None else None,
                                          int(q.get("s_tag")) if q is not None else None,
                                          edge.get("action", "") if edge is not None else "")
                        break
                    if found:
                        break
                if found:
                    break
            if found is None:
                raise StitchFailure(f"link {path.get('id')}: no aggregate's manifest reports hop {urn}", 2)
            hops.append(found)
        if any(h.qinq_action for h in hops):
            mode = "qinq"
        elif len({h.tag for h in hops}) > 1:
            mode = "translated"
        else:
            mode = "direct"
        out[path.get("id") or ""] = LinkResult(path.get("id") or "", mode, tuple(hops))
    return out


class StitchClient:
    """Allocates a multi-aggregate request over the AM API. `ams` maps each AM URL the path service names to a
    connected AM API v3 client (mutual TLS, the user's certificate); `path_service` is a Topology (computed in
    process) or an XML-RPC proxy of a path service (`slicex scs`)."""

    def __init__(self, ams: Mapping[str, Any], path_service: Topology | Any, max_rounds: int = 3,
                 now: Callable[[], datetime] = lambda: datetime.now(UTC)):
        self.ams = dict(ams)
        self.path_service = path_service
        self.max_rounds = max_rounds
        self.now = now

    def _compute(self, slice_urn: str, request: str, excluded: Mapping[str, list[str]]) -> dict[str, Any]:
        params: dict[str, Any] = {"slice_urn": slice_urn, "request_rspec": request, "request_options": {}}
        if excluded:
            params["request_options"]["geni_routing_profile"] = {
                link: {"hop_exclusion_list": items} for link, items in excluded.items()}
        if isinstance(self.path_service, Topology):
            res = compute_path(self.path_service, params, self.now())
        else:
            try:
                res = self.path_service.ComputePath(params)
            except (OSError, xmlrpc.client.Error) as exc:
                raise StitchFailure(f"the path service did not answer: {exc}", 11) from None
        if res["code"]["geni_code"] != 0:
            raise StitchFailure(f"path service: {res.get('output') or ''}", res["code"]["geni_code"])
        return res["value"]

    def _am(self, url: str) -> Any:
        am = self.ams.get(url)
        if am is None:
            raise StitchFailure(f"the path goes through the aggregate at {url}, and this client has no connection "
                                f"to it; add it to the client's aggregates", 2, url)
        return am

    def _call(self, url: str, method: str, *args: Any) -> dict[str, Any]:
        try:
            return getattr(self._am(url), method)(*args)
        except (OSError, xmlrpc.client.Error) as exc:
            return {"code": {"geni_code": 11}, "output": f"{method} did not answer: {exc}"}

    def release(self, slice_urn: str, credentials: list[dict[str, Any]], urls: list[str]) -> list[str]:
        """Delete the slice at each aggregate; returns the failures (an aggregate already empty is fine)."""
        failed = []
        for url in urls:
            out = self._call(url, "Delete", [slice_urn], credentials, {})
            if out["code"]["geni_code"] not in (0, 12):
                failed.append(f"{url}: {out['code']['geni_code']} {out.get('output') or ''}")
        return failed

    def allocate(self, slice_urn: str, credentials: list[dict[str, Any]], request: str,
                 options: Mapping[str, Any] | None = None) -> Stitched:
        """Allocate the request at every aggregate its stitched links cross (transit ones included), all or
        nothing; StitchFailure says which aggregate refused, with its code and words."""
        excluded: dict[str, list[str]] = {}
        codes: list[tuple[str, int]] = []
        for rounds in range(1, self.max_rounds + 1):
            value = self._compute(slice_urn, request, excluded)
            hops: dict[str, dict[str, Any]] = {}
            for link_id, wf in value["workflow_data"].items():
                for urn, h in _flatten(wf["dependencies"], {}).items():
                    hops[urn] = {**h, "link": link_id}
            order = _order(hops)
            tags: dict[str, int] = {}
            manifests: dict[str, str] = {}
            failure: tuple[str, dict[str, Any]] | None = None
            for url in order:
                doc = parse_xml(value["service_rspec"], "service RSpec")
                for urn, h in hops.items():  # importing hops take the tag their upstream aggregate assigned
                    if h["url"] == url and h["imports"]:
                        src = next((u for u in h["upstream"] if hops[u]["url"] != url and u in tags), None)
                        l2 = _l2(doc, urn)
                        if src is not None and l2 is not None:
                            for name in ("suggestedVLANRange", "vlanRangeAvailability"):
                                el = l2.find(f"{{{STITCH2}}}{name}")
                                if el is not None:
                                    el.text = str(tags[src])
                sent = doc
                out = self._call(url, "Allocate", slice_urn, credentials, etree.tostring(doc, encoding="unicode"),
                                 dict(options or {}))
                codes.append((url, out["code"]["geni_code"]))
                if out["code"]["geni_code"] != 0:
                    failure = (url, out)
                    break
                manifests[url] = out["value"]["geni_rspec"]
                got = parse_xml(manifests[url], f"manifest of {url}")
                for urn, h in hops.items():
                    l2 = _l2(got, urn) if h["url"] == url else None
                    text = (l2.findtext(f"{{{STITCH2}}}suggestedVLANRange") or "").strip() if l2 is not None else ""
                    if text.isdigit():
                        tags[urn] = int(text)
            if failure is None:
                owners = {urn: h["url"] for urn, h in hops.items()}
                return Stitched(manifests, link_modes(manifests, value["service_rspec"], owners),
                                value["service_rspec"], rounds, codes)
            url, out = failure
            left = self.release(slice_urn, credentials, list(manifests))
            code, why = out["code"]["geni_code"], out.get("output") or ""
            if left:
                why += "; and releasing what was allocated failed at " + "; ".join(left)
            retry = [urn for urn, h in hops.items() if h["url"] == url]
            if code != 24 or not retry or rounds == self.max_rounds or left:
                raise StitchFailure(f"Allocate at {url} answered {code}: {why}", code, url)
            for urn in retry:  # ask the path service again without the tags this aggregate could not take
                asked = _asked(sent, urn)
                excluded.setdefault(hops[urn]["link"], []).extend(f"{u}={t}" for u, t in asked)
                for src in hops[urn]["upstream"]:  # and the upstream hop of the run, which must match
                    excluded[hops[urn]["link"]].extend(f"{src}={t}" for _, t in asked[:1])
        raise StitchFailure("no rounds", 2)  # unreachable: the loop returns or raises

    def provision(self, slice_urn: str, credentials: list[dict[str, Any]], stitched: Stitched,
                  users: list[dict[str, Any]] | None = None) -> dict[str, str]:
        """Provision at every aggregate of the allocation (all or nothing: a failure deletes everywhere)."""
        out: dict[str, str] = {}
        for url in stitched.manifests:
            res = self._call(url, "Provision", [slice_urn], credentials, {"geni_users": users or []})
            if res["code"]["geni_code"] != 0:
                left = self.release(slice_urn, credentials, list(stitched.manifests))
                raise StitchFailure(f"Provision at {url} answered {res['code']['geni_code']}: {res.get('output')}"
                                    + (f"; releasing failed at {'; '.join(left)}" if left else ""),
                                    res["code"]["geni_code"], url)
            out[url] = res["value"]["geni_rspec"]
        return out

    def start(self, slice_urn: str, credentials: list[dict[str, Any]], stitched: Stitched) -> None:
        for url in stitched.manifests:
            res = self._call(url, "PerformOperationalAction", [slice_urn], credentials, "geni_start", {})
            if res["code"]["geni_code"] != 0:
                raise StitchFailure(f"geni_start at {url} answered {res['code']['geni_code']}: {res.get('output')}",
                                    res["code"]["geni_code"], url)
