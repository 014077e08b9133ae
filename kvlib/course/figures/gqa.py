"""The figures of Notebook 06 (Grouped-Query Attention): one function per figure, each returning a closed matplotlib Figure."""

from __future__ import annotations

import matplotlib
import matplotlib.pyplot as plt
import numpy as np

from kvlib.course.figures.style import PALETTE, _finish, _note, style

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
    faster, slower = row["max_s"] < mha["min_s"], row["min_s"] > mha["max_s"]
    label = (  # a label: kvlib.app.translate finds its texts
        "faster than MHA in every run"
        if faster
        else "slower than MHA in every run"
        if slower
        else "within the spread of MHA's runs"
    )
    return label


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
        after = uptrained and steps and all("uptrained_held_out_loss" in r for r in converted)
        title = (  # one text of the catalogue per case (kvlib.app.translate finds each)
            f"Converted, not trained: held-out loss {span('held_out_loss', '.2f')}, accuracy {span('accuracy', '.0%')}"
            + (f" (MHA: {original['held_out_loss']:.2f}, {original['accuracy']:.0%})" if original else "")
            + (
                f"\nafter {steps} steps of uptraining: loss {span('uptrained_held_out_loss', '.2f')}, "
                f"accuracy {span('uptrained_accuracy', '.0%')}"
                if after
                else ""
            )
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
