"""Faults on Flower (issue 33): a node returning garbage refuses the round naming it; a SuperNode
killed in the middle of a secure-aggregation round is a dropout.

The fast tests run the real ``run_federation`` and ClientApps on the in-process grid of
``tests/test_claims_flower.py``; ``-m slow``: a SuperLink and SuperNodes as separate processes on
127.0.0.1 (``securefed.flower.loopback``), the run submitted with ``flwr run``, the faults
injected by ``securefed.flower.faults`` and a SuperNode killed with SIGKILL by the test.

Before this, a garbage reply failed the server with the error of whatever read it first
(``ValueError: update values must be finite``), without naming the node.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip(
    "flwr", reason="Flower is not installed: pip install securefed[flower] (flwr[simulation])"
)

from test_claims_flower import DirectGrid, task_identity

from securefed.errors import AggregationError
from securefed.flower import make_client_app, partition_users
from securefed.flower.faults import Fault, FaultyClientApp, write_faulty_app
from securefed.flower.loopback import LoopbackFederation
from securefed.flower.server import MASK, TRAIN, run_federation
from securefed.recsys.fedmf import FedMF
from securefed.recsys.fedmf_flower import write_fedmf_app

assert task_identity  # the fixture, imported for the tests that use it


def _faulty_run(example, app, n_nodes, faults):
    setup = example.server_setup(app)
    client = make_client_app(lambda context: example.client_setup(app, context))
    grid = DirectGrid(FaultyClientApp(client, tuple(faults)), n_nodes)
    return grid, setup, lambda: run_federation(grid, setup)


@pytest.mark.usefixtures("task_identity")
@pytest.mark.parametrize(("transport", "message_type"), [("plaintext", TRAIN), ("secagg", MASK)])
def test_a_node_answering_garbage_refuses_the_round_naming_it(example, transport, message_type):
    app = example.FedMFApp(seed=0, rounds=2, transport=transport, min_nodes=3)
    fault = Fault(partition=1, message_type=message_type, kind="garbage", round_id=1)
    _, setup, run = _faulty_run(example, app, 3, [fault])
    after_round: list[np.ndarray] = []
    setup.on_round = lambda round_id, metrics: after_round.append(setup.algorithm.V.copy())
    with pytest.raises(AggregationError, match=f"round 1: node 101 answered {message_type}"):
        run()
    # Round 0 went through; round 1 was refused before the server stepped on anything.
    assert len(after_round) == 1 and np.array_equal(setup.algorithm.V, after_round[0])
    assert [r.round_id for r in setup.transport.view.rounds] == [0, 1]


@pytest.mark.usefixtures("task_identity")
def test_a_node_that_hangs_is_a_dropout_and_other_faults_are_checked(example, tmp_path):
    marker = tmp_path / "hung"
    app = example.FedMFApp(seed=0, rounds=1, transport="plaintext", min_nodes=3, timeout=0.3)
    fault = Fault(1, TRAIN, "hang", marker=str(marker), hang_seconds=0.01)
    grid, setup, run = _faulty_run(example, app, 3, [fault])
    result = run()
    assert marker.exists() and result.rounds[0]["clients"] == 120
    assert setup.transport.view.rounds[0].dropped == partition_users(120, 3, 1).tolist()
    hung = [reply for kind, node, _, reply in grid.log if node == 101 and kind == TRAIN]
    assert hung[0].has_error() and "hung" in hung[0].error.reason
    with pytest.raises(ValueError, match="kind"):
        Fault(0, TRAIN, "slow")


# ----------------------------------------------------------------------------- real processes
def _processes_needed():
    from securefed.flower.loopback import missing_commands

    if missing := missing_commands():
        pytest.skip(f"{missing} not installed (pip install securefed[flower])")


class DrillFederation(LoopbackFederation):
    """The loopback federation, with SuperNodes a drill may kill (no longer watched)."""

    def kill_node(self, partition: int) -> None:
        process = self.processes[1 + partition]
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
        self.killed = getattr(self, "killed", set()) | {partition}

    def wait_for(self, path, timeout):
        deadline = time.monotonic() + timeout
        killed = getattr(self, "killed", set())
        watched = [p for i, p in enumerate(self.processes) if i - 1 not in killed]
        while time.monotonic() < deadline:
            if Path(path).exists():
                return Path(path)
            for process in watched:
                if process.poll() is not None:
                    raise RuntimeError(f"a process exited with {process.returncode}: {self.logs}")
            time.sleep(0.25)
        raise TimeoutError(f"{path} did not appear within {timeout} s; logs: {self.workdir}")

    def server_log(self, run_id: str) -> str:
        """The ServerApp's log of a run (``flwr log <run-id> <connection> --show``)."""
        import subprocess

        from securefed.flower.loopback import CONNECTION, _executable

        done = subprocess.run(
            [_executable("flwr"), "log", run_id, CONNECTION, "--show"],
            capture_output=True,
            text=True,
            env=self.env,
            cwd=self.workdir,
            timeout=60,
            check=False,
        )
        return done.stdout + done.stderr


def _in_process_with_dropout(example, app, dropped_users):
    """Round 0 of the in-process run with ``dropped_users`` lost before masking.

    In one process every user is a party: a quarter of them lost at once leaves some secrets
    below the default graph's threshold, so the reference runs on the complete graph
    (``secagg_neighbours = users - 1``). The graph changes the masks, not the decoded sum: each
    user's update is encoded with its own rounding stream and the masks cancel exactly.
    """
    app = dataclasses.replace(app, secagg_neighbours=app.synthetic_users - 1)
    split = example.load_split(example._data_key(app))
    seeds = app.seeds()
    model = FedMF(split.train, app.fedmf_config(), seeds)
    transport = app.make_transport(remote=False)
    everyone = np.arange(model.n_clients)
    rnd, clients = model.open_round(0, everyone, transport, seeds)
    for user in dropped_users:
        rnd.drop(int(user))
    survivors = np.setdiff1d(clients, dropped_users)
    model.client_step(0, survivors, seeds, rnd.submit_batch)
    model.close_round(rnd)
    return model


@pytest.mark.slow
def test_a_supernode_killed_in_a_secure_aggregation_round_is_a_dropout(example, tmp_path):
    """Four SuperNodes (the nodes' graph: k = 3 neighbours, threshold t = 2, so one dropout
    leaves every secret enough helpers; with three nodes, t = k = 2, it would not); the fourth
    is killed (SIGKILL) when the masking message reaches it, after it shared its keys: the
    server drops its party, the other nodes reveal its pairwise masks, and the model equals the
    in-process round with its users dropped."""
    _processes_needed()
    out, marker = tmp_path / "out", tmp_path / "masking"
    app = example.FedMFApp(
        seed=0, rounds=1, transport="secagg", min_nodes=4, output_dir=str(out), timeout=45.0
    )
    app_dir = write_fedmf_app(tmp_path / "app", app.run_config())
    write_faulty_app(app_dir, (Fault(3, MASK, "hang", round_id=0, marker=str(marker)),))
    with DrillFederation(tmp_path / "federation", n_nodes=4) as federation:
        federation.submit(app_dir)
        federation.wait_for(marker, timeout=240)
        federation.kill_node(3)
        federation.wait_for(out / "result.json", timeout=240)
    result = json.loads((out / "result.json").read_text())
    lost = partition_users(120, 4, 3)
    reference = _in_process_with_dropout(example, app, lost)
    # Same fixed-point sums of the same users: the tolerance of test_flower.py's secagg check.
    np.testing.assert_allclose(np.load(out / "server.npz")["V"], reference.V, rtol=0, atol=1e-9)
    full, _, _ = example.in_process(app)
    assert np.abs(full.V - reference.V).max() > 1e-6  # the dropout changed the model
    assert result["rounds"][0]["clients"] == 120 and result["evaluations"][-1]["nodes"] == 3


@pytest.mark.slow
def test_a_real_node_answering_garbage_refuses_the_round_naming_it(example, tmp_path):
    _processes_needed()
    out = tmp_path / "out"
    app = example.FedMFApp(seed=0, rounds=1, min_nodes=2, output_dir=str(out), timeout=120.0)
    app_dir = write_fedmf_app(tmp_path / "app", app.run_config())
    write_faulty_app(app_dir, (Fault(1, TRAIN, "garbage", round_id=0),))
    with DrillFederation(tmp_path / "federation", n_nodes=2) as federation:
        run_id = federation.submit(app_dir)
        deadline, text = time.monotonic() + 240, ""
        while "Exit Code" not in text and time.monotonic() < deadline:
            time.sleep(5.0)
            text = federation.server_log(run_id)
    assert "AggregationError: round 0: node " in text
    assert "answered train with a malformed reply" in text and "the round is refused" in text
    assert not (out / "result.json").exists()
