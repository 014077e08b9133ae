"""kvlib/attention.py (notebook 01): the reference passes every check, the seed article's numbers, and bad
input gets a ValueError that names the shape.

Each exercise's check tests live here under three names, built with conftest.handed_in: ALTERNATIVES
(correct implementations in another shape, which pass every check of their exercise), SLIPS (likely
wrong ones, which fail the check or exercise named, with a message naming the slip), and a
function that changes its arguments (conftest.vandal) scores 0."""

import math
import types

import numpy as np
import pytest
import torch
from conftest import assert_slip_named, case_ids, check_failures, handed_in, spoil_everything, vandal

from kvlib import attention
from kvlib.checks import checks_for
from kvlib.checks.attention import SEED_K, SEED_Q, SEED_V
from kvlib.course.exercises import BY_ID, reference

IDS = ["1.1", "1.2", "1.3", "1.4", "1.5"]
ATTENTION_CHECKS = [c for ex in IDS for c in checks_for(BY_ID[ex])]


@pytest.mark.parametrize("check", ATTENTION_CHECKS, ids=lambda c: c.name)
def test_reference_passes_check(check):
    """Check that the reference solution passes every check of notebook 01."""
    check.fn(attention, np.random.default_rng(0))


def test_attend_reproduces_the_seed_numbers():
    """Check that attend reproduces the seed article's numbers: 21%, 21%, 58% and [1.940, 1.000]; scaled
    0.248, 0.248, 0.503 and [1.759, 1.000]."""
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


NAMES = ("softmax", "attend", "causal_mask", "causal_self_attention", "aimed_query")


def _module(**replaced):
    """What a learner hands in: kvlib.attention (the reference, in reference mode) with some functions replaced."""
    return handed_in(attention, NAMES, **replaced)


# ---------------------------------------------------------------------------------------------
# Other correct implementations (ALTERNATIVES) pass every check of their exercise


# 1.1 softmax ---------------------------------------------------------------------------------
def softmax_loop(scores):
    out = np.empty_like(scores)
    for idx in np.ndindex(scores.shape[:-1]):
        row = scores[idx]
        m = max(row)
        e = [math.exp(x - m) for x in row]
        out[idx] = [x / sum(e) for x in e]
    return out


def softmax_float64_inside(scores):
    x = scores.astype(np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(scores.dtype)


def softmax_logsumexp(scores):
    m = scores.max(axis=-1, keepdims=True)
    return np.exp(scores - m - np.log(np.exp(scores - m).sum(axis=-1, keepdims=True)))


def softmax_torch(scores):
    return torch.softmax(torch.from_numpy(scores), dim=-1).numpy()


# 1.2 attend ----------------------------------------------------------------------------------
def attend_einsum(q, k, v, scale=None):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    probs = softmax_logsumexp(np.einsum("sd,d->s", k, q) * scale)
    return np.einsum("s,sd->d", probs, v), probs


def attend_loop(q, k, v, scale=None):
    scale = 1 / math.sqrt(len(q)) if scale is None else scale
    scores = np.array([sum(qi * ki for qi, ki in zip(q, key)) * scale for key in k], dtype=q.dtype)
    probs = softmax_loop(scores)
    out = np.zeros(v.shape[1], dtype=v.dtype)
    for p, value in zip(probs, v):
        out += p * value
    return out, probs


def attend_float64_inside(q, k, v, scale=None):
    dtype = np.result_type(q, k, v)
    q64, k64, v64 = (x.astype(np.float64) for x in (q, k, v))
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    probs = softmax_float64_inside((q64[None] @ k64.T)[0] * scale)
    return (probs @ v64).astype(dtype), probs.astype(dtype)


# 1.3 causal_mask -----------------------------------------------------------------------------
def mask_loop(seq_len, kv_len):
    mask = np.zeros((seq_len, kv_len), dtype=bool)
    for i in range(seq_len):
        for j in range(kv_len):
            mask[i, j] = j <= kv_len - seq_len + i
    return mask


def mask_aranges(seq_len, kv_len):
    return np.arange(kv_len)[None, :] <= np.arange(seq_len)[:, None] + (kv_len - seq_len)


def mask_not_triu(seq_len, kv_len):
    return ~np.triu(np.ones((seq_len, kv_len), dtype=bool), k=kv_len - seq_len + 1)


# 1.4 causal_self_attention -------------------------------------------------------------------
def self_attention_per_query(q, k, v):
    T, S = q.shape[-2], k.shape[-2]
    out = np.zeros(q.shape[:-2] + (T, v.shape[-1]), dtype=np.result_type(q, k, v))
    probs = np.zeros(q.shape[:-2] + (T, S), dtype=out.dtype)
    for idx in np.ndindex(q.shape[:-2]):
        for i in range(T):
            n = S - T + i + 1
            o, p = attend_einsum(q[idx][i], k[idx][:n], v[idx][:n])
            out[idx][i], probs[idx][i, :n] = o, p
    return out, probs


def self_attention_bias(q, k, v):
    T, S = q.shape[-2], k.shape[-2]
    bias = np.where(mask_aranges(T, S), 0.0, -1e9).astype(q.dtype)  # an additive mask, as many libraries build it
    scores = np.einsum("...td,...sd->...ts", q, k) / math.sqrt(q.shape[-1]) + bias
    probs = softmax_logsumexp(scores)
    return np.einsum("...ts,...sd->...td", probs, v), probs


def self_attention_float64_torch(q, k, v):
    dtype = np.result_type(q, k, v)
    t = [torch.from_numpy(x.astype(np.float64)) for x in (q, k, v)]
    scores = t[0] @ t[1].transpose(-1, -2) * t[0].shape[-1] ** -0.5
    scores = scores.masked_fill(~torch.from_numpy(mask_aranges(q.shape[-2], k.shape[-2])), float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return (probs @ t[2]).numpy().astype(dtype), probs.numpy().astype(dtype)


def self_attention_logsumexp(q, k, v):  # probs = exp(scores - logsumexp(scores)), the log-sum-exp kept whole
    T, S = q.shape[-2], k.shape[-2]
    scores = np.where(mask_aranges(T, S), q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1]), -np.inf)
    m = scores.max(axis=-1, keepdims=True)
    lse = m + np.log(np.exp(scores - m).sum(axis=-1, keepdims=True))  # at scores of -2.8e12, right to ~5e-4
    probs = np.exp(scores - lse)
    return probs @ v, probs


# 1.5 aimed_query: a design, so any query within the budget that meets the target earns the points ------
def query_away_from_wo():
    return np.array([-3.0, 0.0])  # away from 我 alone: 爱 and AI 0.909 and 0.045


def query_float32():
    return np.array([-2.5, 1.5], dtype=np.float32)  # 0.909


def query_at_the_edge():
    return 3 * np.array([-0.958, 0.2857]) / np.hypot(-0.958, 0.2857)  # length 3 to rounding, near the best (0.926)


ALTERNATIVES = [
    ("1.1", {"softmax": softmax_loop}),
    ("1.1", {"softmax": softmax_float64_inside}),
    ("1.1", {"softmax": softmax_logsumexp}),
    ("1.1", {"softmax": softmax_torch}),
    ("1.2", {"attend": attend_einsum}),
    ("1.2", {"attend": attend_loop}),
    ("1.2", {"attend": attend_float64_inside}),
    ("1.3", {"causal_mask": mask_loop}),
    ("1.3", {"causal_mask": mask_aranges}),
    ("1.3", {"causal_mask": mask_not_triu}),
    ("1.4", {"causal_self_attention": self_attention_per_query}),
    ("1.4", {"causal_self_attention": self_attention_bias}),
    ("1.4", {"causal_self_attention": self_attention_float64_torch}),
    ("1.4", {"causal_self_attention": self_attention_logsumexp}),
    ("1.5", {"aimed_query": query_away_from_wo}),
    ("1.5", {"aimed_query": query_float32}),
    ("1.5", {"aimed_query": query_at_the_edge}),
]


@pytest.mark.parametrize("ex_id, replaced", ALTERNATIVES, ids=case_ids(ALTERNATIVES))
def test_alternative_passes_every_check(ex_id, replaced):
    """Check that another correct way of writing the exercise passes every one of its checks."""
    with np.errstate(all="ignore"):
        assert not check_failures(ex_id, _module(**replaced))


def test_every_exercise_has_three_alternatives():
    """Check that ALTERNATIVES covers each exercise of notebook 01 three times or more."""
    counts = {ex_id: sum(c[0] == ex_id for c in ALTERNATIVES) for ex_id in IDS}
    assert all(n >= 3 for n in counts.values()), counts


# ---------------------------------------------------------------------------------------------
# Likely slips (SLIPS) fail their check, or their exercise's checks, with a message naming them


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


# 1.1
def softmax_no_shift(scores):
    e = np.exp(scores)
    return e / e.sum(axis=-1, keepdims=True)


def softmax_global_max(scores):
    e = np.exp(scores - scores.max())
    return e / e.sum(axis=-1, keepdims=True)


def softmax_row_mean(scores):
    e = np.exp(scores - scores.mean(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def softmax_float64_out(scores):
    x = np.asarray(scores, dtype=float)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def softmax_no_keepdims(scores):
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return e / e.sum()


# 1.2
def attend_unscaled(q, k, v, scale=None):
    probs = softmax_logsumexp(k @ q)
    return probs @ v, probs


def attend_by_d(q, k, v, scale=None):
    scale = 1 / q.shape[-1] if scale is None else scale
    probs = softmax_logsumexp((k @ q) * scale)
    return probs @ v, probs


def attend_np_sqrt(q, k, v, scale=None):
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    probs = softmax_logsumexp((k @ q) * scale)
    return probs @ v, probs


def attend_scale_ignored(q, k, v, scale=None):
    probs = softmax_logsumexp((k @ q) / math.sqrt(q.shape[-1]))
    return probs @ v, probs


# 1.3
def mask_top_left(seq_len, kv_len):
    return np.tril(np.ones((seq_len, kv_len), dtype=bool))


def mask_strict(seq_len, kv_len):
    return np.tril(np.ones((seq_len, kv_len), dtype=bool), k=kv_len - seq_len - 1)


def mask_upper(seq_len, kv_len):
    return np.triu(np.ones((seq_len, kv_len), dtype=bool), k=kv_len - seq_len)


def mask_ints(seq_len, kv_len):
    return np.tril(np.ones((seq_len, kv_len), dtype=int), k=kv_len - seq_len)


# 1.4
def _sa(q, k, v, *, mask="bottom", scale=True, after=False, sqrt=math.sqrt):
    T, S = q.shape[-2], k.shape[-2]
    scores = q @ k.swapaxes(-1, -2) / (sqrt(q.shape[-1]) if scale else 1)
    allowed = {"bottom": mask_aranges(T, S), "top": mask_top_left(T, S), "none": np.ones((T, S), dtype=bool)}[mask]
    if after:
        probs = np.where(allowed, softmax_logsumexp(scores), 0.0)
    else:
        probs = softmax_logsumexp(np.where(allowed, scores, -np.inf))
    return probs @ v, probs


# (check or exercise, replaced functions, words the failure must contain)
def _self_attention_finite_fill(q, k, v):
    scores = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    probs = attention.softmax(np.where(attention.causal_mask(q.shape[-2], k.shape[-2]), scores, -1e9))  # not -inf
    return probs @ v, probs


def query_at_ai_too():
    return np.array([0.0, 3.0])  # straight at 爱's key: AI's [1, 1] gets the same score


def query_too_long():
    return np.array([-4.0, 1.0])  # 爱 0.95, but 4.12 long


def query_diagonal():
    return np.array([-2.0, 2.0])  # away from 我, towards 爱: 0.867


def query_as_list():
    return [-2.8, 1.0]


def query_as_row():
    return np.array([[-2.8, 1.0]])


SLIPS = [
    ("softmax_is_stable", {"softmax": _softmax_no_max}, "np.exp(1000) overflows"),
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
    ("1.1", {"softmax": softmax_no_shift}, "np.exp(1000) overflows"),
    ("1.1", {"softmax": softmax_global_max}, "the maximum of the whole array"),
    ("1.1", {"softmax": softmax_row_mean}, "the row's mean"),
    ("1.1", {"softmax": softmax_float64_out}, "float32 scores should give float32 weights"),
    ("1.1", {"softmax": softmax_no_keepdims}, "the weights of the whole array sum to 1"),
    ("1.1", {"softmax": lambda scores: np.zeros_like(scores)}, "softmax returned zeros"),
    ("1.1", {"softmax": lambda scores: scores.copy()}, "returned the scores unchanged"),
    (
        "1.1",
        {"softmax": lambda scores: np.exp(scores - scores.max(axis=-1, keepdims=True))},
        "exponentials came back as they are",
    ),
    ("1.2", {"attend": attend_unscaled}, "not scaled"),
    ("1.2", {"attend": attend_by_d}, "divided by head_dim"),
    ("1.2", {"attend": attend_np_sqrt}, "float32 inputs should give float32"),
    ("1.2", {"attend": attend_scale_ignored}, "scale you are given is ignored"),
    ("1.3", {"causal_mask": mask_top_left}, "aligned top-left"),
    ("1.3", {"causal_mask": mask_strict}, "attend to itself"),
    ("1.3", {"causal_mask": mask_upper}, "wrong side"),
    ("1.3", {"causal_mask": mask_ints}, "should be boolean"),
    ("1.4", {"causal_self_attention": lambda q, k, v: _sa(q, k, v, mask="none")}, "no mask"),
    ("1.4", {"causal_self_attention": lambda q, k, v: _sa(q, k, v, mask="top")}, "aligned top-left"),
    ("1.4", {"causal_self_attention": lambda q, k, v: _sa(q, k, v, scale=False)}, "not scaled"),
    ("1.4", {"causal_self_attention": lambda q, k, v: _sa(q, k, v, after=True)}, "after the softmax"),
    (
        "1.4",
        {"causal_self_attention": lambda q, k, v: _sa(q, k, v, sqrt=np.sqrt)},
        "float32 inputs should give float32",
    ),
    ("causal_self_attention_matches_sdpa", {"causal_self_attention": _self_attention_finite_fill}, "a finite number"),
    ("1.5", {"aimed_query": query_at_ai_too}, "爱 and AI take 0.488 each"),
    ("1.5", {"aimed_query": query_too_long}, "4.12 long, more than 3"),
    ("1.5", {"aimed_query": query_diagonal}, "爱 takes 0.867 of AI's attention"),
    ("1.5", {"aimed_query": query_as_list}, "should return a numpy array"),
    ("1.5", {"aimed_query": query_as_row}, "got shape (1, 2)"),
]


@pytest.mark.parametrize("where, replaced, words", SLIPS, ids=case_ids(SLIPS))
def test_slip_is_rejected_naming_it(where, replaced, words):
    """Check that a likely wrong implementation fails the check named (with an AssertionError), or the exercise
    named (its first failing check, as `kvlib check` reports it), with a message that names the slip."""
    assert_slip_named(where, _module(**replaced), words)


_FIXES = (
    "keepdims",
    "axis=-1)",
    "divide each row",
    "exponentiate them",
    "cast back",
    ".astype(",
    "probs @ v",
    "math.sqrt",
    "(k @ q)",
    "instead",
    "-inf",
    "Fill with",
    "Set the",
    "subtracted before",
)


CAUSE_SLIPS = [
    s for s in SLIPS if s[0] in ("1.1", "1.2", "1.4", "causal_self_attention_matches_sdpa")
]  # the slips whose messages once gave the fix


@pytest.mark.parametrize("where, replaced, words", CAUSE_SLIPS, ids=case_ids(CAUSE_SLIPS))
def test_softmax_slip_message_names_the_cause_not_the_fix(where, replaced, words):
    """Check that 1.1's, 1.2's and 1.4's slips fail with a message that names what went wrong, never the line to type
    instead (the row's max to shift by, the axis to divide along, the product that blends the values, the -inf to fill
    the mask with, math.sqrt: issue 46 keeps those in the hints)."""
    with np.errstate(all="ignore"):
        (name, err), *_ = check_failures(where, _module(**replaced))
    assert not [fix for fix in _FIXES if fix in str(err)], f"{name}: {err}"


def test_every_exercise_has_three_slips():
    """Check that SLIPS holds three or more likely slips for each exercise of notebook 01."""
    counts = {ex_id: sum(c[0] == ex_id for c in SLIPS) for ex_id in IDS}
    assert all(n >= 3 for n in counts.values()), counts


def test_checks_reject_trivial_answers():
    """Check that echoing the input or returning zeros fails every check of 1.2, 1.4 and 1.5."""
    echo = types.SimpleNamespace(
        attend=lambda q, k, v, scale=None: (v[0], np.zeros(len(k))),
        causal_self_attention=lambda q, k, v: (v[..., : q.shape[-2], :], np.zeros(q.shape[:-1] + k.shape[-2:])),
        aimed_query=lambda: np.zeros(2),  # every weight 1/3
    )
    for c in checks_for(BY_ID["1.2"]) + checks_for(BY_ID["1.4"]) + checks_for(BY_ID["1.5"]):
        with pytest.raises(AssertionError):
            c.fn(echo, np.random.default_rng(0))


# ---------------------------------------------------------------------------------------------
# A function that vandalises its arguments scores 0 on every check


# 1.3's arguments are two ints and 1.5 takes none: nothing to change in place
VANDAL_CHECKS = [c for ex_id in ("1.1", "1.2", "1.4") for c in checks_for(BY_ID[ex_id])]


@pytest.mark.parametrize("check", VANDAL_CHECKS, ids=lambda c: c.name)
def test_a_function_that_changes_its_arguments_scores_zero(check):
    """Check that zeroing the arrays, tensors, weights or config a check passes cannot make it expect the wrong answer."""
    ex = check.exercise
    module = _module(**{ex.name: vandal(reference(ex), spoil_everything)})
    with np.errstate(all="ignore"), pytest.raises(Exception):  # noqa: B017 - any failure is a score of 0
        check.fn(module, np.random.default_rng(0))


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
