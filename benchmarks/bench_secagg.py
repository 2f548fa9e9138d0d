"""Benchmark of secure aggregation (SecAgg+ over Bonawitz et al. 2017) against plaintext.

Run from the repository root::

    python -m securefed.bench.bench_secagg                      # n in {10, 100, 1000}, d in {1e4,
    1e5}
    python -m securefed.bench.bench_secagg --quick              # small sizes, under a minute
    python -m securefed.bench.bench_secagg --out results/secagg.json

For each number of clients ``n``, vector length ``d`` and dropout rate (0, 10 %, 30 %) it runs one
secure-aggregation round and one plaintext round (:class:`~securefed.PlaintextTransport`) on the
same updates in the same process, and reports the round time split into key agreement (X25519 +
HKDF), sharing (Shamir + AEAD), encoding (fixed point), mask expansion (PRG + ring adds, clients)
and unmasking (share decryption, reconstruction and mask removal), the bytes per client, the
ratio to plaintext, and the error against the plaintext sum with its documented bound.

Dropped clients drop *before* sending their masked input, the expensive case for the server (their
pairwise masks must be rebuilt and removed). The graph degree is sized for the dropout rate
(``SecAggConfig(expected_dropout=rate)``, failure bound 1e-3 per round); one extra case runs 30 %
dropout at the default degree to show the refusal. All times are single-process wall clock on
this machine: the simulation runs every client's work one after another, so a round's time is the
*sum* of all clients' and the server's compute, not the latency of a deployment.

If ``flwr`` is importable, Flower's SecAgg+ is timed on 10 clients x 100k values beside ours;
otherwise the table says it was not installed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from securefed import PlaintextTransport, SeedTree
from securefed.errors import AggregationError
from securefed.transport.secagg import STAGES, SecAggConfig, SecAggTransport

FULL_CLIENTS = (10, 100, 1000)
FULL_LENGTHS = (10_000, 100_000)
QUICK_CLIENTS = (10, 100)
QUICK_LENGTHS = (1_000, 10_000)
DROPOUTS = (0.0, 0.1, 0.3)
POOL = 8  # distinct random update vectors, cycled over the clients (keeps memory flat)


@dataclass
class Case:
    """One measured configuration and its results."""

    clients: int
    length: int
    dropout: float
    sized_for_dropout: bool
    k: int = 0
    t: int = 0
    status: str = "ok"
    seconds: float = 0.0
    stages: dict[str, float] = field(default_factory=dict)
    plaintext_seconds: float = 0.0
    ratio: float = 0.0
    bytes_up_per_client: float = 0.0
    bytes_down_per_client: float = 0.0
    plaintext_bytes_up_per_client: float = 0.0
    max_error: float = 0.0
    error_bound: float = 0.0


def _updates(length: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1.0, 1.0, (POOL, length))


def _plaintext_round(case: Case, pool: np.ndarray, dropped: set[int], seeds: SeedTree):
    transport = PlaintextTransport()
    start = time.perf_counter()
    rnd = transport.open_round(0, range(case.clients), shape=(1, case.length), seeds=seeds)
    for c in range(case.clients):
        if c in dropped:
            rnd.drop(c)
        else:
            rnd.submit(c, pool[c % POOL])
    aggregate = rnd.result()
    elapsed = time.perf_counter() - start
    return aggregate, elapsed, float(rnd.view.bytes_up.mean())


def run_case(
    clients: int, length: int, dropout: float, *, sized_for_dropout: bool = True, seed: int = 0
) -> Case:
    """Measure one secure round and one plaintext round on the same updates."""
    case = Case(clients, length, dropout, sized_for_dropout)
    pool = _updates(length, seed)
    rng = np.random.default_rng(seed + 1)
    dropped = set(rng.choice(clients, round(dropout * clients), replace=False).tolist())
    seeds = SeedTree(seed)
    config = SecAggConfig(expected_dropout=dropout if sized_for_dropout else 0.0)
    transport = SecAggTransport(config)
    start = time.perf_counter()
    rnd = transport.open_round(0, range(clients), shape=(1, length), seeds=seeds)
    case.k, case.t = rnd.neighbours_k, rnd.threshold
    for c in range(clients):
        if c in dropped:
            rnd.drop(c)
        else:
            rnd.submit(c, pool[c % POOL])
    try:
        aggregate = rnd.result()
    except AggregationError as error:
        aggregate = None
        case.status = f"refused: {str(error)[:90]}"
    case.seconds = time.perf_counter() - start
    case.stages = dict(rnd.timings)
    case.bytes_up_per_client = float(rnd.view.bytes_up.mean())
    case.bytes_down_per_client = float(rnd.view.bytes_down.mean())
    reference, case.plaintext_seconds, case.plaintext_bytes_up_per_client = _plaintext_round(
        case, pool, dropped, seeds
    )
    case.ratio = case.seconds / case.plaintext_seconds
    if aggregate is not None:
        case.max_error = float(np.max(np.abs(aggregate.total - reference.total)))
        case.error_bound = rnd.error_bound()
    return case


def time_flower(clients: int = 10, length: int = 100_000) -> dict[str, object]:
    """Time Flower's SecAgg+ on ``clients`` x ``length`` if ``flwr`` is importable.

    Best effort against Flower's documented simulation API (ServerApp + SecAggPlusWorkflow,
    ClientApp + secaggplus_mod); it could not be exercised where this benchmark was written
    (``flwr`` was not installed), so any failure is reported rather than raised.
    """
    if importlib.util.find_spec("flwr") is None:
        return {"status": "flwr not installed: Flower's SecAgg+ was not timed"}
    try:
        import flwr.compat.common.recorddict_compat as compat
        from flwr.client import ClientApp, NumPyClient
        from flwr.client.mod import secaggplus_mod
        from flwr.common import parameters_to_ndarrays
        from flwr.server import LegacyContext, ServerApp, ServerConfig
        from flwr.server.strategy import FedAvg
        from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow
        from flwr.simulation import run_simulation

        vector = np.random.default_rng(0).uniform(-1, 1, length)
        received: dict[str, np.ndarray] = {}

        class _Client(NumPyClient):
            def fit(self, parameters, config):
                return [vector], 1, {}

        client_app = ClientApp(
            client_fn=lambda context: _Client().to_client(), mods=[secaggplus_mod]
        )
        server_app = ServerApp()

        @server_app.main()
        def _main(grid, context) -> None:
            legacy = LegacyContext(
                context=context,
                config=ServerConfig(num_rounds=1),
                strategy=FedAvg(min_fit_clients=clients, min_available_clients=clients),
            )
            workflow = DefaultWorkflow(
                fit_workflow=SecAggPlusWorkflow(
                    num_shares=clients, reconstruction_threshold=clients // 2 + 1
                )
            )
            workflow(grid, legacy)
            record = legacy.state.array_records["parameters"]  # Flower's MAIN_PARAMS_RECORD
            received["aggregate"] = parameters_to_ndarrays(
                compat.arrayrecord_to_parameters(record, keep_input=True)
            )[0]

        start = time.perf_counter()
        run_simulation(server_app=server_app, client_app=client_app, num_supernodes=clients)
        seconds = time.perf_counter() - start
        result = {"status": "ok", "clients": clients, "length": length, "seconds": seconds}
        if "aggregate" in received:
            # Every client sends the same vector, so FedAvg's mean should equal it.
            error = np.abs(np.asarray(received["aggregate"], dtype=np.float64) - vector)
            result |= {
                "max_abs_error": float(error.max()),
                "max_rel_error": float(error.max() / np.abs(vector).max()),
            }
        return result
    except Exception as error:  # a foreign API: report the failure, do not crash the benchmark
        return {
            "status": f"flwr importable but its SecAgg+ run failed: {type(error).__name__}: {error}"
        }


def markdown_table(cases: list[Case]) -> str:
    """The results as a markdown table (times in seconds, bytes in KiB per client)."""
    header = (
        "| n | d | dropout | k | t | status | total s | key agr. | sharing | encoding | mask exp. "
        "| unmask | plaintext s | ratio | KiB up/client | KiB down/client | plain KiB up | max err "
        "| bound |"
    )
    lines = [header, "|" + "---|" * 19]
    for c in cases:
        s = c.stages
        dropout = f"{c.dropout:.0%}" + ("" if c.sized_for_dropout else " (default k)")
        status = "ok" if c.status == "ok" else "refused"
        lines.append(
            f"| {c.clients} | {c.length:,} | {dropout} | {c.k} | {c.t} | {status} "
            f"| {c.seconds:.2f} "
            f"| {s['key_agreement']:.2f} | {s['sharing']:.2f} | {s['encoding']:.2f} "
            f"| {s['mask_expansion']:.2f} | {s['unmasking']:.2f} | {c.plaintext_seconds:.3f} "
            f"| {c.ratio:.1f}x | {c.bytes_up_per_client / 1024:.1f} "
            f"| {c.bytes_down_per_client / 1024:.1f} "
            f"| {c.plaintext_bytes_up_per_client / 1024:.1f} "
            f"| {c.max_error:.1e} | {c.error_bound:.1e} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes only (under a minute)")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    clients, lengths = (
        (QUICK_CLIENTS, QUICK_LENGTHS) if args.quick else (FULL_CLIENTS, FULL_LENGTHS)
    )
    cases = []
    for n in clients:
        for d in lengths:
            for dropout in DROPOUTS:
                case = run_case(n, d, dropout, seed=args.seed)
                print(
                    f"n={n} d={d} dropout={dropout:.0%} k={case.k}: {case.seconds:.2f} s "
                    f"({case.ratio:.1f}x plaintext) {case.status}",
                    file=sys.stderr,
                    flush=True,
                )
                cases.append(case)
    # SecAgg+ at its default degree cannot absorb 30 % dropout: show the refusal.
    n, d = clients[-1], lengths[-1]
    cases.append(run_case(n, d, 0.3, sized_for_dropout=False, seed=args.seed))
    flower = time_flower() if not args.quick else {"status": "skipped in --quick"}

    print(markdown_table(cases))
    print()
    print(f"Flower SecAgg+ (10 clients x 100k): {flower}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        report = {
            "benchmark": "secagg",
            "quick": args.quick,
            "machine": {"python": platform.python_version(), "processor": platform.processor()},
            "stages": list(STAGES),
            "cases": [asdict(c) for c in cases],
            "flower": flower,
        }
        args.out.write_text(json.dumps(report, indent=1))
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
