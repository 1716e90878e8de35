"""Structured logs: a request id that follows one AM API call through the slice manager, the broker and the
authority, and an optional JSON-lines format (`log_format: json` in slicex.yaml) that carries it.

The id is set once per call, at the XML-RPC edge (`slicex.endpoint.Endpoint.dispatch`), in a contextvar:
in-process actors see it because they run in the caller's thread. Calls to actors in other processes carry it as one extra trailing
XML-RPC argument, `{"slicex_request_id": id}` (`slicex.actor_rpc`), which the actor server strips and sets
again before the handler runs; so an operator can grep one id across the AM's and the actors' logs."""

from __future__ import annotations

import json
import logging
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, TextIO

from slicex.config import SlicexConfig

REQUEST_ID: ContextVar[str] = ContextVar("slicex_request_id", default="")
WIRE_KEY = "slicex_request_id"  # the key of the trailing struct actor calls carry
TEXT_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


def new_request_id() -> str:
    return uuid.uuid4().hex[:16]


def request_id() -> str:
    """The id of the call this thread works for ("" outside one)."""
    return REQUEST_ID.get()


@contextmanager
def bound(rid: str) -> Iterator[str]:
    """Work for request `rid` inside the block (a fresh id when `rid` is empty)."""
    rid = rid or new_request_id()
    token = REQUEST_ID.set(rid)
    try:
        yield rid
    finally:
        REQUEST_ID.reset(token)


class RequestIdFilter(logging.Filter):
    """Stamps every record with the current request id, so either format can show it."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = REQUEST_ID.get()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (RFC 3339, UTC), level, logger, message, request_id, and the
    exception text when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname, "logger": record.name, "message": record.getMessage(),
            "request_id": getattr(record, "request_id", None) or REQUEST_ID.get(),
        }
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False)


def handler(fmt: str = "text", stream: TextIO | None = None) -> logging.Handler:
    """A stream handler in the format slicex.yaml names (`text` or `json`)."""
    if fmt not in ("text", "json"):
        raise ValueError(f"log_format {fmt!r}: text or json")
    h = logging.StreamHandler(stream or sys.stderr)
    h.addFilter(RequestIdFilter())
    h.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    return h


def configure(cfg: SlicexConfig, stream: TextIO | None = None, level: int = logging.INFO) -> None:
    """Set up the root logger of a slicex process from its config (what `slicex up` and `slicex actor` call)."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "slicex", False)]:
        root.removeHandler(old)
    h = handler(cfg.log_format, stream)
    h.slicex = True  # type: ignore[attr-defined]
    root.addHandler(h)
    root.setLevel(level)
    # Neither format shows the caller's file and line, thread or process: not looking them up for each record
    # (the logging HOWTO's "Optimization") saves about a fifth of a record's cost, a dozen records per lifecycle.
    logging._srcfile = None  # type: ignore[attr-defined]
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False


class Traced:
    """An in-process actor as its callers see it, with one log line per method call under the actor's logger
    (`slicex.broker`, `slicex.authority`): what `ActorServer` logs for an actor in its own process, so the
    embedded deployment's logs show the same request id at each actor. Attributes pass through unchanged."""

    def __init__(self, name: str, actor: Any):
        self._name = name
        self._actor = actor
        self._log = logging.getLogger(f"slicex.{name}")

    def __getattr__(self, attr: str) -> Any:
        value = getattr(self._actor, attr)
        if attr.startswith("_") or not callable(value) or isinstance(value, type):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            rid = REQUEST_ID.get()
            self._log.log(logging.INFO if rid else logging.DEBUG, "%s.%s", self._name, attr)
            return value(*args, **kwargs)
        return call
