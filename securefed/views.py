"""ServerView: the honest-but-curious server's notebook.

A :class:`ServerView` records, round by round, exactly what the server received and could compute:
per-client payloads *as the server sees them* (plaintext rows, masked integers, ciphertext bytes,
noisy vectors: each transport decides), the aggregate it obtained, the state it broadcast, and the
public parameters of the protocol. Attacks (``attacks/``) take a ServerView and nothing else. It is
also the communication ledger: bytes up and down per client per round are always kept, while full
payloads, aggregates and broadcast arrays are kept only for the rounds selected by a
:class:`RoundSelection` (the round in progress holds its aggregate until the next round opens),
because each is as large as the model and a long dense run would not fit in memory or on disk.
docs/serverview.md documents the saved format field by field, and what a view costs.

Saved format (``ServerView.save(directory, key=None)``), version 3, no pickle anywhere:

* ``manifest.json``: ``{"format": "securefed.server_view", "version": 3, "transport": str,
  "keep_payloads": str, "total_rounds": int | null, "public": {...}, "rounds": [round, ...],
  "arrays": [names], "digest": {...}}`` where each round is ``{"round": int, "public": {...},
  "dropped": [client ids], "keep_payloads": bool, "payload_fields": {client: [names]},
  "aggregate": [names], "broadcast": [names]}``. ``digest`` is SHA-256 (HMAC-SHA256 with a key)
  over the manifest's content and the bytes of ``arrays.npz`` (:mod:`securefed.integrity`).
* ``arrays.npz``: ``r{round}/clients``, ``r{round}/bytes_up`` and ``r{round}/bytes_down`` (int64,
  aligned with the clients array), ``r{round}/packed/{field}/values`` and ``.../lengths`` (a
  payload field of every client that sent it, concatenated in ascending client order, and each
  client's first-axis length), ``r{round}/payload/{client}/{field}`` (a field that cannot be
  packed), ``r{round}/aggregate/{name}`` and ``r{round}/broadcast/{name}``; exactly the names the
  manifest's ``arrays`` lists, each deflated where that helps (:func:`write_arrays`). Loaded
  with ``allow_pickle=False``.

Version 3 differs from 2 in what secure aggregation records (a masked upload's SHA-256,
``masked_sha256``, unless the transport keeps the integers), in the packed payload fields and
in the compression; the manifest's keys are the same, and version 2 files are read as they are.

:meth:`ServerView.load` refuses, with :class:`~securefed.errors.ViewFormatError` naming the file
and the cause, anything else: a missing or corrupt file, another format or version (version 1
files carry no digest), a digest that does not match, a missing or unknown field, a round that
appears twice, a dropped client or a payload of a client outside its round, an array no round
names. :func:`save_record` / :func:`load_record` are that machinery for any record type.
"""

from __future__ import annotations

import json
import os
import re
import zipfile
import zlib
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from securefed.errors import ViewFormatError
from securefed.integrity import read_json, verify, write_sealed_json

FORMAT_NAME = "securefed.server_view"
FORMAT_VERSION = 3
READABLE_VERSIONS = (2, 3)
"""Versions :meth:`ServerView.load` reads: 3 (secure aggregation's masked uploads recorded by
digest unless kept, payload fields packed, arrays compressed where it helps) and 2 (payloads one
array per client and field; read as is). Version 1 files carried no digest and are refused."""


@dataclass(frozen=True)
class RoundSelection:
    """Which rounds keep full per-client payloads and broadcast arrays.

    Args:
        rounds: explicit round ids to keep.
        last: additionally keep the last ``last`` rounds of the run (needs ``total_rounds``).
        every: keep all rounds (overrides the rest).

    Parse the command-line form with :meth:`parse`: ``"all"``, ``"none"``, ``"last:2"``,
    ``"0,1,10-12"`` or a combination such as ``"0,1,last:2"``.
    """

    rounds: frozenset[int] = frozenset()
    last: int = 0
    every: bool = False

    def __post_init__(self) -> None:
        if self.last < 0:
            raise ValueError(f"last must be >= 0, got {self.last}")
        if any(r < 0 for r in self.rounds):
            raise ValueError("round ids must be >= 0")

    @classmethod
    def parse(cls, text: str) -> RoundSelection:
        """Parse ``"all"``, ``"none"``, ``"last:K"``, ids and ranges separated by commas."""
        text = text.strip().lower()
        if text == "all":
            return cls(every=True)
        if text in ("none", ""):
            return cls()
        rounds: set[int] = set()
        last = 0
        for part in text.split(","):
            part = part.strip()
            if match := re.fullmatch(r"last:(\d+)", part):
                last = max(last, int(match.group(1)))
            elif match := re.fullmatch(r"(\d+)-(\d+)", part):
                low, high = int(match.group(1)), int(match.group(2))
                if high < low:
                    raise ValueError(f"empty round range {part!r}")
                rounds.update(range(low, high + 1))
            elif part.isdigit():
                rounds.add(int(part))
            else:
                raise ValueError(
                    f"cannot parse round selection {part!r}: use all, none, last:K, N, A-B"
                )
        return cls(rounds=frozenset(rounds), last=last)

    def keeps(self, round_id: int, total_rounds: int | None = None) -> bool:
        """Whether payloads of ``round_id`` are kept in a run of ``total_rounds`` rounds."""
        if self.every or round_id in self.rounds:
            return True
        return bool(self.last and total_rounds is not None and round_id >= total_rounds - self.last)

    def describe(self) -> str:
        if self.every:
            return "all"
        parts = [str(r) for r in sorted(self.rounds)]
        if self.last:
            parts.append(f"last:{self.last}")
        return ",".join(parts) or "none"


NO_PAYLOADS = RoundSelection()
ALL_PAYLOADS = RoundSelection(every=True)


@dataclass(eq=False)
class RoundView:
    """What the server saw in one round.

    Attributes:
        round_id: the round number.
        clients: sorted ids of the clients asked to take part.
        bytes_up: bytes each client sent (aligned with ``clients``).
        bytes_down: bytes each client received (aligned with ``clients``).
        dropped: clients that dropped out (sent nothing usable).
        payloads: per-client payload fields as received, only in rounds that keep payloads.
        aggregate: what the server computed or obtained (e.g. the decoded sum); kept with the
            payloads (cleared when the next round opens in a round that keeps none).
        broadcast: state the server sent to clients (kept with the payloads).
        public: public per-round parameters (learning rate, sampling, ...).
        keep_payloads: whether this round records payloads and broadcast arrays.
    """

    round_id: int
    clients: np.ndarray
    bytes_up: np.ndarray = field(default=None)  # type: ignore[assignment]
    bytes_down: np.ndarray = field(default=None)  # type: ignore[assignment]
    dropped: list[int] = field(default_factory=list)
    payloads: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)
    aggregate: dict[str, np.ndarray] = field(default_factory=dict)
    broadcast: dict[str, np.ndarray] = field(default_factory=dict)
    public: dict[str, object] = field(default_factory=dict)
    keep_payloads: bool = False

    def __post_init__(self) -> None:
        self.clients = np.asarray(self.clients, dtype=np.int64)
        if self.clients.ndim != 1 or np.any(np.diff(self.clients) <= 0):
            raise ValueError("round clients must be a sorted 1-D array of distinct ids")
        for name in ("bytes_up", "bytes_down"):
            value = getattr(self, name)
            value = np.zeros(len(self.clients), np.int64) if value is None else np.asarray(value)
            if value.shape != self.clients.shape:
                raise ValueError(f"{name} must align with clients ({len(self.clients)} entries)")
            setattr(self, name, value.astype(np.int64))

    def positions(self, clients: np.ndarray | Collection[int]) -> np.ndarray:
        """Positions of ``clients`` in this round's client array (error if one is absent)."""
        wanted = np.asarray(clients, dtype=np.int64).reshape(-1)
        if wanted.size == 0:  # nobody to place (an empty Poisson round)
            return np.zeros(0, dtype=np.int64)
        where = np.searchsorted(self.clients, wanted)
        where = np.minimum(where, max(len(self.clients) - 1, 0))
        if len(self.clients) == 0 or np.any(self.clients[where] != wanted):
            missing = wanted[(len(self.clients) == 0) | (self.clients[where] != wanted)]
            raise ValueError(
                f"client(s) {missing[:5].tolist()} are not part of round {self.round_id}"
            )
        return where

    def add_bytes_up(self, clients: np.ndarray | Collection[int], nbytes: np.ndarray | int) -> None:
        np.add.at(self.bytes_up, self.positions(clients), nbytes)

    def add_bytes_down(
        self, clients: np.ndarray | Collection[int], nbytes: np.ndarray | int
    ) -> None:
        np.add.at(self.bytes_down, self.positions(clients), nbytes)

    def record_payload(self, client: int, fields: Mapping[str, np.ndarray]) -> None:
        """Keep one client's payload (no-op in rounds that do not keep payloads)."""
        if self.keep_payloads:
            self.payloads[int(client)] = {k: np.asarray(v) for k, v in fields.items()}

    def record_broadcast(self, name: str, value: np.ndarray) -> None:
        """Keep broadcast state (no-op in rounds that do not keep payloads)."""
        if self.keep_payloads:
            self.broadcast[name] = np.array(value, copy=True)

    def payload(self, client: int) -> dict[str, np.ndarray]:
        """One client's payload as the server saw it.

        Raises:
            KeyError: if the round did not keep payloads or the client sent none.
        """
        if not self.keep_payloads:
            raise KeyError(f"round {self.round_id} kept no payloads (see RoundSelection)")
        if int(client) not in self.payloads:
            raise KeyError(f"client {client} sent no payload in round {self.round_id}")
        return self.payloads[int(client)]

    @property
    def survivors(self) -> np.ndarray:
        return np.setdiff1d(self.clients, np.asarray(self.dropped, dtype=np.int64))


class ServerView:
    """Round-by-round record of what the server saw (see the module docstring for the format).

    Args:
        transport: name of the transport that produced the view.
        keep_payloads: which rounds keep full payloads.
        total_rounds: length of the run, to resolve ``RoundSelection(last=...)``.
        public: public parameters of the transport and the protocol (JSON-serialisable).
    """

    def __init__(
        self,
        transport: str,
        *,
        keep_payloads: RoundSelection = NO_PAYLOADS,
        total_rounds: int | None = None,
        public: Mapping[str, object] | None = None,
    ) -> None:
        self.transport = transport
        self.keep_payloads = keep_payloads
        self.total_rounds = total_rounds
        self.public: dict[str, object] = dict(public or {})
        self.rounds: list[RoundView] = []

    def open(self, round_id: int, clients: np.ndarray) -> RoundView:
        """Start the record of a round (replacing a stale record of the same id, e.g. on resume)."""
        self.rounds = [r for r in self.rounds if r.round_id != round_id]
        for earlier in self.rounds:
            if not earlier.keep_payloads:
                # A finished round outside the selection keeps only its byte ledger: an
                # aggregate is as large as the model, and a long run would hold one per round.
                earlier.aggregate.clear()
        keep = self.keep_payloads.keeps(round_id, self.total_rounds)
        view = RoundView(round_id, np.unique(np.asarray(clients, np.int64)), keep_payloads=keep)
        self.rounds.append(view)
        return view

    def __iter__(self) -> Iterator[RoundView]:
        return iter(self.rounds)

    def __len__(self) -> int:
        return len(self.rounds)

    def round(self, round_id: int) -> RoundView:
        for view in self.rounds:
            if view.round_id == round_id:
                return view
        raise KeyError(f"the view holds no round {round_id}")

    def rounds_with_payloads(self) -> list[int]:
        return [r.round_id for r in self.rounds if r.keep_payloads]

    def truncate(self, next_round: int) -> None:
        """Forget rounds >= ``next_round`` (used when resuming from a checkpoint)."""
        self.rounds = [r for r in self.rounds if r.round_id < next_round]

    def total_bytes(self) -> tuple[int, int]:
        """Total bytes (up, down) over all rounds and clients."""
        up = sum(int(r.bytes_up.sum()) for r in self.rounds)
        down = sum(int(r.bytes_down.sum()) for r in self.rounds)
        return up, down

    def mean_bytes_per_client(self) -> tuple[float, float]:
        """Mean bytes (up, down) per participating client per round."""
        slots = sum(len(r.clients) for r in self.rounds)
        up, down = self.total_bytes()
        return (up / slots, down / slots) if slots else (0.0, 0.0)

    # ------------------------------------------------------------------ persistence
    def save(self, directory: str | os.PathLike, *, key: bytes | None = None) -> Path:
        """Write ``manifest.json`` and ``arrays.npz`` into ``directory`` (created if needed).

        Args:
            directory: the view's folder.
            key: optional key (at least 16 bytes) for an HMAC-SHA256 digest instead of SHA-256.
        """
        arrays: dict[str, np.ndarray | Concatenation] = {}
        rounds = []
        for view in self.rounds:
            prefix = f"r{view.round_id}"
            arrays[f"{prefix}/clients"] = view.clients
            arrays[f"{prefix}/bytes_up"] = view.bytes_up
            arrays[f"{prefix}/bytes_down"] = view.bytes_down
            fields = {str(c): sorted(view.payloads[c]) for c in sorted(view.payloads)}
            arrays.update(_pack_payloads(prefix, view.payloads))
            aggregate = view.aggregate if view.keep_payloads else {}
            for name, value in aggregate.items():
                arrays[f"{prefix}/aggregate/{name}"] = np.asarray(value)
            for name, value in view.broadcast.items():
                arrays[f"{prefix}/broadcast/{name}"] = np.asarray(value)
            rounds.append(
                {
                    "round": view.round_id,
                    "public": view.public,
                    "dropped": [int(c) for c in view.dropped],
                    "keep_payloads": view.keep_payloads,
                    "payload_fields": fields,
                    "aggregate": sorted(aggregate),
                    "broadcast": sorted(view.broadcast),
                }
            )
        manifest = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "transport": self.transport,
            "keep_payloads": self.keep_payloads.describe(),
            "total_rounds": self.total_rounds,
            "public": self.public,
            "rounds": rounds,
        }
        return save_record(directory, manifest, arrays, key=key)

    @classmethod
    def load(cls, directory: str | os.PathLike, *, key: bytes | None = None) -> ServerView:
        """Read a view written by :meth:`save`, checking its digest and its structure.

        Args:
            directory: the view's folder.
            key: the key it was saved with (``None`` for a plain SHA-256 digest).

        Raises:
            ViewFormatError: naming the file and the cause: a missing or corrupt file, a wrong
                format or version, a digest that does not match, or a structure that is not
                the documented one (a duplicated round, a payload of a client outside its
                round, an unknown or missing field, ...).
        """
        manifest, arrays = load_record(
            directory, format_name=FORMAT_NAME, versions=READABLE_VERSIONS, key=key
        )
        manifest_path = Path(directory) / MANIFEST_FILE
        schema = _Schema(manifest_path)
        schema.keys(manifest, "the manifest", _VIEW_KEYS)
        transport = schema.typed(manifest, "transport", str)
        try:
            keep = RoundSelection.parse(schema.typed(manifest, "keep_payloads", str))
        except ValueError as error:
            raise ViewFormatError(f"{manifest_path}: keep_payloads: {error}") from error
        total_rounds = schema.typed(manifest, "total_rounds", int, optional=True)
        view = cls(
            transport,
            keep_payloads=keep,
            total_rounds=total_rounds,
            public=schema.typed(manifest, "public", dict),
        )
        used: set[str] = set()

        def read(name: str) -> np.ndarray:
            if name not in arrays:
                raise ViewFormatError(
                    f"{Path(directory) / ARRAYS_FILE}: array {name!r} named by the manifest is "
                    "missing"
                )
            used.add(name)
            return arrays[name]

        seen: set[int] = set()
        for entry in schema.typed(manifest, "rounds", list):
            view.rounds.append(_load_round(entry, read, arrays.keys(), schema, seen))
        unused = sorted(set(arrays) - used)
        if unused:
            raise ViewFormatError(
                f"{Path(directory) / ARRAYS_FILE}: arrays {unused[:5]} belong to no round of the "
                "manifest"
            )
        return view


# ---------------------------------------------------------------------- saved records
MANIFEST_FILE = "manifest.json"
ARRAYS_FILE = "arrays.npz"
_VIEW_KEYS = frozenset(
    {"format", "version", "transport", "keep_payloads", "total_rounds", "public", "rounds"}
)
_ROUND_KEYS = frozenset(
    {"round", "public", "dropped", "keep_payloads", "payload_fields", "aggregate", "broadcast"}
)
# Keys every record manifest has, whatever its format (written by save_record).
_RECORD_KEYS = frozenset({"arrays", "digest"})


def save_record(
    directory: str | os.PathLike,
    manifest: Mapping[str, object],
    arrays: Mapping[str, np.ndarray | Concatenation],
    *,
    key: bytes | None = None,
) -> Path:
    """Write a record folder: ``arrays.npz`` and a sealed ``manifest.json`` that names them.

    The machinery of every saved view type: the manifest gains ``"arrays"`` (the sorted names in
    ``arrays.npz``) and a ``"digest"`` over its content and the bytes of ``arrays.npz``
    (:mod:`securefed.integrity`); each file is replaced atomically, the arrays first. The arrays
    are written by :func:`write_arrays` (deflated where that helps).

    Args:
        directory: the folder (created if needed).
        manifest: JSON-ready description; must hold ``format`` and ``version``.
        arrays: the numeric content (no object arrays: loaded with ``allow_pickle=False``).
        key: optional HMAC key.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    reserved = _RECORD_KEYS.intersection(manifest)
    if reserved:
        raise ValueError(f"manifest keys {sorted(reserved)} are reserved for save_record")
    tmp_arrays = directory / "arrays.tmp.npz"
    write_arrays(tmp_arrays, arrays)
    os.replace(tmp_arrays, directory / ARRAYS_FILE)
    document = dict(manifest) | {"arrays": sorted(arrays)}
    write_sealed_json(
        directory / MANIFEST_FILE, document, [ARRAYS_FILE], key=key, default=_json_default
    )
    return directory


def write_arrays(path: str | os.PathLike, arrays: Mapping[str, np.ndarray | Concatenation]) -> None:
    """Write ``arrays`` as an ``.npz`` archive, each member deflated where that helps.

    The archive is what :func:`numpy.savez` writes (one ``NAME.npy`` member per array, read by
    :func:`numpy.load`), except that a member whose leading bytes deflate to under
    :data:`COMPRESS_BELOW` of their size is stored compressed (ids, counts, byte ledgers, sparse
    blocks) and one that does not (uniform masked integers, digests, dense float noise) is stored
    as is, and every member carries the same fixed timestamp, so equal content gives equal bytes
    (and an equal digest).

    Raises:
        ValueError: an object array (nothing is pickled).
    """
    with zipfile.ZipFile(path, "w", allowZip64=True) as archive:
        for name, value in arrays.items():
            if not isinstance(value, Concatenation):
                value = np.asarray(value)
            member = zipfile.ZipInfo(f"{name}.npy", date_time=_ZIP_TIME)
            member.compress_type = (
                zipfile.ZIP_DEFLATED if _compresses(value) else zipfile.ZIP_STORED
            )
            with archive.open(member, "w", force_zip64=True) as stream:
                if isinstance(value, Concatenation):
                    value.write(stream)
                else:
                    np.lib.format.write_array(stream, value, allow_pickle=False)


def saved_bytes_by_round(directory: str | os.PathLike) -> dict[int, int]:
    """Bytes of a saved view's ``arrays.npz`` that each round's arrays take on disk.

    Each member counts its local header, its (compressed) data and its entry in the archive's
    central directory; the archive's end records (a few dozen bytes) count for no round. What
    ``docs/serverview.md`` ("What a view costs") reports, and what tests compare across
    transports (bytes are portable; times are not).

    Raises:
        ViewFormatError: a member whose name starts with no ``r{round}/``.
    """
    path = Path(directory) / ARRAYS_FILE
    with zipfile.ZipFile(path) as archive:
        members = sorted(archive.infolist(), key=lambda info: info.header_offset)
        ends = [m.header_offset for m in members[1:]] + [archive.start_dir]
        totals: dict[int, int] = {}
        for member, end in zip(members, ends, strict=True):
            match = re.match(r"r(\d+)/", member.filename)
            if match is None:
                raise ViewFormatError(f"{path}: member {member.filename!r} belongs to no round")
            central = 46 + len(member.filename.encode()) + len(member.extra) + len(member.comment)
            round_id = int(match.group(1))
            totals[round_id] = totals.get(round_id, 0) + end - member.header_offset + central
    return totals


COMPRESS_BELOW = 0.9
"""A member is deflated when a sample of it deflates to under this share of its size."""
_COMPRESS_SAMPLE = 1 << 16  # bytes of a member's start that decide
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # the earliest a zip entry can carry: reproducible archives


def _compresses(value: np.ndarray | Concatenation) -> bool:
    """Whether deflating ``value`` pays: judged on its first :data:`_COMPRESS_SAMPLE` bytes."""
    if value.dtype.hasobject:
        raise ValueError("object arrays cannot be saved (nothing is pickled)")
    if isinstance(value, Concatenation):
        sample = value.head(_COMPRESS_SAMPLE)
    else:
        sample = value.flat[: max(1, _COMPRESS_SAMPLE // max(value.itemsize, 1))].tobytes()
    return len(zlib.compress(sample, 1)) < COMPRESS_BELOW * len(sample)


def load_record(
    directory: str | os.PathLike,
    *,
    format_name: str,
    versions: Collection[int],
    key: bytes | None = None,
) -> tuple[dict[str, object], dict[str, np.ndarray]]:
    """Read and verify a folder written by :func:`save_record`.

    Checks, in order: both files exist, the manifest is JSON of ``format_name`` at one of
    ``versions``, the digest matches the manifest and ``arrays.npz``, and ``arrays.npz`` holds
    exactly the arrays the manifest names.

    Returns:
        The manifest (without ``arrays`` and ``digest``) and every array, loaded.

    Raises:
        ViewFormatError: naming the file and the cause.
    """
    directory = Path(directory)
    manifest_path, arrays_path = directory / MANIFEST_FILE, directory / ARRAYS_FILE
    for path in (manifest_path, arrays_path):
        if not path.is_file():
            raise ViewFormatError(f"{path} is missing: not a saved {format_name} directory")
    manifest = read_json(manifest_path, ViewFormatError)
    if manifest.get("format") != format_name:
        raise ViewFormatError(
            f"{manifest_path}: format is {manifest.get('format')!r}, expected {format_name!r}"
        )
    if manifest.get("version") not in versions:
        readable = ", ".join(str(v) for v in sorted(versions))
        raise ViewFormatError(
            f"{manifest_path}: unsupported version {manifest.get('version')!r} (this securefed "
            f"reads version {readable}, whose files carry a digest)"
        )
    verify(manifest, manifest_path, [ARRAYS_FILE], key=key, error=ViewFormatError)
    names = manifest.get("arrays")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ViewFormatError(f"{manifest_path}: 'arrays' must list the array names")
    try:
        with np.load(arrays_path, allow_pickle=False) as stored:
            if sorted(stored.files) != sorted(names):
                extra = sorted(set(stored.files) ^ set(names))
                raise ViewFormatError(
                    f"{arrays_path}: holds other arrays than the manifest names ({extra[:5]})"
                )
            arrays = {name: stored[name] for name in stored.files}
    except ViewFormatError:
        raise
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as error:
        raise ViewFormatError(
            f"{arrays_path}: unreadable ({type(error).__name__}: {error})"
        ) from error
    body = {k: v for k, v in manifest.items() if k not in _RECORD_KEYS}
    return body, arrays


class _Schema:
    """Field checks of a loaded manifest that name the file, the field and the cause."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, cause: str) -> ViewFormatError:
        return ViewFormatError(f"{self.path}: {cause}")

    def keys(self, entry: object, where: str, allowed: frozenset[str]) -> dict:
        if not isinstance(entry, dict):
            raise self.fail(f"{where} must be a JSON object, found {type(entry).__name__}")
        missing, unknown = sorted(allowed - set(entry)), sorted(set(entry) - allowed)
        if missing or unknown:
            raise self.fail(f"{where} has missing fields {missing} and unknown fields {unknown}")
        return entry

    def typed(self, entry: dict, name: str, kind: type, *, optional: bool = False):
        value = entry[name]
        if value is None and optional:
            return None
        wrong_bool = isinstance(value, bool) and kind is not bool
        if wrong_bool or not isinstance(value, kind):
            raise self.fail(f"field {name!r} must be a {kind.__name__}, found {value!r}")
        return value

    def ids(self, entry: dict, name: str) -> list[int]:
        values = self.typed(entry, name, list)
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            raise self.fail(f"field {name!r} must list integer client ids, found {values[:5]}")
        return values

    def names(self, entry: dict, name: str) -> list[str]:
        values = self.typed(entry, name, list)
        if not all(isinstance(v, str) for v in values):
            raise self.fail(f"field {name!r} must list names, found {values[:5]}")
        return values


def _load_round(
    entry: object,
    read: Callable[[str], np.ndarray],
    stored: Collection[str],
    schema: _Schema,
    seen: set[int],
) -> RoundView:
    """One round of a manifest, checked against its arrays."""
    entry = schema.keys(entry, "a round entry", _ROUND_KEYS)
    round_id = schema.typed(entry, "round", int)
    where = f"round {round_id}"
    if round_id < 0 or round_id in seen:
        raise schema.fail(f"{where} is negative or appears twice")
    seen.add(round_id)
    prefix = f"r{round_id}"
    keep = schema.typed(entry, "keep_payloads", bool)
    try:
        view = RoundView(
            round_id,
            read(f"{prefix}/clients"),
            bytes_up=read(f"{prefix}/bytes_up"),
            bytes_down=read(f"{prefix}/bytes_down"),
            dropped=schema.ids(entry, "dropped"),
            public=dict(schema.typed(entry, "public", dict)),
            keep_payloads=keep,
        )
    except ValueError as error:
        if isinstance(error, ViewFormatError):
            raise
        raise schema.fail(f"{where}: {error}") from error
    members = set(view.clients.tolist())
    strangers = sorted(set(view.dropped) - members)
    if strangers:
        raise schema.fail(f"{where}: dropped clients {strangers[:5]} are not in the round")
    fields = schema.typed(entry, "payload_fields", dict)
    broadcast = schema.names(entry, "broadcast")
    if not keep and (fields or broadcast):
        raise schema.fail(f"{where} keeps no payloads but lists payloads or broadcast arrays")
    for client, names in fields.items():
        if not (client.isdigit() and int(client) in members):
            raise schema.fail(f"{where}: a payload of client {client!r}, who is not in the round")
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise schema.fail(f"{where}: payload fields of client {client} must be names")
    view.payloads.update(_unpack_payloads(prefix, fields, read, stored, schema.fail))
    for name in schema.names(entry, "aggregate"):
        view.aggregate[name] = read(f"{prefix}/aggregate/{name}")
    for name in broadcast:
        view.broadcast[name] = read(f"{prefix}/broadcast/{name}")
    return view


def _pack_payloads(
    prefix: str, payloads: Mapping[int, Mapping[str, np.ndarray]]
) -> dict[str, np.ndarray | Concatenation]:
    """A round's payloads as arrays: each field packed over its clients where it can be.

    A field that every client holding it sent as an array of at least one dimension, of one
    dtype and one shape beyond the first axis, is stored once for the round:
    ``{prefix}/packed/{field}/values`` (the arrays concatenated along their first axis, in
    ascending client order) and ``{prefix}/packed/{field}/lengths`` (int64, each client's first
    axis). Any other field is stored per client, ``{prefix}/payload/{client}/{field}``. Packing
    saves the per-array overhead of the archive (about 400 bytes), which dominates a round of
    many clients with small fields (secure aggregation's keys, shares and digests). A packed
    field's values are returned as a function that concatenates them, called when the archive
    writes them (:class:`Concatenation`): the archive streams the pieces, nothing is copied.
    """
    arrays: dict[str, np.ndarray | Concatenation] = {}
    names = sorted({name for fields in payloads.values() for name in fields})
    for name in names:
        holders = sorted(c for c, fields in payloads.items() if name in fields)
        values = [np.asarray(payloads[c][name]) for c in holders]
        kinds = {(v.dtype.str, v.shape[1:]) for v in values}
        if len(kinds) == 1 and all(v.ndim >= 1 for v in values):
            arrays[f"{prefix}/packed/{name}/values"] = Concatenation(values)
            arrays[f"{prefix}/packed/{name}/lengths"] = np.array([len(v) for v in values], np.int64)
        else:
            for client, value in zip(holders, values, strict=True):
                arrays[f"{prefix}/payload/{client}/{name}"] = value
    return arrays


@dataclass(frozen=True)
class Concatenation:
    """Arrays of one dtype and one shape beyond the first axis, to be saved as one array
    concatenated along its first axis: :func:`write_arrays` streams the pieces into the archive
    without building the whole (what ``numpy.concatenate(pieces)`` would give, byte for byte).
    """

    pieces: tuple[np.ndarray, ...]

    def __init__(self, pieces: Collection[np.ndarray]) -> None:
        pieces = tuple(np.asarray(p) for p in pieces)
        if not pieces or len({(p.dtype.str, p.shape[1:]) for p in pieces}) != 1:
            raise ValueError("a concatenation needs pieces of one dtype and trailing shape")
        if any(p.ndim < 1 for p in pieces):
            raise ValueError("a concatenation needs pieces of at least one dimension")
        object.__setattr__(self, "pieces", pieces)

    @property
    def dtype(self) -> np.dtype:
        return self.pieces[0].dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return (sum(len(p) for p in self.pieces), *self.pieces[0].shape[1:])

    def head(self, nbytes: int) -> bytes:
        """The first ``nbytes`` (or fewer) bytes of the concatenation, in C order."""
        out, left = [], nbytes
        for piece in self.pieces:
            if left <= 0:
                break
            chunk = piece.flat[: -(-left // max(piece.itemsize, 1))].tobytes()
            out.append(chunk)
            left -= len(chunk)
        return b"".join(out)[:nbytes]

    def write(self, stream) -> None:
        """Write the concatenation as one ``.npy`` array (format 1.0) into ``stream``."""
        header = {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False}
        np.lib.format.write_array_header_1_0(stream, header | {"shape": self.shape})
        if self.dtype.hasobject:
            raise ValueError("object arrays cannot be saved (nothing is pickled)")
        for piece in self.pieces:
            if piece.size:  # an empty piece adds no bytes (and no memoryview casts it)
                stream.write(memoryview(np.ascontiguousarray(piece)).cast("B"))


def _unpack_payloads(
    prefix: str,
    fields: Mapping[str, list[str]],
    read: Callable[[str], np.ndarray],
    stored: Collection[str],
    fail: Callable[[str], ViewFormatError],
) -> dict[int, dict[str, np.ndarray]]:
    """The per-client payloads :func:`_pack_payloads` wrote (or a version 2 file's layout).

    Raises:
        ViewFormatError: a packed field whose lengths do not cover its values or its clients.
    """
    payloads: dict[int, dict[str, np.ndarray]] = {int(c): {} for c in fields}
    names = sorted({name for listed in fields.values() for name in listed})
    for name in names:
        holders = sorted(int(c) for c, listed in fields.items() if name in listed)
        packed = f"{prefix}/packed/{name}"
        if f"{packed}/values" not in stored:
            for client in holders:
                payloads[client][name] = read(f"{prefix}/payload/{client}/{name}")
            continue
        values, lengths = read(f"{packed}/values"), read(f"{packed}/lengths")
        if (
            lengths.ndim != 1
            or len(lengths) != len(holders)
            or lengths.dtype.kind not in "iu"
            or np.any(lengths < 0)
            or values.ndim < 1
            or int(lengths.sum()) != len(values)
        ):
            raise fail(
                f"{packed}: {len(holders)} clients hold {name!r} but its lengths "
                f"{lengths.tolist()[:5]} do not split its {len(values)} rows among them"
            )
        parts = np.split(values, np.cumsum(lengths)[:-1])
        for client, part in zip(holders, parts, strict=True):
            payloads[client][name] = part
    return payloads


def _json_default(value: object) -> object:
    """Make numpy scalars and arrays JSON-serialisable in manifests."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


# ================================================================================ the fusion shape
# The record of a fusion channel (vertical FL, DESIGN.md "The two shapes of communication"): the
# same notebook as ServerView, for exchanges instead of aggregation rounds. Additive: nothing
# above uses it.

FUSION_FORMAT_NAME = "securefed.fusion_view"
FUSION_FORMAT_VERSION = 2  # 2: sealed by a digest (save_record)
FUSION_KINDS = ("forward", "backward")
FUSION_NETWORKS = ("online", "target")
_LEDGER_COLUMNS = ("rounds", "bytes_up", "bytes_down", "forwards", "backwards")


def _plain_name(what: str, value: object) -> str:
    """A party name, tag or field name: a string without ``/`` (it becomes part of array keys)."""
    if not isinstance(value, str) or "/" in value:
        raise ValueError(f"{what} must be a string without '/', got {value!r}")
    return value


def check_party_names(parties: object) -> tuple[str, ...]:
    """Distinct, non-empty party names without ``/``.

    Raises:
        ValueError: naming the offending name.
    """
    names = tuple(parties)  # type: ignore[arg-type]
    if not names:
        raise ValueError("a fusion channel needs at least one party")
    for name in names:
        if not _plain_name("a party name", name):
            raise ValueError("party names must be non-empty")
    if len(set(names)) != len(names):
        raise ValueError(f"party names must be distinct, got {list(names)}")
    return names


@dataclass(eq=False)
class FusionExchange:
    """One exchange between the parties and the fusion server, as the server saw it.

    Kept (with its payloads) only in the rounds the view's :class:`RoundSelection` keeps.

    Attributes:
        step: the channel's exchange counter (0, 1, ... over the run).
        round_id: the caller's round it happened in.
        kind: ``"forward"`` (inputs up, outputs down) or ``"backward"`` (output gradients up,
            input gradients down, the server steps its weights).
        network: ``"online"`` or ``"target"`` (the frozen copy).
        tag: the caller's name for the protocol step (public: the server knows the protocol).
        train: whether a forward kept what a backward needs.
        outputs: the parties that received something back.
        bytes_up: bytes each party sent (parties that sent nothing are absent).
        bytes_down: bytes each party received.
        payloads: per party, field name to array, as the server saw them. Received fields:
            ``"input"``, ``"positions"`` (which output entries the party asked for),
            ``"output_grad"``; sent: ``"output"``, ``"input_grad"``. Encrypted channels record
            ``"<field>_ciphertext_sizes"`` and ``"<field>_ciphertext_sha256"`` instead.
        aggregate: what the server computed or obtained in the clear beyond the messages (e.g.
            the weight gradients the CKKS channel's masked exchange releases).
    """

    step: int
    round_id: int
    kind: str
    network: str
    tag: str
    train: bool
    outputs: tuple[str, ...]
    bytes_up: dict[str, int] = field(default_factory=dict)
    bytes_down: dict[str, int] = field(default_factory=dict)
    payloads: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    aggregate: dict[str, np.ndarray] = field(default_factory=dict)

    def payload(self, party: str) -> dict[str, np.ndarray]:
        """One party's fields of this exchange.

        Raises:
            KeyError: if the party sent and received nothing here.
        """
        if party not in self.payloads:
            raise KeyError(f"party {party!r} has no payload in exchange {self.step}")
        return self.payloads[party]


class FusionView:
    """What a fusion channel's server saw: the ServerView of the fusion shape.

    Every exchange (a forward or a backward between the parties and the server) is counted in a
    per-round ledger (bytes up and down per party, forwards, backwards) and in counters by kind,
    network and tag; the full payloads (:class:`FusionExchange`) are kept only in the rounds that
    ``keep_payloads`` selects, so a long run records its communication without keeping every
    vector. Rounds are the caller's: :meth:`open_round` starts one (ids increase); a caller
    that never opens a round has everything in round 0.

    Saved format (:meth:`save`), version 1, no pickle:

    * ``manifest.json``: ``{"format": "securefed.fusion_view", "version": 1, "shape":
      "fusion", "channel": str, "parties": [names], "keep_payloads": str, "total_rounds":
      int | null, "public": {...}, "counts": {"kind/network/tag": int}, "exchanges":
      [{"step", "round", "kind", "network", "tag", "train", "outputs", "bytes_up": {party:
      int}, "bytes_down": {...}, "payload_fields": {party: [names]}, "aggregate": [names]}]}``.
    * ``arrays.npz``: ``ledger/rounds`` ``(R,)``, ``ledger/bytes_up`` and ``ledger/bytes_down``
      ``(R, parties)`` in party order, ``ledger/forwards`` and ``ledger/backwards`` ``(R,)``
      (int64); ``x{step}/payload/{party}/{field}`` and ``x{step}/aggregate/{name}``. Loaded
      with ``allow_pickle=False``.

    Args:
        channel: name of the channel that produced the view (``transport`` is an alias).
        parties: party names, in the channel's order.
        keep_payloads: which rounds keep full payloads.
        total_rounds: length of the run, to resolve ``RoundSelection(last=...)``.
        public: public parameters of the channel and the protocol (JSON-serialisable).
    """

    shape = "fusion"

    def __init__(
        self,
        channel: str,
        parties: Collection[str],
        *,
        keep_payloads: RoundSelection = NO_PAYLOADS,
        total_rounds: int | None = None,
        public: Mapping[str, object] | None = None,
    ) -> None:
        if not isinstance(channel, str) or not channel:
            raise ValueError(f"channel must be a non-empty string, got {channel!r}")
        if not isinstance(keep_payloads, RoundSelection):
            raise TypeError(
                f"keep_payloads must be a RoundSelection, got {type(keep_payloads).__name__}"
            )
        self.channel = channel
        self.parties = check_party_names(parties)
        self.keep_payloads = keep_payloads
        self.total_rounds = total_rounds
        self.public: dict[str, object] = dict(public or {})
        self.exchanges: list[FusionExchange] = []
        self.counts: dict[str, int] = {}
        self._index = {name: i for i, name in enumerate(self.parties)}
        self._rows = 0
        self._ledger = _empty_ledger(len(self.parties), 64)
        self._keep = False
        self._steps = 0

    @property
    def transport(self) -> str:
        """The channel's name (the ServerView family's name for it)."""
        return self.channel

    # ------------------------------------------------------------------ recording
    @property
    def current_round(self) -> int | None:
        """The open round (``None`` before the first exchange or :meth:`open_round`)."""
        return int(self._ledger["rounds"][self._rows - 1]) if self._rows else None

    @property
    def keeps_current(self) -> bool:
        """Whether exchanges recorded now keep their payloads (channels skip the copies if not)."""
        if not self._rows:
            return self.keep_payloads.keeps(0, self.total_rounds)
        return self._keep

    @property
    def steps(self) -> int:
        """Exchanges recorded so far."""
        return self._steps

    def open_round(self, round_id: int) -> None:
        """Start round ``round_id`` (greater than the last; the open round's id continues it).

        Raises:
            ValueError: a negative id or one below the open round.
        """
        if isinstance(round_id, bool) or int(round_id) != round_id or round_id < 0:
            raise ValueError(f"round ids are integers >= 0, got {round_id!r}")
        current = self.current_round
        if current is not None and round_id <= current:
            if round_id == current:
                return
            raise ValueError(f"round {round_id} opened after round {current}: ids must increase")
        if self._rows == len(self._ledger["rounds"]):  # grow by doubling
            grown = _empty_ledger(len(self.parties), max(64, 2 * self._rows))
            for name, array in self._ledger.items():
                grown[name][: self._rows] = array[: self._rows]
            self._ledger = grown
        self._ledger["rounds"][self._rows] = round_id
        self._rows += 1
        self._keep = self.keep_payloads.keeps(int(round_id), self.total_rounds)

    def record(
        self,
        kind: str,
        *,
        network: str,
        tag: str,
        train: bool,
        outputs: Collection[str],
        bytes_up: Mapping[str, int],
        bytes_down: Mapping[str, int],
        payloads: Mapping[str, Mapping[str, np.ndarray]] | None = None,
        aggregate: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        """Count one exchange in the open round; keep its payloads if the round keeps them.

        ``payloads`` and ``aggregate`` are copied (pass them only when :attr:`keeps_current`;
        they are ignored otherwise).

        Raises:
            ValueError: an unknown kind, network or party, or a tag with ``/``.
        """
        if kind not in FUSION_KINDS:
            raise ValueError(f"kind must be one of {FUSION_KINDS}, got {kind!r}")
        if network not in FUSION_NETWORKS:
            raise ValueError(f"network must be one of {FUSION_NETWORKS}, got {network!r}")
        _plain_name("a tag", tag)
        outputs = tuple(outputs)
        named = set(outputs) | set(bytes_up) | set(bytes_down) | set(payloads or {})
        unknown = named - set(self.parties)
        if unknown:
            raise ValueError(f"parties {sorted(unknown)} are not parties of {list(self.parties)}")
        if not self._rows:
            self.open_round(0)
        row = self._rows - 1
        for party, nbytes in bytes_up.items():
            self._ledger["bytes_up"][row, self._index[party]] += int(nbytes)
        for party, nbytes in bytes_down.items():
            self._ledger["bytes_down"][row, self._index[party]] += int(nbytes)
        self._ledger["forwards" if kind == "forward" else "backwards"][row] += 1
        key = f"{kind}/{network}/{tag}"
        self.counts[key] = self.counts.get(key, 0) + 1
        if self._keep:
            self.exchanges.append(
                FusionExchange(
                    step=self._steps,
                    round_id=int(self._ledger["rounds"][row]),
                    kind=kind,
                    network=network,
                    tag=tag,
                    train=bool(train),
                    outputs=outputs,
                    bytes_up={p: int(v) for p, v in bytes_up.items()},
                    bytes_down={p: int(v) for p, v in bytes_down.items()},
                    payloads={
                        party: {_plain_name("a field name", k): np.array(v) for k, v in f.items()}
                        for party, f in (payloads or {}).items()
                    },
                    aggregate={
                        _plain_name("an aggregate name", k): np.array(v)
                        for k, v in (aggregate or {}).items()
                    },
                )
            )
        self._steps += 1

    # ------------------------------------------------------------------ reading
    def count(self, *, kind: str | None = None, network: str | None = None, tag: str | None = None):
        """Exchanges recorded (all rounds) of the given kind, network and tag (``None``: any)."""
        total = 0
        for key, value in self.counts.items():
            k, n, t = key.split("/", 2)
            if (kind in (None, k)) and (network in (None, n)) and (tag in (None, t)):
                total += value
        return total

    def ledger(self) -> dict[str, np.ndarray]:
        """Copies of the per-round ledger: ``rounds`` ``(R,)``, ``bytes_up`` / ``bytes_down``
        ``(R, parties)`` in party order, ``forwards`` / ``backwards`` ``(R,)``."""
        return {name: array[: self._rows].copy() for name, array in self._ledger.items()}

    def exchanges_of(
        self, *, tag: str | None = None, kind: str | None = None, round_id: int | None = None
    ) -> list[FusionExchange]:
        """The kept exchanges matching ``tag``, ``kind`` and ``round_id`` (``None``: any)."""
        return [
            e
            for e in self.exchanges
            if tag in (None, e.tag) and kind in (None, e.kind) and round_id in (None, e.round_id)
        ]

    def rounds_with_payloads(self) -> list[int]:
        """Rounds of which exchanges were kept."""
        return sorted({e.round_id for e in self.exchanges})

    def total_bytes(self) -> tuple[int, int]:
        """Total bytes (up, down) over all rounds and parties."""
        rows = self._rows
        return int(self._ledger["bytes_up"][:rows].sum()), int(
            self._ledger["bytes_down"][:rows].sum()
        )

    def bytes_per_party(self) -> dict[str, tuple[int, int]]:
        """Per party, total bytes (up, down) over the run."""
        up = self._ledger["bytes_up"][: self._rows].sum(axis=0)
        down = self._ledger["bytes_down"][: self._rows].sum(axis=0)
        return {p: (int(up[i]), int(down[i])) for i, p in enumerate(self.parties)}

    # ------------------------------------------------------------------ persistence
    def to_arrays(self) -> tuple[dict[str, object], dict[str, np.ndarray]]:
        """The view as a JSON-ready manifest and named arrays (what :meth:`save` writes; also
        what training checkpoints store)."""
        arrays = {f"ledger/{name}": array for name, array in self.ledger().items()}
        exchanges = []
        for e in self.exchanges:
            prefix = f"x{e.step}"
            for party, fields in e.payloads.items():
                for name, value in fields.items():
                    arrays[f"{prefix}/payload/{party}/{name}"] = value
            for name, value in e.aggregate.items():
                arrays[f"{prefix}/aggregate/{name}"] = value
            exchanges.append(
                {
                    "step": e.step,
                    "round": e.round_id,
                    "kind": e.kind,
                    "network": e.network,
                    "tag": e.tag,
                    "train": e.train,
                    "outputs": list(e.outputs),
                    "bytes_up": e.bytes_up,
                    "bytes_down": e.bytes_down,
                    "payload_fields": {p: sorted(f) for p, f in e.payloads.items()},
                    "aggregate": sorted(e.aggregate),
                }
            )
        manifest = {
            "format": FUSION_FORMAT_NAME,
            "version": FUSION_FORMAT_VERSION,
            "shape": self.shape,
            "channel": self.channel,
            "parties": list(self.parties),
            "keep_payloads": self.keep_payloads.describe(),
            "total_rounds": self.total_rounds,
            "steps": self._steps,
            "public": self.public,
            "counts": dict(self.counts),
            "exchanges": exchanges,
        }
        return json.loads(json.dumps(manifest, default=_json_default)), arrays

    @classmethod
    def from_arrays(
        cls, manifest: Mapping[str, object], arrays: Mapping[str, np.ndarray], source: str
    ) -> FusionView:
        """Rebuild a view from :meth:`to_arrays`' output (``source`` names it in errors).

        Raises:
            ViewFormatError: a wrong format or version, a missing array, or inconsistent content.
        """

        def fail(cause: str) -> ViewFormatError:
            return ViewFormatError(f"{source}: {cause}")

        def read(key: str) -> np.ndarray:
            if key not in arrays:
                raise fail(f"array {key!r} named by the manifest is missing")
            return np.asarray(arrays[key])

        if manifest.get("format") != FUSION_FORMAT_NAME:
            raise fail(f"format is {manifest.get('format')!r}, expected {FUSION_FORMAT_NAME!r}")
        if manifest.get("version") != FUSION_FORMAT_VERSION:
            raise fail(f"unsupported version {manifest.get('version')!r}")
        try:
            view = cls(
                manifest["channel"],
                manifest["parties"],
                keep_payloads=RoundSelection.parse(manifest["keep_payloads"]),
                total_rounds=manifest["total_rounds"],
                public=manifest["public"],
            )
            ledger = {name: read(f"ledger/{name}").astype(np.int64) for name in _LEDGER_COLUMNS}
            rows, width = len(ledger["rounds"]), len(view.parties)
            for name, array in ledger.items():
                expected = (rows, width) if name.startswith("bytes") else (rows,)
                if array.shape != expected:
                    raise fail(f"ledger/{name} has shape {array.shape}, expected {expected}")
            if rows and (np.any(np.diff(ledger["rounds"]) <= 0) or ledger["rounds"][0] < 0):
                raise fail("ledger rounds must be distinct, increasing and >= 0")
            counts = {str(k): int(v) for k, v in manifest["counts"].items()}
            if sum(counts.values()) != int(ledger["forwards"].sum() + ledger["backwards"].sum()):
                raise fail("the exchange counts disagree with the ledger")
            view._ledger = {name: array.copy() for name, array in ledger.items()}
            view._rows = rows
            view.counts = counts
            view._steps = int(manifest["steps"])
            known_rounds = set(ledger["rounds"].tolist())
            for entry in manifest["exchanges"]:
                step, round_id = int(entry["step"]), int(entry["round"])
                if round_id not in known_rounds or not 0 <= step < view._steps:
                    raise fail(f"exchange {step} of round {round_id} lies outside the ledger")
                prefix = f"x{step}"
                exchange = FusionExchange(
                    step=step,
                    round_id=round_id,
                    kind=str(entry["kind"]),
                    network=str(entry["network"]),
                    tag=str(entry["tag"]),
                    train=bool(entry["train"]),
                    outputs=tuple(entry["outputs"]),
                    bytes_up={str(p): int(v) for p, v in entry["bytes_up"].items()},
                    bytes_down={str(p): int(v) for p, v in entry["bytes_down"].items()},
                    payloads={
                        str(party): {
                            str(name): read(f"{prefix}/payload/{party}/{name}") for name in names
                        }
                        for party, names in entry["payload_fields"].items()
                    },
                    aggregate={
                        str(name): read(f"{prefix}/aggregate/{name}") for name in entry["aggregate"]
                    },
                )
                if exchange.kind not in FUSION_KINDS or exchange.network not in FUSION_NETWORKS:
                    raise fail(f"exchange {step}: unknown kind or network")
                named = set(exchange.outputs) | set(exchange.payloads) | set(exchange.bytes_up)
                if not named <= set(view.parties):
                    raise fail(f"exchange {step} names parties outside {list(view.parties)}")
                view.exchanges.append(exchange)
        except ViewFormatError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise fail(f"malformed fusion view ({type(error).__name__}: {error})") from error
        steps = [e.step for e in view.exchanges]
        if steps != sorted(set(steps)):
            raise fail("kept exchanges must have distinct, increasing steps")
        if view._rows:
            view._keep = view.keep_payloads.keeps(int(view.current_round), view.total_rounds)
        return view

    def restore_from(self, other: FusionView) -> None:
        """Take over ``other``'s record (a checkpoint's), which must come from the same channel,
        parties and payload selection.

        Raises:
            ValueError: naming what differs.
        """
        for name in ("channel", "parties", "total_rounds"):
            if getattr(other, name) != getattr(self, name):
                raise ValueError(
                    f"the saved fusion view has {name} {getattr(other, name)!r}, this one "
                    f"{getattr(self, name)!r}"
                )
        if other.keep_payloads.describe() != self.keep_payloads.describe():
            raise ValueError(
                f"the saved fusion view keeps payloads of {other.keep_payloads.describe()!r}, "
                f"this run asks for {self.keep_payloads.describe()!r}"
            )
        self.public = dict(other.public)
        self.exchanges = list(other.exchanges)
        self.counts = dict(other.counts)
        self._ledger = {name: array.copy() for name, array in other._ledger.items()}
        self._rows, self._keep, self._steps = other._rows, other._keep, other._steps

    def save(self, directory: str | os.PathLike, *, key: bytes | None = None) -> Path:
        """Write ``manifest.json`` and ``arrays.npz`` into ``directory``, sealed by a digest
        (an HMAC with ``key``) as every saved record is (:func:`save_record`)."""
        manifest, arrays = self.to_arrays()
        return save_record(directory, manifest, arrays, key=key)

    @classmethod
    def load(cls, directory: str | os.PathLike, *, key: bytes | None = None) -> FusionView:
        """Read and verify a view written by :meth:`save`.

        Raises:
            ViewFormatError: naming the file and the cause.
        """
        manifest, arrays = load_record(
            directory, format_name=FUSION_FORMAT_NAME, versions=(FUSION_FORMAT_VERSION,), key=key
        )
        return cls.from_arrays(manifest, arrays, str(directory))


def _empty_ledger(parties: int, capacity: int) -> dict[str, np.ndarray]:
    return {
        "rounds": np.zeros(capacity, np.int64),
        "bytes_up": np.zeros((capacity, parties), np.int64),
        "bytes_down": np.zeros((capacity, parties), np.int64),
        "forwards": np.zeros(capacity, np.int64),
        "backwards": np.zeros(capacity, np.int64),
    }
