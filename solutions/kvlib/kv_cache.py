"""The KV cache (notebook 04-kv-cache): keep every layer's keys and values, compute only the new token.

Space for time: a pre-allocated cache of shape (batch, n_kv_heads, max_seq_len, head_dim) per
layer holds what notebook 03 showed never changes. prefill() runs the prompt once and fills it;
each decode_step() runs one token, at absolute position cache.pos, against every cached key.
The model takes it as transformers' models do: logits, cache = model(ids, past_key_values=cache).
Left out: paged or sliding-window caches, and batches of prompts of different lengths.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from kvlib.course.exercises import exercise
from kvlib.course.inputs import check_cached_attention, check_decode, check_generate_cached, check_prefill, check_update
from kvlib.attention import causal_mask
from kvlib.generation import next_token

# ---------------------------------------------------------------------------------------------
# The cache (infrastructure, except update)


class KVCache:
    """Keys and values of every layer, pre-allocated: k and v are (n_layers, batch, n_kv_heads, max_seq_len, head_dim).

    pos counts the tokens stored so far: the absolute position of the next token. A forward
    pass writes each layer with update(), then moves pos on once with advance(); each layer reads
    the cache through attention(), which is cached_attention (Exercise 4.2).
    """

    def __init__(self, config, batch: int = 1, max_seq_len: int | None = None,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        max_seq_len = config.max_seq_len if max_seq_len is None else max_seq_len
        if not 1 <= max_seq_len <= config.max_seq_len:
            raise ValueError(f"max_seq_len must be in [1, {config.max_seq_len}] (the model's rotary table), got {max_seq_len}")
        if batch < 1:
            raise ValueError(f"batch must be at least 1, got {batch}")
        shape = (config.n_layers, batch, config.n_kv_heads, max_seq_len, config.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # written in place, never reallocated
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.n_layers, self.max_seq_len, self.pos = config.n_layers, max_seq_len, 0

    @property
    def nbytes(self) -> int:
        """Bytes the cache occupies (allocated, whether filled or not)."""
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()

    def reset(self) -> None:
        """Forget every stored token: the next prompt starts at position 0."""
        self.pos = 0

    def advance(self, seq_len: int) -> None:
        """Move pos past seq_len tokens that every layer has just written."""
        if self.pos + seq_len > self.max_seq_len:
            raise ValueError(f"advancing by {seq_len} from {self.pos} runs past max_seq_len={self.max_seq_len}")
        self.pos += seq_len

    @staticmethod
    def attention(attn, x: torch.Tensor, cache: "KVCache", layer: int, rope_cos: torch.Tensor, rope_sin: torch.Tensor):
        """How the model runs one layer's attention through this cache: Exercise 4.2's cached_attention."""
        return cached_attention(attn, x, cache, layer, rope_cos, rope_sin)

    @exercise("4.1", validate=check_update)
    def update(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k_new, v_new of one layer at positions [pos, pos + seq_len); return that layer's filled prefix.

        Args:    layer: which layer's slot, 0 <= layer < n_layers
                 k_new, v_new: (batch, n_kv_heads, seq_len, head_dim)
        Returns: k, v: (batch, n_kv_heads, pos + seq_len, head_dim), views into the cache
        Does not move pos: advance() does that once all layers are written.

        Hints (reference solution: 4 lines):
          1. Slice assignment on dim 2 (positions) writes in place: self.k[layer, :, :, a:b] = k_new.
          2. torch.cat is not needed, and would allocate a new tensor every step.
        """
        ### BEGIN SOLUTION
        end = self.pos + k_new.shape[2]
        self.k[layer, :, :, self.pos : end] = k_new  # (B, H_kv, T, D) into (B, H_kv, max_seq_len, D)
        self.v[layer, :, :, self.pos : end] = v_new
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]  # (B, H_kv, pos + T, D), no copy
        ### END SOLUTION


# ---------------------------------------------------------------------------------------------
# Exercise 4.2: attention through the cache


@exercise("4.2", validate=check_cached_attention)
def cached_attention(attn, x: torch.Tensor, cache: KVCache, layer: int,
                     rope_cos: torch.Tensor, rope_sin: torch.Tensor) -> torch.Tensor:
    """One attention layer with a cache: the seq_len new tokens attend to every stored token and themselves.

    Args:    attn: the layer's kvlib.core.model.Attention (project_q, project_kv, n_heads, n_kv_heads, o_proj)
             x: (batch, seq_len, d_model), the normed residual stream of the NEW tokens only
             cache, layer: where this layer's keys and values live; cache.pos = position of x[:, 0]
             rope_cos, rope_sin: (max_seq_len, head_dim), the model's rotary tables for all positions
    Returns: (batch, seq_len, d_model), as attn(x) would give on the full sequence for these rows

    Hints (reference solution: 8 lines):
      1. New token i sits at absolute position cache.pos + i: slice the rotary tables there, not at 0.
      2. cache.update (Exercise 4.1) returns all keys so far; the mask is causal_mask(seq_len, kv_len)
         (Exercise 1.3) as a torch tensor. is_causal=True would align it top-left: wrong when seq_len < kv_len.
      3. F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True) then attn.o_proj.
    """
    ### BEGIN SOLUTION
    B, T, _ = x.shape
    cos, sin = rope_cos[cache.pos : cache.pos + T], rope_sin[cache.pos : cache.pos + T]  # absolute positions
    q = attn.project_q(x, cos, sin)  # (B, H, T, D)
    k, v = cache.update(layer, *attn.project_kv(x, cos, sin))  # (B, H_kv, S, D), S = pos + T
    # (T, S), True = may attend; one new query (decode) may attend to every key: no mask, a faster kernel
    mask = None if T == 1 else torch.from_numpy(causal_mask(T, k.shape[2])).to(x.device)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=attn.n_kv_heads != attn.n_heads)
    return attn.o_proj(out.transpose(1, 2).reshape(B, T, -1))  # (B, H, T, D) -> (B, T, H*D) -> (B, T, C)
    ### END SOLUTION


# ---------------------------------------------------------------------------------------------
# Exercises 4.3 to 4.5: the two phases, then the loop that joins them


@exercise("4.3", validate=check_prefill)
def prefill(model, input_ids: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """Run the prompt through the model once, filling the cache; return the next-token logits.

    Args:    input_ids: (batch, seq_len); cache: empty, or holding earlier tokens (chunked prefill)
    Returns: (batch, vocab_size): logits at the last position. cache.pos grows by seq_len.

    Hints (reference solution: 2 lines):
      1. logits, cache = model(input_ids, past_key_values=cache)
    """
    ### BEGIN SOLUTION
    logits, _ = model(input_ids, past_key_values=cache)  # (B, T, vocab); writes T positions per layer
    return logits[:, -1]
    ### END SOLUTION


@exercise("4.4", validate=check_decode)
def decode_step(model, token: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """Run one new token per row at position cache.pos; return the logits for the token after it.

    Args:    token: (batch,) the token just chosen; cache: filled by prefill and earlier steps
    Returns: (batch, vocab_size). cache.pos grows by 1.

    Hints (reference solution: 2 lines):
      1. The model wants (batch, seq_len) ids: token[:, None] is (batch, 1).
    """
    ### BEGIN SOLUTION
    logits, _ = model(token[:, None], past_key_values=cache)  # (B, 1, vocab): one query, S keys
    return logits[:, -1]
    ### END SOLUTION


@exercise("4.5", validate=check_generate_cached)
def generate_cached(model, input_ids: torch.Tensor, max_new_tokens: int, temperature: float = 0.0,
                    generator: torch.Generator | None = None, on_token: Callable[[torch.Tensor], None] | None = None,
                    cache: KVCache | None = None) -> torch.Tensor:
    """generate (Exercise 2.2) with a KV cache: one prefill, then one decode step per new token.

    Args:    as generate; cache: reuse this cache (it is reset first), or None for a new one
    Returns: (batch, seq_len + max_new_tokens), the same tokens as generate gives (greedy, fp32)

    Hints (reference solution: 9 lines):
      1. A cache left over from another prompt must be reset, or the new prompt sees the old one.
      2. prefill gives the first token's logits; each decode_step the next one's.
      3. next_token (Exercise 2.1) picks the token, exactly as in generate.
    """
    ### BEGIN SOLUTION
    if cache is None:
        cache = KVCache(model.config, batch=input_ids.shape[0], dtype=model.embed.weight.dtype, device=input_ids.device)
    cache.reset()
    tokens = []
    with torch.inference_mode():
        logits = prefill(model, input_ids, cache)  # (B, vocab): the prompt, once
        for i in range(max_new_tokens):
            token = next_token(logits, temperature, generator)  # (B,)
            tokens.append(token)
            if on_token is not None:
                on_token(token)
            if i + 1 < max_new_tokens:
                logits = decode_step(model, token, cache)  # one token against the cache
    return torch.cat([input_ids, torch.stack(tokens, dim=1)], dim=1)
    ### END SOLUTION
