"""Measuring this machine (notebooks 05 and 07, `kvlib bench`): its roof (bandwidth, FLOP/s), model steps.

Every figure comes with the record of what produced it (kvlib.measure.timing.environment).
Recorded GPU runs of `kvlib bench` (assets/recordings) load with load_recordings().
"""

from __future__ import annotations

import json
import os
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from kvlib.core.model import Decoder
from kvlib.core.paths import ASSETS
from kvlib.course import inputs
from kvlib.measure.timing import environment, measure, num_threads, synchronize

RECORDINGS_DIR = ASSETS / "recordings"  # GPU runs of `kvlib bench memory` and `kvlib bench gqa`


def bandwidth_kernels(n_bytes: int = 256 << 20, device: str | torch.device = "cpu", streams: int = 0) -> dict:
    """name -> (fn, bytes it moves) for streaming kernels over float32 arrays of n_bytes.

    read: x.sum() reads n_bytes; copy: y.copy_(x) reads and writes n_bytes (counted 2x, as
    STREAM does); triad: z = x + 2 y (3x). With streams > 1, also "multi_read": x seen as
    (streams, n / streams) and summed over its first axis, so one core reads `streams` far-apart
    parts of x side by side (more reads in flight at once than one stream gets), writing n /
    streams sums (counted).
    """
    n = n_bytes // 4
    x = torch.rand(n, device=device)
    y, z = torch.rand(n, device=device), torch.empty(n, device=device)
    kernels = {
        "read": (lambda: x.sum(), n * 4),
        "copy": (lambda: y.copy_(x), 2 * n * 4),
        "triad": (lambda: torch.add(x, y, alpha=2.0, out=z), 3 * n * 4),
    }
    if streams > 1:
        rows, sums = x[: n // streams * streams].view(streams, -1), torch.empty(n // streams, device=device)
        kernels["multi_read"] = (lambda: torch.sum(rows, 0, out=sums), rows.nbytes + sums.nbytes)
    return kernels


def measure_bandwidth(
    n_bytes: int = 256 << 20, device: str | torch.device = "cpu", threads: int | None = 1, repeats: int = 7
) -> dict:
    """Sustained memory bandwidth (bytes/s) from three streaming kernels over arrays far beyond the caches.

    `bandwidth` is the read kernel's: a decode step streams its weights in, reading only, so that
    is the ceiling to predict it with (copy and triad, reported beside it, also pay for writes).
    Returns bytes/s per kernel, with the record.
    """
    rates = {}
    for name, (fn, moved) in bandwidth_kernels(n_bytes, device).items():
        timing = measure(fn, name=name, repeats=repeats, device=device, threads=threads)
        rates[name] = moved / timing.median
    return {
        "bandwidth": rates["read"],
        "kernel": "read",
        "per_kernel": rates,
        "array_bytes": n_bytes // 4 * 4,
        "record": environment(device, threads=threads if threads else torch.get_num_threads()),
    }


def measure_gemv_layouts(weights: list[torch.Tensor], threads: int | None = 1, rounds: int = 11) -> dict:
    """One vector times each (out, in) weight, stored two ways: the bytes/s each way streams them at.

    "row-major": each row of a weight contiguous in memory, nn.Linear's default; "column-major":
    each column, as kvlib's Decoder stores its tall weights (kvlib.core.model.decode_layout). The
    same bytes, the same FLOPs, the same result up to rounding; only the routine differs. Both are
    timed in alternation, `rounds` times, after a warm-up; returns the medians' bytes/s, each round's seconds
    per layout (round_seconds: ratios pair round by round), with the record.
    """
    if not weights or any(w.dim() != 2 for w in weights):
        raise ValueError(
            f"weights must be a non-empty list of (out, in) matrices, got shapes {[tuple(w.shape) for w in weights]}"
        )
    layouts = {
        "row-major": [w.detach().contiguous() for w in weights],
        "column-major": [w.detach().t().contiguous().t() for w in weights],
    }
    vecs = {w.shape[1]: torch.randn(1, w.shape[1], dtype=w.dtype, device=w.device) for w in weights}
    n_bytes = sum(w.nbytes for w in layouts["row-major"])
    samples = {k: [] for k in layouts}
    with num_threads(threads), torch.inference_mode():
        for r in range(rounds + 1):  # round 0 warms up
            for name, ws in layouts.items():
                synchronize(weights[0].device)
                start = time.perf_counter()
                for w in ws:
                    torch.nn.functional.linear(vecs[w.shape[1]], w)
                synchronize(weights[0].device)
                if r:
                    samples[name].append(time.perf_counter() - start)
    rates = {k: n_bytes / statistics.median(v) for k, v in samples.items()}
    return {
        **rates,
        "round_seconds": samples,
        "bytes": n_bytes,
        "rounds": rounds,
        "record": environment(weights[0].device, threads=threads if threads else torch.get_num_threads()),
    }


def measure_matmul_flops(
    n: int = 1024,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    threads: int | None = 1,
    repeats: int = 7,
) -> dict:
    """FLOP/s of an (n, n) @ (n, n) matmul: 2 n^3 FLOPs over 3 n^2 numbers moved.

    Intensity 2n / 3 / bytes (~171 FLOP/B at n = 1024 in float32): compute-bound.
    """
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    timing = measure(lambda: a @ b, name="matmul", repeats=repeats, device=device, threads=threads)
    return {
        "flops": 2 * n**3 / timing.median,
        "n": n,
        "dtype": str(dtype).removeprefix("torch."),
        "record": timing.record,
    }


def model_matrices(model) -> list[torch.Tensor]:
    """Every nn.Linear weight of a model, in the memory order it stores them: what one decode step streams."""
    return [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]


def measure_roof(
    n_bytes: int = 256 << 20,
    n: int = 1024,
    *,
    weights: list[torch.Tensor] | tuple = (),
    rows: int = 128,
    device: str | torch.device = "cpu",
    threads: int | None = 1,
    rounds: int = 7,
) -> dict:
    """The machine's two ceilings, bandwidth (bytes/s) and FLOP/s, each the best that any of its kernels reached.

    The roofline of notebooks 05 and 07 (one function, so that both draw the same roof). Bandwidth:
    read, copy, triad and an 8-stream read over float32 arrays of n_bytes (bandwidth_kernels), and,
    with `weights`, one vector times each of them (a decode step's matrix-vector products). FLOP/s:
    an (n, n) @ (n, n) float32 matmul, and, with `weights`, `rows` rows times each of them (a
    prefill's matrix products). Every kernel runs once per round, rounds interleaved after a
    warm-up, and each rate is its fastest round: load on a shared machine only slows a run, and a
    ceiling is the best of its runs, so a step timed on the same machine does not sit above it.
    Returns bandwidth, flops, ridge (FLOP/B), the kernel that set each, every kernel's best rate
    (per_kernel, bytes/s or FLOP/s), rounds, and the record.
    Example: roof = measure_roof(8 << 20, 128, rounds=2); roof["ridge"] == roof["flops"] / roof["bandwidth"]
    """
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    if any(w.dim() != 2 for w in weights):
        raise ValueError(f"weights must be (out, in) matrices, got shapes {[tuple(w.shape) for w in weights]}")
    streams = dict(bandwidth_kernels(n_bytes, device, streams=8))
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    flops = {"matmul": (lambda: a @ b, 2 * n**3)}
    if weights:
        vec = {w.shape[1]: torch.randn(1, w.shape[1], dtype=w.dtype, device=w.device) for w in weights}
        block = {w.shape[1]: torch.randn(rows, w.shape[1], dtype=w.dtype, device=w.device) for w in weights}
        linear = torch.nn.functional.linear
        streams["matrix-vector"] = (
            lambda: [linear(vec[w.shape[1]], w) for w in weights],
            sum(w.nbytes for w in weights),
        )
        flops[f"matrix {rows} rows"] = (
            lambda: [linear(block[w.shape[1]], w) for w in weights],
            sum(2 * rows * w.numel() for w in weights),
        )
    jobs = {**streams, **flops}
    seconds = {name: [] for name in jobs}
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None  # what else the machine ran, as it started
    with num_threads(threads), torch.inference_mode():
        for r in range(rounds + 1):  # round 0 warms up: first touches, kernel choice
            for name, (fn, _) in jobs.items():
                synchronize(device)
                start = time.perf_counter()
                fn()
                synchronize(device)
                if r:
                    seconds[name].append(time.perf_counter() - start)
        record = environment(device, threads=torch.get_num_threads(), rounds=rounds, load_average=load)
    best = {name: min(times) for name, times in seconds.items()}
    rates = {name: amount / best[name] for name, (_, amount) in jobs.items()}
    bw_kernel = max(streams, key=rates.get)
    flop_kernel = max(flops, key=rates.get)
    return {
        "bandwidth": rates[bw_kernel],
        "bandwidth_kernel": bw_kernel,
        # that kernel's rate in each round: the run's spread, which a ceiling (the best round) hides
        "bandwidth_rounds": [jobs[bw_kernel][1] / t for t in seconds[bw_kernel]],
        "flops": rates[flop_kernel],
        "flops_kernel": flop_kernel,
        "ridge": rates[flop_kernel] / rates[bw_kernel],
        "per_kernel": rates,
        "array_bytes": n_bytes // 4 * 4,
        "rounds": rounds,
        "record": record,
    }


SITTING_HOURS = 8  # a roof measured longer ago than this belongs to another sitting: measured again, not reused


def _this_sitting(roof: dict, now: datetime | None = None) -> bool:
    try:
        then = datetime.fromisoformat(roof["measured_at"])
    except (KeyError, TypeError, ValueError):
        return False
    return ((now or datetime.now(timezone.utc)) - then).total_seconds() < SITTING_HOURS * 3600


def roof_path() -> Path:
    """$XDG_CACHE_HOME/kvlib/roof.json (~/.cache/kvlib/roof.json by default): the course's roof of this machine."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvlib" / "roof.json"


def _roof_key(record: dict) -> dict:
    """What must match for a stored roof to be this machine's: the CPU or GPU, its architecture, threads, torch."""
    return {k: record.get(k) for k in ("device", "device_type", "machine", "threads", "torch")}


def course_roof(*, reuse: bool = False, path: Path | None = None, **measure) -> dict:
    """One roof for the whole course on this machine, so notebooks 05 and 07 draw the same ridge.

    reuse=False (notebook 05): measure_roof(**measure) (5 rounds unless told), then keep, ceiling by
    ceiling, the best of this run and of the roof stored before for the same machine in this sitting
    (a ceiling is the best of its runs), and store the result. reuse=True (notebooks 06, 07, 09): return
    the stored roof unchanged, measuring (and storing) only where none is stored for this machine in
    this sitting. A sitting: SITTING_HOURS; an older roof is another day's machine, measured afresh. A folder that
    cannot be written (a grading jail) only means nothing is stored. Returns measure_roof's dict plus
    "runs" (the runs it is the best of), "bandwidths" (each run's bandwidth, this sitting), "measured_at" (UTC,
    ISO, of the last run), "reused" (True: read from the file, nothing measured) and "stored" (the file it came
    from or went to, or None). roof_line(roof) says it in one sentence, the same in every notebook.
    Example: course_roof(reuse=True)["ridge"] is the ridge notebook 05 last printed on this machine
    """
    try:
        path = path or roof_path()
    except (RuntimeError, KeyError):  # no home folder to be found (some jails): measure, store nothing
        path = None
    key = _roof_key(environment("cpu", threads=1))
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
        stored = stored if stored.get("key") == key and _this_sitting(stored["roof"]) else None
    except (OSError, ValueError, AttributeError, KeyError):  # none stored, half a file, or no path
        stored = None
    if reuse and stored is not None:
        return {**stored["roof"], "stored": str(path), "reused": True}
    roof = measure_roof(**{"rounds": 5, **measure})
    roof["runs"], roof["reused"] = 1, False
    roof["measured_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    roof["bandwidths"] = [roof["bandwidth"]]  # each run's ceiling this sitting: their spread is shown beside the best
    if stored is not None:  # the best of both runs, each ceiling on its own
        old = stored["roof"]
        roof["bandwidths"] = old.get("bandwidths", [old["bandwidth"]]) + roof["bandwidths"]
        roof["per_kernel"] = {
            k: max(roof["per_kernel"].get(k, 0.0), old["per_kernel"].get(k, 0.0))
            for k in [*roof["per_kernel"], *(k for k in old["per_kernel"] if k not in roof["per_kernel"])]
        }
        for ceiling in ("bandwidth", "flops"):
            if old[ceiling] > roof[ceiling]:
                roof[ceiling], roof[f"{ceiling}_kernel"] = old[ceiling], old[f"{ceiling}_kernel"]
        roof["ridge"], roof["runs"] = roof["flops"] / roof["bandwidth"], old.get("runs", 1) + 1
    try:
        if path is None:
            raise OSError("no folder to store the roof in")
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_name(f"{path.name}.{os.getpid()}")  # written whole, then renamed: a reader never sees half
        part.write_text(json.dumps({"key": key, "roof": roof}, indent=1), encoding="utf-8")
        os.replace(part, path)
        roof["stored"] = str(path)
    except OSError:
        roof["stored"] = None
    return roof


def roof_line(roof: dict) -> str:
    """The course's one sentence for this machine's bandwidth, with its spread, date and load, in every notebook.
    Example: "this machine's bandwidth: 5.5 GB/s (read: the best of 2 runs this sitting, 5.2-5.5 GB/s; its rounds
    4.9-5.5 GB/s), measured 2026-12-04 13:02 UTC, load average 1.2 as it started" """
    gb = lambda x: f"{x / 1e9:.1f}"
    runs = roof.get("bandwidths") or [roof["bandwidth"]]
    rounds = roof.get("bandwidth_rounds") or []
    parts = [f"{roof['bandwidth_kernel']}: the best of {len(runs)} run{'s' * (len(runs) > 1)} this sitting"]
    if len(runs) > 1:
        parts.append(f"{gb(min(runs))}-{gb(max(runs))} GB/s")
    if rounds:
        parts.append(f"the last run's rounds {gb(min(rounds))}-{gb(max(rounds))} GB/s")
    when = roof.get("measured_at", "")
    when = f", measured {when[:16].replace('T', ' ')} UTC" if when else ""
    load = roof.get("record", {}).get("load_average")
    load = f", load average {load:.1f} as it started" if load is not None else ""
    reused = " (stored by an earlier notebook: not measured again)" if roof.get("reused") else ""
    return f"this machine's bandwidth: {gb(roof['bandwidth'])} GB/s ({'; '.join(parts)}){when}{load}{reused}"


def roofline_time(flops: float, bytes_moved: float, peak_flops: float, bandwidth: float) -> float:
    """Seconds a step of flops FLOPs that moves bytes_moved bytes takes on a roofline device (peak_flops FLOP/s,
    bandwidth bytes/s), for the benchmarks' predictions. Exercise 5.4 works this out: its checks refuse it.
    Example: roofline_time(2e9, 1e9, 1e12, 1e9) == 1.0
    """
    inputs.check_roofline(flops, bytes_moved, peak_flops, bandwidth)
    return max(flops / peak_flops, bytes_moved / bandwidth)


def lift_roof(peak: float, bandwidth: float, points) -> tuple[float, float, list[str]]:
    """The roof is a ceiling, so a rate this machine reached raises it: (peak, bandwidth, labels) where no point
    (label, FLOP/B, FLOP/s) sits above min(peak, intensity * bandwidth), each ceiling raised only as far as a point
    above it reached (its FLOP/s, or its FLOP/s / FLOP/B bytes a second); labels: the points that were above.
    Example: lift_roof(10e9, 1e9, [("prefill", 50.0, 12e9)]) == (12e9, 1e9, ["prefill"])"""
    above = []
    for label, intensity, rate in points:
        if intensity <= 0 or rate < 0:
            raise ValueError(f"{label}: intensity must be positive and rate non-negative, not {intensity}, {rate}")
        if rate > min(peak, intensity * bandwidth):
            above.append(label)
            peak, bandwidth = max(peak, rate), max(bandwidth, rate / intensity)
    return peak, bandwidth, above


def last_level_cache(cpu: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int | None:
    """Bytes of the CPU's last-level cache (the highest level Linux lists for cpu0), or None where it is not listed.

    What a benchmark streams to flush it before a timed read that must come from memory, as in a long-context step
    (kvlib.measure.bench_gqa.projection_seconds). Example: last_level_cache() -> 33554432 on a CPU with a 32 MiB L3
    """
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    best = None
    for index in sorted(cpu.glob("index*")):
        try:
            level = int((index / "level").read_text())
            size = (index / "size").read_text().strip()
            value = int(size[:-1]) * units[size[-1]] if size[-1] in units else int(size)
        except (OSError, ValueError):
            continue
        if best is None or level > best[0]:
            best = (level, value)
    return best[1] if best else None


def measure_batches(
    model, batches: list[int], device: str | torch.device = "cpu", threads: int | None = 1, rounds: int = 5
) -> dict:
    """Median seconds of one decode step (one new token per sequence, at position 0) at each batch size.

    Every batch runs once per round, rounds interleaved after a warm-up, so that a busy neighbour
    slows all batches alike instead of whichever ran while it was busy. Returns {"seconds": {batch:
    median seconds}, "round_seconds": {batch: each round's seconds, in round order}, "record": ...}.
    Example: measure_batches(random_model(cfg), [1, 4], rounds=2)["seconds"][4] -> seconds of a batch-4 step
    """
    if rounds < 1 or not batches:
        raise ValueError(f"need at least one batch and one round, got batches={batches}, rounds={rounds}")
    ids = {b: torch.randint(0, model.config.vocab_size, (b, 1), device=device) for b in batches}
    samples = {b: [] for b in batches}
    with num_threads(threads), torch.inference_mode():
        for r in range(rounds + 1):  # round 0 warms up
            for b, x in ids.items():
                synchronize(device)
                start = time.perf_counter()
                model(x)
                synchronize(device)
                if r:
                    samples[b].append(time.perf_counter() - start)
        record = environment(device, threads=torch.get_num_threads(), rounds=rounds)
    return {
        "seconds": {b: statistics.median(v) for b, v in samples.items()},
        "round_seconds": samples,
        "record": record,
    }


def random_model(config, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu", seed: int = 0):
    """A kvlib Decoder with random weights: timing does not care what the weights mean."""

    torch.manual_seed(seed)
    return Decoder(config).to(device=device, dtype=dtype).eval()


def measure_step(
    model,
    new_tokens: int,
    batch: int = 1,
    device: str | torch.device = "cpu",
    threads: int | None = 1,
    repeats: int = 7,
):
    """Timing of one forward over (batch, new_tokens) tokens at position 0: with new_tokens=1, a decode
    step at kv_len 1 (every weight read, no cache yet); with more, a prefill."""
    ids = torch.randint(0, model.config.vocab_size, (batch, new_tokens), device=device)
    dtype = next(model.parameters()).dtype
    return measure(
        lambda: model(ids),
        name=f"step {batch}x{new_tokens}",
        repeats=repeats,
        device=device,
        threads=threads,
        dtype=str(dtype).removeprefix("torch."),
        batch=batch,
        new_tokens=new_tokens,
    )


def load_recordings(folder: str | Path | None = None, benchmark: str = "memory") -> list[dict]:
    """Recorded `kvlib bench <benchmark> --json` runs on GPUs (assets/recordings/*.json), newest first.

    Made by assets/recordings/record.sh on a CUDA machine; each carries its device and date.
    """
    folder = Path(folder) if folder else RECORDINGS_DIR
    runs = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))] if folder.is_dir() else []
    return sorted((r for r in runs if r.get("benchmark") == benchmark), key=lambda r: r.get("date", ""), reverse=True)
