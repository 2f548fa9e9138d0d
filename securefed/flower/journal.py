"""A node's journal on its own disk: its state across runs, and the rounds it already released.

Flower keeps a node's ``Context.state`` per run: a run resubmitted after a SuperLink crash is a
new run, and its nodes would start from nothing (FedMF: every user's vector ``U`` drawn afresh),
while a server resumed from its checkpoint (:mod:`securefed.flower.server`) continues from round
``k``. A node started with ``--node-config 'state-dir=<dir>'`` keeps a :class:`NodeJournal`
there: after each round whose data it released (``train``, ``train.secagg_mask``,
``train.ckks``) it writes its own state (:meth:`~securefed.flower.protocol.ClientNode.state_dict`)
and the round's id, atomically (a new state file, then ``journal.json`` swapped in with
``os.replace``, naming that file and its SHA-256 digest: :mod:`securefed.integrity`). A later
run of the same configuration (the same lineage: a digest of the run config's result-bearing
keys, computed by the node from its own copy of the run config) continues from that state.

The journal is also what stops a server from asking twice. A server that asks a node for a
round whose update the node already released in this lineage -- a resumed server redoing a
round, or a deviating one starting the run over to get a second answer with other dropouts,
other noise or other masks, and subtract the two -- is refused (:class:`RoundReplayError`,
naming the round) before anything is computed; so is AdvertiseKeys of such a round. A round
the node advertised keys for but did not upload in (the crash came between) may be started
again: in secure mode its keys, masks and noise are fresh draws from the OS, and the masked
input of the first attempt never left the node. Fail closed: the journal is written before the
reply leaves, so a node that crashed after writing it refuses the round it may not have sent.

A corrupt, truncated or modified journal (the digests do not match) is refused as a
:class:`~securefed.errors.CheckpointError` naming the file: the node answers nothing for that
lineage until its operator removes the directory.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from securefed.errors import AggregationError, CheckpointError
from securefed.integrity import read_json, verify, write_sealed_json

JOURNAL_FORMAT = "securefed.flower.node-journal"
JOURNAL_VERSION = 1
JOURNAL_FILE = "journal.json"
STATE_DIR_KEY = "state-dir"
"""The ``--node-config`` key naming the node's journal directory (on the node's own disk)."""


class RoundReplayError(AggregationError):
    """The server asked for a round whose update this node already released in this run."""


def lineage_digest(fingerprint: Mapping[str, object]) -> str:
    """Hex SHA-256 of a run's result-bearing configuration (canonical JSON)."""
    text = json.dumps(fingerprint, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


class NodeJournal:
    """One node's journal of one lineage (module docstring).

    Args:
        directory: the node's ``state-dir``.
        lineage: :func:`lineage_digest` of the run configuration.
        partition: the node's partition (several nodes may share a directory).
    """

    def __init__(self, directory: str | os.PathLike, lineage: str, partition: int) -> None:
        self.folder = Path(directory) / f"{lineage[:24]}-node-{int(partition)}"
        self.lineage = lineage
        self.partition = int(partition)
        self._cache: tuple[int, dict[str, np.ndarray] | None] | None = None

    @property
    def path(self) -> Path:
        return self.folder / JOURNAL_FILE

    def _read(self) -> tuple[int, dict[str, np.ndarray] | None]:
        """``(last released round or -1, the node's state then or None)``, checked."""
        if self._cache is not None:
            return self._cache
        if not self.path.exists():
            self._cache = (-1, None)
            return self._cache
        meta = read_json(self.path, CheckpointError)
        if meta.get("format") != JOURNAL_FORMAT or meta.get("version") != JOURNAL_VERSION:
            raise CheckpointError(f"{self.path}: not a {JOURNAL_FORMAT} of version 1")
        state_file = meta.get("state_file")
        if not isinstance(state_file, str) or "/" in state_file:
            raise CheckpointError(f"{self.path}: no state file named")
        verify(meta, self.path, (state_file,), key=None, error=CheckpointError)
        if meta.get("lineage") != self.lineage or meta.get("partition") != self.partition:
            raise CheckpointError(
                f"{self.path} belongs to another run configuration or partition "
                f"(lineage {str(meta.get('lineage'))[:12]}..., partition {meta.get('partition')})"
            )
        released = meta.get("released")
        if isinstance(released, bool) or not isinstance(released, int) or released < 0:
            raise CheckpointError(f"{self.path}: released must be a round id >= 0")
        try:
            with np.load(self.folder / state_file, allow_pickle=False) as saved:
                state = {name: saved[name] for name in saved.files}
        except (OSError, ValueError, EOFError) as error:
            raise CheckpointError(f"{self.folder / state_file}: unreadable ({error})") from error
        self._cache = (released, state)
        return self._cache

    def released(self) -> int:
        """The last round whose update this node released in this lineage (-1: none)."""
        return self._read()[0]

    def state(self) -> dict[str, np.ndarray] | None:
        """The node's state after :meth:`released` (``None`` before any round)."""
        return self._read()[1]

    def check_fresh(self, round_id: int, stage: str) -> None:
        """Refuse a stage of a round at or before the last one released.

        Raises:
            RoundReplayError: naming the round and the journal.
            CheckpointError: the journal is unreadable or modified.
        """
        released = self.released()
        if round_id <= released:
            raise RoundReplayError(
                f"this node already released its update for round {released} of this run "
                f"(journal {self.path}); the server asks {stage} of round {round_id}: a second "
                "answer to a round could be combined with the first (other dropouts, other "
                "noise, other masks), so it is refused"
            )

    def record(self, round_id: int, state: Mapping[str, np.ndarray]) -> None:
        """Write the node's state after releasing round ``round_id``, atomically."""
        self.check_fresh(round_id, "a release")
        self.folder.mkdir(parents=True, exist_ok=True)
        name = f"state-{int(round_id)}.npz"
        tmp = self.folder / f"{name}.tmp"
        with tmp.open("wb") as stream:
            np.savez(stream, **{k: np.asarray(v) for k, v in state.items()})
        os.replace(tmp, self.folder / name)
        write_sealed_json(
            self.path,
            {
                "format": JOURNAL_FORMAT,
                "version": JOURNAL_VERSION,
                "lineage": self.lineage,
                "partition": self.partition,
                "released": int(round_id),
                "state_file": name,
            },
            (name,),
        )
        for old in self.folder.glob("state-*.npz"):
            if old.name != name:
                old.unlink(missing_ok=True)
        self._cache = (int(round_id), {k: np.asarray(v) for k, v in state.items()})
