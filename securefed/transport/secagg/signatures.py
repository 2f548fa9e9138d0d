"""Authentication of the malicious-server variant: the key registry, Ed25519 signatures or MACs.

Bonawitz et al. (CCS 2017, Sec. 6 and Fig. 5, "active adversary") give every client a long-term
key whose public half every other client knows from set-up. A client authenticates its
AdvertiseKeys message ``(c_u^PK, s_u^PK)`` and, in the ConsistencyCheck round, the survivor set
``U_3`` it was told; every receiver checks them against the registry. Without that a server can
put its own keys in a neighbour's place (reading the shares the victim seals to that neighbour)
or invent clients; with it, the only keys a client accepts are those of registered clients, bound
to the round.

Two ways to authenticate (:data:`AUTH_MODES`, ``SecAggConfig.auth``), *not* equivalent:

* ``"signatures"`` (the default, Bonawitz et al.'s): Ed25519. A client signs its advertisement
  once and the survivor set once; each receiver verifies ``k`` advertisements and (up to) ``t``
  survivor-set signatures, 144 us each on the idle machine, more than the round's X25519
  agreements. A stolen signing key lets its thief sign only as its owner.
* ``"macs"`` (an explicit opt-in): HMAC-SHA256 under a *static pairwise key*. Each client's
  long-term identity also holds a static X25519 key, whose public half is in the registry; clients
  ``u`` and ``v`` share ``K_uv = HKDF(X25519(z_u, Z_v), info = label, "static-pairwise", {u,
  v})``, computed the first time they are neighbours and kept with the identity (set-up cost: one
  agreement per pair and side, once; :attr:`SigningKey.setup_pairs`). Client ``u`` sends each
  neighbour ``v`` the tag ``HMAC(K_uv^adv, label, "advertise-keys-mac", round, u, v, c_u, s_u)``
  and, at ConsistencyCheck, ``HMAC(K_uv^cc, label, "consistency-check-mac", round, u, v, |U_3|,
  SHA-256(U_3))`` (``K^adv || K^cc``: one 64-byte HKDF per pair). ``v`` accepts an advertisement
  or a survivor set of ``u`` only with a valid tag of ``u`` addressed to ``v``.

What the server can and cannot forge with MACs. It holds every public key and every tag it relays,
never a static private key, so it cannot compute ``K_uv`` for any pair of honest clients
(computational Diffie-Hellman on X25519) and cannot make a tag of ``u`` for ``v`` on content ``u``
did not authenticate (HMAC-SHA256 is a PRF). Replays do not help: the tag binds the purpose, the
round, the sender and the recipient, so a tag of another round, of the other purpose, reflected
back to its own sender (``K_uv`` is symmetric: without ``u, v`` in order inside the tag, ``u``'s
own tag to ``v`` would pass as ``v``'s to ``u``), or forwarded to a third client fails. What MACs
give up is transferability: only ``v`` can check ``u``'s tag to ``v``, so the server cannot check
advertisements early (it can with signatures), and a tag proves nothing to a third party; the
protocol never needs either, since each check is a client checking its own neighbours. A corrupt
neighbour ``v`` can tag anything to ``u``, exactly as it can sign anything: the bound on corrupt
neighbours (fewer than ``2t - k``) is the same. What MACs do *not* give is resistance to
key-compromise impersonation: ``K_uv`` is computed from either side's static private key, so
whoever holds ``z_u`` (a thief of ``u``'s own long-term key) tags anything as any ``v`` to ``u``,
and so relays its own keys as every neighbour's and decodes ``u``'s vector in every later round
(tests/test_secagg_active_round2.py); with signatures it cannot sign as ``v``. Forward secrecy of
the masks is kept: the static keys only authenticate; the masks and the shares still come from the
round's ephemeral ``c`` and ``s`` keys, so a static key stolen later opens no past round (it lets
its thief impersonate the client in later rounds, as a stolen signing key would).

Signed epoch sessions (``auth="signatures"`` with ``SecAggConfig.graph_epoch = E > 1``, opt-in):
pair keys kept for an epoch under the default authentication (:class:`EpochSession`). In the
first round of a session (epoch ``r // E``, the neighbourhood the client is told) client ``u``
signs one advertisement, :func:`epoch_advertisement_message`: the round, the epoch and ``E``,
the registry digest, ``u``, SHA-256 of its neighbourhood, its round keys ``c_u``, ``s_u`` and a
fresh epoch X25519 key ``e_u``. Each neighbour verifies it (``k`` Ed25519 verifications per
session, as in one default round) and the pair derives ``K_uv`` from ``X25519(e_u, e_v)``
(:func:`epoch_pair_keys`); every later round of the epoch authenticates the advertisement and
the survivor set with the MAC messages above under ``K_uv``. What that keeps: a malicious
server (no client secret) cannot compute ``K_uv`` (CDH on keys the registry's signatures
vouch for), cannot replay an old epoch (the signature binds round and epoch; a client erases an
ended epoch's keys and never goes back: :meth:`SigningKey.epoch_session`), cannot relabel the
graph (the signature binds the signer's neighbourhood; the client pins the neighbourhood it was
told), cannot reflect a tag (sender and recipient bound in order) and gets nothing by asking
twice in one round (a client advertises once per round, in increasing rounds). The round's
``c``, ``s`` and ``b`` stay fresh: ``K_uv`` derives no mask or share, so a mask key the server
rebuilds after a dropout in round ``t`` says nothing of round ``t + 1``. What it gives up against
the default: a thief of a client's *epoch state* (its memory during the epoch) tags as any
neighbour to it until the epoch ends (key-compromise impersonation bounded by the epoch; under
``auth="macs"`` a thief of the long-term key does so for good), the graph is known ``E`` rounds
ahead, and a contributor count (``min_contributors``) is impossible (a MAC convinces only its
recipient): hence opt-in (SECURITY.md, "Signed epoch sessions").

There is no PKI here: :class:`KeyRegistry` is whatever is handed to a client, and the client
checks it against the digest (:attr:`KeyRegistry.digest`) it pinned at enrolment
(:meth:`SigningKey.pin_registry`, from the enrolment authority, not the aggregation server), and
binds that digest into everything it authenticates, so a registry forged or split by whoever
hands it out is refused. In one process :class:`SimulatedSigners` plays the enrolment
authority. The enrolment authority itself is trusted: it binds ids to keys.

Every signed or tagged message starts with :data:`~securefed.crypto.keys.PROTOCOL_LABEL`, a
purpose tag and the round, so an authenticator of one purpose or one round is never valid for
another. Where one registry outlives a run (Flower: every run counts its rounds from 0), the
advertisement and ConsistencyCheck signatures also bind the run's nonce transcript
(``run``: :mod:`securefed.flower.freshness`), which holds every verifier's own fresh nonce, so a
signature of another run is never valid in this one.
"""

from __future__ import annotations

import contextlib
import hashlib
import struct
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
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
REGISTRY_DIGEST_BYTES = 32
MAC_BYTES = kx.MAC_BYTES

AUTH_MODES = ("signatures", "macs")
"""How the malicious-server variant authenticates (``SecAggConfig.auth``; module docstring)."""

PURPOSE_ADVERTISE = b"advertise-keys"
PURPOSE_CONSISTENCY = b"consistency-check"
PURPOSE_ADVERTISE_MAC = b"advertise-keys-mac"
PURPOSE_CONSISTENCY_MAC = b"consistency-check-mac"
PURPOSE_STATIC_PAIR = b"static-pairwise"
PURPOSE_STATIC_KEY = b"static-x25519"
PURPOSE_REGISTRY = b"key-registry"
PURPOSE_EPOCH_ADVERTISE = b"epoch-advertise-keys"
PURPOSE_EPOCH_PAIR = b"epoch-pairwise"
PURPOSE_NEIGHBOURHOOD = b"neighbourhood"


class SignatureError(AggregationError):
    """A signature or MAC the protocol needs is missing, malformed, or does not verify.

    Raised by a client that refuses to go on (a forged advertisement, a survivor set that its
    signers did not sign, a signature from another round, an unregistered client).
    """


class ConsistencyError(AggregationError):
    """The ConsistencyCheck round failed: the client's survivor set lacks ``t`` consistent
    signatures of its neighbours, or the server's requests disagree with the set it signed."""


@dataclass(frozen=True, eq=False)
class SigningKey:
    """A client's long-term identity (kept on the client's side): an Ed25519 signing key and a
    static X25519 key derived from it, with the static pairwise MAC keys it has agreed so far.

    The static X25519 private key is ``HKDF(Ed25519 seed, info = label, "static-x25519")``: one
    long-term secret, two keys for two purposes.
    """

    private: Ed25519PrivateKey
    static: kx.KeyPair = field(init=False, repr=False)
    _pairwise: dict[int, tuple[bytes, tuple[kx.MacKey, kx.MacKey]]] = field(
        init=False, repr=False, default_factory=dict
    )
    _enrolment: dict[str, bytes] = field(init=False, repr=False, default_factory=dict)
    _epochs: dict[tuple[int, tuple[int, ...]], EpochSession] = field(
        init=False, repr=False, default_factory=dict
    )
    _epoch_clock: dict[str, int] = field(
        init=False, repr=False, default_factory=lambda: {"epoch": -1, "round": -1, "opened": 0}
    )

    def __post_init__(self) -> None:
        seed = self.private.private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )
        static_seed = kx.derive_key(seed, kx.PROTOCOL_LABEL + PURPOSE_STATIC_KEY)
        object.__setattr__(self, "static", kx.keypair_from_seed(static_seed))

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

    @property
    def static_public(self) -> bytes:
        """The 32-byte static X25519 public key (what the registry holds for MACs)."""
        return self.static.public

    @property
    def registry_digest(self) -> bytes | None:
        """The digest of the key registry pinned at enrolment (:meth:`pin_registry`), if any."""
        return self._enrolment.get("registry")

    def pin_registry(self, digest: bytes) -> None:
        """Pin the enrolment authority's digest of the key registry (:attr:`KeyRegistry.digest`).

        What the enrolment authority (not the aggregation server) hands the client with its
        identity, and again whenever the registry grows. A client takes part only with a
        registry of that digest (:class:`ClientAuthentication`), and binds it into every
        message it authenticates, so a registry the server forged or split is refused.

        Raises:
            ValueError: not a 32-byte digest.
        """
        if not isinstance(digest, bytes) or len(digest) != REGISTRY_DIGEST_BYTES:
            raise ValueError(f"a registry digest is {REGISTRY_DIGEST_BYTES} bytes (SHA-256)")
        self._enrolment["registry"] = digest

    @property
    def setup_pairs(self) -> int:
        """How many static pairwise keys this identity has agreed (one X25519 each, once)."""
        return len(self._pairwise)

    def sign(self, message: bytes) -> bytes:
        """Ed25519 signature (RFC 8032, deterministic) of ``message``."""
        return self.private.sign(message)

    @property
    def epoch_sessions_opened(self) -> int:
        """How many epoch sessions this identity opened (one Ed25519 signature each, and one
        verification and one X25519 agreement per neighbour: :class:`EpochSession`)."""
        return self._epoch_clock["opened"]

    def epoch_session(
        self,
        epoch: int,
        neighbours: tuple[int, ...],
        round_id: int,
        keypair: Callable[[], kx.KeyPair],
    ) -> tuple[EpochSession, bool]:
        """The session of ``(epoch, neighbours)`` for ``round_id``, and whether it opens now.

        The client's session of the epoch serves again if it has this very neighbourhood and
        completed its first round; otherwise a new one opens with a fresh epoch key from
        ``keypair()`` and replaces it (one session at a time: a neighbourhood left and met
        again is signed afresh). Every session of an earlier epoch is erased when a later
        epoch begins.

        Raises:
            SignatureError: ``epoch`` is earlier than one this identity took part in (its keys
                are erased; going back would let a server replay an old epoch).
            AggregationError: ``round_id`` is not later than a round this identity advertised
                in already under epoch sessions (a server asking twice in one round, or
                going back, gets nothing).
        """
        clock = self._epoch_clock
        epoch, round_id = int(epoch), int(round_id)
        if epoch < clock["epoch"]:
            raise SignatureError(
                f"round {round_id} belongs to epoch {epoch}, but this client is in epoch "
                f"{clock['epoch']}: an ended epoch's keys are erased and never used again "
                "(a server replaying an old epoch); refusing"
            )
        if round_id <= clock["round"]:
            raise AggregationError(
                f"this client advertised in round {clock['round']} already: with pair keys kept "
                f"for an epoch it advertises once per round, in increasing rounds, so round "
                f"{round_id} (asked twice, or going back) gets nothing"
            )
        if epoch > clock["epoch"]:
            self._epochs.clear()  # the ended epochs' keys are erased
            clock["epoch"] = epoch
        clock["round"] = round_id
        key = (epoch, tuple(neighbours))
        session = self._epochs.get(key)
        if session is not None and session.complete:
            return session, False
        session = EpochSession(epoch, tuple(neighbours), round_id, keypair())
        self._epochs.clear()  # one session at a time (the replaced one's keys are erased)
        self._epochs[key] = session
        clock["opened"] += 1
        return session, True

    def pairwise_key(
        self, me: int, peer: int, peer_static: bytes
    ) -> tuple[tuple[kx.MacKey, kx.MacKey], bool]:
        """``(K_uv^adv, K_uv^cc)`` with ``peer`` (from one 64-byte HKDF), and whether they were
        agreed just now.

        Agreed once per peer and kept; agreed again if the registry's key for ``peer`` changed.

        Raises:
            InvalidPublicKeyError: ``peer_static`` is malformed, non-canonical or of low order.
        """
        cached = self._pairwise.get(int(peer))
        if cached is not None and cached[0] == peer_static:
            return cached[1], False
        shared = kx.agree(self.static.private, peer_static, peer=f"client {peer}'s static key")
        low, high = sorted((int(me), int(peer)))
        info = kx.PROTOCOL_LABEL + PURPOSE_STATIC_PAIR + b"/" + struct.pack(">qq", low, high)
        key = kx.derive_key(shared, info, length=2 * kx.KEY_BYTES)
        keys = (kx.MacKey(key[: kx.KEY_BYTES]), kx.MacKey(key[kx.KEY_BYTES :]))
        self._pairwise[int(peer)] = (bytes(peer_static), keys)
        return keys, True


@dataclass(eq=False)
class EpochSession:
    """What a client keeps of one epoch with one neighbourhood (``auth="signatures"`` with
    ``graph_epoch > 1``; kept in its :class:`SigningKey`, never shown to the server).

    In the session's first round the client signs, with its long-term Ed25519 key, one
    advertisement binding the round, the epoch, its neighbourhood and, beside its round keys
    ``c`` and ``s``, a fresh *epoch* X25519 public key ``e_u``
    (:func:`epoch_advertisement_message`). A neighbour ``v`` that verifies it agrees
    ``K_uv = HKDF(X25519(e_u, e_v), label, "epoch-pairwise", registry, epoch, graph_epoch,
    {u, v}, e_low, e_high)`` (:func:`epoch_pair_keys`): ``K^adv || K^cc``. Every later round of
    the epoch authenticates the advertisement and the survivor set with HMAC-SHA256 under
    ``K_uv`` (the messages of ``auth="macs"``, which bind the round, the sender and the
    recipient). The round's ``c``, ``s`` and ``b`` stay fresh each round: ``K_uv`` only
    authenticates, no mask or share comes from it.

    Attributes:
        epoch: ``round // graph_epoch``.
        neighbours: the client's neighbourhood (sorted ids), pinned for the session.
        first_round: the round that opened it (signed advertisements are due in it only).
        keypair: the epoch X25519 key pair.
        keys: ``neighbour -> (K^adv, K^cc)``, once every neighbour's signed advertisement of
            the first round verified (:attr:`complete`).
        pending: the keys agreed so far in the first round.
    """

    epoch: int
    neighbours: tuple[int, ...]
    first_round: int
    keypair: kx.KeyPair
    keys: dict[int, tuple[kx.MacKey, kx.MacKey]] = field(default_factory=dict)
    pending: dict[int, tuple[kx.MacKey, kx.MacKey]] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        """Whether every neighbour's signed epoch advertisement verified."""
        return bool(self.keys)


def neighbourhood_digest(neighbours: Iterable[int]) -> bytes:
    """SHA-256 of a neighbourhood's sorted ids (8-byte big-endian each)."""
    ids = sorted(int(v) for v in neighbours)
    return hashlib.sha256(
        kx.PROTOCOL_LABEL + PURPOSE_NEIGHBOURHOOD + struct.pack(f">{len(ids)}q", *ids)
    ).digest()


def epoch_advertisement_message(
    round_id: int,
    epoch: int,
    graph_epoch: int,
    sender: int,
    neighbours: Sequence[int],
    c_public: bytes,
    s_public: bytes,
    epoch_public: bytes,
    *,
    registry: bytes,
) -> bytes:
    """What a client signs in the first round of an epoch session: the round, the epoch and
    its length, the registry digest, its id, its neighbourhood (the graph it is told) and its
    three public keys (round ``c`` and ``s``, epoch ``e``)."""
    return b"".join(
        (
            kx.PROTOCOL_LABEL,
            PURPOSE_EPOCH_ADVERTISE,
            bytes(registry),
            struct.pack(">qqqq", round_id, epoch, graph_epoch, sender),
            neighbourhood_digest(neighbours),
            bytes(c_public),
            bytes(s_public),
            bytes(epoch_public),
        )
    )


EPOCH_ADVERT_HEADER = kx.PUBLIC_KEY_BYTES + SIGNATURE_BYTES
"""Bytes of a signed epoch advertisement before its neighbour ids (8 bytes each)."""


def pack_epoch_advertisement(
    epoch_public: bytes, signature: bytes, neighbours: Sequence[int]
) -> bytes:
    """The authenticator of an epoch session's first round: ``e || signature || ids``."""
    return (
        bytes(epoch_public)
        + bytes(signature)
        + struct.pack(f">{len(neighbours)}q", *(int(v) for v in neighbours))
    )


def unpack_epoch_advertisement(sender: int, blob: bytes) -> tuple[bytes, bytes, tuple[int, ...]]:
    """``(e, signature, neighbours)`` of ``sender``'s signed epoch advertisement.

    Raises:
        SignatureError: not a signed epoch advertisement (e.g. a MAC where the epoch's first
            round needs a signature).
    """
    body = len(blob) - EPOCH_ADVERT_HEADER if isinstance(blob, bytes) else -1
    if body <= 0 or body % 8:
        raise SignatureError(
            f"client {sender}'s advertisement carries no signed epoch advertisement (epoch key, "
            f"{SIGNATURE_BYTES}-byte Ed25519 signature, neighbourhood), which the first round "
            "of an epoch session needs; refusing"
        )
    ids = struct.unpack(f">{body // 8}q", blob[EPOCH_ADVERT_HEADER:])
    return (
        blob[: kx.PUBLIC_KEY_BYTES],
        blob[kx.PUBLIC_KEY_BYTES : EPOCH_ADVERT_HEADER],
        tuple(int(v) for v in ids),
    )


def epoch_pair_keys(
    me: int,
    peer: int,
    session: EpochSession,
    peer_epoch_public: bytes,
    *,
    graph_epoch: int,
    registry: bytes,
) -> tuple[kx.MacKey, kx.MacKey]:
    """``(K_uv^adv, K_uv^cc)`` of an epoch session (:class:`EpochSession`), from one X25519 of
    the two epoch keys and one 64-byte HKDF bound to the registry, the epoch and the pair.

    Raises:
        InvalidPublicKeyError: ``peer_epoch_public`` is malformed, non-canonical or of low order.
    """
    shared = kx.agree(session.keypair.private, peer_epoch_public, peer=f"client {peer}'s epoch key")
    (low, e_low), (high, e_high) = sorted(
        ((int(me), session.keypair.public), (int(peer), bytes(peer_epoch_public)))
    )
    info = b"".join(
        (
            kx.PROTOCOL_LABEL,
            PURPOSE_EPOCH_PAIR,
            bytes(registry),
            struct.pack(">qqqq", session.epoch, graph_epoch, low, high),
            e_low,
            e_high,
        )
    )
    key = kx.derive_key(shared, info, length=2 * kx.KEY_BYTES)
    return kx.MacKey(key[: kx.KEY_BYTES]), kx.MacKey(key[kx.KEY_BYTES :])


@dataclass(frozen=True)
class KeyRegistry:
    """The clients' long-term public keys, given to every client at set-up (no PKI: see module).

    Attributes:
        keys: client id -> 32-byte Ed25519 verification key (``auth="signatures"``).
        statics: client id -> 32-byte static X25519 public key (``auth="macs"``); checked
            canonical and not of low order.
        shared_checks: remember every signature that verified, so that the clients holding
            this very object verify each distinct ``(client, message, signature)`` once. A
            shortcut of the simulation only (:class:`SimulatedSigners`: its simulated clients
            share one registry object in one process; Ed25519 verification is a deterministic
            function of the key, the message and the signature, so the answers are the same);
            a real client, holding its own registry, verifies every signature it needs. Not
            part of the digest.
    """

    keys: Mapping[int, bytes] = field(default_factory=dict)
    statics: Mapping[int, bytes] = field(default_factory=dict)
    shared_checks: bool = field(default=False, compare=False)

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
        for client, key in self.statics.items():
            if isinstance(client, bool) or not isinstance(client, int):
                raise ValueError(f"a registry's client ids are ints, got {client!r}")
            kx.check_public_key(key, owner=f"client {client}'s registered static key")
        if len(set(self.statics.values())) != len(self.statics):
            raise ValueError("two clients of the key registry share a static key")
        object.__setattr__(self, "_verifiers", checked)
        object.__setattr__(self, "_digest", registry_digest(self.keys, self.statics))
        object.__setattr__(self, "_verified", set())

    @property
    def digest(self) -> bytes:
        """SHA-256 of the whole registry (:func:`registry_digest`): what a client pins at
        enrolment and binds into every message it authenticates."""
        return self._digest

    def __contains__(self, client: object) -> bool:
        return client in self.keys

    def static(self, client: int, *, what: str) -> bytes:
        """``client``'s registered static X25519 key.

        Raises:
            SignatureError: ``client`` has none (not registered: a Sybil).
        """
        key = self.statics.get(int(client))
        if key is None:
            raise SignatureError(
                f"client {client} is not in the key registry given at set-up: its {what} "
                "cannot be checked (an unregistered client may be the server's); refusing"
            )
        return key

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
        remembered = (int(client), bytes(message), signature)
        if self.shared_checks and remembered in self._verified:
            return
        try:
            verifier.verify(signature, message)
        except InvalidSignature as error:
            raise SignatureError(
                f"client {client}'s signature on its {what} does not verify (forged, on other "
                "content, or from another round); refusing"
            ) from error
        if self.shared_checks:
            self._verified.add(remembered)


def registry_digest(keys: Mapping[int, bytes], statics: Mapping[int, bytes]) -> bytes:
    """SHA-256 of a registry's entries in id order: ``(id, verification key, static key)``.

    A client missing from one of the two maps counts with an empty key, so two registries that
    differ in any entry, or in who is in them, have different digests.
    """
    digest = hashlib.sha256(kx.PROTOCOL_LABEL + PURPOSE_REGISTRY)
    for client in sorted({int(c) for c in keys} | {int(c) for c in statics}):
        key, static = keys.get(client, b""), statics.get(client, b"")
        digest.update(struct.pack(">qBB", client, len(key), len(static)) + key + static)
    return digest.digest()


def advertisement_message(
    round_id: int,
    client: int,
    c_public: bytes,
    s_public: bytes,
    *,
    registry: bytes,
    run: bytes = b"",
) -> bytes:
    """What a client signs at AdvertiseKeys: the round, the registry digest it pinned, its id
    and its two public keys, and the run's nonce transcript when rounds of several runs share
    one registry (``run``: :func:`securefed.flower.freshness.nonce_transcript`, 32 bytes, on
    Flower; empty in one process). Every other field has a fixed length, so a message with a
    transcript never equals one without."""
    return b"".join(
        (
            kx.PROTOCOL_LABEL,
            PURPOSE_ADVERTISE,
            bytes(registry),
            struct.pack(">qq", round_id, client),
            bytes(c_public),
            bytes(s_public),
            bytes(run),
        )
    )


def advertisement_tag_message(
    round_id: int,
    sender: int,
    recipient: int,
    c_public: bytes,
    s_public: bytes,
    *,
    registry: bytes,
) -> bytes:
    """What ``sender`` MACs for ``recipient`` at AdvertiseKeys (``auth="macs"``)."""
    return b"".join(
        (
            kx.PROTOCOL_LABEL,
            PURPOSE_ADVERTISE_MAC,
            bytes(registry),
            struct.pack(">qqq", round_id, sender, recipient),
            bytes(c_public),
            bytes(s_public),
        )
    )


@dataclass(frozen=True)
class SurvivorDigest:
    """A survivor set ``U_3`` as the ConsistencyCheck messages bind it: ``|U_3|`` and the
    SHA-256 of its sorted ids (8-byte big-endian each).

    Computed once per set (:func:`survivor_digest`) and handed to every message of the set: at
    n = 1000 a round makes some 60,000 ConsistencyCheck messages over one set.
    """

    size: int
    digest: bytes

    def __post_init__(self) -> None:
        if self.size < 0 or len(self.digest) != hashlib.sha256().digest_size:
            raise ValueError(
                f"a survivor digest is a size >= 0 and a 32-byte SHA-256, got size {self.size} "
                f"and {len(self.digest)} bytes"
            )


def survivor_digest(survivors: Iterable[int]) -> SurvivorDigest:
    """The :class:`SurvivorDigest` of ``survivors`` (sorting and hashing its ids once)."""
    ids = sorted({int(c) for c in survivors})
    return SurvivorDigest(len(ids), hashlib.sha256(struct.pack(f">{len(ids)}q", *ids)).digest())


_RECENT_DIGESTS: dict[int, tuple[frozenset[int], SurvivorDigest]] = {}
_RECENT_LIMIT = 16


def _digest_of(survivors: Iterable[int] | SurvivorDigest) -> SurvivorDigest:
    """The digest of ``survivors``; a frozenset's is remembered by identity (``id`` and ``is``,
    never ``==``: comparing two 1000-element sets costs more than the message), so the helpers
    of one simulated round, who share the server's frozenset, hash it once."""
    if isinstance(survivors, SurvivorDigest):
        return survivors
    if not isinstance(survivors, frozenset):
        return survivor_digest(survivors)
    entry = _RECENT_DIGESTS.get(id(survivors))
    if entry is not None and entry[0] is survivors:
        return entry[1]
    bound = survivor_digest(survivors)
    if len(_RECENT_DIGESTS) >= _RECENT_LIMIT:
        _RECENT_DIGESTS.clear()  # one atomic step (threads may share the memo)
    # The entry holds the set itself, so its id cannot be reused while the entry lives.
    _RECENT_DIGESTS[id(survivors)] = (survivors, bound)
    return bound


def consistency_message(
    round_id: int,
    survivors: Iterable[int] | SurvivorDigest,
    *,
    registry: bytes,
    min_contributors: int = 0,
    run: bytes = b"",
) -> bytes:
    """What a survivor signs at ConsistencyCheck: the round, the registry digest it pinned, the
    minimum of contributors it holds (:attr:`SecAggConfig.min_contributors`), the survivor
    set ``U_3`` told and the run's nonce transcript (``run``, as in
    :func:`advertisement_message`).

    The set is hashed (SHA-256 of the sorted ids) so the message stays short for large rounds;
    ``survivors`` may be its :class:`SurvivorDigest`, computed once for the set.
    Binding the minimum means an endorsement counts only towards a helper that holds the same
    one: a server that tells clients different minimums cannot add their endorsements up.
    """
    bound = _digest_of(survivors)
    return b"".join(
        (
            kx.PROTOCOL_LABEL,
            PURPOSE_CONSISTENCY,
            bytes(registry),
            struct.pack(">qqq", round_id, bound.size, min_contributors),
            bound.digest,
            bytes(run),
        )
    )


def consistency_tag_message(
    round_id: int,
    sender: int,
    recipient: int,
    survivors: Iterable[int] | SurvivorDigest,
    *,
    registry: bytes,
    min_contributors: int = 0,
) -> bytes:
    """What ``sender`` MACs for ``recipient`` at ConsistencyCheck (``auth="macs"``);
    ``survivors`` as in :func:`consistency_message`."""
    bound = _digest_of(survivors)
    return b"".join(
        (
            kx.PROTOCOL_LABEL,
            PURPOSE_CONSISTENCY_MAC,
            bytes(registry),
            struct.pack(">qqqqq", round_id, sender, recipient, bound.size, min_contributors),
            bound.digest,
        )
    )


Authenticator = bytes | dict[int, bytes]
"""What a client attaches to a message: one signature, or one MAC per recipient."""


class ClientAuthentication:
    """A client's side of the malicious variant's authentication in one round (either mode).

    Args:
        mode: ``"signatures"`` or ``"macs"`` (:data:`AUTH_MODES`).
        client: the client's id.
        round_id: the round.
        identity: the client's long-term :class:`SigningKey`, with the registry digest pinned
            at enrolment (:meth:`SigningKey.pin_registry`).
        registry: every client's long-term public keys, as handed to the client (by whoever:
            it is checked against the pinned digest).
        min_contributors: the client's own minimum of contributors, bound into its
            ConsistencyCheck authenticators (0: none).
        graph_epoch: ``SecAggConfig.graph_epoch``; above 1 with signatures, the round runs in
            an epoch session (:class:`EpochSession`): Ed25519 once per session, MACs under the
            epoch pair keys otherwise.
        epoch_keypair: where a new epoch session's X25519 key pair comes from (the client's
            randomness; needed with ``graph_epoch > 1`` and signatures).

    Raises:
        SignatureError: no digest pinned at enrolment, or a registry of another digest (forged,
            or split by whoever handed it out).

    Attributes:
        setup_seconds: time spent agreeing static pairwise keys not yet cached (set-up, not
            per round; zero with signatures).
    """

    def __init__(
        self,
        mode: str,
        client: int,
        round_id: int,
        identity: SigningKey,
        registry: KeyRegistry,
        *,
        min_contributors: int = 0,
        graph_epoch: int = 1,
        epoch_keypair: Callable[[], kx.KeyPair] | None = None,
        run: bytes = b"",
    ) -> None:
        if mode not in AUTH_MODES:
            raise ValueError(f"auth must be one of {AUTH_MODES}, got {mode!r}")
        pinned = identity.registry_digest
        if pinned is None:
            raise SignatureError(
                f"client {client} has no key-registry digest pinned at enrolment: it cannot "
                "tell an authentic registry from one the server forged; refusing "
                "(SigningKey.pin_registry)"
            )
        if registry.digest != pinned:
            raise SignatureError(
                f"the key registry handed to client {client} does not match the digest it "
                "pinned at enrolment (a registry forged or split by whoever handed it out: it "
                "could hold another party's keys under real clients' ids); refusing"
            )
        if mode == "signatures" and registry.keys.get(client) != identity.public:
            raise ValueError(
                f"client {client}'s signing key is not the one the key registry holds for it"
            )
        if mode == "macs" and registry.statics.get(client) != identity.static_public:
            raise ValueError(
                f"client {client}'s static key is not the one the key registry holds for it"
            )
        self.mode = mode
        self.id = int(client)
        self.round_id = round_id
        self.identity = identity
        self.registry = registry
        self.digest = pinned
        self.min_contributors = int(min_contributors)
        if run and (mode != "signatures" or graph_epoch > 1):
            raise ValueError(
                "a run transcript binds the per-round Ed25519 signatures (auth='signatures', "
                "graph_epoch=1) only; MACs and epoch sessions do not carry it"
            )
        self.run = bytes(run)
        self.setup_seconds = 0.0
        self._keys: dict[int, tuple[kx.MacKey, kx.MacKey]] = {}  # this round's, by peer
        self._bound: tuple[frozenset[int], SurvivorDigest] | None = None  # the set endorsed
        self.graph_epoch = int(graph_epoch)
        self.epoch_mode = mode == "signatures" and self.graph_epoch > 1
        if self.epoch_mode and epoch_keypair is None:
            raise ValueError(f"client {client}: an epoch session needs epoch_keypair")
        self.epoch = int(round_id) // self.graph_epoch
        self._epoch_keypair = epoch_keypair
        self.session: EpochSession | None = None  # this round's (epoch mode), from advertise()
        self.session_opened = False  # whether this round is its session's first
        self.wire_bytes = SIGNATURE_BYTES if mode == "signatures" else MAC_BYTES

    def _peer_keys(self, peer: int, what: str) -> tuple[kx.MacKey, kx.MacKey]:
        """The MAC keys with ``peer``: the epoch session's, or the static pairwise ones."""
        if self.epoch_mode:
            return self._session_key(peer, what)
        return self._key(peer, what)

    def _key(self, peer: int, what: str) -> tuple[kx.MacKey, kx.MacKey]:
        keys = self._keys.get(peer)
        if keys is not None:
            return keys
        start = time.perf_counter()
        keys, fresh = self.identity.pairwise_key(
            self.id, peer, self.registry.static(peer, what=what)
        )
        if fresh:
            self.setup_seconds += time.perf_counter() - start
        self._keys[peer] = keys
        return keys

    def advertise(
        self, c_public: bytes, s_public: bytes, recipients: Sequence[int] | None
    ) -> Authenticator:
        """The authenticator of this client's advertisement: a signature, or a MAC per recipient.

        Raises:
            ValueError: MACs without the recipients (the neighbours the server announced).
            SignatureError: a recipient outside the registry.
        """
        if self.epoch_mode:
            return self._advertise_epoch(c_public, s_public, recipients)
        if self.mode == "signatures":
            return self.identity.sign(
                advertisement_message(
                    self.round_id, self.id, c_public, s_public, registry=self.digest, run=self.run
                )
            )
        if recipients is None:
            raise ValueError(
                f"client {self.id}: MAC-authenticated advertisements (auth='macs') are addressed "
                "to the neighbours, so advertise() needs them"
            )
        return {
            int(v): self._key(int(v), "advertisement")[0].tag(
                advertisement_tag_message(
                    self.round_id, self.id, int(v), c_public, s_public, registry=self.digest
                )
            )
            for v in recipients
        }

    def _advertise_epoch(
        self, c_public: bytes, s_public: bytes, recipients: Sequence[int] | None
    ) -> Authenticator:
        """Epoch mode: the signed epoch advertisement in a session's first round, else a MAC
        per neighbour under the session's keys."""
        if recipients is None:
            raise ValueError(
                f"client {self.id}: an epoch session (graph_epoch={self.graph_epoch}) binds the "
                "neighbourhood, so advertise() needs the neighbours the server announced"
            )
        neighbours = tuple(sorted({int(v) for v in recipients}))
        session, opened = self.identity.epoch_session(
            self.epoch, neighbours, self.round_id, self._epoch_keypair
        )
        self.session, self.session_opened = session, opened
        if opened:
            message = epoch_advertisement_message(
                self.round_id,
                self.epoch,
                self.graph_epoch,
                self.id,
                neighbours,
                c_public,
                s_public,
                session.keypair.public,
                registry=self.digest,
            )
            return pack_epoch_advertisement(
                session.keypair.public, self.identity.sign(message), neighbours
            )
        return {
            v: session.keys[v][0].tag(
                advertisement_tag_message(
                    self.round_id, self.id, v, c_public, s_public, registry=self.digest
                )
            )
            for v in neighbours
        }

    def _session_key(self, peer: int, what: str) -> tuple[kx.MacKey, kx.MacKey]:
        """The epoch session's keys with ``peer`` (epoch mode, after ShareKeys' checks)."""
        session = self.session
        keys = None if session is None else session.keys.get(int(peer))
        if keys is None:
            raise SignatureError(
                f"client {self.id} holds no epoch key with client {peer} for round "
                f"{self.round_id}: its {what} cannot be checked (not a neighbour of this "
                "epoch session, or the session's signed advertisements were not checked); "
                "refusing"
            )
        return keys

    def _check_epoch_advertisement(
        self, sender: int, c_public: bytes, s_public: bytes, authenticator: bytes
    ) -> None:
        session = self.session
        if session is None:
            raise SignatureError(
                f"client {self.id} checks advertisements only after its own (epoch session)"
            )
        if sender not in session.neighbours:
            raise SignatureError(
                f"client {sender} is not in the neighbourhood client {self.id} was told at "
                "AdvertiseKeys for this epoch session; refusing its advertisement"
            )
        if not self.session_opened:
            tag = authenticator if isinstance(authenticator, bytes) else b""
            message = advertisement_tag_message(
                self.round_id, sender, self.id, c_public, s_public, registry=self.digest
            )
            if not self._session_key(sender, "advertisement")[0].check(message, tag):
                raise SignatureError(
                    f"client {sender}'s MAC on its advertisement under the epoch key does not "
                    "verify (forged, on other content, from another round or epoch, or "
                    "addressed to another client); refusing"
                )
            return
        epoch_public, signature, theirs = unpack_epoch_advertisement(sender, authenticator)
        if self.id not in theirs or len(set(theirs)) != len(theirs):
            raise SignatureError(
                f"client {sender}'s signed epoch advertisement names a neighbourhood without "
                f"client {self.id} (the graph relabelled: {sender} agreed to other "
                "neighbours); refusing"
            )
        message = epoch_advertisement_message(
            self.round_id,
            self.epoch,
            self.graph_epoch,
            sender,
            theirs,
            c_public,
            s_public,
            epoch_public,
            registry=self.digest,
        )
        self.registry.verify(sender, message, signature, what="epoch advertisement")
        session.pending[sender] = epoch_pair_keys(
            self.id,
            sender,
            session,
            epoch_public,
            graph_epoch=self.graph_epoch,
            registry=self.digest,
        )

    def confirm_advertisements(self, neighbours: Sequence[int]) -> None:
        """After every neighbour's advertisement verified (ShareKeys): in epoch mode, check the
        neighbours are the session's and, in its first round, keep the keys agreed.

        Raises:
            SignatureError: other neighbours than those the session pinned at AdvertiseKeys, or
                a neighbour whose signed epoch advertisement was not checked.
        """
        if not self.epoch_mode:
            return
        session = self.session
        if session is None or tuple(sorted(int(v) for v in neighbours)) != session.neighbours:
            raise SignatureError(
                f"client {self.id} is asked to share with other neighbours than the ones it was "
                "told at AdvertiseKeys for this epoch session (a graph changed within the "
                "round); refusing"
            )
        if self.session_opened:
            if set(session.pending) != set(session.neighbours):
                raise SignatureError(
                    f"client {self.id} did not verify every neighbour's signed epoch "
                    "advertisement; refusing"
                )
            session.keys = dict(session.pending)
            session.pending.clear()

    def check_advertisement(
        self, sender: int, c_public: bytes, s_public: bytes, authenticator: bytes
    ) -> None:
        """Refuse ``sender``'s advertisement unless its signature, or its MAC to this client,
        verifies.

        Raises:
            SignatureError: naming the sender.
        """
        if self.epoch_mode:
            self._check_epoch_advertisement(int(sender), c_public, s_public, authenticator)
            return
        if self.mode == "signatures":
            message = advertisement_message(
                self.round_id, sender, c_public, s_public, registry=self.digest, run=self.run
            )
            with self._run_bound(sender, "advertisement"):
                self.registry.verify(sender, message, authenticator, what="advertisement")
            return
        key = self._key(sender, "advertisement")[0]
        message = advertisement_tag_message(
            self.round_id, sender, self.id, c_public, s_public, registry=self.digest
        )
        if not key.check(message, authenticator):
            raise SignatureError(
                f"client {sender}'s MAC on its advertisement does not verify (forged, on other "
                "content, from another round, or addressed to another client); refusing"
            )

    @contextlib.contextmanager
    def _run_bound(self, sender: int, what: str) -> Iterator[None]:
        """Name the cause when a registered sender's signature fails under a run transcript:
        it is not over this run's nonces, which hold this client's own (a replay from another
        run is the attack the transcript stops)."""
        try:
            yield
        except SignatureError as error:
            if not self.run or int(sender) not in self.registry.keys:
                raise
            raise SignatureError(
                f"client {sender}'s signature on its {what} does not verify over this run's "
                f"nonce transcript, which holds client {self.id}'s own fresh nonce: a signed "
                f"{what} replayed from another run (or forged, on other content, or from "
                "another round); refusing"
            ) from error

    def endorse(self, survivors: frozenset[int], recipients: Iterable[int]) -> Authenticator:
        """ConsistencyCheck: the authenticator of ``survivors`` (a signature, or a MAC each)."""
        bound = self._digest(survivors)
        if self.mode == "signatures" and not self.epoch_mode:
            return self.identity.sign(self._consistency(bound))
        return {
            int(v): self._peer_keys(int(v), "survivor set")[1].tag(
                self._consistency_tag(self.id, int(v), bound)
            )
            for v in recipients
        }

    def _digest(self, survivors: frozenset[int]) -> SurvivorDigest:
        """The digest of ``survivors``, hashed once for the set this client endorses and checks."""
        if self._bound is not None and self._bound[0] is survivors:
            return self._bound[1]
        bound = _digest_of(survivors)
        self._bound = (survivors, bound)
        return bound

    def _consistency_tag(
        self, sender: int, recipient: int, survivors: frozenset[int] | SurvivorDigest
    ) -> bytes:
        return consistency_tag_message(
            self.round_id,
            sender,
            recipient,
            survivors,
            registry=self.digest,
            min_contributors=self.min_contributors,
        )

    def _consistency(self, survivors: frozenset[int] | SurvivorDigest) -> bytes:
        return consistency_message(
            self.round_id,
            survivors,
            registry=self.digest,
            min_contributors=self.min_contributors,
            run=self.run,
        )

    def check_endorsement(self, sender: int, survivors: frozenset[int], authenticator) -> None:
        """Refuse unless ``sender`` authenticated ``survivors`` to this client in this round.

        Raises:
            SignatureError: naming the sender.
        """
        bound = self._digest(survivors)
        if self.mode == "signatures" and not self.epoch_mode:
            with self._run_bound(sender, "survivor set"):
                self.registry.verify(
                    sender, self._consistency(bound), authenticator, what="survivor set"
                )
            return
        key = self._peer_keys(sender, "survivor set")[1]
        if not key.check(self._consistency_tag(sender, self.id, bound), authenticator):
            raise SignatureError(
                f"client {sender}'s MAC on its survivor set does not verify (another set, "
                "forged, from another round, or addressed to another client); refusing"
            )


class SimulatedSigners:
    """The set-up of simulated clients: each client's long-term identity and the registry.

    Stands for what a real deployment does once, out of band, before any round: every client
    makes its long-term keys and the registry of their public halves reaches every client. A
    client's identity is made the first time it takes part and kept for later rounds (from
    ``seeds.key("secagg", "signing", client)`` in seeded mode, from the OS otherwise), with the
    static pairwise keys it agrees. The server's round never holds this object:
    :class:`SecAggTransport` hands each simulated client its own identity and the registry.

    Attributes:
        setup_seconds: time spent making identities and registries (set-up, not per round).
        shared_checks: registries made from now on remember the signatures that verified
            (:attr:`KeyRegistry.shared_checks`; ``True``: the simulation's shortcut).
    """

    def __init__(self) -> None:
        self._keys: dict[int, SigningKey] = {}
        self._registry: KeyRegistry | None = None
        self.setup_seconds = 0.0
        # The simulated clients share the registry object: each distinct signature is verified
        # once (KeyRegistry.shared_checks); the cost benchmark turns this off to measure what
        # every real client verifies.
        self.shared_checks = True

    @property
    def pairs_agreed(self) -> int:
        """Static pairwise keys agreed so far, over every identity (one X25519 per pair and
        side: :attr:`SigningKey.setup_pairs`)."""
        return sum(key.setup_pairs for key in self._keys.values())

    @property
    def epoch_sessions_opened(self) -> int:
        """Signed epoch sessions opened so far, over every identity
        (:attr:`SigningKey.epoch_sessions_opened`)."""
        return sum(key.epoch_sessions_opened for key in self._keys.values())

    def set_up(
        self, clients: Iterable[int], seeds: SeedTree
    ) -> tuple[dict[int, SigningKey], KeyRegistry]:
        """The identities of ``clients`` and the registry of every client set up so far."""
        start = time.perf_counter()
        clients = [int(c) for c in clients]
        new = [c for c in clients if c not in self._keys]
        for client in new:
            self._keys[client] = (
                SigningKey.generate()
                if seeds.secure
                else SigningKey.from_seed(seeds.key("secagg", "signing", client))
            )
        if new or self._registry is None:
            self._registry = KeyRegistry(
                {c: key.public for c, key in self._keys.items()},
                {c: key.static_public for c, key in self._keys.items()},
                shared_checks=self.shared_checks,
            )
            # The enrolment authority hands every enrolled client the new registry's digest.
            for key in self._keys.values():
                key.pin_registry(self._registry.digest)
        self.setup_seconds += time.perf_counter() - start
        return {c: self._keys[c] for c in clients}, self._registry
