"""The generic canary hook: canary clients in every aggregation round a model opens.

Any recommender whose private release is a sum of per-client blocks through a
:class:`~securefed.transport.base.Transport` (FedMF's item block, FedHPD's distributions on the
public states, a ``securefed.torch`` model's flattened update) is audited without changing it:
hand it a :class:`CanaryTransport` in place of its transport. Each round it opens with the
hook's block shape takes the canary clients (:class:`~securefed.audit.whitebox.CanaryHook`)
next to its own; the canaries submit when the model asks for the result, and the release of
each round is recorded for the white-box estimate (:meth:`CanaryTransport.report`; Andrew et
al., ICLR 2024). Rounds of another shape (FedMF's rating-mean round) pass through untouched.

The model's own clients stay in the release: their updates do not depend on the random
directions, so they widen the null and the inserted statistics alike (the mean-shift estimate
stays centred, the noise estimate errs low; Andrew et al., section 3). The canaries do move the
model (as in the paper): audit runs are not the runs one ships.

Example:
    >>> from securefed import SeedTree
    >>> from securefed.audit.whitebox import CanaryHook, canary_directions, canary_schedule
    >>> from securefed.transport import build_transport
    >>> directions = canary_directions(40, 64, np.random.default_rng(0))
    >>> hook = CanaryHook(directions[:20], canary_schedule(20, 0, 2), 10.0, 3, (1, 64))
    >>> inner = build_transport("dp", {"epsilon": 4.0}, total_rounds=2, n_clients=23)
    >>> transport = CanaryTransport(inner, hook)
    >>> for t in range(2):
    ...     rnd = transport.open_round(t, [0, 1, 2], shape=(1, 64), seeds=SeedTree(0))
    ...     rnd.submit_batch(RowUpdates.single(0, np.zeros(64)))
    ...     total = rnd.result().total
    >>> config = WhiteBoxConfig(n_constant=20, n_alternating=0, n_held_out=20, rounds=2, dim=64)
    >>> sorted(transport.report(directions[20:], config).estimates)[:2]
    ['released_model/constant', 'released_model/noise']
"""

from __future__ import annotations

import numpy as np

from securefed.audit.whitebox import (
    WHITEBOX_OBSERVERS,
    CanaryHook,
    CanaryRun,
    WhiteBoxConfig,
    WhiteBoxReport,
    check_delta,
    clear_payload,
    contradictions,
    ledger_epsilon,
    observed_sum,
    run_estimates,
)
from securefed.randomness import SeedTree
from securefed.transport.base import Aggregate, AggregationRound, RowUpdates, Transport
from securefed.transport.ddp import rotation_signs

__all__ = ["CanaryRound", "CanaryTransport"]


class CanaryRound:
    """One round of the model's with the canary clients in it (made by :class:`CanaryTransport`).

    ``submit``, ``submit_batch``, ``drop`` and ``broadcast`` are the inner round's; ``clients``
    are the model's own (what it computes for); ``result`` first submits the canaries'
    scheduled updates (once), then records the release.
    """

    def __init__(
        self,
        inner: AggregationRound,
        owner: CanaryTransport,
        index: int,
        seeds: SeedTree,
        clients: np.ndarray,
    ) -> None:
        self.inner, self.owner, self.index, self.seeds = inner, owner, index, seeds
        self.clients = clients
        """The model's own clients of the round (the canaries are the hook's business)."""
        self.weighted = False
        """Whether the model's clients sent weights (the canaries then send weight 1)."""
        self._done = False

    def submit(self, client: int, vector: np.ndarray, *, weight: float | None = None) -> None:
        self.weighted = self.weighted or weight is not None
        self.inner.submit(client, vector, weight=weight)

    def submit_batch(self, updates: RowUpdates) -> None:
        self.weighted = self.weighted or updates.weights is not None
        self.inner.submit_batch(updates)

    def drop(self, client: int) -> None:
        self.inner.drop(client)

    def broadcast(
        self, name: str, value: np.ndarray, *, bytes_per_client: int | None = None
    ) -> None:
        self.inner.broadcast(name, value, bytes_per_client=bytes_per_client)

    def result(self) -> Aggregate:
        """The inner round's aggregate, the canaries' updates in it."""
        if not self._done:
            self.owner.hook.submit(self.inner, self.index, weighted=self.weighted)
            aggregate = self.inner.result()
            self.owner.record(self.inner, self.seeds, aggregate)
            self._done = True
        return self.inner.result()

    def __getattr__(self, name: str):
        # Whatever else the model reads of its round (the integer mechanism, the view).
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


class CanaryTransport:
    """A transport whose rounds of the hook's block shape take the hook's canary clients.

    Args:
        transport: the transport to audit, built for the model's clients *and* the canaries
            (``n_clients = first_client + len(hook.directions)``).
        hook: the canaries; ``hook.first_client`` after the model's own client ids.

    Everything else (``view``, ``ledger``, ``epsilon``, ``capabilities``, ``name``) is the
    inner transport's.
    """

    def __init__(self, transport: Transport, hook: CanaryHook) -> None:
        self.transport, self.hook = transport, hook
        self.released: list[np.ndarray] = []
        self.server: list[np.ndarray] = []
        self.rotations: list[tuple[np.ndarray, tuple[int, ...], int]] = []
        self.own: np.ndarray | None = np.zeros(hook.directions.shape)
        """Each canary's clear payloads summed (local DP, a view that keeps payloads), else
        ``None``."""

    def open_round(
        self,
        round_id: int,
        clients,
        *,
        shape: tuple[int, int],
        seeds: SeedTree,
    ):
        """The inner round; with the canary clients added when ``shape`` is the hook's."""
        if tuple(shape) != tuple(self.hook.shape):
            return self.transport.open_round(round_id, clients, shape=shape, seeds=seeds)
        clients = np.asarray(clients, dtype=np.int64)
        if np.any(clients >= self.hook.first_client):
            raise ValueError(
                f"the model's clients must have ids below the canaries' ({self.hook.first_client})"
            )
        every = np.concatenate([clients, self.hook.clients])
        inner = self.transport.open_round(round_id, every, shape=shape, seeds=seeds)
        return CanaryRound(inner, self, len(self.released), seeds, clients)

    def record(self, inner: AggregationRound, seeds: SeedTree, aggregate: Aggregate) -> None:
        """Keep a finished canary round's release (and an integer mechanism's rotation)."""
        released = np.asarray(aggregate.total, dtype=np.float64).reshape(-1)
        self.released.append(released)
        self.server.append(observed_sum(self.transport, inner.round_id, released))
        if self.own is not None:
            dim = self.hook.directions.shape[1]
            view_round = self.transport.view.round(inner.round_id)
            for k, client in enumerate(self.hook.clients.tolist()):
                payload = clear_payload(view_round, client, dim)
                if payload is None:
                    self.own = None
                    break
                self.own[k] += payload
        mechanism = getattr(inner, "mechanism", None)
        if mechanism is not None:
            signs = rotation_signs(seeds.key("dp", "rotation", inner.round_id), mechanism.padded)
            self.rotations.append((signs, mechanism.chunks, mechanism.padded))

    def run(self) -> CanaryRun:
        """What the observers read in the canary rounds so far."""
        if not self.released:
            raise ValueError("no round of the hook's shape finished: nothing to audit")
        return CanaryRun(
            np.stack(self.released), np.stack(self.server), self.rotations or None, self.own
        )

    def report(self, held_out: np.ndarray, config: WhiteBoxConfig) -> WhiteBoxReport:
        """The white-box estimates of the rounds so far, against the transport's ledger.

        Raises:
            ValueError: ``config`` not matching the hook and the rounds run, or the audit's
                delta not the ledger's.
        """
        rounds, n = len(self.released), len(self.hook.directions)
        if config.rounds != rounds or config.n_canaries != n:
            raise ValueError(
                f"config has {config.n_canaries} canaries over {config.rounds} rounds; the hook "
                f"has {n} and {rounds} canary rounds finished"
            )
        delta_ledger = check_delta(self.transport, config)
        estimates = run_estimates(self.run(), self.hook, held_out, config, self.transport)
        ledger = {o: ledger_epsilon(self.transport, o) for o in WHITEBOX_OBSERVERS}
        return WhiteBoxReport(
            estimates, ledger, delta_ledger, contradictions(estimates, ledger, config), {}, config
        )

    def __getattr__(self, name: str):
        # The audited transport's view, ledger, epsilon, capabilities and name.
        if name == "transport":
            raise AttributeError(name)
        return getattr(self.transport, name)
