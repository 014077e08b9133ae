"""Generating text (notebook 02-generation): pick the next token, loop, and time the two phases.

Naive decoding: every step runs the whole sequence through the model again (full recompute);
notebook 03 counts that waste and notebook 04 removes it with a KV cache. The first forward over
the prompt is the prefill (its end is the time to first token, TTFT); each later step is a
decode step (time per output token, TPOT). Then inside the decoder: one layer's hidden states
projected into per-head queries, keys and values, with rotary positions (Exercise 2.4).
Left out: batching prompts of different lengths.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from kvlib.core.model import rotate_half
from kvlib.course import inputs
from kvlib.course.exercises import exercise

# ---------------------------------------------------------------------------------------------
# Exercise 2.1


@exercise("2.1", validate=inputs.check_logits)
def next_token(
    logits: torch.Tensor, temperature: float = 0.0, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Choose one token per row from next-token logits: greedy, or sampled at a temperature.

    Args:    logits: (batch, vocab_size), the model's scores for the next token
             temperature: 0 picks the most likely token (greedy); t > 0 samples from softmax(logits / t)
             generator: a torch.Generator, so that sampling is reproducible
    Returns: (batch,) token ids, dtype torch.long
    Example: next_token(torch.tensor([[0.1, 2.0, -1.0]])) -> tensor([1])

    Hints (reference solution: 4 lines):
      1. Greedy: logits.argmax(dim=-1).
      2. Sampling: torch.multinomial(probs, num_samples=1, generator=generator) takes (batch, vocab).
    """
    raise NotImplementedError("Exercise 2.1 (notebooks/02-generation): next_token")


# ---------------------------------------------------------------------------------------------
# Exercise 2.2


@exercise("2.2", validate=inputs.check_generate)
def generate(
    model,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
    on_token: Callable[[torch.Tensor], None] | None = None,
) -> torch.Tensor:
    """The naive autoregressive loop: run the whole sequence, pick a token, append it, repeat.

    Args:    model: a kvlib Decoder, model(ids) -> logits (batch, seq_len, vocab_size)
             input_ids: (batch, seq_len) prompt token ids
             max_new_tokens: how many tokens to add
             temperature, generator: as in next_token (Exercise 2.1)
             on_token: called with each new token (batch,) as soon as it is chosen
    Returns: (batch, seq_len + max_new_tokens): the prompt followed by the new tokens
    Example: generate(model, ids_of("法国的首都是"), 2) ends with the ids of 巴 and 黎

    Hints (reference solution: 6 lines):
      1. Only the last position's logits predict the next token: logits[:, -1, :].
      2. torch.cat([ids, token[:, None]], dim=1) appends a column.
      3. Run it under torch.inference_mode(): no gradients are needed.
    """
    raise NotImplementedError("Exercise 2.2 (notebooks/02-generation): generate")


# ---------------------------------------------------------------------------------------------
# Exercise 2.3


@exercise("2.3", validate=inputs.check_measure)
def measure_ttft_tpot(model, input_ids: torch.Tensor, max_new_tokens: int) -> tuple[float, list[float]]:
    """Time one greedy generation: seconds to the first token, then seconds for each later token.

    Args:    model, input_ids, max_new_tokens: as in generate (Exercise 2.2), max_new_tokens >= 2
    Returns: ttft: seconds from the start until the first new token exists (the prefill)
             tpots: max_new_tokens - 1 floats, the seconds between consecutive tokens (decode steps)
    Example: ttft, tpots = measure_ttft_tpot(model, ids, 20); len(tpots) -> 19

    Hints (reference solution: 6 lines):
      1. time.perf_counter() is the clock for short intervals.
      2. generate's on_token callback runs right after each token is chosen: record the time there.
      3. Differences of consecutive times: [b - a for a, b in zip(times, times[1:])].
    """
    raise NotImplementedError("Exercise 2.3 (notebooks/02-generation): measure_ttft_tpot")


# ---------------------------------------------------------------------------------------------
# Exercise 2.4


@exercise("2.4", validate=inputs.check_project)
def project_qkv(
    attn, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One layer's queries, keys and values of the hidden states h: projected, split into heads, rotated.

    Args:    attn: one layer's attention (model.layers[i].attn): attn.q_proj.weight is W_Q, (n_heads*head_dim, d_model);
                   attn.k_proj.weight W_K and attn.v_proj.weight W_V, (n_kv_heads*head_dim, d_model) each;
                   attn.n_heads, attn.n_kv_heads, attn.head_dim
             h: (batch, seq_len, d_model), the layer's input after its RMSNorm
             cos, sin: (seq_len, head_dim), the rotary table's rows at h's positions
    Returns: q (batch, n_heads, seq_len, head_dim), k and v (batch, n_kv_heads, seq_len, head_dim);
             q and k rotated, v not. Equal to attn.project_q(h, cos, sin) and attn.project_kv(h, cos, sin).
    Example: q, k, v = project_qkv(model.layers[0].attn, h, cos[:T], sin[:T]); q.shape -> (1, 8, T, 16)

    Hints (reference solution: 6 lines):
      1. A Linear layer computes x @ W.T: h @ attn.q_proj.weight.T is (batch, seq_len, n_heads*head_dim).
      2. Split the last axis into heads, .view(B, T, H, D), then put heads before positions: .transpose(1, 2).
      3. Rotary turns each pair of features by its position's angle: x * cos + rotate_half(x) * sin.
    """
    raise NotImplementedError("Exercise 2.4 (notebooks/02-generation): project_qkv")
