"""How long a notebook takes a careful learner, by an estimate calibrated to careful readers, and where it is promised.

The estimate counts what a learner reads and does in a solution notebook, seen as the learner sees it: markdown
words, the docstring and hints of each exercise graded there, code lines, the lines its code cells print (recorded
from a reference run), each guess, each widget, and each exercise at its own size. A notebook's core ends with its
"Next" cell; an optional section after it opens with a "## Going further" heading and is counted apart.

  kvlib course plan                 each notebook's core and going-further minutes, each exercise's minutes
  kvlib course plan --record [NN]   run the solution notebooks and record the lines their code cells print
  kvlib course plan --calibration   the estimate of the notebooks the rates were calibrated on, beside the readers'
  kvlib course release              writes each notebook's header line (sync_headers) before making notebooks/

The rates and where they come from: below, and docs/instructors.md, "How long each notebook takes". The guide's
tables, the README's figure and the notebooks' header lines are printed by this module, and tests/test_sitting.py
holds them to it.
"""

from __future__ import annotations

import ast
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import textwrap
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

from kvlib.app.release import BEGIN, END, ROOT, assignments, label
from kvlib.course import hints
from kvlib.course.exercises import BY_ID, Exercise

# ---------------------------------------------------------------------------------------------
# The rates. Each is a careful learner's, who reads everything and works every exercise: the reading rates sit in
# the ranges issue 45 gives, and all were then fitted, with the exercise sizes, to the twelve timings of its two
# careful readers (CALIBRATION; `kvlib course plan --calibration` prints the estimate beside each).
# - prose: 140 words a minute, for markdown, docstrings and hints alike. Brysbaert (2019, Journal of Memory and
#   Language 109:104047), a meta-analysis of 190 studies, puts adults' silent reading of English non-fiction at 238
#   wpm, most adults between 175 and 300, slower for longer words and for readers of English as a second language;
#   Carver (1992, Journal of Reading 36(2):84-95) gives college readers about 200 wpm reading to learn and 138
#   reading to memorise. Notebooks dense with numbers, formulas and code names, read to be worked with, often in a
#   second language, go at the memorising rate (issue 45: 120-150).
# - code: 14 lines a minute (issue 45: 12-15), every non-blank line of the learner's code cells, hidden tests removed.
#   Reviewing code for defects is slower: SmartBear's "Best Practices for Code Review" (from its study of Cisco's
#   reviews) keeps inspection under 500 lines an hour, 8 a minute; a notebook's cells are read to follow them, not
#   to find faults in them.
# - printed output: 30 lines a minute, every line a code cell prints in the reference run (a row of a table read
#   and compared in 2 s); figures are not counted apart: the text beside each says what to see.
# - each guess ("**Your guess", a prediction written before the cell that measures it): 1.5 minutes; each widget
#   (a cell that calls interact): 3 minutes to move it and watch. Both are issue 45's figures.
# - each exercise: 5 minutes and one more per 17 tokens of its reference's solution (names, operators, numbers,
#   strings: Halstead's program length, which counts what is written where lines differ several-fold in length), in
#   5-30. That is deciding, writing, running the try cell and the check, and fixing a slip; the docstring and hints
#   are read at the prose rate. Two are stated: 1.1 and 7.4, sized by issue 45 at about 5 and 30 minutes (7.4's few
#   lines hold a contract of four invariants).
WORDS_PER_MINUTE = 140
CODE_LINES_PER_MINUTE = 14
PRINTED_LINES_PER_MINUTE = 30
MINUTES_PER_GUESS = 1.5
MINUTES_PER_WIDGET = 3
EXERCISE_MINUTES = (5, 30)  # the fewest and the most an exercise is given
EXERCISE_TOKENS_PER_MINUTE = 17  # past the first 5 minutes
STATED_EXERCISE_MINUTES = {"1.1": 5, "7.4": 30}  # as issue 45 sizes them

# The limits the tests hold every notebook (part) to: cells and words on the whole notebook, minutes on its core.
MAX_CORE_MINUTES = 60
MAX_CELLS = 45
MAX_WORDS = 1_600

# What the estimate reads in a notebook
GOING_FURTHER = re.compile(r"^#{2,3} Going further\b")  # the first line of the cell that opens the optional part
NEXT = re.compile(r"^(?:\*\*Next\b|#{2,3} Next\b)", re.M)  # a line of the cell that ends the core
GUESS = re.compile(r"\*\*Your guess\b")
WIDGET = re.compile(r"\binteract\(")
HEADER = re.compile(r"^\*\*Time:\*\* core about .*\n?", re.M)  # the generated line of a notebook's first cell
HIDDEN_TESTS = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS\n.*?^[ \t]*### END HIDDEN TESTS[ \t]*(?:\n|$)", re.M | re.S)
GUIDE_ANCHOR = "../../docs/instructors.md#how-long-each-notebook-takes"  # from notebooks/NN-topic/

RECORD = ROOT / "assets" / "sitting" / "outputs.json"  # printed lines of every code cell, from `--record`
CALIBRATION = ROOT / "assets" / "sitting" / "calibration.json"  # the careful readers' notebooks and their timings


# ---------------------------------------------------------------------------------------------
# Where the estimate reads the course: the working tree, or the files of one commit


@dataclass
class Tree:
    """The course's files: the working tree (revision None) or one git commit's; outputs holds the printed lines of
    its notebooks' code cells, {path under solutions/: {cell id: {"lines": n, "source": source_hash}}}."""

    revision: str | None = None
    outputs: dict = field(default_factory=dict)
    files: dict = field(default_factory=dict, repr=False)  # the files read so far (or given), by path under ROOT

    def read(self, rel: str) -> str:
        if rel not in self.files:
            if self.revision is None:
                self.files[rel] = (ROOT / rel).read_text(encoding="utf-8")
            else:
                cmd = ["git", "-C", str(ROOT), "show", f"{self.revision}:{rel}"]
                proc = subprocess.run(cmd, capture_output=True, text=True, encoding="utf-8")
                if proc.returncode != 0:
                    raise FileNotFoundError(
                        f"{rel} at commit {self.revision[:10]}: {proc.stderr.strip()} (the calibration reads the "
                        "notebooks it was fitted on from git history; a shallow clone lacks it: git fetch --unshallow)"
                    )
                self.files[rel] = proc.stdout
        return self.files[rel]


def load_record() -> dict:
    """The recorded printed lines of the working tree's notebooks ({} before the first `--record`)."""
    return json.loads(RECORD.read_text(encoding="utf-8"))["notebooks"] if RECORD.exists() else {}


def working_tree() -> Tree:
    return Tree(outputs=load_record())


def source_hash(source) -> str:
    """A code cell's fingerprint in the record: a changed cell is recorded again."""
    return hashlib.sha1("".join(source).encode("utf-8")).hexdigest()[:12]


def printed_lines(cell) -> int:
    """The lines a code cell printed in a run: its standard output, and the plain text of a result shown as text
    only (a figure, a widget or markdown has no lines: hints are counted from their files, widgets apart)."""
    streams, lines = [], 0
    for out in cell.get("outputs", []):
        if out["output_type"] == "stream" and out["name"] == "stdout":
            streams.append("".join(out["text"]))
        elif out["output_type"] in ("execute_result", "display_data") and set(out["data"]) == {"text/plain"}:
            lines += len("".join(out["data"]["text/plain"]).splitlines())
    return lines + len("".join(streams).splitlines())  # prints that share a line are one line


# ---------------------------------------------------------------------------------------------
# One exercise: what a learner reads of it, and its size


def _exercise_node(ex: Exercise, tree: Tree) -> tuple[ast.AST, list[str]]:
    """The reference's function (or method) of an exercise, and the lines of its module."""
    text = tree.read(f"solutions/kvlib/{ex.module}.py")
    node: ast.AST = ast.parse(text)
    for part in ex.name.split("."):
        found = [
            n for n in ast.iter_child_nodes(node) if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part
        ]
        if not found:
            raise ValueError(f"Exercise {ex.id}: no {ex.name} in solutions/kvlib/{ex.module}.py")
        node = found[0]
    return node, text.splitlines()


def exercise_words(ex: Exercise, tree: Tree) -> int:
    """The words of an exercise's docstring and of all its hints: read once, at the prose rate."""
    node, _ = _exercise_node(ex, tree)
    found = hints.parse(tree.read(f"kvlib/course/hints/{ex.module}.md"), Path(f"{ex.module}.md"))
    if ex.id not in found:
        raise ValueError(f"Exercise {ex.id} has no hints in kvlib/course/hints/{ex.module}.md")
    return len((ast.get_docstring(node) or "").split()) + sum(len(level.split()) for level in found[ex.id].levels)


def solution_tokens(ex: Exercise, tree: Tree) -> int:
    """The tokens of an exercise's solution block (names, operators, numbers, strings; not comments)."""
    node, lines = _exercise_node(ex, tree)
    body = lines[node.lineno - 1 : node.end_lineno + 1]  # the END marker, a comment, follows the last statement
    marks = [i for i, line in enumerate(body) if line.strip() in (BEGIN, END)]
    if len(marks) != 2:
        raise ValueError(f"Exercise {ex.id}: {ex.name} should hold one solution block, found {len(marks)} markers")
    block = textwrap.dedent("\n".join(body[marks[0] + 1 : marks[1]])) + "\n"
    kinds = (tokenize.NAME, tokenize.OP, tokenize.NUMBER, tokenize.STRING)
    return sum(t.type in kinds for t in tokenize.generate_tokens(io.StringIO(block).readline))


def exercise_minutes(ex: Exercise, tree: Tree) -> int:
    """An exercise's minutes: stated (STATED_EXERCISE_MINUTES), or 5 plus one a EXERCISE_TOKENS_PER_MINUTE tokens of
    its solution, within EXERCISE_MINUTES."""
    if ex.id in STATED_EXERCISE_MINUTES:
        return STATED_EXERCISE_MINUTES[ex.id]
    low, high = EXERCISE_MINUTES
    return min(high, max(low, round(low + solution_tokens(ex, tree) / EXERCISE_TOKENS_PER_MINUTE)))


# ---------------------------------------------------------------------------------------------
# One notebook: its core and its going-further part


@dataclass(frozen=True)
class Part:
    """What a learner reads and does in one part of a notebook: its core, or its going-further section."""

    words: int  # markdown words, the generated header line left out
    exercise_words: int  # docstrings and hints of the exercises graded in this part
    code_lines: int  # non-blank lines of code cells as the learner sees them (hidden tests removed, hints cells not)
    printed_lines: int  # lines those cells printed in the reference run
    guesses: int
    widgets: int
    exercises: tuple[tuple[str, int], ...]  # (exercise id, its minutes) of the exercises graded in this part

    @property
    def reading(self) -> float:
        return (self.words + self.exercise_words) / WORDS_PER_MINUTE

    @property
    def code(self) -> float:
        return self.code_lines / CODE_LINES_PER_MINUTE

    @property
    def printed(self) -> float:
        return self.printed_lines / PRINTED_LINES_PER_MINUTE

    @property
    def prompts(self) -> float:
        return self.guesses * MINUTES_PER_GUESS + self.widgets * MINUTES_PER_WIDGET

    @property
    def exercising(self) -> int:
        return sum(minutes for _, minutes in self.exercises)

    @property
    def minutes(self) -> float:
        return self.reading + self.code + self.printed + self.prompts + self.exercising


@dataclass(frozen=True)
class Sitting:
    notebook: str  # its label: "01-attention", "02-generation/layer"
    path: str  # under solutions/: "01-attention/attention.ipynb"
    cells: int  # every cell, graded and hints cells included (MAX_CELLS)
    words: int  # every markdown word but the header line's (MAX_WORDS)
    core: Part
    further: Part | None  # None where the notebook has no going-further section

    @property
    def minutes(self) -> float:
        return self.core.minutes + (self.further.minutes if self.further else 0)


def _text(cell: dict) -> str:
    return "".join(cell["source"])


def split(cells: list[dict]) -> tuple[list[dict], list[dict]]:
    """A notebook's cells as (core, going further): the optional part opens with a "## Going further" heading."""
    for i, cell in enumerate(cells):
        if cell["cell_type"] == "markdown" and GOING_FURTHER.match(_text(cell)):
            return cells[:i], cells[i:]
    return cells, []


def _words(cell: dict) -> int:
    return len(HEADER.sub("", _text(cell)).split())


def _exercise_of(cell: dict) -> Exercise | None:
    """The exercise a graded cell (id checks-X-Y) scores."""
    cell_id = str(cell.get("id", ""))
    return BY_ID.get(cell_id.removeprefix("checks-").replace("-", ".")) if cell_id.startswith("checks-") else None


def _part(cells: list[dict], path: str, tree: Tree) -> Part:
    markdown = [c for c in cells if c["cell_type"] == "markdown"]
    code = [c for c in cells if c["cell_type"] == "code" and not str(c.get("id", "")).startswith("hints-")]
    recorded = tree.outputs.get(path, {})
    stale = [c["id"] for c in code if recorded.get(c["id"], {}).get("source") != source_hash(c["source"])]
    if stale:
        where = "its record" if tree.revision else RECORD.relative_to(ROOT).as_posix()
        raise ValueError(
            f"{where} has no printed lines for the current cells {', '.join(stale)} of solutions/{path}: run "
            f"`kvlib course plan --record {path[:2]}` (it runs that notebook in reference mode)"
        )
    exercises = [ex for c in code if (ex := _exercise_of(c)) is not None]
    return Part(
        words=sum(_words(c) for c in markdown),
        exercise_words=sum(exercise_words(ex, tree) for ex in exercises),
        code_lines=sum(sum(1 for line in HIDDEN_TESTS.sub("", _text(c)).splitlines() if line.strip()) for c in code),
        printed_lines=sum(recorded[c["id"]]["lines"] for c in code),
        guesses=sum(len(GUESS.findall(_text(c))) for c in markdown),
        widgets=sum(bool(WIDGET.search(_text(c))) for c in code),
        exercises=tuple((ex.id, exercise_minutes(ex, tree)) for ex in exercises),
    )


def estimate(path: str, tree: Tree | None = None, name: str | None = None) -> Sitting:
    """The sitting of one solution notebook, path under solutions/ ("01-attention/attention.ipynb"); name is its label
    (the working tree's by default)."""
    tree = tree or working_tree()
    cells = json.loads(tree.read(f"solutions/{path}"))["cells"]
    core, further = split(cells)
    return Sitting(
        notebook=name or label(ROOT / "solutions" / path),
        path=path,
        cells=len(cells),
        words=sum(_words(c) for c in cells if c["cell_type"] == "markdown"),
        core=_part(core, path, tree),
        further=_part(further, path, tree) if further else None,
    )


def notebook_paths() -> list[str]:
    """Every solution notebook, in course order, as a path under solutions/."""
    return [f"{name}/{p.name}" for name in assignments() for p in sorted((ROOT / "solutions" / name).glob("*.ipynb"))]


def course() -> list[Sitting]:
    """The sitting of every notebook (part) of the working tree, in course order."""
    tree = working_tree()
    return [estimate(path, tree) for path in notebook_paths()]


def next_problem(cells: list[dict]) -> str | None:
    """Why a notebook is not laid out as its core, ending with the Next cell, then an optional going-further section
    that holds no graded cell; None where it is."""
    core, further = split(cells)
    if not core or core[-1]["cell_type"] != "markdown" or not NEXT.search(_text(core[-1])):
        return "its core does not end with the Next cell (a markdown cell with a line that starts **Next)"
    graded = [str(c.get("id")) for c in further if c.get("metadata", {}).get("nbgrader", {}).get("grade")]
    if graded:
        return f"its going-further section holds graded cells ({', '.join(graded)}): graded work belongs to the core"
    return None


# ---------------------------------------------------------------------------------------------
# Where the minutes are promised: `kvlib course plan`, the guide, the README, each notebook's first cell


def _m(minutes: float) -> str:
    return f"{round(minutes)}"


def plan_table(sittings: list[Sitting] | None = None) -> str:
    """Every notebook (part) as a markdown table: the limits, where the core's minutes go, each exercise's minutes, the
    core and the going-further minutes (`kvlib course plan` prints it, docs/instructors.md shows it)."""
    sittings = course() if sittings is None else sittings
    rows = [
        f"| notebook | cells (<= {MAX_CELLS}) | words (<= {MAX_WORDS:,}) | reading | code | printed | guesses, widgets "
        f"| exercises: minutes each | core min (<= {MAX_CORE_MINUTES}) | going further min |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in sittings:
        c = s.core
        exercises = ", ".join(f"{ex} {minutes}" for ex, minutes in c.exercises)
        rows.append(
            f"| {s.notebook} | {s.cells} | {s.words:,} | {_m(c.reading)} | {_m(c.code)} | {_m(c.printed)} "
            f"| {_m(c.prompts)} | {exercises} | {_m(c.minutes)} | {_m(s.further.minutes) if s.further else '-'} |"
        )
    return "\n".join(rows)


# A workshop's working time: what is left of it after the breaks
WORKSHOPS = (("90 minutes", 90), ("a half day (3 hours of work)", 180), ("a day (6 hours of work)", 360))


def workshop_plan(sittings: list[Sitting] | None = None) -> str:
    """Which notebooks' cores fit a workshop, from the start of the course, as markdown bullets."""
    sittings = course() if sittings is None else sittings
    lines = []
    for name, budget in WORKSHOPS:
        fits, used = [], 0
        for s in sittings:
            if used + round(s.core.minutes) > budget:
                break
            fits.append(f"{s.notebook} ({_m(s.core.minutes)})")
            used += round(s.core.minutes)
        what = ", ".join(fits) if fits else "no whole notebook"
        lines.append(f"- **{name}**: {what}; {used} of {budget} minutes.")
    core = sum(round(s.core.minutes) for s in sittings)
    further = sum(round(s.further.minutes) for s in sittings if s.further)
    lines.append(
        f"- **The whole course**: {core} minutes of core (about {core / 60:.0f} hours)"
        + (f" and {further} of going further." if further else "; no notebook has a going-further section yet.")
    )
    return "\n".join(lines)


def readme_figure(sittings: list[Sitting] | None = None) -> str:
    """The README's one phrase of minutes."""
    sittings = course() if sittings is None else sittings
    minutes = [round(s.core.minutes) for s in sittings]
    return f"{min(minutes)}-{max(minutes)} minutes a notebook (part), about {sum(minutes) / 60:.0f} hours in all"


def header_line(s: Sitting) -> str:
    """The line under a notebook's title that tells the learner its time."""
    further = f"; going further about {_m(s.further.minutes)}" if s.further else ""
    return f"**Time:** core about {_m(s.core.minutes)} minutes{further} ([estimated]({GUIDE_ANCHOR}) for a careful learner)."


def with_header(text: str, line: str) -> str:
    """A first cell's text with its header line set: replaced where it is, else put under the title."""
    if HEADER.search(text):
        return HEADER.sub(line + "\n", text, count=1)
    title, _, rest = text.partition("\n")
    return f"{title}\n\n{line}\n\n{rest.lstrip(chr(10))}"


def sync_headers(check: bool = False) -> list[str]:
    """Write each solution notebook's header line from the estimate (`kvlib course release` does, before making
    notebooks/). With check=True write nothing; returns one line per notebook whose header differs."""
    problems = []
    for s in course():
        path = ROOT / "solutions" / s.path
        nb = json.loads(path.read_text(encoding="utf-8"))
        old = _text(nb["cells"][0])
        new = with_header(old, header_line(s))
        if new != old:
            problems.append(f"solutions/{s.path}: its header line is not the estimate's: {header_line(s)}")
            if not check:
                nb["cells"][0]["source"] = new.splitlines(keepends=True)
                path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return problems


# ---------------------------------------------------------------------------------------------
# The calibration: the notebooks the careful readers timed, read from git at the commit they timed


def calibration() -> list[tuple[Sitting, int]]:
    """Each notebook the careful readers timed, estimated as it was then, beside their minutes."""
    data = json.loads(CALIBRATION.read_text(encoding="utf-8"))
    tree = Tree(revision=data["revision"], outputs={n["path"]: n["outputs"] for n in data["notebooks"].values()})
    return [(estimate(n["path"], tree, name), n["minutes"]) for name, n in data["notebooks"].items()]


def calibration_table(rows: list[tuple[Sitting, int]] | None = None) -> str:
    """The estimate against the careful readers, as a markdown table (docs/instructors.md shows it)."""
    rows = calibration() if rows is None else rows
    lines = ["| notebook | careful readers | estimate | estimate / readers |", "|---|---|---|---|"]
    lines += [f"| {s.notebook} | {t} | {_m(s.minutes)} | {s.minutes / t:.2f} |" for s, t in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# The record of printed lines


def record_outputs(selector: str | None = None, out=sys.stdout) -> dict:
    """Run the solution notebooks (all, or one notebook number) in reference mode, on the CPU as most learners do
    (CUDA_VISIBLE_DEVICES empty: 05 and 06 then show their GPU recordings), and record the lines each code cell prints
    into RECORD, notebook by notebook; notebooks that are gone are dropped from it. A notebook that fails raises
    RuntimeError, and nothing of it is recorded."""
    from kvlib.app.lab import run_notebook, solution_notebooks  # noqa: PLC0415 (start-up time: only --record runs notebooks)

    record = {rel: cells for rel, cells in load_record().items() if rel in notebook_paths()}
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the notebook's kernel inherits it
    try:
        for nb_path in solution_notebooks(selector):
            rel = nb_path.relative_to(ROOT / "solutions").as_posix()
            run = run_notebook(nb_path)
            if run.error:
                raise RuntimeError(f"solutions/{rel} failed in reference mode, nothing recorded for it: {run.error}")
            cells = [c for c in run.notebook.cells if c.cell_type == "code"]
            record[rel] = {c.id: {"lines": printed_lines(c), "source": source_hash(c.source)} for c in cells}
            _write_record({path: record[path] for path in notebook_paths() if path in record})
            lines = sum(printed_lines(c) for c in cells)
            print(f"solutions/{rel}: {lines} printed lines, recorded ({run.seconds:.1f} s)", file=out, flush=True)
    finally:
        if before is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before
    return record


def _write_record(notebooks: dict) -> None:
    about = (
        "The lines each code cell of the solution notebooks prints, from a reference run on the CPU "
        "(`kvlib course plan --record`); kvlib/app/sitting.py reads them, tests/test_notebooks.py checks them."
    )
    RECORD.parent.mkdir(parents=True, exist_ok=True)
    RECORD.write_text(json.dumps({"about": about, "notebooks": notebooks}, indent=1) + "\n", encoding="utf-8")
