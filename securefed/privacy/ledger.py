"""The privacy ledger: every noisy release recorded where the noise is added (Opacus accountants).

A :class:`PrivacyLedger` keeps the history of Gaussian releases as ``(noise_multiplier,
sample_rate, steps)`` triples (the format of Opacus's ``IAccountant.history``) and reports the
``epsilon`` spent at any ``delta``. It uses :mod:`opacus.accountants` directly, without a
``PrivacyEngine``:

* ``"rdp"`` (default): Rényi-DP accounting of the sampled Gaussian mechanism (Mironov,
  "Rényi Differential Privacy", CSF 2017; Mironov, Talwar and Zhang, "Rényi Differential Privacy
  of the Sampled Gaussian Mechanism", 2019), converted to ``(epsilon, delta)`` by Balle et al.,
  "Hypothesis Testing Interpretations and Renyi Differential Privacy", AISTATS 2020, Theorem 21.
  The RDP curve of each ``(sigma, q)`` pair is computed once and scaled by its step count, which
  gives exactly Opacus's ``RDPAccountant.get_epsilon`` at a fraction of the cost per round.
* ``"prv"``: numerical composition of privacy random variables (Gopi, Lee and Wutschitz,
  "Numerical Composition of Differential Privacy", NeurIPS 2021), tighter, slower; through
  Opacus's ``PRVAccountant``.

Both accountants analyse *Poisson* subsampling: each client (or record) takes part in a step
independently with probability ``q``. That is :attr:`PrivacyLedger.accounting_sampling`. The
ledger also records the sampling the runtime actually used (:attr:`PrivacyLedger.sampling`,
``"all"``, ``"poisson"`` or ``"fixed"``); ``securefed.audit`` flags a mismatch (fixed-size
sampling without replacement, or everyone every round, while a rate ``q < 1`` was charged:
the reported epsilon would be too small; e.g. 3.58 instead of 2.10 for fixed-size sampling at
sigma 1, q 0.01, 1000 steps, delta 1e-5).

Pinned figures (tests): sigma 1.0, q 0.01, 1000 steps, delta 1e-5 gives epsilon 2.1014 (RDP) and
1.8384 (PRV).
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from securefed.errors import LedgerFormatError, PrivacyBudgetExceeded
from securefed.integrity import check_key, read_json, verify, write_sealed_json

ACCOUNTANTS = ("rdp", "prv")
ACCOUNTANT_SAMPLING = "poisson"
SAMPLING_MODES = ("all", "poisson", "fixed")
LEDGER_FORMAT = "securefed.privacy_ledger"
LEDGER_VERSION = 2


@dataclass(frozen=True)
class PrivacyBudget:
    """An ``(epsilon, delta)`` budget.

    Attributes:
        epsilon: the most epsilon that may be spent (> 0).
        delta: the delta at which epsilon is measured, in (0, 1).
    """

    epsilon: float
    delta: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.epsilon) and self.epsilon > 0):
            raise ValueError(f"budget epsilon must be finite and > 0, got {self.epsilon!r}")
        _check_delta(self.delta)


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


@lru_cache(maxsize=256)
def _unit_rdp(noise_multiplier: float, sample_rate: float) -> np.ndarray:
    """RDP of one step of the sampled Gaussian mechanism at Opacus's default orders."""
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis import rdp as rdp_analysis

    curve = rdp_analysis.compute_rdp(
        q=sample_rate,
        noise_multiplier=noise_multiplier,
        steps=1,
        orders=RDPAccountant.DEFAULT_ALPHAS,
    )
    curve = np.asarray(curve, dtype=np.float64)
    curve.setflags(write=False)
    return curve


def epsilon_of_history(
    history: list[tuple[float, float, int]], delta: float, accountant: str = "rdp"
) -> float:
    """Epsilon at ``delta`` of a history of ``(noise_multiplier, sample_rate, steps)`` triples.

    Pure function (no ledger state). RDP: the sum over the history of ``steps * RDP(sigma, q)``
    at Opacus's default orders, converted by Opacus's ``get_privacy_spent``. PRV: Opacus's
    ``PRVAccountant.get_epsilon`` (its upper bound, ``eps_error=0.01``).
    """
    _check_delta(delta)
    _check_accountant(accountant)
    if not history:
        return 0.0
    if accountant == "rdp":
        from opacus.accountants import RDPAccountant
        from opacus.accountants.analysis import rdp as rdp_analysis

        total = sum(steps * _unit_rdp(float(sigma), float(q)) for sigma, q, steps in history)
        eps, _ = rdp_analysis.get_privacy_spent(
            orders=RDPAccountant.DEFAULT_ALPHAS, rdp=total, delta=delta
        )
        return float(eps)
    from opacus.accountants import PRVAccountant

    prv = PRVAccountant()
    prv.history = [(float(s), float(q), int(n)) for s, q, n in history]
    # q = 1 makes log(1 - q) = -inf inside the PRV's support computation; that is expected.
    with np.errstate(divide="ignore"):
        return float(prv.get_epsilon(delta=delta))


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
        from opacus.accountants import create_accountant

        self.accountant = _check_accountant(accountant)
        if budget is not None and not isinstance(budget, PrivacyBudget):
            budget = PrivacyBudget(*budget)
        self.budget: PrivacyBudget | None = budget
        self.sampling: str | None = _check_sampling(sampling)
        self.path = None if path is None else Path(path)
        self._key = check_key(key)
        self._accountant = create_accountant(mechanism=self.accountant)

    # ------------------------------------------------------------------ reading
    @property
    def history(self) -> list[tuple[float, float, int]]:
        """``(noise_multiplier, sample_rate, steps)`` triples, consecutive equal steps merged."""
        return [(float(s), float(q), int(n)) for s, q, n in self._accountant.history]

    @property
    def steps(self) -> int:
        """Number of noisy releases recorded."""
        return sum(n for _, _, n in self.history)

    def _delta(self, delta: float | None) -> float:
        if delta is not None:
            return delta
        if self.budget is not None:
            return self.budget.delta
        raise ValueError("give delta: this ledger has no budget to take it from")

    def epsilon(self, delta: float | None = None) -> float:
        """Epsilon spent so far at ``delta`` (default: the budget's delta)."""
        return epsilon_of_history(self.history, self._delta(delta), self.accountant)

    def epsilon_after(
        self,
        noise_multiplier: float,
        sample_rate: float,
        *,
        steps: int = 1,
        delta: float | None = None,
    ) -> float:
        """Epsilon that would be spent after charging these steps (nothing is recorded)."""
        _check_step(noise_multiplier, sample_rate, steps)
        trial = self._trial(noise_multiplier, sample_rate, steps)
        return epsilon_of_history(
            [(float(s), float(q), int(n)) for s, q, n in trial.history],
            self._delta(delta),
            self.accountant,
        )

    def would_exceed(self, noise_multiplier: float, sample_rate: float, *, steps: int = 1) -> bool:
        """Whether charging these steps would overrun the budget (False without a budget)."""
        if self.budget is None:
            _check_step(noise_multiplier, sample_rate, steps)
            return False
        return self.epsilon_after(noise_multiplier, sample_rate, steps=steps) > self.budget.epsilon

    # ------------------------------------------------------------------ charging
    def _trial(self, noise_multiplier: float, sample_rate: float, steps: int):
        trial = copy.deepcopy(self._accountant)
        for _ in range(int(steps)):
            trial.step(noise_multiplier=float(noise_multiplier), sample_rate=float(sample_rate))
        return trial

    def charge(self, noise_multiplier: float, sample_rate: float, *, steps: int = 1) -> None:
        """Record ``steps`` Gaussian releases with this noise multiplier and sampling rate.

        The step is first applied to a copy; if the copy's epsilon exceeds the budget, nothing
        is recorded and :class:`PrivacyBudgetExceeded` names the figures.

        Raises:
            PrivacyBudgetExceeded: the budget would be overrun (ledger unchanged).
            ValueError: a non-positive noise multiplier, a rate outside (0, 1], bad steps.
        """
        _check_step(noise_multiplier, sample_rate, steps)
        trial = self._trial(noise_multiplier, sample_rate, steps)
        if self.budget is not None:
            after = epsilon_of_history(
                [(float(s), float(q), int(n)) for s, q, n in trial.history],
                self.budget.delta,
                self.accountant,
            )
            if after > self.budget.epsilon:
                raise PrivacyBudgetExceeded(
                    f"privacy budget exceeded: {steps} more release(s) with noise multiplier "
                    f"{noise_multiplier:g} at sample rate {sample_rate:g} would bring epsilon to "
                    f"{after:.4f} at delta {self.budget.delta:g}, over the budget of "
                    f"{self.budget.epsilon:g} (spent so far: {self.epsilon():.4f} over "
                    f"{self.steps} release(s), {self.accountant} accountant); nothing was "
                    "recorded and nothing should be released"
                )
        self._accountant = trial
        if self.path is not None:
            self.save(self.path, key=self._key)

    def record_sampling(self, sampling: object) -> None:
        """Record the runtime's sampling mode (a mode string or a ``ClientSampling``)."""
        self.sampling = _check_sampling(sampling)

    # ------------------------------------------------------------------ reporting
    def summary(self, delta: float | None = None) -> dict[str, object]:
        """JSON-ready public parameters for views and the audit.

        Keys: ``accountant``, ``accountant_sampling``, ``sampling``, ``steps``,
        ``sample_rate`` (the largest charged, ``None`` if nothing was charged),
        ``epsilon``/``delta`` (when a delta is known), ``epsilon_budget``.
        """
        known = delta if delta is not None else (self.budget.delta if self.budget else None)
        history = self.history
        return {
            "accountant": self.accountant,
            "accountant_sampling": self.accounting_sampling,
            "sampling": self.sampling,
            "steps": self.steps,
            "sample_rate": max((q for _, q, _ in history), default=None),
            "epsilon": None if known is None else self.epsilon(known),
            "delta": known,
            "epsilon_budget": None if self.budget is None else self.budget.epsilon,
        }

    # ------------------------------------------------------------------ persistence
    def state_dict(self) -> dict[str, object]:
        """JSON-serialisable state: accountant, sampling, budget and the history triples."""
        return {
            "format": LEDGER_FORMAT,
            "version": LEDGER_VERSION,
            "accountant": self.accountant,
            "accountant_sampling": self.accounting_sampling,
            "sampling": self.sampling,
            "budget": None
            if self.budget is None
            else {"epsilon": self.budget.epsilon, "delta": self.budget.delta},
            "history": [[s, q, n] for s, q, n in self.history],
        }

    def load_state_dict(self, state: Mapping[str, object]) -> None:
        """Restore the history and sampling mode written by :meth:`state_dict`.

        The budget stays the one this ledger was built with (it is configuration). Nothing
        changes unless the whole state is valid.

        Raises:
            ValueError: a different accountant, a malformed history, an unknown format.
        """
        history, sampling = _parse_state(state, self.accountant)
        self._accountant.history = history
        self.sampling = sampling

    def resume_conflicts(self, state: Mapping[str, object]) -> list[str]:
        """Why this ledger cannot continue from a saved ``state`` (empty: it can).

        A run resumes a ledger only into a fresh one built with the same configuration, or into
        one that already holds exactly the saved history. Anything else would lose or invent
        releases: a ledger that recorded more than the checkpoint (the crashed process got past
        it) must not be rolled back, and one with another history belongs to another run.

        Raises:
            ValueError: ``state`` is not a ledger state.
        """
        history, sampling = _parse_state(state, None)
        causes = []
        if state.get("accountant") != self.accountant:
            causes.append(
                f"accountant: the checkpoint's ledger uses {state.get('accountant')!r}, this "
                f"one {self.accountant!r}"
            )
        mine = None if self.budget is None else [self.budget.epsilon, self.budget.delta]
        budget = state.get("budget")
        saved = None if not budget else [budget.get("epsilon"), budget.get("delta")]
        if mine != saved:
            causes.append(f"budget: the checkpoint's ledger has {saved}, this one {mine}")
        if self.sampling is not None and sampling is not None and self.sampling != sampling:
            causes.append(f"sampling: the checkpoint's is {sampling!r}, this one {self.sampling!r}")
        if self.history and self.history != history:
            causes.append(
                f"history: this ledger already recorded {self.steps} release(s) that are not the "
                f"checkpoint's {sum(n for _, _, n in history)}; resuming would roll it back or "
                "mix two runs"
            )
        return causes

    @classmethod
    def of_history(
        cls,
        history: list[tuple[float, float, int]],
        accountant: str = "rdp",
        *,
        sampling: object = None,
    ) -> PrivacyLedger:
        """A ledger (no budget) that holds ``(noise_multiplier, sample_rate, steps)`` triples.

        Raises:
            ValueError: a malformed triple.
        """
        ledger = cls(accountant, sampling=sampling)
        state = ledger.state_dict() | {"history": [list(entry) for entry in history]}
        ledger.load_state_dict(state)
        return ledger

    @classmethod
    def from_state_dict(cls, state: Mapping[str, object]) -> PrivacyLedger:
        """A ledger rebuilt from :meth:`state_dict`, budget included."""
        budget = state.get("budget")
        ledger = cls(
            str(state.get("accountant", "rdp")),
            budget=None if not budget else PrivacyBudget(budget["epsilon"], budget["delta"]),
        )
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
    {"format", "version", "accountant", "accountant_sampling", "sampling", "budget", "history"}
)


def _parse_state(
    state: Mapping[str, object], accountant: str | None
) -> tuple[list[tuple[float, float, int]], str | None]:
    """The history and sampling of a ledger state, every field checked.

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
    missing, unknown = sorted(_STATE_KEYS - set(state)), sorted(set(state) - _STATE_KEYS)
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
        if not isinstance(budget, Mapping) or set(budget) != {"epsilon", "delta"}:
            raise ValueError(f"budget must be null or {{epsilon, delta}}, got {budget!r}")
        PrivacyBudget(budget["epsilon"], budget["delta"])
    if not isinstance(state["history"], list):
        raise ValueError("ledger history must be a list of [sigma, q, steps]")
    history = []
    for entry in state["history"]:
        if not isinstance(entry, (list, tuple)) or len(entry) != 3:
            raise ValueError(f"ledger history entries are [sigma, q, steps], got {entry!r}")
        sigma, q, steps = entry
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in entry)
        if not numbers:
            raise ValueError(f"ledger history entries are three numbers, got {entry!r}")
        _check_step(float(sigma), float(q), steps)
        history.append((float(sigma), float(q), int(steps)))
    return history, _check_sampling(state["sampling"])
