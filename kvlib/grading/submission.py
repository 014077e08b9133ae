"""What of a submission the grader reads: real files only, never through a link.

A submission unpacked with `tar` or `unzip` can hold links, and nbgrader, running as root,
copies what a link points to: `notes.txt -> ../../../source/01-attention/attention.ipynb` would
put the source notebook, hidden tests and all, where the learner's code reads it and prints it
into the feedback. So every reader of `submitted/` goes through here:

  screened = screen(folder, top=submitted_root)   every entry of one submission, sorted into
                                                   regular files and refused ones (with why)
  read(screened, "kvlib/attention.py")             a screened file's bytes, opened without
                                                   following links, checked to be the file screened
  open_screened(screened, rel)                     the same, as a binary file object (for copies)
  helper_modules(screened, reserved)               the learner's own kvlib/<name>.py modules that
                                                   travel to the isolated child, and the refused ones

Refused: a symbolic link (to a file or a folder), a hard link whose other names are outside the
submission (st_nlink larger than the names it has inside), anything that is neither a regular
file nor a folder (a pipe, a device, a socket), and a submission folder that is itself a link.
Nothing here changes the submission. Not here: nbgrader's side (autograde.py), the checks'
side (preprocessor.py).
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

MAX_ENTRIES = 5000  # files and folders screened per submission; the rest are refused
MAX_HELPERS = 16  # the learner's own modules in kvlib/ that travel to the isolated child
MAX_HELPER_BYTES = 256 << 10  # each
HELPER = re.compile(r"kvlib/([A-Za-z_]\w*)\.py")

SYMLINK = "a symbolic link: the grader reads only files you hand in, not links to other files; hand in the file itself"
HARDLINK = "a hard link to a file outside your submission: hand in a copy of the file itself"
SPECIAL = "not a regular file (a pipe, device or socket): hand in files and folders only"
LINKED_FOLDER = "the submission folder is itself a link: nothing in it is read"


@dataclass
class Screened:
    """One submission folder, screened: files {relative posix path: (st_dev, st_ino)} that may be
    read, refused {relative path: why} that may not ("." for the whole folder)."""

    folder: Path
    files: dict[str, tuple[int, int]] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)

    def why(self, rel: str) -> str | None:
        """Why rel, or a folder above it, was refused; None if it was not."""
        parts = PurePosixPath(rel).parts
        for i in range(len(parts), 0, -1):
            reason = self.refused.get("/".join(parts[:i]))
            if reason is not None:
                return reason
        return self.refused.get(".")


def screen(folder: Path | str, top: Path | str | None = None) -> Screened:
    """Walk folder without following links. top: a folder above it (the course's submitted/):
    every folder from there down to folder must be a real folder, not a link."""
    folder = Path(folder)
    out = Screened(folder)
    chain = [folder]
    if top is not None:
        top = Path(top)
        try:
            rel = folder.relative_to(top)
        except ValueError:
            raise ValueError(f"{folder} is not inside {top}") from None
        chain = [top.joinpath(*rel.parts[:i]) for i in range(1, len(rel.parts) + 1)]
    for path in chain:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return out
        if not stat.S_ISDIR(st.st_mode):
            out.refused["."] = LINKED_FOLDER if stat.S_ISLNK(st.st_mode) else SPECIAL
            return out
    inodes: dict[tuple[int, int], list[str]] = {}
    links: dict[tuple[int, int], int] = {}
    count = 0
    stack = [("", folder)]
    while stack:
        prefix, here = stack.pop()
        try:
            entries = sorted(os.scandir(here), key=lambda e: e.name)
        except OSError as err:
            out.refused[prefix.rstrip("/") or "."] = f"could not be read ({err.strerror})"
            continue
        for entry in entries:
            rel = prefix + entry.name
            count += 1
            if count > MAX_ENTRIES:
                out.refused[rel] = f"more than {MAX_ENTRIES} files and folders in the submission"
                continue
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                out.refused[rel] = SYMLINK
            elif stat.S_ISDIR(st.st_mode):
                stack.append((rel + "/", Path(entry.path)))
            elif stat.S_ISREG(st.st_mode):
                key = (st.st_dev, st.st_ino)
                inodes.setdefault(key, []).append(rel)
                links[key] = st.st_nlink
            else:
                out.refused[rel] = SPECIAL
    for key, names in inodes.items():
        if links[key] > len(names):  # another name of this file is outside the submission
            out.refused.update({rel: HARDLINK for rel in names})
        else:
            out.files.update({rel: key for rel in names})
    out.files = dict(sorted(out.files.items()))
    out.refused = dict(sorted(out.refused.items()))
    return out


def open_screened(screened: Screened, rel: str):
    """A screened regular file, opened for reading (binary) without following links.
    FileNotFoundError if it is not in the submission, PermissionError (saying why) if it was refused
    or has changed since it was screened."""
    reason = screened.why(rel)
    if reason is not None:
        raise PermissionError(f"{rel} in the submission is {reason}" if reason != LINKED_FOLDER else reason)
    key = screened.files.get(rel)
    if key is None:
        raise FileNotFoundError(f"{rel} is missing from the submission")
    fd = os.open(screened.folder / rel, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != key:
        os.close(fd)
        raise PermissionError(f"{rel} in the submission changed while it was graded")
    return os.fdopen(fd, "rb")


def read(screened: Screened, rel: str, limit: int | None = None) -> bytes:
    """A screened file's bytes; PermissionError if it is larger than limit."""
    with open_screened(screened, rel) as f:
        data = f.read(-1 if limit is None else limit + 1)
    if limit is not None and len(data) > limit:
        raise PermissionError(f"{rel} in the submission is larger than {limit >> 10} KiB")
    return data


def reserved_names(*packages: Path) -> set[str]:
    """Module names a learner's own module may not take: every module and subpackage of these kvlib folders."""
    names = {"__init__", "__main__"}
    for package in packages:
        if package.is_dir():
            names |= {
                p.stem if p.suffix == ".py" else p.name
                for p in package.iterdir()
                if p.suffix == ".py" or (p.is_dir() and p.name != "__pycache__")
            }
    return names


def helper_modules(screened: Screened, reserved: set[str]) -> tuple[dict[str, bytes], dict[str, str]]:
    """The learner's own modules, kvlib/<name>.py beside the exercise modules, that go to the
    isolated child with them: ({path: bytes}, {path: why refused}). At most MAX_HELPERS, each at
    most MAX_HELPER_BYTES, never a link, never a name of kvlib's own (reserved)."""
    taken: dict[str, bytes] = {}
    refused: dict[str, str] = {}
    candidates = sorted({*screened.files, *screened.refused} - {"."})
    for rel in candidates:
        m = HELPER.fullmatch(rel)
        if m is None or m.group(1) in reserved:
            continue
        if len(taken) >= MAX_HELPERS:
            refused[rel] = (
                f"more than {MAX_HELPERS} modules of your own in kvlib/: only the first {MAX_HELPERS} (by name) are graded"
            )
            continue
        try:
            taken[rel] = read(screened, rel, MAX_HELPER_BYTES)
        except PermissionError as err:
            refused[rel] = str(err)
        except FileNotFoundError:
            continue
    return taken, refused


__all__ = [
    "MAX_HELPERS",
    "MAX_HELPER_BYTES",
    "Screened",
    "helper_modules",
    "open_screened",
    "read",
    "reserved_names",
    "screen",
]
