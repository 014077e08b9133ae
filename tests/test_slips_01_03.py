"""Exercises 1.1-3.3 (notebooks 01-03): the checks judge the work, not its shape.

For every exercise: at least three other CORRECT implementations (loops or vectorised, einsum or
matmul, another order of operations, float64 intermediates, other sampling methods) pass all of
its checks; the likely WRONG ones fail its own checks (not a later exercise's) with a message
that names the slip; and for every check, a function that vandalises its arguments (zeroes the
arrays, tensors and weights it is given, or shrinks the config) before answering from them
scores 0, because each check computes what it expects before the learner's code runs.
"""

from __future__ import annotations

import math
import time
import types
from time import perf_counter as imported_perf_counter  # a learner may import the clock by name

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from kvlib.checks import checks_for
from kvlib.core.model import ModelConfig, apply_rotary, matrix_params, rotary_tables, rotate_half
from kvlib.course.exercises import BY_ID, reference

MODULE_OF = {"1": "attention", "2": "generation", "3": "recompute"}
IDS = ["1.1", "1.2", "1.3", "1.4", "2.1", "2.2", "2.3", "2.4", "3.1", "3.2", "3.3"]


def _reference_functions(module: str) -> dict:
    return {ex.name: reference(ex) for ex in BY_ID.values() if ex.module == module}


def _module(ex_id: str, **replaced):
    """The reference functions of the exercise's module, with some replaced: what a learner hands in."""
    module = MODULE_OF[ex_id[0]]
    fns = _reference_functions(module)
    extra = {"recompute": ("measured_forward_flops", "naive_decode_flops")}.get(module, ())
    ref_module = __import__("kvlib._solutions." + module, fromlist=["_"])
    fns.update({name: getattr(ref_module, name) for name in extra})
    fns.update(replaced)
    return types.SimpleNamespace(**fns)


def _first_failure(ex_id: str, module) -> str | None:
    """The first failing check's message for one exercise, as `kvlib check` reports it; None if all pass."""
    for c in checks_for(BY_ID[ex_id]):
        try:
            with np.errstate(all="ignore"):
                c.fn(module, np.random.default_rng(0))
        except Exception as err:  # noqa: BLE001 - any failure scores 0, as in the grader
            return f"{c.name}: {type(err).__name__}: {err}"
    return None


# =============================================================================================
# Alternative correct implementations


# 1.1 softmax ---------------------------------------------------------------------------------
def softmax_loop(scores):
    out = np.empty_like(scores)
    for idx in np.ndindex(scores.shape[:-1]):
        row = scores[idx]
        m = max(row)
        e = [math.exp(x - m) for x in row]
        out[idx] = [x / sum(e) for x in e]
    return out


def softmax_float64_inside(scores):
    x = scores.astype(np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(scores.dtype)


def softmax_logsumexp(scores):
    m = scores.max(axis=-1, keepdims=True)
    return np.exp(scores - m - np.log(np.exp(scores - m).sum(axis=-1, keepdims=True)))


def softmax_torch(scores):
    return torch.softmax(torch.from_numpy(scores), dim=-1).numpy()


# 1.2 attend ----------------------------------------------------------------------------------
def attend_einsum(q, k, v, scale=None):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    probs = softmax_logsumexp(np.einsum("sd,d->s", k, q) * scale)
    return np.einsum("s,sd->d", probs, v), probs


def attend_loop(q, k, v, scale=None):
    scale = 1 / math.sqrt(len(q)) if scale is None else scale
    scores = np.array([sum(qi * ki for qi, ki in zip(q, key)) * scale for key in k], dtype=q.dtype)
    probs = softmax_loop(scores)
    out = np.zeros(v.shape[1], dtype=v.dtype)
    for p, value in zip(probs, v):
        out += p * value
    return out, probs


def attend_float64_inside(q, k, v, scale=None):
    dtype = np.result_type(q, k, v)
    q64, k64, v64 = (x.astype(np.float64) for x in (q, k, v))
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    probs = softmax_float64_inside((q64[None] @ k64.T)[0] * scale)
    return (probs @ v64).astype(dtype), probs.astype(dtype)


# 1.3 causal_mask -----------------------------------------------------------------------------
def mask_loop(seq_len, kv_len):
    mask = np.zeros((seq_len, kv_len), dtype=bool)
    for i in range(seq_len):
        for j in range(kv_len):
            mask[i, j] = j <= kv_len - seq_len + i
    return mask


def mask_aranges(seq_len, kv_len):
    return np.arange(kv_len)[None, :] <= np.arange(seq_len)[:, None] + (kv_len - seq_len)


def mask_not_triu(seq_len, kv_len):
    return ~np.triu(np.ones((seq_len, kv_len), dtype=bool), k=kv_len - seq_len + 1)


# 1.4 causal_self_attention -------------------------------------------------------------------
def self_attention_per_query(q, k, v):
    T, S = q.shape[-2], k.shape[-2]
    out = np.zeros(q.shape[:-2] + (T, v.shape[-1]), dtype=np.result_type(q, k, v))
    probs = np.zeros(q.shape[:-2] + (T, S), dtype=out.dtype)
    for idx in np.ndindex(q.shape[:-2]):
        for i in range(T):
            n = S - T + i + 1
            o, p = attend_einsum(q[idx][i], k[idx][:n], v[idx][:n])
            out[idx][i], probs[idx][i, :n] = o, p
    return out, probs


def self_attention_bias(q, k, v):
    T, S = q.shape[-2], k.shape[-2]
    bias = np.where(mask_aranges(T, S), 0.0, -1e9).astype(q.dtype)  # an additive mask, as many libraries build it
    scores = np.einsum("...td,...sd->...ts", q, k) / math.sqrt(q.shape[-1]) + bias
    probs = softmax_logsumexp(scores)
    return np.einsum("...ts,...sd->...td", probs, v), probs


def self_attention_float64_torch(q, k, v):
    dtype = np.result_type(q, k, v)
    t = [torch.from_numpy(x.astype(np.float64)) for x in (q, k, v)]
    scores = t[0] @ t[1].transpose(-1, -2) * t[0].shape[-1] ** -0.5
    scores = scores.masked_fill(~torch.from_numpy(mask_aranges(q.shape[-2], k.shape[-2])), float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return (probs @ t[2]).numpy().astype(dtype), probs.numpy().astype(dtype)


# 2.1 next_token ------------------------------------------------------------------------------
def next_token_gumbel(logits, temperature=0.0, generator=None):
    if temperature == 0:
        return torch.max(logits, dim=-1).indices
    u = torch.rand(logits.shape, generator=generator).clamp_min(1e-20)
    return (logits / temperature - torch.log(-torch.log(u))).argmax(dim=-1)  # the Gumbel-max trick


def next_token_inverse_cdf(logits, temperature=0.0, generator=None):
    if not temperature:
        return logits.argmax(-1)
    cdf = torch.softmax(logits.double() / temperature, dim=-1).cumsum(dim=-1)
    u = torch.rand(logits.shape[0], 1, generator=generator, dtype=torch.float64)
    return torch.searchsorted(cdf, u * cdf[:, -1:]).squeeze(-1).clamp_max(logits.shape[-1] - 1)


def next_token_float64(logits, temperature=0.0, generator=None):
    if temperature <= 0:
        return torch.argmax(logits, dim=1)
    probs = F.softmax(logits.double() / temperature, dim=1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


# 2.2 generate --------------------------------------------------------------------------------
def _next(logits, temperature, generator):
    return reference(BY_ID["2.1"])(logits, temperature, generator)


def generate_buffer(model, input_ids, max_new_tokens, temperature=0.0, generator=None, on_token=None):
    B, T = input_ids.shape
    out = torch.empty(B, T + max_new_tokens, dtype=input_ids.dtype)
    out[:, :T] = input_ids
    with torch.no_grad():
        for i in range(max_new_tokens):
            token = _next(model(out[:, : T + i])[:, T + i - 1], temperature, generator)
            out[:, T + i] = token
            if on_token:
                on_token(token)
    return out


def generate_token_list(model, input_ids, max_new_tokens, temperature=0.0, generator=None, on_token=None):
    new = []
    with torch.inference_mode():
        while len(new) < max_new_tokens:
            logits = model(torch.cat([input_ids, *[t[:, None] for t in new]], dim=1))
            new.append(_next(logits[:, -1], temperature, generator))
            if on_token is not None:
                on_token(new[-1])
    return torch.cat([input_ids] + [t[:, None] for t in new], dim=1)


def generate_recursive(model, input_ids, max_new_tokens, temperature=0.0, generator=None, on_token=None):
    if max_new_tokens == 0:
        return input_ids
    with torch.no_grad():
        token = _next(model(input_ids)[:, -1, :], temperature, generator)
    if on_token is not None:
        on_token(token)
    return generate_recursive(
        model, torch.cat([input_ids, token.unsqueeze(1)], 1), max_new_tokens - 1, temperature, generator, on_token
    )


# 2.3 measure_ttft_tpot -----------------------------------------------------------------------
def measure_own_loop(model, input_ids, max_new_tokens):
    ids, stamps = input_ids, []
    start = time.monotonic()
    with torch.no_grad():
        for _ in range(max_new_tokens):
            ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
            stamps.append(time.monotonic())
    return stamps[0] - start, list(np.diff(stamps).astype(float))


def measure_ns(model, input_ids, max_new_tokens):
    stamps = [time.perf_counter_ns()]
    reference(BY_ID["2.2"])(
        model, input_ids, max_new_tokens, on_token=lambda token: stamps.append(time.perf_counter_ns())
    )
    seconds = [t / 1e9 for t in stamps]
    return seconds[1] - seconds[0], [b - a for a, b in zip(seconds[1:], seconds[2:])]


def measure_imported_clock(model, input_ids, max_new_tokens):
    last, gaps = imported_perf_counter(), []

    def tick(token):
        nonlocal last
        now = imported_perf_counter()
        gaps.append(now - last)
        last = now

    reference(BY_ID["2.2"])(model, input_ids, max_new_tokens, on_token=tick)
    return float(gaps[0]), gaps[1:]


# 2.4 project_qkv -----------------------------------------------------------------------------
def project_einsum(attn, h, cos, sin):
    B, T, _ = h.shape

    def heads(W, n):
        return torch.einsum("btc,nc->btn", h, W).reshape(B, T, n, attn.head_dim).permute(0, 2, 1, 3)

    q, k = heads(attn.q_proj.weight, attn.n_heads), heads(attn.k_proj.weight, attn.n_kv_heads)
    return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), heads(attn.v_proj.weight, attn.n_kv_heads)


def project_modules(attn, h, cos, sin):
    B, T, _ = h.shape
    D = attn.head_dim
    out = []
    for proj, n, turn in (
        (attn.q_proj, attn.n_heads, True),
        (attn.k_proj, attn.n_kv_heads, True),
        (attn.v_proj, attn.n_kv_heads, False),
    ):
        x = proj(h).view(B, T, n, D).transpose(1, 2)
        if turn:
            x1, x2 = x[..., : D // 2], x[..., D // 2 :]
            c, s = cos[:, : D // 2], sin[:, : D // 2]
            x = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)  # each pair (i, i + D/2) turned by its angle
        out.append(x)
    return tuple(out)


def project_float64(attn, h, cos, sin):
    B, T, _ = h.shape
    h64, c64, s64 = h.double(), cos.double(), sin.double()

    def heads(W, n):
        return F.linear(h64, W.double()).view(B, T, n, attn.head_dim).transpose(1, 2)

    q, k = heads(attn.q_proj.weight, attn.n_heads), heads(attn.k_proj.weight, attn.n_kv_heads)
    q, k = q * c64 + rotate_half(q) * s64, k * c64 + rotate_half(k) * s64
    return q.float(), k.float(), heads(attn.v_proj.weight, attn.n_kv_heads).float()


# 3.1-3.3 -------------------------------------------------------------------------------------
def forward_flops_loop(config, seq_len):
    total, T, D = 0, seq_len, config.head_dim
    for _ in range(config.n_layers):
        for m, n in (
            (config.d_model, config.n_heads * D),
            (config.d_model, config.n_kv_heads * D),
            (config.d_model, config.n_kv_heads * D),
            (config.n_heads * D, config.d_model),
            (config.d_model, config.hidden_dim),
            (config.d_model, config.hidden_dim),
            (config.hidden_dim, config.d_model),
        ):
            total += 2 * T * m * n
        for _ in range(config.n_heads):
            total += 2 * T * T * D + 2 * T * T * D
    return total + 2 * T * config.d_model * config.vocab_size


def forward_flops_matrix_params(config, seq_len):
    return 2 * seq_len * matrix_params(config) + 4 * config.n_layers * config.n_heads * config.head_dim * seq_len**2


def forward_flops_float(config, seq_len):
    per_token = 2.0 * matrix_params(config)
    return int(round(seq_len * per_token + 4.0 * seq_len * seq_len * config.n_layers * config.d_model))


def new_token_one_plus(config, kv_len):
    return reference(BY_ID["3.1"])(config, 1) + 4 * config.n_layers * config.n_heads * config.head_dim * (kv_len - 1)


def new_token_matrix_params(config, kv_len):
    return 2 * matrix_params(config) + 2 * 2 * kv_len * config.head_dim * config.n_heads * config.n_layers


def new_token_difference(config, kv_len):
    f = reference(BY_ID["3.1"])
    quadratic = (f(config, 2) - 2 * f(config, 1)) // 2  # c, the t^2 coefficient of forward_flops: 4 * L * H * D
    return f(config, 1) + quadratic * (kv_len - 1)  # one query against kv_len - 1 more keys


def generation_loop(config, prompt_len, max_new_tokens):
    f, g = reference(BY_ID["3.1"]), reference(BY_ID["3.2"])
    naive = kept = 0
    length = prompt_len
    for step in range(max_new_tokens):
        naive += f(config, length)
        kept += f(config, length) if step == 0 else g(config, length)
        length += 1
    return naive, kept


def generation_helper(config, prompt_len, max_new_tokens):
    from kvlib._solutions.recompute import naive_decode_flops

    g = reference(BY_ID["3.2"])
    kept = reference(BY_ID["3.1"])(config, prompt_len) + sum(
        g(config, s) for s in range(prompt_len + 1, prompt_len + max_new_tokens)
    )
    return sum(naive_decode_flops(config, prompt_len, max_new_tokens)), kept


def generation_numpy(config, prompt_len, max_new_tokens):
    f, g = reference(BY_ID["3.1"]), reference(BY_ID["3.2"])
    lengths = np.arange(prompt_len, prompt_len + max_new_tokens)
    naive = int(np.sum([f(config, int(n)) for n in lengths], dtype=np.int64))
    kept = int(f(config, prompt_len) + np.sum([g(config, int(n)) for n in lengths[1:]], dtype=np.int64))
    return naive, kept


ALTERNATIVES = [
    ("1.1", {"softmax": softmax_loop}),
    ("1.1", {"softmax": softmax_float64_inside}),
    ("1.1", {"softmax": softmax_logsumexp}),
    ("1.1", {"softmax": softmax_torch}),
    ("1.2", {"attend": attend_einsum}),
    ("1.2", {"attend": attend_loop}),
    ("1.2", {"attend": attend_float64_inside}),
    ("1.3", {"causal_mask": mask_loop}),
    ("1.3", {"causal_mask": mask_aranges}),
    ("1.3", {"causal_mask": mask_not_triu}),
    ("1.4", {"causal_self_attention": self_attention_per_query}),
    ("1.4", {"causal_self_attention": self_attention_bias}),
    ("1.4", {"causal_self_attention": self_attention_float64_torch}),
    ("2.1", {"next_token": next_token_gumbel}),
    ("2.1", {"next_token": next_token_inverse_cdf}),
    ("2.1", {"next_token": next_token_float64}),
    ("2.2", {"generate": generate_buffer}),
    ("2.2", {"generate": generate_token_list}),
    ("2.2", {"generate": generate_recursive}),
    ("2.3", {"measure_ttft_tpot": measure_own_loop}),
    ("2.3", {"measure_ttft_tpot": measure_ns}),
    ("2.3", {"measure_ttft_tpot": measure_imported_clock}),
    ("2.4", {"project_qkv": project_einsum}),
    ("2.4", {"project_qkv": project_modules}),
    ("2.4", {"project_qkv": project_float64}),
    ("3.1", {"forward_flops": forward_flops_loop}),
    ("3.1", {"forward_flops": forward_flops_matrix_params}),
    ("3.1", {"forward_flops": forward_flops_float}),
    ("3.2", {"new_token_flops": new_token_one_plus}),
    ("3.2", {"new_token_flops": new_token_matrix_params}),
    ("3.2", {"new_token_flops": new_token_difference}),
    ("3.3", {"generation_flops": generation_loop}),
    ("3.3", {"generation_flops": generation_helper}),
    ("3.3", {"generation_flops": generation_numpy}),
]


def _label(case) -> str:
    return f"{case[0]}-{next(iter(case[1].values())).__name__}"


@pytest.mark.parametrize("ex_id, replaced", ALTERNATIVES, ids=[_label(c) for c in ALTERNATIVES])
def test_alternative_correct_implementation_passes(ex_id, replaced):
    """Check that another correct way of writing the exercise passes every one of its checks."""
    assert _first_failure(ex_id, _module(ex_id, **replaced)) is None


def test_every_exercise_has_three_alternatives():
    """Check that the list above covers each exercise of notebooks 01-03 three times or more."""
    counts = {ex_id: sum(c[0] == ex_id for c in ALTERNATIVES) for ex_id in IDS}
    assert all(n >= 3 for n in counts.values()), counts


# =============================================================================================
# Likely slips, each rejected by the exercise's own checks with a message that names it


# 1.1
def softmax_no_shift(scores):
    e = np.exp(scores)
    return e / e.sum(axis=-1, keepdims=True)


def softmax_global_max(scores):
    e = np.exp(scores - scores.max())
    return e / e.sum(axis=-1, keepdims=True)


def softmax_row_mean(scores):
    e = np.exp(scores - scores.mean(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def softmax_float64_out(scores):
    x = np.asarray(scores, dtype=float)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def softmax_no_keepdims(scores):
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return e / e.sum()


# 1.2
def attend_unscaled(q, k, v, scale=None):
    probs = softmax_logsumexp(k @ q)
    return probs @ v, probs


def attend_by_d(q, k, v, scale=None):
    scale = 1 / q.shape[-1] if scale is None else scale
    probs = softmax_logsumexp((k @ q) * scale)
    return probs @ v, probs


def attend_np_sqrt(q, k, v, scale=None):
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    probs = softmax_logsumexp((k @ q) * scale)
    return probs @ v, probs


def attend_scale_ignored(q, k, v, scale=None):
    probs = softmax_logsumexp((k @ q) / math.sqrt(q.shape[-1]))
    return probs @ v, probs


# 1.3
def mask_top_left(seq_len, kv_len):
    return np.tril(np.ones((seq_len, kv_len), dtype=bool))


def mask_strict(seq_len, kv_len):
    return np.tril(np.ones((seq_len, kv_len), dtype=bool), k=kv_len - seq_len - 1)


def mask_upper(seq_len, kv_len):
    return np.triu(np.ones((seq_len, kv_len), dtype=bool), k=kv_len - seq_len)


def mask_ints(seq_len, kv_len):
    return np.tril(np.ones((seq_len, kv_len), dtype=int), k=kv_len - seq_len)


# 1.4
def _sa(q, k, v, *, mask="bottom", scale=True, after=False, sqrt=math.sqrt):
    T, S = q.shape[-2], k.shape[-2]
    scores = q @ k.swapaxes(-1, -2) / (sqrt(q.shape[-1]) if scale else 1)
    allowed = {"bottom": mask_aranges(T, S), "top": mask_top_left(T, S), "none": np.ones((T, S), dtype=bool)}[mask]
    if after:
        probs = np.where(allowed, softmax_logsumexp(scores), 0.0)
    else:
        probs = softmax_logsumexp(np.where(allowed, scores, -np.inf))
    return probs @ v, probs


SLIPS = [
    ("1.1", {"softmax": softmax_no_shift}, "Subtract each row's max"),
    ("1.1", {"softmax": softmax_global_max}, "the maximum of the whole array"),
    ("1.1", {"softmax": softmax_row_mean}, "the row's mean"),
    ("1.1", {"softmax": softmax_float64_out}, "float32 scores should give float32 weights"),
    ("1.1", {"softmax": softmax_no_keepdims}, "sum to 1"),
    ("1.2", {"attend": attend_unscaled}, "not scaled"),
    ("1.2", {"attend": attend_by_d}, "divided by head_dim"),
    ("1.2", {"attend": attend_np_sqrt}, "float32 inputs should give float32"),
    ("1.2", {"attend": attend_scale_ignored}, "scale you are given is ignored"),
    ("1.3", {"causal_mask": mask_top_left}, "aligned top-left"),
    ("1.3", {"causal_mask": mask_strict}, "attend to itself"),
    ("1.3", {"causal_mask": mask_upper}, "wrong side"),
    ("1.3", {"causal_mask": mask_ints}, "should be boolean"),
    ("1.4", {"causal_self_attention": lambda q, k, v: _sa(q, k, v, mask="none")}, "no mask"),
    ("1.4", {"causal_self_attention": lambda q, k, v: _sa(q, k, v, mask="top")}, "aligned top-left"),
    ("1.4", {"causal_self_attention": lambda q, k, v: _sa(q, k, v, scale=False)}, "not scaled"),
    ("1.4", {"causal_self_attention": lambda q, k, v: _sa(q, k, v, after=True)}, "after the softmax"),
    (
        "1.4",
        {"causal_self_attention": lambda q, k, v: _sa(q, k, v, sqrt=np.sqrt)},
        "float32 inputs should give float32",
    ),
]


# 2.1
def next_token_no_temperature(logits, temperature=0.0, generator=None):
    if temperature == 0:
        return logits.argmax(-1)
    return torch.multinomial(torch.softmax(logits, -1), 1, generator=generator).squeeze(-1)


def next_token_times_temperature(logits, temperature=0.0, generator=None):
    if temperature == 0:
        return logits.argmax(-1)
    return torch.multinomial(torch.softmax(logits * temperature, -1), 1, generator=generator).squeeze(-1)


def next_token_global_rng(logits, temperature=0.0, generator=None):
    if temperature == 0:
        return logits.argmax(-1)
    return torch.multinomial(torch.softmax(logits / temperature, -1), 1).squeeze(-1)


def next_token_reseeds(logits, temperature=0.0, generator=None):
    if temperature == 0:
        return logits.argmax(-1)
    return torch.multinomial(
        torch.softmax(logits / temperature, -1), 1, generator=torch.Generator().manual_seed(0)
    ).squeeze(-1)


def next_token_always_argmax(logits, temperature=0.0, generator=None):
    return logits.argmax(-1)


def next_token_keepdim(logits, temperature=0.0, generator=None):
    return logits.argmax(-1, keepdim=True)


# 2.2
def generate_first_position(model, input_ids, max_new_tokens, temperature=0.0, generator=None, on_token=None):
    ids = input_ids
    for _ in range(max_new_tokens):
        token = _next(model(ids)[:, 0], temperature, generator)
        ids = torch.cat([ids, token[:, None]], 1)
        if on_token:
            on_token(token)
    return ids


def generate_never_appends(model, input_ids, max_new_tokens, temperature=0.0, generator=None, on_token=None):
    new = []
    for _ in range(max_new_tokens):
        new.append(_next(model(input_ids)[:, -1], temperature, generator))
        if on_token:
            on_token(new[-1])
    return torch.cat([input_ids, torch.stack(new, 1)], 1)


def generate_greedy_only(model, input_ids, max_new_tokens, temperature=0.0, generator=None, on_token=None):
    return reference(BY_ID["2.2"])(model, input_ids, max_new_tokens, on_token=on_token)


def generate_new_tokens_only(model, input_ids, max_new_tokens, temperature=0.0, generator=None, on_token=None):
    return reference(BY_ID["2.2"])(model, input_ids, max_new_tokens, temperature, generator, on_token)[
        :, input_ids.shape[1] :
    ]


def generate_callback_at_end(model, input_ids, max_new_tokens, temperature=0.0, generator=None, on_token=None):
    out = reference(BY_ID["2.2"])(model, input_ids, max_new_tokens, temperature, generator)
    if on_token:
        on_token(out[:, input_ids.shape[1] :])
    return out


# 2.3
def _stamps(model, input_ids, max_new_tokens):
    start, stamps = time.perf_counter(), []
    reference(BY_ID["2.2"])(model, input_ids, max_new_tokens, on_token=lambda token: stamps.append(time.perf_counter()))
    return start, stamps


def measure_without_prefill(model, input_ids, max_new_tokens):
    start, stamps = _stamps(model, input_ids, max_new_tokens)
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    return gaps[0], gaps  # TTFT taken as the first decode step: the prefill left out


def measure_average_tpot(model, input_ids, max_new_tokens):
    start, stamps = _stamps(model, input_ids, max_new_tokens)
    average = (stamps[-1] - start) / max_new_tokens  # over all steps, the prefill included
    return stamps[0] - start, [average] * (max_new_tokens - 1)


def measure_whole_generation(model, input_ids, max_new_tokens):
    start, stamps = _stamps(model, input_ids, max_new_tokens)
    return stamps[-1] - start, [b - a for a, b in zip(stamps, stamps[1:])]


def measure_clock_readings(model, input_ids, max_new_tokens):
    start, stamps = _stamps(model, input_ids, max_new_tokens)
    return stamps[0], [b - a for a, b in zip(stamps, stamps[1:])]


def measure_ttft_in_tpots(model, input_ids, max_new_tokens):
    start, stamps = _stamps(model, input_ids, max_new_tokens)
    times = [start] + stamps
    gaps = [b - a for a, b in zip(times, times[1:])]
    return gaps[0], gaps


# 2.4
def _project(
    attn, h, cos, sin, *, rotate_q=True, rotate_k=True, rotate_v=False, split="right", angles=None, pairs="half"
):
    B, T, _ = h.shape
    D = attn.head_dim
    if angles == "from zero":
        cos, sin = rotary_tables(D, T)

    def heads(W, n):
        x = h @ W.T
        return x.view(B, T, n, D).transpose(1, 2) if split == "right" else x.view(B, n, T, D)

    def turn(x):
        if pairs == "half":
            return x * cos + rotate_half(x) * sin
        c, s = cos[:, : D // 2].repeat_interleave(2, -1), sin[:, : D // 2].repeat_interleave(2, -1)
        return x * c + torch.stack([-x[..., 1::2], x[..., 0::2]], -1).flatten(-2) * s

    q, k, v = (
        heads(attn.q_proj.weight, attn.n_heads),
        heads(attn.k_proj.weight, attn.n_kv_heads),
        heads(attn.v_proj.weight, attn.n_kv_heads),
    )
    return (turn(q) if rotate_q else q), (turn(k) if rotate_k else k), (turn(v) if rotate_v else v)


def project_all_query_heads(attn, h, cos, sin):
    B, T, _ = h.shape
    q, _, _ = _project(attn, h, cos, sin)
    return q, q, q  # k and v with n_heads heads, as if every layer were MHA


# 3.1
def forward_no_factor_two(config, seq_len):
    return reference(BY_ID["3.1"])(config, seq_len) // 2


def forward_no_lm_head(config, seq_len):
    return reference(BY_ID["3.1"])(config, seq_len) - 2 * seq_len * config.d_model * config.vocab_size


def forward_causal_half(config, seq_len):
    T, L, D, H = seq_len, config.n_layers, config.head_dim, config.n_heads
    return reference(BY_ID["3.1"])(config, T) - L * 4 * T * T * D * H + L * 2 * T * (T + 1) * D * H


def forward_mha_assumed(config, seq_len):
    return forward_flops_matrix_params(ModelConfig(**{**config.to_dict(), "n_kv_heads": config.n_heads}), seq_len)


# 3.2
def new_token_constant(config, kv_len):
    return reference(BY_ID["3.1"])(config, 1)


def new_token_attention_once(config, kv_len):
    return reference(BY_ID["3.2"])(config, kv_len) - config.n_layers * 2 * kv_len * config.head_dim * config.n_heads


def new_token_kv_heads(config, kv_len):
    return reference(BY_ID["3.2"])(config, kv_len) - config.n_layers * 4 * kv_len * config.head_dim * (
        config.n_heads - config.n_kv_heads
    )


def new_token_all_queries(config, kv_len):
    return (
        reference(BY_ID["3.1"])(config, 1)
        + config.n_layers * 4 * (kv_len * kv_len - 1) * config.head_dim * config.n_heads
    )


# 3.3
def _gen(config, prompt_len, n, *, prefill="forward", shift=0, naive_shift=0, swap=False):
    f, g = reference(BY_ID["3.1"]), reference(BY_ID["3.2"])
    naive = sum(f(config, prompt_len + i + naive_shift) for i in range(n))
    first = {"forward": f(config, prompt_len), "one token": g(config, prompt_len), "none": 0}[prefill]
    kept = first + sum(g(config, prompt_len + i + shift) for i in range(1, n))
    return (kept, naive) if swap else (naive, kept)


SLIPS += [
    ("2.1", {"next_token": next_token_no_temperature}, "temperature changes nothing"),
    ("2.1", {"next_token": next_token_times_temperature}, "multiplied by the temperature"),
    ("2.1", {"next_token": next_token_global_rng}, "use the generator you are given"),
    ("2.1", {"next_token": next_token_reseeds}, "do not reseed it"),
    ("2.1", {"next_token": next_token_always_argmax}, "every draw is the top token"),
    ("2.1", {"next_token": next_token_keepdim}, "shape (3,)"),
    ("2.2", {"generate": generate_first_position}, "first position"),
    ("2.2", {"generate": generate_never_appends}, "feed each chosen token back"),
    ("2.2", {"generate": generate_greedy_only}, "pass temperature"),
    ("2.2", {"generate": generate_new_tokens_only}, "(batch, 5 + 7)"),
    ("2.2", {"generate": generate_callback_at_end}, "once per new token"),
    ("2.3", {"measure_ttft_tpot": measure_without_prefill}, "the prefill was left out"),
    ("2.3", {"measure_ttft_tpot": measure_average_tpot}, "an average"),
    ("2.3", {"measure_ttft_tpot": measure_whole_generation}, "the whole generation"),
    ("2.3", {"measure_ttft_tpot": measure_clock_readings}, "clock reading"),
    ("2.3", {"measure_ttft_tpot": measure_ttft_in_tpots}, "the first entry is the prefill"),
    ("2.4", {"project_qkv": lambda a, h, c, s: _project(a, h, c, s, rotate_v=True)}, "v is rotated"),
    (
        "2.4",
        {"project_qkv": lambda a, h, c, s: _project(a, h, c, s, rotate_q=False, rotate_k=False)},
        "q is not rotated",
    ),
    ("2.4", {"project_qkv": lambda a, h, c, s: _project(a, h, c, s, rotate_k=False)}, "k is not rotated"),
    ("2.4", {"project_qkv": lambda a, h, c, s: _project(a, h, c, s, split="wrong")}, "heads are split wrongly"),
    ("2.4", {"project_qkv": lambda a, h, c, s: _project(a, h, c, s, angles="from zero")}, "positions 0, 1"),
    ("2.4", {"project_qkv": lambda a, h, c, s: _project(a, h, c, s, pairs="neighbours")}, "neighbouring features"),
    ("2.4", {"project_qkv": project_all_query_heads}, "n_kv_heads heads"),
    ("3.1", {"forward_flops": forward_no_factor_two}, "2 FLOPs per multiply-add"),
    ("3.1", {"forward_flops": forward_no_lm_head}, "lm_head"),
    ("3.1", {"forward_flops": forward_causal_half}, "causal half"),
    ("3.1", {"forward_flops": forward_mha_assumed}, "n_kv_heads heads, not n_heads"),
    ("3.2", {"new_token_flops": new_token_constant}, "must still meet all kv_len keys"),
    ("3.2", {"new_token_flops": new_token_attention_once}, "attention counted once"),
    ("3.2", {"new_token_flops": new_token_kv_heads}, "counted for n_kv_heads heads"),
    ("3.2", {"new_token_flops": new_token_all_queries}, "counted for kv_len queries"),
    (
        "3.3",
        {"generation_flops": lambda c, p, n: _gen(c, p, n, prefill="one token")},
        "the prefill is counted as one new token",
    ),
    ("3.3", {"generation_flops": lambda c, p, n: _gen(c, p, n, shift=-1)}, "one key short"),
    ("3.3", {"generation_flops": lambda c, p, n: _gen(c, p, n, shift=1)}, "one key too many"),
    ("3.3", {"generation_flops": lambda c, p, n: _gen(c, p, n, naive_shift=1)}, "step 0 is the prompt alone"),
    ("3.3", {"generation_flops": lambda c, p, n: _gen(c, p, n, prefill="none")}, "the prefill is missing"),
    ("3.3", {"generation_flops": lambda c, p, n: _gen(c, p, n, swap=True)}, "wrong way round"),
]


@pytest.mark.parametrize("ex_id, replaced, words", SLIPS, ids=[f"{c[0]}-{i}-{c[2][:24]}" for i, c in enumerate(SLIPS)])
def test_slip_is_rejected_by_its_own_exercise_naming_it(ex_id, replaced, words):
    """Check that a likely wrong implementation fails the exercise's own checks, and the message names the slip."""
    failure = _first_failure(ex_id, _module(ex_id, **replaced))
    assert failure is not None, f"Exercise {ex_id} passed a wrong implementation"
    assert words in failure, failure


def test_every_exercise_has_three_slips():
    """Check that the list above holds three or more likely slips for each exercise of notebooks 01-03."""
    counts = {ex_id: sum(c[0] == ex_id for c in SLIPS) for ex_id in IDS}
    assert all(n >= 3 for n in counts.values()), counts


# =============================================================================================
# A function that vandalises its arguments scores 0 on every check


def _vandalise(x) -> None:
    """Zero what can be zeroed in place; shrink a config; slow a stand-in's clock to nothing."""
    from kvlib.core.model import ModelConfig as Config
    from kvlib.core.model import SlowDecoder

    if isinstance(x, np.ndarray) and x.flags.writeable:
        x[...] = 0
    elif isinstance(x, torch.Tensor):
        with torch.no_grad():
            x.zero_()
    elif isinstance(x, torch.nn.Module):
        with torch.no_grad():
            for p in x.parameters():
                p.zero_()
        if isinstance(x, SlowDecoder):
            x.per_token = 0.0
    elif isinstance(x, Config):
        for field in ("d_model", "n_layers", "n_heads", "n_kv_heads", "hidden_dim", "vocab_size"):
            object.__setattr__(x, field, 2 if field == "d_model" else 1)
    elif isinstance(x, torch.Generator):
        x.manual_seed(0)


def _vandal(fn):
    def vandal(*args, **kwargs):
        for a in (*args, *kwargs.values()):
            _vandalise(a)
        return fn(*args, **kwargs)  # answers from what it left of its arguments

    vandal.__name__ = fn.__name__
    return vandal


# 1.3's arguments are two ints: nothing to change in place
VANDAL_CHECKS = [c for ex_id in IDS if ex_id != "1.3" for c in checks_for(BY_ID[ex_id])]


@pytest.mark.parametrize("check", VANDAL_CHECKS, ids=lambda c: c.name)
def test_a_function_that_changes_its_arguments_scores_zero(check):
    """Check that zeroing the arrays, tensors, weights or config a check passes cannot make it expect the wrong answer."""
    ex = check.exercise
    module = _module(ex.id, **{ex.name: _vandal(reference(ex))})
    with np.errstate(all="ignore"), pytest.raises(Exception):  # noqa: B017 - any failure is a score of 0
        check.fn(module, np.random.default_rng(0))


def test_the_stand_in_clock_is_fake_and_restored():
    """Check that 2.3's stand-in charges its fake clock, never real time, and gives the real clocks back."""
    from kvlib.checks.generation import _stand_in

    model = _stand_in()
    real = time.perf_counter
    with model.fake_clock(_module("2.3")):
        start = time.perf_counter()
        model(torch.zeros(1, 10, dtype=torch.long))  # a prefill: 10 new tokens + a tenth of 10
        prefill = time.perf_counter() - start
        model(torch.zeros(1, 11, dtype=torch.long))  # a naive decode step: 1 new + a tenth of 11
        step = time.perf_counter() - start - prefill
        assert (
            imported_perf_counter is not time.perf_counter
        )  # module imports are faked too... by name only when passed
    assert time.perf_counter is real
    assert prefill == pytest.approx(0.11) and step == pytest.approx(0.021)
