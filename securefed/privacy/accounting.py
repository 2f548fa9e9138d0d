"""The accountants' mathematics, without torch: RDP through Google's ``dp-accounting``.

The ledger (:mod:`securefed.privacy.ledger`) keeps histories of ``(noise_multiplier,
sample_rate, steps)`` triples; this module turns them into epsilons.

* RDP (the default accountant, extra ``dp``: ``pip install 'securefed[dp]'``, no torch): the
  Rényi DP of one step of the Poisson-subsampled Gaussian mechanism (Mironov, Talwar and Zhang,
  "Rényi Differential Privacy of the Sampled Gaussian Mechanism", 2019, Sections 3.1-3.3), from
  ``dp_accounting.rdp.RdpAccountant``, at the orders Opacus's ``RDPAccountant`` uses
  (:data:`RDP_ORDERS`), summed over the history and converted to ``(epsilon, delta)`` by Balle
  et al., "Hypothesis Testing Interpretations and Renyi Differential Privacy", AISTATS 2020,
  Theorem 21 (``dp_accounting.rdp.compute_epsilon``; Opacus's ``get_privacy_spent`` applies the
  same formula). ``tests/test_accounting.py`` checks the epsilons against Opacus's accountant.
* PRV (Gopi, Lee and Wutschitz 2021): Opacus's ``PRVAccountant``, so it needs the ``dp-torch``
  extra (Opacus imports torch).

Where dp-accounting's series for a fractional order does not converge, it leaves that order
out: the epsilon then comes from the other orders and can only be larger (more conservative)
than Opacus's.
"""

from __future__ import annotations

import importlib
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from types import ModuleType

import numpy as np

RDP_ORDERS: tuple[float, ...] = tuple([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)))
"""The Rényi orders of the RDP accountant: Opacus's ``RDPAccountant.DEFAULT_ALPHAS``."""


class AccountingUnavailable(ModuleNotFoundError):
    """The package an accountant needs is not installed (the message names the pip extra;
    ``name`` is the missing module, so the command line names the extra in one line)."""


def _need(module: str, extra: str, what: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError:
        raise AccountingUnavailable(
            f"{what} needs the {extra!r} extra: pip install 'securefed[{extra}]'",
            name=module.split(".")[0],
        ) from None


def dp_accounting() -> ModuleType:
    """The ``dp_accounting`` package (extra ``dp``)."""
    _need("dp_accounting.rdp", "dp", "DP accounting (the RDP accountant)")
    return importlib.import_module("dp_accounting")


@lru_cache(maxsize=512)
def unit_rdp(noise_multiplier: float, sample_rate: float) -> np.ndarray:
    """RDP at :data:`RDP_ORDERS` of one step of the Poisson-subsampled Gaussian (read-only)."""
    accounting = dp_accounting()
    accountant = accounting.rdp.RdpAccountant(list(RDP_ORDERS))
    event = accounting.PoissonSampledDpEvent(
        float(sample_rate), accounting.GaussianDpEvent(float(noise_multiplier))
    )
    quiet = logging.getLogger("absl")  # a fractional order left out is logged, not an error
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        accountant.compose(event)
    finally:
        quiet.setLevel(level)
    # The composed curve: dp-accounting keeps it in ``_rdp`` (there is no public getter);
    # tests/test_accounting.py pins it against Opacus's for every version we install.
    curve = np.array(accountant._rdp, dtype=np.float64)
    curve.setflags(write=False)
    return curve


def rdp_epsilon(curve: np.ndarray, delta: float) -> float:
    """Epsilon at ``delta`` of an RDP curve at :data:`RDP_ORDERS` (Balle et al. 2020, Thm 21)."""
    accounting = dp_accounting()
    epsilon, _ = accounting.rdp.compute_epsilon(list(RDP_ORDERS), list(curve), float(delta))
    return float(epsilon)


def history_rdp(history: Sequence[tuple[float, float, int]]) -> np.ndarray:
    """``sum steps * RDP(sigma, q)`` over a history of triples."""
    total = np.zeros(len(RDP_ORDERS))
    for sigma, q, steps in history:
        total = total + int(steps) * unit_rdp(float(sigma), float(q))
    return total


def prv_epsilon(history: Sequence[tuple[float, float, int]], delta: float) -> float:
    """Opacus's ``PRVAccountant`` upper bound (``eps_error=0.01``; extra ``dp-torch``)."""
    accountants = _need("opacus.accountants", "dp-torch", "the PRV accountant")
    prv = accountants.PRVAccountant()
    prv.history = [(float(s), float(q), int(n)) for s, q, n in history]
    # q = 1 makes log(1 - q) = -inf inside the PRV's support computation; that is expected.
    with np.errstate(divide="ignore"):
        return float(prv.get_epsilon(delta=delta))


class StepHistory:
    """A history of Gaussian steps as ``(noise_multiplier, sample_rate, steps)`` triples,
    consecutive equal steps merged (the format of Opacus's ``IAccountant.history``)."""

    def __init__(self) -> None:
        self.history: list[tuple[float, float, int]] = []

    def step(self, *, noise_multiplier: float, sample_rate: float) -> None:
        if self.history and self.history[-1][:2] == (noise_multiplier, sample_rate):
            self.history[-1] = (noise_multiplier, sample_rate, self.history[-1][2] + 1)
        else:
            self.history.append((noise_multiplier, sample_rate, 1))


def _poisson_gaussian_rdp(noise_multiplier: float, sample_rate: float, orders) -> np.ndarray:
    """dp-accounting's add/remove RDP of the Poisson-subsampled Gaussian at any ``orders``."""
    accounting = dp_accounting()
    accountant = accounting.rdp.RdpAccountant([float(a) for a in orders])
    event = accounting.PoissonSampledDpEvent(
        float(sample_rate), accounting.GaussianDpEvent(float(noise_multiplier))
    )
    quiet = logging.getLogger("absl")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        accountant.compose(event)
    finally:
        quiet.setLevel(level)
    return np.array(accountant._rdp, dtype=np.float64)


@lru_cache(maxsize=512)
def replace_sampled_rdp(noise_multiplier: float, sample_rate: float) -> np.ndarray:
    """RDP at :data:`RDP_ORDERS` of one Poisson-subsampled Gaussian step under *replacement*
    adjacency (one subject's data changed; read-only).

    The release is ``sum_{i sampled} g_i + N(0, (sigma * 2 C)^2 I)`` with ``||g_i|| <= C`` and
    every subject sampled independently with probability ``q``, the sample independent of the
    data and unseen by the observer. Replacing subject ``x`` by ``x'`` (runs ``D``, ``D'``) passes
    through the run ``R`` without ``x``: ``D ~ R`` and ``R ~ D'`` are add/remove neighbours, at
    which the release is the sampled Gaussian mechanism of sensitivity ``C`` and noise
    multiplier ``z = 2 sigma`` (Mironov, Talwar and Zhang 2019; dp-accounting's add/remove curve
    ``r``, which holds in both directions). Mironov 2017, Proposition 11 (the weak triangle
    inequality, ``p = q = 2``) gives ``D_a(D || D') <= (a - 1/2) / (a - 1) r(2a) + r(2a - 1)``.
    dp-accounting refuses Poisson sampling under its ``REPLACE_ONE`` relation, which is why the
    add/remove curve at ``2 sigma`` is not simply charged. At ``q = 1`` the bound is within
    about 1.5% of the exact unsampled replacement epsilon (the Gaussian at ``sigma``).
    """
    if not (math.isfinite(noise_multiplier) and noise_multiplier > 0):
        raise ValueError(f"noise_multiplier must be finite and > 0, got {noise_multiplier!r}")
    if not 0 < sample_rate <= 1:
        raise ValueError(f"sample_rate must lie in (0, 1], got {sample_rate!r}")
    alphas = np.asarray(RDP_ORDERS)
    z = 2.0 * float(noise_multiplier)
    curve = (alphas - 0.5) / (alphas - 1.0) * _poisson_gaussian_rdp(
        z, sample_rate, 2.0 * alphas
    ) + _poisson_gaussian_rdp(z, sample_rate, 2.0 * alphas - 1.0)
    curve = np.where(np.isnan(curve), np.inf, curve)
    curve.setflags(write=False)
    return curve


@dataclass(frozen=True)
class SampledReplaceGaussian:
    """One Poisson-subsampled Gaussian release under replacement adjacency, as the ledger
    charges it (:func:`replace_sampled_rdp`; JSON-ready).

    Attributes:
        noise_multiplier: ``sigma``, the noise std over the replacement sensitivity ``2 C``.
        sample_rate: ``q``, each subject's (secret) inclusion probability, in (0, 1].
    """

    noise_multiplier: float
    sample_rate: float
    mechanism: str = "poisson_gaussian_replace"

    def __post_init__(self) -> None:
        if self.mechanism != "poisson_gaussian_replace":
            raise ValueError(
                f"mechanism must be 'poisson_gaussian_replace', got {self.mechanism!r}"
            )
        replace_sampled_rdp(float(self.noise_multiplier), float(self.sample_rate))  # validates

    def rdp(self, orders: Sequence[float]) -> np.ndarray:
        """Its Rényi DP at ``orders`` (only :data:`RDP_ORDERS`, the ledger's)."""
        if tuple(float(a) for a in orders) != RDP_ORDERS:
            raise ValueError("a sampled replacement release is accounted at RDP_ORDERS only")
        return replace_sampled_rdp(float(self.noise_multiplier), float(self.sample_rate))

    def as_list(self) -> list[object]:
        """``[mechanism, sigma, q]`` (the ledger's JSON form)."""
        return [self.mechanism, float(self.noise_multiplier), float(self.sample_rate)]

    @classmethod
    def from_list(cls, entry: object) -> SampledReplaceGaussian:
        """Parse :meth:`as_list` (raises ``ValueError`` naming the entry)."""
        if not isinstance(entry, (list, tuple)) or len(entry) != 3:
            raise ValueError(f"a sampled replacement release is [mechanism, sigma, q]: {entry!r}")
        return cls(float(entry[1]), float(entry[2]), entry[0])
