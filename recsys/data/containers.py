"""Containers of explicit-feedback rating data: the scale, :class:`Ratings`, :class:`Split`.

:class:`Ratings` is a validated, re-indexed set of ``(user index, item index, rating[, timestamp])``
interactions on a :class:`RatingScale`; a :class:`Split` pairs a train and a test set that share
one index space.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import scipy.sparse

if TYPE_CHECKING:
    from securefed.recsys.data.readers import LoadReport

__all__ = ["ML100K_SCALE", "ML_LATEST_SCALE", "RatingScale", "Ratings", "Split"]

_GRID_TOLERANCE = 1e-9


@dataclass(frozen=True)
class RatingScale:
    """An evenly spaced grid of admissible rating values.

    Attributes:
        minimum: Lowest rating.
        maximum: Highest rating.
        step: Distance between two neighbouring ratings; ``(maximum - minimum) / step``
            must be a whole number.
    """

    minimum: float
    maximum: float
    step: float

    def __post_init__(self) -> None:
        for field_name in ("minimum", "maximum", "step"):
            value = getattr(self, field_name)
            if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
                raise TypeError(f"{field_name} must be a real number, got {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"{field_name} must be finite, got {value!r}")
            object.__setattr__(self, field_name, float(value))
        if self.step <= 0:
            raise ValueError(f"step must be positive, got {self.step!r}")
        if self.maximum <= self.minimum:
            raise ValueError(
                f"maximum ({self.maximum!r}) must be greater than minimum ({self.minimum!r})"
            )
        intervals = (self.maximum - self.minimum) / self.step
        if abs(intervals - round(intervals)) > _GRID_TOLERANCE:
            raise ValueError(
                f"the range {self.minimum:g}..{self.maximum:g} is not a whole number of "
                f"steps of {self.step:g}"
            )

    def __str__(self) -> str:
        return f"{self.minimum:g}..{self.maximum:g} step {self.step:g}"

    @classmethod
    def parse(cls, text: str) -> RatingScale:
        """Read a scale written ``MIN:MAX:STEP`` (the command line's ``--scale 0.5:4:0.5``).

        Raises:
            ValueError: naming the text when it is not three numbers separated by colons, or
                when they make no scale (see the class).
        """
        if not isinstance(text, str):
            raise TypeError(f"a scale to parse must be a string, got {type(text).__name__}")
        parts = text.strip().split(":")
        try:
            if len(parts) != 3:
                raise ValueError
            minimum, maximum, step = (float(part) for part in parts)
        except ValueError:
            raise ValueError(
                f"a rating scale is written MIN:MAX:STEP (e.g. 0.5:5:0.5), got {text!r}"
            ) from None
        try:
            return cls(minimum, maximum, step)
        except ValueError as error:
            raise ValueError(f"the scale {text!r} is invalid: {error}") from None

    @property
    def n_levels(self) -> int:
        """Number of admissible rating values."""
        return round((self.maximum - self.minimum) / self.step) + 1

    @property
    def levels(self) -> np.ndarray:
        """All admissible rating values, ascending, ending exactly at ``maximum``."""
        return np.linspace(self.minimum, self.maximum, self.n_levels)

    def contains(self, values: np.ndarray) -> np.ndarray:
        """Tell which values are admissible ratings.

        Args:
            values: Array-like of numbers.

        Returns:
            Boolean array of the same shape: ``True`` where the value lies within
            ``[minimum, maximum]`` and on the grid (both up to a relative tolerance of
            1e-9 steps). NaN and infinities are never contained.
        """
        positions = (np.asarray(values, dtype=np.float64) - self.minimum) / self.step
        with np.errstate(invalid="ignore"):
            on_grid = np.abs(positions - np.rint(positions)) <= _GRID_TOLERANCE
            in_range = (positions >= -_GRID_TOLERANCE) & (
                positions <= self.n_levels - 1 + _GRID_TOLERANCE
            )
        return on_grid & in_range

    def clip(self, values: np.ndarray) -> np.ndarray:
        """Clip values into ``[minimum, maximum]`` (NaN stays NaN)."""
        return np.clip(np.asarray(values, dtype=np.float64), self.minimum, self.maximum)

    def snap(self, values: np.ndarray) -> np.ndarray:
        """Round values to the nearest admissible rating.

        Values outside the range go to the nearest end; the result is always one of
        :attr:`levels` exactly, so snapping twice changes nothing. NaN stays NaN.

        Args:
            values: Array-like of numbers.

        Returns:
            Float64 array of the same shape.
        """
        array = np.asarray(values, dtype=np.float64)
        positions = np.rint((array - self.minimum) / self.step)
        positions = np.clip(positions, 0, self.n_levels - 1)
        finite = ~np.isnan(positions)
        snapped = np.full(array.shape, np.nan)
        snapped[finite] = self.levels[positions[finite].astype(np.intp)]
        return snapped


ML100K_SCALE = RatingScale(1.0, 5.0, 1.0)
"""Whole stars 1..5 (MovieLens 100K and 1M)."""

ML_LATEST_SCALE = RatingScale(0.5, 5.0, 0.5)
"""Half stars 0.5..5 (MovieLens "latest" data sets)."""


def _index_array(values: np.ndarray, label: str, bound: int) -> np.ndarray:
    """Check an index array (1-D integers in ``[0, bound)``) and return it as int32."""
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{label} must be 1-D, got shape {array.shape}")
    if not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"{label} must hold integers, got dtype {array.dtype}")
    if array.size and (array.min() < 0 or array.max() >= bound):
        raise ValueError(
            f"{label} must lie in [0, {bound}), got values from {array.min()} to {array.max()}"
        )
    return array.astype(np.int32, copy=False)


def _id_array(values: np.ndarray, label: str, expected_size: int) -> np.ndarray:
    """Check an original-id array (1-D, one per index) and return it: integers as int64,
    text ids (read with ``ids="string"``) as a numpy string array."""
    array = np.asarray(values)
    if array.ndim != 1 or array.size != expected_size:
        raise ValueError(f"{label} must be 1-D of length {expected_size}, got shape {array.shape}")
    if array.dtype.kind == "U":
        return array
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"{label} must hold integers or strings, got dtype {array.dtype}")
    return array.astype(np.int64, copy=False)


def pair_keys(users: np.ndarray, items: np.ndarray, n_items: int) -> np.ndarray:
    """Encode (user, item) index pairs as unique int64 keys ``user * n_items + item``."""
    return users.astype(np.int64) * n_items + items


def first_duplicate(keys: np.ndarray) -> tuple[int, int] | None:
    """Find the earliest position whose key already occurred.

    Args:
        keys: 1-D array of keys.

    Returns:
        ``(first, second)`` positions of the earliest repeated key (``second`` is the
        smallest position repeating an earlier one, ``first`` that earlier position), or
        ``None`` when all keys are distinct.
    """
    if keys.size < 2:
        return None
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    repeats = np.flatnonzero(sorted_keys[1:] == sorted_keys[:-1]) + 1
    if repeats.size == 0:
        return None
    second = int(order[repeats].min())
    first = int(order[np.searchsorted(sorted_keys, keys[second], side="left")])
    return first, second


def _has_duplicates(keys: np.ndarray) -> bool:
    """Tell whether a 1-D key array holds a repeated value."""
    sorted_keys = np.sort(keys)
    return bool(np.any(sorted_keys[1:] == sorted_keys[:-1]))


@dataclass(frozen=True, eq=False)
class Ratings:
    """Re-indexed explicit-feedback interactions (user index, item index, rating[, timestamp]).

    Row ``k`` says that user ``users[k]`` gave item ``items[k]`` the rating ``ratings[k]``
    (at time ``timestamps[k]`` when timestamps are known). Indices are dense: users are
    ``0..n_users-1`` and ``user_ids[u]`` is the original id of user index ``u``; the same
    holds for items. Arrays are coerced to the documented dtypes on construction and
    should be treated as read-only.

    Attributes:
        users: int32 user index of each rating.
        items: int32 item index of each rating.
        ratings: float64 rating values, all on ``scale``.
        timestamps: int64 time of each rating, or ``None``.
        n_users: Size of the user index space.
        n_items: Size of the item index space.
        scale: Admissible rating values.
        user_ids: original id of each user index (length ``n_users``): int64, or strings
            for text ids (``ids="string"`` of the readers, or a DataFrame's text column).
        item_ids: original id of each item index (length ``n_items``), likewise.
        name: Free-form label, e.g. the data set name.
        load_report: What reading the file found (a
            :class:`~securefed.recsys.data.readers.LoadReport`), or ``None`` for ratings not
            read from a file; kept by :meth:`subset`.
    """

    users: np.ndarray
    items: np.ndarray
    ratings: np.ndarray
    timestamps: np.ndarray | None
    n_users: int
    n_items: int
    scale: RatingScale
    user_ids: np.ndarray
    item_ids: np.ndarray
    name: str = ""
    load_report: LoadReport | None = None

    def __post_init__(self) -> None:
        n_users = operator.index(self.n_users)
        n_items = operator.index(self.n_items)
        if n_users < 0 or n_items < 0:
            raise ValueError(f"n_users and n_items must be >= 0, got {n_users} and {n_items}")
        if not isinstance(self.scale, RatingScale):
            raise TypeError(f"scale must be a RatingScale, got {type(self.scale).__name__}")
        users = _index_array(self.users, "users", n_users)
        items = _index_array(self.items, "items", n_items)
        ratings = np.asarray(self.ratings, dtype=np.float64)
        if ratings.ndim != 1:
            raise ValueError(f"ratings must be 1-D, got shape {ratings.shape}")
        lengths = {"users": users.size, "items": items.size, "ratings": ratings.size}
        timestamps = self.timestamps
        if timestamps is not None:
            timestamps = np.asarray(timestamps)
            if timestamps.ndim != 1 or not np.issubdtype(timestamps.dtype, np.integer):
                raise TypeError("timestamps must be a 1-D integer array or None")
            timestamps = timestamps.astype(np.int64, copy=False)
            lengths["timestamps"] = timestamps.size
        if len(set(lengths.values())) > 1:
            raise ValueError(f"arrays must have equal lengths, got {lengths}")
        if np.isnan(ratings).any():
            raise ValueError("ratings contain NaN")
        off_scale = ~self.scale.contains(ratings)
        if off_scale.any():
            bad = int(np.argmax(off_scale))
            raise ValueError(f"rating {ratings[bad]:g} at row {bad} is off the scale {self.scale}")
        keys = pair_keys(users, items, n_items)
        if _has_duplicates(keys):
            first, second = first_duplicate(keys)
            raise ValueError(
                f"rows {first} and {second} both rate user {users[first]}, item {items[first]}"
            )
        object.__setattr__(self, "n_users", n_users)
        object.__setattr__(self, "n_items", n_items)
        object.__setattr__(self, "users", users)
        object.__setattr__(self, "items", items)
        object.__setattr__(self, "ratings", ratings)
        object.__setattr__(self, "timestamps", timestamps)
        object.__setattr__(self, "user_ids", _id_array(self.user_ids, "user_ids", n_users))
        object.__setattr__(self, "item_ids", _id_array(self.item_ids, "item_ids", n_items))
        object.__setattr__(self, "name", str(self.name))

    def __len__(self) -> int:
        return int(self.ratings.size)

    def __repr__(self) -> str:
        clock = "with" if self.timestamps is not None else "without"
        return (
            f"Ratings(name={self.name!r}, {len(self)} ratings, {self.n_users} users, "
            f"{self.n_items} items, scale {self.scale}, {clock} timestamps)"
        )

    @property
    def nbytes(self) -> int:
        """Bytes held by the per-rating arrays (users, items, ratings and timestamps)."""
        total = self.users.nbytes + self.items.nbytes + self.ratings.nbytes
        if self.timestamps is not None:
            total += self.timestamps.nbytes
        return int(total)

    def subset(self, mask_or_indices: np.ndarray) -> Ratings:
        """Select some ratings, keeping the index space (sizes, ids, scale, name).

        Args:
            mask_or_indices: Boolean mask of length ``len(self)`` or integer row indices.

        Returns:
            A new :class:`Ratings` holding the selected rows in the given order.

        Raises:
            ValueError: If a boolean mask has the wrong length, or if repeated indices
                would duplicate a (user, item) pair.
        """
        selector = np.asarray(mask_or_indices)
        if selector.dtype == np.bool_:
            if selector.shape != (len(self),):
                raise ValueError(
                    f"a boolean mask must have shape ({len(self)},), got {selector.shape}"
                )
        elif selector.size == 0:
            selector = selector.astype(np.intp)
        elif not np.issubdtype(selector.dtype, np.integer):
            raise TypeError(f"expected a boolean mask or integer indices, got {selector.dtype}")
        return Ratings(
            users=self.users[selector],
            items=self.items[selector],
            ratings=self.ratings[selector],
            timestamps=None if self.timestamps is None else self.timestamps[selector],
            n_users=self.n_users,
            n_items=self.n_items,
            scale=self.scale,
            user_ids=self.user_ids,
            item_ids=self.item_ids,
            name=self.name,
            load_report=self.load_report,
        )

    def to_csr(self) -> scipy.sparse.csr_matrix:
        """Return the ``n_users x n_items`` rating matrix in CSR form with sorted indices."""
        matrix = scipy.sparse.csr_matrix(
            (self.ratings, (self.users, self.items)), shape=(self.n_users, self.n_items)
        )
        matrix.sort_indices()
        return matrix


@dataclass(frozen=True)
class Split:
    """A train/test pair of ratings sharing one index space.

    Attributes:
        train: Ratings to fit on.
        test: Held-out ratings; same ``n_users``, ``n_items``, ids and scale as ``train``.
        name: Free-form label.
    """

    train: Ratings
    test: Ratings
    name: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.train, Ratings) or not isinstance(self.test, Ratings):
            raise TypeError("train and test must both be Ratings")
        train, test = self.train, self.test
        if (train.n_users, train.n_items) != (test.n_users, test.n_items):
            raise ValueError(
                f"train is {train.n_users}x{train.n_items} but test is "
                f"{test.n_users}x{test.n_items}; they must share one index space"
            )
        if train.scale != test.scale:
            raise ValueError(f"train scale {train.scale} differs from test scale {test.scale}")
        for label in ("user_ids", "item_ids"):
            mine, theirs = getattr(train, label), getattr(test, label)
            if mine is not theirs and not np.array_equal(mine, theirs):
                raise ValueError(f"train and test have different {label}")
