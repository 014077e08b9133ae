"""Exercises 5.1-6.4 against the checks that grade them (issue 15): other correct ways pass, likely slips
are rejected with a message naming the slip, and a function that changes its own arguments scores 0.

Each check takes a module, so a test hands it a namespace holding the reference's functions with one
of them replaced (tests/test_roofline.py and tests/test_gqa.py hold the older named slips). Runs in
reference mode (conftest). No test asserts on time.
"""

import dataclasses
import math
import types
from fractions import Fraction

import numpy as np
import pytest
import torch
from conftest import handed_in

from kvlib import gqa, roofline
from kvlib.checks import CHECKS, checks_for
from kvlib.core.model import Decoder, ModelConfig, matrix_params
from kvlib.course.exercises import BY_ID
from kvlib.kv_cache import kv_cache_bytes  # Exercise 4.4: its alternatives and slips are in tests/test_slips_04.py

torch.set_num_threads(1)

F16 = torch.float16
ROOFLINE = (
    "bytes_per_element",
    "matmul_intensity",
    "ridge_batch",
    "step_cost",
    "predicted_tokens_per_second",
    "roofline_time",
)
GQA = ("repeat_kv", "grouped_attention", "mean_pool_heads", "to_gqa", "first_head_of_group")


def _module(ex_id: str, **replaced) -> types.SimpleNamespace:
    return handed_in(*((roofline, ROOFLINE) if ex_id.startswith("5.") else (gqa, GQA)), **replaced)


def _run_checks(ex_id: str, **replaced) -> list[str]:
    """Every check of one exercise on the namespace: the failure messages ('' for a pass)."""
    out = []
    for check in checks_for(BY_ID[ex_id]):
        try:
            check.fn(_module(ex_id, **replaced), np.random.default_rng(0))
            out.append("")
        except AssertionError as err:
            out.append(str(err) or "assertion")
    return out


# ---------------------------------------------------------------------------------------------
# Other correct implementations: at least three per exercise, all must pass every check


def _bytes(dtype):
    return torch.finfo(dtype).bits // 8 if dtype.is_floating_point else torch.iinfo(dtype).bits // 8


def intensity_fraction(m, k, n, dtype=F16):  # exact rational arithmetic, then a float
    return float(Fraction(2 * m * k * n, (m * k + k * n + m * n) * dtype.itemsize))


def intensity_finfo(m, k, n, dtype=F16):
    flops = 2.0 * m * k * n
    return flops / (_bytes(dtype) * (m * k) + _bytes(dtype) * (k * n) + _bytes(dtype) * (m * n))


def intensity_loop(m, k, n, dtype=F16):  # row by row: each row costs 2kn FLOPs and brings k inputs, n outputs
    flops, moved = 0, k * n * dtype.itemsize
    for _ in range(m):
        flops += 2 * k * n
        moved += (k + n) * dtype.itemsize
    return flops / moved


def ridge_linear_search(k, n, peak, bw, dtype=F16):
    ridge = peak / bw
    if 2 * k * n / ((k + n) * dtype.itemsize) <= ridge:  # the intensity's limit as the rows grow
        return None
    m = 1
    while roofline.matmul_intensity(m, k, n, dtype) < ridge:
        m += 1
    return m


def ridge_bisect(k, n, peak, bw, dtype=F16):
    ridge = peak / bw
    b = roofline.bytes_per_element(dtype)
    if 2 * k * n <= ridge * b * (k + n):
        return None
    low, high = 1, 1
    while 2 * high * k * n < ridge * b * (high * k + k * n + high * n):
        high *= 2
    while low < high:
        mid = (low + high) // 2
        if 2 * mid * k * n < ridge * b * (mid * k + k * n + mid * n):
            low = mid + 1
        else:
            high = mid
    return low


def ridge_fraction(k, n, peak, bw, dtype=F16):
    ridge, b = Fraction(peak) / Fraction(bw), dtype.itemsize
    slope = 2 * k * n - ridge * b * (k + n)
    return None if slope <= 0 else max(1, math.ceil(ridge * b * k * n / slope))


def step_per_matrix(config, new_tokens, kv_len, batch=1, dtype=F16):
    C, D, H, H_kv, F = config.d_model, config.head_dim, config.n_heads, config.n_kv_heads, config.hidden_dim
    shapes = [(C, H * D), (C, H_kv * D), (C, H_kv * D), (H * D, C), (C, F), (C, F), (F, C)] * config.n_layers
    shapes.append((C, config.vocab_size))  # the output head
    weights = sum(a * b for a, b in shapes)
    flops = sum(2 * batch * new_tokens * a * b for a, b in shapes)
    flops += config.n_layers * H * batch * (2 * new_tokens * kv_len * D + 2 * new_tokens * kv_len * D)  # scores, values
    return flops, weights * dtype.itemsize + kv_cache_bytes(config, kv_len, 1, dtype) * batch


def step_float(config, new_tokens, kv_len, batch=1, dtype=F16):  # float64 intermediates, ints at the end
    per_seq = (
        2.0 * new_tokens * matrix_params(config)
        + 4.0 * config.n_layers * config.n_heads * new_tokens * kv_len * config.head_dim
    )
    return int(round(batch * per_seq)), int(matrix_params(config) * float(dtype.itemsize)) + kv_cache_bytes(
        config, kv_len, batch, dtype
    )


def step_cache_first(config, new_tokens, kv_len, batch=1, dtype=F16):
    cache = kv_cache_bytes(config, kv_len, batch, dtype)
    attention = config.n_layers * config.n_heads * 4 * new_tokens * kv_len * config.head_dim
    return batch * (2 * new_tokens * matrix_params(config) + attention), cache + roofline.bytes_per_element(
        dtype
    ) * matrix_params(config)


def tps_explicit(config, kv_len, batch, dtype, peak, bw):
    flops, moved = roofline.step_cost(config, 1, kv_len, batch, dtype)
    return batch / max(flops / peak, moved / bw)


def tps_rates(config, kv_len, batch, dtype, peak, bw):  # the slower of the two rates, in steps per second
    flops, moved = roofline.step_cost(config, 1, kv_len, batch, dtype)
    return float(batch * min(peak / flops, bw / moved))


def tps_fraction(config, kv_len, batch, dtype, peak, bw):
    flops, moved = roofline.step_cost(config, 1, kv_len, batch, dtype)
    return float(batch / max(Fraction(flops) / Fraction(peak), Fraction(moved) / Fraction(bw)))


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


def attention_sdpa(q, k, v):
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


ALTERNATIVES = {
    "5.1": {"matmul_intensity": [intensity_fraction, intensity_finfo, intensity_loop]},
    "5.2": {"ridge_batch": [ridge_linear_search, ridge_bisect, ridge_fraction]},
    "5.3": {"step_cost": [step_per_matrix, step_float, step_cache_first]},
    "5.4": {"predicted_tokens_per_second": [tps_explicit, tps_rates, tps_fraction]},
    "6.1": {"repeat_kv": [repeat_expand_index, repeat_stack, repeat_loop]},
    "6.2": {"grouped_attention": [attention_einsum, attention_loop, attention_sdpa]},
    "6.3": {"mean_pool_heads": [pool_loop, pool_avg_pool, pool_float64]},
    "6.4": {"to_gqa": [to_gqa_deepcopy, to_gqa_load, to_gqa_copy_params]},
}
_ALT_CASES = [(ex, name, fn) for ex, by_name in ALTERNATIVES.items() for name, fns in by_name.items() for fn in fns]


@pytest.mark.parametrize("ex_id, name, fn", _ALT_CASES, ids=[f"{c[0]}-{c[2].__name__}" for c in _ALT_CASES])
def test_other_correct_implementations_pass(ex_id, name, fn):
    """Check that a correct implementation written another way passes every check of its exercise."""
    failures = [m for m in _run_checks(ex_id, **{name: fn}) if m]
    assert not failures, failures


# ---------------------------------------------------------------------------------------------
# Likely slips: at least three per exercise beyond tests/test_roofline.py and tests/test_gqa.py, each named


def intensity_int_division(m, k, n, dtype=F16):
    return 2 * m * k * n // ((m * k + k * n + m * n) * dtype.itemsize)


def intensity_fixed_two_bytes(m, k, n, dtype=F16):
    return 2 * m * k * n / ((m * k + k * n + m * n) * 2)


def intensity_output_twice(m, k, n, dtype=F16):
    return 2 * m * k * n / ((m * k + k * n + 2 * m * n) * dtype.itemsize)


def ridge_approximation(k, n, peak, bw, dtype=F16):
    return max(1, math.ceil(peak / bw * dtype.itemsize / 2))


def ridge_in_bits(k, n, peak, bw, dtype=F16):
    return roofline.ridge_batch(k, n, peak, bw / 8, dtype)  # ridge * 8 bits ... the same as 8x the bytes per element


def ridge_never_none(k, n, peak, bw, dtype=F16):
    ridge, b = peak / bw, dtype.itemsize
    return math.ceil(ridge * b * k * n / (2 * k * n - ridge * b * (k + n)))


def ridge_float(k, n, peak, bw, dtype=F16):
    ridge, b = peak / bw, dtype.itemsize
    slope = 2 * k * n - ridge * b * (k + n)
    return None if slope <= 0 else ridge * b * k * n / slope


def step_no_attention(config, new_tokens, kv_len, batch=1, dtype=F16):
    flops, moved = roofline.step_cost(config, new_tokens, kv_len, batch, dtype)
    return batch * 2 * new_tokens * matrix_params(config), moved


def step_attention_kv_heads(config, new_tokens, kv_len, batch=1, dtype=F16):
    _, moved = roofline.step_cost(config, new_tokens, kv_len, batch, dtype)
    attention = config.n_layers * config.n_kv_heads * 4 * new_tokens * kv_len * config.head_dim
    return batch * (2 * new_tokens * matrix_params(config) + attention), moved


def step_attention_once(config, new_tokens, kv_len, batch=1, dtype=F16):
    _, moved = roofline.step_cost(config, new_tokens, kv_len, batch, dtype)
    attention = config.n_layers * config.n_heads * 2 * new_tokens * kv_len * config.head_dim
    return batch * (2 * new_tokens * matrix_params(config) + attention), moved


def step_attention_square(config, new_tokens, kv_len, batch=1, dtype=F16):
    _, moved = roofline.step_cost(config, new_tokens, kv_len, batch, dtype)
    attention = config.n_layers * config.n_heads * 4 * kv_len * kv_len * config.head_dim
    return batch * (2 * new_tokens * matrix_params(config) + attention), moved


def tps_summed(config, kv_len, batch, dtype, peak, bw):
    flops, moved = roofline.step_cost(config, 1, kv_len, batch, dtype)
    return batch / (flops / peak + moved / bw)


def tps_memory_only(config, kv_len, batch, dtype, peak, bw):
    _, moved = roofline.step_cost(config, 1, kv_len, batch, dtype)
    return batch / (moved / bw)


def tps_prefill(config, kv_len, batch, dtype, peak, bw):
    flops, moved = roofline.step_cost(config, kv_len, kv_len, batch, dtype)
    return batch / roofline.roofline_time(flops, moved, peak, bw)


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


SLIPS = [  # (exercise, function, wrong implementation, words the failure must contain)
    ("5.1", "matmul_intensity", intensity_int_division, "not //"),
    ("5.1", "matmul_intensity", intensity_fixed_two_bytes, "element size depends on dtype"),
    ("5.1", "matmul_intensity", intensity_output_twice, "written once"),
    ("5.2", "ridge_batch", ridge_approximation, "large-matrix approximation"),
    ("5.2", "ridge_batch", ridge_in_bits, "bytes, not bits"),
    ("5.2", "ridge_batch", ridge_never_none, "return None"),
    ("5.2", "ridge_batch", ridge_float, "int number of rows"),
    ("5.3", "step_cost", step_no_attention, "attention's own FLOPs are missing"),
    ("5.3", "step_cost", step_attention_kv_heads, "n_heads, not n_kv_heads"),
    ("5.3", "step_cost", step_attention_once, "attention counted once"),
    ("5.3", "step_cost", step_attention_square, "not kv_len ** 2"),
    ("5.4", "predicted_tokens_per_second", tps_summed, "not their sum"),
    ("5.4", "predicted_tokens_per_second", tps_memory_only, "compute-bound"),
    ("5.4", "predicted_tokens_per_second", tps_prefill, "step_cost(config, 1, kv_len"),
    ("6.1", "repeat_kv", repeat_wrong_dim, "should be (2, 6, 5, 8)"),
    ("6.1", "repeat_kv", repeat_expand_front, "that is x.repeat"),
    ("6.1", "repeat_kv", repeat_modulo, "that is x.repeat"),
    ("6.2", "grouped_attention", attention_offset_t_minus_one, "diagonal offset is kv_len - seq_len"),
    ("6.2", "grouped_attention", attention_rows_interleaved, "mask rows are in the wrong order"),
    ("6.2", "grouped_attention", attention_group_for_queries, "built for group_size queries"),
    ("6.2", "grouped_attention", attention_no_scale, "sqrt(head_dim)"),
    ("6.3", "mean_pool_heads", pool_first_half, "differs from the mean"),
    ("6.3", "mean_pool_heads", pool_d_model_axis, "differs from the mean"),
    ("6.3", "mean_pool_heads", pool_median, "differs from the mean"),
    ("6.4", "to_gqa", to_gqa_n_heads, "already GQA"),
    ("6.4", "to_gqa", to_gqa_float32, "keep the source's dtype"),
    ("6.4", "to_gqa", to_gqa_train_mode, "eval mode"),
    ("6.4", "to_gqa", to_gqa_ignores_pool, "pool function it is given"),
]


@pytest.mark.parametrize("ex_id, name, fn, words", SLIPS, ids=[f"{s[0]}-{s[2].__name__}" for s in SLIPS])
def test_likely_slip_is_rejected_and_named(ex_id, name, fn, words):
    """Check that a likely wrong implementation fails a check of its own exercise, with a message naming the slip."""
    failures = [m for m in _run_checks(ex_id, **{name: fn}) if m]
    assert failures, f"{fn.__name__} passed every check of {ex_id}"
    assert any(words in m for m in failures), failures


# ---------------------------------------------------------------------------------------------
# A function that changes its arguments scores 0: every check builds its target before the call


def _spoil(args):
    """What a hostile function does to what it is given: configs shrunk, tensors and models zeroed."""
    for a in args:
        if isinstance(a, ModelConfig):
            object.__setattr__(a, "n_layers", 1)  # a frozen dataclass still yields to object.__setattr__
        elif isinstance(a, torch.Tensor):
            a.zero_()
        elif isinstance(a, Decoder):
            with torch.no_grad():
                for p in a.parameters():
                    p.zero_()


def _mutating(fn):
    def mutant(*args, **kwargs):
        _spoil([*args, *kwargs.values()])
        return fn(*args, **kwargs)  # the right answer for what the arguments have become

    mutant.__name__ = f"mutating_{fn.__name__}"
    return mutant


_NUMBERS_ONLY = {"5.1", "5.2"}  # their functions take numbers and a dtype: nothing to change
_MUTABLE = [c for i in (3, 4) for c in checks_for(BY_ID[f"5.{i}"])] + [
    c for i in range(1, 5) for c in checks_for(BY_ID[f"6.{i}"])
]


@pytest.mark.parametrize("check", _MUTABLE, ids=lambda c: c.name)
def test_function_that_changes_its_arguments_scores_zero(check):
    """Check that a function which spoils its arguments, then answers for the spoiled ones, fails the check."""
    ex = check.exercise
    name = ex.name
    ref = getattr(roofline if ex.id.startswith("5.") else gqa, name)
    with pytest.raises(AssertionError):
        check.fn(_module(ex.id, **{name: _mutating(ref)}), np.random.default_rng(0))
    from kvlib.core.configs import REAL_MODELS

    assert REAL_MODELS["Llama-2-7B"].config.n_layers == 32, "a check handed learner code a shared config"


@pytest.mark.parametrize(
    "check", [c for ex in sorted(_NUMBERS_ONLY) for c in checks_for(BY_ID[ex])], ids=lambda c: c.name
)
def test_checks_of_5_1_and_5_2_pass_only_numbers(check):
    """Check that 5.1's and 5.2's checks hand learner code only ints, floats and dtypes, which no function can change."""
    ex = check.exercise
    ref, seen = getattr(roofline, ex.name), []

    def spy(*args, **kwargs):
        seen.extend([*args, *kwargs.values()])
        return ref(*args, **kwargs)

    check.fn(_module(ex.id, **{ex.name: spy}), np.random.default_rng(0))
    assert seen and all(type(a) in (int, float, torch.dtype) for a in seen), {type(a).__name__ for a in seen}


def test_every_check_of_05_and_06_is_covered():
    """Check that the two tests above cover every check of notebooks 05 and 06."""
    covered = {c.name for c in _MUTABLE} | {c.name for ex in _NUMBERS_ONLY for c in checks_for(BY_ID[ex])}
    assert covered == {name for name, c in CHECKS.items() if c.exercise.id[0] in "56"}


# ---------------------------------------------------------------------------------------------
# In the isolated grading child, as nbgrader runs them: Decoders travel with their dtype and mode


def _sandboxed(module: str, source: str, exercise_ids: tuple[str, ...]) -> dict[str, str]:
    """Every check of the exercises on kvlib/<module>.py run in the isolated child: name -> "pass" or its message."""
    from conftest import ROOT

    from kvlib.course.exercises import EXERCISES
    from kvlib.grading.sandbox import Sandbox, package_files

    files = package_files(ROOT / "kvlib")
    files[f"kvlib/{module}.py"] = source.encode()
    if (
        module == "roofline"
    ):  # step_cost (5.3) uses kv_cache_bytes, Exercise 4.4: done, as the learner of notebook 05 has
        files["kvlib/kv_cache.py"] = (ROOT / "solutions" / "kvlib" / "kv_cache.py").read_bytes()
    functions = sorted({f"{ex.module}.{ex.name}" for ex in EXERCISES if ex.module == module})
    verdicts = {}
    with Sandbox(files, [module], functions, mode="plain", torch=True, call_timeout=60, budget=300) as sandbox:
        for ex_id in exercise_ids:
            for check in checks_for(BY_ID[ex_id]):
                try:
                    check.fn(sandbox.module(module), np.random.default_rng(0))
                    verdicts[check.name] = "pass"
                except AssertionError as err:
                    verdicts[check.name] = str(err)
    return verdicts


@pytest.mark.slow
def test_checks_of_05_and_06_pass_the_reference_in_the_isolated_child():
    """Check that the reference passes every 5.x and 6.x check in the grading child."""
    from conftest import ROOT

    for module, ids in (("roofline", ("5.1", "5.2", "5.3", "5.4")), ("gqa", ("6.1", "6.2", "6.3", "6.4"))):
        verdicts = _sandboxed(module, (ROOT / "solutions" / "kvlib" / f"{module}.py").read_text(), ids)
        assert set(verdicts.values()) == {"pass"}, verdicts


@pytest.mark.slow
def test_to_gqa_that_loses_dtype_or_mode_fails_in_the_isolated_child():
    """Check that a to_gqa returning a float32 model in training mode fails there too: the child sends a model's
    dtype and train/eval mode both ways, so the check sees what the learner's function returned."""
    from conftest import ROOT

    source = (ROOT / "solutions" / "kvlib" / "gqa.py").read_text()
    old = "    return new.to(model.embed.weight.dtype).train(model.training)\n"
    assert old in source
    verdicts = _sandboxed("gqa", source.replace(old, "    return new.float().train()\n"), ("6.4",))
    assert "keep the source's dtype" in verdicts["to_gqa_converts_a_gqa_model_and_keeps_dtype_and_mode"], verdicts
    source = source.replace(old, "    return new.to(model.embed.weight.dtype)\n")  # a new nn.Module is in training mode
    verdicts = _sandboxed("gqa", source, ("6.4",))
    assert "eval mode" in verdicts["to_gqa_converts_a_gqa_model_and_keeps_dtype_and_mode"], verdicts
