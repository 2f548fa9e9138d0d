"""FedMF's item blocks on ml-latest-small with the biased preset (``securefed fedmf``'s default).

For each ``item_blocks`` value: the CPU seconds of one training round under ``secagg`` (the
registry's default: malicious server, signatures) and under plaintext, the bytes each client
uploads, and the test RMSE of a plaintext run of the preset's rounds (and, with ``--long``,
of ``B`` times as many rounds: the same number of steps per item). The global-mean round that
the preset runs first is not timed.

Run: ``python benchmarks/results/item_blocks/round_cost.py --blocks 1,8 --out FILE``.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from securefed import PlaintextTransport, SeedTree
from securefed.bench import datasets
from securefed.bench.experiment import save_json
from securefed.recsys.fedmf import FedMF, biased_config
from securefed.recsys.metrics import rmse
from securefed.transport import build_transport


def secure_round(train, blocks: int) -> dict:
    seeds = SeedTree(0)
    model = FedMF(train, biased_config(item_blocks=blocks), seeds)
    transport = build_transport("secagg", n_clients=train.n_users, total_rounds=1)
    model.rating_mean_round(transport, seeds)
    clients = np.arange(train.n_users)
    started, wall = time.process_time(), time.perf_counter()
    model.run_round(0, clients, transport, seeds)
    cpu, wall = time.process_time() - started, time.perf_counter() - wall
    up, _ = transport.view.mean_bytes_per_client()
    plain_model = FedMF(train, biased_config(item_blocks=blocks), SeedTree(0))
    plain = PlaintextTransport()
    plain_model.rating_mean_round(plain, SeedTree(0))
    started = time.process_time()
    plain_model.run_round(0, clients, plain, SeedTree(0))
    plain_cpu = time.process_time() - started
    return {
        "item_blocks": blocks,
        "secagg_round_cpu_s": cpu,
        "secagg_round_wall_s": wall,
        "plaintext_round_cpu_s": plain_cpu,
        "secagg_over_plaintext": cpu / plain_cpu,
        "secagg_mib_up_per_client": up / 2**20,
        "plaintext_mib_up_per_client": plain.view.mean_bytes_per_client()[0] / 2**20,
    }


def utility(split, blocks: int, rounds: int) -> float:
    seeds = SeedTree(0)
    model = FedMF(split.train, biased_config(item_blocks=blocks, rounds=rounds), seeds)
    transport = PlaintextTransport()
    clients = np.arange(split.train.n_users)
    for round_id in range(rounds):
        model.run_round(round_id, clients, transport, seeds)
    return float(rmse(model.predict(split.test.users, split.test.items), split.test.ratings))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", default="1,8")
    parser.add_argument("--long", action="store_true", help="also B x the preset's rounds")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    split = datasets.load("ml-latest-small", None, seed=0)
    rows = []
    load = [os.getloadavg()]
    for blocks in (int(b) for b in args.blocks.split(",")):
        row = secure_round(split.train, blocks)
        rounds = biased_config().rounds
        row["test_rmse_preset_rounds"] = utility(split, blocks, rounds)
        row["preset_rounds"] = rounds
        if args.long and blocks > 1:
            row["test_rmse_blocks_x_rounds"] = utility(split, blocks, blocks * rounds)
        rows.append(row)
        print(row, flush=True)
    load.append(os.getloadavg())
    save_json(
        {
            "data": split.name,
            "preset": "biased_config (dim 100, biases, Adam on the server, 35 rounds)",
            "transport": "secagg (registry default: malicious server, signatures, 64-bit ring)",
            "load_average_before_after": load,
            "rows": rows,
        },
        args.out,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
