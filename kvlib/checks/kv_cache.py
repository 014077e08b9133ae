"""Checks for notebook 04 (kvlib/kv_cache.py): exercises 4.1-4.5.

Every cached result is compared with full recompute on small random GQA decoders whose sizes
all differ (batch 2, 4 query heads, 2 KV heads), and the known slips are named: rotary
positions restarting at 0, is_causal=True for new queries against more keys, torch.cat that
reallocates, a cache not reset between prompts.
"""
from __future__ import annotations

import torch

from kvlib.checks import check
from kvlib.core.model import Decoder, ModelConfig

CONFIG = ModelConfig(vocab_size=29, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, hidden_dim=40, max_seq_len=48)


def _model(seed: int = 0) -> Decoder:
    torch.manual_seed(seed)
    return Decoder(CONFIG).eval()


def _ids(rng, batch, n):
    return torch.from_numpy(rng.integers(0, CONFIG.vocab_size, size=(batch, n)))


def _close(a, b) -> bool:
    return a.shape == b.shape and torch.allclose(a, b, rtol=1e-4, atol=1e-5)


def _cache(kv, batch=2, max_seq_len=None):
    return kv.KVCache(CONFIG, batch=batch, max_seq_len=max_seq_len)


def _storage(cache) -> tuple[int, int]:
    """Where cache.k and cache.v live: asked of the isolated child when the cache is kept there."""
    if hasattr(type(cache), "kvlib_data_ptr"):  # a kvlib.grading RemoteObject
        return cache.kvlib_data_ptr("k"), cache.kvlib_data_ptr("v")
    return cache.k.data_ptr(), cache.v.data_ptr()


# ---------------------------------------------------------------------------------------------
# 4.1 KVCache.update


@check("4.1")
def kv_cache_update_writes_in_place(kv, rng):
    """Check that update writes one layer's keys and values at [pos, pos + seq_len) of the pre-allocated cache."""
    cache = _cache(kv, max_seq_len=10)
    storage = _storage(cache)
    k1, v1 = torch.randn(2, 2, 3, 8), torch.randn(2, 2, 3, 8)
    k, v = cache.update(1, k1, v1)
    assert tuple(k.shape) == (2, 2, 3, 8) and tuple(v.shape) == (2, 2, 3, 8), f"after 3 tokens update should return (2, 2, 3, 8), got {tuple(k.shape)}"
    assert _storage(cache) == storage, "the cache was reallocated: write into self.k / self.v in place (no torch.cat)"
    assert torch.equal(cache.k[1, :, :, :3], k1) and torch.equal(cache.v[1, :, :, :3], v1), "k_new, v_new should land at positions 0..2 of layer 1"
    assert not cache.k[0].any() and not cache.k[2].any(), "update(1, ...) must leave the other layers alone"
    assert cache.pos == 0, "update must not move pos: advance() does that once every layer is written"


@check("4.1")
def kv_cache_grows_one_slot_per_step(kv, rng):
    """Check that after a prompt of 3, each decode step returns one more cached position, old ones intact."""
    cache = _cache(kv, max_seq_len=10)
    first = torch.randn(2, 2, 3, 8)
    cache.update(0, first, first)
    cache.advance(3)
    for step in range(4):
        new = torch.randn(2, 2, 1, 8)
        k, v = cache.update(0, new, -new)
        assert tuple(k.shape) == (2, 2, 4 + step, 8), f"decode step {step + 1} should return {4 + step} positions, got {tuple(k.shape)}"
        assert torch.equal(k[:, :, :3], first), "the prompt's keys must stay where they were written"
        assert torch.equal(k[:, :, -1:], new) and torch.equal(v[:, :, -1:], -new), "the new token goes at position pos"
        cache.advance(1)


# ---------------------------------------------------------------------------------------------
# 4.2 cached_attention


def _full_rows(model, x):
    """Reference: layer 0's attention over the whole sequence x (B, S, C)."""
    S = x.shape[1]
    return model.layers[0].attn(x, model.rope_cos[:S], model.rope_sin[:S])


@check("4.2")
def cached_attention_matches_full_attention(kv, rng):
    """Check that a prompt of 3 then a chunk of 2 through the cache equals attention over all 5 at once."""
    model = _model(int(rng.integers(1000)))
    x = torch.from_numpy(rng.normal(size=(2, 5, CONFIG.d_model))).float()
    full = _full_rows(model, x)
    cache = _cache(kv)
    with torch.inference_mode():
        first = kv.cached_attention(model.layers[0].attn, x[:, :3], cache, 0, model.rope_cos, model.rope_sin)
        cache.advance(3)
        second = kv.cached_attention(model.layers[0].attn, x[:, 3:], cache, 0, model.rope_cos, model.rope_sin)
    assert tuple(second.shape) == (2, 2, CONFIG.d_model), f"the output should be (batch, seq_len, d_model) = (2, 2, 32), got {tuple(second.shape)}"
    assert _close(first, full[:, :3]), "the first chunk (positions 0..2, empty cache) should equal plain causal attention"
    if not _close(second, full[:, 3:]):  # name the slip: rebuild the two classic wrong answers
        cos0, sin0 = model.rope_cos[:2], model.rope_sin[:2]  # positions 0, 1 instead of 3, 4
        attn = model.layers[0].attn
        q_at_0 = attn.project_q(x[:, 3:], cos0, sin0)
        k_all, v_all = attn.project_kv(x, model.rope_cos[:5], model.rope_sin[:5])
        k_all[:, :, 3:], v_all[:, :, 3:] = attn.project_kv(x[:, 3:], cos0, sin0)
        mask = torch.tril(torch.ones(2, 5, dtype=torch.bool), 3)
        wrong = torch.nn.functional.scaled_dot_product_attention(q_at_0, k_all, v_all, attn_mask=mask, enable_gqa=True)
        wrong = attn.o_proj(wrong.transpose(1, 2).reshape(2, 2, -1))
        if _close(second, wrong):
            raise AssertionError("the rotary positions restart at 0: new token i sits at position cache.pos + i")
        top_left = torch.nn.functional.scaled_dot_product_attention(
            attn.project_q(x[:, 3:], model.rope_cos[3:5], model.rope_sin[3:5]), *attn.project_kv(x, model.rope_cos[:5], model.rope_sin[:5]),
            is_causal=True, enable_gqa=True)
        if _close(second, attn.o_proj(top_left.transpose(1, 2).reshape(2, 2, -1))):
            raise AssertionError("the mask is aligned top-left (is_causal=True): 2 new queries against 5 keys sit at positions 3 and 4")
        raise AssertionError("the second chunk (positions 3, 4 against 5 keys) differs from attention over the full sequence")


@check("4.2")
def cached_attention_one_token_sees_every_key(kv, rng):
    """Check that one decode-step query attends to all cached keys, not just the first."""
    model = _model(1)
    x = torch.from_numpy(rng.normal(size=(2, 7, CONFIG.d_model))).float()
    full = _full_rows(model, x)
    cache = _cache(kv)
    attn = model.layers[0].attn
    with torch.inference_mode():
        kv.cached_attention(attn, x[:, :6], cache, 0, model.rope_cos, model.rope_sin)
        cache.advance(6)
        last = kv.cached_attention(attn, x[:, 6:], cache, 0, model.rope_cos, model.rope_sin)
    if not _close(last, full[:, 6:]):
        q = attn.project_q(x[:, 6:], model.rope_cos[6:7], model.rope_sin[6:7])
        k, v = attn.project_kv(x, model.rope_cos[:7], model.rope_sin[:7])
        only_first = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        if _close(last, attn.o_proj(only_first.transpose(1, 2).reshape(2, 1, -1))):
            raise AssertionError("is_causal=True with 1 query and 7 keys lets the query see key 0 only: use causal_mask(seq_len, kv_len)")
        raise AssertionError("the decode-step output (position 6, against 7 keys) differs from full attention's last row")


# ---------------------------------------------------------------------------------------------
# 4.3 prefill, 4.4 decode_step


@check("4.3")
def prefill_matches_full_forward(kv, rng):
    """Check that prefill returns the last position's logits of a full forward and stores seq_len tokens."""
    model = _model(2)
    ids = _ids(rng, 2, 6)
    cache = _cache(kv)
    with torch.inference_mode():
        logits = kv.prefill(model, ids, cache)
        full = model(ids)[:, -1]
    assert isinstance(logits, torch.Tensor) and tuple(logits.shape) == (2, CONFIG.vocab_size), (
        f"prefill should return the last position's logits (batch, vocab_size) = (2, {CONFIG.vocab_size}), got {getattr(logits, 'shape', logits)}")
    assert _close(logits, full), "prefill's logits differ from model(input_ids)[:, -1]"
    assert cache.pos == 6, f"after a prompt of 6 tokens the cache should hold 6 (cache.pos), got {cache.pos}"


@check("4.3")
def prefill_in_chunks_equals_one_prefill(kv, rng):
    """Check that a prompt fed in two chunks gives the same logits as one prefill."""
    model = _model(3)
    ids = _ids(rng, 2, 7)
    cache = _cache(kv)
    with torch.inference_mode():
        kv.prefill(model, ids[:, :4], cache)
        logits = kv.prefill(model, ids[:, 4:], cache)
        full = model(ids)[:, -1]
    assert cache.pos == 7, f"two chunks of 4 and 3 tokens should leave cache.pos at 7, got {cache.pos}"
    assert _close(logits, full), "chunked prefill should equal one prefill of the whole prompt"


@check("4.4")
def decode_step_matches_full_recompute(kv, rng):
    """Check that each decode step's logits equal a full forward over all tokens so far."""
    model = _model(4)
    ids = _ids(rng, 2, 9)
    cache = _cache(kv)
    with torch.inference_mode():
        full = model(ids)  # (2, 9, vocab)
        kv.prefill(model, ids[:, :5], cache)
        for t in range(5, 9):
            logits = kv.decode_step(model, ids[:, t], cache)
            assert tuple(logits.shape) == (2, CONFIG.vocab_size), f"decode_step should return (batch, vocab_size), got {tuple(logits.shape)}"
            assert cache.pos == t + 1, f"each decode step should store exactly one token: expected cache.pos {t + 1}, got {cache.pos}"
            assert _close(logits, full[:, t]), f"decode step at position {t} differs from full recompute"


# ---------------------------------------------------------------------------------------------
# 4.5 generate_cached


def _greedy(model, ids, n):
    with torch.inference_mode():
        for _ in range(n):
            ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids


@check("4.5")
def generate_cached_matches_generate(kv, rng):
    """Check that greedy tokens with the cache equal greedy tokens of full recompute (fp32, 30 tokens)."""
    model = _model(int(rng.integers(1000)))
    for prompt_len in (1, 5):  # a one-token prompt is an edge case
        ids = _ids(rng, 2, prompt_len)
        out = kv.generate_cached(model, ids, 30)
        expected = _greedy(model, ids, 30)
        assert isinstance(out, torch.Tensor) and out.shape == expected.shape, f"generate_cached should return {tuple(expected.shape)}, got {getattr(out, 'shape', out)}"
        assert torch.equal(out, expected), f"with a prompt of {prompt_len}, cached greedy tokens differ from full recompute"


@check("4.5")
def generate_cached_resets_between_prompts(kv, rng):
    """Check that a cache reused for a second prompt gives the same tokens as a fresh one."""
    model = _model(6)
    cache = _cache(kv, batch=1)
    a, b = _ids(rng, 1, 4), _ids(rng, 1, 6)
    kv.generate_cached(model, a, 8, cache=cache)
    second = kv.generate_cached(model, b, 8, cache=cache)
    assert cache.pos == 6 + 7, (
        f"after a 6-token prompt and 8 new tokens the cache should hold 13 tokens (the last token is never fed back), "
        f"got cache.pos {cache.pos}" + (": the second prompt saw the first one's keys, reset the cache before prefill" if cache.pos > 13 else "")
    )
    assert torch.equal(second, _greedy(model, b, 8)), "the second prompt's tokens differ from a fresh run: reset the cache before prefill"


@check("4.5")
def generate_cached_answers_the_seed_question(kv, rng):
    """Check that the shipped model with the cache continues 法国的首都是 with 巴黎, streaming each token."""
    from kvlib.core.weights import load_tiny

    model, tokenizer = load_tiny()
    ids = torch.tensor([tokenizer.encode("法国的首都是")])
    seen = []
    out = kv.generate_cached(model, ids, 2, on_token=lambda t: seen.append(int(t[0])))
    assert tokenizer.decode(out[0, ids.shape[1]:].tolist()) == "巴黎", f"expected 巴黎, got {tokenizer.decode(out[0, ids.shape[1]:].tolist())!r}"
    assert seen == out[0, ids.shape[1]:].tolist(), "on_token should be called with each new token, as in generate"
