"""Checks for notebook 03 (kvlib/recompute.py): exercises 3.1-3.3.

The FLOP count is checked against torch's own FLOP counter on models whose every size differs
(so a swapped or missing factor shows), and the known slips are named: the factor 2 of a
multiply-add, the lm_head, the attention term, the key/value heads of GQA.
"""
from __future__ import annotations

from kvlib.checks import check
from kvlib.core.model import Decoder, ModelConfig

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
        expected // 2: "exactly half: count 2 FLOPs per multiply-add",
        proj: "the attention term is missing: q @ k^T and probs @ v cost 2 * T * T * head_dim each, per head and layer",
        expected - 2 * T * head: "the lm_head (d_model x vocab_size, for every position) is missing",
        2 * T * (L * mha_layer + head) + attn: "k and v have n_kv_heads heads, not n_heads (this config is GQA)",
        2 * T * L * layer + attn: "the lm_head (d_model x vocab_size, for every position) is missing",
        proj + attn // 2: "attention counted once: both q @ k^T and probs @ v cost 2 * T * S * head_dim per head",
        proj + L * 2 * T * (T + 1) * D * H: "attention counted over the causal half only: SDPA computes the full (T, S) matrix",
    }
    return hints.get(got, f"expected {expected:,} FLOPs, got {got:,}")


@check("3.1")
def forward_flops_matches_torch_counter(kv, rng):
    """Check that forward_flops equals torch.utils.flop_counter on a GQA model with distinct sizes."""
    from kvlib.recompute import measured_forward_flops

    model = Decoder(ODD).eval()
    for T in (1, 5, 17):
        expected = measured_forward_flops(model, T)
        got = kv.forward_flops(ODD, T)
        assert isinstance(got, int), f"forward_flops should return an int, got {type(got).__name__}"
        assert got == expected, f"seq_len {T}: {_diagnose(got, ODD, T, expected)}"


@check("3.1")
def forward_flops_grows_quadratically(kv, rng):
    """Check that the work per forward has a part linear and a part quadratic in seq_len."""
    f = [kv.forward_flops(ODD, T) for T in (10, 20, 30)]
    second_difference = f[2] - 2 * f[1] + f[0]
    assert second_difference > 0, "the attention work grows with seq_len squared: the count should curve upward"
    layer, head = _terms(ODD)
    assert f[1] - f[0] > 2 * 10 * (ODD.n_layers * layer + head) - 1, "each extra token adds at least its projections"


@check("3.2")
def new_token_flops_matches_torch_counter(kv, rng):
    """Check new_token_flops against torch's counter: last-token projections plus one query over kv_len keys."""
    from kvlib.recompute import measured_forward_flops

    model = Decoder(ODD).eval()
    layer, head = _terms(ODD)
    for S in (1, 9, 40):
        got = kv.new_token_flops(ODD, S)
        one = measured_forward_flops(model, 1)  # projections + lm_head of one token, and its 1 x 1 attention
        expected = one + ODD.n_layers * 4 * (S - 1) * ODD.head_dim * ODD.n_heads
        assert isinstance(got, int), f"new_token_flops should return an int, got {type(got).__name__}"
        if got == one and S > 1:
            raise AssertionError("the new query must still meet all kv_len keys: attention costs 4 * kv_len * head_dim per head")
        assert got == expected, f"kv_len {S}: expected {expected:,} FLOPs, got {got:,}"


@check("3.3")
def wasted_fraction_matches_counts(kv, rng):
    """Check the wasted share at several lengths, and that it is 0 for the first token."""
    layer, head = _terms(ODD)
    for S in (1, 8, 60):
        got = kv.wasted_fraction(ODD, S)
        assert isinstance(got, float), f"wasted_fraction should return a float, got {type(got).__name__}"
        full = 2 * S * (ODD.n_layers * layer + head) + ODD.n_layers * 4 * S * S * ODD.head_dim * ODD.n_heads
        needed = 2 * (ODD.n_layers * layer + head) + ODD.n_layers * 4 * S * ODD.head_dim * ODD.n_heads
        if abs(got - needed / full) < 1e-9 and abs(needed / full - 0.5) > 1e-9:  # useful share, not wasted
            raise AssertionError("that is the useful share: the wasted fraction is 1 - needed / total")
        assert abs(got - (1 - needed / full)) < 1e-9, f"at kv_len {S} the wasted fraction should be {1 - needed / full:.4f}, got {got:.4f}"


@check("3.3")
def wasted_fraction_approaches_one(kv, rng):
    """Check that the waste grows with length and approaches 1 (at 60 tokens, over 95%)."""
    values = [kv.wasted_fraction(ODD, S) for S in (2, 10, 60)]
    assert values == sorted(values), f"the wasted share should grow with length, got {values}"
    assert values[-1] > 0.95, f"after 60 tokens nearly all of a naive step repeats earlier work, got {values[-1]:.3f}"
