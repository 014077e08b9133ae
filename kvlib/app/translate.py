"""The course in another language, built from the English sources: translations beside them, never forks.

  translations/<lang>/NN-topic/<notebook>.md    the translation of each markdown cell of solutions/NN-topic/<notebook>
                                                .ipynb, after a line `<!-- cell ID sha256:HASH -->` naming the cell's id
                                                and the hash of the English it translates (cell_hash)
  solutions/<lang>/NN-topic/<notebook>.ipynb    the English solution notebook, its markdown cells translated: code,
                                                cell ids, nbgrader metadata and hidden tests are the English ones
  notebooks/<lang>/NN-topic/<notebook>.ipynb    nbgrader generate_assignment of it, as notebooks/ is of solutions/
`kvlib course release` (release() here) writes both; `kvlib course translate` lists what is translated. A notebook is
"missing" until its translation file exists, then "complete" or "stale": a cell whose English changed since it was
translated, a markdown cell with no translation, or the translation of a cell that is gone. A stale cell is written
in English, under a line that says so, and tests/test_translations.py fails naming it.
Links are written as the English has them (relative to the English notebook); the translated notebook, a folder
deeper, gets them rewritten to the translated notebook where there is one, else to the English file. The first
cell's generated header line (kvlib/app/sitting.py) is left out of the hash and written in the language.
Glossary (docs/glossary.md): a translated cell uses the Chinese term of each glossary term its English uses
(term_problems), keeps its numbers and its code (content_problems).
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from kvlib.app import release as english
from kvlib.app.release import ROOT, assignments
from kvlib.app.sitting import HEADER
from kvlib.checks import first_paragraph
from kvlib.course import hints, i18n

LANGS = tuple(lang for lang in i18n.LANGUAGES if lang != i18n.DEFAULT)
TRANSLATIONS = ROOT / "translations"
GLOSSARY = ROOT / "docs" / "glossary.md"
MARKER = re.compile(r"^<!-- cell (\S+) sha256:([0-9a-f]{12})(?: not-terms: ([^>]*?))? -->[ \t]*$", re.M)
_COMMENT = re.compile(r"<!--.*?-->", re.S)  # a translator's note: not part of the translation

# Each language's header line under a notebook's title, from the numbers of the English one (kvlib.app.sitting)
_HEADER_EN = re.compile(
    r"^\*\*Time:\*\* core about (?P<core>\d+) minutes(?:; going further about (?P<further>\d+))? "
    r"\(\[estimated\]\((?P<link>[^)]+)\) for a careful learner\)\.$"
)
HEADER_LINES = {
    "zh-CN": (
        "**时间：** 核心部分约 {core} 分钟{further}（按细心的学习者[估算]({link})）。",
        "；选读部分约 {further} 分钟",
    )
}
STALE_NOTE = {"zh-CN": "*（本单元格的英文原文已修改，中文译文有待更新；以下为英文原文。）*"}


def cell_hash(text: str) -> str:
    """The hash a translation carries of the English markdown cell it translates (12 hex digits of sha256)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


# ---------------------------------------------------------------------------------------------
# The English notebooks and their translation files


def english_notebooks() -> list[Path]:
    """Every English solution notebook, in course order."""
    return [p for name in assignments() for p in sorted((ROOT / "solutions" / name).glob("*.ipynb"))]


def _text(cell: dict) -> str:
    return "".join(cell["source"])


def english_cells(nb: dict) -> dict[str, str]:
    """The markdown cells a translation translates, {cell id: English}: the first cell without its header line."""
    out = {}
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "markdown":
            text = _text(cell)
            out[cell["id"]] = HEADER.sub("", text).replace("\n\n\n", "\n\n") if i == 0 else text
    return out


def translation_file(notebook: Path, lang: str) -> Path:
    """translations/<lang>/NN-topic/<stem>.md for solutions/NN-topic/<stem>.ipynb."""
    return TRANSLATIONS / lang / notebook.parent.name / f"{notebook.stem}.md"


@dataclass
class Cell:
    text: str  # the translation, translators' notes (HTML comments) removed; "" when none is written yet
    sha: str  # the hash of the English it translates
    not_terms: tuple[str, ...] = ()  # glossary terms whose English word means something else in this cell
    line: int = 0


class TranslationFileError(ValueError):
    """A translation file out of form: names the file, the line and the problem."""


def parse(text: str, path: Path) -> dict[str, Cell]:
    """The cells of a translation file by id; what precedes the first marker is the file's own note."""
    marks = list(MARKER.finditer(text))
    cells: dict[str, Cell] = {}
    for i, m in enumerate(marks):
        line = text.count("\n", 0, m.start()) + 1
        cell_id, sha, not_terms = m.groups()
        if cell_id in cells:
            raise TranslationFileError(f"{_rel(path)} line {line}: cell {cell_id} is translated twice")
        body = text[m.end() : marks[i + 1].start() if i + 1 < len(marks) else len(text)]
        terms = tuple(t.strip() for t in (not_terms or "").split(",") if t.strip())
        cells[cell_id] = Cell(_COMMENT.sub("", body).strip("\n").strip(), sha, terms, line)
    stray = [ln for ln in text.splitlines() if ln.startswith("<!-- cell ") and not MARKER.match(ln)]
    if stray:
        raise TranslationFileError(
            f"{_rel(path)}: a marker out of form: {stray[0]!r} (want <!-- cell ID sha256:HASH -->)"
        )
    return cells


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


@dataclass
class Status:
    notebook: Path  # the English solution notebook
    lang: str
    state: str  # "missing" (no translation file), "complete" or "stale"
    stale: list[str] = field(default_factory=list)  # cells whose English changed since they were translated
    untranslated: list[str] = field(default_factory=list)  # markdown cells with no translation (or an empty one)
    gone: list[str] = field(default_factory=list)  # translated cells the notebook no longer has
    cells: int = 0  # markdown cells of the English notebook

    def lines(self) -> list[str]:
        """What `kvlib course translate` says of it: one line, then one per cell to do."""
        name = english.label(self.notebook)
        if self.state == "missing":
            return [
                f"{name}: missing ({self.cells} markdown cells, no {_rel(translation_file(self.notebook, self.lang))})"
            ]
        if self.state == "complete":
            return [f"{name}: complete ({self.cells} cells)"]
        out = [f"{name}: stale"]
        out += [f"  cell {c}: its English changed since it was translated" for c in self.stale]
        out += [f"  cell {c}: not translated" for c in self.untranslated]
        out += [f"  cell {c}: translated, but the notebook has no such markdown cell" for c in self.gone]
        return out


def status(notebook: Path, lang: str, nb: dict | None = None) -> Status:
    """Where the translation of one notebook stands."""
    nb = nb or json.loads(notebook.read_text(encoding="utf-8"))
    cells = english_cells(nb)
    path = translation_file(notebook, lang)
    if not path.is_file():
        return Status(notebook, lang, "missing", cells=len(cells))
    done = parse(path.read_text(encoding="utf-8"), path)
    s = Status(notebook, lang, "complete", cells=len(cells))
    for cell_id, en in cells.items():
        if cell_id not in done or not done[cell_id].text:
            s.untranslated.append(cell_id)
        elif done[cell_id].sha != cell_hash(en):
            s.stale.append(cell_id)
    s.gone = [c for c in done if c not in cells]
    if s.stale or s.untranslated or s.gone:
        s.state = "stale"
    return s


def statuses(lang: str) -> list[Status]:
    return [status(p, lang) for p in english_notebooks()]


# ---------------------------------------------------------------------------------------------
# The translated notebooks

_LINK = re.compile(r"(\]\()([^)\s]+)((?:\s+\"[^\"]*\")?\))|(<img [^>]*?src=\")([^\"]+)(\")")


def rewrite_links(text: str, english_dir: str, lang: str) -> str:
    """Markdown links and images of a cell written for the English notebook in english_dir ("solutions/01-attention"),
    rewritten for its translation in <base>/<lang>/NN-topic: to a translated notebook where one exists, else to the
    English file; links with a scheme, anchors and absolute paths stay as they are."""
    base, topic = english_dir.split("/")
    here = ROOT / base / lang / topic  # where the translated notebook is

    def new(target: str) -> str:
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith(("#", "/")):
            return target
        path, _, anchor = target.partition("#")
        resolved = Path(os.path.normpath(ROOT / english_dir / path))
        if not resolved.is_relative_to(ROOT):
            return target
        parts = resolved.relative_to(ROOT).parts
        if len(parts) >= 2 and parts[0] == base and parts[1][:2].isdigit():  # a notebook, or a notebook's folder
            if translation_file(ROOT / "solutions" / Path(*parts[1:]).with_suffix(".ipynb"), lang).is_file() or (
                resolved.suffix != ".ipynb" and (TRANSLATIONS / lang / parts[1]).is_dir()
            ):
                resolved = ROOT / base / lang / Path(*parts[1:])
        elif (other := resolved.with_name(f"{resolved.stem}.{lang}{resolved.suffix}")).is_file():
            resolved = other  # README.md -> README.zh-CN.md
        return Path(os.path.relpath(resolved, here)).as_posix() + (f"#{anchor}" if anchor else "")

    def sub(m: re.Match) -> str:
        if m.group(1):
            return m.group(1) + new(m.group(2)) + m.group(3)
        return m.group(4) + new(m.group(5)) + m.group(6)

    return _LINK.sub(sub, text)


def header_line(english_header: str, lang: str) -> str:
    """The header line under a notebook's title in `lang`, from the English one's numbers."""
    m = _HEADER_EN.match(english_header.strip())
    if not m:
        raise ValueError(f"the header line {english_header.strip()!r} is not the one kvlib.app.sitting writes")
    line, further = HEADER_LINES[lang]
    extra = further.format(further=m["further"]) if m["further"] else ""
    return line.format(core=m["core"], further=extra, link=m["link"])


def translated_notebook(notebook: Path, lang: str, nb: dict | None = None) -> dict:
    """The solution notebook in `lang`: each markdown cell its fresh translation (links rewritten), else its English
    under STALE_NOTE; the notebook's metadata names its language ({"kvlib": {"lang": ...}}); every code cell as it is."""
    nb = json.loads(notebook.read_text(encoding="utf-8")) if nb is None else json.loads(json.dumps(nb))
    path = translation_file(notebook, lang)
    done = parse(path.read_text(encoding="utf-8"), path)
    english_dir = f"solutions/{notebook.parent.name}"
    cells = english_cells(nb)
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        en = cells[cell["id"]]
        t = done.get(cell["id"])
        if t is not None and t.text and t.sha == cell_hash(en):
            text = t.text
        else:
            text = f"{STALE_NOTE[lang]}\n\n{en.strip()}"
        if i == 0 and (m := HEADER.search(_text(cell))):
            title, _, rest = text.partition("\n")
            text = f"{title}\n\n{header_line(m.group(0), lang)}\n\n{rest.lstrip(chr(10))}"
        text = rewrite_links(text, english_dir, lang).rstrip("\n")
        cell["source"] = text.splitlines(keepends=True)
    nb["metadata"].setdefault("kvlib", {})["lang"] = lang
    return nb


def _dump(nb: dict) -> str:
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def release(check: bool = False) -> list[str]:
    """`kvlib course release`: kvlib/ stubs and notebooks/ from solutions/ (kvlib.app.release), and every language's
    solutions/<lang>/ and notebooks/<lang>/ from the translated notebooks, nbgrader run once for all. With
    check=True write nothing; returns the differences (an empty list: everything is up to date)."""
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        jobs = []
        for lang in LANGS:
            source = Path(tmp) / lang
            names = set()
            for s in statuses(lang):
                if s.state == "missing":
                    continue
                rel = s.notebook.relative_to(ROOT / "solutions")
                new = _dump(translated_notebook(s.notebook, lang))
                (source / rel).parent.mkdir(parents=True, exist_ok=True)
                (source / rel).write_text(new, encoding="utf-8")
                names.add(rel.parts[0])
                target = ROOT / "solutions" / lang / rel
                old = target.read_text(encoding="utf-8") if target.exists() else ""
                if old != new:
                    problems.append(f"solutions/{lang}/{rel.as_posix()} differs from its translation's build")
                    if not check:
                        target.parent.mkdir(parents=True, exist_ok=True)
                        target.write_text(new, encoding="utf-8")
            built = {p.relative_to(source) for p in source.rglob("*.ipynb")}
            for path in sorted((ROOT / "solutions" / lang).rglob("*.ipynb")):
                if path.relative_to(ROOT / "solutions" / lang) not in built and ".ipynb_checkpoints" not in path.parts:
                    problems.append(f"{_rel(path)} has no translation in {_rel(TRANSLATIONS / lang)}")
                    if not check:
                        path.unlink()
            jobs.append((source, lang, sorted(names)))
        problems = english.release(check, translations=jobs) + problems
    return problems


# ---------------------------------------------------------------------------------------------
# Translated documents: README.zh-CN.md's sections, each after `<!-- translates README.md#set-up sha256:HASH -->`

DOC_MARKER = re.compile(r"^<!-- translates (\S+?)#(\S+) sha256:([0-9a-f]{12}) -->[ \t]*$", re.M)
_HEADING = re.compile(r"^(#{1,6}) (.+?)\s*$")


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def sections(text: str) -> dict[str, str]:
    """A markdown document's sections by anchor: the text under each heading up to the next heading of its level or
    above (code blocks are not headings)."""
    lines, found, fenced = text.splitlines(), [], False
    for i, line in enumerate(lines):
        fenced ^= line.startswith("```")
        if not fenced and (m := _HEADING.match(line)):
            found.append((i, len(m.group(1)), slug(m.group(2))))
    out = {}
    for n, (i, level, anchor) in enumerate(found):
        end = next((j for j, lv, _ in found[n + 1 :] if lv <= level), len(lines))
        out[anchor] = "\n".join(lines[i + 1 : end]).strip()
    return out


def translated_documents() -> list[Path]:
    """The translated documents: <name>.<lang>.md at the top of the clone and in docs/."""
    return sorted(p for lang in LANGS for p in [*ROOT.glob(f"*.{lang}.md"), *(ROOT / "docs").glob(f"*.{lang}.md")])


def document_problems(path: Path) -> list[str]:
    """A translated document's sections held to their English: each marker names a section that exists, with the
    hash of its text today."""
    problems, text = [], path.read_text(encoding="utf-8")
    marks = list(DOC_MARKER.finditer(text))
    if not marks:
        problems.append(
            f"{_rel(path)}: no <!-- translates FILE#SECTION sha256:HASH --> marker: what does it translate?"
        )
    for m in marks:
        source, anchor, sha = m.groups()
        line = text.count("\n", 0, m.start()) + 1
        english = (
            sections((path.parent / source).read_text(encoding="utf-8")) if (path.parent / source).is_file() else {}
        )
        if anchor not in english:
            problems.append(f"{_rel(path)} line {line}: {source} has no section #{anchor}")
        elif cell_hash(english[anchor]) != sha:
            problems.append(
                f"{_rel(path)} line {line}: {source}#{anchor} changed since it was translated "
                f"(sha256 {cell_hash(english[anchor])} now)"
            )
    return problems


# ---------------------------------------------------------------------------------------------
# The glossary's terms, and what a translated cell must keep of its English

_ROW = re.compile(r"^\|(?P<en>[^|]+)\|(?P<zh>[^|]+)\|[^|]*\|\s*$")
_PAREN = re.compile(r"\s*[（(]([^）)]*)[）)]")


@dataclass(frozen=True)
class Term:
    english: str  # as it is matched: "query", "KV cache", "time to first token"
    chinese: tuple[str, ...]  # any one of them will do
    pattern: re.Pattern = field(compare=False, repr=False)


def _term_pattern(word: str) -> re.Pattern:
    """The English term as whole words, its last word singular or plural ("scores" finds "score" too); case kept
    where the term has capitals (KV cache, FLOPs), else ignored."""
    *head, last = word.split()
    if last.endswith("y") and len(last) > 3 and last[-2] not in "aeiou":
        plural = last[:-1] + "ies"
    else:
        plural = last + ("es" if last.endswith(("s", "x", "ch", "sh")) else "s")
    forms = {last, plural} | ({last[:-1]} if last.endswith("s") and len(last) > 3 else set())
    tail = "(?:" + "|".join(re.escape(f) for f in sorted(forms, key=len, reverse=True)) + ")"
    body = r"[\s-]+".join([*(re.escape(h) for h in head), tail])
    flags = 0 if any(ch.isupper() for ch in word) else re.I
    return re.compile(rf"(?<![\w-]){body}(?![\w])", flags)


def _items(cell: str, sep: str) -> list[str]:
    return [p.strip() for p in re.split(sep, cell.strip()) if p.strip()]


def glossary_terms(path: Path = GLOSSARY) -> list[Term]:
    """Every term of the glossary's tables: each English name (a row may name several, "query, key, value", paired
    with "查询、键、值" in order) with its Chinese terms, the main one and the one in parentheses (either will do).
    A parenthesis in the English column qualifies it and is not matched. Raises ValueError naming a row whose
    English and Chinese lists differ in length."""
    terms: list[Term] = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        m = _ROW.match(line)
        if not m or set(m["en"].strip()) <= set("-: ") or m["en"].strip() == "English":
            continue
        en_items = _items(_PAREN.sub("", m["en"]), r",\s+|\s+/\s+")
        if " / " in m["en"] and len(en_items[-1].split()) > 1:  # "skipped / masked tile": both are tiles
            noun = en_items[-1].split()[-1]
            en_items = [item if " " in item else f"{item} {noun}" for item in en_items]
        zh_items = _items(m["zh"], r"[、]|\s+/\s+")
        if len(zh_items) != 1 and len(zh_items) != len(en_items):
            raise ValueError(f"{path.name} line {n}: {len(en_items)} English terms, {len(zh_items)} Chinese: {line}")
        for i, en in enumerate(en_items):
            zh = zh_items[0 if len(zh_items) == 1 else i]
            alternatives = [_PAREN.sub("", zh).strip(), *(p.strip() for p in _PAREN.findall(zh))]
            chinese = tuple(dict.fromkeys(a for a in alternatives if a))
            terms.append(Term(en, chinese, _term_pattern(en)))
    return terms


_CODE = re.compile(r"`[^`]+`")  # a code span may run over a line's end
_MATH = re.compile(r"\$[^$\n]+\$")
_TARGET = re.compile(r"\]\([^)]*\)|<[^>]+>")
_NUMBER = re.compile(r"(?<![A-Za-z0-9_.])\d[\d,]*(?:\.\d+)?")  # ASCII: 约63分钟 holds the number 63


def prose(text: str) -> str:
    """What a cell says in words: its code spans, math, link targets and HTML tags left out."""
    return _TARGET.sub("]", _MATH.sub(" ", _CODE.sub(" ", text)))


def _squeezed(text: str) -> str:
    return re.sub(r"\s+", "", text)


def term_problems(english_text: str, translated: str, terms: list[Term], not_terms=()) -> list[str]:
    """The glossary terms the English uses whose Chinese term the translation lacks: one line each."""
    words, zh = prose(english_text), _squeezed(translated)
    problems = []
    for term in terms:
        if term.english in not_terms or not term.pattern.search(words):
            continue
        if not any(_squeezed(c) in zh for c in term.chinese):
            problems.append(f"'{term.english}' should be {' or '.join(term.chinese)}")
    return list(dict.fromkeys(problems))


def content_problems(english_text: str, translated: str) -> list[str]:
    """What a translation must keep of its English: every number of the prose, every code span; and be Chinese."""
    problems = []
    numbers = {n.replace(",", "") for n in _NUMBER.findall(prose(english_text))}
    have = {n.replace(",", "") for n in _NUMBER.findall(translated)}
    problems += [f"the number {n} is not in the translation" for n in sorted(numbers - have)]
    kept = {" ".join(s.split()) for s in _CODE.findall(translated)}
    spans = dict.fromkeys(" ".join(s.split()) for s in _CODE.findall(english_text))
    problems += [f"the code {s} is not in the translation" for s in spans if s not in kept]
    words = re.findall(r"[A-Za-z]{2,}", prose(english_text))
    han = sum("\u4e00" <= ch <= "\u9fff" for ch in translated)
    if len(words) >= 3 and han < len(words) / 2:
        problems.append(f"it reads as untranslated: {han} Chinese characters for {len(words)} English words")
    return problems


def hint_problems(lang: str, terms: list[Term] | None = None) -> list[str]:
    """Every translated hint held to its English as a notebook's cell is (term_problems, content_problems): its title
    and each of its levels."""
    terms = glossary_terms() if terms is None else terms
    english, out = hints.load(), []
    for ex_id, (h, _) in hints.read_translations(lang).items():
        pairs = [(english[ex_id].title, h.title, "title")]
        pairs += [(a, b, f"hint {i}") for i, (a, b) in enumerate(zip(english[ex_id].levels, h.levels), start=1)]
        for en, zh, where in pairs:
            problems = term_problems(en, zh, terms) + (content_problems(en, zh) if where != "title" else [])
            out += [f"{_rel(h.file)}: {ex_id} {where}: {p}" for p in problems]
    return out


def quality_problems(notebook: Path, lang: str, terms: list[Term] | None = None) -> list[str]:
    """Every translated cell of a notebook held to its English: the glossary's terms, the numbers, the code."""
    path = translation_file(notebook, lang)
    if not path.is_file():
        return []
    terms = glossary_terms() if terms is None else terms
    cells = english_cells(json.loads(notebook.read_text(encoding="utf-8")))
    out = []
    for cell_id, t in parse(path.read_text(encoding="utf-8"), path).items():
        if cell_id not in cells or not t.text:
            continue
        where = f"{_rel(path)} line {t.line}, cell {cell_id}"
        out += [f"{where}: {p}" for p in term_problems(cells[cell_id], t.text, terms, t.not_terms)]
        out += [f"{where}: {p}" for p in content_problems(cells[cell_id], t.text)]
    return out


# ---------------------------------------------------------------------------------------------
# The learner's tools: the English texts a message catalogue (kvlib.course.i18n) translates

# Where the figures' texts are: the calls that draw text, the keyword arguments that carry it, and the names
# (parameters, variables) that hold a title or a label
_FIGURE_CALLS = {
    "set_title", "set_xlabel", "set_ylabel", "suptitle", "supxlabel", "supylabel", "text", "annotate",
    "set_label", "legend", "set_xticks", "set_yticks", "set_xticklabels", "set_yticklabels", "figtext",
}  # fmt: skip
_FIGURE_KEYWORDS = {"label", "title", "xlabel", "ylabel", "labels", "note", "verdicts"}
_FIGURE_NAMES = re.compile(r"^(?:title|label|xlabel|ylabel|note|\w+_(?:title|label))s?$")
_WORDS = re.compile(r"[A-Za-z]{2,}")
_FIELD = re.compile(r"\{\d+\}")
_FIGURES = "kvlib/course/figures/"  # one module per notebook
# The exercises' input checks, whose ValueErrors reach the learner translated (kvlib/course/inputs.py's last section):
# every function of kvlib/course/inputs.py, and the model's own check of token ids that several of them call
_INPUTS = {"kvlib/course/inputs.py": None, "kvlib/core/model.py": {"check_input"}}
# A claim's verdict (kvlib/course/claims.py): each sentence, joined from the parts it words (head and tail: _sentences),
# and what a notebook's claims.compare/against/exact call fills into them (the texts after the claim's id)
_CLAIMS = "kvlib/course/claims.py"
_SENTENCE = {"head", "tail"}
_VERDICTS = {"compare", "against", "exact"}
_VERDICT_KEYWORDS = {"what"}


def template(node) -> str | None:
    """An English text as the catalogue keys it: a string as it is, an f-string with {0}, {1}, ... for its fields."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        out, n = [], 0
        for part in node.values:
            if isinstance(part, ast.Constant):
                out.append(part.value)
            else:
                out.append(f"{{{n}}}")
                n += 1
        return "".join(out)
    return None


def _drawn_keyword(name: str | None) -> bool:
    """Whether a keyword argument carries a figure's text: label=, title=, ... or one named as a label or a title
    (roof_label=)."""
    return name is not None and (name in _FIGURE_KEYWORDS or bool(_FIGURE_NAMES.match(name)))


def _strings(node, drawn: bool = False) -> list[str]:
    """The texts an expression can give: a string, either branch of an `a if c else b`, a list's or tuple's items,
    each text `a + b` can join (the fields of b numbered on from a's). drawn (a figure's text): also either side of an
    `a or b`, a dict's values, what is indexed (`names[way]`), a comprehension's item, two lists joined, and a text
    joined to what is not one (`record_note(r) + "; tiny model"`: that part a field, {0})."""
    if (t := template(node)) is not None:
        return [t]
    if isinstance(node, ast.IfExp):
        return _strings(node.body, drawn) + _strings(node.orelse, drawn)
    if isinstance(node, ast.List | ast.Tuple):
        return [s for item in node.elts for s in _strings(item, drawn)]
    if drawn and isinstance(node, ast.BoolOp):  # `title or "the default"`
        return [s for value in node.values for s in _strings(value, drawn)]
    if drawn and isinstance(node, ast.Dict):
        return [s for item in node.values for s in _strings(item, drawn)]
    if drawn and isinstance(node, ast.Subscript):
        return _strings(node.value, drawn)
    if drawn and isinstance(node, ast.ListComp | ast.GeneratorExp):
        return _strings(node.elt, drawn)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        if drawn and any(isinstance(side, ast.List | ast.ListComp) for side in (node.left, node.right)):
            return _strings(node.left, drawn) + _strings(node.right, drawn)  # two lists of labels
        left, right = _strings(node.left, drawn), _strings(node.right, drawn)
        if drawn and bool(left) != bool(right):  # a text and something else: a field where the other is
            left, right = left or ["{0}"], right or ["{0}"]
        return [a + _renumbered(b, len(_FIELD.findall(a))) for a in left for b in right]
    return []


def _drawn_names(tree: ast.Module) -> dict[str | None, set[str]]:
    """The variables a figure's text is made of, by scope (as _scopes): each name read in a text-drawing call's
    arguments or a text-carrying keyword (not a function called, nor an index: `label=names[way]` draws names' values,
    not way's), and in turn each variable such a name is assigned or looped over from as it is (_held: `for way,
    (color, label) in styles.items()` draws styles' texts)."""
    values: dict[str | None, list] = {}
    binds: dict[str | None, list[tuple[ast.AST, ast.AST]]] = {}
    for scope, node in _scopes(tree):
        if isinstance(node, ast.Call):
            if getattr(node.func, "attr", getattr(node.func, "id", None)) in _FIGURE_CALLS:
                values.setdefault(scope, []).extend(node.args)
            values.setdefault(scope, []).extend(k.value for k in node.keywords if _drawn_keyword(k.arg))
        elif isinstance(node, ast.Assign):
            binds.setdefault(scope, []).extend((t, node.value) for t in node.targets)
        elif isinstance(node, ast.For):
            binds.setdefault(scope, []).append((node.target, node.iter))
    drawn = {}
    for scope, exprs in values.items():
        names, grown = _read(exprs), True
        while grown:
            more = {n for t, v in binds.get(scope, ()) if names & _read([t]) for n in _held(v)}
            grown, names = not more <= names, names | more
        drawn[scope] = names
    return drawn


def _held(value) -> set[str]:
    """The variables whose texts a value hands on as they are: a name, an item of one (`styles[way]`), its items or
    values (`styles.items()`), either branch, each of a tuple's; not what a call or a sum computes from them."""
    if isinstance(value, ast.Name):
        return {value.id}
    if isinstance(value, ast.Subscript):
        return _held(value.value)
    if isinstance(value, ast.Call) and getattr(value.func, "attr", None) in ("items", "values") and not value.args:
        return _held(value.func.value)
    if isinstance(value, ast.IfExp):
        return _held(value.body) | _held(value.orelse)
    if isinstance(value, ast.Tuple | ast.List):
        return {n for item in value.elts for n in _held(item)}
    return set()


def _read(exprs) -> set[str]:
    """The names an expression reads, but a function called by name and what indexes (a key, not a text)."""
    skip = set()
    for node in (n for v in exprs for n in ast.walk(v)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            skip.add(id(node.func))
        elif isinstance(node, ast.Subscript):
            skip.update(id(n) for n in ast.walk(node.slice))
    return {n.id for v in exprs for n in ast.walk(v) if isinstance(n, ast.Name) and id(n) not in skip}


def _assigned(target, value) -> list[tuple[str, ast.AST]]:
    """(name, expression) for each name an assignment binds: `a, b = x, y` binds a to x and b to y."""
    if isinstance(target, ast.Name):
        return [(target.id, value)]
    if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts):
        return [pair for t, v in zip(target.elts, value.elts) for pair in _assigned(t, v)]
    return []


def _looped(node: ast.For) -> list[tuple[str, ast.AST]]:
    """(name, expression) for each name a loop over a written-out list or tuple binds, item by item."""
    if not isinstance(node.iter, ast.List | ast.Tuple):
        return []
    return [pair for item in node.iter.elts for pair in _assigned(node.target, item)]


def _renumbered(text: str, start: int) -> str:
    """text's fields {0}, {1}, ... as {start}, {start + 1}, ...: the part after another text's fields."""
    return _FIELD.sub(lambda m: f"{{{int(m.group()[1:-1]) + start}}}", text)


def _scopes(tree: ast.Module):
    """(outermost function's name or None, node) for every node of a module."""
    for top in tree.body:
        name = top.name if isinstance(top, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) else None
        for node in ast.walk(top):
            yield name, node


def english_texts(rel: str, source: str) -> dict[str, set[str]]:
    """The texts of one source file the catalogue translates, by scope ("rel::function", or rel at module level):
    every tr() call's text; in kvlib/checks/ each @check function's docstring's first paragraph (as its verdict
    line shows it) and every assert's or raise's message; in the exercises' input checks (_INPUTS) every raise's
    message (in the functions named); in the figures' files and the notebooks each text drawn on
    a figure (_FIGURE_CALLS, _FIGURE_KEYWORDS, _FIGURE_NAMES, and what is assigned or looped over into a variable
    they draw: _drawn_names) and the words a notebook hands a claim's verdict (_VERDICTS); in kvlib/course/claims.py
    each sentence of a verdict (_sentences)."""
    tree = ast.parse(source)
    checks, figures = rel.startswith("kvlib/checks/"), rel.startswith(_FIGURES) or rel.endswith(".ipynb")
    sentences = rel == _CLAIMS
    drawn = _drawn_names(tree) if figures else {}
    found: dict[str, set[str]] = {}

    def add(scope, texts):
        for t in texts:
            if t and _WORDS.search(_FIELD.sub("", t)):  # a field alone, or a format, is nothing to translate
                found.setdefault(f"{rel}::{scope}" if scope else rel, set()).add(t)

    for scope, node in _scopes(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "tr":
            if node.args and (t := template(node.args[0])) is not None:
                add(scope, [t])
        if checks or (rel in _INPUTS and _INPUTS[rel] is None):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                add(scope, [s for a in node.exc.args for s in _strings(a)])
        if isinstance(node, ast.FunctionDef) and node.name in (_INPUTS.get(rel) or ()):
            raises = [n for n in ast.walk(node) if isinstance(n, ast.Raise) and isinstance(n.exc, ast.Call)]
            add(scope, [s for n in raises for a in n.exc.args for s in _strings(a)])
        if checks:
            if isinstance(node, ast.FunctionDef) and any(
                isinstance(d, ast.Call) and getattr(d.func, "id", None) == "check" for d in node.decorator_list
            ):
                add(scope, [first_paragraph(ast.get_docstring(node))])
            if isinstance(node, ast.Assert) and node.msg is not None:
                add(scope, _strings(node.msg))
        if figures:
            if isinstance(node, ast.Call):
                name = getattr(node.func, "attr", getattr(node.func, "id", None))
                if name in _FIGURE_CALLS:
                    add(scope, [s for a in node.args for s in _strings(a, True)])
                add(scope, [s for k in node.keywords if _drawn_keyword(k.arg) for s in _strings(k.value, True)])
                if name in _VERDICTS and getattr(node.func.value, "id", None) == "claims":  # claims.compare(...)
                    words = node.args[2:] + [k.value for k in node.keywords if k.arg in _VERDICT_KEYWORDS]
                    add(scope, [s for a in words for s in _strings(a, True)])
            if isinstance(node, ast.FunctionDef):
                args = node.args.args[-len(node.args.defaults) :] if node.args.defaults else []
                pairs = list(zip(args, node.args.defaults)) + list(zip(node.args.kwonlyargs, node.args.kw_defaults))
                add(scope, [s for a, d in pairs if d is not None and _FIGURE_NAMES.match(a.arg) for s in _strings(d)])
            bound = _assigned(node.targets[0], node.value) if isinstance(node, ast.Assign) else []
            bound += _looped(node) if isinstance(node, ast.For) else []
            add(
                scope,
                [s for n, v in bound if _FIGURE_NAMES.match(n) or n in drawn.get(scope, ()) for s in _strings(v, True)],
            )
        if sentences and isinstance(node, ast.FunctionDef) and node in tree.body:
            add(scope, _sentences(node))
            pairs = list(zip(node.args.kwonlyargs, node.args.kw_defaults))
            add(scope, [s for a, d in pairs if d is not None and a.arg in _VERDICT_KEYWORDS for s in _strings(d)])
    return found


def _sentences(function: ast.FunctionDef) -> list[str]:
    """Every sentence a verdict function can say (`text = f"{head}: {tail}"`, each part as the function assigns it):
    whole, and line by line as a figure's title breaks it after the colon (the head with it, the tail alone)."""
    parts: dict[str, list[str]] = {}
    for node in ast.walk(function):
        if isinstance(node, ast.Assign):
            for name, value in _assigned(node.targets[0], node.value):
                if name in _SENTENCE:
                    parts.setdefault(name, []).extend(_strings(value, True))
    out = list(parts.get("tail", []))
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "text":
            pieces = node.value.values if isinstance(node.value, ast.JoinedStr) else []
            joined = [""]
            for piece in pieces:  # a literal as it is, a part as the function words it, anything else a field
                if isinstance(piece, ast.Constant):
                    options = [piece.value]
                else:
                    options = parts.get(getattr(piece.value, "id", None)) or ["{0}"]
                joined = [a + _renumbered(b, len(_FIELD.findall(a))) for a in joined for b in options]
            out += joined
            if any(isinstance(p, ast.Constant) and p.value.startswith(":") for p in pieces):
                out += [head + ":" for head in parts.get("head", [])]
    return out


def message_sources() -> list[tuple[str, str]]:
    """The code whose texts the catalogue translates, [(path under the clone, Python source)]: kvlib's modules that
    call tr(), the checks, the exercises' input checks, the figures, the claims' verdicts, and the code cells of each
    solution notebook as one source (titles handed to a figure, words handed to a claim's verdict, the variables they
    are made of, which an earlier cell may set)."""
    files = []
    for path in sorted((ROOT / "kvlib").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        text = path.read_text(encoding="utf-8")
        if rel.startswith(("kvlib/checks/", _FIGURES)) or rel in _INPUTS or rel == _CLAIMS or "tr(" in text:
            files.append((rel, text))
    for nb in english_notebooks():
        cells = [_text(c) for c in json.loads(nb.read_text(encoding="utf-8"))["cells"] if c["cell_type"] == "code"]
        lines = [ln for cell in cells for ln in [*cell.splitlines(), ""] if not ln.lstrip().startswith(("%", "!"))]
        files.append((nb.relative_to(ROOT).as_posix(), "\n".join(lines)))
    return files


def english_messages() -> dict[str, set[str]]:
    """{scope: English texts} over every source of message_sources()."""
    found: dict[str, set[str]] = {}
    for rel, source in message_sources():
        for scope, texts in english_texts(rel, source).items():
            found.setdefault(scope, set()).update(texts)
    return found


@dataclass
class CatalogueStatus:
    lang: str
    complete: list[str] = field(default_factory=list)  # scopes translated in full, from today's English
    missing: list[str] = field(default_factory=list)  # scopes with no entry in the catalogue
    stale: dict[str, list[str]] = field(default_factory=dict)  # scope -> its problems


def catalogue_status(lang: str, english_found: dict[str, set[str]] | None = None) -> CatalogueStatus:
    """Where a language's message catalogue stands, scope by scope: a scope it names must translate every English
    text the scope has today, and only those, keeping each one's fields ({0} or {name}); the others are missing."""
    english_found = english_messages() if english_found is None else english_found
    have = i18n.catalogue(lang)
    out = CatalogueStatus(lang)
    for scope in sorted(set(english_found) | set(have)):
        if scope not in have:
            out.missing.append(scope)
            continue
        problems = []
        if scope not in english_found:
            problems.append(f"{scope}: no such place in the code has texts to translate")
        texts = english_found.get(scope, set())
        problems += [f"{scope}: not translated: {t!r}" for t in sorted(texts - set(have[scope]))]
        problems += [f"{scope}: its English is gone from the code: {t!r}" for t in sorted(set(have[scope]) - texts)]
        for en, translated in have[scope].items():
            if en in texts and not translated:
                problems.append(f"{scope}: empty translation of {en!r}")
            elif en in texts and _fields(en) != _fields(translated):
                problems.append(f"{scope}: {translated!r} has fields {_fields(translated)}, its English {_fields(en)}")
        if problems:
            out.stale[scope] = problems
        else:
            out.complete.append(scope)
    return out


def _fields(text: str) -> list[str]:
    return sorted(set(re.findall(r"(?<!\{)\{([\w]*)[^{}]*\}(?!\})", text)))


# ---------------------------------------------------------------------------------------------
# `kvlib course translate`


def report(lang: str, missing: bool = False) -> tuple[list[str], bool]:
    """What `kvlib course translate` prints for a language, and whether everything translated is in sync
    (missing: list every place of the code whose messages have no translation, not only how many)."""
    lines, ok = [f"Notebooks ({_rel(TRANSLATIONS / lang)}):"], True
    terms = glossary_terms()
    for s in statuses(lang):
        lines += ["  " + ln for ln in s.lines()]
        ok &= s.state != "stale"
        if s.state != "missing":
            quality = quality_problems(s.notebook, lang, terms)
            lines += [f"    {q}" for q in quality]
            ok &= not quality
    hint = hints.translation_status(lang)
    by = {k: [ex for ex, s in hint.items() if s == k] for k in ("fresh", "stale", "missing")}
    lines.append(f"Hints ({_rel(hints.translation_dir(lang))}): {len(by['fresh'])} of {len(hint)} exercises translated")
    lines += [f"  {ex}: stale: its English hints changed since they were translated" for ex in by["stale"]]
    if by["missing"]:
        lines.append(f"  missing: {', '.join(by['missing'])}")
    quality = hint_problems(lang, terms)
    lines += [f"  {q}" for q in quality]
    ok &= not by["stale"] and not quality
    cat = catalogue_status(lang)
    lines.append(
        f"Messages ({_rel(i18n.catalogue_file(lang))}): {len(cat.complete)} of "
        f"{len(cat.complete) + len(cat.missing) + len(cat.stale)} places translated"
    )
    lines += [f"  {p}" for problems in cat.stale.values() for p in problems]
    if cat.missing and missing:
        lines += [f"  missing: {scope}" for scope in cat.missing]
    elif cat.missing:
        lines.append(f"  missing: {len(cat.missing)} places (kvlib course translate --missing lists them)")
    ok &= not cat.stale
    return lines, ok
