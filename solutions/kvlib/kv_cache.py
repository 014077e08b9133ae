"""The KV cache (notebook 04-kv-cache, parts 04a and 04b): keep every layer's keys and values, compute only new tokens.

A pre-allocated cache holds what notebook 03 showed never changes; cached_forward() runs only the new tokens (prefill,
decode); kv_cache_bytes() and sequences_that_fit() price it. Left out: paged or sliding-window caches, ragged prompts."""

from __future__ import annotations

import torch

from kvlib.core.cache import CacheBase
from kvlib.course import inputs
from kvlib.course.exercises import exercise

# ---------------------------------------------------------------------------------------------
# The cache (infrastructure, except update)


class KVCache(CacheBase):
    """Every layer's keys and values for batch sequences of up to max_seq_len tokens, allocated once as the tensors k
    and v (their layout: notebook 04a, Exercise 4.1); pos (the tokens stored), reset, advance, truncate and nbytes
    come from CacheBase."""

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
        """Store one layer's new keys and values next to the pos tokens it already holds, in the storage made once.

        Args:    layer: 0 <= layer < n_layers;  k_new, v_new: (batch, n_kv_heads, seq_len, head_dim), the cache's dtype
        Returns: k, v: every key and value the layer holds now, oldest token first, as (batch, n_kv_heads, kv_len,
                 head_dim) views of the storage (no copy); earlier tokens and other layers untouched; pos unmoved
        Raises:  ValueError if layer is out of range, a shape does not fit the cache, or the new tokens overrun max_seq_len
        Example:
            >>> from kvlib.core.model import ModelConfig; cache = KVCache(ModelConfig(vocab_size=50), max_seq_len=8)
            >>> k, v = cache.update(0, torch.ones(1, 8, 3, 16), torch.ones(1, 8, 3, 16)); tuple(k.shape), cache.pos
            ((1, 8, 3, 16), 0)
        """
        ### BEGIN SOLUTION
        end = self.pos + k_new.shape[2]
        self.k[layer, :, :, self.pos : end] = k_new  # (B, H_kv, T, D) into (B, H_kv, max_seq_len, D)
        self.v[layer, :, :, self.pos : end] = v_new
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]  # (B, H_kv, pos + T, D), no copy
        ### END SOLUTION


@exercise("4.2", validate=inputs.check_cached_attention)
def cached_attention(
    attn, x: torch.Tensor, cache: KVCache, layer: int, rope_cos: torch.Tensor, rope_sin: torch.Tensor
) -> torch.Tensor:
    """One attention layer with a cache: what the seq_len new tokens get from attending to every token so far.

    Args:    attn: the layer's Attention, possibly GQA (n_kv_heads < n_heads: the cache holds n_kv_heads heads);
             x: (batch, seq_len, d_model), the NEW tokens' normed stream;  cache, layer: this layer's slot of a
             KVCache, cache.pos the position of x[:, 0];  rope_cos, rope_sin: the model's tables
    Returns: (batch, seq_len, d_model), the rows attn gives them over the whole sequence; their keys and values stored
    Raises:  ValueError if x is not (batch, seq_len, d_model) or the new tokens do not fit in the cache
    Example:
        >>> from kvlib.core.weights import load_tiny; model, _ = load_tiny(); cache = KVCache(model.config, max_seq_len=16)
        >>> cached_attention(model.layers[0].attn, torch.randn(1, 4, 128), cache, 0, model.rope_cos, model.rope_sin).shape
        torch.Size([1, 4, 128])
    """
    ### BEGIN SOLUTION
    import torch.nn.functional as F  # noqa: PLC0415 (not in learners' folders: the stub names no route)

    from kvlib.attention import causal_mask  # noqa: PLC0415 (kept from the stub: Exercise 1.3's mask)

    B, T, _ = x.shape
    cos, sin = rope_cos[cache.pos : cache.pos + T], rope_sin[cache.pos : cache.pos + T]  # absolute positions
    q = attn.project_q(x, cos, sin)  # (B, H, T, D)
    k, v = cache.update(layer, *attn.project_kv(x, cos, sin))  # (B, H_kv, S, D), S = pos + T
    # (T, S), True = may attend; one new query (decode) may attend to every key: no mask, a faster kernel
    mask = None if T == 1 else torch.from_numpy(causal_mask(T, k.shape[2])).to(x.device)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=attn.n_kv_heads != attn.n_heads)
    return attn.o_proj(out.transpose(1, 2).reshape(B, T, -1))  # (B, H, T, D) -> (B, T, H*D) -> (B, T, C)
    ### END SOLUTION


@exercise("4.3", validate=inputs.check_prefill)
def cached_forward(model, input_ids: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """Run only the new tokens through every layer, each reading and extending its cache: a prefill, or a decode step.

    Shipped with two bugs (Exercise 4.3 is a find-and-fix): the checks show what goes wrong; the contract is below.

    Args:    model: a kvlib Decoder;  cache: a KVCache of its config and batch
             input_ids: (batch, seq_len) torch.long, the new tokens; cache.pos is the position of input_ids[:, 0]
    Returns: (batch, vocab_size) float32, model(all tokens so far)[:, -1], computing no more than those logits need
             (the checks count what it computes); pos grew by seq_len
    Raises:  ValueError if the cache's batch differs from input_ids' or the tokens do not fit in it
    Example:
        >>> from kvlib.core.weights import load_tiny; model, tokenizer = load_tiny(); cache = KVCache(model.config)
        >>> logits = cached_forward(model, torch.tensor([tokenizer.encode("法国的首都是")]), cache)
        >>> tokenizer.decode(logits.argmax(-1).tolist()), cache.pos
        ('巴', 6)
    """
    ### BEGIN SOLUTION
    x = model.embed(input_ids)  # (B, T, C): the new tokens only; the cache stands in for the rest
    for i, layer in enumerate(model.layers):
        x = x + cached_attention(layer.attn, layer.attn_norm(x), cache, i, model.rope_cos, model.rope_sin)
        x = x + layer.mlp(layer.mlp_norm(x))
    cache.advance(input_ids.shape[1])  # every layer wrote positions pos .. pos + T - 1
    return model.lm_head(model.norm(x[:, -1])).float()  # (B, vocab): one position through the head
    ### END SOLUTION
    ### BEGIN SHIPPED
    # x = model.embed(input_ids)  # (B, T, C): the new tokens only; the cache stands in for the rest
    # for i, layer in enumerate(model.layers):
    #     x = x + cached_attention(layer.attn, layer.attn_norm(x), cache, i, model.rope_cos, model.rope_sin)
    #     x = x + layer.mlp(layer.mlp_norm(x))
    #     cache.advance(input_ids.shape[1])  # layer i has stored the new tokens' keys and values
    # logits = model.lm_head(model.norm(x)).float()  # (B, T, vocab_size)
    # return logits[:, -1]  # the next token's logits
    ### END SHIPPED


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
    """Bytes of a model's KV cache holding seq_len tokens of each of batch sequences, stored in dtype.

    Args:    config: a ModelConfig;  seq_len: an int >= 0;  batch: a positive int;  dtype: the cache's torch dtype
    Returns: int (0 for no tokens), counted from config's sizes and dtype alone: no cache is made (the checks refuse
             it, and compare the count with what a KVCache of that many tokens allocates)
    Raises:  ValueError if seq_len is not an int >= 0, batch not a positive int, or dtype not a torch.dtype
    Example:
        >>> from kvlib.core.configs import real_model; kv_cache_bytes(real_model("Llama-2-7B").config, 1) // 1024
        512
    """
    ### BEGIN SOLUTION
    per_token = 2 * config.n_layers * config.n_kv_heads * config.head_dim * dtype.itemsize  # K and V, every layer
    return per_token * seq_len * batch
    ### END SOLUTION


@exercise("4.5", validate=inputs.check_generate_cached)
def generate_cached(
    model,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
    on_token=None,
    cache: KVCache | None = None,
) -> torch.Tensor:
    """generate (Exercise 2.2) with a KV cache: no token's keys and values are computed twice.

    Args:    model, input_ids, max_new_tokens, temperature, generator, on_token: as in generate;  cache: a KVCache
             to reuse, whatever an earlier call left in it, or None for a new one
    Returns: (batch, seq_len + max_new_tokens) torch.long: generate's tokens (greedy, or sampled with the same seed),
             whatever the cache held before; the model runs no token it does not need, each once at most
    Raises:  ValueError as generate, or if the cache is too small for the prompt and the new tokens
    Example:
        >>> from kvlib.core.weights import load_tiny; from kvlib.generation import generate; model, tok = load_tiny()
        >>> ids = torch.tensor([tok.encode("法国的首都是")]); torch.equal(generate_cached(model, ids, 3), generate(model, ids, 3))
        True
    """
    ### BEGIN SOLUTION
    from kvlib.generation import next_token  # noqa: PLC0415 (kept from the stub: Exercise 2.1)

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


@exercise("4.6", validate=inputs.check_sequences_that_fit)
def sequences_that_fit(config, memory_bytes: int, seq_len: int, dtype: torch.dtype = torch.float16) -> int:
    """How many whole sequences of seq_len tokens a model of config decodes at once in memory_bytes, all in dtype.

    A prediction, before the notebook allocates them: everything a batch that size needs must fit.
    Args:    config: a ModelConfig;  memory_bytes, seq_len: positive ints;  dtype: a torch dtype.  Returns: int >= 0
    Raises:  ValueError if config is not a ModelConfig, memory_bytes or seq_len not a positive int, dtype not a dtype
    Example:
        >>> from kvlib.core.configs import real_model; sequences_that_fit(real_model("Llama-2-7B").config, 14 * 10**9, 4096)
        0
    """
    ### BEGIN SOLUTION
    from kvlib.core.model import num_params  # noqa: PLC0415 (not in learners' folders: the stub names no count)

    weights = num_params(config) * dtype.itemsize  # one copy, shared by every sequence of the batch
    return max(0, (memory_bytes - weights) // kv_cache_bytes(config, seq_len, 1, dtype))  # whole sequences
    ### END SOLUTION
