"""The figures of Notebook 01 (attention by hand): one function per figure, each returning a closed matplotlib Figure."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap

from kvlib.course.figures.style import COLORS, MASKED_GREY, PALETTE, SEQUENTIAL_CMAP, _finish, style, token_label


def attention_weights(tokens, probs, out, *, query=None, keys=None, values=None, query_name="query"):
    """Bar chart of one query's attention weights, with the query against the keys and the output.

    Args:    tokens: kv_len names of the keys (e.g. ["我", "爱", "AI"])
             probs: (kv_len,) weights   out: (d_v,) output
             query, keys: (head_dim,) and (kv_len, head_dim), head_dim 2: adds a panel "query and keys"
             values: (kv_len, 2): draws the output among the values it averages; else its components as bars
    Returns: the Figure (one row: [query and keys], weights, output)
    """
    probs, out = np.asarray(probs, dtype=float), np.asarray(out, dtype=float)
    labels = [token_label(t) for t in tokens]
    draw_keys = query is not None and keys is not None and np.shape(keys)[-1] == 2
    draw_values = values is not None and np.shape(values)[-1] == 2
    colors = [COLORS[i % len(COLORS)] for i in range(len(tokens))]
    with style():
        n = 2 + draw_keys
        # a fixed layout, not "constrained": the widget redraws this figure on every slider move
        width = 4.3 * n  # three panels in 12.9 in: shown unscaled in a notebook on a 1280-px projector
        fig, axes = plt.subplots(1, n, figsize=(width, 4.4))
        fig.subplots_adjust(left=0.9 / width, right=1 - 0.2 / width, bottom=0.16, top=0.9, wspace=0.4)
        axes = list(axes)
        if draw_keys:
            _query_and_keys(axes.pop(0), np.asarray(query, float), np.asarray(keys, float), labels, colors, query_name)
        ax = axes[0]
        bars = ax.bar(labels, probs, color=colors)
        ax.bar_label(bars, labels=[f"{p:.3f}" for p in probs], padding=3, fontsize=13)
        ax.set_ylim(0, 1.12)
        ax.set_yticks([0, 0.5, 1])
        ax.set_ylabel("attention weight")
        ax.set_xlabel("key (token)")
        top = int(np.argmax(probs))
        ax.set_title(f"Most weight on {labels[top]} ({probs[top]:.0%})")
        ax = axes[1]
        if draw_values:
            _output_among_values(ax, out, np.asarray(values, float), probs, labels, colors)
        else:
            comp = ax.bar([f"out[{i}]" for i in range(len(out))], out, color=PALETTE["black"])
            ax.bar_label(comp, labels=[f"{o:.3f}" for o in out], padding=3, fontsize=13)
            ax.axhline(0, color=PALETTE["black"], lw=0.8)
            ax.margins(y=0.15)  # room for the labels above the bars
            ax.locator_params(axis="y", nbins=4)
            ax.set_xlabel("output component")
            ax.set_ylabel("value")
            ax.set_title("Output = weights @ values")
    return _finish(fig)


def _query_and_keys(ax, query, keys, labels, colors, query_name):
    for key, label, color in zip(keys, labels, colors):
        ax.scatter(*key, s=120, color=color, zorder=3)
        ax.annotate(label, key, xytext=(8, 6), textcoords="offset points", fontsize=15, color=color)
    ax.annotate("", query, (0, 0), arrowprops=dict(arrowstyle="-|>", lw=2.5, color=PALETTE["black"]))
    ax.text(0.03, 0.04, f"{query_name} = [{query[0]:.1f}, {query[1]:.1f}]", transform=ax.transAxes, fontsize=13)
    lim = max(3.2, float(np.abs(np.vstack([keys, query])).max()) + 0.4)  # fixed unless a point falls outside
    ax.set_xlim(-lim, lim)
    ax.set_ylim(-lim, lim)
    ax.set_xticks([-3, 0, 3])  # few ticks: fewer texts to lay out on every redraw
    ax.set_yticks([-3, 0, 3])
    ax.set_aspect("equal")
    ax.axhline(0, color="grey", lw=0.6)
    ax.axvline(0, color="grey", lw=0.6)
    ax.set_xlabel("dimension 0")
    ax.set_ylabel("dimension 1")
    ax.set_title("Score = query · key")


def _output_among_values(ax, out, values, probs, labels, colors):
    hull = np.vstack([values, values[:1]])
    ax.plot(hull[:, 0], hull[:, 1], ls=":", color="grey", lw=1.2)
    for val, p, label, color in zip(values, probs, labels, colors):
        area = 60 + 900 * p  # the marker's area grows with the weight
        ax.scatter(*val, s=area, color=color, alpha=0.85, zorder=3)
        gap = 0.75 * np.sqrt(area / np.pi) + 3  # points: clear of the marker's edge
        ax.annotate(label, val, xytext=(gap, gap), textcoords="offset points", fontsize=15, color=color)
    ax.scatter(*out, marker="*", s=420, color=PALETTE["black"], zorder=4)
    lo, hi = values.min(axis=0) - 0.6, values.max(axis=0) + 0.8
    right_half = out[0] > (lo[0] + hi[0]) / 2  # keep the label inside the axes
    ax.annotate(
        f"out [{out[0]:.3f}, {out[1]:.3f}]",
        out,
        xytext=(-12 if right_half else 12, -22),
        textcoords="offset points",
        ha="right" if right_half else "left",
        fontsize=13,
    )
    ax.set_xlim(lo[0], hi[0])
    ax.set_ylim(lo[1], hi[1])
    ax.set_xticks(np.arange(np.ceil(lo[0]), np.floor(hi[0]) + 1))
    ax.set_yticks(np.arange(np.ceil(lo[1]), np.floor(hi[1]) + 1))
    ax.set_xlabel("value dimension 0")
    ax.set_ylabel("value dimension 1")
    ax.set_title("Output mixes the values")


def causal_attention_heatmap(tokens, probs, *, title="Each token attends only to itself and earlier tokens"):
    """Heatmap of causal attention weights: rows are queries, columns keys, masked cells greyed.

    Args:    tokens: kv_len names of the positions
             probs: (seq_len, kv_len) weights; the queries are the last seq_len positions
    Returns: the Figure
    """
    probs = np.asarray(probs, dtype=float)
    T, S = probs.shape
    labels = [token_label(t) for t in tokens]
    allowed = np.tril(np.ones((T, S), dtype=bool), k=S - T)  # True = may attend (drawn, not computed)
    with style():
        size = max(4.5, 1.1 * S + 2.5)
        fig, ax = plt.subplots(figsize=(size + 1.2, max(3.5, 1.1 * T + 2)), layout="constrained")
        im = ax.imshow(np.where(allowed, probs, np.nan), cmap=SEQUENTIAL_CMAP, vmin=0, vmax=1)
        ax.imshow(np.where(allowed, np.nan, 1.0), cmap=ListedColormap([MASKED_GREY]), vmin=0, vmax=1)
        for i in range(T):
            for j in range(S):
                if allowed[i, j]:
                    dark = probs[i, j] < 0.55  # light text on the dark end of cividis
                    ax.text(
                        j,
                        i,
                        f"{probs[i, j]:.3f}",
                        ha="center",
                        va="center",
                        fontsize=14,
                        color="white" if dark else "black",
                    )
                else:
                    ax.text(j, i, "masked", ha="center", va="center", fontsize=11, color="#555555")
        ax.set_xticks(range(S), labels)
        ax.set_yticks(range(T), labels[S - T :])
        ax.set_xlabel("key (attended to)")
        ax.set_ylabel("query (attending)")
        ax.tick_params(length=0)
        for side in ("top", "right", "left", "bottom"):
            ax.spines[side].set_visible(False)
        ax.set_title(title)
        fig.colorbar(im, ax=ax, label="attention weight", shrink=0.85)
    return _finish(fig)
