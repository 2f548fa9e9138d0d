"""What ``securefed`` can run, known without importing it.

The command line lists every subcommand and benchmark from the static tables here
(:data:`COMMANDS`, :data:`BENCHES`): a name, its one-line help, the ``module:function`` that adds
its own parser, and the pip extras it needs. A command's module, and so torch, gymnasium,
tenseal or Flower, is imported only once that command is chosen on the command line, and only
after its extras were found installed; otherwise :class:`ExtraNotInstalled` names the extra to
install. So ``securefed --help`` and ``securefed fedmf --help`` import numpy and argparse, and
``securefed bench NAME --help`` still shows NAME's options.

A module's ``register(subparsers)`` adds its commands with :meth:`Command.add_to`, which takes the
help line from the table: the table is the one place that names and describes them.
"""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import import_module

EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "he": ("tenseal",),
    "torch": ("torch",),
    "dp": ("dp_accounting",),
    "dp-torch": ("dp_accounting", "opacus", "torch"),
    "rl": ("torch", "gymnasium", "sklearn"),
    "flower": ("flwr",),
}
"""The import names that each pip extra of securefed brings (pyproject.toml's
``optional-dependencies``): an extra counts as installed when all of them can be found."""


class ExtraNotInstalled(ImportError):
    """A chosen command needs a pip extra that is not installed here."""

    def __init__(self, command: str, extras: Sequence[str]) -> None:
        self.command, self.extras = command, tuple(extras)
        named = " and ".join(repr(e) for e in self.extras)
        noun = "extra" if len(self.extras) == 1 else "extras"
        super().__init__(
            f"{command} needs the {named} {noun}: pip install 'securefed[{','.join(self.extras)}]'"
        )


def extra_of_module(name: str | None) -> str | None:
    """The first extra that brings the top-level module of ``name`` (``None``: none does)."""
    top = (name or "").partition(".")[0]
    return next((extra for extra, names in EXTRA_MODULES.items() if top in names), None)


def extra_installed(extra: str) -> bool:
    """Whether every module of ``extra`` can be found (nothing is imported)."""
    return all(importlib.util.find_spec(name) is not None for name in EXTRA_MODULES[extra])


@dataclass(frozen=True)
class Command:
    """A subcommand (or a benchmark, or a group of them) listed without importing its module.

    Attributes:
        name: as typed on the command line.
        help: the one-line help shown in the listing (and as the description of its parser).
        register: ``"module:function"``: the function takes the subparsers action and adds this
            command's parser (it may add the other commands of its module too). Empty for a group.
        extras: the pip extras it needs (keys of :data:`EXTRA_MODULES`).
        subcommands: a group's commands (``bench``), chosen by the next word.
    """

    name: str
    help: str
    register: str = ""
    extras: tuple[str, ...] = ()
    subcommands: tuple[Command, ...] = ()

    def __post_init__(self) -> None:
        if not self.name or self.name.startswith("-") or " " in self.name:
            raise ValueError(f"a command name must be one word, got {self.name!r}")
        if bool(self.subcommands) == bool(self.register):
            raise ValueError(f"command {self.name!r} needs either register or subcommands")
        module, _, function = self.register.partition(":")
        if self.register and not (module and function):
            raise ValueError(f"register must read 'module:function', got {self.register!r}")
        unknown = [e for e in self.extras if e not in EXTRA_MODULES]
        if unknown:
            raise ValueError(f"command {self.name!r}: unknown extras {unknown}")

    def missing_extras(self) -> tuple[str, ...]:
        """The extras of this command that are not installed here."""
        return tuple(e for e in self.extras if not extra_installed(e))

    def add_to(
        self, subparsers: argparse._SubParsersAction, description: str | None = None
    ) -> argparse.ArgumentParser:
        """Add this command's parser to ``subparsers``, with the table's help line."""
        return subparsers.add_parser(
            self.name, help=self.help, description=description or self.help
        )

    def load_register(self) -> Callable[[argparse._SubParsersAction], object]:
        """Import the module and return its register function.

        Raises:
            ExtraNotInstalled: when the import fails on a module that an extra brings.
        """
        module, _, function = self.register.partition(":")
        try:
            return getattr(import_module(module), function)
        except ModuleNotFoundError as error:
            extra = extra_of_module(error.name)
            if extra is None:
                raise
            raise ExtraNotInstalled(self.name, (extra,)) from error


def _table(*commands: Command) -> dict[str, Command]:
    table = {c.name: c for c in commands}
    if len(table) != len(commands):
        raise ValueError("command names must be unique within a table")
    return table


_FEDMF = "securefed.bench.bench_fedmf:register"
_CKKS = "securefed.bench.bench_ckks:register"
_FEDHPD = "securefed.bench.bench_fedhpd:register"

BENCHES: dict[str, Command] = _table(
    Command("fedmf-splits", "FedMF/FedRec/FedRec+ on ML-100K u1..u5", _FEDMF),
    Command("fedmf-transport", "a transport against plaintext", _FEDMF),
    Command("fedrec-weights", "FedRec+ client weightings compared", _FEDMF),
    Command("fedmf-dp", "FedMF test RMSE per epsilon and placement", _FEDMF, ("dp",)),
    Command(
        "ddp-vs-central",
        "FedMF: distributed discrete Gaussian under secagg vs central DP",
        "securefed.bench.bench_ddp:register",
        ("dp",),
    ),
    Command(
        "frontier",
        "test RMSE against epsilon: DP-ALS, FedMF dp-biased, private biases (secagg+dp)",
        "securefed.bench.bench_frontier:register",
        ("dp",),
    ),
    Command("fedmf-perf", "round vs centralised step; scale", _FEDMF),
    Command(
        "fedmf-vs-centralised",
        "biased FedMF vs Surprise SVD and the damped baseline: RMSE and time",
        "securefed.bench.bench_centralised:register",
    ),
    Command(
        "leak-utility",
        "leak versus utility, every variant x transport",
        "securefed.bench.leak_utility:register",
    ),
    Command(
        "privacy-audit",
        "measured epsilon lower bounds (canaries, one run) beside the ledger's",
        "securefed.bench.bench_privacy_audit:register",
        ("dp",),
    ),
    Command(
        "privacy-audit-whitebox",
        "white-box canaries: Gaussian-DP estimates catch DP faults, over many seeds",
        "securefed.bench.bench_privacy_audit_whitebox:register",
        ("dp",),
    ),
    Command("ckks-fusion", "CKKS vs plaintext fused outputs", _CKKS, ("he",)),
    Command("ckks-training", "fusion training under CKKS vs plaintext", _CKKS, ("he",)),
    Command("ckks-fedmf-round", "cost of a FedMF round under CKKS", _CKKS, ("he",)),
    Command(
        "fusion-step",
        "a FedSlate learning step under CKKS vs plaintext; 200-episode curves",
        "securefed.bench.bench_fusion_step:register",
        ("rl", "he"),
    ),
    Command("fedhpd", "FedHPD: the paper's Table 2 column of a task", _FEDHPD, ("rl",)),
    Command("fedhpd-speed", "FedHPD: fast learner vs step-by-step", _FEDHPD, ("rl",)),
    Command(
        "fedslate",
        "FedSlate's tables on the choc-vs-kale simulator",
        "securefed.bench.bench_fedslate:register",
        ("rl",),
    ),
    Command(
        "fedslate-leak",
        "FedSlate behind every fusion transport: rewards, cost and leak measures",
        "securefed.bench.bench_fedslate_leak:register",
        ("rl",),
    ),
    Command(
        "rl-leak",
        "attacks on FedHPD uploads and FedSlate Q-values",
        "securefed.bench.bench_rl_leak:register",
        ("rl",),
    ),
    Command(
        "flower",
        "FedMF on Flower's simulation engine vs in-process (time, secagg, RMSE)",
        "securefed.bench.bench_flower:register",
        ("flower",),
    ),
    Command(
        "secagg-malicious",
        "secure aggregation against a lying server: cost beside honest-but-curious and the floor",
        "securefed.bench.bench_secagg:register",
    ),
    Command(
        "scale",
        "FedMF rounds from 10^3 to 10^6 users, 10^3 sampled: CPU, memory, bytes vs floors",
        "securefed.bench.bench_scale:register",
    ),
    Command(
        "discrete-sampler",
        "exact discrete Gaussian samplers (inversion, CKS rejection) beside float and Skellam",
        "securefed.bench.bench_discrete_sampler:register",
    ),
    Command(
        "startup",
        "start-up time of the command line and of `import securefed`",
        "securefed.bench.bench_startup:register",
    ),
)
"""``securefed bench NAME``: every benchmark, in listing order."""

COMMANDS: dict[str, Command] = _table(
    Command(
        "fedmf",
        "train one FedMF-family model and evaluate it",
        "securefed.bench.cli:_add_fedmf",
    ),
    Command("demo", "the main job, small: leak versus utility", "securefed.bench.cli:_add_demo"),
    Command("bench", "benchmarks and paper tables", subcommands=tuple(BENCHES.values())),
    Command(
        "attack",
        "attack a saved ServerView and score it against the run's data",
        "securefed.bench.cli_attack:register",
    ),
    Command(
        "privacy",
        "DP accounting: epsilon of a schedule, noise for a target",
        "securefed.bench.cli_privacy:register",
        ("dp",),
    ),
    Command(
        "fedhpd",
        "heterogeneous federated policy distillation (FedHPD) and its baselines",
        "securefed.bench.cli_fedhpd:register",
        ("rl",),
    ),
    Command(
        "fedslate",
        "train FedSlate (or SlateQ) on the multi-platform choc-vs-kale simulator",
        "securefed.bench.cli_fedslate:register",
        ("rl",),
    ),
)
"""``securefed NAME``: every subcommand, in listing order."""


def first_word(argv: Sequence[str]) -> int | None:
    """The index of the first word of ``argv`` that is not an option (``None``: there is none).

    Valid where the parser being chosen for takes no option with a value (``securefed`` and
    ``securefed bench`` take only ``--help``), so the first such word names the subcommand.
    """
    return next((i for i, word in enumerate(argv) if not word.startswith("-")), None)


def add_commands(
    subparsers: argparse._SubParsersAction,
    table: Mapping[str, Command],
    argv: Sequence[str],
    prefix: str = "",
) -> tuple[Command, ...]:
    """Add every command of ``table``: the one ``argv`` chooses in full, the others as stubs.

    A stub is a parser with the command's help line and no arguments: the listing shows it, and
    nothing of its module is imported. The chosen command's register function adds its real
    parser (a group recurses into its subcommands with the rest of ``argv``).

    Args:
        subparsers: where to add them.
        table: the commands, in listing order.
        argv: the words after the parent command.
        prefix: the parent commands' names, for messages (``"bench"``).

    Returns:
        The chosen commands from this level down (empty when ``argv`` names none of ``table``).

    Raises:
        ExtraNotInstalled: the chosen command needs an extra that is not installed.
        RuntimeError: a register function did not add the command the table says it adds.
    """
    index = first_word(argv)
    chosen = table.get(argv[index]) if index is not None else None
    path: tuple[Command, ...] = ()
    if chosen is not None:
        full_name = f"{prefix} {chosen.name}".strip()
        missing = chosen.missing_extras()
        if missing:
            raise ExtraNotInstalled(full_name, missing)
        if chosen.subcommands:
            group = chosen.add_to(subparsers).add_subparsers(
                dest=chosen.name, required=True, metavar=chosen.name.upper()
            )
            inner = _table(*chosen.subcommands)
            path = (chosen, *add_commands(group, inner, argv[index + 1 :], full_name))
        else:
            try:
                chosen.load_register()(subparsers)
            except ExtraNotInstalled as error:
                raise ExtraNotInstalled(full_name, error.extras) from error.__cause__
            if chosen.name not in subparsers.choices:
                raise RuntimeError(f"{chosen.register} did not add the command {chosen.name!r}")
            path = (chosen,)
    for command in table.values():
        if command.name not in subparsers.choices:
            subparsers.add_parser(command.name, help=command.help)
    return path
