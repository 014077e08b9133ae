"""Checks for notebook 02 (kvlib/generation.py): exercises 2.1-2.8.

The loop is checked on small random decoders against a greedy loop written here, and on the
shipped tiny model against the capital question; timing is checked on a stand-in model whose
forwards cost known seconds on a fake clock (never real time, so the machine's load cannot
matter), a prefill clearly more than a decode step. A layer's parts (2.4-2.6) are checked against
the model's own modules, and each likely slip is computed too, so a failure names it. The two
predictions are graded against the analytic value, never a run: 2.7 against softmax(logits / t), 2.8
against the parameters a built decoder holds (and, for real configs too large to build, kvlib's table).
Every expected value is computed before the learner's function runs, or from objects it never sees.
The texts a message is built from (what a slip is called, which input failed) go through tr(), so that the
catalogue (kvlib/course/i18n.py) translates them as it does the messages.
"""

from __future__ import annotations

import copy
import dataclasses
import math

import numpy as np
import torch
import torch.nn.functional as F

from kvlib.checks import check, isolated
from kvlib.core.configs import REAL_MODELS
from kvlib.core.model import (
    MLP,
    PARTS,
    Attention,
    Decoder,
    ModelConfig,
    RMSNorm,
    SlowDecoder,
    counted_params,
    rotary_tables,
    rotate_half,
)
from kvlib.core.weights import load_tiny
from kvlib.course.exercises import ExerciseNotDone, refuse_steps
from kvlib.course.i18n import tr


def _model(seed: int, **sizes) -> Decoder:
    torch.manual_seed(seed)
    config = ModelConfig(
        **{
            "vocab_size": 23,
            "d_model": 32,
            "n_layers": 2,
            "n_heads": 4,
            "n_kv_heads": 2,
            "hidden_dim": 48,
            "max_seq_len": 64,
            **sizes,
        }
    )
    return Decoder(config).eval()


def _greedy(model, ids, n):
    """A plain greedy loop, to compare with."""
    with torch.inference_mode():
        for _ in range(n):
            ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids


def _tokens(result, batch, what):
    assert isinstance(result, torch.Tensor), f"{what} should return a tensor, got {type(result).__name__}"
    assert result.shape == (batch,), (
        f"{what} should return shape ({batch},), one token per row, got {tuple(result.shape)}"
    )
    assert result.dtype == torch.long, f"{what} should return token ids (torch.long), got {result.dtype}"
    return result


# ---------------------------------------------------------------------------------------------
# 2.1 next_token


@check("2.1")
def next_token_greedy_is_argmax(kv, rng):
    """Check that temperature 0 picks the most likely token of each row."""
    logits = torch.from_numpy(rng.normal(size=(3, 11))).float()
    expected = logits.argmax(dim=-1)
    tokens = _tokens(kv.next_token(logits.clone()), 3, "next_token(logits)")
    if torch.equal(tokens, logits.argmin(dim=-1)):
        raise AssertionError("greedy picked the least likely token")
    assert torch.equal(tokens, expected), (
        f"greedy should pick each row's most likely token: expected {expected.tolist()}, got {tokens.tolist()}"
    )


@check("2.1")
def next_token_samples_from_softmax(kv, rng):
    """Check that sampling at temperatures 1 and 0.5 draws each token as often as its probability at that temperature."""
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    for t in (1.0, 0.5):
        expected = torch.softmax(logits / t, dim=-1).numpy()
        untempered = torch.softmax(logits, -1).numpy()
        times_t = torch.softmax(logits * t, -1).numpy()
        gen = torch.Generator().manual_seed(int(rng.integers(1 << 30)))
        tokens = _tokens(
            kv.next_token(logits.expand(4000, 4).clone(), temperature=t, generator=gen), 4000, "next_token"
        )
        freq = np.bincount(tokens.numpy(), minlength=4) / 4000
        if t == 0.5 and np.abs(freq - untempered).max() < 0.03:
            raise AssertionError("the temperature changes nothing: at t = 0.5 the draws still follow softmax(logits)")
        if t == 0.5 and np.abs(freq - times_t).max() < 0.03:
            raise AssertionError(
                "the logits are multiplied by the temperature, not divided by it (t < 1 should sharpen)"
            )
        if np.abs(freq - np.eye(4)[0]).max() < 0.01:
            raise AssertionError(f"at temperature {t} every draw is the top token: nothing is drawn")
        assert np.abs(freq - expected).max() < 0.04, (
            f"at temperature {t}, tokens should come with probabilities {np.round(expected, 2)}, got frequencies {np.round(freq, 2)}"
        )


@check("2.1")
def next_token_sampling_is_reproducible(kv, rng):
    """Check that the same generator seed gives the same samples, another seed other samples, and that samples vary."""
    logits = torch.zeros(64, 5)
    a = _tokens(
        kv.next_token(logits.clone(), temperature=1.0, generator=torch.Generator().manual_seed(7)), 64, "next_token"
    )
    b = kv.next_token(logits.clone(), temperature=1.0, generator=torch.Generator().manual_seed(7))
    c = kv.next_token(logits.clone(), temperature=1.0, generator=torch.Generator().manual_seed(8))
    assert torch.equal(a, b), (
        "two draws with generators seeded alike (seed 7) differ: the generator you are given plays no part"
    )
    assert len(set(a.tolist())) > 1, (
        "with equal logits at temperature 1, all 64 draws are the same token: nothing is drawn"
    )
    assert not torch.equal(a, c), (
        "seeds 7 and 8 gave the same 64 draws: the draws do not come from the generator as it is given"
    )


# ---------------------------------------------------------------------------------------------
# 2.2 generate


@check("2.2")
def generate_matches_greedy_loop(kv, rng):
    """Check that greedy generate equals a plain greedy loop on a random model, batch of 2."""
    model = _model(int(rng.integers(1000)))
    prompt = torch.from_numpy(rng.integers(0, 23, size=(2, 5)))
    expected = _greedy(model, prompt, 7)
    first_only = torch.cat([prompt, _greedy(model, prompt, 1)[:, -1:].expand(2, 7)], dim=1)
    with torch.inference_mode():
        from_first = torch.cat([prompt, model(prompt)[:, 0].argmax(-1, keepdim=True)], dim=1)
    out = kv.generate(copy.deepcopy(model), prompt.clone(), 7)
    assert isinstance(out, torch.Tensor) and out.shape == (2, 12), (
        f"generate should return (batch, 5 + 7) = (2, 12), got {getattr(out, 'shape', out)}"
    )
    assert torch.equal(out[:, :5], prompt), "the output should start with the prompt, unchanged"
    if torch.equal(out, expected):
        return
    got, want = out[0, 5:].tolist(), expected[0, 5:].tolist()
    if torch.equal(out, first_only):
        raise AssertionError(
            tr(
                "greedy, all 7 new tokens are the same, {got}: a plain greedy loop on this model gives {want}",
                got=got,
                want=want,
            )
        )
    if torch.equal(out[:, :6], from_first):
        raise AssertionError(
            tr(
                "the first new token is already not greedy's: {got} where the model's most likely token after the "
                "prompt is {want}",
                got=got[0],
                want=want[0],
            )
        )
    raise AssertionError(
        tr("greedy tokens differ from a plain greedy loop's: expected {want}, got {got}", want=want, got=got)
    )


class Watched:
    """2.2's model as the grader hands it: a Decoder that stays with the grader and writes each forward pass into a
    log, beside each token the learner's on_token reports (Reported). In the isolated grader both are called from the
    child as they happen, never replayed afterwards, so the log holds the true order of the two."""

    kvlib_public = ("config", "check_input", "forward")

    def __init__(self, model: Decoder, log: list):
        self._model, self._log = model, log

    @property
    def config(self) -> ModelConfig:
        return self._model.config

    def check_input(self, input_ids) -> None:
        self._model.check_input(input_ids)

    def __call__(self, input_ids, *args, **kwargs):
        self._log.append(("forward", int(input_ids.shape[1])))
        with torch.inference_mode():
            return self._model(input_ids, *args, **kwargs)

    forward = __call__

    def __repr__(self) -> str:
        return "<the check's model: model(ids) -> logits>"


class Reported:
    """2.2's on_token as the grader hands it: each token it is called with joins the log, in order with the model's
    forward passes (Watched)."""

    kvlib_public = ()  # it is called; nothing of it is read

    def __init__(self, log: list):
        self._log = log

    def __call__(self, token):
        self._log.append(("token", token.clone() if isinstance(token, torch.Tensor) else token))

    def __repr__(self) -> str:
        return "<the check's on_token>"


@check("2.2")
def generate_streams_each_token(kv, rng):
    """Check that on_token sees each new token once, in order, before the model is asked for the next one."""
    prompt_len, n = 4, 5
    prompt = torch.from_numpy(rng.integers(0, 23, size=(1, prompt_len)))
    log: list = []
    out = kv.generate(Watched(_model(3), log), prompt.clone(), n, on_token=Reported(log))
    seen = [t for kind, t in log if kind == "token"]
    assert len(seen) == n, f"on_token should be called once per new token ({n} times), got {len(seen)}"
    assert all(isinstance(s, torch.Tensor) and s.shape == (1,) for s in seen), (
        f"on_token should get each token as shape (batch,), got {[tuple(getattr(s, 'shape', ())) for s in seen]}"
    )
    assert isinstance(out, torch.Tensor) and torch.equal(out[:, :prompt_len], prompt), (
        "the output should start with the prompt, unchanged"
    )
    assert torch.equal(torch.stack(seen, dim=1), out[:, prompt_len:]), (
        "on_token should see the tokens in the order they are appended"
    )
    for step, (kind, length) in enumerate(log):  # each forward reads tokens that on_token has already shown
        shown = sum(k == "token" for k, _ in log[:step])
        if kind != "forward" or shown >= length - prompt_len:
            continue
        if all(k == "token" for k, _ in log[-n:]):
            raise AssertionError(
                f"on_token was called for all {n} tokens after the loop ended: nothing streams, and a chat would "
                "show no token before the last. Call it inside the loop, as soon as each token is chosen"
            )
        raise AssertionError(
            f"the model read {length - prompt_len} new token(s) when on_token had been shown {shown}: call on_token "
            "with each token as soon as it is chosen, before the next forward pass"
        )


@check("2.2")
def generate_answers_the_seed_question(kv, rng):
    """Check that the shipped model, greedy, continues 法国的首都是 with 巴黎."""
    model, tokenizer = load_tiny()
    ids = torch.tensor([tokenizer.encode("法国的首都是")])
    out = kv.generate(model, ids.clone(), 2)
    text = tokenizer.decode(out[0, ids.shape[1] :].tolist())
    assert text == "巴黎", f"法国的首都是 should continue with 巴黎, got {text!r}"


@check("2.2")
def generate_samples_reproducibly(kv, rng):
    """Check that sampling is reproducible with a seed and draws the first token from softmax(logits / t)."""
    model = _model(5)
    prompt = torch.from_numpy(rng.integers(0, 23, size=(1, 3)))
    with torch.inference_mode():
        expected = torch.softmax(model(prompt)[0, -1] / 1.5, dim=-1).numpy()  # the first token's distribution
    a = kv.generate(
        copy.deepcopy(model), prompt.clone(), 12, temperature=1.5, generator=torch.Generator().manual_seed(1)
    )
    b = kv.generate(
        copy.deepcopy(model), prompt.clone(), 12, temperature=1.5, generator=torch.Generator().manual_seed(1)
    )
    assert torch.equal(a, b), tr(
        "two runs at temperature 1.5 with generators seeded alike (seed 1) gave different tokens: {a} and {b}",
        a=a[0, 3:].tolist(),
        b=b[0, 3:].tolist(),
    )
    many = kv.generate(
        copy.deepcopy(model),
        prompt.expand(3000, 3).clone(),
        1,
        temperature=1.5,
        generator=torch.Generator().manual_seed(2),
    )
    assert isinstance(many, torch.Tensor) and many.shape == (3000, 4), (
        f"a batch of 3000 prompts and 1 new token should give (3000, 4), got {getattr(many, 'shape', many)}"
    )
    freq = np.bincount(many[:, -1].numpy(), minlength=len(expected)) / 3000
    if freq.max() > 0.99:
        raise AssertionError(
            tr("with temperature 1.5, all 3,000 rows of one prompt chose the same first token: no draw varies")
        )
    assert np.abs(freq - expected).max() < 0.04, (
        f"the first sampled token should follow softmax(logits / 1.5) of the model's last position: largest gap "
        f"{np.abs(freq - expected).max():.3f} between frequencies and probabilities"
    )


# ---------------------------------------------------------------------------------------------
# 2.3 measure_ttft_itl


def _stand_in(per_token: float = 0.01) -> SlowDecoder:
    """A stand-in whose forwards cost known seconds on a fake clock: a prefill of T tokens 1.1 * T
    units, a naive decode step 1 unit plus a tenth per token of the sequence (1 unit = per_token s)."""
    torch.manual_seed(0)
    return SlowDecoder(
        ModelConfig(vocab_size=11, d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, hidden_dim=16, max_seq_len=64),
        per_token=per_token,
    ).eval()


class TimedModel:
    """2.3's stand-in as the isolated grader hands it: the SlowDecoder stays here, with its clock. The child gets a
    stand-in: each call runs the model here, and the child's clocks (time.perf_counter and the rest, also where
    the learner's module imported them by name) read this model's `now` (kvlib_clock), so time advances on the
    grader's side, by the forwards it runs. Its price per token is never sent: only a measurement finds it."""

    kvlib_public = ("config", "check_input", "now")
    kvlib_clock = True

    def __init__(self, model: SlowDecoder):
        self._model = model

    @property
    def config(self) -> ModelConfig:
        return self._model.config

    @property
    def now(self) -> float:
        return self._model.now

    def check_input(self, input_ids) -> None:
        self._model.check_input(input_ids)

    def __call__(self, input_ids, pos: int = 0):
        with torch.inference_mode():
            return self._model(input_ids, pos)

    def __repr__(self) -> str:
        return "<the check's model: model(ids) -> logits, timed on the grader's clock>"


def _timed(kv, prompt_len: int, n: int, per_token: float):
    """measure_ttft_itl on a fresh stand-in, its clocks reading the fake one; and what it should find."""
    model = _stand_in(per_token)
    ttft = model.cost(prompt_len, prompt_len)  # the prefill: every prompt token is new
    itls = [model.cost(prompt_len + i, 1) for i in range(1, n)]  # naive step i runs prompt_len + i tokens, 1 new
    ids = torch.zeros(1, prompt_len, dtype=torch.long)
    if isolated(kv.measure_ttft_itl):  # the model and its clock stay here: the child's clocks ask them
        result = kv.measure_ttft_itl(TimedModel(model), ids, n)
    else:
        with model.fake_clock(kv):
            result = kv.measure_ttft_itl(model, ids, n)
    assert isinstance(result, tuple) and len(result) == 2, "measure_ttft_itl should return (ttft, itls)"
    got_ttft, got_itls = result
    assert isinstance(got_ttft, float), f"ttft should be a float of seconds, got {type(got_ttft).__name__}"
    got_itls = list(got_itls)
    assert len(got_itls) == n - 1, (
        f"{n} new tokens have {n - 1} gaps between them: itls should have {n - 1} entries, got {len(got_itls)}"
        + (" (the first entry is the prefill: TTFT, not an inter-token latency)" if len(got_itls) == n else "")
    )
    assert all(isinstance(t, (float, int)) for t in got_itls), "itls should be a list of floats (seconds)"
    return (ttft, itls), (got_ttft, [float(t) for t in got_itls])


def _per_token(rng) -> float:
    """The stand-in's seconds per token, drawn per check: what a measurement finds, never a number to copy."""
    return float(rng.uniform(0.005, 0.02))


def _same(a, b) -> bool:
    return abs(a - b) <= 1e-6 + 1e-6 * abs(b)


@check("2.3")
def measure_ttft_itl_times_prefill_and_steps(kv, rng):
    """Check TTFT and each inter-token latency on a stand-in whose prefill and decode steps cost known, different times."""
    T, n = 12, 5
    (ttft, itls), (got_ttft, got_itls) = _timed(kv, T, n, _per_token(rng))
    total = ttft + sum(itls)
    if not _same(got_ttft, ttft):
        hint = ""
        if _same(got_ttft, itls[0]) or got_ttft < 0.5 * ttft:
            hint = tr(" It is shorter than the prefill alone: the prefill was left out of it.")
        elif _same(got_ttft, total):
            hint = tr(" That is the whole generation: TTFT ends when the first token exists.")
        elif got_ttft > 100:
            hint = tr(" That looks like a clock reading, not a duration.")
        raise AssertionError(
            f"the prefill of {T} tokens takes {ttft * 1e3:.0f} ms here, so TTFT should be that, got {got_ttft * 1e3:.1f} ms.{hint}"
        )
    for i, (t, got) in enumerate(zip(itls, got_itls)):
        if _same(got, t):
            continue
        if all(_same(g, total / n) for g in got_itls) or all(_same(g, sum(itls) / (n - 1)) for g in got_itls):
            raise AssertionError(
                "every inter-token latency is the same number, an average (that is TPOT): report each decode step's own time (the gap between "
                f"consecutive tokens), here {', '.join(f'{x * 1e3:.0f}' for x in itls)} ms"
                + (", and leave the prefill out of it" if _same(got_itls[0], total / n) else "")
            )
        for since, origin in ((ttft, tr("the start of the call")), (0.0, tr("the first new token"))):  # one start kept
            if all(_same(g, since + sum(itls[: j + 1])) for j, g in enumerate(got_itls)):
                raise AssertionError(
                    f"each inter-token latency was measured from {origin}, so they grow as a running total: "
                    "itls[i] is the gap between new token i and new token i + 1 alone "
                    f"(here {', '.join(f'{x * 1e3:.0f}' for x in itls)} ms)"
                )
        raise AssertionError(
            f"decode step {i + 1} re-runs {T + 1 + i} tokens and takes {t * 1e3:.0f} ms here, got {got * 1e3:.1f} ms: "
            "itls[i] is the time between new token i and new token i + 1"
        )


@check("2.3")
def measure_ttft_itl_prefill_grows_with_prompt(kv, rng):
    """Check that TTFT grows with the prompt: on the stand-in, a prefill of 12 tokens costs 11 units more than one of 2."""
    per_token = _per_token(rng)
    (short, _), (got_short, _) = _timed(kv, 2, 2, per_token)
    (long, _), (got_long, itls) = _timed(kv, 12, 2, per_token)
    assert len(itls) == 1, f"2 new tokens have 1 gap between them, got {len(itls)} inter-token latencies"
    assert _same(got_long - got_short, long - short), (
        f"a prompt of 12 tokens takes {(long - short) * 1e3:.0f} ms longer to prefill than one of 2 here, got "
        f"{got_short * 1e3:.1f} and {got_long * 1e3:.1f} ms: TTFT runs from the start of generation to the first new token"
    )


# ---------------------------------------------------------------------------------------------
# 2.4 attention_block


def _interleaved(x, cos, sin):
    """Rotary on neighbouring pairs (0, 1), (2, 3), ...: the other layout, not this model's."""
    half = x.shape[-1] // 2
    c, s = cos[..., :half].repeat_interleave(2, -1), sin[..., :half].repeat_interleave(2, -1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    turned = torch.stack([-x2, x1], dim=-1).flatten(-2)
    return x * c + turned * s


def _mha(seed: int, d_model: int = 24, n_heads: int = 4) -> Attention:
    """A random attention layer, every head its own keys and values (2.4 takes no grouped heads)."""
    torch.manual_seed(seed)
    config = ModelConfig(
        vocab_size=11, d_model=d_model, n_layers=1, n_heads=n_heads, n_kv_heads=n_heads, hidden_dim=16, max_seq_len=64
    )
    return Attention(config).eval()


def _heads_attention(q, k, v, scale: float, causal: bool = True):
    """Attention of heads in float64 as Exercise 1.4 computes it: q (..., T, D) against k, v (..., S, D), the queries
    the last T of S positions (the causal mask bottom-right), scores times scale; (out, probs), each (..., T, ·)."""
    T, S = q.shape[-2], k.shape[-2]
    scores = q @ k.swapaxes(-1, -2) * scale  # (..., T, D) @ (..., D, S) -> (..., T, S)
    if causal:
        scores = np.where(np.tril(np.ones((T, S), dtype=bool), k=S - T), scores, -np.inf)
    probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    return probs @ v, probs


class GivenAttention:
    """2.4's self_attention as the grader hands it: Exercise 1.4's contract (numpy heads in, (out, probs) out, in q's
    dtype), computed here with the scores times `scale` (None: 1 / sqrt(head_dim), as the layer's own; a check hands in
    another, so that an output that did not come from this attention shows). In the isolated grader it stays with the
    grader: each call is made from the child as it happens, and the queries it is given are kept (queries)."""

    kvlib_public = ()  # it is called; nothing of it is read

    def __init__(self, scale: float | None = None):
        self._scale, self.queries = scale, []

    def __call__(self, q, k, v):
        tensor = isinstance(q, torch.Tensor)
        arrays = [x.detach().double().numpy() if isinstance(x, torch.Tensor) else np.asarray(x) for x in (q, k, v)]
        q64, k64, v64 = (a.astype(np.float64) for a in arrays)
        if not (q64.ndim >= 2 and k64.ndim == q64.ndim == v64.ndim and q64.shape[-1] == k64.shape[-1]):
            raise ValueError(
                "self_attention takes q (..., seq_len, head_dim), k (..., kv_len, head_dim) and v (..., kv_len, d_v) "
                f"with the same leading axes, got {q64.shape}, {k64.shape}, {v64.shape}"
            )
        if k64.shape[-2] != v64.shape[-2] or q64.shape[-2] > k64.shape[-2] or q64.shape[:-2] != k64.shape[:-2]:
            raise ValueError(
                f"self_attention takes one value per key and seq_len <= kv_len, got q {q64.shape}, k {k64.shape}, "
                f"v {v64.shape}"
            )
        scale = 1 / math.sqrt(q64.shape[-1]) if self._scale is None else self._scale
        self.queries.append(q64.reshape(-1, q64.shape[-1]))  # every query row it attended for
        out, probs = _heads_attention(q64, k64, v64, scale)
        dtype = arrays[0].dtype if arrays[0].dtype in (np.float32, np.float64) else np.float32
        out, probs = out.astype(dtype), probs.astype(dtype)
        return (torch.from_numpy(out), torch.from_numpy(probs)) if tensor else (out, probs)

    def __repr__(self) -> str:
        return "<the check's self_attention: Exercise 1.4's contract>"


def _attention_slips(attn, h, cos, sin, scale: float | None = None):
    """The layer's output with every head through attention scaled by `scale` (None: 1 / sqrt(head_dim), the layer's
    own), what each likely slip gives instead (all before the learner's call), and the rotated queries of every head
    (batch, n_heads, seq_len, head_dim), which must have gone through the attention handed in."""
    (B, T, _), H, D = h.shape, attn.n_heads, attn.head_dim
    own = 1 / math.sqrt(D)
    scale = own if scale is None else scale
    Wq, Wk, Wv, Wo = (
        p.detach().double() for p in (attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight, attn.o_proj.weight)
    )
    h64, c64, s64 = h.detach().double(), cos.double(), sin.double()

    def heads(W, split=True):  # (B, T, C) -> (B, H, T, D), or the wrong view straight to (B, H, T, D)
        x = h64 @ W.T
        return x.view(B, T, H, D).transpose(1, 2) if split else x.view(B, H, T, D)

    def turn(x):
        return x * c64 + rotate_half(x) * s64

    def attend(q, k, v, causal=True, times=scale):  # (B, H, T, D) heads through the attention
        return torch.from_numpy(_heads_attention(q.numpy(), k.numpy(), v.numpy(), times, causal)[0])

    def joined(out, right=True):  # (B, H, T, D) -> (B, T, H*D)
        return (out.transpose(1, 2) if right else out).reshape(B, T, H * D)

    q, k, v = turn(heads(Wq)), turn(heads(Wk)), heads(Wv)
    out = attend(q, k, v)
    want = joined(out) @ Wo.T
    positions_last = attend(*(x.transpose(1, 2) for x in (q, k, v))).transpose(1, 2)  # (B, T, H, D) attended over H
    slips = [
        (
            joined(out, right=False) @ Wo.T,
            tr(
                "the heads are joined in the wrong order: reshaping (batch, n_heads, seq_len, head_dim) straight to "
                "(batch, seq_len, n_heads*head_dim) mixes positions into heads; put heads back after positions "
                "(transpose) first"
            ),
        ),
        (
            joined(out),
            tr("W_O is missing: the heads side by side go through the output projection (attn.o_proj.weight)"),
        ),
        (joined(out) @ Wo, tr("W_O is applied untransposed: a Linear layer computes x @ W.T")),
        (
            joined(positions_last) @ Wo.T,
            tr(
                "the heads were not moved before the positions: self_attention attends along the second-to-last axis, "
                "which held the heads (batch, seq_len, n_heads, head_dim), so each token attended over its own heads"
            ),
        ),
        (
            joined(attend(q * own, k, v)) @ Wo.T,
            tr(
                "q was scaled before self_attention: it scales the scores itself (Exercise 1.4), so they were scaled twice"
            ),
        ),
        (
            joined(attend(q, k, v, causal=False)) @ Wo.T,
            tr("the queries see later tokens: attention inside a layer is causal (Exercise 1.4's mask)"),
        ),
        (joined(attend(q, k, v, times=1.0)) @ Wo.T, tr("the scores are not scaled: divide q . k by sqrt(head_dim)")),
        (
            joined(attend(turn(heads(Wq, False)), turn(heads(Wk, False)), heads(Wv, False))) @ Wo.T,
            tr(
                "the heads are split wrongly: view each projection as (batch, seq_len, n_heads, head_dim), then "
                "transpose(1, 2); viewing it as (batch, n_heads, seq_len, head_dim) mixes positions into heads"
            ),
        ),
        (
            joined(attend(heads(Wq), heads(Wk), v)) @ Wo.T,
            tr("q and k are not rotated: rotary turns queries and keys by their positions' angles"),
        ),
        (joined(attend(heads(Wq), k, v)) @ Wo.T, tr("q is not rotated: queries turn by their positions' angles too")),
        (joined(attend(q, heads(Wk), v)) @ Wo.T, tr("k is not rotated: keys turn by their positions' angles too")),
        (
            joined(attend(q, k, turn(v))) @ Wo.T,
            tr("v is rotated: only queries and keys turn; values pass on as projected"),
        ),
        (
            joined(attend(_interleaved(heads(Wq), c64, s64), _interleaved(heads(Wk), c64, s64), v)) @ Wo.T,
            tr(
                "rotary turns neighbouring features (0, 1), (2, 3)...: this model pairs feature i with i + head_dim/2 "
                "(rotate_half)"
            ),
        ),
    ]
    if scale != own:  # the layer's own output, where the check handed in another attention
        with torch.no_grad():
            slips.insert(
                0,
                (
                    attn(h, cos, sin).double(),
                    tr(
                        "the output is the layer's own attention, not the heads through the self_attention you were "
                        "given (the grader's scales the scores by 1/head_dim here): every head's output must come from "
                        "it, then be joined and projected. attn(h, cos, sin) or torch's scaled_dot_product_attention "
                        "skip the exercise"
                    ),
                ),
            )
    return want.float(), slips, q.numpy()


def _failed(where: str, message: str) -> AssertionError:
    """A check's failure on the input `where` names, with the slip's message."""
    return AssertionError(tr("{where}: {why}", where=where, why=message))


def _from_the_given() -> str:
    """What a head's output must come from, said when one did not."""
    return tr(
        "every head's output must come from it (notebook 01's causal_self_attention by default; the grader hands in its "
        "own and counts what it receives). attn(h, cos, sin) or torch's scaled_dot_product_attention skip the exercise"
    )


def _heads_went_through(given: GivenAttention, queries: np.ndarray, where: str) -> None:
    """Fail unless every head's every rotated query (batch, n_heads, seq_len, head_dim) reached the given attention."""
    if not given.queries:
        raise _failed(
            where, tr("the heads never went through the self_attention you were given: {why}", why=_from_the_given())
        )
    seen = np.concatenate(given.queries)  # (rows, head_dim): every query row it attended for
    rows = queries.reshape(-1, queries.shape[-1])
    scale = np.abs(rows).max() + 1e-12
    found = [bool((np.abs(seen - row).max(axis=-1) <= 1e-4 * scale).any()) for row in rows]
    if not all(found):
        b, head, t = np.unravel_index(found.index(False), queries.shape[:-1])
        raise AssertionError(
            f"{where}: the query of position {t} of head {head} (batch {b}) never went through the self_attention "
            f"you were given: {_from_the_given()}"
        )


def _close(got, want, rtol=1e-4, atol=1e-5) -> bool:
    return got.shape == want.shape and torch.allclose(got.double(), want.double(), rtol=rtol, atol=atol)


def _judge(got, want, slips, where, what, rtol=1e-4, atol=1e-5, against=None):
    """Pass if got matches want (against: what want is, by default the model's own); else fail naming the first slip
    got matches, or by how much it differs."""
    against = tr("the model's own") if against is None else against
    assert isinstance(got, torch.Tensor), f"{what} should return a torch tensor, got {type(got).__name__}" + (
        " (torch.from_numpy turns notebook 01's numpy result back into one)" if isinstance(got, np.ndarray) else ""
    )
    assert tuple(got.shape) == tuple(want.shape), (
        f"{where}: {what} should have shape {tuple(want.shape)}, got {tuple(got.shape)}"
    )
    got = got.detach()
    if _close(got, want, rtol, atol):
        return
    for wrong, message in slips:
        if _close(got, wrong, rtol, atol):
            raise _failed(where, message)
    raise AssertionError(
        f"{where}: {what} differs from {against} by up to {(got.double() - want.double()).abs().max().item():.2g}"
    )


def _angles(D: int, start: int, T: int):
    cos, sin = rotary_tables(D, 64)
    return cos[start : start + T], sin[start : start + T]


STEPS_REFUSED = "refused in Exercise 2.4's checks"  # what the checks' layer's project_q and project_kv raise


def _block(kv, attn, h, cos, sin, given: GivenAttention, where: str):
    """The learner's attention_block of a copy of attn whose project_q and project_kv refuse (in the child too)."""
    layer = refuse_steps(copy.deepcopy(attn), STEPS_REFUSED)
    try:
        return kv.attention_block(layer, h.clone(), cos.clone(), sin.clone(), self_attention=given)
    except AttributeError as err:
        if str(err) != STEPS_REFUSED:
            raise
        raise _failed(
            where,
            tr(
                "the grader's layer refuses its project_q and project_kv (and so its own forward, attn(h, cos, sin), "
                "which calls them): they project, split into heads and turn by rotary, the steps Exercise 2.4 asks "
                "you to write from the layer's q_proj, k_proj and v_proj"
            ),
        ) from None


@check("2.4")
def attention_block_matches_the_model(kv, rng):
    """Check the output against the layer's own on a random layer (4 heads of 6, batch of 2, positions 3-9), every
    head's queries through the self_attention handed in."""
    attn = _mha(int(rng.integers(1000)))
    h = torch.from_numpy(rng.normal(size=(2, 7, 24))).float()
    cos, sin = _angles(attn.head_dim, 3, 7)
    want, slips, queries = _attention_slips(attn, h, cos, sin)
    given = GivenAttention()
    where = tr("a layer of 4 heads of 6, batch of 2, positions 3 to 9")
    _judge(_block(kv, attn, h, cos, sin, given, where), want, slips, where, "attention_block")
    _heads_went_through(given, queries, where)


@check("2.4")
def attention_block_uses_the_attention_it_is_given(kv, rng):
    """Check layer 0 of the shipped model on 法国的首都是 with another attention handed in (scores times 1/head_dim):
    the output is that attention's, heads joined and projected."""
    model, tokenizer = load_tiny()
    ids = torch.tensor([tokenizer.encode("法国的首都是")])
    T, layer = ids.shape[1], model.layers[0]
    with torch.no_grad():
        h = layer.attn_norm(model.embed(ids))  # (1, T, d_model): layer 0's input after its RMSNorm
    cos, sin = model.rope_cos[:T], model.rope_sin[:T]
    scale = 1 / layer.attn.head_dim
    want, slips, queries = _attention_slips(layer.attn, h, cos, sin, scale)
    given = GivenAttention(scale)
    where = tr("the tiny model's layer 0 on 法国的首都是, its heads through an attention scaled by 1/head_dim")
    got = _block(kv, layer.attn, h, cos, sin, given, where)
    _judge(got, want, slips, where, "attention_block", against=tr("the heads through it, joined and projected"))
    _heads_went_through(given, queries, where)


@check("2.4")
def attention_block_is_causal(kv, rng):
    """Check that changing the last token leaves every earlier token's output as it was, and one token alone works,
    with another attention handed in (scores times 2/sqrt(head_dim))."""
    attn = _mha(int(rng.integers(1000)), d_model=20, n_heads=2)
    h = torch.from_numpy(rng.normal(size=(1, 6, 20))).float()
    changed = h.clone()
    changed[0, -1] = torch.from_numpy(rng.normal(size=20)).float()
    cos, sin = _angles(attn.head_dim, 0, 6)
    scale, where = 2 / math.sqrt(attn.head_dim), tr("a layer of 2 heads of 10, an attention scaled by 2/sqrt(head_dim)")
    (want, _, queries), (want_changed, _, _) = (_attention_slips(attn, x, cos, sin, scale) for x in (h, changed))
    with torch.no_grad():
        own = attn(h, cos, sin)
    given = GivenAttention(scale)
    got, got_changed = (_block(kv, attn, x, cos, sin, given, where) for x in (h, changed))
    for g in (got, got_changed):
        assert isinstance(g, torch.Tensor) and tuple(g.shape) == (1, 6, 20), (
            f"attention_block should return (batch, seq_len, d_model) = (1, 6, 20), got {getattr(g, 'shape', g)}"
        )
    _heads_went_through(given, queries, where)
    if not _close(got_changed[:, :-1].detach(), got[:, :-1].detach()):
        raise AssertionError(
            f"{where}: changing only the last token changed the earlier tokens' outputs: the queries see later "
            "tokens; attention inside a layer is causal (Exercise 1.4's mask)"
        )
    if _close(got.detach(), own):
        raise AssertionError(
            f"{where}: the output is the layer's own attention, not the heads through the self_attention you were "
            "given: every head's output must come from it, then be joined and projected"
        )
    assert _close(got.detach(), want) and _close(got_changed.detach(), want_changed), (
        f"{where}: the output differs from the heads through it, joined and projected, by up to "
        f"{(got.detach().double() - want.double()).abs().max().item():.2g}"
    )
    one = _block(kv, attn, h[:, 2:3], cos[5:], sin[5:], given, where)
    with torch.no_grad():
        alone = attn(h[:, 2:3], cos[5:], sin[5:])  # one key: its weight is 1 whatever the scale
    assert isinstance(one, torch.Tensor) and _close(one.detach(), alone), (
        "one token alone at position 5 (seq_len 1): it attends only to itself, so its output is W_O of its value; "
        f"got {getattr(one, 'shape', one)} that differs from the layer's own"
    )


# ---------------------------------------------------------------------------------------------
# 2.5 rms_norm


_NOT_EACH_TOKEN = object()  # the slip of 2.5's shipped body, a mean square over the wrong axis: shown by its symptom


def _token_rms(y, weight) -> list[float]:
    """The first four tokens' root-mean-squares with the weight divided out: about 1 each, out of RMSNorm."""
    unit = (y.double() / weight.double()).reshape(-1, y.shape[-1])
    return [round(v, 3) for v in unit.pow(2).mean(dim=-1).sqrt()[:4].tolist()]


def _rms_slips(x, weight, eps):
    """RMSNorm of x as the model computes it, and what each likely slip gives instead."""
    x64, w64 = x.double(), weight.double()

    def norm(axis=-1, inside=True, centre=False, mean=True, root=True, scale=True, use_eps=True, e=eps):
        y = x64 - x64.mean(dim=axis, keepdim=True) if centre else x64
        ms = y.pow(2).mean(dim=axis, keepdim=True) if mean else y.pow(2).sum(dim=axis, keepdim=True)
        e = e if use_eps else 0.0
        denom = (ms + e).sqrt() if inside else ms.sqrt() + e
        if not root:
            denom = ms + e
        return (w64 if scale else 1.0) * y / denom

    with torch.no_grad():
        module = RMSNorm(x.shape[-1], eps).to(weight.dtype)  # a 16-bit model's norms hold 16-bit weights
        module.weight.copy_(weight)
        want = module(x)
    wrong_axis = _NOT_EACH_TOKEN  # 2.5's shipped bug: a find-and-fix, so its message shows the symptom (_judge_rms)
    slips = [
        (norm(axis=0) if x.dim() > 1 else None, wrong_axis),
        (norm(axis=-2) if x.dim() > 1 else None, wrong_axis),
        (norm(centre=True), tr("the mean is subtracted: RMSNorm does not centre the row (that is LayerNorm)")),
        (
            norm(inside=False),
            tr("eps is added outside the root: to the root-mean-square, not to the mean square under it"),
        ),
        (norm(use_eps=False), tr("eps plays no part: the result is that of eps = 0")),
        (
            norm(e=1e-5) if eps != 1e-5 else None,
            tr("the eps argument is ignored: the result is that of eps = 1e-5 whatever eps is given"),
        ),
        (norm(mean=False), tr("divided by the root of the sum of the squares, not of their mean")),
        (norm(root=False), tr("divided by the mean square itself, not by its root")),
        (norm(scale=False), tr("the learned weight is not applied: the result is that of weight 1 on every feature")),
    ]
    return want, [(wrong.to(want.dtype), message) for wrong, message in slips if wrong is not None]


def _judge_rms(kv, x, weight, eps, where, rtol=1e-4, atol=1e-5):
    want, slips = _rms_slips(x, weight, eps)
    got = kv.rms_norm(x.clone(), weight.clone(), eps)
    assert isinstance(got, torch.Tensor), f"rms_norm should return a tensor, got {type(got).__name__}"
    assert tuple(got.shape) == tuple(want.shape), (
        f"{where}: rms_norm should keep x's shape {tuple(x.shape)}, got {tuple(got.shape)}"
    )
    assert got.dtype == x.dtype, f"{where}: rms_norm should return x's dtype ({x.dtype}), got {got.dtype}"
    got = got.detach()
    if not torch.isfinite(got).all() and torch.isfinite(want).all():
        if not x.any(dim=-1).all():
            raise AssertionError(f"{where}: an all-zero row came out as nan or inf: its denominator was 0 (0 / 0)")
        raise AssertionError(
            f"{where}: the output holds inf or nan, where RMSNorm's of these {x.dtype} values is finite"
        )
    if torch.allclose(got.double(), want.double(), rtol=rtol, atol=atol):
        return
    for wrong, message in slips:
        if torch.allclose(got.double(), wrong.double(), rtol=rtol, atol=atol):
            if message is _NOT_EACH_TOKEN:
                message = tr(
                    "with the weight divided out, the first tokens' root-mean-squares should be {want}, got {got}",
                    want=_token_rms(want, weight),
                    got=_token_rms(got, weight),
                )
            raise _failed(where, message)
    if x.dtype in (torch.float16, torch.bfloat16) and (got == 0).any() and not (want == 0).any():
        raise AssertionError(
            f"{where}: {int((got == 0).sum())} outputs came out as 0, where RMSNorm's of these {x.dtype} values are "
            "not: the largest values vanished"
        )
    raise AssertionError(
        f"{where}: rms_norm differs from RMSNorm by up to {(got.double() - want.double()).abs().max().item():.2g}"
    )


@check("2.5")
def rms_norm_matches_the_model(kv, rng):
    """Check rms_norm against RMSNorm modules: a random one (batch 2, 5 tokens, 12 features) and the tiny model's first."""
    x = torch.from_numpy(rng.normal(loc=1.5, scale=2.0, size=(2, 5, 12))).float()
    weight = torch.from_numpy(rng.uniform(0.5, 2.0, size=12)).float()
    _judge_rms(kv, x, weight, 1e-5, tr("x of shape (2, 5, 12)"))
    model, tokenizer = load_tiny()
    norm = model.layers[0].attn_norm
    with torch.no_grad():
        x = model.embed(torch.tensor([tokenizer.encode("法国的首都是")]))  # (1, 6, 128): the residual stream at layer 0
    _judge_rms(kv, x, norm.weight.detach(), norm.eps, tr("the tiny model's layer 0 attn_norm on 法国的首都是"))


@check("2.5")
def rms_norm_holds_at_the_edges(kv, rng):
    """Check the eps you are given (0.5, on small rows), an all-zero row (zeros out, no nan) and one token of shape (d_model,)."""
    x = torch.from_numpy(rng.normal(scale=0.3, size=(3, 7))).float()
    x[1] = 0.0
    weight = torch.from_numpy(rng.uniform(0.5, 2.0, size=7)).float()
    _judge_rms(kv, x, weight, 0.5, tr("rows of size ~0.3 with eps=0.5, row 1 all zero"))
    _judge_rms(kv, x[0].clone(), weight, 1e-5, tr("one token of shape (7,)"))


@check("2.5")
def rms_norm_holds_for_large_float16_values(kv, rng):
    """Check float16 hidden states with values up to 400: the result finite, float16, and equal to RMSNorm's."""
    x = torch.from_numpy(rng.uniform(-400, 400, size=(2, 3, 16))).half()
    weight = torch.from_numpy(rng.uniform(0.5, 2.0, size=16)).half()
    _judge_rms(kv, x, weight, 1e-5, tr("float16 x with values up to 400"), rtol=2e-3, atol=2e-3)


# ---------------------------------------------------------------------------------------------
# 2.6 swiglu


def _mlp(seed: int, d_model: int, hidden_dim: int) -> MLP:
    torch.manual_seed(seed)
    config = ModelConfig(vocab_size=11, d_model=d_model, n_layers=1, n_heads=1, n_kv_heads=1, hidden_dim=hidden_dim)
    return MLP(config).eval()


def _judge_swiglu(kv, mlp, x, where, rtol=1e-4, atol=1e-5):
    Wg, Wu, Wd = (p.detach().clone() for p in (mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight))
    silu, g, u = F.silu, x @ Wg.T, x @ Wu.T
    with torch.no_grad():
        want = mlp(x)
    slips = [
        (
            (silu(u) * g) @ Wd.T,
            tr("the branches are swapped: SiLU went through w_up's projection, w_gate's passed as is"),
        ),
        ((torch.sigmoid(g) * u) @ Wd.T, tr("the gate is sigmoid(z), not SiLU(z)")),
        (silu(g * u) @ Wd.T, tr("SiLU went through the product of the two branches, not through one branch before it")),
        ((silu(g) * silu(u)) @ Wd.T, tr("SiLU went through both branches")),
        ((torch.relu(g) * u) @ Wd.T, tr("the gate is ReLU(z), not SiLU(z)")),
        ((silu(g) + u) @ Wd.T, tr("the branches are added, not multiplied")),
    ]
    try:
        got = kv.swiglu(x.clone(), Wg.clone(), Wu.clone(), Wd.clone())
    except Exception as err:  # a wrong matrix orientation fails inside torch: name it
        if "cannot be multiplied" in str(err) or "size mismatch" in str(err):
            raise AssertionError(
                f"{where}: {err}: nn.Linear stores its weight as (out_features, in_features), so x @ W.T applies it"
            ) from err
        raise
    if isinstance(got, torch.Tensor) and got.shape[-1] == Wd.shape[1] != Wd.shape[0]:
        raise AssertionError(
            f"{where}: the result is hidden_dim wide: w_down (d_model, hidden_dim) brings it back to d_model"
        )
    assert not isinstance(got, torch.Tensor) or got.dtype == x.dtype, (
        f"{where}: swiglu returned {got.dtype} for {x.dtype} x: return x's dtype (the model's layers run in it: a "
        "16-bit model's MLP gives 16-bit hidden states; compute in float32 if you like, then .to(x.dtype))"
    )
    _judge(got, want, slips, where, "swiglu", rtol, atol)


@check("2.6")
def swiglu_matches_the_model(kv, rng):
    """Check swiglu against a random MLP (12 features, 20 hidden, batch 2, 5 tokens) and the tiny model's layer 0 MLP."""
    mlp = _mlp(int(rng.integers(1000)), 12, 20)
    _judge_swiglu(
        kv, mlp, torch.from_numpy(rng.normal(size=(2, 5, 12))).float(), tr("an MLP of 12 -> 20 -> 12, x (2, 5, 12)")
    )
    model, tokenizer = load_tiny()
    layer = model.layers[0]
    with torch.no_grad():
        x = layer.mlp_norm(model.embed(torch.tensor([tokenizer.encode("法国的首都是")])))  # (1, 6, 128)
    _judge_swiglu(kv, layer.mlp, x, tr("the tiny model's layer 0 MLP on 法国的首都是"))


@check("2.6")
def swiglu_takes_any_leading_axes(kv, rng):
    """Check one token of shape (d_model,) and a (3, 2, 4, d_model) batch, on an MLP narrower inside (10 -> 6 -> 10),
    and the same MLP in bfloat16 (the result in x's dtype)."""
    mlp = _mlp(int(rng.integers(1000)), 10, 6)
    _judge_swiglu(kv, mlp, torch.from_numpy(rng.normal(size=10)).float(), tr("one token, x of shape (10,)"))
    _judge_swiglu(kv, mlp, torch.from_numpy(rng.normal(size=(3, 2, 4, 10))).float(), tr("x of shape (3, 2, 4, 10)"))
    x16 = torch.from_numpy(rng.normal(size=(2, 5, 10))).to(torch.bfloat16)
    _judge_swiglu(kv, mlp.to(torch.bfloat16), x16, tr("a bfloat16 MLP, x (2, 5, 10) bfloat16"), rtol=3e-2, atol=3e-2)


# ---------------------------------------------------------------------------------------------
# 2.7 temper: a prediction, graded against softmax(logits / t) of the logits that gave the probabilities


def _temper_slips(logits, t):
    """softmax(logits / t) from float64 logits, and what each likely slip gives from their probabilities."""
    p = torch.softmax(logits.double(), dim=-1)
    with np.errstate(all="ignore"):
        slips = [
            (
                p,
                tr(
                    "the probabilities came back unchanged, as at t = 1: dividing probabilities by t changes nothing "
                    "once a row is renormalised"
                ),
            ),
            (
                (p**t) / (p**t).sum(-1, keepdim=True),
                tr("p was raised to the power t: t > 1 should flatten, t < 1 sharpen"),
            ),
            (
                torch.softmax(p / t, dim=-1),
                tr("softmax of the probabilities divided by t: probabilities are not logits, and softmax takes logits"),
            ),
            (p ** (1 / t), tr("the rows do not sum to 1: each is the right one times a number of its own")),
        ]
    return torch.softmax(logits.double() / t, dim=-1), slips


def _judge_temper(kv, logits, t, where, dtype=torch.float32, atol=1e-5):
    want, slips = _temper_slips(logits, t)
    probs = torch.softmax(logits.double(), dim=-1).to(dtype)
    got = kv.temper(probs.clone(), t)
    assert isinstance(got, torch.Tensor), f"temper should return a tensor, got {type(got).__name__}"
    assert tuple(got.shape) == tuple(probs.shape), (
        f"{where}: temper should keep the shape {tuple(probs.shape)}, got {tuple(got.shape)}"
    )
    assert got.dtype == dtype, f"{where}: temper should return probs' dtype ({dtype}), got {got.dtype}"
    got = got.detach().double()
    if not torch.isfinite(got).all():
        raise AssertionError(
            f"{where}: the result holds nan or inf: at t = {t:g}, p ** (1 / t) underflows to 0 for every token of "
            f"a row (0.3 ** {1 / t:g} is below {dtype}'s smallest number), and 0 / 0 is nan"
        )
    if torch.allclose(got, want, rtol=1e-4, atol=atol):
        return
    for wrong, message in slips:
        if wrong.shape == got.shape and torch.allclose(got, wrong, rtol=1e-4, atol=atol):
            raise _failed(where, message)
    raise AssertionError(
        f"{where}: temper differs from softmax(logits / {t:g}) by up to {(got - want).abs().max().item():.2g}"
    )


@check("2.7")
def temper_matches_softmax_of_scaled_logits(kv, rng):
    """Check temper against softmax(logits / t) at t = 0.5, 2 and 3, on a (2, 3, 11) batch and one row of 405."""
    logits = torch.from_numpy(rng.normal(scale=2.0, size=(2, 3, 11)))
    for t in (0.5, 2.0, 3.0):
        _judge_temper(kv, logits, t, tr("a (2, 3, 11) batch at t = {t:g}", t=t))
    row = torch.from_numpy(rng.normal(scale=4.0, size=405))
    row[int(rng.integers(405))] += 20.0  # one token nearly certain, as 巴 is after 法国的首都是
    _judge_temper(kv, row, 3.0, tr("one row of 405 tokens, one of them nearly certain, at t = 3"), dtype=torch.float64)


@check("2.7")
def temper_is_greedy_at_zero_and_finite_when_cold(kv, rng):
    """Check t = 1 (unchanged), t = 0 (one-hot on the most likely token) and t = 0.01 on float32 rows whose largest
    probability is about 0.3 (the power 1/t underflows float32 there)."""
    logits = torch.from_numpy(rng.normal(size=(4, 9)))
    _judge_temper(kv, logits, 1.0, "t = 1")
    probs = torch.softmax(logits, dim=-1).float()
    got = kv.temper(probs.clone(), 0.0)
    want = torch.nn.functional.one_hot(probs.argmax(dim=-1), 9).float()
    assert isinstance(got, torch.Tensor) and tuple(got.shape) == (4, 9), (
        f"temper(probs, 0) should be (4, 9), one-hot rows, got {getattr(got, 'shape', got)}"
    )
    assert torch.equal(got.detach().float(), want), (
        "at t = 0 every row should be one-hot on its most likely token (greedy), 1.0 there and 0.0 elsewhere"
    )
    cold = torch.from_numpy(np.log([0.3, 0.29, 0.25, 0.16]) + rng.normal(scale=1e-3, size=(3, 4)))
    _judge_temper(kv, cold, 0.01, tr("float32 rows whose largest probability is about 0.3, at t = 0.01"), atol=1e-4)


# ---------------------------------------------------------------------------------------------
# 2.8 param_counts: a prediction, graded against the parameters of the decoder the config builds


def _param_slips(config: ModelConfig) -> dict[str, list[tuple[int, str]]]:
    """Per part, what each likely slip gives (from the config's sizes), and what to say about it."""
    C, D, L, H, H_kv, F, V = (
        config.d_model,
        config.head_dim,
        config.n_layers,
        config.n_heads,
        config.n_kv_heads,
        config.hidden_dim,
        config.vocab_size,
    )
    layers = tr("each part is summed over all n_layers layers")
    return {
        "attention": [
            (
                L * 4 * C * H * D,
                tr(
                    "attention is counted as if keys and values had n_heads heads, as many as the queries: this config has fewer"
                ),
            ),
            (
                L * (C * H * D + 2 * C * H_kv * D),
                tr("o_proj is missing: it maps the heads side by side back to d_model"),
            ),
            (2 * C * H * D + 2 * C * H_kv * D, layers),
        ],
        "mlp": [
            (L * 2 * C * F, tr("SwiGLU has three matrices (gate, up and down), not two")),
            (3 * C * F, layers),
        ],
        "norms": [
            (2 * L * C, tr("the RMSNorm before the lm_head is missing: two a layer, and one more at the end")),
            ((2 * L + 1), tr("each RMSNorm holds d_model weights, one scale per feature")),
            (2 * C, layers),
        ],
        "lm_head": [
            (
                0,
                tr(
                    "the lm_head is missing: this decoder's is its own vocab_size x d_model matrix, not the embedding's"
                ),
            )
        ],
        "embedding": [(V, tr("the embedding holds a row of d_model numbers for each of vocab_size tokens"))],
    }


# Past any machine: a config widened 2**k times (d_model, hidden_dim, vocab_size) holds matrices of more than 2**63
# numbers each, past the 64-bit integers torch counts a tensor's size in, so no decoder of it can be built, not even on
# torch's meta device (nor transformers' on it). A prediction reaches it by arithmetic; Python's ints are exact at any size.
INT64 = 2**63


def _widened(config: ModelConfig, factor: int) -> ModelConfig:
    """config with d_model, hidden_dim and vocab_size times factor (head_dim too): the same shape, too wide to build."""
    wide = dataclasses.replace(
        config,
        vocab_size=config.vocab_size * factor,
        d_model=config.d_model * factor,
        hidden_dim=config.hidden_dim * factor,
    )
    assert min(wide.d_model * wide.n_kv_heads * wide.head_dim, wide.d_model * wide.vocab_size) > INT64
    return wide


def _weight_shapes(config: ModelConfig) -> dict[str, list[tuple[int, ...]]]:
    """Every weight's shape, part by part, from the config alone, as Decoder lays them out (kvlib/core/model.py)."""
    C, D, L, F, V = config.d_model, config.head_dim, config.n_layers, config.hidden_dim, config.vocab_size
    q, kv = config.n_heads * D, config.n_kv_heads * D
    return {
        "embedding": [(V, C)],
        "attention": [(q, C), (kv, C), (kv, C), (C, q)] * L,  # q_proj, k_proj, v_proj, o_proj
        "mlp": [(F, C), (F, C), (C, F)] * L,  # gate_proj, up_proj, down_proj
        "norms": [(C,), (C,)] * L + [(C,)],  # attn_norm, mlp_norm; the last one before the lm_head
        "lm_head": [(V, C)],
    }


def _expected_params(config: ModelConfig) -> dict[str, int]:
    """Each part's parameters, counted from the shapes Decoder would give its weights (none built)."""
    return {part: sum(math.prod(shape) for shape in shapes) for part, shapes in _weight_shapes(config).items()}


def _judge_params(kv, config: ModelConfig, want: dict[str, int], where: str) -> None:
    slips = _param_slips(config)
    try:
        got = kv.param_counts(copy.deepcopy(config))
    except ExerciseNotDone:
        raise
    except Exception as err:
        if config.d_model * config.vocab_size <= INT64:
            raise
        raise AssertionError(
            f"{where}: param_counts raised {type(err).__name__}: {str(err)[:200]}. A decoder of these sizes cannot be "
            "built, not even on torch's meta device (every matrix holds more than 2**63 numbers): predict each part "
            "from the config's sizes with arithmetic, building nothing"
        ) from err
    assert isinstance(got, dict), f"param_counts should return a dict of the five parts, got {type(got).__name__}"
    assert set(got) == set(PARTS), f"param_counts should have exactly the keys {list(PARTS)}, got {sorted(got)}"
    for part in PARTS:
        value = got[part]
        assert isinstance(value, (int, np.integer)) and not isinstance(value, bool), (
            f"{where}: {part} should be an int, got {type(value).__name__}"
        )
        if int(value) == want[part]:
            continue
        for wrong, message in slips[part]:
            if int(value) == wrong:
                raise AssertionError(
                    f"{where}: {part} came to {int(value):,} where the config gives {want[part]:,}: {message}"
                )
        if (int(value) - want[part]) % (2 * INT64) == 0:
            raise AssertionError(
                f"{where}: {part} came to {int(value):,} where the config gives {want[part]:,}: the count overflowed a 64-bit integer (numpy's "
                "int64 wraps past 9.2e18): compute with Python's ints, which are exact at any size"
            )
        if abs(int(value) - want[part]) <= 1e-12 * want[part]:
            raise AssertionError(
                f"{where}: {part} came to {int(value):,} where the config gives {want[part]:,}: its last digits were lost to float arithmetic "
                "(a float holds 16 significant digits): keep to ints"
            )
        raise AssertionError(f"{where}: {part} should be {want[part]:,}, got {int(value):,}")


@check("2.8")
def param_counts_match_built_decoders(kv, rng):
    """Check the prediction against the parameters counted in two built decoders, the tiny model's config and a GQA one
    of other sizes (3 layers, 6 query heads sharing 2 key/value heads of 4, hidden_dim 40, 37 tokens), and against the
    weights' shapes where that GQA config is widened 2**31 times, past any machine."""
    model, _ = load_tiny()
    _judge_params(kv, model.config, counted_params(model), tr("the tiny model's config"))
    torch.manual_seed(int(rng.integers(1000)))
    gqa = ModelConfig(vocab_size=37, d_model=24, n_layers=3, n_heads=6, n_kv_heads=2, hidden_dim=40, max_seq_len=16)
    _judge_params(kv, gqa, counted_params(Decoder(gqa)), tr("a GQA config (d_model 24, 6 heads, 2 KV heads, 3 layers)"))
    wide = _widened(gqa, 2**31)
    _judge_params(
        kv,
        wide,
        _expected_params(wide),
        tr("that GQA config widened 2**31 times (d_model {d_model:,})", d_model=wide.d_model),
    )


@check("2.8")
def param_counts_scale_to_real_configs(kv, rng):
    """Check the prediction for Llama-2-7B (MHA) and Llama-3-8B (GQA-8), too large to build here, against the
    parameters their configs give (kvlib/core/configs.py: 6.74 and 8.03 billion, as published), and part by part where
    Llama-3-8B is widened 2**29 times, past any machine."""
    for name in ("Llama-2-7B", "Llama-3-8B"):
        real = REAL_MODELS[name]
        got = kv.param_counts(copy.deepcopy(real.config))
        assert isinstance(got, dict) and set(got) == set(PARTS), (
            f"param_counts should return a dict with the keys {list(PARTS)}, got {got!r}"[:300]
        )
        total = sum(int(v) for v in got.values())
        assert total == real.params, (
            f"{name}: the parts add up to {total:,} parameters; its config builds {real.params:,} ({real.source})"
        )
    wide = _widened(REAL_MODELS["Llama-3-8B"].config, 2**29)
    _judge_params(
        kv,
        wide,
        _expected_params(wide),
        tr("Llama-3-8B widened 2**29 times (d_model {d_model:,})", d_model=wide.d_model),
    )
