"""The round's public neighbourhood graph (SecAgg+, Bell et al. 2020) and the unmasking plan.

Every party derives the same random ``k``-regular graph from public randomness of the round
(:func:`graph_seed`, :func:`neighbour_graph`); secrets are shared, and masks agreed, with
neighbours only. :func:`plan_unmasking` works out, from the graph and who submitted and who is
still present, which secrets the server must rebuild and whether it can.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

import numpy as np

from securefed.crypto import keys as kx


def graph_seed(round_id: int, clients: np.ndarray, public_randomness: bytes) -> bytes:
    """32 public bytes fixing the round's graph: SHA-256 of the round, its clients and a beacon."""
    digest = hashlib.sha256(kx.PROTOCOL_LABEL + b"graph/")
    digest.update(struct.pack(">q", round_id))
    digest.update(public_randomness)
    digest.update(np.asarray(clients, dtype=">i8").tobytes())
    return digest.digest()


def neighbour_graph(n_clients: int, k: int, seed: bytes) -> np.ndarray:
    """A random ``k``-regular symmetric graph: ``(n, k)`` neighbour positions, each row sorted.

    The Harary graph ``H(k, n)`` (ring position ``i`` joined to ``i +- 1 .. i +- floor(k/2)``, and
    to ``i + n/2`` when ``k`` is odd and ``n`` even) on a uniformly random relabelling of the
    clients drawn from ``seed``; symmetric by construction; the complete graph when ``k = n - 1``.
    """
    if n_clients < 2 or not 1 <= k <= n_clients - 1:
        raise ValueError(f"need 2 <= n and 1 <= k <= n - 1, got n={n_clients}, k={k}")
    if (n_clients * k) % 2:
        raise ValueError(f"no {k}-regular graph on {n_clients} vertices (n k must be even)")
    half = k // 2
    offsets = [d for step in range(1, half + 1) for d in (step, -step)]
    if k % 2:
        offsets.append(n_clients // 2)
    rng = np.random.Generator(np.random.PCG64(int.from_bytes(seed, "big")))
    ring = rng.permutation(n_clients)  # ring[i]: the client position at ring slot i
    slot = np.empty(n_clients, np.int64)
    slot[ring] = np.arange(n_clients)
    neighbour_slots = (slot[:, None] + np.asarray(offsets)[None, :]) % n_clients
    return np.sort(ring[neighbour_slots], axis=1)


@dataclass(frozen=True)
class UnmaskingPlan:
    """Which secrets the server must rebuild, and what stands in the way (positions, not ids).

    Attributes:
        contributors: clients whose masked input arrived (their ``b_u`` is needed).
        helpers: contributors still present to reveal shares.
        dropped_with_masks: non-contributors with a contributing neighbour (their ``s_u`` is
            needed).
        shortfalls: ``(position, secret, helpers available)`` for each needed secret with fewer than
            ``t`` helpers among its owner's neighbours.
        components: connected components of the graph restricted to the contributors.
    """

    contributors: np.ndarray
    helpers: np.ndarray
    dropped_with_masks: np.ndarray
    shortfalls: list[tuple[int, str, int]]
    components: int


def plan_unmasking(
    neighbours: np.ndarray, contributed: np.ndarray, present: np.ndarray, threshold: int
) -> UnmaskingPlan:
    """Work out the unmasking stage from the graph, who submitted and who is still present."""
    contributed = np.asarray(contributed, bool)
    helper = contributed & np.asarray(present, bool)
    helpers_near = helper[neighbours].sum(axis=1)
    contributing_near = contributed[neighbours].sum(axis=1)
    need_self = contributed
    need_pair = ~contributed & (contributing_near > 0)
    short = (need_self | need_pair) & (helpers_near < threshold)
    shortfalls = [
        (int(p), "self-mask seed" if need_self[p] else "mask key", int(helpers_near[p]))
        for p in np.flatnonzero(short)
    ]
    members = np.flatnonzero(contributed)
    components = 0
    if len(members):
        index = np.full(len(contributed), -1)
        index[members] = np.arange(len(members))
        sub = neighbours[members]
        keep = contributed[sub]
        rows = np.repeat(np.arange(len(members)), sub.shape[1])[keep.ravel()]
        cols = index[sub[keep]]
        from scipy.sparse import csr_matrix  # here: SciPy's import costs each ClientApp
        from scipy.sparse.csgraph import connected_components  # process seconds

        adjacency = csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(members),) * 2)
        components = int(connected_components(adjacency, directed=False)[0])
    return UnmaskingPlan(
        members, np.flatnonzero(helper), np.flatnonzero(need_pair), shortfalls, components
    )
