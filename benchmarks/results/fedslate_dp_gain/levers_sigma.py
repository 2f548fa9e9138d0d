"""The accountant's view of issue 34's levers on the DP-SGD noise-to-signal ratio (README
section 6), before any run: ``python levers_sigma.py`` (output: ``levers_sigma.txt``).

For each cell (``cells.py``) at epsilon 8 it prints the ledger's noise multiplier ``sigma``
(:meth:`~securefed.rl.fedslate.FedSlateConfig.dp_options`, with ``dp_sampling`` the sampled
replacement bound), the epsilon that ``sigma`` gives over a unit's DP-SGD steps (the ledger's
figure, recomputed), the steps per unit and per run, the weights of a platform's local network
and of the server network (per member), and two predicted ratios:

* ``2 sigma / (q U)``: a step's noise std per coordinate (``2 sigma C``) over the most a step's
  clipped sum can hold along one direction (``q U C``), ``U`` the expected distinct units in a
  batch: ``n (1 - (1 - 1/n)^B)`` with ``n = buffer_size / steps_per_platform`` units in the
  buffer (README section 2 measured 21 at ``B`` 32, which this gives).
* the per-coordinate signal-to-noise of the server part over a run, in units of the frontier
  cell's: ``(q U C_s / sqrt(d_s)) / (2 sigma C) x sqrt(T)`` (Adam steps per coordinate; the
  signal spread over the server's ``d_s`` weights, ``T`` steps per run, the noise averaging
  as ``sqrt(T)``). A heuristic to rank the levers, not a bound.
"""

from __future__ import annotations

import math

from cells import cell

from securefed.privacy import epsilon_of_history
from securefed.rl.fedslate import dp_unit_releases, sampled_epsilon, server_network

NAMES = (
    "sums_eps8",
    "sums_eps8_split0.07",
    "split0.07_q0.5",
    "split0.07_h8",
    "split0.07_h4",
    "split0.07_h8x8",
    "split0.07_b64",
    "split0.07_b128",
    "split0.07_b64_h8",
    "split0.07_b128_h8",
)


def units_per_step(config) -> float:
    """Expected distinct units among a batch's ``batch_size`` rows drawn with replacement."""
    units = config.buffer_size / config.steps_per_platform
    return units * (1 - (1 - 1 / units) ** config.batch_size)


def local_weights(config) -> int:
    """Weights of platform A's local network (per member)."""
    from securefed.rl.fedslate import local_network

    dim = config.env_config().state_dim(0)
    net = local_network(config.__class__(**(config.to_dict() | {"members": 1})), dim)
    return sum(t.numel() for t in net.parameters())


def main() -> None:
    rows = []
    for name in NAMES:
        config = cell(name, 0).config
        bound = dp_unit_releases(config)
        steps, delta = bound["local_steps"], config.dp_delta - bound["tail_delta"]
        sigma = config.dp_options().noise_multiplier
        q = config.dp_sample_rate or 1.0
        if config.dp_sampling:
            eps = sampled_epsilon(sigma, q, steps, delta)
        else:
            eps = epsilon_of_history([(sigma, 1.0, steps)], delta)
        server = server_network(config.__class__(**(config.to_dict() | {"members": 1})))
        d_server = sum(t.numel() for t in server.parameters())
        d_local = local_weights(config)
        units = units_per_step(config)
        rounds = config.episodes * config.steps_per_platform - config.burn_in
        run_steps = math.ceil(rounds / config.learn_every)  # 4417 at learn_every 3
        clip, server_clip = config.dp_local_clip, config.dp_server_clip or config.dp_local_clip
        ratio = 2 * sigma / (q * units)
        snr = q * units * server_clip / math.sqrt(d_server) / (2 * sigma * clip)
        rows.append(
            (
                name,
                config,
                sigma,
                eps,
                steps,
                run_steps,
                d_local,
                d_server,
                units,
                ratio,
                snr * math.sqrt(run_steps),
            )
        )
    frontier = next(r for r in rows if r[0] == "sums_eps8_split0.07")[-1]
    print(f"epsilon {cell(NAMES[0], 0).config.dp_epsilon:g}, delta (less the tail) {delta:g}")
    print(
        "| cell | batch / learn_every | q | server hidden | sigma | epsilon (ledger) | steps per "
        "unit | steps per run | weights local / server | U | 2 sigma / (q U) | server SNR "
        "x sqrt(T), vs frontier |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, c, sigma, eps, steps, run_steps, dl, ds, units, ratio, total in rows:
        print(
            f"| {name} | {c.batch_size} / {c.learn_every} | {c.dp_sample_rate or 1:g} | "
            f"{c.server_hidden} | {sigma:.2f} | {eps:.2f} | {steps} | {run_steps} | {dl} / {ds} "
            f"| {units:.1f} | {ratio:.2f} | {total / frontier:.2f} |"
        )


if __name__ == "__main__":
    main()
