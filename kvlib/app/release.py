"""The course's own build: learner stubs and learner notebooks, both generated from solutions/.

  solutions/kvlib/<module>.py   -> kvlib/<module>.py          (solution blocks become a raise)
  solutions/NN-topic/*.ipynb    -> notebooks/NN-topic/*.ipynb (nbgrader generate_assignment)
  kvlib/course/hints/*.md       -> each exercise's collapsed hints block in solutions/NN-topic/*.ipynb
`kvlib course release` rewrites both; `--check` only reports what differs (the tests use it).
"""

from __future__ import annotations

import difflib
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from kvlib.core.paths import ROOT
from kvlib.course import hints
from kvlib.course.exercises import BY_ID, EXERCISES

_DECORATOR = re.compile(r'^\s*@exercise\("(\d+\.\d+)"')
# spelled in parts, so that a search for leaked solution blocks never flags this file
BEGIN, END = "### BEGIN " + "SOLUTION", "### END " + "SOLUTION"


def stub_source(solution: str) -> str:
    """The learner's version of a solution module: each solution block replaced by a raise."""
    out, current, skipping = [], None, False
    for line in solution.splitlines(keepends=True):
        if m := _DECORATOR.match(line):
            current = BY_ID[m.group(1)]
        if line.strip() == BEGIN:
            if current is None:
                raise ValueError(f"a solution block outside an @exercise function: {line!r}")
            indent = line[: len(line) - len(line.lstrip())]
            out.append(
                f'{indent}raise NotImplementedError("Exercise {current.id} (notebooks/{current.notebook}): {current.name}")\n'
            )
            skipping = True
        elif line.strip() == END:
            skipping, current = False, None
        elif not skipping:
            out.append(line)
    if skipping:
        raise ValueError("a solution block without its ### END SOLUTION")
    return "".join(out)


def solution_modules() -> list[Path]:
    return sorted((ROOT / "solutions" / "kvlib").glob("*.py"))


def assignments() -> list[str]:
    """Notebook folders under solutions/ (every folder but kvlib)."""
    return sorted(p.name for p in (ROOT / "solutions").iterdir() if p.is_dir() and p.name[:2].isdigit())


# One sitting: how long a learner who does the exercises needs for a notebook, estimated from its
# text. The rates are assumptions, not timings of learners: technical prose read at 130 words a
# minute (about half of the ~240 usually quoted for non-fiction, for prose with formulas); an
# exercise (read it, write it, run its check, fix one slip) 6 minutes; a code cell run and its
# output read in half a minute. docs/instructors.md prints the estimate of every notebook.
WORDS_PER_MINUTE = 130
MINUTES_PER_EXERCISE = 6
MINUTES_PER_CODE_CELL = 0.5
MAX_SITTING_MINUTES = 60
MAX_CELLS = 60


def sitting(notebook: Path) -> dict:
    """Cells, markdown words, exercises, code cells and the estimated minutes of one solution notebook."""
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    # folded hints blocks are read on demand, inside an exercise's minutes, not in the sitting's text
    cells = [c for c in cells if not str(c.get("id", "")).startswith("hints-")]
    words = sum(len("".join(c["source"]).split()) for c in cells if c["cell_type"] == "markdown")
    code = sum(c["cell_type"] == "code" for c in cells)
    exercises = sum(ex.notebook == notebook.parent.name for ex in EXERCISES)
    minutes = words / WORDS_PER_MINUTE + MINUTES_PER_EXERCISE * exercises + MINUTES_PER_CODE_CELL * code
    return {
        "notebook": notebook.parent.name,
        "cells": len(cells),
        "words": words,
        "exercises": exercises,
        "code_cells": code,
        "minutes": round(minutes),
    }


def sitting_table() -> str:
    """The estimate of every notebook as a markdown table (docs/instructors.md shows it)."""
    rows = ["| notebook | cells | words | exercises | code cells | minutes |", "|---|---|---|---|---|---|"]
    for name in assignments():
        for nb in sorted((ROOT / "solutions" / name).glob("*.ipynb")):
            s = sitting(nb)
            rows.append(
                f"| {s['notebook']} | {s['cells']} | {s['words']:,} | {s['exercises']} | {s['code_cells']} | {s['minutes']} |"
            )
    return "\n".join(rows)


def _generate_notebooks(dest: Path) -> None:
    """Run nbgrader generate_assignment for every assignment, writing into dest/<assignment>."""
    with tempfile.TemporaryDirectory() as tmp:
        for name in assignments():
            cmd = [
                sys.executable,
                "-m",
                "nbgrader",
                "generate_assignment",
                name,
                "--no-db",
                "--force",
                f"--CourseDirectory.root={ROOT}",
                f"--CourseDirectory.release_directory={dest}",
                "--log-level=WARN",
            ]
            # run from a scratch folder: nbgrader would otherwise leave gradebook.db in the repo
            proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"nbgrader generate_assignment {name} failed:\n{proc.stdout}\n{proc.stderr}")


def _diff(old: str, new: str, name: str) -> list[str]:
    return list(
        difflib.unified_diff(
            old.splitlines(), new.splitlines(), f"{name} (committed)", f"{name} (generated)", lineterm="", n=1
        )
    )


def release(check: bool = False) -> list[str]:
    """Regenerate kvlib/ stubs and notebooks/ from solutions/. With check=True write nothing and
    return the differences (an empty list means the release is up to date)."""
    problems: list[str] = hints.sync_solution_notebooks(check)  # the hint files -> the notebooks' hints blocks
    for sol in solution_modules():
        target = ROOT / "kvlib" / sol.name
        new = stub_source(sol.read_text(encoding="utf-8"))
        old = target.read_text(encoding="utf-8") if target.exists() else ""
        if old != new:
            problems += [f"kvlib/{sol.name} differs from the stub of solutions/kvlib/{sol.name}"] + _diff(
                old, new, f"kvlib/{sol.name}"
            )[:40]
            if not check:
                target.write_text(new, encoding="utf-8")
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp) / "notebooks"
        _generate_notebooks(fresh)
        for nb in sorted(fresh.rglob("*.ipynb")):
            rel = nb.relative_to(fresh)
            target = ROOT / "notebooks" / rel
            new = nb.read_text(encoding="utf-8")
            old = target.read_text(encoding="utf-8") if target.exists() else ""
            if old != new:
                problems += [f"notebooks/{rel} differs from what nbgrader generates from solutions/{rel}"] + _diff(
                    old, new, f"notebooks/{rel}"
                )[:40]
                if not check:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(nb, target)
        stale = {
            p.relative_to(ROOT / "notebooks")
            for p in (ROOT / "notebooks").rglob("*.ipynb")
            if ".ipynb_checkpoints" not in p.parts
        }
        stale -= {p.relative_to(fresh) for p in fresh.rglob("*.ipynb")}
        problems += [f"notebooks/{rel} has no source in solutions/" for rel in sorted(stale)]
    return problems
