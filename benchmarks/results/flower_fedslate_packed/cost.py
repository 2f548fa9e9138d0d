"""FedSlate ``fusion="ckks"`` on Flower's message flow against the in-process run, the packed
circuit (server (16,)) beside the monomial one (server (16, 16)), same schedule, same process.

``drive_in_process`` (every node rebuilt from Flower records per message, every ciphertext
serialized) against ``run_fedslate`` (after a one-episode warm-up), CPU seconds by
``time.process_time`` (the server and the nodes: one process). A learning step's cost is the
run's minus the same run without learning (``burn_in`` past the schedule), divided by its
learning steps, each measured in this run. Usage::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/results/flower_fedslate_packed/cost.py OUT.json
"""

import dataclasses
import os
import sys
import tempfile
import time

import numpy as np
import torch

from securefed.records import dumps_record
from securefed.rl.fedslate import FedSlateConfig, ckks_config, run_fedslate
from securefed.rl.flower_fedslate import FedSlateFlowerRun, drive_in_process, node_results

torch.set_num_threads(1)
STEPS = 6


def config_for(server_hidden, learning=True):
    return FedSlateConfig(
        steps_per_platform=STEPS, episodes=2, members=2, learn_every=3,
        burn_in=STEPS if learning else 10 * STEPS, target_sync=2 * STEPS,
        buffer_size=4 * STEPS, batch_size=16, local_hidden=(32,), server_hidden=server_hidden,
        activation="polynomial", seed=0, fusion="ckks",
    )  # fmt: skip


def in_process(config):
    cpu = time.process_time()
    reference = run_fedslate(config)
    return reference, time.process_time() - cpu


def message_flow(config):
    sizes = {"down": 0, "up": 0}

    def tap(op, role, sent, reply):
        sizes["down"] += sum(np.asarray(v).nbytes for v in sent.values())
        sizes["up"] += sum(np.asarray(v).nbytes for v in reply.values())

    with tempfile.TemporaryDirectory() as out:
        cpu = time.process_time()
        outcome = drive_in_process(FedSlateFlowerRun(config, output_dir=out), tap=tap)
        seconds = time.process_time() - cpu
        results = node_results(out, config)
    return outcome, results, seconds, sizes


def row(server_hidden):
    config = config_for(server_hidden)
    acting = config_for(server_hidden, learning=False)
    run_fedslate(dataclasses.replace(config, episodes=1))  # warm-up
    reference, local_cpu = in_process(config)
    _, local_acting = in_process(acting)
    outcome, results, flower_cpu, sizes = message_flow(config)
    _, _, flower_acting, _ = message_flow(acting)
    server = outcome.channel.module.state_dict()
    diff = max(
        float((server[n] - p).abs().max())
        for n, p in reference.networks["server"].state_dict().items()
    )
    local = max(
        float(np.abs(results[x][f"local.{n}"] - p.numpy()).max())
        for x in ("A", "B")
        for n, p in reference.networks[f"local_{x}"].state_dict().items()
    )
    steps = outcome.learn_steps
    step_local = (local_cpu - local_acting) / steps
    step_flower = (flower_cpu - flower_acting) / steps
    return {
        "server_hidden": list(server_hidden),
        "circuit": ckks_config(config).circuit,
        "rounds": outcome.rounds,
        "learn_steps": steps,
        "in_process_cpu_s": local_cpu,
        "message_flow_cpu_s": flower_cpu,
        "ratio": flower_cpu / local_cpu,
        "in_process_acting_only_cpu_s": local_acting,
        "message_flow_acting_only_cpu_s": flower_acting,
        "learning_step_in_process_cpu_s": step_local,
        "learning_step_message_flow_cpu_s": step_flower,
        "learning_step_ratio": step_flower / step_local,
        "same_rewards": bool(
            np.array_equal(results["simulator"]["rewards"], reference.episode_rewards)
        ),
        "max_abs_server_param_diff": diff,
        "max_abs_local_param_diff": local,
        "message_MB_down": sizes["down"] / 2**20,
        "message_MB_up": sizes["up"] / 2**20,
        "message_rounds": int(sum(outcome.messages.values())),
    }


if __name__ == "__main__":
    load = [os.getloadavg()]
    rows = [row((16,)), row((16, 16))]
    load.append(os.getloadavg())
    record = {
        "command": "OMP_NUM_THREADS=1 .venv/bin/python " + " ".join(sys.argv),
        "schedule": {
            "episodes": 2,
            "steps": STEPS,
            "members": 2,
            "batch": 16,
            "candidates": config_for((16,)).num_candidates,
            "slate": config_for((16,)).slate_size,
            "local_hidden": [32],
        },
        "load_average_start_end": load,
        "rows": rows,
    }
    print(dumps_record(record, indent=1))
    with open(sys.argv[1], "w") as f:
        f.write(dumps_record(record, indent=1) + "\n")
