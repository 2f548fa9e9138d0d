"""Claim: a DP run's privacy ledger survives a checkpoint and resume (issue 17, item 1).

The exploit: the ledger was not in the checkpoint, so a central-DP FedMF run interrupted after a
checkpoint and resumed with a fresh ledger reported a smaller epsilon than the uninterrupted run
(2.705 against 3.998 at epsilon 4 on ML-100K), and its budget check started again from zero.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from securefed import (
    CheckpointError,
    PlaintextTransport,
    RunOptions,
    SeedTree,
    run_rounds,
)
from securefed.privacy import PrivacyLedger
from securefed.privacy.calibration import noise_for_target
from securefed.recsys.fedmf import FedMF, user_level_dp_config
from securefed.transport.dp import DPTransport

EPSILON, DELTA, PLANNED_ROUNDS = 4.0, 1e-5, 30
SIGMA = noise_for_target(EPSILON, DELTA, 1.0, PLANNED_ROUNDS)
FINGERPRINT = {"run": "central-dp-fedmf", "sigma": SIGMA}


class _Interrupted(Exception):
    """Stands for a crash after a checkpoint."""


def _budget_ledger() -> PrivacyLedger:
    # The CLI's budget: the target epsilon with a little room for the calibration's rounding.
    return PrivacyLedger(budget=(EPSILON * 1.0001, DELTA))


def _dp_run(split, directory, *, rounds, ledger=None, stop_after=None, transport=None):
    """A central-DP FedMF run of ``rounds`` rounds with checkpoints every 10 rounds."""
    seeds = SeedTree(1)
    cfg = user_level_dp_config(rounds=rounds, dim=4, server_lr=2.0)
    model = FedMF(split.train, cfg, seeds)
    if transport is None:
        ledger = ledger if ledger is not None else _budget_ledger()
        transport = DPTransport(
            PlaintextTransport(), clip=1.0, noise_multiplier=SIGMA, ledger=ledger, delta=DELTA
        )

    def crash(round_id, metrics):
        if stop_after is not None and round_id + 1 == stop_after:
            raise _Interrupted

    options = RunOptions(
        rounds=rounds,
        checkpoint_dir=directory,
        checkpoint_every=10,
        progress=False,
        fingerprint=FINGERPRINT,
    )
    history = run_rounds(model, transport, seeds, options, on_round=crash)
    return model, transport, history


def test_resumed_run_reports_the_epsilon_and_history_of_the_uninterrupted_run(
    small_split, tmp_path
):
    reference_model, reference, _ = _dp_run(small_split, tmp_path / "a", rounds=PLANNED_ROUNDS)
    with pytest.raises(_Interrupted):
        _dp_run(small_split, tmp_path / "b", rounds=PLANNED_ROUNDS, stop_after=22)
    # The crashed process is gone; a new one builds a fresh ledger, as the CLI does.
    model, resumed, history = _dp_run(small_split, tmp_path / "b", rounds=PLANNED_ROUNDS)
    assert history.resumed_from == 20
    assert resumed.ledger.history == reference.ledger.history == [(SIGMA, 1.0, PLANNED_ROUNDS)]
    assert resumed.epsilon() == reference.epsilon()
    assert EPSILON - 0.01 < resumed.epsilon() <= EPSILON  # calibrated for 30 rounds
    assert resumed.view.public["epsilon"] == reference.view.public["epsilon"]
    assert resumed.view.public["privacy_ledger"] == reference.view.public["privacy_ledger"]
    assert np.array_equal(model.V, reference_model.V)


def test_the_budget_binds_across_a_resume(small_split, tmp_path):
    _dp_run(small_split, tmp_path, rounds=20)  # checkpoint after round 20, the run's end
    ledger = _budget_ledger()
    # 40 more rounds asked: the run stops cleanly where the budget binds (issue 19)
    _, _, history = _dp_run(small_split, tmp_path, rounds=2 * PLANNED_ROUNDS, ledger=ledger)
    assert history.stopped_at == PLANNED_ROUNDS and "budget" in history.stop_reason
    assert [r["round"] for r in history.rounds][-1] == PLANNED_ROUNDS - 1
    assert ledger.steps == PLANNED_ROUNDS  # stopped where 30 rounds in all spent the budget
    assert ledger.epsilon() <= EPSILON * 1.0001
    saved = PrivacyLedger.from_state_dict(_checkpoint_ledgers(tmp_path)[0])
    assert saved.history == [(SIGMA, 1.0, PLANNED_ROUNDS)]  # the checkpoint after round 30


def test_resuming_a_dp_run_from_a_checkpoint_without_the_ledger_is_refused(small_split, tmp_path):
    # A checkpoint written by a run that charged no ledger (here: the same run without DP).
    _dp_run(small_split, tmp_path, rounds=10, transport=PlaintextTransport())
    with pytest.raises(CheckpointError, match="holds no privacy ledger"):
        _dp_run(small_split, tmp_path, rounds=20)


def test_resuming_with_another_ledger_than_the_checkpoints_is_refused(small_split, tmp_path):
    _dp_run(small_split, tmp_path, rounds=10)
    other_budget = PrivacyLedger(budget=(8.0, DELTA))
    with pytest.raises(CheckpointError, match="budget"):
        _dp_run(small_split, tmp_path, rounds=20, ledger=other_budget)
    other_accountant = PrivacyLedger("prv", budget=(EPSILON * 1.0001, DELTA))
    with pytest.raises(CheckpointError, match="accountant"):
        _dp_run(small_split, tmp_path, rounds=20, ledger=other_accountant)
    # A ledger that already recorded releases the checkpoint does not know (e.g. one carried
    # over from the crashed process, which got past the checkpoint): resuming would roll it back.
    ahead = _budget_ledger()
    ahead.charge(SIGMA, 1.0, steps=12)
    with pytest.raises(CheckpointError, match="history"):
        _dp_run(small_split, tmp_path, rounds=20, ledger=ahead)
    assert ahead.steps == 12  # left as it was


def test_a_checkpoint_of_a_dp_run_cannot_resume_without_its_ledger(small_split, tmp_path):
    _dp_run(small_split, tmp_path, rounds=10)
    with pytest.raises(CheckpointError, match="privacy ledger"):
        _dp_run(small_split, tmp_path, rounds=20, transport=PlaintextTransport())


def _checkpoint_ledgers(directory) -> list[dict]:
    meta = json.loads((directory / "latest" / "checkpoint.json").read_text())
    return meta["ledgers"]
