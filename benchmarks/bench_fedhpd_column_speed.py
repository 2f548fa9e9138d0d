"""FedHPD's column, the fast learner of a base revision beside this checkout's, in one run.

::

    python -m securefed.bench.bench_fedhpd_column_speed --base main --rounds 150 --seeds 20,25,30

Loads ``rl/fast.py`` of ``--base`` (``git show``) as a module beside :mod:`securefed.rl.fast`
and, old and new interleaved or side by side so that both see the same load:

* the projection: the cost of a full-length round (every episode at the 500-step cap, as
  trained agents play; play and REINFORCE) of each worker's population of the paper's column
  (each revision's ``balanced_chunks``), and of the distillation events of one 20-round cycle
  (d = 5 alone, d = 5 and 10, all three), each worker's 2000 rounds projected from them;
* a reduced column (settings x seeds x ``--rounds``, one public set ``S_p`` for both), every run
  as one population per revision, the two processes at the same time: CPU seconds, whether
  returns are equal and parameters bit-identical, and each setting's system average reward
  per seed, old beside new (where the last bits differ, runs part ways: equal in distribution
  is what holds);
* optionally (``--sequential``) the reduced column split over ``--workers`` processes, old then
  new.

The rest of the package (``securefed.rl.fedhpd``, the policies, the transports) is this
checkout's for both: the base must not differ there.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from securefed.bench.bench_fedhpd import (
    DEFAULT_SETTINGS,
    RESULTS,
    cpu_time,
    machine,
    parse_seeds,
    parse_settings,
)
from securefed.records import dumps_record

REPOSITORY = Path(__file__).resolve().parent.parent


def load_base_fast(base: str):
    """``rl/fast.py`` at git revision ``base``, imported as ``securefed.rl.fast_base``."""
    source = subprocess.run(
        ["git", "-C", str(REPOSITORY), "show", f"{base}:rl/fast.py"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    path = Path(tempfile.mkdtemp()) / "fast_base.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("securefed.rl.fast_base", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def train_column(module, runs, workers: int) -> dict:
    start, cpu = time.perf_counter(), cpu_time()
    results = module.train_parallel(runs, workers)
    return {
        "results": results,
        "seconds": time.perf_counter() - start,
        "cpu_seconds": cpu_time() - cpu,
        "worker_cpu_seconds": sorted({round(r.cpu_seconds, 2) for r in results}),
    }


def _train_in_child(module, runs, connection) -> None:
    start = time.process_time()
    results = module.train_population(runs)
    connection.send((time.process_time() - start, [(r.returns, r.params) for r in results]))
    connection.close()


def side_by_side(modules: dict, runs) -> dict:
    """Each module trains every run as one population, in its own forked process, the processes
    at the same time (one core each on this 2-core machine): both see the same load.
    ``{name: (CPU seconds, [(returns, params), ...])}``."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    pending = {}
    for name, module in modules.items():
        receive, send = context.Pipe(duplex=False)
        process = context.Process(target=_train_in_child, args=(module, runs, send))
        process.start()
        send.close()
        pending[name] = (receive, process)
    out = {}
    for name, (receive, process) in pending.items():
        out[name] = receive.recv()
        process.join()
    return out


class _TrainedLengths:
    """Wraps a population's CartPole batch so every episode runs to the cap: the cost of a round
    of trained agents (the column's agents reach the 500-step cap within its first few hundred
    rounds, and a population's rollout steps until its longest episode ends)."""

    def __init__(self, envs) -> None:
        self.envs = envs

    def reset(self, which, seeds):
        return self.envs.reset(which, seeds)

    def step(self, actions, active):
        obs, reward, _ = self.envs.step(actions, active)
        return obs, reward, self.envs.steps >= self.envs.cap

    def close(self) -> None:
        self.envs.close()


def paper_column(public: np.ndarray) -> list:
    from securefed.rl.fedhpd import SEEDS, FedHPDConfig, RunSpec

    configs = [FedHPDConfig(algorithm=a, d=d) for a, d in parse_settings(DEFAULT_SETTINGS)]
    return [
        RunSpec(c, s, None, public if c.algorithm == "fedhpd" else None)
        for c in configs
        for s in SEEDS
    ]


def projection(modules: dict, public: np.ndarray, repeats: int) -> dict:
    """Each revision's workers on the paper's column, projected to 2000 rounds from the CPU
    seconds of full-length rounds and of one 20-round cycle of distillation events (median of
    ``repeats``, old and new interleaved)."""
    runs = paper_column(public)
    populations, cycles = {}, {}
    for name, module in modules.items():
        for w, chunk in enumerate(module.balanced_chunks(runs, 2)):
            population = module.Population([runs[i] for i in chunk])
            population.envs = _TrainedLengths(population.envs)
            populations[(name, w)] = population
            configs = population.configs
            due = {
                r: [i for i, c in enumerate(configs) if c.algorithm == "fedhpd" and r % c.d == 0]
                for r in (5, 10, 20)
            }
            # Rounds 5 and 15 distil d = 5; 10: d = 5, 10; 20: all.
            cycles[(name, w)] = [(due[5], 2), (due[10], 1), (due[20], 1)]
    rounds = {key: [] for key in populations}
    events = {key: [] for key in populations}
    for population in populations.values():  # warm-up
        _, lengths = population.play(0)
        population.learn(lengths)
    for repeat in range(repeats):
        for key, population in populations.items():
            start = time.process_time()
            _, lengths = population.play(repeat + 1)
            population.learn(lengths)
            rounds[key].append(time.process_time() - start)
            assert int(lengths.min()) == population.cap
            start = time.process_time()
            for due, times in cycles[key]:
                if due:
                    for _ in range(times):
                        population.distill(due)
            events[key].append(time.process_time() - start)
    out = {}
    for name in modules:
        workers = []
        for w in range(2):
            if (name, w) not in populations:
                continue
            round_s = float(np.median(rounds[(name, w)]))
            cycle_s = float(np.median(events[(name, w)]))
            workers.append(
                {
                    "runs": len(populations[(name, w)].configs),
                    "full_length_round_cpu_s": round_s,
                    "distillation_cycle_20_rounds_cpu_s": cycle_s,
                    "projected_cpu_s": 2000 * round_s + 100 * cycle_s,
                    "round_samples": rounds[(name, w)],
                    "cycle_samples": events[(name, w)],
                }
            )
        out[name] = {
            "workers": workers,
            "projected_longest_worker_cpu_s": max(w["projected_cpu_s"] for w in workers),
        }
    return out


def reward_table(runs, together) -> dict:
    """Each setting's system average reward per seed, old beside new (reduced schedule)."""
    from securefed.rl.fedhpd import system_average_reward

    table: dict[str, dict] = {}
    for i, run in enumerate(runs):
        row = table.setdefault(run.config.label(), {"seeds": [], "old": [], "new": []})
        window = min(50, run.config.rounds)
        row["seeds"].append(run.seed)
        for name in ("old", "new"):
            row[name].append(system_average_reward(together[name][1][i][0][None], window))
    for row in table.values():
        diffs = np.subtract(row["new"], row["old"])
        row["mean_old"], row["mean_new"] = float(np.mean(row["old"])), float(np.mean(row["new"]))
        row["paired_difference_mean"] = float(diffs.mean())
        row["paired_difference_std"] = float(diffs.std(ddof=1)) if len(diffs) > 1 else 0.0
    return table


def print_projection(projected: dict, speedup: float) -> None:
    print("full column projected from full-length rounds and a 20-round event cycle (CPU s):")
    for name, part in projected.items():
        print(
            f"  {name}: workers "
            + ", ".join(
                f"{w['runs']} runs: round {w['full_length_round_cpu_s']:.3f} s, cycle "
                f"{w['distillation_cycle_20_rounds_cpu_s']:.2f} s -> {w['projected_cpu_s']:.0f} s"
                for w in part["workers"]
            )
        )
    print(f"  projected speed-up of the longer worker: {speedup:.2f}x")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m securefed.bench.bench_fedhpd_column_speed")
    parser.add_argument("--base", default="main", help="git revision of the old rl/fast.py")
    parser.add_argument(
        "--settings",
        default="worker0",
        help="settings of the reduced column, or worker0: the runs of the paper column's first "
        "worker (this checkout's balanced_chunks), its projection then checked against them",
    )
    parser.add_argument(
        "--seeds", default="20,25,30", help="seeds of the reduced column (not with worker0)"
    )
    parser.add_argument(
        "--rounds", type=int, default=150, help="rounds of the reduced column (0: none)"
    )
    parser.add_argument(
        "--workers", type=int, default=2, help="workers of the --sequential columns"
    )
    parser.add_argument(
        "--sequential",
        action="store_true",
        help="also train the reduced column over --workers processes, old then new",
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="full-length rounds and event cycles timed"
    )
    parser.add_argument(
        "--no-projection",
        action="store_true",
        help="skip the projection (only the reduced column; not with --settings worker0)",
    )
    parser.add_argument("--out", default=str(RESULTS), help="directory of the JSON record")
    args = parser.parse_args(argv)

    import torch

    from securefed.rl import fast
    from securefed.rl.fedhpd import FedHPDConfig, RunSpec

    torch.set_num_threads(1)
    base = load_base_fast(args.base)
    modules = {"old": base, "new": fast}
    load_start = list(os.getloadavg())
    public = fast.make_public_states(FedHPDConfig(algorithm="fedhpd"))
    if args.no_projection and args.settings == "worker0":
        parser.error("--no-projection: the worker0 column is checked against the projection")
    projected = None if args.no_projection else projection(modules, public, args.repeats)
    record = {
        "command": "python -m securefed.bench.bench_fedhpd_column_speed " + " ".join(sys.argv[1:]),
        "base": args.base,
        "torch_threads": torch.get_num_threads(),
        "load_average_start": load_start,
        "projection": projected,
    }
    if projected is not None:
        record["projected_speedup_cpu"] = (
            projected["old"]["projected_longest_worker_cpu_s"]
            / projected["new"]["projected_longest_worker_cpu_s"]
        )
        print_projection(projected, record["projected_speedup_cpu"])
    if args.rounds:
        if args.settings == "worker0":
            column = paper_column(public)
            chunk = [column[i] for i in fast.balanced_chunks(column, 2)[0]]
            runs = [
                RunSpec(
                    FedHPDConfig(algorithm=r.config.algorithm, d=r.config.d, rounds=args.rounds),
                    r.seed,
                    None,
                    r.public_states,
                )
                for r in chunk
            ]
        else:
            configs = [
                FedHPDConfig(algorithm=a, d=d, rounds=args.rounds)
                for a, d in parse_settings(args.settings)
            ]
            runs = [
                RunSpec(c, s, None, public if c.algorithm == "fedhpd" else None)
                for c in configs
                for s in parse_seeds(args.seeds)
            ]
        seeds = sorted({r.seed for r in runs})
        together = side_by_side(modules, runs)
        same_returns = [
            bool(np.array_equal(a[0], b[0]))
            for a, b in zip(together["old"][1], together["new"][1], strict=True)
        ]
        same_bits = [
            all(np.array_equal(x, y) for x, y in zip(a[1], b[1], strict=True))
            for a, b in zip(together["old"][1], together["new"][1], strict=True)
        ]
        first_difference = [
            int(np.flatnonzero((a[0] != b[0]).any(1))[0]) if not same else None
            for a, b, same in zip(together["old"][1], together["new"][1], same_returns, strict=True)
        ]
        record["reduced_column"] = {
            "what": "every run as one population per revision, both processes at once",
            "settings": args.settings,
            "seeds": seeds,
            "runs": [[r.config.label(), r.seed] for r in runs],
            "rounds": args.rounds,
            "old_cpu_seconds": together["old"][0],
            "new_cpu_seconds": together["new"][0],
            "speedup_cpu": together["old"][0] / together["new"][0],
            "runs_with_equal_returns": f"{sum(same_returns)}/{len(runs)}",
            "runs_bit_identical": f"{sum(same_bits)}/{len(runs)}",
            "first_round_with_a_different_return": first_difference,
            "system_average_reward": reward_table(runs, together),
        }
        part = record["reduced_column"]
        if args.settings == "worker0":
            # The projection's model for these runs over --rounds rounds: an upper bound (early
            # episodes end before the cap), to check it against the measured CPU.
            for name in modules:
                w = projected[name]["workers"][0]
                predicted = (
                    args.rounds * w["full_length_round_cpu_s"]
                    + args.rounds / 20 * w["distillation_cycle_20_rounds_cpu_s"]
                )
                part[f"{name}_model_cpu_seconds"] = predicted
        if args.settings == "worker0":
            print(
                f"model for these runs and rounds (upper bound): old "
                f"{part['old_model_cpu_seconds']:.1f} s, new {part['new_model_cpu_seconds']:.1f} s"
            )
        print(
            f"reduced column {args.settings} x seeds {args.seeds} x {args.rounds} rounds, side by "
            f"side: old {part['old_cpu_seconds']:.1f} s, new {part['new_cpu_seconds']:.1f} s of "
            f"CPU ({part['speedup_cpu']:.2f}x); equal returns {part['runs_with_equal_returns']}, "
            f"bit-identical {part['runs_bit_identical']}"
        )
        for label, row in part["system_average_reward"].items():
            print(
                f"  {label}: system average reward old {row['mean_old']:.1f}, new "
                f"{row['mean_new']:.1f} (paired difference {row['paired_difference_mean']:+.1f}"
                f" +- {row['paired_difference_std']:.1f} over {len(row['seeds'])} seeds)"
            )
        if args.sequential:
            old = train_column(base, runs, args.workers)
            new = train_column(fast, runs, args.workers)
            record["sequential"] = {
                name: {k: v for k, v in part.items() if k != "results"}
                for name, part in (("old", old), ("new", new))
            }
    record["machine"] = machine()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    suffix = "_reduced_only" if projected is None else ""
    path = out / f"fedhpd_column_speed_{args.rounds}rounds{suffix}.json"
    path.write_text(dumps_record(record, indent=1))
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
