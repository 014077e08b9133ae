"""`kvlib bench cache` (notebook 04): tokens per second without a cache, with kvlib's KVCache, and with the
engines a user would pick instead, all on identical weights: transformers with its default
DynamicCache and with a StaticCache, and llama.cpp on a GGUF file kvlib writes (F32, and Q8_0 for
what quantised weights buy), when the peers extra is installed. Two more ways: kvlib's cache with
every weight row-major in memory, nn.Linear's default, to show what the memory order kvlib picks
per matrix buys (kvlib.core.model.decode_layout); and kvlib's model compiled by torch.compile with
a static cache (kvlib.measure.compiled; not with --quick), to show what fused, repacked kernels buy
the same weights. Models: the tiny model and a GPT-2-small-size Llama with random weights.

How it is timed: every way generates once per round and the rounds are interleaved (the order
rotated each round), so a busy neighbour slows every way alike; each ratio is the median of the
per-round paired ratios, with their min and max. Greedy tokens must agree: the run fails loudly
if any two exact ways differ (Q8_0 computes with other weights: its agreement is reported).
Naive decoding of the large model is too slow to run in full (minutes per run), so in each round
its total is the sum of per-step forward times measured at a few lengths and interpolated, and its
tokens are checked over a shorter generation; the table says so.
"""

from __future__ import annotations

import copy
import statistics
import tempfile
from pathlib import Path

import numpy as np
import torch

from kvlib.core import progress
from kvlib.core.configs import gpt2_size_config, quick_cache_config
from kvlib.core.gguf_export import write_gguf
from kvlib.core.model import Decoder, matrix_params
from kvlib.core.weights import load_tiny, to_transformers
from kvlib.measure import timing
from kvlib.measure.compiled import compiled_way
from kvlib.measure.peers import LlamaCpp, PeerCrashed, kvlib_way, llama_cpp_available, transformers_way

# way -> what it is, in the order of the table; "kvlib" is the reference every ratio is taken against
WAYS = {
    "no_cache": "kvlib, no cache (generate, 2.2)",
    "kvlib": "kvlib, KVCache (generate_cached, 4.5)",
    "kvlib_rows": "kvlib, KVCache, all weights row-major",
    "kvlib_compiled": "kvlib's model compiled, static cache",
    "hf_dynamic": "transformers, DynamicCache",
    "hf_static": "transformers, StaticCache",
    "llama_f32": "llama.cpp, F32 weights",
    "llama_q8_0": "llama.cpp, Q8_0 weights",
}
INEXACT = {"llama_q8_0"}  # other weights (8-bit): may pick other tokens, so not held to equality
LLAMA = {"llama_f32": "F32", "llama_q8_0": "Q8_0"}  # llama.cpp's ways, each in a child process: a crash is a row
NAIVE_CHECK_TOKENS = 24  # the large model's naive tokens are checked over this many new tokens


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


def _first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def _summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _model_ways(
    model, threads: int, n_ctx: int, folder: Path, llama: bool, compiled: bool, only: set[str] | None = None
) -> tuple[dict, dict, dict]:
    """way name -> run(ids, n) for one model, what could not run (way -> why), and what crashed (way -> how).

    only: the ways to run (kvlib's cached way always runs: every ratio is taken against it); None runs them all.
    """
    from kvlib.generation import generate  # noqa: PLC0415 (late binding: runs the learner's code)
    from kvlib.kv_cache import generate_cached  # noqa: PLC0415 (late binding: runs the learner's code)

    wanted = lambda key: key == "kvlib" or only is None or key in only
    hf = to_transformers(model) if wanted("hf_dynamic") or wanted("hf_static") else None
    ways, missing, crashed = {}, {}, {}
    for key, make in (
        ("no_cache", lambda: kvlib_way(generate, model)),
        ("kvlib", lambda: kvlib_way(generate_cached, model)),
        ("kvlib_rows", lambda: kvlib_way(generate_cached, _row_major(model))),
        ("hf_dynamic", lambda: transformers_way(hf)),
        ("hf_static", lambda: transformers_way(hf, "static")),
    ):
        if wanted(key):
            ways[key] = make()
    if wanted("kvlib_compiled"):
        if compiled:  # kvlib's model through torch.compile (kvlib.measure.compiled): compiled in the warm-up
            ways["kvlib_compiled"] = compiled_way(model, min(n_ctx, model.config.max_seq_len))
        else:
            missing["kvlib_compiled"] = "--quick skips it: compiling takes tens of seconds per model"
    for key, kind in LLAMA.items():
        if not wanted(key):
            continue
        if not llama:
            missing[key] = llama_cpp_available() or "not asked for (llama=False)"
            continue
        path = write_gguf(model, folder / f"model-{kind}.gguf", kind)
        try:
            ways[key] = LlamaCpp(path, n_ctx=n_ctx, threads=threads)
        except PeerCrashed as err:  # it died loading the model: a row that says so, the other ways go on
            crashed[key] = str(err)
    return ways, missing, crashed


def _row_major(model):
    """The same model with every weight row after row in memory (nn.Linear's default) instead of the order
    kvlib.core.model.decode_layout picks per matrix: what that choice alone buys a decode step."""
    rows = copy.deepcopy(model)
    for m in rows.modules():
        if isinstance(m, torch.nn.Linear):
            m.weight = torch.nn.Parameter(m.weight.detach().contiguous(), requires_grad=False)
    return rows


def llama_setup(ways: dict) -> dict | None:
    """How llama.cpp ran here, from the first llama.cpp way: its CPU features line, the extra buffers' decision."""
    engine = next((w for k, w in ways.items() if k in LLAMA), None)
    if engine is None:
        return None
    return {
        "system_info": engine.system_info,
        "extra_buffers": engine.extra_buffers,
        "why": engine.why,
        "model_buffers": {k: w.model_buffers for k, w in ways.items() if k in LLAMA},
    }


def _bench_model(
    name: str,
    model,
    lengths,
    threads: int,
    prompt_len: int,
    rounds: int,
    full_naive: bool,
    llama: bool,
    compiled: bool,
    only: set[str] | None = None,
) -> dict:
    cap = model.config.max_seq_len - prompt_len
    ns = sorted({min(n, cap) for n in lengths})
    n = max(ns)
    ids = torch.randint(0, model.config.vocab_size, (1, prompt_len), generator=torch.Generator().manual_seed(1))
    with tempfile.TemporaryDirectory(prefix="kvlib-gguf-") as folder:
        ways, missing, crashed = _model_ways(model, threads, prompt_len + n + 8, Path(folder), llama, compiled, only)
        setup = llama_setup(ways)

        def crash(key, err):  # a peer's process died: its row says how, the other ways go on
            crashed[key] = str(err)
            ways.pop(key).close()
            times.pop(key, None)
            tokens.pop(key, None)

        times, tokens = {}, {}
        for key, run in list(ways.items()):  # warm-up of each path: first touches, kernel choice, compiling, paging in
            try:
                run(ids, 8)
            except PeerCrashed as err:
                crash(key, err)
            except RuntimeError as err:  # torch.compile cannot compile here (no C++ compiler...): say why, go on
                if key != "kvlib_compiled":
                    raise
                del ways[key]
                missing[key] = str(err)
        order = list(ways)
        times = {k: [] for k in ways}  # per round: seconds until each of the n tokens existed
        naive_lengths, naive_steps = None, []
        for r in progress.bar(range(rounds), desc=f"kvlib bench cache: {name}", unit="round"):
            rotated = order[r % len(order) :] + order[: r % len(order)]
            for key in rotated:
                if key not in ways:  # crashed in an earlier round
                    continue
                if key == "no_cache" and not full_naive:
                    curve, naive_lengths, step = _naive_estimate(model, prompt_len, n, repeats=1)
                    times[key].append(curve)
                    naive_steps.append(step)
                    continue
                try:
                    got, stamps = ways[key](ids, n)
                except PeerCrashed as err:
                    crash(key, err)
                    continue
                if len(stamps) != n:
                    raise RuntimeError(f"{WAYS[key]}: {len(stamps)} timestamps for {n} tokens")
                times[key].append(stamps)
                if tokens.setdefault(key, got) != got:
                    raise RuntimeError(f"{name}: {WAYS[key]} generated other tokens in round {r + 1} than in round 1")
        if "no_cache" in ways and not full_naive:  # the naive way's tokens, over a shorter generation
            tokens["no_cache"], _ = ways["no_cache"](ids, min(n, NAIVE_CHECK_TOKENS))
        for way in ways.values():
            if hasattr(way, "close"):
                way.close()
    reference = tokens["kvlib"]
    agreement = {}
    for key, got in tokens.items():
        i = _first_difference(got, reference[: len(got)])
        agreement[key] = {"tokens_checked": len(got), "first_difference": i}
        if i is not None and key not in INEXACT:
            raise RuntimeError(
                f"{name}: {WAYS[key]} and {WAYS['kvlib']} disagree on the greedy tokens at new token {i} "
                f"({got[i] if i < len(got) else 'none'} against {reference[i]}): the ways do not compute the same model"
            )
    if "no_cache" not in times:
        step, how = [], "not run"
    elif not full_naive:
        step = [statistics.median(col) for col in zip(*naive_steps)]
        how = (
            f"in each round, the sum of forward times measured at {len(naive_lengths)} lengths, interpolated; "
            f"tokens checked over the first {min(n, NAIVE_CHECK_TOKENS)}"
        )
    else:
        naive = [statistics.median(col) for col in zip(*times["no_cache"])]
        naive_lengths = list(range(prompt_len, prompt_len + n))
        step = [naive[0]] + [b - a for a, b in zip(naive, naive[1:])]
        how = "measured in full in each round"
    rows = []
    for k in ns:
        per_round = {key: [t[k - 1] for t in ts] for key, ts in times.items()}
        rows.append(
            {
                "new_tokens": k,
                "tokens_per_s": {key: k / statistics.median(v) for key, v in per_round.items()},
                "seconds": {key: statistics.median(v) for key, v in per_round.items()},
                # kvlib's cached speed over this way's, per round (paired): > 1 kvlib faster
                "kvlib_over": {
                    key: _summary([t / tk for t, tk in zip(v, per_round["kvlib"])])
                    for key, v in per_round.items()
                    if key != "kvlib"
                },
                # the compiled model's speed over each peer's, paired the same way
                **(
                    {
                        "compiled_over": {
                            key: _summary([t / tc for t, tc in zip(v, per_round["kvlib_compiled"])])
                            for key, v in per_round.items()
                            if key in ("hf_static", "llama_f32")
                        }
                    }
                    if "kvlib_compiled" in per_round
                    else {}
                ),
            }
        )
    c = model.config
    return {
        "model": name,
        "params": model.num_params(),
        "config": c.to_dict(),
        "prompt_len": prompt_len,
        "rounds": rounds,
        "ways": {k: WAYS[k] for k in ways},
        "missing": missing,
        "crashed": crashed,
        "llama_cpp": setup,
        "no_cache_method": how,
        "agreement": agreement,
        "rows": rows,
        "weight_bytes_per_step": {"F32": 4 * matrix_params(c), "Q8_0": 34 * matrix_params(c) // 32},
        "no_cache_step_growth": _growth(naive_lengths, step) if step else None,
    }


def bench_cache(
    lengths=(64, 256, 512),
    threads: int = 1,
    prompt_len: int = 8,
    quick: bool = False,
    rounds: int | None = None,
    llama: bool | None = None,
    ways: list[str] | None = None,
) -> dict:
    """Tokens per second at each generated length, every way, for the tiny and the GPT-2-size model.

    rounds: interleaved rounds per model (default 5; 2 with quick). llama: run llama.cpp (default:
    when llama-cpp-python and gguf are installed). ways: run only these (names of WAYS; kvlib's cached way
    always runs, every ratio being taken against it); a llama.cpp way asked for by name needs llama.cpp.
    A llama.cpp way whose process crashes becomes a row that says so ("crashed"); the other ways are measured.
    """
    rounds = rounds or (2 if quick else 5)
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    if ways is not None:
        unknown = [w for w in ways if w not in WAYS]
        if unknown or not ways:
            raise ValueError(f"unknown way(s) {', '.join(unknown) or '(none given)'}: choose from {', '.join(WAYS)}")
    if llama is None:
        llama = llama_cpp_available() is None
        if not llama and ways is not None and set(ways) & set(LLAMA):
            raise ValueError(f"{', '.join(sorted(set(ways) & set(LLAMA)))} asked for, but {llama_cpp_available()}")
    only = set(ways) if ways is not None else None
    results = []
    with timing.num_threads(threads), torch.inference_mode():
        tiny, _ = load_tiny()
        torch.manual_seed(0)
        big = Decoder(gpt2_size_config() if not quick else quick_cache_config()).eval()
        for name, model, full_naive in (("tiny", tiny, True), ("small-stand-in" if quick else "gpt2-size", big, quick)):
            results.append(
                _bench_model(name, model, lengths, threads, prompt_len, rounds, full_naive, llama, not quick, only)
            )
        record = timing.environment("cpu", dtype="float32", threads_requested=threads)
    try:
        import transformers  # noqa: PLC0415 (start-up time: transformers imports for seconds; only its ways need it)

        record["transformers"] = transformers.__version__
    except ImportError:
        pass
    if llama:
        import llama_cpp  # noqa: PLC0415 (optional dependency: llama_cpp, in the peers extra)

        record["llama_cpp_python"] = llama_cpp.__version__
        setup = next((r["llama_cpp"] for r in results if r["llama_cpp"]), None)
        if setup:  # the CPU features line and the extra buffers' decision, as llama.cpp's child reported them
            record["llama_cpp_system_info"] = setup["system_info"]
            record["llama_cpp_extra_buffers"] = {"on": setup["extra_buffers"], "why": setup["why"]}
    return {"benchmark": "cache", "quick": quick, "ways_asked": ways, "record": record, "results": results}


def crashed_asked(report: dict) -> list[str]:
    """The ways asked for by name (bench_cache's ways) whose process crashed: the run failed for its user."""
    asked = set(report.get("ways_asked") or ())
    return sorted({k for r in report["results"] for k in r.get("crashed", {}) if k in asked})


def _goals(r: dict) -> list[str]:
    """The issue's goals, at the longest length of the GPT-2-size model: met, or missed by how much."""
    row = r["rows"][-1]
    lines = []
    for key, goal in (("hf_static", 1.0), ("llama_f32", 0.8)):
        if key in row["kvlib_over"]:
            got = row["kvlib_over"][key]["median"]
            verdict = "met" if got >= goal else f"missed: kvlib would need {goal / got:.2f}x its speed"
            lines.append(
                f"  goal: kvlib >= {goal:.1f}x {WAYS[key]} at {row['new_tokens']} tokens: {got:.2f}x, {verdict}"
            )
    for key, s in row.get("compiled_over", {}).items():  # not the goal's subject (kvlib's eager code): shown beside it
        lines.append(
            f"  {WAYS['kvlib_compiled']} / {WAYS[key]} at {row['new_tokens']} tokens: {s['median']:.2f}x "
            f"({s['min']:.2f}-{s['max']:.2f})"
        )
    return lines


def format_cache(report: dict) -> str:
    rec = report["record"]
    versions = ", ".join(f"{k} {rec[k]}" for k in ("transformers", "llama_cpp_python") if k in rec)
    lines = [
        f"kvlib bench cache: {rec['device']}, {rec['threads']} thread(s), torch {rec['torch']}"
        + (f", {versions}" if versions else "")
        + ", float32 unless said, greedy, batch 1"
    ]
    if "llama_cpp_extra_buffers" in rec:
        x = rec["llama_cpp_extra_buffers"]
        lines.append(f"llama.cpp's extra weight buffers {'on' if x['on'] else 'off'}: {x['why']}")
    for r in report["results"]:
        g, keys = r["no_cache_step_growth"], list(r["ways"])
        lines += [
            "",
            f"{r['model']} ({r['params'] / 1e6:.1f}M parameters), prompt {r['prompt_len']} tokens, "
            f"{r['rounds']} interleaved rounds; no cache: {r['no_cache_method']}",
            f"  {'new tokens':>10}  {'way':<38} {'tok/s':>9} {'kvlib/way':>10}  (min-max over rounds)",
        ]
        for row in r["rows"]:
            for i, key in enumerate(keys):
                first = f"{row['new_tokens']:>10}" if i == 0 else " " * 10
                tps = row["tokens_per_s"][key]
                if key == "kvlib":
                    lines.append(f"  {first}  {r['ways'][key]:<38} {tps:>9.1f} {'1.00':>9}x")
                else:
                    s = row["kvlib_over"][key]
                    lines.append(
                        f"  {first}  {r['ways'][key]:<38} {tps:>9.1f} {s['median']:>9.2f}x  ({s['min']:.2f}-{s['max']:.2f})"
                    )
        for key, why in r["missing"].items():
            lines.append(f"  {WAYS[key]}: not run: {why}")
        for key, how in r.get("crashed", {}).items():
            lines.append(f"  {WAYS[key]}: {how.removeprefix('llama.cpp: ')}")
        for key, a in r["agreement"].items():
            if a["first_difference"] is not None:
                lines.append(
                    f"  {WAYS[key]}: tokens agree with kvlib's for the first {a['first_difference']} of "
                    f"{a['tokens_checked']} (other weights: not held to equality)"
                )
        exact = [WAYS[k] for k, a in r["agreement"].items() if a["first_difference"] is None]
        lines.append(f"  identical greedy tokens: {'; '.join(exact)}")
        if g:
            lines.append(
                f"  per-step time without cache ~ {g['a_s'] * 1e3:.2f} ms + {g['b_s_per_token'] * 1e6:.2f} us*S "
                f"+ {g['c_s_per_token2'] * 1e9:.3f} ns*S^2 (log-log slope {g['loglog_slope']:.2f}) at S cached tokens"
            )
        last, wb = r["rows"][-1], r["weight_bytes_per_step"]
        rates = [
            f"{WAYS[k]} {wb['Q8_0' if k == 'llama_q8_0' else 'F32'] * last['tokens_per_s'][k] / 1e9:.1f}"
            for k in keys
            if k != "no_cache"
        ]
        lines.append(
            f"  weights read per token: {wb['F32'] / 1e6:.0f} MB in F32, {wb['Q8_0'] / 1e6:.0f} MB in Q8_0 "
            f"({wb['F32'] / wb['Q8_0']:.2f}x fewer bytes); GB/s of weights at {last['new_tokens']} tokens: "
            + "; ".join(rates)
        )
        if r["model"] == "gpt2-size":
            lines += _goals(r)
    lines.append(
        "\nkvlib/way = that way's time / kvlib's cached time for the same tokens, paired within each round: "
        "median (min-max) over rounds; > 1: kvlib faster. For no cache it is the cache's speedup."
    )
    return "\n".join(lines)
