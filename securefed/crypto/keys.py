"""Key agreement, key derivation and share encryption for secure aggregation.

The primitives of Bonawitz et al. (CCS 2017, Sec. 3), instantiated with the ``cryptography``
package:

* KA (key agreement): X25519 (RFC 7748). Each client advertises two public keys per round, ``c``
  (to encrypt its Shamir shares to its neighbours) and ``s`` (to agree on pairwise mask seeds).
* KDF: HKDF-SHA256 (RFC 5869) turns an X25519 shared secret into a 32-byte key. The ``info``
  string binds the protocol version, the purpose (share encryption or pairwise mask), the round and
  the unordered pair of clients, so the same key pair never yields the same key for two purposes,
  rounds or pairs. It is computed with ``hashlib``'s SHA-256 (HMAC written out, RFC 2104; extract,
  then one expand block per 32 bytes, RFC 5869 Sec. 2.2-2.3), the salt's padded states computed
  once: the same bytes as ``cryptography``'s ``HKDF`` (tests/test_crypto.py checks both and RFC
  5869's test vector) at half its cost, which was mostly building a KDF object per derivation
  (40,000 derivations in a round of 1000 clients).
* MAC: HMAC-SHA256 (RFC 2104) with 32-byte tags (:func:`mac`, :func:`check_mac`, constant-time
  comparison), for the malicious-server variant's pairwise authentication.
* AE (authenticated encryption of shares): AES-256-GCM or ChaCha20-Poly1305 with a fresh 96-bit
  nonce sent in front of the ciphertext. The associated data binds ``(round, sender, recipient)``:
  a share that is altered, relayed to the wrong recipient, attributed to another sender, or
  replayed from another round fails authentication.
* Public keys are checked wherever they are used (:func:`check_public_key`, :func:`agree`): 32
  bytes, the canonical encoding, and not a low-order point (whose shared secret is all zeros, so
  the derived key would be public); a bad key is an :class:`InvalidPublicKeyError` naming its owner.

Private keys come from ``X25519PrivateKey.generate()`` (OpenSSL's CSPRNG) in secure mode. For
reproducible tests and benchmarks only, :func:`keypair_from_seed` derives one from 32 seed bytes.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305

from securefed.errors import AggregationError

PROTOCOL_LABEL = b"securefed/secagg/v1/"
PUBLIC_KEY_BYTES = 32
CURVE25519_PRIME = 2**255 - 19
PRIVATE_KEY_BYTES = 32
KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
MAC_BYTES = 32
HKDF_MAX_BYTES = 255 * 32

AeadName = Literal["aes-256-gcm", "chacha20-poly1305"]
AEAD_NAMES: tuple[str, ...] = ("aes-256-gcm", "chacha20-poly1305")

PURPOSE_SHARE_KEY = b"share-encryption"
PURPOSE_PAIR_MASK = b"pairwise-mask"


class ShareDecryptionError(AggregationError):
    """An encrypted share failed authentication (tampered, misrouted or replayed)."""


class InvalidPublicKeyError(AggregationError, ValueError):
    """A peer's X25519 public key is malformed, not canonical, or of low order (RFC 7748, Sec. 6.1).

    A low-order point makes the shared secret all zeros, i.e. a key everybody knows.
    """


@dataclass(frozen=True, eq=False)
class KeyPair:
    """An X25519 key pair: the private key object and the 32 raw public bytes."""

    private: X25519PrivateKey
    public: bytes

    def private_bytes(self) -> bytes:
        """The raw 32-byte private key (what a client Shamir-shares for its ``s`` key)."""
        return self.private.private_bytes_raw()


def _from_private(private: X25519PrivateKey) -> KeyPair:
    # The raw encodings' own calls: the bytes of public_bytes(Raw, Raw) / private_bytes(Raw,
    # Raw, NoEncryption()), without building the three serialization arguments per key.
    return KeyPair(private, private.public_key().public_bytes_raw())


def generate_keypair() -> KeyPair:
    """A fresh key pair from the operating system's CSPRNG (secure mode)."""
    return _from_private(X25519PrivateKey.generate())


def keypair_from_seed(seed: bytes) -> KeyPair:
    """A key pair whose private key is ``seed`` (32 bytes; tests and benchmarks only).

    Raises:
        ValueError: if ``seed`` is not 32 bytes.
    """
    if len(seed) != PRIVATE_KEY_BYTES:
        raise ValueError(f"an X25519 private key is {PRIVATE_KEY_BYTES} bytes, got {len(seed)}")
    return _from_private(X25519PrivateKey.from_private_bytes(seed))


def public_from_private_bytes(private: bytes) -> bytes:
    """The public key of a raw private key (lets a server check a reconstructed key)."""
    return keypair_from_seed(private).public


def _check_encoding(public: bytes, owner: str) -> None:
    """Refuse a public key that is not 32 bytes or not the canonical encoding of ``u < p``.

    RFC 7748 (Sec. 5) ignores bit 255 and reduces ``u`` mod ``p``, so one key has several
    encodings; generated keys are always canonical, and accepting only those keeps "two advertised
    keys coincide" meaningful.
    """
    if len(public) != PUBLIC_KEY_BYTES:
        raise InvalidPublicKeyError(
            f"{owner}'s X25519 public key must be {PUBLIC_KEY_BYTES} bytes, got {len(public)}"
        )
    if int.from_bytes(public, "little") >= CURVE25519_PRIME:
        raise InvalidPublicKeyError(
            f"{owner}'s X25519 public key is not canonical (u >= 2^255 - 19, or bit 255 set)"
        )


@functools.lru_cache(maxsize=1 << 16)
def _decoded(public: bytes) -> X25519PublicKey:
    """The key object of 32 public bytes, decoded once per key in this process.

    A pure function of public bytes, so sharing it is safe; a round decodes each advertised key
    once instead of once per neighbour that uses it (40,000 decodings in a round of 1000 clients).
    """
    return X25519PublicKey.from_public_bytes(public)


def _exchange(private: X25519PrivateKey, public: bytes, owner: str) -> bytes:
    try:
        return private.exchange(_decoded(bytes(public)))
    except ValueError as error:  # OpenSSL refuses an all-zero shared secret
        raise InvalidPublicKeyError(
            f"{owner}'s X25519 public key is a low-order point: the shared secret would be all "
            "zeros, a key everybody knows (RFC 7748, Sec. 6.1)"
        ) from error


_PROBE = X25519PrivateKey.from_private_bytes(bytes(range(PRIVATE_KEY_BYTES)))
"""A fixed private key to test public keys with. Its clamped scalar is ``8 k'`` with
``2^251 <= k' < 2^252``, below the prime orders of the curve's and the twist's large subgroups, so
the shared secret is zero exactly when the public key has small order (whatever the scalar)."""


def check_public_key(public: bytes, *, owner: str = "a peer") -> bytes:
    """Refuse a malformed, non-canonical or low-order X25519 public key; return it as bytes.

    Raises:
        InvalidPublicKeyError: naming ``owner`` and the defect.
    """
    public = bytes(public)
    _check_encoding(public, owner)
    _exchange(_PROBE, public, owner)
    return public


def agree(private: X25519PrivateKey, peer_public: bytes, *, peer: str = "the peer") -> bytes:
    """The X25519 shared secret with ``peer_public`` (RFC 7748, Sec. 6.1).

    Raises:
        InvalidPublicKeyError: (a ``ValueError``) for a malformed or non-canonical public key, or a
            low-order point (all-zero shared secret), naming ``peer``.
    """
    _check_encoding(peer_public, peer)
    return _exchange(private, peer_public, peer)


def pair_info(purpose: bytes, round_id: int, a: int, b: int) -> bytes:
    """HKDF ``info``: protocol label, purpose, round and the *unordered* pair ``{a, b}``."""
    low, high = (a, b) if a <= b else (b, a)
    return PROTOCOL_LABEL + purpose + b"/" + struct.pack(">qqq", round_id, low, high)


_SHA256_BLOCK = 64
_IPAD = int.from_bytes(b"\x36" * _SHA256_BLOCK, "big")
_OPAD = int.from_bytes(b"\x5c" * _SHA256_BLOCK, "big")


def _hmac_pads(key: bytes) -> tuple[bytes, bytes]:
    """HMAC's inner and outer padded keys (RFC 2104) for a key of at most one block."""
    block = int.from_bytes(key.ljust(_SHA256_BLOCK, b"\0"), "big")
    return (block ^ _IPAD).to_bytes(_SHA256_BLOCK, "big"), (block ^ _OPAD).to_bytes(
        _SHA256_BLOCK, "big"
    )


def derive_key(shared_secret: bytes, info: bytes, *, length: int = KEY_BYTES) -> bytes:
    """HKDF-SHA256(``shared_secret``, salt = protocol label, ``info``) -> ``length`` bytes.

    RFC 5869: ``PRK = HMAC(salt, IKM)``, ``T(i) = HMAC(PRK, T(i-1) || info || i)``, the output
    the first ``length`` bytes of ``T(1) || T(2) || ...``; each HMAC by the standard library's
    one-shot :func:`hmac.digest` (OpenSSL's, without Python objects per call: a round of 1000
    clients derives 40,000 keys).

    Raises:
        ValueError: ``length`` outside ``[1, 255 * 32]``.
    """
    if not 1 <= length <= HKDF_MAX_BYTES:
        raise ValueError(f"HKDF-SHA256 gives 1 to {HKDF_MAX_BYTES} bytes, asked for {length}")
    prk = hmac.digest(PROTOCOL_LABEL, shared_secret, "sha256")
    if length == KEY_BYTES:  # one expand block, T(1) = HMAC(PRK, info || 0x01): every pair key
        return hmac.digest(prk, info + b"\x01", "sha256")
    blocks, previous = [], b""
    for counter in range(1, -(-length // 32) + 1):
        previous = hmac.digest(prk, previous + info + bytes([counter]), "sha256")
        blocks.append(previous)
    return b"".join(blocks)[:length]


class MacKey:
    """An HMAC-SHA256 key with its padded SHA-256 states computed once (RFC 2104).

    For a key that tags many messages (a static pairwise key): each tag then costs two state
    copies and two short hashes. The tags are those of :func:`mac`.

    Raises:
        ValueError: a key that is not 32 bytes.
    """

    __slots__ = ("_inner", "_outer")

    def __init__(self, key: bytes) -> None:
        if len(key) != KEY_BYTES:
            raise ValueError(f"MAC keys are {KEY_BYTES} bytes, got {len(key)}")
        inner_pad, outer_pad = _hmac_pads(bytes(key))
        self._inner, self._outer = hashlib.sha256(inner_pad), hashlib.sha256(outer_pad)

    def tag(self, message: bytes) -> bytes:
        """The 32-byte tag of ``message``."""
        inner = self._inner.copy()
        inner.update(message)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()

    def check(self, message: bytes, tag: bytes) -> bool:
        """Whether ``tag`` is the tag of ``message`` (constant-time compare)."""
        return (
            isinstance(tag, bytes)
            and len(tag) == MAC_BYTES
            and hmac.compare_digest(self.tag(message), tag)
        )


def mac(key: bytes, message: bytes) -> bytes:
    """HMAC-SHA256 tag (32 bytes) of ``message`` under a 32-byte ``key`` (RFC 2104)."""
    if len(key) != KEY_BYTES:
        raise ValueError(f"MAC keys are {KEY_BYTES} bytes, got {len(key)}")
    return hmac.digest(key, message, hashlib.sha256)


def check_mac(key: bytes, message: bytes, tag: bytes) -> bool:
    """Whether ``tag`` is the HMAC-SHA256 of ``message`` under ``key`` (constant-time compare)."""
    return (
        isinstance(tag, bytes)
        and len(tag) == MAC_BYTES
        and hmac.compare_digest(mac(key, message), tag)
    )


def pair_key(
    private: X25519PrivateKey, peer_public: bytes, purpose: bytes, round_id: int, me: int, peer: int
) -> bytes:
    """The 32-byte key ``me`` shares with ``peer`` for ``purpose`` in round ``round_id``.

    Symmetric: ``pair_key(a_sk, B, ..., a, b) == pair_key(b_sk, A, ..., b, a)``.

    Raises:
        InvalidPublicKeyError: ``peer_public`` is malformed, non-canonical or of low order.
    """
    shared = agree(private, peer_public, peer=f"client {peer}")
    return derive_key(shared, pair_info(purpose, round_id, me, peer))


_PAIR_IDS = struct.Struct(">qqq")


def pair_keys(
    private: X25519PrivateKey,
    peer_publics: Sequence[bytes],
    purpose: bytes,
    round_id: int,
    me: int,
    peers: Sequence[int],
) -> list[bytes]:
    """:func:`pair_key` for each ``(peer_publics[i], peers[i])``, in one loop: the same keys.

    One X25519 exchange and one HKDF (two one-shot HMACs) per peer, as :func:`pair_key`; what the
    loop saves is the per-pair Python around them (three calls, an owner string made for the
    error message of every pair, the ``info`` built by a call), and it lets a client agree all
    its keys before it expands any mask. A key is checked exactly as :func:`agree` checks it,
    and the first bad one raises, naming its peer.

    Raises:
        InvalidPublicKeyError: a public key that is malformed, non-canonical or of low order.
        ValueError: ``peer_publics`` and ``peers`` of different lengths.
    """
    exchange, digest, pack = private.exchange, hmac.digest, _PAIR_IDS.pack
    head, label, keys = PROTOCOL_LABEL + purpose + b"/", PROTOCOL_LABEL, []
    for public, peer in zip(peer_publics, peers, strict=True):
        public = bytes(public)
        if len(public) != PUBLIC_KEY_BYTES or int.from_bytes(public, "little") >= CURVE25519_PRIME:
            _check_encoding(public, f"client {peer}")  # raises, naming the peer
        try:
            shared = exchange(_decoded(public))
        except ValueError:  # an all-zero secret: _exchange raises the named error
            shared = _exchange(private, public, f"client {peer}")
        ids = pack(round_id, me, peer) if me <= peer else pack(round_id, peer, me)
        keys.append(digest(digest(label, shared, "sha256"), head + ids + b"\x01", "sha256"))
    return keys


def share_aad(round_id: int, sender: int, recipient: int) -> bytes:
    """Associated data of an encrypted share: it binds the round and the (ordered) pair."""
    return PROTOCOL_LABEL + b"share/" + struct.pack(">qqq", round_id, sender, recipient)


def _aead(name: str, key: bytes) -> AESGCM | ChaCha20Poly1305:
    if len(key) != KEY_BYTES:
        raise ValueError(f"AEAD keys are {KEY_BYTES} bytes, got {len(key)}")
    if name == "aes-256-gcm":
        return AESGCM(key)
    if name == "chacha20-poly1305":
        return ChaCha20Poly1305(key)
    raise ValueError(f"unknown AEAD {name!r}; choose one of {AEAD_NAMES}")


def encrypted_size(plaintext_bytes: int) -> int:
    """Bytes on the wire for a sealed message: nonce + ciphertext + tag."""
    return NONCE_BYTES + plaintext_bytes + TAG_BYTES


def seal(aead: str, key: bytes, nonce: bytes, plaintext: bytes, aad: bytes) -> bytes:
    """Encrypt and authenticate: returns ``nonce || ciphertext || tag``.

    Raises:
        ValueError: for a nonce that is not 12 bytes, a bad key or an unknown AEAD.
    """
    if len(nonce) != NONCE_BYTES:
        raise ValueError(f"nonces are {NONCE_BYTES} bytes, got {len(nonce)}")
    return nonce + _aead(aead, key).encrypt(nonce, plaintext, aad)


def open_sealed(aead: str, key: bytes, blob: bytes, aad: bytes) -> bytes:
    """Decrypt ``nonce || ciphertext || tag`` sealed by :func:`seal` under the same ``aad``.

    Raises:
        ShareDecryptionError: if the message is truncated or fails authentication.
    """
    if len(blob) < NONCE_BYTES + TAG_BYTES:
        raise ShareDecryptionError(f"an encrypted share of {len(blob)} bytes is truncated")
    try:
        return _aead(aead, key).decrypt(blob[:NONCE_BYTES], blob[NONCE_BYTES:], aad)
    except InvalidTag as error:
        raise ShareDecryptionError("an encrypted share failed authentication") from error
