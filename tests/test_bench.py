"""kvlib/bench.py: the benchmark runs end to end on a short length and reports every figure
the issue asks for (no assertion on speed: timing claims live in the benchmark's output)."""
import json

import numpy as np
import pytest

from kvlib import bench

from conftest import run_kvlib


def test_growth_fit_recovers_a_known_quadratic():
    """Check that the per-step growth fit returns the coefficients of an exact quadratic."""
    S = np.array([10, 20, 40, 80, 160])
    g = bench._growth(S, 1e-3 + 2e-6 * S + 3e-9 * S**2)
    assert g["a_s"] == pytest.approx(1e-3) and g["b_s_per_token"] == pytest.approx(2e-6) and g["c_s_per_token2"] == pytest.approx(3e-9)


def test_bench_cache_reports_three_ways_per_length():
    """Check that a short `bench_cache` run gives tokens/s three ways, speedup and the kvlib/transformers ratio."""
    report = bench.bench_cache(lengths=(8, 16), quick=True)
    assert report["record"]["threads"] == 1 and report["record"]["torch"]
    assert [r["model"] for r in report["results"]] == ["tiny", "small-stand-in"]
    for r in report["results"]:
        assert [row["new_tokens"] for row in r["rows"]] == [8, 16]
        for row in r["rows"]:
            assert set(row["tokens_per_s"]) == {"no_cache", "kvlib_cache", "transformers_cache"}
            assert all(v > 0 for v in row["tokens_per_s"].values())
            assert row["cache_speedup"] == pytest.approx(row["seconds"]["no_cache"] / row["seconds"]["kvlib_cache"])
    text = bench.format_cache(report)
    assert "speedup" in text and "kvlib/HF" in text and "tiny" in text


def test_gpt2_size_config_is_about_124m_parameters():
    """Check that the GPT-2-size stand-in has GPT-2 small's shape and 110-140M weights."""
    from kvlib.model import Decoder

    config = bench.gpt2_size_config()
    assert (config.n_layers, config.n_heads, config.d_model) == (12, 12, 768)
    n = sum(p.numel() for p in Decoder(config).parameters())
    assert 110e6 < n < 140e6


def test_kvlib_bench_rejects_bad_threads():
    """Check that --threads 0 is a clear error."""
    proc = run_kvlib("bench", "cache", "--threads", "0")
    assert proc.returncode == 2 and "--threads must be at least 1" in proc.stderr
