"""``securefed bench frontier``: test RMSE against epsilon against the server, per private model.

Private models, each under ``secagg+dp`` (the exact distributed discrete Gaussian; epsilon
against the server equals epsilon against the released model's users):

* ``dp-als``: DP-ALS (:mod:`securefed.recsys.dp_als`) with its default configuration;
* ``private-bias``: the private damped-bias model (the same bias release with the whole budget);
* ``fedmf-dp-biased``: gradient FedMF, ``dp_biased_config``, ``--fedmf-rounds`` rounds.

Central-DP points (``dp``: the server sees the clipped sums, so their epsilon holds against the
released model's users only; drawn against that epsilon, labelled "central"):

* ``fedmf-dp-central``: today's DP-FedAvg, ``dp_biased_config``, every user every round,
  ``--fedmf-rounds`` rounds;
* ``fedmf-cyclic-independent``, ``fedmf-cyclic-tree``, ``fedmf-cyclic-banded``: the same model
  on the cyclic schedule (``--groups`` groups, ``--cyclic-rounds`` rounds, server step
  ``--cyclic-lr``) with i.i.d. noise (DP-FedAvg under the schedule's accounting), DP-FTRL tree
  aggregation, or the banded matrix mechanism (:mod:`securefed.transport.correlated`).

Lines drawn beside them: the non-private damped biases (closed form), non-private DP-ALS
(plaintext, same configuration) and non-private FedMF (``biased_config``, plaintext). Written to
``benchmarks/results/frontier/NAME.{json,md,png}``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

from securefed import ClientSampling
from securefed.bench import datasets
from securefed.bench.bench_fedmf import markdown_table, write_outputs
from securefed.bench.dp_als_experiment import DPALSRun, run_dp_als
from securefed.bench.experiment import FedMFRun, run_fedmf
from securefed.bench.registry import BENCHES
from securefed.privacy.correlated import CORRELATIONS
from securefed.recsys.baselines import damped_baseline
from securefed.recsys.dp_als import DPALSConfig, private_bias_config
from securefed.recsys.fedmf import biased_config, dp_biased_config
from securefed.recsys.metrics import rmse

RESULTS = Path("benchmarks/results/frontier")
ALGORITHMS = ("dp-als", "private-bias", "fedmf-dp-biased")
CYCLIC_PREFIX = "fedmf-cyclic-"
CENTRAL = ("fedmf-dp-central", *(CYCLIC_PREFIX + c for c in CORRELATIONS))
"""Central-DP points, run only when named in ``--algorithms`` (module docstring)."""


def _central_run(algorithm: str, split, epsilon: float, seed: int, args) -> dict:
    """A central-DP FedMF point; ``epsilon_server`` is ``None`` (the server sees the sums)."""
    if algorithm == "fedmf-dp-central":
        config = dp_biased_config(rounds=args.fedmf_rounds)
        sampling, options = ClientSampling(), {"dp.epsilon": epsilon}
    else:
        config = dp_biased_config(rounds=args.cyclic_rounds, server_lr=args.cyclic_lr)
        sampling = ClientSampling("cyclic", groups=args.groups)
        options = {
            "dp.epsilon": epsilon,
            "dp.correlation": algorithm.removeprefix(CYCLIC_PREFIX),
            "dp.groups": args.groups,
        }
    run = FedMFRun(
        config=config,
        transport="dp",
        seed=seed,
        progress=False,
        sampling=sampling,
        transport_options=options,
    )
    record, _, _ = run_fedmf(split, run)
    return record | {"epsilon_server": None}


def _private_run(algorithm: str, split, epsilon: float, seed: int, args) -> dict:
    fedmf_rounds = args.fedmf_rounds
    if algorithm in CENTRAL:
        return _central_run(algorithm, split, epsilon, seed, args)
    options = {"dp.epsilon": epsilon}
    if algorithm == "fedmf-dp-biased":
        run = FedMFRun(
            config=dp_biased_config(rounds=fedmf_rounds),
            transport="secagg+dp",
            seed=seed,
            progress=False,
            transport_options=options,
        )
        record, _, _ = run_fedmf(split, run)
        return record
    config = DPALSConfig() if algorithm == "dp-als" else private_bias_config()
    run = DPALSRun(config=config, transport="secagg+dp", transport_options=options, seed=seed)
    record, _, _ = run_dp_als(split, run)
    return record


def _lines(split, seed: int, with_fedmf: bool) -> dict[str, float]:
    base = damped_baseline(split.train)
    lines = {
        "damped biases (non-private)": rmse(
            base.predict(split.test.users, split.test.items), split.test.ratings
        )
    }
    record, _, _ = run_dp_als(split, DPALSRun(config=DPALSConfig(), seed=seed))
    lines["DP-ALS plaintext (non-private)"] = record["rmse"]
    if with_fedmf:
        fedmf = FedMFRun(config=biased_config(), seed=seed, progress=False)
        lines["FedMF biased plaintext (non-private)"] = run_fedmf(split, fedmf)[0]["rmse"]
    return lines


def recorded_fedmf(path: Path) -> list[dict]:
    """FedMF ``--preset dp`` points of ``securefed bench fedmf-dp``'s record (distributed)."""
    if not path.exists():
        return []
    rows = json.loads(path.read_text())["rows"]
    return [
        {
            "algorithm": "FedMF --preset dp, secagg+dp (recorded)",
            "epsilon": r["epsilon_target"],
            "rmse": r["rmse"],
            "runs": 1,
        }
        for r in rows
        if r["placement"] == "distributed" and r["status"] == "ok"
    ]


def frontier(args: argparse.Namespace) -> int:
    """Run every (split, algorithm, epsilon, seed) point; write the record and the plot.

    With ``--from-record`` nothing runs: the plot is redrawn from a record this bench wrote.
    """
    out = Path(args.out)
    fedmf = recorded_fedmf(Path(args.fedmf_record)) if args.fedmf_record else []
    if args.from_record:
        payload = json.loads(Path(args.from_record).read_text())
        _plot(
            payload["summary"] + fedmf,
            payload["lines"],
            out / f"{args.name}.png",
            f"{payload['data']} {payload['splits']}",
        )
        return 0
    epsilons = [float(e) for e in args.epsilons.split(",")]
    algorithms = args.algorithms.split(",")
    unknown = sorted(set(algorithms) - set(ALGORITHMS) - set(CENTRAL))
    if unknown:
        raise ValueError(f"unknown algorithms {unknown}; choose from {ALGORITHMS + CENTRAL}")
    seeds = [int(s) for s in args.seeds.split(",")]
    rows, lines = [], {}
    started = time.perf_counter()
    for split_name in args.splits.split(","):
        split = datasets.load(args.data, split_name if split_name != "-" else None)
        for name, value in _lines(split, seeds[0], args.fedmf_line).items():
            lines.setdefault(name, []).append(value)
        for algorithm in algorithms:
            for epsilon in epsilons:
                for seed in seeds:
                    record = _private_run(algorithm, split, epsilon, seed, args)
                    row = {
                        "split": split_name,
                        "algorithm": algorithm,
                        "epsilon_target": epsilon,
                        "seed": seed,
                        "rmse": record["rmse"],
                        "epsilon_server": record["epsilon_server"],
                        "epsilon": record["epsilon"],
                        "seconds": record["seconds"],
                    }
                    rows.append(row)
                    server = row["epsilon_server"]
                    print(
                        f"{split_name} {algorithm} eps {epsilon:g} seed {seed}: rmse "
                        f"{row['rmse']:.4f} (eps {row['epsilon']:.3f}, eps_server "
                        f"{'none (central)' if server is None else f'{server:.3f}'}, "
                        f"{row['seconds']:.1f} s)",
                        flush=True,
                    )
    summary = []
    for algorithm in algorithms:
        for epsilon in epsilons:
            done = [
                r["rmse"]
                for r in rows
                if r["algorithm"] == algorithm and r["epsilon_target"] == epsilon
            ]
            summary.append(
                {
                    "algorithm": algorithm,
                    "epsilon": epsilon,
                    "rmse": float(np.mean(done)),
                    "runs": len(done),
                }
            )
    line_means = {name: float(np.mean(values)) for name, values in lines.items()}
    payload = {
        "command": (
            f"securefed bench frontier --data {args.data} --splits {args.splits} --epsilons "
            f"{args.epsilons} --algorithms {args.algorithms} --seeds {args.seeds} "
            f"--fedmf-rounds {args.fedmf_rounds} --{'' if args.fedmf_line else 'no-'}fedmf-line "
            f"--groups {args.groups} --cyclic-rounds {args.cyclic_rounds} --cyclic-lr "
            f"{args.cyclic_lr} --name {args.name}"
        ),
        "data": args.data,
        "splits": args.splits,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"BLAS threads {os.environ.get('OMP_NUM_THREADS', 'default')}",
        "load_before": os.getloadavg()[0],
        "seconds": time.perf_counter() - started,
        "dp_als_config": DPALSConfig().__dict__,
        "lines": line_means,
        "summary": summary,
        "rows": rows,
    }
    table = markdown_table(summary, ["algorithm", "epsilon", "rmse", "runs"])
    table += "\n\n" + markdown_table(
        [{"line": k, "rmse": v} for k, v in line_means.items()], ["line", "rmse"]
    )
    write_outputs(args.name, payload, table, out)
    _plot(summary + fedmf, line_means, out / f"{args.name}.png", f"{args.data} {args.splits}")
    return 0


def _plot(summary: list[dict], lines: dict[str, float], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.5))
    for algorithm in dict.fromkeys(r["algorithm"] for r in summary):
        done = [r for r in summary if r["algorithm"] == algorithm]
        central = algorithm in CENTRAL
        axis.plot(
            [r["epsilon"] for r in done],
            [r["rmse"] for r in done],
            "s--" if central else "o-",
            label=f"{algorithm} (central dp: epsilon vs released model)" if central else algorithm,
        )
    styles = iter(["--", ":", "-."])
    for name, value in lines.items():
        axis.axhline(value, color="grey", ls=next(styles, "--"), label=f"{name} {value:.4f}")
    axis.set_xscale("log", base=2)
    if any(r["algorithm"] in CENTRAL for r in summary):
        axis.set_xlabel(
            "epsilon (delta 1e-5): secagg+dp against the server, central dp against users"
        )
    else:
        axis.set_xlabel("epsilon against the server (delta 1e-5, secagg+dp)")
    axis.set_ylabel("test RMSE")
    axis.set_title(f"privacy-utility frontier, {title}")
    axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def register(benches) -> None:
    parser = BENCHES["frontier"].add_to(benches)
    parser.add_argument("--data", default="ml-100k", help="data set name or path (ml-100k)")
    parser.add_argument("--splits", default="u1", help="comma list (- : the data's own split)")
    parser.add_argument(
        "--epsilons", default="0.5,1,2,4,8,16", help="comma list of epsilons against the server"
    )
    parser.add_argument(
        "--algorithms",
        default=",".join(ALGORITHMS),
        help=f"comma list of the private algorithms drawn (of {', '.join(ALGORITHMS)})",
    )
    parser.add_argument("--seeds", default="0", help="comma list of seeds, one run each")
    parser.add_argument(
        "--fedmf-rounds", type=int, default=100, help="rounds of the non-private FedMF line"
    )
    parser.add_argument(
        "--fedmf-line",
        default=True,
        action=argparse.BooleanOptionalAction,
        help="draw non-private FedMF (biased preset, plaintext) as a line",
    )
    parser.add_argument(
        "--fedmf-record",
        default="benchmarks/results/fedmf_dp.json",
        help="draw the distributed-DP FedMF points of this bench fedmf-dp record ('' : none)",
    )
    parser.add_argument(
        "--groups", type=int, default=2, help="groups of the cyclic schedule (fedmf-cyclic-*)"
    )
    parser.add_argument(
        "--cyclic-rounds", type=int, default=40, help="rounds of the fedmf-cyclic-* points"
    )
    parser.add_argument(
        "--cyclic-lr", type=float, default=2.0, help="server step of the fedmf-cyclic-* points"
    )
    parser.add_argument("--from-record", default=None, help="redraw the plot of this record")
    parser.add_argument(
        "--name", default="frontier_ml100k_u1", help="stem of the record's json/md/png files"
    )
    parser.add_argument("--out", default=str(RESULTS), help="folder of the record")
    parser.set_defaults(func=frontier)
