"""The memory wall (notebook 05-memory-wall): why decode waits on memory, predicted then measured.

A step costs FLOPs (arithmetic) and bytes (weights and KV cache fetched from memory); the slower
sets the time: the roofline (Williams, Waterman and Patterson, CACM 2009). Its x-axis is arithmetic
intensity, FLOPs per byte; a device's ridge point, peak FLOP/s / bandwidth, splits memory-bound
(left) from compute-bound (right). Counts follow notebook 03: 2 FLOPs per multiply-add, matrix
multiplies only; bytes are the matrix weights plus the KV cache, each read once (activations and
norms are tiny, left out). Left out: caches between memory levels, multi-GPU.
"""

from __future__ import annotations

import math

import torch

from kvlib.core.model import matrix_params
from kvlib.course import inputs
from kvlib.course.exercises import exercise
from kvlib.kv_cache import kv_cache_bytes  # Exercise 4.4

# ---------------------------------------------------------------------------------------------
# Helpers the notebook calls


def bytes_per_element(dtype: torch.dtype) -> int:
    """Bytes one number of dtype occupies: 4 for float32, 2 for float16/bfloat16, 1 for int8."""
    inputs.check_dtype(dtype)
    return torch.empty((), dtype=dtype).element_size()


def roofline_time(flops: float, bytes_moved: float, peak_flops: float, bandwidth: float) -> float:
    """Seconds a step takes under the roofline: max(flops / peak_flops, bytes_moved / bandwidth).

    Not the sum: compute and memory traffic overlap, so the slower of the two sets the time.
    Example: roofline_time(2e9, 1e9, 1e12, 1e9) == 1.0 (memory-bound: 1 s of traffic, 2 ms of math)
    """
    inputs.check_roofline(flops, bytes_moved, peak_flops, bandwidth)
    return max(flops / peak_flops, bytes_moved / bandwidth)


# ---------------------------------------------------------------------------------------------
# Exercises 5.1 and 5.2: the roofline of one operation


@exercise("5.1", validate=inputs.check_matmul)
def matmul_intensity(m: int, k: int, n: int, dtype: torch.dtype = torch.float16) -> float:
    """Arithmetic intensity (FLOPs per byte) of (m, k) @ (k, n) -> (m, n), each matrix moved once.

    FLOPs: one multiply-add per (row, column, inner index), 2 FLOPs each. Bytes: read both
    inputs and write the output once, at bytes_per_element(dtype) each.
    Example: matmul_intensity(1, 4096, 4096, torch.float16) is about 1.0 (decode at batch 1)

    Hints (reference solution: 3 lines):
      1. torch.empty((), dtype=dtype).element_size() is the size in bytes, not bits.
      2. Count the output (m, n) too: it has to be written back.
    """
    raise NotImplementedError("Exercise 5.1 (notebooks/05-memory-wall): matmul_intensity")


@exercise("5.2", validate=inputs.check_ridge_batch)
def ridge_batch(k: int, n: int, peak_flops: float, bandwidth: float, dtype: torch.dtype = torch.float16) -> int | None:
    """Fewest rows m at which (m, k) @ (k, n) reaches the device's ridge point (peak_flops / bandwidth).

    Rows are the tokens a layer processes at once. Below this m the step is memory-bound: a bigger
    batch adds tokens for free (same time, more throughput); from it on, each row adds time (latency).
    None if no m gets there: the intensity only approaches 2kn / ((k + n) * bytes) as m grows.
    Example: ridge_batch(4096, 4096, 989e12, 3.35e12) == 345 (an H100's 16-bit tensor cores)

    Hints (reference solution: 5 lines):
      1. Exercise 5.1 in a loop over m is right, but first decide whether any m can get there.
      2. Or solve 2mkn >= ridge * bytes * (mk + kn + mn) for m, and round UP (math.ceil).
    """
    raise NotImplementedError("Exercise 5.2 (notebooks/05-memory-wall): ridge_batch")


# ---------------------------------------------------------------------------------------------
# Exercises 5.3 and 5.4: a model's decode step on the roofline


@exercise("5.3", validate=inputs.check_step)
def step_cost(
    config, new_tokens: int, kv_len: int, batch: int = 1, dtype: torch.dtype = torch.float16
) -> tuple[int, int]:
    """(FLOPs, bytes) of one forward step: new_tokens tokens per sequence against kv_len cached ones.

    Decode is step_cost(config, 1, kv_len); a prefill of T tokens is step_cost(config, T, T).
    FLOPs, for every sequence of the batch: 2 per weight of matrix_params(config) per new token,
    plus attention, 2 * new_tokens * kv_len * head_dim per head and layer, twice (scores, values).
    Bytes: every matrix weight read once, whatever the batch, plus the KV cache of kv_len tokens.
    Example: step_cost(config, 1, 1) FLOPs == 2 * matrix_params(config) + 4 * n_layers * n_heads * head_dim

    Hints (reference solution: 4 lines):
      1. The batch multiplies the FLOPs and the KV bytes, not the weight bytes: that is why batching helps.
      2. The cache's bytes: kv_cache_bytes, Exercise 4.4 (imported at the top of this file).
    """
    raise NotImplementedError("Exercise 5.3 (notebooks/05-memory-wall): step_cost")


@exercise("5.4", validate=inputs.check_predicted)
def predicted_tokens_per_second(
    config, kv_len: int, batch: int, dtype: torch.dtype, peak_flops: float, bandwidth: float
) -> float:
    """Tokens per second that decode at kv_len cached tokens can reach on a device, by the roofline.

    One decode step makes one new token for each of batch sequences.
    Example: Llama-2-7B, kv_len 1, batch 1, float16 on an A100 80GB SXM (2,039 GB/s): about 154

    Hints (reference solution: 2 lines):
      1. Exercise 5.3 for the cost of one step, then roofline_time (top of this file) for its time.
    """
    raise NotImplementedError("Exercise 5.4 (notebooks/05-memory-wall): predicted_tokens_per_second")


# ---------------------------------------------------------------------------------------------
# A consequence (no exercise): where decode turns compute-bound


def compute_bound_batch(
    config, kv_len: int, peak_flops: float, bandwidth: float, dtype: torch.dtype = torch.float16, limit: int = 1 << 16
) -> int | None:
    """Smallest batch whose decode step reaches the ridge point (None if not below `limit`).

    With a long cache the KV bytes grow with the batch as fast as the FLOPs do, so the batch
    may never get there: that is the point of notebook 06.
    """
    ridge = peak_flops / bandwidth

    def intensity(batch):
        flops, bytes_moved = step_cost(config, 1, kv_len, batch, dtype)
        return flops / bytes_moved

    if intensity(limit) < ridge:
        return None
    low, high = 1, limit  # intensity grows with batch: bisect for the first batch at the ridge
    while low < high:
        mid = (low + high) // 2
        low, high = (mid + 1, high) if intensity(mid) < ridge else (low, mid)
    return low
