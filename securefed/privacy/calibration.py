"""Calibration: the noise a target ``(epsilon, delta)`` needs, and the epsilon a schedule spends.

Both functions assume what the ledger assumes: ``rounds`` releases of the Poisson-subsampled
Gaussian mechanism with rate ``sample_rate`` (one accountant step per round; for client-level DP
``sample_rate = clients per round / all clients`` and the noise multiplier is the noise std on the
sum of clipped updates over the clip norm).

:func:`noise_for_target` searches as Opacus's ``get_noise_multiplier`` does (a doubling search
for an upper bracket from 20, then bisection that only ever moves the upper end to a noise
level whose epsilon is below the target), here on the ledger's own epsilons (no torch for the
RDP accountant), so the returned multiplier never overshoots: ``epsilon_for_schedule`` at that
multiplier is at most the target. Checked figure (specs/transport.md): target 8, delta 1e-5,
q 0.01, 1000 rounds gives 0.6160 (rdp; 0.6158 through Opacus's RDP) and 0.5865 (prv).
"""

from __future__ import annotations

import math

from securefed.privacy.ledger import _check_accountant, _check_delta, epsilon_of_history

MAX_NOISE = 1e6


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
            (Gopi et al. 2021; extra ``dp-torch``) (:mod:`securefed.privacy.accounting`).

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

    A doubling search for a noise level under the target from 20 up (at most 1e6), then a
    bisection between 0 and it that only moves its upper end to levels whose epsilon is below
    the target, until that epsilon lies within ``epsilon_tolerance`` of it.

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

    def spent(sigma: float) -> float:
        return epsilon_of_history([(sigma, float(sample_rate), int(rounds))], delta, accountant)

    high, at_high = 10.0, math.inf
    while at_high > epsilon:
        high *= 2
        if high > MAX_NOISE:
            raise ValueError(
                f"no noise multiplier up to 1e6 reaches epsilon {epsilon:g} at delta {delta:g} "
                f"over {rounds} rounds at sample rate {sample_rate:g} ({accountant})"
            )
        at_high = spent(high)
    low = 0.0
    while epsilon - at_high > epsilon_tolerance:
        middle = (low + high) / 2
        at_middle = spent(middle)
        if at_middle < epsilon:
            high, at_high = middle, at_middle
        else:
            low = middle
    return float(high)
