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

    2 FLOPs per multiply-add. Counted: every matrix the tokens pass through (each layer's q, k, v and o
    projections and its MLP's three matrices, then the lm_head, at every position; k and v project to
    n_kv_heads heads) and attention's two products (scores, then weights times values) per QUERY head
    and layer, n_heads of them even when n_kv_heads < n_heads, over the full (seq_len, seq_len) score
    matrix, masked entries included, as SDPA computes them. Not counted: norms, rotary, softmax, the
    embedding lookup.
    Args:    config: a ModelConfig;  seq_len: tokens, >= 1
    Returns: int FLOPs, equal to what measured_forward_flops(model, seq_len) counts with torch
    Raises:  ValueError if seq_len is not a positive int
    Example:
        >>> from kvlib.core.model import ModelConfig, matrix_params
        >>> config = ModelConfig(vocab_size=50)
        >>> forward_flops(config, 1) == 2 * matrix_params(config) + 4 * config.n_layers * config.n_heads * config.head_dim
        True
    """
    ### BEGIN SOLUTION
    C, D, T = config.d_model, config.head_dim, seq_len
    H, H_kv = config.n_heads, config.n_kv_heads
    per_token = C * H * D + 2 * C * H_kv * D + H * D * C + 3 * C * config.hidden_dim  # weights used once per token
    projections = 2 * T * (config.n_layers * per_token + C * config.vocab_size)  # + lm_head
    attention = config.n_layers * 2 * (2 * T * T * D * H)  # q @ k^T and probs @ v, every head
    return projections + attention
    ### END SOLUTION


# ---------------------------------------------------------------------------------------------
# Exercise 3.2


@exercise("3.2", validate=inputs.check_length)
def new_token_flops(config, kv_len: int) -> int:
    """FLOPs one new token at position kv_len - 1 really needs, if every earlier key and value was kept.

    The same counting rules as forward_flops (Exercise 3.1), attention per query head included, for one
    token whose one query meets all kv_len keys (its own included).
    Args:    config: a ModelConfig;  kv_len: keys the new token attends to, >= 1
    Returns: int FLOPs
    Raises:  ValueError if kv_len is not a positive int
    Example:
        >>> from kvlib.core.model import ModelConfig
        >>> config = ModelConfig(vocab_size=50)
        >>> new_token_flops(config, 1) == forward_flops(config, 1), new_token_flops(config, 9) > new_token_flops(config, 8)
        (True, True)
    """
    ### BEGIN SOLUTION
    C, D = config.d_model, config.head_dim
    H, H_kv = config.n_heads, config.n_kv_heads
    per_token = C * H * D + 2 * C * H_kv * D + H * D * C + 3 * C * config.hidden_dim
    projections = 2 * (config.n_layers * per_token + C * config.vocab_size)  # one token's worth
    return projections + config.n_layers * 2 * (2 * kv_len * D * H)  # (1, D) against (kv_len, D), twice
    ### END SOLUTION


# ---------------------------------------------------------------------------------------------
# Exercise 3.3


@exercise("3.3", validate=inputs.check_generation_length)
def generation_flops(config, prompt_len: int, max_new_tokens: int) -> tuple[int, int]:
    """FLOPs of a whole generation of max_new_tokens after a prompt of prompt_len: naive, and kept.

    Naive: each step runs a forward over the whole sequence so far. Kept: the first step is the prefill,
    a forward over the prompt (nothing is kept yet); each later step runs only the token chosen the step
    before, against every key kept so far and its own.
    Args:    config: a ModelConfig;  prompt_len, max_new_tokens: positive ints
    Returns: (naive, kept), two ints; naive >= kept, equal when max_new_tokens is 1
    Raises:  ValueError if prompt_len or max_new_tokens is not a positive int
    Example:
        >>> from kvlib.core.model import ModelConfig
        >>> config = ModelConfig(vocab_size=50)
        >>> generation_flops(config, 5, 1) == (forward_flops(config, 5), forward_flops(config, 5))
        True
    """
    ### BEGIN SOLUTION
    naive = sum(forward_flops(config, prompt_len + i) for i in range(max_new_tokens))
    kept = forward_flops(config, prompt_len) + sum(
        new_token_flops(config, prompt_len + i) for i in range(1, max_new_tokens)
    )
    return naive, kept
    ### END SOLUTION
