"""Per-user state that costs memory only for the users who took part: :class:`LazyRows`.

A population of a million users with a thousand sampled per round touches a few thousand users'
vectors in a run. :class:`LazyRows` keeps one row per user in an anonymous memory mapping, whose
pages the operating system provides (zeroed) only when first written, and fills a user's row
with its initial value the first time the row is read or written: a user who never takes part
costs one byte (its "initialised" flag). Initial values are a function of the user's id
(:func:`keyed_normals`), so they do not depend on when, or with whom, a user is first seen.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable

import numpy as np

from securefed.recsys.filling import keyed_uniforms


def keyed_normals(seed: int, keys: np.ndarray) -> np.ndarray:
    """Standard normals that depend only on ``(seed, key)`` (Box-Muller on keyed uniforms)."""
    keys = np.asarray(keys, dtype=np.uint64)
    radius = np.sqrt(-2.0 * np.log(np.maximum(keyed_uniforms(seed, keys), 2.0**-54)))
    # A second, independent stream for the angle: the same keys under another seed.
    angle = 2.0 * np.pi * keyed_uniforms(seed ^ 0x5DEECE66D5A5A5A5, keys)
    return radius * np.cos(angle)


class LazyRows:
    """``n_rows`` rows of shape ``row_shape`` (float64), initialised on first use.

    Supports what FedMF does with its users' state: ``rows[ids]`` (a copy, ``ids`` a 1-D integer
    array) and ``rows[ids] = values``.

    Args:
        n_rows: number of rows (users).
        row_shape: the shape of one row (``()`` for a scalar per user).
        initial: ``initial(ids)`` returns the initial rows of ``ids`` (``(len(ids), *row_shape)``).
    """

    def __init__(
        self,
        n_rows: int,
        row_shape: tuple[int, ...],
        initial: Callable[[np.ndarray], np.ndarray],
    ) -> None:
        if n_rows < 1:
            raise ValueError(f"n_rows must be >= 1, got {n_rows}")
        self.shape = (int(n_rows), *row_shape)
        self._initial = initial
        nbytes = int(np.prod(self.shape)) * 8
        self._buffer = mmap.mmap(-1, max(nbytes, 1))  # anonymous: pages exist once written
        self._rows = np.frombuffer(self._buffer, dtype=np.float64, count=nbytes // 8).reshape(
            self.shape
        )
        self._ready = np.zeros(n_rows, dtype=bool)

    def __len__(self) -> int:
        return self.shape[0]

    def _prepare(self, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64)
        if ids.ndim != 1:
            raise ValueError(f"LazyRows takes a 1-D array of row ids, got shape {ids.shape}")
        fresh = np.unique(ids[~self._ready[ids]])
        if len(fresh):
            self._rows[fresh] = self._initial(fresh)
            self._ready[fresh] = True
        return ids

    def __getitem__(self, ids: np.ndarray) -> np.ndarray:
        return self._rows[self._prepare(ids)]

    def __setitem__(self, ids: np.ndarray, values: np.ndarray) -> None:
        self._rows[self._prepare(ids)] = values

    @property
    def touched(self) -> np.ndarray:
        """The ids of the rows used so far (sorted)."""
        return np.flatnonzero(self._ready)

    def state(self) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, rows)`` of the rows used so far: everything that differs from the initial."""
        ids = self.touched
        return ids, self._rows[ids].copy()

    def load(self, ids: np.ndarray, rows: np.ndarray) -> None:
        """Set rows ``ids`` to ``rows`` (a checkpoint's :meth:`state`); the others start afresh."""
        ids = np.asarray(ids, dtype=np.int64)
        if rows.shape != (len(ids), *self.shape[1:]):
            raise ValueError(f"rows of shape {rows.shape} do not fit {len(ids)} ids")
        self._ready[:] = False
        self._rows[ids] = rows
        self._ready[ids] = True
