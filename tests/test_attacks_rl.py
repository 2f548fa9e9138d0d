"""Attacks on the RL recommenders (attacks/policy_leak.py, attacks/qvalue_leak.py).

FedHPD: the server clones each agent's policy from its uploads and estimates its recent return;
it beats the population-mean baseline on plaintext and falls to it exactly under secure
aggregation. FedSlate: the server infers the user's net kale exposure from the platforms'
Q-values; it beats the baselines on the plaintext record and loses most of it under noise.
Tiny schedules (CartPole, 6 agents; FedSlate 16 episodes x 3 deployments): a few seconds each.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the RL attacks need torch (the rl extra)")
pytest.importorskip("gymnasium", reason="the RL attacks need gymnasium (the rl extra)")

from securefed import ALL_PAYLOADS, PlaintextTransport, RoundSelection, ServerView  # noqa: E402
from securefed.attacks.policy_leak import (  # noqa: E402
    CloneConfig,
    PolicyProtocol,
    link_accuracy,
    read_event,
    recent_returns,
    score_estimates,
    unscale_probabilities,
    verify_policy_leak,
)
from securefed.attacks.qvalue_leak import (  # noqa: E402
    QLeakConfig,
    discounted_sums,
    perturb_record,
    read_inquiries,
    replay_truth,
    ridge_fit,
    verify_qvalue_leak,
)
from securefed.views import FusionView  # noqa: E402

HPD_SEED = 20
SLATE_SEED = 3


pytestmark = pytest.mark.usefixtures("torch_one_thread")


# -- FedHPD ---------------------------------------------------------------------------------------
def hpd_config(**overrides):
    from securefed.rl.fedhpd import FedHPDConfig
    from securefed.rl.policies import AGENTS

    settings = {
        "task": "cartpole",
        "d": 5,
        "rounds": 60,
        "agent_specs": AGENTS["cartpole"][:6],
        "public_size": 300,
        "part_size": 150,
        "distill_loops": 1,
        "virtual_rounds": 60,
    } | overrides
    return FedHPDConfig(**settings)


CLONE = CloneConfig(episodes=16, chunk=128, steps=120)


@pytest.fixture(scope="module")
def hpd_runs():
    """One population: the same run over plaintext, secure aggregation and local DP."""
    from securefed.rl.fast import make_public_states, train_population
    from securefed.rl.fedhpd import RunSpec
    from securefed.transport import build_transport

    config = hpd_config()
    public = make_public_states(config)
    keep = RoundSelection(every=True)
    options = {"keep_payloads": keep, "n_clients": config.n_agents}
    local_dp = {"noise_multiplier": 1.0, "clip": math.sqrt(config.part_size)}
    transports = {
        "plaintext": PlaintextTransport(keep_payloads=keep),
        "secagg": build_transport("secagg", **options),
        "dp": build_transport("dp-local", local_dp, **options),
    }
    runs = [RunSpec(config, HPD_SEED, t, public) for t in transports.values()]
    results = dict(zip(transports, train_population(runs), strict=True))
    return config, public, transports, results


@pytest.fixture(scope="module")
def plaintext_report(hpd_runs):
    config, public, transports, results = hpd_runs
    protocol = PolicyProtocol.from_config(config)
    view = transports["plaintext"].view
    return verify_policy_leak(view, protocol, public, results["plaintext"].returns, config=CLONE)


def test_protocol_maps_transport_rounds_to_events():
    protocol = PolicyProtocol.from_config(hpd_config(distill_loops=2, part_size=100))
    assert (protocol.n_events, protocol.n_parts) == (12, 3)
    assert protocol.transport_round(0, 0, 0) == 0
    assert protocol.transport_round(1, 1, 2) == (1 * 2 + 1) * 3 + 2
    assert protocol.event_end(0) == 5
    with pytest.raises(ValueError, match="no part"):
        protocol.transport_round(0, 0, 3)
    with pytest.raises(ValueError, match="FedHPD"):
        PolicyProtocol.from_config(hpd_config(algorithm="nofed"))
    with pytest.raises(ValueError, match="hidden"):
        CloneConfig(hidden=0)


def test_scoring_helpers():
    returns = np.arange(20, dtype=float)[:, None] * np.array([1.0, 2.0])
    protocol = PolicyProtocol("cartpole", 5, 20, 2, 1, 10, 10)
    truth = recent_returns(returns, protocol, window=2)
    np.testing.assert_allclose(truth[0], [3.5, 7.0])  # rounds 4 and 5 (1-based)
    assert truth.shape == (4, 2)
    perfect = score_estimates(truth, truth)
    assert perfect["mae"] == 0 and perfect["spearman"] == pytest.approx(1.0)
    uploads = np.random.default_rng(0).dirichlet([1, 1], size=(4, 30))
    assert link_accuracy(uploads, uploads[[0, 1, 2, 3]]) == 1.0
    np.testing.assert_allclose(unscale_probabilities(uploads * 0.3), uploads)


def test_policy_clone_beats_chance_on_plaintext(plaintext_report):
    report = plaintext_report
    overall, baseline = report.overall, report.baseline
    assert report.method == "clone" and overall["events_cloned"] == 12
    assert overall["mae"] < 0.8 * baseline["mae"]
    assert overall["spearman"] > baseline["spearman"] + 0.15
    assert overall["spearman_within_event"] > 0.35  # a random ranking scores 0
    assert baseline["spearman_within_event"] == 0.0
    assert overall["link_accuracy"] > 0.6 > 1 / 6 == pytest.approx(overall["link_chance"])


def test_saved_view_gives_the_same_report(hpd_runs, plaintext_report, tmp_path):
    config, public, transports, results = hpd_runs
    loaded = ServerView.load(transports["plaintext"].view.save(tmp_path / "view"))
    report = verify_policy_leak(
        loaded, PolicyProtocol.from_config(config), public, results["plaintext"].returns,
        config=CLONE,
    )  # fmt: skip
    np.testing.assert_allclose(report.estimates, plaintext_report.estimates)


def test_policy_leak_falls_to_chance_under_secure_aggregation(hpd_runs):
    config, public, transports, results = hpd_runs
    view = transports["secagg"].view
    protocol = PolicyProtocol.from_config(config)
    assert read_event(view, protocol, 0).values is None
    report = verify_policy_leak(view, protocol, public, results["secagg"].returns, config=CLONE)
    assert report.method == "baseline" and report.overall["events_cloned"] == 0
    np.testing.assert_array_equal(report.estimates, report.baseline_estimates)
    for metric in ("mae", "rmse", "spearman", "spearman_within_event", "link_accuracy"):
        assert report.overall[metric] == report.baseline[metric]
    assert any("masked" in note for note in report.notes)
    assert report.to_dict()["method"] == "baseline"


def test_policy_leak_on_local_dp_uses_the_noisy_payloads(hpd_runs, plaintext_report):
    config, public, transports, results = hpd_runs
    view = transports["dp"].view
    report = verify_policy_leak(
        view, PolicyProtocol.from_config(config), public, results["dp"].returns, config=CLONE
    )
    assert report.method == "clone"
    assert report.noise_std == pytest.approx(math.sqrt(config.part_size))  # sigma 1 x clip
    assert any("noisy" in note for note in report.notes)
    # Noise of std ~12 on each probability: the clone ranks agents no better than chance.
    assert abs(report.overall["spearman_within_event"]) < 0.3
    assert report.overall["mae"] > plaintext_report.overall["mae"]


def test_gaussian_uploads_are_cloned_too():
    """InvertedPendulum: uploads are ``[mean, std]``; the clone fits and rolls out a Gaussian."""
    from securefed.rl.fast import make_public_states, train_population
    from securefed.rl.fedhpd import MissingExtra, RunSpec, require_task
    from securefed.rl.policies import AGENTS

    try:
        require_task("invertedpendulum")
    except MissingExtra as error:
        pytest.skip(str(error))
    config = hpd_config(
        task="invertedpendulum", agent_specs=AGENTS["invertedpendulum"][:3], rounds=4, d=2,
        public_size=100, part_size=50, virtual_rounds=2,
    )  # fmt: skip
    public = make_public_states(config)
    transport = PlaintextTransport(keep_payloads=RoundSelection(every=True))
    (result,) = train_population([RunSpec(config, HPD_SEED, transport, public)])
    report = verify_policy_leak(
        transport.view, PolicyProtocol.from_config(config), public, result.returns,
        config=CloneConfig(episodes=2, steps=20), window=2,
    )  # fmt: skip
    assert report.method == "clone" and report.estimates.shape == (2, 3)
    assert np.isfinite(report.estimates).all() and (report.estimates >= 1).all()


# -- FedSlate -------------------------------------------------------------------------------------
def slate_config(**overrides):
    from securefed.rl.fedslate import FedSlateConfig

    settings = {"episodes": 16, "members": 3, "burn_in": 200, "seed": SLATE_SEED,
                "eps_decay": 0.99} | overrides  # fmt: skip
    return FedSlateConfig(**settings)


@pytest.fixture(scope="module")
def slate_run():
    from securefed.rl.fedslate import run_fedslate

    config = slate_config()
    result = run_fedslate(config, keep_payloads=ALL_PAYLOADS)
    record = read_inquiries(result.fusion_view)
    return config, record, result, replay_truth(config, record, result)


def test_the_channels_view_keeps_every_acting_inquiry(slate_run):
    config, record, _, truth = slate_run
    assert record.parties == ("A", "B")
    assert record.inquiries == config.episodes * config.steps_per_platform
    assert record.inputs["A"].shape == (record.inquiries, config.members, config.num_candidates)
    assert record.learning_forwards > 0 and record.backwards > 0 and record.target_forwards > 0
    assert truth.nke.shape == (record.inquiries, config.members)
    np.testing.assert_allclose(truth.sat, 1 / (1 + np.exp(-0.01 * truth.nke)))


def test_a_saved_fusion_view_gives_the_same_record(slate_run, tmp_path):
    _, record, result, _ = slate_run
    view = result.fusion_view
    assert view.total_bytes()[0] > 0 and view.rounds_with_payloads()[-1] == result.rounds - 1
    loaded = read_inquiries(FusionView.load(view.save(tmp_path / "view")))
    for party in record.parties:
        np.testing.assert_array_equal(loaded.inputs[party], record.inputs[party])
        np.testing.assert_array_equal(loaded.outputs[party], record.outputs[party])
    assert (loaded.learning_forwards, loaded.target_forwards, loaded.backwards) == (
        record.learning_forwards, record.target_forwards, record.backwards,
    )  # fmt: skip


def test_the_attack_refuses_a_view_that_kept_only_some_inquiries():
    from securefed.rl.fedslate import run_fedslate

    config = slate_config(episodes=1, members=1, burn_in=5)
    partial = run_fedslate(config, keep_payloads=RoundSelection(last=3)).fusion_view
    assert partial.rounds_with_payloads() == [58, 59, 60]
    with pytest.raises(ValueError, match="3 of 61 acting exchanges"):
        read_inquiries(partial)
    with pytest.raises(ValueError, match="no exchange tagged"):
        read_inquiries(partial, tag="nothing")


def test_replay_refuses_a_run_it_does_not_match(slate_run):
    _, record, result, _ = slate_run
    with pytest.raises(ValueError, match="differ"):
        replay_truth(slate_config(seed=SLATE_SEED + 1), record, result)
    with pytest.raises(ValueError, match="inquiries"):
        replay_truth(slate_config(episodes=3), record, result)


def test_regression_helpers():
    values = np.ones((6, 1))
    np.testing.assert_allclose(discounted_sums(values, 3, 0.5)[:, 0], [1, 1.5, 1.75] * 2)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 3))
    y = x @ np.array([1.0, -2.0, 0.5]) + 3.0
    groups, train = np.arange(200) // 10, np.arange(200) < 120
    predicted, alpha = ridge_fit(x, y, groups, train, (0.01, 100.0), 3, rng)
    assert alpha == 0.01 and np.abs(predicted - y).max() < 0.05
    with pytest.raises(ValueError, match="labelled_fraction"):
        QLeakConfig(labelled_fraction=1.0)


def test_qvalues_leak_the_users_hidden_state(slate_run):
    config, record, _, truth = slate_run
    report = verify_qvalue_leak(
        record, truth, config.steps_per_platform,
        config=QLeakConfig(labelled_fraction=0.5), targets=("nke", "sat"), shadow=False,
    )  # fmt: skip
    nke = report.targets["nke"]
    chance = max(nke["mean"]["r2"], nke["step"]["r2"])
    assert nke["attack"]["r2"] > 0.3 and nke["attack"]["r2"] > chance + 0.3
    assert nke["attack"]["mae"] < 0.9 * nke["mean"]["mae"]
    assert report.targets["sat"]["attack"]["r2"] > 0.3  # sat is a monotone map of nke
    assert report.labelled_users == 8 and report.users == 16


def test_noised_qvalues_lose_most_of_the_leak(slate_run):
    config, record, _, truth = slate_run
    settings = {"config": QLeakConfig(labelled_fraction=0.5), "targets": ("nke",),
                "shadow": False}  # fmt: skip
    plain = verify_qvalue_leak(record, truth, config.steps_per_platform, **settings)
    noisy_record = perturb_record(record, 3.0, np.random.default_rng(0))
    noisy = verify_qvalue_leak(noisy_record, truth, config.steps_per_platform, **settings)
    assert noisy.noise_std == 3.0
    assert noisy.targets["nke"]["attack"]["r2"] < plain.targets["nke"]["attack"]["r2"] - 0.15
