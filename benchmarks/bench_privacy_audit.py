"""``securefed bench privacy-audit``: the ledger's epsilon beside measured figures.

Two modes. ``--mode matrix`` (the default; :mod:`securefed.bench.privacy_audit_matrix`): every
recommender (FedMF, FedHPD, FedSlate, a ``securefed.torch`` model) behind every DP transport,
white-box canaries through each one's hook, the Gaussian-DP estimates beside the rigorous
one-run bound. ``--mode fedmf-one-run`` (what this bench was before; the options below):

For each transport (``plaintext``; ``dp``, central DP; ``secagg+dp``, distributed DP under
secure aggregation) and each target epsilon, one FedMF run
(:func:`securefed.recsys.fedmf.user_level_dp_config`, every user every round) with canaries
(:mod:`securefed.attacks.canaries`): rating canaries (extra users with a distinctive set of
ratings) and direction canaries (extra clients whose update is one crafted direction), each
included with probability 1/2. Each canary is scored by each observer, and the one-run theorem
of Steinke, Nasr and Jagielski 2023 turns the guesses into an epsilon lower bound at
``--confidence`` (:mod:`securefed.audit.empirical`). Rows: transport, target, scorer, observer,
the ledger's epsilon for that observer, the lower bound, the guesses. A row whose bound exceeds
its ledger figure (Holm-corrected across the scorers of its run: ``contradicts_ledger``), or
whose audit ran at a delta below the ledger's, is a broken claim: the bench then exits with
status 1 and names each such row on stderr.

Also recorded: how the bound tightens with the number of canaries (the first ``m`` canaries of
each run's scores, for several ``m``: each subset is an audit of its own) and the cost of an
audit run against the same run without canaries.

Output under ``--out`` (default ``results/privacy_audit``): ``privacy_audit.json``,
``privacy_audit.md``, ``privacy_audit.png`` (ledger vs bound) and ``privacy_audit_canaries.png``
(bound vs number of canaries).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

from securefed import RoundSelection, RunOptions, SeedTree, run_rounds
from securefed.attacks.canaries import CanaryPlan, FedMFCanaryJob, ledger_delta, ledger_epsilon
from securefed.audit.empirical import (
    EmpiricalAuditConfig,
    audit_scores,
    delta_finding,
    ledger_contradictions,
    run_empirical_audit,
)
from securefed.audit.faults import FAULTS
from securefed.bench import datasets
from securefed.bench.bench_args import add_data_argument, add_seed_argument, add_split_argument
from securefed.bench.bench_fedmf import markdown_table, write_outputs
from securefed.bench.privacy_audit_matrix import MODEL_TRANSPORTS, RECOMMENDERS, matrix
from securefed.bench.registry import BENCHES
from securefed.privacy.calibration import epsilon_for_schedule
from securefed.recsys.fedmf import FedMF, user_level_dp_config
from securefed.transport import build_transport

TRANSPORTS = ("plaintext", "dp", "secagg+dp")
CLEAR = ("plaintext", "dp")  # transports whose view keeps each client's payload in the clear
PLACEMENT = {"plaintext": "none", "dp": "central", "secagg+dp": "distributed"}
COLUMNS = [
    "transport",
    "placement",
    "epsilon_target",
    "rounds",
    "scorer",
    "observer",
    "epsilon_ledger",
    "epsilon_lower",
    "confidence",
    "correct",
    "guesses",
    "n_canaries",
    "exceeds_ledger",
    "contradicts_ledger",
]


def broken_rows(rows: list[dict]) -> list[str]:
    """One line per row that contradicts its ledger (Holm across its run's scorers) or whose
    audit's delta is below the ledger's; empty when every claim stands."""
    lines = []
    for row in rows:
        causes = []
        if row.get("contradicts_ledger"):
            causes.append(
                f"epsilon lower bound {row['epsilon_lower']:.3g} > ledger "
                f"{row['epsilon_ledger']:.3g}"
            )
        if row.get("delta_error"):
            causes.append(row["delta_error"])
        if causes:
            lines.append(
                f"{row['transport']} epsilon {row['epsilon_target']:g} {row['scorer']} "
                f"({row['observer']}): " + "; ".join(causes)
            )
    return lines


def _options(transport: str, epsilon: float, clip: float, delta: float) -> dict[str, object]:
    if transport == "plaintext":
        return {}
    clip_key = "dp.clip" if transport == "secagg+dp" else "clip"
    return {"epsilon": epsilon, "delta": delta, clip_key: clip}


def _plain_seconds(split, config, transport: str, options: dict, seed: int) -> float:
    """Seconds of the same run without canaries (the audit's cost is the difference)."""
    seeds = SeedTree(seed)
    model = FedMF(split.train, config, seeds)
    built = build_transport(
        transport,
        options,
        total_rounds=config.rounds,
        n_clients=model.n_clients,
        sample_rate=1.0,
    )
    started = time.perf_counter()
    run_rounds(model, built, seeds, RunOptions(rounds=config.rounds, progress=False))
    return time.perf_counter() - started


def canary_curve(result, counts: list[int], config: EmpiricalAuditConfig) -> list[dict]:
    """The bound from the first ``m`` canaries' scores, for each ``m`` of ``counts``."""
    points = []
    for m in counts:
        if m > result.n_canaries:
            continue
        sub = audit_scores(result.scores[:m], result.included[:m], replace(config, n_canaries=m))
        points.append({"n_canaries": m, "epsilon_lower": sub.epsilon_lower})
    return points


def privacy_audit(args: argparse.Namespace) -> int:
    """Run every (transport, epsilon) cell; write the table, the record and the plots."""
    split = datasets.load(args.data, args.split)
    # Opacus's accountant is imported on first use (seconds): before any run is timed.
    epsilon_for_schedule(1.0, 1.0, 1, args.delta)
    config = user_level_dp_config(rounds=args.rounds)
    config = replace(config, expected_clients=float(split.train.n_users + args.rating_canaries))
    plan = CanaryPlan(
        n_rating=args.rating_canaries,
        n_direction=args.direction_canaries,
        items_per_canary=args.items_per_canary,
        direction_norm=args.direction_norm,
    )
    audit_config = EmpiricalAuditConfig(
        n_canaries=plan.n_canaries, confidence=args.confidence, delta=args.delta
    )
    counts = [int(c) for c in args.curve.split(",")]
    rows, curves, costs = [], [], []
    cells = [
        (t, e)
        for t in args.transports.split(",")
        for e in ([math.inf] if t == "plaintext" else [float(x) for x in args.epsilons.split(",")])
    ]
    for transport, epsilon in cells:
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}, got {transport!r}")
        options = _options(transport, epsilon, args.clip, args.delta)
        rounds = args.secagg_rounds if transport == "secagg+dp" and args.secagg_rounds else None
        job = FedMFCanaryJob(
            split.train,
            replace(
                config,
                upload="part" if transport in CLEAR else "full",
                rounds=rounds or config.rounds,
            ),
            transport,
            plan,
            options,
            seed=args.seed,
            keep_payloads=RoundSelection(last=1) if transport in CLEAR else RoundSelection(),
        )
        rng = SeedTree(args.seed).generator("audit", transport, str(epsilon))
        observations = []

        def run_job(included, job=job, observations=observations):
            observations.append(job(included))
            return observations[-1]

        started = time.perf_counter()
        results = run_empirical_audit(
            replace(audit_config),
            run_job,
            job.scorers(white_box_payloads=transport in CLEAR),
            rng=rng,
            epsilon_of=ledger_epsilon,
            delta_of=ledger_delta,
        )
        seconds_audit = time.perf_counter() - started
        first = next(iter(results.values()))
        contradicted = ledger_contradictions(results)
        for name, result in results.items():
            delta_issue = delta_finding(result)
            row = {
                "transport": transport,
                "placement": PLACEMENT[transport],
                "epsilon_target": epsilon,
                "rounds": job.config.rounds,
                "scorer": name,
                **result.to_dict(),
                "contradicts_ledger": contradicted[name],
                "delta_error": None
                if delta_issue is None or delta_issue.severity != "error"
                else delta_issue.cause,
            }
            row["guesses"], row["correct"] = result.best.n_guesses, result.best.n_correct
            rows.append(row)
            curves.append(
                {
                    "transport": transport,
                    "epsilon_target": epsilon,
                    "scorer": name,
                    "observer": result.observer,
                    "epsilon_ledger": result.epsilon_ledger,
                    "points": canary_curve(result, counts, audit_config),
                }
            )
        cost = {
            "transport": transport,
            "epsilon_target": epsilon,
            "rounds": job.config.rounds,
            "seconds_audit_run": first.seconds_run,
            "seconds_audit_total": seconds_audit,
            "seconds_scoring": sum(r.seconds_score for r in results.values()),
        }
        if args.measure_cost:
            cost["seconds_without_canaries"] = _plain_seconds(
                split, replace(job.config), transport, options, args.seed
            )
        costs.append(cost)
        print(
            {k: rows[-1][k] for k in ("transport", "epsilon_target")},
            {n: round(r.epsilon_lower, 3) for n, r in results.items()},
            cost,
            flush=True,
        )
    out = Path(args.out)
    table = (
        f"FedMF (user-level DP settings, every user every round; rounds per row) on "
        f"{split.name}: {plan.n_rating} rating canaries ({plan.items_per_canary} ratings each) "
        f"and {plan.n_direction} direction canaries (norm {plan.direction_norm:g}, clip "
        f"{args.clip:g}), each included with probability 1/2; bounds at "
        f"{args.confidence:.0%} confidence, delta {args.delta:g}.\n\n"
        + markdown_table(rows, COLUMNS)
        + "\n\nCost of an audit run:\n\n"
        + markdown_table(costs, list(costs[0].keys()) if costs else [])
    )
    _plot_bounds(rows, out / "privacy_audit.png")
    _plot_curves(curves, out / "privacy_audit_canaries.png")
    write_outputs(
        "privacy_audit",
        {
            "rows": rows,
            "curves": curves,
            "costs": costs,
            "data": split.name,
            "config": asdict(config),
            "plan": asdict(plan),
            "audit": asdict(audit_config),
            "clip": args.clip,
            "delta": args.delta,
            "seed": args.seed,
        },
        table,
        out,
    )
    broken = broken_rows(rows)
    for line in broken:
        print(f"privacy-audit: a row contradicts its ledger: {line}", file=sys.stderr)
    return 1 if broken else 0


def _plot_bounds(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    figure, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    finite = [r["epsilon_target"] for r in rows if math.isfinite(r["epsilon_target"])]
    right = 2 * max(finite) if finite else 32.0
    for axis, observer in zip(axes, ("released_model", "server"), strict=True):
        mine = [r for r in rows if r["observer"] == observer]
        for key in sorted({(r["transport"], r["scorer"]) for r in mine}):
            points = [r for r in mine if (r["transport"], r["scorer"]) == key]
            x = [
                r["epsilon_ledger"] if math.isfinite(r["epsilon_ledger"]) else right for r in points
            ]
            axis.plot(x, [r["epsilon_lower"] for r in points], "o-", label=f"{key[0]}: {key[1]}")
        top = max([r["epsilon_lower"] for r in rows] + [right])
        axis.plot([0.5, right], [0.5, right], color="grey", ls="--", lw=1, label="bound = ledger")
        axis.axvline(right, color="grey", ls=":", lw=1)
        axis.text(right, 0.05, " ledger: infinite", rotation=90, va="bottom", fontsize=8)
        axis.set_xscale("log", base=2)
        axis.set_xlabel("ledger's epsilon against this observer")
        axis.set_title(f"observer: {observer}")
        axis.set_ylim(0, min(top, right) * 1.05)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    axes[0].set_ylabel("measured epsilon lower bound (95%)")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def _plot_curves(curves: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    figure, axis = plt.subplots(figsize=(6.5, 4.5))
    for curve in curves:
        if curve["scorer"] not in ("direction/released", "ratings/white-box"):
            continue
        points = curve["points"]
        label = f"{curve['transport']} eps {curve['epsilon_target']:g}: {curve['scorer']}"
        axis.plot(
            [p["n_canaries"] for p in points],
            [p["epsilon_lower"] for p in points],
            "o-",
            label=label,
        )
    axis.set_xscale("log")
    axis.set_xlabel("canaries audited")
    axis.set_ylabel("epsilon lower bound (95%)")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def register(benches) -> None:
    parser = BENCHES["privacy-audit"].add_to(benches)
    parser.add_argument(
        "--mode",
        choices=("matrix", "fedmf-one-run"),
        default="matrix",
        help="matrix (default): white-box canaries in every recommender behind every DP "
        "transport (securefed.bench.privacy_audit_matrix); fedmf-one-run: FedMF on a data set "
        "with rating and direction canaries, the one-run bound only (the options below)",
    )
    parser.add_argument(
        "--recommenders",
        default=",".join(RECOMMENDERS),
        help=f"matrix: comma-separated recommenders ({', '.join(RECOMMENDERS)})",
    )
    parser.add_argument(
        "--matrix-transports",
        default="all",
        help="matrix: ';'-separated transport specs (all: "
        + "; ".join(MODEL_TRANSPORTS)
        + "; FedSlate's are its fusion channels dp and ckks+dp)",
    )
    parser.add_argument("--epsilon", type=float, default=4.0, help="matrix: target epsilon")
    parser.add_argument(
        "--fault",
        choices=("none", *FAULTS),
        default="none",
        help="matrix: break every DP path this way (securefed.audit.faults; tests of the audit)",
    )
    parser.add_argument(
        "--canaries", type=int, default=1000, help="matrix: at most this many canary clients"
    )
    add_data_argument(parser)
    add_split_argument(parser)
    parser.add_argument(
        "--transports", default=",".join(TRANSPORTS), help="comma-separated DP transports to audit"
    )
    parser.add_argument("--epsilons", default="1,4,16", help="comma-separated target epsilons")
    parser.add_argument("--rounds", type=int, default=100, help="rounds per run (100)")
    parser.add_argument(
        "--secagg-rounds",
        type=int,
        default=0,
        help="rounds of the secagg+dp cells (0: --rounds); secure aggregation of thousands of "
        "dense blocks costs about a minute per round on 2 cores",
    )
    parser.add_argument(
        "--rating-canaries", type=int, default=500, help="canary users planted with ratings"
    )
    parser.add_argument(
        "--direction-canaries",
        type=int,
        default=1000,
        help="canary gradients planted along fixed directions",
    )
    parser.add_argument(
        "--items-per-canary", type=int, default=30, help="items each rating canary rates"
    )
    parser.add_argument(
        "--direction-norm",
        type=float,
        default=10.0,
        help="L2 norm of a direction canary's planted gradient",
    )
    parser.add_argument("--clip", type=float, default=1.0, help="DP per-client L2 clip norm")
    parser.add_argument("--delta", type=float, default=1e-5, help="DP delta")
    parser.add_argument(
        "--confidence",
        type=float,
        default=0.95,
        help="confidence of the empirical lower bound on epsilon",
    )
    parser.add_argument(
        "--curve",
        default="50,100,200,500,1000",
        help="comma-separated canary counts of the bound-versus-canaries curve",
    )
    parser.add_argument(
        "--measure-cost", action="store_true", help="also time each run without canaries"
    )
    add_seed_argument(parser)
    parser.add_argument(
        "--out",
        default="results/privacy_audit",
        help="folder of the records (JSON and markdown; the matrix writes privacy_audit_matrix.*)",
    )
    parser.set_defaults(
        func=lambda args: matrix(args) if args.mode == "matrix" else privacy_audit(args)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m securefed.bench.bench_privacy_audit")
    register(parser.add_subparsers(dest="bench", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
