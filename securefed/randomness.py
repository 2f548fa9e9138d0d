"""The seed tree: one seed per run, an independent stream per purpose, round and client.

Every random draw in securefed and its recommenders comes from a generator handed out by a
:class:`SeedTree`; nothing touches numpy's global state. A stream is addressed by a path such as
``("sampling", round_id)`` or ``("client", round_id, client_id)``; the path becomes the
``spawn_key`` of a :class:`numpy.random.SeedSequence`, which is exactly how
``SeedSequence.spawn`` derives its children, so streams are statistically independent and the
same seed gives the same numbers whatever order the streams are asked for in (which is what
makes resume-from-checkpoint exact).

Two modes, after Opacus's ``secure_mode``; secure unless a seed is given:

* secure (``SeedTree()``, the default, or ``SeedTree.secure_mode()``): entropy from the operating
  system, ``secure`` is True. Transports that draw masks, keys or noise read
  :attr:`SeedTree.secure` and then use a cryptographic source instead of numpy's generators.
* seeded (``SeedTree(1234)``): reproducible, for tests and benchmarks, and therefore **not
  private**: anyone with the seed regenerates every key, mask and noise draw. ``secure`` is False
  and anything that audits a run flags it.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np


def _path_word(part: int | str) -> int:
    """Map one element of a stream path to a non-negative integer (stable across runs)."""
    if isinstance(part, bool) or not isinstance(part, (int, np.integer, str)):
        raise TypeError(f"stream path elements are ints or strings, got {part!r}")
    if isinstance(part, str):
        # Strings are tagged into a range apart from small ints so ("a", 1) != (hash("a"), 1).
        return (1 << 40) + zlib.crc32(part.encode("utf-8"))
    if part < 0:
        raise ValueError(f"stream path integers must be >= 0, got {part}")
    return int(part)


_MASK32 = 0xFFFFFFFF
# numpy's SeedSequence constants (O'Neill's seed_seq_fe, numpy/random/bit_generator.pyx).
_INIT_A, _MULT_A = 0x43B0D7E5, 0x931E8875
_INIT_B, _MULT_B = 0x8B51F9DD, 0x58F38DED
_MIX_MULT_L, _MIX_MULT_R = 0xCA01F9DD, 0x4973F715
_POOL_SIZE = 4
_PREFIX_CACHE = 4096


def _uint32_words(value: int) -> list[int]:
    """``value`` as SeedSequence reads an int: little-endian 32-bit words, ``[0]`` for 0."""
    if value == 0:
        return [0]
    words = []
    while value:
        words.append(value & _MASK32)
        value >>= 32
    return words


def _absorb(pool: tuple[int, ...], hash_const: int, words: list[int]) -> tuple[tuple, int]:
    """SeedSequence's mixing of entropy words beyond the pool size into ``pool``: each word,
    hashed anew for every pool word, mixed into it (the third loop of ``mix_entropy``)."""
    pool = list(pool)
    for word in words:
        for dst in range(_POOL_SIZE):
            value = word ^ hash_const
            hash_const = (hash_const * _MULT_A) & _MASK32
            value = (value * hash_const) & _MASK32
            value ^= value >> 16
            mixed = (_MIX_MULT_L * pool[dst] - _MIX_MULT_R * value) & _MASK32
            pool[dst] = mixed ^ (mixed >> 16)
    return tuple(pool), hash_const


def _initial_pool(words: list[int]) -> tuple[tuple, int]:
    """SeedSequence's pool after its first ``_POOL_SIZE`` entropy words and their mixing
    (``mix_entropy``'s first two loops; missing words are zeros)."""
    hash_const = _INIT_A

    def hashmix(value: int) -> int:
        nonlocal hash_const
        value ^= hash_const
        hash_const = (hash_const * _MULT_A) & _MASK32
        value = (value * hash_const) & _MASK32
        return value ^ (value >> 16)

    pool = [hashmix(words[i] if i < len(words) else 0) for i in range(_POOL_SIZE)]
    for src in range(_POOL_SIZE):
        for dst in range(_POOL_SIZE):
            if src != dst:
                mixed = (_MIX_MULT_L * pool[dst] - _MIX_MULT_R * hashmix(pool[src])) & _MASK32
                pool[dst] = mixed ^ (mixed >> 16)
    return tuple(pool), hash_const


def _generate_state(pool: tuple[int, ...], n_words: int) -> list[int]:
    """``SeedSequence.generate_state(n_words, np.uint32)`` from the mixed ``pool``."""
    hash_const, out = _INIT_B, []
    for i in range(n_words):
        value = pool[i % _POOL_SIZE] ^ hash_const
        hash_const = (hash_const * _MULT_B) & _MASK32
        value = (value * hash_const) & _MASK32
        out.append(value ^ (value >> 16))
    return out


class SeedTree:
    """Tree of independent random streams: secure by default, reproducible when seeded.

    Args:
        seed: ``None`` (the default): secure mode, root entropy from the operating system
            (``secure`` is True; the run cannot be reproduced, and its checkpoints keep that
            entropy only encrypted). A non-negative int: the seeded tree of that seed,
            reproducible and therefore not private (for tests and benchmarks).

    Example:
        >>> tree = SeedTree(7)  # seeded: reproducible, not private
        >>> a = tree.generator("init").normal()
        >>> b = SeedTree(7).generator("init").normal()
        >>> a == b
        True
        >>> SeedTree().secure, SeedTree(7).secure
        (True, False)
    """

    def __init__(self, seed: int | None = None) -> None:
        if seed is not None and (isinstance(seed, bool) or int(seed) != seed or seed < 0):
            raise ValueError(f"seed must be a non-negative integer or None, got {seed!r}")
        self._root = np.random.SeedSequence(seed)
        self._pools: dict[tuple[int, ...], tuple[tuple, int]] = {}  # key(): path prefix -> pool
        self.seed: int | None = None if seed is None else int(seed)
        self.secure = seed is None

    @classmethod
    def secure_mode(cls, seed: int | None = None) -> SeedTree:
        """A tree for deployment: OS entropy, and a seed is refused (what ``SeedTree()`` is;
        this spelling says so where a reader might wonder).

        Raises:
            ValueError: if a seed is given (a seeded secure run would be predictable).
        """
        if seed is not None:
            raise ValueError(
                "secure mode refuses a seed: masks, keys and noise must not be reproducible; "
                "use SeedTree(seed) for tests and benchmarks"
            )
        return cls(None)

    @property
    def entropy(self) -> int:
        """The root entropy (the seed, or the OS entropy drawn for a secure tree)."""
        return int(self._root.entropy)

    def sequence(self, *path: int | str) -> np.random.SeedSequence:
        """The SeedSequence of the stream at ``path`` (same as the matching ``spawn`` child)."""
        key = tuple(_path_word(p) for p in path)
        return np.random.SeedSequence(self._root.entropy, spawn_key=key)

    def generator(self, *path: int | str) -> np.random.Generator:
        """A fresh numpy Generator (PCG64) for the stream at ``path``."""
        return np.random.Generator(np.random.PCG64(self.sequence(*path)))

    def key(self, *path: int | str, nbytes: int = 32) -> bytes:
        """``nbytes`` of seed material for the stream at ``path`` (e.g. a cipher key in tests).

        The bytes of ``self.sequence(*path).generate_state((nbytes + 3) // 4, np.uint32)``,
        computed here with the pool of the path's prefix kept (a round of 1000 simulated clients
        asks for 5000 keys, five per client path: numpy builds a SeedSequence for each, about
        40 us in a round). The same bytes for every path (tests/test_secagg_floor.py).
        """
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        words = tuple(_path_word(p) for p in path)
        if not words:
            state = self.sequence().generate_state((nbytes + 3) // 4, dtype=np.uint32)
            return state.tobytes()[:nbytes]
        pool, _ = self._pool(words)
        n_words = (nbytes + 3) // 4
        return struct.pack(f"<{n_words}I", *_generate_state(pool, n_words))[:nbytes]

    def _pool(self, words: tuple[int, ...]) -> tuple[tuple, int]:
        """The mixed pool (and hash constant) of the root entropy and the path ``words``, the
        prefixes' pools kept (up to ``_PREFIX_CACHE`` of them)."""
        cached = self._pools.get(words)
        if cached is not None:
            return cached
        if len(words) == 1:
            run = _uint32_words(int(self._root.entropy))
            run += [0] * (_POOL_SIZE - len(run))  # SeedSequence pads before a spawn key
            base = _initial_pool(run)
            state = _absorb(*base, run[_POOL_SIZE:] + _uint32_words(words[0]))
        else:
            state = _absorb(*self._pool(words[:-1]), _uint32_words(words[-1]))
        if len(self._pools) >= _PREFIX_CACHE:
            self._pools = {}
        self._pools[words] = state
        return state

    @property
    def randomness(self) -> str:
        """What the run's randomness guarantees, in words recorded in views and run records."""
        return "secure" if self.secure else "seeded: not private"

    def resume_from(self, entropy: int) -> None:
        """Continue a secure (unseeded) run from a checkpoint: take over its root entropy.

        A secure run's root entropy is as secret as its keys (FedRec's pseudo items and the
        client sampling derive from it), so checkpoints keep it only encrypted; the runtime
        decrypts it on resume and hands it here, so that the resumed run draws what the
        uninterrupted one would have.

        Raises:
            ValueError: for a seeded tree (its entropy is its seed).
        """
        if self.seed is not None:
            raise ValueError("a seeded tree resumes from its seed, not from stored entropy")
        self._root = np.random.SeedSequence(int(entropy))
        self._pools = {}

    def describe(self) -> dict[str, object]:
        """JSON-ready description, recorded in views and checkpoints (no secret in it)."""
        return {"seed": self.seed, "secure": self.secure, "randomness": self.randomness}
