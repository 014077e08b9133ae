"""The learner release: kvlib/ stubs and notebooks/ are exactly what solutions/ generates."""

import pytest
from conftest import ROOT

from kvlib.app import release as course
from kvlib.course.exercises import BY_ID, NOTEBOOKS, Exercise


def test_learner_release_is_generated_from_solutions():
    """Check that kvlib/ and notebooks/ equal a fresh `kvlib course release` (stubs + nbgrader), the translated
    notebooks (solutions/<lang>/, notebooks/<lang>/, kvlib/app/translate.py) in the same nbgrader run."""
    from kvlib.app import translate

    problems = translate.release(check=True)
    assert not problems, "run `kvlib course release`:\n" + "\n".join(problems)


@pytest.mark.parametrize("folder", ["kvlib", "notebooks"])
def test_no_solution_or_hidden_test_reaches_learners(folder):
    """Check that no solution block or hidden test marker appears in a learner-facing file."""
    import nbformat

    markers = {"### BEGIN SOLUTION", "### END SOLUTION", "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"}
    for path in (ROOT / folder).rglob("*"):
        if path.suffix == ".py" and "__pycache__" not in path.parts:
            lines = path.read_text(encoding="utf-8").splitlines()
        elif path.suffix == ".ipynb" and ".ipynb_checkpoints" not in path.parts:
            lines = [line for cell in nbformat.read(path, as_version=4).cells for line in cell.source.splitlines()]
        else:
            continue
        leaked = {line.strip() for line in lines} & markers
        assert not leaked, f"{leaked} in {path}"
        if path.suffix == ".ipynb":
            assert not any("grade(" in line for line in lines), f"a hidden grade() call in {path}"


def test_every_exercise_notebook_has_a_source_and_a_release():
    """Check that each notebook named in the exercise table exists in solutions/ and notebooks/."""
    for nb in NOTEBOOKS:
        assert list((ROOT / "solutions" / nb).glob("*.ipynb")), f"solutions/{nb} has no notebook"
        assert list((ROOT / "notebooks" / nb).glob("*.ipynb")), f"notebooks/{nb} has no notebook"
    assert set(course.assignments()) >= set(NOTEBOOKS)


def test_stub_source_replaces_each_solution_block_with_a_raise():
    """Check the stub generator on a tiny module: one raise per block, naming id and notebook."""
    src = '@exercise("1.1")\ndef softmax(x):\n    """Doc."""\n    ### BEGIN SOLUTION\n    return x\n    ### END SOLUTION\n'
    assert course.stub_source(src) == (
        '@exercise("1.1")\ndef softmax(x):\n    """Doc."""\n'
        '    raise NotImplementedError("Exercise 1.1 (notebooks/01-attention): softmax")\n'
    )
    with pytest.raises(ValueError, match="without its ### END SOLUTION"):
        course.stub_source('@exercise("1.1")\ndef softmax(x):\n    ### BEGIN SOLUTION\n')


_FIX = Exercise("1.1", "Stable softmax", "01-attention", "attention", "softmax", kind="fix")
_SHIPPED = (
    '@exercise("1.1")\ndef softmax(x):\n    """Doc."""\n    ### BEGIN SOLUTION\n    return x.sum(-1)\n    ### END SOLUTION\n'
    "    ### BEGIN SHIPPED\n    # y = x  # a comment kept\n    #\n    # return y.sum(0)\n    ### END SHIPPED\n\n"
    '@exercise("1.2")\ndef attend(x):\n    ### BEGIN SOLUTION\n    return x\n    ### END SOLUTION\n'
)


def test_stub_source_ships_a_find_and_fix_exercises_broken_body(monkeypatch):
    """Check that a fix exercise's stub holds its shipped body, uncommented, in place of the raise, while the next
    exercise still gets its raise; and that the reference's right body never reaches the stub."""
    monkeypatch.setitem(course.BY_ID, "1.1", _FIX)
    assert course.stub_source(_SHIPPED) == (
        '@exercise("1.1")\ndef softmax(x):\n    """Doc."""\n    y = x  # a comment kept\n\n    return y.sum(0)\n\n'
        '@exercise("1.2")\ndef attend(x):\n'
        '    raise NotImplementedError("Exercise 1.2 (notebooks/01-attention): attend")\n'
    )


def test_stub_source_keeps_the_solutions_of_exercises_answered(monkeypatch):
    """Check that an answered exercise keeps its solution (markers gone, its shipped block dropped) while the others
    are stubbed as the release stubs them: a learner part-way through, as the tests' learner copies need."""
    monkeypatch.setitem(course.BY_ID, "1.1", _FIX)
    assert course.stub_source(_SHIPPED, answered={"1.1"}) == (
        '@exercise("1.1")\ndef softmax(x):\n    """Doc."""\n    return x.sum(-1)\n\n'
        '@exercise("1.2")\ndef attend(x):\n'
        '    raise NotImplementedError("Exercise 1.2 (notebooks/01-attention): attend")\n'
    )
    assert course.stub_source(_SHIPPED, answered={"1.2"}).endswith("def attend(x):\n    return x\n")


def test_stub_source_refuses_a_shipped_block_that_does_not_fit_its_exercise(monkeypatch):
    """Check each malformed shipped block is refused with a message naming the problem: a shipped block for a build
    exercise, a fix exercise without one, one not right after its solution, an uncommented line, no end line."""
    with pytest.raises(ValueError, match=r"Exercise 1\.1 has a shipped block, and its kind is 'build'"):
        course.stub_source(_SHIPPED)
    with pytest.raises(ValueError, match="must follow its exercise's ### END SOLUTION at once"):
        course.stub_source(
            _SHIPPED.replace(
                "    ### END SOLUTION\n    ### BEGIN SHIPPED", "    ### END SOLUTION\n\n    ### BEGIN SHIPPED"
            )
        )
    monkeypatch.setitem(course.BY_ID, "1.1", _FIX)
    with pytest.raises(ValueError, match=r"Exercise 1\.1 has no shipped block, and its kind is 'fix'"):
        course.stub_source(_SHIPPED.replace("SHIPPED", "NOTHING"))
    with pytest.raises(ValueError, match="line 10: a shipped line is commented with '    # '"):
        course.stub_source(_SHIPPED.replace("    # return y.sum(0)", "    return y.sum(0)"))
    with pytest.raises(ValueError, match="a shipped block without its ### END SHIPPED"):
        course.stub_source(_SHIPPED.split("    ### END SHIPPED")[0])


def test_every_fix_exercise_ships_a_body_and_every_other_a_raise():
    """Check the release's stubs against the table: a fix exercise's stub runs code (no raise naming it); every other
    exercise's stub raises naming itself."""
    for ex in BY_ID.values():
        stub = (ROOT / "kvlib" / f"{ex.module}.py").read_text(encoding="utf-8")
        raised = f'raise NotImplementedError("Exercise {ex.id} (notebooks/{ex.notebook}): {ex.name}")' in stub
        assert raised == (ex.kind != "fix"), (
            f"Exercise {ex.id} ({ex.kind}): its stub {'raises' if raised else 'does not raise'}"
        )
