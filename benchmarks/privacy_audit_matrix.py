"""``securefed bench privacy-audit`` (default mode): every recommender behind every DP transport.

Each row is one (recommender, transport, observer): the ledger's epsilon, the Gaussian-DP
*estimates* of white-box canaries (Andrew et al., ICLR 2024; :mod:`securefed.audit.whitebox`:
the noise family, the declared sensitivity over the noise measured along held-out directions,
and the mean-shift family, the canaries' own shift) and the *rigorous* one-run lower bound
(Steinke, Nasr and Jagielski 2023; a second run whose canaries are each included with
probability 1/2). Estimates are estimates (tight where the mechanism is Gaussian, no bound
elsewhere); the lower bound holds for any mechanism at its confidence.

The canaries go in through each recommender's documented hook, the models unchanged:

* FedMF, FedHPD and a ``securefed.torch`` FedAvg model: the generic hook
  (:class:`securefed.audit.hooks.CanaryTransport`), canary clients in every aggregation round
  of the model's block (FedMF's item block, FedHPD's distributions on the public states, the
  torch model's flattened update), the real clients next to them;
* FedSlate: canary units through its DP fusion channel's public forward
  (:func:`securefed.attacks.whitebox_hooks.fusion_whitebox_audit`); FedSlate's transports are
  its fusion channels, ``dp`` and ``ckks+dp`` (the DP rows are clamped there), so its rows
  stand for those.

Sizes are small (synthetic ratings, CartPole, a linear torch model, a tiny FedSlate), chosen so
that the whole matrix runs in minutes on two cores: the figures show the audit working through
every path, not a model's utility. Exit status 1 when a row contradicts its ledger (an
estimate's lower limit above it, Holm across its run's estimates, or the rigorous bound above
it).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from securefed import ClientSampling, RoundSelection, RunOptions, SeedTree, run_rounds
from securefed.audit.faults import inject_dp_fault
from securefed.audit.hooks import CanaryTransport
from securefed.audit.whitebox import (
    CanaryHook,
    WhiteBoxConfig,
    WhiteBoxReport,
    canary_directions,
    canary_schedule,
    inclusion_hook,
    rigorous_bounds,
)
from securefed.bench.bench_fedmf import markdown_table
from securefed.bench.registry import ExtraNotInstalled, extra_installed
from securefed.records import dumps_record
from securefed.transport import build_transport

RECOMMENDERS = ("fedmf", "fedhpd", "fedslate", "torch")
EXTRAS = {"fedmf": (), "fedhpd": ("rl",), "fedslate": ("rl",), "torch": ("torch",)}
"""The pip extras each recommender's row needs (beyond the bench's own ``dp``)."""
MODEL_TRANSPORTS = (
    "dp",
    "dp-local",
    "secagg+dp",
    "secagg+dp:mechanism=skellam",
    "ckks+dp:mechanism=gaussian",
)
"""The DP transports of the aggregation rounds: central, local, distributed under secure
aggregation with the exact discrete Gaussian (the default) and Skellam, and under CKKS (only
the float Gaussian, flagged ``distributed-dp-inexact`` by the parameter audit)."""
FUSION_TRANSPORTS = ("dp", "ckks+dp")
"""FedSlate's DP transports: its fusion channels (``securefed.fusion.registry.DP_CHANNELS``)."""
COLUMNS = [
    "recommender",
    "transport",
    "observer",
    "epsilon_ledger",
    "noise_estimate",
    "noise_estimate_low",
    "mean_shift_estimate",
    "mean_shift_estimate_low",
    "lower_bound",
    "contradicts_ledger",
    "canaries",
    "dim",
    "rounds",
    "seconds",
]


# ----------------------------------------------------------------------------- the models
@dataclass(frozen=True, eq=False)
class ModelCase:
    """A recommender audited through the generic hook.

    Attributes:
        block: the shape of one client's update in its aggregation rounds.
        n_clients: its own clients (the canaries' ids follow).
        rounds: its aggregation rounds of that block.
        clip: the DP clip its updates are bounded by (the canaries' norm is twice it).
        train: runs the model once over the given transport.
    """

    block: tuple[int, int]
    n_clients: int
    rounds: int
    clip: float
    train: Callable[[CanaryTransport], None]


def fedmf_case(seed: int) -> ModelCase:
    """FedMF (user-level DP settings, full uploads) on synthetic ratings, every user a round."""
    from securefed.recsys.data import synthetic_ratings
    from securefed.recsys.fedmf import FedMF, user_level_dp_config

    ratings = synthetic_ratings(60, 100, 900, seed=1)
    config = user_level_dp_config(rounds=2, dim=3)
    probe = FedMF(ratings, config, SeedTree(seed))

    def train(transport: CanaryTransport) -> None:
        model = FedMF(ratings, config, SeedTree(seed))
        options = RunOptions(rounds=config.rounds, sampling=ClientSampling(), progress=False)
        run_rounds(model, transport, SeedTree(seed), options)

    return ModelCase((probe.n_items + 2, config.dim + 1), probe.n_clients, 2, 1.0, train)


def fedhpd_case(seed: int) -> ModelCase:
    """FedHPD on CartPole, two agents, 100 public states, 4 distillation rounds."""
    import torch

    from securefed.attacks.whitebox_hooks import fedhpd_block
    from securefed.rl.fast import make_public_states, train_population
    from securefed.rl.fedhpd import FedHPDConfig, RunSpec
    from securefed.rl.policies import AGENTS

    torch.set_num_threads(1)  # tiny networks (securefed.rl.fast's note)
    cartpole = AGENTS["cartpole"]
    config = FedHPDConfig(
        task="cartpole",
        d=1,
        rounds=4,
        agent_specs=(cartpole[0], cartpole[5]),
        public_size=100,
        part_size=100,
        distill_loops=1,
        virtual_rounds=4,
    )
    public = make_public_states(config)

    def train(transport: CanaryTransport) -> None:
        train_population([RunSpec(config, 20 + seed, transport, public)])

    clip = math.sqrt(config.part_size)  # a part of probability rows has norm <= sqrt(rows)
    return ModelCase(
        fedhpd_block(config), config.n_agents, config.aggregation_rounds(), clip, train
    )


def torch_case(seed: int) -> ModelCase:
    """A ``securefed.torch`` FedAvg model: a linear layer, 20 clients, 2 rounds."""
    import torch

    from securefed.torch import FedAvg, FedAvgConfig, module_to_vector

    rng = np.random.default_rng(5)
    clients = [
        (
            torch.tensor(rng.normal(size=(8, 64)), dtype=torch.float32),
            torch.tensor(rng.normal(size=(8, 4)), dtype=torch.float32),
        )
        for _ in range(20)
    ]

    def build():
        generator = torch.Generator().manual_seed(seed)
        model = torch.nn.Linear(64, 4)
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.normal_(0.0, 0.1, generator=generator)
        return FedAvg(
            model,
            clients,
            lambda m, batch: torch.nn.functional.mse_loss(m(batch[0]), batch[1]),
            FedAvgConfig(client_lr=0.05, batch_size=8),
        )

    size = module_to_vector(torch.nn.Linear(64, 4)).size

    def train(transport: CanaryTransport) -> None:
        run_rounds(build(), transport, SeedTree(seed), RunOptions(rounds=2, progress=False))

    return ModelCase((1, size), len(clients), 2, 1.0, train)


CASES = {"fedmf": fedmf_case, "fedhpd": fedhpd_case, "torch": torch_case}


def _canaries(dim: int, limit: int) -> tuple[int, int]:
    """Constant canaries and held-out directions that fit ``dim`` (a third / two thirds)."""
    n = min(limit, dim // 3)
    return n, min(2 * n, dim - n)


def audit_model(
    name: str, transport_spec: str, epsilon: float, args: argparse.Namespace
) -> tuple[WhiteBoxReport, dict, dict[str, object]]:
    """Two runs of a model with canaries through ``transport_spec``: the estimates (every
    canary in every round) and the rigorous bound (each canary in with probability 1/2)."""
    case = CASES[name](args.seed)
    dim = case.block[0] * case.block[1]
    n, held = _canaries(dim, args.canaries)
    norm = 2 * case.clip
    config = WhiteBoxConfig(
        n_constant=n,
        n_alternating=0,
        n_held_out=held,
        rounds=case.rounds,
        norm=norm,
        dim=dim,
        delta=args.delta,
    )
    seeds = SeedTree(args.seed)
    directions = canary_directions(n + held, dim, seeds.generator("matrix", name, "directions"))
    hook = CanaryHook(
        directions[:n], canary_schedule(n, 0, case.rounds), norm, case.n_clients, case.block
    )
    options = {"epsilon": epsilon, "delta": args.delta, "dp.clip": case.clip}

    def transport(with_hook: CanaryHook) -> CanaryTransport:
        inner = build_transport(
            transport_spec,
            options,
            total_rounds=case.rounds,
            n_clients=case.n_clients + n,
            sample_rate=1.0,
            # Local DP: the server reads each payload; the canaries are scored on their own.
            keep_payloads=RoundSelection(every=transport_spec == "dp-local"),
        )
        return CanaryTransport(inner, with_hook)

    first = transport(hook)
    case.train(first)
    report = first.report(directions[n:], config)
    half, included = inclusion_hook(hook, case.rounds, seeds.generator("matrix", name, "in"))
    second = transport(half)
    case.train(second)
    bounds = rigorous_bounds(second.run(), hook.directions, included, config, second)
    return report, bounds, {"canaries": n, "dim": dim, "rounds": case.rounds}


def audit_fedslate(
    fusion: str, epsilon: float, args: argparse.Namespace
) -> tuple[WhiteBoxReport, dict, dict[str, object]]:
    """Canary units through a tiny FedSlate run's DP fusion channel (as the run builds it)."""
    from securefed.attacks.whitebox_hooks import FusionCanaryConfig, fusion_whitebox_audit
    from securefed.rl.fedslate import FedSlateConfig, features, start_run

    config = FedSlateConfig(
        num_candidates=6,
        slate_size=2,
        episodes=2,
        members=2,
        fusion=fusion,
        dp_epsilon=epsilon,
        dp_delta=args.delta,
        seed=args.seed,
        # CKKS evaluates only additions and multiplications: a polynomial server activation.
        server_activation="polynomial" if fusion == "ckks+dp" else None,
    )
    run = start_run(config)
    run.env.reset()
    sent = run.local[0].numpy_forward(features(run.env.observation(0), config)[:, None, :])
    canaries = FusionCanaryConfig(n_units=min(args.canaries, 200))
    report = fusion_whitebox_audit(
        run.channel, sent.shape[-1], canaries, SeedTree(args.seed).generator("matrix", "fs")
    )
    return (
        report,
        report.rigorous,
        {
            "canaries": canaries.n_units,
            "dim": sent.shape[-1],
            "rounds": run.channel.options.releases_per_unit,
        },
    )


def rows_of(
    recommender: str,
    transport: str,
    report: WhiteBoxReport,
    bounds: dict,
    sizes: dict[str, object],
    seconds: float,
) -> list[dict[str, object]]:
    """One row per observer with an estimate: ledger, estimates (and lows), bound, verdict."""
    rows = []
    for observer in ("released_model", "server"):
        # The server's own-payload families where it reads each upload (local DP).
        estimates = report.estimates
        noise = estimates.get(f"{observer}/own-noise") or estimates.get(f"{observer}/noise")
        shift = estimates.get(f"{observer}/own-payloads") or estimates.get(f"{observer}/constant")
        if noise is None and shift is None:
            continue
        bound = bounds.get(observer)
        ledger = report.epsilon_ledger[observer]
        contradicted = any(v for k, v in report.contradicted.items() if k.startswith(observer))
        exceeds = bound is not None and bound.epsilon_lower > ledger
        rows.append(
            {
                "recommender": recommender,
                "transport": transport,
                "observer": observer,
                "epsilon_ledger": ledger,
                "noise_estimate": None if noise is None else noise.epsilon,
                "noise_estimate_low": None if noise is None else noise.epsilon_low,
                "mean_shift_estimate": None if shift is None else shift.epsilon,
                "mean_shift_estimate_low": None if shift is None else shift.epsilon_low,
                "lower_bound": None if bound is None else bound.epsilon_lower,
                "contradicts_ledger": bool(contradicted or exceeds),
                **sizes,
                "seconds": seconds,
            }
        )
    return rows


def matrix(args: argparse.Namespace) -> int:
    """Every (recommender, transport) cell; the record; exit status 1 on a contradiction."""
    load_before = os.getloadavg()
    rows = []
    epsilon = args.epsilon
    chosen_recommenders = args.recommenders.split(",")
    for recommender in chosen_recommenders:
        if recommender not in RECOMMENDERS:
            raise ValueError(f"recommender must be one of {RECOMMENDERS}, got {recommender!r}")
        missing = [e for e in EXTRAS[recommender] if not extra_installed(e)]
        if missing:
            raise ExtraNotInstalled(f"bench privacy-audit --recommenders {recommender}", missing)
    for recommender in chosen_recommenders:
        transports = FUSION_TRANSPORTS if recommender == "fedslate" else MODEL_TRANSPORTS
        wanted = args.matrix_transports.split(";")
        chosen = [t for t in transports if "all" in wanted or t in wanted]
        for transport in chosen:
            started = time.perf_counter()
            guard = (
                contextlib.nullcontext() if args.fault == "none" else inject_dp_fault(args.fault)
            )
            with guard:
                if recommender == "fedslate":
                    report, bounds, sizes = audit_fedslate(transport, epsilon, args)
                else:
                    report, bounds, sizes = audit_model(recommender, transport, epsilon, args)
            cell = rows_of(
                recommender, transport, report, bounds, sizes, time.perf_counter() - started
            )
            rows.extend(cell)
            for row in cell:
                print(dumps_record(row), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "securefed bench privacy-audit " + " ".join(sys.argv[3:])
    record = {
        "command": command,
        "arguments": {k: v for k, v in vars(args).items() if k != "func"},
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "rows": rows,
    }
    (out / "privacy_audit_matrix.json").write_text(dumps_record(record, indent=2, default=str))
    header = (
        f"White-box canaries in every recommender behind every DP transport at target epsilon "
        f"{epsilon:g}, delta {args.delta:g}: noise_estimate and mean_shift_estimate are "
        "Gaussian-DP *estimates* (95% lower limits beside them), lower_bound the rigorous "
        "one-run bound (Steinke et al. 2023, 95%) from a second run whose canaries are each "
        f"included with probability 1/2. Fault injected: {args.fault} (securefed.audit.faults). "
        f"Command: `{command}`. Load average before/after: "
        f"{load_before[0]:.1f}/{os.getloadavg()[0]:.1f}."
    )
    (out / "privacy_audit_matrix.md").write_text(
        header + "\n\n" + markdown_table(rows, COLUMNS) + "\n"
    )
    broken = [r for r in rows if r["contradicts_ledger"]]
    for row in broken:
        print(
            f"privacy-audit: {row['recommender']} over {row['transport']} ({row['observer']}) "
            f"contradicts its ledger epsilon {row['epsilon_ledger']:.3g}",
            file=sys.stderr,
        )
    return 1 if broken else 0
