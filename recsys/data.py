"""Explicit-feedback rating data: file readers, train/test splits and a synthetic generator.

The module turns rating files into :class:`Ratings`, a validated, re-indexed container of
``(user index, item index, rating[, timestamp])`` interactions, and pairs of them into a
:class:`Split`. Four on-disk layouts are understood:

* ``movielens100k``: MovieLens 100K ``u.data`` / ``uN.base`` / ``uN.test``, whitespace
  (tab) separated ``user item rating timestamp`` without a header, ratings 1..5.
* ``dat``: MovieLens 1M/10M style ``user::item::rating::timestamp`` without a header.
* ``ml-latest``: comma separated with the header ``userId,movieId,rating,timestamp``,
  half-star ratings 0.5..5.
* ``csv``: plain comma separated, either with a header naming ``user,item,rating`` and
  optionally ``timestamp``, or without a header and with 3 or 4 columns.

Parsing is done in one vectorised pass with :func:`numpy.loadtxt`; only when that fails is
the file scanned line by line to find and name the offending line in a
:class:`DataFormatError`.

The package ships MovieLens ``ml-latest-small`` (GroupLens Research, redistributed under
the terms of its README.txt, which travels with it) as the embedded default data set.
"""

from __future__ import annotations

import codecs
import io
import math
import operator
import os
import re
import warnings
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import NamedTuple

import numpy as np
import scipy.sparse

__all__ = [
    "EMBEDDED_DATASET",
    "FORMATS",
    "ML100K_SCALE",
    "ML100K_SPLITS",
    "ML_LATEST_SCALE",
    "DataFormatError",
    "RatingScale",
    "Ratings",
    "RawRatings",
    "Split",
    "embedded_default_path",
    "load_dataset",
    "load_movielens_100k",
    "load_ratings",
    "random_split",
    "read_ratings_file",
    "reindex",
    "synthetic_ratings",
    "temporal_split",
]

_GRID_TOLERANCE = 1e-9
_MAX_EXACT_FLOAT_INT = 2**53

EMBEDDED_DATASET = "ml-latest-small"
"""Name under which :func:`load_dataset` finds the data set shipped with the package."""

FORMATS = ("auto", "movielens100k", "dat", "ml-latest", "csv")
"""Values accepted by the ``fmt`` argument of the readers."""

ML100K_SPLITS = ("u1", "u2", "u3", "u4", "u5", "ua", "ub")
"""The fixed train/test splits distributed with MovieLens 100K."""

_SPLIT_METHODS = ("random", "temporal")
_COLUMN_NAMES = ("user", "item", "rating", "timestamp")


# --------------------------------------------------------------------------------------
# Rating scale
# --------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------
# Containers
# --------------------------------------------------------------------------------------


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
    """Check an original-id array (1-D integers, one per index) and return it as int64."""
    array = np.asarray(values)
    if array.ndim != 1 or array.size != expected_size:
        raise ValueError(f"{label} must be 1-D of length {expected_size}, got shape {array.shape}")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"{label} must hold integers, got dtype {array.dtype}")
    return array.astype(np.int64, copy=False)


def _pair_keys(users: np.ndarray, items: np.ndarray, n_items: int) -> np.ndarray:
    """Encode (user, item) index pairs as unique int64 keys ``user * n_items + item``."""
    return users.astype(np.int64) * n_items + items


def _first_duplicate(keys: np.ndarray) -> tuple[int, int] | None:
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
        user_ids: int64 original id of each user index (length ``n_users``).
        item_ids: int64 original id of each item index (length ``n_items``).
        name: Free-form label, e.g. the data set name.
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
        keys = _pair_keys(users, items, n_items)
        if _has_duplicates(keys):
            first, second = _first_duplicate(keys)
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


# --------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------


class DataFormatError(ValueError):
    """Malformed ratings file; the message names the file, the line and the cause.

    Attributes:
        path: The file (as given to the reader).
        line: 1-based line number as in the file, or ``None`` when the problem concerns
            the file as a whole (e.g. an empty file).
        cause: What is wrong, in words.
    """

    def __init__(self, path: str | os.PathLike, line: int | None, cause: str) -> None:
        self.path = path
        self.line = line
        self.cause = cause
        where = os.fspath(path) if line is None else f"{os.fspath(path)}, line {line}"
        super().__init__(f"{where}: {cause}")

    def __reduce__(self):
        return (type(self), (self.path, self.line, self.cause))


# --------------------------------------------------------------------------------------
# File reading
# --------------------------------------------------------------------------------------


class RawRatings(NamedTuple):
    """Ratings as read from a file, before re-indexing.

    Attributes:
        users: int64 original user ids, one per rating, in file order.
        items: int64 original item ids.
        ratings: float64 ratings, all on ``scale``.
        timestamps: int64 timestamps, or ``None`` when the file has none.
        scale: The scale the ratings were checked against.
        fmt: The format the file was read as.
    """

    users: np.ndarray
    items: np.ndarray
    ratings: np.ndarray
    timestamps: np.ndarray | None
    scale: RatingScale
    fmt: str


@dataclass(frozen=True)
class _Layout:
    """Where the fields of one rating sit on a line.

    Attributes:
        fmt: Format name.
        delimiter: Field separator; ``None`` means runs of whitespace.
        n_fields: Number of fields every data line must have.
        columns: Field positions of user, item, rating and timestamp (``None``: absent).
        default_scale: Scale of the format, or ``None`` when it must be given or inferred.
    """

    fmt: str
    delimiter: str | None
    n_fields: int
    columns: tuple[int, int, int, int | None]
    default_scale: RatingScale | None

    def split(self, line: str) -> list[str]:
        """Cut a line into its fields."""
        return line.split() if self.delimiter is None else line.split(self.delimiter)

    @property
    def used_columns(self) -> tuple[int, ...]:
        """Positions of the fields that are read, in the order user, item, rating[, time]."""
        return tuple(column for column in self.columns if column is not None)


@dataclass(frozen=True)
class _Body:
    """The data lines of a file (everything after an optional header).

    Attributes:
        path: The file, for error messages.
        text: Decoded text of the data lines.
        first_line: 1-based file line number of the first line of ``text``.
        layout: How to read a line.
    """

    path: Path
    text: str
    first_line: int
    layout: _Layout

    def locate(self, row: int) -> tuple[int, str]:
        """Return the file line number and text of data row ``row`` (blank lines skipped)."""
        seen = -1
        for offset, line in enumerate(self.text.split("\n")):
            if line.strip():
                seen += 1
                if seen == row:
                    return self.first_line + offset, line
        raise IndexError(f"row {row} is beyond the data")

    def error(self, row: int, cause: str) -> DataFormatError:
        """Build the error for data row ``row``."""
        line_number, _ = self.locate(row)
        return DataFormatError(self.path, line_number, cause)

    def field_text(self, row: int, which: int) -> str:
        """Return the stripped text of field ``which`` (0 user .. 3 timestamp) of a row."""
        _, line = self.locate(row)
        return self.layout.split(line)[self.layout.columns[which]].strip()


def _decode(path: Path, data: bytes) -> str:
    """Decode UTF-8 bytes (an optional byte-order mark is dropped)."""
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8) :]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        column = error.start - (data.rfind(b"\n", 0, error.start) + 1) + 1
        raise DataFormatError(
            path,
            line,
            f"not valid UTF-8: byte 0x{data[error.start]:02x} at column {column} ({error.reason})",
        ) from None


def _first_content_line(text: str) -> tuple[int, str, int]:
    """Find the first non-blank line.

    Returns:
        ``(line_number, line, end)`` where ``end`` is the offset just past the line.
    """
    position, line_number = 0, 1
    while True:
        end = text.find("\n", position)
        stop = len(text) if end < 0 else end
        line = text[position:stop]
        if line.strip() or end < 0:
            return line_number, line, (len(text) if end < 0 else end + 1)
        position, line_number = end + 1, line_number + 1


def _is_number(text: str) -> bool:
    """Tell whether ``float`` accepts the text."""
    try:
        float(text)
    except ValueError:
        return False
    return True


_ML100K_NAME = re.compile(r"u(\.data|[0-9a-z]\.(base|test))", re.IGNORECASE)
_ML_LATEST_HEADER = ("userId", "movieId", "rating", "timestamp")
_CSV_HEADER = ("user", "item", "rating", "timestamp")


def _detect_format(path: Path, first_line: str) -> str:
    """Guess the format from the file name, then from the first non-blank line."""
    name = path.name.lower()
    if name.endswith(".dat") or "::" in first_line:
        return "dat"
    if _ML100K_NAME.fullmatch(name) or "\t" in first_line:
        return "movielens100k"
    fields = [field.strip().lower() for field in first_line.split(",")]
    if not _is_number(fields[0]) and {"userid", "movieid"} & set(fields):
        return "ml-latest"
    return "csv"


def _header_layout(
    path: Path,
    line_number: int,
    line: str,
    names: tuple[str, str, str, str],
    fmt: str,
    default_scale: RatingScale | None,
) -> _Layout:
    """Build the layout of a comma-separated file from its header line.

    Args:
        path: The file, for errors.
        line_number: Line number of the header.
        line: The header text.
        names: Expected column names for user, item, rating and timestamp (the last is
            optional); matched case-insensitively.
        fmt: Format name.
        default_scale: Scale of the format.
    """
    header = [field.strip().lower() for field in line.split(",")]
    expected = ",".join(names[:3]) + f"[,{names[3]}]"
    columns: list[int | None] = []
    for name in names:
        if name.lower() in header:
            columns.append(header.index(name.lower()))
        elif name == names[3]:
            columns.append(None)
        else:
            raise DataFormatError(
                path, line_number, f"header lacks the column {name!r} (expected {expected})"
            )
    return _Layout(fmt, ",", len(header), tuple(columns), default_scale)


def _body_and_layout(path: Path, text: str, fmt: str) -> _Body:
    """Work out the layout of a file and where its data lines start."""
    line_number, first_line, end = _first_content_line(text)
    if fmt == "movielens100k":
        return _Body(path, text, 1, _Layout(fmt, None, 4, (0, 1, 2, 3), ML100K_SCALE))
    if fmt == "dat":
        return _Body(path, text, 1, _Layout(fmt, "::", 4, (0, 1, 2, 3), ML100K_SCALE))
    first_field = first_line.split(",")[0].strip()
    has_header = not _is_number(first_field)
    if fmt == "ml-latest":
        if not has_header:
            raise DataFormatError(
                path, line_number, f"missing header line {','.join(_ML_LATEST_HEADER)!r}"
            )
        layout = _header_layout(
            path, line_number, first_line, _ML_LATEST_HEADER, fmt, ML_LATEST_SCALE
        )
        return _Body(path, text[end:], line_number + 1, layout)
    if has_header:
        layout = _header_layout(path, line_number, first_line, _CSV_HEADER, fmt, None)
        return _Body(path, text[end:], line_number + 1, layout)
    n_fields = len(first_line.split(","))
    if n_fields not in (3, 4):
        qualifier = "too few" if n_fields < 3 else "too many"
        raise DataFormatError(
            path,
            line_number,
            f"{qualifier} fields: expected 3 or 4 (user,item,rating[,timestamp]), found {n_fields}",
        )
    columns = (0, 1, 2, 3 if n_fields == 4 else None)
    return _Body(path, text, 1, _Layout(fmt, ",", n_fields, columns, None))


def _parse_fast(body: _Body) -> np.ndarray | None:
    """Parse all data lines with numpy; ``None`` when numpy rejects the text."""
    layout = body.layout
    text, delimiter = body.text, layout.delimiter
    if delimiter == "::":
        if "\t" in text:
            return None
        text, delimiter = text.replace("::", "\t"), "\t"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            table = np.loadtxt(
                io.StringIO(text), delimiter=delimiter, dtype=np.float64, ndmin=2, comments=None
            )
    except ValueError:
        return None
    if table.shape[1] != layout.n_fields:
        return None
    return table[:, layout.used_columns]


def _parse_slowly(body: _Body) -> np.ndarray:
    """Parse the data lines one by one, raising on the first malformed line."""
    layout = body.layout
    names = [
        name
        for name, column in zip(_COLUMN_NAMES, layout.columns, strict=True)
        if column is not None
    ]
    rows: list[list[float]] = []
    for offset, line in enumerate(body.text.split("\n")):
        if not line.strip():
            continue
        line_number = body.first_line + offset
        fields = layout.split(line)
        if len(fields) != layout.n_fields:
            qualifier = "too few" if len(fields) < layout.n_fields else "too many"
            raise DataFormatError(
                body.path,
                line_number,
                f"{qualifier} fields: expected {layout.n_fields}, found {len(fields)}",
            )
        values = []
        for name, column in zip(names, layout.used_columns, strict=True):
            try:
                values.append(float(fields[column]))
            except ValueError:
                raise DataFormatError(
                    body.path,
                    line_number,
                    f"non-numeric {name} field {fields[column].strip()!r}",
                ) from None
        rows.append(values)
    return np.array(rows, dtype=np.float64).reshape(len(rows), len(names))


def _whole_numbers(body: _Body, values: np.ndarray, which: int) -> np.ndarray:
    """Convert a float column of ids or timestamps to int64, naming a non-integral entry."""
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(values) | (values != np.rint(values))
        bad |= np.abs(values) > _MAX_EXACT_FLOAT_INT
    if bad.any():
        row = int(np.argmax(bad))
        token = body.field_text(row, which)
        raise body.error(row, f"{_COLUMN_NAMES[which]} {token!r} is not an integer")
    return values.astype(np.int64)


def _infer_scale(body: _Body, ratings: np.ndarray) -> RatingScale:
    """Infer a scale: data minimum to maximum, in half steps if any rating is a half."""
    finite = np.isfinite(ratings)
    doubled = ratings * 2
    off_half_grid = finite & (doubled != np.rint(doubled))
    if off_half_grid.any():
        row = int(np.argmax(off_half_grid))
        token = body.field_text(row, 2)
        raise body.error(
            row,
            f"rating {token} is neither a whole nor a half number, so no scale can be "
            "inferred; pass scale=",
        )
    if not finite.any():
        raise DataFormatError(body.path, None, "no finite ratings to infer a scale from")
    values = ratings[finite]
    low, high = float(values.min()), float(values.max())
    if low == high:
        raise DataFormatError(
            body.path, None, f"every rating is {low:g}, so no scale can be inferred; pass scale="
        )
    step = 1.0 if np.all(values == np.rint(values)) else 0.5
    return RatingScale(low, high, step)


def _check_on_scale(body: _Body, ratings: np.ndarray, scale: RatingScale) -> None:
    """Raise for the first rating off the scale (NaN and infinities included)."""
    off_scale = ~scale.contains(ratings)
    if off_scale.any():
        row = int(np.argmax(off_scale))
        token = body.field_text(row, 2)
        raise body.error(row, f"rating {token} is off the scale {scale}")


def _check_unique_pairs(body: _Body, users: np.ndarray, items: np.ndarray) -> None:
    """Raise for the first (user, item) pair that repeats an earlier line."""
    user_index = np.unique(users, return_inverse=True)[1]
    item_ids, item_index = np.unique(items, return_inverse=True)
    duplicate = _first_duplicate(_pair_keys(user_index, item_index, item_ids.size))
    if duplicate is not None:
        first, second = duplicate
        first_line, _ = body.locate(first)
        raise body.error(
            second,
            f"duplicate rating of item {items[second]} by user {users[second]} "
            f"(first given on line {first_line})",
        )


def read_ratings_file(
    path: str | os.PathLike, *, fmt: str = "auto", scale: RatingScale | None = None
) -> RawRatings:
    """Read and check one ratings file, keeping the original ids.

    Args:
        path: The file.
        fmt: One of :data:`FORMATS`; ``"auto"`` decides from the file name
            (``*.dat``, ``u.data``, ``uN.base``/``uN.test``) and then the first line
            (``::``, tabs, an ``userId,movieId`` header, else plain csv).
        scale: Rating scale to check against. ``None`` means the format's own scale
            (1..5 step 1 for ``movielens100k`` and ``dat``, 0.5..5 step 0.5 for
            ``ml-latest``) or, for plain ``csv``, one inferred from the data (its minimum
            to its maximum, step 0.5 if any rating is a half, else 1).

    Returns:
        The ratings in file order, as :class:`RawRatings`.

    Raises:
        FileNotFoundError: If the file does not exist.
        ValueError: If ``fmt`` is unknown.
        DataFormatError: If the file is malformed: not UTF-8, empty, a header column
            missing, a line with too few or too many fields, a non-numeric field, a
            non-integral id or timestamp, a rating off the scale (or NaN), or a repeated
            (user, item) pair.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    if scale is not None and not isinstance(scale, RatingScale):
        raise TypeError(f"scale must be a RatingScale or None, got {type(scale).__name__}")
    path = Path(path)
    text = _decode(path, path.read_bytes())
    if not text.strip():
        raise DataFormatError(path, None, "empty file")
    if fmt == "auto":
        fmt = _detect_format(path, _first_content_line(text)[1])
    body = _body_and_layout(path, text, fmt)
    if not body.text.strip():
        raise DataFormatError(path, None, "no ratings: the file has a header but no data lines")
    table = _parse_fast(body)
    if table is None:
        table = _parse_slowly(body)
    users = _whole_numbers(body, table[:, 0], 0)
    items = _whole_numbers(body, table[:, 1], 1)
    ratings = np.ascontiguousarray(table[:, 2])
    timestamps = _whole_numbers(body, table[:, 3], 3) if table.shape[1] == 4 else None
    if scale is None:
        scale = body.layout.default_scale or _infer_scale(body, ratings)
    _check_on_scale(body, ratings, scale)
    _check_unique_pairs(body, users, items)
    return RawRatings(users, items, ratings, timestamps, scale, fmt)


def reindex(
    raw_users: np.ndarray, raw_items: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Map original ids to dense indices, ids sorted ascending.

    Args:
        raw_users: Original user id of each rating.
        raw_items: Original item id of each rating.

    Returns:
        ``(users, items, user_ids, item_ids)``: int32 indices per rating and the int64
        original id of each index (``user_ids[users] == raw_users``).
    """
    user_ids, users = np.unique(np.asarray(raw_users, dtype=np.int64), return_inverse=True)
    item_ids, items = np.unique(np.asarray(raw_items, dtype=np.int64), return_inverse=True)
    if max(user_ids.size, item_ids.size) > np.iinfo(np.int32).max:
        raise ValueError("more distinct ids than an int32 index can address")
    return (
        users.reshape(-1).astype(np.int32),
        items.reshape(-1).astype(np.int32),
        user_ids,
        item_ids,
    )


def _default_name(path: Path) -> str:
    """Name a data set after its file, or after its folder for generic file names."""
    if path.stem.lower() in {"ratings", "u", "data"} and path.parent.name:
        return path.parent.name
    return path.stem


def load_ratings(
    path: str | os.PathLike,
    *,
    fmt: str = "auto",
    scale: RatingScale | None = None,
    name: str | None = None,
) -> Ratings:
    """Read one ratings file into re-indexed :class:`Ratings`.

    Args:
        path: The file.
        fmt: File format, see :func:`read_ratings_file`.
        scale: Rating scale, see :func:`read_ratings_file`.
        name: Label of the result; defaults to the file stem (or its folder's name for
            ``ratings.*`` and ``u.data``).

    Returns:
        The ratings in file order; indices follow ascending original ids.

    Raises:
        FileNotFoundError: If the file does not exist.
        DataFormatError: If the file is malformed.
    """
    path = Path(path)
    raw = read_ratings_file(path, fmt=fmt, scale=scale)
    users, items, user_ids, item_ids = reindex(raw.users, raw.items)
    return Ratings(
        users=users,
        items=items,
        ratings=raw.ratings,
        timestamps=raw.timestamps,
        n_users=user_ids.size,
        n_items=item_ids.size,
        scale=raw.scale,
        user_ids=user_ids,
        item_ids=item_ids,
        name=_default_name(path) if name is None else name,
    )


# --------------------------------------------------------------------------------------
# MovieLens 100K and data set entry point
# --------------------------------------------------------------------------------------


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


def _ratings_in_space(path: Path, user_ids: np.ndarray, item_ids: np.ndarray, name: str) -> Ratings:
    """Read a MovieLens 100K file into the index space of given id arrays."""
    raw = read_ratings_file(path, fmt="movielens100k")
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
    )


def load_movielens_100k(root: str | os.PathLike, split: str = "u1") -> Split:
    """Load one of the fixed MovieLens 100K train/test splits.

    Train and test are indexed together over all ids of ``u.data`` (943 users and 1682
    items for the genuine data set), so that an index means the same user or item in both.

    Args:
        root: Folder holding ``u.data`` and the ``<split>.base`` / ``<split>.test`` files.
        split: One of :data:`ML100K_SPLITS`.

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
    everything = read_ratings_file(root / "u.data", fmt="movielens100k")
    user_ids = np.unique(everything.users)
    item_ids = np.unique(everything.items)
    name = f"{root.resolve().name or 'ml-100k'}/{split}"
    train = _ratings_in_space(root / f"{split}.base", user_ids, item_ids, name)
    test = _ratings_in_space(root / f"{split}.test", user_ids, item_ids, name)
    return Split(train, test, name)


def embedded_default_path() -> Path:
    """Return the path of the ``ml-latest-small`` ratings shipped with the package.

    Raises:
        FileNotFoundError: If the package was installed without its data files.
    """
    package = resources.files("securefed.recsys")
    resource = package.joinpath("datasets", EMBEDDED_DATASET, "ratings.csv")
    path = Path(os.fspath(resource)) if isinstance(resource, os.PathLike) else None
    if path is None or not path.is_file():
        raise FileNotFoundError(
            f"the embedded data set {EMBEDDED_DATASET!r} is missing from the installed "
            f"package (expected recsys/datasets/{EMBEDDED_DATASET}/ratings.csv)"
        )
    return path


def _check_fraction(test_fraction: float) -> float:
    """Validate a test fraction, which must lie strictly between 0 and 1."""
    if isinstance(test_fraction, bool) or not isinstance(test_fraction, (int, float, np.number)):
        raise TypeError(f"test_fraction must be a number, got {test_fraction!r}")
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must lie strictly between 0 and 1, got {test_fraction}")
    return float(test_fraction)


def _split_by(ratings: Ratings, method: str, test_fraction: float, seed: int) -> Split:
    """Apply a named split method (``"random"`` or ``"temporal"``)."""
    if method == "random":
        return random_split(ratings, test_fraction, np.random.default_rng(seed))
    if method == "temporal":
        return temporal_split(ratings, test_fraction)
    raise ValueError(f"unknown split {method!r}; expected one of {_SPLIT_METHODS}")


def load_dataset(
    source: str | os.PathLike = EMBEDDED_DATASET,
    *,
    split: str | None = None,
    test_fraction: float = 0.2,
    seed: int = 0,
) -> Split:
    """Load a data set and split it into train and test.

    Args:
        source: ``"ml-latest-small"`` for the data set shipped with the package; a folder
            holding MovieLens 100K (``u.data``); a folder holding ``ratings.csv`` or
            ``ratings.dat``; or a ratings file.
        split: ``"random"`` (the default, except for MovieLens 100K) or ``"temporal"``;
            for MovieLens 100K also one of :data:`ML100K_SPLITS` (default ``"u1"``).
        test_fraction: Share of ratings held out by ``"random"`` and ``"temporal"``.
        seed: Seed of the ``"random"`` split.

    Returns:
        The train/test split.

    Raises:
        FileNotFoundError: If ``source`` does not exist or a folder holds no known file.
        ValueError: If ``split`` or ``test_fraction`` is invalid.
        DataFormatError: If a file is malformed.
    """
    test_fraction = _check_fraction(test_fraction)
    if isinstance(source, str) and source == EMBEDDED_DATASET:
        ratings = load_ratings(embedded_default_path(), fmt="ml-latest", name=EMBEDDED_DATASET)
        return _split_by(ratings, split or "random", test_fraction, seed)
    path = Path(source)
    if not path.exists():
        raise FileNotFoundError(
            f"no ratings data at {path} (expected a ratings file, a folder holding u.data, "
            f"ratings.csv or ratings.dat, or {EMBEDDED_DATASET!r})"
        )
    if path.is_dir():
        if (path / "u.data").is_file():
            method = split or "u1"
            if method in ML100K_SPLITS:
                return load_movielens_100k(path, method)
            if method not in _SPLIT_METHODS:
                raise ValueError(
                    f"unknown split {method!r}; expected one of {ML100K_SPLITS + _SPLIT_METHODS}"
                )
            ratings = load_ratings(path / "u.data", fmt="movielens100k")
            return _split_by(ratings, method, test_fraction, seed)
        candidates = [path / "ratings.csv", path / "ratings.dat"]
        found = [candidate for candidate in candidates if candidate.is_file()]
        if not found:
            raise FileNotFoundError(f"{path} holds none of u.data, ratings.csv, ratings.dat")
        path = found[0]
    return _split_by(load_ratings(path), split or "random", test_fraction, seed)


# --------------------------------------------------------------------------------------
# Splits
# --------------------------------------------------------------------------------------


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
    test_fraction = _check_fraction(test_fraction)
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
    test_fraction = _check_fraction(test_fraction)
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


# --------------------------------------------------------------------------------------
# Synthetic data
# --------------------------------------------------------------------------------------

_DRAW_CHUNK = 1 << 21
_RATING_CHUNK = 1 << 18
_MAX_WEIGHTED_ROUNDS = 64
_STALL_SHARE = 0.125
_DENSE_FACTOR = 4
_USER_ACTIVITY_SIGMA = 1.0
_FIRST_TIMESTAMP = 1_000_000_000
_MAX_TIMESTAMP_GAP = 600


def _zipf_weights(n: int, exponent: float, rng: np.random.Generator) -> np.ndarray:
    """Probabilities proportional to ``rank ** -exponent`` over random popularity ranks."""
    weights = (rng.permutation(n) + 1.0) ** -exponent
    return weights / weights.sum()


def _lognormal_weights(n: int, sigma: float, rng: np.random.Generator) -> np.ndarray:
    """Probabilities drawn from a log-normal law (a long but bounded tail)."""
    weights = rng.lognormal(0.0, sigma, n)
    return weights / weights.sum()


def _sorted_draw(size: int, probabilities: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Draw ``size`` i.i.d. indices with the given probabilities, returned sorted (int64)."""
    counts = rng.multinomial(size, probabilities)
    return np.repeat(np.arange(probabilities.size, dtype=np.int64), counts)


def _shuffled_draw(size: int, probabilities: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Draw ``size`` i.i.d. indices with the given probabilities, in random order."""
    draws = _sorted_draw(size, probabilities, rng)
    rng.shuffle(draws)
    return draws


def _distinct_novel(candidates: np.ndarray, taken: np.ndarray) -> np.ndarray:
    """Return the distinct candidate keys absent from sorted ``taken``, sorted."""
    candidates = np.sort(candidates)
    distinct = candidates[np.concatenate([[True], candidates[1:] != candidates[:-1]])]
    positions = np.minimum(np.searchsorted(taken, distinct), taken.size - 1)
    return distinct[taken[positions] != distinct]


def _merge_sorted(taken: np.ndarray, new: np.ndarray) -> np.ndarray:
    """Merge sorted new keys into sorted keys (a stable sort merges the two runs)."""
    return np.sort(np.concatenate([taken, new]), kind="stable")


def _fill_densely(
    taken: np.ndarray, total: int, count: int, rng: np.random.Generator
) -> np.ndarray:
    """Add ``count`` keys chosen uniformly among the cells not yet taken."""
    free = np.ones(total, dtype=bool)
    free[taken] = False
    chosen = rng.choice(np.flatnonzero(free), size=count, replace=False)
    return _merge_sorted(taken, np.sort(chosen))


def _draw_pairs(
    n_users: int,
    n_items: int,
    n_ratings: int,
    item_probabilities: np.ndarray,
    rng: np.random.Generator,
) -> np.ndarray:
    """Draw ``n_ratings`` distinct (user, item) keys ``user * n_items + item``, sorted.

    Every user first gets one item; further pairs are drawn in chunks (user by log-normal
    activity, item by popularity, independently), repeated pairs are dropped, and the
    shortfall is drawn again. When a chunk yields more new pairs than needed, a uniformly
    random subset of them is kept. Should weighted draws stall (the popular cells are
    full), the rest is drawn uniformly: by rejection while the matrix is sparse, else
    directly among the free cells.
    """
    total = n_users * n_items
    user_probabilities = _lognormal_weights(n_users, _USER_ACTIVITY_SIGMA, rng)
    first_items = _shuffled_draw(n_users, item_probabilities, rng)
    taken = np.arange(n_users, dtype=np.int64) * n_items + first_items
    weighted_rounds = 0
    while taken.size < n_ratings:
        deficit = n_ratings - taken.size
        if weighted_rounds >= _MAX_WEIGHTED_ROUNDS and total <= _DENSE_FACTOR * n_ratings:
            return _fill_densely(taken, total, deficit, rng)
        size = min(deficit + deficit // 4 + 16, _DRAW_CHUNK)
        if weighted_rounds < _MAX_WEIGHTED_ROUNDS:
            weighted_rounds += 1
            users = _sorted_draw(size, user_probabilities, rng)
            candidates = users * n_items + _shuffled_draw(size, item_probabilities, rng)
        else:
            candidates = rng.integers(0, total, size)
        novel = _distinct_novel(candidates, taken)
        if novel.size < _STALL_SHARE * size:
            weighted_rounds = _MAX_WEIGHTED_ROUNDS
        if novel.size > deficit:
            novel = np.sort(rng.choice(novel, size=deficit, replace=False))
        taken = _merge_sorted(taken, novel)
    return taken


def _low_rank_ratings(
    users: np.ndarray,
    items: np.ndarray,
    user_factors: np.ndarray,
    item_factors: np.ndarray,
    mean: float,
    noise: float,
    scale: RatingScale,
    rng: np.random.Generator,
) -> np.ndarray:
    """Compute ``snap(mean + P_u . Q_i + noise)`` chunk by chunk."""
    ratings = np.empty(users.size, dtype=np.float64)
    for start in range(0, users.size, _RATING_CHUNK):
        stop = min(start + _RATING_CHUNK, users.size)
        affinity = np.einsum(
            "ij,ij->i", user_factors[users[start:stop]], item_factors[items[start:stop]]
        )
        raw = mean + affinity + noise * rng.standard_normal(stop - start)
        ratings[start:stop] = scale.snap(raw)
    return ratings


def _check_count(value: int, label: str, minimum: int) -> int:
    """Validate an integer argument with a lower bound."""
    if isinstance(value, bool):
        raise TypeError(f"{label} must be an integer, got {value!r}")
    value = operator.index(value)
    if value < minimum:
        raise ValueError(f"{label} must be >= {minimum}, got {value}")
    return value


def _check_real(value: float, label: str) -> float:
    """Validate a finite, non-negative real argument."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
        raise TypeError(f"{label} must be a real number, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{label} must be finite and >= 0, got {value}")
    return float(value)


def synthetic_ratings(
    n_users: int,
    n_items: int,
    n_ratings: int,
    *,
    rank: int = 10,
    noise: float = 0.5,
    popularity_exponent: float = 1.0,
    scale: RatingScale = ML100K_SCALE,
    seed: int = 0,
) -> Ratings:
    """Generate low-rank-plus-noise ratings with long-tailed popularity.

    The ratings are ``scale.snap(mean + P_u . Q_i + e)`` with latent factors
    ``P`` (``n_users x rank``) and ``Q`` (``n_items x rank``) drawn i.i.d. normal, scaled so
    that ``P_u . Q_i`` has standard deviation a quarter of the scale's range, ``mean`` 60%
    up the scale and ``e`` normal noise with standard deviation ``noise``. Item ``i`` is
    drawn with probability proportional to ``rank_i ** -popularity_exponent`` (``rank_i``
    a random popularity rank), users with log-normal activity weights; every user has at
    least one rating and no (user, item) pair repeats. Rows come in chronological order:
    the timestamps strictly increase. Memory stays a small multiple of the output; nothing
    of size ``n_users * n_items`` is built unless the matrix is nearly full.

    Args:
        n_users: Number of users (>= 1).
        n_items: Number of items (>= 1).
        n_ratings: Number of ratings, between ``n_users`` and ``n_users * n_items``.
        rank: Number of latent factors (>= 1).
        noise: Standard deviation of the rating noise (>= 0).
        popularity_exponent: Zipf exponent of item popularity (>= 0; 0 is uniform).
        scale: Scale the ratings are snapped to.
        seed: Seed of ``numpy.random.default_rng``; equal seeds give equal data.

    Returns:
        The ratings; user and item ids equal their indices.

    Raises:
        ValueError: If the sizes are impossible or an argument is out of range.
    """
    n_users = _check_count(n_users, "n_users", 1)
    n_items = _check_count(n_items, "n_items", 1)
    n_ratings = _check_count(n_ratings, "n_ratings", 1)
    rank = _check_count(rank, "rank", 1)
    noise = _check_real(noise, "noise")
    popularity_exponent = _check_real(popularity_exponent, "popularity_exponent")
    if not isinstance(scale, RatingScale):
        raise TypeError(f"scale must be a RatingScale, got {type(scale).__name__}")
    if n_ratings < n_users:
        raise ValueError(
            f"every user needs a rating, so n_ratings ({n_ratings}) must be at least "
            f"n_users ({n_users})"
        )
    if n_ratings > n_users * n_items:
        raise ValueError(
            f"{n_ratings} distinct (user, item) pairs do not fit in {n_users} users x "
            f"{n_items} items (at most {n_users * n_items})"
        )
    rng = np.random.default_rng(seed)
    item_probabilities = _zipf_weights(n_items, popularity_exponent, rng)
    keys = _draw_pairs(n_users, n_items, n_ratings, item_probabilities, rng)
    users = (keys // n_items).astype(np.int32)
    items = (keys % n_items).astype(np.int32)
    del keys
    spread = scale.maximum - scale.minimum
    factor_std = ((spread / 4) ** 2 / rank) ** 0.25
    user_factors = rng.normal(0.0, factor_std, (n_users, rank))
    item_factors = rng.normal(0.0, factor_std, (n_items, rank))
    mean = scale.minimum + 0.6 * spread
    ratings = _low_rank_ratings(users, items, user_factors, item_factors, mean, noise, scale, rng)
    chronological = rng.permutation(n_ratings)
    users = users[chronological]
    items = items[chronological]
    ratings = ratings[chronological]
    del chronological
    timestamps = rng.integers(1, _MAX_TIMESTAMP_GAP + 1, n_ratings, dtype=np.int64)
    np.cumsum(timestamps, out=timestamps)
    timestamps += _FIRST_TIMESTAMP
    return Ratings(
        users=users,
        items=items,
        ratings=ratings,
        timestamps=timestamps,
        n_users=n_users,
        n_items=n_items,
        scale=scale,
        user_ids=np.arange(n_users, dtype=np.int64),
        item_ids=np.arange(n_items, dtype=np.int64),
        name=f"synthetic-{n_users}x{n_items}-{n_ratings}-seed{seed}",
    )
