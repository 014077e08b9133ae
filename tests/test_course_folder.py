"""kvlib/app/course_folder.py: `kvlib course init` writes an nbgrader course folder and never
overwrites an instructor's file without --force."""

from __future__ import annotations

import pytest
from conftest import NB


def test_course_init_never_overwrites_without_force(tmp_path):
    """Check that init refuses to change an instructor's file, and --force keeps a .bak of it."""
    from kvlib.app.course_folder import CourseFolderExists, init_course

    init_course(tmp_path)
    secret = (tmp_path / "grading_secret").read_text()
    assert (tmp_path / "grading_secret").stat().st_mode & 0o777 == 0o600
    config = tmp_path / "nbgrader_config.py"
    config.write_text(config.read_text() + "# mine\n")
    with pytest.raises(CourseFolderExists):
        init_course(tmp_path)
    assert config.read_text().endswith("# mine\n")
    init_course(tmp_path, force=True)
    assert (tmp_path / "nbgrader_config.py.bak").read_text().endswith("# mine\n")
    assert (tmp_path / "grading_secret").read_text() == secret  # never replaced


def test_course_init_lists_learner_files_and_earlier_modules(tmp_path):
    """Check that the course folder lists the learner's files: exclude_overwriting, stubs for this notebook,
    and --earlier given/own for later ones."""
    from traitlets.config.loader import PyFileConfigLoader

    from kvlib.app.course_folder import init_course, learner_edited, learner_files, module_notebooks

    init_course(tmp_path)
    config = PyFileConfigLoader("nbgrader_config.py", path=str(tmp_path)).load_config()
    assert config.Autograde.exclude_overwriting[NB] == ["kvlib/attention.py"]
    stub = (tmp_path / "source" / NB / "kvlib" / "attention.py").read_text()
    assert "### BEGIN SOLUTION" not in stub and 'raise NotImplementedError("Exercise 1.1' in stub
    later = [nb for nb in dict.fromkeys(module_notebooks().values()) if nb != NB]
    if later:  # a notebook after 01: attention.py is given (the reference) or the learner's own
        given = learner_files(later[0], "given")["kvlib/attention.py"].decode()
        assert "np.exp(scores - scores.max" in given and "BEGIN SOLUTION" not in given
        assert "kvlib/attention.py" in learner_edited(later[0], "own")
        assert "kvlib/attention.py" not in learner_edited(later[0], "given")


def test_your_files_warns_that_earlier_stubs_cost_this_notebooks_points():
    """Check that with --earlier own, YOUR_FILES.md of a notebook whose module imports earlier exercises (04's
    kv_cache.py: causal_mask, next_token) tells the learner to paste in their earlier files, naming each, and that
    01 and --earlier given (the reference is shipped) say nothing of it."""
    from kvlib.app.course_folder import earlier_used, your_files

    assert ("kv_cache", "attention", "causal_mask", "1.3") in earlier_used("04-kv-cache")
    assert ("kv_cache", "generation", "next_token", "2.1") in earlier_used("04-kv-cache")
    note = " ".join(your_files("04-kv-cache", "own").split())
    assert "Paste in your earlier files before you hand in" in note
    assert "`causal_mask` (Exercise 1.3, `kvlib/attention.py`)" in note
    assert "`next_token` (Exercise 2.1, `kvlib/generation.py`)" in note
    assert "Paste in" not in your_files("04-kv-cache", "given")
    assert earlier_used(NB) == [] and "Paste in" not in your_files(NB, "own")


def test_a_shared_exchange_refuses_the_default_course_id_and_one_taken(tmp_path):
    """Check `kvlib course init --exchange`: the default course id refused before anything is written; a course of
    its own gets nbgrader's folders with kvlib's modes and the students' config; a course id whose folder in the
    exchange is another account's refused; a mode changed later named by exchange_problems (`init --check`)."""
    import os

    from kvlib.app.course_folder import COURSE_MODES, exchange_problems, init_course, setup_exchange

    ex = tmp_path / "exchange"
    with pytest.raises(ValueError, match="default of every kvlib course"):
        init_course(tmp_path / "c", exchange=ex)
    assert not (tmp_path / "c").exists() and not ex.exists()
    init_course(tmp_path / "c", course_id="kvt-spring", exchange=ex)
    assert ex.stat().st_mode & 0o7777 == 0o1777
    assert {rel: (ex / "kvt-spring" / rel).stat().st_mode & 0o7777 for rel in COURSE_MODES} == COURSE_MODES
    student = (tmp_path / "c" / "student_nbgrader_config.py").read_text()
    assert "c.CourseDirectory.course_id = 'kvt-spring'" in student and f"c.Exchange.root = {str(ex)!r}" in student
    assert exchange_problems(ex, "kvt-spring", os.getuid()) == []
    with pytest.raises(PermissionError, match="another course uses this id"):
        setup_exchange(ex, "kvt-spring", uid=os.getuid() + 4242, gid=os.getgid())
    (ex / "kvt-spring" / "inbound").chmod(0o777)
    assert any("inbound has mode" in p and "not 0o3733" in p for p in exchange_problems(ex, "kvt-spring", os.getuid()))
