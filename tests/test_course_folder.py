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
