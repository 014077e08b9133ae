"""kvlib/recompute.py (notebook 03): analytic FLOPs equal torch's FLOP counter exactly, the
checks name the classic slips, and the waste grows towards 1."""

import types

import numpy as np
import pytest

from kvlib import recompute
from kvlib.checks import CHECKS, checks_for
from kvlib.checks.recompute import ODD
from kvlib.core.model import Decoder, ModelConfig
from kvlib.course.exercises import BY_ID

RECOMPUTE_CHECKS = [c for i in range(1, 4) for c in checks_for(BY_ID[f"3.{i}"])]


@pytest.mark.parametrize("check", RECOMPUTE_CHECKS, ids=lambda c: c.name)
def test_reference_passes_check(check):
    """Check that the reference solution passes every check of notebook 03."""
    check.fn(recompute, np.random.default_rng(0))


@pytest.mark.parametrize("config", [ODD, ModelConfig(vocab_size=100)], ids=["gqa-odd", "tiny-shape"])
def test_forward_flops_equals_flop_counter(config):
    """Check that the analytic count equals torch.utils.flop_counter exactly (the 1% goal, with margin)."""
    model = Decoder(config).eval()
    for T in (1, 16, 40):
        assert recompute.forward_flops(config, T) == recompute.measured_forward_flops(model, T)


def test_naive_decode_flops_sums_growing_forwards():
    """Check that naive step i runs a forward over prompt_len + i tokens, so totals grow ~N^2 to N^3."""
    steps = recompute.naive_decode_flops(ODD, 4, 5)
    assert steps == [recompute.forward_flops(ODD, 4 + i) for i in range(5)]
    assert steps == sorted(steps)


def _flops_without_factor_two(config, seq_len):
    return recompute.forward_flops(config, seq_len) // 2


def _flops_without_attention(config, seq_len):
    C, D, H, H_kv = config.d_model, config.head_dim, config.n_heads, config.n_kv_heads
    layer = C * H * D + 2 * C * H_kv * D + H * D * C + 3 * C * config.hidden_dim
    return 2 * seq_len * (config.n_layers * layer + C * config.vocab_size)


def _flops_mha_assumed(config, seq_len):
    C, D, H = config.d_model, config.head_dim, config.n_heads
    layer = 4 * C * H * D + 3 * C * config.hidden_dim
    return 2 * seq_len * (config.n_layers * layer + C * config.vocab_size) + config.n_layers * 4 * seq_len**2 * D * H


def _prefill_as_one_token(config, prompt_len, max_new_tokens):
    naive, _ = recompute.generation_flops(config, prompt_len, max_new_tokens)
    return naive, sum(recompute.new_token_flops(config, prompt_len + i) for i in range(max_new_tokens))


MISTAKES = [
    ("forward_flops_matches_torch_counter", {"forward_flops": _flops_without_factor_two}, "2 FLOPs per multiply-add"),
    ("forward_flops_matches_torch_counter", {"forward_flops": _flops_without_attention}, "attention term is missing"),
    ("forward_flops_matches_torch_counter", {"forward_flops": _flops_mha_assumed}, "n_kv_heads heads"),
    ("generation_flops_matches_counts", {"generation_flops": _prefill_as_one_token}, "counted as one new token"),
]


@pytest.mark.parametrize(
    "name, fake, words", MISTAKES, ids=[f"{m[0]}-{next(iter(m[1].values())).__name__}" for m in MISTAKES]
)
def test_check_names_the_known_mistake(name, fake, words):
    """Check that a deliberately wrong implementation fails the check with a message naming the mistake."""
    module = types.SimpleNamespace(
        **{n: getattr(recompute, n) for n in ("forward_flops", "new_token_flops", "generation_flops")}
    )
    for key, fn in fake.items():
        setattr(module, key, fn)
    with pytest.raises(AssertionError) as info:
        CHECKS[name].fn(module, np.random.default_rng(0))
    assert words in str(info.value)


def test_bad_config_is_a_clear_error():
    """Check that passing something other than a ModelConfig, or a zero length, names the problem."""
    with pytest.raises(ValueError, match="must be a kvlib ModelConfig"):
        recompute.forward_flops({"d_model": 4}, 3)
    with pytest.raises(ValueError, match="positive ints, got 0"):
        recompute.generation_flops(ODD, 3, 0)
