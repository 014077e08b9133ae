"""Every notebook is one sitting: at most 45 cells, 1,600 markdown words and 60 minutes by the estimate in
kvlib.app.release.sitting, counted on the learner notebook, and each links the bilingual glossary from its first
cell."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT

from kvlib.app import release

NOTEBOOKS = [p for name in release.assignments() for p in sorted((ROOT / "solutions" / name).glob("*.ipynb"))]
LEARNER = release.learner_notebooks()


@pytest.mark.parametrize("path", LEARNER, ids=release.label)
def test_notebook_is_one_sitting(path):
    """Check that a learner notebook has at most 45 cells and 1,600 markdown words."""
    s = release.sitting(path)
    assert s["cells"] <= release.MAX_CELLS, f"{s['notebook']} has {s['cells']} cells, more than {release.MAX_CELLS}"
    assert s["words"] <= release.MAX_WORDS, (
        f"{s['notebook']} has {s['words']:,} words of markdown, more than {release.MAX_WORDS:,}"
    )


@pytest.mark.parametrize("path", LEARNER, ids=release.label)
def test_notebook_takes_an_hour_or_less(path):
    """Check that a learner notebook takes an estimated 60 minutes or less."""
    s = release.sitting(path)
    assert s["minutes"] <= release.MAX_SITTING_MINUTES, (
        f"{s['notebook']} takes about {s['minutes']} minutes ({s['reading_minutes']} reading {s['words']} words, "
        f"{s['exercise_minutes']} for {s['exercises']} exercises, {s['code_minutes']} running code cells), "
        f"more than {release.MAX_SITTING_MINUTES}"
    )


def test_every_notebook_has_its_learner_version():
    """Check that the limits are counted on a learner notebook for every solution notebook."""
    assert [p.relative_to(ROOT / "notebooks") for p in LEARNER] == [
        p.relative_to(ROOT / "solutions") for p in NOTEBOOKS
    ]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=release.label)
def test_notebook_links_the_glossary(path):
    """Check that a notebook's first cell links docs/glossary.md, and the link resolves from notebooks/."""
    first = "".join(json.loads(path.read_text(encoding="utf-8"))["cells"][0]["source"])
    assert "../../docs/glossary.md" in first, f"{path.parent.name}'s first cell does not link ../../docs/glossary.md"
    assert (ROOT / "notebooks" / path.parent.name / "../../docs/glossary.md").resolve().is_file()


def test_sitting_counts_what_it_says():
    """Check that the estimate of a made-up notebook counts every cell and markdown word, and gives an exercise's
    graded and hints cells no code-cell minutes: 300 words, 1 exercise graded in it, 4 code cells of which 2 read.
    """
    import tempfile
    from pathlib import Path

    code = lambda cell_id: {"cell_type": "code", "id": cell_id, "source": ["1"]}  # noqa: E731
    nb = {
        "cells": [
            {"cell_type": "markdown", "id": "a", "source": ["word " * 200]},
            {"cell_type": "markdown", "id": "b", "source": ["word\n" * 100]},
            code("try"),
            code("plot"),
            code("hints-1-1"),
            code("checks-1-1"),
        ]
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "01-attention" / "x.ipynb"
        path.parent.mkdir()
        path.write_text(json.dumps(nb), encoding="utf-8")
        s = release.sitting(path)
    exercises = 1  # the exercises graded in this notebook: checks-1-1, not the folder's others
    assert (s["cells"], s["words"], s["code_cells"], s["exercises"]) == (6, 300, 4, exercises)
    assert s["minutes"] == round(300 / 150 + 8 * exercises + 0.5 * 2)
    assert (s["reading_minutes"], s["exercise_minutes"], s["code_minutes"]) == (2, 8 * exercises, 1)


def test_sitting_table_has_a_row_per_learner_notebook_with_the_limits():
    """Check that the generated table names the limits in its header and gives every learner notebook a row."""
    table = release.sitting_table().splitlines()
    assert f"cells (<= {release.MAX_CELLS})" in table[0] and f"words (<= {release.MAX_WORDS:,})" in table[0]
    assert [row.split(" | ")[0].strip("| ") for row in table[2:]] == [release.label(p) for p in LEARNER]


def test_instructor_guide_shows_the_current_estimates():
    """Check that docs/instructors.md's table of sittings is the one the notebooks give today."""
    guide = (ROOT / "docs" / "instructors.md").read_text(encoding="utf-8")
    assert release.sitting_table() in guide, (
        "docs/instructors.md's sitting table is stale: paste the output of "
        'python -c "from kvlib.app.release import sitting_table; print(sitting_table())"'
    )
