"""``securefed fedhpd``: train FedHPD (or NoFed, DPA-FedRL) on a task and report the system reward.

::

    securefed fedhpd --task cartpole --d 5 --seeds 20,25 --transport plaintext
    securefed fedhpd --task cartpole --algorithm nofed --seeds 20 --rounds 500
    securefed fedhpd --task cartpole --d 5 --transport secagg --rounds 50 --seeds 20
    securefed fedhpd --task lunarlander --d 10 --seeds 20 --out results/fedhpd/lunar

Each seed is one run of the task's ten agents; the runs go to ``--workers`` processes of the fast
learner (or, with ``--learner reference``, run one after the other step by step). The uploads
(every agent's action distributions on the public state set) go through ``--transport``, so the
server only ever gets their mean. Prints the system average reward (spec section 4) and the
paper's figure for the setting; ``--out`` also writes the JSON record and the plots.

The main CLI calls :func:`register` with its subparsers; :func:`main` runs the command alone.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from securefed.bench.registry import COMMANDS
from securefed.records import dumps_record


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``fedhpd`` command to ``subparsers``."""
    parser = COMMANDS["fedhpd"].add_to(
        subparsers,
        description="Train FedHPD, NoFed or DPA-FedRL on CartPole, LunarLander or "
        "InvertedPendulum and report the system average reward.",
    )
    parser.add_argument(
        "--task", default="cartpole", help="cartpole, lunarlander, invertedpendulum"
    )
    parser.add_argument(
        "--algorithm",
        default="fedhpd",
        choices=["fedhpd", "nofed", "dpa"],
        help="fedhpd (distilled policies), nofed (independent REINFORCE) or dpa (DPA-FedRL)",
    )
    parser.add_argument("--d", type=int, default=None, help="interval (FedHPD 5, DPA 1)")
    parser.add_argument(
        "--seeds",
        default="20,25,30,35,40",
        help="comma-separated seeds, one run of the task's ten agents each (the paper's "
        "20,25,30,35,40): reproducible, not private",
    )
    parser.add_argument("--rounds", type=int, default=None, help="default: the paper's")
    from securefed.transport import transport_names

    parser.add_argument(
        "--transport",
        default="plaintext",
        help=f"a transport name ({', '.join(transport_names())}) or spec string",
    )
    parser.add_argument("--epsilon", type=float, default=None, help="DP target epsilon")
    parser.add_argument(
        "--noise-multiplier",
        type=float,
        default=None,
        help="DP noise std over the clip norm (instead of --epsilon, which derives it)",
    )
    parser.add_argument("--clip", type=float, default=None, help="DP clip (default sqrt(rows))")
    from securefed.bench.bench_fedhpd import add_distillation_arguments

    add_distillation_arguments(parser)
    parser.add_argument(
        "--learner",
        default="fast",
        choices=["fast", "reference"],
        help="fast (batched agents, --workers processes) or reference (step by step)",
    )
    parser.add_argument("--workers", type=int, default=2, help="processes of the fast learner (2)")
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "float64"],
        help="float type of the policies (float32, as the authors)",
    )
    parser.add_argument("--out", default=None, help="directory for the JSON record and plots")
    parser.set_defaults(func=run)
    return parser


def _dp_record(runs, epsilon_target: float | None) -> dict[str, object]:
    """The DP parameters of the runs' transports; epsilon spent where the ledger is in this
    process (one run, or one worker: forked workers keep their ledgers)."""
    private = [run.transport for run in runs if run.transport.ledger is not None]
    if not private:
        return {}
    first = private[0]
    spent = [t.epsilon() for t in private if t.ledger is not None and t.ledger.steps]
    return {
        "dp": {
            "placement": first.config.placement,
            "noise_multiplier": first.config.noise_multiplier,
            "clip": first.config.clip,
            "delta": first.delta,
            "epsilon_target": epsilon_target,
            "epsilon_spent": max(spent) if spent else None,
        }
    }


def run(args: argparse.Namespace) -> int:
    import torch

    from securefed.bench.bench_fedhpd import paper_key, parse_seeds, transport_factory
    from securefed.errors import TransportUnavailable
    from securefed.rl.fast import make_public_states, train_parallel
    from securefed.rl.fedhpd import (
        FedHPDConfig,
        MissingExtra,
        ReferenceRun,
        RunSpec,
        plot_agents,
        plot_system,
        require_task,
        system_average_reward,
    )

    try:
        spec = require_task(args.task)
    except MissingExtra as error:
        print(f"securefed: {error}", file=sys.stderr)
        return 2
    d = args.d if args.d is not None else (1 if args.algorithm == "dpa" else 5)
    config = FedHPDConfig(
        task=spec.name,
        algorithm=args.algorithm,
        d=d,
        rounds=args.rounds,
        kl_direction=args.kl_direction,
        public_size=args.public_size,
        virtual_rounds=args.virtual_rounds,
        dtype=args.dtype,
    )
    seeds = parse_seeds(args.seeds)
    extra = {"epsilon": args.epsilon, "noise_multiplier": args.noise_multiplier, "clip": args.clip}
    try:
        make = transport_factory(args.transport, config, extra)
    except TransportUnavailable as error:
        print(f"securefed: {error}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    started = time.perf_counter()
    public = make_public_states(config) if config.algorithm == "fedhpd" else None
    runs = [RunSpec(config, seed, make(), public) for seed in seeds]
    if args.learner == "reference":
        results = [ReferenceRun(run).run() for run in runs]
    else:
        results = train_parallel(runs, args.workers)
    seconds = time.perf_counter() - started
    returns = np.stack([r.returns for r in results])
    window = min(50, config.rounds)
    record = {
        "task": spec.name,
        "setting": config.label(),
        "algorithm": config.algorithm,
        "d": config.d,
        "rounds": config.rounds,
        "seeds": seeds,
        "transport": args.transport,
        "kl_direction": config.direction,
        "learner": args.learner,
        "system_average_reward": system_average_reward(returns, window),
        "window": window,
        "per_seed": [system_average_reward(r.returns[None], window) for r in results],
        "paper": spec.paper.get(paper_key(config.algorithm, config.d)),
        "seconds": seconds,
        "bytes_up_per_run": float(np.mean([r.bytes_up for r in results])),
        "bytes_down_per_run": float(np.mean([r.bytes_down for r in results])),
    }
    record |= _dp_record(runs, args.epsilon)
    print(dumps_record(record, indent=1))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        record["returns"] = returns.tolist()
        (out / "fedhpd.json").write_text(dumps_record(record))
        points = config.rounds - window + 1
        if points < 3:
            print(
                f"fedhpd: {config.rounds} rounds at a {window}-round window give {points} "
                "point(s) per curve: the plots show them as points (run more rounds for curves)",
                file=sys.stderr,
            )
        if config.rounds >= window:
            curves = {config.label(): returns}
            plot_system(curves, out / "fedhpd_system.png", window=window, title=spec.env_id)
            plot_agents(
                curves,
                out / "fedhpd_agents.png",
                window=window,
                agent_labels=[a.describe() for a in config.agent_specs],
                title=spec.env_id,
            )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="securefed")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError) as error:
        print(f"securefed: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
