"""``securefed privacy``: epsilon of a noise schedule, or the noise a target epsilon needs.

::

    securefed privacy epsilon --noise-multiplier 1.0 --sample-rate 0.01 --rounds 1000 \\
        --delta 1e-5 [--accountant rdp|prv] [--json]
    securefed privacy noise --epsilon 8 --delta 1e-5 --sample-rate 0.01 --rounds 1000 \\
        [--accountant rdp|prv] [--json]

The main CLI calls :func:`register` with its subparsers; each leaf parser sets ``func`` (a
callable taking the parsed namespace and returning an exit code). :func:`main` runs this
command group on its own (tests, ``python -m securefed.bench.cli_privacy``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from securefed.bench.registry import COMMANDS
from securefed.privacy.calibration import epsilon_for_schedule, noise_for_target
from securefed.privacy.ledger import ACCOUNTANT_SAMPLING, ACCOUNTANTS
from securefed.records import dumps_record


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sample-rate",
        type=float,
        required=True,
        help="Poisson sampling rate q (clients per round / all clients)",
    )
    parser.add_argument("--rounds", type=int, required=True, help="noisy rounds (accountant steps)")
    parser.add_argument("--delta", type=float, required=True, help="target delta")
    parser.add_argument(
        "--accountant", choices=ACCOUNTANTS, default="rdp", help="Opacus accountant (default: rdp)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``privacy`` command (with ``epsilon`` and ``noise``) to ``subparsers``."""
    privacy = COMMANDS["privacy"].add_to(
        subparsers,
        description="Client-level DP accounting on Opacus's accountants "
        "(Poisson sampling assumed).",
    )
    actions = privacy.add_subparsers(dest="privacy_command", required=True)
    epsilon = actions.add_parser("epsilon", help="epsilon spent by a noise schedule")
    epsilon.add_argument(
        "--noise-multiplier", type=float, required=True, help="noise std on the sum / clip norm"
    )
    _common(epsilon)
    epsilon.set_defaults(func=_run_epsilon)
    noise = actions.add_parser("noise", help="noise multiplier for a target epsilon")
    noise.add_argument("--epsilon", type=float, required=True, help="target epsilon")
    _common(noise)
    noise.set_defaults(func=_run_noise)
    return privacy


def _schedule(args: argparse.Namespace) -> dict[str, object]:
    return {
        "sample_rate": args.sample_rate,
        "rounds": args.rounds,
        "delta": args.delta,
        "accountant": args.accountant,
        "sampling": ACCOUNTANT_SAMPLING,
    }


def _emit(args: argparse.Namespace, record: dict[str, object], line: str) -> int:
    print(dumps_record(record) if args.json else line)
    return 0


def _fail(error: ValueError) -> int:
    print(f"securefed privacy: error: {error}", file=sys.stderr)
    return 2


def _run_epsilon(args: argparse.Namespace) -> int:
    try:
        eps = epsilon_for_schedule(
            args.noise_multiplier, args.sample_rate, args.rounds, args.delta, args.accountant
        )
    except ValueError as error:
        return _fail(error)
    record = {"noise_multiplier": args.noise_multiplier, **_schedule(args), "epsilon": eps}
    line = (
        f"epsilon = {eps:.4f} at delta {args.delta:g} ({args.accountant}, noise multiplier "
        f"{args.noise_multiplier:g}, sample rate {args.sample_rate:g}, {args.rounds} rounds, "
        f"{ACCOUNTANT_SAMPLING} sampling)"
    )
    return _emit(args, record, line)


def _run_noise(args: argparse.Namespace) -> int:
    try:
        sigma = noise_for_target(
            args.epsilon, args.delta, args.sample_rate, args.rounds, args.accountant
        )
    except ValueError as error:
        return _fail(error)
    achieved = epsilon_for_schedule(
        sigma, args.sample_rate, args.rounds, args.delta, args.accountant
    )
    record = {
        "target_epsilon": args.epsilon,
        **_schedule(args),
        "noise_multiplier": sigma,
        "epsilon": achieved,
    }
    line = (
        f"noise multiplier = {sigma:.4f} (epsilon {achieved:.4f} <= target {args.epsilon:g} at "
        f"delta {args.delta:g}; {args.accountant}, sample rate {args.sample_rate:g}, "
        f"{args.rounds} rounds, {ACCOUNTANT_SAMPLING} sampling)"
    )
    return _emit(args, record, line)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``privacy ...`` on its own: ``main(["privacy", "epsilon", ...])``.

    Bad values end with exit code 2 and a message on stderr (argparse's own errors exit with
    ``SystemExit(2)``).
    """
    parser = argparse.ArgumentParser(prog="securefed")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
