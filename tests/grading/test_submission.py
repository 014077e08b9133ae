"""kvlib/grading/submission.py: screening a submission refuses links and special files, naming them,
and reads the rest; a learner's own helper modules travel to the child within limits."""

from __future__ import annotations

import os

import pytest
from conftest import NB, ROOT


def test_screening_refuses_links_and_reads_the_rest(tmp_path):
    """Check that screening a submission refuses links and reads the rest: symbolic links (to files and
    folders), hard links to a file outside, a pipe and a linked submission folder are refused with the reason
    and never read; hard links between two files of the submission, and everything else, are read."""
    from kvlib.grading.submission import HARDLINK, LINKED_FOLDER, SPECIAL, SYMLINK, read, screen

    top = tmp_path / "submitted"
    sub = top / "alice" / NB
    (sub / "kvlib").mkdir(parents=True)
    (sub / "kvlib" / "attention.py").write_text("mine")
    (sub / "kvlib" / "ref.py").symlink_to(ROOT / "solutions" / "kvlib" / "attention.py")
    (sub / "linked").symlink_to(ROOT / "solutions", target_is_directory=True)
    outside = tmp_path / "outside.txt"
    outside.write_text("secret")
    os.link(outside, sub / "hard.txt")
    (sub / "a.txt").write_text("twice")
    os.link(sub / "a.txt", sub / "kvlib" / "b.txt")  # both names inside: a file like any other
    os.mkfifo(sub / "pipe")
    screened = screen(sub, top=top)
    assert screened.refused == {"hard.txt": HARDLINK, "kvlib/ref.py": SYMLINK, "linked": SYMLINK, "pipe": SPECIAL}
    assert set(screened.files) == {"a.txt", "kvlib/attention.py", "kvlib/b.txt"}
    assert read(screened, "kvlib/attention.py") == b"mine" and read(screened, "kvlib/b.txt") == b"twice"
    for rel in ("kvlib/ref.py", "linked/kvlib/attention.py", "hard.txt", "pipe"):
        with pytest.raises(PermissionError, match="link|not a regular file"):
            read(screened, rel)
    with pytest.raises(FileNotFoundError):
        read(screened, "kvlib/missing.py")
    with pytest.raises(PermissionError, match="larger"):
        read(screened, "kvlib/attention.py", limit=2)
    (top / "bob").symlink_to(top / "alice", target_is_directory=True)
    linked = screen(top / "bob" / NB, top=top)
    assert linked.refused == {".": LINKED_FOLDER} and not linked.files


def test_learner_helper_modules_travel_within_limits(tmp_path):
    """Check that only a learner's own kvlib/ modules go to the isolated child, within limits: their own
    names only (never kvlib's), no links, no more than MAX_HELPERS, none over MAX_HELPER_BYTES."""
    from kvlib.grading.submission import MAX_HELPER_BYTES, MAX_HELPERS, helper_modules, reserved_names, screen

    kvlib = tmp_path / "kvlib"
    kvlib.mkdir()
    for name in ("attention", "core", "checks", "__init__", "my_helpers"):
        (kvlib / f"{name}.py").write_text(f"# {name}\n")
    (kvlib / "sub").mkdir()
    (kvlib / "sub" / "deep.py").write_text("# not directly in kvlib/\n")
    (kvlib / "linked.py").symlink_to(ROOT / "solutions" / "kvlib" / "attention.py")
    (kvlib / "huge.py").write_text("#" * (MAX_HELPER_BYTES + 1))
    for i in range(MAX_HELPERS + 2):
        (kvlib / f"x{i:02d}.py").write_text("")
    reserved = reserved_names(ROOT / "kvlib")
    assert {"attention", "core", "checks", "grading", "__init__"} <= reserved
    taken, refused = helper_modules(screen(tmp_path), reserved)
    assert taken["kvlib/my_helpers.py"] == b"# my_helpers\n"
    assert not {
        "kvlib/attention.py",
        "kvlib/core.py",
        "kvlib/checks.py",
        "kvlib/__init__.py",
        "kvlib/sub/deep.py",
    } & set(taken)
    assert "link" in refused["kvlib/linked.py"] and "larger" in refused["kvlib/huge.py"]
    assert len(taken) == MAX_HELPERS and any("more than" in why for why in refused.values())
