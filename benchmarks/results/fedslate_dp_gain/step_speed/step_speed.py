"""Seconds per learning step of three fedslate_dp_gain cells, main's tree beside this one.

``python step_speed.py [--rounds 2] [--steps 30] [--main /work/main]`` alternates, ``rounds``
times, a worker process of each tree (its own virtual environment's python, so its own code)
for each cell: the worker builds the cell's run at seed 0 (threads 1), plays rounds until the
replay holds ``min(burn_in, buffer_size)`` rows, takes one learning step to warm up and times
``steps`` more (plaintext: ``10 steps``), wall and process CPU. The record
(``step_speed.json``, :func:`securefed.records.dumps_record`) keeps the command, the load
average before and after each worker, every measurement and the medians, with the projected
CPU hours of a paper-schedule cell (``learning steps x CPU s a step``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CELLS = ("sums_eps8_split0.07", "split0.07_b128_h8", "plaintext")
PAPER_STEPS = {"sums_eps8_split0.07": 100_000, "split0.07_b128_h8": 25_000, "plaintext": 100_000}
"""Learning steps of a paper-schedule run: 5000 episodes x 61 rounds after a 5000-round
burn-in, one step every ``learn_every`` rounds (3; 12 for the b128 cell)."""


def worker(name: str, steps: int) -> dict[str, float]:
    import torch

    sys.path.insert(0, str(HERE))
    from profile_step import warm_run

    from securefed.rl.fedslate import learn

    torch.set_num_threads(1)
    run = warm_run(name)
    learn(run)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        learn(run)
    return {
        "steps": steps,
        "wall_s_per_step": (time.perf_counter() - wall) / steps,
        "cpu_s_per_step": (time.process_time() - cpu) / steps,
    }


def measure(python: Path, name: str, steps: int) -> dict[str, object]:
    before = os.getloadavg()
    out = subprocess.run(
        [str(python), str(Path(__file__).resolve()), "--worker", name, "--steps", str(steps)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1]) | {
        "load_before": list(before),
        "load_after": list(os.getloadavg()),
    }


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--main", default="/work/main", help="the tree to compare with")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.steps)))
        return
    from securefed.records import dumps_record

    trees = {"main": Path(args.main), "new": HERE.parents[3]}
    pythons = {tree: root / ".venv" / "bin" / "python" for tree, root in trees.items()}
    runs = []
    for r in range(args.rounds):
        for tree, python in pythons.items():
            for name in CELLS:
                steps = 10 * args.steps if name == "plaintext" else args.steps
                got = measure(python, name, steps) | {"round": r, "tree": tree, "cell": name}
                print(json.dumps(got), flush=True)
                runs.append(got)
    summary = {}
    for name in CELLS:
        row = {}
        for tree in trees:
            mine = [x for x in runs if x["cell"] == name and x["tree"] == tree]
            row[tree] = {
                key: median([x[key] for x in mine]) for key in ("wall_s_per_step", "cpu_s_per_step")
            }
            row[tree]["paper_cpu_hours_learning"] = (
                row[tree]["cpu_s_per_step"] * PAPER_STEPS[name] / 3600
            )
        row["speedup_cpu"] = row["main"]["cpu_s_per_step"] / row["new"]["cpu_s_per_step"]
        row["speedup_wall"] = row["main"]["wall_s_per_step"] / row["new"]["wall_s_per_step"]
        row["paper_learning_steps"] = PAPER_STEPS[name]
        summary[name] = row
    commits = {
        tree: subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        for tree, root in trees.items()
    }
    record = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "trees": {tree: str(root) for tree, root in trees.items()},
        "commits": commits,
        "note": "new: the working tree as measured (its commit plus uncommitted changes, if any)",
        "runs": runs,
        "summary": summary,
    }
    (HERE / "step_speed.json").write_text(dumps_record(record, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
