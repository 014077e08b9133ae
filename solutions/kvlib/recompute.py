"""The waste (notebook 03-recompute): how much work naive decoding does, how much is repeated, how much is attention.

Naive decoding reruns the whole sequence for every new token, though earlier keys and values never change (the causal
mask). Matrix-multiply FLOPs are counted as torch.utils.flop_counter counts them, 2 per multiply-add, the full (T, S)
score matrix included, as torch's scaled_dot_product_attention (SDPA) computes it; not norms, rotary or softmax.
"""

from __future__ import annotations

import time

import torch

from kvlib.core.flops import attention_flops_counted, forward_flops_counted
from kvlib.course import inputs
from kvlib.course.exercises import exercise

# ---------------------------------------------------------------------------------------------
# Measuring (no exercise): what a naive step computes, what torch multiplies, how long it takes


def capture_kv(model, ids: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every layer's (k, v), each (batch, n_kv_heads, seq_len, head_dim), of one forward over ids (batch, seq_len): a
    forward pre-hook on each layer's attention sees its input and computes them beside the model (project_kv)."""
    kv, hook = [], lambda attn, args: kv.append(attn.project_kv(*args))  # args: (x, cos, sin), x the normed stream
    handles = [layer.attn.register_forward_pre_hook(hook) for layer in model.layers]
    try:
        with torch.inference_mode():
            model(ids)
    finally:
        for handle in handles:
            handle.remove()
    return kv


def step_and_attention(model, tokens: torch.Tensor, repeats: int = 3) -> tuple[float, float]:
    """Seconds of a naive decode step over tokens (1, kv_len) (a forward and the argmax) and of its attention alone
    (every layer's Attention.attend on random q, k, v of its shapes), timed in turns: the fastest of repeats each."""
    c, S = model.config, tokens.shape[1]
    q, k, v = (torch.randn(1, h, S, c.head_dim) for h in (c.n_heads, c.n_kv_heads, c.n_kv_heads))
    step, attend = [], []  # seconds of each repeat
    with torch.inference_mode():
        for _ in range(repeats):
            start = time.perf_counter()
            model(tokens)[:, -1].argmax(-1)
            middle = time.perf_counter()
            for layer in model.layers:
                layer.attn.attend(q, k, v)
            step.append(middle - start)
            attend.append(time.perf_counter() - middle)
    return min(step), min(attend)


def measured_forward_flops(model, seq_len: int, batch: int = 1) -> int:
    """Matrix-multiply FLOPs of one forward pass over seq_len tokens, counted by torch itself (kvlib.core.flops)."""
    return forward_flops_counted(model, seq_len, batch)


def measured_attention_share(model, seq_len: int) -> float:
    """Attention's part of measured_forward_flops(model, seq_len), as a share: both counted by torch."""
    return attention_flops_counted(model, seq_len) / forward_flops_counted(model, seq_len)


# ---------------------------------------------------------------------------------------------
# Exercise 3.1


@exercise("3.1", validate=inputs.check_length)
def forward_flops(config, seq_len: int) -> int:
    """Matrix-multiply FLOPs of one forward pass over seq_len tokens (batch 1), 2 per multiply-add.

    Counted: every matrix product at every position (projections, MLP, lm_head) and attention's two products
    over the full (seq_len, seq_len) score matrix, masked entries included, as torch's SDPA computes them; not norms,
    rotary, softmax or the embedding lookup. config may be GQA (n_kv_heads < n_heads).
    Args:    config: a ModelConfig;  seq_len: tokens, >= 1
    Returns: int, the count torch's FLOP counter makes of a model of config (measured_forward_flops), worked out
             from config's sizes alone: no model is built or run (the checks refuse it)
    Raises:  ValueError if config is not a ModelConfig or seq_len is not a positive int
    Example:
        >>> from kvlib.core.model import ModelConfig; config = ModelConfig(vocab_size=50)
        >>> forward_flops(config, 16) > 2 * forward_flops(config, 8)  # attention's part grows with seq_len squared
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
    """FLOPs the token at position kv_len - 1 needs when the keys and values of every earlier position are kept.

    Counted by the rules of forward_flops (Exercise 3.1).
    Args:    config: a ModelConfig;  kv_len: keys the new token attends to, its own included, >= 1
    Returns: int FLOPs
    Raises:  ValueError if config is not a ModelConfig or kv_len is not a positive int
    Example:
        >>> from kvlib.core.model import ModelConfig; config = ModelConfig(vocab_size=50)
        >>> new_token_flops(config, 1) == forward_flops(config, 1)
        True
    """
    ### BEGIN SOLUTION
    more_keys = config.n_layers * 2 * (2 * (kv_len - 1) * config.head_dim * config.n_heads)  # its one query, twice
    return forward_flops(config, 1) + more_keys  # one token's forward, its query meeting kv_len - 1 more keys
    ### END SOLUTION


# ---------------------------------------------------------------------------------------------
# Exercise 3.3


@exercise("3.3", validate=inputs.check_generation_length)
def generation_flops(config, prompt_len: int, max_new_tokens: int) -> tuple[int, int]:
    """FLOPs of generating max_new_tokens tokens after a prompt of prompt_len tokens: naive, and kept.

    Naive: notebook 02's loop, the model run over the whole sequence so far for each new token. Kept: the same
    tokens, every key and value computed once and kept (notebook 04's cache). Both counted as forward_flops counts.
    Args:    config: a ModelConfig;  prompt_len, max_new_tokens: positive ints
    Returns: (naive, kept), two ints; naive >= kept
    Raises:  ValueError if config is not a ModelConfig, or a length is not a positive int
    Example:
        >>> from kvlib.core.model import ModelConfig; config = ModelConfig(vocab_size=50)
        >>> naive, kept = generation_flops(config, 5, 4); naive > kept > 0
        True
    """
    ### BEGIN SOLUTION
    naive = sum(forward_flops(config, prompt_len + i) for i in range(max_new_tokens))
    kept = forward_flops(config, prompt_len) + sum(
        new_token_flops(config, prompt_len + i) for i in range(1, max_new_tokens)
    )
    return naive, kept
    ### END SOLUTION


# ---------------------------------------------------------------------------------------------
# Exercise 3.4: predict, then measure


@exercise("3.4", validate=inputs.check_config)
def attention_half_length(config) -> int:
    """The smallest seq_len at which attention's two products make at least half of forward_flops(config, seq_len).

    A prediction, before the notebook times attention, by arithmetic on config (no model runs).
    Args:    config: a ModelConfig; its max_seq_len does not bound the answer
    Returns: int >= 1
    Raises:  ValueError if config is not a ModelConfig
    Example:
        >>> from kvlib.core.model import ModelConfig
        >>> attention_half_length(ModelConfig(vocab_size=50))
        647
    """
    ### BEGIN SOLUTION
    per_key = 2 * config.n_layers * config.n_heads * config.head_dim  # attention: 2 * per_key * T^2 FLOPs
    rest = forward_flops(config, 1) - 2 * per_key  # the rest: rest * T FLOPs (projections, MLP, lm_head)
    return max(1, -(-rest // (2 * per_key)))  # the first T with 2 per_key T^2 >= rest T, rounded up
    ### END SOLUTION
