"""``securefed bench startup``: how long the command line takes to start.

::

    securefed bench startup                    # median of 5 fresh processes each
    securefed bench startup --repeats 9 --out results/startup

Times each command in a fresh interpreter (a new process per run, so nothing is cached in memory
beyond what the operating system keeps): ``securefed --help``, ``securefed fedmf --help``,
``securefed fedslate --help``, ``securefed privacy noise --help`` and ``python -c "import
securefed"`` against the goal (under 1 s on the development machine); and, without a goal, one
accounting computation, ``securefed privacy noise`` (dp-accounting's RDP, no torch). Lists which
heavy optional modules each help screen imports (none is the design:
:mod:`securefed.bench.registry`), and writes ``startup.json`` to ``--out``, with the load
average before and after.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from securefed.bench.registry import BENCHES
from securefed.records import dumps_record

GOAL_SECONDS = 1.0
"""The start-up goal of every timed command (issue 16)."""
RESULTS = Path("results") / "startup"
HEAVY_MODULES = (
    "torch",
    "gymnasium",
    "scipy.stats",
    "sklearn",
    "tenseal",
    "opacus",
    "flwr",
    "matplotlib",
    "dp_accounting",
)
"""Optional or slow modules that a help screen should not need."""

_RUN_CLI = "import sys; from securefed.bench.cli import main; sys.exit(main(sys.argv[1:]))"
_LOADED_BY_CLI = (
    "import contextlib, io, sys\n"
    "from securefed.bench.cli import main\n"
    "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
    "    main(sys.argv[2:])\n"
    "heavy = sys.argv[1].split(',')\n"
    "print(','.join(m for m in heavy if m in sys.modules))\n"
)


def cli_command(python: str) -> list[str]:
    """How to start ``securefed``: the console script beside ``python``, else ``python -c``."""
    script = Path(python).with_name("securefed")
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [python, "-c", _RUN_CLI]


HELP_SCREENS = (
    ("--help",),
    ("fedmf", "--help"),
    ("fedslate", "--help"),
    ("privacy", "noise", "--help"),
)
"""The help screens timed against the goal, and checked for heavy imports."""
ACCOUNTING = ("privacy", "noise", "--epsilon", "8", "--sample-rate", "0.01", "--rounds", "1000",
              "--delta", "1e-5")  # fmt: skip
"""One accounting computation, timed without a goal (it imports dp-accounting and scipy)."""


def help_screens() -> tuple[tuple[str, ...], ...]:
    """:data:`HELP_SCREENS` whose commands can run here: a command whose extra is missing
    (``fedslate`` without ``rl``) answers in one line and exit 2 by design, so it is left out
    (:func:`skipped_screens` names it in the record)."""
    return tuple(args for args in HELP_SCREENS if not _missing_extras(args))


def skipped_screens() -> dict[str, str]:
    """The help screens left out here, with the extras they need."""
    return {
        f"securefed {' '.join(args)}": "needs the extra(s) " + ", ".join(_missing_extras(args))
        for args in HELP_SCREENS
        if _missing_extras(args)
    }


def _missing_extras(args: Sequence[str]) -> tuple[str, ...]:
    from securefed.bench.registry import COMMANDS

    command = COMMANDS.get(args[0])
    return () if command is None else command.missing_extras()


def timed_commands(python: str) -> dict[str, list[str]]:
    """The commands timed against the goal, by the name they are reported under."""
    cli = cli_command(python)
    timed = {f"securefed {' '.join(args)}": [*cli, *args] for args in help_screens()}
    return timed | {"import securefed": [python, "-c", "import securefed"]}


def time_command(argv: Sequence[str], repeats: int) -> list[float]:
    """Wall seconds of ``repeats`` fresh runs of ``argv``.

    Raises:
        ValueError: ``repeats < 1``.
        RuntimeError: a run exited non-zero (naming its last line on stderr).
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        done = subprocess.run(list(argv), capture_output=True, text=True, check=False)
        seconds.append(time.perf_counter() - start)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {last}")
    return seconds


def heavy_modules_loaded(python: str, cli_args: Sequence[str]) -> list[str]:
    """Which of :data:`HEAVY_MODULES` ``securefed CLI_ARGS`` imports (one fresh process)."""
    argv = [python, "-c", _LOADED_BY_CLI, ",".join(HEAVY_MODULES), *cli_args]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"listing the modules of securefed {' '.join(cli_args)} failed")
    lines = done.stdout.strip().splitlines()
    return [m for m in (lines[-1] if lines else "").split(",") if m]


def measure(repeats: int, python: str = sys.executable) -> dict[str, object]:
    """The start-up record: per command its runs, median and whether it meets the goal."""
    load_before = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    timings = {}
    commands = timed_commands(python)
    commands[f"securefed {' '.join(ACCOUNTING)}"] = [*cli_command(python), *ACCOUNTING]
    for name, argv in commands.items():
        runs = time_command(argv, repeats)
        median = statistics.median(runs)
        goal = name != f"securefed {' '.join(ACCOUNTING)}"
        timings[name] = {
            "command": argv,
            "seconds": runs,
            "median_seconds": median,
            "under_goal": (median < GOAL_SECONDS) if goal else None,
        }
    return {
        "goal_seconds": GOAL_SECONDS,
        "repeats": repeats,
        "timings": timings,
        "heavy_modules_loaded": {
            f"securefed {' '.join(args)}": heavy_modules_loaded(python, list(args))
            for args in help_screens()
        },
        "skipped": skipped_screens(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_average": load_before,
        "load_average_after": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def report(record: dict[str, object]) -> str:
    """The printed table: one line per command, its median beside the goal."""
    goal = record["goal_seconds"]
    lines = [
        f"securefed start-up: median of {record['repeats']} fresh processes "
        f"(goal: under {goal:g} s)"
    ]
    for name, timing in record["timings"].items():
        verdict = {True: "meets the goal", False: "OVER the goal", None: "(no goal)"}
        lines.append(
            f"  {name:<32} {timing['median_seconds']:6.3f} s   {verdict[timing['under_goal']]}"
        )
    for name, why in record.get("skipped", {}).items():
        lines.append(f"  {name:<32} skipped: {why}")
    for name, modules in record["heavy_modules_loaded"].items():
        loaded = ", ".join(modules) if modules else "none of " + ", ".join(HEAVY_MODULES)
        lines.append(f"  {name} imports {loaded}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    record = measure(args.repeats)
    print(report(record))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "startup.json").write_text(dumps_record(record, indent=1))
    print(f"written to {out / 'startup.json'}")
    return 0


def register(benches) -> None:
    """Add ``startup`` to the ``securefed bench`` subcommands."""
    parser = BENCHES["startup"].add_to(benches)
    parser.add_argument("--repeats", type=int, default=5, help="fresh processes per command")
    parser.add_argument("--out", default=str(RESULTS), help="directory for startup.json")
    parser.set_defaults(func=run)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m securefed.bench.bench_startup")
    register(parser.add_subparsers(dest="bench", required=True))
    args = parser.parse_args(["startup", *(sys.argv[1:] if argv is None else argv)])
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
