"""Input checks shared by learner code and the reference: bad input gets a ValueError that
names the argument, the expected shape or dtype, and what arrived."""
from __future__ import annotations

import numpy as np


def float_array(name: str, x, *, ndim: int | None = None, min_ndim: int | None = None) -> np.ndarray:
    """Check that x is a real-valued numpy array of the given rank; return it unchanged."""
    if not isinstance(x, np.ndarray):
        raise ValueError(f"{name} must be a numpy array, got {type(x).__name__}")
    if not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)):
        raise ValueError(f"{name} must hold real numbers, got dtype {x.dtype}")
    if ndim is not None and x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} axes, got shape {x.shape}")
    if min_ndim is not None and x.ndim < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} axes, got shape {x.shape}")
    return x


def positive_int(name: str, n) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"{name} must be a positive integer, got {n!r}")
    return int(n)
