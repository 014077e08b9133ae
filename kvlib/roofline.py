"""The memory wall (notebook 05-memory-wall): why decode waits on memory, predicted then measured.

A step of a model costs FLOPs (work for the arithmetic units) and bytes (weights and KV cache
fetched from memory). Whichever takes longer sets the time: that is the roofline (Williams,
Waterman and Patterson, CACM 2009). Its x-axis is arithmetic intensity, FLOPs per byte moved;
a device's ridge point, peak FLOP/s / bandwidth, splits memory-bound (left) from
compute-bound (right). Decode at batch 1 reads every weight for ~2 FLOPs each: far left.

Here: the exercises (5.1-5.5) and what follows from them; the notebook takes real GPUs from
kvlib.core.devices and this machine's measurements from kvlib.measure.machine. Counts follow
notebook 03: 2 FLOPs per multiply-add, matrix multiplies only; bytes are the matrix weights read
once plus the KV cache read once (activations, norms and the embedding rows a step looks up are
left out: they are tiny). Left out: overlap of prefill and decode, caches between memory levels, multi-GPU.
"""
from __future__ import annotations

import torch

from kvlib.core.model import matrix_params
from kvlib.course.exercises import exercise
from kvlib.course.inputs import check_dtype, check_kv_cache_bytes, check_matmul, check_predicted, check_roofline, check_step

# ---------------------------------------------------------------------------------------------
# Helpers the notebook calls


def bytes_per_element(dtype: torch.dtype) -> int:
    """Bytes one number of dtype occupies: 4 for float32, 2 for float16/bfloat16, 1 for int8."""
    check_dtype(dtype)
    return torch.empty((), dtype=dtype).element_size()


def attainable_flops(intensity, peak_flops: float, bandwidth: float):
    """The roof: min(peak, intensity * bandwidth), FLOP/s, for a number or a tensor of intensities."""
    if isinstance(intensity, torch.Tensor):
        return torch.clamp(intensity * bandwidth, max=peak_flops)
    return min(peak_flops, intensity * bandwidth)


# ---------------------------------------------------------------------------------------------
# Exercises 5.1 and 5.2: the roofline of one operation


@exercise("5.1", validate=check_matmul)
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


@exercise("5.2", validate=check_roofline)
def roofline_time(flops: float, bytes_moved: float, peak_flops: float, bandwidth: float) -> float:
    """Seconds a step takes under the roofline: the slower of computing and moving the data.

    Compute and memory traffic overlap, so the time is the larger of flops / peak_flops and
    bytes_moved / bandwidth (peak_flops in FLOP/s, bandwidth in bytes/s).
    Example: roofline_time(2e9, 1e9, 1e12, 1e9) == 1.0 (memory-bound: 1 s of traffic, 2 ms of math)

    Hints (reference solution: 1 line):
      1. Not the sum: while the memory delivers, the arithmetic units work on what has arrived.
    """
    raise NotImplementedError("Exercise 5.2 (notebooks/05-memory-wall): roofline_time")


# ---------------------------------------------------------------------------------------------
# Exercises 5.3 to 5.5: a model's decode step on the roofline


@exercise("5.3", validate=check_kv_cache_bytes)
def kv_cache_bytes(config, seq_len: int, batch: int = 1, dtype: torch.dtype = torch.float16) -> int:
    """Bytes of the KV cache holding seq_len tokens for each of batch sequences.

    Every layer keeps a key and a value vector of head_dim numbers per KV head per token.
    Example: Llama-2-7B (32 layers, 32 KV heads, head_dim 128) in float16: 512 KiB per token

    Hints (reference solution: 2 lines):
      1. Keys and values: a factor 2. Layers, KV heads (config.n_kv_heads, not n_heads), head_dim.
      2. Bytes, not bits: bytes_per_element(dtype).
    """
    raise NotImplementedError("Exercise 5.3 (notebooks/05-memory-wall): kv_cache_bytes")


@exercise("5.4", validate=check_step)
def step_cost(config, new_tokens: int, kv_len: int, batch: int = 1, dtype: torch.dtype = torch.float16) -> tuple[int, int]:
    """(FLOPs, bytes) of one forward step: new_tokens tokens per sequence against kv_len cached ones.

    Decode is step_cost(config, 1, kv_len); a prefill of T tokens is step_cost(config, T, T).
    FLOPs, for every sequence of the batch: 2 per weight of matrix_params(config) per new token,
    plus attention, 2 * new_tokens * kv_len * head_dim per head and layer, twice (scores, values).
    Bytes: every matrix weight read once, whatever the batch, plus the KV cache of kv_len tokens.
    Example: step_cost(config, 1, 1) FLOPs == 2 * matrix_params(config) + 4 * n_layers * n_heads * head_dim

    Hints (reference solution: 4 lines):
      1. The batch multiplies the FLOPs and the KV bytes, not the weight bytes: that is why batching helps.
      2. Reuse Exercise 5.3 for the cache.
    """
    raise NotImplementedError("Exercise 5.4 (notebooks/05-memory-wall): step_cost")


@exercise("5.5", validate=check_predicted)
def predicted_tokens_per_second(config, kv_len: int, batch: int, dtype: torch.dtype,
                                peak_flops: float, bandwidth: float) -> float:
    """Tokens per second that decode at kv_len cached tokens can reach on a device, by the roofline.

    One decode step makes one new token for each of batch sequences.
    Example: Llama-2-7B, kv_len 1, batch 1, float16 on an A100 80GB SXM (2,039 GB/s): about 154

    Hints (reference solution: 2 lines):
      1. Exercises 5.4 and 5.2: the cost of one step, then its time.
    """
    raise NotImplementedError("Exercise 5.5 (notebooks/05-memory-wall): predicted_tokens_per_second")


# ---------------------------------------------------------------------------------------------
# Consequences (no exercise): where decode turns compute-bound, where the cache outweighs the weights


def compute_bound_batch(config, kv_len: int, peak_flops: float, bandwidth: float,
                        dtype: torch.dtype = torch.float16, limit: int = 1 << 16) -> int | None:
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


def kv_matches_weights(config, weight_bytes: int, batch: int = 1, dtype: torch.dtype = torch.float16) -> float:
    """kv_len (cached tokens per sequence) at which the KV cache of `batch` sequences weighs as much as the weights."""
    return weight_bytes / kv_cache_bytes(config, 1, batch, dtype)
