"""The learner release: kvlib/ stubs and notebooks/ are exactly what solutions/ generates."""

import pytest
from conftest import ROOT

from kvlib.app import release as course
from kvlib.course.exercises import NOTEBOOKS


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
