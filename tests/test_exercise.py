"""The exercise mechanism: stubs, reference mode, the exercise table and `kvlib check`."""

import ast
import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT, run_kvlib

import kvlib
from kvlib.app import release as course
from kvlib.checks import checks_for
from kvlib.course import exercises as _exercise
from kvlib.course import hints
from kvlib.course.exercises import BY_ID, EXERCISES, ExerciseNotDone


def _bodyless(source: str) -> str:
    """The module's AST with every @exercise function body reduced to its docstring."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and any(
            isinstance(d, ast.Call) and getattr(d.func, "id", "") == "exercise" for d in node.decorator_list
        ):
            node.body = node.body[:1]
    return ast.dump(tree, include_attributes=False)


@pytest.mark.parametrize("solution", course.solution_modules(), ids=lambda p: p.name)
def test_stub_differs_from_solution_only_in_exercise_bodies(solution):
    """Check that kvlib/<module>.py equals its solution but for the bodies of exercise functions."""
    stub = ROOT / "kvlib" / solution.name
    assert _bodyless(stub.read_text()) == _bodyless(solution.read_text())


@pytest.mark.parametrize("solution", course.solution_modules(), ids=lambda p: p.name)
def test_stub_bodies_only_raise(solution):
    """Check that every exercise stub is a docstring and one raise naming its exercise: no reference code leaks (a
    find-and-fix exercise's stub holds its shipped body instead: tests/test_course.py checks it)."""
    tree = ast.parse((ROOT / "kvlib" / solution.name).read_text())
    found = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and any(
            getattr(getattr(d, "func", None), "id", "") == "exercise" for d in node.decorator_list
        ):
            found += 1
            ex_id = node.decorator_list[0].args[0].value
            doc, body = node.body[0], node.body[1:]
            assert isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant), f"{node.name} has no docstring"
            if BY_ID[ex_id].kind == "fix":  # ships its broken body (tests/test_course.py: the shipped block's)
                continue
            assert len(body) == 1 and isinstance(body[0], ast.Raise), f"{node.name}: a stub must only raise"
            message = body[0].exc.args[0].value
            assert message.startswith(f"Exercise {ex_id} (notebooks/"), message
    assert found == sum(ex.file == f"kvlib/{solution.name}" for ex in EXERCISES)


def test_exercise_table_matches_the_code():
    """Check that every row of the exercise table names a decorated function with checks."""
    for ex in EXERCISES:
        obj = getattr(__import__(f"kvlib.{ex.module}", fromlist=["_"]), ex.name.split(".")[0])
        for part in ex.name.split(".")[1:]:
            obj = getattr(obj, part)
        assert obj.__exercise__ is ex
        assert checks_for(ex), f"Exercise {ex.id} has no check"
        assert obj.__doc__ and "Example:" in obj.__doc__, f"{ex.name} docstring lacks its contract"
        assert ex.id in hints.load(), f"Exercise {ex.id} has no hints in kvlib/course/hints/{ex.module}.md"


_UNTOUCHED = {False: "todo", True: "fail"}  # an untouched stub's status: a raise, or (find-and-fix) a shipped bug
# find-and-fix exercises whose shipped body calls an earlier exercise: untouched, they name that one first ("todo");
# their own shipped bug, with the earlier one done, is tested beside their checks (tests/test_<module>.py)
_SHIPPED_NEEDS = {"2.2": "2.1", "4.3": "4.2", "5.3": "4.4"}


def _untouched(ex) -> str:
    return "todo" if ex.id in _SHIPPED_NEEDS else _UNTOUCHED[ex.kind == "fix"]


def test_every_stub_raises_in_learner_mode(learner_mode):
    """Check that each exercise, called on valid input in learner mode, raises ExerciseNotDone naming itself; a
    find-and-fix exercise instead runs its shipped body, which fails its checks with a message (or, where that body
    calls an earlier exercise, names that one to do first)."""
    results = kvlib.checks.run()
    assert [r.status for r in results] == [_untouched(ex) for ex in EXERCISES]
    assert all(r.message for r in results)
    for r in results:
        if r.id in _SHIPPED_NEEDS:
            assert f"do Exercise {_SHIPPED_NEEDS[r.id]}" in r.message, r.message


def test_use_solutions_switches_to_the_reference(learner_mode):
    """Check that use_solutions() turns a learner stub into the reference and back."""
    import numpy as np

    from kvlib.attention import softmax

    with pytest.raises(ExerciseNotDone, match=r"Exercise 1\.1"):
        softmax(np.zeros(3))
    kvlib.use_solutions()
    np.testing.assert_allclose(softmax(np.zeros(3)), np.full(3, 1 / 3))
    kvlib.use_solutions(False)
    with pytest.raises(NotImplementedError):
        softmax(np.zeros(3))


def test_unfinished_dependency_names_the_exercise_to_do_first(learner_mode):
    """Check that a finished exercise calling an unfinished one says which to do first."""
    import numpy as np

    from kvlib import attention

    def causal_self_attention(q, k, v):  # a learner's 1.4 that calls their unfinished 1.1
        return attention.softmax(q @ k.T), None

    learner_1_4 = _exercise.exercise("1.4")(causal_self_attention)
    with pytest.raises(ExerciseNotDone, match=r"do Exercise 1\.1 first") as info:
        learner_1_4(np.ones((2, 3)), np.ones((2, 3)), np.ones((2, 3)))
    assert info.value.exercise.id == "1.1" and info.value.needed_by.id == "1.4"


def test_kvlib_check_json_in_both_modes():
    """Check that `kvlib check --json` reports every exercise passing in reference mode and todo in learner
    mode."""
    ref = run_kvlib("check", "--json", env={"KVLIB_SOLUTIONS": "1"})
    assert ref.returncode == 0, ref.stderr
    rows = json.loads(ref.stdout)
    assert [r["id"] for r in rows] == [ex.id for ex in EXERCISES]
    assert all(set(r) == {"id", "title", "notebook", "status", "message"} for r in rows)
    assert {r["status"] for r in rows} == {"pass"}
    learner = run_kvlib("check", "--json", env={"KVLIB_SOLUTIONS": "0"})
    assert learner.returncode == 1
    assert [r["status"] for r in json.loads(learner.stdout)] == [_untouched(ex) for ex in EXERCISES]


def test_kvlib_check_selects_by_id_or_notebook():
    """Check that `kvlib check 1.2` and `kvlib check 01` select the right exercises."""
    one = json.loads(run_kvlib("check", "1.2", "--json").stdout)
    assert [r["id"] for r in one] == ["1.2"]
    nb = json.loads(run_kvlib("check", "01", "--json").stdout)
    assert [r["id"] for r in nb] == [ex.id for ex in EXERCISES if ex.notebook.startswith("01")]
    bad = run_kvlib("check", "9.9")
    assert bad.returncode == 2 and "no exercise '9.9'" in bad.stderr


def _learner_copy(tmp_path, attention_source):
    """A copy of the kvlib package with attention.py replaced, importable from tmp_path."""
    shutil.copytree(ROOT / "kvlib", tmp_path / "kvlib", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "kvlib" / "attention.py").write_text(attention_source)
    return {
        "PYTHONPATH": str(tmp_path),
        "KVLIB_SOLUTIONS": "0",
        "KVLIB_SOLUTIONS_DIR": str(ROOT / "solutions" / "kvlib"),
    }


def test_kvlib_check_reports_a_broken_file_and_goes_on(tmp_path):
    """Check that a syntax error in the learner's file fails its exercises with the error, not a crash."""
    env = _learner_copy(tmp_path, "def softmax(:\n")
    proc = run_kvlib("check", "--json", env=env, cwd=tmp_path)
    rows = json.loads(proc.stdout)
    assert proc.returncode == 1 and len(rows) == len(EXERCISES)
    assert all(
        r["status"] == "fail" and "does not import: SyntaxError" in r["message"]
        for r in rows
        if r["notebook"] == "01-attention"
    )


def test_kvlib_check_reports_partial_progress(tmp_path):
    """Check that a learner who solved 1.1 and 1.3 sees pass, todo, pass, todo, todo, and the CLI table."""
    source = (ROOT / "kvlib" / "attention.py").read_text()
    solution = (ROOT / "solutions" / "kvlib" / "attention.py").read_text()
    for name in ("softmax", "causal_mask"):  # paste the reference body of two exercises
        ex_id = _exercise.BY_ID["1.1" if name == "softmax" else "1.3"].id
        stub_raise = f'raise NotImplementedError("Exercise {ex_id} (notebooks/01-attention): {name}")'
        body = solution.split(f"def {name}(")[1].split("### BEGIN SOLUTION\n")[1].split("    ### END SOLUTION")[0]
        source = source.replace("    " + stub_raise + "\n", body)
    env = _learner_copy(tmp_path, source)
    rows = json.loads(run_kvlib("check", "01", "--json", env=env, cwd=tmp_path).stdout)
    assert [r["status"] for r in rows] == ["pass", "todo", "pass", "todo", "todo"]
    table = run_kvlib("check", "01", env=env, cwd=tmp_path).stdout
    assert "2 of 5 exercises pass" in table


def test_kvlib_check_stops_an_endless_loop(tmp_path):
    """Check that an endless loop in one exercise fails it with a timeout and the others still run."""
    source = (
        (ROOT / "kvlib" / "attention.py")
        .read_text()
        .replace(
            '    raise NotImplementedError("Exercise 1.1 (notebooks/01-attention): softmax")',
            "    while True:\n        pass",
        )
    )
    env = _learner_copy(tmp_path, source)
    code = (
        "import json; from kvlib.checks import run_exercise; from kvlib.course.exercises import BY_ID;"
        "print(json.dumps([run_exercise(BY_ID[i], timeout=1).as_dict() for i in ('1.1', '1.3')]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    first, second = json.loads(proc.stdout)
    assert first["status"] == "fail" and "endless loop" in first["message"]
    assert second["status"] == "todo"


def test_grade_runs_every_check_of_an_exercise_cell_and_names_each_failure(monkeypatch, capsys):
    """Check that grade("checks-1-1"), a graded cell's hidden test in the kernel, runs all of 1.1's checks,
    prints a verdict for each, and fails naming how many failed and why."""
    import sys
    import types

    import numpy as np

    from kvlib import checks

    naive = types.SimpleNamespace(softmax=lambda s: np.exp(s) / np.exp(s).sum(axis=-1, keepdims=True))
    monkeypatch.setitem(sys.modules, "kvlib.attention", naive)
    with pytest.raises(
        AssertionError, match=r"^2 of 5 checks failed: softmax_is_stable: .*softmax_holds_on_rows_far_apart"
    ):
        checks.grade("checks-1-1")
    out = capsys.readouterr().out
    assert out.count("passed: ") == 3 and out.count("failed: ") == 2
    with pytest.raises(KeyError, match="no check and no exercise's cell named 'checks-99-1'"):
        checks.grade("checks-99-1")


def _reference_with_shipped(module: str, *fix_ids: str) -> str:
    """solutions/kvlib/<module>.py with every exercise answered except the find-and-fix ones `fix_ids`, left as they
    ship (the release's own stub, the others' solutions kept)."""
    from kvlib.app.release import stub_source

    source = (ROOT / "solutions" / "kvlib" / f"{module}.py").read_text(encoding="utf-8")
    return stub_source(source, answered={ex.id for ex in EXERCISES} - set(fix_ids))


def test_a_later_exercise_failing_on_an_unfixed_shipped_bug_names_the_bug_first(tmp_path):
    """Check that 2.3, right but running the generation loop 2.2 ships broken, is reported as "do Exercise 2.2 first"
    (todo, not a failure of 2.3's own), and passes once 2.2 is fixed; the fixed copy is the reference itself."""
    env = _learner_copy(tmp_path, (ROOT / "solutions" / "kvlib" / "attention.py").read_text(encoding="utf-8"))
    generation = tmp_path / "kvlib" / "generation.py"
    generation.write_text(_reference_with_shipped("generation", "2.2"), encoding="utf-8")
    rows = {r["id"]: r for r in json.loads(run_kvlib("check", "02", "--json", env=env, cwd=tmp_path).stdout)}
    assert rows["2.2"]["status"] == "fail", rows["2.2"]
    assert rows["2.3"]["status"] == "todo" and rows["2.3"]["message"].startswith("do Exercise 2.2 ("), rows["2.3"]
    assert rows["2.1"]["status"] == "pass", rows["2.1"]  # the copy's 2.1 is the reference (no assets: 2.4 cannot run)
    generation.write_text((ROOT / "solutions" / "kvlib" / "generation.py").read_text(encoding="utf-8"))
    fixed = json.loads(run_kvlib("check", "2.3", "--json", env=env, cwd=tmp_path).stdout)
    assert fixed[0]["status"] == "pass", fixed


_EACH_CHECK = """
import importlib, json, sys
import numpy as np
from kvlib.checks import Graded, checks_for
from kvlib.course.exercises import BY_ID
out = {}
for ex_id in sys.argv[1:]:
    ex = BY_ID[ex_id]
    module = importlib.import_module(f"kvlib.{ex.module}")
    for c in checks_for(ex):
        try:
            c.fn(Graded(module, ex.module), np.random.default_rng(0))
            out[c.name] = None
        except Exception as err:
            out[c.name] = f"{type(err).__name__}: {err}"
print(json.dumps(out))
"""


def test_every_check_of_a_find_and_fix_exercise_fails_on_its_shipped_body(tmp_path):
    """Check that every find-and-fix exercise's shipped body fails its checks, every other exercise answered by the
    reference, each failure the bug's and not a missing exercise's (no ExerciseNotDone). A check the bug does not
    touch may pass (2.2's streaming): the grader gives such a cell all or nothing (test_preprocessor)."""
    fixes = [ex for ex in EXERCISES if ex.kind == "fix"]
    shutil.copytree(ROOT / "kvlib", tmp_path / "kvlib", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "assets").symlink_to(ROOT / "assets")
    for path in (ROOT / "solutions" / "kvlib").glob("*.py"):
        shutil.copyfile(path, tmp_path / "kvlib" / path.name)
    for module in {ex.module for ex in fixes}:  # a module's find-and-fix exercises all shipped at once (02: 2.2, 2.5)
        ids = [ex.id for ex in fixes if ex.module == module]
        (tmp_path / "kvlib" / f"{module}.py").write_text(_reference_with_shipped(module, *ids), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "KVLIB_SOLUTIONS": "0"}
    proc = subprocess.run(
        [sys.executable, "-c", _EACH_CHECK, *[ex.id for ex in fixes]],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    verdicts = json.loads(proc.stdout.splitlines()[-1])
    assert fixes and verdicts
    for ex in fixes:
        mine = [verdicts[c.name] for c in checks_for(ex)]
        assert any(error is not None for error in mine), f"Exercise {ex.id}: its shipped body passes every check"
    undone = [name for name, error in verdicts.items() if error and error.startswith("ExerciseNotDone")]
    assert not undone, f"checks that never reached the shipped bug: {undone}"


def test_shipped_note_names_a_find_and_fix_exercise_that_does_not_pass_yet(learner_mode, capsys):
    """Check that shipped_note prints a line for a find-and-fix exercise still as shipped (learner mode), nothing in
    reference mode, and refuses an exercise that is not a find-and-fix."""
    from kvlib.checks import shipped_note

    lines = shipped_note("8.3")
    assert lines == [capsys.readouterr().out.strip()]
    assert lines[0].startswith("Exercise 8.3 does not pass its checks yet (kvlib check 8.3)")
    kvlib.use_solutions()
    try:
        assert shipped_note("8.3") == [] and capsys.readouterr().out == ""
    finally:
        kvlib.use_solutions(False)
    with pytest.raises(ValueError, match=r"Exercise 8\.4 is not a find-and-fix exercise"):
        shipped_note("8.4")
