"""`kvlib bench memory` (notebook 05): memory bandwidth, matmul FLOP/s, and a memory-bound decode step,
predicted from bytes / bandwidth (the learner's roofline_time and step_cost) and measured; on a
CUDA GPU also replayed as a CUDA graph and through torch.compile.
"""
from __future__ import annotations

import statistics
import time

import torch

from kvlib.core.configs import gpu_decode_config, memory_bound_config, quick_memory_config
from kvlib.measure import timing
from kvlib.measure.machine import bandwidth_kernels, random_model

# ---------------------------------------------------------------------------------------------
# kvlib bench memory (notebook 05): bandwidth, matmul FLOP/s, and a memory-bound decode step


def _memory_run(device: str, threads: int | None, quick: bool) -> dict:
    """The measurements of notebook 05 on one device: bandwidth, matmul, decode predicted and measured, batches.

    Bandwidth, matmul and the decode step are timed once per round, rounds interleaved, so that a
    busy neighbour slows all three alike; each is the median over rounds, and the decode's
    fraction of the bandwidth is also given as the median of the per-round ratios. On a GPU each
    decode step is timed twice: as kvlib runs it (eager: one kernel launch per operation, from
    Python) and replayed as a CUDA graph (timing.replayable), which leaves the GPU no idle gaps;
    and at batch 1 a third time, through torch.compile (mode "reduce-overhead": fused kernels
    replayed as CUDA graphs), recorded as an error instead should the compiler fail.
    """
    from kvlib.roofline import roofline_time, step_cost  # the learner's Exercises 5.2 and 5.4

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
    kernels = bandwidth_kernels(array_bytes, device)
    a, b = (torch.randn(n, n, device=device).to(dtype) for _ in range(2))
    with torch.device(device):  # build the weights where they will run: no host copy of a multi-GB model
        model = random_model(config, dtype=dtype, device=device)
    ids = {batch: torch.randint(0, config.vocab_size, (batch, 1), device=device) for batch in batch_sizes}
    # the decode step's own kind of kernel, alone: one token's vector times each layer's largest matrix
    downs = [layer.mlp.down_proj.weight for layer in model.layers]
    vec = torch.randn(1, downs[0].shape[1], device=device, dtype=dtype)
    gemv_bytes = sum(w.nbytes for w in downs)
    with timing.num_threads(threads), torch.inference_mode():
        jobs = {**{k: fn for k, (fn, _) in kernels.items()}, "matmul": lambda: a @ b,
                "gemv": timing.replayable(lambda: [torch.nn.functional.linear(vec, w) for w in downs], device),
                **{f"decode {batch}": (lambda x=x: model(x)) for batch, x in ids.items()}}
        compile_error = None
        if cuda:
            jobs |= {f"graph {batch}": timing.replayable(lambda x=x: model(x), device) for batch, x in ids.items()}
            if not quick:  # fused kernels too: torch.compile, its CUDA graphs included ("reduce-overhead"), batch 1
                try:
                    compiled, x1 = torch.compile(model, mode="reduce-overhead"), ids[1]
                    for _ in range(3):  # compile, record the graph, replay
                        compiled(x1)
                    jobs["compiled 1"] = lambda: compiled(x1)
                except Exception as err:  # a compiler that fails here must not cost the rest of the recording
                    compile_error = f"{type(err).__name__}: {str(err)[:300]}"
        samples = {k: [] for k in jobs}
        for fn in jobs.values():  # warm-up: first touches, kernel selection
            fn()
        for _ in range(rounds):
            for k, fn in jobs.items():
                timing.synchronize(device)
                start = time.perf_counter()
                fn()
                timing.synchronize(device)
                samples[k].append(time.perf_counter() - start)
        record = timing.environment(device, dtype=str(dtype).removeprefix("torch."), rounds=rounds)
    gemv_shape, n_matrices = list(downs[0].shape), len(downs)
    del model, jobs, downs
    med = {k: statistics.median(v) for k, v in samples.items()}
    rates = {k: moved / med[k] for k, (_, moved) in kernels.items()}
    bandwidth, flops_per_s = rates["read"], 2 * n**3 / med["matmul"]
    flops, moved = step_cost(config, 1, 1, 1, dtype)
    predicted = roofline_time(flops, moved, flops_per_s, bandwidth)

    def timed(key: str) -> dict:  # one way of running the batch-1 decode step, against the prediction
        per_round = [(moved / t) / (kernels["read"][1] / r) for t, r in zip(samples[key], samples["read"])]
        t = med[key]
        return {"measured_s": t, "spread_s": [min(samples[key]), max(samples[key])], "measured_over_predicted": t / predicted,
                "achieved_bytes_per_s": moved / t, "fraction_of_bandwidth": moved / t / bandwidth,
                "fraction_of_bandwidth_per_round": statistics.median(per_round)}

    batches = []
    for batch in ids:
        f, m = step_cost(config, 1, 1, batch, dtype)
        p = roofline_time(f, m, flops_per_s, bandwidth)
        batches.append({"batch": batch, "intensity": f / m, "predicted_tokens_per_s": batch / p,
                        "measured_tokens_per_s": batch / med[f"decode {batch}"],
                        **({"graph_tokens_per_s": batch / med[f"graph {batch}"]} if cuda else {})})
    return {
        "device": record["device"], "device_type": torch.device(device).type, "dtype": record["dtype"],
        "threads": record["threads"], "rounds": rounds, "record": record,
        "bandwidth": bandwidth, "bandwidth_kernel": "read", "bandwidth_per_kernel": rates, "array_bytes": array_bytes,
        "matmul_flops": flops_per_s, "matmul_n": n, "ridge": flops_per_s / bandwidth,
        "gemv": {"bytes_per_s": gemv_bytes / med["gemv"], "fraction_of_bandwidth": gemv_bytes / med["gemv"] / bandwidth,
                 "matrices": n_matrices, "shape": gemv_shape},
        "decode": {"config": config.to_dict(), "weight_bytes_read": moved, "flops": flops, "predicted_s": predicted,
                   **timed("decode 1"), **({"graph": timed("graph 1")} if cuda else {}),
                   **({"compiled": timed("compiled 1")} if "compiled 1" in med else {"compile_error": compile_error} if compile_error else {})},
        "batches": batches,
    }


def bench_memory(threads: int = 1, quick: bool = False, devices: list[str] | None = None) -> dict:
    """Notebook 05's measurements on the CPU (threads), and on the GPU too when CUDA is available.

    devices: e.g. ["cuda"] for the GPU alone; by default the CPU, then the GPU if there is one.
    The same JSON, saved under assets/recordings/, is what notebook 05 shows as a GPU recording.
    """
    import datetime

    devices = devices or ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for d in devices:
        if torch.device(d).type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {d!r}: torch {torch.__version__} sees no CUDA GPU here")
    runs = [_memory_run(d, threads if torch.device(d).type == "cpu" else None, quick) for d in devices]
    return {"benchmark": "memory", "date": datetime.date.today().isoformat(), "quick": quick,
            "record": timing.environment("cpu", threads_requested=threads), "runs": runs}


def format_memory(report: dict) -> str:
    lines = [f"kvlib bench memory ({report['date']}, torch {report['record']['torch']}){' --quick' if report['quick'] else ''}"]
    for r in report["runs"]:
        d = r["decode"]
        lines += ["", f"{r['device']} ({r['device_type']}, {r['threads']} thread(s)), {r['dtype']}, median of {r['rounds']} interleaved rounds",
                  "  bandwidth   " + ", ".join(f"{k} {v / 1e9:.1f}" for k, v in r["bandwidth_per_kernel"].items())
                  + f" GB/s over {r['array_bytes'] >> 20} MB arrays -> read: {r['bandwidth'] / 1e9:.1f} GB/s",
                  f"  matmul      {r['matmul_flops'] / 1e9:.1f} GFLOP/s ({r['matmul_n']}^3); ridge {r['ridge']:.1f} FLOP/B",
                  *([f"  gemv        {r['gemv']['bytes_per_s'] / 1e9:.1f} GB/s = {r['gemv']['fraction_of_bandwidth']:.0%} of the read "
                     f"bandwidth (one vector times {r['gemv']['matrices']} matrices of {r['gemv']['shape'][0]}x{r['gemv']['shape'][1]})"]
                    if "gemv" in r else []),
                  f"  decode step ({d['weight_bytes_read'] / 1e6:.0f} MB of weights): predicted {d['predicted_s'] * 1e3:.2f} ms, "
                  f"measured {d['measured_s'] * 1e3:.2f} ms (measured/predicted {d['measured_over_predicted']:.2f}); "
                  f"{d['achieved_bytes_per_s'] / 1e9:.1f} GB/s = {d['fraction_of_bandwidth']:.0%} of the bandwidth "
                  f"({d['fraction_of_bandwidth_per_round']:.0%} as the median of {r['rounds']} interleaved rounds)",
                  *([f"  as a CUDA graph: {d['graph']['measured_s'] * 1e3:.2f} ms (measured/predicted "
                     f"{d['graph']['measured_over_predicted']:.2f}); {d['graph']['achieved_bytes_per_s'] / 1e9:.1f} GB/s = "
                     f"{d['graph']['fraction_of_bandwidth']:.0%} of the bandwidth"] if "graph" in d else []),
                  *([f"  torch.compile (fused kernels, CUDA graphs): {d['compiled']['measured_s'] * 1e3:.2f} ms (measured/predicted "
                     f"{d['compiled']['measured_over_predicted']:.2f}); {d['compiled']['achieved_bytes_per_s'] / 1e9:.1f} GB/s = "
                     f"{d['compiled']['fraction_of_bandwidth']:.0%} of the bandwidth"] if "compiled" in d else []),
                  *([f"  torch.compile failed: {d['compile_error']}"] if "compile_error" in d else []),
                  f"  {'batch':>7} {'FLOP/B':>8} {'predicted tok/s':>16} {'measured tok/s':>15}"
                  + (f" {'CUDA graph tok/s':>17}" if "graph" in d else "")]
        for b in r["batches"]:
            lines.append(f"  {b['batch']:>7} {b['intensity']:>8.1f} {b['predicted_tokens_per_s']:>16.1f} {b['measured_tokens_per_s']:>15.1f}"
                         + (f" {b['graph_tokens_per_s']:>17.1f}" if "graph_tokens_per_s" in b else ""))
    return "\n".join(lines)
