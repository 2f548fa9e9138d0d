"""Ratings from a pandas DataFrame (Surprise's ``Dataset.load_from_df``, with our checks).

:func:`from_dataframe` takes the user, item, rating and optional timestamp columns of a DataFrame
and applies what the file readers apply (:mod:`securefed.recsys.data.readers`): finite ratings on
a given or inferred scale, a policy for repeated (user, item) pairs, integer or string ids
re-indexed with the mapping kept. An error names the row (its 0-based position, as
``df.iloc``, and its index label) and the cause.

pandas is optional: it is imported only when :func:`from_dataframe` is called, and its absence is
a :class:`ModuleNotFoundError` naming how to install it.
"""

from __future__ import annotations

import numpy as np

from securefed.recsys.data.containers import Ratings, RatingScale
from securefed.recsys.data.errors import DataFormatError
from securefed.recsys.data.readers import (
    DUPLICATE_POLICIES,
    LoadReport,
    _check_finite,
    _check_on_scale,
    _Columns,
    _infer_scale,
    _resolve_duplicates,
    reindex,
)

__all__ = ["from_dataframe"]

_SOURCE = "DataFrame"


class _FrameRows:
    """Where a DataFrame's rows are, for the readers' checks (a :class:`Body` for frames)."""

    def __init__(self, labels: list[object], ratings: list[object]) -> None:
        self.path = _SOURCE
        self._labels = labels
        self._ratings = ratings

    def where(self, row: int) -> str:
        return f"row {row} (index {self._labels[row]!r})"

    def error(self, row: int, cause: str, command_line_cause: str | None = None):
        return DataFormatError(self.path, None, f"{self.where(row)}: {cause}")

    def field_text(self, row: int, which: int) -> str:
        return str(self._ratings[row])


def _pandas():
    try:
        import pandas
    except ModuleNotFoundError as missing:
        if missing.name != "pandas":
            raise
        raise ModuleNotFoundError(
            "from_dataframe needs pandas, which is not installed: pip install pandas "
            "(or pip install 'securefed[pandas]')",
            name="pandas",
        ) from None
    return pandas


def _column(frame, name: str, role: str):
    if name not in frame.columns:
        listed = ", ".join(repr(column) for column in frame.columns)
        raise ValueError(f"unknown {role} column {name!r}: the DataFrame's columns are {listed}")
    return frame[name]


def _ids(pandas, series, role: str, rows: _FrameRows) -> np.ndarray:
    """A column of ids as int64 or as strings, naming the first missing or mixed one."""
    missing = series.isna().to_numpy()
    if missing.any():
        raise rows.error(int(np.argmax(missing)), f"missing {role} id")
    if pandas.api.types.is_bool_dtype(series):
        raise TypeError(f"the {role} column holds booleans, not ids")
    if pandas.api.types.is_integer_dtype(series):
        return series.to_numpy(dtype=np.int64)
    values = series.to_numpy(dtype=object)
    is_text = np.array([isinstance(value, str) for value in values])
    if is_text.all():
        return values.astype(str)
    row = int(np.argmin(is_text)) if is_text.any() else 0
    raise rows.error(
        row,
        f"{role} id {values[row]!r} is neither an integer column's nor a string: ids are "
        "integers or strings (a float column, e.g. one with a missing value, is refused rather "
        "than rounded)",
    )


def _ratings(series, rows: _FrameRows) -> np.ndarray:
    values = series.to_numpy(dtype=object)
    ratings = np.empty(len(values), dtype=np.float64)
    for row, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
            raise rows.error(row, f"non-numeric rating {value!r}")
        ratings[row] = float(value)
    return ratings


def from_dataframe(
    frame,
    *,
    user: str = "user",
    item: str = "item",
    rating: str = "rating",
    timestamp: str | None = None,
    scale: RatingScale | str | None = None,
    duplicates: str = "error",
    name: str = "dataframe",
) -> Ratings:
    """Read ratings from the columns of a pandas DataFrame into re-indexed :class:`Ratings`.

    Args:
        frame: the DataFrame (one rating per row, in row order).
        user: the column of user ids: integers, or strings (re-indexed; ``user_ids`` keeps the
            strings).
        item: the column of item ids, likewise.
        rating: the column of ratings (numbers).
        timestamp: the column of integer timestamps, or ``None``.
        scale: the rating scale (a :class:`RatingScale` or ``"MIN:MAX:STEP"``); ``None``:
            inferred from the data (its minimum to its maximum, in half steps if any rating is a
            half), as for a plain csv file.
        duplicates: what to do with a (user, item) pair on several rows, one of
            :data:`~securefed.recsys.data.readers.DUPLICATE_POLICIES`.
        name: the label of the result.

    Returns:
        The ratings in row order; indices follow the sorted ids; ``load_report`` says what the
        read found (``fmt="dataframe"``).

    Raises:
        ModuleNotFoundError: pandas is not installed.
        TypeError: ``frame`` is no DataFrame, or an id column holds booleans.
        ValueError: a column name the DataFrame lacks (listing its columns), an unknown policy.
        DataFormatError: naming the row: a missing id, an id neither integer nor string, a
            non-numeric or non-finite rating, a rating off the scale, a repeated pair under
            ``duplicates="error"``, a timestamp that is no integer.
    """
    pandas = _pandas()
    if not isinstance(frame, pandas.DataFrame):
        raise TypeError(f"from_dataframe takes a pandas DataFrame, got {type(frame).__name__}")
    if duplicates not in DUPLICATE_POLICIES:
        raise ValueError(
            f"unknown duplicates policy {duplicates!r}; expected one of "
            f"{', '.join(DUPLICATE_POLICIES)}"
        )
    if isinstance(scale, str):
        scale = RatingScale.parse(scale)
    series = {
        role: _column(frame, column, role)
        for role, column in (("user", user), ("item", item), ("rating", rating))
    }
    if timestamp is not None:
        series["timestamp"] = _column(frame, timestamp, "timestamp")
    if len(frame) == 0:
        raise DataFormatError(_SOURCE, None, "no ratings: the DataFrame has no rows")
    rows = _FrameRows(list(frame.index), series["rating"].to_numpy(dtype=object).tolist())
    users = _ids(pandas, series["user"], "user", rows)
    items = _ids(pandas, series["item"], "item", rows)
    ratings = _ratings(series["rating"], rows)
    stamps = None
    if timestamp is not None:
        if not pandas.api.types.is_integer_dtype(series["timestamp"]):
            raise TypeError(
                f"the timestamp column {timestamp!r} must hold integers, got dtype "
                f"{series['timestamp'].dtype}"
            )
        stamps = series["timestamp"].to_numpy(dtype=np.int64)
    _check_finite(rows, ratings)
    if scale is not None:
        scale_source = "given"
    else:
        scale, scale_source = _infer_scale(rows, ratings), "inferred"
    _check_on_scale(rows, ratings, scale, scale_source, False)
    resolved = _resolve_duplicates(rows, _Columns(users, items, ratings, stamps), scale, duplicates)
    keep = resolved.keep
    user_index, item_index, user_ids, item_ids = reindex(users[keep], items[keep])
    report = LoadReport(
        path=_SOURCE,
        fmt="dataframe",
        header=True,
        data_lines=len(ratings),
        ratings=len(keep),
        scale=scale,
        scale_source=scale_source,
        duplicates=duplicates,
        repeated_pairs=resolved.repeated_pairs,
        exact_repeats=resolved.exact_repeats,
        rounded_means=resolved.rounded_means,
    )
    return Ratings(
        users=user_index,
        items=item_index,
        ratings=resolved.ratings[keep],
        timestamps=None if resolved.timestamps is None else resolved.timestamps[keep],
        n_users=user_ids.size,
        n_items=item_ids.size,
        scale=scale,
        user_ids=user_ids,
        item_ids=item_ids,
        name=name,
        load_report=report,
    )
