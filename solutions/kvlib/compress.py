"""Smaller caches (notebook 08-compress): int8 keys and values, a rolling window with sinks, MLA's latent cache.

int8 (KIVI, arXiv 2402.02750): per-channel key scales over a group of tokens, one value scale per token.
Rolling window (Mistral 7B) with attention sinks (StreamingLLM, arXiv 2309.17453), re-rotated at their
places in the cache. MLA (DeepSeek-V2, arXiv 2405.04434): one latent per token, attended two ways.
Int8 cache: kvlib.variants.compressed; bytes, timing: kvlib.measure.bench_compress; quality: study.compress_quality
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from kvlib.core.cache import CacheBase
from kvlib.core.model import causal_mask
from kvlib.course import inputs
from kvlib.course.exercises import exercise

# ---------------------------------------------------------------------------------------------
# int8 keys and values


@exercise("8.1", validate=inputs.check_quantize)
def quantize(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8: x ~= values * scale, one float32 scale for each slice of x along `dim`.

    dim is the axis that SHARES a scale: keys per channel use the token axis (dim=-2), values per
    token the channel axis (dim=-1). scale = max |x| over the slice / 127, so the largest entry maps
    to +-127; an all-zero slice gets scale 1. Rounded to nearest, never truncated.
    Returns: values (x's shape, torch.int8), scale (x's shape with size 1 at dim, float32)
    Example: quantize(torch.tensor([[1.0, -2.0]]), dim=-1) -> ([[64, -127]], [[2/127]])

    Hints (reference solution: 3 lines): x.abs().amax(dim, keepdim=True); torch.where; .round().clamp(-127, 127).
    """
    ### BEGIN SOLUTION
    scale = x.float().abs().amax(dim=dim, keepdim=True) / 127  # (..., 1, ...): the slice's largest |x| -> 127
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero slice: values 0, any scale
    return (x.float() / scale).round().clamp(-127, 127).to(torch.int8), scale
    ### END SOLUTION


def dequantize(values: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float32 values * scale (scale broadcasts over the axis it was shared along)."""
    return values.to(torch.float32, copy=True).mul_(scale)  # convert, then scale in place: 30x faster than int8 * float


@exercise("8.2", validate=inputs.check_int8_attention)
def int8_attention(
    q: torch.Tensor,
    k_values: torch.Tensor,
    k_scale: torch.Tensor,
    v_values: torch.Tensor,
    v_scale: torch.Tensor,
    kv_len: int,
) -> torch.Tensor:
    """Causal attention of q against the first kv_len tokens of an int8 cache (grouped heads as in 6.2).

    Args:    q: (batch, n_heads, seq_len, head_dim), the last seq_len of the kv_len positions
             k_values: int8 (batch, n_kv_heads, n_groups, group, head_dim); k_scale (batch, n_kv_heads, n_groups, 1, head_dim)
             v_values: int8 (batch, n_kv_heads, >= kv_len, head_dim); v_scale (batch, n_kv_heads, >= kv_len, 1)
    Returns: (batch, n_heads, seq_len, head_dim). Slots past kv_len hold nothing yet: never attend to them.

    Hints (reference solution: 6 lines):
      1. dequantize (above) the keys per group, then .reshape(B, H_kv, n_groups * group, D) and keep kv_len.
      2. F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True); mask: causal_mask(T, kv_len) if T > 1.
    """
    ### BEGIN SOLUTION
    B, H_kv, n_groups, group, D = k_values.shape
    k = dequantize(k_values, k_scale).reshape(B, H_kv, n_groups * group, D)[:, :, :kv_len]  # groups -> tokens
    v = dequantize(v_values[:, :, :kv_len], v_scale[:, :, :kv_len])  # (B, H_kv, S, D)
    T = q.shape[2]
    mask = None if T == 1 else causal_mask(T, kv_len, device=q.device)  # (T, S), True = may attend
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=q.shape[1] != H_kv)
    ### END SOLUTION


# ---------------------------------------------------------------------------------------------
# A rolling cache: n_sink first tokens, then the last `window` in a ring


class SinkCache(CacheBase):
    """Keys (before rotary) and values of the first n_sink tokens and the last `window` ones, per layer.

    k, v: (n_layers, batch, n_kv_heads, capacity = n_sink + window, head_dim). Slots n_sink ... capacity - 1
    form a ring: a new token overwrites the oldest. pos counts every token seen. n_sink = 0: Mistral's buffer.
    The cache contract (kvlib/core/cache.py): model(ids, past_key_values=cache) runs through it; once the ring
    has overwritten a token, truncate cannot rewind before it.
    """

    def __init__(self, config, n_sink: int, window: int, batch: int = 1, dtype=torch.float32, device="cpu"):
        inputs.check_cache_positions(1, n_sink, window)
        super().__init__(config, batch)  # pos = 0, up to the model's max_seq_len: the ring reuses its slots
        self.n_sink, self.window, self.capacity = n_sink, window, n_sink + window
        shape = (config.n_layers, batch, config.n_kv_heads, self.capacity, config.head_dim)
        self.k, self.v = torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device)

    def key_positions(self, kv_len: int) -> torch.Tensor:  # keys stored unrotated, turned at places in the cache
        return cache_positions(kv_len, self.n_sink, self.window)

    @exercise("8.3", validate=inputs.check_sink_update)
    def update(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the seq_len new tokens (positions pos, pos + 1, ...) into their slots; return the filled slots.

        Slot of token p: p while p < n_sink; after that n_sink + (p - n_sink) % window, so the ring
        reuses the oldest window slot and never touches a sink. pos stays: advance() moves it.
        Returns: k, v: (batch, n_kv_heads, min(pos + seq_len, capacity), head_dim), slot order, views.

        Hints (reference solution: 5 lines): one slot index per new token (a list or LongTensor), then
        self.k[layer, :, :, slots] = k_new writes them all.
        """
        ### BEGIN SOLUTION
        T = k_new.shape[2]
        slots = [
            p if p < self.n_sink else self.n_sink + (p - self.n_sink) % self.window
            for p in range(self.pos, self.pos + T)
        ]
        self.k[layer, :, :, slots] = k_new  # (B, H_kv, T, D) into the ring
        self.v[layer, :, :, slots] = v_new
        filled = min(self.pos + T, self.capacity)
        return self.k[layer, :, :, :filled], self.v[layer, :, :, :filled]
        ### END SOLUTION


@exercise("8.4", validate=inputs.check_cache_positions)
def cache_positions(n_seen: int, n_sink: int, window: int) -> torch.Tensor:
    """Rotary position of the key in every filled slot, once n_seen tokens went through a SinkCache.

    StreamingLLM's rule: positions count places in the cache, not in the text, so the model never sees
    a distance longer than the cache. Sinks are 0 ... n_sink - 1; window tokens n_sink ... by age,
    oldest first, wherever the ring put them. Before the cache is full: 0 ... n_seen - 1.
    Example: n_sink 1, window 3, n_seen 6: slots hold tokens [0, 4, 5, 3] -> positions [0, 2, 3, 1]
    Returns: LongTensor (min(n_seen, n_sink + window),)

    Hints (reference solution: 5 lines): the oldest kept token, n_seen - window, sits in slot
    n_sink + (n_seen - window - n_sink) % window; count ring slots from there, modulo window.
    """
    ### BEGIN SOLUTION
    if n_seen <= n_sink + window:
        return torch.arange(n_seen)
    oldest = (n_seen - window - n_sink) % window  # ring index (slot - n_sink) of the oldest kept token
    ring = torch.arange(window)
    return torch.cat([torch.arange(n_sink), n_sink + (ring - oldest) % window])  # age rank after the sinks
    ### END SOLUTION


# ---------------------------------------------------------------------------------------------
# Multi-head Latent Attention: the cache holds latent (kv_rank) and one shared rotary key (rope_dim) per token


@exercise("8.5", validate=inputs.check_mla)
def mla_reconstruct(q_nope, q_rope, latent, k_rope, w_uk, w_uv) -> torch.Tensor:
    """MLA the direct way: rebuild every head's keys and values from the cached latents, then attend.

    k_nope[h] = latent @ w_uk[h]^T, v[h] = latent @ w_uv[h]^T; score = (q_nope . k_nope + q_rope . k_rope)
    / sqrt(nope_dim + rope_dim), k_rope shared by all heads; causal, queries the last seq_len positions.
    Args: q_nope (B, H, T, Dn), q_rope (B, H, T, Dr) rotated; latent (B, S, r); k_rope (B, S, Dr) rotated;
          w_uk (H, Dn, r), w_uv (H, Dv, r).   Returns: (B, H, T, Dv)

    Hints (reference solution: 7 lines): torch.einsum("bsr,hdr->bhsd", latent, w_uk); k_rope[:, None]
    broadcasts over heads; causal_mask(T, S) when T > 1.
    """
    ### BEGIN SOLUTION
    T, S = q_nope.shape[2], latent.shape[1]
    k_nope = torch.einsum(
        "bsr,hdr->bhsd", latent, w_uk
    )  # (B, S, r) x (H, Dn, r) -> (B, H, S, Dn): every step, every token
    v = torch.einsum("bsr,hdr->bhsd", latent, w_uv)  # (B, H, S, Dv)
    scores = q_nope @ k_nope.transpose(-2, -1) + q_rope @ k_rope[:, None].transpose(-2, -1)  # (B, H, T, S)
    scores = scores / math.sqrt(q_nope.shape[-1] + q_rope.shape[-1])
    if T > 1:
        scores = scores.masked_fill(~causal_mask(T, S, device=scores.device), float("-inf"))
    return scores.softmax(dim=-1) @ v  # (B, H, T, S) @ (B, H, S, Dv)
    ### END SOLUTION


@exercise("8.6", validate=inputs.check_mla)
def mla_absorbed(q_nope, q_rope, latent, k_rope, w_uk, w_uv) -> torch.Tensor:
    """MLA as DeepSeek serves it: w_uk folded into the query, w_uv applied after, attention in latent space.

    q_nope . (w_uk[h] c) = (w_uk[h]^T q_nope) . c, and sum_s p_s (w_uv[h] c_s) = w_uv[h] (sum_s p_s c_s):
    no per-head key or value is ever built. Same arguments and result as mla_reconstruct (8.5).

    Hints (reference solution: 7 lines): q_latent = einsum("bhtd,hdr->bhtr", q_nope, w_uk); einsum it with
    latent (B, S, r), not latent[:, None] @ (a broadcasting matmul copies it per head); then w_uv per head.
    """
    ### BEGIN SOLUTION
    T, S = q_nope.shape[2], latent.shape[1]
    q_latent = torch.einsum("bhtd,hdr->bhtr", q_nope, w_uk)  # (B, H, T, Dn) -> (B, H, T, r): absorb w_uk
    # einsum, not a broadcasting matmul: that would copy the latents out to every head first
    scores = torch.einsum("bhtr,bsr->bhts", q_latent, latent) + torch.einsum("bhte,bse->bhts", q_rope, k_rope)
    scores = scores / math.sqrt(q_nope.shape[-1] + q_rope.shape[-1])
    if T > 1:
        scores = scores.masked_fill(~causal_mask(T, S, device=scores.device), float("-inf"))
    out_latent = torch.einsum("bhts,bsr->bhtr", scores.softmax(dim=-1), latent)  # (B, H, T, r): latent space
    return torch.einsum("bhtr,hdr->bhtd", out_latent, w_uv)  # up-project once per query, not per token
    ### END SOLUTION
