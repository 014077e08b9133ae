"""`kvlib bench memory` (notebook 05): memory bandwidth, matmul FLOP/s, and a memory-bound decode step,
predicted from bytes / bandwidth (kvlib.measure.machine.roofline_time, and kvlib/roofline.py's step_cost, the
learner's Exercise 5.3) and measured; also through torch.compile (one graph, fullgraph=True: on a CPU with
the weights frozen and repacked, on a CUDA GPU with CUDA graphs), and on a GPU replayed as a CUDA graph.

The bandwidth ceiling is the highest rate any of five kernels reached in the run: read, copy,
triad, a multi-stream read, and the decode step's own kind of kernel (matrix-vector products).
One kernel alone under-reads what the memory can deliver (on the shipped H200 recording the
read kernel gave 3.57 TB/s where copy gave 4.08 and triad 4.18), and a prediction from an
under-read bandwidth is beaten by the step it predicts: measured/predicted below 1.
"""

from __future__ import annotations

import datetime
import statistics
import time

import torch

from kvlib.core import progress
from kvlib.core.configs import gpu_decode_config, memory_bound_config, quick_memory_config
from kvlib.core.devices import DEVICES
from kvlib.measure import timing
from kvlib.measure.compiled import AUTOTUNE, INDUCTOR
from kvlib.measure.machine import bandwidth_kernels, random_model, roofline_time

# ---------------------------------------------------------------------------------------------
# kvlib bench memory (notebook 05): bandwidth, matmul FLOP/s, and a memory-bound decode step

KERNEL_NAMES = {
    "read": "read",
    "copy": "copy",
    "triad": "triad",
    "multi_read": "multi-stream read",
    "gemv": "matrix-vector",
}


def datasheet(device_name: str):
    """The kvlib.core.devices entry for a GPU's name (e.g. "NVIDIA H200" -> "H200 SXM"), or None if none or several fit."""
    fits = [d for d in DEVICES.values() if d.name.split()[0] in device_name.split()]
    if len(fits) > 1:  # several variants (A100 40GB SXM, 80GB PCIe...): only one naming all its words fits
        fits = [d for d in fits if all(word in device_name for word in d.name.split())]
    return fits[0] if len(fits) == 1 else None


def below_one(ratio: float, kernel: str, legacy: bool = False) -> str:
    """Why a step can run faster than bytes / ceiling predicts, said where it happens."""
    which = (
        "the read kernel this older recording took as the ceiling"
        if legacy
        else f"the fastest of the five kernels ({KERNEL_NAMES[kernel]})"
    )
    return (
        f"measured/predicted {ratio:.2f} is below 1: the step read its weights faster than {which}, "
        "so that rate under-reads this memory. A single core's streaming rate "
        "is set by how many reads it keeps in flight, not by the memory, and the step's many matrix-vector "
        "products, each with its own prefetch streams, kept more in flight; the roofline is a ceiling only when "
        "its bandwidth is the highest the memory can give."
    )


def _memory_run(device: str, threads: int | None, quick: bool) -> dict:
    """The measurements of notebook 05 on one device: bandwidth, matmul, decode predicted and measured, batches.

    Bandwidth, matmul and the decode step are timed once per round, rounds interleaved, so that a
    busy neighbour slows all three alike; each is the median over rounds, and the decode's
    fraction of the bandwidth is also given as the median of the per-round ratios. On a GPU each
    decode step is timed twice: as kvlib runs it (eager: one kernel launch per operation, from
    Python) and replayed as a CUDA graph (timing.replayable), which leaves the GPU no idle gaps;
    and at batch 1 a third time, through torch.compile (mode "reduce-overhead": fused kernels
    replayed as CUDA graphs). On a CPU the batch-1 step is also compiled (not with quick): inductor
    with the weights frozen, free to repack them for its matrix kernels (kvlib.measure.compiled).
    A compiler that fails is recorded as an error instead.
    """
    from kvlib.roofline import step_cost  # noqa: PLC0415 (late binding: runs the learner's code, Exercise 5.3)

    cuda = torch.device(device).type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32  # CPUs without 16-bit units run float32 fastest
    rounds = 3 if quick else 11
    batch_sizes = (1, 4, 16, 64, 256, 1024) if cuda else (1, 4, 16, 64)  # a GPU's ridge is in the hundreds
    if quick:
        config = quick_memory_config()
        array_bytes, n = 16 << 20, 256
    else:
        config = gpu_decode_config() if cuda else memory_bound_config()
        array_bytes, n = ((2 << 30), 8192) if cuda else ((256 << 20), 1024)
    kernels = bandwidth_kernels(array_bytes, device, streams=8)
    a, b = (torch.randn(n, n, device=device).to(dtype) for _ in range(2))
    with torch.device(device):  # build the weights where they will run: no host copy of a multi-GB model
        model = random_model(config, dtype=dtype, device=device)
    ids = {batch: torch.randint(0, config.vocab_size, (batch, 1), device=device) for batch in batch_sizes}
    # the decode step's own kind of kernel, alone: one token's vector times each layer's two largest matrices
    # (the MLP's up and down projections), in the memory order the model stores them in
    # (kvlib.core.model.decode_layout), and each in the other order, for what that choice buys
    mats = [w for layer in model.layers for w in (layer.mlp.up_proj.weight, layer.mlp.down_proj.weight)]
    flipped = [w.contiguous() if not w.is_contiguous() else w.t().contiguous().t() for w in mats]
    vecs = {w.shape[1]: torch.randn(1, w.shape[1], device=device, dtype=dtype) for w in mats}
    gemv_bytes = sum(w.nbytes for w in mats)
    with timing.num_threads(threads), torch.inference_mode():
        jobs = {
            **{k: fn for k, (fn, _) in kernels.items()},
            "matmul": lambda: a @ b,
            "gemv": timing.replayable(lambda: [torch.nn.functional.linear(vecs[w.shape[1]], w) for w in mats], device),
            "gemv flipped": timing.replayable(
                lambda: [torch.nn.functional.linear(vecs[w.shape[1]], w) for w in flipped], device
            ),
            **{f"decode {batch}": (lambda x=x: model(x)) for batch, x in ids.items()},
        }
        compile_error = None
        if cuda:
            jobs |= {f"graph {batch}": timing.replayable(lambda x=x: model(x), device) for batch, x in ids.items()}
        if not quick:  # fused kernels too: torch.compile at batch 1, one graph (fullgraph=True) or an error
            try:
                x1 = ids[1]
                if cuda:  # its CUDA graphs included ("reduce-overhead")
                    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
                    run_compiled = lambda: compiled(x1)  # noqa: E731
                else:  # inductor with the weights frozen, so it may repack them for its own matrix kernels
                    import torch._inductor.config as inductor_config  # noqa: PLC0415 (start-up time: inductor loads only when a step is compiled)

                    compiled = torch.compile(model, fullgraph=True)

                    def run_compiled():
                        with inductor_config.patch(INDUCTOR | AUTOTUNE):
                            return compiled(x1)

                for _ in range(3):  # compile (a CUDA graph: record it), then replay
                    run_compiled()
                jobs["compiled 1"] = run_compiled
            except Exception as err:  # a compiler that fails here must not cost the rest of the recording
                compile_error = f"{type(err).__name__}: {str(err)[:300]}"
        samples = {k: [] for k in jobs}
        for fn in jobs.values():  # warm-up: first touches, kernel selection
            fn()
        for _ in progress.bar(range(rounds), desc=f"kvlib bench memory: {device}", unit="round"):
            for k, fn in jobs.items():
                timing.synchronize(device)
                start = time.perf_counter()
                fn()
                timing.synchronize(device)
                samples[k].append(time.perf_counter() - start)
        record = timing.environment(device, dtype=str(dtype).removeprefix("torch."), rounds=rounds)
    gemv_shapes = [list(w.shape) for w in mats[:2]]
    model = jobs = mats = flipped = None  # free the weights and their copies before the summary
    med = {k: statistics.median(v) for k, v in samples.items()}
    rates = {k: moved / med[k] for k, (_, moved) in kernels.items()} | {"gemv": gemv_bytes / med["gemv"]}
    ceiling_kernel = max(rates, key=rates.get)  # the highest rate this device showed it can stream at
    bandwidth, flops_per_s = rates[ceiling_kernel], 2 * n**3 / med["matmul"]
    moved_by = {k: moved for k, (_, moved) in kernels.items()} | {"gemv": gemv_bytes}
    flops, moved = step_cost(config, 1, 1, 1, dtype)
    predicted = roofline_time(flops, moved, flops_per_s, bandwidth)

    def timed(key: str) -> dict:  # one way of running the batch-1 decode step, against the prediction
        per_round = [
            (moved / t) / (moved_by[ceiling_kernel] / r) for t, r in zip(samples[key], samples[ceiling_kernel])
        ]
        t = med[key]
        return {
            "measured_s": t,
            "spread_s": [min(samples[key]), max(samples[key])],
            "measured_over_predicted": t / predicted,
            "achieved_bytes_per_s": moved / t,
            "fraction_of_bandwidth": moved / t / bandwidth,
            "fraction_of_bandwidth_per_round": statistics.median(per_round),
        }

    batches = []
    for batch in ids:
        f, m = step_cost(config, 1, 1, batch, dtype)
        p = roofline_time(f, m, flops_per_s, bandwidth)
        batches.append(
            {
                "batch": batch,
                "intensity": f / m,
                "predicted_tokens_per_s": batch / p,
                "measured_tokens_per_s": batch / med[f"decode {batch}"],
                **({"graph_tokens_per_s": batch / med[f"graph {batch}"]} if cuda else {}),
            }
        )
    sheet = datasheet(record["device"]) if cuda else None
    return {
        "device": record["device"],
        "device_type": torch.device(device).type,
        "dtype": record["dtype"],
        "threads": record["threads"],
        "rounds": rounds,
        "record": record,
        "bandwidth": bandwidth,
        "bandwidth_kernel": ceiling_kernel,
        "bandwidth_per_kernel": rates,
        "array_bytes": array_bytes,
        **({"datasheet": {"name": sheet.name, "bandwidth": sheet.bandwidth, "source": sheet.source}} if sheet else {}),
        "matmul_flops": flops_per_s,
        "matmul_n": n,
        "ridge": flops_per_s / bandwidth,
        "gemv": {
            "bytes_per_s": gemv_bytes / med["gemv"],
            "fraction_of_bandwidth": gemv_bytes / med["gemv"] / bandwidth,
            "matrices": len(gemv_shapes) * config.n_layers,
            "shapes": gemv_shapes,
            "other_order_bytes_per_s": gemv_bytes / med["gemv flipped"],
        },
        "decode": {
            "config": config.to_dict(),
            "weight_bytes_read": moved,
            "flops": flops,
            "predicted_s": predicted,
            **timed("decode 1"),
            **({"graph": timed("graph 1")} if cuda else {}),
            **(
                {"compiled": timed("compiled 1")}
                if "compiled 1" in med
                else {"compile_error": compile_error}
                if compile_error
                else {}
            ),
        },
        "batches": batches,
    }


def bench_memory(threads: int = 1, quick: bool = False, devices: list[str] | None = None) -> dict:
    """Notebook 05's measurements on the CPU (threads), and on the GPU too when CUDA is available.

    devices: e.g. ["cuda"] for the GPU alone; by default the CPU, then the GPU if there is one.
    The same JSON, saved under assets/recordings/, is what notebook 05 shows as a GPU recording.
    """
    devices = devices or ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for d in devices:
        if torch.device(d).type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {d!r}: torch {torch.__version__} sees no CUDA GPU here")
    runs = [_memory_run(d, threads if torch.device(d).type == "cpu" else None, quick) for d in devices]
    return {
        "benchmark": "memory",
        "date": datetime.date.today().isoformat(),
        "quick": quick,
        "record": timing.environment("cpu", threads_requested=threads),
        "runs": runs,
    }


def _rebased(r: dict) -> str:
    """An older recording's decode rates against the highest rate it holds (its kernels and its GEMV)."""
    rates = {KERNEL_NAMES[k]: v for k, v in r["bandwidth_per_kernel"].items()}
    if "gemv" in r:
        rates["matrix-vector"] = r["gemv"]["bytes_per_s"]
    best = max(rates, key=rates.get)
    d = r["decode"]
    ways = [
        ("eager" if "graph" in d else "measured", d),
        ("as a CUDA graph", d.get("graph")),
        ("torch.compile", d.get("compiled")),
    ]
    shares = ", ".join(f"{name} {t['achieved_bytes_per_s'] / rates[best]:.0%}" for name, t in ways if t)
    return (
        f"  against the highest rate this recording holds ({best}, {rates[best] / 1e9:.1f} GB/s), as a new "
        f"recording would take it: {shares}"
    )


def format_memory(report: dict) -> str:
    lines = [
        f"kvlib bench memory ({report['date']}, torch {report['record']['torch']}){' --quick' if report['quick'] else ''}"
    ]
    for r in report["runs"]:
        d, kernel = r["decode"], r.get("bandwidth_kernel", "read")
        legacy = "multi_read" not in r["bandwidth_per_kernel"]  # recordings before 2026-12-01 took read as the ceiling
        sheet = r.get("datasheet")
        of_sheet = (
            (
                f" = {r['bandwidth'] / sheet['bandwidth']:.0%} of the {sheet['name']} datasheet's "
                f"{sheet['bandwidth'] / 1e9:.0f} GB/s"
            )
            if sheet
            else ""
        )

        def way(name: str, t: dict) -> str:
            flag = (
                f"\n    {below_one(t['measured_over_predicted'], kernel, legacy)}"
                if t["measured_over_predicted"] < 1
                else ""
            )
            return (
                f"  {name}: {t['measured_s'] * 1e3:.2f} ms (measured/predicted {t['measured_over_predicted']:.2f}); "
                f"{t['achieved_bytes_per_s'] / 1e9:.1f} GB/s = {t['fraction_of_bandwidth']:.0%} of the ceiling "
                f"({t['fraction_of_bandwidth_per_round']:.0%} as the median of per-round ratios){flag}"
            )

        lines += [
            "",
            f"{r['device']} ({r['device_type']}, {r['threads']} thread(s)), {r['dtype']}, median of {r['rounds']} interleaved rounds",
            "  bandwidth   "
            + ", ".join(f"{KERNEL_NAMES[k]} {v / 1e9:.1f}" for k, v in r["bandwidth_per_kernel"].items())
            + f" GB/s ({r['array_bytes'] >> 20} MB arrays)",
            (
                f"  ceiling     {r['bandwidth'] / 1e9:.1f} GB/s, the read rate: this older recording took it as the ceiling, "
                + (
                    "though "
                    + " and ".join(k for k, v in r["bandwidth_per_kernel"].items() if v > r["bandwidth"])
                    + " ran faster "
                    if any(v > r["bandwidth"] for v in r["bandwidth_per_kernel"].values())
                    else ""
                )
                + "(a new recording takes the highest of five kernels)"
                if legacy
                else f"  ceiling     {r['bandwidth'] / 1e9:.1f} GB/s, the highest of them ({KERNEL_NAMES[kernel]}){of_sheet}"
            ),
            f"  matmul      {r['matmul_flops'] / 1e9:.1f} GFLOP/s ({r['matmul_n']}^3); ridge {r['ridge']:.1f} FLOP/B",
            *(
                [
                    f"  gemv        one vector times {r['gemv']['matrices']} matrices of "
                    + " and ".join(f"{a}x{b}" for a, b in r["gemv"].get("shapes", [r["gemv"].get("shape")]))
                    + ": "
                    f"{r['gemv']['bytes_per_s'] / 1e9:.1f} GB/s = {r['gemv']['fraction_of_bandwidth']:.0%} of the ceiling"
                ]
                if "gemv" in r
                else []
            ),
            *(
                [
                    f"              each stored in the other memory order than kvlib.core.model.decode_layout picked: "
                    f"{r['gemv']['other_order_bytes_per_s'] / 1e9:.1f} GB/s (kvlib's choice: "
                    f"{r['gemv']['bytes_per_s'] / r['gemv']['other_order_bytes_per_s']:.2f}x as fast)"
                ]
                if "other_order_bytes_per_s" in r.get("gemv", {})
                else []
            ),
            f"  decode step ({d['weight_bytes_read'] / 1e6:.0f} MB of weights): predicted {d['predicted_s'] * 1e3:.2f} ms "
            "(bytes / ceiling, roofline_time)",
            way("eager" if "graph" in d else "measured", d),
            *([way("as a CUDA graph", d["graph"])] if "graph" in d else []),
            *(
                [
                    way(
                        (
                            "torch.compile (fused kernels, CUDA graphs; "
                            if r["device_type"] == "cuda"
                            else "torch.compile (inductor, weights frozen and repacked for its kernels; "
                        )
                        + (
                            "three graphs: check_input's range check broke it twice, each a sync with the host"
                            if legacy
                            else "one graph, fullgraph=True"
                        )
                        + ")",
                        d["compiled"],
                    )
                ]
                if "compiled" in d
                else []
            ),
            *([f"  torch.compile failed: {d['compile_error']}"] if "compile_error" in d else []),
            *([_rebased(r)] if legacy else []),
            f"  {'batch':>7} {'FLOP/B':>8} {'predicted tok/s':>16} {'measured tok/s':>15}"
            + (f" {'CUDA graph tok/s':>17}" if "graph" in d else ""),
        ]
        for b in r["batches"]:
            lines.append(
                f"  {b['batch']:>7} {b['intensity']:>8.1f} {b['predicted_tokens_per_s']:>16.1f} {b['measured_tokens_per_s']:>15.1f}"
                + (f" {b['graph_tokens_per_s']:>17.1f}" if "graph_tokens_per_s" in b else "")
            )
    return "\n".join(lines)
