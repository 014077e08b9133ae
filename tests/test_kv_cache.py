"""kvlib/kv_cache.py (notebook 04): the reference passes every check, cached generation equals full
recompute, the edges fail clearly, and the checks hold in the isolated grading child.

Each exercise's check tests live here under three names, built with conftest.handed_in: ALTERNATIVES
(correct implementations in another shape, which pass every check of their exercise), SLIPS (likely
wrong ones, which fail the check or exercise named, with a message naming the slip), and a
function that changes its arguments (conftest.vandal) scores 0."""

import math
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import case_ids, check_failures, handed_in

from kvlib import kv_cache
from kvlib.attention import causal_mask
from kvlib.checks import CHECKS, checks_for
from kvlib.checks.kv_cache import CONFIG, _model
from kvlib.core.model import matrix_params, num_params
from kvlib.course.exercises import BY_ID
from kvlib.generation import next_token

KV_CHECKS = [c for i in range(1, 6) for c in checks_for(BY_ID[f"4.{i}"])]


@pytest.mark.parametrize("check", KV_CHECKS, ids=lambda c: c.name)
def test_reference_passes_check(check):
    """Check that the reference solution passes every check of notebook 04."""
    check.fn(kv_cache, np.random.default_rng(0))


def test_cached_decode_matches_full_recompute_for_200_tokens():
    """Check that cached and uncached greedy generation agree token for token over 200 new tokens."""
    from kvlib.generation import generate

    torch.manual_seed(0)
    from kvlib.core.model import Decoder, ModelConfig

    model = Decoder(
        ModelConfig(vocab_size=40, d_model=32, n_layers=2, n_heads=4, n_kv_heads=4, hidden_dim=48, max_seq_len=256)
    ).eval()
    ids = torch.randint(0, 40, (1, 8))
    assert torch.equal(kv_cache.generate_cached(model, ids, 200), generate(model, ids, 200))


def test_kv_cache_bytes_match_the_formula_and_what_the_cache_allocates():
    """Check that the cache occupies 2 * n_layers * n_kv_heads * head_dim * bytes * tokens (x batch), and that
    Exercise 4.4's kv_cache_bytes counts exactly what a KVCache allocates."""
    for dtype, size in ((torch.float32, 4), (torch.float16, 2)):
        cache = kv_cache.KVCache(CONFIG, batch=3, max_seq_len=20, dtype=dtype)
        assert cache.nbytes == 2 * CONFIG.n_layers * CONFIG.n_kv_heads * CONFIG.head_dim * size * 20 * 3
        assert kv_cache.kv_cache_bytes(CONFIG, 20, 3, dtype) == cache.nbytes


def test_running_past_max_seq_len_is_a_clear_error():
    """Check that a cache that is full refuses more tokens with a ValueError, instead of wrapping."""
    model = _model()
    cache = kv_cache.KVCache(CONFIG, batch=1, max_seq_len=6)
    kv_cache.prefill(model, torch.zeros(1, 5, dtype=torch.long), cache)
    kv_cache.decode_step(model, torch.zeros(1, dtype=torch.long), cache)
    with pytest.raises(ValueError, match="max_seq_len=6"):
        kv_cache.decode_step(model, torch.zeros(1, dtype=torch.long), cache)
    with pytest.raises(ValueError, match="max_seq_len"):
        kv_cache.generate_cached(model, torch.zeros(1, 40, dtype=torch.long), 20)


def test_decode_step_before_prefill_names_the_exercise():
    """Check that decode_step on an empty cache says to run prefill first."""
    cache = kv_cache.KVCache(CONFIG)
    with pytest.raises(ValueError, match=r"run prefill \(Exercise 4.3\)"):
        kv_cache.decode_step(_model(), torch.zeros(1, dtype=torch.long), cache)


def test_cached_forward_equals_the_models_own_cached_call():
    """Check that Exercise 4.3's layer loop and model(ids, past_key_values=cache) give the same logits and cache."""
    ids = torch.randint(0, CONFIG.vocab_size, (2, 9), generator=torch.Generator().manual_seed(3))
    mine, theirs = kv_cache.KVCache(CONFIG, batch=2), kv_cache.KVCache(CONFIG, batch=2)
    model = _model(3)
    with torch.inference_mode():
        for a, b in ((0, 6), (6, 7), (7, 9)):
            ours = kv_cache.cached_forward(model, ids[:, a:b], mine)
            logits, _ = model(ids[:, a:b], past_key_values=theirs)
            assert torch.allclose(ours, logits[:, -1], atol=1e-5) and mine.pos == theirs.pos == b
    assert torch.equal(mine.k, theirs.k) and torch.equal(mine.v, theirs.v)


def test_llama_2_7b_on_80_gb_holds_30_sequences_of_4096_tokens():
    """Check that notebook 04b's server sum (Exercise 4.6) holds: Llama-2-7B in float16 beside its weights on 80 GB holds
    30 sequences of 4,096 tokens (3 of 32,768), and its cache is 512 KiB per token (4.4's docstring example)."""
    from kvlib.core.configs import real_model

    config = real_model("Llama-2-7B").config
    assert kv_cache.kv_cache_bytes(config, 1) == 512 * 1024
    assert kv_cache.sequences_that_fit(config, 80 * 10**9, 4096) == 30
    assert kv_cache.sequences_that_fit(config, 80 * 10**9, 32768) == 3


def test_kv_cache_bytes_rejects_bad_input():
    """Check that kv_cache_bytes names a bad argument: a negative length, no batch, a dtype given as a string, no config."""
    with pytest.raises(ValueError, match="seq_len"):
        kv_cache.kv_cache_bytes(CONFIG, -1)
    with pytest.raises(ValueError, match="batch"):
        kv_cache.kv_cache_bytes(CONFIG, 4, 0)
    with pytest.raises(ValueError, match="torch.dtype"):
        kv_cache.kv_cache_bytes(CONFIG, 4, 1, "fp16")
    with pytest.raises(ValueError, match="kvlib ModelConfig"):
        kv_cache.kv_cache_bytes({"n_layers": 2}, 4)


def test_model_call_mirrors_the_seed_pseudo_code():
    """Check that logits, cache = model(ids, past_key_values=cache) runs and grows the cache."""
    model, cache = _model(), kv_cache.KVCache(CONFIG, batch=2)
    logits, same = model(torch.zeros(2, 4, dtype=torch.long), past_key_values=cache)
    assert same is cache and cache.pos == 4 and logits.shape == (2, 4, CONFIG.vocab_size)


# ---------------------------------------------------------------------------------------------
# Alternatives and slips, exercise by exercise


NAMES = ("KVCache", "cached_attention", "cached_forward", "kv_cache_bytes", "generate_cached", "sequences_that_fit")


def _module(**fakes):
    """What a learner hands in: kvlib.kv_cache (the reference, in reference mode) with some pieces replaced."""
    return handed_in(kv_cache, NAMES, **fakes)


def _run(check_name, module):
    CHECKS[check_name].fn(module, np.random.default_rng(0))


def _checks(ex_id):
    return [c.name for c in checks_for(BY_ID[ex_id])]


class _CatCache(kv_cache.KVCache):
    def update(self, layer, k_new, v_new):  # reallocates: torch.cat into a new tensor every call
        end = self.pos + k_new.shape[2]
        self.k = torch.cat([self.k[:, :, :, : self.pos], self.k[:, :, :, self.pos :]], dim=3).clone()
        self.k[layer, :, :, self.pos : end] = k_new
        self.v[layer, :, :, self.pos : end] = v_new
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]


class _AdvancingCache(kv_cache.KVCache):
    def update(self, layer, k_new, v_new):
        out = kv_cache.KVCache.update(self, layer, k_new, v_new)
        self.pos += k_new.shape[2]
        return out


def _attention_rope_from_zero(attn, x, cache, layer, rope_cos, rope_sin):
    B, T, _ = x.shape
    cos, sin = rope_cos[:T], rope_sin[:T]  # the slip: positions restart at 0
    q = attn.project_q(x, cos, sin)
    k, v = cache.update(layer, *attn.project_kv(x, cos, sin))
    mask = torch.tril(torch.ones(T, k.shape[2], dtype=torch.bool), k.shape[2] - T)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    return attn.o_proj(out.transpose(1, 2).reshape(B, T, -1))


def _attention_is_causal(attn, x, cache, layer, rope_cos, rope_sin):
    B, T, _ = x.shape
    cos, sin = rope_cos[cache.pos : cache.pos + T], rope_sin[cache.pos : cache.pos + T]
    q = attn.project_q(x, cos, sin)
    k, v = cache.update(layer, *attn.project_kv(x, cos, sin))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # the slip: top-left
    return attn.o_proj(out.transpose(1, 2).reshape(B, T, -1))


def _generate_without_reset(
    model, input_ids, max_new_tokens, temperature=0.0, generator=None, on_token=None, cache=None
):
    if cache is None:
        cache = kv_cache.KVCache(model.config, batch=input_ids.shape[0])
    logits, tokens = kv_cache.prefill(model, input_ids, cache), []
    for _ in range(max_new_tokens):
        tokens.append(logits.argmax(-1))
        logits = kv_cache.decode_step(model, tokens[-1], cache) if len(tokens) < max_new_tokens else logits
    return torch.cat([input_ids, torch.stack(tokens, 1)], 1)


def _kv_without_two(config, seq_len, batch=1, dtype=torch.float16):
    return kv_cache.kv_cache_bytes(config, seq_len, batch, dtype) // 2


def _kv_without_layers(config, seq_len, batch=1, dtype=torch.float16):
    return kv_cache.kv_cache_bytes(config, seq_len, batch, dtype) // config.n_layers


def _kv_with_query_heads(config, seq_len, batch=1, dtype=torch.float16):
    return kv_cache.kv_cache_bytes(config, seq_len, batch, dtype) * config.n_heads // config.n_kv_heads


def _kv_in_bits(config, seq_len, batch=1, dtype=torch.float16):
    return kv_cache.kv_cache_bytes(config, seq_len, batch, dtype) * 8


def _kv_without_batch(config, seq_len, batch=1, dtype=torch.float16):
    return kv_cache.kv_cache_bytes(config, seq_len, 1, dtype)


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
    h, S = _HISTORY[layer], _HISTORY[layer].shape[1]
    q, (k, v) = attn.project_q(h, rope_cos[:S], rope_sin[:S]), attn.project_kv(h, rope_cos[:S], rope_sin[:S])
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # (B, H, S, D), all from the inputs
    return attn.o_proj(out.transpose(1, 2).reshape(B, S, -1))[:, -T:]


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
    """The shortcut: the model's own cached forward runs the layer loop (and its head on every position)."""
    logits, _ = model(input_ids, past_key_values=cache)
    return logits[:, -1]


def _forward_blocks(model, input_ids, cache):
    """The shortcut: each Block's own forward with the cache and cached_attention passed in (Decoder.forward's cache
    branch); the last position through the head."""
    x = model.embed(input_ids)
    for i, layer in enumerate(model.layers):
        x = layer(x, model.rope_cos, model.rope_sin, cache, i, kv_cache.cached_attention)
    cache.advance(input_ids.shape[1])
    return model.lm_head(model.norm(x[:, -1:]))[:, 0]


def _through_layers(model, input_ids, cache):
    """The new tokens' hidden states after every layer, each reading and extending the cache; the cache advanced."""
    x = model.embed(input_ids)
    for i, layer in enumerate(model.layers):
        x = x + kv_cache.cached_attention(layer.attn, layer.attn_norm(x), cache, i, model.rope_cos, model.rope_sin)
        x = x + layer.mlp(layer.mlp_norm(x))
    cache.advance(input_ids.shape[1])
    return x


def _forward_einsum_head(model, input_ids, cache):
    """The layer loop by hand; the last position through the head's weight with einsum."""
    x = _through_layers(model, input_ids, cache)
    return torch.einsum("bc,vc->bv", model.norm(x[:, -1]), model.lm_head.weight)


def _forward_head_everywhere(model, input_ids, cache):
    """Slip: the layer loop right, then every position through the head, the last kept."""
    return model.lm_head(model.norm(_through_layers(model, input_ids, cache)))[:, -1]


def _forward_float64_head(model, input_ids, cache):
    """The layer loop by hand, the output head in float64."""
    h = _through_layers(model, input_ids, cache)
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
    return model.lm_head(model.norm(_through_layers(model, input_ids, cache)))


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


def _fit_counting(config, memory_bytes, seq_len, dtype=torch.float16):
    """One more sequence at a time while the weights and every cache still fit."""
    weights, one, n = num_params(config) * dtype.itemsize, kv_cache.kv_cache_bytes(config, seq_len, 1, dtype), 0
    while weights + (n + 1) * one <= memory_bytes:
        n += 1
    return n


def _fit_meta_tensors(config, memory_bytes, seq_len, dtype=torch.float16):
    """The cache's shape on the meta device (no memory), its bytes read off it."""
    keys = torch.empty(config.n_layers, 1, config.n_kv_heads, seq_len, config.head_dim, dtype=dtype, device="meta")
    left = memory_bytes - num_params(config) * torch.finfo(dtype).bits // 8
    return max(0, left // (2 * keys.numel() * keys.element_size()))


def _fit_floor(config, memory_bytes, seq_len, dtype=torch.float16):
    left = memory_bytes - num_params(config) * dtype.itemsize
    return int(max(0.0, math.floor(left / kv_cache.kv_cache_bytes(config, seq_len, 1, dtype))))


ALTERNATIVES = [
    *[("4.1", {"KVCache": _cache_with(f)}) for f in (_update_index_copy, _update_loop, _update_narrow)],
    *[
        ("4.2", {"cached_attention": f})
        for f in (_attention_float64_explicit, _attention_einsum_grouped, _attention_loop_over_queries)
    ],
    *[("4.3", {"cached_forward": f}) for f in (_forward_einsum_head, _forward_float64_head)],
    *[("4.4", {"kv_cache_bytes": f}) for f in (_kv_loop, _kv_tensor, _kv_group)],
    *[
        ("4.5", {"generate_cached": f})
        for f in (_generate_preallocated, _generate_while_cat, _generate_past_key_values)
    ],
    *[("4.6", {"sequences_that_fit": f}) for f in (_fit_counting, _fit_meta_tensors, _fit_floor)],
]


@pytest.mark.parametrize("ex_id, fakes", ALTERNATIVES, ids=case_ids(ALTERNATIVES))
def test_alternative_passes_every_check(ex_id, fakes):
    """Check that a correct implementation in another shape (loops, einsum, float64, index_copy_) passes every check of its exercise."""
    _HISTORY.clear()
    assert not check_failures(ex_id, _module(**fakes))


def _attention_without_mask(attn, x, cache, layer, rope_cos, rope_sin):
    B, T, _ = x.shape
    cos, sin = rope_cos[cache.pos : cache.pos + T], rope_sin[cache.pos : cache.pos + T]
    q = attn.project_q(x, cos, sin)
    k, v = cache.update(layer, *attn.project_kv(x, cos, sin))
    out = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # the slip: no mask, even for a prefill
    return attn.o_proj(out.transpose(1, 2).reshape(B, T, -1))


def _generate_greedy_only(model, input_ids, max_new_tokens, temperature=0.0, generator=None, on_token=None, cache=None):
    return kv_cache.generate_cached(model, input_ids, max_new_tokens, on_token=on_token, cache=cache)  # drops sampling


def _fit(config, memory_bytes, seq_len, dtype=torch.float16, *, weights=1, per_sequence=False, cache_dtype=None):
    """sequences_that_fit with a slip: the weights counted `weights` times (0: left out), or once per sequence, or
    the cache in another dtype; unrounded and unclamped (the callers add those slips)."""
    w, one = num_params(config) * dtype.itemsize, kv_cache.kv_cache_bytes(config, seq_len, 1, cache_dtype or dtype)
    return memory_bytes // (w + one) if per_sequence else (memory_bytes - weights * w) // one


# (check, replaced pieces, words its failure must contain)
SLIPS = [
    ("kv_cache_bytes_of_real_models", {"kv_cache_bytes": _kv_without_two}, "factor 2"),
    ("kv_cache_bytes_of_real_models", {"kv_cache_bytes": _kv_without_layers}, "n_layers"),
    ("kv_cache_bytes_of_real_models", {"kv_cache_bytes": _kv_with_query_heads}, "n_kv_heads heads, not n_heads"),
    ("kv_cache_bytes_of_real_models", {"kv_cache_bytes": _kv_in_bits}, "bytes, not bits"),
    (
        "kv_cache_bytes_scales_with_tokens_batch_and_dtype",
        {"kv_cache_bytes": _kv_without_batch},
        "one sequence's cache",
    ),
    ("kv_cache_update_writes_in_place", {"KVCache": _CatCache}, "reallocated"),
    ("kv_cache_update_writes_in_place", {"KVCache": _AdvancingCache}, "update moved pos"),
    ("cached_attention_matches_full_attention", {"cached_attention": _attention_rope_from_zero}, "restart at 0"),
    ("cached_attention_matches_full_attention", {"cached_attention": _attention_is_causal}, "aligned top-left"),
    ("cached_attention_one_token_sees_every_key", {"cached_attention": _attention_is_causal}, "key 0 only"),
    (
        "generate_cached_resets_between_prompts",
        {"generate_cached": _generate_without_reset},
        "includes the earlier prompt",
    ),
    (
        "kv_cache_grows_one_slot_per_step",
        {"KVCache": _cache_with(_update_every_layer)},
        "changed another",
    ),
    ("kv_cache_grows_one_slot_per_step", {"KVCache": _cache_with(_update_at_zero)}, "were overwritten"),
    ("kv_cache_grows_one_slot_per_step", {"KVCache": _cache_with(_update_returns_new)}, "should return 4 positions"),
    ("cached_attention_one_token_sees_every_key", {"cached_attention": _attention_own_keys_only}, "only its own key"),
    (
        "cached_attention_reads_the_cache",
        {"cached_attention": _attention_private_history},
        "ignored the keys and values in the cache",
    ),
    ("cached_attention_matches_full_attention", {"cached_attention": _attention_no_o_proj}, "output projection"),
    ("cached_forward_prefill_runs_once", {"cached_forward": _forward_one_at_a_time}, "one token at a time"),
    ("cached_forward_prefill_runs_once", {"cached_forward": _forward_head_everywhere}, "computed 12 rows of logits"),
    ("cached_forward_matches_full_forward", {"cached_forward": _forward_advance_per_layer}, "cache.pos is 12"),
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
        "cache.pos is 14: one token more",
    ),
    ("cached_attention_matches_full_attention", {"cached_attention": _attention_without_mask}, "without a causal mask"),
    ("generate_cached_matches_generate", {"generate_cached": _generate_greedy_only}, "went unused"),
    (
        "sequences_that_fit_real_gpus",
        {"sequences_that_fit": lambda *a: max(0, _fit(*a, weights=0))},
        "the weights take",
    ),
    (
        "sequences_that_fit_real_gpus",
        {"sequences_that_fit": lambda *a: _fit(*a, per_sequence=True)},
        "stored once and shared",
    ),
    (
        "sequences_that_fit_real_gpus",
        {"sequences_that_fit": lambda *a: max(0, _fit(*a, cache_dtype=torch.float16))},
        "the caches counted in float16",
    ),
    ("sequences_that_fit_real_gpus", {"sequences_that_fit": lambda *a: _fit(*a)}, "not a negative count"),
    (
        "sequences_that_fit_real_gpus",
        {
            "sequences_that_fit": lambda c, m, s, d=torch.float16: (
                max(0, m - num_params(c) * d.itemsize) / kv_cache.kv_cache_bytes(c, s, 1, d)
            )
        },
        "a fraction of a sequence",
    ),
    (
        "sequences_that_fit_real_gpus",
        {
            "sequences_that_fit": lambda c, m, s, d=torch.float16: (
                max(0, m - num_params(c) * d.itemsize) // kv_cache.kv_cache_bytes(c, 1, 1, d)
            )
        },
        "counts tokens, not sequences",
    ),
    ("sequences_that_fit_real_gpus", {"sequences_that_fit": lambda *a: 30}, "expected 59 sequences"),
    (
        "sequences_that_fit_real_gpus",
        {
            "sequences_that_fit": lambda c, m, s, d=torch.float16: max(
                0, (m - matrix_params(c) * d.itemsize) // kv_cache.kv_cache_bytes(c, s, 1, d)
            )
        },
        "without the embedding table",
    ),
]


@pytest.mark.parametrize("name, fakes, words", SLIPS, ids=case_ids(SLIPS))
def test_slip_is_rejected_naming_it(name, fakes, words):
    """Check that a likely wrong implementation fails the check with a message naming the slip."""
    _HISTORY.clear()
    _IDS.clear()
    ((failed, err),) = check_failures(name, _module(**fakes))
    assert isinstance(err, AssertionError), err
    assert words in str(err)


def test_shipped_cached_forward_fails_every_check_showing_the_symptom():
    """Check that Exercise 4.3's shipped body (the released stub's, a find-and-fix: the cache advanced inside the layer
    loop, every position through the head) fails every check of 4.3, the first with the symptom (cache.pos after a
    prefill of 4 tokens through 3 layers) and none naming the cause; with the loop fixed, the head's count remains."""
    shipped = kv_cache.cached_forward.__wrapped__  # the stub's own body, its 4.2 the reference's (reference mode)
    assert (
        shipped.__code__.co_filename.endswith("kvlib/kv_cache.py") and "solutions" not in shipped.__code__.co_filename
    )
    failures = check_failures("4.3", _module(cached_forward=shipped))
    assert [name for name, _ in failures] == [c.name for c in checks_for(BY_ID["4.3"])]
    first = str(failures[0][1])
    assert "cache.pos is 12" in first and "it moved by 12" in first, first
    for name, err in failures:
        assert not re.search(r"advance|loop|once|lm_head\(model.norm\(x", str(err)), (name, err)
    ((name, err),) = check_failures("4.3", _module(cached_forward=_forward_head_everywhere))
    assert name == "cached_forward_prefill_runs_once" and "computed 12 rows of logits" in str(err)


def _attention_mha_only(attn, x, cache, layer, rope_cos, rope_sin):  # slip: one key/value head per query head
    B, T, _ = x.shape
    cos, sin = rope_cos[cache.pos : cache.pos + T], rope_sin[cache.pos : cache.pos + T]
    q = attn.project_q(x, cos, sin)
    k, v = cache.update(layer, *attn.project_kv(x, cos, sin))
    mask = torch.from_numpy(causal_mask(T, k.shape[2]))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # no enable_gqa: 4 query heads against 2
    return attn.o_proj(out.transpose(1, 2).reshape(B, T, -1))


def _attention_ready_made(attn, x, cache, layer, rope_cos, rope_sin):  # the infrastructure's copy of 4.2
    from kvlib.core.cache import attention_through_cache

    return attention_through_cache(attn, x, cache, layer, rope_cos, rope_sin)


def _attention_cache_base(attn, x, cache, layer, rope_cos, rope_sin):  # the same, through CacheBase's default
    from kvlib.core.cache import CacheBase

    return CacheBase.attention(attn, x, cache, layer, rope_cos, rope_sin)


def _attention_models_attend(attn, x, cache, layer, rope_cos, rope_sin):  # the mask left to the model's own step
    B, T, _ = x.shape
    cos, sin = rope_cos[cache.pos : cache.pos + T], rope_sin[cache.pos : cache.pos + T]
    k, v = cache.update(layer, *attn.project_kv(x, cos, sin))
    return attn.o_proj(attn.attend(attn.project_q(x, cos, sin), k, v).transpose(1, 2).reshape(B, T, -1))


def _attention_models_attend_spliced(attn, x, cache, layer, rope_cos, rope_sin):  # Attention.attend's body, pasted
    B, T, _ = x.shape
    cos, sin = rope_cos[cache.pos : cache.pos + T], rope_sin[cache.pos : cache.pos + T]
    q = attn.project_q(x, cos, sin)
    k, v = cache.update(layer, *attn.project_kv(x, cos, sin))
    from kvlib.core.model import causal_mask_tensor

    mask = None if k.shape[2] == T else causal_mask_tensor(T, k.shape[2])  # the model's mask decides what each sees
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=True)
    return attn.o_proj(out.transpose(1, 2).reshape(B, T, -1))


def _kv_from_a_cache(config, seq_len, batch=1, dtype=torch.float16):  # a one-token cache made and measured
    return kv_cache.KVCache(config, batch, 1, dtype).nbytes * seq_len


def _kv_from_a_meta_cache(config, seq_len, batch=1, dtype=torch.float16):  # the same on the meta device: no memory
    return kv_cache.KVCache(config, batch, 1, dtype, device="meta").nbytes * seq_len


# (exercise, replaced pieces, words every one of its checks' failures must contain)
READY_MADE = [
    ("4.2", {"cached_attention": _attention_ready_made}, "called kvlib.core.cache.attention_through_cache"),
    ("4.2", {"cached_attention": _attention_cache_base}, "called kvlib.core.cache.attention_through_cache"),
    ("4.2", {"cached_attention": _attention_models_attend}, "called the model's attention step"),
    ("4.2", {"cached_attention": _attention_models_attend_spliced}, "called the model's mask"),
    ("4.3", {"cached_forward": _forward_past_key_values}, "ran the model's own forward"),
    ("4.3", {"cached_forward": _forward_blocks}, "ran a layer's own forward"),
    ("4.3", {"cached_forward": _forward_recompute}, "without a cache it recomputes what the cache keeps"),
    ("4.4", {"kv_cache_bytes": _kv_from_a_cache}, "made a cache"),
    ("4.4", {"kv_cache_bytes": _kv_from_a_meta_cache}, "made a cache"),
]


@pytest.mark.parametrize("ex_id, fakes, words", READY_MADE, ids=case_ids(READY_MADE))
def test_kvlibs_ready_made_answer_fails_every_check_naming_it(ex_id, fakes, words):
    """Check that an exercise answered by kvlib's own code (the infrastructure's copy of 4.2, the model's or its layers'
    forward for 4.3, a cache made and measured for 4.4: kvlib.course.exercises.READY_MADE) fails every check of the
    exercise, each naming what it called."""
    failures = check_failures(ex_id, _module(**fakes))
    assert [name for name, _ in failures] == _checks(ex_id), failures
    assert all(words in str(err) and "while Exercise" in str(err) for _, err in failures), failures


def test_an_mha_only_attention_names_the_gqa_layer():
    """Check that cached attention written for one key/value head per query head, which torch rejects on the checks'
    GQA layer with a tensor-size error, fails each 4.2 check with a message naming the cause (the cache's n_kv_heads)."""
    failures = check_failures("4.2", _module(cached_attention=_attention_mha_only))
    assert [name for name, _ in failures] == _checks("4.2"), failures
    for _, err in failures:
        assert isinstance(err, AssertionError) and "the cache holds n_kv_heads = 2 heads, not n_heads" in str(err), err


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


def _fit_wrecking(config, memory_bytes, seq_len, dtype=torch.float16):
    """Shrinks the config it is given, then answers for what it became."""
    object.__setattr__(config, "n_layers", 1)
    return kv_cache.sequences_that_fit(config, memory_bytes, seq_len, dtype)


VANDALS = {
    "4.1": {"KVCache": _cache_with(_update_wrecking)},
    "4.2": {"cached_attention": _attention_wrecking},
    "4.3": {"cached_forward": _forward_wrecking},
    "4.4": {"kv_cache_bytes": _kv_bytes_wrecking},
    "4.5": {"generate_cached": _generate_wrecking},
    "4.6": {"sequences_that_fit": _fit_wrecking},
}


@pytest.mark.parametrize("name", [c for e in VANDALS for c in _checks(e)])
def test_a_function_that_changes_its_arguments_scores_zero(name):
    """Check that zeroing the model and tensors it was given (or shrinking the config), and answering for what they
    became, cannot make a check pass."""
    fakes = VANDALS[CHECKS[name].exercise.id]
    with pytest.raises((AssertionError, ValueError, ZeroDivisionError)):
        _run(name, _module(**fakes))
    from kvlib.core.configs import REAL_MODELS

    assert REAL_MODELS["Llama-2-7B"].config.n_layers == 32, "a check handed learner code a shared config"


def test_generate_cached_matches_transformers_cached_generation():
    """Check that kvlib's cached greedy tokens equal transformers' generate(use_cache=True) on the same weights."""
    pytest.importorskip("transformers")
    from kvlib.core.weights import to_transformers

    model = _model(7)
    hf = to_transformers(model)
    ids = torch.randint(0, CONFIG.vocab_size, (1, 5), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        theirs = hf.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=30, do_sample=False, use_cache=True, pad_token_id=0
        )  # pad is unused: one unpadded prompt
    assert torch.equal(kv_cache.generate_cached(model, ids, 30), theirs)


# ---------------------------------------------------------------------------------------------
# In the isolated grading child, as nbgrader runs them


def _sandboxed_checks(kv_source: str) -> dict[str, str]:
    """Every 4.x check on a kv_cache.py run in the isolated child: check name -> "pass" or its message."""
    from conftest import ROOT

    from kvlib.grading.sandbox import Sandbox, package_files

    files = package_files(ROOT / "kvlib")
    for module in ("attention", "generation"):  # 4.x use 1.3's mask and 2.1's sampling
        files[f"kvlib/{module}.py"] = (ROOT / "solutions" / "kvlib" / f"{module}.py").read_bytes()
    files["kvlib/kv_cache.py"] = kv_source.encode()
    functions = [
        "kv_cache.KVCache",
        "kv_cache.cached_attention",
        "kv_cache.cached_forward",
        "kv_cache.kv_cache_bytes",
        "kv_cache.generate_cached",
    ]
    verdicts = {}
    with Sandbox(
        files, ["attention", "generation", "kv_cache"], functions, mode="plain", torch=True, call_timeout=60, budget=300
    ) as sandbox:
        for check in KV_CHECKS:
            try:
                check.fn(sandbox.module("kv_cache"), np.random.default_rng(0))
                verdicts[check.name] = "pass"
            except Exception as err:  # noqa: BLE001 - any failure scores 0, as in the grader
                verdicts[check.name] = f"{type(err).__name__}: {err}"
    return verdicts


def test_checks_count_mlp_tokens_and_read_the_cache_in_the_isolated_child():
    """Check that the reference passes every 4.x check in the grading child, and a cached_forward that reruns the
    model over the ids seen (only moving cache.pos) fails every 4.3 check there, naming the model's own forward it
    ran (closed while 4.3 is checked: kvlib.course.exercises.READY_MADE); in the same child,
    kvlib's ready-made answers to 4.2 (attention_through_cache) and 4.4 (a cache made and measured) fail every check
    of their exercise, naming what they called (the child closes them while the exercise runs)."""
    from conftest import ROOT

    source = (ROOT / "solutions" / "kvlib" / "kv_cache.py").read_text(encoding="utf-8")
    assert set(_sandboxed_checks(source).values()) == {"pass"}
    body = source[
        source.index("    ### BEGIN SOLUTION\n    x = model.embed") : source.index(
            "    ### END SOLUTION\n    ### BEGIN SHIPPED"
        )
    ]
    recompute = (
        "    seen = input_ids if cache.pos == 0 else torch.cat([cache.seen, input_ids], 1)\n"
        "    cache.seen = seen\n    cache.advance(input_ids.shape[1])\n    return model(seen)[:, -1]\n"
    )
    source = source.replace(body, recompute)
    for start, shortcut in (
        ("import torch.nn.functional as F", "from kvlib.core.cache import attention_through_cache\n    return "
         "attention_through_cache(attn, x, cache, layer, rope_cos, rope_sin)\n"),
        ("per_token = 2", "return KVCache(config, batch, 1, dtype).nbytes * seq_len\n"),
    ):  # fmt: skip
        begin = source.index("    ### BEGIN SOLUTION\n    " + start)
        end = source.index("    ### END SOLUTION", begin)
        source = source[:begin] + "    " + shortcut + source[end:]
    verdicts = _sandboxed_checks(source)
    for ex_id in ("4.2", "4.4"):
        for name in _checks(ex_id):
            assert f"while Exercise {ex_id} was checked" in verdicts[name], (name, verdicts[name])
    for name in _checks("4.3"):  # the model's own forward, closed while 4.3 is checked, named
        assert "ran the model's own forward" in verdicts[name] and "recomputes what the cache keeps" in verdicts[name]
    assert "reruns earlier tokens" in verdicts["generate_cached_uses_the_cache"]


def test_a_submission_that_zeroes_the_model_it_is_given_scores_nothing_in_the_isolated_child():
    """Check that the attack of issue 15 scores nothing: a cached_forward and generate_cached that zero the
    model's weights and the ids they are given (copied back into the grader's objects) and return zeros fail
    every check of 4.3 and 4.5."""
    from conftest import ROOT

    source = (ROOT / "solutions" / "kvlib" / "kv_cache.py").read_text(encoding="utf-8")
    wreck = "    with torch.no_grad():\n        for p in model.parameters():\n            p.zero_()\n    input_ids.zero_()\n"
    forward = source[
        source.index("    ### BEGIN SOLUTION\n    x = model.embed") : source.index(
            "    ### END SOLUTION\n    ### BEGIN SHIPPED"
        )
    ]
    source = source.replace(
        forward,
        wreck
        + "    cache.advance(input_ids.shape[1])\n    return torch.zeros(input_ids.shape[0], model.config.vocab_size)\n",
    )
    generate = source[
        source.index("    ### BEGIN SOLUTION\n    from kvlib.generation import next_token") : source.rindex(
            "    ### END SOLUTION"
        )
    ]
    source = source.replace(
        generate,
        wreck + "    return torch.zeros(input_ids.shape[0], input_ids.shape[1] + max_new_tokens, dtype=torch.long)\n",
    )
    verdicts = _sandboxed_checks(source)
    wrecked = [c.name for c in KV_CHECKS if c.exercise.id in ("4.3", "4.5")]
    assert all(verdicts[name] != "pass" for name in wrecked), {n: verdicts[n] for n in wrecked}
