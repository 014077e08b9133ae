"""The figures' one style: Okabe-Ito colours, fonts sized for a projector, CJK tokens drawn or spelled in
pinyin, titles translated, and the helpers every figure ends with (to_png, the note naming what produced it).
"""

from __future__ import annotations

import functools
import io
import unicodedata
from contextlib import contextmanager

import matplotlib
import matplotlib.pyplot as plt
from matplotlib import font_manager
from matplotlib.ft2font import FT2Font
from matplotlib.text import Text

from kvlib.course import i18n

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
    """What drawing the figure could not draw, each an empty box on the figure ([] when every character has a glyph
    in its font): matplotlib's warnings "Glyph ... missing from font(s)", and what its mathtext logs, "Font 'default'
    does not have a glyph for ..." (a Chinese character in a text with `$...$`)."""
    import logging  # noqa: PLC0415 (start-up time: only tests and checks of a figure need it)
    import warnings  # noqa: PLC0415 (start-up time: as logging, above)

    logged = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: logged.append(record.getMessage())
    logger = logging.getLogger("matplotlib.mathtext")
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fig.canvas.draw()
    finally:
        logger.removeHandler(handler)
    said = [str(w.message) for w in caught] + logged
    return [m for m in said if "missing from font" in m or "does not have a glyph for" in m]


def _has_math(text: str) -> bool:
    """Whether matplotlib draws the text with mathtext: an unescaped `$` pair."""
    return text.replace(r"\$", "").count("$") >= 2


def _translated(text: str, lang: str | None) -> str:
    """A figure's text in the learner's language: whole; else, broken into lines by the caller, line by line (a
    verdict broken after its colon), else unbroken (a name wrapped at its comma: "static,\nreserved")."""
    new = i18n.translate(text, lang)
    if new != text or "\n" not in text:
        return new
    lines = "\n".join(i18n.translate(line, lang) for line in text.split("\n"))
    if lines != text:
        return lines
    unbroken = text.replace("\n", " ")
    new = i18n.translate(unbroken, lang)
    return new if new != unbroken else text


def _translate_ticks(fig, lang: str | None) -> int:
    """Tick labels given as texts (set_xticks(ticks, labels), categories: bar(names, ...)) translated as the axis
    makes them, at each draw; returns how many of today's ticks changed."""
    from matplotlib.category import StrCategoryFormatter  # noqa: PLC0415 (start-up time: only translated figures)
    from matplotlib.ticker import FixedFormatter, FuncFormatter  # noqa: PLC0415 (start-up time: only translated figures)

    changed = 0
    for axis in (a for ax in fig.axes for a in (ax.xaxis, ax.yaxis)):
        made = axis.get_major_formatter()
        if isinstance(made, FixedFormatter | FuncFormatter | StrCategoryFormatter):
            labels = [made(x, i) for i, x in enumerate(axis.get_majorticklocs())]
            changed += sum(_translated(label, lang) != label for label in labels)
            axis.set_major_formatter(FuncFormatter(lambda x, pos, made=made: _translated(made(x, pos), lang)))
    return changed


def translate_texts(fig, lang: str | None = None) -> int:
    """Every text of a figure (titles, labels, ticks, legends, notes) in the learner's language, in place, where the
    catalogue translates it (_translated); returns how many changed. A Chinese text with mathtext (`$N^{1.5}$`) gets
    the CJK font first: mathtext draws the words around the math in the text's first font."""
    changed, cjk = _translate_ticks(fig, lang), cjk_font()
    for text in fig.findobj(Text):
        old = text.get_text()
        new = _translated(old, lang)
        if new != old:
            text.set_text(new)
            changed += 1
            if cjk and _has_math(new) and any(_is_cjk(ch) for ch in new):
                text.set_fontfamily([cjk, "DejaVu Sans"])
    return changed


def _note(fig, note):
    """What produced the numbers, in small grey text under the axes."""
    if note:
        fig.text(0.01, 0.01, note, fontsize=10, color="#555555", ha="left", va="bottom")


def record_note(record: dict, runs: int | None = None) -> str:
    """One line naming what produced a measurement, for the foot of a figure: the machine's name and the versions as
    recorded, the words around them in the learner's language where a figure can draw it (as _finish translates).

    Example: record_note(timing.record, runs=5) -> "Intel Xeon ..., 1 thread, torch 2.5.1, median of 5 runs"
    """
    threads, runs = record.get("threads"), runs or record.get("runs")
    thread_label = f"{threads} thread" if threads == 1 else f"{threads} threads"
    label = f", {thread_label}, torch {record.get('torch', '?')}" + (f", median of {runs} runs" if runs else "")
    lang = i18n.language() if cjk_font() is not None else i18n.DEFAULT
    return str(record.get("device", "unknown device")) + i18n.translate(label, lang)
