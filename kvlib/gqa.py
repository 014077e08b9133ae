"""Grouped-Query Attention (notebook 06-gqa): query heads share key/value heads in groups.

MHA gives each of the n_heads query heads its own key/value head, MQA gives them all one, GQA one
per group of group_size = n_heads // n_kv_heads. The cache, and the bytes a decode step reads
from it, shrink by group_size, but only if attention reads each shared head in place instead of
copying it out to every query head. Here: the grouping (repeat_kv), attention that keeps the
saving (grouped_attention), and turning a trained MHA model into GQA by mean-pooling (Ainslie et
al., 2023). The other ways: kvlib.variants.gqa_attention, timed by kvlib.measure.bench_gqa; the quality study and
uptraining are kvlib.study.gqa_quality's. Left out: fused kernels (SDPA's enable_gqa is compared only).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from kvlib.core.model import Decoder
from kvlib.core.weights import first_head_of_group  # noqa: F401 (the checks pass it to to_gqa as pool)
from kvlib.course import inputs
from kvlib.course.exercises import exercise

# ---------------------------------------------------------------------------------------------
# Exercise 6.1 (find and fix: the learner's copy ships with a bug): which key/value head each query head reads


@exercise("6.1", validate=inputs.check_repeat)
def repeat_kv(x: torch.Tensor, group_size: int) -> torch.Tensor:
    """Copy each key/value head out to the query heads it serves, in the order GQA checkpoints were trained with.

    Shipped with a bug (Exercise 6.1 is a find-and-fix): the checks show what goes wrong; the contract is below.

    Which query heads share a key/value head is the checkpoint's, not yours to choose. kvlib's Decoder
    runs GQA the way Llama-family checkpoints were trained (tested against transformers), so MHA attention
    over repeat_kv(k, group_size), repeat_kv(v, group_size) must equal a GQA layer's own model.layers[i].attn.attend(q, k, v).
    Args:    x: (batch, n_kv_heads, kv_len, head_dim);  group_size: query heads per key/value head, >= 1
    Returns: (batch, n_kv_heads * group_size, kv_len, head_dim), x's dtype: output head h is the key/value
             head that query head h reads; in general a copy, the one grouped_attention (Exercise 6.2) avoids
    Raises:  ValueError if x is not 4-dimensional or group_size is not a positive int
    Example:
        >>> repeat_kv(torch.zeros(1, 2, 5, 8), 3).shape
        torch.Size([1, 6, 5, 8])
    """
    copies = [x] * group_size  # the key/value heads once for each query head of a group
    return torch.cat(copies, dim=1)  # (batch, n_kv_heads * group_size, kv_len, head_dim)


# ---------------------------------------------------------------------------------------------
# Exercise 6.2


@exercise("6.2", validate=inputs.check_qkv)
def grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention in which each key/value head serves its group of query heads, read in place.

    Equal to F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True) with the
    bottom-right causal mask (queries are the last seq_len of kv_len positions; True = may attend),
    and to attention over repeat_kv(k, group_size) and repeat_kv(v, group_size), group_size = n_heads // n_kv_heads,
    but never makes a tensor of n_heads keys or values (the grader measures the memory it holds). SDPA is what to
    compare with, not the answer: the grader runs without its fused kernel, and there enable_gqa copies the heads.
    Args:    q: (batch, n_heads, seq_len, head_dim);  k, v: (batch, n_kv_heads, kv_len, head_dim), one float dtype
    Returns: (batch, n_heads, seq_len, head_dim), q's dtype
    Raises:  ValueError if n_heads is not a multiple of n_kv_heads, the shapes disagree, or seq_len > kv_len
    Example:
        >>> import torch.nn.functional as F
        >>> q, k, v = torch.randn(1, 4, 1, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)  # a decode step
        >>> torch.allclose(grouped_attention(q, k, v), F.scaled_dot_product_attention(q, k, v, enable_gqa=True), atol=1e-5)
        True
    """
    raise NotImplementedError("Exercise 6.2 (notebooks/06-gqa): grouped_attention")


# ---------------------------------------------------------------------------------------------
# Exercise 6.3: from n_heads key/value heads to n_kv_heads, the GQA paper's way: which heads merge


@exercise("6.3", validate=inputs.check_pool)
def mean_pool_heads(w: torch.Tensor, n_heads: int, n_kv_heads: int) -> torch.Tensor:
    """Shrink a key or value projection from n_heads heads to n_kv_heads: each new head the mean of the old ones it replaces.

    The invariant the checks hold you to: pooling a weight whose heads are repeat_kv's copies of a smaller one
    gives the smaller one back.
    Args:    w: a k_proj or v_proj weight of n_heads heads, (n_heads * head_dim, d_model), float
             n_heads, n_kv_heads: n_kv_heads divides n_heads
    Returns: (n_kv_heads * head_dim, d_model), w's dtype; w is left unchanged
    Raises:  ValueError if w's rows are not n_heads heads, or n_kv_heads does not divide n_heads
    Example:
        >>> mean_pool_heads(torch.zeros(4 * 16, 128), 4, 2).shape
        torch.Size([32, 128])
    """
    raise NotImplementedError("Exercise 6.3 (notebooks/06-gqa): mean_pool_heads")


# ---------------------------------------------------------------------------------------------
# Exercise 6.4


@exercise("6.4", validate=inputs.check_to_gqa)
def to_gqa(model: Decoder, n_kv_heads: int, pool: Callable | None = None) -> Decoder:
    """model converted to n_kv_heads key/value heads: a new Decoder equal to model but for its keys and values, pooled.

    Its dtype and train/eval mode are model's, and model is left as it was; converting to model's own n_kv_heads
    gives an equal model. pool is how a key or value weight shrinks, called as mean_pool_heads (Exercise 6.3) is;
    None means mean_pool_heads.
    Args:    model: a kvlib Decoder;  n_kv_heads: divides model.config.n_kv_heads
             pool: a function of mean_pool_heads's arguments (w, its heads, n_kv_heads), or None
    Returns: a kvlib Decoder with config.n_kv_heads == n_kv_heads
    Raises:  ValueError if model is not a Decoder or n_kv_heads does not divide its key/value heads
    Example:
        >>> from kvlib.core.weights import load_tiny
        >>> to_gqa(load_tiny()[0], 2).config.n_kv_heads
        2
    """
    raise NotImplementedError("Exercise 6.4 (notebooks/06-gqa): to_gqa")


# ---------------------------------------------------------------------------------------------
# Exercise 6.5: predict, then measure: what sharing buys a decode step


@exercise("6.5", validate=inputs.check_speedup)
def predicted_speedup(config, n_kv_heads: int, kv_len: int, batch: int = 1) -> float:
    """Your prediction: how many times faster a decode step runs with n_kv_heads key/value heads than as MHA.

    Both are the model of config (its widths, layers and n_heads query heads; config.n_kv_heads is not read),
    one with n_heads key/value heads, one with n_kv_heads, each decoding `batch` sequences of kv_len cached
    tokens on the same memory-bound device (notebook 05), every number in one dtype. Notebook 06 then times
    both on your machine.
    Args:    config: a ModelConfig;  n_kv_heads: a divisor of config.n_heads;  kv_len, batch: positive ints
    Returns: float >= 1: MHA's step time over the step time with n_kv_heads key/value heads
    Raises:  ValueError if config is not a ModelConfig, n_kv_heads does not divide n_heads, or a count is not a
             positive int
    Example:
        >>> from kvlib.core.configs import real_model
        >>> predicted_speedup(real_model("Llama-2-7B").config, 32, 4096)  # MHA against itself
        1.0
    """

    raise NotImplementedError("Exercise 6.5 (notebooks/06-gqa): predicted_speedup")
