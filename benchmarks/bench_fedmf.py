"""FedMF benchmarks: the ML-100K splits table, transports against plaintext, weights, speed, scale.

Run through the CLI (``securefed bench fedmf-splits`` and friends) or ``python -m
securefed.bench.bench_fedmf <name>``. Each writes a JSON record and a markdown table under
``results/`` and prints the table. Ratios are always measured in the same process and run.
"""

from __future__ import annotations

import argparse
import time
import tracemalloc
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
from scipy import sparse

from securefed import PlaintextTransport, RoundSelection, SeedTree
from securefed.bench import datasets, tables
from securefed.bench.bench_args import (
    add_data_argument,
    add_out_argument,
    add_seed_argument,
    add_split_argument,
)
from securefed.bench.experiment import FedMFRun, run_fedmf, save_json
from securefed.bench.registry import BENCHES
from securefed.recsys.data import synthetic_ratings
from securefed.recsys.fedmf import FedMF, FedMFConfig, user_level_dp_config
from securefed.recsys.filling import user_mean_ratings
from securefed.recsys.metrics import rmse
from securefed.recsys.sparse_rows import rated_dot

RESULTS = Path("results")


def markdown_table(rows: list[dict], columns: list[str]) -> str:
    """A GitHub markdown table of ``rows`` restricted to ``columns`` (floats to 4 digits)."""

    def cell(value) -> str:
        if isinstance(value, float):
            if value != 0 and (abs(value) < 1e-2 or abs(value) >= 1e5):
                return f"{value:.2e}"
            return f"{value:.4f}"
        return str(value)

    return tables.markdown_table(columns, ([cell(row.get(c, "")) for c in columns] for row in rows))


def write_outputs(name: str, payload: dict, table: str, out: Path) -> None:
    """Write ``name.json`` and ``name.md`` into ``out`` and print the table."""
    out.mkdir(parents=True, exist_ok=True)
    save_json(payload, out / f"{name}.json")
    (out / f"{name}.md").write_text(table + "\n")
    print(table)
    print(f"\nwritten: {out / name}.json, {out / name}.md")


# ---------------------------------------------------------------------- the splits table
def splits(args: argparse.Namespace) -> int:
    """Vanilla FedMF, FedRec (rho=1) and FedRec+ on every requested split, plaintext."""
    rows = []
    for split_name in args.splits.split(","):
        split = datasets.load(args.data, split_name)
        for variant in args.variants.split(","):
            config = FedMFConfig(variant=variant, rounds=args.rounds)
            record, _, _ = run_fedmf(split, FedMFRun(config=config, seed=args.seed, progress=False))
            record["split"] = split_name
            rows.append(record)
            print(
                f"{split_name} {variant}: rmse {record['rmse']:.4f} mae {record['mae']:.4f} "
                f"({record['seconds']:.1f} s)",
                flush=True,
            )
    summary = []
    for variant in args.variants.split(","):
        mine = [r for r in rows if r["variant"] == variant]
        summary.append(
            {
                "variant": variant,
                "splits": len(mine),
                "rmse_mean": float(np.mean([r["rmse"] for r in mine])),
                "rmse_std": float(np.std([r["rmse"] for r in mine])),
                "mae_mean": float(np.mean([r["mae"] for r in mine])),
                "seconds_mean": float(np.mean([r["seconds"] for r in mine])),
            }
        )
    table = markdown_table(
        summary, ["variant", "splits", "rmse_mean", "rmse_std", "mae_mean", "seconds_mean"]
    )
    write_outputs("fedmf_splits", {"runs": rows, "summary": summary}, table, Path(args.out))
    return 0


# ---------------------------------------------------------------------- transports vs plaintext
def transports(args: argparse.Namespace) -> int:
    """The same runs in plaintext and through ``--transport``: test RMSE difference and cost."""
    split = datasets.load(args.data, args.split)
    rows = []
    for variant in args.variants.split(","):
        for dropout in [float(x) for x in args.dropout.split(",")]:
            config = FedMFConfig(
                variant=variant, rounds=args.rounds, upload="full", dropout=dropout
            )
            records = {}
            for transport in ("plaintext", args.transport):
                run = FedMFRun(config=config, transport=transport, seed=args.seed, progress=False)
                records[transport], _, _ = run_fedmf(split, run)
            private, plain = records[args.transport], records["plaintext"]
            rows.append(
                {
                    "variant": variant,
                    "dropout": dropout,
                    "rounds": args.rounds,
                    "rmse_plaintext": plain["rmse"],
                    f"rmse_{args.transport}": private["rmse"],
                    "rmse_difference": private["rmse"] - plain["rmse"],
                    "seconds_plaintext": plain["seconds"],
                    f"seconds_{args.transport}": private["seconds"],
                    "time_ratio": private["seconds"] / plain["seconds"],
                    "kib_up_per_client_round": private["bytes_up_per_client"] / 1024,
                }
            )
            print(rows[-1], flush=True)
    columns = list(rows[0])
    write_outputs(
        f"fedmf_{args.transport.replace('+', '_')}_vs_plaintext",
        {"rows": rows},
        markdown_table(rows, columns),
        Path(args.out),
    )
    return 0


# ---------------------------------------------------------------------- FedRec+ weights
def weights(args: argparse.Namespace) -> int:
    """FedRec+ with uniform, sample-count and Wasserstein client weights."""
    split = datasets.load(args.data, args.split)
    rows = []
    for weighting in ("uniform", "count", "wasserstein"):
        config = FedMFConfig(variant="fedrec+", rounds=args.rounds, weighting=weighting)
        record, _, _ = run_fedmf(split, FedMFRun(config=config, seed=args.seed, progress=False))
        rows.append(
            {
                "weighting": weighting,
                "rmse": record["rmse"],
                "mae": record["mae"],
                "seconds": record["seconds"],
            }
        )
        print(rows[-1], flush=True)
    write_outputs(
        "fedrec_plus_weights",
        {"rows": rows, "data": split.name},
        markdown_table(rows, ["weighting", "rmse", "mae", "seconds"]),
        Path(args.out),
    )
    return 0


# ---------------------------------------------------------------------- speed and scale
def centralised_step(csr: sparse.csr_matrix, U: np.ndarray, V: np.ndarray, config: FedMFConfig):
    """One full-batch gradient step of the same objective, computed centrally (the reference).

    ``U`` steps with the per-user mean of its residuals, ``V`` with the per-item mean, exactly
    the update a FedMF round computes, but without building any client's upload. ``csr`` is the
    training matrix (users x items), built once as the federated model also does.
    """
    users = np.repeat(np.arange(csr.shape[0]), np.diff(csr.indptr))
    errors = csr.data - rated_dot(U, V, users, csr.indices)
    residuals = sparse.csr_matrix((errors, csr.indices, csr.indptr), shape=csr.shape)
    user_counts = np.maximum(np.diff(csr.indptr), 1)[:, None]
    item_counts = np.bincount(csr.indices, minlength=csr.shape[1])[:, None]
    new_u = U - config.lr * (-2 * (residuals @ V) / user_counts + 2 * config.reg_user * U)
    item_grad = -2 * (residuals.T @ U) + 2 * config.reg_item * item_counts * V
    new_v = V - config.server_lr * item_grad / np.maximum(item_counts, 1)
    return new_u, new_v


def _median_seconds(function, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return float(np.median(times))


def perf(args: argparse.Namespace) -> int:
    """A FedMF round against a centralised full-batch step, and a round at scale."""
    split = datasets.load(args.data, args.split)
    train, config, seeds = split.train, FedMFConfig(), SeedTree(0)
    model = FedMF(train, config, seeds)
    clients = np.arange(train.n_users)

    def federated(keep):
        transport = PlaintextTransport(keep_payloads=RoundSelection(every=keep))
        model.run_round(0, clients, transport, seeds)

    state = model.state_dict()

    def reset():
        model.load_state_dict(state)

    csr = train.to_csr()
    centralised = _median_seconds(
        lambda: centralised_step(csr, model.U, model.V, config), args.repeats
    )
    plain = _median_seconds(lambda: (reset(), federated(False)), args.repeats)
    recorded = _median_seconds(lambda: (reset(), federated(True)), args.repeats)
    rows = [
        {
            "data": split.name,
            "users": train.n_users,
            "items": train.n_items,
            "ratings": len(train),
            "centralised_step_ms": centralised * 1e3,
            "fedmf_round_ms": plain * 1e3,
            "round_over_centralised": plain / centralised,
            "round_with_recording_ms": recorded * 1e3,
            "recording_over_plain": recorded / plain,
        }
    ]
    print(markdown_table(rows, list(rows[0])), flush=True)
    scale_rows = []
    if args.scale_users:
        scale_rows.append(_scale(args))
        print(markdown_table(scale_rows, list(scale_rows[0])), flush=True)
    table = markdown_table(rows, list(rows[0]))
    if scale_rows:
        table += "\n\n" + markdown_table(scale_rows, list(scale_rows[0]))
    write_outputs("fedmf_perf", {"round": rows, "scale": scale_rows}, table, Path(args.out))
    return 0


def _scale(args: argparse.Namespace) -> dict:
    """One round on a synthetic set: time and the round's peak memory against the ratings' size."""
    started = time.perf_counter()
    ratings = synthetic_ratings(args.scale_users, args.scale_items, args.scale_ratings, seed=0)
    generated = time.perf_counter() - started
    config = FedMFConfig(dim=args.scale_dim)
    seeds = SeedTree(0)
    model = FedMF(ratings, config, seeds)
    transport = PlaintextTransport()
    tracemalloc.start()
    tracemalloc.reset_peak()
    baseline, _ = tracemalloc.get_traced_memory()
    started = time.perf_counter()
    model.run_round(0, np.arange(ratings.n_users), transport, seeds)
    seconds = time.perf_counter() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    model_state = (
        model.U.nbytes
        + model.V.nbytes
        + model.indptr.nbytes
        + model.items.nbytes
        + model.ratings.nbytes
    )
    return {
        "users": ratings.n_users,
        "items": ratings.n_items,
        "ratings": len(ratings),
        "dim": config.dim,
        "generate_s": generated,
        "round_s": seconds,
        "ratings_mb": ratings.nbytes / 2**20,
        "round_peak_extra_mb": (peak - baseline) / 2**20,
        "round_peak_over_ratings": (peak - baseline) / ratings.nbytes,
        "model_state_mb": model_state / 2**20,
    }


# ---------------------------------------------------------------------- DP utility
def dp_utility(args: argparse.Namespace) -> int:
    """FedMF under user-level DP: test RMSE per epsilon for each noise placement.

    The model is :func:`securefed.recsys.fedmf.user_level_dp_config` (fixed-denominator
    aggregation, the
    users' own mean as offset, server-side item decay): the classic per-item mean of FedMF
    divides by noisy counts and diverges under DP. Every user takes part in every round
    (``sampling="all"``, sample rate 1), the noise is calibrated to each epsilon over the run's
    rounds with Opacus's RDP accountant, and the ledger refuses any round past the budget.
    Central adds the noise at the server; local has each client add all of it to its dense
    block; distributed has each client add ``sigma * C / sqrt(n)`` (run over the plaintext inner
    transport here: secure aggregation recovers the same sum, see ``fedmf-transport``, so the
    utility is the same and the run is hundreds of times faster). References in the table: the
    same model without noise, and the users' mean rating alone (what the model falls back to).

    Local placement puts ``sqrt(n)`` times more noise into the sum than the others; its server
    step is divided by ``sqrt(n)`` (``--local-server-lr`` overrides), which keeps the noise that
    reaches ``V`` per round at the other placements' level (with the central step, local noise
    drove ``V`` to overflow at epsilon 1 and 2 and to RMSE 2.4 at epsilon 4 and 8).
    """
    split = datasets.load(args.data, args.split)
    config = user_level_dp_config(rounds=args.rounds, server_lr=args.server_lr, dim=args.dim)
    local_lr = args.local_server_lr or args.server_lr / np.sqrt(split.train.n_users)
    rows = []
    for placement in args.placements.split(","):
        server_lr = local_lr if placement == "local" else args.server_lr
        for epsilon in [float(e) for e in args.epsilons.split(",")]:
            run = FedMFRun(
                config=replace(
                    config,
                    upload="part" if placement == "central" else "full",
                    server_lr=server_lr,
                ),
                transport="dp",
                seed=args.seed,
                progress=False,
                transport_options={
                    "epsilon": epsilon,
                    "delta": args.delta,
                    "clip": args.clip,
                    "placement": placement,
                },
            )
            try:
                record, _, _ = run_fedmf(split, run)
            except (ValueError, FloatingPointError) as error:
                rows.append(
                    {
                        "placement": placement,
                        "epsilon_target": epsilon,
                        "server_lr": server_lr,
                        "status": f"{error}",
                    }
                )
                continue
            rows.append(
                {
                    "placement": placement,
                    "epsilon_target": epsilon,
                    "epsilon_spent": record["epsilon"],
                    "epsilon_server": record["epsilon_server"],
                    "noise_multiplier": record["noise_multiplier"],
                    "server_lr": server_lr,
                    "rmse": record["rmse"],
                    "mae": record["mae"],
                    "seconds": record["seconds"],
                    "status": "ok",
                }
            )
            print(rows[-1], flush=True)
    plain, _, _ = run_fedmf(split, FedMFRun(config=config, seed=args.seed, progress=False))
    baseline = user_mean_rmse(split)
    table = (
        f"Same model without noise: RMSE {plain['rmse']:.4f}. The users' own mean rating alone: "
        f"RMSE {baseline:.4f}.\n\n"
        + markdown_table(
            rows,
            [
                "placement",
                "epsilon_target",
                "epsilon_spent",
                "epsilon_server",
                "noise_multiplier",
                "server_lr",
                "rmse",
                "mae",
                "seconds",
                "status",
            ],
        )
    )
    _plot_dp(rows, plain["rmse"], baseline, Path(args.out) / "fedmf_dp.png")
    write_outputs(
        "fedmf_dp",
        {
            "rows": rows,
            "no_dp_rmse": plain["rmse"],
            "user_mean_rmse": baseline,
            "data": split.name,
            "config": asdict(config),
            "delta": args.delta,
            "clip": args.clip,
        },
        table,
        Path(args.out),
    )
    return 0


def user_mean_rmse(split) -> float:
    """Test RMSE of predicting each user's mean training rating."""
    csr = split.train.to_csr()
    means = user_mean_ratings(csr.indptr.astype(np.int64), csr.data.astype(np.float64))
    return rmse(means[split.test.users], split.test.ratings)


# ---------------------------------------------------------------------- registration
def register(benches) -> None:
    def common(parser, data="ml-100k", split="u1"):
        add_data_argument(parser, data)
        add_split_argument(parser, split)
        add_seed_argument(parser)
        add_out_argument(parser, RESULTS)

    parser = BENCHES["fedmf-splits"].add_to(benches)
    common(parser)
    parser.add_argument(
        "--splits", default="u1,u2,u3,u4,u5", help="comma-separated ML-100K splits to run (u1..u5)"
    )
    parser.add_argument(
        "--variants",
        default="fedmf,fedrec,fedrec+",
        help="comma-separated FedMF variants (fedmf, fedrec, fedrec+)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=FedMFConfig.rounds,
        help="rounds per run (FedMFConfig's default)",
    )
    parser.set_defaults(func=splits)

    parser = BENCHES["fedmf-transport"].add_to(benches)
    common(parser)
    parser.add_argument(
        "--transport",
        default="secagg",
        help="the transport compared with plaintext (a name or spec string)",
    )
    parser.add_argument(
        "--variants",
        default="fedmf,fedrec+",
        help="comma-separated FedMF variants (fedmf, fedrec, fedrec+)",
    )
    parser.add_argument(
        "--dropout",
        default="0,0.1",
        help="comma-separated fractions of clients that drop out each round",
    )
    parser.add_argument("--rounds", type=int, default=30, help="rounds per run (30)")
    parser.set_defaults(func=transports)

    parser = BENCHES["fedrec-weights"].add_to(benches)
    common(parser)
    parser.add_argument(
        "--rounds",
        type=int,
        default=FedMFConfig.rounds,
        help="rounds per run (FedMFConfig's default)",
    )
    parser.set_defaults(func=weights)

    parser = BENCHES["fedmf-dp"].add_to(benches)
    common(parser)
    parser.add_argument(
        "--epsilons", default="1,2,4,8,16", help="comma-separated DP target epsilons"
    )
    parser.add_argument(
        "--placements",
        default="central,local,distributed",
        help="comma-separated DP placements (central, local, distributed)",
    )
    parser.add_argument("--delta", type=float, default=1e-5, help="DP delta")
    parser.add_argument("--clip", type=float, default=1.0, help="DP per-client L2 clip norm")
    parser.add_argument("--rounds", type=int, default=100, help="rounds per run (100)")
    parser.add_argument(
        "--server-lr",
        type=float,
        default=4.0,
        help="the server's step size eta (4.0: user-level DP's fixed denominator)",
    )
    parser.add_argument(
        "--local-server-lr", type=float, default=None, help="default: server-lr / sqrt(users)"
    )
    parser.add_argument("--dim", type=int, default=10, help="latent dimension (10)")
    parser.set_defaults(func=dp_utility)

    parser = BENCHES["fedmf-perf"].add_to(benches)
    common(parser)
    parser.add_argument(
        "--repeats",
        type=int,
        default=7,
        help="timed repetitions per measurement (the median is reported)",
    )
    parser.add_argument(
        "--scale-users", type=int, default=100_000, help="users of the synthetic scale test"
    )
    parser.add_argument(
        "--scale-items", type=int, default=20_000, help="items of the synthetic scale test"
    )
    parser.add_argument(
        "--scale-ratings", type=int, default=10_000_000, help="ratings of the synthetic scale test"
    )
    parser.add_argument(
        "--scale-dim", type=int, default=20, help="latent dimension of the synthetic scale test"
    )
    parser.set_defaults(func=perf)


def _plot_dp(rows: list[dict], no_dp: float, user_mean: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    figure, axis = plt.subplots(figsize=(6, 4))
    for placement in sorted({r["placement"] for r in rows}):
        done = [r for r in rows if r["placement"] == placement and r["status"] == "ok"]
        axis.plot(
            [r["epsilon_target"] for r in done], [r["rmse"] for r in done], "o-", label=placement
        )
    axis.axhline(no_dp, color="grey", ls="--", label="no DP")
    axis.axhline(user_mean, color="grey", ls=":", label="user mean alone")
    axis.set_xscale("log", base=2)
    axis.set_xlabel("epsilon (delta fixed)")
    axis.set_ylabel("test RMSE")
    axis.legend()
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m securefed.bench.bench_fedmf")
    register(parser.add_subparsers(dest="bench", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
