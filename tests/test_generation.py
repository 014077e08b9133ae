"""kvlib/generation.py (notebook 02): the reference passes every check, checks name the known
slips, and bad input (empty prompt, too many tokens) gets a clear error."""

import time
import types

import numpy as np
import pytest
import torch

from kvlib import generation
from kvlib.checks import CHECKS, checks_for
from kvlib.checks.generation import _model
from kvlib.course.exercises import BY_ID

GEN_CHECKS = [c for i in range(1, 5) for c in checks_for(BY_ID[f"2.{i}"])]


@pytest.mark.parametrize("check", GEN_CHECKS, ids=lambda c: c.name)
def test_reference_passes_check(check):
    """Check that the reference solution passes every check of notebook 02."""
    check.fn(generation, np.random.default_rng(0))


def test_generate_rejects_a_request_past_max_seq_len():
    """Check that asking for more tokens than the model's context says how many fit."""
    model = _model(0)  # max_seq_len 64
    with pytest.raises(ValueError, match="ask for at most 54 new tokens"):
        generation.generate(model, torch.zeros(1, 10, dtype=torch.long), 60)


def test_generate_rejects_an_empty_prompt_and_float_ids():
    """Check that an empty prompt and float token ids are named errors."""
    model = _model(0)
    with pytest.raises(ValueError, match="empty prompt"):
        generation.generate(model, torch.zeros(1, 0, dtype=torch.long), 3)
    with pytest.raises(ValueError, match="integer token ids"):
        generation.generate(model, torch.zeros(1, 3), 3)


def test_next_token_rejects_wrong_shapes():
    """Check that next_token names the expected (batch, vocab_size) shape and a negative temperature."""
    with pytest.raises(ValueError, match=r"\(batch, vocab_size\), got \(2, 3, 4\)"):
        generation.next_token(torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match="temperature must be a number >= 0"):
        generation.next_token(torch.zeros(2, 4), temperature=-1)


def _sample_without_temperature(logits, temperature=0.0, generator=None):
    if temperature == 0:
        return logits.argmax(-1)
    return torch.multinomial(torch.softmax(logits, -1), 1, generator=generator).squeeze(-1)


def _greedy_keepdim(logits, temperature=0.0, generator=None):
    return logits.argmax(-1, keepdim=True)


def _generate_from_first_position(model, input_ids, max_new_tokens, temperature=0.0, generator=None, on_token=None):
    ids = input_ids
    for _ in range(max_new_tokens):
        token = model(ids)[:, 0].argmax(-1)  # the slip: the first position's logits
        ids = torch.cat([ids, token[:, None]], 1)
    return ids


def _measure_whole_generation(model, input_ids, max_new_tokens):
    start = time.perf_counter()
    generation.generate(model, input_ids, max_new_tokens)
    total = time.perf_counter() - start
    return total, [total / max_new_tokens] * (max_new_tokens - 1)


MISTAKES = [
    ("next_token_samples_from_softmax", {"next_token": _sample_without_temperature}, "temperature changes nothing"),
    ("next_token_greedy_is_argmax", {"next_token": _greedy_keepdim}, "shape (3,)"),
    ("generate_matches_greedy_loop", {"generate": _generate_from_first_position}, "first position"),
    (
        "measure_ttft_tpot_times_prefill_and_steps",
        {"measure_ttft_tpot": _measure_whole_generation},
        "the whole generation",
    ),
]


@pytest.mark.parametrize(
    "name, fake, words", MISTAKES, ids=[f"{m[0]}-{next(iter(m[1].values())).__name__}" for m in MISTAKES]
)
def test_check_names_the_known_mistake(name, fake, words):
    """Check that a deliberately wrong implementation fails the check with a message naming the mistake."""
    module = types.SimpleNamespace(
        **{n: getattr(generation, n) for n in ("next_token", "generate", "measure_ttft_tpot", "project_qkv")}
    )
    for key, fn in fake.items():
        setattr(module, key, fn)
    with pytest.raises(AssertionError) as info:
        CHECKS[name].fn(module, np.random.default_rng(0))
    assert words in str(info.value)


@pytest.mark.slow
def test_timing_checks_read_the_fake_clock_in_the_isolated_child():
    """Check that 2.3's checks judge a learner's file in the isolated grader by the stand-in's fake
    clock, even when the file imports the clock by name; an averaged TPOT still fails there."""
    from kvlib.core.paths import ROOT
    from kvlib.grading.sandbox import Sandbox, package_files

    source = (ROOT / "solutions" / "kvlib" / "generation.py").read_text(encoding="utf-8")
    by_name = source.replace("import time\n", "import time\nfrom time import perf_counter\n", 1).replace(
        "time.perf_counter()", "perf_counter()"
    )
    averaged = source.replace(
        "    return ttft, [b - a for a, b in zip(times, times[1:])]",
        "    return ttft, [(times[-1] - start) / max_new_tokens] * (max_new_tokens - 1)",
    )
    assert by_name != source and averaged != source
    functions = [f"generation.{BY_ID[i].name}" for i in ("2.1", "2.2", "2.3", "2.4")]
    for text, passes in ((by_name, True), (averaged, False)):
        files = package_files(ROOT / "kvlib")
        files["kvlib/generation.py"] = text.encode()
        with Sandbox(
            files, ["generation"], functions, mode="plain", torch=True, call_timeout=60, budget=300
        ) as sandbox:
            module = sandbox.module("generation")
            check = CHECKS["measure_ttft_tpot_times_prefill_and_steps"]
            if passes:
                check.fn(module, np.random.default_rng(0))
                CHECKS["project_qkv_matches_tiny_layer_0"].fn(module, np.random.default_rng(0))
            else:
                with pytest.raises(AssertionError, match="an average"):
                    check.fn(module, np.random.default_rng(0))
