"""Checks for notebook 05 (kvlib/roofline.py): exercises 5.1-5.5 (the cache's bytes, 4.4: kvlib/checks/kv_cache.py).

The calculators are checked on configurations whose layers, heads and KV heads all differ (a
made-up GQA model, Llama-2-70B), in float32 and 16-bit, so a missing factor cannot hide; FLOPs
are compared with torch's own FLOP counter. The known slips are named: 2 FLOPs per multiply-add,
bits for bytes, the output's bytes, n_kv_heads for n_heads in attention's FLOPs, the batch
multiplying the weights (the bug 5.3 ships with: a find-and-fix, its message the symptom), attention's FLOPs,
rounding the ridge batch down, seconds for tokens/s; in 5.5's
prediction, the weights read once per sequence, one sequence's cache for the whole batch, one layer's
matmul (5.2) for the whole step, and a batch where none gets there (None). 5.2 and 5.5 each have a ridge just
under what the rows (or sequences) can reach, so the answer runs into the hundreds of millions: a search that
stops at a cap (None) is named, and one that tries each value in turn is stopped after 2 s.
Every expected value is computed before learner code runs, from numbers and configurations the
learner never receives: a function is handed a copy of each config (`_copy`), so even one that
changes its arguments (object.__setattr__ on a frozen config) cannot move the target.
The texts a message is built from (which case, what a slip is called) go through tr(), so that the catalogue
(kvlib/course/i18n.py) translates them as it does the messages.
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

import torch

from kvlib.checks import check, isolated, time_limit
from kvlib.core.configs import REAL_MODELS
from kvlib.core.flops import forward_flops_counted
from kvlib.core.model import Decoder, ModelConfig
from kvlib.course.i18n import tr

# every size distinct: vocab, width, layers, heads, KV heads, MLP width
ODD = ModelConfig(vocab_size=50, d_model=48, n_layers=3, n_heads=6, n_kv_heads=2, hidden_dim=80, max_seq_len=64)
LLAMA2_70B = REAL_MODELS["Llama-2-70B"].config  # 80 layers, 64 heads, 8 KV heads
LLAMA2_7B = REAL_MODELS["Llama-2-7B"].config


def _bytes(dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _matrix_params(c) -> int:
    C, D, H, H_kv = c.d_model, c.head_dim, c.n_heads, c.n_kv_heads
    return c.n_layers * (C * H * D + 2 * C * H_kv * D + H * D * C + 3 * C * c.hidden_dim) + C * c.vocab_size


def _kv(c, seq_len, batch, dtype) -> int:
    return 2 * c.n_layers * c.n_kv_heads * c.head_dim * _bytes(dtype) * seq_len * batch


def _close(a, b, rel=1e-9) -> bool:
    return isinstance(a, (int, float)) and math.isclose(a, b, rel_tol=rel)


def _copy(c):
    """A fresh copy of a config for learner code: what it does to it never reaches REAL_MODELS or the expected values."""
    return dataclasses.replace(c)


# ---------------------------------------------------------------------------------------------
# 5.1 matmul_intensity


@check("5.1")
def matmul_intensity_counts_flops_and_bytes(kv, rng):
    """Check the FLOPs per byte of matmuls of distinct sizes, in float32, bfloat16 and float16."""
    for (m, k, n), dtype in (
        ((3, 5, 7), torch.float32),
        ((64, 96, 80), torch.bfloat16),
        ((1, 4096, 4096), torch.float16),
    ):
        b = _bytes(dtype)
        flops, moved = 2 * m * k * n, (m * k + k * n + m * n) * b
        expected = flops / moved
        got = kv.matmul_intensity(m, k, n, dtype)
        assert isinstance(got, float), f"matmul_intensity should return a float, got {type(got).__name__}" + (
            ": FLOPs per byte is rarely a whole number" if isinstance(got, int) else ""
        )
        least, out = (m * k + k * n + m * n) * b, m * n * b  # the least traffic, and the output's share of it
        hints = {  # each a symptom in numbers: what the result shows, not the line that fixes it
            flops / (least + out): tr(
                "the bytes come to {got:,}, {extra:,} more than the least traffic", got=least + out, extra=out
            ),
            expected / 2: tr("exactly half the expected FLOPs per byte: the FLOPs are half notebook 03's count"),
            expected / 8: tr("8 times too small: the dtype's size counts in bytes, not bits"),
            flops / (least - out): tr(
                "the bytes come to {got:,}, {short:,} short of the least traffic", got=least - out, short=out
            ),
            2 * m * k * n / (m * k + k * n + m * n): tr(
                "{b} times too high: the bytes come to {got:,}, as if each number took one byte", b=b, got=least // b
            ),
        }
        if b != 2:
            hints[flops / ((m * k + k * n + m * n) * 2)] = tr(
                "the FLOPs per byte of a 2-byte dtype, but {dtype} takes {b} bytes a number", dtype=dtype, b=b
            )
        for wrong, hint in hints.items():
            if _close(got, wrong) and not _close(got, expected):
                raise AssertionError(f"({m}, {k}) @ ({k}, {n}) in {dtype}: {hint}")
        assert _close(got, expected), (
            f"({m}, {k}) @ ({k}, {n}) in {dtype}: expected {expected:.4f} FLOP/byte, got {got:.4f}"
        )


@check("5.1")
def matmul_intensity_of_decode_is_about_one(kv, rng):
    """Check that one token through a 4096 x 4096 layer in 16-bit does about 1 FLOP per byte, and a batch more."""
    decode = kv.matmul_intensity(1, 4096, 4096, torch.float16)
    assert 0.99 < decode < 1.0, (
        f"a matrix-vector product in 16-bit does ~1 FLOP per byte (2 FLOPs per 2-byte weight), got {decode:.3f}"
    )
    batched = [kv.matmul_intensity(m, 4096, 4096, torch.float16) for m in (1, 16, 256)]
    assert batched == sorted(batched) and batched[-1] > 100, (
        f"more rows reuse each weight: intensity should climb with m, got {[round(x, 1) for x in batched]}"
    )


# ---------------------------------------------------------------------------------------------
# 5.2 ridge_batch


def _ridge_rows(k, n, peak, bw, bytes_each) -> int | None:
    """Fewest rows reaching the ridge, in exact rational arithmetic (no float rounding at the boundary)."""
    ridge = Fraction(peak) / Fraction(bw)
    slope = 2 * k * n - ridge * bytes_each * (k + n)
    return None if slope <= 0 else max(1, math.ceil(ridge * bytes_each * k * n / slope))


def _intensity(m, k, n, bytes_each) -> float:
    return 2 * m * k * n / ((m * k + k * n + m * n) * bytes_each)


@check("5.2")
def ridge_batch_reaches_the_ridge(kv, rng):
    """Check the fewest rows reaching the ridge: an H100 layer (345), one CPU core (29), bfloat16 (11) and a ridge below 1 (1)."""
    cases = (
        (4096, 4096, 989e12, 3.35e12, torch.float16),
        (2048, 5632, 148.7e9, 10.8e9, torch.float32),
        (300, 500, 1e12, 1e11, torch.bfloat16),
        (1000, 1000, 1e9, 1e10, torch.float32),
    )
    for k, n, peak, bw, dtype in cases:
        b, ridge = _bytes(dtype), peak / bw
        expected = _ridge_rows(k, n, peak, bw, b)
        wrong = {  # computed before the call, like expected
            _ridge_rows(k, n, bw, peak, b): tr(
                "that is the answer for a ridge of {inverse:.3g} FLOP/B, the inverse of this device's {ridge:.3g}",
                inverse=bw / peak,
                ridge=ridge,
            ),
            _ridge_rows(k, n, peak, bw, 8 * b): tr(
                "that is the answer for numbers of {bits} bytes each; {dtype} takes {b}", bits=8 * b, dtype=dtype, b=b
            ),
            max(1, math.ceil(ridge * b / 2)): tr(
                "the intensity of Exercise 5.1 at that many rows is {i:.2f} FLOP/B, below the ridge: the count leaves "
                "out the rows' own bytes",
                i=_intensity(max(1, math.ceil(ridge * b / 2)), k, n, b),
            ),
        }
        where = tr("({k}, {n}) weights in {dtype}, ridge {ridge:.3g} FLOP/B", k=k, n=n, dtype=dtype, ridge=ridge)
        got = kv.ridge_batch(k, n, peak, bw, dtype)
        assert got is None or isinstance(got, int) and not isinstance(got, bool), (
            f"{where}: ridge_batch should return an int number of rows (or None), got {type(got).__name__} {got!r}"
        )
        if got == expected:
            continue
        if isinstance(got, int) and got == expected - 1:
            raise AssertionError(
                f"{where}: at {got} rows the intensity is {_intensity(got, k, n, b):.2f}, still below the ridge; "
                f"{expected} rows reach it"
            )
        if got in wrong:
            raise AssertionError(  # the case and the slip as one text: the catalogue translates the colon too
                tr(
                    "({k}, {n}) weights in {dtype}, ridge {ridge:.3g} FLOP/B: {slip}",
                    k=k,
                    n=n,
                    dtype=dtype,
                    ridge=ridge,
                    slip=wrong[got],
                )
            )
        if got == 0:
            raise AssertionError(f"{where}: at least one row: a matmul of 0 rows does nothing")
        raise AssertionError(
            f"{where}: expected {expected} rows (intensity {_intensity(expected, k, n, b):.2f} FLOP/B), got {got!r}"
        )


@check("5.2")
def ridge_batch_none_out_of_reach(kv, rng):
    """Check None where no batch reaches the ridge (a narrow layer) and a batch of 781 where the ridge is just within reach."""
    for k, n, peak, bw, expected in ((64, 64, 1e12, 1e9, None), (64, 96, 18.3e9, 1e9, 781)):
        ceiling = 2 * k * n / ((k + n) * 4)  # the intensity as the rows go to infinity
        where = tr(
            "({k}, {n}) weights in float32 (intensity at most {ceiling:.1f} FLOP/B), ridge {ridge:.1f}",
            k=k,
            n=n,
            ceiling=ceiling,
            ridge=peak / bw,
        )
        got = kv.ridge_batch(k, n, peak, bw, torch.float32)
        if expected is None:
            assert got is None, (
                f"{where}: the intensity stays below the ridge however many rows: no number of rows reaches it, "
                f"and the contract's answer is None; got {got!r}"
            )
        else:
            assert got == expected, f"{where}: just within reach at {expected} rows, got {got!r}"


_SOLVE_S = 2.0  # seconds a call may take where the answer is huge: solving takes microseconds, a search by 1 cannot end


def _within(fn, what: str, *args):
    """fn(*args), interrupted after _SOLVE_S with a message naming the search (the grader's own limit per call holds
    in its child)."""
    if isolated(fn):
        return fn(*args)
    with time_limit(
        _SOLVE_S,
        tr(
            "{what}: still searching after {limit:g} s: the answer here runs into the hundreds of millions, "
            "so trying one value after another cannot finish",
            what=what,
            limit=_SOLVE_S,
        ),
    ):
        return fn(*args)


# 64 x 64 weights in float32 top out at 16 FLOP/B; this ridge (exact in binary: 16 - 2**-18) sits just under it
_NEAR_LIMIT_PEAK, _NEAR_LIMIT_BW = (16 - 2**-18) * 2**40, float(2**40)


@check("5.2")
def ridge_batch_just_under_the_limit(kv, rng):
    """Check a ridge just under a 64 x 64 float32 layer's limit of 16 FLOP/B: 134,217,696 rows reach it, so a search
    that gives up at some cap (returning None) or tries one m after another is named."""
    expected = _ridge_rows(64, 64, _NEAR_LIMIT_PEAK, _NEAR_LIMIT_BW, 4)  # 2**27 - 32
    where = tr(
        "(64, 64) weights in float32 (intensity below 16 FLOP/B), ridge {ridge!r}",
        ridge=_NEAR_LIMIT_PEAK / _NEAR_LIMIT_BW,
    )
    got = _within(kv.ridge_batch, where, 64, 64, _NEAR_LIMIT_PEAK, _NEAR_LIMIT_BW, torch.float32)
    if got is None:
        raise AssertionError(
            f"{where}: None, but {expected:,} rows reach the ridge (the intensity approaches 16 FLOP/B, above it): "
            "the answer gave up too soon"
        )
    assert got == expected, f"{where}: the fewest rows that reach it are {expected:,}, got {got!r}"


# ---------------------------------------------------------------------------------------------
# 5.3 step_cost


def _flops_slips(c, T, S, batch) -> dict:
    """The FLOPs of the classic slips in attention's count, for T new tokens against S keys."""
    L, H, H_kv, D = c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim
    matrices, attention = batch * 2 * T * _matrix_params(c), batch * L * H * 4 * T * S * D
    return {  # symptoms: how the count compares with the right one, never the term to type
        matrices: tr(
            "attention's own FLOPs are missing: the count is the weights' products alone, {short:,} short",
            short=attention,
        ),
        matrices + attention // 2: tr(
            "attention's FLOPs come to half the right count: {short:,} short", short=attention // 2
        ),
        matrices + attention * H_kv // H: tr(
            "attention's FLOPs come to {h_kv}/{h} of the right count, as if attention ran once per key/value head",
            h_kv=H_kv,
            h=H,
        ),
        matrices + batch * L * H * 4 * S * S * D: tr(
            "attention's FLOPs grow as kv_len squared: {t} new token(s) against {s} keys come to {right:,}",
            t=T,
            s=S,
            right=attention,
        ),
    }


@check("5.3")
def step_cost_flops_match_torch_counter(kv, rng):
    """Check prefill FLOPs against torch's FLOP counter at batch 2, and decode FLOPs against the formula."""
    torch.manual_seed(0)
    model = Decoder(ODD).eval()
    for T in (1, 6):
        expected = forward_flops_counted(model, T, batch=2)  # a model the learner's code never sees
        slips = _flops_slips(ODD, T, T, 2)
        flops, _ = kv.step_cost(_copy(ODD), T, T, 2, torch.float32)
        if flops * 2 == expected:
            raise AssertionError(
                f"prefill of {T} tokens at batch 2: {flops:,} FLOPs, half of torch's count {expected:,}: one "
                "sequence's work, not the batch's"
            )
        if flops in slips and flops != expected:
            raise AssertionError(f"prefill of {T} tokens at batch 2: {slips[flops]}")
        assert flops == expected, (
            f"prefill of {T} tokens at batch 2: torch counts {expected:,} FLOPs, step_cost says {flops:,}"
        )
    L, H, D = ODD.n_layers, ODD.n_heads, ODD.head_dim
    for T, S in ((1, 1), (1, 30), (5, 12)):  # decode, decode at a long cache, a chunk of 5 against 12 keys
        expected = 3 * (2 * T * _matrix_params(ODD) + L * H * 4 * T * S * D)
        hints = _flops_slips(ODD, T, S, 3)
        flops, _ = kv.step_cost(_copy(ODD), T, S, 3, torch.float32)
        where = tr("{T} new token(s) against kv_len {S}, batch 3", T=T, S=S)
        if flops in hints and flops != expected:
            raise AssertionError(
                tr("{T} new token(s) against kv_len {S}, batch 3: {slip}", T=T, S=S, slip=hints[flops])
            )
        assert flops == expected, f"{where}: expected {expected:,} FLOPs, got {flops!r}"


@check("5.3")
def step_cost_bytes_are_what_the_step_must_bring(kv, rng):
    """Check bytes: what one decode step must bring from memory, for batches of 1 to 16, in three dtypes."""
    for c, name in ((ODD, tr("a small GQA config")), (LLAMA2_70B, "Llama-2-70B")):
        for S, batch, dtype in ((1, 1, torch.float16), (40, 4, torch.float32), (4096, 16, torch.bfloat16)):
            weights, cache = _matrix_params(c) * _bytes(dtype), _kv(c, S, batch, dtype)
            _, got = kv.step_cost(_copy(c), 1, S, batch, dtype)
            where = tr("{name}, kv_len {S}, batch {batch}, {dtype}", name=name, S=S, batch=batch, dtype=dtype)
            if batch > 1 and got == weights * batch + cache:
                raise AssertionError(
                    f"{where}: {got:,} bytes, {got - weights - cache:,} more than the step must bring from memory "
                    f"({weights + cache:,})"
                )
            if got == weights:
                raise AssertionError(f"{where}: {got:,} bytes, the weights' bytes alone: {cache:,} short")
            if got == cache:
                raise AssertionError(f"{where}: {got:,} bytes, the KV cache's bytes alone: {weights:,} short")
            if batch > 1 and got == weights + _kv(c, S, 1, dtype):
                raise AssertionError(
                    f"{where}: {cache - _kv(c, S, 1, dtype):,} bytes short: the cache counted is one sequence's"
                )
            assert got == weights + cache, f"{where}: expected {weights + cache:,} bytes, got {got:,}"


@check("5.3")
def step_cost_decode_is_memory_bound(kv, rng):
    """Check that decode of Llama-2-7B in 16-bit does ~1 FLOP per byte at batch 1, and far more at batch 64."""
    c, P = LLAMA2_7B, _matrix_params(LLAMA2_7B)
    for batch, words in ((1, tr("~1 FLOP per byte")), (64, tr("~64 FLOPs per byte"))):
        expected = (batch * (2 * P + 4 * c.n_layers * c.n_heads * c.head_dim), 2 * P + _kv(c, 1, batch, torch.float16))
        flops, moved = kv.step_cost(_copy(c), 1, 1, batch, torch.float16)
        assert (flops, moved) == expected, (
            f"Llama-2-7B decode at batch {batch} in 16-bit: expected {expected[0] / 1e9:.2f} GFLOP and {expected[1] / 1e9:.2f} GB, "
            f"{words} (got {flops!r} FLOPs and {moved!r} bytes"
            + (
                f", {flops / moved:.2f} FLOPs per byte)"
                if isinstance(flops, int) and isinstance(moved, int) and moved
                else ")"
            )
        )


# ---------------------------------------------------------------------------------------------
# 5.4 predicted_tokens_per_second


@check("5.4")
def predicted_tokens_per_second_on_an_a100(kv, rng):
    """Check Llama-2-7B at batch 1 on an A100 80GB SXM in 16-bit: about 154 tokens/s, set by bandwidth."""
    expected = 2039e9 / (_matrix_params(LLAMA2_7B) * 2 + _kv(LLAMA2_7B, 1, 1, torch.float16))
    got = kv.predicted_tokens_per_second(_copy(LLAMA2_7B), 1, 1, torch.float16, 312e12, 2039e9)
    assert isinstance(got, float), f"predicted_tokens_per_second should return a float, got {type(got).__name__}"
    if _close(got, 1 / expected):
        raise AssertionError(
            f"{got:.4g} is seconds per token, the step's time: the rate asked for is tokens per second"
        )
    c = LLAMA2_7B  # the step's FLOPs and bytes (float16: 2 bytes a weight), for the sum a slip would take
    flops, moved = (
        2 * _matrix_params(c) + 4 * c.n_layers * c.n_heads * c.head_dim,
        2 * _matrix_params(c) + _kv(c, 1, 1, torch.float16),
    )
    if _close(got, 1 / (flops / 312e12 + moved / 2039e9), 1e-6):
        raise AssertionError(
            f"{got:.1f} tokens/s is the rate of a device that computes and then moves data, one after the other; "
            "the roofline's device does both at once"
        )
    assert _close(got, expected, 1e-6), (
        f"Llama-2-7B, batch 1, on an A100 80GB SXM: expected {expected:.1f} tokens/s, got {got:.1f}"
    )


@check("5.4")
def predicted_tokens_per_second_counts_the_batch(kv, rng):
    """Check a batch of sequences and a long cache on a small GQA config, memory- and compute-bound."""
    L, H, D = ODD.n_layers, ODD.n_heads, ODD.head_dim
    for S, batch, peak, bw in ((30, 4, 1e12, 1e9), (30, 8, 1e9, 1e12)):
        flops = batch * (2 * _matrix_params(ODD) + L * H * 4 * S * D)
        moved = _matrix_params(ODD) * 4 + _kv(ODD, S, batch, torch.float32)
        step = max(flops / peak, moved / bw)
        p_flops = batch * (
            2 * S * _matrix_params(ODD) + L * H * 4 * S * S * D
        )  # a prefill of S tokens, not a decode step
        prefill = max(p_flops / peak, moved / bw)
        got = kv.predicted_tokens_per_second(_copy(ODD), S, batch, torch.float32, peak, bw)
        if _close(got, batch / prefill) and not _close(prefill, step):
            raise AssertionError(
                f"kv_len {S}, batch {batch}: this is the rate of a prefill of kv_len tokens per sequence, whose step "
                "makes kv_len times as much work, not of a decode step (one new token per sequence)"
            )
        if _close(got, 1 / step):
            raise AssertionError(
                f"kv_len {S}, batch {batch}: {got:.4g} tokens/s, {batch} times too few: the rate of one sequence of "
                "the batch"
            )
        if _close(got, batch / (flops / peak + moved / bw)):
            raise AssertionError(
                f"kv_len {S}, batch {batch}: {got:.4g} tokens/s is the rate of a device that computes and then moves "
                "data, one after the other; the roofline's device does both at once"
            )
        if _close(got, batch / (moved / bw)) and not _close(step, moved / bw):
            raise AssertionError(
                f"kv_len {S}, batch {batch} at {peak:.0e} FLOP/s: this is the memory time alone, but this step is "
                "compute-bound: its arithmetic takes longer than its traffic"
            )
        assert _close(got, batch / step, 1e-6), (
            f"kv_len {S}, batch {batch}: expected {batch / step:.4g} tokens/s, got {got:.4g}"
        )


# ---------------------------------------------------------------------------------------------
# 5.5 compute_bound_batch (predict, then measure: graded against the analytic value, never the run)


def _step_parts(c, S, dtype, *, attention_heads=None) -> tuple[int, int, int]:
    """One sequence's decode FLOPs, the weights' bytes and one sequence's cache bytes at kv_len S."""
    L, D = c.n_layers, c.head_dim
    heads = c.n_heads if attention_heads is None else attention_heads
    return 2 * _matrix_params(c) + 4 * L * heads * S * D, _matrix_params(c) * _bytes(dtype), _kv(c, S, 1, dtype)


def _ridge_sequences(flops, weights, cache, ridge: Fraction) -> int | None:
    """Fewest sequences whose step reaches the ridge, in exact rational arithmetic: batch * flops >= ridge * (weights +
    batch * cache); None where the cache alone keeps every batch below it."""
    slope = flops - ridge * cache
    return None if slope <= 0 else max(1, math.ceil(ridge * weights / slope))


def _decode_ridges() -> tuple:
    """(config, name, kv_len, peak FLOP/s, bandwidth bytes/s, dtype) of each case, named in the learner's language."""
    return (
        (LLAMA2_7B, tr("Llama-2-7B on an H100's tensor cores"), 1, 989e12, 3.35e12, torch.float16),
        (LLAMA2_70B, tr("Llama-2-70B (GQA) on an A100 80GB SXM"), 512, 312e12, 2039e9, torch.bfloat16),
        (ODD, tr("a small GQA config on one CPU core"), 30, 96.6e9, 35.3e9, torch.float32),
        (ODD, tr("a small GQA config where one sequence is past the ridge"), 30, 1e9, 1e10, torch.float32),
        (ODD, tr("a small GQA config whose ridge is just within reach"), 40, 8.7e9, 1e9, torch.float32),
    )


def _decode_ridge_slips(c, S, peak, bw, dtype) -> dict:
    """The batch each classic slip would predict (computed before learner code runs)."""
    ridge, b = Fraction(peak) / Fraction(bw), _bytes(dtype)
    flops, weights, cache = _step_parts(c, S, dtype)
    per_sequence = None if flops < ridge * (weights + cache) else 1  # weights and cache both times the batch
    slips = {  # each the answer of a step counted another way: the symptom, not the line that fixes it
        tr("that is the batch of a step whose weights are read again for every sequence"): per_sequence,
        tr("that is the batch of a step that reads one cache for the whole batch"): max(
            1, math.ceil(ridge * (weights + cache) / flops)
        ),
        tr("that is the batch of a step without attention's own FLOPs"): (
            _ridge_sequences(2 * _matrix_params(c), weights, cache, ridge)
        ),
        tr("that is the batch of a step whose attention runs once per key/value head"): _ridge_sequences(
            _step_parts(c, S, dtype, attention_heads=c.n_kv_heads)[0], weights, cache, ridge
        ),
        tr(
            "that is the batch for a ridge of {inverse:.3g} FLOP/B, the inverse of this device's",
            inverse=float(1 / ridge),
        ): (_ridge_sequences(flops, weights, cache, 1 / ridge)),
        tr("that is the batch for numbers 8 times the dtype's size"): _ridge_sequences(
            flops, 8 * weights, 8 * cache, ridge
        ),
        tr("that is the batch of a step with one cached token per sequence"): _ridge_sequences(
            _step_parts(c, 1, dtype)[0], weights, _kv(c, 1, 1, dtype), ridge
        ),
        tr("that is one d_model x d_model matmul's ridge (Exercise 5.2), not the whole step's"): (
            _ridge_rows(c.d_model, c.d_model, peak, bw, b)
        ),
    }
    return slips


@check("5.5")
def compute_bound_batch_predicts_the_ridge(kv, rng):
    """Check the fewest sequences at the ridge: Llama-2-7B on an H100 (299), Llama-2-70B (186), a CPU core (7), one
    sequence already past it (1) and a ridge just within reach (10,040)."""
    for c, name, S, peak, bw, dtype in _decode_ridges():
        expected = _ridge_sequences(*_step_parts(c, S, dtype), Fraction(peak) / Fraction(bw))
        slips = _decode_ridge_slips(c, S, peak, bw, dtype)
        where = tr(
            "{name}, kv_len {S}, {dtype}, ridge {ridge:.3g} FLOP/B", name=name, S=S, dtype=dtype, ridge=peak / bw
        )
        got = kv.compute_bound_batch(_copy(c), S, peak, bw, dtype)
        assert got is None or isinstance(got, int) and not isinstance(got, bool), (
            f"{where}: compute_bound_batch should return an int number of sequences (or None), got "
            f"{type(got).__name__} {got!r}"
        )
        if got == expected:
            continue
        if isinstance(got, int) and got == expected - 1:
            raise AssertionError(f"{where}: at {got} sequences the step is still below the ridge")
        for slip, batch in slips.items():
            if got == batch:
                raise AssertionError(f"{where}: {slip}")
        raise AssertionError(f"{where}: expected {expected} sequences, got {got!r}")


# Llama-2-70B, 4,096 tokens each, bfloat16: a step tops out at 110.390625 FLOP/B; this ridge (exact in binary, a device
# of 121 TFLOP/s and 1.1 TB/s) sits just under it
_NEAR_CACHE_PEAK, _NEAR_CACHE_BW = float(Fraction(7234559, 2**16) * 2**40), float(2**40)


@check("5.5")
def compute_bound_batch_just_under_the_caches_limit(kv, rng):
    """Check a ridge just under what Llama-2-70B's step can reach with 4,096 cached tokens each: 740,751,018 sequences,
    so a search that gives up at some cap (returning None) or tries one batch after another is named."""
    c, S, dtype = LLAMA2_70B, 4096, torch.bfloat16
    ridge = Fraction(_NEAR_CACHE_PEAK) / Fraction(_NEAR_CACHE_BW)
    flops, weights, cache = _step_parts(c, S, dtype)
    expected = _ridge_sequences(flops, weights, cache, ridge)
    where = tr(
        "Llama-2-70B, 4,096 cached tokens each, {dtype}, ridge {ridge!r} (the step's limit {limit!r})",
        dtype=dtype,
        ridge=float(ridge),
        limit=flops / cache,
    )
    got = _within(kv.compute_bound_batch, where, _copy(c), S, _NEAR_CACHE_PEAK, _NEAR_CACHE_BW, dtype)
    if got is None:
        raise AssertionError(
            f"{where}: None, but {expected:,} sequences reach the ridge (the step's intensity approaches the limit, "
            "above it): the answer gave up too soon"
        )
    assert got == expected, f"{where}: the fewest sequences that reach it are {expected:,}, got {got!r}"


@check("5.5")
def compute_bound_batch_none_where_the_cache_outgrows_the_ridge(kv, rng):
    """Check None where each sequence's cache keeps every batch below the ridge: Llama-2-7B (MHA) with 4k tokens on
    an H100, Llama-2-70B (GQA) with 4k on an A100, and a small config whose ridge is just out of reach."""
    for c, name, S, peak, bw, dtype in (
        (LLAMA2_7B, tr("Llama-2-7B on an H100"), 4096, 989e12, 3.35e12, torch.float16),
        (LLAMA2_70B, tr("Llama-2-70B on an A100 80GB SXM"), 4096, 312e12, 2039e9, torch.bfloat16),
        (ODD, tr("a small GQA config"), 40, 8.75e9, 1e9, torch.float32),  # at most 8.71 FLOP/B, however large the batch
    ):
        flops, _, cache = _step_parts(c, S, dtype)
        got = kv.compute_bound_batch(_copy(c), S, peak, bw, dtype)
        assert got is None, (
            f"{name} with {S} cached tokens each: one sequence's step does {flops / cache:.0f} FLOPs per byte of its "
            f"own cache, below the ridge ({peak / bw:.0f}), and a batch adds a cache per sequence: no batch reaches "
            f"it, and the contract's answer is None; got {got!r}"
        )
