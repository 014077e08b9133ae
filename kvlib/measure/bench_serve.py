"""`kvlib bench serve` (notebook 07): many requests at equal KV memory, served three ways.

The trace: n requests (seed 0) on the tiny model. Each prompt joins k question prompts of the
tiny model's corpus, k uniform in {1, 2, 3} (about 10 to 150 tokens); each request then generates
max_new_tokens greedy tokens, drawn log-uniformly from 4 to 256 (many short answers, a few long
ones, as chat traffic has). Every request arrives at time 0, so TTFT includes the wait in line.
Measured on one KV budget (n_blocks * block_size token slots), three ways:
  - static batching, reserved: each request reserves max_seq_len slots (notebook 04's KVCache), so
    budget // max_seq_len requests form a batch, which runs until its longest member is done; a finished
    member keeps its row and its compute meanwhile, as a padded batch does (Orca, Yu et al., OSDI 2022,
    section 2), and what it computes then is thrown away;
  - continuous batching, reserved: Orca's iteration-level scheduling (what vLLM's docs call continuous
    batching) in the same reservations: at most budget // max_seq_len run, but a finished one leaves at once
    and the first in line takes its place;
  - continuous batching, paged (vLLM's; your Scheduler): admitted whenever blocks are free;
  - the same with a shared system prompt, prefix sharing off and on, at a budget where blocks bind.
Static to continuous is what not computing finished rows gains; reserved to paged is what paging's higher
concurrency gains. serve_rounds runs ways interleaved, round after round, for verdicts with a spread.
Utilisation is time-averaged over steps: slots holding a token / slots reserved (for a reservation, an
assumed max_seq_len per request). Inter-token latency is each gap between two tokens of one request (the
engine's clock at each forward).
Also the batched decode step's time against batch size. Everything runs the learner's kvlib/serving.py.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np

from kvlib.core import progress
from kvlib.core.model import matrix_params
from kvlib.core.weights import load_tiny
from kvlib.measure import timing
from kvlib.measure.machine import measure_bandwidth, measure_matmul_flops
from kvlib.study.corpus import eval_prompts

SYSTEM_PROMPT = (
    "You are a helpful geography tutor. Answer with the capital, then stop.\n"  # 72 characters, one token each
)


def scattered_batch(config, lengths: list[int], blocks: list[list[int]], block_size: int = 4, seed: int = 0):
    """Notebook 07a's batch for paged attention (7.3): rows of these lengths, their keys and values written into
    these blocks of a fresh pool (layer 0), one decode query per row, and what the rows' attention must give.

    Returns (pool, tables, q, expected): a BlockPool of 16 blocks; one BlockTable per row (blocks, length set);
    q (rows, n_heads, 1, head_dim); expected, the same shape: each row's attention over its own keys and values,
    computed from one padded tensor that holds them in token order, not from the pool.
    """
    import torch  # noqa: PLC0415 (start-up time: the benchmark's CLI imports this module)
    import torch.nn.functional as F  # noqa: PLC0415 (start-up time: as torch, above)

    from kvlib.serving import BlockPool, BlockTable  # noqa: PLC0415 (late binding: the learner's classes)

    gen = torch.Generator().manual_seed(seed)
    longest, H_kv, D = max(lengths), config.n_kv_heads, config.head_dim
    K, V = torch.randn(2, len(lengths), H_kv, longest, D, generator=gen)
    pool, tables = BlockPool(config, 16, block_size), []
    for row, (n, held) in enumerate(zip(lengths, blocks)):
        t = BlockTable(block_size)
        t.blocks, t.length = list(held), n
        tables.append(t)
        for start in range(0, n, block_size):  # one block's worth of the row's tokens at a time
            piece = slice(start, min(start + block_size, n))
            block = held[start // block_size]
            pool.k[0, block, :, : piece.stop - start] = K[row, :, piece]
            pool.v[0, block, :, : piece.stop - start] = V[row, :, piece]
    q = torch.randn(len(lengths), config.n_heads, 1, D, generator=gen)
    own = (torch.arange(longest) < torch.tensor(lengths)[:, None])[:, None, None]  # the keys each row has
    return pool, tables, q, F.scaled_dot_product_attention(q, K, V, attn_mask=own, enable_gqa=True)


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
    gaps = [b - a for r in requests for a, b in zip(r.times["tokens"], r.times["tokens"][1:])]
    tpot = [float(np.mean(np.diff(r.times["tokens"]))) for r in requests if len(r.times["tokens"]) > 1]
    generated = sum(len(r.out) for r in requests)
    return {
        "requests": len(requests),
        "generated_tokens": generated,
        "seconds": seconds,
        "tokens_per_s": generated / seconds,
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p99_s": percentile(ttft, 99),
        "itl_p50_s": percentile(gaps, 50) if gaps else float("nan"),  # inter-token latency: every gap of every request
        "itl_p99_s": percentile(gaps, 99) if gaps else float("nan"),
        "tpot_mean_s": statistics.fmean(tpot) if tpot else float("nan"),  # each request's mean gap, then their mean
        "steps": steps,
        "kv_utilisation": held / reserved if reserved else float("nan"),
        **(extra or {}),
    }


def serve_continuous(
    model,
    trace,
    n_blocks,
    block_size=16,
    max_batch=64,
    share_prefixes=False,
    on_step=None,
    reserve=None,
    scheduler=None,
    keep_tokens=False,
    on_done=None,
):
    """Your Scheduler (or `scheduler`, a subclass of it) over the whole trace; returns the summary, with blocks held
    per step and the step times with and without a prefill. reserve: count each running request as reserving that
    many slots (contiguous reservation) instead of the blocks it holds. keep_tokens: the summary's "tokens" holds
    each request's generated tokens, by id. on_done(k): called as k more requests are done (a progress bar)."""
    from kvlib.serving import BlockPool, Scheduler  # noqa: PLC0415 (late binding: runs the learner's code)

    pool = BlockPool(model.config, n_blocks, block_size)
    sched = (scheduler or Scheduler)(model, pool, max_batch=max_batch, share_prefixes=share_prefixes)
    requests = _requests(trace)
    for r in requests:
        sched.add(r)
    counts = {"steps": 0, "held": 0, "reserved": 0, "blocks": [], "running": 0, "prefill_steps": [], "decode_steps": []}
    last = {"t": 0.0, "prefill": 0, "done": 0}

    def observe(s):
        now = time.perf_counter()
        counts["steps"] += 1
        in_use = pool.n_blocks - pool.n_free
        counts["held"] += sum(r.table.length for r in s.running)
        counts["reserved"] += len(s.running) * reserve if reserve else in_use * block_size
        counts["blocks"].append(in_use)
        counts["running"] += len(s.running)
        prefilled = s.stats["prefill_tokens"] > last["prefill"]  # this step admitted someone: prefill first
        counts["prefill_steps" if prefilled else "decode_steps"].append(now - last["t"])
        last["t"], last["prefill"] = now, s.stats["prefill_tokens"]
        if on_step is not None:
            on_step(s)
        if on_done is not None and len(s.finished) > last["done"]:
            on_done(len(s.finished) - last["done"])
            last["done"] = len(s.finished)
            last["t"] = time.perf_counter()  # the next step's time starts after the bar's update

    start = last["t"] = time.perf_counter()
    sched.run(on_step=observe)
    seconds = time.perf_counter() - start
    fed = sched.stats["prefill_tokens"] + sched.stats["prefill_skipped"]
    return _summary(
        sched.finished,
        start,
        seconds,
        counts["steps"],
        counts["held"],
        counts["reserved"],
        {
            "max_batch": max_batch,
            "mean_blocks_held": statistics.fmean(counts["blocks"]),
            "peak_blocks_held": max(counts["blocks"]),
            "blocks_per_running_request": sum(counts["blocks"]) / max(counts["running"], 1),
            "mean_running": counts["running"] / max(counts["steps"], 1),
            "recomputed_tokens": fed - sum(len(r.prompt) for r in requests),  # fed again after a preemption
            "steps_with_prefill": len(counts["prefill_steps"]),
            "step_p50_s_with_prefill": percentile(counts["prefill_steps"], 50) if counts["prefill_steps"] else 0.0,
            "step_p50_s_decode_only": percentile(counts["decode_steps"], 50) if counts["decode_steps"] else 0.0,
            **sched.stats,
            **({"tokens": {r.id: list(r.out) for r in sched.finished}} if keep_tokens else {}),
        },
    )


# Exercise 7.7's budget: the setting and the targets a policy is graded on, the same in the notebook and the checks
BUDGET = {
    "requests": 32,  # make_trace(tokenizer, 32), seed 0, on the tiny model
    "new_tokens": 24,  # every answer cut to 24 tokens
    "n_blocks": 24,  # the memory cap: 24 blocks of 16 slots, 384 token slots for all 32
    "block_size": 16,
    "max_batch": 16,
    "recomputed": 100,  # at most this many tokens fed again after preemptions
    "ttft_p99_steps": 100,  # 99% of the first tokens within this many steps
}


def budget_trace(tokenizer) -> list[tuple[list[int], int]]:
    """Exercise 7.7's trace: notebook 07a's 32 requests, every answer cut to BUDGET["new_tokens"]."""
    return [(p, min(n, BUDGET["new_tokens"])) for p, n in make_trace(tokenizer, BUDGET["requests"])]


def serve_by_steps(sched, pool, trace, on_step=None, max_steps: int = 2000) -> dict:
    """Step a scheduler holding trace's requests (ids 0, 1, ...) until all are done, reading after each step only what
    a request shows (id, prompt, tokens out) and the pool's free blocks, so that it reads a scheduler in the isolated
    grader as well as one here. Counts, the same on every machine: the step at which each request got its first
    token (TTFT in steps: all arrive at step 0), the tokens fed again after preemptions (a request found waiting with
    tokens out was preempted: it feeds its prompt and those tokens again), the steps, the most blocks held; and
    each request's tokens. on_step(sched) after each step. Raises AssertionError, naming the request, where a step
    moves a request by more than admitting and one decode can (two tokens), or holds fewer blocks than the running
    requests' tokens fill (their keys would be outside the pool)."""
    bs, prompt = pool.block_size, {i: len(p) for i, (p, _) in enumerate(trace)}
    first, made, paused = {}, dict.fromkeys(prompt, 0), {}
    steps = recomputed = peak = 0
    while steps < max_steps:
        waiting, running, finished = list(sched.waiting), list(sched.running), list(sched.finished)
        if not (waiting or running):
            break
        sched.step()
        steps += 1
        waiting, running, finished = list(sched.waiting), list(sched.running), list(sched.finished)
        for r in running + finished + waiting:
            n = len(r.out)
            if n > made[r.id] + 2 or n < made[r.id]:
                raise AssertionError(
                    f"request {r.id} went from {made[r.id]} to {n} tokens in one step: a step admits (one token) and "
                    "decodes once (one more)"
                )
            if n and r.id not in first:
                first[r.id] = steps
            made[r.id] = n
        for r in waiting:
            if r.out and paused.get(r.id) != len(r.out):  # preempted since the last step, with its tokens so far
                paused[r.id] = len(r.out)
                recomputed += prompt[r.id] + len(r.out)
        for r in running:
            paused.pop(r.id, None)
        held = pool.n_blocks - pool.n_free
        filled = sum(-(-(len(r.prompt) + len(r.out) - 1) // bs) for r in running)
        if held < filled:
            raise AssertionError(
                f"after step {steps} the running requests fill {filled} blocks of the pool, which holds {held}: "
                "every request's keys and values live in the pool's blocks"
            )
        peak = max(peak, held)
        if on_step is not None:
            on_step(sched)
    else:
        raise AssertionError(
            f"{len(trace)} requests not done after {max_steps} steps: does every request get admitted?"
        )
    ttft = [first.get(i, steps) for i in prompt]
    return {
        "steps": steps,
        "ttft_steps": ttft,
        "ttft_p99_steps": percentile(ttft, 99),
        "ttft_p50_steps": percentile(ttft, 50),
        "recomputed": recomputed,
        "peak_blocks_held": peak,
        "tokens": {r.id: list(r.out) for r in finished},
    }


def serve_budget(model, tokenizer, scheduler=None, on_step=None) -> dict:
    """Exercise 7.7's run: your Policy (or `scheduler`, a Scheduler class) over budget_trace in BUDGET's memory cap;
    serve_by_steps's counts, and whether each target is met."""
    from kvlib.serving import BlockPool, Policy, Request  # noqa: PLC0415 (late binding: runs the learner's code)

    pool = BlockPool(model.config, BUDGET["n_blocks"], BUDGET["block_size"])
    sched = (scheduler or Policy)(model, pool, max_batch=BUDGET["max_batch"])
    trace = budget_trace(tokenizer)
    for i, (p, n) in enumerate(trace):
        sched.add(Request(i, list(p), n))
    out = serve_by_steps(sched, pool, trace, on_step=on_step)
    out["preemptions"] = sched.stats["preemptions"]
    out["meets"] = {
        "recomputed": out["recomputed"] <= BUDGET["recomputed"],
        "ttft_p99_steps": out["ttft_p99_steps"] <= BUDGET["ttft_p99_steps"],
    }
    return out


def budget_line(name: str, run: dict) -> str:
    """One line of serve_budget's run against BUDGET: the two counts, each beside its target, and the verdict."""
    missed = [
        what
        for key, what in (("recomputed", "the recompute target"), ("ttft_p99_steps", "the TTFT target"))
        if not run["meets"][key]
    ]
    return (
        f"{name:15s}: {run['recomputed']:3d} tokens recomputed (budget {BUDGET['recomputed']}), TTFT p99 "
        f"{run['ttft_p99_steps']:5.1f} steps (budget {BUDGET['ttft_p99_steps']}); {run['preemptions']} "
        f"preemption{'s' * (run['preemptions'] != 1)}, "
        f"{run['steps']} steps: " + ("meets the budget" if not missed else "misses " + " and ".join(missed))
    )


def serve_iteration_level(model, trace, n_blocks, block_size=16, reserve=None, on_done=None):
    """Continuous batching in reserved memory (Orca's iteration-level scheduling, no paging): at most
    budget // reserve requests run, as contiguous reservation allows, but each leaves as soon as it is done and
    the first in line takes its place."""
    reserve = reserve or model.config.max_seq_len
    batch = n_blocks * block_size // reserve
    if batch < 1:
        raise ValueError(f"a budget of {n_blocks * block_size} slots holds no contiguous reservation of {reserve}")
    out = serve_continuous(model, trace, n_blocks, block_size, max_batch=batch, reserve=reserve, on_done=on_done)
    return {**out, "batch": batch, "reserve": reserve}


def serve_static(model, trace, n_blocks, block_size=16, reserve=None, on_done=None):
    """Static batching with contiguous reservation: batches of budget // reserve requests, each run to its longest
    member. on_done(k): called as a batch of k requests is done."""
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
            del r.times["tokens"][r.max_new_tokens :]
        sched.retire()
        if on_done is not None:
            on_done(len(members))
    seconds = time.perf_counter() - start
    return _summary(sched.finished, start, seconds, steps, held, reserved, {"batch": batch, "reserve": reserve})


def serve_rounds(model, trace, ways: dict, rounds: int = 3) -> dict[str, list[dict]]:
    """Each way (name -> fn(model, trace) -> a summary, e.g. serve_static with its budget bound) served `rounds`
    times, the ways interleaved within every round, so that a busy moment of a shared machine lands on all of
    them alike: {name: [one summary per round]}. The schedules are deterministic; only the times vary.
    Example: paired = [a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(runs["paged"], runs["reserved"])]"""
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be a positive int, got {rounds!r}")
    runs: dict[str, list[dict]] = {name: [] for name in ways}
    for _ in range(rounds):
        for name, fn in ways.items():
            runs[name].append(fn(model, trace))
    return runs


def equal_memory_ways(n_blocks: int = 256, block_size: int = 16) -> dict:
    """The three ways of notebook 07b at one KV budget, for serve_rounds: static and continuous batching in
    reserved memory, and continuous batching paged."""
    return {
        "static, reserved": lambda m, t: serve_static(m, t, n_blocks, block_size),
        "continuous, reserved": lambda m, t: serve_iteration_level(m, t, n_blocks, block_size),
        "continuous, paged": lambda m, t: serve_continuous(m, t, n_blocks, block_size),
    }


def format_rounds(runs: dict[str, list[dict]]) -> str:
    """One line per way: the medians of its rounds (throughput, TTFT p99, ITL p99, TPOT), its steps and KV in use
    (the same every round), and for a paged way the median step with and without a prefill in it."""
    lines = []
    for name, rs in runs.items():
        med = {
            k: statistics.median(r[k] for r in rs) for k in ("tokens_per_s", "ttft_p99_s", "itl_p99_s", "tpot_mean_s")
        }
        lines.append(
            f"{name:21s}: {med['tokens_per_s']:5.0f} tokens/s, {rs[0]['steps']:3d} steps, TTFT p99 {med['ttft_p99_s']:5.2f} s, "
            f"ITL p99 {med['itl_p99_s'] * 1e3:6.1f} ms, TPOT {med['tpot_mean_s'] * 1e3:5.1f} ms, "
            f"KV in use {rs[0]['kv_utilisation']:.0%} (medians of {len(rs)} rounds)"
        )
    lines.append(
        "KV in use with a reservation is modelled, from an assumed max_seq_len slots per request; the PagedAttention "
        "paper measured 20.4-38.2% in real systems"
    )
    for name, rs in runs.items():
        if rs[0].get("steps_with_prefill") and "reserve" not in rs[0]:
            with_, without = (
                statistics.median(r[k] for r in rs) for k in ("step_p50_s_with_prefill", "step_p50_s_decode_only")
            )
            n = rs[0]["steps_with_prefill"]
            which = f"the median of {n} such steps" if n > 1 else "the one step that admits, all at once"
            lines.append(
                f"{name}, prefill first: a step that admits someone takes {with_ * 1e3:.1f} ms ({which}; median of "
                f"{len(rs)} rounds), a decode-only step {without * 1e3:.1f} ms"
            )
    return "\n".join(lines)


def paired(runs: dict[str, list[dict]], subject: str, baseline: str, key: str = "tokens_per_s") -> list[float]:
    """Round by round, subject's key / baseline's (for a time, pass its inverse's ratio yourself)."""
    return [a[key] / b[key] for a, b in zip(runs[subject], runs[baseline])]


def last_level_cache_bytes() -> int | None:
    """The largest CPU cache Linux reports (sysfs, cpu0), in bytes; None where it says nothing."""
    sizes = []
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = f.read_text().strip().upper()
        units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
        if text[:-1].isdigit() and text[-1] in units:
            sizes.append(int(text[:-1]) * units[text[-1]])
        elif text.isdigit():
            sizes.append(int(text))
    return max(sizes) if sizes else None


def decode_step_times(
    model,
    batches=(1, 2, 4, 8, 16, 32, 64),
    context=64,
    block_size=16,
    repeats=5,
    bandwidth: float | None = None,
    peak_flops: float | None = None,
    on_done=None,
):
    """Seconds of one batched decode step with `batch` requests of `context` cached tokens each, beside
    the roofline's time when bandwidth (bytes/s) and peak_flops (FLOP/s) are given. on_done(1): after each batch."""
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
        if on_done is not None:
            on_done(1)
    return rows


def step_roofline(config, batch: int, context: int, bandwidth: float | None, peak_flops: float | None) -> dict:
    """Notebook 05's roofline for one decode step of `batch` rows, float32: every weight read once for the
    whole batch, each row's cache read once; 2 FLOPs per weight per row (attention's FLOPs left out, small here)."""
    weight_bytes = 4 * matrix_params(config)
    cache_bytes = 4 * 2 * config.n_layers * config.n_kv_heads * config.head_dim * context * batch
    flops = 2 * matrix_params(config) * batch
    if not bandwidth or not peak_flops:
        return {"bytes": weight_bytes + cache_bytes, "weight_bytes": weight_bytes, "flops": flops}
    return {
        "bytes": weight_bytes + cache_bytes,
        "weight_bytes": weight_bytes,
        "flops": flops,
        "roofline_s": max((weight_bytes + cache_bytes) / bandwidth, flops / peak_flops),
    }


def bench_serve(
    threads: int = 1,
    quick: bool = False,
    n_requests: int | None = None,
    n_blocks: int = 256,
    block_size: int = 16,
    prefix_blocks: int = 96,
) -> dict:
    """Everything the module docstring lists, as one JSON-ready record. prefix_blocks: the budget of the prefix
    runs, small enough that blocks bind (what sharing saves can then run more requests at once)."""
    model, tokenizer = load_tiny()
    n = n_requests or (32 if quick else 64)
    trace = make_trace(tokenizer, n)
    shared_trace = make_trace(tokenizer, n, system_prompt=SYSTEM_PROMPT)
    batches = (1, 4, 16, 32) if quick else (1, 2, 4, 8, 16, 32, 64)
    # one bar, counting requests served (five runs of the trace), then the machine's two measures and the batches
    with (
        timing.num_threads(threads),
        progress.bar(desc="kvlib bench serve", total=5 * n + 2 + len(batches), unit="request") as bar,
    ):
        bar.set_postfix_str("static batching")
        static = serve_static(model, trace, n_blocks, block_size, on_done=bar.update)
        bar.set_postfix_str("iteration-level batching")
        iteration = serve_iteration_level(model, trace, n_blocks, block_size, on_done=bar.update)
        bar.set_postfix_str("continuous batching")
        continuous = serve_continuous(model, trace, n_blocks, block_size, on_done=bar.update)
        bar.set_postfix_str("a shared system prompt, unshared")
        unshared = serve_continuous(model, shared_trace, prefix_blocks, block_size, on_done=bar.update)
        bar.set_postfix_str("a shared system prompt, shared")
        shared = serve_continuous(
            model, shared_trace, prefix_blocks, block_size, share_prefixes=True, on_done=bar.update
        )
        # notebook 05's measurements, with its sizes: one ridge for the course on one machine
        bar.set_postfix_str("bandwidth and matmul FLOP/s")
        bandwidth = measure_bandwidth(**({"n_bytes": 32 << 20, "repeats": 3} if quick else {}), threads=threads)
        peak = measure_matmul_flops(**({"repeats": 3} if quick else {}), threads=threads)
        bar.update(2)
        bar.set_postfix_str("decode steps against batch")
        steps = decode_step_times(
            model, batches=batches, bandwidth=bandwidth["bandwidth"], peak_flops=peak["flops"], on_done=bar.update
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
        "iteration_level": iteration,
        "continuous": continuous,
        "prefix": {
            "system_prompt_tokens": len(tokenizer.encode(SYSTEM_PROMPT)),
            "n_blocks": prefix_blocks,
            "unshared": unshared,
            "shared": shared,
        },
        "decode_steps": steps,
        "machine": {
            "bandwidth": bandwidth["bandwidth"],
            "bandwidth_array_bytes": bandwidth["array_bytes"],
            "matmul_flops": peak["flops"],
            "matmul_n": peak["n"],
            "weight_bytes": 4 * matrix_params(model.config),
            "last_level_cache_bytes": last_level_cache_bytes(),
        },
        "record": timing.environment("cpu", threads=threads, model="tiny"),
    }


def _mb(n: int | None) -> str:
    return "unknown size" if not n else f"{n / 1e6:.1f} MB"


def format_serve(report: dict) -> str:
    s, i, c, p = report["static"], report["iteration_level"], report["continuous"], report["prefix"]
    t = report["trace"]
    u, sh = p["unshared"], p["shared"]
    lines = [
        f"{t['requests']} requests ({t['distribution']}); KV budget {report['kv_budget']['token_slots']} token slots",
        f"{'':38s} {'tokens/s':>9s} {'steps':>6s} {'TTFT p50':>9s} {'TTFT p99':>9s} {'ITL p50':>8s} {'ITL p99':>8s} "
        f"{'TPOT':>8s} {'KV used':>8s}",
    ]
    for name, r in (
        (f"static, reserved (batch {s['batch']})", s),
        (f"continuous, reserved (<= {i['batch']})", i),
        ("continuous, paged", c),
    ):
        lines.append(
            f"{name:38s} {r['tokens_per_s']:9.0f} {r['steps']:6d} {r['ttft_p50_s']:8.2f}s {r['ttft_p99_s']:8.2f}s "
            f"{r['itl_p50_s'] * 1e3:6.1f}ms {r['itl_p99_s'] * 1e3:6.1f}ms {r['tpot_mean_s'] * 1e3:6.1f}ms "
            f"{r['kv_utilisation']:8.1%}"
        )
    lines += [
        "KV used with a reservation is modelled: each request assumed to reserve max_seq_len slots",
        f"throughput over static (one run each: no spread measured): continuous, reserved "
        f"{i['tokens_per_s'] / s['tokens_per_s']:.2f}x (no finished rows computed), paged "
        f"{c['tokens_per_s'] / s['tokens_per_s']:.2f}x; steps {s['steps']} -> {i['steps']} -> "
        f"{c['steps']}; preemptions {c['preemptions']}",
        f"prefill first stalls decodes: a step with a prefill {c['step_p50_s_with_prefill'] * 1e3:.1f} ms (median of "
        f"{c['steps_with_prefill']}), a decode-only step {c['step_p50_s_decode_only'] * 1e3:.1f} ms",
        f"shared system prompt ({p['system_prompt_tokens']} tokens, {p['n_blocks']} blocks): blocks per running "
        f"request {u['blocks_per_running_request']:.1f} -> {sh['blocks_per_running_request']:.1f}, requests running "
        f"{u['mean_running']:.1f} -> {sh['mean_running']:.1f}, steps {u['steps']} -> {sh['steps']}; prefill tokens "
        f"{u['prefill_tokens']} -> {sh['prefill_tokens']} ({sh['prefill_skipped']} skipped)",
        "decode step: "
        + ", ".join(
            f"batch {r['batch']} {r['step_s'] * 1e3:.1f} ms ({r['tokens_per_s']:.0f} tok/s, "
            f"DRAM roofline {r.get('roofline_s', float('nan')) * 1e3:.2f} ms)"
            for r in report["decode_steps"]
        ),
        f"the DRAM roofline assumes weights streamed from memory; this model's {report['machine']['weight_bytes'] / 1e6:.1f} "
        f"MB of weights against a last-level cache of {_mb(report['machine'].get('last_level_cache_bytes'))}: "
        "where they fit, the roof need not bind",
    ]
    return "\n".join(lines)
