"""Hybrid filling: pseudo items and their virtual ratings (FedRec, FedRec+).

FedRec (Lin et al. 2020) hides which items a user rated by also uploading gradients for
``rho * |I_u|`` sampled unrated items, rated virtually: the user's mean for the first T' rounds,
then the model's prediction. FedRec+ (arXiv 2310.20193, section "low-noise pseudo items") picks
the unrated items whose features are most cosine-similar to the rated ones. specs/fedmf.md
section 3 explains why values off the rating scale and sets resampled each round still leak;
the FedRec+ defaults here (virtual ratings snapped to the scale, one stable set per user) close
both holes.

All functions work on whole populations at once: pseudo sets are CSR structures by user.
"""

from __future__ import annotations

import numpy as np
from scipy import sparse

from securefed.recsys.sparse_rows import rated_dot, row_ids, segment_sum


def pseudo_counts(
    rated_counts: np.ndarray, n_items: int, rho: float, *, minimum_rows: int = 0
) -> np.ndarray:
    """``round(rho * |I_u|)`` pseudo items per user, raised so that rated plus pseudo rows reach
    ``minimum_rows``, and capped by the number of unrated items."""
    wanted = np.maximum(np.rint(rho * rated_counts).astype(np.int64), minimum_rows - rated_counts)
    return np.minimum(wanted, n_items - rated_counts)


def sample_unrated(
    indptr: np.ndarray,
    items: np.ndarray,
    n_items: int,
    counts: np.ndarray,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """Draw ``counts[u]`` distinct unrated items for every user ``u``, uniformly (FedRec).

    Args:
        indptr, items: the users' rated items as CSR (rows = users).
        n_items: catalogue size.
        counts: how many pseudo items each user needs.
        rng: the draw's generator.

    Returns:
        ``(pseudo_indptr, pseudo_items)``, CSR by user, items sorted within each user.
    """
    n_users = len(indptr) - 1
    counts = counts.astype(np.int64)
    rated_counts = np.diff(indptr)
    unrated = n_items - rated_counts
    # Position p among user u's unrated items is item p + #{rated items r_j with r_j - j <= p}
    # (items sorted within each user), so sampling positions needs no membership tests.
    rank = np.arange(len(items)) - np.repeat(indptr[:-1], rated_counts)
    shifted = row_ids(indptr) * n_items + items - rank
    # Users who need most of their unrated items: exact draw without replacement (rejection
    # would crawl near saturation). Everyone else: vectorised draws with replacement, deduplicated.
    crowded = np.flatnonzero(counts > unrated // 2)
    chosen_parts = [
        user * n_items + rng.choice(unrated[user], counts[user], replace=False) for user in crowded
    ]
    need = counts.copy()
    need[crowded] = 0
    chosen_parts.append(_distinct_positions(need, unrated, n_items, rng))
    positions = np.sort(np.concatenate(chosen_parts))
    owner = positions // n_items
    offset = np.searchsorted(shifted, positions, side="right") - indptr[owner]
    pseudo_items = positions % n_items + offset
    pseudo_indptr = np.zeros(n_users + 1, dtype=np.int64)
    np.cumsum(np.bincount(owner, minlength=n_users), out=pseudo_indptr[1:])
    return pseudo_indptr, pseudo_items


def _distinct_positions(
    need: np.ndarray, population: np.ndarray, n_items: int, rng: np.random.Generator
) -> np.ndarray:
    """``need[u]`` distinct positions in ``[0, population[u])`` per user, as keys
    ``u * n_items + position``: oversample with replacement, keep the first distinct draws in draw
    order, and redraw only for the users still short (rare when ``need <= population / 2``)."""
    chosen, missing = [], need.copy()
    while missing.sum() > 0:
        users = np.repeat(np.arange(len(need)), 2 * missing + 4 * (missing > 0))
        keys = users * n_items + (rng.random(len(users)) * population[users]).astype(np.int64)
        if chosen:
            keys = keys[~np.isin(keys, np.concatenate(chosen))]
        keys = keys[_first_occurrences(keys)]  # distinct draws, in draw order
        # Draws come user by user, so draw order is already grouped by user.
        owner = keys // n_items
        rank = np.arange(len(keys)) - np.searchsorted(owner, owner)
        kept = keys[rank < missing[owner]]
        chosen.append(kept)
        missing = missing - np.bincount(kept // n_items, minlength=len(need))
    return np.concatenate(chosen) if chosen else np.zeros(0, dtype=np.int64)


def _first_occurrences(keys: np.ndarray) -> np.ndarray:
    """Mask of the entries whose key has not appeared before them (one stable sort)."""
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    first = np.ones(len(keys), dtype=bool)
    first[order[1:][ordered[1:] == ordered[:-1]]] = False
    return first


def normalise_rows(features: np.ndarray) -> np.ndarray:
    """Unit-norm rows (zero rows stay zero), the encoder for cosine similarity."""
    norms = np.linalg.norm(features, axis=1, keepdims=True)
    return np.divide(features, norms, out=np.zeros_like(features), where=norms > 0)


def most_similar_unrated(
    indptr: np.ndarray,
    items: np.ndarray,
    item_features: np.ndarray,
    counts: np.ndarray,
    *,
    block_users: int = 1024,
) -> tuple[np.ndarray, np.ndarray]:
    """FedRec+ pseudo items: each user's ``counts[u]`` unrated items of highest mean cosine
    similarity ``cos(E_r, E_un) = <E_r, E_un> / (||E_r|| ||E_un||)`` to the items it rated.

    The encoder is the identity on the item factors (the paper's ``Encoder(V_i)``); the score of an
    unrated item is its mean cosine similarity to the user's rated items, computed for a block of
    users at a time as ``(M_block @ E) @ E^T``.

    Returns:
        ``(pseudo_indptr, pseudo_items)``, CSR by user, items sorted within each user.
    """
    n_users = len(indptr) - 1
    encoded = normalise_rows(item_features)
    per_user: list[np.ndarray] = []
    for start in range(0, n_users, block_users):
        stop = min(start + block_users, n_users)
        lo, hi = indptr[start], indptr[stop]
        local_users = row_ids(indptr[start : stop + 1] - lo)
        profile = segment_sum(encoded[items[lo:hi]], indptr[start : stop + 1] - lo)
        scores = profile @ encoded.T
        scores[local_users, items[lo:hi]] = -np.inf
        ranking = np.argsort(-scores, axis=1, kind="stable")
        for k, user in enumerate(range(start, stop)):
            per_user.append(np.sort(ranking[k, : counts[user]]))
    pseudo_indptr = np.zeros(n_users + 1, dtype=np.int64)
    np.cumsum([len(p) for p in per_user], out=pseudo_indptr[1:])
    pseudo_items = np.concatenate(per_user) if per_user else np.zeros(0, np.int64)
    return pseudo_indptr, pseudo_items.astype(np.int64)


def user_mean_ratings(indptr: np.ndarray, ratings: np.ndarray) -> np.ndarray:
    """Each user's mean rating (FedRec's virtual rating during the first T' rounds)."""
    counts = np.maximum(np.diff(indptr), 1)
    return segment_sum(ratings, indptr) / counts


def similarity_weighted_ratings(
    indptr: np.ndarray,
    items: np.ndarray,
    ratings: np.ndarray,
    pseudo_indptr: np.ndarray,
    pseudo_items: np.ndarray,
    item_features: np.ndarray,
) -> np.ndarray:
    """FedRec+ virtual ratings: for pseudo item j of user u,
    ``sum_i w_ij r_ui / sum_i w_ij`` over the user's rated items i, with
    ``w_ij = (1 + cos_ij) / 2``.

    This project's choice (the paper says only that the rating "comes from the similar rated
    items"): the kernel ``(1 + cos) / 2`` is non-negative and linear in the encodings, so the sums
    reduce to ``S_u + <E_j, A_u>`` over ``n_u + <E_j, B_u>`` with ``A_u = sum_i r_ui E_i`` and
    ``B_u = sum_i E_i``, one sparse pass for every user at once.
    """
    encoded = normalise_rows(item_features)
    # A_u and B_u as sparse products over the rated entries: the same sums, term by term and in
    # the same order, as gathering encoded[items] first, without the (nnz, dim) temporaries.
    shape = (len(indptr) - 1, len(encoded))
    weighted_profile = sparse.csr_matrix((ratings, items, indptr), shape=shape) @ encoded
    profile = sparse.csr_matrix((np.ones(len(items)), items, indptr), shape=shape) @ encoded
    rating_sums = segment_sum(ratings, indptr)
    counts = np.diff(indptr).astype(np.float64)
    owners = row_ids(pseudo_indptr)
    # One pass over the pairs for both dot products: [A_u, B_u] stacked per user.
    both = rated_dot(
        np.vstack([weighted_profile, profile]),
        encoded,
        np.concatenate([owners, owners + shape[0]]),
        np.concatenate([pseudo_items, pseudo_items]),
    )
    numerator = rating_sums[owners] + both[: len(owners)]
    denominator = counts[owners] + both[len(owners) :]
    fallback = rating_sums[owners] / np.maximum(counts[owners], 1)
    safe = denominator > 1e-9
    return np.where(safe, numerator / np.where(safe, denominator, 1.0), fallback)


def keyed_uniforms(seed: int, keys: np.ndarray) -> np.ndarray:
    """Uniforms in [0, 1) that depend only on ``(seed, key)``: one splitmix64 hash per key.

    Counter-based, so a pair's draw does not depend on how clients are grouped or ordered.
    """
    with np.errstate(over="ignore"):
        z = np.asarray(keys, dtype=np.uint64) + np.uint64(seed & 0xFFFFFFFFFFFFFFFF)
        z = z * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def stochastic_snap(values: np.ndarray, levels_min: float, step: float, uniforms: np.ndarray):
    """Round each value to the grid point below or above it with probabilities that make the
    result unbiased (``E[snap(v)] = v`` inside the scale)."""
    position = (np.asarray(values, dtype=np.float64) - levels_min) / step
    lower = np.floor(position)
    return levels_min + step * (lower + (uniforms < position - lower))
