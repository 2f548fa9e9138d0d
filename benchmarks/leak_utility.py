"""Leak versus utility: train each FedMF variant over each transport, attack every view.

For every (variant, transport) cell: train on the training split, measure test RMSE/MAE, then hand
the ServerView of the last two rounds to :func:`securefed.attacks.verify` and score what it recovers
against the true training ratings (share of ratings recovered exactly, rating-recovery RMSE,
rated-item precision/recall/F1) beside a chance baseline. A transport that cannot run here
appears as a row that says why. Output: ``leak_utility.json``, ``leak_utility.md`` and
``leak_utility.png`` in ``--out``.

Transport specs: ``plaintext``, ``secagg``, ``ckks``, ``dp:EPS`` (central DP at epsilon EPS),
``secagg+dp:EPS`` (distributed DP under secure aggregation).

Cost. Secure aggregation and CKKS compute the same sums as plaintext at a far higher cost (CKKS:
tens of seconds per ML-100K round), and the attacks read only the last two rounds. So by default
(``transport_rounds=2``) a hiding transport's cell runs its first ``rounds - 2`` rounds over the
clear counterpart (plaintext; for ``secagg+dp`` the same distributed noise, charged to the same
ledger) and its last two rounds through the transport itself: the attacked view is exactly what
that transport shows, and the model equals the all-rounds one up to the transport's numerical
error (``securefed bench fedmf-transport`` measures it: RMSE differences below 1e-4).
``transport_rounds=0`` runs every round through the transport.

DP cells train :func:`securefed.recsys.fedmf.user_level_dp_config` (fixed-denominator aggregation,
user-mean
offset): the per-item mean of the other cells diverges under DP noise. FedRec+ there uses uniform
client weights (its Wasserstein weights need statistics rows that this aggregation does not send).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from securefed import RoundSelection, SecurefedError, TransportUnavailable
from securefed.attacks import verify
from securefed.bench import datasets
from securefed.bench.bench_fedmf import markdown_table
from securefed.bench.experiment import WARM_START_TRANSPORT, FedMFRun, run_fedmf, save_json
from securefed.bench.processes import map_in_processes
from securefed.bench.registry import BENCHES
from securefed.recsys.data import Split, densest_split
from securefed.recsys.fedmf import FedMFConfig, user_level_dp_config
from securefed.transport import option_groups

DEFAULT_TRANSPORTS = "plaintext,secagg,ckks,dp:1,dp:4,dp:16,secagg+dp:4"
LEAK_COLUMNS = ("exact_share", "rmse", "precision", "recall", "f1")


@dataclass(frozen=True)
class LeakUtilityConfig:
    """What the benchmark runs.

    Attributes:
        data: data set (``ml-latest-small`` embedded, ``ml-100k``, or a path).
        split: split name (``u1`` for ML-100K; random otherwise).
        rounds: training rounds of every cell.
        variants: FedMF variants.
        transports: transport specs (module docstring).
        seed: the run seed.
        max_users, max_items: keep only the most active users / most rated items (0: all), to
            make a small version (the demo).
        dp_clip: per-client L2 clip of the DP transports.
        transport_rounds: rounds at the end of a hiding transport's run that go through it (the
            others over its clear counterpart; module docstring); 0: every round.
        extra_config: FedMFConfig overrides of the non-DP cells.
        dp_config: overrides of :func:`securefed.recsys.fedmf.user_level_dp_config` for the DP
        cells.
        workers: cells trained at once, each in its own process (one core each).
    """

    data: str = "ml-latest-small"
    split: str | None = None
    rounds: int = 200
    variants: tuple[str, ...] = ("fedmf", "fedrec", "fedrec+")
    transports: tuple[str, ...] = tuple(DEFAULT_TRANSPORTS.split(","))
    seed: int = 0
    max_users: int = 0
    max_items: int = 0
    dp_clip: float = 1.0
    transport_rounds: int = 2
    progress: bool = True
    extra_config: dict = field(default_factory=dict)
    dp_config: dict = field(default_factory=dict)
    workers: int = 2

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        if self.rounds < 2:
            raise ValueError("the attack needs two rounds: rounds must be >= 2")
        if self.transport_rounds == 1 or self.transport_rounds < 0:
            raise ValueError(
                "transport_rounds must be 0 (all) or >= 2 (the attack reads two rounds), "
                f"got {self.transport_rounds}"
            )


def parse_transport(spec: str) -> tuple[str, dict]:
    """``"dp:4"`` -> ``("dp", {"epsilon": 4.0})``; ``"secagg"`` -> ``("secagg", {})``."""
    name, _, argument = spec.partition(":")
    if not argument:
        return name, {}
    return name, {"epsilon": float(argument)}


def load_split(config: LeakUtilityConfig) -> Split:
    split = datasets.load(config.data, config.split, seed=config.seed)
    if not (config.max_users or config.max_items):
        return split
    rng = np.random.default_rng(config.seed)
    return densest_split(split, config.max_users, config.max_items, rng)


def run_cell(split: Split, variant: str, spec: str, config: LeakUtilityConfig) -> dict:
    """Train one (variant, transport) cell, attack its view, return the table row."""
    name, options = parse_transport(spec)
    upload = "part" if name in ("plaintext", "dp") else "full"
    if "dp" in option_groups(name):
        options["dp.clip"] = config.dp_clip
        weighting = {"weighting": "uniform"} if variant == "fedrec+" else {}
        model_config = user_level_dp_config(
            variant=variant, rounds=config.rounds, upload=upload, **(weighting | config.dp_config)
        )
    else:
        model_config = FedMFConfig(
            variant=variant, rounds=config.rounds, upload=upload, **config.extra_config
        )
    tail = config.transport_rounds
    run = FedMFRun(
        config=model_config,
        transport=name,
        seed=config.seed,
        keep_payloads=RoundSelection(last=2),
        progress=False,
        transport_options=options,
        warm_start_rounds=config.rounds - tail
        if tail and name in WARM_START_TRANSPORT and tail < config.rounds
        else 0,
    )
    row = {
        "variant": variant,
        "transport": spec,
        "status": "ok",
        "transport_rounds": config.rounds - run.warm_start_rounds,
    }
    started = time.perf_counter()
    try:
        record, _, transport = run_fedmf(split, run)
    except TransportUnavailable as error:
        return row | {"status": f"unavailable: {error}"}
    except (ValueError, FloatingPointError, SecurefedError) as error:  # diverged, budget spent
        return row | {"status": f"failed: {error}", "seconds": time.perf_counter() - started}
    attack_started = time.perf_counter()
    report = verify(transport.view, split.train)
    row |= {
        "rmse": record["rmse"],
        "mae": record["mae"],
        "epsilon": record.get("epsilon"),
        "epsilon_server": record.get("epsilon_server"),
        "kib_up_per_client_round": record["bytes_up_per_client"] / 1024,
        "train_seconds": record["seconds"],
        "attack_seconds": time.perf_counter() - attack_started,
        "seconds": time.perf_counter() - started,
        "attacks": ",".join(report.attacks_applied) or "none",
    }
    for key in LEAK_COLUMNS:
        row[f"leak_{key}"] = report.overall.get(key, float("nan"))
        row[f"chance_{key}"] = report.baseline.get(key, float("nan"))
    row["notes"] = " ".join(report.notes)
    return row


def run(config: LeakUtilityConfig, out: str | Path) -> list[dict]:
    """Every cell, then the JSON, markdown and PNG outputs."""
    from tqdm.auto import tqdm

    split = load_split(config)
    cells = [(v, t) for v in config.variants for t in config.transports]
    bar = tqdm(total=len(cells), desc="leak-utility", disable=not config.progress)
    if config.workers == 1:
        rows = []
        for variant, spec in cells:
            bar.set_postfix_str(f"{variant} / {spec}")
            rows.append(run_cell(split, variant, spec, config))
            bar.update(1)
    else:
        rows = _run_cells_in_processes(split, cells, config, bar)
    bar.close()
    meta = {
        "data": split.name,
        "users": split.train.n_users,
        "items": split.train.n_items,
        "train": len(split.train),
        "test": len(split.test),
        "rounds": config.rounds,
        "seed": config.seed,
    }
    write_outputs(rows, meta, config, out)
    return rows


def write_outputs(rows: list[dict], meta: dict, config: LeakUtilityConfig, out: str | Path) -> None:
    """Write the JSON, markdown and PNG outputs of the rows into ``out``; print the table."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_json({"meta": meta, "rows": rows}, out / "leak_utility.json")
    columns = [
        "variant",
        "transport",
        "status",
        "transport_rounds",
        "rmse",
        "epsilon",
        "epsilon_server",
        "leak_exact_share",
        "chance_exact_share",
        "leak_rmse",
        "chance_rmse",
        "leak_f1",
        "chance_f1",
        "kib_up_per_client_round",
        "seconds",
    ]
    header = (
        f"Data: {meta['data']} ({meta['users']} users, {meta['items']} items, "
        f"{meta['train']} train / {meta['test']} test ratings), {config.rounds} rounds, "
        f"seed {config.seed}. "
        + (
            f"secagg, ckks and secagg+dp cells: rounds 1..{config.rounds - config.transport_rounds}"
            f" over their clear counterpart, the last {config.transport_rounds} (the attacked "
            "view) through the transport (transport_rounds column). "
            if config.transport_rounds
            else "Every round of every cell went through its transport. "
        )
        + "DP cells: user_level_dp_config (fixed-denominator aggregation, user-mean offset).\n\n"
    )
    table = header + markdown_table(rows, columns)
    (out / "leak_utility.md").write_text(table + "\n")
    plot(rows, out / "leak_utility.png", meta)
    print(table)
    print(f"\nwritten: {out}/leak_utility.json, .md, .png")


# The dearest cells start first so that the workers finish together.
_COST_ORDER = ("ckks", "secagg+dp", "secagg")


def _run_cells_in_processes(split: Split, cells: list, config: LeakUtilityConfig, bar) -> list:
    """:func:`run_cell` for every cell in ``config.workers`` processes; rows in cell order."""

    def cost_rank(cell: tuple[str, str]) -> int:
        name = parse_transport(cell[1])[0]
        return _COST_ORDER.index(name) if name in _COST_ORDER else len(_COST_ORDER)

    order = sorted(range(len(cells)), key=lambda k: cost_rank(cells[k]))

    def done(position: int, row: object) -> None:
        variant, spec = cells[order[position]]
        bar.set_postfix_str(f"done {variant} / {spec}")
        bar.update(1)

    calls = [(split, *cells[k], config) for k in order]
    rows_in_order = map_in_processes(run_cell, calls, config.workers, done)
    rows: list[dict | None] = [None] * len(cells)
    for position, k in enumerate(order):
        rows[k] = rows_in_order[position]
    return rows  # type: ignore[return-value]


def plot(rows: list[dict], path: Path, meta: dict) -> None:
    """Test RMSE against the two leak measures, one point per cell."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in rows if r["status"] == "ok"]
    figure, axes = plt.subplots(1, 2, figsize=(12, 5), sharey=True)
    markers = {"fedmf": "o", "fedrec": "s", "fedrec+": "^"}
    for axis, key, label in (
        (axes[0], "leak_exact_share", "ratings recovered exactly"),
        (axes[1], "leak_f1", "rated-item F1"),
    ):
        for row in done:
            axis.scatter(row[key], row["rmse"], marker=markers.get(row["variant"], "o"), s=50)
            axis.annotate(
                f"{row['variant']}/{row['transport']}",
                (row[key], row["rmse"]),
                fontsize=7,
                xytext=(4, 2),
                textcoords="offset points",
            )
        axis.set_xlabel(f"leak: {label} (honest-but-curious server)")
        axis.grid(alpha=0.3)
    axes[0].set_ylabel("test RMSE (utility: lower is better)")
    figure.suptitle(f"Leak versus utility on {meta['data']} ({meta['rounds']} rounds)")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


DEMO_ROUNDS = 40
"""Training rounds of each ``securefed demo`` cell (its recorded figures)."""


def demo(
    data: str = "ml-latest-small", out: str = "results/demo", rounds: int = DEMO_ROUNDS
) -> int:
    """``securefed demo``: a small leak-utility table on the embedded data (a few minutes).

    ``rounds`` below :data:`DEMO_ROUNDS` makes a smoke run (CI's installed-wheel check), not the
    demo's figures.
    """
    config = LeakUtilityConfig(
        data=data,
        rounds=rounds,
        max_users=100,
        max_items=200,
        transports=("plaintext", "secagg", "dp:8"),
        transport_rounds=0,
        extra_config={"lr": 0.15, "server_lr": 0.15, "init_std": 0.6},
    )
    print(
        f"securefed demo: FedMF, FedRec and FedRec+ on {data} (100 most active users x 200 "
        "most rated items), plaintext / secure aggregation / DP; each view is attacked.\n"
    )
    run(config, out)
    return 0


def _main(args: argparse.Namespace) -> int:
    config = LeakUtilityConfig(
        data=args.data,
        split=args.split,
        rounds=args.rounds,
        variants=tuple(args.variants.split(",")),
        transports=tuple(args.transports.split(",")),
        seed=args.seed,
        max_users=args.max_users,
        max_items=args.max_items,
        dp_clip=args.dp_clip,
        transport_rounds=args.transport_rounds,
        workers=args.workers,
    )
    run(config, args.out)
    return 0


def register(benches) -> None:
    parser = BENCHES["leak-utility"].add_to(benches)
    parser.add_argument("--data", default="ml-latest-small")
    parser.add_argument("--split", default=None)
    parser.add_argument("--rounds", type=int, default=LeakUtilityConfig.rounds)
    parser.add_argument("--variants", default="fedmf,fedrec,fedrec+")
    parser.add_argument("--transports", default=DEFAULT_TRANSPORTS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-users", type=int, default=0)
    parser.add_argument("--max-items", type=int, default=0)
    parser.add_argument("--dp-clip", type=float, default=1.0)
    parser.add_argument(
        "--transport-rounds",
        type=int,
        default=LeakUtilityConfig.transport_rounds,
        help="last rounds of secagg/ckks cells run through the transport (0: all rounds)",
    )
    parser.add_argument("--workers", type=int, default=2, help="cells trained at once")
    parser.add_argument("--out", default="results/leak_utility")
    parser.set_defaults(func=_main)
