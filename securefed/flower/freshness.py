"""A run's nonce transcript: what binds a node's long-term signatures to one Flower run.

A federation keeps its enrolment (one key registry) from run to run, and every Flower run counts
its rounds from 0, so a signature over the registry digest and the round only is as good in a
later run as in the one it was made in: a server that kept an earlier run's round secrets
replays that run's signed messages. Each node therefore contributes a fresh nonce to the run
(:func:`fresh_nonce`: operating-system entropy in secure mode, a seed-tree key in seeded mode),
the server relays every node's nonce to every node, and each node checks the relayed set
(:func:`checked_nonces`: its own nonce in its own place, one per member, distinct, of the right
length) before it signs anything over their digest (:func:`nonce_transcript`). A signature made
in another run covers a transcript without this node's fresh nonce, so it does not verify here
(the classic freshness argument of challenge-response authentication: each verifier's own
challenge is inside what the signer signed, cf. Bonawitz et al. 2017, Sec. 6, whose signatures
are "bound to the protocol instance").

Used by FedSlate's relay keys (``securefed.rl.flower_fedslate``: one member per role) and by the
malicious-server secure aggregation of FedMF and FedHPD (:mod:`securefed.flower.client`, one
member per node, named by its lowest hosted user).
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Mapping, Sequence

import numpy as np

from securefed.crypto import keys as kx
from securefed.randomness import SeedTree
from securefed.transport.secagg.signatures import SignatureError

NONCE_BYTES = 32
"""Each member's contribution to the run's transcript (256 bits: never repeats by chance)."""
NONCE_PREFIX = "nonce."
"""The message arrays that relay the nonces: ``nonce.<member>``, one uint8 row each."""


def fresh_nonce(tree: SeedTree, *path: str | int, secure: bool | None = None) -> bytes:
    """A member's fresh nonce: ``os.urandom`` in secure mode (drawn when asked, never derived
    from stored entropy), ``tree.key(*path)`` in seeded mode (reproducible; ``path`` must be
    one no other stream draws from, so a seeded run still equals the in-process run).

    Args:
        tree: the node's seed tree.
        path: the seeded-mode path (e.g. ``("flower-secagg", "nonce", member, run)``).
        secure: force the mode (``None``: ``tree.secure``).
    """
    if tree.secure if secure is None else secure:
        return os.urandom(NONCE_BYTES)
    return tree.key(*path, nbytes=NONCE_BYTES)


def nonce_transcript(nonces: Mapping[int, bytes], purpose: bytes) -> bytes:
    """SHA-256 of every member's nonce in member order (label, ``purpose``, then each member's
    id, 8-byte big-endian, and its nonce): what each node's run-bound signatures cover."""
    digest = hashlib.sha256(kx.PROTOCOL_LABEL + bytes(purpose))
    for member in sorted(nonces):
        digest.update(struct.pack(">q", int(member)) + bytes(nonces[member]))
    return digest.digest()


def nonce_arrays(nonces: Mapping[int, bytes], prefix: str = NONCE_PREFIX) -> dict[str, np.ndarray]:
    """The nonces as message arrays (``<prefix><member>``: its bytes as uint8)."""
    return {
        f"{prefix}{int(member)}": np.frombuffer(bytes(nonce), np.uint8).copy()
        for member, nonce in nonces.items()
    }


def relayed_nonces(
    arrays: Mapping[str, np.ndarray], prefix: str = NONCE_PREFIX
) -> dict[int, bytes]:
    """The nonces a message relays (``<prefix><member>`` arrays), by member.

    Raises:
        SignatureError: an entry whose member is not an integer.
    """
    relayed: dict[int, bytes] = {}
    for name, value in arrays.items():
        if not name.startswith(prefix):
            continue
        member = name[len(prefix) :]
        if not member.lstrip("-").isdigit():
            raise SignatureError(f"a relayed nonce names member {member!r}, not an integer")
        relayed[int(member)] = np.asarray(value, np.uint8).tobytes()
    return relayed


def checked_nonces(
    me: int,
    own: bytes,
    relayed: Mapping[int, bytes],
    *,
    members: Sequence[int] | None = None,
    member: str = "role",
) -> dict[int, bytes]:
    """``relayed`` once node ``me`` checked it: one nonce per member of the run (every one of
    ``members`` when the run's members are known to the node; at least ``me`` and one other
    otherwise), each ``NONCE_BYTES`` long, its own nonce ``own`` in its place, none repeated.

    Args:
        me: this node's member id.
        own: the nonce this node contributed.
        relayed: the nonces the server relayed, by member.
        members: the run's members, when the node knows them (FedSlate's roles).
        member: what a member is, for the messages (``"role"``, ``"node (lowest user)"``).

    Raises:
        SignatureError: naming the cause (a nonce dropped, added, substituted, repeated or of
            the wrong length).
    """
    found = sorted(int(m) for m in relayed)
    if members is not None and found != sorted(int(m) for m in members):
        want = sorted(int(m) for m in members)
        span = f"{want[0]} .. {want[-1]}" if want == list(range(want[0], want[-1] + 1)) else want
        raise SignatureError(
            f"node {me} was handed set-up nonces of {member}s {found}, the run has {span}: a "
            "nonce dropped or added by the server; refusing"
        )
    if me not in relayed:
        raise SignatureError(
            f"node {me} does not find its own set-up nonce in its place ({member} {me}) in the "
            f"nonces the server relayed (its nonce dropped, of {member}s {found[:8]}); refusing"
        )
    if members is None and len(found) < 2:
        raise SignatureError(
            f"node {me} was handed set-up nonces of {member}s {found} only: a run of secure "
            "aggregation has two members or more (the others' nonces dropped); refusing"
        )
    nonces = {int(m): bytes(n) for m, n in relayed.items()}
    short = sorted(m for m, nonce in nonces.items() if len(nonce) != NONCE_BYTES)
    if short:
        raise SignatureError(
            f"node {me} was handed set-up nonces of {member}s {short} that are not {NONCE_BYTES} "
            "bytes; refusing"
        )
    if nonces[me] != bytes(own):
        raise SignatureError(
            f"node {me} does not find its own set-up nonce in its place ({member} {me}) in the "
            "nonces the server relayed (a nonce substituted, or the nonces reordered); refusing"
        )
    if len(set(nonces.values())) != len(nonces):
        raise SignatureError(
            f"node {me} was handed set-up nonces that repeat (one {member}'s nonce copied into "
            "another's place); refusing"
        )
    return nonces
