"""Claim: each epsilon names whom it holds against, at the sampling rate that observer faces
(issue 17, item 2).

The exploit: under distributed DP the server itself picks the round's clients and sees who
contributed, yet the ledger charged the subsampled rate q: one round at sigma 1, q = 0.06 was
reported as epsilon 1.73, where the honest figure against the server (q = 1) is 4.73. And the
runtime never told the ledger how it sampled: fixed-size sampling (accounted as Poisson) and
"everyone every round" charged at q < 1 went unflagged unless the caller repeated the mode to
``DPTransport``, which ``run_rounds`` and the CLI never did.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from securefed import (
    ClientSampling,
    InsecureParameterError,
    PlaintextTransport,
    PrivacyBudgetExceeded,
    RunOptions,
    SeedTree,
    run_rounds,
)
from securefed.privacy import PrivacyBudget, PrivacyLedger, epsilon_for_schedule
from securefed.transport.dp import DPTransport
from securefed.transport.secagg import SecAggConfig, SecAggTransport

DELTA = 1e-5


def _secagg_dp(ledger: PrivacyLedger, *, sample_rate: float = 0.06) -> DPTransport:
    return DPTransport(
        SecAggTransport(SecAggConfig(clip=8.0, neighbours=4)),
        clip=1.0,
        noise_multiplier=1.0,
        placement="distributed",
        ledger=ledger,
        sample_rate=sample_rate,
        delta=DELTA,
    )


def _round(dp: DPTransport, round_id: int, n: int = 6) -> None:
    rnd = dp.open_round(round_id, range(n), shape=(1, 3), seeds=SeedTree(round_id))
    for client in range(n):
        rnd.submit(client, np.full(3, 0.1))
    rnd.result()


def test_distributed_dp_states_its_epsilon_against_the_server_at_rate_one():
    ledger = PrivacyLedger(sampling="poisson")
    dp = _secagg_dp(ledger)
    _round(dp, 0)
    released = ledger.epsilon(DELTA, against="released_model")
    server = ledger.epsilon(DELTA, against="server")
    assert released == pytest.approx(1.7272, abs=1e-3)  # the released model: q = 0.06
    assert server == pytest.approx(4.7285, abs=1e-3)  # the server picked the clients: q = 1
    assert ledger.epsilon(DELTA) == released  # the default names the released model
    assert ledger.server_history == [(1.0, 1.0, 1)] and ledger.history == [(1.0, 0.06, 1)]
    public = dp.view.public
    assert public["epsilon"] == pytest.approx(released)
    assert public["epsilon_server"] == pytest.approx(server)
    assert dp.view.round(0).public["epsilon_server"] == pytest.approx(server)
    assert ledger.summary(DELTA)["epsilon_server"] == pytest.approx(server)


def test_central_dp_holds_nothing_against_the_server():
    ledger = PrivacyLedger()
    dp = DPTransport(
        PlaintextTransport(), clip=1.0, noise_multiplier=2.0, ledger=ledger, sample_rate=0.1
    )
    _round(dp, 0)
    assert ledger.epsilon(DELTA) == pytest.approx(epsilon_for_schedule(2.0, 0.1, 1, DELTA))
    assert ledger.epsilon(DELTA, against="server") == math.inf  # it sees the clipped sum
    assert ledger.server_clear_steps == 1


def test_local_dp_and_distributed_over_plaintext_charge_the_server_what_it_sees():
    ledger = PrivacyLedger()
    local = DPTransport(
        PlaintextTransport(), clip=1.0, noise_multiplier=2.0, placement="local", ledger=ledger
    )
    _round(local, 0)
    assert ledger.server_history == ledger.history == [(2.0, 1.0, 1)]
    ledger = PrivacyLedger()
    with pytest.warns(UserWarning, match="distributed DP over the 'plaintext'"):
        clear = DPTransport(
            PlaintextTransport(),
            clip=1.0,
            noise_multiplier=2.0,
            placement="distributed",
            ledger=ledger,
            sample_rate=0.5,
        )
    _round(clear, 0, n=16)
    # the server reads each update with 1/sqrt(16) of the noise, whoever it sampled
    assert ledger.server_history == [(0.5, 1.0, 1)]
    assert ledger.history == [(2.0, 0.5, 1)]


def test_a_budget_against_the_server_binds_the_server_figure():
    budget = PrivacyBudget(6.0, DELTA, against=("released_model", "server"))
    ledger = PrivacyLedger(budget=budget)
    dp = _secagg_dp(ledger)
    _round(dp, 0)  # 1.73 / 4.73
    with pytest.raises(PrivacyBudgetExceeded, match="server"):
        _round(dp, 1)  # the server figure would pass 6; the released model's would not
    assert ledger.steps == 1
    with pytest.raises(ValueError, match="observer"):
        PrivacyBudget(6.0, DELTA, against=("the public",))
    central = PrivacyLedger(budget=PrivacyBudget(100.0, DELTA, against=("server",)))
    with pytest.raises(PrivacyBudgetExceeded, match="server"):
        central.charge(2.0, 0.1)  # no epsilon holds against a server that sees the clear sum


class _Mean:
    """Clients send a constant; the server keeps the mean."""

    n_clients = 8

    def __init__(self):
        self.state = np.zeros(2)

    def run_round(self, round_id, clients, transport, seeds):
        rnd = transport.open_round(round_id, clients, shape=(1, 2), seeds=seeds)
        for client in clients:
            rnd.submit(int(client), np.full(2, 0.3))
        self.state = rnd.result().total.ravel()
        return {}

    def state_dict(self):
        return {"state": self.state}

    def load_state_dict(self, state):
        self.state = np.array(state["state"])


def _run(transport, sampling: ClientSampling, rounds: int = 3) -> None:
    run_rounds(_Mean(), transport, SeedTree(0), RunOptions(rounds=rounds, sampling=sampling))


def test_the_runtime_hands_its_sampling_to_the_ledger():
    ledger = PrivacyLedger()
    dp = DPTransport(
        PlaintextTransport(), clip=1.0, noise_multiplier=2.0, ledger=ledger, sample_rate=0.5
    )
    with pytest.warns(UserWarning, match="fixed-size"):
        _run(dp, ClientSampling("fixed", 4))
    assert ledger.sampling == "fixed" and ledger.sampling_rate == 0.5
    assert dp.view.public["sampling"] == "fixed"  # what the audit reads
    assert ledger.state_dict()["sampling"] == "fixed"


def test_everyone_every_round_charged_as_subsampled_is_refused():
    ledger = PrivacyLedger()
    dp = DPTransport(
        PlaintextTransport(), clip=1.0, noise_multiplier=2.0, ledger=ledger, sample_rate=0.5
    )
    with pytest.raises(InsecureParameterError, match="amplification"):
        _run(dp, ClientSampling())  # every client every round, but q = 0.5 was configured
    assert ledger.steps == 0


def test_a_rate_below_the_runtimes_is_refused():
    ledger = PrivacyLedger()
    dp = DPTransport(
        PlaintextTransport(), clip=1.0, noise_multiplier=2.0, ledger=ledger, sample_rate=0.1
    )
    with pytest.raises(InsecureParameterError, match="sampling rate"):
        _run(dp, ClientSampling("poisson", 4))  # the runtime samples at 0.5
    assert ledger.steps == 0


def test_a_transport_told_another_sampling_than_the_runtime_uses_is_refused():
    dp = DPTransport(
        PlaintextTransport(),
        clip=1.0,
        noise_multiplier=2.0,
        sample_rate=0.5,
        sampling="poisson",
    )
    with pytest.raises(ValueError, match="fixed"):
        _run(dp, ClientSampling("fixed", 4))


def test_a_stand_in_is_charged_against_the_server_as_its_deployment():
    # A benchmark's warm start runs central DP in the clear for distributed DP under secure
    # aggregation (the same noisy sums); the server's account must be the deployment's.

    ledger = PrivacyLedger()
    deployed = DPTransport(
        SecAggTransport(SecAggConfig(clip=4.0)), clip=1.0, noise_multiplier=1.0,
        placement="distributed", ledger=ledger, delta=1e-5,
    )  # fmt: skip
    stand_in = DPTransport(
        PlaintextTransport(), clip=1.0, noise_multiplier=1.0, ledger=ledger, delta=1e-5
    )
    stand_in.charge_server_as(deployed)
    rnd = stand_in.open_round(0, range(3), shape=(1, 2), seeds=SeedTree(0))
    for client in range(3):
        rnd.submit(client, np.ones(2))
    rnd.result()
    assert ledger.server_clear_steps == 0 and ledger.server_history == [(1.0, 1.0, 1)]
    assert stand_in.epsilon(against="server") == deployed.epsilon(against="server") < math.inf
    other = DPTransport(PlaintextTransport(), clip=1.0, noise_multiplier=2.0, ledger=ledger)
    with pytest.raises(ValueError, match="same ledger and noise multiplier"):
        other.charge_server_as(deployed)
