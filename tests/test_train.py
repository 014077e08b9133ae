"""Tests for kvlib/study/corpus.py (the generated facts) and kvlib/study/train.py (training and evaluation)."""

import json

import pytest
import torch

from kvlib.core.weights import load_tiny
from kvlib.study import corpus
from kvlib.study.train import build_tokenizer, encode_records, evaluate, greedy_correct, greedy_text, main, pack_rows

torch.set_num_threads(1)


# ---------------------------------------------------------------------------------------------
# Corpus


def test_corpus_contains_the_running_examples():
    """Check that both anchor prompts are training prompts with the expected answers."""
    prompts = {(it.prompt, it.answer) for it in corpus.eval_prompts("train")}
    assert ("法国的首都是", "巴黎") in prompts
    assert ("Q: What is the capital of France?\nA:", " Paris") in prompts
    assert set(corpus.ANCHORS) <= prompts


def test_corpus_facts_are_unique_and_include_the_article_examples():
    """Check that the table has ~90+ countries, no name twice, and 法国/日本/德国 right."""
    assert len(corpus.COUNTRIES) >= 90
    for field in ("name_en", "capital_en", "name_zh", "capital_zh"):
        values = [getattr(c, field) for c in corpus.COUNTRIES]
        assert len(set(values)) == len(values), field
    by_zh = {c.name_zh: c.capital_zh for c in corpus.COUNTRIES}
    assert (by_zh["法国"], by_zh["日本"], by_zh["德国"]) == ("巴黎", "东京", "柏林")


def test_corpus_held_out_templates_never_appear_in_training_text():
    """Check that no held-out record occurs in the training text, and that it needs no new characters."""
    train = set(corpus.records("train"))
    held_out = corpus.records("held_out")
    assert held_out and not train & set(held_out)
    assert set(corpus.held_out_text()) <= set(corpus.train_text())
    for lang in ("en", "zh"):
        assert corpus.eval_prompts("held_out", lang), lang


def test_corpus_prompts_have_one_continuation_in_training_text():
    """Check that no training record starts with an evaluation prompt and then goes on differently."""
    assert corpus.conflicts() == []


def test_corpus_text_is_deterministic():
    """Check that the same seed gives the same text, and another seed another order."""
    assert corpus.train_text(seed=3) == corpus.train_text(seed=3)
    assert corpus.train_text(seed=3) != corpus.train_text(seed=4)


def test_split_prompt_puts_the_space_in_the_answer():
    """Check that an English answer starts with its space and a reversed template is not a question."""
    france = corpus.COUNTRIES[0]
    assert corpus.split_prompt(corpus.Template("en", "The capital of {country} is {capital}.", False), france) == (
        "The capital of France is",
        " Paris",
    )
    assert corpus.split_prompt(corpus.Template("en", "{capital} is the capital of {country}.", False), france) is None


# ---------------------------------------------------------------------------------------------
# Training helpers and evaluation


def test_pack_rows_start_every_row_at_a_record():
    """Check that packed rows have seq_len + 1 tokens and each begins with a record's first token."""
    records = [[1, 2, 0], [3, 4, 5, 0], [6, 0], [7, 8, 9, 0]]
    rows = pack_rows(records, seq_len=4)
    assert rows.shape[1] == 5
    assert {int(r[0]) for r in rows} <= {1, 3, 6, 7}


def test_greedy_correct_agrees_with_step_by_step_greedy_decoding():
    """Check that the one-pass teacher-forced verdict equals real greedy decoding, right or wrong."""
    model, tokenizer = load_tiny()
    items = corpus.eval_prompts("held_out", "zh")[::401] + corpus.eval_prompts("held_out", "en")[::401]
    wrong = corpus.EvalPrompt("法国的首都是", "柏林", "zh", "train", "-", "France")  # a verdict that must be False
    items.append(wrong)
    verdicts = greedy_correct(model, tokenizer, items, batch_size=4)
    expected = [greedy_text(model, tokenizer, it.prompt, len(it.answer)) == it.answer for it in items]
    assert verdicts == expected and verdicts[-1] is False


def test_evaluate_reports_accuracy_per_split_and_language():
    """Check that evaluate() reports held-out loss, the four accuracies and the anchors for the shipped model."""
    model, tokenizer = load_tiny()
    result = evaluate(model, tokenizer, n_countries=5, loss_rows=8)
    assert set(result["accuracy"]) == {"train_en", "train_zh", "held_out_en", "held_out_zh"}
    assert result["accuracy"]["train_en"] > 0.9 and result["accuracy"]["train_zh"] > 0.9
    assert 0 < result["held_out_loss"] < 3 and result["train_text_loss"] < result["held_out_loss"]
    assert all(a["ok"] for a in result["anchors"].values())


def test_shipped_tokenizer_matches_the_corpus():
    """Check that the shipped tokenizer is the one the corpus builds (same characters, same ids)."""
    _, tokenizer = load_tiny()
    assert tokenizer.chars == build_tokenizer().chars
    assert encode_records(tokenizer, ["巴黎"]) == [tokenizer.encode("巴黎\n")]


# ---------------------------------------------------------------------------------------------
# The command line


def test_train_short_run_writes_a_loadable_model_and_refuses_to_overwrite(tmp_path, capsys):
    """Check that a few steps of a toy model write a loadable model, that rerunning reproduces it
    exactly, and that a different model does not overwrite it without --force."""
    out = tmp_path / "toy"
    args = ["--toy", "--steps", "7", "--threads", "1", "--out", str(out)]  # the last step on long rows
    assert main(args) == 0
    model, tokenizer = load_tiny(out)
    assert model.config.d_model == 32 and tokenizer.vocab_size == model.config.vocab_size
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["settings"]["steps"] == 7 and "held_out_loss" in manifest["evaluation"]

    assert main(args) == 0  # same seed: bit-identical weights, files left alone
    assert "reproduced" in capsys.readouterr().err

    assert main(args + ["--seed", "1"]) == 1  # a different model: refused
    assert json.loads((out / "manifest.json").read_text(encoding="utf-8")) == manifest
    assert (tmp_path / "toy-new" / "model.pt").is_file()
    assert main(args + ["--seed", "1", "--force"]) == 0
    assert json.loads((out / "manifest.json").read_text(encoding="utf-8"))["settings"]["seed"] == 1


def test_train_rejects_bad_arguments():
    """Check that non-positive --steps is refused before any training."""
    with pytest.raises(SystemExit):
        main(["--steps", "0"])
