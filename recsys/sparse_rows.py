"""Index arithmetic on CSR-by-user rating structures (vectorised, no per-user Python loops)."""

from __future__ import annotations

import numpy as np
from scipy import sparse


def take_rows(indptr: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Entries of the CSR rows ``rows`` (in that order).

    Args:
        indptr: CSR offsets, ``len(n_rows) + 1``.
        rows: the rows to take.

    Returns:
        ``(entries, new_indptr)``: positions of the taken entries in the original arrays, and the
        offsets of the taken rows within ``entries``.
    """
    if len(rows) == len(indptr) - 1 and np.array_equal(rows, np.arange(len(rows))):
        return np.arange(indptr[-1], dtype=np.int64), np.asarray(indptr, dtype=np.int64)
    starts = indptr[rows]
    lengths = indptr[rows + 1] - starts
    new_indptr = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lengths, out=new_indptr[1:])
    entries = np.arange(new_indptr[-1], dtype=np.int64) + np.repeat(
        starts - new_indptr[:-1], lengths
    )
    return entries, new_indptr


def merge_rows(
    indptr_a: np.ndarray, indptr_b: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Interleave two CSR structures over the same rows: row ``k`` = row ``k`` of A, then of B.

    Returns:
        ``(indptr, position_of_a, position_of_b)``: the merged offsets and where each entry of A
        and of B lands in the merged arrays.
    """
    len_a, len_b = np.diff(indptr_a), np.diff(indptr_b)
    indptr = np.zeros(len(len_a) + 1, dtype=np.int64)
    np.cumsum(len_a + len_b, out=indptr[1:])
    row_a = np.repeat(np.arange(len(len_a)), len_a)
    row_b = np.repeat(np.arange(len(len_b)), len_b)
    position_a = indptr[row_a] + (np.arange(indptr_a[-1]) - indptr_a[row_a])
    position_b = indptr[row_b] + len_a[row_b] + (np.arange(indptr_b[-1]) - indptr_b[row_b])
    return indptr, position_a, position_b


def merge_sorted(keys_a: np.ndarray, keys_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each entry of two sorted key arrays, with no key in both, lands in their merge.

    Returns:
        ``(position_of_a, position_of_b)`` in the sorted concatenation.
    """
    position_a = np.arange(len(keys_a)) + np.searchsorted(keys_b, keys_a)
    position_b = np.arange(len(keys_b)) + np.searchsorted(keys_a, keys_b)
    return position_a, position_b


def row_ids(indptr: np.ndarray) -> np.ndarray:
    """The row index of every entry of a CSR structure."""
    return np.repeat(np.arange(len(indptr) - 1, dtype=np.int64), np.diff(indptr))


def segment_sum(values: np.ndarray, indptr: np.ndarray) -> np.ndarray:
    """Sum of ``values`` (1-D or 2-D) over each CSR segment; empty segments give 0.

    Computed as one sparse product ``S @ values`` with the 0/1 segment matrix ``S``, which is
    several times faster than strided cumulative sums over the entry axis.
    """
    n_entries = int(indptr[-1])
    segments = sparse.csr_matrix(
        (np.ones(n_entries), np.arange(n_entries), indptr), shape=(len(indptr) - 1, len(values))
    )
    return np.asarray(segments @ values)


def rated_dot(
    left: np.ndarray,
    right: np.ndarray,
    left_index: np.ndarray,
    right_index: np.ndarray,
    *,
    chunk: int = 1 << 20,
) -> np.ndarray:
    """``<left[left_index[k]], right[right_index[k]]>`` for every k, in bounded memory.

    Dense products ``left @ right.T`` in row blocks when the pairs cover a few percent of the
    matrix (BLAS beats gathers there, e.g. MovieLens 100K); otherwise gathers in chunks of
    ``chunk`` pairs, so the temporary never exceeds ``chunk * dim`` floats.
    """
    n_left, n_right = len(left), len(right)
    out = np.empty(len(left_index))
    if len(left_index) >= 0.02 * n_left * n_right:
        block = max(1, chunk // max(n_right, 1))
        order_starts = np.searchsorted(left_index, np.arange(0, n_left + block, block))
        if np.all(np.diff(left_index) >= 0):
            for b, start in enumerate(range(0, n_left, block)):
                lo, hi = order_starts[b], order_starts[b + 1]
                if hi > lo:
                    dense = left[start : start + block] @ right.T
                    flat = (left_index[lo:hi] - start) * n_right + right_index[lo:hi]
                    out[lo:hi] = np.take(dense.ravel(), flat)
            return out
    ones = np.ones(left.shape[1])
    for lo in range(0, len(left_index), chunk):
        hi = min(lo + chunk, len(left_index))
        out[lo:hi] = (
            np.take(left, left_index[lo:hi], axis=0) * np.take(right, right_index[lo:hi], axis=0)
        ) @ ones
    return out


def rating_rows(train) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(indptr, items, ratings)`` of ``train``'s ratings by user (CSR; int64, int64, float64)."""
    csr = train.to_csr()
    return (
        csr.indptr.astype(np.int64),
        csr.indices.astype(np.int64),
        csr.data.astype(np.float64),
    )


def restrict_rows(
    indptr: np.ndarray, rows: np.ndarray, keep: np.ndarray, n_rows: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A CSR structure's entries whose row is in ``keep``, renumbered to positions in ``keep``.

    Args:
        indptr: offsets of the clients' entries.
        rows: row index of each entry, in ``[0, n_rows)``.
        keep: the rows kept (distinct); kept row ``keep[k]`` becomes row ``k``.
        n_rows: the number of rows before.

    Returns:
        ``(new_indptr, new_rows, kept)``: the kept entries' offsets and renumbered rows, and the
        boolean mask of the kept entries over the old ones (their order is unchanged).
    """
    local = np.full(n_rows, -1, dtype=np.int64)
    local[keep] = np.arange(len(keep), dtype=np.int64)
    mapped = local[rows]
    kept = mapped >= 0
    kept_before = np.concatenate([[0], np.cumsum(kept)]).astype(np.int64)
    return kept_before[indptr], mapped[kept], kept
