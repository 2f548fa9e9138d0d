"""Client-side DP noise for a federation: the clients' half of ``DPTransport``'s local placement.

In one process ``DPRound`` clips and noises every client's update (``securefed.transport.dp``,
stages 1 and 2). On Flower, with ``placement="local"`` or ``"distributed"``, the noise must be
added where the update is made, before it leaves the node: :func:`noise_on_client` does exactly
what ``DPRound`` does for those placements (the same clipping, the same densifying, the same
per-client stream ``("dp", round, client)`` in seeded mode), so a seeded run gives the same noise
in both runtimes. Central placement needs nothing here: the server's ``DPRound`` clips and adds
the noise itself, as in one process.

The exact integer mechanisms of ``secagg+dp`` (the distributed discrete Gaussian and Skellam,
:mod:`securefed.transport.ddp`) run on the node too: :func:`integers_on_client` clips each
user's update, pads, rotates with the round's public signs, rounds conditionally and adds the
integer noise, exactly as ``DPRound`` does in one process (each user from its own stream
``("dp", round, "integers", user)`` in seeded mode, a CSPRNG in secure mode); the node then
encodes the integers at scale 1 and masks their ring sum, and the server reduces it modulo
``2^bits``, un-scales and rotates back. The mechanism's public parameters travel in the
message's config (:func:`mechanism_config`, :func:`mechanism_from_config`), the signs as an
array.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from securefed.errors import InsecureParameterError
from securefed.privacy.discrete import SecureIntegers
from securefed.privacy.noise import noise_source
from securefed.randomness import SeedTree
from securefed.transport.base import RowUpdates
from securefed.transport.ddp import DistributedIntegerMechanism
from securefed.transport.dp import (
    check_client_weights,
    client_noise_std,
    clip_row_updates,
    densify,
    noise_dense_blocks,
)

__all__ = [
    "client_noise_std",
    "integers_on_client",
    "mechanism_config",
    "mechanism_from_config",
    "noise_on_client",
]

_MECHANISM_FIELDS = (
    "mechanism",
    "bits",
    "clip",
    "gamma",
    "dim",
    "beta",
    "noise",
    "min_contributors",
)


def mechanism_config(mechanism: DistributedIntegerMechanism) -> dict[str, object]:
    """The round's integer mechanism as ``ConfigRecord`` scalars (``ddp_<field>``; public)."""
    return {f"ddp_{name}": getattr(mechanism, name) for name in _MECHANISM_FIELDS}


def mechanism_from_config(config: Mapping[str, object]) -> DistributedIntegerMechanism | None:
    """The integer mechanism a message states (validated), or ``None`` when it states none."""
    if "ddp_mechanism" not in config:
        return None
    kinds = {"mechanism": str, "bits": int, "dim": int, "min_contributors": int}
    return DistributedIntegerMechanism(
        **{name: kinds.get(name, float)(config[f"ddp_{name}"]) for name in _MECHANISM_FIELDS}
    )


def integers_on_client(
    updates: RowUpdates,
    mechanism: DistributedIntegerMechanism,
    signs: np.ndarray,
    round_id: int,
    seeds: SeedTree,
) -> RowUpdates:
    """Each user's clipped update as the mechanism's noisy integer vector, a ``(1, D)`` block.

    The same steps and streams as ``DPRound`` in one process, so a seeded run draws the same
    integers in both runtimes.

    Raises:
        InsecureParameterError: a weight other than 1, Skellam in secure mode (no cryptographic
            Poisson sampler), or rotation signs of the wrong length.
    """
    weights = check_client_weights(updates)
    if updates.weights is not None and np.any(weights != 1):
        raise InsecureParameterError(
            f"mechanism {mechanism.mechanism!r} takes unweighted updates (weight 1)"
        )
    signs = np.asarray(signs)
    if signs.shape != (mechanism.padded,):
        raise InsecureParameterError(
            f"the rotation's signs must be {mechanism.padded} values, got {signs.shape}"
        )
    clipped, _ = clip_row_updates(updates, mechanism.clip)
    secure = seeds.secure
    if secure and mechanism.mechanism != "discrete_gaussian":
        raise InsecureParameterError(
            f"mechanism {mechanism.mechanism!r} has no cryptographic sampler; in secure mode "
            "use mechanism='discrete_gaussian'"
        )
    source = SecureIntegers() if secure else None
    clients = clipped.clients.tolist()
    rows = np.empty((len(clients), mechanism.padded))
    for k, client in enumerate(clients):
        flat = clipped.client_block(k).reshape(1, -1)
        rng = source or seeds.generator("dp", round_id, "integers", int(client))
        rows[k] = mechanism.encode(flat, signs, rng)[0]
    return RowUpdates(
        clipped.clients,
        np.arange(len(clients) + 1, dtype=np.int64),
        np.zeros(len(clients), np.int64),
        rows,
        1,
        True,
    )


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
