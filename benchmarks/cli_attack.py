"""``securefed attack VIEW_DIR --truth DATA``: attack a saved ServerView after the run.

The view (``securefed fedmf --save-view DIR``) is loaded with its digest checked
(:meth:`securefed.views.ServerView.load`), every attack that applies runs on it
(:func:`securefed.attacks.verify.verify`), and the result is scored against the truth: the
training ratings of the run, rebuilt from the data set and the loader options the view records.
A view saved by ``securefed fedmf`` records, in ``view.public["data"]`` (public names only, no
rating): the data set's name, the source as given, the source's SHA-256
(:func:`~securefed.bench.datasets.source_sha256`) and every option the loader read it with
(``loader``: split, split seed, scale, duplicates policy, ... as
:class:`~securefed.bench.datasets.LoaderOptions`, which rebuilds the ratings from them; an
option the loader gains travels without a change here). ``--truth`` says where the data set is
now (a name such as ``ml-100k`` or a path); a source whose digest differs from the recorded one
is refused, naming both digests. ``--split``, ``--split-seed``, ``--scale`` and
``--duplicates`` give the options of a view that does not record them (one saved before they
were recorded); one that contradicts the view is refused. A truth whose name, users or items do
not match the view is refused too: a score against the wrong ratings would mean nothing.

Output: a table of each measure beside its chance baseline on standard output, and with
``--json`` the whole report (:meth:`~securefed.attacks.verify.LeakReport.to_dict`, without the
per-user arrays unless ``--per-user``).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from securefed.bench import registry
from securefed.bench.tables import markdown_table
from securefed.records import dumps_record

HEADLINE = (
    ("exact_share", "ratings recovered exactly (share)"),
    ("rmse", "RMSE of the recovered ratings"),
    ("precision", "rated items: precision"),
    ("recall", "rated items: recall"),
    ("f1", "rated items: F1"),
)
"""The measures the table shows, with the words it shows them under."""

PER_USER_KEYS = ("users", "method", "per_user", "baseline_per_user", "recovered")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = registry.COMMANDS["attack"].add_to(subparsers)
    parser.add_argument("view", metavar="VIEW_DIR", help="a saved ServerView directory")
    parser.add_argument(
        "--truth",
        required=True,
        metavar="DATA",
        help="the run's data set: ml-latest-small (embedded), ml-100k, or a ratings file/dir",
    )
    parser.add_argument(
        "--split",
        default=None,
        help="the run's split (default: the one the view records, else the data set's default)",
    )
    parser.add_argument(
        "--split-seed",
        type=int,
        default=None,
        help="seed of the run's random split (default: the one the view records, else 0)",
    )
    parser.add_argument(
        "--scale",
        default=None,
        metavar="MIN:MAX:STEP",
        help="the run's rating scale (default: the one the view records, else the format's own)",
    )
    parser.add_argument(
        "--duplicates",
        default=None,
        choices=["error", "first", "last", "mean"],
        help="the run's policy for repeated (user, item) pairs (default: the one the view "
        "records, else error)",
    )
    parser.add_argument(
        "--rounds",
        default=None,
        metavar="T1,T2",
        help="the two consecutive rounds to attack (default: the last such pair the view kept)",
    )
    parser.add_argument(
        "--view-key-file",
        default=None,
        help="file (mode 0600) holding the HMAC key the view was saved with (default: unkeyed)",
    )
    parser.add_argument("--json", default=None, metavar="PATH", help="write the report here")
    parser.add_argument(
        "--per-user", action="store_true", help="also write per-user arrays into --json"
    )
    parser.set_defaults(func=run_attack)


def parse_rounds(text: str | None) -> tuple[int, int] | None:
    """``"4,5"`` -> ``(4, 5)``; ``None`` -> ``None``.

    Raises:
        ValueError: anything but two integers separated by a comma.
    """
    if text is None:
        return None
    parts = text.split(",")
    try:
        first, second = (int(p) for p in parts)
    except ValueError:
        raise ValueError(f"--rounds must be two round ids T1,T2, got {text!r}") from None
    return first, second


OVERRIDES = {
    "--split": "split",
    "--split-seed": "seed",
    "--scale": "scale",
    "--duplicates": "duplicates",
}
"""The command's options that give a loader option (a ``LoaderOptions`` field) a view lacks."""

LEGACY_KEYS = {"split": "split", "split_seed": "seed"}
"""What a view saved before ``loader`` was recorded kept of it, and the options they are."""


def recorded_loader(recorded: dict[str, object]) -> dict[str, object]:
    """The loader options a view's ``data`` entry records."""
    if isinstance(recorded.get("loader"), dict):
        return dict(recorded["loader"])
    return {option: recorded[key] for key, option in LEGACY_KEYS.items() if key in recorded}


def given_loader(args: argparse.Namespace) -> dict[str, object]:
    """The loader options given on the command line (``None``: not given)."""
    return {name: getattr(args, flag[2:].replace("-", "_")) for flag, name in OVERRIDES.items()}


def truth_for(view, data: str, given: dict[str, object]):
    """The training ratings of the run that wrote ``view``, and the data's description.

    Args:
        view: the loaded view.
        data: where the data set is (``--truth``).
        given: loader options given on the command line (``LoaderOptions`` field names; ``None``
            for an option not given).

    Raises:
        ValueError: a given option that contradicts the view, a source whose SHA-256 is not the
            recorded one, or a truth whose users or items do not match the view's protocol.
    """
    from securefed.bench import datasets

    recorded = view.public.get("data")
    recorded = recorded if isinstance(recorded, dict) else {}
    options = recorded_loader(recorded)
    for flag, name in OVERRIDES.items():
        value = given.get(name)
        if value is None:
            continue
        if name in options and options[name] != value:
            raise ValueError(
                f"{flag} {value!r} contradicts the view, whose run read its data with {name} "
                f"{options[name]!r}: scores against other ratings would mean nothing"
            )
        options[name] = value
    loader = datasets.LoaderOptions.from_dict(options)
    expected = recorded.get("source_sha256")
    if expected is not None:
        found = datasets.source_sha256(data)
        if found != expected:
            raise ValueError(
                f"the truth {data!r} has SHA-256 {found}, but the view's run read "
                f"{recorded.get('source')!r} with SHA-256 {expected}: not the file the run "
                "trained on (changed since, or another one), so its scores would mean nothing"
            )
    loaded = datasets.load_with(data, loader)
    if "name" in recorded and loaded.name != recorded["name"]:
        raise ValueError(
            f"the truth is {loaded.name!r} but the view's run trained on {recorded['name']!r}"
        )
    n_users, n_items = view.public.get("n_users"), view.public.get("n_items")
    if (n_users, n_items) != (loaded.train.n_users, loaded.train.n_items):
        raise ValueError(
            f"the truth {loaded.name!r} (split seed {loader.seed}) has {loaded.train.n_users} "
            f"users and {loaded.train.n_items} items, the view's protocol {n_users} and "
            f"{n_items}: not the run's training ratings (give the run's data set and loader "
            "options: --split, --split-seed, --scale, --duplicates)"
        )
    described = {
        "data": loaded.name,
        "split_seed": loader.seed,
        "loader": loader.to_dict(),
        "source_sha256": expected,
        "recorded": recorded,
    }
    return loaded.train, described


def format_value(value: object) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def table(report: dict[str, object]) -> str:
    """The headline measures beside their chance baseline, as a markdown table."""
    overall, baseline = report["overall"], report["baseline"]
    return markdown_table(
        ("measure", "attack", "chance"),
        (
            (words, format_value(overall[key]), format_value(baseline.get(key)))
            for key, words in HEADLINE
            if key in overall
        ),
    )


def run_attack(args: argparse.Namespace) -> int:
    from securefed.attacks.verify import verify
    from securefed.integrity import read_key_file
    from securefed.views import ServerView

    key = read_key_file(args.view_key_file) if args.view_key_file else None
    view = ServerView.load(args.view, key=key)
    truth, described = truth_for(view, args.truth, given_loader(args))
    report = verify(view, truth, rounds=parse_rounds(args.rounds)).to_dict()
    if not args.per_user:
        report = {k: v for k, v in report.items() if k not in PER_USER_KEYS}
    report |= {"view": str(args.view), "truth": described}
    print(
        f"view {args.view} ({report['transport']}), rounds {report['rounds']}, "
        f"truth {described['data']} (split seed {described['split_seed']})"
    )
    print(f"attacks applied: {', '.join(report['attacks_applied']) or 'none'}")
    print(table(report))
    for note in report["notes"]:
        print(f"note: {note}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(dumps_record(report, indent=1) + "\n")
    return 0
