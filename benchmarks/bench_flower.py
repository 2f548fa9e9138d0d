"""Flower against the in-process runtime: round time, secure aggregation, ML-100K RMSE.

``securefed bench flower`` (or ``python -m securefed.bench.bench_flower``) runs the FedMF example
app
(``securefed/flower/app_template``) in Flower's simulation engine and the same configuration in
one process (``securefed.run_rounds``), in the same run, and reports:

1. the round time of ``--clients`` simulated SuperNodes (one user each) on Flower against the
   in-process round, plaintext: the overhead ratio;
2. the same with securefed's secure aggregation carried over Flower message rounds (four per
   training round) against secure aggregation in one process and against Flower plaintext;
   ``--parts ckks``: the same over CKKS (the nodes encrypt with provisioned keys, the server
   adds ciphertexts, a key-holder node decrypts in one more message round) against in-process
   CKKS;
3. FedMF on MovieLens 100K (u1) over Flower, every user its own SuperNode (``--ml-nodes``
   nodes), ``--ml-rounds`` rounds, against the in-process test RMSE of the same run (stops with
   the reason when ML-100K is not on this machine);
4. the same with the 943 users grouped on ``--ml-grouped-nodes`` SuperNodes: Flower 1.42's
   simulation engine scans every stored message for every node on each poll
   (``vce_api.add_messages_to_queue`` -> ``InMemoryLinkState.get_message_ins``), so its cost
   grows with the square of the number of nodes, and hosting many users per node avoids it;
5. ``fedhpd``: FedHPD (``securefed.rl.flower_fedhpd``, one agent per node) in plaintext and
   under secure aggregation against the in-process reference learner (same returns, max
   parameter difference, bytes, message rounds per round); ``--fedhpd-secagg`` adds the
   secure-aggregation runs with ``secagg-merge`` and ``secagg-advertise-ahead``;
6. ``fedslate``: FedSlate (``securefed.rl.flower_fedslate``: the user simulator and each
   platform a SuperNode, the server network in the ServerApp) in plaintext and under ``dp``
   against ``run_fedslate`` in one process (same rewards, max parameter difference, message
   rounds, bytes; ``--fedslate-episodes``, ``--fedslate-steps``);
7. ``node-curve``: the plaintext round time on ``--curve-nodes`` SuperNodes (one user each);
8. ``deployment``: a round on Flower's deployment engine (a SuperLink and ``--deploy-nodes``
   SuperNodes as processes), plaintext against secure aggregation with five message rounds and
   with ShareKeys + MaskedInput merged (four), under Flower's defaults and a faster SuperExec
   poll, and where a node's message round goes (``benchmarks/bench_flower_deploy.py``);
   ``deployment-apps``: FedHPD (plaintext, secure aggregation, both merges) and FedSlate
   (plaintext, ``dp``, secure mode with provisioned relay identities) the same way, each against
   its in-process run (``benchmarks/bench_flower_deploy_apps.py``).

5. ``--parts threat-models`` (issue 33): the synthetic federation on ``--clients`` nodes with
   secure aggregation against an honest-but-curious server (four message rounds: what Flower
   carried before), against a malicious server (five: signed advertisements, ConsistencyCheck,
   signed member counts; the default now) and ``secagg+dp`` with the exact discrete Gaussian
   encoded on the nodes, each against its in-process twin.

9. ``--parts ckks-state`` (issue 33): FedMF with ``server_state="encrypted"`` (Chai et al.'s
   ``[[V]]``: the server folds the nodes' encrypted steps into the encrypted item matrix and
   sends it to the nodes, which decrypt it) on the synthetic federation, against Flower
   plaintext and Flower CKKS with a decrypted sum of the same ``aggregation="sum"``
   configuration, each against its in-process twin.

``--parts`` picks the comparisons (default: all but ``threat-models`` and ``ckks-state``).

Flower's first round includes starting the simulation's Ray workers and importing the app in
them; round times are the median of the later rounds. The model of each Flower run is compared
with its in-process twin (max |V difference|). Writes ``flower.json`` and ``flower.md`` under
``--out``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from securefed.bench import datasets
from securefed.bench.bench_args import add_out_argument, add_seed_argument
from securefed.bench.bench_fedmf import RESULTS, markdown_table, write_outputs
from securefed.bench.registry import BENCHES

BACKEND = {
    "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
    "init_args": {"num_cpus": 2, "num_gpus": 0, "log_to_driver": False},
}


def _example():
    """The FedMF example app, importable by the simulation's workers too (they get sys.path)."""
    from securefed.recsys.fedmf_flower import APP_DIR

    if str(APP_DIR) not in sys.path:
        sys.path.insert(0, str(APP_DIR))
    from securefed_fedmf_app import app

    return app


def _in_process(example, app) -> tuple[object, list[float]]:
    """The run in one process, with the seconds of each round."""
    from securefed import RunOptions, run_rounds
    from securefed.recsys.fedmf import FedMF

    split = example.load_split(app)
    seeds = app.seeds()
    model = FedMF(split.train, app.fedmf_config(), seeds)
    transport = app.make_transport(remote=False)
    stamps = [time.perf_counter()]
    run_rounds(
        model,
        transport,
        seeds,
        RunOptions(rounds=app.rounds, sampling=app.sampling()),
        on_round=lambda _round, _metrics: stamps.append(time.perf_counter()),
    )
    return model, list(np.diff(stamps))


def _on_flower(example, app, nodes: int, floors=None):
    """The run on Flower's simulation engine; returns the server's outcome and the wall time."""
    from securefed.flower.simulation import run_in_simulation

    apps = example.build_apps(app, floors)
    start = time.perf_counter()
    outcome = run_in_simulation(apps, nodes, BACKEND)
    return outcome, time.perf_counter() - start


def _test_rmse(example, app, model) -> float:
    split = example.load_split(app)
    errors = model.predict(split.test.users, split.test.items) - split.test.ratings
    return float(np.sqrt(np.mean(errors**2)))


def _steady(seconds: list[float]) -> float:
    """Median round time without the first round (warm-up), or the only one."""
    return statistics.median(seconds[1:] if len(seconds) > 1 else seconds)


def _server_V(app, outcome) -> np.ndarray:
    """The server's ``V``; under ``server_state="encrypted"`` the server holds ``[[V]]`` only,
    which the benchmark (holding the key file) decrypts to compare."""
    if app.server_state != "encrypted":
        return outcome.model.V
    from securefed.crypto.ckks import load_secret_context
    from securefed.transport.ckks import state_from_arrays

    arrays = outcome.model.encrypted_state.to_arrays("V")
    return state_from_arrays(arrays, "V", load_secret_context(app.ckks_secret_path))


def _compare(example, app, nodes: int, label: str, floors=None) -> dict:
    outcome, wall = _on_flower(example, app, nodes, floors)
    reference, local_seconds = _in_process(example, app)
    flower_seconds = [r["seconds"] for r in outcome.result.rounds]
    row = {
        "case": label,
        "transport": app.transport,
        "users": int(reference.n_clients),
        "nodes": nodes,
        "rounds": app.rounds,
        "flower_round_s": _steady(flower_seconds),
        "flower_first_round_s": flower_seconds[0],
        "in_process_round_s": _steady(local_seconds),
        "overhead": _steady(flower_seconds) / _steady(local_seconds),
        "flower_wall_s": wall,
        "flower_rmse": outcome.result.evaluations[-1]["rmse"],
        "in_process_rmse": _test_rmse(example, app, reference),
        "max_abs_V_diff": float(np.abs(_server_V(app, outcome) - reference.V).max()),
        "message_MB_down": outcome.result.message_bytes["down"] / 2**20,
        "message_MB_up": outcome.result.message_bytes["up"] / 2**20,
        "flower_round_seconds": flower_seconds,
        "in_process_round_seconds": local_seconds,
    }
    print({k: v for k, v in row.items() if not k.endswith("_seconds")}, flush=True)
    return row


def _ckks_row(example, args: argparse.Namespace) -> dict:
    """The synthetic federation over CKKS: keys provisioned to files, the nodes encrypt, the
    server adds ciphertexts, a key-holder node decrypts (against in-process CKKS)."""
    import tempfile

    from securefed.flower.ckks import provision_keys
    from securefed.transport.ckks import CKKSConfig

    with tempfile.TemporaryDirectory(prefix="bench-flower-ckks-") as keys:
        secret, public = provision_keys(keys, CKKSConfig())
        app = example.FedMFApp(
            data="synthetic",
            synthetic_users=args.clients,
            synthetic_items=args.items,
            synthetic_ratings=args.clients * args.ratings_per_user,
            rounds=args.rounds,
            min_nodes=args.clients,
            seed=args.seed,
            transport="ckks",
            ckks_secret_path=str(secret),
            ckks_public_path=str(public),
        )
        return _compare(example, app, args.clients, "synthetic")


def _ckks_state_rows(example, args: argparse.Namespace) -> tuple[list[dict], str]:
    """FedMF's encrypted server state over Flower against plaintext and decrypted-sum CKKS, all
    with ``aggregation="sum"`` (``server_lr`` 0.02: the sum of every user's step)."""
    import tempfile

    from securefed.flower.ckks import provision_keys
    from securefed.transport.ckks import CKKSConfig

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-flower-ckks-state-") as keys:
        secret, public = provision_keys(keys, CKKSConfig())
        base = _synthetic(args) | {"seed": args.seed, "aggregation": "sum", "server_lr": 0.02}
        keys_of = {"ckks_secret_path": str(secret), "ckks_public_path": str(public)}
        for label, fields in (
            ("sum, plaintext", {}),
            ("sum, CKKS decrypted sum", {"transport": "ckks", **keys_of}),
            (
                "sum, CKKS encrypted state",
                {"transport": "ckks", "server_state": "encrypted", **keys_of},
            ),
        ):
            app = example.FedMFApp(**base, **fields)
            rows.append(_compare(example, app, args.clients, f"synthetic {label}"))
    plain, decrypted, state = (r["flower_round_s"] for r in rows)
    note = (
        f"Encrypted server state over Flower: {state / plain:.2f}x Flower plaintext per round, "
        f"{state / decrypted:.2f}x Flower CKKS with a decrypted sum (no decryption message "
        "round; every node downloads [[V]] and decrypts it)."
    )
    return rows, note


FEDHPD_BACKEND = {
    # One Ray worker of 2 CPUs: a second would import torch and the agents again.
    "client_resources": {"num_cpus": 2, "num_gpus": 0.0},
    "init_args": {"num_cpus": 2, "num_gpus": 0, "log_to_driver": False},
}


def _fedhpd_config(args: argparse.Namespace):
    """The FedHPD federation of the bench: CartPole agents of ``--fedhpd-agents`` architectures
    (the task's first ones), ``--fedhpd-rounds`` rounds, d=2, 2 loops x 2 parts of a 40-state
    ``S_p`` (the schedule of tests/test_flower_fedhpd.py)."""
    from securefed.rl.fedhpd import FedHPDConfig
    from securefed.rl.policies import AGENTS

    return FedHPDConfig(
        task="cartpole",
        d=2,
        rounds=args.fedhpd_rounds,
        agent_specs=tuple(AGENTS["cartpole"][: args.fedhpd_agents]),
        public_size=40,
        part_size=25,
        distill_loops=2,
        virtual_rounds=8,
    )


FEDHPD_SECAGG = {  # --fedhpd-secagg case -> (merge_share_mask, advertise_ahead)
    "separate": (False, False),
    "merge": (True, False),
    "merge+ahead": (True, True),
}


def _message_rounds(result) -> float:
    """Message rounds the server pushed per training round (the final evaluation left out)."""
    from securefed.flower.server import EVALUATE

    counts = {k: n for k, n in result.message_rounds.items() if k != EVALUATE}
    return sum(counts.values()) / max(1, len(result.rounds))


def _fedhpd_row(
    args: argparse.Namespace,
    transport: str,
    config,
    public,
    merge: str = "separate",
    references: dict | None = None,
) -> dict:
    """FedHPD on the simulation engine (one agent per node) against ``ReferenceRun``;
    ``merge``: a :data:`FEDHPD_SECAGG` case (secure aggregation only); ``references``: the
    reference runs by transport, filled and reused (the merges change no result)."""
    import tempfile

    import torch

    from securefed.flower.simulation import run_in_simulation
    from securefed.rl.fedhpd import ReferenceRun, RunSpec
    from securefed.rl.flower_fedhpd import FedHPDFlowerRun, build_apps, node_results
    from securefed.transport.secagg import SecAggConfig, SecAggTransport

    secagg = SecAggConfig(bits=64, scale=2.0**40, clip=1.0)  # the malicious-server protocol
    remote = None
    if transport == "secagg":
        remote = lambda: SecAggTransport(secagg, remote_clients=True)  # noqa: E731
    nodes = config.n_agents
    merge_share_mask, advertise_ahead = FEDHPD_SECAGG[merge]
    with tempfile.TemporaryDirectory(prefix="bench-flower-fedhpd-") as out:
        run = FedHPDFlowerRun(
            config,
            args.seed,
            min_nodes=nodes,
            output_dir=out,
            merge_share_mask=merge_share_mask,
            advertise_ahead=advertise_ahead,
        )
        start, cpu = time.perf_counter(), time.process_time()
        outcome = run_in_simulation(
            build_apps(run, remote, public_states=public), nodes, FEDHPD_BACKEND
        )
        wall, server_cpu = time.perf_counter() - start, time.process_time() - cpu
        returns, params = node_results(out, nodes, config.n_agents)
    references = {} if references is None else references
    if transport not in references:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            local = SecAggTransport(secagg) if transport == "secagg" else None
            spec = RunSpec(config, args.seed, local, public_states=public)
            references[transport] = ReferenceRun(spec).run()
        finally:
            torch.set_num_threads(threads)
    reference = references[transport]
    flower_seconds = [r["seconds"] for r in outcome.result.rounds]
    n_rounds = len(flower_seconds)
    flower_round = float(np.mean(flower_seconds[1:])) if n_rounds > 1 else flower_seconds[0]
    local_round = reference.seconds / n_rounds
    label = transport if merge == "separate" else f"{transport} {merge}"
    row = {
        "case": f"FedHPD cartpole, {config.n_agents} agents, {config.rounds} rounds",
        "transport": label,
        "message_rounds_per_round": _message_rounds(outcome.result),
        "message_rounds": dict(outcome.result.message_rounds),
        "server_cpu_s": server_cpu,
        "users": config.n_agents,
        "nodes": nodes,
        "rounds": n_rounds,
        "flower_round_s": flower_round,
        "flower_first_round_s": flower_seconds[0],
        "in_process_round_s": local_round,
        "overhead": flower_round / local_round,
        "flower_wall_s": wall,
        "same_returns": bool(np.array_equal(returns, reference.returns)),
        "max_abs_param_diff": float(
            max(np.abs(a - b).max() for a, b in zip(params, reference.params, strict=True))
        ),
        "message_MB_down": outcome.result.message_bytes["down"] / 2**20,
        "message_MB_up": outcome.result.message_bytes["up"] / 2**20,
        "flower_round_seconds": flower_seconds,
    }
    print({k: v for k, v in row.items() if not k.endswith("_seconds")}, flush=True)
    return row


def _fedslate_config(args: argparse.Namespace, fusion: str):
    """The FedSlate run of the bench: two platforms (A with rewards), (10, 3), 2 members,
    ``--fedslate-episodes`` episodes of ``--fedslate-steps`` rounds, learning from the second
    episode on (every 3 rounds, batch 16), small networks; ``dp`` at epsilon 8; ``ckks`` with
    two hidden server layers and the quadratic activation (the monomial circuit);
    ``ckks-packed`` with one (the packed circuit); ``ckks+dp`` with one, at epsilon 8."""
    from securefed.rl.fedslate import FedSlateConfig

    steps = args.fedslate_steps
    extra = {"dp_epsilon": 8.0} if fusion == "dp" else {}
    if fusion == "ckks":
        extra = {"server_hidden": (16, 16), "activation": "polynomial"}
    if fusion == "ckks-packed":
        fusion, extra = "ckks", {"activation": "polynomial"}
    if fusion == "ckks+dp":
        extra = {"activation": "polynomial", "dp_epsilon": 8.0}
    return FedSlateConfig(
        steps_per_platform=steps,
        episodes=args.fedslate_episodes,
        members=2,
        burn_in=steps,
        learn_every=3,
        target_sync=2 * steps,
        buffer_size=4 * steps,
        batch_size=16,
        local_hidden=(32,),
        seed=args.seed,
        fusion=fusion,
        **({"server_hidden": (16,)} | extra),
    )


def _fedslate_row(args: argparse.Namespace, fusion: str) -> dict:
    """FedSlate on the simulation engine (the simulator and each platform a node, the server
    network in the ServerApp) against ``run_fedslate`` in one process (after a one-episode
    warm-up run, so that its time holds no first-use imports)."""
    import dataclasses
    import tempfile

    import torch

    from securefed.flower.simulation import run_in_simulation
    from securefed.rl.fedslate import run_fedslate
    from securefed.rl.flower_fedslate import FedSlateFlowerRun, build_apps, node_results

    config = _fedslate_config(args, fusion)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_fedslate(dataclasses.replace(config, episodes=1))  # warm-up: first-use imports
        cpu = time.process_time()
        reference = run_fedslate(config)
        local_cpu = time.process_time() - cpu
    finally:
        torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory(prefix="bench-flower-fedslate-") as out:
        run = FedSlateFlowerRun(config, output_dir=out)
        start, cpu = time.perf_counter(), time.process_time()
        outcome = run_in_simulation(build_apps(run), run.nodes, FEDHPD_BACKEND)
        wall, server_cpu = time.perf_counter() - start, time.process_time() - cpu
        results = node_results(out, config)
    rewards = results["simulator"]["rewards"]
    diffs = [
        float((outcome.channel.module.state_dict()[n] - p).abs().max())
        for n, p in reference.networks["server"].state_dict().items()
    ]
    for name in ("A", "B"):
        diffs += [
            float(np.abs(results[name][f"local.{n}"] - p.numpy()).max())
            for n, p in reference.networks[f"local_{name}"].state_dict().items()
        ]
    episodes = outcome.episode_seconds
    flower_episodes = float(sum(episodes))
    row = {
        "case": (
            f"FedSlate (10, 3), 2 platforms, {config.episodes} episodes x "
            f"{config.steps_per_platform} rounds, {config.members} members"
        ),
        "transport": fusion,
        "nodes": run.nodes,
        "episodes": config.episodes,
        "rounds": outcome.rounds,
        "learn_steps": outcome.learn_steps,
        "flower_episode_s": flower_episodes / config.episodes,
        "flower_round_s": flower_episodes / outcome.rounds,
        "in_process_episode_s": reference.seconds / config.episodes,
        "overhead": flower_episodes / reference.seconds,
        "in_process_cpu_s": local_cpu,
        "flower_server_cpu_s": server_cpu,
        "flower_wall_s": wall,
        "same_rewards": bool(np.array_equal(rewards, reference.episode_rewards)),
        "max_abs_reward_diff": float(np.abs(rewards - reference.episode_rewards).max()),
        "max_abs_param_diff": max(diffs),
        "message_rounds": int(sum(outcome.messages.values())),
        "message_MB_down": outcome.message_bytes["down"] / 2**20,
        "message_MB_up": outcome.message_bytes["up"] / 2**20,
        "ciphertext_MB": sum(getattr(outcome.channel, "handed_bytes", {}).values()) / 2**20,
        "messages": outcome.messages,
        "flower_episode_seconds": episodes,
    }
    print({k: v for k, v in row.items() if not k.endswith("_seconds")}, flush=True)
    return row


FEDSLATE_COLUMNS = [
    "case",
    "transport",
    "nodes",
    "rounds",
    "learn_steps",
    "flower_episode_s",
    "flower_round_s",
    "in_process_episode_s",
    "overhead",
    "same_rewards",
    "max_abs_param_diff",
    "message_rounds",
    "message_MB_down",
    "message_MB_up",
]


TIMES = ["flower_round_s", "in_process_round_s", "overhead", "flower_first_round_s"]
FEDHPD_COLUMNS = [
    "case",
    "transport",
    "nodes",
    "rounds",
    "message_rounds_per_round",
    *TIMES,
    "server_cpu_s",
    "same_returns",
    "max_abs_param_diff",
    "message_MB_down",
    "message_MB_up",
]


class StackSampler:
    """A sampling profiler of every thread of this process (the simulation engine runs its
    node loop in a thread beside the ServerApp): every ``interval`` seconds it reads each
    thread's stack (``sys._current_frames``) and counts, per function, the samples it was on
    the stack (inclusive) and on top of it (self)."""

    def __init__(self, interval: float = 0.01) -> None:
        import collections
        import threading

        self.interval = interval
        self.inclusive: collections.Counter = collections.Counter()
        self.self_time: collections.Counter = collections.Counter()
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stack-sampler", daemon=True)

    @staticmethod
    def _name(frame) -> str:
        code = frame.f_code
        path = code.co_filename
        for marker in ("site-packages/", "securefed/", "benchmarks/"):
            if marker in path:
                path = path[path.index(marker) :]
                break
        return f"{path}:{code.co_name}"

    def _run(self) -> None:
        import threading

        own = threading.get_ident()
        while not self._stop.wait(self.interval):
            for ident, frame in sys._current_frames().items():
                if ident == own:
                    continue
                self.samples += 1
                self.self_time[self._name(frame)] += 1
                seen = set()
                while frame is not None:
                    name = self._name(frame)
                    if name not in seen:
                        self.inclusive[name] += 1
                        seen.add(name)
                    frame = frame.f_back

    def __enter__(self) -> StackSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join()

    def top(self, counter, n: int = 12, skip: tuple[str, ...] = ()) -> list[tuple[str, float]]:
        """The ``n`` functions with most samples, as seconds of thread time."""
        rows = [(name, count) for name, count in counter.most_common() if not name.endswith(skip)]
        return [(name, count * self.interval) for name, count in rows[:n]]


IDLE = (":wait", ":select", ":sleep", ":_worker", ":run", ":_bootstrap", ":_bootstrap_inner")
"""Frames that only wait (thread bootstraps, sleeps, selects), left out of the self-time list."""


def _node_curve_row(example, args: argparse.Namespace, nodes: int, max_poll: float) -> dict:
    """Plaintext FedMF on ``nodes`` simulated SuperNodes, one user each, the server polling for
    replies with backoff up to ``max_poll`` s (0.05: the fixed poll): the round time, and where
    this process's threads spend it (:class:`StackSampler`)."""
    point = argparse.Namespace(**vars(args) | {"clients": nodes, "rounds": args.curve_rounds})
    app = example.FedMFApp(**_synthetic(point), max_poll_interval=max_poll)
    with StackSampler() as sampler:
        outcome, wall = _on_flower(example, app, nodes)
    seconds = [r["seconds"] for r in outcome.result.rounds]
    row = {
        "profile_self_s": sampler.top(sampler.self_time, skip=IDLE),
        "profile_inclusive_s": sampler.top(sampler.inclusive, n=25),
        "nodes": nodes,
        "max_poll_interval": max_poll,
        "rounds": app.rounds,
        "flower_round_s": _steady(seconds),
        "per_node_ms": 1000 * _steady(seconds) / nodes,
        "flower_first_round_s": seconds[0],
        "flower_wall_s": wall,
        "flower_round_seconds": seconds,
    }
    brief = {k: v for k, v in row.items() if not k.startswith("profile") and "seconds" not in k}
    print(brief, flush=True)
    print("self time (s) by function:", *row["profile_self_s"], sep="\n  ", flush=True)
    return row


CURVE_COLUMNS = [
    "nodes",
    "max_poll_interval",
    "rounds",
    "flower_round_s",
    "per_node_ms",
    "flower_first_round_s",
]


def _synthetic(args: argparse.Namespace) -> dict[str, object]:
    """The synthetic federation's FedMFApp fields: ``--clients`` users on as many nodes."""
    return {
        "data": "synthetic",
        "synthetic_users": args.clients,
        "synthetic_items": args.items,
        "synthetic_ratings": args.clients * args.ratings_per_user,
        "rounds": args.rounds,
        "min_nodes": args.clients,
        "seed": args.seed,
    }


def _threat_rows(example, args: argparse.Namespace) -> tuple[list[dict], str]:
    """Secure aggregation against the two threat models, and secagg+dp's exact mechanism."""
    from securefed.flower.floors import NodeFloors

    base = _synthetic(args)
    cases = [
        ("secagg", "honest_but_curious", NodeFloors("honest_but_curious")),
        ("secagg", "malicious", None),
        ("secagg+dp", "malicious", None),
    ]
    rows = []
    for transport, server, floors in cases:
        app = example.FedMFApp(**base, transport=transport, secagg_server=server)
        rows.append(_compare(example, app, args.clients, f"synthetic, server={server}", floors))
    ratio = rows[1]["flower_round_s"] / rows[0]["flower_round_s"]
    note = (
        f"Against a malicious server secure aggregation over Flower costs {ratio:.2f}x the "
        "honest-but-curious protocol per round (five message rounds instead of four, Ed25519 "
        "signatures on the nodes)."
    )
    return rows, note


PARTS = (
    "synthetic",
    "ckks",
    "ml-100k",
    "ml-100k-grouped",
    "threat-models",
    "ckks-state",
    "fedhpd",
    "fedslate",
    "node-curve",
    "deployment",
    "deployment-apps",
)
DEFAULT_PARTS = ("synthetic", "ckks", "ml-100k", "ml-100k-grouped", "fedhpd", "fedslate")
COLUMNS = [
    "case",
    "transport",
    "users",
    "nodes",
    "rounds",
    *TIMES,
    "flower_rmse",
    "in_process_rmse",
    "max_abs_V_diff",
    "message_MB_down",
    "message_MB_up",
]


def flower(args: argparse.Namespace) -> int:
    """Run the chosen comparisons and write ``flower.json`` / ``flower.md``."""
    import importlib.util

    for module in ("flwr", "ray"):
        if importlib.util.find_spec(module) is None:
            print(f"bench flower: {module} is not installed: pip install securefed[flower]")
            return 2
    example = _example()
    parts = set(args.parts.split(","))
    unknown = parts - set(PARTS)
    if unknown:
        raise ValueError(f"unknown --parts {sorted(unknown)}; known: {', '.join(PARTS)}")
    rows, notes = [], []
    if "synthetic" in parts:
        synthetic = _synthetic(args)
        for transport in ("plaintext", "secagg"):
            app = example.FedMFApp(**synthetic, transport=transport, seed=args.seed)
            rows.append(_compare(example, app, args.clients, "synthetic"))
        ratio = rows[1]["flower_round_s"] / rows[0]["flower_round_s"]
        notes.append(
            f"Secure aggregation over Flower costs {ratio:.2f}x Flower plaintext per round "
            "(four message rounds instead of one)."
        )
    if "ckks" in parts:
        rows.append(_ckks_row(example, args))
    if "ckks-state" in parts:
        state_rows, note = _ckks_state_rows(example, args)
        rows.extend(state_rows)
        notes.append(note)
    if "threat-models" in parts:
        threat, note = _threat_rows(example, args)
        rows.extend(threat)
        notes.append(note)
    ml_nodes = {"ml-100k": args.ml_nodes, "ml-100k-grouped": args.ml_grouped_nodes}
    if parts & set(ml_nodes):
        try:
            path = datasets.resolve(args.data)
        except datasets.DataUnavailable as error:
            notes.append(f"ML-100K part not run: {error}")
            print(notes[-1])
        else:
            for part in sorted(parts & set(ml_nodes)):
                nodes = ml_nodes[part]
                app = example.FedMFApp(
                    data=str(path),
                    split=args.split,
                    rounds=args.ml_rounds,
                    min_nodes=nodes,
                    seed=args.seed,
                )
                rows.append(_compare(example, app, nodes, f"{args.data} {args.split}"))
    fedhpd_rows, curve_rows, deploy_rows, deploy_app_rows = [], [], [], []
    if "deployment" in parts:
        from securefed.bench import bench_flower_deploy

        deploy_rows, deploy_notes = bench_flower_deploy.deployment_rows(example, args)
        notes.extend(deploy_notes)
    if "deployment-apps" in parts:
        from securefed.bench import bench_flower_deploy_apps

        deploy_app_rows, deploy_notes = bench_flower_deploy_apps.deployment_app_rows(args)
        notes.extend(deploy_notes)
    if "fedhpd" in parts:
        from securefed.rl.fast import make_public_states

        config = _fedhpd_config(args)
        public = make_public_states(config)
        cases = [c.strip() for c in args.fedhpd_secagg.split(",") if c.strip()]
        unknown = set(cases) - set(FEDHPD_SECAGG)
        if unknown or not cases:
            raise ValueError(
                f"--fedhpd-secagg {sorted(unknown) or cases}: known {', '.join(FEDHPD_SECAGG)}"
            )
        references: dict = {}
        fedhpd_rows.append(_fedhpd_row(args, "plaintext", config, public, references=references))
        for case in cases:
            fedhpd_rows.append(_fedhpd_row(args, "secagg", config, public, case, references))
        if len(cases) > 1:
            first = fedhpd_rows[1]
            for row in fedhpd_rows[1:]:
                row["x_first_secagg"] = row["flower_round_s"] / first["flower_round_s"]
            notes.append(
                "FedHPD secure aggregation: "
                + "; ".join(
                    f"{r['transport']}: {r['message_rounds_per_round']:.2f} message rounds a "
                    f"round, {r['flower_round_s']:.2f} s a round "
                    f"({r['x_first_secagg']:.2f}x {first['transport']})"
                    for r in fedhpd_rows[1:]
                )
                + " (same run; every merged run's returns equal the reference's)."
            )
        notes.append(
            "FedHPD: one agent per node; a round is one transport round of the run (one part "
            "of S_p); round times are the mean of the rounds after the first on Flower and "
            "the reference learner's training time over the same number of rounds in one "
            "process (torch on 1 thread); both include the episodes played in the first round "
            "of each distillation event."
        )
    fedslate_rows = []
    if "fedslate" in parts:
        for fusion in args.fedslate_transports.split(","):
            fedslate_rows.append(_fedslate_row(args, fusion))
        notes.append(
            "FedSlate: the user simulator and each platform a SuperNode, the server network in "
            "the ServerApp (securefed.rl.flower_fedslate); episode and round times are the "
            "server loop's wall seconds over all episodes (after the key exchange) against "
            "run_fedslate's in one process (torch on 1 thread); same_rewards and "
            "max_abs_param_diff compare the seeded Flower run with the in-process run (the "
            "server network and both local networks)."
        )
    if "node-curve" in parts:
        for nodes in (int(n) for n in args.curve_nodes.split(",")):
            for max_poll in (float(p) for p in args.curve_max_poll.split(",")):
                curve_rows.append(_node_curve_row(example, args, nodes, max_poll))
    notes.append(
        "Round times: median of the rounds after the first; the first includes starting "
        f"Flower's Ray workers. Load average at the end: {os.getloadavg()[0]:.2f} on "
        f"{os.cpu_count()} cores (shared machine)."
    )
    table = markdown_table(rows, COLUMNS) if rows else ""
    if fedhpd_rows:
        table += "\n\n" + markdown_table(fedhpd_rows, FEDHPD_COLUMNS)
    if fedslate_rows:
        table += "\n\n" + markdown_table(fedslate_rows, FEDSLATE_COLUMNS)
    if curve_rows:
        table += "\n\n" + markdown_table(curve_rows, CURVE_COLUMNS)
    if deploy_rows:
        from securefed.bench.bench_flower_deploy import COLUMNS as DEPLOY_COLUMNS

        table += "\n\n" + markdown_table(deploy_rows, DEPLOY_COLUMNS)
    if deploy_app_rows:
        from securefed.bench.bench_flower_deploy_apps import COLUMNS as DEPLOY_APP_COLUMNS

        table += "\n\n" + markdown_table(deploy_app_rows, DEPLOY_APP_COLUMNS)
    table += "\n" + "".join(f"\n{note}\n" for note in notes)
    write_outputs(
        "flower",
        {
            "rows": rows,
            "fedhpd_rows": fedhpd_rows,
            "fedslate_rows": fedslate_rows,
            "node_curve_rows": curve_rows,
            "deployment_rows": deploy_rows,
            "deployment_app_rows": deploy_app_rows,
            "notes": notes,
            "backend": BACKEND,
            "loadavg": os.getloadavg(),
        },
        table,
        Path(args.out),
    )
    return 0


def register(benches) -> None:
    parser = BENCHES["flower"].add_to(benches)
    parser.add_argument("--clients", type=int, default=100, help="simulated nodes, one user each")
    parser.add_argument("--items", type=int, default=200, help="items of the synthetic federation")
    parser.add_argument(
        "--ratings-per-user", type=int, default=40, help="ratings per synthetic user"
    )
    parser.add_argument("--rounds", type=int, default=4, help="rounds of the synthetic run")
    parser.add_argument("--data", default="ml-100k", help="the data set of the MovieLens run")
    parser.add_argument("--split", default="u1", help="its split (u1..u5 for ML-100K)")
    parser.add_argument("--ml-rounds", type=int, default=3, help="rounds of the MovieLens run")
    parser.add_argument("--ml-nodes", type=int, default=943, help="one user per node")
    parser.add_argument("--ml-grouped-nodes", type=int, default=50, help="users grouped on nodes")
    parser.add_argument("--fedhpd-agents", type=int, default=3, help="FedHPD agents (= nodes)")
    parser.add_argument("--fedhpd-rounds", type=int, default=5, help="FedHPD training rounds")
    parser.add_argument(
        "--fedhpd-secagg",
        default="separate",
        help="FedHPD secure-aggregation cases, comma-separated, each a run beside plaintext: "
        "separate (five message rounds), merge (secagg-merge), merge+ahead (and "
        "secagg-advertise-ahead)",
    )
    parser.add_argument(
        "--fedslate-episodes", type=int, default=3, help="FedSlate episodes (the first: burn-in)"
    )
    parser.add_argument(
        "--fedslate-steps", type=int, default=20, help="FedSlate rounds per episode (61: paper)"
    )
    parser.add_argument(
        "--fedslate-transports",
        default="plaintext,dp",
        help="FedSlate fusion channels, comma-separated, one row each: plaintext, dp, ckks "
        "(the monomial circuit: server (16, 16) with the quadratic activation), ckks-packed "
        "(the packed circuit: server (16,)), ckks+dp (server (16,), epsilon 8)",
    )
    parser.add_argument(
        "--curve-nodes", default="10,30,100,300", help="node counts of the node-count curve"
    )
    parser.add_argument("--curve-rounds", type=int, default=3, help="rounds per curve point")
    parser.add_argument(
        "--curve-max-poll",
        default="0.05",
        help="the server's longest wait between polls, one curve per value (0.05: fixed poll)",
    )
    from securefed.bench.bench_flower_deploy import add_arguments
    from securefed.bench.bench_flower_deploy_apps import add_arguments as add_app_arguments

    add_arguments(parser)
    add_app_arguments(parser)
    parser.add_argument(
        "--parts",
        default=",".join(DEFAULT_PARTS),
        help=f"which comparisons to run (of {', '.join(PARTS)})",
    )
    add_seed_argument(parser)
    add_out_argument(parser, RESULTS)
    parser.set_defaults(func=flower)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m securefed.bench.bench_flower")
    register(parser.add_subparsers(dest="bench", required=True))
    args = parser.parse_args(["flower", *(argv if argv is not None else sys.argv[1:])])
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
