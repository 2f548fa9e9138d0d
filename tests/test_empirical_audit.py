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
    direction_release_score,
    direction_server_score,
    draw_rating_canaries,
    ledger_epsilon,
    rating_payload_score,
    with_rating_canaries,
)
from securefed.audit import audit
from securefed.audit.empirical import (
    METHODS,
    EmpiricalAuditConfig,
    EmpiricalAuditFailed,
    Scorer,
    audit_scores,
    binomial_tail,
    check_against_ledger,
    count_correct,
    delta_finding,
    draw_inclusions,
    epsilon_lower_bound,
    gaussian_delta,
    gaussian_epsilon,
    guesses_from_scores,
    holm_rejections,
    ledger_p_value,
    one_run_tail_bound,
    run_empirical_audit,
)
from securefed.audit.faults import fault_patches
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


def test_no_method_reports_a_lower_bound_above_the_truth():
    # Randomized response at epsilon 1 (exactly, for every canary): a lower bound above 1 may
    # happen in at most 5% of runs. The former "gdp" option (the epsilon of a Gaussian mechanism
    # with the measured mu) exceeded 1 in about 55% of runs; it is refused now. Of 40 runs at
    # most 5 may exceed (P[Binomial(40, 0.05) >= 6] < 1.4%).
    with pytest.raises(ValueError, match="removed"):
        EmpiricalAuditConfig(n_canaries=10, method="gdp")
    for method in METHODS:
        config = EmpiricalAuditConfig(
            n_canaries=400, guess_fractions=(0.1, 0.25, 0.5), method=method
        )
        above = 0
        for seed in range(40):
            rng = np.random.default_rng(100 + seed)
            included = draw_inclusions(400, rng)
            scores = _randomized_response(1.0, included, rng) + 1e-3 * rng.random(400)
            above += audit_scores(scores, included, config).epsilon_lower > 1.0
        assert above <= 5, (method, above)


def test_gaussian_conversion_is_stable_at_large_mu():
    assert float(gaussian_delta(1.0, gaussian_epsilon(1.0, 1e-3))) == pytest.approx(1e-3)
    # mu 4.88 is epsilon 32 at delta 1e-5; the naive e^eps Phi(.) overflowed past mu ~ 20.
    assert gaussian_epsilon(4.8796, 1e-5) == pytest.approx(32.0, abs=0.01)
    assert math.isfinite(gaussian_epsilon(40.0, 1e-5))


def test_holm_rejects_step_down():
    assert holm_rejections([0.01, 0.04, 0.03, 0.5], 0.05).tolist() == [True, False, False, False]
    assert holm_rejections([0.02, 0.01], 0.05).tolist() == [True, True]
    assert holm_rejections([0.2, 0.3], 0.05).tolist() == [False, False]
    with pytest.raises(ValueError, match="p-values"):
        holm_rejections([np.nan], 0.05)


def _marginal_results(n_scorers: int, excess: float):
    """Results whose every scorer's bound exceeds its ledger, each barely (p just under 5%)."""
    config = EmpiricalAuditConfig(n_canaries=400, guess_fractions=(0.25,))
    results = {}
    for k in range(n_scorers):
        rng = np.random.default_rng(k)
        included = draw_inclusions(400, rng)
        scores = _randomized_response(2.0, included, rng) + 1e-3 * rng.random(400)
        first = audit_scores(scores, included, config)
        results[f"s{k}"] = audit_scores(
            scores, included, config, epsilon_ledger=first.epsilon_lower - excess
        )
    return results


def test_scorers_are_corrected_together():
    # Four scorers, each of whose own 95% bound barely exceeds its ledger: uncorrected, the
    # fixture failed; Holm across the four keeps the family-wise level at 5% and passes them.
    results = _marginal_results(4, 0.01)
    assert all(r.exceeds_ledger for r in results.values())
    assert all(0.0125 < ledger_p_value(r) < 0.05 for r in results.values())
    check_against_ledger(results)  # no failure
    # A clear contradiction still fails, and names its scorer.
    clear = _marginal_results(1, 1.0)
    with pytest.raises(EmpiricalAuditFailed, match="s0"):
        check_against_ledger({**results, **clear})


def test_audit_delta_is_checked_against_the_ledger():
    config = EmpiricalAuditConfig(n_canaries=50, delta=1e-6)
    scorers = {"noise": Scorer("released_model", lambda obs, i: obs[i])}
    rng = np.random.default_rng(0)

    def run(delta_ledger):
        return run_empirical_audit(
            config,
            lambda included: rng.random(len(included)),
            scorers,
            rng=np.random.default_rng(1),
            epsilon_of=lambda obs, observer: 1.0,
            delta_of=lambda obs: delta_ledger,
        )

    with pytest.raises(EmpiricalAuditFailed, match="delta") as caught:
        check_against_ledger(run(1e-5))  # the audit tests a smaller delta than the ledger's
    assert caught.value.findings[0].code == "empirical-delta-below-ledger"
    larger = run(1e-7)
    check_against_ledger(larger)  # valid, weaker: a warning only
    assert delta_finding(larger["noise"]).severity == "warning"
    check_against_ledger(run(1e-6))


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
        ({"method": "gdp"}, "removed"),
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


def _break(monkeypatch, how: str) -> None:
    """Break the DP transport the way a bug would, leaving every parameter it declares alone.

    The noise faults (:func:`securefed.audit.faults.fault_patches`) break both noises: the
    float Gaussian (``dp``, ``dp-local``, ``ckks+dp``) and the integer discrete Gaussian and
    Skellam that ``secagg+dp`` draws by default.
    """
    clip_row_updates = dp_module.clip_row_updates
    if how in ("no-noise", "noise/10"):
        for owner, name, value in fault_patches(how):
            monkeypatch.setattr(owner, name, value)
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
    # secagg+dp's default mechanism is the exact discrete Gaussian: the faults break its
    # integer noise (they used to break only the float noise, which it never draws). Skipping
    # the clip is refused by the integer encoder, which checks each update's norm.
    correct, correct_run = _direction_audit("secagg+dp")
    assert not correct.exceeds_ledger
    assert correct_run.view.public["dp_mechanism"] == "discrete_gaussian"
    _break(monkeypatch, how)
    if how == "clip-skipped":
        with pytest.raises(ValueError, match="exceeds the clip"):
            _direction_audit("secagg+dp")
        return
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


def test_server_scorer_reads_the_decoded_sum_under_the_integer_mechanism():
    # secagg+dp's default mechanism is the discrete Gaussian: the view's "total" is the (1, D)
    # ring sum of rotated integers, not the model block. The server decodes the noisy sum, so
    # its score reads that (it used to index the ring sum as the block: an IndexError).
    plan = CanaryPlan(n_direction=12, direction_norm=100.0)
    job = FedMFCanaryJob(
        TRAIN, user_level_dp_config(rounds=1, dim=4), "secagg+dp", plan, {"epsilon": 1.0}
    )
    observation = job(np.ones(12, bool))
    assert observation.summed("total").shape[0] == 1  # the ring sum
    server = [direction_server_score(observation, i) for i in range(12)]
    released = [direction_release_score(observation, i) for i in range(12)]
    assert server == released


def test_bench_names_each_row_that_contradicts_its_ledger():
    from securefed.bench.bench_privacy_audit import broken_rows

    row = {"transport": "dp", "epsilon_target": 1.0, "scorer": "d", "observer": "server"}
    fine = {**row, "contradicts_ledger": False, "delta_error": None}
    above = {**row, "contradicts_ledger": True, "epsilon_lower": 2.0, "epsilon_ledger": 1.0}
    delta = {**fine, "delta_error": "the audit tests delta 1e-06 but the ledger's is 1e-05"}
    assert broken_rows([fine]) == []
    lines = broken_rows([fine, above, delta])
    assert len(lines) == 2
    assert lines[0].startswith("dp epsilon 1 d (server): epsilon lower bound 2 > ledger 1")
    assert "delta 1e-06" in lines[1]


@pytest.mark.slow
def test_bench_exits_nonzero_naming_a_row_above_its_ledger(monkeypatch, tmp_path, capsys):
    from securefed.bench.bench_privacy_audit import main

    argv = [
        "privacy-audit",
        "--mode=fedmf-one-run",
        "--data=ml-latest-small",
        "--split=random",
        "--transports=dp",
        "--epsilons=1",
        "--rounds=1",
        "--rating-canaries=0",
        "--direction-canaries=200",
        "--direction-norm=100",
        "--curve=200",
        f"--out={tmp_path}",
    ]
    assert main(argv) == 0  # correct central DP: no row contradicts its ledger
    _break(monkeypatch, "no-noise")
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "dp epsilon 1 direction/released (released_model)" in err
