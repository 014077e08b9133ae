"""Smaller caches (notebook 08-compress): int8 keys and values, a rolling window with sinks, MLA's latent cache.

int8 keys per channel, values per token (KIVI, arXiv 2402.02750); a rolling window with sinks (Mistral 7B,
StreamingLLM arXiv 2309.17453); MLA's latent (DeepSeek-V2, arXiv 2405.04434). Measured: kvlib.measure.bench_compress.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from kvlib.core.cache import CacheBase
from kvlib.course import inputs
from kvlib.course.exercises import exercise

# ---------------------------------------------------------------------------------------------
# int8 keys and values


@exercise("8.1", validate=inputs.check_quantize)
def quantize(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 with one float32 scale (the step between integers) for each slice of x along `dim`.

    The numbers along dim share a scale (keys per channel: -2; values per token: -1). Each slice's step is the finest
    at which all of its numbers fit in -127 ... 127, and dequantize(values, scale) lies within half a step of x; an
    all-zero slice gets values 0.
    Args:    x: float tensor of any shape;  dim: an axis of x
    Returns: values: x's shape, torch.int8 in [-127, 127];  scale: x's shape with size 1 at dim, float32, finite, > 0
    Raises:  ValueError if x is not a float tensor or dim is not one of its axes
    Example:
        >>> values, scale = quantize(torch.tensor([[1.0, -2.0]]), dim=-1); values.tolist(), scale.shape
        ([[64, -127]], torch.Size([1, 1]))
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
def int8_attention(q, k_values, k_scale, v_values, v_scale, kv_len: int) -> torch.Tensor:
    """Causal attention of q against the first kv_len tokens of an int8 cache, n_heads a multiple of n_kv_heads.

    Args:    q: (batch, n_heads, seq_len, head_dim) float32, the last seq_len of the kv_len positions
             k_values: int8 (batch, n_kv_heads, n_groups, group, head_dim), token t in group t // group, and
             k_scale (batch, n_kv_heads, n_groups, 1, head_dim); v_values: int8 (batch, n_kv_heads, >= kv_len,
             head_dim), v_scale (batch, n_kv_heads, >= kv_len, 1); kv_len <= n_groups * group tokens written
    Returns: (batch, n_heads, seq_len, head_dim) float32: the attention over the float keys and values these int8
             numbers stand for, up to float rounding; the slots past kv_len hold anything and change nothing
    Raises:  ValueError if the shapes or dtypes do not fit together or kv_len is out of range
    Example:
        >>> (kq, ks), (vq, vs) = quantize(torch.randn(1, 2, 2, 4, 16), dim=-2), quantize(torch.randn(1, 2, 8, 16), dim=-1)
        >>> int8_attention(torch.randn(1, 4, 1, 16), kq, ks, vq, vs, kv_len=6).shape
        torch.Size([1, 4, 1, 16])
    """
    ### BEGIN SOLUTION
    from kvlib.core.model import causal_mask_tensor  # noqa: PLC0415 (kept from the stub: the mask is yours)

    B, H_kv, n_groups, group, D = k_values.shape
    k = dequantize(k_values, k_scale).reshape(B, H_kv, n_groups * group, D)[:, :, :kv_len]  # groups -> tokens
    v = dequantize(v_values[:, :, :kv_len], v_scale[:, :, :kv_len])  # (B, H_kv, S, D)
    T = q.shape[2]
    mask = None if T == 1 else causal_mask_tensor(T, kv_len, device=q.device)  # (T, S), True = may attend
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=q.shape[1] != H_kv)
    ### END SOLUTION


@exercise("8.7", validate=inputs.check_int8_bytes)
def int8_bytes_per_token(config, group: int = 32, scale_bytes: int = 4) -> float:
    """Predict: the bytes one more token adds to an int8 cache laid out as Int8KVCache lays it out, all layers.

    The layout is 8.2's arguments (their shapes), groups of `group` tokens, each scale scale_bytes bytes (4: float32,
    as the tiny model's cache; 2: 16-bit). A token's share of what its group holds counts; the float residual, one
    group per cache whatever its length, does not.
    Args:    config: a ModelConfig (its n_layers, n_kv_heads, head_dim);  group >= 1;  scale_bytes >= 1
    Returns: float, bytes per token of context for one sequence
    Raises:  ValueError if config is not a ModelConfig or group or scale_bytes is not a positive int
    Example:
        >>> from kvlib.core.model import ModelConfig
        >>> int8_bytes_per_token(ModelConfig(vocab_size=50, n_layers=2, d_model=32, n_heads=2, n_kv_heads=1), group=4)
        104.0
    """
    ### BEGIN SOLUTION
    H_kv, D = config.n_kv_heads, config.head_dim
    numbers = 2 * H_kv * D  # a key and a value per channel, one byte each
    key_scales = H_kv * D * scale_bytes / group  # one per channel per group, shared by its tokens
    value_scales = H_kv * scale_bytes  # one per token per head
    return float(config.n_layers * (numbers + key_scales + value_scales))
    ### END SOLUTION


# ---------------------------------------------------------------------------------------------
# A rolling cache: n_sink first tokens, then the last `window` in a ring


class SinkCache(CacheBase):
    """Keys (before rotary) and values of the first n_sink tokens and the last `window` ones, per layer:

    k, v: (n_layers, batch, n_kv_heads, capacity = n_sink + window, head_dim); pos counts every token seen.
    n_sink = 0: Mistral's buffer. The cache contract is kvlib/core/cache.py (truncate stops at what the ring overwrote).
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

        Shipped with a bug (Exercise 8.3 is a find-and-fix): the checks show what goes wrong; the contract is below.

        Afterwards the cache holds the n_sink first tokens and the window latest ones: while it fills, token p takes
        slot p; once full, a new token takes the slot of the window token it pushes out (sinks never leave, and no
        kept token moves). pos stays: advance() moves it.
        Args:    layer: 0 <= layer < n_layers;  k_new, v_new: (batch, n_kv_heads, seq_len, head_dim), the cache's dtype
        Returns: k, v: (batch, n_kv_heads, min(pos + seq_len, capacity), head_dim), in slot order, views of the storage
        Raises:  ValueError if layer is out of range or a shape does not fit the cache
        Example:
            >>> from kvlib.core.model import ModelConfig; cache = SinkCache(ModelConfig(vocab_size=50), n_sink=1, window=2)
            >>> for p in range(4): k, _ = cache.update(0, torch.full((1, 8, 1, 16), p * 1.0), torch.zeros(1, 8, 1, 16)); cache.advance(1)
            >>> k[0, 0, :, 0].tolist()  # slot order: the sink, then the ring (token 3 overwrote token 1)
            [0.0, 3.0, 2.0]
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
        ### BEGIN SHIPPED
        # T = k_new.shape[2]
        # slots = [p % self.capacity for p in range(self.pos, self.pos + T)]  # once full, wrap around to the oldest
        # self.k[layer, :, :, slots] = k_new  # (B, H_kv, T, D) into their slots
        # self.v[layer, :, :, slots] = v_new
        # filled = min(self.pos + T, self.capacity)
        # return self.k[layer, :, :, :filled], self.v[layer, :, :, :filled]
        ### END SHIPPED


@exercise("8.4", validate=inputs.check_cache_positions)
def cache_positions(n_seen: int, n_sink: int, window: int) -> torch.Tensor:
    """Rotary position of the key in every filled slot, once n_seen tokens went through a SinkCache.

    StreamingLLM's rule, places in the cache: sinks 0 ... n_sink - 1, then the window tokens by age wherever the ring put them.
    Args:    n_seen: tokens written so far, >= 1;  n_sink >= 0, window >= 1: the SinkCache's sizes
    Returns: LongTensor (min(n_seen, n_sink + window),), slot order
    Raises:  ValueError if a size is out of range
    Example:
        >>> cache_positions(6, 1, 3).tolist()  # slots hold tokens [0, 4, 5, 3]
        [0, 2, 3, 1]
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
    """MLA attention as notebook 08b defines it, the direct way (mla_absorbed, 8.6, is the other).

    Causal attention of each head's T queries, the last T of the S positions, over all S cached tokens.
    Args:    q_nope (B, H, T, Dn), q_rope (B, H, T, Dr) rotated;  latent (B, S, r);  k_rope (B, S, Dr) rotated;
             w_uk (H, Dn, r), w_uv (H, Dv, r); one float dtype
    Returns: (B, H, T, Dv)
    Raises:  ValueError if the shapes do not fit together or T > S
    Example:
        >>> args = torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 2), torch.randn(1, 5, 3), torch.randn(1, 5, 2)
        >>> mla_reconstruct(*args, torch.randn(2, 4, 3), torch.randn(2, 4, 3)).shape  # B 1, H 2, T 1, S 5, Dv 4
        torch.Size([1, 2, 1, 4])
    """
    ### BEGIN SOLUTION
    from kvlib.core.model import causal_mask_tensor  # noqa: PLC0415 (kept from the stub: the mask is yours)

    T, S = q_nope.shape[2], latent.shape[1]
    k_nope = torch.einsum(
        "bsr,hdr->bhsd", latent, w_uk
    )  # (B, S, r) x (H, Dn, r) -> (B, H, S, Dn): every step, every token
    v = torch.einsum("bsr,hdr->bhsd", latent, w_uv)  # (B, H, S, Dv)
    scores = q_nope @ k_nope.transpose(-2, -1) + q_rope @ k_rope[:, None].transpose(-2, -1)  # (B, H, T, S)
    scores = scores / math.sqrt(q_nope.shape[-1] + q_rope.shape[-1])
    if T > 1:
        scores = scores.masked_fill(~causal_mask_tensor(T, S, device=scores.device), float("-inf"))
    return scores.softmax(dim=-1) @ v  # (B, H, T, S) @ (B, H, S, Dv)
    ### END SOLUTION


@exercise("8.6", validate=inputs.check_mla)
def mla_absorbed(q_nope, q_rope, latent, k_rope, w_uk, w_uv) -> torch.Tensor:
    """MLA as DeepSeek serves it for decode: mla_reconstruct's (8.5) answer without rebuilding keys or values.

    No tensor holds a per-head key, value or copy of the latents for every cached token: the grader measures the
    memory a decode step against many latents holds.
    Args:    as mla_reconstruct
    Returns: (B, H, T, Dv), equal to mla_reconstruct's up to rounding
    Raises:  ValueError if the shapes do not fit together or T > S
    Example:
        >>> args = [torch.randn(*s) for s in ((1, 2, 3, 4), (1, 2, 3, 2), (1, 5, 3), (1, 5, 2), (2, 4, 3), (2, 4, 3))]
        >>> torch.allclose(mla_absorbed(*args), mla_reconstruct(*args), atol=1e-5)
        True
    """
    ### BEGIN SOLUTION
    from kvlib.core.model import causal_mask_tensor  # noqa: PLC0415 (kept from the stub: the mask is yours)

    T, S = q_nope.shape[2], latent.shape[1]
    q_latent = torch.einsum("bhtd,hdr->bhtr", q_nope, w_uk)  # (B, H, T, Dn) -> (B, H, T, r): absorb w_uk
    # einsum, not a broadcasting matmul: that would copy the latents out to every head first
    scores = torch.einsum("bhtr,bsr->bhts", q_latent, latent) + torch.einsum("bhte,bse->bhts", q_rope, k_rope)
    scores = scores / math.sqrt(q_nope.shape[-1] + q_rope.shape[-1])
    if T > 1:
        scores = scores.masked_fill(~causal_mask_tensor(T, S, device=scores.device), float("-inf"))
    out_latent = torch.einsum("bhts,bsr->bhtr", scores.softmax(dim=-1), latent)  # (B, H, T, r): latent space
    return torch.einsum("bhtr,hdr->bhtd", out_latent, w_uv)  # up-project once per query, not per token
    ### END SOLUTION


@exercise("8.8", validate=inputs.check_mla_flops)
def mla_flops(path: str, kv_len: int, new_tokens: int = 1, **sizes) -> int:
    """Predict: the matmul FLOPs of one layer's MLA attention, for new_tokens queries (batch 1) over kv_len latents.

    Counted as torch.utils.flop_counter counts them: 2 FLOPs per multiply-add of every matrix product (einsum and
    @ alike); softmax, scaling and masking count nothing; a prefill's masked scores count (the product computes
    them). path "reconstruct": the products mla_reconstruct (8.5) computes; "absorbed": those of mla_absorbed (8.6).
    Args:    path: "reconstruct" or "absorbed";  kv_len >= new_tokens >= 1;  sizes: the MLA sizes as keywords,
             n_heads, nope_dim, rope_dim, v_dim, kv_rank (MLAModel.sizes() gives a published model's)
    Returns: int, FLOPs
    Raises:  ValueError if path is neither, a size is missing or not a positive int, or new_tokens > kv_len
    Example:
        >>> mla_flops("reconstruct", 2, n_heads=1, nope_dim=1, rope_dim=1, v_dim=1, kv_rank=1)
        20
    """
    ### BEGIN SOLUTION
    H, Dn, Dr, Dv, r = (sizes[k] for k in ("n_heads", "nope_dim", "rope_dim", "v_dim", "kv_rank"))
    S, T = kv_len, new_tokens
    scores_rope = 2 * H * T * S * Dr  # q_rope against the shared rotary key: both paths
    if path == "reconstruct":
        rebuild = 2 * S * r * H * (Dn + Dv)  # every head's keys and values, from every latent, each call
        return rebuild + 2 * H * T * S * Dn + scores_rope + 2 * H * T * S * Dv  # scores, then probs @ values
    absorb = 2 * H * T * Dn * r  # each query into latent space
    latent = 2 * H * T * S * r  # scores against the latents, and probs @ latents: r wide, both
    return absorb + latent + scores_rope + latent + 2 * H * T * r * Dv  # one up-projection per query
    ### END SOLUTION
