"""Checks for notebook 09 (kvlib/fused.py): exercises 9.1-9.4.

Sizes all differ (batch 2, 3 or 6 query heads, 2 key/value heads, head_dim 8, chunks and tiles that do
not divide the lengths), so a swapped axis fails. Every expected value and size limit is computed here
in float64 before learner code runs, from tensors the learner's code never receives (it gets clones).
Named slips: the old sum or output not rescaled when the maximum grows, no maximum subtracted
(exp(1000) overflows), nan from a chunk whose scores are all -inf, every tile computed (the future
ones too: a nan planted in a future tile's values reaches earlier queries), the diagonal tiles left
unmasked, a mask aligned top-left, outs averaged instead of weighted by exp(lse), lse returned as a
maximum, the int8 cache dequantised whole. In the isolated grader the grading process measures the
memory a large call holds (kvlib.grading.memory); 9.1's concatenation alone is watched beside the
learner's code, where it runs (docs/instructors.md says why).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from kvlib.checks import MB, check, held_nothing_before, memory_of
from kvlib.checks.compress import _int8_cache, _int8_expected_and_slips
from kvlib.measure.timing import new_tensors

B, H, H_KV, D = 2, 3, 2, 8


def _randn(rng, *shape) -> torch.Tensor:
    return torch.from_numpy(rng.normal(size=shape)).float()


def _close(a, b, rtol=1e-4, atol=1e-5) -> bool:
    return (
        isinstance(a, torch.Tensor)
        and a.shape == b.shape
        and bool(torch.isfinite(a).all())
        and torch.allclose(a.double(), b.double(), rtol=rtol, atol=atol)
    )


def _shape_of(x) -> str:
    return str(tuple(x.shape)) if isinstance(x, torch.Tensor) else type(x).__name__


def _diagnose(got, slips: dict, default: str) -> str:
    if isinstance(got, torch.Tensor) and not torch.isfinite(got).all():
        nan = slips.pop("__nonfinite__", None)
        if nan:
            return nan
    for message, tensor in slips.items():
        if message != "__nonfinite__" and _close(got, tensor):
            return message
    return default


def _attention(q, k, v, *, causal=True, top_left=False, scale=None, allowed=None):
    """softmax(q k^T / sqrt(D)) v in float64, key/value heads repeat_interleave'd; queries the last T of S."""
    G = q.shape[1] // k.shape[1]
    q, k, v = q.double(), k.double().repeat_interleave(G, 1), v.double().repeat_interleave(G, 1)
    T, S = q.shape[-2], k.shape[-2]
    scores = q @ k.transpose(-2, -1) / (math.sqrt(q.shape[-1]) if scale is None else scale)
    if causal:
        if allowed is None:
            allowed = torch.ones(T, S, dtype=torch.bool).tril(0 if top_left else S - T)
        scores = scores.masked_fill(~allowed, float("-inf"))
    return scores.softmax(-1) @ v


# ---------------------------------------------------------------------------------------------
# 9.1 online_softmax


def _chunked(rng, lengths, *, lead=(B, H, 4), offset=0.0):
    scores = [_randn(rng, *lead, c) * 3 + offset for c in lengths]
    values = [_randn(rng, *lead, c, D) for c in lengths]
    return scores, values


def _softmax_expected_and_slips(scores, values):
    s, v = torch.cat(scores, -1).double(), torch.cat(values, -2).double()
    expected = (s.softmax(-1)[..., None, :] @ v).squeeze(-2)

    def run(rescale_sum=True, rescale_acc=True):  # the online loop in float64, with a rescale left out
        m = torch.full(s.shape[:-1], float("-inf"), dtype=torch.float64)
        l = torch.zeros(s.shape[:-1], dtype=torch.float64)
        acc = torch.zeros(v.shape[:-2] + v.shape[-1:], dtype=torch.float64)
        for sc, vc in zip(scores, values):
            sc, vc = sc.double(), vc.double()
            new = torch.maximum(m, sc.amax(-1))
            alpha = torch.exp(m - new)
            p = torch.exp(sc - new[..., None])
            l = (l * alpha if rescale_sum else l) + p.sum(-1)
            acc = (acc * alpha[..., None] if rescale_acc else acc) + (p[..., None, :] @ vc).squeeze(-2)
            m = new
        return acc / l[..., None]

    last = (scores[-1].double().softmax(-1)[..., None, :] @ values[-1].double()).squeeze(-2)
    slips = {
        "the running output is not rescaled when the maximum grows: multiply it by exp(old max - new max), "
        "as the running sum": run(rescale_acc=False),
        "the running sum is not rescaled when the maximum grows: multiply it by exp(old max - new max), "
        "as the running output": run(rescale_sum=False),
        "neither the running sum nor the running output is rescaled when the maximum grows": run(False, False),
        "only the last chunk counts: the running sum and output must carry every chunk's keys": last,
    }
    return expected, slips


def _softmax_case(kv, scores, values, what):
    expected, slips = _softmax_expected_and_slips(scores, values)
    got = kv.online_softmax([(s.clone(), v.clone()) for s, v in zip(scores, values)])
    shape = tuple(expected.shape)
    assert isinstance(got, torch.Tensor) and tuple(got.shape) == shape, (
        f"{what}: online_softmax should return (..., head_dim) = {shape}, got {_shape_of(got)}"
    )
    slips["__nonfinite__"] = (
        "the output holds inf or nan: exp of a large score overflows (subtract the running maximum before exp), "
        "or a row whose scores so far are all -inf gives exp(-inf - (-inf)) = nan"
    )
    assert _close(got, expected), f"{what}: " + _diagnose(
        got, slips, "the output differs from softmax over all the chunks' scores times their values"
    )


@check("9.1")
def online_softmax_matches_softmax_over_all_chunks(kv, rng):
    """Check chunks of 3, 1, 5 and 2 keys (and a single chunk) against softmax over their concatenation."""
    scores, values = _chunked(rng, (3, 1, 5, 2))
    scores[2] += 4  # the maximum grows in a later chunk: the earlier terms must be rescaled
    _softmax_case(kv, scores, values, "chunks of 3, 1, 5, 2 keys")
    _softmax_case(kv, *_chunked(rng, (6,)), "one chunk of 6 keys")
    _softmax_case(kv, *_chunked(rng, (1, 1, 1), lead=(5,)), "three chunks of 1 key, 5 rows")


@check("9.1")
def online_softmax_is_stable_and_handles_masked_keys(kv, rng):
    """Check scores near 1,000, and rows whose first chunk is all -inf (masked keys), without overflow or nan."""
    _softmax_case(kv, *_chunked(rng, (4, 3, 4), offset=1000.0), "scores near 1,000")
    scores, values = _chunked(rng, (3, 4, 2))
    scores[0][0, 1] = float("-inf")  # every key of the first chunk masked for some rows
    scores[1][1, :, 2, 0] = float("-inf")
    _softmax_case(kv, scores, values, "a first chunk whose keys are all masked (-inf) for some rows")


@check("9.1")
def online_softmax_reads_one_chunk_at_a_time(kv, rng):
    """Check that no tensor as long as all 29 keys together is made: the chunks are never concatenated.

    Watched where the call runs (in the isolated grader, in the child beside the learner's code, which could
    switch the watch off): a concatenation is no larger than the chunks the call receives, so the memory the
    grading process measures cannot tell it from a copy of every chunk (float64, say), which is allowed."""
    lengths = (5, 4, 5, 3, 5, 4, 3)  # 29 keys: no other axis is 29 long
    scores, values = _chunked(rng, lengths)
    # the call itself first: a stub, or a function that fails, earns nothing here (a watch may see no tensor)
    out = kv.online_softmax([(s.clone(), v.clone()) for s, v in zip(scores, values)])
    assert tuple(out.shape) == tuple(values[0].shape[:-2]) + tuple(values[0].shape[-1:]), "online_softmax's shape"
    watch = getattr(kv.online_softmax, "watch", None)
    made = (watch or (lambda *a: new_tensors(kv.online_softmax, *a)))(
        [(s.clone(), v.clone()) for s, v in zip(scores, values)]
    )
    total = sum(lengths)
    long = [(op, shape) for op, shape in made if total in shape]
    assert not long, (
        f"online_softmax made a tensor of shape {long[0][1]} ({long[0][0]}): all {total} keys at once. The point "
        "is never to hold them together: keep a running maximum, sum and output, and update them chunk by chunk"
    )


# ---------------------------------------------------------------------------------------------
# 9.2 tiled_attention


def _whole_tiles(T: int, S: int, tile: int) -> torch.Tensor:
    """(T, S) True wherever a key's tile is computed at all: future tiles skipped, diagonal tiles unmasked."""
    first_key_of_tile = torch.arange(S) // tile * tile
    last_query_of_tile = (S - T) + torch.minimum(torch.arange(T) // tile * tile + tile, torch.tensor(T)) - 1
    return first_key_of_tile[None, :] <= last_query_of_tile[:, None]


def _tiled_case(kv, rng, T, S, tile, what):
    q, k, v = _randn(rng, B, H, T, D), _randn(rng, B, H, S, D), _randn(rng, B, H, S, D)
    expected = _attention(q, k, v)
    slips = {
        "the mask is aligned top-left: the seq_len queries are the LAST of the kv_len positions": _attention(
            q, k, v, top_left=True
        ),
        "no causal mask at all: keys in a query's future are attended": _attention(q, k, v, causal=False),
        "the tiles on the diagonal are not masked: keys in a query's future are attended there (skipping the "
        "tiles above it is not enough)": _attention(q, k, v, allowed=_whole_tiles(T, S, tile)),
        "the scores are not divided by sqrt(head_dim)": _attention(q, k, v, scale=1.0),
    }
    got = kv.tiled_attention(q.clone(), k.clone(), v.clone(), tile)
    assert isinstance(got, torch.Tensor) and tuple(got.shape) == (B, H, T, D), (
        f"{what}: tiled_attention should return (batch, n_heads, seq_len, head_dim) = {(B, H, T, D)}, "
        f"got {_shape_of(got)}"
    )
    slips["__nonfinite__"] = (
        "the output holds inf or nan: a row of a masked tile is all -inf, so exp(-inf - (-inf)) is nan (the "
        "first key tile always holds a visible key for every query: take the maximum over it first), or exp overflowed"
    )
    assert _close(got, expected), f"{what}: " + _diagnose(
        got,
        slips,
        "the output differs from causal SDPA: check the running statistics across key tiles, and that the "
        "tiles on the diagonal mask the keys past each query",
    )


@check("9.2")
def tiled_attention_matches_causal_sdpa(kv, rng):
    """Check square and rectangular causal attention, tiles that do not divide the lengths, a tile larger than both."""
    for T, S, tile in ((12, 12, 4), (7, 7, 3), (5, 13, 4), (1, 9, 4), (6, 6, 8)):
        _tiled_case(kv, rng, T, S, tile, f"{T} queries, {S} keys, tiles of {tile}")


@check("9.2")
def tiled_attention_skips_future_tiles(kv, rng):
    """Check that a tile whose keys are all in its queries' future is never computed (a nan planted there stays out).

    A nan in the values of the last key tile must reach exactly the queries that see it, not the query tiles before
    it: a tile computed and masked away spreads it (0 x nan is nan)."""
    for T, S, tile in ((16, 16, 4), (6, 14, 4), (9, 9, 2)):
        q, k, v = _randn(rng, B, H, T, D), _randn(rng, B, H, S, D), _randn(rng, B, H, S, D)
        first = (S - 1) // tile * tile  # the last key tile's first key: every query before it must skip that tile
        expected = _attention(q, k, v)  # rows before `first` never see it, whatever its value
        v[:, :, first] = float("nan")
        got = kv.tiled_attention(q.clone(), k.clone(), v.clone(), tile)
        assert isinstance(got, torch.Tensor) and tuple(got.shape) == (B, H, T, D), (
            f"tiled_attention should return (batch, n_heads, seq_len, head_dim) = {(B, H, T, D)}, got {_shape_of(got)}"
        )
        before = first - (S - T)  # query i sits at position S - T + i: the queries before key `first`
        where = f"{T} queries, {S} keys, tiles of {tile}, a nan in the values of key {first}"
        if not torch.isfinite(got[:, :, :before]).all():
            raise AssertionError(
                f"{where}: the queries before key {first} came out nan, though none of them sees it: the tiles whose "
                "keys are all in the future are computed too (and masked away, but 0 x nan is nan). Stop each query "
                "tile's loop over key tiles at its last query's position"
            )
        assert _close(got[:, :, :before], expected[:, :, :before]), (
            f"{where}: the queries before key {first} differ from causal SDPA"
        )
        assert got[:, :, before:].isnan().all(), (
            f"{where}: the queries at and after key {first} see it, and its value is nan, so their outputs must be nan "
            "too; these are not: is a key these queries see skipped, or are the values cleaned of nan?"
        )


_SCORES = dict(T=2048, tile=128)  # the measured case: 2,048 queries and keys, every head's scores are 96 MB


def _causal_rows(q, k, v, rows: int = 256) -> torch.Tensor:
    """Causal attention in float64, `rows` queries at a time (the measured case is too large for one matrix)."""
    T, S = q.shape[-2], k.shape[-2]
    out = []
    for i in range(0, T, rows):
        part = _attention(q[:, :, i : i + rows], k[:, :, : S - T + i + rows], v[:, :, : S - T + i + rows])
        out.append(part)
    return torch.cat(out, -2)


@check("9.2")
def tiled_attention_never_builds_the_score_matrix(kv, rng):
    """Check that causal attention in tiles never holds as much as half the seq_len x kv_len scores.

    In the isolated grader the grading process measures the memory the call holds (2,048 queries and keys in
    tiles of 128: every head's scores are 96 MB); locally every tensor it allocates is watched (24 x 24, tiles of 4)."""
    T, tile = _SCORES["T"], _SCORES["tile"]
    q, k, v = _randn(rng, B, H, T, D), _randn(rng, B, H, T, D), _randn(rng, B, H, T, D)
    measured = memory_of(kv.tiled_attention, q.clone(), k.clone(), v.clone(), tile)
    if measured is not None:
        got, usage = measured
        assert _close(got, _causal_rows(q, k, v)), (
            f"{T} queries against {T} keys in tiles of {tile}: the output differs from causal SDPA"
        )
        held_nothing_before(usage, "tiled_attention")
        matrix = B * H * T * T * 4  # every head's scores, float32
        assert usage.beyond_inputs < matrix // 2, (
            f"tiled_attention held {usage.beyond_inputs / MB:.0f} MB beyond its inputs at its peak (the grader "
            f"measures the process's memory) for {T} queries against {T} keys in tiles of {tile}: the whole score "
            f"matrix of every head is {matrix / MB:.0f} MB. Tiles exist so that only a tile x tile block of scores "
            "is held at a time"
        )
        return
    T = S = 24
    q, k, v = _randn(rng, B, H, T, D), _randn(rng, B, H, S, D), _randn(rng, B, H, S, D)
    out = kv.tiled_attention(q.clone(), k.clone(), v.clone(), 4)  # first the call: a stub earns nothing here
    assert tuple(out.shape) == tuple(q.shape), f"tiled_attention should return q's shape {tuple(q.shape)}"
    made = new_tensors(kv.tiled_attention, q.clone(), k.clone(), v.clone(), 4)
    limit = B * H * T * S // 2
    big = [(op, shape) for op, shape in made if math.prod(shape) >= limit]
    assert not big, (
        f"tiled_attention made a tensor of shape {big[0][1]} ({big[0][0]}): {math.prod(big[0][1]):,} numbers, as "
        f"much as half the {T} x {S} score matrix of every head. Tiles exist so that only a tile x tile block of "
        "scores is held at a time"
    )


# ---------------------------------------------------------------------------------------------
# 9.3 merge_partials


def _partials(q, k, v, chunk):
    """float64 (outs, lses) of one decode query against each chunk of keys, float32 as a worker returns them."""
    G = q.shape[1] // k.shape[1]
    kk, vv = k.double().repeat_interleave(G, 1), v.double().repeat_interleave(G, 1)
    outs, lses = [], []
    for j in range(0, k.shape[2], chunk):
        s = q.double() @ kk[:, :, j : j + chunk].transpose(-2, -1) / math.sqrt(q.shape[-1])
        outs.append(s.softmax(-1) @ vv[:, :, j : j + chunk])
        lses.append(torch.logsumexp(s, -1))
    return torch.stack(outs), torch.stack(lses)


def _merge_slips(outs, lses) -> dict:
    outs, lses = outs.double(), lses.double()
    return {
        "the chunks' outputs are averaged: each must be weighted by its share of the total, exp(lse_c - lse)": outs.mean(
            0
        ),
        "the weights exp(lse_c - max) are not divided by their sum: a chunk's share is exp(lse_c - lse_total)": (
            torch.exp(lses - lses.amax(0))[..., None] * outs
        ).sum(0),
    }


def _merge_call(kv, outs, lses, what):
    got = kv.merge_partials(outs.clone(), lses.clone())
    assert isinstance(got, tuple) and len(got) == 2 and all(isinstance(t, torch.Tensor) for t in got), (
        f"{what}: merge_partials must return (out, lse), got {type(got).__name__}"
    )
    out, lse = got
    assert tuple(out.shape) == tuple(outs.shape[1:]) and tuple(lse.shape) == tuple(lses.shape[1:]), (
        f"{what}: out must be {tuple(outs.shape[1:])} and lse {tuple(lses.shape[1:])} (the chunk axis merged away), "
        f"got {_shape_of(out)} and {_shape_of(lse)}"
    )
    return out, lse


@check("9.3")
def merge_partials_matches_attention_over_all_keys(kv, rng):
    """Check one decode query (6 heads, 2 key/value heads) against 23 keys in chunks of 5, and of 1, merged."""
    for S, chunk in ((23, 5), (7, 1), (8, 8)):
        q, k, v = _randn(rng, B, 6, 1, D), _randn(rng, B, H_KV, S, D), _randn(rng, B, H_KV, S, D)
        outs, lses = _partials(q, k, v, chunk)
        expected = _attention(q, k, v, causal=False)
        expected_lse = torch.logsumexp(
            q.double() @ k.double().repeat_interleave(3, 1).transpose(-2, -1) / math.sqrt(D), -1
        )
        what = f"{S} keys in chunks of {chunk}"
        out, lse = _merge_call(kv, outs.float(), lses.float(), what)
        assert _close(out, expected), f"{what}: " + _diagnose(
            out, _merge_slips(outs, lses), "the merged output differs from attention over all the keys"
        )
        assert _close(lse, expected_lse), (
            f"{what}: the merged lse must be the log-sum-exp over all the keys, log(sum_c exp(lse_c)), so that "
            "the result can be merged again" + (": this is the largest lse_c" if _close(lse, lses.amax(0)) else "")
        )


@check("9.3")
def merge_partials_merges_again_and_skips_empty_chunks(kv, rng):
    """Check a merge of merges, scores near 1,000 and a chunk with no key (lse -inf, out nan): exact, no nan."""
    S = 20
    q, k, v = _randn(rng, B, 6, 1, D) * 40, _randn(rng, B, H_KV, S, D), _randn(rng, B, H_KV, S, D)
    outs, lses = _partials(q, k, v, 4)  # 5 chunks, lse in the hundreds
    expected = _attention(q, k, v, causal=False)
    left = _merge_call(kv, outs[:2].float(), lses[:2].float(), "chunks 0-1")
    right = _merge_call(kv, outs[2:].float(), lses[2:].float(), "chunks 2-4")
    out, _ = _merge_call(kv, torch.stack([left[0], right[0]]), torch.stack([left[1], right[1]]), "a merge of merges")
    assert _close(out, expected), "a merge of two merged results: " + (
        "inf or nan: exp(lse) overflows for scores this large; subtract the largest lse first (or use logsumexp)"
        if not torch.isfinite(out).all()
        else "differs from attention over all the keys: the merged lse must be log(sum_c exp(lse_c)), the "
        "log-sum-exp of all the merged keys, not their maximum or a mean"
    )
    empty_out = torch.full_like(outs[:1], float("nan"))  # a worker whose chunk held no visible key
    empty_lse = torch.full_like(lses[:1], float("-inf"))
    out, lse = _merge_call(
        kv, torch.cat([outs, empty_out]).float(), torch.cat([lses, empty_lse]).float(), "with an empty chunk"
    )
    assert _close(out, expected), (
        "a chunk with lse = -inf (no key) must add nothing; its out may be nan, and 0 * nan is nan: leave it out "
        "(torch.where) rather than multiplying it by a zero weight"
    )


# ---------------------------------------------------------------------------------------------
# 9.4 int8_folded_attention


def _folded_case(kv, rng, kv_len, n_kv, what):
    q = _randn(rng, B, 6, 1, D)
    cache = _int8_cache(rng, kv_len, n_kv)
    expected, slips = _int8_expected_and_slips(q, *cache, kv_len)
    got = kv.int8_folded_attention(q.clone(), *(t.clone() for t in cache), kv_len)
    assert isinstance(got, torch.Tensor) and tuple(got.shape) == (B, 6, 1, D), (
        f"{what}: int8_folded_attention should return (batch, n_heads, 1, head_dim) = {(B, 6, 1, D)}, "
        f"got {_shape_of(got)}"
    )
    slips = {m.replace("(k_values * k_scale is the key)", "(fold k_scale into the query)"): t for m, t in slips.items()}
    assert _close(got, expected), f"{what}: " + _diagnose(
        got, slips, "the output differs from attention over (k_values * k_scale) and (v_values * v_scale)"
    )


@check("9.4")
def int8_folded_matches_int8_attention(kv, rng):
    """Check a decode step against float64 attention over the dequantised cache: 13, 1 and 9 tokens, 301 past blocks."""
    for kv_len, n_kv in ((13, 2), (1, 2), (9, 1), (301, 2), (40, 6)):
        _folded_case(kv, rng, kv_len, n_kv, f"{kv_len} int8 tokens, {n_kv} key/value heads")


_INT8 = dict(H=4, H_KV=2, S=65_536, D=128, group=32)  # the measured step: the keys as float32 are 64 MB


def _int8_big(rng):
    """A large int8 cache (batch 1): what a float copy of its keys would cost shows against everything else."""
    n = _INT8
    groups, shape = n["S"] // n["group"], (1, n["H_KV"], n["S"] // n["group"], n["group"], n["D"])
    k_values = torch.from_numpy(rng.integers(-127, 128, size=shape, dtype=np.int8))
    k_scale = torch.from_numpy(rng.uniform(0.001, 0.05, size=(1, n["H_KV"], groups, 1, n["D"]))).float()
    v_values = torch.from_numpy(rng.integers(-127, 128, size=(1, n["H_KV"], n["S"], n["D"]), dtype=np.int8))
    v_scale = torch.from_numpy(rng.uniform(0.001, 0.05, size=(1, n["H_KV"], n["S"], 1))).float()
    return k_values, k_scale, v_values, v_scale


def _int8_reference(q, k_values, k_scale, v_values, v_scale) -> torch.Tensor:
    """One decode query per head in float64 over the whole dequantised cache, each group's queries as rows."""
    (Bq, Hq, _, Dq), (_, Hk, n_groups, group, _) = q.shape, k_values.shape
    k = (k_values.double() * k_scale.double()).reshape(Bq, Hk, n_groups * group, Dq)
    rows = q.double().reshape(Bq, Hk, Hq // Hk, Dq)
    probs = (rows @ k.transpose(-2, -1) / math.sqrt(Dq)).softmax(-1)
    return (probs @ (v_values.double() * v_scale.double())).reshape(Bq, Hq, 1, Dq)


@check("9.4")
def int8_folded_makes_no_float_copy_of_the_cache(kv, rng):
    """Check that a long int8 cache is attended without holding a float copy of half its keys or more.

    In the isolated grader the grading process measures the memory the call holds (65,536 int8 tokens: their keys
    as float32 are 64 MB); locally every tensor it allocates is watched (2,048 tokens, half the keys' numbers)."""
    n = _INT8
    q, cache = _randn(rng, 1, n["H"], 1, n["D"]), _int8_big(rng)
    measured = memory_of(kv.int8_folded_attention, q.clone(), *(t.clone() for t in cache), n["S"])
    if measured is not None:
        got, usage = measured
        assert _close(got, _int8_reference(q, *cache)), (
            f"{n['S']:,} int8 tokens: the output differs from attention over (k_values * k_scale) and (v_values * v_scale)"
        )
        held_nothing_before(usage, "int8_folded_attention")
        copy = cache[0].numel() * 4  # the keys as float32
        assert usage.beyond_inputs < copy // 2, (
            f"int8_folded_attention held {usage.beyond_inputs / MB:.0f} MB beyond its inputs at its peak (the grader "
            f"measures the process's memory) for {n['S']:,} int8 tokens: the cached keys as float32 are "
            f"{copy / MB:.0f} MB. That is the copy folding avoids: convert a block of tokens at a time, with k_scale "
            "folded into the query and v_scale into the probabilities"
        )
        return
    kv_len = 2048
    q = _randn(rng, B, 6, 1, D)
    cache = _int8_cache(rng, kv_len)
    out = kv.int8_folded_attention(q.clone(), *(t.clone() for t in cache), kv_len)  # a stub earns nothing here
    assert tuple(out.shape) == tuple(q.shape), f"int8_folded_attention should return q's shape {tuple(q.shape)}"
    made = new_tensors(kv.int8_folded_attention, q.clone(), *(t.clone() for t in cache), kv_len)
    limit = B * H_KV * kv_len * D // 2  # half the numbers of the cached keys (the values have as many)
    big = [(op, shape) for op, shape in made if math.prod(shape) >= limit]
    assert not big, (
        f"int8_folded_attention made a tensor of shape {big[0][1]} ({big[0][0]}): "
        f"{math.prod(big[0][1]) / (2 * limit):.0%} of the cached keys' numbers. That is the copy folding avoids: "
        "convert a block of tokens at a time, with k_scale folded into the query and v_scale into the probabilities"
    )
