"""A grading process's temporary folders, all in one folder of its own, removed even after a kill.

The jail (kvlib-jail-*), the isolated checker (kvlib-sandbox-*: a copy of a learner's code) and the jailed
kernel (kvlib-kernel-*) each make a temporary folder and remove it when they end; a grader killed with SIGKILL
ends none of them. So a grading process first calls use_own_tempdir(): every temporary folder it makes from
then on is made inside kvlib-grader-<pid>-<start>/ in the system's temporary folder, removed when it exits
normally; and sweep() removes the folders of grading processes that no longer run (the pid is gone, or is
another process now: its start time differs), which `kvlib course autograde` and nbgrader's autograde call
at their start.
"""

from __future__ import annotations

import atexit
import os
import re
import stat
import tempfile
from pathlib import Path

from kvlib.grading.jail import remove_tree

PREFIX = "kvlib-grader-"
_NAME = re.compile(rf"^{PREFIX}(\d+)-(\d+)$")


def _start_time(pid: int) -> int | None:
    """The process's start time (clock ticks after boot, /proc/<pid>/stat), None if it does not run."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def folder_of(pid: int) -> str | None:
    """The name of the process's own temporary folder (None where /proc cannot tell its start time)."""
    start = _start_time(pid)
    return None if start is None else f"{PREFIX}{pid}-{start}"


def use_own_tempdir() -> Path | None:
    """Make this process's temporary folder (mode 700) and make tempfile use it; removed at exit. Returns it,
    or None where there is no /proc to name it by (then the system's temporary folder is used as before)."""
    name = folder_of(os.getpid())
    if name is None:
        return None
    base = Path(tempfile.gettempdir())
    if base.name == name:  # already in use (a worker's nbgrader autograde calls it again)
        return base
    path = base / name
    path.mkdir(mode=0o700, exist_ok=True)
    tempfile.tempdir = str(path)
    os.environ["TMPDIR"] = str(path)  # what this process starts (a kernel, nbconvert) makes its files there too
    atexit.register(remove_tree, path)
    return path


def stale(base: Path | None = None) -> list[Path]:
    """This account's grader folders (any account's, as root) whose process no longer runs."""
    base = Path(base or system_tempdir())
    out = []
    try:
        entries = list(base.iterdir())
    except OSError:
        return out
    for path in entries:
        m = _NAME.match(path.name)
        if not m:
            continue
        try:
            st = path.lstat()
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or (os.geteuid() != 0 and st.st_uid != os.geteuid()):
            continue
        pid, start = int(m.group(1)), int(m.group(2))
        if _start_time(pid) != start:
            out.append(path)
    return out


def sweep(base: Path | None = None) -> list[Path]:
    """Remove the folders stale() finds; returns them."""
    found = stale(base)
    for path in found:
        remove_tree(path)
    return found


def system_tempdir() -> str:
    """The system's temporary folder, not this process's own (use_own_tempdir)."""
    here = Path(tempfile.gettempdir())
    return str(here.parent) if _NAME.match(here.name) else str(here)
