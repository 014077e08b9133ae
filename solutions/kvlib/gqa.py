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

import dataclasses
import math
from collections.abc import Callable

import torch

from kvlib.core.model import Decoder
from kvlib.core.weights import load_checked
from kvlib.course import inputs
from kvlib.course.exercises import exercise

# ---------------------------------------------------------------------------------------------
# Exercise 6.1: which key/value head each query head reads


@exercise("6.1", validate=inputs.check_repeat)
def repeat_kv(x: torch.Tensor, group_size: int) -> torch.Tensor:
    """Copy each key/value head out to the group_size query heads that share it.

    torch.repeat_interleave(x, repeats=group_size, dim=1): query head h reads key/value head
    h // group_size, so heads 0..group_size-1 share head 0 (not head h % n_kv_heads).
    Args:    x: (batch, n_kv_heads, kv_len, head_dim)
    Returns: (batch, n_kv_heads * group_size, kv_len, head_dim): in general a copy, the one that
             grouped_attention avoids
    Example: heads [a, b], group_size 2 -> [a, a, b, b]  (x.repeat would give [a, b, a, b])

    Hints (reference solution: 2 lines):
      1. x[:, :, None] is (B, H_kv, 1, S, D); .expand it to (B, H_kv, group_size, S, D) (no copy yet).
      2. .reshape to (B, H_kv * group_size, S, D): the group axis lands right after its head.
    """
    ### BEGIN SOLUTION
    B, H_kv, S, D = x.shape
    return x[:, :, None].expand(B, H_kv, group_size, S, D).reshape(B, H_kv * group_size, S, D)  # -> (B, H, S, D)
    ### END SOLUTION


# ---------------------------------------------------------------------------------------------
# Exercise 6.2


@exercise("6.2", validate=inputs.check_qkv)
def grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention in which each key/value head serves its group of query heads, read in place.

    Equals causal_attention(q, repeat_kv(k, G), repeat_kv(v, G)) (kvlib.variants.gqa_attention), G = n_heads // n_kv_heads,
    and F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True), but never
    makes a tensor of n_heads keys or values. Mask: query t (the last T of S positions) may
    attend to key j iff j <= S - T + t; True = may attend.
    Args:    q: (batch, n_heads, seq_len, head_dim); k, v: (batch, n_kv_heads, kv_len, head_dim)
    Returns: (batch, n_heads, seq_len, head_dim)

    Hints (reference solution: 8 lines):
      1. Query head h = g_kv * G + i belongs to key/value head g_kv, so q.reshape(B, H_kv, G * T, D)
         stacks each group's queries as rows against ONE (S, D) block of keys: a plain matmul.
      2. Broadcasting (B, H_kv, G, T, D) @ (B, H_kv, 1, D, S) looks free, but torch.matmul copies the
         broadcast keys out to G heads first: exactly the repeat you are avoiding.
      3. The (T, S) mask, torch.ones(T, S, dtype=torch.bool).tril(S - T), repeats G times along rows.
    """
    ### BEGIN SOLUTION
    (B, H, T, D), (H_kv, S) = q.shape, k.shape[1:3]
    G = H // H_kv
    q = q.reshape(B, H_kv, G * T, D) / math.sqrt(D)  # (B, H, T, D) -> (B, H_kv, G*T, D): a group's queries as rows
    # (k @ q^T)^T == q @ k^T; with the cache as the left operand a CPU streams it once, like a matrix-vector product
    scores = (k @ q.transpose(-2, -1)).transpose(-2, -1)  # (B, H_kv, S, D) @ (B, H_kv, D, G*T) -> (B, H_kv, G*T, S)
    if T > 1:  # one query per head (a decode step) may attend to every key: no mask to build or apply
        allowed = (
            torch.ones(T, S, dtype=torch.bool, device=q.device).tril(S - T).repeat(G, 1)
        )  # (G*T, S): row g*T + t is query t
        scores = scores.masked_fill(~allowed, float("-inf"))
    return (scores.softmax(dim=-1) @ v).view(
        B, H, T, D
    )  # (B, H_kv, G*T, S) @ (B, H_kv, S, D) -> (B, H_kv, G*T, D) -> (B, H, T, D)
    ### END SOLUTION


# ---------------------------------------------------------------------------------------------
# Exercise 6.3: from n_heads key/value heads to n_kv_heads, the GQA paper's way


@exercise("6.3", validate=inputs.check_pool)
def mean_pool_heads(w: torch.Tensor, n_heads: int, n_kv_heads: int) -> torch.Tensor:
    """Average the heads of each group of a key or value projection: (n_heads*D, C) -> (n_kv_heads*D, C).

    Groups are consecutive heads, as repeat_kv (Exercise 6.1) reads them: new head j is the mean
    of old heads j*G ... j*G + G - 1, G = n_heads // n_kv_heads. nn.Linear stores (out, in), so
    rows h*D ... h*D + D - 1 of w are head h (head_dim D = w.shape[0] // n_heads).
    Example: 4 heads [a, b, c, d] to 2 -> [(a + b) / 2, (c + d) / 2]

    Hints (reference solution: 3 lines):
      1. w.view(n_kv_heads, G, D, C): the group's heads on their own axis.
      2. Average over that axis only, then reshape back to two dimensions.
    """
    ### BEGIN SOLUTION
    D, C = w.shape[0] // n_heads, w.shape[1]
    G = n_heads // n_kv_heads
    return w.reshape(n_kv_heads, G, D, C).mean(dim=1).reshape(n_kv_heads * D, C)  # (H_kv, G, D, C) -> (H_kv*D, C)
    ### END SOLUTION


def first_head_of_group(w: torch.Tensor, n_heads: int, n_kv_heads: int) -> torch.Tensor:
    """The alternative the GQA paper compares with: keep the first head of each group, drop the rest."""
    inputs.check_pool(w, n_heads, n_kv_heads)
    D, C = w.shape[0] // n_heads, w.shape[1]
    return w.reshape(n_kv_heads, n_heads // n_kv_heads, D, C)[:, 0].reshape(n_kv_heads * D, C)


# ---------------------------------------------------------------------------------------------
# Exercise 6.4


@exercise("6.4", validate=inputs.check_to_gqa)
def to_gqa(model: Decoder, n_kv_heads: int, pool: Callable | None = None) -> Decoder:
    """A new Decoder with n_kv_heads key/value heads, its k_proj and v_proj weights pooled from model's.

    Everything else (embeddings, queries, o_proj, MLP, norms) is copied unchanged; model itself is
    left as it was. pool(w, n_heads_in_w, n_kv_heads) shrinks one weight; None means
    mean_pool_heads (Exercise 6.3). Example: to_gqa(load_tiny()[0], 2).config.n_kv_heads == 2

    Hints (reference solution: 5 lines):
      1. dataclasses.replace(model.config, n_kv_heads=n_kv_heads) is the new config.
      2. Pool the state dict's entries ending in "k_proj.weight" and "v_proj.weight"; the weight has
         model.config.n_kv_heads heads (n_heads for MHA).
      3. kvlib.core.weights.load_checked(Decoder(config), state) names any shape that does not fit.
    """
    ### BEGIN SOLUTION
    pool = pool or mean_pool_heads
    config = dataclasses.replace(model.config, n_kv_heads=n_kv_heads)
    state = {
        name: pool(w, model.config.n_kv_heads, n_kv_heads) if name.endswith(("k_proj.weight", "v_proj.weight")) else w
        for name, w in model.state_dict().items()
    }
    new = load_checked(Decoder(config), state, source=f"model pooled to {n_kv_heads} key/value heads")
    return new.to(model.embed.weight.dtype).train(model.training)
    ### END SOLUTION
