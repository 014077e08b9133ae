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


# One sitting: how long a learner who does the exercises needs for a notebook, estimated from the learner
# notebook's text. The rates are assumptions, not timings of learners (docs/instructors.md, "How long each
# notebook takes", gives the reasons):
# - reading: 150 words a minute. Brysbaert (2019, Journal of Memory and Language 109:104047), a meta-analysis
#   of 190 studies, puts adults' silent reading of English non-fiction at 238 wpm on average, most adults
#   between 175 and 300, and finds it slower for longer words and for readers of English as a second language;
#   it gives no rate for technical text. Carver (1992, Journal of Reading 36(2):84-95) gives college readers'
#   rates by purpose: about 200 wpm reading to learn, 138 reading to memorise. 150 sits between those two:
#   prose read to be learned and worked with, dense with numbers, formulas and code names, by many learners in
#   their second language.
# - an exercise: 8 minutes (read the task and the contract 1, decide and write the function 4, run the try cell
#   and the check and fix one slip 3); its graded cell and its hints cell are inside those minutes.
# - every other code cell: half a minute, to run it and read its output.
WORDS_PER_MINUTE = 150
MINUTES_PER_EXERCISE = 8
MINUTES_PER_CODE_CELL = 0.5
MAX_SITTING_MINUTES = 60
MAX_CELLS = 45  # every cell of the learner notebook, graded and hints cells included
MAX_WORDS = 1_600  # every markdown cell of the learner notebook
_EXERCISE_CELLS = ("checks-", "hints-")  # cell ids of an exercise's graded cell and hints cell


def sitting(notebook: Path) -> dict:
    """Cells, markdown words, exercises, code cells and the estimated minutes of one notebook (learner or solution).

    Every cell and every markdown word counts towards the limits; an exercise's graded and hints cells count in
    its minutes, not as code cells to read.
    """
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    words = sum(len("".join(c["source"]).split()) for c in cells if c["cell_type"] == "markdown")
    code = sum(c["cell_type"] == "code" for c in cells)
    read_code = sum(c["cell_type"] == "code" and not str(c.get("id", "")).startswith(_EXERCISE_CELLS) for c in cells)
    ids = {str(c.get("id", "")) for c in cells}
    exercises = sum(f"checks-{ex.id.replace('.', '-')}" in ids for ex in EXERCISES)  # graded here, not in a sibling
    reading, exercising, running = (
        words / WORDS_PER_MINUTE,
        MINUTES_PER_EXERCISE * exercises,
        MINUTES_PER_CODE_CELL * read_code,
    )
    return {
        "notebook": label(notebook),
        "cells": len(cells),
        "words": words,
        "exercises": exercises,
        "code_cells": code,
        "reading_minutes": round(reading),
        "exercise_minutes": exercising,
        "code_minutes": round(running),
        "minutes": round(reading + exercising + running),
    }


def part(notebook: Path) -> str:
    """A notebook's short name, as claims and `kvlib lab` spell it: "06" for a folder's only notebook, "02a" and
    "02b" for the first and second of a folder's two parts (in file-name order)."""
    siblings = sorted(notebook.parent.glob("*.ipynb"))
    number = notebook.parent.name.split("-")[0]
    return number if len(siblings) < 2 else number + "abcdefgh"[siblings.index(notebook)]


def label(notebook: Path, sep: str = "/") -> str:
    """A notebook's name in tables, test ids and file names: its folder ("01-attention"), or folder, sep, stem where
    the folder holds two parts of one notebook ("02-generation/layer": part 02b, graded in the same assignment)."""
    if len(list(notebook.parent.glob("*.ipynb"))) > 1:
        return f"{notebook.parent.name}{sep}{notebook.stem}"
    return notebook.parent.name


def learner_notebooks() -> list[Path]:
    """Every learner notebook (notebooks/NN-topic/*.ipynb), in course order: what the limits are counted on."""
    return [p for name in assignments() for p in sorted((ROOT / "notebooks" / name).glob("*.ipynb"))]


def sitting_table() -> str:
    """The estimate of every learner notebook as a markdown table (docs/instructors.md shows it)."""
    rows = [
        f"| notebook | cells (<= {MAX_CELLS}) | words (<= {MAX_WORDS:,}) | exercises | code cells "
        f"| reading min | exercise min | code min | minutes (<= {MAX_SITTING_MINUTES}) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for nb in learner_notebooks():
        s = sitting(nb)
        rows.append(
            f"| {s['notebook']} | {s['cells']} | {s['words']:,} | {s['exercises']} | {s['code_cells']} "
            f"| {s['reading_minutes']} | {s['exercise_minutes']} | {s['code_minutes']} | {s['minutes']} |"
        )
    return "\n".join(rows)


# nbgrader generate_assignment for many assignments in one process: the command line tool takes one
# assignment a run, and each run spends seconds importing nbgrader before a half-second conversion.
# The settings are those of `nbgrader generate_assignment NAME --no-db --force` (its --no-db and --force flags).
_GENERATE = """
import logging, sys
from traitlets.config.loader import PyFileConfigLoader
from nbgrader.converters import GenerateAssignment
from nbgrader.coursedir import CourseDirectory
logging.basicConfig(level=logging.WARNING)
root, dest, *names = sys.argv[1:]
for name in names:
    cfg = PyFileConfigLoader("nbgrader_config.py", path=root).load_config()  # as nbgrader reads the course's
    cfg.CourseDirectory.root, cfg.CourseDirectory.release_directory = root, dest
    cfg.CourseDirectory.assignment_id = name
    cfg.BaseConverter.force = True
    cfg.GenerateAssignment.no_database, cfg.SaveCells.enabled = True, False
    GenerateAssignment(coursedir=CourseDirectory(config=cfg), config=cfg).start()
"""


def _generate_notebooks(dest: Path) -> None:
    """Run nbgrader's generate_assignment for every assignment, writing into dest/<assignment>."""
    with tempfile.TemporaryDirectory() as tmp:
        # run from a scratch folder: nbgrader would otherwise leave gradebook.db in the repo
        cmd = [sys.executable, "-c", _GENERATE, str(ROOT), str(dest), *assignments()]
        proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"nbgrader generate_assignment failed:\n{proc.stdout}\n{proc.stderr}")


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
