"""FedHPD on Flower survives lost nodes, runs as a ``flwr run`` app, and runs in secure mode.

Claims (issue 33):

* A node lost after uploading (its next message never arrives) rejoins at the next round: it
  takes the KL step on the consensus it missed, which the server's broadcast keeps for a window
  of rounds, and the run equals the in-process ``ReferenceRun`` where that node's agents are
  absent from the round they missed (``RunSpec.absent``), plaintext and secure aggregation alike.
  Before this, the rejoining node refused every later message (``ValueError``).
* A node lost for longer than the window is left out: it refuses to step on a consensus it does
  not have, and the other agents' run equals the in-process run with it absent from then on.
* The app in ``rl/flower_app`` builds from its run config (``seed = -1``: secure mode, every
  process draws from the operating system) and runs; ``-m slow``: submitted with ``flwr run`` to
  a SuperLink and SuperNodes as separate processes.

The federations here run the real ``run_federation`` and ClientApps on the in-process grid of
``tests/test_claims_flower.py`` (no engine), which loses the messages a test names.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip(
    "flwr", reason="Flower is not installed: pip install securefed[flower] (flwr[simulation])"
)

from flwr.app import Context, RecordDict
from test_claims_flower import DirectGrid, task_identity
from test_flower_fedhpd import SEED, public_states, small_config

from securefed.errors import SecurefedError
from securefed.flower import make_client_app, partition_users
from securefed.flower.identity import provision_identities
from securefed.flower.server import ADVERTISE, TRAIN, run_federation
from securefed.rl.fedhpd import ReferenceRun, RunSpec
from securefed.rl.flower_fedhpd import (
    APP_DIR,
    FedHPDApp,
    FedHPDFlowerRun,
    app_client_setup,
    app_server_setup,
    client_setup,
    server_setup,
)
from securefed.transport.secagg import SecAggConfig, SecAggTransport

pytestmark = pytest.mark.usefixtures("torch_one_thread", "task_identity")
assert task_identity  # the fixture, imported for pytestmark

SECAGG = SecAggConfig(bits=64, scale=2.0**40, clip=1.0)  # the malicious-server default
LOST_TIMEOUT = 0.3
"""Seconds the server waits for a lost node (the grid never answers for it)."""


class LossyGrid(DirectGrid):
    """The direct grid, losing the messages of ``lost``: ``(node partition, message type,
    round)`` (``round`` ``None``: every round). A lost message is never delivered, so the node
    neither computes nor answers it and the server times out on it."""

    def __init__(
        self, client_app, n_nodes: int, lost, run_config=None, *, replies_only: bool = False
    ) -> None:
        super().__init__(client_app, n_nodes)
        self.lost = set(lost)
        self.replies_only = replies_only
        for context in self.contexts.values():
            context.run_config = dict(run_config or {})

    def push_messages(self, messages):
        kept, ids, dropped = [], [], []
        for message in messages:
            node = int(message.metadata.dst_node_id) - 100
            kind = message.metadata.message_type
            round_id = int(message.metadata.group_id)
            if not {(node, kind, round_id), (node, kind, None)} & self.lost:
                kept.append(message)
            elif self.replies_only:  # the node computes and saves its state; its reply is lost
                dropped.extend(super().push_messages([message]))
            else:
                ids.append(f"lost{len(ids)}-{node}-{round_id}")
        for message_id in dropped:
            del self._replies[message_id]
        return super().push_messages(kept) + ids + dropped


def _run_lossy(
    out: Path,
    config,
    public,
    nodes: int,
    lost,
    *,
    transport=None,
    rejoin_window: int = 0,
    replies_only: bool = False,
):
    run = FedHPDFlowerRun(
        config,
        SEED,
        min_nodes=nodes,
        output_dir=str(out),
        timeout=LOST_TIMEOUT,
        rejoin_window=rejoin_window,
    )
    setup = server_setup(run, transport, public_states=public)
    client = make_client_app(lambda context: client_setup(run, context))
    grid = LossyGrid(client, nodes, lost, replies_only=replies_only)
    result = run_federation(grid, setup)
    return grid, result, _node_parameters(out)


def _node_parameters(out_dir: Path) -> dict[int, np.ndarray]:
    """Each agent's final parameters, from the files its node wrote after evaluating."""
    params = {}
    for path in sorted(Path(out_dir).glob("node-*.npz")):
        saved = np.load(path)
        params |= {k: saved[f"param{k}"] for k in saved["agents"].tolist()}
    return params


def _reference(config, public, absent, transport=None):
    return ReferenceRun(RunSpec(config, SEED, transport, public_states=public, absent=absent)).run()


def _assert_agents_equal(params, reference, agents, atol=1e-6):
    """Parameters within 1e-6 of the reference (the tolerance of test_flower_fedhpd.py; the two
    runs execute the same float32 steps, measured identical)."""
    for k in agents:
        np.testing.assert_allclose(params[k], reference.params[k], rtol=0, atol=atol)


def test_a_node_lost_after_uploading_rejoins_at_the_next_round_as_in_one_process(tmp_path):
    config = small_config()  # 8 transport rounds; node 1 hosts agent 2
    public = public_states(config)
    # Round 4 opens the second event: node 1 misses its episodes too, and plays them when it
    # rejoins in round 5 (after the KL step on round 3's consensus, as agent 2 does in process).
    grid, result, params = _run_lossy(tmp_path, config, public, 2, {(1, TRAIN, 4)})
    absent = {4: [2]}
    reference = _reference(config, public, absent)
    _assert_agents_equal(params, reference, range(config.n_agents))
    # The loss mattered: without it agent 2 ends elsewhere (so the comparison can fail).
    full = _reference(config, public, {})
    assert np.abs(full.params[2] - reference.params[2]).max() > 1e-4
    # The server left agent 2 out of round 4 only; node 1 answered again from round 5 on,
    # playing then the two rounds it missed.
    assert [r["episodes"] for r in result.rounds][4:6] == [4.0, 2.0]
    answered = {(m, n - 100, int(msg.metadata.group_id)) for m, n, msg, _ in grid.log}
    assert (TRAIN, 1, 5) in answered and (TRAIN, 1, 4) not in answered
    assert all(not reply.has_error() for *_, reply in grid.log)
    assert result.evaluations[-1]["final_mean_return"] == pytest.approx(
        reference.returns[-1].mean()
    )


def test_a_node_whose_reply_is_lost_skips_the_consensus_it_was_not_counted_in(tmp_path):
    """The node computed round 4 (KL step on round 3, episodes, upload) but its reply never
    arrived: round 4 was aggregated without it, and the broadcast says so (``counted.4``), so
    it takes no KL step on round 4's consensus: the in-process run with it absent from round 4
    again (its upload has no effect on the agent)."""
    config = small_config()
    public = public_states(config)
    _, result, params = _run_lossy(tmp_path, config, public, 2, {(1, TRAIN, 4)}, replies_only=True)
    reference = _reference(config, public, {4: [2]})
    _assert_agents_equal(params, reference, range(config.n_agents))
    assert [r["episodes"] for r in result.rounds][4:6] == [4.0, 0.0]  # it played in round 4


def test_a_node_lost_under_secure_aggregation_rejoins_as_in_one_process(tmp_path):
    config = small_config()
    public = public_states(config)
    transport = SecAggTransport(SECAGG, remote_clients=True)
    # Three nodes, one agent each: a round needs two parties, so one may be lost.
    _, _, params = _run_lossy(tmp_path, config, public, 3, {(2, ADVERTISE, 5)}, transport=transport)
    reference = _reference(config, public, {5: [2]}, SecAggTransport(SECAGG))
    _assert_agents_equal(params, reference, range(config.n_agents))
    view = transport.view.rounds[5].public
    assert view["secagg_n"] == 2 and view["secagg_users"] == 2  # nodes 0 and 1 only
    assert transport.view.rounds[6].public["secagg_n"] == 3  # node 2 is back


def test_a_node_lost_longer_than_the_window_is_left_out(tmp_path):
    config = small_config()
    public = public_states(config)
    # Node 1 uploads in round 1, is lost in rounds 2-4; the broadcast keeps 2 rounds, so when it
    # comes back in round 5 the consensus of round 1 is gone: it refuses, and stays out.
    lost = {(1, TRAIN, r) for r in (2, 3, 4)}
    grid, result, params = _run_lossy(tmp_path, config, public, 2, lost, rejoin_window=2)
    refusals = [
        reply.error.reason for _, node, _, reply in grid.log if node == 101 and reply.has_error()
    ]
    assert len(refusals) == 4  # rounds 5, 6, 7 and the evaluation
    assert all("rejoin_window" in reason and "round 1" in reason for reason in refusals)
    reference = _reference(config, public, {r: [2] for r in range(2, 8)})
    _assert_agents_equal(params, reference, [0, 1])
    assert len(result.rounds) == 8 and result.evaluations[-1]["nodes"] == 1.0


def test_absent_agents_are_checked_and_refused_by_the_fast_learner():
    from securefed.rl.fast import train_population

    config = small_config()
    with pytest.raises(ValueError, match="outside the run's 8 aggregation rounds"):
        RunSpec(config, SEED, absent={8: [0]})
    with pytest.raises(ValueError, match="no agent"):
        RunSpec(config, SEED, absent={0: [0, 1, 2]})
    with pytest.raises(ValueError, match=r"outside \[0, 3\)"):
        RunSpec(config, SEED, absent={0: [3]})
    with pytest.raises(ValueError, match="use ReferenceRun"):
        train_population([RunSpec(config, SEED, absent={0: [1]})])
    assert RunSpec(config, SEED, absent={2: [1, 1], 0: []}).absent == ((2, (1,)),)


# ----------------------------------------------------------------------------- the app
def app_run_config(**overrides) -> dict[str, object]:
    """The app's ``[tool.flwr.app.config]`` with the small schedule and ``overrides``."""
    values = tomllib.loads((APP_DIR / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    values = dict(values["config"])
    values |= {
        "agents": "0,2,5",
        "d": 2,
        "rounds": 5,
        "public-size": 40,
        "part-size": 25,
        "distill-loops": 2,
        "virtual-rounds": 8,
    }
    return values | overrides


def _run_app(run_config: dict[str, object], nodes: int, out: Path, identities: Path | None = None):
    """The app's ServerApp and ClientApps on the direct grid; with ``identities``, each node's
    config names its provisioned identity file, the registry and its digest."""
    run_config = run_config | {"output-dir": str(out)}
    server_context = Context(
        run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config=run_config
    )
    setup = app_server_setup(server_context)
    grid = LossyGrid(make_client_app(app_client_setup), nodes, set(), run_config)
    if identities is not None:
        digest = (identities / "digest").read_text()
        for context in grid.contexts.values():
            partition = int(context.node_config["partition-id"])
            context.node_config |= {
                "secagg-identity-path": str(identities / f"identity-{partition}.bin"),
                "secagg-registry-path": str(identities / "registry.bin"),
                "secagg-registry-digest": digest,
            }
    return setup, grid, run_federation(grid, setup), _node_parameters(out)


def _provision(directory: Path, n_agents: int, nodes: int) -> Path:
    """Every agent's long-term identity (OS entropy), enrolled once, out of band."""
    partitions = {p: partition_users(n_agents, nodes, p) for p in range(nodes)}
    digest = provision_identities(directory, partitions)
    (directory / "digest").write_text(digest)
    return directory


def test_the_app_runs_from_its_run_config_in_secure_mode_by_default(tmp_path):
    values = app_run_config(transport="secagg", **{"min-nodes": 3})
    app = FedHPDApp.from_run_config(values)
    assert app.run.seed == -1 and app.run.secure  # the template's default is secure mode
    assert app.secagg.server == "malicious"  # and the malicious-server protocol
    # Secure mode derives no identity from a seed: without provisioned files the nodes refuse.
    with pytest.raises(SecurefedError, match="provisioned out of band"):
        _run_app(values, 3, tmp_path / "unprovisioned")
    identities = _provision(tmp_path / "identities", app.run.config.n_agents, 3)
    setup, grid, result, first = _run_app(values, 3, tmp_path / "first", identities)
    assert setup.seeds.secure
    context = next(iter(grid.contexts.values()))
    assert app_client_setup(context).seeds.secure
    assert len(result.rounds) == app.run.config.aggregation_rounds() == 8
    assert all(r["episodes"] > 0 for r in result.rounds[::4])  # every event played
    assert result.evaluations[-1]["nodes"] == 3.0
    # Secure mode: nothing reproducible; a second run starts from other weights.
    *_, second = _run_app(values, 3, tmp_path / "second", identities)
    summary = json.loads((tmp_path / "first" / "result.json").read_text())
    assert summary["secure_mode"] is True
    assert summary["message_rounds"][ADVERTISE] == 8  # five message rounds a round, counted
    assert sorted(first) == sorted(second) == [0, 1, 2]
    assert all(np.abs(first[k] - second[k]).max() > 0 for k in first)
    with pytest.raises(ValueError, match="secure mode"):
        FedHPDApp.from_run_config(app_run_config(seed=-2))
    with pytest.raises(ValueError, match="transport must be one of"):
        FedHPDApp.from_run_config(app_run_config(transport="ckks"))


def test_the_seeded_app_equals_the_reference_run(tmp_path):
    values = app_run_config(seed=SEED)
    app = FedHPDApp.from_run_config(values)
    *_, params = _run_app(values, 2, tmp_path)
    config = app.run.config
    from securefed.rl.fast import make_public_states

    reference = _reference(config, make_public_states(config), {})
    _assert_agents_equal(params, reference, range(config.n_agents))


@pytest.mark.slow
def test_the_app_submitted_with_flwr_run_to_real_processes(tmp_path):
    """A SuperLink and two SuperNodes as processes on 127.0.0.1; the seeded app, submitted with
    ``flwr run``, equals the reference run (1 event of 1 loop x 2 parts: 2 transport rounds)."""
    from securefed.flower.loopback import LoopbackFederation, missing_commands
    from securefed.rl.fast import make_public_states
    from securefed.rl.flower_fedhpd import write_fedhpd_app

    if missing := missing_commands():
        pytest.skip(f"{missing} not installed (pip install securefed[flower])")
    out = tmp_path / "out"
    values = app_run_config(
        seed=SEED, rounds=2, **{"distill-loops": 1, "output-dir": str(out), "timeout": 120.0}
    )
    app = FedHPDApp.from_run_config(values)
    with LoopbackFederation(tmp_path / "federation", n_nodes=2) as federation:
        federation.submit(write_fedhpd_app(tmp_path / "app", values))
        federation.wait_for(out / "result.json", timeout=300)
        federation.wait_for(out / "node-1.npz", timeout=60)
    result = json.loads((out / "result.json").read_text())
    config = app.run.config
    reference = _reference(config, make_public_states(config), {})
    _assert_agents_equal(_node_parameters(out), reference, range(config.n_agents))
    assert len(result["rounds"]) == config.aggregation_rounds() == 2
    assert result["secure_mode"] is False and result["nodes"] == 2


@pytest.mark.parametrize("key", ["secagg-merge", "secagg-advertise-ahead"])
def test_the_merge_keys_are_read_as_booleans_and_need_secure_aggregation(key):
    """The app's merge keys reach ``FlowerRunOptions``; a non-boolean value, or a merge without
    secure aggregation, is refused naming the key."""
    from securefed.rl.flower_fedhpd import app_server_setup

    values = app_run_config(transport="secagg", seed=0, **{key: True})
    app = FedHPDApp.from_run_config(values)
    options = app_server_setup(SimpleNamespace(run_config=values)).options
    name = {"secagg-merge": "merge_share_mask", "secagg-advertise-ahead": "advertise_ahead"}[key]
    assert getattr(app.run, name) and getattr(options, name)
    assert not FedHPDApp.from_run_config(app_run_config()).run.merge_share_mask
    with pytest.raises(ValueError, match=f"{key} must be true or false"):
        FedHPDApp.from_run_config(values | {key: "yes"})
    with pytest.raises(ValueError, match=f"{key} merges secure aggregation"):
        FedHPDApp.from_run_config(app_run_config(seed=0, **{key: True}))


def test_a_fedhpd_node_takes_its_floors_from_its_node_config():
    """A FedHPD node's operator raises its floors in ``--node-config`` as a FedMF node's does
    (before, a FedHPD node took the defaults whatever its node config said)."""
    from securefed.errors import InsecureParameterError
    from securefed.flower.floors import NodeFloors
    from securefed.rl.flower_fedhpd import FedHPDFlowerRun, client_setup

    run = FedHPDFlowerRun(small_config(), seed=SEED)
    node_config = {"partition-id": 0, "num-partitions": 2, "secagg-min-threshold": 3}
    setup = client_setup(run, SimpleNamespace(node_config=node_config))
    assert setup.floors.min_threshold == 3
    with pytest.raises(InsecureParameterError, match="threshold"):
        setup.floors.check_threshold(2)
    hbc = "honest_but_curious"
    default = client_setup(run, SimpleNamespace(node_config=node_config), NodeFloors(hbc))
    assert default.floors.secagg_server == hbc and default.floors.min_threshold == 3
