"""Notebook 04's checks against learners' code: alternative correct implementations of each exercise
pass every check of it, the likely slips fail with a message naming them, and a function that
changes what it is given (zeroes the model, the tensors) cannot make a check expect garbage.

Each check takes a module, so a test hands it a namespace with the reference's functions and one
replaced (conftest.handed_in)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import handed_in

from kvlib import kv_cache
from kvlib.attention import causal_mask
from kvlib.checks import CHECKS, checks_for
from kvlib.course.exercises import BY_ID
from kvlib.generation import next_token

NAMES = ("KVCache", "cached_attention", "cached_forward", "kv_cache_bytes", "generate_cached")


def _module(**fakes):
    return handed_in(kv_cache, NAMES, **fakes)


def _run(check_name, module):
    CHECKS[check_name].fn(module, np.random.default_rng(0))


def _checks(ex_id):
    return [c.name for c in checks_for(BY_ID[ex_id])]


# ---------------------------------------------------------------------------------------------
# 4.1 KVCache.update: alternatives and slips


def _cache_with(update):
    return type(f"KVCache{update.__name__}", (kv_cache.KVCache,), {"update": update})


def _update_index_copy(self, layer, k_new, v_new):
    idx = torch.arange(self.pos, self.pos + k_new.shape[2])
    self.k[layer].index_copy_(2, idx, k_new)
    self.v[layer].index_copy_(2, idx, v_new)
    return self.k[layer][:, :, : int(idx[-1]) + 1], self.v[layer][:, :, : int(idx[-1]) + 1]


def _update_loop(self, layer, k_new, v_new):
    for t in range(k_new.shape[2]):  # one position at a time
        self.k[layer, :, :, self.pos + t] = k_new[:, :, t]
        self.v[layer, :, :, self.pos + t] = v_new[:, :, t]
    end = self.pos + k_new.shape[2]
    return self.k[layer, :, :, :end], self.v[layer, :, :, :end]


def _update_narrow(self, layer, k_new, v_new):
    T = k_new.shape[2]
    self.k.select(0, layer).narrow(2, self.pos, T).copy_(k_new)
    self.v.select(0, layer).narrow(2, self.pos, T).copy_(v_new)
    return self.k[layer].narrow(2, 0, self.pos + T), self.v[layer].narrow(2, 0, self.pos + T)


def _update_every_layer(self, layer, k_new, v_new):  # slip: the slice leaves out the layer index
    end = self.pos + k_new.shape[2]
    self.k[:, :, :, self.pos : end] = k_new
    self.v[:, :, :, self.pos : end] = v_new
    return self.k[layer, :, :, :end], self.v[layer, :, :, :end]


def _update_at_zero(self, layer, k_new, v_new):  # slip: writes from position 0, whatever pos is
    T = k_new.shape[2]
    self.k[layer, :, :, :T], self.v[layer, :, :, :T] = k_new, v_new
    return self.k[layer, :, :, : self.pos + T], self.v[layer, :, :, : self.pos + T]


def _update_returns_new(self, layer, k_new, v_new):  # slip: returns only the new positions
    end = self.pos + k_new.shape[2]
    self.k[layer, :, :, self.pos : end], self.v[layer, :, :, self.pos : end] = k_new, v_new
    return self.k[layer, :, :, self.pos : end], self.v[layer, :, :, self.pos : end]


# ---------------------------------------------------------------------------------------------
# 4.2 cached_attention: alternatives and slips


def _positions(x, cache, rope_cos, rope_sin):
    T = x.shape[1]
    return rope_cos[cache.pos : cache.pos + T], rope_sin[cache.pos : cache.pos + T]


def _attention_float64_explicit(attn, x, cache, layer, rope_cos, rope_sin):
    """Scores, a -inf bias mask and softmax by hand, in float64, keys repeated for GQA."""
    B, T, _ = x.shape
    cos, sin = _positions(x, cache, rope_cos, rope_sin)
    q = attn.project_q(x, cos, sin).double()
    k, v = cache.update(layer, *attn.project_kv(x, cos, sin))
    rep = attn.n_heads // attn.n_kv_heads
    k, v = k.double().repeat_interleave(rep, 1), v.double().repeat_interleave(rep, 1)
    bias = torch.zeros(T, k.shape[2], dtype=torch.float64).masked_fill(
        ~torch.from_numpy(causal_mask(T, k.shape[2])), float("-inf")
    )
    probs = torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5 + bias, dim=-1)
    return attn.o_proj((probs @ v).float().transpose(1, 2).reshape(B, T, -1))


def _attention_einsum_grouped(attn, x, cache, layer, rope_cos, rope_sin):
    """einsum over (kv head, group) without copying keys; a tril mask with an offset instead of causal_mask."""
    B, T, _ = x.shape
    cos, sin = _positions(x, cache, rope_cos, rope_sin)
    q = attn.project_q(x, cos, sin)
    k, v = cache.update(layer, *attn.project_kv(x, cos, sin))
    S, G = k.shape[2], attn.n_heads // attn.n_kv_heads
    q = q.view(B, attn.n_kv_heads, G, T, -1)
    scores = torch.einsum("bhgtd,bhsd->bhgts", q, k) / q.shape[-1] ** 0.5
    scores = scores.masked_fill(~torch.ones(T, S, dtype=torch.bool).tril(S - T), float("-inf"))
    out = torch.einsum("bhgts,bhsd->bhgtd", scores.softmax(-1), v).reshape(B, attn.n_heads, T, -1)
    return attn.o_proj(out.transpose(1, 2).reshape(B, T, -1))


def _attention_loop_over_queries(attn, x, cache, layer, rope_cos, rope_sin):
    """One new query at a time, each against the keys up to its own position, sdpa without a mask."""
    B, T, _ = x.shape
    cos, sin = _positions(x, cache, rope_cos, rope_sin)
    q = attn.project_q(x, cos, sin)
    k, v = cache.update(layer, *attn.project_kv(x, cos, sin))
    start = k.shape[2] - T
    rows = [
        F.scaled_dot_product_attention(
            q[:, :, t : t + 1], k[:, :, : start + t + 1], v[:, :, : start + t + 1], enable_gqa=True
        )
        for t in range(T)
    ]
    return attn.o_proj(torch.cat(rows, 2).transpose(1, 2).reshape(B, T, -1))


def _attention_own_keys_only(
    attn, x, cache, layer, rope_cos, rope_sin
):  # slip: attends to project_kv's output, not the cache
    B, T, _ = x.shape
    cos, sin = _positions(x, cache, rope_cos, rope_sin)
    q = attn.project_q(x, cos, sin)
    k, v = attn.project_kv(x, cos, sin)
    cache.update(layer, k, v)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=T > 1, enable_gqa=True)
    return attn.o_proj(out.transpose(1, 2).reshape(B, T, -1))


_HISTORY = {}


def _attention_private_history(
    attn, x, cache, layer, rope_cos, rope_sin
):  # shortcut: keeps the inputs, never reads the cache
    B, T, _ = x.shape
    if cache.pos == 0:
        _HISTORY[layer] = x
    else:
        _HISTORY[layer] = torch.cat([_HISTORY[layer], x], 1)
    cache.update(layer, *attn.project_kv(x, *_positions(x, cache, rope_cos, rope_sin)))
    S = _HISTORY[layer].shape[1]
    return attn(_HISTORY[layer], rope_cos[:S], rope_sin[:S])[:, -T:]


def _attention_no_o_proj(attn, x, cache, layer, rope_cos, rope_sin):  # slip: forgets the output projection
    B, T, _ = x.shape
    cos, sin = _positions(x, cache, rope_cos, rope_sin)
    q = attn.project_q(x, cos, sin)
    k, v = cache.update(layer, *attn.project_kv(x, cos, sin))
    mask = torch.from_numpy(causal_mask(T, k.shape[2]))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True).transpose(1, 2).reshape(B, T, -1)


# ---------------------------------------------------------------------------------------------
# 4.3 cached_forward: alternatives and slips


def _forward_past_key_values(model, input_ids, cache):
    """The transformers-style call: the model runs its layers through cache.attention (Exercise 4.2)."""
    logits, _ = model(input_ids, past_key_values=cache)
    return logits[:, -1]


def _forward_blocks(model, input_ids, cache):
    """Each Block with the cache and cached_attention passed in; the head over every position, then the last."""
    x = model.embed(input_ids)
    for i, layer in enumerate(model.layers):
        x = layer(x, model.rope_cos, model.rope_sin, cache, i, kv_cache.cached_attention)
    cache.advance(input_ids.shape[1])
    return model.lm_head(model.norm(x))[:, -1]


def _forward_float64_head(model, input_ids, cache):
    """The layer loop by hand, the output head in float64."""
    h = model.embed(input_ids)
    for i, layer in enumerate(model.layers):
        h = h + kv_cache.cached_attention(layer.attn, layer.attn_norm(h), cache, i, model.rope_cos, model.rope_sin)
        h = h + layer.mlp(layer.mlp_norm(h))
    cache.advance(input_ids.shape[-1])
    last = model.norm(h[:, -1:]).double() @ model.lm_head.weight.double().T
    return last[:, 0].float()


_IDS = {}


def _forward_recompute(model, input_ids, cache):  # shortcut: reruns the model over every token id seen, only moves pos
    seen = input_ids if cache.pos == 0 else torch.cat([_IDS[id(cache)], input_ids], 1)
    _IDS[id(cache)] = seen
    cache.advance(input_ids.shape[1])
    return model(seen)[:, -1]


def _forward_one_at_a_time(model, input_ids, cache):  # slip: the prompt fed one token at a time
    for t in range(input_ids.shape[1]):
        logits = kv_cache.cached_forward(model, input_ids[:, t : t + 1], cache)
    return logits


def _forward_advance_per_layer(model, input_ids, cache):  # slip: advance inside the layer loop
    x = model.embed(input_ids)
    for i, layer in enumerate(model.layers):
        x = x + kv_cache.cached_attention(layer.attn, layer.attn_norm(x), cache, i, model.rope_cos, model.rope_sin)
        x = x + layer.mlp(layer.mlp_norm(x))
        cache.advance(input_ids.shape[1])
    return model.lm_head(model.norm(x[:, -1]))


def _forward_all_positions(model, input_ids, cache):  # slip: returns (batch, seq_len, vocab)
    logits, _ = model(input_ids, past_key_values=cache)
    return logits


# ---------------------------------------------------------------------------------------------
# 4.4 kv_cache_bytes: alternatives and slips


def _kv_loop(config, seq_len, batch=1, dtype=torch.float16):
    """Layer by layer, keys then values."""
    total = 0
    for _layer in range(config.n_layers):
        for _tensor in ("k", "v"):
            total += batch * config.n_kv_heads * seq_len * config.head_dim * dtype.itemsize
    return total


def _kv_tensor(config, seq_len, batch=1, dtype=torch.float16):
    """The bytes of an empty tensor shaped like one layer's cache (on the meta device: no memory)."""
    one_layer = torch.empty(batch, config.n_kv_heads, seq_len, config.head_dim, dtype=dtype, device="meta")
    return 2 * config.n_layers * one_layer.numel() * one_layer.element_size()


def _kv_group(config, seq_len, batch=1, dtype=torch.float16):
    """MHA's cache (d_model numbers per token and layer) divided by the group size, bytes from finfo."""
    mha = 2 * config.n_layers * config.d_model * seq_len * batch * (torch.finfo(dtype).bits // 8)
    return mha // config.group_size


def _kv_fixed_fp16(config, seq_len, batch=1, dtype=torch.float16):  # slip: 2 bytes whatever the dtype
    return 2 * config.n_layers * config.n_kv_heads * config.head_dim * 2 * seq_len * batch


def _kv_float(config, seq_len, batch=1, dtype=torch.float16):  # slip: a float
    return float(kv_cache.kv_cache_bytes(config, seq_len, batch, dtype))


def _kv_d_model(
    config, seq_len, batch=1, dtype=torch.float16
):  # slip: d_model numbers per token and layer, MHA's cache
    return 2 * config.n_layers * config.d_model * dtype.itemsize * seq_len * batch


# ---------------------------------------------------------------------------------------------
# 4.5 generate_cached: alternatives and slips


def _generate_preallocated(
    model, input_ids, max_new_tokens, temperature=0.0, generator=None, on_token=None, cache=None
):
    """The output tensor allocated up front, cached_forward called directly."""
    B, P = input_ids.shape
    cache = cache if cache is not None else kv_cache.KVCache(model.config, batch=B)
    cache.reset()
    out = torch.empty(B, P + max_new_tokens, dtype=input_ids.dtype)
    out[:, :P] = input_ids
    with torch.no_grad():
        logits = kv_cache.cached_forward(model, input_ids, cache)
        for i in range(max_new_tokens):
            out[:, P + i] = next_token(logits, temperature, generator)
            if on_token:
                on_token(out[:, P + i])
            if i < max_new_tokens - 1:
                logits = kv_cache.cached_forward(model, out[:, P + i : P + i + 1], cache)
    return out


def _generate_while_cat(model, input_ids, max_new_tokens, temperature=0.0, generator=None, on_token=None, cache=None):
    """A while loop growing the ids with torch.cat, the last step's decode skipped by a break."""
    if cache is None:
        cache = kv_cache.KVCache(model.config, batch=input_ids.shape[0])
    cache.reset()
    ids, logits = input_ids, kv_cache.prefill(model, input_ids, cache)
    while True:
        token = next_token(logits, temperature, generator)
        ids = torch.cat([ids, token[:, None]], 1)
        if on_token is not None:
            on_token(token)
        if ids.shape[1] == input_ids.shape[1] + max_new_tokens:
            return ids
        logits = kv_cache.decode_step(model, token, cache)


def _generate_past_key_values(
    model, input_ids, max_new_tokens, temperature=0.0, generator=None, on_token=None, cache=None
):
    """The articles' loop: model(ids, past_key_values=cache), feeding only the new token."""
    cache = kv_cache.KVCache(model.config, batch=input_ids.shape[0]) if cache is None else cache
    cache.reset()
    feed, new = input_ids, []
    with torch.inference_mode():
        for _ in range(max_new_tokens):
            if new:
                feed = new[-1][:, None]
            logits, cache = (
                model(feed, past_key_values=cache) if not new or len(new) < max_new_tokens else (None, cache)
            )
            new.append(next_token(logits[:, -1], temperature, generator))
            if on_token is not None:
                on_token(new[-1])
    return torch.cat([input_ids, torch.stack(new, 1)], 1)


def _generate_recompute(
    model, input_ids, max_new_tokens, temperature=0.0, generator=None, on_token=None, cache=None
):  # no cache at all
    from kvlib.generation import generate

    return generate(model, input_ids, max_new_tokens, temperature, generator, on_token)


def _generate_prompt_one_at_a_time(
    model, input_ids, max_new_tokens, temperature=0.0, generator=None, on_token=None, cache=None
):
    cache = kv_cache.KVCache(model.config, batch=input_ids.shape[0]) if cache is None else cache
    cache.reset()
    for t in range(input_ids.shape[1]):  # slip: the prompt through decode steps, one token each
        logits = kv_cache.cached_forward(model, input_ids[:, t : t + 1], cache)
    tokens = []
    for i in range(max_new_tokens):
        tokens.append(next_token(logits, temperature, generator))
        if on_token is not None:
            on_token(tokens[-1])
        if i + 1 < max_new_tokens:
            logits = kv_cache.decode_step(model, tokens[-1], cache)
    return torch.cat([input_ids, torch.stack(tokens, 1)], 1)


def _generate_extra_step(model, input_ids, max_new_tokens, temperature=0.0, generator=None, on_token=None, cache=None):
    cache = kv_cache.KVCache(model.config, batch=input_ids.shape[0]) if cache is None else cache
    cache.reset()
    logits, tokens = kv_cache.prefill(model, input_ids, cache), []
    for _ in range(max_new_tokens):  # slip: feeds the last token back too
        tokens.append(next_token(logits, temperature, generator))
        if on_token is not None:
            on_token(tokens[-1])
        logits = kv_cache.decode_step(model, tokens[-1], cache)
    return torch.cat([input_ids, torch.stack(tokens, 1)], 1)


ALTERNATIVES = {
    "4.1": [{"KVCache": _cache_with(f)} for f in (_update_index_copy, _update_loop, _update_narrow)],
    "4.2": [
        {"cached_attention": f}
        for f in (_attention_float64_explicit, _attention_einsum_grouped, _attention_loop_over_queries)
    ],
    "4.3": [{"cached_forward": f} for f in (_forward_past_key_values, _forward_blocks, _forward_float64_head)],
    "4.4": [{"kv_cache_bytes": f} for f in (_kv_loop, _kv_tensor, _kv_group)],
    "4.5": [{"generate_cached": f} for f in (_generate_preallocated, _generate_while_cat, _generate_past_key_values)],
}


@pytest.mark.parametrize(
    "ex_id, fakes",
    [(e, f) for e, fs in ALTERNATIVES.items() for f in fs],
    ids=[f"{e}-{next(iter(f.values())).__name__}" for e, fs in ALTERNATIVES.items() for f in fs],
)
def test_alternative_correct_implementation_passes(ex_id, fakes):
    """Check that a correct implementation in another shape (loops, einsum, float64, index_copy_) passes every check of its exercise."""
    _HISTORY.clear()
    for name in _checks(ex_id):
        _run(name, _module(**fakes))


SLIPS = [
    (
        "kv_cache_grows_one_slot_per_step",
        {"KVCache": _cache_with(_update_every_layer)},
        "write only into self.k[layer]",
    ),
    ("kv_cache_grows_one_slot_per_step", {"KVCache": _cache_with(_update_at_zero)}, "were overwritten"),
    ("kv_cache_grows_one_slot_per_step", {"KVCache": _cache_with(_update_returns_new)}, "should return 4 positions"),
    ("cached_attention_one_token_sees_every_key", {"cached_attention": _attention_own_keys_only}, "only its own key"),
    (
        "cached_attention_reads_the_cache",
        {"cached_attention": _attention_private_history},
        "ignored the keys and values in the cache",
    ),
    ("cached_attention_matches_full_attention", {"cached_attention": _attention_no_o_proj}, "then attn.o_proj"),
    (
        "cached_forward_decode_uses_the_cache",
        {"cached_forward": _forward_recompute},
        "it recomputes from the token ids",
    ),
    ("cached_forward_prefill_runs_once", {"cached_forward": _forward_one_at_a_time}, "one token at a time"),
    ("cached_forward_matches_full_forward", {"cached_forward": _forward_advance_per_layer}, "advance by seq_len once"),
    ("cached_forward_matches_full_forward", {"cached_forward": _forward_all_positions}, "last position's logits"),
    (
        "kv_cache_bytes_scales_with_tokens_batch_and_dtype",
        {"kv_cache_bytes": _kv_fixed_fp16},
        "element size depends on dtype",
    ),
    ("kv_cache_bytes_of_real_models", {"kv_cache_bytes": _kv_float}, "int number of bytes"),
    ("kv_cache_bytes_of_real_models", {"kv_cache_bytes": _kv_d_model}, "not d_model numbers"),
    ("generate_cached_uses_the_cache", {"generate_cached": _generate_recompute}, "reruns earlier tokens"),
    ("generate_cached_uses_the_cache", {"generate_cached": _generate_prompt_one_at_a_time}, "one token at a time"),
    (
        "generate_cached_resets_between_prompts",
        {"generate_cached": _generate_extra_step},
        "the last new token was fed back",
    ),
]


@pytest.mark.parametrize(
    "name, fakes, words", SLIPS, ids=[f"{s[0]}-{next(iter(s[1].values())).__name__}" for s in SLIPS]
)
def test_slip_is_caught_and_named(name, fakes, words):
    """Check that a likely wrong implementation fails the check with a message naming the slip."""
    _HISTORY.clear()
    _IDS.clear()
    with pytest.raises(AssertionError) as info:
        _run(name, _module(**fakes))
    assert words in str(info.value)


def test_a_recompute_from_scratch_cache_scores_nothing_on_using_the_cache():
    """Check that prefill/decode that rerun the model over the ids seen and only advance pos fail every cache-use check."""
    _IDS.clear()
    module = _module(cached_forward=_forward_recompute)
    _run("cached_forward_matches_full_forward", module)  # right answers: only the cache-use checks can tell
    for name in ("cached_forward_decode_uses_the_cache",):
        with pytest.raises(AssertionError, match="recompute"):
            _run(name, module)


# ---------------------------------------------------------------------------------------------
# A learner function that changes what it is given scores nothing


def _wreck(*args, **kwargs):
    """Zero every model and tensor among the arguments, in place."""
    with torch.no_grad():
        for a in list(args) + list(kwargs.values()):
            if isinstance(a, torch.nn.Module):
                for p in a.parameters():
                    p.zero_()
                for b in a.buffers():
                    b.zero_()
            elif isinstance(a, torch.Tensor) and a.is_floating_point():
                a.zero_()
            elif isinstance(a, torch.Tensor):
                a.fill_(0)


def _update_wrecking(self, layer, k_new, v_new):
    _wreck(k_new, v_new)
    self.k.zero_()
    self.v.zero_()
    end = self.pos + k_new.shape[2]
    return self.k[layer, :, :, :end], self.v[layer, :, :, :end]


def _attention_wrecking(attn, x, cache, layer, rope_cos, rope_sin):
    _wreck(attn, x, rope_cos, rope_sin)
    return torch.zeros_like(x)


def _forward_wrecking(model, input_ids, cache):
    _wreck(model, input_ids)
    cache.advance(input_ids.shape[1])
    return torch.zeros(input_ids.shape[0], model.config.vocab_size)


def _kv_bytes_wrecking(config, seq_len, batch=1, dtype=torch.float16):
    """Shrinks the config it is given (a frozen dataclass yields to object.__setattr__), then answers for what it became."""
    object.__setattr__(config, "n_layers", 1)
    return kv_cache.kv_cache_bytes(config, seq_len, batch, dtype)


def _generate_wrecking(model, input_ids, max_new_tokens, temperature=0.0, generator=None, on_token=None, cache=None):
    _wreck(model, input_ids)
    return torch.zeros(input_ids.shape[0], input_ids.shape[1] + max_new_tokens, dtype=torch.long)


WRECKERS = {
    "4.1": {"KVCache": _cache_with(_update_wrecking)},
    "4.2": {"cached_attention": _attention_wrecking},
    "4.3": {"cached_forward": _forward_wrecking},
    "4.4": {"kv_cache_bytes": _kv_bytes_wrecking},
    "4.5": {"generate_cached": _generate_wrecking},
}


@pytest.mark.parametrize("name", [c for e in WRECKERS for c in _checks(e)])
def test_a_function_that_wrecks_its_arguments_fails_the_check(name):
    """Check that zeroing the model and tensors it was given (or shrinking the config), and answering for what they
    became, cannot make a check pass."""
    fakes = WRECKERS[CHECKS[name].exercise.id]
    with pytest.raises((AssertionError, ValueError, ZeroDivisionError)):
        _run(name, _module(**fakes))
    from kvlib.core.configs import REAL_MODELS

    assert REAL_MODELS["Llama-2-7B"].config.n_layers == 32, "a check handed learner code a shared config"
