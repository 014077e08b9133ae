"""kvlib/gqa.py (notebook 06): the head grouping, attention that never copies the shared heads,
mean-pooling an MHA model into GQA, real models' KV bytes, and the benchmark's shape of report.

Each exercise's check tests live here under three names, built with conftest.handed_in: ALTERNATIVES
(correct implementations in another shape, which pass every check of their exercise), SLIPS (likely
wrong ones, which fail the check or exercise named, with a message naming the slip), and a
function that changes its arguments (conftest.vandal) scores 0.
Runs in reference mode (conftest). No test asserts on time."""

import dataclasses
import math
import types

import numpy as np
import pytest
import torch
from conftest import (
    case_ids,
    check_failures,
    checks_in_child,
    handed_in,
    on_a_terminal,
    shown_progress,
    spoil_config_tensors_models,
    vandal,
)

from kvlib import gqa
from kvlib.checks import CHECKS, checks_for, run
from kvlib.checks.gqa import CONFIG
from kvlib.core.configs import REAL_MODELS
from kvlib.core.model import Decoder, ModelConfig, matrix_params
from kvlib.core.weights import first_head_of_group, from_transformers, to_transformers
from kvlib.course.exercises import BY_ID, ExerciseNotDone
from kvlib.kv_cache import kv_cache_bytes
from kvlib.measure import bench_gqa
from kvlib.study import gqa_quality
from kvlib.variants import gqa_attention

torch.set_num_threads(1)

GQA_CHECKS = [c for i in range(1, 6) for c in checks_for(BY_ID[f"6.{i}"])]
B, H, H_KV, T, S, D = 2, 6, 2, 3, 5, 8


@pytest.mark.parametrize("check", GQA_CHECKS, ids=lambda c: c.name)
def test_reference_passes_check(check):
    """Check that the reference solution passes every check of notebook 06."""
    check.fn(gqa, np.random.default_rng(0))


def test_learner_stubs_are_todo(learner_mode):
    """Check that in learner mode every 6.x exercise but 6.1 raises ExerciseNotDone naming itself, and that 6.1 (find
    and fix) runs its shipped body, which fails its checks."""
    for ex_id, call in (
        (
            "6.2",
            lambda: gqa.grouped_attention(torch.zeros(1, 4, 1, 4), torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4)),
        ),
        ("6.3", lambda: gqa.mean_pool_heads(torch.zeros(8, 3), 4, 2)),
        ("6.4", lambda: gqa.to_gqa(Decoder(CONFIG), 3)),
        ("6.5", lambda: gqa.predicted_speedup(CONFIG, 3, 10)),
    ):
        with pytest.raises(ExerciseNotDone, match=f"Exercise {ex_id}"):
            call()
    results = {r.id: r.status for r in run("06")}
    assert gqa.repeat_kv(torch.zeros(1, 2, 3, 4), 2).shape == (1, 4, 3, 4)
    assert results == {"6.1": "fail", "6.2": "todo", "6.3": "todo", "6.4": "todo", "6.5": "todo"}


def test_the_shipped_repeat_kv_shows_the_symptom_not_the_cause(learner_mode):
    """Check that 6.1's shipped body (find and fix: the heads tiled [a, b, a, b]) is right where its order is (one
    key/value head, groups of one) yet fails every check of 6.1 (the isolated grader gives points a check: an
    untouched stub earns none), naming which query heads go wrong, never the cause or the fix (no repeat, no
    h // group_size, no [a, a, ...])."""
    x = torch.randn(B, 1, S, D)
    assert torch.equal(gqa.repeat_kv(x, 4), x.repeat_interleave(4, dim=1))  # MQA: right
    assert torch.equal(gqa.repeat_kv(x, 1), x)
    failures = check_failures("6.1", _module(repeat_kv=gqa.repeat_kv))
    assert len(failures) == len(checks_for(BY_ID["6.1"])), "the untouched shipped body must earn no check's points"
    message = str(failures[0][1])
    assert "query heads 1, 4 get other outputs than in the layer; heads 0, 2, 3, 5 the same" in message, message
    for cause in ("repeat(", "repeat_interleave", "//", "[a", "consecutive", "tile", "cat"):
        assert cause not in message, f"the symptom names its cause: {cause!r} in {message!r}"


def test_contracts_leave_the_grouping_to_the_learner():
    """Check that the 6.1 and 6.3 contracts (stub docstrings) state the invariant, not the grouping: no
    repeat_interleave, no h // group_size, no "consecutive" (issue 25: each exercise asks for a decision)."""
    import inspect

    from conftest import ROOT

    stub = (ROOT / "kvlib" / "gqa.py").read_text()
    for name in ("repeat_kv", "mean_pool_heads"):
        doc = inspect.getdoc(getattr(gqa, name))
        assert doc and doc.split("\n")[0] in stub, f"{name}: the stub's docstring is not the reference's"
        for answer in ("repeat_interleave", "h // group_size", "consecutive", "j*g"):
            assert answer not in doc, f"{name}'s contract hands over the grouping: {answer!r}"


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
    """Check that split-K (chunks merged by the online softmax) equals SDPA with enable_gqa, chunks that do
    not divide kv_len included."""
    torch.manual_seed(0)
    q, k, v = (
        torch.randn(2, 6, 1, 8) * 3,
        torch.randn(2, n_kv_heads, kv_len, 8) * 3,
        torch.randn(2, n_kv_heads, kv_len, 8),
    )
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=n_kv_heads != 6)
    torch.testing.assert_close(gqa_attention.split_k_attention(q, k, v, chunk=chunk), expected)


def test_split_k_attention_names_what_it_cannot_do():
    """Check that split-K attention refuses, by name, more than one query per head and heads that do not group."""
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
    first = first_head_of_group(w, H, H_KV)
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


NAMES = ("repeat_kv", "grouped_attention", "mean_pool_heads", "to_gqa", "first_head_of_group", "predicted_speedup")


def _module(**replaced) -> types.SimpleNamespace:
    """What a learner hands in: kvlib.gqa (the reference, in reference mode) with some functions replaced."""
    return handed_in(gqa, NAMES, **replaced)


# ---------------------------------------------------------------------------------------------
# Other correct implementations (ALTERNATIVES): at least three per exercise, all must pass every check


def repeat_expand_index(x, group_size):  # query head h reads head h // group_size
    return x[:, torch.arange(x.shape[1] * group_size) // group_size]


def repeat_stack(x, group_size):
    return torch.stack([x] * group_size, dim=2).flatten(1, 2)


def repeat_loop(x, group_size):
    return torch.cat([x[:, h : h + 1] for h in range(x.shape[1]) for _ in range(group_size)], dim=1)


def attention_einsum(q, k, v):
    B, H, T, D = q.shape
    H_kv, S = k.shape[1:3]
    qg = q.view(B, H_kv, H // H_kv, T, D)
    scores = torch.einsum("bhgtd,bhsd->bhgts", qg, k) / math.sqrt(D)
    allowed = torch.ones(T, S, dtype=torch.bool).tril(S - T)
    probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    return torch.einsum("bhgts,bhsd->bhgtd", probs, v).reshape(B, H, T, D)


def attention_loop(q, k, v):  # one key/value head at a time, its group's queries stacked: float64 inside
    B, H, T, D = q.shape
    H_kv, S = k.shape[1:3]
    G = H // H_kv
    bias = torch.zeros(T, S, dtype=torch.float64).masked_fill(
        torch.ones(T, S, dtype=torch.bool).triu(S - T + 1), float("-inf")
    )
    out = []
    for j in range(H_kv):
        qj = q[:, j * G : (j + 1) * G].double()  # (B, G, T, D)
        scores = qj @ k[:, j : j + 1].double().transpose(-2, -1) / math.sqrt(D) + bias
        out.append(scores.softmax(-1) @ v[:, j : j + 1].double())
    return torch.cat(out, dim=1).to(q.dtype)


def attention_bmm(q, k, v):  # each key/value head's group of queries as one batch entry: baddbmm with a float bias
    B, H, T, D = q.shape
    H_kv, S = k.shape[1:3]
    rows = q.reshape(B * H_kv, H // H_kv * T, D)  # (B, H, T, D) -> (B * H_kv, G * T, D)
    bias = torch.zeros(T, S).masked_fill(torch.ones(T, S, dtype=torch.bool).triu(S - T + 1), float("-inf"))
    keys = k.reshape(B * H_kv, S, D).transpose(1, 2)
    scores = torch.baddbmm(bias.repeat(H // H_kv, 1), rows, keys, alpha=1 / math.sqrt(D))
    return torch.bmm(scores.softmax(-1), v.reshape(B * H_kv, S, D)).reshape(B, H, T, D)


def attention_sdpa(q, k, v):  # the shortcut: torch's fused kernel reads the shared heads in place
    T, S = q.shape[2], k.shape[2]
    mask = torch.ones(T, S, dtype=torch.bool).tril(S - T)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


def pool_loop(w, n_heads, n_kv_heads):
    D, G = w.shape[0] // n_heads, n_heads // n_kv_heads
    rows = []
    for j in range(n_kv_heads):
        rows.append(sum(w[(j * G + i) * D : (j * G + i + 1) * D] for i in range(G)) / G)
    return torch.cat(rows)


def pool_avg_pool(w, n_heads, n_kv_heads):  # avg_pool1d over the head axis, heads moved last
    D, C, G = w.shape[0] // n_heads, w.shape[1], n_heads // n_kv_heads
    heads = w.view(n_heads, D * C).T[None]  # (1, D*C, H)
    return torch.nn.functional.avg_pool1d(heads, G)[0].T.reshape(n_kv_heads * D, C)


def pool_float64(w, n_heads, n_kv_heads):
    D, C = w.shape[0] // n_heads, w.shape[1]
    return w.double().view(n_kv_heads, -1, D, C).sum(1).div(n_heads // n_kv_heads).reshape(-1, C).to(w.dtype)


def to_gqa_deepcopy(model, n_kv_heads, pool=None):
    import copy

    pool = pool or gqa.mean_pool_heads
    new = copy.deepcopy(model)
    old = model.config.n_kv_heads
    new.config = dataclasses.replace(model.config, n_kv_heads=n_kv_heads)
    for layer in new.layers:
        for proj in (layer.attn.k_proj, layer.attn.v_proj):
            proj.weight = torch.nn.Parameter(pool(proj.weight.detach(), old, n_kv_heads))
            proj.out_features = proj.weight.shape[0]
        layer.attn.n_kv_heads = n_kv_heads
    return new


def to_gqa_load(model, n_kv_heads, pool=None):
    pool = pool or gqa.mean_pool_heads
    new = Decoder(dataclasses.replace(model.config, n_kv_heads=n_kv_heads))
    state = model.state_dict()
    for name in state:
        if name.endswith(("k_proj.weight", "v_proj.weight")):
            state[name] = pool(state[name], model.config.n_kv_heads, n_kv_heads)
    new.to(next(model.parameters()).dtype).load_state_dict(state)
    new.train(model.training)
    return new


def to_gqa_copy_params(model, n_kv_heads, pool=None):
    pool = pool or gqa.mean_pool_heads
    new = Decoder(dataclasses.replace(model.config, n_kv_heads=n_kv_heads)).to(model.embed.weight.dtype)
    with torch.no_grad():
        for (name, p), (_, src) in zip(new.named_parameters(), model.named_parameters()):
            p.copy_(
                pool(src, model.config.n_kv_heads, n_kv_heads)
                if name.endswith(("k_proj.weight", "v_proj.weight"))
                else src
            )
    return new.train() if model.training else new.eval()


def speedup_in_bytes(config, n_kv_heads, kv_len, batch=1):  # bytes in fp16, the cache from Exercise 4.4
    def step(h):
        c = dataclasses.replace(config, n_kv_heads=h)
        return matrix_params(c) * 2 + kv_cache_bytes(c, kv_len, batch, torch.float16)

    return step(config.n_heads) / step(n_kv_heads)


def speedup_from_step_cost(config, n_kv_heads, kv_len, batch=1):  # notebook 05's bytes of a decode step (5.3)
    from kvlib.roofline import step_cost

    def step(h):
        return step_cost(dataclasses.replace(config, n_kv_heads=h), 1, kv_len, batch, torch.bfloat16)[1]

    return step(config.n_heads) / step(n_kv_heads)


def speedup_by_parts(config, n_kv_heads, kv_len, batch=1):  # what each key/value head dropped saves, exactly
    from fractions import Fraction

    c, H = config, config.n_heads
    mha = matrix_params(dataclasses.replace(c, n_kv_heads=H)) + 2 * c.n_layers * H * c.head_dim * kv_len * batch
    per_head = 2 * c.n_layers * c.head_dim * (c.d_model + kv_len * batch)  # its k_proj and v_proj rows, its cache
    return float(Fraction(mha, mha - (H - n_kv_heads) * per_head))


ALTERNATIVES = [
    ("6.1", {"repeat_kv": repeat_expand_index}),
    ("6.1", {"repeat_kv": repeat_stack}),
    ("6.1", {"repeat_kv": repeat_loop}),
    ("6.2", {"grouped_attention": attention_einsum}),
    ("6.2", {"grouped_attention": attention_loop}),
    ("6.2", {"grouped_attention": attention_bmm}),
    ("6.3", {"mean_pool_heads": pool_loop}),
    ("6.3", {"mean_pool_heads": pool_avg_pool}),
    ("6.3", {"mean_pool_heads": pool_float64}),
    ("6.4", {"to_gqa": to_gqa_deepcopy}),
    ("6.4", {"to_gqa": to_gqa_load}),
    ("6.4", {"to_gqa": to_gqa_copy_params}),
    ("6.5", {"predicted_speedup": speedup_in_bytes}),
    ("6.5", {"predicted_speedup": speedup_from_step_cost}),
    ("6.5", {"predicted_speedup": speedup_by_parts}),
]


@pytest.mark.parametrize("ex_id, replaced", ALTERNATIVES, ids=case_ids(ALTERNATIVES))
def test_alternative_passes_every_check(ex_id, replaced):
    """Check that a correct implementation written another way passes every check of its exercise."""
    failures = check_failures(ex_id, _module(**replaced))
    assert not failures, failures


# ---------------------------------------------------------------------------------------------
# Likely slips (SLIPS), each rejected by its check, or by a check of its exercise, with a message naming it


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


def repeat_wrong_dim(x, group_size):
    return x.repeat_interleave(group_size, dim=2)


def repeat_expand_front(x, group_size):  # the group axis before the heads: [a, b, a, b]
    B, H_kv, S, D = x.shape
    return x[:, None].expand(B, group_size, H_kv, S, D).reshape(B, group_size * H_kv, S, D)


def repeat_modulo(x, group_size):  # query head h reads h % n_kv_heads
    return x[:, torch.arange(x.shape[1] * group_size) % x.shape[1]]


def _grouped_with_mask(q, k, v, mask_fn):
    B, H, T, D = q.shape
    H_kv, S = k.shape[1:3]
    G = H // H_kv
    scores = q.reshape(B, H_kv, G * T, D) @ k.transpose(-2, -1) / math.sqrt(D)
    allowed = mask_fn(T, S, G)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    return (scores.softmax(-1) @ v).reshape(B, H, T, D)


def attention_offset_t_minus_one(q, k, v):  # right for 1 query, and for 3 against 5 keys: the old checks' shapes
    return _grouped_with_mask(
        q, k, v, lambda T, S, G: None if T == 1 else torch.ones(T, S, dtype=torch.bool).tril(T - 1).repeat(G, 1)
    )


def attention_rows_interleaved(q, k, v):
    return _grouped_with_mask(
        q,
        k,
        v,
        lambda T, S, G: None if T == 1 else torch.ones(T, S, dtype=torch.bool).tril(S - T).repeat_interleave(G, 0),
    )


def attention_group_for_queries(
    q, k, v
):  # a (G, S) mask tiled T times: right only when T == G (the old checks' 3 and 3)
    return _grouped_with_mask(
        q, k, v, lambda T, S, G: None if T == 1 else torch.ones(G, S, dtype=torch.bool).tril(S - G).repeat(T, 1)
    )


def attention_no_scale(q, k, v):
    return attention_einsum(q * math.sqrt(q.shape[-1]), k, v)


def pool_first_half(w, n_heads, n_kv_heads):  # the first n_kv_heads heads, untouched
    return w[: n_kv_heads * (w.shape[0] // n_heads)].clone()


def pool_d_model_axis(w, n_heads, n_kv_heads):  # pooled the input axis and then cut the rows
    D, C = w.shape[0] // n_heads, w.shape[1]
    return w.view(n_kv_heads, n_heads // n_kv_heads, D, C).mean(1).reshape(-1, C).flip(0)


def pool_median(w, n_heads, n_kv_heads):
    D, C = w.shape[0] // n_heads, w.shape[1]
    return w.view(n_kv_heads, n_heads // n_kv_heads, D, C).max(1).values.reshape(-1, C)


def to_gqa_n_heads(model, n_kv_heads, pool=None):  # pools as if the source were MHA: right for MHA only
    pool = pool or gqa.mean_pool_heads
    config = dataclasses.replace(model.config, n_kv_heads=n_kv_heads)
    state = {
        name: pool(w, model.config.n_heads, n_kv_heads) if name.endswith(("k_proj.weight", "v_proj.weight")) else w
        for name, w in model.state_dict().items()
    }
    new = Decoder(config).to(model.embed.weight.dtype)
    new.load_state_dict(state)
    return new.train(model.training)


def to_gqa_float32(model, n_kv_heads, pool=None):  # a new Decoder is float32
    new = gqa.to_gqa(model, n_kv_heads, pool)
    return new.float()


def to_gqa_train_mode(model, n_kv_heads, pool=None):  # a new nn.Module starts in training mode
    return gqa.to_gqa(model, n_kv_heads, pool).train()


def to_gqa_ignores_pool(model, n_kv_heads, pool=None):
    return gqa.to_gqa(model, n_kv_heads)


def repeat_heads_reversed(x, group_size):  # a grouping no checkpoint uses: neither tiled nor consecutive
    return x.flip(1).repeat_interleave(group_size, dim=1)


def pool_groups_reversed(w, n_heads, n_kv_heads):  # the right means, the new heads in reverse order
    D_, C = w.shape[0] // n_heads, w.shape[1]
    return w.view(n_kv_heads, n_heads // n_kv_heads, D_, C).mean(1).flip(0).reshape(-1, C)


def _numbers(config, h, kv_len, batch, *, shrink=True, weights_per_sequence=False, kv=2, layers=True):
    c = dataclasses.replace(config, n_kv_heads=h if shrink else config.n_heads)
    weights = matrix_params(c) * (batch if weights_per_sequence else 1)
    return weights + kv * (config.n_layers if layers else 1) * h * config.head_dim * kv_len * batch


def _speedup(**how):
    def predicted(config, n_kv_heads, kv_len, batch=1):
        mha = _numbers(config, config.n_heads, kv_len, batch, **{k: v for k, v in how.items() if k != "shrink"})
        return mha / _numbers(config, n_kv_heads, kv_len, batch, **how)

    predicted.__name__ = "speedup_" + "_".join(f"{k}_{v}" for k, v in how.items())  # a test id of its own
    return predicted


def speedup_cache_only(config, n_kv_heads, kv_len, batch=1):  # group_size: the weights forgotten
    return config.n_heads / n_kv_heads


def speedup_mha_baseline_from_config(config, n_kv_heads, kv_len, batch=1):  # MHA taken as the config's own heads
    return _numbers(config, config.n_kv_heads, kv_len, batch) / _numbers(config, n_kv_heads, kv_len, batch)


def speedup_embedding_read_whole(config, n_kv_heads, kv_len, batch=1):
    table = config.vocab_size * config.d_model
    return (_numbers(config, config.n_heads, kv_len, batch) + table) / (
        _numbers(config, n_kv_heads, kv_len, batch) + table
    )


def speedup_inverted(config, n_kv_heads, kv_len, batch=1):
    return 1 / gqa.predicted_speedup(config, n_kv_heads, kv_len, batch)


def speedup_of_the_example(config, n_kv_heads, kv_len, batch=1):  # the notebook's bench model, for any input
    return 2.871559633027523


# (check or exercise, replaced function, words the failure must contain)
SLIPS = [
    ("repeat_kv_follows_the_checkpoints_order", {"repeat_kv": _repeat_not_interleave}, "query heads 1, 4 get"),
    (
        "grouped_attention_matches_repeated_heads",
        {"grouped_attention": _attention_with_repeat},
        "another key/value head",
    ),
    ("grouped_attention_matches_repeated_heads", {"grouped_attention": _attention_top_left}, "aligned top-left"),
    ("grouped_attention_does_not_copy_heads", {"grouped_attention": _attention_copying}, "copies of the 2 cached"),
    ("grouped_attention_does_not_copy_heads", {"grouped_attention": _attention_broadcast}, "broadcasting matmul"),
    ("mean_pool_heads_averages_each_group", {"mean_pool_heads": _pool_strided}, "the `repeat` order"),
    ("mean_pool_heads_averages_each_group", {"mean_pool_heads": first_head_of_group}, "first head of each group"),
    ("mean_pool_heads_averages_each_group", {"mean_pool_heads": _pool_rows}, "ROWS"),
    ("mean_pool_heads_averages_each_group", {"mean_pool_heads": _pool_sum}, "mean, not sum"),
    ("to_gqa_recovers_a_gqa_model", {"to_gqa": _to_gqa_strided}, "consecutive heads"),
    ("6.1", {"repeat_kv": repeat_wrong_dim}, "should be (2, 6, 5, 8)"),
    ("6.1", {"repeat_kv": repeat_expand_front}, "heads 0, 2, 3, 5 the same"),
    ("6.1", {"repeat_kv": repeat_modulo}, "heads 0, 2, 3, 5 the same"),
    ("6.2", {"grouped_attention": attention_offset_t_minus_one}, "diagonal offset is kv_len - seq_len"),
    ("6.2", {"grouped_attention": attention_rows_interleaved}, "mask rows are in the wrong order"),
    ("6.2", {"grouped_attention": attention_group_for_queries}, "built for group_size queries"),
    ("6.2", {"grouped_attention": attention_no_scale}, "sqrt(head_dim)"),
    ("6.2", {"grouped_attention": attention_sdpa}, "ran torch's fused attention kernel"),
    ("6.3", {"mean_pool_heads": pool_first_half}, "differs from the mean"),
    ("6.3", {"mean_pool_heads": pool_d_model_axis}, "differs from the mean"),
    ("6.3", {"mean_pool_heads": pool_median}, "differs from the mean"),
    ("6.4", {"to_gqa": to_gqa_n_heads}, "already GQA"),
    ("6.4", {"to_gqa": to_gqa_float32}, "keep the source's dtype"),
    ("6.4", {"to_gqa": to_gqa_train_mode}, "eval mode"),
    ("6.4", {"to_gqa": to_gqa_ignores_pool}, "pool function it is given"),
    ("6.1", {"repeat_kv": repeat_heads_reversed}, "query heads 0, 1, 2, 3, 4, 5 get other outputs"),
    ("6.3", {"mean_pool_heads": pool_groups_reversed}, "the old heads each new head replaces"),
    ("6.5", {"predicted_speedup": speedup_cache_only}, "the caches alone"),
    ("6.5", {"predicted_speedup": _speedup(shrink=False)}, "k_proj and v_proj shrink"),
    ("6.5", {"predicted_speedup": _speedup(weights_per_sequence=True)}, "shared by the whole batch"),
    ("6.5", {"predicted_speedup": _speedup(kv=1)}, "keys AND values"),
    ("6.5", {"predicted_speedup": _speedup(layers=False)}, "every layer's keys and values"),
    ("6.5", {"predicted_speedup": speedup_mha_baseline_from_config}, "the config's own n_kv_heads is not read"),
    ("6.5", {"predicted_speedup": speedup_embedding_read_whole}, "the embedding table is looked up"),
    ("6.5", {"predicted_speedup": speedup_inverted}, "above 1"),
    ("6.5", {"predicted_speedup": speedup_of_the_example}, "expected"),
]


@pytest.mark.parametrize("where, replaced, words", SLIPS, ids=case_ids(SLIPS))
def test_slip_is_rejected_naming_it(where, replaced, words):
    """Check that a likely wrong implementation fails the check named, or a check of the exercise named, with an
    AssertionError whose message names the slip."""
    failures = check_failures(where, _module(**replaced))
    assert failures, f"{next(iter(replaced.values())).__name__} passed every check of {where}"
    assert all(isinstance(err, AssertionError) for _, err in failures), failures
    assert any(words in (str(err) or "assertion") for _, err in failures), failures


def test_6_2_refuses_the_benchmarks_split_k_attention_where_the_exercise_is_checked():
    """Check that grouped_attention handing a decode step to kvlib's split_k_attention (the infrastructure's grouped
    attention) fails Exercise 6.2's decode-step check naming it (kvlib.course.exercises.READY_MADE), the rest of its
    checks pass, and split_k_attention works again after."""

    def through_split_k(q, k, v):
        return gqa_attention.split_k_attention(q, k, v) if q.shape[2] == 1 else gqa.grouped_attention(q, k, v)

    failures = check_failures("6.2", _module(grouped_attention=through_split_k))
    assert failures and all("split-K" in str(err) and "grouped_attention" in str(err) for _, err in failures), failures
    q, k, v = torch.randn(1, 4, 1, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    torch.testing.assert_close(gqa_attention.split_k_attention(q, k, v), gqa.grouped_attention(q, k, v))


# ---------------------------------------------------------------------------------------------
# A function that changes its arguments scores 0: every check builds its target before the call


_MUTABLE = [c for ex_id in ("6.1", "6.2", "6.3", "6.4", "6.5") for c in checks_for(BY_ID[ex_id])]


@pytest.mark.parametrize("check", _MUTABLE, ids=lambda c: c.name)
def test_a_function_that_changes_its_arguments_scores_zero(check):
    """Check that a function which spoils its arguments, then answers for the spoiled ones, fails the check."""
    ex = check.exercise
    name = ex.name
    ref = getattr(gqa, name)
    with pytest.raises(AssertionError):
        check.fn(_module(**{name: vandal(ref, spoil_config_tensors_models)}), np.random.default_rng(0))
    from kvlib.core.configs import REAL_MODELS

    assert REAL_MODELS["Llama-2-7B"].config.n_layers == 32, "a check handed learner code a shared config"


def test_every_check_of_06_is_covered():
    """Check that the test above covers every check of notebook 06."""
    assert {c.name for c in _MUTABLE} == {name for name, c in CHECKS.items() if c.exercise.id[0] == "6"}


# ---------------------------------------------------------------------------------------------
# In the isolated grading child, as nbgrader runs them


@pytest.mark.slow
def test_checks_of_06_pass_the_reference_in_the_isolated_child():
    """Check that the reference passes every 6.x check in the grading child."""
    from conftest import ROOT

    source = (ROOT / "solutions" / "kvlib" / "gqa.py").read_text()
    verdicts = checks_in_child("gqa", source, ("6.1", "6.2", "6.3", "6.4", "6.5"))
    assert set(verdicts.values()) == {"pass"}, verdicts


@pytest.mark.slow
def test_to_gqa_that_loses_dtype_or_mode_fails_in_the_isolated_child():
    """Check that a to_gqa returning a float32 model in training mode fails there too: the child sends a model's
    dtype and train/eval mode both ways, so the check sees what the learner's function returned."""
    from conftest import ROOT

    source = (ROOT / "solutions" / "kvlib" / "gqa.py").read_text()
    old = "    return new.to(model.embed.weight.dtype).train(model.training)\n"
    assert old in source
    verdicts = checks_in_child("gqa", source.replace(old, "    return new.float().train()\n"), ("6.4",))
    assert "keep the source's dtype" in verdicts["to_gqa_converts_a_gqa_model_and_keeps_dtype_and_mode"], verdicts
    source = source.replace(old, "    return new.to(model.embed.weight.dtype)\n")  # a new nn.Module is in training mode
    verdicts = checks_in_child("gqa", source, ("6.4",))
    assert "eval mode" in verdicts["to_gqa_converts_a_gqa_model_and_keeps_dtype_and_mode"], verdicts


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
    """Check that notebook 06's table gives the fp16 KV bytes per token of each published config."""

    config = REAL_MODELS[name].config
    assert kv_cache_bytes(config, 1) == KIB_PER_TOKEN[name] * 1024
    assert kv_cache_bytes(config, 4096) == 4096 * KIB_PER_TOKEN[name] * 1024


def test_kv_cache_bytes_halves_when_n_kv_heads_halves():
    """Check that Llama-2-7B's cache shrinks in proportion to n_kv_heads, to 16 KiB per token as MQA."""

    config = REAL_MODELS["Llama-2-7B"].config
    sizes = [kv_cache_bytes(dataclass_replace(config, n_kv_heads=h), 1) for h in (32, 16, 8, 4, 2, 1)]
    assert all(a == 2 * b for a, b in zip(sizes, sizes[1:])) and sizes[-1] == 16 * 1024


@pytest.fixture(scope="module")
def quick_gqa_report():
    """One `kvlib bench gqa --quick` run, shared by the tests that read its report (its stderr on a terminal in
    SHOWN)."""
    with on_a_terminal() as err:
        report = bench_gqa.bench_gqa(quick=True)
    SHOWN["gqa"] = err.getvalue()
    return report


SHOWN = {}


@pytest.mark.slow
def test_bench_gqa_shows_its_rounds_on_a_terminal(quick_gqa_report):
    """Check that `kvlib bench gqa` shows a progress bar counting its rounds."""
    assert shown_progress(SHOWN["gqa"], "kvlib bench gqa")


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
    """Check that each way's fixed part is the intercept of a line over the lengths, with its spread, reported only
    where meaningful; each row's cache part is its step minus that, and cache ratios only where they clear the spread."""
    import statistics

    from kvlib.measure.bench_gqa import format_gqa

    report = quick_gqa_report
    fixed = {(f["n_kv_heads"], f["method"]): f for f in report["fixed"]}
    assert {f["kv_len"] for f in report["fixed"]} == {0} and "intercept" in report["fixed_method"]
    assert all(f["q1_s"] <= f["q3_s"] for f in fixed.values())
    assert set(fixed) == {
        (r["n_kv_heads"], r["method"]) for r in report["rows"]
    }  # one fixed part per way and n_kv_heads
    mha = {r["kv_len"]: r for r in report["rows"] if r["method"] == "mha"}
    shortest = min(mha)
    for r in report["rows"]:
        f = fixed[r["n_kv_heads"], r["method"]]
        assert (
            r["fixed_s"] == f["median_s"] and r["fixed_spread_s"] == [f["q1_s"], f["q3_s"]] and r["fixed_ok"] == f["ok"]
        )
        ends = [  # the way's steps at the two lengths: each round's own line, its intercept 2 t(S) - t(2S)
            x["rounds_s"] for x in report["rows"] if (x["n_kv_heads"], x["method"]) == (r["n_kv_heads"], r["method"])
        ]
        assert r["fixed_rounds_s"] == pytest.approx([2 * a - b for a, b in zip(*ends)])
        if not r["fixed_ok"]:  # no split: nothing derived from it, and a reason instead
            assert r["cache_s"] is None and r["cache_bytes_per_s"] is None and not r["cache_clear"] and r["fixed_why"]
            continue
        first = next(
            x
            for x in report["rows"]
            if x["kv_len"] == shortest and x["n_kv_heads"] == r["n_kv_heads"] and x["method"] == r["method"]
        )
        assert 0 < r["fixed_s"] < first["median_s"] and f["q1_s"] > 0
        assert r["cache_s"] == pytest.approx(statistics.median(r["cache_rounds_s"]))
        if (
            r["cache_s"] > 0
        ):  # the rate at which the bytes that grow with kv_len were read: the cache (kv_len + 1 slots)
            assert r["cache_bytes_per_s"] > 0
            if r["method"] != "materialised":  # which also writes and reads its copies
                assert r["cache_bytes_per_s"] == pytest.approx(r["cache_bytes"] / r["cache_s"])
        both_clear = r["cache_clear"] and mha[r["kv_len"]]["cache_clear"]
        if r["method"] in ("mha", "grouped", "materialised"):
            assert (r["cache_speedup_vs_mha"] is not None) == both_clear
        if r["cache_clear"]:
            assert r["cache_s"] > f["q3_s"] - f["q1_s"]
    text = format_gqa(report)
    assert "Where the time goes" in text and "fixed ms" in text and text.count("cached tokens") >= len(mha)


def test_projection_seconds_times_the_weights_sharing_shrinks(tmp_path):
    """Check that projection_seconds times k_proj and v_proj of every layer for each n_kv_heads, one time per round,
    and counts their bytes (float32, the timing model: MHA's four times GQA-2's); and that last_level_cache reads the
    highest cache level Linux lists, None where none is listed."""
    got = bench_gqa.projection_seconds((8, 2), rounds=2)
    c = bench_gqa.gqa_bench_config()
    assert got["bytes"] == {h: c.n_layers * 2 * h * c.head_dim * c.d_model * 4 for h in (8, 2)}
    assert all(len(t) == 2 and min(t) > 0 for t in got["seconds"].values()) and set(got["seconds"]) == {8, 2}
    for index, level, size in (("index0", 1, "32K"), ("index3", 3, "32768K"), ("index2", 2, "1024K")):
        (tmp_path / index).mkdir()
        (tmp_path / index / "level").write_text(f"{level}\n")
        (tmp_path / index / "size").write_text(f"{size}\n")
    assert bench_gqa.last_level_cache(tmp_path) == 32 << 20 and bench_gqa.last_level_cache(tmp_path / "none") is None


def test_fixed_part_is_reported_only_where_the_line_is_meaningful():
    """Check that a step linear in kv_len gives its intercept as the fixed part, one disturbed round does not move it,
    and a negative intercept, one outside the rounds' own quartiles or a flat step is 'no split' with a reason: never a
    negative fixed part, never nan, never a fixed part outside the spread printed beside it."""
    lens = [4096, 8192]
    clean = [[2e-3 + 1e-6 * S + 1e-5 * r for r in range(5)] for S in lens]  # fixed part about 2 ms, 5 rounds
    got = bench_gqa._fixed_part(lens, clean)
    assert got["ok"] and got["fixed_s"] == pytest.approx(2.02e-3) and got["why"] == ""
    disturbed = [list(col) for col in clean]
    disturbed[1][0] *= 3  # one round of the longer length ran three times slower
    assert bench_gqa._fixed_part(lens, disturbed)["fixed_s"] == pytest.approx(got["fixed_s"], rel=0.05)
    bends = [[1e-3 for _ in range(5)], [9e-3 for _ in range(5)]]  # grows faster than a line through 0: intercept < 0
    no = bench_gqa._fixed_part(lens, bends)
    assert not no["ok"] and "below 0" in no["why"]
    apart = [[t * 1e-3 for t in (13, 14, 11, 14, 14)], [t * 1e-3 for t in (14, 16, 13, 16, 15)]]  # 13 ms vs (12-12)
    no = bench_gqa._fixed_part(lens, apart)  # the line through the medians and the rounds' lines disagree: noise
    assert not no["ok"] and "outside the round-by-round intercepts' quartiles" in no["why"]
    flat = [[5e-3, 6e-3, 5e-3, 6e-3, 5e-3], [5e-3, 5e-3, 5e-3, 5e-3, 5e-3]]
    assert not bench_gqa._fixed_part(lens, flat)["ok"] and "did not grow" in bench_gqa._fixed_part(lens, flat)["why"]


def test_time_split_names_the_step_that_gave_no_ratio():
    """Check that where no ratio of cache parts is printed for GQA-2 against MHA, the verdict names which of the two
    steps stopped it (MHA's did not split, GQA-2's did not split, or a cache part within the spread), not one cause
    for all three."""
    from kvlib.core.configs import gqa_bench_config

    def row(S, h, method, ok=True, clear=True):
        return {
            "kv_len": S, "n_kv_heads": h, "method": method, "cache_bytes": 1e6, "median_s": 1e-2, "min_s": 9e-3,
            "max_s": 1.1e-2, "predicted_s": 5e-3, "measured_over_predicted": 2.0, "speedup_vs_mha": 1.0,
            "speedup_vs_mha_best": 1.0, "fixed_ok": ok, "fixed_s": 3e-3, "fixed_spread_s": [2.9e-3, 3.1e-3],
            "fixed_why": "" if ok else "too noisy to split", "cache_s": 7e-3 if ok else None,
            "cache_bytes_per_s": 1e8 if ok else None, "cache_speedup_vs_mha": 1.5 if ok and clear else None,
            "cache_speedup_spread": None,
        }  # fmt: skip

    def verdict(mha_ok, gqa_ok, clear):
        rows = [row(S, 8, "mha", mha_ok) for S in (4096, 8192)] + [
            row(S, 2, "grouped", gqa_ok, clear) for S in (4096, 8192)
        ]
        if not mha_ok:
            for r in rows:
                r["cache_speedup_vs_mha"] = None
        report = {
            "record": {"device": "cpu", "threads": 1, "torch": torch.__version__, "rounds": 5},
            "config": {**gqa_bench_config().to_dict(), "n_kv_heads": [8, 2]},
            "bandwidth": {"bytes_per_s": 1e10, "kernel": "triad"},
            "rows": rows,
            "fixed": [{"kv_len": 0}],
            "fixed_method": "intercept",
        }
        return [line for line in bench_gqa.format_gqa(report, learner=True).splitlines() if "no ratio" in line]

    assert all("MHA's step does not split" in line for line in verdict(False, True, True)) and verdict(
        False, True, True
    )
    assert all("its step does not split" in line for line in verdict(True, False, False)) and verdict(
        True, False, False
    )
    assert all("does not stand clear" in line for line in verdict(True, True, False)) and verdict(True, True, False)
    assert verdict(True, True, True) == []


def test_a_recording_is_predicted_from_the_device_table():
    """Check that against_device predicts a GPU recording from kvlib/core/devices.py's bandwidth, names that source,
    and keeps the run's own measured bandwidth in its record."""
    from kvlib.core.devices import DEVICES
    from kvlib.measure.machine import load_recordings

    recordings = load_recordings(benchmark="gqa")
    if not recordings:
        pytest.skip("no GPU recording ships with this copy")
    rec, sheet = recordings[0], DEVICES["H200 SXM"]
    shown = bench_gqa.against_device(rec, sheet)
    assert all(r["predicted_s"] == pytest.approx(r["bytes"] / sheet.bandwidth) for r in shown["rows"])
    text = bench_gqa.format_gqa(shown)
    assert f"{sheet.bandwidth / 1e9:,.1f} GB/s (H200 SXM datasheet" in text and "measured" not in text.split("\n")[1]
    assert shown["record"]["bandwidth_GBps"] == rec["record"]["bandwidth_GBps"]  # the measurement, kept as measured


def test_uptraining_recording_shows_the_papers_ordering():
    """Check that the shipped recording holds every conversion, and after uptraining mean-pooling beats keeping
    the first head."""
    recording = gqa_quality.load_uptraining_recording()
    assert recording is not None and recording["record"]["uptrain_steps"] == 100
    rows = {(r["n_kv_heads"], r["recipe"]): r for r in recording["rows"]}
    assert set(rows) == {(8, "original"), *((h, recipe) for h in (4, 2, 1) for recipe in ("mean", "first"))}
    for h in (4, 2, 1):
        assert rows[h, "mean"]["uptrained_accuracy"] > rows[h, "first"]["uptrained_accuracy"]
    assert gqa_quality.load_uptraining_recording("/nonexistent/uptraining.json") is None


def _speedup_by_the_benchmark(config, n_kv_heads, kv_len, batch=1):  # the benchmark's byte count, on meta models
    with torch.device("meta"):
        mha, gqa_model = (Decoder(dataclasses.replace(config, n_kv_heads=h)) for h in (config.n_heads, n_kv_heads))
    return gqa_attention.decode_bytes(mha, kv_len, batch) / gqa_attention.decode_bytes(gqa_model, kv_len, batch)


def test_the_benchmarks_byte_count_as_the_prediction_fails_naming_it():
    """Check that 6.5 answered by the benchmark's decode_bytes (on models built on the meta device: no memory) fails
    the exercise's checks, naming what it called (kvlib.course.exercises.READY_MADE)."""
    failures = check_failures("6.5", _module(predicted_speedup=_speedup_by_the_benchmark))
    assert failures and all("called the benchmark's byte count" in str(err) for _, err in failures), failures
