"""The figures of Notebook 08 (smaller caches): one function per figure, each returning a closed matplotlib Figure."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from kvlib.course.figures.style import PALETTE, _finish, _note, style


def cache_schemes(labels, kib_per_token, quality, *, model="", note=None):
    """Cache KiB per token of each scheme for one model (bars, log scale), with each scheme's quality as text beside it.

    Args:    labels: scheme names, top to bottom   kib_per_token: KiB each token costs the cache (all layers)
             quality: one short text per scheme (what was measured, or why not)   note: what produced the numbers
    Returns: the Figure
    """
    n = len(labels)
    colors = [PALETTE["vermillion"] if k == max(kib_per_token) else PALETTE["blue"] for k in kib_per_token]
    with style():
        fig, ax = plt.subplots(figsize=(13.5, 0.55 * n + 2.2))
        fig.subplots_adjust(left=0.22, right=0.58, bottom=0.2 if note else 0.14, top=0.86)
        y = np.arange(n)[::-1]
        ax.barh(y, kib_per_token, color=colors)
        ax.set_xscale("log")
        ax.set_yticks(y, labels)
        ax.set_xlabel("cache per token of context, all layers (KiB, log scale)")
        for yi, k, q in zip(y, kib_per_token, quality):
            ax.text(k * 1.08, yi, f"{k:,.1f}", va="center", fontsize=10)
            ax.text(1.04, yi, q, va="center", fontsize=10, transform=ax.get_yaxis_transform())
        ax.set_ylim(-0.6, n - 0.1)
        ax.text(
            1.04, n - 0.35, "quality on the tiny model", fontsize=11, weight="bold", transform=ax.get_yaxis_transform()
        )
        ax.set_xlim(min(kib_per_token) / 2, max(kib_per_token) * 3)
        ax.set_ylabel("cache scheme")
        ax.set_title(
            f"{model}:\n{max(kib_per_token) / min(kib_per_token):.0f}x less cache per token from the largest "
            "scheme to the smallest",
            loc="left",
        )
        _note(fig, note)
    return _finish(fig)
