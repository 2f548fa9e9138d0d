"""Where benchmark data comes from.

MovieLens 100K may not be redistributed, so it is never in the repository: a bare name such as
``ml-100k`` is looked up in the directory named by ``$SECUREFED_DATA``, then in ``shared/data``
beside the checkout this module runs from (a source checkout only: installed from a wheel, this
file lies in site-packages, beside no checkout), then in ``../shared/data`` and ``shared/data``
relative to the working directory. The embedded ml-latest-small needs nothing.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from securefed.recsys.data import EMBEDDED_DATASET, Split, load_dataset

REPO_ROOT = Path(__file__).resolve().parents[1]
"""The checkout's root when this module runs from one (it holds pyproject.toml)."""


class DataUnavailable(FileNotFoundError):
    """A named benchmark data set is not present on this machine."""


def data_roots(cwd: Path | None = None) -> list[Path]:
    """Directories searched for named data sets, in order, without repeats.

    Args:
        cwd: the working directory (default: the process's).
    """
    cwd = Path.cwd() if cwd is None else cwd
    roots = []
    if os.environ.get("SECUREFED_DATA"):
        roots.append(Path(os.environ["SECUREFED_DATA"]))
    if (REPO_ROOT / "pyproject.toml").is_file():  # a source checkout, not site-packages
        roots.append(REPO_ROOT.parent / "shared" / "data")
    roots += [cwd.parent / "shared" / "data", cwd / "shared" / "data"]
    unique: list[Path] = []
    for root in roots:
        if root.absolute() not in [known.absolute() for known in unique]:
            unique.append(root)
    return unique


def resolve(source: str | os.PathLike) -> str | Path:
    """Map a data argument to something :func:`securefed.recsys.data.load_dataset` takes.

    ``ml-latest-small`` is the embedded default; an existing path is used as is; a bare name such
    as ``ml-100k`` is looked up under :func:`data_roots`.

    Raises:
        DataUnavailable: naming the places searched and how to point at the data.
    """
    if str(source) == EMBEDDED_DATASET:
        return EMBEDDED_DATASET
    path = Path(source)
    if path.exists():
        return path
    roots = data_roots()
    if len(path.parts) == 1:
        for root in roots:
            if (root / path).exists():
                return root / path
    searched = ", ".join(str(root / path) for root in roots)
    raise DataUnavailable(
        f"data set {str(source)!r} not found: no such path, nor {searched}"
        + ("" if os.environ.get("SECUREFED_DATA") else " ($SECUREFED_DATA is not set)")
        + f"; give its path (--data /path/to/{path.name}) or set SECUREFED_DATA to the "
        f"directory holding {path.name}/ (MovieLens 100K is not redistributed with securefed: "
        "https://grouplens.org/datasets/movielens/100k/)"
    )


def load(
    source: str | os.PathLike,
    split: str | None = None,
    seed: int = 0,
    *,
    scale: str | None = None,
    duplicates: str = "error",
    sep: str | None = None,
    columns: Sequence[str | int] | None = None,
    ids: str = "int",
) -> Split:
    """Resolve and load a data set with its split (``u1``.. for ML-100K, ``random`` otherwise).

    ``scale`` (``"MIN:MAX:STEP"``), ``duplicates``, ``sep``, ``columns`` and ``ids`` go to
    :func:`securefed.recsys.data.load_dataset`.
    """
    return load_dataset(
        resolve(source),
        split=split,
        seed=seed,
        scale=scale,
        duplicates=duplicates,
        sep=sep,
        columns=columns,
        ids=ids,
    )
