"""``securefed attack VIEW_DIR --truth DATA``: attack a saved ServerView after the run.

The view (``securefed fedmf --save-view DIR``) is loaded with its digest checked
(:meth:`securefed.views.ServerView.load`), every attack that applies runs on it
(:func:`securefed.attacks.verify.verify`), and the result is scored against the truth: the
training ratings of the run, rebuilt from the data set and the split the view names. A view
saved by ``securefed fedmf`` records its data set's name, split and split seed
(``view.public["data"]``, public names only); ``--split`` and ``--split-seed`` give them for a
view that does not, and one that contradicts the view is refused. ``--truth`` says where the data
set is (a name such as ``ml-100k`` or a path). A truth whose name, users or items do not match
the view is refused too: a score against the wrong ratings would mean nothing.

Output: a table of each measure beside its chance baseline on standard output, and with
``--json`` the whole report (:meth:`~securefed.attacks.verify.LeakReport.to_dict`, without the
per-user arrays unless ``--per-user``).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from securefed.bench import registry
from securefed.bench.tables import markdown_table

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
        "--rounds",
        default=None,
        metavar="T1,T2",
        help="the two consecutive rounds to attack (default: the last such pair the view kept)",
    )
    parser.add_argument(
        "--view-key-file",
        default=None,
        help="file holding the HMAC key the view was saved with (default: an unkeyed digest)",
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


def truth_for(view, data: str, split: str | None, split_seed: int | None):
    """The training ratings of the run that wrote ``view``, and the data's description.

    Raises:
        ValueError: the truth's users or items do not match the view's protocol.
    """
    from securefed.bench import datasets

    recorded = view.public.get("data")
    recorded = recorded if isinstance(recorded, dict) else {}
    for option, given, name in (
        ("--split", split, "split"),
        ("--split-seed", split_seed, "split_seed"),
    ):
        if given is not None and name in recorded and given != recorded[name]:
            raise ValueError(
                f"{option} {given!r} contradicts the view, whose run used {name} "
                f"{recorded[name]!r}: scores against another split's ratings would mean nothing"
            )
    split = split if split is not None else recorded.get("split")
    seed = split_seed if split_seed is not None else int(recorded.get("split_seed", 0))
    loaded = datasets.load(data, split, seed=seed)
    if "name" in recorded and loaded.name != recorded["name"]:
        raise ValueError(
            f"the truth is {loaded.name!r} but the view's run trained on {recorded['name']!r}"
        )
    n_users, n_items = view.public.get("n_users"), view.public.get("n_items")
    if (n_users, n_items) != (loaded.train.n_users, loaded.train.n_items):
        raise ValueError(
            f"the truth {loaded.name!r} (split seed {seed}) has {loaded.train.n_users} users and "
            f"{loaded.train.n_items} items, the view's protocol {n_users} and {n_items}: not the "
            "run's training ratings (give the run's data set, --split and --split-seed)"
        )
    return loaded.train, {"data": loaded.name, "split_seed": seed, "recorded": recorded}


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
    from securefed.views import ServerView

    key = Path(args.view_key_file).read_bytes() if args.view_key_file else None
    view = ServerView.load(args.view, key=key)
    truth, described = truth_for(view, args.truth, args.split, args.split_seed)
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
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0
