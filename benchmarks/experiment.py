"""One FedMF training run, end to end: data, transport, rounds, evaluation, result record."""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from securefed import ClientSampling, RoundSelection, RunOptions, SeedTree, run_rounds
from securefed.records import dumps_record
from securefed.recsys.data import Split
from securefed.recsys.fedmf import FedMF, FedMFConfig, rating_unit
from securefed.recsys.metrics import mae, ranking_metrics, rmse
from securefed.recsys.validation import (
    EarlyStopping,
    best_round,
    holdout_split,
    smoothed_curve,
)
from securefed.transport import (
    PlaintextTransport,
    build_transport,
    option_groups,
    parse_transport_spec,
    resolve_options,
)
from securefed.transport.ddp import INTEGER_MECHANISMS
from securefed.transport.registry import default_mechanism, integer_dp_around


@dataclass(frozen=True)
class FedMFRun:
    """What to run: the model, the transport, the loop.

    ``transport`` is a name or spec string of :mod:`securefed.transport.registry` and
    ``transport_options`` its options (``{"epsilon": 4.0, "clip": 1.0}``, option names as the
    registry takes them). ``seed``: ``None`` (the default) for secure mode (OS entropy for every
    key, mask and noise; its checkpoints need ``checkpoint_key``), or the run's seed (tests and
    benchmarks: reproducible, and the record says "seeded: not private"). ``blas_threads``: the BLAS
    threads of the rounds (:attr:`securefed.runtime.RunOptions.blas_threads`; ``None`` leaves the
    process's).
    """

    config: FedMFConfig = field(default_factory=FedMFConfig)
    transport: str = "plaintext"
    seed: int | None = None
    sampling: ClientSampling = field(default_factory=ClientSampling)
    keep_payloads: RoundSelection = field(default_factory=RoundSelection)
    checkpoint_dir: str | os.PathLike | None = None
    checkpoint_every: int = 50
    checkpoint_key: bytes | None = field(default=None, repr=False)
    progress: bool | None = None
    ranking: bool = False
    transport_options: dict = field(default_factory=dict)
    warm_start_rounds: int = 0
    validation: float | None = None
    early_stopping: EarlyStopping = field(default_factory=EarlyStopping)
    blas_threads: int | None = 1

    def __post_init__(self) -> None:
        if self.validation is not None and self.warm_start_rounds:
            raise ValueError("validation cannot be combined with warm_start_rounds")
        if not 0 <= self.warm_start_rounds < max(self.config.rounds, 1):
            raise ValueError(
                f"warm_start_rounds must lie in [0, rounds), got {self.warm_start_rounds}"
            )
        if self.warm_start_rounds and self.checkpoint_dir is not None:
            raise ValueError("warm_start_rounds cannot be combined with checkpoints")


# The transport a warm start runs over: the same sums in the clear (same noise and ledger for DP).
WARM_START_TRANSPORT = {
    "secagg": "plaintext",
    "ckks": "plaintext",
    "secagg+dp": "dp",
    "ckks+dp": "dp",
}


class _Stopped(Exception):
    """Raised from the round callback once early stopping has decided (caught in this module)."""


def choose_rounds(split: Split, run: FedMFRun) -> dict:
    """The number of rounds by the validation rule (:mod:`securefed.recsys.validation`).

    Holds out ``run.validation`` of each user's training ratings (the test set stays out),
    trains on the rest over ``run``'s transport for at most ``config.rounds`` rounds, evaluates
    the validation RMSE every ``early_stopping.every`` rounds and stops ``patience`` rounds after
    the best of the smoothed curve (never before ``min_rounds``).

    Returns:
        ``{"rounds": chosen, "stopped_early": bool, "curve": [[rounds, rmse], ...],
        "seconds": float, ...}``.

    Raises:
        InsecureParameterError: a transport that charges a privacy ledger (a choice made on the
            private ratings is a release the ledger would not count).
    """
    from securefed.errors import InsecureParameterError

    if "dp" in option_groups(parse_transport_spec(run.transport).name):
        raise InsecureParameterError(
            f"validation over {run.transport!r}: choosing the rounds from the private ratings "
            "spends privacy that the DP ledger does not count; choose them on public data"
        )
    seeds = SeedTree.secure_mode() if run.seed is None else SeedTree(run.seed)
    parts = holdout_split(split.train, run.validation, seeds.generator("validation"))
    inner = Split(parts.train, parts.test, f"{split.name}/validation")
    # min_delta is in learning units (FedMFConfig.rating_unit): a doubled scale doubles RMSEs.
    unit = rating_unit(run.config.rating_unit, split.train.scale)
    stopping, curve = replace(run.early_stopping, min_delta=run.early_stopping.min_delta * unit), []

    def on_round(model: FedMF, round_id: int) -> None:
        if not stopping.evaluates(round_id):
            return
        predictions = model.predict(inner.test.users, inner.test.items)
        curve.append((round_id + 1, rmse(predictions, inner.test.ratings)))
        if best_round(curve, stopping)[1]:
            raise _Stopped

    started = time.perf_counter()
    with contextlib.suppress(_Stopped):
        _train(inner, replace(run, validation=None, checkpoint_dir=None), on_round)
    seconds = time.perf_counter() - started
    if not curve:
        raise ValueError(
            f"validation evaluates every {stopping.every} rounds but the run has only "
            f"{run.config.rounds}"
        )
    rounds, stopped = best_round(curve, stopping)
    return {
        "rounds": rounds,
        "stopped_early": stopped,
        "curve": [[r, v] for r, v in curve],
        "smoothed": smoothed_curve(curve, stopping.smoothing),
        "seconds": seconds,
        "fraction": run.validation,
        "max_rounds": run.config.rounds,
        "patience": stopping.patience,
        "every": stopping.every,
        "min_rounds": stopping.min_rounds,
        "smoothing": stopping.smoothing,
        "min_delta": stopping.min_delta,
    }


def run_fedmf(split: Split, run: FedMFRun) -> tuple[dict, FedMF, object]:
    """Train, evaluate, and return ``(result record, model, transport)``.

    With ``run.validation`` the number of rounds is first chosen by :func:`choose_rounds`
    (``config.rounds`` is then the most it may pick) and the model is trained on all the
    training ratings for that many; the record's ``validation`` entry holds the curve, and
    ``seconds`` the final run's time (``validation["seconds"]`` the choice's).

    The record holds at least: rmse, mae, variant, transport, rounds, seconds, bytes_up,
    bytes_down (totals over the run), bytes_up_per_client and bytes_down_per_client (mean per
    participating client per round), round_seconds and round_cpu_seconds (every round's wall
    and CPU seconds, a warm start's rounds first: ``seconds`` counts only the others), and the
    data set's name and sizes.
    """
    validation = None
    if run.validation is not None:
        validation = choose_rounds(split, run)
        run = replace(run, config=replace(run.config, rounds=validation["rounds"]), validation=None)
    record, model, transport = _train(split, run, None)
    if validation is not None:
        record["validation"] = validation
    return record, model, transport


def _train(split: Split, run: FedMFRun, on_round) -> tuple[dict, FedMF, object]:
    """One run of ``run.config.rounds`` rounds (``on_round(model, round_id)`` after each)."""
    cfg = run.config
    if cfg.aggregation == "fixed" and cfg.expected_clients is None:
        # The public denominator: the expected number of uploads under the run's sampling.
        expected = run.sampling.rate(split.train.n_users) * split.train.n_users
        cfg = replace(cfg, expected_clients=expected * (1 - cfg.dropout))
    seeds = SeedTree.secure_mode() if run.seed is None else SeedTree(run.seed)
    spec = parse_transport_spec(run.transport)
    groups = resolve_options(spec, run.transport_options)
    context = {
        "total_rounds": cfg.rounds,
        "n_clients": split.train.n_users,
        "dropout": cfg.dropout,
        "sample_rate": run.sampling.rate(split.train.n_users),
    }
    transport = build_transport(spec.name, groups, keep_payloads=run.keep_payloads, **context)
    model = FedMF(split.train, cfg, seeds)
    clock = RoundClock()
    if run.warm_start_rounds:
        _warm_start(model, run, spec.name, groups, context, transport, seeds, clock)
    fingerprint = {
        "config": asdict(cfg),
        "transport": run.transport,
        "sampling": asdict(run.sampling),
        "data": split.name,
        "n_train": len(split.train),
    }
    started = time.perf_counter()
    clock.restart()

    def after_round(round_id: int, _metrics) -> None:
        clock.tick()
        if on_round is not None:
            on_round(model, round_id)
            clock.restart()  # the caller's evaluation is no round's cost

    history = run_rounds(
        model,
        transport,
        seeds,
        RunOptions(
            rounds=cfg.rounds,
            sampling=run.sampling,
            checkpoint_dir=run.checkpoint_dir,
            checkpoint_every=run.checkpoint_every,
            checkpoint_key=run.checkpoint_key,
            progress=run.progress,
            fingerprint=fingerprint,
            first_round=run.warm_start_rounds,
            on_budget_exhausted="raise",
            blas_threads=run.blas_threads,
        ),
        on_round=after_round,
    )
    seconds = time.perf_counter() - started
    predictions = model.predict(split.test.users, split.test.items)
    up, down = transport.view.total_bytes()
    up_client, down_client = transport.view.mean_bytes_per_client()
    record = {
        **split_fields(split),
        "variant": cfg.variant,
        "transport": run.transport,
        "rounds": cfg.rounds,
        "warm_start_rounds": run.warm_start_rounds,
        "resumed_from": history.resumed_from,
        "seed": run.seed,
        "randomness": seeds.randomness,
        "rmse": rmse(predictions, split.test.ratings),
        "mae": mae(predictions, split.test.ratings),
        "train_rmse": history.last().get("train_rmse", float("nan")),
        "seconds": seconds,
        "round_seconds": clock.seconds,
        "round_cpu_seconds": clock.cpu_seconds,
        "bytes_up": up,
        "bytes_down": down,
        "bytes_up_per_client": up_client,
        "bytes_down_per_client": down_client,
        "config": asdict(cfg),
        "sampling": asdict(run.sampling),
    }
    if run.ranking:
        record |= ranking_metrics(
            lambda users: model.U[users] @ model.V.T, split.train, split.test, k=10
        )
    if transport.ledger is not None:  # a DP transport (the registry gives every one a ledger)
        record["epsilon"] = transport.epsilon()
        record["epsilon_server"] = transport.epsilon(against="server")
        record["delta"] = transport.delta
        record["noise_multiplier"] = transport.config.noise_multiplier
        record["clip"] = transport.config.clip
    return record, model, transport


def split_fields(split: Split) -> dict:
    """The data fields of a result record: the split's name and sizes."""
    return {
        "data": split.name,
        "n_users": split.train.n_users,
        "n_items": split.train.n_items,
        "n_train": len(split.train),
        "n_test": len(split.test),
    }


class RoundClock:
    """Each round's wall-clock and CPU seconds (``time.process_time``) of a run, in order: the
    warm start's rounds first, then the others (``tick`` after each round, ``restart`` where
    untimed work between rounds ends)."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self.cpu_seconds: list[float] = []
        self.restart()

    def restart(self) -> None:
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def tick(self) -> None:
        wall, cpu = time.perf_counter(), time.process_time()
        self.seconds.append(wall - self._wall)
        self.cpu_seconds.append(cpu - self._cpu)
        self._wall, self._cpu = wall, cpu


def _warm_start(
    model,
    run: FedMFRun,
    name: str,
    groups: dict,
    context: dict,
    transport,
    seeds: SeedTree,
    clock: RoundClock,
) -> None:
    """Run the first ``run.warm_start_rounds`` rounds over the clear counterpart of the transport.

    Secure aggregation and CKKS compute the same sums as plaintext (up to their fixed-point and
    CKKS errors, measured by ``securefed bench fedmf-transport``) at a far higher cost, so a
    benchmark that attacks only the last rounds' view may run the earlier rounds in the clear.
    Under ``secagg+dp`` the warm rounds add the noise centrally: the sum of the clients'
    ``N(0, sigma^2 C^2 / n)`` shares is ``N(0, sigma^2 C^2)``, the same distribution (without
    dropouts), at a fraction of the cost; they are charged to the same privacy ledger, and
    against the server as the deployment would be (:meth:`DPTransport.charge_server_as`). The
    warm rounds' server view is discarded.
    """
    warm = warm_start_transport(name, groups, context, transport)
    clock.restart()
    run_rounds(
        model,
        warm,
        seeds,
        RunOptions(
            rounds=run.warm_start_rounds,
            sampling=run.sampling,
            progress=False,
            blas_threads=run.blas_threads,
        ),
        on_round=lambda _round, _metrics: clock.tick(),
    )


def warm_start_transport(name: str, groups: dict, context: dict, transport):
    """The clear counterpart of ``transport`` (:data:`WARM_START_TRANSPORT`) for a warm start.

    The same options; DP placed centrally and charged to ``transport``'s ledger, against the
    server as ``transport`` would be (:func:`_warm_start`'s docstring says why that is sound).
    """
    dp = groups.get("dp")
    if name == "secagg+dp" and dp is not None:
        dp = replace(dp, mechanism=default_mechanism(name, groups, "distributed"))
    if name == "secagg+dp" and dp is not None and dp.mechanism in INTEGER_MECHANISMS:
        # The integer mechanism over plaintext: the same clients' integers (the same seeded
        # streams and rotation), summed exactly, so the released sums are those secure
        # aggregation would decode, bit for bit (tests/test_discrete_dp.py pins it).
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # distributed over plaintext warns: a stand-in
            warm = integer_dp_around(
                PlaintextTransport(),
                dp,
                transport.ledger,
                context["sample_rate"],
                context["total_rounds"],
            )
        warm.charge_server_as(transport)
        return warm
    warm_name = WARM_START_TRANSPORT.get(name, name)
    warm_groups = {group: groups[group] for group in option_groups(warm_name)}
    if "dp" in warm_groups:
        warm_groups["dp"] = replace(warm_groups["dp"], placement="central")
    warm = build_transport(warm_name, warm_groups, ledger=transport.ledger, **context)
    if warm is not transport and warm.ledger is not None:
        warm.charge_server_as(transport)  # the same sums; the server's cost is the deployment's
    return warm


def save_json(record: dict, path: str | os.PathLike) -> Path:
    """Write a result record as indented JSON (numpy scalars converted)."""

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps_record(record, indent=2, default=_plain))
    return path


def _plain(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")
