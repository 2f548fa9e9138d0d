"""Where benchmark data comes from.

MovieLens 100K may not be redistributed, so it is never in the repository: it is read from the
directory named by ``$SECUREFED_DATA`` (which holds ``ml-100k/``) or from ``../shared/data``
beside the checkout. The embedded ml-latest-small needs nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

from securefed.recsys.data import EMBEDDED_DATASET, Split, load_dataset

REPO_ROOT = Path(__file__).resolve().parents[1]


class DataUnavailable(FileNotFoundError):
    """A named benchmark data set is not present on this machine."""


def data_roots() -> list[Path]:
    """Directories searched for named data sets, in order."""
    roots = []
    if os.environ.get("SECUREFED_DATA"):
        roots.append(Path(os.environ["SECUREFED_DATA"]))
    roots.append(REPO_ROOT.parent / "shared" / "data")
    return roots


def resolve(source: str | os.PathLike) -> str | Path:
    """Map a data argument to something :func:`securefed.recsys.data.load_dataset` takes.

    ``ml-latest-small`` is the embedded default; an existing path is used as is; a bare name such
    as ``ml-100k`` is looked up under :func:`data_roots`.

    Raises:
        DataUnavailable: naming the places searched.
    """
    if str(source) == EMBEDDED_DATASET:
        return EMBEDDED_DATASET
    path = Path(source)
    if path.exists():
        return path
    if len(path.parts) == 1:
        for root in data_roots():
            if (root / path).exists():
                return root / path
    searched = ", ".join(str(r) for r in data_roots())
    raise DataUnavailable(
        f"data set {str(source)!r} not found (searched: the path itself, {searched}); "
        "MovieLens 100K is not redistributed with securefed: set SECUREFED_DATA to a directory "
        "holding ml-100k/"
    )


def load(
    source: str | os.PathLike,
    split: str | None = None,
    seed: int = 0,
    *,
    scale: str | None = None,
    duplicates: str = "error",
) -> Split:
    """Resolve and load a data set with its split (``u1``.. for ML-100K, ``random`` otherwise).

    ``scale`` (``"MIN:MAX:STEP"``) and ``duplicates`` go to
    :func:`securefed.recsys.data.load_dataset`.
    """
    return load_dataset(resolve(source), split=split, seed=seed, scale=scale, duplicates=duplicates)
