"""Checks for notebook 01 (kvlib/attention.py): exercises 1.1-1.5.

References are torch ops (torch.softmax, scaled_dot_product_attention) in float64 and notebook 01's
three-token example worked by hand; near-misses (wrong axis, no max subtraction or a shift by something
other than each row's max, no 1/sqrt(d), mask on the wrong side or aligned top-left, float32 turned into
float64) are recognised and named. Every expected value is computed before the learner's function runs,
from inputs it never sees (it gets its own copies), so a function that changes its arguments cannot
change what is expected of it. Exercise 1.5 is a design: any query within its length budget that meets the
target earns the points, judged by the reference's weights on the check's own float64 copy of the query.
The texts a message is built from (what a near-miss is called, what was handed in) go through tr(), so that the
catalogue (kvlib/course/i18n.py) translates them as it does the messages.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from kvlib.checks import check
from kvlib.course.i18n import tr

# The worked example of notebook 01: the query of "AI" against the keys and values of 我, 爱, AI.
SEED_Q = np.array([1.0, 1.0])
SEED_K = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
SEED_V = np.array([[1.0, 0.0], [0.0, 2.0], [3.0, 1.0]])
SEED_PROBS = np.exp([1.0, 1.0, 2.0]) / np.exp([1.0, 1.0, 2.0]).sum()  # 0.212, 0.212, 0.576
SEED_PROBS_SCALED = (
    np.exp(np.array([1.0, 1.0, 2.0]) / np.sqrt(2)) / np.exp(np.array([1.0, 1.0, 2.0]) / np.sqrt(2)).sum()
)


def _t(x):
    return torch.from_numpy(np.asarray(x, dtype=np.float64))


def _close(a, b, tol=1e-6) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and bool(np.allclose(a, b, rtol=tol, atol=tol))


def _array(name, x, shape):
    assert isinstance(x, np.ndarray), f"{name} should be a numpy array, got {type(x).__name__}"
    assert x.shape == tuple(shape), f"{name} should have shape {tuple(shape)}, got {x.shape}"
    return x


def _pair(result, what):
    assert isinstance(result, tuple) and len(result) == 2, (
        f"{what} should return a pair (out, probs), got {type(result).__name__}"
    )
    return result


def _copies(*arrays):
    """The learner's own copies of the inputs: what it does to them cannot reach the expected values."""
    return tuple(np.array(a, copy=True) for a in arrays)


def _attention(q, k, v, mask=None, scale=None):
    """Reference (out, probs) in float64 via torch; mask is boolean, True = may attend."""
    one_query = np.ndim(q) == 1
    q, k, v = _t(np.atleast_2d(q)), _t(k), _t(v)
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ k.transpose(-1, -2) * scale
    if mask is not None:
        scores = scores.masked_fill(~torch.as_tensor(mask), float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=None if mask is None else torch.as_tensor(mask), scale=scale
    )
    if one_query:
        return out[0].numpy(), probs[0].numpy()
    return out.numpy(), probs.numpy()


# ---------------------------------------------------------------------------------------------
# 1.1 softmax


def _name_the_normalisation(probs, scores) -> None:
    """Fail naming the cause, if softmax's answer is zeros, the scores echoed, or exponentials not divided by their
    own row's sum."""
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    for wrong, message in (
        (np.zeros_like(scores), tr("softmax returned zeros: weights are positive and each row sums to 1")),
        (scores, tr("softmax returned the scores unchanged: scores are not weights, and their rows do not sum to 1")),
        (e, tr("the exponentials came back as they are: their rows do not sum to 1")),
        (
            e / e.sum(),
            tr("the weights of the whole array sum to 1, not each row's: every row was divided by one shared sum"),
        ),
    ):
        if _close(probs, wrong) and not _close(wrong, torch.softmax(_t(scores), dim=-1).numpy()):
            raise AssertionError(message)


@check("1.1")
def softmax_reproduces_seed(kv, rng):
    """Check that softmax of the example's scores [1, 1, 2] is [0.212, 0.212, 0.576]."""
    probs = _array("softmax([1, 1, 2])", kv.softmax(np.array([1.0, 1.0, 2.0])), (3,))
    _name_the_normalisation(probs, np.array([1.0, 1.0, 2.0]))
    assert _close(probs, SEED_PROBS, 1e-4), (
        f"softmax([1, 1, 2]) should be [0.212, 0.212, 0.576], got {np.round(probs, 3)}"
    )


@check("1.1")
def softmax_matches_torch(kv, rng):
    """Check that softmax runs over the last axis of a (batch, n_heads, seq_len, kv_len) array."""
    scores = rng.normal(size=(2, 4, 3, 5)) * 3
    expected = torch.softmax(_t(scores), dim=-1).numpy()
    wrong_axis = torch.softmax(_t(scores), dim=-2).numpy()
    (given,) = _copies(scores)
    probs = _array(tr("softmax(scores) for scores of shape (2, 4, 3, 5)"), kv.softmax(given), scores.shape)
    assert np.array_equal(given, scores), "softmax changed its input in place: compute into a new array"
    if _close(probs, expected):
        return
    if _close(probs, wrong_axis):
        raise AssertionError(
            "softmax normalised over axis -2: its weights sum to 1 down each column (across queries), not along each "
            "row of keys (the last axis)"
        )
    _name_the_normalisation(probs, scores)
    if not _close(probs.sum(axis=-1), np.ones(scores.shape[:-1])):
        raise AssertionError(
            f"the rows of softmax (along axis=-1) should each sum to 1, got sums {np.round(probs.sum(axis=-1).ravel()[:4], 3)}..."
        )
    raise AssertionError(f"softmax differs from torch.softmax(x, dim=-1) by up to {np.abs(probs - expected).max():.2g}")


@check("1.1")
def softmax_is_stable(kv, rng):
    """Check that softmax survives large scores ([1000, 1000, 1001])."""
    scores = np.array([[1000.0, 1000.0, 1001.0], [-1000.0, -1000.0, -999.0]])
    with np.errstate(all="ignore"):
        probs = _array(tr("softmax of large scores"), kv.softmax(scores.copy()), (2, 3))
    _name_the_shift(probs, scores)
    assert np.all(np.isfinite(probs)), (
        "softmax of [1000, 1000, 1001] gave nan or inf: np.exp(1000) overflows float64 (its largest number is "
        "about 1.8e308), and inf / inf is nan, though the weights are those of [0, 0, 1]"
    )
    assert _close(probs, np.stack([SEED_PROBS, SEED_PROBS]), 1e-4), (
        f"softmax([1000, 1000, 1001]) should equal softmax([0, 0, 1]) = [0.212, 0.212, 0.576], got {np.round(probs, 3)}"
    )


# Rows that only a shift by each row's own maximum survives: a wide row (the mean or the minimum
# overflows), and rows far apart (the maximum of the whole array underflows the low row to 0 / 0).
_SHIFT_ROWS = np.array([[-1500.0, 0.0, 1500.0], [3000.0, 2999.0, 2998.0], [-3000.0, -3001.0, -3000.0]])


def _shifts() -> dict:
    """A learner's other shifts, by what the message calls each."""
    return {
        tr("the maximum of the whole array"): lambda x: x.max(),
        tr("the row's mean"): lambda x: x.mean(axis=-1, keepdims=True),
        tr("the row's minimum"): lambda x: x.min(axis=-1, keepdims=True),
        tr("the row's first score"): lambda x: x[..., :1],
    }


def _name_the_shift(probs, scores) -> None:
    """Fail naming the shift, if softmax's broken answer is what another shift than the row's max gives."""
    if np.all(np.isfinite(probs)) and _close(probs, torch.softmax(_t(scores), dim=-1).numpy()):
        return
    with np.errstate(all="ignore"):
        for name, shift in _shifts().items():
            e = np.exp(scores - shift(scores))
            if np.allclose(probs, e / e.sum(axis=-1, keepdims=True), equal_nan=True):
                raise AssertionError(
                    f"softmax shifted the scores by {name}: on rows like these, some exponent is still above "
                    "about 709 (e to it overflows float64 to inf), or every exponent of a row is below about -745 "
                    "(each e to it is 0, and 0 / 0 is nan)"
                )


@check("1.1")
def softmax_holds_on_rows_far_apart(kv, rng):
    """Check softmax on rows 3,000 apart and on a row 3,000 wide: finite, and equal to torch.softmax."""
    scores = _SHIFT_ROWS
    expected = torch.softmax(_t(scores), dim=-1).numpy()
    with np.errstate(all="ignore"):
        probs = _array(tr("softmax of rows far apart"), kv.softmax(scores.copy()), scores.shape)
    if np.all(np.isfinite(probs)) and _close(probs, expected):
        return
    _name_the_shift(probs, scores)
    raise AssertionError(
        f"softmax of {scores.tolist()} should be {np.round(expected, 3).tolist()}, got {np.round(probs, 3).tolist()}: "
        "these rows lie 3,000 apart, and one 3,000 wide: an exponent above about 709 overflows float64, and a row "
        "whose every exponent is below about -745 vanishes to 0 / 0"
    )


@check("1.1")
def softmax_keeps_float32(kv, rng):
    """Check that float32 scores give float32 weights, as accurate as float32 allows."""
    scores = (rng.normal(size=(3, 6)) * 4).astype(np.float32)
    expected = torch.softmax(torch.from_numpy(scores.astype(np.float64)), dim=-1).numpy()
    probs = _array(tr("softmax of float32 scores"), kv.softmax(scores.copy()), scores.shape)
    assert probs.dtype == np.float32, (
        f"float32 scores should give float32 weights, got {probs.dtype}: a float64 number or array in the "
        "computation promoted the result"
    )
    assert _close(probs, expected, 1e-5), (
        f"float32 softmax differs from the exact one by {np.abs(probs - expected).max():.2g}"
    )


# ---------------------------------------------------------------------------------------------
# 1.2 attend


@check("1.2")
def attend_reproduces_seed(kv, rng):
    """Check that the worked example (我, 爱, AI) gives weights [0.212, 0.212, 0.576] and output [1.940, 1.000]."""
    out, probs = _pair(kv.attend(*_copies(SEED_Q, SEED_K, SEED_V), scale=1.0), "attend")
    _array("probs", probs, (3,))
    _array("out", out, (2,))
    if _close(probs, SEED_PROBS_SCALED, 1e-4):
        raise AssertionError(
            "the scale you are given is ignored: with scale=1.0 the scores stay 1, 1, 2 (1/sqrt(head_dim) only when scale is None)"
        )
    assert _close(probs, SEED_PROBS, 1e-4), (
        f"with scale=1.0 the weights should be [0.212, 0.212, 0.576], got {np.round(probs, 3)}"
    )
    assert _close(out, SEED_PROBS @ SEED_V, 1e-4), (
        f"with those weights the output should be [1.940, 1.000], got {np.round(out, 3)}"
    )


@check("1.2")
def attend_scales_by_sqrt_head_dim(kv, rng):
    """Check that scale=None divides the scores by sqrt(head_dim)."""
    q, k, v = rng.normal(size=8), rng.normal(size=(5, 8)), rng.normal(size=(5, 6))
    ref_out, ref_probs = _attention(q, k, v)
    unscaled, by_d = _attention(q, k, v, scale=1.0)[1], _attention(q, k, v, scale=1 / 8)[1]
    swapped = _attention(q, k, v, scale=np.sqrt(8))[1]
    out, probs = _pair(kv.attend(*_copies(q, k, v)), "attend")
    _array("probs", probs, (5,))
    _array("out", out, (6,))
    if _close(probs, ref_probs) and _close(out, ref_out):
        return
    if _close(probs, unscaled):
        raise AssertionError("the scores are not scaled: scale=None means 1 / sqrt(head_dim)")
    if _close(probs, by_d):
        raise AssertionError("the scores are divided by head_dim, not by its square root")
    if _close(probs, swapped):
        raise AssertionError("the scores are multiplied by sqrt(head_dim), not divided by it")
    if _close(probs, ref_probs):
        raise AssertionError("the weights are right but the output is not the values blended by them")
    raise AssertionError(
        f"attend differs from scaled dot-product attention: weights off by up to {np.abs(probs - ref_probs).max():.2g}"
    )


@check("1.2")
def attend_matches_sdpa(kv, rng):
    """Check that attend equals torch's scaled_dot_product_attention for a given scale."""
    q, k, v = rng.normal(size=4), rng.normal(size=(7, 4)), rng.normal(size=(7, 3))
    ref_out, ref_probs = _attention(q, k, v, scale=0.3)
    default = _attention(q, k, v)[1]
    out, probs = _pair(kv.attend(*_copies(q, k, v), scale=0.3), "attend")
    _array("probs", probs, (7,))
    _array("out", out, (3,))
    if _close(probs, default) and not _close(probs, ref_probs):
        raise AssertionError(
            "the scale you are given is ignored: use scale when it is not None (here 0.3), 1/sqrt(head_dim) only when it is"
        )
    assert _close(probs, ref_probs), "with scale=0.3 the weights differ from those of the scores times 0.3"
    assert _close(out, ref_out), "the output differs from the values blended by the weights"


@check("1.2")
def attend_keeps_float32(kv, rng):
    """Check that float32 inputs give a float32 output and float32 weights (scale=None)."""
    q, k, v = (rng.normal(size=s).astype(np.float32) for s in ((16,), (6, 16), (6, 4)))
    ref_out, ref_probs = _attention(q, k, v)
    out, probs = _pair(kv.attend(*_copies(q, k, v)), "attend")
    _array("probs", probs, (6,))
    _array("out", out, (4,))
    assert out.dtype == np.float32 and probs.dtype == np.float32, (
        f"float32 inputs should give float32 results, got out {out.dtype} and probs {probs.dtype}: under NumPy 2 "
        "a float64 scalar such as np.sqrt(head_dim) promotes float32 arrays"
    )
    assert _close(probs, ref_probs, 1e-5) and _close(out, ref_out, 1e-5), "float32 attention differs from the exact one"


# ---------------------------------------------------------------------------------------------
# 1.3 causal_mask


@check("1.3")
def causal_mask_hides_future(kv, rng):
    """Check that in a square mask, token i sees itself and the tokens before it, never after."""
    mask = _array("causal_mask(4, 4)", kv.causal_mask(4, 4), (4, 4))
    assert mask.dtype == bool, f"the mask should be boolean (True = may attend), got dtype {mask.dtype}"
    expected = np.tril(np.ones((4, 4), dtype=bool))
    if np.array_equal(mask, expected):
        return
    if np.array_equal(mask, ~expected) or np.array_equal(mask, expected.T):
        raise AssertionError("the mask hides the wrong side: True means 'may attend', and query i may see keys j <= i")
    if np.array_equal(mask, np.tril(expected, -1)):
        raise AssertionError("each token must be allowed to attend to itself (the diagonal is True)")
    raise AssertionError(
        f"causal_mask(4, 4) should be lower-triangular including the diagonal, got\n{mask.astype(int)}"
    )


@check("1.3")
def causal_mask_aligns_bottom_right(kv, rng):
    """Check that seq_len new queries are the last of kv_len positions (causal_mask(3, 5))."""
    mask = _array("causal_mask(3, 5)", kv.causal_mask(3, 5), (3, 5))
    expected = np.tril(np.ones((3, 5), dtype=bool), k=2)
    if np.array_equal(mask, np.tril(np.ones((3, 5), dtype=bool))):
        raise AssertionError(
            "the mask is aligned top-left: with 3 new queries and 5 keys, the queries are positions 2, 3, 4, "
            "so query 0 sees keys 0..2 (this is what is_causal=True gets wrong when seq_len != kv_len)"
        )
    assert np.array_equal(mask, expected), (
        f"causal_mask(3, 5) should be\n{expected.astype(int)}\ngot\n{mask.astype(int)}"
    )
    one = _array("causal_mask(1, 5)", kv.causal_mask(1, 5), (1, 5))
    assert one.all(), "one new query (a decode step) must see every key: causal_mask(1, 5) is all True"


# ---------------------------------------------------------------------------------------------
# 1.4 causal_self_attention


def _masked_weight_is_exactly_zero(kv):
    """Scores far below any finite fill (about -2.8e12): a mask filled with -1e9 instead of -inf leaks there.

    The allowed keys' weights are judged to 1e-3: a softmax by log-sum-exp, exp(s - logsumexp(s)), is right, and at
    scores this large float64 keeps its exponent only to about 5e-4 (one unit in the last place of 2.8e12)."""
    q, k, v = np.full((3, 8), 1e6), np.full((3, 8), -1e6), np.arange(6.0).reshape(3, 2)
    _, probs = _pair(kv.causal_self_attention(*_copies(q, k, v)), "causal_self_attention")
    _array("probs", probs, (3, 3))
    allowed = np.tril(np.ones((3, 3), dtype=bool))
    if np.any(probs[~allowed] != 0):
        raise AssertionError(
            "with every score about -2.8e12, the masked keys got weight: the mask was filled with a finite number, "
            f"which is larger than such scores (weights of query 0: {np.round(probs[0], 3)})"
        )
    expected = allowed / np.arange(1, 4)[:, None]  # equal scores: uniform over the allowed keys
    assert _close(probs, expected, 1e-3), (
        "with every score about -2.8e12 (all equal), the allowed keys should share the weight equally, got "
        f"{np.round(probs, 3).tolist()}: e to a score this low is 0 in float64, so such a row is 0 / 0"
    )


@check("1.4")
def causal_self_attention_matches_sdpa(kv, rng):
    """Check that causal self-attention equals torch SDPA on (batch, n_heads, seq_len, head_dim) inputs.

    Also: the masked keys get weight exactly 0 even where every score is far below any finite fill.
    """
    q, k, v = rng.normal(size=(2, 4, 5, 8)), rng.normal(size=(2, 4, 5, 8)), rng.normal(size=(2, 4, 5, 6))
    mask = np.tril(np.ones((5, 5), dtype=bool))
    ref_out, ref_probs = _attention(q, k, v, mask)
    near_misses = {  # what a slip gives, computed before the learner's code runs
        tr("no mask: every query sees the future (later keys got weight)"): _attention(q, k, v)[1],
        tr("the mask hides the wrong side: the queries see later keys and not earlier ones"): _attention(
            q, k, v, ~mask | np.eye(5, dtype=bool)
        )[1],
        tr("the scores are not scaled: the weights are those of scale 1, not of 1/sqrt(head_dim)"): _attention(
            q, k, v, mask, scale=1.0
        )[1],
        tr("the mask is applied after the softmax: zeroing the weights leaves rows that no longer sum to 1"): np.where(
            mask, _attention(q, k, v)[1], 0.0
        ),
    }
    out, probs = _pair(kv.causal_self_attention(*_copies(q, k, v)), "causal_self_attention")
    _array("out", out, (2, 4, 5, 6))
    _array("probs", probs, (2, 4, 5, 5))
    if _close(out, ref_out) and _close(probs, ref_probs):
        _masked_weight_is_exactly_zero(kv)
        return
    for message, wrong in near_misses.items():
        if _close(probs, wrong):
            raise AssertionError(message)
    raise AssertionError(
        f"causal_self_attention differs from torch SDPA with a causal mask by up to {np.abs(out - ref_out).max():.2g}"
    )


@check("1.4")
def causal_self_attention_with_past_keys(kv, rng):
    """Check that 3 new queries against 5 keys sit at positions 2, 3, 4 (float32 in, float32 out)."""
    q, k, v = (rng.normal(size=s).astype(np.float32) for s in ((3, 8), (5, 8), (5, 6)))
    ref_out, ref_probs = _attention(q, k, v, np.tril(np.ones((3, 5), dtype=bool), k=2))
    top_left = _attention(q, k, v, np.tril(np.ones((3, 5), dtype=bool)))[1]
    out, probs = _pair(kv.causal_self_attention(*_copies(q, k, v)), "causal_self_attention")
    _array("out", out, (3, 6))
    _array("probs", probs, (3, 5))
    if _close(probs, top_left, 1e-5):
        raise AssertionError(
            "the mask is aligned top-left: the 3 queries are the last 3 of 5 positions, so query 0 sees keys 0..2"
        )
    assert _close(probs, ref_probs, 1e-5), (
        "with 3 queries and 5 keys, query i may attend to keys 0..2+i, with softmax weights"
    )
    assert _close(out, ref_out, 1e-5), "the output should be probs @ v"
    assert out.dtype == np.float32 and probs.dtype == np.float32, (
        f"float32 inputs should give float32 results, got out {out.dtype} and probs {probs.dtype}: under NumPy 2 "
        "np.sqrt(head_dim) is a float64 scalar that promotes float32 arrays"
    )


@check("1.4")
def causal_self_attention_equals_one_query_at_a_time(kv, rng):
    """Check that row i of the matrix form equals attention of query i over keys 0..i alone."""
    q, k, v = rng.normal(size=(4, 8)), rng.normal(size=(4, 8)), rng.normal(size=(4, 3))
    rows = [_attention(q[i], k[: i + 1], v[: i + 1])[0] for i in range(4)]
    out, probs = _pair(kv.causal_self_attention(*_copies(q, k, v)), "causal_self_attention")
    _array("out", out, (4, 3))
    _array("probs", probs, (4, 4))
    for i in range(4):
        assert _close(out[i], rows[i]), f"row {i} should equal attention of query {i} over keys 0..{i} alone"
    assert np.all(probs[np.triu_indices(4, 1)] == 0), "weights above the diagonal (the future) must be exactly 0"


# ---------------------------------------------------------------------------------------------
# 1.5 aimed_query: a design under a budget; any query that meets both limits earns the points

AIM_BUDGET = 3.0  # the query's length, at most
AIM_TARGET = 0.9  # 爱's weight among the three keys, at least (the best a query of length 3 can give it is 0.926)


@check("1.5")
def aimed_query_meets_the_target_within_the_budget(kv, rng):
    """Check that the query is a (2,) array of length at most 3 under which 爱 takes at least 0.9 of AI's attention."""
    query = kv.aimed_query()
    assert isinstance(query, np.ndarray), f"aimed_query should return a numpy array (2,), got {type(query).__name__}"
    q = np.array(query, dtype=np.float64, copy=True, subok=False)  # the check's own copy, a plain float64 array
    assert q.shape == (2,), f"aimed_query should return one query of shape (2,), got shape {q.shape}"
    assert np.all(np.isfinite(q)), f"the query holds nan or inf: {q}"
    length = float(np.sqrt(q @ q))
    assert length <= AIM_BUDGET + 1e-9, (
        f"the query {np.round(q, 3)} is {length:.2f} long, more than {AIM_BUDGET:g}: a longer query sharpens any "
        "weights (drag the sliders out), so the budget is what makes this a design"
    )
    _, probs = _attention(q, SEED_K, SEED_V, scale=1.0)
    if probs[1] >= AIM_TARGET:
        return
    if abs(probs[1] - probs[2]) < 1e-3:
        raise AssertionError(
            f"爱 and AI take {probs[1]:.3f} each: a query that raises 爱's score raises AI's as much, since AI's key "
            "[1, 1] holds 爱's [0, 1]. What is in AI's key that is not in 爱's?"
        )
    raise AssertionError(
        f"爱 takes {probs[1]:.3f} of AI's attention with the query {np.round(q, 3)} (我 {probs[0]:.3f}, AI "
        f"{probs[2]:.3f}), short of {AIM_TARGET:g}: which key takes the weight 爱 lacks, and which direction lowers "
        "its score alone?"
    )
