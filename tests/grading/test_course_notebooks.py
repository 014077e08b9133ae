"""Notebooks 02 to 08 graded by nbgrader from a `kvlib course init` folder: a correct submission gets
every point (in 04 also one with code moved into a helper module of the learner's own), the
untouched release and a submission that patches the checks in its kernel get none.
(Notebook 01, with its many attacks: tests/grading/test_attacks.py.)"""

from __future__ import annotations

import shutil

import pytest
from conftest import EARLIER_DONE, ROOT, nbgrader, run_kvlib

from kvlib.app.class_bench import points
from kvlib.course.exercises import EXERCISES
from kvlib.grading.checks_registry import PROXYABLE_MODULES

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
    for _name in _checks.CHECK_MODULES:
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
    return "".join(out).replace(
        "from kvlib.course.exercises import exercise\n", "from kvlib.course.exercises import exercise\n" + prelude, 1
    )


def _with_helper_module(module: str, exercise_id: str, helper: str) -> tuple[str, str]:
    """The issue-15 learner: the reference kvlib/<module>.py with Exercise exercise_id's code moved into a
    module of their own, kvlib/my_helpers.py (as helper(...)), which the exercise calls. Returns both files."""
    import re

    text = (ROOT / "solutions" / "kvlib" / f"{module}.py").read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    at = next(i for i, ln in enumerate(lines) if ln.strip().startswith(f'@exercise("{exercise_id}"'))
    sig = next(i for i in range(at, len(lines)) if lines[i].lstrip().startswith("def "))
    params = re.match(r"\s*def \w+\((.*)", "".join(lines[sig : sig + 4]).replace("\n", " "))
    names = [p.split(":")[0].split("=")[0].strip() for p in _top_level_split(params.group(1).split(")")[0])]
    names = [n for n in names if n and n not in ("self", "*")]
    begin = next(i for i in range(sig, len(lines)) if lines[i].strip() == "### BEGIN SOLUTION")
    end = next(i for i in range(begin, len(lines)) if lines[i].strip() == "### END SOLUTION")
    indent = lines[begin][: len(lines[begin]) - len(lines[begin].lstrip())]
    body = "".join("    " + ln[len(indent) :] if ln.strip() else ln for ln in lines[begin + 1 : end])
    imports = "".join(ln for ln in lines if ln.startswith(("import ", "from ")) and "__future__" not in ln)
    helper_text = f"{imports}\n\ndef {helper}({', '.join(names)}):\n{body}"
    call = f"{indent}return {helper}({', '.join(names)})\n"
    learner = "".join(lines[:begin] + [call] + lines[end + 1 :])
    learner = "".join(
        ln for ln in learner.splitlines(keepends=True) if ln.strip() not in ("### BEGIN SOLUTION", "### END SOLUTION")
    )
    anchor = "from kvlib.course.exercises import exercise\n"
    return learner.replace(anchor, anchor + f"from kvlib.my_helpers import {helper}\n", 1), helper_text


def _top_level_split(params: str) -> list[str]:
    """A parameter list split at its top-level commas (not those inside brackets)."""
    out, depth, cur = [], 0, ""
    for ch in params:
        depth += ch in "([{" and 1 or (-1 if ch in ")]}" else 0)
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    return out + [cur]


# (notebook, module) from 02 on, graded in the isolated child: every notebook of the exercise table but 01
# (tests/grading/test_attacks.py) and any left in NOT_PROXYABLE
ISOLATED = [(nb, m) for nb, m in dict((ex.notebook, ex.module) for ex in EXERCISES).items() if m in PROXYABLE_MODULES][
    1:
]


@pytest.fixture(scope="module")
def graded_sizes(request, tmp_path_factory):
    """grade(notebook) -> {student: (score, max_score)}: every notebook this run's tests ask for (so `-k 07` grades
    07 only), released from one `kvlib course init` folder, a correct, a patching and an untouched submission (and
    in 04 a helper one) handed in for each, all graded in ONE `nbgrader autograde "*"`: nbgrader, the checks and
    torch load once, not once a notebook (this file is one scheduling unit, tests/conftest.py)."""
    from nbgrader.api import Gradebook

    wanted = sorted(
        {
            item.callspec.params["nb"]
            for item in request.session.items
            if item.path == request.path and "nb" in getattr(getattr(item, "callspec", None), "params", {})
        }
    )
    course = tmp_path_factory.mktemp("course-sizes")
    proc = run_kvlib("course", "init", str(course))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(course / "nbgrader_config.py", "a") as f:  # the kernel's run is cut short: scores never wait on it
        f.write("\nc.Execute.timeout = 4\nc.SandboxExecute.notebook_timeout = 12\n")
    nbgrader(course, "generate_assignment", "*", "--log-level=WARN")  # every assignment, in one process
    for nb in wanted:
        module = dict(ISOLATED)[nb]
        students = [
            ("correct", (ROOT / "solutions" / "kvlib" / f"{module}.py").read_text(encoding="utf-8")),
            ("patching", _stub_with(module, PATCHING_PRELUDE, "return 0")),
            ("untouched", None),
        ]  # the release handed in as it is
        helper = None
        if module == "kv_cache":  # issue 15's learner: 4.2's code in kvlib/my_helpers.py, imported by kv_cache.py
            text, helper = _with_helper_module("kv_cache", "4.2", "attention_with_cache")
            students.append(("helper", text))
        for student, text in students:
            sub = course / "submitted" / student / nb
            shutil.copytree(course / "release" / nb, sub)
            if text is None:
                continue
            (sub / "kvlib" / f"{module}.py").write_text(text, encoding="utf-8")
            if student == "helper":
                (sub / "kvlib" / "my_helpers.py").write_text(helper, encoding="utf-8")
            for earlier in EARLIER_DONE.get(module, ()):
                shutil.copy(ROOT / "solutions" / "kvlib" / f"{earlier}.py", sub / "kvlib" / f"{earlier}.py")
    if wanted:
        nbgrader(course, "autograde", "*", "--log-level=WARN", timeout=3000)  # every handed-in notebook at once
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        done = {nb: {s.student.id: (s.score, s.max_score) for s in gb.assignment_submissions(nb)} for nb in wanted}

    def grade(nb: str) -> dict:
        return done[nb]

    return grade


@pytest.mark.parametrize("nb", [nb for nb, _ in ISOLATED])
def test_scores_come_from_the_isolated_child(graded_sizes, nb):
    """Check that the scores of notebooks 02 to 10 come from the isolated child: correct -> full marks, the
    untouched release -> 0, and a submission that patches the checks and grade() in its kernel -> 0
    (notebook 01: tests/grading/test_attacks.py)."""
    scores = graded_sizes(nb)
    correct, max_score = scores["correct"]
    assert max_score > 0 and correct == max_score
    assert max_score == points(nb)[1], (
        f"{nb}'s maximum is not the points of every part's graded cells (02, 04, 08: two)"
    )
    assert scores["untouched"][0] == 0
    assert scores["patching"][0] == 0
    if "helper" in scores:  # code moved into the learner's own kvlib/my_helpers.py: full marks too
        assert scores["helper"] == (max_score, max_score)
