"""`kvlib course site`: the course as a static site, to read without installing anything.

Sphinx with MyST-NB and the book theme (the `site` extra) builds it from a source folder written here:
  index.md          the README, with a table of contents of every page
  notebooks/NN-*/   every reference notebook, executed in reference mode: its figures and outputs
  docs/*.md         the glossary and the guides
Links are rewritten on the way: one to a page of the site stays (relative, the repository's layout kept), one to
a notebook folder goes to its first notebook, an image is copied beside its page, and a link to any other file of
the repository (source, data) becomes its plain text. The build fails on a broken reference (sphinx -W), a
relative link of the HTML to nothing, or a notebook page with fewer images than its notebook's figures.
Not here: running a notebook (kvlib.app.lab.run_notebook); links out of the site (they need the network).
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

from kvlib.app.lab import run_notebook, solution_notebooks
from kvlib.core import progress
from kvlib.core.paths import ROOT

DOCS = ("glossary.md", "instructors.md", "benchmarks.md", "articles.md")  # docs/, in the site's order
IMAGES = {".png", ".svg", ".jpg", ".jpeg", ".gif"}
# [text](target) and ![alt](target), a target in <> or not, an optional "title"; and <img src="target">
_LINK = re.compile(r"(!?\[(?P<text>[^\]]*)\])\(\s*(?P<target><[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
_IMG_SRC = re.compile(r"(<img\b[^>]*\bsrc\s*=\s*[\"'])([^\"']+)([\"'])", re.IGNORECASE)
_FENCE = re.compile(r"^\s*(```|~~~)")

CONF = '''"""Sphinx's configuration of the course's site, written by `kvlib course site` (kvlib/app/site.py)."""

project = "kvlib"
html_title = "kvlib: how LLMs generate text, and why the KV cache matters"
extensions = ["myst_nb"]
html_theme = "sphinx_book_theme"
html_theme_options = {"show_toc_level": 2}
nb_execution_mode = "off"  # the notebooks come executed, outputs and figures in them
myst_enable_extensions = ["dollarmath", "amsmath", "html_image"]
myst_heading_anchors = 6  # a heading's GitHub-style anchor, as the repository's links use them
exclude_patterns = ["_build", "**.ipynb_checkpoints"]
'''


# ---------------------------------------------------------------------------------------------
# Where each file of the repository goes in the site


def site_path(repo_path: str) -> str | None:
    """The path in the site of a repository file (posix, relative to the clone), or None if it is no page."""
    if repo_path == "README.md":
        return "index.md"
    parts = repo_path.split("/")
    if len(parts) == 2 and parts[0] == "docs" and parts[1] in DOCS:
        return repo_path
    if len(parts) == 3 and parts[0] in ("solutions", "notebooks") and parts[2].endswith(".ipynb"):
        if (ROOT / "solutions" / parts[1] / parts[2]).is_file():
            return f"notebooks/{parts[1]}/{parts[2]}"
    return None


def _relative(target: str, start: str) -> str:
    """target relative to the folder of start (both posix paths from one root)."""
    t, s = target.split("/"), start.split("/")[:-1]
    common = 0
    while common < min(len(t) - 1, len(s)) and t[common] == s[common]:
        common += 1
    return "/".join([".."] * (len(s) - common) + t[common:])


def _resolve(target: str, source: str) -> str | None:
    """The repository path (posix) a relative link target in the file `source` points to; None outside the clone."""
    base = (ROOT / source).parent
    try:
        return (base / unquote(target)).resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return None


def rewrite_links(text: str, source: str, dest: str, copies: dict[str, str]) -> str:
    """Markdown of the repository file `source` as the site's page `dest` shows it (the rules in the module's
    docstring); fills copies {site path: repository path} with the images to copy. Fenced code is left alone."""

    def new_target(target: str) -> str | None:
        """The rewritten target; None to unlink."""
        parts = urlsplit(target)
        if parts.scheme or target.startswith(("#", "//")) or not parts.path:
            return target
        repo = _resolve(parts.path, source)
        if repo is None:
            return None
        anchor = f"#{parts.fragment}" if parts.fragment else ""
        if (page := site_path(repo)) is not None:
            return _relative(page, dest) + anchor
        folder = ROOT / repo
        if folder.is_dir() and folder.parent.name in ("notebooks", "solutions"):
            first = sorted((ROOT / "solutions" / folder.name).glob("*.ipynb"))
            if first:
                return _relative(f"notebooks/{folder.name}/{first[0].name}", dest)
        if folder.suffix.lower() in IMAGES and folder.is_file():
            copy = f"_static/files/{repo}"
            copies[copy] = repo
            return _relative(copy, dest)
        return None

    def link(m: re.Match) -> str:
        target = m.group("target").strip("<>")
        new = new_target(target)
        if new is None:
            return m.group("text")  # a file of the repository the site does not hold: its words stay
        return f"{m.group(1)}({new})"

    def img(m: re.Match) -> str:
        new = new_target(m.group(2))
        return f"{m.group(1)}{new if new is not None else m.group(2)}{m.group(3)}"

    segments, fenced = [[]], False  # prose and fenced code, in turn: a link's text may run over lines
    for line in text.splitlines(keepends=True):
        if _FENCE.match(line) and not fenced:
            segments.append([])
        segments[-1].append(line)
        if _FENCE.match(line):
            if fenced:
                segments.append([])
            fenced = not fenced
    out = [
        "".join(seg) if seg and _FENCE.match(seg[0]) else _IMG_SRC.sub(img, _LINK.sub(link, "".join(seg)))
        for seg in segments
    ]
    return "".join(out)


# ---------------------------------------------------------------------------------------------
# The source folder


def _sources(nb: dict) -> list[str]:
    """The cells' sources, each one string (a file may store a source as a list of lines)."""
    return ["".join(c["source"]) if isinstance(c["source"], list) else c["source"] for c in nb["cells"]]


def executed_notebooks(executed: Path | None = None, timeout: int = 300, keep: Path | None = None) -> dict[Path, dict]:
    """Every solution notebook executed in reference mode, as parsed JSON: from `executed` (a folder laid out as
    solutions/, where tests/test_notebooks.py leaves its runs) where it holds the same cells, else run here and
    written into `keep` (laid out the same way, for a later --executed)."""
    found, missing = {}, []
    for path in solution_notebooks():
        copy = executed / path.relative_to(ROOT / "solutions") if executed is not None else None
        if copy is not None and copy.is_file():
            nb = json.loads(copy.read_text(encoding="utf-8"))
            source = json.loads(path.read_text(encoding="utf-8"))
            if _sources(nb) == _sources(source):
                found[path] = nb
                continue
        missing.append(path)
    for path in progress.bar(missing, desc="kvlib course site: running notebooks", unit="notebook"):
        run = run_notebook(path, timeout=timeout)
        if run.error is not None:
            raise RuntimeError(f"{path.relative_to(ROOT)} did not run top to bottom: {run.error}")
        found[path] = json.loads(json.dumps(run.notebook))  # nbformat's node -> plain JSON
        if keep is not None:
            copy = keep / path.relative_to(ROOT / "solutions")
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.write_text(json.dumps(found[path], indent=1, ensure_ascii=False), encoding="utf-8")
    return {path: found[path] for path in solution_notebooks()}


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def unwidget(nb: dict) -> None:
    """Replace each widget's output by what its Output widgets showed when the notebook ran (its figure at the
    sliders' first values), in place, and drop the widgets' state: a static site runs no kernel, so a slider there
    would move nothing, and the figure shows without the widget library."""
    state = nb.get("metadata", {}).get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})

    def shown(model_id: str, seen: set) -> list[dict]:
        model = state.get(model_id)
        if model is None or model_id in seen:
            return []
        seen.add(model_id)
        outputs = list(model["state"].get("outputs", [])) if model.get("model_name") == "OutputModel" else []
        for child in model["state"].get("children", []):  # "IPY_MODEL_<id>"
            outputs += shown(child.removeprefix("IPY_MODEL_"), seen)
        return outputs

    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            cell["outputs"] = [
                shown_output
                for out in cell["outputs"]
                for shown_output in (
                    shown(out["data"][WIDGET_VIEW]["model_id"], set()) if WIDGET_VIEW in out.get("data", {}) else [out]
                )
            ]
    nb.get("metadata", {}).pop("widgets", None)


def _toctree(caption: str, entries: list[str]) -> str:
    body = "\n".join(e.removesuffix(".md").removesuffix(".ipynb") for e in entries)
    return f"\n```{{toctree}}\n:hidden:\n:caption: {caption}\n\n{body}\n```\n"


def stage(src: Path, notebooks: dict[Path, dict]) -> list[str]:
    """Write the Sphinx source folder src (emptied first); returns the pages, notebooks first."""
    if src.exists():
        shutil.rmtree(src)
    src.mkdir(parents=True)
    copies: dict[str, str] = {}
    pages = []
    for path, nb in notebooks.items():
        repo = path.relative_to(ROOT).as_posix()
        dest = site_path(repo)
        unwidget(nb)
        for cell in nb["cells"]:
            if cell["cell_type"] == "markdown":
                text = rewrite_links("".join(cell["source"]), repo, dest, copies)
                cell["source"] = text.splitlines(keepends=True)
        (src / dest).parent.mkdir(parents=True, exist_ok=True)
        (src / dest).write_text(json.dumps(nb, indent=1, ensure_ascii=False), encoding="utf-8")
        pages.append(dest)
    docs = [f"docs/{name}" for name in DOCS]
    for page in docs:
        (src / page).parent.mkdir(parents=True, exist_ok=True)
        (src / page).write_text(rewrite_links((ROOT / page).read_text(encoding="utf-8"), page, page, copies))
    index = rewrite_links((ROOT / "README.md").read_text(encoding="utf-8"), "README.md", "index.md", copies)
    index += _toctree("Notebooks", pages) + _toctree("Guides", docs)
    (src / "index.md").write_text(index, encoding="utf-8")
    for copy, repo in copies.items():
        (src / copy).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / repo, src / copy)
    (src / "conf.py").write_text(CONF, encoding="utf-8")
    return pages + docs


# ---------------------------------------------------------------------------------------------
# The build and its checks


class _Refs(HTMLParser):
    def __init__(self):
        super().__init__()
        self.links: list[str] = []
        self.images: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "a" and attrs.get("href"):
            self.links.append(attrs["href"])
        elif tag in ("img", "script") and attrs.get("src"):
            (self.images if tag == "img" else self.links).append(attrs["src"])
        elif tag == "link" and attrs.get("href"):
            self.links.append(attrs["href"])


def check_html(html: Path, notebooks: dict[str, int]) -> list[str]:
    """The problems of a built site: a relative link or image to no file, a notebook page (notebooks: {page: its
    notebook's figures}) with fewer images than figures."""
    problems = []
    for page in sorted(p for p in html.rglob("*.html") if "_static" not in p.relative_to(html).parts):
        refs = _Refs()
        refs.feed(page.read_text(encoding="utf-8"))
        for ref in refs.links + refs.images:
            parts = urlsplit(ref)
            if parts.scheme or ref.startswith("//") or not parts.path:
                continue
            if not (page.parent / unquote(parts.path)).exists():
                problems.append(f"{page.relative_to(html)}: {ref} leads to nothing")
        source = page.relative_to(html).with_suffix(".ipynb").as_posix()
        if source in notebooks:
            shown = len(refs.images)
            if shown < notebooks[source]:
                problems.append(f"{page.relative_to(html)}: {shown} images for the notebook's {notebooks[source]}")
    return problems


def figures(nb: dict) -> int:
    """How many figures (PNG or SVG outputs) an executed notebook shows."""
    return sum(
        bool({"image/png", "image/svg+xml"} & set(out.get("data", {})))
        for cell in nb["cells"]
        for out in cell.get("outputs", [])
    )


def missing_tools() -> list[str]:
    """The builder's packages (the site extra) that are not installed."""
    return [name for name in ("sphinx", "myst_nb", "sphinx_book_theme") if importlib.util.find_spec(name) is None]


def build(out: Path, executed: Path | None = None, timeout: int = 300) -> Path:
    """Stage the sources in out/src, build the HTML into out/html and check it; returns the index page.

    The notebooks it runs are kept in out/executed (`--executed` reuses them). Raises RuntimeError naming the
    problem: a notebook that fails, Sphinx's first errors, the broken links.
    """
    notebooks = executed_notebooks(executed, timeout, keep=out / "executed")
    src, html = out / "src", out / "html"
    pages = stage(src, notebooks)
    if html.exists():
        shutil.rmtree(html)
    with progress.bar(desc="kvlib course site: building", total=1, unit="site") as bar:
        bar.set_postfix_str(f"{len(pages)} pages")
        proc = subprocess.run(
            [sys.executable, "-m", "sphinx", "-b", "html", "-W", "--keep-going", "-q", str(src), str(html)],
            capture_output=True,
            text=True,
        )
        bar.update()
    if proc.returncode != 0:
        raise RuntimeError(f"sphinx failed (exit {proc.returncode}):\n{proc.stderr.strip()[-4000:]}")
    shown = {site_path(p.relative_to(ROOT).as_posix()): figures(nb) for p, nb in notebooks.items()}
    problems = check_html(html, shown)
    if problems:
        raise RuntimeError(f"{len(problems)} problem(s) in the built site:\n" + "\n".join(problems[:40]))
    return html / "index.html"
