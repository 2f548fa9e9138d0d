"""FedHPD's column, the fast learner of a base revision beside this checkout's, in one run.

::

    python -m securefed.bench.bench_fedhpd_column_speed --base main --rounds 300 --seeds 20,25

Loads ``rl/fast.py`` of ``--base`` (``git show``) as a module beside :mod:`securefed.rl.fast`,
trains the same reduced column (settings x seeds x rounds, one public set ``S_p`` for both) with
each, split over ``--workers`` processes by each revision's own ``balanced_chunks``, and reports
wall and CPU seconds, every worker's CPU, whether every run's returns are equal and its final
parameters bit-identical, and the predicted cost of each revision's split of the full column
(:func:`securefed.rl.fast.run_cost`). The rest of the package (``securefed.rl.fedhpd``, the
policies, the transports) is this checkout's for both: the base must not differ there.
"""

from __future__ import annotations

import argparse
import importlib.util
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


def full_column_split(module, chunks_of) -> list[float]:
    """Predicted cost (:func:`run_cost`, in rounds) of each chunk of the paper's CartPole column
    (NoFed, d = 5, 10, 20; five seeds; 2000 rounds) as ``chunks_of`` splits it over 2 workers."""
    from securefed.rl.fast import run_cost
    from securefed.rl.fedhpd import SEEDS, FedHPDConfig, RunSpec

    configs = [FedHPDConfig(algorithm=a, d=d) for a, d in parse_settings(DEFAULT_SETTINGS)]
    runs = [RunSpec(c, s) for c in configs for s in SEEDS]
    return [sum(run_cost(runs[i].config) for i in chunk) for chunk in chunks_of(runs, 2)]


def train_column(module, runs, workers: int) -> dict:
    start, cpu = time.perf_counter(), cpu_time()
    results = module.train_parallel(runs, workers)
    return {
        "results": results,
        "seconds": time.perf_counter() - start,
        "cpu_seconds": cpu_time() - cpu,
        "worker_cpu_seconds": sorted({round(r.cpu_seconds, 2) for r in results}),
    }


def distillation_seconds(modules: dict, public: np.ndarray, copies: int, repeats: int) -> dict:
    """CPU seconds of one distillation event of ``copies`` CartPole d=5 runs (the paper's ten
    agents, 5 loops x 2 parts of 2500 states), each module's ``Population`` in turn, repeated
    ``repeats`` times interleaved: ``{name: [seconds, ...]}``."""
    from securefed.rl.fedhpd import FedHPDConfig, RunSpec

    config = FedHPDConfig(algorithm="fedhpd", d=5, rounds=10)
    runs = [RunSpec(config, 20 + i, None, public) for i in range(copies)]
    populations = {name: module.Population(runs) for name, module in modules.items()}
    times: dict[str, list[float]] = {name: [] for name in modules}
    for population in populations.values():  # warm-up
        population.distill(list(range(copies)))
    for _ in range(repeats):
        for name, population in populations.items():
            start = time.process_time()
            population.distill(list(range(copies)))
            times[name].append(time.process_time() - start)
    return times


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m securefed.bench.bench_fedhpd_column_speed")
    parser.add_argument("--base", default="main", help="git revision of the old rl/fast.py")
    parser.add_argument("--settings", default=DEFAULT_SETTINGS)
    parser.add_argument("--seeds", default="20,25")
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--event-copies", default="1,3,8", help="runs per timed distillation event")
    parser.add_argument("--event-repeats", type=int, default=5)
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args(argv)

    import torch

    from securefed.rl import fast
    from securefed.rl.fedhpd import FedHPDConfig, RunSpec

    torch.set_num_threads(1)
    base = load_base_fast(args.base)
    configs = [
        FedHPDConfig(algorithm=a, d=d, rounds=args.rounds) for a, d in parse_settings(args.settings)
    ]
    public = fast.make_public_states(next(c for c in configs if c.algorithm == "fedhpd"))
    runs = [
        RunSpec(c, s, None, public if c.algorithm == "fedhpd" else None)
        for c in configs
        for s in parse_seeds(args.seeds)
    ]
    old = train_column(base, runs, args.workers)
    new = train_column(fast, runs, args.workers)
    same_returns = [
        bool(np.array_equal(a.returns, b.returns))
        for a, b in zip(old["results"], new["results"], strict=True)
    ]
    same_params = [
        all(np.array_equal(x, y) for x, y in zip(a.params, b.params, strict=True))
        for a, b in zip(old["results"], new["results"], strict=True)
    ]
    events = {}
    for copies in (int(c) for c in args.event_copies.split(",") if c.strip()):
        times = distillation_seconds({"old": base, "new": fast}, public, copies, args.event_repeats)
        events[copies] = {
            name: {"median": float(np.median(t)), "min": min(t), "all": t}
            for name, t in times.items()
        }
        events[copies]["speedup_median"] = (
            events[copies]["old"]["median"] / events[copies]["new"]["median"]
        )
    together = side_by_side({"old": base, "new": fast}, runs)
    same_side_by_side = [
        bool(np.array_equal(a[0], b[0]))
        and all(np.array_equal(x, y) for x, y in zip(a[1], b[1], strict=True))
        for a, b in zip(together["old"][1], together["new"][1], strict=True)
    ]
    old_split = full_column_split(base, base.balanced_chunks)
    new_split = full_column_split(fast, fast.balanced_chunks)
    record = {
        "command": "python -m securefed.bench.bench_fedhpd_column_speed " + " ".join(sys.argv[1:]),
        "base": args.base,
        "settings": args.settings,
        "seeds": parse_seeds(args.seeds),
        "rounds": args.rounds,
        "workers": args.workers,
        "torch_threads": torch.get_num_threads(),
        "old": {k: v for k, v in old.items() if k != "results"},
        "new": {k: v for k, v in new.items() if k != "results"},
        "speedup_wall": old["seconds"] / new["seconds"],
        "speedup_cpu": old["cpu_seconds"] / new["cpu_seconds"],
        "runs_with_equal_returns": f"{sum(same_returns)}/{len(runs)}",
        "runs_with_bit_identical_params": f"{sum(same_params)}/{len(runs)}",
        "distillation_event_cpu_seconds": events,
        "side_by_side": {
            "what": "every run as one population per revision, both processes at once",
            "old_cpu_seconds": together["old"][0],
            "new_cpu_seconds": together["new"][0],
            "speedup_cpu": together["old"][0] / together["new"][0],
            "runs_bit_identical": f"{sum(same_side_by_side)}/{len(runs)}",
        },
        "full_column_predicted_chunk_costs": {"old": old_split, "new": new_split},
        "machine": machine(),
    }
    print(
        f"column {args.settings} x seeds {args.seeds} x {args.rounds} rounds, "
        f"{args.workers} workers, torch threads 1"
    )
    for name in ("old", "new"):
        part = record[name]
        print(
            f"{name} ({args.base if name == 'old' else 'this checkout'}): "
            f"wall {part['seconds']:.1f} s, CPU {part['cpu_seconds']:.1f} s, "
            f"workers {part['worker_cpu_seconds']} s"
        )
    print(f"speed-up: wall {record['speedup_wall']:.2f}x, CPU {record['speedup_cpu']:.2f}x")
    print(
        f"equal returns {record['runs_with_equal_returns']}, bit-identical parameters "
        f"{record['runs_with_bit_identical_params']}"
    )
    for copies, event in events.items():
        print(
            f"one distillation event, {copies} run(s) x 10 agents: old "
            f"{event['old']['median']:.3f} s, new {event['new']['median']:.3f} s (median of "
            f"{args.event_repeats}, CPU), {event['speedup_median']:.2f}x"
        )
    both = record["side_by_side"]
    print(
        f"side by side (one population each, both at once): old {both['old_cpu_seconds']:.1f} s, "
        f"new {both['new_cpu_seconds']:.1f} s of CPU, {both['speedup_cpu']:.2f}x; "
        f"bit-identical runs {both['runs_bit_identical']}"
    )
    print(f"full column, predicted chunk costs (rounds): old {old_split}, new {new_split}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"fedhpd_column_speed_{args.rounds}rounds.json"
    path.write_text(dumps_record(record, indent=1))
    print(f"written to {path}")
    return 0 if all(same_returns) else 1


if __name__ == "__main__":
    sys.exit(main())
