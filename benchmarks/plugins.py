"""Plug-ins of the leak-versus-utility benchmark: models and attacks, registered by name.

A **model** plug-in (:class:`ModelPlugin`) is a factory of a
:class:`~securefed.runtime.FederatedAlgorithm` for one benchmark cell plus the utility metric of the
trained model; an **attack** plug-in (:class:`AttackPlugin`) is a function from the
:class:`~securefed.views.ServerView` of a cell to leak measures (:class:`LeakMeasure`), each beside
its chance baseline. ``securefed bench leak-utility --model NAME --attacks A,B`` runs the model
through every transport and every attack on every view, exactly as it runs FedMF, the built-in
model (``fedmf``, attacked by ``gradient-inversion``: :func:`securefed.attacks.verify`).

Register from Python::

    from securefed.bench.plugins import register_model, register_attack
    register_model(ModelPlugin("my-ncf", build_my_ncf, utility_columns=("rmse",), ...))

or through entry points in the plug-in's own package (``pyproject.toml``)::

    [project.entry-points."securefed.models"]
    my-ncf = "my_package.bench:MY_NCF"          # a ModelPlugin, or a function returning one
    [project.entry-points."securefed.attacks"]
    rated-items = "my_package.bench:RATED_ITEMS"

Entry points are read when a name is looked up (:func:`model_plugin`, :func:`attack_plugin`) or
listed; a name registered twice (Python and an entry point, or two entry points) is refused.
Cells run in spawned worker processes: the benchmark hands the plug-in objects to the workers, so
their functions must be importable (module level), not lambdas.
"""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from securefed import ClientSampling, SeedTree
from securefed.runtime import FederatedAlgorithm, check_algorithm
from securefed.views import ServerView

MODEL_GROUP = "securefed.models"
ATTACK_GROUP = "securefed.attacks"
_NAME = re.compile(r"[a-z0-9][a-z0-9_+.-]*")


@dataclass(frozen=True)
class LeakMeasure:
    """One thing an attack measured, beside what guessing achieves.

    Attributes:
        name: a short column name (``f1``, ``exact_share``); unique within one benchmark run.
        value: what the attack achieved on the view.
        chance: what the chance baseline achieves (a guess that reads nothing of the view).
        leakier: ``"higher"`` when a larger value means a larger leak (F1), ``"lower"`` when a
            smaller one does (a recovery RMSE).
    """

    name: str
    value: float
    chance: float
    leakier: str = "higher"

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise ValueError(f"leak measure name {self.name!r} must be a lower-case word")
        if self.leakier not in ("higher", "lower"):
            raise ValueError(f"leakier must be 'higher' or 'lower', got {self.leakier!r}")
        for what in ("value", "chance"):
            number = getattr(self, what)
            if not isinstance(number, (int, float)) or isinstance(number, bool):
                raise ValueError(f"leak measure {self.name!r}: {what} must be a number")
            object.__setattr__(self, what, float(number))


@dataclass(frozen=True)
class AttackOutcome:
    """What an attack returns: its measures, and optionally what it applied and notes."""

    measures: tuple[LeakMeasure, ...]
    applied: tuple[str, ...] = ()
    notes: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "measures", tuple(self.measures))
        if not self.measures or not all(isinstance(m, LeakMeasure) for m in self.measures):
            raise ValueError("an attack outcome needs at least one LeakMeasure")


@dataclass(frozen=True)
class CellContext:
    """What a model factory is given for one (variant, transport) cell.

    Attributes:
        split: the train/test split (``split.train`` a :class:`~securefed.recsys.data.Ratings`).
        variant: the model's variant of this cell (one of :attr:`ModelPlugin.variants`).
        transport: the transport's registered name (``"secagg+dp"``).
        dp: the transport adds DP noise (the model should train its DP configuration).
        rounds: training rounds of the cell.
        seed: the run seed; ``seeds`` its seed tree (the factory draws its initialisation from
            it, never from a global generator).
        seeds: the cell's :class:`~securefed.randomness.SeedTree`.
        model_options: the model's options for the non-DP cells (``--model-option``).
        dp_model_options: its options for the DP cells.
    """

    split: object
    variant: str
    transport: str
    dp: bool
    rounds: int
    seed: int
    seeds: SeedTree
    model_options: Mapping[str, object] = field(default_factory=dict)
    dp_model_options: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True, eq=False)
class ModelRun:
    """What a model factory returns for a cell.

    Attributes:
        algorithm: the :class:`~securefed.runtime.FederatedAlgorithm` to train.
        utility: called once after training: the utility metrics (``{"rmse": 0.93}``), holding
            at least the plug-in's :attr:`ModelPlugin.utility_columns`.
        truth: what the attacks score against (e.g. the training ratings).
        sampling: the run's client sampling (also what the DP accountant is charged for).
        dropout: the fraction of clients expected to drop (secure aggregation sizes for it).
    """

    algorithm: FederatedAlgorithm
    utility: Callable[[], Mapping[str, float]]
    truth: object
    sampling: ClientSampling = field(default_factory=ClientSampling)
    dropout: float = 0.0

    def __post_init__(self) -> None:
        check_algorithm(self.algorithm)
        if not callable(self.utility):
            raise ValueError("ModelRun.utility must be callable: utility() -> {metric: value}")


@dataclass(frozen=True)
class ModelPlugin:
    """A model the leak-utility benchmark can train through every transport.

    Attributes:
        name: the ``--model`` name (lower case).
        build: ``build(CellContext) -> ModelRun`` (module-level function: cells run in spawned
            processes).
        utility_columns: the utility metrics shown in the table (the first is plotted).
        lower_is_better: whether the first utility metric improves downward (RMSE) or not.
        variants: the model's variants (``--variants`` chooses among them).
        attacks: the attacks run on its views when ``--attacks`` is not given.
        summary: one line for ``--help``.
        table_note: a sentence the table's header adds about the model's cells.
    """

    name: str
    build: Callable[[CellContext], ModelRun]
    utility_columns: tuple[str, ...]
    lower_is_better: bool = True
    variants: tuple[str, ...] = ("default",)
    attacks: tuple[str, ...] = ()
    summary: str = ""
    table_note: str = ""

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise ValueError(f"model plug-in name {self.name!r} must be a lower-case word")
        if not callable(self.build):
            raise ValueError(f"model plug-in {self.name!r}: build must be callable")
        for what in ("utility_columns", "variants", "attacks"):
            object.__setattr__(self, what, tuple(getattr(self, what)))
        if not self.utility_columns or not self.variants:
            raise ValueError(f"model plug-in {self.name!r} needs utility columns and variants")


@dataclass(frozen=True)
class AttackPlugin:
    """An attack on a cell's ServerView.

    Attributes:
        name: the ``--attacks`` name.
        attack: ``attack(view, truth) -> AttackOutcome`` (or a sequence of
            :class:`LeakMeasure`); ``truth`` is the model's :attr:`ModelRun.truth`, used only to
            score.
        table_measures: the measures shown in the markdown table (``()``: all).
        summary: one line for ``--help``.
    """

    name: str
    attack: Callable[[ServerView, object], AttackOutcome | Sequence[LeakMeasure]]
    table_measures: tuple[str, ...] = ()
    summary: str = ""

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise ValueError(f"attack plug-in name {self.name!r} must be a lower-case word")
        if not callable(self.attack):
            raise ValueError(f"attack plug-in {self.name!r}: attack must be callable")
        object.__setattr__(self, "table_measures", tuple(self.table_measures))

    def run(self, view: ServerView, truth: object) -> AttackOutcome:
        """The attack's outcome (a bare sequence of measures is wrapped)."""
        outcome = self.attack(view, truth)
        if isinstance(outcome, AttackOutcome):
            return outcome
        return AttackOutcome(tuple(outcome), applied=(self.name,))


# ------------------------------------------------------------------------------ the registry
_MODELS: dict[str, ModelPlugin] = {}
_ATTACKS: dict[str, AttackPlugin] = {}
_LOADED: set[str] = set()


def register_model(plugin: ModelPlugin) -> ModelPlugin:
    """Make ``plugin`` available as ``--model plugin.name``.

    Raises:
        ValueError: not a ModelPlugin, or a name already registered.
    """
    return _register(_MODELS, ModelPlugin, plugin, "model")


def register_attack(plugin: AttackPlugin) -> AttackPlugin:
    """Make ``plugin`` available in ``--attacks``.

    Raises:
        ValueError: not an AttackPlugin, or a name already registered.
    """
    return _register(_ATTACKS, AttackPlugin, plugin, "attack")


def unregister(name: str) -> None:
    """Forget a model or attack registered from Python (tests, notebooks)."""
    _MODELS.pop(name, None)
    _ATTACKS.pop(name, None)


def _register(table: dict, kind: type, plugin: object, what: str):
    if not isinstance(plugin, kind):
        raise ValueError(f"a {what} plug-in must be a {kind.__name__}, got {type(plugin).__name__}")
    if plugin.name in table:
        raise ValueError(f"{what} plug-in {plugin.name!r} is already registered")
    table[plugin.name] = plugin
    return plugin


def _load_entry_points(group: str, table: dict, kind: type, what: str) -> None:
    """Register every entry point of ``group`` not yet loaded (each once per process)."""
    for entry in importlib.metadata.entry_points(group=group):
        key = f"{group}:{entry.name}:{entry.value}"
        if key in _LOADED:
            continue
        _LOADED.add(key)
        loaded = entry.load()
        plugin = loaded if isinstance(loaded, kind) else loaded()
        if not isinstance(plugin, kind) or plugin.name != entry.name:
            raise ValueError(
                f"entry point {entry.name!r} of {group!r} ({entry.value}) must give a "
                f"{kind.__name__} named {entry.name!r}"
            )
        _register(table, kind, plugin, what)


def _entry_point_names(group: str) -> list[str]:
    return [entry.name for entry in importlib.metadata.entry_points(group=group)]


def model_names() -> tuple[str, ...]:
    """Registered models and those offered by entry points (not loaded)."""
    return tuple(dict.fromkeys([*_MODELS, *_entry_point_names(MODEL_GROUP)]))


def attack_names() -> tuple[str, ...]:
    """Registered attacks and those offered by entry points (not loaded)."""
    return tuple(dict.fromkeys([*_ATTACKS, *_entry_point_names(ATTACK_GROUP)]))


def model_plugin(name: str) -> ModelPlugin:
    """The model registered as ``name``.

    Raises:
        ValueError: an unknown name, listing the known ones.
    """
    if name not in _MODELS:
        _load_entry_points(MODEL_GROUP, _MODELS, ModelPlugin, "model")
    if name not in _MODELS:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(model_names())}")
    return _MODELS[name]


def attack_plugin(name: str) -> AttackPlugin:
    """The attack registered as ``name``.

    Raises:
        ValueError: an unknown name, listing the known ones.
    """
    if name not in _ATTACKS:
        _load_entry_points(ATTACK_GROUP, _ATTACKS, AttackPlugin, "attack")
    if name not in _ATTACKS:
        raise ValueError(f"unknown attack {name!r}; known: {', '.join(attack_names())}")
    return _ATTACKS[name]


# ------------------------------------------------------------------------------ the built-ins
FEDMF_LEAK_MEASURES = ("exact_share", "rmse", "precision", "recall", "f1", "filled_identified")
"""What :func:`gradient_inversion` reports (``filled_identified`` only under hybrid filling)."""
_LOWER_IS_LEAKIER = frozenset({"rmse"})


def build_fedmf(context: CellContext) -> ModelRun:
    """FedMF / FedRec / FedRec+ (``context.variant``) for one cell, as the benchmark always ran it.

    Hiding transports get the full upload (a sparse one would reveal the rated rows by its
    shape); DP cells train :func:`~securefed.recsys.fedmf.user_level_dp_config` (FedRec+ with
    uniform weights: its Wasserstein weights need statistics rows this aggregation does not send).
    """
    from securefed.recsys.fedmf import FedMF, FedMFConfig, user_level_dp_config
    from securefed.recsys.metrics import mae, rmse

    split = context.split
    upload = "part" if context.transport in ("plaintext", "dp") else "full"
    if context.dp:
        weighting = {"weighting": "uniform"} if context.variant == "fedrec+" else {}
        config = user_level_dp_config(
            variant=context.variant,
            rounds=context.rounds,
            upload=upload,
            **(weighting | dict(context.dp_model_options)),
        )
    else:
        config = FedMFConfig(
            variant=context.variant,
            rounds=context.rounds,
            upload=upload,
            **dict(context.model_options),
        )
    sampling = ClientSampling()
    if config.aggregation == "fixed" and config.expected_clients is None:
        # The public denominator: the expected number of uploads under the run's sampling.
        expected = sampling.rate(split.train.n_users) * split.train.n_users
        config = replace(config, expected_clients=expected * (1 - config.dropout))
    model = FedMF(split.train, config, context.seeds)

    def utility() -> dict[str, float]:
        predictions = model.predict(split.test.users, split.test.items)
        return {
            "rmse": rmse(predictions, split.test.ratings),
            "mae": mae(predictions, split.test.ratings),
        }

    return ModelRun(model, utility, split.train, sampling, config.dropout)


def gradient_inversion(view: ServerView, truth: object) -> AttackOutcome:
    """:func:`securefed.attacks.verify` on a FedMF view, scored against the training ratings."""
    from securefed.attacks import verify

    report = verify(view, truth)
    measures = tuple(
        LeakMeasure(
            key,
            report.overall.get(key, float("nan")),
            report.baseline.get(key, float("nan")),
            "lower" if key in _LOWER_IS_LEAKIER else "higher",
        )
        for key in FEDMF_LEAK_MEASURES
        if key in report.overall
    )
    return AttackOutcome(measures, tuple(report.attacks_applied), " ".join(report.notes))


FEDMF = ModelPlugin(
    "fedmf",
    build_fedmf,
    utility_columns=("rmse", "mae"),
    variants=("fedmf", "fedrec", "fedrec+"),
    attacks=("gradient-inversion",),
    summary="FedMF, FedRec, FedRec+ (Chai et al. 2020; Liang et al. 2021) on a ratings split",
    table_note="DP cells: user_level_dp_config (fixed-denominator aggregation, user-mean offset).",
)
GRADIENT_INVERSION = AttackPlugin(
    "gradient-inversion",
    gradient_inversion,
    table_measures=("exact_share", "rmse", "f1", "filled_identified"),
    summary="FedMF gradient inversion and rated-item tests (securefed.attacks.verify)",
)
register_model(FEDMF)
register_attack(GRADIENT_INVERSION)
