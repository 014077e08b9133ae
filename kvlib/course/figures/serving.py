"""The figures of Notebook 07 (serving many requests): one function per figure, each returning a closed matplotlib Figure."""

from __future__ import annotations

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap

from kvlib.course.figures.style import COLORS, MASKED_GREY, PALETTE, _finish, _note, style


def serving_compare(ways: dict, *, title: str, note=None):
    """Ways of serving one trace at equal KV memory, each run in interleaved rounds (kvlib.measure.bench_serve's
    serve_rounds): the median of the rounds with their min-max, for throughput and time per output token; the
    scheduler's steps and the share of reserved slots holding a token (deterministic: the same every round).

    Args:    ways: {name: [a `kvlib bench serve` summary per round]} (tokens_per_s, tpot_mean_s, steps,
             kv_utilisation; a reservation's utilisation is modelled from max_seq_len slots), in display order
             title: the takeaway, worded by the caller from the rounds' verdicts (kvlib.course.claims)
    Returns: the Figure (throughput, time per output token, steps, KV in use)
    """
    names = list(ways)
    colors = [PALETTE[c] for c in ("orange", "green", "blue", "vermillion", "purple")[: len(names)]]
    labels = [name.replace(", ", ",\n") for name in names]

    def spread(key, scale=1.0):
        values = [np.asarray([r[key] for r in ways[n]], dtype=float) * scale for n in names]
        med = np.array([np.median(v) for v in values])
        return med, np.array([med - [v.min() for v in values], [v.max() for v in values] - med])

    with style():
        fig, ((ax, tx), (sx, cx)) = plt.subplots(2, 2, figsize=(13.5, 9.5))
        fig.subplots_adjust(left=0.08, right=0.98, bottom=0.15, top=0.88, wspace=0.28, hspace=0.55)
        for axis, key, scale, ylabel, head in (
            (ax, "tokens_per_s", 1.0, "generated tokens per second", "Throughput (median, min-max of rounds)"),
            (tx, "tpot_mean_s", 1e3, "ms per output token", "Time per output token (median, min-max)"),
        ):
            med, err = spread(key, scale)
            axis.bar(
                labels,
                med,
                yerr=err,
                color=colors,
                error_kw={"ecolor": PALETTE["black"], "capsize": 6, "color": PALETTE["black"]},
            )
            axis.set_ylabel(ylabel)
            axis.set_title(head)
        sx.bar(labels, [ways[n][0]["steps"] for n in names], color=colors)
        sx.set_ylabel("scheduler steps")
        sx.set_title("Steps (batched forwards) for the trace")
        cx.bar(labels, [100 * ways[n][0]["kv_utilisation"] for n in names], color=colors)
        cx.set_ylim(0, 100)
        cx.set_ylabel("% of reserved slots holding a token")
        cx.set_title("KV in use (a reservation: modelled)")
        for axis in (ax, tx, sx, cx):
            axis.set_xlabel("batching, KV memory")
        fig.suptitle(title)
        _note(fig, note)
    return _finish(fig)


def block_memory_map(owners, *, step=None, note=None):
    """The pool's blocks over the steps of a trace, coloured by the request holding each.

    Args:    owners: (steps, n_blocks) ints, a request id per block, -1 free, -2 shared by several
                     (kvlib.core.paging.BlockStore.owners after each step)
             step: mark this step with a line, and name what it holds in the title
    Returns: the Figure
    """
    owners = np.asarray(owners)
    ids = np.where(owners >= 0, owners % len(COLORS[:7]), 0)
    cmap = ListedColormap(COLORS[:7])
    rgb = cmap(ids)[..., :3]
    rgb[owners == -1] = matplotlib.colors.to_rgb(MASKED_GREY)
    rgb[owners == -2] = matplotlib.colors.to_rgb(PALETTE["black"])
    with style():
        fig, ax = plt.subplots(figsize=(13, 5.2))
        fig.subplots_adjust(left=0.08, right=0.98, bottom=0.2, top=0.86)
        ax.imshow(rgb.transpose(1, 0, 2), aspect="auto", interpolation="nearest", origin="lower")
        ax.set_xlabel("scheduler step")
        ax.set_ylabel("block of the pool")
        if step is None:
            held, key = (owners != -1).mean(), "grey free, black shared" if (owners == -2).any() else "grey free"
            ax.set_title(f"Blocks coloured by request ({key}): {held:.0%} of block-steps in use")
        else:
            row = owners[step]
            ax.axvline(step, color="white", lw=2)
            ax.axvline(step, color="black", lw=1, ls="--")
            running = len(set(row[row >= 0].tolist()))
            shared = f" ({int((row == -2).sum())} shared)" if (owners == -2).any() else ""
            ax.set_title(
                f"Step {step}: {int((row != -1).sum())} of {row.size} blocks held, by {running} requests"
                f"{shared}, {int((row == -1).sum())} free"
            )
        _note(fig, note)
    return _finish(fig)
