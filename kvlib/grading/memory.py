"""The isolated child's memory, as the grading process reads it: /proc/<pid>/status and clear_refs, never
anything the child reports. Linux only.

  watch = Watch(pid)             # opened before the learner's code runs (it could make itself undumpable)
  start = watch.start()          # its peak resident size reset to what it holds now ("5" to clear_refs)
  ... the call ...
  usage = watch.usage(start, inputs=request_bytes)

A call's peak (VmHWM after it, less VmRSS at its start) counts every page it wrote to memory it did not
hold before, however it allocated it (torch, numpy, ctypes, mmap) and whatever it switched off in its own
process. Memory already resident at the start is not counted again: `held` says how much more anonymous
and shared memory the child holds than when it booted, so that a check can refuse a buffer kept between
calls. The child cannot start processes (kvlib.grading._child.close_process_creation), so no work leaves
the process measured. Not here: which calls are measured, and what a check makes of the numbers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

_FIELDS = ("VmHWM", "VmRSS", "RssAnon", "RssShmem")


@dataclass(frozen=True)
class Usage:
    """What one call of the learner's code did to its process's memory, in bytes.

    peak:   how far its resident memory rose above what it held when the call began, at the highest point
    inputs: the bytes of the arrays the call was sent (received into memory during the call, once)
    held:   anonymous and shared memory resident at the call's start beyond what the child held after booting
            (numpy and torch imported, no learner code run yet): objects kept between calls, buffers made at import
    """

    peak: int
    inputs: int
    held: int

    @property
    def beyond_inputs(self) -> int:
        """The peak, less what receiving the arguments costs: what the call itself made."""
        return max(0, self.peak - self.inputs)


def _kib(text: str) -> dict[str, int]:
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in _FIELDS:
            out[key] = int(value.split()[0]) * 1024  # "123456 kB"
    missing = set(_FIELDS) - set(out)
    if missing:
        raise OSError(f"/proc/<pid>/status has no {', '.join(sorted(missing))}")
    return out


class Watch:
    """One process's /proc/<pid>/status (read) and clear_refs (written), held open from the start: the files are
    checked for permission when opened, so a child that later makes itself undumpable cannot shut the grader out."""

    def __init__(self, pid: int):
        self.pid = pid
        self._status = os.open(f"/proc/{pid}/status", os.O_RDONLY | os.O_CLOEXEC)
        try:
            self._clear = os.open(f"/proc/{pid}/clear_refs", os.O_WRONLY | os.O_CLOEXEC)
            os.write(self._clear, b"5")  # refused (EINVAL) by a kernel older than 4.0, which cannot reset the peak
            self.boot = self.read()
        except OSError:
            self.close()
            raise

    def read(self) -> dict[str, int]:
        return _kib(os.pread(self._status, 1 << 16, 0).decode("ascii", "replace"))

    def start(self) -> dict[str, int]:
        """Reset the peak resident size to the present one (Linux 4.0+), and return the figures then."""
        os.write(self._clear, b"5")
        return self.read()

    def usage(self, start: dict[str, int], inputs: int) -> Usage:
        end = self.read()
        held = start["RssAnon"] + start["RssShmem"] - self.boot["RssAnon"] - self.boot["RssShmem"]
        return Usage(peak=max(0, end["VmHWM"] - start["VmRSS"]), inputs=int(inputs), held=max(0, held))

    def close(self) -> None:
        for fd in (getattr(self, "_status", None), getattr(self, "_clear", None)):
            try:
                if fd is not None:
                    os.close(fd)
            except OSError:
                pass


def python_pid(popen_pid: int, jailed: bool) -> int:
    """The jailed Python's pid as the grader sees it: in namespaces and userns modes the one child of `unshare
    --fork` (its shell exec'd chroot, setpriv and Python in turn), in plain mode the process started itself."""
    if not jailed:
        return popen_pid
    children = Path(f"/proc/{popen_pid}/task/{popen_pid}/children")
    if children.exists():
        pids = [int(p) for p in children.read_text().split()]
    else:  # a kernel without CONFIG_PROC_CHILDREN: every process's parent
        pids = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    stat = (entry / "stat").read_text()
                except OSError:
                    continue
                if int(stat.rsplit(")", 1)[1].split()[1]) == popen_pid:
                    pids.append(int(entry.name))
    if len(pids) != 1:
        raise OSError(f"unshare (pid {popen_pid}) has {len(pids)} children, not the one jailed Python")
    return pids[0]


__all__ = ["Usage", "Watch", "python_pid"]
