"""Auditing privacy by measurement: canaries in one run, and an epsilon lower bound from guesses.

The parameter audit (:mod:`securefed.audit.findings`) reads what a run *declares*; it cannot tell
whether the noise really went in. This module measures instead, with the one-run scheme of
Steinke, Nasr and Jagielski 2023, "Privacy Auditing with One (1) Training Run" (NeurIPS 2023):

1. **Canaries.** ``m`` canaries (users, or crafted updates) are each included in the run
   independently with probability 1/2 (:func:`draw_inclusions`, from an explicit generator).
2. **One run.** The federated job runs once with the included canaries (a callable of the
   caller's: ``run_job(included) -> observation``).
3. **Scores.** Each canary gets a score from what one observer sees (``score(observation, i)``:
   white-box on the server's view, or black-box on the released model); higher means "more
   likely included".
4. **Guesses.** The auditor guesses "included" for the ``k+`` highest scores and "excluded" for
   the ``k-`` lowest, and abstains on the rest (:func:`guesses_from_scores`).
5. **Bound.** If the mechanism is ``(epsilon, delta)``-DP towards that observer, the number ``W``
   of correct guesses among ``r = k+ + k-`` is dominated by a Binomial with success probability
   ``p = e^epsilon / (1 + e^epsilon)``, up to a delta term (their main theorem):

       P[W >= v] <= f(v) + 2 m delta * max_{i = 1..m} (f(v - i) - f(v)) / i,
       f(v) = P[Binomial(r, p) >= v].

   Observing ``v`` correct guesses, every ``epsilon`` whose bound falls below ``beta = 1 -
   confidence`` is rejected; the lower bound is the smallest epsilon that is not
   (:func:`epsilon_lower_bound`). Several guess counts are tried, each at ``beta / (number
   tried)`` (Bonferroni), so that choosing the best of them keeps the stated confidence.

Several scorers audit the same run: each one's test of "the ledger's epsilon holds towards my
observer" has a p-value (:func:`ledger_p_value`), and :func:`check_against_ledger` fails only
on those that Holm's step-down procedure rejects across the scorers
(:func:`holm_rejections`), so that running four scorers does not quadruple the chance of a
false alarm. The audit's delta is compared with the ledger's (:func:`delta_finding`): a bound at
a smaller delta than the ledger's tests a claim the ledger never made (an error), a larger one
is valid but weaker (a warning).

The former option ``method="gdp"`` is gone: it turned a (valid) lower bound on a Gaussian-DP
``mu`` (:func:`gdp_mu_lower_bound`) into the epsilon of a Gaussian mechanism with that ``mu``,
which is *not* a lower bound on a mechanism whose trade-off curve is not Gaussian (on
epsilon-1 randomized response it exceeded the true epsilon in 55% of runs). Where the
mechanism is Gaussian, the tight figure is an *estimate*, labelled as such:
:func:`securefed.audit.whitebox.gdp_estimate` (Andrew et al., ICLR 2024).

A lower bound is evidence, not a proof: a run whose bound stays below its ledger's epsilon is
not thereby shown private (the canaries or the scores may be weak); a bound *above* the ledger's
epsilon shows, at the stated confidence, that the ledger's claim is false for that observer.

Example:
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> cfg = EmpiricalAuditConfig(n_canaries=200)
    >>> results = run_empirical_audit(
    ...     cfg,
    ...     run_job=lambda included: included.astype(float),  # a mechanism that leaks all
    ...     scorers={"leak": Scorer("released_model", lambda obs, i: obs[i])},
    ...     rng=rng,
    ... )
    >>> results["leak"].epsilon_lower > 3
    True
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import optimize, special, stats

from securefed.audit.findings import OBSERVERS, AuditFailed, Finding

METHODS = ("steinke",)
EPSILON_CAP = 30.0
"""Largest epsilon searched: a bound reported at the cap means "at least this much"."""
_EPSILON_STEP = 0.02
_MU_CAP = 30.0


# ----------------------------------------------------------------------------- pure functions
def draw_inclusions(n_canaries: int, rng: np.random.Generator) -> np.ndarray:
    """Which canaries take part: each independently with probability 1/2.

    Raises:
        ValueError: fewer than one canary.
        TypeError: ``rng`` is not a numpy Generator (no global seeding).
    """
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy Generator, got {type(rng).__name__}")
    if n_canaries < 1:
        raise ValueError(f"an audit needs at least one canary, got {n_canaries}")
    return rng.random(n_canaries) < 0.5


def guesses_from_scores(scores: np.ndarray, n_positive: int, n_negative: int) -> np.ndarray:
    """Guess +1 (included) on the ``n_positive`` highest scores, -1 on the ``n_negative`` lowest.

    Every other canary is an abstention (0). Ties are broken by canary index, which does not
    depend on the inclusions.

    Raises:
        ValueError: a score that is NaN, or more guesses than canaries.
    """
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    if np.isnan(scores).any():
        raise ValueError("a canary score is NaN: score every canary (use -inf for 'no trace')")
    if n_positive < 0 or n_negative < 0 or n_positive + n_negative > len(scores):
        raise ValueError(
            f"cannot make {n_positive} positive and {n_negative} negative guesses on "
            f"{len(scores)} canaries"
        )
    order = np.argsort(-scores, kind="stable")
    guesses = np.zeros(len(scores), dtype=np.int8)
    guesses[order[:n_positive]] = 1
    if n_negative:
        guesses[order[len(scores) - n_negative :]] = -1
    return guesses


def count_correct(guesses: np.ndarray, included: np.ndarray) -> tuple[int, int]:
    """``(r, v)``: the number of guesses made and of correct ones."""
    guesses = np.asarray(guesses)
    truth = np.where(np.asarray(included, dtype=bool), 1, -1)
    made = guesses != 0
    return int(made.sum()), int((guesses[made] == truth[made]).sum())


def guess_success_probability(epsilon: float) -> float:
    """``e^epsilon / (1 + e^epsilon)``: the best chance of a correct guess under epsilon-DP."""
    return float(special.expit(epsilon))


def binomial_tail(n: int, k: np.ndarray | int, p: float) -> np.ndarray:
    """``P[Binomial(n, p) >= k]``, exact (the regularised incomplete beta function)."""
    k = np.asarray(k)
    return np.where(k <= 0, 1.0, stats.binom.sf(k - 1, n, p))


def one_run_tail_bound(
    epsilon: float, delta: float, n_guesses: int, n_correct: int, n_canaries: int
) -> float:
    """The most probability an ``(epsilon, delta)``-DP mechanism leaves to ``n_correct`` or more.

    Steinke, Nasr and Jagielski 2023, main theorem: ``f(v) + 2 m delta max_i (f(v - i) - f(v))
    / i`` with ``f(v) = P[Binomial(r, e^eps / (1 + e^eps)) >= v]`` (module docstring).
    """
    if n_guesses == 0:
        return 1.0
    p = guess_success_probability(epsilon)
    tail = float(binomial_tail(n_guesses, n_correct, p))
    if delta == 0:
        return min(1.0, tail)
    shifts = np.arange(1, n_canaries + 1)
    excess = (binomial_tail(n_guesses, n_correct - shifts, p) - tail) / shifts
    return min(1.0, tail + 2.0 * n_canaries * delta * float(excess.max()))


def _check_level(beta: float) -> None:
    if not 0 < beta < 1:
        raise ValueError(f"the significance level 1 - confidence must lie in (0, 1), got {beta}")


def epsilon_lower_bound(
    n_guesses: int, n_correct: int, n_canaries: int, *, delta: float, beta: float
) -> float:
    """The smallest epsilon that ``n_correct`` of ``n_guesses`` correct guesses cannot reject.

    Every epsilon below the returned value gives :func:`one_run_tail_bound` ``< beta``: at
    confidence ``1 - beta`` the mechanism is not ``(epsilon, delta)``-DP for any of them.
    The scan runs upwards in steps of 0.02 and bisects the first step that is not rejected (the
    delta term need not be monotone in epsilon, so the first crossing is the one that counts).
    Returns 0 when even epsilon = 0 is not rejected, :data:`EPSILON_CAP` when nothing up to it is.
    """
    _check_level(beta)
    if not 0 <= delta < 1:
        raise ValueError(f"delta must lie in [0, 1), got {delta}")

    def rejected(epsilon: float) -> bool:
        return one_run_tail_bound(epsilon, delta, n_guesses, n_correct, n_canaries) < beta

    if not rejected(0.0):
        return 0.0
    low = 0.0
    while low < EPSILON_CAP:
        high = min(low + _EPSILON_STEP, EPSILON_CAP)
        if not rejected(high):
            for _ in range(30):
                middle = (low + high) / 2
                low, high = (middle, high) if rejected(middle) else (low, middle)
            return low
        low = high
    return EPSILON_CAP


def gaussian_delta(mu: float, epsilon: np.ndarray | float) -> np.ndarray:
    """``delta`` of ``mu``-GDP at ``epsilon``: ``Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)``
    (Dong, Roth and Su 2022, Corollary 2.13); the second term in log space (no overflow at
    large ``epsilon``)."""
    epsilon = np.asarray(epsilon, dtype=np.float64)
    if mu <= 0:
        return np.zeros_like(epsilon)
    second = np.exp(epsilon + stats.norm.logcdf(-epsilon / mu - mu / 2))
    return np.maximum(stats.norm.cdf(-epsilon / mu + mu / 2) - second, 0.0)


def gaussian_epsilon(mu: float, delta: float) -> float:
    """The epsilon at ``delta`` of a ``mu``-GDP mechanism (0 when ``mu`` is 0)."""
    if mu <= 0 or gaussian_delta(mu, 0.0) <= delta:
        return 0.0
    high = 1.0
    while gaussian_delta(mu, high) > delta:
        high *= 2
    return float(optimize.brentq(lambda e: gaussian_delta(mu, e) - delta, 0.0, high))


def gdp_mu_lower_bound(n_guesses: int, n_correct: int, n_canaries: int, *, beta: float) -> float:
    """The smallest ``mu`` whose GDP curve the guesses cannot reject.

    A ``mu``-GDP mechanism is ``(epsilon, delta_mu(epsilon))``-DP for every epsilon at once
    (Dong, Roth and Su 2022, Corollary 2.13), so ``mu`` is rejected when for some epsilon of a
    grid the one-run bound at ``(epsilon, delta_mu(epsilon))`` is below ``beta``. This bounds
    ``mu``; the epsilon of a *Gaussian* mechanism with that ``mu`` is no lower bound on the
    epsilon of a mechanism whose trade-off curve is not Gaussian (module docstring).
    """
    _check_level(beta)
    if n_guesses == 0:
        return 0.0
    grid = np.arange(0.0, EPSILON_CAP, 0.05)
    shifts = np.arange(1, n_canaries + 1)
    tails, excess = np.empty(len(grid)), np.empty(len(grid))
    for j, epsilon in enumerate(grid):
        p = guess_success_probability(epsilon)
        tails[j] = float(binomial_tail(n_guesses, n_correct, p))
        shifted = binomial_tail(n_guesses, n_correct - shifts, p)
        excess[j] = float(((shifted - tails[j]) / shifts).max())

    def rejected(mu: float) -> bool:
        deltas = np.clip(gaussian_delta(mu, grid), 0.0, 1.0)
        return bool(np.any(tails + 2.0 * n_canaries * deltas * excess < beta))

    if not rejected(1e-9):
        return 0.0
    low, high = 1e-9, 0.05
    while rejected(high):
        low, high = high, high * 1.5
        if high > _MU_CAP:
            return _MU_CAP
    for _ in range(40):
        middle = (low + high) / 2
        low, high = (middle, high) if rejected(middle) else (low, middle)
    return low


# ----------------------------------------------------------------------------- configuration
@dataclass(frozen=True)
class EmpiricalAuditConfig:
    """How an empirical audit guesses and at what confidence.

    Attributes:
        n_canaries: canaries inserted (each included with probability 1/2).
        confidence: the probability with which the bound holds, in (0, 1).
        delta: the delta of the ``(epsilon, delta)`` tested (the ledger's delta).
        guess_fractions: guess counts tried, as fractions of the canaries per side: ``k =
            round(f * m)`` positive guesses (and as many negative ones when ``two_sided``);
            each is tested at ``(1 - confidence) / len(guess_fractions)``.
        two_sided: also guess "excluded" on the lowest scores.
        method: ``"steinke"``, the one-run theorem in (epsilon, delta) (the only one; the
            former ``"gdp"`` is refused, module docstring).
    """

    n_canaries: int
    confidence: float = 0.95
    delta: float = 1e-5
    guess_fractions: tuple[float, ...] = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
    two_sided: bool = True
    method: str = "steinke"

    def __post_init__(self) -> None:
        if self.n_canaries < 1:
            raise ValueError(f"n_canaries must be >= 1, got {self.n_canaries}")
        if not 0 < self.confidence < 1:
            raise ValueError(f"confidence must lie in (0, 1), got {self.confidence!r}")
        if not 0 <= self.delta < 1:
            raise ValueError(f"delta must lie in [0, 1), got {self.delta!r}")
        if not self.guess_fractions:
            raise ValueError("guess_fractions must name at least one guess count")
        limit = 0.5 if self.two_sided else 1.0
        for fraction in self.guess_fractions:
            if not 0 < fraction <= limit:
                raise ValueError(
                    f"guess fraction {fraction!r} must lie in (0, {limit}] "
                    f"({'two' if self.two_sided else 'one'}-sided guesses)"
                )
        if self.method == "gdp":
            raise ValueError(
                "method 'gdp' was removed: the epsilon of a Gaussian mechanism with the measured "
                "mu lower bound is not a lower bound on epsilon (it exceeded the true epsilon of "
                "epsilon-1 randomized response in 55% of runs); use method 'steinke' for the "
                "rigorous bound and securefed.audit.whitebox.gdp_estimate for a labelled estimate"
            )
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")

    @property
    def beta(self) -> float:
        """The significance level of each guess count tried (Bonferroni over them)."""
        return (1.0 - self.confidence) / len(self.guess_fractions)

    def guess_counts(self, n_canaries: int) -> list[tuple[int, int]]:
        """``(k+, k-)`` for each fraction, over ``n_canaries`` canaries (at least one guess)."""
        counts = []
        for fraction in self.guess_fractions:
            k = max(1, round(fraction * n_canaries))
            if self.two_sided:
                k = min(k, n_canaries // 2) or 1
            counts.append((k, k if self.two_sided and 2 * k <= n_canaries else 0))
        return counts


@dataclass(frozen=True)
class Scorer:
    """How one observer scores a canary.

    Attributes:
        observer: whom the score models (:data:`securefed.audit.findings.OBSERVERS`).
        score: ``score(observation, i) -> float``, higher for "more likely included" (``-inf``
            for "no trace at all").
        canaries: indices of the canaries this scorer audits (``None``: all of them).
        description: what the score reads, for the record.
    """

    observer: str
    score: Callable[[Any, int], float]
    canaries: Sequence[int] | None = None
    description: str = ""

    def __post_init__(self) -> None:
        if self.observer not in OBSERVERS:
            raise ValueError(f"observer must be one of {OBSERVERS}, got {self.observer!r}")
        if not callable(self.score):
            raise TypeError("score must be callable: score(observation, canary_index) -> float")


@dataclass(frozen=True)
class GuessCount:
    """One guess count tried: ``(k+, k-)``, the guesses made and right, and its bound."""

    n_positive: int
    n_negative: int
    n_guesses: int
    n_correct: int
    epsilon_lower: float


@dataclass(frozen=True, eq=False)
class EmpiricalAuditResult:
    """The measured lower bound for one observer.

    Attributes:
        observer: whom it holds against.
        epsilon_lower: epsilon that the run is shown (at ``confidence``) not to meet: the
            mechanism is not ``(e, delta)``-DP towards ``observer`` for any ``e`` below it.
        confidence, delta, method: as configured.
        n_canaries: canaries audited.
        best: the guess count that gave the bound (every count is listed in ``tried``).
        tried: every guess count's result.
        mu_lower: unused (``None``; the former ``method="gdp"``'s figure).
        included: which canaries took part.
        scores: each canary's score.
        epsilon_ledger: the ledger's epsilon for the observer, when known.
        delta_ledger: the ledger's delta, when known (compared with ``delta``).
        seconds_run, seconds_score: cost of the run and of the scoring.
        description: what the scores read.
    """

    observer: str
    epsilon_lower: float
    confidence: float
    delta: float
    method: str
    n_canaries: int
    best: GuessCount
    tried: tuple[GuessCount, ...]
    mu_lower: float | None
    included: np.ndarray
    scores: np.ndarray
    epsilon_ledger: float | None = None
    seconds_run: float = 0.0
    seconds_score: float = 0.0
    description: str = ""
    delta_ledger: float | None = None

    @property
    def exceeds_ledger(self) -> bool:
        """Whether the measured lower bound is above the ledger's epsilon, for this scorer alone
        (at its own confidence: uncorrected for other scorers of the same run, which
        :func:`check_against_ledger` corrects for)."""
        return self.epsilon_ledger is not None and self.epsilon_lower > self.epsilon_ledger

    def finding(self) -> Finding | None:
        """An error finding when :attr:`exceeds_ledger`, else ``None``."""
        if not self.exceeds_ledger:
            return None
        return Finding(
            "error",
            "empirical-epsilon-above-ledger",
            f"against the {self.observer}, {self.n_canaries} canaries give an epsilon lower "
            f"bound of {self.epsilon_lower:.3g} at {self.confidence:.0%} confidence (delta "
            f"{self.delta:g}, {self.best.n_correct}/{self.best.n_guesses} guesses right), above "
            f"the ledger's {self.epsilon_ledger:.3g}: the noise, the clip or the accounting does "
            "not do what the ledger assumes",
        )

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready summary (without the per-canary arrays)."""
        return {
            "observer": self.observer,
            "description": self.description,
            "epsilon_lower": self.epsilon_lower,
            "epsilon_ledger": self.epsilon_ledger,
            "exceeds_ledger": self.exceeds_ledger,
            "confidence": self.confidence,
            "delta": self.delta,
            "method": self.method,
            "delta_ledger": self.delta_ledger,
            "p_value_ledger": ledger_p_value(self),
            "n_canaries": self.n_canaries,
            "n_included": int(self.included.sum()),
            "guesses": self.best.n_guesses,
            "correct": self.best.n_correct,
            "guess_counts": [[g.n_positive, g.n_negative] for g in self.tried],
            "seconds_run": self.seconds_run,
            "seconds_score": self.seconds_score,
        }


class EmpiricalAuditFailed(AuditFailed):
    """A measured epsilon lower bound exceeds the ledger's epsilon for its observer (Holm
    across the run's scorers), or the audit ran at a delta below the ledger's.

    Attributes:
        results: the results that exceeded their ledger figure.
    """

    def __init__(self, message: str, results: Sequence[EmpiricalAuditResult]) -> None:
        findings = [f for r in results for f in (r.finding(), delta_finding(r))]
        super().__init__(message, [f for f in findings if f is not None])
        self.results = list(results)


# ----------------------------------------------------------------------------- the driver
def audit_scores(
    scores: np.ndarray,
    included: np.ndarray,
    config: EmpiricalAuditConfig,
    *,
    observer: str = "released_model",
    epsilon_ledger: float | None = None,
    description: str = "",
    seconds_run: float = 0.0,
    seconds_score: float = 0.0,
    delta_ledger: float | None = None,
) -> EmpiricalAuditResult:
    """The lower bound from given scores and the true inclusions (the audit's last two stages).

    Raises:
        ValueError: scores and inclusions of different lengths, or NaN scores.
    """
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    included = np.asarray(included, dtype=bool).reshape(-1)
    if scores.shape != included.shape:
        raise ValueError(f"{len(scores)} scores for {len(included)} canaries")
    m = len(scores)
    tried = []
    for k_positive, k_negative in config.guess_counts(m):
        guesses = guesses_from_scores(scores, k_positive, k_negative)
        r, v = count_correct(guesses, included)
        bound = epsilon_lower_bound(r, v, m, delta=config.delta, beta=config.beta)
        tried.append(GuessCount(k_positive, k_negative, r, v, float(bound)))
    best = max(tried, key=lambda g: g.epsilon_lower)
    mu_lower = None
    return EmpiricalAuditResult(
        observer=observer,
        epsilon_lower=best.epsilon_lower,
        confidence=config.confidence,
        delta=config.delta,
        method=config.method,
        n_canaries=m,
        best=best,
        tried=tuple(tried),
        mu_lower=mu_lower,
        included=included,
        scores=scores,
        epsilon_ledger=epsilon_ledger,
        seconds_run=seconds_run,
        seconds_score=seconds_score,
        description=description,
        delta_ledger=delta_ledger,
    )


def run_empirical_audit(
    config: EmpiricalAuditConfig,
    run_job: Callable[[np.ndarray], Any],
    scorers: Mapping[str, Scorer],
    *,
    rng: np.random.Generator,
    epsilon_of: Callable[[Any, str], float | None] | None = None,
    delta_of: Callable[[Any], float | None] | None = None,
) -> dict[str, EmpiricalAuditResult]:
    """Draw the inclusions, run the job once, score every canary, bound epsilon per scorer.

    Args:
        config: the audit's parameters (``n_canaries`` is the length of ``included``).
        run_job: ``run_job(included) -> observation``: one federated run in which canary ``i``
            takes part exactly when ``included[i]``.
        scorers: named scorers; each audits its canaries for its observer.
        rng: where the inclusions come from.
        epsilon_of: ``epsilon_of(observation, observer)``: the ledger's epsilon for that
            observer in this run (stored in each result, see ``exceeds_ledger``).
        delta_of: ``delta_of(observation)``: the ledger's delta in this run (compared with
            ``config.delta`` by :func:`check_against_ledger`).

    Returns:
        One result per scorer name.

    Raises:
        ValueError: no scorer, or a scorer's canaries out of range.
    """
    if not scorers:
        raise ValueError("an empirical audit needs at least one scorer")
    m = config.n_canaries
    subsets = {}
    for name, scorer in scorers.items():
        if not isinstance(scorer, Scorer):
            raise TypeError(f"scorer {name!r} must be a Scorer, got {type(scorer).__name__}")
        subset = np.arange(m) if scorer.canaries is None else np.asarray(scorer.canaries, int)
        if subset.size == 0 or subset.min() < 0 or subset.max() >= m:
            raise ValueError(f"scorer {name!r} audits canaries outside 0..{m - 1} (or none)")
        subsets[name] = subset
    included = draw_inclusions(m, rng)
    started = time.perf_counter()
    observation = run_job(included.copy())
    seconds_run = time.perf_counter() - started
    results = {}
    for name, scorer in scorers.items():
        subset = subsets[name]
        started = time.perf_counter()
        scores = np.array([float(scorer.score(observation, int(i))) for i in subset])
        seconds_score = time.perf_counter() - started
        ledger = None if epsilon_of is None else epsilon_of(observation, scorer.observer)
        ledger_delta = None if delta_of is None else delta_of(observation)
        results[name] = audit_scores(
            scores,
            included[subset],
            config,
            observer=scorer.observer,
            epsilon_ledger=ledger,
            description=scorer.description,
            seconds_run=seconds_run,
            seconds_score=seconds_score,
            delta_ledger=ledger_delta,
        )
    return results


def ledger_p_value(result: EmpiricalAuditResult) -> float:
    """The p-value of "the mechanism is ``(epsilon_ledger, delta)``-DP towards the observer".

    The smallest one-run tail bound (:func:`one_run_tail_bound`) at the ledger's epsilon over
    the guess counts tried, times their number (Bonferroni within the scorer, as the bound
    itself is computed): below ``1 - confidence`` exactly when the scorer's own bound exceeds
    the ledger (up to the bound's search step). 1 without a finite ledger figure.
    """
    ledger = result.epsilon_ledger
    if ledger is None or not math.isfinite(ledger):
        return 1.0
    tails = [
        one_run_tail_bound(ledger, result.delta, g.n_guesses, g.n_correct, result.n_canaries)
        for g in result.tried
    ]
    return min(1.0, min(tails) * len(result.tried))


def holm_rejections(
    p_values: Sequence[float], level: float, weights: Sequence[float] | None = None
) -> np.ndarray:
    """Holm's step-down procedure: which hypotheses to reject at family-wise ``level``.

    Unweighted: sort the ``k`` p-values; reject the ``i``-th smallest (from 0) while it is
    below ``level / (k - i)``, and stop at the first that is not (Holm 1979, "A simple
    sequentially rejective multiple test procedure"). Weighted (Holm 1979, section 5): take the
    hypotheses in order of ``p_i / w_i`` and reject while ``p_i < level w_i / W``, ``W`` the
    weight of those not yet rejected, so that a hypothesis expected to be strong (a large
    weight) keeps more of the level. Either way the chance of rejecting any true hypothesis is
    at most ``level``, whatever their dependence; Bonferroni rejects a subset of these.

    Raises:
        ValueError: ``level`` outside (0, 1), a p-value outside [0, 1] (NaN included), or
            weights that are not positive and one per p-value.
    """
    _check_level(level)
    p = np.asarray(p_values, dtype=np.float64).reshape(-1)
    if np.any(~((p >= 0) & (p <= 1))):
        raise ValueError(f"p-values must lie in [0, 1], got {p.tolist()}")
    w = np.ones(len(p)) if weights is None else np.asarray(weights, dtype=np.float64).reshape(-1)
    if w.shape != p.shape or np.any(~(w > 0)):
        raise ValueError(f"weights must be positive, one per p-value: got {w.tolist()}")
    rejected = np.zeros(len(p), dtype=bool)
    remaining = float(w.sum())
    for index in np.argsort(p / w, kind="stable"):
        if not p[index] < level * w[index] / remaining:
            break
        rejected[index] = True
        remaining -= w[index]
    return rejected


def delta_finding(result: EmpiricalAuditResult) -> Finding | None:
    """A finding when the audit's delta is not the ledger's (``None`` when equal or unknown).

    A bound at a *smaller* delta than the ledger's tests a stronger claim than the ledger makes,
    so it may "contradict" a correct ledger: an error. A larger delta tests a weaker claim
    (valid, but it contradicts less): a warning.
    """
    ledger = result.delta_ledger
    if ledger is None or math.isclose(ledger, result.delta, rel_tol=1e-9, abs_tol=0.0):
        return None
    if result.delta < ledger:
        return Finding(
            "error",
            "empirical-delta-below-ledger",
            f"against the {result.observer}, the audit tests delta {result.delta:g} but the "
            f"ledger's delta is {ledger:g}: a bound at a smaller delta does not contradict the "
            "ledger's claim; audit at the ledger's delta",
        )
    return Finding(
        "warning",
        "empirical-delta-above-ledger",
        f"against the {result.observer}, the audit tests delta {result.delta:g}, above the "
        f"ledger's {ledger:g}: valid, but weaker than an audit at the ledger's delta",
    )


def ledger_contradictions(results: Mapping[str, EmpiricalAuditResult]) -> dict[str, bool]:
    """Which scorers contradict their ledger figure, Holm-corrected across the scorers.

    The family level is ``1 - confidence`` of the results (they must share one confidence).

    Raises:
        ValueError: results at different confidences.
    """
    if not results:
        return {}
    levels = {round(1.0 - r.confidence, 12) for r in results.values()}
    if len(levels) != 1:
        raise ValueError(f"results at different confidences cannot be corrected together: {levels}")
    names = list(results)
    rejected = holm_rejections([ledger_p_value(results[n]) for n in names], levels.pop())
    return dict(zip(names, rejected.tolist(), strict=True))


def check_against_ledger(results: Mapping[str, EmpiricalAuditResult]) -> None:
    """Raise when a scorer contradicts its ledger (Holm across the scorers), or when the
    audit's delta is below the ledger's.

    Raises:
        EmpiricalAuditFailed: naming each scorer, observer and the two figures.
    """
    contradicted = ledger_contradictions(results)
    bad = {name: r for name, r in results.items() if contradicted[name]}
    lines = [f"  {name}: {r.finding()}" for name, r in bad.items()]
    for name, r in results.items():
        found = delta_finding(r)
        if found is not None and found.severity == "error":
            lines.append(f"  {name}: {found}")
            bad.setdefault(name, r)
    if lines:
        raise EmpiricalAuditFailed(
            "the empirical audit contradicts the ledger (Holm-corrected across "
            f"{len(results)} scorer(s)):\n" + "\n".join(lines),
            list(bad.values()),
        )
