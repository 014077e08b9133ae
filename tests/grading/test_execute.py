"""kvlib/grading/execute.py: autograde runs a notebook in the kernel only when something in it counts
there, and says so in the feedback when it does not."""

from __future__ import annotations

import shutil

import nbformat
from conftest import NB, ROOT
from traitlets.config import Config

from kvlib.course.exercises import EXERCISES
from kvlib.grading.execute import NOT_RUN, SandboxExecute


def _execute(tmp_path, **settings):
    (tmp_path / "source" / NB).mkdir(parents=True)
    shutil.copy(ROOT / "solutions" / NB / "attention.ipynb", tmp_path / "source" / NB / "attention.ipynb")
    config = Config()
    config.CourseDirectory.root = str(tmp_path)
    for name, value in settings.items():
        setattr(config.SandboxExecute, name, value)
    ex = SandboxExecute(config=config)
    ex._isolated = {f"checks-{e.id.replace('.', '-')}" for e in EXERCISES if e.notebook == NB}  # every one of 01's
    resources = {"nbgrader": {"assignment": NB, "notebook": "attention", "student": "alice"}}
    return ex, nbformat.read(tmp_path / "source" / NB / "attention.ipynb", as_version=4), resources


def test_an_unchanged_notebook_needs_no_kernel_and_its_feedback_says_so(tmp_path):
    """Check that a submission whose code cells are the source's, graded cells all isolated, is not run:
    no outputs but one note in the first code cell."""
    ex, nb, resources = _execute(tmp_path)
    assert ex._kernel_needed(nb, resources) is None
    nb, _ = ex.preprocess(nb, resources)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert [o.text for o in outputs] == [NOT_RUN]


def test_what_counts_in_the_kernel_makes_it_run(tmp_path):
    """Check that a cell the learner added, a changed cell, a graded cell scored in the kernel, a missing
    source, and run_kernel = always each make the notebook run."""
    ex, nb, resources = _execute(tmp_path)
    nb.cells.append(nbformat.v4.new_code_cell("print('mine')"))
    assert ex._kernel_needed(nb, resources) == "a code cell the learner added or changed"
    ex, nb, resources = _execute(tmp_path / "b")
    ex._isolated.discard("checks-1-3")
    assert ex._kernel_needed(nb, resources) == "graded cell checks-1-3 is scored in the kernel"
    ex, nb, resources = _execute(tmp_path / "c")
    resources["nbgrader"]["notebook"] = "other"
    assert "could not be read" in ex._kernel_needed(nb, resources)
    ex, nb, resources = _execute(tmp_path / "d", run_kernel="always")
    assert ex._kernel_needed(nb, resources) == "SandboxExecute.run_kernel = always"
