"""Measuring honestly: warm up, repeat, report the median and spread, and record what produced
the number (device, threads, torch version, shapes) beside it.

Used by the notebooks' measurements and by `kvlib bench`. Threads default to one, so runs on a
shared CPU compare with each other and with the course's records. Not here: anything that asserts on time.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
import weakref
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

import torch
from torch.utils._pytree import tree_leaves

from kvlib.core.flops import PlainDispatchMode


def device_name(device: str | torch.device = "cpu") -> str:
    """A human name for the device: the GPU's model, or the CPU's."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return name


def environment(device: str | torch.device = "cpu", **extra) -> dict:
    """What produced a number: device, thread count, library versions, plus `extra` (dtype, shapes)."""
    return {
        "device": device_name(device),
        "device_type": torch.device(device).type,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        **extra,
    }


@contextmanager
def num_threads(n: int | None):
    """Run a block with torch using n threads (None leaves the setting alone)."""
    if n is None:
        yield
        return
    if n < 1:
        raise ValueError(f"threads must be at least 1, got {n}")
    if n > 1:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # spinning threads starve a busy neighbour
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def synchronize(device: str | torch.device = "cpu") -> None:
    """Wait for queued GPU work, so that a clock read after it measures the work itself."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def replayable(fn: Callable[[], object], device: str | torch.device = "cpu") -> Callable[[], object]:
    """fn itself on a CPU; on a CUDA GPU, fn captured once as a CUDA graph and returned as its replay.

    Eager PyTorch launches one GPU kernel per operation from Python, a few microseconds each; a
    decode step of a 16-layer model is hundreds of kernels, so the GPU can sit idle waiting for
    the next launch. A graph replays all of them with one launch (what inference servers do).
    fn must not read GPU values back to the host, and reuses the same tensors on every replay.
    """
    device = torch.device(device)
    if device.type != "cuda":
        return fn
    side = torch.cuda.Stream(device)  # warm up off the capturing stream: kernel choice, workspaces
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def new_tensors(fn: Callable, *args, **kwargs) -> list[tuple[str, tuple[int, ...]]]:
    """[(op name, shape)] of every tensor that fn(*args, **kwargs) allocates, in order.

    Views share their input's memory and are not counted: x[None].expand(...) is free, its
    .contiguous() is not. Used by notebook 06 (which attention copies the shared heads?) and
    by its checks, in the learner's kernel or in the isolated grading child.
    """
    made = []

    class Watch(PlainDispatchMode):
        def __torch_dispatch__(self, func, types, a=(), kw=None):
            out = func(*a, **(kw or {}))
            inputs = {x.untyped_storage().data_ptr() for x in tree_leaves((a, kw)) if isinstance(x, torch.Tensor)}
            for x in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(x, torch.Tensor) and x.untyped_storage().data_ptr() not in inputs:
                    made.append((str(func.overloadpacket.__name__), tuple(int(n) for n in x.shape)))
            return out

    with Watch():
        fn(*args, **kwargs)
    return made


def peak_tensor_bytes(fn: Callable, *args, **kwargs) -> tuple[object, int]:
    """(fn(*args, **kwargs), the most bytes that tensors made during the call held at once, alive together).

    A tensor counts from its allocation until it is freed (a view made of it, kept after it is gone, is not
    followed: a lower bound). Used by notebook 09's local check of the online softmax (are the chunks kept?),
    where the isolated grader reads the process's memory instead (kvlib.grading.memory).
    """

    live: dict[int, int] = {}
    peak = 0

    class Watch(PlainDispatchMode):
        def __torch_dispatch__(self, func, types, a=(), kw=None):
            nonlocal peak
            out = func(*a, **(kw or {}))
            inputs = {x.untyped_storage().data_ptr() for x in tree_leaves((a, kw)) if isinstance(x, torch.Tensor)}
            for x in out if isinstance(out, (tuple, list)) else (out,):
                if not isinstance(x, torch.Tensor) or x.untyped_storage().data_ptr() in inputs:
                    continue
                key = id(x)
                live[key] = x.untyped_storage().nbytes()
                weakref.finalize(x, live.pop, key, None)
            peak = max(peak, sum(live.values()))
            return out

    with Watch():
        result = fn(*args, **kwargs)
    return result, peak


@dataclass
class Timing:
    """Seconds of repeated runs of one thing, with what produced them."""

    name: str
    samples: list[float]
    record: dict = field(default_factory=dict)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def spread(self) -> tuple[float, float]:
        """The lowest and highest sample: how far a single run can land from the median."""
        return min(self.samples), max(self.samples)

    def __str__(self) -> str:
        lo, hi = self.spread
        return f"{self.name}: median {_fmt(self.median)} (min {_fmt(lo)}, max {_fmt(hi)}, {len(self.samples)} runs)"

    def as_dict(self) -> dict:
        return {**asdict(self), "median": self.median}


def _fmt(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds < 1 else f"{seconds:.2f} s"


def measure(
    fn: Callable[[], object],
    *,
    name: str = "",
    warmup: int = 2,
    repeats: int = 7,
    device: str | torch.device = "cpu",
    threads: int | None = 1,
    **record,
) -> Timing:
    """Time fn() `repeats` times after `warmup` untimed calls; returns a Timing with the record.

    Example: measure(lambda: model(ids), name="prefill", dtype="float32", seq_len=64)
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    with num_threads(threads), torch.inference_mode():
        for _ in range(warmup):
            fn()
        synchronize(device)
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            synchronize(device)
            samples.append(time.perf_counter() - start)
        env = environment(device, **record)
    return Timing(name or getattr(fn, "__name__", "run"), samples, env)
