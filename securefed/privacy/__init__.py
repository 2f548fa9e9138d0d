"""Differential privacy: the ledger (RDP via dp-accounting), calibration, noise, clipping.

* :class:`PrivacyLedger`: records every noisy release, reports epsilon against each observer
  (:data:`OBSERVERS`: the released model's observers, the server), enforces a budget.
* :func:`noise_for_target` / :func:`epsilon_for_schedule`: calibration on the ledger's accountants
  (:mod:`securefed.privacy.accounting`: RDP through dp-accounting, no torch).
* :class:`SeededGaussian` (tests, benchmarks) and :class:`SecureGaussian` (deployment).
* :func:`release_rows`: the fusion shape (per-query vectors), charging a ledger per row.
* The aggregation-shape wrapper is :class:`securefed.transport.dp.DPTransport`; record-level
  DP-SGD for torch models is :func:`securefed.privacy.dpsgd.make_private` (extra ``dp-torch``).

See ``docs/privacy.md``.
"""

from securefed.privacy.calibration import epsilon_for_schedule, noise_for_target
from securefed.privacy.ledger import (
    ACCOUNTANT_SAMPLING,
    ACCOUNTANTS,
    OBSERVERS,
    PrivacyBudget,
    PrivacyLedger,
    epsilon_of_history,
)
from securefed.privacy.noise import (
    NoiseSource,
    SecureGaussian,
    SeededGaussian,
    clip_factors,
    clip_rows,
    noise_source,
    release_rows,
    segment_norms,
)

__all__ = [
    "ACCOUNTANTS",
    "ACCOUNTANT_SAMPLING",
    "OBSERVERS",
    "NoiseSource",
    "PrivacyBudget",
    "PrivacyLedger",
    "SecureGaussian",
    "SeededGaussian",
    "clip_factors",
    "clip_rows",
    "epsilon_for_schedule",
    "epsilon_of_history",
    "noise_for_target",
    "noise_source",
    "release_rows",
    "segment_norms",
]
