"""White-box canaries for federated updates, and an epsilon *estimate* where the noise is Gaussian.

Andrew, Kairouz, Oh, Oprea, McMahan and Suriyakumar, "One-shot Empirical Privacy Estimation
for Federated Learning" (ICLR 2024); specs/private-learning.md. The scheme:

1. **Canary clients.** ``m`` extra clients each upload a crafted update: ``norm`` times a fixed
   random unit direction ``c_j`` (isotropic, independent of the data; :func:`canary_directions`
   draws a Haar-random orthonormal set, so canaries do not cross-talk). ``m'`` more directions
   are drawn and never inserted (the held-out ones).
2. **Schedules** (:func:`canary_schedule`). *Constant* canaries submit in every round.
   *Alternating* canaries submit in the rounds of one parity and zeros in the others: against
   the contrast ``D = sum_t a_t R_t`` of the released aggregates ``R_t`` (``a_t = +1`` in even
   rounds, ``-1`` in odd ones), correct noise stays, but noise reused across rounds cancels and
   leaves the canaries in the clear. The integer mechanisms add their noise after a public
   per-round rotation; there the contrast is also taken in the rotated basis
   (:func:`rotated_statistics`, family ``"alternating-rotated"``).
3. **Statistics** (:func:`cosine_statistics`). Each direction's cosine with the final model
   delta ``sum_t R_t`` (constant family) or with ``D`` (alternating family, sign by phase), for
   two observers: the released model's (the released aggregates) and the server's (what it
   decoded: the clean sum under central DP, the noisy one under secure aggregation). Where the
   server reads each client's payload in the clear and the view kept them (local DP, built with
   ``keep_payloads=RoundSelection(every=True)``), the server also scores each constant canary
   on its own payloads (:func:`own_payload_statistics`, family ``"own-payloads"``).
4. **Estimate** (:func:`gdp_estimate`). The held-out cosines are the null: mean 0 exactly (a
   Haar direction and its negative are equally likely, whatever the noise), spread ``s``. The
   inserted ones shift by ``mu``; under a Gaussian mechanism the test "inserted or not" is a
   Gaussian trade-off with ``mu_gdp = mean(inserted) / s``, turned into epsilon at delta by
   Dong, Roth and Su's formula (Corollary 2.13; :func:`~securefed.audit.empirical.
   gaussian_epsilon`). The confidence interval is the delta method's (normal, one-sided limits
   at ``confidence``). It is an **estimate**: exact for the Gaussian mechanism as the number of
   canaries grows, *not* a rigorous lower bound for other mechanisms. Its spread in ``mu`` is
   ``1 / sqrt(m)`` (the canaries' own noise): with 1000 canaries at epsilon 1 most of the gap
   to a noise multiplier overstated 1.5x. Hence a second estimate, family ``"noise"``
   (:func:`noise_estimate`): the *declared* sensitivity (clip times rounds) over the noise
   measured along the held-out directions (which cost no client), exact chi-square limits,
   ``~ 1 / sqrt(2 m')`` relative. It measures the noise that really went in; the mean-shift
   family measures the sensitivity (a clip that does not act).
5. **Rigorous bound** (optional, :func:`run_whitebox_audit` ``rigorous=True``): a second run
   whose canaries are each included with probability 1/2, scored by the same cosine, and
   bounded by the one-run theorem of Steinke, Nasr and Jagielski (2023)
   (:func:`~securefed.audit.empirical.audit_scores`): valid for any mechanism, weaker.

A run *contradicts* its ledger when an estimate's lower limit exceeds the ledger's epsilon for
its observer, Holm-corrected across the estimates of the run (two families times the observers
with a finite ledger figure; :func:`~securefed.audit.empirical.holm_rejections`).

The canaries drive a transport's real aggregation rounds (:func:`run_canary_rounds`: the real
clip, noise, secure aggregation and ledger), with only the canary clients taking part: the
other clients' updates are independent of the directions and would only widen the null, so this
is the auditor's most favourable case, and fast enough to repeat over many seeds.

Hooks for models: :class:`CanaryHook` inserts the same canaries into any aggregation round of a
model of the user's (a ``securefed.torch`` model's flattened update, FedMF's item-gradient
block, FedHPD's distributions), by submitting the canary clients' updates next to the real ones.

Example:
    >>> from securefed.transport import build_transport
    >>> cfg = WhiteBoxConfig(n_constant=60, n_alternating=20, n_held_out=100, rounds=2)
    >>> transport = build_transport(
    ...     "dp", {"epsilon": 1.0}, total_rounds=2, n_clients=cfg.n_canaries
    ... )
    >>> report = run_whitebox_audit(cfg, lambda: transport, seed=0)
    >>> sorted(report.estimates)[:1]
    ['released_model/alternating']
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
from scipy import optimize, stats

from securefed.audit.empirical import (
    EmpiricalAuditConfig,
    EmpiricalAuditResult,
    audit_scores,
    draw_inclusions,
    gaussian_epsilon,
    holm_rejections,
)
from securefed.randomness import SeedTree
from securefed.transport.base import AggregationRound, RowUpdates, Transport
from securefed.transport.ddp import hadamard, rotate, rotation_signs

FAMILIES = ("constant", "noise", "alternating", "alternating-rotated", "own-payloads", "own-noise")
WHITEBOX_OBSERVERS = ("released_model", "server")


# ----------------------------------------------------------------------------- pure functions
def canary_directions(n: int, dim: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` orthonormal rows in ``R^dim``, random and (close to) isotropic.

    ``dim`` a power of two: ``n`` random rows of the structured orthogonal matrix ``D_1 H D_2 H
    D_3 H`` (``H`` the normalised Walsh-Hadamard matrix, ``D_k`` random signs: "SORF", Yu et
    al., "Orthogonal Random Features", NeurIPS 2016), which mixes every coordinate into every
    row in ``O(n dim log dim)``. Otherwise Haar-random rows: the QR factorisation of a Gaussian
    matrix with its signs fixed by ``R``'s diagonal (Mezzadri 2007), ``O(dim n^2)`` (seconds at
    a few thousand; minutes on a loaded 2-core box).

    Raises:
        ValueError: ``n`` not in ``1..dim``.
        TypeError: ``rng`` is not a numpy Generator.
    """
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy Generator, got {type(rng).__name__}")
    if not 1 <= n <= dim:
        raise ValueError(f"{n} orthonormal directions need 1 <= n <= dim = {dim}")
    if dim & (dim - 1) == 0:
        rows = np.zeros((n, dim))
        rows[np.arange(n), rng.permutation(dim)[:n]] = 1.0
        for _ in range(3):
            rows = hadamard(rows * np.where(rng.random(dim) < 0.5, -1.0, 1.0))
        return rows
    q, r = np.linalg.qr(rng.standard_normal((dim, n)))
    return (q * np.sign(np.diag(r))).T


def canary_schedule(n_constant: int, n_alternating: int, rounds: int) -> np.ndarray:
    """``(n_constant + n_alternating, rounds)`` booleans: who submits its direction when.

    Constant canaries every round; alternating canary ``k`` in the rounds of parity ``k % 2``.
    """
    if n_constant < 0 or n_alternating < 0 or n_constant + n_alternating < 1 or rounds < 1:
        raise ValueError("a schedule needs canaries and rounds")
    constant = np.ones((n_constant, rounds), dtype=bool)
    parity = (np.arange(rounds)[None, :] % 2) == (np.arange(n_alternating)[:, None] % 2)
    return np.vstack([constant, parity])


def round_contrast(rounds: int) -> np.ndarray:
    """``a_t = +1`` in even rounds, ``-1`` in odd ones (sums to 0 over an even number)."""
    return np.where(np.arange(rounds) % 2 == 0, 1.0, -1.0)


def cosines(directions: np.ndarray, vector: np.ndarray) -> np.ndarray:
    """The cosine of each row of ``directions`` (unit rows) with ``vector`` (0 if it is 0)."""
    norm = float(np.linalg.norm(vector))
    if norm == 0:
        return np.zeros(len(directions))
    return directions @ np.asarray(vector, dtype=np.float64) / norm


def cosine_statistics(
    directions: np.ndarray, held_out: np.ndarray, per_round: np.ndarray, n_constant: int
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{family: (inserted cosines, held-out cosines)}`` against one observer's rounds.

    ``per_round`` is ``(rounds, dim)``: what the observer read in each round. Constant family:
    cosines with ``sum_t R_t`` (the final model delta). Alternating family: cosines with the
    contrast ``sum_t a_t R_t``, each canary's sign by its phase (+ for even rounds).
    """
    rounds = per_round.shape[0]
    total = per_round.sum(axis=0)
    contrast = round_contrast(rounds) @ per_round
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    if n_constant:
        out["constant"] = (cosines(directions[:n_constant], total), cosines(held_out, total))
    n_alternating = len(directions) - n_constant
    if n_alternating and rounds >= 2:
        phase = np.where(np.arange(n_alternating) % 2 == 0, 1.0, -1.0)
        inserted = phase * cosines(directions[n_constant:], contrast)
        out["alternating"] = (inserted, cosines(held_out, contrast))
    return out


def rotated_statistics(
    directions: np.ndarray,
    held_out: np.ndarray,
    per_round: np.ndarray,
    rotations: list[tuple[np.ndarray, tuple[int, ...], int]],
    n_constant: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Alternating canaries' statistics in an integer mechanism's rotated basis.

    The distributed discrete Gaussian and Skellam add their noise *after* a public per-round
    rotation (:mod:`securefed.transport.ddp`): noise reused across rounds is the same in the
    rotated basis, not in the model's, so the contrast must be taken there. Each round's
    release is rotated with that round's public signs (``rotations[t] = (signs, chunks,
    padded)``); ``V = sum_t a_t rot_t(R_t)``, and a direction's statistic is ``<u, V> / ||u||``
    with ``u = sum_{t in its rounds} a_t rot_t(c)`` (held-out directions take the phases in
    turn, as the canaries do).
    """
    rounds, dim = per_round.shape
    contrast = round_contrast(rounds)

    def rotated(rows: np.ndarray, t: int) -> np.ndarray:
        signs, chunks, padded = rotations[t]
        out = np.zeros((rows.shape[0], padded))
        out[:, :dim] = rows
        return rotate(out, signs, chunks)

    total = sum(contrast[t] * rotated(per_round[t : t + 1], t)[0] for t in range(rounds))

    def statistics(rows: np.ndarray) -> np.ndarray:
        phase = np.arange(len(rows)) % 2
        u = sum(
            np.where((phase == t % 2)[:, None], contrast[t] * rotated(rows, t), 0.0)
            for t in range(rounds)
        )
        return (u @ total) / np.maximum(np.linalg.norm(u, axis=1), 1e-300)

    return statistics(directions[n_constant:]), statistics(held_out)


def own_payload_statistics(
    directions: np.ndarray, held_out: np.ndarray, own: np.ndarray, n_constant: int
) -> tuple[np.ndarray, np.ndarray]:
    """Constant canaries scored on their own clear payloads (the server under local DP).

    Canary ``j``: ``<c_j, sum_t P_jt>``, its payloads summed over the rounds. The null: held-out
    direction ``i`` against constant canary ``i mod n_constant``'s summed payloads (orthogonal
    to that canary's direction, so only its noise projects). Projections, not cosines: every
    payload sum has the same scale.
    """
    inserted = np.einsum("jd,jd->j", directions[:n_constant], own[:n_constant])
    partner = own[np.arange(len(held_out)) % n_constant]
    return inserted, np.einsum("id,id->i", held_out, partner)


def gaussian_mu(epsilon: float, delta: float) -> float:
    """The ``mu`` of the Gaussian mechanism that is ``(epsilon, delta)``-DP (inverse of
    :func:`~securefed.audit.empirical.gaussian_epsilon`; ``inf`` for an infinite epsilon)."""
    if not math.isfinite(epsilon):
        return math.inf
    if epsilon <= 0:
        return 0.0
    high = 1.0
    while gaussian_epsilon(high, delta) < epsilon:
        if high > MU_CAP:
            return math.inf
        high *= 2
    return float(optimize.brentq(lambda m: gaussian_epsilon(m, delta) - epsilon, 1e-9, high))


@dataclass(frozen=True)
class GaussianDPEstimate:
    """An epsilon *estimate* under Gaussian DP from inserted and held-out canary statistics.

    Attributes:
        mu, mu_low, mu_high: the estimated ``mu_gdp`` and its one-sided confidence limits.
        epsilon, epsilon_low, epsilon_high: the same as epsilon at ``delta``.
        confidence, delta: as asked.
        n_inserted, n_held_out: the statistics it rests on.
        null_spread: the held-out statistics' spread ``s`` (mean 0 by isotropy).
    """

    mu: float
    mu_low: float
    mu_high: float
    epsilon: float
    epsilon_low: float
    epsilon_high: float
    confidence: float
    delta: float
    n_inserted: int
    n_held_out: int
    null_spread: float
    method: str = "mean-shift"

    def __post_init__(self) -> None:
        if self.method not in ESTIMATE_METHODS:
            raise ValueError(f"method must be one of {ESTIMATE_METHODS}, got {self.method!r}")

    def p_value(self, epsilon_ledger: float | None) -> float:
        """One-sided p-value of "mu_gdp is at most the ledger's" (1 without a finite figure).

        Mean shift: the delta method's normal approximation. Declared sensitivity: exact under
        Gaussian noise, ``P[chi2_n' <= n' (mu_ledger / mu)^2]`` (:func:`noise_estimate`).
        """
        if epsilon_ledger is None or not math.isfinite(epsilon_ledger):
            return 1.0
        mu_ledger = gaussian_mu(epsilon_ledger, self.delta)
        if not math.isfinite(mu_ledger):
            return 1.0  # a ledger past MU_CAP: no estimate here can contradict it
        if self.method == "declared-sensitivity":
            if not math.isfinite(self.mu):
                return 0.0
            ratio = mu_ledger / self.mu
            return float(stats.chi2.cdf(self.n_held_out * ratio**2, self.n_held_out))
        se = (self.mu - self.mu_low) / stats.norm.ppf(self.confidence)
        if se <= 0:
            return 0.0 if self.mu > mu_ledger else 1.0
        return float(stats.norm.sf((self.mu - mu_ledger) / se))

    def to_dict(self) -> dict[str, float]:
        return {
            "kind": "estimate (Gaussian DP; not a rigorous bound)",
            "method": self.method,
            "mu": self.mu,
            "mu_low": self.mu_low,
            "mu_high": self.mu_high,
            "epsilon": self.epsilon,
            "epsilon_low": self.epsilon_low,
            "epsilon_high": self.epsilon_high,
            "confidence": self.confidence,
            "delta": self.delta,
            "n_inserted": self.n_inserted,
            "n_held_out": self.n_held_out,
        }


ESTIMATE_METHODS = ("mean-shift", "declared-sensitivity")
"""How a :class:`GaussianDPEstimate` was formed: :func:`gdp_estimate` (the canaries' mean shift
over the null's spread; Andrew et al.) or :func:`noise_estimate` (the declared sensitivity over
the null's spread)."""

MU_CAP = 40.0
"""Past this ``mu`` the estimate reports an infinite epsilon (the observer sees the canaries)."""


def _epsilon(mu: float, delta: float) -> float:
    if mu > MU_CAP:
        return math.inf
    return gaussian_epsilon(max(mu, 0.0), delta)


def gdp_estimate(
    inserted: np.ndarray, held_out: np.ndarray, *, delta: float, confidence: float = 0.95
) -> GaussianDPEstimate:
    """Estimate ``mu_gdp = mean(inserted) / s`` and its epsilon at ``delta`` (module docstring).

    ``s = sqrt(mean(held_out^2))`` (the null's mean is 0 by isotropy). Delta-method standard
    error: ``var(mu) = var(inserted) / (n s^2) + mu^2 / (2 n')``; the limits are ``mu -/+
    z se`` with ``z = Phi^-1(confidence)``, clipped at 0.

    Raises:
        ValueError: fewer than two statistics on a side, or a bad level.
    """
    inserted = np.asarray(inserted, dtype=np.float64).reshape(-1)
    held_out = np.asarray(held_out, dtype=np.float64).reshape(-1)
    if len(inserted) < 2 or len(held_out) < 2:
        raise ValueError("a Gaussian-DP estimate needs at least two inserted and two held-out")
    if not 0 < confidence < 1 or not 0 < delta < 1:
        raise ValueError(f"confidence and delta must lie in (0, 1): {confidence}, {delta}")
    spread = float(np.sqrt(np.mean(held_out**2)))
    if spread == 0:
        # No noise at all along the held-out directions: the canaries are in the clear.
        spread = math.ulp(1.0) * max(float(np.max(np.abs(inserted))), 1.0)
    mu = float(np.mean(inserted)) / spread
    se = math.sqrt(
        float(np.var(inserted, ddof=1)) / (len(inserted) * spread**2) + mu**2 / (2 * len(held_out))
    )
    z = float(stats.norm.ppf(confidence))
    low, high = max(mu - z * se, 0.0), max(mu + z * se, 0.0)
    counts = (len(inserted), len(held_out), spread)
    return _estimate((mu, low, high), confidence, delta, counts, "mean-shift")


def _estimate(
    mus: tuple[float, float, float],
    confidence: float,
    delta: float,
    counts: tuple[int, int, float],
    method: str,
) -> GaussianDPEstimate:
    """An estimate from ``(mu, low, high)``, each turned into epsilon at ``delta``."""
    mu, low, high = mus
    n_inserted, n_held_out, spread = counts
    return GaussianDPEstimate(
        mu=mu,
        mu_low=low,
        mu_high=high,
        epsilon=_epsilon(mu, delta),
        epsilon_low=_epsilon(low, delta),
        epsilon_high=_epsilon(high, delta),
        confidence=confidence,
        delta=delta,
        n_inserted=n_inserted,
        n_held_out=n_held_out,
        null_spread=spread,
        method=method,
    )


def noise_estimate(
    held_out: np.ndarray, sensitivity: float, *, delta: float, confidence: float = 0.95
) -> GaussianDPEstimate:
    """Estimate ``mu_gdp = sensitivity / s`` from the noise measured along held-out directions.

    ``held_out`` are *projections* (not cosines) of the release on ``n'`` directions orthogonal
    to every canary: under Gaussian noise of std ``sigma`` they are ``N(0, sigma^2)``, so ``n'
    s^2 / sigma^2`` is chi-square with ``n'`` degrees of freedom and the limits are exact:
    ``mu sqrt(q / n')`` with ``q`` the chi-square quantile at ``1 - confidence`` (low) and
    ``confidence`` (high). ``sensitivity`` is the *declared* one: the L2 norm that one client's
    whole contribution to the release may have (the clip times the rounds it takes part in).

    Why: the mean-shift estimate (:func:`gdp_estimate`) rests on the canaries' own statistics,
    whose mean has a spread of ``1 / sqrt(m)`` in ``mu``: with 1000 canaries at epsilon 1
    (``mu ~ 0.27``) that is most of the gap between a correct ledger and a noise multiplier
    overstated 1.5x. The held-out directions cost no client, and their spread is known to ``1 /
    sqrt(2 n')`` relative. This family measures the noise actually added, against the declared
    clip; the clip itself is what the mean-shift family (and clip-off faults) checks. Real
    clients' updates in the release (a model's canary hook) only widen the null: the estimate
    then errs low (no false alarm), never high.

    Raises:
        ValueError: fewer than two directions, a sensitivity not finite and > 0, a bad level.
    """
    held_out = np.asarray(held_out, dtype=np.float64).reshape(-1)
    if len(held_out) < 2:
        raise ValueError("a noise estimate needs at least two held-out directions")
    if not (math.isfinite(sensitivity) and sensitivity > 0):
        raise ValueError(f"the declared sensitivity must be finite and > 0, got {sensitivity!r}")
    if not 0 < confidence < 1 or not 0 < delta < 1:
        raise ValueError(f"confidence and delta must lie in (0, 1): {confidence}, {delta}")
    n = len(held_out)
    spread = float(np.sqrt(np.mean(held_out**2)))
    mu = math.inf if spread == 0 else sensitivity / spread
    low = mu * math.sqrt(float(stats.chi2.ppf(1 - confidence, n)) / n)
    high = mu * math.sqrt(float(stats.chi2.ppf(confidence, n)) / n)
    return _estimate((mu, low, high), confidence, delta, (0, n, spread), "declared-sensitivity")


# ----------------------------------------------------------------------------- configuration
@dataclass(frozen=True)
class WhiteBoxConfig:
    """The canaries of a white-box audit.

    Attributes:
        n_constant: canaries inserted in every round.
        n_alternating: canaries inserted in the rounds of one parity (catch reused noise).
        n_held_out: directions drawn and never inserted (the null; they cost no client).
        rounds: aggregation rounds (even, so that the contrast cancels reused noise).
        norm: each canary's update norm, above the DP clip (so that the clip must act).
        dim: the update's dimension (``None``: the canaries and held-out directions, rounded
            up to a power of two, for the fast directions of :func:`canary_directions`).
        confidence: of the estimates' limits and of the rigorous bound.
        delta: the delta of every epsilon reported (the ledger's).
    """

    n_constant: int = 980
    n_alternating: int = 20
    n_held_out: int = 1000
    rounds: int = 4
    norm: float = 10.0
    dim: int | None = None
    confidence: float = 0.95
    delta: float = 1e-5

    def __post_init__(self) -> None:
        if self.n_constant < 2 or self.n_alternating < 0 or self.n_held_out < 2:
            raise ValueError("need at least 2 constant canaries and 2 held-out directions")
        if self.n_alternating and (self.rounds < 2 or self.rounds % 2):
            raise ValueError(
                f"alternating canaries need an even number of rounds, got {self.rounds}"
            )
        if self.rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {self.rounds}")
        if not (math.isfinite(self.norm) and self.norm > 0):
            raise ValueError(f"norm must be finite and > 0, got {self.norm!r}")
        if self.dim is not None and self.dim < self.n_directions:
            raise ValueError(
                f"dim {self.dim} holds fewer than the {self.n_directions} orthonormal directions"
            )
        if not 0 < self.confidence < 1 or not 0 < self.delta < 1:
            raise ValueError("confidence and delta must lie in (0, 1)")

    @property
    def n_canaries(self) -> int:
        """Canary clients (inserted in at least one round)."""
        return self.n_constant + self.n_alternating

    @property
    def n_directions(self) -> int:
        return self.n_canaries + self.n_held_out

    @property
    def dimension(self) -> int:
        return self.dim if self.dim is not None else 1 << (self.n_directions - 1).bit_length()


# ----------------------------------------------------------------------------- the hook
@dataclass(frozen=True, eq=False)
class CanaryHook:
    """Inserts canary clients into a model's aggregation rounds (the documented hook).

    A model that flattens its update to ``dim`` values per client (``securefed.torch``'s
    ``flatten`` of a state dict's delta, FedMF's item-gradient block, FedHPD's action
    distributions) calls :meth:`submit` on each round it opens, after its own clients have
    submitted and before ``result()``; the canary clients' ids are ``first_client + k``. Who
    takes part is public; what a canary sends is its direction times ``norm`` in its scheduled
    rounds and zeros otherwise.

    Attributes:
        directions: ``(n, dim)`` unit rows (:func:`canary_directions`).
        schedule: ``(n, rounds)`` booleans (:func:`canary_schedule`).
        norm: the crafted update's norm.
        first_client: the first canary client id (after the model's own clients).
        shape: the round's block shape (``rows * width == dim``).
    """

    directions: np.ndarray
    schedule: np.ndarray
    norm: float
    first_client: int
    shape: tuple[int, int]

    def __post_init__(self) -> None:
        if self.directions.shape[0] != self.schedule.shape[0]:
            raise ValueError("one schedule row per canary direction")
        if self.shape[0] * self.shape[1] != self.directions.shape[1]:
            raise ValueError(f"block {self.shape} does not hold {self.directions.shape[1]} values")

    @property
    def clients(self) -> np.ndarray:
        return self.first_client + np.arange(len(self.directions))

    def extra_clients(self, round_id: int) -> np.ndarray:
        """The canary clients (every round: who takes part is public)."""
        return self.clients

    def updates(self, round_index: int, *, weighted: bool = False) -> RowUpdates:
        """The canary clients' dense updates of round ``round_index`` (of the schedule); with
        ``weighted``, each with aggregation weight 1 (for rounds whose clients send weights)."""
        n = len(self.directions)
        rows, width = self.shape
        on = self.schedule[:, round_index % self.schedule.shape[1]]
        values = (self.directions * (self.norm * on)[:, None]).reshape(n * rows, width)
        return RowUpdates(
            self.clients.astype(np.int64),
            np.arange(n + 1, dtype=np.int64) * rows,
            np.tile(np.arange(rows, dtype=np.int64), n),
            values,
            rows,
            True,
            np.ones(n) if weighted else None,
        )

    def submit(self, rnd: AggregationRound, round_index: int, *, weighted: bool = False) -> None:
        """Submit the canary clients' updates of ``round_index`` to an open round."""
        rnd.submit_batch(self.updates(round_index, weighted=weighted))


# ----------------------------------------------------------------------------- the driver
def observed_sum(transport: Transport, round_id: int, released: np.ndarray) -> np.ndarray:
    """What the server decoded in a round: ``aggregate["total"]`` (the clean sum under central
    DP, the noisy one under a float mechanism), except under an integer mechanism, whose
    ``total`` is the ring sum of rotated integers: the server decodes it to the released sum."""
    mechanism = getattr(getattr(transport, "config", None), "mechanism", "gaussian")
    total = transport.view.round(round_id).aggregate.get("total")
    if total is None or mechanism != "gaussian" or np.size(total) != np.size(released):
        return released
    return np.asarray(total, dtype=np.float64).reshape(-1)


@dataclass(frozen=True, eq=False)
class CanaryRun:
    """What the observers read in a run of canary rounds.

    Attributes:
        released: ``(rounds, dim)``: each round's released aggregate.
        server: ``(rounds, dim)``: what the server decoded (:func:`observed_sum`).
        rotations: per round, an integer mechanism's public rotation ``(signs, chunks,
            padded)`` (``None`` for the float Gaussian).
        own: ``(n_canaries, dim)``: each canary's clear payloads summed over the rounds, where
            the view kept them in the clear (local DP: its noisy uploads), else ``None``.
    """

    released: np.ndarray
    server: np.ndarray
    rotations: list[tuple[np.ndarray, tuple[int, ...], int]] | None
    own: np.ndarray | None = None


def clear_payload(view_round, client: int, dim: int) -> np.ndarray | None:
    """The client's payload as the server read it in the clear (``dim`` values), else ``None``
    (a round that kept no payloads, or a hiding transport's masked or encrypted one)."""
    if not getattr(view_round, "keep_payloads", False) or client not in view_round.payloads:
        return None
    values = view_round.payloads[client].get("values")
    if values is None or np.size(values) != dim:
        return None
    return np.asarray(values, dtype=np.float64).reshape(-1)


def run_canary_rounds(
    transport: Transport, hook: CanaryHook, rounds: int, seeds: SeedTree
) -> CanaryRun:
    """Run ``rounds`` aggregation rounds of the canary clients alone through ``transport``.

    An integer mechanism's rotation signs come from the round's public seed
    (``seeds.key("dp", "rotation", round_id)``), as every observer can derive them.
    """
    dim = hook.directions.shape[1]
    released, server = np.zeros((rounds, dim)), np.zeros((rounds, dim))
    rotations = []
    own = np.zeros((len(hook.directions), dim))
    clear = True
    clients = hook.clients
    for t in range(rounds):
        rnd = transport.open_round(t, clients, shape=hook.shape, seeds=seeds)
        hook.submit(rnd, t)
        released[t] = np.asarray(rnd.result().total, dtype=np.float64).reshape(-1)
        server[t] = observed_sum(transport, t, released[t])
        view_round = transport.view.round(t)
        for k, client in enumerate(clients.tolist()):
            payload = clear_payload(view_round, client, dim) if clear else None
            if payload is None:
                clear = False
                break
            own[k] += payload
        mechanism = getattr(rnd, "mechanism", None)
        if mechanism is not None:
            signs = rotation_signs(seeds.key("dp", "rotation", t), mechanism.padded)
            rotations.append((signs, mechanism.chunks, mechanism.padded))
    return CanaryRun(released, server, rotations or None, own if clear else None)


def ledger_epsilon(transport: Transport, observer: str) -> float:
    """The transport's ledger epsilon against ``observer`` (``inf`` without a ledger)."""
    if getattr(transport, "ledger", None) is None:
        return math.inf
    value = transport.epsilon(against=observer)
    return math.inf if value is None else float(value)


@dataclass(frozen=True, eq=False)
class WhiteBoxReport:
    """A white-box audit's figures: estimates per observer and family, the rigorous bound.

    Attributes:
        estimates: ``{"observer/family": GaussianDPEstimate}`` (estimates, not bounds).
        epsilon_ledger: the ledger's epsilon per observer.
        delta_ledger: the ledger's delta (``None`` without DP).
        contradicted: ``{"observer/family": bool}``: the estimate's lower limit exceeds the
            ledger, Holm-corrected across the estimates with a finite ledger figure.
        rigorous: the one-run lower bound per observer (``rigorous=True``), else empty.
        config: the canaries.
    """

    estimates: dict[str, GaussianDPEstimate]
    epsilon_ledger: dict[str, float]
    delta_ledger: float | None
    contradicted: dict[str, bool]
    rigorous: dict[str, EmpiricalAuditResult] = field(default_factory=dict)
    config: WhiteBoxConfig | None = None

    @property
    def caught(self) -> bool:
        """Whether any estimate contradicts its ledger (after the correction)."""
        return any(self.contradicted.values())

    def to_dict(self) -> dict[str, object]:
        return {
            "estimates": {k: v.to_dict() for k, v in self.estimates.items()},
            "epsilon_ledger": self.epsilon_ledger,
            "delta_ledger": self.delta_ledger,
            "contradicted": self.contradicted,
            "caught": self.caught,
            "rigorous_lower_bound": {
                k: {"kind": "rigorous lower bound (Steinke et al. 2023)", **v.to_dict()}
                for k, v in self.rigorous.items()
            },
        }


def _hook(config: WhiteBoxConfig, seeds: SeedTree) -> tuple[CanaryHook, np.ndarray]:
    directions = canary_directions(
        config.n_directions, config.dimension, seeds.generator("whitebox", "directions")
    )
    hook = CanaryHook(
        directions[: config.n_canaries],
        canary_schedule(config.n_constant, config.n_alternating, config.rounds),
        config.norm,
        0,
        (1, config.dimension),
    )
    return hook, directions[config.n_canaries :]


def declared_clip(transport: Transport) -> float | None:
    """The per-client L2 clip the transport declares (``None``: it declares none)."""
    clip = getattr(getattr(transport, "config", None), "clip", None)
    return None if clip is None else float(clip)


def declared_sensitivity(transport: Transport, config: WhiteBoxConfig) -> float | None:
    """The L2 norm of one constant canary's whole contribution to the summed release, as the
    transport declares it: its update at the clip (it is above it) in each of the rounds."""
    clip = declared_clip(transport)
    return None if clip is None else min(config.norm, clip) * config.rounds


def constant_contribution(
    transport: Transport, hook: CanaryHook, config: WhiteBoxConfig
) -> np.ndarray:
    """What the constant canaries add to every round as the protocol says: each its direction
    at the transport's clip (its update is above it).

    In the rotated basis the constant canaries do not cancel across rounds (each round rotates
    them differently); the auditor, who crafted them, removes their declared contribution
    before the rotated contrast (:func:`rotated_statistics`). Should the clip not act as
    declared, the remainder widens that family's null alike; the constant family sees the fault.
    """
    clip = declared_clip(transport)
    if clip is None:
        return np.zeros(hook.directions.shape[1])
    return min(config.norm, clip) * hook.directions[: config.n_constant].sum(axis=0)


def run_whitebox_audit(
    config: WhiteBoxConfig,
    make_transport: Callable[[], Transport],
    *,
    seed: int,
    rigorous: bool = False,
) -> WhiteBoxReport:
    """Estimate epsilon from one run of canary clients through a fresh transport.

    Args:
        config: the canaries.
        make_transport: builds the transport to audit (fresh: its ledger starts empty), for
            ``config.n_canaries`` clients and ``config.rounds`` rounds.
        seed: the seed of the run (directions, noise in seeded mode).
        rigorous: also run the one-run lower bound (a second run, each constant canary
            included with probability 1/2).

    Raises:
        ValueError: the audit's delta is not the ledger's (the figures would not compare).
    """
    seeds = SeedTree(seed)
    hook, held_out = _hook(config, seeds)
    transport = make_transport()
    delta_ledger = check_delta(transport, config)
    run = run_canary_rounds(transport, hook, config.rounds, seeds)
    ledger = {o: ledger_epsilon(transport, o) for o in WHITEBOX_OBSERVERS}
    estimates = run_estimates(run, hook, held_out, config, transport)
    contradicted = contradictions(estimates, ledger, config)
    bounds = _rigorous(config, make_transport, seeds, hook) if rigorous else {}
    return WhiteBoxReport(estimates, ledger, delta_ledger, contradicted, bounds, config)


def run_estimates(
    run: CanaryRun,
    hook: CanaryHook,
    held_out: np.ndarray,
    config: WhiteBoxConfig,
    transport: Transport,
) -> dict[str, GaussianDPEstimate]:
    """Every family's estimate for each observer of a run of canary rounds (module docstring):
    ``"observer/family"`` -> :class:`GaussianDPEstimate`. The noise families need the
    transport's declared clip (without one they are left out)."""
    sensitivity = declared_sensitivity(transport, config)
    estimates = {}
    for observer, per_round in {"released_model": run.released, "server": run.server}.items():
        if sensitivity is not None:
            estimates[f"{observer}/noise"] = noise_estimate(
                held_out @ per_round.sum(axis=0),
                sensitivity,
                delta=config.delta,
                confidence=config.confidence,
            )
        families = cosine_statistics(hook.directions, held_out, per_round, config.n_constant)
        if run.rotations is not None and config.n_alternating and config.rounds >= 2:
            families["alternating-rotated"] = rotated_statistics(
                hook.directions,
                held_out,
                per_round - constant_contribution(transport, hook, config),
                run.rotations,
                config.n_constant,
            )
        if observer == "server" and run.own is not None:
            families["own-payloads"] = own_payload_statistics(
                hook.directions, held_out, run.own, config.n_constant
            )
            if sensitivity is not None:
                estimates["server/own-noise"] = noise_estimate(
                    families["own-payloads"][1],
                    sensitivity,
                    delta=config.delta,
                    confidence=config.confidence,
                )
        for family, (inserted, null) in families.items():
            estimates[f"{observer}/{family}"] = gdp_estimate(
                inserted, null, delta=config.delta, confidence=config.confidence
            )
    return estimates


def check_delta(transport: Transport, config: WhiteBoxConfig) -> float | None:
    """The ledger's delta (``None`` without DP), after checking that it is the audit's.

    Raises:
        ValueError: the audit's delta is not the ledger's (the figures would not compare).
    """
    delta_ledger = getattr(transport, "delta", None) if getattr(transport, "ledger", None) else None
    if delta_ledger is not None and not math.isclose(delta_ledger, config.delta, rel_tol=1e-9):
        raise ValueError(
            f"the audit's delta {config.delta:g} is not the ledger's {delta_ledger:g}: estimates "
            "at another delta do not compare with the ledger's epsilon"
        )
    return delta_ledger


def contradictions(
    estimates: Mapping[str, GaussianDPEstimate],
    ledger: Mapping[str, float],
    config: WhiteBoxConfig,
) -> dict[str, bool]:
    """Which estimates' lower limits exceed their observer's ledger epsilon, corrected together.

    Weighted Holm (:func:`~securefed.audit.empirical.holm_rejections`) over the estimates whose
    observer has a finite ledger figure (the others cannot contradict it): each constant,
    noise and own-payload family weighs ``config.n_constant``, each alternating one
    ``config.n_alternating`` (a family's
    power grows with its canaries; reused noise makes the alternating one's signal huge, so a
    small share of the level suffices).
    """
    finite = [k for k in estimates if math.isfinite(ledger[k.split("/")[0]])]
    out = dict.fromkeys(estimates, False)
    if not finite:
        return out
    p_values = [estimates[k].p_value(ledger[k.split("/")[0]]) for k in finite]
    alternating = max(config.n_alternating, 1)
    sizes = {
        "constant": config.n_constant,
        "noise": config.n_constant,
        "own-noise": config.n_constant,
        "alternating": alternating,
        "alternating-rotated": alternating,
        "own-payloads": config.n_constant,
    }
    weights = [sizes[k.split("/")[1]] for k in finite]
    rejected = holm_rejections(p_values, 1.0 - config.confidence, weights)
    out.update(zip(finite, rejected.tolist(), strict=True))
    return out


def inclusion_hook(hook: CanaryHook, rounds: int, rng: np.random.Generator):
    """The hook of the rigorous bound's run: each canary in every round with probability 1/2
    (:func:`~securefed.audit.empirical.draw_inclusions`), else in none. Returns ``(hook,
    included)``."""
    included = draw_inclusions(len(hook.directions), rng)
    schedule = np.repeat(included[:, None], rounds, axis=1)
    return CanaryHook(hook.directions, schedule, hook.norm, hook.first_client, hook.shape), included


def rigorous_bounds(
    run: CanaryRun,
    directions: np.ndarray,
    included: np.ndarray,
    config: WhiteBoxConfig,
    transport: Transport,
) -> dict[str, EmpiricalAuditResult]:
    """The one-run lower bound (Steinke, Nasr and Jagielski 2023) of a run whose canaries were
    each included with probability 1/2: each scored by its cosine with the summed release, per
    observer. Valid for any mechanism (a bound, not an estimate)."""
    audit = EmpiricalAuditConfig(
        n_canaries=len(included), confidence=config.confidence, delta=config.delta
    )
    out = {}
    for observer, per_round in {"released_model": run.released, "server": run.server}.items():
        out[observer] = audit_scores(
            cosines(directions, per_round.sum(axis=0)),
            included,
            audit,
            observer=observer,
            epsilon_ledger=ledger_epsilon(transport, observer),
            description="white-box canaries: cosine with the final model delta",
            delta_ledger=config.delta,
        )
    return out


def _rigorous(
    config: WhiteBoxConfig, make_transport: Callable[[], Transport], seeds: SeedTree, hook
) -> dict[str, EmpiricalAuditResult]:
    """The one-run bound: a second run, each canary included with probability 1/2."""
    half, included = inclusion_hook(hook, config.rounds, seeds.generator("whitebox", "inclusions"))
    transport = make_transport()
    second = SeedTree(int(seeds.generator("whitebox", "second run").integers(1 << 62)))
    run = run_canary_rounds(transport, half, config.rounds, second)
    return rigorous_bounds(run, hook.directions, included, config, transport)


def report_rows(reports: Mapping[str, WhiteBoxReport]) -> list[dict[str, object]]:
    """Flat rows (one per report and estimate) for tables."""
    rows = []
    for name, report in reports.items():
        for key, estimate in report.estimates.items():
            observer, family = key.split("/")
            rows.append(
                {
                    "run": name,
                    "observer": observer,
                    "family": family,
                    "epsilon_ledger": report.epsilon_ledger[observer],
                    "epsilon_estimate": estimate.epsilon,
                    "epsilon_estimate_low": estimate.epsilon_low,
                    "contradicts_ledger": report.contradicted[key],
                    "epsilon_lower_bound": report.rigorous[observer].epsilon_lower
                    if observer in report.rigorous
                    else None,
                }
            )
    return rows


def estimate_from_model_delta(
    directions: np.ndarray,
    held_out: np.ndarray,
    model_delta: np.ndarray,
    *,
    delta: float,
    confidence: float = 0.95,
) -> GaussianDPEstimate:
    """The released-model observer's estimate from a final model delta (constant canaries).

    ``model_delta`` is the final parameters minus the initial ones, flattened as the canaries'
    directions (e.g. ``securefed.torch.module_to_vector``); the real clients' updates are
    independent of the directions and widen the null alike (Andrew et al. 2024, section 3).
    """
    vector = np.asarray(model_delta, dtype=np.float64).reshape(-1)
    return gdp_estimate(
        cosines(directions, vector), cosines(held_out, vector), delta=delta, confidence=confidence
    )
