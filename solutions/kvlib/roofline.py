"""The memory wall (notebook 05-memory-wall): why decode waits on memory, predicted then measured.

A step costs FLOPs (arithmetic) and bytes (what it must fetch from memory); the roofline (Williams,
Waterman and Patterson, CACM 2009) says which of the two sets its time. Its x-axis is arithmetic
intensity, FLOPs per byte; a device's ridge point, peak FLOP/s / bandwidth, splits memory-bound
(left) from compute-bound (right). Counts follow notebook 03: 2 FLOPs per multiply-add, matrix
multiplies only (activations and norms are tiny, left out). Left out: caches between memory levels,
multi-GPU.
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


# ---------------------------------------------------------------------------------------------
# Exercises 5.1 and 5.2: the roofline of one operation


@exercise("5.1", validate=inputs.check_matmul)
def matmul_intensity(m: int, k: int, n: int, dtype: torch.dtype = torch.float16) -> float:
    """Arithmetic intensity, FLOPs per byte, of the product (m, k) @ (k, n) -> (m, n).

    FLOPs as notebook 03 counts them (a multiply-add is 2). Bytes: the least traffic between memory and the chip
    the product needs, no number crossing twice, at dtype's size.
    Args:    m, k, n: positive ints;  dtype: a torch dtype (its size in bytes counts, not bits)
    Returns: float FLOPs per byte
    Raises:  ValueError if a size is not a positive int or dtype is not a torch.dtype
    Example:
        >>> round(matmul_intensity(1, 4096, 4096, torch.float16), 3)  # a decode step's matrix-vector product
        1.0
    """
    ### BEGIN SOLUTION
    flops = 2 * m * k * n
    bytes_moved = (m * k + k * n + m * n) * bytes_per_element(dtype)
    return flops / bytes_moved
    ### END SOLUTION


@exercise("5.2", validate=inputs.check_ridge_batch)
def ridge_batch(k: int, n: int, peak_flops: float, bandwidth: float, dtype: torch.dtype = torch.float16) -> int | None:
    """Fewest rows m at which (m, k) @ (k, n) reaches the device's ridge point, peak_flops / bandwidth.

    Rows are the tokens a layer processes at once: below this m a step is memory-bound (more rows come
    free), from it on compute-bound. The intensity of Exercise 5.1 grows with m but stays below a limit.
    Args:    k, n: positive ints;  peak_flops (FLOP/s), bandwidth (bytes/s): positive;  dtype: a torch dtype
    Returns: int m >= 1, or None if no number of rows reaches the ridge
    Raises:  ValueError if a size or rate is not positive, or dtype is not a torch.dtype
    Example:
        >>> ridge_batch(1024, 1024, 100e12, 1e12)  # a made-up device: 100 TFLOP/s in 16-bit, 1 TB/s
        125
    """
    ### BEGIN SOLUTION
    ridge, b = peak_flops / bandwidth, bytes_per_element(dtype)
    # 2mkn >= ridge * b * (mk + kn + mn)  <=>  m * (2kn - ridge * b * (k + n)) >= ridge * b * k * n
    slope = 2 * k * n - ridge * b * (k + n)
    if slope <= 0:  # even infinitely many rows stay below the ridge
        return None
    return max(1, math.ceil(ridge * b * k * n / slope))  # at least one row
    ### END SOLUTION


# ---------------------------------------------------------------------------------------------
# Exercises 5.3 (find and fix: the learner's copy ships with a bug) and 5.4: a model's decode step on the roofline


@exercise("5.3", validate=inputs.check_step)
def step_cost(
    config, new_tokens: int, kv_len: int, batch: int = 1, dtype: torch.dtype = torch.float16
) -> tuple[int, int]:
    """(FLOPs, bytes) of one forward step of batch sequences, each feeding new_tokens tokens against kv_len positions.

    Shipped with a bug (Exercise 5.3 is a find-and-fix): the checks show what goes wrong; the contract is below.

    Decode is step_cost(config, 1, kv_len); a prefill of T tokens is step_cost(config, T, T). FLOPs as notebook 03
    counts them: the matrix products, attention's included, 2 per multiply-add. Bytes: the least the step must
    bring from memory for the whole batch, no number twice, in dtype; activations, norms and the embedding's one
    row are left out.
    Args:    config: a ModelConfig;  new_tokens, kv_len, batch: positive ints, new_tokens <= kv_len;  dtype: a torch dtype
    Returns: (flops, bytes), two ints
    Raises:  ValueError if a count is not a positive int, new_tokens > kv_len, or dtype is not a torch.dtype
    Example:
        >>> from kvlib.core.model import ModelConfig
        >>> step_cost(ModelConfig(vocab_size=50), 4, 10, batch=2, dtype=torch.float32)  # 4 new tokens, 10 keys, 2 sequences
        (10752000, 2728960)
    """
    ### BEGIN SOLUTION
    L, H, D = config.n_layers, config.n_heads, config.head_dim
    flops = batch * (2 * new_tokens * matrix_params(config) + L * H * 4 * new_tokens * kv_len * D)
    weights = matrix_params(config) * bytes_per_element(dtype)
    return flops, weights + kv_cache_bytes(config, kv_len, batch, dtype)
    ### END SOLUTION
    ### BEGIN SHIPPED
    # L, H, D = config.n_layers, config.n_heads, config.head_dim
    # flops = 2 * new_tokens * matrix_params(config) + L * H * 4 * new_tokens * kv_len * D  # one sequence's products
    # moved = matrix_params(config) * bytes_per_element(dtype) + kv_cache_bytes(config, kv_len, 1, dtype)  # its reads
    # return batch * flops, batch * moved  # every sequence of the batch
    ### END SHIPPED


@exercise("5.4", validate=inputs.check_predicted)
def predicted_tokens_per_second(
    config, kv_len: int, batch: int, dtype: torch.dtype, peak_flops: float, bandwidth: float
) -> float:
    """Tokens per second, all batch sequences together, that decode at kv_len cached tokens reaches by the roofline.

    The device is its peak FLOP/s and its bandwidth, and it computes while it moves data (the roofline).
    Args:    config: a ModelConfig;  kv_len, batch: positive ints;  dtype: a torch dtype
             peak_flops (FLOP/s), bandwidth (bytes/s): the device's, positive
    Returns: float tokens per second, all sequences together
    Raises:  ValueError if a count is not a positive int, a rate is not positive, or dtype is not a torch.dtype
    Example:
        >>> from kvlib.core.configs import real_model
        >>> round(predicted_tokens_per_second(real_model("Llama-2-7B").config, 1, 1, torch.float16, 312e12, 2.039e12))
        154
    """
    ### BEGIN SOLUTION
    flops, bytes_moved = step_cost(config, 1, kv_len, batch, dtype)
    return batch / max(flops / peak_flops, bytes_moved / bandwidth)  # the slower of compute and memory, not their sum
    ### END SOLUTION


# ---------------------------------------------------------------------------------------------
# Exercise 5.5: predict, then measure: the batch at which decode turns compute-bound


@exercise("5.5", validate=inputs.check_compute_bound)
def compute_bound_batch(
    config, kv_len: int, peak_flops: float, bandwidth: float, dtype: torch.dtype = torch.float16
) -> int | None:
    """Your prediction: the fewest sequences a decode step must batch to reach the device's ridge point.

    The step is Exercise 5.3's: one new token for each of `batch` sequences, each against kv_len cached
    tokens, in dtype; the ridge is peak_flops / bandwidth, in FLOPs per byte. Notebook 05 then times decode
    at growing batches on your machine to see where its throughput stops growing.
    Args:    config: a ModelConfig;  kv_len: positive int;  peak_flops (FLOP/s), bandwidth (bytes/s): positive
             dtype: a torch dtype
    Returns: int batch >= 1 whose step reaches the ridge while batch - 1's does not, or None if no batch does
    Raises:  ValueError if config is not a ModelConfig, kv_len is not a positive int, a rate is not positive, or
             dtype is not a torch.dtype
    Example:
        >>> from kvlib.core.configs import real_model
        >>> compute_bound_batch(real_model("Llama-2-7B").config, 1, 989e12, 3.35e12)  # an H100's tensor cores
        299
    """
    ### BEGIN SOLUTION
    flops, moved = step_cost(config, 1, kv_len, 1, dtype)  # one sequence's step
    cache = step_cost(config, 1, kv_len, 2, dtype)[1] - moved  # what a second sequence adds: its own cache...
    weights = moved - cache  # ...the rest the weights, read once whatever the batch
    ridge = peak_flops / bandwidth
    # batch * flops >= ridge * (weights + batch * cache)  <=>  batch * (flops - ridge * cache) >= ridge * weights
    slope = flops - ridge * cache
    if slope <= 0:  # the cache alone brings at least a byte per ridge's FLOPs: no batch gets there
        return None
    return max(1, math.ceil(ridge * weights / slope))
    ### END SOLUTION
