"""Client-side DP noise for a federation: the clients' half of ``DPTransport``'s local placement.

In one process ``DPRound`` clips and noises every client's update (``securefed.transport.dp``,
stages 1 and 2). On Flower, with ``placement="local"`` or ``"distributed"``, the noise must be
added where the update is made, before it leaves the node: :func:`noise_on_client` does exactly
what ``DPRound`` does for those placements (the same clipping, the same densifying, the same
per-client stream ``("dp", round, client)`` in seeded mode), so a seeded run gives the same noise
in both runtimes. Central placement needs nothing here: the server's ``DPRound`` clips and adds
the noise itself, as in one process.
"""

from __future__ import annotations

import math

import numpy as np

from securefed.errors import InsecureParameterError
from securefed.privacy.noise import noise_source
from securefed.randomness import SeedTree
from securefed.transport.base import RowUpdates
from securefed.transport.dp import PLACEMENTS, clip_row_updates, densify


def client_noise_std(
    placement: str, clip: float, noise_multiplier: float, n_round_clients: int
) -> float:
    """Per-client noise std: ``sigma C`` (local) or ``sigma C / sqrt(n)`` (distributed).

    ``n_round_clients`` is the number of clients asked in the round, as in ``DPRound``.

    Raises:
        ValueError: central placement (no client-side noise) or an unknown one.
    """
    if placement not in PLACEMENTS or placement == "central":
        raise ValueError(f"client-side noise needs placement local or distributed, got {placement}")
    scale = noise_multiplier * clip
    if placement == "distributed":
        if n_round_clients < 1:
            raise ValueError(f"a distributed round needs clients, got {n_round_clients}")
        return scale / math.sqrt(n_round_clients)
    return scale


def noise_on_client(
    updates: RowUpdates,
    *,
    clip: float,
    std: float,
    round_id: int,
    seeds: SeedTree,
    secure: bool = False,
) -> RowUpdates:
    """Clip each client's whole update to ``clip``, densify, add ``N(0, std^2)`` everywhere.

    Raises:
        InsecureParameterError: a weight above 1 (the sum's sensitivity would exceed the clip), or
            ``secure`` with a seeded tree.
    """
    weights = updates.client_weights()
    if np.any(weights > 1):
        worst = int(np.argmax(weights))
        raise InsecureParameterError(
            f"client {int(updates.clients[worst])} has weight {weights[worst]:g} > 1: under "
            "DP each weight must be at most 1 so that a client moves the sum by at most the "
            "clip norm; rescale the weights (e.g. divide by their maximum)"
        )
    clipped, _ = clip_row_updates(updates, clip)
    dense = densify(clipped)
    values = dense.values.copy()
    n_rows = dense.n_rows
    if secure or seeds.secure:
        values += noise_source(seeds, secure=True).normal(std, values.shape)
    else:
        for k, client in enumerate(dense.clients.tolist()):
            block = slice(k * n_rows, (k + 1) * n_rows)
            values[block] += noise_source(seeds, "dp", round_id, int(client)).normal(
                std, (n_rows, dense.width)
            )
    return RowUpdates(dense.clients, dense.indptr, dense.rows, values, n_rows, True, dense.weights)
