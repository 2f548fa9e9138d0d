"""FedHPD on Flower (``securefed.rl.flower_fedhpd``): the agents on the nodes, the consensus on the
server.

The claim: a seeded plaintext FedHPD run on Flower's simulation engine gives the same episode
returns and agent parameters as the in-process step-by-step ``ReferenceRun`` (and the fast
learner within its usual rounding). A pure test drives the two halves without an engine, the
node's state saved to and restored from Flower records between every message.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip(
    "flwr", reason="Flower is not installed: pip install securefed[flower] (flwr[simulation])"
)

from securefed import PlaintextTransport, SeedTree
from securefed.flower import partition_users
from securefed.flower import records as rec
from securefed.rl.fast import Population
from securefed.rl.fedhpd import FedHPDConfig, ReferenceRun, RunSpec
from securefed.rl.flower_fedhpd import (
    FedHPDFlowerRun,
    FedHPDNode,
    FedHPDServer,
    build_apps,
    node_results,
)
from securefed.rl.policies import AGENTS
from securefed.transport.secagg import SecAggConfig, SecAggTransport

SEED = 20
# One Ray worker of 2 CPUs: a second worker would import torch and the agents again (measured on
# the shared 2-core machine: 29 s for the whole simulation instead of 48 s).
SIMULATION_BACKEND = {
    "client_resources": {"num_cpus": 2, "num_gpus": 0.0},
    "init_args": {"num_cpus": 2, "num_gpus": 0, "log_to_driver": False},
}


pytestmark = pytest.mark.usefixtures("torch_one_thread")


def small_config(**overrides) -> FedHPDConfig:
    """Three CartPole agents (two architectures), 5 rounds, d=2: two events of 2 loops x 2 parts,
    then one round after the last event."""
    settings = {
        "task": "cartpole",
        "d": 2,
        "rounds": 5,
        "agent_specs": tuple(AGENTS["cartpole"][k] for k in (0, 2, 5)),
        "public_size": 40,
        "part_size": 25,
        "distill_loops": 2,
        "virtual_rounds": 8,
    } | overrides
    return FedHPDConfig(**settings)


def public_states(config: FedHPDConfig) -> np.ndarray:
    rng = np.random.default_rng(0)
    return rng.normal(0, 0.1, (config.public_size, config.spec.obs_dim)).astype(np.float32)


def _drive(config, public, nodes: int):
    """The Flower round loop by hand: every node rebuilt and restored from records per message."""
    seeds = SeedTree(SEED)
    server = FedHPDServer(config, public)
    transport = PlaintextTransport()
    saved: dict[int, object] = {}

    def node(p: int) -> FedHPDNode:
        built = FedHPDNode(config, partition_users(config.n_agents, nodes, p), SeedTree(SEED))
        if p in saved:
            built.load_state_dict(rec.record_arrays(saved[p]))
        return built

    clients = np.arange(config.n_agents)
    for round_id in range(server.schedule.rounds):
        rnd, active = server.open_round(round_id, clients, transport, seeds)
        broadcast = server.broadcast_state()
        for p in range(nodes):
            current = node(p)
            batches, _ = current.train(round_id, active, broadcast, seeds)
            for batch in batches:
                rnd.submit_batch(batch)
            saved[p] = rec.arrays_record(current.state_dict())
        server.close_round(rnd)
    returns = np.full((config.rounds, config.n_agents), np.nan)
    params = [None] * config.n_agents
    for p in range(nodes):
        current = node(p)
        current.evaluate(server.broadcast_state())
        returns[:, current.users] = current.returns
        for k, vector in current.parameters().items():
            params[k] = vector
    return returns, params, server, transport


def _assert_same_run(returns, params, reference, atol=1e-6):
    np.testing.assert_array_equal(returns, reference.returns)
    for got, want in zip(params, reference.params, strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=atol)


def test_the_two_halves_with_saved_state_equal_the_reference_run():
    config = small_config()
    public = public_states(config)
    reference = ReferenceRun(RunSpec(config, SEED, public_states=public)).run()
    returns, params, server, transport = _drive(config, public, nodes=2)
    _assert_same_run(returns, params, reference)
    assert server.schedule.rounds == config.aggregation_rounds() == 8
    assert len(transport.view.rounds) == 8  # the server saw only transport rounds
    with pytest.raises(ValueError, match="FedHPD only"):
        FedHPDServer(small_config(algorithm="nofed"), public)
    with pytest.raises(ValueError, match="shape"):
        FedHPDServer(config, public[:-1])


def _simulate(apps, nodes: int):
    from securefed.flower.simulation import run_in_simulation

    return run_in_simulation(apps, nodes, SIMULATION_BACKEND)


def test_fedhpd_on_the_simulation_engine_equals_in_process(tmp_path):
    pytest.importorskip("ray", reason="Flower's simulation engine needs flwr[simulation] (ray)")
    config = small_config()
    public = public_states(config)
    run = FedHPDFlowerRun(config, SEED, min_nodes=2, output_dir=str(tmp_path))
    outcome = _simulate(build_apps(run, public_states=public), nodes=2)
    returns, params = node_results(tmp_path, 2, config.n_agents)
    reference = ReferenceRun(RunSpec(config, SEED, public_states=public)).run()
    _assert_same_run(returns, params, reference)
    # The fast learner on the reference's float kernels: the default kernels differ from
    # torch's by an ulp, which can flip an action draw (tests/test_fedhpd_fast_kernels.py).
    (fast,) = Population([RunSpec(config, SEED, public_states=public)], kernels="torch").run()
    np.testing.assert_array_equal(returns, fast.returns)
    for got, want in zip(params, fast.params, strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    result = outcome.result
    assert len(result.rounds) == config.aggregation_rounds() and result.nodes == 2
    assert result.evaluations[-1]["final_mean_return"] == pytest.approx(
        reference.returns[-1].mean()
    )
    # Every upload reached the server through its transport and nothing else.
    assert len(outcome.transport.view.rounds) == config.aggregation_rounds()


@pytest.mark.slow
def test_fedhpd_secure_aggregation_over_flower(tmp_path):
    """The uploads masked on the nodes; the consensus is the plaintext mean up to fixed point."""
    pytest.importorskip("ray", reason="Flower's simulation engine needs flwr[simulation] (ray)")
    config = small_config()
    public = public_states(config)
    secagg = SecAggConfig(bits=64, scale=2.0**40, clip=1.0)  # the malicious-server variant
    run = FedHPDFlowerRun(config, SEED, min_nodes=2, output_dir=str(tmp_path))
    apps = build_apps(
        run, lambda: SecAggTransport(secagg, remote_clients=True), public_states=public
    )
    outcome = _simulate(apps, nodes=2)
    returns, params = node_results(tmp_path, 2, config.n_agents)
    in_process = ReferenceRun(
        RunSpec(config, SEED, SecAggTransport(secagg), public_states=public)
    ).run()
    plain = ReferenceRun(RunSpec(config, SEED, public_states=public)).run()
    np.testing.assert_array_equal(returns, plain.returns)
    for got, secure, clear in zip(params, in_process.params, plain.params, strict=True):
        np.testing.assert_allclose(got, secure, rtol=0, atol=1e-6)
        np.testing.assert_allclose(got, clear, rtol=0, atol=1e-5)
    view = outcome.transport.view.rounds[-1]
    # Every agent took part, in its node's masked sum: the protocol's parties are the 2 nodes.
    assert view.public["secagg_users"] == config.n_agents and view.public["secagg_n"] == 2
