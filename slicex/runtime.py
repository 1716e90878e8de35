"""Process settings of a slicex server (`slicex up`, `slicex actor`), applied once at start from slicex.yaml.

`gil_switch_interval_ms` (default 1): how long a thread running Python keeps the interpreter lock while another
waits for it. A request thread that comes back from SQLite, a TLS read or an actor call must get the lock back
before it can let go of the store's or the broker's lock it holds; at CPython's default of 5 ms every thread
queued behind that lock waits too. Measured with bench/am_api.py (docs/architecture.md, "Throughput")."""

from __future__ import annotations

import sys

from slicex.config import SlicexConfig


def tune_process(cfg: SlicexConfig) -> None:
    """Apply the process settings (the model checked the interval is a number in (0, 100] ms)."""
    sys.setswitchinterval(cfg.gil_switch_interval_ms / 1000)
