"""``securefed fedslate``: one FedSlate (or SlateQ / reference) run with JSON and a learning curve.

::

    securefed fedslate --candidates 100 --slate 10 --episodes 5000 --json run.json --plot run.png
    securefed fedslate --algorithm slateq --candidates 10 --slate 3 --episodes 1500 --members 3
    securefed fedslate --variant extended --feedback-prob 0.1
    securefed fedslate --platforms 5 --feedback 1,1,1,0,0
    securefed fedslate --candidates 500 --slate 10 --checkpoint runs/n500.pt   # resumable
    securefed fedslate --transport dp --epsilon 4       # Q-values clipped and noised (local DP)
    securefed fedslate --transport ckks   # refused: the CKKS channel cannot serve this network

The main CLI calls :func:`register` with its subparsers; the leaf parser sets ``func`` (a
callable taking the parsed namespace and returning an exit code). :func:`main` runs the command
on its own (tests, ``python -m securefed.bench.cli_fedslate``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from securefed import SecurefedError
from securefed.bench.registry import COMMANDS
from securefed.fusion import DP_CHANNELS, MODULE_CHANNELS, fusion_refusal
from securefed.records import dumps_record
from securefed.rl.choices import (
    ALIGNMENTS,
    CHOICE_MODEL_NAMES,
    LOCAL_ARCHS,
    PLATFORM_NAMES,
    SERVER_ARCHS,
    SLATE_METHODS,
    VARIANTS,
)

if TYPE_CHECKING:
    from securefed.rl.slateq import SlateQConfig

ALGORITHMS = ("fedslate", "slateq", "random", "highest_k")


def _widths(text: str) -> tuple[int, ...]:
    return tuple(int(w) for w in text.split(",") if w)


def _flags(text: str) -> tuple[bool, ...]:
    return tuple(part.strip() not in ("0", "false", "no") for part in text.split(","))


def _fusion_channel(name: str) -> str:
    """A ``--transport`` value: one of :data:`MODULE_CHANNELS`; another says why it is refused."""
    if name in MODULE_CHANNELS:
        return name
    from securefed.fusion import FusionNeeds

    try:
        why = fusion_refusal(name, FusionNeeds())
    except ValueError:
        why = None
    if why is None:
        raise argparse.ArgumentTypeError(
            f"invalid choice: {name!r} (choose from {', '.join(MODULE_CHANNELS)})"
        )
    raise argparse.ArgumentTypeError(
        f"{why}; FedSlate's transports are {', '.join(MODULE_CHANNELS)}"
    )


def add_transport_arguments(parser: argparse.ArgumentParser) -> None:
    """``--transport`` (alias ``--fusion``) and the DP options, for FedSlate's commands."""
    parser.add_argument(
        "--transport",
        "--fusion",
        dest="fusion",
        type=_fusion_channel,
        metavar="{" + ",".join(MODULE_CHANNELS) + "}",
        default="plaintext",
        help="how the Q-values travel: the fusion channel the server network runs behind "
        "(one that cannot serve the configuration refuses, saying why; --fusion is an alias)",
    )
    parser.add_argument(
        "--epsilon",
        type=float,
        default=None,
        help="dp, ckks+dp: epsilon per platform and user episode (the unit of privacy)",
    )
    parser.add_argument("--dp-delta", type=float, default=1e-5, help="dp, ckks+dp: delta")
    parser.add_argument(
        "--dp-clip", type=float, default=1.0, help="dp, ckks+dp: L2 bound per Q-value row"
    )
    parser.add_argument(
        "--dp-grad-clip",
        type=float,
        default=None,
        help="dp, ckks+dp: L2 bound per gradient row (default huber delta / batch size)",
    )
    parser.add_argument(
        "--dp-local-clip",
        type=float,
        default=None,
        help="dp, ckks+dp: L2 bound on one user episode's gradient of a platform's local network "
        "per learning step (its DP-SGD, charged in the platform's ledger; default 1)",
    )
    parser.add_argument(
        "--dp-acting",
        choices=("released", "own"),
        default=None,
        help="dp: what a platform acts on for its own user: the fused values of its released "
        "rows (released, the default) or the server network's weights on its own clean "
        "Q-values, no acting row released (own: joint DP, docs/fedslate.md section 9)",
    )
    parser.add_argument(
        "--dp-learning",
        choices=("rows", "sums"),
        default=None,
        help="dp with --dp-acting own: what a learning step releases: every drawn round's "
        "noised Q-value and gradient rows (rows, the default) or one DP-SGD sum per platform "
        "of its users' clipped gradients in its local and the server network's weights "
        "(sums: no row leaves; docs/fedslate.md section 9)",
    )
    parser.add_argument(
        "--dp-sampling",
        choices=("poisson",),
        default=None,
        help="dp with --dp-learning sums: each platform keeps each user of a step's batch in "
        "its DP-SGD sum with probability --dp-sample-rate, drawn in secret (poisson), and its "
        "ledger charges the sampled Gaussian under replacement (default: every user enters)",
    )
    parser.add_argument(
        "--dp-sample-rate",
        type=float,
        default=None,
        help="dp with --dp-sampling poisson: the inclusion probability q, in (0, 1)",
    )
    parser.add_argument(
        "--dp-server-clip",
        type=float,
        default=None,
        help="dp with --dp-learning sums: per-part clipping: each user's gradient in the server "
        "network's weights clipped to this C_s, in its local network's to sqrt(C^2 - C_s^2), "
        "C = --dp-local-clip, so the whole stays within C (same noise, same ledger); C_s in "
        "(0, C); default: the whole clipped to C",
    )
    parser.add_argument(
        "--ckks-scale-bits",
        type=int,
        default=None,
        help="ckks, ckks+dp: log2 of the CKKS scale (default 49 for the packed circuit of one "
        "hidden layer or the linear server, 55 for deeper servers' monomial circuit)",
    )


def transport_fields(args: argparse.Namespace) -> dict[str, object]:
    """The FedSlateConfig fields of the transport options (the DP ones only when given or
    needed, so that a plaintext configuration keeps its defaults and its cache key).

    Raises:
        ValueError: DP options for a transport without DP, or a DP transport without
            ``--epsilon`` (refused rather than ignored).
    """
    fields: dict[str, object] = {"fusion": args.fusion}
    if args.ckks_scale_bits is not None:
        fields["ckks_scale_bits"] = args.ckks_scale_bits  # the config refuses it off CKKS
    dp_given = {
        "--dp-delta": args.dp_delta != 1e-5,
        "--dp-clip": args.dp_clip != 1.0,
        "--dp-grad-clip": args.dp_grad_clip is not None,
        "--dp-local-clip": args.dp_local_clip is not None,
        "--dp-acting": args.dp_acting is not None,
        "--dp-learning": args.dp_learning is not None,
        "--dp-sampling": args.dp_sampling is not None,
        "--dp-sample-rate": args.dp_sample_rate is not None,
        "--dp-server-clip": args.dp_server_clip is not None,
    }
    if args.fusion not in DP_CHANNELS:
        given = [flag for flag, on in dp_given.items() if on]
        if args.epsilon is not None:
            given.insert(0, "--epsilon")
        if given:
            raise ValueError(
                f"{', '.join(given)} apply only to the DP transports {sorted(DP_CHANNELS)}, not "
                f"to {args.fusion!r}"
            )
        return fields
    if args.epsilon is None:
        raise ValueError(f"transport {args.fusion!r} needs --epsilon (per platform and episode)")
    if args.dp_local_clip is not None:
        fields["dp_local_clip"] = args.dp_local_clip
    if args.dp_acting is not None:
        fields["dp_acting"] = args.dp_acting  # the config refuses "own" where it cannot hold
    if args.dp_learning is not None:
        fields["dp_learning"] = args.dp_learning  # the config refuses "sums" off joint DP
    if args.dp_sampling is not None or args.dp_sample_rate is not None:
        fields["dp_sampling"] = args.dp_sampling  # the config refuses it off sums, or unpaired
        fields["dp_sample_rate"] = args.dp_sample_rate
    if args.dp_server_clip is not None:
        # Named as the command line spells it; the config checks the same again.
        clip = 1.0 if args.dp_local_clip is None else args.dp_local_clip
        if args.dp_learning != "sums":
            raise ValueError(
                "--dp-server-clip needs --dp-learning sums (with --dp-acting own): only the "
                "per-step sums hold a server part to clip; got --dp-learning "
                f"{args.dp_learning or 'rows'}"
            )
        if not 0 < args.dp_server_clip < clip:  # NaN fails too
            raise ValueError(
                f"--dp-server-clip must lie in (0, --dp-local-clip {clip:g}): the local part "
                f"takes sqrt(C^2 - C_s^2) of the clip; got {args.dp_server_clip:g}"
            )
        fields["dp_server_clip"] = args.dp_server_clip
    return fields | {
        "dp_epsilon": args.epsilon,
        "dp_delta": args.dp_delta,
        "dp_clip": args.dp_clip,
        "dp_grad_clip": args.dp_grad_clip,
    }


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``fedslate`` command to ``subparsers``."""
    parser = COMMANDS["fedslate"].add_to(
        subparsers,
        description="One run; prints the per-platform metrics (optimal reward = best "
        "100-episode moving average, ETROR = first episode reaching 99% of it).",
    )
    parser.add_argument(
        "--algorithm",
        choices=ALGORITHMS,
        default="fedslate",
        help="fedslate (fused Q-values), slateq (each platform alone), or the random and "
        "highest_k references",
    )
    parser.add_argument(
        "--variant",
        choices=VARIANTS,
        default="fedslate",
        help="FedSlate's variant: fedslate (the paper's), extended (Algorithm 4, sparse team "
        "rewards), fedq (the FedQ baseline) or linear (the linear-server ablation)",
    )
    parser.add_argument("--candidates", type=int, default=10, help="N candidates per step")
    parser.add_argument("--slate", type=int, default=3, help="slate size n")
    parser.add_argument("--platforms", type=int, default=2, help="K platforms")
    parser.add_argument(
        "--feedback", type=_flags, default=None, help="per platform 1/0 (default: A only)"
    )
    parser.add_argument("--feedback-prob", type=float, default=1.0, help="sparse feedback rate")
    parser.add_argument("--shared-corpus", action="store_true", help="the paper script's defect")
    parser.add_argument("--episodes", type=int, default=5000, help="training episodes (5000)")
    parser.add_argument("--members", type=int, default=1, help="independent seeds run together")
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed the environment, the networks and every key, mask and noise draw "
        "(reproducible, NOT private); default: secure mode (OS entropy)",
    )
    parser.add_argument(
        "--local-hidden",
        type=_widths,
        default=(64, 64),
        help="hidden widths of each platform's Q-network, comma separated (64,64)",
    )
    parser.add_argument(
        "--local-arch",
        choices=LOCAL_ARCHS,
        default="item",
        help="item: one network per candidate's features (weights shared over candidates); "
        "flat: the paper's network on all candidates at once",
    )
    parser.add_argument(
        "--server-hidden",
        type=_widths,
        default=(16, 16),
        help="hidden widths of the server network, comma separated (16,16)",
    )
    parser.add_argument(
        "--server-arch",
        choices=SERVER_ARCHS,
        default="position",
        help="position: one network at every candidate position (shared weights); flat: the "
        "paper's network on the whole concatenation",
    )
    parser.add_argument(
        "--alignment",
        choices=ALIGNMENTS,
        default="position",
        help="what the server fuses: every platform's own candidates (position, the paper) or "
        "every platform's value of the fused platform's candidates (item)",
    )
    add_transport_arguments(parser)
    parser.add_argument(
        "--activation",
        default="silu",
        help="hidden activation of the networks: silu (default), mish, relu, tanh, identity "
        "or polynomial (what CKKS computes)",
    )
    parser.add_argument(
        "--server-activation",
        default=None,
        help="the server network's hidden activation (default --activation), e.g. "
        "polynomial for ckks with SiLU local networks",
    )
    parser.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate (0.001)")
    parser.add_argument(
        "--choice-model",
        choices=sorted(CHOICE_MODEL_NAMES),
        default="true",
        help="the agents' model of the user's choice: true (the environment's) or paper_code "
        "(the FedSlate code's, null item score 1)",
    )
    parser.add_argument(
        "--slate-method",
        choices=SLATE_METHODS,
        default="greedy",
        help="how a slate is chosen from the Q-values: topk, greedy (default) or lp",
    )
    parser.add_argument(
        "--target",
        choices=("qlearning", "sarsa"),
        default="qlearning",
        help="TD target: qlearning (the best next slate) or sarsa (the slate taken)",
    )
    parser.add_argument("--burn-in", type=int, default=5000, help="rounds before learning")
    parser.add_argument("--json", default=None, help="write the run record here")
    parser.add_argument("--plot", default=None, help="write the learning curve PNG here")
    parser.add_argument("--log-every", type=int, default=0, help="progress every K episodes")
    parser.add_argument(
        "--checkpoint",
        default=None,
        help="checkpoint file: saved every --checkpoint-every episodes, resumed when it exists",
    )
    parser.add_argument(
        "--checkpoint-every", type=int, default=100, help="episodes between checkpoints (100)"
    )
    parser.set_defaults(func=_run)
    return parser


def _config(args: argparse.Namespace) -> SlateQConfig:
    from securefed.rl.fedslate import FedSlateConfig  # torch: only once a run is asked for
    from securefed.rl.slateq import SlateQConfig

    common = {
        "num_candidates": args.candidates,
        "slate_size": args.slate,
        "num_platforms": args.platforms,
        "feedback": args.feedback,
        "feedback_prob": args.feedback_prob,
        "shared_corpus": args.shared_corpus,
        "episodes": args.episodes,
        "members": args.members,
        "seed": args.seed,
        "local_hidden": args.local_hidden,
        "local_arch": args.local_arch,
        "activation": args.activation,
        "lr": args.lr,
        "choice_model": args.choice_model,
        "slate_method": args.slate_method,
        "target": args.target,
        "burn_in": args.burn_in,
        "log_every": args.log_every,
    }
    if args.algorithm == "fedslate":
        return FedSlateConfig(
            **common,
            variant=args.variant,
            server_hidden=args.server_hidden,
            server_arch=args.server_arch,
            alignment=args.alignment,
            server_activation=args.server_activation,
            **transport_fields(args),
        )
    if (
        args.fusion != "plaintext"
        or args.epsilon is not None
        or args.ckks_scale_bits is not None
        or args.server_activation is not None
    ):
        raise ValueError(
            "--transport, --epsilon, --ckks-scale-bits and --server-activation apply to "
            f"FedSlate's fusion only, not to --algorithm {args.algorithm}"
        )
    return SlateQConfig(**common)


def _plot(rewards: np.ndarray, path: str, title: str) -> None:
    from matplotlib.figure import Figure  # no backend chosen, no pyplot state

    from securefed.rl.fedslate import moving_average

    window = min(100, rewards.shape[0])
    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    for p in range(rewards.shape[2]):
        curves = [moving_average(rewards[:, s, p], window) for s in range(rewards.shape[1])]
        ax.plot(
            np.arange(window, rewards.shape[0] + 1),
            np.mean(curves, axis=0),
            label=f"platform {PLATFORM_NAMES[p]}",
        )
    ax.set_xlabel("episode")
    ax.set_ylabel(f"episode reward ({window}-episode moving average)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _run(args: argparse.Namespace) -> int:
    import torch

    from securefed.rl.checkpoint import EpisodeCheckpoints
    from securefed.rl.fedslate import run_fedslate, run_reference, summarize
    from securefed.rl.slateq import run_slateq

    config = _config(args)
    torch.set_num_threads(config.threads)  # the runs themselves set no global state
    checkpoints = (
        EpisodeCheckpoints(args.checkpoint, every=args.checkpoint_every)
        if args.checkpoint
        else None
    )
    if args.algorithm == "fedslate":
        result = run_fedslate(config, checkpoints=checkpoints)
    elif args.algorithm == "slateq":
        result = run_slateq(config, checkpoints=checkpoints)
    else:
        result = run_reference(config, args.algorithm, users=args.members)
    window = min(100, config.episodes)
    summary = summarize(result, window=window)
    record = result.to_record() | {"metrics": summary}
    if result.fusion_view is not None and "dp" in result.fusion_view.public:
        record["dp"] = result.fusion_view.public["dp"]  # the mechanism and epsilon spent
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(dumps_record(record))
    if args.plot:
        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
        _plot(
            result.episode_rewards,
            args.plot,
            f"{result.algorithm}, N={config.num_candidates}, n={config.slate_size}",
        )
    shown = {k: record[k] for k in ("algorithm", "seconds", "episodes_per_second", "updates")}
    shown["metrics"] = summary
    if "dp" in record:
        shown["dp"] = record["dp"]
    print(dumps_record(shown, indent=1, default=float))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="securefed")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["fedslate", *(argv or [])])
    try:
        return int(args.func(args) or 0)
    except (ValueError, SecurefedError) as error:
        print(f"securefed: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
