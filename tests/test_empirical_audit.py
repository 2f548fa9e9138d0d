"""The empirical audit: the one-run bound, FedMF canaries, broken DP caught, the fixture."""

from __future__ import annotations

import math

import numpy as np
import pytest

import securefed.transport.dp as dp_module
from securefed import RoundSelection
from securefed.attacks.canaries import (
    CanaryFedMF,
    CanaryPlan,
    FedMFCanaryJob,
    direction_coordinates,
    draw_rating_canaries,
    ledger_epsilon,
    rating_payload_score,
    with_rating_canaries,
)
from securefed.audit import audit
from securefed.audit.empirical import (
    EmpiricalAuditConfig,
    EmpiricalAuditFailed,
    Scorer,
    audit_scores,
    binomial_tail,
    check_against_ledger,
    count_correct,
    draw_inclusions,
    epsilon_lower_bound,
    gaussian_delta,
    gaussian_epsilon,
    guesses_from_scores,
    one_run_tail_bound,
    run_empirical_audit,
)
from securefed.recsys.data import synthetic_ratings
from securefed.recsys.fedmf import FedMF, FedMFConfig, user_level_dp_config
from securefed.transport.base import RowUpdates

pytest_plugins = ["pytester"]

# ----------------------------------------------------------------------------- the bound


def test_binomial_tail_is_exact():
    n, p = 30, 0.7
    for k in (0, 1, 12, 21, 30):
        exact = sum(math.comb(n, j) * p**j * (1 - p) ** (n - j) for j in range(k, n + 1))
        assert float(binomial_tail(n, k, p)) == pytest.approx(exact, rel=1e-12)


def test_pure_dp_bound_matches_the_closed_form():
    # All r guesses right under pure DP: p^r = beta, so epsilon = logit(beta^(1/r)).
    r, beta = 40, 0.05
    p = beta ** (1 / r)
    expected = math.log(p / (1 - p))
    assert epsilon_lower_bound(r, r, r, delta=0.0, beta=beta) == pytest.approx(expected, abs=1e-6)
    assert one_run_tail_bound(expected + 0.01, 0.0, r, r, r) > beta


def test_delta_only_weakens_the_bound():
    no_delta = epsilon_lower_bound(200, 190, 1000, delta=0.0, beta=0.05)
    with_delta = epsilon_lower_bound(200, 190, 1000, delta=1e-5, beta=0.05)
    assert 0 < with_delta < no_delta


def test_chance_guesses_give_no_bound():
    assert epsilon_lower_bound(100, 50, 200, delta=1e-5, beta=0.05) == 0.0
    assert epsilon_lower_bound(0, 0, 200, delta=1e-5, beta=0.05) == 0.0


def _randomized_response(epsilon: float, included: np.ndarray, rng) -> np.ndarray:
    """An exactly epsilon-DP release of each inclusion bit (each canary its own mechanism)."""
    keep = rng.random(len(included)) < math.exp(epsilon) / (1 + math.exp(epsilon))
    return np.where(keep, included, ~included).astype(float)


def test_the_bound_holds_on_a_mechanism_of_known_epsilon():
    # Randomized response at epsilon 1 with 400 canaries: a bound above 1 has probability at most
    # 5% per run (here 1 of the 12 seeds), so 3 or more of 12 would happen with probability < 2%.
    config = EmpiricalAuditConfig(n_canaries=400, guess_fractions=(0.1, 0.25, 0.5))
    bounds = []
    for seed in range(12):
        rng = np.random.default_rng(seed)
        included = draw_inclusions(400, rng)
        scores = _randomized_response(1.0, included, rng) + 1e-3 * rng.random(400)
        bounds.append(audit_scores(scores, included, config).epsilon_lower)
    assert sum(b > 1.0 for b in bounds) <= 2 and np.median(bounds) < 1.0
    # ...and the same audit sees a weaker mechanism (epsilon 4) as above 1.
    rng = np.random.default_rng(0)
    included = draw_inclusions(400, rng)
    scores = _randomized_response(4.0, included, rng) + 1e-3 * rng.random(400)
    assert audit_scores(scores, included, config).epsilon_lower > 1.0


def test_gdp_option_reports_mu_and_its_epsilon():
    config = EmpiricalAuditConfig(n_canaries=200, method="gdp", guess_fractions=(0.2,))
    included = draw_inclusions(200, np.random.default_rng(3))
    result = audit_scores(included.astype(float), included, config)
    assert result.mu_lower > 0
    assert result.epsilon_lower == pytest.approx(gaussian_epsilon(result.mu_lower, 1e-5))
    assert float(gaussian_delta(1.0, gaussian_epsilon(1.0, 1e-3))) == pytest.approx(1e-3)


def test_guesses_and_inclusions():
    scores = np.array([0.9, 0.1, 0.5, 0.5, -1.0])
    guesses = guesses_from_scores(scores, 2, 1)
    assert guesses.tolist() == [1, 0, 1, 0, -1]  # ties by index
    assert count_correct(guesses, np.array([1, 0, 0, 1, 0], bool)) == (3, 2)
    with pytest.raises(ValueError, match="NaN"):
        guesses_from_scores(np.array([np.nan, 1.0]), 1, 0)
    with pytest.raises(ValueError, match="guesses"):
        guesses_from_scores(scores, 4, 2)
    included = draw_inclusions(4000, np.random.default_rng(0))
    assert 0.47 < included.mean() < 0.53
    with pytest.raises(TypeError, match="Generator"):
        draw_inclusions(10, 0)


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"n_canaries": 0}, "n_canaries"),
        ({"confidence": 1.0}, "confidence"),
        ({"guess_fractions": (0.7,)}, "guess fraction"),
        ({"guess_fractions": ()}, "guess_fractions"),
        ({"method": "lira"}, "method"),
        ({"method": "gdp", "delta": 0.0}, "gdp"),
    ],
)
def test_config_refuses(changes, words):
    with pytest.raises(ValueError, match=words):
        EmpiricalAuditConfig(**({"n_canaries": 10} | changes))


def test_driver_checks_against_the_ledger():
    config = EmpiricalAuditConfig(n_canaries=200)
    scorers = {"leak": Scorer("released_model", lambda obs, i: obs[i])}
    results = run_empirical_audit(
        config,
        lambda included: included.astype(float),
        scorers,
        rng=np.random.default_rng(0),
        epsilon_of=lambda obs, observer: 1.0,
    )
    assert results["leak"].exceeds_ledger
    with pytest.raises(EmpiricalAuditFailed, match="released_model") as caught:
        check_against_ledger(results)
    assert caught.value.findings[0].code == "empirical-epsilon-above-ledger"
    with pytest.raises(ValueError, match="observer"):
        Scorer("everyone", lambda obs, i: 0.0)
    with pytest.raises(ValueError, match="outside"):
        run_empirical_audit(
            config,
            lambda included: included,
            {"x": Scorer("server", lambda obs, i: 0.0, canaries=[500])},
            rng=np.random.default_rng(0),
        )


# ----------------------------------------------------------------------------- FedMF canaries
TRAIN = synthetic_ratings(100, 300, 2000, seed=1)
DP_MODEL = user_level_dp_config(rounds=3, dim=4)
DIRECTIONS = CanaryPlan(n_direction=300, direction_norm=100.0)
AUDIT = EmpiricalAuditConfig(n_canaries=300)


def test_rating_canaries_join_the_data():
    rng = np.random.default_rng(0)
    canaries = draw_rating_canaries(5, TRAIN.n_items, 12, TRAIN.scale, rng)
    train = with_rating_canaries(TRAIN, canaries, np.array([1, 0, 1, 0, 0], bool))
    assert train.n_users == TRAIN.n_users + 5
    assert len(train) == len(TRAIN) + 24
    items, ratings = canaries.of(2)
    assert set(np.unique(ratings)) <= {TRAIN.scale.minimum, TRAIN.scale.maximum}
    mine = train.users == TRAIN.n_users + 2
    assert np.array_equal(np.sort(train.items[mine]), items)
    assert not np.any(train.users == TRAIN.n_users + 1)  # excluded: a user without ratings


def test_direction_canaries_refuse_what_they_cannot_audit():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="coordinates"):
        direction_coordinates(10, 4, 21, rng)
    rows, columns = direction_coordinates(10, 4, 20, rng)
    assert len(set(zip(rows.tolist(), columns.tolist(), strict=True))) == 20
    model = FedMF(TRAIN, FedMFConfig(rounds=1, dim=4), __import__("securefed").SeedTree(0))
    with pytest.raises(ValueError, match="aggregation='fixed'"):
        CanaryFedMF(model, rows, columns, np.ones(20, bool), norm=1.0)


def test_direction_canaries_leave_the_model_alone():
    plan = CanaryPlan(n_direction=50)
    job = FedMFCanaryJob(TRAIN, DP_MODEL, "plaintext", plan)
    with_all = job(np.ones(50, bool)).item_factors
    with_none = job(np.zeros(50, bool)).item_factors
    assert np.array_equal(with_all, with_none)


def test_plaintext_leaks_every_canary():
    # Vanilla FedMF in the clear: the inversion recovers the canaries' ratings exactly.
    plan = CanaryPlan(n_rating=60, items_per_canary=15)
    job = FedMFCanaryJob(
        TRAIN, FedMFConfig(rounds=2, dim=4), "plaintext", plan, keep_payloads=RoundSelection(last=1)
    )
    scorers = job.scorers(white_box_payloads=True)
    results = run_empirical_audit(
        EmpiricalAuditConfig(n_canaries=60),
        job,
        {"white": scorers["ratings/white-box"]},
        rng=np.random.default_rng(0),
        epsilon_of=ledger_epsilon,
    )
    white = results["white"]
    included = white.included
    assert np.all(white.scores[included] == 2.0)  # every item found, every rating recovered
    assert np.all(white.scores[~included] == 0.0)
    # Perfect guesses on 60 canaries: the most that 60 can show at 95% (the bound grows with m).
    assert white.epsilon_lower > 1.8 and white.epsilon_ledger == math.inf


def test_white_box_needs_clear_payloads():
    job = FedMFCanaryJob(TRAIN, DP_MODEL, "plaintext", CanaryPlan(n_rating=3))
    observation = job(np.ones(3, bool))
    items, ratings = observation.rating_canaries.of(0)
    with pytest.raises(ValueError, match="kept no payload"):
        rating_payload_score(observation.view, TRAIN.n_users, items, ratings, observation.protocol)


class _ScaledNoise:
    def __init__(self, source, factor: float) -> None:
        self.source, self.factor = source, factor
        self.secure, self.name = source.secure, source.name

    def normal(self, std, shape):
        return self.source.normal(std * self.factor, shape)


def _break(monkeypatch, how: str) -> None:
    """Break the DP transport the way a bug would, leaving every parameter it declares alone."""
    noise_source, clip_row_updates = dp_module.noise_source, dp_module.clip_row_updates
    if how in ("no-noise", "noise/10"):
        factor = 0.0 if how == "no-noise" else 0.1
        monkeypatch.setattr(
            dp_module, "noise_source", lambda *a, **k: _ScaledNoise(noise_source(*a, **k), factor)
        )
    elif how == "clip-skipped":

        def skip_odd_clients(updates, clip):
            clipped, norms = clip_row_updates(updates, clip)
            odd = np.repeat(updates.clients % 2 == 1, np.diff(updates.indptr))[:, None]
            values = np.where(odd, updates.values, clipped.values)
            broken = RowUpdates(
                updates.clients,
                updates.indptr,
                updates.rows,
                values,
                updates.n_rows,
                updates.dense,
                updates.weights,
            )
            return broken, norms

        monkeypatch.setattr(dp_module, "clip_row_updates", skip_odd_clients)


def _direction_audit(transport: str):
    job = FedMFCanaryJob(TRAIN, DP_MODEL, transport, DIRECTIONS, {"epsilon": 1.0})
    observations = []

    def run_job(included):
        observations.append(job(included))
        return observations[-1]

    scorer = job.scorers(white_box_payloads=False)["direction/released"]
    result = run_empirical_audit(
        AUDIT, run_job, {"d": scorer}, rng=np.random.default_rng(1), epsilon_of=ledger_epsilon
    )["d"]
    return result, observations[0]


@pytest.mark.parametrize("how", ["no-noise", "noise/10", "clip-skipped"])
def test_empirical_audit_flags_broken_central_dp(monkeypatch, how):
    correct, correct_run = _direction_audit("dp")
    assert not correct.exceeds_ledger and correct.epsilon_ledger == pytest.approx(1.0, abs=0.01)
    _break(monkeypatch, how)
    broken, broken_run = _direction_audit("dp")
    assert broken.exceeds_ledger, broken.to_dict()
    assert broken.epsilon_lower > 1.2
    # The parameter audit reads the same declared parameters and cannot tell the runs apart.
    assert audit(broken_run.view).findings == audit(correct_run.view).findings
    assert broken_run.view.public["epsilon"] == correct_run.view.public["epsilon"]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["no-noise", "noise/10", "clip-skipped"])
def test_empirical_audit_flags_broken_distributed_dp(monkeypatch, how):
    correct, correct_run = _direction_audit("secagg+dp")
    assert not correct.exceeds_ledger
    _break(monkeypatch, how)
    broken, broken_run = _direction_audit("secagg+dp")
    assert broken.exceeds_ledger, broken.to_dict()
    # The parameter audit cannot tell the runs apart: the same findings, and none but the
    # seeded randomness of a test run (a record marked tests=True is itself an error now).
    clean = audit(broken_run.view.public)
    assert clean.findings == audit(correct_run.view.public).findings
    assert {f.code for f in clean.errors} <= {"seeded-randomness"}


# ----------------------------------------------------------------------------- the fixture
@pytest.mark.privacy_audit
def test_fixture_passes_a_correct_run(securefed_privacy_audit):
    job = FedMFCanaryJob(TRAIN, DP_MODEL, "dp", DIRECTIONS, {"epsilon": 1.0})
    results = securefed_privacy_audit(
        job,
        {"d": job.scorers(white_box_payloads=False)["direction/released"]},
        config=AUDIT,
        rng=np.random.default_rng(1),
        epsilon_of=ledger_epsilon,
    )
    assert results["d"].epsilon_lower < results["d"].epsilon_ledger


@pytest.mark.privacy_audit
def test_fixture_fails_a_broken_run(securefed_privacy_audit, monkeypatch):
    _break(monkeypatch, "no-noise")
    job = FedMFCanaryJob(TRAIN, DP_MODEL, "dp", DIRECTIONS, {"epsilon": 1.0})
    with pytest.raises(EmpiricalAuditFailed, match="released_model"):
        securefed_privacy_audit(
            job,
            {"d": job.scorers(white_box_payloads=False)["direction/released"]},
            config=AUDIT,
            rng=np.random.default_rng(1),
            epsilon_of=ledger_epsilon,
        )


def test_marker_is_registered(pytestconfig):
    assert any(line.startswith("privacy_audit:") for line in pytestconfig.getini("markers"))


def test_fixture_refuses_an_unmarked_test(pytester):
    pytester.makepyfile(
        """
        def test_unmarked(securefed_privacy_audit):
            pass
        """
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*mark the test @pytest.mark.privacy_audit*"])
