"""Benchmarks behind `kvlib bench`: measured in one run, on one machine, at one thread count,
printed as a table or a JSON record with what produced the numbers.

  cache   tokens per second without a cache, with kvlib's KVCache, and with transformers'
          generate(use_cache=True) on identical weights; the tiny model and a GPT-2-small-size
          Llama with random weights. Naive decoding of the large model is too slow to run in
          full (minutes), so its total is the sum of per-step times measured at a few lengths
          and interpolated in between; the table says so.
"""
from __future__ import annotations

import statistics
import time

import numpy as np
import torch

from kvlib import benchmark
from kvlib.model import Decoder, ModelConfig


def gpt2_size_config() -> ModelConfig:
    """A Llama-shaped model the size of GPT-2 small: 12 layers, 12 heads, d_model 768, ~134M weights."""
    return ModelConfig(vocab_size=32000, d_model=768, n_layers=12, n_heads=12, n_kv_heads=12,
                       hidden_dim=2048, max_seq_len=1024)


# ---------------------------------------------------------------------------------------------
# Token timestamps of one generation


def _kvlib_times(fn, model, ids, n) -> list[float]:
    """Seconds from the start until each new token exists, for kvlib's generate or generate_cached."""
    stamps = []
    start = time.perf_counter()
    fn(model, ids, n, on_token=lambda token: stamps.append(time.perf_counter()))
    return [t - start for t in stamps]


def _hf_times(hf_model, ids, n) -> list[float]:
    """The same for transformers' generate(use_cache=True), timed by a streamer."""
    from transformers.generation.streamers import BaseStreamer

    class Stamps(BaseStreamer):
        def __init__(self):
            self.stamps, self.prompt_seen = [], False

        def put(self, value):
            if self.prompt_seen:  # the first put is the prompt itself
                self.stamps.append(time.perf_counter())
            self.prompt_seen = True

        def end(self):
            pass

    streamer = Stamps()
    start = time.perf_counter()
    with torch.inference_mode():
        out = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                                do_sample=False, use_cache=True, streamer=streamer, pad_token_id=0)
    assert out.shape[1] == ids.shape[1] + n, "transformers stopped early"
    return [t - start for t in streamer.stamps]


def _median_curve(runs: list[list[float]]) -> list[float]:
    return [statistics.median(col) for col in zip(*runs)]


def _naive_estimate(model, prompt_len: int, n: int, points: int = 6, repeats: int = 3):
    """Cumulative naive-decoding time per token, from forward times measured at `points` lengths.

    Naive step i runs a forward over prompt_len + i tokens; its time is measured at a few
    lengths and interpolated linearly in between. Returns (cumulative seconds, lengths, step seconds).
    """
    lengths = sorted({int(x) for x in np.linspace(prompt_len, prompt_len + n - 1, points)})
    step = []
    for L in lengths:
        ids = torch.zeros(1, L, dtype=torch.long)
        step.append(benchmark.measure(lambda: model(ids), warmup=1, repeats=repeats, threads=None).median)
    per_step = np.interp(np.arange(prompt_len, prompt_len + n), lengths, step)
    return list(np.cumsum(per_step)), lengths, step


def _growth(lengths, step_seconds) -> dict:
    """Fit per-step time = a + b*S + c*S^2 and the log-log slope between the shortest and longest S."""
    S, t = np.asarray(lengths, float), np.asarray(step_seconds, float)
    c, b, a = np.polyfit(S, t, 2) if len(S) >= 3 else (0.0, *np.polyfit(S, t, 1))
    slope = float(np.log(t[-1] / t[0]) / np.log(S[-1] / S[0])) if len(S) >= 2 and S[0] > 0 else float("nan")
    return {"a_s": float(a), "b_s_per_token": float(b), "c_s_per_token2": float(c), "loglog_slope": slope}


# ---------------------------------------------------------------------------------------------
# kvlib bench cache


def bench_cache(lengths=(64, 256, 512), threads: int = 1, prompt_len: int = 8, quick: bool = False) -> dict:
    """Tokens per second at each generated length, three ways, for the tiny and the GPT-2-size model."""
    from kvlib.generation import generate
    from kvlib.kv_cache import generate_cached
    from kvlib.model import load_tiny, to_transformers

    results = []
    with benchmark.num_threads(threads), torch.inference_mode():
        tiny, _ = load_tiny()
        big_config = gpt2_size_config() if not quick else ModelConfig(vocab_size=2000, d_model=128, n_layers=2, n_heads=4, n_kv_heads=4, hidden_dim=256, max_seq_len=1024)
        torch.manual_seed(0)
        big = Decoder(big_config).eval()
        big_name = "small-stand-in" if quick else "gpt2-size"
        for name, model, repeats, full_naive in (("tiny", tiny, 3, True), (big_name, big, 2, quick)):
            cap = model.config.max_seq_len - prompt_len
            ns = [min(n, cap) for n in lengths]
            n = max(ns)
            ids = torch.randint(0, model.config.vocab_size, (1, prompt_len), generator=torch.Generator().manual_seed(1))
            hf = to_transformers(model)
            _kvlib_times(generate_cached, model, ids, 8)  # warm-up of each path
            _hf_times(hf, ids, 8)
            cached = _median_curve([_kvlib_times(generate_cached, model, ids, n) for _ in range(repeats)])
            theirs = _median_curve([_hf_times(hf, ids, n) for _ in range(repeats)])
            if full_naive:
                naive = _median_curve([_kvlib_times(generate, model, ids, n) for _ in range(repeats)])
                step_lengths = list(range(prompt_len, prompt_len + n))
                step_times = [naive[0]] + [b - a for a, b in zip(naive, naive[1:])]
                how = f"measured in full, median of {repeats} runs"
            else:
                naive, step_lengths, step_times = _naive_estimate(model, prompt_len, n)
                how = f"sum of forward times measured at {len(step_lengths)} lengths, interpolated"
            del hf
            rows = []
            for k in ns:
                t_naive, t_cached, t_hf = naive[k - 1], cached[k - 1], theirs[k - 1]
                rows.append({
                    "new_tokens": k,
                    "tokens_per_s": {"no_cache": k / t_naive, "kvlib_cache": k / t_cached, "transformers_cache": k / t_hf},
                    "seconds": {"no_cache": t_naive, "kvlib_cache": t_cached, "transformers_cache": t_hf},
                    "cache_speedup": t_naive / t_cached,
                    "kvlib_vs_transformers": t_hf / t_cached,
                })
            results.append({
                "model": name, "params": model.num_params(), "config": model.config.to_dict(), "prompt_len": prompt_len,
                "repeats": repeats, "no_cache_method": how, "rows": rows,
                "no_cache_step_growth": _growth(step_lengths, step_times),
            })
        record = benchmark.environment("cpu", dtype="float32", threads_requested=threads)
    return {"benchmark": "cache", "record": record, "results": results}


def format_cache(report: dict) -> str:
    lines = [f"kvlib bench cache: {report['record']['device']}, {report['record']['threads']} thread(s), "
             f"torch {report['record']['torch']}, float32, greedy, batch 1"]
    for r in report["results"]:
        g = r["no_cache_step_growth"]
        lines += ["", f"{r['model']} ({r['params'] / 1e6:.1f}M parameters), prompt {r['prompt_len']} tokens; "
                      f"no cache: {r['no_cache_method']}",
                  f"{'new tokens':>10} {'no cache':>12} {'kvlib cache':>12} {'transformers':>12} {'speedup':>8} {'kvlib/HF':>9}",
                  f"{'':>10} {'tok/s':>12} {'tok/s':>12} {'tok/s':>12} {'':>8} {'':>9}"]
        for row in r["rows"]:
            t = row["tokens_per_s"]
            lines.append(f"{row['new_tokens']:>10} {t['no_cache']:>12.1f} {t['kvlib_cache']:>12.1f} {t['transformers_cache']:>12.1f} "
                         f"{row['cache_speedup']:>7.1f}x {row['kvlib_vs_transformers']:>8.2f}x")
        lines.append(f"  per-step time without cache ~ {g['a_s'] * 1e3:.2f} ms + {g['b_s_per_token'] * 1e6:.2f} us*S "
                     f"+ {g['c_s_per_token2'] * 1e9:.3f} ns*S^2 (log-log slope {g['loglog_slope']:.2f}) at S cached tokens")
    lines.append("\nspeedup = time without cache / time with kvlib's cache; kvlib/HF = transformers' time / kvlib's time (>1: kvlib faster)")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# kvlib bench gqa (notebook 06): decode at long context against n_kv_heads, three ways


def gqa_bench_config(n_kv_heads: int = 8, max_seq_len: int = 16392) -> ModelConfig:
    """A random-weight model whose KV cache outweighs its weights at long context: 8 heads of 64,
    4 layers, a narrow MLP (~7M matrix weights, 29 MB in float32; MHA's cache is 16 KiB per token, 128 MiB at 8k)."""
    return ModelConfig(vocab_size=256, d_model=512, n_layers=4, n_heads=8, n_kv_heads=n_kv_heads,
                       hidden_dim=512, max_seq_len=max_seq_len)


FIXED_KV_LEN = 16  # so few cached tokens that a step is all weights and small operations: its fixed part


def _gqa_method(method: str, mha: bool) -> str:
    """A row's name: "mha" (kvlib's attention) and "mha sdpa" for MHA; materialised, grouped or sdpa for GQA."""
    return ("mha sdpa" if method == "sdpa" else "mha") if mha else method


def bench_gqa(threads: int = 1, quick: bool = False, kv_lens=(4096, 8192, 16384), rounds: int = 21,
              bandwidth: dict | None = None, device: str = "cpu", batch: int | None = None) -> dict:
    """Time one decode step at each kv_len for n_kv_heads 8 (MHA), 4, 2, 1, attention done three ways.

    materialised: repeat_kv the cache out to n_heads, then MHA attention; grouped: kvlib's
    grouped_attention (Exercise 6.2); sdpa: torch's scaled_dot_product_attention(enable_gqa=True).
    Every case is timed once per round, rounds interleaved, so a busy neighbour slows all alike (the
    copying path in a block of its own, after the others); the median over rounds is reported with the roofline prediction: bytes moved / bandwidth
    (kvlib.roofline.measure_bandwidth, measured here unless its result is passed as `bandwidth`).
    On a CUDA GPU (device="cuda"): bfloat16, batch 64 unless given (one sequence's cache is too small
    to keep a GPU busy), and each step replayed as a CUDA graph (benchmark.replayable), so that what
    is timed is the reading of the cache rather than Python launching kernels.
    Where the time goes: each case is also timed at FIXED_KV_LEN cached tokens, in the same rounds, which
    leaves only the weights and the step's small operations (its fixed part, which GQA does not touch);
    a row's cache_s = its step time - that fixed part, and cache_bytes_per_s the rate at which the
    cache (and the copies) were read in it. The step's speedup over MHA is (fixed + MHA's cache part) /
    (fixed + this cache part): Amdahl's law, measured.
    """
    from kvlib import gqa
    from kvlib.kv_cache import KVCache
    from kvlib.roofline import measure_bandwidth

    cuda = torch.device(device).type == "cuda"
    if cuda and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: torch {torch.__version__} sees no CUDA GPU here")
    dtype, batch = (torch.bfloat16, batch or 64) if cuda else (torch.float32, batch or 1)
    if quick:
        kv_lens, rounds = (256, 512), 3
    n_heads = gqa_bench_config().n_heads
    kv_heads = [h for h in (8, 4, 2, 1) if n_heads % h == 0]
    with benchmark.num_threads(threads if not cuda else None), torch.inference_mode():
        if bandwidth is None:
            n_bytes = (32 << 20) if quick else (2 << 30) if cuda else (256 << 20)
            bandwidth = measure_bandwidth(n_bytes=n_bytes, device=device, threads=None, repeats=3 if quick else 7)
        cases = []  # (kv_len, n_kv_heads, method, model, cache, step); kv_len FIXED_KV_LEN: the fixed part
        token = torch.full((batch,), 7, device=device)
        for S in (FIXED_KV_LEN, *kv_lens):
            for h in kv_heads:
                config = gqa_bench_config(h, max_seq_len=S + 8)
                torch.manual_seed(0)  # the same weights at every kv_len, so the fixed part is this model's
                model = Decoder(config).to(device=device, dtype=dtype).eval()
                cache = KVCache(config, batch=batch, max_seq_len=S + 1, dtype=dtype, device=device)
                cache.k.normal_(), cache.v.normal_()
                cache.pos = S  # S cached tokens; the timed step attends to S + 1
                # MHA two ways: kvlib's plain attention (what materialised and grouped are compared with)
                # and torch's fused SDPA (what GQA through SDPA is compared with: fusion alone is no GQA saving)
                for method in (("grouped", "sdpa") if h == n_heads else ("materialised", "grouped", "sdpa")):
                    step = (lambda model=model, cache=cache, attend=gqa.ATTENTION[method]:
                            gqa.decode_step_with(model, token, cache, attend))
                    step()  # the learner's code must run at all, before a graph captures it
                    cases.append((S, h, method, model, cache, benchmark.replayable(step, device)))
        for *_, step in cases:  # warm-up
            step()
        samples = [[] for _ in cases]
        # two blocks of interleaved rounds: the copying path allocates n_heads heads of fresh memory every
        # step, and measured among the others it slowed the steps right after it by up to 1.7x
        for block in ({"grouped", "sdpa"}, {"materialised"}):
            for _ in range(rounds):
                for i, (S, h, method, model, cache, step) in enumerate(cases):
                    if method in block:
                        benchmark.synchronize(device)
                        start = time.perf_counter()
                        step()
                        benchmark.synchronize(device)
                        samples[i].append(time.perf_counter() - start)
        fixed = {(h, method): statistics.median(times)
                 for (S, h, method, *_), times in zip(cases, samples) if S == FIXED_KV_LEN}
        rows = []
        for (S, h, method, model, cache, _), times in zip(cases, samples):
            if S == FIXED_KV_LEN:
                continue
            moved = gqa.decode_bytes(model, S + 1, batch, method)
            median, fixed_s = statistics.median(times), fixed[h, method]
            cache_s = median - fixed_s  # the part of the step that grows with the cache; noise can make it <= 0
            rows.append({
                "kv_len": S, "n_kv_heads": h, "group_size": n_heads // h, "method": _gqa_method(method, h == n_heads),
                "median_s": median, "min_s": min(times), "max_s": max(times),
                "bytes": moved, "predicted_s": moved / bandwidth["bandwidth"], "cache_bytes": cache.nbytes,
                "fixed_s": fixed_s, "cache_s": cache_s,
                # the bytes that grow with kv_len (the cache, and the copies of the materialised path) over that part
                "cache_bytes_per_s": (moved - gqa.decode_bytes(model, 0, batch, method)) / cache_s if cache_s > 0 else None,
            })
        for row in rows:  # ratios against MHA at the same kv_len, attention done the same way
            base = "mha sdpa" if row["method"].endswith("sdpa") else "mha"
            mha = next(r for r in rows if r["kv_len"] == row["kv_len"] and r["method"] == base)
            row["speedup_vs_mha"] = mha["median_s"] / row["median_s"]
            row["speedup_vs_mha_best"] = mha["min_s"] / row["min_s"]  # fastest runs: least disturbed by neighbours
            row["cache_speedup_vs_mha"] = mha["cache_s"] / row["cache_s"] if min(mha["cache_s"], row["cache_s"]) > 0 else None
            row["measured_over_predicted"] = row["median_s"] / row["predicted_s"]
        record = benchmark.environment(device, dtype=str(dtype).removeprefix("torch."), threads_requested=threads,
                                       rounds=rounds, batch=batch, cuda_graph=cuda,
                                       bandwidth_GBps=round(bandwidth["bandwidth"] / 1e9, 2))
    del cases
    import datetime

    config = gqa_bench_config()
    return {"benchmark": "gqa", "date": datetime.date.today().isoformat(), "record": record, "config": {**config.to_dict(), "n_kv_heads": kv_heads},
            "bandwidth": {"bytes_per_s": bandwidth["bandwidth"], "kernel": bandwidth["kernel"]}, "rows": rows,
            "fixed": [{"kv_len": FIXED_KV_LEN, "n_kv_heads": h, "method": _gqa_method(method, h == n_heads), "median_s": t}
                      for (h, method), t in fixed.items()]}


def format_gqa(report: dict) -> str:
    r, c = report["record"], report["config"]
    threads = "CUDA graphs" if r.get("cuda_graph") else f"{r['threads']} thread(s)"
    lines = [f"kvlib bench gqa: {r['device']}, {threads}, torch {r['torch']}, {r.get('dtype', 'float32')}, "
             f"batch {r.get('batch', 1)}, median of {r['rounds']} interleaved rounds",
             f"model: d_model {c['d_model']}, {c['n_layers']} layers, {c['n_heads']} heads of {c['d_model'] // c['n_heads']}, "
             f"random weights; predicted = bytes moved / {report['bandwidth']['bytes_per_s'] / 1e9:.1f} GB/s "
             f"(measured {report['bandwidth']['kernel']} bandwidth)", "",
             f"{'kv_len':>7} {'n_kv_heads':>10} {'method':>13} {'cache MB':>9} {'step ms':>9} {'min-max ms':>14} "
             f"{'predicted':>9} {'meas/pred':>9} {'vs MHA':>7} {'best/best':>9}"]
    for row in report["rows"]:
        lines.append(f"{row['kv_len']:>7} {row['n_kv_heads']:>10} {row['method']:>13} {row['cache_bytes'] / 1e6:>9.1f} "
                     f"{row['median_s'] * 1e3:>9.2f} {row['min_s'] * 1e3:>6.1f}-{row['max_s'] * 1e3:<7.1f} "
                     f"{row['predicted_s'] * 1e3:>9.2f} {row['measured_over_predicted']:>8.2f}x {row['speedup_vs_mha']:>6.2f}x "
                     f"{row['speedup_vs_mha_best']:>8.2f}x")
    lines.append("\nvs MHA = MHA's median step time / this one's (>1: faster), sdpa against mha sdpa, the others against mha; "
                 "best/best = the same for the fastest runs.\nmha: kvlib's attention; materialised: repeat_kv then MHA attention; "
                 "grouped: grouped_attention (Exercise 6.2); sdpa: torch's fused SDPA (enable_gqa for GQA)")
    if "fixed" in report:  # recordings made before the fixed part was measured lack it
        lines += _format_time_split(report)
    return "\n".join(lines)


def _format_time_split(report: dict) -> list[str]:
    """The second table of format_gqa: each step split into its fixed part and its cache part, and the verdict."""
    def ms(x):
        return f"{x * 1e3:.2f}" if x is not None else "-"

    def ratio(x):
        return f"{x:.2f}x" if x is not None else "-"

    n_kv = report["config"]["n_kv_heads"]
    lines = ["", f"Where the time goes: fixed = the same step at {report['fixed'][0]['kv_len']} cached tokens (weights and small "
                 "operations, untouched by GQA); cache = step - fixed",
             f"{'kv_len':>7} {'n_kv_heads':>10} {'method':>13} {'step ms':>9} {'fixed ms':>9} {'cache ms':>9} {'cache GB/s':>10} "
             f"{'cache vs MHA':>12} {'step vs MHA':>11}"]
    for row in report["rows"]:
        rate = f"{row['cache_bytes_per_s'] / 1e9:.1f}" if row["cache_bytes_per_s"] is not None else "-"
        lines.append(f"{row['kv_len']:>7} {row['n_kv_heads']:>10} {row['method']:>13} {ms(row['median_s']):>9} {ms(row['fixed_s']):>9} "
                     f"{ms(row['cache_s'] if row['cache_s'] > 0 else None):>9} {rate:>10} {ratio(row['cache_speedup_vs_mha']):>12} "
                     f"{row['speedup_vs_mha']:>10.2f}x")
    quarter = n_kv[0] // 4 if n_kv[0] // 4 in n_kv else n_kv[-1]
    lens = sorted({row["kv_len"] for row in report["rows"]})
    at = {(row["kv_len"], row["n_kv_heads"], row["method"]): row for row in report["rows"]}
    for kv_len in lens:
        g, mha = at[kv_len, quarter, "grouped"], at[kv_len, n_kv[0], "mha"]
        if g["cache_speedup_vs_mha"] is None:
            lines.append(f"{kv_len} cached tokens: the cache part of a step is lost in the noise of its fixed part here")
            continue
        lines.append(f"{kv_len} cached tokens, n_kv_heads {quarter} (grouped) against MHA: cache part {ms(g['cache_s'])} ms against "
                     f"{ms(mha['cache_s'])} (ratio {g['cache_speedup_vs_mha']:.2f}x, for {n_kv[0] // quarter}x fewer bytes); fixed part "
                     f"{ms(g['fixed_s'])} against {ms(mha['fixed_s'])} ms; the whole step {g['speedup_vs_mha']:.2f}x")
    return lines


# ---------------------------------------------------------------------------------------------
# kvlib bench memory (notebook 05): bandwidth, matmul FLOP/s, and a memory-bound decode step


def _gpu_decode_config() -> ModelConfig:
    """Llama-2-7B's layer shape with 16 of its 32 layers: ~3.4 B weights, 6.7 GB in bf16, far beyond any GPU cache."""
    return ModelConfig(vocab_size=32000, d_model=4096, n_layers=16, n_heads=32, n_kv_heads=32, hidden_dim=11008,
                       max_seq_len=4096)


def _memory_run(device: str, threads: int | None, quick: bool) -> dict:
    """The measurements of notebook 05 on one device: bandwidth, matmul, decode predicted and measured, batches.

    Bandwidth, matmul and the decode step are timed once per round, rounds interleaved, so that a
    busy neighbour slows all three alike; each is the median over rounds, and the decode's
    fraction of the bandwidth is also given as the median of the per-round ratios. On a GPU each
    decode step is timed twice: as kvlib runs it (eager: one kernel launch per operation, from
    Python) and replayed as a CUDA graph (benchmark.replayable), which leaves the GPU no idle gaps;
    and at batch 1 a third time, through torch.compile (mode "reduce-overhead": fused kernels
    replayed as CUDA graphs), recorded as an error instead should the compiler fail.
    """
    from kvlib.roofline import (bandwidth_kernels, memory_bound_config, random_model, roofline_time,
                                step_cost)

    cuda = torch.device(device).type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32  # CPUs without 16-bit units run float32 fastest
    rounds = 3 if quick else 11
    batch_sizes = (1, 4, 16, 64, 256, 1024) if cuda else (1, 4, 16, 64)  # a GPU's ridge is in the hundreds
    if quick:
        config = ModelConfig(vocab_size=512, d_model=256, n_layers=2, n_heads=4, n_kv_heads=4, hidden_dim=512, max_seq_len=64)
        array_bytes, n = 16 << 20, 256
    else:
        config = _gpu_decode_config() if cuda else memory_bound_config()
        array_bytes, n = ((2 << 30), 8192) if cuda else ((256 << 20), 1024)
    kernels = bandwidth_kernels(array_bytes, device)
    a, b = (torch.randn(n, n, device=device).to(dtype) for _ in range(2))
    with torch.device(device):  # build the weights where they will run: no host copy of a multi-GB model
        model = random_model(config, dtype=dtype, device=device)
    ids = {batch: torch.randint(0, config.vocab_size, (batch, 1), device=device) for batch in batch_sizes}
    # the decode step's own kind of kernel, alone: one token's vector times each layer's largest matrix
    downs = [layer.mlp.down_proj.weight for layer in model.layers]
    vec = torch.randn(1, downs[0].shape[1], device=device, dtype=dtype)
    gemv_bytes = sum(w.nbytes for w in downs)
    with benchmark.num_threads(threads), torch.inference_mode():
        jobs = {**{k: fn for k, (fn, _) in kernels.items()}, "matmul": lambda: a @ b,
                "gemv": benchmark.replayable(lambda: [torch.nn.functional.linear(vec, w) for w in downs], device),
                **{f"decode {batch}": (lambda x=x: model(x)) for batch, x in ids.items()}}
        compile_error = None
        if cuda:
            jobs |= {f"graph {batch}": benchmark.replayable(lambda x=x: model(x), device) for batch, x in ids.items()}
            if not quick:  # fused kernels too: torch.compile, its CUDA graphs included ("reduce-overhead"), batch 1
                try:
                    compiled, x1 = torch.compile(model, mode="reduce-overhead"), ids[1]
                    for _ in range(3):  # compile, record the graph, replay
                        compiled(x1)
                    jobs["compiled 1"] = lambda: compiled(x1)
                except Exception as err:  # a compiler that fails here must not cost the rest of the recording
                    compile_error = f"{type(err).__name__}: {str(err)[:300]}"
        samples = {k: [] for k in jobs}
        for fn in jobs.values():  # warm-up: first touches, kernel selection
            fn()
        for _ in range(rounds):
            for k, fn in jobs.items():
                benchmark.synchronize(device)
                start = time.perf_counter()
                fn()
                benchmark.synchronize(device)
                samples[k].append(time.perf_counter() - start)
        record = benchmark.environment(device, dtype=str(dtype).removeprefix("torch."), rounds=rounds)
    gemv_shape, n_matrices = list(downs[0].shape), len(downs)
    del model, jobs, downs
    med = {k: statistics.median(v) for k, v in samples.items()}
    rates = {k: moved / med[k] for k, (_, moved) in kernels.items()}
    bandwidth, flops_per_s = rates["read"], 2 * n**3 / med["matmul"]
    flops, moved = step_cost(config, 1, 1, 1, dtype)
    predicted = roofline_time(flops, moved, flops_per_s, bandwidth)

    def timed(key: str) -> dict:  # one way of running the batch-1 decode step, against the prediction
        per_round = [(moved / t) / (kernels["read"][1] / r) for t, r in zip(samples[key], samples["read"])]
        t = med[key]
        return {"measured_s": t, "spread_s": [min(samples[key]), max(samples[key])], "measured_over_predicted": t / predicted,
                "achieved_bytes_per_s": moved / t, "fraction_of_bandwidth": moved / t / bandwidth,
                "fraction_of_bandwidth_per_round": statistics.median(per_round)}

    batches = []
    for batch in ids:
        f, m = step_cost(config, 1, 1, batch, dtype)
        p = roofline_time(f, m, flops_per_s, bandwidth)
        batches.append({"batch": batch, "intensity": f / m, "predicted_tokens_per_s": batch / p,
                        "measured_tokens_per_s": batch / med[f"decode {batch}"],
                        **({"graph_tokens_per_s": batch / med[f"graph {batch}"]} if cuda else {})})
    return {
        "device": record["device"], "device_type": torch.device(device).type, "dtype": record["dtype"],
        "threads": record["threads"], "rounds": rounds, "record": record,
        "bandwidth": bandwidth, "bandwidth_kernel": "read", "bandwidth_per_kernel": rates, "array_bytes": array_bytes,
        "matmul_flops": flops_per_s, "matmul_n": n, "ridge": flops_per_s / bandwidth,
        "gemv": {"bytes_per_s": gemv_bytes / med["gemv"], "fraction_of_bandwidth": gemv_bytes / med["gemv"] / bandwidth,
                 "matrices": n_matrices, "shape": gemv_shape},
        "decode": {"config": config.to_dict(), "weight_bytes_read": moved, "flops": flops, "predicted_s": predicted,
                   **timed("decode 1"), **({"graph": timed("graph 1")} if cuda else {}),
                   **({"compiled": timed("compiled 1")} if "compiled 1" in med else {"compile_error": compile_error} if compile_error else {})},
        "batches": batches,
    }


def bench_memory(threads: int = 1, quick: bool = False, devices: list[str] | None = None) -> dict:
    """Notebook 05's measurements on the CPU (threads), and on the GPU too when CUDA is available.

    devices: e.g. ["cuda"] for the GPU alone; by default the CPU, then the GPU if there is one.
    The same JSON, saved under assets/recordings/, is what notebook 05 shows as a GPU recording.
    """
    import datetime

    devices = devices or ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for d in devices:
        if torch.device(d).type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {d!r}: torch {torch.__version__} sees no CUDA GPU here")
    runs = [_memory_run(d, threads if torch.device(d).type == "cpu" else None, quick) for d in devices]
    return {"benchmark": "memory", "date": datetime.date.today().isoformat(), "quick": quick,
            "record": benchmark.environment("cpu", threads_requested=threads), "runs": runs}


def format_memory(report: dict) -> str:
    lines = [f"kvlib bench memory ({report['date']}, torch {report['record']['torch']}){' --quick' if report['quick'] else ''}"]
    for r in report["runs"]:
        d = r["decode"]
        lines += ["", f"{r['device']} ({r['device_type']}, {r['threads']} thread(s)), {r['dtype']}, median of {r['rounds']} interleaved rounds",
                  "  bandwidth   " + ", ".join(f"{k} {v / 1e9:.1f}" for k, v in r["bandwidth_per_kernel"].items())
                  + f" GB/s over {r['array_bytes'] >> 20} MB arrays -> read: {r['bandwidth'] / 1e9:.1f} GB/s",
                  f"  matmul      {r['matmul_flops'] / 1e9:.1f} GFLOP/s ({r['matmul_n']}^3); ridge {r['ridge']:.1f} FLOP/B",
                  *([f"  gemv        {r['gemv']['bytes_per_s'] / 1e9:.1f} GB/s = {r['gemv']['fraction_of_bandwidth']:.0%} of the read "
                     f"bandwidth (one vector times {r['gemv']['matrices']} matrices of {r['gemv']['shape'][0]}x{r['gemv']['shape'][1]})"]
                    if "gemv" in r else []),
                  f"  decode step ({d['weight_bytes_read'] / 1e6:.0f} MB of weights): predicted {d['predicted_s'] * 1e3:.2f} ms, "
                  f"measured {d['measured_s'] * 1e3:.2f} ms (measured/predicted {d['measured_over_predicted']:.2f}); "
                  f"{d['achieved_bytes_per_s'] / 1e9:.1f} GB/s = {d['fraction_of_bandwidth']:.0%} of the bandwidth "
                  f"({d['fraction_of_bandwidth_per_round']:.0%} as the median of {r['rounds']} interleaved rounds)",
                  *([f"  as a CUDA graph: {d['graph']['measured_s'] * 1e3:.2f} ms (measured/predicted "
                     f"{d['graph']['measured_over_predicted']:.2f}); {d['graph']['achieved_bytes_per_s'] / 1e9:.1f} GB/s = "
                     f"{d['graph']['fraction_of_bandwidth']:.0%} of the bandwidth"] if "graph" in d else []),
                  *([f"  torch.compile (fused kernels, CUDA graphs): {d['compiled']['measured_s'] * 1e3:.2f} ms (measured/predicted "
                     f"{d['compiled']['measured_over_predicted']:.2f}); {d['compiled']['achieved_bytes_per_s'] / 1e9:.1f} GB/s = "
                     f"{d['compiled']['fraction_of_bandwidth']:.0%} of the bandwidth"] if "compiled" in d else []),
                  *([f"  torch.compile failed: {d['compile_error']}"] if "compile_error" in d else []),
                  f"  {'batch':>7} {'FLOP/B':>8} {'predicted tok/s':>16} {'measured tok/s':>15}"
                  + (f" {'CUDA graph tok/s':>17}" if "graph" in d else "")]
        for b in r["batches"]:
            lines.append(f"  {b['batch']:>7} {b['intensity']:>8.1f} {b['predicted_tokens_per_s']:>16.1f} {b['measured_tokens_per_s']:>15.1f}"
                         + (f" {b['graph_tokens_per_s']:>17.1f}" if "graph_tokens_per_s" in b else ""))
    return "\n".join(lines)
