"""Resume after a SuperLink crash (issue 33): the ServerApp checkpoints every round, a new one
started with the same configuration and directory continues to the uninterrupted result, privacy
ledger included; what it must refuse, it refuses naming the cause; and a node releases each
round once (its journal, :mod:`securefed.flower.journal`), so neither a resumed nor a deviating
server gets a second answer to a round.

The fast tests run the real ``run_federation`` and ClientApps on the in-process grid of
``tests/test_claims_flower.py`` (Flower's message types and records, no Ray); each new grid is a
new run (fresh node ``Context``), as a run resubmitted after a crash is. A crash is an exception
raised by ``on_round`` after round ``k``'s checkpoint was written. ``-m slow``: a SuperLink killed
with SIGKILL between rounds, restarted, and the run resubmitted with ``flwr run``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import time

import numpy as np
import pytest

pytest.importorskip(
    "flwr", reason="Flower is not installed: pip install securefed[flower] (flwr[simulation])"
)

from test_claims_flower import DirectGrid, task_identity

from securefed.errors import AggregationError, CheckpointError, PrivacyBudgetExceeded
from securefed.flower import FlowerRunOptions, make_client_app
from securefed.flower import records as rec
from securefed.flower.client import NODE_STATE
from securefed.flower.journal import JOURNAL_FILE, STATE_DIR_KEY
from securefed.flower.server import ADVERTISE, MASK, SHARE, TRAIN, run_federation
from securefed.privacy.ledger import PrivacyBudget

assert task_identity  # the fixture, imported for the tests that use it
pytestmark = pytest.mark.usefixtures("task_identity")

N_NODES = 3
SECAGG_DP = {"transport": "secagg+dp", "dp_clip": 4.0, "dp_noise_multiplier": 0.5}
SECAGG_DP |= {"dp_mechanism": "gaussian"}  # float noise: seeded mode (reproducible) allowed


class Crash(Exception):
    """The ServerApp dying after a round (its checkpoint written)."""


def _app(example, tmp_path, **fields):
    base = {"seed": 0, "rounds": 3, "min_nodes": N_NODES, "timeout": 30.0}
    base["checkpoint_dir"] = str(tmp_path / "checkpoint")
    return example.FedMFApp(**(base | fields))


def _run(example, app, state_dir, *, crash_after=None, budget=None, setup_hook=None):
    """One run (a fresh server and fresh node Contexts); nodes journal in ``state_dir``."""
    setup = example.server_setup(app)
    if budget is not None:
        setup.transport.ledger.budget = budget
    if crash_after is not None:

        def on_round(round_id, metrics):
            if round_id == crash_after:
                raise Crash(round_id)

        setup.on_round = on_round
    if setup_hook is not None:
        setup_hook(setup)
    client = make_client_app(lambda context: example.client_setup(app, context))
    grid = DirectGrid(client, N_NODES)
    if state_dir is not None:
        for context in grid.contexts.values():
            context.node_config[STATE_DIR_KEY] = str(state_dir)
    with contextlib.suppress(Crash):
        run_federation(grid, setup)
    return setup, grid


def _node_vectors(grid, shape):
    """Every user's vector, read off the nodes' Contexts (what the nodes hold)."""
    U = np.full(shape, np.nan)
    for node, context in grid.contexts.items():
        users = np.array_split(np.arange(shape[0]), N_NODES)[node - 100]
        U[users] = rec.record_arrays(context.state[NODE_STATE])["U"]
    return U


def _ledger(setup):
    ledger = setup.transport.ledger
    return None if ledger is None else ledger.state_dict()


@pytest.mark.parametrize("fields", [{}, SECAGG_DP], ids=["plaintext", "secagg+dp"])
def test_a_resumed_server_ends_where_the_uninterrupted_run_ends(example, tmp_path, fields):
    whole = _app(example, tmp_path / "whole", **fields)
    reference, ref_grid = _run(example, whole, tmp_path / "whole-nodes")
    app = _app(example, tmp_path / "cut", **fields)
    crashed, _ = _run(example, app, tmp_path / "nodes", crash_after=0)
    assert (
        json.loads((tmp_path / "cut/checkpoint/latest/checkpoint.json").read_text())["next_round"]
        == 1
    )
    resumed, grid = _run(example, app, tmp_path / "nodes")
    np.testing.assert_array_equal(resumed.algorithm.V, reference.algorithm.V)
    shape = reference.algorithm.U.shape
    np.testing.assert_array_equal(_node_vectors(grid, shape), _node_vectors(ref_grid, shape))
    assert _ledger(resumed) == _ledger(reference)
    # The resumed server asked the nodes for rounds 1 and 2 only, telling them it resumed.
    configs = [(kind, rec.message_config(m)) for kind, _, m, _ in grid.log]
    assert {int(c["round"]) for kind, c in configs if kind != "evaluate"} == {1, 2}
    assert {int(c["resumed_from"]) for _, c in configs} == {1}
    if fields:
        assert resumed.transport.ledger.steps == 3 and _ledger(crashed)["history"]
        # The server's notebook continues too: one view round per training round.
        assert [r.round_id for r in resumed.transport.view.rounds] == [0, 1, 2]


def test_a_round_cut_after_advertising_starts_again_with_the_nodes(example, tmp_path):
    """The server dies in round 1 after AdvertiseKeys and ShareKeys, before any node masked its
    input: nothing of round 1 was released, so the resumed server runs round 1 again (fresh
    keys in secure mode; the same seeded ones here) and ends with the uninterrupted model."""
    fields = {"transport": "secagg", "rounds": 2}
    reference, _ = _run(example, _app(example, tmp_path / "whole", **fields), None)
    app = _app(example, tmp_path, **fields)
    setup = example.server_setup(app)
    client = make_client_app(lambda context: example.client_setup(app, context))

    def die_before_masking(message, context):
        config = rec.message_config(message)
        if message.metadata.message_type == MASK and int(config["round"]) == 1:
            raise Crash(1)

    grid = DirectGrid(client, N_NODES, before=die_before_masking)
    for context in grid.contexts.values():
        context.node_config[STATE_DIR_KEY] = str(tmp_path / "nodes")
    with pytest.raises(Crash):
        run_federation(grid, setup)
    assert {(kind, int(rec.message_config(m)["round"])) for kind, _, m, _ in grid.log} >= {
        (ADVERTISE, 1),
        (SHARE, 1),
    }
    resumed, _ = _run(example, app, tmp_path / "nodes")
    np.testing.assert_array_equal(resumed.algorithm.V, reference.algorithm.V)


def test_a_secure_mode_run_resumes_under_its_checkpoint_key_only(example, tmp_path):
    key = tmp_path / "checkpoint.key"
    key.write_bytes(os.urandom(32))
    key.chmod(0o600)
    app = _app(example, tmp_path, seed=-1, rounds=2, checkpoint_key_file=str(key))
    _run(example, app, tmp_path / "nodes", crash_after=0)
    saved = (tmp_path / "checkpoint/latest/checkpoint.json").read_text()
    assert "entropy_sealed" in saved and '"entropy":' not in saved
    other = tmp_path / "other.key"
    other.write_bytes(os.urandom(32))
    other.chmod(0o600)
    with pytest.raises(CheckpointError):
        _run(example, dataclasses.replace(app, checkpoint_key_file=str(other)), tmp_path / "nodes")
    resumed, grid = _run(example, app, tmp_path / "nodes")
    assert len(resumed.transport.view.rounds) == 2
    assert {int(rec.message_config(m)["resumed_from"]) for _, _, m, _ in grid.log} == {1}


def test_a_checkpoint_of_another_run_or_a_damaged_one_is_refused(example, tmp_path):
    app = _app(example, tmp_path, rounds=2)
    _run(example, app, tmp_path / "nodes", crash_after=0)
    latest = tmp_path / "checkpoint/latest"
    with pytest.raises(CheckpointError, match=r"different configuration \(differs in \['lr'\]\)"):
        _run(example, dataclasses.replace(app, lr=0.2), tmp_path / "nodes")
    with pytest.raises(CheckpointError, match="seed"):
        _run(example, dataclasses.replace(app, seed=1), tmp_path / "nodes")
    saved = {p.name: p.read_bytes() for p in latest.iterdir() if p.is_file()}
    state = latest / "state.npz"
    damaged = bytearray(saved["state.npz"])
    damaged[len(damaged) // 2] ^= 1
    state.write_bytes(bytes(damaged))
    with pytest.raises(CheckpointError, match=r"state\.npz"):
        _run(example, app, tmp_path / "nodes")
    state.write_bytes(saved["state.npz"])
    (latest / "checkpoint.json").write_bytes(saved["checkpoint.json"][:100])  # truncated
    with pytest.raises(CheckpointError, match=r"checkpoint\.json: not valid JSON"):
        _run(example, app, tmp_path / "nodes")
    (latest / "checkpoint.json").write_bytes(saved["checkpoint.json"])
    resumed, _ = _run(example, app, tmp_path / "nodes")  # the intact one resumes
    assert len(resumed.transport.view.rounds) == 2


def test_an_unseeded_run_checkpoints_only_with_a_key(example, tmp_path):
    app = _app(example, tmp_path, seed=-1)
    with pytest.raises(ValueError, match="checkpoint key"):
        _run(example, app, tmp_path / "nodes")
    with pytest.raises(ValueError, match="needs the run's fingerprint"):
        FlowerRunOptions(rounds=2, checkpoint_dir=str(tmp_path))


def test_a_spent_budget_is_refused_before_any_node_is_asked(example, tmp_path):
    dp = {"transport": "dp-local", "dp_clip": 4.0, "dp_noise_multiplier": 2.0}
    two, _ = _run(example, _app(example, tmp_path / "two", rounds=2, **dp), None)
    budget = PrivacyBudget(two.transport.ledger.epsilon(1e-5) * 1.001, 1e-5)
    app = _app(example, tmp_path, rounds=4, **dp)
    with pytest.raises(PrivacyBudgetExceeded):  # round 2 does not fit: the run stops there
        _run(example, app, tmp_path / "nodes", budget=budget)
    saved = json.loads((tmp_path / "checkpoint/latest/checkpoint.json").read_text())
    assert saved["next_round"] == 2 and len(saved["ledgers"][0]["history"]) == 1
    asked = []
    with pytest.raises(PrivacyBudgetExceeded):
        _run(
            example,
            app,
            tmp_path / "nodes",
            budget=budget,
            setup_hook=lambda setup: asked.append(setup),
        )
    assert [r.round_id for r in asked[0].transport.view.rounds] == [0, 1]
    # A resumed run cannot raise the budget the checkpoint's ledger was kept under.
    bigger = PrivacyBudget(budget.epsilon * 2, 1e-5)
    with pytest.raises(CheckpointError, match="privacy ledger 0 differs"):
        _run(example, app, tmp_path / "nodes", budget=bigger)


@pytest.mark.usefixtures("torch_one_thread")
def test_fedhpd_resumed_on_flower_equals_the_uninterrupted_run(tmp_path):
    """FedHPD's server (S_p, the consensus window) and nodes (agents, optimisers, environments'
    generators, in their journal) continue after a crash between two rounds of an event."""
    from test_flower_fedhpd import SEED, public_states, small_config

    from securefed.rl.flower_fedhpd import FedHPDFlowerRun, client_setup, server_setup

    config = small_config()  # 8 transport rounds
    public = public_states(config)

    def run(name, crash_after=None, state_dir=None):
        fedhpd = FedHPDFlowerRun(
            config,
            SEED,
            min_nodes=2,
            output_dir=str(tmp_path / name),
            checkpoint_dir=str(tmp_path / f"{name}-checkpoint"),
        )
        setup = server_setup(fedhpd, public_states=public)
        if crash_after is not None:
            setup.on_round = lambda round_id, _: _crash_at(round_id, crash_after)
        grid = DirectGrid(make_client_app(lambda context: client_setup(fedhpd, context)), 2)
        for context in grid.contexts.values():
            context.node_config[STATE_DIR_KEY] = str(tmp_path / f"{name}-nodes")
        with contextlib.suppress(Crash):
            return run_federation(grid, setup)

    whole = run("whole")
    assert run("cut", crash_after=4) is None
    resumed = run("cut")
    assert resumed.resumed_from == 5 and len(resumed.rounds) == 8
    np.testing.assert_array_equal(
        [r["mean_return"] for r in resumed.rounds], [r["mean_return"] for r in whole.rounds]
    )
    assert resumed.evaluations[-1] == whole.evaluations[-1]
    for partition in range(2):
        cut = np.load(tmp_path / f"cut/node-{partition}.npz")
        ref = np.load(tmp_path / f"whole/node-{partition}.npz")
        for name in ref.files:
            np.testing.assert_array_equal(cut[name], ref[name])


def _crash_at(round_id, crash_after):
    if round_id == crash_after:
        raise Crash(round_id)


# ----------------------------------------------------------------------------- the nodes' side
@pytest.mark.parametrize(
    ("fields", "stage", "said"),
    [({}, TRAIN, "train"), (SECAGG_DP, ADVERTISE, "AdvertiseKeys")],
    ids=["plaintext", "secagg+dp"],
)
def test_a_node_answers_a_round_once_whoever_asks_again(example, tmp_path, fields, stage, said):
    """A deviating server starting the run over (no checkpoint), and a resumed one whose
    checkpoint is older than what the nodes released, both ask for a released round: the
    nodes refuse it, naming it, before computing anything."""
    app = _app(example, tmp_path, rounds=2, **fields)
    older = tmp_path / "older"

    def keep_round_0(setup):
        def on_round(round_id, metrics):
            if round_id == 0:
                shutil.copytree(tmp_path / "checkpoint", older)
            if round_id == 1:
                raise Crash(round_id)

        setup.on_round = on_round

    _run(example, app, tmp_path / "nodes", setup_hook=keep_round_0)
    shutil.rmtree(tmp_path / "checkpoint")
    shutil.copytree(older, tmp_path / "checkpoint")  # the server lost round 1's checkpoint
    with pytest.raises(AggregationError, match=f"refused {stage}: this node already released"):
        _run(example, app, tmp_path / "nodes")
    over = dataclasses.replace(app, checkpoint_dir="")  # the same run, started over
    with pytest.raises(AggregationError, match=f"round 1 of this run .* asks {said} of round 0"):
        _run(example, over, tmp_path / "nodes")


def test_a_node_without_a_journal_refuses_a_resumed_run(example, tmp_path):
    app = _app(example, tmp_path, rounds=2)
    _run(example, app, tmp_path / "nodes", crash_after=0)
    with pytest.raises(AggregationError, match=f"keeps no state across runs.*{STATE_DIR_KEY}"):
        _run(example, app, None)


def test_a_damaged_node_journal_is_refused(example, tmp_path):
    app = _app(example, tmp_path, rounds=2)
    _run(example, app, tmp_path / "nodes", crash_after=0)
    [journal] = [p for p in (tmp_path / "nodes").glob(f"*-node-1/{JOURNAL_FILE}")]
    [state] = list(journal.parent.glob("state-*.npz"))
    state.write_bytes(state.read_bytes()[:-7])  # truncated
    with pytest.raises(AggregationError, match=r"node .* refused train: .*state-0\.npz"):
        _run(example, app, tmp_path / "nodes")


# ----------------------------------------------------------------------------- real processes
@pytest.mark.slow
def test_a_superlink_killed_between_rounds_resumes_to_the_uninterrupted_model(example, tmp_path):
    """SIGKILL the SuperLink (and the ServerApp it runs) once round 0's checkpoint is on disk,
    start a new SuperLink on the same port, resubmit with ``flwr run``: the server resumes at
    round 1, the nodes (their journal in ``state-dir``) from their state after round 0, and the
    model and the privacy ledger are those of the uninterrupted run."""
    from securefed.flower.loopback import LoopbackFederation, missing_commands
    from securefed.recsys.fedmf_flower import write_fedmf_app

    if missing := missing_commands():
        pytest.skip(f"{missing} not installed (pip install securefed[flower])")
    started = time.monotonic()
    out = tmp_path / "out"
    app = example.FedMFApp(
        seed=0,
        rounds=3,
        min_nodes=2,
        timeout=120.0,
        output_dir=str(out),
        checkpoint_dir=str(tmp_path / "checkpoint"),
        transport="dp-local",
        dp_clip=4.0,
        dp_noise_multiplier=0.5,
    )
    node_config = {p: {STATE_DIR_KEY: str(tmp_path / "nodes")} for p in range(2)}
    checkpoint = tmp_path / "checkpoint/latest/checkpoint.json"
    with LoopbackFederation(tmp_path / "federation", 2, node_config=node_config) as federation:
        app_dir = write_fedmf_app(tmp_path / "app", app.run_config())
        federation.submit(app_dir)
        deadline = time.monotonic() + 240
        while not checkpoint.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        superlink = federation.processes[0]
        os.killpg(superlink.pid, signal.SIGKILL)  # the SuperLink and the ServerApp under it
        superlink.wait(timeout=10)
        done = json.loads(checkpoint.read_text())["next_round"]
        assert 1 <= done < app.rounds, done
        _restart(federation)
        federation.submit(app_dir)
        federation.wait_for(out / "result.json", timeout=240)
    result = json.loads((out / "result.json").read_text())
    model, transport, history = example.in_process(app)
    np.testing.assert_allclose(np.load(out / "server.npz")["V"], model.V, rtol=0, atol=1e-9)
    assert [r["round"] for r in result["rounds"]] == [0, 1, 2] and result["resumed_from"] == done
    np.testing.assert_allclose(
        [r["train_rmse"] for r in result["rounds"]], [r["train_rmse"] for r in history], rtol=1e-12
    )
    assert result["privacy_ledger"]["history"] == transport.ledger.state_dict()["history"]
    assert result["epsilon"] == pytest.approx(transport.ledger.epsilon(app.dp_delta), rel=1e-12)
    print(f"\nresumed after round {done - 1}; wall {time.monotonic() - started:.1f} s")


def _restart(federation) -> None:
    """A new SuperLink on the federation's port (the flags of ``LoopbackFederation.start``),
    then the SuperNodes again with their node config (their journals are on disk).

    Flower 1.42's SuperLink keeps its nodes in memory: a SuperNode that reconnects to the new one
    is refused (HTTP 401) and exits, as its log says; a node's operator restarts it.
    """
    from securefed.flower.loopback import _executable, _wait_for_port

    command = [
        _executable("flower-superlink"),
        *federation._link_flags(),
        "--host",
        "127.0.0.1",
        "--port",
        str(federation.port),
        "--disable-runtime-dependency-installation",
    ]
    process, log = federation._popen("superlink-restarted", command)
    federation.processes[0], federation.logs[0] = process, log
    _wait_for_port(federation.port, process, federation.startup_timeout, log)
    for partition in range(federation.n_nodes):
        old = federation.processes[1 + partition]
        try:
            old.wait(timeout=60)  # refused by the new SuperLink, it exits
        except subprocess.TimeoutExpired:
            os.killpg(old.pid, signal.SIGTERM)
            old.wait(timeout=10)
        command = federation.supernode_command(partition, root_certificates=None, private_key=None)
        node, node_log = federation._popen(f"supernode-{partition}-restarted", command)
        federation.processes[1 + partition], federation.logs[1 + partition] = node, node_log


@pytest.mark.parametrize("merged", ["merge_share_mask", "advertise_ahead"])
def test_checkpoints_refuse_merged_message_rounds(merged, tmp_path):
    from securefed.flower.protocol import FlowerRunOptions

    with pytest.raises(ValueError, match=f"checkpoint_dir with {merged}"):
        FlowerRunOptions(
            rounds=2, checkpoint_dir=tmp_path, fingerprint={"seed": 0}, **{merged: True}
        )


@pytest.mark.parametrize("key", ["secagg-merge", "secagg-advertise-ahead"])
def test_fedhpd_checkpoints_refuse_merged_message_rounds(key, tmp_path):
    """FedHPD on Flower checkpoints too (``checkpoint-dir``): its run refuses a merge with a
    checkpoint directory by the run-config key, before a server or node is built."""
    from test_flower_fedhpd_recovery import app_run_config

    from securefed.rl.flower_fedhpd import FedHPDApp

    values = app_run_config(transport="secagg", seed=0, **{"checkpoint-dir": str(tmp_path)})
    assert FedHPDApp.from_run_config(values).run.checkpoint_dir == str(tmp_path)
    with pytest.raises(ValueError, match=f"checkpoint-dir with {key}"):
        FedHPDApp.from_run_config(values | {key: True})
    assert FedHPDApp.from_run_config(values | {"checkpoint-dir": "", key: True})
