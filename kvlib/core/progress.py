"""Progress of long work (benchmarks, `kvlib present --check`, the quality studies, training) on stderr with
tqdm: what runs, how far, the time left. Shown only where stderr is a terminal, so a notebook, a pipe or a log
gets none of it, and not at all inside quiet() (`--quiet`).
"""

from __future__ import annotations

import sys
from contextlib import contextmanager

from tqdm import tqdm

_quiet = False


@contextmanager
def quiet(enabled: bool = True):
    """No progress inside the with block (`--quiet`); the setting before it comes back after."""
    global _quiet
    before, _quiet = _quiet, bool(enabled)
    try:
        yield
    finally:
        _quiet = before


def bar(iterable=None, *, desc: str, total: int | None = None, unit: str = "step", **options) -> tqdm:
    """A tqdm bar on stderr: `desc` names what runs; wraps `iterable`, or counts to `total` by update().

    It leaves no line behind when done (the result is printed after it), and is off (a plain iterator) inside
    quiet() or where stderr is no terminal. Example: for r in bar(range(rounds), desc="kvlib bench gqa", unit="round")
    """
    return tqdm(
        iterable,
        desc=desc,
        total=total,
        unit=unit,
        file=sys.stderr,
        disable=True if _quiet else None,  # None: tqdm shows it only if the file is a terminal
        leave=False,
        dynamic_ncols=True,
        **options,
    )


def write(text: str, file=None) -> None:
    """Print a line (to stdout by default) without breaking a bar that is showing."""
    tqdm.write(text, file=file if file is not None else sys.stdout)
