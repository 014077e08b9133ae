"""The KV cache (notebook 04-kv-cache): keep every layer's keys and values, compute only the new tokens.

A pre-allocated cache holds what notebook 03 showed never changes; cached_forward() runs only new
tokens through every layer (prefill: the prompt once; decode step: one token). kv_cache_bytes():
what the cache costs in memory. Left out: paged or sliding-window caches, prompts of different lengths.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from kvlib.attention import causal_mask
from kvlib.core.cache import CacheBase
from kvlib.course import inputs
from kvlib.course.exercises import exercise
from kvlib.generation import next_token

# ---------------------------------------------------------------------------------------------
# The cache (infrastructure, except update)


class KVCache(CacheBase):
    """Keys and values of every layer, pre-allocated: k and v are (n_layers, batch, n_kv_heads, max_seq_len, head_dim).

    pos: tokens stored so far (the next token's position). Each layer writes with update(), then advance() once.
    pos, reset, advance, truncate and nbytes come from CacheBase: the cache contract, kvlib/core/cache.py.
    """

    def __init__(self, config, batch: int = 1, max_seq_len: int | None = None, dtype=torch.float32, device="cpu"):
        super().__init__(config, batch, max_seq_len)  # checks batch and max_seq_len; pos = 0
        shape = (config.n_layers, batch, config.n_kv_heads, self.max_seq_len, config.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # written in place, never reallocated
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    @staticmethod
    def attention(attn, x: torch.Tensor, cache: "KVCache", layer: int, rope_cos: torch.Tensor, rope_sin: torch.Tensor):
        """How model(ids, past_key_values=cache) runs a layer's attention: Exercise 4.2."""
        return cached_attention(attn, x, cache, layer, rope_cos, rope_sin)

    @exercise("4.1", validate=inputs.check_update)
    def update(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k_new, v_new of one layer at positions [pos, pos + seq_len); return that layer's filled prefix.

        Args:    layer: 0 <= layer < n_layers; k_new, v_new: (batch, n_kv_heads, seq_len, head_dim)
        Returns: k, v: (batch, n_kv_heads, pos + seq_len, head_dim), views into the cache. pos stays: advance() moves it.

        Hints (reference solution: 4 lines): slice assignment writes in place, self.k[layer, :, :, a:b] = k_new (no torch.cat).
        """
        raise NotImplementedError("Exercise 4.1 (notebooks/04-kv-cache): KVCache.update")


@exercise("4.2", validate=inputs.check_cached_attention)
def cached_attention(
    attn, x: torch.Tensor, cache: KVCache, layer: int, rope_cos: torch.Tensor, rope_sin: torch.Tensor
) -> torch.Tensor:
    """One attention layer with a cache: the seq_len new tokens attend to every stored token and themselves.

    Args:    attn: the layer's kvlib.core.model.Attention (project_q, project_kv, n_heads, n_kv_heads, o_proj)
             x: (batch, seq_len, d_model), the normed residual stream of the NEW tokens only
             cache, layer: this layer's slot, cache.pos = position of x[:, 0]; rope_cos, rope_sin: (max_seq_len, head_dim)
    Returns: (batch, seq_len, d_model), as attn(x) would give on the full sequence for these rows

    Hints (reference solution: 8 lines):
      1. New token i sits at absolute position cache.pos + i: slice the rotary tables there, not at 0.
      2. cache.update (4.1) returns all keys so far; mask: causal_mask(seq_len, kv_len) (1.3; is_causal=True aligns top-left).
      3. F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True) then attn.o_proj.
    """
    raise NotImplementedError("Exercise 4.2 (notebooks/04-kv-cache): cached_attention")


@exercise("4.3", validate=inputs.check_prefill)
def cached_forward(model, input_ids: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """Run only the new tokens through every layer, each reading and extending its cache; next-token logits.

    A prefill is cached_forward over the whole prompt, once; a decode step over one token per row.
    Args:    model: a kvlib Decoder; input_ids: (batch, seq_len), the new tokens; cache.pos = position of input_ids[:, 0]
    Returns: (batch, vocab_size): logits at the last position. cache.pos grows by seq_len.

    Hints (reference solution: 6 lines):
      1. x = model.embed(input_ids): new tokens only. Then each layer i, as Block.forward does it:
         x + cached_attention(layer.attn, layer.attn_norm(x), cache, i, model.rope_cos, model.rope_sin),
         then x + layer.mlp(layer.mlp_norm(x)).
      2. Every layer writes at the same positions: cache.advance(seq_len) once, after the last layer.
      3. Only the last position predicts the next token: model.lm_head(model.norm(x[:, -1])).
    """
    raise NotImplementedError("Exercise 4.3 (notebooks/04-kv-cache): cached_forward")


def prefill(model, input_ids: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """The prompt (batch, seq_len), once, into the cache: the first new token's logits (batch, vocab_size)."""
    inputs.check_prefill(model, input_ids, cache)
    return cached_forward(model, input_ids, cache)


def decode_step(model, token: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """One token per row (batch,) at position cache.pos: the next token's logits (batch, vocab_size)."""
    inputs.check_decode(model, token, cache)
    return cached_forward(model, token[:, None], cache)


@exercise("4.4", validate=inputs.check_kv_cache_bytes)
def kv_cache_bytes(config, seq_len: int, batch: int = 1, dtype: torch.dtype = torch.float16) -> int:
    """Bytes of the KV cache holding seq_len tokens for each of batch sequences (what KVCache allocates).

    Every layer keeps a key and a value vector of head_dim numbers per KV head per token.
    Example: Llama-2-7B (32 layers, 32 KV heads, head_dim 128) in float16: 512 KiB per token

    Hints (reference solution: 2 lines):
      1. Keys and values: a factor 2. Layers, KV heads (config.n_kv_heads, not n_heads), head_dim.
      2. Bytes, not bits: dtype.itemsize (2 for float16).
    """
    raise NotImplementedError("Exercise 4.4 (notebooks/04-kv-cache): kv_cache_bytes")


@exercise("4.5", validate=inputs.check_generate_cached)
def generate_cached(
    model,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
    on_token: Callable[[torch.Tensor], None] | None = None,
    cache: KVCache | None = None,
) -> torch.Tensor:
    """generate (Exercise 2.2) with a KV cache: one prefill, then one decode step per new token.

    Args:    as generate; cache: reuse this cache (it is reset first), or None for a new one
    Returns: (batch, seq_len + max_new_tokens), the same tokens as generate gives (greedy, fp32)

    Hints (reference solution: 9 lines): reset a cache left from another prompt; prefill gives the first
    token's logits, each decode_step the next one's; next_token (Exercise 2.1) picks, as in generate.
    """
    raise NotImplementedError("Exercise 4.5 (notebooks/04-kv-cache): generate_cached")
