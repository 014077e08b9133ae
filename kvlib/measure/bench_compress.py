"""`kvlib bench compress` (notebook 08): the smaller caches, in bytes and in time.

The bytes per token of every scheme of the course for the tiny model and published configurations, where each cache outweighs its weights, the
cache part of a decode step in int8 against float32 (predicted from bytes, then measured) and MLA's
two ways of attending counted in FLOPs and bytes. Quality is kvlib.study.compress_quality's.
"""

from __future__ import annotations

import datetime
import math
import statistics
import time
from dataclasses import replace
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from kvlib.core import progress
from kvlib.core.configs import MLA_MODELS, REAL_MODELS, gqa_bench_config
from kvlib.core.flops import matmul_flops
from kvlib.core.model import ModelConfig, num_params
from kvlib.core.weights import load_tiny
from kvlib.measure.machine import measure_bandwidth
from kvlib.measure.timing import environment, num_threads
from kvlib.study import compress_quality
from kvlib.variants.compressed import GROUP, Int8KVCache

# ---------------------------------------------------------------------------------------------
# Bytes per token per layer, every scheme of the course


def bytes_per_token_layer(
    scheme: str,
    config: ModelConfig | None = None,
    mla=None,
    bytes_per_number: int = 2,
    n_kv_heads: int | None = None,
    group: int = GROUP,
) -> float:
    """Cache bytes one token adds to one layer.

    scheme: "mha" (every head keeps a key and a value), "gqa" (n_kv_heads of them, config's unless given),
    "int8" (gqa's heads in 8 bits, plus a key scale per channel per `group` tokens and a value scale per
    token, scales of bytes_per_number each), "mla" (mla.kv_rank + mla.rope_dim numbers, all heads together).
    A window caches the same per token, but only its last tokens: see cache_bytes.
    Example: Llama-3-8B, "gqa", 2 bytes: 2 * 8 * 128 * 2 = 4096 (x 32 layers = 128 KiB per token)
    """
    if scheme == "mla":
        if mla is None:
            raise ValueError('scheme "mla" needs mla= an MLAModel (kvlib.core.configs.MLA_MODELS)')
        return (mla.kv_rank + mla.rope_dim) * bytes_per_number
    if config is None:
        raise ValueError(f"scheme {scheme!r} needs config= a ModelConfig")
    heads = config.n_heads if scheme == "mha" else n_kv_heads or config.n_kv_heads
    D = config.head_dim
    if scheme in ("mha", "gqa"):
        return 2 * heads * D * bytes_per_number  # a key and a value per head
    if scheme == "int8":  # the learner's prediction (Exercise 8.7), per layer
        from kvlib.compress import int8_bytes_per_token  # noqa: PLC0415 (late binding: runs the learner's code)

        one_layer = replace(config, n_layers=1, n_kv_heads=heads)
        return int8_bytes_per_token(one_layer, group=group, scale_bytes=bytes_per_number)
    raise ValueError(f"unknown scheme {scheme!r}: mha, gqa, int8 or mla")


def cache_bytes(per_token_layer: float, n_layers: int, context: int, window: int | None = None) -> float:
    """Bytes of one sequence's cache after `context` tokens: all of them, or a window's (sinks included) last ones."""
    return per_token_layer * n_layers * (context if window is None else min(context, window))


def outweighs_at(per_token_layer: float, n_layers: int, weight_bytes: float, window: int | None = None) -> int | None:
    """Tokens of context at which one sequence's cache outweighs the weights; None if it never does (a window too small)."""
    per_token = per_token_layer * n_layers
    tokens = math.ceil(weight_bytes / per_token)
    return None if window is not None and tokens > window else tokens


def bytes_table(window: int = 4096, context: int = 32768) -> list[dict]:
    """One row per (model, scheme): bytes per token per layer and per token, the cache at `context` tokens, the
    context at which one sequence's cache outweighs the weights, and the model's own context ("context": its trained
    one, or its config's; None where unknown), with past_context True where that crossing lies beyond it. 16-bit
    numbers (scales too) unless stated; the tiny model in float32, as it runs here. Mistral-7B caches its sliding
    window of 4,096 as shipped (arXiv 2310.06825); the other models' window rows ask what a window of `window`
    tokens would do for them."""
    rows = []

    def add(model, scheme, label, per_layer, n_layers, weights, model_context, note="", cached=None):
        at = outweighs_at(per_layer, n_layers, weights, cached)
        rows.append(
            {
                "model": model,
                "scheme": label,
                "bytes_per_token_layer": per_layer,
                "bytes_per_token": per_layer * n_layers,
                "cache_bytes_at_context": cache_bytes(per_layer, n_layers, context, cached),
                "at_context": context,
                "outweighs_weights_at": at,
                "context": model_context,
                "past_context": at is not None and model_context is not None and at > model_context,
                "weight_bytes": weights,
                "note": note,
            }
        )

    tiny = load_tiny()[0].config
    tiny_weights = num_params(tiny) * 4
    for label, scheme, h in (
        ("MHA float32", "mha", None),
        ("GQA-2 float32 (notebook 06)", "gqa", 2),
        ("MQA float32", "gqa", 1),
        ("MHA int8 (8.1, 8.2)", "int8", None),
    ):
        per_layer = bytes_per_token_layer(scheme, tiny, bytes_per_number=4, n_kv_heads=h)
        add("tiny", scheme, label, per_layer, tiny.n_layers, tiny_weights, tiny.max_seq_len)
    mha = bytes_per_token_layer("mha", tiny, bytes_per_number=4)
    add(
        "tiny",
        "window",
        "MHA, 4 sinks + window 28",
        mha,
        tiny.n_layers,
        tiny_weights,
        tiny.max_seq_len,
        cached=32,
    )
    for name in ("Llama-2-7B", "Llama-3-8B", "Mistral-7B"):
        m = REAL_MODELS[name]
        c, w, shipped = m.config, m.weight_bytes(2), m.sliding_window
        base = "mha" if m.attention == "MHA" else "gqa"
        own = f", window {shipped:,} (as shipped)" if shipped else ""
        add(name, base, f"{m.attention} 16-bit{own}", bytes_per_token_layer(base, c), c.n_layers, w, m.context,
            m.source, cached=shipped)  # fmt: skip
        add(name, "int8", f"{m.attention} int8, KIVI axes{own}", bytes_per_token_layer("int8", c), c.n_layers, w,
            m.context, "16-bit scales, groups of 32", cached=shipped)  # fmt: skip
        if not shipped:
            add(name, "window", f"{m.attention} 16-bit, window {window:,}", bytes_per_token_layer(base, c), c.n_layers,
                w, m.context, "as if it had Mistral-7B's window", cached=window)  # fmt: skip
    for name, m in MLA_MODELS.items():
        # the paper's comparison (arXiv 2405.04434, Table 1): MHA keeps 2 n_h d_h numbers per token and layer, GQA 2 n_g d_h
        heads = ModelConfig(
            vocab_size=1, d_model=m.n_heads * m.nope_dim, n_layers=m.n_layers, n_heads=m.n_heads, n_kv_heads=m.n_heads
        )
        w = m.weight_bytes(2)
        add(name, "mha", f"as MHA, {m.n_heads} heads of {m.nope_dim} (not shipped)",
            bytes_per_token_layer("mha", heads), m.n_layers, w, m.context, "the paper's Table 1 comparison")  # fmt: skip
        add(name, "gqa", "as GQA-8 (not shipped)", bytes_per_token_layer("gqa", heads, n_kv_heads=8), m.n_layers, w,
            m.context)  # fmt: skip
        add(name, "mla", f"MLA, latent {m.kv_rank} + rotary {m.rope_dim}", bytes_per_token_layer("mla", mla=m),
            m.n_layers, w, m.context, m.source)  # fmt: skip
    return rows


def format_bytes_row(r: dict) -> str:
    """One row of bytes_table as the notebook and `kvlib bench compress` print it; a crossing past the model's own
    context is flagged, since no sequence of that model ever reaches it."""
    at = "never" if r["outweighs_weights_at"] is None else f"{r['outweighs_weights_at']:,}"
    if r["past_context"]:
        at += f" (past its {r['context']:,}-token context)"
    return (
        f"{r['model']:<12} {r['scheme']:<44} {r['bytes_per_token_layer']:>8,.0f} {_size(r['bytes_per_token']):>10} "
        f"{_size(r['cache_bytes_at_context']):>10}   {at}"
    )


BYTES_HEADER = (
    f"{'model':<12} {'scheme':<44} {'B/layer':>8} {'per token':>10} {'at 32k':>10}   outweighs the weights at"
)


# ---------------------------------------------------------------------------------------------
# MLA: the two ways of a decode step, counted


def mla_step_cost(m, kv_len: int, path: str, bytes_per_number: int = 2, new_tokens: int = 1) -> dict:
    """Matmul FLOPs and bytes moved by one layer's attention for new_tokens queries (batch 1) over kv_len latents,
    on path "reconstruct" (8.5) or "absorbed" (8.6). FLOPs: the learner's count (Exercise 8.8, checked against torch's
    counter by mla_counted_flops). Bytes: both read the latent cache and w_uk, w_uv; reconstructing also writes every
    head's keys and values and reads them back. new_tokens = 1 is a decode step; new_tokens = kv_len a prefill.
    """
    from kvlib.compress import mla_flops  # noqa: PLC0415 (late binding: the learner's count, Exercise 8.8)

    if path not in ("reconstruct", "absorbed"):
        raise ValueError(f"path must be 'reconstruct' or 'absorbed', got {path!r}")
    H, Dn, Dr, Dv, r, S, b = m.n_heads, m.nope_dim, m.rope_dim, m.v_dim, m.kv_rank, kv_len, bytes_per_number
    cache, weights = S * (r + Dr) * b, H * (Dn + Dv) * r * b
    sizes = {"n_heads": H, "nope_dim": Dn, "rope_dim": Dr, "v_dim": Dv, "kv_rank": r}
    flops = mla_flops(path, kv_len, new_tokens, **sizes)
    # rebuilt keys and values are written, then read; absorbed, only the cache and the weights move
    moved = cache + weights + (2 * S * H * (Dn + Dv) * b if path == "reconstruct" else 0)
    return {
        "path": path,
        "kv_len": S,
        "new_tokens": new_tokens,
        "flops": flops,
        "bytes": moved,
        "flops_per_byte": flops / moved,
    }


def mla_counted_flops(kv_len: int = 64, seed: int = 0, new_tokens: int = 1) -> dict:
    """torch.utils.flop_counter's count of the learner's 8.5 and 8.6 on a small MLA (batch 1, new_tokens queries),
    beside the learner's prediction for the same sizes (8.8, through mla_step_cost): the count is checked, not assumed."""
    from kvlib.compress import mla_absorbed, mla_reconstruct  # noqa: PLC0415 (late binding: runs the learner's code)

    g = torch.Generator().manual_seed(seed)
    m = SimpleNamespace(n_heads=4, nope_dim=16, rope_dim=8, v_dim=12, kv_rank=32)
    T = new_tokens
    args = (
        torch.randn(1, 4, T, 16, generator=g),
        torch.randn(1, 4, T, 8, generator=g),
        torch.randn(1, kv_len, 32, generator=g),
        torch.randn(1, kv_len, 8, generator=g),
        torch.randn(4, 16, 32, generator=g),
        torch.randn(4, 12, 32, generator=g),
    )
    return {
        path: {"formula": mla_step_cost(m, kv_len, path, new_tokens=T)["flops"], "counted": matmul_flops(fn, *args)}
        for path, fn in (("reconstruct", mla_reconstruct), ("absorbed", mla_absorbed))
    }


# ---------------------------------------------------------------------------------------------
# The ordering quiz: every scheme's cache for one model shape


def schemes_per_layer(config: ModelConfig, mla, context: int = 65536, window: int = 4096) -> dict[str, float]:
    """Bytes per token per layer of every scheme for config's shape at `context` tokens (16-bit); the window
    row averaged over the context (it keeps min(window, context) tokens), MLA with mla's sizes."""
    gqa = bytes_per_token_layer("gqa", config)
    return {
        "MHA": bytes_per_token_layer("mha", config),
        f"GQA-{config.n_kv_heads} (notebook 06)": gqa,
        f"int8 GQA-{config.n_kv_heads} (8.2)": bytes_per_token_layer("int8", config),
        f"GQA-{config.n_kv_heads}, window {window // 1024}k": gqa * min(window, context) / context,
        "MQA": bytes_per_token_layer("gqa", config, n_kv_heads=1),
        f"MLA {mla.kv_rank} + {mla.rope_dim} (8.5, 8.6)": bytes_per_token_layer("mla", mla=mla),
    }


# ---------------------------------------------------------------------------------------------
# Speed: the cache part of a decode step, float32 against int8, predicted from bytes and measured


def _speed_cases(kv_len: int, config: ModelConfig, seed: int = 0):
    """q, a float32 cache (n_layers, 1, H_kv, S, D) x 2, and the same numbers in an Int8KVCache."""
    from kvlib.compress import dequantize, int8_attention  # noqa: PLC0415 (late binding: runs the learner's code)

    g = torch.Generator().manual_seed(seed)
    L, H_kv, D = config.n_layers, config.n_kv_heads, config.head_dim
    k, v = torch.randn(L, 1, H_kv, kv_len, D, generator=g), torch.randn(L, 1, H_kv, kv_len, D, generator=g)
    q = torch.randn(1, config.n_heads, 1, D, generator=g)
    cache = Int8KVCache(config, max_seq_len=kv_len)
    for layer in range(L):
        cache.update(layer, k[layer], v[layer])
    views = [cache.layer_view(layer, kv_len) for layer in range(L)]
    gqa = config.n_heads != H_kv

    def float32():
        return [F.scaled_dot_product_attention(q, k[layer], v[layer], enable_gqa=gqa) for layer in range(L)]

    def int8():
        return [int8_attention(q, *views[layer], kv_len) for layer in range(L)]

    def int8_parts():  # int8()'s path timed in its two parts; each layer's float32 copy freed before the next, as there
        dequantising = attending = 0.0
        for kv_, ks, vv, vs in views:
            start = time.perf_counter()
            k_f = dequantize(kv_, ks).view(1, H_kv, -1, D)[:, :, :kv_len]  # groups -> tokens, as 8.2 does
            v_f = dequantize(vv, vs)
            mid = time.perf_counter()
            F.scaled_dot_product_attention(q, k_f, v_f, enable_gqa=gqa)
            dequantising, attending = dequantising + mid - start, attending + time.perf_counter() - mid
            del k_f, v_f
        return dequantising, attending

    k_buffer, v_buffer = (
        torch.empty(views[0][0].shape),
        torch.empty(views[0][2].shape),
    )  # one layer's float32 copy, reused

    def int8_reused():  # the same dequantise-then-attend, into buffers written again each layer: no fresh memory
        outs = []
        for kv_, ks, vv, vs in views:
            k_f = k_buffer.copy_(kv_).mul_(ks).view(1, H_kv, -1, D)[:, :, :kv_len]
            outs.append(F.scaled_dot_product_attention(q, k_f, v_buffer.copy_(vv).mul_(vs), enable_gqa=gqa))
        return outs

    float_bytes = k.nbytes + v.nbytes
    int8_bytes = sum(t.nbytes for view in views for t in view)
    return (
        {"float32": float32, "int8": int8, "int8_parts": int8_parts, "int8_reused": int8_reused},
        float_bytes,
        int8_bytes,
    )


def speed(
    kv_lens=(8192, 16384), rounds: int = 15, threads: int = 1, bandwidth: float | None = None, quick: bool = False
) -> dict:
    """The cache part of one decode step (every layer's attention over kv_len cached tokens, batch 1) in float32
    and in int8 (8.2: dequantise, then attend), timed in interleaved rounds on the CPU, beside bytes / bandwidth.

    predicted: each way's cache bytes / the measured read bandwidth. as_run: what the int8 path really moves
    here, int8 cache + scales read, the float32 copy written and read back by attention. dequantise_s,
    attend_s, dequantise_share: one run of the int8 path (int8_parts_s) timed in its two parts, layer by layer,
    so the dequantising is a share of that run's time by construction; int8_reused_s: the same path
    writing its float32 copy into one reused buffer, so fresh memory (page faults) is not part of the cost.
    """
    config = gqa_bench_config(8, max_seq_len=max(kv_lens) + 8)
    if quick:
        kv_lens, rounds = (512, 1024), 3
    with num_threads(threads), torch.inference_mode():
        if bandwidth is None:
            bandwidth = measure_bandwidth(
                n_bytes=(32 << 20) if quick else (256 << 20), threads=None, repeats=3 if quick else 7
            )["bandwidth"]
        rows = []
        with progress.bar(desc="int8 against float32", total=len(kv_lens) * rounds, unit="round") as timed:
            for S in kv_lens:
                fns, float_bytes, int8_bytes = _speed_cases(S, config)
                for fn in fns.values():
                    fn()  # warm-up
                samples, parts = {name: [] for name in fns}, []
                for _ in range(rounds):
                    for name, fn in fns.items():
                        start = time.perf_counter()
                        out = fn()
                        samples[name].append(time.perf_counter() - start)
                        if name == "int8_parts":
                            parts.append(out)  # (dequantising, attending) seconds of this one run
                    timed.update()
                ratio = [
                    f / i for f, i in zip(samples["float32"], samples["int8"])
                ]  # per round: >1 means int8 is faster
                reused = [f / i for f, i in zip(samples["float32"], samples["int8_reused"])]
                as_run = int8_bytes + 2 * float_bytes  # int8 read, float32 copy written, then read by attention
                rows.append(
                    {
                        "kv_len": S,
                        "float32_bytes": float_bytes,
                        "int8_bytes": int8_bytes,
                        "int8_as_run_bytes": as_run,
                        "predicted_float32_s": float_bytes / bandwidth,
                        "predicted_int8_s": int8_bytes / bandwidth,
                        "predicted_int8_as_run_s": as_run / bandwidth,
                        "predicted_speedup": float_bytes / int8_bytes,
                        **{f"{name}_s": statistics.median(t) for name, t in samples.items()},
                        **{f"{name}_spread_s": [min(t), max(t)] for name, t in samples.items()},
                        "measured_speedup": statistics.median(ratio),
                        "measured_speedup_spread": [min(ratio), max(ratio)],
                        "speedup_rounds": ratio,  # each round's float32 time / int8 time, for a claim's spread
                        "measured_speedup_reused": statistics.median(reused),
                        "reused_rounds": reused,  # each round's float32 time / int8-into-a-reused-buffer time
                        # each round's int8 time (a fresh copy) / the same path into a reused buffer: > 1, the fresh
                        # memory costs that much
                        "fresh_over_reused_rounds": [a / b for a, b in zip(samples["int8"], samples["int8_reused"])],
                        # the split of one run into its parts, so "of which dequantising" can never exceed the run
                        "dequantise_s": statistics.median(d for d, _ in parts),
                        "attend_s": statistics.median(a for _, a in parts),
                        "dequantise_share": statistics.median(d / (d + a) for d, a in parts),
                    }
                )
        record = environment(
            "cpu",
            dtype="float32 vs int8",
            threads_requested=threads,
            rounds=rounds,
            bandwidth_GBps=round(bandwidth / 1e9, 2),
        )
    return {"config": config.to_dict(), "record": record, "bandwidth_bytes_per_s": bandwidth, "rows": rows}


# ---------------------------------------------------------------------------------------------
# kvlib bench compress


def bench_compress(threads: int = 1, quick: bool = False, device: str = "cpu") -> dict:
    """Bytes of every scheme, the tiny model's quality with each cache, int8 against float32 timed, MLA's two paths counted."""
    if torch.device(device).type != "cpu":
        raise ValueError("kvlib bench compress runs on the CPU only: its speed question is one CPU thread's")
    model, tokenizer = load_tiny()
    model.eval()
    with num_threads(threads), progress.bar(desc="kvlib bench compress", total=5, unit="part") as parts:
        parts.set_postfix_str("int8 agreement")
        agreement = compress_quality.int8_agreement(model, tokenizer, stride=480 if quick else 48)
        parts.update()
        parts.set_postfix_str("loss by position in a window")
        window = compress_quality.window_study(
            model, tokenizer, n_rows=2 if quick else 32, seq_len=64 if quick else 256
        )
        parts.update()
        parts.set_postfix_str("which axis shares a key scale")
        key_axis = compress_quality.key_axis_study(
            model, tokenizer, n_rows=1 if quick else 8, seq_len=64 if quick else 256
        )
        parts.update()
        parts.set_postfix_str("answers through a window")
        window_right = compress_quality.window_accuracy(
            model, tokenizer, capacities=(16, 8) if quick else (32, 16, 8), stride=240 if quick else 96
        )
        parts.update()
        parts.set_postfix_str("int8 against float32, timed")
        timed = speed(threads=threads, quick=quick)
        parts.update()
    window.pop("per_position")
    mla = {
        name: [mla_step_cost(m, S, path) for S in (8192, 16384) for path in ("reconstruct", "absorbed")]
        for name, m in MLA_MODELS.items()
    }
    return {
        "benchmark": "compress",
        "date": datetime.date.today().isoformat(),
        "bytes": bytes_table(),
        "int8_agreement": agreement,
        "window": window,
        "key_axis": key_axis,
        "window_accuracy": window_right,
        "speed": timed,
        "mla": mla,
        "mla_counted": mla_counted_flops(),
        "mla_prefill": {
            name: [mla_step_cost(m, S, path, new_tokens=S) for S in (8192,) for path in ("reconstruct", "absorbed")]
            for name, m in MLA_MODELS.items()
        },
        "quick": quick,
    }


def _size(n: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def format_compress(report: dict) -> str:
    lines = [
        "kvlib bench compress" + (" --quick (a smoke test: too small to trust)" if report.get("quick") else ""),
        "",
        "Cache bytes per token (one sequence); outweighs = context at which the cache is heavier than the 16-bit "
        "weights (tiny: float32)",
        BYTES_HEADER,
    ]
    lines += [format_bytes_row(r) for r in report["bytes"]]
    a = report["int8_agreement"]
    lines += [
        "",
        f"int8 cache on the tiny model: greedy-token agreement with float32 {a['agreement']:.2%} over {a['prompts']} "
        f"held-out prompts x {a['new_tokens']} tokens (goal {a['goal']:.0%}: {'met' if a['agreement'] >= a['goal'] else 'MISSED'}); "
        f"capital answers float32 {a['answer_float32']:.1%}, int8 {a['answer_int8']:.1%}",
    ]
    w = report["window"]
    lines += [
        "",
        f"Loss (nats/token) by position, {w['rows']} held-out rows of {w['seq_len']} tokens, cache of {w['capacity']} tokens:",
        f"{'cache':<28} " + " ".join(f"{b:>8}" for b in w["bands"]) + f" {'past window':>12}",
    ]
    for name, losses in w["loss"].items():
        lines.append(f"{name:<28} " + " ".join(f"{x:>8.3f}" for x in losses) + f" {w['mean_past_window'][name]:>12.3f}")
    k = report["key_axis"]
    lines += [
        "",
        f"Keys rounded with KIVI's rule (groups of {k['group']} tokens per channel), {k['rows']} held-out rows "
        f"of {k['seq_len']} tokens, every layer:",
    ]
    for i, b in enumerate(k["bits"]):
        ch, tok = k["output_error"]["per channel"][i], k["output_error"]["per token"][i]
        lines.append(
            f"  {b} bits: attention output error per channel {ch:7.2%}, per token {tok:7.2%} "
            f"(key error {k['key_error']['per channel'][i]:.2%} vs {k['key_error']['per token'][i]:.2%})"
        )
    w8 = report["window_accuracy"]
    lines += [
        "",
        f"Capital answers through a rolling cache, {w8['prompts']} held-out questions of "
        f"{w8['prompt_tokens']['min']}-{w8['prompt_tokens']['max']} tokens (median {w8['prompt_tokens']['median']}):",
    ]
    lines += [f"  {name:<24} {right:6.1%}" for name, right in w8["accuracy"].items()]
    lines += ["", "MLA prefill (one layer, 8,192 tokens at once): FLOPs"]
    for name, rows in report.get("mla_prefill", {}).items():
        lines += [f"{name:<12} {r['path']:<12} {r['flops'] / 1e12:>8.2f} TFLOP" for r in rows]
    s = report["speed"]
    lines += [
        "",
        f"Cache part of a decode step ({s['config']['n_layers']} layers, {s['config']['n_kv_heads']} KV heads of "
        f"{s['config']['d_model'] // s['config']['n_heads']}), {s['record']['threads']} thread(s), "
        f"bandwidth {s['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s, median of {s['record']['rounds']} rounds:",
        f"{'kv_len':>7} {'float32 ms':>11} {'pred':>7} {'int8 ms':>9} {'pred':>7} {'as run':>7} {'dequant ms':>11} "
        f"{'reused buf':>11} {'speedup':>8} {'reused':>7} {'predicted':>9}",
    ]
    for r in s["rows"]:
        lines.append(
            f"{r['kv_len']:>7} {r['float32_s'] * 1e3:>11.2f} {r['predicted_float32_s'] * 1e3:>7.2f} {r['int8_s'] * 1e3:>9.2f} "
            f"{r['predicted_int8_s'] * 1e3:>7.2f} {r['predicted_int8_as_run_s'] * 1e3:>7.2f} {r['dequantise_s'] * 1e3:>11.2f} "
            f"{r['int8_reused_s'] * 1e3:>11.2f} {r['measured_speedup']:>7.2f}x {r['measured_speedup_reused']:>6.2f}x "
            f"{r['predicted_speedup']:>8.2f}x"
        )
    slow = [r for r in s["rows"] if r["measured_speedup"] < 1]
    if slow:
        r = slow[-1]
        lines.append(
            f"int8 is SLOWER here ({r['measured_speedup']:.2f}x at {r['kv_len']:,} tokens): dequantising takes "
            f"{r['dequantise_share']:.0%} of its time (the path timed in parts). It reads 1 byte per number but writes a float32 copy "
            "(4 bytes) that attention reads again: without a kernel that reads int8 directly, the saving is eaten. "
            f"Into a reused buffer (no fresh memory to fault in) int8 runs at {r['measured_speedup_reused']:.2f}x float32."
        )
    lines += ["", "MLA, one layer, one new token, 16-bit: FLOPs and bytes per step"]
    for name, rows in report["mla"].items():
        for r in rows:
            lines.append(
                f"{name:<12} {r['path']:<12} kv_len {r['kv_len']:>6,} {r['flops'] / 1e9:>9.2f} GFLOP {_size(r['bytes']):>10} "
                f"{r['flops_per_byte']:>8.1f} FLOP/byte"
            )
    c = report["mla_counted"]
    lines.append(
        "formula vs torch's flop counter (small MLA): "
        + ", ".join(f"{p} {v['formula']:,} vs {v['counted']:,}" for p, v in c.items())
    )
    return "\n".join(lines)
