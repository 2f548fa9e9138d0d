"""Claim: every path that releases a DP output charges a privacy ledger (issue 17, item 11).

The exploits: ``DPTransport(ledger=None)`` noised and released sums that no ledger recorded;
``clip_and_noise_rows`` was a public helper that released noised rows without a ledger; and
under distributed placement the inner round's ``result()`` decoded the noisy sum without the
charge that ``DPRound.result()`` makes, even after that charge had been refused for the budget.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import securefed.privacy
import securefed.privacy.noise
from securefed import PlaintextTransport, PrivacyBudgetExceeded, SeedTree
from securefed.privacy import PrivacyLedger, epsilon_for_schedule, release_rows
from securefed.transport.dp import DPTransport

SIGMA = 1.5


def _distributed(ledger=None) -> DPTransport:
    with pytest.warns(UserWarning, match="distributed DP over the 'plaintext'"):
        return DPTransport(
            PlaintextTransport(),
            clip=1.0,
            noise_multiplier=SIGMA,
            placement="distributed",
            ledger=ledger,
        )


def _submit_all(rnd, n: int) -> None:
    for client in range(n):
        rnd.submit(client, np.full(3, 0.1))


@pytest.mark.parametrize("placement", ["central", "local", "distributed"])
def test_a_transport_built_without_a_ledger_still_records_every_release(placement):
    if placement == "distributed":
        dp = _distributed()
    else:
        dp = DPTransport(
            PlaintextTransport(), clip=1.0, noise_multiplier=SIGMA, placement=placement
        )
    for round_id in range(3):
        rnd = dp.open_round(round_id, range(4), shape=(1, 3), seeds=SeedTree(0))
        _submit_all(rnd, 4)
        rnd.result()
    assert isinstance(dp.ledger, PrivacyLedger)
    assert dp.ledger.history == [(SIGMA, 1.0, 3)]
    assert dp.privacy_ledgers() == (dp.ledger,)
    assert dp.ledger.epsilon(1e-5) == pytest.approx(epsilon_for_schedule(SIGMA, 1.0, 3, 1e-5))


def test_the_inner_round_of_a_distributed_round_cannot_release_without_the_charge():
    ledger = PrivacyLedger()
    dp = _distributed(ledger)
    rnd = dp.open_round(0, range(4), shape=(1, 3), seeds=SeedTree(0))
    _submit_all(rnd, 4)
    noisy = rnd.inner.result()  # the server asks the inner round to decode the noisy sum
    assert ledger.history == [(SIGMA, 1.0, 1)]
    assert np.array_equal(rnd.result().total, noisy.total)  # the same release, charged once
    assert ledger.steps == 1


def test_a_round_refused_for_its_budget_cannot_be_decoded_through_its_inner_round():
    ledger = PrivacyLedger(budget=(epsilon_for_schedule(SIGMA, 1.0, 1, 1e-5), 1e-5))
    dp = _distributed(ledger)
    # Two rounds opened while the budget still allowed one more: the second is refused at its
    # release, when the first has spent the budget.
    first = dp.open_round(0, range(4), shape=(1, 3), seeds=SeedTree(0))
    second = dp.open_round(1, range(4), shape=(1, 3), seeds=SeedTree(0))
    _submit_all(first, 4)
    _submit_all(second, 4)
    first.result()
    with pytest.raises(PrivacyBudgetExceeded):
        second.result()
    with pytest.raises(PrivacyBudgetExceeded):
        second.inner.result()  # and not by asking the inner round either
    assert ledger.steps == 1
    assert "total" not in second.view.aggregate  # nothing was decoded


def test_no_public_noising_helper_releases_without_a_ledger():
    assert not hasattr(securefed.privacy, "clip_and_noise_rows")
    assert "clip_and_noise_rows" not in securefed.privacy.__all__
    assert not hasattr(securefed.privacy.noise, "clip_and_noise_rows")
    ledger_parameter = inspect.signature(release_rows).parameters["ledger"]
    assert ledger_parameter.default is inspect.Parameter.empty  # required
    with pytest.raises(TypeError, match="ledger"):
        release_rows(np.ones((2, 3)), clip=1.0, sigma=1.0, rng=np.random.default_rng(0))
    with pytest.raises(TypeError, match="PrivacyLedger"):
        release_rows(
            np.ones((2, 3)), clip=1.0, sigma=1.0, rng=np.random.default_rng(0), ledger=None
        )
    ledger = PrivacyLedger()
    out = release_rows(
        np.ones((2, 3)), clip=1.0, sigma=1.0, rng=np.random.default_rng(0), ledger=ledger
    )
    assert out.shape == (2, 3) and ledger.history == [(1.0, 1.0, 2)]


def test_a_dp_transport_refuses_something_that_is_not_a_ledger():
    with pytest.raises(TypeError, match="PrivacyLedger"):
        DPTransport(PlaintextTransport(), clip=1.0, noise_multiplier=1.0, ledger=object())
