"""The course's figures (kvlib.course.plotting): one function per figure, one style for all of them.

Each function builds one matplotlib Figure and returns it, already closed to pyplot, so a notebook
cell shows it exactly once. Okabe-Ito colours (safe for colour-blind readers), fonts sized for a
projector, titles that state the takeaway. Chinese tokens use a CJK font when one is installed,
else their pinyin (wǒ, ài), never empty boxes; so do titles and labels in Chinese (KVLIB_LANG=zh-CN), which fall
back to English without one. Not here: computing anything, or widgets.
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
from matplotlib.patches import Patch
from matplotlib.text import Text

from kvlib.course import i18n

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
    "Noto Sans CJK SC",
    "Noto Sans SC",
    "Source Han Sans SC",
    "Source Han Sans CN",
    "WenQuanYi Micro Hei",
    "WenQuanYi Zen Hei",
    "PingFang SC",
    "Hiragino Sans GB",
    "Heiti SC",
    "STHeiti",
    "Microsoft YaHei",
    "SimHei",
    "Noto Sans CJK JP",
    "Noto Sans CJK TC",
    "Arial Unicode MS",
    "Droid Sans Fallback",
    "AR PL UMing CN",
    "SimSun",
)
_CJK_HINTS = ("cjk", "han", "hei", "song", "ming", "kai", "wenquanyi", "fallback", "unicode", "gothic")
_PROBE = "我爱法国巴黎"  # the characters of notebooks 01 and 02

# Pinyin for the course's Chinese tokens, used when no CJK font is installed.
PINYIN = {
    "我": "wǒ",
    "爱": "ài",
    "法": "fǎ",
    "国": "guó",
    "的": "de",
    "首": "shǒu",
    "都": "dū",
    "是": "shì",
    "巴": "bā",
    "黎": "lí",
}


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
    """Close the figure to pyplot (so Jupyter shows it once, as the cell's value) and return it, its texts in the
    learner's language (KVLIB_LANG, kvlib.course.i18n) where a CJK font can draw them; else in English, so a
    figure never shows empty boxes."""
    if i18n.language() != i18n.DEFAULT and cjk_font() is not None:
        translate_texts(fig)
    plt.close(fig)
    return fig


def missing_glyphs(fig) -> list[str]:
    """What drawing the figure could not draw: matplotlib's "Glyph ... missing from font(s)" warnings, each an empty
    box on the figure ([] when every character has a glyph in its font)."""
    import warnings  # noqa: PLC0415 (start-up time: only tests and checks of a figure need it)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig.canvas.draw()
    return [str(w.message) for w in caught if "missing from font" in str(w.message)]


def translate_texts(fig, lang: str | None = None) -> int:
    """Every text of a figure (titles, labels, ticks, legends, notes) in the learner's language, in place, where the
    catalogue translates it (kvlib.course.i18n.translate); returns how many changed."""
    changed = 0
    for text in fig.findobj(Text):
        old = text.get_text()
        new = i18n.translate(old, lang)
        if new != old:
            text.set_text(new)
            changed += 1
    return changed


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


# ---------------------------------------------------------------------------------------------
# Notebook 02: generating text


def record_note(record: dict, runs: int | None = None) -> str:
    """One line naming what produced a measurement, for the foot of a figure.

    Example: record_note(timing.record, runs=5) -> "Intel Xeon ..., 1 thread, torch 2.5.1, median of 5 runs"
    """
    threads = record.get("threads")
    parts = [
        str(record.get("device", "unknown device")),
        f"{threads} thread{'' if threads == 1 else 's'}",
        f"torch {record.get('torch', '?')}",
    ]
    runs = runs or record.get("runs")
    if runs:
        parts.append(f"median of {runs} runs")
    return ", ".join(parts)


def _note(fig, note):
    """What produced the numbers, in small grey text under the axes."""
    if note:
        fig.text(0.01, 0.01, note, fontsize=10, color="#555555", ha="left", va="bottom")


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
            ax.annotate(
                f"{y[i]:.1f}% at {x[i]} tokens",
                (x[i], y[i]),
                xytext=(-8 if right else 10, -24),
                textcoords="offset points",
                ha="right" if right else "left",
                fontsize=12,
            )
        ax.set_ylim(0, 105)
        ax.set_xlim(0, x[-1] * 1.02)
        ax.set_xlabel("tokens in the sequence at this step (kv_len)")
        ax.set_ylabel("repeated work in this step (%)")
        ax.set_title("Almost all of a late naive step repeats earlier work")
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


__all__ = [
    "COLORS",
    "PALETTE",
    "PINYIN",
    "attention_weights",
    "causal_attention_heatmap",
    "cjk_font",
    "naive_decode_work",
    "record_note",
    "step_time_fit",
    "style",
    "time_per_token",
    "to_png",
    "token_label",
    "missing_glyphs",
    "translate_texts",
    "ttft_against_prompt_length",
    "wasted_share",
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
        fig.subplots_adjust(
            left=0.11, right=0.98, bottom=0.24, top=0.84, wspace=0.28
        )  # room for "query" beside the labels
        for ax, grid, title in (
            (axes[0], naive, f"No cache: {N} x {N} scores"),
            (axes[1], cached, f"Cache: 1 x {N} scores"),
        ):
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
        for s, fit, color, name in (
            (naive_s, naive_fit, PALETTE["vermillion"], "no cache"),
            (cached_s, cached_fit, PALETTE["blue"], "KV cache"),
        ):
            ax.loglog(n, s, lw=2.5, color=color, label=f"{name} (median)")
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
        fig.suptitle(
            f"The cache's gain {'grows' if grows else 'does not grow'} with the length generated: "
            f"{speedup[0]:.1f}x at {int(n[0])} tokens, {speedup[-1]:.1f}x at {int(n[-1])}"
        )
        _note(fig, note)
    return _finish(fig)


__all__ += ["cache_time_against_length", "decode_step_scores"]


# ---------------------------------------------------------------------------------------------
# Notebook 05: the memory wall


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
            if points:
                side = (
                    "left of the ridge: memory-bound" if points[0][1] < ridge else "right of the ridge: compute-bound"
                )
                title = f"{points[0][0]} sits {side}"
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
        if cross is None:
            cap = sliding_window * kv_bytes_per_token * batch / 1e9
            title = f"the window caps the cache at {cap:.1f} GB (batch {batch})"
        else:
            title = f"cache > weights from {cross:,.0f} tokens at batch {batch}"
        ax.set_title(f"{model}{': ' if model else ''}{title}")
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
        capped = f", capped past the ridge at {ridge:.3g} FLOP/B" if intensities[-1] > ridge else ""
        fig.suptitle(  # worded by this run's numbers: the measured gain need not stop at the ridge
            f"Batch {int(b[-1])} decoded {gain:.1f}x the tokens/s of batch 1 (the roofline: {predicted:.1f}x{capped})"
        )
        _note(fig, note)
    return _finish(fig)


__all__ += ["bytes_against_kv_len", "decode_against_batch", "roofline"]


# ---------------------------------------------------------------------------------------------
# Notebook 06: Grouped-Query Attention

_ATTENTION_KIND_COLORS = {"MHA": PALETTE["vermillion"], "GQA": PALETTE["blue"], "MQA": PALETTE["green"]}


def kv_bytes_per_token(names, bytes_per_token, kinds, *, note=None):
    """KV-cache bytes per token of real models (fp16), one bar each, coloured by MHA / GQA / MQA.

    Args:    names: model names   bytes_per_token: (n,) bytes   kinds: "MHA", "GQA" or "MQA" per model
             note: the source of the configurations, printed under the axes
    Returns: the Figure
    """
    kib = np.asarray(bytes_per_token, dtype=float) / 1024
    with style():
        fig, ax = plt.subplots(figsize=(10, 0.55 * len(names) + 2.2))
        fig.subplots_adjust(left=0.2, right=0.9, bottom=0.22 if note else 0.14, top=0.88)
        y = np.arange(len(names))[::-1]
        ax.barh(y, kib, color=[_ATTENTION_KIND_COLORS[k] for k in kinds], height=0.65)
        for yi, value, kind in zip(y, kib, kinds):
            ax.text(value, yi, f" {value:,.0f} KiB ({kind})", va="center", fontsize=12)
        ax.set_yticks(y, names)
        ax.set_xlim(0, kib.max() * 1.35)
        ax.set_xlabel("KV cache per token, fp16 (KiB)")
        ax.set_title("Sharing key/value heads shrinks every token's cache")
        _note(fig, note)
    return _finish(fig)


def _against_mha(row: dict, mha: dict) -> str:
    """How a row's step compares with MHA's over every run: faster or slower only where every one of its runs was
    (its slowest against MHA's fastest, or the reverse), else within the runs' spread. Decides nothing from medians."""
    if row["max_s"] < mha["min_s"]:
        return "faster than MHA in every run"
    if row["min_s"] > mha["max_s"]:
        return "slower than MHA in every run"
    return "within the spread of MHA's runs"


def gqa_decode_time(rows, *, kv_len=None, note=None, verdicts=None):
    """Decode-step time against n_kv_heads, three ways, with the roofline prediction; and the speedup over MHA.

    Args:    rows: `kvlib bench gqa` rows (kv_len, n_kv_heads, method, median_s, min_s, max_s, predicted_s, speedup_vs_mha,
                   and fixed_s where measured); MHA rows are "mha" (kvlib's attention) and "mha sdpa", each the start of its way's curve
             kv_len: the cached tokens of the left panel (default: the middle kv_len measured)
             note: what produced the numbers, printed under the axes
             verdicts: {"grouped": words, "materialised": words}, the title's verdict on each way against MHA (a
                   notebook's claims, from paired rounds); by default each is worded from its runs (_against_mha)
    Returns: the Figure (left: ms per step at kv_len; right: speedup over MHA against kv_len, n_kv_heads = n_heads / 4)
    """
    from kvlib.core.configs import GQA_FIXED_KV_LEN  # noqa: PLC0415 (start-up time: configs loads torch, which notebook 01's figures never need)

    lens = sorted({r["kv_len"] for r in rows})
    kv_len = kv_len or lens[len(lens) // 2]
    at = [r for r in rows if r["kv_len"] == kv_len]
    heads = sorted({r["n_kv_heads"] for r in at}, reverse=True)
    styles = {
        "materialised": (PALETTE["vermillion"], "s", "repeat_kv, then MHA attention"),
        "grouped": (PALETTE["blue"], "o", "grouped_attention (6.2)"),
        "sdpa": (PALETTE["sky"], "^", "torch SDPA, enable_gqa"),
    }
    with style():
        fig, (ax, bx) = plt.subplots(1, 2, figsize=(14, 6.2), gridspec_kw={"width_ratios": [1.3, 1]})
        fig.subplots_adjust(left=0.07, right=0.98, bottom=0.21, top=0.8, wspace=0.25)
        x = np.arange(len(heads))
        for method, (color, marker, label) in styles.items():
            mha = "mha sdpa" if method == "sdpa" else "mha"  # each way starts from MHA done the same way
            pts = [
                (i, r) for i, h in enumerate(heads) for r in at if r["n_kv_heads"] == h and r["method"] in (method, mha)
            ]
            if len(pts) < 2:
                continue
            xi = np.array([p[0] for p in pts])
            med = np.array([p[1]["median_s"] for p in pts]) * 1e3
            err = [
                med - np.array([p[1]["min_s"] for p in pts]) * 1e3,
                np.array([p[1]["max_s"] for p in pts]) * 1e3 - med,
            ]
            ax.errorbar(xi, med, yerr=err, color=color, marker=marker, ms=8, lw=2, capsize=3, label=label)
        grouped = [next(r for r in at if r["n_kv_heads"] == h and r["method"] in ("grouped", "mha")) for h in heads]
        pred = [r["predicted_s"] * 1e3 for r in grouped]
        ax.plot(x, pred, ls="--", color=PALETTE["black"], lw=1.5, label="roofline: bytes / bandwidth (grouped)")
        # recordings made before the fixed part was measured lack it; a run too noisy to split has none (fixed_ok)
        if all("fixed_s" in r for r in grouped) and all(r.get("fixed_ok", r["fixed_s"] > 0) for r in grouped):
            ax.plot(
                x,
                [r["fixed_s"] * 1e3 for r in grouped],
                ls=":",
                color=PALETTE["blue"],
                lw=2,
                label="fixed part (intercept of a line over kv_len)"
                if "fixed_spread_s" in grouped[0]
                else f"fixed part ({GQA_FIXED_KV_LEN} cached tokens)",
            )
        ax.set_xticks(x, [f"{h}\n{'MHA' if h == heads[0] else 'MQA' if h == 1 else 'GQA'}" for h in heads])
        ax.set_xlabel("key/value heads (n_kv_heads)")
        ax.set_ylabel("one decode step (ms)")
        top = max(max(r["max_s"] for r in at) * 1e3, max(pred))
        ax.set_ylim(0, top * 1.5)  # room for the legend above the curves
        ax.set_title(f"At {kv_len:,} cached tokens")
        ax.legend(loc="upper center", frameon=False, fontsize=11, ncol=2)
        quarter = heads[0] // 4 if heads[0] // 4 in heads else heads[-1]
        for method in ("materialised", "grouped", "sdpa"):
            pts = [r for r in rows if r["n_kv_heads"] == quarter and r["method"] == method]
            if pts:
                color, marker, label = styles[method]
                bx.plot(
                    [r["kv_len"] for r in pts],
                    [r["speedup_vs_mha"] for r in pts],
                    color=color,
                    marker=marker,
                    ms=8,
                    lw=2,
                    label=label,
                )
        bx.axhline(1, color="grey", lw=1, ls=":")
        step_bytes = [  # what a step reads as MHA over as GQA: the speedup a memory-bound step would show (6.5)
            next(r["bytes"] for r in rows if r["kv_len"] == n and r["method"] == "mha")
            / next(
                r["bytes"] for r in rows if r["kv_len"] == n and r["n_kv_heads"] == quarter and r["method"] == "grouped"
            )
            for n in lens
        ]
        bx.plot(lens, step_bytes, color=PALETTE["black"], lw=1.5, ls="--", label="bytes a step reads, MHA's / GQA's")
        bx.set_xscale("log", base=2)
        bx.set_xticks(lens, [f"{n // 1024}k" if n >= 1024 else str(n) for n in lens])
        bx.minorticks_off()
        drawn = [y for line in bx.get_lines() for y in line.get_ydata()]
        bx.set_ylim(0, max(drawn) * 1.45)  # as tall as the lines, with room for the legend above them
        bx.set_xlabel("kv_len (tokens in the cache)")
        bx.set_ylabel(f"speedup over MHA (n_kv_heads {quarter})")
        bx.set_title("Speedup over MHA")
        bx.legend(loc="upper right", frameon=False, fontsize=11)
        g = next(r for r in at if r["n_kv_heads"] == quarter and r["method"] == "grouped")
        m = next(r for r in at if r["n_kv_heads"] == quarter and r["method"] == "materialised")
        mha = next(r for r in at if r["n_kv_heads"] == heads[0] and r["method"] == "mha")
        said = {way: _against_mha(row, mha) for way, row in (("grouped", g), ("materialised", m))} | (verdicts or {})
        fig.suptitle(  # worded by the runs (or the notebook's claims): no verdict from medians alone
            f"GQA-{quarter} decode against MHA, median speed: the shared heads copied out {m['speedup_vs_mha']:.1f}x "
            f"({said['materialised']}),\nread in place {g['speedup_vs_mha']:.1f}x ({said['grouped']})",
            fontsize=15,
        )
        _note(fig, note)
    return _finish(fig)


def gqa_quality(rows, *, note=None):
    """Held-out loss and capital accuracy of the converted tiny model against n_kv_heads, per recipe.

    Args:    rows: kvlib.study.gqa_quality.conversion_study rows (n_kv_heads, recipe, held_out_loss, accuracy and,
             if uptrained, uptrained_held_out_loss, uptrained_accuracy, uptrain_steps)
             note: what produced the numbers, printed under the axes
    Returns: the Figure (left: loss; right: accuracy); solid before uptraining, dashed after
    """
    heads = sorted({r["n_kv_heads"] for r in rows}, reverse=True)
    x = {h: i for i, h in enumerate(heads)}
    colors = {"mean": PALETTE["blue"], "first": PALETTE["orange"]}
    names = {"mean": "mean-pooled", "first": "first head kept"}
    uptrained = any("uptrained_held_out_loss" in r for r in rows)
    with style():
        fig, axes = plt.subplots(1, 2, figsize=(13, 5.9))
        fig.subplots_adjust(left=0.08, right=0.98, bottom=0.27, top=0.85, wspace=0.25)
        original = next((r for r in rows if r["recipe"] == "original"), None)
        for ax, key, label in (
            (axes[0], "held_out_loss", "held-out loss (nats/token)"),
            (axes[1], "accuracy", "capital accuracy, held-out phrasings"),
        ):
            for recipe in ("mean", "first"):
                pts = sorted(
                    ([r for r in rows if r["recipe"] == recipe] + ([original] if original else [])),
                    key=lambda r: -r["n_kv_heads"],
                )
                if len(pts) < 2:
                    continue
                xs = [x[r["n_kv_heads"]] for r in pts]
                ax.plot(
                    xs, [r[key] for r in pts], color=colors[recipe], marker="o", ms=8, lw=2, label=f"{names[recipe]}"
                )
                if uptrained and all(f"uptrained_{key}" in r for r in pts):
                    ax.plot(
                        xs,
                        [r[f"uptrained_{key}"] for r in pts],
                        color=colors[recipe],
                        marker="o",
                        ms=8,
                        lw=2,
                        ls="--",
                        mfc="white",
                        label=f"{names[recipe]}, uptrained",
                    )
            ax.set_xticks(
                range(len(heads)), [f"{h}\n{'MHA' if h == heads[0] else 'MQA' if h == 1 else 'GQA'}" for h in heads]
            )
            ax.set_xlabel("key/value heads (n_kv_heads)")
            ax.set_ylabel(label)
            ax.set_ylim(0, None if key == "held_out_loss" else 1.05)
        axes[1].yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
        fig.legend(  # under both panels, where no line runs
            *axes[0].get_legend_handles_labels(), loc="lower center", bbox_to_anchor=(0.5, 0.05), ncol=4, frameon=False
        )
        steps = next((r["uptrain_steps"] for r in rows if "uptrain_steps" in r), None)
        converted = [r for r in rows if r["recipe"] != "original"]
        span = lambda key, fmt: "-".join(format(f(r[key] for r in converted), fmt) for f in (min, max))  # noqa: E731
        title = (
            f"Converted, not trained: held-out loss {span('held_out_loss', '.2f')}, accuracy {span('accuracy', '.0%')}"
        )
        if original:
            title += f" (MHA: {original['held_out_loss']:.2f}, {original['accuracy']:.0%})"
        if uptrained and steps and all("uptrained_held_out_loss" in r for r in converted):
            title += (
                f"\nafter {steps} steps of uptraining: loss {span('uptrained_held_out_loss', '.2f')}, "
                f"accuracy {span('uptrained_accuracy', '.0%')}"
            )
        fig.suptitle(title, fontsize=15)  # worded by the rows' numbers, whatever they show
        _note(fig, note)
    return _finish(fig)


def gqa_memory_bars(weight_bytes, cache_bytes, mha_cache_bytes, *, title, note=None):
    """Three bars for the notebook 06 widget: the weights, the KV cache now, and the cache as MHA (GiB).

    Args:    weight_bytes, cache_bytes, mha_cache_bytes: bytes   title: the takeaway (e.g. the predicted time)
    Returns: the Figure
    """
    gib = np.array([weight_bytes, cache_bytes, mha_cache_bytes], dtype=float) / 2**30
    with style():
        fig, ax = plt.subplots(figsize=(9, 3.4))
        fig.subplots_adjust(left=0.2, right=0.95, bottom=0.3 if note else 0.22, top=0.84)
        y = np.arange(3)[::-1]
        ax.barh(y, gib, color=[PALETTE["black"], PALETTE["blue"], PALETTE["vermillion"]], height=0.6)
        for yi, value in zip(y, gib):
            ax.text(value, yi, f" {value:,.2f}", va="center", fontsize=12)
        ax.set_yticks(y, ["weights", "KV cache", "KV cache as MHA"])
        ax.set_xlim(0, gib.max() * 1.25)
        ax.set_xlabel("GiB, fp16")
        ax.set_title(title, fontsize=14)
        _note(fig, note)
    return _finish(fig)


__all__ += ["gqa_decode_time", "gqa_memory_bars", "gqa_quality", "kv_bytes_per_token"]


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


__all__ += ["rotary_scores"]


# ---------------------------------------------------------------------------------------------
# Notebook 07: serving many requests


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
            held = (owners != -1).mean()
            ax.set_title(f"Blocks coloured by request (grey free, black shared): {held:.0%} of block-steps in use")
        else:
            row = owners[step]
            ax.axvline(step, color="white", lw=2)
            ax.axvline(step, color="black", lw=1, ls="--")
            running = len(set(row[row >= 0].tolist()))
            ax.set_title(
                f"Step {step}: {int((row != -1).sum())} of {row.size} blocks held, by {running} requests "
                f"({int((row == -2).sum())} shared), {int((row == -1).sum())} free"
            )
        _note(fig, note)
    return _finish(fig)


__all__ += ["block_memory_map", "serving_compare"]


# ---------------------------------------------------------------------------------------------
# Notebook 08: smaller caches


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


# ---------------------------------------------------------------------------------------------
# Notebook 09: fused attention


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
            Patch(color=PALETTE["blue"], label=f"computed ({(kinds == 0).sum()})"),
            Patch(color=PALETTE["orange"], label=f"masked, on the diagonal ({(kinds == 2).sum()})"),
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


# ---------------------------------------------------------------------------------------------
# Notebook 10: speculative decoding


def speculative_speedup(gammas, measured, *, note=None):
    """Measured speedup against gamma for a few drafters (markers), each beside the formula's curve (line).

    Args:    gammas: the gamma of each measured point
             measured: label -> dict(alpha=..., c=..., speedup=[one per gamma]); the curve is
             (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)) with that drafter's measured alpha and c
             note: what produced the numbers
    Returns: the Figure
    """
    gammas = np.asarray(gammas)
    fine = np.linspace(1, gammas.max(), 100)
    best_label, best = max(((label, max(m["speedup"])) for label, m in measured.items()), key=lambda lb: lb[1])
    best_gamma = gammas[int(np.argmax(measured[best_label]["speedup"]))]
    with style():
        fig, ax = plt.subplots(figsize=(10, 5.6))
        fig.subplots_adjust(bottom=0.2 if note else 0.14, top=0.86, right=0.7)
        for color, (label, m) in zip(COLORS, measured.items()):
            a, c = min(m["alpha"], 0.999999), m["c"]
            curve = (1 - a ** (fine + 1)) / ((1 - a) * (fine * c + 1))
            ax.plot(fine, curve, color=color, lw=2, alpha=0.6)
            ax.plot(gammas, m["speedup"], "o", color=color, ms=8, label=f"{label}\nalpha {m['alpha']:.2f}, c {c:.3f}")
        ax.axhline(1, color=PALETTE["black"], lw=1, ls=":")
        ax.set_xticks(gammas)
        ax.set_xlabel("gamma (tokens drafted per model pass)")
        ax.set_ylabel("speedup over plain greedy decoding (x)")
        ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1), frameon=False)
        ax.set_title(
            f"Up to {best:.1f}x measured ({best_label}, gamma {best_gamma});\n"
            "lines: the formula with each drafter's measured alpha and c",
            loc="left",
        )
        _note(fig, note)
    return _finish(fig)


def accepted_drafts(rounds, *, gamma, note=None):
    """Each verify pass of speculative decoding as a row, one column per drafted position: drafts kept (green); at
    the first rejected draft's column, that draft (vermillion, top) and the model's own token that replaced it (blue,
    bottom); drafts after it, never checked (grey); when every draft was kept, the model's bonus token (blue) in the
    column after them.

    Args:    rounds: list of dicts with draft (token texts), n_accepted, next_token (its text)
             gamma: tokens drafted per pass, for the title   note: what produced the run
    Returns: the Figure
    """
    from matplotlib.patches import Rectangle  # noqa: PLC0415 (start-up time: only this figure draws boxes)

    n = len(rounds)
    width = max(len(r["draft"]) for r in rounds) + 1
    kept = sum(r["n_accepted"] + 1 for r in rounds)
    white = (PALETTE["blue"], PALETTE["vermillion"], PALETTE["green"])

    def box(ax, x, y, text, color, top=False, half=False):
        low, height = (y, 0.4) if top else (y - 0.4, 0.4 if half else 0.8)
        ax.add_patch(Rectangle((x, low), 0.92, height, color=color))
        shown = "␣" if text == " " else token_label(text.replace("\n", "⏎"))  # romanised without a CJK font
        ax.text(
            x + 0.46,
            low + height / 2,
            shown,
            ha="center",
            va="center",
            fontsize=11 if half else 12,
            color="white" if color in white else "black",
        )

    with style():
        fig, ax = plt.subplots(figsize=(min(14, max(10, 2.5 + 0.9 * width)), 0.45 * n + 2.4))
        fig.subplots_adjust(left=0.12, right=0.97, bottom=0.16 if note else 0.1, top=0.84)
        for row, r in enumerate(rounds):
            y, a = n - 1 - row, r["n_accepted"]
            for x, text in enumerate(r["draft"]):
                if x < a:
                    box(ax, x, y, text, PALETTE["green"])
                elif x == a:  # the first rejected draft, and below it the model's token in its place
                    box(ax, x, y, text, PALETTE["vermillion"], top=True, half=True)
                    box(ax, x, y, r["next_token"], PALETTE["blue"], half=True)
                else:
                    box(ax, x, y, text, MASKED_GREY)
            if a == len(r["draft"]):  # every draft kept: the model's bonus token after them
                box(ax, a, y, r["next_token"], PALETTE["blue"])
        ax.set_xlim(-0.1, width + 0.1)
        ax.set_ylim(-0.6, n - 0.4)
        ax.set_yticks(range(n), [f"pass {n - i}" for i in range(n)])
        ax.set_ylabel("verify pass (first at the top)")
        ax.set_xticks(np.arange(width) + 0.46, [f"{i + 1}" for i in range(width - 1)] + ["bonus"])
        ax.tick_params(axis="x", length=0)
        ax.set_xlabel("drafted position")
        ax.set_title(
            f"gamma {gamma}: {kept} tokens in {n} verify passes ({kept / n:.2f} a pass), after the prompt's pass\n"
            "green: kept; vermillion: first rejected, the model's token (blue) in its place; grey: never checked",
            loc="left",
            fontsize=11,
        )
        _note(fig, note)
    return _finish(fig)


__all__ += ["accepted_drafts", "speculative_speedup"]


# ---------------------------------------------------------------------------------------------
# docs/instructors.md: grading a class


def class_grading(rows, *, note=None):
    """Minutes to grade a class against its size, one line per number of grading workers.

    Args:    rows: (jobs, students, wall seconds, submissions a minute) of each run
             note: what produced the numbers
    Returns: the Figure
    """
    jobs = sorted({j for j, *_ in rows})
    big = max(n for _, n, *_ in rows)
    rate = {j: r for j, n, _, r in rows if n == big}
    with style():
        fig, ax = plt.subplots(figsize=(10, 5.6))
        fig.subplots_adjust(bottom=0.2 if note else 0.14, top=0.86)
        for color, j in zip(COLORS, jobs):
            line = sorted((n, wall / 60, r) for jj, n, wall, r in rows if jj == j)
            ax.plot([n for n, *_ in line], [m for _, m, _ in line], "o-", color=color, lw=2, ms=8, label=f"--jobs {j}")
            n, minutes, r = line[-1]
            ax.annotate(f"{r:.1f} a minute", (n, minutes), textcoords="offset points", xytext=(8, -4), color=color)
        ax.set_xlim(0, big * 1.25)
        ax.set_ylim(0, None)
        ax.set_xlabel("students in the class (one submission each)")
        ax.set_ylabel("minutes to grade the class")
        ax.legend(loc="upper left", frameon=False)
        faster = (
            f": {jobs[-1]} workers grade {rate[jobs[-1]] / rate[jobs[0]]:.1f}x as fast as {jobs[0]}"
            if len(jobs) > 1
            else ""
        )
        ax.set_title(f"Grading time grows with the class{faster}\n(at {big} students)", loc="left")
        _note(fig, note)
    return _finish(fig)
