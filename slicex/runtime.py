"""Process settings of a slicex server (`slicex up`, `slicex actor`), applied once at start from slicex.yaml.

`gil_switch_interval_ms` (default 1): how long a thread running Python keeps the interpreter lock while another
waits for it. A request thread that comes back from SQLite, a TLS read or an actor call must get the lock back
before it can let go of the store's or the broker's lock it holds; at CPython's default of 5 ms every thread
queued behind that lock waits too. Measured with bench/am_api.py (docs/architecture.md, "Throughput")."""

from __future__ import annotations

import sys
from typing import Any

from slicex.errors import BadArgs

DEFAULT_SWITCH_INTERVAL_MS = 1.0


def switch_interval_seconds(cfg: dict[str, Any]) -> float:
    """The configured interval in seconds; BadArgs naming the key for anything but a number in (0, 100]."""
    raw = cfg.get("gil_switch_interval_ms", DEFAULT_SWITCH_INTERVAL_MS)
    try:
        ms = float(raw)
    except (TypeError, ValueError):
        raise BadArgs(f"gil_switch_interval_ms in slicex.yaml must be a number of milliseconds, not {raw!r}") from None
    if not 0 < ms <= 100:
        raise BadArgs(f"gil_switch_interval_ms in slicex.yaml must be more than 0 and at most 100, not {raw!r}")
    return ms / 1000


def tune_process(cfg: dict[str, Any]) -> None:
    sys.setswitchinterval(switch_interval_seconds(cfg))
