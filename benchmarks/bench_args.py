"""Arguments every benchmark shares, defined once: its seed and the folder of its records."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_seed_argument(parser: argparse.ArgumentParser, default: int = 0) -> None:
    """``--seed``: benchmarks are seeded (reproducible, and so not private), and say so."""
    parser.add_argument(
        "--seed",
        type=int,
        default=default,
        help="the runs' seed (reproducible, not private: a benchmark)",
    )


def add_out_argument(parser: argparse.ArgumentParser, default: str | Path) -> None:
    """``--out``: the folder the benchmark writes its JSON and markdown records into."""
    parser.add_argument(
        "--out", default=str(default), help="folder of the records (JSON and markdown)"
    )


def add_data_argument(parser: argparse.ArgumentParser, default: str = "ml-100k") -> None:
    """``--data``: a data set's name or a path to the user's ratings."""
    parser.add_argument(
        "--data",
        default=default,
        help="a data set name (ml-100k, ml-latest-small) or a path to a ratings file/dir",
    )


def add_split_argument(parser: argparse.ArgumentParser, default: str = "u1") -> None:
    """``--split``: ML-100K's own splits, or a random or temporal one of another data set."""
    parser.add_argument(
        "--split", default=default, help="u1..u5/ua/ub for ML-100K; random or temporal otherwise"
    )
