"""kvlib/measure/bench_*.py: the benchmark runs end to end on a short length and reports every figure
the issue asks for (no assertion on speed: timing claims live in the benchmark's output)."""

import json
import os

import numpy as np
import pytest
import torch
from conftest import ROOT, on_a_terminal, shown_progress

from kvlib.core.configs import gpt2_size_config
from kvlib.core.weights import load_tiny
from kvlib.measure import bench_cache, bench_gqa
from kvlib.measure.llama_child import extra_buffers
from kvlib.measure.peers import llama_cpp_available


def test_growth_fit_recovers_a_known_quadratic():
    """Check that the per-step growth fit returns the coefficients of an exact quadratic."""
    S = np.array([10, 20, 40, 80, 160])
    g = bench_cache._growth(S, 1e-3 + 2e-6 * S + 3e-9 * S**2)
    assert (
        g["a_s"] == pytest.approx(1e-3)
        and g["b_s_per_token"] == pytest.approx(2e-6)
        and g["c_s_per_token2"] == pytest.approx(3e-9)
    )


SHOWN = {}  # what the module fixture's run showed on stderr, a terminal


@pytest.fixture(scope="module")
def quick_cache_report():
    """One short `bench_cache --quick` run (2 interleaved rounds), shared by the tests that read it."""
    with on_a_terminal() as err:
        report = bench_cache.bench_cache(lengths=(8, 16), quick=True)
    SHOWN["cache"] = err.getvalue()
    return report


def test_bench_cache_shows_its_rounds_on_a_terminal(quick_cache_report):
    """Check that `kvlib bench cache` shows a progress bar per model, counting its rounds."""
    for name in ("tiny", "small-stand-in"):
        assert shown_progress(SHOWN["cache"], f"kvlib bench cache: {name}"), SHOWN["cache"][-500:]


def test_bench_cache_reports_every_way_paired_per_round(quick_cache_report):
    """Check that a short run times every way in every round and reports kvlib's speed over each as paired per-round ratios."""
    report = quick_cache_report
    assert report["record"]["threads"] == 1 and report["record"]["torch"]
    assert [r["model"] for r in report["results"]] == ["tiny", "small-stand-in"]
    for r in report["results"]:
        assert r["rounds"] == 2 and {"no_cache", "kvlib", "hf_dynamic", "hf_static"} <= set(r["ways"])
        assert (
            r["ways"]["hf_static"] == "transformers, StaticCache"
            and r["ways"]["hf_dynamic"] == "transformers, DynamicCache"
        )
        assert set(r["ways"]) | set(r["missing"]) == set(bench_cache.WAYS)  # llama.cpp run, or why not said
        assert not r["crashed"], f"a peer crashed on this CPU: {r['crashed']}"  # a crash is a row, and a failure here
        if os.environ.get("KVLIB_PEERS_TEST") == "required":  # CI: llama.cpp ran, set up as this CPU needs
            assert set(bench_cache.LLAMA) <= set(r["ways"])
            info, decided = report["record"]["llama_cpp_system_info"], report["record"]["llama_cpp_extra_buffers"]
            assert decided["on"] == extra_buffers(info)[0]
        assert [row["new_tokens"] for row in r["rows"]] == [8, 16]
        for row in r["rows"]:
            assert set(row["tokens_per_s"]) == set(r["ways"]) and all(v > 0 for v in row["tokens_per_s"].values())
            assert set(row["kvlib_over"]) == set(r["ways"]) - {"kvlib"}
            for s in row["kvlib_over"].values():
                assert s["min"] <= s["median"] <= s["max"]
        exact = {k for k in r["ways"] if k not in bench_cache.INEXACT}
        assert all(r["agreement"][k]["first_difference"] is None for k in exact)  # same greedy tokens, or the run fails
    text = bench_cache.format_cache(report)
    assert "transformers, StaticCache" in text and "kvlib/way" in text and "identical greedy tokens" in text


def test_bench_cache_turns_a_crashed_peer_into_a_row(monkeypatch):
    """Check that a llama.cpp process that kills itself (SIGSEGV) becomes a row saying so, and every other way is still
    measured; a way asked for by name that crashed is what fails the command."""
    if llama_cpp_available() and os.environ.get("KVLIB_PEERS_TEST") != "required":
        pytest.skip(llama_cpp_available())
    monkeypatch.setenv("KVLIB_LLAMA_FAULT", "Q8_0")  # kvlib.measure.llama_child: that model's child segfaults
    tiny, _ = load_tiny()
    with torch.inference_mode():
        r = bench_cache._bench_model("tiny", tiny, (4,), 1, 4, 1, True, True, False)
    assert set(r["crashed"]) == {"llama_q8_0"} and "crashed (signal 11, SIGSEGV)" in r["crashed"]["llama_q8_0"]
    assert {"kvlib", "no_cache", "hf_static", "llama_f32"} <= set(r["ways"]) <= set(r["rows"][0]["tokens_per_s"])
    assert "llama.cpp, Q8_0 weights: crashed (signal 11, SIGSEGV)" in bench_cache.format_cache(
        {"record": {"device": "cpu", "threads": 1, "torch": torch.__version__}, "results": [r]}
    )
    report = {"ways_asked": ["llama_q8_0"], "results": [r]}
    assert bench_cache.crashed_asked(report) == ["llama_q8_0"]
    assert bench_cache.crashed_asked(report | {"ways_asked": None}) == []  # not asked by name: a row, not a failure


def test_bench_cache_refuses_an_unknown_way():
    """Check that --ways names the way it does not know and lists the ones it does, before measuring anything."""
    with pytest.raises(ValueError, match="unknown way.*llama_q4.*choose from no_cache"):
        bench_cache.bench_cache(ways=["llama_q4"])


def test_bench_cache_fails_loudly_when_two_ways_disagree(monkeypatch):
    """Check that a way whose greedy tokens differ from kvlib's stops the run with a message naming both."""
    real = bench_cache._model_ways

    def tampered(*args, **kwargs):
        ways, missing, crashed = real(*args, **kwargs)
        honest = ways["hf_static"]

        def off_by_one(ids, n):
            tokens, stamps = honest(ids, n)
            return tokens[:-1] + [(tokens[-1] + 1) % 7], stamps

        return {**ways, "hf_static": off_by_one}, missing, crashed

    monkeypatch.setattr(bench_cache, "_model_ways", tampered)
    with pytest.raises(RuntimeError, match="transformers, StaticCache and kvlib, KVCache .* disagree"):
        bench_cache.bench_cache(lengths=(6,), quick=True, rounds=1, llama=False)


def test_a_compile_that_fails_is_reported_and_the_run_goes_on(monkeypatch):
    """Check that if torch.compile cannot compile (no C++ compiler...), that way says why and the others are timed."""

    def cannot_compile(model, max_len, autotune=True):
        def run(ids, n):
            raise RuntimeError(
                "torch.compile could not compile the decode step: InvalidCxxCompiler: no working C++ compiler"
            )

        return run

    monkeypatch.setattr(bench_cache, "compiled_way", cannot_compile)
    tiny, _ = load_tiny()
    with torch.inference_mode():
        r = bench_cache._bench_model("tiny", tiny, (4,), 1, 4, 1, True, False, True)
    assert "kvlib_compiled" not in r["ways"] and "InvalidCxxCompiler" in r["missing"]["kvlib_compiled"]
    assert {"kvlib", "hf_static"} <= set(r["ways"])


@pytest.mark.slow
def test_compiled_static_cache_decoding_picks_kvlibs_greedy_tokens():
    """Check that kvlib.measure.compiled (torch.compile of kvlib's model with a static cache) gives
    generate_cached's tokens."""
    from kvlib.core.model import Decoder, ModelConfig
    from kvlib.kv_cache import generate_cached
    from kvlib.measure.compiled import StaticCacheDecoder, compiled_way

    torch.manual_seed(0)
    model = Decoder(
        ModelConfig(vocab_size=50, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=48, max_seq_len=64)
    ).eval()
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    run = compiled_way(model, max_len=40, autotune=False)
    tokens, stamps = run(ids, 20)
    with torch.inference_mode():
        expected = generate_cached(model, ids, 20)[0, 5:].tolist()
    assert tokens == expected and len(stamps) == 20 and stamps == sorted(stamps)
    assert run(ids, 20)[0] == expected  # a second run overwrites the cache from position 0: the same tokens
    with pytest.raises(ValueError, match="at most 40 tokens"):
        run(ids, 36)
    with pytest.raises(ValueError, match="max_len must be in"):
        StaticCacheDecoder(model, 65)


def test_paired_ratio_summary_and_first_difference():
    """Check that the per-round summary gives median, min and max, and where two token lists first differ."""
    assert bench_cache._summary([1.0, 3.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0}
    assert bench_cache._first_difference([1, 2, 3], [1, 2, 3]) is None
    assert bench_cache._first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert bench_cache._first_difference([1, 2], [1, 2, 3]) == 2


def test_decoder_compiles_to_one_graph():
    """Check that torch.compile traces a decode step as one graph with no break (check_input's host read is skipped)."""
    import torch

    from kvlib.core.model import Decoder, ModelConfig

    model = Decoder(
        ModelConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, hidden_dim=64, max_seq_len=16)
    ).eval()
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(torch.tensor([[3]]))
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)
    with pytest.raises(ValueError, match="token ids must lie in"):  # eager, the range check still runs
        model(torch.tensor([[64]]))


def test_bench_memory_takes_the_highest_of_five_kernels_as_the_ceiling():
    """Check that the ceiling is the highest rate of read, copy, triad, multi-stream read and matrix-vector,
    each reported."""
    from kvlib.measure import bench_memory

    with on_a_terminal() as err:
        run = bench_memory.bench_memory(quick=True)["runs"][0]
    assert shown_progress(err.getvalue(), "kvlib bench memory: cpu")  # its rounds, on a terminal
    rates = run["bandwidth_per_kernel"]
    assert set(rates) == {"read", "copy", "triad", "multi_read", "gemv"}
    assert run["bandwidth"] == max(rates.values()) and rates[run["bandwidth_kernel"]] == run["bandwidth"]
    assert run["decode"]["fraction_of_bandwidth"] == pytest.approx(
        run["decode"]["achieved_bytes_per_s"] / run["bandwidth"]
    )
    text = bench_memory.format_memory({"date": "d", "quick": True, "record": {"torch": "t"}, "runs": [run]})
    assert "ceiling" in text and "multi-stream read" in text
    assert (
        run["gemv"]["other_order_bytes_per_s"] > 0
    )  # the same matrices in the memory order decode_layout did not pick
    assert "the other memory order" in text
    assert "compiled" not in run["decode"]  # --quick compiles nothing
    compiled = {**run, "decode": {**run["decode"], "compiled": run["decode"]}}
    assert "inductor, weights frozen" in bench_memory.format_memory(
        {"date": "d", "quick": False, "record": {"torch": "t"}, "runs": [compiled]}
    )
    below = {**run, "decode": {**run["decode"], "measured_over_predicted": 0.8}}
    assert "is below 1" in bench_memory.format_memory(
        {"date": "d", "quick": True, "record": {"torch": "t"}, "runs": [below]}
    )


def test_datasheet_names_a_gpu_only_where_one_entry_fits():
    """Check that a device name finds its datasheet only where exactly one entry fits it."""
    from kvlib.measure.bench_memory import datasheet

    assert datasheet("NVIDIA H200").name == "H200 SXM"
    assert datasheet("NVIDIA A100-SXM4-80GB") is None  # several A100 entries, none named by all its words
    assert datasheet("AMD EPYC") is None


def test_gqa_fixed_part_is_the_intercept_of_a_line_per_round():
    """Check that the fixed part is recovered, round by round, from step times that grow linearly with kv_len."""
    lens = [4096, 8192, 16384]
    per_len = [[2e-3 + 1e-6 * S, 3e-3 + 1e-6 * S] for S in lens]  # two rounds with fixed parts 2 ms and 3 ms
    assert bench_gqa._intercepts(lens, per_len) == pytest.approx([2e-3, 3e-3])


def test_gpt2_size_config_is_about_124m_parameters():
    """Check that the GPT-2-size stand-in has GPT-2 small's shape and 110-140M weights."""
    from kvlib.core.model import Decoder

    config = gpt2_size_config()
    assert (config.n_layers, config.n_heads, config.d_model) == (12, 12, 768)
    n = sum(p.numel() for p in Decoder(config).parameters())
    assert 110e6 < n < 140e6


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a GPU is here: --device cuda would run")
def test_kvlib_bench_device_cuda_without_a_gpu_is_a_clear_error(capsys):
    """Check that --device cuda names the problem where torch sees no GPU (the options of each benchmark and the
    other bad inputs are tests/test_cli.py's)."""
    from kvlib.app import cli

    assert cli.main(["bench", "gqa", "--device", "cuda", "--quick", "--reference"]) == 2
    assert "sees no CUDA GPU" in capsys.readouterr().err


RECORDINGS = sorted((ROOT / "assets" / "recordings").glob("*.json"))


@pytest.mark.parametrize("path", RECORDINGS, ids=[p.name for p in RECORDINGS])
def test_shipped_gpu_recordings_say_what_made_them(path):
    """Check that each shipped recording names a known benchmark, its date, a CUDA device with its torch, and
    has numbers that agree.

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
    assert "nvidia-smi" in script  # the card's clocks and driver beside the numbers
