"""A large synthetic population drawn from a low-rank model fitted to a real ratings set.

The point (issue 28, item 5): user-level DP noise on an item's sums does not grow with the number
of users while the signal does, so a private model's gap to the non-private one shrinks as the
population grows; MovieLens 100K's 943 users are too few to show it. :func:`fit_population`
fits ``r = mu + b_u + b_i + u.v_i + e`` by plaintext alternating least squares (centralised: the
fitted model is public test data, not a federated protocol) and keeps the empirical per-user
count distribution and item popularity; :func:`draw_population` draws any number of users from
it with one seed: a user's count from the empirical counts, its items by popularity without
replacement, its vector and bias from the fitted ones (resampled with replacement), and the
rating ``snap(mu + b_u + b_i + u.v_i + e)`` with ``e ~ N(0, residual_std^2)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from securefed.recsys.baselines import damped_baseline
from securefed.recsys.data import Ratings, RatingScale


@dataclass(frozen=True, eq=False)
class PopulationModel:
    """What :func:`draw_population` samples from (arrays of the fitted model)."""

    mean: float
    user_bias: np.ndarray
    user_factors: np.ndarray
    item_bias: np.ndarray
    item_factors: np.ndarray
    counts: np.ndarray
    popularity: np.ndarray
    residual_std: float
    scale: RatingScale


def fit_population(
    train: Ratings, *, rank: int = 5, reg: float = 10.0, sweeps: int = 10, seed: int = 0
) -> PopulationModel:
    """Fit the low-rank model to ``train`` (damped biases, then ALS on their residuals).

    Raises:
        ValueError: ``rank`` or ``sweeps`` below 1, ``reg`` not positive.
    """
    if rank < 1 or sweeps < 1 or not reg > 0:
        raise ValueError("rank and sweeps must be >= 1 and reg > 0")
    base = damped_baseline(train)
    residual = train.ratings - base.predict(train.users, train.items)
    rng = np.random.default_rng(seed)
    U = rng.normal(0, 0.1, (train.n_users, rank))
    V = rng.normal(0, 0.1, (train.n_items, rank))
    for _ in range(sweeps):
        U = _ridge_rows(train.users, train.items, residual, V, train.n_users, reg)
        V = _ridge_rows(train.items, train.users, residual, U, train.n_items, reg)
    fitted = np.einsum("ni,ni->n", U[train.users], V[train.items])
    counts = np.bincount(train.users, minlength=train.n_users)
    return PopulationModel(
        mean=base.mean,
        user_bias=base.user_bias[counts > 0],
        user_factors=U[counts > 0],
        item_bias=base.item_bias,
        item_factors=V,
        counts=counts[counts > 0],
        popularity=np.bincount(train.items, minlength=train.n_items) + 1.0,
        residual_std=float(np.std(residual - fitted)),
        scale=train.scale,
    )


def _ridge_rows(rows, cols, values, fixed, n_rows, reg) -> np.ndarray:
    """Each row's ridge solve against the ``fixed`` factors of its columns."""
    rank = fixed.shape[1]
    outer = np.einsum("ni,nj->nij", fixed[cols], fixed[cols]).reshape(len(cols), -1)
    gram = np.zeros((n_rows, rank * rank))
    np.add.at(gram, rows, outer)
    linear = np.zeros((n_rows, rank))
    np.add.at(linear, rows, fixed[cols] * values[:, None])
    gram = gram.reshape(n_rows, rank, rank) + reg * np.eye(rank)
    return np.linalg.solve(gram, linear[:, :, None])[:, :, 0]


def draw_population(model: PopulationModel, n_users: int, *, seed: int) -> Ratings:
    """Draw ``n_users`` users from ``model`` (module docstring); one seed, reproducible.

    Raises:
        ValueError: ``n_users`` below 1.
    """
    if n_users < 1:
        raise ValueError(f"n_users must be >= 1, got {n_users}")
    rng = np.random.default_rng(seed)
    n_items = len(model.item_bias)
    counts = np.minimum(rng.choice(model.counts, n_users), n_items)
    source = rng.integers(0, len(model.counts), n_users)
    # Items by popularity without replacement: the Gumbel-top-k trick on log-popularity, per
    # user, in chunks so that no (n_users, n_items) block is ever large.
    log_weight = np.log(model.popularity / model.popularity.sum())
    users, items = [], []
    chunk = max(1, (1 << 22) // n_items)
    for start in range(0, n_users, chunk):
        stop = min(start + chunk, n_users)
        keys = log_weight - np.log(-np.log(rng.random((stop - start, n_items))))
        order = np.argsort(-keys, axis=1)
        take = np.arange(n_items)[None, :] < counts[start:stop, None]
        users.append(np.broadcast_to(np.arange(start, stop)[:, None], order.shape)[take])
        items.append(order[take])
    users, items = np.concatenate(users), np.concatenate(items)
    at = source[users]
    score = (
        model.mean
        + model.user_bias[at]
        + model.item_bias[items]
        + np.einsum("ni,ni->n", model.user_factors[at], model.item_factors[items])
        + rng.normal(0, model.residual_std, len(users))
    )
    return Ratings(
        users,
        items,
        model.scale.snap(model.scale.clip(score)),
        None,
        n_users,
        n_items,
        model.scale,
        np.arange(n_users),
        np.arange(n_items),
        name=f"population-{n_users}-seed{seed}",
    )
