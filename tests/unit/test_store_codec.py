"""The stored form of documents (slicex/store/codec.py): every form ever written reads back, a record is stored
deflated, and the version-1 dictionary never changes (documents written with it must stay readable)."""

from __future__ import annotations

import hashlib
import json

from slicex.store import codec

RECORD = {"id": "urn:publicid:IDN+t.org+sliver+0123456789abcdef", "slice_urn": "urn:publicid:IDN+t.org+slice+s",
          "ticket": {"units": [f"mem:urn:publicid:IDN+t.org+node+pc1:{i}" for i in range(8)], "sequence": 2},
          "r": {"state": "Active", "end": "2030-01-01T00:00:00Z"}, "n": None, "ok": True, "x": 1.5}


def test_a_record_is_stored_deflated_and_reads_back():
    stored = codec.encode(RECORD)
    assert stored[:1] == b"\x01" and len(stored) < len(json.dumps(RECORD, separators=(",", ":"))) / 2
    assert codec.decode(stored) == RECORD


def test_a_small_document_is_stored_as_its_json():
    assert codec.encode({"version": "abc"}) == b'{"version":"abc"}'
    assert codec.decode(codec.encode({"version": "abc"})) == {"version": "abc"}


def test_json_text_written_before_reads_back():
    spaced = json.dumps(RECORD, sort_keys=True)  # what the stores wrote before (str from SQLite TEXT or Redis)
    assert codec.decode(spaced) == RECORD and codec.decode(spaced.encode()) == RECORD


def test_keys_are_sorted_and_other_keys_still_written():
    assert codec.encode({"b": 1, "a": 2}) == b'{"a":2,"b":1}'
    assert codec.decode(codec.encode({1: "x", 2: "y" * 200})) == {"1": "x", "2": "y" * 200}


def test_the_version_1_dictionary_never_changes():
    assert hashlib.sha256(codec._DICTIONARY_1).hexdigest() == \
        "27c0436a426d5bc06c3e6a593ebe3eabb29527ee432ce5b80beefcf649c85bb5"


def test_a_lease_stored_beside_its_ticket_reads_back_the_same_signed_lease():
    """slicex/ticket.py `lease_beside`: only what differs from the ticket is stored, the same lease (the same
    signed bytes) comes back, labels included when the lease's differ from the ticket's (none against some)."""
    from datetime import UTC, datetime, timedelta

    from slicex.ticket import Lease, Ticket, lease_beside, lease_from

    start = datetime(2030, 1, 1, tzinfo=UTC)
    units = ("core:urn:publicid:IDN+t.org+node+pc1:0", "mem:urn:publicid:IDN+t.org+node+pc1:3")
    ticket = Ticket("g/r1", "broker", "sm", "r1", units, start, start + timedelta(hours=1), 2, "sig",
                    (("vlan", 1042),), "auth")
    for lease in (Lease("g/r1", "auth", "g/r1", "sm", "r1", units, start, ticket.end, 2, "lsig", (("vlan", 1042),)),
                  Lease("g/r1", "auth", "g/r1", "sm", "r1", units, start, ticket.end, 2, "lsig"),
                  Lease("g/r1", "auth", "g/r1", "sm", "r1", units[:1], start + timedelta(minutes=1),
                        start + timedelta(hours=2), 3, "lsig")):
        stored = lease_beside(lease, ticket)
        assert lease_from(codec.decode(codec.encode(stored)), ticket) == lease
        assert lease_from(stored, ticket).payload() == lease.payload()
    assert set(lease_beside(Lease("g/r1", "auth", "g/r1", "sm", "r1", units, start, ticket.end, 2, "lsig",
                                  (("vlan", 1042),)), ticket)) == {"from_ticket", "id", "authority", "signature"}
