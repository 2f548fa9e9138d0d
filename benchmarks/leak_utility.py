"""Leak versus utility: train a model over each transport, attack every view.

The model and the attacks are plug-ins (:mod:`securefed.bench.plugins`): FedMF's variants with
:func:`securefed.attacks.verify` by default, or any registered model (``--model``) with its
attacks (``--attacks``). For every (variant, transport) cell: build the model's
FederatedAlgorithm, train it on the training split, measure its utility (FedMF: test RMSE/MAE),
then hand the ServerView of the last two rounds to every attack and keep what each measures
beside its chance baseline (FedMF's gradient inversion: share of ratings recovered exactly,
rating-recovery RMSE, rated-item precision/recall/F1). A transport that cannot run here appears
as a row that says why; an unknown transport, model, attack or variant is refused before any cell
runs (on the command line, a usage error: exit 2). Output: ``leak_utility.json``,
``leak_utility.md`` and ``leak_utility.png`` in ``--out``.

Transport specs: a registered name (``plaintext``, ``secagg``, ``ckks``, ...) optionally with
``:EPS``, the run's target epsilon for a DP one: ``dp:EPS`` (central DP), ``secagg+dp:EPS``
(distributed DP under secure aggregation), ``dp-local:EPS``, ``ckks+dp:EPS``.

Cost. Secure aggregation and CKKS compute the same sums as plaintext at a far higher cost (CKKS:
tens of seconds per ML-100K round), and the attacks read only the last two rounds. So by default
(``transport_rounds=2``) a hiding transport's cell runs its first ``rounds - 2`` rounds over the
clear counterpart (plaintext; for ``secagg+dp`` the same distributed noise, charged to the same
ledger) and its last two rounds through the transport itself: the attacked view is exactly what
that transport shows, and the model equals the all-rounds one up to the transport's numerical
error (``securefed bench fedmf-transport`` measures it: RMSE differences below 1e-4).
``transport_rounds=0`` runs every round through the transport.

FedMF's DP cells train :func:`securefed.recsys.fedmf.user_level_dp_config` (fixed-denominator
aggregation, user-mean offset): the per-item mean of the other cells diverges under DP noise.
FedRec+ there uses uniform client weights (its Wasserstein weights need statistics rows that this
aggregation does not send).
"""

from __future__ import annotations

import argparse
import multiprocessing
import textwrap
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from securefed import RoundSelection, RunOptions, SecurefedError, SeedTree, TransportUnavailable
from securefed import run_rounds as _run_rounds
from securefed.bench import datasets
from securefed.bench.data_options import add_layout_arguments
from securefed.bench.experiment import WARM_START_TRANSPORT, save_json, warm_start_transport
from securefed.bench.plugins import (
    AttackPlugin,
    CellContext,
    ModelPlugin,
    attack_names,
    attack_plugin,
    model_names,
    model_plugin,
)
from securefed.bench.processes import map_in_processes
from securefed.bench.registry import BENCHES
from securefed.bench.tables import markdown_table
from securefed.recsys.data import Split, densest_split
from securefed.transport import (
    build_transport,
    option_groups,
    parse_transport_spec,
    resolve_options,
    transport_names,
)

DEFAULT_TRANSPORTS = "plaintext,secagg,ckks,dp:1,dp:4,dp:16,secagg+dp:4"


@dataclass(frozen=True)
class LeakUtilityConfig:
    """What the benchmark runs.

    Attributes:
        data: data set (``ml-latest-small`` embedded, ``ml-100k``, or a path).
        split: split name (``u1`` for ML-100K; random otherwise).
        sep, columns, ids: the layout of a ratings file of yours
            (:func:`securefed.recsys.data.read_ratings_file`; ``--sep``, ``--columns``,
            ``--ids``).
        rounds: training rounds of every cell.
        variants: the model's variants (``None``: all of the model's, FedMF's are ``fedmf``,
            ``fedrec``, ``fedrec+``).
        transports: transport specs (module docstring).
        seed: the run seed.
        max_users, max_items: keep only the most active users / most rated items (0: all), to
            make a small version (the demo).
        dp_clip: per-client L2 clip of the DP transports.
        transport_rounds: rounds at the end of a hiding transport's run that go through it (the
            others over its clear counterpart; module docstring); 0: every round.
        extra_config: the model's options of the non-DP cells (FedMF: FedMFConfig overrides).
        dp_config: the model's options of the DP cells (FedMF: overrides of
            :func:`securefed.recsys.fedmf.user_level_dp_config`).
        workers: cells trained at once, each in its own process (one core each).
        model: the model plug-in (:mod:`securefed.bench.plugins`; ``fedmf`` built in).
        attacks: the attack plug-ins run on every view (``None``: the model's own).

    Raises:
        ValueError: an unknown transport, model, attack or variant (naming the known ones), or
            a schedule the attack cannot read.
    """

    data: str = "ml-latest-small"
    split: str | None = None
    sep: str | None = None
    columns: tuple[str | int, ...] | None = None
    ids: str = "int"
    rounds: int = 200
    variants: tuple[str, ...] | None = None
    transports: tuple[str, ...] = tuple(DEFAULT_TRANSPORTS.split(","))
    seed: int = 0
    max_users: int = 0
    max_items: int = 0
    dp_clip: float = 1.0
    transport_rounds: int = 2
    progress: bool = True
    extra_config: dict = field(default_factory=dict)
    dp_config: dict = field(default_factory=dict)
    workers: int = 2
    model: str = "fedmf"
    attacks: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        if self.rounds < 2:
            raise ValueError("the attack needs two rounds: rounds must be >= 2")
        if self.transport_rounds == 1 or self.transport_rounds < 0:
            raise ValueError(
                "transport_rounds must be 0 (all) or >= 2 (the attack reads two rounds), "
                f"got {self.transport_rounds}"
            )
        known = transport_names()
        for spec in self.transports:
            if parse_transport(spec)[0] not in known:
                raise ValueError(f"unknown transport {spec!r}; known: {', '.join(known)}")
        plugin = model_plugin(self.model)  # raises for an unknown model, listing the known
        unknown = [v for v in self.variants or () if v not in plugin.variants]
        if unknown:
            raise ValueError(
                f"model {self.model!r} has no variant {unknown[0]!r}; its variants: "
                + ", ".join(plugin.variants)
            )
        for name in self.attacks or ():
            attack_plugin(name)  # raises for an unknown attack, listing the known
        if not (self.attacks if self.attacks is not None else plugin.attacks):
            raise ValueError(f"no attack to run on model {self.model!r}'s views: give attacks")

    def model_variants(self) -> tuple[str, ...]:
        """The variants this run trains."""
        return self.variants or model_plugin(self.model).variants

    def attack_names(self) -> tuple[str, ...]:
        """The attacks this run applies to every view."""
        return self.attacks if self.attacks is not None else model_plugin(self.model).attacks


def parse_transport(spec: str) -> tuple[str, dict]:
    """``"dp:4"`` -> ``("dp", {"epsilon": 4.0})``; ``"secagg"`` -> ``("secagg", {})``."""
    name, _, argument = spec.partition(":")
    if not argument:
        return name, {}
    return name, {"epsilon": float(argument)}


def load_split(config: LeakUtilityConfig) -> Split:
    split = datasets.load(
        config.data,
        config.split,
        seed=config.seed,
        sep=config.sep,
        columns=config.columns,
        ids=config.ids,
    )
    if not (config.max_users or config.max_items):
        return split
    rng = np.random.default_rng(config.seed)
    return densest_split(split, config.max_users, config.max_items, rng)


def transport_rounds_note(rounds: int, transport_rounds: int) -> str:
    """The table header's sentence on which rounds of a hiding transport's cell went through it.

    A cell warm-starts over its clear counterpart only when ``0 < transport_rounds < rounds``
    (:func:`run_cell`); otherwise every round went through the transport.
    """
    warm = rounds - transport_rounds
    if not transport_rounds or warm <= 0:
        return "Every round of every cell went through its transport. "
    clear = "round 1" if warm == 1 else f"rounds 1..{warm}"
    return (
        f"secagg, ckks and secagg+dp cells: {clear} over their clear counterpart, the last "
        f"{transport_rounds} (the attacked view) through the transport (transport_rounds "
        "column). "
    )


def run_cell(
    split: Split,
    variant: str,
    spec: str,
    config: LeakUtilityConfig,
    model: ModelPlugin | None = None,
    attacks: tuple[AttackPlugin, ...] | None = None,
    progress: RoundProgress | None = None,
) -> dict:
    """Train one (variant, transport) cell, attack its view, return the table row.

    Args:
        split, variant, spec, config: the cell.
        model, attacks: the plug-ins (``None``: looked up from ``config``); the benchmark
            passes them so that worker processes need not find them registered.
        progress: told of every round the cell trains (warm start included), so that a
            progress bar moves during a long cell.
    """
    model = model_plugin(config.model) if model is None else model
    if attacks is None:
        attacks = tuple(attack_plugin(name) for name in config.attack_names())
    name, options = parse_transport(spec)
    dp = "dp" in option_groups(name)
    if dp:
        options["dp.clip"] = config.dp_clip
    tail = config.transport_rounds
    warm_rounds = (
        config.rounds - tail
        if tail and name in WARM_START_TRANSPORT and tail < config.rounds
        else 0
    )
    row = {
        "variant": variant,
        "transport": spec,
        "status": "ok",
        "transport_rounds": config.rounds - warm_rounds,
    }
    if config.model != "fedmf":
        row = {"model": config.model} | row
    options_text = model_options_text(config.dp_config if dp else config.extra_config)
    if options_text:  # a row of these options sits beside the defaults' (merge keeps both)
        row["model_options"] = options_text
    started = time.perf_counter()
    try:
        result = train_cell(split, variant, name, options, dp, warm_rounds, config, model, progress)
    except TransportUnavailable as error:
        return row | {"status": f"unavailable: {error}"}
    except (ValueError, FloatingPointError, SecurefedError) as error:  # diverged, budget spent
        return row | {"status": f"failed: {error}", "seconds": time.perf_counter() - started}
    utility, run, transport, train_seconds = result
    attack_started = time.perf_counter()
    outcomes = [(attack, attack.run(transport.view, run.truth)) for attack in attacks]
    up_per_client, _ = transport.view.mean_bytes_per_client()
    row |= {key: float(value) for key, value in utility.items()}
    row |= {
        "epsilon": transport.epsilon() if transport.ledger is not None else None,
        "epsilon_server": transport.epsilon(against="server")
        if transport.ledger is not None
        else None,
        "kib_up_per_client_round": up_per_client / 1024,
        "train_seconds": train_seconds,
        "attack_seconds": time.perf_counter() - attack_started,
        "seconds": time.perf_counter() - started,
        "attacks": ",".join(a for _, o in outcomes for a in o.applied) or "none",
    }
    for attack, outcome in outcomes:
        for measure in outcome.measures:
            if f"leak_{measure.name}" in row:
                raise ValueError(
                    f"attack {attack.name!r} measures {measure.name!r}, as another attack does"
                )
            row[f"leak_{measure.name}"] = measure.value
            row[f"chance_{measure.name}"] = measure.chance
    row["notes"] = " ".join(o.notes for _, o in outcomes if o.notes)
    return row


def train_cell(
    split: Split,
    variant: str,
    name: str,
    options: dict,
    dp: bool,
    warm_rounds: int,
    config: LeakUtilityConfig,
    model: ModelPlugin,
    progress: RoundProgress | None = None,
):
    """Build the model and the transport, train (warm start first), evaluate.

    Returns:
        ``(utility metrics, ModelRun, transport, training seconds)``.
    """
    seeds = SeedTree(config.seed)
    context = CellContext(
        split=split,
        variant=variant,
        transport=name,
        dp=dp,
        rounds=config.rounds,
        seed=config.seed,
        seeds=seeds,
        model_options=dict(config.extra_config),
        dp_model_options=dict(config.dp_config),
    )
    run = model.build(context)
    n_clients = run.algorithm.n_clients
    groups = resolve_options(parse_transport_spec(name), options)
    build = {
        "total_rounds": config.rounds,
        "n_clients": n_clients,
        "dropout": run.dropout,
        "sample_rate": run.sampling.rate(n_clients),
    }
    transport = build_transport(name, groups, keep_payloads=RoundSelection(last=2), **build)
    on_round = None if progress is None else progress.round_done
    if warm_rounds:
        warm_start(run, name, groups, build, transport, seeds, warm_rounds, on_round)
    started = time.perf_counter()
    _run_rounds(
        run.algorithm,
        transport,
        seeds,
        RunOptions(
            rounds=config.rounds,
            sampling=run.sampling,
            progress=False,
            first_round=warm_rounds,
            on_budget_exhausted="raise",
        ),
        on_round=on_round,
    )
    seconds = time.perf_counter() - started
    return dict(run.utility()), run, transport, seconds


def warm_start(run, name, groups, build, transport, seeds, rounds, on_round=None) -> None:
    """The first ``rounds`` rounds over the clear counterpart of ``transport``
    (:func:`securefed.bench.experiment.warm_start_transport`)."""
    warm = warm_start_transport(name, groups, build, transport)
    _run_rounds(
        run.algorithm,
        warm,
        seeds,
        RunOptions(rounds=rounds, sampling=run.sampling, progress=False),
        on_round=on_round,
    )


class RoundProgress:
    """Counts a cell's rounds into a progress bar, in this process or from a worker.

    In this process it updates the bar directly; a worker process gets a copy whose queue (a
    ``multiprocessing`` manager's, picklable) carries each round back to the bar's thread.
    """

    def __init__(self, bar=None, queue=None) -> None:
        self.bar, self.queue = bar, queue

    def __getstate__(self) -> dict:
        return {"bar": None, "queue": self.queue}  # the bar stays with the parent

    def round_done(self, round_id: int, metrics) -> None:
        if self.queue is not None:
            self.queue.put(1)
        elif self.bar is not None:
            self.bar.update(1)


def run(config: LeakUtilityConfig, out: str | Path, *, merge: bool = False) -> list[dict]:
    """Every cell, then the JSON, markdown and PNG outputs.

    Args:
        config: what to run.
        out: the output folder.
        merge: re-run cells of the record already in ``out`` (:func:`merge_rows`): its rows for
            these cells are replaced, the others kept, and the outputs written from all of them.
    """
    from tqdm.auto import tqdm

    split = load_split(config)
    model = model_plugin(config.model)
    attacks = tuple(attack_plugin(name) for name in config.attack_names())
    meta = {
        "data": split.name,
        "users": split.train.n_users,
        "items": split.train.n_items,
        "train": len(split.train),
        "test": len(split.test),
        "rounds": config.rounds,
        "seed": config.seed,
    }
    if config.model != "fedmf":
        meta |= {"model": config.model, "attacks": list(config.attack_names())}
    if merge:  # refused before any cell trains
        merge_rows(Path(out) / "leak_utility.json", meta, [])
    cells = [(v, t) for v in config.model_variants() for t in config.transports]
    # Counted in rounds, so that the bar and its ETA move during a long cell.
    bar = tqdm(
        total=len(cells) * config.rounds,
        desc=f"leak-utility, {len(cells)} cells",
        unit="round",
        disable=not config.progress,
    )
    if config.workers == 1:
        rows = []
        for variant, spec in cells:
            bar.set_postfix_str(f"{human_variant(variant)} / {human_transport(spec)}")
            rows.append(run_cell(split, variant, spec, config, model, attacks, RoundProgress(bar)))
    else:
        rows = _run_cells_in_processes(split, cells, config, bar, model, attacks)
    bar.close()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if merge:
        rows = merge_rows(out / "leak_utility.json", meta, rows)
    save_json({"meta": meta, "rows": rows}, out / "leak_utility.json")
    measures = table_measures(rows, attacks)
    table = table_text(rows, meta, config, model, measures)
    (out / "leak_utility.md").write_text(table + "\n")
    if config.model == "fedmf":
        plot(rows, out / "leak_utility.png", meta)
    else:
        plot_model(rows, out / "leak_utility.png", meta, model, measures)
    print(table)
    print(f"\nwritten: {out}/leak_utility.json, .md, .png")
    return rows


def table_measures(rows: list[dict], attacks: tuple[AttackPlugin, ...]) -> list[str]:
    """The leak measures the table and the plot show, each once, in the attacks' order."""
    return list(
        dict.fromkeys(
            name
            for attack in attacks
            for name in attack.table_measures or _measures_of(rows, attack)
        )
    )


def table_text(
    rows: list[dict],
    meta: dict,
    config: LeakUtilityConfig,
    model: ModelPlugin,
    measures: list[str],
) -> str:
    """The leak-utility record as markdown: the setting's sentence, then the table."""
    columns = [
        *(["model"] if config.model != "fedmf" else []),
        "variant",
        "transport",
        *(["model_options"] if any("model_options" in row for row in rows) else []),
        "status",
        "transport_rounds",
        model.utility_columns[0],
        "epsilon",
        "epsilon_server",
        *[f"{kind}_{name}" for name in measures for kind in ("leak", "chance")],
        "kib_up_per_client_round",
        "seconds",
    ]
    header = (
        f"Data: {meta['data']} ({meta['users']} users, {meta['items']} items, "
        f"{meta['train']} train / {meta['test']} test ratings), {config.rounds} rounds, "
        f"seed {config.seed}. "
        + transport_rounds_note(config.rounds, config.transport_rounds)
        + (model.table_note + "\n\n" if model.table_note else "\n\n")
    )
    return header + human_table(rows, columns)


def model_options_text(options: dict) -> str:
    """``{"item_blocks": 8}`` -> ``"item_blocks=8"`` (sorted; empty for no options)."""
    return ",".join(f"{key}={value}" for key, value in sorted(options.items()))


def _cell_key(row: dict) -> tuple[str, str, str, str]:
    return (
        str(row.get("model", "fedmf")),
        str(row["variant"]),
        str(row["transport"]),
        str(row.get("model_options", "")),
    )


def merge_rows(path: Path, meta: dict, rows: list[dict]) -> list[dict]:
    """The record at ``path`` with the rows of the cells in ``rows`` replaced by them.

    The cells' training is deterministic (the run's seed tree), so a cell re-run with the record's
    settings trains the same model and its view is attacked afresh: how a record is brought up to
    date when only the attack changed. Cells the record lacks are appended; its other rows stay
    as they are, in their order.

    Raises:
        ValueError: no record at ``path``, or one whose data, split sizes, rounds or seed differ
            from ``meta`` (naming the first difference): its rows would not be comparable.
    """
    from securefed.records import loads_record

    if not path.is_file():
        raise ValueError(f"--merge: no record at {path} to merge into")
    record = loads_record(path.read_text())
    recorded = record.get("meta", {})
    for key, value in meta.items():
        if recorded.get(key) != value:
            raise ValueError(
                f"--merge: the record at {path} has {key} = {recorded.get(key)!r}, this run "
                f"{value!r}: its rows are not comparable"
            )
    fresh = {_cell_key(row): row for row in rows}
    merged = [fresh.pop(_cell_key(row), row) for row in record["rows"]]
    return merged + [row for row in rows if _cell_key(row) in fresh]


VARIANT_NAMES = {"fedmf": "FedMF", "fedrec": "FedRec", "fedrec+": "FedRec+"}
TRANSPORT_NAMES = {
    "plaintext": "plaintext",
    "secagg": "secure aggregation",
    "ckks": "CKKS",
    "dp": "central DP",
    "dp-local": "local DP",
    "secagg+dp": "distributed DP (secagg)",
    "ckks+dp": "CKKS + central DP",
}
COLUMN_TITLES = {
    "model": "model",
    "variant": "variant",
    "transport": "transport",
    "model_options": "model options",
    "status": "status",
    "transport_rounds": "rounds through it",
    "rmse": "test RMSE",
    "epsilon": "epsilon (released model)",
    "epsilon_server": "epsilon (server)",
    "kib_up_per_client_round": "KiB up / client / round",
    "seconds": "seconds",
}
MEASURE_TITLES = {
    "exact_share": "ratings recovered exactly",
    "rmse": "RMSE of recovered ratings",
    "precision": "rated items: precision",
    "recall": "rated items: recall",
    "f1": "rated-item F1",
    "filled_identified": "filled rows identified",
}


def human_variant(variant: str) -> str:
    """``"fedrec+"`` -> ``"FedRec+"`` (other names as they are)."""
    return VARIANT_NAMES.get(variant, variant)


def human_transport(spec: str) -> str:
    """``"dp:4"`` -> ``"central DP, epsilon 4"``; ``"secagg"`` -> ``"secure aggregation"``."""
    name, options = parse_transport(spec)
    words = TRANSPORT_NAMES.get(name, name)
    return f"{words}, epsilon {options['epsilon']:g}" if "epsilon" in options else words


def column_title(column: str) -> str:
    """A table column's words: ``leak_f1`` -> ``rated-item F1``, ``chance_f1`` -> ``chance``."""
    kind, _, measure = column.partition("_")
    if kind in ("leak", "chance") and measure:
        return "chance" if kind == "chance" else MEASURE_TITLES.get(measure, measure)
    return COLUMN_TITLES.get(column, column.replace("_", " "))


def cell_text(column: str, value: object) -> str:
    """A table cell: no epsilon (no DP) as "–", infinite epsilon as "none (inf)", shares in %."""
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "–"
    if column == "variant":
        return human_variant(str(value))
    if column == "transport":
        return human_transport(str(value))
    if isinstance(value, float):
        if np.isinf(value):
            return "none (inf)" if column.startswith("epsilon") else "inf"
        if column.endswith(("exact_share", "filled_identified")):
            return f"{value:.1%}"
        if column.startswith("epsilon"):
            return f"{value:.2f}"
        if column in ("kib_up_per_client_round", "seconds"):
            return f"{value:.1f}"
        if value != 0 and (abs(value) < 1e-2 or abs(value) >= 1e5):
            return f"{value:.1e}"
        return f"{value:.4f}" if abs(value) < 100 else f"{value:.1f}"
    return str(value)


def human_table(rows: list[dict], columns: list[str]) -> str:
    """The rows as a markdown table with words for headers and readable cells."""
    return markdown_table(
        [column_title(c) for c in columns],
        ([cell_text(c, row.get(c)) for c in columns] for row in rows),
    )


def _measures_of(rows: list[dict], attack: AttackPlugin) -> list[str]:
    """Every measure name the rows hold (an attack that names no table measures shows all)."""
    names = []
    for row in rows:
        for key in row:
            if key.startswith("leak_") and key[5:] not in names:
                names.append(key[5:])
    return names


# The dearest cells start first so that the workers finish together.
_COST_ORDER = ("ckks", "secagg+dp", "secagg")


def _run_cells_in_processes(
    split: Split,
    cells: list,
    config: LeakUtilityConfig,
    bar,
    model: ModelPlugin,
    attacks: tuple[AttackPlugin, ...],
) -> list:
    """:func:`run_cell` for every cell in ``config.workers`` processes; rows in cell order."""

    def cost_rank(cell: tuple[str, str]) -> int:
        name = parse_transport(cell[1])[0]
        return _COST_ORDER.index(name) if name in _COST_ORDER else len(_COST_ORDER)

    order = sorted(range(len(cells)), key=lambda k: cost_rank(cells[k]))

    def done(position: int, row: object) -> None:
        variant, spec = cells[order[position]]
        bar.set_postfix_str(f"done {human_variant(variant)} / {human_transport(spec)}")

    with multiprocessing.get_context("spawn").Manager() as manager:
        queue = manager.Queue()
        counter = threading.Thread(target=_count_rounds, args=(queue, bar), daemon=True)
        counter.start()
        progress = RoundProgress(queue=queue)
        calls = [(split, *cells[k], config, model, attacks, progress) for k in order]
        try:
            rows_in_order = map_in_processes(run_cell, calls, config.workers, done)
        finally:
            queue.put(None)
            counter.join()
    rows: list[dict | None] = [None] * len(cells)
    for position, k in enumerate(order):
        rows[k] = rows_in_order[position]
    return rows  # type: ignore[return-value]


def _count_rounds(queue, bar) -> None:
    """Move ``bar`` by what the workers put on ``queue``, until ``None``."""
    while (step := queue.get()) is not None:
        bar.update(step)


CAVEAT = (
    "Leak: what this package's attacks recover from the server's view, a lower bound of what "
    "a server could learn. Central DP: the server sees the clipped, un-noised updates "
    "(epsilon against it: none)."
)
"""The footnote every leak-utility figure carries."""


def plot_cells(
    rows: list[dict],
    path: Path,
    title: str,
    utility: tuple[str, str],
    panels: list[tuple[str, str]],
) -> bool:
    """Utility against each leak measure, one point per cell, with each cell's chance level.

    Points carry no text labels (they would overlap where transports coincide): colour and
    marker name the transport and the variant in a legend. Points are drawn where they are
    (never shifted): cells at the same place are drawn concentric, the first largest, so that
    each stays visible. Chance differs by cell (by variant, and by transport: FedRec's filled
    items count as rated where the server reads the update), so each cell's own chance level
    is a tick on its row joined to its point by a thin line (a single line, the mean of the
    chances, would put cells below a chance they never had); a dashed line too when every cell
    has the same. The leak axis spans the points and ticks, with no tick past 1 for shares.

    Args:
        rows: the table rows (only ``status == "ok"`` are drawn).
        path: the PNG to write.
        title: the figure's title (wrapped to the figure's width).
        utility: ``(column, axis label)`` of the utility.
        panels: ``(measure, axis label)`` per panel; columns ``leak_<measure>`` and
            ``chance_<measure>``.

    Returns:
        Whether a figure was written (no finished cell with the utility: nothing is, and a line
        says so).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in rows if r["status"] == "ok" and r.get(utility[0]) is not None]
    if not done:
        print(f"leak-utility: no finished cell to plot, {path.name} not written")
        return False
    transports = list(dict.fromkeys(r["transport"] for r in done))
    variants = list(dict.fromkeys(r["variant"] for r in done))
    colours = plt.get_cmap("tab10")
    markers = "os^DvP*X"
    width = max(6.0 * len(panels), 7.5)
    figure, axes = plt.subplots(1, len(panels), figsize=(width, 5.2), sharey=True, squeeze=False)
    utilities = np.array([float(r[utility[0]]) for r in done])
    y_span = float(np.ptp(utilities)) or 1.0
    for axis, (measure, label) in zip(axes[0], panels, strict=True):
        leaks = np.array([float(r.get(f"leak_{measure}", np.nan)) for r in done])
        levels = [
            float(r[f"chance_{measure}"])
            for r in done
            if r.get(f"chance_{measure}") is not None and np.isfinite(r[f"chance_{measure}"])
        ]
        shown = [*leaks[np.isfinite(leaks)], *levels]
        low, high = (min(shown), max(shown)) if shown else (0.0, 1.0)
        x_span = (high - low) or 1.0
        sizes = _concentric_sizes(leaks, utilities, x_span, y_span)
        for k in np.argsort(-sizes, kind="stable"):  # largest first: smaller ones on top
            row = done[k]
            if not np.isfinite(leaks[k]):
                continue
            t, v = transports.index(row["transport"]), variants.index(row["variant"])
            axis.scatter(
                leaks[k],
                utilities[k],
                color=colours(t % 10),
                marker=markers[v % len(markers)],
                s=sizes[k],
                edgecolors="black",
                linewidths=0.5,
                zorder=3,
            )
        for k, row in enumerate(done):  # each cell's own chance: a tick, a thin line to it
            level = row.get(f"chance_{measure}")
            if level is None or not np.isfinite(level) or not np.isfinite(leaks[k]):
                continue
            axis.plot([level, leaks[k]], [utilities[k]] * 2, color="grey", lw=0.8, zorder=2)
            axis.scatter(level, utilities[k], marker="|", s=160, color="black", lw=1.3, zorder=4)
        if len(set(np.round(levels, 9))) == 1:  # one chance for every cell: a line too
            axis.axvline(levels[0], color="grey", linestyle="--", linewidth=1, zorder=1)
        axis.set_xlim(*leak_axis_limits(shown))
        if high <= 1.0:  # shares: no tick past 1
            ticks = [t for t in axis.get_xticks() if -1e-9 <= t <= 1.0 + 1e-9]
            axis.set_xticks(ticks)
            axis.set_xlim(*leak_axis_limits(shown))
        axis.set_xlabel(f"leak: {label}")
        axis.grid(alpha=0.3)
    axes[0][0].set_ylabel(utility[1])
    handles = [
        plt.Line2D(
            [], [], color=colours(t % 10), marker="o", linestyle="", label=human_transport(n)
        )
        for t, n in enumerate(transports)
    ]
    if len(variants) > 1:
        handles += [
            plt.Line2D(
                [],
                [],
                color="black",
                marker=markers[v % len(markers)],
                linestyle="",
                markerfacecolor="none",
                label=human_variant(n),
            )
            for v, n in enumerate(variants)
        ]
    handles.append(
        plt.Line2D(
            [],
            [],
            color="grey",
            marker="|",
            markeredgecolor="black",
            markersize=12,
            linewidth=0.8,
            label="the cell's chance level\n(joined to its point)",
        )
    )
    figure.legend(handles=handles, loc="center right", fontsize=8, frameon=False)
    title_width = int((width - 2.4) * 8)  # characters of the title's font beside the legend
    figure.suptitle("\n".join(textwrap.wrap(title, title_width)))
    figure.text(0.01, 0.01, CAVEAT, fontsize=7.5, wrap=True)
    figure.tight_layout(rect=(0, 0.06, 1 - 2.4 / width, 1))  # 2.4 inches for the legend
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return True


def leak_axis_limits(values: list[float]) -> tuple[float, float]:
    """The leak axis: the values' range plus 4% each side (room for the markers), never below 0
    for non-negative measures; the points themselves are never moved."""
    if not values:
        return 0.0, 1.0
    low, high = min(values), max(values)
    margin = 0.04 * ((high - low) or 1.0)
    return (max(0.0, low - margin) if low >= 0 else low - margin), high + margin


def _concentric_sizes(
    x: np.ndarray, y: np.ndarray, x_span: float, y_span: float, base: float = 55.0
) -> np.ndarray:
    """Marker areas: points within 1.5% of both axes' spans of each other share a place, and
    the k-th of a group of m gets area ``base * (1 + 1.2 (m - 1 - k))`` (drawn largest first)."""
    sizes = np.full(len(x), base)
    assigned = np.zeros(len(x), dtype=bool)
    for i in range(len(x)):
        if assigned[i] or not np.isfinite(x[i]):
            continue
        near = (np.abs(x - x[i]) <= 0.015 * x_span) & (np.abs(y - y[i]) <= 0.015 * y_span)
        group = np.flatnonzero(near & ~assigned)
        for k, member in enumerate(group):
            sizes[member] = base * (1 + 1.2 * (len(group) - 1 - k))
        assigned[group] = True
    return sizes


def plot_model(
    rows: list[dict], path: Path, meta: dict, model: ModelPlugin, measures: list[str]
) -> None:
    """A plug-in model's utility against each leak measure (up to four)."""
    utility = model.utility_columns[0]
    better = "lower" if model.lower_is_better else "higher"
    plot_cells(
        rows,
        path,
        f"{model.name}: leak versus utility on {meta['data']} ({meta['rounds']} rounds)",
        (utility, f"{utility} (utility: {better} is better)"),
        [(name, MEASURE_TITLES.get(name, name)) for name in measures[:4]],
    )


def plot(rows: list[dict], path: Path, meta: dict) -> None:
    """FedMF's test RMSE against the two leak measures."""
    plot_cells(
        rows,
        path,
        f"Leak versus utility on {meta['data']} ({meta['rounds']} rounds)",
        ("rmse", "test RMSE (utility: lower is better)"),
        [("exact_share", "ratings recovered exactly"), ("f1", "rated-item F1")],
    )


DEMO_ROUNDS = 40
"""Training rounds of each ``securefed demo`` cell (its recorded figures)."""


def demo_config(data: str = "ml-latest-small", rounds: int = DEMO_ROUNDS) -> LeakUtilityConfig:
    """The demo's cells: the 100 most active users x 200 most rated items, three transports.

    ``benchmarks/results/demo/`` records what it gives; ``tests/test_demo_record.py`` re-runs
    its cheap cells on every machine and compares them with that record.
    """
    return LeakUtilityConfig(
        data=data,
        rounds=rounds,
        max_users=100,
        max_items=200,
        transports=("plaintext", "secagg", "dp:8"),
        transport_rounds=0,
        extra_config={"lr": 0.15, "server_lr": 0.15, "init_std": 0.6},
    )


def demo(
    data: str = "ml-latest-small", out: str = "results/demo", rounds: int = DEMO_ROUNDS
) -> int:
    """``securefed demo``: a small leak-utility table on the embedded data (a few minutes).

    ``rounds`` below :data:`DEMO_ROUNDS` makes a smoke run (CI's installed-wheel check), not the
    demo's figures.
    """
    config = demo_config(data, rounds)
    print(
        f"securefed demo: FedMF, FedRec and FedRec+ on {data} (100 most active users x 200 "
        "most rated items), plaintext / secure aggregation / DP; each view is attacked.\n"
    )
    run(config, out)
    return 0


def parse_model_options(items: list[str] | None) -> dict[str, object]:
    """``["lr=0.15", "dim=8"]`` -> ``{"lr": 0.15, "dim": 8}`` (values read as in spec strings).

    Raises:
        ValueError: an item that is not ``KEY=VALUE`` or a key given twice.
    """
    from securefed.transport.registry import parse_transport_spec as _spec

    options: dict[str, object] = {}
    for item in items or []:
        key, equals, value = item.partition("=")
        if not equals or not key.strip():
            raise ValueError(f"model option {item!r} is not KEY=VALUE")
        if key.strip() in options:
            raise ValueError(f"model option {key.strip()!r} is given twice")
        # the spec parser reads values the way every option of the command line is read
        options[key.strip()] = _spec(f"plaintext:x={value.strip()}").options["x"]
    return options


def _main(args: argparse.Namespace) -> int:
    config = LeakUtilityConfig(
        data=args.data,
        split=args.split,
        sep=args.sep,
        columns=args.columns,
        ids=args.ids,
        rounds=args.rounds,
        variants=tuple(args.variants.split(",")) if args.variants else None,
        transports=tuple(args.transports.split(",")),
        seed=args.seed,
        max_users=args.max_users,
        max_items=args.max_items,
        dp_clip=args.dp_clip,
        transport_rounds=args.transport_rounds,
        workers=args.workers,
        model=args.model,
        attacks=tuple(args.attacks.split(",")) if args.attacks else None,
        extra_config=parse_model_options(args.model_option),
        dp_config=parse_model_options(args.dp_model_option),
    )
    run(config, args.out, merge=args.merge)
    return 0


def _usage_error(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Check the names before any cell runs: a bad one is a usage error (exit 2)."""
    try:
        config_names = {
            "transports": args.transports.split(","),
            "model": args.model,
            "attacks": args.attacks.split(",") if args.attacks else (),
        }
        known = transport_names()
        for spec in config_names["transports"]:
            if parse_transport(spec)[0] not in known:
                raise ValueError(f"unknown transport {spec!r}; known: {', '.join(known)}")
            if spec.partition(":")[2]:
                float(spec.partition(":")[2])
        plugin = model_plugin(args.model)
        for variant in args.variants.split(",") if args.variants else ():
            if variant not in plugin.variants:
                raise ValueError(
                    f"model {args.model!r} has no variant {variant!r}; its variants: "
                    + ", ".join(plugin.variants)
                )
        for name in config_names["attacks"]:
            attack_plugin(name)
    except ValueError as error:
        parser.error(str(error))  # prints the usage line and exits with status 2
    return _main(args)


def register(benches) -> None:
    parser = BENCHES["leak-utility"].add_to(
        benches,
        description="Train a model through every transport, attack every server view, and "
        "tabulate utility against leak (with each attack's chance baseline). Writes "
        "leak_utility.json, .md and .png to --out. Models and attacks are plug-ins "
        "(securefed.bench.plugins; entry-point groups securefed.models and securefed.attacks).",
    )
    add = parser.add_argument
    add(
        "--data",
        default="ml-latest-small",
        metavar="NAME|PATH",
        help="ml-latest-small (embedded), ml-100k, or a path to a ratings file or folder "
        "(default: %(default)s)",
    )
    add(
        "--split",
        default=None,
        metavar="NAME",
        help="u1..u5/ua/ub for ML-100K; random otherwise (default: random)",
    )
    add_layout_arguments(parser)
    add(
        "--model",
        default="fedmf",
        metavar="NAME",
        help=f"the model plug-in (known here: {', '.join(model_names())}; default: %(default)s)",
    )
    add(
        "--variants",
        default=None,
        metavar="V1,V2,...",
        help="comma-separated variants of the model (default: all of the model's; fedmf's: "
        "fedmf,fedrec,fedrec+)",
    )
    add(
        "--attacks",
        default=None,
        metavar="A1,A2,...",
        help=f"comma-separated attack plug-ins run on every view (known here: "
        f"{', '.join(attack_names())}; default: the model's own, gradient-inversion for fedmf)",
    )
    add(
        "--transports",
        default=DEFAULT_TRANSPORTS,
        metavar="SPEC,SPEC,...",
        help="comma-separated transports: plaintext, secagg, ckks, dp:EPS (central DP at "
        "epsilon EPS), dp-local:EPS, secagg+dp:EPS, ckks+dp:EPS (default: %(default)s)",
    )
    add(
        "--rounds",
        type=int,
        default=LeakUtilityConfig.rounds,
        metavar="N",
        help="training rounds of every cell, >= 2 (default: %(default)s)",
    )
    add(
        "--seed",
        type=int,
        default=0,
        metavar="N",
        help="the run seed: reproducible, not private (default: %(default)s)",
    )
    add(
        "--max-users",
        type=int,
        default=0,
        metavar="N",
        help="keep only the N most active users (0: all; default: %(default)s)",
    )
    add(
        "--max-items",
        type=int,
        default=0,
        metavar="N",
        help="keep only the N most rated items (0: all; default: %(default)s)",
    )
    add(
        "--dp-clip",
        type=float,
        default=1.0,
        metavar="C",
        help="per-client L2 clip of the DP transports (default: %(default)s)",
    )
    add(
        "--transport-rounds",
        type=int,
        default=LeakUtilityConfig.transport_rounds,
        metavar="N",
        help="last rounds of secagg/ckks/secagg+dp/ckks+dp cells run through the transport, "
        "the earlier ones over its clear counterpart; 0: all rounds (default: %(default)s)",
    )
    add(
        "--model-option",
        action="append",
        default=None,
        metavar="KEY=VALUE",
        help="an option of the model in its non-DP cells (FedMF: a FedMFConfig field), "
        "repeatable (default: none)",
    )
    add(
        "--dp-model-option",
        action="append",
        default=None,
        metavar="KEY=VALUE",
        help="an option of the model in its DP cells (FedMF: a user_level_dp_config field), "
        "repeatable (default: none)",
    )
    add(
        "--workers",
        type=int,
        default=2,
        metavar="N",
        help="cells trained at once, one process each (default: %(default)s)",
    )
    add(
        "--out",
        default="results/leak_utility",
        metavar="DIR",
        help="output folder (default: %(default)s)",
    )
    add(
        "--merge",
        action="store_true",
        help="re-run these cells of the record already in --out (same data, rounds and seed, "
        "else refused): their rows are replaced, the others kept, and the JSON, table and "
        "figure rewritten from all of them (a record brought up to date after an attack "
        "changed: training is deterministic)",
    )
    parser.set_defaults(func=lambda args: _usage_error(parser, args))
