"""The error every ratings reader raises for a malformed file."""

from __future__ import annotations

import os

__all__ = ["DataFormatError"]


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
