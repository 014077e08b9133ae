"""kvlib/app/site.py (`kvlib course site`): where each file goes, the links rewritten, widgets made static, and
the checks of the built HTML. The whole build (Sphinx on every executed notebook) is CI's: .ci/run runs it."""

import json

from conftest import ROOT

from kvlib.app import site


def test_every_page_has_its_place_and_nothing_else_has_one():
    """Check that the README is the front page, docs/ keep their names, a solution or learner notebook goes to
    notebooks/, and a source file, a data file or an unknown notebook has no page."""
    assert site.site_path("README.md") == "index.md"
    assert site.site_path("docs/glossary.md") == "docs/glossary.md"
    assert site.site_path("solutions/02-generation/layer.ipynb") == "notebooks/02-generation/layer.ipynb"
    assert site.site_path("notebooks/02-generation/layer.ipynb") == "notebooks/02-generation/layer.ipynb"
    for none in ("kvlib/attention.py", "docs/class-grading.json", "solutions/02-generation/nope.ipynb", "LICENSE"):
        assert site.site_path(none) is None, none


def test_links_are_rewritten_for_the_site():
    """Check that a link to a page stays relative to the page that holds it (its anchor kept), one to a notebook
    folder goes to its first notebook, an image is copied, a source file keeps only its text, links out and anchors
    stay, a link's text may run over lines, and fenced code is left as it is."""
    copies = {}
    text = (
        "[guide](docs/instructors.md#changing-the-course), [02](notebooks/02-generation/), "
        "[`kvlib/gqa.py`](kvlib/gqa.py), [nbgrader](https://nbgrader.readthedocs.io), [up](#set-up)\n"
        "[the\nlicence](LICENSE) ![plot](docs/class-grading.png)\n"
        "```bash\n[kept](kvlib/gqa.py)\n```\n"
    )
    out = site.rewrite_links(text, "README.md", "index.md", copies)
    assert out == (
        "[guide](docs/instructors.md#changing-the-course), [02](notebooks/02-generation/generation.ipynb), "
        "`kvlib/gqa.py`, [nbgrader](https://nbgrader.readthedocs.io), [up](#set-up)\n"
        "the\nlicence ![plot](_static/files/docs/class-grading.png)\n"
        "```bash\n[kept](kvlib/gqa.py)\n```\n"
    )
    assert copies == {"_static/files/docs/class-grading.png": "docs/class-grading.png"}
    nb = site.rewrite_links(
        "[g](../../docs/glossary.md) [k](../../kvlib/fused.py)",
        "solutions/09-fused/fused.ipynb",
        "notebooks/09-fused/fused.ipynb",
        copies,
    )
    assert nb == "[g](../../docs/glossary.md) k"


def _widget_notebook() -> dict:
    """A notebook whose one cell shows an interactive figure: a slider and an Output widget holding a PNG."""
    png = {
        "output_type": "display_data",
        "data": {"image/png": "iVBORw0KGgo=", "text/plain": "<Figure>"},
        "metadata": {},
    }
    state = {
        "box": {"model_name": "VBoxModel", "state": {"children": ["IPY_MODEL_slider", "IPY_MODEL_out"]}},
        "slider": {"model_name": "IntSliderModel", "state": {"value": 3}},
        "out": {"model_name": "OutputModel", "state": {"outputs": [png]}},
    }
    view = {"output_type": "display_data", "data": {site.WIDGET_VIEW: {"model_id": "box"}, "text/plain": "interactive"}}
    printed = {"output_type": "stream", "name": "stdout", "text": "kept\n"}
    return {
        "cells": [{"cell_type": "code", "source": "interact(...)", "outputs": [printed, view], "metadata": {}}],
        "metadata": {"widgets": {site.WIDGET_STATE: {"state": state}}},
    }


def test_a_widget_becomes_the_figure_it_showed():
    """Check that a widget's output is replaced by what its Output widget showed (the figure a static page can
    show), other outputs kept, and the widgets' state dropped; figures() then counts it."""
    nb = _widget_notebook()
    assert site.figures(nb) == 0
    site.unwidget(nb)
    outputs = nb["cells"][0]["outputs"]
    assert [o.get("name") or next(iter(o["data"])) for o in outputs] == ["stdout", "image/png"]
    assert "widgets" not in nb["metadata"] and site.figures(nb) == 1


def test_executed_notebooks_are_reused_where_their_cells_are_the_same(tmp_path, monkeypatch):
    """Check that an executed copy (cells stored as one string, as nbformat writes in memory) stands for its
    notebook when its cells are the solution's, and that a copy with other cells is run again, and kept."""
    ran = []

    def run(path, timeout):
        ran.append(path.name)
        return type("Run", (), {"error": None, "notebook": json.loads(path.read_text(encoding="utf-8"))})()

    monkeypatch.setattr(site, "run_notebook", run)
    for path in sorted((ROOT / "solutions").glob("[0-9]*/*.ipynb")):
        nb = json.loads(path.read_text(encoding="utf-8"))
        for cell in nb["cells"]:
            cell["source"] = "".join(cell["source"])
        if path.name == "mla.ipynb":
            nb["cells"][0]["source"] += "\nchanged since"
        copy = tmp_path / "executed" / path.relative_to(ROOT / "solutions")
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(json.dumps(nb), encoding="utf-8")
    found = site.executed_notebooks(tmp_path / "executed", keep=tmp_path / "kept")
    assert ran == ["mla.ipynb"] and len(found) == len(list((ROOT / "solutions").glob("[0-9]*/*.ipynb")))
    assert [p.relative_to(tmp_path).as_posix() for p in (tmp_path / "kept").rglob("*.ipynb")] == [
        "kept/08-compress/mla.ipynb"
    ]


def test_the_built_html_is_checked_for_links_and_figures(tmp_path):
    """Check that the check of a built site names a relative link to nothing and a notebook page with fewer images
    than its notebook's figures, and passes a page whose links and images are there."""
    (tmp_path / "_images").mkdir()
    (tmp_path / "_images" / "a.png").write_bytes(b"\x89PNG")
    (tmp_path / "index.html").write_text('<a href="nb.html#x">nb</a> <a href="https://x.org/y">out</a>')
    (tmp_path / "nb.html").write_text('<img src="_images/a.png"> <a href="gone.html">gone</a> <a href="#top">top</a>')
    problems = site.check_html(tmp_path, {"nb.ipynb": 2})
    assert problems == ["nb.html: gone.html leads to nothing", "nb.html: 1 images for the notebook's 2"]
    assert site.check_html(tmp_path, {"nb.ipynb": 1}) == ["nb.html: gone.html leads to nothing"]


def test_every_solution_notebook_and_doc_is_a_page():
    """Check that the site holds every solution notebook and every guide of docs/ (a new .md there must be named in
    site.DOCS or left out on purpose), and that the README's links to notebook folders reach a notebook."""
    pages = {site.site_path(p.relative_to(ROOT).as_posix()) for p in sorted((ROOT / "solutions").glob("*/*.ipynb"))}
    assert None not in pages and len(pages) == len(list((ROOT / "solutions").glob("[0-9]*/*.ipynb")))
    assert set(site.DOCS) == {p.name for p in (ROOT / "docs").glob("*.md")}
    copies = {}
    index = site.rewrite_links((ROOT / "README.md").read_text(encoding="utf-8"), "README.md", "index.md", copies)
    assert "](notebooks/01-attention/attention.ipynb)" in index and "](kvlib/" not in index
