"""kvlib/grading/preprocessor.py: a graded cell holds all of one exercise's checks, and its outputs give
nbgrader full points, none, or the share of its checks that passed."""

from __future__ import annotations

import nbformat
import pytest
from nbgrader.utils import determine_grade

from kvlib.checks import CHECKS, cell_id, checks_for, checks_of_cell
from kvlib.course.exercises import BY_ID, EXERCISES
from kvlib.grading.preprocessor import _outputs


def _graded(outputs, points):
    cell = nbformat.v4.new_code_cell("pass")
    cell.metadata["nbgrader"] = {"grade": True, "solution": False, "points": points, "grade_id": "checks-1-1"}
    cell.outputs = outputs
    return determine_grade(cell)


@pytest.mark.parametrize(
    "passed, expected", [((True, True, True, True), 8.0), ((True, False, True, True), 6.0), ((False,) * 4, 0.0)]
)
def test_a_cell_earns_the_share_of_its_checks_that_passed(passed, expected):
    """Check that nbgrader's own scoring gives a cell of 4 checks worth 8 points 8, 6 (one failed) or 0."""
    verdicts = [(f"c{i}", ok, "fine" if ok else f"wrong {i}") for i, ok in enumerate(passed)]
    outputs = _outputs("checks-1-1", verdicts, 8.0)
    assert _graded(outputs, 8.0) == (expected, 8.0)
    text = "".join(o.get("text", "") + o.get("evalue", "") for o in outputs)
    for i, ok in enumerate(passed):  # every failure is named, with its message
        assert (f"wrong {i}" in text) == (not ok)


def test_a_find_and_fix_cell_earns_nothing_until_every_check_passes():
    """Check that a whole cell (a find-and-fix exercise's) that passes 3 of its 4 checks earns 0, naming the failure,
    and all 4 the full 8: a shipped bug that happens to pass a check earns nothing for it."""
    verdicts = [(f"c{i}", i != 1, "fine" if i != 1 else "wrong 1") for i in range(4)]
    outputs = _outputs("checks-1-1", verdicts, 8.0, whole=True)
    assert _graded(outputs, 8.0) == (0.0, 8.0)
    assert "wrong 1" in "".join(o.get("evalue", "") for o in outputs)
    right = [(name, True, "fine") for name, _, _ in verdicts]
    assert _graded(_outputs("checks-1-1", right, 8.0, whole=True), 8.0) == (8.0, 8.0)


def test_every_exercise_cell_names_all_its_checks_and_only_them():
    """Check that "checks-X-Y" stands for every check of exercise X.Y, a check's name for itself alone,
    and anything else for nothing."""
    for ex in EXERCISES:
        assert checks_of_cell(cell_id(ex)) == checks_for(ex) != []
    name = next(iter(CHECKS))
    assert checks_of_cell(name) == [CHECKS[name]]
    assert checks_of_cell("checks-99-1") == [] and checks_of_cell("bonus") == []
    assert cell_id(BY_ID["10.3"]) == "checks-10-3"
