"""Generating text (notebook 02-generation): the next token, the naive loop, its timing, a layer's parts, and two
predictions (a temperature's probabilities, a decoder's parameters). Naive decoding reruns the whole sequence every
step (notebook 03 counts the waste, 04 caches it); TTFT ends with the prefill, ITLs are the later gaps, TPOT their mean.
"""

from __future__ import annotations

import torch

from kvlib.attention import causal_self_attention
from kvlib.course import inputs
from kvlib.course.exercises import exercise

# ---------------------------------------------------------------------------------------------
# Exercise 2.1


@exercise("2.1", validate=inputs.check_logits)
def next_token(logits: torch.Tensor, temperature: float = 0.0, generator=None) -> torch.Tensor:
    """One token per row from next-token logits: the most likely one, or a sample at a temperature.

    Args:    logits: (batch, vocab_size) float tensor, the model's scores for the next token
             temperature: 0 is greedy (each row's most likely token); t > 0 samples at temperature t
             generator: a torch.Generator to draw with; the same seed draws the same tokens
    Returns: (batch,) token ids, torch.long
    Raises:  ValueError if logits is not a (batch, vocab_size) float tensor, or temperature < 0
    Example:
        >>> next_token(torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 0.0]]))
        tensor([1, 0])
    """
    raise NotImplementedError("Exercise 2.1 (notebooks/02-generation): next_token")


# ---------------------------------------------------------------------------------------------
# Exercise 2.2


@exercise("2.2", validate=inputs.check_generate)
def generate(model, input_ids: torch.Tensor, max_new_tokens: int, temperature=0.0, generator=None, on_token=None):
    """The prompt continued by max_new_tokens tokens, the naive way: the model rereads the whole sequence for each.

    Shipped with two bugs (Exercise 2.2 is a find-and-fix): the checks show what goes wrong; the contract is below.

    Args:    model: a kvlib Decoder, model(ids) -> logits (batch, seq_len, vocab_size)
             input_ids: (batch, seq_len) torch.long prompt token ids;  max_new_tokens: how many to add, >= 1
             temperature, generator: as in next_token (Exercise 2.1)
             on_token: called with each new token, (batch,) torch.long, as soon as it is chosen: before the
                   model is asked for the next one (the grader watches the order)
    Returns: (batch, seq_len + max_new_tokens) torch.long: the prompt, unchanged, then the new tokens
    Raises:  ValueError if max_new_tokens < 1 or the prompt plus the new tokens exceed model.config.max_seq_len
    Example:
        >>> from kvlib.core.weights import load_tiny; model, tokenizer = load_tiny()
        >>> ids = generate(model, torch.tensor([tokenizer.encode("法国的首都是")]), 2)
        >>> tokenizer.decode(ids[0, -2:].tolist())
        '巴黎'
    """
    ids = input_ids
    with torch.inference_mode():
        for _ in range(max_new_tokens):
            logits = model(input_ids)
            token = next_token(logits[:, -1, :], temperature)
            ids = torch.cat([ids, token[:, None]], dim=1)
            if on_token is not None:
                on_token(token)
    return ids


# ---------------------------------------------------------------------------------------------
# Exercise 2.3


@exercise("2.3", validate=inputs.check_measure)
def measure_ttft_itl(model, input_ids: torch.Tensor, max_new_tokens: int) -> tuple[float, list[float]]:
    """Time one greedy generation: seconds to the first token, then the seconds between each later pair.

    Args:    model, input_ids: as in generate (Exercise 2.2); max_new_tokens >= 2
    Returns: ttft: float, seconds from the call until the first new token exists (the prefill included)
             itls: list of max_new_tokens - 1 floats, inter-token latencies: itls[i] is the time from
                   new token i to new token i + 1, one decode step each (TPOT is their mean)
    Raises:  ValueError if max_new_tokens < 2
    Example:
        >>> from kvlib.core.weights import load_tiny; model, tokenizer = load_tiny()
        >>> ttft, itls = measure_ttft_itl(model, torch.tensor([tokenizer.encode("法国的首都是")]), 5)
        >>> len(itls), ttft > 0
        (4, True)
    """
    raise NotImplementedError("Exercise 2.3 (notebooks/02-generation): measure_ttft_itl")


# ---------------------------------------------------------------------------------------------
# Exercise 2.4


@exercise("2.4", validate=inputs.check_attention_block)
def attention_block(attn, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, self_attention=causal_self_attention):
    """One layer's attention of hidden states h, every head's attention computed by self_attention.

    Args:    attn: one layer's Attention, model.layers[i].attn, with n_kv_heads == n_heads; its nn.Linear
                   weights (out_features, in_features): q_proj, k_proj, v_proj (n_heads*head_dim, d_model),
                   o_proj (d_model, n_heads*head_dim); head i owns features [i*head_dim, (i+1)*head_dim)
             h: (batch, seq_len, d_model) float32 tensor, the layer's input after its RMSNorm
             cos, sin: (seq_len, head_dim), the rotary table's rows at h's positions
             self_attention: Exercise 1.4's contract, (out, probs) of numpy heads; the grader hands in its own
    Returns: (batch, seq_len, d_model) float32: o_proj of the heads' outputs side by side, each from self_attention;
             with the default, equal to attn(h, cos, sin)
    Raises:  ValueError if attn is not an Attention, has grouped heads (notebook 06), h, cos, sin do not fit it, or
             self_attention is not callable
    Example:
        >>> from kvlib.core.weights import load_tiny; model, _ = load_tiny()
        >>> h, cos, sin = torch.randn(1, 5, 128), model.rope_cos[:5], model.rope_sin[:5]
        >>> attention_block(model.layers[0].attn, h, cos, sin).shape
        torch.Size([1, 5, 128])
    """
    raise NotImplementedError("Exercise 2.4 (notebooks/02-generation): attention_block")


# ---------------------------------------------------------------------------------------------
# Exercise 2.5


@exercise("2.5", validate=inputs.check_rms_norm)
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """RMSNorm: each token's hidden state divided by its root-mean-square, then scaled feature by feature.

    Shipped with two bugs (Exercise 2.5 is a find-and-fix): the checks show what goes wrong; the contract is below.

    Args:    x: (..., d_model) float tensor, hidden states (float32, float16 or bfloat16)
             weight: (d_model,), the learned scale; eps > 0, added to the mean square under the root
    Returns: x's shape and dtype; equal to RMSNorm(d_model, eps) with that weight (model.layers[i].attn_norm),
             finite for float16 x of values in the hundreds
    Raises:  ValueError if x is not a float tensor, weight is not (d_model,), or eps <= 0
    Example:
        >>> rms_norm(torch.tensor([[3.0, 4.0]]), torch.ones(2), eps=0.0001).round(decimals=3)
        tensor([[0.8490, 1.1310]])
    """
    mean_square = x.pow(2).mean(dim=-2, keepdim=True)
    return weight * x * torch.rsqrt(mean_square + eps)


# ---------------------------------------------------------------------------------------------
# Exercise 2.6


@exercise("2.6", validate=inputs.check_swiglu)
def swiglu(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor) -> torch.Tensor:
    """Llama's MLP (SwiGLU): a gated MLP, widened to hidden_dim and narrowed back to d_model.

    Args:    x: (..., d_model) float tensor
             w_gate, w_up: (hidden_dim, d_model), w_down: (d_model, hidden_dim): nn.Linear weights, the
                   model's mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight
    Returns: (..., d_model) in x's dtype, equal to the layer's own MLP, mlp(x)
    Raises:  ValueError if the weights' shapes do not fit x and each other
    Example:
        >>> swiglu(torch.tensor([[1.0, -1.0]]), *[torch.eye(2)] * 3).round(decimals=3)
        tensor([[0.7310, 0.2690]])
    """
    raise NotImplementedError("Exercise 2.6 (notebooks/02-generation): swiglu")


# ---------------------------------------------------------------------------------------------
# Exercise 2.7


@exercise("2.7", validate=inputs.check_temper)
def temper(probs: torch.Tensor, temperature: float) -> torch.Tensor:
    """The next-token distribution at a temperature, predicted from the distribution at temperature 1 alone.

    Args:    probs: (..., vocab_size) float tensor, softmax(logits) for some logits: rows >= 0 that sum to 1
             temperature: t >= 0, as in next_token (Exercise 2.1)
    Returns: probs' shape and dtype: the distribution next_token (Exercise 2.1) draws from at temperature t for
             the logits that gave probs, rows summing to 1, finite for any t > 0 (0.01 included); at t = 0,
             one-hot on each row's most likely token (the first, if tied)
    Raises:  ValueError if probs is not a float tensor of rows >= 0 summing to 1, or temperature < 0
    Example:
        >>> temper(torch.tensor([0.25, 0.75]), 0.0)
        tensor([0., 1.])
    """
    raise NotImplementedError("Exercise 2.7 (notebooks/02-generation): temper")


# ---------------------------------------------------------------------------------------------
# Exercise 2.8


@exercise("2.8", validate=inputs.check_config)
def param_counts(config) -> dict[str, int]:
    """The parameters of a decoder of this config, part by part, predicted from the config alone.

    Args:    config: a kvlib ModelConfig; the decoder is kvlib's Decoder(config), this notebook's model, with
             n_kv_heads < n_heads allowed (notebook 06's GQA)
    Returns: {"embedding", "attention", "mlp", "norms", "lm_head"}: ints, each over all layers, summing to
             Decoder(config).num_params(); exact at any size, even where no decoder can be built
    Raises:  ValueError if config is not a ModelConfig
    Example:
        >>> from kvlib.core.model import ModelConfig; config = ModelConfig(10, d_model=8, n_heads=1, n_kv_heads=1)
        >>> param_counts(config)["embedding"]
        80
    """
    raise NotImplementedError("Exercise 2.8 (notebooks/02-generation): param_counts")
