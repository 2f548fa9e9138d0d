"""Reading rating files: parse, check and re-index.

:func:`read_ratings_file` reads any of the layouts of :mod:`securefed.recsys.data.formats` into
:class:`RawRatings` (original ids, file order); :func:`load_ratings` re-indexes them into
:class:`~securefed.recsys.data.containers.Ratings`.

Parsing is done in one vectorised pass with :func:`numpy.loadtxt`; only when that fails is the
file scanned line by line to find and name the offending line in a :class:`DataFormatError`.

Repeated (user, item) pairs follow a stated policy (:data:`DUPLICATE_POLICIES`; the default
``"error"`` names both lines), and every read ends with a :class:`LoadReport` (lines read, ratings
kept, repeated pairs, exact repeated lines, where the scale came from).
"""

from __future__ import annotations

import io
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import NamedTuple

import numpy as np

from securefed.recsys.data.containers import Ratings, RatingScale, first_duplicate, pair_keys
from securefed.recsys.data.errors import DataFormatError
from securefed.recsys.data.formats import (
    COLUMN_NAMES,
    DELIMITED,
    FORMATS,
    Body,
    body_and_layout,
    check_columns,
    check_separator,
    decode_utf8,
    delimited_body,
    detect_format,
    first_content_line,
    is_movielens100k_name,
    is_number,
)

__all__ = [
    "DUPLICATE_POLICIES",
    "ID_KINDS",
    "LoadReport",
    "RawRatings",
    "load_ratings",
    "read_ratings_file",
    "reindex",
]

ID_KINDS = ("int", "string")
"""Values of the readers' ``ids`` argument: integer ids (read exactly) or any text."""

DUPLICATE_POLICIES = ("error", "first", "last", "mean")
"""What to do with a (user, item) pair given on more than one line: refuse the file (naming both
lines), keep the first line, keep the last line, or keep one rating, the mean of the lines'
ratings rounded to the nearest level of the scale (halves upwards), at the first line's place with
the latest timestamp."""


@dataclass(frozen=True)
class LoadReport:
    """What reading one ratings file found.

    Attributes:
        path: The file.
        fmt: The format it was read as.
        header: Whether its first non-blank line was a header.
        data_lines: Non-blank data lines read.
        ratings: Ratings kept (``data_lines`` less the repeats the policy removed).
        scale: The scale the ratings were checked against.
        scale_source: ``"given"`` (``scale=``), ``"format"`` (the format's own) or ``"inferred"``.
        duplicates: The policy applied to repeated pairs (:data:`DUPLICATE_POLICIES`).
        repeated_pairs: Lines whose (user, item) pair an earlier line already gave.
        exact_repeats: Of those, lines equal to an earlier line in every field (same user, item,
            rating and timestamp, compared as numbers).
        rounded_means: Pairs whose mean rating lay between two levels and was rounded
            (``duplicates="mean"`` only).
    """

    path: str
    fmt: str
    header: bool
    data_lines: int
    ratings: int
    scale: RatingScale
    scale_source: str
    duplicates: str = "error"
    repeated_pairs: int = 0
    exact_repeats: int = 0
    rounded_means: int = 0

    def summary(self) -> str:
        """One line for people, e.g. for the command line's standard error."""
        text = (
            f"{self.path}: {self.fmt}{' with header' if self.header else ''}, "
            f"{self.data_lines} lines, {self.ratings} ratings, scale {self.scale} "
            f"({self.scale_source})"
        )
        if self.repeated_pairs:
            text += (
                f", {self.repeated_pairs} repeated (user, item) pairs resolved by "
                f"duplicates={self.duplicates!r} ({self.exact_repeats} exact repeated lines"
            )
            if self.duplicates == "mean":
                text += f", {self.rounded_means} means rounded to the scale"
            text += ")"
        return text


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
        report: What the read found (:class:`LoadReport`).
    """

    users: np.ndarray
    items: np.ndarray
    ratings: np.ndarray
    timestamps: np.ndarray | None
    scale: RatingScale
    fmt: str
    report: LoadReport | None = None


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
    if delimiter is not None and len(delimiter) > 1:  # numpy splits at one character
        if "\t" in text:
            return None
        text, delimiter = text.replace(delimiter, "\t"), "\t"
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


def _parse_slowly(body: Body, text_ids: bool = False) -> _Columns:
    """Parse the data lines one by one, raising on the first malformed line.

    Every line is first checked for its number of fields and for numeric fields, in file
    order; then the ids (users, then items) and the timestamps are read exactly. With
    ``text_ids`` the user and item fields are kept as their stripped text (any non-empty
    string).
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
            if text_ids and which in (0, 1):
                if not token:
                    raise DataFormatError(
                        body.path, line_number, f"empty {COLUMN_NAMES[which]} field"
                    )
            elif not is_number(token):
                cause = f"non-numeric {COLUMN_NAMES[which]} field {token!r}"
                if which in (0, 1):
                    raise DataFormatError(
                        body.path,
                        line_number,
                        cause,
                        f"{cause} (ids that are not integers: pass --ids string)",
                    )
                raise DataFormatError(body.path, line_number, cause)
            tokens[which].append(token)
        lines.append(line_number)

    def integers(which: int) -> np.ndarray | None:
        if which not in tokens:
            return None
        if text_ids and which in (0, 1):
            return np.array(tokens[which], dtype=str)
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


def _pass_scale(example: str) -> tuple[str, str]:
    """The fix "state the scale", as the Python API and as the command line spell it."""
    return (
        f"pass scale='{example}' (MIN:MAX:STEP, or a RatingScale)",
        f"pass --scale MIN:MAX:STEP (e.g. --scale {example})",
    )


def _infer_scale(body: Body, ratings: np.ndarray) -> RatingScale:
    """Infer a scale: data minimum to maximum, in half steps if any rating is a half.

    The ratings are finite (see :func:`_check_finite`) and there is at least one.
    """
    doubled = ratings * 2
    off_half_grid = doubled != np.rint(doubled)
    if off_half_grid.any():
        row = int(np.argmax(off_half_grid))
        token = body.field_text(row, 2)
        cause = f"rating {token} is neither a whole nor a half number, so no scale can be inferred"
        python, command_line = _pass_scale("0:1:0.25")
        raise body.error(row, f"{cause}; {python}", f"{cause}; {command_line}")
    low, high = float(ratings.min()), float(ratings.max())
    if low == high:
        cause = f"every rating is {low:g}, so no scale can be inferred"
        python, command_line = _pass_scale(f"{min(low, 1):g}:{max(high, 5):g}:1")
        raise DataFormatError(body.path, None, f"{cause}; {python}", f"{cause}; {command_line}")
    step = 1.0 if np.all(ratings == np.rint(ratings)) else 0.5
    return RatingScale(low, high, step)


def _check_on_scale(
    body: Body, ratings: np.ndarray, scale: RatingScale, scale_source: str, detected: bool
) -> None:
    """Raise for the first rating off the scale (NaN and infinities included), saying whether
    it lies outside the range or between two levels.

    When the scale is the format's own (``scale_source == "format"``) the error says so and how
    to state another; when the format was guessed from the file's content (``detected``), it
    also says what it was taken for.
    """
    off_scale = ~scale.contains(ratings)
    if not off_scale.any():
        return
    row = int(np.argmax(off_scale))
    token = body.field_text(row, 2)
    value = ratings[row]
    if value < scale.minimum or value > scale.maximum:
        where = "below its minimum" if value < scale.minimum else "above its maximum"
    else:
        where = f"between two of its levels (step {scale.step:g})"
    cause = f"rating {token} is off the scale {scale}: {where}"
    if scale_source != "format":
        raise body.error(row, cause)
    low = min(scale.minimum, float(np.min(ratings)))
    high = max(scale.maximum, float(np.max(ratings)))
    doubled = ratings * 2
    halves = bool(np.all(doubled == np.rint(doubled)) and np.any(ratings != np.rint(ratings)))
    step = 0.5 if halves else scale.step
    fmt = body.layout.fmt
    cause = f"{cause}; {scale} is the {fmt} format's scale"
    if detected:
        cause += f", and the file was taken for {fmt} from its first line"
    cause += "; if the file's scale differs"
    python, command_line = _pass_scale(f"{low:g}:{high:g}:{step:g}")
    raise body.error(row, f"{cause}, {python}", f"{cause}, {command_line}")


class _Resolved(NamedTuple):
    """The rows a duplicates policy keeps, with their ratings and timestamps."""

    keep: np.ndarray
    ratings: np.ndarray
    timestamps: np.ndarray | None
    repeated_pairs: int
    exact_repeats: int
    rounded_means: int


def _resolve_duplicates(
    body: Body, columns: _Columns, scale: RatingScale, policy: str
) -> _Resolved:
    """Apply a :data:`DUPLICATE_POLICIES` policy to repeated (user, item) pairs.

    Raises:
        DataFormatError: under ``"error"``, for the first pair that repeats an earlier line,
            naming both lines.
    """
    users, items, ratings, timestamps = columns
    n = len(ratings)
    user_index = np.unique(users, return_inverse=True)[1].reshape(-1)
    item_ids, item_index = np.unique(items, return_inverse=True)
    keys = pair_keys(user_index, item_index.reshape(-1), item_ids.size)
    if policy == "error":
        duplicate = first_duplicate(keys)
        if duplicate is not None:
            first, second = duplicate
            raise body.error(
                second,
                f"duplicate rating of item {items[second]} by user {users[second]} "
                f"(first given on {body.where(first)}); pass duplicates='first', 'last' or "
                "'mean' (--duplicates) to resolve repeated pairs",
            )
        return _Resolved(np.arange(n), ratings, timestamps, 0, 0, 0)
    order = np.argsort(keys, kind="stable")  # within a pair: file order
    sorted_keys = keys[order]
    starts = np.flatnonzero(np.concatenate([[True], sorted_keys[1:] != sorted_keys[:-1]]))
    ends = np.concatenate([starts[1:], [n]])
    repeated_pairs = n - len(starts)
    stamps = np.zeros(n, np.int64) if timestamps is None else timestamps
    whole_lines = np.unique(np.column_stack([keys, ratings.view(np.int64), stamps]), axis=0)
    exact_repeats = n - len(whole_lines)
    kept_ratings, kept_stamps, rounded = ratings, timestamps, 0
    if policy == "first":
        keep = order[starts]
    elif policy == "last":
        keep = order[ends - 1]
    else:  # mean, at the first line's place, with the latest timestamp
        keep = order[starts]
        means = np.add.reduceat(ratings[order], starts) / (ends - starts)
        positions = (means - scale.minimum) / scale.step
        snapped = scale.minimum + np.floor(positions + 0.5) * scale.step
        rounded = int(np.sum(~scale.contains(means)))
        kept_ratings = ratings.copy()
        kept_ratings[keep] = scale.snap(snapped)
        if timestamps is not None:
            kept_stamps = timestamps.copy()
            kept_stamps[keep] = np.maximum.reduceat(timestamps[order], starts)
    keep = np.sort(keep)
    return _Resolved(keep, kept_ratings, kept_stamps, repeated_pairs, exact_repeats, rounded)


def read_ratings_file(
    path: str | os.PathLike,
    *,
    fmt: str = "auto",
    scale: RatingScale | None = None,
    duplicates: str = "error",
    sep: str | None = None,
    columns: Sequence[str | int] | None = None,
    ids: str = "int",
) -> RawRatings:
    """Read and check one ratings file, keeping the original ids.

    Args:
        path: The file.
        fmt: One of :data:`FORMATS`; ``"auto"`` decides from the file name
            (``*.dat``, ``u.data``, ``uN.base``/``uN.test``) and then the first line
            (``::``, tabs, an ``userId,movieId`` header, else plain csv).
        scale: Rating scale to check against. ``None`` means the format's own scale
            (1..5 step 1 for ``movielens100k`` and ``dat``, 0.5..5 step 0.5 for
            ``ml-latest``) or, for plain ``csv`` and ``whitespace``, one inferred from the
            data (its minimum to its maximum, step 0.5 if any rating is a half, else 1).
        duplicates: What to do with a (user, item) pair given on several lines, one of
            :data:`DUPLICATE_POLICIES` (default ``"error"``).
        sep: The field separator (``","``, ``";"``, ``"\t"``, ``"|"``, ``"::"``, ...;
            :data:`~securefed.recsys.data.formats.WHITESPACE` ``r"\\s+"`` for runs of spaces
            or tabs). With ``sep`` or ``columns`` the file is read as the ``"delimited"``
            format: a header is a first line without a number; ``fmt`` must stay ``"auto"``.
        columns: User, item, rating[, timestamp], either as header names (matched
            case-insensitively; the file must have a header) or as 0-based field positions;
            other fields are ignored. Default: a header naming ``user,item,rating``
            [``,timestamp``] (or ml-latest's), else the first 3 or 4 fields.
        ids: ``"int"`` (default: ids are integers, read exactly) or ``"string"``: user and item
            ids are any text (e.g. ``alice``, ``tt0111161``), kept as strings.

    Returns:
        The ratings in file order, as :class:`RawRatings`.

    Raises:
        FileNotFoundError: If the file does not exist.
        ValueError: If ``fmt`` is unknown.
        DataFormatError: If the file is malformed: not UTF-8, empty, a header column
            missing or named twice, a line with too few or too many fields, a non-numeric
            field, an id or timestamp that is no integer or lies outside the int64 range,
            a non-finite (NaN or infinite) rating, a rating off the scale (outside its range
            or between its levels), a repeated (user, item) pair under
            ``duplicates="error"``, or a first line that no format reads ("format not
            recognised", listing the formats). The error names the file, the line and that
            cause.

    Ids and timestamps are read exactly (as decimal integers, never through float64), so
    distinct ids stay distinct across the whole int64 range.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    if ids not in ID_KINDS:
        raise ValueError(f"ids must be one of {', '.join(ID_KINDS)}, got {ids!r}")
    delimited = sep is not None or columns is not None
    if delimited and fmt != "auto":
        raise ValueError(
            f"sep and columns describe the layout themselves: leave fmt='auto' (got {fmt!r})"
        )
    delimiter = "," if sep is None else check_separator(sep)
    if columns is not None:
        columns = check_columns(tuple(columns))
    if duplicates not in DUPLICATE_POLICIES:
        raise ValueError(
            f"unknown duplicates policy {duplicates!r}; expected one of "
            f"{', '.join(DUPLICATE_POLICIES)}"
        )
    if scale is not None and not isinstance(scale, RatingScale):
        raise TypeError(f"scale must be a RatingScale or None, got {type(scale).__name__}")
    path = Path(path)
    text = decode_utf8(path, path.read_bytes())
    if not text.strip():
        raise DataFormatError(path, None, "empty file")
    detected = fmt == "auto" and not path.name.lower().endswith(".dat")
    if delimited:
        fmt = DELIMITED
        body = delimited_body(path, text, delimiter, columns)
    else:
        if fmt == "auto":
            fmt = detect_format(path, first_content_line(text)[1])
            detected = detected and not is_movielens100k_name(path)
        body = body_and_layout(path, text, fmt)
    if not body.text.strip():
        raise DataFormatError(path, None, "no ratings: the file has a header but no data lines")
    text_ids = ids == "string"
    columns = None if text_ids else _parse_fast(body)
    if columns is None:
        columns = _parse_slowly(body, text_ids)
    _check_finite(body, columns.ratings)
    if scale is not None:
        scale_source = "given"
    elif body.layout.default_scale is not None:
        scale, scale_source = body.layout.default_scale, "format"
    else:
        scale, scale_source = _infer_scale(body, columns.ratings), "inferred"
    _check_on_scale(body, columns.ratings, scale, scale_source, detected)
    resolved = _resolve_duplicates(body, columns, scale, duplicates)
    keep = resolved.keep
    report = LoadReport(
        path=os.fspath(path),
        fmt=fmt,
        header=body.first_line > 1,
        data_lines=len(columns.ratings),
        ratings=len(keep),
        scale=scale,
        scale_source=scale_source,
        duplicates=duplicates,
        repeated_pairs=resolved.repeated_pairs,
        exact_repeats=resolved.exact_repeats,
        rounded_means=resolved.rounded_means,
    )
    return RawRatings(
        columns.users[keep],
        columns.items[keep],
        resolved.ratings[keep],
        None if resolved.timestamps is None else resolved.timestamps[keep],
        scale,
        fmt,
        report,
    )


def _int64_ids(values: np.ndarray, label: str) -> np.ndarray:
    """Return original ids as int64, exactly (or as strings for text ids), or raise naming why
    they cannot be."""
    array = np.asarray(values)
    if array.size == 0:
        return array.astype(np.int64).reshape(-1)
    if array.dtype.kind == "U":
        return array.reshape(-1)
    if array.dtype == object and all(isinstance(value, str) for value in array.flat):
        return array.astype(str).reshape(-1)
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
        original id of each index (``user_ids[users] == raw_users``); string ids (text ids,
        ``ids="string"``) keep their strings, sorted.

    Raises:
        TypeError: If the ids are neither integers nor strings (float64 cannot hold every
            int64 id, so float ids are refused rather than rounded or truncated).
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
    duplicates: str = "error",
    sep: str | None = None,
    columns: Sequence[str | int] | None = None,
    ids: str = "int",
) -> Ratings:
    """Read one ratings file into re-indexed :class:`Ratings`.

    Args:
        path: The file.
        fmt: File format, see :func:`read_ratings_file`.
        scale: Rating scale, see :func:`read_ratings_file`.
        name: Label of the result; defaults to the file stem (or its folder's name for
            ``ratings.*`` and ``u.data``).
        duplicates: Policy for repeated (user, item) pairs, see :func:`read_ratings_file`.
        sep: Field separator, see :func:`read_ratings_file`.
        columns: Which fields hold user, item, rating[, timestamp], see
            :func:`read_ratings_file`.
        ids: ``"int"`` or ``"string"`` ids, see :func:`read_ratings_file`.

    Returns:
        The ratings in file order; indices follow ascending original ids; ``load_report``
        says what the read found.

    Raises:
        FileNotFoundError: If the file does not exist.
        DataFormatError: If the file is malformed.
    """
    path = Path(path)
    raw = read_ratings_file(
        path, fmt=fmt, scale=scale, duplicates=duplicates, sep=sep, columns=columns, ids=ids
    )
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
        load_report=raw.report,
    )
