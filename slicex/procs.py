"""Pid files that name a process by identity, not by number: a pid with its start time (field 22 of
/proc/<pid>/stat) and its command line. A pid that was reused by another program, or a zombie, is not
"running", so `slicex up` never refuses to start for a dead process and `slicex down` never signals a
stranger."""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ProcessRecord:
    """What a pid file says about the process that wrote it."""

    pid: int
    start: int  # clock ticks after boot, /proc/<pid>/stat field 22
    cmdline: tuple[str, ...]
    info: dict[str, Any] = field(default_factory=dict)  # role, URLs, ... for `slicex status`


def _stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time) of a live pid, or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    fields = text[text.rindex(")") + 2:].split()  # the command name in (...) may contain spaces
    return fields[0], int(fields[19])


def _cmdline(pid: int) -> tuple[str, ...]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ()
    return tuple(part.decode(errors="replace") for part in raw.split(b"\0") if part)


def this_process(info: dict[str, Any] | None = None) -> ProcessRecord:
    stat = _stat(os.getpid())
    return ProcessRecord(os.getpid(), stat[1] if stat else 0, _cmdline(os.getpid()), dict(info or {}))


def write(path: Path, record: ProcessRecord) -> None:
    """Write atomically, so a reader never sees half a pid file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps({"pid": record.pid, "start": record.start, "cmdline": list(record.cmdline),
                               **record.info}))
    os.replace(tmp, path)


def read(path: Path) -> ProcessRecord | None:
    """The record in a pid file; None if there is none or it is unreadable (an old bare-pid file counts as
    unreadable: without a start time it cannot be told from a reused pid)."""
    try:
        doc = json.loads(path.read_text())
        info = {k: v for k, v in doc.items() if k not in ("pid", "start", "cmdline")}
        return ProcessRecord(int(doc["pid"]), int(doc["start"]), tuple(doc["cmdline"]), info)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def alive(record: ProcessRecord | None) -> bool:
    """The recorded process itself still runs: same pid, same start time, same command line, not a zombie."""
    if record is None:
        return False
    stat = _stat(record.pid)
    if stat is None or stat[0] in ("Z", "X", "x"):
        return False
    return stat[1] == record.start and _cmdline(record.pid) == record.cmdline


def running(path: Path) -> ProcessRecord | None:
    """The live process a pid file names, or None (no file, a dead process, a reused pid)."""
    record = read(path)
    return record if alive(record) else None


def remove_if_mine(path: Path) -> None:
    """Delete a pid file this process wrote (never one a newer process has since written)."""
    record = read(path)
    if record is not None and record.pid == os.getpid():
        path.unlink(missing_ok=True)


def stop(record: ProcessRecord, grace: float = 10.0) -> bool:
    """SIGTERM the recorded process, SIGKILL it after `grace` seconds; True if it had to be killed."""
    if not alive(record):
        return False
    try:
        os.kill(record.pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not alive(record):
            return False
        time.sleep(0.05)
    if alive(record):
        try:
            os.kill(record.pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
        while alive(record):
            time.sleep(0.02)
        return True
    return False


def die_with_parent(parent: int) -> bool:
    """Ask Linux to SIGTERM this process when `parent` (its supervisor) dies, even by kill -9; False if the
    parent is already gone (then the caller must not start)."""
    import ctypes

    pr_set_pdeathsig = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    except (OSError, AttributeError):
        pass  # not Linux: the supervisor's `down` and the next `up` still stop orphans by their pid files
    return os.getppid() == parent
