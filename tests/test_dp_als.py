"""DP-ALS (securefed.recsys.dp_als): correctness, sensitivity, accounting, refusals, the leak."""

from __future__ import annotations

import argparse
import math
from dataclasses import replace

import numpy as np
import pytest

from securefed.attacks.als_sums import score_als_view
from securefed.bench.dp_als_experiment import (
    DPALSRun,
    als_config_from_args,
    refuse_fedmf_options,
    run_dp_als,
)
from securefed.randomness import SeedTree
from securefed.recsys.baselines import damped_baseline
from securefed.recsys.data import Split, synthetic_ratings
from securefed.recsys.dp_als import (
    DPALS,
    DPALSConfig,
    bias_sensitivity,
    pack_outer,
    pass_sensitivity,
    private_bias_config,
    unpack_symmetric,
)
from securefed.runtime import ClientSampling, RunOptions, run_rounds
from securefed.transport import build_transport
from securefed.views import RoundSelection

# Exact config: no clipping active (huge clips), every rating in every sum, every item trained.
EXACT = DPALSConfig(
    dim=3,
    passes=4,
    reg_user=2.0,
    reg_item=2.0,
    user_clip=1e6,
    rating_clip=1e6,
    bias_clip=1e6,
    max_ratings=10_000,
    max_bias_ratings=10_000,
    min_count=0.0,
    weighting="uniform",
)


@pytest.fixture(scope="module")
def ratings():
    return synthetic_ratings(60, 40, 900, rank=3, noise=0.3, seed=3)


def _train(ratings, config, spec="plaintext", options=None, seed=0, keep=None):
    transport = build_transport(
        spec,
        options,
        total_rounds=config.releases,
        n_clients=ratings.n_users,
        keep_payloads=keep or RoundSelection.parse("none"),
    )
    model = DPALS(ratings, config, SeedTree(seed))
    run_rounds(model, transport, SeedTree(seed), RunOptions(config.releases, progress=False))
    return model, transport


def _centralised_als(ratings, config, seed=0):
    """Textbook ALS on the damped-bias residuals, one user and one item at a time."""
    base = damped_baseline(ratings, item_damping=config.item_damping, user_damping=0.0)
    mean, item_bias = base.mean, base.item_bias
    users, items, r = ratings.users, ratings.items, ratings.ratings
    user_bias = np.array(
        [
            np.sum(r[users == u] - mean - item_bias[items[users == u]])
            / (np.sum(users == u) + config.user_damping)
            for u in range(ratings.n_users)
        ]
    )
    residual = r - mean - user_bias[users] - item_bias[items]
    V = SeedTree(seed).generator("init", "items").normal(0, config.init_std, (ratings.n_items, 3))
    U = np.zeros((ratings.n_users, 3))
    eye = np.eye(3)

    def users_step():
        for u in range(ratings.n_users):
            at = users == u
            Vu = V[items[at]]
            U[u] = np.linalg.solve(Vu.T @ Vu + config.reg_user * eye, Vu.T @ residual[at])

    for _ in range(config.passes):
        users_step()
        for i in range(ratings.n_items):
            at = items == i
            Ui = U[users[at]]
            V[i] = np.linalg.solve(Ui.T @ Ui + config.reg_item * eye, Ui.T @ residual[at])
    users_step()
    return lambda us, its: ratings.scale.clip(
        mean + user_bias[us] + item_bias[its] + np.einsum("ni,ni->n", U[us], V[its])
    )


def test_plaintext_dp_als_is_centralised_als(ratings):
    # With no clip active and every rating summed, the federated closed forms are ALS itself.
    model, _ = _train(ratings, EXACT)
    reference = _centralised_als(ratings, EXACT)
    users, items = ratings.users, ratings.items
    # Both solve the same small systems in float64; differences are rounding only.
    np.testing.assert_allclose(
        model.predict(users, items), reference(users, items), rtol=0, atol=1e-8
    )
    bias_only = damped_baseline(ratings, item_damping=EXACT.item_damping)
    error = np.sqrt(np.mean((model.predict(users, items) - ratings.ratings) ** 2))
    bias_error = np.sqrt(np.mean((bias_only.predict(users, items) - ratings.ratings) ** 2))
    assert error < bias_error - 0.05  # the factors learn the low-rank part


def test_private_bias_model_in_plaintext_is_the_damped_baseline(ratings):
    config = private_bias_config(
        bias_clip=1e6, max_bias_ratings=10_000, weighting="uniform", item_damping=25.0
    )
    model, _ = _train(ratings, config)
    reference = damped_baseline(ratings, item_damping=25.0, user_damping=10.0)
    np.testing.assert_allclose(
        model.predict(ratings.users, ratings.items),
        reference.predict(ratings.users, ratings.items),
        rtol=0,
        atol=1e-10,
    )


def _bounded_without_choice(ratings, passes):
    """Real clips, and k = the largest count: no choice by (rounded) released counts."""
    most = int(np.bincount(ratings.users).max())
    return replace(
        EXACT,
        passes=passes,
        user_clip=1.0,
        rating_clip=2.0,
        max_ratings=most,
        bias_clip=2.0,
        max_bias_ratings=most,
    )


def test_secagg_equals_plaintext_to_fixed_point_error(ratings):
    config = _bounded_without_choice(ratings, passes=2)
    plain, _ = _train(ratings, config)
    masked, _ = _train(ratings, config, "secagg")
    # secagg rounds each normalised entry to 2^-20: a sum of n = 60 uploads is off by at most
    # n 2^-21 = 3e-5, times the bound S = sqrt(k) * 2.24 (about 17) in rating units: 5e-4 per
    # entry of A_i, b_i, the bias sums and counts. The ridge solves (ridge >= 2) and the damped
    # means (damping 60) pass that on shrunk; 2e-3 leaves room for two passes' compounding.
    np.testing.assert_allclose(plain.item_bias, masked.item_bias, atol=2e-3)
    np.testing.assert_allclose(
        plain.predict(ratings.users, ratings.items),
        masked.predict(ratings.users, ratings.items),
        atol=2e-3,
    )
    # ...and they are not equal by accident: a different seed's plaintext run differs more.
    other, _ = _train(ratings, config, seed=5)
    assert (
        np.max(
            np.abs(
                other.predict(ratings.users, ratings.items)
                - plain.predict(ratings.users, ratings.items)
            )
        )
        > 1e-2
    )
    assert masked.noise_std == [0.0] * config.releases  # no noise in the probe column


@pytest.mark.parametrize(
    ("weighting", "bias_share"), [("uniform", 0.0), ("per_user", 0.0), ("per_user", 0.4)]
)
def test_worst_case_user_meets_the_sensitivity_bound_exactly(weighting, bias_share):
    cfg = DPALSConfig(
        dim=4,
        passes=1,
        user_clip=0.7,
        rating_clip=1.5,
        max_ratings=5,
        max_bias_ratings=6,
        weighting=weighting,
        bias_share=bias_share,
    )
    # Worst case: u along an axis at the clip, every residual at +-G, at least k ratings.
    u = np.zeros(4)
    u[2] = 5.0  # clipped to 0.7 by the device
    packed = pack_outer(np.array([u * 0.7 / 5.0]))[0]
    row = np.concatenate([packed, 1.5 * u * 0.7 / 5.0, [0.0]])
    worst = math.sqrt(cfg.max_ratings) * np.linalg.norm(row)
    assert worst == pytest.approx(pass_sensitivity(cfg), rel=1e-12)
    paper = math.sqrt(cfg.max_ratings) * (0.7**2 + 1.5 * 0.7)
    assert pass_sensitivity(cfg) <= paper
    # A random direction packs to less than |u|^2 (the off-diagonal entries appear once).
    v = np.random.default_rng(0).normal(size=4)
    assert np.linalg.norm(pack_outer(v[None])[0]) < np.linalg.norm(v) ** 2
    # The model's uploads: a population that includes that user; every norm <= 1.
    from securefed.recsys.data import ML100K_SCALE, Ratings

    n_items = 12
    users = np.repeat([0, 1], n_items)
    items = np.tile(np.arange(n_items), 2)
    values = np.where(np.arange(2 * n_items) % 2, 5.0, 1.0)
    train = Ratings(
        users,
        items,
        values,
        None,
        2,
        n_items,
        ML100K_SCALE,
        np.arange(2),
        np.arange(n_items),
    )
    model = DPALS(train, cfg, SeedTree(0))
    model.U = np.array([u, [0.1, 0.2, 0.3, 0.1]])
    model.residuals = lambda: np.where(np.arange(2 * n_items) % 2, 9.0, -9.0)  # beyond G
    for uploads, bound in ((model.pass_uploads(), 1.0), (model.bias_uploads(SeedTree(0)), 1.0)):
        norms = [np.linalg.norm(uploads.client_rows(k)[1]) for k in range(2)]
        assert max(norms) <= bound + 1e-12
        assert norms[0] == pytest.approx(1.0, rel=1e-12)  # the worst case reaches it
    assert bias_sensitivity(cfg) == pytest.approx(math.sqrt(6 * (1.5**2 + 1)))


def test_pack_and_unpack_are_inverse():
    vectors = np.random.default_rng(1).normal(size=(5, 4))
    outer = unpack_symmetric(pack_outer(vectors), 4)
    np.testing.assert_allclose(outer, np.einsum("ni,nj->nij", vectors, vectors), atol=1e-15)


def _gaussian_epsilon(sigma: float, releases: int, delta: float) -> float:
    """Gaussian mechanism composed ``releases`` times (RDP alpha T / (2 sigma^2)), converted
    with Balle et al. 2020's bound over a fine grid of orders: written here, not Opacus's."""
    alphas = np.linspace(1.01, 400, 200_000)
    rdp = releases * alphas / (2 * sigma**2)
    eps = rdp + np.log((alphas - 1) / alphas) - (np.log(delta) + np.log(alphas)) / (alphas - 1)
    return float(eps.min())


def test_central_dp_ledger_matches_an_independent_composition(ratings):
    config = replace(
        EXACT,
        passes=3,
        user_clip=1.0,
        rating_clip=2.0,
        max_ratings=8,
        bias_clip=2.0,
        max_bias_ratings=8,
    )
    _, transport = _train(ratings, config, "dp", {"dp.epsilon": 4.0, "dp.delta": 1e-5})
    sigma = transport.config.noise_multiplier
    independent = _gaussian_epsilon(sigma, config.releases, 1e-5)
    # Opacus's orders are a coarser grid than ours: its epsilon is at or above ours, close.
    assert independent <= transport.epsilon() <= independent * 1.03
    assert transport.epsilon() <= 4.0 * 1.0001
    assert math.isinf(transport.epsilon(against="server"))  # central: the server sees the sums


def test_secagg_dp_ledger_charges_every_release_against_the_server(ratings):
    config = replace(
        EXACT,
        passes=2,
        user_clip=1.0,
        rating_clip=2.0,
        max_ratings=8,
        bias_clip=2.0,
        max_bias_ratings=8,
    )
    model, transport = _train(ratings, config, "secagg+dp", {"dp.epsilon": 6.0})
    ledger = transport.ledger
    assert transport.epsilon(against="server") <= 6.0 * 1.0001
    assert transport.epsilon(against="server") > 0.9 * 6.0  # the calibration spends it
    # Independent check: the discrete Gaussian's epsilon is at least the continuous Gaussian's
    # at the effective multiplier each release reports (Kairouz et al. 2021, Thm 1's bound
    # adds a small penalty for the discreteness), and close to it.
    sigmas = [r.public["dp_sigma_effective"] for r in transport.view]
    assert len(sigmas) == config.releases
    continuous = _gaussian_epsilon(float(np.mean(sigmas)), config.releases, transport.delta)
    assert continuous * 0.999 <= transport.epsilon(against="server") <= continuous * 1.1
    # The probe column measures noise of the size the release reports (in block units).
    assert all(s > 0 for s in model.noise_std)
    assert ledger is not None


def test_refusals_name_the_cause(ratings):
    with pytest.raises(ValueError, match="weighting"):
        DPALSConfig(weighting="count")
    with pytest.raises(ValueError, match="passes"):
        DPALSConfig(passes=-1)
    with pytest.raises(ValueError, match="user_clip"):
        DPALSConfig(user_clip=0.0)
    model = DPALS(ratings, EXACT, SeedTree(0))
    transport = build_transport("plaintext", total_rounds=EXACT.releases)
    with pytest.raises(ValueError, match="ClientSampling"):
        run_rounds(
            model,
            transport,
            SeedTree(0),
            RunOptions(EXACT.releases, sampling=ClientSampling("fixed", 10), progress=False),
        )
    args = argparse.Namespace(lr=0.1, rounds=None, clip=1.0)
    with pytest.raises(ValueError, match="--lr, --clip"):
        refuse_fedmf_options(args)
    with pytest.raises(ValueError, match="KEY=VALUE"):
        als_config_from_args(None, ["nonsense=3"])
    assert als_config_from_args(2, ["passes=4", "reg_item=3.5"]) == DPALSConfig(
        dim=2, passes=4, reg_item=3.5
    )


def test_cli_refuses_fedmf_options_with_variant_als(capsys):
    from securefed.bench.cli import main

    assert main(["fedmf", "--variant", "als", "--lr", "0.1"]) == 2
    assert "--lr configure(s) gradient FedMF" in capsys.readouterr().err
    assert main(["fedmf", "--als-option", "passes=2", "--rounds", "1"]) == 2
    assert "--als-option applies only with --variant als" in capsys.readouterr().err


def _split(ratings):
    return Split(ratings, ratings.subset(np.arange(50)), name="synthetic")


@pytest.mark.parametrize(
    ("spec", "options", "leaks"),
    [
        ("plaintext", None, True),
        ("dp", {"dp.epsilon": 4.0}, True),  # central: the server reads the clipped uploads
        ("secagg", None, False),
        ("secagg+dp", {"dp.epsilon": 4.0}, False),
    ],
)
def test_attack_on_the_server_view(ratings, spec, options, leaks):
    config = replace(DPALSConfig(), max_bias_ratings=10, max_ratings=10)
    _, transport = _train(ratings, config, spec, options, keep=RoundSelection.parse("all"))
    scores = score_als_view(transport.view, ratings)
    if leaks:
        # Every user's payload is read; the bias release gives each of its (at most 10)
        # released ratings exactly (|r - 3| <= 1.5 except 5s and 1s, clipped to 4.5 and 1.5).
        assert scores["readable"] == 1.0
        assert scores["precision"] == 1.0
        assert scores["exact_share"] > scores["chance_exact_share"] + 0.2
    else:
        assert scores["readable"] == 0.0
        assert scores["exact_share"] == pytest.approx(scores["chance_exact_share"])
        assert scores["precision"] == pytest.approx(scores["popular_precision"])


def test_run_record_carries_both_epsilons(ratings):
    record, _, _ = run_dp_als(
        _split(ratings),
        DPALSRun(
            config=DPALSConfig(),
            transport="secagg+dp",
            transport_options={"dp.epsilon": 8.0},
            seed=0,
        ),
    )
    assert record["epsilon"] <= 8.0 * 1.0001 and record["epsilon_server"] <= 8.0 * 1.0001
    assert record["variant"] == "als" and record["rounds"] == DPALSConfig().releases
    assert np.isfinite(record["rmse"])


def test_population_keeps_the_count_distribution_and_is_seeded(ratings):
    from securefed.recsys.population import draw_population, fit_population

    model = fit_population(ratings, rank=2, sweeps=3)
    first = draw_population(model, 500, seed=1)
    again = draw_population(model, 500, seed=1)
    np.testing.assert_array_equal(first.ratings, again.ratings)
    np.testing.assert_array_equal(first.items, again.items)
    counts = np.bincount(first.users, minlength=500)
    # Counts are drawn from the fitted users' counts: same support, similar mean.
    assert set(np.unique(counts)) <= set(np.unique(model.counts))
    assert abs(counts.mean() - model.counts.mean()) < 0.2 * model.counts.mean()
    assert len(np.unique(first.users * ratings.n_items + first.items)) == len(first)
    assert draw_population(model, 500, seed=2).ratings.tolist() != first.ratings.tolist()


def test_ckks_aggregation_equals_plaintext_within_its_error(ratings):
    pytest.importorskip("tenseal")
    config = _bounded_without_choice(ratings, passes=1)
    plain, _ = _train(ratings, config)
    encrypted, transport = _train(ratings, config, "ckks")
    # CKKS sums approximately (encoding error plus the flooding of each decryption, docs/ckks.md,
    # far below 1e-4 per normalised entry at its default scale); the 2e-3 of the secagg test
    # covers it after the rescaling by S and the solves.
    np.testing.assert_allclose(
        plain.predict(ratings.users, ratings.items),
        encrypted.predict(ratings.users, ratings.items),
        atol=2e-3,
    )
    assert not any(r.payloads for r in transport.view)  # nothing per user kept by default
