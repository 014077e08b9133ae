"""Checks for notebook 09 (kvlib/fused.py): exercises 9.1-9.5 (09a: 9.1, 9.2; 09b: 9.3, 9.5, 9.4).

Sizes all differ (batch 2, 3 or 6 query heads, 2 key/value heads, head_dim 8, chunks and tiles that do
not divide the lengths), so a swapped axis fails. Every expected value and size limit is computed here
in float64 before learner code runs, from tensors the learner's code never receives (it gets clones).
Named slips: the old sum or output not rescaled when the maximum grows, no maximum subtracted
(exp(1000) overflows), nan from a chunk whose scores are all -inf, the chunks kept or concatenated,
every tile computed (the future ones too: a nan planted in a future tile's values reaches earlier
queries), the diagonal tiles left unmasked or only the last one masked, key tiles stopped at a query
tile's first query (kv_len - seq_len not a multiple of the tile) or run past the last key, a tile of queries against
all its keys, torch's fused attention, a mask aligned top-left, outs averaged instead of weighted by
exp(lse), lse returned as a maximum, the int8 cache dequantised whole or its last partial group
dropped, float64 returned for float32. In the isolated grader the grading process measures the
memory a large call holds (kvlib.grading.memory), 9.1's chunks handed in one at a time from it, and
torch's fused attention kernel is replaced there by its math path (kvlib.grading._child); every 9.2
cell includes the measured case, so only tiles earn its points (docs/instructors.md).
The texts a message is built from (which case, what a slip is called) go through tr(), so that the catalogue
(kvlib/course/i18n.py) translates them as it does the messages.
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import numpy as np
import torch

from kvlib.checks import MB, check, held_nothing_before, isolated, memory_of, time_limit
from kvlib.checks.compress import _int8_cache, _int8_expected_and_slips
from kvlib.core.stream import Stream
from kvlib.course.i18n import tr
from kvlib.measure.timing import new_tensors, peak_tensor_bytes

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
        tr(
            "the running output is not rescaled when the maximum grows (the running sum is): its older terms stay "
            "taken against the old maximum"
        ): run(rescale_acc=False),
        tr(
            "the running sum is not rescaled when the maximum grows (the running output is): its older terms stay "
            "taken against the old maximum"
        ): run(rescale_sum=False),
        tr("neither the running sum nor the running output is rescaled when the maximum grows"): run(False, False),
        tr("only the last chunk counts: the earlier chunks' keys are lost from the result"): last,
    }
    return expected, slips


def _softmax_case(kv, scores, values, what, call=None):
    """online_softmax on copies of the chunks (or call(chunks)) against softmax over them all, its slips named (in
    small cases: a long one's slips are the small cases' too)."""
    if sum(s.numel() for s in scores) <= 1 << 16:
        expected, slips = _softmax_expected_and_slips(scores, values)
    else:
        s, v = torch.cat(scores, -1).double(), torch.cat(values, -2).double()
        expected, slips = (s.softmax(-1)[..., None, :] @ v).squeeze(-2), {}
    chunks = [(s.clone(), v.clone()) for s, v in zip(scores, values)]
    got = kv.online_softmax(chunks) if call is None else call(chunks)
    shape = tuple(expected.shape)
    assert isinstance(got, torch.Tensor) and tuple(got.shape) == shape, (
        f"{what}: online_softmax should return (..., head_dim) = {shape}, got {_shape_of(got)}"
    )
    slips["__nonfinite__"] = tr(
        "the output holds inf or nan: exp of a large score overflows float32 (no maximum was subtracted before "
        "exp), or a row whose scores so far are all -inf gives exp(-inf - (-inf)) = nan"
    )
    assert _close(got, expected), tr(
        "{where}: {why}",
        where=what,
        why=_diagnose(got, slips, tr("the output differs from softmax over all the chunks' scores times their values")),
    )
    _same_dtype(got, scores[0], "online_softmax", what)


@check("9.1")
def online_softmax_matches_softmax_over_all_chunks(kv, rng):
    """Check chunks of 3, 1, 5 and 2 keys (and a single chunk) against softmax over their concatenation."""
    scores, values = _chunked(rng, (3, 1, 5, 2))
    scores[2] += 4  # the maximum grows in a later chunk: the earlier terms must be rescaled
    _softmax_case(kv, scores, values, tr("chunks of 3, 1, 5, 2 keys"))
    _softmax_case(kv, *_chunked(rng, (6,)), tr("one chunk of 6 keys"))
    _softmax_case(kv, *_chunked(rng, (1, 1, 1), lead=(5,)), tr("three chunks of 1 key, 5 rows"))


@check("9.1")
def online_softmax_is_stable_and_handles_masked_keys(kv, rng):
    """Check scores near 1,000, and rows whose first chunk is all -inf (masked keys), without overflow or nan."""
    _softmax_case(kv, *_chunked(rng, (4, 3, 4), offset=1000.0), tr("scores near 1,000"))
    scores, values = _chunked(rng, (3, 4, 2))
    scores[0][0, 1] = float("-inf")  # every key of the first chunk masked for some rows
    scores[1][1, :, 2, 0] = float("-inf")
    _softmax_case(kv, scores, values, tr("a first chunk whose keys are all masked (-inf) for some rows"))


class StreamedChunks:
    """9.1's chunks as the isolated grader hands them over: they stay in the grading process, and the learner's code
    gets a list (kvlib.core.stream.Stream) whose chunks come from here one by one as it reads them (item(i)), so what
    the call holds at once is what it keeps of them, and the grader measures that."""

    kvlib_sequence = True
    kvlib_public = ("item",)  # all the learner's code can do with it: read chunk i

    def __init__(self, chunks: list):
        self._chunks = chunks

    def __len__(self) -> int:
        return len(self._chunks)

    def item(self, i: int):
        return self._chunks[i]


# The streamed case: 64 chunks, at most a quarter of them held at once. In the isolated grader chunks of 120-200 keys
# for 2 x 3 x 32 rows of head_dim 8, 0.9-1.5 MB each, 73 MB together; what a call holds at its peak as it reads
# them: right loops 4-8 MB (a float64 copy of one chunk included), every chunk kept, or concatenated, 73-150 MB.
# Locally, tensors watched, chunks of 20-30 keys for 2 x 3 x 4 rows: a right loop holds 3-5 chunks' worth
_STREAM = {True: dict(n=64, lead=(2, 3, 32), keys=(120, 200)), False: dict(n=64, lead=(2, 3, 4), keys=(20, 30))}


@check("9.1")
def online_softmax_reads_one_chunk_at_a_time(kv, rng):
    """Check that the chunks are read one at a time and none is kept: no concatenation, no list of them all.

    The chunks reach the call one by one, as it reads them (a list whose items are made when read), and what the call
    holds at once is measured: in the isolated grader the chunks stay in the grading process, which reads the call's
    memory (64 chunks, 73 MB together); locally the tensors the call makes are watched (64 smaller chunks)."""
    _softmax_case(kv, *_chunked(rng, (3, 4)), tr("chunks of 3 and 4 keys"))  # first calls pull in torch's code
    remote = isolated(kv.online_softmax)
    n = _STREAM[remote]
    lengths = [int(c) for c in rng.integers(*n["keys"], size=n["n"])]
    scores, values = _chunked(rng, lengths, lead=n["lead"])
    what = tr(
        "{n} chunks of {low}-{high} keys, handed in one at a time", n=len(lengths), low=min(lengths), high=max(lengths)
    )
    held = []

    def streamed(chunks):
        if remote:
            got, usage = kv.online_softmax.memory(StreamedChunks(chunks))
            held_nothing_before(usage, "online_softmax")
            held.append(usage.peak)
        else:
            got, peak = peak_tensor_bytes(
                kv.online_softmax, Stream(lambda i: tuple(t.clone() for t in chunks[i]), range(len(chunks)))
            )
            held.append(peak)
        return got

    _softmax_case(kv, scores, values, what, call=streamed)
    total = sum(s.nbytes + v.nbytes for s, v in zip(scores, values))
    assert held[0] < total // 4, (
        f"{what}: online_softmax held {held[0] / MB:.1f} MB at its peak ("
        + ("the grader measures the process's memory" if remote else "the tensors it made and kept alive together")
        + f"), and the chunks are {total / MB:.1f} MB together, {total / len(lengths) / MB:.2f} MB each: it kept the "
        "chunks it read (a list of them, or their concatenation). The point is never to hold them together: keep a "
        "running maximum, sum and output, update them with each chunk, and let the chunk go"
    )


# ---------------------------------------------------------------------------------------------
# 9.2 tiled_attention


def _tile_allowed(T: int, S: int, tile: int, last_key_tile, masked) -> torch.Tensor:
    """(T, S) True where a tiled loop lets query i attend to key j: query tiles of `tile` rows from query 0, key tiles
    from key 0; query tile (i0, tq) computes key tiles 0..last_key_tile(i0, tq) and masks tile j0 when masked(j0, i0, tq)
    (how a slip of the loop attends; the right loop attends exactly the visible keys)."""
    offset, allowed = S - T, torch.zeros(T, S, dtype=torch.bool)
    visible = torch.ones(T, S, dtype=torch.bool).tril(offset)
    for i0 in range(0, T, tile):
        tq = min(tile, T - i0)
        for j in range(0, min(last_key_tile(i0, tq), (S - 1) // tile) + 1):
            j0 = j * tile
            block = visible[i0 : i0 + tq, j0 : j0 + tile] if masked(j0, i0, tq) else True
            allowed[i0 : i0 + tq, j0 : j0 + tile] = block
    return allowed


def _tile_slips(T: int, S: int, tile: int) -> dict:
    """{message: (T, S) keys attended} of the slips of a tiled loop that only show where kv_len - seq_len is not a
    multiple of the tile (a query tile then straddles two key tiles)."""
    offset = S - T
    last = lambda i0, tq: (offset + i0 + tq - 1) // tile  # noqa: E731 - the key tile of the tile's last query
    diagonal = lambda j0, i0, tq: j0 + tile - 1 > offset + i0  # noqa: E731 - some key in some query's future
    return {
        tr(
            "the tiles on the diagonal are not masked: keys in a query's future are attended there (skipping the "
            "tiles above it is not enough)"
        ): _tile_allowed(T, S, tile, last, lambda *a: False),
        tr(
            "only the last key tile of each query tile is masked: with kv_len - seq_len not a multiple of the tile, a "
            "query tile straddles two key tiles, and both hold keys in some query's future"
        ): _tile_allowed(T, S, tile, last, lambda j0, i0, tq: j0 == last(i0, tq) * tile),
        tr(
            "a partly visible key tile was skipped: the key tiles stop at the one holding the query tile's FIRST "
            "query (query tile i against key tiles 0..i + offset // tile, as if kv_len - seq_len were a multiple of "
            "the tile), but with kv_len - seq_len not a multiple of the tile, the tile's later queries see keys of "
            "the next key tile too"
        ): _tile_allowed(T, S, tile, lambda i0, tq: (offset + i0) // tile, diagonal),
        tr(
            "key tiles the queries see were skipped: each query tile's keys stop where they would if kv_len were "
            "seq_len, but the queries are the LAST seq_len of the kv_len positions, so their own and the newest keys "
            "are left out"
        ): _tile_allowed(T, S, tile, lambda i0, tq: (i0 + tq - 1) // tile, diagonal),
    }


def _tiled_case(kv, rng, T, S, tile, what):
    q, k, v = _randn(rng, B, H, T, D), _randn(rng, B, H, S, D), _randn(rng, B, H, S, D)
    expected = _attention(q, k, v)
    slips = {
        tr("the mask is aligned top-left: the seq_len queries are the LAST of the kv_len positions"): _attention(
            q, k, v, top_left=True
        ),
        tr("no causal mask at all: keys in a query's future are attended"): _attention(q, k, v, causal=False),
        **{message: _attention(q, k, v, allowed=allowed) for message, allowed in _tile_slips(T, S, tile).items()},
        tr("the scores are not divided by sqrt(head_dim)"): _attention(q, k, v, scale=1.0),
    }
    got = kv.tiled_attention(q.clone(), k.clone(), v.clone(), tile)
    assert isinstance(got, torch.Tensor) and tuple(got.shape) == (B, H, T, D), (
        f"{what}: tiled_attention should return (batch, n_heads, seq_len, head_dim) = {(B, H, T, D)}, "
        f"got {_shape_of(got)}"
    )
    slips["__nonfinite__"] = tr(
        "the output holds inf or nan: a row of a masked tile is all -inf, so exp(-inf - (-inf)) is nan, or exp "
        "overflowed"
    )
    assert _close(got, expected), tr(
        "{where}: {why}",
        where=what,
        why=_diagnose(
            got,
            slips,
            tr(
                "the output differs from causal SDPA: check the running statistics across key tiles, and that the "
                "tiles on the diagonal mask the keys past each query"
            ),
        ),
    )
    _same_dtype(got, q, "tiled_attention", what)


def _same_dtype(got, x, name: str, what: str) -> None:
    assert got.dtype == x.dtype, (
        f"{what}: {name} returned {got.dtype} for {x.dtype} inputs: return the inputs' dtype (work in float64 if you "
        f"like, then .to({str(x.dtype).replace('torch.', '')}) at the end), as every attention of the course does"
    )


def _nan_case(kv, q, k, v, tile, what) -> None:
    """A nan in the values of the last key tile's first key must reach exactly the queries that see it, and no query
    tile that ends before it: a tile computed and masked away spreads it (0 x nan is nan)."""
    (T, S), offset = (q.shape[2], k.shape[2]), k.shape[2] - q.shape[2]
    first = (S - 1) // tile * tile  # the last key tile's first key (key tiles start at key 0)
    expected = _attention(q, k, v) if q.shape[2] * S <= 1 << 16 else _causal_rows(q, k, v)
    v = v.clone()
    v[:, :, first] = float("nan")
    got = kv.tiled_attention(q.clone(), k.clone(), v.clone(), tile)
    assert isinstance(got, torch.Tensor) and tuple(got.shape) == tuple(q.shape), (
        f"tiled_attention should return (batch, n_heads, seq_len, head_dim) = {tuple(q.shape)}, got {_shape_of(got)}"
    )
    rows = torch.arange(T)
    tile_end = offset + torch.clamp(rows // tile * tile + tile, max=T) - 1  # each query's tile's last position
    clear, sees = tile_end < first, offset + rows >= first  # query tiles that never need the last key tile; its viewers
    where = tr("{what}, a nan in the values of key {first}", what=what, first=first)
    if not torch.isfinite(got[:, :, clear]).all():
        raise AssertionError(
            f"{where}: queries whose tile ends before key {first} came out nan, though none of them sees it: the tiles "
            "whose keys are all in the future are computed too (and masked away, but 0 x nan is nan)"
        )
    assert _close(got[:, :, clear], expected[:, :, clear]), (
        f"{where}: the queries whose tile ends before key {first} differ from causal SDPA"
    )
    assert got[:, :, sees].isnan().all(), (
        f"{where}: the queries at and after key {first} see it, and its value is nan, so their outputs must be nan "
        "too; these are not: is a key these queries see skipped, or are the values cleaned of nan?"
    )


@contextmanager
def _no_tile_past_the_keys():
    """A loop whose key tiles run past kv_len reduces an empty tile, and torch raises (amax: 'Expected reduction dim
    ... to have non-zero size'; max: '... numel() == 0'): named here, not passed on as a raw error."""
    try:
        yield
    except (IndexError, RuntimeError) as err:
        if "non-zero size" not in str(err) and "numel() == 0" not in str(err):
            raise
        raise AssertionError(
            f"tiled_attention reduced an empty tile of keys (torch: {str(err)[:80]!r}): its key tiles run past the "
            "last key. Run them up to the one holding the query tile's last query, at position kv_len - seq_len + "
            "i0 + tq - 1, and no further (the last key tile may be shorter than tile)"
        ) from err  # torch's words, quoted: the cause


@check("9.2")
def tiled_attention_matches_causal_sdpa(kv, rng):
    """Check square and rectangular causal attention, tiles that do not divide the lengths nor kv_len - seq_len, a tile
    larger than both; then a long case in tiles, whose scores the grader measures (_holds_tiles)."""
    with _no_tile_past_the_keys():
        for T, S, tile in (
            (12, 12, 4),
            (7, 7, 3),
            (5, 13, 4),
            (1, 9, 4),
            (6, 6, 8),
            (6, 15, 4),
            (9, 14, 4),
            (4, 11, 3),
        ):
            _tiled_case(kv, rng, T, S, tile, tr("{T} queries, {S} keys, tiles of {tile}", T=T, S=S, tile=tile))
        _holds_tiles(kv, rng)


@check("9.2")
def tiled_attention_skips_future_tiles(kv, rng):
    """Check that a tile whose keys are all in its queries' future is never computed (a nan planted there stays out).

    A nan in the values of the last key tile must reach exactly the queries that see it, not the query tiles that end
    before it: a tile computed and masked away spreads it (0 x nan is nan). Then a long case, measured (_holds_tiles)."""
    with _no_tile_past_the_keys():
        for T, S, tile in ((16, 16, 4), (6, 14, 4), (9, 9, 2), (11, 15, 4), (10, 17, 3)):
            q, k, v = _randn(rng, B, H, T, D), _randn(rng, B, H, S, D), _randn(rng, B, H, S, D)
            _nan_case(kv, q, k, v, tile, tr("{T} queries, {S} keys, tiles of {tile}", T=T, S=S, tile=tile))
        _holds_tiles(kv, rng, nan=True)


# the measured case: 500 queries, the last of 4,100 keys (kv_len - seq_len = 3,600, not a multiple of the tile), in
# tiles of 128, 8 heads of 8 numbers: one tile of queries against every key is 16 MB of scores, a tile x tile block
# 0.5 MB, the whole matrix 63 MB. Measured beyond the inputs (2.1 MB), after a small call: right loops 3-9 MB (the
# reference 3, merged per key tile 5.6, float64 9.2), a tile of queries against all its keys at once 38 MB (torch's
# attention per query tile, without its fused kernel) to 46 MB (by hand), the whole matrix 150-190 MB
_TILES = dict(B=2, H=4, T=500, S=4100, tile=128)


def _causal_rows(q, k, v, rows: int = 256) -> torch.Tensor:
    """Causal attention in float64, `rows` queries at a time (the measured case is too large for one matrix)."""
    T, S = q.shape[-2], k.shape[-2]
    out = []
    for i in range(0, T, rows):
        part = _attention(q[:, :, i : i + rows], k[:, :, : S - T + i + rows], v[:, :, : S - T + i + rows])
        out.append(part)
    return torch.cat(out, -2)


_FUSED_OPS = ("_scaled_dot_product_flash_attention_for_cpu", "scaled_dot_product_attention")


def _holds_tiles(kv, rng, nan: bool = False) -> None:
    """Fail unless tiled_attention holds only tile x tile blocks of scores at a time, with the right values (or, with
    nan, the planted nan reaching exactly its viewers). In the isolated grader the grading process measures the memory
    of a long call (_TILES), where torch's fused attention kernel is replaced by its math path (kvlib.grading._child):
    library attention holds every score it computes there. Locally every tensor a call allocates is watched."""
    if not isolated(kv.tiled_attention):
        _watched_tiles(kv, rng, nan)
        return
    # a small call first: the first call of a process also pulls in torch's code and buffers (5-10 MB), not its own
    _tiled_case(kv, rng, 9, 14, 4, tr("{T} queries, {S} keys, tiles of {tile}", T=9, S=14, tile=4))
    Bn, Hn, T, S, tile = (_TILES[x] for x in ("B", "H", "T", "S", "tile"))
    what = tr("{T} queries against {S} keys in tiles of {tile}", T=T, S=S, tile=tile)
    q, k, v = _randn(rng, Bn, Hn, T, D), _randn(rng, Bn, Hn, S, D), _randn(rng, Bn, Hn, S, D)
    if nan:
        _nan_case(_Measured(kv, usages := []), q, k, v, tile, what)
        usage = usages[0]
    else:
        got, usage = kv.tiled_attention.memory(q.clone(), k.clone(), v.clone(), tile)
        assert isinstance(got, torch.Tensor) and got.shape == q.shape and _close(got, _causal_rows(q, k, v)), (
            f"{what}: the output differs from causal SDPA"
        )
        _same_dtype(got, q, "tiled_attention", what)
    held_nothing_before(usage, "tiled_attention")
    stripe, matrix = Bn * Hn * tile * S * 4, Bn * Hn * T * S * 4  # float32 scores of every head
    assert usage.beyond_inputs < stripe, (
        f"tiled_attention held {usage.beyond_inputs / MB:.0f} MB beyond its inputs at its peak (the grader measures the "
        f"process's memory) for {what}: "
        + ("as much as the whole score matrix: " if usage.beyond_inputs >= matrix else "")
        + f"one tile of queries against all {S} keys is {stripe / MB:.0f} MB of scores "
        f"(every head's), the whole matrix {matrix / MB:.0f} MB, a tile x tile block {stripe * tile // S / MB:.1f} MB. "
        "Only tile x tile blocks may exist at once (torch's attention, here without its fused kernel, holds every "
        "score it computes)"
    )
    if not nan:
        _no_grid(kv, rng)


_GRID = dict(T=4096, tile=256)  # one head, head_dim 4: a mask over every query and key is 16 MB as bools


def _no_grid(kv, rng) -> None:
    """Fail if a call holds anything as large as half a boolean mask over every query and key (one head, a long
    prompt, small tiles and head_dim: the tiles' own blocks and a stripe of one tile's scores stay far below)."""
    T, tile = _GRID["T"], _GRID["tile"]
    q, k, v = (_randn(rng, 1, 1, T, 4) for _ in range(3))
    got, usage = kv.tiled_attention.memory(q.clone(), k.clone(), v.clone(), tile)
    what = tr("{T} queries against {S} keys in tiles of {tile}, one head", T=T, S=T, tile=tile)
    assert isinstance(got, torch.Tensor) and got.shape == q.shape and _close(got, _causal_rows(q, k, v)), (
        f"{what}: the output differs from causal SDPA"
    )
    grid = T * T  # bytes of a boolean mask over every query and key
    assert usage.beyond_inputs < grid // 2, (
        f"tiled_attention held {usage.beyond_inputs / MB:.0f} MB beyond its inputs at its peak (the grader measures the "
        f"process's memory) for {what}: a mask over every query and key is {grid / MB:.0f} MB as booleans, the score "
        f"matrix {4 * grid / MB:.0f} MB, a tile x tile block of scores {4 * tile * tile / MB:.2f} MB. Something of "
        "seq_len x kv_len entries was made, the mask's too: only tile-sized pieces may exist"
    )


class _Measured:
    """kv with tiled_attention measured: each call's Usage appended to usages."""

    def __init__(self, kv, usages: list):
        self._kv, self._usages = kv, usages

    def tiled_attention(self, *args):
        got, usage = self._kv.tiled_attention.memory(*args)
        self._usages.append(usage)
        return got


def _watched_tiles(kv, rng, nan: bool) -> None:
    """The local form of _holds_tiles: 32 queries, the last of 200 keys, in tiles of 8, every allocated tensor watched
    (head_dim 4 there: a copy of the keys, 4,800 numbers, stays below one tile of queries against its keys, 8,448)."""
    T, S, tile = 32, 200, 8
    if nan:
        _nan_case(
            kv,
            *(_randn(rng, B, H, n, D) for n in (T, S, S)),
            tile,
            tr("{T} queries, {S} keys, tiles of {tile}", T=T, S=S, tile=tile),
        )
    else:
        _tiled_case(kv, rng, T, S, tile, tr("{T} queries, {S} keys, tiles of {tile}", T=T, S=S, tile=tile))
    made = new_tensors(kv.tiled_attention, *(_randn(rng, B, H, n, 4) for n in (T, S, S)), tile)
    fused = [op for op, _ in made if op in _FUSED_OPS]
    assert not fused, (
        f"tiled_attention ran torch's fused attention ({fused[0]}): the exercise is the loop over tiles that such a "
        "kernel runs for you, and the grader runs without it (torch's attention then holds every score it computes)"
    )
    stripe = B * H * tile * (S - T + tile)  # the first tile of queries against every key it sees, every head
    big = [(op, shape) for op, shape in made if math.prod(shape) >= stripe]
    assert not big, (
        f"tiled_attention made a tensor of shape {big[0][1]} ({big[0][0]}): {math.prod(big[0][1]):,} numbers, as many "
        + (
            f"as the whole {T} x {S} score matrix of every head"
            if math.prod(big[0][1]) >= B * H * T * S
            else f"as one tile of {tile} queries against all the {S - T + tile} or more keys it sees, in every head"
        )
        + ". Only tile x tile blocks of scores may exist at once"
    )
    grid = [(op, shape) for op, shape in made if len(shape) >= 2 and tuple(shape[-2:]) == (T, S)]
    assert not grid, (
        f"tiled_attention made a tensor of shape {grid[0][1]} ({grid[0][0]}): one entry for every one of the {T} "
        f"queries and {S} keys, as the whole score matrix or a mask over it has. It grows with seq_len x kv_len, "
        "which the tiles are there to avoid: only tile-sized pieces may exist, the mask's too"
    )


@check("9.2")
def tiled_attention_never_builds_the_score_matrix(kv, rng):
    """Check that causal attention in tiles holds only tile x tile blocks of scores, never a tile x kv_len stripe.

    In the isolated grader the grading process measures the memory the call holds (500 queries against 4,100 keys in
    tiles of 128: a stripe of every head's scores is 16 MB), torch's fused attention replaced by its math path there;
    locally every tensor it allocates is watched (32 queries against 200 keys, tiles of 8)."""
    with _no_tile_past_the_keys():
        _holds_tiles(kv, rng)


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
        tr(
            "the chunks' outputs are averaged, as if every chunk's keys held the same share of the total weight"
        ): outs.mean(0),
        tr("the chunks' weights do not sum to one: each is taken against the largest lse, not the total"): (
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
        what = tr("{S} keys in chunks of {chunk}", S=S, chunk=chunk)
        out, lse = _merge_call(kv, outs.float(), lses.float(), what)
        assert _close(out, expected), tr(
            "{where}: {why}",
            where=what,
            why=_diagnose(
                out, _merge_slips(outs, lses), tr("the merged output differs from attention over all the keys")
            ),
        )
        assert _close(lse, expected_lse), (
            f"{what}: the merged lse must be the log-sum-exp over all the keys, so that the result can be merged "
            "again" + (": this is the largest lse_c" if _close(lse, lses.amax(0)) else "")
        )


@check("9.3")
def merge_partials_merges_again_and_skips_empty_chunks(kv, rng):
    """Check a merge of merges, scores near 1,000 and a chunk with no key (lse -inf, out nan): exact, no nan."""
    S = 20
    q, k, v = _randn(rng, B, 6, 1, D) * 40, _randn(rng, B, H_KV, S, D), _randn(rng, B, H_KV, S, D)
    outs, lses = _partials(q, k, v, 4)  # 5 chunks, lse in the hundreds
    expected = _attention(q, k, v, causal=False)
    left = _merge_call(kv, outs[:2].float(), lses[:2].float(), tr("chunks 0-1"))
    right = _merge_call(kv, outs[2:].float(), lses[2:].float(), tr("chunks 2-4"))
    out, _ = _merge_call(
        kv, torch.stack([left[0], right[0]]), torch.stack([left[1], right[1]]), tr("a merge of merges")
    )
    assert _close(out, expected), "a merge of two merged results: " + (
        "inf or nan: exp(lse) overflows float32 for scores this large"
        if not torch.isfinite(out).all()
        else "differs from attention over all the keys: the merged lse is not the log-sum-exp of all the merged "
        "keys (a maximum or a mean of the lse_c is not)"
    )
    empty_out = torch.full_like(outs[:1], float("nan"))  # a worker whose chunk held no visible key
    empty_lse = torch.full_like(lses[:1], float("-inf"))
    out, lse = _merge_call(
        kv, torch.cat([outs, empty_out]).float(), torch.cat([lses, empty_lse]).float(), tr("with an empty chunk")
    )
    assert _close(out, expected), (
        "a chunk with lse = -inf (no key) must add nothing, but its out may be nan, and 0 * nan is nan: its zero "
        "weight let the nan in"
    )


# ---------------------------------------------------------------------------------------------
# 9.5 flash_decode_splits: a design, graded against the model of the docstring, computed here


def _steps(kv_len: int, heads: int, batch: int, sms: int, splits: int) -> int:
    """split_steps's model, written here (the learner's module holds its own copy, which the learner may edit)."""
    blocks = batch * heads * splits
    return math.ceil(blocks / sms) * math.ceil(kv_len / splits) + splits


# (kv_len, n_kv_heads, batch, n_sms, what): Llama-3-8B-like GQA on an H100 SXM (132 SMs) and an A100 (108), GPUs of 58
# and 20 SMs, MHA's 32 heads, a batch of 4, a short and a long cache, and a batch whose blocks fill the GPU unsplit
def _split_cases() -> tuple:
    """The cases, each named in the learner's language (tr: at the call, not at import)."""
    return (
        (8192, 8, 1, 132, tr("8,192 tokens, 8 key/value heads, 1 sequence, 132 SMs")),
        (8192, 8, 1, 108, tr("8,192 tokens, 8 key/value heads, 1 sequence, 108 SMs")),
        (32768, 8, 1, 58, tr("32,768 tokens, 8 key/value heads, 1 sequence, 58 SMs")),
        (4096, 32, 1, 132, tr("4,096 tokens, 32 key/value heads (MHA), 1 sequence, 132 SMs")),
        (16384, 8, 4, 132, tr("16,384 tokens, 8 key/value heads, 4 sequences, 132 SMs")),
        (1000, 4, 2, 20, tr("1,000 tokens, 4 key/value heads, 2 sequences, 20 SMs")),
        (8192, 8, 33, 132, tr("8,192 tokens, 8 key/value heads, 33 sequences, 132 SMs")),
        (
            2**40,
            8,
            1,
            132,
            tr("2**40 tokens (a model of the cost, not a cache), 8 key/value heads, 1 sequence, 132 SMs"),
        ),
    )


_CHOOSE_S = 2.0  # a launch picks its splits in microseconds; this allows a million of split_steps's evaluations


def _worth_trying(kv_len: int, heads: int, batch: int, sms: int) -> range:
    """The split counts that can take the fewest key-steps. Any n takes at least kv_len*blocks0/sms + n key-steps
    (blocks0 = batch*heads); the fewest counts n0 = sms/gcd(sms, blocks0), whose blocks fill whole waves, take at
    most that + blocks0*n0/sms + n0: so no count above n0*(1 + blocks0/sms) can do better."""
    blocks0 = batch * heads
    n0 = sms // math.gcd(sms, blocks0)
    return range(1, min(kv_len, n0 + blocks0 * n0 // sms) + 1)


def _split_slip(kv_len, heads, batch, sms, n, best) -> str:
    """What a failing number of splits does, in the model's terms."""
    blocks, waves = batch * heads * n, math.ceil(batch * heads * n / sms)
    busy = blocks / (waves * sms)
    if n == 1:
        return tr(
            "one split leaves the cache unsplit: {blocks} block(s) of work for {sms} SMs, so {idle} of them sit idle "
            "while the others read every key: split the cache so the blocks fill the SMs",
            blocks=blocks,
            sms=sms,
            idle=sms - min(blocks, sms),
        )
    if n >= sms and heads * batch > 1 and n * heads * batch >= 4 * sms:
        return tr(
            "{n} splits per head and sequence make {blocks} blocks, {waves} waves of {sms}: the blocks are batch x "
            "n_kv_heads x n_splits, so splitting into n_sms pieces per head overshoots, and each split adds a merge "
            "step",
            n=n,
            blocks=blocks,
            waves=waves,
            sms=sms,
        )
    if busy < 0.75 and waves > 1:
        return tr(
            "{n} splits make {blocks} blocks: {waves} waves of {sms} SMs, the last one {last} block(s) only, so the "
            "SMs are busy {busy:.0%} of the waves: a wave you start should be (nearly) full",
            n=n,
            blocks=blocks,
            waves=waves,
            sms=sms,
            last=blocks - (waves - 1) * sms,
            busy=busy,
        )
    if n > 4 * best:
        return tr(
            "{n} splits: the merge reads one partial result per split, and {n} of them outweigh what they save", n=n
        )
    return tr(
        "{blocks} blocks in {waves} wave(s), the SMs busy {busy:.0%} of them", blocks=blocks, waves=waves, busy=busy
    )


@check("9.5")
def flash_decode_splits_keeps_the_gpu_busy(kv, rng):
    """Check the number of splits on GPUs of 132, 108, 58 and 20 SMs, GQA and MHA, batches of 1-33: within 1.1 times
    the fewest key-steps split_steps's model gives, whatever number of splits meets that."""
    for kv_len, heads, batch, sms, what in _split_cases():
        steps = [_steps(kv_len, heads, batch, sms, n) for n in _worth_trying(kv_len, heads, batch, sms)]
        fewest = min(steps)
        if isolated(kv.flash_decode_splits):  # the grader's own limit on a call holds there
            got = kv.flash_decode_splits(kv_len, heads, batch, sms)
        else:
            with time_limit(
                _CHOOSE_S,
                tr(
                    "{what}: still choosing after {s:g} s: trying every split count from 1 to kv_len cannot finish "
                    "at this kv_len; which split counts can take the fewest key-steps?",
                    what=what,
                    s=_CHOOSE_S,
                ),
            ):
                got = kv.flash_decode_splits(kv_len, heads, batch, sms)
        assert isinstance(got, (int, np.integer)) and not isinstance(got, bool), (
            f"{what}: flash_decode_splits should return an int number of splits, got {type(got).__name__}"
        )
        n = int(got)
        assert 1 <= n <= kv_len, f"{what}: {n} splits: between 1 and kv_len ({kv_len:,}): a split holds a key or more"
        limit = 1.1 * fewest
        best = steps.index(fewest) + 1
        took = _steps(kv_len, heads, batch, sms, n)
        assert took <= limit, (
            f"{what}: {n} split(s) take {took:,} key-steps by split_steps's model, more than 1.1 x the fewest "
            f"({fewest:,}, at {best} splits): {_split_slip(kv_len, heads, batch, sms, n, best)}"
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
    group = cache[0].shape[3]
    if kv_len % group and kv_len > group:  # the tokens of the whole groups only
        whole = kv_len // group * group
        left_out = tr(
            "the last, partly filled group of keys was left out ({n} tokens in groups of {group}: {whole} whole "
            "groups and {more} more)",
            n=kv_len,
            group=group,
            whole=kv_len // group,
            more=kv_len % group,
        )
        slips[left_out] = _int8_expected_and_slips(q, *cache, whole)[0]
    assert _close(got, expected), tr(
        "{where}: {why}",
        where=what,
        why=_diagnose(
            got, slips, tr("the output differs from attention over (k_values * k_scale) and (v_values * v_scale)")
        ),
    )
    _same_dtype(got, q, "int8_folded_attention", what)


@check("9.4")
def int8_folded_matches_int8_attention(kv, rng):
    """Check a decode step against float64 attention over the dequantised cache: 13, 1 and 9 tokens, 301 past blocks,
    and 257 (64 whole groups of 4 and one token: a loop over whole blocks of groups must not drop the last)."""
    for kv_len, n_kv in ((13, 2), (1, 2), (9, 1), (301, 2), (40, 6), (257, 2)):
        _folded_case(kv, rng, kv_len, n_kv, tr("{n} int8 tokens, {heads} key/value heads", n=kv_len, heads=n_kv))


@check("9.4")
def int8_folded_never_forms_the_float_keys(kv, rng):
    """Check a cache whose keys, dequantised, overflow float32 in one channel (scale 1e37, the query's component there
    about 1e-37): every score is moderate, so attention over it is finite, and only a float copy of the keys, a
    block at a time or whole, turns it into inf or nan."""
    kv_len, c = 21, 5  # six groups of 4, the last partly filled; channel c is the one out of float32's range
    q = _randn(rng, B, 6, 1, D)
    k_values, k_scale, v_values, v_scale = _int8_cache(rng, kv_len)
    k_scale[..., c] = 1e37  # 127 * 1e37 > float32's largest, 3.4e38
    q[..., c] *= 1e-37
    expected, _ = _int8_expected_and_slips(q, k_values, k_scale, v_values, v_scale, kv_len)
    got = kv.int8_folded_attention(
        q.clone(), k_values.clone(), k_scale.clone(), v_values.clone(), v_scale.clone(), kv_len
    )
    what = tr(
        "{n} int8 tokens whose channel {c} has the scale 1e37 (a key there, dequantised, is past float32's range)",
        n=kv_len,
        c=c,
    )
    assert isinstance(got, torch.Tensor) and tuple(got.shape) == tuple(q.shape), (
        f"{what}: int8_folded_attention should return q's shape {tuple(q.shape)}, got {_shape_of(got)}"
    )
    assert bool(torch.isfinite(got).all()), (
        f"{what}: the output holds inf or nan, though every score is moderate (the query's component there is about "
        "1e-37) and attention over these keys is finite (computed in float64). Somewhere the float keys "
        "k_values * k_scale were formed, a block at a time or whole: 'no dequantised copy' means no such keys at all"
    )
    assert _close(got, expected), (
        f"{what}: the output differs from attention over (k_values * k_scale) and (v_values * v_scale)"
    )


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
            f"{copy / MB:.0f} MB. That is the float copy this exercise does without"
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
        f"{math.prod(big[0][1]) / (2 * limit):.0%} of the cached keys' numbers. That is the float copy this "
        "exercise does without"
    )
