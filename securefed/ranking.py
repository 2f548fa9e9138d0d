"""Rankings that break ties the same way on every machine.

numpy's default ``argsort`` (introsort) and ``argpartition`` (introselect) leave the order of equal
keys unspecified, and on x86 numpy dispatches both to vectorised kernels chosen by the CPU
(AVX-512 against AVX2), so two machines can rank tied entries differently: a different "100 most
active users", a different slate, a different top-k hit. Every ranking in securefed goes through
here: largest first, ties broken by the lower index (a stable sort of the negated keys).
"""

from __future__ import annotations

import numpy as np


def rank_descending(values: np.ndarray, axis: int = -1) -> np.ndarray:
    """Indices that sort ``values`` from largest to smallest along ``axis``, ties by lower index.

    Raises:
        ValueError: unsigned or non-numeric keys (negation would wrap or fail), or NaN keys
            (they have no place in a ranking).
    """
    values = np.asarray(values)
    if values.dtype.kind not in "bif":
        raise ValueError(f"ranking keys must be signed integers or floats, got {values.dtype}")
    if values.dtype.kind == "f" and np.isnan(values).any():
        raise ValueError("ranking keys contain NaN")
    keys = -values.astype(np.int64) if values.dtype.kind == "b" else -values
    return np.argsort(keys, axis=axis, kind="stable")


def top_n(values: np.ndarray, n: int, axis: int = -1) -> np.ndarray:
    """Indices of the ``n`` largest entries along ``axis``, best first, ties by lower index.

    Raises:
        ValueError: ``n`` outside ``[0, size along axis]``, or keys :func:`rank_descending` refuses.
    """
    values = np.asarray(values)
    size = values.shape[axis] if values.ndim else 0
    if not 0 <= n <= size:
        raise ValueError(f"n must lie in [0, {size}], got {n}")
    ranked = rank_descending(values, axis=axis)
    return np.take(ranked, np.arange(n), axis=axis)
