"""Why a directory cannot take writes, said the way an operator fixes it (full disk, read-only file system,
no permission), for the messages of `slicex up`, `/health` and `slicex status`.

SQLite and Python report these as "disk I/O error", "database or disk is full" or an errno; the file system
itself says which one it is, so it is asked directly (statvfs, and a small probe file)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

# below this much free space the store, logs and pid files of a deployment are refused writes soon
LOW_SPACE_BYTES = 1 << 20
PROBE_BYTES = 64 << 10


def space_fault(directory: Path) -> str | None:
    """What the file system of `directory` says against writing there (read-only, full), without writing."""
    try:
        st = os.statvfs(directory)
    except OSError as exc:
        return f"cannot inspect {directory}: {exc.strerror}"
    if st.f_flag & os.ST_RDONLY:
        return f"{directory} is on a read-only file system"
    free = st.f_bavail * st.f_frsize
    if free < LOW_SPACE_BYTES:
        return f"the disk holding {directory} is full ({free // 1024} KiB free)"
    return None


def os_fault(path: Path, exc: OSError) -> str:
    """An OSError of a write under `path` in the operator's words."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"the disk holding {path} is full ({exc.strerror})"
    if exc.errno == errno.EROFS:
        return f"{path} is on a read-only file system"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return f"this user may not write in {path} ({exc.strerror})"
    return f"cannot write in {path}: {exc.strerror or exc}"


def write_fault(directory: Path) -> str | None:
    """Whether `directory` takes a write now: None, or why not. Writes (and removes) a small probe file, so a
    disk with a few bytes left, which statvfs alone may not reveal as full, is caught too."""
    found = space_fault(directory)
    if found:
        return found
    probe = directory / f".slicex-write-probe-{os.getpid()}"
    try:
        with open(probe, "wb") as f:
            f.write(b"\0" * PROBE_BYTES)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        return os_fault(directory, exc)
    finally:
        try:
            probe.unlink()
        except OSError:
            pass
    return None


def remedy(fault: str) -> str:
    """What to do about a fault `space_fault`/`os_fault` named."""
    if "full" in fault:
        return "free space there, then try again"
    if "read-only" in fault:
        return "remount it read-write, or give this deployment a writable home (--home or SLICEX_HOME)"
    if "may not write" in fault:
        return "run slicex as the home's owner, or fix the home's permissions"
    return "fix the directory, then try again"
