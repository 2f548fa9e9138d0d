"""Mask expansion: a 32-byte seed -> a vector of uniform integers mod 2^bits.

Secure aggregation's masks ``PRG(b_u)`` and ``PRG(s_uv)`` (Bonawitz et al., CCS 2017, Sec. 3.2
and 4) must be computationally indistinguishable from uniform, or the masked upload leaks the
input. The PRG here is a stream cipher keyed by the *full* 32-byte derived seed (AES-256 in CTR
mode, or ChaCha20), encrypting zero bytes straight into a numpy buffer read as little-endian
``uint32``/``uint64``: uniform words, no 32-bit seed squeezing, no ``RandomState``. (Flower's
SecAgg+ squeezes its seeds to 32 bits and expands them with ``numpy.random.RandomState``, which is
not a cryptographic PRG; see specs/transport.md.)

Domain separation: each use of a seed (self mask, pairwise mask, rounding noise) starts the
keystream at a different initial block (an 8-byte domain tag in the IV/nonce with the counter at
zero), so one key never yields the same keystream for two purposes. A key itself is used for one
round only (its HKDF ``info`` binds the round), so a fixed IV per domain is safe.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from typing import Literal

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

PrgName = Literal["aes-256-ctr", "chacha20"]
PRG_NAMES: tuple[str, ...] = ("aes-256-ctr", "chacha20")
SEED_BYTES = 32

DOMAIN_SELF_MASK = b"selfmask"
DOMAIN_PAIR_MASK = b"pairmask"
DOMAIN_ROUNDING = b"rounding"
DOMAIN_BYTES = b"bytestrm"

_SLACK = 64  # update_into needs len(data) + block_size - 1 bytes of room


def ring_dtype(bits: int) -> np.dtype:
    """The little-endian unsigned dtype of the ring Z_{2^bits} (bits is 32 or 64)."""
    if bits == 32:
        return np.dtype("<u4")
    if bits == 64:
        return np.dtype("<u8")
    raise ValueError(f"the ring must be Z_2^32 or Z_2^64, got bits={bits}")


@functools.lru_cache(maxsize=16)
def _ctr_mode(domain: bytes) -> modes.CTR:
    """The CTR mode of ``domain``'s keystream (its counter block ``domain || 0^64``).

    A mode object is immutable and holds no key, so every context of a domain shares one
    instead of building it per mask (22,000 masks in a round of 1000 clients).
    """
    return modes.CTR(domain + bytes(8))


def _encryptor(prg: str, key: bytes, domain: bytes):
    if len(key) != SEED_BYTES:
        raise ValueError(f"PRG seeds are the full {SEED_BYTES}-byte key, got {len(key)} bytes")
    if len(domain) != 8:
        raise ValueError("a PRG domain tag is 8 bytes")
    if prg == "aes-256-ctr":
        # 128-bit big-endian counter block: domain || 0^64. Each key needs its own context (its
        # key schedule): `cryptography` cannot re-key one, so a context per mask is the floor.
        return Cipher(algorithms.AES(key), _ctr_mode(bytes(domain))).encryptor()
    if prg == "chacha20":
        # cryptography's 16-byte ChaCha20 nonce starts with the little-endian block counter.
        return Cipher(algorithms.ChaCha20(key, bytes(8) + domain), mode=None).encryptor()
    raise ValueError(f"unknown PRG {prg!r}; choose one of {PRG_NAMES}")


class SecureWords:
    """Unpredictable 64-bit words: the keystream of ``prg`` under a key from ``os.urandom``.

    The randomness of the secure noise samplers (there is no seed to give). The key is replaced
    every ``2^36`` bytes, well before a counter could wrap (ChaCha20's 32-bit block counter
    after 256 GiB).

    Raises:
        ValueError: an unknown ``prg``.
    """

    REKEY_BYTES = 1 << 36

    def __init__(self, prg: str = "aes-256-ctr") -> None:
        if prg not in PRG_NAMES:
            raise ValueError(f"unknown PRG {prg!r}; choose one of {PRG_NAMES}")
        self.prg = prg
        self._encryptor = None
        self._used = 0

    def words(self, count: int) -> np.ndarray:
        """``count`` independent uniform ``uint64`` words."""
        nbytes = 8 * int(count)
        if nbytes > self.REKEY_BYTES:
            raise ValueError(f"at most {self.REKEY_BYTES // 8} words at a time, asked for {count}")
        if self._encryptor is None or self._used + nbytes > self.REKEY_BYTES:
            self._encryptor = _encryptor(self.prg, os.urandom(SEED_BYTES), bytes(8))
            self._used = 0
        self._used += nbytes
        return np.frombuffer(self._encryptor.update(bytes(nbytes)), "<u8")


def keystream(key: bytes, nbytes: int, *, prg: str = "aes-256-ctr", domain: bytes) -> bytes:
    """``nbytes`` of keystream of ``prg`` under ``key`` in ``domain``."""
    if nbytes < 0:
        raise ValueError("nbytes must be >= 0")
    return _encryptor(prg, key, domain).update(bytes(nbytes))


def expand_mask(
    key: bytes, length: int, *, bits: int = 32, prg: str = "aes-256-ctr", domain: bytes
) -> np.ndarray:
    """A fresh mask: ``length`` uniform elements of Z_{2^bits} expanded from ``key``."""
    dtype = ring_dtype(bits)
    return np.frombuffer(
        keystream(key, length * dtype.itemsize, prg=prg, domain=domain), dtype
    ).copy()


class MaskExpander:
    """Adds or subtracts PRG masks into a ring vector in place, reusing its buffers.

    One expander serves one vector length; ``add`` costs one keystream pass (written with
    ``update_into`` into a preallocated buffer) and one wrapping numpy add.

    Args:
        length: number of ring elements per mask.
        bits: 32 or 64 (the ring Z_{2^bits}).
        prg: ``"aes-256-ctr"`` or ``"chacha20"``.
    """

    def __init__(self, length: int, *, bits: int = 32, prg: str = "aes-256-ctr") -> None:
        if length < 0:
            raise ValueError("length must be >= 0")
        if prg not in PRG_NAMES:
            raise ValueError(f"unknown PRG {prg!r}; choose one of {PRG_NAMES}")
        self.length = length
        self.bits = bits
        self.prg = prg
        self.dtype = ring_dtype(bits)
        self._nbytes = length * self.dtype.itemsize
        self._zeros = bytes(self._nbytes)
        self._buffer = bytearray(self._nbytes + _SLACK)
        self._words = np.frombuffer(self._buffer, self.dtype, count=length)

    def mask(self, key: bytes, *, domain: bytes) -> np.ndarray:
        """The mask of ``key`` (a view of the internal buffer, valid until the next call)."""
        if self._nbytes:
            _encryptor(self.prg, key, domain).update_into(self._zeros, self._buffer)
        return self._words

    def add(self, acc: np.ndarray, key: bytes, *, domain: bytes, sign: int = 1) -> None:
        """``acc += sign * PRG(key)`` modulo 2^bits, in place (``sign`` is +1 or -1)."""
        if acc.shape != (self.length,) or acc.dtype != self.dtype:
            raise ValueError(f"acc must be a ({self.length},) {self.dtype} ring vector")
        words = self.mask(key, domain=domain)
        if sign == 1:
            np.add(acc, words, out=acc)
        elif sign == -1:
            np.subtract(acc, words, out=acc)
        else:
            raise ValueError(f"sign must be +1 or -1, got {sign}")


def uniform_floats(key: bytes, length: int, *, prg: str = "aes-256-ctr") -> np.ndarray:
    """``length`` uniform floats in [0, 1), 53 random bits each, from the keystream of ``key``."""
    words = np.frombuffer(keystream(key, 8 * length, prg=prg, domain=DOMAIN_ROUNDING), "<u8")
    return (words >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


class UniformSource:
    """:func:`uniform_floats` for many keys and one length, reusing its buffers.

    ``draw(key)`` returns a view of an internal buffer, valid until the next call; the values are
    bit-identical to ``uniform_floats(key, length, prg=prg)``.
    """

    def __init__(self, length: int, *, prg: str = "aes-256-ctr") -> None:
        if prg not in PRG_NAMES:
            raise ValueError(f"unknown PRG {prg!r}; choose one of {PRG_NAMES}")
        self.length = length
        self.prg = prg
        self._zeros = bytes(8 * length)
        self._buffer = bytearray(8 * length + _SLACK)
        self._words = np.frombuffer(self._buffer, "<u8", count=length)
        self._floats = np.empty(length)
        self._blocks: tuple | None = None

    def draw(self, key: bytes) -> np.ndarray:
        if self.length:
            _encryptor(self.prg, key, DOMAIN_ROUNDING).update_into(self._zeros, self._buffer)
        _words_to_floats(self._words, self._floats)
        return self._floats

    def blocks(self, key: bytes, block: int) -> Iterator[np.ndarray]:
        """``draw(key)`` in successive slices of ``block`` values (the last one shorter).

        The same floats, from one keystream continued block by block (CTR mode), each slice a
        view of a buffer of ``block`` values valid until the next: a consumer that works block
        by block keeps its buffers in cache instead of streaming the whole vector each pass.

        Raises:
            ValueError: ``block < 1``.
        """
        if block < 1:
            raise ValueError(f"block must be >= 1, got {block}")
        block = min(block, max(self.length, 1))
        zeros, buffer, words, floats = self._block_buffers(block)
        encryptor = _encryptor(self.prg, key, DOMAIN_ROUNDING)
        for start in range(0, self.length, block):
            size = min(block, self.length - start)
            encryptor.update_into(zeros[: 8 * size], buffer)
            yield _words_to_floats(words[:size], floats[:size])

    def _block_buffers(self, block: int):
        if self._blocks is None or self._blocks[0] != block:
            buffer = bytearray(8 * block + _SLACK)
            self._blocks = (
                block,
                memoryview(bytes(8 * block)),
                buffer,
                np.frombuffer(buffer, "<u8", count=block),
                np.empty(block),
            )
        return self._blocks[1:]


def _words_to_floats(words: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``out = (words >> 11) * 2^-53``: 53 random bits per float in [0, 1), ``words`` shifted in
    place. The shifted words are below 2^53, so reading them as int64 (a faster conversion than
    uint64's) gives the same floats, each exact."""
    np.right_shift(words, np.uint64(11), out=words)
    np.multiply(words.view(np.int64), 1.0 / (1 << 53), out=out)
    return out


class KeystreamBytes:
    """A deterministic CSPRNG: successive calls return successive bytes of one keystream.

    Used as ``randbytes`` for Shamir coefficients and nonces in seeded mode (secure mode uses
    ``os.urandom``).

    Args:
        key: 32-byte seed.
        prg: ``"aes-256-ctr"`` or ``"chacha20"``.
    """

    def __init__(self, key: bytes, *, prg: str = "aes-256-ctr") -> None:
        self._encryptor = _encryptor(prg, key, DOMAIN_BYTES)

    def __call__(self, nbytes: int) -> bytes:
        if nbytes < 0:
            raise ValueError("nbytes must be >= 0")
        return self._encryptor.update(bytes(nbytes))
