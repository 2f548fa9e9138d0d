"""The FederatedAlgorithm contract is checked when the run is built; a spent budget ends a run
cleanly (issue 19)."""

from __future__ import annotations

import numpy as np
import pytest

from securefed import (
    AlgorithmContractError,
    PlaintextTransport,
    PrivacyBudgetExceeded,
    RunOptions,
    SeedTree,
    run_rounds,
)
from securefed.privacy import PrivacyLedger
from securefed.privacy.calibration import epsilon_for_schedule
from securefed.transport.dp import DPTransport


class _Mean:
    """The smallest algorithm: every client submits ones; the server keeps the mean."""

    n_clients = 4

    def __init__(self) -> None:
        self.value = np.zeros(2)
        self.rounds_run = 0

    def run_round(self, round_id, clients, transport, seeds):
        rnd = transport.open_round(round_id, clients, shape=(1, 2), seeds=seeds)
        for client in clients.tolist():
            rnd.submit(client, np.full(2, 0.1))
        self.value = self.value + rnd.result().total[0]
        self.rounds_run += 1
        return {"value": float(self.value[0])}

    def state_dict(self):
        return {"value": self.value.copy()}

    def load_state_dict(self, state):
        self.value = np.asarray(state["value"])


class _NoClients(_Mean):
    n_clients = None


def test_a_missing_member_is_named_before_any_round():
    transport = PlaintextTransport()
    with pytest.raises(AlgorithmContractError, match=r"'n_clients' attribute") as caught:
        run_rounds(_NoClients(), transport, SeedTree(0), RunOptions(rounds=1))
    assert "docs/byom.md" in str(caught.value)
    assert len(transport.view) == 0  # nothing ran

    class _Half:
        n_clients = 3.0

        def run_round(self, round_id, clients, transport, seeds):
            return {}

    with pytest.raises(AlgorithmContractError) as caught:
        run_rounds(_Half(), PlaintextTransport(), SeedTree(0), RunOptions(rounds=1))
    message = str(caught.value)
    assert "'n_clients' as an int, not float" in message
    assert "'state_dict' method" in message and "'load_state_dict' method" in message
    assert "'run_round'" not in message
    assert isinstance(caught.value, TypeError)


def _budget_transport(rounds_allowed: int) -> DPTransport:
    sigma = 2.0
    budget = (epsilon_for_schedule(sigma, 1.0, rounds_allowed, 1e-5) * 1.0001, 1e-5)
    return DPTransport(
        PlaintextTransport(), clip=1.0, noise_multiplier=sigma, ledger=PrivacyLedger(budget=budget)
    )


def test_budget_exhaustion_returns_the_history_with_its_reason():
    algorithm = _Mean()
    transport = _budget_transport(3)
    history = run_rounds(algorithm, transport, SeedTree(0), RunOptions(rounds=10))
    assert [r["round"] for r in history.rounds] == [0, 1, 2]
    assert history.stopped_at == 3 and not history.completed
    assert "privacy budget exhausted at round 3" in history.stop_reason
    assert "budget" in history.stop_reason.partition(": ")[2]  # the ledger's own message
    assert algorithm.rounds_run == 3 and transport.ledger.steps == 3
    whole = run_rounds(_Mean(), _budget_transport(3), SeedTree(0), RunOptions(rounds=3))
    assert whole.completed and whole.stop_reason is None and whole.stopped_at is None


def test_the_raise_option_keeps_the_exception():
    options = RunOptions(rounds=10, on_budget_exhausted="raise")
    with pytest.raises(PrivacyBudgetExceeded, match="budget"):
        run_rounds(_Mean(), _budget_transport(2), SeedTree(0), options)
    with pytest.raises(ValueError, match="on_budget_exhausted"):
        RunOptions(rounds=1, on_budget_exhausted="ignore")
