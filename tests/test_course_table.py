"""The exercise table (kvlib/course/exercises.py) is the one list of the course: every learner module in
it has all its places, and every other list of modules is read off it.

The checklist "Adding notebook NN" in docs/instructors.md ("Changing the course") names these tests.
"""

import ast
import importlib
import re

import pytest
from conftest import ROOT

import kvlib
from kvlib.checks import CHECK_MODULES, checks_for
from kvlib.course.exercises import EXERCISES, LEARNER_MODULES, reference
from kvlib.grading.checks_registry import NOT_PROXYABLE, PROXYABLE_MODULES

NOTEBOOK_OF = {m: next(ex.notebook for ex in EXERCISES if ex.module == m) for m in LEARNER_MODULES}
INPUTS = ROOT / "kvlib" / "course" / "inputs.py"
SECTION = re.compile(r"^# Notebook (\d\d): ", re.MULTILINE)


def input_sections() -> dict[int, set[str]]:
    """kvlib/course/inputs.py's sections, `# Notebook NN: ...` under a `# ---` rule: {NN: its check_ functions}."""
    text = INPUTS.read_text(encoding="utf-8")
    starts = [(int(m.group(1)), text.count("\n", 0, m.start()) + 1) for m in SECTION.finditer(text)]
    functions = [
        (node.lineno, node.name)
        for node in ast.parse(text).body
        if isinstance(node, ast.FunctionDef) and node.name.startswith("check_")
    ]
    sections = {}
    for i, (number, line) in enumerate(starts):
        end = starts[i + 1][1] if i + 1 < len(starts) else float("inf")
        sections[number] = {name for lineno, name in functions if line < lineno < end}
    return sections


def test_every_list_of_learner_modules_is_the_exercise_tables():
    """Check that kvlib's lazy names, the checks modules and the grader's proxy all read their modules off
    the exercise table (`kvlib.serving` and `kvlib.compress` import like the others)."""
    assert CHECK_MODULES == LEARNER_MODULES
    assert PROXYABLE_MODULES == set(LEARNER_MODULES) - NOT_PROXYABLE
    for module in LEARNER_MODULES:
        assert getattr(kvlib, module) is importlib.import_module(f"kvlib.{module}")
        assert module in dir(kvlib)
    with pytest.raises(AttributeError, match="no attribute 'not_a_module'"):
        kvlib.not_a_module


@pytest.mark.parametrize("module", LEARNER_MODULES)
def test_learner_module_has_its_stub_reference_and_checks(module):
    """Check that the module has its learner stub kvlib/<module>.py, its reference solutions/kvlib/<module>.py
    holding every exercise of the table, and kvlib/checks/<module>.py with a check for every exercise."""
    assert (ROOT / "kvlib" / f"{module}.py").is_file(), f"no learner stub kvlib/{module}.py: run `kvlib course release`"
    assert (ROOT / "solutions" / "kvlib" / f"{module}.py").is_file(), f"no reference solutions/kvlib/{module}.py"
    assert (ROOT / "kvlib" / "checks" / f"{module}.py").is_file(), f"no kvlib/checks/{module}.py"
    for ex in EXERCISES:
        if ex.module == module:
            assert callable(reference(ex)), f"solutions/kvlib/{module}.py has no {ex.name} (Exercise {ex.id})"
            assert checks_for(ex), f"Exercise {ex.id} has no check in kvlib/checks/{module}.py"


@pytest.mark.parametrize("module", LEARNER_MODULES)
def test_learner_module_has_its_input_checks(module):
    """Check that kvlib/course/inputs.py has a section `# Notebook NN: ...` for the module's notebook, and
    that the module's reference validates its input with a check from that section."""
    number = int(NOTEBOOK_OF[module][:2])
    sections = input_sections()
    assert sections.get(number), (
        f"kvlib/course/inputs.py has no `# Notebook {number:02d}: ...` section of check_ functions"
    )
    reference_text = (ROOT / "solutions" / "kvlib" / f"{module}.py").read_text(encoding="utf-8")
    used = set(re.findall(r"\binputs\.(check_\w+)", reference_text))
    assert used & sections[number], (
        f"solutions/kvlib/{module}.py uses none of inputs.py's notebook {number:02d} checks {sorted(sections[number])}"
    )


@pytest.mark.parametrize("module", LEARNER_MODULES)
def test_learner_module_has_its_tests_and_notebook(module):
    """Check that the module has tests/test_<module>.py and a solution notebook solutions/NN-topic/*.ipynb."""
    assert (ROOT / "tests" / f"test_{module}.py").is_file(), f"no tests/test_{module}.py"
    notebook = NOTEBOOK_OF[module]
    assert list((ROOT / "solutions" / notebook).glob("*.ipynb")), f"no solution notebook in solutions/{notebook}/"


@pytest.mark.parametrize("module", LEARNER_MODULES)
def test_learner_module_has_its_readme_row(module):
    """Check that README.md's course table has the module's row: its notebook, its file, its exercise ids."""
    notebook = NOTEBOOK_OF[module]
    ids = sorted((ex.id for ex in EXERCISES if ex.module == module), key=lambda i: int(i.split(".")[1]))
    span = ids[0] if len(ids) == 1 else f"{ids[0]}-{ids[-1]}"  # by number: the table lists them in course order
    row = f"| [{notebook}](notebooks/{notebook}/) | [`kvlib/{module}.py`](kvlib/{module}.py) | {span}: "
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert any(line.startswith(row) for line in readme.splitlines()), f"README.md's course table has no row {row!r}"


def test_every_notebook_asks_for_a_prediction_a_design_or_a_fix():
    """Check that every notebook has an exercise that cannot be a transcription (issue 46): a prediction graded
    against the analytic value, a design under a budget, or a shipped bug to find and fix."""
    for notebook in dict.fromkeys(ex.notebook for ex in EXERCISES):
        kinds = {ex.kind for ex in EXERCISES if ex.notebook == notebook}
        assert kinds - {"build"}, f"notebooks/{notebook}: every exercise builds from a contract ({sorted(kinds)})"
