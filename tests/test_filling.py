"""Pseudo items and virtual ratings (securefed.recsys.filling) and client weights
(securefed.recsys.weights)."""

from __future__ import annotations

import numpy as np
import pytest

from securefed.recsys.filling import (
    most_similar_unrated,
    pseudo_counts,
    sample_unrated,
    similarity_weighted_ratings,
)
from securefed.recsys.sparse_rows import merge_sorted, row_ids
from securefed.recsys.weights import client_weights, diagonal_w2_squared


def _rated(n_users=60, n_items=40, seed=0):
    rng = np.random.default_rng(seed)
    per_user = [
        np.sort(rng.choice(n_items, rng.integers(1, 30), replace=False)) for _ in range(n_users)
    ]
    indptr = np.concatenate([[0], np.cumsum([len(p) for p in per_user])])
    return indptr, np.concatenate(per_user), n_items


@pytest.mark.parametrize("rho", [0.5, 1.0, 3.0])
def test_sample_unrated_draws_distinct_unrated_items(rho):
    indptr, items, n_items = _rated()
    counts = pseudo_counts(np.diff(indptr), n_items, rho)
    pseudo_indptr, pseudo = sample_unrated(indptr, items, n_items, counts, np.random.default_rng(1))
    assert np.array_equal(np.diff(pseudo_indptr), counts)
    for u in range(len(counts)):
        mine = pseudo[pseudo_indptr[u] : pseudo_indptr[u + 1]]
        assert len(np.unique(mine)) == len(mine)
        assert not np.intersect1d(mine, items[indptr[u] : indptr[u + 1]]).size


def test_sample_unrated_is_uniform_over_unrated_items():
    indptr, items, n_items = _rated(n_users=1, seed=4)
    unrated = np.setdiff1d(np.arange(n_items), items)
    frequency = np.zeros(n_items)
    for seed in range(3000):
        _, pseudo = sample_unrated(
            indptr, items, n_items, np.array([3]), np.random.default_rng(seed)
        )
        frequency[pseudo] += 1
    expected = frequency[unrated].mean()
    chi2 = ((frequency[unrated] - expected) ** 2 / expected).sum()
    assert chi2 < len(unrated) + 4 * np.sqrt(2 * len(unrated))  # ~4 sigma of chi2(dof)


def test_pseudo_counts_pad_and_cap():
    assert pseudo_counts(np.array([2, 10, 39]), 40, 1.0, minimum_rows=6).tolist() == [4, 10, 1]


def test_most_similar_unrated_picks_the_closest_items():
    features = np.array([[1.0, 0], [0.9, 0.1], [0, 1.0], [-1.0, 0], [0.8, 0.2]])
    indptr, items = np.array([0, 1]), np.array([0])
    _, pseudo = most_similar_unrated(indptr, items, features, np.array([2]))
    assert pseudo.tolist() == [1, 4]


def test_similarity_weighted_ratings_match_a_direct_sum():
    rng = np.random.default_rng(0)
    features = rng.normal(size=(8, 3))
    indptr, items, ratings = np.array([0, 3]), np.array([0, 2, 5]), np.array([1.0, 4.0, 5.0])
    pseudo_indptr, pseudo = np.array([0, 2]), np.array([1, 7])
    got = similarity_weighted_ratings(indptr, items, ratings, pseudo_indptr, pseudo, features)
    unit = features / np.linalg.norm(features, axis=1, keepdims=True)
    for value, j in zip(got, pseudo, strict=True):
        weights = (1 + unit[items] @ unit[j]) / 2
        assert value == pytest.approx(weights @ ratings / weights.sum())
    assert row_ids(pseudo_indptr).tolist() == [0, 0]


def test_wasserstein_weights():
    assert diagonal_w2_squared(np.zeros(2), np.ones(2), np.ones(2), np.ones(2)) == 2.0
    counts = np.array([10.0, 10.0])
    sums = np.array([[0.0, 0.0], [50.0, 50.0]])  # client 1's mean is far from the global 0
    squares = np.array([[10.0, 10.0], [260.0, 260.0]])
    weights = client_weights("wasserstein", counts, sums, squares, np.zeros(2), np.ones(2))
    assert weights[0] > weights[1] > 0 and weights.max() <= 1
    assert client_weights("uniform", counts, sums, squares, None, None).tolist() == [1, 1]
    assert client_weights("count", counts, sums, squares, None, None, count_cap=20).tolist() == [
        0.5,
        0.5,
    ]
    with pytest.raises(ValueError, match="weighting"):
        client_weights("median", counts, sums, squares, None, None)


def test_merge_sorted_places_every_key_in_order():
    rng = np.random.default_rng(3)
    keys = np.unique(rng.integers(0, 10_000, 600))
    is_a = rng.random(len(keys)) < 0.4
    a, b = keys[is_a], keys[~is_a]
    at_a, at_b = merge_sorted(a, b)
    merged = np.empty(len(keys), dtype=keys.dtype)
    merged[at_a], merged[at_b] = a, b
    assert np.array_equal(merged, keys)
    assert merge_sorted(a, b[:0])[0].tolist() == list(range(len(a)))
