"""Distributed DP in integers against central DP: FedMF on ML-100K (``ddp-vs-central``).

For each epsilon, two runs of the same model (:func:`securefed.recsys.fedmf.user_level_dp_config`,
every user every round, the same seed):

* **central**: transport ``dp`` (clipped updates in the clear, continuous Gaussian noise added by
  the server; Opacus's RDP accountant);
* **distributed integer**: transport ``secagg+dp`` with ``mechanism=discrete_gaussian`` (or
  ``skellam``): each client scales, rotates, rounds and adds exact integer noise, secure
  aggregation sums the integers (32-bit ring at scale 1), the server reduces modulo ``2^bits``,
  rotates back; its own accountant (Kairouz et al. 2021's bound) calibrates the noise to the
  epsilon at the first round.

The record gives each run's RMSE, epsilon spent, noise multiplier, the mechanism's bits per
coordinate (the modulus) and granularity, the ring bits secure aggregation carried them in, the
wrap bound and the bytes uploaded per client and round. ``--rounds`` shortens the schedule (the
calibration follows it); the record states the rounds run.

``--secagg-rounds K`` runs only the last ``K`` rounds through secure aggregation and the earlier
ones through the same integer mechanism over plaintext (a warm start,
:func:`securefed.bench.experiment.warm_start_transport`): the same seeded client streams and
rotation, summed exactly, so the released sums, the model and the RMSE are those of the run
through secure aggregation bit for bit (secure aggregation's ring sum modulo ``2^32``, reduced
modulo ``2^bits``, is the integer sum modulo ``2^bits``), charged to the same ledger and against
the server as secure aggregation would be. The record states ``secagg_rounds``.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict, replace
from pathlib import Path

from securefed.bench import datasets
from securefed.bench.bench_args import (
    add_data_argument,
    add_out_argument,
    add_seed_argument,
    add_split_argument,
)
from securefed.bench.bench_fedmf import markdown_table, write_outputs
from securefed.bench.experiment import FedMFRun, run_fedmf
from securefed.bench.registry import BENCHES
from securefed.recsys.fedmf import user_level_dp_config
from securefed.views import NO_PAYLOADS

RESULTS = Path("results") / "distributed_dp"

COLUMNS = [
    "epsilon_target",
    "rmse_central",
    "rmse_integer",
    "rmse_ratio",
    "epsilon_central",
    "epsilon_integer",
    "sigma_central",
    "sigma_integer",
    "bits_per_coordinate",
    "ring_bits",
    "gamma",
    "wrap_bound",
    "kib_up_integer",
    "kib_up_central",
    "seconds_central",
    "seconds_integer",
    "total_cpu_seconds_central",
    "total_cpu_seconds_integer",
    "mean_round_cpu_seconds_central",
    "mean_round_cpu_seconds_integer",
]


def _central(split, config, args, epsilon: float) -> dict:
    run = FedMFRun(
        config=replace(config, upload="part"),
        transport="dp",
        seed=args.seed,
        progress=False,
        keep_payloads=NO_PAYLOADS,
        transport_options={
            "epsilon": epsilon,
            "delta": args.delta,
            "clip": args.clip,
            "placement": "central",
        },
    )
    record, _, _ = run_fedmf(split, run)
    return record


def round_costs(name: str, record: dict) -> dict[str, object]:
    """Every round's cost of a run (its warm start's rounds included, first), not only the
    rounds ``seconds`` times: per round wall and CPU seconds, their totals and the mean CPU
    seconds of a round."""
    wall, cpu = list(record["round_seconds"]), list(record["round_cpu_seconds"])
    return {
        f"round_seconds_{name}": wall,
        f"round_cpu_seconds_{name}": cpu,
        f"total_seconds_{name}": sum(wall),
        f"total_cpu_seconds_{name}": sum(cpu),
        f"mean_round_cpu_seconds_{name}": sum(cpu) / len(cpu) if cpu else 0.0,
    }


def _warm_rounds(args: argparse.Namespace) -> int:
    """Rounds before the last ``--secagg-rounds`` (run over the plaintext stand-in)."""
    if not args.secagg_rounds or args.secagg_rounds >= args.rounds:
        return 0
    return args.rounds - args.secagg_rounds


def _integer(split, config, args, epsilon: float) -> tuple[dict, dict]:
    run = FedMFRun(
        config=replace(config, upload="full"),
        transport="secagg+dp",
        seed=args.seed,
        progress=False,
        keep_payloads=NO_PAYLOADS,
        warm_start_rounds=_warm_rounds(args),
        transport_options={
            "epsilon": epsilon,
            "delta": args.delta,
            "dp.clip": args.clip,
            "mechanism": args.mechanism,
            "modulus_bits": args.bits,
        },
    )
    record, _, transport = run_fedmf(split, run)
    last = transport.view.rounds[-1].public if transport.view.rounds else {}
    return record, dict(last)


def ddp_vs_central(args: argparse.Namespace) -> int:
    """Run both placements at every epsilon; write the JSON record and the markdown table.

    With ``--merge a.json,b.json`` nothing is run: the rows of records written by earlier runs
    of this bench (the same settings, other epsilons, e.g. run side by side) are put together.
    """
    config = user_level_dp_config(rounds=args.rounds, server_lr=args.server_lr, dim=args.dim)
    rows = []
    if args.merge:
        return _merge(args, config)
    split = datasets.load(args.data, args.split)
    for epsilon in [float(e) for e in args.epsilons.split(",")]:
        central = _central(split, config, args, epsilon)
        integer, public = _integer(split, config, args, epsilon)
        rows.append(
            {
                "epsilon_target": epsilon,
                "rmse_central": central["rmse"],
                "rmse_integer": integer["rmse"],
                "rmse_ratio": integer["rmse"] / central["rmse"],
                "epsilon_central": central["epsilon"],
                "epsilon_integer": integer["epsilon"],
                "epsilon_integer_server": integer["epsilon_server"],
                "sigma_central": central["noise_multiplier"],
                "sigma_integer": integer["noise_multiplier"],
                "bits_per_coordinate": public.get("ddp_bits"),
                "ring_bits": 32,
                "gamma": public.get("ddp_gamma"),
                "wrap_bound": public.get("ddp_wrap_bound"),
                "padded_dim": public.get("ddp_padded_dim"),
                "dim": public.get("ddp_dim"),
                "noise_per_client_units": public.get("ddp_noise"),
                "kib_up_integer": integer["bytes_up_per_client"] / 1024,
                "kib_up_central": central["bytes_up_per_client"] / 1024,
                "seconds_central": central["seconds"],
                "seconds_integer": integer["seconds"],
                **round_costs("central", central),
                **round_costs("integer", integer),
            }
        )
        print(rows[-1], flush=True)
    _write(args, config, rows, split.name)
    return 0


def _merge(args: argparse.Namespace, config) -> int:
    from securefed.records import loads_record

    rows, data = [], None
    for path in args.merge.split(","):
        record = loads_record(Path(path).read_text())
        keys = ("rounds", "delta", "clip", "mechanism", "bits", "seed", "secagg_rounds")
        same = {k: record.get(k) for k in keys}
        wanted = {
            "secagg_rounds": _secagg_rounds(args),
            "rounds": args.rounds,
            "delta": args.delta,
            "clip": args.clip,
            "mechanism": args.mechanism,
            "bits": args.bits,
            "seed": args.seed,
        }
        if same != wanted:
            raise ValueError(f"{path} was run with {same}, not {wanted}")
        rows.extend(record["rows"])
        data = record["data"]
    rows.sort(key=lambda r: r["epsilon_target"])
    _write(args, config, rows, data)
    return 0


def _secagg_rounds(args: argparse.Namespace) -> int:
    """The rounds run through secure aggregation (the last ones)."""
    return args.rounds - _warm_rounds(args)


def _write(args: argparse.Namespace, config, rows: list[dict], data: str) -> None:
    secagg_rounds = _secagg_rounds(args)
    through = (
        "every round through secure aggregation"
        if secagg_rounds == args.rounds
        else f"the last {secagg_rounds} rounds through secure aggregation, the first "
        f"{args.rounds - secagg_rounds} over its plaintext stand-in (the same integers summed "
        "exactly: the same released sums bit for bit)"
    )
    table = (
        f"FedMF ({data}, {args.rounds} rounds, every user every round, clip {args.clip}, "
        f"delta {args.delta:g}): central continuous Gaussian (transport dp) against the "
        f"distributed {args.mechanism} through secure aggregation (secagg+dp, "
        f"{args.bits} bits per coordinate carried in a 32-bit ring; {through}).\n\n"
        + markdown_table(rows, COLUMNS)
    )
    write_outputs(
        args.name or f"ddp_vs_central_{args.mechanism}",
        {
            "rows": rows,
            "data": data,
            "config": asdict(config),
            "rounds": args.rounds,
            "delta": args.delta,
            "clip": args.clip,
            "mechanism": args.mechanism,
            "bits": args.bits,
            "seed": args.seed,
            "secagg_rounds": secagg_rounds,
            "command": " ".join(sys.argv),
            "goal": "rmse_integer within 1% of rmse_central at every epsilon",
            "within_1_percent": all(abs(r["rmse_ratio"] - 1) <= 0.01 for r in rows),
        },
        table,
        Path(args.out),
    )


def register(benches) -> None:
    parser = BENCHES["ddp-vs-central"].add_to(benches)
    add_data_argument(parser)
    add_split_argument(parser)
    add_seed_argument(parser)
    add_out_argument(parser, RESULTS)
    parser.add_argument("--epsilons", default="1,4,8,16", help="comma-separated DP target epsilons")
    parser.add_argument(
        "--mechanism",
        default="discrete_gaussian",
        help="the distributed-DP mechanism (discrete_gaussian or skellam)",
    )
    parser.add_argument(
        "--bits",
        type=int,
        default=20,
        help="fixed-point bits of the integer encoding under secure aggregation",
    )
    parser.add_argument("--delta", type=float, default=1e-5, help="DP delta")
    parser.add_argument("--clip", type=float, default=1.0, help="DP per-client L2 clip norm")
    parser.add_argument("--rounds", type=int, default=100, help="rounds per run (100)")
    parser.add_argument(
        "--server-lr", type=float, default=4.0, help="the server's step size eta (4.0)"
    )
    parser.add_argument("--dim", type=int, default=10, help="latent dimension (10)")
    parser.add_argument("--name", default=None, help="record name (default per mechanism)")
    parser.add_argument(
        "--secagg-rounds",
        type=int,
        default=0,
        help="run only the last K rounds through secure aggregation, the earlier ones over its "
        "plaintext stand-in (the same sums bit for bit; 0: every round)",
    )
    parser.add_argument("--merge", default=None, help="comma-separated records to put together")
    parser.set_defaults(func=ddp_vs_central)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    benches = parser.add_subparsers(dest="bench", required=True)
    register(benches)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
