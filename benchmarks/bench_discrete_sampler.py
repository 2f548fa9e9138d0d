"""Noise cost of one MovieLens 100K round: the exact discrete Gaussian, old and new, beside floats.

One FedMF round of ``secagg+dp`` on ML-100K draws each of the 943 users' integer noise over the
padded model (18,560 coordinates, ``benchmarks/results/distributed_dp``), in chunks of
``2^22`` values as :class:`securefed.transport.dp.DPTransport` does. For each per-client integer
variance (the recorded ``noise_per_client_units`` at epsilon 4 and 1) this times, in one process
and one run (CPU seconds, ``time.process_time``):

* ``threshold``: :func:`securefed.privacy.discrete.discrete_gaussian` (exact 62-bit thresholds);
* ``chain``: :func:`securefed.privacy.discrete.discrete_gaussian_chain` (the earlier sampler);
* ``threshold_secure``, ``chain_secure``: both from :class:`SecureIntegers` (AES-256-CTR);
* ``float_gaussian``: ``Generator.normal`` of the same count (the float path's noise);
* ``skellam``: :func:`securefed.privacy.discrete.skellam` of the same variance (numpy Poisson).

Usage:
``python -P -m securefed.bench.bench_discrete_sampler --out benchmarks/results/discrete_sampler``.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from securefed.privacy.discrete import (
    SecureIntegers,
    discrete_gaussian,
    discrete_gaussian_chain,
    skellam,
)
from securefed.records import dumps_record

CHUNK = 1 << 22


def _seconds(draw: Callable[[int], np.ndarray], total: int) -> float:
    """CPU seconds to draw ``total`` values in chunks of :data:`CHUNK`."""
    start = time.process_time()
    left = total
    while left:
        size = min(CHUNK, left)
        draw(size)
        left -= size
    return time.process_time() - start


def measure(sigma2: int, total: int, seed: int) -> dict[str, float]:
    """Seconds and ns a draw of each path for ``total`` draws at integer variance ``sigma2``."""
    rng = np.random.default_rng(seed)
    secure = SecureIntegers()
    std = float(np.sqrt(sigma2))
    paths = {
        "threshold": lambda n: discrete_gaussian(sigma2, n, rng),
        "chain": lambda n: discrete_gaussian_chain(sigma2, n, rng),
        "threshold_secure": lambda n: discrete_gaussian(sigma2, n, secure),
        "chain_secure": lambda n: discrete_gaussian_chain(sigma2, n, secure),
        "float_gaussian": lambda n: rng.normal(0.0, std, n),
        "skellam": lambda n: skellam(sigma2 / 2, n, rng),
    }
    row: dict[str, float] = {"sigma2": sigma2, "draws": total}
    for name, draw in paths.items():
        seconds = _seconds(draw, total)
        row[f"seconds_{name}"] = seconds
        row[f"ns_per_draw_{name}"] = seconds / total * 1e9
    for name in ("threshold", "chain", "threshold_secure", "chain_secure", "skellam"):
        row[f"ratio_{name}_to_float"] = row[f"seconds_{name}"] / row["seconds_float_gaussian"]
    row["speedup_threshold_over_chain"] = row["seconds_chain"] / row["seconds_threshold"]
    row["speedup_secure"] = row["seconds_chain_secure"] / row["seconds_threshold_secure"]
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--clients", type=int, default=943)
    parser.add_argument("--dim", type=int, default=18_560)
    parser.add_argument("--sigma2", type=int, nargs="+", default=[114_119, 1_149_558])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    total = args.clients * args.dim
    load_before = list(os.getloadavg())
    rows = [measure(s, total, args.seed) for s in args.sigma2]
    record = {
        "command": "python -P -m securefed.bench.bench_discrete_sampler --out " + str(args.out),
        "clients": args.clients,
        "dim": args.dim,
        "machine": "2-core dev box, BLAS threads 1 (no BLAS in these paths)",
        "load_average_before": load_before,
        "load_average_after": list(os.getloadavg()),
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "discrete_sampler.json").write_text(dumps_record(record, indent=2) + "\n")
    print(dumps_record(record, indent=2))


if __name__ == "__main__":
    main()
