"""Checks for notebook 06 (kvlib/gqa.py): exercises 6.1-6.4.

Sizes all differ (batch 2, 6 query heads, 2 key/value heads, 3 queries, 5 keys, head_dim 8), so a
swapped axis fails. The known slips are named: `repeat` instead of `repeat_interleave` (the
wrong head grouping), attention that copies the shared heads out to every query head (caught by
watching every tensor torch allocates), pooling strided heads or the wrong axis, keeping one head.
"""
from __future__ import annotations

import math

import torch
from kvlib.measure.timing import new_tensors
from kvlib.checks import check
from kvlib.core.model import Decoder, ModelConfig

B, H, H_KV, T, S, D = 2, 6, 2, 3, 5, 8
G = H // H_KV
CONFIG = ModelConfig(vocab_size=23, d_model=48, n_layers=2, n_heads=6, n_kv_heads=6, hidden_dim=40, max_seq_len=32)


def _randn(rng, *shape) -> torch.Tensor:
    return torch.from_numpy(rng.normal(size=shape)).float()


def _close(a, b) -> bool:
    return isinstance(a, torch.Tensor) and a.shape == b.shape and torch.allclose(a, b, rtol=1e-4, atol=1e-5)


def _attention(q, k, v, *, scale=True, top_left=False):
    """The reference: softmax(q k^T / sqrt(D)) v per head, k and v already n_heads; bottom-right mask."""
    Tq, Sk = q.shape[-2], k.shape[-2]
    scores = q @ k.transpose(-2, -1) / (math.sqrt(q.shape[-1]) if scale else 1.0)
    allowed = torch.ones(Tq, Sk, dtype=torch.bool).tril(0 if top_left else Sk - Tq)  # True = may attend
    return scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ v


def _shape_of(x) -> str:
    return str(tuple(x.shape)) if isinstance(x, torch.Tensor) else type(x).__name__


# ---------------------------------------------------------------------------------------------
# 6.1 repeat_kv


@check("6.1")
def repeat_kv_matches_repeat_interleave(kv, rng):
    """Check that repeat_kv equals torch.repeat_interleave on the head axis (dim 1)."""
    x = _randn(rng, B, H_KV, S, D)
    got = kv.repeat_kv(x, G)
    expected = x.repeat_interleave(G, dim=1)
    assert isinstance(got, torch.Tensor) and tuple(got.shape) == (B, H, S, D), (
        f"repeat_kv of (batch, n_kv_heads, kv_len, head_dim) = {tuple(x.shape)} with group_size {G} "
        f"should be {(B, H, S, D)}, got {_shape_of(got)}")
    if torch.equal(got, x.repeat(1, G, 1, 1)):
        raise AssertionError("the heads come out as [a, b, a, b, ...]: that is x.repeat. Query head h shares "
                             "key/value head h // group_size, so heads come out [a, a, a, b, b, b] (repeat_interleave)")
    assert torch.equal(got, expected), "repeat_kv differs from x.repeat_interleave(group_size, dim=1)"


@check("6.1")
def repeat_kv_boundaries(kv, rng):
    """Check group_size 1 (MHA: the heads unchanged) and one key/value head (MQA: every head the same)."""
    x = _randn(rng, B, H_KV, S, D)
    same = kv.repeat_kv(x, 1)
    assert isinstance(same, torch.Tensor) and torch.equal(same, x), "group_size 1 (MHA) must return the heads unchanged"
    one = _randn(rng, B, 1, S, D)
    mqa = kv.repeat_kv(one, H)
    assert isinstance(mqa, torch.Tensor) and tuple(mqa.shape) == (B, H, S, D), f"MQA: 1 head to {H} should be {(B, H, S, D)}, got {_shape_of(mqa)}"
    assert all(torch.equal(mqa[:, h], one[:, 0]) for h in range(H)), "MQA: every query head must read the single key/value head"


# ---------------------------------------------------------------------------------------------
# 6.2 grouped_attention


def _diagnose_attention(got, q, k, v) -> str:
    """Name the likely slip, by rebuilding the classic wrong answers."""
    G_ = q.shape[1] // k.shape[1]
    wrong = {
        "the heads are grouped as x.repeat would ([a, b, a, b]): query head h reads key/value head h // group_size":
            _attention(q, k.repeat(1, G_, 1, 1), v.repeat(1, G_, 1, 1)),
        "the scores are not divided by sqrt(head_dim)": _attention(q, k.repeat_interleave(G_, 1), v.repeat_interleave(G_, 1), scale=False),
        "the mask is aligned top-left (is_causal=True or tril(0)): the T queries are the LAST T of the S positions":
            _attention(q, k.repeat_interleave(G_, 1), v.repeat_interleave(G_, 1), top_left=True),
    }
    for message, tensor in wrong.items():
        if _close(got, tensor):
            return message
    return "the output differs from attention with the key/value heads repeat_interleave'd"


@check("6.2")
def grouped_attention_matches_repeated_heads(kv, rng):
    """Check that grouped_attention equals MHA attention on repeat_interleave'd keys and values (3 queries, 5 keys)."""
    q, k, v = _randn(rng, B, H, T, D), _randn(rng, B, H_KV, S, D), _randn(rng, B, H_KV, S, D)
    got = kv.grouped_attention(q, k, v)
    assert isinstance(got, torch.Tensor) and tuple(got.shape) == (B, H, T, D), (
        f"grouped_attention should return (batch, n_heads, seq_len, head_dim) = {(B, H, T, D)}, got {_shape_of(got)}")
    expected = _attention(q, k.repeat_interleave(G, 1), v.repeat_interleave(G, 1))
    assert _close(got, expected), _diagnose_attention(got, q, k, v)


@check("6.2")
def grouped_attention_boundaries(kv, rng):
    """Check MHA (group size 1), MQA (one key/value head) and one decode-step query against 7 keys."""
    for n_kv, n_q, n_k in ((H, T, S), (1, T, S), (H_KV, 1, 7)):
        q, k, v = _randn(rng, B, H, n_q, D), _randn(rng, B, n_kv, n_k, D), _randn(rng, B, n_kv, n_k, D)
        got = kv.grouped_attention(q, k, v)
        expected = _attention(q, k.repeat_interleave(H // n_kv, 1), v.repeat_interleave(H // n_kv, 1))
        case = {H: "MHA (n_kv_heads == n_heads)", 1: "MQA (one key/value head)"}.get(n_kv, "one decode-step query against 7 keys")
        assert _close(got, expected), f"{case}: {_diagnose_attention(got, q, k, v)}"


def _new_tensors(fn, *args) -> list[tuple[str, tuple]]:
    """What fn(*args) allocates: watched where fn runs (in the isolated grading child, fn.watch)."""
    watch = getattr(fn, "watch", None)
    return watch(*args) if watch is not None else new_tensors(fn, *args)


@check("6.2")
def grouped_attention_does_not_copy_heads(kv, rng):
    """Check that a decode step (1 query, 40 cached keys) is right and never allocates n_heads heads of keys or values."""
    kv_len = 40
    q, k, v = _randn(rng, B, H, 1, D), _randn(rng, B, H_KV, kv_len, D), _randn(rng, B, H_KV, kv_len, D)
    got = kv.grouped_attention(q, k, v)  # first the right answer: a function that does nothing allocates nothing
    assert _close(got, _attention(q, k.repeat_interleave(G, 1), v.repeat_interleave(G, 1))), (
        f"a decode step (1 query, {kv_len} cached keys): {_diagnose_attention(got, q, k, v)}")
    made = _new_tensors(kv.grouped_attention, q, k, v)
    limit = B * H * kv_len * D  # n_heads copies of the cached keys (or values) of this layer
    big = [(op, tuple(shape)) for op, shape in made if math.prod(shape) >= limit]
    assert not big, (
        f"grouped_attention made a tensor of {big[0][1]} ({big[0][0]}): n_heads = {H} copies of the {H_KV} cached "
        "key/value heads. repeat_kv, repeat_interleave, .expand(...).contiguous() and a broadcasting matmul all "
        "copy; reshape q to (batch, n_kv_heads, group_size * seq_len, head_dim) and multiply by k itself")


# ---------------------------------------------------------------------------------------------
# 6.3 mean_pool_heads

_C, _D = 10, 4  # d_model and head_dim of the pooled weights: distinct from H, H_KV and G


@check("6.3")
def mean_pool_heads_averages_each_group(kv, rng):
    """Check that head j of the result is the mean of heads j*G .. j*G+G-1 of a (n_heads*head_dim, d_model) weight."""
    w = _randn(rng, H * _D, _C)
    got = kv.mean_pool_heads(w, H, H_KV)
    assert isinstance(got, torch.Tensor) and tuple(got.shape) == (H_KV * _D, _C), (
        f"pooling a ({H} heads x head_dim {_D}, d_model {_C}) weight to {H_KV} heads should give {(H_KV * _D, _C)}, got {_shape_of(got)}")
    heads = w.view(H, _D, _C)
    expected = heads.view(H_KV, G, _D, _C).mean(1).reshape(H_KV * _D, _C)
    if _close(got, expected):
        return
    wrong = {
        "heads h, h + n_kv_heads, ... were pooled together (the `repeat` order): a group is CONSECUTIVE heads, "
        "as repeat_kv reads them": heads.view(G, H_KV, _D, _C).mean(0).reshape(H_KV * _D, _C),
        "the first head of each group was kept: average all of the group's heads": heads.view(H_KV, G, _D, _C)[:, 0].reshape(H_KV * _D, _C),
        "the group's heads were summed: divide by group_size (mean, not sum)": heads.view(H_KV, G, _D, _C).sum(1).reshape(H_KV * _D, _C),
        "the pooling ran over the rows without the head structure (consecutive ROWS averaged, not heads): "
        "view the weight as (n_kv_heads, group_size, head_dim, d_model) first": w.view(H_KV * _D, G, _C).mean(1),
    }
    for message, tensor in wrong.items():
        if _close(got, tensor):
            raise AssertionError(message)
    raise AssertionError("the pooled weight differs from the mean of each group of consecutive heads")


@check("6.3")
def mean_pool_heads_keeps_identical_heads(kv, rng):
    """Check that pooling heads that are already copies per group (repeat_interleave) gives the original heads back."""
    small = _randn(rng, H_KV * _D, _C)
    copies = small.view(H_KV, _D, _C).repeat_interleave(G, dim=0).reshape(H * _D, _C)  # (H*D, C), heads a a a b b b
    got = kv.mean_pool_heads(copies, H, H_KV)
    assert _close(got, small), "pooling groups of identical heads must give those heads back exactly"
    same = kv.mean_pool_heads(small, H_KV, H_KV)
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
            w = w.view(n_kv_heads, head_dim, -1).repeat_interleave(CONFIG.n_heads // n_kv_heads, dim=0).reshape(-1, w.shape[1])
        state[name] = w
    mha = Decoder(CONFIG).eval()
    mha.load_state_dict(state)
    return gqa, mha


@check("6.4")
def to_gqa_recovers_a_gqa_model(kv, rng):
    """Check that converting an MHA model whose K/V heads are copies per group gives the GQA model's logits."""
    gqa, mha = _gqa_and_expanded(int(rng.integers(1000)), 2)
    before = {k: v.clone() for k, v in mha.state_dict().items()}
    got = kv.to_gqa(mha, 2)
    assert isinstance(got, Decoder), f"to_gqa should return a kvlib Decoder, got {type(got).__name__}"
    assert got.config.n_kv_heads == 2 and got.config.n_heads == CONFIG.n_heads, (
        f"the new config should have n_heads={CONFIG.n_heads}, n_kv_heads=2; got {got.config.n_heads}, {got.config.n_kv_heads}")
    ids = torch.from_numpy(rng.integers(0, CONFIG.vocab_size, size=(2, 7)))
    with torch.inference_mode():
        assert _close(got(ids), gqa(ids)), (
            "the converted model's logits differ from the GQA model its heads were copied from: pool groups of "
            "consecutive heads (mean_pool_heads), only in k_proj and v_proj")
    assert all(torch.equal(before[k], v) for k, v in mha.state_dict().items()), "to_gqa must not change the model it converts"


@check("6.4")
def to_gqa_pools_only_keys_and_values(kv, rng):
    """Check that to_gqa pools k_proj and v_proj with `pool` and copies every other weight unchanged."""
    torch.manual_seed(int(rng.integers(1000)))
    mha = Decoder(CONFIG).eval()
    got = kv.to_gqa(mha, 3)
    ours, theirs = got.state_dict(), mha.state_dict()
    for name, w in theirs.items():
        if name.endswith(("k_proj.weight", "v_proj.weight")):
            expected = w.view(3, 2, CONFIG.head_dim, -1).mean(1).reshape(-1, w.shape[1])
            assert _close(ours[name], expected), f"{name}: expected the mean of each pair of consecutive heads (6 heads to 3)"
        else:
            assert torch.equal(ours[name], w), f"{name} should be copied unchanged: only keys and values are pooled"
    first = kv.to_gqa(mha, 1, pool=kv.first_head_of_group)  # the recipe the GQA paper compares with
    assert torch.equal(first.state_dict()["layers.0.attn.k_proj.weight"], theirs["layers.0.attn.k_proj.weight"][: CONFIG.head_dim]), (
        "to_gqa must use the pool function it is given (pool=None means mean_pool_heads)")
    same = kv.to_gqa(mha, CONFIG.n_heads)
    ids = torch.from_numpy(rng.integers(0, CONFIG.vocab_size, size=(2, 5)))
    with torch.inference_mode():
        assert _close(same(ids), mha(ids)), "to_gqa(model, n_heads) (group size 1) must give the same logits"
