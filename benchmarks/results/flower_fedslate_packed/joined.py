"""The packed learning step on Flower's message flow with the joined and repeated forwards
(issue 33) against the flow without them (main's tree), old beside new in one run.

The packed row of ``cost.py`` (server (16,), the same schedule), measured by this script's
:func:`row` in a subprocess of each tree in turn (old, new, old, new, ...): ``--tree`` names
each tree's root (its ``.venv`` runs it). Each subprocess measures its in-process run and its
message flow in one process (CPU seconds by ``time.process_time``, torch on 1 thread); a
learning step is the run's CPU minus the same run's without learning, divided by its learning
steps; the learning step's message rounds are the server's own count. Usage::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/results/flower_fedslate_packed/joined.py \\
        OUT.json --old /work/main --new . --repeats 2
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

LEARNING = ("target_values", "targets", "learn_rows", "greedy", "loss", "local_step")
HERE = Path(__file__).resolve().parent


def row() -> dict:
    """The packed row of ``cost.py`` in this process's tree, with the message rounds a
    learning step and the channel's repeat and join counts."""
    import dataclasses

    import numpy as np
    import torch

    sys.path.insert(0, str(HERE))
    import cost  # the same schedule and helpers as the record this one extends

    from securefed.rl.fedslate import run_fedslate

    torch.set_num_threads(1)
    config, acting = cost.config_for((16,)), cost.config_for((16,), learning=False)
    run_fedslate(dataclasses.replace(config, episodes=1))  # warm-up
    reference, local_cpu = cost.in_process(config)
    _, local_acting = cost.in_process(acting)
    outcome, results, flower_cpu, sizes = cost.message_flow(config)
    _, _, flower_acting, _ = cost.message_flow(acting)
    server = outcome.channel.module.state_dict()
    steps = outcome.learn_steps
    rounds = sum(outcome.messages.get(op, 0) for op in LEARNING)
    return {
        "learn_steps": steps,
        "in_process_cpu_s": local_cpu,
        "message_flow_cpu_s": flower_cpu,
        "in_process_acting_only_cpu_s": local_acting,
        "message_flow_acting_only_cpu_s": flower_acting,
        "learning_step_in_process_cpu_s": (local_cpu - local_acting) / steps,
        "learning_step_message_flow_cpu_s": (flower_cpu - flower_acting) / steps,
        "learning_step_ratio": (flower_cpu - flower_acting) / (local_cpu - local_acting),
        "message_rounds_a_learning_step": rounds / steps,
        "message_rounds": int(sum(outcome.messages.values())),
        "message_MB_down": sizes["down"] / 2**20,
        "message_MB_up": sizes["up"] / 2**20,
        "repeats": int(outcome.channel.counts.get("repeat", 0)),
        "joins": int(outcome.channel.counts.get("joined", 0)),
        "same_rewards": bool(
            np.array_equal(results["simulator"]["rewards"], reference.episode_rewards)
        ),
        "max_abs_server_param_diff": max(
            float((server[n] - p).abs().max())
            for n, p in reference.networks["server"].state_dict().items()
        ),
    }


def _in(tree: Path) -> dict:
    env = os.environ | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                        "OPENBLAS_NUM_THREADS": "1"}  # fmt: skip
    out = subprocess.run(
        [str(tree / ".venv" / "bin" / "python"), __file__, "--row"],
        cwd=tree, env=env, check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    return json.loads(out.strip().splitlines()[-1])


def _commit(tree: Path) -> str:
    return subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                          check=True, capture_output=True, text=True).stdout.strip()  # fmt: skip


def _uptime() -> str:
    return subprocess.run(["uptime"], check=True, capture_output=True, text=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", nargs="?")
    parser.add_argument("--old", default="/work/main")
    parser.add_argument("--new", default=".")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--row", action="store_true")
    args = parser.parse_args()
    if args.row:
        print(json.dumps(row()))
        return
    from securefed.records import dumps_record

    trees = {"old": Path(args.old).resolve(), "new": Path(args.new).resolve()}
    uptime, rows = [_uptime()], []
    for rep in range(args.repeats):
        for name, tree in trees.items():
            tick = time.perf_counter()
            rows.append({"tree": name, "repeat": rep} | _in(tree)
                        | {"wall_s": time.perf_counter() - tick})  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
    uptime.append(_uptime())

    def mean(name, key):
        values = [r[key] for r in rows if r["tree"] == name]
        return sum(values) / len(values)

    keys = ("learning_step_in_process_cpu_s", "learning_step_message_flow_cpu_s",
            "learning_step_ratio", "message_rounds_a_learning_step")  # fmt: skip
    record = {
        "command": "OMP_NUM_THREADS=1 .venv/bin/python " + " ".join(sys.argv),
        "trees": {n: {"path": str(t), "commit": _commit(t)} for n, t in trees.items()},
        "schedule": "cost.py's packed row: (10, 3), 2 platforms, 2 members, 2 episodes of 6 "
        "rounds, learning every 3 (2 learning steps), batch 16, local (32,), server (16,)",
        "uptime_start_end": uptime,
        "rows": rows,
        "means": {name: {k: mean(name, k) for k in keys} for name in trees},
    }
    text = dumps_record(record, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
