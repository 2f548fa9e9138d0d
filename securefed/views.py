"""ServerView: the honest-but-curious server's notebook.

A :class:`ServerView` records, round by round, exactly what the server received and could compute:
per-client payloads *as the server sees them* (plaintext rows, masked integers, ciphertext bytes,
noisy vectors: each transport decides), the aggregate it obtained, the state it broadcast, and the
public parameters of the protocol. Attacks (``attacks/``) take a ServerView and nothing else. It is
also the communication ledger: bytes up and down per client per round are always kept, while full
payloads (and broadcast arrays) are kept only for the rounds selected by a :class:`RoundSelection`,
because a long dense run would not fit in memory.

Saved format (``ServerView.save(directory)``), version 1, no pickle anywhere:

* ``manifest.json``: ``{"format": "securefed.server_view", "version": 1, "transport": str,
  "public": {...}, "rounds": [round, ...]}`` where each round is ``{"round": int, "public": {...},
  "dropped": [client ids], "payload_clients": [client ids], "payload_fields": {client: [names]},
  "aggregate": [names], "broadcast": [names]}``.
* ``arrays.npz``: ``r{round}/clients``, ``r{round}/bytes_up`` and ``r{round}/bytes_down`` (int64,
  aligned with the clients array), ``r{round}/payload/{client}/{field}``,
  ``r{round}/aggregate/{name}`` and ``r{round}/broadcast/{name}``. Loaded with
  ``allow_pickle=False``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from securefed.errors import ViewFormatError

FORMAT_NAME = "securefed.server_view"
FORMAT_VERSION = 1


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
        aggregate: what the server computed or obtained (e.g. the decoded sum).
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
    def save(self, directory: str | os.PathLike) -> Path:
        """Write ``manifest.json`` and ``arrays.npz`` into ``directory`` (created if needed)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        arrays: dict[str, np.ndarray] = {}
        rounds = []
        for view in self.rounds:
            prefix = f"r{view.round_id}"
            arrays[f"{prefix}/clients"] = view.clients
            arrays[f"{prefix}/bytes_up"] = view.bytes_up
            arrays[f"{prefix}/bytes_down"] = view.bytes_down
            fields = {}
            for client, payload in view.payloads.items():
                fields[str(client)] = sorted(payload)
                for name, value in payload.items():
                    arrays[f"{prefix}/payload/{client}/{name}"] = value
            for name, value in view.aggregate.items():
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
                    "aggregate": sorted(view.aggregate),
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
        tmp_arrays = directory / "arrays.tmp.npz"
        np.savez(tmp_arrays, **arrays)
        os.replace(tmp_arrays, directory / "arrays.npz")
        tmp_manifest = directory / "manifest.tmp.json"
        tmp_manifest.write_text(json.dumps(manifest, indent=1, default=_json_default))
        os.replace(tmp_manifest, directory / "manifest.json")
        return directory

    @classmethod
    def load(cls, directory: str | os.PathLike) -> ServerView:
        """Read a view written by :meth:`save`.

        Raises:
            ViewFormatError: naming the missing file, key or unsupported version.
        """
        directory = Path(directory)
        manifest_path = directory / "manifest.json"
        arrays_path = directory / "arrays.npz"
        for path in (manifest_path, arrays_path):
            if not path.is_file():
                raise ViewFormatError(f"{path} is missing: not a saved ServerView directory")
        try:
            manifest = json.loads(manifest_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ViewFormatError(f"{manifest_path}: not valid JSON ({error})") from error
        if manifest.get("format") != FORMAT_NAME:
            raise ViewFormatError(
                f"{manifest_path}: format is {manifest.get('format')!r}, expected {FORMAT_NAME!r}"
            )
        if manifest.get("version") != FORMAT_VERSION:
            raise ViewFormatError(
                f"{manifest_path}: unsupported version {manifest.get('version')!r}"
            )
        view = cls(
            manifest["transport"],
            keep_payloads=RoundSelection.parse(manifest.get("keep_payloads", "none")),
            total_rounds=manifest.get("total_rounds"),
            public=manifest.get("public", {}),
        )
        with np.load(arrays_path, allow_pickle=False) as arrays:

            def read(key: str) -> np.ndarray:
                if key not in arrays:
                    raise ViewFormatError(
                        f"{arrays_path}: array {key!r} named by the manifest is missing"
                    )
                return arrays[key]

            for entry in manifest["rounds"]:
                prefix = f"r{entry['round']}"
                round_view = RoundView(
                    int(entry["round"]),
                    read(f"{prefix}/clients"),
                    bytes_up=read(f"{prefix}/bytes_up"),
                    bytes_down=read(f"{prefix}/bytes_down"),
                    dropped=[int(c) for c in entry.get("dropped", [])],
                    public=dict(entry.get("public", {})),
                    keep_payloads=bool(entry.get("keep_payloads", False)),
                )
                for client, names in entry.get("payload_fields", {}).items():
                    round_view.payloads[int(client)] = {
                        name: read(f"{prefix}/payload/{client}/{name}") for name in names
                    }
                for name in entry.get("aggregate", []):
                    round_view.aggregate[name] = read(f"{prefix}/aggregate/{name}")
                for name in entry.get("broadcast", []):
                    round_view.broadcast[name] = read(f"{prefix}/broadcast/{name}")
                view.rounds.append(round_view)
        return view


def _json_default(value: object) -> object:
    """Make numpy scalars and arrays JSON-serialisable in manifests."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")
