"""The course's closing page (notebook 10c): what each notebook's claims said on this machine, read from its record.

Every notebook records its claims as it runs (kvlib.course.claims: the last verdict of each, per machine).
summary() gives one line per notebook part, whatever is recorded: its title and how its claims came out here (as the
course expected, not, or not decided), or that none is recorded yet and the command that records them. table() gives
every verdict's sentence, as a markdown table.
"""

from __future__ import annotations

import json
from pathlib import Path

from kvlib.app.release import part
from kvlib.core.paths import ROOT
from kvlib.course import claims, i18n
from kvlib.course.claims_table import CLAIMS

# a verdict against the course's expectation (Verdict.holds): True, False, or None when the run decided nothing
STATUS = {True: "as expected", False: "NOT as expected", None: "not decided"}


def titles(folder: Path = ROOT / "notebooks") -> dict[str, str]:
    """part ("07b") -> that notebook's title, its first heading without the number, in course order (folder: the
    English notebooks, or a language's: notebooks/zh-CN)."""
    out = {}
    for path in sorted(folder.glob("[0-9][0-9]-*/*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        lines = "".join(cells[0]["source"]).splitlines() if cells else []
        heading = next((ln for ln in lines if ln.startswith("# ")), "")  # a stale translation's note comes first
        out[part(path)] = heading.lstrip("# ").split("·", 1)[-1].strip()
    return dict(sorted(out.items()))


def status(record: dict) -> str:
    """A recorded verdict against the course's expectation: as expected, NOT as expected, or not decided."""
    return STATUS[(record["outcome"] == record["expect"]) if claims.DECIDED.get(record["outcome"]) else None]


def _said(status: str) -> str:
    """A status in the learner's language."""
    return {
        "as expected": i18n.tr("as expected"),
        "NOT as expected": i18n.tr("NOT as expected"),
        "not decided": i18n.tr("not decided"),
    }[status]


def summary(records: list[dict] | None = None, folder: Path = ROOT / "notebooks") -> str:
    """One line per notebook part (records: claims.load() unless given): how many of its claims came out as the
    course expected on this machine, or that none is recorded yet and how to record them, or that it declares none."""
    records = claims.load() if records is None else records
    found, lines, names = {r["id"]: r for r in records}, [], titles(folder)
    translated = titles(folder / i18n.language()) if i18n.language() != i18n.DEFAULT else {}
    names = {nb: translated.get(nb, title) for nb, title in names.items()}  # as the learner's notebooks title them
    width = max(map(i18n.display_width, names.values()), default=0)
    for nb, title in names.items():
        declared = [c.id for c in CLAIMS if c.notebook == nb]
        got = [status(found[i]) for i in declared if i in found]
        if not declared:
            verdict = i18n.tr("no claims declared")
        elif not got:
            verdict = i18n.tr("not recorded here yet: run it, or `kvlib course claims {nb}`", nb=nb)
        else:
            counts = [i18n.tr("{n} {status}", n=got.count(s), status=_said(s)) for s in STATUS.values() if got.count(s)]
            verdict = ", ".join(counts)
            if len(got) < len(declared):
                verdict += i18n.tr(" ({got} of its {declared} claims recorded)", got=len(got), declared=len(declared))
        lines.append(f"{nb:4s} {i18n.ljust(title, width)}  {verdict}")
    return "\n".join(lines)


def table(records: list[dict] | None = None) -> str:
    """Every recorded verdict as a markdown table: part, claim, how it came out, and its sentence (recorded in English,
    shown in the learner's language as the notebook printed it: kvlib.course.claims.Verdict.shown)."""
    records = claims.load() if records is None else records
    if not records:
        return i18n.tr("*No claim is recorded on this machine yet.*")
    rows = [i18n.tr("| part | claim | here | what the run printed |"), "|---|---|---|---|"]
    for r in records:
        name, text = r["id"].split(".", 1), i18n.translate(r["text"]).replace("|", "/")
        rows.append(f"| {name[0]} | {name[1]} | {_said(status(r))} | {text} |")
    return "\n".join(rows)
