"""How a ratings file of yours is laid out: ``--sep``, ``--columns`` and ``--ids``.

Shared by every command that reads ``--data`` (``securefed fedmf``, ``bench leak-utility``);
importing it imports nothing else (the parser stays lazy).
"""

from __future__ import annotations

import argparse


def parse_separator(text: str) -> str:
    """A ``--sep`` value: ``tab`` or ``\\t`` for a tab, ``whitespace`` for runs of spaces or
    tabs (the readers' ``r"\\s+"``), else the text itself (``,``, ``;``, ``|``, ``::``)."""
    spelled = {"tab": "\t", "\\t": "\t", "whitespace": r"\s+", "space": " "}
    return spelled.get(text, text)


def parse_columns(text: str) -> tuple[str | int, ...]:
    """A ``--columns`` value: ``user,item,rating[,timestamp]`` as header names, or 0-based
    positions (``0,1,2``); every entry a number means positions."""
    parts = [part.strip() for part in text.split(",")]
    if all(part.isdigit() for part in parts):
        return tuple(int(part) for part in parts)
    return tuple(parts)


def add_layout_arguments(parser: argparse.ArgumentParser) -> None:
    """``--sep``, ``--columns`` and ``--ids``: how a ratings file of yours is laid out."""
    parser.add_argument(
        "--sep",
        type=parse_separator,
        default=None,
        help="field separator of a ratings file: ',', ';', '|', '::', tab, or whitespace "
        "(runs of spaces or tabs); default: recognised from the file",
    )
    parser.add_argument(
        "--columns",
        type=parse_columns,
        default=None,
        metavar="USER,ITEM,RATING[,TIMESTAMP]",
        help="the fields that hold user, item, rating[, timestamp]: header names (e.g. "
        "userId,movieId,score) or 0-based positions (e.g. 0,2,3); other fields are ignored",
    )
    parser.add_argument(
        "--ids",
        default="int",
        choices=["int", "string"],
        help="string: user and item ids are any text (e.g. alice, tt0111161), re-indexed; "
        "default int",
    )
