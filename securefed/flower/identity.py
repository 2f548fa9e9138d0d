"""Long-term identities of the users a SuperNode hosts, for malicious-server secure aggregation.

Bonawitz et al. (CCS 2017, Sec. 6) give every client a signing key registered at set-up; the
receivers of an advertisement or of a ConsistencyCheck signature check it against that registry
(:mod:`securefed.transport.secagg.signatures`). On Flower each node is ONE party of a round, and
its party id is the lowest of its users in the round (docs/flower.md), so the node holds the
long-term identity of every user it hosts and signs as the user whose id is the party's; the
registry holds every user's verification key, and each node checks it against the digest pinned
at enrolment (from the enrolment authority, never from the aggregation server).

Two ways to obtain them:

* **provisioned** (deployment): :func:`provision_identities` runs once, where the enrolment
  authority runs (not on the server), and writes ``registry.bin`` (every user's Ed25519
  verification key, public) and one ``identity-<partition>.bin`` per node (the 32-byte Ed25519
  seeds of that node's users, mode 0600); it returns the registry's digest, which every node is
  started with (``--node-config 'secagg-registry-digest=<hex>'``). :func:`load_identity` refuses
  a file its group or others may read, and a registry of another digest.
* **seeded** (tests and benchmarks only): :func:`seeded_identity` derives every user's key from
  ``seeds.key("secagg", "signing", user)``, as the in-process transport's simulated set-up does
  (``SimulatedSigners``). Whoever knows the seed (the server too) can sign as anyone: seeded
  mode is never private.

No pickle: the files are a magic line, a JSON header and raw key bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from securefed.errors import InsecureParameterError
from securefed.flower.credentials import write_private
from securefed.randomness import SeedTree
from securefed.transport.secagg.signatures import (
    VERIFY_KEY_BYTES,
    KeyRegistry,
    SignatureError,
    SigningKey,
)

REGISTRY_MAGIC = b"securefed-secagg-registry v1\n"
IDENTITY_MAGIC = b"securefed-secagg-identity v1\n"
SEED_BYTES = 32


@dataclass(frozen=True)
class NodeIdentity:
    """The long-term keys of one node's users and the registry checked against its pin.

    Attributes:
        signers: user id -> its :class:`SigningKey` (with the registry digest pinned).
        registry: every user's verification key.
    """

    signers: Mapping[int, SigningKey]
    registry: KeyRegistry

    def __post_init__(self) -> None:
        for user, key in self.signers.items():
            if self.registry.keys.get(int(user)) != key.public:
                raise SignatureError(
                    f"user {user}'s signing key is not the one the key registry holds for it: "
                    "the identity file and the registry come from different enrolments"
                )
            if key.registry_digest != self.registry.digest:
                raise SignatureError(
                    f"user {user}'s pinned registry digest does not match the registry"
                )

    def signer(self, user: int) -> SigningKey:
        """The identity of a hosted user.

        Raises:
            SignatureError: the node holds no identity for ``user``.
        """
        key = self.signers.get(int(user))
        if key is None:
            raise SignatureError(
                f"this node holds no long-term identity for user {user}: it cannot sign as its "
                "party (provision the node's identity file with its partition's users)"
            )
        return key


def _pinned(keys: Mapping[int, SigningKey], registry: KeyRegistry, digest: bytes) -> NodeIdentity:
    if registry.digest != digest:
        raise SignatureError(
            "the key registry does not match the digest this node pinned at enrolment "
            "(secagg-registry-digest): a registry forged or split by whoever handed it out; "
            "refusing"
        )
    for key in keys.values():
        key.pin_registry(digest)
    return NodeIdentity(dict(keys), registry)


@lru_cache(maxsize=8)
def _seeded_keys(seed: int, n_users: int) -> tuple[tuple[SigningKey, ...], KeyRegistry]:
    tree = SeedTree(seed)
    keys = tuple(SigningKey.from_seed(tree.key("secagg", "signing", u)) for u in range(n_users))
    return keys, KeyRegistry({u: key.public for u, key in enumerate(keys)})


def seeded_identity(seeds: SeedTree, users, n_users: int) -> NodeIdentity:
    """The identities of ``users`` and the registry of all ``n_users``, from the seed tree.

    Seeded mode only (tests and benchmarks): the registry's digest is pinned from the same
    derivation, which anyone knowing the seed repeats.

    Raises:
        InsecureParameterError: a secure (OS-entropy) seed tree: provision identities instead.
    """
    if seeds.secure or seeds.seed is None:
        raise InsecureParameterError(
            "in secure mode a node's long-term identities are provisioned out of band "
            "(securefed.flower.identity.provision_identities), not derived from a seed: give "
            "the node secagg-identity-path, secagg-registry-path and secagg-registry-digest"
        )
    keys, registry = _seeded_keys(int(seeds.seed), int(n_users))
    hosted = {int(u): keys[int(u)] for u in np.asarray(users, np.int64).tolist()}
    return _pinned(hosted, registry, registry.digest)


def _header(magic: bytes, header: dict, body: bytes) -> bytes:
    return magic + json.dumps(header, sort_keys=True).encode() + b"\n" + body


def _read(path: Path, magic: bytes) -> tuple[dict, bytes]:
    data = path.read_bytes()
    if not data.startswith(magic):
        raise ValueError(f"{path} is not a {magic.decode().strip()!r} file")
    line, _, body = data[len(magic) :].partition(b"\n")
    header = json.loads(line)
    if hashlib.sha256(body).hexdigest() != header.get("sha256"):
        raise ValueError(f"{path} is truncated or altered (its SHA-256 does not match its header)")
    return header, body


def provision_identities(directory: str | os.PathLike, partitions: Mapping[int, object]) -> str:
    """Make every user's long-term identity (OS entropy) and write the enrolment's files.

    Args:
        directory: where to write ``registry.bin`` and ``identity-<partition>.bin`` (0600).
        partitions: partition id -> the user ids that partition's node hosts (disjoint).

    Returns:
        The registry's digest (hex): what every node pins (``secagg-registry-digest``).
    """
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    keys: dict[int, SigningKey] = {}
    for users in partitions.values():
        for user in np.asarray(users, np.int64).tolist():
            if user in keys:
                raise ValueError(f"user {user} is in two partitions")
            keys[user] = SigningKey.generate()
    registry = KeyRegistry({u: k.public for u, k in keys.items()})
    ids = sorted(keys)
    body = np.asarray(ids, ">i8").tobytes() + b"".join(keys[u].public for u in ids)
    header = {"users": len(ids), "sha256": hashlib.sha256(body).hexdigest()}
    (out / "registry.bin").write_bytes(_header(REGISTRY_MAGIC, header, body))
    for partition, users in partitions.items():
        hosted = np.asarray(users, np.int64).tolist()
        seeds = b"".join(_seed_of(keys[u]) for u in hosted)
        body = np.asarray(hosted, ">i8").tobytes() + seeds
        header = {"users": len(hosted), "sha256": hashlib.sha256(body).hexdigest()}
        write_private(out / f"identity-{int(partition)}.bin", _header(IDENTITY_MAGIC, header, body))
    return registry.digest.hex()


def _seed_of(key: SigningKey) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )


def load_registry(path: str | os.PathLike) -> KeyRegistry:
    """The key registry of ``registry.bin`` (public; its digest is checked by the caller)."""
    header, body = _read(Path(path), REGISTRY_MAGIC)
    n = int(header["users"])
    if len(body) != n * (8 + VERIFY_KEY_BYTES):
        raise ValueError(f"{path}: {n} users need {n * (8 + VERIFY_KEY_BYTES)} bytes")
    ids = np.frombuffer(body[: 8 * n], ">i8").tolist()
    raw = body[8 * n :]
    return KeyRegistry(
        {u: raw[i * VERIFY_KEY_BYTES : (i + 1) * VERIFY_KEY_BYTES] for i, u in enumerate(ids)}
    )


def load_identity(
    identity_path: str | os.PathLike, registry_path: str | os.PathLike, digest_hex: str
) -> NodeIdentity:
    """A node's provisioned identities, checked against the registry and the pinned digest.

    Raises:
        InsecureParameterError: the identity file is readable by its group or others.
        SignatureError: the registry does not match the pinned digest, or a key not in it.
        ValueError: a malformed, truncated or altered file; no digest pinned.
    """
    path = Path(identity_path)
    if stat.S_IMODE(path.stat().st_mode) & 0o077:
        raise InsecureParameterError(
            f"{path} holds signing keys and is readable by its group or others: chmod 600 it"
        )
    if not digest_hex:
        raise ValueError(
            "a node needs the registry digest pinned at enrolment (secagg-registry-digest): "
            "without it it cannot tell an authentic registry from one the server forged"
        )
    header, body = _read(path, IDENTITY_MAGIC)
    n = int(header["users"])
    if len(body) != n * (8 + SEED_BYTES):
        raise ValueError(f"{path}: {n} users need {n * (8 + SEED_BYTES)} bytes")
    ids = np.frombuffer(body[: 8 * n], ">i8").tolist()
    raw = body[8 * n :]
    keys = {
        u: SigningKey.from_seed(raw[i * SEED_BYTES : (i + 1) * SEED_BYTES])
        for i, u in enumerate(ids)
    }
    return _pinned(keys, load_registry(registry_path), bytes.fromhex(digest_hex))


def node_identity(
    node_config: Mapping[str, object], seeds: SeedTree, users, n_users: int
) -> NodeIdentity:
    """The hosted users' long-term identities: the files provisioned at enrolment, named in the
    node config (``secagg-identity-path``, ``secagg-registry-path``,
    ``secagg-registry-digest``), else, in seeded mode only, derived from the seed
    (:func:`seeded_identity`, which refuses a secure tree).
    """
    if "secagg-identity-path" in node_config:
        return load_identity(
            str(node_config["secagg-identity-path"]),
            str(node_config["secagg-registry-path"]),
            str(node_config.get("secagg-registry-digest", "")),
        )
    return seeded_identity(seeds, users, n_users)


PURPOSE_PARTY_MEMBERS = b"flower-party-members"


def members_message(
    round_id: int, party: int, n_members: int, *, registry: bytes, run: bytes = b""
) -> bytes:
    """What a node signs (as its party) with its masked sum: how many users that sum holds.

    Every node checks, before it unmasks, that the parties it endorsed hold together at least
    the contributors its distributed noise share was calibrated for; the count is signed by the
    party, so the server cannot inflate it (a corrupt node can: the colluder bound). ``run``:
    the run's nonce transcript (:mod:`securefed.flower.freshness`), so that a count signed in
    an earlier run does not verify in this one.
    """
    from securefed.crypto import keys as kx

    return b"".join(
        (
            kx.PROTOCOL_LABEL,
            PURPOSE_PARTY_MEMBERS,
            bytes(registry),
            np.asarray([round_id, party, n_members], ">i8").tobytes(),
            bytes(run),
        )
    )
