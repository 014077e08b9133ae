"""The figures of Notebook 05 (the memory wall): one function per figure, each returning a closed matplotlib Figure."""

from __future__ import annotations

import matplotlib
import matplotlib.pyplot as plt
import numpy as np

from kvlib.course.figures.style import PALETTE, _finish, _note, style


def _si(value: float, unit: str) -> str:
    """1.2e12, "FLOP/s" -> "1.2 TFLOP/s": the largest prefix that keeps the number at or above 1."""
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def roofline(roofs, points=(), *, title=None, xlim=(0.1, 1000), note=None):
    """Roofline plot: attainable FLOP/s against arithmetic intensity (FLOPs per byte), log-log.

    Args:    roofs: [(label, peak_flops, bandwidth)], FLOP/s and bytes/s; the first is drawn boldest
                    and its ridge point marked
             points: [(label, intensity, flops_per_s)], e.g. measured decode and prefill steps
             title: the takeaway; by default where the first point sits against the first ridge
             note: what produced the numbers, printed under the axes
    Returns: the Figure
    """
    x = np.logspace(np.log10(xlim[0]), np.log10(xlim[1]), 400)
    roof_colors = [PALETTE[c] for c in ("blue", "orange", "green", "purple", "sky", "black")]
    point_colors = [PALETTE[c] for c in ("vermillion", "green", "purple", "black", "sky")]
    top = max([p for _, p, _ in roofs] + [a for _, _, a in points])  # the highest roof or point
    rows = -(-(len(roofs) + len(points)) // 2)  # the legend's rows, two entries a row, under the axes
    height = 5.4 + 0.3 * rows  # inches: the axes keep their size whatever the legend holds
    with style():
        fig, ax = plt.subplots(figsize=(10, height))
        fig.subplots_adjust(left=0.12, right=0.97, bottom=(1.05 + 0.3 * rows) / height, top=1 - 0.55 / height)
        for i, (label, peak, bw) in enumerate(roofs):
            ridge = peak / bw
            ax.loglog(
                x,
                np.minimum(peak, x * bw),
                lw=3 if i == 0 else 1.8,
                color=roof_colors[i % len(roof_colors)],
                alpha=1 if i == 0 else 0.8,
                label=f"{label}: {_si(peak, 'FLOP/s')}, {_si(bw, 'B/s')}, ridge {ridge:.3g}",
            )
            if i == 0:
                ax.axvline(ridge, color=roof_colors[0], ls=":", lw=1.2)
                ax.axvspan(xlim[0], ridge, color=PALETTE["sky"], alpha=0.12, lw=0)
                # beside the dotted line, on the side with room: right of it unless it stands in the right quarter
                right = np.log(ridge / xlim[0]) < 0.75 * np.log(xlim[1] / xlim[0])
                ax.text(  # above every roof, where no line runs
                    ridge * (1.12 if right else 1 / 1.12),
                    top * 1.4,
                    f"ridge {ridge:.3g} FLOP/B",
                    ha="left" if right else "right",
                    va="bottom",
                    fontsize=11,
                    color=roof_colors[0],
                )
                ax.text(xlim[0] * 1.3, top * 1.4, "memory-bound", ha="left", va="bottom", fontsize=11, color="#555555")
        for j, (label, intensity, achieved) in enumerate(points):
            color = point_colors[j % len(point_colors)]
            ax.loglog(
                [intensity],
                [achieved],
                "o",
                ms=10,
                color=color,
                label=f"{label}: {intensity:.3g} FLOP/B, {_si(achieved, 'FLOP/s')}",
            )
        lows = [x[0] * bw for _, _, bw in roofs] + [a for _, _, a in points]
        ax.set_ylim(min(lows) / 2, top * 4)
        ax.set_xlim(*xlim)
        ax.set_xlabel("arithmetic intensity (FLOPs per byte moved)")
        ax.set_ylabel("attainable FLOP/s")
        if title is None:
            ridge = roofs[0][1] / roofs[0][2]
            if points:  # each wording whole, as the catalogue translates it
                title = (
                    f"{points[0][0]} sits left of the ridge: memory-bound"
                    if points[0][1] < ridge
                    else f"{points[0][0]} sits right of the ridge: compute-bound"
                )
            else:
                title = f"{roofs[0][0]}: left of {ridge:.3g} FLOP/B, memory sets the speed"
        ax.set_title(title)
        fig.legend(  # under the axes, over nothing drawn: between the x-axis's label and the note
            *ax.get_legend_handles_labels(),
            loc="lower center",
            bbox_to_anchor=(0.5, 0.3 / height),
            ncol=2,
            frameon=False,
            fontsize=10,
        )
        _note(fig, note)
    return _finish(fig)


def _readable_log_axis(axis) -> None:
    """Tick labels at 1, 2 and 5 of each decade, as plain numbers: a log axis spanning a decade or two otherwise
    labels one or two powers of ten."""
    axis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 100 else f"{v:.3g}"))
    axis.set_minor_locator(matplotlib.ticker.NullLocator())


def bytes_against_kv_len(
    kv_lens, weight_bytes, kv_bytes_per_token, *, batches=(1,), sliding_window=None, context=None, model="", note=None
):
    """Weights against KV cache bytes over kv_len, the tokens each sequence has seen (log-log), one KV
    line per batch size.

    Args:    kv_lens: (n,) tokens of context, per sequence   weight_bytes: bytes of the weights
             kv_bytes_per_token: KV bytes of one token of one sequence   batches: batch sizes to draw
             sliding_window: tokens the model caches at most (Mistral-7B: 4,096; RealModel.sliding_window),
             None if it caches every token: past it each KV line is flat, and the window is marked
             context: the tokens the model was trained on (RealModel.context); past it the figure is a what-if,
             shaded and labelled so
    Returns: the Figure; each batch's crossover (cache == weights) is marked, where there is one
    """
    n = np.asarray(kv_lens, dtype=float)
    if sliding_window is not None and n[0] < sliding_window < n[-1]:
        n = np.union1d(n, [sliding_window])  # a sharp corner where the cache stops growing
    held = n if sliding_window is None else np.minimum(n, sliding_window)  # tokens actually in the cache
    batches = sorted(set(batches))
    colors = [PALETTE[c] for c in ("blue", "vermillion", "green", "purple", "sky")]
    with style():
        fig, ax = plt.subplots(figsize=(10, 5.8))
        fig.subplots_adjust(left=0.12, right=0.97, bottom=0.19, top=0.9)
        ax.loglog(
            n,
            np.full_like(n, weight_bytes / 1e9),
            lw=3,
            color=PALETTE["black"],
            label=f"weights: {weight_bytes / 1e9:.1f} GB",
        )
        crossings = []
        for i, batch in enumerate(batches):
            kv = held * kv_bytes_per_token * batch / 1e9
            ax.loglog(n, kv, lw=2.2, color=colors[i % len(colors)], label=f"KV cache, batch {batch}")
            cross = weight_bytes / (kv_bytes_per_token * batch)
            if sliding_window is not None and cross > sliding_window:
                cross = None  # the window stops the cache below the weights
            if cross is not None and n[0] <= cross <= n[-1]:
                ax.plot([cross], [weight_bytes / 1e9], "o", ms=9, color=colors[i % len(colors)])
                ax.annotate(
                    f"{cross:,.0f} tokens",
                    (cross, weight_bytes / 1e9),
                    xytext=(0, 12),
                    textcoords="offset points",
                    ha="center",
                    fontsize=11,
                    color=colors[i % len(colors)],
                )
            crossings.append((batch, cross))
        marks = []  # (tokens, line style, label, height in the axes, alignment): the context in the room at the top
        if sliding_window is not None and n[0] <= sliding_window <= n[-1]:
            window_label = f"sliding\nwindow:\n{sliding_window:,}\ntokens"  # narrow: a context line may follow it
            marks.append((sliding_window, ":", window_label, 0.03, "bottom"))
        if context is not None and n[0] < context < n[-1]:
            ax.axvspan(context, n[-1], color="grey", alpha=0.1, lw=0)
            context_label = f"trained on {context:,} tokens:\npast it, a what-if"
            marks.append((context, "--", context_label, 0.97, "top"))
        for x, ls, label, y, va in marks:
            ax.axvline(x, ls=ls, lw=1.5, color="grey")
            ax.annotate(
                label,
                (x, y),
                xycoords=("data", "axes fraction"),
                xytext=(6, 0),
                textcoords="offset points",
                fontsize=11,
                color="grey",
                va=va,
            )
        ax.set_xlabel("kv_len (tokens of context, per sequence)")
        ax.set_ylabel("memory (GB)")
        top = max(weight_bytes, held[-1] * kv_bytes_per_token * batches[-1]) / 1e9
        ax.set_ylim(top=top * 15)  # room for the legend above every line
        batch, cross = crossings[-1]
        model = f"{model}: " if model else ""  # the title's own field: the catalogue translates the whole title
        if cross is None:
            cap = sliding_window * kv_bytes_per_token * batch / 1e9
            title = f"{model}the window caps the cache at {cap:.1f} GB (batch {batch})"
        else:
            title = f"{model}cache > weights from {cross:,.0f} tokens at batch {batch}"
        ax.set_title(title)
        ax.legend(loc="upper left", frameon=False)
        _note(fig, note)
    return _finish(fig)


def decode_against_batch(
    batches, measured_tps, predicted_tps, intensities, ridge, *, note=None, roof_label="roofline prediction"
):
    """Decode throughput against batch size: measured and roofline-predicted, with the ridge crossing.

    Args:    batches: (n,) batch sizes   measured_tps, predicted_tps: (n,) tokens/s
             intensities: (n,) FLOPs per byte of each step   ridge: the machine's ridge point (FLOP/B)
             roof_label: the prediction's legend entry (say which memory's bandwidth it assumes)
    Returns: the Figure (left: tokens/s; right: arithmetic intensity against the ridge)
    """
    b = np.asarray(batches, dtype=float)
    measured_tps, predicted_tps, intensities = (
        np.asarray(a, dtype=float) for a in (measured_tps, predicted_tps, intensities)
    )
    with style():
        fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 5.6))
        fig.subplots_adjust(left=0.08, right=0.98, bottom=0.2, top=0.86, wspace=0.25)
        ax.loglog(b, predicted_tps, "--", lw=2, color=PALETTE["black"], label=roof_label)
        ax.loglog(b, measured_tps, "o-", lw=2.5, ms=7, color=PALETTE["vermillion"], label="measured (median)")
        bx.loglog(b, intensities, "o-", lw=2.5, ms=7, color=PALETTE["blue"], label="decode step")
        bx.axhline(ridge, color=PALETTE["black"], ls=":", lw=1.5, label=f"ridge of this machine: {ridge:.3g}")
        for axis in (ax, bx):
            axis.set_xscale("log", base=2)
            axis.set_xticks(b, [str(int(v)) for v in b])
            axis.minorticks_off()
            _readable_log_axis(axis.yaxis)
            axis.set_xlabel("batch size (sequences decoded together)")
        ax.legend(loc="best", frameon=False)  # the roofline rises through the upper left
        bx.legend(loc="upper left", frameon=False)
        ax.set_ylabel("tokens per second")
        ax.set_title("Throughput")
        bx.set_ylabel("FLOPs per byte moved")
        bx.set_title("Arithmetic intensity")
        gain, predicted = measured_tps[-1] / measured_tps[0], predicted_tps[-1] / predicted_tps[0]
        fig.suptitle(  # worded by this run's numbers: the measured gain need not stop at the ridge; each whole
            f"Batch {int(b[-1])} decoded {gain:.1f}x the tokens/s of batch 1 (the roofline: {predicted:.1f}x, "
            f"capped past the ridge at {ridge:.3g} FLOP/B)"
            if intensities[-1] > ridge
            else f"Batch {int(b[-1])} decoded {gain:.1f}x the tokens/s of batch 1 (the roofline: {predicted:.1f}x)"
        )
        _note(fig, note)
    return _finish(fig)
