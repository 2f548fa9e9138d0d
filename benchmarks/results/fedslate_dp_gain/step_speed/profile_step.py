"""Profile one learning step of a fedslate_dp_gain cell (threads 1).

``python profile_step.py CELL [--steps N] [--torch]``: builds the cell's run (seed 0), plays
rounds until the replay holds ``burn_in`` rows, then profiles ``N`` learning steps with
cProfile on the process's CPU time (the box is shared: wall time is inflated by the load) and,
with ``--torch``, the torch profiler. Outputs kept here: ``profile_main.txt`` (main's tree's
venv python running this script), ``profile_new.txt`` (this branch), both ``--steps 20``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def warm_run(name: str, seed: int = 0):
    """A run of cell ``name`` with a replay holding ``min(burn_in, buffer_size)`` rows."""
    import cells

    from securefed.rl.fedslate import acting_inquiry, choose_slates, play_round, start_run
    from securefed.rl.slateq import features

    config = cells.cell(name, seed).config
    run = start_run(config)
    rounds, episode = 0, 0
    target = min(config.burn_in, config.buffer_size)
    while rounds < target:
        run.env.reset()
        x = [features(run.env.observation(p), config) for p in range(config.num_platforms)]
        done = False
        while not done:
            run.channel.open_round(run.rounds)
            qf = acting_inquiry(run, x)
            slates = choose_slates(run, x, qf, 1.0)
            done = play_round(run, episode, x, slates)
            run.replay_unit[run.replay.head] = episode
            run.replay.commit(done)
            run.rounds += 1
            rounds += 1
        episode += 1
    return run


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("cell")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--torch", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    from securefed.rl.fedslate import learn

    run = warm_run(args.cell)
    learn(run)  # warm-up
    started = time.perf_counter()
    profile = cProfile.Profile(time.process_time)  # CPU time: the box is shared
    profile.enable()
    for _ in range(args.steps):
        learn(run)
    profile.disable()
    wall = time.perf_counter() - started
    print(f"{args.cell}: {wall / args.steps:.4f} wall s per step (under cProfile, loaded box)")
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("cumulative").print_stats(45)
    print(out.getvalue())
    if args.torch:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as tprofile

        with tprofile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(max(1, args.steps // 4)):
                learn(run)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))
    print("units per step:", np.unique(run.replay_unit).size)


if __name__ == "__main__":
    main(sys.argv[1:])
