"""The early-stopping options of ``--validation`` (``securefed fedmf``, ``bench
fedmf-vs-centralised``): one definition of the arguments and of what they give
:class:`~securefed.recsys.validation.EarlyStopping`."""

from __future__ import annotations

import argparse

from securefed.recsys.validation import EarlyStopping

OPTIONS = {"patience": "patience", "validate_every": "every"} | {
    name: name for name in ("min_rounds", "smoothing")
}
"""Argument dest -> EarlyStopping field."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--patience``, ``--validate-every``, ``--min-rounds`` and ``--smoothing``."""
    rule = EarlyStopping()
    helps = {
        "patience": "rounds after the best (smoothed) evaluation without a better one before "
        f"stopping ({rule.patience})",
        "validate_every": f"rounds between two evaluations ({rule.every})",
        "min_rounds": f"no stop and no pick before this round ({rule.min_rounds})",
        "smoothing": "width in rounds of the centred moving mean of the validation curve "
        f"({rule.smoothing}; 1: none)",
    }
    for dest, text in helps.items():
        parser.add_argument(
            "--" + dest.replace("_", "-"), type=int, default=None, help=f"with --validation: {text}"
        )


def given(args: argparse.Namespace) -> dict[str, int]:
    """The EarlyStopping fields given on the command line (the others keep their defaults)."""
    values = {field: getattr(args, dest) for dest, field in OPTIONS.items()}
    return {field: value for field, value in values.items() if value is not None}
