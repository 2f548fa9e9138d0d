"""``securefed bench rl-leak``: what an honest-but-curious server learns in FedHPD and FedSlate.

::

    securefed bench rl-leak                       # both attacks, short schedules, a few minutes
    securefed bench rl-leak --quick               # smaller, for a smoke test
    securefed bench rl-leak --out results/rl_leak

FedHPD (:mod:`securefed.attacks.policy_leak`): one CartPole population trained together, the same
seed
over several transports (plaintext; secure aggregation; secure aggregation + distributed DP;
central DP over plaintext; local DP at several noise multipliers), every transport keeping all
payloads in its ServerView; the policy-clone attack on each view against the agents' true recent
returns, beside the chance baseline, with each run's utility (mean return of its last rounds)
and the privacy spent (epsilon at delta 1e-5, from the transport's ledger).

FedSlate (:mod:`securefed.attacks.qvalue_leak`): one run whose plaintext fusion channel keeps
every exchange in its view (``keep_payloads=ALL_PAYLOADS``), the truth replayed from the public
simulator; the Q-value attack for every target with a quarter and half of the users labelled,
the shadow attacker, and post-hoc noised Q-values. Rows for the fusion channels that cannot
serve FedSlate's server network give the channel's own reason for refusing.

Writes ``rl_leak.json`` and ``rl_leak.md`` into ``--out`` (default ``results/rl_leak``).
"""

from __future__ import annotations

import argparse
import math
import platform
import sys
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from securefed.bench.registry import BENCHES
from securefed.bench.tables import markdown_table
from securefed.records import dumps_record

RESULTS = Path("results") / "rl_leak"


@dataclass(frozen=True)
class LeakBenchConfig:
    """Sizes of the benchmark (``--quick`` shrinks them).

    Attributes:
        hpd_rounds: FedHPD training rounds (CartPole, all ten agents, ``d = 5``).
        hpd_public: size of ``S_p``; hpd_part: states per part; hpd_loops: loops per event.
        hpd_virtual: rounds of the virtual agent that makes ``S_p``.
        dp_sigmas: local-DP noise multipliers (clip ``sqrt(part)``: never binding).
        clone_episodes: rollouts per clone.
        slate_episodes: FedSlate episodes (users per deployment); slate_members: deployments.
        noise_stds: post-hoc Gaussian noise on the recorded Q-values.
        seed: FedHPD's run seed.
        slate_seed: FedSlate's run seed.
    """

    hpd_rounds: int = 100
    hpd_public: int = 600
    hpd_part: int = 300
    hpd_loops: int = 2
    hpd_virtual: int = 300
    dp_sigmas: tuple[float, ...] = (0.01, 0.1, 1.0)
    clone_episodes: int = 32
    slate_episodes: int = 40
    slate_members: int = 4
    noise_stds: tuple[float, ...] = (0.3, 1.0, 3.0)
    seed: int = 20
    slate_seed: int = 3

    def __post_init__(self) -> None:
        for name in ("hpd_rounds", "hpd_public", "hpd_part", "hpd_loops", "hpd_virtual",
                     "clone_episodes", "slate_episodes", "slate_members"):  # fmt: skip
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if self.hpd_rounds < 10 or self.slate_episodes < 6:
            raise ValueError("need hpd_rounds >= 10 and slate_episodes >= 6")
        if any(not s > 0 for s in self.dp_sigmas) or any(s < 0 for s in self.noise_stds):
            raise ValueError("dp_sigmas must be > 0 and noise_stds >= 0")


QUICK = LeakBenchConfig(
    hpd_rounds=30, hpd_public=300, hpd_part=150, hpd_loops=1, hpd_virtual=60,
    dp_sigmas=(0.1,), clone_episodes=8, slate_episodes=8, slate_members=2, noise_stds=(1.0,),
)  # fmt: skip


def _log(message: str) -> None:
    print(f"[rl-leak] {message}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------ FedHPD


def hpd_transports(config, bench: LeakBenchConfig) -> dict[str, object]:
    """The transports of the FedHPD population, by row label (all keep every payload)."""
    from securefed import RoundSelection
    from securefed.transport import build_transport

    keep = RoundSelection(every=True)
    clip = math.sqrt(config.part_size)  # a part of probability rows has L2 norm <= sqrt(rows)
    common = {"keep_payloads": keep, "n_clients": config.n_agents,
              "total_rounds": config.aggregation_rounds()}  # fmt: skip

    def make(name: str, sigma: float | None = None) -> object:
        options = None if sigma is None else {"dp.noise_multiplier": sigma, "dp.clip": clip}
        return build_transport(name, options, **common)

    rows = {
        "plaintext": make("plaintext"),
        "secagg": make("secagg"),
        "secagg+dp (distributed, sigma 1)": make("secagg+dp", 1.0),
        "dp (central, sigma 1)": make("dp", 1.0),
    }
    for sigma in bench.dp_sigmas:
        rows[f"dp (local, sigma {sigma:g})"] = make("dp-local", sigma)
    return rows


def run_fedhpd(bench: LeakBenchConfig) -> dict[str, object]:
    """Train the FedHPD population and attack every view; returns the record."""
    import torch

    from securefed.attacks.policy_leak import CloneConfig, PolicyProtocol, verify_policy_leak
    from securefed.rl.fast import make_public_states, train_population
    from securefed.rl.fedhpd import FedHPDConfig, RunSpec

    torch.set_num_threads(1)
    config = FedHPDConfig(
        task="cartpole", d=5, rounds=bench.hpd_rounds, public_size=bench.hpd_public,
        part_size=bench.hpd_part, distill_loops=bench.hpd_loops, virtual_rounds=bench.hpd_virtual,
    )  # fmt: skip
    started = time.perf_counter()
    public = make_public_states(config)
    public_seconds = time.perf_counter() - started
    _log(f"FedHPD: public state set of {len(public)} states in {public_seconds:.0f} s")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Opacus's alpha-range hint for large epsilons
        transports = hpd_transports(config, bench)
        runs = [RunSpec(config, bench.seed, t, public) for t in transports.values()]
        started = time.perf_counter()
        results = train_population(runs)
        train_seconds = time.perf_counter() - started
        _log(f"FedHPD: {len(runs)} runs trained together in {train_seconds:.0f} s")
        protocol = PolicyProtocol.from_config(config)
        clone = CloneConfig(episodes=bench.clone_episodes)
        rows = []
        for (label, transport), result in zip(transports.items(), results, strict=True):
            started = time.perf_counter()
            report = verify_policy_leak(
                transport.view, protocol, public, result.returns, config=clone
            )
            epsilon = transport.epsilon() if hasattr(transport, "epsilon") else None
            rows.append({
                "transport": label,
                "view": transport.view.transport,
                "method": report.method,
                "attack": report.overall,
                "baseline": report.baseline,
                "noise_std": report.noise_std,
                "epsilon": epsilon,
                "utility_last20": float(result.returns[-20:].mean()),
                "attack_seconds": time.perf_counter() - started,
                "notes": list(report.notes),
            })  # fmt: skip
            _log(f"FedHPD {label}: {report.method}, MAE {report.overall['mae']:.1f} "
                 f"(baseline {report.baseline['mae']:.1f})")  # fmt: skip
    return {
        "config": {
            "task": "cartpole", "agents": config.n_agents, "rounds": config.rounds, "d": config.d,
            "events": protocol.n_events, "public_size": config.public_size,
            "part_size": config.part_size, "distill_loops": config.distill_loops,
            "virtual_rounds": config.virtual_rounds, "seed": bench.seed,
            "clone": asdict(clone), "window": 10,
        },
        "public_set_seconds": public_seconds,
        "train_seconds": train_seconds,
        "rows": rows,
    }  # fmt: skip


# ------------------------------------------------------------------------------ FedSlate


POST_HOC_NOISE = (
    "the 'noised (post hoc)' rows add Gaussian noise to a plaintext run's recorded Q-values "
    "(utility under that noise not measured); the dp fusion channel noises them in the run "
    "itself: securefed bench fedslate-leak measures this attack and the run's rewards under it"
)


def fusion_refusals(config) -> dict[str, str]:
    """Why each fusion channel other than plaintext and dp cannot serve ``config``'s server
    network (the registry's own words), and what the post-hoc rows stand for (``dp`` row)."""
    from securefed.fusion import FUSION_CHANNELS, fusion_refusal

    needs = config.fusion_needs()
    out = {}
    for name in FUSION_CHANNELS:
        why = fusion_refusal(name, needs)
        if why is not None:
            out[name] = why
    out["dp"] = f"runs (not measured in this bench); {POST_HOC_NOISE}"
    return out


def run_fedslate(bench: LeakBenchConfig) -> dict[str, object]:
    """Record one FedSlate run and attack its record; returns the record of results."""
    import torch

    from securefed import ALL_PAYLOADS, SeedTree
    from securefed.attacks.qvalue_leak import (
        QLeakConfig,
        perturb_record,
        read_inquiries,
        replay_truth,
        verify_qvalue_leak,
    )
    from securefed.rl.fedslate import FedSlateConfig
    from securefed.rl.fedslate import run_fedslate as train

    config = FedSlateConfig(
        episodes=bench.slate_episodes, members=bench.slate_members, burn_in=300,
        eps_decay=0.99, seed=bench.slate_seed,
    )  # fmt: skip
    torch.set_num_threads(config.threads)  # the run sets no global state
    started = time.perf_counter()
    result = train(config, keep_payloads=ALL_PAYLOADS)
    record = read_inquiries(result.fusion_view)
    train_seconds = time.perf_counter() - started
    truth = replay_truth(config, record, result)
    _log(f"FedSlate: {record.inquiries} inquiries x {record.members} deployments recorded in "
         f"{train_seconds:.0f} s")  # fmt: skip
    length = config.steps_per_platform
    rows = []
    settings = [("plaintext", record, fraction, True) for fraction in (0.25, 0.5)]
    noise_rng = SeedTree(bench.slate_seed).generator("rl-leak", "post-hoc-noise")
    for std in bench.noise_stds:
        settings.append((f"noised (post hoc, std {std:g})",
                         perturb_record(record, std, noise_rng), 0.5, False))  # fmt: skip
    for label, view, fraction, shadow in settings:
        started = time.perf_counter()
        report = verify_qvalue_leak(
            view, truth, length, config=QLeakConfig(labelled_fraction=fraction), shadow=shadow
        )
        rows.append({
            "view": label, "labelled_fraction": fraction, "labelled_users": report.labelled_users,
            "users": report.users, "noise_std": report.noise_std, "targets": report.targets,
            "attack_seconds": time.perf_counter() - started, "notes": list(report.notes),
        })  # fmt: skip
        nke = report.targets["nke"]
        _log(f"FedSlate {label} ({fraction:g} labelled): nke R^2 {nke['attack']['r2']:.2f} "
             f"(step {nke['step']['r2']:.2f}, mean {nke['mean']['r2']:.2f})")  # fmt: skip
    q_std = float(np.mean([record.inputs[p].std() for p in record.parties]))
    return {
        "config": {
            "episodes": config.episodes, "members": config.members, "burn_in": config.burn_in,
            "eps_decay": config.eps_decay, "seed": config.seed, "steps_per_episode": length,
            "num_candidates": config.num_candidates, "slate_size": config.slate_size,
        },
        "train_seconds": train_seconds,
        "qvalue_std": q_std,
        "messages": {"acting_inquiries": record.inquiries,
                     "learning_forwards": record.learning_forwards,
                     "target_forwards": record.target_forwards,
                     "backwards": record.backwards},
        "fusion_bytes": dict(zip(("up", "down"), result.fusion_view.total_bytes(), strict=True)),
        "rows": rows,
        "not_applicable": fusion_refusals(config),
    }  # fmt: skip


# ------------------------------------------------------------------------------ output


def _f(value: object, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    if isinstance(value, float) and abs(value) >= 1e4:
        return f"{value:.3g}"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def markdown(record: dict[str, object]) -> str:
    """The two tables of the benchmark as markdown."""
    lines = ["# RL leak benchmark", ""]
    hpd = record.get("fedhpd")
    if hpd:
        c = hpd["config"]
        lines += [
            f"## FedHPD: policy clone (CartPole, {c['agents']} agents, {c['rounds']} rounds, "
            f"d={c['d']}, {c['events']} events, |S_p|={c['public_size']}, seed {c['seed']})",
            "",
            "Truth: each agent's mean return over the 10 rounds before each event. Baseline: the "
            "population's mean at that event for every agent (and a random ranking).",
            "",
        ]
        headers = [
            "transport",
            "view",
            "method",
            "MAE",
            "baseline MAE",
            "Spearman",
            "baseline",
            "Spearman within event",
            "link accuracy (chance)",
            "noise std",
            "epsilon",
            "utility (last 20 rounds)",
        ]
        body = []
        for row in hpd["rows"]:
            a, b = row["attack"], row["baseline"]
            body.append(
                (
                    row["transport"],
                    row["view"],
                    row["method"],
                    _f(a["mae"], 1),
                    _f(b["mae"], 1),
                    _f(a["spearman"]),
                    _f(b["spearman"]),
                    _f(a["spearman_within_event"]),
                    f"{_f(a['link_accuracy'])} ({_f(a['link_chance'])})",
                    _f(row["noise_std"], 3),
                    _f(row["epsilon"], 1),
                    _f(row["utility_last20"], 1),
                )
            )
        lines += [markdown_table(headers, body), ""]
    slate = record.get("fedslate")
    if slate:
        c = slate["config"]
        lines += [
            f"## FedSlate: user state from Q-values ({c['members']} deployments x "
            f"{c['episodes']} users, {c['steps_per_episode']} inquiries each, seed {c['seed']})",
            "",
            "R^2 within each deployment, averaged, on the unlabelled users (shadow: on every "
            f"user). Q-value std in the record: {slate['qvalue_std']:.3f}.",
            "",
        ]
        headers = [
            "view",
            "labelled",
            "target",
            "attack R^2",
            "step-only R^2",
            "mean R^2",
            "shadow R^2",
            "attack MAE",
            "mean MAE",
            "target std",
        ]
        body = [
            (
                row["view"],
                f"{row['labelled_users']}/{row['users']}",
                name,
                _f(t["attack"]["r2"]),
                _f(t["step"]["r2"]),
                _f(t["mean"]["r2"]),
                _f(t.get("shadow", {}).get("r2")),
                _f(t["attack"]["mae"], 3),
                _f(t["mean"]["mae"], 3),
                _f(t["target_std"], 3),
            )
            for row in slate["rows"]
            for name, t in row["targets"].items()
        ]
        lines += [markdown_table(headers, body), ""]
        lines += [markdown_table(("transport", "status"), slate["not_applicable"].items()), ""]
    lines.append(f"Total {record['seconds']:.0f} s on {record['machine']}.")
    return "\n".join(lines) + "\n"


def run(bench: LeakBenchConfig, out: Path, parts: tuple[str, ...]) -> dict[str, object]:
    """Run the chosen parts and write ``rl_leak.json`` and ``rl_leak.md`` into ``out``."""
    started = time.perf_counter()
    record: dict[str, object] = {"bench": asdict(bench)}
    if "fedhpd" in parts:
        record["fedhpd"] = run_fedhpd(bench)
    if "fedslate" in parts:
        record["fedslate"] = run_fedslate(bench)
    record["seconds"] = time.perf_counter() - started
    python = platform.python_version()
    record["machine"] = f"{platform.machine()} {platform.system()}, Python {python}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "rl_leak.json").write_text(dumps_record(_plain(record), indent=1))
    (out / "rl_leak.md").write_text(markdown(record))
    return record


def _plain(value: object) -> object:
    """JSON-ready (tuples to lists, NaN to None)."""
    from securefed.attacks.verify import _jsonable

    return _jsonable(value)


def _run_cli(args: argparse.Namespace) -> int:
    bench = QUICK if args.quick else LeakBenchConfig()
    parts = tuple(p.strip() for p in args.parts.split(",") if p.strip())
    unknown = set(parts) - {"fedhpd", "fedslate"}
    if unknown or not parts:
        raise ValueError(f"--parts takes fedhpd and/or fedslate, got {args.parts!r}")
    record = run(bench, Path(args.out), parts)
    print(markdown(record))
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default=str(RESULTS), help="directory for rl_leak.json / .md")
    parser.add_argument("--quick", action="store_true", help="smaller sizes (a smoke test)")
    parser.add_argument("--parts", default="fedhpd,fedslate", help="fedhpd, fedslate or both")


def register(benches) -> None:
    """Add ``rl-leak`` to the ``securefed bench`` subcommands."""
    parser = BENCHES["rl-leak"].add_to(benches)
    add_arguments(parser)
    parser.set_defaults(func=_run_cli)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    return _run_cli(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
