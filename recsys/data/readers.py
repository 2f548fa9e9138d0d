"""Reading rating files: parse, check and re-index.

:func:`read_ratings_file` reads any of the layouts of :mod:`securefed.recsys.data.formats` into
:class:`RawRatings` (original ids, file order); :func:`load_ratings` re-indexes them into
:class:`~securefed.recsys.data.containers.Ratings`.

Parsing is done in one vectorised pass with :func:`numpy.loadtxt`; only when that fails is the
file scanned line by line to find and name the offending line in a :class:`DataFormatError`.
"""

from __future__ import annotations

import io
import os
import warnings
from pathlib import Path
from typing import NamedTuple

import numpy as np

from securefed.recsys.data.containers import Ratings, RatingScale, first_duplicate, pair_keys
from securefed.recsys.data.errors import DataFormatError
from securefed.recsys.data.formats import (
    COLUMN_NAMES,
    FORMATS,
    Body,
    body_and_layout,
    decode_utf8,
    detect_format,
    first_content_line,
)

__all__ = ["RawRatings", "load_ratings", "read_ratings_file", "reindex"]

_MAX_EXACT_FLOAT_INT = 2**53


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


def _parse_fast(body: Body) -> np.ndarray | None:
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


def _parse_slowly(body: Body) -> np.ndarray:
    """Parse the data lines one by one, raising on the first malformed line."""
    layout = body.layout
    names = [
        name
        for name, column in zip(COLUMN_NAMES, layout.columns, strict=True)
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


def _whole_numbers(body: Body, values: np.ndarray, which: int) -> np.ndarray:
    """Convert a float column of ids or timestamps to int64, naming a non-integral entry."""
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(values) | (values != np.rint(values))
        bad |= np.abs(values) > _MAX_EXACT_FLOAT_INT
    if bad.any():
        row = int(np.argmax(bad))
        token = body.field_text(row, which)
        raise body.error(row, f"{COLUMN_NAMES[which]} {token!r} is not an integer")
    return values.astype(np.int64)


def _infer_scale(body: Body, ratings: np.ndarray) -> RatingScale:
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


def _check_on_scale(body: Body, ratings: np.ndarray, scale: RatingScale) -> None:
    """Raise for the first rating off the scale (NaN and infinities included)."""
    off_scale = ~scale.contains(ratings)
    if off_scale.any():
        row = int(np.argmax(off_scale))
        token = body.field_text(row, 2)
        raise body.error(row, f"rating {token} is off the scale {scale}")


def _check_unique_pairs(body: Body, users: np.ndarray, items: np.ndarray) -> None:
    """Raise for the first (user, item) pair that repeats an earlier line."""
    user_index = np.unique(users, return_inverse=True)[1]
    item_ids, item_index = np.unique(items, return_inverse=True)
    duplicate = first_duplicate(pair_keys(user_index, item_index, item_ids.size))
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
    text = decode_utf8(path, path.read_bytes())
    if not text.strip():
        raise DataFormatError(path, None, "empty file")
    if fmt == "auto":
        fmt = detect_format(path, first_content_line(text)[1])
    body = body_and_layout(path, text, fmt)
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
