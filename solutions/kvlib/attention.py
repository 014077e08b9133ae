"""Attention by hand (notebook 01-attention): softmax, one query, a causal mask, all queries at once, a query aimed.

numpy, one head, no batch: q (T, D), k and v (S, D). Every reduction uses a negative axis, so
the same code runs unchanged on (B, H, T, D) arrays.
Left out: learned projections, several heads and rotary positions (the model of notebook 02).
"""

from __future__ import annotations

import math

import numpy as np

from kvlib.course import inputs
from kvlib.course.exercises import exercise

# ---------------------------------------------------------------------------------------------
# Exercise 1.1


@exercise("1.1", validate=inputs.check_scores)
def softmax(scores: np.ndarray) -> np.ndarray:
    """Softmax over the last axis, finite for scores of any size (1000 and -1000 included).

    Args:    scores: (..., kv_len) float array
    Returns: probs: same shape and dtype as scores; each row along the last axis is >= 0 and sums to 1
    Raises:  ValueError if scores is not a numpy array of real numbers
    Example:
        >>> softmax(np.array([1.0, 1.0, 2.0])).round(3)
        array([0.212, 0.212, 0.576])
    """
    ### BEGIN SOLUTION
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))  # largest exponent is 0: no overflow
    return e / e.sum(axis=-1, keepdims=True)
    ### END SOLUTION


# ---------------------------------------------------------------------------------------------
# Exercise 1.2


@exercise("1.2", validate=inputs.check_attend)
def attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float | None = None):
    """Attention of one query over all keys: its weights over the keys, and its output.

    Args:    q: (head_dim,)   k: (kv_len, head_dim)   v: (kv_len, d_v), float arrays of one dtype
             scale: a float (1.0 gives notebook 01's worked example); None means 1 / sqrt(head_dim)
    Returns: out: (d_v,), probs: (kv_len,) summing to 1, both in the inputs' dtype
    Raises:  ValueError if k's rows are not head_dim wide or v has not one row per key
    Example:
        >>> attend(np.array([1.0, 1.0]), np.eye(2), np.array([[1.0, 0], [3, 1]]), scale=1.0)[0].tolist()
        [2.0, 0.5]
    """
    ### BEGIN SOLUTION
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])  # a Python float: float32 inputs stay float32 (np.sqrt would promote)
    scores = (k @ q) * scale  # (S, D) @ (D,) -> (S,)
    probs = softmax(scores)
    return probs @ v, probs  # (S,) @ (S, D_v) -> (D_v,)
    ### END SOLUTION


# ---------------------------------------------------------------------------------------------
# Exercise 1.3


@exercise("1.3", validate=inputs.check_causal_mask)
def causal_mask(seq_len: int, kv_len: int) -> np.ndarray:
    """Boolean (seq_len, kv_len) mask, True where a query may attend to a key (SDPA's bool attn_mask).

    The queries are the last seq_len of kv_len positions; each may attend to its own position and every
    earlier one, never a later one.
    Args:    seq_len: new queries, 1 <= seq_len <= kv_len;  kv_len: keys
    Returns: bool array (seq_len, kv_len)
    Raises:  ValueError if seq_len > kv_len, or either is not a positive int
    Example:
        >>> causal_mask(1, 3).tolist()
        [[True, True, True]]
    """
    ### BEGIN SOLUTION
    return np.tril(np.ones((seq_len, kv_len), dtype=bool), k=kv_len - seq_len)
    ### END SOLUTION


# ---------------------------------------------------------------------------------------------
# Exercise 1.4


@exercise("1.4", validate=inputs.check_self_attention)
def causal_self_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray):
    """Attention of every query at once, under the causal mask: attend (1.2) of each query over the keys it may see.

    Args:    q: (..., seq_len, head_dim), k: (..., kv_len, head_dim), v: (..., kv_len, d_v), one float dtype;
             the queries are the last seq_len of the kv_len positions; scores scaled by 1 / sqrt(head_dim)
    Returns: out: (..., seq_len, d_v), probs: (..., seq_len, kv_len), in q's dtype; probs exactly 0 where the
             mask forbids; row i of out equals attend (1.2) of query i over the keys it may see
    Raises:  ValueError if the shapes do not fit together, or seq_len > kv_len
    Example:
        >>> causal_self_attention(np.eye(2), np.eye(2), np.eye(2))[1][0].tolist()
        [1.0, 0.0]
    """
    ### BEGIN SOLUTION
    T, S = q.shape[-2], k.shape[-2]
    scores = q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1])  # (..., T, D) @ (..., D, S) -> (..., T, S)
    probs = softmax(np.where(causal_mask(T, S), scores, -np.inf))  # mask broadcasts over (...)
    return probs @ v, probs  # (..., T, S) @ (..., S, D_v) -> (..., T, D_v)
    ### END SOLUTION


# ---------------------------------------------------------------------------------------------
# Exercise 1.5


@exercise("1.5")
def aimed_query() -> np.ndarray:
    """A query for AI under which 爱 takes at least 0.9 of its attention, at most 3 long: a design under a budget.

    Returns: (2,) float array q, np.linalg.norm(q) <= 3, under which 爱 takes at least 0.9 of the weights at
             scale 1 over notebook 01's keys k = [[1, 0], [0, 1], [1, 1]] (我, 爱, AI); any such q
    Raises:  nothing: it takes no input
    Example:
        >>> aimed_query().shape
        (2,)
    """
    ### BEGIN SOLUTION
    return np.array([-2.8, 1.0])  # 爱's key and AI's differ only in 我's direction: turn away from it
    ### END SOLUTION
