"""Stock nbgrader releases the course: generate_assignment on every solution notebook keeps a visible
assert in each graded cell and no hidden test."""

import os
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT

from kvlib.course.exercises import NOTEBOOKS

CONFIG = """c = get_config()
c.CourseDirectory.course_id = "kvlib-test"
c.Execute.timeout = 120
"""


def nbgrader(course_dir, *args, env=None):
    # nbgrader runs the `alembic` command for its gradebook: put this environment's bin/ first
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    proc = subprocess.run(
        [sys.executable, "-m", "nbgrader", *args],
        cwd=course_dir,
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": path, **(env or {})},
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """Every notebook released by stock nbgrader (generate_assignment) in a temporary course."""
    root = tmp_path_factory.mktemp("course")
    (root / "nbgrader_config.py").write_text(CONFIG)
    for nb in NOTEBOOKS:
        shutil.copytree(ROOT / "solutions" / nb, root / "source" / nb)
    nbgrader(root, "generate_assignment", "*", "--force")  # every assignment, in one nbgrader process
    assert sorted(p.name for p in (root / "release").iterdir()) == sorted(NOTEBOOKS)
    return root


# Autograding is tested where instructors run it, from a `kvlib course init` folder with the isolated
# grader: every notebook's reference submission earns full marks and its untouched release zero in
# tests/grading/test_course_notebooks.py (02-08) and tests/grading/test_attacks.py (01, with the attacks).


def test_release_hides_tests_and_keeps_visible_asserts(released):
    """Check that the released notebooks keep a visible assert in every graded cell and no hidden test."""
    import nbformat

    root = released
    for nb in NOTEBOOKS:
        for path in (root / "release" / nb).glob("*.ipynb"):
            cells = nbformat.read(path, as_version=4).cells
            graded_cells = [c for c in cells if c.metadata.get("nbgrader", {}).get("grade")]
            # every notebook with an exercise is graded (10c, the course's closing page, holds none)
            assert graded_cells or not any("## Exercise" in c.source for c in cells if c.cell_type == "markdown")
            for cell in graded_cells:
                assert "HIDDEN TESTS" not in cell.source and "grade(" not in cell.source
                assert "assert " in cell.source, f"graded cell {cell.metadata.nbgrader.grade_id} has no visible assert"
