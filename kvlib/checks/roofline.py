"""Checks for notebook 05 (kvlib/roofline.py): exercises 5.1-5.5.

The calculators are checked on configurations whose layers, heads and KV heads all differ (a
made-up GQA model, Llama-2-70B, Falcon-7B's MQA), in float32 and 16-bit, so a missing factor
cannot hide; FLOPs are compared with torch's own FLOP counter. The known slips are named:
2 FLOPs per multiply-add, bits for bytes, the factor 2 for K and V, the layers, n_heads for
n_kv_heads, the batch multiplying the weights, the sum of compute and memory time.
"""
from __future__ import annotations

import math

import torch

from kvlib.checks import check
from kvlib.core.configs import REAL_MODELS
from kvlib.core.model import Decoder, ModelConfig

# every size distinct: vocab, width, layers, heads, KV heads, MLP width
ODD = ModelConfig(vocab_size=50, d_model=48, n_layers=3, n_heads=6, n_kv_heads=2, hidden_dim=80, max_seq_len=64)
LLAMA2_70B = REAL_MODELS["Llama-2-70B"].config  # 80 layers, 64 heads, 8 KV heads
FALCON_7B = REAL_MODELS["Falcon-7B"].config  # 32 layers, 71 heads, 1 KV head (MQA)
LLAMA2_7B = REAL_MODELS["Llama-2-7B"].config


def _bytes(dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _matrix_params(c) -> int:
    C, D, H, H_kv = c.d_model, c.head_dim, c.n_heads, c.n_kv_heads
    return c.n_layers * (C * H * D + 2 * C * H_kv * D + H * D * C + 3 * C * c.hidden_dim) + C * c.vocab_size


def _kv(c, seq_len, batch, dtype) -> int:
    return 2 * c.n_layers * c.n_kv_heads * c.head_dim * _bytes(dtype) * seq_len * batch


def _close(a, b, rel=1e-9) -> bool:
    return math.isclose(a, b, rel_tol=rel)


# ---------------------------------------------------------------------------------------------
# 5.1 matmul_intensity


@check("5.1")
def matmul_intensity_counts_flops_and_bytes(kv, rng):
    """Check the FLOPs per byte of matmuls of distinct sizes, in float32, bfloat16 and float16."""
    for (m, k, n), dtype in (((3, 5, 7), torch.float32), ((64, 96, 80), torch.bfloat16), ((1, 4096, 4096), torch.float16)):
        b = _bytes(dtype)
        got = kv.matmul_intensity(m, k, n, dtype)
        assert isinstance(got, float), f"matmul_intensity should return a float, got {type(got).__name__}"
        flops, moved = 2 * m * k * n, (m * k + k * n + m * n) * b
        expected = flops / moved
        hints = {
            expected / 2: "exactly half: a multiply-add is 2 FLOPs",
            expected / 8: "8 times too small: count bytes, not bits (element_size(), not finfo().bits)",
            flops / ((m * k + k * n) * b): "the output (m, n) is written back to memory too: count its bytes",
            2 * m * k * n / (m * k + k * n + m * n): "the element size is missing: divide by bytes, not by numbers",
        }
        for wrong, hint in hints.items():
            if _close(got, wrong) and not _close(got, expected):
                raise AssertionError(f"({m}, {k}) @ ({k}, {n}) in {dtype}: {hint}")
        assert _close(got, expected), f"({m}, {k}) @ ({k}, {n}) in {dtype}: expected {expected:.4f} FLOP/byte, got {got:.4f}"


@check("5.1")
def matmul_intensity_of_decode_is_about_one(kv, rng):
    """Check that one token through a 4096 x 4096 layer in 16-bit does about 1 FLOP per byte, and a batch more."""
    decode = kv.matmul_intensity(1, 4096, 4096, torch.float16)
    assert 0.99 < decode < 1.0, f"a matrix-vector product in 16-bit does ~1 FLOP per byte (2 FLOPs per 2-byte weight), got {decode:.3f}"
    batched = [kv.matmul_intensity(m, 4096, 4096, torch.float16) for m in (1, 16, 256)]
    assert batched == sorted(batched) and batched[-1] > 100, (
        f"more rows reuse each weight: intensity should climb with m, got {[round(x, 1) for x in batched]}"
    )


# ---------------------------------------------------------------------------------------------
# 5.2 roofline_time


@check("5.2")
def roofline_time_takes_the_slower(kv, rng):
    """Check the roofline time when memory sets it, when compute sets it, and at the ridge."""
    for flops, moved, peak, bw in ((2e9, 1e9, 1e12, 1e9), (8e12, 1e6, 2e12, 5e11), (3e9, 1.5e9, 4e12, 2e12)):
        got = kv.roofline_time(flops, moved, peak, bw)
        compute, memory = flops / peak, moved / bw
        if _close(got, compute + memory) and not _close(compute + memory, max(compute, memory)):
            raise AssertionError("that is the sum: compute and memory traffic overlap, so the time is the larger of the two")
        if _close(got, min(compute, memory)) and not _close(compute, memory):
            raise AssertionError("that is the faster of the two: the step waits for the slower one (max, not min)")
        assert _close(got, max(compute, memory)), (
            f"{flops:.0e} FLOPs and {moved:.0e} bytes at {peak:.0e} FLOP/s and {bw:.0e} B/s: "
            f"expected {max(compute, memory):.4g} s, got {got!r}"
        )


# ---------------------------------------------------------------------------------------------
# 5.3 kv_cache_bytes


@check("5.3")
def kv_cache_bytes_of_real_models(kv, rng):
    """Check KiB per token in float16 for Falcon-7B's MQA (8), Llama-2-70B (320) and Llama-2-7B (512)."""
    # MQA first: its 71 query heads per KV head cannot be mistaken for the 8 of bits for bytes
    for name, c, kib in (("Falcon-7B", FALCON_7B, 8), ("Llama-2-70B", LLAMA2_70B, 320), ("Llama-2-7B", LLAMA2_7B, 512)):
        got = kv.kv_cache_bytes(c, 1, 1, torch.float16)
        assert isinstance(got, int), f"kv_cache_bytes should return an int number of bytes, got {type(got).__name__}"
        expected = kib * 1024
        hints = {
            expected // 2: "exactly half: keys and values are both cached (the factor 2)",
            expected // c.n_layers: "every layer keeps its own keys and values: multiply by n_layers",
            expected * c.n_heads // c.n_kv_heads: "the cache holds n_kv_heads heads, not n_heads (this model shares them)",
            expected * 8: "8 times too large: count bytes, not bits",
        }
        for wrong, hint in hints.items():
            if got == wrong and wrong != expected:
                raise AssertionError(f"{name}: {hint}")
        assert got == expected, f"{name} in float16: expected {kib} KiB ({expected:,} bytes) per token, got {got:,}"


@check("5.3")
def kv_cache_bytes_scales_with_tokens_batch_and_dtype(kv, rng):
    """Check the cache of several tokens and sequences, in float32 and bfloat16, on a small GQA config."""
    for seq_len, batch, dtype in ((5, 3, torch.float32), (17, 2, torch.bfloat16), (0, 4, torch.float32)):
        got = kv.kv_cache_bytes(ODD, seq_len, batch, dtype)
        expected = _kv(ODD, seq_len, batch, dtype)
        if seq_len and got == _kv(ODD, seq_len, 1, dtype):
            raise AssertionError("every sequence of the batch has its own cache: multiply by batch")
        if seq_len and _bytes(dtype) != 2 and got == _kv(ODD, seq_len, batch, torch.float16):
            raise AssertionError(f"the element size depends on dtype: {dtype} takes {_bytes(dtype)} bytes")
        assert got == expected, f"{seq_len} tokens x batch {batch} in {dtype}: expected {expected:,} bytes, got {got:,}"


# ---------------------------------------------------------------------------------------------
# 5.4 step_cost


@check("5.4")
def step_cost_flops_match_torch_counter(kv, rng):
    """Check prefill FLOPs against torch's FLOP counter at batch 2, and decode FLOPs against the formula."""
    from kvlib.recompute import measured_forward_flops

    torch.manual_seed(0)
    model = Decoder(ODD).eval()
    for T in (1, 6):
        flops, _ = kv.step_cost(ODD, T, T, 2, torch.float32)
        expected = measured_forward_flops(model, T, batch=2)
        if flops * 2 == expected:
            raise AssertionError("every sequence of the batch does the same work again: multiply the FLOPs by batch")
        assert flops == expected, f"prefill of {T} tokens at batch 2: torch counts {expected:,} FLOPs, step_cost says {flops:,}"
    L, H, D = ODD.n_layers, ODD.n_heads, ODD.head_dim
    for S in (1, 30):
        flops, _ = kv.step_cost(ODD, 1, S, 3, torch.float32)
        expected = 3 * (2 * _matrix_params(ODD) + L * H * 4 * S * D)
        assert flops == expected, f"decode at kv_len {S}, batch 3: expected {expected:,} FLOPs, got {flops:,}"


@check("5.4")
def step_cost_bytes_read_weights_once(kv, rng):
    """Check bytes: weights once per step whatever the batch, plus each sequence's KV cache, by dtype."""
    for c, name in ((ODD, "a small GQA config"), (LLAMA2_70B, "Llama-2-70B")):
        for S, batch, dtype in ((1, 1, torch.float16), (40, 4, torch.float32), (4096, 16, torch.bfloat16)):
            _, got = kv.step_cost(c, 1, S, batch, dtype)
            weights, cache = _matrix_params(c) * _bytes(dtype), _kv(c, S, batch, dtype)
            where = f"{name}, kv_len {S}, batch {batch}, {dtype}"
            if batch > 1 and got == weights * batch + cache:
                raise AssertionError(f"{where}: the weights are read once per step and shared by the whole batch; do not multiply them by batch")
            if got == weights:
                raise AssertionError(f"{where}: the KV cache of kv_len tokens is read too")
            if got == cache:
                raise AssertionError(f"{where}: every matrix weight is read once per step too")
            assert got == weights + cache, f"{where}: expected {weights + cache:,} bytes, got {got:,}"


@check("5.4")
def step_cost_decode_is_memory_bound(kv, rng):
    """Check that decode of Llama-2-7B in 16-bit does ~1 FLOP per byte at batch 1, and far more at batch 64."""
    flops, moved = kv.step_cost(LLAMA2_7B, 1, 1, 1, torch.float16)
    assert 0.95 < flops / moved < 1.05, f"Llama-2-7B decode at batch 1 in 16-bit: expected ~1 FLOP per byte, got {flops / moved:.2f}"
    flops, moved = kv.step_cost(LLAMA2_7B, 1, 1, 64, torch.float16)
    assert flops / moved > 50, f"at batch 64 each weight read serves 64 tokens: expected ~64 FLOPs per byte, got {flops / moved:.1f}"


# ---------------------------------------------------------------------------------------------
# 5.5 predicted_tokens_per_second


@check("5.5")
def predicted_tokens_per_second_on_an_a100(kv, rng):
    """Check Llama-2-7B at batch 1 on an A100 80GB SXM in 16-bit: about 154 tokens/s, set by bandwidth."""
    got = kv.predicted_tokens_per_second(LLAMA2_7B, 1, 1, torch.float16, 312e12, 2039e9)
    expected = 2039e9 / (_matrix_params(LLAMA2_7B) * 2 + _kv(LLAMA2_7B, 1, 1, torch.float16))
    assert isinstance(got, float), f"predicted_tokens_per_second should return a float, got {type(got).__name__}"
    if _close(got, 1 / expected):
        raise AssertionError("that is seconds per token: tokens per second is its inverse")
    assert _close(got, expected, 1e-6), f"expected {expected:.1f} tokens/s (13.2 GB of weights at 2,039 GB/s), got {got:.1f}"


@check("5.5")
def predicted_tokens_per_second_counts_the_batch(kv, rng):
    """Check a batch of sequences and a long cache on a small GQA config, memory- and compute-bound."""
    L, H, D = ODD.n_layers, ODD.n_heads, ODD.head_dim
    for S, batch, peak, bw in ((30, 4, 1e12, 1e9), (30, 8, 1e9, 1e12)):
        flops = batch * (2 * _matrix_params(ODD) + L * H * 4 * S * D)
        moved = _matrix_params(ODD) * 4 + _kv(ODD, S, batch, torch.float32)
        step = max(flops / peak, moved / bw)
        got = kv.predicted_tokens_per_second(ODD, S, batch, torch.float32, peak, bw)
        if _close(got, 1 / step):
            raise AssertionError(f"one step makes a token for each of the {batch} sequences: tokens/s is batch / step time")
        assert _close(got, batch / step, 1e-6), f"kv_len {S}, batch {batch}: expected {batch / step:.4g} tokens/s, got {got:.4g}"
