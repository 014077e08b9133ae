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
    """One token per row from next-token logits: the most likely one, or a sample at a temperature.

    Args:    logits: (batch, vocab_size) float tensor, the model's scores for the next token
             temperature: 0 is greedy; t > 0 draws token i with probability softmax(logits / t)[i]
             generator: a torch.Generator to draw with; the same seed draws the same tokens
    Returns: (batch,) token ids, torch.long
    Raises:  ValueError if logits is not a (batch, vocab_size) float tensor, or temperature < 0
    Example:
        >>> next_token(torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 0.0]]))
        tensor([1, 0])
        >>> next_token(torch.zeros(4, 9), 1.0, torch.Generator().manual_seed(0)).shape
        torch.Size([4])
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
    """The naive autoregressive loop: every step runs the whole sequence so far and appends one token.

    Args:    model: a kvlib Decoder, model(ids) -> logits (batch, seq_len, vocab_size)
             input_ids: (batch, seq_len) torch.long prompt token ids
             max_new_tokens: how many tokens to add, >= 1
             temperature, generator: as in next_token (Exercise 2.1)
             on_token: called with each new token, (batch,) torch.long, as soon as it is chosen
    Returns: (batch, seq_len + max_new_tokens) torch.long: the prompt, unchanged, then the new tokens
    Raises:  ValueError if max_new_tokens < 1 or the prompt plus the new tokens exceed model.config.max_seq_len
    Example:
        >>> from kvlib.core.weights import load_tiny
        >>> model, tokenizer = load_tiny()
        >>> ids = generate(model, torch.tensor([tokenizer.encode("法国的首都是")]), 2)
        >>> tokenizer.decode(ids[0, -2:].tolist())
        '巴黎'
    """
    raise NotImplementedError("Exercise 2.2 (notebooks/02-generation): generate")


# ---------------------------------------------------------------------------------------------
# Exercise 2.3


@exercise("2.3", validate=inputs.check_measure)
def measure_ttft_tpot(model, input_ids: torch.Tensor, max_new_tokens: int) -> tuple[float, list[float]]:
    """Time one greedy generation: seconds to the first token, then seconds for each later token.

    Args:    model, input_ids: as in generate (Exercise 2.2); max_new_tokens >= 2
    Returns: ttft: float, seconds from the call until the first new token exists (it includes the prefill)
             tpots: list of max_new_tokens - 1 floats, the seconds between consecutive new tokens
    Raises:  ValueError if max_new_tokens < 2
    Example:
        >>> from kvlib.core.weights import load_tiny
        >>> model, tokenizer = load_tiny()
        >>> ttft, tpots = measure_ttft_tpot(model, torch.tensor([tokenizer.encode("法国的首都是")]), 5)
        >>> len(tpots), ttft > 0
        (4, True)
    """
    raise NotImplementedError("Exercise 2.3 (notebooks/02-generation): measure_ttft_tpot")


# ---------------------------------------------------------------------------------------------
# Exercise 2.4


@exercise("2.4", validate=inputs.check_project)
def project_qkv(
    attn, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One layer's queries, keys and values of hidden states h: projected, split into heads, rotated.

    Args:    attn: one layer's attention, model.layers[i].attn: attn.q_proj.weight is W_Q, (n_heads*head_dim, d_model);
                   attn.k_proj.weight and attn.v_proj.weight, (n_kv_heads*head_dim, d_model) each;
                   attn.n_heads, attn.n_kv_heads, attn.head_dim
             h: (batch, seq_len, d_model) float tensor, the layer's input after its RMSNorm
             cos, sin: (seq_len, head_dim), the rotary table's rows at h's positions
    Returns: q (batch, n_heads, seq_len, head_dim); k, v (batch, n_kv_heads, seq_len, head_dim), h's dtype;
             q and k rotated, v not: equal to attn.project_q(h, cos, sin) and attn.project_kv(h, cos, sin)
    Raises:  ValueError if attn is not an Attention, or h, cos, sin do not fit it
    Example:
        >>> from kvlib.core.weights import load_tiny
        >>> model, _ = load_tiny()
        >>> h, cos, sin = torch.randn(1, 5, 128), model.rope_cos[:5], model.rope_sin[:5]
        >>> [tuple(t.shape) for t in project_qkv(model.layers[0].attn, h, cos, sin)]
        [(1, 8, 5, 16), (1, 8, 5, 16), (1, 8, 5, 16)]
    """
    raise NotImplementedError("Exercise 2.4 (notebooks/02-generation): project_qkv")
