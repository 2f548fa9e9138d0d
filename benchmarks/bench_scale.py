"""``securefed bench scale``: FedMF rounds from 10^3 to 10^6 users, a thousand sampled per round.

Users are drawn from the package's generator (:mod:`securefed.recsys.population`), fitted to the
training split of ``--data``. Each cell is one (population size, transport, user store, item
blocks) run of a few rounds, in a fresh process (so that its peak memory is its own), with
``--sampled`` users per round (fixed-size sampling without replacement). Per round it reports
its CPU seconds, the process's peak resident memory above its start, and the bytes uploaded,
each beside its floor measured in the same cell:

* CPU: plaintext, the centralised full-batch step of the same objective on the round's ratings
  (:func:`securefed.bench.bench_fedmf.centralised_step`, the arithmetic of the round without
  any client structure); secure aggregation, that plus the cryptography the round must run
  (operation counts times each primitive's measured cost,
  :func:`securefed.bench.bench_secagg.round_operations`): the masks, the rounding draws and the
  key agreements. Not in the floor: the DP noise, and the malicious-server variant's signatures
  (the registry's default ``secagg``), whose counted cost is recorded apart
  (``signing_count_cpu_s``: the count assumes every helper checks its quorum of survivor-set
  signatures, and exceeds what the measured rounds cost in all, so it is recorded, not used).
  The on-demand store's generation of the round's ratings (a simulation cost: a device holds
  its ratings) is reported apart (``generate_cpu_s``) and included in ``round_cpu_s``;
  ``net_cpu_over_floor`` leaves it out.
* memory: the model (``V``, item biases), the round's ratings and users' state, and one
  aggregate block: what a round cannot do without.
* bytes: the values of the rows each client uploads, 8 bytes each (sparse, no index); a hiding
  transport pays the dense block over the round's item rows instead, the price of hiding which
  rows a client touched, which ``item_blocks`` cuts.

User stores: ``on-demand`` (:class:`~securefed.recsys.population.OnDemandPopulation` and
:class:`~securefed.recsys.user_state.LazyRows`: memory for the users who took part only) and
``stored`` (the population drawn in full, :func:`~securefed.recsys.population.draw_population`,
today's path: memory linear in the users), the latter only up to ``--stored-max`` users.
"""

from __future__ import annotations

import argparse
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from securefed import ClientSampling, SeedTree
from securefed.bench import datasets
from securefed.bench.bench_args import add_data_argument, add_out_argument, add_seed_argument
from securefed.bench.experiment import save_json
from securefed.bench.processes import one_thread_per_process
from securefed.bench.registry import BENCHES
from securefed.bench.tables import markdown_table
from securefed.recsys.population import (
    OnDemandPopulation,
    PopulationModel,
    draw_population,
    fit_population,
)

RESULTS = Path("results/scale")
TRANSPORTS = ("plaintext", "secagg", "secagg+dp")
STORES = ("on-demand", "stored")


@dataclass(frozen=True)
class ScaleCell:
    """One run of the bench (module docstring).

    Raises:
        ValueError: an unknown transport or store, or counts below 1.
    """

    users: int
    transport: str
    store: str
    rounds: int
    sampled: int
    dim: int
    item_blocks: int = 1
    noise_multiplier: float = 1.0
    epsilon: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}, got {self.transport!r}")
        if self.store not in STORES:
            raise ValueError(f"store must be one of {STORES}, got {self.store!r}")
        for name in ("users", "rounds", "sampled", "dim", "item_blocks"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.epsilon is not None and (self.transport != "secagg+dp" or not self.epsilon > 0):
            raise ValueError(
                f"a target epsilon (> 0) is for the secagg+dp cells, got {self.epsilon!r} for "
                f"{self.transport!r}"
            )


def memory_status() -> dict[str, int]:
    """This process's resident memory now and at its peak (``VmRSS``, ``VmHWM``; bytes)."""
    values = {}
    with open("/proc/self/status") as status:
        for line in status:
            name, _, rest = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                values[name] = int(rest.split()[0]) * 1024
    return values


def _config(cell: ScaleCell):
    from securefed.recsys.fedmf import FedMFConfig, user_level_dp_config

    if cell.transport == "secagg+dp":  # the DP preset: fixed denominator, the user's mean
        return user_level_dp_config(
            dim=cell.dim, expected_clients=float(cell.sampled), item_blocks=cell.item_blocks
        )
    return FedMFConfig(dim=cell.dim, item_blocks=cell.item_blocks)


def _transport(cell: ScaleCell):
    from securefed.transport import build_transport, parse_transport_spec, resolve_options

    noise = (
        {"noise_multiplier": cell.noise_multiplier}
        if cell.epsilon is None
        else {"dp.epsilon": cell.epsilon}  # calibrated over the cell's rounds at its sampling
    )
    dp = noise | {"dp.clip": 1.0}
    options = dp if cell.transport == "secagg+dp" else {}
    return build_transport(
        cell.transport,
        resolve_options(parse_transport_spec(cell.transport), options),
        total_rounds=cell.rounds,
        n_clients=cell.users,
        sample_rate=min(1.0, cell.sampled / cell.users),
    )


def run_cell(cell: ScaleCell, model: PopulationModel) -> dict:
    """Run ``cell`` here (call it in a fresh process: its peak memory is the process's)."""
    from scipy import sparse

    from securefed.bench.bench_fedmf import centralised_step
    from securefed.recsys.fedmf import FedMF

    start_memory = memory_status()["VmRSS"]
    started = time.process_time()
    if cell.store == "on-demand":
        data = OnDemandPopulation(model, cell.users, seed=cell.seed)
    else:
        data = draw_population(model, cell.users, seed=cell.seed)
    config = _config(cell)
    seeds = SeedTree(cell.seed)
    fedmf = FedMF(data, config, seeds)
    transport = _transport(cell)
    build_cpu = time.process_time() - started
    sampling = ClientSampling("fixed", cell.sampled)
    secure = cell.transport != "plaintext"
    costs = None
    stored = data.to_csr() if cell.store == "stored" else None  # for the floors only
    rounds = []
    for round_id in range(cell.rounds):
        clients = sampling.sample(cell.users, seeds.generator("sampling", round_id))
        started = time.process_time()
        rnd, clients = fedmf.open_round(round_id, clients, transport, seeds)
        fedmf.client_step(round_id, clients, seeds, rnd.submit_batch)
        fedmf.close_round(rnd)
        round_cpu = time.process_time() - started
        # The floors, outside the timed round (module docstring).
        started = time.process_time()
        if stored is None:
            indptr, items, ratings = data.rows(clients)
        else:
            taken = stored[clients]
            indptr, items, ratings = taken.indptr, taken.indices, taken.data
        generate_cpu = time.process_time() - started if stored is None else 0.0
        csr = sparse.csr_matrix((ratings, items, indptr), shape=(len(clients), fedmf.n_items))
        user_rows = np.asarray(fedmf.U[clients])
        started = time.process_time()
        centralised_step(csr, user_rows, fedmf.V, config)
        floor_cpu = time.process_time() - started
        block = fedmf.block_rows(round_id)
        n_rows = fedmf.n_items + 2 if block is None else len(block)
        width = config.width + 1
        in_block = np.ones(len(items), bool) if block is None else np.isin(items, block)
        uploaded_rows = int(in_block.sum()) + 2 * len(clients)
        record = {
            "round": round_id,
            "clients": len(clients),
            "ratings": int(indptr[-1]),
            "round_cpu_s": round_cpu,
            "generate_cpu_s": generate_cpu,
            "plaintext_floor_cpu_s": floor_cpu,
            "bytes_up": int(transport.view.round(round_id).bytes_up.sum()),
            "bytes_floor": uploaded_rows * width * 8,
            "block_values": n_rows * width,
        }
        if secure:
            from securefed.bench.bench_secagg import (
                _KEYS,
                _MASKING,
                _SIGNING,
                floor_seconds,
                primitive_costs,
                round_operations,
            )

            inner = getattr(rnd, "inner", rnd)
            if costs is None:
                costs = primitive_costs(n_rows * width, bits=inner.config.bits)
            malicious = inner.config.server == "malicious"
            ops = round_operations(inner, malicious=malicious, auth=inner.config.auth)
            record["crypto_floor_cpu_s"] = floor_seconds(ops, costs["cpu"], _MASKING + _KEYS)
            record["masking_floor_cpu_s"] = floor_seconds(ops, costs["cpu"], _MASKING)
            record["signing_count_cpu_s"] = floor_seconds(ops, costs["cpu"], _SIGNING)
            record["crypto_operations"] = ops
            record["primitive_cpu_s"] = costs["cpu"]
        rounds.append(record)
    memory = memory_status()
    model_bytes = fedmf.V.nbytes + fedmf.item_bias.nbytes
    round_state = max(r["ratings"] for r in rounds) * 24 + cell.sampled * (config.dim + 1) * 8
    block_bytes = max(r["block_values"] for r in rounds) * 8
    privacy = {}
    if cell.transport == "secagg+dp":
        privacy = {
            "epsilon_spent": transport.epsilon(),
            "epsilon_server": transport.epsilon(against="server"),
            "noise_multiplier_used": transport.config.noise_multiplier,
        }
    return (
        asdict(cell)
        | privacy
        | {
            "n_items": fedmf.n_items,
            "build_cpu_s": build_cpu,
            "rounds_detail": rounds,
            "peak_rss_mb": memory["VmHWM"] / 2**20,
            "start_rss_mb": start_memory / 2**20,
            "peak_extra_mb": (memory["VmHWM"] - start_memory) / 2**20,
            "memory_floor_mb": (model_bytes + round_state + block_bytes) / 2**20,
        }
    )


def summarise(result: dict) -> dict:
    """A cell's table row: medians over its rounds (the first round included)."""
    rounds = result["rounds_detail"]

    def median(key: str) -> float:
        return float(np.median([r[key] for r in rounds]))

    cpu = median("round_cpu_s")
    floor = median("plaintext_floor_cpu_s") + (
        median("crypto_floor_cpu_s") if "crypto_floor_cpu_s" in rounds[0] else 0.0
    )
    bytes_up, bytes_floor = median("bytes_up"), median("bytes_floor")
    return {
        "users": result["users"],
        "transport": result["transport"],
        "store": result["store"],
        "item_blocks": result["item_blocks"],
        "rounds": result["rounds"],
        "round_cpu_s": cpu,
        "generate_cpu_s": median("generate_cpu_s"),
        "floor_cpu_s": floor,
        "cpu_over_floor": cpu / floor if floor > 0 else float("nan"),
        "net_cpu_over_floor": (cpu - median("generate_cpu_s")) / floor if floor > 0 else 0.0,
        "peak_extra_mb": result["peak_extra_mb"],
        "memory_floor_mb": result["memory_floor_mb"],
        "memory_over_floor": result["peak_extra_mb"] / result["memory_floor_mb"],
        "peak_rss_mb": result["peak_rss_mb"],
        "mb_up_per_round": bytes_up / 2**20,
        "bytes_over_floor": bytes_up / bytes_floor,
        "build_cpu_s": result["build_cpu_s"],
    }


def cells_of(args: argparse.Namespace) -> list[ScaleCell]:
    """The cells the command line asks for, cheapest first."""
    users = [int(float(u)) for u in args.users.split(",") if u]
    secure_users = (
        [int(float(u)) for u in args.secure_users.split(",")] if args.secure_users else []
    )
    blocks = [int(b) for b in args.item_blocks.split(",")]
    common = {
        "sampled": args.sampled,
        "dim": args.dim,
        "noise_multiplier": args.noise_multiplier,
        "seed": args.seed,
    }
    cells = []
    dp_target = {"epsilon": args.epsilon} if args.epsilon is not None else {}
    for n in users:
        for store in ("on-demand", "stored"):
            if store == "stored" and n > args.stored_max:
                continue
            cells.append(ScaleCell(n, "plaintext", store, args.rounds, **common))
    for transport in args.transports.split(","):
        if transport == "plaintext":
            continue
        for n in secure_users:
            for b in blocks:
                cells.append(
                    ScaleCell(
                        n,
                        transport,
                        "on-demand",
                        args.secure_rounds,
                        item_blocks=b,
                        **common,
                        **(dp_target if transport == "secagg+dp" else {}),
                    )
                )
    return cells


def in_fresh_process(cell: ScaleCell, model: PopulationModel) -> dict:
    """:func:`run_cell` in a new spawned interpreter (one BLAS thread), its result back."""
    with (
        one_thread_per_process(),
        ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool,
    ):
        return pool.submit(run_cell, cell, model).result()


COLUMNS = [
    "users",
    "transport",
    "store",
    "item_blocks",
    "rounds",
    "round_cpu_s",
    "generate_cpu_s",
    "floor_cpu_s",
    "cpu_over_floor",
    "net_cpu_over_floor",
    "peak_extra_mb",
    "memory_floor_mb",
    "memory_over_floor",
    "mb_up_per_round",
    "bytes_over_floor",
]


def _cell_text(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def table(rows: list[dict]) -> str:
    return markdown_table(COLUMNS, ([_cell_text(r[c]) for c in COLUMNS] for r in rows))


def plot(rows: list[dict], path: Path) -> None:
    """Round CPU and peak memory against users, log-log, one line per (transport, store,
    blocks)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (cpu_axis, memory_axis) = plt.subplots(1, 2, figsize=(11, 4.2))
    lines = sorted({(r["transport"], r["store"], r["item_blocks"]) for r in rows})
    for line in lines:
        transport, store, blocks = line
        done = sorted(
            (r for r in rows if (r["transport"], r["store"], r["item_blocks"]) == line),
            key=lambda r: r["users"],
        )
        label = f"{transport}, {store}" + (f", {blocks} blocks" if blocks > 1 else "")
        users = [r["users"] for r in done]
        cpu_axis.plot(users, [r["round_cpu_s"] for r in done], "o-", label=label)
        memory_axis.plot(users, [r["peak_extra_mb"] for r in done], "o-", label=label)
    for axis, title in ((cpu_axis, "CPU seconds per round"), (memory_axis, "peak memory, MB")):
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xlabel("users in the population")
        axis.set_title(title)
        axis.grid(alpha=0.3, which="both")
    cpu_axis.axhline(1.0, color="grey", ls="--", lw=0.8)
    memory_axis.axhline(4096, color="grey", ls="--", lw=0.8)
    memory_axis.legend(fontsize=7)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)


def run(args: argparse.Namespace) -> int:
    split = datasets.load(args.data, args.split, seed=args.seed)
    model = fit_population(split.train, seed=args.seed)
    out = Path(args.out)
    meta = {
        "bench": "scale",
        "data": split.name,
        "sampled_per_round": args.sampled,
        "dim": args.dim,
        "blas_threads": 1,
    }
    results = merge_cells(out / "scale.json", []) if args.merge else []
    for cell in cells_of(args):
        result = in_fresh_process(cell, model)
        results = merge_cells(None, [result], results)
        print(table([summarise(result)]).splitlines()[-1], flush=True)
        write_record(out, meta, results)  # after every cell: a later failure keeps these
    write_record(out, meta, results)
    rows = [summarise(result) for result in results]
    print(table(rows))
    print(f"\nwritten: {out / 'scale.json'}, scale.md, scale.png")
    return 0


def write_record(out: Path, meta: dict, results: list[dict]) -> None:
    """``scale.json`` (every cell in full), ``scale.md`` (the table) and ``scale.png``."""
    rows = [summarise(result) for result in results]
    save_json(meta | {"rows": rows, "cells": results}, out / "scale.json")
    (out / "scale.md").write_text(table(rows) + "\n")
    plot(rows, out / "scale.png")


def _cell_key(result: dict) -> tuple:
    return (result["users"], result["transport"], result["store"], result["item_blocks"])


def merge_cells(
    path: Path | None, results: list[dict], cells: list[dict] | None = None
) -> list[dict]:
    """``cells`` (default: those of the record at ``path``) with those of ``results`` replaced
    or added."""
    from securefed.records import loads_record

    if cells is None:
        cells = loads_record(path.read_text())["cells"] if path and path.is_file() else []
    fresh = {_cell_key(r): r for r in results}
    merged = [fresh.pop(_cell_key(r), r) for r in cells]
    return merged + [r for r in results if _cell_key(r) in fresh]


def register(benches) -> None:
    parser = BENCHES["scale"].add_to(benches)
    add_data_argument(parser, "ml-100k")
    parser.add_argument("--split", default="u1", help="the split whose training part is fitted")
    add_seed_argument(parser)
    add_out_argument(parser, RESULTS)
    add = parser.add_argument
    add("--users", default="1e3,1e4,1e5,1e6", help="population sizes of the plaintext cells")
    add("--sampled", type=int, default=1000, help="users sampled per round (default 1000)")
    add("--dim", type=int, default=20, help="latent dimension (default 20)")
    add("--rounds", type=int, default=5, help="rounds of each plaintext cell (default 5)")
    add(
        "--stored-max",
        type=int,
        default=100_000,
        help="largest population also run with the population stored in full (today's path)",
    )
    add("--transports", default=",".join(TRANSPORTS), help="comma-separated transports")
    add(
        "--secure-users",
        default="1e3,1e6",
        help="population sizes of the secure cells (their cost depends on the sampled users)",
    )
    add("--secure-rounds", type=int, default=2, help="rounds of each secure cell (default 2)")
    add("--item-blocks", default="1,8", help="FedMF item_blocks of the secure cells")
    add(
        "--noise-multiplier",
        type=float,
        default=1.0,
        help="the secagg+dp cells' noise multiplier (fixed, so that every size adds the same "
        "noise), unless --epsilon is given",
    )
    add(
        "--epsilon",
        type=float,
        default=None,
        help="the secagg+dp cells' target epsilon over their rounds (calibrated by the discrete "
        "Gaussian's accountant at the cell's sampling rate); default: --noise-multiplier",
    )
    add(
        "--merge",
        action="store_true",
        help="replace these cells in the record already in --out, keep its others",
    )
    parser.set_defaults(func=run)
