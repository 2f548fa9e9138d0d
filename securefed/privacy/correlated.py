"""Correlated noise across rounds: DP-FTRL tree aggregation and banded matrix mechanisms.

The server releases one noisy aggregate per round, ``r_t = x_t + w_t`` (``x_t`` the round's
clipped sum); a model trained by SGD on the ``r_t`` depends on them through their prefix sums
``sum_{s <= t} r_s``. Three ways to draw the per-round noise ``w_t`` (std ``sigma * clip`` per
unit of ``z``), each a linear map of i.i.d. Gaussian vectors ``z``:

* :class:`IndependentNoise`: ``w_t = z_t`` (DP-FedAvg, McMahan et al. ICLR 2018).
* :class:`TreeNoise`: binary-tree aggregation (``"tree"``; ``"tree-honaker"`` reads the prefix
  sums with Honaker's 2015 estimator) (Dwork, Naor, Pitassi and Rothblum 2010; DP-FTRL,
  Kairouz, McMahan, Song, Thakkar, Thakurta and Xu, "Practical and Private (Deep) Learning without
  Sampling or Shuffling", ICML 2021, Algorithm 1): every dyadic interval of rounds that has ended
  is a tree node carrying its own noise ``z``; the noisy prefix sum at ``t`` adds the nodes of the
  binary decomposition of ``[start, t]`` and ``w_t`` is the difference of consecutive noisy
  prefix sums (the "residual" form). The tree restarts every ``restart`` rounds (Kairouz et al.,
  Section 4 and Appendix D: one tree per pass over the data).
* :class:`BandedNoise`: a lower-triangular banded Toeplitz strategy ``C`` with coefficients
  ``c_0..c_{b-1}`` (Choquette-Choo, McMahan, Rush and Thakurta, "Amplified Banded Matrix
  Factorization", NeurIPS 2023; Denisov et al., NeurIPS 2022 for the matrix mechanism): the
  mechanism releases ``C x + z`` and the server's estimate of the rounds is ``C^-1 (C x + z) = x
  + C^-1 z``, so ``w = C^-1 z``, computed by the recursion ``w_t = (z_t - sum_{j>=1} c_j
  w_{t-j}) / c_0``. The default coefficients are the banded square root of the prefix-sum
  matrix, ``c_j = binom(2j, j) / 4^j`` (Fichtenberger, Henzinger and Upadhyay, ICML 2023),
  truncated to ``b`` bands.

All three release a linear query ``Q x`` of the rounds plus i.i.d. noise (the tree's nodes,
``C x``, or ``x`` itself); the per-round aggregates and every model trained on them are
post-processing of that release. Lower-triangular (streaming) strategies stay DP when the
rounds' inputs are chosen adaptively (Denisov et al. 2022, Theorem 2.1).

**Sensitivity and participation.** No amplification by sampling is claimed: the server picks the
clients on a public schedule, :class:`CyclicParticipation` (client ``c`` takes part in the rounds
``t`` with ``t % groups == c % groups``). Adding or removing one client changes the rounds of its
group, each by at most ``clip``; since every strategy here has non-negative coefficients (so a
non-negative Gram matrix ``Q^T Q``), the worst case puts all of the client's contributions in one
direction and the squared L2 sensitivity of ``Q x`` over the clip is
``max_g ||Q 1_{P_g}||^2`` (Choquette-Choo et al. 2023, Theorem 2 and Section 4; for the tree
restarted once per pass, ``k ceil(log2(restart + 1))`` with ``k`` passes: Kairouz et al.,
Appendix D). :class:`SensitivityTracker` keeps ``||Q_{<=t} 1_{P_g}||^2`` per group as rows of
``Q`` are released, so that the prefix of the release up to round ``t`` is exactly a Gaussian
mechanism of multiplier ``sigma / Delta_t``; the ledger is charged the increment
``Delta_t^2 - Delta_{t-1}^2`` as one Gaussian step of multiplier ``sigma / sqrt(increment)`` at
rate 1 (Gaussian Rényi DP is linear in ``Delta^2 / sigma^2``, so the charges compose to exactly
the whole release's ``alpha Delta_T^2 / (2 sigma^2)``; Mironov 2017, Proposition 7).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

CORRELATIONS = ("independent", "tree", "tree-honaker", "banded")

Draw = Callable[[], np.ndarray]
"""A source of i.i.d. standard-normal vectors of the release's shape (one per call)."""

Row = tuple[np.ndarray, np.ndarray]
"""One row of a strategy: the rounds it reads and their coefficients."""


@dataclass(frozen=True)
class CyclicParticipation:
    """The public schedule: client ``c`` takes part in round ``t`` iff ``t % groups == c % groups``.

    Every client then takes part at most once in any ``groups`` consecutive rounds (min-separation
    ``groups``, Choquette-Choo et al. 2023) and at most ``ceil(T / groups)`` times in ``T`` rounds.

    Attributes:
        groups: the number of groups, ``b >= 1`` (1: every client every round).
    """

    groups: int

    def __post_init__(self) -> None:
        if isinstance(self.groups, bool) or int(self.groups) != self.groups or self.groups < 1:
            raise ValueError(f"groups must be an integer >= 1, got {self.groups!r}")

    def group_of(self, clients: np.ndarray) -> np.ndarray:
        """The group of each client id."""
        return np.asarray(clients, dtype=np.int64) % self.groups

    def round_group(self, round_id: int) -> int:
        """The group that takes part in ``round_id``."""
        return int(round_id) % self.groups

    def members(self, round_id: int, n_clients: int) -> np.ndarray:
        """The client ids of round ``round_id`` among ``0 .. n_clients - 1``."""
        return np.arange(self.round_group(round_id), n_clients, self.groups, dtype=np.int64)

    def indicator(self, rounds: np.ndarray) -> np.ndarray:
        """``(groups, len(rounds))``: whether group ``g`` takes part in each round."""
        rounds = np.asarray(rounds, dtype=np.int64)
        return (rounds[None, :] % self.groups) == np.arange(self.groups)[:, None]


class NoiseCorrelation(Protocol):
    """A correlated-noise strategy (module docstring): its released rows and its noise stream."""

    name: str

    def rows_released_at(self, round_id: int) -> list[Row]:
        """The rows of the query ``Q`` released at ``round_id`` (rounds read, coefficients)."""

    def stream(self) -> NoiseStream:
        """A fresh noise stream (its state is the past noise it still needs)."""


class NoiseStream(Protocol):
    """Draws the per-round noise ``w_t`` in order, from standard-normal vectors."""

    def residual(self, round_id: int, draw: Draw) -> np.ndarray:
        """``w_t`` for ``round_id`` (called once per round, in order from 0)."""


def _check_next(expected: int, round_id: int) -> None:
    if round_id != expected:
        raise ValueError(
            f"correlated noise is drawn round after round: expected round {expected}, got "
            f"{round_id} (a skipped or repeated round would break the noise's correlation)"
        )


# ----------------------------------------------------------------------------- independent
@dataclass(frozen=True)
class IndependentNoise:
    """``w_t = z_t``: DP-FedAvg's i.i.d. noise, accounted under the participation schedule."""

    name: str = "independent"

    def rows_released_at(self, round_id: int) -> list[Row]:
        return [(np.array([round_id]), np.array([1.0]))]

    def stream(self) -> _IndependentStream:
        return _IndependentStream()


@dataclass
class _IndependentStream:
    next_round: int = 0

    def residual(self, round_id: int, draw: Draw) -> np.ndarray:
        _check_next(self.next_round, round_id)
        self.next_round += 1
        return draw()


# ----------------------------------------------------------------------------- tree
def dyadic_decomposition(count: int) -> list[tuple[int, int]]:
    """The tree nodes ``(level, start)`` whose intervals ``[start, start + 2^level)`` tile
    ``[0, count)``, largest first (the binary digits of ``count``)."""
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    nodes, start = [], 0
    for level in range(count.bit_length() - 1, -1, -1):
        if count >> level & 1:
            nodes.append((level, start))
            start += 1 << level
    return nodes


def nodes_ending_at(index: int) -> list[tuple[int, int]]:
    """The tree nodes ``(level, start)`` whose interval ends at leaf ``index`` (released then)."""
    nodes, level = [], 0
    while (index + 1) % (1 << level) == 0:
        nodes.append((level, index + 1 - (1 << level)))
        level += 1
    return nodes


TREE_ESTIMATORS = ("sum", "honaker")


def honaker_variances(levels: int) -> np.ndarray:
    """``v_l``, the variance (over the node noise's) of Honaker's estimate of a complete node of
    level ``l < levels``: ``v_0 = 1``, ``v_l = 2 v_{l-1} / (2 v_{l-1} + 1)`` (the node's own
    value, variance 1, combined by inverse variance with its children's estimates, 2 v_{l-1})."""
    variances = np.ones(max(int(levels), 1))
    for level in range(1, len(variances)):
        variances[level] = 2 * variances[level - 1] / (2 * variances[level - 1] + 1)
    return variances


@dataclass(frozen=True)
class TreeNoise:
    """Binary-tree aggregation (DP-FTRL, Kairouz et al. 2021), restarted every ``restart`` rounds.

    A leaf is in at most ``ceil(log2(restart + 1))`` released nodes of its tree.

    Attributes:
        restart: rounds per tree (>= 1).
        estimator: how a prefix sum is read from the released nodes: ``"sum"`` (the nodes of its
            binary decomposition, Kairouz et al.'s Algorithm 1) or ``"honaker"`` (each complete
            node's value replaced bottom-up by the inverse-variance combination of its own value
            and its children's estimates: Honaker, "Efficient Use of Differentially Private
            Binary Trees", 2015; tf_privacy's ``EfficientTreeAggregator``). Post-processing of
            the same release: the same sensitivity, less noise on every prefix of two or more
            leaves.
    """

    restart: int
    estimator: str = "sum"

    def __post_init__(self) -> None:
        if isinstance(self.restart, bool) or int(self.restart) != self.restart or self.restart < 1:
            raise ValueError(f"restart must be an integer >= 1, got {self.restart!r}")
        if self.estimator not in TREE_ESTIMATORS:
            raise ValueError(f"estimator must be one of {TREE_ESTIMATORS}, got {self.estimator!r}")

    @property
    def name(self) -> str:
        return "tree" if self.estimator == "sum" else "tree-honaker"

    def rows_released_at(self, round_id: int) -> list[Row]:
        base = round_id - round_id % self.restart
        rows = []
        for level, start in nodes_ending_at(round_id - base):
            rounds = np.arange(base + start, base + start + (1 << level))
            rows.append((rounds, np.ones(len(rounds))))
        return rows

    def stream(self) -> _TreeStream:
        weights = honaker_variances(self.restart.bit_length() + 1)
        return _TreeStream(self.restart, weights if self.estimator == "honaker" else None)


@dataclass
class _TreeStream:
    restart: int
    honaker: np.ndarray | None = None  # v_l of Honaker's estimates; None: the plain sum
    next_round: int = 0
    nodes: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)
    previous: np.ndarray | float = 0.0

    def _estimate(self, level: int, start: int, own: np.ndarray) -> np.ndarray:
        """The node's noise as its estimate carries it (its own draw, or Honaker's mix)."""
        if self.honaker is None or level == 0:
            return own
        half = 1 << (level - 1)
        children = self.nodes[(level - 1, start)] + self.nodes[(level - 1, start + half)]
        weight = 2 * self.honaker[level - 1]
        return (weight * own + children) / (weight + 1)

    def residual(self, round_id: int, draw: Draw) -> np.ndarray:
        _check_next(self.next_round, round_id)
        self.next_round += 1
        index = round_id % self.restart
        if index == 0:  # a new tree: the last one's noisy total stays in the model as it is
            self.nodes, self.previous = {}, 0.0
        for level, start in nodes_ending_at(index):  # children before parents
            self.nodes[(level, start)] = self._estimate(level, start, draw())
        prefix = sum(self.nodes[node] for node in dyadic_decomposition(index + 1))
        residual = prefix - self.previous
        self.previous = prefix
        return residual  # the tree's nodes (at most 2 restart - 1) are dropped at its end


# ----------------------------------------------------------------------------- banded
def sqrt_prefix_coefficients(bands: int) -> np.ndarray:
    """``c_j = binom(2j, j) / 4^j`` for ``j < bands``: the first ``bands`` coefficients of the
    lower-triangular Toeplitz square root of the prefix-sum matrix (Fichtenberger et al. 2023)."""
    if isinstance(bands, bool) or int(bands) != bands or bands < 1:
        raise ValueError(f"bands must be an integer >= 1, got {bands!r}")
    coefficients = np.ones(int(bands))
    for j in range(1, int(bands)):
        coefficients[j] = coefficients[j - 1] * (2 * j - 1) / (2 * j)
    return coefficients


@dataclass(frozen=True)
class BandedNoise:
    """A banded lower-triangular Toeplitz strategy ``C`` (Choquette-Choo et al. 2023).

    Attributes:
        coefficients: ``c_0 > 0, c_1, ..., c_{b-1} >= 0`` (``b`` bands); non-negative so that the
            sensitivity is the norm of ``C 1_P`` (module docstring).
    """

    coefficients: tuple[float, ...]
    name: str = "banded"

    def __post_init__(self) -> None:
        values = np.asarray(self.coefficients, dtype=np.float64)
        if values.ndim != 1 or len(values) < 1 or not np.all(np.isfinite(values)):
            raise ValueError("coefficients must be a non-empty sequence of finite numbers")
        if values[0] <= 0 or np.any(values < 0):
            raise ValueError(
                "banded coefficients must be non-negative with c_0 > 0 (a negative one would make "
                "the sensitivity depend on the directions of a client's updates, which this "
                f"accountant does not bound), got {self.coefficients!r}"
            )

    @classmethod
    def sqrt_prefix(cls, bands: int) -> BandedNoise:
        """The banded square-root factorisation with ``bands`` bands."""
        return cls(tuple(float(c) for c in sqrt_prefix_coefficients(bands)))

    @property
    def bands(self) -> int:
        return len(self.coefficients)

    def rows_released_at(self, round_id: int) -> list[Row]:
        lags = np.arange(min(self.bands, round_id + 1))
        return [(round_id - lags, np.asarray(self.coefficients)[lags])]

    def stream(self) -> _BandedStream:
        return _BandedStream(np.asarray(self.coefficients, dtype=np.float64))


@dataclass
class _BandedStream:
    coefficients: np.ndarray
    next_round: int = 0
    past: deque = field(default_factory=deque)  # w_{t-1}, w_{t-2}, ... (at most b - 1)

    def residual(self, round_id: int, draw: Draw) -> np.ndarray:
        _check_next(self.next_round, round_id)
        self.next_round += 1
        value = draw()
        for coefficient, earlier in zip(self.coefficients[1:], self.past, strict=False):
            value = value - coefficient * earlier
        value = value / self.coefficients[0]
        self.past.appendleft(value)
        while len(self.past) > len(self.coefficients) - 1:
            self.past.pop()
        return value


def correlation_named(
    name: str, *, groups: int, bands: int | None = None, restart: int | None = None
) -> NoiseCorrelation:
    """The strategy ``name`` (:data:`CORRELATIONS`) for a schedule of ``groups`` groups.

    ``"tree"`` restarts every ``restart`` rounds (default ``groups``: once per pass over the
    groups, every client once per tree; the run's length: one tree, no restart);
    ``"banded"`` takes ``bands`` bands (default ``groups``; more than ``groups`` is allowed, the
    sensitivity is then computed over the overlapping columns).

    Raises:
        ValueError: an unknown name, or ``bands`` (``restart``) for a strategy without them.
    """
    if name not in CORRELATIONS:
        raise ValueError(f"correlation must be one of {CORRELATIONS}, got {name!r}")
    if bands is not None and name != "banded":
        raise ValueError(f"bands={bands!r} applies to correlation 'banded', not {name!r}")
    if restart is not None and not name.startswith("tree"):
        raise ValueError(f"restart={restart!r} applies to correlation 'tree', not {name!r}")
    if name == "independent":
        return IndependentNoise()
    if name.startswith("tree"):
        estimator = "honaker" if name == "tree-honaker" else "sum"
        return TreeNoise(groups if restart is None else restart, estimator)
    return BandedNoise.sqrt_prefix(groups if bands is None else bands)


# ----------------------------------------------------------------------------- accounting
@dataclass
class SensitivityTracker:
    """``||Q_{<=t} 1_{P_g}||^2`` per group as rows of ``Q`` are released (module docstring).

    Attributes:
        correlation: the strategy.
        participation: the schedule.
    """

    correlation: NoiseCorrelation
    participation: CyclicParticipation
    per_group: np.ndarray = field(init=False)
    next_round: int = 0

    def __post_init__(self) -> None:
        self.per_group = np.zeros(self.participation.groups)

    @property
    def squared(self) -> float:
        """``Delta^2`` of what has been released so far (the worst group's)."""
        return float(self.per_group.max())

    def after(self, round_id: int) -> np.ndarray:
        """The per-group squared norms once ``round_id``'s rows are released (nothing changes)."""
        _check_next(self.next_round, round_id)
        added = np.zeros(self.participation.groups)
        for rounds, coefficients in self.correlation.rows_released_at(round_id):
            present = self.participation.indicator(rounds)
            added += (present @ coefficients) ** 2
        return self.per_group + added

    def increment(self, round_id: int) -> float:
        """``Delta_t^2 - Delta_{t-1}^2`` for releasing ``round_id`` (nothing changes)."""
        return float(self.after(round_id).max()) - self.squared

    def release(self, round_id: int) -> float:
        """Record ``round_id``'s rows as released; return the increment of ``Delta^2``."""
        updated = self.after(round_id)
        increment = float(updated.max()) - self.squared
        self.per_group = updated
        self.next_round += 1
        return increment


def total_sensitivity_sq(
    correlation: NoiseCorrelation, participation: CyclicParticipation, rounds: int
) -> float:
    """``Delta_T^2`` of a whole run of ``rounds`` rounds (the calibration's)."""
    tracker = SensitivityTracker(correlation, participation)
    for round_id in range(int(rounds)):
        tracker.release(round_id)
    return tracker.squared


def step_multiplier(noise_multiplier: float, increment: float) -> float | None:
    """The Gaussian step the ledger is charged for a release that adds ``increment`` to
    ``Delta^2``: multiplier ``sigma / sqrt(increment)``; ``None`` when nothing is added."""
    if increment <= 1e-12:
        return None
    return float(noise_multiplier) / math.sqrt(increment)


def residual_matrix(correlation: NoiseCorrelation, rounds: int) -> np.ndarray:
    """``M`` with ``w = M z``: the per-round noise as a map of the i.i.d. draws, in draw order
    (a ``(rounds, draws)`` matrix, found by running the stream on unit vectors)."""
    basis: list[np.ndarray] = []
    capacity = 2 * int(rounds) + 1

    def draw() -> np.ndarray:
        unit = np.zeros(capacity)
        unit[len(basis)] = 1.0
        basis.append(unit)
        return unit

    stream = correlation.stream()
    rows = [stream.residual(t, draw) for t in range(int(rounds))]
    return np.stack(rows)[:, : len(basis)]


def prefix_noise_covariance(correlation: NoiseCorrelation, rounds: int) -> np.ndarray:
    """The covariance of the prefix sums' noise ``sum_{s<=t} w_s`` over ``sigma^2 clip^2``:
    ``(L M)(L M)^T`` with ``L`` the lower-triangular ones (prefix-sum) matrix."""
    prefix = np.cumsum(residual_matrix(correlation, rounds), axis=0)
    return prefix @ prefix.T
