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
from securefed.recsys.filling import keyed_uniforms
from securefed.recsys.user_state import keyed_normals


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


class OnDemandPopulation:
    """A population of ``n_users`` drawn from ``model`` one user at a time, from the seed alone.

    Nothing of size ``n_users`` is stored: user ``u``'s ratings are a function of ``(seed, u)``
    (counter-based uniforms, :func:`~securefed.recsys.filling.keyed_uniforms`), generated when a
    round samples the user and identical every time. The law is :func:`draw_population`'s (a
    count from the empirical counts, items by popularity without replacement by Gumbel-top-k,
    the rating from a resampled fitted user), not its draws: the two are different samples.
    What a FedMF round needs of its users is :meth:`rows` and :meth:`counts`
    (``FedMF(population, ...)``).

    Args:
        model: the fitted population (:func:`fit_population`).
        n_users: how many users (any number: nothing is allocated per user).
        seed: the population's seed.
        chunk: users generated at once (bounds the ``chunk x n_items`` temporaries).

    Raises:
        ValueError: ``n_users`` or ``chunk`` below 1.
    """

    def __init__(
        self, model: PopulationModel, n_users: int, *, seed: int, chunk: int = 256
    ) -> None:
        if n_users < 1 or chunk < 1:
            raise ValueError(f"n_users and chunk must be >= 1, got {n_users}, {chunk}")
        self.model, self.n_users, self.seed, self.chunk = model, int(n_users), int(seed), chunk
        self.n_items = len(model.item_bias)
        self.scale = model.scale
        self.name = f"population-{n_users}-seed{seed}-on-demand"
        # One independent 64-bit key per purpose (count, source, items, noise).
        self._keys = [int(k) for k in np.random.SeedSequence(seed).generate_state(4, np.uint64)]
        self._log_weight = np.log(model.popularity / model.popularity.sum())

    def _check(self, users: np.ndarray) -> np.ndarray:
        users = np.asarray(users, dtype=np.int64)
        if users.ndim != 1 or (len(users) and (users.min() < 0 or users.max() >= self.n_users)):
            raise ValueError(f"users must be a 1-D array of ids in [0, {self.n_users})")
        return users

    def counts(self, users: np.ndarray) -> np.ndarray:
        """How many ratings each of ``users`` has (int64)."""
        users = self._check(users).astype(np.uint64)
        pick = keyed_uniforms(self._keys[0], users) * len(self.model.counts)
        return np.minimum(self.model.counts[pick.astype(np.int64)], self.n_items).astype(np.int64)

    def rows(self, users: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(indptr, items, ratings)`` of ``users``, CSR in that order, items sorted per user."""
        users = self._check(users)
        counts = self.counts(users)
        indptr = np.zeros(len(users) + 1, dtype=np.int64)
        np.cumsum(counts, out=indptr[1:])
        items = np.empty(indptr[-1], dtype=np.int64)
        n = self.n_items
        columns = np.arange(n, dtype=np.uint64)
        for start in range(0, len(users), self.chunk):
            block = users[start : start + self.chunk].astype(np.uint64)
            keys = block[:, None] * np.uint64(n) + columns[None, :]
            uniforms = np.maximum(keyed_uniforms(self._keys[2], keys), 2.0**-54)
            gumbel = -np.log(-np.log(uniforms))
            order = np.argsort(-(self._log_weight + gumbel), axis=1, kind="stable")
            chosen = np.zeros(keys.shape, dtype=bool)
            take = np.arange(n)[None, :] < counts[start : start + self.chunk, None]
            np.put_along_axis(chosen, order, take, axis=1)
            lo, hi = indptr[start], indptr[min(start + self.chunk, len(users))]
            items[lo:hi] = np.nonzero(chosen)[1]  # row-major: sorted within each user
        owners = np.repeat(users, counts)
        source = (
            keyed_uniforms(self._keys[1], owners.astype(np.uint64)) * len(self.model.counts)
        ).astype(np.int64)
        pair = owners.astype(np.uint64) * np.uint64(n) + items.astype(np.uint64)
        noise = keyed_normals(self._keys[3], pair)
        m = self.model
        score = (
            m.mean
            + m.user_bias[source]
            + m.item_bias[items]
            + np.einsum("ni,ni->n", m.user_factors[source], m.item_factors[items])
            + m.residual_std * noise
        )
        return indptr, items, m.scale.snap(m.scale.clip(score))

    def materialise(self, users: np.ndarray | None = None) -> Ratings:
        """The ratings of ``users`` (default: all) as :class:`Ratings` over the population's ids
        (for tests and small populations: this one is stored)."""
        users = np.arange(self.n_users) if users is None else self._check(users)
        indptr, items, ratings = self.rows(users)
        return Ratings(
            np.repeat(users, np.diff(indptr)),
            items,
            ratings,
            None,
            self.n_users,
            self.n_items,
            self.scale,
            np.arange(self.n_users),
            np.arange(self.n_items),
            name=self.name,
        )
