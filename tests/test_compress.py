"""kvlib/compress.py (notebook 08): int8 keys and values, the rolling cache with sinks, MLA two ways; the
caches through the model, bad input, the bytes table and the benchmark's shape of report.

The check tests go under two names, built with conftest.handed_in: ALTERNATIVES
(correct implementations in another shape, which pass every check of their exercise), SLIPS (likely
wrong ones, which fail the check or exercise named, with a message naming the slip).
Runs in reference mode (conftest). No test asserts on time."""

import inspect
import math
import types
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import case_ids, check_failures, handed_in, on_a_terminal, shown_progress

from kvlib import compress
from kvlib.checks import checks_for, run
from kvlib.checks.compress import CONFIG
from kvlib.core.model import Decoder, ModelConfig, causal_mask_tensor
from kvlib.course.exercises import BY_ID, ExerciseNotDone
from kvlib.kv_cache import KVCache
from kvlib.measure import bench_compress
from kvlib.variants import compressed

torch.set_num_threads(1)

CHECKS_08 = [c for i in range(1, 9) for c in checks_for(BY_ID[f"8.{i}"])]
NAMES = (
    "quantize",
    "dequantize",
    "int8_attention",
    "int8_bytes_per_token",
    "SinkCache",
    "cache_positions",
    "mla_reconstruct",
    "mla_absorbed",
    "mla_flops",
)


@pytest.mark.parametrize("check", CHECKS_08, ids=lambda c: c.name)
def test_reference_passes_check(check):
    """Check that the reference solution passes every check of notebook 08."""
    check.fn(compress, np.random.default_rng(0))


def test_learner_stubs_are_todo(learner_mode):
    """Check that in learner mode every 8.x exercise raises ExerciseNotDone naming itself; 8.3, which ships a broken
    body (find and fix), fails its checks instead."""
    mla = (
        torch.zeros(1, 2, 1, 3),
        torch.zeros(1, 2, 1, 4),
        torch.zeros(1, 2, 5),
        torch.zeros(1, 2, 4),
        torch.zeros(2, 3, 5),
        torch.zeros(2, 3, 5),
    )
    for ex_id, call in (
        ("8.1", lambda: compress.quantize(torch.zeros(2, 3), -1)),
        (
            "8.2",
            lambda: compress.int8_attention(
                torch.zeros(1, 2, 1, 4),
                torch.zeros(1, 2, 1, 4, 4, dtype=torch.int8),
                torch.ones(1, 2, 1, 1, 4),
                torch.zeros(1, 2, 4, 4, dtype=torch.int8),
                torch.ones(1, 2, 4, 1),
                3,
            ),
        ),
        ("8.4", lambda: compress.cache_positions(5, 1, 3)),
        ("8.5", lambda: compress.mla_reconstruct(*mla)),
        ("8.6", lambda: compress.mla_absorbed(*mla)),
        ("8.7", lambda: compress.int8_bytes_per_token(CONFIG)),
        ("8.8", lambda: compress.mla_flops("absorbed", 4, n_heads=2, nope_dim=3, rope_dim=4, v_dim=3, kv_rank=5)),
    ):
        with pytest.raises(ExerciseNotDone, match=f"Exercise {ex_id}"):
            call()
    assert {r.id: r.status for r in run("08")} == {f"8.{i}": "fail" if i == 3 else "todo" for i in range(1, 9)}


# ---------------------------------------------------------------------------------------------
# Equivalences and properties


def test_quantize_error_is_at_most_half_a_step():
    """Check that dequantize(quantize(x)) is within scale/2 of x on both axes, and the largest entry maps to 127."""
    x = torch.randn(2, 3, 40, 16)
    for dim in (-2, -1):
        values, scale = compress.quantize(x, dim)
        assert ((compress.dequantize(values, scale) - x).abs() <= scale / 2 + 1e-6).all()
        assert (values.abs().amax(dim=dim) == 127).all()


def _tiny(n_kv_heads=2, max_seq_len=64):
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=23, d_model=48, n_layers=2, n_heads=6, n_kv_heads=n_kv_heads, hidden_dim=40, max_seq_len=max_seq_len
    )
    return Decoder(config).eval()


def test_int8_cache_decode_is_close_to_float_cache():
    """Check that prefill + decode steps through the Int8KVCache (groups crossing the prompt's end) stay close to float32."""
    model = _tiny()
    ids = torch.randint(0, 23, (2, 19))
    with torch.inference_mode():
        full = model(ids)
        cache = compressed.Int8KVCache(model.config, batch=2, max_seq_len=40, group=8)
        got = [model(ids[:, :13], past_key_values=cache)[0][:, -1]]
        for t in range(13, 19):
            got.append(model(ids[:, t : t + 1], past_key_values=cache)[0][:, -1])
    torch.testing.assert_close(torch.stack(got, 1), full[:, 12:], atol=0.05, rtol=0.05)
    assert cache.k.dtype == torch.int8 and cache.v.dtype == torch.int8 and cache.pos == 19


def test_int8_cache_stores_quantize_on_its_axes():
    """Check that the cache's stored keys are 8.1 per channel over each group and the values per token."""
    cache = compressed.Int8KVCache(CONFIG, batch=2, max_seq_len=12, group=4)
    k, v = torch.randn(2, 2, 6, 8), torch.randn(2, 2, 6, 8)
    cache.update(1, k, v)
    kv, ks = compress.quantize(k[:, :, 4:6], -2)
    assert torch.equal(cache.k[1, :, :, 1, :2], kv) and torch.equal(cache.k_scale[1, :, :, 1], ks)
    vv, vs = compress.quantize(v, -1)
    assert torch.equal(cache.v[1, :, :, :6], vv) and torch.equal(cache.v_scale[1, :, :, :6], vs)


def test_sink_cache_equals_kv_cache_until_it_fills():
    """Check that a SinkCache with room for the whole sequence gives the KVCache's logits at every step."""
    model = _tiny()
    ids = torch.randint(0, 23, (2, 12))
    with torch.inference_mode():
        sink, full = compress.SinkCache(model.config, 2, 10, batch=2), KVCache(model.config, batch=2)
        for a, b in ((0, 5), (5, 6), (6, 7), (7, 12)):
            torch.testing.assert_close(
                model(ids[:, a:b], past_key_values=sink)[0],
                model(ids[:, a:b], past_key_values=full)[0],
            )


def test_sink_attention_equals_attention_over_kept_tokens_at_cache_positions():
    """Check that the decode step after eviction equals attention over [sinks, last window] as a fresh
    sequence at places 0 ... S-1."""
    model = _tiny(n_kv_heads=6)
    attn, n_sink, window = model.layers[0].attn, 2, 4
    x = torch.randn(1, 11, 48)
    cache = compress.SinkCache(model.config, n_sink, window)
    with torch.inference_mode():
        for t in range(11):
            out = cache.attention(attn, x[:, t : t + 1], cache, 0, model.rope_cos, model.rope_sin)
            cache.advance(1)
        kept = torch.cat([x[:, :n_sink], x[:, 11 - window :]], dim=1)  # the tokens the cache holds, oldest first
        expect = attn(kept, model.rope_cos[:6], model.rope_sin[:6])[:, -1:]  # the last one's output, places 0..5
    torch.testing.assert_close(out, expect)


def test_mla_two_ways_agree_in_float64_and_float32():
    """Check that mla_absorbed equals mla_reconstruct, to 1e-12 in float64 and to float32's tolerance."""
    g = torch.Generator().manual_seed(0)
    args = [
        torch.randn(*s, generator=g, dtype=torch.float64)
        for s in ((2, 4, 3, 16), (2, 4, 3, 8), (2, 9, 24), (2, 9, 8), (4, 16, 24), (4, 12, 24))
    ]
    torch.testing.assert_close(compress.mla_absorbed(*args), compress.mla_reconstruct(*args), atol=1e-12, rtol=1e-12)
    args = [a.float() for a in args]
    torch.testing.assert_close(compress.mla_absorbed(*args), compress.mla_reconstruct(*args))


def test_bad_inputs_name_the_problem():
    """Check that wrong shapes and types get a ValueError naming the argument."""
    with pytest.raises(ValueError, match="floating-point"):
        compress.quantize(torch.zeros(3, dtype=torch.long), 0)
    with pytest.raises(ValueError, match="dim"):
        compress.quantize(torch.zeros(3, 4), 2)
    with pytest.raises(ValueError, match="k_scale"):
        compress.int8_attention(
            torch.zeros(1, 2, 1, 4),
            torch.zeros(1, 2, 1, 4, 4, dtype=torch.int8),
            torch.ones(1, 2, 4, 4),
            torch.zeros(1, 2, 4, 4, dtype=torch.int8),
            torch.ones(1, 2, 4, 1),
            3,
        )
    with pytest.raises(ValueError, match="kv_len"):
        compress.int8_attention(
            torch.zeros(1, 2, 1, 4),
            torch.zeros(1, 2, 1, 4, 4, dtype=torch.int8),
            torch.ones(1, 2, 1, 1, 4),
            torch.zeros(1, 2, 4, 4, dtype=torch.int8),
            torch.ones(1, 2, 4, 1),
            5,
        )
    cache = compress.SinkCache(CONFIG, 1, 3)
    with pytest.raises(ValueError, match="one at a time"):
        cache.update(0, torch.zeros(1, 2, 5, 8), torch.zeros(1, 2, 5, 8))
    with pytest.raises(ValueError, match="n_sink"):
        compress.cache_positions(4, -1, 3)
    with pytest.raises(ValueError, match="w_uk"):
        compress.mla_absorbed(
            torch.zeros(1, 2, 1, 3),
            torch.zeros(1, 2, 1, 4),
            torch.zeros(1, 2, 5),
            torch.zeros(1, 2, 4),
            torch.zeros(2, 5, 3),
            torch.zeros(2, 3, 5),
        )


# ---------------------------------------------------------------------------------------------
# Other correct ways pass every check; likely slips fail, with their names


def _module(**replaced) -> types.SimpleNamespace:
    return handed_in(compress, NAMES, **replaced)


def _messages(ex_id: str, **replaced) -> list[str]:
    """The failure messages of the exercise's failing checks; a crash in the code under test is a failure too."""
    return [
        (str(err) or "assertion") if isinstance(err, AssertionError) else f"{type(err).__name__}: {err}"
        for _, err in check_failures(ex_id, _module(**replaced))
    ]


def quantize_multiply(x, dim):  # multiply by 127 / max instead of dividing by max / 127
    amax = x.float().abs().amax(dim=dim, keepdim=True)
    safe = torch.where(amax > 0, amax, torch.full_like(amax, 127.0))
    return torch.round(x.float() * (127 / safe)).to(torch.int8), safe / 127


def quantize_moved_axis(x, dim):  # the shared axis moved last, quantised row by row, moved back
    y = x.float().movedim(dim, -1)
    scale = y.abs().max(dim=-1, keepdim=True).values / 127
    scale[scale == 0] = 1
    return (y / scale).round().to(torch.int8).movedim(-1, dim), scale.movedim(-1, dim)


def quantize_float64(x, dim):
    scale = x.double().abs().amax(dim=dim, keepdim=True) / 127
    scale = scale.masked_fill(scale == 0, 1.0)
    return torch.clamp(torch.round(x.double() / scale), -127, 127).to(torch.int8), scale.float()


def quantize_tiny_scale_on_zeros(x, dim):  # an all-zero slice given the smallest positive scale, not 1
    scale = x.float().abs().amax(dim=dim, keepdim=True) / 127
    scale = scale.clamp(min=torch.finfo(torch.float32).tiny)
    return (x.float() / scale).round().clamp(-127, 127).to(torch.int8), scale


def quantize_transposed(x, dim):  # the slice's axis taken for the shared one
    other = -1 if dim % x.dim() == x.dim() - 2 else -2
    return compress.quantize(x, other)


def quantize_truncate(x, dim):
    scale = x.float().abs().amax(dim=dim, keepdim=True) / 127
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return (x.float() / scale).to(torch.int8), scale


def quantize_255(x, dim):
    scale = x.float().abs().amax(dim=dim, keepdim=True) / 255
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return (x.float() / scale).round().clamp(-127, 127).to(torch.int8), scale


def quantize_nan_on_zeros(x, dim):
    scale = x.float().abs().amax(dim=dim, keepdim=True) / 127
    return (x.float() / scale).nan_to_num(0).round().to(torch.int8), scale


def _dequantised(k_values, k_scale, v_values, v_scale, kv_len):
    B, H_kv, n_groups, group, D = k_values.shape
    k = (k_values.float() * k_scale).reshape(B, H_kv, -1, D)[:, :, :kv_len]
    return k, v_values[:, :, :kv_len].float() * v_scale[:, :, :kv_len]


def int8_fold_scales(
    q, k_values, k_scale, v_values, v_scale, kv_len
):  # scales folded into q and probs, loop over groups
    B, H, T, D = q.shape
    H_kv, n_groups, group = k_values.shape[1:4]
    G = H // H_kv
    qg = q.reshape(B, H_kv, G * T, D)
    scores = torch.cat(
        [
            (qg[:, :, None] * k_scale[:, :, g : g + 1]).squeeze(2) @ k_values[:, :, g].float().transpose(-2, -1)
            for g in range(n_groups)
        ],
        dim=-1,
    )[..., :kv_len] / math.sqrt(D)  # (B, H_kv, G*T, S)
    if T > 1:
        scores = scores.masked_fill(~causal_mask_tensor(T, kv_len).repeat(G, 1), float("-inf"))
    probs = scores.softmax(-1) * v_scale[:, :, :kv_len].transpose(-2, -1)  # per-token value scale onto the weights
    return (probs @ v_values[:, :, :kv_len].float()).reshape(B, H, T, D)


def int8_einsum(q, k_values, k_scale, v_values, v_scale, kv_len):
    k, v = _dequantised(k_values, k_scale, v_values, v_scale, kv_len)
    B, H, T, D = q.shape
    G = H // k.shape[1]
    scores = torch.einsum("bhgtd,bhsd->bhgts", q.reshape(B, -1, G, T, D), k) / D**0.5
    scores = scores.masked_fill(~causal_mask_tensor(T, kv_len), float("-inf"))
    return torch.einsum("bhgts,bhsd->bhgtd", scores.softmax(-1), v).reshape(B, H, T, D)


def int8_repeat(q, k_values, k_scale, v_values, v_scale, kv_len):
    k, v = _dequantised(k_values, k_scale, v_values, v_scale, kv_len)
    G = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(
        q, k.repeat_interleave(G, 1), v.repeat_interleave(G, 1), attn_mask=causal_mask_tensor(q.shape[2], kv_len)
    )


def int8_no_scales(q, k_values, k_scale, v_values, v_scale, kv_len):
    return int8_repeat(q, k_values, torch.ones_like(k_scale), v_values, torch.ones_like(v_scale), kv_len)


def int8_all_slots(q, k_values, k_scale, v_values, v_scale, kv_len):  # attends to every stored slot
    S = min(k_values.shape[2] * k_values.shape[3], v_values.shape[2])
    return (
        int8_repeat(q, k_values, k_scale, v_values, v_scale, S)
        if q.shape[2] == 1
        else int8_repeat(q, k_values, k_scale, v_values, v_scale, kv_len)
    )


def int8_top_left(q, k_values, k_scale, v_values, v_scale, kv_len):
    k, v = _dequantised(k_values, k_scale, v_values, v_scale, kv_len)
    return F.scaled_dot_product_attention(q, k, v, is_causal=q.shape[2] > 1, enable_gqa=True)


class SinkTensorSlots(compress.SinkCache):  # slots as a LongTensor, index_copy_
    def update(self, layer, k_new, v_new):
        p = torch.arange(self.pos, self.pos + k_new.shape[2])
        slots = torch.where(p < self.n_sink, p, self.n_sink + (p - self.n_sink) % self.window)
        self.k[layer].index_copy_(2, slots, k_new)
        self.v[layer].index_copy_(2, slots, v_new)
        n = min(self.pos + k_new.shape[2], self.capacity)
        return self.k[layer, :, :, :n], self.v[layer, :, :, :n]


class SinkLoop(compress.SinkCache):  # one token at a time
    def update(self, layer, k_new, v_new):
        for i in range(k_new.shape[2]):
            p = self.pos + i
            s = p if p < self.n_sink else self.n_sink + (p - self.n_sink) % self.window
            self.k[layer, :, :, s], self.v[layer, :, :, s] = k_new[:, :, i], v_new[:, :, i]
        n = min(self.pos + k_new.shape[2], self.capacity)
        return self.k[layer, :, :, :n], self.v[layer, :, :, :n]


class SinkBranch(compress.SinkCache):  # a prefill slice while there is room, else the ring slot
    def update(self, layer, k_new, v_new):
        T = k_new.shape[2]
        if self.pos + T <= self.capacity:
            self.k[layer, :, :, self.pos : self.pos + T], self.v[layer, :, :, self.pos : self.pos + T] = k_new, v_new
            return self.k[layer, :, :, : self.pos + T], self.v[layer, :, :, : self.pos + T]
        s = self.n_sink + (self.pos - self.n_sink) % self.window
        self.k[layer, :, :, s : s + 1], self.v[layer, :, :, s : s + 1] = k_new, v_new
        return self.k[layer], self.v[layer]


class SinkOverSinks(compress.SinkCache):
    def update(self, layer, k_new, v_new):
        slots = [p % self.capacity for p in range(self.pos, self.pos + k_new.shape[2])]
        self.k[layer, :, :, slots], self.v[layer, :, :, slots] = k_new, v_new
        n = min(self.pos + k_new.shape[2], self.capacity)
        return self.k[layer, :, :, :n], self.v[layer, :, :, :n]


class SinkRingOffByOne(compress.SinkCache):  # the first token past the sinks lands in the ring's last slot
    def update(self, layer, k_new, v_new):
        slots = [
            p if p < self.n_sink else self.n_sink + (p - self.n_sink - 1) % self.window
            for p in range(self.pos, self.pos + k_new.shape[2])
        ]
        self.k[layer, :, :, slots], self.v[layer, :, :, slots] = k_new, v_new
        n = min(self.pos + k_new.shape[2], self.capacity)
        return self.k[layer, :, :, :n], self.v[layer, :, :, :n]


def positions_oldest_off_by_one(n_seen, n_sink, window):
    if n_seen <= n_sink + window:
        return torch.arange(n_seen)
    oldest = (n_seen - window - n_sink + 1) % window  # one slot past the oldest kept token
    return torch.cat([torch.arange(n_sink), n_sink + (torch.arange(window) - oldest) % window])


class SinkAdvances(compress.SinkCache):  # moves pos itself
    def update(self, layer, k_new, v_new):
        out = compress.SinkCache.update(self, layer, k_new, v_new)
        self.pos += k_new.shape[2]
        return out


class SinkWholeBuffer(compress.SinkCache):  # returns every slot, filled or not
    def update(self, layer, k_new, v_new):
        compress.SinkCache.update(self, layer, k_new, v_new)
        return self.k[layer], self.v[layer]


def positions_loop(n_seen, n_sink, window):  # simulate the ring, then rank by age
    held = {}
    for p in range(n_seen):
        held[p if p < n_sink else n_sink + (p - n_sink) % window] = p
    order = sorted(held.values())
    return torch.tensor([order.index(held[s]) for s in range(len(held))])


def positions_argsort(n_seen, n_sink, window):  # the text positions of the slots, ranked
    capacity = n_sink + window
    if n_seen <= capacity:
        return torch.arange(n_seen)
    text = torch.tensor([p for p in range(n_seen - window, n_seen)])
    slots = n_sink + (text - n_sink) % window
    held = torch.empty(capacity, dtype=torch.long)
    held[:n_sink], held[slots] = torch.arange(n_sink), text
    return held.argsort().argsort()


def positions_roll(n_seen, n_sink, window):
    if n_seen <= n_sink + window:
        return torch.arange(n_seen)
    shift = (n_seen - n_sink) % window  # the ring is its age order rolled by this many slots
    return torch.cat([torch.arange(n_sink), torch.roll(torch.arange(n_sink, n_sink + window), shift)])


def positions_text(n_seen, n_sink, window):
    held = {}
    for p in range(n_seen):
        held[p if p < n_sink else n_sink + (p - n_sink) % window] = p
    return torch.tensor([held[s] for s in range(len(held))])


def positions_slot_order(n_seen, n_sink, window):
    return torch.arange(min(n_seen, n_sink + window))


def positions_reversed(n_seen, n_sink, window):  # newest first
    p = positions_loop(n_seen, n_sink, window)
    return torch.where(p < n_sink, p, n_sink + window - 1 - (p - n_sink)) if n_seen > n_sink + window else p


def _mla_keys(latent, k_rope, w_uk, H):
    return torch.einsum("bsr,hdr->bhsd", latent, w_uk), k_rope[:, None].expand(-1, H, -1, -1)


def mla_concat_sdpa(q_nope, q_rope, latent, k_rope, w_uk, w_uv):  # [nope, rope] keys, SDPA's default scale
    k_nope, k_r = _mla_keys(latent, k_rope, w_uk, w_uk.shape[0])
    v = torch.einsum("bsr,hdr->bhsd", latent, w_uv)
    T, S = q_nope.shape[2], latent.shape[1]
    return F.scaled_dot_product_attention(
        torch.cat([q_nope, q_rope], -1), torch.cat([k_nope, k_r], -1), v, attn_mask=causal_mask_tensor(T, S)
    )


def mla_per_head(q_nope, q_rope, latent, k_rope, w_uk, w_uv):  # one head at a time, nn.functional.linear
    outs = []
    T, S = q_nope.shape[2], latent.shape[1]
    for h in range(w_uk.shape[0]):
        k, v = F.linear(latent, w_uk[h]), F.linear(latent, w_uv[h])  # (B, S, Dn), (B, S, Dv)
        scores = (q_nope[:, h] @ k.transpose(-2, -1) + q_rope[:, h] @ k_rope.transpose(-2, -1)) / math.sqrt(
            q_nope.shape[-1] + q_rope.shape[-1]
        )
        scores = scores.masked_fill(~causal_mask_tensor(T, S), float("-inf"))
        outs.append(scores.softmax(-1) @ v)
    return torch.stack(outs, 1)


def mla_float64(*args):
    return compress.mla_reconstruct(*(a.double() for a in args)).float()


def mla_no_rope(q_nope, q_rope, latent, k_rope, w_uk, w_uv):
    return mla_concat_sdpa(q_nope, torch.zeros_like(q_rope), latent, torch.zeros_like(k_rope), w_uk, w_uv)


def mla_nope_scale(q_nope, q_rope, latent, k_rope, w_uk, w_uv):
    k_nope, k_r = _mla_keys(latent, k_rope, w_uk, w_uk.shape[0])
    v = torch.einsum("bsr,hdr->bhsd", latent, w_uv)
    return F.scaled_dot_product_attention(
        torch.cat([q_nope, q_rope], -1),
        torch.cat([k_nope, k_r], -1),
        v,
        attn_mask=causal_mask_tensor(q_nope.shape[2], latent.shape[1]),
        scale=q_nope.shape[-1] ** -0.5,
    )


def mla_top_left(q_nope, q_rope, latent, k_rope, w_uk, w_uv):
    k_nope, k_r = _mla_keys(latent, k_rope, w_uk, w_uk.shape[0])
    v = torch.einsum("bsr,hdr->bhsd", latent, w_uv)
    return F.scaled_dot_product_attention(
        torch.cat([q_nope, q_rope], -1), torch.cat([k_nope, k_r], -1), v, is_causal=q_nope.shape[2] > 1
    )


def absorbed_matmul(
    q_nope, q_rope, latent, k_rope, w_uk, w_uv
):  # absorbed, with q_latent as (B, H, T, r) and bmm per batch
    q_latent = (q_nope.transpose(0, 1) @ w_uk[:, None]).transpose(0, 1)  # (H, B, T, Dn) @ (H, 1, Dn, r)
    scores = torch.stack([q_latent[b].flatten(0, 1) @ latent[b].T for b in range(latent.shape[0])]).view(
        *q_latent.shape[:3], -1
    )
    scores = scores + torch.stack([q_rope[b].flatten(0, 1) @ k_rope[b].T for b in range(latent.shape[0])]).view(
        *q_latent.shape[:3], -1
    )
    scores = scores / math.sqrt(q_nope.shape[-1] + q_rope.shape[-1])
    scores = scores.masked_fill(~causal_mask_tensor(q_nope.shape[2], latent.shape[1]), float("-inf"))
    probs = scores.softmax(-1)
    out = torch.stack([probs[b].flatten(0, 1) @ latent[b] for b in range(latent.shape[0])]).view(
        *q_latent.shape[:3], -1
    )
    return (out.transpose(0, 1) @ w_uv.transpose(-2, -1)[:, None]).transpose(0, 1)


def absorbed_folded_rope(q_nope, q_rope, latent, k_rope, w_uk, w_uv):  # one einsum over [latent, k_rope] concatenated
    q_cat = torch.cat([torch.einsum("bhtd,hdr->bhtr", q_nope, w_uk), q_rope], -1)  # (B, H, T, r + Dr)
    kv_cat = torch.cat([latent, k_rope], -1)  # (B, S, r + Dr): exactly what the cache holds
    scores = torch.einsum("bhtc,bsc->bhts", q_cat, kv_cat) / math.sqrt(q_nope.shape[-1] + q_rope.shape[-1])
    scores = scores.masked_fill(~causal_mask_tensor(q_nope.shape[2], latent.shape[1]), float("-inf"))
    return torch.einsum("bhts,bsr,hdr->bhtd", scores.softmax(-1), latent, w_uv)


def absorbed_float64(*args):
    return compress.mla_absorbed(*(a.double() for a in args)).float()


def absorbed_is_reconstruct(*args):  # right answer, but it rebuilds every head's keys
    return compress.mla_reconstruct(*args)


def absorbed_broadcast(q_nope, q_rope, latent, k_rope, w_uk, w_uv):  # a broadcasting matmul copies the latents per head
    q_latent = torch.einsum("bhtd,hdr->bhtr", q_nope, w_uk)
    scores = (q_latent @ latent[:, None].transpose(-2, -1) + q_rope @ k_rope[:, None].transpose(-2, -1)) / math.sqrt(
        q_nope.shape[-1] + q_rope.shape[-1]
    )
    scores = scores.masked_fill(~causal_mask_tensor(q_nope.shape[2], latent.shape[1]), float("-inf"))
    return torch.einsum(
        "bhtr,hdr->bhtd", scores.softmax(-1) @ latent[:, None].expand(-1, w_uk.shape[0], -1, -1).contiguous(), w_uv
    )


def absorbed_no_rope(q_nope, q_rope, latent, k_rope, w_uk, w_uv):
    return compress.mla_absorbed(q_nope, torch.zeros_like(q_rope), latent, k_rope, w_uk, w_uv)


def int8_bytes_loop(config, group=32, scale_bytes=4):  # layer by layer, head by head, in bits then back to bytes
    bits = 0
    for _ in range(config.n_layers):
        for _ in range(config.n_kv_heads):
            bits += 8 * (2 * config.head_dim) + 8 * scale_bytes * (config.head_dim / group + 1)
    return bits / 8


def int8_bytes_measured(config, group=32, scale_bytes=4):  # measured, not predicted: two caches a group apart
    sizes = []
    for groups in (1, 2):
        cache = compressed.Int8KVCache(replace(config, max_seq_len=group * groups), group=group)
        scales = sum(getattr(cache, n).nbytes for n in ("k_scale", "v_scale")) * scale_bytes // 4  # float32 -> width
        sizes.append(cache.k.nbytes + cache.v.nbytes + scales)
    return (sizes[1] - sizes[0]) / group


def int8_bytes_fraction(config, group=32, scale_bytes=4):  # exact arithmetic, one term per stored tensor
    from fractions import Fraction

    per_head = 2 * config.head_dim + Fraction(config.head_dim * scale_bytes, group) + scale_bytes
    return float(config.n_layers * config.n_kv_heads * per_head)


def int8_bytes_no_scales(config, group=32, scale_bytes=4):
    return float(config.n_layers * config.n_kv_heads * 2 * config.head_dim)


def int8_bytes_key_scale_per_token(config, group=32, scale_bytes=4):
    return float(
        config.n_layers * config.n_kv_heads * (2 * config.head_dim + config.head_dim * scale_bytes + scale_bytes)
    )


def int8_bytes_bits(config, group=32, scale_bytes=4):
    return (
        8 * int8_bytes_no_scales(config)
        + compress.int8_bytes_per_token(config, group, scale_bytes)
        - int8_bytes_no_scales(config)
    )


def int8_bytes_all_bits(config, group=32, scale_bytes=4):  # every byte counted as 8 bits
    return 8 * compress.int8_bytes_per_token(config, group, scale_bytes)


def int8_bytes_query_heads(config, group=32, scale_bytes=4):
    return compress.int8_bytes_per_token(replace(config, n_kv_heads=config.n_heads), group, scale_bytes)


def int8_bytes_one_layer(config, group=32, scale_bytes=4):
    return compress.int8_bytes_per_token(config, group, scale_bytes) / config.n_layers


def _mla_products(path, S, T, H, Dn, Dr, Dv, r):
    """(m, k, n, times) of every matrix product of a path, for the alternatives and slips below."""
    if path == "reconstruct":
        return [(S, r, Dn, H), (S, r, Dv, H), (T, Dn, S, H), (T, Dr, S, H), (T, S, Dv, H)]
    return [(T, Dn, r, H), (T, r, S, H), (T, Dr, S, H), (T, S, r, H), (T, r, Dv, H)]


def _mla_sizes(sizes):
    return sizes["n_heads"], sizes["nope_dim"], sizes["rope_dim"], sizes["v_dim"], sizes["kv_rank"]


def mla_flops_products(path, kv_len, new_tokens=1, **sizes):  # 2 m k n for each product, per head
    H, Dn, Dr, Dv, r = _mla_sizes(sizes)
    return sum(2 * m * k * n * times for m, k, n, times in _mla_products(path, kv_len, new_tokens, H, Dn, Dr, Dv, r))


def mla_flops_numpy(path, kv_len, new_tokens=1, **sizes):  # an int64 from numpy, as a learner's array sum gives
    H, Dn, Dr, Dv, r = _mla_sizes(sizes)
    shapes = np.array(_mla_products(path, kv_len, new_tokens, H, Dn, Dr, Dv, r), dtype=np.int64)
    return np.prod(shapes, axis=1).sum() * 2


def mla_flops_meta(path, kv_len, new_tokens=1, **sizes):  # counted: the reference paths on meta tensors, no memory
    from torch.utils.flop_counter import FlopCounterMode

    H, Dn, Dr, Dv, r = _mla_sizes(sizes)
    shapes = ((1, H, new_tokens, Dn), (1, H, new_tokens, Dr), (1, kv_len, r), (1, kv_len, Dr), (H, Dn, r), (H, Dv, r))
    args = [torch.empty(s, device="meta") for s in shapes]
    fn = compress.mla_reconstruct if path == "reconstruct" else compress.mla_absorbed
    with FlopCounterMode(display=False) as counter:
        fn(*args)
    return counter.get_total_flops()


def mla_flops_half(path, kv_len, new_tokens=1, **sizes):
    return compress.mla_flops(path, kv_len, new_tokens, **sizes) // 2


def mla_flops_no_rope(path, kv_len, new_tokens=1, **sizes):
    return (
        compress.mla_flops(path, kv_len, new_tokens, **sizes)
        - 2 * sizes["n_heads"] * new_tokens * kv_len * sizes["rope_dim"]
    )


def mla_flops_rebuild_per_query(path, kv_len, new_tokens=1, **sizes):
    H, Dn, Dr, Dv, r = _mla_sizes(sizes)
    extra = (new_tokens - 1) * 2 * kv_len * r * H * (Dn + Dv) if path == "reconstruct" else 0
    return compress.mla_flops(path, kv_len, new_tokens, **sizes) + extra


def mla_flops_causal_half(path, kv_len, new_tokens=1, **sizes):
    H, Dn, Dr, Dv, r = _mla_sizes(sizes)
    width = Dn + Dr + Dv if path == "reconstruct" else 2 * r + Dr  # the (T, S) products' summed widths
    masked = new_tokens * (new_tokens - 1) // 2
    return compress.mla_flops(path, kv_len, new_tokens, **sizes) - 2 * H * masked * width


def mla_flops_swapped(path, kv_len, new_tokens=1, **sizes):
    other = "absorbed" if path == "reconstruct" else "reconstruct"
    return compress.mla_flops(other, kv_len, new_tokens, **sizes)


ALTERNATIVES = [
    ("8.1", {"quantize": quantize_multiply}),
    ("8.1", {"quantize": quantize_moved_axis}),
    ("8.1", {"quantize": quantize_float64}),
    ("8.1", {"quantize": quantize_tiny_scale_on_zeros}),
    ("8.2", {"int8_attention": int8_fold_scales}),
    ("8.2", {"int8_attention": int8_einsum}),
    ("8.2", {"int8_attention": int8_repeat}),
    ("8.3", {"SinkCache": SinkTensorSlots}),
    ("8.3", {"SinkCache": SinkLoop}),
    ("8.3", {"SinkCache": SinkBranch}),
    ("8.4", {"cache_positions": positions_loop}),
    ("8.4", {"cache_positions": positions_argsort}),
    ("8.4", {"cache_positions": positions_roll}),
    ("8.5", {"mla_reconstruct": mla_concat_sdpa}),
    ("8.5", {"mla_reconstruct": mla_per_head}),
    ("8.5", {"mla_reconstruct": mla_float64}),
    ("8.6", {"mla_absorbed": absorbed_matmul}),
    ("8.6", {"mla_absorbed": absorbed_folded_rope}),
    ("8.6", {"mla_absorbed": absorbed_float64}),
    ("8.7", {"int8_bytes_per_token": int8_bytes_loop}),
    ("8.7", {"int8_bytes_per_token": int8_bytes_fraction}),
    ("8.8", {"mla_flops": mla_flops_products}),
    ("8.8", {"mla_flops": mla_flops_numpy}),
    ("8.8", {"mla_flops": mla_flops_meta}),
]


@pytest.mark.parametrize("ex_id, replaced", ALTERNATIVES, ids=case_ids(ALTERNATIVES))
def test_alternative_passes_every_check(ex_id, replaced):
    """Check that a correct implementation written another way passes every check of its exercise."""
    failures = _messages(ex_id, **replaced)
    assert not failures, failures


SLIPS = [  # (exercise, replaced function, words a failure must contain)
    ("8.1", {"quantize": quantize_transposed}, "wrong axis"),
    ("8.1", {"quantize": quantize_truncate}, "truncated toward zero"),
    ("8.1", {"quantize": quantize_255}, "255"),
    ("8.1", {"quantize": quantize_nan_on_zeros}, "numbers are all zero"),
    ("8.2", {"int8_attention": int8_no_scales}, "without their scales"),
    ("8.2", {"int8_attention": int8_all_slots}, "past kv_len"),
    ("8.2", {"int8_attention": int8_top_left}, "top-left"),
    ("8.3", {"SinkCache": SinkOverSinks}, "sink token(s) [0] are gone from the cache"),
    ("8.3", {"SinkCache": SinkAdvances}, "moved pos"),
    ("8.3", {"SinkCache": SinkWholeBuffer}, "filled slots"),
    ("8.4", {"cache_positions": positions_text}, "positions in the text"),
    ("8.4", {"cache_positions": positions_slot_order}, "slot order"),
    ("8.4", {"cache_positions": positions_reversed}, "by age, oldest first"),
    ("8.5", {"mla_reconstruct": mla_no_rope}, "rotary part is left out"),
    ("8.5", {"mla_reconstruct": mla_nope_scale}, "nope part only"),
    ("8.5", {"mla_reconstruct": mla_top_left}, "top-left"),
    ("8.6", {"mla_absorbed": absorbed_is_reconstruct}, "per-head keys or values"),
    ("8.6", {"mla_absorbed": absorbed_broadcast}, "per-head keys or values"),
    ("8.6", {"mla_absorbed": absorbed_no_rope}, "rotary part is left out"),
    ("8.3", {"SinkCache": SinkRingOffByOne}, "hold none of the tokens written"),
    ("8.4", {"cache_positions": positions_oldest_off_by_one}, "count from the oldest kept token's slot"),
    ("8.7", {"int8_bytes_per_token": int8_bytes_no_scales}, "scales are left out"),
    ("8.7", {"int8_bytes_per_token": int8_bytes_key_scale_per_token}, "shared by a whole group"),
    ("8.7", {"int8_bytes_per_token": int8_bytes_bits}, "bits, not bytes"),
    ("8.7", {"int8_bytes_per_token": int8_bytes_all_bits}, "counted in bits (8 per byte)"),
    ("8.7", {"int8_bytes_per_token": int8_bytes_query_heads}, "query heads are counted"),
    ("8.7", {"int8_bytes_per_token": int8_bytes_one_layer}, "one layer only"),
    ("8.8", {"mla_flops": mla_flops_half}, "2 FLOPs per multiply-add"),
    ("8.8", {"mla_flops": mla_flops_no_rope}, "rotary scores are missing"),
    ("8.8", {"mla_flops": mla_flops_rebuild_per_query}, "once per query"),
    ("8.8", {"mla_flops": mla_flops_causal_half}, "causal half"),
    ("8.8", {"mla_flops": mla_flops_swapped}, "path's count"),
]


SHIPPED_8_3 = {  # check -> the symptom its failure shows for the SinkCache.update 8.3 ships (the stub's own body)
    "sink_cache_keeps_sinks_and_last_window": "after 6 tokens (n_sink=2, window=3) the slots hold tokens [5, 1, 2, 3, 4], "
    "expected [0, 1, 5, 3, 4]: sink token(s) [0] are gone from the cache, though sinks never leave",
}


def test_the_sink_cache_8_3_ships_fails_its_checks_showing_the_symptom():
    """Check that the learner stub's SinkCache.update (8.3 is find-and-fix: the stub ships a ring of capacity slots
    that wraps over the sinks) fails 8.3's checks with the symptom (the slots' tokens, a sink gone), never the cause's
    fix (the ring's slot rule), and that a cache without sinks, where the bug changes nothing, passes."""
    shipped = compress.SinkCache.update.__wrapped__  # the stub's body, not the reference this mode would call
    assert "p % self.capacity" in inspect.getsource(shipped)

    class Shipped(compress.SinkCache):
        update = shipped

    failures = dict(check_failures("8.3", _module(SinkCache=Shipped)))
    assert set(failures) == set(SHIPPED_8_3), failures
    for name, words in SHIPPED_8_3.items():
        assert isinstance(failures[name], AssertionError) and words in str(failures[name]), (name, failures[name])
        assert "%" not in str(failures[name]) and "n_sink +" not in str(failures[name]), failures[name]


@pytest.mark.parametrize("ex_id, replaced, words", SLIPS, ids=case_ids(SLIPS))
def test_slip_is_rejected_naming_it(ex_id, replaced, words):
    """Check that a likely slip fails its exercise's checks with a message naming it."""
    failures = _messages(ex_id, **replaced)
    assert failures, f"{next(iter(replaced.values())).__name__} passed every check of {ex_id}"
    assert any(words in m for m in failures), failures


# ---------------------------------------------------------------------------------------------
# Bytes, FLOPs and the benchmark's report


def test_bytes_per_token_match_published_figures():
    """Check that bytes per token match the published figures: Llama-3-8B's 128 KiB in 16-bit, int8 at about
    half, and DeepSeek-V2's 576 numbers per layer."""
    from kvlib.core.configs import MLA_MODELS, REAL_MODELS

    llama = REAL_MODELS["Llama-3-8B"].config
    assert bench_compress.bytes_per_token_layer("gqa", llama) * llama.n_layers == 128 * 1024
    assert bench_compress.bytes_per_token_layer("mha", llama) * llama.n_layers == 512 * 1024
    int8 = bench_compress.bytes_per_token_layer("int8", llama)
    assert (
        int8 == 2 * 8 * 128 + 8 * 128 * 2 / 32 + 8 * 2
    )  # 8-bit keys and values, a key scale per 32 tokens, a value scale per token
    v2 = MLA_MODELS["DeepSeek-V2"]
    assert bench_compress.bytes_per_token_layer("mla", mla=v2, bytes_per_number=1) == 576


def test_mla_saving_against_deepseek_67b_is_the_papers_93_percent():
    """Check that MLA saves DeepSeek-V2's "93.3% less KV cache" against DeepSeek 67B: latents at ~6 bits
    against 67B's GQA in 16-bit."""
    from kvlib.core.configs import DEEPSEEK_67B, MLA_MODELS

    v2, old = MLA_MODELS["DeepSeek-V2"], DEEPSEEK_67B.config
    v2_bits = v2.n_layers * (v2.kv_rank + v2.rope_dim) * 6
    old_bits = bench_compress.bytes_per_token_layer("gqa", old) * old.n_layers * 8
    assert round(1 - v2_bits / old_bits, 3) == 0.933


def test_window_cache_never_outweighs_small_windows():
    """Check that a window's cache stops growing at the window and so may never outweigh the weights."""
    assert bench_compress.cache_bytes(10, 2, 1000, window=100) == 10 * 2 * 100
    assert bench_compress.outweighs_at(10, 2, 1e6, window=100) is None
    assert bench_compress.outweighs_at(10, 2, 1e6) == 50_000


def test_mla_flop_formula_matches_torch_flop_counter():
    """Check that mla_step_cost's FLOPs equal torch.utils.flop_counter's on the reference 8.5 and 8.6, decode and prefill."""
    for new_tokens in (1, 8):
        for path, counts in bench_compress.mla_counted_flops(new_tokens=new_tokens).items():
            assert counts["counted"] == counts["formula"], (path, new_tokens, counts)


def test_mla_prefill_rebuilds_while_decode_absorbs():
    """Check that for DeepSeek-V2 at 8k tokens absorbing is cheaper for one new token and dearer for a prefill."""
    from kvlib.core.configs import MLA_MODELS

    m = MLA_MODELS["DeepSeek-V2"]
    flops = {
        (T, p): bench_compress.mla_step_cost(m, 8192, p, new_tokens=T)["flops"]
        for T in (1, 8192)
        for p in ("reconstruct", "absorbed")
    }
    assert flops[1, "absorbed"] < flops[1, "reconstruct"] and flops[8192, "reconstruct"] < flops[8192, "absorbed"]


def test_ordering_quiz_has_no_tie_at_its_default():
    """Check that the six schemes of the ordering quiz differ by more than 10% at its default context and window."""
    import inspect

    from kvlib.core.configs import MLA_MODELS, REAL_MODELS

    defaults = inspect.signature(bench_compress.schemes_per_layer).parameters
    sizes = sorted(
        bench_compress.schemes_per_layer(
            REAL_MODELS["Llama-3-8B"].config,
            MLA_MODELS["DeepSeek-V2"],
            defaults["context"].default,
            defaults["window"].default,
        ).values()
    )
    assert all(b > 1.1 * a for a, b in zip(sizes, sizes[1:])), sizes


@pytest.mark.parametrize("bits", [8, 4, 2])
@pytest.mark.parametrize("dim", [-2, -1])
def test_fake_quantize_uses_2_to_the_bits_levels_per_slice(bits, dim):
    """Check that fake_quantize keeps each slice's min and max, at most 2**bits values, errors within half a step."""
    from kvlib.study.compress_quality import fake_quantize

    x = torch.randn(2, 3, 37, 8, dtype=torch.float64)  # 37 tokens: two groups of 16 and a short one
    got = fake_quantize(x, dim, bits, group=16)
    slices = [x[..., t : t + 16, :] for t in range(0, 37, 16)] if dim == -2 else [x]
    outs = [got[..., t : t + 16, :] for t in range(0, 37, 16)] if dim == -2 else [got]
    for a, q in zip(slices, outs):
        lo, hi = a.amin(dim, keepdim=True), a.amax(dim, keepdim=True)
        torch.testing.assert_close(q.amin(dim, keepdim=True), lo)
        torch.testing.assert_close(q.amax(dim, keepdim=True), hi)
        assert ((q - a).abs() <= (hi - lo) / (2**bits - 1) / 2 + 1e-9).all()
        levels = ((q - lo) / ((hi - lo) / (2**bits - 1))).round()
        assert int(levels.max()) <= 2**bits - 1 and int(levels.min()) >= 0


def test_key_axis_study_reports_both_axes_at_every_width():
    """Check that the key-axis study gives an error per axis and bit width, growing as bits fall, on a tiny run."""
    from kvlib.core.weights import load_tiny
    from kvlib.study import compress_quality

    model, tokenizer = load_tiny()
    study = compress_quality.key_axis_study(model, tokenizer, bits=(8, 2), n_rows=1, seq_len=40)
    for errors in (study["key_error"], study["output_error"]):
        assert set(errors) == {"per channel", "per token"}
        assert all(0 < e8 < e2 for e8, e2 in errors.values())


def test_window_as_large_as_every_question_answers_as_the_full_cache():
    """Check that a rolling window longer than every prompt gives the full cache's capital answers (nothing evicted)."""
    from kvlib.core.weights import load_tiny
    from kvlib.study import compress_quality

    model, tokenizer = load_tiny()
    study = compress_quality.window_accuracy(model, tokenizer, capacities=(128,), stride=240)
    assert study["prompts"] >= 3 and study["prompt_tokens"]["max"] < 128
    assert study["accuracy"]["window 128"] == study["accuracy"]["full cache"]
    assert study["accuracy"]["4 sinks + window 124"] == study["accuracy"]["full cache"]


def test_mla_absorbed_moves_fewer_bytes_and_flops_than_reconstructing():
    """Check that at 8k tokens the absorbed path needs >50x fewer FLOPs and >10x fewer bytes for DeepSeek-V2."""
    from kvlib.core.configs import MLA_MODELS

    m = MLA_MODELS["DeepSeek-V2"]
    rebuild, absorbed = (bench_compress.mla_step_cost(m, 8192, p) for p in ("reconstruct", "absorbed"))
    assert rebuild["flops"] > 50 * absorbed["flops"] and rebuild["bytes"] > 10 * absorbed["bytes"]


@pytest.mark.slow  # runs the benchmark (quick): a few seconds
def test_bench_compress_quick_reports_every_part():
    """Check that `kvlib bench compress --quick` gives bytes, quality, speed and MLA rows, and formats them."""
    with on_a_terminal() as err:
        report = bench_compress.bench_compress(quick=True)
    for desc in ("kvlib bench compress", "int8 agreement: int8", "window study", "window accuracy", "int8 against"):
        assert shown_progress(err.getvalue(), desc), desc  # a bar for the run, one for each study's pass
    assert {r["scheme"] for r in report["bytes"]} >= {"MHA float32", "MLA, latent 512 + rotary 64"}
    assert 0 <= report["int8_agreement"]["agreement"] <= 1
    assert set(report["window"]["loss"]) == {
        "float32 (full)",
        "int8 (full)",
        "window 32, no sinks",
        "4 sinks + window 28",
    }
    assert [r["kv_len"] for r in report["speed"]["rows"]] == [512, 1024]
    assert all(r["int8_bytes"] < r["float32_bytes"] / 3 for r in report["speed"]["rows"])
    for r in report["speed"]["rows"]:  # dequantising is a part of one timed run, never more than it
        assert 0 < r["dequantise_share"] < 1 and r["dequantise_s"] < r["int8_parts_spread_s"][1]
    assert set(report["key_axis"]["output_error"]) == {"per channel", "per token"}
    assert "full cache" in report["window_accuracy"]["accuracy"]
    text = bench_compress.format_compress(report)
    assert "MLA" in text and "agreement" in text


def test_cache_schemes_figure_is_labelled_and_uses_the_palette():
    """Check that the workshop figure has a labelled x axis, a title with the ratio, and the course's colours."""
    from kvlib.course import plotting

    fig = plotting.cache_schemes(
        ["MHA", "GQA-8", "MLA"],
        [512.0, 128.0, 36.0],
        ["reference", "close", "not measured"],
        model="Llama-3-8B's shape",
        note="test",
    )
    ax = fig.axes[0]
    assert ax.get_xlabel() and "14x" in ax.get_title(loc="left")
    colours = {tuple(p.get_facecolor()) for p in ax.patches}
    from matplotlib.colors import to_rgba

    assert colours <= {to_rgba(c) for c in plotting.COLORS}


# ---------------------------------------------------------------------------------------------
# kvlib's own yardsticks, used as answers: refused while 8.7 and 8.8 are checked (kvlib.course.exercises.READY_MADE)


def _mla_flops_on_meta(path, kv_len, new_tokens=1, **sizes):  # torch's counter on 8.5 / 8.6 over meta tensors
    from kvlib.core.flops import matmul_flops

    H, Dn, Dr, Dv, r = (sizes[k] for k in ("n_heads", "nope_dim", "rope_dim", "v_dim", "kv_rank"))
    shapes = ((1, H, new_tokens, Dn), (1, H, new_tokens, Dr), (1, kv_len, r), (1, kv_len, Dr), (H, Dn, r), (H, Dv, r))
    args = [torch.empty(s, device="meta") for s in shapes]
    return matmul_flops(compress.mla_reconstruct if path == "reconstruct" else compress.mla_absorbed, *args)


@pytest.mark.parametrize(
    "ex_id, fakes, words",
    [
        ("8.7", {"int8_bytes_per_token": int8_bytes_measured}, "made a cache"),
        ("8.8", {"mla_flops": _mla_flops_on_meta}, "ran torch's FLOP counter"),
    ],
    ids=["8.7-caches-measured", "8.8-counter-on-meta-tensors"],
)
def test_kvlibs_yardstick_as_the_answer_fails_naming_it(ex_id, fakes, words):
    """Check that 8.7 answered by making Int8KVCaches and reading their nbytes, and 8.8 by torch's FLOP counter on 8.5
    and 8.6 over meta tensors (no memory, any size), fail the exercise's checks, each failure naming what it did."""
    failures = check_failures(ex_id, _module(**fakes))
    assert failures and all(words in str(err) and "while Exercise" in str(err) for _, err in failures), failures
