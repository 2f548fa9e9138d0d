"""Would correlated noise across steps (DP-FTRL's tree, banded matrix factorization) help the
per-step sums? The accountant's answer for FedSlate's participation pattern.

A unit takes part in (at most) ``k`` *consecutive* learning steps (it stays in the replay buffer
for ``k = 687`` steps and is drawn in most of them), out of ``T`` steps. For a lower-triangular
Toeplitz strategy ``C`` (independent noise: ``C = I``; banded: ``c_j = binom(2j, j) / 4^j``,
``j < b``, Choquette-Choo et al. 2023), the squared sensitivity of ``C x`` is
``max_t0 ||C 1_[t0, t0 + k)||^2`` (non-negative coefficients), and the noise in the model's
prefix sums at step ``t`` has variance ``sigma^2 sum_{i <= t} D_i^2`` with ``D`` the cumulative
sums of ``C^-1``'s coefficients. At a fixed epsilon, sigma scales with the sensitivity, so the
figure of merit is ``sensitivity^2 x mean_t prefix variance``, here relative to independent noise
(1: no gain; below 1: correlated noise helps). ``python correlated_frontier.py``.
"""

from __future__ import annotations

import math

import numpy as np

STEPS, PARTICIPATION = 4417, 687  # the reduced schedule's learning steps; a unit's steps


def coefficients(bands: int) -> np.ndarray:
    return np.array([math.comb(2 * j, j) / 4**j for j in range(bands)])


def inverse_coefficients(c: np.ndarray, length: int) -> np.ndarray:
    """The coefficients of ``C^-1`` (lower-triangular Toeplitz), by the recursion."""
    d = np.zeros(length)
    for t in range(length):
        acc = 1.0 if t == 0 else 0.0
        for j in range(1, min(len(c), t + 1)):
            acc -= c[j] * d[t - j]
        d[t] = acc / c[0]
    return d


def merit(c: np.ndarray) -> float:
    column = np.convolve(np.ones(PARTICIPATION), c)  # C 1_P, the worst block (all inside)
    sens_sq = float((column**2).sum())
    cum = np.cumsum(inverse_coefficients(c, STEPS))
    prefix_var = np.cumsum(cum**2)  # variance of the prefix noise at each step, per sigma^2
    return sens_sq * float(prefix_var.mean())


def main() -> None:
    base = merit(np.ones(1))
    print(f"T = {STEPS} steps, a unit in {PARTICIPATION} consecutive ones")
    for bands in (2, 8, 32, 128, 687):
        print(f"banded b = {bands}: {merit(coefficients(bands)) / base:.2f} x independent")


if __name__ == "__main__":
    main()
