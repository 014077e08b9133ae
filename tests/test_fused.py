"""kvlib/fused.py (notebook 09): the online softmax, tiled attention, flash-decoding's merge, how many splits of the
cache keep a GPU busy (a design) and int8 attention with folded scales; equivalences with SDPA and notebook 08, other correct ways passing the
checks, likely slips named, bad input, and the benchmark's shape of report.

Runs in reference mode (conftest). No test asserts on time."""

import math
import os
import types

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import handed_in, on_a_terminal, shown_progress

from kvlib import compress, fused
from kvlib.checks import Graded, checks_for, run
from kvlib.checks.compress import _int8_cache
from kvlib.core.flops import matmul_flops
from kvlib.course.exercises import BY_ID, ExerciseNotDone
from kvlib.measure import bench_fused

torch.set_num_threads(1)

CHECKS_09 = [c for i in range(1, 6) for c in checks_for(BY_ID[f"9.{i}"])]
NAMES = (
    "online_softmax",
    "tiled_attention",
    "merge_partials",
    "chunk_partial",
    "split_steps",
    "flash_decode_splits",
    "int8_folded_attention",
)


def _causal_sdpa(q, k, v):
    T, S = q.shape[2], k.shape[2]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(T, S, dtype=torch.bool).tril(S - T))


@pytest.mark.parametrize("check", CHECKS_09, ids=lambda c: c.name)
def test_reference_passes_check(check):
    """Check that the reference solution passes every check of notebook 09."""
    check.fn(fused, np.random.default_rng(0))


def test_learner_stubs_are_todo(learner_mode):
    """Check that in learner mode every 9.x exercise raises ExerciseNotDone naming itself."""
    q, kv = torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 3, 4)
    cache = _int8_cache(np.random.default_rng(0), 5)
    for ex_id, call in (
        ("9.1", lambda: fused.online_softmax([(torch.zeros(3), torch.zeros(3, 2))])),
        ("9.2", lambda: fused.tiled_attention(q, kv, kv, 2)),
        ("9.3", lambda: fused.merge_partials(torch.zeros(2, 3, 4), torch.zeros(2, 3))),
        ("9.4", lambda: fused.int8_folded_attention(torch.zeros(2, 6, 1, 8), *cache, 5)),
        ("9.5", lambda: fused.flash_decode_splits(8192, 8, 1, 132)),
    ):
        with pytest.raises(ExerciseNotDone, match=f"Exercise {ex_id}"):
            call()
    assert {r.id: r.status for r in run("09")} == {f"9.{i}": "todo" for i in range(1, 6)}


# ---------------------------------------------------------------------------------------------
# Equivalences and properties


def test_online_softmax_gives_notebook_01s_three_tokens():
    """Check the seed example: scores 1, 1, 2 in chunks of 2 and 1 give notebook 01's [1.940, 1.000]."""
    out = fused.online_softmax(
        [
            (torch.tensor([1.0, 1.0]), torch.tensor([[1.0, 0.0], [0.0, 2.0]])),
            (torch.tensor([2.0]), torch.tensor([[3.0, 1.0]])),
        ]
    )
    torch.testing.assert_close(out, torch.tensor([1.9403, 1.0]), atol=1e-4, rtol=0)


@pytest.mark.parametrize("T, S, tile", [(16, 16, 4), (5, 13, 4), (1, 9, 2), (7, 7, 16)])
def test_tiled_attention_matches_causal_sdpa(T, S, tile):
    """Check tiled attention against SDPA with a bottom-right causal mask."""
    g = torch.Generator().manual_seed(T * S)
    q, k, v = (torch.randn(2, 3, n, 8, generator=g) for n in (T, S, S))
    torch.testing.assert_close(fused.tiled_attention(q, k, v, tile), _causal_sdpa(q, k, v))


def test_tiled_attention_counts_about_half_the_flops_when_causal():
    """Check that causal tiles cost (n + 1) / (2n) of the full count for n x n tiles, counted by torch."""
    T, tile = 64, 8
    q, k, v = (torch.randn(1, 2, T, 16) for _ in range(3))
    counted = matmul_flops(fused.tiled_attention, q, k, v, tile)
    full = 4 * T * T * 16 * 2
    n = T // tile
    assert counted == full * (n + 1) // (2 * n)
    assert bench_fused.tile_flops(T, T, tile, batch=1, heads=2, head_dim=16) == (counted, full)


def test_flash_decode_matches_sdpa_for_any_chunk():
    """Check flash-decoding (chunk_partial + merge_partials) against SDPA, grouped heads, uneven chunks."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (
        torch.randn(2, 6, 1, 8, generator=g),
        torch.randn(2, 2, 37, 8, generator=g),
        torch.randn(2, 2, 37, 8, generator=g),
    )
    expected = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    for chunk in (1, 5, 16, 37, 100):
        torch.testing.assert_close(fused.flash_decode(q, k, v, chunk), expected)


def test_merge_is_associative():
    """Check that merging merged halves equals merging every chunk at once (the lse carries the sums)."""
    g = torch.Generator().manual_seed(2)
    q, k, v = (
        torch.randn(1, 2, 1, 8, generator=g),
        torch.randn(1, 2, 24, 8, generator=g),
        torch.randn(1, 2, 24, 8, generator=g),
    )
    parts = [fused.chunk_partial(q, k[:, :, j : j + 6], v[:, :, j : j + 6]) for j in range(0, 24, 6)]
    outs, lses = torch.stack([o for o, _ in parts]), torch.stack([lse for _, lse in parts])
    whole = fused.merge_partials(outs, lses)
    halves = [fused.merge_partials(outs[i : i + 2], lses[i : i + 2]) for i in (0, 2)]
    again = fused.merge_partials(torch.stack([h[0] for h in halves]), torch.stack([h[1] for h in halves]))
    torch.testing.assert_close(again[0], whole[0])
    torch.testing.assert_close(again[1], whole[1])


def test_int8_folded_equals_notebook_08s_int8_attention():
    """Check 9.4 against 8.2 on the same int8 cache, decode steps across block boundaries."""
    rng = np.random.default_rng(3)
    for kv_len in (1, 31, 257, 700):
        cache = _int8_cache(rng, kv_len)
        q = torch.randn(2, 6, 1, 8)
        torch.testing.assert_close(
            fused.int8_folded_attention(q, *cache, kv_len),
            compress.int8_attention(q, *cache, kv_len),
            rtol=1e-5,
            atol=1e-5,
        )


def test_the_compiled_ways_maths_equals_notebook_08s_int8_attention():
    """Check the benchmark's compiled way (run eager here: no compile) against 8.2 on an int8 cache of 512 tokens,
    grouped heads included, and that the tile grid counted by visible pairs skips, masks and computes each tile as a
    walk of the tiles' first and last positions would, for every shape up to 12 queries, 16 keys, tiles of 5."""
    rng = np.random.default_rng(4)
    cache = _int8_cache(rng, 512)
    q = torch.randn(2, 6, 1, 8)
    torch.testing.assert_close(
        bench_fused.dequantised_reduction(q, cache[0], cache[1], cache[2][:, :, :512], cache[3][:, :, :512]),
        compress.int8_attention(q, *cache, 512),
        rtol=1e-5,
        atol=1e-5,
    )
    for T in range(1, 13):
        for S in range(T, 17):
            for tile in range(1, 6):
                offset, kinds = S - T, bench_fused.tile_kinds(T, S, tile)
                for i, j in np.ndindex(kinds.shape):
                    first_q, last_q = offset + i * tile, offset + min((i + 1) * tile, T) - 1
                    first_k, last_k = j * tile, min((j + 1) * tile, S) - 1
                    want = (
                        bench_fused.SKIPPED
                        if first_k > last_q
                        else bench_fused.MASKED
                        if last_k > first_q
                        else bench_fused.COMPUTED
                    )
                    assert kinds[i, j] == want, (T, S, tile, i, j)


def test_profiling_leaves_only_what_the_code_writes_on_stderr(capfd):
    """Check that peak_bytes leaves no line of the profiler's own on stderr (kineto's start and stop) and passes
    through what the profiled code writes there."""

    def noisy(x):
        os.write(2, b"the code's own line\n")
        return x * 2

    peak, out = bench_fused.peak_bytes(noisy, torch.ones(256))
    assert peak >= 256 * 4 and torch.equal(out, torch.full((256,), 2.0))
    assert capfd.readouterr().err == "the code's own line\n"


def test_peak_memory_of_tiled_is_far_below_naive():
    """Check the allocator's record: tiled attention's peak at 512 tokens is a small share of the naive scores'."""
    naive, tiled, exact = bench_fused.peak_case(512, tile=64)
    assert exact < 1e-4
    assert tiled["peak_bytes"] * 8 < naive["peak_bytes"]
    assert naive["peak_bytes"] >= 512 * 512 * 4  # the scores of one head exist at once


def test_tile_kinds_cover_the_grid_and_match_the_flop_count():
    """Check the widget's grid: every tile computed, skipped or masked, skipped exactly above the diagonal."""
    kinds = bench_fused.tile_kinds(12, 12, 3)
    assert kinds.shape == (4, 4) and set(np.unique(kinds)) <= {0, 1, 2}
    assert (kinds[np.triu_indices(4, 1)] == bench_fused.SKIPPED).all()
    assert (np.diag(kinds) == bench_fused.MASKED).all()
    assert (kinds[np.tril_indices(4, -1)] == bench_fused.COMPUTED).all()
    assert bench_fused.tile_kinds(10, 10, 3)[3, 3] == bench_fused.COMPUTED  # one query, one key: nothing to mask


def test_split_steps_counts_waves_of_blocks_and_the_merge():
    """Check split_steps's model on hand-counted cases: unsplit, one block per head (8 of 132 SMs); 16 splits fill one
    wave of 128 blocks; 17 spill a second wave; and the reference's splits are the fewest steps."""
    assert fused.split_steps(8192, 8, 1, 132, 1) == 8192 + 1
    assert fused.split_steps(8192, 8, 1, 132, 16) == 512 + 16
    assert fused.split_steps(8192, 8, 1, 132, 17) == 2 * 482 + 17
    best = fused.flash_decode_splits(8192, 8, 1, 132)
    assert (
        fused.split_steps(8192, 8, 1, 132, best)
        == 528
        == min(fused.split_steps(8192, 8, 1, 132, n) for n in range(1, 8193))
    )


def test_bad_inputs_name_the_problem():
    """Check that a bad tile, mismatched keys and values, a missing scale or a batch or split of 0 gives a ValueError
    naming it."""
    q, kv = torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 5, 4)
    cache = list(_int8_cache(np.random.default_rng(0), 5))
    for call, words in (
        (lambda: fused.tiled_attention(q, kv, kv, 0), "tile must be a positive int"),
        (lambda: fused.tiled_attention(q, kv, kv, 2.0), "tile must be a positive int"),
        (lambda: fused.tiled_attention(q, kv, torch.zeros(1, 2, 4, 4), 2), "k and v must have the same shape"),
        (lambda: fused.tiled_attention(torch.zeros(1, 2, 6, 4), kv, kv, 2), "need at least as many keys"),
        (lambda: fused.flash_decode(q[:, :, :1], kv, kv, -1), "chunk must be a positive int"),
        (lambda: fused.flash_decode(q[:, :, :1], kv, kv[:, :, :4], 2), "k and v must have one shape"),
        (lambda: fused.online_softmax([]), "non-empty list"),
        (lambda: fused.online_softmax([(torch.zeros(3), torch.zeros(4, 2))]), "values must be scores' shape"),
        (lambda: fused.merge_partials(torch.zeros(2, 3, 4), torch.zeros(3, 3)), "lses must be outs' shape"),
        (
            lambda: fused.int8_folded_attention(torch.zeros(2, 6, 1, 8), cache[0], None, cache[2], cache[3], 5),
            "needs its scales",
        ),
        (lambda: fused.int8_folded_attention(torch.zeros(2, 6, 2, 8), *cache, 5), "one query"),
        (lambda: fused.flash_decode_splits(8192, 8, 0, 132), "batch must be a positive integer"),
        (lambda: fused.split_steps(8192, 8, 1, 132, 0), "n_splits must be a positive integer"),
    ):
        with pytest.raises(ValueError, match=words):
            call()


# ---------------------------------------------------------------------------------------------
# Other correct ways pass every check; likely slips fail, with their names


def _module(**replaced) -> types.SimpleNamespace:
    return handed_in(fused, NAMES, **replaced)


def _messages(ex_id: str, **replaced) -> list[str]:
    out = []
    for check in checks_for(BY_ID[ex_id]):
        try:
            check.fn(Graded(_module(**replaced), "fused"), np.random.default_rng(0))  # ready-made answers closed
            out.append("")
        except AssertionError as err:
            out.append(str(err) or "assertion")
        except Exception as err:  # a crash in the code under test is a failure too
            out.append(f"{type(err).__name__}: {err}")
    return out


def _online(chunks, rescale_sum=True, rescale_acc=True, subtract_max=True, guard=True, keep=True):
    """The online loop with one of its parts left out: the slips' common body."""
    m = l = acc = None
    for s, v in chunks:
        if m is None:
            m, l = torch.full(s.shape[:-1], float("-inf")), torch.zeros(s.shape[:-1])
            acc = torch.zeros(v.shape[:-2] + v.shape[-1:])
        new = torch.maximum(m, s.amax(-1)) if subtract_max else torch.zeros_like(m)
        shift = torch.where(torch.isfinite(new), new, 0.0) if guard else new
        alpha = torch.exp(m - shift) if subtract_max else torch.ones_like(m)
        p = torch.exp(s - shift[..., None])
        if not keep:
            l, acc = torch.zeros_like(l), torch.zeros_like(acc)
        l = (l * alpha if rescale_sum else l) + p.sum(-1)
        acc = (acc * alpha[..., None] if rescale_acc else acc) + (p[..., None, :] @ v).squeeze(-2)
        m = new
    return acc / l[..., None]


def online_two_pass(chunks):  # first pass: the global max; second: sums against it (reads each chunk twice)
    m = None
    for s, _ in chunks:
        m = s.amax(-1) if m is None else torch.maximum(m, s.amax(-1))
    l = sum(torch.exp(s - m[..., None]).sum(-1) for s, _ in chunks)
    acc = sum((torch.exp(s - m[..., None])[..., None, :] @ v).squeeze(-2) for s, v in chunks)
    return acc / l[..., None]


def online_lse(chunks):  # carry a running log-sum-exp instead of a maximum and a sum
    lse = out = None
    for s, v in chunks:
        c_lse = torch.logsumexp(s, -1)
        c_out = (torch.nan_to_num(torch.exp(s - c_lse[..., None]), nan=0.0)[..., None, :] @ v).squeeze(-2)
        if lse is None:
            lse, out = c_lse, c_out
            continue
        new = torch.logaddexp(lse, c_lse)
        w_old = torch.nan_to_num(torch.exp(lse - new), nan=0.0)
        w_new = torch.nan_to_num(torch.exp(c_lse - new), nan=0.0)
        out, lse = w_old[..., None] * out + w_new[..., None] * c_out, new
    return out


def online_float64(chunks):  # each chunk in float64 as it is read
    return _online((s.double(), v.double()) for s, v in chunks).float()


def online_keeps_float64_copies(chunks):  # right values, but every chunk kept (in float64) before the loop
    return _online([(s.double(), v.double()) for s, v in chunks]).float()


def online_float64_out(chunks):  # right values, float64 out
    return _online((s.double(), v.double()) for s, v in chunks)


def online_zeros(chunks):  # the right shape, nothing computed
    return torch.zeros(chunks[0][1].shape[:-2] + chunks[0][1].shape[-1:])


def online_no_rescale_acc(chunks):
    return _online(chunks, rescale_acc=False)


def online_no_max(chunks):
    return _online(chunks, subtract_max=False)


def online_no_guard(chunks):
    return _online(chunks, guard=False)


def online_concat(chunks):
    s, v = torch.cat([c[0] for c in chunks], -1), torch.cat([c[1] for c in chunks], -2)
    return (s.softmax(-1)[..., None, :] @ v).squeeze(-2)


def online_last_chunk(chunks):
    return _online(chunks, keep=False)


def _tiled(q, k, v, tile, *, skip=True, mask_diagonal=True, top_left=False, scale=True, keys_to="last", masked="any"):
    """The tiled loop with one of its parts wrong: the slips' common body. keys_to: the key tiles a query tile runs to
    ("last": its last query's, "first": its first query's, "aligned": as if kv_len - seq_len were a multiple of the
    tile); masked: which computed tiles are masked ("any": those with a key in some query's future, "last": only the
    last one)."""
    T, S, D = q.shape[2], k.shape[2], q.shape[3]
    offset = 0 if top_left else S - T
    out = torch.empty(q.shape)
    for i0 in range(0, T, tile):
        qi = q[:, :, i0 : i0 + tile] / (math.sqrt(D) if scale else 1.0)
        tq = qi.shape[2]
        rows = offset + i0 + torch.arange(tq)
        m, l, acc = torch.full(qi.shape[:3], float("-inf")), torch.zeros(qi.shape[:3]), torch.zeros(qi.shape)
        end = {
            "last": offset + i0 + tq,
            "first": offset + i0 + 1,
            "aligned": (i0 // tile + offset // tile + 1) * tile,
            "no offset": i0 + tq,  # as if kv_len were seq_len
        }
        starts = list(range(0, min(S, end[keys_to]) if skip else S, tile))
        for j0 in starts:
            kj, vj = k[:, :, j0 : j0 + tile], v[:, :, j0 : j0 + tile]
            s = qi @ kj.transpose(-2, -1)
            if (mask_diagonal or not skip) and (masked == "any" or j0 == starts[-1]):
                s = s.masked_fill(rows[:, None] < j0 + torch.arange(kj.shape[2]), float("-inf"))
            new = torch.maximum(m, s.amax(-1))
            shift = torch.where(torch.isfinite(new), new, 0.0)
            alpha, p = torch.exp(m - shift), torch.exp(s - shift[..., None])
            l, acc, m = l * alpha + p.sum(-1), acc * alpha[..., None] + p @ vj, new
        out[:, :, i0 : i0 + tq] = acc / l[..., None]
    return out


def tiled_query_rows(q, k, v, tile):  # one query tile at a time against key tiles, written with einsum
    T, S, D = q.shape[2], k.shape[2], q.shape[3]
    outs = []
    for i0 in range(0, T, tile):
        qi = q[:, :, i0 : i0 + tile]
        tq, last = qi.shape[2], S - T + i0 + qi.shape[2] - 1
        parts = []
        for j0 in range(0, last + 1, tile):
            kj, vj = k[:, :, j0 : j0 + tile], v[:, :, j0 : j0 + tile]
            s = torch.einsum("bhtd,bhsd->bhts", qi, kj) / math.sqrt(D)
            pos = S - T + i0 + torch.arange(tq)
            s = s.masked_fill(pos[:, None] < j0 + torch.arange(kj.shape[2]), float("-inf"))
            lse = torch.logsumexp(s, -1)
            parts.append((torch.einsum("bhts,bhsd->bhtd", torch.exp(s - lse[..., None]), vj), lse))
        out, _ = fused.merge_partials(torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts]))
        outs.append(out)
    return torch.cat(outs, 2)


def tiled_float64(q, k, v, tile):
    return _tiled(q.double(), k.double(), v.double(), tile).float()


def tiled_mask_everywhere(q, k, v, tile):  # skips the future tiles, and masks every computed tile (harmless)
    return _tiled(q, k, v, tile, mask_diagonal=True)


def tiled_every_tile(q, k, v, tile):
    return _tiled(q, k, v, tile, skip=False)


def tiled_unmasked_diagonal(q, k, v, tile):
    return _tiled(q, k, v, tile, mask_diagonal=False)


def tiled_top_left(q, k, v, tile):
    return _tiled(q, k, v, tile, top_left=True)


def tiled_keys_to_first_row(q, k, v, tile):
    return _tiled(q, k, v, tile, keys_to="first")


def tiled_keys_counted_aligned(q, k, v, tile):
    return _tiled(q, k, v, tile, keys_to="aligned")


def tiled_keys_without_offset(q, k, v, tile):
    return _tiled(q, k, v, tile, keys_to="no offset")


def tiled_last_tile_masked(q, k, v, tile):
    return _tiled(q, k, v, tile, masked="last")


def tiled_past_kv_len(q, k, v, tile):  # key tiles up to one past the last query's: past kv_len at the end
    T, S, D = q.shape[2], k.shape[2], q.shape[3]
    out = torch.empty(q.shape)
    for i0 in range(0, T, tile):
        qi, rows = q[:, :, i0 : i0 + tile] / math.sqrt(D), S - T + i0 + torch.arange(min(tile, T - i0))
        m, l, acc = torch.full(qi.shape[:3], float("-inf")), torch.zeros(qi.shape[:3]), torch.zeros(qi.shape)
        for j0 in range(0, S - T + i0 + qi.shape[2] + tile, tile):
            kj, vj = k[:, :, j0 : j0 + tile], v[:, :, j0 : j0 + tile]
            s = (qi @ kj.transpose(-2, -1)).masked_fill(rows[:, None] < j0 + torch.arange(kj.shape[2]), float("-inf"))
            new = torch.maximum(m, s.amax(-1))
            p, rescale = torch.exp(s - new[..., None]), torch.exp(m - new)
            l, acc, m = l * rescale + p.sum(-1), acc * rescale[..., None] + p @ vj, new
        out[:, :, i0 : i0 + qi.shape[2]] = acc / l[..., None]
    return out


def tiled_float64_out(q, k, v, tile):  # right values, float64 out
    return _tiled(q.double(), k.double(), v.double(), tile).double()


def tiled_query_stripe(q, k, v, tile):  # one query tile against all its keys at once: right, and no key tiles
    T, S, D = q.shape[2], k.shape[2], q.shape[3]
    out = torch.empty(q.shape)
    for i0 in range(0, T, tile):
        qi, last = q[:, :, i0 : i0 + tile], S - T + i0 + min(tile, T - i0)
        s = qi @ k[:, :, :last].transpose(-2, -1) / math.sqrt(D)
        s = s.masked_fill(S - T + i0 + torch.arange(qi.shape[2])[:, None] < torch.arange(last), float("-inf"))
        out[:, :, i0 : i0 + qi.shape[2]] = s.softmax(-1) @ v[:, :, :last]
    return out


def tiled_sdpa_per_query_tile(q, k, v, tile):  # torch's attention for each query tile over the keys it sees
    T, S = q.shape[2], k.shape[2]
    out = torch.empty(q.shape)
    for i0 in range(0, T, tile):
        qi, last = q[:, :, i0 : i0 + tile], S - T + i0 + min(tile, T - i0)
        mask = torch.ones(qi.shape[2], last, dtype=torch.bool).tril(last - qi.shape[2])
        out[:, :, i0 : i0 + qi.shape[2]] = F.scaled_dot_product_attention(
            qi, k[:, :, :last], v[:, :, :last], attn_mask=mask
        )
    return out


def tiled_full_matrix(q, k, v, tile):  # right answer, through the whole score matrix
    T, S = q.shape[2], k.shape[2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return scores.masked_fill(~torch.ones(T, S, dtype=torch.bool).tril(S - T), float("-inf")).softmax(-1) @ v


def tiled_full_mask_sliced(q, k, v, tile):  # right answer, tiles skipped, but each tile's mask cut from a T x S one
    T, S, D = q.shape[2], k.shape[2], q.shape[3]
    allowed = torch.ones(T, S, dtype=torch.bool).tril(S - T)
    out = torch.empty(q.shape)
    for i0 in range(0, T, tile):
        qi = q[:, :, i0 : i0 + tile] / math.sqrt(D)
        m, l, acc = torch.full(qi.shape[:3], float("-inf")), torch.zeros(qi.shape[:3]), torch.zeros(qi.shape)
        for j0 in range(0, S - T + i0 + qi.shape[2], tile):
            kj, vj = k[:, :, j0 : j0 + tile], v[:, :, j0 : j0 + tile]
            s = (qi @ kj.transpose(-2, -1)).masked_fill(~allowed[i0 : i0 + tile, j0 : j0 + tile], float("-inf"))
            new = torch.maximum(m, s.amax(-1))
            p, rescale = torch.exp(s - new[..., None]), torch.exp(m - new)
            l, acc, m = l * rescale + p.sum(-1), acc * rescale[..., None] + p @ vj, new
        out[:, :, i0 : i0 + qi.shape[2]] = acc / l[..., None]
    return out


def tiled_by_the_figures_map(q, k, v, tile):  # right, the skip and the mask read off bench_fused.tile_kinds
    T, S, D = q.shape[2], k.shape[2], q.shape[3]
    kinds = bench_fused.tile_kinds(T, S, tile)
    out = torch.empty(q.shape)
    for a, i0 in enumerate(range(0, T, tile)):
        qi, rows = q[:, :, i0 : i0 + tile] / math.sqrt(D), S - T + i0 + torch.arange(min(tile, T - i0))
        m, l, acc = torch.full(qi.shape[:3], float("-inf")), torch.zeros(qi.shape[:3]), torch.zeros(qi.shape)
        for b, j0 in enumerate(range(0, S, tile)):
            if kinds[a, b] == bench_fused.SKIPPED:
                continue
            kj, vj = k[:, :, j0 : j0 + tile], v[:, :, j0 : j0 + tile]
            s = qi @ kj.transpose(-2, -1)
            if kinds[a, b] == bench_fused.MASKED:
                s = s.masked_fill(rows[:, None] < j0 + torch.arange(kj.shape[2]), float("-inf"))
            new = torch.maximum(m, s.amax(-1))
            p, rescale = torch.exp(s - new[..., None]), torch.exp(m - new)
            l, acc, m = l * rescale + p.sum(-1), acc * rescale[..., None] + p @ vj, new
        out[:, :, i0 : i0 + qi.shape[2]] = acc / l[..., None]
    return out


def merge_softmax_weights(outs, lses):  # weights as a softmax over the chunk axis
    w = torch.softmax(lses, dim=0)
    return torch.nan_to_num(w[..., None] * outs, nan=0.0).sum(0), torch.logsumexp(lses, 0)


def merge_pairwise(outs, lses):  # fold the chunks in one at a time with logaddexp
    out, lse = torch.nan_to_num(outs[0], nan=0.0), lses[0]
    for o, l in zip(outs[1:], lses[1:]):
        new = torch.logaddexp(lse, l)
        w_old, w_new = torch.exp(lse - new), torch.exp(l - new)
        o = torch.where(w_new[..., None] > 0, o, 0.0)
        out, lse = w_old[..., None] * out + w_new[..., None] * o, new
    return out, lse


def merge_float64(outs, lses):
    out, lse = fused.merge_partials(outs.double(), lses.double())
    return out.float(), lse.float()


def merge_mean(outs, lses):
    return outs.mean(0), torch.logsumexp(lses, 0)


def merge_max_lse(outs, lses):
    out, _ = fused.merge_partials(outs, lses)
    return out, lses.amax(0)


def merge_no_shift(outs, lses):  # exp(lse) without the largest subtracted: overflows at lse ~ 100
    w = torch.exp(lses)
    return (torch.where(w[..., None] > 0, w[..., None] * outs, 0.0)).sum(0) / w.sum(0)[..., None], torch.log(w.sum(0))


def merge_times_zero(outs, lses):  # weight 0 times a nan out is nan
    lse = torch.logsumexp(lses, 0)
    return (torch.exp(lses - lse)[..., None] * outs).sum(0), lse


def _folded(q, k_values, k_scale, v_values, v_scale, kv_len, block_tokens, dtype=torch.float32):
    B, H_kv, n_groups, group, D = k_values.shape
    G = q.shape[1] // H_kv
    qg = q.reshape(B, H_kv, G, D) / math.sqrt(D)
    scores = []
    for g in range(0, -(-kv_len // group), max(1, block_tokens // group)):
        nb = min(max(1, block_tokens // group), n_groups - g)
        for i in range(nb):
            scores.append((qg * k_scale[:, :, g + i]) @ k_values[:, :, g + i].to(dtype).transpose(-2, -1))
    probs = torch.cat(scores, -1)[..., :kv_len].softmax(-1) * v_scale[:, :, None, :kv_len, 0]
    out = sum(
        probs[..., j : j + block_tokens] @ v_values[:, :, j : min(kv_len, j + block_tokens)].to(dtype)
        for j in range(0, kv_len, block_tokens)
    )
    return out.reshape(B, H_kv * G, 1, D)


def folded_per_group(q, k_values, k_scale, v_values, v_scale, kv_len):  # one group of keys at a time
    return _folded(q, k_values, k_scale, v_values, v_scale, kv_len, k_values.shape[3])


def folded_einsum(q, k_values, k_scale, v_values, v_scale, kv_len):  # blocks of 128 tokens, einsum
    B, H_kv, n_groups, group, D = k_values.shape
    G, per = q.shape[1] // H_kv, max(1, 128 // group)
    qg = q.reshape(B, H_kv, G, D) / math.sqrt(D)
    scores = [
        torch.einsum("bhgd,bhnd,bhnsd->bhgns", qg, k_scale[:, :, g : g + per, 0], k_values[:, :, g : g + per].float())
        for g in range(0, -(-kv_len // group), per)
    ]
    probs = torch.cat([s.flatten(3) for s in scores], -1)[..., :kv_len].softmax(-1) * v_scale[:, :, None, :kv_len, 0]
    out = sum(
        torch.einsum("bhgs,bhsd->bhgd", probs[..., j : j + 128], v_values[:, :, j : min(kv_len, j + 128)].float())
        for j in range(0, kv_len, 128)
    )
    return out.reshape(B, -1, 1, D)


def folded_float64(q, k_values, k_scale, v_values, v_scale, kv_len):
    return _folded(
        q.double(), k_values, k_scale.double(), v_values, v_scale.double(), kv_len, 64, torch.float64
    ).float()


def folded_groups_rounded_down(q, k_values, k_scale, v_values, v_scale, kv_len):  # kv_len // group groups
    B, H_kv, n_groups, group, D = k_values.shape
    G, per = q.shape[1] // H_kv, 64  # blocks of 64 groups
    qg = q.reshape(B, H_kv, G, D) / math.sqrt(D)
    scores = [
        (qg[:, :, None] * k_scale[:, :, g : g + per]) @ k_values[:, :, g : g + per].float().transpose(-2, -1)
        for g in range(0, max(1, kv_len // group), per)  # the slip: a partly filled last group past a block is lost
    ]
    probs = torch.cat([x.transpose(2, 3).flatten(3) for x in scores], -1)[..., :kv_len].softmax(-1)
    S = probs.shape[-1]
    out = (probs * v_scale[:, :, None, :S, 0]) @ v_values[:, :, :S].float()
    return out.reshape(B, H_kv * G, 1, D)


def folded_float64_out(q, k_values, k_scale, v_values, v_scale, kv_len):  # right values, float64 out
    return folded_float64(q, k_values, k_scale, v_values, v_scale, kv_len).double()


def folded_dequantise_all(q, k_values, k_scale, v_values, v_scale, kv_len):  # right answer, via the float copy
    return compress.int8_attention(q, k_values, k_scale, v_values, v_scale, kv_len)


def folded_flash_decode_dequantised(q, k_values, k_scale, v_values, v_scale, kv_len):  # flash_decode over 8's copy
    B, H_kv, n_groups, group, D = k_values.shape
    parts = []
    for g in range(-(-kv_len // group)):  # one group at a time: chunk_partial over its dequantised keys, merged (9.3)
        end = min(kv_len, (g + 1) * group)
        k = compress.dequantize(k_values[:, :, g], k_scale[:, :, g])[:, :, : end - g * group]
        v = compress.dequantize(v_values[:, :, g * group : end], v_scale[:, :, g * group : end])
        parts.append(fused.chunk_partial(q, k, v))
    return fused.merge_partials(torch.stack([o for o, _ in parts]), torch.stack([lse for _, lse in parts]))[0]


def folded_dequantised_by_hand(q, k_values, k_scale, v_values, v_scale, kv_len):  # the same, no kvlib helper
    B, H_kv, n_groups, group, D = k_values.shape
    G = q.shape[1] // H_kv
    qg = q.reshape(B, H_kv, G, D) / math.sqrt(D)
    scores = [qg @ (k_values[:, :, g].float() * k_scale[:, :, g]).transpose(-2, -1) for g in range(-(-kv_len // group))]
    probs = torch.cat(scores, -1)[..., :kv_len].softmax(-1) * v_scale[:, :, None, :kv_len, 0]
    return (probs @ v_values[:, :, :kv_len].float()).reshape(B, H_kv * G, 1, D)


def folded_no_k_scale(q, k_values, k_scale, v_values, v_scale, kv_len):
    return fused.int8_folded_attention(q, k_values, torch.ones_like(k_scale), v_values, v_scale, kv_len)


def folded_all_slots(q, k_values, k_scale, v_values, v_scale, kv_len):
    S = min(k_values.shape[2] * k_values.shape[3], v_values.shape[2])
    return fused.int8_folded_attention(q, k_values, k_scale, v_values, v_scale, S)


# 9.5 flash_decode_splits: a design, so any number of splits within 1.1 of the fewest key-steps earns the points


def splits_fill_waves(kv_len, n_kv_heads, batch, n_sms):  # a rule, no search: the fewest splits filling whole waves
    return min(kv_len, n_sms // math.gcd(n_sms, batch * n_kv_heads))


def splits_numpy(kv_len, n_kv_heads, batch, n_sms):  # the model vectorised over the first 4 x n_sms counts, an np.int64
    n = np.arange(1, min(kv_len, 4 * n_sms) + 1)
    steps = -(-batch * n_kv_heads * n // n_sms) * -(-kv_len // n) + n
    return np.int64(n[np.argmin(steps)])


def splits_largest_within(kv_len, n_kv_heads, batch, n_sms):  # not the best: the most splits within 1.1 of the first
    counts = range(1, min(kv_len, 4 * n_sms) + 1)  # 4 x n_sms counts' best
    steps = [math.ceil(batch * n_kv_heads * n / n_sms) * math.ceil(kv_len / n) + n for n in counts]
    fewest = min(steps)
    return max(n for n, s in zip(counts, steps) if s <= 1.1 * fewest)


def splits_every_count(kv_len, n_kv_heads, batch, n_sms):  # right, but searches 1 to kv_len: 2**40 counts
    return min(range(1, kv_len + 1), key=lambda n: fused.split_steps(kv_len, n_kv_heads, batch, n_sms, n))


def splits_none(kv_len, n_kv_heads, batch, n_sms):
    return 1


def splits_per_sm(kv_len, n_kv_heads, batch, n_sms):  # one split per SM in every head: the heads ignored
    return n_sms


def splits_one_too_many(kv_len, n_kv_heads, batch, n_sms):  # a block past a full wave
    return n_sms // (batch * n_kv_heads) + 1


def splits_hard_coded(kv_len, n_kv_heads, batch, n_sms):  # the H100's answer, whatever the GPU
    return 16


def splits_float(kv_len, n_kv_heads, batch, n_sms):
    return float(fused.flash_decode_splits(kv_len, n_kv_heads, batch, n_sms))


ALTERNATIVES = {
    "9.1": ("online_softmax", [online_two_pass, online_lse, online_float64]),
    "9.2": ("tiled_attention", [tiled_query_rows, tiled_float64, tiled_mask_everywhere]),
    "9.3": ("merge_partials", [merge_softmax_weights, merge_pairwise, merge_float64]),
    "9.4": ("int8_folded_attention", [folded_per_group, folded_einsum, folded_float64]),
    "9.5": ("flash_decode_splits", [splits_fill_waves, splits_numpy, splits_largest_within]),
}
_ALT = [(ex, name, fn) for ex, (name, fns) in ALTERNATIVES.items() for fn in fns]


@pytest.mark.parametrize("ex_id, name, fn", _ALT, ids=[f"{c[0]}-{c[2].__name__}" for c in _ALT])
def test_other_correct_implementations_pass(ex_id, name, fn):
    """Check that a correct implementation written another way passes every check of its exercise."""
    failures = [m for m in _messages(ex_id, **{name: fn}) if m]
    assert not failures, failures


SLIPS = [
    ("9.1", "online_softmax", online_no_rescale_acc, "running output is not rescaled"),
    ("9.1", "online_softmax", online_no_max, "no maximum was subtracted"),
    ("9.1", "online_softmax", online_no_guard, "exp(-inf - (-inf))"),
    ("9.1", "online_softmax", online_concat, "kept the chunks it read"),
    ("9.1", "online_softmax", online_keeps_float64_copies, "kept the chunks it read"),
    ("9.1", "online_softmax", online_float64_out, "returned torch.float64 for torch.float32 inputs"),
    ("9.1", "online_softmax", online_zeros, "differs from softmax over all the chunks"),
    ("9.1", "online_softmax", online_last_chunk, "only the last chunk counts"),
    ("9.2", "tiled_attention", tiled_every_tile, "computed too"),
    ("9.2", "tiled_attention", tiled_unmasked_diagonal, "keys in a query's future are attended"),
    ("9.2", "tiled_attention", tiled_top_left, "top-left"),
    ("9.2", "tiled_attention", tiled_full_matrix, "the whole 32 x 200 score matrix"),
    ("9.2", "tiled_attention", tiled_keys_to_first_row, "a partly visible key tile was skipped"),
    ("9.2", "tiled_attention", tiled_keys_counted_aligned, "a partly visible key tile was skipped"),
    ("9.2", "tiled_attention", tiled_keys_without_offset, "key tiles the queries see were skipped"),
    ("9.2", "tiled_attention", tiled_last_tile_masked, "only the last key tile of each query tile is masked"),
    ("9.2", "tiled_attention", tiled_float64_out, "returned torch.float64 for torch.float32 inputs"),
    ("9.2", "tiled_attention", tiled_query_stripe, "one tile of 8 queries against all the 176 or more keys"),
    ("9.2", "tiled_attention", tiled_sdpa_per_query_tile, "ran torch's fused attention"),
    ("9.2", "tiled_attention", tiled_past_kv_len, "its key tiles run past the last key"),
    ("9.2", "tiled_attention", tiled_full_mask_sliced, "a mask over it"),
    ("9.2", "tiled_attention", tiled_by_the_figures_map, "called the figure's map of the tiles"),
    ("9.3", "merge_partials", merge_mean, "averaged"),
    ("9.3", "merge_partials", merge_max_lse, "largest lse_c"),
    ("9.3", "merge_partials", merge_no_shift, "exp(lse) overflows"),
    ("9.3", "merge_partials", merge_times_zero, "0 * nan is nan"),
    ("9.4", "int8_folded_attention", folded_dequantise_all, "called 8.2's int8_attention"),
    ("9.4", "int8_folded_attention", folded_flash_decode_dequantised, "called dequantize"),
    ("9.4", "int8_folded_attention", folded_dequantised_by_hand, "the float keys k_values * k_scale were formed"),
    ("9.4", "int8_folded_attention", folded_no_k_scale, "keys are read without their scales"),
    ("9.4", "int8_folded_attention", folded_all_slots, "past kv_len"),
    ("9.4", "int8_folded_attention", folded_groups_rounded_down, "the last, partly filled group of keys was left out"),
    ("9.4", "int8_folded_attention", folded_float64_out, "returned torch.float64 for torch.float32 inputs"),
    ("9.5", "flash_decode_splits", splits_none, "124 of them sit idle"),
    ("9.5", "flash_decode_splits", splits_per_sm, "the blocks are batch x n_kv_heads x n_splits"),
    ("9.5", "flash_decode_splits", splits_one_too_many, "a wave you start should be (nearly) full"),
    ("9.5", "flash_decode_splits", splits_hard_coded, "108 SMs"),
    ("9.5", "flash_decode_splits", splits_float, "an int number of splits"),
    ("9.5", "flash_decode_splits", splits_every_count, "trying every split count from 1 to kv_len cannot finish"),
]


@pytest.mark.parametrize("ex_id, name, fake, words", SLIPS, ids=[f"{s[0]}-{s[2].__name__}" for s in SLIPS])
def test_check_names_the_known_mistake(ex_id, name, fake, words):
    """Check that a likely slip fails its exercise's checks with a message naming it."""
    failures = [m for m in _messages(ex_id, **{name: fake}) if m]
    assert failures, f"{fake.__name__} passed every check of {ex_id}"
    assert any(words in m for m in failures), failures


# ---------------------------------------------------------------------------------------------
# The benchmark's report


@pytest.mark.slow  # runs the benchmark (quick): a few seconds, no torch.compile
def test_bench_fused_quick_reports_every_part():
    """Check that `kvlib bench fused --quick` gives peak memory, FLOPs and decode rows, and formats them."""
    with on_a_terminal() as err:
        report = bench_fused.bench_fused(quick=True)
    for desc in ("kvlib bench fused", "peak memory", "a decode step's attention"):
        assert shown_progress(err.getvalue(), desc), desc
    assert "USDT" not in err.getvalue()  # the profiler's own lines are gone
    assert [r["seq_len"] for r in report["memory"]["rows"]] == [256, 512]
    assert all(r["tiled_peak_bytes"] < r["naive_peak_bytes"] for r in report["memory"]["rows"])
    assert all(0.4 < r["causal_share"] < 0.7 for r in report["flops"])
    assert {"float32 SDPA", "int8, dequantised copy (8.2)", "int8, folded (9.4)"} <= set(report["decode"]["ways"])
    text = bench_fused.format_fused(report)
    assert "peak" in text and "goal" in text
