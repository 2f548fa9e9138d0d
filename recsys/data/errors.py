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
        cause: What is wrong, in words; a fix is named as the Python API spells it
            (``pass scale=``).
        command_line_cause: The same cause with its fix named as the ``securefed`` command line
            spells it (``pass --scale MIN:MAX:STEP``), or ``None`` when the two read alike.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        line: int | None,
        cause: str,
        command_line_cause: str | None = None,
    ) -> None:
        self.path = path
        self.line = line
        self.cause = cause
        self.command_line_cause = command_line_cause
        super().__init__(f"{self._where()}: {cause}")

    def _where(self) -> str:
        path = os.fspath(self.path)
        return path if self.line is None else f"{path}, line {self.line}"

    @property
    def command_line_message(self) -> str:
        """The message with its fix named as a command-line flag (what ``securefed`` prints)."""
        return f"{self._where()}: {self.command_line_cause or self.cause}"

    def __reduce__(self):
        return (type(self), (self.path, self.line, self.cause, self.command_line_cause))
