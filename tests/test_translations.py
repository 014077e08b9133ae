"""The course in Chinese (zh-CN), built from the English sources: translations that cannot go stale, the glossary's
terms, the learner's tools in the language (kvlib/app/translate.py, kvlib/course/i18n.py, kvlib/course/hints.py).

Elsewhere, so as to reuse runs the suite makes anyway: the whole release, translated notebooks included, is
tests/test_course.py's (one nbgrader run); a Chinese submission graded with the English ones, the same scores, is
tests/grading/test_attacks.py's; a Chinese notebook in JupyterLab's zh-CN interface is tests/test_browser.py's.
"""

from __future__ import annotations

import functools
import importlib
import json
import re

import numpy as np
import pytest
from conftest import ROOT, check_failures
from matplotlib.text import Text

from kvlib.app import cli, lab, translate
from kvlib.app.release import label
from kvlib.course import hints, i18n, plotting
from kvlib.course.exercises import BY_ID, LEARNER_MODULES, ExerciseNotDone
from kvlib.course.figures import style

ZH = "zh-CN"
TRANSLATED = [s.notebook for s in translate.statuses(ZH) if s.state != "missing"]


@pytest.fixture
def fresh_caches():
    """Catalogues and hint translations read again (a test points them at files of its own)."""
    i18n.catalogue.cache_clear()
    i18n._tables.cache_clear()
    hints._fresh.cache_clear()
    yield
    i18n.catalogue.cache_clear()
    i18n._tables.cache_clear()
    hints._fresh.cache_clear()


@pytest.fixture
def chinese(monkeypatch, fresh_caches):
    monkeypatch.setenv(i18n.ENV, ZH)


# ---------------------------------------------------------------------------------------------
# Notebooks: translations beside the sources, never stale


@pytest.mark.parametrize("notebook", translate.english_notebooks(), ids=label)
def test_notebook_translation_is_of_todays_english(notebook):
    """Check that a notebook's translation, where there is one, translates today's English of every markdown cell
    (none changed since, none left out, none of a cell that is gone); a notebook not yet translated is listed as a
    skip, not failed (the English text is being rewritten: the translations follow it)."""
    s = translate.status(notebook, ZH)
    if s.state == "missing":
        pytest.skip(f"{label(notebook)} is not translated into {ZH} yet: `kvlib course translate` lists the notebooks")
    assert s.state == "complete", (
        "\n".join(s.lines()) + f"\ntranslate these cells in {translate._rel(translate.translation_file(notebook, ZH))}"
    )


def _notebook(*cells) -> dict:
    out = []
    for i, (kind, cell_id, text) in enumerate(cells):
        cell = {"cell_type": kind, "id": cell_id, "metadata": {}, "source": text.splitlines(keepends=True)}
        if kind == "code":
            cell |= {"outputs": [], "execution_count": None}
        out.append(cell)
    return {"cells": out, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def test_a_changed_english_cell_is_named_and_shown_in_english(tmp_path, monkeypatch):
    """Check that editing an English markdown cell makes its translation stale, named by cell id, and that the
    translated notebook then shows that cell's English under a note, the other cells translated, every code cell and
    id as in English, the header line in Chinese with the English numbers and its link one folder deeper."""
    monkeypatch.setattr(translate, "TRANSLATIONS", tmp_path / "translations")
    path = tmp_path / "solutions" / "99-test" / "test.ipynb"
    path.parent.mkdir(parents=True)
    header = "**Time:** core about 41 minutes ([estimated](../../docs/instructors.md#x) for a careful learner)."
    nb = _notebook(
        ("markdown", "title", f"# 99 · A test\n\n{header}\n\nOne token, then [the glossary](../../docs/glossary.md)."),
        ("code", "setup", "x = 1\n"),
        ("markdown", "prose", "Two keys and a `mask`."),
    )
    path.write_text(json.dumps(nb))
    english = translate.english_cells(nb)
    assert english["title"] == "# 99 · A test\n\nOne token, then [the glossary](../../docs/glossary.md)."
    assert translate.status(path, ZH, nb).state == "missing"
    file = translate.translation_file(path, ZH)
    file.parent.mkdir(parents=True)
    body = {
        "title": "# 99 · 一个测试\n\n一个词元，然后是[术语表](../../docs/glossary.md)。",
        "prose": "两个键和一个 `mask`。",
    }
    file.write_text(
        "<!-- a note -->\n\n"
        + "\n\n".join(f"<!-- cell {c} sha256:{translate.cell_hash(english[c])} -->\n{t}" for c, t in body.items())
    )
    assert translate.status(path, ZH, nb).state == "complete"
    built = translate.translated_notebook(path, ZH, nb)
    title = "".join(built["cells"][0]["source"])
    assert (
        title.startswith("# 99 · 一个测试\n\n**时间：** 核心部分约 41 分钟")
        and "](../../../docs/instructors.md#x)" in title
    )
    assert "[术语表](../../../docs/glossary.md)" in title
    assert [c["id"] for c in built["cells"]] == ["title", "setup", "prose"] and built["cells"][1] == nb["cells"][1]
    assert built["metadata"]["kvlib"]["lang"] == ZH

    nb["cells"][2]["source"] = ["Three keys and a `mask`."]
    s = translate.status(path, ZH, nb)
    assert (s.state, s.stale) == ("stale", ["prose"]) and "cell prose: its English changed" in "\n".join(s.lines())
    stale = "".join(translate.translated_notebook(path, ZH, nb)["cells"][2]["source"])
    assert stale == f"{translate.STALE_NOTE[ZH]}\n\nThree keys and a `mask`."
    nb["cells"].append({"cell_type": "markdown", "id": "new", "metadata": {}, "source": ["More."]})
    del nb["cells"][0]
    s = translate.status(path, ZH, nb)
    assert (s.untranslated, s.gone) == (["new"], ["title"])


def test_translated_notebooks_keep_every_code_cell_id_and_grade():
    """Check that each translated notebook, solution and learner, holds the English one's cells in order: the same
    ids and types, code cells and their nbgrader metadata identical (so the same autograde grades both), markdown
    cells' metadata the same but for nbgrader's checksum of their text."""
    if not TRANSLATED:
        pytest.skip(f"no notebook is translated into {ZH} yet")
    for notebook in TRANSLATED:
        rel = notebook.relative_to(ROOT / "solutions")
        for folder in ("solutions", "notebooks"):
            en = json.loads((ROOT / folder / rel).read_text(encoding="utf-8"))
            zh = json.loads((ROOT / folder / ZH / rel).read_text(encoding="utf-8"))
            assert [(c["id"], c["cell_type"]) for c in zh["cells"]] == [(c["id"], c["cell_type"]) for c in en["cells"]]
            for a, b in zip(en["cells"], zh["cells"]):
                if a["cell_type"] == "code":
                    assert a["source"] == b["source"] and a["metadata"] == b["metadata"], f"{folder}/{rel} {a['id']}"
                else:
                    strip = lambda m: {k: v for k, v in m.get("nbgrader", {}).items() if k != "checksum"}  # noqa: E731
                    assert strip(a["metadata"]) == strip(b["metadata"]), f"{folder}/{rel} {a['id']}"
            assert zh["metadata"]["kvlib"]["lang"] == ZH


def test_translated_cells_use_the_glossarys_terms_and_keep_numbers_and_code():
    """Check that every translated cell uses the glossary's Chinese term (either, where it gives two) for each glossary
    term its English uses, and keeps every number of the English prose and every code span."""
    if not TRANSLATED:
        pytest.skip(f"no notebook is translated into {ZH} yet")
    terms = translate.glossary_terms()
    problems = [p for notebook in TRANSLATED for p in translate.quality_problems(notebook, ZH, terms)]
    assert not problems, "\n".join(problems)


def test_the_glossary_pairs_each_english_term_with_its_chinese():
    """Check that docs/glossary.md's tables parse into terms: a row's English list paired with its Chinese list in
    order, both Chinese terms kept where it gives two, the English column's parentheses left out."""
    terms = {t.english: t.chinese for t in translate.glossary_terms()}
    assert len(terms) > 100
    assert terms["query"] == ("查询",) and terms["value"] == ("值",)
    assert terms["time to first token"] == ("首字延迟", "首词元时延")
    assert terms["softmax"] == ("softmax", "归一化指数函数") and terms["GEMV"] == ("矩阵向量乘",)
    assert terms["saturate"] == ("饱和",) and all(terms.values())


def test_term_and_content_problems_name_what_a_translation_lost():
    """Check the checks a translated cell is held to: a glossary term in any number or case its English uses, a term
    the cell marks as meant otherwise, numbers (1,555 as 1555 too) and code spans, and text left in English."""
    terms = [t for t in translate.glossary_terms() if t.english in ("KV cache", "scores", "batch", "kernel")]
    en = "The KV cache holds 1,555 GB; each score is read per batch with `q @ k.T`, twice."
    assert translate.term_problems(en, "KV 缓存保存 1555 GB；每个注意力分数按批次读取", terms) == []
    assert translate.term_problems(en, "缓存保存 1555 GB；每个分数按批读取", terms) == [
        "'batch' should be 批次",
        "'KV cache' should be KV 缓存",
        "'scores' should be 注意力分数",
    ]  # in the glossary's order
    assert translate.term_problems("the kv cache of a batch", "缓存", terms, ("batch",)) == []  # case kept: KV
    assert translate.content_problems(en, "KV 缓存保存 1555 GB，`q @ k.T`，读两次。") == []
    assert translate.content_problems(en, "KV 缓存保存 GB，读两次。") == [
        "the number 1555 is not in the translation",
        "the code `q @ k.T` is not in the translation",
    ]
    assert translate.content_problems("Read the keys and the values.", "Read the keys and the values.") == [
        "it reads as untranslated: 0 Chinese characters for 6 English words"
    ]


def test_links_of_a_translated_notebook_point_one_folder_deeper():
    """Check that a translated notebook's links reach what the English ones reach, from notebooks/zh-CN/NN-topic/: the
    README's translation where there is one, a notebook's translation where there is one, else the English file;
    web links and anchors unchanged."""
    text = "[g](../../docs/glossary.md#x) [r](../../README.md) [n](../02-generation/generation.ipynb) [w](https://a.b) [a](#c)"
    two = (
        "../02-generation/generation.ipynb"
        if (ROOT / "translations" / ZH / "02-generation").is_dir()
        else ("../../02-generation/generation.ipynb")
    )
    assert translate.rewrite_links(text, "solutions/01-attention", ZH) == (
        f"[g](../../../docs/glossary.md#x) [r](../../../README.zh-CN.md) [n]({two}) [w](https://a.b) [a](#c)"
    )


def test_translated_documents_translate_todays_english():
    """Check that README.zh-CN.md's sections are marked with the English section each translates (set-up, the
    instructors' quick start) and that none has changed since."""
    docs = translate.translated_documents()
    assert ROOT / "README.zh-CN.md" in docs
    problems = [p for doc in docs for p in translate.document_problems(doc)]
    assert not problems, "\n".join(problems)
    marked = {m.group(2) for m in translate.DOC_MARKER.finditer((ROOT / "README.zh-CN.md").read_text(encoding="utf-8"))}
    assert marked >= {"set-up", "for-instructors"}


# ---------------------------------------------------------------------------------------------
# The learner's tools: messages, hints, figures, JupyterLab


def test_message_catalogue_translates_todays_english():
    """Check that each place of the code the zh-CN catalogue names is translated in full from today's English (a
    text changed or gone is named), every translation keeping its English's fields, the same English translated
    the same everywhere; the places not yet translated are listed, not failed."""
    status = translate.catalogue_status(ZH)
    assert not status.stale, "\n".join(p for problems in status.stale.values() for p in problems)
    assert "kvlib/course/hints.py::show" in status.complete and "kvlib/app/cli.py::_table" in status.complete
    assert {"kvlib/course/inputs.py::float_array", "kvlib/course/inputs.py::check_verify"} <= set(status.complete)
    seen: dict[str, tuple[str, str]] = {}
    for scope, entries in i18n.catalogue(ZH).items():
        for en, zh in entries.items():
            assert seen.setdefault(en, (scope, zh))[1] == zh, (
                f"{en!r}: {seen[en][0]} says {seen[en][1]!r}, {scope} {zh!r}"
            )


def test_chinese_messages_fill_in_their_fields_and_the_rest_stays_english(chinese, monkeypatch):
    """Check tr() and translate() with KVLIB_LANG=zh-CN: named fields, an f-string's template matched with its fields
    moved, a message without a translation unchanged; English by default; an unknown language a clear error."""
    assert hints.stuck("1.1") == "（卡住了？运行 kvlib hint 1.1）"
    assert (
        i18n.translate("still running after 3.5 s: look for an endless loop")
        == "运行 3.5 秒后仍未结束：检查是否有死循环"
    )
    assert i18n.translate("Most weight on AI (58%)") == "权重最大的是 AI（58%）"
    assert i18n.translate("nothing we translate") == "nothing we translate"
    monkeypatch.delenv(i18n.ENV)
    assert hints.stuck("1.1") == "(stuck? kvlib hint 1.1)"
    monkeypatch.setenv(i18n.ENV, "fr")
    with pytest.raises(ValueError, match=r"KVLIB_LANG='fr' is not a language of the course: use one of en, zh-CN"):
        i18n.language()


@functools.cache
def _catalogue_status() -> translate.CatalogueStatus:
    return translate.catalogue_status(ZH)  # reads every source of the catalogue's texts: once for all modules


def _checks_translated(module: str) -> bool:
    """Whether every place of kvlib/checks/<module>.py that has texts is translated in full from today's English."""
    status = _catalogue_status()
    places = [
        s for s in [*status.complete, *status.missing, *status.stale] if s.startswith(f"kvlib/checks/{module}.py")
    ]
    return bool(places) and set(places) <= set(status.complete)


_ENGLISH_RUN = re.compile(r"(?:[A-Za-z]{2,}[,.;:!?]?\s+){2,}[A-Za-z]{2,}")  # three English words in a row


@pytest.mark.parametrize("module", LEARNER_MODULES)
def test_slips_are_named_in_chinese(module, chinese):
    """Check that once a module's check messages are translated, each likely slip that tests/test_<module>.py names
    (SLIPS) fails with a message that reads in Chinese as `kvlib check` shows it, the texts it is built from (which
    input, what the slip is called) translated too: no run of three English words is left, but in an error that the
    learner's own code raised (torch's, quoted)."""
    if not _checks_translated(module):
        pytest.skip(f"kvlib/checks/{module}.py's messages are not translated into {ZH} yet")
    tests = importlib.import_module(f"test_{module}")
    left = []
    for where, replaced, *rest in tests.SLIPS:
        if isinstance(replaced, str):  # (exercise, function's name, the slip, words): notebooks 09 and 10's shape
            replaced = {replaced: rest[0]}
        with np.errstate(all="ignore"):
            failures = check_failures(where, tests._module(**replaced))
        assert failures, f"{where} passed a wrong implementation"
        name, err = failures[0]
        if not isinstance(err, AssertionError):
            continue  # raised in the learner's code, in its own words
        shown = i18n.translate(str(err))  # as kvlib check and the graded cells show a check's message
        if err.__cause__ is not None:
            shown = shown.replace(str(err.__cause__), " ")
        left += [f"{name}: {run!r} in {shown!r}" for run in _ENGLISH_RUN.findall(shown)]
    assert not left, "English left in translated messages:\n" + "\n".join(left)


def test_kvlib_check_and_hint_in_chinese(chinese, capsys, monkeypatch, learner_mode, tmp_path):
    """Check `kvlib check` and `kvlib hint` with KVLIB_LANG=zh-CN: the table's headings, status and message in
    Chinese, columns counted as a terminal shows them; a hint not yet translated shown in English under a line that
    says so; KVLIB_LANG=fr a one-line error, exit 2."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "100")
    assert cli.main(["check", "1.1"]) == 1
    out = capsys.readouterr().out
    assert "编号  状态" in out and "待完成" in out and "尚未开始：请在 kvlib/attention.py 中实现 softmax" in out
    assert "1 个练习中有 0 个通过" in out
    assert cli.main(["hint", "1.1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("（这些提示还没有中文版，以下是英文原文。）") or out.startswith("练习 1.1")
    assert "提示 1/" in out and "（下一条：kvlib hint 1.1）" in out
    monkeypatch.setenv(i18n.ENV, "fr")
    assert cli.main(["check", "1.1"]) == 2
    assert (
        capsys.readouterr().err.strip()
        == "kvlib check: KVLIB_LANG='fr' is not a language of the course: use one of en, zh-CN"
    )


def test_an_unfinished_exercise_is_named_in_chinese(chinese, learner_mode):
    """Check that with KVLIB_LANG=zh-CN the error a notebook cell shows when it calls an unfinished exercise, and the
    one naming the earlier exercise to do first, read in Chinese, each exercise by its translated hints' title."""
    import kvlib.attention

    with pytest.raises(ExerciseNotDone) as err:
        kvlib.attention.softmax(np.zeros((2, 3)))
    title = hints.exercise_title(BY_ID["1.1"])
    assert title != BY_ID["1.1"].title
    assert (
        str(err.value) == f"练习 1.1（{title}）还没有完成：请实现 softmax（kvlib/attention.py, notebooks/01-attention）"
    )
    first, later = (hints.exercise_title(BY_ID[i]) for i in ("1.2", "2.4"))
    assert str(ExerciseNotDone(BY_ID["1.2"], BY_ID["2.4"])) == (
        f"练习 2.4（{later}）用到了练习 1.2（{first}），而它还没有完成：请先完成练习 1.2（kvlib/attention.py, "
        "notebooks/01-attention）"
    )


def test_bad_input_is_named_in_chinese(chinese, monkeypatch, learner_mode):
    """Check that the exercises' input checks (kvlib/course/inputs.py) name bad input in the learner's language, as
    a notebook cell, `kvlib check` and the grader's feedback show it: with KVLIB_LANG=zh-CN in Chinese with the same
    shapes and numbers (a check's own message, a helper's, the model's check of token ids that 2.2's calls, a check
    a shipped function calls), raised as a ValueError; in English as the code words it."""
    import torch

    import kvlib.attention
    import kvlib.fused
    import kvlib.generation
    from kvlib.core.model import Decoder, ModelConfig

    model = Decoder(ModelConfig(vocab_size=5, d_model=8, n_layers=1, n_heads=2, n_kv_heads=2, hidden_dim=8))

    def error(fn, *args) -> str:
        with pytest.raises(ValueError) as err:
            fn(*args)
        return str(err.value)

    cases = [
        (kvlib.attention.attend, (np.zeros(4), np.zeros((3, 5)), np.zeros((3, 2)))),
        (kvlib.attention.softmax, ([1.0, 2.0],)),
        (kvlib.generation.rms_norm, (torch.zeros(2, 8), torch.ones(7))),
        (kvlib.attention.causal_mask, (5, 3)),
        (kvlib.generation.generate, (model, torch.tensor([[1, 7]]), 2)),  # the model's own check, through 2.2's
        (kvlib.fused.flash_decode, (*[torch.zeros(1, 2, 1, 4)] * 3, 0)),  # not an exercise: it calls a check
    ]
    chinese = [error(fn, *args) for fn, args in cases]
    assert chinese == [
        "k 必须是 (kv_len, 4)，才能与形状为 (4,) 的 q 匹配，得到的却是 (3, 5)",
        "scores 必须是 numpy 数组，得到的却是 list",
        "weight 必须是 (8,)，x (2, 8) 的每个特征一个缩放系数，得到的却是 (7,)",
        "新查询的个数 seq_len（5）不能多于键的个数 kv_len（3）",
        "词元 id 必须在 [0, 5) 内，得到的值却在 1 到 7 之间",
        "chunk 必须是正整数（每个块或分块的词元数），得到的却是 0",
    ]
    monkeypatch.delenv(i18n.ENV)
    assert [error(fn, *args) for fn, args in cases] == [
        "k must be (kv_len, 4) to match q of shape (4,), got (3, 5)",
        "scores must be a numpy array, got list",
        "weight must be (8,), one scale per feature of x (2, 8), got (7,)",
        "seq_len (5) new queries cannot outnumber kv_len (3) keys",
        "token ids must lie in [0, 5), got values 1 to 7",
        "chunk must be a positive int (tokens per tile or chunk), got 0",
    ]


def test_translated_hints_are_shown_only_while_fresh(chinese, monkeypatch, tmp_path, learner_mode):
    """Check a hint translation: shown (its title in `kvlib check` too) while its hash is that of today's English
    section; once the English changes, named stale, and the English shown instead, under the note."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / ZH / "hints").mkdir(parents=True)
    (tmp_path / ZH / "messages.json").write_bytes(i18n.catalogue_file(ZH).read_bytes())
    monkeypatch.setattr(i18n, "LOCALE_DIR", tmp_path)
    english = hints.load()["1.1"]
    levels = "\n".join(f"{i}. 第 {i} 条" for i in range(1, len(english.levels) + 1))
    file = tmp_path / ZH / "hints" / "attention.md"
    file.write_text(
        f"# Hints for kvlib/attention.py (notebook 01)\n\n## 1.1 稳定的 softmax <!-- sha256:{hints.section_hash(english)} -->\n{levels}\n"
    )
    assert hints.translation_status(ZH)["1.1"] == "fresh" and hints.translation_status(ZH)["1.2"] == "missing"
    assert hints.show("1.1", level=1).startswith(f"练习 1.1（稳定的 softmax），提示 1/{len(english.levels)}")
    assert hints.exercise_title(hints.BY_ID["1.1"]) == "稳定的 softmax"
    assert "<summary>提示 1/" in hints.notebook_block("1.1")
    file.write_text(file.read_text().replace(hints.section_hash(english), "0" * 12))
    hints._fresh.cache_clear()
    assert hints.translation_status(ZH)["1.1"] == "stale"
    shown = hints.show("1.1", level=1)
    assert shown.startswith("（这些提示还没有中文版") and english.levels[0].splitlines()[0] in shown


def test_hint_translations_are_of_todays_english():
    """Check that every translated hint section (kvlib/course/locale/zh-CN/hints/) translates today's English section,
    with as many levels, its title and levels held to the glossary's terms, the numbers and the code as a notebook's
    cells are; exercises not yet translated show in English."""
    status = hints.translation_status(ZH)
    stale = [ex for ex, s in status.items() if s == "stale"]
    assert not stale, f"hints whose English changed since they were translated: {stale}"
    problems = translate.hint_problems(ZH)
    assert not problems, "\n".join(problems)


def test_a_templates_fields_are_translated_where_the_catalogue_has_them(chinese):
    """Check that translate() translates a template's field values that are themselves texts of the catalogue (a
    label filled into "{0}-bound", a verdict filled into a title, a record note's thread count), in any place of it,
    and leaves a field the catalogue lacks (a number, a machine's name) as it is."""
    assert i18n.translate("memory-bound: 1,200 tokens/s predicted") == "访存受限：预测每秒 1,200 个词元"
    title = (
        "GQA-2 decode against MHA, median speed: the shared heads copied out 0.8x (slower in every paired round),\n"
        "read in place 1.4x (faster in every paired round)"
    )
    shown = i18n.translate(title)
    assert "每一轮配对测量都更慢" in shown and "每一轮配对测量都更快" in shown and "paired" not in shown
    assert i18n.translate(", 1 thread, torch 2.5.1, median of 5 runs") == "，1 个线程，torch 2.5.1，5 次运行的中位数"
    assert i18n.translate("Xeon 8480") == "Xeon 8480"  # a machine's name: no text of the catalogue


def test_the_extractor_finds_what_a_figure_draws_and_what_a_verdict_says():
    """Check english_texts on a figure's code: tick labels (set_xticks), a dict's values drawn through an index, a
    loop's written-out tuples assigned to a name a title draws, `a or b`, a text joined to what is not one (a field),
    a comprehension's item, a dict looped over into a drawn label, a keyword named as a label; not the keys, nor what is only indexed by; and on
    a notebook, the words handed to
    claims.compare; and that every sentence kvlib/course/claims.py can say is found whole."""
    source = """
def fig(ax, way, ok, note=None, title=None):
    names = {"naive": "the naive loop", "tiled": "the tiled loop"}
    verdict = "held" if ok else "did not hold"
    for axis, key, head in ((ax, "tokens_per_s", "Throughput"), (ax, "tpot_s", "Latency")):
        axis.set_title(head)
    ax.set_xticks([0, 1], [f"pass {i}" for i in range(2)] + ["bonus"])
    ax.legend(title=f"{names[way]}: {verdict}")
    ax.set_ylabel(title or "time (s)")
    ax.text(0, 0, note + "; tiny model")
    styles = {"naive": ("#000000", "every score kept"), "tiled": ("#0072B2", "one tile at a time")}
    for key, (color, label) in styles.items():
        ax.plot([0], [0], color=color, label=label)
    step_time_fit(ax, fit_label="a line through the points")
"""
    found = translate.english_texts("kvlib/course/figures/x.py", source)["kvlib/course/figures/x.py::fig"]
    assert found == {
        "the naive loop", "the tiled loop", "held", "did not hold", "Throughput", "Latency", "pass {0}", "bonus",
        "time (s)", "{0}; tiny model", "every score kept", "one tile at a time",
        "a line through the points",
    }  # fmt: skip
    cell = 'v = claims.compare("06a.grouped-vs-mha", r, "GQA-2 read in place", "MHA", what="throughput")'
    assert translate.english_texts("solutions/x.ipynb", cell) == {
        "solutions/x.ipynb": {"GQA-2 read in place", "MHA", "throughput"}
    }
    claims = (ROOT / "kvlib/course/claims.py").read_text(encoding="utf-8")
    said = translate.english_texts("kvlib/course/claims.py", claims)
    assert (
        "{0} ran at {1} {2}'s {3}: faster in every one of {4} paired rounds ({5})"
        in said["kvlib/course/claims.py::compare"]
    )
    assert "{0}: {1}, below {2} ({3})" in said["kvlib/course/claims.py::exact"]


def test_chinese_beside_mathtext_is_drawn_and_a_missing_glyph_is_caught(chinese):
    """Check that missing_glyphs names the boxes mathtext draws for Chinese beside `$...$` (matplotlib logs "Font
    'default' does not have a glyph for", no warning), and that a figure's translated text with mathtext draws
    every glyph (the CJK font first)."""
    import matplotlib.pyplot as plt

    if plotting.cjk_font() is None:
        pytest.skip("no CJK font installed")
    with style.style():
        fig, ax = plt.subplots()
        ax.set_title("拟合：~$N^{1.50}$")
    assert any("does not have a glyph for" in m for m in plotting.missing_glyphs(fig))
    plt.close(fig)
    with style.style():
        fig, ax = plt.subplots()
        ax.plot([1, 2], [1, 2], label="  fit: ~$N^{1.50}$")
        ax.legend()
    assert style.translate_texts(fig) == 1 and plotting.missing_glyphs(fig) == []
    assert "  拟合：~$N^{1.50}$" in {t.get_text() for t in fig.findobj(Text)}
    plt.close(fig)


def test_a_record_note_and_a_verdict_title_in_chinese(chinese):
    """Check a figure's foot and title in Chinese: record_note's words around the machine's name (which stays as
    recorded) and a notebook's note joined to it; a verdict broken after its colon as a title, line by line; a way's
    name wrapped at its comma as a bar's tick label (a category, labelled at each draw), unbroken."""
    if plotting.cjk_font() is None:
        pytest.skip("no CJK font installed")
    note = plotting.record_note({"device": "Intel Xeon, 8 cores", "threads": 1, "torch": "2.5.1"}, runs=3)
    assert note == "Intel Xeon, 8 cores，1 个线程，torch 2.5.1，3 次运行的中位数"
    assert i18n.translate(note + "; 32 requests, 4,096 KV slots") == note + "；32 个请求，4,096 个 KV 槽位"
    row = {"tokens_per_s": 1.0, "tpot_mean_s": 0.1, "steps": 9, "kv_utilisation": 0.5}
    ways = {w: [row] * 3 for w in ("static, reserved", "continuous, paged")}
    title = "continuous, paged ran at 1.52x continuous, reserved's throughput:\nfaster in every one of 3 paired rounds (1.4x-1.6x)"
    fig = plotting.serving_compare(ways, title=title, note=note)
    fig.canvas.draw()  # tick labels are made at a draw
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["静态批处理，预留", "连续批处理，分页"]
    assert fig._suptitle.get_text() == (
        "连续批处理，分页 的吞吐量是 连续批处理，预留 的 1.52x：\n3 轮配对测量中每一轮都更快（1.4x-1.6x）"
    )


def test_every_figure_in_chinese_draws_every_glyph(chinese):
    """Check that each figure of tests/test_figures.py, drawn with KVLIB_LANG=zh-CN, has no empty box: no glyph
    missing from its fonts, mathtext's included, once its texts are translated."""
    from test_figures import FIGURES

    missing = {name: plotting.missing_glyphs(make()) for name, make in FIGURES.items()}
    assert not {name: m for name, m in missing.items() if m}


def test_figures_speak_chinese_only_where_a_font_draws_it(chinese, monkeypatch):
    """Check a figure with KVLIB_LANG=zh-CN: its title and axis labels in Chinese where a CJK font is installed, in
    English where none is (the tokens in pinyin), never a glyph missing (an empty box) either way."""
    probs = np.tril(np.ones((3, 3))) / np.arange(1, 4)[:, None]
    fig = plotting.causal_attention_heatmap(["我", "爱", "AI"], probs)
    texts = {t.get_text() for t in fig.findobj(Text)}
    if plotting.cjk_font() is not None:
        assert {"每个词元只关注自己和它之前的词元", "键（被关注的词元）", "我"} <= texts
    else:
        assert {"Each token attends only to itself and earlier tokens", "wǒ"} <= texts
    assert plotting.missing_glyphs(fig) == []
    plotting.cjk_font.cache_clear()
    monkeypatch.setattr(style, "cjk_font", lambda: None)  # where the figures look it up
    fig = plotting.causal_attention_heatmap(["我", "爱", "AI"], probs)
    assert "key (attended to)" in {t.get_text() for t in fig.findobj(Text)}


def test_lab_lang_sets_the_kernels_language_and_jupyterlabs(tmp_path, capsys):
    """Check `kvlib lab --lang zh-CN`'s parts: JupyterLab's default interface language zh_CN (a default: the
    learner's own choice wins), whose language pack jupyterlab_server finds; KVLIB_LANG for every kernel; the
    translated notebooks opened, an untranslated one in English, saying so."""
    from jupyterlab_server.translation_utils import get_language_packs

    config = lab.write_learner_config(tmp_path / "zh", ZH)
    overrides = json.loads((config / "labconfig" / "default_setting_overrides.json").read_text())
    assert overrides == {lab.TRANSLATION_PLUGIN: {"locale": "zh_CN"}}
    assert not (lab.write_learner_config(tmp_path / "en") / "labconfig" / "default_setting_overrides.json").exists()
    assert lab.language_pack_missing(ZH) is None and "zh_CN" in get_language_packs()[0]
    assert lab.lab_env(config, reference=False, base={}, lang=ZH)[i18n.ENV] == ZH
    assert lab.language_folder("notebooks", "en", "01") == "notebooks"
    if TRANSLATED:
        first = TRANSLATED[0].parent.name[:2]
        assert lab.language_folder("notebooks", ZH, first) == f"notebooks/{ZH}"
    (tmp_path / "course" / "notebooks" / "01-attention").mkdir(parents=True)  # a course whose 01 has no translation
    assert lab.language_folder("notebooks", ZH, "01", root=tmp_path / "course") == "notebooks"
    assert "is not translated into zh-CN yet" in capsys.readouterr().out


def test_course_init_in_chinese_puts_the_translated_notebooks_in_source(tmp_path):
    """Check that `kvlib course init --lang zh-CN` puts each translated solution notebook in source/ in its English
    one's place (the same name, so the same assignment), and the others in English."""
    from kvlib.app.course_folder import plan

    files = plan(tmp_path, lang=ZH)
    for notebook in translate.english_notebooks():
        rel = notebook.relative_to(ROOT / "solutions")
        translated = ROOT / "solutions" / ZH / rel
        want = translated if notebook in TRANSLATED else notebook
        assert files[tmp_path / "source" / rel] == want.read_bytes(), rel


def test_locale_files_ship_as_package_data():
    """Check that pyproject ships kvlib/course/locale's catalogues and hint translations with the package."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    globs = config["tool"]["setuptools"]["package-data"]["kvlib.course"]
    shipped = {p for g in globs for p in (ROOT / "kvlib" / "course").glob(g)}
    files = {p for p in i18n.LOCALE_DIR.rglob("*") if p.is_file()}
    assert files and files <= shipped, sorted(files - shipped)


def test_each_exercise_has_one_chinese_title():
    """Check that an exercise's Chinese title in its notebook heading is the one its hints (and `kvlib hint`,
    `kvlib check`) show: one name per exercise in each language."""
    import re

    headings = {}
    for path in (ROOT / "translations" / ZH).rglob("*.md"):
        headings |= {
            m[1]: m[2].strip() for m in re.finditer(r"^## 练习 (\d+\.\d+) — (.+)$", path.read_text("utf-8"), re.M)
        }
    titles = {ex_id: i18n.hint_title(ex_id, "", ZH) for ex_id in headings}
    assert headings and {k: v for k, v in headings.items() if titles[k] != v} == {}, titles
