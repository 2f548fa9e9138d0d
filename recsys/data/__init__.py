"""Explicit-feedback rating data: containers, file readers, train/test splits, synthetic data.

The package turns rating files into :class:`Ratings`, a validated, re-indexed container of
``(user index, item index, rating[, timestamp])`` interactions, and pairs of them into a
:class:`Split`. Its modules follow that path:

* :mod:`~securefed.recsys.data.containers`: :class:`RatingScale` (and the MovieLens scales),
  :class:`Ratings`, :class:`Split`.
* :mod:`~securefed.recsys.data.formats`: the five on-disk layouts (MovieLens 100K ``u.data``,
  ml-1m/10M ``.dat``, ml-latest ``.csv``, plain CSV, whitespace separated), format detection,
  and a stated separator and columns (``sep=``, ``columns=``: the ``"delimited"`` format).
* :mod:`~securefed.recsys.data.readers`: :func:`read_ratings_file` (parse and check one file,
  original ids kept exactly, repeated pairs by a stated policy, a :class:`LoadReport`),
  :func:`reindex`, :func:`load_ratings`; malformed files raise
  :class:`DataFormatError` (:mod:`~securefed.recsys.data.errors`) naming the file, the line and
  the cause.
* :mod:`~securefed.recsys.data.frames`: :func:`from_dataframe` (a pandas DataFrame's columns,
  with the same checks; pandas is optional and imported only there).
* :mod:`~securefed.recsys.data.splits`: :func:`random_split`, :func:`temporal_split` and
  MovieLens 100K's fixed splits (:func:`load_movielens_100k`, :data:`ML100K_SPLITS`).
* :mod:`~securefed.recsys.data.synthetic`: :func:`synthetic_ratings`.
* :mod:`~securefed.recsys.data.sources`: :func:`load_dataset`, the one entry point from a name
  or a path to a split, and the embedded ``ml-latest-small`` (:data:`EMBEDDED_DATASET`).

Everything public is importable from ``securefed.recsys.data`` itself.
"""

from securefed.recsys.data.containers import (
    ML100K_SCALE,
    ML_LATEST_SCALE,
    Ratings,
    RatingScale,
    Split,
)
from securefed.recsys.data.errors import DataFormatError
from securefed.recsys.data.formats import FORMAT_DESCRIPTIONS, FORMATS, WHITESPACE
from securefed.recsys.data.frames import from_dataframe
from securefed.recsys.data.readers import (
    DUPLICATE_POLICIES,
    ID_KINDS,
    LoadReport,
    RawRatings,
    load_ratings,
    read_ratings_file,
    reindex,
)
from securefed.recsys.data.sources import EMBEDDED_DATASET, embedded_default_path, load_dataset
from securefed.recsys.data.splits import (
    ML100K_SPLITS,
    load_movielens_100k,
    random_split,
    temporal_split,
)
from securefed.recsys.data.subsets import densest, densest_split
from securefed.recsys.data.synthetic import synthetic_ratings

__all__ = [
    "DUPLICATE_POLICIES",
    "EMBEDDED_DATASET",
    "FORMATS",
    "FORMAT_DESCRIPTIONS",
    "ID_KINDS",
    "ML100K_SCALE",
    "ML100K_SPLITS",
    "ML_LATEST_SCALE",
    "WHITESPACE",
    "DataFormatError",
    "LoadReport",
    "RatingScale",
    "Ratings",
    "RawRatings",
    "Split",
    "densest",
    "densest_split",
    "embedded_default_path",
    "from_dataframe",
    "load_dataset",
    "load_movielens_100k",
    "load_ratings",
    "random_split",
    "read_ratings_file",
    "reindex",
    "synthetic_ratings",
    "temporal_split",
]
