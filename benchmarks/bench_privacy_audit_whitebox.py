"""White-box canary audit of the DP transports: faults caught, false alarms, over many seeds.

``python -m securefed.bench.bench_privacy_audit_whitebox``: for each transport and ledger
epsilon, runs :func:`securefed.audit.whitebox.run_whitebox_audit` (canary clients with crafted
unit-direction updates through the transport's real aggregation rounds: its clip, noise,
secure aggregation and ledger) once per seed, correct and with each deliberate fault of
:mod:`securefed.audit.faults` (the noise multiplier overstated 1.5x, the noise reused across
rounds, the clip off). A run is *caught* when an estimate's lower confidence limit exceeds the
ledger's epsilon for its observer (weighted Holm across the run's estimates). Rows: transport,
ledger epsilon, fault, seeds caught, the median estimates of the released model's constant
and alternating families (Gaussian-DP *estimates*, not rigorous bounds; the constant family's
lower limit too) and, for the first seed, the rigorous one-run lower bound (Steinke et al.;
a second run whose canaries are each included with probability 1/2).

Output under ``--out``: ``privacy_audit_whitebox.json`` and ``.md``. Exit status 1 when a
correct run is caught (a false alarm) or a fault is missed in more than a tenth of its seeds.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

from securefed import RoundSelection
from securefed.audit.faults import inject_dp_fault
from securefed.audit.whitebox import WhiteBoxConfig, run_whitebox_audit
from securefed.records import dumps_record
from securefed.transport import build_transport


def _options(epsilon: float, clip: float, delta: float) -> dict[str, object]:
    return {"epsilon": epsilon, "delta": delta, "dp.clip": clip}


def audit_cell(
    transport: str, epsilon: float, fault: str, seeds: range, config: WhiteBoxConfig, clip: float
) -> dict[str, object]:
    """One (transport, epsilon, fault) cell over ``seeds``."""
    options = _options(epsilon, clip, config.delta)

    def make():
        return build_transport(
            transport,
            options,
            total_rounds=config.rounds,
            n_clients=config.n_canaries,
            sample_rate=1.0,
            keep_payloads=RoundSelection(every=True),  # local DP: the server's own-payload view
        )

    caught, estimates, lows, refused, bound = 0, [], [], None, None
    alternating, caught_by = [], {}
    started = time.perf_counter()
    for seed in seeds:
        guard = contextlib.nullcontext() if fault == "none" else inject_dp_fault(fault)
        try:
            with guard:
                report = run_whitebox_audit(config, make, seed=seed, rigorous=seed == seeds[0])
        except ValueError as error:  # a defence refused the fault (the integer encoder's clip)
            refused = str(error)
            break
        caught += report.caught
        for key, hit in report.contradicted.items():
            caught_by[key] = caught_by.get(key, 0) + int(hit)
        alternating.append(
            max(
                report.estimates[k].epsilon
                for k in report.estimates
                if k.startswith("released_model/alternating")
            )
        )
        estimate = report.estimates["released_model/constant"]
        estimates.append(estimate.epsilon)
        lows.append(estimate.epsilon_low)
        if report.rigorous:
            bound = report.rigorous["released_model"].epsilon_lower
        ledger = report.epsilon_ledger["released_model"]
    return {
        "transport": transport,
        "epsilon_target": epsilon,
        "fault": fault,
        "seeds": len(seeds),
        "caught": None if refused else caught,
        "refused": refused,
        "epsilon_ledger": None if refused else ledger,
        "estimate_median": None if refused else float(np.median(estimates)),
        "estimate_low_median": None if refused else float(np.median(lows)),
        "alternating_estimate_median": None if refused else float(np.median(alternating)),
        "caught_by": caught_by,
        "rigorous_lower_bound_seed0": bound,
        "seconds": time.perf_counter() - started,
    }


def _markdown(rows: list[dict], header: str) -> str:
    columns = [
        "transport",
        "epsilon_target",
        "fault",
        "seeds",
        "caught",
        "epsilon_ledger",
        "estimate_median",
        "estimate_low_median",
        "alternating_estimate_median",
        "rigorous_lower_bound_seed0",
        "seconds",
    ]
    lines = [header, "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        cells = []
        for c in columns:
            value = row[c]
            if c == "caught" and row["refused"]:
                value = "refused: " + row["refused"][:60]
            elif isinstance(value, float):
                value = f"{value:.3g}"
            cells.append(str(value))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m securefed.bench.bench_privacy_audit_whitebox")
    parser.add_argument(
        "--transports",
        default="dp",
        help="transport specs separated by ';' "
        "(e.g. 'dp;secagg+dp;secagg+dp:mechanism=skellam;ckks+dp:mechanism=gaussian')",
    )
    parser.add_argument("--epsilons", default="1,4,8")
    parser.add_argument("--faults", default="none,noise/1.5,noise-reused,clip-off")
    parser.add_argument("--seeds-correct", type=int, default=20)
    parser.add_argument("--seeds-fault", type=int, default=10)
    parser.add_argument("--constant", type=int, default=980)
    parser.add_argument("--alternating", type=int, default=20)
    parser.add_argument("--held-out", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--out", default="results/privacy_audit_whitebox")
    args = parser.parse_args(argv)
    config = WhiteBoxConfig(
        n_constant=args.constant,
        n_alternating=args.alternating,
        n_held_out=args.held_out,
        rounds=args.rounds,
        delta=args.delta,
    )
    rows = []
    load_before = os.getloadavg()
    for transport in args.transports.split(";"):
        for epsilon in [float(e) for e in args.epsilons.split(",")]:
            for fault in args.faults.split(","):
                n = args.seeds_correct if fault == "none" else args.seeds_fault
                row = audit_cell(transport, epsilon, fault, range(n), config, args.clip)
                rows.append(row)
                print(dumps_record(row), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "privacy_audit_whitebox"
    record = {
        "command": "python -m securefed.bench.bench_privacy_audit_whitebox "
        + " ".join(argv or sys.argv[1:]),
        "config": {
            "n_constant": config.n_constant,
            "n_alternating": config.n_alternating,
            "n_held_out": config.n_held_out,
            "rounds": config.rounds,
            "dim": config.dimension,
            "norm": config.norm,
            "clip": args.clip,
            "confidence": config.confidence,
            "delta": config.delta,
        },
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "rows": rows,
    }
    (out / f"{stem}.json").write_text(dumps_record(record, indent=2, default=str))
    header = (
        f"White-box canaries ({config.n_constant} constant + {config.n_alternating} alternating "
        f"canary clients, {config.n_held_out} held-out directions, dim {config.dimension}, "
        f"{config.rounds} rounds, canary norm {config.norm:g}, clip {args.clip:g}); caught = the "
        f"Gaussian-DP estimate's {config.confidence:.0%} lower limit above the ledger (weighted "
        f"Holm across the run's estimates). Estimates are estimates, the one-run bound is "
        f"rigorous. Load average before/after: {load_before[0]:.1f}/{os.getloadavg()[0]:.1f}."
    )
    (out / f"{stem}.md").write_text(_markdown(rows, header))
    bad = [
        r
        for r in rows
        if not r["refused"]
        and (
            (r["fault"] == "none" and r["caught"])
            or (r["fault"] != "none" and r["caught"] < math.ceil(0.9 * r["seeds"]))
        )
    ]
    for r in bad:
        print(
            f"privacy-audit-whitebox: {r['transport']} epsilon {r['epsilon_target']:g} "
            f"fault {r['fault']}: caught {r['caught']} of {r['seeds']}",
            file=sys.stderr,
        )
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
