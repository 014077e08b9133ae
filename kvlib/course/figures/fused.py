"""The figures of Notebook 09 (fused attention): one function per figure, each returning a closed matplotlib Figure."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch

from kvlib.course.figures.style import COLORS, MASKED_GREY, PALETTE, _finish, _note, style


def attention_tiles(kinds, *, tile: int, seq_len: int, kv_len: int, note=None):
    """Which (query tile, key tile) blocks a causal tiled loop computes whole, masks, or skips.

    Args:    kinds: (query tiles, key tiles) ints, 0 computed, 1 skipped, 2 masked (kvlib.measure.bench_fused)
             tile, seq_len, kv_len: the sizes the grid was made for   note: what produced it
    Returns: the Figure; its title gives the share of score numbers computed
    """
    kinds = np.asarray(kinds)
    cmap = ListedColormap([PALETTE["blue"], MASKED_GREY, PALETTE["orange"]])
    rows = np.minimum(tile, seq_len - tile * np.arange(kinds.shape[0]))[:, None]
    cols = np.minimum(tile, kv_len - tile * np.arange(kinds.shape[1]))[None, :]
    share = (rows * cols)[kinds != 1].sum() / (seq_len * kv_len)
    with style():
        fig, ax = plt.subplots(figsize=(9.8, 6.8))
        fig.subplots_adjust(left=0.11, right=0.68, bottom=0.2 if note else 0.14, top=0.84)
        edges_k = np.minimum(np.arange(kinds.shape[1] + 1) * tile, kv_len)
        edges_q = np.minimum(np.arange(kinds.shape[0] + 1) * tile, seq_len)
        ax.pcolormesh(edges_k, edges_q, kinds, cmap=cmap, vmin=0, vmax=2, edgecolors="white", linewidth=1.5)
        ax.plot([kv_len - seq_len, kv_len], [0, seq_len], color=PALETTE["black"], lw=1.5, label="causal diagonal")
        ax.set_ylim(seq_len, 0)  # query 0 on top, as a matrix is written
        ax.set_xlim(0, kv_len)
        ax.set_xlabel("key position (tokens)")
        ax.set_ylabel("query (tokens)")
        handles = [
            Patch(color=PALETTE["blue"], label=f"computed, all visible ({(kinds == 0).sum()})"),
            Patch(color=PALETTE["orange"], label=f"diagonal, part masked ({(kinds == 2).sum()})"),
            Patch(color=MASKED_GREY, label=f"skipped, all future ({(kinds == 1).sum()})"),
        ]
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.03, 1), fontsize=10, frameon=False)
        ax.set_title(
            f"Tiles of {tile}: {share:.0%} of the {seq_len} x {kv_len} scores computed\n"
            f"({kinds.size} tiles, {(kinds == 1).sum()} never touched)",
            loc="left",
        )
        _note(fig, note)
    return _finish(fig)


def fused_memory(memory_rows=None, decode_rows=None, *, note=None):
    """Peak memory of causal attention per way and length (measured; part 09a), and one decode step's attention,
    bytes it reads from memory per way and cached length (bars) and its measured time (labels; part 09b): the
    panels of the rows given.

    Args:    memory_rows: bench_fused.memory_rows()["rows"] or None   decode_rows: bench_fused.decode_rows()["rows"]
             or None (at least one of the two)
    Returns: the Figure; the memory panel's title gives the measured naive/tiled ratio at the longest length
    """
    panels = [rows for rows in (memory_rows, decode_rows) if rows]
    if not panels:
        raise ValueError("fused_memory needs memory_rows, decode_rows or both")
    with style():
        fig, axes = plt.subplots(1, len(panels), figsize=(6.75 * len(panels), 6), squeeze=False)
        axes = list(axes[0])
        fig.subplots_adjust(left=0.08 * 2 / len(panels), right=0.98, bottom=0.27 if note else 0.2, top=0.8, wspace=0.3)
        if memory_rows:
            _peak_memory_panel(axes.pop(0), memory_rows)
        if decode_rows:
            _decode_bytes_panel(axes.pop(0), decode_rows)
        _note(fig, note)
    return _finish(fig)


def _peak_memory_panel(left, memory_rows):
    n = [r["seq_len"] for r in memory_rows]
    label = {"naive": "naive (whole score matrix)", "tiled": "tiled (your 9.2)", "sdpa": "SDPA (torch's kernel)"}
    for way, color, marker in (("naive", "vermillion", "o"), ("tiled", "blue", "s"), ("sdpa", "green", "^")):
        peaks = [r[f"{way}_peak_bytes"] / 2**20 for r in memory_rows]
        left.plot(n, peaks, marker=marker, color=PALETTE[color], label=label[way])
    left.set_xscale("log", base=2)
    left.set_yscale("log")
    left.set_xticks(n, [f"{x:,}" for x in n])
    left.set_xlabel("seq_len = kv_len (tokens)")
    left.set_ylabel("peak memory during the call (MiB)")
    left.legend(fontsize=10)
    last = memory_rows[-1]
    left.set_title(
        f"Peak memory, measured: naive / tiled = {last['naive_peak_bytes'] / last['tiled_peak_bytes']:.0f}x "
        f"at {last['seq_len']:,}",
        loc="left",
        fontsize=14,
    )


def _decode_bytes_panel(right, decode_rows):
    ways = list(decode_rows[0]["ways"])
    width = 0.8 / len(ways)
    for i, way in enumerate(ways):
        x = np.arange(len(decode_rows)) + (i - (len(ways) - 1) / 2) * width
        mib = [r["ways"][way]["bytes_read"] / 2**20 for r in decode_rows]
        bars = right.bar(x, mib, width, color=COLORS[i], label=way)
        for bar, r in zip(bars, decode_rows):
            right.text(
                bar.get_x() + bar.get_width() / 2,
                bar.get_height() * 1.05,
                f"{r['ways'][way]['median_s'] * 1e3:.1f}",
                ha="center",
                va="bottom",
                fontsize=10,
                rotation=90,
            )
    right.set_yscale("log")
    right.set_xticks(np.arange(len(decode_rows)), [f"{r['kv_len']:,}" for r in decode_rows])
    right.set_xlabel("cached tokens")
    right.set_ylabel("bytes read per step (MiB)")
    right.set_ylim(top=max(r["ways"][w]["bytes_read"] for r in decode_rows for w in ways) / 2**20 * 12)
    right.legend(fontsize=10, loc="upper left", ncol=2)
    last = decode_rows[-1]["ways"]
    share = last["int8, folded (9.4)"]["bytes_read"] / last["float32 SDPA"]["bytes_read"]
    right.set_title(
        f"A decode step's attention: folded int8 reads {share:.0%}\nof float32's bytes (labels: measured ms)",
        loc="left",
        fontsize=14,
    )
