"""Direction canaries for the correlated-noise transports (:mod:`securefed.transport.correlated`).

A hook and a scorer for the one-run audit of :mod:`securefed.audit.empirical` (Steinke, Nasr and
Jagielski 2023). Canary ``j`` is a client of the cyclic schedule (its group ``j % groups``)
that owns coordinate ``j`` of the block: included (probability 1/2), it submits the clip norm
at that coordinate in every round of its group; excluded, it submits zeros, so who takes part is
the same either way. The released sums at coordinate ``j`` are then ``r = s_j + w``, with
``s_j = clip 1_{P_j}`` and ``w`` the mechanism's noise, Gaussian of covariance
``(sigma clip)^2 M M^T`` (``M``: :func:`~securefed.privacy.correlated.residual_matrix`). The
score is the Neyman-Pearson statistic of that Gaussian test, ``s_j^T (M M^T)^-1 r`` (the
generalised matched filter): the most any observer of the released sums learns about the
canary, which the ledger's epsilon must bound.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from securefed import RowUpdates
from securefed.audit.empirical import Scorer
from securefed.privacy.correlated import residual_matrix
from securefed.randomness import SeedTree
from securefed.transport.correlated import CorrelatedDPTransport


@dataclass(frozen=True, eq=False)
class CorrelatedCanaryObservation:
    """The released sums of an audited run, and what the scorer needs.

    Attributes:
        released: ``(rounds, n_canaries)``: the released sum at each canary's coordinate.
        signatures: ``(rounds, n_canaries)``: an included canary's contribution (``clip`` in
            the rounds of its group).
        precision: ``(M M^T)^-1``, the inverse noise covariance over ``(sigma clip)^2``.
        epsilons: the ledger's epsilon per observer; ``delta``: its delta.
    """

    released: np.ndarray
    signatures: np.ndarray
    precision: np.ndarray
    epsilons: dict[str, float]
    delta: float | None


def matched_filter_score(observation: CorrelatedCanaryObservation, canary: int) -> float:
    """``s_j^T (M M^T)^-1 r_j`` (module docstring)."""
    signature = observation.signatures[:, canary]
    return float(signature @ observation.precision @ observation.released[:, canary])


def run_canaries(
    transport: CorrelatedDPTransport, included: np.ndarray, *, seed: int = 0
) -> CorrelatedCanaryObservation:
    """Run every round of ``transport`` with the canaries as its only clients (module docstring).

    Args:
        transport: a fresh correlated transport (its ``total_rounds`` rounds are run).
        included: which canaries take part with their direction.
        seed: the seed tree's seed (seeded noise: the audit reproduces its run).
    """
    included = np.asarray(included, dtype=bool)
    m = len(included)
    rounds, clip = transport.total_rounds, transport.config.clip
    schedule = transport.participation
    seeds = SeedTree(seed)
    released = np.zeros((rounds, m))
    for t in range(rounds):
        clients = schedule.members(t, m)
        rnd = transport.open_round(t, clients, shape=(1, m), seeds=seeds)
        values = np.zeros((len(clients), m))
        values[np.arange(len(clients)), clients] = np.where(included[clients], clip, 0.0)
        k = len(clients)
        rnd.submit_batch(RowUpdates(clients, np.arange(k + 1), np.zeros(k, int), values, 1))
        released[t] = rnd.result().total.reshape(-1)
    signatures = clip * schedule.indicator(np.arange(rounds))[schedule.group_of(np.arange(m))].T
    mixing = residual_matrix(transport.correlation, rounds)
    return CorrelatedCanaryObservation(
        released=released,
        signatures=signatures.astype(np.float64),
        precision=np.linalg.inv(mixing @ mixing.T),
        epsilons=transport.ledger.epsilons(transport.delta),
        delta=transport.delta,
    )


def scorers() -> dict[str, Scorer]:
    """The matched-filter scorer, against the released model's observers."""
    return {
        "matched-filter": Scorer(
            "released_model",
            matched_filter_score,
            description="Gaussian Neyman-Pearson statistic of the canary's rounds",
        )
    }
