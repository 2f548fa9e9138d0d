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
from decimal import Decimal
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
    is_number,
)

__all__ = ["RawRatings", "load_ratings", "read_ratings_file", "reindex"]

_INT64_MIN = int(np.iinfo(np.int64).min)
_INT64_MAX = int(np.iinfo(np.int64).max)
_INTEGER_FIELDS = (0, 1, 3)  # user, item, timestamp (positions in COLUMN_NAMES)


class RawRatings(NamedTuple):
    """Ratings as read from a file, before re-indexing.

    Attributes:
        users: int64 original user ids, one per rating, in file order, read exactly.
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


class _Columns(NamedTuple):
    """The parsed fields of every data line; ids and timestamps are exact integers.

    Attributes:
        users: int64 user ids.
        items: int64 item ids.
        ratings: float64 ratings (not yet checked).
        timestamps: int64 timestamps, or ``None`` when the layout has none.
    """

    users: np.ndarray
    items: np.ndarray
    ratings: np.ndarray
    timestamps: np.ndarray | None


def _parse_fast(body: Body) -> _Columns | None:
    """Parse all data lines with numpy; ``None`` when numpy rejects the text.

    Ids and timestamps are parsed as int64 (never through float64, which holds integers
    exactly only up to 2^53), so a file whose ids are spelt otherwise (``1.0``, ``1e3``) or
    overflow int64 goes to :func:`_parse_slowly`.
    """
    layout = body.layout
    text, delimiter = body.text, layout.delimiter
    if delimiter == "::":
        if "\t" in text:
            return None
        text, delimiter = text.replace("::", "\t"), "\t"
    integer_columns = {layout.columns[which] for which in _INTEGER_FIELDS} - {None}
    dtype = np.dtype(
        [
            (f"f{column}", np.int64 if column in integer_columns else np.float64)
            for column in range(layout.n_fields)
        ]
    )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            table = np.loadtxt(
                io.StringIO(text), delimiter=delimiter, dtype=dtype, ndmin=1, comments=None
            )
    except ValueError:
        return None

    def field(which: int) -> np.ndarray | None:
        column = layout.columns[which]
        return None if column is None else np.ascontiguousarray(table[f"f{column}"])

    return _Columns(field(0), field(1), field(2), field(3))


def _exact_int64(token: str) -> int:
    """Return the integer that a numeric token spells, exactly.

    Integral spellings such as ``"7"``, ``"7.0"`` or ``"7e3"`` are read as decimals, never
    through float64, so ``"9007199254740993"`` stays itself and ``"1.0000000000000001"`` is
    no integer.

    Raises:
        ValueError: Saying why the token is no int64: ``"is not an integer"`` or ``"is outside
            the int64 range"``.
    """
    try:
        value = int(token)
    except ValueError:
        try:
            number = Decimal(token)
        except ArithmeticError:
            raise ValueError("is not an integer") from None
        if not number.is_finite() or number != number.to_integral_value():
            raise ValueError("is not an integer") from None
        # Compared as a decimal first: int() of a token like "1e999999" would build a huge int.
        if not _INT64_MIN <= number <= _INT64_MAX:
            raise ValueError("is outside the int64 range") from None
        value = int(number)
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise ValueError("is outside the int64 range")
    return value


def _integer_column(path: Path, tokens: list[str], lines: list[int], which: int) -> np.ndarray:
    """Read a column of id or timestamp tokens as exact int64, naming the first bad one."""
    values = np.empty(len(tokens), dtype=np.int64)
    for row, token in enumerate(tokens):
        try:
            values[row] = _exact_int64(token)
        except ValueError as why:
            raise DataFormatError(
                path, lines[row], f"{COLUMN_NAMES[which]} {token!r} {why}"
            ) from None
    return values


def _parse_slowly(body: Body) -> _Columns:
    """Parse the data lines one by one, raising on the first malformed line.

    Every line is first checked for its number of fields and for numeric fields, in file
    order; then the ids (users, then items) and the timestamps are read exactly.
    """
    layout = body.layout
    used = [which for which, column in enumerate(layout.columns) if column is not None]
    tokens: dict[int, list[str]] = {which: [] for which in used}
    lines: list[int] = []
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
        for which in used:
            token = fields[layout.columns[which]].strip()
            if not is_number(token):
                raise DataFormatError(
                    body.path, line_number, f"non-numeric {COLUMN_NAMES[which]} field {token!r}"
                )
            tokens[which].append(token)
        lines.append(line_number)

    def integers(which: int) -> np.ndarray | None:
        if which not in tokens:
            return None
        return _integer_column(body.path, tokens[which], lines, which)

    users, items, timestamps = integers(0), integers(1), integers(3)
    ratings = np.array([float(token) for token in tokens[2]], dtype=np.float64)
    return _Columns(users, items, ratings, timestamps)


def _check_finite(body: Body, ratings: np.ndarray) -> None:
    """Raise for the first NaN or infinite rating, before any scale is inferred or applied."""
    non_finite = ~np.isfinite(ratings)
    if non_finite.any():
        row = int(np.argmax(non_finite))
        raise body.error(row, f"non-finite rating {body.field_text(row, 2)!r}")


def _infer_scale(body: Body, ratings: np.ndarray) -> RatingScale:
    """Infer a scale: data minimum to maximum, in half steps if any rating is a half.

    The ratings are finite (see :func:`_check_finite`) and there is at least one.
    """
    doubled = ratings * 2
    off_half_grid = doubled != np.rint(doubled)
    if off_half_grid.any():
        row = int(np.argmax(off_half_grid))
        token = body.field_text(row, 2)
        raise body.error(
            row,
            f"rating {token} is neither a whole nor a half number, so no scale can be "
            "inferred; pass scale=",
        )
    low, high = float(ratings.min()), float(ratings.max())
    if low == high:
        raise DataFormatError(
            body.path, None, f"every rating is {low:g}, so no scale can be inferred; pass scale="
        )
    step = 1.0 if np.all(ratings == np.rint(ratings)) else 0.5
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
            missing or named twice, a line with too few or too many fields, a non-numeric
            field, an id or timestamp that is no integer or lies outside the int64 range,
            a non-finite (NaN or infinite) rating, a rating off the scale, or a repeated
            (user, item) pair. The error names the file, the line and that cause.

    Ids and timestamps are read exactly (as decimal integers, never through float64), so
    distinct ids stay distinct across the whole int64 range.
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
    columns = _parse_fast(body)
    if columns is None:
        columns = _parse_slowly(body)
    _check_finite(body, columns.ratings)
    if scale is None:
        scale = body.layout.default_scale or _infer_scale(body, columns.ratings)
    _check_on_scale(body, columns.ratings, scale)
    _check_unique_pairs(body, columns.users, columns.items)
    return RawRatings(columns.users, columns.items, columns.ratings, columns.timestamps, scale, fmt)


def _int64_ids(values: np.ndarray, label: str) -> np.ndarray:
    """Return original ids as int64, exactly, or raise naming why they cannot be."""
    array = np.asarray(values)
    if array.size == 0:
        return array.astype(np.int64).reshape(-1)
    if array.dtype == object and all(
        isinstance(value, int) and not isinstance(value, bool) for value in array.flat
    ):
        # numpy keeps Python ints as objects only when no int64 or uint64 holds them all.
        raise ValueError(f"{label} holds an id outside the int64 range")
    if not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"{label} must hold integer ids, got dtype {array.dtype}")
    if array.dtype == np.uint64 and array.max() > np.iinfo(np.int64).max:
        raise ValueError(f"{label} holds the id {array.max()}, outside the int64 range")
    return array.astype(np.int64, copy=False)


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

    Raises:
        TypeError: If the ids are not integers (float64 cannot hold every int64 id, so
            float ids are refused rather than rounded or truncated).
        ValueError: If an id lies outside the int64 range.
    """
    user_ids, users = np.unique(_int64_ids(raw_users, "raw_users"), return_inverse=True)
    item_ids, items = np.unique(_int64_ids(raw_items, "raw_items"), return_inverse=True)
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
