"""kvlib/recompute.py (notebook 03): analytic FLOPs equal torch's FLOP counter exactly, the waste grows towards 1,
and the length at which attention takes half (3.4's prediction) is where torch's counter finds it.

Each exercise's check tests live here under three names, built with conftest.handed_in: ALTERNATIVES
(correct implementations in another shape, which pass every check of their exercise), SLIPS (likely
wrong ones, which fail the check or exercise named, with a message naming the slip), and a
function that changes its arguments (conftest.vandal) scores 0."""

import math
from dataclasses import replace
from fractions import Fraction

import numpy as np
import pytest
from conftest import assert_slip_named, case_ids, check_failures, handed_in, spoil_everything, vandal

from kvlib import recompute
from kvlib.checks import checks_for
from kvlib.checks.recompute import ODD
from kvlib.core.model import Decoder, ModelConfig, matrix_params
from kvlib.course.exercises import BY_ID, reference

IDS = ["3.1", "3.2", "3.3", "3.4"]
RECOMPUTE_CHECKS = [c for ex_id in IDS for c in checks_for(BY_ID[ex_id])]


def _matrices(config):  # the matrices one token meets, listed by hand (kvlib's matrix_params is refused in 3.x)
    C, D = config.d_model, config.head_dim
    per_layer = C * config.n_heads * D * 2 + C * config.n_kv_heads * D * 2 + 3 * C * config.hidden_dim
    return config.n_layers * per_layer + C * config.vocab_size


@pytest.mark.parametrize("check", RECOMPUTE_CHECKS, ids=lambda c: c.name)
def test_reference_passes_check(check):
    """Check that the reference solution passes every check of notebook 03."""
    check.fn(recompute, np.random.default_rng(0))


@pytest.mark.parametrize("config", [ODD, ModelConfig(vocab_size=100)], ids=["gqa-odd", "tiny-shape"])
def test_forward_flops_equals_flop_counter(config):
    """Check that the analytic count equals what torch.utils.flop_counter counts exactly (the 1% goal, with margin),
    and that torch's counter finds attention under half one token before the predicted length (3.4), half at it."""
    model = Decoder(config).eval()
    for T in (1, 16, 40):
        assert recompute.forward_flops(config, T) == recompute.measured_forward_flops(model, T)
    n = recompute.attention_half_length(config)
    longer = Decoder(replace(config, max_seq_len=n)).eval()
    assert recompute.measured_attention_share(longer, n - 1) < 0.5 <= recompute.measured_attention_share(longer, n)


NAMES = (
    "forward_flops",
    "new_token_flops",
    "generation_flops",
    "attention_half_length",
    "measured_forward_flops",
    "measured_attention_share",
)


def _module(**replaced):
    """What a learner hands in: kvlib.recompute (the reference, in reference mode) with some functions replaced."""
    return handed_in(recompute, NAMES, **replaced)


# ---------------------------------------------------------------------------------------------
# Other correct implementations (ALTERNATIVES) pass every check of their exercise


# 3.1-3.3 -------------------------------------------------------------------------------------
def forward_flops_loop(config, seq_len):
    total, T, D = 0, seq_len, config.head_dim
    for _ in range(config.n_layers):
        for m, n in (
            (config.d_model, config.n_heads * D),
            (config.d_model, config.n_kv_heads * D),
            (config.d_model, config.n_kv_heads * D),
            (config.n_heads * D, config.d_model),
            (config.d_model, config.hidden_dim),
            (config.d_model, config.hidden_dim),
            (config.hidden_dim, config.d_model),
        ):
            total += 2 * T * m * n
        for _ in range(config.n_heads):
            total += 2 * T * T * D + 2 * T * T * D
    return total + 2 * T * config.d_model * config.vocab_size


def forward_flops_matrix_params(config, seq_len):
    return 2 * seq_len * _matrices(config) + 4 * config.n_layers * config.n_heads * config.head_dim * seq_len**2


def forward_flops_float(config, seq_len):
    per_token = 2.0 * _matrices(config)
    return int(round(seq_len * per_token + 4.0 * seq_len * seq_len * config.n_layers * config.d_model))


def new_token_one_plus(config, kv_len):
    return reference(BY_ID["3.1"])(config, 1) + 4 * config.n_layers * config.n_heads * config.head_dim * (kv_len - 1)


def new_token_matrix_params(config, kv_len):
    return 2 * _matrices(config) + 2 * 2 * kv_len * config.head_dim * config.n_heads * config.n_layers


def new_token_difference(config, kv_len):
    f = reference(BY_ID["3.1"])
    quadratic = (f(config, 2) - 2 * f(config, 1)) // 2  # c, the t^2 coefficient of forward_flops: 4 * L * H * D
    return f(config, 1) + quadratic * (kv_len - 1)  # one query against kv_len - 1 more keys


def generation_loop(config, prompt_len, max_new_tokens):
    f, g = reference(BY_ID["3.1"]), reference(BY_ID["3.2"])
    naive = kept = 0
    length = prompt_len
    for step in range(max_new_tokens):
        naive += f(config, length)
        kept += f(config, length) if step == 0 else g(config, length)
        length += 1
    return naive, kept


def _naive_steps(config, prompt_len, max_new_tokens):  # the learner's own helper: each naive step's FLOPs
    return [reference(BY_ID["3.1"])(config, prompt_len + i) for i in range(max_new_tokens)]


def generation_helper(config, prompt_len, max_new_tokens):
    g = reference(BY_ID["3.2"])
    kept = reference(BY_ID["3.1"])(config, prompt_len) + sum(
        g(config, s) for s in range(prompt_len + 1, prompt_len + max_new_tokens)
    )
    return sum(_naive_steps(config, prompt_len, max_new_tokens)), kept


def generation_numpy(config, prompt_len, max_new_tokens):
    f, g = reference(BY_ID["3.1"]), reference(BY_ID["3.2"])
    lengths = np.arange(prompt_len, prompt_len + max_new_tokens)
    naive = int(np.sum([f(config, int(n)) for n in lengths], dtype=np.int64))
    kept = int(f(config, prompt_len) + np.sum([g(config, int(n)) for n in lengths[1:]], dtype=np.int64))
    return naive, kept


def half_from_differences(config):
    f = reference(BY_ID["3.1"])
    quadratic = (f(config, 2) - 2 * f(config, 1)) // 2  # attention's coefficient of seq_len^2
    linear = f(config, 1) - quadratic  # the rest's coefficient of seq_len
    return max(1, math.ceil(linear / quadratic))  # quadratic T^2 >= linear T: a float ceil, then int


def half_closed_form(config):
    c = 4 * config.n_layers * config.n_heads * config.head_dim
    return max(1, -(-2 * _matrices(config) // c))  # c T^2 >= 2 T matrix_params: no call of 3.1 at all


def half_of_a_kept_step(config):
    g = reference(BY_ID["3.2"])  # a kept step over T keys: a + c * T, attention's share the same as a forward's
    c, T = g(config, 2) - g(config, 1), 1
    while 2 * c * T < g(config, T):  # a search, one token at a time
        T += 1
    return np.int64(T)  # a numpy integer is an int number of tokens too


ALTERNATIVES = [
    ("3.1", {"forward_flops": forward_flops_loop}),
    ("3.1", {"forward_flops": forward_flops_matrix_params}),
    ("3.1", {"forward_flops": forward_flops_float}),
    ("3.2", {"new_token_flops": new_token_one_plus}),
    ("3.2", {"new_token_flops": new_token_matrix_params}),
    ("3.2", {"new_token_flops": new_token_difference}),
    ("3.3", {"generation_flops": generation_loop}),
    ("3.3", {"generation_flops": generation_helper}),
    ("3.3", {"generation_flops": generation_numpy}),
    ("3.4", {"attention_half_length": half_from_differences}),
    ("3.4", {"attention_half_length": half_closed_form}),
    ("3.4", {"attention_half_length": half_of_a_kept_step}),
]


@pytest.mark.parametrize("ex_id, replaced", ALTERNATIVES, ids=case_ids(ALTERNATIVES))
def test_alternative_passes_every_check(ex_id, replaced):
    """Check that another correct way of writing the exercise passes every one of its checks."""
    with np.errstate(all="ignore"):
        assert not check_failures(ex_id, _module(**replaced))


def test_every_exercise_has_three_alternatives():
    """Check that ALTERNATIVES covers each exercise of notebook 03 three times or more."""
    counts = {ex_id: sum(c[0] == ex_id for c in ALTERNATIVES) for ex_id in IDS}
    assert all(n >= 3 for n in counts.values()), counts


# ---------------------------------------------------------------------------------------------
# Likely slips (SLIPS) fail their check, or their exercise's checks, with a message naming them


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


def _prefill_as_single_tokens(config, prompt_len, max_new_tokens):
    naive, _ = recompute.generation_flops(config, prompt_len, max_new_tokens)
    prefill = sum(recompute.new_token_flops(config, p) for p in range(1, prompt_len + 1))  # one token at a time
    return naive, prefill + sum(recompute.new_token_flops(config, prompt_len + i) for i in range(1, max_new_tokens))


# 3.1
def forward_no_factor_two(config, seq_len):
    return reference(BY_ID["3.1"])(config, seq_len) // 2


def forward_no_lm_head(config, seq_len):
    return reference(BY_ID["3.1"])(config, seq_len) - 2 * seq_len * config.d_model * config.vocab_size


def forward_causal_half(config, seq_len):
    T, L, D, H = seq_len, config.n_layers, config.head_dim, config.n_heads
    return reference(BY_ID["3.1"])(config, T) - L * 4 * T * T * D * H + L * 2 * T * (T + 1) * D * H


def forward_attention_per_kv_head(config, seq_len):
    T, L, D = seq_len, config.n_layers, config.head_dim
    return reference(BY_ID["3.1"])(config, T) - L * 4 * T * T * D * (config.n_heads - config.n_kv_heads)


def forward_mha_assumed(config, seq_len):
    return forward_flops_matrix_params(ModelConfig(**{**config.to_dict(), "n_kv_heads": config.n_heads}), seq_len)


# 3.2
def new_token_constant(config, kv_len):
    return reference(BY_ID["3.1"])(config, 1)


def new_token_attention_once(config, kv_len):
    return reference(BY_ID["3.2"])(config, kv_len) - config.n_layers * 2 * kv_len * config.head_dim * config.n_heads


def new_token_kv_heads(config, kv_len):
    return reference(BY_ID["3.2"])(config, kv_len) - config.n_layers * 4 * kv_len * config.head_dim * (
        config.n_heads - config.n_kv_heads
    )


def new_token_all_queries(config, kv_len):
    return (
        reference(BY_ID["3.1"])(config, 1)
        + config.n_layers * 4 * (kv_len * kv_len - 1) * config.head_dim * config.n_heads
    )


# 3.3
def _gen(config, prompt_len, n, *, prefill="forward", shift=0, naive_shift=0, swap=False):
    f, g = reference(BY_ID["3.1"]), reference(BY_ID["3.2"])
    naive = sum(f(config, prompt_len + i + naive_shift) for i in range(n))
    first = {"forward": f(config, prompt_len), "one token": g(config, prompt_len), "none": 0}[prefill]
    kept = first + sum(g(config, prompt_len + i + shift) for i in range(1, n))
    return (kept, naive) if swap else (naive, kept)


# 3.4
def _half(config, attention_heads=None, products=2, causal=False, total="own", lm_head=True, kv_heads=None, **how):
    """The first T whose attention share, counted with the slips named, is at least (strict: more than) one half;
    below: one token before it; as_float: where the two parts meet, unrounded. A bisection on exact fractions."""
    L, D, C = config.n_layers, config.head_dim, config.d_model
    H, H_kv = attention_heads or config.n_heads, kv_heads or config.n_kv_heads
    layer = C * config.n_heads * D + 2 * C * H_kv * D + config.n_heads * D * C + 3 * C * config.hidden_dim
    rest_per_token = 2 * (L * layer + (C * config.vocab_size if lm_head else 0))

    def share(T):
        attention = L * products * 2 * (T * (T + 1) // 2 if causal else T * T) * D * H
        return Fraction(attention, {"own": T * rest_per_token + attention, "rest": T * rest_per_token}[total])

    if how.get("as_float"):
        return rest_per_token / (4 * L * H * D)
    lo, hi = 1, 1 << 24
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (
            (lo, mid)
            if (share(mid) > Fraction(1, 2) if how.get("strict") else share(mid) >= Fraction(1, 2))
            else (mid + 1, hi)
        )
    return lo - 1 if how.get("below") else lo


# (check or exercise, replaced functions, words the failure must contain)
SLIPS = [
    ("forward_flops_matches_torch_counter", {"forward_flops": _flops_without_factor_two}, "2 FLOPs per multiply-add"),
    ("forward_flops_matches_torch_counter", {"forward_flops": _flops_without_attention}, "attention term is missing"),
    ("forward_flops_matches_torch_counter", {"forward_flops": _flops_mha_assumed}, "projections are counted too large"),
    ("generation_flops_matches_counts", {"generation_flops": _prefill_as_one_token}, "counted as one new token"),
    ("3.1", {"forward_flops": forward_no_factor_two}, "2 FLOPs per multiply-add"),
    ("3.1", {"forward_flops": forward_no_lm_head}, "lm_head"),
    ("3.1", {"forward_flops": forward_causal_half}, "causal half"),
    ("3.1", {"forward_flops": forward_mha_assumed}, "k and v projections are counted too large"),
    ("3.1", {"forward_flops": forward_attention_per_kv_head}, "two products are counted too small for this GQA"),
    ("3.2", {"new_token_flops": new_token_constant}, "did not grow with kv_len"),
    ("3.2", {"new_token_flops": new_token_attention_once}, "attention counted once"),
    ("3.2", {"new_token_flops": new_token_kv_heads}, "counted too small for this GQA"),
    ("3.2", {"new_token_flops": new_token_all_queries}, "counted for kv_len queries"),
    (
        "3.3",
        {"generation_flops": lambda c, p, n: _gen(c, p, n, prefill="one token")},
        "the prefill is counted as one new token",
    ),
    ("3.3", {"generation_flops": lambda c, p, n: _gen(c, p, n, shift=-1)}, "one key short"),
    ("3.3", {"generation_flops": lambda c, p, n: _gen(c, p, n, shift=1)}, "one key too many"),
    (
        "3.3",
        {"generation_flops": lambda c, p, n: _gen(c, p, n, naive_shift=1)},
        "one token too many at every naive step",
    ),
    ("3.3", {"generation_flops": lambda c, p, n: _gen(c, p, n, prefill="none")}, "the prefill is missing"),
    ("3.3", {"generation_flops": lambda c, p, n: _gen(c, p, n, swap=True)}, "wrong way round"),
    ("generation_flops_matches_counts", {"generation_flops": _prefill_as_single_tokens}, "prompt_len single tokens"),
    ("3.4", {"attention_half_length": lambda c: _half(c, causal=True)}, "causal half only"),
    ("3.4", {"attention_half_length": lambda c: _half(c, attention_heads=c.n_kv_heads)}, "for n_kv_heads heads"),
    ("3.4", {"attention_half_length": lambda c: _half(c, kv_heads=c.n_heads)}, "projections counted for n_heads"),
    ("3.4", {"attention_half_length": lambda c: _half(c, total="rest")}, "half of the rest"),
    ("3.4", {"attention_half_length": lambda c: _half(c, products=1)}, "only one of attention's two products"),
    ("3.4", {"attention_half_length": lambda c: _half(c, lm_head=False)}, "the lm_head left out"),
    ("3.4", {"attention_half_length": lambda c: _half(c, below=True)}, "the last length below one half"),
    ("3.4", {"attention_half_length": lambda c: _half(c, strict=True)}, "exactly half there"),
    ("3.4", {"attention_half_length": lambda c: _half(c, as_float=True)}, "should return an int"),
    ("3.4", {"attention_half_length": lambda c: 691}, "expected attention to reach half"),
]


@pytest.mark.parametrize("where, replaced, words", SLIPS, ids=case_ids(SLIPS))
def test_slip_is_rejected_naming_it(where, replaced, words):
    """Check that a likely wrong implementation fails the check named (with an AssertionError), or the exercise
    named (its first failing check, as `kvlib check` reports it), with a message that names the slip."""
    assert_slip_named(where, _module(**replaced), words)


def test_every_exercise_has_three_slips():
    """Check that SLIPS holds three or more likely slips for each exercise of notebook 03."""
    counts = {ex_id: sum(c[0] == ex_id for c in SLIPS) for ex_id in IDS}
    assert all(n >= 3 for n in counts.values()), counts


# ---------------------------------------------------------------------------------------------
# kvlib's ready-made answers (torch's count of a model built for the config) fail every check of their exercise


def _forward_measured(config, seq_len):  # the route the docstring's example once showed
    return recompute.measured_forward_flops(Decoder(config), seq_len)


def _forward_measured_on_meta(config, seq_len):  # the same model made on the meta device: no memory, no weights
    import torch

    with torch.device("meta"):
        model = Decoder(config)
    return recompute.measured_forward_flops(model, seq_len)


def _new_token_measured(config, kv_len):
    more = config.n_layers * 4 * (kv_len - 1) * config.head_dim * config.n_heads
    return recompute.measured_forward_flops(Decoder(config), 1) + more


def _generation_measured(config, prompt_len, max_new_tokens):
    naive = sum(_forward_measured(config, prompt_len + i) for i in range(max_new_tokens))
    return naive, _forward_measured(config, prompt_len) + sum(
        _new_token_measured(config, prompt_len + i) for i in range(1, max_new_tokens)
    )


READY_MADE = [
    ("3.1", {"forward_flops": _forward_measured}, "forward_flops (or a function it calls) built a model"),
    ("3.1", {"forward_flops": _forward_measured_on_meta}, "built a model"),
    (
        "3.1",  # every projection and MLP matrix from the model's own list, attention's two products added
        {"forward_flops": lambda c, t: 2 * t * matrix_params(c) + 4 * c.n_layers * c.n_heads * c.head_dim * t * t},
        "took the model's own list of its matrices",
    ),
    ("3.2", {"new_token_flops": _new_token_measured}, "built a model"),
    ("3.3", {"generation_flops": _generation_measured}, "generation_flops (or a function it calls) built a model"),
    (
        "3.4",
        {"attention_half_length": lambda c: recompute.measured_attention_share(Decoder(c), 1) and 1},
        "built a model",
    ),
]


@pytest.mark.parametrize("ex_id, replaced, words", READY_MADE, ids=case_ids(READY_MADE))
def test_torchs_count_of_a_model_fails_every_check_naming_it(ex_id, replaced, words):
    """Check that an exercise answered by measuring (a model built for the config and torch's FLOP counter run on it:
    kvlib.course.exercises.READY_MADE) fails every check of the exercise, each naming what it did."""
    failures = check_failures(ex_id, _module(**replaced))
    assert [name for name, _ in failures] == [c.name for c in checks_for(BY_ID[ex_id])], failures
    assert all(words in str(err) and "count from the config's sizes" in str(err).lower() for _, err in failures)


# ---------------------------------------------------------------------------------------------
# A function that vandalises its arguments scores 0 on every check


VANDAL_CHECKS = [c for ex_id in IDS for c in checks_for(BY_ID[ex_id])]


@pytest.mark.parametrize("check", VANDAL_CHECKS, ids=lambda c: c.name)
def test_a_function_that_changes_its_arguments_scores_zero(check):
    """Check that zeroing the arrays, tensors, weights or config a check passes cannot make it expect the wrong answer."""
    ex = check.exercise
    module = _module(**{ex.name: vandal(reference(ex), spoil_everything)})
    with np.errstate(all="ignore"), pytest.raises(Exception):  # noqa: B017 - any failure is a score of 0
        check.fn(module, np.random.default_rng(0))


def test_bad_config_is_a_clear_error():
    """Check that passing something other than a ModelConfig, or a zero length, names the problem."""
    with pytest.raises(ValueError, match="must be a kvlib ModelConfig"):
        recompute.forward_flops({"d_model": 4}, 3)
    with pytest.raises(ValueError, match="positive ints, got 0"):
        recompute.generation_flops(ODD, 3, 0)


def test_aten_calls_counts_each_operator_once_at_dispatch_level():
    """Check that aten_calls sees a linear as one call (not its inner mm) and counts repeats of an operator."""
    import torch

    from kvlib.measure.ops import aten_calls

    layer, x = torch.nn.Linear(4, 3), torch.ones(2, 4)
    calls = aten_calls(lambda: torch.relu(layer(x)) + layer(x))
    assert calls == {"linear": 2, "relu": 1, "add": 1}, calls


def test_counting_never_imports_torch_dynamo():
    """Check that counting FLOPs, allocations and aten calls leaves torch._dynamo unimported (torch's wrap of every
    dispatch mode imports it, 2.5-3 s a grading child), and that each count is still made."""
    import subprocess
    import sys

    script = """
import sys, torch
from kvlib.core.flops import matmul_flops
from kvlib.measure.ops import aten_calls
from kvlib.measure.timing import new_tensors
a = torch.ones(4, 8)
assert matmul_flops(torch.mm, a, a.T) == 2 * 4 * 8 * 4
assert aten_calls(torch.mm, a, a.T) == {"mm": 1}
assert new_tensors(lambda: a.T.contiguous()) == [("clone", (8, 4))]
assert "torch._dynamo" not in sys.modules, "a count imported torch._dynamo"
print("ok")
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
