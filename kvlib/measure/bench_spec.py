"""`kvlib bench spec`: speculative decoding on this machine, against the formula and the roofline.

For a drafter model (assets/draft) and for prompt lookup, at several gamma, paired and interleaved
with plain cached greedy decoding of the same prompts: the model's forward passes per token, the
acceptance rate alpha, tokens per model pass beside (1 - alpha^(gamma+1)) / (1 - alpha), the cost
ratio c of a draft step to a model step, and the speedup predicted by Leviathan et al.'s formula
(1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)) beside the measured one. Then one forward pass's
time against the tokens fed at once (1 ... 16), beside notebook 05's roofline. Every run checks
that the tokens equal plain greedy decoding's. One thread by default.
"""

from __future__ import annotations

import statistics
import time

import torch

from kvlib.core.weights import load_draft, load_tiny
from kvlib.measure.machine import measure_bandwidth, measure_matmul_flops
from kvlib.measure.timing import environment, measure, num_threads
from kvlib.study import corpus

GAMMAS = (1, 2, 3, 4, 6, 8)
GOALS = {"model": 1.5, "lookup": 2.0}  # issue 28: tokens/s against plain cached greedy decoding


class Counted:
    """The model, counting its forward passes and the tokens each fed."""

    def __init__(self, model):
        self.model, self.config, self.fed, self.at = model, model.config, [], []

    def __call__(self, ids, past_key_values=None):
        self.fed.append(ids.shape[1])
        self.at.append(getattr(past_key_values, "pos", 0))
        return self.model(ids, past_key_values=past_key_values)

    def acceptance(self, n_tokens: int) -> tuple[int, int, int]:
        """(accepted, checked, drafted) over the verify passes of one finished run that returned n_tokens in all.

        A pass keeps (the cache's growth) accepted + 1 tokens; its drafts are checked up to the first rejected
        one, so alpha = accepted / checked is each draft's chance of being kept once the drafts before it were."""
        ends = [*self.at[2:], n_tokens - 1]  # the cache's position after each verify pass
        accepted = checked = drafted = 0
        for fed, start, end in zip(self.fed[1:], self.at[1:], ends):
            n = end - start - 1
            accepted, drafted = accepted + n, drafted + fed - 1
            checked += n + (n < fed - 1)  # a rejection was checked too
        return accepted, checked, drafted


def plain_greedy(model, input_ids: torch.Tensor, max_new_tokens: int, cache) -> torch.Tensor:
    """Cached greedy decoding, one forward per token: the baseline, and the tokens to match."""
    cache.reset()
    with torch.inference_mode():
        logits, _ = model(input_ids, past_key_values=cache)
        new = [int(logits[0, -1].argmax())]
        while len(new) < max_new_tokens:
            logits, _ = model(torch.tensor([[new[-1]]]), past_key_values=cache)
            new.append(int(logits[0, -1].argmax()))
    return torch.cat([input_ids, torch.tensor([new])], dim=1)


def repeating_prompt(tokenizer, n_records: int = 4, times: int = 2) -> torch.Tensor:
    """Training records, written twice, then the first words of the first again: text a model will copy."""
    records = corpus.records("train")[:: len(corpus.records("train")) // n_records][:n_records]
    text = "\n".join(records) + "\n"
    return torch.tensor([tokenizer.encode(text * times + records[0][: len(records[0]) // 2])])


def alpha_formula(alpha: float, gamma: int) -> float:
    """Expected tokens per model pass: 1 + alpha + ... + alpha^gamma (each draft kept with probability alpha)."""
    return gamma + 1.0 if alpha >= 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)


def predicted_speedup(alpha: float, gamma: int, c: float) -> float:
    """Leviathan et al.'s speedup: tokens per pass over the cost of a round in model steps (gamma c + 1)."""
    return alpha_formula(alpha, gamma) / (gamma * c + 1)


def _step(model, kv_len: int, seq_len: int, cache_cls):
    """A forward over seq_len tokens at kv_len cached ones, rewound after each call so every call is the same."""
    cache = cache_cls(model.config, max_seq_len=kv_len + seq_len)
    with torch.inference_mode():
        model(torch.zeros(1, kv_len, dtype=torch.long), past_key_values=cache)
    ids = torch.zeros(1, seq_len, dtype=torch.long)

    def step():
        cache.truncate(kv_len)
        model(ids, past_key_values=cache)

    return step


def paired_medians(fns: dict, rounds: int, repeats: int = 3) -> dict:
    """name -> median seconds, each round timing every fn once (the median of `repeats` calls), rounds interleaved,
    plus name -> median of the per-round ratio to the first fn: what a shared machine can hold."""
    per_round = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            per_round[name].append(measure(fn, warmup=1, repeats=repeats, threads=None).median)
    first = next(iter(fns))
    return {
        "seconds": {name: statistics.median(v) for name, v in per_round.items()},
        "ratio": {name: statistics.median(a / b for a, b in zip(v, per_round[first])) for name, v in per_round.items()},
    }


class NoisyOracle:
    """A drafter with a chosen acceptance rate: it knows the model's greedy text and spoils each drafted token
    with probability 1 - keep (fixed seed). Costs next to nothing, so c is about 0."""

    vocab_size = None

    def __init__(self, text: list[int], keep: float, seed: int = 0):
        self.text, self.keep, self.rng = text, keep, torch.Generator().manual_seed(seed)

    def propose(self, tokens: list[int], k: int) -> list[int]:
        out = list(self.text[len(tokens) : len(tokens) + k])
        spoil = torch.rand(len(out), generator=self.rng) >= self.keep
        return [(t + 1) % 400 if bad else t for t, bad in zip(out, spoil.tolist())]


class Tracing:
    """Wraps a drafter and keeps every proposal as (tokens so far, drafts): what the widget shows."""

    def __init__(self, drafter):
        self.drafter, self.vocab_size, self.proposals = drafter, drafter.vocab_size, []

    def propose(self, tokens: list[int], k: int) -> list[int]:
        drafts = self.drafter.propose(tokens, k)
        self.proposals.append((len(tokens), list(drafts[:k])))
        return drafts


def rounds_of(tracing: Tracing, output: list[int]) -> list[dict]:
    """Each verify pass of a finished run: its drafts, how many were kept, the model's own token (ids)."""
    out = []
    for length, drafts in tracing.proposals:
        n = 0
        while n < len(drafts) and length + n < len(output) and drafts[n] == output[length + n]:
            n += 1
        if length + n < len(output):
            out.append({"draft": drafts, "n_accepted": n, "next_token": output[length + n]})
    return out


def speedup_sweep(model, drafters: dict, input_ids: torch.Tensor, n_new: int, gammas, rounds: int = 3) -> dict:
    """label -> {speedup: [median paired ratio per gamma], alpha, drafted_per_pass: [drafts proposed per verify pass,
    per gamma]}: each drafter factory against plain cached greedy decoding of the same prompt, plain and speculative
    timed one after the other in every round."""
    from kvlib.kv_cache import KVCache  # noqa: PLC0415 (late binding: runs the learner's code)
    from kvlib.speculative import speculative_generate  # noqa: PLC0415 (late binding: runs the learner's code)

    cache = KVCache(model.config, max_seq_len=input_ids.shape[1] + n_new + max(gammas) + 1)
    out = {}
    for label, make in drafters.items():
        ratios, drafted, accepted, per_pass = {g: [] for g in gammas}, 0, 0, {g: [] for g in gammas}
        for _ in range(rounds):
            for g in gammas:
                start = time.perf_counter()
                want = plain_greedy(model, input_ids, n_new, cache)
                plain_s = time.perf_counter() - start
                counted = Counted(model)
                drafter = make()
                start = time.perf_counter()
                got = speculative_generate(counted, drafter, input_ids, n_new, g, cache=cache)
                ratios[g].append(plain_s / (time.perf_counter() - start))
                if not torch.equal(got, want):
                    raise AssertionError(f"{label}, gamma {g}: speculative decoding changed the tokens")
                a, checked, proposed = counted.acceptance(got.shape[1])
                accepted, drafted = accepted + a, drafted + checked
                per_pass[g].append(proposed / max(len(counted.fed) - 1, 1))  # the first forward is the prefill
        out[label] = {
            "speedup": [statistics.median(ratios[g]) for g in gammas],
            "alpha": accepted / drafted if drafted else 0.0,
            "drafted_per_pass": [statistics.fmean(per_pass[g]) for g in gammas],
        }
    return out


def bench_spec(threads: int = 1, quick: bool = False, max_new_tokens: int | None = None) -> dict:
    from kvlib.kv_cache import KVCache  # noqa: PLC0415 (late binding: runs the learner's code)
    from kvlib.speculative import LookupDrafter, ModelDrafter, speculative_generate  # noqa: PLC0415 (late binding: runs the learner's code)

    model, tokenizer = load_tiny()
    draft_model, _ = load_draft()
    n_new = max_new_tokens or (16 if quick else 64)
    gammas = (1, 3) if quick else GAMMAS
    rounds = 2 if quick else 5
    items = corpus.eval_prompts("held_out", stride=137)[:: 62 if quick else 16]  # one country per template
    prompts = {
        "model": [torch.tensor([tokenizer.encode(it.prompt)]) for it in items],
        "lookup": [repeating_prompt(tokenizer)],
    }
    ways = {"model": lambda: ModelDrafter(draft_model, max_seq_len=512), "lookup": lambda: LookupDrafter(3)}
    results: dict = {
        way: {g: {"ratios": [], "passes": 0, "tokens": 0, "drafted": 0, "checked": 0, "accepted": 0} for g in gammas}
        for way in ways
    }
    identical = True
    with num_threads(threads):
        cache = KVCache(model.config, max_seq_len=512)
        for _ in range(rounds):  # each round: every way on every prompt, plain decoding timed beside it
            for way, make in ways.items():
                for ids in prompts[way]:
                    start = time.perf_counter()
                    want = plain_greedy(model, ids, n_new, cache)
                    plain_s = time.perf_counter() - start
                    for g in gammas:
                        counted, drafter = Counted(model), make()
                        start = time.perf_counter()
                        got = speculative_generate(counted, drafter, ids, n_new, g, cache=cache)
                        spec_s = time.perf_counter() - start
                        identical &= torch.equal(got, want)
                        r = results[way][g]
                        r["ratios"].append(plain_s / spec_s)
                        r["passes"] += len(counted.fed)
                        r["tokens"] += n_new
                        accepted, checked, drafted = counted.acceptance(got.shape[1])
                        r["accepted"], r["checked"], r["drafted"] = (
                            r["accepted"] + accepted,
                            r["checked"] + checked,
                            r["drafted"] + drafted,
                        )
        # the cost ratio c: a draft step over a model step (decode, one token, at kv_len 32), paired per round
        text = list(range(400)) * 2
        steps = paired_medians(
            {
                "model": _step(model, 32, 1, KVCache),
                "draft": _step(draft_model, 32, 1, KVCache),
                "lookup": lambda: LookupDrafter(3).propose(text, 4),
            },
            rounds=3 if quick else 15,
        )
        fed = (1, 2, 4, 8, 16)
        by_tokens = paired_medians({t: _step(model, 64, t, KVCache) for t in fed}, rounds=3 if quick else 11)
        bandwidth = measure_bandwidth(n_bytes=(16 << 20) if quick else (128 << 20), threads=None, repeats=3)[
            "bandwidth"
        ]
        flops = measure_matmul_flops(n=256 if quick else 512, threads=None, repeats=3)["flops"]
    cost = {"model": steps["ratio"]["draft"], "lookup": steps["ratio"]["lookup"]}
    table = {}
    for way, per_gamma in results.items():
        table[way] = []
        for g, r in per_gamma.items():
            alpha = r["accepted"] / r["checked"] if r["checked"] else 0.0
            table[way].append(
                {
                    "gamma": g,
                    "alpha": alpha,
                    "tokens_per_pass": r["tokens"] / r["passes"],
                    "drafted_per_pass": r["drafted"] / max(1, r["passes"] - 1),
                    "formula_tokens_per_pass": alpha_formula(alpha, g),
                    "predicted_speedup": predicted_speedup(alpha, g, cost[way]),
                    "speedup": statistics.median(r["ratios"]),
                    "speedup_min_max": (min(r["ratios"]), max(r["ratios"])),
                }
            )
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    roofline = {
        t: max(weight_bytes / bandwidth, 2 * model.num_params() * t / flops) for t in fed
    }  # seconds: the step waits on its weights until T tokens' FLOPs take longer
    goals = {}
    for way, goal in GOALS.items():
        best = max(table[way], key=lambda row: row["speedup"])
        goals[way] = {
            "goal": goal,
            "best_gamma": best["gamma"],
            "speedup": best["speedup"],
            "met": best["speedup"] >= goal,
        }
    return {
        "table": table,
        "cost_ratio": cost,
        "step_seconds": steps["seconds"],
        "forward_by_tokens": by_tokens["seconds"],
        "forward_ratio_by_tokens": by_tokens["ratio"],
        "roofline_by_tokens": roofline,
        "bandwidth": bandwidth,
        "matmul_flops": flops,
        "weight_bytes": weight_bytes,
        "identical": bool(identical),
        "goals": goals,
        "prompts": {way: len(p) for way, p in prompts.items()},
        "max_new_tokens": n_new,
        "rounds": rounds,
        "record": environment("cpu", threads=threads, dtype="float32"),
        "quick": quick,
    }


def format_spec(report: dict) -> str:
    lines = ["kvlib bench spec" + (" --quick (a smoke test: too small to trust)" if report.get("quick") else "")]
    rec = report["record"]
    lines.append(f"{rec['device']}, {rec['threads']} thread(s), torch {rec['torch']}, float32")
    c = report["cost_ratio"]
    lines.append(
        f"cost ratio c: drafter model {c['model']:.3f} (draft step {report['step_seconds']['draft'] * 1e3:.2f} ms, "
        f"model step {report['step_seconds']['model'] * 1e3:.2f} ms), prompt lookup {c['lookup']:.4f}"
    )
    for way, name in (
        ("model", "drafter model (assets/draft)"),
        ("lookup", "prompt lookup, n=3, on a repeating prompt"),
    ):
        lines.append(
            f"\n{name}: {report['prompts'][way]} prompt(s), {report['max_new_tokens']} new tokens, {report['rounds']} rounds"
        )
        lines.append("gamma  alpha  drafted/pass  tokens/pass  formula  speedup predicted  measured (min-max)")
        for r in report["table"][way]:
            lo, hi = r["speedup_min_max"]
            lines.append(
                f"{r['gamma']:>5}  {r['alpha']:.3f}  {r['drafted_per_pass']:>12.2f}  {r['tokens_per_pass']:>11.2f}"
                f"  {r['formula_tokens_per_pass']:>7.2f}"
                f"  {r['predicted_speedup']:>17.2f}  {r['speedup']:.2f}x ({lo:.2f}-{hi:.2f})"
            )
        g = report["goals"][way]
        verdict = "met" if g["met"] else "missed"
        lines.append(f"goal {g['goal']}x: {verdict}, {g['speedup']:.2f}x at gamma {g['best_gamma']}")
    lines.append(f"\ntokens identical to plain greedy decoding: {'yes' if report['identical'] else 'NO'}")
    lines.append(
        f"\none forward of the tiny model against tokens fed at once (kv_len 64); roofline from {report['bandwidth'] / 1e9:.1f} "
        f"GB/s and {report['matmul_flops'] / 1e9:.1f} GFLOP/s, {report['weight_bytes'] / 1e6:.1f} MB of weights:"
    )
    for t, s in report["forward_by_tokens"].items():
        ratio, roof = report["forward_ratio_by_tokens"][t], report["roofline_by_tokens"][t]
        lines.append(
            f"  {t:>2} tokens: {s * 1e3:6.2f} ms ({ratio:.2f}x one token, paired); roofline {roof * 1e3:.3f} ms "
            f"({roof / report['roofline_by_tokens'][1]:.2f}x)"
        )
    return "\n".join(lines)
