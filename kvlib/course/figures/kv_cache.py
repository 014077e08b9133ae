"""The figures of Notebook 04 (the KV cache): one function per figure, each returning a closed matplotlib Figure."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch

from kvlib.course.figures.style import MASKED_GREY, PALETTE, _finish, _note, style, token_label


def decode_step_scores(tokens):
    """The scores one decode step computes, without a cache (all N x N) and with one (the last row).

    Args:    tokens: the N tokens of the sequence; the last one is the token being decoded
    Returns: the Figure (two panels: naive step, cached step)
    """
    labels = [token_label(t) for t in tokens]
    N = len(labels)
    i, j = np.indices((N, N))
    # 0 masked (future), 1 computed again (earlier steps had it), 2 new: the decoded token's row
    naive = np.where(j > i, 0, np.where(i == N - 1, 2, 1))
    cached = np.where(i == N - 1, 2, -1)  # -1: not computed at all
    cmap = ListedColormap(["white", MASKED_GREY, PALETTE["sky"], PALETTE["vermillion"]])
    with style():
        size = max(3.6, 0.55 * N + 1.4)
        fig, axes = plt.subplots(1, 2, figsize=(2 * size + 1.2, size + 1.9))
        fig.subplots_adjust(
            left=0.11, right=0.98, bottom=0.24, top=0.84, wspace=0.28
        )  # room for "query" beside the labels
        titles = (f"No cache: {N} x {N} scores", f"Cache: 1 x {N} scores")  # whole texts: the catalogue's keys
        for ax, grid, title in zip(axes, (naive, cached), titles):
            ax.imshow(grid, cmap=cmap, vmin=-1.5, vmax=2.5)
            ax.set_xticks(np.arange(-0.5, N), minor=True)
            ax.set_yticks(np.arange(-0.5, N), minor=True)
            ax.grid(which="minor", color="white", lw=2)
            ax.tick_params(which="both", length=0)
            ax.set_xticks(range(N), labels)
            ax.set_yticks(range(N), labels)
            ax.set_title(title)
            for side in ax.spines.values():
                side.set_visible(False)
        axes[0].set_ylabel("query")
        axes[0].set_xlabel("key")
        axes[1].set_xlabel("key (the cache holds these)")
        handles = [
            Patch(color=PALETTE["vermillion"], label="new: the decoded token's query against every key"),
            Patch(color=PALETTE["sky"], label="computed again: earlier steps had these"),
            Patch(color=MASKED_GREY, label="masked: a key in the query's future"),
        ]
        fig.legend(handles=handles, loc="lower center", ncol=1, frameon=False, fontsize=12)
        fig.suptitle("A cached decode step computes one row of scores")
    return _finish(fig)


def cache_time_against_length(new_tokens, naive_s, cached_s, *, naive_fit=None, cached_fit=None, marks=(), note=None):
    """Total time to generate N tokens without and with a KV cache (log-log), and the speedup.

    Args:    new_tokens: (n,) values of N   naive_s, cached_s: (n,) seconds to produce the first N tokens
             naive_fit, cached_fit: (coefficient, exponent) of a power law c * N^k, drawn dashed
             marks: a few N to label with their speedup
             note: what produced the numbers, printed under the axes
    Returns: the Figure (left: time, right: speedup)
    """
    n = np.asarray(new_tokens, dtype=float)
    naive_s, cached_s = np.asarray(naive_s, dtype=float), np.asarray(cached_s, dtype=float)
    speedup = naive_s / cached_s
    with style():
        fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 5.6), gridspec_kw={"width_ratios": [1.35, 1]})
        fig.subplots_adjust(left=0.08, right=0.98, bottom=0.2, top=0.86, wspace=0.26)
        labels = ("no cache (median)", "KV cache (median)")  # whole texts: the catalogue's keys
        for s, fit, color, label in zip(
            (naive_s, cached_s), (naive_fit, cached_fit), (PALETTE["vermillion"], PALETTE["blue"]), labels
        ):
            ax.loglog(n, s, lw=2.5, color=color, label=label)
            if fit is not None:
                c, k = fit
                ax.loglog(
                    n,
                    c * n**k,
                    ls="--",
                    lw=1.5,
                    color=PALETTE["black"] if color == PALETTE["blue"] else color,
                    label=f"  fit: ~$N^{{{k:.2f}}}$",
                )
        ticks = [int(m) for m in marks] or [
            int(v) for v in 2.0 ** np.arange(np.ceil(np.log2(n[0])), np.floor(np.log2(n[-1])) + 1)
        ]
        ax.set_xticks(ticks, [str(v) for v in ticks])
        lo, hi = min(naive_s.min(), cached_s.min()), max(naive_s.max(), cached_s.max())
        yticks = [
            v
            for v in (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100)
            if lo / 1.5 <= v <= hi * 1.5
        ]
        ax.set_yticks(yticks, [f"{v:g}" for v in yticks])  # plain seconds: a log axis alone labels only powers of 10
        ax.minorticks_off()
        ax.set_xlabel("new tokens generated, N")
        ax.set_ylabel("total time (s)")
        ax.set_title("Total time")
        ax.legend(loc="upper left", frameon=False)
        bx.plot(n, speedup, lw=2.5, color=PALETTE["green"])
        for m in marks:
            i = int(np.argmin(np.abs(n - m)))
            bx.plot(n[i], speedup[i], "o", ms=7, color=PALETTE["black"])
            bx.annotate(
                f"{speedup[i]:.1f}x",
                (n[i], speedup[i]),
                xytext=(0, 10),
                textcoords="offset points",
                ha="center",
                fontsize=12,
            )
        bx.axhline(1, color="grey", lw=0.8, ls=":")
        bx.set_xscale("log", base=2)
        bx.set_xticks(ticks, [str(v) for v in ticks])
        bx.minorticks_off()
        bx.set_ylim(0, max(2.0, speedup.max() * 1.2))
        bx.set_xlabel("new tokens generated, N")
        bx.set_ylabel("speedup (no cache / cache)")
        bx.set_title("Speedup")
        grows = speedup[-1] > speedup[0]  # the title states what this run measured, not what theory expects
        fig.suptitle(  # each wording whole, as the catalogue translates it
            f"The cache's gain grows with the length generated: {speedup[0]:.1f}x at {int(n[0])} tokens, "
            f"{speedup[-1]:.1f}x at {int(n[-1])}"
            if grows
            else f"The cache's gain does not grow with the length generated: {speedup[0]:.1f}x at {int(n[0])} "
            f"tokens, {speedup[-1]:.1f}x at {int(n[-1])}"
        )
        _note(fig, note)
    return _finish(fig)
