"""Rankings break ties the same way on every machine (``securefed.ranking``).

numpy's default argsort/argpartition leave tied keys in an order that depends on the CPU's
vectorised kernel; these tests build ties on purpose and check the documented order (largest
first, ties by lower index) wherever a ranking chooses data, a slate or a top-k hit.
"""

from __future__ import annotations

import numpy as np
import pytest

from securefed.ranking import rank_descending, top_n


def test_ties_go_to_the_lower_index_in_every_row():
    values = np.array([[1, 3, 3, 2, 3], [0.5, 0.5, 0.5, 0.5, 0.5]])
    assert top_n(values, 3).tolist() == [[1, 2, 4], [0, 1, 2]]
    assert rank_descending(values[0]).tolist() == [1, 2, 4, 3, 0]
    many_ties = np.zeros(10_000)  # long enough for numpy's vectorised sorts
    many_ties[::7] = 1.0
    assert top_n(many_ties, 50).tolist() == list(range(0, 350, 7))


def test_rankings_refuse_keys_they_cannot_order():
    with pytest.raises(ValueError, match="NaN"):
        top_n(np.array([1.0, np.nan]), 1)
    with pytest.raises(ValueError, match="signed integers or floats"):
        top_n(np.array([1, 2], np.uint8), 1)
    with pytest.raises(ValueError, match=r"n must lie in \[0, 2\]"):
        top_n(np.array([1.0, 2.0]), 3)


def test_densest_breaks_activity_ties_by_the_lower_index():
    from securefed.recsys.data import Ratings, RatingScale, densest

    # users 0..5 rate item 0; users 1, 3, 4 also rate item 1: three users tie at 2 ratings and
    # the three others at 1, so the 4 most active are 1, 3, 4 and the lowest-index of the rest.
    users = np.array([0, 1, 2, 3, 4, 5, 1, 3, 4])
    items = np.array([0, 0, 0, 0, 0, 0, 1, 1, 1])
    ratings = Ratings(
        users, items, np.full(9, 4.0), None, 6, 2, RatingScale(1, 5, 1),
        np.arange(6) + 100, np.arange(2) + 10, name="ties",
    )  # fmt: skip
    kept = densest(ratings, max_users=4)
    assert sorted(kept.user_ids.tolist()) == [100, 101, 103, 104]


def test_a_top_k_metric_ranks_tied_scores_by_item_index():
    """All scores tie: the top 2 are items 0 and 1, so a relevant item 1 is a hit, item 3 not."""
    from securefed.recsys.data import Ratings, RatingScale
    from securefed.recsys.metrics import ranking_metrics

    scale = RatingScale(1, 5, 1)

    def ratings(users, items):
        n = len(users)
        return Ratings(
            np.array(users), np.array(items), np.full(n, 5.0), None, 2, 5, scale,
            np.arange(2), np.arange(5), name="ties",
        )  # fmt: skip

    train = ratings([0, 1], [4, 4])
    test = ratings([0, 1], [1, 3])
    flat = lambda users: np.zeros((len(users), 5))  # noqa: E731
    metrics = ranking_metrics(flat, train, test, k=2)
    assert metrics["hr@2"] == 0.5
