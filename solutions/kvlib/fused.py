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
    ### BEGIN SOLUTION
    running_max = running_sum = acc = None
    for scores, values in chunks:
        if running_max is None:
            running_max = torch.full(scores.shape[:-1], float("-inf"))  # (...): the largest score so far
            running_sum = torch.zeros(scores.shape[:-1])  # (...): sum of exp(score - running_max)
            acc = torch.zeros(values.shape[:-2] + values.shape[-1:])  # (..., D): sum of exp(...) * value
        new_max = torch.maximum(running_max, scores.amax(dim=-1))
        shift = torch.where(torch.isfinite(new_max), new_max, 0.0)  # a row masked so far: shift by 0, not -inf
        rescale = torch.exp(running_max - shift)  # older terms were taken against the old maximum
        p = torch.exp(scores - shift[..., None])  # (..., c), every entry <= 1: no overflow
        running_sum = running_sum * rescale + p.sum(dim=-1)
        acc = acc * rescale[..., None] + (p[..., None, :] @ values).squeeze(-2)  # (..., 1, c) @ (..., c, D)
        running_max = new_max
    return acc / running_sum[..., None]
    ### END SOLUTION


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
    ### BEGIN SOLUTION
    T, S, D = q.shape[2], k.shape[2], q.shape[3]
    offset = S - T  # query i sits at position offset + i
    out = torch.empty(q.shape)
    for i0 in range(0, T, tile):
        qi = q[:, :, i0 : i0 + tile] / math.sqrt(D)  # (B, H, tq, D)
        tq = qi.shape[2]
        rows = offset + i0 + torch.arange(tq)  # the tile's query positions
        m = torch.full(qi.shape[:3], float("-inf"))  # running max per query row
        l, acc = torch.zeros(qi.shape[:3]), torch.zeros(qi.shape)  # running sum, running output
        for j0 in range(0, offset + i0 + tq, tile):  # key tiles past the tile's last query are all future: skipped
            kj, vj = k[:, :, j0 : j0 + tile], v[:, :, j0 : j0 + tile]
            s = qi @ kj.transpose(-2, -1)  # (B, H, tq, tk)
            if j0 + kj.shape[2] - 1 > offset + i0:  # on the diagonal: some key is in some query's future
                s = s.masked_fill(rows[:, None] < j0 + torch.arange(kj.shape[2]), float("-inf"))
            new_m = torch.maximum(m, s.amax(dim=-1))  # finite: key 0 is in the first tile and visible to all
            rescale, p = torch.exp(m - new_m), torch.exp(s - new_m[..., None])
            l = l * rescale + p.sum(dim=-1)
            acc = acc * rescale[..., None] + p @ vj  # (B, H, tq, tk) @ (B, H, tk, D)
            m = new_m
        out[:, :, i0 : i0 + tq] = acc / l[..., None]
    return out
    ### END SOLUTION


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
    ### BEGIN SOLUTION
    lse = torch.logsumexp(lses, dim=0)  # (...): the log of the total sum, stable, -inf chunks ignored
    weight = torch.exp(lses - lse)  # (n_chunks, ...): each chunk's share of the total, summing to 1
    terms = torch.where(weight[..., None] > 0, weight[..., None] * outs, 0.0)  # an empty chunk's nan never enters
    return terms.sum(dim=0), lse
    ### END SOLUTION


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
    ### BEGIN SOLUTION
    unsplit = batch * n_kv_heads  # blocks of one split each
    fill = n_sms // math.gcd(n_sms, unsplit)  # the fewest splits whose blocks fill whole waves
    # Every n costs at least kv_len * unsplit / n_sms + n key-steps, and `fill` at most that + its waves + fill:
    # no count past fill + its waves can win, so the search stops there (a few hundred counts at most).
    worth_trying = range(1, min(kv_len, fill + unsplit * fill // n_sms) + 1)
    return min(worth_trying, key=lambda n: split_steps(kv_len, n_kv_heads, batch, n_sms, n))
    ### END SOLUTION


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
    ### BEGIN SOLUTION
    B, H_kv, n_groups, group, D = k_values.shape
    G, block = q.shape[1] // H_kv, max(1, 256 // group)  # query heads per kv head; groups per block
    qg = q.reshape(B, H_kv, 1, G, D) / math.sqrt(D)  # (B, H_kv, 1, G, D): one row per query head of the group
    used = -(-kv_len // group)  # groups holding tokens
    scores = []
    for g0 in range(0, used, block):
        folded = qg * k_scale[:, :, g0 : g0 + block]  # (B, H_kv, nb, G, D): channel scales into the query
        keys = k_values[:, :, g0 : g0 + block].float()  # (B, H_kv, nb, group, D): one block converted, not the cache
        scores.append((folded @ keys.transpose(-2, -1)).transpose(2, 3).flatten(3))  # (B, H_kv, G, nb * group)
    probs = torch.cat(scores, dim=-1)[..., :kv_len].softmax(dim=-1)  # (B, H_kv, G, S): slots past kv_len dropped
    probs = probs * v_scale[:, :, None, :kv_len, 0]  # token scales into the probabilities
    out = torch.zeros(B, H_kv, G, D)
    step = block * group
    for j in range(0, kv_len, step):
        out += probs[..., j : j + step] @ v_values[:, :, j : min(j + step, kv_len)].float()  # (B, H_kv, G, D)
    return out.reshape(B, H_kv * G, 1, D)
    ### END SOLUTION
