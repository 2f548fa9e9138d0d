"""A synthetic rating generator: low rank plus noise, long-tailed item popularity."""

from __future__ import annotations

import math
import operator

import numpy as np

from securefed.recsys.data.containers import ML100K_SCALE, Ratings, RatingScale

__all__ = ["synthetic_ratings"]

_DRAW_CHUNK = 1 << 21
_RATING_CHUNK = 1 << 18
_MAX_WEIGHTED_ROUNDS = 64
_STALL_SHARE = 0.125
_DENSE_FACTOR = 4
_USER_ACTIVITY_SIGMA = 1.0
_FIRST_TIMESTAMP = 1_000_000_000
_MAX_TIMESTAMP_GAP = 600


def _zipf_weights(n: int, exponent: float, rng: np.random.Generator) -> np.ndarray:
    """Probabilities proportional to ``rank ** -exponent`` over random popularity ranks."""
    weights = (rng.permutation(n) + 1.0) ** -exponent
    return weights / weights.sum()


def _lognormal_weights(n: int, sigma: float, rng: np.random.Generator) -> np.ndarray:
    """Probabilities drawn from a log-normal law (a long but bounded tail)."""
    weights = rng.lognormal(0.0, sigma, n)
    return weights / weights.sum()


def _sorted_draw(size: int, probabilities: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Draw ``size`` i.i.d. indices with the given probabilities, returned sorted (int64)."""
    counts = rng.multinomial(size, probabilities)
    return np.repeat(np.arange(probabilities.size, dtype=np.int64), counts)


def _shuffled_draw(size: int, probabilities: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Draw ``size`` i.i.d. indices with the given probabilities, in random order."""
    draws = _sorted_draw(size, probabilities, rng)
    rng.shuffle(draws)
    return draws


def _distinct_novel(candidates: np.ndarray, taken: np.ndarray) -> np.ndarray:
    """Return the distinct candidate keys absent from sorted ``taken``, sorted."""
    candidates = np.sort(candidates)
    distinct = candidates[np.concatenate([[True], candidates[1:] != candidates[:-1]])]
    positions = np.minimum(np.searchsorted(taken, distinct), taken.size - 1)
    return distinct[taken[positions] != distinct]


def _merge_sorted(taken: np.ndarray, new: np.ndarray) -> np.ndarray:
    """Merge sorted new keys into sorted keys (a stable sort merges the two runs)."""
    return np.sort(np.concatenate([taken, new]), kind="stable")


def _fill_densely(
    taken: np.ndarray, total: int, count: int, rng: np.random.Generator
) -> np.ndarray:
    """Add ``count`` keys chosen uniformly among the cells not yet taken."""
    free = np.ones(total, dtype=bool)
    free[taken] = False
    chosen = rng.choice(np.flatnonzero(free), size=count, replace=False)
    return _merge_sorted(taken, np.sort(chosen))


def _draw_pairs(
    n_users: int,
    n_items: int,
    n_ratings: int,
    item_probabilities: np.ndarray,
    rng: np.random.Generator,
) -> np.ndarray:
    """Draw ``n_ratings`` distinct (user, item) keys ``user * n_items + item``, sorted.

    Every user first gets one item; further pairs are drawn in chunks (user by log-normal
    activity, item by popularity, independently), repeated pairs are dropped, and the
    shortfall is drawn again. When a chunk yields more new pairs than needed, a uniformly
    random subset of them is kept. Should weighted draws stall (the popular cells are
    full), the rest is drawn uniformly: by rejection while the matrix is sparse, else
    directly among the free cells.
    """
    total = n_users * n_items
    user_probabilities = _lognormal_weights(n_users, _USER_ACTIVITY_SIGMA, rng)
    first_items = _shuffled_draw(n_users, item_probabilities, rng)
    taken = np.arange(n_users, dtype=np.int64) * n_items + first_items
    weighted_rounds = 0
    while taken.size < n_ratings:
        deficit = n_ratings - taken.size
        if weighted_rounds >= _MAX_WEIGHTED_ROUNDS and total <= _DENSE_FACTOR * n_ratings:
            return _fill_densely(taken, total, deficit, rng)
        size = min(deficit + deficit // 4 + 16, _DRAW_CHUNK)
        if weighted_rounds < _MAX_WEIGHTED_ROUNDS:
            weighted_rounds += 1
            users = _sorted_draw(size, user_probabilities, rng)
            candidates = users * n_items + _shuffled_draw(size, item_probabilities, rng)
        else:
            candidates = rng.integers(0, total, size)
        novel = _distinct_novel(candidates, taken)
        if novel.size < _STALL_SHARE * size:
            weighted_rounds = _MAX_WEIGHTED_ROUNDS
        if novel.size > deficit:
            novel = np.sort(rng.choice(novel, size=deficit, replace=False))
        taken = _merge_sorted(taken, novel)
    return taken


def _low_rank_ratings(
    users: np.ndarray,
    items: np.ndarray,
    user_factors: np.ndarray,
    item_factors: np.ndarray,
    mean: float,
    noise: float,
    scale: RatingScale,
    rng: np.random.Generator,
) -> np.ndarray:
    """Compute ``snap(mean + P_u . Q_i + noise)`` chunk by chunk."""
    ratings = np.empty(users.size, dtype=np.float64)
    for start in range(0, users.size, _RATING_CHUNK):
        stop = min(start + _RATING_CHUNK, users.size)
        affinity = np.einsum(
            "ij,ij->i", user_factors[users[start:stop]], item_factors[items[start:stop]]
        )
        raw = mean + affinity + noise * rng.standard_normal(stop - start)
        ratings[start:stop] = scale.snap(raw)
    return ratings


def _check_count(value: int, label: str, minimum: int) -> int:
    """Validate an integer argument with a lower bound."""
    if isinstance(value, bool):
        raise TypeError(f"{label} must be an integer, got {value!r}")
    value = operator.index(value)
    if value < minimum:
        raise ValueError(f"{label} must be >= {minimum}, got {value}")
    return value


def _check_real(value: float, label: str) -> float:
    """Validate a finite, non-negative real argument."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
        raise TypeError(f"{label} must be a real number, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{label} must be finite and >= 0, got {value}")
    return float(value)


def synthetic_ratings(
    n_users: int,
    n_items: int,
    n_ratings: int,
    *,
    rank: int = 10,
    noise: float = 0.5,
    popularity_exponent: float = 1.0,
    scale: RatingScale = ML100K_SCALE,
    seed: int = 0,
) -> Ratings:
    """Generate low-rank-plus-noise ratings with long-tailed popularity.

    The ratings are ``scale.snap(mean + P_u . Q_i + e)`` with latent factors
    ``P`` (``n_users x rank``) and ``Q`` (``n_items x rank``) drawn i.i.d. normal, scaled so
    that ``P_u . Q_i`` has standard deviation a quarter of the scale's range, ``mean`` 60%
    up the scale and ``e`` normal noise with standard deviation ``noise``. Item ``i`` is
    drawn with probability proportional to ``rank_i ** -popularity_exponent`` (``rank_i``
    a random popularity rank), users with log-normal activity weights; every user has at
    least one rating and no (user, item) pair repeats. Rows come in chronological order:
    the timestamps strictly increase. Memory stays a small multiple of the output; nothing
    of size ``n_users * n_items`` is built unless the matrix is nearly full.

    Args:
        n_users: Number of users (>= 1).
        n_items: Number of items (>= 1).
        n_ratings: Number of ratings, between ``n_users`` and ``n_users * n_items``.
        rank: Number of latent factors (>= 1).
        noise: Standard deviation of the rating noise (>= 0).
        popularity_exponent: Zipf exponent of item popularity (>= 0; 0 is uniform).
        scale: Scale the ratings are snapped to.
        seed: Seed of ``numpy.random.default_rng``; equal seeds give equal data.

    Returns:
        The ratings; user and item ids equal their indices.

    Raises:
        ValueError: If the sizes are impossible or an argument is out of range.
    """
    n_users = _check_count(n_users, "n_users", 1)
    n_items = _check_count(n_items, "n_items", 1)
    n_ratings = _check_count(n_ratings, "n_ratings", 1)
    rank = _check_count(rank, "rank", 1)
    noise = _check_real(noise, "noise")
    popularity_exponent = _check_real(popularity_exponent, "popularity_exponent")
    if not isinstance(scale, RatingScale):
        raise TypeError(f"scale must be a RatingScale, got {type(scale).__name__}")
    if n_ratings < n_users:
        raise ValueError(
            f"every user needs a rating, so n_ratings ({n_ratings}) must be at least "
            f"n_users ({n_users})"
        )
    if n_ratings > n_users * n_items:
        raise ValueError(
            f"{n_ratings} distinct (user, item) pairs do not fit in {n_users} users x "
            f"{n_items} items (at most {n_users * n_items})"
        )
    rng = np.random.default_rng(seed)
    item_probabilities = _zipf_weights(n_items, popularity_exponent, rng)
    keys = _draw_pairs(n_users, n_items, n_ratings, item_probabilities, rng)
    users = (keys // n_items).astype(np.int32)
    items = (keys % n_items).astype(np.int32)
    del keys
    spread = scale.maximum - scale.minimum
    factor_std = ((spread / 4) ** 2 / rank) ** 0.25
    user_factors = rng.normal(0.0, factor_std, (n_users, rank))
    item_factors = rng.normal(0.0, factor_std, (n_items, rank))
    mean = scale.minimum + 0.6 * spread
    ratings = _low_rank_ratings(users, items, user_factors, item_factors, mean, noise, scale, rng)
    chronological = rng.permutation(n_ratings)
    users = users[chronological]
    items = items[chronological]
    ratings = ratings[chronological]
    del chronological
    timestamps = rng.integers(1, _MAX_TIMESTAMP_GAP + 1, n_ratings, dtype=np.int64)
    np.cumsum(timestamps, out=timestamps)
    timestamps += _FIRST_TIMESTAMP
    return Ratings(
        users=users,
        items=items,
        ratings=ratings,
        timestamps=timestamps,
        n_users=n_users,
        n_items=n_items,
        scale=scale,
        user_ids=np.arange(n_users, dtype=np.int64),
        item_ids=np.arange(n_items, dtype=np.int64),
        name=f"synthetic-{n_users}x{n_items}-{n_ratings}-seed{seed}",
    )
