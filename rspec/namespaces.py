"""XML namespaces slicex reads and writes (DESIGN §5)."""

RSPEC3 = "http://www.geni.net/resources/rspec/3"
PGV2 = "http://www.protogeni.net/resources/rspec/2"
XSI = "http://www.w3.org/2001/XMLSchema-instance"
STITCH2 = "http://www.geni.net/resources/rspec/ext/stitch/2/"
SHARED_VLAN = "http://www.protogeni.net/resources/rspec/ext/shared-vlan/1"
SHARED_VLAN_GENI = "http://www.geni.net/resources/rspec/ext/shared-vlan/1"
OPSTATE = "http://www.geni.net/resources/rspec/ext/opstate/1"
EMULAB = "http://www.protogeni.net/resources/rspec/ext/emulab/1"
PUBLIC = "http://slicex.dev/rspec/ext/public/1"  # public ports forwarded to nodes (schemas/public-1.xsd)
MEASURE = "http://slicex.dev/rspec/ext/measure/1"  # a link's port mirror to a capture node (schemas/measure-1.xsd)
QINQ = "http://slicex.dev/rspec/ext/qinq/1"
CAPACITY = "http://slicex.dev/rspec/ext/capacity/1"
UPDATE = "http://slicex.dev/rspec/ext/update/1"  # a staged Update's action per sliver (schemas/update-1.xsd)
SLOT = "http://slicex.dev/rspec/ext/slot/1"  # ListResources slicex_find_slot: the slot found (rspec/slot.py)

REQUEST_XSD = "http://www.geni.net/resources/rspec/3/request.xsd"
AD_XSD = "http://www.geni.net/resources/rspec/3/ad.xsd"
MANIFEST_XSD = "http://www.geni.net/resources/rspec/3/manifest.xsd"
OPSTATE_XSD = "http://www.geni.net/resources/rspec/ext/opstate/1/ad.xsd"


def q(ns: str, tag: str) -> str:
    """Clark notation `{ns}tag` for lxml."""
    return f"{{{ns}}}{tag}"
