"""`kvlib bench cache` (notebook 04): tokens per second without a cache, with kvlib's KVCache, and with
transformers' generate(use_cache=True) on identical weights; the tiny model and a GPT-2-small-size
Llama with random weights. Naive decoding of the large model is too slow to run in full (minutes),
so its total is the sum of per-step times measured at a few lengths and interpolated in between;
the table says so. Runs the learner's generate (2.2) and generate_cached (4.5).
"""
from __future__ import annotations

import statistics
import time

import numpy as np
import torch

from kvlib.core.configs import gpt2_size_config, quick_cache_config
from kvlib.core.model import Decoder
from kvlib.measure import timing

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
        step.append(timing.measure(lambda: model(ids), warmup=1, repeats=repeats, threads=None).median)
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
    from kvlib.core.weights import load_tiny, to_transformers

    results = []
    with timing.num_threads(threads), torch.inference_mode():
        tiny, _ = load_tiny()
        big_config = gpt2_size_config() if not quick else quick_cache_config()
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
        record = timing.environment("cpu", dtype="float32", threads_requested=threads)
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
