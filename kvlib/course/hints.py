"""Hints on demand: `kvlib hint X.Y` shows the next level of one exercise's hints, only when asked.

One file per learner module, kvlib/course/hints/<module>.md (shipped as package data):

    # Hints for kvlib/<module>.py (notebook NN)

    ## X.Y Exercise title
    1. A question that points at the idea (a nudge).
    2. The idea or the invariant.
    3. The last step: the function or equation to use; it may give code (issue 46), never a line of the reference.

At least three levels per exercise, never a line of the reference. A hint may run over several
lines (continuation lines indented). The levels a learner has seen are remembered in one small
JSON file, $XDG_CACHE_HOME/kvlib/hints.json (~/.cache/kvlib/hints.json by default), so each
`kvlib hint X.Y` shows the next one. The notebooks show the same text, folded level by level, from
a cell after each exercise's task that calls show_hints (`kvlib course release` puts it there). Hints never
change points: nothing here is read by a check or the grader.

In another language (KVLIB_LANG, kvlib.course.i18n) the hints come from locale/<lang>/hints/<module>.md, the same
format, each section's title ending in `<!-- sha256:... -->`, the hash of the English section it translates
(section_hash). A section whose English has changed since is stale: the English hints show instead, with a line
that says so, until it is translated again (tests/test_translations.py names it).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

from kvlib.core.paths import ROOT
from kvlib.course import i18n
from kvlib.course.exercises import BY_ID, EXERCISES, Exercise

HINTS_DIR = Path(__file__).resolve().parent / "hints"
MIN_LEVELS = 3

_TITLE = re.compile(r"^# Hints for kvlib/(\w+)\.py \(notebook (\d\d)\)\s*$")
_ITEM = re.compile(r"^(\d+)\. (\S.*)$")


class HintFileError(ValueError):
    """A hint file that does not follow the format, or leaves an exercise without enough hints."""


@dataclass(frozen=True)
class Hints:
    exercise: Exercise
    title: str  # as the file spells it (the exercise table's title, normally)
    levels: tuple[str, ...]  # level 1 first; each one hint, its lines joined by "\n"
    file: Path


# ---------------------------------------------------------------------------------------------
# Reading and validating the files


def parse(text: str, file: Path) -> dict[str, Hints]:
    """The hints of one file, by exercise id; HintFileError names the file, the line and the problem."""
    lines = text.splitlines()
    name = file.name
    if not lines or not (head := _TITLE.match(lines[0])):
        raise HintFileError(f"{name} line 1: expected '# Hints for kvlib/<module>.py (notebook NN)', got {lines[:1]}")
    module, notebook = head.groups()
    if file.stem != module:
        raise HintFileError(f"{name} line 1: the title names kvlib/{module}.py, but the file is {name}")
    found: dict[str, Hints] = {}
    current: tuple[Exercise, str, list[str]] | None = None

    def close():
        if current is not None:
            ex, title, items = current
            found[ex.id] = Hints(ex, title, tuple(items), file)

    for n, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        if sec := i18n.HINT_SECTION.match(line):
            close()
            ex_id, title = sec.groups()
            ex = BY_ID.get(ex_id)
            if ex is None:
                raise HintFileError(f"{name} line {n}: exercise {ex_id} is not in the exercise table")
            if ex.module != module or not ex.notebook.startswith(notebook):
                raise HintFileError(
                    f"{name} line {n}: exercise {ex_id} is in kvlib/{ex.module}.py (notebook {ex.notebook}), "
                    f"not in kvlib/{module}.py (notebook {notebook})"
                )
            if ex_id in found:
                raise HintFileError(f"{name} line {n}: exercise {ex_id} has two sections")
            current = (ex, title, [])
        elif item := _ITEM.match(line):
            if current is None:
                raise HintFileError(f"{name} line {n}: a hint before the first '## X.Y Title' section")
            number, body = item.groups()
            expected = len(current[2]) + 1
            if int(number) != expected:
                raise HintFileError(f"{name} line {n}: exercise {current[0].id}'s hint {number} should be {expected}")
            current[2].append(body)
        elif line.startswith("   ") and current is not None and current[2]:
            current[2][-1] += "\n" + line.strip()  # a hint that runs over several lines
        else:
            raise HintFileError(
                f"{name} line {n}: expected '## X.Y Title', '1. hint' or an indented line, got {line!r}"
            )
    close()
    return found


def hint_files(folder: Path | None = None) -> list[Path]:
    return sorted((folder or HINTS_DIR).glob("*.md"))


def load(folder: Path | None = None) -> dict[str, Hints]:
    """Every hint file, validated: each exercise of the table has at least MIN_LEVELS hints."""
    folder = folder or HINTS_DIR
    found: dict[str, Hints] = {}
    for file in hint_files(folder):
        found.update(parse(file.read_text(encoding="utf-8"), file))
    for ex in EXERCISES:
        file = folder / f"{ex.module}.md"
        if ex.id not in found:
            where = (
                f"{file.name} has no section '## {ex.id} {ex.title}'" if file.exists() else f"{file.name} is missing"
            )
            raise HintFileError(f"Exercise {ex.id} ({ex.title}) has no hints: {where}")
        if len(found[ex.id].levels) < MIN_LEVELS:
            raise HintFileError(
                f"{file.name}: exercise {ex.id} ({ex.title}) has {len(found[ex.id].levels)} hint(s); "
                f"every exercise needs at least {MIN_LEVELS} (a nudge, the idea, the last step short of code)"
            )
    return found


def hints_for(exercise_id: str) -> Hints:
    if exercise_id not in BY_ID:
        known = ", ".join(ex.id for ex in EXERCISES)
        raise ValueError(f"no exercise {exercise_id!r}; exercises are {known}")
    return load()[exercise_id]


def stuck(exercise_id: str) -> str:
    """The ending of a failing check's message: where the hints are."""
    return i18n.tr("(stuck? kvlib hint {id})", id=exercise_id)


# ---------------------------------------------------------------------------------------------
# Translated hints: locale/<lang>/hints/<module>.md, each section marked with the English one's hash


def section_hash(h: Hints) -> str:
    """The hash a translation of this (English) section carries: its title and every level, as the file has them."""
    text = h.title + "\n" + "\n".join(_item(i, t) for i, t in enumerate(h.levels, start=1))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def translation_dir(lang: str) -> Path:
    return i18n.LOCALE_DIR / lang / "hints"


def read_translations(lang: str, folder: Path | None = None) -> dict[str, tuple[Hints, str | None]]:
    """Every translated section of a language, by exercise id: (the hints with the marker cut from the title, the
    English hash the section carries, None where it has no marker). HintFileError as load() raises it."""
    found = {}
    for file in hint_files(folder or translation_dir(lang)):
        for ex_id, h in parse(file.read_text(encoding="utf-8"), file).items():
            m = i18n.TRANSLATION_MARK.match(h.title)
            found[ex_id] = (replace(h, title=m.group(1)) if m else h, m.group(2) if m else None)
    return found


def translation_status(lang: str, english: dict[str, Hints] | None = None) -> dict[str, str]:
    """Each exercise's hints in `lang`: "fresh" (translated from today's English, as many levels), "stale"
    (translated from other English, or with another number of levels, or without a hash), or "missing"."""
    english = english or load()
    done = read_translations(lang)
    status = {}
    for ex in EXERCISES:
        if ex.id not in done:
            status[ex.id] = "missing"
            continue
        h, sha = done[ex.id]
        fresh = sha == section_hash(english[ex.id]) and len(h.levels) == len(english[ex.id].levels)
        status[ex.id] = "fresh" if fresh else "stale"
    return status


@functools.lru_cache(maxsize=None)
def _fresh(lang: str) -> dict[str, Hints]:
    english = load()
    done = read_translations(lang)
    return {ex_id: done[ex_id][0] for ex_id, s in translation_status(lang, english).items() if s == "fresh"}


def in_language(exercise_id: str) -> tuple[Hints, bool]:
    """An exercise's hints in the learner's language where a fresh translation exists, else the English:
    (hints, translated)."""
    lang = i18n.language()
    if lang != i18n.DEFAULT and exercise_id in (fresh := _fresh(lang)):
        return fresh[exercise_id], True
    return hints_for(exercise_id), False


def exercise_title(ex: Exercise) -> str:
    """An exercise's title in the learner's language (its translated hints' section title), else the table's."""
    h, translated = in_language(ex.id)
    return h.title if translated else ex.title


def _untranslated_note(translated: bool) -> str:
    """A line before English hints shown to a learner of another language; "" when none is needed."""
    if translated or i18n.language() == i18n.DEFAULT:
        return ""
    return i18n.tr("(These hints are not translated yet: the English follows.)") + "\n\n"


# ---------------------------------------------------------------------------------------------
# Which level a learner has seen


def state_file() -> Path:
    """$XDG_CACHE_HOME/kvlib/hints.json, or ~/.cache/kvlib/hints.json: the last level shown per exercise, kept
    per course folder ({folder: {exercise id: level}}), so two clones of the course do not share it."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "kvlib" / "hints.json"


def _read_all() -> dict[str, dict[str, int]]:
    """Every course folder's levels; what is not a folder's table (the flat form of earlier versions) is
    left out."""
    try:
        state = json.loads(state_file().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # no file yet, or one we cannot read: start from level 1
    if not isinstance(state, dict):
        return {}
    return {
        folder: {k: v for k, v in levels.items() if isinstance(v, int)}
        for folder, levels in state.items()
        if isinstance(levels, dict)
    }


def _read_state() -> dict[str, int]:
    return _read_all().get(str(ROOT), {})


def _write_state(state: dict[str, int]) -> None:
    everything = _read_all() | {str(ROOT): state}
    path = state_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(everything, indent=1, sort_keys=True), encoding="utf-8")


def reset(exercise_id: str | None = None) -> None:
    """Forget the levels seen: of one exercise, or (None) of all."""
    state = _read_state()
    if exercise_id is None:
        state = {}
    else:
        hints_for(exercise_id)  # names an unknown id
        state.pop(exercise_id, None)
    _write_state(state)


def show(exercise_id: str, level: int | None = None) -> str:
    """The text `kvlib hint` prints: the next hint of an exercise (or hint `level`), and how many are left.

    Without level, each call moves one level on and remembers it; with level, that hint is shown
    and remembered as the last one seen. Past the last level it says so and shows the last one again.
    """
    hints, translated = in_language(exercise_id)
    note = _untranslated_note(translated)
    n = len(hints.levels)
    state = _read_state()
    if level is None:
        seen = state.get(exercise_id, 0)
        if seen >= n:
            return note + i18n.tr(
                "Exercise {id} ({title}): no more hints, all {n} shown. The last one:\n\n{hint}\n\n"
                "Start again with: kvlib hint {id} --reset",
                id=exercise_id,
                title=hints.title if translated else hints.exercise.title,
                n=n,
                hint=_item(n, hints.levels[-1]),
            )
        level = seen + 1
    elif not 1 <= level <= n:
        raise ValueError(f"exercise {exercise_id} has hints 1 to {n}, not {level}")
    state[exercise_id] = level
    _write_state(state)
    more = i18n.tr("next: kvlib hint {id}", id=exercise_id) if level < n else i18n.tr("that was the last hint")
    return note + i18n.tr(
        "Exercise {id} ({title}), hint {level} of {n} ({name} in {file}):\n\n{hint}\n\n({more})",
        id=exercise_id,
        title=hints.title if translated else hints.exercise.title,
        level=level,
        n=n,
        name=hints.exercise.name,
        file=hints.exercise.file,
        hint=_item(level, hints.levels[level - 1]),
        more=more,
    )


def _item(level: int, text: str) -> str:
    """One hint as the file writes it: "N. " then its lines, continuation lines indented."""
    return f"{level}. " + text.replace("\n", "\n   ")


# ---------------------------------------------------------------------------------------------
# The collapsed block in the notebooks


def notebook_block(exercise_id: str, hints: dict[str, Hints] | None = None) -> str:
    """Markdown of an exercise's hints as a notebook shows them: folded, and each level folded again,
    so a learner opens one at a time."""
    h, translated = (hints[exercise_id], False) if hints else in_language(exercise_id)
    n = len(h.levels)
    items = "\n\n".join(
        f"<details><summary>{i18n.tr('Hint {i} of {n}', i=i, n=n)}</summary>\n\n{_item(i, text)}\n\n</details>"
        for i, text in enumerate(h.levels, start=1)
    )
    summary = i18n.tr("Hints (kvlib hint {id})", id=exercise_id)
    note = _untranslated_note(translated)
    return f"<details><summary>{summary}</summary>\n\n{note}{items}\n\n</details>"


def show_hints(exercise_id: str):
    """Show an exercise's hints in a notebook, folded level by level (the cell after each task calls it)."""
    from IPython.display import Markdown  # noqa: PLC0415 (start-up time: `kvlib hint` needs no IPython)

    return Markdown(notebook_block(exercise_id))


def hints_cell_source(exercise_id: str) -> str:
    """The code of the cell after an exercise's task: running it shows the hints, folded."""
    return f'from kvlib.course.hints import show_hints\n\nshow_hints("{exercise_id}")  # hints on demand: open one at a time'


def task_cell_id(exercise_id: str) -> str:
    return "ex" + exercise_id.replace(".", "-")  # the nbgrader grade_id of an exercise's task markdown


def hint_cell_id(exercise_id: str) -> str:
    return "hints-" + exercise_id.replace(".", "-")


def sync_notebook(nb: dict, hints: dict[str, Hints] | None = None) -> list[str]:
    """Put each exercise's hints cell right after its task cell (in place); return the ids changed.

    nb is a notebook as parsed JSON. A task cell is the markdown cell whose nbgrader grade_id is
    "exN-M"; the hints cell is a locked code cell with grade_id "hints-N-M" that calls show_hints, so
    its text comes from the hint file when it runs, and no hint is read in passing.
    """
    hints = hints or load()  # validates the files: every exercise has its levels
    changed = []
    cells = nb["cells"]
    for ex in EXERCISES:
        task = next((i for i, c in enumerate(cells) if _grade_id(c) == task_cell_id(ex.id)), None)
        if task is None:
            continue
        text = hints_cell_source(ex.id)
        old = next((i for i, c in enumerate(cells) if _grade_id(c) == hint_cell_id(ex.id)), None)
        if old is not None and old == task + 1 and _is_hints_cell(cells[old], text):
            continue
        if old is not None:
            del cells[old]
            task = task - 1 if old < task else task
        cells.insert(task + 1, _hint_cell(ex.id, text))
        changed.append(ex.id)
    return changed


def _is_hints_cell(cell: dict, text: str) -> bool:
    return cell["cell_type"] == "code" and "".join(cell["source"]) == text


def _grade_id(cell: dict) -> str | None:
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


def _hint_cell(exercise_id: str, text: str) -> dict:
    meta = {
        "grade": False,
        "grade_id": hint_cell_id(exercise_id),
        "locked": True,
        "schema_version": 3,
        "solution": False,
        "task": False,
    }
    lines = text.splitlines(keepends=True)
    return {
        "cell_type": "code",
        "execution_count": None,
        "id": hint_cell_id(exercise_id),
        "metadata": {"nbgrader": meta},
        "outputs": [],
        "source": lines,
    }


def sync_solution_notebooks(check: bool = False) -> list[str]:
    """Write every exercise's hints block into the solution notebooks (solutions/NN-*/*.ipynb).

    `kvlib course release` calls it before generating notebooks/, so the hint files are the one
    source of the blocks. With check=True nothing is written; returns one line per notebook that
    differs (an empty list: the blocks match the files).
    """
    hints = load()
    problems = []
    for path in sorted((ROOT / "solutions").glob("[0-9][0-9]-*/*.ipynb")):
        text = path.read_text(encoding="utf-8")
        nb = json.loads(text)
        changed = sync_notebook(nb, hints)
        if changed:
            problems.append(
                f"{path.relative_to(ROOT)}: the hints blocks of {', '.join(changed)} differ from the hint files"
            )
            if not check:
                path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return problems
