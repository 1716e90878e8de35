"""The one endpoint helper (slicex/endpoint.py): what every XML-RPC surface shares — unknown methods, arity,
certificates, refusals and failures mapped to the surface's answers, the traceback kept in the log."""

from __future__ import annotations

import logging
import xmlrpc.client
from typing import Any

import pytest

from slicex.endpoint import Endpoint, Faults, GeniResults, arity_of, geni_options, method, public_methods
from slicex.errors import BadArgs, Forbidden, OutOfRange, ServerError, TooBig, Unsupported

CALLER = object()  # a stand-in certificate: the helper only asks whether there is one
GENI = GeniResults("slicex", 3, "this test's AM API v3")


class Surface:
    """A small surface: a method per behaviour the helper must answer for."""

    def GetVersion(self, caller: Any, options: Any = None) -> dict[str, Any]:  # noqa: N802
        return GENI.result({"caller": caller is not None})

    def Renew(self, caller: Any, urns: Any, credentials: Any, expiration: Any, options: Any) -> dict[str, Any]:  # noqa: N802
        raise OutOfRange("cannot renew past the slice's expiry; renew the slice first")

    def Crash(self, caller: Any) -> dict[str, Any]:  # noqa: N802
        raise KeyError("secret-internal-detail")

    def Mistyped(self, caller: Any) -> dict[str, Any]:  # noqa: N802
        return len(None)  # type: ignore[arg-type] - a TypeError inside a method is a failure, not bad arguments


def geni_endpoint(**kwargs: Any) -> Endpoint:
    return Endpoint("test.endpoint", public_methods(Surface(), ("GetVersion", "Renew", "Crash", "Mistyped"),
                                                    anonymous=("GetVersion",)), GENI, **kwargs)


def fault_endpoint(**kwargs: Any) -> Endpoint:
    return Endpoint("test.faults", public_methods(Surface(), ("GetVersion", "Renew", "Crash", "Mistyped")),
                    Faults("this test's authority"), **kwargs)


def test_arity_is_read_from_the_signature_after_the_caller():
    s = Surface()
    assert arity_of(s.GetVersion) == (0, 1)
    assert arity_of(s.Renew) == (4, 4)
    assert arity_of(lambda caller, *rest: None) == (0, None)
    assert arity_of(lambda ticket, end=None: None, leading=0) == (1, 2)  # a handler that takes the wire's alone
    assert method("Renew", s.Renew).arity == (4, 4)


def test_wrong_arity_is_badargs_as_a_geni_result():
    out = geni_endpoint().dispatch("Renew", ("only", "two"), CALLER)
    assert out["code"]["geni_code"] == BadArgs.code
    assert out["output"] == "Renew takes 4 arguments, got 2"
    assert geni_endpoint().dispatch("GetVersion", (1, 2), None)["output"] == \
        "GetVersion takes 0 to 1 arguments, got 2"


def test_wrong_arity_is_a_badargs_fault_where_the_surface_speaks_in_faults():
    out = fault_endpoint().dispatch("Renew", (), CALLER)
    assert isinstance(out, xmlrpc.client.Fault) and out.faultCode == BadArgs.code


def test_unknown_method_is_unsupported_and_names_what_is_offered():
    out = geni_endpoint().dispatch("CreateSliver", (), CALLER)
    assert out["code"]["geni_code"] == Unsupported.code
    assert "'CreateSliver' is not part of this test's AM API v3" in out["output"]
    assert "GetVersion, Renew, Crash, Mistyped" in out["output"]
    fault = fault_endpoint().dispatch("Nope", (), CALLER)
    assert fault.faultCode == BadArgs.code and "this test's authority has no method 'Nope' (it offers GetVersion" in fault.faultString


def test_a_certificate_is_required_except_where_declared():
    assert geni_endpoint().dispatch("GetVersion", (), None)["value"] == {"caller": False}
    out = geni_endpoint().dispatch("Renew", ([], [], "", {}), None)
    assert out["code"]["geni_code"] == BadArgs.code and "no client certificate" in out["output"]
    assert fault_endpoint().dispatch("GetVersion", (), None).faultCode == Forbidden.code


def test_a_raised_geni_error_becomes_its_code_and_message():
    out = geni_endpoint().dispatch("Renew", ([], [], "", {}), CALLER)
    assert out == {"code": {"geni_code": OutOfRange.code, "am_type": "slicex", "am_code": OutOfRange.code},
                   "value": 0, "output": "cannot renew past the slice's expiry; renew the slice first"}
    fault = fault_endpoint().dispatch("Renew", ([], [], "", {}), CALLER)
    assert (fault.faultCode, fault.faultString) == (OutOfRange.code, "cannot renew past the slice's expiry; "
                                                                     "renew the slice first")


def test_an_unexpected_exception_is_servererror_and_its_traceback_stays_in_the_log(caplog):
    with caplog.at_level(logging.ERROR, logger="slicex.test.endpoint"):
        out = geni_endpoint().dispatch("Crash", (), CALLER)
    assert out["code"]["geni_code"] == ServerError.code
    assert "internal error in Crash: KeyError" in out["output"]
    assert "Traceback" not in out["output"] and "File \"" not in out["output"]
    assert any(r.exc_info for r in caplog.records), "the operator's log keeps the traceback"
    fault = fault_endpoint().dispatch("Crash", (), CALLER)
    assert fault.faultCode == ServerError.code and "Traceback" not in fault.faultString


def test_a_type_error_inside_a_method_is_a_failure_not_bad_arguments():
    assert geni_endpoint().dispatch("Mistyped", (), CALLER)["code"]["geni_code"] == ServerError.code
    assert fault_endpoint().dispatch("Mistyped", (), CALLER).faultCode == ServerError.code


def test_getversion_carries_geni_api_even_when_refused():
    assert geni_endpoint().dispatch("GetVersion", (), None)["geni_api"] == 3
    assert geni_endpoint().dispatch("GetVersion", (1, 2), None)["geni_api"] == 3
    assert "geni_api" not in geni_endpoint().dispatch("Renew", (), CALLER)


def test_requests_refused_before_a_method_are_the_surfaces_answers():
    assert geni_endpoint().reject("too long", too_big=True)["code"]["geni_code"] == TooBig.code
    assert geni_endpoint().reject("not XML-RPC")["code"]["geni_code"] == BadArgs.code
    assert fault_endpoint().reject("too long", too_big=True).faultCode == TooBig.code


def test_the_caller_check_runs_before_the_method():
    def only_friends(name: str, caller: Any) -> None:
        raise Forbidden(f"you may not call {name}")

    out = geni_endpoint(check=only_friends).dispatch("Renew", ([], [], "", {}), CALLER)
    assert (out["code"]["geni_code"], out["output"]) == (Forbidden.code, "you may not call Renew")


def test_admit_runs_before_the_method_is_looked_up():
    """A surface that answers only known peers tells a stranger nothing of what it offers."""
    def nobody(caller: Any) -> None:
        raise Forbidden("you may not call this surface")

    for name in ("Renew", "NoSuchMethod"):
        out = fault_endpoint(admit=nobody).dispatch(name, (), CALLER)
        assert (out.faultCode, out.faultString) == (Forbidden.code, "you may not call this surface")
    assert fault_endpoint().dispatch("NoSuchMethod", (), CALLER).faultCode == BadArgs.code  # without: unknown first


def test_every_call_is_observed_with_its_code_and_refusal_type():
    seen: list[tuple[str, int, str]] = []
    endpoint = geni_endpoint(observe=lambda m, code, seconds, error_type: seen.append((m, code, error_type)))
    endpoint.dispatch("GetVersion", (), None)
    endpoint.dispatch("Renew", ([], [], "", {}), CALLER)
    endpoint.dispatch("Crash", (), CALLER)
    assert seen == [("GetVersion", 0, ""), ("Renew", OutOfRange.code, "OutOfRange"), ("Crash", 5, "ServerError")]


def test_unwrap_hands_the_request_id_to_the_call():
    from slicex import logs

    ids: list[str] = []

    def traced(caller: Any) -> dict[str, Any]:
        ids.append(logs.request_id())
        return GENI.result(True)

    def unwrap(name: str, params: tuple) -> tuple[str, tuple, str]:
        return name, params[:-1], params[-1]["rid"]

    endpoint = Endpoint("test.unwrap", [method("Ping", traced)], GENI, unwrap=unwrap)
    assert endpoint.dispatch("Ping", ({"rid": "r-42"},), CALLER)["value"] is True
    assert ids == ["r-42"]


def test_geni_options_are_a_struct_or_nothing():
    assert geni_options(None) == {}
    assert geni_options({"a": 1}) == {"a": 1}
    with pytest.raises(BadArgs):
        geni_options(["not", "a", "struct"])


# ---- the surfaces' own answers ---------------------------------------------------------------------------------
def _slice_authority(**methods: Any) -> Any:
    """A slice authority whose named methods are replaced (nothing else of it is reached)."""
    from clearinghouse.slice_authority import SliceAuthority

    sa = SliceAuthority.__new__(SliceAuthority)
    for name, call in methods.items():
        setattr(sa, name, call)
    return sa


def test_slice_authority_a_type_error_inside_a_method_is_a_server_fault_not_wrong_arguments():
    """Its dispatcher took any TypeError for a wrong argument count (BADARGS 1): a bug in a method read as the
    client's mistake."""
    sa = _slice_authority(ListAggregates=lambda caller: len(None))
    fault = sa.endpoint().dispatch("ListAggregates", (), CALLER)
    assert fault.faultCode == ServerError.code and "ListAggregates failed: TypeError" in fault.faultString


def test_slice_authority_a_store_outage_says_retry():
    from slicex.errors import Unavailable

    def down(caller: Any) -> Any:
        raise Unavailable("redis at 127.0.0.1:6379 refused the connection")

    fault = _slice_authority(ListAggregates=down).endpoint().dispatch("ListAggregates", (), CALLER)
    assert fault.faultCode == Unavailable.code
    assert "the slice authority's store is unavailable, retry in a moment" in fault.faultString


def test_slice_authority_wrong_arity_and_no_certificate_are_faults():
    sa = _slice_authority()
    assert sa.endpoint().dispatch("CreateSlice", (), CALLER).faultCode == BadArgs.code
    assert sa.endpoint().dispatch("ListAggregates", (), None).faultCode == Forbidden.code


def test_path_service_unknown_method_is_a_fault_and_wrong_arity_a_result():
    from stitching.model import Topology
    from stitching.server import make_server

    server = make_server(lambda: Topology({}, {}), "127.0.0.1", 0)
    try:
        unknown = server.dispatch("Nope", (), None)
        assert isinstance(unknown, xmlrpc.client.Fault) and unknown.faultCode == BadArgs.code
        assert "ComputePath" in unknown.faultString
        wrong = server.dispatch("ComputePath", (), None)
        assert wrong == {"code": {"geni_code": BadArgs.code}, "output": "ComputePath takes 1 arguments, got 0"}
        assert server.dispatch("GetVersion", (), None)["value"]["interface_version"] == "2"
    finally:
        server.server_close()


def test_chapi_answers_refusals_failures_and_wrong_arity_as_ch_api_results():
    from clearinghouse import chapi
    from clearinghouse.chapi_edge import ChapiResults, _v1_call

    def lookup_slices(caller: Any, credentials: Any, options: Any) -> Any:
        raise chapi.argument("Unknown slice urn:publicid:IDN+x+slice+s")

    def get_version(caller: Any) -> Any:
        raise RuntimeError("boom")

    endpoint = Endpoint("test.chapi", [method("lookup_slices", lookup_slices), method("get_version", get_version)],
                        ChapiResults("SA"), unwrap=_v1_call)
    refused = endpoint.dispatch("lookup", ("SLICE", [], {}), CALLER)  # a v2 generic call names the v1 method
    assert (refused["code"], refused["output"]) == (chapi.ARGUMENT, "[ARGUMENT] ARGUMENT_ERROR (Unknown slice "
                                                                    "urn:publicid:IDN+x+slice+s)")
    assert endpoint.dispatch("lookup_slices", ([],), CALLER)["code"] == chapi.ARGUMENT
    failed = endpoint.dispatch("get_version", (), CALLER)
    assert failed["code"] == chapi.SERVER and "Traceback" not in failed["output"]
    assert endpoint.dispatch("delete_slice", (), CALLER)["code"] == chapi.NOT_IMPLEMENTED
    assert endpoint.dispatch("get_version", (), None)["code"] == chapi.AUTHENTICATION


def test_the_call_log_names_the_callers_urn(caplog):
    """Which peer asked what is in the operator's log, for every surface (the actors' RPC logged it before
    it moved onto the helper)."""
    from slicex import pki

    ca, ca_key = pki.create_ca("t.org", "test CA")
    cert, _ = pki.issue_certificate(ca, ca_key, "urn:publicid:IDN+t.org+user+alice", "alice")
    with caplog.at_level(logging.INFO, logger="slicex.test.endpoint"):
        geni_endpoint().dispatch("GetVersion", (), pki.load_cert(cert))
        geni_endpoint().dispatch("GetVersion", (), None)
    lines = [r.getMessage() for r in caplog.records]
    assert any(line.startswith("GetVersion -> 0") and line.endswith("ms from urn:publicid:IDN+t.org+user+alice")
               for line in lines), lines
    assert any(line.startswith("GetVersion -> 0") and line.endswith("from (no certificate)") for line in lines), lines
