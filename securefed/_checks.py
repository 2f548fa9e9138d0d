"""Small input validators shared by the privacy layer (raise, never assert)."""

from __future__ import annotations

import numpy as np


def finite_array(name: str, values: np.ndarray) -> np.ndarray:
    """Return ``values`` as a float64 array, refusing NaN or infinity.

    Raises:
        ValueError: naming ``name`` and the first offending position.
    """
    array = np.asarray(values, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        total = np.add.reduce(array, axis=None)
    if np.isfinite(total):
        return array  # a finite sum has no NaN or infinity among its terms
    bad = ~np.isfinite(array)
    if bad.any():
        position = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"{name} contains {array[position]} at index {position}; only finite values"
        )
    return array


def positive(name: str, value: float, *, allow_zero: bool = False) -> None:
    """Refuse a non-positive (or negative, with ``allow_zero``) or non-finite number."""
    if not np.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be finite and {bound}, got {value!r}")


def probability(name: str, value: float, *, open_low: bool = False) -> None:
    """Refuse a value outside [0, 1] (or (0, 1] with ``open_low``)."""
    low_ok = value > 0 if open_low else value >= 0
    if not (low_ok and value <= 1):
        interval = "(0, 1]" if open_low else "[0, 1]"
        raise ValueError(f"{name} must lie in {interval}, got {value!r}")
