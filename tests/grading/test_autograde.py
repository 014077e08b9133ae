"""kvlib/grading/autograde.py: `nbgrader collect` keeps links as links, and autograde stops a submission
whose timestamp or folder is a link before nbgrader reads it."""

from __future__ import annotations

import pytest
from conftest import NB, ROOT


def test_collect_copies_links_as_links(tmp_path):
    """Check that the course's `nbgrader collect` step copies links as links: a link a student put in their
    exchange folder arrives in submitted/ as a link (which autograde then refuses), not as a copy of what it
    points to."""
    from nbgrader.coursedir import CourseDirectory

    from kvlib.grading.autograde import LinkKeepingCollect

    src = tmp_path / "inbound" / "alice+01-attention+2026-01-01"
    (src / "kvlib").mkdir(parents=True)
    (src / "kvlib" / "attention.py").write_text("mine")
    (src / "notes.txt").symlink_to(ROOT / "solutions" / "kvlib" / "attention.py")
    (src / "solutions").symlink_to(ROOT / "solutions", target_is_directory=True)
    dest = tmp_path / "submitted" / "alice" / NB
    LinkKeepingCollect(coursedir=CourseDirectory(root=str(tmp_path))).do_copy(str(src), str(dest))
    assert (dest / "kvlib" / "attention.py").read_text() == "mine"
    assert (dest / "notes.txt").is_symlink() and (dest / "solutions").is_symlink()


def test_a_linked_timestamp_or_submission_folder_stops_that_submission(tmp_path):
    """Check that autograde stops, naming why, before nbgrader reads a timestamp.txt that is a link
    (nbgrader reads it before any other step) or anything in a submission folder that is a link."""
    from nbgrader.coursedir import CourseDirectory

    from kvlib.grading.autograde import ScreenedAutograde

    converter = ScreenedAutograde(coursedir=CourseDirectory(root=str(tmp_path)))
    sub = tmp_path / "submitted" / "alice" / NB
    sub.mkdir(parents=True)
    (sub / "timestamp.txt").symlink_to("/dev/zero")
    with pytest.raises(PermissionError, match="timestamp.txt in the submission is a symbolic link"):
        converter.init_destination(NB, "alice")
    (tmp_path / "submitted" / "bob").mkdir()
    (tmp_path / "submitted" / "bob" / NB).symlink_to(tmp_path / "submitted" / "alice" / NB, target_is_directory=True)
    with pytest.raises(PermissionError, match="submission folder is itself a link"):
        converter.init_destination(NB, "bob")
