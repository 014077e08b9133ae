"""The figures of Notebook 02 (generating text): one function per figure, each returning a closed matplotlib Figure."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from kvlib.course.figures.style import COLORS, PALETTE, _finish, _note, style


def ttft_against_prompt_length(prompt_lens, medians_ms, lows_ms, highs_ms, *, note=None, title=None):
    """Time to first token against prompt length: the median, with bars from the fastest to the slowest run.

    Args:    prompt_lens: tokens in each prompt   medians_ms, lows_ms, highs_ms: one per prompt, milliseconds
             note: what produced the numbers (device, threads, runs), printed under the axes
             title: the takeaway, worded from these numbers by the caller (default: what the axes show)
    Returns: the Figure
    """
    x, med = np.asarray(prompt_lens), np.asarray(medians_ms, dtype=float)
    err = [med - np.asarray(lows_ms, float), np.asarray(highs_ms, float) - med]
    with style():
        fig, ax = plt.subplots(figsize=(8, 5))
        fig.subplots_adjust(left=0.12, right=0.97, bottom=0.2, top=0.9)
        ax.errorbar(
            x,
            med,
            yerr=err,
            marker="o",
            ms=7,
            lw=2,
            capsize=4,
            color=PALETTE["vermillion"],
            label="median (bars: min to max)",
        )
        ax.set_xscale("log", base=2)
        ax.set_xticks(x, [str(n) for n in x])
        ax.minorticks_off()
        ax.set_ylim(0, None)
        ax.set_xlabel("prompt length (tokens)")
        ax.set_ylabel("time to first token (ms)")
        ax.set_title(title or "Time to first token against prompt length")
        ax.legend(loc="upper left", frameon=False)
        _note(fig, note)
    return _finish(fig)


def time_per_token(medians_ms, lows_ms, highs_ms, *, note=None, title=None):
    """Time of each new token of one generation: token 1 is the prefill (TTFT), each later one a decode step (ITL).

    Args:    medians_ms, lows_ms, highs_ms: (max_new_tokens,) milliseconds per token, over repeated runs
             note: what produced the numbers, printed under the axes
             title: the takeaway, worded from these numbers by the caller (default: what the axes show)
    Returns: the Figure
    """
    med, lo, hi = (np.asarray(a, dtype=float) for a in (medians_ms, lows_ms, highs_ms))
    tokens = np.arange(1, len(med) + 1)
    with style():
        fig, ax = plt.subplots(figsize=(9, 5))
        fig.subplots_adjust(left=0.11, right=0.97, bottom=0.2, top=0.9)
        ax.fill_between(tokens[1:], lo[1:], hi[1:], color=PALETTE["sky"], alpha=0.35, lw=0, label="min to max")
        ax.plot(tokens[1:], med[1:], color=PALETTE["blue"], lw=1.8, label="decode step: inter-token latency (median)")
        ax.plot(tokens[:1], med[:1], "o", ms=10, color=PALETTE["vermillion"], label="token 1: prefill (TTFT)")
        ax.set_xlim(0, len(med) + 1)
        top = 1.25 * max(float(np.percentile(hi, 90)), float(med.max()))  # a rare slow run must not flatten the rest
        ax.set_ylim(0, top)
        if hi.max() > top:
            ax.text(
                0.99,
                0.98,
                f"slowest run: {hi.max():.0f} ms (off the scale)",
                transform=ax.transAxes,
                ha="right",
                va="top",
                fontsize=11,
                color="#555555",
            )
        ax.set_xlabel("new token number")
        ax.set_ylabel("time for this token (ms)")
        ax.set_title(title or "Time of each new token, naive decoding")
        ax.legend(loc="upper left", frameon=False)
        _note(fig, note)
    return _finish(fig)


def rotary_scores(distances, scores_by_offset, *, note=None):
    """Rotary positions: the score of a query and a key against their distance, for several absolute positions.

    Args:    distances: (n,) query position minus key position, in tokens
             scores_by_offset: {key position: (n,) scores q . k after rotary} (the same q and k vectors)
             note: printed under the axes
    Returns: the Figure
    """
    with style():
        fig, ax = plt.subplots(figsize=(9, 5))
        fig.subplots_adjust(left=0.11, right=0.97, bottom=0.18, top=0.9)
        for i, (offset, scores) in enumerate(scores_by_offset.items()):
            ax.plot(
                distances,
                scores,
                lw=5 - 1.2 * i,
                ls=("-", "--", ":", "-.")[i % 4],
                color=COLORS[i % len(COLORS)],
                label=f"key at position {offset}",
            )
        ax.axhline(0, color=PALETTE["black"], lw=0.8)
        ax.set_xlabel("distance: query position - key position (tokens)")
        ax.set_ylabel("score q · k after rotary")
        ax.set_title("With rotary positions the score depends only on the distance")
        low, high = ax.get_ylim()
        ax.set_ylim(low, high + 0.35 * (high - low))  # room for the legend above the curves
        ax.legend(loc="upper center", ncols=len(scores_by_offset))
        _note(fig, note)
    return _finish(fig)
