"""kvlib/kv_cache.py (notebook 04): the reference passes every check, each check names the
mistake it exists for, cached generation equals full recompute, and the edges fail clearly."""
import types

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from kvlib import kv_cache
from kvlib.course.exercises import BY_ID
from kvlib.checks import CHECKS, checks_for
from kvlib.checks.kv_cache import CONFIG, _model

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

    model = Decoder(ModelConfig(vocab_size=40, d_model=32, n_layers=2, n_heads=4, n_kv_heads=4, hidden_dim=48, max_seq_len=256)).eval()
    ids = torch.randint(0, 40, (1, 8))
    assert torch.equal(kv_cache.generate_cached(model, ids, 200), generate(model, ids, 200))


def test_kv_cache_bytes_match_the_formula():
    """Check that the cache occupies 2 * n_layers * n_kv_heads * head_dim * bytes * tokens (x batch)."""
    for dtype, size in ((torch.float32, 4), (torch.float16, 2)):
        cache = kv_cache.KVCache(CONFIG, batch=3, max_seq_len=20, dtype=dtype)
        assert cache.nbytes == 2 * CONFIG.n_layers * CONFIG.n_kv_heads * CONFIG.head_dim * size * 20 * 3


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


def test_model_call_mirrors_the_seed_pseudo_code():
    """Check that logits, cache = model(ids, past_key_values=cache) runs and grows the cache."""
    model, cache = _model(), kv_cache.KVCache(CONFIG, batch=2)
    logits, same = model(torch.zeros(2, 4, dtype=torch.long), past_key_values=cache)
    assert same is cache and cache.pos == 4 and logits.shape == (2, 4, CONFIG.vocab_size)


# ---------------------------------------------------------------------------------------------
# Known mistakes, each caught and named


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


def _generate_without_reset(model, input_ids, max_new_tokens, temperature=0.0, generator=None, on_token=None, cache=None):
    if cache is None:
        cache = kv_cache.KVCache(model.config, batch=input_ids.shape[0])
    logits, tokens = kv_cache.prefill(model, input_ids, cache), []
    for _ in range(max_new_tokens):
        tokens.append(logits.argmax(-1))
        logits = kv_cache.decode_step(model, tokens[-1], cache) if len(tokens) < max_new_tokens else logits
    return torch.cat([input_ids, torch.stack(tokens, 1)], 1)


MISTAKES = [
    ("kv_cache_update_writes_in_place", {"KVCache": _CatCache}, "reallocated"),
    ("kv_cache_update_writes_in_place", {"KVCache": _AdvancingCache}, "must not move pos"),
    ("cached_attention_matches_full_attention", {"cached_attention": _attention_rope_from_zero}, "restart at 0"),
    ("cached_attention_matches_full_attention", {"cached_attention": _attention_is_causal}, "aligned top-left"),
    ("cached_attention_one_token_sees_every_key", {"cached_attention": _attention_is_causal}, "key 0 only"),
    ("generate_cached_resets_between_prompts", {"generate_cached": _generate_without_reset}, "reset the cache"),
]


@pytest.mark.parametrize("name, fake, words", MISTAKES, ids=[f"{m[0]}-{next(iter(m[1].values())).__name__}" for m in MISTAKES])
def test_check_names_the_known_mistake(name, fake, words):
    """Check that a deliberately wrong implementation fails the check with a message naming the mistake."""
    names = ("KVCache", "cached_attention", "prefill", "decode_step", "generate_cached")
    module = types.SimpleNamespace(**{n: getattr(kv_cache, n) for n in names})
    for key, fn in fake.items():
        setattr(module, key, fn)
    with pytest.raises(AssertionError) as info:
        CHECKS[name].fn(module, np.random.default_rng(0))
    assert words in str(info.value)


def test_generate_cached_matches_transformers_cached_generation():
    """Check that kvlib's cached greedy tokens equal transformers' generate(use_cache=True) on the same weights."""
    pytest.importorskip("transformers")
    from kvlib.core.weights import to_transformers

    model = _model(7)
    hf = to_transformers(model)
    ids = torch.randint(0, CONFIG.vocab_size, (1, 5), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        theirs = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=30, do_sample=False, use_cache=True,
                             pad_token_id=0)  # pad is unused: one unpadded prompt
    assert torch.equal(kv_cache.generate_cached(model, ids, 30), theirs)
