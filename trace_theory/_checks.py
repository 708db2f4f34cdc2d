"""Argument checks shared by the theory core.

Every public function validates first and computes second; the messages name the parameter and the
offending value so that a caller three layers up can tell what to change.
"""

from __future__ import annotations

import numpy as np


def _first_bad(x: np.ndarray, bad: np.ndarray):
    """The first offending element of ``x`` (as a Python scalar) where the mask ``bad`` is set."""
    return np.asarray(x)[bad].flat[0].item()


def probabilities(name: str, x) -> np.ndarray:
    """``x`` as a float array with every element in [0, 1] (NaN rejected)."""
    arr = np.asarray(x, dtype=float)
    if arr.size and arr.min() >= 0.0 and arr.max() <= 1.0:  # two reductions, no temporaries (NaN fails)
        return arr
    bad = ~((arr >= 0.0) & (arr <= 1.0))
    if bad.any():
        raise ValueError(f"`{name}` must lie in [0, 1], got {_first_bad(arr, bad)!r}")
    return arr


def positive(name: str, x) -> np.ndarray:
    """``x`` as a float array with every element finite and > 0."""
    arr = np.asarray(x, dtype=float)
    bad = ~(np.isfinite(arr) & (arr > 0.0))
    if bad.any():
        raise ValueError(f"`{name}` must be finite and positive, got {_first_bad(arr, bad)!r}")
    return arr


def counts(name: str, x) -> np.ndarray:
    """``x`` as an int64 array of non-negative integers (integral floats are accepted).

    Strings, complex numbers, booleans and values beyond int64 are refused, not converted.
    """
    arr = np.asarray(x)
    if arr.dtype == bool:
        raise ValueError(f"`{name}` must be non-negative integers, got booleans")
    if arr.dtype.kind not in "iuf":
        shown = repr(x) if arr.ndim == 0 else f"values of dtype {arr.dtype}"
        raise ValueError(f"`{name}` must be non-negative integers, got {shown}")
    if not np.issubdtype(arr.dtype, np.integer):
        arr_f = np.asarray(arr, dtype=float)
        bad = ~(np.isfinite(arr_f) & (arr_f == np.round(arr_f)) & (np.abs(arr_f) < 2.0**63))
        if bad.any():
            raise ValueError(f"`{name}` must be non-negative integers, got {_first_bad(arr_f, bad)!r}")
        arr = arr_f
    if arr.size and arr.min() < 0:
        raise ValueError(f"`{name}` must be non-negative integers, got {_first_bad(arr, arr < 0)!r}")
    return arr.astype(np.int64)


def count(name: str, x) -> int:
    """A single non-negative integer."""
    if type(x) is int and 0 <= x < 2**63:  # the common case, without NumPy (callers check one per turn)
        return x
    if isinstance(x, (bool, np.bool_)) or np.ndim(x) != 0:
        raise ValueError(f"`{name}` must be a non-negative integer, got {x!r}")
    try:
        return int(counts(name, x))
    except (ValueError, TypeError):
        shown = x.item() if isinstance(x, np.generic) else x
        raise ValueError(f"`{name}` must be a non-negative integer, got {shown!r}") from None


def per_item(name: str, x, n: int, check) -> np.ndarray:
    """``check(name, x)`` broadcast to length ``n``: a scalar, or exactly one value per item."""
    arr = check(name, x)
    if arr.ndim > 1 or (arr.ndim == 1 and len(arr) != n):
        raise ValueError(f"`{name}` must be a scalar or hold one value per prompt ({n}), got shape {arr.shape}")
    return np.broadcast_to(arr, (n,))


def vector(name: str, x, dtype=float) -> np.ndarray:
    """``x`` as a one-dimensional array (``dtype=None`` keeps the input's dtype)."""
    arr = np.asarray(x) if dtype is None else np.asarray(x, dtype=dtype)
    if arr.ndim != 1:
        raise ValueError(f"`{name}` must be one-dimensional, got shape {arr.shape}")
    return arr


def same_length(**arrays: np.ndarray) -> int:
    """The common length of one-dimensional arrays, or a ValueError listing the lengths."""
    lengths = {k: len(v) for k, v in arrays.items()}
    if len(set(lengths.values())) > 1:
        listed = ", ".join(f"`{k}` has {n}" for k, n in lengths.items())
        raise ValueError(f"arrays must have the same length: {listed}")
    return next(iter(lengths.values()), 0)
