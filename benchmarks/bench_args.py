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
