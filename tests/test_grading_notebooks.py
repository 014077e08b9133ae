"""Notebooks 02 to 06 graded by nbgrader from a `kvlib course init` folder: a correct submission gets
every point, the untouched release and a submission that patches the checks in its kernel get none.
(Notebook 01, with its many attacks: tests/test_grading.py.)"""
from __future__ import annotations

import shutil

import pytest

from conftest import ROOT, run_kvlib
from test_grading import nbgrader

pytestmark = pytest.mark.slow


PATCHING_PRELUDE = """
try:  # in the kernel, every later cell (visible asserts and hidden grade() alike) just prints "passed"
    from IPython import get_ipython as _gi
    _gi().input_transformers_cleanup.append(lambda lines: ['print("passed")\\n'])
except Exception:
    pass
try:  # and should a check run in this process: make it pass, and grade() print "passed"
    import kvlib.checks as _checks
    _checks.grade = lambda *a, **k: print("passed")
    for _name in ("generation", "recompute", "kv_cache", "roofline", "gqa"):
        _mod = __import__(f"kvlib.checks.{_name}", fromlist=["x"])
        for _attr in dir(_mod):
            if not _attr.startswith("__") and callable(getattr(_mod, _attr)):
                setattr(_mod, _attr, lambda *a, **k: None)
except Exception:
    pass
"""


def _stub_with(module: str, prelude: str, body: str) -> str:
    """kvlib/<module>.py: every exercise returns `body` instead of its solution; `prelude` runs at import."""
    out, skipping = [], False
    for line in (ROOT / "solutions" / "kvlib" / f"{module}.py").read_text(encoding="utf-8").splitlines(keepends=True):
        if line.strip() == "### BEGIN SOLUTION":
            out.append(line[: len(line) - len(line.lstrip())] + body + "\n")
            skipping = True
        elif line.strip() == "### END SOLUTION":
            skipping = False
        elif not skipping:
            out.append(line)
    return "".join(out).replace("from kvlib.course.exercises import exercise\n", "from kvlib.course.exercises import exercise\n" + prelude, 1)


ISOLATED = [("02-generation", "generation"), ("03-recompute", "recompute"), ("04-kv-cache", "kv_cache"),
            ("05-memory-wall", "roofline"), ("06-gqa", "gqa")]


@pytest.fixture(scope="module")
def graded_sizes(tmp_path_factory):
    """Notebooks 02 to 06 released from a `kvlib course init` folder; a correct and a patching
    submission of each, autograded; returns {(notebook, student): (score, max_score)}."""
    from nbgrader.api import Gradebook

    course = tmp_path_factory.mktemp("course-sizes")
    proc = run_kvlib("course", "init", str(course))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(course / "nbgrader_config.py", "a") as f:  # the kernel's run is cut short: scores never wait on it
        f.write("\nc.Execute.timeout = 4\nc.SandboxExecute.notebook_timeout = 12\n")
    scores = {}
    for nb, module in ISOLATED:
        nbgrader(course, "generate_assignment", nb, "--log-level=WARN")
        for student, text in (("correct", (ROOT / "solutions" / "kvlib" / f"{module}.py").read_text(encoding="utf-8")),
                              ("patching", _stub_with(module, PATCHING_PRELUDE, "return 0")),
                              ("untouched", None)):  # the release handed in as it is
            sub = course / "submitted" / student / nb
            shutil.copytree(course / "release" / nb, sub)
            if text is None:
                continue
            (sub / "kvlib" / f"{module}.py").write_text(text, encoding="utf-8")
            if module == "kv_cache":  # 4.x use Exercise 1.3's mask and 2.1's sampling: both students did those
                for earlier in ("attention", "generation"):
                    shutil.copy(ROOT / "solutions" / "kvlib" / f"{earlier}.py", sub / "kvlib" / f"{earlier}.py")
        nbgrader(course, "autograde", nb, "--log-level=WARN", timeout=1500)
        with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
            scores |= {(nb, s.student.id): (s.score, s.max_score) for s in gb.assignment_submissions(nb)}
    return scores


@pytest.mark.parametrize("nb", [nb for nb, _ in ISOLATED])
def test_notebooks_02_to_06_are_graded_in_isolation(graded_sizes, nb):
    """Check correct -> full marks, the untouched release -> 0, and a submission that patches the checks
    and grade() in its kernel -> 0: the scores of notebooks 02 to 06 come from the isolated child
    (notebook 01: tests/test_grading.py)."""
    correct, max_score = graded_sizes[(nb, "correct")]
    assert max_score > 0 and correct == max_score
    assert graded_sizes[(nb, "untouched")][0] == 0
    assert graded_sizes[(nb, "patching")][0] == 0
