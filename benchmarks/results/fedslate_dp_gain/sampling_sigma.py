"""Sigma per sample rate for issue 34's secret Poisson sampling of the per-step sums.

``python sampling_sigma.py`` prints, for the reduced schedule's cells (``cells.py``) at epsilon
8, the noise multiplier the ledger calibrates under ``dp_sampling="poisson"`` at each rate
``q`` (:func:`securefed.rl.fedslate.sampled_noise_multiplier`, the replacement bound of
:func:`securefed.privacy.accounting.replace_sampled_rdp`), the epsilon of that sigma without
sampling, and the per-step noise-to-signal ratio ``2 sigma / (q U)`` with ``U`` = 21 distinct
units per step and member (measured, ``README.md`` section 2).
"""

from __future__ import annotations

from cells import cell

from securefed.privacy import epsilon_of_history
from securefed.rl.fedslate import dp_unit_releases, sampled_noise_multiplier

UNITS_PER_STEP = 21


def main() -> None:
    config = cell("sums_eps8", 0).config
    bound = dp_unit_releases(config)
    steps, delta = bound["local_steps"], config.dp_delta - bound["tail_delta"]
    base = config.dp_options().noise_multiplier
    print(f"steps per unit {steps}, delta {delta:g}, epsilon {config.dp_epsilon:g}")
    print("| q | sigma | epsilon of that sigma unsampled | 2 sigma / (q U) |")
    print("|---|---|---|---|")
    print(f"| 1 (sums) | {base:.2f} | {config.dp_epsilon:g} | {2 * base / UNITS_PER_STEP:.2f} |")
    for q in (0.5, 0.25, 0.1):
        sigma = sampled_noise_multiplier(float(config.dp_epsilon), delta, q, steps)
        plain = epsilon_of_history([(sigma, 1.0, steps)], delta)
        ratio = 2 * sigma / (q * UNITS_PER_STEP)
        print(f"| {q:g} | {sigma:.2f} | {plain:.1f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
