"""The learner's tools in more than one language: which one (KVLIB_LANG), and the translated lines they print.

English is the default and the source of every text; zh-CN (简体中文) is the second language. One switch:
KVLIB_LANG=zh-CN, which `kvlib lab --lang zh-CN` sets for JupyterLab and so for every notebook's kernel.
  locale/<lang>/messages.json    {scope: {English: translation}}: the commands' own lines (tr), the checks'
                                 failure messages and docstrings, the input checks' errors (kvlib/course/inputs.py),
                                 the figures' titles and labels (translate)
  locale/<lang>/hints/<module>.md  the hints (kvlib.course.hints reads them)
A scope is where the English lives ("kvlib/checks/attention.py::softmax_is_stable", "kvlib/course/hints.py").
An English text is a str.format template for tr ("hint {level} of {n}") and, for what the code words with an
f-string, a template whose {0}, {1}, ... stand for its replacement fields in order: a message is translated
when it is one of them with the fields filled in. A translation whose English no longer exists in the code is
never shown (tests/test_translations.py names it); what has no translation is shown in English.
Not here: the notebooks' translations (kvlib/app/translate.py), which only the course's build reads.
"""

from __future__ import annotations

import functools
import json
import os
import re
from pathlib import Path

LANGUAGES = ("en", "zh-CN")
DEFAULT = "en"
ENV = "KVLIB_LANG"
LOCALE_DIR = Path(__file__).resolve().parent / "locale"
_FIELD = re.compile(r"\{(\d+)\}")  # a replacement field of an f-string's template
HINT_SECTION = re.compile(r"^## (\d+\.\d+) (\S.*?)\s*$")  # a hint file's section heading: "## X.Y title"
TRANSLATION_MARK = re.compile(r"^(.*?)\s*<!-- sha256:([0-9a-f]{12}) -->$")  # a translated heading's English hash


def language() -> str:
    """The language of the learner's tools: KVLIB_LANG ("en" or "zh-CN"), English when unset or empty.

    Raises ValueError naming the value and the languages there are.
    """
    lang = os.environ.get(ENV, "").strip() or DEFAULT
    if lang not in LANGUAGES:
        raise ValueError(f"{ENV}={lang!r} is not a language of the course: use one of {', '.join(LANGUAGES)}")
    return lang


def hint_title(exercise_id: str, english: str, lang: str | None = None) -> str:
    """An exercise's title as the learner's language's hints spell it (locale/<lang>/hints/*.md, read as they are,
    fresh or stale), else `english`: the label of a message, read without the hints' machinery (kvlib.course.hints,
    which imports the exercise table and so cannot serve kvlib.course.exercises)."""
    lang = lang or language()
    if lang == DEFAULT:
        return english
    for file in sorted((LOCALE_DIR / lang / "hints").glob("*.md")):
        for line in file.read_text(encoding="utf-8").splitlines():
            if (m := HINT_SECTION.match(line)) and m.group(1) == exercise_id:
                mark = TRANSLATION_MARK.match(m.group(2))
                return mark.group(1) if mark else m.group(2)
    return english


def catalogue_file(lang: str) -> Path:
    return LOCALE_DIR / lang / "messages.json"


@functools.lru_cache(maxsize=None)
def catalogue(lang: str) -> dict[str, dict[str, str]]:
    """{scope: {English: translation}} of one language; {} for English or a language without a catalogue."""
    path = catalogue_file(lang)
    if lang == DEFAULT or not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    bad = [s for s, entries in data.items() if not isinstance(entries, dict)]
    if bad:
        raise ValueError(f"{path}: scope {bad[0]!r} should map English texts to translations")
    return data


@functools.lru_cache(maxsize=None)
def _tables(lang: str) -> tuple[dict[str, str], list[tuple[re.Pattern, str, int]]]:
    """The catalogue as one lookup: exact texts, and the templates with fields as patterns (most literal first)."""
    exact, patterns = {}, []
    for entries in catalogue(lang).values():
        for en, translated in entries.items():
            if not translated:
                continue  # an entry not yet translated: the English shows
            exact[en] = translated
            parts = _FIELD.split(en)
            if len(parts) > 1:  # literal, field, literal, ...: the literals must match as they are
                literal = "".join(parts[0::2])
                pattern = "".join(re.escape(p) if i % 2 == 0 else f"(?P<f{p}>.*?)" for i, p in enumerate(parts))
                patterns.append((re.compile(pattern, re.DOTALL), translated, len(literal)))
    patterns.sort(key=lambda p: -p[2])
    return exact, patterns


def tr(english: str, /, **fields) -> str:
    """english (a str.format template) in the learner's language, its fields filled in.

    Example: tr("hint {level} of {n}", level=1, n=3) -> "hint 1 of 3"; with KVLIB_LANG=zh-CN "第 1 条提示（共 3 条）"
    """
    lang = language()
    translated = _tables(lang)[0].get(english, english) if lang != DEFAULT else english
    return translated.format(**fields) if fields else translated


def translate(message: str, lang: str | None = None) -> str:
    """A whole message the English code made, in the learner's language: the translation of the text it is, or of
    the template whose literal parts it matches (the most specific), its field values translated in turn where the
    catalogue has them (a label "memory" filled into "{0}-bound", a verdict filled into a title); else unchanged.

    Example (zh-CN): translate("memory-bound: 12 tokens/s predicted") -> "访存受限：预测每秒 12 个词元", by the
    template "{0}-bound: {1} tokens/s predicted" and the text "memory"
    """
    lang = lang or language()
    if lang == DEFAULT or not message:
        return message
    exact, patterns = _tables(lang)
    if message in exact:
        return exact[message]
    for pattern, translated, _ in patterns:
        if m := pattern.fullmatch(message):  # a template's literal is never empty: each field is shorter than message
            return _FIELD.sub(lambda f: translate(m.group(f"f{f.group(1)}") or "", lang), translated)
    return message


def display_width(text: str) -> int:
    """Columns a text takes in a terminal: a Chinese character takes two."""
    import unicodedata  # noqa: PLC0415 (start-up time: only tables of Chinese text need it)

    return sum(2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1 for ch in text)


def wrap(text: str, width: int) -> list[str]:
    """text in lines of at most `width` terminal columns, broken at spaces or between two Chinese characters (as
    textwrap.wrap does for text without them, which it counts one column a character)."""
    if display_width(text) == len(text):
        import textwrap  # noqa: PLC0415 (start-up time: only `kvlib check` wraps)

        return textwrap.wrap(text, width)
    lines, line = [], ""
    for token in re.findall(
        r"[\u2e80-\u9fff\uf900-\ufaff\uff00-\uffef]|[^\s\u2e80-\u9fff\uf900-\ufaff\uff00-\uffef]+|\s+", text
    ):
        if line.strip() and display_width(line.rstrip() + token.rstrip()) > width:
            lines.append(line.rstrip())
            line = token.lstrip()
        else:
            line += token
    return lines + ([line.rstrip()] if line.strip() else [])


def ljust(text: str, width: int) -> str:
    """text padded with spaces to `width` terminal columns (str.ljust counts a Chinese character as one)."""
    return text + " " * max(0, width - display_width(text))
