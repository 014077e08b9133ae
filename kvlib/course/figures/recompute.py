"""The figures of Notebook 03 (the waste of recomputing): one function per figure, each returning a closed matplotlib Figure."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from kvlib.course.figures.style import PALETTE, _finish, _note, style


def naive_decode_work(new_tokens, naive, needed, *, projections=None, attention=None, note=None):
    """Cumulative FLOPs of generating N tokens, naively against only what is needed, on log-log axes.

    Args:    new_tokens: (n,) values of N   naive, needed: (n,) total FLOPs after N tokens
             projections, attention: (n,) the two parts of `naive`, drawn dashed with their growth
             note: what produced the numbers, printed under the axes
    Returns: the Figure
    """
    n = np.asarray(new_tokens, dtype=float)
    with style():
        fig, ax = plt.subplots(figsize=(9, 5.5))
        fig.subplots_adjust(left=0.12, right=0.97, bottom=0.18, top=0.9)
        ax.loglog(n, naive, lw=2.5, color=PALETTE["vermillion"], label="naive: every step re-runs everything")
        if projections is not None:
            ax.loglog(
                n, projections, ls="--", lw=1.5, color=PALETTE["orange"], label="  of which projections and MLP (~N²)"
            )
        if attention is not None:
            ax.loglog(n, attention, ls=":", lw=2.5, color=PALETTE["purple"], label="  of which attention (~N³)")
        ax.loglog(n, needed, lw=2.5, color=PALETTE["green"], label="kept: each token once ($aN + cN^2/2$)")
        ticks = sorted({v for v in (1, 10, 100, 1000, 10000) if v < n[-1]} | {int(n[-1])})
        ax.set_xticks(ticks, [f"{v:,}" for v in ticks])
        ax.minorticks_off()
        ax.set_xlabel("tokens generated, N")
        ax.set_ylabel("total work (FLOPs)")
        ratio = naive[-1] / needed[-1]
        ax.set_title(f"Naive decoding does {ratio:.0f}x the work of kept decoding for {int(n[-1])} tokens")
        ax.legend(loc="upper left", frameon=False)
        _note(fig, note)
    return _finish(fig)


def step_time_fit(kv_lens, medians_ms, lows_ms, highs_ms, fitted_ms=None, *, fit_label="fit", note=None):
    """Measured time of each naive decode step against its sequence length, with a fitted curve if one is given.

    Args:    kv_lens: (n,) tokens each step runs through the model
             medians_ms, lows_ms, highs_ms: (n,) step times over repeated runs, milliseconds
             fitted_ms: (n,) a fitted curve at kv_lens, or None   fit_label: its formula, for the legend
             note: printed under the axes
    Returns: the Figure; its title gives the ratio of the last step's median to the first's
    """
    x = np.asarray(kv_lens)
    with style():
        fig, ax = plt.subplots(figsize=(9, 5.5))
        fig.subplots_adjust(left=0.11, right=0.97, bottom=0.18, top=0.9)
        ax.fill_between(x, lows_ms, highs_ms, color=PALETTE["sky"], alpha=0.35, lw=0, label="min to max")
        ax.plot(
            x, medians_ms, "o", ms=5, color=PALETTE["blue"], label="measured step (median)"
        )  # visible from the back of a room
        if fitted_ms is not None:
            ax.plot(x, fitted_ms, lw=2.5, color=PALETTE["vermillion"], label=fit_label)
        ax.set_ylim(0, None)
        ax.set_xlim(0, x[-1] * 1.02)
        ax.set_xlabel("tokens re-run in this step (kv_len)")
        ax.set_ylabel("step time (ms)")
        grows = float(medians_ms[-1]) / float(medians_ms[0])  # the title says what this run measured
        ax.set_title(
            f"The step at {int(x[-1])} tokens took {grows:.1f}x the step at {int(x[0])} (medians)"
            if grows > 1
            else f"This run's step at {int(x[-1])} tokens was no slower than at {int(x[0])}: time it again"
        )
        ax.legend(loc="upper left", frameon=False)
        _note(fig, note)
    return _finish(fig)
