"""The ``securefed`` command line.

Subcommands: ``fedmf`` (one training run), ``demo`` (the main job on the embedded data),
``bench ...`` (benchmarks and paper tables), ``privacy`` (epsilon and noise calculator),
``fedhpd`` and ``fedslate`` (the RL recommenders).

The parser is built lazily (:mod:`securefed.bench.registry`): every subcommand and benchmark is
listed from a static table, and only the one chosen on the command line has its module imported
and its arguments added. A chosen command whose pip extra is missing stops with one line naming
it, exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import replace

from securefed import ClientSampling, RoundSelection
from securefed.bench import registry
from securefed.bench.data_options import add_layout_arguments
from securefed.records import dumps_record

DESCRIPTION = (
    "Private federated recommendation: FedMF, FedSlate and FedHPD behind one transport layer "
    "(plaintext, secure aggregation, CKKS, DP), with the attacks that verify each defence."
)


def _add_fedmf(subparsers) -> None:
    from securefed.bench import stopping_args

    parser = subparsers.add_parser("fedmf", help="train one FedMF-family model and evaluate it")
    parser.add_argument(
        "--data",
        default="ml-latest-small",
        help="ml-latest-small (embedded), ml-100k, or a path to a ratings file/dir",
    )
    parser.add_argument(
        "--split",
        default=None,
        help="u1..u5/ua/ub for ML-100K; random or temporal (default random)",
    )
    # Data options (issue 20): how a ratings file is read.
    parser.add_argument(
        "--duplicates",
        default="error",
        choices=["error", "first", "last", "mean"],
        help="a (user, item) pair on several lines: error (default, naming both lines), keep "
        "the first or the last line, or the mean rating rounded to the scale",
    )
    add_layout_arguments(parser)
    parser.add_argument(
        "--scale",
        default=None,
        metavar="MIN:MAX:STEP",
        help="the rating scale, e.g. 0.5:4:0.5 (default: the format's own, else inferred); "
        "a rating off it is an error naming its line",
    )
    parser.add_argument(
        "--preset",
        default=None,
        choices=["biased", "paper", "dp", "dp-biased"],
        help="starting settings (default: biased, or dp-biased over a DP transport, where the "
        "biased preset's global-mean round is not in the budget): biased (the choice for a new "
        "ratings file: "
        "biased_config, global mean + biases, Adam on the server, 35 rounds, ratings learnt "
        "in quarters of the scale's range so that it holds on any scale; it beats the damped "
        "biases on every data set of benchmarks/results/cli_defaults/), paper (FedMFConfig "
        "defaults, Chai et al.'s model, tuned on ML-100K u1 only: it loses to the global mean "
        "on other scales), dp (user_level_dp_config: fixed-denominator aggregation, user-mean "
        "offset) or dp-biased (dp_biased_config: the dp preset with biases, the item-bias "
        "column uploaded at 0.3 of its scale so that it does not take most of the clip); the "
        "options below override them",
    )
    parser.add_argument(
        "--variant",
        default=None,
        choices=["fedmf", "fedrec", "fedrec+", "als"],
        help="fedmf (vanilla), fedrec (hybrid filling: pseudo items hide which items a user "
        "rated), fedrec+ (similarity filling, Wasserstein weights) or als (DP-ALS, private "
        "alternating least squares: securefed.recsys.dp_als, configured by --dim and "
        "--als-option); default fedmf",
    )
    parser.add_argument(
        "--als-option",
        action="append",
        default=None,
        metavar="KEY=VALUE",
        help="with --variant als: a DPALSConfig field (passes=2, max_ratings=50, ...)",
    )
    from securefed.transport import transport_names

    parser.add_argument(
        "--transport",
        default="plaintext",
        help=f"a transport name ({', '.join(transport_names())}) or spec string with options, "
        "NAME:KEY=VALUE,... (e.g. secagg:bits=32,scale=2**16)",
    )
    parser.add_argument(
        "--dim", type=int, default=None, help="latent dimension (biased 100, paper 20)"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="rounds (biased 35, paper 500); with --validation the most it may pick (default "
        "twice the preset's)",
    )
    parser.add_argument(
        "--lr", type=float, default=None, help="users' step size gamma (biased 0.3, paper 0.1)"
    )
    parser.add_argument(
        "--server-lr",
        type=float,
        default=None,
        help="server step eta (biased: Adam's, 0.03; paper 0.1)",
    )
    parser.add_argument(
        "--reg", type=float, default=None, help="lambda = mu, L2 weight (paper 0.12)"
    )
    parser.add_argument(
        "--biases",
        default=None,
        action=argparse.BooleanOptionalAction,
        help="model global mean + user bias (on the device) + item bias (uploaded with the item "
        "rows); on in the biased preset",
    )
    parser.add_argument("--reg-bias", type=float, default=None, help="L2 weight of the biases")
    parser.add_argument(
        "--item-damping",
        type=float,
        default=None,
        metavar="K",
        help="the server shrinks each item as if it had K more ratings at its prediction "
        "(aggregation mean only; the biased preset's 25, 0 turns it off)",
    )
    parser.add_argument(
        "--user-damping",
        type=float,
        default=None,
        metavar="K",
        help="each device shrinks its vector and bias as if it had K more ratings "
        "(the biased preset's 30, 0 turns it off)",
    )
    parser.add_argument(
        "--bias-upload-scale",
        type=float,
        default=None,
        metavar="S",
        help="upload the item-bias column times S, the server divides by S: under DP, how the "
        "one clip norm is shared between factors and bias (the dp-biased preset's 0.3)",
    )
    parser.add_argument(
        "--rating-unit",
        default=None,
        choices=["one", "scale"],
        help="learn on the ratings as they are (one; the paper preset's) or divided by a "
        "quarter of the scale's range (scale; the biased preset's): settings mean the same on "
        "any scale",
    )
    from securefed.server_optim import SERVER_OPTIMISERS

    parser.add_argument(
        "--server-optimiser",
        default=None,
        choices=SERVER_OPTIMISERS,
        help="the server's rule for V and the item biases (FedOpt; sgd is V - eta G)",
    )
    parser.add_argument(
        "--validation",
        type=float,
        default=None,
        metavar="FRACTION",
        help="choose the rounds by early stopping on FRACTION of each user's training ratings "
        "(--rounds is then the most, by default twice the preset's), then train on all of them "
        "(not under DP)",
    )
    stopping_args.add_arguments(parser)
    parser.add_argument("--init-std", type=float, default=None, help="initial factor std (0.3)")
    parser.add_argument(
        "--upload",
        default=None,
        choices=["part", "full"],
        help="part: a user uploads its rated (and pseudo) items' rows only; full: the whole "
        "block, zeros elsewhere, so a hiding transport hides which rows were touched",
    )
    parser.add_argument(
        "--aggregation",
        default=None,
        choices=["mean", "sum", "fixed"],
        help="how the server combines the item gradients: per-item mean over the uploaders, "
        "sum, or fixed (the sum over a public expected client count: user-level DP's)",
    )
    parser.add_argument(
        "--offset",
        default=None,
        choices=["none", "user_mean"],
        help="user_mean: each device predicts its ratings around its own mean (the dp preset's)",
    )
    parser.add_argument(
        "--server-state",
        default=None,
        choices=["plain", "encrypted"],
        help="encrypted: [[V]] stays encrypted on the server (ckks, Chai et al.)",
    )
    parser.add_argument("--rho", type=float, default=None, help="pseudo items per rated item (1)")
    parser.add_argument(
        "--weighting",
        default=None,
        choices=["uniform", "count", "wasserstein"],
        help="clients' weights in the aggregate: uniform, by rating count, or FedRec+'s "
        "Wasserstein weights",
    )
    parser.add_argument(
        "--filling-regularisation",
        default=None,
        choices=["per_rating", "per_row"],
        help="FedRec/FedRec+ item regulariser per rating (mu / (1 + rho) per row) or per row",
    )
    parser.add_argument("--dropout", type=float, default=None, help="fraction of clients dropping")
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed every key, mask and noise draw (reproducible, NOT private); "
        "default: secure mode (OS entropy)",
    )
    parser.add_argument(
        "--split-seed",
        type=int,
        default=0,
        help="seed of the random train/test split (0); no privacy rests on it",
    )
    parser.add_argument(
        "--clients-per-round",
        type=int,
        default=None,
        help="sample this many clients per round (default: all)",
    )
    parser.add_argument(
        "--sampling",
        default="poisson",
        choices=["poisson", "fixed"],
        help="how --clients-per-round samples (poisson matches DP accounting)",
    )
    parser.add_argument(
        "--cyclic-groups",
        type=int,
        default=None,
        help="the public cyclic schedule of N groups (round t: the users with id %% N == t %% "
        "N), for the correlated-noise DP transports: --transport "
        "'dp:correlation=banded,groups=N' (also independent, tree, tree-honaker)",
    )
    parser.add_argument("--epsilon", type=float, default=None, help="DP target epsilon")
    parser.add_argument("--delta", type=float, default=1e-5, help="DP delta")
    parser.add_argument(
        "--noise-multiplier",
        type=float,
        default=None,
        help="DP noise std over the clip norm (instead of --epsilon, which derives it)",
    )
    parser.add_argument("--clip", type=float, default=None, help="DP per-client L2 clip")
    parser.add_argument("--ranking", action="store_true", help="also report HR@10 and NDCG@10")
    parser.add_argument("--json", default=None, help="write the result record here")
    parser.add_argument("--save-view", default=None, help="save the ServerView to this directory")
    parser.add_argument(
        "--view-rounds",
        default="last:2",
        help="rounds whose payloads the view keeps: all, none, last:K, 0,1,5-7",
    )
    parser.add_argument(
        "--checkpoint-dir",
        default=None,
        help="save checkpoints here and resume from the last one found",
    )
    parser.add_argument(
        "--checkpoint-every", type=int, default=50, help="rounds between checkpoints (50)"
    )
    parser.add_argument(
        "--checkpoint-key-file",
        default=None,
        help="file of at least 16 bytes, mode 0600 (refused otherwise): the keys of the "
        "checkpoints' HMACs and of the encryption of their client state and a secure-mode run's "
        "entropy derive from it (needed to checkpoint a run without --seed)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(func=_run_fedmf)


def _run_fedmf(args: argparse.Namespace) -> int:
    if args.variant == "als":
        return _run_dp_als(args)
    if args.als_option:
        raise ValueError("--als-option applies only with --variant als")
    from securefed.bench import datasets, stopping_args
    from securefed.bench.experiment import FedMFRun, run_fedmf, save_json
    from securefed.errors import TransportUnavailable
    from securefed.integrity import read_key_file
    from securefed.recsys.baselines import baseline_warning
    from securefed.recsys.fedmf import (
        FedMFConfig,
        biased_config,
        dp_biased_config,
        user_level_dp_config,
    )
    from securefed.recsys.validation import EarlyStopping
    from securefed.transport import option_groups, parse_transport_spec

    loader = _loader_options(args)
    split = datasets.load_with(args.data, loader)
    # What `securefed attack` needs to rebuild the truth: public names and a digest, no ratings.
    described = {
        "name": split.name,
        "source": str(args.data),
        "source_sha256": datasets.source_sha256(args.data) if args.save_view else None,
        "loader": loader.to_dict(),
        "validation": args.validation,
    }
    if split.train.load_report is not None:
        print(f"securefed: read {split.train.load_report.summary()}", file=sys.stderr)
    checkpoint_key = None
    if args.checkpoint_key_file is not None:
        checkpoint_key = read_key_file(args.checkpoint_key_file)
    given = {
        "variant": args.variant,
        "dim": args.dim,
        "rounds": args.rounds,
        "lr": args.lr,
        "server_lr": args.server_lr,
        "reg_user": args.reg,
        "reg_item": args.reg,
        "init_std": args.init_std,
        "upload": args.upload,
        "aggregation": args.aggregation,
        "offset": args.offset,
        "server_state": args.server_state,
        "rho": args.rho,
        "weighting": args.weighting,
        "filling_regularisation": args.filling_regularisation,
        "dropout": args.dropout,
        "biases": args.biases,
        "reg_bias": args.reg_bias,
        "item_damping": args.item_damping,
        "user_damping": args.user_damping,
        "bias_upload_scale": args.bias_upload_scale,
        "server_optimiser": args.server_optimiser,
        "rating_unit": args.rating_unit,
    }
    overrides = {name: value for name, value in given.items() if value is not None}
    presets = {
        "paper": FedMFConfig,
        "biased": biased_config,
        "dp": user_level_dp_config,
        "dp-biased": dp_biased_config,
    }
    preset = args.preset or default_preset(args.transport)
    config = presets[preset](**overrides)
    stopping_given = stopping_args.given(args)
    if args.validation is None and stopping_given:
        raise ValueError(
            "--patience, --validate-every, --min-rounds and --smoothing apply only with "
            "--validation"
        )
    if args.validation is not None and args.rounds is None:
        # The preset's rounds were chosen on ML-100K: a new file may want more (the rule stops).
        config = replace(config, rounds=VALIDATION_ROUNDS_FACTOR * config.rounds)
    if args.cyclic_groups is not None and args.clients_per_round is not None:
        raise ValueError("--cyclic-groups fixes each round's clients: drop --clients-per-round")
    if args.cyclic_groups is not None:
        sampling = ClientSampling("cyclic", groups=args.cyclic_groups)
    elif args.clients_per_round is None:
        sampling = ClientSampling()
    else:
        sampling = ClientSampling(args.sampling, args.clients_per_round)
    dp_given = {
        "epsilon": args.epsilon,
        "noise_multiplier": args.noise_multiplier,
        "clip": args.clip,
    }
    transport_options = {f"dp.{key}": value for key, value in dp_given.items() if value is not None}
    if "dp" in option_groups(parse_transport_spec(args.transport).name):
        transport_options["dp.delta"] = args.delta  # --delta has a default: passed where DP is
    run = FedMFRun(
        config=config,
        transport=args.transport,
        seed=args.seed,
        sampling=sampling,
        keep_payloads=RoundSelection.parse(args.view_rounds if args.save_view else "none"),
        checkpoint_dir=args.checkpoint_dir,
        checkpoint_every=args.checkpoint_every,
        checkpoint_key=checkpoint_key,
        progress=False if args.no_progress else None,
        ranking=args.ranking,
        transport_options=transport_options,
        validation=args.validation,
        early_stopping=EarlyStopping(**stopping_given),
    )
    try:
        record, _, transport = run_fedmf(split, run)
    except TransportUnavailable as error:
        print(f"securefed: {error}", file=sys.stderr)
        return 2
    if args.save_view:
        transport.view.public["data"] = described
        transport.view.save(args.save_view)
        record["view"] = str(args.save_view)
    record["preset"] = preset
    record |= baseline_record(split, record["rmse"])
    if args.json:
        save_json(record, args.json)
    shown = {
        k: record[k]
        for k in (
            "data",
            "preset",
            "variant",
            "transport",
            "rounds",
            "rmse",
            "baselines",
            "mae",
            "seconds",
            "bytes_up_per_client",
            "bytes_down_per_client",
            "randomness",
        )
    }
    shown |= {k: v for k, v in record.items() if k.startswith(("hr@", "ndcg@", "epsilon"))}
    if "validation" in record:
        shown["validation"] = {
            k: record["validation"][k] for k in ("rounds", "stopped_early", "seconds")
        }
    if args.seed is not None:
        print(
            f"securefed: seeded run (seed {args.seed}): every key, mask and noise draw follows "
            "from the seed; seeded: not private",
            file=sys.stderr,
        )
    print(dumps_record(shown, indent=1, default=float))
    hint = (
        "the default preset, biased, or more rounds may help"
        if preset in ("paper", "dp")
        else "more rounds (--rounds, or --validation 0.1 to pick them) may help"
    )
    warning = baseline_warning(record["rmse"], record["baselines"], hint)
    if warning is not None:
        print(f"securefed: {warning}", file=sys.stderr)
    return 0


def default_preset(transport: str) -> str:
    """The preset of a run given none: ``biased`` (what wins on a new file,
    benchmarks/results/cli_defaults/), or ``dp-biased`` over a transport that charges a DP
    ledger (the biased preset's global-mean round is outside the DP budget and refused there)."""
    from securefed.transport import option_groups, parse_transport_spec

    return "dp-biased" if "dp" in option_groups(parse_transport_spec(transport).name) else "biased"


VALIDATION_ROUNDS_FACTOR = 2
"""With ``--validation`` and no ``--rounds``, the most rounds the rule may pick: this times the
preset's (on ml-latest-small the biased preset's validation curve still falls at 70 rounds)."""


def baseline_record(split, model_rmse: float) -> dict:
    """What every run records beside its RMSE: the floors' test RMSE and whether it beat them.

    ``{"baselines": {"global_mean": rmse, "damped_biases": rmse}, "beats_baselines": {...}}``
    (:func:`securefed.recsys.baselines.baseline_rmses`, fitted on the same training ratings).
    """
    from securefed.recsys.baselines import baseline_rmses, baselines_beaten

    baselines = baseline_rmses(split)
    return {"baselines": baselines, "beats_baselines": baselines_beaten(model_rmse, baselines)}


def _loader_options(args: argparse.Namespace):
    """How ``securefed fedmf`` reads its ratings file (``datasets.LoaderOptions``)."""
    from securefed.bench import datasets

    return datasets.LoaderOptions(
        split=args.split,
        seed=args.split_seed,
        scale=args.scale,
        duplicates=args.duplicates,
        sep=args.sep,
        columns=args.columns,
        ids=args.ids,
    )


def _run_dp_als(args: argparse.Namespace) -> int:
    from securefed.bench import datasets
    from securefed.bench.dp_als_experiment import (
        DPALSRun,
        als_config_from_args,
        refuse_fedmf_options,
        run_dp_als,
    )
    from securefed.bench.experiment import save_json
    from securefed.transport import option_groups, parse_transport_spec

    refuse_fedmf_options(args)
    config = als_config_from_args(args.dim, args.als_option)
    split = datasets.load_with(args.data, _loader_options(args))
    dp_given = {"epsilon": args.epsilon, "noise_multiplier": args.noise_multiplier}
    options = {f"dp.{key}": value for key, value in dp_given.items() if value is not None}
    if "dp" in option_groups(parse_transport_spec(args.transport).name):
        options["dp.delta"] = args.delta
    run = DPALSRun(
        config=config,
        transport=args.transport,
        transport_options=options,
        seed=args.seed,
        keep_payloads=RoundSelection.parse(args.view_rounds if args.save_view else "none"),
        progress=False if args.no_progress else None,
    )
    record, _, transport = run_dp_als(split, run)
    if args.save_view:
        transport.view.save(args.save_view)
        record["view"] = str(args.save_view)
    if args.json:
        save_json(record, args.json)
    keys = ("data", "variant", "transport", "rounds", "rmse", "mae", "damped_baseline_rmse")
    shown = {k: record[k] for k in (*keys, "seconds", "bytes_up_per_client", "randomness")}
    shown |= {k: v for k, v in record.items() if k.startswith("epsilon")}
    print(dumps_record(shown, indent=1, default=float))
    return 0


def _add_demo(subparsers) -> None:
    from securefed.bench.leak_utility import DEMO_ROUNDS

    parser = registry.COMMANDS["demo"].add_to(subparsers)
    parser.add_argument(
        "--out", default="results/demo", help="folder of the figures and tables (results/demo)"
    )
    parser.add_argument(
        "--data",
        default="ml-latest-small",
        help="ml-latest-small (embedded, the default), ml-100k, or a path to a ratings file/dir",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=DEMO_ROUNDS,
        help=f"training rounds per cell ({DEMO_ROUNDS}, the demo's figures; fewer: a smoke run)",
    )
    parser.set_defaults(func=_run_demo)


def _run_demo(args: argparse.Namespace) -> int:
    from securefed.bench.leak_utility import demo

    return demo(args.data, args.out, rounds=args.rounds)


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The ``securefed`` parser, in full for the command ``argv`` chooses (stubs for the rest).

    Raises:
        registry.ExtraNotInstalled: the chosen command needs a pip extra that is missing.
    """
    parser = argparse.ArgumentParser(prog="securefed", description=DESCRIPTION)
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    registry.add_commands(subparsers, registry.COMMANDS, argv)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``securefed ARGV``; returns the exit code (2: bad input or a missing extra)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser(argv)
    except registry.ExtraNotInstalled as error:
        print(f"securefed: {error}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    from securefed.errors import AggregationError

    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError, FloatingPointError, AggregationError) as error:
        # A data error words its fix for the command line (--scale, not scale=) where it can.
        message = getattr(error, "command_line_message", None) or str(error)
        print(f"securefed: error: {message}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as error:  # an optional module reached only at run time
        extra = registry.extra_of_module(error.name)
        if extra is None:
            raise
        missing = registry.ExtraNotInstalled(_command_name(args), (extra,))
        print(f"securefed: {missing}", file=sys.stderr)
        return 2


def _command_name(args: argparse.Namespace) -> str:
    """``fedmf``, ``bench fedslate``: the chosen command as typed."""
    group = registry.COMMANDS[args.command]
    return f"{args.command} {getattr(args, args.command)}" if group.subcommands else args.command


if __name__ == "__main__":
    sys.exit(main())
