"""Differential privacy: the ledger on Opacus, calibration, noise sources, DPTransport, DP-SGD."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from securefed import (
    ALL_PAYLOADS,
    InsecureParameterError,
    PlaintextTransport,
    PrivacyBudgetExceeded,
    RowUpdates,
    SeedTree,
)
from securefed.privacy import (
    PrivacyLedger,
    SecureGaussian,
    SeededGaussian,
    epsilon_for_schedule,
    noise_for_target,
    release_rows,
    segment_norms,
)
from securefed.transport.dp import DPTransport, clip_row_updates, densify

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ pinned Opacus figures
def test_pinned_epsilon_rdp_and_prv():
    assert epsilon_for_schedule(1.0, 0.01, 1000, 1e-5) == pytest.approx(2.1014, abs=1e-3)
    assert epsilon_for_schedule(1.0, 0.01, 1000, 1e-5, "prv") == pytest.approx(1.8384, abs=1e-3)


def test_ledger_matches_opacus_rdp_accountant_on_a_mixed_history():
    from opacus.accountants import RDPAccountant

    ledger = PrivacyLedger()
    reference = RDPAccountant()
    for sigma, q, steps in [(1.0, 0.01, 600), (0.8, 0.02, 3), (1.0, 0.01, 400)]:
        ledger.charge(sigma, q, steps=steps)
        for _ in range(steps):
            reference.step(noise_multiplier=sigma, sample_rate=q)
    assert ledger.history == [(1.0, 0.01, 600), (0.8, 0.02, 3), (1.0, 0.01, 400)]
    assert ledger.steps == 1003
    # dp-accounting's RDP against Opacus's: tests/test_accounting.py states the tolerance
    assert ledger.epsilon(1e-5) == pytest.approx(reference.get_epsilon(1e-5), rel=1e-4)


def test_ledger_pinned_figure_and_summary():
    ledger = PrivacyLedger(sampling="poisson")
    ledger.charge(1.0, 0.01, steps=1000)
    assert ledger.epsilon(1e-5) == pytest.approx(2.1014, abs=1e-3)
    summary = ledger.summary(1e-5)
    assert summary["accountant_sampling"] == "poisson"
    assert summary["sampling"] == "poisson"
    assert summary["steps"] == 1000
    assert summary["sample_rate"] == 0.01
    with pytest.raises(ValueError, match="give delta"):
        ledger.epsilon()


def test_noise_for_target_pinned():
    assert noise_for_target(8.0, 1e-5, 0.01, 1000) == pytest.approx(0.6158, abs=1e-3)


@settings(max_examples=6, deadline=None)
@given(
    epsilon=st.floats(0.5, 10.0),
    delta=st.sampled_from([1e-4, 1e-5, 1e-6]),
    sample_rate=st.floats(0.001, 1.0),
    rounds=st.integers(1, 2000),
)
def test_calibrated_noise_never_overshoots(epsilon, delta, sample_rate, rounds):
    sigma = noise_for_target(epsilon, delta, sample_rate, rounds, epsilon_tolerance=0.05)
    achieved = epsilon_for_schedule(sigma, sample_rate, rounds, delta)
    assert achieved <= epsilon
    assert achieved >= epsilon - 0.05  # and the search stops within the tolerance


def test_calibration_refuses_bad_input():
    with pytest.raises(ValueError, match="sample_rate"):
        noise_for_target(1.0, 1e-5, 0.0, 10)
    with pytest.raises(ValueError, match="delta"):
        epsilon_for_schedule(1.0, 0.1, 10, 1.5)
    with pytest.raises(ValueError, match="accountant"):
        epsilon_for_schedule(1.0, 0.1, 10, 1e-5, "gdp-ish")


# ------------------------------------------------------------------ budget and persistence
def test_budget_refusal_leaves_the_ledger_unchanged():
    budget_eps = epsilon_for_schedule(1.0, 0.01, 500, 1e-5)
    ledger = PrivacyLedger(budget=(budget_eps, 1e-5))
    ledger.charge(1.0, 0.01, steps=500)
    before = ledger.state_dict()
    with pytest.raises(PrivacyBudgetExceeded, match=r"over the budget.*nothing was recorded"):
        ledger.charge(1.0, 0.01)
    assert ledger.state_dict() == before
    assert ledger.would_exceed(1.0, 0.01)


def test_ledger_state_round_trip(tmp_path):
    ledger = PrivacyLedger("rdp", budget=(10.0, 1e-5), sampling="fixed")
    with pytest.warns(UserWarning, match="fixed-size"):
        ledger.charge(1.1, 0.05, steps=7, server=(1.1, 1.0))
    ledger.charge(0.9, 1.0)
    state = json.loads(json.dumps(ledger.state_dict()))
    restored = PrivacyLedger("rdp", budget=(10.0, 1e-5))
    restored.load_state_dict(state)
    assert restored.history == ledger.history
    assert restored.server_history == ledger.server_history == [(1.1, 1.0, 7)]
    assert restored.server_clear_steps == 1  # the second charge gave the server the clear value
    assert restored.sampling == "fixed"
    assert restored.epsilon() == ledger.epsilon()
    assert restored.epsilon(against="server") == math.inf
    rebuilt = PrivacyLedger.from_state_dict(state)
    assert rebuilt.budget == ledger.budget and rebuilt.history == ledger.history
    assert rebuilt.epsilons() == ledger.epsilons()
    with pytest.raises(ValueError, match="accountant"):
        PrivacyLedger("prv").load_state_dict(state)
    # persisted after every charge, atomically
    path = tmp_path / "ledger.json"
    saved = PrivacyLedger(budget=(10.0, 1e-5), path=path)
    saved.charge(1.0, 0.1, steps=3)
    assert PrivacyLedger.load(path).history == [(1.0, 0.1, 3)]


# ------------------------------------------------------------------ noise sources
def test_secure_gaussian_refuses_a_seed_and_has_the_right_moments():
    with pytest.raises(InsecureParameterError, match="refuses a seed"):
        SecureGaussian(seed=1)
    draws = SecureGaussian().normal(2.0, (200, 500))
    assert draws.shape == (200, 500)
    assert abs(draws.mean()) < 0.03
    assert draws.std() == pytest.approx(2.0, rel=0.01)
    assert SecureGaussian().normal(1.0, 5).shape == (5,)
    assert not np.array_equal(SecureGaussian().normal(1.0, 8), SecureGaussian().normal(1.0, 8))


def test_release_rows_clips_and_charges_per_query():
    rng = np.random.default_rng(3)
    values = rng.normal(size=(6, 4)) * np.array([[0.01], [10], [0.5], [3], [0], [100]])
    noted = PrivacyLedger()
    out = release_rows(
        values, clip=1.0, sigma=1e-9, rng=SeededGaussian(np.random.default_rng(0)), ledger=noted
    )
    assert np.all(np.linalg.norm(out, axis=1) <= 1.0 + 1e-6)
    assert noted.history == [(1e-9, 1.0, 6)]
    ledger = PrivacyLedger()
    release_rows(values, clip=1.0, sigma=2.0, rng=np.random.default_rng(1), ledger=ledger)
    assert ledger.history == [(2.0, 1.0, 6)]  # six releases about the same user compose
    tight = PrivacyLedger(budget=(epsilon_for_schedule(2.0, 1.0, 6, 1e-5), 1e-5))
    release_rows(values, clip=1.0, sigma=2.0, rng=np.random.default_rng(1), ledger=tight)
    with pytest.raises(PrivacyBudgetExceeded):
        release_rows(values[:1], clip=1.0, sigma=2.0, rng=np.random.default_rng(1), ledger=tight)
    assert tight.steps == 6


# ------------------------------------------------------------------ clipping
def _random_batch(rng, clients, n_rows=30, width=4, weights=None):
    counts = rng.integers(0, 6, size=len(clients))
    counts[0] = 0  # an empty client
    rows = np.concatenate([rng.choice(n_rows, c, replace=False) for c in counts]).astype(int)
    values = rng.normal(size=(len(rows), width)) * rng.uniform(0.1, 5, size=(len(rows), 1))
    indptr = np.concatenate([[0], np.cumsum(counts)])
    return RowUpdates(np.asarray(clients), indptr, rows, values, n_rows, weights=weights)


def test_per_client_clipping_norms():
    rng = np.random.default_rng(11)
    batch = _random_batch(rng, list(range(12)))
    expected = np.array([np.linalg.norm(batch.client_block(k)) for k in range(12)])
    np.testing.assert_allclose(segment_norms(batch.values, batch.indptr), expected)
    clipped, norms = clip_row_updates(batch, 2.0)
    np.testing.assert_allclose(norms, expected)
    after = np.array([np.linalg.norm(clipped.client_block(k)) for k in range(12)])
    np.testing.assert_allclose(after, np.minimum(expected, 2.0), rtol=1e-12)
    small = expected <= 2.0
    for k in np.flatnonzero(small):
        np.testing.assert_array_equal(clipped.client_block(k), batch.client_block(k))
    dense = densify(clipped)
    assert dense.dense and len(dense.rows) == 12 * 30
    for k in range(12):
        np.testing.assert_array_equal(dense.client_block(k), clipped.client_block(k))


# ------------------------------------------------------------------ DPTransport
def _dp(placement, *, sigma=1.5, clip=0.5, ledger=None, **kwargs):
    inner = PlaintextTransport(keep_payloads=ALL_PAYLOADS)
    return DPTransport(
        inner, clip=clip, noise_multiplier=sigma, placement=placement, ledger=ledger, **kwargs
    )


def test_central_noise_std_and_inner_sees_clipped_unnoised_updates():
    ledger = PrivacyLedger(budget=(50.0, 1e-5))
    dp = _dp("central", ledger=ledger, sample_rate=0.1, sampling="poisson")
    assert dp.view is dp.inner.view and dp.view.public["transport"] == "plaintext+dp"
    rng = np.random.default_rng(0)
    batch = _random_batch(rng, list(range(8)), n_rows=100, width=100)
    rnd = dp.open_round(0, range(8), shape=(100, 100), seeds=SeedTree(5))
    rnd.submit_batch(batch)
    clipped, _ = clip_row_updates(batch, 0.5)
    for k, client in enumerate(clipped.clients.tolist()):
        np.testing.assert_allclose(rnd.view.payload(client)["values"], clipped.client_rows(k)[1])
    result = rnd.result()
    clean = clipped.weighted_sum()
    np.testing.assert_allclose(rnd.view.aggregate["total"], clean)  # the server's own sum
    noise = result.total - clean
    assert noise.std() == pytest.approx(1.5 * 0.5, rel=0.03)
    assert abs(noise.mean()) < 0.03
    assert ledger.history == [(1.5, 0.1, 1)]
    public = rnd.view.public
    assert public["dp_clip"] == 0.5 and public["dp_sigma"] == 1.5
    assert public["dp_placement"] == "central"
    assert public["epsilon"] == pytest.approx(ledger.epsilon())
    assert dp.view.public["epsilon"] == pytest.approx(ledger.epsilon())


def test_local_noise_on_every_coordinate_with_the_right_std():
    ledger = PrivacyLedger()
    dp = _dp("local", ledger=ledger, delta=1e-5)
    clients = list(range(40))
    batch = _random_batch(np.random.default_rng(1), clients, n_rows=50, width=10)
    seeds = SeedTree(9)
    rnd = dp.open_round(3, clients, shape=(50, 10), seeds=seeds)
    assert ledger.history == [(1.5, 1.0, 1)]  # charged at open, rate 1 for local
    rnd.submit_batch(batch)
    clipped, _ = clip_row_updates(batch, 0.5)
    noises = []
    for k, client in enumerate(clients):
        payload = rnd.view.payload(client)
        assert payload["values"].shape == (50, 10)  # densified: every row sent
        assert np.all(payload["values"] != 0)
        noise = payload["values"] - clipped.client_block(k)
        expected = seeds.generator("dp", 3, client).normal(0.0, 0.75, size=(50, 10))
        np.testing.assert_allclose(noise, expected)
        noises.append(noise)
    assert np.std(noises) == pytest.approx(0.75, rel=0.02)
    total = rnd.result().total
    np.testing.assert_allclose(total, clipped.weighted_sum() + np.sum(noises, axis=0))
    assert ledger.steps == 1


def test_distributed_noise_share_and_effective_sigma():
    ledger = PrivacyLedger()
    with pytest.warns(UserWarning, match="distributed DP over the 'plaintext'"):
        dp = _dp("distributed", ledger=ledger, sample_rate=0.5, delta=1e-5)
    n = 25
    zeros = RowUpdates(np.arange(n), np.zeros(n + 1, int), np.zeros(0, int), np.zeros((0, 40)), 100)
    rnd = dp.open_round(0, range(n), shape=(100, 40), seeds=SeedTree(2))
    rnd.submit_batch(zeros)
    shares = np.stack([rnd.view.payload(c)["values"] for c in range(n)])
    assert np.all(shares != 0)
    assert shares.std() == pytest.approx(1.5 * 0.5 / math.sqrt(n), rel=0.03)
    assert rnd.result().total.std() == pytest.approx(0.75, rel=0.05)
    assert ledger.history == [(1.5, 0.5, 1)]
    # a dropout: the sum carries less noise and the ledger is charged for what it carries
    rnd = dp.open_round(1, range(n), shape=(100, 40), seeds=SeedTree(2))
    rnd.drop(0)
    rest = RowUpdates(np.arange(1, n), np.zeros(n, int), np.zeros(0, int), np.zeros((0, 40)), 100)
    rnd.submit_batch(rest)
    rnd.result()
    sigma_eff, q, steps = ledger.history[-1]
    assert sigma_eff == pytest.approx(1.5 * math.sqrt((n - 1) / n)) and q == 0.5 and steps == 1
    assert rnd.view.public["dp_sigma_effective"] == pytest.approx(sigma_eff)


def test_distributed_dp_over_secure_aggregation():
    from securefed.transport.secagg import SecAggConfig, SecAggTransport

    ledger = PrivacyLedger(budget=(8.0, 1e-5), sampling="poisson")
    inner = SecAggTransport(SecAggConfig(clip=8.0, neighbours=6))  # room for the noisy values
    dp = DPTransport(
        inner,
        clip=1.0,
        noise_multiplier=1.0,
        placement="distributed",
        ledger=ledger,
        sample_rate=0.05,
    )  # no warning: the server sees only masked shares
    n = 12
    zeros = RowUpdates(np.arange(n), np.zeros(n + 1, int), np.zeros(0, int), np.zeros((0, 20)), 100)
    rnd = dp.open_round(0, range(n), shape=(100, 20), seeds=SeedTree(1))
    rnd.submit_batch(zeros)
    assert rnd.result().total.std() == pytest.approx(1.0, rel=0.06)
    assert ledger.history == [(1.0, 0.05, 1)]
    assert dp.view.public["transport"] == "secagg+dp" and dp.view.public["clip"] == 8.0


def test_weights_above_one_are_refused_and_weights_scale_the_distributed_charge():
    ledger = PrivacyLedger()
    with pytest.warns(UserWarning):
        dp = _dp("distributed", ledger=ledger)
    rnd = dp.open_round(0, [0, 1], shape=(1, 3), seeds=SeedTree(0))
    with pytest.raises(InsecureParameterError, match="weight 2 > 1"):
        rnd.submit(0, np.ones(3), weight=2.0)
    assert rnd.submitted == set()
    rnd.submit(0, np.ones(3), weight=0.5)
    rnd.submit(1, np.ones(3), weight=1.0)
    agg = rnd.result()
    assert agg.weight == 1.5
    assert ledger.history[-1][0] == pytest.approx(1.5 * math.sqrt((0.25 + 1.0) / 2))


def test_budget_stops_the_round_before_it_opens():
    ledger = PrivacyLedger(budget=(epsilon_for_schedule(1.5, 0.2, 2, 1e-5), 1e-5))
    dp = _dp("central", ledger=ledger, sample_rate=0.2)
    for round_id in range(2):
        rnd = dp.open_round(round_id, [0, 1], shape=(2, 2), seeds=SeedTree(1))
        rnd.submit(0, np.ones(4))
        rnd.result()
    with pytest.raises(PrivacyBudgetExceeded, match="budget"):
        dp.open_round(2, [0, 1], shape=(2, 2), seeds=SeedTree(1))
    assert len(dp.view) == 2 and ledger.steps == 2


def test_secure_mode_refuses_a_seed_and_draws_secure_noise():
    dp = _dp("local", secure=True)
    with pytest.raises(InsecureParameterError, match="seeded"):
        dp.open_round(0, [0, 1], shape=(1, 4), seeds=SeedTree(0))
    assert len(dp.view) == 0
    rnd = dp.open_round(0, range(30), shape=(100, 10), seeds=SeedTree.secure_mode())
    for client in range(30):
        rnd.submit(client, np.zeros(1000))
    values = np.stack([rnd.view.payload(c)["values"] for c in range(30)])
    assert values.std() == pytest.approx(0.75, rel=0.02)
    assert rnd.view.public["dp_noise"] == "chacha20-box-muller"
    assert dp.view.public["secure"] is True and dp.view.public["seeded"] is False


def test_seeded_runs_repeat_and_configuration_is_validated():
    def run():
        dp = _dp("central")
        rnd = dp.open_round(0, [0, 1], shape=(3, 2), seeds=SeedTree(4))
        rnd.submit(0, np.arange(6.0))
        return rnd.result().total

    np.testing.assert_array_equal(run(), run())
    with pytest.raises(InsecureParameterError, match="sampling 'all'"):
        _dp("central", sample_rate=0.1, sampling="all")
    with pytest.warns(UserWarning, match="fixed-size"):
        _dp("central", sample_rate=0.1, sampling="fixed")
    with pytest.raises(ValueError, match="placement"):
        _dp("everywhere")
    with pytest.raises(ValueError, match="noise_multiplier"):
        _dp("central", sigma=0.0)


# ------------------------------------------------------------------ DP-SGD
@pytest.mark.filterwarnings("ignore:Secure RNG turned off", "ignore:Full backward hook")
def test_dpsgd_make_private_trains_and_reports():
    torch = pytest.importorskip("torch")
    from securefed.privacy.dpsgd import make_private

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, 5, generator=generator)
    y = (x[:, 0] > 0).long()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
    model = torch.nn.Linear(5, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    private = make_private(
        model, optimizer, loader, noise_multiplier=1.1, max_grad_norm=1.0, seeds=SeedTree(0)
    )
    loss_fn = torch.nn.CrossEntropyLoss()
    for xb, yb in private.data_loader:
        if len(xb) == 0:
            continue
        private.optimizer.zero_grad()
        loss_fn(private.module(xb), yb).backward()
        private.optimizer.step()
    report = private.report(1e-5)
    assert report.steps >= 1 and report.sample_rate == pytest.approx(0.25)
    assert report.epsilon == pytest.approx(
        epsilon_for_schedule(1.1, 0.25, report.steps, 1e-5), rel=1e-9
    )
    assert private.ledger().history == list(report.history)
    assert json.loads(json.dumps(report.to_dict()))["sampling"] == "poisson"
    with pytest.raises(InsecureParameterError):
        make_private(
            model,
            optimizer,
            loader,
            noise_multiplier=1.0,
            max_grad_norm=1.0,
            secure_mode=True,
            seeds=SeedTree(0),
        )


# ------------------------------------------------------------------ CLI
def _cli():
    from securefed.bench import cli_privacy

    return cli_privacy


def test_cli_epsilon_and_noise(capsys):
    cli = _cli()
    argv = ["privacy", "epsilon", "--noise-multiplier", "1.0", "--sample-rate", "0.01"]
    argv += ["--rounds", "1000", "--delta", "1e-5"]
    assert cli.main(argv) == 0
    assert "epsilon = 2.1014" in capsys.readouterr().out
    assert cli.main([*argv, "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["epsilon"] == pytest.approx(2.1014, abs=1e-3)
    assert record["sampling"] == "poisson"
    noise = ["privacy", "noise", "--epsilon", "8", "--delta", "1e-5", "--sample-rate", "0.01"]
    assert cli.main([*noise, "--rounds", "1000", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["noise_multiplier"] == pytest.approx(0.6158, abs=1e-3)
    assert record["epsilon"] <= 8
    assert cli.main([*noise, "--rounds", "0"]) == 2
    assert "rounds" in capsys.readouterr().err
