"""Input checks for the exercises, run before the learner's code and before the reference: bad
input gets a ValueError that names the argument, the expected shape or dtype, and what arrived.

One section per notebook; each check takes the arguments of the exercise it guards
(@exercise("X.Y", validate=check_...)). This module sits below the learner's modules: it imports
none of them, and torch only inside the checks that need it, so notebook 01 runs without torch.
"""
from __future__ import annotations

import math

import numpy as np


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
    import torch  # here, not at the top: see the module docstring

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


# ---------------------------------------------------------------------------------------------
# Notebook 03: counting the FLOPs of naive decoding


def check_config(config, *lengths):
    """config is a kvlib ModelConfig; each of lengths a positive int."""
    for field in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "hidden_dim"):
        if not isinstance(getattr(config, field, None), int):
            raise ValueError(f"config must be a kvlib ModelConfig (it has no integer {field}), got {type(config).__name__}")
    for n in lengths:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"sequence lengths must be positive ints, got {n!r}")


def check_length(config, seq_len):
    check_config(config, seq_len)


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
        raise ValueError(f"positions up to {cache.pos + x.shape[1] - 1} run past the rotary table ({rope_cos.shape[0]})")


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


# ---------------------------------------------------------------------------------------------
# Notebook 05: the memory wall (dtype arguments left out default to torch.float16: always valid)

_FLOAT16 = object()  # stands for the default dtype, torch.float16, without importing torch here


def check_dtype(dtype):
    import torch

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
        raise ValueError(f"kv_len ({kv_len}) counts the new tokens too, so it cannot be less than new_tokens ({new_tokens})")


def check_predicted(config, kv_len, batch, dtype, peak_flops, bandwidth):
    check_step(config, 1, kv_len, batch, dtype)
    check_positive(peak_flops=peak_flops, bandwidth=bandwidth)


# ---------------------------------------------------------------------------------------------
# Notebook 06: grouped-query attention


def check_repeat(x, group_size):
    if not _is_tensor(x) or x.dim() != 4:
        raise ValueError(f"x must be keys or values of shape (batch, n_kv_heads, seq_len, head_dim), got {_shape(x)}")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size (query heads per key/value head) must be a positive int, got {group_size!r}")


def check_qkv(q, k, v):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not _is_tensor(t) or t.dim() != 4:
            what = "(batch, n_heads, seq_len, head_dim)" if name == "q" else "(batch, n_kv_heads, kv_len, head_dim)"
            raise ValueError(f"{name} must have shape {what}, got {_shape(t)}")
    if k.shape != v.shape:
        raise ValueError(f"k {_shape(k)} and v {_shape(v)} must have the same shape (batch, n_kv_heads, kv_len, head_dim)")
    (B, H, T, D), (B_kv, H_kv, S, D_kv) = q.shape, k.shape
    if (B, D) != (B_kv, D_kv):
        raise ValueError(f"q {_shape(q)} and k {_shape(k)} must agree on batch (dim 0) and head_dim (dim 3)")
    if H % H_kv:
        raise ValueError(f"q has {H} heads and k {H_kv}: n_heads must be a multiple of n_kv_heads (q {_shape(q)}, k {_shape(k)})")
    if S < T:
        raise ValueError(f"{T} queries need at least {T} keys (the queries are the last T of the kv_len positions), got k {_shape(k)}")


def check_pool(w, n_heads, n_kv_heads):
    for name, n in (("n_heads", n_heads), ("n_kv_heads", n_kv_heads)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{name} must be a positive int, got {n!r}")
    if not _is_tensor(w) or w.dim() != 2:
        raise ValueError(f"w must be a k_proj or v_proj weight of shape (n_heads * head_dim, d_model), got {_shape(w)}")
    if w.shape[0] % n_heads:
        raise ValueError(f"w has {w.shape[0]} rows, not a multiple of n_heads={n_heads}: expected (n_heads * head_dim, d_model)")
    if n_heads % n_kv_heads:
        raise ValueError(f"n_heads={n_heads} is not a multiple of n_kv_heads={n_kv_heads}: every group needs the same size")


def check_to_gqa(model, n_kv_heads, pool=None):
    from kvlib.core.model import Decoder  # torch: imported here, not at the top

    if not isinstance(model, Decoder):
        raise ValueError(f"model must be a kvlib Decoder, got a {type(model).__name__}")
    have = model.config.n_kv_heads
    if isinstance(n_kv_heads, bool) or not isinstance(n_kv_heads, int) or n_kv_heads < 1 or have % n_kv_heads:
        divisors = [d for d in range(1, have + 1) if have % d == 0]
        raise ValueError(f"the model has {have} key/value heads: n_kv_heads must divide it, one of {divisors}; got {n_kv_heads!r}")
