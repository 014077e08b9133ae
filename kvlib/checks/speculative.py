"""Checks for notebook 10 (kvlib/speculative.py): exercises 10.1-10.5 (10a: 10.1, 10.2; 10b: 10.5, 10.3, 10.4).

The checks hand the learner's code a model that counts its own forward passes (how many tokens each
fed, with or without a cache), a cache of their own (its update and attention are not under test),
and drafters whose proposals they know (in the isolated grader all three stay in the grading process:
the learner's code gets stand-ins, so the count is kept where that code cannot reach it), so the
number of passes a speculative loop needs is computed here, before learner code runs; greedy tokens made without drafting fail on that count. Every
expected token, cache content and distribution is computed before the learner's code runs, from
copies it never receives. Named slips: verifying without the cache or one pass per draft, the bonus
token forgotten, the cache rewound one too far or not far enough, a cache handed in not reset, an end
token inside the accepted drafts or in the prompt, acceptance by rank (top-k) instead of min(1, p/q),
one uniform shared by a round's drafts, resampling from p instead of max(0, p - q), draws not from
the generator passed in, prompt lookup matching the tail itself or the first occurrence, tokens per pass
without the model's token, one term short, or as if every draft were checked.
Sampling checks are chi-squared tests at significance 0.001 with fixed seeds; each replays some rounds
with generators of their own, in two orders, so that only a function of its generator's draws passes.
The texts a message is built from (which case, what a slip is called) go through tr(), so that the catalogue
(kvlib/course/i18n.py) translates them as it does the messages; `kvlib check` adds the hint's pointer.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from kvlib.checks import check
from kvlib.core.model import Decoder, ModelConfig, causal_mask_tensor
from kvlib.course.i18n import tr

CONFIG = ModelConfig(vocab_size=29, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=48, max_seq_len=64)
SIGNIFICANCE = 0.001  # a correct sampler fails a test with this probability; the seeds are fixed, so it never flips

# ---------------------------------------------------------------------------------------------
# The check's own model, cache and drafters


class CheckCache:
    """A plain KV cache (the contract's pos, update, advance, reset, truncate): the learner's 4.1 is not graded here."""

    kvlib_public = ("pos", "max_seq_len", "update", "advance", "reset", "truncate")  # what the graded code may use

    def __init__(self, config: ModelConfig, max_seq_len: int):
        shape = (config.n_layers, 1, config.n_kv_heads, max_seq_len, config.head_dim)
        self.k, self.v = torch.zeros(shape), torch.zeros(shape)
        self.max_seq_len, self.pos = max_seq_len, 0

    def update(self, layer, k_new, v_new):
        end = self.pos + k_new.shape[2]
        self.k[layer, :, :, self.pos : end], self.v[layer, :, :, self.pos : end] = k_new, v_new
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]

    def advance(self, seq_len: int) -> None:
        if self.pos + seq_len > self.max_seq_len:
            raise ValueError(f"advancing by {seq_len} from {self.pos} runs past max_seq_len={self.max_seq_len}")
        self.pos += seq_len

    def reset(self) -> None:
        self.pos = 0

    def truncate(self, pos: int) -> None:
        if isinstance(pos, bool) or not isinstance(pos, int) or not 0 <= pos <= self.pos:
            raise ValueError(f"truncate(pos) needs 0 <= pos <= {self.pos} (the tokens held), got {pos!r}")
        self.pos = pos

    @staticmethod
    def attention(attn, x, cache, layer, rope_cos, rope_sin):
        T = x.shape[1]
        cos, sin = rope_cos[cache.pos : cache.pos + T], rope_sin[cache.pos : cache.pos + T]
        q = attn.project_q(x, cos, sin)
        k, v = cache.update(layer, *attn.project_kv(x, cos, sin))
        mask = causal_mask_tensor(T, k.shape[2])
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return attn.o_proj(out.transpose(1, 2).reshape(x.shape[0], T, -1))


def counted(decoder: Decoder):
    """(model, calls): model(ids, past_key_values=cache) runs decoder and appends (seq_len, had_cache, pos) to calls.

    The decoder sits in a closure, not an attribute, so the learner's code reaches it only by calling the model.
    """
    calls: list[tuple[int, bool, int | None]] = []

    class Model:
        __slots__ = ()
        config = decoder.config
        kvlib_public = ("config",)  # and the call: in the isolated grader every call is counted here, by the grader

        def __call__(self, input_ids, pos=0, past_key_values=None):
            calls.append((int(input_ids.shape[1]), past_key_values is not None, getattr(past_key_values, "pos", None)))
            with torch.inference_mode():
                return decoder(input_ids, pos=pos, past_key_values=past_key_values)

        def __repr__(self):
            return "<the check's model: called as model(ids, past_key_values=cache)>"

    return Model(), calls


def make_model(rng) -> Decoder:
    torch.manual_seed(int(rng.integers(1 << 30)))
    return Decoder(CONFIG).eval()


def greedy(decoder: Decoder, prompt: list[int], n: int, eos: int | None = None) -> list[int]:
    """n greedy tokens after prompt (recomputed each step, no cache): what the speculative loop must return."""
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(n):
            ids.append(int(decoder(torch.tensor([ids]))[0, -1].argmax()))
            if ids[-1] == eos:
                break
    return ids[len(prompt) :]


def plain_cache(decoder: Decoder, tokens: list[int], max_seq_len: int) -> CheckCache:
    """A cache filled by one plain pass over tokens: what a correctly rewound cache holds."""
    cache = CheckCache(decoder.config, max_seq_len)
    with torch.inference_mode():
        decoder(torch.tensor([tokens]), past_key_values=cache)
    return cache


class OracleDrafter:
    """Proposes the true greedy continuation with one token spoiled at a place fixed by the text's length."""

    kvlib_public = ("propose", "vocab_size")  # not the sequence it knows: the grader answers only these

    def __init__(self, sequence: list[int], gamma: int, spoil: bool = True):
        self.sequence, self.gamma, self.spoil, self.vocab_size = sequence, gamma, spoil, CONFIG.vocab_size
        self.asked: list[tuple[int, int]] = []

    def propose(self, tokens, k):
        L = len(tokens)
        self.asked.append((L, k))
        out = list(self.sequence[L : L + k])
        bad = (L * 7) % (self.gamma + 2)  # some rounds keep everything, some lose the first draft
        if self.spoil and bad < len(out):
            out[bad] = (out[bad] + 1) % CONFIG.vocab_size
        return out


def expected_passes(drafter_factory, sequence, prompt_len, n_new, gamma, whole_prompt=True) -> tuple[int, list[int]]:
    """Forward passes of the policy 'draft min(gamma, left - 1), verify once', and tokens kept per pass: after a prefill
    of the whole prompt (its pass makes the first token), or of all of it but its last token (whole_prompt=False:
    the first verify pass carries that token with the first drafts, and the prefill makes none)."""
    drafter = drafter_factory()
    new, passes, kept = ([sequence[prompt_len]], 1, [1]) if whole_prompt else ([], 1, [0])
    while len(new) < n_new:
        k = min(gamma, n_new - len(new) - 1)
        draft = drafter.propose(sequence[: prompt_len + len(new)], k)[:k] if k else []
        truth = sequence[prompt_len + len(new) : prompt_len + len(new) + len(draft) + 1]
        n = 0
        while n < len(draft) and draft[n] == truth[n]:
            n += 1
        new += truth[: n + 1]
        passes += 1
        kept.append(n + 1)
    return passes, kept


def _cache_diagnosis(cache, want_pos: int, cause: bool = True) -> str | None:
    """What is wrong with the cache's length: the count, and with cause=True why (10.2); 10.1, a find-and-fix
    exercise, is shown the symptom alone, the tokens it should hold."""
    if cache.pos == want_pos:
        return None
    if not cause:
        return tr(
            "on return the cache holds {pos} tokens, {want} expected: every token before last_token, last_token and "
            "the accepted drafts",
            pos=cache.pos,
            want=want_pos,
        )
    if cache.pos > want_pos:
        more = cache.pos - want_pos
        why = (
            tr("the first rejected draft is still in it (one too few rewound)")
            if more == 1
            else tr("rejected drafts stay in it")
        )
        return tr("the cache holds {pos} tokens, {want} expected: {why}", pos=cache.pos, want=want_pos, why=why)
    if want_pos - cache.pos == 1:
        return tr(
            "the cache holds {pos} tokens, {want} expected: it was rewound one too many, and dropped last_token or "
            "an accepted draft",
            pos=cache.pos,
            want=want_pos,
        )
    return tr(
        "the cache holds {pos} tokens, {want} expected: it was rewound one too many or more, and dropped last_token "
        "or an accepted draft",
        pos=cache.pos,
        want=want_pos,
    )


def _same_contents(cache, reference, upto: int) -> bool:
    return torch.allclose(cache.k[..., :upto, :], reference.k[..., :upto, :], atol=1e-5) and torch.allclose(
        cache.v[..., :upto, :], reference.v[..., :upto, :], atol=1e-5
    )


# ---------------------------------------------------------------------------------------------
# 10.1 verify_greedy


def _verify_case(sp, decoder, prompt, last, draft, truth, label):
    cache = plain_cache(decoder, prompt, 40)
    start = cache.pos
    n_want = 0
    while n_want < len(draft) and draft[n_want] == truth[n_want]:
        n_want += 1
    reference = plain_cache(decoder, prompt + [last] + draft[:n_want], 40)
    model, calls = counted(decoder)
    got = sp.verify_greedy(model, cache, last, list(draft))
    assert isinstance(got, tuple) and len(got) == 2, f"verify_greedy must return (n_accepted, next_token), got {got!r}"
    n, nxt = int(got[0]), int(got[1])
    # 10.1 ships broken (find and fix): each message shows what the call did, beside what greedy decoding does
    assert calls, f"{label}: the model was never called (the contract: one forward pass)"
    if not all(had for _, had, _ in calls):
        raise AssertionError(f"{label}: the model ran without the cache (no past_key_values)")
    assert len(calls) == 1, f"{label}: {len(calls)} forward passes for {len(draft)} drafts, where one is the contract"
    assert calls[0][0] == len(draft) + 1, (
        f"{label}: the forward pass fed {calls[0][0]} tokens, for last_token and {len(draft)} drafts"
    )
    if n != n_want or nxt != truth[n_want]:
        kept = list(draft[: max(0, min(n, len(draft)))]) + [nxt]
        raise AssertionError(
            f"{label}: drafts {list(draft)}, returned ({n}, {nxt}): the text would go on {kept}, where greedy "
            f"decoding writes {truth[: max(len(kept), n_want + 1)]}"
        )
    problem = _cache_diagnosis(cache, start + n_want + 1, cause=False)
    assert problem is None, tr("{where}: {why}", where=label, why=problem)
    assert _same_contents(cache, reference, start + n_want + 1), (
        f"{label}: the cache's keys and values differ from a cache filled by plain decoding of the kept tokens"
    )


@check("10.1")
def verify_greedy_keeps_what_greedy_decoding_keeps(sp, rng):
    """Check verify_greedy with all drafts right (the bonus token), the first wrong, one in the middle wrong, none,
    and one wrong followed by one the model agrees with."""
    decoder = make_model(rng)
    prompt = [int(t) for t in rng.integers(CONFIG.vocab_size, size=7)]
    seq = prompt + greedy(decoder, prompt, 7)
    last, truth = seq[7], seq[8:]  # truth[i]: the greedy token after last_token and truth[:i]
    V = CONFIG.vocab_size
    wrong = (truth[1] + 1) % V
    after_wrong = greedy(decoder, [*prompt, last, truth[0], wrong], 1)[0]  # a draft the model agrees with, too late
    for label, draft in (
        (tr("4 correct drafts"), truth[:4]),
        (tr("the first draft wrong"), [(truth[0] + 1) % V, *truth[1:3]]),
        (tr("the third of 5 drafts wrong"), [*truth[:2], (truth[2] + 3) % V, *truth[3:5]]),
        (tr("an empty draft (a plain decode step)"), []),
        (tr("the second draft wrong, the third what the model predicts after it"), [truth[0], wrong, after_wrong]),
    ):
        _verify_case(sp, decoder, prompt, last, list(draft), truth, label)


# ---------------------------------------------------------------------------------------------
# 10.2 speculative_generate


def _generate_case(sp, decoder, prompt, n_new, gamma, spoil=True, eos=None, cache="used"):
    """speculative_generate against greedy decoding, its passes counted. cache: "used" (a cache that held another
    prompt, to be reset first), or None (the learner's code makes its own: only the tokens and passes are judged)."""
    want = greedy(decoder, prompt, n_new, eos)
    sequence = prompt + greedy(decoder, prompt, n_new + gamma + 2)  # what an oracle drafter may look ahead into
    passes = {  # one prefill of the whole prompt, or of all but its last token, then one verify per round
        whole: expected_passes(
            lambda: OracleDrafter(sequence, gamma, spoil), sequence, len(prompt), len(want), gamma, whole
        )[0]
        for whole in (True, False)
    }
    reference = plain_cache(decoder, prompt + want[:-1], 48)
    label = tr("gamma={gamma}, {n} new tokens", gamma=gamma, n=n_new)
    label += tr(", eos_token={eos}", eos=eos) if eos is not None else ""
    label += tr(", cache=None") if cache is None else ""
    model, calls = counted(decoder)
    if cache is not None:  # a cache that held another text: what is in it must not count
        held = [(t + 1) % CONFIG.vocab_size for t in prompt[::-1]]
        cache = plain_cache(decoder, held, 48)
    drafter = OracleDrafter(sequence, gamma, spoil)
    got = sp.speculative_generate(model, drafter, torch.tensor([prompt]), n_new, gamma, eos, cache)
    got = got[0, len(prompt) :].tolist() if isinstance(got, torch.Tensor) and got.dim() == 2 else got
    if calls and calls[0][2]:
        raise AssertionError(
            f"{label}: the cache handed in held {calls[0][2]} tokens of another text, and the first forward pass ran "
            f"at position {calls[0][2]}: the new text attended to the old text's keys and values"
        )
    if eos is not None and isinstance(got, list) and eos in got and got.index(eos) < len(got) - 1:
        raise AssertionError(
            f"{label}: tokens were returned after eos_token (at place {got.index(eos)} of {len(got)}): an end token "
            f"the model made among the accepted drafts of a pass did not end the text"
        )
    if eos in prompt and isinstance(got, list) and len(got) < len(want) and eos not in got:
        raise AssertionError(
            f"{label}: generation stopped after {len(got)} token(s), {len(want)} expected: eos_token is in the "
            f"prompt, and that one was taken for an end token the model made"
        )
    if isinstance(got, list) and len(got) > len(want) and got[: len(want)] == want:
        extra = len(got) - len(want)
        raise AssertionError(
            f"{label}: {len(got)} new tokens returned, {len(want)} wanted: greedy decoding's tokens, and {extra} too "
            f"many: the last round made more tokens than were still wanted (its accepted drafts and the model's own "
            f"token after them)"
        )
    assert got == want, f"{label}: the tokens differ from greedy decoding's: got {got}, expected {want}"
    if not all(had for _, had, _ in calls):
        raise AssertionError(
            f"{label}: a forward pass ran without the cache (no past_key_values): it recomputed the text before it"
        )
    big = [t for t, _, _ in calls[1:] if t > gamma + 1]
    assert not big, f"{label}: a verify pass fed {big[0]} tokens, more than gamma + 1 = {gamma + 1}"
    fewest = passes[calls[0][0] == len(prompt)] if calls else passes[True]
    if len(calls) >= len(want) and fewest < len(want) and all(t == 1 for t, _, _ in calls[1:]):
        raise AssertionError(
            f"{label}: {len(calls)} forward passes for {len(want)} tokens, each after the first fed one token: no "
            f"pass verified a draft (these drafts need {fewest} passes)"
        )
    asked = [k for _, k in drafter.asked]
    if len(calls) != fewest:
        left = [(k, len(want) - (L - len(prompt))) for L, k in drafter.asked]  # each round's draft, tokens still wanted
        small = [(k, n) for k, n in left if k < min(gamma, n - 1)]
        why = (
            tr(
                "a round drafted {k} token(s) with {left} still wanted, where gamma = {gamma} and the tokens still "
                "wanted allowed {allowed}: smaller drafts make more rounds",
                k=small[0][0],
                left=small[0][1],
                gamma=gamma,
                allowed=min(gamma, small[0][1] - 1),
            )
            if small
            else tr(
                "every round drafted as many as it could, so some round kept fewer tokens than its pass verified "
                "(its accepted drafts and the model's own token after them)"
            )
        )
        raise AssertionError(f"{label}: {len(calls)} forward passes of the model, {fewest} with these drafts: {why}")
    assert all(0 <= k <= gamma for k in asked), f"{label}: the drafter was asked for {max(asked)} > gamma tokens"
    if cache is None:  # the learner's own cache: its content is not the check's to read
        return
    assert cache.pos > 0 or len(want) == 1, f"{label}: the cache handed in (cache=...) was never used"
    want_pos = len(prompt) + len(want) - 1
    if eos is not None and want and want[-1] == eos and cache.pos > want_pos:
        raise AssertionError(
            f"{label}: on return, the cache holds {cache.pos} tokens, {want_pos} expected: the text ends at eos_token, "
            f"but the drafts accepted after it in the same pass stayed in the cache"
        )
    past = [  # each verify pass's drafts, and the tokens still wanted when it ran (its pos says how many were made)
        (t - 1, n_new - (pos - len(prompt) + 1)) for t, _, pos in calls[1:] if pos is not None
    ]
    over = [(d, left) for d, left in past if d > left - 1]
    if over and cache.pos > want_pos:
        raise AssertionError(
            f"{label}: on return, the cache holds {cache.pos} tokens, {want_pos} expected: a verify pass checked "
            f"{over[0][0]} draft(s) with {over[0][1]} token(s) still wanted; the text was cut to max_new_tokens, but "
            f"the keys and values of the tokens cut off stayed in the cache"
        )
    problem = _cache_diagnosis(cache, want_pos)
    assert problem is None, f"{label}: on return, {problem}"
    assert _same_contents(cache, reference, cache.pos), (
        f"{label}: the cache's keys and values differ from those plain cached decoding leaves"
    )


@check("10.2")
def speculative_generate_matches_greedy_in_fewer_passes(sp, rng):
    """Check speculative_generate against greedy decoding for gamma 1, 3 and 5, counting the model's forward passes,
    with a cache that held another text (reset first) and with cache=None (a cache of its own)."""
    decoder = make_model(rng)
    for gamma, n_new in ((1, 9), (3, 14), (5, 13)):
        prompt = [int(t) for t in rng.integers(CONFIG.vocab_size, size=5)]
        _generate_case(sp, decoder, prompt, n_new, gamma)
    _generate_case(sp, decoder, prompt, 13, 4, spoil=False)  # every draft right: 1 + ceil(12 / 5) passes
    _generate_case(sp, decoder, prompt, 10, 3, cache=None)


@check("10.2")
def speculative_generate_stops_at_an_end_token(sp, rng):
    """Check that an end token inside the accepted drafts ends the text, and the cache, right after it, and that one in
    the prompt ends nothing."""
    decoder = make_model(rng)
    for _ in range(20):  # a prompt whose greedy text has a token that first appears a few places in
        prompt = [int(t) for t in rng.integers(CONFIG.vocab_size, size=5)]
        text = greedy(decoder, prompt, 12)
        firsts = [i for i in range(2, 8) if text[i] not in text[:i]]
        if firsts:
            break
    eos = text[firsts[0]]
    _generate_case(sp, decoder, prompt, 12, 5, spoil=False, eos=eos)
    _generate_case(sp, decoder, [eos, *prompt[1:]], 12, 5, spoil=False, eos=eos)  # the end token in the prompt too


# ---------------------------------------------------------------------------------------------
# 10.3 accept_sampled: small categorical "models" whose distributions the check knows


def chi2_sf_even(x: float, dof: int) -> float:
    """P(chi-squared with an even number dof of degrees of freedom > x), exactly: exp(-x/2) sum (x/2)^i / i!."""
    assert dof % 2 == 0 and dof > 0
    half, term, total = x / 2, 1.0, 1.0
    for i in range(1, dof // 2):
        term *= half / i
        total += term
    return math.exp(-half) * total


def _chi2(counts: np.ndarray, probs: np.ndarray) -> tuple[float, float]:
    """(statistic, p-value) of observed counts against probabilities; cells of probability 0 must stay empty."""
    keep = probs > 0
    n = counts.sum()
    stat = float((((counts[keep] - n * probs[keep]) ** 2) / (n * probs[keep])).sum())
    dof = int(keep.sum()) - 1
    return stat, chi2_sf_even(stat, dof) if dof % 2 == 0 else chi2_sf_even(stat, dof + 1)  # odd: conservative


def _rounds(sp, calls: list[tuple], label: str, longest: int) -> list[list[int]]:
    """accept_sampled on each (args, kwargs) in turn (in the isolated grader one request for all: fn.many), then the
    first 24 again, each with a generator of its own, in one order and in the other (_replayed)."""
    results = [_tokens(got, label, longest) for got in _called(sp, calls)]
    _replayed(sp, calls[:24], label, longest)
    return results


def _called(sp, calls: list[tuple]) -> list:
    fn = sp.accept_sampled
    many = getattr(fn, "many", None)
    if many is not None:  # the grader sends a tensor given to many calls once; each call gets its own copy there
        return many(calls)
    return [fn(*(a.clone() if isinstance(a, torch.Tensor) else a for a in args), **kwargs) for args, kwargs in calls]


def _replayed(sp, calls: list[tuple], label: str, longest: int) -> None:
    """Fail unless a round's tokens are a function of its p, q, draft and generator alone, drawn from that generator:
    the calls each get a generator of their own, seeded apart, and run forward, then backward with the same seeds.
    The global RNG, state kept between calls, or a call steered by the ones around it (read from the caller's
    frame) gives other tokens; a generator left where it was drew nothing from it."""
    seeds = [100_003 * i + 7 for i in range(len(calls))]
    runs = []
    for order in (list(range(len(calls))), list(range(len(calls)))[::-1]):
        gens = {i: torch.Generator().manual_seed(seeds[i]) for i in order}
        got = _called(sp, [((*calls[i][0][:3], gens[i]), {}) for i in order])
        runs.append({i: _tokens(g, label, longest) for i, g in zip(order, got)})
        still = [
            i for i in order if torch.equal(gens[i].get_state(), torch.Generator().manual_seed(seeds[i]).get_state())
        ]
        assert not still, (
            f"{label}: a round left its generator as it came ({len(still)} of {len(calls)}): every random draw must come "
            f"from the generator passed in (torch.rand(..., generator=generator)), not the global RNG"
        )
    differ = [i for i in runs[0] if runs[0][i] != runs[1][i]]
    assert not differ, (
        f"{label}: {len(differ)} of {len(calls)} rounds gave other tokens from a generator in the same state, run in "
        "another order: the tokens must depend only on p, q, the draft and the draws from `generator` (no global RNG, "
        f"no state kept between calls, nothing read from the calls around it)"
    )


def _tokens(got, label, longest):
    assert isinstance(got, (list, tuple)) and 1 <= len(got) <= longest, (
        f"{label}: accept_sampled must return a list of 1 to {longest} token ids, got {got!r:.80}"
    )
    return [int(t) for t in got]


@check("10.3")
def accept_sampled_keeps_drafts_as_often_as_an_exact_rule(sp, rng):
    """Check how often a draft is kept: one draft, two in a row, and drafts sampled from q, against an exact rule."""
    gen = torch.Generator().manual_seed(int(rng.integers(1 << 30)))
    p = torch.tensor([[0.45, 0.3, 0.25, 0.0], [0.25, 0.25, 0.25, 0.25]])
    q = torch.tensor([[0.1, 0.8, 0.05, 0.05]])
    trials, want = 3000, 0.3 / 0.8  # draft token 1: p 0.3, q 0.8
    calls = [((p, q, [1], gen), {}) for _ in range(trials)]
    accepted = sum(len(got) == 2 for got in _rounds(sp, calls, tr("draft [1]"), 2))
    rate = accepted / trials
    z = (rate - want) / math.sqrt(want * (1 - want) / trials)
    if rate > 0.95:
        raise AssertionError(
            f"a draft with p = 0.3 and q = 0.8 was accepted {rate:.0%} of the time, where an exact rule keeps it "
            f"{want:.3f} of the time: kept (nearly) always, by rank, by membership in the top k or by q/p, the token "
            f"comes out as often as the drafter proposes it, more often than p says"
        )
    assert abs(z) < 3.29, (  # two-sided, significance 0.001
        f"a draft with p = 0.3 and q = 0.8 was accepted {rate:.3f} of {trials} times, where an exact rule keeps it "
        f"{want:.3f} of the time (z = {z:.1f}): the token comes out "
        + ("more" if rate > want else "less")
        + " often than p says"
    )
    # drafts sampled from q, as a drafter would: the acceptance rate is sum(min(p, q)) (Leviathan et al.)
    alpha = float(torch.minimum(p[0], q[0]).sum())
    drafts = torch.multinomial(q[0], trials, replacement=True, generator=torch.Generator().manual_seed(1)).tolist()
    calls = [((p, q, [d], gen), {}) for d in drafts]
    accepted = sum(len(got) == 2 for got in _rounds(sp, calls, tr("draft"), 2))
    z = (accepted / trials - alpha) / math.sqrt(alpha * (1 - alpha) / trials)
    assert abs(z) < 3.29, (
        f"drafts sampled from q were accepted {accepted / trials:.3f} of the time, where an exact rule keeps "
        f"{alpha:.3f} of them (z = {z:.1f})"
    )
    # two drafts, each accepted with probability 1/2 on its own: both are kept a quarter of the time, by two draws
    p2 = torch.tensor([[0.25, 0.25, 0.25, 0.25], [0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25]])
    q2 = torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.1, 0.6, 0.3, 0.0]])  # draft 1: p/q = 1/2, draft 1 again: 1/3
    both = sum(
        len(got) == 3 for got in _rounds(sp, [((p2, q2, [1, 1], gen), {}) for _ in range(trials)], tr("two drafts"), 3)
    )
    want = 0.5 * (1 / 3)
    if both / trials > 0.25:
        raise AssertionError(
            f"two drafts accepted with probability 1/2 and 1/3 each were both kept {both / trials:.0%} of the time, "
            f"{want:.1%} expected: one uniform draw was shared by the drafts of the round, so the second was kept "
            f"whenever the first was and u < 1/3"
        )
    z = (both / trials - want) / math.sqrt(want * (1 - want) / trials)
    assert abs(z) < 3.29, (
        f"two drafts accepted with probability 1/2 and 1/3 were both kept {both / trials:.3f} of the time, "
        f"{want:.3f} expected (z = {z:.1f}): the second draft's keeping was not independent of the first's"
    )


@check("10.3")
def accept_sampled_replaces_a_rejected_draft_exactly(sp, rng):
    """Check that the token drawn after a rejection is never the rejected draft, and makes the output exact."""
    gen = torch.Generator().manual_seed(int(rng.integers(1 << 30)))
    p = torch.tensor([[0.3, 0.2, 0.2, 0.3], [0.25, 0.25, 0.25, 0.25]])
    q = torch.tensor([[0.0, 1.0, 0.0, 0.0]])  # the drafter always proposes 1; p gives it 0.2
    residual = (p[0] - q[0]).clamp(min=0).numpy()
    residual = residual / residual.sum()
    counts = np.zeros(4)
    for got in _rounds(sp, [((p, q, [1], gen), {}) for _ in range(3000)], tr("draft [1]"), 2):
        if len(got) == 1:
            counts[got[0]] += 1
    assert counts.sum() > 0, "the draft (p = 0.2, q = 1) was never rejected in 3000 rounds"
    if counts[1] > 0:
        raise AssertionError(
            f"after rejecting draft 1, token 1 came {int(counts[1])} times: the draft's share of p was given twice, "
            f"once by keeping drafts and again by the replacement, so token 1 comes out more often than p says"
        )
    stat, pval = _chi2(counts, residual)
    assert pval > SIGNIFICANCE, (
        f"after a rejection the tokens {counts.astype(int).tolist()} do not follow {np.round(residual, 3).tolist()}, "
        f"the only replacement that makes the output follow p here (chi-squared {stat:.1f}, p-value {pval:.1e} < "
        f"{SIGNIFICANCE})"
    )


@check("10.3")
def accept_sampled_adds_the_bonus_token(sp, rng):
    """Check that when every draft is accepted one more token is sampled from the last row of p."""
    gen = torch.Generator().manual_seed(int(rng.integers(1 << 30)))
    p = torch.tensor([[0.5, 0.5, 0.0, 0.0, 0.0], [0.0, 0.5, 0.5, 0.0, 0.0], [0.1, 0.2, 0.3, 0.25, 0.15]])
    counts = np.zeros(5)
    drafting = torch.Generator().manual_seed(int(rng.integers(1 << 30)))  # the drafts: the check's own draws
    drafts = [
        [int(torch.multinomial(p[0], 1, generator=drafting)), int(torch.multinomial(p[1], 1, generator=drafting))]
        for _ in range(2000)
    ]
    q_ = p[:2].clone()
    rounds = _rounds(sp, [((p, q_, list(d), gen), {}) for d in drafts], "q == p", 3)
    for draft, got in zip(drafts, rounds):
        assert len(got) == 3, (
            f"with q == p every draft is accepted, so the round returns the 2 drafts and a bonus token sampled from "
            f"p's last row: got {len(got)} token(s)"
        )
        assert got[:2] == draft, f"with q == p the drafts {draft} are kept as they are, got {got[:2]}"
        counts[got[2]] += 1
    stat, pval = _chi2(counts, p[2].numpy())
    assert pval > SIGNIFICANCE, (
        f"the bonus tokens {counts.astype(int).tolist()} do not follow p's last row {p[2].tolist()} "
        f"(chi-squared {stat:.1f}, p-value {pval:.1e} < {SIGNIFICANCE})"
    )


def _bigram(rng, vocab: int) -> np.ndarray:
    table = rng.uniform(0.05, 1.0, size=(vocab, vocab))
    return table / table.sum(1, keepdims=True)


@check("10.3")
def accept_sampled_output_follows_the_model(sp, rng):
    """Check that two tokens made by speculative sampling follow the model's distribution (chi-squared, 9 cells)."""
    P, Q = _bigram(rng, 3), _bigram(rng, 3)  # next-token tables: the "model" and the "drafter", context = last token
    Pt, Qt = torch.from_numpy(P).float(), torch.from_numpy(Q).float()
    Pt, Qt = Pt / Pt.sum(1, keepdim=True), Qt / Qt.sum(1, keepdim=True)
    gen, draws = torch.Generator().manual_seed(int(rng.integers(1 << 30))), np.random.default_rng(int(rng.integers(99)))
    counts, gamma = np.zeros((3, 3)), 2
    outs = [[] for _ in range(3000)]  # 3,000 texts, each grown round by round until it has two tokens
    while short := [out for out in outs if len(out) < 2]:
        calls = []
        for out in short:  # one round of each text that is still short, all in one batch
            last = out[-1] if out else 0
            draft = []
            for _ in range(gamma):  # the drafter samples from its table, the check's own random numbers
                draft.append(int(draws.choice(3, p=Q[draft[-1] if draft else last])))
            context = [last, *draft]
            p = torch.stack([Pt[t] for t in context])  # (gamma + 1, vocab): the model after each token
            q = torch.stack([Qt[t] for t in context[:-1]])  # (gamma, vocab)
            calls.append(((p, q, list(draft), gen), {}))
        for out, got in zip(short, _rounds(sp, calls, tr("a bigram round"), gamma + 1)):
            out += got
    for out in outs:
        counts[out[0], out[1]] += 1
    want = P[0][:, None] * P  # P(x1 | 0) P(x2 | x1)
    stat, pval = _chi2(counts.ravel(), want.ravel())
    assert pval > SIGNIFICANCE, (
        f"the first two tokens' frequencies {(counts / counts.sum()).round(3).ravel().tolist()} do not follow the "
        f"model's {want.round(3).ravel().tolist()} (chi-squared {stat:.1f}, 8 degrees of freedom, p-value "
        f"{pval:.1e} < {SIGNIFICANCE}): the output must be distributed as sampling from the model alone"
    )


# ---------------------------------------------------------------------------------------------
# 10.5 tokens_per_pass: a prediction, graded against the expected value, never against a run


def _expected_tokens(alpha: float, gamma: int) -> float:
    """The tokens a pass makes, averaged over every way its drafts can go: P(exactly j drafts kept) times j + 1."""
    kept = [alpha**j * (1 - alpha) for j in range(gamma)] + [alpha**gamma]  # the first rejection at j, or none
    return sum((j + 1) * p for j, p in enumerate(kept))


def _pass_slips(alpha: float, gamma: int) -> dict[str, float]:
    """What a likely slip predicts, by name."""
    a, g = alpha, gamma
    drafts = sum(a**i for i in range(1, g + 1))  # the kept drafts alone
    return {
        tr("the model's own token is missing: a pass always makes one more token than the drafts it kept"): drafts,
        tr("one term short: it counts as if a pass could keep at most gamma - 1 of its gamma drafts"): sum(
            a**i for i in range(g)
        ),
        tr(
            "the drafts are counted as if all were checked, each kept with probability alpha whatever came before "
            "it, but a pass ends at the first rejected draft"
        ): 1 + g * a,
        tr("all or nothing: a pass keeps any number of drafts up to the first rejection, not gamma or none"): 1
        + g * a**g,
    }


@check("10.5")
def tokens_per_pass_is_the_expected_count(sp, rng):
    """Check the prediction at alpha 0, 0.3, 0.6, 0.8, 0.95 and 1 and gamma 0, 1, 3, 5 and 8 against the expected
    count, each draft kept with probability alpha until the first rejection, plus the model's token."""
    for alpha in (0.3, 0.6, 0.8, 0.95, 1.0, 0.0, float(rng.uniform(0.1, 0.9))):  # slips differ most in the first
        for gamma in (1, 3, 5, 8, 0):
            want = _expected_tokens(alpha, gamma)
            where = f"tokens_per_pass(alpha={alpha:.3g}, gamma={gamma})"
            try:
                got = sp.tokens_per_pass(alpha, gamma)
            except ZeroDivisionError:
                got = float("nan")  # named below
            assert isinstance(got, (int, float, np.integer, np.floating)) and not isinstance(got, bool), (
                f"{where} should return a number, got {type(got).__name__}"
            )
            got = float(got)
            if math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12):
                continue
            assert math.isfinite(got), (
                f"{where} returned {got}: at alpha = 1 every draft is kept, so a pass makes gamma + 1 tokens (a closed "
                f"form with 1 - alpha below the line needs that case apart)"
            )
            slip = next((m for m, v in _pass_slips(alpha, gamma).items() if math.isclose(got, v, rel_tol=1e-9)), None)
            raise AssertionError(f"{where} returned {got:.4f}, expected {want:.4f}" + (f": {slip}" if slip else ""))


# ---------------------------------------------------------------------------------------------
# 10.4 prompt_lookup


@check("10.4")
def prompt_lookup_proposes_what_followed_the_latest_match(sp, rng):
    """Check prompt_lookup on the latest of two matches, a match running into the tail, the text's end and no match."""
    for tokens, n, k, want, slip in (
        ([1, 2, 3, 9, 1, 2], 2, 3, [3, 9, 1], None),
        (
            [5, 1, 7, 8, 5, 1, 9, 5, 1],
            2,
            2,
            [9, 5],
            tr(
                "the first occurrence was used: this exercise asks for what followed the LATEST "
                "(the earliest, as vLLM takes, is another valid drafter)"
            ),
        ),
        ([4, 2, 4], 1, 3, [2, 4], None),
        ([3, 3, 3, 3], 2, 2, [3], None),
        ([6, 7, 8, 9], 2, 4, [], None),
        ([6, 7], 2, 4, [], None),
        ([2, 5, 2, 5, 2], 1, 1, [5], None),
    ):
        got = sp.prompt_lookup(list(tokens), n, k)
        assert isinstance(got, list), f"prompt_lookup must return a list of ids, got {type(got).__name__}"
        got = [int(t) for t in got]
        if got == want:
            continue
        where = tr(
            "prompt_lookup({tokens}, n={n}, k={k}) returned {got}, expected {want}",
            tokens=tokens,
            n=n,
            k=k,
            got=got,
            want=want,
        )
        if len(got) > k:
            raise AssertionError(f"{where}: at most k tokens")
        if not got and want:
            raise AssertionError(f"{where}: the last n tokens match themselves at the end; search only earlier places")
        raise AssertionError(tr("{where}: {why}", where=where, why=slip) if slip else where)
    tokens = [int(t) for t in rng.integers(5, size=60)]
    got = sp.prompt_lookup(list(tokens), 3, 4)
    tail, want = tokens[-3:], []
    for s in range(len(tokens) - 4, -1, -1):
        if tokens[s : s + 3] == tail:
            want = tokens[s + 3 : s + 7]
            break
    assert [int(t) for t in got] == want, f"60 random tokens, n=3, k=4: got {got}, expected {want}"
