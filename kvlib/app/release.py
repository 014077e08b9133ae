"""The course's own build: learner stubs and learner notebooks, both generated from solutions/.

  solutions/kvlib/<module>.py   -> kvlib/<module>.py          (solution blocks become a raise, or a shipped bug)
  solutions/NN-topic/*.ipynb    -> notebooks/NN-topic/*.ipynb (nbgrader generate_assignment)
  kvlib/course/hints/*.md       -> each exercise's collapsed hints block in solutions/NN-topic/*.ipynb
  kvlib/app/sitting.py          -> each notebook's header line, its minutes (written first, by the CLI)
`kvlib course release` rewrites both; `--check` only reports what differs (the tests use it). Another language's
notebooks (notebooks/<lang>/, from kvlib/app/translate.py's solutions/<lang>/) are made in the same nbgrader run.
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
from kvlib.course import hints, i18n
from kvlib.course.exercises import BY_ID, EXERCISES

_DECORATOR = re.compile(r'^\s*@exercise\("(\d+\.\d+)"')
# spelled in parts, so that a search for leaked solution blocks never flags this file (nor its bytecode: Python folds
# "a" + "b" into one constant, not a call of format)
BEGIN, END = "### {} SOLUTION".format("BEGIN"), "### {} SOLUTION".format("END")
SHIP_BEGIN, SHIP_END = "### BEGIN " + "SHIPPED", "### END " + "SHIPPED"


def stub_source(solution: str, answered=frozenset()) -> str:
    """The learner's version of a solution module: each solution block replaced by a raise, or, for a find-and-fix
    exercise (kind "fix" in kvlib.course.exercises), by its broken body. The exercises whose ids are in answered keep
    their solution instead (a learner part-way through: the tests' learner copies).

    A find-and-fix exercise's solution block is followed at once by its shipped block (SHIP_BEGIN ... SHIP_END),
    the broken body commented out line by line with one "# " after the body's indent, so that the reference module
    runs the right body alone: a solution block holding `return x.sum(-1)` followed by a shipped block holding
    `# return x.sum(0)` gives a stub holding `return x.sum(0)` (tests/test_course.py has the whole example)."""
    out, current, state, block = [], None, None, {}  # state: None, "solution", "after" (its END seen), "shipped"
    for number, line in enumerate(solution.splitlines(keepends=True), 1):
        text = line.strip()
        if state == "after" and text != SHIP_BEGIN:  # a solution block without a shipped one: the raise
            _close(current, block, out, False, answered)
            state, current = None, None
        if m := _DECORATOR.match(line):
            current = BY_ID[m.group(1)]
        if text == BEGIN:
            if current is None:
                raise ValueError(f"line {number}: a solution block outside an @exercise function: {line!r}")
            block = {"indent": line[: len(line) - len(line.lstrip())], "shipped": [], "solution": []}
            state = "solution"
        elif text == END:
            if state != "solution":
                raise ValueError(f"line {number}: {END} without its {BEGIN}")
            state = "after"
        elif text == SHIP_BEGIN:
            if state != "after":
                raise ValueError(f"line {number}: a shipped block must follow its exercise's {END} at once")
            state = "shipped"
        elif text == SHIP_END:
            if state != "shipped":
                raise ValueError(f"line {number}: {SHIP_END} without its {SHIP_BEGIN}")
            _close(current, block, out, True, answered)
            state, current = None, None
        elif state == "shipped":
            indent = block["indent"]
            if line.strip() and not line.startswith(indent + "# ") and line.rstrip("\n") != indent + "#":
                raise ValueError(f"line {number}: a shipped line is commented with {indent + '# '!r}: {line!r}")
            block["shipped"].append(line.replace(indent + "# ", indent, 1) if line.strip() != "#" else "\n")
        elif state == "solution":
            block["solution"].append(line)
        elif state is None:
            out.append(line)
    if state == "after":
        _close(current, block, out, False, answered)
    elif state is not None:
        raise ValueError(f"a {state} block without its {END if state == 'solution' else SHIP_END}")
    return "".join(out)


def _close(ex, block: dict, out: list[str], shipped: bool, answered) -> None:
    """Write what stands in the stub for an exercise's solution block: its shipped body, or the raise (its solution
    where the exercise is answered)."""
    if shipped != (ex.kind == "fix"):
        say = "has a shipped block" if shipped else "has no shipped block"
        raise ValueError(f"Exercise {ex.id} {say}, and its kind is {ex.kind!r} (only a 'fix' exercise ships a body)")
    if ex.id in answered:
        out += block["solution"]
    elif shipped:
        out += block["shipped"]
    else:
        out.append(
            f'{block["indent"]}raise NotImplementedError("Exercise {ex.id} (notebooks/{ex.notebook}): {ex.name}")\n'
        )


def solution_modules() -> list[Path]:
    return sorted((ROOT / "solutions" / "kvlib").glob("*.py"))


def assignments() -> list[str]:
    """Notebook folders under solutions/ (every folder but kvlib)."""
    return sorted(p.name for p in (ROOT / "solutions").iterdir() if p.is_dir() and p.name[:2].isdigit())


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


# nbgrader generate_assignment for many assignments in one process: the command line tool takes one
# assignment a run, and each run spends seconds importing nbgrader before a half-second conversion.
# The settings are those of `nbgrader generate_assignment NAME --no-db --force` (its --no-db and --force flags);
# each job is [source folder, release folder, assignment] (an absolute source folder replaces the course's).
_GENERATE = """
import json, logging, sys
from traitlets.config.loader import PyFileConfigLoader
from nbgrader.converters import GenerateAssignment
from nbgrader.coursedir import CourseDirectory
logging.basicConfig(level=logging.WARNING)
root, jobs = sys.argv[1], json.loads(sys.argv[2])
for source, dest, name in jobs:
    cfg = PyFileConfigLoader("nbgrader_config.py", path=root).load_config()  # as nbgrader reads the course's
    cfg.CourseDirectory.root, cfg.CourseDirectory.release_directory = root, dest
    cfg.CourseDirectory.source_directory = source
    cfg.CourseDirectory.assignment_id = name
    cfg.BaseConverter.force = True
    cfg.GenerateAssignment.no_database, cfg.SaveCells.enabled = True, False
    GenerateAssignment(coursedir=CourseDirectory(config=cfg), config=cfg).start()
"""


def _generate_notebooks(dest: Path, translations=()) -> None:
    """Run nbgrader's generate_assignment for every assignment, writing into dest/<assignment>, and for each
    (source folder, lang, assignments) of translations into dest/<lang>/<assignment>."""
    jobs = [["solutions", str(dest), name] for name in assignments()]
    jobs += [[str(source), str(dest / lang), name] for source, lang, names in translations for name in names]
    with tempfile.TemporaryDirectory() as tmp:
        # run from a scratch folder: nbgrader would otherwise leave gradebook.db in the repo
        cmd = [sys.executable, "-c", _GENERATE, str(ROOT), json.dumps(jobs)]
        proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"nbgrader generate_assignment failed:\n{proc.stdout}\n{proc.stderr}")


def _diff(old: str, new: str, name: str) -> list[str]:
    return list(
        difflib.unified_diff(
            old.splitlines(), new.splitlines(), f"{name} (committed)", f"{name} (generated)", lineterm="", n=1
        )
    )


def release(check: bool = False, translations=()) -> list[str]:
    """Regenerate kvlib/ stubs and notebooks/ from solutions/. With check=True write nothing and
    return the differences (an empty list means the release is up to date).

    translations: (source folder, lang, assignments) of translated solution notebooks (kvlib.app.translate.release
    gives them), generated into notebooks/<lang>/ too; without them notebooks/<lang>/ is left as it is."""
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
        _generate_notebooks(fresh, translations)
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
        # notebooks/<lang>/ is compared when its translations were built here, else left alone
        others = set(i18n.LANGUAGES) - {lang for _, lang, _ in translations}
        stale = {
            rel
            for p in (ROOT / "notebooks").rglob("*.ipynb")
            if ".ipynb_checkpoints" not in p.parts and (rel := p.relative_to(ROOT / "notebooks")).parts[0] not in others
        }
        stale -= {p.relative_to(fresh) for p in fresh.rglob("*.ipynb")}
        problems += [f"notebooks/{rel} has no source in solutions/" for rel in sorted(stale)]
    return problems
