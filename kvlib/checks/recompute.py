"""Checks for notebook 03 (kvlib/recompute.py): exercises 3.1-3.4.

The FLOP count is checked against torch's own FLOP counter on models whose every size differs
(so a swapped or missing factor shows), and the known slips are named: the factor 2 of a
multiply-add, the lm_head, the attention term, the key/value heads of GQA (projections per KV head,
attention products per query head); for a whole generation,
the prefill and the number of keys each kept step sees; for the length at which attention takes half (3.4, a
prediction graded against the count and torch's counter, on real models far past their contexts too), the causal
half, the KV heads, one product, half of the rest, the lm_head, the last length below half, more than half.
Every expected value comes from torch's counter or the formulas here, never from the learner's functions, and each
call gets its own config. The texts a message is built from (a slip's name, which model) go through tr(), so
that the catalogue (kvlib/course/i18n.py) translates them as it does the messages.
"""

from __future__ import annotations

import math
from dataclasses import replace
from numbers import Integral

from kvlib.checks import check
from kvlib.core.configs import REAL_MODELS
from kvlib.core.flops import attention_flops_counted, forward_flops_counted
from kvlib.core.model import Decoder, ModelConfig
from kvlib.course.i18n import tr

# every size distinct: vocab, width, layers, heads, KV heads, MLP width
ODD = ModelConfig(vocab_size=50, d_model=48, n_layers=3, n_heads=6, n_kv_heads=2, hidden_dim=80, max_seq_len=64)


def _terms(config):
    C, D, H, H_kv = config.d_model, config.head_dim, config.n_heads, config.n_kv_heads
    layer = C * H * D + 2 * C * H_kv * D + H * D * C + 3 * C * config.hidden_dim
    return layer, C * config.vocab_size


def _diagnose(got, config, T, expected) -> str:
    layer, head = _terms(config)
    L, D, H = config.n_layers, config.head_dim, config.n_heads
    proj, attn = 2 * T * (L * layer + head), L * 4 * T * T * D * H
    C, H_kv = config.d_model, config.n_kv_heads
    mha_layer = layer + 2 * C * (H - H_kv) * D
    hints = {
        expected // 2: tr("exactly half: count 2 FLOPs per multiply-add"),
        proj: tr(
            "the attention term is missing: the scores q @ k^T and the weighted sum probs @ v are matrix products too"
        ),
        expected - 2 * T * head: tr("the lm_head (d_model x vocab_size, for every position) is missing"),
        2 * T * (L * mha_layer + head) + attn: tr(
            "the k and v projections are counted too large for this GQA config (n_kv_heads < n_heads)"
        ),
        proj + L * 4 * T * T * D * H_kv: tr(
            "attention's two products are counted too small for this GQA config (n_kv_heads < n_heads): what does "
            "GQA share between query heads, and what not?"
        ),
        2 * T * L * layer + attn: tr("the lm_head (d_model x vocab_size, for every position) is missing"),
        proj + attn // 2: tr(
            "attention counted once: a layer's attention makes two matrix products, q @ k^T and probs @ v"
        ),
        proj + L * 2 * T * (T + 1) * D * H: tr(
            "attention counted over the causal half only: SDPA computes the full (T, S) matrix"
        ),
    }
    return hints.get(got, tr("expected {expected} FLOPs, got {got}", expected=f"{expected:,}", got=f"{got:,}"))


@check("3.1")
def forward_flops_matches_torch_counter(kv, rng):
    """Check that forward_flops equals torch.utils.flop_counter on a GQA model with distinct sizes."""
    model = Decoder(ODD).eval()
    for T in (1, 5, 17):
        expected = forward_flops_counted(model, T)
        got = kv.forward_flops(replace(ODD), T)
        assert isinstance(got, int), f"forward_flops should return an int, got {type(got).__name__}"
        assert got == expected, f"seq_len {T}: {_diagnose(got, ODD, T, expected)}"


@check("3.1")
def forward_flops_grows_quadratically(kv, rng):
    """Check that the work per forward has a part linear and a part quadratic in seq_len."""
    f = [kv.forward_flops(replace(ODD), T) for T in (10, 20, 30)]
    second_difference = f[2] - 2 * f[1] + f[0]
    assert second_difference > 0, "the attention work grows with seq_len squared: the count should curve upward"
    layer, head = _terms(ODD)
    assert f[1] - f[0] > 2 * 10 * (ODD.n_layers * layer + head) - 1, "each extra token adds at least its projections"


@check("3.2")
def new_token_flops_matches_torch_counter(kv, rng):
    """Check new_token_flops against torch's counter: last-token projections plus one query over kv_len keys."""
    model = Decoder(ODD).eval()
    layer, head = _terms(ODD)
    for S in (1, 9, 40):
        one = forward_flops_counted(model, 1)  # projections + lm_head of one token, and its 1 x 1 attention
        expected = one + ODD.n_layers * 4 * (S - 1) * ODD.head_dim * ODD.n_heads
        got = kv.new_token_flops(replace(ODD), S)
        assert isinstance(got, int), f"new_token_flops should return an int, got {type(got).__name__}"
        if got == one and S > 1:
            raise AssertionError(
                "attention's part did not grow with kv_len: the new query still meets every key, kept or its own"
            )
        if got == expected - ODD.n_layers * 2 * S * ODD.head_dim * ODD.n_heads:
            raise AssertionError(
                "attention counted once: the new query meets the keys (q @ k^T), and its weights meet the values "
                "(probs @ v)"
            )
        if got == expected - ODD.n_layers * 4 * S * ODD.head_dim * (ODD.n_heads - ODD.n_kv_heads):
            raise AssertionError(
                "attention counted too small for this GQA config (n_kv_heads < n_heads): what does GQA share between "
                "query heads, and what not?"
            )
        if S > 1 and got == one + ODD.n_layers * 4 * (S * S - 1) * ODD.head_dim * ODD.n_heads:
            raise AssertionError("attention counted for kv_len queries: only the one new query meets the kv_len keys")
        assert got == expected, f"kv_len {S}: expected {expected:,} FLOPs, got {got:,}"


def _forward(config, T) -> int:
    layer, head = _terms(config)
    return 2 * T * (config.n_layers * layer + head) + config.n_layers * 4 * T * T * config.head_dim * config.n_heads


def _new_token(config, S) -> int:
    layer, head = _terms(config)
    return 2 * (config.n_layers * layer + head) + config.n_layers * 4 * S * config.head_dim * config.n_heads


@check("3.3")
def generation_flops_matches_counts(kv, rng):
    """Check naive and kept totals of whole generations: every naive step a full forward, kept steps one token after the prefill."""
    for P, n in ((5, 8), (1, 20), (30, 3)):
        naive = sum(_forward(ODD, P + i) for i in range(n))
        kept = _forward(ODD, P) + sum(_new_token(ODD, P + i) for i in range(1, n))
        slips = {
            (
                naive,
                _new_token(ODD, P) + sum(_new_token(ODD, P + i) for i in range(1, n)),
            ): tr(
                "the prefill is counted as one new token: at step 0 nothing is kept yet, and the whole prompt has to run"
            ),
            (
                naive,
                _forward(ODD, P) + sum(_new_token(ODD, P + i - 1) for i in range(1, n)),
            ): tr(
                "one key short at every kept step: the new token's query meets its own key too, besides every earlier one"
            ),
            (
                naive,
                _forward(ODD, P) + sum(_new_token(ODD, P + i + 1) for i in range(1, n)),
            ): tr("one key too many at every kept step: a key counted that no token has made yet"),
            (
                sum(_forward(ODD, P + i + 1) for i in range(n)),
                kept,
            ): tr("one token too many at every naive step: the token a step is about to choose is not an input yet"),
            (
                naive,
                sum(_new_token(ODD, P + i) for i in range(1, n)),
            ): tr("the prefill is missing from the kept total: before any token is kept, the prompt itself has to run"),
            (kept, naive): tr("the pair is the wrong way round: return (naive, kept)"),
            (
                naive,
                sum(_new_token(ODD, p) for p in range(1, P + 1)) + sum(_new_token(ODD, P + i) for i in range(1, n)),
            ): tr(
                "the prefill is counted as prompt_len single tokens, one after another: the prompt runs in one "
                "forward, and its attention is a whole (prompt_len, prompt_len) score matrix, as Exercise 3.1 counts it"
            ),
        }
        got = kv.generation_flops(replace(ODD), P, n)
        assert isinstance(got, tuple) and len(got) == 2, (
            f"generation_flops should return a pair (naive, kept), got {type(got).__name__}"
        )
        assert all(isinstance(x, int) for x in got), (
            f"both counts should be ints, got {type(got[0]).__name__}, {type(got[1]).__name__}"
        )
        if got == (naive, kept):
            continue
        if tuple(got) in slips:
            raise AssertionError(f"prompt_len {P}, {n} new tokens: {slips[tuple(got)]}")
        raise AssertionError(
            f"prompt_len {P}, {n} new tokens: expected (naive, kept) = ({naive:,}, {kept:,}), got ({got[0]:,}, {got[1]:,})"
        )


@check("3.3")
def generation_flops_one_token_is_a_prefill(kv, rng):
    """Check that one new token costs one forward over the prompt either way, and that keeping saves more the longer the generation."""
    P = 7
    one = _forward(ODD, P)
    got = kv.generation_flops(replace(ODD), P, 1)
    assert tuple(got) == (one, one), (
        f"the first token needs one forward over the {P}-token prompt, naive or not: expected ({one:,}, {one:,}), got {got}"
    )
    ratios = []
    for n in (4, 16, 57):
        naive, kept = kv.generation_flops(replace(ODD), P, n)
        ratios.append(naive / kept)
    assert ratios == sorted(ratios) and ratios[0] > 1, (
        f"naive / kept should exceed 1 and grow with the length, got {[round(r, 2) for r in ratios]}"
    )


# ---------------------------------------------------------------------------------------------
# 3.4 attention_half_length: a prediction, graded against the count


def _half(rest: int, per_key: int) -> int:
    """The first T >= 1 with per_key * T >= rest: where attention (per_key * T * 2T) meets the rest (rest * 2T)."""
    return max(1, -(-rest // per_key))


def _half_slips(config) -> dict[str, object]:
    """What the half length comes out as under each likely slip, by the slip's message."""
    L, C, D, H, H_kv = config.n_layers, config.d_model, config.head_dim, config.n_heads, config.n_kv_heads
    layer, head = _terms(config)
    rest, per_key = L * layer + head, 2 * L * H * D  # the count: 2 T rest + 2 T^2 per_key
    mha_layer = layer + 2 * C * (H - H_kv) * D
    return {
        tr(
            "attention counted over the causal half only: Exercise 3.1's count (and torch's) takes the full "
            "(seq_len, seq_len) score matrix, masked entries included"
        ): max(1, _half(2 * rest, per_key) - 1),
        tr(
            "attention counted for n_kv_heads heads: every one of the n_heads query heads computes its own scores and "
            "weighted sum (this config is GQA)"
        ): _half(rest, 2 * L * H_kv * D),
        tr("the k and v projections counted for n_heads heads: they have n_kv_heads (this config is GQA)"): _half(
            L * mha_layer + head, per_key
        ),
        tr(
            "attention against half of the rest (a ratio of 1/2), not half of the whole forward: the share is attention "
            "over all of forward_flops"
        ): _half(rest, 2 * per_key),
        tr("only one of attention's two products: q @ k^T and probs @ v cost the same"): _half(2 * rest, per_key),
        tr("the lm_head left out: it is part of a forward's FLOPs"): _half(L * layer, per_key),
        tr("that is the last length below one half: the first at or above it is asked"): _half(rest, per_key) - 1,
        tr("attention takes exactly half there, which counts: 'at least half', not more than half"): rest // per_key
        + 1,
    }


@check("3.4")
def attention_half_length_matches_the_count(kv, rng):
    """Check the half length of a GQA model with distinct sizes and of real models (MQA, MHA, GQA; Llama-2-7B's
    attention takes exactly half at its length), far past their contexts: arithmetic only, no model is built."""
    cases = {tr("the GQA test model"): ODD, **{name: _real(name) for name in ("Falcon-7B", "Llama-2-7B", "Llama-3-8B")}}
    for name, config in cases.items():
        layer, head = _terms(config)
        expected = _half(config.n_layers * layer + head, 2 * config.n_layers * config.n_heads * config.head_dim)
        got = kv.attention_half_length(replace(config))
        assert isinstance(got, Integral) and not isinstance(got, bool), (
            f"{name}: attention_half_length should return an int number of tokens, got {got!r}"
        )
        got = int(got)
        if got == expected:
            continue
        for slip, value in _half_slips(config).items():
            if got == value != expected:
                raise AssertionError(f"{name}: {slip}")
        raise AssertionError(
            f"{name}: expected attention to reach half of the forward at {expected:,} tokens, got {got:,}"
        )


@check("3.4")
def attention_half_length_is_where_torchs_counter_finds_half(kv, rng):
    """Check, with torch's own FLOP counter on a small GQA model built long enough, that attention takes under half
    of a forward one token before the predicted length and at least half at it."""
    T = kv.attention_half_length(replace(ODD))
    assert isinstance(T, Integral) and not isinstance(T, bool) and 1 < T < 4 * ODD.max_seq_len, (
        f"the GQA test model: expected a length between 2 and {4 * ODD.max_seq_len - 1}, got {T!r}"
    )
    T = int(T)
    model = Decoder(replace(ODD, max_seq_len=T))
    shares = [attention_flops_counted(model, n) / forward_flops_counted(model, n) for n in (T - 1, T)]
    assert shares[0] < 0.5 <= shares[1], (
        f"torch's counter finds attention's share {shares[0]:.4f} at {T - 1} tokens and {shares[1]:.4f} at {T}: "
        "the length asked is the first at which it reaches one half"
    )


def _real(name: str):
    return replace(REAL_MODELS[name].config)
