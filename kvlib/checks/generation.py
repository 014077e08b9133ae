"""Checks for notebook 02 (kvlib/generation.py): exercises 2.1-2.3.

The loop is checked on small random decoders against a greedy loop written here, and on the
shipped tiny model against the capital question; timing is checked on a stand-in model whose
forwards cost known seconds on a fake clock (never real time, so the machine's load cannot
matter), a prefill clearly more than a decode step. Every expected value is computed before the
learner's function runs, or from objects it never sees.
"""

from __future__ import annotations

import contextlib
import copy

import numpy as np
import torch

from kvlib.checks import check
from kvlib.core.model import Attention, Decoder, ModelConfig, SlowDecoder, rotary_tables, rotate_half
from kvlib.core.weights import load_tiny


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
        raise AssertionError("greedy picked the least likely token: argmax, not argmin")
    assert torch.equal(tokens, expected), (
        f"greedy should pick argmax over the vocabulary (dim=-1): expected {expected.tolist()}, got {tokens.tolist()}"
    )


@check("2.1")
def next_token_samples_from_softmax(kv, rng):
    """Check that sampling at temperature t draws tokens with probability softmax(logits / t)."""
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
            raise AssertionError("the temperature changes nothing: divide the logits by the temperature before softmax")
        if t == 0.5 and np.abs(freq - times_t).max() < 0.03:
            raise AssertionError("the logits are multiplied by the temperature: divide them by it (t < 1 sharpens)")
        if np.abs(freq - np.eye(4)[0]).max() < 0.01:
            raise AssertionError(
                f"at temperature {t} every draw is the top token: sample with torch.multinomial, do not take the argmax"
            )
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
    assert torch.equal(a, b), "sampling should use the generator you are given, so that a seed reproduces it"
    assert len(set(a.tolist())) > 1, "with equal logits, samples should vary: is temperature > 0 sampling at all?"
    assert not torch.equal(a, c), (
        "seeds 7 and 8 gave the same 64 draws: draw from the generator you are given, as it is (do not reseed it)"
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
    if torch.equal(out, first_only):
        raise AssertionError(
            "every new token is the same: feed each chosen token back in (append it to the ids) before the next step"
        )
    if torch.equal(out[:, :6], from_first):
        raise AssertionError("the next token is predicted from the first position: use the last one, logits[:, -1]")
    raise AssertionError(
        f"greedy tokens differ from a plain loop: expected {expected[0, 5:].tolist()}, got {out[0, 5:].tolist()} "
        "(predict from the LAST position, logits[:, -1], and feed every token so far back in)"
    )


@check("2.2")
def generate_streams_each_token(kv, rng):
    """Check that on_token is called once per new token, in order, as the loop goes."""
    model = _model(3)
    prompt = torch.from_numpy(rng.integers(0, 23, size=(1, 4)))
    seen = []
    out = kv.generate(copy.deepcopy(model), prompt.clone(), 5, on_token=lambda token: seen.append(token.clone()))
    assert len(seen) == 5, f"on_token should be called once per new token (5 times), got {len(seen)}"
    assert all(s.shape == (1,) for s in seen), (
        f"on_token should get each token as shape (batch,), got {[tuple(s.shape) for s in seen]}"
    )
    assert torch.equal(out[:, :4], prompt), "the output should start with the prompt, unchanged"
    assert torch.equal(torch.stack(seen, dim=1), out[:, 4:]), (
        "on_token should see the tokens in the order they are appended"
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
    assert torch.equal(a, b), "pass temperature and generator on to next_token: the same seed should give the same text"
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
            "with temperature 1.5 every row chose the same token: pass temperature (and generator) on to next_token"
        )
    assert np.abs(freq - expected).max() < 0.04, (
        f"the first sampled token should follow softmax(logits / 1.5) of the model's last position: largest gap "
        f"{np.abs(freq - expected).max():.3f} between frequencies and probabilities"
    )


# ---------------------------------------------------------------------------------------------
# 2.3 measure_ttft_tpot


def _stand_in() -> SlowDecoder:
    """A stand-in whose forwards cost known seconds on a fake clock: a prefill of T tokens 1.1 * T
    units, a naive decode step 1 unit plus a tenth per token of the sequence (1 unit = 10 ms)."""
    torch.manual_seed(0)
    return SlowDecoder(
        ModelConfig(vocab_size=11, d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, hidden_dim=16, max_seq_len=64),
        per_token=0.01,
    ).eval()


def _timed(kv, prompt_len: int, n: int):
    """measure_ttft_tpot on a fresh stand-in, its clocks reading the fake one; and what it should find."""
    model = _stand_in()
    ttft = model.cost(prompt_len, prompt_len)  # the prefill: every prompt token is new
    tpots = [model.cost(prompt_len + i, 1) for i in range(1, n)]  # naive step i runs prompt_len + i tokens, 1 new
    ids = torch.zeros(1, prompt_len, dtype=torch.long)
    remote = getattr(kv.measure_ttft_tpot, "watch", None) is not None  # isolated grading: the child fakes its own clock
    with contextlib.nullcontext() if remote else model.fake_clock(kv):
        result = kv.measure_ttft_tpot(model, ids, n)
    assert isinstance(result, tuple) and len(result) == 2, "measure_ttft_tpot should return (ttft, tpots)"
    got_ttft, got_tpots = result
    assert isinstance(got_ttft, float), f"ttft should be a float of seconds, got {type(got_ttft).__name__}"
    got_tpots = list(got_tpots)
    assert len(got_tpots) == n - 1, (
        f"{n} new tokens have {n - 1} gaps between them: tpots should have {n - 1} entries, got {len(got_tpots)}"
        + (" (the first entry is the prefill: TTFT, not a TPOT)" if len(got_tpots) == n else "")
    )
    assert all(isinstance(t, (float, int)) for t in got_tpots), "tpots should be a list of floats (seconds)"
    return (ttft, tpots), (got_ttft, [float(t) for t in got_tpots])


def _same(a, b) -> bool:
    return abs(a - b) <= 1e-6 + 1e-6 * abs(b)


@check("2.3")
def measure_ttft_tpot_times_prefill_and_steps(kv, rng):
    """Check TTFT and each TPOT on a stand-in whose prefill and decode steps cost known, different times."""
    T, n = 12, 5
    (ttft, tpots), (got_ttft, got_tpots) = _timed(kv, T, n)
    total = ttft + sum(tpots)
    if not _same(got_ttft, ttft):
        hint = ""
        if _same(got_ttft, tpots[0]) or got_ttft < 0.5 * ttft:
            hint = " It looks like the prefill was left out: start the clock before generate, so TTFT includes the first forward."
        elif _same(got_ttft, total):
            hint = " That is the whole generation: TTFT ends when the first token exists (the first on_token call)."
        elif got_ttft > 100:
            hint = " That looks like a clock reading, not a duration: subtract the start time."
        raise AssertionError(
            f"the prefill of {T} tokens takes {ttft * 1e3:.0f} ms here, so TTFT should be that, got {got_ttft * 1e3:.1f} ms.{hint}"
        )
    for i, (t, got) in enumerate(zip(tpots, got_tpots)):
        if _same(got, t):
            continue
        if all(_same(g, total / n) for g in got_tpots) or all(_same(g, sum(tpots) / (n - 1)) for g in got_tpots):
            raise AssertionError(
                "every TPOT is the same number, an average: report each decode step's own time (the gap between "
                f"consecutive tokens), here {', '.join(f'{x * 1e3:.0f}' for x in tpots)} ms"
                + (", and leave the prefill out of it" if _same(got_tpots[0], total / n) else "")
            )
        raise AssertionError(
            f"decode step {i + 1} re-runs {T + 1 + i} tokens and takes {t * 1e3:.0f} ms here, got {got * 1e3:.1f} ms: "
            "tpots[i] is the time between token i and token i + 1"
        )


@check("2.3")
def measure_ttft_tpot_prefill_grows_with_prompt(kv, rng):
    """Check that TTFT grows with the prompt: on the stand-in, a prefill of 12 tokens costs 11 units more than one of 2."""
    (short, _), (got_short, _) = _timed(kv, 2, 2)
    (long, _), (got_long, tpots) = _timed(kv, 12, 2)
    assert len(tpots) == 1, f"2 new tokens have 1 gap between them, got {len(tpots)} TPOT values"
    assert _same(got_long - got_short, long - short), (
        f"a prompt of 12 tokens takes {(long - short) * 1e3:.0f} ms longer to prefill than one of 2 here, got "
        f"{got_short * 1e3:.1f} and {got_long * 1e3:.1f} ms: TTFT runs from the start of generation to the first new token"
    )


# ---------------------------------------------------------------------------------------------
# 2.4 project_qkv


def _rotated(x, cos, sin):
    return x * cos + rotate_half(x) * sin


def _interleaved(x, cos, sin):
    """Rotary on neighbouring pairs (0, 1), (2, 3), ...: the other layout, not this model's."""
    half = x.shape[-1] // 2
    c, s = cos[..., :half].repeat_interleave(2, -1), sin[..., :half].repeat_interleave(2, -1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    turned = torch.stack([-x2, x1], dim=-1).flatten(-2)
    return x * c + turned * s


def _qkv_expectations(attn, h, cos, sin):
    """The model's own q, k, v, and what each likely slip would give instead (all before the call)."""
    with torch.no_grad():
        q, (k, v) = attn.project_q(h, cos, sin), attn.project_kv(h, cos, sin)
        B, T, _ = h.shape
        D = attn.head_dim

        def heads(W, n, split):
            x = h @ W.T
            return x.view(B, T, n, D).transpose(1, 2) if split else x.view(B, n, T, D)

        Wq, Wk, Wv = attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight
        q0, k0, v0 = heads(Wq, attn.n_heads, True), heads(Wk, attn.n_kv_heads, True), heads(Wv, attn.n_kv_heads, True)
        c0, s0 = rotary_tables(D, T)  # the angles of positions 0 .. T-1
        slips = {
            "q": [
                (
                    q0,
                    "q is not rotated: rotary turns queries and keys by their positions' angles, x * cos + rotate_half(x) * sin",
                ),
                (
                    _rotated(heads(Wq, attn.n_heads, False), cos, sin),
                    "the heads are split wrongly: view the projection as (batch, seq_len, n_heads, head_dim), then transpose(1, 2); "
                    "viewing it as (batch, n_heads, seq_len, head_dim) mixes positions into heads",
                ),
                (
                    _interleaved(q0, cos, sin),
                    "rotary turns neighbouring features (0, 1), (2, 3)...: this model pairs feature i with "
                    "i + head_dim/2 (rotate_half)",
                ),
                (
                    _rotated(q0, c0, s0),
                    "q is rotated by the angles of positions 0, 1, ...: use the cos and sin you are given "
                    "(the rows of the table at h's own positions)",
                ),
                (
                    _rotated((h @ Wq).view(B, T, attn.n_heads, D).transpose(1, 2), cos, sin)
                    if Wq.shape[0] == Wq.shape[1]
                    else None,
                    "h @ W multiplies by the matrix untransposed: a Linear layer computes h @ W.T",
                ),
            ],
            "k": [
                (
                    k0,
                    "k is not rotated: keys turn by their positions' angles too, so that q . k depends on the distance between them",
                ),
                (
                    _rotated(k0, c0, s0),
                    "k is rotated by the angles of positions 0, 1, ...: use the cos and sin you are given",
                ),
            ],
            "v": [
                (_rotated(v0, cos, sin), "v is rotated: only queries and keys turn; values are passed on as projected")
            ],
        }
    return (q, k, v), slips


def _check_qkv(result, expected, slips, where):
    assert isinstance(result, tuple) and len(result) == 3, (
        f"project_qkv should return (q, k, v), got {type(result).__name__}"
    )
    for name, got, want in zip("qkv", result, expected):
        assert isinstance(got, torch.Tensor), f"{name} should be a tensor, got {type(got).__name__}"
        assert tuple(got.shape) == tuple(want.shape), (
            f"{name} should have shape {tuple(want.shape)} (batch, {'n_heads' if name == 'q' else 'n_kv_heads'}, seq_len, head_dim), "
            f"got {tuple(got.shape)}"
            + (
                ": k and v have n_kv_heads heads (this layer is GQA)"
                if name != "q" and got.dim() == 4 and got.shape[1] != want.shape[1]
                else ""
            )
        )
        if torch.allclose(got.double(), want.double(), rtol=1e-4, atol=1e-5):
            continue
        for wrong, message in slips[name]:
            if (
                wrong is not None
                and wrong.shape == got.shape
                and torch.allclose(got.double(), wrong.double(), rtol=1e-4, atol=1e-5)
            ):
                raise AssertionError(f"{where}: {message}")
        raise AssertionError(
            f"{where}: {name} differs from the model's own by up to {(got - want).abs().max().item():.2g}"
        )


@check("2.4")
def project_qkv_matches_the_model(kv, rng):
    """Check q, k, v against the model's own projections on a GQA layer (6 query heads, 2 key/value heads) at positions 3-9."""
    torch.manual_seed(int(rng.integers(1000)))
    config = ModelConfig(vocab_size=11, d_model=48, n_layers=1, n_heads=6, n_kv_heads=2, hidden_dim=16, max_seq_len=64)
    attn = Attention(config).eval()
    h = torch.from_numpy(rng.normal(size=(2, 7, 48))).float()
    cos, sin = (t[3:10] for t in rotary_tables(config.head_dim, config.max_seq_len))
    expected, slips = _qkv_expectations(attn, h, cos, sin)
    result = kv.project_qkv(copy.deepcopy(attn), h.clone(), cos.clone(), sin.clone())
    _check_qkv(result, expected, slips, "a layer with 6 query heads and 2 key/value heads, positions 3 to 9")


@check("2.4")
def project_qkv_matches_tiny_layer_0(kv, rng):
    """Check q, k, v of the shipped model's layer 0 for 法国的首都是 against its own projections."""
    model, tokenizer = load_tiny()
    ids = torch.tensor([tokenizer.encode("法国的首都是")])
    T, layer = ids.shape[1], model.layers[0]
    with torch.no_grad():
        h = layer.attn_norm(model.embed(ids))  # (1, T, d_model): layer 0's input after its RMSNorm
    cos, sin = model.rope_cos[:T], model.rope_sin[:T]
    expected, slips = _qkv_expectations(layer.attn, h, cos, sin)
    result = kv.project_qkv(copy.deepcopy(layer.attn), h.clone(), cos.clone(), sin.clone())
    _check_qkv(result, expected, slips, "the tiny model's layer 0 on 法国的首都是")
