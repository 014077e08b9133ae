"""README.md and docs/*.md: every link and every path they name resolves, the README stays short,
and no text names a file or module that is not in the repository."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted(ROOT.glob("README.*.md")), *sorted((ROOT / "docs").glob("*.md"))]  # README.zh-CN.md
README_MAX_LINES = 180

# Files named by earlier versions of the course that are gone (or never were in the repository).
GONE = [
    "COURSE.md",
    "SOURCES.md",
    "kvlib/bench.py",
    "kvlib/benchmark.py",
    "kvlib/model.py",
    "kvlib/train.py",
    "kvlib/corpus.py",
    "kvlib/configs.py",
    "kvlib/plotting.py",
    "kvlib/lab.py",
    "kvlib/cli.py",
    "kvlib/course.py",
    "kvlib/grading/course.py",
    "kvlib/_exercise.py",
    "python -m kvlib.train",
]

MD_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
IMG_SRC = re.compile(r"<img\b[^>]*\bsrc\s*=\s*[\"']([^\"']+)[\"']", re.IGNORECASE)
CODE_SPAN = re.compile(r"`([^`\n]+)`")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
# a path in the repository named in a code span: kvlib/..., solutions/..., assets/... (placeholders skipped)
REPO_PATH = re.compile(r"^(?:kvlib|solutions|notebooks|tests|assets|docs|\.ci)(?:/[\w.\-]+)*/?$")
DOTTED = re.compile(r"\bkvlib(?:\.\w+)+")


def _text_outside_code_blocks(text: str) -> str:
    """The text with fenced code blocks blanked out (their lines kept, so line numbers stay)."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            out.append("")
        else:
            out.append("" if fenced else line)
    return "\n".join(out)


def _links(doc: Path) -> list[str]:
    text = _text_outside_code_blocks(doc.read_text(encoding="utf-8"))
    return MD_LINK.findall(text) + IMG_SRC.findall(text)


def _is_external(target: str) -> bool:
    return re.match(r"^[a-zA-Z][a-zA-Z0-9+.\-]*:", target) is not None  # http:, https:, mailto:, ...


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = re.sub(r"[^\w\- ]", "", text.lower().replace("`", ""))
    return text.replace(" ", "-")


def _anchors(doc: Path) -> set[str]:
    text = _text_outside_code_blocks(doc.read_text(encoding="utf-8"))
    return {_slug(m.group(2)) for line in text.splitlines() if (m := HEADING.match(line))}


def _doc_id(doc: Path) -> str:
    return str(doc.relative_to(ROOT))


@pytest.mark.parametrize("doc", DOCS, ids=_doc_id)
def test_readme_links_resolve(doc):
    """Check that every relative link and <img src> in README.md and docs/*.md names an existing file or folder."""
    missing = []
    for target in _links(doc):
        if _is_external(target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0].split("?", 1)[0]
        if not (doc.parent / path).exists():
            missing.append(target)
    assert not missing, f"{_doc_id(doc)} links to paths that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=_doc_id)
def test_doc_anchors_resolve(doc):
    """Check that every #anchor a link points at is a heading of the document it names."""
    broken = []
    for target in _links(doc):
        if _is_external(target) or "#" not in target:
            continue
        path, anchor = target.split("#", 1)
        linked = (doc.parent / path) if path else doc
        if linked.suffix == ".md" and linked.is_file() and anchor not in _anchors(linked):
            broken.append(target)
    assert not broken, f"{_doc_id(doc)} links to headings that do not exist: {broken}"


@pytest.mark.parametrize("doc", DOCS, ids=_doc_id)
def test_doc_paths_exist(doc):
    """Check that every repository path a document names in a code span (kvlib/..., assets/...) exists."""
    missing = []
    for span in CODE_SPAN.findall(doc.read_text(encoding="utf-8")):
        candidate = span.strip()
        if REPO_PATH.match(candidate) and not (ROOT / candidate).exists():
            missing.append(candidate)
    assert not missing, f"{_doc_id(doc)} names paths that are not in the repository: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=_doc_id)
def test_doc_module_names_import(doc):
    """Check that every dotted kvlib name a document gives (kvlib.core.model, kvlib.measure.timing.replayable) exists."""
    unknown = []
    for name in sorted(set(DOTTED.findall(doc.read_text(encoding="utf-8")))):
        parts = name.split(".")
        for cut in range(len(parts), 0, -1):  # the longest importable module, then attributes
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
                break
            except ModuleNotFoundError:
                continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except (AttributeError, ImportError):
            unknown.append(name)
    assert not unknown, f"{_doc_id(doc)} names kvlib modules or attributes that do not exist: {unknown}"


def test_readme_is_short():
    """Check that README.md has at most 180 lines: a newcomer reads it in five minutes."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines, more than {README_MAX_LINES}"


@pytest.mark.parametrize("doc", DOCS, ids=_doc_id)
def test_docs_name_no_missing_files(doc):
    """Check that no document names COURSE.md, SOURCES.md or a kvlib module that was moved or removed."""
    text = doc.read_text(encoding="utf-8")
    named = [gone for gone in GONE if re.search(re.escape(gone) + r"(?![\w/])", text)]
    assert not named, f"{_doc_id(doc)} names files that are not in the repository: {named}"


def test_docs_folder_holds_the_guides():
    """Check that the README's guides are there: the instructor guide, the benchmark records, the articles, the glossary."""
    for name in ("instructors.md", "benchmarks.md", "articles.md", "glossary.md"):
        assert (ROOT / "docs" / name).is_file(), f"docs/{name} is missing"


# bold words in the notebooks that stress a point rather than name a term
EMPHASIS = {
    "last t of the s positions",
    "each row's maximum",
    "learns three matrices",
    "your",
    "naive",
    "in place",
    "top-left",
    "last row",
    "choose",
    "in the cache",
}


def test_glossary_defines_every_term_the_notebooks_introduce():
    """Check that docs/glossary.md holds every Chinese term a notebook gives in parentheses, and every term a notebook
    sets in bold (labels such as "Try it." and stressed words aside), notebooks 01-10 and both parts of 02, 04 and 08."""
    import json
    import re

    glossary = (ROOT / "docs" / "glossary.md").read_text(encoding="utf-8")
    chinese = re.compile(r"[(（,，;；、]\s*([\u4e00-\u9fff][\u4e00-\u9fffA-Za-z0-9 \-]*?)\s*[)）,，;；:：]")
    missing = []
    for path in sorted((ROOT / "solutions").glob("*/*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
        missing += [f"{path.parent.name}: {zh}" for zh in sorted(set(chinese.findall(text))) if zh not in glossary]
        for bold in set(re.findall(r"\*\*([^*]{2,60}?)\*\*", text)):
            if bold.rstrip().endswith((".", ":", "?")) or (bold[0].isupper() and " " in bold):
                continue  # a label ("Try it.", "Your guess:") or a sentence's opening words
            term = re.sub(r"\s*[(（].*", "", bold, flags=re.S).strip().lower().replace("\n", " ")
            if term not in EMPHASIS and term not in glossary.lower() and term.rstrip("s") not in glossary.lower():
                missing.append(f"{path.parent.name}: **{term}**")
    assert not missing, f"terms the notebooks introduce that docs/glossary.md does not define: {missing}"
