"""`kvlib bench spec`: speculative decoding on this machine, against the formula and the roofline.

For a drafter model (assets/draft) and for prompt lookup, at several gamma, paired and interleaved
with plain cached greedy decoding of the same prompts: the model's forward passes per token, the
acceptance rate alpha, tokens per model pass beside exercise 10.5's prediction from alpha, the cost
ratio c of a draft step to a model step, and the speedup Leviathan et al. predict (10.5's tokens per
pass over the cost of a round, gamma c + 1 model steps) beside the measured one. Then one forward pass's
time against the tokens fed at once (1 ... 16), beside notebook 05's roofline. Every run checks
that the tokens equal plain greedy decoding's. One thread by default.

Prompt lookup runs on two prompts, each printed with what it is (WAY_TITLES): repeating_prompt, whose
prompt repeats but whose continuation does not (the tiny model writes a record of its own instead of
copying one), and own_document_prompt, the model's own greedy text given back with its beginning again,
whose continuation does repeat the context. copied_share measures, without a drafter, how much
of each continuation repeats earlier text; lookup_counts counts (no clock) what other lookup policies
(shorter n-grams, the earliest occurrence, the prompt alone as source) would propose and keep.
"""

from __future__ import annotations

import statistics
import time

import torch

from kvlib.core import progress
from kvlib.core.weights import load_draft, load_tiny
from kvlib.measure.machine import measure_bandwidth, measure_matmul_flops
from kvlib.measure.timing import environment, measure, num_threads
from kvlib.study import corpus

GAMMAS = (1, 2, 3, 4, 6, 8)
# issue 28: tokens/s against plain cached greedy decoding, at the best gamma: 1.5x with a drafter model,
# 2x for prompt lookup "on a prompt that repeats text" (judged on both lookup prompts, each reported)
GOALS = {"model": 1.5, "lookup": 2.0, "lookup_document": 2.0}
DOCUMENT_TOKENS = 192  # the model's own document: 3x the 64 tokens the bench makes, so a copy never runs out


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


class Clocked(Counted):
    """Counted, timing each forward pass too: calls, (start, seconds) in the order called (perf_counter's clock)."""

    def __init__(self, model):
        super().__init__(model)
        self.calls = []

    def __call__(self, ids, past_key_values=None):
        start = time.perf_counter()
        out = super().__call__(ids, past_key_values)
        self.calls.append((start, time.perf_counter() - start))
        return out


class ClockedDrafter:
    """A drafter, timing each proposal: calls, (start, seconds) in the order called (perf_counter's clock)."""

    def __init__(self, drafter):
        self.drafter, self.vocab_size, self.calls = drafter, drafter.vocab_size, []

    def propose(self, tokens: list[int], k: int) -> list[int]:
        start = time.perf_counter()
        drafts = self.drafter.propose(tokens, k)
        self.calls.append((start, time.perf_counter() - start))
        return drafts


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
    """Training records, written twice, then the first half of the first again: a prompt that repeats.

    Its continuation does not: the tiny model, trained on rows of records drawn at random (a record comes back
    within a row in well under 1% of rows), does not copy the repeated records but writes one of its own
    ("...capital of Serbia?" where the prompt's record asks about France), so prompt lookup finds little here."""
    records = corpus.records("train")[:: len(corpus.records("train")) // n_records][:n_records]
    text = "\n".join(records) + "\n"
    return torch.tensor([tokenizer.encode(text * times + records[0][: len(records[0]) // 2])])


def own_document_prompt(
    model, tokenizer, n_tokens: int = DOCUMENT_TOKENS, start: str = corpus.ANCHORS[1][0]
) -> torch.Tensor:
    """A document the model wrote itself, given back with its beginning again, as an editing task gives one back.

    The document is `start` (the course's English anchor question) and the model's greedy text after it,
    n_tokens tokens, cut after its last full line; the prompt is the document, then `start` again. Whether the
    model copies or writes the same text again where its context reads the same, the continuation repeats the
    context (copied_share says how much). Full recompute (train.greedy_text): no learner code; one
    thread, so the same document whatever the caller's thread count (a near tie could otherwise flip a token)."""
    from kvlib.study.train import greedy_text  # noqa: PLC0415 (start-up time: the training module is large)

    with num_threads(1):
        written = start + greedy_text(model, tokenizer, start, n_tokens)
    if "\n" not in written[len(start) :]:
        raise ValueError(f"the model wrote no full line in {n_tokens} tokens after {start!r}: no document to give back")
    document = written[: written.rindex("\n") + 1]
    return torch.tensor([tokenizer.encode(document + start)])


def copied_share(tokens: list[int], start: int, min_span: int = 4) -> tuple[float, list[int]]:
    """How much of tokens[start:] repeats earlier text, found without any drafter.

    Walks tokens[start:] left to right, taking at each place the longest run that also occurs earlier (it may
    overlap the place, as a copy of a copy does); runs of min_span tokens or more count as copied, shorter ones
    as new tokens. Returns (copied tokens / len(tokens[start:]), the copied runs' lengths in order)."""
    runs, t, copied = [], start, 0
    while t < len(tokens):
        best = 0
        for s in range(t):
            n = 0
            while t + n < len(tokens) and tokens[s + n] == tokens[t + n]:
                n += 1
            best = max(best, n)
        if best >= min_span:
            runs.append(best)
            copied, t = copied + best, t + best
        else:
            t += 1
    return copied / max(1, len(tokens) - start), runs


def lookup_policy(
    tokens: list[int],
    k: int,
    n: int = 3,
    n_min: int | None = None,
    latest: bool = False,
    whole: bool = False,
    source: int | None = None,
) -> list[int]:
    """Prompt lookup with the choices published drafters make differently (none of it the learner's code).

    Tries the last n tokens, then n - 1, ... down to n_min (default n: no shorter n-gram); among the earlier
    occurrences takes the earliest (the default, as Saxena's reference and vLLM's ngram proposer do) or, with
    latest=True, the latest; proposes up to k tokens, or, with whole=True, only a match followed by k whole
    tokens (Saxena's); source: look only in tokens[:source] (the prompt), else in all the text so far."""
    tokens = list(tokens)
    end = len(tokens) if source is None else source
    last = min(end, len(tokens) - 1)  # a window must end by here: inside the source, and not be the tail itself
    for size in range(n, (n if n_min is None else n_min) - 1, -1):
        index: dict[tuple, list[int]] = {}  # every window of this size -> where it starts, in order
        for s, window in enumerate(zip(*(tokens[i:] for i in range(size)))):
            index.setdefault(window, []).append(s)
        hits = [
            s for s in index.get(tuple(tokens[-size:]), []) if s + size <= last and (not whole or s + size + k <= end)
        ]
        if hits:
            s = hits[-1] if latest else hits[0]
            return tokens[s + size : min(s + size + k, end)]
    return []


class PolicyDrafter:
    """lookup_policy as a drafter; `prompt_len` is the source's end for source="prompt"."""

    vocab_size = None

    def __init__(self, prompt_len: int | None = None, **policy):
        self.policy = dict(policy)
        if self.policy.get("source") == "prompt":
            self.policy["source"] = prompt_len

    def propose(self, tokens: list[int], k: int) -> list[int]:
        return lookup_policy(tokens, k, **self.policy)


# name -> lookup_policy's arguments; None: the learner's own prompt_lookup (exercise 10.4) through LookupDrafter(3)
LOOKUP_POLICIES: dict[str, dict | None] = {
    "n=3, latest (exercise 10.4)": None,
    "n=2, latest": {"n": 2, "latest": True},
    "n=6, latest": {"n": 6, "latest": True},
    "n=3, earliest": {"n": 3},
    "n=3 down to 1, latest": {"n": 3, "n_min": 1, "latest": True},
    "n=8 down to 1, latest": {"n": 8, "n_min": 1, "latest": True},
    "n=3 down to 1, earliest, k or none": {"n": 3, "n_min": 1, "whole": True},
    "n=3, latest, prompt only": {"n": 3, "source": "prompt", "latest": True},
}


def counts(model, drafter, input_ids: torch.Tensor, n_new: int, gamma: int, cache, want: torch.Tensor) -> dict:
    """One speculative run, counted (no clock): alpha, tokens proposed and accepted per verify pass, tokens per
    model pass (the prefill's token included, as in the timed table). Raises if the tokens are not want's."""
    from kvlib.speculative import speculative_generate  # noqa: PLC0415 (late binding: runs the learner's code)

    counted = Counted(model)
    got = speculative_generate(counted, drafter, input_ids, n_new, gamma, cache=cache)
    if not torch.equal(got, want):
        raise AssertionError(f"gamma {gamma}: speculative decoding changed the tokens")
    accepted, checked, drafted = counted.acceptance(got.shape[1])
    verify = max(1, len(counted.fed) - 1)
    return {
        "alpha": accepted / checked if checked else 0.0,
        "proposed_per_pass": drafted / verify,
        "accepted_per_pass": accepted / verify,
        "tokens_per_pass": n_new / len(counted.fed),
    }


def lookup_counts(model, prompts: dict, n_new: int, gammas=(4, 8)) -> dict:
    """prompt name -> policy name -> gamma -> counts(): every LOOKUP_POLICIES entry on every prompt, no clock."""
    from kvlib.kv_cache import KVCache  # noqa: PLC0415 (late binding: runs the learner's code)
    from kvlib.speculative import LookupDrafter  # noqa: PLC0415 (late binding: runs the learner's code)

    out = {}
    for name, ids in prompts.items():
        cache = KVCache(model.config, max_seq_len=ids.shape[1] + n_new)
        want = plain_greedy(model, ids, n_new, cache)
        out[name] = {}
        for policy, args in LOOKUP_POLICIES.items():
            out[name][policy] = {
                g: counts(
                    model,
                    LookupDrafter(3) if args is None else PolicyDrafter(ids.shape[1], **args),
                    ids,
                    n_new,
                    g,
                    cache,
                    want,
                )
                for g in gammas
            }
    return out


def most_kept(p: torch.Tensor, q: torch.Tensor) -> float:
    """The largest share of drafts sampled from q that any rule keeping the output distributed as p can keep: the
    overlap of the two distributions, sum(min(p, q)) (Leviathan et al., arXiv 2211.17192: their acceptance rate). Notebook 10b
    prints it beside the share 10.3's rule keeps, without showing the rule its formula points to."""
    return float(torch.minimum(p, q).sum())


def predicted_speedup(alpha: float, gamma: int, c: float) -> float:
    """Leviathan et al.'s speedup: the learner's tokens per pass (10.5) over the cost of a round in model steps."""
    from kvlib.speculative import tokens_per_pass  # noqa: PLC0415 (late binding: runs the learner's code)

    return tokens_per_pass(min(1.0, max(0.0, alpha)), gamma) / (gamma * c + 1)


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
    plus name -> median of the per-round ratio to the first fn: what a shared machine can hold, and name -> every
    round's ratio ("rounds", for claims)."""
    per_round = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            per_round[name].append(measure(fn, warmup=1, repeats=repeats, threads=None).median)
    first = next(iter(fns))
    ratios = {name: [a / b for a, b in zip(v, per_round[first])] for name, v in per_round.items()}
    return {
        "seconds": {name: statistics.median(v) for name, v in per_round.items()},
        "ratio": {name: statistics.median(r) for name, r in ratios.items()},
        "rounds": ratios,
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


def round_parts(model, make_drafter, input_ids: torch.Tensor, n_new: int, gamma: int, rounds: int = 3) -> dict:
    """What a round of speculative decoding costs, taken apart inside the run, in plain decode steps (the median
    forward of a plain run timed just before, past its prefill): name -> one value per timed run, each the median
    over the run's rounds. A round runs from one verify pass's start to the next's: "verify" the model's forward over
    the newest token and the drafts, "drafts" the drafter's proposal for the next pass, "rest" the round's other work
    (comparing, rewinding, making lists and tensors), "round" all of it. Raises if the tokens differ."""
    from kvlib.kv_cache import KVCache  # noqa: PLC0415 (late binding: runs the learner's code)
    from kvlib.speculative import speculative_generate  # noqa: PLC0415 (late binding: runs the learner's code)

    cache = KVCache(model.config, max_seq_len=input_ids.shape[1] + n_new + gamma + 1)
    parts = {"round": [], "verify": [], "drafts": [], "rest": []}
    for _ in range(rounds):
        plain = Clocked(model)
        want = plain_greedy(plain, input_ids, n_new, cache)
        step = statistics.median(seconds for _, seconds in plain.calls[1:])
        timed, drafter = Clocked(model), ClockedDrafter(make_drafter())
        got = speculative_generate(timed, drafter, input_ids, n_new, gamma, cache=cache)
        if not torch.equal(got, want):
            raise AssertionError(f"gamma {gamma}: speculative decoding changed the tokens")
        each = []  # (round, verify, drafts) between consecutive verify passes (the first forward is the prefill)
        for (start, verify), (end, _) in zip(timed.calls[1:], timed.calls[2:]):
            drafts = sum(seconds for at, seconds in drafter.calls if start <= at < end)
            each.append((end - start, verify, drafts))
        for name, values in (
            ("round", [r for r, _, _ in each]),
            ("verify", [v for _, v, _ in each]),
            ("drafts", [d for _, _, d in each]),
            ("rest", [r - v - d for r, v, d in each]),
        ):
            parts[name].append(statistics.median(values) / step)
    return parts


def speedup_sweep(model, drafters: dict, input_ids: torch.Tensor, n_new: int, gammas, rounds: int = 3) -> dict:
    """label -> {speedup: [median paired ratio per gamma], speedup_rounds: [every round's, per gamma], alpha,
    drafted_per_pass, tokens_per_pass, speedup_cap: [per gamma]}: each drafter factory against plain cached greedy
    decoding of the same prompt, plain and speculative timed one after the other in every round. alpha, drafts
    proposed per verify pass and tokens per model pass (the prefill's token included) are counts: the same in every
    round; speedup_cap, tokens per verify pass, bounds the speedup (a verify pass costs at least a decode step)."""
    from kvlib.kv_cache import KVCache  # noqa: PLC0415 (late binding: runs the learner's code)
    from kvlib.speculative import speculative_generate  # noqa: PLC0415 (late binding: runs the learner's code)

    cache = KVCache(model.config, max_seq_len=input_ids.shape[1] + n_new + max(gammas) + 1)
    out = {}
    for label, make in drafters.items():
        ratios, drafted, accepted, proposed_per_pass, per_pass, cap = {g: [] for g in gammas}, 0, 0, {}, {}, {}
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
                proposed_per_pass[g] = proposed / max(len(counted.fed) - 1, 1)  # the first forward is the prefill
                per_pass[g] = n_new / len(counted.fed)
                cap[g] = (got.shape[1] - input_ids.shape[1] - 1) / max(1, len(counted.fed) - 1)
        out[label] = {
            "speedup": [statistics.median(ratios[g]) for g in gammas],
            "speedup_rounds": [ratios[g] for g in gammas],  # every round's ratio, paired: for claims
            "alpha": accepted / drafted if drafted else 0.0,
            "drafted_per_pass": [proposed_per_pass[g] for g in gammas],
            "tokens_per_pass": [per_pass[g] for g in gammas],
            "speedup_cap": [cap[g] for g in gammas],
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
        "lookup_document": [own_document_prompt(model, tokenizer)],
    }
    ways = {
        "model": lambda: ModelDrafter(draft_model, max_seq_len=512),
        "lookup": lambda: LookupDrafter(3),
        "lookup_document": lambda: LookupDrafter(3),
    }
    results: dict = {
        way: {g: {"ratios": [], "passes": 0, "tokens": 0, "drafted": 0, "checked": 0, "accepted": 0} for g in gammas}
        for way in ways
    }
    copied: dict = {way: [] for way in ways}  # per prompt: (share of the continuation copied, the copied runs)
    identical = True
    runs = rounds * sum(len(p) for p in prompts.values())  # each: plain decoding, then speculative at every gamma
    with num_threads(threads), progress.bar(desc="kvlib bench spec", total=runs + 4, unit="run") as bar:
        bar.set_postfix_str(f"gamma {', '.join(map(str, gammas))}: every drafter on every prompt, {rounds} rounds")
        cache = KVCache(model.config, max_seq_len=512)
        for round_ in range(rounds):  # each round: every way on every prompt, plain decoding timed beside it
            for way, make in ways.items():
                for ids in prompts[way]:
                    start = time.perf_counter()
                    want = plain_greedy(model, ids, n_new, cache)
                    plain_s = time.perf_counter() - start
                    if round_ == 0:
                        copied[way].append(copied_share(want[0].tolist(), ids.shape[1]))
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
                    bar.update()
        # the cost ratio c: a draft step over a model step (decode, one token, at kv_len 32), paired per round
        bar.set_postfix_str("the cost ratio c")
        text = list(range(400)) * 2
        steps = paired_medians(
            {
                "model": _step(model, 32, 1, KVCache),
                "draft": _step(draft_model, 32, 1, KVCache),
                "lookup": lambda: LookupDrafter(3).propose(text, 4),
            },
            rounds=3 if quick else 15,
        )
        bar.update()
        bar.set_postfix_str("a forward against tokens fed at once")
        fed = (1, 2, 4, 8, 16)
        by_tokens = paired_medians({t: _step(model, 64, t, KVCache) for t in fed}, rounds=3 if quick else 11)
        bar.update()
        bar.set_postfix_str("prompt lookup's choices counted")
        counted_policies = lookup_counts(
            model,
            {"repeating_prompt": prompts["lookup"][0], "own_document_prompt": prompts["lookup_document"][0]},
            n_new,
        )
        bar.update()
        bar.set_postfix_str("bandwidth and matmul FLOP/s")
        bandwidth = measure_bandwidth(n_bytes=(16 << 20) if quick else (128 << 20), threads=None, repeats=3)[
            "bandwidth"
        ]
        flops = measure_matmul_flops(n=256 if quick else 512, threads=None, repeats=3)["flops"]
        bar.update()
    cost = {"model": steps["ratio"]["draft"], "lookup": steps["ratio"]["lookup"]}
    cost["lookup_document"] = cost["lookup"]
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
                    "accepted_per_pass": r["accepted"] / max(1, r["passes"] - 1),
                    "formula_tokens_per_pass": predicted_speedup(alpha, g, 0.0),  # 10.5's prediction
                    "predicted_speedup": predicted_speedup(alpha, g, cost[way]),
                    "speedup": statistics.median(r["ratios"]),
                    "speedup_min_max": (min(r["ratios"]), max(r["ratios"])),
                }
            )
            row = table[way][-1]
            # A verify pass costs at least a decode step, and both ways share the prefill: the speedup cannot pass the
            # tokens made per verify pass, 1 + accepted per pass. Above it is the clock's noise.
            row["speedup_cap"] = 1 + row["accepted_per_pass"]
            row["above_cap"] = row["speedup"] > row["speedup_cap"]
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
            "above_cap": best["above_cap"],
            "speedup_cap": best["speedup_cap"],
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
        "prompt_tokens": {way: [p.shape[1] for p in ps] for way, ps in prompts.items()},
        "copied_share": {way: statistics.mean(share for share, _ in c) for way, c in copied.items()},
        "copied_runs": {way: [runs for _, runs in c] for way, c in copied.items()},
        "lookup_counts": counted_policies,
        "max_new_tokens": n_new,
        "rounds": rounds,
        "record": environment("cpu", threads=threads, dtype="float32"),
        "quick": quick,
    }


# what each way's prompts are, and why: printed above its table
WAY_TITLES = {
    "model": (
        "drafter model (assets/draft)",
        "one held-out prompt of every 16th template: the capital questions the course asks throughout",
    ),
    "lookup": (
        "prompt lookup (exercise 10.4, n=3) on repeating_prompt",
        "four training records written twice, then half of the first again. The prompt repeats, its continuation "
        "does not: the tiny model, trained on records drawn at random, writes a record of its own instead of "
        "copying one, so lookup finds little to propose: a case where lookup does not pay",
    ),
    "lookup_document": (
        "prompt lookup (exercise 10.4, n=3) on own_document_prompt",
        f"the model's own greedy text ({DOCUMENT_TOKENS} tokens after the course's English anchor question, cut "
        "after its last full line) given back, then the anchor again, as an editing task gives a document back: "
        "the continuation repeats the context, as in the uses lookup is made for (code edits, quoting summaries)",
    ),
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
    for way, (name, what) in WAY_TITLES.items():
        if way not in report["table"]:
            continue
        lines.append(
            f"\n{name}: {report['prompts'][way]} prompt(s), {report['max_new_tokens']} new tokens, {report['rounds']} rounds"
        )
        lines.append(f"  ({what})")
        if way != "model":
            runs = report["copied_runs"][way][0]
            lines.append(
                f"  prompt {report['prompt_tokens'][way][0]} tokens; continuation copied from earlier text "
                f"{report['copied_share'][way]:.0%} (runs of 4+ tokens, found without a drafter: {runs})"
            )
        lines.append(
            "gamma  alpha  drafted/pass  accepted/pass  tokens/pass  formula  speedup predicted  cap    measured (min-max)"
        )
        for r in report["table"][way]:
            lo, hi = r["speedup_min_max"]
            lines.append(
                f"{r['gamma']:>5}  {r['alpha']:.3f}  {r['drafted_per_pass']:>12.2f}  {r['accepted_per_pass']:>13.2f}"
                f"  {r['tokens_per_pass']:>11.2f}  {r['formula_tokens_per_pass']:>7.2f}"
                f"  {r['predicted_speedup']:>17.2f}  {r['speedup_cap']:>5.2f}  {r['speedup']:.2f}x ({lo:.2f}-{hi:.2f})"
                + ("  *" if r.get("above_cap") else "")
            )
        if any(r.get("above_cap") for r in report["table"][way]):
            lines.append(
                "  * above its cap, 1 + accepted/pass (a verify pass costs at least a decode step): the clock's noise"
            )
        g = report["goals"][way]
        verdict = "met" if g["met"] else "missed"
        noise = (
            f" (above its cap of {g['speedup_cap']:.2f}x: noise, not a verdict; run again with the machine idle)"
            if g.get("above_cap")
            else ""
        )
        lines.append(f"goal {g['goal']}x: {verdict}, {g['speedup']:.2f}x at gamma {g['best_gamma']}{noise}")
    lines.append(f"\ntokens identical to plain greedy decoding: {'yes' if report['identical'] else 'NO'}")
    if report.get("lookup_counts"):
        lines.append(
            f"\nprompt lookup's choices, counted (no clock; the same on any machine), {report['max_new_tokens']} new "
            "tokens: alpha / proposed per pass / accepted per pass / tokens per pass"
        )
        for prompt, policies in report["lookup_counts"].items():
            gammas = list(next(iter(policies.values())))
            lines.append(f"  {prompt:38s}" + "".join(f"  gamma {g:<21}" for g in gammas))
            for policy, per_gamma in policies.items():
                cells = "".join(
                    f"  {r['alpha']:.2f} / {r['proposed_per_pass']:4.2f} / {r['accepted_per_pass']:4.2f} / "
                    f"{r['tokens_per_pass']:4.2f}"
                    for r in per_gamma.values()
                )
                lines.append(f"    {policy:36s}{cells}")
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
