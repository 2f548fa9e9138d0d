"""One DP-ALS run (``securefed fedmf --variant als``): build the transport, train, evaluate.

The transport is built for ``config.releases`` rounds (the bias release and the passes), so that a
DP transport's calibration splits the epsilon target evenly over them, with every client in every
round (DP-ALS sums every user's statistics; no sampling amplification is claimed).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from securefed.bench.experiment import split_fields
from securefed.randomness import SeedTree
from securefed.recsys.baselines import damped_baseline
from securefed.recsys.dp_als import DPALS, DPALSConfig
from securefed.recsys.metrics import mae, rmse
from securefed.runtime import RunOptions, run_rounds
from securefed.transport import build_transport, parse_transport_spec, resolve_options
from securefed.views import NO_PAYLOADS, RoundSelection

if TYPE_CHECKING:
    from securefed.recsys.data import Split


@dataclass(frozen=True)
class DPALSRun:
    """A DP-ALS run: the model's config, the transport spec and options, the seed.

    Attributes:
        config: DP-ALS hyper-parameters.
        transport: transport name or spec string.
        transport_options: more options (``{"dp.epsilon": 8.0}``).
        seed: ``None``: secure mode (OS entropy); else seeded (reproducible, not private).
        keep_payloads: rounds whose per-client payloads the view keeps (for attacks).
        progress: show a progress bar.
    """

    config: DPALSConfig = field(default_factory=DPALSConfig)
    transport: str = "plaintext"
    transport_options: dict = field(default_factory=dict)
    seed: int | None = None
    keep_payloads: RoundSelection = NO_PAYLOADS
    progress: bool | None = False


def run_dp_als(split: Split, run: DPALSRun) -> tuple[dict, DPALS, object]:
    """Train DP-ALS on ``split.train`` and evaluate on ``split.test``.

    Returns:
        ``(record, model, transport)``; the record holds rmse, mae, the non-private damped
        baseline's rmse on the same split, seconds, bytes, and with a DP transport
        ``epsilon`` (against the released model) and ``epsilon_server``.
    """
    cfg = run.config
    seeds = SeedTree.secure_mode() if run.seed is None else SeedTree(run.seed)
    spec = parse_transport_spec(run.transport)
    groups = resolve_options(spec, run.transport_options)
    transport = build_transport(
        spec.name,
        groups,
        keep_payloads=run.keep_payloads,
        total_rounds=cfg.releases,
        n_clients=split.train.n_users,
    )
    model = DPALS(split.train, cfg, seeds)
    started = time.perf_counter()
    history = run_rounds(
        model,
        transport,
        seeds,
        RunOptions(rounds=cfg.releases, progress=run.progress, on_budget_exhausted="raise"),
    )
    seconds = time.perf_counter() - started
    predictions = model.predict(split.test.users, split.test.items)
    baseline = damped_baseline(split.train)
    up_client, down_client = transport.view.mean_bytes_per_client()
    record = {
        **split_fields(split),
        "variant": "als",
        "transport": run.transport,
        "rounds": cfg.releases,
        "seed": run.seed,
        "randomness": seeds.randomness,
        "rmse": rmse(predictions, split.test.ratings),
        "mae": mae(predictions, split.test.ratings),
        "damped_baseline_rmse": rmse(
            baseline.predict(split.test.users, split.test.items), split.test.ratings
        ),
        "train_rmse": history.last().get("train_rmse", float("nan")),
        "noise_std": [float(x) for x in model.noise_std],
        "items_with_factors": int(np.sum(model.item_count >= cfg.min_count)),
        "seconds": seconds,
        "bytes_up_per_client": up_client,
        "bytes_down_per_client": down_client,
        "config": asdict(cfg),
    }
    ledger = getattr(transport, "ledger", None)
    if ledger is not None:
        record["epsilon"] = transport.epsilon()
        record["epsilon_server"] = transport.epsilon(against="server")
        record["delta"] = transport.delta
        record["noise_multiplier"] = transport.config.noise_multiplier
    return record, model, transport


# Options of ``securefed fedmf`` that configure gradient FedMF only: refused with --variant als.
FEDMF_ONLY_OPTIONS = (
    "rounds",
    "lr",
    "server_lr",
    "reg",
    "biases",
    "reg_bias",
    "item_damping",
    "user_damping",
    "bias_upload_scale",
    "server_optimiser",
    "validation",
    "init_std",
    "upload",
    "aggregation",
    "offset",
    "server_state",
    "rho",
    "weighting",
    "filling_regularisation",
    "dropout",
    "clients_per_round",
    "cyclic_groups",
    "clip",
    "checkpoint_dir",
    "checkpoint_key_file",
    "preset",
    "rating_unit",
    "patience",
    "validate_every",
    "min_rounds",
    "smoothing",
)


def als_config_from_args(dim: int | None, options: list[str] | None) -> DPALSConfig:
    """``DPALSConfig`` from ``--dim`` and ``--als-option KEY=VALUE`` items.

    Raises:
        ValueError: an item is not ``KEY=VALUE``, names no field of ``DPALSConfig``, or its
            value is invalid.
    """
    known = {f.name: f.type for f in DPALSConfig.__dataclass_fields__.values()}
    values: dict[str, object] = {} if dim is None else {"dim": dim}
    for item in options or []:
        key, sep, text = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in known:
            raise ValueError(
                f"--als-option {item!r}: expected KEY=VALUE with KEY one of {sorted(known)}"
            )
        kind = known[key]
        try:
            values[key] = text if kind == "str" else (int(text) if kind == "int" else float(text))
        except ValueError as error:
            raise ValueError(f"--als-option {item!r}: {key} takes a {kind}") from error
    return DPALSConfig(**values)


def refuse_fedmf_options(args) -> None:
    """Refuse, naming them, the given ``securefed fedmf`` options that DP-ALS does not use.

    Raises:
        ValueError: one or more FedMF-only options were given.
    """
    given = [name for name in FEDMF_ONLY_OPTIONS if getattr(args, name, None) is not None]
    if given:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise ValueError(
            f"{flags} configure(s) gradient FedMF and do not apply to --variant als (DP-ALS: "
            "one bias release and --als-option passes=P item passes, every user in every "
            "release, its sensitivity set by user_clip, rating_clip and max_ratings; the DP "
            "clip stays 1 since uploads are normalised): drop them"
        )
