"""The nbgrader round trip in a temporary course: the reference earns full marks, the untouched
release earns zero, and nothing crashes.

A submission is what a learner hands in: the released notebook plus their own kvlib package in
the same folder (a kernel imports the notebook's folder before site-packages)."""
import os
import shutil
import subprocess
import sys

import pytest

from kvlib.course import release as course
from kvlib.course.exercises import NOTEBOOKS

from conftest import ROOT

CONFIG = """c = get_config()
c.CourseDirectory.course_id = "kvlib-test"
c.Execute.timeout = 120
"""


def nbgrader(course_dir, *args, env=None):
    # nbgrader runs the `alembic` command for its gradebook: put this environment's bin/ first
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    proc = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=course_dir, capture_output=True, text=True,
                          env={**os.environ, "PATH": path, **(env or {})}, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def learner_package(dest, solved: set[str]):
    """A learner's kvlib: the stubs, with the modules in `solved` replaced by the reference, and
    beside it the shipped tiny model (kvlib looks for assets/ next to its package folder)."""
    shutil.copytree(ROOT / "kvlib", dest, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "assets", dest.parent / "assets")
    for module in solved:
        shutil.copyfile(ROOT / "solutions" / "kvlib" / f"{module}.py", dest / f"{module}.py")


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Release every notebook, hand in a solved and an untouched submission of each, autograde them."""
    from nbgrader.api import Gradebook

    root = tmp_path_factory.mktemp("course")
    (root / "nbgrader_config.py").write_text(CONFIG)
    # a learner who solved a notebook has solved the notebooks before it too (later ones build on them)
    modules = {nb: {ex.module for done in NOTEBOOKS[: NOTEBOOKS.index(nb) + 1] for ex in course_exercises(done)} for nb in NOTEBOOKS}
    for nb in NOTEBOOKS:
        shutil.copytree(ROOT / "solutions" / nb, root / "source" / nb)
        nbgrader(root, "generate_assignment", nb, "--force")
        for student, solved in (("solved", modules[nb]), ("untouched", set())):
            sub = root / "submitted" / student / nb
            shutil.copytree(root / "release" / nb, sub)
            learner_package(sub / "kvlib", solved)
    # learner mode, and no path to the repo's own kvlib ahead of the submission's
    env = {"KVLIB_SOLUTIONS": "0", "PYTHONPATH": ""}
    for nb in NOTEBOOKS:
        nbgrader(root, "autograde", nb, "--force", env=env)
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        scores = {(s.student.id, s.assignment.name): (s.score, s.max_score) for nb in NOTEBOOKS for s in gb.assignment_submissions(nb)}
    return root, scores


def course_exercises(nb):
    from kvlib.course.exercises import EXERCISES

    return [ex for ex in EXERCISES if ex.notebook == nb]


@pytest.mark.parametrize("nb", NOTEBOOKS)
def test_reference_submission_earns_full_marks(graded, nb):
    """Check that a learner whose kvlib equals the reference gets every point."""
    _, scores = graded
    score, max_score = scores[("solved", nb)]
    assert max_score > 0 and score == max_score


@pytest.mark.parametrize("nb", NOTEBOOKS)
def test_untouched_release_earns_zero(graded, nb):
    """Check that handing in the release unchanged gets no point."""
    _, scores = graded
    assert scores[("untouched", nb)][0] == 0


def test_release_hides_tests_and_keeps_visible_asserts(graded):
    """Check that the released notebooks keep a visible assert in every graded cell and no hidden test."""
    import nbformat

    root, _ = graded
    for nb in NOTEBOOKS:
        for path in (root / "release" / nb).glob("*.ipynb"):
            graded_cells = [c for c in nbformat.read(path, as_version=4).cells if c.metadata.get("nbgrader", {}).get("grade")]
            assert graded_cells
            for cell in graded_cells:
                assert "HIDDEN TESTS" not in cell.source and "grade(" not in cell.source
                assert "assert " in cell.source, f"graded cell {cell.metadata.nbgrader.grade_id} has no visible assert"
