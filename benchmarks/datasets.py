"""Where benchmark data comes from.

MovieLens 100K may not be redistributed, so it is never in the repository: a bare name such as
``ml-100k`` is looked up in the directory named by ``$SECUREFED_DATA``, then in ``shared/data``
beside the checkout this module runs from (a source checkout only: installed from a wheel, this
file lies in site-packages, beside no checkout), then in ``../shared/data`` and ``shared/data``
relative to the working directory. The embedded ml-latest-small needs nothing.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from securefed.recsys.data import (
    DUPLICATE_POLICIES,
    EMBEDDED_DATASET,
    Split,
    embedded_default_path,
    load_dataset,
)

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


@dataclass(frozen=True)
class LoaderOptions:
    """Every option of :func:`load` beyond its source: how a run read its ratings.

    ``securefed fedmf --save-view`` records them in the view (``view.public["data"]["loader"]``,
    :meth:`to_dict`) and ``securefed attack`` rebuilds the run's training ratings from them
    (:meth:`from_dict`, :func:`load_with`): an option added here travels with every view without
    a change to the attack.

    Attributes:
        split: the split (``u1``.. for ML-100K, ``random`` or ``temporal``; ``None``: the data
            set's default).
        seed: the seed of a ``random`` split.
        scale: the rating scale as ``"MIN:MAX:STEP"`` (``None``: the format's own, or inferred).
        duplicates: the policy for repeated (user, item) pairs
            (:data:`~securefed.recsys.data.readers.DUPLICATE_POLICIES`).
        sep: the field separator of a ratings file of yours (``None``: recognised).
        columns: its user, item, rating[, timestamp] fields, as header names or 0-based
            positions (``None``: the layout's own).
        ids: ``"int"`` or ``"string"`` user and item ids.
    """

    split: str | None = None
    seed: int = 0
    scale: str | None = None
    duplicates: str = "error"
    sep: str | None = None
    columns: tuple[str | int, ...] | None = None
    ids: str = "int"

    def __post_init__(self) -> None:
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"a split seed is an integer, got {self.seed!r}")
        if self.columns is not None:
            object.__setattr__(self, "columns", tuple(self.columns))  # a view records a list
        if self.ids not in ("int", "string"):
            raise ValueError(f"loader option 'ids' is 'int' or 'string', got {self.ids!r}")
        for name in ("split", "scale", "sep"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"loader option {name!r} is a string or None, got {value!r}")
        if self.duplicates not in DUPLICATE_POLICIES:
            raise ValueError(
                f"loader option 'duplicates' must be one of {DUPLICATE_POLICIES}, got "
                f"{self.duplicates!r}"
            )

    def to_dict(self) -> dict[str, object]:
        """The options as a JSON-ready mapping (what a view records)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, recorded: Mapping[str, object]) -> LoaderOptions:
        """The options a view recorded (absent ones take their defaults).

        Raises:
            ValueError: an option this securefed does not know (a newer one's view), or a value
                out of range, naming it.
        """
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(recorded) - known)
        if unknown:
            raise ValueError(
                f"the view records loader options {unknown} that this securefed does not know "
                f"(it knows {sorted(known)}): it was written by a newer version"
            )
        return cls(**{name: recorded[name] for name in known if name in recorded})


def load_with(source: str | os.PathLike, options: LoaderOptions) -> Split:
    """:func:`load` with recorded :class:`LoaderOptions`."""
    return load(
        source,
        options.split,
        options.seed,
        scale=options.scale,
        duplicates=options.duplicates,
        sep=options.sep,
        columns=options.columns,
        ids=options.ids,
    )


def source_sha256(source: str | os.PathLike) -> str:
    """SHA-256 (hex) of what a data argument names, as :func:`resolve` finds it.

    A file: its bytes. A folder (MovieLens 100K's, or one holding ``ratings.csv``): every regular
    file directly in it, in name order, each as its name, its size and its bytes, so that a
    changed, added or removed file changes the digest. The embedded data set: its ratings file.

    Raises:
        DataUnavailable: as :func:`resolve`.
    """
    resolved = resolve(source)
    path = embedded_default_path() if resolved == EMBEDDED_DATASET else Path(resolved)
    digest = hashlib.sha256()
    if path.is_file():
        _hash_file(digest, path)
        return digest.hexdigest()
    for member in sorted(p for p in path.iterdir() if p.is_file()):
        name = member.name.encode()
        digest.update(len(name).to_bytes(8, "big") + name)
        digest.update(member.stat().st_size.to_bytes(8, "big"))
        _hash_file(digest, member)
    return digest.hexdigest()


def _hash_file(digest, path: Path) -> None:
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
