"""Input checks for the exercises, run before the learner's code and before the reference: bad
input gets a ValueError that names the argument, the expected shape or dtype, and what arrived.

One section per notebook; each check takes the arguments of the exercise it guards
(@exercise("X.Y", validate=check_...)); some shipped functions call one too (kvlib.kv_cache.prefill).
Every message is in the learner's language (KVLIB_LANG): kvlib/app/translate.py collects each raise's
message for the catalogue, and the last section makes each public function raise it translated.
This module sits below the learner's modules: it imports none of them, and torch only inside the
checks that need it, so notebook 01 runs without torch.
"""

from __future__ import annotations

import functools
import inspect
import math

import numpy as np

from kvlib.course import i18n


def float_array(name: str, x, *, ndim: int | None = None, min_ndim: int | None = None) -> np.ndarray:
    """Check that x is a real-valued numpy array of the given rank; return it unchanged."""
    if not isinstance(x, np.ndarray):
        raise ValueError(f"{name} must be a numpy array, got {type(x).__name__}")
    if not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)):
        raise ValueError(f"{name} must hold real numbers, got dtype {x.dtype}")
    if ndim is not None and x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} axes, got shape {x.shape}")
    if min_ndim is not None and x.ndim < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} axes, got shape {x.shape}")
    return x


def positive_int(name: str, n) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"{name} must be a positive integer, got {n!r}")
    return int(n)


def _is_tensor(x) -> bool:
    import torch  # noqa: PLC0415 (start-up time: notebook 01 runs without torch)

    return isinstance(x, torch.Tensor)


def _shape(t) -> str:
    return str(tuple(t.shape)) if _is_tensor(t) else f"a {type(t).__name__}"


# ---------------------------------------------------------------------------------------------
# Notebook 01: attention by hand (numpy)


def check_scores(scores):
    float_array("scores", scores, min_ndim=1)


def check_attend(q, k, v, scale=None):
    float_array("q", q, ndim=1)
    float_array("k", k, ndim=2)
    float_array("v", v, ndim=2)
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(f"k must be (kv_len, {q.shape[-1]}) to match q of shape {q.shape}, got {k.shape}")
    if v.shape[0] != k.shape[0]:
        raise ValueError(f"v must have one row per key ({k.shape[0]}), got shape {v.shape}")


def check_causal_mask(seq_len, kv_len):
    positive_int("seq_len", seq_len)
    positive_int("kv_len", kv_len)
    if seq_len > kv_len:
        raise ValueError(f"seq_len ({seq_len}) new queries cannot outnumber kv_len ({kv_len}) keys")


def check_self_attention(q, k, v):
    float_array("q", q, min_ndim=2)
    float_array("k", k, ndim=q.ndim)
    float_array("v", v, ndim=q.ndim)
    T, D = q.shape[-2:]
    S = k.shape[-2]
    if k.shape[:-2] != q.shape[:-2] or k.shape[-1] != D:
        raise ValueError(f"k must be (..., kv_len, {D}) with q's leading axes {q.shape[:-2]}, got {k.shape}")
    if v.shape[:-1] != k.shape[:-1]:
        raise ValueError(f"v must be {k.shape[:-1]} + (d_v,) to match k, got {v.shape}")
    if T > S:
        raise ValueError(f"q has {T} queries but only {S} keys: queries are the last seq_len of kv_len positions")


# ---------------------------------------------------------------------------------------------
# Notebook 02: generating text


def check_logits(logits, temperature=0.0, generator=None):
    if not _is_tensor(logits) or logits.dim() != 2 or not logits.dtype.is_floating_point:
        shape = tuple(logits.shape) if _is_tensor(logits) else type(logits).__name__
        raise ValueError(f"logits must be a float tensor of shape (batch, vocab_size), got {shape}")
    if not isinstance(temperature, (int, float)) or temperature < 0:
        raise ValueError(f"temperature must be a number >= 0 (0 means greedy), got {temperature!r}")


def check_generate(model, input_ids, max_new_tokens, temperature=0.0, generator=None, on_token=None):
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
    model.check_input(input_ids)  # (batch, seq_len) integer ids within the vocabulary
    T, limit = input_ids.shape[1], model.config.max_seq_len
    if T + max_new_tokens > limit:
        raise ValueError(
            f"a prompt of {T} tokens plus max_new_tokens={max_new_tokens} runs past the model's "
            f"max_seq_len={limit}: ask for at most {limit - T} new tokens"
        )


def check_measure(model, input_ids, max_new_tokens):
    check_generate(model, input_ids, max_new_tokens)
    if max_new_tokens < 2:
        raise ValueError("time per output token needs max_new_tokens >= 2 (one prefill, then decode steps)")


def check_temper(probs, temperature):
    """probs (..., vocab_size) float, rows >= 0 summing to 1; temperature a number >= 0."""
    if not _is_tensor(probs) or probs.dim() < 1 or not probs.dtype.is_floating_point:
        raise ValueError(f"probs must be a float tensor (..., vocab_size), got {_shape(probs)}")
    if not bool((probs >= 0).all()) or not bool(((probs.double().sum(-1) - 1).abs() < 1e-3).all()):
        raise ValueError(
            "probs must be a distribution: every entry >= 0 and every row summing to 1 (softmax of logits)"
        )
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature >= 0:
        raise ValueError(f"temperature must be a number >= 0 (0 means greedy), got {temperature!r}")


def check_attention_block(attn, h, cos, sin, self_attention=None):
    """attn one layer's Attention, not grouped; h (batch, seq_len, d_model) float32; cos, sin (seq_len, head_dim);
    self_attention a function (Exercise 1.4's contract)."""
    C = getattr(getattr(attn, "q_proj", None), "in_features", None)
    if C is None or not hasattr(attn, "head_dim"):
        raise ValueError(f"attn must be one layer's Attention (model.layers[i].attn), got {type(attn).__name__}")
    if attn.n_kv_heads != attn.n_heads:
        raise ValueError(
            f"this layer has {attn.n_heads} query heads sharing {attn.n_kv_heads} key/value heads: grouped heads "
            "wait for notebook 06; Exercise 2.4 takes a layer with n_kv_heads == n_heads"
        )
    if not _is_tensor(h) or h.dim() != 3 or h.shape[-1] != C or h.dtype != attn.q_proj.weight.dtype:
        raise ValueError(
            f"h must be a {attn.q_proj.weight.dtype} tensor (batch, seq_len, {C}), got {_shape(h)}"
            + (f" of {h.dtype}" if _is_tensor(h) else "")
        )
    for name, t in (("cos", cos), ("sin", sin)):
        if not _is_tensor(t) or tuple(t.shape) != (h.shape[1], attn.head_dim):
            raise ValueError(
                f"{name} must be ({h.shape[1]}, {attn.head_dim}): the rows of the rotary table at h's positions, got {_shape(t)}"
            )
    if self_attention is not None and not callable(self_attention):
        raise ValueError(
            f"self_attention must be a function of q, k, v (Exercise 1.4's contract), got {type(self_attention).__name__}"
        )


def check_rms_norm(x, weight, eps=1e-5):
    """x (..., d_model) float; weight (d_model,); eps a positive number."""
    if not _is_tensor(x) or x.dim() < 1 or not x.dtype.is_floating_point:
        raise ValueError(f"x must be a float tensor (..., d_model), got {_shape(x)}")
    if not _is_tensor(weight) or tuple(weight.shape) != (x.shape[-1],):
        raise ValueError(
            f"weight must be ({x.shape[-1]},), one scale per feature of x {tuple(x.shape)}, got {_shape(weight)}"
        )
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
        raise ValueError(f"eps must be a number > 0 (it keeps an all-zero row finite), got {eps!r}")


def check_swiglu(x, w_gate, w_up, w_down):
    """x (..., d_model) float; w_gate, w_up (hidden_dim, d_model); w_down (d_model, hidden_dim)."""
    if not _is_tensor(x) or x.dim() < 1 or not x.dtype.is_floating_point:
        raise ValueError(f"x must be a float tensor (..., d_model), got {_shape(x)}")
    C = x.shape[-1]
    if not _is_tensor(w_gate) or w_gate.dim() != 2 or w_gate.shape[1] != C:
        raise ValueError(f"w_gate must be (hidden_dim, {C}), as nn.Linear stores it (out, in), got {_shape(w_gate)}")
    hidden = w_gate.shape[0]
    if not _is_tensor(w_up) or tuple(w_up.shape) != (hidden, C):
        raise ValueError(f"w_up must be ({hidden}, {C}), the shape of w_gate, got {_shape(w_up)}")
    if not _is_tensor(w_down) or tuple(w_down.shape) != (C, hidden):
        raise ValueError(f"w_down must be ({C}, {hidden}), from hidden_dim back to d_model, got {_shape(w_down)}")


# ---------------------------------------------------------------------------------------------
# Notebook 03: counting the FLOPs of naive decoding


def check_config(config, *lengths):
    """config is a kvlib ModelConfig; each of lengths a positive int."""
    for field in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "hidden_dim"):
        if not isinstance(getattr(config, field, None), int):
            raise ValueError(
                f"config must be a kvlib ModelConfig (it has no integer {field}), got {type(config).__name__}"
            )
    for n in lengths:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"sequence lengths must be positive ints, got {n!r}")


def check_length(config, seq_len):
    check_config(config, seq_len)


def check_generation_length(config, prompt_len, max_new_tokens):
    check_config(config, prompt_len, max_new_tokens)


# ---------------------------------------------------------------------------------------------
# Notebook 04: the KV cache


def check_update(cache, layer, k_new, v_new):
    if not 0 <= layer < cache.n_layers:
        raise ValueError(f"layer must be in [0, {cache.n_layers}), got {layer}")
    B, H_kv, _, D = cache.k.shape[1:]
    for name, t in (("k_new", k_new), ("v_new", v_new)):
        if not _is_tensor(t) or t.dim() != 4 or (t.shape[0], t.shape[1], t.shape[3]) != (B, H_kv, D):
            shape = tuple(t.shape) if _is_tensor(t) else type(t).__name__
            raise ValueError(f"{name} must be (batch={B}, n_kv_heads={H_kv}, seq_len, head_dim={D}), got {shape}")
    if k_new.shape != v_new.shape:
        raise ValueError(f"k_new {tuple(k_new.shape)} and v_new {tuple(v_new.shape)} must have the same shape")
    T = k_new.shape[2]
    if cache.pos + T > cache.max_seq_len:
        raise ValueError(
            f"the cache holds max_seq_len={cache.max_seq_len} tokens and already has {cache.pos}: "
            f"{T} more do not fit. Call cache.reset() for a new prompt, or make a larger KVCache"
        )


def check_cached_attention(attn, x, cache, layer, rope_cos, rope_sin):
    if not _is_tensor(x) or x.dim() != 3:
        raise ValueError(f"x must be (batch, seq_len, d_model), got {getattr(x, 'shape', type(x).__name__)}")
    if cache.pos + x.shape[1] > rope_cos.shape[0]:
        raise ValueError(
            f"positions up to {cache.pos + x.shape[1] - 1} run past the rotary table ({rope_cos.shape[0]})"
        )


def check_prefill(model, input_ids, cache):
    model.check_input(input_ids, cache.pos)
    if input_ids.shape[0] != cache.k.shape[1]:
        raise ValueError(f"the cache was made for batch {cache.k.shape[1]}, input_ids has batch {input_ids.shape[0]}")
    if cache.pos + input_ids.shape[1] > cache.max_seq_len:
        raise ValueError(
            f"{input_ids.shape[1]} more token(s) do not fit: the cache holds max_seq_len={cache.max_seq_len} tokens "
            f"and already has {cache.pos}. Call cache.reset() for a new prompt, or make a larger KVCache"
        )


def check_decode(model, token, cache):
    if not _is_tensor(token) or token.dim() != 1:
        raise ValueError(f"token must be (batch,) token ids, got {getattr(token, 'shape', type(token).__name__)}")
    if cache.pos == 0:
        raise ValueError("decode_step needs a filled cache: run prefill (Exercise 4.3) on the prompt first")
    check_prefill(model, token[:, None], cache)


def check_generate_cached(model, input_ids, max_new_tokens, temperature=0.0, generator=None, on_token=None, cache=None):
    check_generate(model, input_ids, max_new_tokens, temperature, generator, on_token)


def check_sequences_that_fit(config, memory_bytes, seq_len, dtype=...):  # ...: left out, torch.float16
    check_config(config, seq_len)
    if isinstance(memory_bytes, bool) or not isinstance(memory_bytes, int) or memory_bytes < 1:
        raise ValueError(f"memory_bytes must be a positive int (bytes), got {memory_bytes!r}")
    if dtype is not ...:
        check_dtype(dtype)


# ---------------------------------------------------------------------------------------------
# Notebook 05: the memory wall (dtype arguments left out default to torch.float16: always valid)

_FLOAT16 = object()  # stands for the default dtype, torch.float16, without importing torch here


def check_dtype(dtype):
    import torch  # noqa: PLC0415 (start-up time: notebook 01 runs without torch)

    if dtype is not _FLOAT16 and not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtype must be a torch.dtype such as torch.float16, got {dtype!r}")


def check_positive(**values):
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 or math.isinf(v):
            raise ValueError(f"{name} must be a positive number, got {v!r}")


def check_count(name, n, minimum=1):
    if isinstance(n, bool) or not isinstance(n, int) or n < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {n!r}")


def check_matmul(m, k, n, dtype=_FLOAT16):
    for name, v in (("m", m), ("k", k), ("n", n)):
        check_count(name, v)
    check_dtype(dtype)


def check_roofline(flops, bytes_moved, peak_flops, bandwidth):
    check_positive(peak_flops=peak_flops, bandwidth=bandwidth)
    for name, v in (("flops", flops), ("bytes_moved", bytes_moved)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            raise ValueError(f"{name} must be a non-negative number, got {v!r}")


def check_ridge_batch(k, n, peak_flops, bandwidth, dtype=_FLOAT16):
    check_count("k", k)
    check_count("n", n)
    check_positive(peak_flops=peak_flops, bandwidth=bandwidth)
    check_dtype(dtype)


def check_kv_cache_bytes(config, seq_len, batch=1, dtype=_FLOAT16):
    check_config(config)
    check_count("seq_len", seq_len, 0)
    check_count("batch", batch)
    check_dtype(dtype)


def check_step(config, new_tokens, kv_len, batch=1, dtype=_FLOAT16):
    check_config(config)
    check_count("new_tokens", new_tokens)
    check_count("kv_len", kv_len)
    check_count("batch", batch)
    check_dtype(dtype)
    if new_tokens > kv_len:
        raise ValueError(
            f"kv_len ({kv_len}) counts the new tokens too, so it cannot be less than new_tokens ({new_tokens})"
        )


def check_predicted(config, kv_len, batch, dtype, peak_flops, bandwidth):
    check_step(config, 1, kv_len, batch, dtype)
    check_positive(peak_flops=peak_flops, bandwidth=bandwidth)


def check_compute_bound(config, kv_len, peak_flops, bandwidth, dtype=_FLOAT16):
    check_predicted(config, kv_len, 1, dtype, peak_flops, bandwidth)


# ---------------------------------------------------------------------------------------------
# Notebook 06: grouped-query attention


def check_repeat(x, group_size):
    if not _is_tensor(x) or x.dim() != 4:
        raise ValueError(f"x must be keys or values of shape (batch, n_kv_heads, seq_len, head_dim), got {_shape(x)}")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size (query heads per key/value head) must be a positive int, got {group_size!r}")


def check_qkv(q, k, v):
    # each message whole but the names and shapes, so that the catalogue translates it (not "{0} must have shape {1}")
    if not _is_tensor(q) or q.dim() != 4:
        raise ValueError(f"q must have shape (batch, n_heads, seq_len, head_dim), got {_shape(q)}")
    for name, t in (("k", k), ("v", v)):
        if not _is_tensor(t) or t.dim() != 4:
            raise ValueError(f"{name} must have shape (batch, n_kv_heads, kv_len, head_dim), got {_shape(t)}")
    if k.shape != v.shape:
        raise ValueError(
            f"k {_shape(k)} and v {_shape(v)} must have the same shape (batch, n_kv_heads, kv_len, head_dim)"
        )
    (B, H, T, D), (B_kv, H_kv, S, D_kv) = q.shape, k.shape
    if (B, D) != (B_kv, D_kv):
        raise ValueError(f"q {_shape(q)} and k {_shape(k)} must agree on batch (dim 0) and head_dim (dim 3)")
    if H % H_kv:
        raise ValueError(
            f"q has {H} heads and k {H_kv}: n_heads must be a multiple of n_kv_heads (q {_shape(q)}, k {_shape(k)})"
        )
    if S < T:
        raise ValueError(
            f"{T} queries need at least {T} keys (the queries are the last T of the kv_len positions), got k {_shape(k)}"
        )


def check_pool(w, n_heads, n_kv_heads):
    for name, n in (("n_heads", n_heads), ("n_kv_heads", n_kv_heads)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{name} must be a positive int, got {n!r}")
    if not _is_tensor(w) or w.dim() != 2:
        raise ValueError(f"w must be a k_proj or v_proj weight of shape (n_heads * head_dim, d_model), got {_shape(w)}")
    if w.shape[0] % n_heads:
        raise ValueError(
            f"w has {w.shape[0]} rows, not a multiple of n_heads={n_heads}: expected (n_heads * head_dim, d_model)"
        )
    if n_heads % n_kv_heads:
        raise ValueError(
            f"n_heads={n_heads} is not a multiple of n_kv_heads={n_kv_heads}: every group needs the same size"
        )


def check_to_gqa(model, n_kv_heads, pool=None):
    from kvlib.core.model import Decoder  # noqa: PLC0415 (start-up time: notebook 01 runs without torch)

    if not isinstance(model, Decoder):
        raise ValueError(f"model must be a kvlib Decoder, got a {type(model).__name__}")
    have = model.config.n_kv_heads
    if isinstance(n_kv_heads, bool) or not isinstance(n_kv_heads, int) or n_kv_heads < 1 or have % n_kv_heads:
        divisors = [d for d in range(1, have + 1) if have % d == 0]
        raise ValueError(
            f"the model has {have} key/value heads: n_kv_heads must divide it, one of {divisors}; got {n_kv_heads!r}"
        )


def check_speedup(config, n_kv_heads, kv_len, batch=1):
    check_config(config)
    check_count("kv_len", kv_len)
    check_count("batch", batch)
    if isinstance(n_kv_heads, bool) or not isinstance(n_kv_heads, int) or n_kv_heads < 1 or config.n_heads % n_kv_heads:
        divisors = [d for d in range(1, config.n_heads + 1) if config.n_heads % d == 0]
        raise ValueError(
            f"config has {config.n_heads} query heads: n_kv_heads must divide it, one of {divisors}; got {n_kv_heads!r}"
        )


# ---------------------------------------------------------------------------------------------
# Notebook 07: serving many requests (paged KV cache, continuous batching)


def check_block_pool_size(n_blocks, block_size):
    """A pool of n_blocks blocks of block_size token slots: both positive, block_size a power of two."""
    positive_int("n_blocks", n_blocks)
    positive_int("block_size", block_size)
    if block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two (a slot is block * block_size + offset), got {block_size}")


def check_block(pool, block, *rest):
    if isinstance(block, bool) or not isinstance(block, int) or not 0 <= block < pool.n_blocks:
        raise ValueError(f"block must be an int in [0, {pool.n_blocks}) (the pool's n_blocks), got {block!r}")


def check_append(table, pool, n=1):
    positive_int("n", n)
    if table.block_size != pool.block_size:
        raise ValueError(f"the table's block_size ({table.block_size}) differs from the pool's ({pool.block_size})")


def check_utilisation(lengths, block_size):
    positive_int("block_size", block_size)
    if isinstance(lengths, (str, bytes)) or not hasattr(lengths, "__len__") or len(lengths) == 0:
        raise ValueError(f"lengths must be a non-empty list of token counts, got {lengths!r}")
    for n in lengths:  # one message whole, so that the catalogue translates it (not "every length" as a name)
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"every length must be a positive integer, got {n!r}")


def check_paged(q, pool, layer, tables):
    if not _is_tensor(q) or q.dim() != 4:
        raise ValueError(f"q must be (batch, n_heads, seq_len, head_dim), got {_shape(q)}")
    if len(tables) != q.shape[0]:
        raise ValueError(f"one block table per row of q: q has batch {q.shape[0]}, got {len(tables)} tables")
    if not 0 <= layer < pool.k.shape[0]:
        raise ValueError(f"layer must be in [0, {pool.k.shape[0]}), got {layer}")
    if q.shape[1] % pool.k.shape[2] or q.shape[3] != pool.k.shape[4]:
        raise ValueError(
            f"q {_shape(q)} does not fit the pool's {pool.k.shape[2]} key/value heads of head_dim {pool.k.shape[4]}"
        )
    for i, t in enumerate(tables):
        if t.length < q.shape[2] or len(t.blocks) * pool.block_size < t.length:
            raise ValueError(
                f"table {i} holds {t.length} tokens in {len(t.blocks)} blocks: it must hold the {q.shape[2]} new ones, and fit its blocks"
            )


def check_copy_on_write(pool, table, index):
    if isinstance(index, bool) or not isinstance(index, int) or not -len(table.blocks) <= index < len(table.blocks):
        raise ValueError(f"index must point into the table's {len(table.blocks)} blocks, got {index!r}")


# ---------------------------------------------------------------------------------------------
# Notebook 08: smaller caches


def check_quantize(x, dim):
    if not _is_tensor(x) or not x.dtype.is_floating_point or x.dim() == 0:
        got = f"{_shape(x)} {getattr(x, 'dtype', '')}".rstrip()
        raise ValueError(f"x must be a floating-point tensor with at least one axis, got {got}")
    if isinstance(dim, bool) or not isinstance(dim, int) or not -x.dim() <= dim < x.dim():
        raise ValueError(f"dim must be an int axis of x (shape {_shape(x)}), got {dim!r}")


def check_int8_attention(q, k_values, k_scale, v_values, v_scale, kv_len):
    import torch  # noqa: PLC0415 (start-up time: notebook 01 runs without torch)

    if not _is_tensor(q) or q.dim() != 4:
        raise ValueError(f"q must be (batch, n_heads, seq_len, head_dim), got {_shape(q)}")
    if not _is_tensor(k_values) or k_values.dim() != 5 or k_values.dtype != torch.int8:
        raise ValueError(
            f"k_values must be int8 (batch, n_kv_heads, n_groups, group, head_dim), got {_shape(k_values)} "
            f"{getattr(k_values, 'dtype', '')}"
        )
    B, H_kv, n_groups, group, D = k_values.shape
    if not _is_tensor(k_scale) or tuple(k_scale.shape) != (B, H_kv, n_groups, 1, D):
        raise ValueError(
            f"k_scale must be (batch, n_kv_heads, n_groups, 1, head_dim) = {(B, H_kv, n_groups, 1, D)}: one "
            f"scale per channel per group of tokens, got {_shape(k_scale)}"
        )
    if (
        not _is_tensor(v_values)
        or v_values.dtype != torch.int8
        or v_values.dim() != 4
        or tuple(v_values.shape[:2]) != (B, H_kv)
        or v_values.shape[3] != D
    ):
        raise ValueError(
            f"v_values must be int8 (batch={B}, n_kv_heads={H_kv}, kv_len, head_dim={D}), got {_shape(v_values)}"
        )
    if not _is_tensor(v_scale) or tuple(v_scale.shape) != (*v_values.shape[:3], 1):
        raise ValueError(
            f"v_scale must be (batch, n_kv_heads, kv_len, 1) = {(*v_values.shape[:3], 1)}: one scale per token, "
            f"got {_shape(v_scale)}"
        )
    if (
        isinstance(kv_len, bool)
        or not isinstance(kv_len, int)
        or not q.shape[2] <= kv_len <= min(n_groups * group, v_values.shape[2])
    ):
        raise ValueError(
            f"kv_len must be an int from seq_len={q.shape[2]} to the tokens stored "
            f"({min(n_groups * group, v_values.shape[2])}), got {kv_len!r}"
        )
    if q.shape[0] != B or q.shape[3] != D or q.shape[1] % H_kv:
        raise ValueError(
            f"q {_shape(q)} must match the cache's batch {B}, head_dim {D} and a multiple of its {H_kv} key/value heads"
        )


def check_sink_update(cache, layer, k_new, v_new):
    if not 0 <= layer < cache.n_layers:
        raise ValueError(f"layer must be in [0, {cache.n_layers}), got {layer}")
    B, H_kv, _, D = cache.k.shape[1:]
    for name, t in (("k_new", k_new), ("v_new", v_new)):
        if not _is_tensor(t) or t.dim() != 4 or (t.shape[0], t.shape[1], t.shape[3]) != (B, H_kv, D):
            raise ValueError(f"{name} must be (batch={B}, n_kv_heads={H_kv}, seq_len, head_dim={D}), got {_shape(t)}")
    T = k_new.shape[2]
    if T > 1 and cache.pos + T > cache.capacity:
        raise ValueError(
            f"{T} tokens at once from position {cache.pos} would evict keys that the earlier of them still "
            f"need (capacity {cache.capacity}): feed tokens past the capacity one at a time"
        )


def check_cache_positions(n_seen, n_sink, window):
    for name, n, low in (("n_seen", n_seen, 1), ("n_sink", n_sink, 0), ("window", window, 1)):
        if isinstance(n, bool) or not isinstance(n, int) or n < low:
            raise ValueError(f"{name} must be an int >= {low}, got {n!r}")


def check_mla(q_nope, q_rope, latent, k_rope, w_uk, w_uv):
    # one message each, whole but the shape, so that the catalogue translates it (not "{0} must be {1}, got {2}")
    if not _is_tensor(q_nope) or q_nope.dim() != 4:
        raise ValueError(f"q_nope must be (batch, n_heads, seq_len, nope_dim), got {_shape(q_nope)}")
    if not _is_tensor(q_rope) or q_rope.dim() != 4:
        raise ValueError(f"q_rope must be (batch, n_heads, seq_len, rope_dim), got {_shape(q_rope)}")
    if not _is_tensor(latent) or latent.dim() != 3:
        raise ValueError(f"latent must be (batch, kv_len, kv_rank), got {_shape(latent)}")
    if not _is_tensor(k_rope) or k_rope.dim() != 3:
        raise ValueError(f"k_rope must be (batch, kv_len, rope_dim), got {_shape(k_rope)}")
    if not _is_tensor(w_uk) or w_uk.dim() != 3:
        raise ValueError(f"w_uk must be (n_heads, nope_dim, kv_rank), got {_shape(w_uk)}")
    if not _is_tensor(w_uv) or w_uv.dim() != 3:
        raise ValueError(f"w_uv must be (n_heads, v_dim, kv_rank), got {_shape(w_uv)}")
    (B, H, T, Dn), Dr, (S, r) = q_nope.shape, q_rope.shape[-1], latent.shape[1:]
    if tuple(q_rope.shape[:3]) != (B, H, T):
        raise ValueError(f"q_rope {_shape(q_rope)} must share q_nope's (batch, n_heads, seq_len) = {(B, H, T)}")
    if latent.shape[0] != B or tuple(k_rope.shape) != (B, S, Dr):
        raise ValueError(
            f"latent {_shape(latent)} and k_rope {_shape(k_rope)} must be (batch={B}, kv_len, ...) with "
            f"k_rope (batch, kv_len={S}, rope_dim={Dr})"
        )
    if tuple(w_uk.shape) != (H, Dn, r) or w_uv.shape[0] != H or w_uv.shape[2] != r:
        raise ValueError(
            f"w_uk must be (n_heads={H}, nope_dim={Dn}, kv_rank={r}) and w_uv (n_heads={H}, v_dim, kv_rank={r}), "
            f"got {_shape(w_uk)} and {_shape(w_uv)}"
        )
    if S < T:
        raise ValueError(f"{T} queries need at least {T} cached tokens, got latent {_shape(latent)}")


def check_int8_bytes(config, group=32, scale_bytes=4):
    if not all(hasattr(config, a) for a in ("n_layers", "n_kv_heads", "head_dim")):
        raise ValueError(f"config must be a ModelConfig (n_layers, n_kv_heads, head_dim), got {type(config).__name__}")
    positive_int("group", group)
    positive_int("scale_bytes", scale_bytes)


def check_mla_flops(path, kv_len, new_tokens=1, **sizes):
    if path not in ("reconstruct", "absorbed"):
        raise ValueError(f"path must be 'reconstruct' (8.5) or 'absorbed' (8.6), got {path!r}")
    positive_int("kv_len", kv_len)
    positive_int("new_tokens", new_tokens)
    if new_tokens > kv_len:
        raise ValueError(
            f"new_tokens ({new_tokens}) are among the kv_len ({kv_len}) tokens attended to: at most kv_len"
        )
    wanted = {"n_heads", "nope_dim", "rope_dim", "v_dim", "kv_rank"}
    if set(sizes) != wanted:
        raise ValueError(f"give the MLA sizes {sorted(wanted)} as keywords, got {sorted(sizes)}")
    for name, n in sizes.items():
        positive_int(name, n)


# ---------------------------------------------------------------------------------------------
# Notebook 09: fused attention


def _tile_size(name: str, n) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"{name} must be a positive int (tokens per tile or chunk), got {n!r}")


def check_online_softmax(chunks):
    if not isinstance(chunks, (list, tuple)) or not chunks:
        raise ValueError(f"chunks must be a non-empty list of (scores, values) pairs, got {chunks!r:.60}")
    for i, pair in enumerate(chunks):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2 or not all(_is_tensor(t) for t in pair):
            raise ValueError(f"chunk {i} must be a (scores, values) pair of tensors, got {type(pair).__name__}")
        scores, values = pair
        if scores.dim() < 1 or values.dim() != scores.dim() + 1 or tuple(values.shape[:-1]) != tuple(scores.shape):
            raise ValueError(
                f"chunk {i}: values must be scores' shape plus a head_dim axis, (..., c, head_dim); got scores "
                f"{_shape(scores)} and values {_shape(values)}"
            )
        first = chunks[0]
        if scores.shape[:-1] != first[0].shape[:-1] or values.shape[-1] != first[1].shape[-1]:
            raise ValueError(
                f"chunk {i} {_shape(scores)} / {_shape(values)} must share chunk 0's leading axes and head_dim "
                f"({_shape(first[0])} / {_shape(first[1])}); only the chunk length may differ"
            )


def check_tiled_attention(q, k, v, tile):
    _tile_size("tile", tile)
    if not all(_is_tensor(t) and t.dim() == 4 for t in (q, k, v)):
        raise ValueError(
            f"q, k, v must be (batch, n_heads, tokens, head_dim), got {_shape(q)}, {_shape(k)}, {_shape(v)}"
        )
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape (one value per key), got {_shape(k)} and {_shape(v)}")
    if tuple(q.shape[:2]) != tuple(k.shape[:2]) or q.shape[3] != k.shape[3]:
        raise ValueError(f"q {_shape(q)} must share k's batch, n_heads and head_dim {_shape(k)}")
    if q.shape[2] > k.shape[2]:
        raise ValueError(
            f"{q.shape[2]} queries need at least as many keys (they are the last of the kv_len), got {k.shape[2]}"
        )


def check_merge_partials(outs, lses):
    if not _is_tensor(outs) or not _is_tensor(lses) or outs.dim() < 2 or outs.shape[0] == 0:
        raise ValueError(
            f"outs must be (n_chunks >= 1, ..., head_dim) and lses (n_chunks, ...), got {_shape(outs)}, {_shape(lses)}"
        )
    if tuple(outs.shape[:-1]) != tuple(lses.shape):
        raise ValueError(
            f"lses must be outs' shape without head_dim, {tuple(outs.shape[:-1])}: one log-sum-exp per chunk "
            f"and query, got {_shape(lses)}"
        )


def check_flash_decode(q, k, v, chunk):
    _tile_size("chunk", chunk)
    if not all(_is_tensor(t) and t.dim() == 4 for t in (q, k, v)) or q.shape[2] != 1:
        raise ValueError(
            f"q must be one query (batch, n_heads, 1, head_dim) and k, v (batch, n_kv_heads, kv_len, head_dim), "
            f"got {_shape(q)}, {_shape(k)}, {_shape(v)}"
        )
    if k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3] or q.shape[1] % k.shape[1]:
        raise ValueError(
            f"k and v must have one shape {_shape(k)} / {_shape(v)} matching q {_shape(q)} in batch and head_dim, "
            "with n_heads a multiple of n_kv_heads"
        )


def check_splits(kv_len, n_kv_heads, batch, n_sms, n_splits=1):
    for name, n in (("kv_len", kv_len), ("n_kv_heads", n_kv_heads), ("batch", batch), ("n_sms", n_sms)):
        positive_int(name, n)
    positive_int("n_splits", n_splits)


def check_int8_folded(q, k_values, k_scale, v_values, v_scale, kv_len):
    if k_scale is None or v_scale is None:
        raise ValueError("an int8 cache needs its scales: k_scale and v_scale must be tensors, got None")
    check_int8_attention(q, k_values, k_scale, v_values, v_scale, kv_len)
    if q.shape[2] != 1:
        raise ValueError(f"int8_folded_attention is a decode step: q must hold one query, got {_shape(q)}")


# ---------------------------------------------------------------------------------------------
# Notebook 10: speculative decoding


def _token_list(name, tokens, minimum=0):
    if not isinstance(tokens, (list, tuple)) or not all(
        isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in tokens
    ):
        raise ValueError(f"{name} must be a list of int token ids, got {type(tokens).__name__} {tokens!r:.80}")
    if len(tokens) < minimum:
        raise ValueError(f"{name} must hold at least {minimum} token(s), got {len(tokens)}")


def check_verify(model, cache, last_token, draft):
    _token_list("last_token", [last_token], 1)
    _token_list("draft", draft)
    free, needed = cache.max_seq_len - cache.pos, len(draft) + 1
    if needed > free:
        raise ValueError(
            f"the cache has room for {free} more token(s) (pos {cache.pos}, max_seq_len {cache.max_seq_len}); "
            f"a verify pass over last_token and {len(draft)} drafted token(s) needs {needed}"
        )


def check_speculative_generate(model, drafter, input_ids, max_new_tokens, gamma, eos_token=None, cache=None):
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        raise ValueError(f"gamma (tokens drafted per pass) must be an int >= 1, got {gamma!r}")
    check_count("max_new_tokens", max_new_tokens)
    if not _is_tensor(input_ids) or input_ids.dim() != 2 or input_ids.shape[0] != 1 or input_ids.shape[1] < 1:
        shape = tuple(input_ids.shape) if _is_tensor(input_ids) else type(input_ids).__name__
        raise ValueError(f"input_ids must be one prompt of shape (1, seq_len), got {shape}")
    vocab = getattr(drafter, "vocab_size", None)
    if vocab is not None and vocab != model.config.vocab_size:
        raise ValueError(
            f"the drafter's vocabulary has {vocab} tokens, the model's {model.config.vocab_size}: "
            "a drafter must share the model's tokenizer, or its ids mean other tokens"
        )
    if not callable(getattr(drafter, "propose", None)):
        raise ValueError(f"drafter must have a propose(tokens, k) method, got {type(drafter).__name__}")
    if cache is not None and input_ids.shape[1] + max_new_tokens > cache.max_seq_len:
        raise ValueError(
            f"the cache holds {cache.max_seq_len} tokens, but the prompt ({input_ids.shape[1]}) and "
            f"max_new_tokens ({max_new_tokens}) need {input_ids.shape[1] + max_new_tokens}"
        )


def check_tokens_per_pass(alpha, gamma):
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.integer, np.floating)) or not 0 <= alpha <= 1:
        raise ValueError(f"alpha (a draft's chance of being kept) must be a number in [0, 1], got {alpha!r}")
    if isinstance(gamma, bool) or not isinstance(gamma, (int, np.integer)) or gamma < 0:
        raise ValueError(f"gamma (drafts per pass) must be an int >= 0, got {gamma!r}")


def check_accept_sampled(p, q, draft, generator=None):
    import torch  # noqa: PLC0415 (start-up time: notebook 01 runs without torch)

    _token_list("draft", draft)
    gamma = len(draft)
    for name, x, rows in (("p", p, gamma + 1), ("q", q, gamma)):
        if not _is_tensor(x) or not x.dtype.is_floating_point or x.dim() != 2 or x.shape[0] != rows:
            got = f"{tuple(x.shape)} {x.dtype}" if _is_tensor(x) else type(x).__name__
            raise ValueError(f"{name} must be a float tensor ({rows}, vocab) for {gamma} drafted tokens, got {got}")
        if (x < 0).any() or not torch.allclose(x.sum(-1).double(), torch.ones(rows, dtype=torch.float64), atol=1e-4):
            raise ValueError(f"each row of {name} must be a probability distribution (>= 0, summing to 1)")
    if p.shape[1] != q.shape[1]:
        raise ValueError(f"p and q must share one vocabulary, got {p.shape[1]} and {q.shape[1]} columns")
    if any(not 0 <= t < p.shape[1] for t in draft):
        raise ValueError(f"draft holds ids outside [0, {p.shape[1]}): {list(draft)}")


def check_prompt_lookup(tokens, n, k):
    _token_list("tokens", tokens)
    check_count("n", n)
    check_count("k", k)


# ---------------------------------------------------------------------------------------------
# In the learner's language: each public function above, run by an exercise's wrapper or called by a shipped
# function, raises its ValueError with the message translated (kvlib.course.i18n.translate), from where it was.


def _in_the_learners_language(check):
    @functools.wraps(check)
    def checked(*args, **kwargs):
        try:
            return check(*args, **kwargs)
        except ValueError as err:
            if len(err.args) == 1 and isinstance(err.args[0], str):
                err.args = (i18n.translate(err.args[0]),)  # a Chinese message (a check it called) stays
            raise

    return checked


for _name, _function in list(globals().items()):
    if inspect.isfunction(_function) and _function.__module__ == __name__ and not _name.startswith("_"):
        globals()[_name] = _in_the_learners_language(_function)
