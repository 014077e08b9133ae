"""The figures of docs/instructors.md (grading a class): one function per figure, each returning a closed matplotlib Figure."""

from __future__ import annotations

import matplotlib.pyplot as plt

from kvlib.course.figures.style import COLORS, _finish, _note, style


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
        speedup = rate[jobs[-1]] / rate[jobs[0]]
        ax.set_title(  # one text per case, so that the catalogue translates the whole title
            f"Grading time grows with the class: {jobs[-1]} workers grade {speedup:.1f}x as fast as {jobs[0]}\n"
            f"(at {big} students)"
            if len(jobs) > 1
            else f"Grading time grows with the class\n(at {big} students)",
            loc="left",
        )
        _note(fig, note)
    return _finish(fig)
