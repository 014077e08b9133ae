"""Tests for kvlib/course/hints.py and `kvlib hint`: hints on demand, in the terminal and the notebooks."""

from __future__ import annotations

import ast
import json
import shutil
import sys
import types

import numpy as np
import pytest

from kvlib import checks
from kvlib.app import cli
from kvlib.core.paths import ROOT
from kvlib.course import hints
from kvlib.course.exercises import BY_ID, EXERCISES


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    """A fresh place for the levels seen, so tests never share (or touch the user's) state."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_every_exercise_has_at_least_three_hints():
    """Check that every exercise of the table has a section with at least three levels."""
    found = hints.load()
    assert set(found) >= {ex.id for ex in EXERCISES}
    for ex in EXERCISES:
        assert len(found[ex.id].levels) >= hints.MIN_LEVELS, ex.id
        assert found[ex.id].file.name == f"{ex.module}.md"


def test_hint_files_ship_as_package_data():
    """Check that pyproject ships kvlib/course/hints/*.md, so a non-editable install has the hints."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+; the course runs on 3.10 too
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    globs = config["tool"]["setuptools"]["package-data"]["kvlib.course"]
    shipped = {p for g in globs for p in (ROOT / "kvlib" / "course").glob(g)}
    assert set(hints.hint_files()) <= shipped


def _reference_body_lines(ex) -> set[str]:
    path = ROOT / "solutions" / "kvlib" / f"{ex.module}.py"
    source = path.read_text(encoding="utf-8")
    nodes, node = ast.parse(source).body, None
    for part in ex.name.split("."):
        node = next(n for n in nodes if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part)
        nodes = node.body
    body = node.body[1:] if isinstance(node.body[0], ast.Expr) else node.body
    lines = source.splitlines()
    out = set()
    for stmt in body:
        for line in lines[stmt.lineno - 1 : stmt.end_lineno]:
            code = line.split("#")[0].strip()
            if len(code) >= 16 and not code.startswith(("raise", "check_", "###")):
                out.add(code)
    return out


def test_no_hint_holds_a_line_of_the_reference():
    """Check that no hint contains a line of its exercise's reference body (16 characters or more)."""
    found = hints.load()
    leaks = [
        f"{ex.id}: {line}"
        for ex in EXERCISES
        for line in _reference_body_lines(ex)
        if line in "\n".join(found[ex.id].levels)
    ]
    assert not leaks, leaks


def _copy_hints(tmp_path):
    folder = tmp_path / "hints"
    shutil.copytree(hints.HINTS_DIR, folder)
    return folder


def test_too_few_hints_names_the_file_and_the_exercise(tmp_path):
    """Check that an exercise with two hints is refused, naming its file and its id."""
    folder = _copy_hints(tmp_path)
    path = folder / "attention.md"
    text = path.read_text(encoding="utf-8")
    start = text.index("## 1.3")
    third = text.index("\n3. ", start)
    end = text.index("\n## ", third)
    path.write_text(text[:third] + text[end:], encoding="utf-8")
    with pytest.raises(hints.HintFileError, match=r"attention\.md: exercise 1\.3 \(Causal mask\) has 2 hint"):
        hints.load(folder)


def test_a_missing_section_names_the_exercise(tmp_path):
    """Check that an exercise without a section is named, with the file that should hold it."""
    folder = _copy_hints(tmp_path)
    path = folder / "gqa.md"
    text = path.read_text(encoding="utf-8")
    path.write_text(text[: text.index("## 6.4")], encoding="utf-8")
    with pytest.raises(hints.HintFileError, match=r"Exercise 6\.4 .* gqa\.md has no section '## 6\.4"):
        hints.load(folder)


@pytest.mark.parametrize(
    "bad, match",
    [
        ("# Hints for kvlib/attention.py\n", r"attention\.md line 1: expected '# Hints for"),
        ("# Hints for kvlib/attention.py (notebook 01)\n\n## 9.9 Nothing\n", r"line 3: exercise 9\.9 is not in"),
        (
            "# Hints for kvlib/attention.py (notebook 01)\n\n## 2.1 Greedy\n1. a\n",
            r"exercise 2\.1 is in kvlib/generation",
        ),
        (
            "# Hints for kvlib/attention.py (notebook 01)\n\n## 1.1 Softmax\n1. a\n3. b\n",
            r"line 5: .*hint 3 should be 2",
        ),
        ("# Hints for kvlib/attention.py (notebook 01)\n\n## 1.1 Softmax\nloose text\n", r"line 4: expected"),
    ],
    ids=["title", "unknown-id", "other-module", "numbering", "stray-line"],
)
def test_malformed_hint_file_names_file_and_line(tmp_path, bad, match):
    """Check that a hint file off the format is refused with its name, the line and the problem."""
    with pytest.raises(hints.HintFileError, match=match):
        hints.parse(bad, tmp_path / "attention.md")


def test_hint_shows_the_next_level_each_time(cache_home):
    """Check that kvlib hint moves one level on per call, then says there are no more."""
    n = len(hints.hints_for("4.2").levels)
    for level in range(1, n + 1):
        text = hints.show("4.2")
        assert f"hint {level} of {n}" in text and f"\n{level}. " in text
    assert "no more hints" in hints.show("4.2")
    assert json.loads(hints.state_file().read_text())[str(ROOT)]["4.2"] == n
    assert hints.state_file().is_relative_to(cache_home)
    assert "hint 1 of" in hints.show("4.3"), "each exercise keeps its own level"


def test_hint_levels_are_kept_per_course_folder(cache_home, monkeypatch, tmp_path):
    """Check that another course folder (a second clone) starts at level 1 and leaves this folder's levels as
    they were, and that a file of the old flat form is read as no levels seen."""
    hints.state_file().parent.mkdir(parents=True)
    hints.state_file().write_text(json.dumps({"1.2": 3}))  # kvlib before the levels were kept per folder
    assert "hint 1 of" in hints.show("1.2")
    assert "hint 2 of" in hints.show("1.2")
    monkeypatch.setattr(hints, "ROOT", tmp_path / "another-clone")
    assert "hint 1 of" in hints.show("1.2")
    monkeypatch.undo()
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache_home))
    assert "hint 3 of" in hints.show("1.2")
    assert json.loads(hints.state_file().read_text()) == {
        str(ROOT): {"1.2": 3},
        str(tmp_path / "another-clone"): {"1.2": 1},
    }


def test_hint_level_and_reset(cache_home):
    """Check that --level shows that level (and the next call the one after), and --reset starts again."""
    assert "hint 2 of" in hints.show("1.1", level=2)
    assert "hint 3 of" in hints.show("1.1")
    hints.reset("1.1")
    assert "hint 1 of" in hints.show("1.1")
    with pytest.raises(ValueError, match="hints 1 to 3, not 7"):
        hints.show("1.1", level=7)
    with pytest.raises(ValueError, match="no exercise '9.9'"):
        hints.show("9.9")


def test_hint_command(cache_home, capsys):
    """Check that `kvlib hint` prints the hint, exits 0, and exits 2 naming an unknown exercise."""
    assert cli.main(["hint", "2.2"]) == 0
    out = capsys.readouterr().out
    assert "Exercise 2.2 (Find and fix: the naive generation loop), hint 1 of" in out and "next: kvlib hint 2.2" in out
    assert cli.main(["hint", "2.2", "--level", "3"]) == 0
    assert "that was the last hint" in capsys.readouterr().out
    assert cli.main(["hint", "2.2", "--reset"]) == 0
    assert "start again at 1" in capsys.readouterr().out
    assert cli.main(["hint", "12.1"]) == 2
    assert "no exercise '12.1'" in capsys.readouterr().err


def test_notebooks_fold_the_hint_files_after_each_task():
    """Check that each notebook has, right after each exercise's task, a locked code cell that shows the
    exercise's hints, as the file has them, each level folded (solution and learner notebooks), and that
    no hint text stands in the notebook's markdown."""
    assert hints.sync_solution_notebooks(check=True) == []
    found = hints.load()
    for folder in ("solutions", "notebooks"):
        for ex in EXERCISES:
            parts = {
                nb: json.loads(nb.read_text(encoding="utf-8"))["cells"]
                for nb in (ROOT / folder / ex.notebook).glob("*.ipynb")
            }
            grade_ids = {
                nb: [c.get("metadata", {}).get("nbgrader", {}).get("grade_id") for c in cells]
                for nb, cells in parts.items()
            }
            (nb,) = [nb for nb, ids in grade_ids.items() if hints.task_cell_id(ex.id) in ids]  # the part that asks it
            cells, ids = parts[nb], grade_ids[nb]
            task = ids.index(hints.task_cell_id(ex.id))
            cell = cells[task + 1]
            assert cell["cell_type"] == "code" and "".join(cell["source"]) == hints.hints_cell_source(ex.id), (
                nb,
                ex.id,
            )
            markdown = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
            assert found[ex.id].levels[0].split("\n")[0] not in markdown, (nb, ex.id)
    for ex in EXERCISES:
        block = hints.show_hints(ex.id).data
        assert block.startswith(f"<details><summary>Hints (kvlib hint {ex.id})</summary>"), ex.id
        file_text = (ROOT / "kvlib" / "course" / "hints" / f"{ex.module}.md").read_text(encoding="utf-8")
        section = file_text.split(f"## {ex.id} ", 1)[1].split("\n## ", 1)[0]
        levels = found[ex.id].levels
        for i, text in enumerate(levels, start=1):
            folded = f"<details><summary>Hint {i} of {len(levels)}</summary>\n\n{hints._item(i, text)}\n\n</details>"
            assert folded in block and hints._item(i, text) in section, (ex.id, i)
        assert len(levels) >= hints.MIN_LEVELS, ex.id


def test_sync_moves_a_misplaced_block_back_after_its_task():
    """Check that sync_notebook puts a block back right after its task and changes nothing twice."""
    nb = json.loads((ROOT / "solutions" / "01-attention" / "attention.ipynb").read_text(encoding="utf-8"))
    ids = [c.get("id") for c in nb["cells"]]
    block = nb["cells"].pop(ids.index("hints-1-2"))
    nb["cells"].insert(0, block)
    assert hints.sync_notebook(nb) == ["1.2"]
    ids = [c.get("id") for c in nb["cells"]]
    assert ids.index("hints-1-2") == ids.index("ex1-2") + 1
    assert hints.sync_notebook(nb) == []


def test_failing_check_ends_with_the_hint_command(monkeypatch):
    """Check that a failing `kvlib check` line and a failing graded cell end with "(stuck? kvlib hint X.Y)"."""
    wrong = types.SimpleNamespace(softmax=lambda s: np.exp(s) / np.exp(s).sum(axis=-1, keepdims=True))
    monkeypatch.setitem(sys.modules, "kvlib.attention", wrong)
    result = checks.run_exercise(BY_ID["1.1"])
    assert result.status == "fail" and result.message.endswith("(stuck? kvlib hint 1.1)"), result
    with pytest.raises(AssertionError, match=r"\(stuck\? kvlib hint 1\.1\)$"):
        checks.grade("softmax_is_stable")


def test_learner_exception_names_exercise_shapes_and_contract():
    """Check that an exception inside the learner's function comes back with the exercise, the
    arguments' shapes and dtypes, and what the docstring expects, not a bare traceback."""
    src = "import torch\ndef attend(q, k, v, scale=None):\n    return torch.softmax(k @ q, dim=-1)\n"
    namespace: dict = {}
    exec(compile(src, str(ROOT / "scratch" / "kvlib" / "attention.py"), "exec"), namespace)
    with pytest.raises(TypeError) as info:
        namespace["attend"](np.ones(2), np.ones((3, 2)), np.ones((3, 2), dtype=np.float32))
    text = checks._explain(info.value, BY_ID["1.2"])
    assert text.startswith("TypeError: ") and "(in attend, at kvlib/attention.py line 3" in text
    assert "q=numpy ndarray (2,) float64" in text and "v=numpy ndarray (3, 2) float32" in text
    assert "Exercise 1.2 expects Args: q: (head_dim,)" in text and "Returns: out: (d_v,)" in text
