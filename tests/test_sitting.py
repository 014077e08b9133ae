"""Every notebook is one sitting: at most 60 cells and 60 minutes by the estimate in
kvlib.app.release.sitting, and each links the bilingual glossary from its first cell."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT

from kvlib.app import release

NOTEBOOKS = [p for name in release.assignments() for p in sorted((ROOT / "solutions" / name).glob("*.ipynb"))]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.parent.name)
def test_notebook_is_one_sitting(path):
    """Check that a notebook has at most 60 cells and an estimated 60 minutes or less."""
    s = release.sitting(path)
    assert s["cells"] <= release.MAX_CELLS, f"{s['notebook']} has {s['cells']} cells, more than {release.MAX_CELLS}"
    assert s["minutes"] <= release.MAX_SITTING_MINUTES, (
        f"{s['notebook']} takes about {s['minutes']} minutes ({s['words']} words, {s['exercises']} exercises, "
        f"{s['code_cells']} code cells), more than {release.MAX_SITTING_MINUTES}"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.parent.name)
def test_notebook_links_the_glossary(path):
    """Check that a notebook's first cell links docs/glossary.md, and the link resolves from notebooks/."""
    first = "".join(json.loads(path.read_text(encoding="utf-8"))["cells"][0]["source"])
    assert "../../docs/glossary.md" in first, f"{path.parent.name}'s first cell does not link ../../docs/glossary.md"
    assert (ROOT / "notebooks" / path.parent.name / "../../docs/glossary.md").resolve().is_file()


def test_sitting_counts_what_it_says():
    """Check that the sitting estimate of a made-up notebook counts 260 words, 2 exercises of notebook 01, 4 code
    cells."""
    import tempfile
    from pathlib import Path

    nb = {
        "cells": [{"cell_type": "markdown", "source": ["word " * 260]}] + [{"cell_type": "code", "source": ["1"]}] * 4
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "01-attention" / "x.ipynb"
        path.parent.mkdir()
        path.write_text(json.dumps(nb), encoding="utf-8")
        s = release.sitting(path)
    exercises = sum(ex.notebook == "01-attention" for ex in release.BY_ID.values())
    assert (s["cells"], s["words"], s["code_cells"], s["exercises"]) == (5, 260, 4, exercises)
    assert s["minutes"] == round(260 / 130 + 6 * exercises + 0.5 * 4)


def test_instructor_guide_shows_the_current_estimates():
    """Check that docs/instructors.md's table of sittings is the one the notebooks give today."""
    guide = (ROOT / "docs" / "instructors.md").read_text(encoding="utf-8")
    assert release.sitting_table() in guide, (
        "docs/instructors.md's sitting table is stale: paste the output of "
        'python -c "from kvlib.app.release import sitting_table; print(sitting_table())"'
    )
