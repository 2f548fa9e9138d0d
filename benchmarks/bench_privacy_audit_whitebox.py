"""White-box canary audit of the DP transports: faults caught, false alarms, over many seeds.

``securefed bench privacy-audit-whitebox`` (or ``python -m
securefed.bench.bench_privacy_audit_whitebox``): for each transport and ledger
epsilon, runs :func:`securefed.audit.whitebox.run_whitebox_audit` (canary clients with crafted
unit-direction updates through the transport's real aggregation rounds: its clip, noise,
secure aggregation and ledger) once per seed, correct and with each deliberate fault of
:mod:`securefed.audit.faults` (the noise multiplier overstated 1.5x, the noise reused across
rounds, the clip off). A run is *caught* when an estimate's lower confidence limit exceeds the
ledger's epsilon for its observer (weighted Holm across the run's estimates, the noise family
included); ``caught_mean_shift_only`` judges the same runs without the noise family (the
criterion before it: old beside new in one run). Rows: transport,
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
from securefed.audit.whitebox import (
    WhiteBoxConfig,
    WhiteBoxReport,
    contradictions,
    run_whitebox_audit,
)
from securefed.bench.registry import BENCHES
from securefed.records import dumps_record
from securefed.transport import build_transport


def _options(epsilon: float, clip: float, delta: float) -> dict[str, object]:
    return {"epsilon": epsilon, "delta": delta, "dp.clip": clip}


def mean_shift_only_caught(report: WhiteBoxReport) -> bool:
    """Whether the run is caught without the noise families (the criterion before them), Holm
    across the remaining estimates alone: the old figure beside the new in the same run."""
    kept = {k: v for k, v in report.estimates.items() if v.method == "mean-shift"}
    return any(contradictions(kept, report.epsilon_ledger, report.config).values())


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
    alternating, caught_by, noise, noise_lows, caught_old = [], {}, [], [], 0
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
        caught_old += mean_shift_only_caught(report)
        for key, hit in report.contradicted.items():
            caught_by[key] = caught_by.get(key, 0) + int(hit)
        contrasts = [
            v.epsilon for k, v in report.estimates.items() if k.startswith("released_model/alt")
        ]
        if contrasts:  # none without alternating canaries
            alternating.append(max(contrasts))
        estimate = report.estimates["released_model/constant"]
        estimates.append(estimate.epsilon)
        lows.append(estimate.epsilon_low)
        if "released_model/noise" in report.estimates:
            noise.append(report.estimates["released_model/noise"].epsilon)
            noise_lows.append(report.estimates["released_model/noise"].epsilon_low)
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
        "alternating_estimate_median": float(np.median(alternating)) if alternating else None,
        "noise_estimate_median": float(np.median(noise)) if noise else None,
        "noise_estimate_low_median": float(np.median(noise_lows)) if noise else None,
        "caught_mean_shift_only": None if refused else caught_old,
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
        "caught_mean_shift_only",
        "epsilon_ledger",
        "noise_estimate_median",
        "noise_estimate_low_median",
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The bench's options (``securefed bench privacy-audit-whitebox`` and ``python -m``)."""
    parser.add_argument(
        "--transports",
        default="dp",
        help="transport specs separated by ';' "
        "(e.g. 'dp;secagg+dp;secagg+dp:mechanism=skellam;ckks+dp:mechanism=gaussian')",
    )
    parser.add_argument("--epsilons", default="1,4,8", help="comma-separated ledger epsilons")
    parser.add_argument(
        "--faults",
        default="none,noise/1.5,noise-reused,clip-off",
        help="comma-separated faults of securefed.audit.faults ('none': correct DP)",
    )
    parser.add_argument("--seeds-correct", type=int, default=20, help="seeds of correct runs")
    parser.add_argument("--seeds-fault", type=int, default=10, help="seeds of each fault")
    parser.add_argument("--constant", type=int, default=980, help="constant canary clients")
    parser.add_argument("--alternating", type=int, default=20, help="alternating canaries")
    parser.add_argument("--held-out", type=int, default=1000, help="held-out directions")
    parser.add_argument("--rounds", type=int, default=4, help="aggregation rounds (even)")
    parser.add_argument("--clip", type=float, default=1.0, help="DP per-client L2 clip")
    parser.add_argument("--delta", type=float, default=1e-5, help="DP delta (the ledger's)")
    parser.add_argument("--out", default="results/privacy_audit_whitebox", help="record folder")


def register(benches) -> None:
    """Add ``privacy-audit-whitebox`` to ``securefed bench``."""
    parser = BENCHES["privacy-audit-whitebox"].add_to(benches)
    add_arguments(parser)
    parser.set_defaults(func=lambda args: run(args, "securefed bench privacy-audit-whitebox"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m securefed.bench.bench_privacy_audit_whitebox")
    add_arguments(parser)
    return run(parser.parse_args(argv), "python -m securefed.bench.bench_privacy_audit_whitebox")


def largest_contradicted(rows: list[dict], fault: str = "noise/1.5") -> float | None:
    """The largest ledger epsilon at which ``fault`` was caught in at least 9 of 10 seeds and
    the correct runs raised no alarm (``None``: none was)."""
    clean = {
        (r["transport"], r["epsilon_target"])
        for r in rows
        if r["fault"] == "none" and r["caught"] == 0
    }
    caught = [
        r["epsilon_ledger"]
        for r in rows
        if r["fault"] == fault
        and r["caught"] is not None
        and r["caught"] >= math.ceil(0.9 * r["seeds"])
        and (r["transport"], r["epsilon_target"]) in clean
    ]
    return max(caught) if caught else None


def run(args: argparse.Namespace, command: str) -> int:
    """Every (transport, epsilon, fault) cell; the record; exit status 1 on a bad cell."""
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
        "command": command,
        "arguments": {k: v for k, v in vars(args).items() if k != "func"},
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
        f"rigorous. caught_mean_shift_only: the same runs judged without the noise family "
        f"(the criterion before it). Command: `{command}` with {record['arguments']}. "
        f"Load average before/after: {load_before[0]:.1f}/{os.getloadavg()[0]:.1f}."
    )
    largest = largest_contradicted(rows)
    footer = (
        "\nLargest ledger epsilon at which noise/1.5 was caught in >= 90% of its seeds with no "
        "false alarm in the same cell's correct runs (of the epsilons run): "
        + ("none" if largest is None else f"{largest:.4g}")
        + "\n"
    )
    (out / f"{stem}.md").write_text(_markdown(rows, header) + footer)
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
