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


__all__ = ["COLORS", "PALETTE", "PINYIN", "attention_weights", "causal_attention_heatmap", "cjk_font", "style", "to_png", "token_label"]
