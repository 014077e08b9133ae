"""Fused attention (notebook 09-fused): attention without the whole score matrix at once.

The online softmax (Milakov and Gimelshein, 2018) merges partial softmaxes exactly; FlashAttention-2
(Dao, 2023) tiles queries and keys so the seq_len x kv_len matrix never exists and skips the tiles
above the causal diagonal; flash-decoding splits one query's cache into chunks merged by log-sum-exp,
as many as keep a GPU busy (split_steps models it); notebook 08's int8 cache is attended with its
scales folded in. Left out: the backward pass and real kernels: these loops are the algorithm,
kvlib.measure.bench_fused times them beside fused kernels.
"""

from __future__ import annotations

import math

import torch

from kvlib.course import inputs
from kvlib.course.exercises import exercise

# ---------------------------------------------------------------------------------------------
# The online softmax


@exercise("9.1", validate=inputs.check_online_softmax)
def online_softmax(chunks: list) -> torch.Tensor:
    """softmax(scores) @ values over every chunk's keys, reading one chunk at a time.

    Args:    chunks: a non-empty list of (scores (..., c), values (..., c, head_dim)) float32 pairs; the
             chunk length c may differ from chunk to chunk; a score of -inf is a key that may not be attended.
    Returns: (..., head_dim) float32, what softmax over the concatenated scores times the concatenated values
             gives, for scores of any size (1,000 included). The chunks are read one at a time and none is kept
             once the next is read: no tensor as long as all the keys together, no list of them all (the list may
             make each chunk only when it is read; the grader hands them so, and measures what a call holds at once).
    Raises:  ValueError for an empty list, or a chunk whose scores and values disagree in shape.
    Example:
        >>> s1, v1 = torch.tensor([1.0, 1.0]), torch.tensor([[1.0, 0.0], [0.0, 2.0]])  # notebook 01's seed, in two chunks
        >>> online_softmax([(s1, v1), (torch.tensor([2.0]), torch.tensor([[3.0, 1.0]]))])
        tensor([1.9403, 1.0000])
    """
    raise NotImplementedError("Exercise 9.1 (notebooks/09-fused): online_softmax")


# ---------------------------------------------------------------------------------------------
# FlashAttention-2's forward loop: tiles of queries against tiles of keys


@exercise("9.2", validate=inputs.check_tiled_attention)
def tiled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tile: int) -> torch.Tensor:
    """Causal attention computed tile by tile: a seq_len x kv_len score matrix never exists.

    Args:    q: (batch, n_heads, seq_len, head_dim), the last seq_len of the kv_len positions (bottom-right);
             k, v: (batch, n_heads, kv_len, head_dim), q's dtype; tile: rows of queries and of keys per tile (> 0;
             it need not divide seq_len, kv_len or kv_len - seq_len); query tiles start at query 0, key tiles at key 0.
    Returns: (batch, n_heads, seq_len, head_dim) in q's dtype, SDPA's answer with a causal mask. Score tiles whose
             every key is in every query's future are never computed; the matrix multiplies of the others are all
             the work (each computed tile costs 2 of them), and at most a tile x tile block of scores per head exists
             at a time, never a tile of queries against all its keys (the grader measures the memory a call holds,
             without torch's fused attention kernel: there, calling torch's attention holds every score it computes).
    Raises:  ValueError if tile is not a positive int, or k and v differ in shape, or seq_len > kv_len.
    Example:
        >>> q, k, v = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
        >>> tiled_attention(q, k, v, tile=2).shape
        torch.Size([1, 2, 5, 8])
    """
    raise NotImplementedError("Exercise 9.2 (notebooks/09-fused): tiled_attention")


# ---------------------------------------------------------------------------------------------
# Flash-decoding: one query, its cache split into chunks, each attended on its own, then merged


def chunk_partial(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk's attention, as a worker that sees only these keys returns it: (out, lse).

    q (batch, n_heads, 1, head_dim); k, v (batch, n_kv_heads, c, head_dim), grouped heads as in 6.2.
    out (batch, n_heads, 1, head_dim): softmax over this chunk's keys alone times its values;
    lse (batch, n_heads, 1): log of the sum of exp(score) over the chunk (-inf for a chunk of no keys).
    """
    G = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)  # small chunks: the copy is cheap
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, 1, c)
    if scores.shape[-1] == 0:
        return torch.zeros(q.shape), torch.full(q.shape[:3], float("-inf"))
    return scores.softmax(dim=-1) @ v, torch.logsumexp(scores, dim=-1)


@exercise("9.3", validate=inputs.check_merge_partials)
def merge_partials(outs: torch.Tensor, lses: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge attention results over disjoint chunks of keys into the result over all of them, exactly.

    Args:    outs: (n_chunks, ..., head_dim) float32, each chunk's softmax-weighted values (chunk_partial's out);
             lses: (n_chunks, ...) float32, each chunk's log-sum-exp of its scores; -inf for a chunk that holds
             no key a query may see (its out may then hold anything, nan included).
    Returns: out (..., head_dim), lse (...): what one attention over all the chunks' keys gives, so that a
             merged result can be merged again with others (in any grouping) and give the same answer.
    Raises:  ValueError if outs and lses disagree in shape, or there is no chunk.
    Example:
        >>> q, k, v = torch.randn(1, 2, 1, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
        >>> (o1, l1), (o2, l2) = chunk_partial(q, k[:, :, :4], v[:, :, :4]), chunk_partial(q, k[:, :, 4:], v[:, :, 4:])
        >>> out, lse = merge_partials(torch.stack([o1, o2]), torch.stack([l1, l2]))
        >>> torch.allclose(out, chunk_partial(q, k, v)[0], atol=1e-6)
        True
    """
    raise NotImplementedError("Exercise 9.3 (notebooks/09-fused): merge_partials")


def flash_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunk: int) -> torch.Tensor:
    """One query against kv_len keys split into chunks of `chunk`: chunk_partial on each, merged with 9.3."""
    inputs.check_flash_decode(q, k, v, chunk)
    parts = [chunk_partial(q, k[:, :, j : j + chunk], v[:, :, j : j + chunk]) for j in range(0, k.shape[2], chunk)]
    out, _ = merge_partials(torch.stack([o for o, _ in parts]), torch.stack([lse for _, lse in parts]))
    return out


# ---------------------------------------------------------------------------------------------
# How many splits: a decode step's attention on a GPU, modelled


def split_steps(kv_len: int, n_kv_heads: int, batch: int, n_sms: int, n_splits: int) -> int:
    """A flash-decoding step's attention on a GPU, modelled: its time in key-steps (one SM reading one cached key).

    One block of work per (sequence, key/value head, split), each reading ceil(kv_len / n_splits) keys; an SM runs
    one block at a time, so the blocks run in waves of n_sms. Then 9.3's merge reads each split's partial result: one
    key-step per split. Example: split_steps(8192, 8, 1, 132, 1) -> 8193 (8 blocks: 124 of 132 SMs idle)
    """
    inputs.check_splits(kv_len, n_kv_heads, batch, n_sms, n_splits)
    waves = -(-batch * n_kv_heads * n_splits // n_sms)  # ceil: a wave runs n_sms blocks at once
    return waves * -(-kv_len // n_splits) + n_splits


@exercise("9.5", validate=inputs.check_splits)
def flash_decode_splits(kv_len: int, n_kv_heads: int, batch: int, n_sms: int) -> int:
    """A design: how many splits of the cache a flash-decoding step should use on a GPU of n_sms SMs.

    Args:    kv_len: cached tokens; n_kv_heads, batch: the step's key/value heads and sequences; n_sms: the GPU's
             streaming multiprocessors (all positive ints)
    Returns: int n_splits >= 1 whose split_steps(kv_len, n_kv_heads, batch, n_sms, n_splits) is at most 1.1 times
             the fewest any number of splits gives: any such n_splits, chosen in the time a kernel launch has (the
             checks allow 2 s a call, at kv_len up to 2**40)
    Raises:  ValueError if an argument is not a positive int
    Example:
        >>> n = flash_decode_splits(8192, 8, 1, 132)  # Llama-3-8B's 8 key/value heads on an H100 SXM
        >>> split_steps(8192, 8, 1, 132, n) <= 1.1 * 528  # the fewest key-steps any number of splits gives here
        True
    """
    raise NotImplementedError("Exercise 9.5 (notebooks/09-fused): flash_decode_splits")


# ---------------------------------------------------------------------------------------------
# Notebook 08's int8 cache, attended without a float copy


@exercise("9.4", validate=inputs.check_int8_folded)
def int8_folded_attention(q, k_values, k_scale, v_values, v_scale, kv_len: int) -> torch.Tensor:
    """One decode query against the first kv_len tokens of notebook 08's int8 cache, with no dequantised copy.

    Args:    q: (batch, n_heads, 1, head_dim) float32; the cache as 8.2 takes it: k_values int8 (batch,
             n_kv_heads, n_groups, group, head_dim), k_scale (batch, n_kv_heads, n_groups, 1, head_dim),
             v_values int8 (batch, n_kv_heads, >= kv_len, head_dim), v_scale (batch, n_kv_heads, >= kv_len, 1).
    Returns: (batch, n_heads, 1, head_dim): 8.2's answer (to float32 rounding), on any cache whose scores are
             moderate, one whose keys times their scales would overflow float32 included. It never allocates a float
             tensor holding half as many numbers as the cached keys (or values) or more.
    Raises:  ValueError if q holds more than one query, or a scale is missing or of the wrong shape.
    Example:
        >>> from kvlib.compress import int8_attention, quantize
        >>> (kq, ks), (vq, vs) = quantize(torch.randn(1, 2, 2, 4, 16), dim=-2), quantize(torch.randn(1, 2, 8, 16), dim=-1)
        >>> q = torch.randn(1, 4, 1, 16)
        >>> torch.allclose(int8_folded_attention(q, kq, ks, vq, vs, 6), int8_attention(q, kq, ks, vq, vs, 6), atol=1e-5)
        True
    """
    raise NotImplementedError("Exercise 9.4 (notebooks/09-fused): int8_folded_attention")
