"""The figures of Notebook 10 (speculative decoding): one function per figure, each returning a closed matplotlib Figure."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from kvlib.course.figures.style import COLORS, MASKED_GREY, PALETTE, _finish, _note, style, token_label


def speculative_speedup(gammas, measured, tokens_per_pass, *, note=None):
    """Measured speedup against gamma for a few drafters (markers), each beside the formula's curve (line).

    Args:    gammas: the gamma of each measured point
             measured: label -> dict(alpha=..., c=..., speedup=[one per gamma]); the line is Leviathan et al.'s
             prediction, exercise 10.5's tokens per pass over gamma c + 1, with that drafter's measured alpha and c
             tokens_per_pass: (alpha, gamma) -> tokens a verify pass makes: the learner's 10.5, handed in
             note: what produced the numbers
    Returns: the Figure
    """
    gammas = np.asarray(gammas)
    fine = np.arange(1, gammas.max() + 1)
    best_label, best = max(((label, max(m["speedup"])) for label, m in measured.items()), key=lambda lb: lb[1])
    best_gamma = gammas[int(np.argmax(measured[best_label]["speedup"]))]
    with style():
        fig, ax = plt.subplots(figsize=(10, 5.6))
        fig.subplots_adjust(bottom=0.2 if note else 0.14, top=0.86, right=0.7)
        for color, (label, m) in zip(COLORS, measured.items()):
            c = m["c"]
            curve = [tokens_per_pass(float(m["alpha"]), int(g)) / (g * c + 1) for g in fine]
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
