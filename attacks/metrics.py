"""Leak metrics: how much of a user's ratings and rated items an attack recovered.

Per evaluated user, against the training ratings (``securefed.recsys.data.Ratings``; user index =
client id):

* ``exact_share``: share of the user's ratings whose recovered value, rounded to the scale
  (``RatingScale.snap``), equals the true rating;
* ``rmse``: root mean squared error of the recovered values clipped to the scale's range;
* ``precision``, ``recall``, ``f1``: of the predicted rated set against the true one.

A true rating with no recovered value (the item was not among the rows the attack looked at) is
guessed with ``fallback`` (the chance baseline's rating guess), so the figures describe everything
the attacker ends up believing. Conventions for empty sets: precision is 1 when nothing is
predicted and nothing is true, 0 when nothing is predicted but something is; recall is 1 for a user
with no true items; F1 is 0 when precision + recall is 0.

Overall figures are micro averages over all evaluated ratings / predicted items (``exact_share``,
``rmse``, ``precision``, ``recall``, ``f1``) plus the macro mean of the users' F1 (``f1_macro``).
Sets are CSR structures over the evaluated users (:class:`UserSets`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from securefed.recsys.data import Ratings, RatingScale


@dataclass(frozen=True, eq=False)
class UserSets:
    """Items (and optionally values) per evaluated user, CSR by position in ``users``.

    Attributes:
        indptr: ``len(users) + 1`` offsets.
        items: item index of each entry (distinct within a user).
        values: value of each entry (rating or recovered value), or ``None``.
    """

    indptr: np.ndarray
    items: np.ndarray
    values: np.ndarray | None = None

    def __post_init__(self) -> None:
        indptr = np.asarray(self.indptr, dtype=np.int64)
        items = np.asarray(self.items, dtype=np.int64)
        if indptr.ndim != 1 or len(indptr) < 1 or indptr[0] != 0 or np.any(np.diff(indptr) < 0):
            raise ValueError("indptr must be non-decreasing offsets starting at 0")
        if indptr[-1] != len(items):
            raise ValueError(f"indptr ends at {indptr[-1]} but there are {len(items)} items")
        if self.values is not None and len(self.values) != len(items):
            raise ValueError("values must align with items")
        object.__setattr__(self, "indptr", indptr)
        object.__setattr__(self, "items", items)
        if self.values is not None:
            object.__setattr__(self, "values", np.asarray(self.values, dtype=np.float64))

    @property
    def n_users(self) -> int:
        return len(self.indptr) - 1

    def counts(self) -> np.ndarray:
        return np.diff(self.indptr)

    def owners(self) -> np.ndarray:
        return np.repeat(np.arange(self.n_users), self.counts())

    def keys(self, n_items: int) -> np.ndarray:
        """``position * n_items + item`` for every entry."""
        return self.owners() * n_items + self.items

    def select(self, mask: np.ndarray) -> UserSets:
        """The entries where ``mask`` is True, still grouped by user."""
        mask = np.asarray(mask, dtype=bool)
        kept = np.bincount(self.owners()[mask], minlength=self.n_users)
        indptr = np.concatenate([[0], np.cumsum(kept)])
        values = None if self.values is None else self.values[mask]
        return UserSets(indptr, self.items[mask], values)


def truth_sets(truth: Ratings, users: np.ndarray) -> UserSets:
    """The true rated items and ratings of ``users`` (sorted client ids)."""
    users = np.asarray(users, dtype=np.int64)
    if len(users) and (users.min() < 0 or users.max() >= truth.n_users):
        raise ValueError(f"users must lie in [0, {truth.n_users}) to be scored against the truth")
    csr = truth.to_csr()
    starts, stops = csr.indptr[users], csr.indptr[users + 1]
    counts = (stops - starts).astype(np.int64)
    indptr = np.concatenate([[0], np.cumsum(counts)])
    # entry k of user position j sits at starts[j] + (k - indptr[j])
    owners = np.repeat(np.arange(len(users)), counts)
    entries = starts[owners] + (np.arange(indptr[-1]) - indptr[owners])
    return UserSets(indptr, csr.indices[entries], csr.data[entries])


def precision_recall_f1(
    hits: np.ndarray, predicted: np.ndarray, true: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Precision, recall and F1 from counts (module docstring for empty sets)."""
    hits, predicted, true = (np.asarray(x, dtype=np.float64) for x in (hits, predicted, true))
    precision = np.where(predicted > 0, hits / np.maximum(predicted, 1), (true == 0) * 1.0)
    recall = np.where(true > 0, hits / np.maximum(true, 1), 1.0)
    total = precision + recall
    f1 = np.where(total > 0, 2 * precision * recall / np.where(total > 0, total, 1.0), 0.0)
    return precision, recall, f1


def item_metrics(true: UserSets, predicted: UserSets, n_items: int) -> dict[str, np.ndarray]:
    """Per-user ``hits``, ``n_predicted``, ``n_true``, ``precision``, ``recall``, ``f1``."""
    if true.n_users != predicted.n_users:
        raise ValueError("true and predicted sets must cover the same users")
    true_keys = np.sort(true.keys(n_items))
    predicted_keys = predicted.keys(n_items)
    hit = np.isin(predicted_keys, true_keys)
    hits = np.bincount(predicted.owners()[hit], minlength=true.n_users)
    precision, recall, f1 = precision_recall_f1(hits, predicted.counts(), true.counts())
    return {
        "hits": hits,
        "n_predicted": predicted.counts(),
        "n_true": true.counts(),
        "precision": precision,
        "recall": recall,
        "f1": f1,
    }


def rating_metrics(
    true: UserSets, recovered: UserSets, scale: RatingScale, n_items: int, fallback: float
) -> dict[str, np.ndarray]:
    """Per-user ``n_ratings``, ``exact`` (count), ``exact_share``, ``squared_error``, ``rmse``.

    ``recovered`` holds a value for some items of each user (NaN values count as missing).
    """
    if true.values is None or recovered.values is None:
        raise ValueError("rating metrics need values in both sets")
    true_keys = true.keys(n_items)
    keys = recovered.keys(n_items)
    usable = np.isfinite(recovered.values)
    keys, values = keys[usable], recovered.values[usable]
    order = np.argsort(keys, kind="stable")
    keys, values = keys[order], values[order]
    at = np.searchsorted(keys, true_keys)
    if len(keys):
        found = (at < len(keys)) & (keys[np.minimum(at, len(keys) - 1)] == true_keys)
    else:  # no value recovered at all (e.g. rows-only attacks)
        found = np.zeros(len(true_keys), dtype=bool)
    guess = np.full(len(true_keys), float(fallback))
    guess[found] = values[at[found]]
    exact = scale.snap(guess) == true.values
    squared = (scale.clip(guess) - true.values) ** 2
    owners = true.owners()
    n = true.counts()
    exact_count = np.bincount(owners, weights=exact, minlength=true.n_users)
    squared_sum = np.bincount(owners, weights=squared, minlength=true.n_users)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(n > 0, exact_count / np.maximum(n, 1), np.nan)
        rmse = np.where(n > 0, np.sqrt(squared_sum / np.maximum(n, 1)), np.nan)
    return {
        "n_ratings": n,
        "exact": exact_count,
        "exact_share": share,
        "squared_error": squared_sum,
        "rmse": rmse,
    }


def per_user_metrics(
    true: UserSets,
    recovered: UserSets,
    predicted: UserSets,
    scale: RatingScale,
    n_items: int,
    fallback: float,
) -> dict[str, np.ndarray]:
    """Rating and item metrics of every evaluated user in one dict of aligned arrays."""
    return rating_metrics(true, recovered, scale, n_items, fallback) | item_metrics(
        true, predicted, n_items
    )


def overall_metrics(per_user: dict[str, np.ndarray]) -> dict[str, float]:
    """Micro averages over all ratings / items, plus ``f1_macro`` (module docstring)."""
    ratings = float(np.sum(per_user["n_ratings"]))
    hits = float(np.sum(per_user["hits"]))
    predicted = float(np.sum(per_user["n_predicted"]))
    true = float(np.sum(per_user["n_true"]))
    precision, recall, f1 = (float(x) for x in precision_recall_f1(hits, predicted, true))
    return {
        "users": float(len(per_user["n_ratings"])),
        "ratings": ratings,
        "exact_share": float(np.sum(per_user["exact"]) / ratings) if ratings else float("nan"),
        "rmse": float(np.sqrt(np.sum(per_user["squared_error"]) / ratings))
        if ratings
        else float("nan"),
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "f1_macro": float(np.mean(per_user["f1"])) if len(per_user["f1"]) else float("nan"),
    }


def item_overall(true: UserSets, predicted: UserSets, n_items: int) -> dict[str, float]:
    """Micro precision / recall / F1 and macro F1 of one item prediction."""
    per_user = item_metrics(true, predicted, n_items)
    precision, recall, f1 = (
        float(x)
        for x in precision_recall_f1(
            per_user["hits"].sum(), per_user["n_predicted"].sum(), per_user["n_true"].sum()
        )
    )
    macro = float(np.mean(per_user["f1"])) if len(per_user["f1"]) else float("nan")
    return {"precision": precision, "recall": recall, "f1": f1, "f1_macro": macro}
