"""Attention by hand (notebook 01-attention): softmax, one query, a causal mask, all queries at once.

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
    """Softmax over the last axis, safe for large scores.

    Args:    scores: (..., kv_len), any real numbers
    Returns: probs: same shape and dtype; along the last axis each row is >= 0 and sums to 1
    Example: softmax(np.array([1.0, 1.0, 2.0])) -> [0.212, 0.212, 0.576]

    Hints (reference solution: 2 lines):
      1. softmax(x) == softmax(x - c) for any constant c; take c = the row's max (keepdims=True).
      2. np.exp, then divide by the sum over axis=-1.
    """
    ### BEGIN SOLUTION
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))  # largest exponent is 0: no overflow
    return e / e.sum(axis=-1, keepdims=True)
    ### END SOLUTION


# ---------------------------------------------------------------------------------------------
# Exercise 1.2


@exercise("1.2", validate=inputs.check_attend)
def attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float | None = None):
    """Attention of one query over all keys: score, softmax, weighted sum of values.

    Args:    q: (head_dim,)   k: (kv_len, head_dim)   v: (kv_len, d_v)
             scale: multiplies the scores; None means 1 / sqrt(head_dim)
    Returns: out: (d_v,), probs: (kv_len,), in the dtype of the inputs (float32 in, float32 out)
    Example: attend([1, 1], [[1,0],[0,1],[1,1]], [[1,0],[0,2],[3,1]], scale=1.0)
             -> out [1.940, 1.000], probs [0.212, 0.212, 0.576]

    Hints (reference solution: 4 lines):
      1. One dot product per key: k @ q has shape (kv_len,).
      2. softmax (Exercise 1.1) turns scores into probs; probs @ v mixes the values.
      3. Under NumPy 2, np.sqrt(d) is a float64 scalar and turns float32 scores into float64:
         math.sqrt(d) is a plain float, so float32 in gives float32 out.
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
    """Boolean (seq_len, kv_len) mask; True where query i may attend to key j.

    The queries are the last seq_len of kv_len positions, so query i sits at position
    kv_len - seq_len + i and may attend to keys j <= kv_len - seq_len + i.
    Example: causal_mask(2, 3) -> [[True, True, False], [True, True, True]]

    Hints (reference solution: 1 line):
      1. np.tril takes an offset k: which diagonal is the last allowed one?
    """
    ### BEGIN SOLUTION
    return np.tril(np.ones((seq_len, kv_len), dtype=bool), k=kv_len - seq_len)
    ### END SOLUTION


# ---------------------------------------------------------------------------------------------
# Exercise 1.4


@exercise("1.4", validate=inputs.check_self_attention)
def causal_self_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray):
    """All queries at once: scaled dot-product attention under the causal mask.

    Args:    q: (..., seq_len, head_dim)   k: (..., kv_len, head_dim)   v: (..., kv_len, d_v)
             the queries are the last seq_len of the kv_len positions
    Returns: out: (..., seq_len, d_v), probs: (..., seq_len, kv_len), zero above the mask
    Example: row i of out equals attend(q[i], k[:p+1], v[:p+1]) with p = kv_len - seq_len + i

    Hints (reference solution: 4 lines):
      1. Scores for every pair at once: q @ k.swapaxes(-1, -2) / math.sqrt(head_dim) (float32 stays float32).
      2. np.where(causal_mask(...), scores, -np.inf) hides the future; exp(-inf) is 0.
      3. Reuse softmax (Exercise 1.1) and causal_mask (Exercise 1.3).
    """
    ### BEGIN SOLUTION
    T, S = q.shape[-2], k.shape[-2]
    scores = q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1])  # (..., T, D) @ (..., D, S) -> (..., T, S)
    probs = softmax(np.where(causal_mask(T, S), scores, -np.inf))  # mask broadcasts over (...)
    return probs @ v, probs  # (..., T, S) @ (..., S, D_v) -> (..., T, D_v)
    ### END SOLUTION
