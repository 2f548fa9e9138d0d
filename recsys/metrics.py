"""Rating-prediction and ranking metrics.

RMSE and MAE are computed on predictions clipped to the rating scale (as every paper in
specs/fedmf.md reports them). The ranking metrics follow the usual explicit-feedback protocol:
for each user with at least one *relevant* test item (rating >= ``threshold``), rank every item
the user did not rate in training and look at the top ``k``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from securefed.ranking import top_n
from securefed.recsys.data import Ratings
from securefed.recsys.sparse_rows import row_ids


def rmse(predicted: np.ndarray, actual: np.ndarray) -> float:
    """Root mean squared error."""
    if len(actual) == 0:
        raise ValueError("RMSE of an empty test set is undefined")
    return float(np.sqrt(np.mean((np.asarray(predicted) - np.asarray(actual)) ** 2)))


def mae(predicted: np.ndarray, actual: np.ndarray) -> float:
    """Mean absolute error."""
    if len(actual) == 0:
        raise ValueError("MAE of an empty test set is undefined")
    return float(np.mean(np.abs(np.asarray(predicted) - np.asarray(actual))))


def ranking_metrics(
    scores_for_users: Callable[[np.ndarray], np.ndarray],
    train: Ratings,
    test: Ratings,
    *,
    k: int = 10,
    threshold: float | None = None,
    block: int = 512,
) -> dict[str, float]:
    """HR@k and NDCG@k with binary relevance.

    Args:
        scores_for_users: maps an array of user indices to their ``(n, n_items)`` score matrix.
        train: training ratings (those items are excluded from the ranking).
        test: test ratings; relevant items have rating >= ``threshold``.
        k: cut-off.
        threshold: relevance threshold (default: 80% of the way up the rating scale, 4 on 1..5).
        block: users scored at a time (bounds memory).

    Returns:
        ``{"hr@k": ..., "ndcg@k": ..., "ranking_users": n}`` averaged over users with a relevant
        test item. HR@k is the share of those users with at least one relevant item in the top k.
    """
    if threshold is None:
        threshold = train.scale.minimum + 0.75 * (train.scale.maximum - train.scale.minimum)
    relevant = test.ratings >= threshold
    users = np.unique(test.users[relevant])
    train_csr, test_csr = train.to_csr(), test.subset(relevant).to_csr()
    discounts = 1.0 / np.log2(np.arange(2, k + 2))
    hits, ndcgs = [], []
    for start in range(0, len(users), block):
        chunk = users[start : start + block]
        scores = np.array(scores_for_users(chunk), dtype=np.float64)
        rated = train_csr[chunk]
        scores[row_ids(rated.indptr), rated.indices] = -np.inf
        top = top_n(scores, min(k, scores.shape[1]), axis=1)
        truth = test_csr[chunk].toarray() > 0
        gained = np.take_along_axis(truth, top, 1)
        ideal = np.array([discounts[: min(int(n), k)].sum() for n in truth.sum(1)])
        hits.append(gained.any(1))
        ndcgs.append((gained * discounts).sum(1) / ideal)
    if not hits:
        return {f"hr@{k}": float("nan"), f"ndcg@{k}": float("nan"), "ranking_users": 0}
    return {
        f"hr@{k}": float(np.concatenate(hits).mean()),
        f"ndcg@{k}": float(np.concatenate(ndcgs).mean()),
        "ranking_users": len(users),
    }
