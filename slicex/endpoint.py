"""One way to serve an XML-RPC surface: every surface of slicex (AM API v3 and v2, the slice exchange point,
the gcf-style slice authority, the CH API, the path service, the actors' RPC) is an `Endpoint` over the server
of slicex/tls_xmlrpc.py.

A surface declares its methods (`Method`: a name, the callable, its arity — by default read from the
callable's signature, as gcf makes one class's public methods its API — and whether the caller must show a
certificate), who may call it at all (`admit`, run before the method is even looked up, so a stranger
learns nothing of what the surface offers), an optional per-method caller check, and its `Answers`: how a value, a refusal, an
unexpected failure and a refused request become what that surface's clients expect (GENI `{code, value,
output}` results for the AM API and the exchange point, CH API results, or XML-RPC faults where the
protocol speaks in faults). Unknown methods, wrong arity, a missing certificate, oversize or malformed
requests, the last-boundary catch of unexpected exceptions (logged with their traceback, answered without
it), the request id and the call log are written here, once."""

from __future__ import annotations

import inspect
import logging
import time
import xmlrpc.client
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from cryptography import x509

from slicex import logs, pki
from slicex.errors import BadArgs, Forbidden, GeniError, ServerError, TooBig, Unsupported
from slicex.tls_xmlrpc import request_path

Caller = x509.Certificate | None  # the client certificate TLS verified; None over plain HTTP
Arity = tuple[int, int | None]  # (least, most) arguments after the caller's certificate; None: no most


@dataclass(frozen=True)
class Method:
    """One XML-RPC method: `call(caller_certificate, *params)` answers it."""

    name: str
    call: Callable[..., Any]
    arity: Arity
    needs_certificate: bool = True


def arity_of(call: Callable[..., Any], leading: int = 1) -> Arity:
    """The arguments a handler takes from the wire, from its signature: all but its `leading` ones (the
    caller's certificate; 0 for a handler that takes the wire's arguments alone)."""
    positional = [p for p in inspect.signature(call).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    unbounded = any(p.kind == p.VAR_POSITIONAL for p in inspect.signature(call).parameters.values())
    required = sum(1 for p in positional if p.default is p.empty)
    return max(required - leading, 0), None if unbounded else max(len(positional) - leading, 0)


def method(name: str, call: Callable[..., Any], *, needs_certificate: bool = True,
           arity: Arity | None = None) -> Method:
    return Method(name, call, arity if arity is not None else arity_of(call), needs_certificate)


def public_methods(handler: object, names: Iterable[str], anonymous: Iterable[str] = ()) -> list[Method]:
    """The methods `names` of `handler`, each its public method of that name; `anonymous` ones need no
    certificate (GetVersion)."""
    free = set(anonymous)
    return [method(n, getattr(handler, n), needs_certificate=n not in free) for n in names]


def arity_text(arity: Arity) -> str:
    low, high = arity
    if high is None:
        return f"at least {low}"
    return str(low) if low == high else f"{low} to {high}"


class Answers(Protocol):
    """How a surface answers: its clients' expectations, in one place per surface."""

    refusals: tuple[type[Exception], ...]  # what a method raises to refuse a call (answered by `refused`)

    def unknown_method(self, method: str, offered: Sequence[str]) -> Exception: ...
    def no_certificate(self, method: str) -> Exception: ...
    def bad_arguments(self, message: str) -> Exception: ...
    def value(self, method: str, value: Any) -> Any: ...
    def refused(self, method: str, err: Exception) -> Any: ...
    def failed(self, method: str, exc: Exception) -> Any: ...
    def rejected(self, message: str, too_big: bool) -> Any: ...
    def code_of(self, answer: Any) -> int: ...


@dataclass(frozen=True)
class GeniResults:
    """AM API answers (v3, v2, the exchange point): every outcome a `{code, value, output}` result, never a
    fault. `api` names the API in the unknown-method answer, `elsewhere` may point to another surface;
    GetVersion's answer carries `geni_api` at its top level, as the AM API says."""

    am_type: str
    geni_api: int
    api: str
    elsewhere: str = ""
    failure_hint: str = "; the operator's log has the details"
    refusals: tuple[type[Exception], ...] = (GeniError,)

    def result(self, value: Any, code: int = 0, output: str = "") -> dict[str, Any]:
        return {"code": {"geni_code": code, "am_type": self.am_type, "am_code": code}, "value": value,
                "output": output}

    def unknown_method(self, method: str, offered: Sequence[str]) -> Exception:
        return Unsupported(f"method {method!r} is not part of {self.api} ({', '.join(offered)}){self.elsewhere}")

    def no_certificate(self, method: str) -> Exception:
        return BadArgs("no client certificate: AM API calls need mutual TLS")

    def bad_arguments(self, message: str) -> Exception:
        return BadArgs(message)

    def value(self, method: str, value: Any) -> Any:
        return self._stamped(method, value)

    def refused(self, method: str, err: Exception) -> Any:
        assert isinstance(err, GeniError)
        return self._stamped(method, self.result(0, err.code, err.message))

    def failed(self, method: str, exc: Exception) -> Any:
        return self._stamped(method, self.result(0, ServerError.code, f"internal error in {method}: "
                                                 f"{type(exc).__name__}: {exc}{self.failure_hint}"))

    def rejected(self, message: str, too_big: bool) -> Any:
        return self.result(0, TooBig.code if too_big else BadArgs.code, message)

    def code_of(self, answer: Any) -> int:
        return int(answer["code"]["geni_code"])

    def _stamped(self, method: str, answer: dict[str, Any]) -> dict[str, Any]:
        if method == "GetVersion":
            answer["geni_api"] = self.geni_api
        return answer


def geni_options(options: Any) -> dict[str, Any]:
    """An AM API call's options struct (absent: none); anything else is BADARGS."""
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise BadArgs(f"options must be a struct, got {type(options).__name__}")
    return options


@dataclass(frozen=True)
class Faults:
    """Answers of a protocol that speaks in faults (the gcf clearinghouse protocol, the actors' RPC): a value
    is the reply, every refusal an XML-RPC fault whose code is the GENI code of its cause."""

    service: str  # "this slice authority", "broker": who has no such method, in the unknown-method answer
    unknown: type[GeniError] = BadArgs
    refusals: tuple[type[Exception], ...] = (GeniError,)

    def unknown_method(self, method: str, offered: Sequence[str]) -> Exception:
        return self.unknown(f"{self.service} has no method {method!r} (it offers {', '.join(offered)})")

    def no_certificate(self, method: str) -> Exception:
        return Forbidden("no client certificate: use mutual TLS with your user certificate")

    def bad_arguments(self, message: str) -> Exception:
        return BadArgs(message)

    def value(self, method: str, value: Any) -> Any:
        return value

    def refused(self, method: str, err: Exception) -> Any:
        assert isinstance(err, GeniError)
        return xmlrpc.client.Fault(err.code, err.message)

    def failed(self, method: str, exc: Exception) -> Any:
        return xmlrpc.client.Fault(ServerError.code, f"{method} failed: {type(exc).__name__}: {exc}")

    def rejected(self, message: str, too_big: bool) -> Any:
        return xmlrpc.client.Fault(TooBig.code if too_big else BadArgs.code, message)

    def code_of(self, answer: Any) -> int:
        return answer.faultCode if isinstance(answer, xmlrpc.client.Fault) else 0


Admit = Callable[[Caller], None]
"""Run first, with the caller's certificate alone: refuses (one of the surface's refusals) a caller the surface
does not answer at all, before an unknown method or wrong arity could tell it what the surface offers."""
CallerCheck = Callable[[str, Caller], None]
"""Run before every call with the method and the caller's certificate; raises one of the surface's refusals."""
Unwrap = Callable[[str, tuple], tuple[str, tuple, str]]
"""(method, params) as the wire carries them -> (method, params, request id) as the methods take them."""


def _as_sent(method: str, params: tuple) -> tuple[str, tuple, str]:
    return method, params, ""


class Endpoint:
    """One XML-RPC surface: `dispatch` answers a call, `reject` a request refused before it reached a method
    (`XmlRpcServer.answer(endpoint)` puts it on a server). `name` is its logger's (`slicex.<name>`);
    `observe(method, code, seconds, error_type)` sees every call (metrics).

    A call is answered in this order, the surface's declaration choosing which steps it has: `admit` (who may
    call at all), the method's existence, its certificate, `check` (who may call this method), its arity."""

    def __init__(self, name: str, methods: Sequence[Method], answers: Answers, *,
                 admit: Admit | None = None, check: CallerCheck | None = None, unwrap: Unwrap = _as_sent,
                 observe: Callable[[str, int, float, str], None] | None = None):
        self.name = name
        self.methods = {m.name: m for m in methods}
        self.answers = answers
        self.admit = admit
        self.check = check
        self.unwrap = unwrap
        self.observe = observe
        self.log = logging.getLogger(f"slicex.{name}")

    def dispatch(self, method: str, params: tuple, caller: Caller) -> Any:
        """Answer one call as the surface's clients expect, whatever happens; under the caller's request id
        when the wire carries one, else a fresh one (slicex.logs)."""
        try:
            method, params, rid = self.unwrap(method, params)
        except self.answers.refusals as err:
            return self.answers.refused(method, err)
        with logs.bound(rid):
            started = time.perf_counter()
            answer, error_type = self._answer(method, params, caller)
            seconds = time.perf_counter() - started
            code = self.answers.code_of(answer)
            known = method if method in self.methods else "(unknown method)"
            self.log.info("%s -> %d%s in %.1f ms from %s", known, code, f" {error_type}" if error_type else "",
                          seconds * 1000, _who(caller))
            if self.observe is not None:
                self.observe(method, code, seconds, error_type)
            return answer

    def _answer(self, name: str, params: tuple, caller: Caller) -> tuple[Any, str]:
        """(the answer, the type of the refusal or failure, "" when the call succeeded)."""
        try:
            if self.admit is not None:
                self.admit(caller)
            found = self.methods.get(name)
            if found is None:
                raise self.answers.unknown_method(name, tuple(self.methods))
            if found.needs_certificate and caller is None:
                raise self.answers.no_certificate(name)
            if self.check is not None:
                self.check(name, caller)
            low, high = found.arity
            if len(params) < low or (high is not None and len(params) > high):
                raise self.answers.bad_arguments(f"{name} takes {arity_text(found.arity)} arguments, "
                                                 f"got {len(params)}")
            return self.answers.value(name, found.call(caller, *params)), ""
        except self.answers.refusals as err:
            self.log.info("%s refused: %s %s", name, type(err).__name__, err)
            return self.answers.refused(name, err), type(err).__name__
        except Exception as exc:  # noqa: BLE001 - the boundary: the traceback goes to the log, not the client
            self.log.exception("%s failed", name)
            return self.answers.failed(name, exc), ServerError.__name__

    def reject(self, message: str, too_big: bool = False) -> Any:
        """A request refused before it named a method: oversize, a DTD, not XML-RPC."""
        return self.answers.rejected(message, too_big)


class Routes:
    """Several surfaces on one server, chosen by the request's path (the CH API's /CH, /SA and /MA):
    `missing(path)` answers a path no surface serves."""

    def __init__(self, endpoints: dict[str, Endpoint], missing: Callable[[str], Any],
                 rejected: Callable[[str, bool], Any]):
        self.endpoints = endpoints
        self.missing = missing
        self.rejected = rejected

    def dispatch(self, method: str, params: tuple, caller: Caller) -> Any:
        path = request_path().strip("/").upper()
        endpoint = self.endpoints.get(path)
        if endpoint is None:
            return self.missing(path)
        return endpoint.dispatch(method, params, caller)

    def reject(self, message: str, too_big: bool = False) -> Any:
        return self.rejected(message, too_big)


def _who(caller: Caller) -> str:
    """The caller as the call log names it: the URN of its certificate (who asked, for an operator reading
    the log), else its subject, else that it had none."""
    if not isinstance(caller, x509.Certificate):
        return "(no certificate)"
    return pki.cert_urn(caller) or caller.subject.rfc4514_string()
