"""What ``securefed.flower`` needs from an algorithm, and the pure pieces of the federation.

An algorithm runs on Flower when it splits into a server half and a client half that meet only
through the transport, which is how every securefed algorithm is written (DESIGN.md, "the two
shapes of communication"): the server opens a transport round and broadcasts its state, each
client computes an update from the broadcast and its own data, the transport aggregates, the
server steps. Here the two halves live in different processes (a ServerApp and the ClientApps of
the SuperNodes), and Flower messages carry what the in-process runtime passes by reference.

Nothing in this module imports ``flwr``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

from securefed.integrity import check_key
from securefed.randomness import SeedTree
from securefed.runtime import ClientSampling
from securefed.transport.base import AggregationRound, RowUpdates, Transport

if TYPE_CHECKING:
    from securefed.privacy.ledger import PrivacyLedger


class ServerAlgorithm(Protocol):
    """The server half of a federated algorithm (``securefed.recsys.fedmf.FedMF`` is one).

    ``open_round`` + (clients compute and submit) + ``close_round`` must be what the algorithm's
    own ``run_round`` does in one process, so that both runtimes give the same model.

    An encrypted server state (``transport_needs.encrypted_state`` set: FedMF's
    ``server_state="encrypted"``) also needs ``encrypted_state`` (``None`` until given) and
    ``load_encrypted_state(state)``: the server asks a key-holder node to encrypt the initial
    state (the node's ``initial_state()``) and hands the ciphertexts to the algorithm, whose
    ``broadcast_state`` then carries them (``name.ct_*``, decrypted on the nodes).
    """

    n_clients: int

    def open_round(
        self, round_id: int, clients: np.ndarray, transport: Transport, seeds: SeedTree
    ) -> tuple[AggregationRound, np.ndarray]:
        """Open the transport round, broadcast; return it and the clients that will compute."""

    def broadcast_state(self) -> Mapping[str, np.ndarray]:
        """The arrays every client of a round receives (what ``open_round`` broadcast)."""

    def close_round(self, rnd: AggregationRound) -> None:
        """Read the aggregate and step the server's state."""


class ClientNode(Protocol):
    """The client half on one node: the users (securefed clients) that node hosts.

    A node may host one user or thousands; it computes all of them at once, exactly as the
    in-process runtime computes a group of clients.
    """

    users: np.ndarray

    def train(
        self,
        round_id: int,
        clients: np.ndarray,
        broadcast: Mapping[str, np.ndarray],
        seeds: SeedTree,
    ) -> tuple[list[RowUpdates], dict[str, float]]:
        """Compute the updates of ``clients`` (all hosted here); metrics must be sums over them."""

    def evaluate(self, broadcast: Mapping[str, np.ndarray]) -> dict[str, float]:
        """Held-out metrics of the hosted users, as sums (the server adds the nodes' sums)."""

    def state_dict(self) -> dict[str, np.ndarray]:
        """The node's local state between messages (kept in its Flower Context, never sent)."""

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Restore :meth:`state_dict` (called before each message's work)."""


@dataclass(frozen=True)
class FlowerRunOptions:
    """The server's round loop on Flower.

    Attributes:
        rounds: number of training rounds.
        sampling: client sampling per round (drawn exactly as ``securefed.run_rounds`` does, from
            the stream ``("sampling", round)``, so both runtimes pick the same clients).
        min_nodes: the server waits until this many SuperNodes are connected before round 0.
        evaluate_every: ask the nodes for held-out metrics every this many rounds (0: only after
            the last round).
        timeout: seconds one message round may take before the missing nodes count as dropped.
        poll_interval: seconds between the server's polls for replies while replies arrive.
        max_poll_interval: while a poll brings none, the wait doubles up to this (a poll is a
            scan of the SuperLink's stored replies under its lock, which the simulation
            engine's node loop needs too); ``poll_interval`` again after a poll brings one.
            Equal to ``poll_interval`` (the default): a fixed poll. Measured on the simulation
            engine up to 1000 nodes, backing off to 0.5 s removed most of the server's own
            pulls but not the growth, which is Flower's (docs/flower.md, node-count curve).
        connect_timeout: seconds to wait for ``min_nodes`` nodes.
        checkpoint_dir: where the ServerApp writes a checkpoint after every completed round
            (``securefed.runtime.Checkpoints``: the algorithm's arrays, server optimiser
            included, the server's view, the seeds, the privacy ledgers, the round index and
            ``fingerprint``; written beside the last one and swapped in, every file under a
            digest); ``None``: no checkpoint.
        resume: continue from the checkpoint in ``checkpoint_dir`` when there is one.
        fingerprint: the run's result-bearing configuration (required with
            ``checkpoint_dir``); a checkpoint of another one is refused.
        checkpoint_key: the key (at least 16 bytes) the checkpoints' HMAC digests and the
            sealing of a secure-mode run's root entropy derive from; an unseeded run refuses
            a ``checkpoint_dir`` without it.
        merge_share_mask: secure aggregation's ShareKeys and MaskedInputCollection in one
            message round (``securefed.flower.server.SHARE_MASK``): four message rounds a
            training round against a malicious server instead of five, three instead of four
            against an honest-but-curious one (docs/flower.md, "Fewer message rounds"); a
            node lost in that message round then refuses the round instead of counting as
            dropped before masking.
        advertise_ahead: the next round's AdvertiseKeys request travels with this round's
            Unmasking message and its answer with the node's reveals: one message round
            fewer per training round after the first (a node whose reply is lost sits the
            next round out).
    """

    rounds: int
    sampling: ClientSampling = field(default_factory=ClientSampling)
    min_nodes: int = 1
    evaluate_every: int = 0
    timeout: float = 600.0
    poll_interval: float = 0.05
    max_poll_interval: float = 0.05
    connect_timeout: float = 300.0
    checkpoint_dir: str | os.PathLike | None = None
    resume: bool = True
    fingerprint: Mapping[str, object] = field(default_factory=dict)
    checkpoint_key: bytes | None = field(default=None, repr=False)
    merge_share_mask: bool = False
    advertise_ahead: bool = False

    def __post_init__(self) -> None:
        check_key(self.checkpoint_key)
        merged = [n for n in ("merge_share_mask", "advertise_ahead") if getattr(self, n)]
        if self.checkpoint_dir and merged:
            raise ValueError(
                f"checkpoint_dir with {' and '.join(merged)}: a resumed run's merged message "
                "rounds are not covered by the nodes' journals (each node answers a round once); "
                "use one or the other"
            )
        if self.checkpoint_dir and not self.fingerprint:
            raise ValueError(
                "a checkpoint_dir needs the run's fingerprint (its result-bearing configuration): "
                "without one, a checkpoint of any other run would be resumed"
            )
        if self.rounds < 0:
            raise ValueError(f"rounds must be >= 0, got {self.rounds}")
        if self.min_nodes < 1:
            raise ValueError(f"min_nodes must be >= 1, got {self.min_nodes}")
        if self.evaluate_every < 0:
            raise ValueError(f"evaluate_every must be >= 0, got {self.evaluate_every}")
        for name in ("timeout", "poll_interval", "max_poll_interval", "connect_timeout"):
            value = getattr(self, name)
            if not (np.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be finite and > 0, got {value!r}")
        if self.max_poll_interval < self.poll_interval:
            raise ValueError(
                f"max_poll_interval ({self.max_poll_interval}) must be >= poll_interval "
                f"({self.poll_interval})"
            )


@dataclass
class FlowerRunResult:
    """What the server's loop returns (and hands to ``ServerSetup.on_finish``).

    Attributes:
        rounds: per-round metrics (``round``, ``clients``, the algorithm's metrics, seconds).
        evaluations: held-out metrics, each with the ``round`` after which it was taken.
        message_bytes: bytes of array payloads the server sent (``down``) and received (``up``)
            in Flower messages, all rounds together.
        nodes: the SuperNodes that took part.
        ledger: the privacy ledger the transport's noisy releases were charged to (the
            server's transport's ``ledger``; ``None`` without DP).
        resumed_from: the round the run started from (a checkpoint's next round, else 0);
            ``rounds`` holds the checkpoint's rounds before it.
        message_seconds: message type -> the server's seconds from pushing a message round
            of that type to its last reply (or the timeout), all rounds together.
        message_rounds: message type -> how many message rounds of that type the server
            pushed, all rounds together (what ``merge_share_mask`` and ``advertise_ahead``
            save is read here).
    """

    rounds: list[dict[str, float]] = field(default_factory=list)
    evaluations: list[dict[str, float]] = field(default_factory=list)
    message_bytes: dict[str, int] = field(default_factory=lambda: {"down": 0, "up": 0})
    nodes: int = 0
    ledger: PrivacyLedger | None = None
    resumed_from: int = 0
    message_seconds: dict[str, float] = field(default_factory=dict)
    message_rounds: dict[str, int] = field(default_factory=dict)

    def last(self) -> dict[str, float]:
        return self.rounds[-1] if self.rounds else {}


def partition_users(n_users: int, num_partitions: int, partition_id: int) -> np.ndarray:
    """The users node ``partition_id`` of ``num_partitions`` hosts: a contiguous block.

    ``np.array_split`` of ``0..n_users-1``: every user on exactly one node, block sizes differ by
    at most one. A node with ``num_partitions >= n_users`` may host none.

    Raises:
        ValueError: for a partition outside ``[0, num_partitions)``.
    """
    if n_users < 0:
        raise ValueError(f"n_users must be >= 0, got {n_users}")
    if num_partitions < 1 or not 0 <= partition_id < num_partitions:
        raise ValueError(
            f"partition-id must lie in [0, num-partitions) = [0, {num_partitions}), "
            f"got {partition_id}"
        )
    return np.array_split(np.arange(n_users, dtype=np.int64), num_partitions)[partition_id]


def sum_metrics(parts: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Add the nodes' metric sums key by key (every node's metrics are sums over its users)."""
    total: dict[str, float] = {}
    for part in parts:
        for key, value in part.items():
            total[key] = total.get(key, 0.0) + float(value)
    return total


MetricsFn = Callable[[Mapping[str, float]], dict[str, float]]
"""Turns the summed node metrics into the round's metrics (e.g. sums of squares into an RMSE)."""
