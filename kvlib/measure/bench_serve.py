"""`kvlib bench serve` (notebook 07): many requests at equal KV memory, served three ways.

The trace: n requests (seed 0) on the tiny model. Each prompt joins k question prompts of the
tiny model's corpus, k uniform in {1, 2, 3} (about 10 to 150 tokens); each request then generates
max_new_tokens greedy tokens, drawn log-uniformly from 4 to 256 (many short answers, a few long
ones, as chat traffic has). Every request arrives at time 0, so TTFT includes the wait in line.
Measured on one KV budget (n_blocks * block_size token slots):
  - static batching, contiguous reservation: each request reserves max_seq_len slots (notebook
    04's KVCache), so budget // max_seq_len requests form a batch, which runs until its longest
    member is done; a finished member keeps its row and its compute meanwhile, as a padded batch
    does (Orca, Yu et al., OSDI 2022, section 2), and what it computes then is thrown away;
  - continuous batching, paged (your Scheduler): admitted whenever blocks are free;
  - the same with a shared system prompt, prefix sharing off and on.
Utilisation is time-averaged over steps: slots holding a token / slots reserved. Also the batched
decode step's time against batch size. Everything runs the learner's kvlib/serving.py.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from kvlib.core.model import matrix_params
from kvlib.core.weights import load_tiny
from kvlib.measure import timing
from kvlib.measure.machine import measure_bandwidth, measure_matmul_flops
from kvlib.study.corpus import eval_prompts

SYSTEM_PROMPT = (
    "You are a helpful geography tutor. Answer with the capital, then stop.\n"  # 72 characters, one token each
)


def make_trace(tokenizer, n: int = 64, seed: int = 0, system_prompt: str = "", max_new: tuple[int, int] = (4, 256)):
    """[(prompt ids, max_new_tokens)] of n requests drawn as the module docstring says."""
    rng = np.random.default_rng(seed)
    questions = [p.prompt for p in eval_prompts("train", stride=7)]
    trace = []
    for _ in range(n):
        k = int(rng.integers(1, 4))
        text = system_prompt + "\n".join(questions[int(i)] for i in rng.integers(0, len(questions), size=k))
        new = int(round(float(np.exp(rng.uniform(np.log(max_new[0]), np.log(max_new[1]))))))
        trace.append((tokenizer.encode(text), new))
    return trace


def _requests(trace):
    from kvlib.serving import Request  # noqa: PLC0415 (late binding: runs the learner's code)

    return [Request(i, list(p), n) for i, (p, n) in enumerate(trace)]


def percentile(values, q):
    return float(np.percentile(np.asarray(values, dtype=float), q))


def _summary(requests, start, seconds, steps, held, reserved, extra=None):
    ttft = [r.times["first_token"] - start for r in requests]
    generated = sum(len(r.out) for r in requests)
    return {
        "requests": len(requests),
        "generated_tokens": generated,
        "seconds": seconds,
        "tokens_per_s": generated / seconds,
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p99_s": percentile(ttft, 99),
        "steps": steps,
        "kv_utilisation": held / reserved if reserved else float("nan"),
        **(extra or {}),
    }


def serve_continuous(model, trace, n_blocks, block_size=16, max_batch=64, share_prefixes=False, on_step=None):
    """Your Scheduler over the whole trace; returns the summary, with blocks held per step."""
    from kvlib.serving import BlockPool, Scheduler  # noqa: PLC0415 (late binding: runs the learner's code)

    pool = BlockPool(model.config, n_blocks, block_size)
    sched = Scheduler(model, pool, max_batch=max_batch, share_prefixes=share_prefixes)
    for r in _requests(trace):
        sched.add(r)
    counts = {"steps": 0, "held": 0, "reserved": 0, "blocks": [], "running": 0}

    def observe(s):
        counts["steps"] += 1
        in_use = pool.n_blocks - pool.n_free
        counts["held"] += sum(r.table.length for r in s.running)
        counts["reserved"] += in_use * block_size
        counts["blocks"].append(in_use)
        counts["running"] += len(s.running)
        if on_step is not None:
            on_step(s)

    start = time.perf_counter()
    sched.run(on_step=observe)
    seconds = time.perf_counter() - start
    return _summary(
        sched.finished,
        start,
        seconds,
        counts["steps"],
        counts["held"],
        counts["reserved"],
        {
            "mean_blocks_held": statistics.fmean(counts["blocks"]),
            "peak_blocks_held": max(counts["blocks"]),
            "blocks_per_running_request": sum(counts["blocks"]) / max(counts["running"], 1),
            "mean_running": counts["running"] / max(counts["steps"], 1),
            **sched.stats,
        },
    )


def serve_static(model, trace, n_blocks, block_size=16, reserve=None):
    """Static batching with contiguous reservation: batches of budget // reserve requests, each run to its longest member."""
    from kvlib.serving import BlockPool, Scheduler  # noqa: PLC0415 (late binding: runs the learner's code)

    reserve = reserve or model.config.max_seq_len
    batch = n_blocks * block_size // reserve
    if batch < 1:
        raise ValueError(f"a budget of {n_blocks * block_size} slots holds no contiguous reservation of {reserve}")
    pool = BlockPool(model.config, n_blocks, block_size)
    sched = Scheduler(model, pool, max_batch=batch)  # the engine's paging is only its storage here
    for r in _requests(trace):
        sched.add(r)
    steps = held = reserved = 0
    start = time.perf_counter()
    while sched.waiting:
        members = [sched.waiting.popleft() for _ in range(min(batch, len(sched.waiting)))]
        for r in members:
            sched.admit(r)
        while not all(r.done for r in members):  # every row computes until the longest is done, as in a padded batch
            sched.decode()
            steps += 1
            held += sum(
                min(r.table.length, len(r.prompt) + r.max_new_tokens - 1) for r in members
            )  # tokens it will keep
            reserved += len(members) * reserve  # the batch's reservations stand until its last member is done
        for r in members:
            del r.out[r.max_new_tokens :]  # what a finished row computed while it waited is thrown away
        sched.retire()
    seconds = time.perf_counter() - start
    return _summary(sched.finished, start, seconds, steps, held, reserved, {"batch": batch, "reserve": reserve})


def decode_step_times(
    model,
    batches=(1, 2, 4, 8, 16, 32, 64),
    context=64,
    block_size=16,
    repeats=5,
    bandwidth: float | None = None,
    peak_flops: float | None = None,
):
    """Seconds of one batched decode step with `batch` requests of `context` cached tokens each, beside
    the roofline's time when bandwidth (bytes/s) and peak_flops (FLOP/s) are given."""
    from kvlib.serving import BlockPool, Request, Scheduler  # noqa: PLC0415 (late binding: runs the learner's code)

    rows = []
    for b in batches:
        pool = BlockPool(model.config, b * (-(-(context + repeats + 8) // block_size)), block_size)
        sched = Scheduler(model, pool, max_batch=b)
        for i in range(b):
            sched.add(Request(i, [(7 * i + j) % model.config.vocab_size for j in range(context)], repeats + 4))
        while sched.waiting:
            sched.admit(sched.waiting.popleft())
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            sched.decode()
            times.append(time.perf_counter() - t0)
        step = statistics.median(times)
        rows.append(
            {
                "batch": b,
                "step_s": step,
                "tokens_per_s": b / step,
                **step_roofline(model.config, b, context, bandwidth, peak_flops),
            }
        )
    return rows


def step_roofline(config, batch: int, context: int, bandwidth: float | None, peak_flops: float | None) -> dict:
    """Notebook 05's roofline for one decode step of `batch` rows, float32: every weight read once for the
    whole batch, each row's cache read once; 2 FLOPs per weight per row (attention's FLOPs left out, small here)."""
    weight_bytes = 4 * matrix_params(config)
    cache_bytes = 4 * 2 * config.n_layers * config.n_kv_heads * config.head_dim * context * batch
    flops = 2 * matrix_params(config) * batch
    if not bandwidth or not peak_flops:
        return {"bytes": weight_bytes + cache_bytes, "flops": flops}
    return {
        "bytes": weight_bytes + cache_bytes,
        "flops": flops,
        "roofline_s": max((weight_bytes + cache_bytes) / bandwidth, flops / peak_flops),
    }


def bench_serve(
    threads: int = 1, quick: bool = False, n_requests: int | None = None, n_blocks: int = 256, block_size: int = 16
) -> dict:
    """Everything the module docstring lists, as one JSON-ready record."""
    model, tokenizer = load_tiny()
    n = n_requests or (32 if quick else 64)
    trace = make_trace(tokenizer, n)
    shared_trace = make_trace(tokenizer, n, system_prompt=SYSTEM_PROMPT)
    with timing.num_threads(threads):
        static = serve_static(model, trace, n_blocks, block_size)
        continuous = serve_continuous(model, trace, n_blocks, block_size)
        unshared = serve_continuous(model, shared_trace, n_blocks, block_size)
        shared = serve_continuous(model, shared_trace, n_blocks, block_size, share_prefixes=True)
        bandwidth = measure_bandwidth(n_bytes=(32 if quick else 128) << 20, threads=threads, repeats=3)["bandwidth"]
        peak = measure_matmul_flops(n=512, threads=threads, repeats=3)["flops"]
        steps = decode_step_times(
            model, batches=(1, 4, 16, 32) if quick else (1, 2, 4, 8, 16, 32, 64), bandwidth=bandwidth, peak_flops=peak
        )
    prompt_lens = [len(p) for p, _ in trace]
    new_lens = [m for _, m in trace]
    return {
        "trace": {
            "requests": n,
            "seed": 0,
            "prompt_tokens": {
                "min": min(prompt_lens),
                "median": statistics.median(prompt_lens),
                "max": max(prompt_lens),
            },
            "max_new_tokens": {"min": min(new_lens), "median": statistics.median(new_lens), "max": max(new_lens)},
            "distribution": "prompt: 1-3 corpus questions joined; max_new_tokens log-uniform in [4, 256]; all arrive at t=0",
        },
        "kv_budget": {"n_blocks": n_blocks, "block_size": block_size, "token_slots": n_blocks * block_size},
        "static": static,
        "continuous": continuous,
        "prefix": {
            "system_prompt_tokens": len(tokenizer.encode(SYSTEM_PROMPT)),
            "unshared": unshared,
            "shared": shared,
        },
        "decode_steps": steps,
        "machine": {"bandwidth": bandwidth, "matmul_flops": peak},
        "record": timing.environment("cpu", threads=threads, model="tiny"),
    }


def format_serve(report: dict) -> str:
    s, c, p = report["static"], report["continuous"], report["prefix"]
    t = report["trace"]
    lines = [
        f"{t['requests']} requests ({t['distribution']}); KV budget {report['kv_budget']['token_slots']} token slots",
        f"{'':34s} {'tokens/s':>9s} {'TTFT p50':>9s} {'TTFT p99':>9s} {'KV used':>8s}",
        f"{'static, contiguous (batch ' + str(s['batch']) + ')':34s} {s['tokens_per_s']:9.0f} "
        f"{s['ttft_p50_s']:8.2f}s {s['ttft_p99_s']:8.2f}s {s['kv_utilisation']:8.1%}",
        f"{'continuous, paged':34s} {c['tokens_per_s']:9.0f} {c['ttft_p50_s']:8.2f}s {c['ttft_p99_s']:8.2f}s "
        f"{c['kv_utilisation']:8.1%}",
        f"continuous / static throughput: {c['tokens_per_s'] / s['tokens_per_s']:.2f}x; preemptions {c['preemptions']}",
        f"shared system prompt ({p['system_prompt_tokens']} tokens): blocks per running request "
        f"{p['unshared']['blocks_per_running_request']:.1f} -> {p['shared']['blocks_per_running_request']:.1f}, "
        f"requests running {p['unshared']['mean_running']:.1f} -> {p['shared']['mean_running']:.1f}; "
        f"prefill tokens {p['unshared']['prefill_tokens']} -> {p['shared']['prefill_tokens']} "
        f"({p['shared']['prefill_skipped']} skipped)",
        "decode step: "
        + ", ".join(
            f"batch {r['batch']} {r['step_s'] * 1e3:.1f} ms ({r['tokens_per_s']:.0f} tok/s, "
            f"roofline {r.get('roofline_s', float('nan')) * 1e3:.2f} ms)"
            for r in report["decode_steps"]
        ),
    ]
    return "\n".join(lines)
