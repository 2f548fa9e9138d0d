"""CKKS contexts (TenSEAL 0.3.18 over Microsoft SEAL): parameters, security checks, key views.

Two classes, two roles (DESIGN.md, "TenSEAL: public and secret contexts as different objects"):

* :class:`SecretContext`, held by the key holders (the users of Chai et al. 2020, "Secure
  Federated Matrix Factorization", who share one secret key; the parties of a fusion channel).
  It encrypts and decrypts.
* :class:`PublicContext`, the only thing a server ever gets. It is rebuilt from
  ``serialize(save_secret_key=False)``, so it holds no secret key: TenSEAL refuses to decrypt with
  it (``tests/test_ckks.py`` checks that). It can add and multiply ciphertexts (and, with the
  public-key encryption type, encrypt).

Parameters are chosen for a *circuit* (:func:`parameters_for`): ``"aggregation"`` (sums only, no
multiplication: one data prime sized for the sum's headroom) or a :class:`FusionCircuit` (an MLP
with a polynomial activation, evaluated and trained on ciphertexts: one rescaling prime per
multiplicative level). Whatever the origin, :func:`check_security` refuses a total coefficient
modulus above the 128-bit table of the HE standard as SEAL enforces it (specs/transport.md, CKKS):
degree 4096: 109 bits, 8192: 218, 16384: 438, 32768: 881, naming the numbers.

Ciphertexts cross a trust boundary as :class:`Ciphertext` envelopes (serialized bytes plus the
id of the key they were made under); a context refuses an envelope made under another key with
:class:`ContextMismatchError` instead of decrypting garbage (SEAL itself cannot tell two keys
with the same parameters apart).

Key files (provisioning across machines, no pickle): :func:`save_secret_context` writes
TenSEAL's own ``serialize(save_secret_key=True)`` bytes behind a magic line and a JSON header
(parameters, key id, SHA-256) to a file of mode 0600, for the key holders only;
:func:`load_secret_context` refuses a file its group or others may read.
:func:`save_public_context` / :func:`load_public_context` do the same for the server's context,
which a loader refuses if it holds a secret key.

Randomness: SEAL draws keys and encryption noise from its own CSPRNG, which cannot be seeded;
CKKS results are therefore reproducible only to CKKS precision, never bit for bit.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import stat
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import tenseal as ts

from securefed._checks import finite_array
from securefed.errors import InsecureParameterError, SecurefedError

MAX_COEFF_BITS: dict[int, int] = {4096: 109, 8192: 218, 16384: 438, 32768: 881}
"""Largest total coefficient-modulus bits at 128-bit classical security (HE standard, SEAL)."""

MAX_PRIME_BITS = 60
"""SEAL's largest coefficient-modulus prime."""

MIN_SCALE_BITS = 20
"""Below this the CKKS rounding error swamps any useful precision."""

DEFAULT_SCALE_BITS = 40
DEFAULT_EDGE_BITS = 60
"""Bits of the first (decryption) prime and of the special (key-switching) prime of a chain."""

FUSION_HEADROOM_BITS = 20
"""Fusion chains give the first prime this many bits over the scale: room for the values and the
server's masks (2^16) in the masked-gradient exchange, whatever the level."""

MIN_FUSION_SCALE_BITS = 30
"""The smallest scale the automatic fusion choice accepts before moving to a larger degree."""

Encryption = Literal["symmetric", "public-key"]
ENCRYPTIONS: tuple[str, ...] = ("symmetric", "public-key")


class ContextMismatchError(SecurefedError, ValueError):
    """A ciphertext was made under another key or parameter set than the context given."""


# ----------------------------------------------------------------------------- circuits
@dataclass(frozen=True)
class AggregationCircuit:
    """Sums of up to ``max_clients`` vectors whose entries lie in ``[-value_bound, value_bound]``.

    No multiplication happens, so the chain is one data prime (decryption modulus) and the special
    prime; the scale is what is left of the data prime after the sum's headroom:
    ``scale_bits = data_bits - headroom_bits`` with ``headroom_bits = ceil(log2(max_clients *
    value_bound)) + 2`` (one bit for the sign, one of margin). CKKS's fresh-encryption error is
    about ``2^(13 - scale_bits)`` per slot and client (measured at degree 8192).

    Attributes:
        max_clients: most clients a round may sum.
        value_bound: public bound on ``|w * x|`` and ``w`` of a client's upload.
    """

    max_clients: int = 1024
    value_bound: float = 65536.0

    def __post_init__(self) -> None:
        if isinstance(self.max_clients, bool) or int(self.max_clients) < 1:
            raise ValueError(f"max_clients must be >= 1, got {self.max_clients!r}")
        if not np.isfinite(self.value_bound) or self.value_bound <= 0:
            raise ValueError(f"value_bound must be finite and > 0, got {self.value_bound!r}")

    @property
    def headroom_bits(self) -> int:
        return math.ceil(math.log2(self.max_clients * self.value_bound)) + 2

    @property
    def levels(self) -> int:
        return 0


@dataclass(frozen=True)
class FusionCircuit:
    """An MLP of ``depth`` linear layers, a degree-``activation_degree`` polynomial between them.

    Evaluated as in :mod:`securefed.fusion.ckks`: every product with a plaintext weight and every
    ciphertext product costs one rescaling level; the activation's coefficients are folded into
    the next layer's weights, so a degree-``d`` activation costs ``ceil(log2 d)`` levels, not the
    ``ceil(log2 d) + 1`` of TenSEAL's ``polyval`` (measured: polyval of degree 2 needs two levels).

    Attributes:
        depth: number of linear layers (1 = a single linear map).
        activation_degree: degree of the polynomial activation (ignored when ``depth == 1``).
        training: also budget the levels of the masked-gradient exchange (backward pass).
    """

    depth: int = 2
    activation_degree: int = 2
    training: bool = True

    def __post_init__(self) -> None:
        for name in ("depth", "activation_degree"):
            value = getattr(self, name)
            if isinstance(value, bool) or int(value) != value or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")

    @property
    def levels(self) -> int:
        return fusion_levels(self.depth, self.activation_degree, training=self.training)


def power_depth(exponent: int) -> int:
    """Extra levels of ``z^exponent`` over ``z`` by binary powering: ``ceil(log2 exponent)``."""
    if exponent < 1:
        raise ValueError(f"exponent must be >= 1, got {exponent}")
    return math.ceil(math.log2(exponent))


def fusion_levels(depth: int, degree: int, *, training: bool = True) -> int:
    """Multiplicative levels the fused MLP needs (forward, and backward when ``training``).

    Mirrors the schedule of :mod:`securefed.fusion.ckks` (``tests/test_fusion.py`` checks it
    against a dry run of that schedule). With ``q = ceil(log2 degree)``, pre-activation ``z_l``
    sits at level ``l + (l - 1) q``. Backward, the output gradient arrives fresh (level 0) and
    ``G_{l-1} = sum_i (G_l (i c_i W_l)^T) * z_{l-1}^(i-1)`` costs one level for the plaintext
    product and one for the ciphertext product; each weight gradient is one more ciphertext
    product.
    """
    if depth < 1 or degree < 1:
        raise ValueError(f"depth and degree must be >= 1, got {depth}, {degree}")
    q = power_depth(degree)

    def z_level(layer: int) -> int:  # 1-based layer index
        return layer + (layer - 1) * q

    forward = z_level(depth)
    if not training:
        return forward
    deepest = forward
    g_level = 0  # gradient w.r.t. z_depth: fresh from the parties
    for layer in range(depth, 1, -1):
        previous = z_level(layer - 1)
        # dW_layer: (c_i G) (one level) times z_{layer-1}^i.
        deepest = max(deepest, max(g_level + 1, previous + q) + 1)
        # G_{layer-1}: the i = 1 term is one plaintext product; i >= 2 adds a ciphertext one.
        g_next = g_level + 1
        if degree >= 2:
            g_next = max(g_level + 1, previous + power_depth(degree - 1)) + 1
        g_level = g_next
        deepest = max(deepest, g_level)
    # dW_1 = x * G_1 and the input gradient G_1 W_1^T: one level each over G_1.
    return max(deepest, g_level + 1)


Circuit = Literal["aggregation"] | AggregationCircuit | FusionCircuit


# ----------------------------------------------------------------------------- parameters
def check_security(poly_modulus_degree: int, coeff_mod_bit_sizes: Sequence[int]) -> None:
    """Refuse parameters below 128-bit security.

    Raises:
        InsecureParameterError: the degree is not in the table, or the total coefficient bits
            exceed its 128-bit limit (both numbers named).
    """
    if poly_modulus_degree not in MAX_COEFF_BITS:
        known = ", ".join(f"{n}: {b}" for n, b in MAX_COEFF_BITS.items())
        raise InsecureParameterError(
            f"poly_modulus_degree {poly_modulus_degree} has no 128-bit entry (degree: max total "
            f"coefficient bits = {known})"
        )
    total = int(sum(coeff_mod_bit_sizes))
    limit = MAX_COEFF_BITS[poly_modulus_degree]
    if total > limit:
        raise InsecureParameterError(
            f"coefficient modulus {list(coeff_mod_bit_sizes)} totals {total} bits, above the "
            f"{limit} bits that degree {poly_modulus_degree} allows at 128-bit security; use a "
            "larger degree, fewer primes or smaller ones"
        )


@dataclass(frozen=True)
class CKKSParameters:
    """A validated CKKS parameter set (all public).

    The chain is ``[q_0, q_1 .. q_L, p]``: ``q_0`` is the decryption prime, ``q_1..q_L`` the
    rescaling primes (one per multiplicative level, each of ``scale_bits``), ``p`` the special
    prime used only for key switching (SEAL's convention: the last prime).

    Attributes:
        poly_modulus_degree: ring degree ``N``; a ciphertext holds ``N / 2`` slots.
        coeff_mod_bit_sizes: bit sizes of the chain.
        scale_bits: ``log2`` of the encoding scale.
        encryption: ``"symmetric"`` (only secret-key holders encrypt; about twice as fast) or
            ``"public-key"`` (anyone with the public context can encrypt).

    Raises:
        InsecureParameterError: above the 128-bit limit (:func:`check_security`).
        ValueError: a malformed chain (fewer than two primes, a prime outside [scale, 60] bits,
            rescaling primes unequal to the scale, a special prime smaller than a data prime).
    """

    poly_modulus_degree: int
    coeff_mod_bit_sizes: tuple[int, ...]
    scale_bits: int
    encryption: Encryption = "public-key"

    def __post_init__(self) -> None:
        bits = tuple(int(b) for b in self.coeff_mod_bit_sizes)
        object.__setattr__(self, "coeff_mod_bit_sizes", bits)
        check_security(self.poly_modulus_degree, bits)
        if len(bits) < 2:
            raise ValueError(
                f"a CKKS chain needs a data prime and a special prime, got {list(bits)}"
            )
        if self.encryption not in ENCRYPTIONS:
            raise ValueError(f"encryption must be one of {ENCRYPTIONS}, got {self.encryption!r}")
        if not MIN_SCALE_BITS <= self.scale_bits < MAX_PRIME_BITS:
            raise ValueError(
                f"scale_bits must lie in [{MIN_SCALE_BITS}, {MAX_PRIME_BITS}), "
                f"got {self.scale_bits}"
            )
        if any(b > MAX_PRIME_BITS or b < MIN_SCALE_BITS for b in bits):
            raise ValueError(
                f"every prime must have {MIN_SCALE_BITS}..{MAX_PRIME_BITS} bits, got {list(bits)}"
            )
        if bits[0] <= self.scale_bits:
            raise ValueError(
                f"the first prime ({bits[0]} bits) must exceed the scale ({self.scale_bits} "
                "bits): it holds the integer part of every decrypted value"
            )
        middle = bits[1:-1]
        if any(b != self.scale_bits for b in middle):
            raise ValueError(
                f"rescaling primes {list(middle)} must equal scale_bits={self.scale_bits}, "
                "or every rescale drifts the scale"
            )
        if bits[-1] < max(bits[:-1]):
            raise ValueError(
                f"the special prime ({bits[-1]} bits) must be at least the largest data prime "
                f"({max(bits[:-1])} bits)"
            )

    @property
    def slots(self) -> int:
        return self.poly_modulus_degree // 2

    @property
    def levels(self) -> int:
        """Multiplicative levels (rescaling primes)."""
        return len(self.coeff_mod_bit_sizes) - 2

    @property
    def total_bits(self) -> int:
        return sum(self.coeff_mod_bit_sizes)

    @property
    def scale(self) -> float:
        return float(2**self.scale_bits)

    def max_abs_value(self, level: int = 0) -> float:
        """Largest ``|value|`` decryptable at ``level`` (0 = fresh): one bit of sign and margin.

        At level ``l`` the ciphertext modulus is ``q_0 .. q_{L-l}``; a value times the scale
        must stay below half of it.
        """
        if not 0 <= level <= self.levels:
            raise ValueError(f"level must lie in [0, {self.levels}], got {level}")
        remaining = sum(self.coeff_mod_bit_sizes[: len(self.coeff_mod_bit_sizes) - 1 - level])
        return float(2.0 ** (remaining - self.scale_bits - 2))

    def public(self) -> dict[str, object]:
        """JSON-ready description (what every party, and the view, may know)."""
        return {
            "scheme": "CKKS (TenSEAL 0.3.18 / SEAL)",
            "poly_modulus_degree": self.poly_modulus_degree,
            "coeff_mod_bit_sizes": list(self.coeff_mod_bit_sizes),
            "total_coeff_bits": self.total_bits,
            "max_coeff_bits_128": MAX_COEFF_BITS[self.poly_modulus_degree],
            "scale_bits": self.scale_bits,
            "slots": self.slots,
            "levels": self.levels,
            "encryption": self.encryption,
        }


def _smallest_degree(total_bits: int) -> int:
    for degree, limit in MAX_COEFF_BITS.items():
        if total_bits <= limit:
            return degree
    raise InsecureParameterError(
        f"a chain of {total_bits} bits exceeds even degree 32768's 128-bit limit of "
        f"{MAX_COEFF_BITS[32768]} bits; use a shallower circuit or a smaller scale"
    )


def _fusion_chain(
    levels: int, scale_bits: int | None, degree: int | None
) -> tuple[int, list[int], int]:
    """``(scale, chain, degree)`` for ``levels`` rescaling levels (see :func:`parameters_for`)."""
    degrees = [degree] if degree is not None else list(MAX_COEFF_BITS)
    for candidate in degrees:
        limit = MAX_COEFF_BITS.get(candidate, 0)
        fits = (limit - 2 * FUSION_HEADROOM_BITS) // (levels + 2)
        scale = min(DEFAULT_SCALE_BITS, fits) if scale_bits is None else scale_bits
        if scale_bits is None and scale < MIN_FUSION_SCALE_BITS and degree is None:
            continue
        edge = min(MAX_PRIME_BITS, scale + FUSION_HEADROOM_BITS)
        return scale, [edge] + [scale] * levels + [edge], candidate
    raise InsecureParameterError(
        f"{levels} levels at a scale of at least {MIN_FUSION_SCALE_BITS} bits exceed even degree "
        f"32768's 128-bit limit of {MAX_COEFF_BITS[32768]} bits; use a shallower circuit"
    )


def parameters_for(
    circuit: Circuit = "aggregation",
    *,
    poly_modulus_degree: int | None = None,
    coeff_mod_bit_sizes: Sequence[int] | None = None,
    scale_bits: int | None = None,
    encryption: Encryption = "public-key",
) -> CKKSParameters:
    """Pick (or validate given) parameters for ``circuit``.

    * aggregation: degree 8192 (4096 slots, as the spec's measurements), chain ``[60, 60]``,
      scale ``60 - headroom_bits`` (32 bits for the default 1024 clients x 2^16).
    * fusion: the smallest degree whose 128-bit budget holds ``[s + 20, s x levels, s + 20]``
      with a scale ``s`` of at least 30 bits (``s`` is then as large as fits, at most 40). Depth 2,
      degree 2, training (3 levels): degree 8192, ``[55, 35, 35, 35, 55]`` (215 of 218 bits);
      4 levels: degree 16384, ``[60, 40, 40, 40, 40, 60]``.

    Explicit arguments override the choice and are validated the same way.

    Raises:
        InsecureParameterError: the chain exceeds the 128-bit limit of the degree.
        ValueError: a chain too short for the circuit, or otherwise malformed.
    """
    if circuit == "aggregation":
        circuit = AggregationCircuit()
    if not isinstance(circuit, (AggregationCircuit, FusionCircuit)):
        raise ValueError(
            f"circuit must be 'aggregation', an AggregationCircuit or a FusionCircuit, "
            f"got {circuit!r}"
        )
    if coeff_mod_bit_sizes is None:
        if isinstance(circuit, AggregationCircuit):
            edge = DEFAULT_EDGE_BITS
            scale = edge - circuit.headroom_bits if scale_bits is None else scale_bits
            chain = [edge, edge]
        else:
            scale, chain, degree_hint = _fusion_chain(
                circuit.levels, scale_bits, poly_modulus_degree
            )
            poly_modulus_degree = poly_modulus_degree or degree_hint
    else:
        chain = [int(b) for b in coeff_mod_bit_sizes]
        if scale_bits is not None:
            scale = scale_bits
        elif len(chain) > 2:
            scale = chain[1]
        else:
            scale = min(DEFAULT_SCALE_BITS, chain[0] - 1)
    if scale < MIN_SCALE_BITS:
        raise ValueError(
            f"the circuit leaves a scale of only {scale} bits (minimum {MIN_SCALE_BITS}); "
            "raise the degree, or lower the headroom (aggregation: max_clients x value_bound) "
            "or the levels"
        )
    degree = _smallest_degree(sum(chain)) if poly_modulus_degree is None else poly_modulus_degree
    if isinstance(circuit, AggregationCircuit) and poly_modulus_degree is None:
        degree = max(degree, 8192)
    params = CKKSParameters(degree, tuple(chain), int(scale), encryption)
    if params.levels < circuit.levels:
        raise ValueError(
            f"the chain {list(params.coeff_mod_bit_sizes)} has {params.levels} rescaling "
            f"level(s); the circuit {circuit} needs {circuit.levels}"
        )
    if isinstance(circuit, AggregationCircuit):
        capacity = params.max_abs_value(0)
        needed = circuit.max_clients * circuit.value_bound
        if needed > capacity:
            raise ValueError(
                f"{circuit.max_clients} clients x value_bound {circuit.value_bound:g} = "
                f"{needed:g} exceeds the {capacity:g} that a {params.coeff_mod_bit_sizes[0]}-bit "
                f"decryption prime holds at scale 2^{params.scale_bits}"
            )
    return params


# ----------------------------------------------------------------------------- envelopes
@dataclass(frozen=True, eq=False)
class Ciphertext:
    """One serialized CKKS ciphertext as it travels: bytes, the key id, the meaningful length.

    Attributes:
        key_id: id of the key it was made under (:attr:`SecretContext.key_id`).
        data: TenSEAL serialization of a one-ciphertext CKKSVector.
        length: number of meaningful slots (the rest are padding).
    """

    key_id: str
    data: bytes
    length: int

    @property
    def nbytes(self) -> int:
        return len(self.data)

    def digest(self) -> bytes:
        """SHA-256 of the serialized bytes (what a view keeps when the bytes are too big)."""
        return hashlib.sha256(self.data).digest()


def chunk_count(length: int, slots: int) -> int:
    """Ciphertexts needed for ``length`` values at ``slots`` per ciphertext."""
    return max(1, -(-int(length) // int(slots)))


class _ContextBase:
    """Shared plumbing: the TenSEAL context, its id, loading and dumping envelopes."""

    params: CKKSParameters
    key_id: str
    _context: ts.Context

    @property
    def tenseal(self) -> ts.Context:
        """The underlying TenSEAL context (for evaluating on :class:`tenseal.CKKSVector`)."""
        return self._context

    def load(self, ciphertext: Ciphertext) -> ts.CKKSVector:
        """Deserialize an envelope into this context.

        Raises:
            ContextMismatchError: made under another key, or bytes this context cannot parse.
        """
        if not isinstance(ciphertext, Ciphertext):
            raise TypeError(f"expected a Ciphertext envelope, got {type(ciphertext).__name__}")
        if ciphertext.key_id != self.key_id:
            raise ContextMismatchError(
                f"ciphertext was made under key {ciphertext.key_id}, this context holds key "
                f"{self.key_id}: refusing it (decryption would return garbage)"
            )
        try:
            return ts.ckks_vector_from(self._context, ciphertext.data)
        except (RuntimeError, ValueError) as error:
            raise ContextMismatchError(
                f"ciphertext bytes do not parse under this context's parameters "
                f"({self.params.poly_modulus_degree}, {list(self.params.coeff_mod_bit_sizes)}): "
                f"{error}"
            ) from error

    def dump(self, vector: ts.CKKSVector, length: int) -> Ciphertext:
        """Serialize ``vector`` (made or evaluated under this context) into an envelope."""
        return Ciphertext(self.key_id, vector.serialize(), int(length))

    def _encrypt_chunks(self, values: np.ndarray) -> list[Ciphertext]:
        values = finite_array("values to encrypt", values)
        if values.ndim != 1:
            raise ValueError(f"encrypt takes a 1-D vector, got shape {values.shape}")
        slots = self.params.slots
        out = []
        for start in range(0, max(len(values), 1), slots):
            chunk = values[start : start + slots]
            out.append(self.dump(self.encrypt_vector(chunk), len(chunk)))
        return out

    def encrypt_vector(self, values: np.ndarray) -> ts.CKKSVector:
        """Encrypt at most ``slots`` values into one ciphertext."""
        values = np.asarray(values, dtype=np.float64)
        if values.ndim != 1 or len(values) > self.params.slots:
            raise ValueError(
                f"one ciphertext holds a 1-D vector of at most {self.params.slots} values, "
                f"got shape {values.shape}"
            )
        if len(values) == 0:
            values = np.zeros(1)
        # The raw constructor skips TenSEAL's PlainTensor round trip (about 0.1 ms per call).
        return ts.CKKSVector(data=ts._ts_cpp.CKKSVector(self._context.data, values.tolist()))


class PublicContext(_ContextBase):
    """The server's view of the keys: parameters, relinearization keys, maybe the public key.

    Built from ``SecretContext.serialize(save_secret_key=False)`` bytes; it never held a secret
    key, so it cannot decrypt. It adds and multiplies ciphertexts; with ``"public-key"``
    encryption it can also encrypt (a committee model, in which clients need only this).

    Args:
        serialized: TenSEAL context bytes without the secret key.
        key_id: id of the key pair (travels with the bytes).
        params: the parameter set.

    Raises:
        InsecureParameterError: if the bytes hold a secret key (never give one to a server).
    """

    def __init__(self, serialized: bytes, *, key_id: str, params: CKKSParameters) -> None:
        context = ts.context_from(serialized, n_threads=1)
        if context.has_secret_key():
            raise InsecureParameterError(
                "the serialized context holds a secret key: a PublicContext must be built from "
                "serialize(save_secret_key=False)"
            )
        context.global_scale = params.scale
        self._context = context
        self.serialized = bytes(serialized)
        self.key_id = key_id
        self.params = params

    def __reduce__(self):
        # Pickles as its own serialization (no secret key in it): for process-parallel runs.
        return (_public_from_state, (self.serialized, self.key_id, self.params))

    @property
    def nbytes(self) -> int:
        """Size of what a server (or a committee-model client) downloads."""
        return len(self.serialized)

    @property
    def can_encrypt(self) -> bool:
        return self.params.encryption == "public-key"

    @property
    def has_relin_keys(self) -> bool:
        return bool(self._context.has_relin_keys())

    def encrypt(self, values: np.ndarray) -> list[Ciphertext]:
        """Encrypt ``values`` into ``ceil(len / slots)`` ciphertexts (public-key contexts only).

        Raises:
            ValueError: for a symmetric context (only key holders can encrypt).
        """
        if not self.can_encrypt:
            raise ValueError(
                "this public context comes from a symmetric-encryption key: only the key "
                "holders (SecretContext) can encrypt"
            )
        return self._encrypt_chunks(values)

    def encrypt_vector(self, values: np.ndarray) -> ts.CKKSVector:
        if not self.can_encrypt:
            raise ValueError("a symmetric public context cannot encrypt")
        return super().encrypt_vector(values)


class SecretContext(_ContextBase):
    """The key holders' context: encrypts, decrypts, and hands out :class:`PublicContext` copies.

    Args:
        params: a validated parameter set (see :func:`ckks_context`).
        relin_keys: generate relinearization keys (needed for ciphertext products).
        galois_keys: generate Galois keys (rotations; about 35 MB at degree 8192: only for
            circuits that rotate, which none in securefed does).
    """

    def __init__(
        self, params: CKKSParameters, *, relin_keys: bool = True, galois_keys: bool = False
    ) -> None:
        encryption_type = (
            ts.ENCRYPTION_TYPE.SYMMETRIC
            if params.encryption == "symmetric"
            else ts.ENCRYPTION_TYPE.ASYMMETRIC
        )
        context = ts.context(
            ts.SCHEME_TYPE.CKKS,
            params.poly_modulus_degree,
            coeff_mod_bit_sizes=list(params.coeff_mod_bit_sizes),
            encryption_type=encryption_type,
            n_threads=1,
        )
        context.global_scale = params.scale
        if galois_keys:
            context.generate_galois_keys()
        self._context = context
        self.params = params
        self._relin = bool(relin_keys)
        self._galois = bool(galois_keys)
        # Relinearization keys are fresh randomness under this secret key: their hash names it.
        material = context.serialize(
            save_public_key=False,
            save_secret_key=False,
            save_galois_keys=False,
            save_relin_keys=True,
        )
        self.key_id = hashlib.sha256(material).hexdigest()[:16]
        self._public: PublicContext | None = None

    def __reduce__(self):
        # For process-parallel simulations only: the pickle holds the secret key.
        state = self.serialize_secret()
        return (_secret_from_state, (state, self.key_id, self.params, self._relin, self._galois))

    def serialize_secret(self) -> bytes:
        """TenSEAL's own serialization *with* the secret key (``save_secret_key=True``).

        For provisioning the key holders out of band (:func:`save_secret_context`); never send
        these bytes to a server.
        """
        return self._context.serialize(
            save_public_key=self.params.encryption == "public-key",
            save_secret_key=True,
            save_galois_keys=self._galois,
            save_relin_keys=True,
        )

    def serialize_public(self) -> bytes:
        """The context without its secret key (``save_secret_key=False``)."""
        return self._context.serialize(
            save_public_key=self.params.encryption == "public-key",
            save_secret_key=False,
            save_galois_keys=self._galois,
            save_relin_keys=self._relin,
        )

    def public(self) -> PublicContext:
        """The :class:`PublicContext` for a server (built once from the serialized bytes)."""
        if self._public is None:
            self._public = PublicContext(
                self.serialize_public(), key_id=self.key_id, params=self.params
            )
        return self._public

    def encrypt(self, values: np.ndarray) -> list[Ciphertext]:
        """Encrypt ``values`` into ``ceil(len / slots)`` ciphertexts, filling every slot."""
        return self._encrypt_chunks(values)

    def decrypt(self, ciphertexts: Ciphertext | Sequence[Ciphertext]) -> np.ndarray:
        """Decrypt one envelope or the concatenation of several (their meaningful slots).

        Raises:
            ContextMismatchError: an envelope made under another key.
        """
        if isinstance(ciphertexts, Ciphertext):
            ciphertexts = [ciphertexts]
        parts = [self.decrypt_vector(self.load(c), c.length) for c in ciphertexts]
        return np.concatenate(parts) if parts else np.zeros(0)

    def decrypt_vector(self, vector: ts.CKKSVector, length: int | None = None) -> np.ndarray:
        """Decrypt an in-memory vector with this context's secret key (first ``length`` slots)."""
        values = np.asarray(vector.decrypt(self._context.secret_key()), dtype=np.float64)
        return values if length is None else values[:length]


def _public_from_state(serialized: bytes, key_id: str, params: CKKSParameters) -> PublicContext:
    return PublicContext(serialized, key_id=key_id, params=params)


def _secret_from_state(
    serialized: bytes,
    key_id: str,
    params: CKKSParameters,
    relin: bool,
    galois: bool,
    context: ts.Context | None = None,
) -> SecretContext:
    secret = SecretContext.__new__(SecretContext)
    context = ts.context_from(serialized, n_threads=1) if context is None else context
    context.global_scale = params.scale
    secret._context = context
    secret.params = params
    secret._relin, secret._galois = relin, galois
    secret.key_id = key_id
    secret._public = None
    return secret


# ----------------------------------------------------------------------------- key files
SECRET_FILE_MAGIC = b"securefed-ckks-secret-context/1\n"
PUBLIC_FILE_MAGIC = b"securefed-ckks-public-context/1\n"
SECRET_FILE_MODE = 0o600
"""A secret-context file is readable and writable by its owner only (as ssh's private keys)."""


def _params_header(params: CKKSParameters) -> dict[str, object]:
    return {
        "poly_modulus_degree": params.poly_modulus_degree,
        "coeff_mod_bit_sizes": list(params.coeff_mod_bit_sizes),
        "scale_bits": params.scale_bits,
        "encryption": params.encryption,
    }


def _write_key_file(
    path: str | os.PathLike, magic: bytes, header: dict[str, object], payload: bytes
) -> Path:
    """Write ``magic``, one JSON header line and ``payload`` atomically, mode 0600.

    The file is created by :func:`tempfile.mkstemp` (mode 0600 from the start, so the bytes are
    never readable by others, not even briefly) in the target's directory and renamed over it.
    """
    path = Path(path)
    header = header | {"sha256": hashlib.sha256(payload).hexdigest(), "nbytes": len(payload)}
    line = json.dumps(header, sort_keys=True).encode() + b"\n"
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(descriptor, "wb") as out:
            out.write(magic + line + payload)
        os.chmod(temporary, SECRET_FILE_MODE)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


def _read_key_file(path: str | os.PathLike, magic: bytes) -> tuple[dict[str, object], bytes]:
    """``(header, payload)`` of a key file, its magic line and SHA-256 checked.

    Raises:
        FileNotFoundError: no such file.
        ValueError: not a key file of this kind, a malformed header, or corrupted bytes.
    """
    path = Path(path)
    data = path.read_bytes()
    if not data.startswith(magic):
        raise ValueError(
            f"{path} is not a {magic.decode().strip()} file (it starts with {data[:32]!r})"
        )
    end = data.find(b"\n", len(magic))
    try:
        header = json.loads(data[len(magic) : end])
    except (ValueError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}: malformed header: {error}") from error
    payload = data[end + 1 :]
    if len(payload) != header.get("nbytes") or (
        hashlib.sha256(payload).hexdigest() != header.get("sha256")
    ):
        raise ValueError(
            f"{path}: the context bytes do not match the header's size and SHA-256 (truncated "
            "or corrupted file)"
        )
    return header, payload


def _params_from_header(path: Path, header: dict[str, object]) -> CKKSParameters:
    try:
        return CKKSParameters(
            int(header["poly_modulus_degree"]),
            tuple(int(b) for b in header["coeff_mod_bit_sizes"]),
            int(header["scale_bits"]),
            str(header["encryption"]),
        )
    except KeyError as error:
        raise ValueError(f"{path}: the header lacks {error}") from error


def save_secret_context(secret: SecretContext, path: str | os.PathLike) -> Path:
    """Write the key holders' context for out-of-band provisioning: no pickle, mode 0600.

    The file is a magic line, one JSON header line (the public parameters, the key id, the
    SHA-256 and size of the payload) and TenSEAL's own ``serialize(save_secret_key=True)``
    bytes. Copy it to each key holder over a secure channel (e.g. ``scp``), never to a server;
    :func:`load_secret_context` reads it and refuses a file others may read.

    Returns:
        The path written.
    """
    if not isinstance(secret, SecretContext):
        raise TypeError(f"expected a SecretContext, got {type(secret).__name__}")
    header = _params_header(secret.params) | {
        "key_id": secret.key_id,
        "relin_keys": secret._relin,
        "galois_keys": secret._galois,
    }
    return _write_key_file(path, SECRET_FILE_MAGIC, header, secret.serialize_secret())


def load_secret_context(path: str | os.PathLike) -> SecretContext:
    """Read a file of :func:`save_secret_context` (TenSEAL bytes; nothing is unpickled).

    Raises:
        InsecureParameterError: the file is readable or writable by its group or others (POSIX;
            ``chmod 600`` it), or holds no secret key.
        ValueError: not a secret-context file, or corrupted.
    """
    path = Path(path)
    if os.name == "posix":
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            raise InsecureParameterError(
                f"{path} holds a CKKS secret key but has mode {mode:04o}: others may read or "
                f"replace it; run `chmod 600 {path}`"
            )
    header, payload = _read_key_file(path, SECRET_FILE_MAGIC)
    params = _params_from_header(path, header)
    context = ts.context_from(payload, n_threads=1)
    if not context.has_secret_key():
        raise InsecureParameterError(f"{path} holds no secret key: it cannot decrypt")
    return _secret_from_state(
        payload,
        str(header["key_id"]),
        params,
        bool(header.get("relin_keys", True)),
        bool(header.get("galois_keys", False)),
        context=context,
    )


def save_public_context(public: PublicContext | SecretContext, path: str | os.PathLike) -> Path:
    """Write the server's context (``serialize(save_secret_key=False)`` bytes, no pickle).

    A :class:`SecretContext` is accepted and reduced to its :meth:`SecretContext.public` view
    first: the file never holds the secret key.
    """
    if isinstance(public, SecretContext):
        public = public.public()
    if not isinstance(public, PublicContext):
        raise TypeError(f"expected a PublicContext, got {type(public).__name__}")
    header = _params_header(public.params) | {"key_id": public.key_id}
    return _write_key_file(path, PUBLIC_FILE_MAGIC, header, public.serialized)


def load_public_context(path: str | os.PathLike) -> PublicContext:
    """Read a file of :func:`save_public_context`.

    Raises:
        InsecureParameterError: the bytes hold a secret key (a server must never load one).
        ValueError: not a public-context file, or corrupted.
    """
    path = Path(path)
    header, payload = _read_key_file(path, PUBLIC_FILE_MAGIC)
    params = _params_from_header(path, header)
    return PublicContext(payload, key_id=str(header["key_id"]), params=params)


def ckks_context(
    circuit: Circuit = "aggregation",
    *,
    poly_modulus_degree: int | None = None,
    coeff_mod_bit_sizes: Sequence[int] | None = None,
    scale_bits: int | None = None,
    encryption: Encryption = "public-key",
) -> SecretContext:
    """Generate keys for ``circuit`` (see :func:`parameters_for` for the choice and the checks).

    Returns the key holders' :class:`SecretContext`; give a server only ``.public()``.

    Example:
        >>> secret = ckks_context("aggregation")
        >>> server = secret.public()
        >>> [c] = secret.encrypt(np.array([1.0, 2.0]))
        >>> total = server.load(c) + server.load(c)
        >>> np.round(secret.decrypt(server.dump(total, 2)), 4).tolist()
        [2.0, 4.0]
    """
    params = parameters_for(
        circuit,
        poly_modulus_degree=poly_modulus_degree,
        coeff_mod_bit_sizes=coeff_mod_bit_sizes,
        scale_bits=scale_bits,
        encryption=encryption,
    )
    needs_relin = isinstance(circuit, FusionCircuit)
    return SecretContext(params, relin_keys=needs_relin)


# ----------------------------------------------------------------------------- releasing values
@dataclass(frozen=True)
class Flooding:
    """What a key holder does to decrypted values before they reach a ciphertext's holder.

    CKKS decryption returns ``m + e`` with ``e`` a function of the secret key and the encryption
    randomness; handing ``m + e`` to the party that holds the ciphertext lets it set up linear
    equations in the secret key (Li and Micciancio, EUROCRYPT 2021). The key holder therefore adds
    Gaussian noise of standard deviation ``std`` and rounds to a multiple of ``step`` before a
    decryption leaves it (specs/transport.md, CKKS).

    The defaults (``std`` 2^-20, ``step`` 2^-24) sit about 2^7..2^12 above the fresh CKKS error
    at the scales securefed picks (2^-27 at scale 2^40, 2^-19 at 2^32): they defeat the exact
    key-recovery attack, but they are not a proof of ``2^-s`` statistical distance, which would
    need ``std >= 2^s`` times the error bound (raise ``std``, or the scale, for that).

    Attributes:
        std: standard deviation of the flooding noise (0 disables it).
        step: rounding grid (0 disables rounding).
    """

    std: float = 2.0**-20
    step: float = 2.0**-24

    def __post_init__(self) -> None:
        for name in ("std", "step"):
            value = getattr(self, name)
            if not np.isfinite(value) or value < 0:
                raise ValueError(f"flooding {name} must be finite and >= 0, got {value!r}")

    def apply(self, values: np.ndarray, noise) -> np.ndarray:
        """``round((values + N(0, std^2)) / step) * step``; ``noise`` is a NoiseSource."""
        values = np.asarray(values, dtype=np.float64)
        if self.std > 0:
            values = values + noise.normal(self.std, values.shape)
        if self.step > 0:
            values = np.round(values / self.step) * self.step
        return values

    def public(self) -> dict[str, float]:
        return {"flood_std": self.std, "round_step": self.step}
