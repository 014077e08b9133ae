"""The figures of the notebooks (kvlib.course.plotting) share one style: labelled axes, a title, readable
text, the Okabe-Ito palette, a size that fits a projected notebook.

Each figure is drawn here on small example inputs; the executed notebooks draw them on real ones
(`kvlib present --check --figures DIR` saves those as PNGs to look at).
"""

import numpy as np
import pytest
from matplotlib.collections import Collection
from matplotlib.colors import to_hex, to_rgb
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.text import Text

from kvlib.course import plotting

EXAMPLE = dict(tokens=["我", "爱", "AI"], probs=[0.212, 0.212, 0.576], out=[1.94, 1.0])
N = np.arange(1, 65)


def _figures():
    probs = np.array([[1, 0, 0], [0.33, 0.67, 0], [0.248, 0.248, 0.503]])
    med = 1 + 0.05 * N
    return {
        "attention_weights": lambda: plotting.attention_weights(
            **EXAMPLE, query=[1, 1], keys=[[1, 0], [0, 1], [1, 1]], values=[[1, 0], [0, 2], [3, 1]]
        ),
        "attention_weights (no 2-d values)": lambda: plotting.attention_weights(**EXAMPLE),
        "causal_attention_heatmap": lambda: plotting.causal_attention_heatmap(EXAMPLE["tokens"], probs),
        "ttft_against_prompt_length": lambda: plotting.ttft_against_prompt_length(
            [8, 16, 32], [1, 2, 3], [0.9, 1.8, 2.7], [1.2, 2.3, 3.4], note="test machine"
        ),
        "time_per_token": lambda: plotting.time_per_token(med, med * 0.9, med * 1.2, note="test machine"),
        "naive_decode_work": lambda: plotting.naive_decode_work(
            N, N**2 * 10.0 + N**3, N * 10.0, projections=N**2 * 10.0, attention=N**3 * 1.0
        ),
        "rotary_scores": lambda: plotting.rotary_scores(
            N, {0: np.cos(N / 3.0), 50: np.cos(N / 3.0)}, note="one query and key"
        ),
        "step_time_fit": lambda: plotting.step_time_fit(N, med, med * 0.9, med * 1.2, med, fit_label="fit: a + b t"),
        "decode_step_scores": lambda: plotting.decode_step_scores(list("法国的首都是巴")),
        "cache_time_against_length": lambda: plotting.cache_time_against_length(
            N[7:],
            1e-4 * N[7:] ** 1.5,
            1e-3 * N[7:],
            naive_fit=(1e-4, 1.5),
            cached_fit=(1e-3, 1.0),
            marks=(8, 16, 32, 64),
        ),
        "roofline": lambda: plotting.roofline(
            [("GPU, 16-bit", 312e12, 2e12), ("GPU, FP32", 19.5e12, 2e12)],
            [("decode", 1.0, 1.9e12), ("prefill", 400.0, 250e12)],
            note="datasheet",
        ),
        "bytes_against_kv_len": lambda: plotting.bytes_against_kv_len(
            2.0 ** np.arange(7, 18), 13.5e9, 512 * 1024, batches=(1, 16), model="Llama-2-7B"
        ),
        "bytes_against_kv_len (sliding window)": lambda: plotting.bytes_against_kv_len(
            2.0 ** np.arange(7, 18), 14.5e9, 128 * 1024, batches=(1, 16), sliding_window=4096, model="Mistral-7B"
        ),
        "decode_against_batch": lambda: plotting.decode_against_batch(
            [1, 2, 4, 8], [10, 19, 30, 35], [12, 24, 40, 40], [0.5, 1, 2, 4], 3.0, note="test machine"
        ),
        "serving_compare": lambda: plotting.serving_compare(
            {
                name: [
                    {"tokens_per_s": tps * f, "tpot_mean_s": tpot * f, "steps": steps, "kv_utilisation": used}
                    for f in (0.9, 1.0, 1.1)
                ]
                for name, tps, tpot, steps, used in (
                    ("static, reserved", 200.0, 0.016, 840, 0.21),
                    ("continuous, reserved", 500.0, 0.010, 460, 0.23),
                    ("continuous, paged", 760.0, 0.025, 250, 0.95),
                )
            },
            title="continuous, paged ran at 1.5x continuous, reserved's throughput: faster in every one of 3 rounds",
            note="test machine",
        ),
        "cache_schemes": lambda: plotting.cache_schemes(
            ["MHA", "GQA-8", "int8 GQA-8", "MLA"],
            [512, 128, 66.5, 67.5],
            ["the reference", "close", "99.9% agree", "exact"],
            model="Llama-3-8B",
            note="test machine",
        ),
        "block_memory_map": lambda: plotting.block_memory_map(
            np.array([[0, 0, 1, -1], [0, -2, 1, 2], [-1, -2, 1, 2]]), step=1
        ),
        "attention_tiles": lambda: plotting.attention_tiles(
            np.array([[2, 1, 1], [0, 2, 1], [0, 0, 2]]), tile=4, seq_len=12, kv_len=12, note="test"
        ),
        "fused_memory": lambda: plotting.fused_memory(
            [
                {"seq_len": n, "naive_peak_bytes": 12 * n * n, "tiled_peak_bytes": 300 * n, "sdpa_peak_bytes": 260 * n}
                for n in (1024, 4096)
            ],
            [
                {
                    "kv_len": s,
                    "ways": {
                        w: {"bytes_read": b * s, "median_s": t * s / 1e6}
                        for w, b, t in (("float32 SDPA", 4096, 1.0), ("int8, folded (9.4)", 1100, 0.5))
                    },
                }
                for s in (4096, 16384)
            ],
            note="test machine",
        ),
        "speculative_speedup": lambda: plotting.speculative_speedup(
            [1, 2, 4],
            {
                "drafter model": {"alpha": 0.7, "c": 0.1, "speedup": [1.2, 1.5, 1.6]},
                "oracle": {"alpha": 0.9, "c": 0.0, "speedup": [1.8, 2.5, 3.0]},
            },
            lambda a, g: (1 - a ** (g + 1)) / (1 - a),
            note="test machine",
        ),
        "accepted_drafts": lambda: plotting.accepted_drafts(
            [
                {"draft": ["P", "a", "r"], "n_accepted": 0, "next_token": "巴"},
                {"draft": ["a", "r", " "], "n_accepted": 3, "next_token": "\n"},
            ],
            gamma=3,
            note="test machine",
        ),
    }


FIGURES = _figures()
ALLOWED = {c.lower() for c in plotting.COLORS} | {plotting.MASKED_GREY.lower(), "#ffffff"}


def _data_axes(fig):
    return [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]


def _colors(fig):
    """The colours of every line, patch and marker collection in the figure's axes."""
    for ax in _data_axes(fig):
        for artist in ax.get_children():
            if isinstance(artist, Line2D) and artist.get_visible() and len(artist.get_xdata()):
                yield artist.get_color()
            elif isinstance(artist, Patch) and artist is not ax.patch and artist.get_visible() and artist.get_fill():
                yield artist.get_facecolor()
            elif isinstance(artist, Collection) and len(artist.get_facecolor()):
                yield from artist.get_facecolor()


@pytest.mark.parametrize("name", FIGURES)
def test_figure_has_labelled_axes_and_a_title(name):
    """Check that every axes of the figure names its x axis, the first names its y axis, and a title states the point."""
    fig = FIGURES[name]()
    axes = _data_axes(fig)
    assert all(ax.get_xlabel() for ax in axes), f"{name}: an axes has no x label"
    assert axes[0].get_ylabel(), f"{name}: no y label"
    suptitle = fig._suptitle.get_text() if fig._suptitle else ""
    assert suptitle or all(any(ax.get_title(loc) for loc in ("left", "center", "right")) for ax in axes), (
        f"{name}: no title"
    )


@pytest.mark.parametrize("name", FIGURES)
def test_figure_text_is_readable_at_projector_size(name):
    """Check that no text of the figure is smaller than 10 pt and the figure fits a projected notebook (<= 13.5 in)."""
    fig = FIGURES[name]()
    small = [
        (t.get_text(), t.get_fontsize()) for t in fig.findobj(Text) if t.get_text().strip() and t.get_fontsize() < 10
    ]
    assert not small, f"{name}: text below 10 pt: {small[:3]}"
    assert fig.get_figwidth() <= 13.5, f"{name}: {fig.get_figwidth()} in wide"


@pytest.mark.parametrize("name", FIGURES)
def test_figure_colours_come_from_the_colour_blind_safe_palette(name):
    """Check that every line, bar and marker uses an Okabe-Ito colour (or a grey)."""
    fig = FIGURES[name]()
    for color in _colors(fig):
        r, g, b = to_rgb(color)
        assert to_hex((r, g, b)) in ALLOWED or r == g == b, (
            f"{name}: colour {to_hex((r, g, b))} is not in kvlib.course.plotting.PALETTE"
        )


def test_cache_against_weights_stops_growing_at_the_sliding_window():
    """Check that a model with a sliding window (Mistral-7B: 4,096 tokens) gets a KV line flat past the window,
    no crossover it never reaches, and a title saying what caps the cache."""
    fig = FIGURES["bytes_against_kv_len (sliding window)"]()
    ax = fig.axes[0]
    kv = [line for line in ax.get_lines() if line.get_label().startswith("KV cache")]
    assert len(kv) == 2
    for line in kv:
        x, y = np.asarray(line.get_xdata()), np.asarray(line.get_ydata())
        assert np.all(np.diff(y[x <= 4096]) > 0) and np.allclose(y[x >= 4096], y[x == 4096][0]), (
            "the cache should grow up to the window, then stay"
        )
    assert y[-1] == 4096 * 128 * 1024 * 16 / 1e9
    assert not [line for line in ax.get_lines() if line.get_marker() == "o"], (
        "batch 16's cache (8.6 GB) never reaches the 14.5 GB of weights"
    )
    assert "window caps the cache at 8.6 GB" in ax.get_title()


def test_figure_renders_to_png():
    """Check that to_png gives a PNG of the figure at its own size."""
    png = plotting.to_png(FIGURES["attention_weights"]())
    assert png.startswith(b"\x89PNG")


def test_attention_tiles_title_counts_the_computed_share():
    """Check the tile figure: 6 of 9 tiles of a 12 x 12 causal grid hold scores, 2/3 of them computed."""
    ax = FIGURES["attention_tiles"]().axes[0]
    assert "67% of the 12 x 12 scores computed" in ax.get_title(loc="left")
