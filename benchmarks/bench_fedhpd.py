"""FedHPD benchmarks: the paper's Table 2 column of a task, and fast-versus-reference speed.

::

    securefed bench fedhpd --task cartpole                 # NoFed, d = 5, 10, 20; five seeds
    securefed bench fedhpd --task cartpole --seeds 20,25 --settings nofed,5
    securefed bench fedhpd-speed --task cartpole --rounds 30 --d 5

``fedhpd`` trains every (setting, seed) run of the column with the fast learner
(:mod:`securefed.rl.fast`),
the runs split over ``--workers`` processes (each one population of stacked agents, torch on one
thread), and prints the system average reward of each setting beside the paper's (spec section 4),
the deviation, and FedHPD d=5's gain over NoFed. It writes ``fedhpd_<task>.json`` (summary),
``fedhpd_<task>_returns.npz`` (per-round returns of every agent, seed and setting) and two plots
(``fedhpd_<task>_system.png``, ``fedhpd_<task>_agents.png``) to ``--out``.

``fedhpd-speed`` runs the faithful step-by-step reference learner and the fast one on the same
short schedule and seed, and prints their times, the speed ratio, and whether they agree (equal
episode returns; the largest parameter difference).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

from securefed.bench.bench_args import add_out_argument, add_seed_argument
from securefed.bench.registry import BENCHES
from securefed.errors import TransportUnavailable
from securefed.records import dumps_record
from securefed.transport import build_transport, option_groups, parse_transport_spec

RESULTS = Path("results") / "fedhpd"
DEFAULT_SETTINGS = "nofed,5,10,20"


def parse_settings(text: str) -> list[tuple[str, int]]:
    """``"nofed,5,10,20,dpa"`` -> ``[("nofed", 1), ("fedhpd", 5), ..., ("dpa", 1)]``."""
    out = []
    for item in (t.strip().lower() for t in text.split(",") if t.strip()):
        if item == "nofed":
            out.append(("nofed", 1))
        elif item.startswith("dpa"):
            out.append(("dpa", int(item[3:] or 1)))
        elif item.lstrip("d").isdigit():
            out.append(("fedhpd", int(item.lstrip("d"))))
        else:
            raise ValueError(f"unknown setting {item!r}: use nofed, dpa or a distillation interval")
    if not out:
        raise ValueError("no settings given")
    return out


def parse_seeds(text: str) -> list[int]:
    seeds = [int(s) for s in text.split(",") if s.strip()]
    if not seeds:
        raise ValueError("no seeds given")
    return seeds


def paper_key(algorithm: str, d: int) -> str:
    return {"nofed": "nofed", "dpa": "dpa"}.get(algorithm, f"d{d}")


def transport_factory(name: str, config, extra_options: dict | None = None):
    """A function making a fresh transport per run (DP clip defaults to sqrt(part rows)).

    ``name`` is a registry name or spec string (:mod:`securefed.transport.registry`).
    """
    dp = "dp" in option_groups(parse_transport_spec(name).name)
    # The DP options, ``epsilon``, ``noise_multiplier`` and ``clip``, are the DP group's.
    options = {f"dp.{k}": v for k, v in (extra_options or {}).items() if v is not None}
    if dp and options.get("dp.clip") is None:
        # A part of n probability rows has L2 norm at most sqrt(n): clipping is then a no-op.
        options["dp.clip"] = float(np.sqrt(config.part_size if config.algorithm == "fedhpd" else 1))
    run = {"total_rounds": max(1, config.aggregation_rounds()), "n_clients": config.n_agents}
    build_transport(name, options, **run)  # fail early, in the parent, with a clear message

    def make():
        return build_transport(name, options, **run)

    return make


def run_column(args: argparse.Namespace) -> dict:
    """Train the column and return the summary record (also written to ``args.out``)."""
    import torch

    from securefed.rl.fast import make_public_states, train_parallel
    from securefed.rl.fedhpd import (
        FedHPDConfig,
        RunSpec,
        plot_agents,
        plot_system,
        system_average_reward,
        task_spec,
    )

    torch.set_num_threads(1)
    spec = task_spec(args.task)
    settings = parse_settings(args.settings)
    seeds = parse_seeds(args.seeds)
    common = {
        "task": spec.name,
        "rounds": args.rounds,
        "kl_direction": args.kl_direction,
        "public_size": args.public_size,
        "virtual_rounds": args.virtual_rounds,
    }
    configs = [FedHPDConfig(algorithm=a, d=d, **common) for a, d in settings]
    started, cpu_started = time.perf_counter(), cpu_time()
    public = None
    if any(c.algorithm == "fedhpd" for c in configs):
        public = make_public_states(next(c for c in configs if c.algorithm == "fedhpd"))
    public_seconds = time.perf_counter() - started
    runs = []
    for config in configs:
        make = transport_factory(args.transport, config, transport_extra(args))
        for seed in seeds:
            runs.append(RunSpec(config, seed, make(), public))
    results = train_parallel(runs, args.workers, log_every=args.log_every, progress_dir=args.out)
    cpu_seconds = cpu_time() - cpu_started
    seconds = time.perf_counter() - started
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    curves, rows, arrays = {}, [], {}
    window = min(50, configs[0].rounds)
    for config in configs:
        mine = [r for r in results if r.config == config]
        returns = np.stack([r.returns for r in mine])
        label = config.label()
        curves[label] = returns
        arrays[paper_key(config.algorithm, config.d)] = returns
        measured = system_average_reward(returns, window)
        paper = spec.paper.get(paper_key(config.algorithm, config.d))
        rows.append(
            {
                "setting": label,
                "algorithm": config.algorithm,
                "d": config.d,
                "measured": measured,
                "paper": paper,
                "deviation": None if paper is None else (measured - paper) / paper,
                "plain_mean": float(returns.mean()),
                "per_seed": [system_average_reward(r.returns[None], window) for r in mine],
                "bytes_up_per_run": float(np.mean([r.bytes_up for r in mine])),
            }
        )
    by_key = {paper_key(r["algorithm"], r["d"]): r["measured"] for r in rows}
    gain = by_key["d5"] / by_key["nofed"] - 1 if {"d5", "nofed"} <= set(by_key) else None
    record = {
        "task": spec.name,
        "rounds": configs[0].rounds,
        "window": window,
        "seeds": seeds,
        "agents": configs[0].n_agents,
        "transport": args.transport,
        "kl_direction": configs[0].direction,
        "learner": "fast",
        "workers": args.workers,
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "worker_cpu_seconds": sorted({round(r.cpu_seconds, 1) for r in results}),
        "public_set_seconds": public_seconds,
        "public_set_size": None if public is None else len(public),
        "machine": machine(),
        "rows": rows,
        "fedhpd_d5_gain_over_nofed": gain,
    }
    (out / f"fedhpd_{spec.name}.json").write_text(dumps_record(record, indent=1))
    np.savez_compressed(out / f"fedhpd_{spec.name}_returns.npz", **arrays)
    title = f"{spec.env_id}: {len(seeds)} seeds x {configs[0].n_agents} agents"
    plot_system(curves, out / f"fedhpd_{spec.name}_system.png", window=window, title=title)
    plot_agents(
        curves,
        out / f"fedhpd_{spec.name}_agents.png",
        agent_labels=[a.describe() for a in configs[0].agent_specs],
        window=window,
        title=title,
    )
    return record


def transport_extra(args: argparse.Namespace) -> dict:
    return {
        "epsilon": getattr(args, "epsilon", None),
        "noise_multiplier": getattr(args, "noise_multiplier", None),
        "clip": getattr(args, "clip", None),
    }


def cpu_time() -> float:
    """CPU seconds of this process and its finished children (the workers)."""
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def machine() -> dict:
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_average": list(os.getloadavg()),
    }


def print_column(record: dict) -> None:
    print(
        f"FedHPD {record['task']}: {record['rounds']} rounds x {record['agents']} agents, "
        f"seeds {record['seeds']}, transport {record['transport']}, "
        f"KL {record['kl_direction']}"
    )
    print(f"{'setting':<22}{'measured':>10}{'paper':>10}{'deviation':>11}  within 15%")
    for row in record["rows"]:
        paper = "-" if row["paper"] is None else f"{row['paper']:.2f}"
        dev = "-" if row["deviation"] is None else f"{100 * row['deviation']:+.1f}%"
        ok = "-" if row["deviation"] is None else ("yes" if abs(row["deviation"]) <= 0.15 else "no")
        print(f"{row['setting']:<22}{row['measured']:>10.2f}{paper:>10}{dev:>11}  {ok}")
    if record["fedhpd_d5_gain_over_nofed"] is not None:
        gain = record["fedhpd_d5_gain_over_nofed"]
        verdict = "meets" if gain >= 0.25 else "misses"
        print(f"FedHPD d=5 over NoFed: {100 * gain:+.1f}% ({verdict} the 25% goal)")
    print(
        f"wall time {record['seconds']:.0f} s (public set {record['public_set_seconds']:.0f} s), "
        f"CPU time {record['cpu_seconds']:.0f} s (workers {record['worker_cpu_seconds']} s), "
        f"{record['workers']} worker(s), load average {record['machine']['load_average']}"
    )


def column(args: argparse.Namespace) -> int:
    try:
        record = run_column(args)
    except TransportUnavailable as error:
        print(f"securefed: {error}", file=sys.stderr)
        return 2
    print_column(record)
    print(f"written to {args.out}")
    return 0


def speed(args: argparse.Namespace) -> int:
    """Reference and fast learner on the same schedule: time, ratio, agreement."""
    import torch

    from securefed.rl.fast import make_public_states, train_population
    from securefed.rl.fedhpd import FedHPDConfig, ReferenceRun, RunSpec

    torch.set_num_threads(1)
    algorithm, d = parse_settings(args.setting)[0]
    config = FedHPDConfig(
        task=args.task,
        algorithm=algorithm,
        d=d,
        rounds=args.rounds,
        public_size=args.public_size,
        virtual_rounds=args.virtual_rounds,
        dtype=args.dtype,
    )
    public = make_public_states(config) if algorithm == "fedhpd" else None
    start = time.perf_counter()
    reference = ReferenceRun(RunSpec(config, args.seed, public_states=public)).run()
    reference_seconds = time.perf_counter() - start
    start = time.perf_counter()
    (fast,) = train_population([RunSpec(config, args.seed, public_states=public)])
    fast_seconds = time.perf_counter() - start
    population = None
    if args.population > 1:
        runs = [
            RunSpec(config, args.seed + i, public_states=public) for i in range(args.population)
        ]
        start = time.perf_counter()
        train_population(runs)
        population = time.perf_counter() - start
    steps = int(reference.returns.sum()) if config.spec.name == "cartpole" else None
    diffs = [
        float(np.max(np.abs(a - b))) for a, b in zip(reference.params, fast.params, strict=True)
    ]
    scale = max(float(np.max(np.abs(a))) for a in reference.params)
    record = {
        "task": config.task,
        "setting": config.label(),
        "rounds": config.rounds,
        "seed": args.seed,
        "dtype": config.dtype,
        "reference_seconds": reference_seconds,
        "fast_seconds": fast_seconds,
        "speedup": reference_seconds / fast_seconds,
        "returns_equal": bool(np.array_equal(reference.returns, fast.returns)),
        "max_return_difference": float(np.max(np.abs(reference.returns - fast.returns))),
        "max_param_difference": max(diffs),
        "max_param_magnitude": scale,
        "env_steps": steps,
        "population": args.population,
        "population_seconds": population,
        "machine": machine(),
    }
    print(
        f"{config.label()} on {config.task}, {config.rounds} rounds x {config.n_agents} agents, "
        f"seed {args.seed}, {config.dtype}"
    )
    per_step = "" if steps is None else f" ({1e6 * reference_seconds / steps:.0f} us/agent-step)"
    print(f"reference (step by step, graph per step): {reference_seconds:8.2f} s{per_step}")
    per_step = "" if steps is None else f" ({1e6 * fast_seconds / steps:.0f} us/agent-step)"
    print(f"fast (vectorised, batched recompute):     {fast_seconds:8.2f} s{per_step}")
    print(f"speed ratio: {record['speedup']:.1f}x")
    if population is not None:
        ratio = args.population * reference_seconds / population
        print(
            f"fast, {args.population} runs as one population: {population:.2f} s "
            f"({population / args.population:.2f} s per run, {ratio:.1f}x the reference per run)"
        )
    print(
        f"same episode returns: {record['returns_equal']} "
        f"(max difference {record['max_return_difference']:g}); "
        f"max parameter difference {record['max_param_difference']:.2e} "
        f"(parameters up to {scale:.2f})"
    )
    if args.out:
        path = Path(args.out)
        path.mkdir(parents=True, exist_ok=True)
        (path / f"fedhpd_speed_{config.task}.json").write_text(dumps_record(record, indent=1))
    return 0 if record["returns_equal"] else 1


def add_distillation_arguments(parser: argparse.ArgumentParser) -> None:
    """``--kl-direction``, ``--public-size`` and ``--virtual-rounds`` (also ``fedhpd``)."""
    parser.add_argument(
        "--kl-direction",
        default="auto",
        choices=["auto", "mean_to_local", "local_to_mean"],
        help="the distillation's KL: mean_to_local is KL(P_mean || P_k), local_to_mean "
        "KL(P_k || P_mean) (Algorithm 1); auto: the authors' code's choice per task",
    )
    parser.add_argument(
        "--public-size", type=int, default=None, help="states in the public set S_p (task's)"
    )
    parser.add_argument(
        "--virtual-rounds",
        type=int,
        default=None,
        help="rounds the virtual agent that makes S_p trains (task's)",
    )


def register(benches) -> None:
    parser = BENCHES["fedhpd"].add_to(benches)
    parser.add_argument(
        "--task", default="cartpole", help="cartpole, lunarlander or invertedpendulum"
    )
    parser.add_argument("--settings", default=DEFAULT_SETTINGS, help="nofed, dpa, intervals d")
    parser.add_argument(
        "--seeds",
        default="20,25,30,35,40",
        help="comma-separated seeds, one run of the task's agents each (the paper's five)",
    )
    parser.add_argument("--rounds", type=int, default=None, help="default: the paper's")
    parser.add_argument("--workers", type=int, default=2, help="processes (at most 2 here)")
    parser.add_argument(
        "--transport", default="plaintext", help="the aggregation transport (a name or spec string)"
    )
    parser.add_argument(
        "--epsilon", type=float, default=None, help="DP target epsilon (DP transports)"
    )
    parser.add_argument(
        "--noise-multiplier",
        type=float,
        default=None,
        help="DP noise std over the clip norm (instead of --epsilon)",
    )
    parser.add_argument("--clip", type=float, default=None, help="DP clip (default sqrt(rows))")
    add_distillation_arguments(parser)
    parser.add_argument("--log-every", type=int, default=100, help="progress every N rounds")
    add_out_argument(parser, RESULTS)
    parser.set_defaults(func=column)

    parser = BENCHES["fedhpd-speed"].add_to(benches)
    parser.add_argument(
        "--task", default="cartpole", help="cartpole, lunarlander or invertedpendulum"
    )
    parser.add_argument("--setting", default="5", help="nofed, dpa or an interval d")
    parser.add_argument(
        "--rounds", type=int, default=30, help="rounds per run (default: the paper's)"
    )
    add_seed_argument(parser, 20)
    parser.add_argument(
        "--public-size", type=int, default=None, help="states in the public set S_p (task's)"
    )
    parser.add_argument(
        "--virtual-rounds",
        type=int,
        default=None,
        help="rounds the virtual agent that makes S_p trains (task's)",
    )
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "float64"],
        help="float type of the policies (float32, as the authors)",
    )
    parser.add_argument("--population", type=int, default=1, help="also time N runs together")
    parser.add_argument("--out", default=None, help="folder of the record (default: print only)")
    parser.set_defaults(func=speed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m securefed.bench.bench_fedhpd")
    register(parser.add_subparsers(dest="bench", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
