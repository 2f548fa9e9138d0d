"""FedMF over a population generated on demand: the same round as over stored ratings, in memory
that does not grow with the users who never take part (issue 32, ``securefed bench scale``)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from securefed import PlaintextTransport, SeedTree
from securefed.recsys.data import synthetic_ratings
from securefed.recsys.fedmf import FedMF, FedMFConfig
from securefed.recsys.population import OnDemandPopulation, fit_population
from securefed.recsys.user_state import LazyRows, keyed_normals

MODEL = fit_population(synthetic_ratings(80, 60, 1500, seed=3), rank=3, sweeps=3)


def resident_bytes() -> int:
    """This process's resident set size now (Linux /proc)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_user_s_ratings_do_not_depend_on_who_else_is_drawn():
    population = OnDemandPopulation(MODEL, 10_000, seed=5, chunk=7)
    users = np.array([3, 17, 4000, 9999, 5000])
    indptr, items, ratings = population.rows(users)
    for k, user in enumerate(users):
        alone = population.rows(np.array([user]))
        assert np.array_equal(alone[1], items[indptr[k] : indptr[k + 1]])
        assert np.array_equal(alone[2], ratings[indptr[k] : indptr[k + 1]])
        assert np.all(np.diff(alone[1]) > 0)  # sorted, no item twice
    assert np.array_equal(np.diff(indptr), population.counts(users))
    other = OnDemandPopulation(MODEL, 10_000, seed=6).rows(users)
    assert not np.array_equal(other[1], items)


def test_on_demand_population_follows_the_fitted_law():
    population = OnDemandPopulation(MODEL, 4000, seed=0)
    ratings = population.materialise()
    # Counts are resampled from the fitted users' counts: the means agree within a few
    # standard errors of 4000 draws.
    spread = MODEL.counts.std() / np.sqrt(4000)
    assert abs(np.diff(ratings.to_csr().indptr).mean() - MODEL.counts.mean()) < 4 * spread
    popular = np.argsort(-MODEL.popularity)[:5]
    rare = np.argsort(MODEL.popularity)[:5]
    seen = np.bincount(ratings.items, minlength=ratings.n_items)
    assert seen[popular].sum() > seen[rare].sum()
    assert np.all(np.isin(ratings.ratings, np.arange(1, 6)))


def test_lazy_rows_are_keyed_by_id_and_round_trip():
    rows = LazyRows(1000, (3,), lambda ids: keyed_normals(9, ids[:, None] * 3 + np.arange(3)))
    first = rows[np.array([5, 700, 2])]
    assert np.array_equal(rows[np.array([2, 5])], first[[2, 0]])
    rows[np.array([700])] = np.ones((1, 3))
    ids, values = rows.state()
    assert ids.tolist() == [2, 5, 700]
    again = LazyRows(1000, (3,), lambda ids: keyed_normals(9, ids[:, None] * 3 + np.arange(3)))
    again.load(ids, values)
    assert np.array_equal(again[ids], values) and np.array_equal(again[np.array([5])], first[:1])


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"variant": "fedrec"},
        {"offset": "user_mean", "biases": True, "server_optimiser": "adam"},
        {"item_blocks": 3},
    ],
    ids=["fedmf", "fedrec", "biases", "blocks"],
)
def test_a_round_over_the_population_equals_the_round_over_its_stored_ratings(options):
    population = OnDemandPopulation(MODEL, 300, seed=1)
    config = FedMFConfig(**options)
    stored = FedMF(population.materialise(), config, SeedTree(0))
    lazy = FedMF(population, config, SeedTree(0))
    everyone = np.arange(300)
    lazy.U[everyone] = stored.U  # the same start (the two modes draw it differently)
    for round_id in range(3):
        clients = np.sort(np.random.default_rng(round_id).choice(300, 40, replace=False))
        seeds = SeedTree(0)
        stored.run_round(round_id, clients, PlaintextTransport(), seeds)
        lazy.run_round(round_id, clients, PlaintextTransport(), seeds)
    assert np.array_equal(lazy.V, stored.V)
    assert np.array_equal(lazy.U[everyone], stored.U)
    assert np.array_equal(lazy.user_bias[everyone], stored.user_bias)
    some = np.array([0, 7, 7, 299])
    assert np.allclose(
        lazy.predict(some, np.array([1, 2, 3, 4])), stored.predict(some, [1, 2, 3, 4])
    )


def test_checkpoint_of_the_population_continues_the_same_run():
    population = OnDemandPopulation(MODEL, 500, seed=2)
    config = FedMFConfig(server_optimiser="adam")
    model = FedMF(population, config, SeedTree(0))
    clients = np.arange(0, 500, 7)
    model.run_round(0, clients, PlaintextTransport(), SeedTree(0))
    state = {k: np.array(v) for k, v in model.state_dict().items()}
    model.run_round(1, clients, PlaintextTransport(), SeedTree(0))
    resumed = FedMF(population, config, SeedTree(0))
    resumed.load_state_dict(state)
    resumed.run_round(1, clients, PlaintextTransport(), SeedTree(0))
    assert np.array_equal(resumed.V, model.V)
    assert np.array_equal(resumed.U[clients], model.U[clients])


@pytest.mark.parametrize(
    ("options", "cause"),
    [
        ({"variant": "fedrec+"}, "stable"),
        ({"biases": True}, "global-mean round"),
    ],
)
def test_options_that_need_every_user_are_refused(options, cause):
    with pytest.raises(ValueError, match=cause):
        FedMF(OnDemandPopulation(MODEL, 100, seed=0), FedMFConfig(**options), SeedTree(0))


def test_users_outside_the_rounds_cost_no_memory():
    before = resident_bytes()
    # A million users at dim 50: stored vectors alone would be 400 MB.
    model = FedMF(OnDemandPopulation(MODEL, 10**6, seed=0), FedMFConfig(dim=50), SeedTree(0))
    clients = np.sort(np.random.default_rng(0).choice(10**6, 500, replace=False))
    model.run_round(0, clients, PlaintextTransport(), SeedTree(0))
    # 500 users touch at most 500 pages of each state array (4 KiB each), plus the round's
    # temporaries: far below 100 MB, which a stored (10^6, 50) array would pass four times.
    assert resident_bytes() - before < 100 * 2**20
