"""Calibration: the noise a target ``(epsilon, delta)`` needs, and the epsilon a schedule spends.

Both functions assume what the ledger assumes: ``rounds`` releases of the Poisson-subsampled
Gaussian mechanism with rate ``sample_rate`` (one accountant step per round; for client-level DP
``sample_rate = clients per round / all clients`` and the noise multiplier is the noise std on the
sum of clipped updates over the clip norm).

:func:`noise_for_target` is Opacus's ``get_noise_multiplier`` (a doubling search for an upper
bracket, then bisection that only ever moves the upper end to a noise level whose epsilon is
below the target), so the returned multiplier never overshoots: ``epsilon_for_schedule`` at that
multiplier is at most the target. Checked figure (specs/transport.md): target 8, delta 1e-5,
q 0.01, 1000 rounds gives 0.6158 (rdp) and 0.5865 (prv).
"""

from __future__ import annotations

import math
import warnings

from securefed.privacy.ledger import _check_accountant, _check_delta, epsilon_of_history


def _check_schedule(sample_rate: float, rounds: int) -> None:
    if not (0 < sample_rate <= 1):
        raise ValueError(f"sample_rate must lie in (0, 1], got {sample_rate!r}")
    if isinstance(rounds, bool) or int(rounds) != rounds or rounds < 1:
        raise ValueError(f"rounds must be an integer >= 1, got {rounds!r}")


def epsilon_for_schedule(
    noise_multiplier: float,
    sample_rate: float,
    rounds: int,
    delta: float,
    accountant: str = "rdp",
) -> float:
    """Epsilon spent by ``rounds`` Poisson-sampled Gaussian releases.

    Args:
        noise_multiplier: noise std over sensitivity (> 0).
        sample_rate: Poisson sampling rate ``q`` in (0, 1].
        rounds: number of releases (>= 1).
        delta: target delta in (0, 1).
        accountant: ``"rdp"`` (Mironov 2017; Balle et al. 2020 conversion) or ``"prv"``
            (Gopi et al. 2021), both through Opacus.

    Returns:
        The epsilon (``1.8384`` for prv, ``2.1014`` for rdp at sigma 1, q 0.01, 1000 rounds,
        delta 1e-5).
    """
    if not (math.isfinite(noise_multiplier) and noise_multiplier > 0):
        raise ValueError(f"noise_multiplier must be finite and > 0, got {noise_multiplier!r}")
    _check_schedule(sample_rate, rounds)
    _check_delta(delta)
    return epsilon_of_history(
        [(float(noise_multiplier), float(sample_rate), int(rounds))], delta, accountant
    )


def noise_for_target(
    epsilon: float,
    delta: float,
    sample_rate: float,
    rounds: int,
    accountant: str = "rdp",
    *,
    epsilon_tolerance: float = 0.01,
) -> float:
    """The smallest noise multiplier (to ``epsilon_tolerance``) that keeps within ``epsilon``.

    Through ``opacus.accountants.utils.get_noise_multiplier``; the result's epsilon lies in
    ``[epsilon - epsilon_tolerance, epsilon]``.

    Args:
        epsilon: target epsilon (> 0).
        delta: target delta in (0, 1).
        sample_rate: Poisson sampling rate in (0, 1].
        rounds: number of releases (>= 1).
        accountant: ``"rdp"`` or ``"prv"``.
        epsilon_tolerance: how far under the target the search may stop (> 0).

    Raises:
        ValueError: for bad arguments or a target no noise level up to 1e6 reaches.
    """
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"target epsilon must be finite and > 0, got {epsilon!r}")
    if not (math.isfinite(epsilon_tolerance) and epsilon_tolerance > 0):
        raise ValueError(f"epsilon_tolerance must be > 0, got {epsilon_tolerance!r}")
    _check_delta(delta)
    _check_schedule(sample_rate, rounds)
    _check_accountant(accountant)
    from opacus.accountants.utils import get_noise_multiplier

    try:
        with warnings.catch_warnings():
            # The search's first brackets (sigma 20, 40, ...) sit at the edge of the RDP orders;
            # Opacus warns about them, not about the result.
            warnings.filterwarnings("ignore", message="Optimal order is the largest alpha")
            sigma = get_noise_multiplier(
                target_epsilon=float(epsilon),
                target_delta=float(delta),
                sample_rate=float(sample_rate),
                steps=int(rounds),
                accountant=accountant,
                epsilon_tolerance=float(epsilon_tolerance),
            )
    except ValueError as error:
        raise ValueError(
            f"no noise multiplier up to 1e6 reaches epsilon {epsilon:g} at delta {delta:g} over "
            f"{rounds} rounds at sample rate {sample_rate:g} ({accountant}): {error}"
        ) from error
    return float(sigma)
