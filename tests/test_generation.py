"""kvlib/generation.py (notebook 02): the reference passes every check, the stand-in's fake clock, and bad
input (empty prompt, too many tokens) gets a clear error.

Each exercise's check tests live here under three names, built with conftest.handed_in: ALTERNATIVES
(correct implementations in another shape, which pass every check of their exercise), SLIPS (likely
wrong ones, which fail the check or exercise named, with a message naming the slip), and a
function that changes its arguments (conftest.vandal) scores 0."""

import math
import time
from time import perf_counter as imported_perf_counter  # a learner may import the clock by name

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import assert_slip_named, case_ids, check_failures, handed_in, spoil_everything, vandal

from kvlib import generation
from kvlib.attention import causal_self_attention
from kvlib.checks import CHECKS, checks_for
from kvlib.checks.generation import _model
from kvlib.core.model import Decoder, apply_rotary, counted_params, rotate_half
from kvlib.course.exercises import BY_ID, reference

IDS = ["2.1", "2.2", "2.3", "2.4", "2.5", "2.6", "2.7", "2.8"]
GEN_CHECKS = [c for ex_id in IDS for c in checks_for(BY_ID[ex_id])]


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


def test_attention_block_refuses_grouped_heads():
    """Check that 2.4 names notebook 06 for a layer whose query heads share key/value heads."""
    from kvlib.core.model import Attention, ModelConfig

    attn = Attention(ModelConfig(vocab_size=5, d_model=16, n_heads=4, n_kv_heads=2))
    cos, sin = torch.ones(3, 4), torch.zeros(3, 4)
    with pytest.raises(ValueError, match="notebook 06"):
        generation.attention_block(attn, torch.zeros(1, 3, 16), cos, sin)


def test_param_counts_are_expected_from_the_shapes_a_decoder_builds():
    """Check that 2.8's expected parts, counted from weight shapes, equal a built Decoder's parameters on small
    configs (MHA and GQA) and sum to kvlib's analytic count where the config is widened past what any tensor holds."""
    from kvlib.checks.generation import _expected_params, _widened
    from kvlib.core.configs import REAL_MODELS
    from kvlib.core.model import ModelConfig, num_params

    for config in (
        ModelConfig(vocab_size=37, d_model=24, n_layers=3, n_heads=6, n_kv_heads=2, hidden_dim=40, max_seq_len=16),
        ModelConfig(vocab_size=11, d_model=16, n_layers=2, n_heads=4, n_kv_heads=4, hidden_dim=20, max_seq_len=16),
    ):
        assert _expected_params(config) == counted_params(Decoder(config))
        wide = _widened(config, 2**31)
        assert sum(_expected_params(wide).values()) == num_params(wide) > 2**63
    wide = _widened(REAL_MODELS["Llama-3-8B"].config, 2**29)
    assert sum(_expected_params(wide).values()) == num_params(wide)


def test_next_token_rejects_wrong_shapes():
    """Check that next_token names the expected (batch, vocab_size) shape and a negative temperature."""
    with pytest.raises(ValueError, match=r"\(batch, vocab_size\), got \(2, 3, 4\)"):
        generation.next_token(torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match="temperature must be a number >= 0"):
        generation.next_token(torch.zeros(2, 4), temperature=-1)


NAMES = (
    "next_token",
    "generate",
    "measure_ttft_itl",
    "attention_block",
    "rms_norm",
    "swiglu",
    "temper",
    "param_counts",
)


def _module(**replaced):
    """What a learner hands in: kvlib.generation (the reference, in reference mode) with some functions replaced."""
    return handed_in(generation, NAMES, **replaced)


# ---------------------------------------------------------------------------------------------
# Other correct implementations (ALTERNATIVES) pass every check of their exercise


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
    return generation.next_token(logits, temperature, generator)  # Exercise 2.1 (the reference, in reference mode)


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


# 2.3 measure_ttft_itl ------------------------------------------------------------------------
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


# 2.4 attention_block -------------------------------------------------------------------------
def attention_per_head(attn, h, cos, sin, self_attention=causal_self_attention):
    """One head at a time, each through the given attention on its own (batch, seq_len, head_dim) slice (rotate_half
    imported by the learner: the stub imports no rotary helper)."""
    from kvlib.core.model import rotate_half  # noqa: PLC0415 (a learner's module holds it; the stub does not)

    D = attn.head_dim
    with torch.no_grad():
        q, k, v = (proj(h) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))  # (B, T, H*D) each
        outs = []
        for i in range(attn.n_heads):
            part = slice(i * D, (i + 1) * D)
            qi, ki = (x[..., part] * cos + rotate_half(x[..., part]) * sin for x in (q, k))  # rotary, head i
            out, _ = self_attention(qi.numpy(), ki.numpy(), v[..., part].numpy())
            outs.append(torch.from_numpy(out))
        return attn.o_proj(torch.cat(outs, dim=-1))  # heads side by side again: (B, T, H*D) -> (B, T, C)


def attention_flat_heads(attn, h, cos, sin, self_attention=causal_self_attention):
    """Projections by einsum, every (batch, head) pair flattened into one leading axis of the given attention."""
    B, T, _ = h.shape
    H, D = attn.n_heads, attn.head_dim
    with torch.no_grad():
        q, k, v = (
            torch.einsum("btc,jc->btj", h, p.weight).reshape(B, T, H, D).permute(0, 2, 1, 3)
            for p in (attn.q_proj, attn.k_proj, attn.v_proj)
        )
        q, k = (apply_rotary(x, cos, sin).reshape(B * H, T, D) for x in (q, k))
        out, _ = self_attention(q.numpy(), k.numpy(), v.reshape(B * H, T, D).numpy())
        out = torch.from_numpy(out).reshape(B, H, T, D).permute(0, 2, 1, 3).flatten(2)
        return torch.einsum("btj,cj->btc", out, attn.o_proj.weight)


def attention_query_by_query(attn, h, cos, sin, self_attention=causal_self_attention):
    """Each query alone against the keys up to it (seq_len 1 of kv_len t + 1, as Exercise 1.4 allows), in float64."""
    B, T, _ = h.shape
    H, D = attn.n_heads, attn.head_dim
    with torch.no_grad():
        h64, c64, s64 = h.double(), cos.double(), sin.double()
        q, k, v = (
            (h64 @ p.weight.double().T).view(B, T, H, D).transpose(1, 2)
            for p in (attn.q_proj, attn.k_proj, attn.v_proj)
        )
        q, k = q * c64 + rotate_half(q) * s64, k * c64 + rotate_half(k) * s64
        out = np.zeros((B, H, T, D))
        for b in range(B):
            for i in range(H):
                for t in range(T):
                    qs, ks, vs = (x[b, i, a : t + 1].numpy() for x, a in ((q, t), (k, 0), (v, 0)))
                    out[b, i, t] = self_attention(qs, ks, vs)[0][0]
        joined = torch.from_numpy(out).transpose(1, 2).reshape(B, T, H * D)
        return (joined @ attn.o_proj.weight.double().T).float()


# 2.5 rms_norm --------------------------------------------------------------------------------
def rms_norm_divide(x, weight, eps=1e-5):
    x32 = x.to(torch.float32)
    return (weight.float() * x32 / torch.sqrt(x32.square().mean(-1, keepdim=True) + eps)).to(x.dtype)


def rms_norm_torch(x, weight, eps=1e-5):
    return F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype) * weight


def rms_norm_float64_norm(x, weight, eps=1e-5):
    x64 = x.double()
    ms = torch.linalg.vector_norm(x64, dim=-1, keepdim=True) ** 2 / x.shape[-1]
    return (x64 / (ms + eps).sqrt()).to(x.dtype) * weight


# 2.6 swiglu ----------------------------------------------------------------------------------
def swiglu_linear(x, w_gate, w_up, w_down):
    return F.linear(F.silu(F.linear(x, w_gate)) * F.linear(x, w_up), w_down)


def swiglu_einsum(x, w_gate, w_up, w_down):
    g, u = torch.einsum("...c,hc->...h", x, w_gate), torch.einsum("...c,hc->...h", x, w_up)
    return torch.einsum("...h,ch->...c", g * torch.sigmoid(g) * u, w_down)


def swiglu_float64(x, w_gate, w_up, w_down):
    x64 = x.double()
    g = x64 @ w_gate.double().T
    return ((g / (1 + torch.exp(-g))) * (x64 @ w_up.double().T) @ w_down.double().T).to(x.dtype)


def swiglu_float32_out(x, w_gate, w_up, w_down):  # slip: 16-bit x computed in float32 and left there
    x, w_gate, w_up, w_down = (t.float() for t in (x, w_gate, w_up, w_down))
    return (F.silu(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T


# 2.7 -----------------------------------------------------------------------------------------
def _one_hot(probs):
    return F.one_hot(probs.argmax(dim=-1), probs.shape[-1]).to(probs.dtype)


def temper_power(probs, temperature):
    if temperature == 0:
        return _one_hot(probs)
    w = (probs / probs.amax(dim=-1, keepdim=True)) ** (1 / temperature)  # the largest entry is 1: no underflow
    return w / w.sum(dim=-1, keepdim=True)


def temper_logsumexp64(probs, temperature):
    if temperature == 0:
        return _one_hot(probs)
    z = probs.double().log() / temperature
    return torch.exp(z - torch.logsumexp(z, dim=-1, keepdim=True)).to(probs.dtype)


def temper_numpy(probs, temperature):
    if temperature == 0:
        return _one_hot(probs)
    with np.errstate(divide="ignore"):
        z = np.log(probs.numpy().astype(np.float64)) / temperature
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return torch.from_numpy(e / e.sum(axis=-1, keepdims=True)).to(probs.dtype)


# 2.8 -----------------------------------------------------------------------------------------
def params_per_layer_loop(config):
    C, D = config.d_model, config.head_dim
    out = {"embedding": config.vocab_size * C, "attention": 0, "mlp": 0, "norms": C, "lm_head": config.vocab_size * C}
    for _ in range(config.n_layers):
        for width in (config.n_heads, config.n_kv_heads, config.n_kv_heads, config.n_heads):  # q, k, v, o
            out["attention"] += C * width * D
        out["mlp"] += 3 * C * config.hidden_dim
        out["norms"] += 2 * C
    return out


def params_by_group(config):
    C, L = config.d_model, config.n_layers
    kv = config.n_kv_heads * config.head_dim  # k and v: one head per group of config.group_size query heads
    return {
        "embedding": config.vocab_size * C,
        "attention": L * (2 * C * C + 2 * C * kv),
        "mlp": L * 3 * C * config.hidden_dim,
        "norms": (2 * L + 1) * C,
        "lm_head": config.vocab_size * C,
    }


def params_from_shapes(config):
    """Each weight's shape written out, its numbers multiplied with math.prod (Python ints: exact at any size)."""
    C, D, F, V = config.d_model, config.head_dim, config.hidden_dim, config.vocab_size
    layer = {
        "attention": [(C, config.n_heads * D), (C, config.n_kv_heads * D)] * 2,
        "mlp": [(C, F)] * 3,
        "norms": [(C,)] * 2,
    }
    out = {part: config.n_layers * sum(math.prod(s) for s in shapes) for part, shapes in layer.items()}
    return {"embedding": V * C, **out, "norms": out["norms"] + C, "lm_head": V * C}


def params_built_on_meta(config):
    """The cheat the reader found: a decoder built on torch's meta device (no memory), its parameters counted."""
    with torch.device("meta"):
        return counted_params(Decoder(config))


def params_numpy_int64(config):
    """numpy's int64 arithmetic, which wraps past 2**63."""
    C, D, L = (np.int64(n) for n in (config.d_model, config.head_dim, config.n_layers))
    V, F, H, H_kv = (np.int64(n) for n in (config.vocab_size, config.hidden_dim, config.n_heads, config.n_kv_heads))
    with np.errstate(over="ignore"):
        parts = {
            "embedding": V * C,
            "attention": L * (2 * C * H * D + 2 * C * H_kv * D),
            "mlp": L * 3 * C * F,
            "norms": (2 * L + 1) * C,
            "lm_head": V * C,
        }
    return {part: int(n) for part, n in parts.items()}


def params_float(config):
    """Counts in floating point, made ints at the end."""
    return {part: int(float(n) * 1.0000000000000002) for part, n in reference(BY_ID["2.8"])(config).items()}


ALTERNATIVES = [
    ("2.1", {"next_token": next_token_gumbel}),
    ("2.1", {"next_token": next_token_inverse_cdf}),
    ("2.1", {"next_token": next_token_float64}),
    ("2.2", {"generate": generate_buffer}),
    ("2.2", {"generate": generate_token_list}),
    ("2.2", {"generate": generate_recursive}),
    ("2.3", {"measure_ttft_itl": measure_own_loop}),
    ("2.3", {"measure_ttft_itl": measure_ns}),
    ("2.3", {"measure_ttft_itl": measure_imported_clock}),
    ("2.4", {"attention_block": attention_per_head}),
    ("2.4", {"attention_block": attention_flat_heads}),
    ("2.4", {"attention_block": attention_query_by_query}),
    ("2.5", {"rms_norm": rms_norm_divide}),
    ("2.5", {"rms_norm": rms_norm_torch}),
    ("2.5", {"rms_norm": rms_norm_float64_norm}),
    ("2.6", {"swiglu": swiglu_linear}),
    ("2.6", {"swiglu": swiglu_einsum}),
    ("2.6", {"swiglu": swiglu_float64}),
    ("2.7", {"temper": temper_power}),
    ("2.7", {"temper": temper_logsumexp64}),
    ("2.7", {"temper": temper_numpy}),
    ("2.8", {"param_counts": params_per_layer_loop}),
    ("2.8", {"param_counts": params_by_group}),
    ("2.8", {"param_counts": params_from_shapes}),
]


@pytest.mark.parametrize("ex_id, replaced", ALTERNATIVES, ids=case_ids(ALTERNATIVES))
def test_alternative_passes_every_check(ex_id, replaced):
    """Check that another correct way of writing the exercise passes every one of its checks."""
    with np.errstate(all="ignore"):
        assert not check_failures(ex_id, _module(**replaced))


def test_every_exercise_has_three_alternatives():
    """Check that ALTERNATIVES covers each exercise of notebook 02 three times or more."""
    counts = {ex_id: sum(c[0] == ex_id for c in ALTERNATIVES) for ex_id in IDS}
    assert all(n >= 3 for n in counts.values()), counts


# ---------------------------------------------------------------------------------------------
# Likely slips (SLIPS) fail their check, or their exercise's checks, with a message naming them


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


def generate_streams_after_loop(model, input_ids, max_new_tokens, temperature=0.0, generator=None, on_token=None):
    """The slip the reader found: every token handed to on_token, one by one, once the loop is over."""
    out = reference(BY_ID["2.2"])(model, input_ids, max_new_tokens, temperature, generator)
    for token in out[:, input_ids.shape[1] :].T:
        if on_token is not None:
            on_token(token)
    return out


def generate_streams_a_step_late(model, input_ids, max_new_tokens, temperature=0.0, generator=None, on_token=None):
    """Each token shown only after the model has read it: on_token called at the top of the next step."""
    ids, last = input_ids, None
    with torch.inference_mode():
        for _ in range(max_new_tokens):
            token = generation.next_token(model(ids)[:, -1], temperature, generator)
            if last is not None and on_token is not None:
                on_token(last)
            ids, last = torch.cat([ids, token[:, None]], dim=1), token
    if on_token is not None:
        on_token(last)
    return ids


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


def measure_gaps_from_start(model, input_ids, max_new_tokens):
    start, stamps = _stamps(model, input_ids, max_new_tokens)
    return stamps[0] - start, [t - start for t in stamps[1:]]  # every gap from the call's start: a running total


def measure_gaps_from_first(model, input_ids, max_new_tokens):
    start, stamps = _stamps(model, input_ids, max_new_tokens)
    return stamps[0] - start, [t - stamps[0] for t in stamps[1:]]  # every gap from the first token


# 2.4
def _block(
    attn,
    h,
    cos,
    sin,
    self_attention=causal_self_attention,
    *,
    join="right",
    o_proj="transposed",
    by_hand=None,
    split="right",
    rotate="qk",
    pairs="half",
    heads_first=True,
    prescale=False,
):
    """attention_block with one slip switched on by its keyword; by_hand ("unmasked", "unscaled") computes the
    attention itself instead of the given one."""
    (B, T, _), H, D = h.shape, attn.n_heads, attn.head_dim
    with torch.no_grad():

        def heads(W):
            x = h @ W.T
            return x.view(B, T, H, D).transpose(1, 2) if split == "right" else x.view(B, H, T, D)

        def turn(x):
            if pairs == "half":
                return x * cos + rotate_half(x) * sin
            c, s = cos[:, : D // 2].repeat_interleave(2, -1), sin[:, : D // 2].repeat_interleave(2, -1)
            return x * c + torch.stack([-x[..., 1::2], x[..., 0::2]], -1).flatten(-2) * s

        q, k, v = heads(attn.q_proj.weight), heads(attn.k_proj.weight), heads(attn.v_proj.weight)
        q, k, v = (turn(t) if name in rotate else t for name, t in zip("qkv", (q, k, v)))
        q = q / D**0.5 if prescale else q
        if by_hand is not None:
            scores = q @ k.transpose(-1, -2) / (D**0.5 if by_hand == "unmasked" else 1.0)
            if by_hand == "unscaled":
                scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
            out = torch.softmax(scores, -1) @ v  # (B, H, T, D)
        elif heads_first:
            out = torch.from_numpy(self_attention(q.numpy(), k.numpy(), v.numpy())[0])
        else:  # (B, T, H, D) handed over as it is: the attention runs over the heads
            q, k, v = (x.transpose(1, 2).numpy() for x in (q, k, v))
            out = torch.from_numpy(self_attention(q, k, v)[0]).transpose(1, 2)
        out = (out.transpose(1, 2) if join == "right" else out).reshape(B, T, H * D)
        W = attn.o_proj.weight
        return {"transposed": out @ W.T, "untransposed": out @ W, "missing": out}[o_proj]


def _slip(**keywords):
    """2.4's attention_block with the slip these keywords switch on (_block)."""
    return lambda a, h, c, s, self_attention=causal_self_attention: _block(a, h, c, s, self_attention, **keywords)


def attention_no_grad_guard(attn, h, cos, sin, self_attention=causal_self_attention):
    """The given attention handed tensors that record gradients: numpy refuses them."""
    B, T, _ = h.shape
    q = apply_rotary((h @ attn.q_proj.weight.T).view(B, T, attn.n_heads, attn.head_dim).transpose(1, 2), cos, sin)
    return torch.from_numpy(self_attention(q.numpy(), q.numpy(), q.numpy())[0])


def attention_sdpa(attn, h, cos, sin, self_attention=causal_self_attention):
    """The shortcut: torch's fused attention for every head, the given attention never called."""
    B, T, _ = h.shape
    H, D = attn.n_heads, attn.head_dim
    with torch.no_grad():
        q, k, v = (
            F.linear(h, p.weight).reshape(B, T, H, D).permute(0, 2, 1, 3)
            for p in (attn.q_proj, attn.k_proj, attn.v_proj)
        )
        out = F.scaled_dot_product_attention(apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v, is_causal=True)
        return F.linear(out.permute(0, 2, 1, 3).flatten(2), attn.o_proj.weight)


def attention_echo(attn, h, cos, sin, self_attention=causal_self_attention):
    """The cheat the reader found: the layer's own forward, returned as it is."""
    with torch.no_grad():
        return attn(h, cos, sin)


def attention_project_steps(attn, h, cos, sin, self_attention=causal_self_attention):
    """The route a fresh reader found: the layer's own project_q and project_kv (projection, heads and rotary in one
    call each), the given attention, then the heads joined and o_proj."""
    B, T, _ = h.shape
    with torch.no_grad():
        q, (k, v) = attn.project_q(h, cos, sin), attn.project_kv(h, cos, sin)
        out, _ = self_attention(q.numpy(), k.numpy(), v.numpy())
        return attn.o_proj(torch.from_numpy(out).transpose(1, 2).reshape(B, T, -1))


def attention_echo_after_the_heads(attn, h, cos, sin, self_attention=causal_self_attention):
    """The careful cheat: every head's right queries through the given attention, its answer thrown away, then the
    layer's own forward (which the grader's layer refuses, as it refuses project_q and project_kv)."""
    _block(attn, h, cos, sin, self_attention)
    with torch.no_grad():
        return attn(h, cos, sin)


def attention_echo_after_a_call(attn, h, cos, sin, self_attention=causal_self_attention):
    """The next cheat: the given attention called on something of the right shape, then the layer's own forward."""
    B, T, _ = h.shape
    dummy = np.zeros((B, attn.n_heads, T, attn.head_dim), dtype=np.float32)
    self_attention(dummy, dummy, dummy)
    with torch.no_grad():
        return attn(h, cos, sin)


# 2.5
def _rms(
    x,
    weight,
    eps=1e-5,
    *,
    dim=-1,
    centre=False,
    eps_at="inside",
    reduce="mean",
    scale=True,
    upcast=True,
    cast_back=True,
):
    """rms_norm with one slip switched on by its keyword."""
    y = x.float() if upcast else x
    if centre:
        y = y - y.mean(dim=dim, keepdim=True)
    ms = y.pow(2).mean(dim=dim, keepdim=True) if reduce == "mean" else y.pow(2).sum(dim=dim, keepdim=True)
    denom = {"inside": torch.sqrt(ms + eps), "outside": torch.sqrt(ms) + eps, "none": torch.sqrt(ms)}[eps_at]
    y = y / denom
    y = y.to(x.dtype) if cast_back else y
    return y * weight if scale else y


# 2.6
def _swiglu(x, w_gate, w_up, w_down, *, act="silu", on="gate", transposed=True, down=True):
    """swiglu with one slip switched on by its keyword."""
    f = {"silu": F.silu, "sigmoid": torch.sigmoid, "relu": torch.relu}[act]
    g, u = (x @ w_gate.T, x @ w_up.T) if transposed else (x @ w_gate, x @ w_up)
    hidden = {"gate": f(g) * u, "up": g * f(u), "product": f(g * u)}[on]
    return hidden @ w_down.T if down else hidden


# 2.7
def _temper(probs, temperature, *, how="log", greedy=True, normalise=True):
    """temper with one slip switched on by its keywords."""
    if temperature == 0 and greedy:
        return _one_hot(probs)
    if how == "log":
        return torch.softmax(probs.log() / temperature, dim=-1)
    w = {"divide": probs / temperature, "power t": probs**temperature, "power": probs ** (1 / temperature)}.get(how)
    if how == "softmax":
        return torch.softmax(probs / temperature, dim=-1)
    return w / w.sum(dim=-1, keepdim=True) if normalise else w


# 2.8
def _params(config, *, kv_heads=None, mlp_matrices=3, final_norm=True, lm_head=True, layers=None, cast=int):
    """param_counts with one slip switched on by its keywords."""
    C, D, L = config.d_model, config.head_dim, config.n_layers if layers is None else layers
    kv = config.n_kv_heads if kv_heads is None else kv_heads
    parts = {
        "embedding": config.vocab_size * C,
        "attention": L * (2 * C * config.n_heads * D + 2 * C * kv * D),
        "mlp": L * mlp_matrices * C * config.hidden_dim,
        "norms": (2 * L + final_norm) * C,
        "lm_head": config.vocab_size * C if lm_head else 0,
    }
    return {k: cast(v) for k, v in parts.items()}


# (check or exercise, replaced functions, words the failure must contain)
SLIPS = [
    ("next_token_samples_from_softmax", {"next_token": _sample_without_temperature}, "temperature changes nothing"),
    ("next_token_greedy_is_argmax", {"next_token": _greedy_keepdim}, "shape (3,)"),
    ("generate_matches_greedy_loop", {"generate": _generate_from_first_position}, "first new token is already not"),
    (
        "measure_ttft_itl_times_prefill_and_steps",
        {"measure_ttft_itl": _measure_whole_generation},
        "the whole generation",
    ),
    ("2.1", {"next_token": next_token_no_temperature}, "temperature changes nothing"),
    ("2.1", {"next_token": next_token_times_temperature}, "multiplied by the temperature"),
    ("2.1", {"next_token": next_token_global_rng}, "seeded alike (seed 7) differ"),
    ("2.1", {"next_token": next_token_reseeds}, "do not come from the generator as it is given"),
    ("2.1", {"next_token": next_token_always_argmax}, "every draw is the top token"),
    ("2.1", {"next_token": next_token_keepdim}, "shape (3,)"),
    ("2.2", {"generate": generate_first_position}, "first new token is already not"),
    ("2.2", {"generate": generate_never_appends}, "all 7 new tokens are the same"),
    ("2.2", {"generate": generate_greedy_only}, "no draw varies"),
    ("2.2", {"generate": generate_new_tokens_only}, "(batch, 5 + 7)"),
    ("2.2", {"generate": generate_callback_at_end}, "once per new token"),
    ("generate_streams_each_token", {"generate": generate_streams_after_loop}, "after the loop ended"),
    ("generate_streams_each_token", {"generate": generate_streams_a_step_late}, "before the next forward pass"),
    ("2.3", {"measure_ttft_itl": measure_without_prefill}, "the prefill was left out"),
    ("2.3", {"measure_ttft_itl": measure_average_tpot}, "an average"),
    ("2.3", {"measure_ttft_itl": measure_whole_generation}, "the whole generation"),
    ("2.3", {"measure_ttft_itl": measure_clock_readings}, "clock reading"),
    ("2.3", {"measure_ttft_itl": measure_ttft_in_tpots}, "the first entry is the prefill"),
    ("2.3", {"measure_ttft_itl": measure_gaps_from_start}, "measured from the start of the call"),
    ("2.3", {"measure_ttft_itl": measure_gaps_from_first}, "measured from the first new token"),
    ("2.4", {"attention_block": _slip(join="wrong")}, "joined in the wrong order"),
    ("2.4", {"attention_block": _slip(o_proj="missing")}, "W_O is missing"),
    ("2.4", {"attention_block": _slip(o_proj="untransposed")}, "untransposed"),
    ("2.4", {"attention_block": _slip(by_hand="unmasked")}, "see later tokens"),
    ("2.4", {"attention_block": _slip(by_hand="unscaled")}, "not scaled"),
    ("2.4", {"attention_block": _slip(split="wrong")}, "heads are split wrongly"),
    ("2.4", {"attention_block": _slip(rotate="")}, "q and k are not rotated"),
    ("2.4", {"attention_block": _slip(rotate="k")}, "q is not rotated"),
    ("2.4", {"attention_block": _slip(rotate="qkv")}, "v is rotated"),
    ("2.4", {"attention_block": _slip(pairs="neighbours")}, "neighbouring features"),
    ("2.4", {"attention_block": _slip(heads_first=False)}, "not moved before the positions"),
    ("2.4", {"attention_block": _slip(prescale=True)}, "scaled twice"),
    ("2.4", {"attention_block": attention_no_grad_guard}, "requires grad"),
    ("2.4", {"attention_block": attention_sdpa}, "never went through the self_attention"),
    ("2.4", {"attention_block": attention_echo}, "its own forward, attn(h, cos, sin)"),
    ("2.4", {"attention_block": attention_project_steps}, "refuses its project_q and project_kv"),
    ("attention_block_is_causal", {"attention_block": attention_echo_after_a_call}, "its own forward"),
    ("attention_block_is_causal", {"attention_block": attention_echo_after_the_heads}, "its own forward"),
    (
        "attention_block_uses_the_attention_it_is_given",
        {"attention_block": attention_echo_after_the_heads},
        "its own forward",
    ),
    ("2.5", {"rms_norm": lambda x, w, e=1e-5: _rms(x, w, e, dim=-2)}, "root-mean-squares should be"),
    ("2.5", {"rms_norm": lambda x, w, e=1e-5: _rms(x, w, e, centre=True)}, "LayerNorm"),
    ("2.5", {"rms_norm": lambda x, w, e=1e-5: _rms(x, w, e, eps_at="outside")}, "outside the root"),
    ("2.5", {"rms_norm": lambda x, w, e=1e-5: _rms(x, w, e, eps_at="none")}, "eps plays no part"),
    ("2.5", {"rms_norm": lambda x, w, e=1e-5: _rms(x, w, e, reduce="sum")}, "sum of the squares"),
    ("2.5", {"rms_norm": lambda x, w, e=1e-5: _rms(x, w, e, scale=False)}, "weight is not applied"),
    ("2.5", {"rms_norm": lambda x, w, e=1e-5: _rms(x, w, e, upcast=False)}, "the largest values vanished"),
    ("2.5", {"rms_norm": lambda x, w, e=1e-5: _rms(x, w, e, cast_back=False)}, "return x's dtype"),
    ("2.5", {"rms_norm": lambda x, w, e=1e-5: _rms(x, w, 1e-5)}, "eps argument is ignored"),
    ("2.6", {"swiglu": lambda x, g, u, d: _swiglu(x, g, u, d, on="up")}, "branches are swapped"),
    ("2.6", {"swiglu": lambda x, g, u, d: _swiglu(x, g, u, d, act="sigmoid")}, "sigmoid"),
    ("2.6", {"swiglu": lambda x, g, u, d: _swiglu(x, g, u, d, on="product")}, "through the product"),
    ("2.6", {"swiglu": lambda x, g, u, d: _swiglu(x, g, u, d, act="relu")}, "ReLU"),
    ("2.6", {"swiglu": lambda x, g, u, d: _swiglu(x, g, u, d, transposed=False)}, "(out_features, in_features)"),
    ("2.6", {"swiglu": lambda x, g, u, d: _swiglu(x, g, u, d, down=False)}, "w_down"),
    ("2.6", {"swiglu": swiglu_float32_out}, "returned torch.float32 for torch.bfloat16 x"),
    ("2.7", {"temper": lambda p, t: _temper(p, t, how="divide")}, "came back unchanged"),
    ("2.7", {"temper": lambda p, t: _temper(p, t, how="power t")}, "raised to the power t"),
    ("2.7", {"temper": lambda p, t: _temper(p, t, how="softmax")}, "probabilities are not logits"),
    ("2.7", {"temper": lambda p, t: _temper(p, t, how="power", normalise=False)}, "do not sum to 1"),
    (
        "temper_is_greedy_at_zero_and_finite_when_cold",
        {"temper": lambda p, t: _temper(p, t, how="power")},
        "underflows",
    ),
    ("temper_is_greedy_at_zero_and_finite_when_cold", {"temper": lambda p, t: _temper(p, t, greedy=False)}, "one-hot"),
    ("2.8", {"param_counts": lambda c: _params(c, kv_heads=c.n_heads)}, "as many as the queries"),
    ("2.8", {"param_counts": lambda c: _params(c, mlp_matrices=2)}, "three matrices"),
    ("2.8", {"param_counts": lambda c: _params(c, final_norm=False)}, "before the lm_head is missing"),
    ("2.8", {"param_counts": lambda c: _params(c, lm_head=False)}, "the lm_head is missing"),
    ("2.8", {"param_counts": lambda c: _params(c, layers=1)}, "summed over all n_layers"),
    ("2.8", {"param_counts": lambda c: _params(c, cast=float)}, "should be an int"),
    ("2.8", {"param_counts": lambda c: {**_params(c), "biases": 0}}, "exactly the keys"),
    ("param_counts_match_built_decoders", {"param_counts": params_built_on_meta}, "building nothing"),
    ("param_counts_scale_to_real_configs", {"param_counts": params_built_on_meta}, "building nothing"),
    ("2.8", {"param_counts": params_numpy_int64}, "overflowed a 64-bit integer"),
    ("2.8", {"param_counts": params_float}, "lost to float arithmetic"),
]


@pytest.mark.parametrize("where, replaced, words", SLIPS, ids=case_ids(SLIPS))
def test_slip_is_rejected_naming_it(where, replaced, words):
    """Check that a likely wrong implementation fails the check named (with an AssertionError), or the exercise
    named (its first failing check, as `kvlib check` reports it), with a message that names the slip."""
    assert_slip_named(where, _module(**replaced), words)


def _shipped(name, fixed=()):
    """An exercise's shipped body as kvlib/generation.py (the learner's stub) holds it, each (broken, right) pair of
    `fixed` replaced in its text: a learner's copy half fixed. It calls earlier exercises as the stub does."""
    import inspect
    import textwrap

    source = textwrap.dedent(inspect.getsource(getattr(generation, name).__wrapped__))
    source = "".join(line for line in source.splitlines(keepends=True) if not line.startswith("@"))
    for broken, right in fixed:
        assert broken in source, f"the shipped body no longer holds {broken!r}"
        source = source.replace(broken, right)
    space = dict(vars(generation))
    exec(source, space)  # noqa: S102 - the stub's own text, run as the learner's module runs it
    return space[name]


_FIRST_BUG = ("model(input_ids)", "model(ids)")
_SECOND_BUG = ("temperature)", "temperature, generator)")


def test_shipped_generate_fails_with_its_symptoms_until_both_bugs_are_fixed():
    """Check that 2.2's shipped body (a find-and-fix: the stub runs it) fails its exercise showing a symptom, never
    the cause: greedy repeats one token; with that fixed, two runs seeded alike differ; with both fixed it passes."""
    assert generation.generate.__exercise__.kind == "fix"
    assert_slip_named("2.2", _module(generate=_shipped("generate")), "all 7 new tokens are the same")
    half = _module(generate=_shipped("generate", [_FIRST_BUG]))
    assert_slip_named("2.2", half, "with generators seeded alike (seed 1) gave different tokens")
    for name, err in check_failures("2.2", _module(generate=_shipped("generate"))) + check_failures("2.2", half):
        causes = ("input_ids", "model(", "feed", "pass ", "next_token", "generator you are given")
        assert not any(cause in str(err) for cause in causes), f"{name} names the cause: {err}"
    assert not check_failures("2.2", _module(generate=_shipped("generate", [_FIRST_BUG, _SECOND_BUG])))


def _rms_norm_by_the_model(x, weight, eps=1e-5):  # the model's own RMSNorm, run: kvlib's copy of 2.5
    from kvlib.core.model import RMSNorm

    norm = RMSNorm(x.shape[-1], eps).to(weight.dtype)
    with torch.no_grad():
        norm.weight.copy_(weight)
    return norm(x)


def _swiglu_by_the_model(x, w_gate, w_up, w_down):  # the model's own MLP, run: kvlib's copy of 2.6
    from kvlib.core.model import MLP, ModelConfig

    config = ModelConfig(vocab_size=2, d_model=w_gate.shape[1], n_heads=1, n_kv_heads=1, hidden_dim=w_gate.shape[0])
    mlp = MLP(config).to(w_gate.dtype)
    with torch.no_grad():
        for linear, w in ((mlp.gate_proj, w_gate), (mlp.up_proj, w_up), (mlp.down_proj, w_down)):
            linear.weight.copy_(w)
    return mlp(x)


@pytest.mark.parametrize(
    "ex_id, fakes, words",
    [
        ("2.5", {"rms_norm": _rms_norm_by_the_model}, "ran the model's own RMSNorm"),
        ("2.6", {"swiglu": _swiglu_by_the_model}, "ran the model's own MLP"),
    ],
    ids=["2.5", "2.6"],
)
def test_the_models_own_norm_or_mlp_fails_every_check_naming_it(ex_id, fakes, words):
    """Check that 2.5 answered by running the model's RMSNorm, or 2.6 by running its MLP (kvlib's own copies of the
    exercises: kvlib.course.exercises.READY_MADE), fails every check of the exercise, each naming what it ran; the
    same functions pass outside a check (they compute the right numbers)."""
    failures = check_failures(ex_id, _module(**fakes))
    assert [name for name, _ in failures] == [c.name for c in checks_for(BY_ID[ex_id])], failures
    assert all(words in str(err) and "while Exercise" in str(err) for _, err in failures), failures
    x, w = torch.randn(2, 3, 8), torch.rand(8) + 0.5
    assert torch.allclose(_rms_norm_by_the_model(x, w), reference(BY_ID["2.5"])(x, w))


_AXIS_BUG = ("dim=-2", "dim=-1")
_FLOAT16_BUG = ("mean_square = x.pow(2)", "mean_square = x.float().pow(2)")


def test_shipped_rms_norm_fails_with_its_symptoms_until_both_bugs_are_fixed():
    """Check that 2.5's shipped body (a find-and-fix) fails its exercise showing a symptom, never the cause: the tokens'
    root-mean-squares come out unequal; with the axis fixed, float16 values of 400 come out as 0; with the squares
    taken in float32 too (and the result cast back to x's dtype), it passes."""
    assert generation.rms_norm.__exercise__.kind == "fix"
    shipped = _module(rms_norm=_shipped("rms_norm"))
    assert_slip_named("2.5", shipped, "root-mean-squares should be")
    half = _module(rms_norm=_shipped("rms_norm", [_AXIS_BUG]))
    assert_slip_named("rms_norm_holds_for_large_float16_values", half, "the largest values vanished")
    for name, err in check_failures("2.5", shipped) + check_failures("2.5", half):
        causes = ("axis", "dim=", "across tokens", "overflow", "float32", "square in", "65504")
        assert not any(cause in str(err) for cause in causes), f"{name} names the cause: {err}"
    cast = ("torch.rsqrt(mean_square + eps)", "torch.rsqrt(mean_square + eps).to(x.dtype)")
    assert not check_failures("2.5", _module(rms_norm=_shipped("rms_norm", [_AXIS_BUG, _FLOAT16_BUG, cast])))


# words that would give the learner the line to type (the fix), where 2.1, 2.5, 2.6 and 2.7 name the cause (issue 46)
_FIXES = (
    "add it",
    "add the eps",
    "multiply by",
    "renormalise after",
    "normalise in float32",
    "take its square root",
    "it goes on",
    "goes through it",
    "(torch.nn.functional",
    "in terms of p",
    "then return",
    "torch.multinomial",
    "argmax",
    "divide the logits",
    "reseed",
)


CAUSE_SLIPS = [s for s in SLIPS if s[0] in ("2.1", "2.5", "2.6", "2.7")]  # the slips whose messages once gave the fix


@pytest.mark.parametrize("where, replaced, words", CAUSE_SLIPS, ids=case_ids(CAUSE_SLIPS))
def test_slip_message_names_the_cause_not_the_fix(where, replaced, words):
    """Check that 2.1's, 2.5's, 2.6's and 2.7's slips fail with a message that names what went wrong, never the line to
    type instead (issue 46: the fix lives in the hints)."""
    with np.errstate(all="ignore"):
        (name, err), *_ = check_failures(where, _module(**replaced))
    assert not [fix for fix in _FIXES if fix in str(err)], f"{name}: {err}"


def test_every_exercise_has_three_slips():
    """Check that SLIPS holds three or more likely slips for each exercise of notebook 02."""
    counts = {ex_id: sum(c[0] == ex_id for c in SLIPS) for ex_id in IDS}
    assert all(n >= 3 for n in counts.values()), counts


# ---------------------------------------------------------------------------------------------
# A function that vandalises its arguments scores 0 on every check


VANDAL_CHECKS = [c for ex_id in IDS for c in checks_for(BY_ID[ex_id])]


@pytest.mark.parametrize("check", VANDAL_CHECKS, ids=lambda c: c.name)
def test_a_function_that_changes_its_arguments_scores_zero(check):
    """Check that zeroing the arrays, tensors, weights or config a check passes cannot make it expect the wrong answer."""
    ex = check.exercise
    module = _module(**{ex.name: vandal(reference(ex), spoil_everything)})
    with np.errstate(all="ignore"), pytest.raises(Exception):  # noqa: B017 - any failure is a score of 0
        check.fn(module, np.random.default_rng(0))


def test_the_stand_in_clock_is_fake_and_restored():
    """Check that 2.3's stand-in charges its fake clock, never real time, and gives the real clocks back."""
    from kvlib.checks.generation import _stand_in

    model = _stand_in()
    real = time.perf_counter
    with model.fake_clock(_module()):
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


@pytest.mark.slow
def test_timing_checks_read_the_fake_clock_in_the_isolated_child():
    """Check that 2.3's checks judge a learner's file in the isolated grader by the stand-in's fake
    clock, even when the file imports the clock by name; an averaged TPOT still fails there."""
    from kvlib.core.paths import ROOT
    from kvlib.grading.sandbox import Sandbox, package_files

    source = (ROOT / "solutions" / "kvlib" / "generation.py").read_text(encoding="utf-8")
    by_name = source.replace("import torch\n", "from time import perf_counter\n\nimport torch\n", 1).replace(
        "time.perf_counter()", "perf_counter()"
    )  # the clock imported by name, at the top of the file
    averaged = source.replace(
        "    return times[0] - start, [b - a for a, b in zip(times, times[1:])]  # the prefill, then each gap",
        "    return times[0] - start, [(times[-1] - start) / max_new_tokens] * (max_new_tokens - 1)",
    )
    assert by_name != source and averaged != source
    functions = [f"generation.{BY_ID[i].name}" for i in IDS]
    for text, passes in ((by_name, True), (averaged, False)):
        files = package_files(ROOT / "kvlib")
        files["kvlib/generation.py"] = text.encode()
        with Sandbox(
            files, ["generation"], functions, mode="plain", torch=True, call_timeout=60, budget=300
        ) as sandbox:
            module = sandbox.module("generation")
            check = CHECKS["measure_ttft_itl_times_prefill_and_steps"]
            if passes:
                check.fn(module, np.random.default_rng(0))
                CHECKS["rms_norm_matches_the_model"].fn(module, np.random.default_rng(0))
            else:
                with pytest.raises(AssertionError, match="an average"):
                    check.fn(module, np.random.default_rng(0))


@pytest.mark.slow
def test_predictions_are_graded_as_in_the_isolated_child():
    """Check 2.7 and 2.8 as nbgrader grades them, in the isolated child: other right ways (a power renormalised by
    the largest entry; a loop over the layers) earn every check; a named slip (the probabilities back unchanged)
    fails naming it, and a result the grader cannot take as a plain dict (a subclass equal to anything) earns nothing."""
    from conftest import ROOT, checks_in_child

    from kvlib.grading.sandbox import Sandbox, package_files

    reference = (ROOT / "solutions" / "kvlib" / "generation.py").read_text(encoding="utf-8")
    right = """

def temper(probs, temperature):
    if temperature == 0:
        return torch.nn.functional.one_hot(probs.argmax(dim=-1), probs.shape[-1]).to(probs.dtype)
    w = (probs / probs.amax(dim=-1, keepdim=True)) ** (1 / temperature)
    return w / w.sum(dim=-1, keepdim=True)


def param_counts(config):
    C, D = config.d_model, config.head_dim
    out = {"embedding": config.vocab_size * C, "attention": 0, "mlp": 0, "norms": C, "lm_head": config.vocab_size * C}
    for _ in range(config.n_layers):
        out["attention"] += C * D * (2 * config.n_heads + 2 * config.n_kv_heads)
        out["mlp"] += 3 * C * config.hidden_dim
        out["norms"] += 2 * C
    return out
"""
    wrong = """

def temper(probs, temperature):
    return probs / temperature / (probs / temperature).sum(dim=-1, keepdim=True)


class _Anything(dict):
    def __eq__(self, other):
        return True


def param_counts(config):
    return _Anything(embedding=0, attention=0, mlp=0, norms=0, lm_head=0)
"""
    verdicts = checks_in_child("generation", reference + right, ("2.7", "2.8"))
    assert set(verdicts.values()) == {"pass"}, verdicts
    files = package_files(ROOT / "kvlib")
    files["kvlib/generation.py"] = (reference + wrong).encode()
    files["kvlib/attention.py"] = (ROOT / "solutions" / "kvlib" / "attention.py").read_bytes()
    functions = [f"generation.{BY_ID[i].name}" for i in IDS]
    failed = {}
    with Sandbox(files, ["generation"], functions, mode="plain", torch=True, call_timeout=60, budget=300) as sandbox:
        for check in checks_for(BY_ID["2.7"]) + checks_for(BY_ID["2.8"]):
            try:
                check.fn(sandbox.module("generation"), np.random.default_rng(0))
            except Exception as err:  # noqa: BLE001 - any failure scores 0, as in the grader
                failed[check.name] = f"{type(err).__name__}: {err}"
    assert "came back unchanged" in failed["temper_matches_softmax_of_scaled_logits"], failed
    assert {c.name for c in checks_for(BY_ID["2.8"])} <= set(failed), failed
    assert "returned a kvlib.generation._Anything" in failed["param_counts_match_built_decoders"], failed
