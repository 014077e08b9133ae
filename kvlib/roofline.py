"""The memory wall (notebook 05-memory-wall): why decode waits on memory, predicted then measured.

A step of a model costs FLOPs (work for the arithmetic units) and bytes (weights and KV cache
fetched from memory). Whichever takes longer sets the time: that is the roofline (Williams,
Waterman and Patterson, CACM 2009). Its x-axis is arithmetic intensity, FLOPs per byte moved;
a device's ridge point, peak FLOP/s / bandwidth, splits memory-bound (left) from
compute-bound (right). Decode at batch 1 reads every weight for ~2 FLOPs each: far left.

Here: a table of real GPUs (dense datasheet figures, with sources), the learner's exercises
(5.1-5.5), and measurements of this machine: bandwidth, matmul FLOP/s, and the step time of a
random-weight model too big for the caches. Counts follow notebook 03: 2 FLOPs per multiply-add,
matrix multiplies only; bytes are the matrix weights read once plus the KV cache read once
(activations, norms and the embedding rows a step looks up are left out: they are tiny).
Left out: overlap of prefill and decode, caches between levels of memory, multi-GPU.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from kvlib._exercise import exercise
from kvlib.benchmark import environment, measure

RECORDINGS_DIR = Path(__file__).resolve().parent.parent / "assets" / "recordings"  # GPU runs of `kvlib bench memory`

# ---------------------------------------------------------------------------------------------
# Devices: dense datasheet figures (NVIDIA datasheets and whitepapers; COURSE.md, SOURCES.md)


@dataclass(frozen=True)
class Device:
    """Peak FLOP/s and memory bandwidth (bytes/s) of one device; ridge points follow from them."""

    name: str
    fp32_flops: float  # dense FP32, FLOP/s
    tensor16_flops: float  # dense 16-bit tensor-core FLOP/s (BF16, or FP16 where no BF16)
    bandwidth: float  # bytes/s
    memory: float  # bytes of device memory: weights and KV cache must fit in it
    source: str
    note: str = ""

    def peak_flops(self, dtype: torch.dtype = torch.float16) -> float:
        """FP32 peak for float32, the tensor-core peak for 16-bit types."""
        return self.fp32_flops if dtype == torch.float32 else self.tensor16_flops

    def ridge(self, dtype: torch.dtype = torch.float16) -> float:
        """FLOPs per byte at which the roofline turns: left of it, memory sets the time."""
        return self.peak_flops(dtype) / self.bandwidth


_A100 = "NVIDIA A100 Tensor Core GPU datasheet"
_H100 = "NVIDIA H100 Tensor Core GPU datasheet"
T, G = 1e12, 1e9
DEVICES: dict[str, Device] = {
    d.name: d
    for d in (
        Device("T4", 8.1 * T, 65 * T, 320 * G, 16 * G, "NVIDIA T4 datasheet", "16-bit is FP16: no BF16"),
        Device("L4", 30.3 * T, 121 * T, 300 * G, 24 * G, "NVIDIA L4 datasheet"),
        Device("A100 40GB SXM", 19.5 * T, 312 * T, 1555 * G, 40 * G, _A100),
        Device("A100 80GB PCIe", 19.5 * T, 312 * T, 1935 * G, 80 * G, _A100, "the seed article's '~1.9 TB/s'"),
        Device("A100 80GB SXM", 19.5 * T, 312 * T, 2039 * G, 80 * G, _A100),
        Device("H100 SXM", 67 * T, 989 * T, 3350 * G, 80 * G, _H100),
        Device("H100 PCIe", 51 * T, 756 * T, 2000 * G, 80 * G, _H100),
        Device("H200 SXM", 67 * T, 989 * T, 4800 * G, 141 * G, "NVIDIA H200 datasheet (compute as H100 SXM)"),
        Device("RTX 4090", 82.6 * T, 165 * T, 1008 * G, 24 * G, "NVIDIA Ada (RTX 4090) whitepaper", "16-bit with FP32 accumulate"),
    )
}


def bytes_per_element(dtype: torch.dtype) -> int:
    """Bytes one number of dtype occupies: 4 for float32, 2 for float16/bfloat16, 1 for int8."""
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtype must be a torch.dtype such as torch.float16, got {dtype!r}")
    return torch.empty((), dtype=dtype).element_size()


def matrix_params(config) -> int:
    """Weights in the matrices one token passes through: every layer's projections and MLP, and the lm_head."""
    C, D, H, H_kv = config.d_model, config.head_dim, config.n_heads, config.n_kv_heads
    layer = C * H * D + 2 * C * H_kv * D + H * D * C + 3 * C * config.hidden_dim
    return config.n_layers * layer + C * config.vocab_size


def attainable_flops(intensity, peak_flops: float, bandwidth: float):
    """The roof: min(peak, intensity * bandwidth), FLOP/s, for a number or a tensor of intensities."""
    if isinstance(intensity, torch.Tensor):
        return torch.clamp(intensity * bandwidth, max=peak_flops)
    return min(peak_flops, intensity * bandwidth)


# ---------------------------------------------------------------------------------------------
# Input checks (run before the learner's code)


def _check_dtype(dtype):
    bytes_per_element(dtype)


def _check_positive(**values):
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 or math.isinf(v):
            raise ValueError(f"{name} must be a positive number, got {v!r}")


def _check_config(config):
    for field in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "hidden_dim"):
        if not isinstance(getattr(config, field, None), int):
            raise ValueError(f"config must be a kvlib ModelConfig (it has no integer {field}), got {type(config).__name__}")


def _check_count(name, n, minimum=1):
    if isinstance(n, bool) or not isinstance(n, int) or n < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {n!r}")


def _check_matmul(m, k, n, dtype=torch.float16):
    for name, v in (("m", m), ("k", k), ("n", n)):
        _check_count(name, v)
    _check_dtype(dtype)


def _check_roofline(flops, bytes_moved, peak_flops, bandwidth):
    _check_positive(peak_flops=peak_flops, bandwidth=bandwidth)
    for name, v in (("flops", flops), ("bytes_moved", bytes_moved)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            raise ValueError(f"{name} must be a non-negative number, got {v!r}")


def _check_kv(config, seq_len, batch=1, dtype=torch.float16):
    _check_config(config)
    _check_count("seq_len", seq_len, 0)
    _check_count("batch", batch)
    _check_dtype(dtype)


def _check_step(config, new_tokens, kv_len, batch=1, dtype=torch.float16):
    _check_config(config)
    _check_count("new_tokens", new_tokens)
    _check_count("kv_len", kv_len)
    _check_count("batch", batch)
    _check_dtype(dtype)
    if new_tokens > kv_len:
        raise ValueError(f"kv_len ({kv_len}) counts the new tokens too, so it cannot be less than new_tokens ({new_tokens})")


def _check_predicted(config, kv_len, batch, dtype, peak_flops, bandwidth):
    _check_step(config, 1, kv_len, batch, dtype)
    _check_positive(peak_flops=peak_flops, bandwidth=bandwidth)


# ---------------------------------------------------------------------------------------------
# Exercise 5.1


@exercise("5.1", validate=_check_matmul)
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


# ---------------------------------------------------------------------------------------------
# Exercise 5.2


@exercise("5.2", validate=_check_roofline)
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
# Exercise 5.3


@exercise("5.3", validate=_check_kv)
def kv_cache_bytes(config, seq_len: int, batch: int = 1, dtype: torch.dtype = torch.float16) -> int:
    """Bytes of the KV cache holding seq_len tokens for each of batch sequences.

    Every layer keeps a key and a value vector of head_dim numbers per KV head per token.
    Example: Llama-2-7B (32 layers, 32 KV heads, head_dim 128) in float16: 512 KiB per token

    Hints (reference solution: 2 lines):
      1. Keys and values: a factor 2. Layers, KV heads (config.n_kv_heads, not n_heads), head_dim.
      2. Bytes, not bits: bytes_per_element(dtype).
    """
    raise NotImplementedError("Exercise 5.3 (notebooks/05-memory-wall): kv_cache_bytes")


# ---------------------------------------------------------------------------------------------
# Exercise 5.4


@exercise("5.4", validate=_check_step)
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


# ---------------------------------------------------------------------------------------------
# Exercise 5.5


@exercise("5.5", validate=_check_predicted)
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
    """Context length (tokens) at which the KV cache of `batch` sequences weighs as much as the weights."""
    return weight_bytes / kv_cache_bytes(config, 1, batch, dtype)


# ---------------------------------------------------------------------------------------------
# Measuring this machine


def bandwidth_kernels(n_bytes: int = 256 << 20, device: str | torch.device = "cpu") -> dict:
    """name -> (fn, bytes it moves) for three streaming kernels over float32 arrays of n_bytes.

    read: x.sum() reads n_bytes; copy: y.copy_(x) reads and writes n_bytes (counted 2x, as
    STREAM does); triad: z = x + 2 y (3x).
    """
    n = n_bytes // 4
    x = torch.rand(n, device=device)
    y, z = torch.rand(n, device=device), torch.empty(n, device=device)
    return {
        "read": (lambda: x.sum(), n * 4),
        "copy": (lambda: y.copy_(x), 2 * n * 4),
        "triad": (lambda: torch.add(x, y, alpha=2.0, out=z), 3 * n * 4),
    }


def measure_bandwidth(n_bytes: int = 256 << 20, device: str | torch.device = "cpu", threads: int | None = 1,
                      repeats: int = 7) -> dict:
    """Sustained memory bandwidth (bytes/s) from three streaming kernels over arrays far beyond the caches.

    `bandwidth` is the read kernel's: a decode step streams its weights in, reading only, so that
    is the ceiling to predict it with (copy and triad, reported beside it, also pay for writes).
    Returns bytes/s per kernel, with the record.
    """
    rates = {}
    for name, (fn, moved) in bandwidth_kernels(n_bytes, device).items():
        timing = measure(fn, name=name, repeats=repeats, device=device, threads=threads)
        rates[name] = moved / timing.median
    return {"bandwidth": rates["read"], "kernel": "read", "per_kernel": rates, "array_bytes": n_bytes // 4 * 4,
            "record": environment(device, threads=threads if threads else torch.get_num_threads())}


def measure_matmul_flops(n: int = 1024, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                         threads: int | None = 1, repeats: int = 7) -> dict:
    """FLOP/s of an (n, n) @ (n, n) matmul: 2 n^3 FLOPs, compute-bound (intensity n / 3 / bytes)."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    timing = measure(lambda: a @ b, name="matmul", repeats=repeats, device=device, threads=threads)
    return {"flops": 2 * n**3 / timing.median, "n": n, "dtype": str(dtype).removeprefix("torch."),
            "record": timing.record}


def memory_bound_config():
    """A random-weight Llama shape of ~445 MB in float32: over ten times a large CPU's last-level cache.

    Wide and shallow (d_model 2048, 2 layers): each matrix is 16-46 MB, large enough for one core
    to stream it at nearly the full read bandwidth; many small matrices would each pay a start-up.
    """
    from kvlib.model import ModelConfig

    return ModelConfig(vocab_size=4096, d_model=2048, n_layers=2, n_heads=16, n_kv_heads=16, hidden_dim=5632,
                       max_seq_len=1024)


def random_model(config, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu", seed: int = 0):
    """A kvlib Decoder with random weights: timing does not care what the weights mean."""
    from kvlib.model import Decoder

    torch.manual_seed(seed)
    return Decoder(config).to(device=device, dtype=dtype).eval()


def measure_step(model, new_tokens: int, batch: int = 1, device: str | torch.device = "cpu",
                 threads: int | None = 1, repeats: int = 7):
    """Timing of one forward over (batch, new_tokens) tokens at position 0: with new_tokens=1, a decode
    step at kv_len 1 (every weight read, no cache yet); with more, a prefill."""
    ids = torch.randint(0, model.config.vocab_size, (batch, new_tokens), device=device)
    dtype = next(model.parameters()).dtype
    return measure(lambda: model(ids), name=f"step {batch}x{new_tokens}", repeats=repeats, device=device,
                   threads=threads, dtype=str(dtype).removeprefix("torch."), batch=batch, new_tokens=new_tokens)


def load_recordings(folder: str | Path | None = None, benchmark: str = "memory") -> list[dict]:
    """Recorded `kvlib bench <benchmark> --json` runs on GPUs (assets/recordings/*.json), newest first.

    Made by assets/recordings/record.sh on a CUDA machine; each carries its device and date.
    """
    folder = Path(folder) if folder else RECORDINGS_DIR
    runs = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))] if folder.is_dir() else []
    return sorted((r for r in runs if r.get("benchmark") == benchmark), key=lambda r: r.get("date", ""), reverse=True)
