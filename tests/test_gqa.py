"""kvlib/gqa.py (notebook 06): the head grouping, attention that never copies the shared heads,
mean-pooling an MHA model into GQA, real models' KV bytes, and the benchmark's shape of report.

Runs in reference mode (conftest). No test asserts on time."""

import types

import numpy as np
import pytest
import torch

from kvlib import gqa
from kvlib.checks import CHECKS, checks_for, run
from kvlib.checks.gqa import CONFIG
from kvlib.core.configs import REAL_MODELS
from kvlib.core.model import Decoder, ModelConfig
from kvlib.core.weights import from_transformers, to_transformers
from kvlib.course.exercises import BY_ID, ExerciseNotDone
from kvlib.measure import bench_gqa
from kvlib.study import gqa_quality
from kvlib.variants import gqa_attention

torch.set_num_threads(1)

GQA_CHECKS = [c for i in range(1, 5) for c in checks_for(BY_ID[f"6.{i}"])]
B, H, H_KV, T, S, D = 2, 6, 2, 3, 5, 8


@pytest.mark.parametrize("check", GQA_CHECKS, ids=lambda c: c.name)
def test_reference_passes_check(check):
    """Check that the reference solution passes every check of notebook 06."""
    check.fn(gqa, np.random.default_rng(0))


def test_learner_stubs_are_todo(learner_mode):
    """Check that in learner mode every 6.x exercise raises ExerciseNotDone naming itself."""
    for ex_id, call in (
        ("6.1", lambda: gqa.repeat_kv(torch.zeros(1, 2, 3, 4), 2)),
        (
            "6.2",
            lambda: gqa.grouped_attention(torch.zeros(1, 4, 1, 4), torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4)),
        ),
        ("6.3", lambda: gqa.mean_pool_heads(torch.zeros(8, 3), 4, 2)),
        ("6.4", lambda: gqa.to_gqa(Decoder(CONFIG), 3)),
    ):
        with pytest.raises(ExerciseNotDone, match=f"Exercise {ex_id}"):
            call()
    results = {r.id: r.status for r in run("06")}
    assert results == {"6.1": "todo", "6.2": "todo", "6.3": "todo", "6.4": "todo"}


# ---------------------------------------------------------------------------------------------
# Equivalences


def test_repeat_kv_matches_repeat_interleave():
    """Check that repeat_kv equals repeat_interleave on dim 1 for every group size of 6 heads."""
    x = torch.randn(B, H_KV, S, D)
    for g in (1, 2, 3):
        torch.testing.assert_close(gqa.repeat_kv(x, g), x.repeat_interleave(g, dim=1))


@pytest.mark.parametrize("n_kv_heads", [6, 3, 2, 1], ids=["mha", "gqa3", "gqa2", "mqa"])
def test_grouped_attention_equals_sdpa_enable_gqa(n_kv_heads):
    """Check that grouped_attention equals torch's SDPA with enable_gqa, and the materialised path, for T < S."""
    q, k, v = torch.randn(B, H, T, D), torch.randn(B, n_kv_heads, S, D), torch.randn(B, n_kv_heads, S, D)
    expected = gqa_attention.sdpa_attention(q, k, v)
    torch.testing.assert_close(gqa.grouped_attention(q, k, v), expected)
    torch.testing.assert_close(gqa_attention.materialised_attention(q, k, v), expected)


def test_gqa_with_group_size_1_equals_mha():
    """Check that grouped attention with n_kv_heads == n_heads is plain causal MHA attention."""
    q, k, v = torch.randn(B, H, T, D), torch.randn(B, H, S, D), torch.randn(B, H, S, D)
    torch.testing.assert_close(gqa.grouped_attention(q, k, v), gqa_attention.causal_attention(q, k, v))


def test_decode_step_with_matches_model_forward():
    """Check that decode_step_with (any attention) gives the model's own logits for the last position."""
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=23, d_model=48, n_layers=2, n_heads=6, n_kv_heads=2, hidden_dim=40, max_seq_len=16)
    model = Decoder(config).eval()
    from kvlib.kv_cache import KVCache

    ids = torch.randint(0, 23, (2, 6))
    with torch.inference_mode():
        full = model(ids)[:, -1]
        for name, attend in gqa_attention.BENCH_ATTENTION.items():
            cache = KVCache(config, batch=2)
            for t in range(6):  # one token at a time from an empty cache; the step does not advance pos
                logits = bench_gqa.decode_step_with(model, ids[:, t], cache, attend)
                cache.pos += 1
            torch.testing.assert_close(logits, full, msg=name)


@pytest.mark.parametrize("n_kv_heads, kv_len, chunk", [(2, 37, 8), (1, 16, 16), (6, 5, 1024), (3, 64, 7)])
def test_split_k_attention_equals_grouped_attention_for_a_decode_step(n_kv_heads, kv_len, chunk):
    """Check split-K (chunks merged by the online softmax) against SDPA with enable_gqa, chunks that do not divide kv_len included."""
    torch.manual_seed(0)
    q, k, v = (
        torch.randn(2, 6, 1, 8) * 3,
        torch.randn(2, n_kv_heads, kv_len, 8) * 3,
        torch.randn(2, n_kv_heads, kv_len, 8),
    )
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=n_kv_heads != 6)
    torch.testing.assert_close(gqa_attention.split_k_attention(q, k, v, chunk=chunk), expected)


def test_split_k_attention_names_what_it_cannot_do():
    with pytest.raises(ValueError, match="one query per head"):
        gqa_attention.split_k_attention(torch.randn(1, 4, 3, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8))
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        gqa_attention.split_k_attention(torch.randn(1, 4, 1, 8), torch.randn(1, 3, 5, 8), torch.randn(1, 3, 5, 8))


def test_decode_bytes_counts_copies_for_materialised():
    """Check that the materialised path is charged n_kv_heads + 2 n_heads heads, grouped only n_kv_heads."""
    model = Decoder(dataclass_replace(CONFIG, n_kv_heads=2))
    grouped, copied = (
        gqa_attention.decode_bytes(model, 100, method="grouped"),
        gqa_attention.decode_bytes(model, 100, method="materialised"),
    )
    per_head = 4 * 2 * CONFIG.n_layers * 100 * CONFIG.head_dim
    assert copied - grouped == 2 * CONFIG.n_heads * per_head


def dataclass_replace(config, **changes):
    import dataclasses

    return dataclasses.replace(config, **changes)


# ---------------------------------------------------------------------------------------------
# Converting MHA to GQA


def test_mean_pool_of_first_head_recipe_differs():
    """Check that first_head_of_group keeps head j*G and that mean-pooling differs from it on random weights."""
    w = torch.randn(H * 4, 10)
    first = gqa.first_head_of_group(w, H, H_KV)
    torch.testing.assert_close(first.view(H_KV, 4, 10), w.view(H, 4, 10)[:: H // H_KV])
    assert not torch.allclose(first, gqa.mean_pool_heads(w, H, H_KV))


def test_to_gqa_on_tiny_model_shrinks_cache_and_keeps_queries():
    """Check that converting the shipped tiny model to 2 KV heads keeps q_proj and quarters k_proj."""
    from kvlib.core.weights import load_tiny

    model, _ = load_tiny()
    small = gqa.to_gqa(model, 2)
    assert small.config.n_kv_heads == 2 and small.config.group_size == 4
    s, m = small.state_dict(), model.state_dict()
    assert s["layers.0.attn.k_proj.weight"].shape[0] * 4 == m["layers.0.attn.k_proj.weight"].shape[0]
    assert torch.equal(s["layers.0.attn.q_proj.weight"], m["layers.0.attn.q_proj.weight"])


def test_gqa_model_matches_transformers_llama_logits():
    """Check that a converted GQA kvlib model and transformers' LlamaForCausalLM on its weights give the same logits."""
    pytest.importorskip("transformers")
    torch.manual_seed(1)
    mha = Decoder(CONFIG).eval()
    with torch.no_grad():
        for p in mha.parameters():
            p.normal_(0.0, 0.3 if p.dim() == 2 else 1.0)
    small = gqa.to_gqa(mha, 2)
    hf = to_transformers(small)
    assert hf.config.num_key_value_heads == 2
    ids = torch.randint(0, CONFIG.vocab_size, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(small(ids), hf(ids).logits, rtol=1e-4, atol=1e-4)
        back = from_transformers(hf)
        assert back.config.n_kv_heads == 2
        torch.testing.assert_close(back(ids), small(ids))


def test_bad_inputs_name_the_problem():
    """Check that wrong shapes and group counts are ValueErrors that name shapes and divisors."""
    with pytest.raises(ValueError, match=r"\(batch, n_kv_heads, seq_len, head_dim\)"):
        gqa.repeat_kv(torch.zeros(3, 4), 2)
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        gqa.grouped_attention(torch.zeros(1, 6, 1, 8), torch.zeros(1, 4, 3, 8), torch.zeros(1, 4, 3, 8))
    with pytest.raises(ValueError, match="need at least 4 keys"):
        gqa.grouped_attention(torch.zeros(1, 4, 4, 8), torch.zeros(1, 2, 3, 8), torch.zeros(1, 2, 3, 8))
    with pytest.raises(ValueError, match="head_dim"):
        gqa.grouped_attention(torch.zeros(1, 4, 1, 8), torch.zeros(1, 2, 3, 6), torch.zeros(1, 2, 3, 6))
    with pytest.raises(ValueError, match=r"one of \[1, 2, 3, 6\]"):
        gqa.to_gqa(Decoder(CONFIG), 4)
    with pytest.raises(ValueError, match="not a multiple of n_heads"):
        gqa.mean_pool_heads(torch.zeros(10, 3), 4, 2)


# ---------------------------------------------------------------------------------------------
# Known mistakes are named


def _repeat_not_interleave(x, group_size):
    return x.repeat(1, group_size, 1, 1)


def _attention_with_repeat(q, k, v):
    g = q.shape[1] // k.shape[1]
    return gqa_attention.causal_attention(q, k.repeat(1, g, 1, 1), v.repeat(1, g, 1, 1))


def _attention_copying(q, k, v):
    return gqa_attention.materialised_attention(q, k, v)


def _attention_broadcast(q, k, v):
    (B_, H_, T_, D_), H_kv = q.shape, k.shape[1]
    scores = q.view(B_, H_kv, H_ // H_kv, T_, D_) @ k[:, :, None].transpose(-2, -1) / D_**0.5  # broadcasting copies k
    allowed = torch.ones(T_, k.shape[2], dtype=torch.bool).tril(k.shape[2] - T_)
    return (scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ v[:, :, None]).reshape(B_, H_, T_, D_)


def _attention_top_left(q, k, v):
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


def _pool_strided(w, n_heads, n_kv_heads):
    D_, C = w.shape[0] // n_heads, w.shape[1]
    return w.view(n_heads // n_kv_heads, n_kv_heads, D_, C).mean(0).reshape(-1, C)


def _pool_rows(w, n_heads, n_kv_heads):
    return w.view(w.shape[0] // (n_heads // n_kv_heads), n_heads // n_kv_heads, w.shape[1]).mean(1)


def _pool_sum(w, n_heads, n_kv_heads):
    D_, C = w.shape[0] // n_heads, w.shape[1]
    return w.view(n_kv_heads, n_heads // n_kv_heads, D_, C).sum(1).reshape(-1, C)


def _to_gqa_strided(model, n_kv_heads, pool=None):
    return gqa.to_gqa(model, n_kv_heads, pool=_pool_strided)


MISTAKES = [
    ("repeat_kv_matches_repeat_interleave", {"repeat_kv": _repeat_not_interleave}, "that is x.repeat"),
    ("grouped_attention_matches_repeated_heads", {"grouped_attention": _attention_with_repeat}, "as x.repeat would"),
    ("grouped_attention_matches_repeated_heads", {"grouped_attention": _attention_top_left}, "aligned top-left"),
    ("grouped_attention_does_not_copy_heads", {"grouped_attention": _attention_copying}, "copies of the 2 cached"),
    ("grouped_attention_does_not_copy_heads", {"grouped_attention": _attention_broadcast}, "broadcasting matmul"),
    ("mean_pool_heads_averages_each_group", {"mean_pool_heads": _pool_strided}, "the `repeat` order"),
    ("mean_pool_heads_averages_each_group", {"mean_pool_heads": gqa.first_head_of_group}, "first head of each group"),
    ("mean_pool_heads_averages_each_group", {"mean_pool_heads": _pool_rows}, "ROWS"),
    ("mean_pool_heads_averages_each_group", {"mean_pool_heads": _pool_sum}, "mean, not sum"),
    ("to_gqa_recovers_a_gqa_model", {"to_gqa": _to_gqa_strided}, "consecutive heads"),
]


@pytest.mark.parametrize(
    "name, fake, words", MISTAKES, ids=[f"{m[0]}-{next(iter(m[1].values())).__name__}" for m in MISTAKES]
)
def test_check_names_the_known_mistake(name, fake, words):
    """Check that a deliberately wrong implementation fails the check with a message naming the mistake."""
    module = types.SimpleNamespace(
        **{n: getattr(gqa, n) for n in ("repeat_kv", "grouped_attention", "mean_pool_heads", "to_gqa")}
    )
    for key, fn in fake.items():
        setattr(module, key, fn)
    with pytest.raises(AssertionError) as info:
        CHECKS[name].fn(module, np.random.default_rng(0))
    assert words in str(info.value)


# ---------------------------------------------------------------------------------------------
# Real models (kv_cache_bytes is Exercise 4.4) and the benchmark

KIB_PER_TOKEN = {
    "GPT-2 small": 36,
    "Llama-2-7B": 512,
    "Llama-2-70B": 320,
    "Llama-3-8B": 128,
    "Llama-3-70B": 320,
    "Mistral-7B": 128,
    "Qwen2.5-7B": 56,
    "Falcon-7B": 8,
}  # published configs (each model's config.json), fp16


@pytest.mark.parametrize("name", list(KIB_PER_TOKEN))
def test_real_model_kv_bytes_per_token_match_published_figures(name):
    """Check the table of notebook 06: fp16 KV bytes per token from each published config."""
    from kvlib.kv_cache import kv_cache_bytes

    config = REAL_MODELS[name].config
    assert kv_cache_bytes(config, 1) == KIB_PER_TOKEN[name] * 1024
    assert kv_cache_bytes(config, 4096) == 4096 * KIB_PER_TOKEN[name] * 1024


def test_kv_cache_bytes_halves_when_n_kv_heads_halves():
    """Check that Llama-2-7B's cache shrinks in proportion to n_kv_heads, to 16 KiB per token as MQA."""
    from kvlib.kv_cache import kv_cache_bytes

    config = REAL_MODELS["Llama-2-7B"].config
    sizes = [kv_cache_bytes(dataclass_replace(config, n_kv_heads=h), 1) for h in (32, 16, 8, 4, 2, 1)]
    assert all(a == 2 * b for a, b in zip(sizes, sizes[1:])) and sizes[-1] == 16 * 1024


@pytest.fixture(scope="module")
def quick_gqa_report():
    """One `kvlib bench gqa --quick` run, shared by the tests that read its report."""
    return bench_gqa.bench_gqa(quick=True)


@pytest.mark.slow
def test_bench_gqa_quick_reports_every_case(quick_gqa_report):
    """Check that `kvlib bench gqa --quick` times MHA two ways, and four ways (split-K too) for each smaller n_kv_heads, with ratios."""
    from kvlib.measure.bench_gqa import format_gqa

    report = quick_gqa_report
    rows = report["rows"]
    assert {(r["n_kv_heads"], r["method"]) for r in rows if r["kv_len"] == 512} == {
        (8, "mha"),
        (8, "mha sdpa"),
        *((h, m) for h in (4, 2, 1) for m in ("materialised", "grouped", "split-k", "sdpa")),
    }
    base = {r["method"]: r for r in rows if r["kv_len"] == 512 and r["n_kv_heads"] == 8}
    for r in rows:  # each way is compared with MHA done the same way: SDPA's fusion is not a GQA saving
        if r["kv_len"] == 512:
            assert r["speedup_vs_mha"] == pytest.approx(
                base["mha sdpa" if "sdpa" in r["method"] else "mha"]["median_s"] / r["median_s"]
            )
    assert all(r["median_s"] > 0 and r["predicted_s"] > 0 and r["speedup_vs_mha"] > 0 for r in rows)
    assert all(
        r["cache_bytes"] * 8 == rows[0]["cache_bytes"] * r["n_kv_heads"]
        for r in rows
        if r["kv_len"] == rows[0]["kv_len"]
    )
    assert "vs MHA" in format_gqa(report) and report["record"]["threads"] == 1


@pytest.mark.slow
def test_bench_gqa_splits_each_step_into_its_fixed_part_and_its_cache_part(quick_gqa_report):
    """Check that each way's fixed part is the intercept of a line over the lengths, with its spread, and each
    row's cache part is its step minus that, round by round; cache ratios only where they clear the spread."""
    import statistics

    from kvlib.measure.bench_gqa import format_gqa

    report = quick_gqa_report
    fixed = {(f["n_kv_heads"], f["method"]): f for f in report["fixed"]}
    assert {f["kv_len"] for f in report["fixed"]} == {0} and "intercept" in report["fixed_method"]
    assert all(f["q1_s"] <= f["median_s"] <= f["q3_s"] for f in fixed.values())
    assert set(fixed) == {
        (r["n_kv_heads"], r["method"]) for r in report["rows"]
    }  # one fixed part per way and n_kv_heads
    mha = {r["kv_len"]: r for r in report["rows"] if r["method"] == "mha"}
    for r in report["rows"]:
        f = fixed[r["n_kv_heads"], r["method"]]
        assert r["fixed_s"] == f["median_s"] and r["fixed_spread_s"] == [f["q1_s"], f["q3_s"]]
        assert r["cache_s"] == pytest.approx(statistics.median(r["cache_rounds_s"]))
        if (
            r["cache_s"] > 0
        ):  # the rate at which the bytes that grow with kv_len were read: the cache (kv_len + 1 slots)
            assert r["cache_bytes_per_s"] > 0
            if r["method"] != "materialised":  # which also writes and reads its copies
                assert r["cache_bytes_per_s"] == pytest.approx(r["cache_bytes"] / r["cache_s"])
        else:
            assert r["cache_bytes_per_s"] is None
        both_clear = r["cache_clear"] and mha[r["kv_len"]]["cache_clear"]
        if r["method"] in ("mha", "grouped", "materialised"):
            assert (r["cache_speedup_vs_mha"] is not None) == both_clear
        if r["cache_clear"]:
            assert r["cache_s"] > f["q3_s"] - f["q1_s"]
    text = format_gqa(report)
    assert "Where the time goes" in text and "fixed ms" in text and text.count("cached tokens") >= len(mha)


def test_uptraining_recording_shows_the_papers_ordering():
    """Check the shipped recording: every conversion recorded, and after uptraining mean-pooling beats keeping the first head."""
    recording = gqa_quality.load_uptraining_recording()
    assert recording is not None and recording["record"]["uptrain_steps"] == 100
    rows = {(r["n_kv_heads"], r["recipe"]): r for r in recording["rows"]}
    assert set(rows) == {(8, "original"), *((h, recipe) for h in (4, 2, 1) for recipe in ("mean", "first"))}
    for h in (4, 2, 1):
        assert rows[h, "mean"]["uptrained_accuracy"] > rows[h, "first"]["uptrained_accuracy"]
    assert gqa_quality.load_uptraining_recording("/nonexistent/uptraining.json") is None
