"""The actors' RPC as an endpoint (slicex/actor_rpc.py `actor_endpoint`), without TLS: who may call what, in
which order the refusals come, how a failure and the caller's request id travel. Over mutual TLS against a
running deployment: tests/security/test_actor_trust.py."""

from __future__ import annotations

import xmlrpc.client
from typing import Any

import pytest
from cryptography import x509

from slicex import logs, pki
from slicex.actor_rpc import actor_endpoint, request_id_of, with_request_id
from slicex.endpoint import Endpoint
from slicex.errors import Forbidden, Refused, ServerError, Unsupported

AM = "urn:publicid:IDN+rpc.test+authority+am"
AUTH = "urn:publicid:IDN+rpc.test+authority+authority"
STRANGER = "urn:publicid:IDN+rpc.test+user+mallory"


@pytest.fixture(scope="module")
def certs() -> dict[str, x509.Certificate]:
    ca, ca_key = pki.create_ca("rpc.test", "test CA")
    return {urn: pki.load_cert(pki.issue_certificate(ca, ca_key, urn, urn.rsplit("+", 1)[1])[0])
            for urn in (AM, AUTH, STRANGER)}


def broker(seen: list[tuple[str, str]]) -> Endpoint:
    """A broker whose slice manager may place and whose authority may accept."""
    def place(demand: Any) -> dict[str, Any]:
        seen.append(("place", logs.request_id()))
        if demand == "too much":
            raise Refused("1 free of 3 asked")
        return {"placed": demand}

    def accept(doc: Any) -> None:
        raise KeyError("pools")

    return actor_endpoint("broker", {"place": place, "accept": accept}, {AM: {"place"}, AUTH: {"accept"}})


def fault(answer: Any) -> tuple[int, str]:
    assert isinstance(answer, xmlrpc.client.Fault), answer
    return answer.faultCode, answer.faultString


def test_a_peer_not_of_the_deployment_is_forbidden_before_it_learns_any_method(certs):
    endpoint = broker([])
    for name in ("place", "tick"):  # a method of the broker, and one it does not have
        assert fault(endpoint.dispatch(name, ("x",), certs[STRANGER])) == \
            (Forbidden.code, f"broker: {STRANGER} may not call actor methods")
    assert fault(endpoint.dispatch("tick", (), None)) == \
        (Forbidden.code, "broker: an unnamed peer may not call actor methods")


def test_a_peer_of_the_deployment_is_told_a_method_is_missing_or_not_its_own(certs):
    endpoint = broker([])
    code, message = fault(endpoint.dispatch("tick", ("2099-01-01T00:00:00Z",), certs[AM]))
    assert code == Unsupported.code and "broker has no method 'tick'" in message
    assert fault(endpoint.dispatch("accept", ({},), certs[AM])) == (Forbidden.code, f"broker: {AM} may not call accept")
    assert fault(endpoint.dispatch("place", ("x",), certs[AUTH])) == (Forbidden.code, f"broker: {AUTH} may not call place")


def test_answers_refusals_and_failures_come_back_as_the_actor_gave_them(certs):
    endpoint = broker([])
    assert endpoint.dispatch("place", ("n1",), certs[AM]) == {"placed": "n1"}
    assert fault(endpoint.dispatch("place", ("too much",), certs[AM])) == (Refused.code, "1 free of 3 asked")
    assert fault(endpoint.dispatch("accept", ({},), certs[AUTH])) == \
        (ServerError.code, "broker.accept failed: KeyError: 'pools'")  # the user reads which actor failed


def test_the_callers_request_id_is_stripped_and_bound_while_the_actor_works(certs):
    seen: list[tuple[str, str]] = []
    with logs.bound("r-42"):
        sent = with_request_id(("n1",))
    assert request_id_of("place", sent) == ("place", ("n1",), "r-42")
    assert broker(seen).dispatch("place", sent, certs[AM]) == {"placed": "n1"}
    assert seen == [("place", "r-42")]
    assert request_id_of("place", ("n1", {"other": 1})) == ("place", ("n1", {"other": 1}), "")
