"""Signatures of the malicious-server variant: Ed25519 keys, the key registry, signed messages.

Bonawitz et al. (CCS 2017, Sec. 6 and Fig. 5, "active adversary") give every client a long-term
signing key whose public half every other client knows from set-up. A client signs its
AdvertiseKeys message ``(c_u^PK, s_u^PK)`` and, in the ConsistencyCheck round, the survivor set
``U_3`` it was told; every receiver checks the signatures against the registry. Without a signature
a server can put its own keys in a neighbour's place (reading the shares the victim seals to that
neighbour) or invent clients; with them, the only keys a client accepts are those of registered
clients, bound to the round.

There is no PKI here: :class:`KeyRegistry` is whatever the party that sets the federation up hands
every client (in one process, :class:`SecAggTransport` derives the simulated clients' signing keys
and hands each client the registry, never through the server's round). The guarantee holds only
if that registry is authentic: a server that can write it can register Sybils.

Every signed message starts with :data:`~securefed.crypto.keys.PROTOCOL_LABEL`, a purpose tag and
the round, so a signature of one purpose or one round is never valid for another.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from securefed.crypto import keys as kx
from securefed.errors import AggregationError
from securefed.randomness import SeedTree

SIGNATURE_BYTES = 64
VERIFY_KEY_BYTES = 32

PURPOSE_ADVERTISE = b"advertise-keys"
PURPOSE_CONSISTENCY = b"consistency-check"


class SignatureError(AggregationError):
    """A signature the protocol needs is missing, malformed, or does not verify.

    Raised by a client that refuses to go on (a forged advertisement, a survivor set that its
    signers did not sign, a signature from another round, an unregistered client).
    """


class ConsistencyError(AggregationError):
    """The ConsistencyCheck round failed: the client's survivor set lacks ``t`` consistent
    signatures of its neighbours, or the server's requests disagree with the set it signed."""


@dataclass(frozen=True, eq=False)
class SigningKey:
    """A client's long-term Ed25519 signing key (kept on the client's side)."""

    private: Ed25519PrivateKey

    @classmethod
    def generate(cls) -> SigningKey:
        """A fresh key from OpenSSL's CSPRNG (secure mode)."""
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_seed(cls, seed: bytes) -> SigningKey:
        """A key from 32 seed bytes (seeded mode: tests and benchmarks only)."""
        if len(seed) != 32:
            raise ValueError(f"an Ed25519 seed is 32 bytes, got {len(seed)}")
        return cls(Ed25519PrivateKey.from_private_bytes(bytes(seed)))

    @property
    def public(self) -> bytes:
        """The 32-byte verification key (what the registry holds)."""
        return self.private.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )

    def sign(self, message: bytes) -> bytes:
        """Ed25519 signature (RFC 8032, deterministic) of ``message``."""
        return self.private.sign(message)


@dataclass(frozen=True)
class KeyRegistry:
    """The clients' verification keys, given to every client at set-up (no PKI: see module).

    Attributes:
        keys: client id -> 32-byte Ed25519 verification key.
    """

    keys: Mapping[int, bytes] = field(default_factory=dict)

    def __post_init__(self) -> None:
        checked = {}
        for client, key in self.keys.items():
            if isinstance(client, bool) or not isinstance(client, int):
                raise ValueError(f"a registry's client ids are ints, got {client!r}")
            if not isinstance(key, bytes) or len(key) != VERIFY_KEY_BYTES:
                raise ValueError(
                    f"client {client}'s registered key must be {VERIFY_KEY_BYTES} bytes"
                )
            checked[int(client)] = Ed25519PublicKey.from_public_bytes(key)
        if len(set(self.keys.values())) != len(self.keys):
            raise ValueError("two clients of the key registry share a verification key")
        object.__setattr__(self, "_verifiers", checked)

    def __contains__(self, client: object) -> bool:
        return client in self.keys

    def verify(self, client: int, message: bytes, signature: bytes, *, what: str) -> None:
        """Check ``client``'s signature on ``message``.

        Args:
            what: the signed thing, named in the refusal (e.g. "advertisement").

        Raises:
            SignatureError: ``client`` is not registered (a Sybil), or the signature is
                malformed or does not verify (forged, on other content, or from another round).
        """
        verifier = self._verifiers.get(int(client))
        if verifier is None:
            raise SignatureError(
                f"client {client} is not in the key registry given at set-up: its {what} "
                "cannot be checked (an unregistered client may be the server's); refusing"
            )
        if not isinstance(signature, bytes) or len(signature) != SIGNATURE_BYTES:
            raise SignatureError(
                f"client {client}'s {what} carries no {SIGNATURE_BYTES}-byte Ed25519 signature; "
                "refusing"
            )
        try:
            verifier.verify(signature, message)
        except InvalidSignature as error:
            raise SignatureError(
                f"client {client}'s signature on its {what} does not verify (forged, on other "
                "content, or from another round); refusing"
            ) from error


def advertisement_message(round_id: int, client: int, c_public: bytes, s_public: bytes) -> bytes:
    """What a client signs at AdvertiseKeys: the round, its id and its two public keys."""
    return b"".join(
        (
            kx.PROTOCOL_LABEL,
            PURPOSE_ADVERTISE,
            struct.pack(">qq", round_id, client),
            bytes(c_public),
            bytes(s_public),
        )
    )


def consistency_message(round_id: int, survivors: Iterable[int]) -> bytes:
    """What a survivor signs at ConsistencyCheck: the round and the survivor set ``U_3`` told.

    The set is hashed (SHA-256 of the sorted ids) so the message stays short for large rounds.
    """
    ids = sorted({int(c) for c in survivors})
    digest = hashlib.sha256(struct.pack(f">{len(ids)}q", *ids)).digest()
    return b"".join(
        (
            kx.PROTOCOL_LABEL,
            PURPOSE_CONSISTENCY,
            struct.pack(">qq", round_id, len(ids)),
            digest,
        )
    )


class SimulatedSigners:
    """The set-up of simulated clients: each client's long-term signing key and the registry.

    Stands for what a real deployment does once, out of band, before any round: every client
    makes a signing key and the registry of verification keys reaches every client. A client's
    key is made the first time it takes part and kept for later rounds (from
    ``seeds.key("secagg", "signing", client)`` in seeded mode, from the OS otherwise). The
    server's round never holds this object: :class:`SecAggTransport` hands each simulated client
    its own key and the registry.
    """

    def __init__(self) -> None:
        self._keys: dict[int, SigningKey] = {}

    def set_up(
        self, clients: Iterable[int], seeds: SeedTree
    ) -> tuple[dict[int, SigningKey], KeyRegistry]:
        """The signing keys of ``clients`` and the registry of every client set up so far."""
        for client in clients:
            client = int(client)
            if client not in self._keys:
                self._keys[client] = (
                    SigningKey.generate()
                    if seeds.secure
                    else SigningKey.from_seed(seeds.key("secagg", "signing", client))
                )
        registry = KeyRegistry({c: key.public for c, key in self._keys.items()})
        return {int(c): self._keys[int(c)] for c in clients}, registry
