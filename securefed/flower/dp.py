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

from securefed.privacy.noise import noise_source
from securefed.randomness import SeedTree
from securefed.transport.base import RowUpdates
from securefed.transport.dp import (
    check_client_weights,
    client_noise_std,
    clip_row_updates,
    densify,
    noise_dense_blocks,
)

__all__ = ["client_noise_std", "noise_on_client"]


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

    ``std`` is :func:`~securefed.transport.dp.client_noise_std` of the round's placement.

    Raises:
        InsecureParameterError: a weight above 1 (the sum's sensitivity would exceed the clip), or
            ``secure`` with a seeded tree.
    """
    check_client_weights(updates)
    clipped, _ = clip_row_updates(updates, clip)
    secure_source = noise_source(seeds, secure=True) if secure or seeds.secure else None
    return noise_dense_blocks(
        densify(clipped),
        std,
        lambda client: secure_source or noise_source(seeds, "dp", round_id, client),
    )
