"""The waste (notebook 03-recompute): how much work naive decoding does, and how much is repeated.

Naive decoding runs the whole sequence again for every new token, although the keys and values
of earlier positions never change (the causal mask is why). We count matrix-multiply FLOPs,
2 per multiply-add, as torch.utils.flop_counter does; norms, rotary and softmax are left out
(they are a few percent of the work). Attention scores count the full (T, S) matrix, as SDPA
computes it, masked entries included.
"""

from __future__ import annotations

from kvlib.core.flops import forward_flops_counted
from kvlib.course import inputs
from kvlib.course.exercises import exercise

# ---------------------------------------------------------------------------------------------
# Measuring (no exercise): count what torch actually multiplies


def measured_forward_flops(model, seq_len: int, batch: int = 1) -> int:
    """Matrix-multiply FLOPs of one forward pass over seq_len tokens, counted by torch itself (kvlib.core.flops)."""
    return forward_flops_counted(model, seq_len, batch)


def naive_decode_flops(config, prompt_len: int, max_new_tokens: int) -> list[int]:
    """FLOPs of each step of naive decoding: step i runs a forward over prompt_len + i tokens."""
    return [forward_flops(config, prompt_len + i) for i in range(max_new_tokens)]


# ---------------------------------------------------------------------------------------------
# Exercise 3.1


@exercise("3.1", validate=inputs.check_length)
def forward_flops(config, seq_len: int) -> int:
    """Matrix-multiply FLOPs of one forward pass of the decoder over seq_len tokens (batch 1).

    Count 2 FLOPs per multiply-add. Per layer: the projections q (d_model -> n_heads*head_dim),
    k and v (d_model -> n_kv_heads*head_dim each), o (n_heads*head_dim -> d_model), the MLP's
    three (d_model <-> hidden_dim) matrices; attention's q @ k^T and probs @ v over the full
    (seq_len, seq_len) score matrix. Then the lm_head (d_model -> vocab_size) for every position.
    Example: forward_flops(config, 1) == 2 * (weights in matrices) + 4 * n_layers * n_heads * head_dim

    Hints (reference solution: 6 lines):
      1. A (T, m) @ (m, n) matmul costs 2 * T * m * n FLOPs.
      2. q @ k^T costs 2 * T * S * head_dim per head, and so does probs @ v.
    """
    raise NotImplementedError("Exercise 3.1 (notebooks/03-recompute): forward_flops")


# ---------------------------------------------------------------------------------------------
# Exercise 3.2


@exercise("3.2", validate=inputs.check_length)
def new_token_flops(config, kv_len: int) -> int:
    """FLOPs really needed for one new token at position kv_len - 1, if earlier keys and values were kept.

    The new token goes through every projection and the lm_head once, and its one query meets
    all kv_len keys: attention costs 2 * kv_len * head_dim per head, twice (scores and values).
    Example: new_token_flops(config, 1) == forward_flops(config, 1)

    Hints (reference solution: 5 lines):
      1. It is forward_flops with seq_len 1, except that the one query sees kv_len keys.
    """
    raise NotImplementedError("Exercise 3.2 (notebooks/03-recompute): new_token_flops")


# ---------------------------------------------------------------------------------------------
# Exercise 3.3


@exercise("3.3", validate=inputs.check_generation_length)
def generation_flops(config, prompt_len: int, max_new_tokens: int) -> tuple[int, int]:
    """FLOPs of a whole generation of max_new_tokens after a prompt of prompt_len: naive, and with
    every earlier key and value kept.

    Naive: step i (i = 0 .. max_new_tokens - 1) runs a forward over prompt_len + i tokens.
    Kept: step 0 is the prefill, a forward over the whole prompt (nothing is kept yet); step i >= 1
    runs only the token chosen at step i - 1, whose query meets every key up to and including its own.
    Returns: (naive, kept), two ints.
    Example: generation_flops(config, 5, 1) == (forward_flops(config, 5), forward_flops(config, 5))

    Hints (reference solution: 3 lines):
      1. Reuse forward_flops (Exercise 3.1) and new_token_flops (Exercise 3.2).
      2. At step i >= 1 the new token sits at position prompt_len + i - 1: how many keys does it see?
    """
    raise NotImplementedError("Exercise 3.3 (notebooks/03-recompute): generation_flops")
