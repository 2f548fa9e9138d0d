"""DP-ALS canaries for the empirical privacy audit (:mod:`securefed.audit.empirical`).

A hook and a scorer for :class:`~securefed.recsys.dp_als.DPALS` in the one-run audit of Steinke,
Nasr and Jagielski 2023 ("Privacy Auditing with One (1) Training Run"): ``m`` canary users are
appended to the training data, canary ``j`` with its own item ``n_items + j`` that no one else
rates. Each canary is included with probability 1/2 (the driver draws it): an included canary
rates its item at the top of the scale; an excluded one takes part with no rating (it uploads
nothing), so who takes part is the same either way and only the data differs.

DP-ALS's uploads are scaled so that one user moves a release by at most 1 in L2 (upload units;
:func:`~securefed.recsys.dp_als.bias_sensitivity`), and a user with a single rating is scaled up
to that bound (``weighting="per_user"``): an included canary adds, at its own item, the bias row
``d = [clip(r - m, -G_b, G_b), 1] / |.|`` at full norm in the bias release and at norm
``sqrt(bias_share)`` in every item pass (whose bias columns carry the rest of the budget). The
score (:func:`bias_row_score`) is the matched filter of those released rows,
``sum_r w_r <d, y_r[item_j, bias columns]>``, with ``w_r`` the canary's norm in release ``r``
(every release of a run carries the same unit noise). It reads the noisy sums DP-ALS is handed
(:class:`RecordingDPALS`), what every observer of the releases reads, so it audits the
``released_model`` observer. It ignores the ALS columns (``[u u^T, e u]``): the bound it gives
is a valid lower bound, not the tightest one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from securefed import ClientSampling, RunOptions, SeedTree, run_rounds
from securefed.audit.empirical import Scorer
from securefed.recsys.data import Ratings
from securefed.recsys.dp_als import DPALS, DPALSConfig
from securefed.transport import build_transport, parse_transport_spec, resolve_options


class RecordingDPALS(DPALS):
    """:class:`DPALS` that keeps every released sum it is handed (the observer's record)."""

    def __init__(self, train: Ratings, config: DPALSConfig, seeds: SeedTree) -> None:
        super().__init__(train, config, seeds)
        self.released: list[np.ndarray] = []

    def apply_bias_release(self, total: np.ndarray) -> None:
        self.released.append(np.array(total, dtype=np.float64))
        super().apply_bias_release(total)

    def apply_pass(self, total: np.ndarray) -> None:
        self.released.append(np.array(total, dtype=np.float64))
        super().apply_pass(total)


def with_item_canaries(train: Ratings, included: np.ndarray) -> Ratings:
    """``train`` with ``len(included)`` canary users and as many canary items appended.

    Canary ``j`` is user ``train.n_users + j``; when ``included[j]`` it rates item
    ``train.n_items + j`` at the scale's maximum, otherwise it has no rating.
    """
    included = np.asarray(included, dtype=bool).reshape(-1)
    m = len(included)
    chosen = np.flatnonzero(included)
    top = float(train.scale.maximum)

    def extend_ids(ids: np.ndarray) -> np.ndarray:
        start = int(ids.max()) + 1 if len(ids) else 0
        return np.concatenate([ids, start + np.arange(m)])

    timestamps = None
    if train.timestamps is not None:
        last = int(train.timestamps.max()) if len(train.timestamps) else 0
        timestamps = np.concatenate([train.timestamps, last + 1 + np.arange(len(chosen))])
    return Ratings(
        users=np.concatenate([train.users, train.n_users + chosen]),
        items=np.concatenate([train.items, train.n_items + chosen]),
        ratings=np.concatenate([train.ratings, np.full(len(chosen), top)]),
        timestamps=timestamps,
        n_users=train.n_users + m,
        n_items=train.n_items + m,
        scale=train.scale,
        user_ids=extend_ids(train.user_ids),
        item_ids=extend_ids(train.item_ids),
        name=f"{train.name}+{m} item canaries",
    )


@dataclass(frozen=True, eq=False)
class DPALSCanaryObservation:
    """What one audited DP-ALS run released, and the ledger's figures.

    Attributes:
        released: per release (round), the released ``(n_items + m, width)`` sum.
        first_canary_item: the item of canary 0 (canary ``j`` has ``first_canary_item + j``).
        bias_direction: the unit bias row an included canary uploads.
        bias_columns: the two bias columns of the block.
        weights: the canary's norm in each release (1 in the bias release, ``sqrt(bias_share)``
            in each item pass).
        epsilons: the ledger's epsilon per observer.
        delta: the ledger's delta.
    """

    released: tuple[np.ndarray, ...]
    first_canary_item: int
    bias_direction: np.ndarray
    bias_columns: slice
    weights: tuple[float, ...]
    epsilons: dict[str, float] = field(default_factory=dict)
    delta: float | None = None


def bias_row_score(observation: DPALSCanaryObservation, canary: int) -> float:
    """The matched filter of the canary's bias rows in every release (module docstring)."""
    row = observation.first_canary_item + int(canary)
    return float(
        sum(
            weight * (released[row, observation.bias_columns] @ observation.bias_direction)
            for weight, released in zip(observation.weights, observation.released, strict=True)
        )
    )


@dataclass(frozen=True)
class DPALSCanaryJob:
    """``run_job`` of :func:`securefed.audit.empirical.run_empirical_audit` for DP-ALS.

    Attributes:
        train: the real users' ratings (the canaries are appended).
        config: DP-ALS's configuration (``weighting="per_user"``: the canary's one rating then
            uses the whole bound; refused otherwise).
        transport: a transport name or spec of the registry (``dp``, ``secagg+dp``, ...).
        transport_options: its options (``{"dp.epsilon": 4.0}``).
        seed: the run's seed (seeded noise: an audit reproduces its run).
    """

    train: Ratings
    config: DPALSConfig
    transport: str = "dp"
    transport_options: dict = field(default_factory=dict)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.config.weighting != "per_user":
            raise ValueError(
                "the DP-ALS canary scores assume weighting='per_user' (a one-rating canary "
                f"scaled to the whole bound); got {self.config.weighting!r}"
            )

    def __call__(self, included: np.ndarray) -> DPALSCanaryObservation:
        cfg = self.config
        data = with_item_canaries(self.train, included)
        spec = parse_transport_spec(self.transport)
        transport = build_transport(
            spec.name,
            resolve_options(spec, self.transport_options),
            total_rounds=cfg.releases,
            n_clients=data.n_users,
        )
        seeds = SeedTree(self.seed)
        model = RecordingDPALS(data, cfg, seeds)
        run_rounds(
            model,
            transport,
            seeds,
            RunOptions(
                rounds=cfg.releases,
                sampling=ClientSampling(),
                progress=False,
                on_budget_exhausted="raise",
            ),
        )
        centred = min(cfg.bias_clip, float(data.scale.maximum) - model.midpoint)
        direction = np.array([centred, 1.0]) / np.hypot(centred, 1.0)
        ledger = getattr(transport, "ledger", None)
        epsilons = {} if ledger is None else ledger.epsilons(transport.delta)
        return DPALSCanaryObservation(
            released=tuple(model.released),
            first_canary_item=self.train.n_items,
            bias_direction=direction,
            bias_columns=slice(cfg.bias_column, cfg.bias_column + 2),
            weights=(1.0, *([float(np.sqrt(cfg.bias_share))] * cfg.passes)),
            epsilons=epsilons,
            delta=None if ledger is None else transport.delta,
        )

    def scorers(self, observer: str = "released_model") -> dict[str, Scorer]:
        """The bias-row scorer for ``observer``. Under ``secagg+dp`` the server decodes exactly
        the released sums, so it scores the server's view too; under central ``dp`` the server
        also sees the clean sums (its ledger epsilon is infinite), which this scorer does not
        read."""
        return {
            "bias-rows": Scorer(
                observer,
                bias_row_score,
                description="matched filter of the canary's bias rows in every released sum",
            )
        }
