"""kvlib/attention.py (notebook 01): the reference passes every check, each check catches the
mistake it names, and bad input gets a ValueError that names the shape."""

import types

import numpy as np
import pytest

from kvlib import attention
from kvlib.checks import CHECKS, checks_for
from kvlib.checks.attention import SEED_K, SEED_Q, SEED_V
from kvlib.course.exercises import BY_ID

ATTENTION_CHECKS = [c for ex in ("1.1", "1.2", "1.3", "1.4") for c in checks_for(BY_ID[ex])]


@pytest.mark.parametrize("check", ATTENTION_CHECKS, ids=lambda c: c.name)
def test_reference_passes_check(check):
    """Check that the reference solution passes every check of notebook 01."""
    check.fn(attention, np.random.default_rng(0))


def test_attend_reproduces_the_seed_numbers():
    """Check the seed article's numbers: 21%, 21%, 58% and [1.940, 1.000]; scaled 0.248, 0.248, 0.503 and [1.759, 1.000]."""
    out, probs = attention.attend(SEED_Q, SEED_K, SEED_V, scale=1.0)
    np.testing.assert_allclose(probs, [0.2119, 0.2119, 0.5761], atol=1e-4)
    np.testing.assert_allclose(out, [1.9403, 1.0], atol=1e-4)
    out, probs = attention.attend(SEED_Q, SEED_K, SEED_V)
    np.testing.assert_allclose(probs, [0.2483, 0.2483, 0.5035], atol=1e-4)
    np.testing.assert_allclose(out, [1.7587, 1.0], atol=1e-4)


def test_causal_self_attention_equals_attend_per_query():
    """Check that the matrix form equals the per-query loop over prefixes (the notebook's claim)."""
    rng = np.random.default_rng(1)
    q, k, v = rng.normal(size=(3, 4)), rng.normal(size=(5, 4)), rng.normal(size=(5, 2))
    out, probs = attention.causal_self_attention(q, k, v)
    for i in range(3):
        o, p = attention.attend(q[i], k[: 3 + i], v[: 3 + i])
        np.testing.assert_allclose(out[i], o)
        np.testing.assert_allclose(probs[i, : 3 + i], p)


# ---------------------------------------------------------------------------------------------
# Each known mistake is caught, with a message that names it.


def _softmax_no_max(x):
    e = np.exp(x)
    return e / e.sum(axis=-1, keepdims=True)


def _softmax_wrong_axis(x):
    e = np.exp(x - x.max(axis=-2, keepdims=True))
    return e / e.sum(axis=-2, keepdims=True)


def _uniform(x):
    return np.full(x.shape, 1 / x.shape[-1])


def _attend_unscaled(q, k, v, scale=None):
    return attention.attend(q, k, v, scale=1.0 if scale is None else scale)


def _mask_wrong_side(seq_len, kv_len):
    return ~attention.causal_mask(seq_len, kv_len)


def _mask_top_left(seq_len, kv_len):
    return np.tril(np.ones((seq_len, kv_len), dtype=bool))


def _self_attention_unmasked(q, k, v):
    probs = attention.softmax(q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1]))
    return probs @ v, probs


def _self_attention_top_left(q, k, v):
    scores = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    probs = attention.softmax(np.where(_mask_top_left(q.shape[-2], k.shape[-2]), scores, -np.inf))
    return probs @ v, probs


def _self_attention_unscaled(q, k, v):
    scores = q @ k.swapaxes(-1, -2)
    probs = attention.softmax(np.where(attention.causal_mask(q.shape[-2], k.shape[-2]), scores, -np.inf))
    return probs @ v, probs


MISTAKES = [
    ("softmax_is_stable", {"softmax": _softmax_no_max}, "Subtract each row's max"),
    ("softmax_matches_torch", {"softmax": _softmax_wrong_axis}, "over axis -2"),
    ("softmax_matches_torch", {"softmax": _uniform}, "differs from torch.softmax"),
    ("softmax_reproduces_seed", {"softmax": _uniform}, "should be [0.212, 0.212, 0.576]"),
    ("attend_scales_by_sqrt_head_dim", {"attend": _attend_unscaled}, "not scaled"),
    ("causal_mask_hides_future", {"causal_mask": _mask_wrong_side}, "wrong side"),
    ("causal_mask_aligns_bottom_right", {"causal_mask": _mask_top_left}, "aligned top-left"),
    ("causal_self_attention_matches_sdpa", {"causal_self_attention": _self_attention_unmasked}, "no mask"),
    ("causal_self_attention_matches_sdpa", {"causal_self_attention": _self_attention_unscaled}, "not scaled"),
    ("causal_self_attention_with_past_keys", {"causal_self_attention": _self_attention_top_left}, "aligned top-left"),
    ("causal_self_attention_equals_one_query_at_a_time", {"causal_self_attention": _self_attention_unmasked}, "row 0"),
]


@pytest.mark.parametrize(
    "name, fake, words", MISTAKES, ids=[f"{m[0]}-{next(iter(m[1].values())).__name__}" for m in MISTAKES]
)
def test_check_names_the_known_mistake(name, fake, words):
    """Check that a deliberately wrong implementation fails the check with a message naming the mistake."""
    module = types.SimpleNamespace(
        **{n: getattr(attention, n) for n in ("softmax", "attend", "causal_mask", "causal_self_attention")}
    )
    for key, fn in fake.items():
        setattr(module, key, fn)
    with np.errstate(all="ignore"), pytest.raises(AssertionError) as info:
        CHECKS[name].fn(module, np.random.default_rng(0))
    assert words in str(info.value)


def test_checks_reject_trivial_answers():
    """Check that echoing the input or returning zeros fails every check of 1.2 and 1.4."""
    echo = types.SimpleNamespace(
        attend=lambda q, k, v, scale=None: (v[0], np.zeros(len(k))),
        causal_self_attention=lambda q, k, v: (v[..., : q.shape[-2], :], np.zeros(q.shape[:-1] + k.shape[-2:])),
    )
    for c in checks_for(BY_ID["1.2"]) + checks_for(BY_ID["1.4"]):
        with pytest.raises(AssertionError):
            c.fn(echo, np.random.default_rng(0))


# ---------------------------------------------------------------------------------------------
# Bad input


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda: attention.softmax([1.0, 2.0]), "scores must be a numpy array, got list"),
        (lambda: attention.softmax(np.array(["a"])), "must hold real numbers"),
        (lambda: attention.attend(np.ones((2, 2)), SEED_K, SEED_V), "q must have 1 axes, got shape (2, 2)"),
        (
            lambda: attention.attend(np.ones(3), SEED_K, SEED_V),
            "k must be (kv_len, 3) to match q of shape (3,), got (3, 2)",
        ),
        (lambda: attention.attend(SEED_Q, SEED_K, SEED_V[:2]), "v must have one row per key (3), got shape (2, 2)"),
        (lambda: attention.causal_mask(4, 3), "seq_len (4) new queries cannot outnumber kv_len (3)"),
        (lambda: attention.causal_mask(0, 3), "seq_len must be a positive integer, got 0"),
        (
            lambda: attention.causal_self_attention(np.ones((3, 4)), np.ones((2, 4)), np.ones((2, 4))),
            "3 queries but only 2 keys",
        ),
        (
            lambda: attention.causal_self_attention(np.ones((3, 4)), np.ones((3, 5)), np.ones((3, 4))),
            "k must be (..., kv_len, 4)",
        ),
    ],
)
def test_bad_input_raises_value_error_naming_the_shape(call, words):
    """Check that bad input raises ValueError whose message names the expected and actual shape."""
    with pytest.raises(ValueError) as info:
        call()
    assert words in str(info.value)


def test_bad_input_is_checked_in_learner_mode_too(learner_mode):
    """Check that a shape error is reported before the learner's (unfinished) code runs."""
    with pytest.raises(ValueError, match="k must be"):
        attention.attend(np.ones(3), SEED_K, SEED_V)
