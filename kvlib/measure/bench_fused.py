"""`kvlib bench fused` (notebook 09): attention without the whole score matrix, measured.

Peak memory of causal attention, the textbook way (the seq_len x kv_len scores, then softmax) against
the learner's tiled loop (9.2) and torch's own fused kernel (SDPA), read from the allocator's record
(torch.profiler with profile_memory: every allocation and free, summed in order); the FLOPs the causal
tiles skip, counted by torch; and one decode step's attention at long context: float32 SDPA, int8
dequantised first (8.2), int8 with folded scales (9.4), and 8.2's dequantise-then-attend compiled by
inductor, which fuses the conversion into the loops that read the cache (no float copy is made), timed
in interleaved rounds beside the machine's bandwidth ceiling (the best of notebook 05's kernels).
"""

from __future__ import annotations

import datetime
import math
import os
import re
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager

import numpy as np
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from kvlib.core import progress
from kvlib.core.flops import matmul_flops
from kvlib.core.model import ModelConfig
from kvlib.measure.machine import bandwidth_kernels
from kvlib.measure.timing import environment, num_threads
from kvlib.variants.compressed import GROUP, Int8KVCache

# streaming multiprocessors (SMs), the units a GPU spreads blocks of work over: NVIDIA H100 Tensor Core GPU Architecture
# whitepaper (H100 SXM5 132, H100 PCIe 114) and NVIDIA A100 Tensor Core GPU Architecture whitepaper (A100 108)
GPU_SMS = {"H100 SXM": 132, "H100 PCIe": 114, "A100": 108}
COMPUTED, SKIPPED, MASKED = 0, 1, 2  # what the causal tiled loop does with one (query tile, key tile)
GOAL_PEAK_SHARE = 1 / 16  # tiled at most 1/16 of naive's peak at 4,096 tokens
COMPILED = "int8, compiled"  # dequantised_reduction under torch.compile: the conversion fused into the cache's reads
GOAL_SPEEDUP, GOAL_CEILING = 2.0, 0.7  # compiled int8 >= 2x float32 at 16k, >= 70% of the bandwidth ceiling

# ---------------------------------------------------------------------------------------------
# Which tiles a causal loop computes, and what that costs


def tile_kinds(seq_len: int, kv_len: int, tile: int) -> np.ndarray:
    """(query tiles, key tiles) grid: COMPUTED (every pair visible), MASKED (some) or SKIPPED (none).

    Queries are the last seq_len of kv_len positions, as everywhere in the course. Each tile is judged by counting
    its visible (query, key) pairs, one row of counts per query: no loop over tiles.
    """
    if tile < 1 or seq_len < 1 or kv_len < seq_len:
        raise ValueError(f"need tile >= 1 and 1 <= seq_len <= kv_len, got {tile}, {seq_len}, {kv_len}")
    key_starts, query_starts = np.arange(0, kv_len, tile), np.arange(0, seq_len, tile)
    key_sizes = np.minimum(tile, kv_len - key_starts)
    query_sizes = np.minimum(tile, seq_len - query_starts)
    sees = kv_len - seq_len + 1 + np.arange(seq_len)  # how many keys each query may attend (a causal mask's row sum)
    per_query = np.clip(sees[:, None] - key_starts[None, :], 0, key_sizes[None, :])  # (seq_len, key tiles)
    visible = np.add.reduceat(per_query, query_starts, axis=0)  # (query tiles, key tiles): visible pairs
    whole = query_sizes[:, None] * key_sizes[None, :]
    return np.where(visible == 0, SKIPPED, np.where(visible == whole, COMPUTED, MASKED))


def tile_flops(seq_len: int, kv_len: int, tile: int, batch: int = 1, heads: int = 1, head_dim: int = 64):
    """(matmul FLOPs of the tiles a causal loop computes, of every tile): q k^T and p v, 2 per multiply-add."""
    kinds = tile_kinds(seq_len, kv_len, tile)
    rows = np.minimum(tile, seq_len - tile * np.arange(kinds.shape[0]))[:, None]
    cols = np.minimum(tile, kv_len - tile * np.arange(kinds.shape[1]))[None, :]
    cost = 4 * rows * cols * head_dim * batch * heads
    return int(cost[kinds != SKIPPED].sum()), int(cost.sum())


# ---------------------------------------------------------------------------------------------
# Peak memory, from the allocator's record


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention the textbook way: the whole (seq_len, kv_len) score matrix, masked, softmaxed."""
    T, S = q.shape[2], k.shape[2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, T, S)
    allowed = torch.ones(T, S, dtype=torch.bool).tril(S - T)  # True = may attend
    return scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1) @ v


def sdpa_causal(q, k, v):
    T, S = q.shape[2], k.shape[2]
    mask = None if T == S else torch.ones(T, S, dtype=torch.bool).tril(S - T)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=T == S)


# kineto, the profiler's C++ side, writes a "USDT:" line to the process's stderr at each start and stop
# (pytorch/kineto#1325), at every KINETO_LOG_LEVEL but 6, which silences its errors too, and only when set before
# the process's first profile. So _profiled takes these lines out of stderr, and only these.
_KINETO_LINE = re.compile(rb"^USDT:\S+ \S+ \d+:\d+ \w+\.cpp:\d+\] .*\n?", re.MULTILINE)


@contextmanager
def _profiled(**options):
    """torch.profiler.profile(**options) on the CPU, with stderr (file descriptor 2) passed through a file
    meanwhile, and written back without kineto's start and stop lines (in a terminal or a notebook's cell)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            with profile(activities=[ProfilerActivity.CPU], **options) as prof:
                yield prof
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            if rest := _KINETO_LINE.sub(b"", caught.read()):
                os.write(2, rest)


def peak_bytes(fn, *args) -> tuple[int, object]:
    """(the most bytes fn(*args) held allocated at once, beyond its inputs; its result), from torch's profiler.

    Every allocation and free the CPU allocator reports while fn runs, summed in the order they happened.
    """
    with _profiled(profile_memory=True) as prof:
        out = fn(*args)
    live = peak = 0
    for event in prof.profiler.kineto_results.events():  # in the order recorded
        if event.name() == "[memory]":
            live += event.nbytes()
            peak = max(peak, live)
    return peak, out


def _qkv(n: int, heads: int = 1, head_dim: int = 64, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, heads, n, head_dim, generator=g) for _ in range(3))


def peak_case(n: int, tile: int = 128, head_dim: int = 64) -> tuple[dict, dict, float]:
    """Peak memory of naive and tiled (9.2) causal attention at seq_len = kv_len = n; their largest difference."""
    from kvlib.fused import tiled_attention  # noqa: PLC0415 (late binding: runs the learner's code)

    q, k, v = _qkv(n, head_dim=head_dim)
    naive_peak, naive_out = peak_bytes(naive_attention, q, k, v)
    tiled_peak, tiled_out = peak_bytes(tiled_attention, q, k, v, tile)
    exact = float((naive_out - tiled_out).abs().max())
    return {"peak_bytes": naive_peak}, {"peak_bytes": tiled_peak}, exact


def _available_bytes() -> int:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def memory_rows(lengths=(1024, 4096, 16384), tile: int = 128, rounds: int = 3) -> dict:
    """Peak memory and time of naive, tiled (9.2) and SDPA causal attention, one head of 64, per length."""
    from kvlib.fused import tiled_attention  # noqa: PLC0415 (late binding: runs the learner's code)

    rows, skipped = [], []
    for n in progress.bar(lengths, desc="peak memory", unit="length"):
        if 4 * n * n * 4 > _available_bytes() // 2:  # naive holds about three n x n float32 matrices
            skipped.append(n)
            continue
        q, k, v = _qkv(n)
        ways = {
            "naive": lambda: naive_attention(q, k, v),
            "tiled": lambda: tiled_attention(q, k, v, tile),
            "sdpa": lambda: sdpa_causal(q, k, v),
        }
        row = {"seq_len": n, "kv_len": n, "tile": tile, "scores_bytes": n * n * 4}
        outs, profiled_s = {}, {}
        for name, fn in ways.items():
            start = time.perf_counter()
            row[f"{name}_peak_bytes"], outs[name] = peak_bytes(fn)
            profiled_s[name] = time.perf_counter() - start
        row["tiled_vs_naive_max_diff"] = float((outs["tiled"] - outs["naive"]).abs().max())
        row["tiled_vs_sdpa_max_diff"] = float((outs["tiled"] - outs["sdpa"]).abs().max())
        outs = None
        samples = {name: [] for name in ways}
        for _ in range(rounds if n <= 4096 else 0):  # interleaved: a busy neighbour slows all three alike
            for name, fn in ways.items():
                start = time.perf_counter()
                fn()
                samples[name].append(time.perf_counter() - start)
        row["timed_under_the_profiler"] = not samples["naive"]  # past 4,096 naive takes seconds a call: timed once
        row["rounds_s"] = samples  # each way's time in each round, for paired per-round ratios (claims)
        row |= {f"{name}_s": statistics.median(t) if t else profiled_s[name] for name, t in samples.items()}
        row["tiled_peak_share"] = row["tiled_peak_bytes"] / row["naive_peak_bytes"]
        rows.append(row)
    return {"rows": rows, "skipped_lengths": skipped, "rounds": rounds}


def flop_rows(lengths=(1024, 4096), tile: int = 128) -> list[dict]:
    """Matmul FLOPs of the tiled causal loop (9.2), counted by torch, against the naive full count (counted too)."""
    from kvlib.fused import tiled_attention  # noqa: PLC0415 (late binding: runs the learner's code)

    rows = []
    for n in lengths:
        q, k, v = _qkv(n)
        counted, full_formula = matmul_flops(tiled_attention, q, k, v, tile), tile_flops(n, n, tile)[1]
        full = matmul_flops(naive_attention, q, k, v)
        rows.append(
            {
                "seq_len": n,
                "tile": tile,
                "tiled_flops": counted,
                "naive_flops": full,
                "tiles_formula_flops": tile_flops(n, n, tile)[0],
                "full_formula_flops": full_formula,
                "causal_share": counted / full,
            }
        )
    return rows


# ---------------------------------------------------------------------------------------------
# One decode step's attention: float32, int8 with a copy, int8 folded, int8 folded and compiled


def dequantised_reduction(q, k_values, k_scale, v_values, v_scale):
    """8.2's maths (dequantise, then attend) written as products and sums, for torch.compile: inductor fuses each
    dequantisation into the reduction that reads it, so the float keys and values are never stored. Eager, this
    would make the copies 8.2 makes; 9.4 avoids them by hand. The value sum runs in two stages over blocks of 256
    tokens: one long reduction along the token axis compiles to a slow loop. Attends to every stored token (kv_len a
    multiple of 256)."""
    B, H_kv, n_groups, group, D = k_values.shape
    G, S = q.shape[1] // H_kv, n_groups * group
    keys = k_values.float() * k_scale  # (B, H_kv, ng, group, D), fused into the score loop: never stored
    scores = (q.reshape(B, H_kv, 1, 1, G, D) * keys[:, :, :, :, None, :]).sum(-1) / math.sqrt(D)  # (.., group, G)
    probs = scores.permute(0, 1, 4, 2, 3).reshape(B, H_kv, G, S).softmax(-1)
    values = (v_values.float() * v_scale).view(B, H_kv, 1, S // 256, 256, D)  # fused into the value sum
    return (probs.view(B, H_kv, G, S // 256, 256, 1) * values).sum(-2).sum(-2).reshape(B, H_kv * G, 1, D)


def _decode_config(kv_len: int) -> ModelConfig:
    """One layer of notebook 06's long-context bench shape: 8 heads of 64 (MHA), float32."""
    return ModelConfig(
        vocab_size=256, d_model=512, n_layers=1, n_heads=8, n_kv_heads=8, hidden_dim=512, max_seq_len=kv_len
    )


def _decode_ways(kv_len: int, compiled=None, seed: int = 0):
    from kvlib.compress import int8_attention  # noqa: PLC0415 (late binding: runs the learner's code)
    from kvlib.fused import int8_folded_attention  # noqa: PLC0415 (late binding: runs the learner's code)

    config = _decode_config(kv_len)
    g = torch.Generator().manual_seed(seed)
    H, H_kv, D = config.n_heads, config.n_kv_heads, config.head_dim
    k, v = torch.randn(1, H_kv, kv_len, D, generator=g), torch.randn(1, H_kv, kv_len, D, generator=g)
    q = torch.randn(1, H, 1, D, generator=g)
    cache = Int8KVCache(config, max_seq_len=kv_len)  # the learner's 8.1 quantize, KIVI's axes
    cache.update(0, k, v)
    view = cache.layer_view(0, kv_len)
    ways = {
        "float32 SDPA": lambda: F.scaled_dot_product_attention(q, k, v),
        "int8, dequantised copy (8.2)": lambda: int8_attention(q, *view, kv_len),
        "int8, folded (9.4)": lambda: int8_folded_attention(q, *view, kv_len),
    }
    if compiled is not None:
        ways[COMPILED] = lambda: compiled(q, *view)
    int8_bytes = sum(t.nbytes for t in view)
    float_bytes = k.nbytes + v.nbytes
    reads = {
        "float32 SDPA": float_bytes,
        "int8, dequantised copy (8.2)": int8_bytes + 2 * float_bytes,  # int8 read, float copy written, read again
        "int8, folded (9.4)": int8_bytes,
        COMPILED: int8_bytes,
    }
    outs = {name: fn() for name, fn in ways.items()}
    diffs = {name: float((out - outs["float32 SDPA"]).abs().max()) for name, out in outs.items()}
    return ways, reads, diffs, float_bytes, int8_bytes


def _kernel_times(fn, calls: int = 5) -> dict:
    """Mean seconds per call of each inductor kernel fn runs (torch.profiler), longest first."""
    with _profiled() as prof:
        for _ in range(calls):
            fn()
    times = {e.key: e.cpu_time_total / e.count / 1e6 for e in prof.key_averages() if "cpp_fused" in e.key}
    return dict(sorted(times.items(), key=lambda kv: -kv[1]))


def decode_rows(
    kv_lens=(4096, 16384, 65536),
    rounds: int = 7,
    compile_it: bool = True,
    ceiling_bytes: int | None = 256 << 20,
    only: tuple[str, ...] | None = None,
) -> dict:
    """Each way's median time over interleaved rounds, its bytes read, its share of the bandwidth ceiling (timed in
    the same rounds; ceiling_bytes=None times no ceiling, and the shares are left out). only: the ways to time, by
    name (float32 SDPA, the base of every ratio, always)."""
    compiled, compile_s, compile_error = None, None, None
    if compile_it:
        import torch._inductor.config as inductor_config  # noqa: PLC0415 (start-up time: inductor loads only when a step is compiled)

        inductor_fn = torch.compile(dequantised_reduction, dynamic=False)

        def compiled(*args):  # inductor's kernels named in the profiler, so the step's time can be split by kernel
            with inductor_config.patch({"cpp.enable_kernel_profile": True}):
                return inductor_fn(*args)

    kernels = bandwidth_kernels(ceiling_bytes, streams=8) if ceiling_bytes else {}
    ceiling_samples = {name: [] for name in kernels}
    rows = []
    for S in progress.bar(kv_lens, desc="a decode step's attention", unit="kv_len"):
        ways, reads, diffs, float_bytes, int8_bytes = (None,) * 5
        try:
            start = time.perf_counter()
            ways, reads, diffs, float_bytes, int8_bytes = _decode_ways(S, compiled)
            if compiled is not None:
                compile_s = (compile_s or 0) + time.perf_counter() - start
        except Exception as err:  # a compiler that fails must not cost the rest of the benchmark
            compile_error = f"{type(err).__name__}: {str(err)[:300]}"
            compiled = None
            ways, reads, diffs, float_bytes, int8_bytes = _decode_ways(S, None)
        if only is not None:
            ways = {name: fn for name, fn in ways.items() if name in only or name == "float32 SDPA"}
        samples = {name: [] for name in ways}
        for fn in ways.values():
            fn()  # warm-up
        for _ in range(rounds):
            for name, fn in ways.items():
                start = time.perf_counter()
                fn()
                samples[name].append(time.perf_counter() - start)
            for name, (fn, _) in kernels.items():  # the ceiling, in the same rounds
                start = time.perf_counter()
                fn()
                ceiling_samples[name].append(time.perf_counter() - start)
        kernels_s = _kernel_times(ways[COMPILED]) if COMPILED in ways else {}
        base = samples["float32 SDPA"]
        rows.append(
            {
                "kv_len": S,
                "float32_bytes": float_bytes,
                "int8_bytes": int8_bytes,
                "ways": {
                    name: {
                        "median_s": statistics.median(t),
                        "spread_s": [min(t), max(t)],
                        "bytes_read": reads[name],
                        "speedup_vs_float32": statistics.median(b / x for b, x in zip(base, t)),
                        "rounds_s": t,  # every round's time, in the rounds' order (paired with the other ways')
                        "max_diff_vs_float32": diffs[name],
                    }
                    for name, t in samples.items()
                },
                "compiled_kernels_s": kernels_s,
            }
        )
    rates = {name: moved / statistics.median(ceiling_samples[name]) for name, (_, moved) in kernels.items()}
    kernel = max(rates, key=rates.get) if rates else None
    for row in rows:
        for way in row["ways"].values():
            way["bytes_per_s"] = way["bytes_read"] / way["median_s"]
            if kernel:
                way["share_of_ceiling"] = way["bytes_per_s"] / rates[kernel]
    names = list(rows[0]["ways"]) if rows else []
    return {
        "config": _decode_config(max(kv_lens)).to_dict(),
        "ways": names,
        "rows": rows,
        "rounds": rounds,
        "ceiling_bytes_per_s": rates[kernel] if kernel else None,
        "ceiling_kernel": kernel,
        "rates": rates,
        "compile_s": compile_s,
        "compile_error": compile_error,
    }


# ---------------------------------------------------------------------------------------------
# kvlib bench fused


def bench_fused(threads: int = 1, quick: bool = False, device: str = "cpu") -> dict:
    """Peak memory naive vs tiled, causal FLOPs, and the decode step's attention four ways (quick: small, no compile)."""
    if torch.device(device).type != "cpu":
        raise ValueError("kvlib bench fused runs on the CPU only: its peak memory is the CPU allocator's record")
    with (
        num_threads(threads),
        torch.inference_mode(),
        progress.bar(desc="kvlib bench fused", total=3, unit="part") as parts,
    ):
        parts.set_postfix_str("peak memory, naive against tiled")
        memory = memory_rows((256, 512), tile=64, rounds=1) if quick else memory_rows()
        parts.update()
        parts.set_postfix_str("causal FLOPs counted")
        flops = flop_rows((256, 512), tile=64) if quick else flop_rows()
        parts.update()
        parts.set_postfix_str("a decode step's attention, float32 against int8")
        decode = (
            decode_rows((512, 1024), rounds=2, compile_it=False, ceiling_bytes=32 << 20) if quick else decode_rows()
        )
        parts.update()
        record = environment(
            "cpu",
            dtype="float32 / int8",
            threads_requested=threads,
            group=GROUP,
            load_average_1min=round(os.getloadavg()[0], 2),  # how busy the machine was (other jobs)
            cpus=os.cpu_count(),
        )
    return {
        "benchmark": "fused",
        "date": datetime.date.today().isoformat(),
        "record": record,
        "memory": memory,
        "flops": flops,
        "decode": decode,
        "quick": quick,
    }


def _size(n: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def goals(report: dict) -> list[str]:
    """Each goal of the benchmark, measured: met or missed, and where missed the measured cause."""
    lines = []
    at = [r for r in report["memory"]["rows"] if r["seq_len"] == 4096]
    if at:
        r = at[0]
        met = r["tiled_peak_share"] <= GOAL_PEAK_SHARE and r["tiled_vs_naive_max_diff"] < 1e-4
        lines.append(
            f"goal: tiled peak <= 1/16 of naive at 4,096 tokens, exact: {r['tiled_peak_share']:.4f} "
            f"(1/{1 / r['tiled_peak_share']:.0f}), max difference {r['tiled_vs_naive_max_diff']:.1e}: "
            + ("met" if met else "MISSED")
        )
    for r in report["flops"]:
        lines.append(f"causal tiles at {r['seq_len']:,} tokens: {r['causal_share']:.1%} of the full count (about half)")
    d = report["decode"]
    at16 = [r for r in d["rows"] if r["kv_len"] == 16384]
    name = COMPILED
    if at16 and name in at16[0]["ways"]:
        w = at16[0]["ways"][name]
        met = w["speedup_vs_float32"] >= GOAL_SPEEDUP and w["share_of_ceiling"] >= GOAL_CEILING
        line = (
            f"goal: compiled int8 >= {GOAL_SPEEDUP:.0f}x float32 at 16k and >= {GOAL_CEILING:.0%} of the ceiling: "
            f"{w['speedup_vs_float32']:.2f}x, {w['share_of_ceiling']:.0%} ({w['bytes_per_s'] / 1e9:.1f} of "
            f"{d['ceiling_bytes_per_s'] / 1e9:.1f} GB/s): " + ("met" if met else "MISSED")
        )
        if not met:
            line += ". " + _cause(d, at16[0], name)
        lines.append(line)
    elif d.get("compile_error"):
        lines.append(f"goal: compiled int8 not measured: torch.compile failed ({d['compile_error']})")
    else:
        lines.append("goal: compiled int8 not measured (--quick skips torch.compile)")
    return lines


def _cause(d: dict, row: dict, name: str) -> str:
    """The measured cause of a missed decode goal: which kernel took the time, at what rate, and how the same
    kernel ran at the shortest length, whose int8 cache fits in the CPU's caches."""
    w, ceiling = row["ways"][name], d["ceiling_bytes_per_s"]
    kernels = row.get("compiled_kernels_s") or {}
    parts = []
    if kernels:
        top, top_s = next(iter(kernels.items()))
        parts.append(
            f"Cause, as measured: {len(kernels)} inductor kernel(s); the longest, {top.split('_cpp_')[-1][:60]}, takes "
            f"{top_s * 1e3:.2f} of the step's {w['median_s'] * 1e3:.2f} ms"
        )
    else:
        parts.append("Cause, as measured")
    numbers = row["int8_bytes"] / w["median_s"]  # int8 numbers (1 byte each, scales aside) per second
    parts.append(f"it handles {numbers / 1e9:.1f} G int8 numbers/s, {w['share_of_ceiling']:.0%} of the read ceiling")
    small = min(d["rows"], key=lambda r: r["kv_len"])
    if small is not row and name in small["ways"]:
        rate = small["ways"][name]["bytes_per_s"]
        if rate < GOAL_CEILING * ceiling:
            parts.append(
                f"at {small['kv_len']:,} tokens, where its int8 cache ({_size(small['int8_bytes'])}) sits in the "
                f"CPU's caches, the same kernel ran at {rate / 1e9:.1f} GB/s, still below {GOAL_CEILING:.0%} of the "
                "ceiling: converting, scaling and summing each number, not memory, limits it"
            )
        else:
            parts.append(
                f"at {small['kv_len']:,} tokens, from the CPU's caches, it ran at {rate / 1e9:.1f} GB/s: it computes "
                "fast enough, but streams from memory slower than the read kernel does"
            )
    return "; ".join(parts)


def format_fused(report: dict) -> str:
    m, d = report["memory"], report["decode"]
    lines = [
        "kvlib bench fused" + (" --quick (a smoke test: too small to trust)" if report.get("quick") else ""),
        "",
        "Causal attention, one head of 64, float32: peak memory allocated during the call (torch.profiler, "
        f"profile_memory), median time of {m['rounds']} interleaved rounds",
        f"{'tokens':>7} {'scores':>10} {'naive peak':>11} {'tiled peak':>11} {'SDPA peak':>10} {'tiled/naive':>12} "
        f"{'max diff':>9} {'naive ms':>9} {'tiled ms':>9} {'SDPA ms':>8}",
    ]
    for r in m["rows"]:
        lines.append(
            f"{r['seq_len']:>7,} {_size(r['scores_bytes']):>10} {_size(r['naive_peak_bytes']):>11} "
            f"{_size(r['tiled_peak_bytes']):>11} {_size(r['sdpa_peak_bytes']):>10} {r['tiled_peak_share']:>12.4f} "
            f"{r['tiled_vs_naive_max_diff']:>9.1e} {r['naive_s'] * 1e3:>9.1f} {r['tiled_s'] * 1e3:>9.1f} "
            f"{r['sdpa_s'] * 1e3:>8.1f}"
        )
    if any(r.get("timed_under_the_profiler") for r in m["rows"]):
        lines.append("past 4,096 tokens each way is timed once, in its profiled call (naive takes seconds a call)")
    if m["skipped_lengths"]:
        lines.append(f"skipped (not enough free memory for naive): {m['skipped_lengths']}")
    lines += ["", "Matmul FLOPs counted by torch (FlopCounterMode): causal tiles against the full matrix"]
    for r in report["flops"]:
        lines.append(
            f"{r['seq_len']:>7,} tokens, tiles of {r['tile']}: tiled {r['tiled_flops'] / 1e9:.2f} GFLOP, naive "
            f"{r['naive_flops'] / 1e9:.2f} GFLOP ({r['causal_share']:.1%}); formula {r['tiles_formula_flops'] / 1e9:.2f}"
        )
    lines += [
        "",
        f"One decode step's attention, one layer of 8 heads of 64, median of {d['rounds']} interleaved rounds; ceiling "
        f"{d['ceiling_bytes_per_s'] / 1e9:.1f} GB/s ({d['ceiling_kernel']}, the best of notebook 05's kernels, same rounds)",
        f"{'kv_len':>7} {'way':<30} {'ms':>8} {'read':>10} {'GB/s':>6} {'ceiling':>8} {'vs float32':>11} {'max diff':>9}",
    ]
    for r in d["rows"]:
        for name, w in r["ways"].items():
            lines.append(
                f"{r['kv_len']:>7,} {name:<30} {w['median_s'] * 1e3:>8.2f} {_size(w['bytes_read']):>10} "
                f"{w['bytes_per_s'] / 1e9:>6.1f} {w['share_of_ceiling']:>8.0%} {w['speedup_vs_float32']:>10.2f}x "
                f"{w['max_diff_vs_float32']:>9.1e}" + (" *" if w["share_of_ceiling"] > 1 else "")
            )
    if any(w["share_of_ceiling"] > 1 for r in d["rows"] for w in r["ways"].values()):
        lines.append(
            "* above the ceiling: these bytes came from the CPU's caches (a few MiB), not from memory; the ceiling "
            "streams arrays far larger than any cache"
        )
    for r in d["rows"]:
        if r.get("compiled_kernels_s"):
            lines.append(
                f"compiled at {r['kv_len']:,}: "
                + ", ".join(f"{k.split('_cpp_')[-1][:50]} {t * 1e3:.2f} ms" for k, t in r["compiled_kernels_s"].items())
            )
    if d.get("compile_s"):
        lines.append(f"torch.compile took {d['compile_s']:.0f} s (once per length: static shapes)")
    rec = report["record"]
    lines += [
        "",
        f"{rec['device']}, torch {rec['torch']}, {rec['threads']} thread(s); load average "
        f"{rec.get('load_average_1min')} on {rec.get('cpus')} CPUs at the end",
    ]
    lines += [""] + goals(report)
    return "\n".join(lines)
