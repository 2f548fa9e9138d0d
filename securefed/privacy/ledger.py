"""The privacy ledger: every noisy release recorded where the noise is added.

A :class:`PrivacyLedger` keeps the history of Gaussian releases as ``(noise_multiplier,
sample_rate, steps)`` triples (the format of Opacus's ``IAccountant.history``) and reports the
``epsilon`` spent at any ``delta`` (:mod:`securefed.privacy.accounting`; the RDP accountant
needs dp-accounting, extra ``dp``, and no torch):

* ``"rdp"`` (default): Rényi-DP accounting of the sampled Gaussian mechanism (Mironov,
  "Rényi Differential Privacy", CSF 2017; Mironov, Talwar and Zhang, "Rényi Differential Privacy
  of the Sampled Gaussian Mechanism", 2019), converted to ``(epsilon, delta)`` by Balle et al.,
  "Hypothesis Testing Interpretations and Renyi Differential Privacy", AISTATS 2020, Theorem 21.
  The RDP curve of each ``(sigma, q)`` pair is computed once (by dp-accounting, at Opacus's
  orders) and scaled by its step count; the epsilons agree with Opacus's
  ``RDPAccountant.get_epsilon`` (tests/test_accounting.py states the tolerance).
* ``"prv"``: numerical composition of privacy random variables (Gopi, Lee and Wutschitz,
  "Numerical Composition of Differential Privacy", NeurIPS 2021), tighter, slower; through
  Opacus's ``PRVAccountant`` (extra ``dp-torch``: Opacus imports torch).

Both accountants analyse *Poisson* subsampling: each client (or record) takes part in a step
independently with probability ``q``. That is :attr:`PrivacyLedger.accounting_sampling`. The
ledger also records the sampling the runtime actually used (:attr:`PrivacyLedger.sampling`,
``"all"``, ``"poisson"`` or ``"fixed"``); ``securefed.audit`` flags a mismatch (fixed-size
sampling without replacement, or everyone every round, while a rate ``q < 1`` was charged:
the reported epsilon would be too small; e.g. 3.58 instead of 2.10 for fixed-size sampling at
sigma 1, q 0.01, 1000 steps, delta 1e-5).

**Observers.** Every epsilon names whom it holds against (:data:`OBSERVERS`):

* ``"released_model"``: whoever sees only what the server releases (the trained model, the
  noisy aggregate) and not who took part in a round. Subsampling amplifies privacy against them,
  so a release is charged at the runtime's sampling rate ``q``.
* ``"server"``: the aggregator itself. It picks each round's clients and sees who contributed,
  so no amplification by sampling holds against it: a release it sees noised is charged at rate 1
  with the noise multiplier of *what it sees*; a release it sees in the clear (central DP: the
  server adds the noise itself) gives no guarantee against it, and its epsilon is infinite.

:meth:`PrivacyLedger.charge` takes both: ``charge(sigma, q, server=(sigma_server, 1.0))``, or
``server=None`` for a release the server sees in the clear (the default: a caller that does not
say is not credited with anything against the server). A :class:`PrivacyBudget` binds the
observers it names (``against``; the released model by default). The runtime hands its sampling
mode and rate to the ledger (:meth:`PrivacyLedger.record_sampling`, called by
:func:`securefed.runtime.run_rounds`), and a charge that claims more amplification than the
runtime delivers is refused: ``q < 1`` while everyone takes part every round, or a ``q`` below
the runtime's rate. Fixed-size sampling at ``q < 1`` is accounted as Poisson sampling and warns.

Pinned figures (tests): sigma 1.0, q 0.01, 1000 steps, delta 1e-5 gives epsilon 2.1014 (RDP) and
1.8384 (PRV); one round at sigma 1.0 gives 1.7272 at q = 0.06 and 4.7285 at q = 1 (delta 1e-5).
"""

from __future__ import annotations

import copy
import math
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from securefed.errors import InsecureParameterError, LedgerFormatError, PrivacyBudgetExceeded
from securefed.integrity import check_key, read_json, verify, write_sealed_json
from securefed.privacy import accounting
from securefed.privacy.discrete import DiscreteRelease

ACCOUNTANTS = ("rdp", "prv")
ACCOUNTANT_SAMPLING = "poisson"
SAMPLING_MODES = ("all", "poisson", "fixed", "cyclic")
LEDGER_FORMAT = "securefed.privacy_ledger"
LEDGER_VERSION = 2
OBSERVERS = ("released_model", "server")


@dataclass(frozen=True)
class PrivacyBudget:
    """An ``(epsilon, delta)`` budget against one or more observers.

    Attributes:
        epsilon: the most epsilon that may be spent (> 0), against each observer named.
        delta: the delta at which epsilon is measured, in (0, 1).
        against: the observers it binds (:data:`OBSERVERS`); by default the released model's.
            Add ``"server"`` to bound what the aggregator itself learns (no central-DP release
            fits such a budget: the server sees its sum in the clear).
    """

    epsilon: float
    delta: float
    against: tuple[str, ...] = ("released_model",)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.epsilon) and self.epsilon > 0):
            raise ValueError(f"budget epsilon must be finite and > 0, got {self.epsilon!r}")
        _check_delta(self.delta)
        against = (self.against,) if isinstance(self.against, str) else tuple(self.against)
        unknown = [o for o in against if o not in OBSERVERS]
        if not against or unknown or len(set(against)) != len(against):
            raise ValueError(
                f"a budget binds distinct observers among {OBSERVERS}, got {self.against!r}"
            )
        object.__setattr__(self, "against", tuple(o for o in OBSERVERS if o in against))


def _check_delta(delta: float) -> None:
    if not (0 < delta < 1):
        raise ValueError(f"delta must lie in (0, 1), got {delta!r}")


def _check_step(noise_multiplier: float, sample_rate: float, steps: int) -> None:
    if not (math.isfinite(noise_multiplier) and noise_multiplier > 0):
        raise ValueError(
            f"noise_multiplier must be finite and > 0 (no noise means no privacy), "
            f"got {noise_multiplier!r}"
        )
    if not (0 < sample_rate <= 1):
        raise ValueError(f"sample_rate must lie in (0, 1], got {sample_rate!r}")
    if isinstance(steps, bool) or int(steps) != steps or steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")


def _check_accountant(accountant: str) -> str:
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"accountant must be one of {ACCOUNTANTS}, got {accountant!r}")
    return accountant


def _check_sampling(sampling: str | None) -> str | None:
    mode = getattr(sampling, "mode", sampling)  # a runtime ClientSampling, or its mode string
    if mode is not None and mode not in SAMPLING_MODES:
        raise ValueError(f"sampling must be one of {SAMPLING_MODES} or None, got {mode!r}")
    return mode


def epsilon_of_history(
    history: list[tuple[float, float, int]], delta: float, accountant: str = "rdp"
) -> float:
    """Epsilon at ``delta`` of a history of ``(noise_multiplier, sample_rate, steps)`` triples.

    Pure function (no ledger state). RDP: the sum over the history of ``steps * RDP(sigma, q)``
    at Opacus's default orders, converted by Balle et al. 2020's Theorem 21
    (:mod:`securefed.privacy.accounting`, through dp-accounting: no torch). PRV: Opacus's
    ``PRVAccountant.get_epsilon`` (its upper bound, ``eps_error=0.01``; extra ``dp-torch``).
    """
    _check_delta(delta)
    _check_accountant(accountant)
    if not history:
        return 0.0
    if accountant == "rdp":
        return accounting.rdp_epsilon(accounting.history_rdp(history), delta)
    return accounting.prv_epsilon(history, delta)


def epsilon_with_discrete(
    history: list[tuple[float, float, int]],
    discrete: Sequence[tuple[DiscreteRelease, int]],
    delta: float,
) -> float:
    """Epsilon at ``delta`` of Gaussian releases and integer-noise releases, composed in RDP.

    The RDP curve of every ``(release, steps)`` pair of ``discrete``
    (:meth:`~securefed.privacy.discrete.DiscreteRelease.rdp`: Kairouz et al. 2021's bound for the
    sum of discrete Gaussians, Agarwal et al. 2021's for Skellam) is added, times its steps, to
    the Gaussian history's at Opacus's default orders, and converted by Balle et al. 2020's
    Theorem 21. Integer releases are charged without amplification by sampling (conservative).
    Without ``discrete`` this is :func:`epsilon_of_history` with the RDP accountant.
    """
    _check_delta(delta)
    if not discrete:
        return epsilon_of_history(history, delta, "rdp")
    total = accounting.history_rdp(history)
    for release, steps in discrete:
        total = total + steps * np.asarray(release.rdp(list(accounting.RDP_ORDERS)))
    return accounting.rdp_epsilon(total, delta)


class PrivacyLedger:
    """Records every noisy release and reports the privacy spent (Opacus accountants).

    Charge the ledger where the noise is added, *before* anything noisy is released:
    :meth:`charge` first checks on a copy whether the step fits the budget and raises
    :class:`~securefed.errors.PrivacyBudgetExceeded` with nothing recorded when it does not.

    Args:
        accountant: ``"rdp"`` (default) or ``"prv"``.
        budget: optional ``PrivacyBudget`` or ``(epsilon, delta)`` pair.
        sampling: the runtime's client sampling mode (``"all"``, ``"poisson"``, ``"fixed"``, a
            ``ClientSampling``, or ``None`` if unknown); recorded for the audit. The accounting
            itself always assumes Poisson sampling (:attr:`accounting_sampling`).
        path: optional JSON file the ledger is written to (atomically, with a digest) after
            every charge. Keep it outside checkpoint directories: a ledger must never be rolled
            back, since releases made after a checkpoint were already seen. (Checkpoints carry
            their own copy: :class:`securefed.runtime.Checkpoints`.)
        key: optional key (at least 16 bytes) for an HMAC-SHA256 digest of the file at ``path``.

    Example:
        >>> ledger = PrivacyLedger(budget=(8.0, 1e-5))
        >>> ledger.charge(1.0, 0.01)
        >>> ledger.steps
        1
    """

    accounting_sampling = ACCOUNTANT_SAMPLING

    def __init__(
        self,
        accountant: str = "rdp",
        *,
        budget: PrivacyBudget | tuple[float, float] | None = None,
        sampling: object = None,
        path: str | os.PathLike | None = None,
        key: bytes | None = None,
    ) -> None:
        self.accountant = _check_accountant(accountant)
        if budget is not None and not isinstance(budget, PrivacyBudget):
            budget = PrivacyBudget(*budget)
        self.budget: PrivacyBudget | None = budget
        self.sampling: str | None = _check_sampling(sampling)
        self.sampling_rate: float | None = None
        self.path = None if path is None else Path(path)
        self._key = check_key(key)
        self._accountant = accounting.StepHistory()
        self._server = accounting.StepHistory()
        self.server_clear_steps = 0
        self._discrete: tuple[tuple[DiscreteRelease, int], ...] = ()
        self._server_discrete: tuple[tuple[DiscreteRelease, int], ...] = ()
        self._warned_fixed = False

    # ------------------------------------------------------------------ reading
    @property
    def history(self) -> list[tuple[float, float, int]]:
        """Against the released model: ``(noise_multiplier, sample_rate, steps)`` triples,
        consecutive equal steps merged."""
        return _triples(self._accountant.history)

    @property
    def server_history(self) -> list[tuple[float, float, int]]:
        """Against the server: the triples of the releases it saw noised (rate 1 for each)."""
        return _triples(self._server.history)

    @property
    def discrete_history(self) -> list[tuple[DiscreteRelease, int]]:
        """Against the released model: the integer-noise releases and their step counts."""
        return list(self._discrete)

    @property
    def server_discrete_history(self) -> list[tuple[DiscreteRelease, int]]:
        """Against the server: the integer-noise releases as it saw them."""
        return list(self._server_discrete)

    @property
    def steps(self) -> int:
        """Number of noisy releases recorded (Gaussian and integer noise)."""
        return sum(n for _, _, n in self.history) + sum(n for _, n in self._discrete)

    def _delta(self, delta: float | None) -> float:
        if delta is not None:
            return delta
        if self.budget is not None:
            return self.budget.delta
        raise ValueError("give delta: this ledger has no budget to take it from")

    def epsilon(self, delta: float | None = None, *, against: str = "released_model") -> float:
        """Epsilon spent so far at ``delta`` (default: the budget's) against an observer.

        Args:
            delta: the delta (default: the budget's).
            against: ``"released_model"`` (default) or ``"server"``; ``inf`` against the server
                once it has seen a release in the clear.
        """
        return self._epsilons(self._state(), self._delta(delta))[_check_observer(against)]

    def epsilons(self, delta: float | None = None) -> dict[str, float]:
        """Epsilon against every observer (:data:`OBSERVERS`) at ``delta``."""
        return self._epsilons(self._state(), self._delta(delta))

    def epsilon_after(
        self,
        noise_multiplier: float,
        sample_rate: float,
        *,
        steps: int = 1,
        delta: float | None = None,
        server: tuple[float, float] | None = None,
        against: str = "released_model",
    ) -> float:
        """Epsilon against ``against`` after charging these steps (nothing is recorded)."""
        trial = self._trial(noise_multiplier, sample_rate, steps, server)
        return self._epsilons(trial, self._delta(delta))[_check_observer(against)]

    def would_exceed(
        self,
        noise_multiplier: float,
        sample_rate: float,
        *,
        steps: int = 1,
        server: tuple[float, float] | None = None,
    ) -> bool:
        """Whether charging these steps would overrun the budget (False without a budget).

        Raises:
            InsecureParameterError: the rate claims amplification the runtime does not give.
        """
        trial = self._trial(noise_multiplier, sample_rate, steps, server)
        return bool(self._overrun(trial))

    # ------------------------------------------------------------------ charging
    def _state(self) -> _Trial:
        return _Trial(
            self._accountant,
            self._server,
            self.server_clear_steps,
            self._discrete,
            self._server_discrete,
        )

    def _trial(
        self,
        noise_multiplier: float,
        sample_rate: float,
        steps: int,
        server: tuple[float, float] | None,
    ) -> _Trial:
        """The accountants after these steps, on copies (also validates the step)."""
        _check_step(noise_multiplier, sample_rate, steps)
        if server is not None:
            if len(server) != 2:
                raise ValueError(f"server is (noise_multiplier, sample_rate), got {server!r}")
            _check_step(float(server[0]), float(server[1]), steps)
        self.check_sample_rate(sample_rate)
        released, seen = copy.deepcopy(self._accountant), copy.deepcopy(self._server)
        for _ in range(int(steps)):
            released.step(noise_multiplier=float(noise_multiplier), sample_rate=float(sample_rate))
            if server is not None:
                seen.step(noise_multiplier=float(server[0]), sample_rate=float(server[1]))
        clear = self.server_clear_steps + (int(steps) if server is None else 0)
        return _Trial(released, seen, clear, self._discrete, self._server_discrete)

    def _discrete_trial(
        self, release: DiscreteRelease, server: DiscreteRelease | None, steps: int
    ) -> _Trial:
        kinds = (DiscreteRelease, accounting.SampledReplaceGaussian)
        if not isinstance(release, kinds) or not (server is None or isinstance(server, kinds)):
            raise TypeError(
                "a charge by RDP curve takes DiscreteRelease or SampledReplaceGaussian objects"
            )
        if isinstance(steps, bool) or int(steps) != steps or steps < 1:
            raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
        if self.accountant != "rdp":
            raise ValueError(
                f"integer-noise releases are accounted in Rényi DP; this ledger uses the "
                f"{self.accountant!r} accountant, which cannot compose them: use accountant='rdp'"
            )
        seen = self._server_discrete
        if server is not None:
            seen = _merge_discrete(seen, server, int(steps))
        clear = self.server_clear_steps + (int(steps) if server is None else 0)
        return _Trial(
            self._accountant,
            self._server,
            clear,
            _merge_discrete(self._discrete, release, int(steps)),
            seen,
        )

    def _epsilons(self, trial: _Trial, delta: float) -> dict[str, float]:
        if trial.released_discrete or trial.server_discrete:
            server = (
                math.inf
                if trial.server_clear_steps
                else epsilon_with_discrete(
                    _triples(trial.server.history), trial.server_discrete, delta
                )
            )
            released = epsilon_with_discrete(
                _triples(trial.released.history), trial.released_discrete, delta
            )
            return {"released_model": released, "server": server}
        server = (
            math.inf
            if trial.server_clear_steps
            else epsilon_of_history(_triples(trial.server.history), delta, self.accountant)
        )
        released = epsilon_of_history(_triples(trial.released.history), delta, self.accountant)
        return {"released_model": released, "server": server}

    def _overrun(self, trial: _Trial) -> dict[str, float]:
        """The budget's observers whose epsilon the trial would push over it."""
        if self.budget is None:
            return {}
        after = self._epsilons(trial, self.budget.delta)
        return {o: after[o] for o in self.budget.against if after[o] > self.budget.epsilon}

    def check_sample_rate(self, sample_rate: float) -> None:
        """Refuse a rate that claims more amplification than the runtime's sampling gives.

        Every charge runs it; a transport may run it when it is built. Warns (once per ledger)
        for fixed-size sampling at ``q < 1``, which the Poisson accountants under-count.

        Raises:
            InsecureParameterError: ``q < 1`` with everyone sampled every round, or ``q`` below
                the runtime's sampling rate.
        """
        if self.sampling == "cyclic" and sample_rate < 1:
            raise InsecureParameterError(
                f"the runtime picks clients on a public cyclic schedule, but sample rate "
                f"{sample_rate:g} < 1 would claim an amplification by random sampling that never "
                "happens: charge 1.0 (the correlated-noise transports account for the schedule)"
            )
        if self.sampling == "all" and sample_rate < 1:
            raise InsecureParameterError(
                f"the runtime puts every client in every round, but sample rate {sample_rate:g} "
                "< 1 would claim an amplification by sampling that never happens: charge 1.0"
            )
        if self.sampling_rate is not None and sample_rate < self.sampling_rate * (1 - 1e-12):
            raise InsecureParameterError(
                f"sample rate {sample_rate:g} is below the runtime's sampling rate "
                f"{self.sampling_rate:g}: the reported epsilon would be too small"
            )
        if self.sampling == "fixed" and sample_rate < 1 and not self._warned_fixed:
            self._warned_fixed = True
            warnings.warn(
                "fixed-size client sampling is accounted as Poisson sampling: the reported "
                "epsilon is smaller than the true one; use ClientSampling('poisson', ...)",
                stacklevel=3,
            )

    def charge(
        self,
        noise_multiplier: float,
        sample_rate: float,
        *,
        steps: int = 1,
        server: tuple[float, float] | None = None,
    ) -> None:
        """Record ``steps`` Gaussian releases.

        Args:
            noise_multiplier: ``sigma`` of the release (noise std over its sensitivity).
            sample_rate: the Poisson rate ``q`` at which subjects took part, as the released
                model's observers face it.
            steps: how many such releases.
            server: ``(noise multiplier, sample rate)`` of the release *as the server sees it*
                (e.g. ``(sigma, 1.0)`` when it sees the noisy value and knows who took part);
                ``None`` when it sees the value in the clear (no guarantee against it).

        The steps are first applied to copies; if an epsilon the budget binds would exceed it,
        nothing is recorded and :class:`PrivacyBudgetExceeded` names the observer and figures.

        Raises:
            PrivacyBudgetExceeded: the budget would be overrun (ledger unchanged).
            InsecureParameterError: ``q`` claims more amplification than the runtime's sampling
                (:meth:`record_sampling`) gives.
            ValueError: a non-positive noise multiplier, a rate outside (0, 1], bad steps.
        """
        trial = self._trial(noise_multiplier, sample_rate, steps, server)
        what = (
            f"release(s) with noise multiplier {noise_multiplier:g} at sample rate "
            f"{sample_rate:g} (server: {'in the clear' if server is None else server})"
        )
        self._commit(trial, steps, what)

    def charge_discrete(
        self,
        release: DiscreteRelease,
        *,
        server: DiscreteRelease | None,
        steps: int = 1,
    ) -> None:
        """Record ``steps`` releases of a sum of integer noise (distributed discrete Gaussian
        or Skellam), charged by their own accountant
        (:meth:`~securefed.privacy.discrete.DiscreteRelease.rdp`) without amplification by
        sampling.

        Args:
            release: the release against the released model's observers.
            server: the release as the server sees it (the same sum under secure aggregation;
                one client's noisy vector where it reads each update); ``None``: in the clear.
            steps: how many such releases.

        Raises:
            PrivacyBudgetExceeded: the budget would be overrun (ledger unchanged).
            ValueError: a ledger whose accountant is not ``"rdp"``, or bad steps.
        """
        trial = self._discrete_trial(release, server, steps)
        self._commit(trial, steps, f"release(s) of {release} (server: {server})")

    def _commit(self, trial: _Trial, steps: int, what: str) -> None:
        over = self._overrun(trial)
        if over:
            observer, after = next(iter(over.items()))
            spent = self._epsilons(self._state(), self.budget.delta)[observer]
            raise PrivacyBudgetExceeded(
                f"privacy budget exceeded against the {observer.replace('_', ' ')}: {steps} more "
                f"{what} would bring epsilon to {after:.4f} at delta {self.budget.delta:g}, "
                f"over the budget of {self.budget.epsilon:g} (spent so far: {spent:.4f} over "
                f"{self.steps} release(s), {self.accountant} accountant); nothing was "
                "recorded and nothing should be released"
            )
        self._accountant, self._server = trial.released, trial.server
        self.server_clear_steps = trial.server_clear_steps
        self._discrete, self._server_discrete = trial.released_discrete, trial.server_discrete
        if self.path is not None:
            self.save(self.path, key=self._key)

    def would_exceed_discrete(
        self, release: DiscreteRelease, *, server: DiscreteRelease | None, steps: int = 1
    ) -> bool:
        """Whether :meth:`charge_discrete` would overrun the budget (False without a budget)."""
        return bool(self._overrun(self._discrete_trial(release, server, steps)))

    def epsilon_after_discrete(
        self,
        release: DiscreteRelease,
        *,
        server: DiscreteRelease | None,
        steps: int = 1,
        delta: float | None = None,
        against: str = "released_model",
    ) -> float:
        """Epsilon against ``against`` after :meth:`charge_discrete` (nothing is recorded)."""
        trial = self._discrete_trial(release, server, steps)
        return self._epsilons(trial, self._delta(delta))[_check_observer(against)]

    def record_sampling(self, sampling: object, *, rate: float | None = None) -> None:
        """Record the runtime's sampling mode (a mode string or a ``ClientSampling``) and rate.

        :func:`securefed.runtime.run_rounds` calls it before the first round, so the ledger
        knows how clients were really picked whoever built it.

        Raises:
            ValueError: a mode other than one recorded before (the transport was told one
                sampling, the runtime uses another), or a rate outside (0, 1].
        """
        mode = _check_sampling(sampling)
        if mode is not None and self.sampling is not None and mode != self.sampling:
            raise ValueError(
                f"the runtime samples clients {mode!r}, but this ledger was told {self.sampling!r}"
            )
        if rate is not None:
            if not (0 < rate <= 1):
                raise ValueError(f"a sampling rate lies in (0, 1], got {rate!r}")
            self.sampling_rate = float(rate)
        if mode is not None:
            self.sampling = mode

    # ------------------------------------------------------------------ reporting
    def summary(self, delta: float | None = None) -> dict[str, object]:
        """JSON-ready public parameters for views and the audit.

        Keys: ``accountant``, ``accountant_sampling``, ``sampling``, ``sampling_rate``,
        ``steps``, ``sample_rate`` (the largest charged, ``None`` if nothing was charged),
        ``epsilon`` (against the released model) and ``epsilon_server`` / ``delta`` (when a
        delta is known), ``server_clear_steps``, ``epsilon_budget``, ``budget_against``.
        """
        known = delta if delta is not None else (self.budget.delta if self.budget else None)
        epsilons = None if known is None else self.epsilons(known)
        return {
            "accountant": self.accountant,
            "accountant_sampling": self.accounting_sampling,
            "sampling": self.sampling,
            "sampling_rate": self.sampling_rate,
            "steps": self.steps,
            "sample_rate": max((q for _, q, _ in self.history), default=None),
            "epsilon": None if epsilons is None else epsilons["released_model"],
            "epsilon_server": None if epsilons is None else epsilons["server"],
            "delta": known,
            "server_clear_steps": self.server_clear_steps,
            "epsilon_budget": None if self.budget is None else self.budget.epsilon,
            "budget_against": None if self.budget is None else list(self.budget.against),
        }

    # ------------------------------------------------------------------ persistence
    def state_dict(self) -> dict[str, object]:
        """JSON-serialisable state: accountant, sampling, budget and both histories."""
        return {
            "format": LEDGER_FORMAT,
            "version": LEDGER_VERSION,
            "accountant": self.accountant,
            "accountant_sampling": self.accounting_sampling,
            "sampling": self.sampling,
            "sampling_rate": self.sampling_rate,
            "budget": None
            if self.budget is None
            else {
                "epsilon": self.budget.epsilon,
                "delta": self.budget.delta,
                "against": list(self.budget.against),
            },
            "history": [[s, q, n] for s, q, n in self.history],
            "server_history": [[s, q, n] for s, q, n in self.server_history],
            "server_clear_steps": self.server_clear_steps,
        } | self._discrete_state()

    def _discrete_state(self) -> dict[str, object]:
        """The integer-noise histories, present only when there are any (older files lack them)."""
        if not (self._discrete or self._server_discrete):
            return {}
        return {
            "discrete_history": [[*r.as_list(), n] for r, n in self._discrete],
            "discrete_server_history": [[*r.as_list(), n] for r, n in self._server_discrete],
        }

    def load_state_dict(self, state: Mapping[str, object]) -> None:
        """Restore the histories and sampling written by :meth:`state_dict`.

        The budget stays the one this ledger was built with (it is configuration). Nothing
        changes unless the whole state is valid.

        Raises:
            ValueError: a different accountant, a malformed history, an unknown format.
        """
        parsed = _parse_state(state, self.accountant)
        self._accountant.history = parsed.history
        self._server.history = parsed.server_history
        self.server_clear_steps = parsed.server_clear_steps
        self._discrete = parsed.discrete
        self._server_discrete = parsed.server_discrete
        self.sampling = parsed.sampling
        self.sampling_rate = parsed.sampling_rate

    def resume_conflicts(self, state: Mapping[str, object]) -> list[str]:
        """Why this ledger cannot continue from a saved ``state`` (empty: it can).

        A run resumes a ledger only into a fresh one built with the same configuration, or into
        one that already holds exactly the saved histories. Anything else would lose or invent
        releases: a ledger that recorded more than the checkpoint (the crashed process got past
        it) must not be rolled back, and one with another history belongs to another run.

        Raises:
            ValueError: ``state`` is not a ledger state.
        """
        parsed = _parse_state(state, None)
        causes = []
        if parsed.accountant != self.accountant:
            causes.append(
                f"accountant: the checkpoint's ledger uses {parsed.accountant!r}, this one "
                f"{self.accountant!r}"
            )
        if parsed.budget != self.budget:
            causes.append(
                f"budget: the checkpoint's ledger has {parsed.budget}, this one {self.budget}"
            )
        for name in ("sampling", "sampling_rate"):
            mine, saved = getattr(self, name), getattr(parsed, name)
            if mine is not None and saved is not None and mine != saved:
                causes.append(f"{name}: the checkpoint's is {saved!r}, this one {mine!r}")
        fresh = (
            not self.history
            and not self.server_history
            and not self.server_clear_steps
            and not self._discrete
            and not self._server_discrete
        )
        same = (
            self.history == parsed.history
            and self.server_history == parsed.server_history
            and self.server_clear_steps == parsed.server_clear_steps
            and self._discrete == parsed.discrete
            and self._server_discrete == parsed.server_discrete
        )
        if not (fresh or same):
            causes.append(
                f"history: this ledger already recorded {self.steps} release(s) that are not the "
                f"checkpoint's {sum(n for _, _, n in parsed.history)}; resuming would roll it back "
                "or mix two runs"
            )
        return causes

    @classmethod
    def of_history(
        cls,
        history: list[tuple[float, float, int]],
        accountant: str = "rdp",
        *,
        sampling: object = None,
        server_history: list[tuple[float, float, int]] | None = None,
    ) -> PrivacyLedger:
        """A ledger (no budget) that holds ``(noise_multiplier, sample_rate, steps)`` triples.

        Args:
            history: the releases, against the released model.
            accountant: ``"rdp"`` or ``"prv"``.
            sampling: the sampling mode recorded.
            server_history: the same releases as the server saw them; ``None``: it saw them in
                the clear (no guarantee against it).

        Raises:
            ValueError: a malformed triple.
        """
        ledger = cls(accountant, sampling=sampling)
        steps = sum(int(entry[2]) for entry in history) if server_history is None else 0
        state = ledger.state_dict() | {
            "history": [list(entry) for entry in history],
            "server_history": [list(entry) for entry in server_history or []],
            "server_clear_steps": steps,
        }
        ledger.load_state_dict(state)
        return ledger

    @classmethod
    def from_state_dict(cls, state: Mapping[str, object]) -> PrivacyLedger:
        """A ledger rebuilt from :meth:`state_dict`, budget included.

        Raises:
            ValueError: a malformed state.
        """
        parsed = _parse_state(state, None)
        ledger = cls(parsed.accountant, budget=parsed.budget)
        ledger.load_state_dict(state)
        return ledger

    def save(self, path: str | os.PathLike, *, key: bytes | None = None) -> Path:
        """Write :meth:`state_dict` as JSON with a digest, atomically (temporary file, rename).

        Args:
            path: the file.
            key: optional key for an HMAC-SHA256 digest (else SHA-256).
        """
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        return write_sealed_json(path, self.state_dict(), key=key)

    @classmethod
    def load(cls, path: str | os.PathLike, *, key: bytes | None = None) -> PrivacyLedger:
        """Read a ledger written by :meth:`save` (it keeps saving to ``path``, with ``key``).

        Raises:
            LedgerFormatError: naming the file and the cause (missing, not JSON, another format
                or version, no digest or one that does not match, a malformed state).
        """
        path = Path(path)
        state = read_json(path, LedgerFormatError)
        if state.get("format") != LEDGER_FORMAT:
            raise LedgerFormatError(
                f"{path}: not a privacy ledger (format {state.get('format')!r})"
            )
        if state.get("version") != LEDGER_VERSION:
            raise LedgerFormatError(
                f"{path}: unsupported ledger version {state.get('version')!r} (expected "
                f"{LEDGER_VERSION})"
            )
        verify(state, path, [], key=key, error=LedgerFormatError)
        try:
            ledger = cls.from_state_dict({k: v for k, v in state.items() if k != "digest"})
        except (ValueError, TypeError, KeyError) as error:
            raise LedgerFormatError(f"{path}: malformed privacy ledger ({error})") from error
        ledger.path = path
        ledger._key = check_key(key)
        return ledger

    def __repr__(self) -> str:
        budget = "" if self.budget is None else f", budget={self.budget}"
        return f"PrivacyLedger({self.accountant!r}, steps={self.steps}{budget})"


_STATE_KEYS = frozenset(
    {
        "format",
        "version",
        "accountant",
        "accountant_sampling",
        "sampling",
        "sampling_rate",
        "budget",
        "history",
        "server_history",
        "server_clear_steps",
    }
)
_OPTIONAL_STATE_KEYS = frozenset({"discrete_history", "discrete_server_history"})


@dataclass(frozen=True)
class _Trial:
    """The two accountants (and clear-step count) of a ledger, or of a trial charge."""

    released: object
    server: object
    server_clear_steps: int
    released_discrete: tuple[tuple[DiscreteRelease, int], ...] = ()
    server_discrete: tuple[tuple[DiscreteRelease, int], ...] = ()


def _merge_discrete(
    history: tuple[tuple[DiscreteRelease, int], ...], release: DiscreteRelease, steps: int
) -> tuple[tuple[DiscreteRelease, int], ...]:
    """``history`` with ``steps`` more of ``release`` (merged into an equal last entry)."""
    if history and history[-1][0] == release:
        return (*history[:-1], (release, history[-1][1] + steps))
    return (*history, (release, steps))


@dataclass(frozen=True)
class _ParsedState:
    accountant: str
    budget: PrivacyBudget | None
    sampling: str | None
    sampling_rate: float | None
    history: list[tuple[float, float, int]]
    server_history: list[tuple[float, float, int]]
    server_clear_steps: int
    discrete: tuple[tuple[DiscreteRelease, int], ...] = ()
    server_discrete: tuple[tuple[DiscreteRelease, int], ...] = ()


def _parse_discrete(entries: object, name: str) -> tuple[tuple[DiscreteRelease, int], ...]:
    if not isinstance(entries, list):
        raise ValueError(
            f"ledger {name} must be a list of [mechanism, noise, n, l2, l1, dim, steps]"
        )
    parsed = []
    for entry in entries:
        sampled = isinstance(entry, (list, tuple)) and entry[:1] == ["poisson_gaussian_replace"]
        fields = 4 if sampled else 7
        if not isinstance(entry, (list, tuple)) or len(entry) != fields:
            raise ValueError(f"ledger {name} entries have {fields} fields, got {entry!r}")
        steps = entry[-1]
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"ledger {name} steps must be an integer >= 1, got {steps!r}")
        kind = accounting.SampledReplaceGaussian if sampled else DiscreteRelease
        parsed.append((kind.from_list(list(entry[:-1])), steps))
    return tuple(parsed)


def _triples(history: Sequence) -> list[tuple[float, float, int]]:
    return [(float(s), float(q), int(n)) for s, q, n in history]


def _check_observer(observer: str) -> str:
    if observer not in OBSERVERS:
        raise ValueError(f"an epsilon holds against one of {OBSERVERS}, got {observer!r}")
    return observer


def _parse_history(entries: object, name: str) -> list[tuple[float, float, int]]:
    if not isinstance(entries, list):
        raise ValueError(f"ledger {name} must be a list of [sigma, q, steps]")
    history = []
    for entry in entries:
        if not isinstance(entry, (list, tuple)) or len(entry) != 3:
            raise ValueError(f"ledger {name} entries are [sigma, q, steps], got {entry!r}")
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in entry):
            raise ValueError(f"ledger {name} entries are three numbers, got {entry!r}")
        sigma, q, steps = entry
        _check_step(float(sigma), float(q), steps)
        history.append((float(sigma), float(q), int(steps)))
    return history


def _parse_state(state: Mapping[str, object], accountant: str | None) -> _ParsedState:
    """A ledger state, every field checked.

    Args:
        state: what :meth:`PrivacyLedger.state_dict` returned (e.g. read back from JSON).
        accountant: the accountant the state must have been written by (``None``: any known).

    Raises:
        ValueError: naming the field that is missing, unknown or malformed.
    """
    if not isinstance(state, Mapping):
        raise ValueError(f"a ledger state is a mapping, got {type(state).__name__}")
    if state.get("format") != LEDGER_FORMAT:
        raise ValueError(f"not a privacy ledger state (format {state.get('format')!r})")
    if state.get("version") != LEDGER_VERSION:
        raise ValueError(f"unsupported ledger state version {state.get('version')!r}")
    missing = sorted(_STATE_KEYS - set(state))
    unknown = sorted(set(state) - _STATE_KEYS - _OPTIONAL_STATE_KEYS)
    if missing or unknown:
        raise ValueError(f"ledger state has missing fields {missing}, unknown fields {unknown}")
    if accountant is not None and state["accountant"] != accountant:
        raise ValueError(
            f"the state was written by the {state['accountant']!r} accountant; this "
            f"ledger uses {accountant!r}"
        )
    _check_accountant(state["accountant"])
    if state["accountant_sampling"] != ACCOUNTANT_SAMPLING:
        raise ValueError(f"accountant_sampling must be {ACCOUNTANT_SAMPLING!r}")
    budget = state["budget"]
    if budget is not None:
        if not isinstance(budget, Mapping) or set(budget) != {"epsilon", "delta", "against"}:
            raise ValueError(f"budget must be null or {{epsilon, delta, against}}, got {budget!r}")
        if not isinstance(budget["against"], list):
            raise ValueError(f"budget against must list observers, got {budget['against']!r}")
        budget = PrivacyBudget(budget["epsilon"], budget["delta"], tuple(budget["against"]))
    rate = state["sampling_rate"]
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float))):
        raise ValueError(f"sampling_rate must be a number or null, got {rate!r}")
    if rate is not None and not (0 < rate <= 1):
        raise ValueError(f"sampling_rate must lie in (0, 1], got {rate!r}")
    clear = state["server_clear_steps"]
    if isinstance(clear, bool) or not isinstance(clear, int) or clear < 0:
        raise ValueError(f"server_clear_steps must be an integer >= 0, got {clear!r}")
    return _ParsedState(
        accountant=state["accountant"],
        budget=budget,
        sampling=_check_sampling(state["sampling"]),
        sampling_rate=None if rate is None else float(rate),
        history=_parse_history(state["history"], "history"),
        server_history=_parse_history(state["server_history"], "server_history"),
        server_clear_steps=clear,
        discrete=_parse_discrete(state.get("discrete_history", []), "discrete_history"),
        server_discrete=_parse_discrete(
            state.get("discrete_server_history", []), "discrete_server_history"
        ),
    )
