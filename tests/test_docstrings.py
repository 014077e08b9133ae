"""The docstring is the contract (STYLE.md section 5): every exercise's docstring in the learner stubs
says what the function does, its shapes, dtypes and errors, with an example that runs as written,
and never a line of the reference."""

from __future__ import annotations

import ast
import doctest
import importlib
import inspect
import re

import pytest
import torch

from kvlib.core.paths import ROOT
from kvlib.course import exercises
from kvlib.course.exercises import EXERCISES

IDS = [ex.id for ex in EXERCISES]


def _stub_object(ex):
    obj = importlib.import_module(f"kvlib.{ex.module}")
    for part in ex.name.split("."):
        obj = getattr(obj, part)
    return obj


def _reference_body(ex) -> list[str]:
    """Code lines of the reference's body (docstring left out), comments stripped."""
    source = (ROOT / "solutions" / "kvlib" / f"{ex.module}.py").read_text(encoding="utf-8")
    nodes, node = ast.parse(source).body, None
    for part in ex.name.split("."):
        node = next(n for n in nodes if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part)
        nodes = node.body
    body = node.body[1:] if isinstance(node.body[0], ast.Expr) else node.body
    lines = source.splitlines()
    return [line.split("#")[0].strip() for stmt in body for line in lines[stmt.lineno - 1 : stmt.end_lineno]]


def _shipped_lines(ex) -> set[str]:
    """A find-and-fix exercise's shipped lines (kvlib.app.release: the block right after its solution), uncommented
    and squashed; empty for every other kind."""
    if ex.kind != "fix":
        return set()
    source = (ROOT / "solutions" / "kvlib" / f"{ex.module}.py").read_text(encoding="utf-8")
    after = source[re.search(rf'@exercise\("{re.escape(ex.id)}"', source).start() :]
    block = after.split("### BEGIN " + "SHIPPED\n", 1)[1].split("### END " + "SHIPPED", 1)[0]
    return {_squash(line.strip().removeprefix("#").split("#")[0]) for line in block.splitlines()}


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


@pytest.mark.parametrize("ex", EXERCISES, ids=IDS)
def test_stub_holds_no_line_of_its_reference(ex):
    """Check that no line of the reference's body (12 characters or more, spaces ignored) stands
    anywhere in the learner's stub file, docstrings included (the release hook looks at 16 and more)."""
    stub = _squash((ROOT / "kvlib" / f"{ex.module}.py").read_text(encoding="utf-8"))
    shipped = _shipped_lines(ex)  # a find-and-fix exercise's broken body shares lines with the right one
    leaks = [
        line
        for line in _reference_body(ex)
        if len(line) >= 12
        and not line.startswith(("raise", "check_", "###"))
        and _squash(line) in stub
        and not any(_squash(line) in ship for ship in shipped)
    ]
    assert not leaks, f"Exercise {ex.id}: lines of the reference in kvlib/{ex.module}.py: {leaks}"


@pytest.mark.parametrize("ex", EXERCISES, ids=IDS)
def test_docstring_states_the_contract(ex):
    """Check that every exercise's docstring has Args or Returns, Raises and an Example, and no
    hints or reference length (those live in kvlib/course/hints/)."""
    doc = inspect.getdoc(_stub_object(ex)) or ""
    assert re.search(r"^(Args|Returns):", doc, re.M), f"Exercise {ex.id}: no Args:/Returns: in its docstring"
    assert re.search(r"Raises:", doc), f"Exercise {ex.id}: no Raises: in its docstring"
    assert re.search(r"^Example:", doc, re.M) and ">>> " in doc, f"Exercise {ex.id}: no runnable Example:"
    assert "Hints" not in doc and "reference solution" not in doc, f"Exercise {ex.id}: hints belong in the hint files"


@pytest.fixture
def reference_mode(monkeypatch):
    """Reference mode for one test, then back to whatever it was (the switch, not the environment)."""
    monkeypatch.setattr(exercises, "_forced", True)


@pytest.mark.parametrize("ex", EXERCISES, ids=IDS)
def test_docstring_example_runs_as_written(ex, reference_mode):
    """Check that every exercise's Example runs as written on the reference and prints what it says."""
    obj = _stub_object(ex)
    module = importlib.import_module(f"kvlib.{ex.module}")
    torch.manual_seed(0)
    finder = doctest.DocTestFinder(recurse=False)
    (test,) = finder.find(obj, ex.name, globs=dict(vars(module)))
    assert test.examples, f"Exercise {ex.id}: the docstring has no >>> example"
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS)
    out: list[str] = []
    result = runner.run(test, out=out.append)
    assert result.failed == 0, f"Exercise {ex.id}'s example does not run as written:\n" + "".join(out)
