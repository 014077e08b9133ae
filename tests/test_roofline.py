"""kvlib/roofline.py, kvlib/core/configs.py and kvlib/core/devices.py (notebook 05): the calculators
against published figures, the device table's ridge points, the checks naming the classic slips,
learner mode, and `kvlib bench memory` end to end (never an assertion on speed)."""

import json
import types

import numpy as np
import pytest
import torch
from conftest import run_kvlib

from kvlib import roofline
from kvlib.checks import CHECKS, checks_for, run_exercise
from kvlib.core.configs import REAL_MODELS, memory_bound_config, real_model
from kvlib.core.devices import DEVICES
from kvlib.core.model import matrix_params, num_params
from kvlib.course.exercises import BY_ID
from kvlib.kv_cache import kv_cache_bytes  # Exercise 4.4 (notebook 04), which roofline.py builds on
from kvlib.measure import machine

ROOFLINE_CHECKS = [c for i in range(1, 5) for c in checks_for(BY_ID[f"5.{i}"])]
F16 = torch.float16


@pytest.mark.parametrize("check", ROOFLINE_CHECKS, ids=lambda c: c.name)
def test_reference_passes_check(check):
    """Check that the reference solution passes every check of notebook 05."""
    check.fn(roofline, np.random.default_rng(0))


def test_learner_stubs_are_todo(learner_mode):
    """Check that in learner mode every 5.x exercise reports todo, naming the exercise."""
    for i in range(1, 5):
        result = run_exercise(BY_ID[f"5.{i}"])
        assert result.status == "todo" and BY_ID[f"5.{i}"].name in result.message, result


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
    """Check the KV cache per token in fp16 of each real configuration against its published config."""
    assert kv_cache_bytes(REAL_MODELS[name].config, 1, 1, F16) == KIB_PER_TOKEN[name] * 1024


@pytest.mark.parametrize("name", list(PARAMS_B))
def test_parameter_counts_match_published(name):
    """Check each configuration's parameter count against the published one (to 0.5%)."""
    assert REAL_MODELS[name].params / 1e9 == pytest.approx(PARAMS_B[name], rel=5e-3)


def test_gpt2_and_falcon_counts_are_exact():
    """Check the two non-Llama models' counts against the figures transformers reports exactly."""
    assert REAL_MODELS["GPT-2 small"].params == 124_439_808
    assert REAL_MODELS["Falcon-7B"].params == 6_921_720_704
    assert num_params(REAL_MODELS["Llama-2-7B"].config) == 6_738_415_616  # Llama-2-7b-hf num_parameters()


def test_unknown_real_model_lists_the_names():
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
    """Check each device's FP32 and 16-bit ridge against the datasheets' dense figures (to 2%)."""
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
    """Check the rows a 4096 x 4096 fp16 layer needs to reach the ridge: ~345 on an H100, ~166 on an A100 80GB SXM."""
    for name, rows in (("H100 SXM", 345), ("A100 80GB SXM", 166)):
        d = DEVICES[name]
        assert roofline.ridge_batch(4096, 4096, d.tensor16_flops, d.bandwidth) == rows
    assert roofline.ridge_batch(64, 64, 1e12, 1e9, torch.float32) is None  # at most 16 FLOP/B, ridge 1,000


def test_roofline_time_takes_the_slower():
    assert roofline.roofline_time(2e9, 1e9, 1e12, 1e9) == 1.0
    assert roofline.roofline_time(8e12, 1e6, 2e12, 5e11) == 4.0


def test_h100_decode_turns_compute_bound_near_295():
    """Check the critical batch on an H100 in bf16 (~295), and that a 4k cache per sequence never gets there."""
    h100, config = DEVICES["H100 SXM"], REAL_MODELS["Llama-2-7B"].config
    batch = roofline.compute_bound_batch(config, 1, h100.tensor16_flops, h100.bandwidth)
    assert 290 <= batch <= 305
    flops, moved = roofline.step_cost(config, 1, 1, batch, F16)
    assert flops / moved >= h100.ridge(F16) > np.divide(*roofline.step_cost(config, 1, 1, batch - 1, F16))
    assert roofline.compute_bound_batch(config, 4096, h100.tensor16_flops, h100.bandwidth) is None


def test_prefill_cost_equals_torch_flop_counter():
    """Check that step_cost's prefill FLOPs equal torch's counter on a small GQA decoder (batch 3)."""
    from kvlib.checks.roofline import ODD
    from kvlib.core.model import Decoder
    from kvlib.recompute import forward_flops, measured_forward_flops, new_token_flops

    model = Decoder(ODD).eval()
    assert roofline.step_cost(ODD, 7, 7, 3, torch.float32)[0] == measured_forward_flops(model, 7, batch=3)
    assert roofline.step_cost(ODD, 7, 7)[0] == forward_flops(ODD, 7)  # notebook 03's count, one sequence
    assert roofline.step_cost(ODD, 1, 20)[0] == new_token_flops(ODD, 20)


# ---------------------------------------------------------------------------------------------
# The checks name the known slips


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


MISTAKES = [
    ("matmul_intensity_counts_flops_and_bytes", "matmul_intensity", _intensity_without_factor_two, "2 FLOPs"),
    ("matmul_intensity_counts_flops_and_bytes", "matmul_intensity", _intensity_in_bits, "bytes, not bits"),
    ("matmul_intensity_counts_flops_and_bytes", "matmul_intensity", _intensity_without_output, "output (m, n)"),
    ("ridge_batch_reaches_the_ridge", "ridge_batch", _ridge_rounded_down, "round UP"),
    ("ridge_batch_reaches_the_ridge", "ridge_batch", _ridge_inverted, "peak_flops / bandwidth"),
    ("step_cost_bytes_read_weights_once", "step_cost", _step_weights_times_batch, "do not multiply them by batch"),
    ("step_cost_bytes_read_weights_once", "step_cost", _step_without_cache, "KV cache of kv_len tokens"),
    ("step_cost_flops_match_torch_counter", "step_cost", _step_flops_one_sequence, "multiply the FLOPs by batch"),
    (
        "predicted_tokens_per_second_counts_the_batch",
        "predicted_tokens_per_second",
        _tps_without_batch,
        "batch / step time",
    ),
    ("predicted_tokens_per_second_on_an_a100", "predicted_tokens_per_second", _seconds_per_token, "seconds per token"),
]


@pytest.mark.parametrize("name, attr, fake, words", MISTAKES, ids=[f"{m[0]}-{m[2].__name__}" for m in MISTAKES])
def test_check_names_the_known_mistake(name, attr, fake, words):
    """Check that a deliberately wrong implementation fails the check with a message naming the mistake."""
    module = types.SimpleNamespace(
        **{
            n: getattr(roofline, n)
            for n in (
                "matmul_intensity",
                "ridge_batch",
                "step_cost",
                "predicted_tokens_per_second",
                "bytes_per_element",
            )
        }
    )
    setattr(module, attr, fake)
    with pytest.raises(AssertionError) as info:
        CHECKS[name].fn(module, np.random.default_rng(0))
    assert words in str(info.value)


def test_trivial_answers_fail():
    """Check that constant answers (0, 1) pass no check of notebook 05."""
    const = types.SimpleNamespace(
        matmul_intensity=lambda *a: 1.0,
        ridge_batch=lambda *a: 1,
        step_cost=lambda *a: (1, 1),
        predicted_tokens_per_second=lambda *a: 1.0,
    )
    for check in ROOFLINE_CHECKS:
        with pytest.raises(AssertionError):
            check.fn(const, np.random.default_rng(0))


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
        roofline.roofline_time(1.0, 1.0, 1e12, 0)
    with pytest.raises(ValueError, match="k must be an int"):
        roofline.ridge_batch(0, 4096, 1e12, 1e9)


# ---------------------------------------------------------------------------------------------
# Measuring: structure only (timings are the benchmark's business)


def test_measure_bandwidth_reports_three_kernels():
    result = machine.measure_bandwidth(n_bytes=8 << 20, repeats=2)
    assert set(result["per_kernel"]) == {"read", "copy", "triad"}
    assert result["bandwidth"] == result["per_kernel"]["read"] > 0 and result["kernel"] == "read"
    assert result["record"]["threads"] == 1


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
    proc = run_kvlib("bench", "memory", "--quick", env={"KVLIB_SOLUTIONS": "0"})
    assert proc.returncode == 2 and "Exercise 5." in proc.stderr and "KVLIB_SOLUTIONS=1" in proc.stderr
