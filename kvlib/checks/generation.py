"""Checks for notebook 02 (kvlib/generation.py): exercises 2.1-2.3.

The loop is checked on small random decoders against a greedy loop written here, and on the
shipped tiny model against the capital question; timing is checked on a stand-in model whose
forward sleeps a known time per token, so that the expected TTFT and TPOT are known.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from kvlib.checks import check
from kvlib.core.model import Decoder, ModelConfig, SlowDecoder


def _model(seed: int, **sizes) -> Decoder:
    torch.manual_seed(seed)
    config = ModelConfig(**{"vocab_size": 23, "d_model": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
                            "hidden_dim": 48, "max_seq_len": 64, **sizes})
    return Decoder(config).eval()


def _greedy(model, ids, n):
    """A plain greedy loop, to compare with."""
    with torch.inference_mode():
        for _ in range(n):
            ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids


def _tokens(result, batch, what):
    assert isinstance(result, torch.Tensor), f"{what} should return a tensor, got {type(result).__name__}"
    assert result.shape == (batch,), f"{what} should return shape ({batch},), one token per row, got {tuple(result.shape)}"
    assert result.dtype == torch.long, f"{what} should return token ids (torch.long), got {result.dtype}"
    return result


# ---------------------------------------------------------------------------------------------
# 2.1 next_token


@check("2.1")
def next_token_greedy_is_argmax(kv, rng):
    """Check that temperature 0 picks the most likely token of each row."""
    logits = torch.from_numpy(rng.normal(size=(3, 11))).float()
    tokens = _tokens(kv.next_token(logits), 3, "next_token(logits)")
    assert torch.equal(tokens, logits.argmax(dim=-1)), (
        f"greedy should pick argmax over the vocabulary (dim=-1): expected {logits.argmax(-1).tolist()}, got {tokens.tolist()}"
    )


@check("2.1")
def next_token_samples_from_softmax(kv, rng):
    """Check that sampling at temperature t draws tokens with probability softmax(logits / t)."""
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    for t in (1.0, 0.5):
        expected = torch.softmax(logits / t, dim=-1).numpy()
        gen = torch.Generator().manual_seed(int(rng.integers(1 << 30)))
        tokens = _tokens(kv.next_token(logits.expand(4000, 4).clone(), temperature=t, generator=gen), 4000, "next_token")
        freq = np.bincount(tokens.numpy(), minlength=4) / 4000
        if t == 0.5 and np.abs(freq - torch.softmax(logits, -1).numpy()).max() < 0.03:
            raise AssertionError("the temperature changes nothing: divide the logits by the temperature before softmax")
        assert np.abs(freq - expected).max() < 0.04, (
            f"at temperature {t}, tokens should come with probabilities {np.round(expected, 2)}, got frequencies {np.round(freq, 2)}"
        )


@check("2.1")
def next_token_sampling_is_reproducible(kv, rng):
    """Check that the same generator seed gives the same samples, and that samples vary."""
    logits = torch.zeros(64, 5)
    a = _tokens(kv.next_token(logits, temperature=1.0, generator=torch.Generator().manual_seed(7)), 64, "next_token")
    b = kv.next_token(logits, temperature=1.0, generator=torch.Generator().manual_seed(7))
    assert torch.equal(a, b), "sampling should use the generator you are given, so that a seed reproduces it"
    assert len(set(a.tolist())) > 1, "with equal logits, samples should vary: is temperature > 0 sampling at all?"


# ---------------------------------------------------------------------------------------------
# 2.2 generate


@check("2.2")
def generate_matches_greedy_loop(kv, rng):
    """Check that greedy generate equals a plain greedy loop on a random model, batch of 2."""
    model = _model(int(rng.integers(1000)))
    prompt = torch.from_numpy(rng.integers(0, 23, size=(2, 5)))
    out = kv.generate(model, prompt, 7)
    assert isinstance(out, torch.Tensor) and out.shape == (2, 12), f"generate should return (batch, 5 + 7) = (2, 12), got {getattr(out, 'shape', out)}"
    assert torch.equal(out[:, :5], prompt), "the output should start with the prompt, unchanged"
    expected = _greedy(model, prompt, 7)
    assert torch.equal(out, expected), (
        f"greedy tokens differ from a plain loop: expected {expected[0, 5:].tolist()}, got {out[0, 5:].tolist()} "
        "(predict from the LAST position, logits[:, -1], and feed every token so far back in)"
    )


@check("2.2")
def generate_streams_each_token(kv, rng):
    """Check that on_token is called once per new token, in order, as the loop goes."""
    model = _model(3)
    prompt = torch.from_numpy(rng.integers(0, 23, size=(1, 4)))
    seen = []
    out = kv.generate(model, prompt, 5, on_token=lambda token: seen.append(token.clone()))
    assert len(seen) == 5, f"on_token should be called once per new token (5 times), got {len(seen)}"
    assert all(s.shape == (1,) for s in seen), f"on_token should get each token as shape (batch,), got {[tuple(s.shape) for s in seen]}"
    assert torch.equal(torch.stack(seen, dim=1), out[:, 4:]), "on_token should see the tokens in the order they are appended"


@check("2.2")
def generate_answers_the_seed_question(kv, rng):
    """Check that the shipped model, greedy, continues 法国的首都是 with 巴黎."""
    from kvlib.core.weights import load_tiny

    model, tokenizer = load_tiny()
    ids = torch.tensor([tokenizer.encode("法国的首都是")])
    out = kv.generate(model, ids, 2)
    text = tokenizer.decode(out[0, ids.shape[1]:].tolist())
    assert text == "巴黎", f"法国的首都是 should continue with 巴黎, got {text!r}"


@check("2.2")
def generate_samples_reproducibly(kv, rng):
    """Check that sampling with a seeded generator is reproducible and differs from greedy."""
    model = _model(5)
    prompt = torch.zeros(1, 3, dtype=torch.long)
    a = kv.generate(model, prompt, 12, temperature=1.5, generator=torch.Generator().manual_seed(1))
    b = kv.generate(model, prompt, 12, temperature=1.5, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, b), "pass temperature and generator on to next_token: the same seed should give the same text"
    assert not torch.equal(a, _greedy(model, prompt, 12)), "with temperature 1.5 the output should be sampled, not greedy"


# ---------------------------------------------------------------------------------------------
# 2.3 measure_ttft_tpot


def _slow_model() -> SlowDecoder:
    """A decoder whose forward sleeps 4 ms per token in the sequence: known timings."""
    torch.manual_seed(0)
    return SlowDecoder(ModelConfig(vocab_size=11, d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, hidden_dim=16, max_seq_len=64),
                       per_token=0.004).eval()


@check("2.3")
def measure_ttft_tpot_times_prefill_and_steps(kv, rng):
    """Check TTFT and TPOT against a model whose forward takes 4 ms per token in the sequence."""
    model = _slow_model()
    T, n = 6, 5
    result = kv.measure_ttft_tpot(model, torch.zeros(1, T, dtype=torch.long), n)
    assert isinstance(result, tuple) and len(result) == 2, "measure_ttft_tpot should return (ttft, tpots)"
    ttft, tpots = result
    assert isinstance(ttft, float), f"ttft should be a float of seconds, got {type(ttft).__name__}"
    assert len(tpots) == n - 1, f"{n} new tokens have {n - 1} gaps between them: tpots should have {n - 1} entries, got {len(tpots)}"
    expected_ttft = model.per_token * T  # the prefill runs T tokens
    assert 0.9 * expected_ttft <= ttft <= expected_ttft + 0.05, (
        f"the prefill of {T} tokens sleeps {expected_ttft * 1e3:.0f} ms, so TTFT should be about that, got {ttft * 1e3:.1f} ms"
        + (" (did you time the whole generation?)" if ttft > expected_ttft * 3 else "")
    )
    for i, t in enumerate(tpots):
        expected = model.per_token * (T + 1 + i)  # naive step i re-runs T + 1 + i tokens
        assert 0.9 * expected <= t <= expected + 0.05, (
            f"decode step {i + 1} re-runs {T + 1 + i} tokens ({expected * 1e3:.0f} ms), got {t * 1e3:.1f} ms: "
            "tpots[i] is the time between token i and token i + 1"
        )


@check("2.3")
def measure_ttft_tpot_prefill_grows_with_prompt(kv, rng):
    """Check that TTFT grows with the prompt (a prefill of 12 tokens takes longer than one of 2)."""
    model = _slow_model()
    short, _ = kv.measure_ttft_tpot(model, torch.zeros(1, 2, dtype=torch.long), 2)
    long, tpots = kv.measure_ttft_tpot(model, torch.zeros(1, 12, dtype=torch.long), 2)
    assert len(tpots) == 1, f"2 new tokens have 1 gap between them, got {len(tpots)} TPOT values"
    assert long - short > 0.5 * model.per_token * 10, (
        f"a prompt of 12 tokens should take ~40 ms longer to prefill than one of 2 here, got {short * 1e3:.1f} and {long * 1e3:.1f} ms: "
        "TTFT runs from the start of generation to the first new token"
    )
