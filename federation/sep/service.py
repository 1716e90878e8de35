"""The Slice Exchange Point's AM API v3 endpoint: authenticate the user (mutual TLS + their slice credential,
as an aggregate does), split the request by domain, relay each part to its domain with the user's
credentials (the exchange point speaks for the user: their geni_abac speaks-for credential names its
certificate), allocate everywhere then provision (federation/sep/txn.py), and answer Describe, Status, Renew,
Delete and PerformOperationalAction by fanning out and merging.

The cross-domain slice record lives in the store (table `sep_slices`, one document per slice): the domains
and sliver URNs of the slice, its cross-domain links and how each is joined, and while an operation is
under way the transaction and the credentials needed to undo it. It is written before every call to a
domain and after every answer, so a restart finds every unfinished operation and rolls it back
(`recover`); rollbacks a domain could not take (it was down) are retried every `retry_seconds`."""

from __future__ import annotations

import base64
import logging
import queue
import threading
import uuid
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from cryptography import x509

from federation.sep import txn as tx
from federation.sep.merge import merge_rspecs
from federation.sep.overlay import MISSING, Endpoint, Overlay
from federation.sep.relay import Domain, NoAnswer, Refusal, Relay
from federation.sep.split import (
    Split,
    domain_key,
    interface_addresses,
    link_capacities,
    split_request,
    with_transits,
    without_links,
)
from rspec import namespaces as ns
from slicex import __version__, endpoint
from slicex.clock import Clock, rfc3339
from slicex.codec import decode, encode
from slicex.credentials import CredentialVerifier, credential_slices
from slicex.endpoint import GeniResults, geni_options, public_methods
from slicex.errors import (
    BadArgs,
    Busy,
    CredentialInvalid,
    GeniError,
    InsufficientBandwidth,
    SearchFailed,
    TimedOut,
    Unavailable,
    Unsupported,
    VlanUnavailable,
)
from slicex.speaksfor import verify_speaks_for
from slicex.store import Store
from slicex.store.ownership import Actor, scoped
from slicex.urn import as_spelled, canonical_urn, parse_urn

log = logging.getLogger("slicex.sep")
AM_TYPE = "slicex-sep"
TABLE = "sep_slices"
METHODS = ("GetVersion", "ListResources", "Describe", "Allocate", "Renew", "Provision", "Status",
           "PerformOperationalAction", "Delete", "Shutdown")
ERRORS_BY_CODE = {24: VlanUnavailable, 25: InsufficientBandwidth, 12: SearchFailed}


ANSWERS = GeniResults(AM_TYPE, 3, "AM API v3", failure_hint="")
"""Every answer a GENI result, failures too (never a fault)."""


def result(value: Any, code: int = 0, output: str = "") -> dict[str, Any]:
    return ANSWERS.result(value, code, output)


class DomainError(GeniError):
    """A domain's refusal passed on with its own code, the domain named in the message."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


class ExchangePoint:
    """The endpoint. `relay` reaches the domains, `store` keeps the record, `overlay` joins links without a
    layer-2 path (None: such links are refused as not available)."""

    def __init__(self, urn: str, url: str, domains: list[Domain], relay: Relay, store: Store,
                 verifier: CredentialVerifier, sep_cert: x509.Certificate, clock: Clock,
                 overlay: Overlay | None = None, topology: Callable[..., Any] | None = None):
        self.urn, self.url = urn, url
        self.domains = {domain_key(d.urn): d for d in domains}
        self.relay, self.verifier, self.cert, self.clock = relay, verifier, sep_cert, clock
        self.store = scoped(store, Actor.SEP)
        self.overlay = overlay
        self.topology = topology or stitching_topology
        self._locks: dict[str, threading.Lock] = {}
        self._holding: dict[str, str] = {}  # slice -> what the operation holding its lock is doing
        self._locks_lock = threading.Lock()
        self._record_lock = threading.RLock()
        self._pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="sep-relay")

    # ---- the surface -----------------------------------------------------------------------------------------
    def endpoint(self) -> endpoint.Endpoint:
        """AM API v3 on XML-RPC: each of `METHODS` is the public method of that name; failures are results."""
        return endpoint.Endpoint("sep", public_methods(self, METHODS, anonymous=("GetVersion",)), ANSWERS)

    # ---- helpers ---------------------------------------------------------------------------------------------
    @staticmethod
    def _options(options: Any) -> dict[str, Any]:
        options = geni_options(options)
        if "geni_speaking_for" in options:
            raise Unsupported("geni_speaking_for at the exchange point is not supported: call it as yourself; it "
                              "speaks for you at the domains")
        return options

    def _authorise(self, cert: x509.Certificate, credentials: Any, target: str | None, privilege: str) -> str:
        """The caller's URN once their credential allows `privilege` on `target` and a speaks-for credential
        lets this exchange point act for them at the domains."""
        if not isinstance(credentials, list):
            raise BadArgs(f"credentials must be a list, got {type(credentials).__name__}")
        if not credentials:
            raise BadArgs("no credentials were passed; send your slice credential and your speaks-for credential "
                          "for the exchange point")
        now = self.clock.now()
        verified = self.verifier.verify(credentials, cert, target, privilege, now)
        abac = [c.get("geni_value") for c in credentials
                if isinstance(c, dict) and c.get("geni_type") == "geni_abac"]
        abac = [v.data.decode() if hasattr(v, "data") else v for v in abac]
        if not abac:
            raise CredentialInvalid(f"no geni_abac speaks-for credential for the exchange point ({self.urn}) was "
                                    f"passed: it acts for you at each domain only with one (`slicex sep speaksfor`)")
        verify_speaks_for(abac, self.cert, verified.effective_caller_urn, self.verifier.trust, now)
        return verified.effective_caller_urn

    @staticmethod
    def _relay_options(options: dict[str, Any], caller: str) -> dict[str, Any]:
        out = {k: v for k, v in options.items() if k != "geni_compressed"}
        out["geni_speaking_for"] = caller
        return out

    def _slice_lock(self, slice_urn: str) -> threading.Lock:
        with self._locks_lock:
            return self._locks.setdefault(slice_urn, threading.Lock())

    @contextmanager
    def _turn(self, slice_urn: str, doing: str) -> Iterator[None]:
        """One operation per slice at a time. A call that finds its slice taken gets BUSY at once, naming what
        holds it, instead of waiting behind it: the holder may be an undo waiting out a hung domain's timeout,
        and a call that waited would act for a client that has long given up."""
        lock = self._slice_lock(slice_urn)
        if not lock.acquire(blocking=False):
            raise Busy(f"slice {slice_urn}: the exchange point is {self._holding.get(slice_urn, 'working on it')}; "
                       f"try again shortly")
        self._holding[slice_urn] = doing
        try:
            yield
        finally:
            self._holding.pop(slice_urn, None)
            lock.release()

    def _record(self, slice_urn: str) -> dict[str, Any] | None:
        return self.store.get(TABLE, slice_urn)

    def _put(self, record: dict[str, Any]) -> None:
        with self._record_lock:
            record["updated"] = rfc3339(self.clock.now())
            self.store.put(TABLE, record["slice_urn"], record)

    def _named(self, urns: Any) -> tuple[str | None, dict[str, list[str]]]:
        """(canonical slice URN or None, sliver URNs by domain key)."""
        if not isinstance(urns, list) or not urns:
            raise BadArgs("expected a non-empty list of slice or sliver URNs")
        slices: set[str] = set()
        slivers: dict[str, list[str]] = {}
        for text in urns:
            urn = parse_urn(text)
            if urn.type == "slice":
                slices.add(urn.canonical)
            elif urn.type == "sliver":
                key = urn.authority.lower()
                if key not in self.domains:
                    raise SearchFailed(f"sliver {text} is of {urn.authority}, not a domain of this exchange point")
                slivers.setdefault(key, []).append(str(text))
            else:
                raise BadArgs(f"{text} is a {urn.type} URN; name a slice or slivers")
        if len(slices) > 1:
            raise BadArgs("URNs span several slices; one call acts on one slice")
        return next(iter(slices), None), slivers

    def _slice_of(self, urns: Any, credentials: Any) -> tuple[str, dict[str, list[str]]]:
        slice_urn, slivers = self._named(urns)
        if slice_urn is None:
            claimed = credential_slices(credentials)
            if not claimed:
                raise CredentialInvalid("naming slivers needs a slice credential for their slice")
            slice_urn = claimed[0]
        return slice_urn, slivers

    def _targets(self, slice_urn: str, slivers: dict[str, list[str]]) -> dict[str, list[str]]:
        """domain key -> URNs to send there: the slivers named, else the slice at every domain the record names
        (every domain when there is no record: slivers made there directly are the slice's too)."""
        if slivers:
            return slivers
        record = self._record(slice_urn)
        keys = sorted(record["domains"]) if record and record.get("domains") else sorted(self.domains)
        return {k: [slice_urn] for k in keys}

    def _fan_out(self, calls: dict[str, tuple]) -> dict[str, Any]:
        """Run `method, *params` at each domain in parallel: domain -> value, Refusal or NoAnswer."""
        futures = {k: self._pool.submit(self._call, self.domains[k], *args) for k, args in calls.items()}
        return {k: f.result() for k, f in futures.items()}

    def _call(self, domain: Domain, method: str, *params: Any) -> Any:
        try:
            return self.relay.call(domain, method, *params)
        except (Refusal, NoAnswer) as exc:
            return exc

    def _raise_first(self, answers: dict[str, Any], method: str, tolerate_searchfailed: bool = True) -> None:
        for k, a in sorted(answers.items()):
            if isinstance(a, NoAnswer):
                raise Unavailable(f"{method}: {a}")
            if isinstance(a, Refusal) and not (tolerate_searchfailed and a.code == SearchFailed.code):
                raise DomainError(a.code, f"{method} at {self.domains[k].urn}: {a.output}")

    # ---- the methods -----------------------------------------------------------------------------------------
    def GetVersion(self, cert: x509.Certificate | None, options: Any = None) -> dict[str, Any]:
        versions = [{"type": "GENI", "version": "3", "schema": ns.REQUEST_XSD, "namespace": ns.RSPEC3,
                     "extensions": [ns.STITCH2]}]
        ads = [{"type": "GENI", "version": "3", "schema": ns.AD_XSD, "namespace": ns.RSPEC3,
                "extensions": [ns.STITCH2]}]
        return result({
            "geni_api": 3, "geni_api_versions": {"3": self.url},
            "geni_request_rspec_versions": versions, "geni_ad_rspec_versions": ads,
            "geni_credential_types": [{"geni_type": "geni_sfa", "geni_version": "3"},
                                      {"geni_type": "geni_sfa", "geni_version": "2"},
                                      {"geni_type": "geni_abac", "geni_version": "1"}],
            "geni_single_allocation": 0, "geni_allocate": "geni_many", "geni_am_type": AM_TYPE,
            "geni_am_code": __version__, "urn": self.urn,
            "slicex_sep_domains": [{"urn": d.urn, "url": d.url} for _, d in sorted(self.domains.items())],
        })

    def ListResources(self, cert, credentials, options) -> dict[str, Any]:
        options = self._options(options)
        caller = self._authorise(cert, credentials, None, "listresources")
        opts = self._relay_options(options, caller)
        answers = self._fan_out({k: ("ListResources", credentials, opts) for k in self.domains})
        self._raise_first(answers, "ListResources", tolerate_searchfailed=False)
        docs = [(k, _plain(answers[k])) for k in sorted(answers)]
        return result(_compressed(merge_rspecs(docs, "advertisement"), options))

    def Describe(self, cert, urns, credentials, options) -> dict[str, Any]:
        options = self._options(options)
        slice_urn, slivers = self._slice_of(urns, credentials)
        caller = self._authorise(cert, credentials, slice_urn, "getsliceresources")
        opts = self._relay_options(options, caller)
        targets = self._targets(slice_urn, slivers)
        answers = self._fan_out({k: ("Describe", u, credentials, opts) for k, u in targets.items()})
        self._raise_first(answers, "Describe")
        ok = {k: a for k, a in answers.items() if isinstance(a, dict)}
        docs = [(k, _plain(a.get("geni_rspec", ""))) for k, a in sorted(ok.items())
                if a.get("geni_slivers")]
        manifest = merge_rspecs(docs) if docs else merge_rspecs([])
        return result({"geni_rspec": _compressed(manifest, options),
                       "geni_urn": as_spelled(slice_urn, urns if isinstance(urns, list) else [], "slice"),
                       "geni_slivers": [s for _, a in sorted(ok.items()) for s in a.get("geni_slivers", [])]})

    def Status(self, cert, urns, credentials, options) -> dict[str, Any]:
        options = self._options(options)
        slice_urn, slivers = self._slice_of(urns, credentials)
        caller = self._authorise(cert, credentials, slice_urn, "getsliceresources")
        answers = self._fan_out({k: ("Status", u, credentials, self._relay_options(options, caller))
                                 for k, u in self._targets(slice_urn, slivers).items()})
        self._raise_first(answers, "Status")
        found = [s for _, a in sorted(answers.items()) if isinstance(a, dict) for s in a.get("geni_slivers", [])]
        if not found:
            raise SearchFailed(f"slice {slice_urn} has no slivers at any domain of this exchange point")
        return result({"geni_urn": as_spelled(slice_urn, urns if isinstance(urns, list) else [], "slice"),
                       "geni_slivers": found})

    def Renew(self, cert, urns, credentials, expiration, options) -> dict[str, Any]:
        return self._each(cert, urns, credentials, options, "Renew", "renewsliver", (expiration,))

    def PerformOperationalAction(self, cert, urns, credentials, action, options) -> dict[str, Any]:
        return self._each(cert, urns, credentials, options, "PerformOperationalAction", "createsliver", (action,))

    def _each(self, cert, urns, credentials, options, method: str, privilege: str, extra: tuple) -> dict[str, Any]:
        """Renew and PerformOperationalAction: the call at every domain holding the slice, the sliver lists
        joined; a refusal anywhere is the answer, naming the domain (the others' changes stand, as with
        several aggregates called one by one)."""
        options = self._options(options)
        slice_urn, slivers = self._slice_of(urns, credentials)
        caller = self._authorise(cert, credentials, slice_urn, privilege)
        opts = self._relay_options(options, caller)
        calls = {k: (method, u, credentials, *extra, opts) for k, u in self._targets(slice_urn, slivers).items()}
        answers = self._fan_out(calls)
        self._raise_first(answers, method)
        out = [s for _, a in sorted(answers.items()) if isinstance(a, list) for s in a]
        if not out:
            raise SearchFailed(f"slice {slice_urn} has no slivers at any domain of this exchange point")
        return result(out)

    def Shutdown(self, cert, slice_urn, credentials, options) -> dict[str, Any]:
        options = self._options(options)
        urn = canonical_urn(slice_urn, "slice")
        caller = self._authorise(cert, credentials, urn, "shutdown")
        answers = self._fan_out({k: ("Shutdown", urn, credentials, self._relay_options(options, caller))
                                 for k in self._targets(urn, {})})
        self._raise_first(answers, "Shutdown", tolerate_searchfailed=False)
        return result(True)

    def Delete(self, cert, urns, credentials, options) -> dict[str, Any]:
        options = self._options(options)
        slice_urn, slivers = self._slice_of(urns, credentials)
        caller = self._authorise(cert, credentials, slice_urn, "deleteslice")
        with self._turn(slice_urn, "deleting it"):
            self._busy(slice_urn)
            answers = self._fan_out({k: ("Delete", u, credentials, self._relay_options(options, caller))
                                     for k, u in self._targets(slice_urn, slivers).items()})
            record = self._record(slice_urn)
            if record is not None:
                for k, a in answers.items():
                    gone = {s["geni_sliver_urn"] for s in a} if isinstance(a, list) else set()
                    if isinstance(a, Refusal) and a.code == SearchFailed.code:
                        gone = set(record["domains"].get(k, {}).get("slivers", []))
                    if k in record["domains"]:
                        left = [s for s in record["domains"][k]["slivers"] if s not in gone]
                        if left:
                            record["domains"][k]["slivers"] = left
                        else:
                            del record["domains"][k]
                if record["domains"]:
                    self._put(record)
                else:
                    self._leave_overlay(record)
                    self.store.delete(TABLE, slice_urn)
            self._raise_first(answers, "Delete")
        out = [s for _, a in sorted(answers.items()) if isinstance(a, list) for s in a]
        if not out:
            raise SearchFailed(f"slice {slice_urn} has no slivers to delete at any domain of this exchange point")
        return result(out)

    def _busy(self, slice_urn: str) -> None:
        record = self._record(slice_urn)
        if record and record.get("txn") and decode(record["txn"], tx.Txn, "transaction").open:
            t = decode(record["txn"], tx.Txn, "transaction")
            raise Busy(f"slice {slice_urn}: the exchange point is still {'undoing' if t.status == tx.ROLLING_BACK else 'running'} "
                       f"a {t.op} ({t.reason or 'started ' + t.started}); try again shortly")

    # ---- Allocate: split, join the cross-domain links, allocate everywhere or nowhere ----------------------------
    def Allocate(self, cert, slice_urn, credentials, rspec, options) -> dict[str, Any]:
        options = self._options(options)
        urn = canonical_urn(slice_urn, "slice")
        caller = self._authorise(cert, credentials, urn, "createsliver")
        if not isinstance(rspec, str):
            raise BadArgs(f"rspec must be a string of XML, got {type(rspec).__name__}")
        split = split_request(rspec, {k: d.urn for k, d in self.domains.items()})
        opts = self._relay_options(options, caller)
        with self._turn(urn, "allocating it"):
            self._busy(urn)
            split, joins = self._join_plan(urn, split, credentials, opts)
            overlay_links = {lk.link_id for lk in split.cross if joins[lk.link_id]["mode"] == "overlay"}
            parts = {d: (tuple(c for c in split.client_ids(d) if c not in overlay_links), ())
                     for d in split.domains}
            requests = {d: split.part(d, overlay_links) for d in split.domains}
            record = self._record(urn) or {"slice_urn": urn, "domains": {}, "links": {}}
            t = tx.begin(uuid.uuid4().hex[:12], urn, tx.ALLOCATE, parts, rfc3339(self.clock.now()))
            record.update(txn=encode(t), credentials=credentials, caller=caller, options=opts)
            record["pending_links"] = joins
            self._put(record)
            answers = self._run(record, {d: ("Allocate", urn, credentials, requests[d], opts) for d in parts})
            t = decode(record["txn"], tx.Txn, "transaction")
            t, steps = tx.decide(t)
            if t.status == tx.COMMITTED:
                for p in t.parts:
                    entry = record["domains"].setdefault(p.domain, {"urn": self.domains[p.domain].urn, "slivers": []})
                    entry["slivers"] = list(dict.fromkeys(entry["slivers"] + list(p.slivers)))
                record["links"] = {**record.get("links", {}), **joins}
                self._finish(record, t)
                docs = [(k, a.get("geni_rspec", "")) for k, a in sorted(answers.items())]
                return result({"geni_rspec": merge_rspecs(docs),
                               "geni_slivers": [s for _, a in sorted(answers.items()) for s in a.get("geni_slivers", [])]})
            return self._fail(record, t, steps, "Allocate")

    def _join_plan(self, slice_urn: str, split: Split, credentials: list, opts: dict) -> tuple[Split, dict[str, dict]]:
        """How each cross-domain link is joined: `stitched` (a VLAN path negotiated through the stitching code:
        the split is redone on the path service's answer, so each domain holds its hop's tag) or `overlay`
        (no layer-2 path); UNSUPPORTED when the overlay is needed and missing."""
        if not split.cross:
            return split, {}
        from stitching.model import StitchingError
        from stitching.negotiate import LinkRequest, plan_link
        from stitching.scs import compute_path

        topo, unreadable = self.topology([self.domains[d] for d in split.domains], credentials, opts,
                                         relay=self.relay)
        joins: dict[str, dict] = {}
        transits_read = False
        for lk in split.cross:
            a, b = (split.managers[d] for d in lk.domains)
            why = f"link {lk.link_id} has link_type that no VLAN carries"
            if lk.stitchable:
                try:
                    try:
                        plan = plan_link(topo, LinkRequest(lk.link_id, a, b), {}, {})
                    except StitchingError as err:
                        if err.kind != "path" or transits_read:
                            raise
                        transits_read = True  # its path may cross a domain holding no node of the request
                        topo, more = self._transit_topology(topo, split.domains, credentials, opts)
                        unreadable += more
                        plan = plan_link(topo, LinkRequest(lk.link_id, a, b), {}, {})
                    transit = [agg for agg in plan.aggregates if domain_key(agg) not in lk.domains]
                    foreign = [agg for agg in transit if domain_key(agg) not in self.domains]
                    if foreign:  # it would carry the link, but the exchange point cannot allocate there
                        raise Unsupported(f"cross-domain link {lk.link_id}: its path crosses {', '.join(foreign)}, "
                                          f"which is not a domain of this exchange point, so its hops could not "
                                          f"be allocated. Nothing was allocated")
                    joins[lk.link_id] = {"mode": "stitched", "hops": [h.port.urn for h in plan.hops],
                                         "qinq": plan.tunnel is not None,
                                         "transit": sorted({domain_key(agg) for agg in transit})}
                    continue
                except StitchingError as err:
                    if err.kind != "path":
                        raise ERRORS_BY_CODE.get({"vlan": 24, "bandwidth": 25}.get(err.kind, 1), BadArgs)(
                            f"cross-domain link {lk.link_id}: {err.message}") from None
                    why = err.message + (f" ({'; '.join(unreadable)})" if unreadable else "")
            ips = interface_addresses(split.xml)
            joins[lk.link_id] = {"mode": "overlay", "why": why, "ends": [list(e) for e in lk.ends],
                                 "ips": {iface: ips[iface] for _d, iface, _n in lk.ends if iface in ips},
                                 "capacity_kbps": link_capacities(split.xml).get(lk.link_id, 0)}
        need_overlay = [k for k, j in joins.items() if j["mode"] == "overlay"]
        if need_overlay and self.overlay is None:
            raise Unsupported(f"cross-domain link(s) {', '.join(need_overlay)}: no layer-2 path between the domains "
                              f"({'; '.join(joins[k]['why'] for k in need_overlay)}), and {MISSING}. Nothing was "
                              f"allocated")
        for k in need_overlay:  # what the overlay could not join at Provision is refused now, before any call
            self.overlay.admit(k, joins[k]["ips"], joins[k]["capacity_kbps"])  # type: ignore[union-attr]
        if len(need_overlay) == len(joins):
            return split, joins
        answer = compute_path(topo, {"slice_urn": slice_urn, "request_rspec": without_links(split.xml, need_overlay),
                                     "request_options": {}}, self.clock.now())
        if answer["code"]["geni_code"] != 0:
            code = answer["code"]["geni_code"]
            raise ERRORS_BY_CODE.get(code, BadArgs)(f"joining the cross-domain links: {answer['output']}")
        service = answer["value"]["service_rspec"]
        if need_overlay:  # the overlay links go back in, unstitched: each domain leaves them out of its part
            from lxml import etree

            from slicex.xmlsafe import parse_xml

            root, orig = parse_xml(service, "service RSpec"), parse_xml(split.xml, "request RSpec")
            for el in orig:
                if isinstance(el.tag, str) and etree.QName(el).localname == "link" and el.get("client_id") in need_overlay:
                    root.append(el)
            service = etree.tostring(root, encoding="unicode")
        stitched = split_request(service, {k: d.urn for k, d in self.domains.items()}, 64 * 1024 * 1024)
        return with_transits(stitched, {k: j["transit"] for k, j in joins.items() if j.get("transit")}), joins

    def _transit_topology(self, topo: Any, read: tuple[str, ...], credentials: list, opts: dict) -> tuple[Any, list[str]]:
        """`topo` with the advertisements of the domains not in `read` merged in: read only when a link has no
        path over the request's own domains (a transit testbed), each domain on its own, so one that does not
        answer is noted (as unreadable) and costs its own timeout, not the request."""
        notes: list[str] = []
        for key, d in sorted(self.domains.items()):
            if key in read:
                continue
            try:
                more, bad = self.topology([d], credentials, opts, relay=self.relay)
            except GeniError as exc:
                notes.append(f"{d.urn}: {exc.message}")
                continue
            topo, notes = topo.merged(more), notes + bad
        return topo, notes

    def _run(self, record: dict[str, Any], calls: dict[str, tuple]) -> dict[str, Any]:
        """Send every part at once; record each answer as it comes (durably), return the values by domain."""
        futures = {d: self._pool.submit(self._call, self.domains[d], *args) for d, args in calls.items()}
        values: dict[str, Any] = {}
        for d, f in futures.items():
            a = f.result()
            with self._record_lock:
                t = decode(record["txn"], tx.Txn, "transaction")
                if isinstance(a, NoAnswer):
                    t = tx.lost(t, d, Unavailable.code, str(a))
                elif isinstance(a, Refusal):
                    t = tx.refused(t, d, a.code, a.output)
                else:
                    values[d] = a
                    got = a.get("geni_slivers", []) if isinstance(a, dict) else []
                    t = tx.answered(t, d, tuple(s["geni_sliver_urn"] for s in got if isinstance(s, dict)))
                record["txn"] = encode(t)
                self._put(record)
        return values

    def _finish(self, record: dict[str, Any], t: tx.Txn) -> None:
        """The operation is over: drop the transaction and the credentials kept to undo it."""
        for key in ("txn", "credentials", "caller", "options", "pending_links"):
            record.pop(key, None)
        if record["domains"] or t.status == tx.COMMITTED:
            self._put(record)
        else:
            self.store.delete(TABLE, record["slice_urn"])

    def _fail(self, record: dict[str, Any], t: tx.Txn, steps: list[tx.Step], method: str) -> dict[str, Any]:
        """Undo what the failed operation took, then answer with the domain's refusal (or UNAVAILABLE /
        TIMEDOUT when a domain did not answer), saying what was undone and what is still being undone."""
        record["txn"] = encode(t)
        self._put(record)
        # a domain that let the call time out is swept by the retry loop, not while the caller waits again
        hung = {p.domain for p in t.parts if p.state == tx.LOST and "timed out" in p.error.lower()}
        t, left = self._undo(record, t, steps, defer=hung)
        bad = [p for p in t.parts if p.state in (tx.REFUSED, tx.LOST) or p.code]
        refusal = next((p for p in bad if p.state == tx.REFUSED), None)
        undone = [self.domains[p.domain].urn for p in t.parts if p.state == tx.UNDONE and p.slivers]
        if method == "Allocate":
            undo_text = (f"released what {', '.join(undone)} had allocated" if undone
                         else "nothing had been allocated elsewhere")
        else:
            undo_text = f"deleted the slice's slivers at {', '.join(undone) or 'no domain'}"
        if left:
            undo_text += (f"; {', '.join(sorted({self.domains[s.domain].urn for s in left}))} did not answer: the "
                          f"exchange point keeps trying to undo its part there")
        why = "; ".join(f"{self.domains[p.domain].urn}: {p.error}" for p in bad) or t.reason
        message = f"{method} failed, so nothing of it was kept ({undo_text}). {why}"
        if refusal is not None:
            raise DomainError(refusal.code, message)
        if any("timed out" in p.error.lower() for p in bad):
            raise TimedOut(message)
        raise Unavailable(message)

    # ---- Provision: every domain, or none -------------------------------------------------------------------------
    def Provision(self, cert, urns, credentials, options) -> dict[str, Any]:
        options = self._options(options)
        slice_urn, slivers = self._slice_of(urns, credentials)
        caller = self._authorise(cert, credentials, slice_urn, "createsliver")
        opts = self._relay_options(options, caller)
        with self._turn(slice_urn, "provisioning it"):
            self._busy(slice_urn)
            record = self._record(slice_urn)
            if not record or not record.get("domains"):
                raise SearchFailed(f"slice {slice_urn} has nothing allocated through this exchange point; Allocate "
                                   f"first")
            chosen = {k: tuple(slivers.get(k) or e["slivers"]) for k, e in record["domains"].items()
                      if not slivers or k in slivers}
            t = tx.begin(uuid.uuid4().hex[:12], slice_urn, tx.PROVISION, {k: ((), s) for k, s in chosen.items()},
                         rfc3339(self.clock.now()))
            record.update(txn=encode(t), credentials=credentials, caller=caller, options=opts)
            self._put(record)
            answers = self._run(record, {k: ("Provision", list(s), credentials, opts) for k, s in chosen.items()})
            t, steps = tx.decide(decode(record["txn"], tx.Txn, "transaction"))
            if t.status == tx.COMMITTED:
                try:
                    joined = self._join_overlay(record, answers)
                except GeniError as err:
                    t = decode({**encode(t), "status": tx.RUNNING}, tx.Txn, "transaction")
                    t, steps = tx.recover(t, f"overlay: {err.message}")
                    return self._fail(record, t, steps, "Provision")
                self._finish(record, t)
                docs = [(k, a.get("geni_rspec", "")) for k, a in sorted(answers.items())]
                return result({"geni_rspec": merge_rspecs(docs),
                               "geni_slivers": [s for _, a in sorted(answers.items()) for s in a.get("geni_slivers", [])]},
                              output=joined)
            return self._fail(record, t, steps, "Provision")

    def _join_overlay(self, record: dict[str, Any], answers: dict[str, Any]) -> str:
        """Join each overlay link's two ends once both domains have provisioned their nodes (the nodes' sliver
        URNs come from the domains' manifests). All or nothing: a failure takes down the joins made so far."""
        links = {k: v for k, v in record.get("links", {}).items() if v.get("mode") == "overlay" and not v.get("joined")}
        if not links:
            return ""
        if self.overlay is None:
            raise Unsupported(MISSING)
        slivers: dict[str, str] = {}
        for a in answers.values():
            for node in _manifest_nodes(a.get("geni_rspec", "") if isinstance(a, dict) else ""):
                slivers.setdefault(node.get("client_id", ""), node.get("sliver_id", ""))
        made: list[str] = []
        for lid, link in links.items():
            a, b = (Endpoint(self.domains[d].urn, node, iface, slivers.get(node, ""), "", link.get("ips", {}).get(iface, ""),
                             int(link.get("capacity_kbps") or 0))
                    for d, iface, node in link["ends"])
            try:
                link["joined"] = dict(self.overlay.join(record["slice_urn"], lid, a, b))
            except Exception as exc:  # noqa: BLE001 - the overlay's failure is the answer
                for done in made:
                    self._leave_one(record["slice_urn"], done, links[done])
                raise Unavailable(f"overlay could not join link {lid}: {type(exc).__name__}: {exc}") from None
            made.append(lid)
            self._put(record)  # a crash from here on takes the join down with the slivers (see _undo)
        return "joined by overlay: " + ", ".join(links)

    def _leave_one(self, slice_urn: str, lid: str, link: dict[str, Any]) -> None:
        if self.overlay is None or not link.get("joined"):
            return
        try:
            self.overlay.leave(slice_urn, lid, link["joined"])
        except Exception:  # noqa: BLE001 - logged; the slivers are gone either way
            log.exception("overlay could not take down link %s", lid)
        link.pop("joined", None)

    def _leave_overlay(self, record: dict[str, Any]) -> None:
        for lid, link in record.get("links", {}).items():
            if link.get("mode") == "overlay":
                self._leave_one(record["slice_urn"], lid, link)

    # ---- undoing ---------------------------------------------------------------------------------------------
    def _undo(self, record: dict[str, Any], t: tx.Txn, steps: list[tx.Step],
              defer: frozenset[str] | set[str] = frozenset()) -> tuple[tx.Txn, list[tx.Step]]:
        """Run the rollback steps; those a domain did not take, and those at `defer`, stay in the record for
        the retry loop."""
        credentials, opts = record.get("credentials") or [], record.get("options") or {}
        left: list[tx.Step] = [step for step in steps if step.domain in defer]
        steps = [step for step in steps if step.domain not in defer]
        # every domain's step at once, each recorded as it ends: a hung domain costs its own timeout only,
        # and the others' parts are released meanwhile
        calls = [lambda step=step: self._undo_step(record["slice_urn"], step, credentials, opts, record)
                 for step in steps]
        for i, done in side_by_side(calls):
            step = steps[i]
            if done:
                with self._record_lock:
                    t, _ = tx.undone(t, step.domain)
                    record["txn"] = encode(t)
                    self._put(record)
            else:
                left.append(step)
        if t.status == tx.ROLLED_BACK:
            if t.op == tx.PROVISION:
                self._leave_overlay(record)
                record["domains"] = {}
            self._finish(record, t)
        return t, left

    def _undo_step(self, slice_urn: str, step: tx.Step, credentials: list, opts: dict, record: dict) -> bool:
        domain = self.domains.get(step.domain)
        if domain is None:
            log.error("rollback at unknown domain %s dropped (no longer in sep.yaml)", step.domain)
            return True
        try:
            slivers = list(step.slivers)
            if step.kind == "sweep":
                kept = set(record.get("domains", {}).get(step.domain, {}).get("slivers", []))
                try:
                    status = self.relay.call(domain, "Status", [slice_urn], credentials, opts)
                except Refusal as r:
                    if r.code == SearchFailed.code:
                        return True
                    raise
                slivers = [s["geni_sliver_urn"] for s in status.get("geni_slivers", [])
                           if s.get("geni_client_id") in step.client_ids and s["geni_sliver_urn"] not in kept]
            if slivers:
                self.relay.call(domain, "Delete", slivers, credentials, opts)
            log.info("undid %s at %s: %d sliver(s)", slice_urn, domain.urn, len(slivers))
            return True
        except Refusal as r:
            if r.code == SearchFailed.code:
                return True
            log.warning("undoing %s at %s refused (%d %s); will retry", slice_urn, domain.urn, r.code, r.output)
        except NoAnswer as exc:
            log.warning("undoing %s at %s: %s; will retry", slice_urn, domain.urn, exc)
        return False

    def recover(self) -> int:
        """Roll back every operation the record shows unfinished (from the retry loop, the first pass at
        start-up), the slices side by side: a slice held up by a hung domain does not hold up the others.
        A slice whose lock is held is left for the next pass: a live operation holds it, or an undo already
        under way. Returns how many are still unfinished."""
        urns = [r["slice_urn"] for r in self.store.scan(TABLE) if r.get("txn")]
        return sum(left for _, left in side_by_side([lambda u=u: self._recover_one(u) for u in urns]))

    def _recover_one(self, slice_urn: str) -> bool:
        """Roll back one slice's unfinished operation; True when some of it is still to undo."""
        try:
            with self._turn(slice_urn, "undoing an operation that did not finish"):
                record = self._record(slice_urn)
                if not record or not record.get("txn"):
                    return False
                t, steps = tx.recover(decode(record["txn"], tx.Txn, "transaction"))
                if not t.open:
                    self._finish(record, t)
                    return False
                where = sorted({st.domain for st in steps})
                self._holding[slice_urn] = f"undoing an unfinished {t.op} ({t.reason}) at {', '.join(where)}"
                record["txn"] = encode(t)
                self._put(record)
                t, left = self._undo(record, t, steps)
                return bool(left)
        except Busy:
            return True

    def retry_loop(self, stop: threading.Event, every: float) -> None:
        """Recover at once (the exchange point serves meanwhile: calls on a slice still being undone get BUSY),
        then every `every` seconds."""
        first = True
        while first or not stop.wait(every):
            try:
                left = self.recover()
                if first and left:
                    log.warning("%d unfinished operation(s) could not be undone yet; retrying every %g s", left, every)
            except Exception:  # noqa: BLE001 - keep retrying; the log has it
                log.exception("rollback retry failed")
            first = False


def side_by_side(calls: list[Callable[[], Any]]) -> Iterator[tuple[int, Any]]:
    """Run every call at once, each in a daemon thread (one waiting out a hung domain's timeout never keeps the
    process from exiting), and yield (index, result) as each ends; a call's exception is raised here."""
    done: queue.Queue[tuple[int, bool, Any]] = queue.Queue()

    def run(i: int, call: Callable[[], Any]) -> None:
        try:
            done.put((i, True, call()))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            done.put((i, False, exc))

    for i, call in enumerate(calls):
        threading.Thread(target=run, args=(i, call), name="sep-undo", daemon=True).start()
    for _ in calls:
        i, ok, value = done.get()
        if not ok:
            raise value
        yield i, value


def _manifest_nodes(text: str) -> list[Any]:
    """The node elements of a domain's manifest (empty when there is none)."""
    if not text:
        return []
    from lxml import etree

    from slicex.xmlsafe import parse_xml

    return [n for n in parse_xml(text, "manifest", 64 * 1024 * 1024)
            if isinstance(n.tag, str) and etree.QName(n).localname == "node"]


def _plain(value: Any) -> str:
    """A domain's RSpec (asked for uncompressed: the exchange point compresses the merged one if asked)."""
    return value if isinstance(value, str) else ""


def _compressed(text: str, options: dict[str, Any]) -> str:
    if options.get("geni_compressed"):
        return base64.b64encode(zlib.compress(text.encode("utf-8"))).decode("ascii")
    return text


def stitching_topology(domains: list[Domain], credentials: list, opts: dict, relay: Relay) -> tuple[Any, list[str]]:
    """The stitching topology from the domains' advertisements (their external ports and cables, as the
    stitching extension publishes them), and why a domain's could not be read (then it has no layer-2 ports
    as far as the exchange point knows)."""
    from stitching.model import Topology
    from stitching.topology import TopologyError, from_advertisement

    topo, unreadable = Topology({}, {}), []
    ad_opts = {k: v for k, v in opts.items() if k in ("geni_speaking_for",)}
    ad_opts["geni_rspec_version"] = {"type": "GENI", "version": "3"}
    for d in domains:
        try:
            ad = relay.call(d, "ListResources", credentials, ad_opts)
            topo = topo.merged(from_advertisement(ad, f"advertisement of {d.urn}", d.url))
        except TopologyError as exc:
            unreadable.append(str(exc))
        except Refusal as r:
            raise DomainError(r.code, f"reading {d.urn}'s advertisement for its stitching ports: {r.output}") from None
        except NoAnswer as exc:
            raise Unavailable(f"reading the advertisement for its stitching ports: {exc}") from None
    return topo, unreadable

