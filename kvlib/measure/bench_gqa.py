"""`kvlib bench gqa` (notebook 06): one decode step at long context against n_kv_heads, attention done
three ways: materialised (repeat_kv, Exercise 6.1, then MHA attention), grouped (Exercise 6.2) and
torch's SDPA with enable_gqa; and, in the benchmark only, grouped with the cache read in chunks
(split_k_attention, flash-decoding's split-K). The ways themselves and the bytes a step moves are in
kvlib.variants.gqa_attention; here the driver and its tables. Every step runs through the model's one
forward pass with a KVCache (kvlib.core.cache.attention_through_cache around each way).
"""

from __future__ import annotations

import datetime
import functools
import math
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from kvlib.core import progress
from kvlib.core.cache import attention_through_cache
from kvlib.core.configs import gqa_bench_config
from kvlib.core.model import Decoder
from kvlib.measure import timing
from kvlib.measure.machine import last_level_cache, measure_bandwidth
from kvlib.measure.timing import new_tensors
from kvlib.variants.gqa_attention import BENCH_ATTENTION, decode_bytes

# ---------------------------------------------------------------------------------------------
# What an attention allocates, and a decode step with a chosen attention, through the model's forward pass


def largest_new_tensor(fn: Callable, *args) -> tuple[str, tuple[int, ...]]:
    """(op name, shape) of the largest tensor that fn(*args) allocates (views are free, so not counted).

    Example: largest_new_tensor(materialised_attention, q, k, v) -> ("clone", (batch, n_heads, kv_len, head_dim))
    """
    made = new_tensors(fn, *args)
    return max(made, key=lambda m: math.prod(m[1]), default=("none", ()))


@torch.inference_mode()
def decode_step_with(model: Decoder, token: torch.Tensor, cache, attend: Callable) -> torch.Tensor:
    """One decode step of model for token (batch,) at position cache.pos, attention done by `attend`.

    cache: a kvlib.kv_cache.KVCache (batch, n_kv_heads per layer) already holding cache.pos tokens.
    The step runs through the model's forward pass (the new keys and values written at cache.pos
    with update), then pos is set back, so the same step can be timed again and again at one
    kv_len. Returns the logits (batch, vocab_size).
    """
    pos, through = cache.pos, functools.partial(attention_through_cache, attend=attend)
    logits, _ = model(token[:, None], past_key_values=cache, attention=through)  # (B, 1, vocab)
    cache.truncate(pos)  # forget the step: the next one is timed at the same kv_len
    return logits[:, -1]


# ---------------------------------------------------------------------------------------------
# kvlib bench gqa (notebook 06): decode at long context against n_kv_heads, three ways


FIXED_METHOD = (
    "intercept at 0 cached tokens of a median-based (Theil-Sen) line through the median step times at the measured "
    "lengths; its spread is the interquartile range of the same line fitted round by round; meaningful only between "
    "0 and the shortest length's step"
)


def _quartiles(values: list[float]) -> tuple[float, float]:
    """The 25th and 75th percentiles: the spread of the middle half of the rounds (a single disturbed round moves it little)."""
    if len(values) < 2:
        return values[0], values[0]
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q3


def _theil_sen(x: list[float], y: list[float]) -> tuple[float, float]:
    """(intercept, slope) of the Theil-Sen line through (x, y): the median of the pairwise slopes, then the median
    of y - slope * x. One disturbed length moves it less than a least-squares line; through two points it is that line.
    """
    slopes = [(y[j] - y[i]) / (x[j] - x[i]) for i in range(len(x)) for j in range(i + 1, len(x)) if x[j] != x[i]]
    slope = statistics.median(slopes)
    return statistics.median(yi - slope * xi for xi, yi in zip(x, y)), slope


def _intercepts(kv_lens: list[int], per_len: list[list[float]]) -> list[float]:
    """The fixed part of a step in each round: intercept of step time = a + b * kv_len, fitted over the lengths.

    per_len[j][r]: the step time at kv_lens[j] in round r. A line, not a short cache: at a few
    cached tokens the step's working set fits the CPU's last-level cache (or a GPU's L2) and runs
    warm, while the fixed part of a long-context step is paid with those caches full of the KV cache.
    """
    return [_theil_sen([float(S) for S in kv_lens], list(col))[0] for col in zip(*per_len)]


def _fixed_part(kv_lens: list[int], per_len: list[list[float]]) -> dict:
    """The fixed part of a way's step: the intercept of the median-based line through its median step times.

    A line through medians, not the median of per-round lines: each round's intercept extrapolates
    one round's noise (two lengths: 2 t(S1) - t(S2), twice the spread), the medians drop a disturbed
    round first. Meaningful (ok) only if it lies between 0 and the shortest length's median step, and the
    round-by-round intercepts' quartiles stay above 0 and hold it (two estimates that disagree mean noise):
    a negative intercept is a step not linear in kv_len (the copying path, whose fresh copies bend
    its times upward) or a run too noisy to split, and then no fixed part is reported, no nan.
    """
    medians = [statistics.median(times) for times in per_len]
    fixed, slope = _theil_sen([float(S) for S in kv_lens], medians)
    rounds = _intercepts(kv_lens, per_len)
    lo, hi = _quartiles(rounds)
    held = lo - 1e-9 <= fixed <= hi + 1e-9  # within the quartiles, to a nanosecond of rounding
    ok = 0 < fixed < medians[0] and slope > 0 and lo > 0 and held
    if ok:
        why = ""
    elif 0 < fixed < medians[0] and slope > 0 and lo <= 0:
        why = f"the round-by-round intercepts reach below 0 (quartiles {lo * 1e3:.2f} to {hi * 1e3:.2f} ms): too noisy to split"
    elif 0 < fixed < medians[0] and slope > 0:
        why = (
            f"the line through the medians puts the fixed part at {fixed * 1e3:.2f} ms, outside the round-by-round "
            f"intercepts' quartiles ({lo * 1e3:.2f} to {hi * 1e3:.2f} ms): too noisy to split"
        )
    elif slope <= 0:
        why = "the step did not grow with kv_len in this run (too noisy to split)"
    elif fixed <= 0:
        why = f"the line's intercept is {fixed * 1e3:.2f} ms, below 0: the step grows faster than a line in kv_len, or the run was too noisy to split"
    else:
        why = f"the line's intercept ({fixed * 1e3:.2f} ms) is above the shortest step: the run was too noisy to split"
    return {"fixed_s": fixed, "spread_s": [lo, hi], "rounds_s": rounds, "ok": ok, "why": why}


def _gqa_method(method: str, mha: bool) -> str:
    """A row's name: "mha" (kvlib's attention) and "mha sdpa" for MHA; materialised, grouped or sdpa for GQA."""
    return ("mha sdpa" if method == "sdpa" else "mha") if mha else method


def bench_gqa(
    threads: int = 1,
    quick: bool = False,
    kv_lens=(4096, 8192, 16384),
    rounds: int = 21,
    bandwidth: dict | None = None,
    device: str = "cpu",
    batch: int | None = None,
    split_k: bool = True,
) -> dict:
    """Time one decode step at each kv_len for n_kv_heads 8 (MHA), 4, 2, 1, attention done three ways, and split-K.

    materialised: repeat_kv the cache out to n_heads, then MHA attention; grouped: kvlib's
    grouped_attention (Exercise 6.2); sdpa: torch's scaled_dot_product_attention(enable_gqa=True);
    split-k: split_k_attention, the cache in chunks merged by the online softmax (GQA rows only; split_k=False
    leaves it out, as notebook 06 does).
    Every case is timed once per round, rounds interleaved, so a busy neighbour slows all alike (the
    copying path in a block of its own, after the others); the median over rounds is reported with the roofline prediction: bytes moved / bandwidth
    (kvlib.measure.machine.measure_bandwidth, measured here unless its result is passed as `bandwidth`).
    On a CUDA GPU (device="cuda"): bfloat16, batch 64 unless given (one sequence's cache is too small
    to keep a GPU busy), and each step replayed as a CUDA graph (timing.replayable), so that what
    is timed is the reading of the cache rather than Python launching kernels.
    Where the time goes: a step's fixed part (the weights and the step's small operations, which do not
    grow with the cache; GQA shrinks only k_proj and v_proj among them) is the intercept of a median-based
    line through its median times over the measured lengths, with a spread (interquartile range of the same line fitted round by round), and fixed_ok
    says whether it is meaningful (between 0 and the shortest step; fixed_why says why not; fixed_rounds_s holds
    each round's own intercept, for claims paired round by round). A row's
    cache_s = its step time - that fixed part (None where not meaningful), and cache_bytes_per_s the rate at which the cache (and
    the copies) were read in it. The step's speedup over MHA is (fixed + MHA's cache part) / (fixed +
    this cache part): Amdahl's law, measured. The ratio of cache parts is given only where both
    stand clear of the fixed part's spread.
    """
    from kvlib.kv_cache import KVCache  # noqa: PLC0415 (late binding: runs the learner's code)

    cuda = torch.device(device).type == "cuda"
    if cuda and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: torch {torch.__version__} sees no CUDA GPU here")
    dtype, batch = (torch.bfloat16, batch or 64) if cuda else (torch.float32, batch or 1)
    if quick:
        kv_lens, rounds = (256, 512), 3
    kv_lens = sorted(kv_lens)
    if len(kv_lens) < 2:
        raise ValueError(f"kv_lens needs at least two lengths to fit the fixed part to, got {kv_lens}")
    n_heads = gqa_bench_config().n_heads
    kv_heads = [h for h in (8, 4, 2, 1) if n_heads % h == 0]
    with timing.num_threads(threads if not cuda else None), torch.inference_mode():
        if bandwidth is None:
            n_bytes = (32 << 20) if quick else (2 << 30) if cuda else (256 << 20)
            bandwidth = measure_bandwidth(n_bytes=n_bytes, device=device, threads=None, repeats=3 if quick else 7)
        cases = []  # (kv_len, n_kv_heads, method, model, cache, step)
        token = torch.full((batch,), 7, device=device)
        for S in kv_lens:
            for h in kv_heads:
                config = gqa_bench_config(h, max_seq_len=S + 8)
                torch.manual_seed(0)  # the same weights at every kv_len, so the fixed part is this model's
                model = Decoder(config).to(device=device, dtype=dtype).eval()
                cache = KVCache(config, batch=batch, max_seq_len=S + 1, dtype=dtype, device=device)
                cache.k.normal_(), cache.v.normal_()
                cache.pos = S  # S cached tokens; the timed step attends to S + 1
                # MHA two ways: kvlib's plain attention (what materialised and grouped are compared with)
                # and torch's fused SDPA (what GQA through SDPA is compared with: fusion alone is no GQA saving)
                ways = (
                    ("materialised", "grouped", "split-k", "sdpa") if split_k else ("materialised", "grouped", "sdpa")
                )
                for method in ("grouped", "sdpa") if h == n_heads else ways:
                    step = lambda model=model, cache=cache, attend=BENCH_ATTENTION[method]: decode_step_with(
                        model, token, cache, attend
                    )
                    step()  # the learner's code must run at all, before a graph captures it
                    cases.append((S, h, method, model, cache, timing.replayable(step, device)))
        for *_, step in cases:  # warm-up
            step()
        samples = [[] for _ in cases]
        # two blocks of interleaved rounds: the copying path allocates n_heads heads of fresh memory every
        # step, and measured among the others it slowed the steps right after it by up to 1.7x
        rounds_of = [block for block in ({"grouped", "split-k", "sdpa"}, {"materialised"}) for _ in range(rounds)]
        for block in progress.bar(rounds_of, desc=f"kvlib bench gqa: {len(cases)} cases", unit="round"):
            for i, (S, h, method, model, cache, step) in enumerate(cases):
                if method in block:
                    timing.synchronize(device)
                    start = time.perf_counter()
                    step()
                    timing.synchronize(device)
                    samples[i].append(time.perf_counter() - start)
        by_case = {(S, h, method): times for (S, h, method, *_), times in zip(cases, samples)}
        fixed = {
            (h, method): _fixed_part(kv_lens, [by_case[S, h, method] for S in kv_lens])
            for (S, h, method, *_) in cases
            if S == kv_lens[0]
        }
        rows = []
        for (S, h, method, model, cache, _), times in zip(cases, samples):
            moved = decode_bytes(model, S + 1, batch, method)
            median, split = statistics.median(times), fixed[h, method]
            fixed_s, (lo, hi) = split["fixed_s"], split["spread_s"]
            cache_rounds = [t - fixed_s for t in times]  # the part of each round's step that grows with the cache
            cache_s = statistics.median(cache_rounds) if split["ok"] else None
            # the split is meaningful, and the cache part stands clear of the fixed part's spread
            clear = split["ok"] and cache_s > hi - lo and _quartiles(cache_rounds)[0] > 0
            rows.append(
                {
                    "kv_len": S,
                    "n_kv_heads": h,
                    "group_size": n_heads // h,
                    "method": _gqa_method(method, h == n_heads),
                    "median_s": median,
                    "rounds_s": times,  # one step per round, in round order: ratios pair round by round
                    "min_s": min(times),
                    "max_s": max(times),
                    "bytes": moved,
                    "predicted_s": moved / bandwidth["bandwidth"],
                    "cache_bytes": cache.nbytes,
                    "fixed_s": fixed_s,
                    "fixed_spread_s": [lo, hi],
                    "fixed_rounds_s": split["rounds_s"],  # each round's intercept, in round order
                    "fixed_ok": split["ok"],
                    "fixed_why": split["why"],
                    "cache_s": cache_s,
                    "cache_clear": clear,
                    "cache_rounds_s": cache_rounds,
                    # the bytes that grow with kv_len (the cache, and the copies of the materialised path) over that part
                    "cache_bytes_per_s": (moved - decode_bytes(model, 0, batch, method)) / cache_s
                    if cache_s is not None and cache_s > 0
                    else None,
                }
            )
        for row in rows:  # ratios against MHA at the same kv_len, attention done the same way
            base = "mha sdpa" if row["method"].endswith("sdpa") else "mha"
            mha = next(r for r in rows if r["kv_len"] == row["kv_len"] and r["method"] == base)
            row["speedup_vs_mha"] = mha["median_s"] / row["median_s"]
            row["speedup_vs_mha_best"] = mha["min_s"] / row["min_s"]  # fastest runs: least disturbed by neighbours
            paired = (
                [m / c for m, c in zip(mha["cache_rounds_s"], row["cache_rounds_s"])]
                if mha["cache_clear"] and row["cache_clear"]
                else None
            )
            row["cache_speedup_vs_mha"] = statistics.median(paired) if paired else None
            row["cache_speedup_spread"] = list(_quartiles(paired)) if paired else None
            row["measured_over_predicted"] = row["median_s"] / row["predicted_s"]
        record = timing.environment(
            device,
            dtype=str(dtype).removeprefix("torch."),
            threads_requested=threads,
            rounds=rounds,
            batch=batch,
            cuda_graph=cuda,
            bandwidth_GBps=round(bandwidth["bandwidth"] / 1e9, 2),
        )
    del cases
    config = gqa_bench_config()
    return {
        "benchmark": "gqa",
        "date": datetime.date.today().isoformat(),
        "record": record,
        "config": {**config.to_dict(), "n_kv_heads": kv_heads},
        "bandwidth": {"bytes_per_s": bandwidth["bandwidth"], "kernel": bandwidth["kernel"]},
        "rows": rows,
        "fixed_method": FIXED_METHOD,
        "fixed": [
            {
                "kv_len": 0,
                "n_kv_heads": h,
                "method": _gqa_method(method, h == n_heads),
                "median_s": split["fixed_s"],
                "q1_s": split["spread_s"][0],
                "q3_s": split["spread_s"][1],
                "ok": split["ok"],
            }
            for (h, method), split in fixed.items()
        ],
    }


def projection_seconds(kv_heads=(8, 2), rounds: int = 7, threads: int = 1) -> dict:
    """Seconds of one decode step's k_proj and v_proj products alone, every layer of the timing model, per n_kv_heads.

    The only weights sharing key/value heads shrinks: notebook 06 sets their time beside the difference of two ways'
    fixed parts. Each n_kv_heads once per round, rounds interleaved after a warm-up, the CPU's caches flushed before
    each (twice the last-level cache is streamed, or 64 MiB where it is not listed), as a long-context step's other
    reads flush them. One token, float32, the Decoder's own modules (kvlib.core.model.decode_layout's memory order).
    Returns {"seconds": {n_kv_heads: each round's seconds}, "bytes": {n_kv_heads: the two weights' bytes, all layers}}.
    """
    flush = torch.ones(max(64 << 20, 2 * (last_level_cache() or 0)) // 4)
    x = torch.randn(1, 1, gqa_bench_config().d_model)
    projections = {}
    for h in kv_heads:
        torch.manual_seed(0)
        layers = Decoder(gqa_bench_config(h)).eval().layers
        projections[h] = [p for layer in layers for p in (layer.attn.k_proj, layer.attn.v_proj)]
    seconds = {h: [] for h in kv_heads}
    with timing.num_threads(threads), torch.inference_mode():
        for r in range(rounds + 1):  # round 0 warms up
            for h, modules in projections.items():
                flush.add_(1.0)
                start = time.perf_counter()
                for module in modules:
                    module(x)
                if r:
                    seconds[h].append(time.perf_counter() - start)
    return {
        "seconds": seconds,
        "bytes": {h: sum(p.weight.nbytes for p in modules) for h, modules in projections.items()},
    }


def against_device(report: dict, device) -> dict:
    """A copy of report whose predictions use a kvlib.core.devices entry's bandwidth (its datasheet), not the run's own.

    So a recording shows the one bandwidth the course prints for that GPU (kvlib/core/devices.py, with its
    source), and the run's own measurement stays in report["record"]["bandwidth_GBps"], labelled measured.
    """
    rows = [
        {
            **r,
            "predicted_s": r["bytes"] / device.bandwidth,
            "measured_over_predicted": r["median_s"] * device.bandwidth / r["bytes"],
        }
        for r in report["rows"]
    ]
    source = f"{device.name} datasheet bandwidth, kvlib/core/devices.py: {device.source}"
    return {
        **report,
        "rows": rows,
        "bandwidth": {"bytes_per_s": device.bandwidth, "kernel": "datasheet", "source": source},
    }


def format_gqa(report: dict, learner: bool = False) -> str:
    """The report as text: the table of step times, then where the time goes. learner=True (notebook 06) leaves out
    the project's goal line and names the method's fine print by its place in docs/benchmarks.md instead."""
    r, c = report["record"], report["config"]
    threads = "CUDA graphs" if r.get("cuda_graph") else f"{r['threads']} thread(s)"
    lines = [
        f"kvlib bench gqa: {r['device']}, {threads}, torch {r['torch']}, {r.get('dtype', 'float32')}, "
        f"batch {r.get('batch', 1)}, median of {r['rounds']} interleaved rounds",
        f"model: d_model {c['d_model']}, {c['n_layers']} layers, {c['n_heads']} heads of {c['d_model'] // c['n_heads']}, "
        f"random weights; predicted = bytes moved / {report['bandwidth']['bytes_per_s'] / 1e9:,.1f} GB/s "
        + (
            f"({report['bandwidth']['source']})"
            if report["bandwidth"].get("source")
            else f"(measured {report['bandwidth']['kernel']} bandwidth)"
        ),
        "",
        f"{'kv_len':>7} {'n_kv_heads':>10} {'method':>13} {'cache MB':>9} {'step ms':>9} {'min-max ms':>14} "
        f"{'predicted':>9} {'meas/pred':>9} {'vs MHA':>7} {'best/best':>9}",
    ]
    for row in report["rows"]:
        lines.append(
            f"{row['kv_len']:>7} {row['n_kv_heads']:>10} {row['method']:>13} {row['cache_bytes'] / 1e6:>9.1f} "
            f"{row['median_s'] * 1e3:>9.2f} {row['min_s'] * 1e3:>6.1f}-{row['max_s'] * 1e3:<7.1f} "
            f"{row['predicted_s'] * 1e3:>9.2f} {row['measured_over_predicted']:>8.2f}x {row['speedup_vs_mha']:>6.2f}x "
            f"{row['speedup_vs_mha_best']:>8.2f}x"
        )
    split_k = any(row["method"] == "split-k" for row in report["rows"])
    lines.append(
        "\nvs MHA = MHA's median step time / this one's (>1: faster), sdpa against mha sdpa, the others against mha; "
        "best/best = the same for the fastest runs.\nmha: kvlib's attention; materialised: repeat_kv then MHA attention; "
        "grouped: grouped_attention (Exercise 6.2); "
        + (
            "split-k: the same in chunks of 1,024 cached tokens merged by the online softmax (split_k_attention); "
            if split_k
            else ""
        )
        + "sdpa: torch's fused SDPA (enable_gqa for GQA)"
    )
    if "fixed" in report:  # recordings made before the fixed part was measured lack it
        lines += _format_time_split(report, learner)
    return "\n".join(lines)


GQA_GOAL = 2.0  # this project's aim: GQA-2 (n_kv_heads = n_heads / 4) twice as fast as MHA at 8k cached tokens


def _split_ok(row: dict) -> bool:
    """Whether a row's fixed part is meaningful (recordings made before fixed_ok lack it: a positive one was taken)."""
    return row.get("fixed_ok", row["fixed_s"] > 0)


def _format_time_split(report: dict, learner: bool = False) -> list[str]:
    """The second table of format_gqa: each step split into its fixed part and its cache part, and the verdict."""

    def ms(x):
        return f"{x * 1e3:.2f}" if x is not None else "-"

    n_kv = report["config"]["n_kv_heads"]
    fixed_how = report.get(
        "fixed_method",
        f"the same step at {report['fixed'][0]['kv_len']} cached tokens (a warm, "
        "short cache: recordings before 2026-12-01)",
    )
    if learner:
        fixed_how = "a line's intercept at 0 cached tokens, with the quartiles of the same line fitted round by round"

    lines = [
        "",
        f"Where the time goes: fixed = {fixed_how}, each way's own line: what does not grow with the cache (the "
        "weights, of which GQA shrinks only k_proj and v_proj, and the step's small operations); "
        "cache = step - fixed; the ratio of cache parts (median, quartiles) only where both stand "
        "clear of the fixed part's spread",
        f"{'kv_len':>7} {'n_kv_heads':>10} {'method':>13} {'step ms':>9} {'fixed ms (q1-q3)':>20} {'cache ms':>9} "
        f"{'cache GB/s':>10} {'cache vs MHA (q1-q3)':>23} {'step vs MHA':>11}",
    ]
    for row in report["rows"]:
        ok = _split_ok(row)
        rate = f"{row['cache_bytes_per_s'] / 1e9:.1f}" if ok and row["cache_bytes_per_s"] is not None else "-"
        spread = row.get("fixed_spread_s")
        fixed = ms(row["fixed_s"]) + (f" ({spread[0] * 1e3:.2f}-{spread[1] * 1e3:.2f})" if spread else "")
        if not ok:
            fixed = "no split"  # a line's intercept below 0 or above the step: no fixed part to report
        cvm = row["cache_speedup_vs_mha"]
        cvm = (
            "-"
            if cvm is None
            else f"{cvm:.2f}x"
            + (" ({:.2f}-{:.2f})".format(*row["cache_speedup_spread"]) if row.get("cache_speedup_spread") else "")
        )
        cache = row["cache_s"] if ok and row["cache_s"] is not None and row["cache_s"] > 0 else None
        lines.append(
            f"{row['kv_len']:>7} {row['n_kv_heads']:>10} {row['method']:>13} {ms(row['median_s']):>9} {fixed:>20} "
            f"{ms(cache):>9} {rate:>10} {cvm:>23} {row['speedup_vs_mha']:>10.2f}x"
        )
    whys = {
        (row["n_kv_heads"], row["method"]): row.get("fixed_why", "") for row in report["rows"] if not _split_ok(row)
    }
    for (h, method), why in whys.items():
        lines.append(
            f"no split, n_kv_heads {h} {method}: {why or 'the intercept is below 0: the step grows faster than a line'}"
        )
    if any(m == "materialised" for _, m in whys):
        lines.append(
            "(the copying path allocates n_heads heads of fresh copies every step: its time bends upward with kv_len)"
        )
    quarter = n_kv[0] // 4 if n_kv[0] // 4 in n_kv else n_kv[-1]
    lens = sorted({row["kv_len"] for row in report["rows"]})
    at = {(row["kv_len"], row["n_kv_heads"], row["method"]): row for row in report["rows"]}
    for kv_len in lens:
        g, mha = at[kv_len, quarter, "grouped"], at[kv_len, n_kv[0], "mha"]
        if g["cache_speedup_vs_mha"] is None:  # say which of the two rows stopped the ratio, and why
            why = (
                "MHA's step does not split into a fixed and a cache part"
                if not _split_ok(mha)
                else "its step does not split into a fixed and a cache part"
                if not _split_ok(g)
                else "a cache part does not stand clear of the fixed part's spread"
            )
            lines.append(
                f"{kv_len} cached tokens, n_kv_heads {quarter} (grouped) against MHA: no ratio of cache parts in this "
                f"run: {why}"
            )
            continue
        lines.append(
            f"{kv_len} cached tokens, n_kv_heads {quarter} (grouped) against MHA: cache part {ms(g['cache_s'])} ms against "
            f"{ms(mha['cache_s'])} (ratio {g['cache_speedup_vs_mha']:.2f}x, for {n_kv[0] // quarter}x fewer bytes); fixed part "
            f"{ms(g['fixed_s'])} against {ms(mha['fixed_s'])} ms; the whole step {g['speedup_vs_mha']:.2f}x"
        )
    if 8192 in lens and "fixed_method" in report and not learner:
        g, mha = at[8192, quarter, "grouped"], at[8192, n_kv[0], "mha"]
        got = g["speedup_vs_mha"]
        if got >= GQA_GOAL:
            lines.append(f"goal: GQA-{quarter} at least {GQA_GOAL:.0f}x MHA at 8192 cached tokens: {got:.2f}x, met")
        elif not (_split_ok(g) and _split_ok(mha)):
            lines.append(
                f"goal: GQA-{quarter} at least {GQA_GOAL:.0f}x MHA at 8192 cached tokens: {got:.2f}x, short by "
                f"{GQA_GOAL / got:.2f}x; this run's times do not split into a fixed and a cache part, so no why"
            )
        else:
            # what the cache part would have to shrink to for the goal, with the fixed part as measured
            need = mha["median_s"] / GQA_GOAL - g["fixed_s"]
            lines.append(
                f"goal: GQA-{quarter} at least {GQA_GOAL:.0f}x MHA at 8192 cached tokens: {got:.2f}x, short by "
                f"{GQA_GOAL / got:.2f}x. Why: the fixed part ({ms(g['fixed_s'])} ms) does not grow with the cache, and the "
                f"cache part shrank to {ms(g['cache_s'])} ms, not the {ms(max(need, 0.0))} ms the goal needs"
                + (
                    f": it was read at {g['cache_bytes_per_s'] / 1e9:.1f} GB/s against MHA's "
                    f"{mha['cache_bytes_per_s'] / 1e9:.1f} (a group of {n_kv[0] // quarter} queries per cached "
                    f"number: a {n_kv[0] // quarter}-column product one core runs at a lower rate)"
                    if g["cache_bytes_per_s"] and mha["cache_bytes_per_s"]
                    else ""
                )
                + (
                    f". Split-K, the same in chunks merged by the online softmax, ran "
                    f"{at[8192, quarter, 'split-k']['speedup_vs_mha']:.2f}x: on one core there is no parallelism for "
                    "it to win, and its chunks' smaller products and merges cost more than the locality saves"
                    if (8192, quarter, "split-k") in at
                    else ""
                )
            )
    return lines
