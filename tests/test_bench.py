"""kvlib/measure/bench_*.py: the benchmark runs end to end on a short length and reports every figure
the issue asks for (no assertion on speed: timing claims live in the benchmark's output)."""
import json

import numpy as np
import pytest

from kvlib.core.configs import gpt2_size_config
from kvlib.measure import bench_cache, bench_gqa

from conftest import ROOT, run_kvlib


def test_growth_fit_recovers_a_known_quadratic():
    """Check that the per-step growth fit returns the coefficients of an exact quadratic."""
    S = np.array([10, 20, 40, 80, 160])
    g = bench_cache._growth(S, 1e-3 + 2e-6 * S + 3e-9 * S**2)
    assert g["a_s"] == pytest.approx(1e-3) and g["b_s_per_token"] == pytest.approx(2e-6) and g["c_s_per_token2"] == pytest.approx(3e-9)


def test_bench_cache_reports_three_ways_per_length():
    """Check that a short `bench_cache` run gives tokens/s three ways, speedup and the kvlib/transformers ratio."""
    report = bench_cache.bench_cache(lengths=(8, 16), quick=True)
    assert report["record"]["threads"] == 1 and report["record"]["torch"]
    assert [r["model"] for r in report["results"]] == ["tiny", "small-stand-in"]
    for r in report["results"]:
        assert [row["new_tokens"] for row in r["rows"]] == [8, 16]
        for row in r["rows"]:
            assert set(row["tokens_per_s"]) == {"no_cache", "kvlib_cache", "transformers_cache"}
            assert all(v > 0 for v in row["tokens_per_s"].values())
            assert row["cache_speedup"] == pytest.approx(row["seconds"]["no_cache"] / row["seconds"]["kvlib_cache"])
    text = bench_cache.format_cache(report)
    assert "speedup" in text and "kvlib/HF" in text and "tiny" in text


def test_gpt2_size_config_is_about_124m_parameters():
    """Check that the GPT-2-size stand-in has GPT-2 small's shape and 110-140M weights."""
    from kvlib.core.model import Decoder

    config = gpt2_size_config()
    assert (config.n_layers, config.n_heads, config.d_model) == (12, 12, 768)
    n = sum(p.numel() for p in Decoder(config).parameters())
    assert 110e6 < n < 140e6


def test_kvlib_bench_rejects_bad_threads():
    """Check that --threads 0 is a clear error."""
    proc = run_kvlib("bench", "cache", "--threads", "0")
    assert proc.returncode == 2 and "--threads must be at least 1" in proc.stderr


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a GPU is here: --device cuda would run")
def test_kvlib_bench_device_cuda_without_a_gpu_is_a_clear_error():
    """Check that --device cuda names the problem where torch sees no GPU, and that cache refuses it anywhere."""
    proc = run_kvlib("bench", "gqa", "--device", "cuda", "--quick", env={"KVLIB_SOLUTIONS": "1"})
    assert proc.returncode == 2 and "sees no CUDA GPU" in proc.stderr
    proc = run_kvlib("bench", "cache", "--device", "cuda")
    assert proc.returncode == 2 and "CPU only" in proc.stderr


RECORDINGS = sorted((ROOT / "assets" / "recordings").glob("*.json"))


@pytest.mark.parametrize("path", RECORDINGS, ids=[p.name for p in RECORDINGS])
def test_shipped_gpu_recordings_say_what_made_them(path):
    """Check each shipped recording: a known benchmark, its date, a CUDA device with its torch, and numbers that agree.

    A recording is shown to learners as a measurement of that GPU, so it must be one: the
    self-consistency checked here (bytes / time = the bandwidth fraction, ratios against MHA)
    fails for a hand-edited or invented file.
    """
    rec = json.loads(path.read_text())
    assert rec["benchmark"] in ("memory", "gqa") and rec["date"] in path.name
    if rec["benchmark"] == "memory":
        gpu = [r for r in rec["runs"] if r["device_type"] == "cuda"]
        assert gpu and all("+cu" in r["record"]["torch"] for r in gpu)
        for r in gpu:
            d = r["decode"]
            assert d["achieved_bytes_per_s"] == pytest.approx(d["weight_bytes_read"] / d["measured_s"])
            assert d["fraction_of_bandwidth"] == pytest.approx(d["achieved_bytes_per_s"] / r["bandwidth"])
            assert d["graph"]["measured_s"] < d["measured_s"]  # a graph replays the same kernels without launch gaps
            assert r["gemv"]["fraction_of_bandwidth"] == pytest.approx(r["gemv"]["bytes_per_s"] / r["bandwidth"])
            assert "compiled" in d or "compile_error" in d  # torch.compile measured, or why not said
            assert r["ridge"] == pytest.approx(r["matmul_flops"] / r["bandwidth"])
    else:
        assert rec["record"]["device_type"] == "cuda" and rec["record"]["cuda_graph"]
        mha = {(r["kv_len"], r["method"]): r for r in rec["rows"] if r["n_kv_heads"] == 8}
        for r in rec["rows"]:
            base = mha[r["kv_len"], "mha sdpa" if "sdpa" in r["method"] else "mha"]
            assert r["speedup_vs_mha"] == pytest.approx(base["median_s"] / r["median_s"])
        assert "vs MHA" in bench_gqa.format_gqa(rec)  # notebook 06 prints it, with or without the fixed-part split
    assert path.with_name(path.name.rsplit("-", 1)[0] + ".txt").exists()  # the readable tables beside it


def test_record_script_runs_both_benchmarks_with_the_reference():
    """Check that assets/recordings/record.sh records what notebooks 05 and 06 read, never a learner's code."""
    script = (ROOT / "assets" / "recordings" / "record.sh").read_text()
    assert "KVLIB_SOLUTIONS=1" in script and "set -euo pipefail" in script
    assert "bench memory --json" in script and "bench gqa --device cuda --json" in script
