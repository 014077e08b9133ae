"""The course's figures (kvlib.plotting): one function per figure, one style for all of them.

Each function builds one matplotlib Figure and returns it, already closed to pyplot, so a notebook
cell shows it exactly once. Okabe-Ito colours (safe for colour-blind readers), fonts sized for a
projector, titles that state the takeaway. Chinese tokens use a CJK font when one is installed,
else their pinyin (wǒ, ài), never empty boxes. Not here: computing anything, or widgets.
"""
from __future__ import annotations

import functools
import io
import unicodedata
from contextlib import contextmanager

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
from matplotlib import font_manager
from matplotlib.colors import ListedColormap
from matplotlib.ft2font import FT2Font

# ---------------------------------------------------------------------------------------------
# Style

# Okabe & Ito (2008), "Color Universal Design": distinguishable with every common colour blindness.
PALETTE = {
    "blue": "#0072B2",
    "orange": "#E69F00",
    "green": "#009E73",
    "vermillion": "#D55E00",
    "sky": "#56B4E9",
    "purple": "#CC79A7",
    "yellow": "#F0E442",
    "black": "#000000",
}
COLORS = [PALETTE[c] for c in ("blue", "orange", "green", "vermillion", "sky", "purple", "yellow", "black")]
SEQUENTIAL_CMAP = "cividis"  # perceptually uniform and readable by colour-blind viewers
MASKED_GREY = "#D9D9D9"

_RC = {
    "font.size": 14,  # readable from the back of a room at 100 dpi
    "axes.titlesize": 16,
    "axes.titleweight": "normal",  # CJK fonts rarely ship a bold face; matplotlib would warn
    "axes.labelsize": 14,
    "xtick.labelsize": 13,
    "ytick.labelsize": 13,
    "legend.fontsize": 12,
    "figure.titlesize": 16,
    "axes.prop_cycle": matplotlib.cycler(color=COLORS),
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": False,
    "grid.alpha": 0.3,
    "figure.dpi": 100,
    "image.cmap": SEQUENTIAL_CMAP,
}

# Fonts that carry the Chinese characters of the running examples, in order of preference.
_CJK_CANDIDATES = (
    "Noto Sans CJK SC", "Noto Sans SC", "Source Han Sans SC", "Source Han Sans CN", "WenQuanYi Micro Hei",
    "WenQuanYi Zen Hei", "PingFang SC", "Hiragino Sans GB", "Heiti SC", "STHeiti", "Microsoft YaHei", "SimHei",
    "Noto Sans CJK JP", "Noto Sans CJK TC", "Arial Unicode MS", "Droid Sans Fallback", "AR PL UMing CN", "SimSun",
)
_CJK_HINTS = ("cjk", "han", "hei", "song", "ming", "kai", "wenquanyi", "fallback", "unicode", "gothic")
_PROBE = "我爱法国巴黎"  # the characters of notebooks 01 and 02

# Pinyin for the course's Chinese tokens, used when no CJK font is installed.
PINYIN = {"我": "wǒ", "爱": "ài", "法": "fǎ", "国": "guó", "的": "de", "首": "shǒu", "都": "dū", "是": "shì", "巴": "bā", "黎": "lí"}


def _covers(path: str, text: str) -> bool:
    try:
        charmap = FT2Font(path).get_charmap()
    except Exception:  # an unreadable or exotic font file: not ours to fix
        return False
    return all(ord(ch) in charmap for ch in text)


@functools.lru_cache(maxsize=None)
def cjk_font() -> str | None:
    """The family name of an installed font with Chinese glyphs, or None if there is none."""
    fonts = font_manager.fontManager.ttflist
    by_name = {}
    for f in fonts:
        by_name.setdefault(f.name, []).append(f.fname)
    for name in _CJK_CANDIDATES:
        if any(_covers(path, _PROBE) for path in by_name.get(name, ())):
            return name
    for name, paths in sorted(by_name.items()):
        if any(h in name.lower() for h in _CJK_HINTS) and any(_covers(p, _PROBE) for p in paths):
            return name
    return None


def _is_cjk(ch: str) -> bool:
    return unicodedata.east_asian_width(ch) in ("W", "F")


def token_label(token: str) -> str:
    """How a token is written on a figure: as itself, or romanised when no font can draw it.

    Example: token_label("我") -> "我" with a CJK font installed, "wǒ" without one.
    """
    if cjk_font() is not None or not any(_is_cjk(ch) for ch in token):
        return token
    # no CJK font: pinyin for the course's characters, the code point for any other
    return "".join(PINYIN.get(ch, f"U+{ord(ch):04X}") if _is_cjk(ch) else ch for ch in token)


@contextmanager
def style():
    """The course style for the figures made inside this block (rcParams are restored after)."""
    rc = dict(_RC)
    cjk = cjk_font()
    # matplotlib draws each glyph from the first font in the list that has it
    rc["font.family"] = ["DejaVu Sans", cjk] if cjk else ["DejaVu Sans"]
    with plt.rc_context(rc):
        yield


def to_png(fig) -> bytes:
    """The figure as PNG bytes, at its own size: no tight crop, which would draw it twice.

    For widgets that redraw on every slider move: display(IPython.display.Image(to_png(fig))).
    """
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=fig.dpi, bbox_inches=None)
    return buf.getvalue()


def _finish(fig):
    """Close the figure to pyplot (so Jupyter shows it once, as the cell's value) and return it."""
    plt.close(fig)
    return fig


# ---------------------------------------------------------------------------------------------
# Notebook 01: attention by hand


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
        width = 4.7 * n
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
    ax.annotate(f"out [{out[0]:.3f}, {out[1]:.3f}]", out, xytext=(-12 if right_half else 12, -22),
                textcoords="offset points", ha="right" if right_half else "left", fontsize=13)
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
                    ax.text(j, i, f"{probs[i, j]:.3f}", ha="center", va="center", fontsize=14, color="white" if dark else "black")
                else:
                    ax.text(j, i, "masked", ha="center", va="center", fontsize=11, color="#555555")
        ax.set_xticks(range(S), labels)
        ax.set_yticks(range(T), labels[S - T:])
        ax.set_xlabel("key (attended to)")
        ax.set_ylabel("query (attending)")
        ax.tick_params(length=0)
        for side in ("top", "right", "left", "bottom"):
            ax.spines[side].set_visible(False)
        ax.set_title(title)
        fig.colorbar(im, ax=ax, label="attention weight", shrink=0.85)
    return _finish(fig)


# ---------------------------------------------------------------------------------------------
# Notebook 02: generating text


def record_note(record: dict, runs: int | None = None) -> str:
    """One line naming what produced a measurement, for the foot of a figure.

    Example: record_note(timing.record, runs=5) -> "Intel Xeon ..., 1 thread, torch 2.5.1, median of 5 runs"
    """
    threads = record.get("threads")
    parts = [str(record.get("device", "unknown device")), f"{threads} thread{'' if threads == 1 else 's'}", f"torch {record.get('torch', '?')}"]
    runs = runs or record.get("runs")
    if runs:
        parts.append(f"median of {runs} runs")
    return ", ".join(parts)


def _note(fig, note):
    """What produced the numbers, in small grey text under the axes."""
    if note:
        fig.text(0.01, 0.01, note, fontsize=10, color="#555555", ha="left", va="bottom")


def ttft_against_prompt_length(prompt_lens, medians_ms, lows_ms, highs_ms, *, note=None):
    """Time to first token against prompt length: the median, with bars from the fastest to the slowest run.

    Args:    prompt_lens: tokens in each prompt   medians_ms, lows_ms, highs_ms: one per prompt, milliseconds
             note: what produced the numbers (device, threads, runs), printed under the axes
    Returns: the Figure
    """
    x, med = np.asarray(prompt_lens), np.asarray(medians_ms, dtype=float)
    err = [med - np.asarray(lows_ms, float), np.asarray(highs_ms, float) - med]
    with style():
        fig, ax = plt.subplots(figsize=(8, 5))
        fig.subplots_adjust(left=0.12, right=0.97, bottom=0.2, top=0.9)
        ax.errorbar(x, med, yerr=err, marker="o", ms=7, lw=2, capsize=4, color=PALETTE["vermillion"], label="median (bars: min to max)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(x, [str(n) for n in x])
        ax.minorticks_off()
        ax.set_ylim(0, None)
        ax.set_xlabel("prompt length (tokens)")
        ax.set_ylabel("time to first token (ms)")
        ax.set_title("Prefill reads the whole prompt: TTFT grows with its length")
        ax.legend(loc="upper left", frameon=False)
        _note(fig, note)
    return _finish(fig)


def time_per_token(medians_ms, lows_ms, highs_ms, *, note=None):
    """Time of each new token of one generation: token 1 is the prefill (TTFT), the rest are decode steps.

    Args:    medians_ms, lows_ms, highs_ms: (max_new_tokens,) milliseconds per token, over repeated runs
             note: what produced the numbers, printed under the axes
    Returns: the Figure
    """
    med, lo, hi = (np.asarray(a, dtype=float) for a in (medians_ms, lows_ms, highs_ms))
    tokens = np.arange(1, len(med) + 1)
    with style():
        fig, ax = plt.subplots(figsize=(9, 5))
        fig.subplots_adjust(left=0.11, right=0.97, bottom=0.2, top=0.9)
        ax.fill_between(tokens[1:], lo[1:], hi[1:], color=PALETTE["sky"], alpha=0.35, lw=0, label="min to max")
        ax.plot(tokens[1:], med[1:], color=PALETTE["blue"], lw=1.8, label="decode step (median)")
        ax.plot(tokens[:1], med[:1], "o", ms=10, color=PALETTE["vermillion"], label="token 1: prefill (TTFT)")
        ax.set_xlim(0, len(med) + 1)
        top = 1.25 * max(float(np.percentile(hi, 90)), float(med.max()))  # a rare slow run must not flatten the rest
        ax.set_ylim(0, top)
        if hi.max() > top:
            ax.text(0.99, 0.98, f"slowest run: {hi.max():.0f} ms (off the scale)", transform=ax.transAxes,
                    ha="right", va="top", fontsize=11, color="#555555")
        ax.set_xlabel("new token number")
        ax.set_ylabel("time for this token (ms)")
        ax.set_title("Naive decoding: tokens cost more as the text grows")
        ax.legend(loc="upper left", frameon=False)
        _note(fig, note)
    return _finish(fig)


# ---------------------------------------------------------------------------------------------
# Notebook 03: the waste of recomputing


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
            ax.loglog(n, projections, ls="--", lw=1.5, color=PALETTE["orange"], label="  of which projections and MLP (~N²)")
        if attention is not None:
            ax.loglog(n, attention, ls=":", lw=2.5, color=PALETTE["purple"], label="  of which attention (~N³)")
        ax.loglog(n, needed, lw=2.5, color=PALETTE["green"], label="needed: each token once (~N)")
        ticks = sorted({v for v in (1, 10, 100, 1000, 10000) if v < n[-1]} | {int(n[-1])})
        ax.set_xticks(ticks, [f"{v:,}" for v in ticks])
        ax.minorticks_off()
        ax.set_xlabel("tokens generated, N")
        ax.set_ylabel("total work (FLOPs)")
        ratio = naive[-1] / needed[-1]
        ax.set_title(f"Naive decoding does {ratio:.0f}x the work needed for {int(n[-1])} tokens")
        ax.legend(loc="upper left", frameon=False)
        _note(fig, note)
    return _finish(fig)


def wasted_share(kv_lens, fractions, *, marks=(), note=None):
    """Share of each naive decode step that repeats earlier work, against the sequence length.

    Args:    kv_lens: (n,) tokens in the sequence at each step   fractions: (n,) wasted share in [0, 1)
             marks: a few kv_lens to label with their value
             note: printed under the axes
    Returns: the Figure
    """
    x, y = np.asarray(kv_lens), 100 * np.asarray(fractions, dtype=float)
    with style():
        fig, ax = plt.subplots(figsize=(9, 5))
        fig.subplots_adjust(left=0.11, right=0.97, bottom=0.18, top=0.9)
        ax.plot(x, y, lw=2.5, color=PALETTE["vermillion"])
        for m in marks:
            i = int(np.searchsorted(x, m))
            ax.plot(x[i], y[i], "o", ms=7, color=PALETTE["black"])
            right = x[i] > x[-1] / 2  # keep the label inside the axes
            ax.annotate(f"{y[i]:.1f}% at {x[i]} tokens", (x[i], y[i]), xytext=(-8 if right else 10, -24),
                        textcoords="offset points", ha="right" if right else "left", fontsize=12)
        ax.set_ylim(0, 105)
        ax.set_xlim(0, x[-1] * 1.02)
        ax.set_xlabel("tokens in the sequence at this step (kv_len)")
        ax.set_ylabel("repeated work in this step (%)")
        ax.set_title("Almost all of a late naive step repeats earlier work")
        _note(fig, note)
    return _finish(fig)


def step_time_fit(kv_lens, medians_ms, lows_ms, highs_ms, fitted_ms, *, fit_label="fit", note=None):
    """Measured time of each naive decode step against its sequence length, with a fitted curve.

    Args:    kv_lens: (n,) tokens each step runs through the model
             medians_ms, lows_ms, highs_ms: (n,) step times over repeated runs, milliseconds
             fitted_ms: (n,) the fitted curve at kv_lens   fit_label: its formula, for the legend
             note: printed under the axes
    Returns: the Figure
    """
    x = np.asarray(kv_lens)
    with style():
        fig, ax = plt.subplots(figsize=(9, 5.5))
        fig.subplots_adjust(left=0.11, right=0.97, bottom=0.18, top=0.9)
        ax.fill_between(x, lows_ms, highs_ms, color=PALETTE["sky"], alpha=0.35, lw=0, label="min to max")
        ax.plot(x, medians_ms, ".", ms=4, color=PALETTE["blue"], label="measured step (median)")
        ax.plot(x, fitted_ms, lw=2.5, color=PALETTE["vermillion"], label=fit_label)
        ax.set_ylim(0, None)
        ax.set_xlim(0, x[-1] * 1.02)
        ax.set_xlabel("tokens re-run in this step (kv_len)")
        ax.set_ylabel("step time (ms)")
        ax.set_title("Each naive step costs more than the last")
        ax.legend(loc="upper left", frameon=False)
        _note(fig, note)
    return _finish(fig)


__all__ = [
    "COLORS", "PALETTE", "PINYIN", "attention_weights", "causal_attention_heatmap", "cjk_font", "naive_decode_work",
    "record_note", "step_time_fit", "style", "time_per_token", "to_png", "token_label", "ttft_against_prompt_length", "wasted_share",
]


# ---------------------------------------------------------------------------------------------
# Notebook 04: the KV cache


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
        fig.subplots_adjust(left=0.09, right=0.98, bottom=0.24, top=0.84, wspace=0.28)
        for ax, grid, title in ((axes[0], naive, f"No cache: {N} x {N} scores"), (axes[1], cached, f"Cache: 1 x {N} scores")):
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
        from matplotlib.patches import Patch  # only this figure needs legend patches

        handles = [Patch(color=PALETTE["vermillion"], label="new: the decoded token's query against every key"),
                   Patch(color=PALETTE["sky"], label="computed again: earlier steps had these"),
                   Patch(color=MASKED_GREY, label="masked: a key in the query's future")]
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
        for s, fit, color, name in ((naive_s, naive_fit, PALETTE["vermillion"], "no cache"), (cached_s, cached_fit, PALETTE["blue"], "KV cache")):
            ax.loglog(n, s, lw=2.5, color=color, label=f"{name} (median)")
            if fit is not None:
                c, k = fit
                ax.loglog(n, c * n**k, ls="--", lw=1.5, color=PALETTE["black"] if color == PALETTE["blue"] else color,
                          label=f"  fit: ~$N^{{{k:.2f}}}$")
        ticks = [int(m) for m in marks] or [int(v) for v in 2.0 ** np.arange(np.ceil(np.log2(n[0])), np.floor(np.log2(n[-1])) + 1)]
        ax.set_xticks(ticks, [str(v) for v in ticks])
        lo, hi = min(naive_s.min(), cached_s.min()), max(naive_s.max(), cached_s.max())
        yticks = [v for v in (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100) if lo / 1.5 <= v <= hi * 1.5]
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
            bx.annotate(f"{speedup[i]:.1f}x", (n[i], speedup[i]), xytext=(0, 10), textcoords="offset points", ha="center", fontsize=12)
        bx.axhline(1, color="grey", lw=0.8, ls=":")
        bx.set_xscale("log", base=2)
        bx.set_xticks(ticks, [str(v) for v in ticks])
        bx.minorticks_off()
        bx.set_ylim(0, max(2.0, speedup.max() * 1.2))
        bx.set_xlabel("new tokens generated, N")
        bx.set_ylabel("speedup (no cache / cache)")
        bx.set_title("Speedup")
        grows = speedup[-1] > speedup[0]  # the title states what this run measured, not what theory expects
        fig.suptitle(f"The cache's gain {'grows' if grows else 'does not grow'} with the length generated: "
                     f"{speedup[0]:.1f}x at {int(n[0])} tokens, {speedup[-1]:.1f}x at {int(n[-1])}")
        _note(fig, note)
    return _finish(fig)


__all__ += ["cache_time_against_length", "decode_step_scores"]
