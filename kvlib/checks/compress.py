"""Checks for notebook 08 (kvlib/compress.py): exercises 8.1-8.8 (08a: 8.1, 8.2, 8.7; 08b: 8.5, 8.6, 8.8; 08c: 8.3, 8.4).

Sizes all differ (batch 2, 6 query heads, 2 key/value heads, head_dim 8, groups of 4 tokens, 2 or 3
queries against 11 or 13 keys), so a swapped axis fails. Every expected value is computed here,
before learner code runs, from tensors the learner's code never receives (it gets clones). Named
slips: a scale shared along the wrong axis, truncating instead of rounding, dividing by 128 or 255,
an all-zero slice turned to nan; an int8 cache read without its scales or past kv_len; a ring that
overwrites the sinks or never wraps (named by what the slots hold: 8.3 is find-and-fix); text positions or slot order instead of places by age; MLA
without the rotary part, with the wrong 1/sqrt, a top-left mask, or per-head keys built in the absorbed path
(the memory a long decode step holds, measured by the grading process in the isolated grader; every tensor
torch allocates, in a local run).
The texts a message is built from (which input, what a slip is called) go through tr(), so that the catalogue
(kvlib/course/i18n.py) translates them as it does the messages.
"""

from __future__ import annotations

import math
import numbers

import torch

from kvlib.checks import MB, check, held_nothing_before, memory_of
from kvlib.core.configs import MLA_MODELS
from kvlib.core.model import ModelConfig
from kvlib.course.i18n import tr
from kvlib.measure.timing import new_tensors

B, H, H_KV, D, GROUP = 2, 6, 2, 8, 4
CONFIG = ModelConfig(vocab_size=23, d_model=48, n_layers=2, n_heads=6, n_kv_heads=2, hidden_dim=40, max_seq_len=32)


def _randn(rng, *shape) -> torch.Tensor:
    return torch.from_numpy(rng.normal(size=shape)).float()


def _close(a, b, rtol=1e-4, atol=1e-5) -> bool:
    return (
        isinstance(a, torch.Tensor)
        and a.shape == b.shape
        and torch.allclose(a.double(), b.double(), rtol=rtol, atol=atol)
    )


def _shape_of(x) -> str:
    return str(tuple(x.shape)) if isinstance(x, torch.Tensor) else type(x).__name__


def _quantize(x: torch.Tensor, dim: int, divisor: float = 127, rounding=torch.round):
    """The reference int8 rule, and its slips (another divisor or rounding)."""
    scale = x.double().abs().amax(dim=dim, keepdim=True) / divisor
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return rounding(x.double() / scale).clamp(-127, 127), scale


def _attention(q, k, v, *, top_left=False, scale=None):
    """softmax(q k^T / sqrt(D)) v in float64, key/value heads repeat_interleave'd, bottom-right causal mask."""
    G = q.shape[1] // k.shape[1]
    q, k, v = q.double(), k.double().repeat_interleave(G, 1), v.double().repeat_interleave(G, 1)
    T, S = q.shape[-2], k.shape[-2]
    scores = q @ k.transpose(-2, -1) / (math.sqrt(q.shape[-1]) if scale is None else scale)
    allowed = torch.ones(T, S, dtype=torch.bool).tril(0 if top_left else S - T)
    return scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ v


def _diagnose(got, slips: dict, default: str) -> str:
    for message, tensor in slips.items():
        if _close(got, tensor):
            return message
    return default


# ---------------------------------------------------------------------------------------------
# 8.1 quantize


def _quantize_case(kv, x: torch.Tensor, dim: int, what: str) -> None:
    values, scale = _quantize(x, dim)
    other = -1 if dim in (-2, x.dim() - 2) else -2
    got = kv.quantize(x.clone(), dim)
    assert isinstance(got, tuple) and len(got) == 2, f"quantize must return (values, scale), got {type(got).__name__}"
    got_values, got_scale = got
    assert isinstance(got_values, torch.Tensor) and got_values.dtype == torch.int8 and got_values.shape == x.shape, (
        f"{what}: values must be torch.int8 of x's shape {tuple(x.shape)}, got {_shape_of(got_values)} "
        f"{getattr(got_values, 'dtype', '')}"
    )
    keep = list(x.shape)
    keep[dim] = 1
    wrong_axis = list(x.shape)
    wrong_axis[other] = 1
    assert isinstance(got_scale, torch.Tensor) and list(got_scale.shape) == keep, (
        f"{what}: scale must be {tuple(keep)} (size 1 at dim={dim}, the axis that shares a scale), got {_shape_of(got_scale)}"
        + (
            ": the scale is shared along the wrong axis"
            if isinstance(got_scale, torch.Tensor) and list(got_scale.shape) == wrong_axis
            else ""
        )
    )
    assert got_scale.dtype == torch.float32, f"{what}: scale must be float32, got {got_scale.dtype}"
    assert torch.isfinite(got_scale).all() and (got_scale > 0).all(), (
        f"{what}: a scale is 0, nan or inf where the slice's numbers are all zero: such a slice still needs a finite "
        "scale above 0 (its values are 0 whatever the scale)"
    )
    used = (x.double().abs().amax(dim=dim, keepdim=True) > 0).expand_as(got_scale)  # an all-zero slice: any scale
    for divisor, name in (
        (128, "128"),
        (255, tr("255 (that is uint8's range; int8 is symmetric, -127 ... 127)")),
        (256, "256"),
    ):
        if _close(got_scale[used], _quantize(x, dim, divisor)[1].float()[used]):
            raise AssertionError(f"{what}: the scale is max|x| / {name}: the largest |x| must map to 127")
    assert _close(got_scale[used], scale.float()[used], rtol=1e-5, atol=1e-8), (
        f"{what}: the scales are not the finest steps at which each slice's numbers fit in -127 ... 127"
    )
    err = (got_values.double() * got_scale.double() - x.double()).abs()
    if not (err <= got_scale.double() / 2 * (1 + 1e-4) + 1e-7).all():
        if (
            got_values.double().abs() <= (x.double() / got_scale.double()).abs() + 1e-3
        ).all():  # never rounded away from 0
            raise AssertionError(
                f"{what}: the values are truncated toward zero (.to(torch.int8) cuts the fraction off), not rounded "
                "to the nearest integer: an error reaches a whole scale step"
            )
        raise AssertionError(
            f"{what}: values * scale misses x by more than half a scale step (largest error "
            f"{float((err / got_scale.double()).max()):.2f} steps): the values are not the nearest integers"
        )


@check("8.1")
def quantize_keys_per_channel_values_per_token(kv, rng):
    """Check int8 keys per channel (dim=-2) and values per token (dim=-1), an outlier channel included, to half a step."""
    x = _randn(rng, B, H_KV, 7, D)
    x[..., 3] *= 20  # an outlier channel, as KIVI finds in keys: per-channel scales keep the other channels fine
    _quantize_case(kv, x, -2, tr("keys per channel (dim=-2)"))
    _quantize_case(kv, x, -1, tr("values per token (dim=-1)"))
    _quantize_case(kv, x, 2, tr("dim=2 (a positive axis)"))


@check("8.1")
def quantize_zero_slices_and_half_precision(kv, rng):
    """Check an all-zero token (values 0, a finite scale), a float16 input (float32 scale) and one element per slice."""
    x = _randn(rng, B, 5, D)
    x[1, 2] = 0
    _quantize_case(kv, x, -1, tr("a token of zeros"))
    values, _ = kv.quantize(x.clone(), -1)
    assert torch.equal(values[1, 2], torch.zeros(D, dtype=torch.int8)), "an all-zero token must quantise to zeros"
    _quantize_case(kv, x.half(), -2, tr("a float16 input"))
    _quantize_case(kv, _randn(rng, 3, 1), -1, tr("one element per slice"))


# ---------------------------------------------------------------------------------------------
# 8.2 int8_attention


def _int8_cache(rng, kv_len: int, n_kv: int = H_KV):
    """A random int8 cache holding kv_len tokens in groups of GROUP, with junk in the slots past kv_len."""
    n_groups = -(-kv_len // GROUP)
    k_values = torch.from_numpy(rng.integers(-127, 128, size=(B, n_kv, n_groups, GROUP, D))).to(torch.int8)
    k_scale = torch.from_numpy(rng.uniform(0.001, 0.05, size=(B, n_kv, n_groups, 1, D))).float()
    extra = 3  # the cache is longer than kv_len: these slots hold no token yet
    v_values = torch.from_numpy(rng.integers(-127, 128, size=(B, n_kv, kv_len + extra, D))).to(torch.int8)
    v_scale = torch.from_numpy(rng.uniform(0.001, 0.05, size=(B, n_kv, kv_len + extra, 1))).float()
    return k_values, k_scale, v_values, v_scale


def _int8_expected_and_slips(q, k_values, k_scale, v_values, v_scale, kv_len):
    Bq, Hk, n_groups, group, Dq = k_values.shape
    k_all = (k_values.double() * k_scale.double()).reshape(Bq, Hk, n_groups * group, Dq)
    v_all = v_values.double() * v_scale.double()
    k, v = k_all[:, :, :kv_len], v_all[:, :, :kv_len]
    k_raw, v_raw = (
        k_values.double().reshape(Bq, Hk, n_groups * group, Dq)[:, :, :kv_len],
        v_values[:, :, :kv_len].double(),
    )
    T = q.shape[2]
    slips = {
        tr("the keys are read without their scales (k_values * k_scale is the key)"): _attention(q, k_raw, v),
        tr("the values are read without their scales (v_values * v_scale is the value)"): _attention(q, k, v_raw),
        tr("the mask is aligned top-left: the seq_len queries are the LAST of the kv_len positions"): _attention(
            q, k, v, top_left=True
        ),
        tr("the scores are not divided by sqrt(head_dim)"): _attention(q, k, v, scale=1.0),
    }
    if n_groups * group > kv_len:
        S_all = min(n_groups * group, v_all.shape[2])
        slips[tr("slots past kv_len are attended to: keep only the first kv_len keys and values")] = (
            _attention(q, k_all[:, :, :S_all], v_all[:, :, :S_all]) if T == 1 else None
        )
    return _attention(q, k, v), {m: t for m, t in slips.items() if t is not None}


@check("8.2")
def int8_attention_matches_dequantised_attention(kv, rng):
    """Check attention over an int8 cache (groups of 4 keys) against float64 attention on the dequantised keys and values."""
    for T, kv_len in ((1, 13), (3, 11), (2, 8)):  # a decode step in a half-filled group, a prefill, whole groups
        q = _randn(rng, B, H, T, D)
        cache = _int8_cache(rng, kv_len)
        expected, slips = _int8_expected_and_slips(q, *cache, kv_len)
        got = kv.int8_attention(q.clone(), *(t.clone() for t in cache), kv_len)
        assert isinstance(got, torch.Tensor) and tuple(got.shape) == (B, H, T, D), (
            f"int8_attention should return (batch, n_heads, seq_len, head_dim) = {(B, H, T, D)}, got {_shape_of(got)}"
        )
        if not _close(got, expected):
            slip = _diagnose(
                got,
                slips,
                tr(
                    "the output differs from attention over (k_values * k_scale) and (v_values * v_scale), grouped "
                    "per channel"
                ),
            )
            raise AssertionError(f"{T} queries against {kv_len} int8 tokens: {slip}")


@check("8.2")
def int8_attention_boundaries(kv, rng):
    """Check one cached token, MHA (6 key/value heads) and a decode step whose group holds junk past kv_len."""
    for T, kv_len, n_kv in ((1, 1, 2), (2, 5, 6), (1, 9, 1)):
        q, cache = _randn(rng, B, H, T, D), _int8_cache(rng, kv_len, n_kv)
        expected, slips = _int8_expected_and_slips(q, *cache, kv_len)
        got = kv.int8_attention(q.clone(), *(t.clone() for t in cache), kv_len)
        if not _close(got, expected):
            slip = _diagnose(got, slips, tr("the output differs from attention over the dequantised cache"))
            raise AssertionError(f"{T} queries, {kv_len} tokens, {n_kv} key/value heads: {slip}")


# ---------------------------------------------------------------------------------------------
# 8.7 int8_bytes_per_token: a prediction, graded against the layout's count


def _int8_terms(config, group: int, scale_bytes: int) -> dict[str, float]:
    """Int8KVCache's bytes per token, all layers, term by term: int8 keys and values, key and value scales."""
    L, H_kv, D = config.n_layers, config.n_kv_heads, config.head_dim
    return {
        "numbers": L * H_kv * 2 * D,
        "key scales": L * H_kv * D * scale_bytes / group,
        "value scales": L * H_kv * scale_bytes,
    }


def _int8_slips(config, group: int, scale_bytes: int) -> dict[str, float]:
    t = _int8_terms(config, group, scale_bytes)
    numbers, k_scales, v_scales = t["numbers"], t["key scales"], t["value scales"]
    L, H, H_kv, D = config.n_layers, config.n_heads, config.n_kv_heads, config.head_dim
    return {
        tr("the scales are left out: every key scale and value scale is stored too"): numbers,
        tr(
            "the key scales are counted once per token: one scale per channel is shared by a whole group of tokens, "
            "so a token carries 1/group of them"
        ): numbers + L * H_kv * D * scale_bytes + v_scales,
        tr("the value scales are counted per channel: values get one scale per token (per head)"): numbers
        + k_scales
        + L * H_kv * D * scale_bytes,
        tr("only keys or only values are counted: the cache holds both"): numbers / 2 + k_scales + v_scales,
        tr("bits, not bytes: an int8 number is one byte"): 8 * numbers + k_scales + v_scales,
        tr("bits, not bytes: every number and scale is counted in bits (8 per byte), the answer wants bytes"): 8
        * (numbers + k_scales + v_scales),
        tr("the numbers are counted at the scales' width: an int8 number is one byte, a scale scale_bytes"): numbers
        * scale_bytes
        + k_scales
        + v_scales,
        tr("the query heads are counted: the cache keeps n_kv_heads heads (this config is GQA)"): (
            numbers + k_scales + v_scales
        )
        * H
        / H_kv,
        tr("one layer only: every layer keeps its own cache"): (numbers + k_scales + v_scales) / L,
    }


@check("8.7")
def int8_bytes_per_token_counts_the_layout(kv, rng):
    """Check the predicted bytes per token against Int8KVCache's layout on GQA configs of distinct sizes, groups and scale widths."""
    cases = [
        (ModelConfig(vocab_size=23, d_model=48, n_layers=3, n_heads=6, n_kv_heads=2, hidden_dim=40), 4, 4),
        (ModelConfig(vocab_size=23, d_model=80, n_layers=5, n_heads=10, n_kv_heads=5, hidden_dim=40), 32, 2),
        (ModelConfig(vocab_size=23, d_model=24, n_layers=2, n_heads=3, n_kv_heads=1, hidden_dim=40), 1, 4),
    ]
    for config, group, scale_bytes in cases:
        expected = sum(_int8_terms(config, group, scale_bytes).values())
        got = kv.int8_bytes_per_token(config, group=group, scale_bytes=scale_bytes)
        where = tr(
            "{layers} layers, {kv_heads} key/value heads of {head_dim} ({heads} query heads), groups of {group}, "
            "{scale_bytes}-byte scales",
            layers=config.n_layers,
            kv_heads=config.n_kv_heads,
            head_dim=config.head_dim,
            heads=config.n_heads,
            group=group,
            scale_bytes=scale_bytes,
        )
        assert isinstance(got, numbers.Real) and not isinstance(got, bool), (
            f"int8_bytes_per_token should return a number of bytes, got {type(got).__name__}"
        )
        if math.isclose(got, expected, rel_tol=1e-9):
            continue
        slip = next(
            (m for m, v in _int8_slips(config, group, scale_bytes).items() if math.isclose(got, v, rel_tol=1e-9)), None
        )
        raise AssertionError(
            f"{where}: expected {expected:,.2f} bytes per token, got {got:,.2f}" + (f": {slip}" if slip else "")
        )


# ---------------------------------------------------------------------------------------------
# 8.3 SinkCache.update


def _slot(p: int, n_sink: int, window: int) -> int:
    return p if p < n_sink else n_sink + (p - n_sink) % window


def _which_tokens(k: torch.Tensor, tokens: dict) -> list:
    """The token whose keys each slot of k holds (None: none of the tokens written)."""
    return [next((p for p, (kp, _) in tokens.items() if torch.equal(k[:, :, s], kp)), None) for s in range(k.shape[2])]


def _assert_slots(after: int, got: list, expected: list, n_sink: int, window: int) -> None:
    """Raise naming what a ring's wrong slots show (8.3 is find-and-fix: the symptom, not the line to change)."""
    if got == expected:
        return
    lost = [p for p in expected[:n_sink] if p not in got]
    gone = [p for p in expected if p not in got]
    empty = [s for s, p in enumerate(got) if p is None]
    if lost:
        raise AssertionError(
            f"after {after} tokens (n_sink={n_sink}, window={window}) the slots hold tokens {got}, expected "
            f"{expected}: sink token(s) {lost} are gone from the cache, though sinks never leave"
        )
    if empty:
        raise AssertionError(
            f"after {after} tokens (n_sink={n_sink}, window={window}) the slots hold tokens {got}, expected "
            f"{expected}: slot(s) {empty} hold none of the tokens written, and token(s) {gone} are not in the "
            "filled slots"
        )
    if gone:
        raise AssertionError(
            f"after {after} tokens (n_sink={n_sink}, window={window}) the slots hold tokens {got}, expected "
            f"{expected}: token(s) {gone}, among the latest, are gone while older ones stay"
        )
    raise AssertionError(
        f"after {after} tokens (n_sink={n_sink}, window={window}) the slots hold tokens {got}, expected "
        f"{expected}: the right tokens, in other slots than the tokens they pushed out"
    )


@check("8.3")
def sink_cache_keeps_sinks_and_last_window(kv, rng):
    """Check a rolling cache of 2 sinks + a window of 3 over a prefill of 4 tokens then 7 decode steps, slot by slot."""
    n_sink, window = 2, 3
    cache = kv.SinkCache(CONFIG, n_sink, window, batch=B)
    capacity = n_sink + window
    held = {}  # slot -> token, the right answer
    tokens = {}
    steps = [4] + [1] * 7
    for T in steps:
        k_new, v_new = _randn(rng, B, H_KV, T, D), _randn(rng, B, H_KV, T, D)
        for i in range(T):
            p = cache.pos + i
            tokens[p] = (k_new[:, :, i], v_new[:, :, i])
            held[_slot(p, n_sink, window)] = p
        pos = cache.pos
        got = cache.update(1, k_new.clone(), v_new.clone())
        assert cache.pos == pos, (
            f"update moved pos from {pos} to {cache.pos}: advance() moves it, once, after every layer"
        )
        filled = min(pos + T, capacity)
        assert isinstance(got, tuple) and len(got) == 2 and all(isinstance(t, torch.Tensor) for t in got), (
            "update must return (k, v)"
        )
        k, v = got
        assert tuple(k.shape) == (B, H_KV, filled, D), (
            f"after {pos + T} tokens the filled slots are min(pos + seq_len, capacity) = {filled}: expected k of shape "
            f"{(B, H_KV, filled, D)}, got {tuple(k.shape)}"
        )
        expected = [held[s] for s in range(filled)]
        expect_v = torch.stack([tokens[p][1] for p in expected], dim=2)
        got_tokens = _which_tokens(k, tokens)
        _assert_slots(pos + T, got_tokens, expected, n_sink, window)
        assert torch.equal(v, expect_v), (
            f"after {pos + T} tokens the keys are in their slots, the values are not (slots {expected})"
        )
        cache.advance(T)
    assert torch.equal(cache.k[0], torch.zeros_like(cache.k[0])), (
        "update wrote into another layer than the one it was given"
    )


@check("8.3")
def sink_cache_without_sinks_is_a_rolling_buffer(kv, rng):
    """Check n_sink = 0 (Mistral's rolling buffer of 4) over 10 single tokens: the last 4 tokens, in ring slots."""
    cache = kv.SinkCache(CONFIG, 0, 4, batch=B)
    tokens, held = {}, {}
    for p in range(10):
        k_new = _randn(rng, B, H_KV, 1, D)
        tokens[p], held[_slot(p, 0, 4)] = (k_new[:, :, 0], k_new[:, :, 0]), p
        k, _ = cache.update(0, k_new.clone(), k_new.clone())
        cache.advance(1)
        expected = [held[s] for s in range(min(p + 1, 4))]
        assert isinstance(k, torch.Tensor) and tuple(k.shape) == (B, H_KV, len(expected), D), (
            f"window 4, no sinks, after {p + 1} tokens: expected k of shape {(B, H_KV, len(expected), D)}, "
            f"got {_shape_of(k)}"
        )
        got = _which_tokens(k, tokens)
        _assert_slots(p + 1, got, expected, 0, 4)


# ---------------------------------------------------------------------------------------------
# 8.4 cache_positions


def _positions(n_seen: int, n_sink: int, window: int) -> list[int]:
    """Place by age of the token in each slot: simulated slot by slot, the way the ring fills."""
    capacity = n_sink + window
    held = {}
    for p in range(n_seen):
        held[_slot(p, n_sink, window)] = p
    order = sorted(held.values())
    return [order.index(held[s]) for s in range(min(n_seen, capacity))]


@check("8.4")
def cache_positions_count_places_by_age(kv, rng):
    """Check the rotary positions of the slots before, at and long after the cache fills, with 0, 1 and 4 sinks."""
    for n_seen, n_sink, window in (
        (3, 1, 3),
        (4, 1, 3),
        (6, 1, 3),
        (7, 1, 3),
        (100, 4, 7),
        (13, 0, 5),
        (9, 2, 1),
        (40, 4, 16),
    ):
        expected = _positions(n_seen, n_sink, window)
        got = kv.cache_positions(n_seen, n_sink, window)
        assert isinstance(got, torch.Tensor) and not got.dtype.is_floating_point and got.dim() == 1, (
            f"cache_positions must return a 1-D integer tensor, got {_shape_of(got)} {getattr(got, 'dtype', '')}"
        )
        got = got.tolist()
        if got == expected:
            continue
        held = {}
        for p in range(n_seen):
            held[_slot(p, n_sink, window)] = p
        text = [held[s] for s in range(min(n_seen, n_sink + window))]
        where = tr(
            "n_seen={n_seen}, n_sink={n_sink}, window={window}: expected {expected}, got {got}",
            n_seen=n_seen,
            n_sink=n_sink,
            window=window,
            expected=expected,
            got=got,
        )
        if got == text:
            raise AssertionError(
                f"{where}: those are the tokens' positions in the text; StreamingLLM uses places in the "
                "cache, so the model never sees a distance longer than n_sink + window"
            )
        if got == list(range(len(expected))):
            raise AssertionError(
                f"{where}: positions in slot order; once the ring wraps, slots are not in age order: "
                "count from the oldest kept token's slot"
            )
        raise AssertionError(f"{where}: sinks get 0 ... n_sink - 1, then window tokens n_sink ... by age, oldest first")


# ---------------------------------------------------------------------------------------------
# 8.5 and 8.6 MLA

_MLA = dict(H=3, Dn=4, Dr=6, r=7, Dv=5)  # heads, nope_dim, rope_dim, kv_rank, v_dim: all different


def _mla_inputs(rng, T: int, S: int):
    m = _MLA
    return (
        _randn(rng, B, m["H"], T, m["Dn"]),
        _randn(rng, B, m["H"], T, m["Dr"]),
        _randn(rng, B, S, m["r"]),
        _randn(rng, B, S, m["Dr"]),
        _randn(rng, m["H"], m["Dn"], m["r"]) / 2,
        _randn(rng, m["H"], m["Dv"], m["r"]) / 2,
    )


def _mla_expected_and_slips(q_nope, q_rope, latent, k_rope, w_uk, w_uv):
    """Per-head keys and values rebuilt, then float64 attention: the definition, and its slips."""
    d = [t.double() for t in (q_nope, q_rope, latent, k_rope, w_uk, w_uv)]
    q_nope, q_rope, latent, k_rope, w_uk, w_uv = d
    H_ = w_uk.shape[0]
    k_nope = torch.einsum("bsr,hdr->bhsd", latent, w_uk)
    v = torch.einsum("bsr,hdr->bhsd", latent, w_uv)
    k_rope_h = k_rope[:, None].expand(-1, H_, -1, -1)
    q, k = torch.cat([q_nope, q_rope], -1), torch.cat([k_nope, k_rope_h], -1)
    slips = {
        tr("the rotary part is left out of the scores: q_rope and k_rope change nothing"): _attention(
            q_nope, k_nope, v, scale=math.sqrt(q.shape[-1])
        ),
        tr("the scores' scale counts the query's nope part only, not its whole width"): _attention(
            q, k, v, scale=math.sqrt(q_nope.shape[-1])
        ),
        tr("the mask is aligned top-left: the seq_len queries are the LAST of the kv_len positions"): _attention(
            q, k, v, top_left=True
        ),
        tr("the values are rebuilt with w_uk (keys') instead of w_uv"): None
        if w_uk.shape != w_uv.shape
        else _attention(q, k, torch.einsum("bsr,hdr->bhsd", latent, w_uk)),
    }
    return _attention(q, k, v), {m: t for m, t in slips.items() if t is not None}


def _mla_case(fn, rng, T: int, S: int, what: str) -> None:
    args = _mla_inputs(rng, T, S)
    expected, slips = _mla_expected_and_slips(*args)
    got = fn(*(a.clone() for a in args))
    shape = (B, _MLA["H"], T, _MLA["Dv"])
    assert isinstance(got, torch.Tensor) and tuple(got.shape) == shape, (
        f"{what} should return (batch, n_heads, seq_len, v_dim) = {shape}, got {_shape_of(got)}"
    )
    if not _close(got, expected):
        slip = _diagnose(
            got,
            slips,
            tr(
                "the output differs from each head's attention as notebook 08b defines it (its key: the part its w_uk "
                "rebuilds from the latent, then the shared rotary key; its value: what its w_uv rebuilds), by none of "
                "the usual slips"
            ),
        )
        raise AssertionError(f"{what}, {T} queries against {S} cached latents: {slip}")


@check("8.5")
def mla_reconstruct_matches_per_head_attention(kv, rng):
    """Check mla_reconstruct against each head's attention as notebook 08b defines it, in float64: a decode step, a
    short prefill, a whole prompt."""
    for T, S in ((1, 9), (2, 5), (4, 4)):
        _mla_case(kv.mla_reconstruct, rng, T, S, "mla_reconstruct")


@check("8.6")
def mla_absorbed_matches_per_head_attention(kv, rng):
    """Check absorbed MLA against the same float64 attention: a decode step, a short prefill, a whole prompt."""
    for T, S in ((1, 9), (2, 5), (4, 4)):
        _mla_case(kv.mla_absorbed, rng, T, S, "mla_absorbed")


_MLA_BIG = dict(H=32, Dn=64, Dr=16, r=48, Dv=80, S=16_384)  # the measured step: per-head latents alone are 96 MB


def _mla_absorbed_reference(q_nope, q_rope, latent, k_rope, w_uk, w_uv) -> torch.Tensor:
    """One decode query per head in float64, the absorbed way (no per-head keys: the measured case is large)."""
    q_nope, q_rope, latent, k_rope, w_uk, w_uv = (t.double() for t in (q_nope, q_rope, latent, k_rope, w_uk, w_uv))
    scores = torch.einsum("bhtd,hdr,bsr->bhts", q_nope, w_uk, latent) + torch.einsum("bhte,bse->bhts", q_rope, k_rope)
    probs = (scores / math.sqrt(q_nope.shape[-1] + q_rope.shape[-1])).softmax(-1)
    return torch.einsum("bhts,bsr,hdr->bhtd", probs, latent, w_uv)


@check("8.6")
def mla_absorbed_never_builds_per_head_keys(kv, rng):
    """Check that a decode step against many latents builds no per-head keys or values (n_heads x kv_len x head width).

    In the isolated grader the grading process measures the memory the call holds (32 heads, 16,384 latents: a
    copy of the latents for every head is 96 MB, per-head keys and values more); locally every tensor it allocates
    is watched (1 query, 40 latents)."""
    m = _MLA_BIG
    args = (
        _randn(rng, 1, m["H"], 1, m["Dn"]),
        _randn(rng, 1, m["H"], 1, m["Dr"]),
        _randn(rng, 1, m["S"], m["r"]),
        _randn(rng, 1, m["S"], m["Dr"]),
        _randn(rng, m["H"], m["Dn"], m["r"]) / 8,
        _randn(rng, m["H"], m["Dv"], m["r"]) / 8,
    )
    measured = memory_of(kv.mla_absorbed, *(a.clone() for a in args))
    if measured is not None:
        got, usage = measured
        assert _close(got, _mla_absorbed_reference(*args)), (
            f"mla_absorbed, a decode step against {m['S']:,} cached latents: the output differs from MLA attention"
        )
        held_nothing_before(usage, "mla_absorbed")
        values = m["H"] * m["S"] * min(m["Dn"], m["Dv"], m["r"]) * 4  # the smallest per-head tensor of every token
        assert usage.beyond_inputs < values // 2, (
            f"mla_absorbed held {usage.beyond_inputs / MB:.0f} MB beyond its inputs at its peak (the grader measures "
            f"the process's memory) for one query against {m['S']:,} cached latents: per-head keys, values or "
            f"latents for every cached token ({m['H']} heads) take {values / MB:.0f} MB or more, which is what "
            "absorbing avoids (a matmul that broadcasts the latents over the heads makes such a copy too)"
        )
        return
    S = 40
    args = _mla_inputs(rng, 1, S)
    expected, slips = _mla_expected_and_slips(*args)
    got = kv.mla_absorbed(*(a.clone() for a in args))
    if not _close(got, expected):
        slip = _diagnose(got, slips, tr("the output differs from MLA attention"))
        raise AssertionError(f"mla_absorbed, a decode step: {slip}")
    made = new_tensors(kv.mla_absorbed, *(a.clone() for a in args))
    limit = B * _MLA["H"] * S * min(_MLA["Dn"], _MLA["Dv"])  # one head width for every cached token of every head
    per_head = B * _MLA["H"] * S  # a multiple of this many numbers: something for every head and every cached token
    big = [(op, shape) for op, shape in made if math.prod(shape) >= limit and math.prod(shape) % per_head == 0]
    assert not big, (
        f"mla_absorbed made a tensor of {big[0][1]} ({big[0][0]}): per-head keys or values for all {S} cached "
        "tokens, which is what absorbing avoids (a matmul that broadcasts the latents over the heads makes such a "
        "copy too)"
    )


# ---------------------------------------------------------------------------------------------
# 8.8 mla_flops: a prediction, graded against the products 8.5 and 8.6 compute


def _mla_flop_terms(path: str, S: int, T: int, H: int, Dn: int, Dr: int, Dv: int, r: int) -> dict[str, int]:
    """The matrix products of each path, 2 FLOPs per multiply-add, as torch's counter counts them (the reference 8.8
    passes these checks, and tests/test_compress.py holds it to torch.utils.flop_counter on the reference 8.5, 8.6)."""
    if path == "reconstruct":
        return {
            "rebuild keys": 2 * S * r * H * Dn,
            "rebuild values": 2 * S * r * H * Dv,
            "scores": 2 * H * T * S * Dn,
            "rotary scores": 2 * H * T * S * Dr,
            "mix values": 2 * H * T * S * Dv,
        }
    return {
        "absorb queries": 2 * H * T * Dn * r,
        "latent scores": 2 * H * T * S * r,
        "rotary scores": 2 * H * T * S * Dr,
        "mix latents": 2 * H * T * S * r,
        "up-project": 2 * H * T * r * Dv,
    }


def _mla_flop_slips(path: str, S: int, T: int, H: int, Dn: int, Dr: int, Dv: int, r: int) -> dict[str, int]:
    terms = _mla_flop_terms(path, S, T, H, Dn, Dr, Dv, r)
    total = sum(terms.values())
    slips = {
        tr("exactly half: count 2 FLOPs per multiply-add"): total // 2,
        tr("the rotary scores are missing: q_rope against the shared rotary key is a product too"): total
        - terms["rotary scores"],
        tr("that is the {path} path's count", path="absorbed" if path == "reconstruct" else "reconstruct"): sum(
            _mla_flop_terms("absorbed" if path == "reconstruct" else "reconstruct", S, T, H, Dn, Dr, Dv, r).values()
        ),
    }
    if path == "reconstruct":
        slips[tr("the rebuild is counted once per query: it is paid once per call, whatever new_tokens")] = total + (
            T - 1
        ) * (terms["rebuild keys"] + terms["rebuild values"])
        slips[tr("only the keys are rebuilt: every head's values are rebuilt from the latents too")] = (
            total - terms["rebuild values"]
        )
        slips[tr("the rebuild is missing: every head's keys and values come from every latent, every call")] = total - (
            terms["rebuild keys"] + terms["rebuild values"]
        )
    else:
        slips[
            tr(
                "the absorbed scores and mixes are counted nope_dim and v_dim wide: in latent space they are kv_rank "
                "wide"
            )
        ] = total - terms["latent scores"] - terms["mix latents"] + 2 * H * T * S * (Dn + Dv)
        slips[tr("the queries' absorption or the up-projection is missing: each is a product per query and head")] = (
            total - (terms["absorb queries"] + terms["up-project"])
        )
    if T > 1:
        causal = T * S - T * (T - 1) // 2  # scores a causal mask keeps
        per_score = sum(
            v
            for k, v in terms.items()
            if k in ("scores", "rotary scores", "mix values", "latent scores", "mix latents")
        ) // (T * S)
        slips[tr("only the causal half of the scores is counted: the products compute the masked ones too")] = (
            total - per_score * (T * S - causal)
        )
    return slips


def _mla_flops_case(kv, path: str, S: int, T: int, sizes: dict) -> None:
    dims = (S, T, sizes["n_heads"], sizes["nope_dim"], sizes["rope_dim"], sizes["v_dim"], sizes["kv_rank"])
    expected = sum(_mla_flop_terms(path, *dims).values())
    got = kv.mla_flops(path, S, T, **sizes)
    assert isinstance(got, numbers.Real) and not isinstance(got, bool), (
        f"mla_flops should return a number of FLOPs, got {type(got).__name__}"
    )
    if got != expected:
        slip = next((m for m, v in _mla_flop_slips(path, *dims).items() if got == v), None)
        raise AssertionError(
            f"path {path!r}, {T} new token(s) over {S} latents, sizes {sizes}: expected {expected:,} FLOPs, got "
            f"{got:,}" + (f": {slip}" if slip else "")
        )


@check("8.8")
def mla_flops_counts_both_paths(kv, rng):
    """Check the predicted FLOPs of both paths, a decode step and a prefill, on MLA sizes that all differ."""
    sizes = {"n_heads": 3, "nope_dim": 5, "rope_dim": 2, "v_dim": 7, "kv_rank": 11}
    for S, T in ((13, 1), (9, 4), (6, 6), (200, 1)):
        for path in ("reconstruct", "absorbed"):
            _mla_flops_case(kv, path, S, T, sizes)


@check("8.8")
def mla_flops_scale_with_the_sizes(kv, rng):
    """Check the prediction on DeepSeek-V2's sizes and on random ones: each size enters as the products use it."""
    names = ("n_heads", "nope_dim", "rope_dim", "v_dim", "kv_rank")
    cases = [MLA_MODELS["DeepSeek-V2"].sizes()]
    cases += [dict(zip(names, (int(n) for n in rng.integers(2, 40, size=5)))) for _ in range(3)]  # no size-1 product
    for sizes in cases:
        S = int(rng.integers(2, 9000))
        for T in (1, int(rng.integers(2, S + 1))):
            for path in ("reconstruct", "absorbed"):
                _mla_flops_case(kv, path, S, T, sizes)
