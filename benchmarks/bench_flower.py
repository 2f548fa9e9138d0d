"""Flower against the in-process runtime: round time, secure aggregation, ML-100K RMSE.

``securefed bench flower`` (or ``python -m securefed.bench.bench_flower``) runs the FedMF example
app
(``securefed/flower/app_template``) in Flower's simulation engine and the same configuration in
one process (``securefed.run_rounds``), in the same run, and reports:

1. the round time of ``--clients`` simulated SuperNodes (one user each) on Flower against the
   in-process round, plaintext: the overhead ratio;
2. the same with securefed's secure aggregation carried over Flower message rounds (four per
   training round) against secure aggregation in one process and against Flower plaintext;
   ``--parts ckks``: the same over CKKS (the nodes encrypt with provisioned keys, the server
   adds ciphertexts, a key-holder node decrypts in one more message round) against in-process
   CKKS;
3. FedMF on MovieLens 100K (u1) over Flower, every user its own SuperNode (``--ml-nodes``
   nodes), ``--ml-rounds`` rounds, against the in-process test RMSE of the same run (stops with
   the reason when ML-100K is not on this machine);
4. the same with the 943 users grouped on ``--ml-grouped-nodes`` SuperNodes: Flower 1.42's
   simulation engine scans every stored message for every node on each poll
   (``vce_api.add_messages_to_queue`` -> ``InMemoryLinkState.get_message_ins``), so its cost
   grows with the square of the number of nodes, and hosting many users per node avoids it.

5. ``--parts threat-models`` (issue 33): the synthetic federation on ``--clients`` nodes with
   secure aggregation against an honest-but-curious server (four message rounds: what Flower
   carried before), against a malicious server (five: signed advertisements, ConsistencyCheck,
   signed member counts; the default now) and ``secagg+dp`` with the exact discrete Gaussian
   encoded on the nodes, each against its in-process twin.

``--parts`` picks the comparisons (default: all but ``threat-models``).

Flower's first round includes starting the simulation's Ray workers and importing the app in
them; round times are the median of the later rounds. The model of each Flower run is compared
with its in-process twin (max |V difference|). Writes ``flower.json`` and ``flower.md`` under
``--out``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from securefed.bench import datasets
from securefed.bench.bench_args import add_out_argument, add_seed_argument
from securefed.bench.bench_fedmf import RESULTS, markdown_table, write_outputs
from securefed.bench.registry import BENCHES

BACKEND = {
    "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
    "init_args": {"num_cpus": 2, "num_gpus": 0, "log_to_driver": False},
}


def _example():
    """The FedMF example app, importable by the simulation's workers too (they get sys.path)."""
    from securefed.recsys.fedmf_flower import APP_DIR

    if str(APP_DIR) not in sys.path:
        sys.path.insert(0, str(APP_DIR))
    from securefed_fedmf_app import app

    return app


def _in_process(example, app) -> tuple[object, list[float]]:
    """The run in one process, with the seconds of each round."""
    from securefed import RunOptions, run_rounds
    from securefed.recsys.fedmf import FedMF

    split = example.load_split(app)
    seeds = app.seeds()
    model = FedMF(split.train, app.fedmf_config(), seeds)
    transport = app.make_transport(remote=False)
    stamps = [time.perf_counter()]
    run_rounds(
        model,
        transport,
        seeds,
        RunOptions(rounds=app.rounds, sampling=app.sampling()),
        on_round=lambda _round, _metrics: stamps.append(time.perf_counter()),
    )
    return model, list(np.diff(stamps))


def _on_flower(example, app, nodes: int, floors=None):
    """The run on Flower's simulation engine; returns the server's outcome and the wall time."""
    from securefed.flower.simulation import run_in_simulation

    apps = example.build_apps(app, floors)
    start = time.perf_counter()
    outcome = run_in_simulation(apps, nodes, BACKEND)
    return outcome, time.perf_counter() - start


def _test_rmse(example, app, model) -> float:
    split = example.load_split(app)
    errors = model.predict(split.test.users, split.test.items) - split.test.ratings
    return float(np.sqrt(np.mean(errors**2)))


def _steady(seconds: list[float]) -> float:
    """Median round time without the first round (warm-up), or the only one."""
    return statistics.median(seconds[1:] if len(seconds) > 1 else seconds)


def _compare(example, app, nodes: int, label: str, floors=None) -> dict:
    outcome, wall = _on_flower(example, app, nodes, floors)
    reference, local_seconds = _in_process(example, app)
    flower_seconds = [r["seconds"] for r in outcome.result.rounds]
    row = {
        "case": label,
        "transport": app.transport,
        "users": int(reference.n_clients),
        "nodes": nodes,
        "rounds": app.rounds,
        "flower_round_s": _steady(flower_seconds),
        "flower_first_round_s": flower_seconds[0],
        "in_process_round_s": _steady(local_seconds),
        "overhead": _steady(flower_seconds) / _steady(local_seconds),
        "flower_wall_s": wall,
        "flower_rmse": outcome.result.evaluations[-1]["rmse"],
        "in_process_rmse": _test_rmse(example, app, reference),
        "max_abs_V_diff": float(np.abs(outcome.model.V - reference.V).max()),
        "message_MB_down": outcome.result.message_bytes["down"] / 2**20,
        "message_MB_up": outcome.result.message_bytes["up"] / 2**20,
        "flower_round_seconds": flower_seconds,
        "in_process_round_seconds": local_seconds,
    }
    print({k: v for k, v in row.items() if not k.endswith("_seconds")}, flush=True)
    return row


def _ckks_row(example, args: argparse.Namespace) -> dict:
    """The synthetic federation over CKKS: keys provisioned to files, the nodes encrypt, the
    server adds ciphertexts, a key-holder node decrypts (against in-process CKKS)."""
    import tempfile

    from securefed.flower.ckks import provision_keys
    from securefed.transport.ckks import CKKSConfig

    with tempfile.TemporaryDirectory(prefix="bench-flower-ckks-") as keys:
        secret, public = provision_keys(keys, CKKSConfig())
        app = example.FedMFApp(
            data="synthetic",
            synthetic_users=args.clients,
            synthetic_items=args.items,
            synthetic_ratings=args.clients * args.ratings_per_user,
            rounds=args.rounds,
            min_nodes=args.clients,
            seed=args.seed,
            transport="ckks",
            ckks_secret_path=str(secret),
            ckks_public_path=str(public),
        )
        return _compare(example, app, args.clients, "synthetic")


def _synthetic(args: argparse.Namespace) -> dict[str, object]:
    """The synthetic federation's FedMFApp fields: ``--clients`` users on as many nodes."""
    return {
        "data": "synthetic",
        "synthetic_users": args.clients,
        "synthetic_items": args.items,
        "synthetic_ratings": args.clients * args.ratings_per_user,
        "rounds": args.rounds,
        "min_nodes": args.clients,
        "seed": args.seed,
    }


def _threat_rows(example, args: argparse.Namespace) -> tuple[list[dict], str]:
    """Secure aggregation against the two threat models, and secagg+dp's exact mechanism."""
    from securefed.flower.floors import NodeFloors

    base = _synthetic(args)
    cases = [
        ("secagg", "honest_but_curious", NodeFloors("honest_but_curious")),
        ("secagg", "malicious", None),
        ("secagg+dp", "malicious", None),
    ]
    rows = []
    for transport, server, floors in cases:
        app = example.FedMFApp(**base, transport=transport, secagg_server=server)
        rows.append(_compare(example, app, args.clients, f"synthetic, server={server}", floors))
    ratio = rows[1]["flower_round_s"] / rows[0]["flower_round_s"]
    note = (
        f"Against a malicious server secure aggregation over Flower costs {ratio:.2f}x the "
        "honest-but-curious protocol per round (five message rounds instead of four, Ed25519 "
        "signatures on the nodes)."
    )
    return rows, note


PARTS = ("synthetic", "ckks", "ml-100k", "ml-100k-grouped", "threat-models")
DEFAULT_PARTS = ("synthetic", "ckks", "ml-100k", "ml-100k-grouped")
COLUMNS = [
    "case",
    "transport",
    "users",
    "nodes",
    "rounds",
    "flower_round_s",
    "in_process_round_s",
    "overhead",
    "flower_first_round_s",
    "flower_rmse",
    "in_process_rmse",
    "max_abs_V_diff",
    "message_MB_down",
    "message_MB_up",
]


def flower(args: argparse.Namespace) -> int:
    """Run the chosen comparisons and write ``flower.json`` / ``flower.md``."""
    import importlib.util

    for module in ("flwr", "ray"):
        if importlib.util.find_spec(module) is None:
            print(f"bench flower: {module} is not installed: pip install securefed[flower]")
            return 2
    example = _example()
    parts = set(args.parts.split(","))
    unknown = parts - set(PARTS)
    if unknown:
        raise ValueError(f"unknown --parts {sorted(unknown)}; known: {', '.join(PARTS)}")
    rows, notes = [], []
    if "synthetic" in parts:
        synthetic = _synthetic(args)
        for transport in ("plaintext", "secagg"):
            app = example.FedMFApp(**synthetic, transport=transport, seed=args.seed)
            rows.append(_compare(example, app, args.clients, "synthetic"))
        ratio = rows[1]["flower_round_s"] / rows[0]["flower_round_s"]
        notes.append(
            f"Secure aggregation over Flower costs {ratio:.2f}x Flower plaintext per round "
            "(four message rounds instead of one)."
        )
    if "ckks" in parts:
        rows.append(_ckks_row(example, args))
    if "threat-models" in parts:
        threat, note = _threat_rows(example, args)
        rows.extend(threat)
        notes.append(note)
    ml_nodes = {"ml-100k": args.ml_nodes, "ml-100k-grouped": args.ml_grouped_nodes}
    if parts & set(ml_nodes):
        try:
            path = datasets.resolve(args.data)
        except datasets.DataUnavailable as error:
            notes.append(f"ML-100K part not run: {error}")
            print(notes[-1])
        else:
            for part in sorted(parts & set(ml_nodes)):
                nodes = ml_nodes[part]
                app = example.FedMFApp(
                    data=str(path),
                    split=args.split,
                    rounds=args.ml_rounds,
                    min_nodes=nodes,
                    seed=args.seed,
                )
                rows.append(_compare(example, app, nodes, f"{args.data} {args.split}"))
    notes.append(
        "Round times: median of the rounds after the first; the first includes starting "
        f"Flower's Ray workers. Load average at the end: {os.getloadavg()[0]:.2f} on "
        f"{os.cpu_count()} cores (shared machine)."
    )
    table = markdown_table(rows, COLUMNS) + "\n" + "".join(f"\n{note}\n" for note in notes)
    write_outputs(
        "flower",
        {
            "rows": rows,
            "notes": notes,
            "backend": BACKEND,
            "loadavg": os.getloadavg(),
        },
        table,
        Path(args.out),
    )
    return 0


def register(benches) -> None:
    parser = BENCHES["flower"].add_to(benches)
    parser.add_argument("--clients", type=int, default=100, help="simulated nodes, one user each")
    parser.add_argument("--items", type=int, default=200, help="items of the synthetic federation")
    parser.add_argument(
        "--ratings-per-user", type=int, default=40, help="ratings per synthetic user"
    )
    parser.add_argument("--rounds", type=int, default=4, help="rounds of the synthetic run")
    parser.add_argument("--data", default="ml-100k", help="the data set of the MovieLens run")
    parser.add_argument("--split", default="u1", help="its split (u1..u5 for ML-100K)")
    parser.add_argument("--ml-rounds", type=int, default=3, help="rounds of the MovieLens run")
    parser.add_argument("--ml-nodes", type=int, default=943, help="one user per node")
    parser.add_argument("--ml-grouped-nodes", type=int, default=50, help="users grouped on nodes")
    parser.add_argument(
        "--parts",
        default=",".join(DEFAULT_PARTS),
        help=f"which comparisons to run (of {', '.join(PARTS)})",
    )
    add_seed_argument(parser)
    add_out_argument(parser, RESULTS)
    parser.set_defaults(func=flower)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m securefed.bench.bench_flower")
    register(parser.add_subparsers(dest="bench", required=True))
    args = parser.parse_args(["flower", *(argv if argv is not None else sys.argv[1:])])
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
