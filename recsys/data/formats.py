"""On-disk layouts of rating files and how a file's layout is recognised.

Five layouts are understood (:data:`FORMATS`, besides ``"auto"``):

* ``movielens100k``: MovieLens 100K ``u.data`` / ``uN.base`` / ``uN.test``, whitespace (tab)
  separated ``user item rating timestamp`` without a header, ratings 1..5.
* ``dat``: MovieLens 1M/10M style ``user::item::rating::timestamp`` without a header.
* ``ml-latest``: comma separated with the header ``userId,movieId,rating,timestamp``, half-star
  ratings 0.5..5.
* ``csv``: plain comma separated, either with a header naming ``user,item,rating`` and
  optionally ``timestamp``, or without a header and with 3 or 4 columns.
* ``whitespace``: fields separated by any run of spaces or tabs, with or without a header naming
  ``user item rating [timestamp]``, 3 or 4 columns.

A first line that is no header of these layouts but holds numbers (``1;2;3``) is a data line of
an unknown layout: the error says that the format was not recognised and lists the layouts
(:data:`FORMAT_DESCRIPTIONS`).
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass
from pathlib import Path

from securefed.recsys.data.containers import ML100K_SCALE, ML_LATEST_SCALE, RatingScale
from securefed.recsys.data.errors import DataFormatError

__all__ = ["DELIMITED", "FORMATS", "FORMAT_DESCRIPTIONS", "WHITESPACE"]

FORMATS = ("auto", "movielens100k", "dat", "ml-latest", "csv", "whitespace")
"""Values accepted by the ``fmt`` argument of the readers."""

FORMAT_DESCRIPTIONS = {
    "movielens100k": "user item rating timestamp, tab separated, no header (u.data, uN.base)",
    "dat": "user::item::rating::timestamp, no header (ml-1m, ml-10m)",
    "ml-latest": "header userId,movieId,rating[,timestamp], comma separated",
    "csv": "user,item,rating[,timestamp], comma separated, header optional",
    "whitespace": "user item rating [timestamp], runs of spaces or tabs, header optional",
}
"""What each layout looks like, for the error that names an unrecognised file."""

COLUMN_NAMES = ("user", "item", "rating", "timestamp")
"""The fields of one rating, in the order of :attr:`Layout.columns`."""


@dataclass(frozen=True)
class Layout:
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
class Body:
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
    layout: Layout

    def where(self, row: int) -> str:
        """``"line N"``: where data row ``row`` is, for messages."""
        return f"line {self.locate(row)[0]}"

    def locate(self, row: int) -> tuple[int, str]:
        """Return the file line number and text of data row ``row`` (blank lines skipped)."""
        seen = -1
        for offset, line in enumerate(self.text.split("\n")):
            if line.strip():
                seen += 1
                if seen == row:
                    return self.first_line + offset, line
        raise IndexError(f"row {row} is beyond the data")

    def error(self, row: int, cause: str, command_line_cause: str | None = None) -> DataFormatError:
        """Build the error for data row ``row`` (``command_line_cause``: see DataFormatError)."""
        line_number, _ = self.locate(row)
        return DataFormatError(self.path, line_number, cause, command_line_cause)

    def field_text(self, row: int, which: int) -> str:
        """Return the stripped text of field ``which`` (0 user .. 3 timestamp) of a row."""
        _, line = self.locate(row)
        return self.layout.split(line)[self.layout.columns[which]].strip()


def decode_utf8(path: Path, data: bytes) -> str:
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


def first_content_line(text: str) -> tuple[int, str, int]:
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


def is_number(text: str) -> bool:
    """Tell whether ``float`` accepts the text (``"inf"`` and ``"nan"`` included)."""
    try:
        float(text)
    except ValueError:
        return False
    return True


_ML100K_NAME = re.compile(r"u(\.data|[0-9a-z]\.(base|test))", re.IGNORECASE)
_ML_LATEST_HEADER = ("userId", "movieId", "rating", "timestamp")
_CSV_HEADER = ("user", "item", "rating", "timestamp")


def is_movielens100k_name(path: Path) -> bool:
    """Tell whether a file's name is one of MovieLens 100K's (``u.data``, ``uN.base``, ...)."""
    return _ML100K_NAME.fullmatch(path.name.lower()) is not None


def detect_format(path: Path, first_line: str) -> str:
    """Guess the format from the file name, then from the first non-blank line.

    ``*.dat`` or ``::``: dat; a MovieLens 100K file name, or a comma-free line of four
    tab-separated fields starting with a number: movielens100k; any other comma-free line of two
    or more whitespace-separated fields: whitespace; a ``userId``/``movieId`` header:
    ml-latest; else csv.
    """
    name = path.name.lower()
    if name.endswith(".dat") or "::" in first_line:
        return "dat"
    if is_movielens100k_name(path):
        return "movielens100k"
    if "," not in first_line:
        words = first_line.split()
        if "\t" in first_line and len(words) == 4 and is_number(words[0]):
            return "movielens100k"
        if len(words) >= 2:
            return "whitespace"
    fields = [field.strip().lower() for field in first_line.split(",")]
    if not is_number(fields[0]) and {"userid", "movieid"} & set(fields):
        return "ml-latest"
    return "csv"


_SEPARATORS = re.compile(r"[\s,;|:]+")


def looks_like_data(line: str) -> bool:
    """Tell whether a line that is no header holds a number between common separators."""
    return any(is_number(token) for token in _SEPARATORS.split(line.strip()) if token)


def unrecognised_format(line: str) -> str:
    """The cause for a data line that no layout reads (it was about to be taken for a header)."""
    listing = "; ".join(f"{fmt}: {text}" for fmt, text in FORMAT_DESCRIPTIONS.items())
    return (
        f"format not recognised: the first line {line.strip()!r} is a data line of none of the "
        f"formats there are ({listing}); convert the file, or pass fmt= if it is one of them"
    )


def _header_layout(
    path: Path,
    line_number: int,
    line: str,
    names: tuple[str, str, str, str],
    fmt: str,
    default_scale: RatingScale | None,
    delimiter: str | None = ",",
) -> Layout:
    """Build the layout of a delimited file from its header line.

    Args:
        path: The file, for errors.
        line_number: Line number of the header.
        line: The header text.
        names: Expected column names for user, item, rating and timestamp (the last is
            optional); matched case-insensitively.
        fmt: Format name.
        default_scale: Scale of the format.
        delimiter: Field separator; ``None``: runs of whitespace.

    Raises:
        DataFormatError: naming a column missing or named twice, or saying that the format
            was not recognised when the line is data rather than a header.
    """
    fields = line.split() if delimiter is None else line.split(delimiter)
    header = [field.strip().lower() for field in fields]
    if delimiter is None:
        expected = " ".join(names[:3]) + f" [{names[3]}], whitespace separated"
    else:
        expected = ",".join(names[:3]) + f"[,{names[3]}], comma separated"
    columns: list[int | None] = []
    for name in names:
        positions = [position for position, field in enumerate(header) if field == name.lower()]
        if len(positions) > 1:
            raise DataFormatError(
                path, line_number, f"header names the column {name!r} {_times(positions)}"
            )
        if positions:
            columns.append(positions[0])
        elif name == names[3]:
            columns.append(None)
        elif looks_like_data(line):
            raise DataFormatError(path, line_number, unrecognised_format(line))
        else:
            raise DataFormatError(
                path,
                line_number,
                f"header lacks the column {name!r} (expected {expected}; found {line.strip()!r})",
            )
    return Layout(fmt, delimiter, len(header), tuple(columns), default_scale)


def _times(positions: list[int]) -> str:
    """Say how often and where a header repeats a name, e.g. ``twice (columns 1 and 4)``."""
    numbers = [str(position + 1) for position in positions]
    how_often = "twice" if len(numbers) == 2 else f"{len(numbers)} times"
    return f"{how_often} (columns {', '.join(numbers[:-1])} and {numbers[-1]})"


def _is_header(line: str, delimiter: str | None = ",") -> bool:
    """Tell whether a delimited line is a header: none of its fields is a number.

    A line with a text field beside numeric ones (``alice,31,4``) is a data line with a bad
    field, not a header that lacks its columns.
    """
    fields = line.split() if delimiter is None else line.split(delimiter)
    return not any(is_number(field) for field in fields)


def body_and_layout(path: Path, text: str, fmt: str) -> Body:
    """Work out the layout of a file and where its data lines start."""
    line_number, first_line, end = first_content_line(text)
    if fmt == "movielens100k":
        return Body(path, text, 1, Layout(fmt, None, 4, (0, 1, 2, 3), ML100K_SCALE))
    if fmt == "dat":
        return Body(path, text, 1, Layout(fmt, "::", 4, (0, 1, 2, 3), ML100K_SCALE))
    has_header = _is_header(first_line)
    if fmt == "ml-latest":
        if not has_header:
            raise DataFormatError(
                path, line_number, f"missing header line {','.join(_ML_LATEST_HEADER)!r}"
            )
        layout = _header_layout(
            path, line_number, first_line, _ML_LATEST_HEADER, fmt, ML_LATEST_SCALE
        )
        return Body(path, text[end:], line_number + 1, layout)
    delimiter = None if fmt == "whitespace" else ","
    if fmt == "whitespace":
        has_header = _is_header(first_line, None)
    if has_header:
        layout = _header_layout(
            path, line_number, first_line, _CSV_HEADER, fmt, None, delimiter=delimiter
        )
        return Body(path, text[end:], line_number + 1, layout)
    n_fields = len(first_line.split() if delimiter is None else first_line.split(","))
    if n_fields not in (3, 4):
        qualifier = "too few" if n_fields < 3 else "too many"
        shown = (
            "user item rating [timestamp]" if delimiter is None else "user,item,rating[,timestamp]"
        )
        raise DataFormatError(
            path,
            line_number,
            f"{qualifier} fields: expected 3 or 4 ({shown}), found {n_fields}",
        )
    columns = (0, 1, 2, 3 if n_fields == 4 else None)
    return Body(path, text, 1, Layout(fmt, delimiter, n_fields, columns, None))


WHITESPACE = r"\s+"
"""The ``sep`` that means "runs of spaces or tabs" (pandas' spelling)."""

DELIMITED = "delimited"
"""The format name of a file read with a stated ``sep`` or ``columns``."""


def check_separator(sep: str) -> str | None:
    """A ``sep`` as :class:`Layout` takes it (``None``: runs of whitespace).

    Raises:
        ValueError: an empty separator, one with a line break, or one that a number or an id
            could contain (a digit, a letter, ``.``, ``+``, ``-``, ``_``, a quote).
    """
    if not isinstance(sep, str):
        raise TypeError(f"sep must be a string, got {type(sep).__name__}")
    if sep == WHITESPACE:
        return None
    bad = [ch for ch in sep if ch.isalnum() or ch in ".+-_\"'\r\n"]
    if not sep or bad:
        why = "is empty" if not sep else f"holds {bad[0]!r}, which a number or an id can hold"
        raise ValueError(
            f"bad separator {sep!r}: it {why}; use a separator such as ',', ';', '|', a tab, "
            f"'::' or {WHITESPACE!r} (runs of spaces or tabs; --sep whitespace)"
        )
    return sep


def _spelt(sep: str | None) -> str:
    return "runs of whitespace" if sep is None else repr(sep)


def check_columns(columns: tuple[str | int, ...]) -> tuple[str | int, ...]:
    """Columns of user, item, rating[, timestamp]: all header names or all 0-based positions.

    Raises:
        ValueError: not 3 or 4 entries, names mixed with positions, a negative position, or
            an entry given twice.
    """
    columns = tuple(columns)
    if len(columns) not in (3, 4):
        raise ValueError(
            f"columns names user, item, rating[, timestamp]: 3 or 4 entries, got {len(columns)}"
        )
    names = all(isinstance(c, str) and c.strip() for c in columns)
    positions = all(isinstance(c, int) and not isinstance(c, bool) for c in columns)
    if not (names or positions):
        raise ValueError(
            f"columns must be all header names or all 0-based positions, got {columns!r}"
        )
    if positions and min(columns) < 0:
        raise ValueError(f"column positions are 0-based and >= 0, got {columns!r}")
    keys = [c.strip().lower() if names else c for c in columns]
    if len(set(keys)) != len(keys):
        raise ValueError(f"columns names one column twice: {columns!r}")
    return tuple(c.strip() if names else c for c in columns)


def delimited_body(
    path: Path, text: str, sep: str | None, columns: tuple[str | int, ...] | None
) -> Body:
    """The data lines of a file read with a stated separator and/or columns.

    Args:
        path: The file, for errors.
        text: Its decoded text.
        sep: Field separator (``None``: runs of whitespace), checked by :func:`check_separator`.
        columns: User, item, rating[, timestamp] as header names or 0-based positions
            (:func:`check_columns`), or ``None``: a header naming ``user,item,rating``
            [``,timestamp``] (or ml-latest's ``userId,movieId,...``), else the first 3 or 4
            fields.

    Raises:
        DataFormatError: naming the line: the separator missing from the first line, a column
            name the header lacks (listing its columns) or that it has twice, names given for a
            file without a header, a position beyond the first line's fields.
    """
    line_number, first_line, end = first_content_line(text)
    fields = first_line.split() if sep is None else first_line.split(sep)
    if len(fields) < 3:
        raise DataFormatError(
            path,
            line_number,
            f"the separator {_spelt(sep)} cuts the first line {first_line.strip()!r} into "
            f"{len(fields)} field{'s' if len(fields) != 1 else ''}; a rating needs at least 3 "
            "(user, item, rating): pass the file's separator",
        )
    has_header = _is_header(first_line, sep)
    header = [field.strip() for field in fields]
    start, first = (end, line_number + 1) if has_header else (0, 1)
    if columns is None:
        if has_header:
            lowered = {field.lower() for field in header}
            names = _ML_LATEST_HEADER if {"userid", "movieid"} & lowered else _CSV_HEADER
            try:
                layout = _header_layout(path, line_number, first_line, names, DELIMITED, None, sep)
            except DataFormatError as error:
                listed = ", ".join(map(repr, header))
                cause = f"{error.cause.split(' (expected')[0]} (the header's columns are {listed})"
                raise DataFormatError(
                    path,
                    line_number,
                    f"{cause}; pass columns= naming user, item, rating[, timestamp]",
                    f"{cause}; pass --columns USER,ITEM,RATING[,TIMESTAMP] naming them",
                ) from None
            return Body(path, text[start:], first, layout)
        if len(fields) not in (3, 4):
            raise DataFormatError(
                path,
                line_number,
                f"too many fields: expected 3 or 4 (user, item, rating[, timestamp]), found "
                f"{len(fields)}; pass columns= to say which fields to read",
            )
        positions = (0, 1, 2, 3 if len(fields) == 4 else None)
        return Body(path, text, 1, Layout(DELIMITED, sep, len(fields), positions, None))
    if isinstance(columns[0], str):
        if not has_header:
            raise DataFormatError(
                path,
                line_number,
                f"columns are given by name ({', '.join(map(repr, columns))}) but the first "
                f"line {first_line.strip()!r} is data, not a header: give 0-based positions",
            )
        lowered = [field.lower() for field in header]
        found: list[int] = []
        for name in columns:
            where = [i for i, field in enumerate(lowered) if field == name.lower()]
            if not where:
                raise DataFormatError(
                    path,
                    line_number,
                    f"unknown column {name!r}: the header's columns are "
                    f"{', '.join(map(repr, header))}",
                )
            if len(where) > 1:
                raise DataFormatError(
                    path, line_number, f"header names the column {name!r} {_times(where)}"
                )
            found.append(where[0])
        positions = tuple(found)
    else:
        beyond = [c for c in columns if c >= len(fields)]
        if beyond:
            raise DataFormatError(
                path,
                line_number,
                f"column {beyond[0]} is beyond the {len(fields)} fields of the first line "
                f"(positions are 0-based: 0..{len(fields) - 1})",
            )
        positions = tuple(columns)
    padded = (*positions, None) if len(positions) == 3 else positions
    return Body(path, text[start:], first, Layout(DELIMITED, sep, len(fields), padded, None))
