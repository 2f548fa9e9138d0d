"""Where a data set comes from: the embedded ml-latest-small, a folder or a ratings file.

The package ships MovieLens ``ml-latest-small`` (GroupLens Research, redistributed under the terms
of its README.txt, which travels with it) as the embedded default data set, in the package data
folder ``datasets/`` of :mod:`securefed.recsys`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from securefed.recsys.data.containers import RatingScale, Split
from securefed.recsys.data.readers import load_ratings
from securefed.recsys.data.splits import (
    ML100K_SPLITS,
    SPLIT_METHODS,
    check_fraction,
    load_movielens_100k,
    split_by,
)

__all__ = ["EMBEDDED_DATASET", "embedded_default_path", "load_dataset"]

EMBEDDED_DATASET = "ml-latest-small"
"""Name under which :func:`load_dataset` finds the data set shipped with the package."""

# The package whose data folder holds datasets/ (recsys/datasets/ in the repository). Named by its
# installed import name: the repository folder's own name ("recsys") is importable only when the
# repository root happens to be on sys.path, never from a wheel.
_DATA_PACKAGE = "securefed.recsys"


def embedded_default_path() -> Path:
    """Return the path of the ``ml-latest-small`` ratings shipped with the package.

    Raises:
        FileNotFoundError: If the package was installed without its data files.
    """
    resource = resources.files(_DATA_PACKAGE).joinpath("datasets", EMBEDDED_DATASET, "ratings.csv")
    path = Path(os.fspath(resource)) if isinstance(resource, os.PathLike) else None
    if path is None or not path.is_file():
        raise FileNotFoundError(
            f"the embedded data set {EMBEDDED_DATASET!r} is missing from the installed "
            f"package (expected {_DATA_PACKAGE}'s datasets/{EMBEDDED_DATASET}/ratings.csv)"
        )
    return path


def load_dataset(
    source: str | os.PathLike = EMBEDDED_DATASET,
    *,
    split: str | None = None,
    test_fraction: float = 0.2,
    seed: int = 0,
    scale: RatingScale | str | None = None,
    duplicates: str = "error",
    sep: str | None = None,
    columns: Sequence[str | int] | None = None,
    ids: str = "int",
) -> Split:
    """Load a data set and split it into train and test.

    Args:
        source: ``"ml-latest-small"`` for the data set shipped with the package; a folder
            holding MovieLens 100K (``u.data``); a folder holding ``ratings.csv`` or
            ``ratings.dat``; or a ratings file.
        split: ``"random"`` (the default, except for MovieLens 100K) or ``"temporal"``;
            for MovieLens 100K also one of :data:`ML100K_SPLITS` (default ``"u1"``).
        test_fraction: Share of ratings held out by ``"random"`` and ``"temporal"``.
        seed: Seed of the ``"random"`` split.
        scale: The rating scale, as a :class:`RatingScale` or written ``"MIN:MAX:STEP"``
            (``"0.5:4:0.5"``); ``None``: the format's own or one inferred from the data. A
            rating off the stated scale's range or grid is an error naming its line.
        duplicates: What to do with a (user, item) pair given on several lines:
            ``"error"`` (default, naming both lines), ``"first"``, ``"last"`` or ``"mean"``
            (:data:`~securefed.recsys.data.readers.DUPLICATE_POLICIES`).
        sep: The field separator of a ratings file (:func:`read_ratings_file`); not for the
            embedded data set or a MovieLens 100K folder, whose layouts are known.
        columns: Which fields of a ratings file hold user, item, rating[, timestamp]: header
            names or 0-based positions (:func:`read_ratings_file`).
        ids: ``"string"`` for user and item ids that are not integers.

    Returns:
        The train/test split; ``split.train.load_report`` says what reading the file found.

    Raises:
        FileNotFoundError: If ``source`` does not exist or a folder holds no known file.
        ValueError: If ``split`` or ``test_fraction`` is invalid.
        DataFormatError: If a file is malformed.
    """
    test_fraction = check_fraction(test_fraction)
    if isinstance(scale, str):
        scale = RatingScale.parse(scale)
    layout = {"sep": sep, "columns": columns, "ids": ids}
    stated = [f"{key}= (--{key})" for key, value in layout.items() if value not in (None, "int")]
    if stated and isinstance(source, str) and source == EMBEDDED_DATASET:
        raise ValueError(
            f"{', '.join(stated)} apply to a ratings file of yours, not to the embedded "
            f"{EMBEDDED_DATASET!r}, whose layout is known"
        )
    if isinstance(source, str) and source == EMBEDDED_DATASET:
        ratings = load_ratings(
            embedded_default_path(),
            fmt="ml-latest",
            name=EMBEDDED_DATASET,
            scale=scale,
            duplicates=duplicates,
        )
        return split_by(ratings, split or "random", test_fraction, seed)
    path = Path(source)
    if not path.exists():
        raise FileNotFoundError(
            f"no ratings data at {path} (expected a ratings file, a folder holding u.data, "
            f"ratings.csv or ratings.dat, or {EMBEDDED_DATASET!r})"
        )
    if path.is_dir():
        if (path / "u.data").is_file():
            if stated:
                raise ValueError(
                    f"{', '.join(stated)} apply to a ratings file, not to the MovieLens 100K "
                    f"folder {path}, whose layout is known"
                )
            method = split or "u1"
            if method in ML100K_SPLITS:
                return load_movielens_100k(path, method, scale=scale, duplicates=duplicates)
            if method not in SPLIT_METHODS:
                raise ValueError(
                    f"unknown split {method!r}; expected one of {ML100K_SPLITS + SPLIT_METHODS}"
                )
            ratings = load_ratings(
                path / "u.data", fmt="movielens100k", scale=scale, duplicates=duplicates
            )
            return split_by(ratings, method, test_fraction, seed)
        candidates = [path / "ratings.csv", path / "ratings.dat"]
        found = [candidate for candidate in candidates if candidate.is_file()]
        if not found:
            raise FileNotFoundError(f"{path} holds none of u.data, ratings.csv, ratings.dat")
        path = found[0]
    return split_by(
        load_ratings(path, scale=scale, duplicates=duplicates, sep=sep, columns=columns, ids=ids),
        split or "random",
        test_fraction,
        seed,
    )
