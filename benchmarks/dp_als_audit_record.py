"""The empirical audits of DP-ALS and of the correlated-noise transports, recorded.

``python -m securefed.bench.dp_als_audit_record [--canaries 2000] [--epsilons 1,4,8]`` runs,
for DP-ALS (:class:`~securefed.recsys.dp_als.DPALSConfig`) and the private bias model
(:func:`~securefed.recsys.dp_als.private_bias_config`) under central ``dp`` at each epsilon, one
audited run with item canaries (:mod:`securefed.attacks.dp_als_canaries`) appended to a synthetic
base population (120 users, 80 items: the audit's figure depends on the canaries, not on the
base), and writes ``benchmarks/results/frontier/audit_dp_als.{json,md}``. A row whose bound
exceeds its ledger figure exits with status 1. ``tests/test_dp_als_audit.py`` checks the same.

With ``--correlated`` it also audits central ``dp`` with each correlation (4 groups, 16 rounds)
by direction canaries and the Gaussian matched filter
(:mod:`securefed.attacks.correlated_canaries`; ``tests/test_correlated_audit.py``) and writes
``audit_correlated.{json,md}``.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

from securefed.attacks.correlated_canaries import run_canaries, scorers
from securefed.attacks.dp_als_canaries import DPALSCanaryJob
from securefed.audit.empirical import EmpiricalAuditConfig, run_empirical_audit
from securefed.bench.bench_fedmf import markdown_table, write_outputs
from securefed.privacy.correlated import CORRELATIONS
from securefed.recsys.data import ML100K_SCALE, synthetic_ratings
from securefed.recsys.dp_als import DPALSConfig, private_bias_config
from securefed.transport import build_transport

MODELS = {"dp-als": DPALSConfig, "private-bias": private_bias_config}


def audited_row(model: str, epsilon: float, audit, job, scorers, seed: int) -> dict:
    """One audited run (:func:`run_empirical_audit`, the one scorer of ``scorers``) as a row."""
    (result,) = run_empirical_audit(
        audit,
        job,
        scorers,
        rng=np.random.default_rng(seed + 1),
        epsilon_of=lambda observation, observer: observation.epsilons[observer],
        delta_of=lambda observation: observation.delta,
    ).values()
    row = {
        "model": model,
        "epsilon_target": epsilon,
        "epsilon_ledger": result.epsilon_ledger,
        "epsilon_lower": result.epsilon_lower,
        "correct": result.best.n_correct,
        "guesses": result.best.n_guesses,
        "exceeds_ledger": result.exceeds_ledger,
        "seconds": result.seconds_run,
    }
    print(row, flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--canaries", type=int, default=2000)
    parser.add_argument("--epsilons", default="1,4,8")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="benchmarks/results/frontier")
    parser.add_argument("--correlated", action="store_true", help="also audit correlated noise")
    args = parser.parse_args(argv)
    base = synthetic_ratings(120, 80, 2400, rank=4, noise=0.3, scale=ML100K_SCALE, seed=3)
    audit = EmpiricalAuditConfig(n_canaries=args.canaries, confidence=0.95, delta=1e-5)
    rows, started = [], time.perf_counter()
    load = os.getloadavg()[0]
    for name, make in MODELS.items():
        for epsilon in (float(e) for e in args.epsilons.split(",")):
            job = DPALSCanaryJob(base, make(), "dp", {"dp.epsilon": epsilon}, seed=args.seed)
            rows.append(audited_row(name, epsilon, audit, job, job.scorers(), args.seed))
    payload = {
        "command": f"python -m securefed.bench.dp_als_audit_record --canaries {args.canaries} "
        f"--epsilons {args.epsilons} --seed {args.seed}",
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"BLAS threads {os.environ.get('OMP_NUM_THREADS', 'default')}",
        "load_before": load,
        "seconds": time.perf_counter() - started,
        "transport": "dp (central Gaussian), observer released_model, confidence 0.95, "
        "delta 1e-5, Steinke-Nasr-Jagielski one-run bound",
        "base": "synthetic 120 users x 80 items, 2400 ratings (tests/conftest small_split's)",
        "rows": rows,
    }
    columns = ["model", "epsilon_target", "epsilon_ledger", "epsilon_lower", "correct", "guesses"]
    write_outputs("audit_dp_als", payload, markdown_table(rows, columns), Path(args.out))
    if args.correlated:
        rows += correlated_rows(audit, args)
    broken = [r for r in rows if r["exceeds_ledger"]]
    for row in broken:
        print(f"lower bound above the ledger: {row}", file=sys.stderr)
    return 1 if broken else 0


def correlated_rows(audit: EmpiricalAuditConfig, args: argparse.Namespace) -> list[dict]:
    """One audited run per correlation and epsilon; written to ``audit_correlated``."""
    rows, started, load = [], time.perf_counter(), os.getloadavg()[0]
    for correlation in CORRELATIONS:
        for epsilon in (float(e) for e in args.epsilons.split(",")):
            options = {"epsilon": epsilon, "correlation": correlation, "groups": 4}

            def job(included, options=options):
                transport = build_transport(
                    "dp", options, total_rounds=16, n_clients=audit.n_canaries
                )
                return run_canaries(transport, included, seed=args.seed)

            model = f"dp, correlation {correlation}"
            rows.append(audited_row(model, epsilon, audit, job, scorers(), args.seed))
    payload = {
        "command": f"python -m securefed.bench.dp_als_audit_record --correlated --canaries "
        f"{args.canaries} --epsilons {args.epsilons} --seed {args.seed}",
        "load_before": load,
        "seconds": time.perf_counter() - started,
        "transport": "dp (central), 4 cyclic groups, 16 rounds, direction canaries, Gaussian "
        "matched filter, observer released_model, confidence 0.95, delta 1e-5",
        "rows": rows,
    }
    columns = ["model", "epsilon_target", "epsilon_ledger", "epsilon_lower", "correct", "guesses"]
    write_outputs("audit_correlated", payload, markdown_table(rows, columns), Path(args.out))
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
