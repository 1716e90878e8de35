"""SFA/GENI credentials: signed XML (XML-DSig through xmlsec) granting an owner privileges on a target.

Layout (what omni and other GENI tools exchange):
  <signed-credential><credential xml:id="ref…">type, serial, owner_gid, owner_urn, target_gid, target_urn,
  uuid, expires, privileges, [parent: the delegating credential]</credential>
  <signatures><Signature xml:id="Sig_ref…"> one per credential in the chain </Signature></signatures>
  </signed-credential>
Each signature references its credential by xml:id and carries the signer's certificate chain in KeyInfo.
We sign with rsa-sha256 (ecdsa-sha256 when the signer's key is elliptic-curve, as slicex's own actor keys are);
we verify rsa-sha1 too, since delegated credentials in the wild use it. Whose signature makes a credential is
decided by the signer's certificate (`ISSUER_NAME`), never by its algorithm."""

from __future__ import annotations

import base64
import hashlib
import secrets
import xmlrpc.client
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import xmlsec
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from lxml import etree

from slicex import pki
from slicex.clock import parse_time, rfc3339
from slicex.errors import (
    BadArgs,
    CredentialExpired,
    CredentialInvalid,
    CredentialMismatch,
    CredentialSignerUntrusted,
    Forbidden,
    GeniError,
    TooBig,
)
from slicex.urn import Urn, parse_urn
from slicex.xmlsafe import parse_xml

DS = "http://www.w3.org/2000/09/xmldsig#"
XSI = "http://www.w3.org/2001/XMLSchema-instance"
XML_ID = "{http://www.w3.org/XML/1998/namespace}id"
MAX_CREDENTIAL_BYTES = 1024 * 1024
MAX_CHAIN = 8

C14N = "http://www.w3.org/TR/2001/REC-xml-c14n-20010315"
ENVELOPED = "http://www.w3.org/2000/09/xmldsig#enveloped-signature"
RSA_SHA256 = "http://www.w3.org/2001/04/xmldsig-more#rsa-sha256"
ECDSA_SHA256 = "http://www.w3.org/2001/04/xmldsig-more#ecdsa-sha256"
ALLOWED_SIGNATURE_METHODS = {"http://www.w3.org/2000/09/xmldsig#rsa-sha1", RSA_SHA256, ECDSA_SHA256}

METHOD_PRIVILEGES = {"Allocate": "createsliver", "Provision": "createsliver", "PerformOperationalAction": "createsliver",
                     "Delete": "deleteslice", "Status": "getsliceresources", "Describe": "getsliceresources",
                     "Renew": "renewsliver", "Shutdown": "shutdown", "ListResources": "listresources"}
"""AM API method → the operation a credential must allow (DESIGN §4)."""

_SLICE_OPS = {"createsliver", "deleteslice", "getsliceresources", "renewsliver", "listresources"}
OPERATIONS_BY_PRIVILEGE: dict[str, set[str]] = {
    "*": _SLICE_OPS | {"shutdown"},
    "sa": _SLICE_OPS,
    "pi": _SLICE_OPS,
    "embed": _SLICE_OPS,
    "control": _SLICE_OPS,
    "instantiate": {"createsliver", "getsliceresources"},
    "bind": {"createsliver"},
    "refresh": {"renewsliver", "getsliceresources"},
    "info": {"getsliceresources", "listresources"},
    "resolve": {"listresources"},
    "operator": {"shutdown", "getsliceresources", "listresources"},
}
"""Privilege names other slice authorities put in credentials → the operations they allow, so credentials
from federation peers mean the same here as at home."""


@dataclass(frozen=True)
class Credential:
    xml_id: str
    type: str
    serial: str
    owner_urn: str
    owner_gid: tuple[x509.Certificate, ...]
    target_urn: str
    target_gid: tuple[x509.Certificate, ...]
    expires: datetime
    privileges: dict[str, bool]
    parent: Credential | None
    uuid: str = ""
    abac: etree._Element | None = None

    def allows(self, operation: str) -> bool:
        return any(operation in OPERATIONS_BY_PRIVILEGE.get(p, {p}) for p in self.privileges)

    def chain(self) -> list[Credential]:
        out, c = [], self
        while c is not None:
            out.append(c)
            c = c.parent
        return out


@dataclass(frozen=True)
class VerifiedCredential:
    credential: Credential
    effective_caller_urn: str
    expires: datetime


# ---- creating ------------------------------------------------------------------------------------------------
def _pem_body(certs: list[bytes]) -> str:
    return "".join(c.decode() if isinstance(c, bytes) else c for c in certs)


def _signature_template(parent: etree._Element, ref: str, chain: list[x509.Certificate]) -> etree._Element:
    sig = etree.SubElement(parent, f"{{{DS}}}Signature", nsmap={None: DS})
    sig.set(XML_ID, f"Sig_{ref}")
    si = etree.SubElement(sig, f"{{{DS}}}SignedInfo")
    etree.SubElement(si, f"{{{DS}}}CanonicalizationMethod", Algorithm=C14N)
    method = ECDSA_SHA256 if isinstance(chain[0].public_key(), ec.EllipticCurvePublicKey) else RSA_SHA256
    etree.SubElement(si, f"{{{DS}}}SignatureMethod", Algorithm=method)
    reference = etree.SubElement(si, f"{{{DS}}}Reference", URI=f"#{ref}")
    transforms = etree.SubElement(reference, f"{{{DS}}}Transforms")
    etree.SubElement(transforms, f"{{{DS}}}Transform", Algorithm=ENVELOPED)
    etree.SubElement(reference, f"{{{DS}}}DigestMethod", Algorithm="http://www.w3.org/2001/04/xmlenc#sha256")
    etree.SubElement(reference, f"{{{DS}}}DigestValue")
    etree.SubElement(sig, f"{{{DS}}}SignatureValue")
    key_info = etree.SubElement(sig, f"{{{DS}}}KeyInfo")
    data = etree.SubElement(key_info, f"{{{DS}}}X509Data")
    for cert in chain:
        der = cert.public_bytes(pki.serialization.Encoding.DER)
        etree.SubElement(data, f"{{{DS}}}X509Certificate").text = base64.b64encode(der).decode()
    return sig


def _sign(sig: etree._Element, key_pem: bytes) -> None:
    ctx = xmlsec.SignatureContext()
    ctx.key = xmlsec.Key.from_memory(key_pem, xmlsec.KeyFormat.PEM)
    ctx.sign(sig)


def _sub(parent: etree._Element, tag: str, text: str = "") -> etree._Element:
    el = etree.SubElement(parent, tag)
    el.text = text
    return el


def _new_document() -> etree._Element:
    root = etree.Element("signed-credential", nsmap={"xsi": XSI})
    root.set(f"{{{XSI}}}noNamespaceSchemaLocation", "http://www.geni.net/resources/credential/2/credential.xsd")
    root.set(f"{{{XSI}}}schemaLocation", "http://www.protogeni.net/resources/credential/ext/policy/1 "
                                         "http://www.protogeni.net/resources/credential/ext/policy/1/policy.xsd")
    return root


def create_credential(*, owner_cert: bytes, target_cert: bytes, privileges: dict[str, bool], expires: datetime,
                      signer_cert_chain: list[bytes], signer_key_pem: bytes, parent: str | None = None,
                      serial: str = "1") -> str:
    """A signed privilege credential; with `parent` (a credential's XML) it is a delegation of it."""
    owner = pki.load_certs(owner_cert)
    target = pki.load_certs(target_cert)
    if not owner or not target:
        raise BadArgs("owner and target must be PEM certificates")
    root = _new_document()
    ref = "ref" + secrets.token_hex(8)
    cred = etree.SubElement(root, "credential")
    cred.set(XML_ID, ref)
    _sub(cred, "type", "privilege")
    _sub(cred, "serial", serial)
    _sub(cred, "owner_gid", _pem_body([owner_cert]))
    _sub(cred, "owner_urn", pki.cert_urn(owner[0]))
    _sub(cred, "target_gid", _pem_body([target_cert]))
    _sub(cred, "target_urn", pki.cert_urn(target[0]))
    _sub(cred, "uuid", "")
    _sub(cred, "expires", rfc3339(expires))
    privs = etree.SubElement(cred, "privileges")
    for name, can_delegate in privileges.items():
        p = etree.SubElement(privs, "privilege")
        _sub(p, "name", name)
        _sub(p, "can_delegate", "true" if can_delegate else "false")
    signatures = etree.SubElement(root, "signatures")
    if parent is not None:
        parent_root = parse_xml(parent, "parent credential", MAX_CREDENTIAL_BYTES)
        parent_el = etree.SubElement(cred, "parent")
        parent_el.append(parent_root.find("credential"))
        for old in parent_root.find("signatures") if parent_root.find("signatures") is not None else []:
            signatures.append(old)
    chain = [c for pem in signer_cert_chain for c in pki.load_certs(pem)]
    sig = _signature_template(signatures, ref, chain)
    if parent is not None:
        signatures.remove(sig)
        signatures.insert(0, sig)
    _sign(sig, signer_key_pem)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + etree.tostring(root, encoding="unicode")


def create_abac(*, head_keyid: str, head_mnemonic: str, role: str, tail_keyid: str, tail_mnemonic: str,
                expires: datetime, signer_cert_chain: list[bytes], signer_key_pem: bytes) -> str:
    """An ABAC RT0 credential `head.role <- tail` (speaks-for uses role speaks_for_<head keyid>)."""
    root = _new_document()
    ref = "ref" + secrets.token_hex(8)
    cred = etree.SubElement(root, "credential")
    cred.set(XML_ID, ref)
    _sub(cred, "type", "abac")
    for tag in ("serial", "owner_gid", "owner_urn", "target_gid", "target_urn", "uuid"):
        _sub(cred, tag)
    _sub(cred, "expires", rfc3339(expires))
    rt0 = etree.SubElement(etree.SubElement(cred, "abac"), "rt0")
    _sub(rt0, "version", "1.1")
    head = etree.SubElement(rt0, "head")
    principal = etree.SubElement(head, "ABACprincipal")
    _sub(principal, "keyid", head_keyid)
    _sub(principal, "mnemonic", head_mnemonic)
    _sub(head, "role", role)
    tail = etree.SubElement(rt0, "tail")
    principal = etree.SubElement(tail, "ABACprincipal")
    _sub(principal, "keyid", tail_keyid)
    _sub(principal, "mnemonic", tail_mnemonic)
    signatures = etree.SubElement(root, "signatures")
    chain = [c for pem in signer_cert_chain for c in pki.load_certs(pem)]
    _sign(_signature_template(signatures, ref, chain), signer_key_pem)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + etree.tostring(root, encoding="unicode")


# ---- parsing -------------------------------------------------------------------------------------------------
# Only what was signed is read. The rules below make "the element a signature covers" and "the element this
# module parses" the same object, which closes the XML signature wrapping family:
#  * the document is <signed-credential> with exactly one <credential> and at most one <signatures> child;
#  * an element is named only by xml:id (the one ID attribute libxml2, and so xmlsec, resolves); every xml:id
#    is unique (the parser refuses duplicates); plain id/Id/ID attributes inside credentials are refused;
#  * the chain is <credential> → <parent>/<credential> → …, each a direct child, each with its own xml:id;
#  * signatures live only as direct children of <signatures>, one per credential of the chain and nothing
#    else, each with one Reference to "#<xml:id>", allowed algorithms and transforms only;
#  * no comments anywhere (C14N without comments hides them from the digest, and a comment splits a text
#    node: `urn:…+user+ali<!---->ce` reads as `…+user+ali`), and fields are leaves that appear once.
_LEAF_FIELDS = ("type", "serial", "owner_gid", "owner_urn", "target_gid", "target_urn", "uuid", "expires")
_PLAIN_IDS = ("id", "Id", "ID")
DIGEST_METHODS = {"http://www.w3.org/2000/09/xmldsig#sha1", "http://www.w3.org/2001/04/xmlenc#sha256"}
CANONICALIZATIONS = {C14N, "http://www.w3.org/TR/2001/REC-xml-c14n-20010315#WithComments",
                     "http://www.w3.org/2001/10/xml-exc-c14n#", "http://www.w3.org/2001/10/xml-exc-c14n#WithComments"}
ALLOWED_TRANSFORMS = CANONICALIZATIONS | {ENVELOPED}


def _field(el: etree._Element, tag: str) -> str:
    """The text of a leaf child that appears at most once ('' if absent)."""
    found = el.findall(tag)
    if len(found) > 1:
        raise CredentialInvalid(f"credential carries <{tag}> {len(found)} times")
    if not found:
        return ""
    if len(found[0]):
        raise CredentialInvalid(f"credential field <{tag}> must hold text only, not elements")
    return (found[0].text or "").strip()


def _parse_credential_element(el: etree._Element, depth: int = 0) -> Credential:
    if depth > MAX_CHAIN:
        raise CredentialInvalid(f"delegation chain is deeper than {MAX_CHAIN}")
    xml_id = el.get(XML_ID) or ""
    if not xml_id:
        raise CredentialInvalid("credential has no xml:id, so no signature can refer to it")
    kind = _field(el, "type")
    expires_text = _field(el, "expires")
    try:
        expires = parse_time(expires_text)
    except BadArgs:
        raise CredentialInvalid(f"credential expiry {expires_text!r} is not a time") from None
    privileges: dict[str, bool] = {}
    privs = el.findall("privileges")
    if len(privs) > 1:
        raise CredentialInvalid("credential carries <privileges> more than once")
    for p in privs[0].findall("privilege") if privs else []:
        name = _field(p, "name")
        if name in privileges:
            raise CredentialInvalid(f"credential lists privilege {name!r} twice")
        privileges[name] = _field(p, "can_delegate").lower() in ("true", "1")
    parents = el.findall("parent")
    if len(parents) > 1:
        raise CredentialInvalid("credential carries <parent> more than once")
    parent = None
    if parents:
        inner = parents[0].findall("credential")
        if len(inner) != 1 or len(parents[0]) != 1:
            raise CredentialInvalid("<parent> must hold exactly one <credential> and nothing else")
        parent = _parse_credential_element(inner[0], depth + 1)
    owner_gid = tuple(pki.load_certs(_field(el, "owner_gid")))
    target_gid = tuple(pki.load_certs(_field(el, "target_gid")))
    if kind == "privilege" and (not owner_gid or not target_gid):
        raise CredentialInvalid("credential lacks an owner or target certificate (owner_gid/target_gid)")
    abac = el.findall("abac")
    if len(abac) > 1:
        raise CredentialInvalid("credential carries <abac> more than once")
    return Credential(xml_id, kind, _field(el, "serial"), _field(el, "owner_urn"), owner_gid,
                      _field(el, "target_urn"), target_gid, expires, privileges, parent, _field(el, "uuid"),
                      abac[0] if abac else None)


def _check_shape(root: etree._Element) -> etree._Element:
    """Refuse documents where a signed element and a read element could differ; return the top credential."""
    if root.tag != "signed-credential":
        raise CredentialInvalid(f"expected <signed-credential><credential>…, got <{root.tag}>")
    for node in root.iter():
        if not isinstance(node.tag, str):
            raise CredentialInvalid("credential carries an XML comment or processing instruction; signed "
                                    "credentials here never do, and a comment can change what a field reads as")
    children = list(root)
    credentials = [c for c in children if c.tag == "credential"]
    signatures = [c for c in children if c.tag == "signatures"]
    foreign = [c.tag for c in children if c.tag not in ("credential", "signatures")]
    if len(credentials) != 1:
        raise CredentialInvalid(f"<signed-credential> must hold exactly one <credential>, not {len(credentials)}")
    if len(signatures) > 1 or foreign:
        raise CredentialInvalid(f"<signed-credential> holds unexpected elements "
                                f"({', '.join(map(str, foreign)) or 'a second <signatures>'})")
    for el in credentials[0].iter():
        plain = [a for a in _PLAIN_IDS if a in el.attrib]
        if plain:
            raise CredentialInvalid(f"<{el.tag}> carries a plain {plain[0]!r} attribute; credentials are named by "
                                    f"xml:id only")
    for sig in root.iter(f"{{{DS}}}Signature"):
        if sig.getparent() is not (signatures[0] if signatures else None):
            raise CredentialInvalid("credential has a Signature outside <signatures>; refused")
    return credentials[0]


def _document(text: Any) -> etree._Element:
    if not isinstance(text, (str, bytes)):
        raise CredentialInvalid(f"credential must be an XML string, got {type(text).__name__}")
    try:
        return parse_xml(text, "credential", MAX_CREDENTIAL_BYTES)
    except TooBig:
        raise
    except BadArgs as exc:
        raise CredentialInvalid(f"credential is not usable XML: {exc.message}") from None


def parse_credential(text: str) -> Credential:
    """Parse (without verifying) a credential."""
    root = _document(text)
    return _parse_credential_element(_check_shape(root))


# ---- verifying -----------------------------------------------------------------------------------------------
def _signer_chain(sig: etree._Element) -> list[x509.Certificate]:
    certs = []
    data = sig.findall(f"{{{DS}}}KeyInfo/{{{DS}}}X509Data")
    if len(data) != 1:
        raise CredentialInvalid("a credential signature's KeyInfo must carry exactly one X509Data with the signer's chain")
    for c in data[0].findall(f"{{{DS}}}X509Certificate"):
        try:
            certs.append(x509.load_der_x509_certificate(base64.b64decode("".join((c.text or "").split()))))
        except ValueError:
            raise CredentialInvalid("a signature's X509Certificate is not a certificate") from None
    if not certs:
        raise CredentialInvalid("a signature carries no signer certificate in KeyInfo")
    return certs


def _signature_reference(sig: etree._Element) -> str:
    """The xml:id a signature covers, after checking it uses only allowed algorithms and transforms."""
    info = sig.findall(f"{{{DS}}}SignedInfo")
    if len(info) != 1:
        raise CredentialInvalid("a credential signature must carry exactly one SignedInfo")
    refs = info[0].findall(f"{{{DS}}}Reference")
    if len(refs) != 1:
        raise CredentialInvalid("each credential signature must carry exactly one Reference")
    c14n = info[0].find(f"{{{DS}}}CanonicalizationMethod")
    if c14n is None or c14n.get("Algorithm") not in CANONICALIZATIONS:
        raise CredentialInvalid("credential signature canonicalization is not (exclusive) XML C14N")
    method = info[0].find(f"{{{DS}}}SignatureMethod")
    if method is None or method.get("Algorithm") not in ALLOWED_SIGNATURE_METHODS:
        raise CredentialInvalid("credential signature method is not rsa-sha1, rsa-sha256 or ecdsa-sha256")
    digest = refs[0].find(f"{{{DS}}}DigestMethod")
    if digest is None or digest.get("Algorithm") not in DIGEST_METHODS:
        raise CredentialInvalid("credential signature digest is not sha1 or sha256")
    for t in refs[0].iter(f"{{{DS}}}Transform"):
        if t.get("Algorithm") not in ALLOWED_TRANSFORMS or len(t):
            raise CredentialInvalid(f"credential signature uses transform {t.get('Algorithm')}, which is not allowed "
                                    f"(enveloped signature and C14N only, without parameters)")
    uri = refs[0].get("URI") or ""
    if not uri.startswith("#") or len(uri) < 2:
        raise CredentialInvalid(f"credential signature reference {uri!r} does not name a credential by xml:id")
    return uri[1:]


def _check_signatures(root: etree._Element, cred: Credential) -> dict[str, list[x509.Certificate]]:
    """Verify one signature per credential in the chain, and no others; return xml:id → signer chain (leaf
    first, as KeyInfo carried it). Whether those signers are trusted at a given time is the caller's check."""
    chain_ids = [c.xml_id for c in cred.chain()]
    signatures = root.find("signatures")
    by_ref: dict[str, etree._Element] = {}
    for sig in list(signatures) if signatures is not None else []:
        if sig.tag != f"{{{DS}}}Signature":
            raise CredentialInvalid(f"credential <signatures> holds <{sig.tag}>; only XML-DSig Signatures belong there")
        ref = _signature_reference(sig)
        if ref not in chain_ids:
            raise CredentialInvalid(f"a credential signature covers {ref!r}, which is not a credential of this chain")
        if ref in by_ref:
            raise CredentialInvalid(f"credential {ref} carries two signatures")
        by_ref[ref] = sig
    signers: dict[str, list[x509.Certificate]] = {}
    for c in cred.chain():
        sig = by_ref.get(c.xml_id)
        if sig is None:
            raise CredentialInvalid(f"credential {c.xml_id} (owner {c.owner_urn or '?'}) is not signed")
        chain = _signer_chain(sig)
        ctx = xmlsec.SignatureContext()
        try:
            ctx.key = xmlsec.Key.from_memory(chain[0].public_bytes(pki.serialization.Encoding.PEM),
                                             xmlsec.KeyFormat.CERT_PEM)
            ctx.verify(sig)
        except xmlsec.Error:
            raise CredentialInvalid(f"signature over credential {c.xml_id} does not verify: the credential was "
                                    f"altered or signed with another key") from None
        signers[c.xml_id] = chain
    return signers


def verify_signed(text: Any, trust: pki.TrustStore, now: datetime, cache: pki.LruCache | None = None,
                  ) -> tuple[Credential, dict[str, list[x509.Certificate]]]:
    """Parse a credential document and verify every signature of its chain and every signer's path to a
    trusted root at `now`; what comes back is exactly what the signatures cover (see the rules above).
    Delegation and authority are checked by the caller.

    With a cache, a document whose signatures verified before (same bytes) is not parsed and verified again:
    omni and scripts send the same slice credential with every call, and XML-DSig verification was a third of
    an AM call's CPU. The signers' paths are still validated at `now` (that is time-dependent; the trust
    store caches it within the certificates' validity)."""
    key = None
    if cache is not None and isinstance(text, (str, bytes)):
        key = hashlib.sha256(text.encode() if isinstance(text, str) else text).digest()
    hit = cache.get(key) if key is not None else None
    if hit is None:
        root = _document(text)
        cred = _parse_credential_element(_check_shape(root))
        signers = _check_signatures(root, cred)
        if key is not None:
            cache.put(key, (cred, signers))
    else:
        cred, signers = hit
    for chain in signers.values():
        trust.verify_chain(chain[0], chain[1:], now)
    return cred, signers


def _same_key(a: x509.Certificate, b: x509.Certificate) -> bool:
    return a.public_key().public_bytes(pki.serialization.Encoding.DER,
                                       pki.serialization.PublicFormat.SubjectPublicKeyInfo) == \
        b.public_key().public_bytes(pki.serialization.Encoding.DER, pki.serialization.PublicFormat.SubjectPublicKeyInfo)


def _authority_of(urn: str) -> str:
    try:
        return parse_urn(urn).authority.lower()
    except BadArgs:
        return ""


ISSUER_NAME = "sa"
"""Slice and user credentials are issued by slice authorities only, named `urn:publicid:IDN+<ns>+authority+sa`
as gcf, ProtoGENI and the GENI clearinghouse name theirs. Every other identity a root certifies (an aggregate,
broker or authority actor, an exchange point, a user) signs other things or nothing, and a credential whose
first signer it is proves nothing: holding the AM's or a network-facing relay's key must not make one the owner
of another user's slice. Delegation (a credential's owner signing a child for someone else) is unaffected: the
root of every chain is still a slice authority's."""


def _slice_authority(urn: str) -> Urn | None:
    """The URN as a slice authority's (`…+authority+sa`), or None when it names anything else."""
    try:
        parsed = parse_urn(urn, "authority")
    except BadArgs:
        return None
    return parsed if parsed.name.lower() == ISSUER_NAME else None


def _check_delegation(cred: Credential, signers: dict[str, list[x509.Certificate]]) -> None:
    child = cred
    while child.parent is not None:
        parent = child.parent
        for name in child.privileges:
            if name not in parent.privileges and "*" not in parent.privileges:
                raise CredentialInvalid(f"delegated credential grants {name!r}, which its parent does not")
            granted = parent.privileges.get(name, parent.privileges.get("*"))
            if not granted:
                raise CredentialInvalid(f"privilege {name!r} was delegated but the parent marks it can_delegate=false")
        if child.target_urn.lower() != parent.target_urn.lower():
            raise CredentialInvalid(f"delegation changes the target from {parent.target_urn} to {child.target_urn}")
        if child.expires > parent.expires:
            raise CredentialInvalid(f"delegated credential expires {rfc3339(child.expires)}, after its parent "
                                    f"({rfc3339(parent.expires)})")
        if not parent.owner_gid or not _same_key(signers[child.xml_id][0], parent.owner_gid[0]):
            raise CredentialInvalid("delegated credential is not signed by the owner of its parent")
        child = parent
    root_signer = signers[child.xml_id][0]
    signer_urn = pki.cert_urn(root_signer)
    signer = _slice_authority(signer_urn)
    if signer is None:
        raise CredentialInvalid(f"credential for {child.target_urn} was issued by "
                                f"{signer_urn or root_signer.subject.rfc4514_string()}, which is not a slice "
                                f"authority: only a slice authority (urn:publicid:IDN+<namespace>+authority+"
                                f"{ISSUER_NAME}) issues slice and user credentials; get yours from it")
    target_auth = _authority_of(child.target_urn)
    if not (target_auth == signer.authority.lower() or target_auth.startswith(signer.authority.lower() + ":")):
        raise CredentialSignerUntrusted(f"{signer_urn} may not issue credentials for {child.target_urn} (outside "
                                        f"its namespace {signer.authority})")


def _xml_value(value: Any) -> Any:
    """A credential's XML as the client sent it: geni-lib sends it as XML-RPC base64 (Binary), omni as a
    string; both are the same signed bytes."""
    return value.data if isinstance(value, xmlrpc.client.Binary) else value


UNCLASSIFIED = "geni_unknown"
"""The label omni gives a credential it cannot classify: a delegated credential holds two `<type>` elements (its
own and its parent's), and omni's type check wants exactly one."""


def sort_credentials(credentials: list) -> tuple[list[Any], list[Any], list[GeniError]]:
    """What a client passed, as (SFA credentials, ABAC statements, refusals).

    A struct labelled geni_sfa 2/3 or geni_abac 1 goes where its label says, a bare string is SFA. A struct
    labelled `geni_unknown` says the client could not tell: its content decides, and it is SFA when it parses as
    a privilege credential. No trust rests on that: an SFA credential (like a bare string) is verified in full
    from its content alone. A struct naming a type that does not exist is refused (the GENI AM API acceptance
    suite's badtype test), even when its content is a good credential."""
    sfa: list[Any] = []
    abac: list[Any] = []
    errors: list[GeniError] = []
    for entry in credentials:
        if isinstance(entry, str):
            sfa.append(entry)
        elif isinstance(entry, dict):
            kind, version = entry.get("geni_type"), str(entry.get("geni_version", ""))
            value = _xml_value(entry.get("geni_value"))
            if kind == "geni_sfa" and version in ("2", "3"):
                sfa.append(value)
            elif kind == "geni_abac" and version == "1":
                abac.append(value)
            elif kind == UNCLASSIFIED:
                try:
                    content = parse_credential(value).type
                except GeniError as exc:
                    content = f"not a credential: {exc.message}"
                if content == "privilege":
                    sfa.append(value)
                else:
                    errors.append(CredentialInvalid(
                        f"credential labelled {UNCLASSIFIED} is not an SFA privilege credential ({content}); this "
                        f"aggregate accepts geni_sfa 2/3 and geni_abac 1"))
            else:
                errors.append(CredentialInvalid(f"unknown credential type {kind} {version}; this aggregate "
                                                f"accepts geni_sfa 2/3 and geni_abac 1 (and {UNCLASSIFIED} when "
                                                f"the content is an SFA privilege credential)"))
        else:
            errors.append(CredentialInvalid(f"a credential must be a struct or a string, got "
                                            f"{type(entry).__name__}"))
    return sfa, abac, errors


# error ranks: a credential that got further explains the refusal better
_RANK = {CredentialInvalid: 1, CredentialSignerUntrusted: 2, CredentialExpired: 3, CredentialMismatch: 4, Forbidden: 5}


class CredentialVerifier:
    def __init__(self, trust: pki.TrustStore, cache_size: int = 4096):
        self.trust = trust
        self._signed = pki.LruCache(cache_size)  # credential bytes → what its signatures cover
        # (credential bytes, caller's certificate, target, privilege, roots' generation) → the answer, and the
        # times between which every certificate and credential it rests on is valid: the same call with the
        # same credential (what omni and scripts make over and over) is answered without checking it again
        self._granted = pki.LruCache(cache_size)

    def verify(self, credentials: list, caller_cert: x509.Certificate, target_urn: str | None, privilege: str,
               now: datetime, speaking_for: str | None = None) -> VerifiedCredential:
        """Find a credential in `credentials` that lets the caller do `privilege` on `target_urn` (None: any
        credential the caller owns); raise the most informative refusal otherwise."""
        if not isinstance(credentials, list):
            raise BadArgs(f"credentials must be a list, got {type(credentials).__name__}")
        sfa, abac, errors = sort_credentials(credentials)
        caller = caller_cert
        caller_urn = pki.cert_urn(caller_cert)
        if speaking_for is not None:
            from slicex.speaksfor import verify_speaks_for

            caller = verify_speaks_for(abac, caller_cert, speaking_for, self.trust, now)
            caller_urn = pki.cert_urn(caller)
        for text in sfa:
            try:
                return self._verify_one(text, caller, caller_urn, target_urn, privilege, now)
            except (CredentialInvalid, CredentialSignerUntrusted, CredentialExpired, CredentialMismatch,
                    Forbidden) as exc:
                errors.append(exc)
            except TooBig as exc:
                errors.append(CredentialInvalid(exc.message))
        if not errors:
            raise CredentialInvalid("no usable credential was passed; send your slice or user credential")
        raise max(errors, key=lambda e: _RANK.get(type(e), 0))

    def _verify_one(self, text: Any, caller: x509.Certificate, caller_urn: str, target_urn: str | None,
                    privilege: str, now: datetime) -> VerifiedCredential:
        key = None
        if isinstance(text, (str, bytes)):
            key = (hashlib.sha256(text.encode() if isinstance(text, str) else text).digest(),
                   caller.fingerprint(pki.hashes.SHA256()), (target_urn or "").lower(), target_urn is None,
                   privilege, self.trust.generation)
            hit = self._granted.get(key)
            if hit is not None and hit[1] <= now < hit[2]:
                return hit[0]
        verified, valid_from, valid_until = self._check_one(text, caller, caller_urn, target_urn, privilege, now)
        if key is not None:
            self._granted.put(key, (verified, valid_from, valid_until))
        return verified

    def _check_one(self, text: Any, caller: x509.Certificate, caller_urn: str, target_urn: str | None,
                   privilege: str, now: datetime) -> tuple[VerifiedCredential, datetime, datetime]:
        """Every check of one credential; with the answer, the window in which each certificate of every
        path it rests on (and the credential chain) stays valid, so that the answer holds within it."""
        cred, signers = verify_signed(text, self.trust, now, self._signed)
        if cred.type != "privilege":
            raise CredentialInvalid(f"a {cred.type!r} credential cannot grant privileges here")
        _check_delegation(cred, signers)
        earliest = min(c.expires for c in cred.chain())
        if earliest <= now:
            raise CredentialExpired(f"credential for {cred.target_urn} expired at {rfc3339(earliest)}")
        if not _same_key(cred.owner_gid[0], caller):
            raise CredentialMismatch(f"credential belongs to {cred.owner_urn}, not to you ({caller_urn})")
        # TLS checked the caller's chain against every root; here its name must also lie in its root's namespace
        # (a peer's root cannot mint identities in ours).
        caller_path = self.trust.verify_chain(caller, list(cred.owner_gid[1:]), now)
        if target_urn is not None and cred.target_urn.lower() != target_urn.lower():
            raise CredentialMismatch(f"credential is for {cred.target_urn}, not {target_urn}")
        if target_urn is not None and not cred.allows(privilege):
            raise Forbidden(f"credential for {cred.target_urn} grants {', '.join(sorted(cred.privileges)) or 'nothing'}"
                            f"; {privilege} is needed")
        paths = [self.trust.verify_chain(chain[0], chain[1:], now) for chain in signers.values()]
        paths.append(caller_path)
        certs = [c for path in paths for c in path]
        valid_from = max(c.not_valid_before_utc for c in certs)
        valid_until = min([earliest, *(c.not_valid_after_utc for c in certs)])
        return VerifiedCredential(cred, caller_urn, earliest), valid_from, valid_until


def credential_slices(credentials: Any) -> list[str]:
    """The slices the SFA credentials passed claim to be for (canonical, unverified): the targets to try when a
    call names only slivers (the AM API v3 and the exchange point). The verifier then checks each claim in full."""
    targets: list[str] = []
    for text in sort_credentials(credentials)[0] if isinstance(credentials, list) else []:
        if not isinstance(text, (str, bytes)):
            continue
        try:
            urn = parse_urn(parse_credential(text).target_urn)
        except Exception:  # noqa: BLE001 - only a candidate; the verifier gives the refusal
            continue
        if urn.type == "slice" and urn.canonical not in targets:
            targets.append(urn.canonical)
    return targets
