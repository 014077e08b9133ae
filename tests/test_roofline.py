"""kvlib/roofline.py, kvlib/core/configs.py and kvlib/core/devices.py (notebook 05): the calculators
against published figures, the device table's ridge points, learner mode, and `kvlib bench memory` end
to end (never an assertion on speed).

Each exercise's check tests live here under three names, built with conftest.handed_in: ALTERNATIVES
(correct implementations in another shape, which pass every check of their exercise), SLIPS (likely
wrong ones, which fail the check or exercise named, with a message naming the slip), and a
function that changes its arguments (conftest.vandal) scores 0."""

import json
import math
import statistics
import types
from fractions import Fraction

import numpy as np
import pytest
import torch
from conftest import (
    case_ids,
    check_failures,
    checks_in_child,
    handed_in,
    run_kvlib,
    spoil_config_tensors_models,
    vandal,
)

from kvlib import roofline
from kvlib.checks import CHECKS, checks_for, run_exercise
from kvlib.core.configs import REAL_MODELS, memory_bound_config, real_model
from kvlib.core.devices import DEVICES
from kvlib.core.model import Decoder, ModelConfig, matrix_params, num_params
from kvlib.course.exercises import BY_ID
from kvlib.kv_cache import kv_cache_bytes
from kvlib.measure import machine
from kvlib.measure.machine import roofline_time

ROOFLINE_CHECKS = [c for i in range(1, 6) for c in checks_for(BY_ID[f"5.{i}"])]
F16 = torch.float16


@pytest.mark.parametrize("check", ROOFLINE_CHECKS, ids=lambda c: c.name)
def test_reference_passes_check(check):
    """Check that the reference solution passes every check of notebook 05."""
    check.fn(roofline, np.random.default_rng(0))


def test_learner_stubs_are_todo(learner_mode):
    """Check that in learner mode every 5.x exercise reports todo, naming the exercise, but 5.3 (find and fix), whose
    shipped body runs and, with notebook 04's 4.4 not done, names that exercise first."""
    for i in (1, 2, 4, 5):
        result = run_exercise(BY_ID[f"5.{i}"])
        assert result.status == "todo" and BY_ID[f"5.{i}"].name in result.message, result
    result = run_exercise(BY_ID["5.3"])
    assert result.status == "todo" and "do Exercise 4.4" in result.message, result


def test_shipped_step_cost_fails_showing_the_symptom_not_the_cause():
    """Check that Exercise 5.3's shipped body (the released stub's, a find-and-fix: every sequence of the batch
    reads the weights again) is right at batch 1 and in its FLOPs, yet fails every check of its bytes with the
    symptom (bytes more than the step must bring, FLOPs per byte that stay put at batch 64), never the cause or the
    fix (no "once", "shared", "times over", "do not multiply")."""
    shipped = roofline.step_cost.__wrapped__  # the stub's own body, its 4.4 the reference's (reference mode)
    assert (
        shipped.__code__.co_filename.endswith("kvlib/roofline.py") and "solutions" not in shipped.__code__.co_filename
    )
    c = real_model("Llama-2-7B").config
    assert shipped(c, 1, 1, 1, torch.float16) == roofline.step_cost(c, 1, 1, 1, torch.float16)  # batch 1: right
    failures = dict(check_failures("5.3", _module(step_cost=shipped)))
    assert set(failures) == {"step_cost_bytes_are_what_the_step_must_bring", "step_cost_decode_is_memory_bound"}, (
        failures
    )
    assert "more than the step must bring from memory" in str(failures["step_cost_bytes_are_what_the_step_must_bring"])
    assert "~64 FLOPs per byte" in str(failures["step_cost_decode_is_memory_bound"])
    assert "1.00 FLOPs per byte" in str(failures["step_cost_decode_is_memory_bound"])
    for name, err in failures.items():
        for cause in ("once", "shared", "times over", "multiply", "matrix_params", "kv_cache_bytes("):
            assert cause not in str(err), (name, cause, err)


# ---------------------------------------------------------------------------------------------
# Published figures: model configs (config.json on each model's page) and NVIDIA datasheets

KIB_PER_TOKEN = {
    "GPT-2 small": 36,
    "Llama-2-7B": 512,
    "Llama-3-8B": 128,
    "Mistral-7B": 128,
    "Llama-2-70B": 320,
    "Llama-3-70B": 320,
    "Qwen2.5-7B": 56,
    "Falcon-7B": 8,
}
# published parameter counts (model cards / transformers' num_parameters), to 3 significant figures
PARAMS_B = {
    "GPT-2 small": 0.124,
    "Llama-2-7B": 6.74,
    "Llama-2-70B": 69.0,
    "Llama-3-8B": 8.03,
    "Llama-3-70B": 70.6,
    "Mistral-7B": 7.24,
    "Qwen2.5-7B": 7.62,
    "Falcon-7B": 6.92,
}


@pytest.mark.parametrize("name", list(KIB_PER_TOKEN))
def test_kv_bytes_per_token_of_real_models(name):
    """Check that the KV cache per token in fp16 of each real configuration matches its published config."""
    assert kv_cache_bytes(REAL_MODELS[name].config, 1, 1, F16) == KIB_PER_TOKEN[name] * 1024


@pytest.mark.parametrize("name", list(PARAMS_B))
def test_parameter_counts_match_published(name):
    """Check that each configuration's parameter count matches the published one (to 0.5%)."""
    assert REAL_MODELS[name].params / 1e9 == pytest.approx(PARAMS_B[name], rel=5e-3)


def test_gpt2_and_falcon_counts_are_exact():
    """Check that the two non-Llama models' counts equal the figures transformers reports, exactly."""
    assert REAL_MODELS["GPT-2 small"].params == 124_439_808
    assert REAL_MODELS["Falcon-7B"].params == 6_921_720_704
    assert num_params(REAL_MODELS["Llama-2-7B"].config) == 6_738_415_616  # Llama-2-7b-hf num_parameters()


def test_unknown_real_model_lists_the_names():
    """Check that an unknown real model's name is a clear error listing the known names."""
    with pytest.raises(ValueError, match="known: GPT-2 small, Llama-2-7B"):
        real_model("Llama-9")


RIDGES = {  # device: (ridge FP32, ridge 16-bit), the datasheets' dense figures
    "T4": (25, 203),
    "L4": (101, 403),
    "A100 40GB SXM": (12.5, 201),
    "A100 80GB PCIe": (10.1, 161),
    "A100 80GB SXM": (9.6, 153),
    "H100 SXM": (20, 295),
    "H100 PCIe": (25.5, 378),
    "H200 SXM": (14, 206),
    "RTX 4090": (82, 164),
}


@pytest.mark.parametrize("name", list(RIDGES))
def test_device_ridge_points(name):
    """Check that each device's FP32 and 16-bit ridge matches the datasheets' dense figures (to 2%)."""
    d = DEVICES[name]
    fp32, tensor = RIDGES[name]
    assert d.ridge(torch.float32) == pytest.approx(fp32, rel=0.02)
    assert d.ridge(torch.bfloat16) == pytest.approx(tensor, rel=0.02)


def test_llama2_7b_cache_matches_weights_at_26k_and_1_6k():
    """Check that Llama-2-7B's cache equals its 13.5 GB of weights at ~26k tokens (batch 1) and ~1.6k (batch 16)."""
    m = REAL_MODELS["Llama-2-7B"]
    assert m.weight_bytes(2) / 1e9 == pytest.approx(13.5, rel=0.01)
    assert m.weight_bytes(2) / kv_cache_bytes(m.config, 1, 1) == pytest.approx(26_000, rel=0.02)
    assert m.weight_bytes(2) / kv_cache_bytes(m.config, 1, 16) == pytest.approx(1_600, rel=0.02)


def test_mistral_caches_at_most_its_sliding_window():
    """Check that Mistral-7B keeps 4,096 tokens (its sliding window) whatever the context, the others their whole context."""
    mistral, llama = REAL_MODELS["Mistral-7B"], REAL_MODELS["Llama-3-8B"]
    assert mistral.sliding_window == 4096 and mistral.cached_tokens(32768) == 4096 and mistral.cached_tokens(100) == 100
    assert llama.sliding_window is None and llama.cached_tokens(8192) == 8192
    with pytest.raises(ValueError, match="context of 8,192 tokens"):
        llama.cached_tokens(8193)


def test_ridge_batch_on_published_devices():
    """Check that a 4096 x 4096 fp16 layer needs ~345 rows to reach the ridge on an H100, ~166 on an A100 80GB
    SXM."""
    for name, rows in (("H100 SXM", 345), ("A100 80GB SXM", 166)):
        d = DEVICES[name]
        assert roofline.ridge_batch(4096, 4096, d.tensor16_flops, d.bandwidth) == rows
    assert roofline.ridge_batch(64, 64, 1e12, 1e9, torch.float32) is None  # at most 16 FLOP/B, ridge 1,000


def test_roofline_time_takes_the_slower():
    """Check that roofline_time (kvlib/measure/machine.py, outside the learner's file: Exercise 5.4 decides it) is the
    slower of compute time and memory time."""
    assert roofline_time(2e9, 1e9, 1e12, 1e9) == 1.0
    assert roofline_time(8e12, 1e6, 2e12, 5e11) == 4.0


def test_h100_decode_turns_compute_bound_near_295():
    """Check that decode on an H100 in bf16 turns compute-bound near a batch of 295, and that a 4k cache per
    sequence never gets there."""
    h100, config = DEVICES["H100 SXM"], REAL_MODELS["Llama-2-7B"].config
    batch = roofline.compute_bound_batch(config, 1, h100.tensor16_flops, h100.bandwidth)
    assert 290 <= batch <= 305
    flops, moved = roofline.step_cost(config, 1, 1, batch, F16)
    assert flops / moved >= h100.ridge(F16) > np.divide(*roofline.step_cost(config, 1, 1, batch - 1, F16))
    assert roofline.compute_bound_batch(config, 4096, h100.tensor16_flops, h100.bandwidth) is None


def test_prefill_cost_equals_torch_flop_counter():
    """Check that step_cost's prefill FLOPs equal torch's counter on a small GQA decoder (batch 3)."""
    from kvlib.checks.roofline import ODD
    from kvlib.recompute import forward_flops, measured_forward_flops, new_token_flops

    model = Decoder(ODD).eval()
    assert roofline.step_cost(ODD, 7, 7, 3, torch.float32)[0] == measured_forward_flops(model, 7, batch=3)
    assert roofline.step_cost(ODD, 7, 7)[0] == forward_flops(ODD, 7)  # notebook 03's count, one sequence
    assert roofline.step_cost(ODD, 1, 20)[0] == new_token_flops(ODD, 20)


# ---------------------------------------------------------------------------------------------
# The checks name the known slips


NAMES = (
    "bytes_per_element",
    "matmul_intensity",
    "ridge_batch",
    "step_cost",
    "predicted_tokens_per_second",
    "compute_bound_batch",
)


def _module(**replaced) -> types.SimpleNamespace:
    """What a learner hands in: kvlib.roofline (the reference, in reference mode) with some functions replaced."""
    return handed_in(roofline, NAMES, **replaced)


# ---------------------------------------------------------------------------------------------
# Other correct implementations (ALTERNATIVES): at least three per exercise, all must pass every check


def _bytes(dtype):
    return torch.finfo(dtype).bits // 8 if dtype.is_floating_point else torch.iinfo(dtype).bits // 8


def intensity_fraction(m, k, n, dtype=F16):  # exact rational arithmetic, then a float
    return float(Fraction(2 * m * k * n, (m * k + k * n + m * n) * dtype.itemsize))


def intensity_finfo(m, k, n, dtype=F16):
    flops = 2.0 * m * k * n
    return flops / (_bytes(dtype) * (m * k) + _bytes(dtype) * (k * n) + _bytes(dtype) * (m * n))


def intensity_loop(m, k, n, dtype=F16):  # row by row: each row costs 2kn FLOPs and brings k inputs, n outputs
    flops, moved = 0, k * n * dtype.itemsize
    for _ in range(m):
        flops += 2 * k * n
        moved += (k + n) * dtype.itemsize
    return flops / moved


def ridge_linear_search(k, n, peak, bw, dtype=F16):
    ridge = peak / bw
    if 2 * k * n / ((k + n) * dtype.itemsize) <= ridge:  # the intensity's limit as the rows grow
        return None
    m = 1
    while roofline.matmul_intensity(m, k, n, dtype) < ridge:
        m += 1
    return m


def ridge_bisect(k, n, peak, bw, dtype=F16):
    ridge = peak / bw
    b = roofline.bytes_per_element(dtype)
    if 2 * k * n <= ridge * b * (k + n):
        return None
    low, high = 1, 1
    while 2 * high * k * n < ridge * b * (high * k + k * n + high * n):
        high *= 2
    while low < high:
        mid = (low + high) // 2
        if 2 * mid * k * n < ridge * b * (mid * k + k * n + mid * n):
            low = mid + 1
        else:
            high = mid
    return low


def ridge_fraction(k, n, peak, bw, dtype=F16):
    ridge, b = Fraction(peak) / Fraction(bw), dtype.itemsize
    slope = 2 * k * n - ridge * b * (k + n)
    return None if slope <= 0 else max(1, math.ceil(ridge * b * k * n / slope))


def step_per_matrix(config, new_tokens, kv_len, batch=1, dtype=F16):
    C, D, H, H_kv, F = config.d_model, config.head_dim, config.n_heads, config.n_kv_heads, config.hidden_dim
    shapes = [(C, H * D), (C, H_kv * D), (C, H_kv * D), (H * D, C), (C, F), (C, F), (F, C)] * config.n_layers
    shapes.append((C, config.vocab_size))  # the output head
    weights = sum(a * b for a, b in shapes)
    flops = sum(2 * batch * new_tokens * a * b for a, b in shapes)
    flops += config.n_layers * H * batch * (2 * new_tokens * kv_len * D + 2 * new_tokens * kv_len * D)  # scores, values
    return flops, weights * dtype.itemsize + kv_cache_bytes(config, kv_len, 1, dtype) * batch


def step_float(config, new_tokens, kv_len, batch=1, dtype=F16):  # float64 intermediates, ints at the end
    per_seq = (
        2.0 * new_tokens * matrix_params(config)
        + 4.0 * config.n_layers * config.n_heads * new_tokens * kv_len * config.head_dim
    )
    return int(round(batch * per_seq)), int(matrix_params(config) * float(dtype.itemsize)) + kv_cache_bytes(
        config, kv_len, batch, dtype
    )


def step_cache_first(config, new_tokens, kv_len, batch=1, dtype=F16):
    cache = kv_cache_bytes(config, kv_len, batch, dtype)
    attention = config.n_layers * config.n_heads * 4 * new_tokens * kv_len * config.head_dim
    return batch * (2 * new_tokens * matrix_params(config) + attention), cache + roofline.bytes_per_element(
        dtype
    ) * matrix_params(config)


def tps_explicit(config, kv_len, batch, dtype, peak, bw):
    flops, moved = roofline.step_cost(config, 1, kv_len, batch, dtype)
    return batch / max(flops / peak, moved / bw)


def tps_rates(config, kv_len, batch, dtype, peak, bw):  # the slower of the two rates, in steps per second
    flops, moved = roofline.step_cost(config, 1, kv_len, batch, dtype)
    return float(batch * min(peak / flops, bw / moved))


def tps_fraction(config, kv_len, batch, dtype, peak, bw):
    flops, moved = roofline.step_cost(config, 1, kv_len, batch, dtype)
    return float(batch / max(Fraction(flops) / Fraction(peak), Fraction(moved) / Fraction(bw)))


def ridge_sequences_bisect(config, kv_len, peak, bw, dtype=F16):  # the limit first, then doubling and bisection
    flops, moved = roofline.step_cost(config, 1, kv_len, 1, dtype)
    cache = kv_cache_bytes(config, kv_len, 1, dtype)
    if flops / cache <= peak / bw:  # the intensity's limit as the batch grows
        return None

    def reaches(b):
        f, m = roofline.step_cost(config, 1, kv_len, b, dtype)
        return f * bw >= peak * m  # f / m >= peak / bw, without dividing

    high = 1
    while not reaches(high):
        high *= 2
    low = high // 2 + 1 if high > 1 else 1
    while low < high:
        mid = (low + high) // 2
        low, high = (mid + 1, high) if not reaches(mid) else (low, mid)
    return low


def ridge_sequences_fraction(config, kv_len, peak, bw, dtype=F16):  # exact rational arithmetic from the counts
    b, c = dtype.itemsize, config
    flops = 2 * matrix_params(c) + 4 * c.n_layers * c.n_heads * kv_len * c.head_dim
    weights, cache = matrix_params(c) * b, 2 * c.n_layers * c.n_kv_heads * c.head_dim * kv_len * b
    ridge = Fraction(peak) / Fraction(bw)
    return None if flops <= ridge * cache else max(1, math.ceil(ridge * weights / (flops - ridge * cache)))


def ridge_sequences_tps(config, kv_len, peak, bw, dtype=F16):  # where 5.4's tokens/s stops growing with the batch
    flops, moved = roofline.step_cost(config, 1, kv_len, 1, dtype)
    cache = kv_cache_bytes(config, kv_len, 1, dtype)
    if Fraction(flops) / cache <= Fraction(peak) / Fraction(bw):
        return None
    b = max(1, math.floor(Fraction(peak) * (moved - cache) / (Fraction(bw) * flops - Fraction(peak) * cache)))
    while (
        roofline.step_cost(config, 1, kv_len, b, dtype)[0] * bw
        < peak * roofline.step_cost(config, 1, kv_len, b, dtype)[1]
    ):
        b += 1  # the estimate from below, then one sequence at a time to the first that reaches it
    return b


ALTERNATIVES = [
    ("5.1", {"matmul_intensity": intensity_fraction}),
    ("5.1", {"matmul_intensity": intensity_finfo}),
    ("5.1", {"matmul_intensity": intensity_loop}),
    ("5.2", {"ridge_batch": ridge_bisect}),
    ("5.2", {"ridge_batch": ridge_fraction}),
    ("5.3", {"step_cost": step_per_matrix}),
    ("5.3", {"step_cost": step_float}),
    ("5.3", {"step_cost": step_cache_first}),
    ("5.4", {"predicted_tokens_per_second": tps_explicit}),
    ("5.4", {"predicted_tokens_per_second": tps_rates}),
    ("5.4", {"predicted_tokens_per_second": tps_fraction}),
    ("5.5", {"compute_bound_batch": ridge_sequences_bisect}),
    ("5.5", {"compute_bound_batch": ridge_sequences_fraction}),
    ("5.5", {"compute_bound_batch": ridge_sequences_tps}),
]


@pytest.mark.parametrize("ex_id, replaced", ALTERNATIVES, ids=case_ids(ALTERNATIVES))
def test_alternative_passes_every_check(ex_id, replaced):
    """Check that a correct implementation written another way passes every check of its exercise."""
    failures = check_failures(ex_id, _module(**replaced))
    assert not failures, failures


# ---------------------------------------------------------------------------------------------
# Likely slips (SLIPS), each rejected by its check, or by a check of its exercise, with a message naming it


def _intensity_without_factor_two(m, k, n, dtype=F16):
    return roofline.matmul_intensity(m, k, n, dtype) / 2


def _intensity_in_bits(m, k, n, dtype=F16):
    return 2 * m * k * n / ((m * k + k * n + m * n) * torch.finfo(dtype).bits)


def _intensity_without_output(m, k, n, dtype=F16):
    return 2 * m * k * n / ((m * k + k * n) * roofline.bytes_per_element(dtype))


def _ridge_rounded_down(k, n, peak, bw, dtype=F16):
    m = roofline.ridge_batch(k, n, peak, bw, dtype)
    return m - 1 if m and m > 1 else m


def _ridge_inverted(k, n, peak, bw, dtype=F16):
    return roofline.ridge_batch(k, n, bw, peak, dtype)


def _step_weights_times_batch(config, new_tokens, kv_len, batch=1, dtype=F16):
    flops, moved = roofline.step_cost(config, new_tokens, kv_len, batch, dtype)
    return flops, moved + (batch - 1) * matrix_params(config) * roofline.bytes_per_element(dtype)


def _step_without_cache(config, new_tokens, kv_len, batch=1, dtype=F16):
    flops, _ = roofline.step_cost(config, new_tokens, kv_len, batch, dtype)
    return flops, matrix_params(config) * roofline.bytes_per_element(dtype)


def _step_flops_one_sequence(config, new_tokens, kv_len, batch=1, dtype=F16):
    flops, moved = roofline.step_cost(config, new_tokens, kv_len, batch, dtype)
    return flops // batch, moved


def _tps_without_batch(config, kv_len, batch, dtype, peak, bw):
    return roofline.predicted_tokens_per_second(config, kv_len, batch, dtype, peak, bw) / batch


def _seconds_per_token(config, kv_len, batch, dtype, peak, bw):
    return 1 / roofline.predicted_tokens_per_second(config, kv_len, batch, dtype, peak, bw)


def intensity_int_division(m, k, n, dtype=F16):
    return 2 * m * k * n // ((m * k + k * n + m * n) * dtype.itemsize)


def intensity_fixed_two_bytes(m, k, n, dtype=F16):
    return 2 * m * k * n / ((m * k + k * n + m * n) * 2)


def intensity_output_twice(m, k, n, dtype=F16):
    return 2 * m * k * n / ((m * k + k * n + 2 * m * n) * dtype.itemsize)


def ridge_approximation(k, n, peak, bw, dtype=F16):
    return max(1, math.ceil(peak / bw * dtype.itemsize / 2))


def ridge_in_bits(k, n, peak, bw, dtype=F16):
    return roofline.ridge_batch(k, n, peak, bw / 8, dtype)  # ridge * 8 bits ... the same as 8x the bytes per element


def ridge_never_none(k, n, peak, bw, dtype=F16):
    ridge, b = peak / bw, dtype.itemsize
    return math.ceil(ridge * b * k * n / (2 * k * n - ridge * b * (k + n)))


def ridge_float(k, n, peak, bw, dtype=F16):
    ridge, b = peak / bw, dtype.itemsize
    slope = 2 * k * n - ridge * b * (k + n)
    return None if slope <= 0 else ridge * b * k * n / slope


def step_no_attention(config, new_tokens, kv_len, batch=1, dtype=F16):
    flops, moved = roofline.step_cost(config, new_tokens, kv_len, batch, dtype)
    return batch * 2 * new_tokens * matrix_params(config), moved


def step_attention_kv_heads(config, new_tokens, kv_len, batch=1, dtype=F16):
    _, moved = roofline.step_cost(config, new_tokens, kv_len, batch, dtype)
    attention = config.n_layers * config.n_kv_heads * 4 * new_tokens * kv_len * config.head_dim
    return batch * (2 * new_tokens * matrix_params(config) + attention), moved


def step_attention_once(config, new_tokens, kv_len, batch=1, dtype=F16):
    _, moved = roofline.step_cost(config, new_tokens, kv_len, batch, dtype)
    attention = config.n_layers * config.n_heads * 2 * new_tokens * kv_len * config.head_dim
    return batch * (2 * new_tokens * matrix_params(config) + attention), moved


def step_attention_square(config, new_tokens, kv_len, batch=1, dtype=F16):
    _, moved = roofline.step_cost(config, new_tokens, kv_len, batch, dtype)
    attention = config.n_layers * config.n_heads * 4 * kv_len * kv_len * config.head_dim
    return batch * (2 * new_tokens * matrix_params(config) + attention), moved


def step_kv_of_batch_one(config, new_tokens, kv_len, batch=1, dtype=torch.float16):
    flops, moved = roofline.step_cost(config, new_tokens, kv_len, batch, dtype)
    return flops, moved - kv_cache_bytes(config, kv_len, batch, dtype) + kv_cache_bytes(config, kv_len, 1, dtype)


def tps_summed(config, kv_len, batch, dtype, peak, bw):
    flops, moved = roofline.step_cost(config, 1, kv_len, batch, dtype)
    return batch / (flops / peak + moved / bw)


def tps_memory_only(config, kv_len, batch, dtype, peak, bw):
    _, moved = roofline.step_cost(config, 1, kv_len, batch, dtype)
    return batch / (moved / bw)


def tps_prefill(config, kv_len, batch, dtype, peak, bw):
    flops, moved = roofline.step_cost(config, kv_len, kv_len, batch, dtype)
    return batch / max(flops / peak, moved / bw)


def _ridge_parts(config, kv_len, dtype):
    flops, moved = roofline.step_cost(config, 1, kv_len, 1, dtype)
    cache = kv_cache_bytes(config, kv_len, 1, dtype)
    return flops, moved - cache, cache


def sequences_weights_per_sequence(config, kv_len, peak, bw, dtype=F16):  # weights read again for every sequence
    flops, weights, cache = _ridge_parts(config, kv_len, dtype)
    return 1 if flops / (weights + cache) >= peak / bw else None


def sequences_one_cache(config, kv_len, peak, bw, dtype=F16):  # the batch shares one sequence's cache
    flops, weights, cache = _ridge_parts(config, kv_len, dtype)
    return max(1, math.ceil(peak / bw * (weights + cache) / flops))


def sequences_rounded_down(config, kv_len, peak, bw, dtype=F16):
    b = roofline.compute_bound_batch(config, kv_len, peak, bw, dtype)
    return b - 1 if b and b > 1 else b


def sequences_never_none(config, kv_len, peak, bw, dtype=F16):
    flops, weights, cache = _ridge_parts(config, kv_len, dtype)
    return math.ceil(peak / bw * weights / (flops - peak / bw * cache))


def sequences_one_layer(config, kv_len, peak, bw, dtype=F16):  # 5.2's ridge of one d_model x d_model matmul
    return roofline.ridge_batch(config.d_model, config.d_model, peak, bw, dtype)


def sequences_matrices_only(config, kv_len, peak, bw, dtype=F16):  # attention's FLOPs left out
    _, weights, cache = _ridge_parts(config, kv_len, dtype)
    flops, ridge = 2 * matrix_params(config), peak / bw
    return None if flops <= ridge * cache else max(1, math.ceil(ridge * weights / (flops - ridge * cache)))


def sequences_of_the_example(config, kv_len, peak, bw, dtype=F16):  # the docstring's H100 answer, for any input
    return 299


def sequences_float(config, kv_len, peak, bw, dtype=F16):
    flops, weights, cache = _ridge_parts(config, kv_len, dtype)
    ridge = peak / bw
    return None if flops <= ridge * cache else ridge * weights / (flops - ridge * cache)


def ridge_capped_search(
    k, n, peak, bw, dtype=F16
):  # the audit's shortcut: m up to a cap, None past it (10**6: the 2 s limit)
    for m in range(1, 10**5 + 1):
        if roofline.matmul_intensity(m, k, n, dtype) >= peak / bw:
            return m
    return None


def sequences_capped_search(config, kv_len, peak, bw, dtype=F16):  # the same over 5.3's step, doubling to a cap
    b = 1
    while b <= 10**6:
        flops, moved = roofline.step_cost(config, 1, kv_len, b, dtype)
        if flops * bw >= peak * moved:
            low = b // 2 + 1 if b > 1 else 1
            while low < b:  # the fewest in (b/2, b]
                mid = (low + b) // 2
                f, m = roofline.step_cost(config, 1, kv_len, mid, dtype)
                low, b = (low, mid) if f * bw >= peak * m else (mid + 1, b)
            return b
        b *= 2
    return None


# (check or exercise, replaced function, words the failure must contain)
SLIPS = [
    ("matmul_intensity_counts_flops_and_bytes", {"matmul_intensity": _intensity_without_factor_two}, "exactly half"),
    ("matmul_intensity_counts_flops_and_bytes", {"matmul_intensity": _intensity_in_bits}, "bytes, not bits"),
    (
        "matmul_intensity_counts_flops_and_bytes",
        {"matmul_intensity": _intensity_without_output},
        "short of the least traffic",
    ),
    ("ridge_batch_reaches_the_ridge", {"ridge_batch": _ridge_rounded_down}, "still below the ridge"),
    ("ridge_batch_reaches_the_ridge", {"ridge_batch": _ridge_inverted}, "the inverse of this device's"),
    (
        "step_cost_bytes_are_what_the_step_must_bring",
        {"step_cost": _step_weights_times_batch},
        "more than the step must bring",
    ),
    ("step_cost_bytes_are_what_the_step_must_bring", {"step_cost": _step_without_cache}, "the weights' bytes alone"),
    ("step_cost_flops_match_torch_counter", {"step_cost": _step_flops_one_sequence}, "one sequence's work"),
    (
        "predicted_tokens_per_second_counts_the_batch",
        {"predicted_tokens_per_second": _tps_without_batch},
        "times too few",
    ),
    (
        "predicted_tokens_per_second_on_an_a100",
        {"predicted_tokens_per_second": _seconds_per_token},
        "seconds per token",
    ),
    ("5.1", {"matmul_intensity": intensity_int_division}, "whole number"),
    ("5.1", {"matmul_intensity": intensity_fixed_two_bytes}, "of a 2-byte dtype"),
    ("5.1", {"matmul_intensity": intensity_output_twice}, "more than the least traffic"),
    ("5.2", {"ridge_batch": ridge_approximation}, "the rows' own bytes"),
    ("5.2", {"ridge_batch": ridge_in_bits}, "bytes each"),
    ("5.2", {"ridge_batch": ridge_never_none}, "answer is None"),
    ("5.2", {"ridge_batch": ridge_float}, "int number of rows"),
    ("ridge_batch_just_under_the_limit", {"ridge_batch": ridge_capped_search}, "gave up too soon"),
    ("5.3", {"step_cost": step_no_attention}, "attention's own FLOPs are missing"),
    ("5.3", {"step_cost": step_attention_kv_heads}, "once per key/value head"),
    ("5.3", {"step_cost": step_attention_once}, "half the right count"),
    ("5.3", {"step_cost": step_attention_square}, "kv_len squared"),
    ("5.4", {"predicted_tokens_per_second": tps_summed}, "one after the other"),
    ("5.4", {"predicted_tokens_per_second": tps_memory_only}, "compute-bound"),
    ("5.4", {"predicted_tokens_per_second": tps_prefill}, "rate of a prefill"),
    ("step_cost_bytes_are_what_the_step_must_bring", {"step_cost": step_kv_of_batch_one}, "one sequence's"),
    (
        "predicted_tokens_per_second_on_an_a100",
        {"predicted_tokens_per_second": tps_summed},
        "computes and then moves data",
    ),
    ("5.5", {"compute_bound_batch": sequences_weights_per_sequence}, "read again for every sequence"),
    ("5.5", {"compute_bound_batch": sequences_one_cache}, "one cache for the whole batch"),
    ("5.5", {"compute_bound_batch": sequences_rounded_down}, "still below the ridge"),
    ("5.5", {"compute_bound_batch": sequences_never_none}, "answer is None"),
    ("5.5", {"compute_bound_batch": sequences_one_layer}, "one d_model x d_model matmul"),
    ("5.5", {"compute_bound_batch": sequences_matrices_only}, "without attention's own FLOPs"),
    ("5.5", {"compute_bound_batch": sequences_float}, "int number of sequences"),
    ("5.5", {"compute_bound_batch": sequences_of_the_example}, "expected 186 sequences"),
    (
        "compute_bound_batch_just_under_the_caches_limit",
        {"compute_bound_batch": sequences_capped_search},
        "gave up too soon",
    ),
]


@pytest.mark.parametrize("where, replaced, words", SLIPS, ids=case_ids(SLIPS))
def test_slip_is_rejected_naming_it(where, replaced, words):
    """Check that a likely wrong implementation fails the check named, or a check of the exercise named, with an
    AssertionError whose message names the slip."""
    failures = check_failures(where, _module(**replaced))
    assert failures, f"{next(iter(replaced.values())).__name__} passed every check of {where}"
    assert all(isinstance(err, AssertionError) for _, err in failures), failures
    assert any(words in (str(err) or "assertion") for _, err in failures), failures


def test_5_4_messages_name_the_cause_not_the_line_to_type():
    """Check that each named slip of Exercise 5.4 fails with a message that names what went wrong, not the formula
    that fixes it (issue 46: no max(...), no batch / step time, no step_cost call to copy)."""
    for replaced in (_tps_without_batch, _seconds_per_token, tps_summed, tps_memory_only, tps_prefill):
        failures = check_failures("5.4", _module(predicted_tokens_per_second=replaced))
        assert failures, f"{replaced.__name__} passed Exercise 5.4"
        for _, err in failures:
            for fix in ("max(", "batch / step", "step_cost(", "the larger of", "/ bandwidth", "its inverse"):
                assert fix not in str(err), f"{replaced.__name__}: {fix!r} in {err}"


def test_a_search_by_one_row_is_stopped_and_named():
    """Check that ridge_batch searching m one row at a time (knowing the limit, so correct) is stopped on the ridge
    just under the limit (134 million rows) after the check's 2 s, with a message that says why it cannot finish."""
    failures = check_failures("ridge_batch_just_under_the_limit", _module(ridge_batch=ridge_linear_search))
    assert [type(err).__name__ for _, err in failures] == ["CheckTimeout"], failures
    assert "cannot finish" in str(failures[0][1]) and "hundreds of millions" in str(failures[0][1])


def test_5_4_refuses_the_notebooks_roofline_time_where_the_exercise_is_checked():
    """Check that predicted_tokens_per_second written as batch / roofline_time(*step_cost(...)) fails Exercise 5.4's
    checks naming roofline_time (kvlib.course.exercises.READY_MADE), and that roofline_time works again after."""

    def through_roofline_time(config, kv_len, batch, dtype, peak, bw):
        return batch / roofline_time(*roofline.step_cost(config, 1, kv_len, batch, dtype), peak, bw)

    failures = check_failures("5.4", _module(predicted_tokens_per_second=through_roofline_time))
    assert failures and all("roofline_time" in str(err) for _, err in failures), failures
    assert roofline_time(2e9, 1e9, 1e12, 1e9) == 1.0


def test_trivial_answers_fail():
    """Check that constant answers (0, 1) pass no check of notebook 05."""
    const = types.SimpleNamespace(
        matmul_intensity=lambda *a: 1.0,
        ridge_batch=lambda *a: 1,
        step_cost=lambda *a: (1, 1),
        predicted_tokens_per_second=lambda *a: 1.0,
        compute_bound_batch=lambda *a: 1,
    )
    for check in ROOFLINE_CHECKS:
        with pytest.raises(AssertionError):
            check.fn(const, np.random.default_rng(0))


# ---------------------------------------------------------------------------------------------
# A function that changes its arguments scores 0: every check builds its target before the call


_NUMBERS_ONLY = {"5.1", "5.2"}  # their functions take numbers and a dtype: nothing to change
_MUTABLE = [c for ex_id in ("5.3", "5.4", "5.5") for c in checks_for(BY_ID[ex_id])]


@pytest.mark.parametrize("check", _MUTABLE, ids=lambda c: c.name)
def test_a_function_that_changes_its_arguments_scores_zero(check):
    """Check that a function which spoils its arguments, then answers for the spoiled ones, fails the check."""
    ex = check.exercise
    name = ex.name
    ref = getattr(roofline, name)
    with pytest.raises(AssertionError):
        check.fn(_module(**{name: vandal(ref, spoil_config_tensors_models)}), np.random.default_rng(0))
    from kvlib.core.configs import REAL_MODELS

    assert REAL_MODELS["Llama-2-7B"].config.n_layers == 32, "a check handed learner code a shared config"


@pytest.mark.parametrize(
    "check", [c for ex in sorted(_NUMBERS_ONLY) for c in checks_for(BY_ID[ex])], ids=lambda c: c.name
)
def test_checks_of_5_1_and_5_2_pass_only_numbers(check):
    """Check that 5.1's and 5.2's checks hand learner code only ints, floats and dtypes, which no function can change."""
    ex = check.exercise
    ref, seen = getattr(roofline, ex.name), []

    def spy(*args, **kwargs):
        seen.extend([*args, *kwargs.values()])
        return ref(*args, **kwargs)

    check.fn(_module(**{ex.name: spy}), np.random.default_rng(0))
    assert seen and all(type(a) in (int, float, torch.dtype) for a in seen), {type(a).__name__ for a in seen}


def test_every_check_of_05_is_covered():
    """Check that the two tests above cover every check of notebook 05."""
    covered = {c.name for c in _MUTABLE} | {c.name for ex in _NUMBERS_ONLY for c in checks_for(BY_ID[ex])}
    assert covered == {name for name, c in CHECKS.items() if c.exercise.id[0] == "5"}


# ---------------------------------------------------------------------------------------------
# In the isolated grading child, as nbgrader runs them


@pytest.mark.slow
def test_checks_of_05_pass_the_reference_in_the_isolated_child():
    """Check that the reference passes every 5.x check in the grading child."""
    from conftest import ROOT

    source = (ROOT / "solutions" / "kvlib" / "roofline.py").read_text()
    verdicts = checks_in_child("roofline", source, ("5.1", "5.2", "5.3", "5.4", "5.5"))
    assert set(verdicts.values()) == {"pass"}, verdicts


def test_bad_input_is_a_clear_error():
    """Check that a wrong dtype, a non-config or an impossible length names the problem."""
    config = REAL_MODELS["Llama-2-7B"].config
    with pytest.raises(ValueError, match="torch.dtype"):
        roofline.step_cost(config, 1, 4, 1, "fp16")
    with pytest.raises(ValueError, match="kvlib ModelConfig"):
        roofline.step_cost({"n_layers": 2}, 1, 1)
    with pytest.raises(ValueError, match="cannot be less than new_tokens"):
        roofline.step_cost(config, 8, 4)
    with pytest.raises(ValueError, match="bandwidth must be a positive number"):
        roofline_time(1.0, 1.0, 1e12, 0)
    with pytest.raises(ValueError, match="k must be an int"):
        roofline.ridge_batch(0, 4096, 1e12, 1e9)


# ---------------------------------------------------------------------------------------------
# Measuring: structure only (timings are the benchmark's business)


def test_measure_bandwidth_reports_three_kernels():
    """Check that measure_bandwidth reports read, copy and triad, and takes read's rate, on one thread."""
    result = machine.measure_bandwidth(n_bytes=8 << 20, repeats=2)
    assert set(result["per_kernel"]) == {"read", "copy", "triad"}
    assert result["bandwidth"] == result["per_kernel"]["read"] > 0 and result["kernel"] == "read"
    assert result["record"]["threads"] == 1


def test_measure_roof_takes_the_best_kernel_of_each_ceiling():
    """Check that measure_roof's bandwidth and FLOP/s are the highest of their kernels, the model's own included."""
    weights = [torch.randn(64, 48), torch.randn(48, 64)]
    roof = machine.measure_roof(n_bytes=1 << 20, n=64, weights=weights, rows=8, rounds=2)
    streams = {"read", "copy", "triad", "multi_read", "matrix-vector"}
    assert set(roof["per_kernel"]) == streams | {"matmul", "matrix 8 rows"}
    assert (
        roof["bandwidth"] == max(roof["per_kernel"][k] for k in streams) == roof["per_kernel"][roof["bandwidth_kernel"]]
    )
    assert roof["flops"] == max(roof["per_kernel"]["matmul"], roof["per_kernel"]["matrix 8 rows"])
    assert roof["ridge"] == roof["flops"] / roof["bandwidth"] and roof["record"]["threads"] == 1
    with pytest.raises(ValueError, match="rounds"):
        machine.measure_roof(n_bytes=1 << 20, n=64, rounds=0)


def test_course_roof_is_one_roof_for_notebooks_05_and_07(tmp_path):
    """Check that notebook 07's course_roof(reuse=True) returns the roof notebook 05 stored for this machine, that a
    second run of 05 keeps each ceiling's best of both runs, and that a roof stored for another machine is not used."""
    path, small = tmp_path / "roof.json", {"n_bytes": 1 << 20, "n": 64, "rounds": 1}
    first = machine.course_roof(path=path, **small)  # notebook 05
    assert first["stored"] == str(path) and first["runs"] == 1 and not first["reused"]
    again = machine.course_roof(path=path, reuse=True)  # notebook 07: nothing measured
    assert again["reused"] and (again["bandwidth"], again["flops"], again["ridge"]) == (
        first["bandwidth"],
        first["flops"],
        first["ridge"],
    )
    second = machine.course_roof(path=path, **small)  # notebook 05 once more: the best of both runs
    assert second["runs"] == 2 and second["bandwidth"] >= first["bandwidth"] and second["flops"] >= first["flops"]
    assert second["ridge"] == second["flops"] / second["bandwidth"]
    assert machine.course_roof(path=path, reuse=True)["ridge"] == second["ridge"]
    stored = json.loads(path.read_text())
    stored["key"]["device"] = "another CPU"
    path.write_text(json.dumps(stored))
    assert not machine.course_roof(path=path, reuse=True, **small)["reused"], "another machine's roof was reused"
    unwritable = tmp_path / "file"
    unwritable.write_text("")
    assert machine.course_roof(path=unwritable / "roof.json", **small)["stored"] is None


def test_course_roof_is_one_measurement_a_sitting_said_one_way(tmp_path):
    """Check that a roof stored in another sitting (over SITTING_HOURS ago) is measured afresh, not reused nor merged,
    and that roof_line says the bandwidth with each run's and the last run's rounds' spread, the time and the load."""
    path, small = tmp_path / "roof.json", {"n_bytes": 1 << 20, "n": 64, "rounds": 3}
    first = machine.course_roof(path=path, **small)
    second = machine.course_roof(path=path, **small)
    assert second["runs"] == 2 and len(second["bandwidths"]) == 2 and len(second["bandwidth_rounds"]) == 3
    line = machine.roof_line(second)
    assert line.startswith(f"this machine's bandwidth: {second['bandwidth'] / 1e9:.1f} GB/s (")
    assert "the best of 2 runs this sitting" in line and "rounds" in line and "load average" in line
    stored = json.loads(path.read_text())
    stored["roof"]["measured_at"] = "2026-01-01T00:00:00+00:00"  # yesterday's machine, or last month's
    path.write_text(json.dumps(stored))
    fresh = machine.course_roof(path=path, reuse=True, **small)
    assert not fresh["reused"] and fresh["runs"] == 1 and first["bandwidth"] > 0
    assert "not measured again" in machine.roof_line(machine.course_roof(path=path, reuse=True))


def test_lift_roof_raises_each_ceiling_only_to_a_point_above_it():
    """Check that lift_roof leaves a roof every point sits under as it is, raises the compute ceiling for a point above
    it on the flat part and the bandwidth for one above the slope, each only to that point, after which no point sits
    above the roof (notebook 05's cell), and refuses a point with no positive intensity."""
    points = [("decode", 1.0, 0.9e9), ("prefill", 50.0, 8e9)]
    assert machine.lift_roof(10e9, 1e9, points) == (10e9, 1e9, [])
    points = [("decode", 1.0, 1.5e9), ("prefill", 50.0, 12e9), ("between", 5.0, 9.5e9)]
    peak, bandwidth, above = machine.lift_roof(10e9, 1e9, points)
    assert above == ["decode", "prefill", "between"] and (peak, bandwidth) == (12e9, 9.5e9 / 5.0)
    assert all(rate <= min(peak, intensity * bandwidth) for _, intensity, rate in points)
    with pytest.raises(ValueError, match="intensity must be positive"):
        machine.lift_roof(10e9, 1e9, [("empty", 0.0, 1e9)])


def test_measure_batches_times_every_batch():
    """Check that measure_batches gives one positive median per batch, each round's seconds in round order (their
    median the median given), with the record."""
    model = machine.random_model(
        ModelConfig(vocab_size=16, d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, hidden_dim=32)
    )
    result = machine.measure_batches(model, [1, 3], rounds=2)
    assert set(result["seconds"]) == {1, 3} and all(t > 0 for t in result["seconds"].values())
    assert all(len(result["round_seconds"][b]) == 2 for b in (1, 3))
    assert all(result["seconds"][b] == statistics.median(result["round_seconds"][b]) for b in (1, 3))
    assert result["record"]["rounds"] == 2


def test_memory_bound_config_is_far_beyond_the_caches():
    """Check that the timing model's weights are ~445 MB in float32: over ten times a 32 MB last-level cache."""
    config = memory_bound_config()
    assert 400e6 < matrix_params(config) * 4 < 500e6


def test_load_recordings_reads_a_folder(tmp_path):
    """Check that recordings load newest first, by benchmark, and that a missing folder gives none (never an invented one)."""
    (tmp_path / "a.json").write_text(json.dumps({"benchmark": "memory", "date": "2026-01-02", "runs": []}))
    (tmp_path / "b.json").write_text(json.dumps({"benchmark": "memory", "date": "2026-03-04", "runs": []}))
    (tmp_path / "c.json").write_text(json.dumps({"benchmark": "gqa", "date": "2026-05-06", "rows": []}))
    assert [r["date"] for r in machine.load_recordings(tmp_path)] == ["2026-03-04", "2026-01-02"]
    assert [r["date"] for r in machine.load_recordings(tmp_path, "gqa")] == ["2026-05-06"]
    assert machine.load_recordings(tmp_path / "missing") == []


def test_bench_memory_quick_reports_prediction_and_measurement():
    """Check that `kvlib bench memory --quick --json` reports bandwidth, matmul, decode predicted and measured, batches."""
    proc = run_kvlib("bench", "memory", "--quick", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    cpu = report["runs"][0]
    assert report["benchmark"] == "memory" and cpu["device_type"] == "cpu" and cpu["threads"] == 1
    d = cpu["decode"]
    assert d["measured_over_predicted"] == pytest.approx(d["measured_s"] / d["predicted_s"])
    assert d["fraction_of_bandwidth"] == pytest.approx(d["weight_bytes_read"] / d["measured_s"] / cpu["bandwidth"])
    assert [b["batch"] for b in cpu["batches"]] == [1, 4, 16, 64]
    assert all(b["measured_tokens_per_s"] > 0 and b["predicted_tokens_per_s"] > 0 for b in cpu["batches"])


def test_bench_memory_in_learner_mode_names_the_exercise():
    """Check that `kvlib bench memory` in learner mode exits with 2, naming the 5.x exercise and KVLIB_SOLUTIONS=1."""
    proc = run_kvlib("bench", "memory", "--quick", env={"KVLIB_SOLUTIONS": "0"})
    assert proc.returncode == 2 and "Exercise 5." in proc.stderr and "KVLIB_SOLUTIONS=1" in proc.stderr
