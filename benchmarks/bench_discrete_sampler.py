"""Noise cost of one MovieLens 100K round: the exact discrete Gaussian, old and new, beside floats.

One FedMF round of ``secagg+dp`` on ML-100K draws each of the 943 users' integer noise over the
padded model (18,560 coordinates, ``benchmarks/results/distributed_dp``), in chunks of
``2^22`` values as :class:`securefed.transport.dp.DPTransport` does. For each per-client integer
variance (the recorded ``noise_per_client_units`` at epsilon 4 and 1) this times, in one process
and one run (CPU seconds, ``time.process_time``; each path ``--repeats`` times, the least kept):

* ``inversion``: :func:`securefed.privacy.discrete.discrete_gaussian` (exact CDF inversion, one
  62-bit word a draw; its table, built once per variance, is timed apart as ``table``);
* ``rejection``: :func:`securefed.privacy.discrete.discrete_gaussian_rejection` (the CKS
  Algorithm 3 sampler with exact 62-bit thresholds, the sampler before);
* ``chain``: :func:`securefed.privacy.discrete.discrete_gaussian_chain` (every exp trial by
  Algorithm 1, the sampler before that);
* the ``_secure`` paths: the same from :class:`SecureIntegers` (AES-256-CTR keyed from
  ``os.urandom``, the default outside tests and benchmarks); ``keystream_secure``: the secure
  source's 62-bit words alone (the floor of any sampler that reads one word a draw);
* ``float_gaussian``: ``Generator.normal`` of the same count (the float path's noise);
* ``skellam``: :func:`securefed.privacy.discrete.skellam` of the same variance (numpy Poisson).

Usage: ``securefed bench discrete-sampler --out benchmarks/results/discrete_sampler`` (or
``python -P -m securefed.bench.bench_discrete_sampler`` with the same options).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from securefed.bench.bench_args import add_out_argument, add_seed_argument
from securefed.bench.registry import BENCHES
from securefed.privacy import discrete
from securefed.privacy.discrete import (
    SecureIntegers,
    discrete_gaussian,
    discrete_gaussian_chain,
    discrete_gaussian_rejection,
    skellam,
)
from securefed.records import dumps_record

CHUNK = 1 << 22
RESULTS = Path("benchmarks") / "results" / "discrete_sampler"
EXACT = ("inversion", "rejection", "chain")


def _seconds(draw: Callable[[int], np.ndarray], total: int) -> float:
    """CPU seconds to draw ``total`` values in chunks of :data:`CHUNK`."""
    start = time.process_time()
    left = total
    while left:
        size = min(CHUNK, left)
        draw(size)
        left -= size
    return time.process_time() - start


def _table_seconds(sigma2: int) -> float:
    """CPU seconds to build the inversion sampler's table for ``sigma2`` from scratch."""
    discrete._inversion_table.cache_clear()
    discrete._gaussian_tail_sums.cache_clear()
    start = time.process_time()
    discrete._inversion_table(sigma2)
    return time.process_time() - start


def measure(sigma2: int, total: int, seed: int, repeats: int) -> dict[str, float]:
    """Seconds and ns a draw of each path for ``total`` draws at integer variance ``sigma2``."""
    rng = np.random.default_rng(seed)
    secure = SecureIntegers()
    std = float(np.sqrt(sigma2))
    paths = {
        "inversion": lambda n: discrete_gaussian(sigma2, n, rng),
        "inversion_secure": lambda n: discrete_gaussian(sigma2, n, secure),
        "rejection": lambda n: discrete_gaussian_rejection(sigma2, n, rng),
        "rejection_secure": lambda n: discrete_gaussian_rejection(sigma2, n, secure),
        "chain": lambda n: discrete_gaussian_chain(sigma2, n, rng),
        "chain_secure": lambda n: discrete_gaussian_chain(sigma2, n, secure),
        "keystream_secure": lambda n: secure.below(1 << 62, n),
        "float_gaussian": lambda n: rng.normal(0.0, std, n),
        "skellam": lambda n: skellam(sigma2 / 2, n, rng),
    }
    row: dict[str, float] = {"sigma2": sigma2, "draws": total}
    row["seconds_table"] = _table_seconds(sigma2)
    row["table_entries"] = int(discrete._inversion_table(sigma2)[1].size)
    for name, draw in paths.items():
        seconds = min(_seconds(draw, total) for _ in range(repeats))
        row[f"seconds_{name}"] = seconds
        row[f"ns_per_draw_{name}"] = seconds / total * 1e9
    floats = row["seconds_float_gaussian"]
    for name in (*EXACT, *(f"{n}_secure" for n in EXACT), "keystream_secure", "skellam"):
        row[f"ratio_{name}_to_float"] = row[f"seconds_{name}"] / floats
    for name in ("inversion", "inversion_secure"):
        with_table = row[f"seconds_{name}"] + row["seconds_table"]
        row[f"ratio_{name}_with_table_to_float"] = with_table / floats
    row["speedup_inversion_over_rejection"] = row["seconds_rejection"] / row["seconds_inversion"]
    row["speedup_inversion_over_rejection_secure"] = (
        row["seconds_rejection_secure"] / row["seconds_inversion_secure"]
    )
    return row


def run(args: argparse.Namespace) -> int:
    total = args.clients * args.dim
    load_before = list(os.getloadavg())
    rows = [measure(s, total, args.seed, args.repeats) for s in args.sigma2]
    record = {
        "command": "securefed bench discrete-sampler --out "
        + str(args.out)
        + f" --repeats {args.repeats}",
        "clients": args.clients,
        "dim": args.dim,
        "repeats": args.repeats,
        "machine": "2-core dev box, BLAS threads 1 (no BLAS in these paths)",
        "load_average_before": load_before,
        "load_average_after": list(os.getloadavg()),
        "rows": rows,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "discrete_sampler.json").write_text(dumps_record(record, indent=2) + "\n")
    print(dumps_record(record, indent=2))
    return 0


def register(benches) -> None:
    """Add ``discrete-sampler`` to the ``securefed bench`` subcommands."""
    parser = BENCHES["discrete-sampler"].add_to(benches)
    add_out_argument(parser, RESULTS)
    parser.add_argument(
        "--clients", type=int, default=943, help="clients of the round (ML-100K's 943)"
    )
    parser.add_argument(
        "--dim", type=int, default=18_560, help="values per client (one ML-100K FedMF upload)"
    )
    parser.add_argument(
        "--sigma2",
        type=int,
        nargs="+",
        default=[114_119, 1_149_558],
        help="the discrete Gaussian's variances to time (integers)",
    )
    add_seed_argument(parser)
    parser.add_argument("--repeats", type=int, default=1, help="runs of each path (least kept)")
    parser.set_defaults(func=run)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m securefed.bench.bench_discrete_sampler")
    register(parser.add_subparsers(dest="bench", required=True))
    args = parser.parse_args(["discrete-sampler", *(sys.argv[1:] if argv is None else argv)])
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
