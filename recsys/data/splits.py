"""Train/test splits: random, temporal (each user's latest ratings) and MovieLens 100K's fixed ones.

:func:`random_split` and :func:`temporal_split` split any :class:`Ratings`;
:func:`load_movielens_100k` reads one of the splits GroupLens distributes with MovieLens 100K
(:data:`ML100K_SPLITS`), indexing train and test together over all ids of ``u.data``.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from securefed.recsys.data.containers import Ratings, RatingScale, Split
from securefed.recsys.data.errors import DataFormatError
from securefed.recsys.data.readers import read_ratings_file

__all__ = ["ML100K_SPLITS", "load_movielens_100k", "random_split", "temporal_split"]

ML100K_SPLITS = ("u1", "u2", "u3", "u4", "u5", "ua", "ub")
"""The fixed train/test splits distributed with MovieLens 100K."""

SPLIT_METHODS = ("random", "temporal")
"""Split methods that apply to any ratings (see :func:`split_by`)."""


def check_fraction(test_fraction: float) -> float:
    """Validate a test fraction, which must lie strictly between 0 and 1."""
    if isinstance(test_fraction, bool) or not isinstance(test_fraction, (int, float, np.number)):
        raise TypeError(f"test_fraction must be a number, got {test_fraction!r}")
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must lie strictly between 0 and 1, got {test_fraction}")
    return float(test_fraction)


def split_by(ratings: Ratings, method: str, test_fraction: float, seed: int) -> Split:
    """Apply a named split method (``"random"`` or ``"temporal"``)."""
    if method == "random":
        return random_split(ratings, test_fraction, np.random.default_rng(seed))
    if method == "temporal":
        return temporal_split(ratings, test_fraction)
    raise ValueError(f"unknown split {method!r}; expected one of {SPLIT_METHODS}")


def _round_half_up(values: np.ndarray | float) -> np.ndarray:
    """Round to the nearest integer, halves upwards (unlike numpy's half-to-even)."""
    return np.floor(np.asarray(values, dtype=np.float64) + 0.5).astype(np.int64)


def random_split(ratings: Ratings, test_fraction: float, rng: np.random.Generator) -> Split:
    """Hold out a uniformly random share of the ratings.

    Args:
        ratings: Ratings to split.
        test_fraction: Share of ratings in the test set (``round(test_fraction * n)``).
        rng: Source of randomness.

    Returns:
        Disjoint train and test sets covering all ratings, each in the original order.
        Users or items may end up only in the test set.
    """
    test_fraction = check_fraction(test_fraction)
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy Generator, got {type(rng).__name__}")
    n_test = int(_round_half_up(test_fraction * len(ratings)))
    in_test = np.zeros(len(ratings), dtype=bool)
    in_test[rng.permutation(len(ratings))[:n_test]] = True
    return Split(ratings.subset(~in_test), ratings.subset(in_test), f"{ratings.name}/random")


def temporal_split(ratings: Ratings, test_fraction: float) -> Split:
    """Hold out each user's latest ratings.

    User ``u`` with ``n_u`` ratings gives ``round(test_fraction * n_u)`` (halves rounded
    up) of its latest ratings to the test set, but always keeps at least one in train, so
    a user with a single rating keeps it in train. "Latest" follows the timestamps; among
    equal timestamps, a rating further down the data counts as later.

    Args:
        ratings: Ratings with timestamps.
        test_fraction: Share of each user's ratings to hold out.

    Returns:
        Disjoint train and test sets covering all ratings, each in the original order.

    Raises:
        ValueError: If the ratings have no timestamps.
    """
    test_fraction = check_fraction(test_fraction)
    if ratings.timestamps is None:
        raise ValueError(
            f"a temporal split needs timestamps, and the ratings {ratings.name!r} have none"
        )
    n = len(ratings)
    order = np.lexsort((np.arange(n), ratings.timestamps, ratings.users))
    counts = np.bincount(ratings.users, minlength=ratings.n_users)
    held_out = np.minimum(_round_half_up(test_fraction * counts), np.maximum(counts - 1, 0))
    ends = np.cumsum(counts)
    sorted_users = ratings.users[order]
    from_the_end = ends[sorted_users] - 1 - np.arange(n)
    in_test = np.zeros(n, dtype=bool)
    in_test[order] = from_the_end < held_out[sorted_users]
    return Split(ratings.subset(~in_test), ratings.subset(in_test), f"{ratings.name}/temporal")


def _positions_of(path: Path, ids: np.ndarray, raw: np.ndarray, label: str) -> np.ndarray:
    """Look up original ids in a sorted id array, raising for unknown ids."""
    positions = np.searchsorted(ids, raw)
    clipped = np.minimum(positions, max(ids.size - 1, 0))
    unknown = (positions >= ids.size) | (ids[clipped] != raw)
    if unknown.any():
        raise DataFormatError(
            path, None, f"{label} id {raw[np.argmax(unknown)]} does not occur in u.data"
        )
    return positions.astype(np.int32)


def _ratings_in_space(
    path: Path,
    user_ids: np.ndarray,
    item_ids: np.ndarray,
    name: str,
    scale: RatingScale | None,
    duplicates: str,
) -> Ratings:
    """Read a MovieLens 100K file into the index space of given id arrays."""
    raw = read_ratings_file(path, fmt="movielens100k", scale=scale, duplicates=duplicates)
    return Ratings(
        users=_positions_of(path, user_ids, raw.users, "user"),
        items=_positions_of(path, item_ids, raw.items, "item"),
        ratings=raw.ratings,
        timestamps=raw.timestamps,
        n_users=user_ids.size,
        n_items=item_ids.size,
        scale=raw.scale,
        user_ids=user_ids,
        item_ids=item_ids,
        name=name,
        load_report=raw.report,
    )


def load_movielens_100k(
    root: str | os.PathLike,
    split: str = "u1",
    *,
    scale: RatingScale | None = None,
    duplicates: str = "error",
) -> Split:
    """Load one of the fixed MovieLens 100K train/test splits.

    Train and test are indexed together over all ids of ``u.data`` (943 users and 1682
    items for the genuine data set), so that an index means the same user or item in both.

    Args:
        root: Folder holding ``u.data`` and the ``<split>.base`` / ``<split>.test`` files.
        split: One of :data:`ML100K_SPLITS`.
        scale: Rating scale (default: the format's 1..5).
        duplicates: Policy for repeated (user, item) pairs in each file
            (:data:`~securefed.recsys.data.readers.DUPLICATE_POLICIES`).

    Returns:
        The split, named ``"<folder>/<split>"``.

    Raises:
        ValueError: If ``split`` is unknown.
        FileNotFoundError: If a needed file is missing.
        DataFormatError: If a file is malformed or names an id absent from ``u.data``.
    """
    if split not in ML100K_SPLITS:
        raise ValueError(f"unknown MovieLens 100K split {split!r}; expected one of {ML100K_SPLITS}")
    root = Path(root)
    everything = read_ratings_file(
        root / "u.data", fmt="movielens100k", scale=scale, duplicates=duplicates
    )
    user_ids = np.unique(everything.users)
    item_ids = np.unique(everything.items)
    name = f"{root.resolve().name or 'ml-100k'}/{split}"
    train = _ratings_in_space(root / f"{split}.base", user_ids, item_ids, name, scale, duplicates)
    test = _ratings_in_space(root / f"{split}.test", user_ids, item_ids, name, scale, duplicates)
    return Split(train, test, name)
