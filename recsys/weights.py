"""Client aggregation weights for FedRec+ (Wasserstein) and the baselines it is compared with.

FedRec+ (arXiv 2310.20193, section "aggregation weights based on the Wasserstein distance")
weights each client by how far the distribution of its update is from the global one. For
Gaussians with diagonal covariance the 2-Wasserstein distance is (specs/fedmf.md section 4)

    W2^2(N(m1, s1^2), N(m2, s2^2)) = sum_k (m1k - m2k)^2 + (s1k - s2k)^2.

The paper's closed form for the weights (its eq. 23) did not survive extraction. This project's
choice, computed by each client from its own update and the global statistics the server
broadcasts (so it works under secure aggregation, where the server never sees one update):

    p_u = min(n_u, n_cap) / n_cap * exp(-W2^2(client u, global) / (tau * sum_k s_gk^2))

``n_u`` (rows the client uploads) keeps the sample-count weighting as the base, divided by a
public cap so that every weight lies in [0, 1] (bounded weights keep the sensitivity of a
weighted update bounded for DP and its range bounded for fixed-point encoding); the exponential
discounts clients whose update distribution is far from the population's, on a scale set by the
global variance so that ``tau`` is unit-free. Benchmarks compare it with ``uniform`` and
``count`` weights.
"""

from __future__ import annotations

import numpy as np

WEIGHTINGS = ("uniform", "count", "wasserstein")


def diagonal_w2_squared(
    mean_a: np.ndarray, std_a: np.ndarray, mean_b: np.ndarray, std_b: np.ndarray
) -> np.ndarray:
    """Squared 2-Wasserstein distance between diagonal Gaussians (rows of ``*_a`` vs ``*_b``)."""
    return np.sum((mean_a - mean_b) ** 2 + (std_a - std_b) ** 2, axis=-1)


def moments_from_sums(total: np.ndarray, total_sq: np.ndarray, count: np.ndarray) -> tuple:
    """Per-coordinate mean and standard deviation from sums, sums of squares and counts."""
    count = np.maximum(np.asarray(count, dtype=np.float64), 1.0)[..., None]
    mean = total / count
    std = np.sqrt(np.maximum(total_sq / count - mean**2, 0.0))
    return mean, std


def client_weights(
    weighting: str,
    counts: np.ndarray,
    client_sum: np.ndarray,
    client_sum_sq: np.ndarray,
    global_mean: np.ndarray | None,
    global_std: np.ndarray | None,
    tau: float = 1.0,
    count_cap: float = 1000.0,
) -> np.ndarray:
    """Aggregation weight of each client.

    Args:
        weighting: ``"uniform"`` (1), ``"count"`` (n_u / cap) or ``"wasserstein"`` (module
            docstring).
        counts: rows each client uploads, ``(n,)``.
        client_sum, client_sum_sq: per-client sums of its gradient rows and of their squares,
            ``(n, d)``.
        global_mean, global_std: the broadcast global statistics (``None`` before the first
            aggregate exists: Wasserstein then falls back to count weights).
        tau: temperature of the exponential discount.
        count_cap: public cap on counts; count weights are ``min(n_u, cap) / cap``.
    """
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")
    counts = np.asarray(counts, dtype=np.float64)
    if weighting == "uniform":
        return np.ones_like(counts)
    base = np.minimum(counts, count_cap) / count_cap
    if weighting == "count" or global_mean is None or global_std is None:
        return base
    mean, std = moments_from_sums(client_sum, client_sum_sq, counts)
    distance = diagonal_w2_squared(mean, std, global_mean[None, :], global_std[None, :])
    scale = tau * max(float(np.sum(global_std**2)), 1e-12)
    return base * np.exp(-distance / scale)
