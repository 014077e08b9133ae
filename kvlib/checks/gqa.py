"""Checks for notebook 06 (kvlib/gqa.py): exercises 6.1-6.5.

Sizes all differ (batch 2, 6 query heads, 2 key/value heads, so groups of 3; 2 or 4 queries against 5 or 9 keys;
head_dim 8), so a swapped axis, a group size taken for the query count or a mask offset that only fits one shape
fails. Exercise 6.1 ships a bug (find and fix): its check shows the symptom, which query heads get other outputs
than a GQA layer's own attention. The known slips are named: attention that copies the shared heads out to every
query head (caught by the memory a long decode step holds, measured by the grading process in the isolated grader;
by watching every tensor torch allocates in a local run), a mask aligned top-left or tiled in the wrong order,
pooling strided heads or the wrong axis, keeping one head, converting a model that is already GQA as if it were
MHA, losing the source model's dtype or train/eval mode; in 6.5's prediction, the cache's ratio for the step's (the
weights read every step), k_proj and v_proj left at MHA's size, the weights read once per sequence, the embedding
table read whole, the config's own n_kv_heads taken for MHA's. Every expected value is computed before learner code
runs, from tensors and models the learner's code never receives (it gets clones), so a function that changes its
arguments cannot move them.
The texts a message is built from (which case, what a slip is called) go through tr(), so that the catalogue
(kvlib/course/i18n.py) translates them as it does the messages.
"""

from __future__ import annotations

import math

import torch

from kvlib.checks import MB, check, held_nothing_before, memory_of
from kvlib.core.configs import REAL_MODELS
from kvlib.core.model import Decoder, ModelConfig, matrix_params
from kvlib.course.exercises import ExerciseNotDone
from kvlib.course.i18n import tr
from kvlib.measure.timing import new_tensors

B, H, H_KV, T, S, D = 2, 6, 2, 2, 5, 8  # T = 2 queries: neither 1 nor the group size 3
G = H // H_KV
CONFIG = ModelConfig(vocab_size=23, d_model=48, n_layers=2, n_heads=6, n_kv_heads=6, hidden_dim=40, max_seq_len=32)


def _randn(rng, *shape) -> torch.Tensor:
    return torch.from_numpy(rng.normal(size=shape)).float()


def _close(a, b) -> bool:
    return isinstance(a, torch.Tensor) and a.shape == b.shape and torch.allclose(a, b, rtol=1e-4, atol=1e-5)


def _attention(q, k, v, *, scale=True, top_left=False, offset=None):
    """The reference: softmax(q k^T / sqrt(D)) v per head, k and v already n_heads; bottom-right mask."""
    Tq, Sk = q.shape[-2], k.shape[-2]
    scores = q @ k.transpose(-2, -1) / (math.sqrt(q.shape[-1]) if scale else 1.0)
    diagonal = 0 if top_left else Sk - Tq if offset is None else offset
    allowed = torch.ones(Tq, Sk, dtype=torch.bool).tril(diagonal)  # True = may attend
    return scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ v


def _grouped_masked(q, k, v, mask):
    """Grouped attention with a given (G*T, S) mask: `mask(T, S, G)`, the way a learner might build it wrongly."""
    (B_, H_, T_, D_), (H_kv, S_) = q.shape, k.shape[1:3]
    G_ = H_ // H_kv
    scores = q.reshape(B_, H_kv, G_ * T_, D_) @ k.transpose(-2, -1) / math.sqrt(D_)
    return (scores.masked_fill(~mask(T_, S_, G_), float("-inf")).softmax(-1) @ v).reshape(B_, H_, T_, D_)


def _rows_interleaved(q, k, v):
    """A (G*T, S) mask that repeats each query's row G times in a row (t*G + g), while q.reshape(B, H_kv,
    G*T, D) orders the rows g*T + t: query t of head g gets another query's mask."""
    return _grouped_masked(
        q, k, v, lambda T_, S_, G_: torch.ones(T_, S_, dtype=torch.bool).tril(S_ - T_).repeat_interleave(G_, 0)
    )


def _group_for_queries(q, k, v):
    """A mask built for group_size queries and tiled seq_len times: right only when seq_len == group_size."""
    return _grouped_masked(q, k, v, lambda T_, S_, G_: torch.ones(G_, S_, dtype=torch.bool).tril(S_ - G_).repeat(T_, 1))


def _clones(*tensors):
    return tuple(t.clone() for t in tensors)


def _shape_of(x) -> str:
    return str(tuple(x.shape)) if isinstance(x, torch.Tensor) else type(x).__name__


# ---------------------------------------------------------------------------------------------
# 6.1 repeat_kv


@check("6.1")
def repeat_kv_follows_the_checkpoints_order(kv, rng):
    """Check that MHA attention over repeat_kv's copies is a GQA layer's attention, query head by query head (6
    query heads, 2 key/value heads), and the boundaries: group_size 1 (MHA) and one key/value head (MQA).

    One check, so that points come only with the whole contract: the shipped body (Exercise 6.1 is a find-and-fix)
    is right at both boundaries. Its failure shows the symptom, which query heads go wrong, not the cause."""
    x, q, v = _randn(rng, B, H_KV, S, D), _randn(rng, B, H, T, D), _randn(rng, B, H_KV, S, D)
    expected = _attention(q, x.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1))
    got = kv.repeat_kv(x.clone(), G)
    assert isinstance(got, torch.Tensor) and tuple(got.shape) == (B, H, S, D), (
        f"repeat_kv of (batch, n_kv_heads, kv_len, head_dim) = {tuple(x.shape)} with group_size {G} "
        f"should be {(B, H, S, D)}, got {_shape_of(got)}"
    )
    values = kv.repeat_kv(v.clone(), G)
    ours = _attention(q, got.to(q.dtype), values.to(q.dtype)) if isinstance(values, torch.Tensor) else None
    if ours is None or not _close(ours, expected):
        wrong = [
            h for h in range(H) if ours is None or not torch.allclose(ours[:, h], expected[:, h], rtol=1e-4, atol=1e-5)
        ]
        right = [h for h in range(H) if h not in wrong]
        same = tr("; heads {heads} the same", heads=", ".join(map(str, right))) if right else ""
        raise AssertionError(
            f"MHA attention over repeat_kv's copies is not a GQA layer's own attention ({H} query heads sharing {H_KV} "
            f"key/value heads, groups of {G}): query heads {', '.join(map(str, wrong))} get other outputs than in the "
            f"layer{same}. A model read this way runs without an error and answers nonsense"
        )
    same = kv.repeat_kv(x.clone(), 1)
    assert isinstance(same, torch.Tensor) and torch.equal(same, x), "group_size 1 (MHA) must return the heads unchanged"
    one = _randn(rng, B, 1, S, D)
    mqa = kv.repeat_kv(one.clone(), H)
    assert isinstance(mqa, torch.Tensor) and tuple(mqa.shape) == (B, H, S, D), (
        f"MQA: 1 head to {H} should be {(B, H, S, D)}, got {_shape_of(mqa)}"
    )
    assert all(torch.equal(mqa[:, h], one[:, 0]) for h in range(H)), (
        "MQA: every query head must read the single key/value head"
    )


# ---------------------------------------------------------------------------------------------
# 6.2 grouped_attention


def _expected_and_slips(q, k, v) -> tuple[torch.Tensor, dict]:
    """The right output and the classic wrong ones, built before learner code runs (from q, k, v it never gets)."""
    G_, Tq = q.shape[1] // k.shape[1], q.shape[2]
    kr, vr = k.repeat_interleave(G_, 1), v.repeat_interleave(G_, 1)
    slips = {
        tr("query heads read another key/value head than in a GQA layer (the grouping of Exercise 6.1)"): _attention(
            q, k.repeat(1, G_, 1, 1), v.repeat(1, G_, 1, 1)
        ),
        tr("the scores are not divided by sqrt(head_dim)"): _attention(q, kr, vr, scale=False),
        tr(
            "the mask is aligned top-left (is_causal=True or tril(0)): the T queries are the LAST T of the S positions"
        ): _attention(q, kr, vr, top_left=True),
        tr(
            "the mask's diagonal is off: the queries see as many keys as if they were the last seq_len of "
            "2 * seq_len - 1 positions, not of kv_len"
        ): _attention(q, kr, vr, offset=Tq - 1),
        tr(
            "the mask's rows and the queries' rows are in different orders: a query of one head is masked as another "
            "query would be"
        ): _rows_interleaved(q, k, v),
    }
    if Tq != G_:  # a (G, S) mask tiled T times has G*T rows too, and equals the right one when T == G
        slips[tr("the mask is right only where seq_len equals group_size: it was built for group_size queries")] = (
            _group_for_queries(q, k, v)
        )
    return _attention(q, kr, vr), slips


def _diagnose(got, slips: dict) -> str:
    """Name the likely slip among the precomputed wrong answers."""
    for message, tensor in slips.items():
        if _close(got, tensor):
            return message
    return tr("the output differs from MHA attention over the key/value heads copied out in a GQA layer's order (6.1)")


@check("6.2")
def grouped_attention_matches_repeated_heads(kv, rng):
    """Check that grouped_attention equals MHA attention over repeat_kv's copies of the keys and values (2 queries of 5 keys, 4 of 9)."""
    for n_q, n_k in ((T, S), (4, 9)):  # neither 1 nor 3 queries: the group size (3) cannot stand in for seq_len
        q, k, v = _randn(rng, B, H, n_q, D), _randn(rng, B, H_KV, n_k, D), _randn(rng, B, H_KV, n_k, D)
        expected, slips = _expected_and_slips(q, k, v)
        got = kv.grouped_attention(*_clones(q, k, v))
        assert isinstance(got, torch.Tensor) and tuple(got.shape) == (B, H, n_q, D), (
            f"grouped_attention should return (batch, n_heads, seq_len, head_dim) = {(B, H, n_q, D)}, got {_shape_of(got)}"
        )
        assert _close(got, expected), f"{n_q} queries against {n_k} keys: {_diagnose(got, slips)}"


@check("6.2")
def grouped_attention_boundaries(kv, rng):
    """Check MHA (group size 1), MQA (one key/value head), one decode-step query against 7 keys and a prefill (4 of 4)."""
    cases = (
        (H, T, S, tr("MHA (n_kv_heads == n_heads): {slip}")),  # the case and the slip as one text: its colon too
        (1, 4, 9, tr("MQA (one key/value head): {slip}")),
        (H_KV, 1, 7, tr("one decode-step query against 7 keys: {slip}")),
        (H_KV, 4, 4, tr("a prefill: 4 queries, 4 keys, no cache: {slip}")),
    )
    for n_kv, n_q, n_k, case in cases:
        q, k, v = _randn(rng, B, H, n_q, D), _randn(rng, B, n_kv, n_k, D), _randn(rng, B, n_kv, n_k, D)
        expected, slips = _expected_and_slips(q, k, v)
        got = kv.grouped_attention(*_clones(q, k, v))
        assert _close(got, expected), case.format(slip=_diagnose(got, slips))


_BIG = dict(H=32, H_KV=2, S=16_384, D=64)  # the measured decode step: 16 query heads per key/value head


def _grouped_reference(q, k, v) -> torch.Tensor:
    """One decode query per head in float64, each group's queries as rows against its key/value head (no copies)."""
    (B_, H_, _, D_), H_kv = q.shape, k.shape[1]
    rows = q.double().reshape(B_, H_kv, H_ // H_kv, D_)  # (B, H, 1, D) -> (B, H_kv, G, D)
    probs = (rows @ k.double().transpose(-2, -1) / math.sqrt(D_)).softmax(-1)
    return (probs @ v.double()).reshape(B_, H_, 1, D_)


@check("6.2")
def grouped_attention_does_not_copy_heads(kv, rng):
    """Check that a decode step against a long cache is right and never holds n_heads heads of keys or values.

    In the isolated grader the grading process measures the memory the call holds (16 query heads per key/value
    head, 16,384 cached keys: a copy of the keys to every query head is 128 MB); locally every tensor it
    allocates is watched (1 query, 40 cached keys)."""
    n = _BIG
    q, k, v = (
        _randn(rng, 1, n["H"], 1, n["D"]),
        _randn(rng, 1, n["H_KV"], n["S"], n["D"]),
        _randn(rng, 1, n["H_KV"], n["S"], n["D"]),
    )
    measured = memory_of(kv.grouped_attention, *_clones(q, k, v))
    if measured is not None:
        got, usage = measured
        assert (
            isinstance(got, torch.Tensor) and got.shape == q.shape and _close(got.double(), _grouped_reference(q, k, v))
        ), (
            f"a decode step ({n['H']} query heads, {n['H_KV']} key/value heads, {n['S']:,} cached keys) differs "
            "from MHA attention over the key/value heads copied out in a GQA layer's order (6.1)"
        )
        held_nothing_before(usage, "grouped_attention")
        copy = q.shape[1] * n["S"] * n["D"] * 4  # the keys (or values) of one layer, once per query head, float32
        assert usage.beyond_inputs < copy // 2, (
            f"a decode step against {n['S']:,} cached keys held {usage.beyond_inputs / MB:.0f} MB beyond its inputs at "
            f"its peak (the grader measures the process's memory): n_heads = {n['H']} copies of the {n['H_KV']} "
            f"cached key/value heads take {copy / MB:.0f} MB for the keys alone. repeat_kv, any repeat of the heads, "
            ".expand(...).contiguous(), a broadcasting matmul and torch's scaled_dot_product_attention (whose fused "
            "kernel the grader runs without: enable_gqa=True then repeats the heads) all copy"
        )
        return
    kv_len = 40
    q, k, v = _randn(rng, B, H, 1, D), _randn(rng, B, H_KV, kv_len, D), _randn(rng, B, H_KV, kv_len, D)
    expected, slips = _expected_and_slips(q, k, v)
    got = kv.grouped_attention(
        *_clones(q, k, v)
    )  # first the right answer: a function that does nothing allocates nothing
    assert _close(got, expected), f"a decode step (1 query, {kv_len} cached keys): {_diagnose(got, slips)}"
    made = new_tensors(kv.grouped_attention, *_clones(q, k, v))
    fused = [op for op, _ in made if op == "_scaled_dot_product_flash_attention_for_cpu"]
    assert not fused, (
        "grouped_attention ran torch's fused attention kernel (scaled_dot_product_attention): it reads the shared "
        "heads in place for you, which is the exercise. The grader runs without that kernel, and then "
        "enable_gqa=True repeats the key/value heads to every query head: write the grouped matmuls yourself"
    )
    limit = B * H * kv_len * D  # n_heads copies of the cached keys (or values) of this layer
    big = [(op, tuple(shape)) for op, shape in made if math.prod(shape) >= limit]
    assert not big, (
        f"grouped_attention made a tensor of {big[0][1]} ({big[0][0]}): n_heads = {H} copies of the {H_KV} cached "
        "key/value heads. repeat_kv, any repeat of the heads, .expand(...).contiguous() and a broadcasting matmul all "
        "copy"
    )


# ---------------------------------------------------------------------------------------------
# 6.3 mean_pool_heads

_C, _D = 10, 4  # d_model and head_dim of the pooled weights: distinct from H, H_KV and G


@check("6.3")
def mean_pool_heads_averages_each_group(kv, rng):
    """Check that each new head of a (n_heads*head_dim, d_model) weight is the mean of the old heads it replaces."""
    w = _randn(rng, H * _D, _C)
    heads = w.view(H, _D, _C)
    expected = heads.view(H_KV, G, _D, _C).mean(1).reshape(H_KV * _D, _C)
    got = kv.mean_pool_heads(w.clone(), H, H_KV)
    assert isinstance(got, torch.Tensor) and tuple(got.shape) == (H_KV * _D, _C), (
        f"pooling a ({H} heads x head_dim {_D}, d_model {_C}) weight to {H_KV} heads should give {(H_KV * _D, _C)}, got {_shape_of(got)}"
    )
    if _close(got, expected):
        return
    wrong = {
        tr(
            "new head 0 holds the mean of old heads {heads}, whose query heads read different key/value heads in "
            "repeat_kv's order",
            heads=", ".join(str(h) for h in range(0, H, H_KV)),
        ): heads.view(G, H_KV, _D, _C).mean(0).reshape(H_KV * _D, _C),
        tr("the first head of each group was kept and the others dropped"): heads.view(H_KV, G, _D, _C)[:, 0].reshape(
            H_KV * _D, _C
        ),
        tr("each new head is {g} times the mean it should hold", g=G): heads.view(H_KV, G, _D, _C)
        .sum(1)
        .reshape(H_KV * _D, _C),
        tr(
            "consecutive ROWS were averaged, not heads: each new row mixes rows of one old head, and a row of one "
            "head never meets the same row of the others"
        ): w.view(H_KV * _D, G, _C).mean(1),
    }
    for message, tensor in wrong.items():
        if _close(got, tensor):
            raise AssertionError(message)
    raise AssertionError("the pooled weight differs from the mean of the old heads each new head replaces")


@check("6.3")
def mean_pool_heads_keeps_identical_heads(kv, rng):
    """Check the invariant: pooling a weight whose heads are repeat_kv's copies of a smaller one gives that one back."""
    small = _randn(rng, H_KV * _D, _C)
    copies = small.view(H_KV, _D, _C).repeat_interleave(G, dim=0).reshape(H * _D, _C)  # (H*D, C), heads a a a b b b
    got = kv.mean_pool_heads(copies, H, H_KV)  # copies is a new tensor, small never leaves this check
    assert _close(got, small), "pooling groups of identical heads must give those heads back exactly"
    same = kv.mean_pool_heads(small.clone(), H_KV, H_KV)
    assert _close(same, small), "pooling to as many heads as there are (group_size 1) must change nothing"


# ---------------------------------------------------------------------------------------------
# 6.4 to_gqa


def _gqa_and_expanded(seed: int, n_kv_heads: int):
    """A random GQA decoder, and the MHA decoder whose K/V heads are its heads repeat_interleave'd."""
    torch.manual_seed(seed)
    gqa = Decoder(ModelConfig(**{**CONFIG.to_dict(), "n_kv_heads": n_kv_heads})).eval()
    with torch.no_grad():
        for p in gqa.parameters():
            p.normal_(0.0, 0.3 if p.dim() == 2 else 1.0)  # far from uniform attention
    state, head_dim = {}, CONFIG.head_dim
    for name, w in gqa.state_dict().items():
        if name.endswith(("k_proj.weight", "v_proj.weight")):  # (H_kv*D, C) -> (H*D, C)
            w = (
                w.view(n_kv_heads, head_dim, -1)
                .repeat_interleave(CONFIG.n_heads // n_kv_heads, dim=0)
                .reshape(-1, w.shape[1])
            )
        state[name] = w
    mha = Decoder(CONFIG).eval()
    mha.load_state_dict(state)
    return gqa, mha


@check("6.4")
def to_gqa_recovers_a_gqa_model(kv, rng):
    """Check that converting an MHA model whose K/V heads are copies per group gives the GQA model's logits."""
    gqa, mha = _gqa_and_expanded(int(rng.integers(1000)), 2)
    before = {k: v.clone() for k, v in mha.state_dict().items()}
    ids = torch.from_numpy(rng.integers(0, CONFIG.vocab_size, size=(2, 7)))
    with torch.inference_mode():
        expected = gqa(ids)  # gqa itself never reaches learner code
    got = kv.to_gqa(mha, 2)
    assert isinstance(got, Decoder), f"to_gqa should return a kvlib Decoder, got {type(got).__name__}"
    assert got.config.n_kv_heads == 2 and got.config.n_heads == CONFIG.n_heads, (
        f"the new config should have n_heads={CONFIG.n_heads}, n_kv_heads=2; got {got.config.n_heads}, {got.config.n_kv_heads}"
    )
    with torch.inference_mode():
        assert _close(got(ids), expected), (
            "the converted model's logits differ from those of the GQA model whose heads were copied out to make it"
        )
    assert all(torch.equal(before[k], v) for k, v in mha.state_dict().items()), (
        "to_gqa must not change the model it converts"
    )


@check("6.4")
def to_gqa_pools_only_keys_and_values(kv, rng):
    """Check that to_gqa pools k_proj and v_proj with `pool` and copies every other weight unchanged."""
    torch.manual_seed(int(rng.integers(1000)))
    mha = Decoder(CONFIG).eval()
    theirs = {name: w.clone() for name, w in mha.state_dict().items()}  # before learner code runs
    ids = torch.from_numpy(rng.integers(0, CONFIG.vocab_size, size=(2, 5)))
    with torch.inference_mode():
        logits = mha(ids)
    got = kv.to_gqa(mha, 3)
    ours = got.state_dict()
    for name, w in theirs.items():
        if name.endswith(("k_proj.weight", "v_proj.weight")):
            expected = w.view(3, 2, CONFIG.head_dim, -1).mean(1).reshape(-1, w.shape[1])
            assert _close(ours[name], expected), (
                f"{name}: expected the mean of each pair of consecutive heads (6 heads to 3)"
            )
        else:
            assert torch.equal(ours[name], w), f"{name} should be copied unchanged: only keys and values are pooled"
    first = kv.to_gqa(mha, 1, pool=kv.first_head_of_group)  # the recipe the GQA paper compares with
    assert torch.equal(
        first.state_dict()["layers.0.attn.k_proj.weight"], theirs["layers.0.attn.k_proj.weight"][: CONFIG.head_dim]
    ), "to_gqa must use the pool function it is given (pool=None means mean_pool_heads)"
    same = kv.to_gqa(mha, CONFIG.n_heads)
    with torch.inference_mode():
        assert _close(same(ids), logits), "to_gqa(model, n_heads) (group size 1) must give the same logits"


@check("6.4")
def to_gqa_converts_a_gqa_model_and_keeps_dtype_and_mode(kv, rng):
    """Check a model that is already GQA (2 key/value heads to 1), a float64 model in training mode, and one in eval mode."""
    gqa, _ = _gqa_and_expanded(int(rng.integers(1000)), 2)
    state = {name: w.clone() for name, w in gqa.state_dict().items()}
    try:
        got = kv.to_gqa(gqa, 1)
    except ExerciseNotDone:
        raise
    except (ValueError, RuntimeError) as err:
        raise AssertionError(
            f"converting a model that is already GQA (2 key/value heads, {CONFIG.n_heads} query heads) to 1 failed "
            f"({type(err).__name__}: {err})"
        ) from None
    assert isinstance(got, Decoder) and got.config.n_kv_heads == 1, (
        "to_gqa(model, 1) should return a Decoder with n_kv_heads 1"
    )
    for name, w in state.items():
        if name.endswith(("k_proj.weight", "v_proj.weight")):
            expected = w.view(1, 2, CONFIG.head_dim, -1).mean(1).reshape(-1, w.shape[1])
            assert _close(got.state_dict()[name], expected), (
                f"{name}: a model that is already GQA (2 key/value heads) pooled to 1 should hold the mean of its 2 heads"
            )
    for dtype, training in ((torch.float64, True), (torch.float32, False)):
        torch.manual_seed(int(rng.integers(1000)))
        source = Decoder(CONFIG).to(dtype).train(training)
        state = {name: w.clone() for name, w in source.state_dict().items()}
        got = kv.to_gqa(source, 2)
        mode = tr("training") if training else tr("eval")
        assert all(w.dtype == dtype for w in got.state_dict().values()), (
            f"the source model is {dtype}; the converted one has {sorted({str(w.dtype) for w in got.state_dict().values()})}: "
            "keep the source's dtype"
        )
        assert got.training == training, f"the source model is in {mode} mode, the converted one is not"
        assert torch.equal(got.state_dict()["embed.weight"], state["embed.weight"]), (
            f"in {dtype}, the embedding should be copied exactly"
        )


# ---------------------------------------------------------------------------------------------
# 6.5 predicted_speedup (predict, then measure: graded against the analytic value, never the run)


def _numbers_read(c, n_kv_heads, kv_len, batch, *, shrink=True, per_sequence=False, cache_share=1.0, table=False):
    """What a decode step reads, in numbers: every matrix weight once (k_proj and v_proj at n_kv_heads heads when
    shrink), the embedding table whole if table, and `cache_share` of every sequence's cache of kv_len tokens."""
    weights = matrix_params(ModelConfig(**{**c.to_dict(), "n_kv_heads": n_kv_heads if shrink else c.n_heads}))
    weights += c.vocab_size * c.d_model if table else 0
    cache = 2 * c.n_layers * n_kv_heads * c.head_dim * kv_len * batch * cache_share
    return weights * (batch if per_sequence else 1) + cache


def _speedup_slips(c, h, S, batch) -> dict:
    """The speedup each classic slip predicts (computed before learner code runs)."""
    H, L = c.n_heads, c.n_layers

    def ratio(**how):
        return _numbers_read(c, H, S, batch, **how) / _numbers_read(c, h, S, batch, **how)

    return {  # each the ratio of steps counted another way: the symptom, not the term to add
        tr("that is the ratio of the caches alone (group_size), as if the steps read nothing else"): H / h,
        tr("that is the ratio of steps whose weights all stay at MHA's size"): (
            _numbers_read(c, H, S, batch) / _numbers_read(c, h, S, batch, shrink=False)
        ),
        tr("that is the ratio of steps that read the weights again for every sequence"): ratio(per_sequence=True),
        tr("that is the ratio of steps whose cache is half the size (keys or values, not both)"): ratio(
            cache_share=0.5
        ),
        tr("that is the ratio of steps whose cache is one layer's, not {layers} layers'", layers=L): ratio(
            cache_share=1 / L
        ),
        tr("that is the ratio at kv_len 1, one cached token per sequence"): (
            _numbers_read(c, H, 1, batch) / _numbers_read(c, h, 1, batch)
        ),
        tr("that is the ratio of steps that read the whole embedding table, where a token needs one row of it"): ratio(
            table=True
        ),
        tr(
            "that is the speedup over {own} key/value heads (the config's own), not over MHA's {h}",
            own=c.n_kv_heads,
            h=H,
        ): (_numbers_read(c, c.n_kv_heads, S, batch) / _numbers_read(c, h, S, batch)),
        tr("that is the inverse: a speedup is MHA's time over this one's, above 1 when sharing reads less"): 1
        / (_numbers_read(c, H, S, batch) / _numbers_read(c, h, S, batch)),
    }


def _speedups() -> tuple:
    """(config, name, n_kv_heads, kv_len, batch) of each case, named in the learner's language."""
    llama2, llama3 = REAL_MODELS["Llama-2-7B"].config, REAL_MODELS["Llama-3-8B"].config
    return (
        (llama2, tr("Llama-2-7B's shape"), 8, 4096, 1),
        (llama2, tr("Llama-2-7B's shape"), 1, 32768, 16),
        (llama3, tr("Llama-3-8B's shape (its config says 8 key/value heads)"), 2, 8192, 4),
        (CONFIG, tr("a small config, 6 heads"), 2, 9, 3),
        (CONFIG, tr("a small config, 6 heads"), 3, 5, 1),
    )


def _close_ratio(got, expected) -> bool:
    return isinstance(got, (int, float)) and not isinstance(got, bool) and math.isclose(got, expected, rel_tol=1e-9)


@check("6.5")
def predicted_speedup_matches_the_count(kv, rng):
    """Check the predicted speedup of a memory-bound decode step on real shapes and a small config against the
    count."""
    for c, name, h, S, batch in _speedups():
        expected = _numbers_read(c, c.n_heads, S, batch) / _numbers_read(c, h, S, batch)
        slips = _speedup_slips(c, h, S, batch)
        where = tr(
            "{name}, {n_heads} query heads to {h} key/value heads, kv_len {S}, batch {batch}",
            name=name,
            n_heads=c.n_heads,
            h=h,
            S=S,
            batch=batch,
        )
        got = kv.predicted_speedup(ModelConfig(**c.to_dict()), h, S, batch)
        assert isinstance(got, (int, float)) and not isinstance(got, bool), (
            f"{where}: predicted_speedup should return a float, got {type(got).__name__} {got!r}"
        )
        if _close_ratio(got, expected):
            continue
        for slip, wrong in slips.items():
            if _close_ratio(got, wrong):
                raise AssertionError(f"{where}: {got:.3f}x: {slip}")
        raise AssertionError(f"{where}: expected {expected:.3f}x, got {got:.3f}x")


@check("6.5")
def predicted_speedup_bounds(kv, rng):
    """Check MHA against itself (1.0), and that the prediction grows with kv_len towards group_size, never past it."""
    c = ModelConfig(**CONFIG.to_dict())
    same = kv.predicted_speedup(c, c.n_heads, 7, 2)
    assert _close_ratio(same, 1.0), f"n_kv_heads == n_heads is MHA itself: the speedup is 1.0, got {same!r}"
    lens = (1, 30, 3000, 300_000)
    expected = [_numbers_read(CONFIG, CONFIG.n_heads, S, 1) / _numbers_read(CONFIG, 2, S, 1) for S in lens]
    got = [kv.predicted_speedup(ModelConfig(**CONFIG.to_dict()), 2, S, 1) for S in lens]
    assert all(isinstance(g, float) for g in got) and got == sorted(got) and 1 < got[0] and got[-1] < 3, (
        "with groups of 3 the prediction should grow with kv_len, from just above 1 (the weights dominate) towards 3 "
        f"(the cache dominates), never reaching it; got {[round(g, 3) if isinstance(g, float) else g for g in got]}"
    )
    assert all(map(_close_ratio, got, expected)), (
        f"groups of 3 at kv_len {lens}: expected {[round(e, 3) for e in expected]}, got {[round(g, 3) for g in got]}"
    )
