"""A per-position polynomial server network on CKKS ciphertexts, one key per party (FedSlate).

The server function of the ``"per_party"`` layout (:mod:`securefed.fusion.module`) with
``members`` side by side, evaluated on ciphertexts: for output party ``p``,
``y_p[s, b, i] = f_s(x_p[s, b, i], x_others[s, b, i])``, a per-position MLP with a polynomial
activation, trained by the server's own torch optimiser (Adam for FedSlate).

Keys. Every party holds its own CKKS key pair (:class:`~securefed.crypto.ckks.SecretContext`);
the server holds only the parties' :class:`~securefed.crypto.ckks.PublicContext` (public and
relinearization keys, no secret key). Everything computed for ``p`` is computed under ``p``'s
key: ``p`` encrypts its own vector under its key, every other party encrypts its vector under
``p``'s public key (TenSEAL has no multi-key CKKS; a masked key switch from the other party's
key would give the server the same ciphertext at the cost of one decryption and encryption per
ciphertext by that party), and ``p`` gets its output back under its key. So the other parties
never receive anything computed from another party's vector but their own outputs, and the
server never decrypts.

Halves. Every operation that needs a secret key, and everything a party computes from its own
values, is :class:`ModuleKeyParty`'s (the platform half); the channel is the server half: the
:class:`~securefed.crypto.ckks.PublicContext` it builds from each party's
:meth:`ModuleKeyParty.public_bytes` (:func:`server_context`, which refuses bytes holding a secret
key), the evaluation, the masks and the optimiser. Ciphertexts cross through
:meth:`CKKSModuleFusionChannel._to_server` and :meth:`CKKSModuleFusionChannel._to_party`: linked
in memory, or serialized as a message carries them (``serialize_handovers``).

Packing: the ``(members, batch, positions)`` entries of a party's vector, flattened, fill the
slots (``N / 2 = 4096`` at degree 8192; larger vectors are split into chunks): one ciphertext
per party per chunk whatever the network's width.

Evaluation (:mod:`securefed.fusion.expansion`): the network is the polynomial
``f(x) = sum_m C_m x^m`` of total degree ``D = d^(depth - 1)`` in its ``K`` inputs; the server
expands its weights into the coefficients ``C`` ``(members, M)`` in the clear, computes the
monomials ``x^m`` by ciphertext products (binary powering: ``ceil(log2 D)`` levels) and their
combination with per-member coefficient vectors (one level). The plaintext model trains with the
same polynomial activation, so both compute the same function.

Training (the masked exchange of FATE's interactive layer, specs/transport.md): ``p`` sends
``[[g]]`` (the gradient of its loss with respect to its output, zeros at positions it did not
ask for); the server needs in the clear only the per-member batch sums ``S_m = sum g x^m``
(:mod:`securefed.fusion.expansion`: the weight gradient is ``sum_m dC_m/dtheta S_m``). For each
it adds a uniform mask ``R`` (every slot, ``|R| <= 2^16`` at the default chains) to
``[[g x^m]]``, ``p`` decrypts, sums each member's slots, floods and rounds
(:class:`~securefed.crypto.ckks.Flooding` with its std derived from
:func:`masked_sum_error_bound`, :func:`~securefed.crypto.flooding.flooding_floor`) and returns one
number per member; the server subtracts ``sum R``, back-propagates ``sum_m C_m(theta) S_m`` through
its coefficient expansion and steps its optimiser. Adam needs nothing more: it is a function of
the batch gradients that the server obtains for SGD anyway. ``p``'s input gradient
``g * df/dx_p`` is computed on ciphertexts and returned under ``p``'s key.

What each side learns: the server learns the per-member batch sums ``S_m`` (batch gradients; the
same as SGD through the exchange) and nothing of a single entry; ``p`` sees masked values (hidden
up to ``|v| / 2^16`` per slot), its own outputs and input gradients. ``p`` decrypts at the slot
level, every slot a complex number: the mask ``R + i R'`` (:func:`every_slot_mask`) covers the
real and the imaginary part of **every** slot (TenSEAL replicates a short vector over all slots,
so a product's slots beyond its length hold ``g x^m`` again; the imaginary parts hold noise terms
such as ``x_1`` times ``p``'s own error) and is added as a fresh public-key encryption (the
masked product re-randomized: its ``c1`` is fresh), so each slot's noise terms are hidden up to
:func:`mask_hiding_distance` (refused above ``2^-20``). Every output and input gradient returned
to a party is re-randomized with a fresh encryption, at its level, of complex noise on every
slot: ``output_noise_std`` on the real parts, :data:`IMAGINARY_STD` on the imaginary parts
(attacks: :mod:`securefed.attacks.ckks_owner`). A malicious ``p`` that encrypts ``g + i T``
instead of ``g`` reads ``x_1`` from the imaginary parts (``T x_1`` beyond any mask the level
holds); the server cannot tell such a ciphertext from an honest one: not covered. A server
colluding with ``p`` decrypts the other parties' vectors encrypted under ``p``'s key
(non-colluding parties are assumed, as in every two-server vertical FL scheme).
"""

from __future__ import annotations

import hashlib
import itertools
import math
import os
import struct
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tenseal as ts
import tenseal.sealapi as sealapi

from securefed.crypto.ckks import (
    Flooding,
    FusionCircuit,
    PublicContext,
    SecretContext,
    ckks_context,
    decryption_error_bound,
    error_tail_factor,
    parameters_for,
    symmetric_twin,
)
from securefed.crypto.flooding import MIN_FLOODING_SECURITY_BITS, flooding_floor
from securefed.errors import InsecureParameterError
from securefed.fusion.base import (
    Inquiry,
    as_numpy,
    check_input_parties,
    check_network,
    check_parties_named,
    check_positions,
    pick,
    scatter_positions,
)
from securefed.fusion.ckks import _MaskSource
from securefed.fusion.expansion import (
    derivative,
    expand,
    monomial_level,
    monomials,
    split_monomial,
)
from securefed.fusion.module import TorchServerChannel
from securefed.privacy.noise import noise_source
from securefed.randomness import SeedTree
from securefed.views import NO_PAYLOADS, FusionView, RoundSelection

__all__ = [
    "IMAGINARY_STD",
    "STEP_STAGES",
    "CKKSModuleConfig",
    "CKKSModuleFusionChannel",
    "FreshEncryptor",
    "ModuleKeyParty",
    "check_imaginary_flooding",
    "check_mask_hiding",
    "check_public_context",
    "circuit_levels",
    "context_chain_bits",
    "every_slot_mask",
    "input_gradient_error_bound",
    "mask_hiding_distance",
    "masked_sum_error_bound",
    "module_key_circuit",
    "polynomial_error_bound",
    "public_key_id",
    "server_context",
    "server_context_from_bytes",
    "tenseal_vector_bytes",
]

STEP_STAGES = ("encryption", "server_evaluation", "exchange", "decryption")
"""Where a channel's time goes (``channel.seconds``: CPU seconds of the process, so that a
shared machine's load does not inflate them; the work is single-threaded)."""


def circuit_levels(degree: int) -> int:
    """Levels of the evaluation and the training exchange of a degree-``D`` polynomial.

    Forward: monomials at ``ceil(log2 D)`` levels, one more for the coefficients. Weight sums:
    ``g x^m`` one level over the monomial. Input gradient: ``(g * c') x^m`` for ``|m| <= D - 1``:
    ``max(1, level(x^m)) + 1``. All within ``ceil(log2 D) + 1`` (1 for a linear network).
    """
    if degree < 1:
        raise ValueError(f"degree must be >= 1, got {degree}")
    return monomial_level(degree) + 1


def masked_sum_error_bound(
    base_error: float, degree: int, value_bound: float, grad_bound: float, n_slots: int
) -> float:
    """Bound on the key-dependent error of one released masked sum ``sum_slots g x^m``.

    Model (stated, per slot): every fresh encryption, rescaling and relinearization adds an
    error of at most ``base_error`` (the public-key encryption bound of
    :func:`~securefed.crypto.ckks.decryption_error_bound` for one ciphertext: the same
    ``(r_0 + r_1 s) / scale`` rounding form, SEAL dividing by a prime each time); a product of
    values ``|a| <= A``, ``|b| <= B`` with errors ``e_a``, ``e_b`` errs by at most
    ``A e_b + B e_a + e_a e_b + base_error``; the mask's encoding adds one more ``base_error``.
    With ``|x| <= value_bound`` (the parties refuse larger inputs) and ``|g| <= grad_bound``,
    the monomial of degree ``D`` (the worst) is built by binary powering; the sum of ``n_slots``
    slots errs by at most ``n_slots`` times the slot's bound.
    """
    if base_error <= 0 or value_bound <= 0 or grad_bound <= 0 or n_slots < 1:
        raise ValueError("base_error, value_bound, grad_bound and n_slots must be > 0")

    magnitude, error = _monomial_bounds(base_error, value_bound, degree)
    slot = grad_bound * error + magnitude * base_error + error * base_error + 2 * base_error
    return n_slots * slot


def _monomial_bounds(base_error: float, value_bound: float, total: int) -> tuple[float, float]:
    """``(magnitude, error)`` bounds of a monomial of degree ``total`` built by binary powering
    from fresh ciphertexts of ``|x| <= value_bound`` (the model of
    :func:`masked_sum_error_bound`)."""
    if total == 0:
        return 1.0, 0.0
    if total == 1:
        return value_bound, base_error
    (ma, ea) = _monomial_bounds(base_error, value_bound, (total + 1) // 2)
    (mb, eb) = _monomial_bounds(base_error, value_bound, total // 2)
    return ma * mb, ma * eb + mb * ea + ea * eb + base_error


def polynomial_error_bound(
    base_error: float,
    coefficients: np.ndarray,
    basis: Sequence[tuple[int, ...]],
    value_bound: float,
    output_noise_std: float,
) -> float:
    """Bound on ``|decrypted - exact|`` per slot of ``sum_m C_m x^m`` as the channel evaluates
    it (per member: ``coefficients`` ``(M,)``), returned re-randomized.

    The model of :func:`masked_sum_error_bound`: each monomial's error, times ``|C_m|``, plus
    one ``base_error`` per plaintext product (encoding and rescaling, scaled by the monomial's
    magnitude) and for the constant; the re-randomizing noise adds its own Gaussian tail
    (:func:`~securefed.crypto.ckks.error_tail_factor` standard deviations) and one fresh
    encryption.
    """
    total = base_error + 2 * base_error
    for c, exponent in zip(coefficients, basis, strict=True):
        degree = sum(exponent)
        if degree == 0:
            continue
        magnitude, error = _monomial_bounds(base_error, value_bound, degree)
        total += abs(float(c)) * error + max(magnitude, 1.0) * base_error
    return total + error_tail_factor() * output_noise_std


def input_gradient_error_bound(
    base_error: float,
    derivative_coefficients: np.ndarray,
    basis: Sequence[tuple[int, ...]],
    value_bound: float,
    grad_bound: float,
    output_noise_std: float,
) -> float:
    """Bound per slot on the error of ``g * sum_k d_k x^k`` computed as ``sum_k (g d_k) x^k``
    (one member's derivative coefficients ``d``), returned re-randomized (same model)."""
    total = 0.0
    for d, exponent in zip(derivative_coefficients, basis, strict=True):
        scaled = grad_bound * abs(float(d))
        scaled_error = scaled * base_error + base_error
        magnitude, error = _monomial_bounds(base_error, value_bound, sum(exponent))
        total += scaled * error + magnitude * scaled_error + error * scaled_error + base_error
    return total + base_error + error_tail_factor() * output_noise_std


# ----------------------------------------------------------------------------- configuration
CIRCUITS = ("monomials", "packed")
"""``"monomials"``: :class:`CKKSModuleFusionChannel` (any degree; each monomial by ciphertext
products, one masked exchange per monomial); ``"packed"``:
:class:`~securefed.fusion.ckks_packed.PackedCKKSModuleFusionChannel` (degree <= 2, two
parties; powers in the clear, regions, one exchange a backward)."""


@dataclass(frozen=True)
class CKKSModuleConfig:
    """Parameters of :class:`CKKSModuleFusionChannel`.

    Attributes:
        value_bound: public bound on ``|x|`` of every party's vector (a party refuses to
            encrypt a larger value, naming it: the flooding's error bound rests on it).
        grad_bound: public bound on ``|g|`` of the output gradients (refused likewise).
        flooding: the key holder's release of each masked sum; ``std=None`` (default) floods at
            :func:`~securefed.crypto.flooding.flooding_floor` of :func:`masked_sum_error_bound`
            at ``security_bits``; a given std below that floor is refused.
        output_noise_std: Gaussian noise, freshly encrypted under the receiver's public key,
            added to every ciphertext returned to a party (circuit privacy).
        mask_bits: masks are uniform in ``[-2^mask_bits, 2^mask_bits]``; ``None``: the chain's
            :attr:`~securefed.crypto.ckks.CKKSParameters.mask_bits` (two bits below what the
            deepest level holds, at most 16).
        poly_modulus_degree: ring degree (``None``: the smallest that fits the levels).
        scale_bits: ``log2`` of the encoding scale (``None``: as large as fits, at most 40).
            A larger scale lowers every operation's error (and so the flooding std at a given
            security level); above 40 bits the chain gets a spare prime that keeps the deepest
            level's room (:func:`~securefed.crypto.ckks.parameters_for`), and the ring degree
            doubles to 16384 (2^55 measured in docs/fedslate.md section 7). The packed
            circuit's default is 2^49 at ring 8192 (chain ``[60, 49, 49, 60]``).
        circuit: :data:`CIRCUITS` (which channel :func:`~securefed.fusion.build_fusion_channel`
            builds).
        output_shift_bits: packed circuit: outputs and input gradients are evaluated times
            ``2^-k`` (so that they fit the deepest level) and multiplied back by the party.
        repeat_inquiries: packed circuit: a training forward that repeats the last forward's
            vectors and online weights reuses its ciphertexts (the server learns the repeat),
            and an announced training forward joins the forward before it
            (:meth:`~securefed.fusion.ckks_packed.PackedCKKSModuleFusionChannel.announce`).
        serialize_handovers: every ciphertext crossing between a party
            (:class:`ModuleKeyParty`) and the server is serialized and deserialized by the
            receiver, as a message carries it (``channel.handed_bytes`` counts them); ``False``
            (default) links it to the receiver's context in memory (the same ciphertext, no
            copy).
    """

    value_bound: float = 8.0
    grad_bound: float = 1.0
    flooding: Flooding = field(default_factory=lambda: Flooding(std=None, security_bits=20))
    output_noise_std: float = 2.0**-20
    mask_bits: int | None = None
    poly_modulus_degree: int | None = None
    scale_bits: int | None = None
    circuit: str = "monomials"
    output_shift_bits: int = 8
    repeat_inquiries: bool = True
    serialize_handovers: bool = False

    def __post_init__(self) -> None:
        if self.circuit not in CIRCUITS:
            raise ValueError(f"circuit must be one of {CIRCUITS}, got {self.circuit!r}")
        shift = self.output_shift_bits
        if isinstance(shift, bool) or not isinstance(shift, int) or not 0 <= shift <= 20:
            raise ValueError(f"output_shift_bits must be an integer in [0, 20], got {shift!r}")
        for name in ("value_bound", "grad_bound"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be finite and > 0, got {value!r}")
        if not isinstance(self.flooding, Flooding):
            raise TypeError(f"flooding must be a Flooding, got {type(self.flooding).__name__}")
        if not math.isfinite(self.output_noise_std) or self.output_noise_std < 0:
            raise ValueError(f"output_noise_std must be >= 0, got {self.output_noise_std!r}")
        if self.mask_bits is not None and not 1 <= self.mask_bits <= 40:
            raise ValueError(f"mask_bits must lie in [1, 40], got {self.mask_bits!r}")


# ----------------------------------------------------------------------------- a party
class ModuleKeyParty:
    """The platform half of the CKKS channels: one party's secret key and every operation that
    needs it (:class:`CKKSModuleFusionChannel` and the packed circuit call only these).

    What leaves the party: its public context's bytes (:meth:`public_bytes`, no secret key: the
    server builds its :class:`~securefed.crypto.ckks.PublicContext` from them, which refuses a
    context holding one), ciphertexts (:meth:`encrypt_for`, :meth:`encrypt_own`) and released
    numbers (:meth:`release_sums`, :meth:`release_own`). What reaches it: ciphertexts under its
    key, in memory or as the serialized bytes a message carries (:meth:`receive`).

    Args:
        name: the party.
        secret: its key pair (never leaves it).
        own_encryption: also keep the secret-key (symmetric) twin of the context
            (:func:`~securefed.crypto.ckks.symmetric_twin`) for :meth:`encrypt_own`.
    """

    def __init__(self, name: str, secret: SecretContext, *, own_encryption: bool = False) -> None:
        self.name = name
        self._secret = secret
        self._own = symmetric_twin(secret) if own_encryption else None

    @property
    def public(self) -> PublicContext:
        """Its public context (built on first use: a party rebuilt for every message of a node
        does not pay for it when the message needs none)."""
        return self._secret.public()

    @property
    def slots(self) -> int:
        return self._secret.params.slots

    def public_bytes(self) -> bytes:
        """What the server receives of this party's keys: the serialized public context
        (public and relinearization keys, ``save_secret_key=False``)."""
        return self.public.serialized

    def encrypt_for(self, values: np.ndarray, recipient: ModuleKeyParty | PublicContext):
        """Encrypt a flat vector's chunks under ``recipient``'s key (its own: the secret
        context; another party's: that party's public context)."""
        if recipient is self:
            context = self._secret
        else:
            context = recipient if isinstance(recipient, PublicContext) else recipient.public
        slots = self.slots
        return [
            context.encrypt_vector(values[start : start + slots])
            for start in range(0, len(values), slots)
        ]

    def encrypt_own(self, values: np.ndarray) -> ts.CKKSVector:
        """Encrypt its own values with its secret key (the packed circuit's owner encryption:
        half the cost of a public-key one, a fresh error about 40 times smaller)."""
        if self._own is None:
            raise RuntimeError(f"party {self.name!r} was built without own_encryption")
        values = np.asarray(values, dtype=np.float64).tolist()
        return ts.CKKSVector(data=ts._ts_cpp.CKKSVector(self._own.data, values))

    def receive(self, message: ts.CKKSVector | bytes) -> ts.CKKSVector:
        """A ciphertext under this party's key handed to it: linked to its context in memory,
        or deserialized from a message's bytes."""
        if isinstance(message, (bytes, bytearray, memoryview)):
            return ts.ckks_vector_from(self._secret.tenseal, bytes(message))
        message.link_context(self._secret.tenseal)
        return message

    def decrypt_vector(self, message: ts.CKKSVector | bytes) -> np.ndarray:
        """Decrypt one ciphertext handed to it (every slot)."""
        return self._secret.decrypt_vector(self.receive(message))

    def decrypt(self, vectors: Sequence[ts.CKKSVector | bytes], length: int) -> np.ndarray:
        """Decrypt chunks made or evaluated under this party's key into one flat vector."""
        parts = [self.decrypt_vector(v) for v in vectors]
        return np.concatenate(parts)[:length]

    def release_sums(
        self, masked, segments: Sequence[tuple[int, int]], flooding, std, noise
    ) -> np.ndarray:
        """The key holder's step: decrypt a masked vector, sum each segment, flood and round."""
        values = self.decrypt_vector(masked)
        return self.release_own(values, segments, flooding, std, noise)

    @staticmethod
    def release_own(
        values, segments: Sequence[tuple[int, int]], flooding, std, noise
    ) -> np.ndarray:
        """Sums of segments of values the party holds in the clear, flooded and rounded as a
        decrypted masked sum is (the packed circuit's sums of the owner's own monomials)."""
        sums = np.array([values[a:b].sum() for a, b in segments])
        return flooding._release(sums, std, noise)


def server_context(party: ModuleKeyParty) -> PublicContext:
    """The server half's context for ``party``: built from the bytes the party sends
    (:meth:`ModuleKeyParty.public_bytes`), as a message would carry them.

    Raises:
        InsecureParameterError: the bytes hold a secret key (the server refuses it).
    """
    public = party.public
    return PublicContext(
        party.public_bytes(), key_id=public.key_id, params=public.params,
        check_slot=public.check_slot,
    )  # fmt: skip


def public_key_id(public_bytes: bytes) -> str:
    """The id of a party's key as the server half and the other parties name it: the SHA-256 of
    its public context's bytes (16 hex digits)."""
    return hashlib.sha256(bytes(public_bytes)).hexdigest()[:16]


def context_chain_bits(context: ts.Context) -> tuple[int, ...]:
    """The bit sizes of a TenSEAL CKKS context's coefficient modulus chain ``[q_0 .. q_L, p]``
    as its bytes set it (SEAL's key level holds every prime, each level below one fewer)."""
    seal = context.seal_context().data
    totals = [seal.key_context_data().total_coeff_modulus_bit_count()]
    level = seal.first_context_data()
    while level is not None:
        totals.append(level.total_coeff_modulus_bit_count())
        level = level.next_context_data()
    # key level - first level = the special prime; each step down drops the last data prime.
    dropped = [a - b for a, b in itertools.pairwise(totals[1:])]
    return (totals[-1], *reversed(dropped), totals[0] - totals[1])


def check_public_context(
    context: ts.Context, params, owner: str, *, evaluation_keys: bool = True
) -> None:
    """Refuse a party's public context that is not the one the public configuration fixes.

    The receiver derives ``params`` itself (:func:`module_key_circuit`,
    :func:`~securefed.fusion.ckks_packed.packed_key_circuit`) and takes the bytes only when
    they hold no secret key, a public key, the relinearization keys (``evaluation_keys``), and
    exactly the configured ring degree, modulus chain and scale: a smaller ring or chain is a
    weaker key (fewer bits of security, or a flooding bound that no longer holds), a larger one
    breaks the chunking every party computes from the public shape.

    Raises:
        InsecureParameterError: naming ``owner`` and the parameter that differs.
    """

    def refuse(what: str) -> None:
        raise InsecureParameterError(
            f"{owner}'s CKKS public context {what}; refusing it before any use (a weaker key "
            "than the run's public configuration, or not a public context)"
        )

    if context.has_secret_key() or context.is_private():
        refuse("holds a secret key")
    if not context.has_public_key():
        refuse("holds no public key")
    if evaluation_keys and not context.has_relin_keys():
        refuse("holds no relinearization keys")
    key_level = context.seal_context().data.key_context_data().parms()
    if str(key_level.scheme()) != "SCHEME_TYPE.CKKS":
        refuse(f"is of scheme {key_level.scheme()}, not CKKS")
    degree = int(key_level.poly_modulus_degree())
    if degree != params.poly_modulus_degree:
        refuse(
            f"has poly modulus degree {degree}, the configured parameters "
            f"{params.poly_modulus_degree}"
        )
    chain = context_chain_bits(context)
    if chain != tuple(params.coeff_mod_bit_sizes):
        refuse(
            f"has coefficient moduli of {list(chain)} bits, the configured parameters "
            f"{list(params.coeff_mod_bit_sizes)}"
        )
    try:
        scale = float(context.global_scale)
    except ValueError:
        scale = float("nan")
    if scale != params.scale:
        refuse(f"has scale {scale:.6g}, the configured parameters 2^{params.scale_bits}")


def server_context_from_bytes(
    public_bytes: bytes, params, owner: str = "a party", *, evaluation_keys: bool = True
) -> PublicContext:
    """The server half's context for a party on another machine: built from the bytes its
    message carried (:meth:`ModuleKeyParty.public_bytes`), under the parameters the server
    derives itself from the public configuration (:func:`module_key_circuit`), once they are
    checked to be those parameters (:func:`check_public_context`).

    Raises:
        InsecureParameterError: the bytes hold a secret key, or their parameters are not the
            configured ones (a smaller ring, chain or scale), naming ``owner``.
    """
    check_public_context(
        ts.context_from(bytes(public_bytes), n_threads=1),
        params,
        owner,
        evaluation_keys=evaluation_keys,
    )
    return PublicContext(
        bytes(public_bytes), key_id=public_key_id(public_bytes), params=params, check_slot=False
    )


def module_key_circuit(config: CKKSModuleConfig, degree: int) -> dict[str, Any]:
    """The arguments of :func:`~securefed.crypto.ckks.ckks_context` (and
    :func:`~securefed.crypto.ckks.parameters_for`) of one party's key for the monomial circuit
    of a degree-``degree`` network: what a party on another machine generates its key with, and
    what the server derives the parameters from (both from the public configuration)."""
    return {
        "circuit": FusionCircuit(depth=circuit_levels(degree), activation_degree=1, training=False),
        "poly_modulus_degree": config.poly_modulus_degree,
        "scale_bits": config.scale_bits,
        "encryption": "public-key",
    }


# ----------------------------------------------------------------------------- re-randomization
def every_slot_mask(masks: _MaskSource, slots: int) -> tuple[np.ndarray, np.ndarray]:
    """``(R, R + i R')``: a uniform mask on the real and the imaginary part of every slot.

    Every slot, not only the vector's entries: TenSEAL encrypts a vector shorter than the slot
    count replicated across all slots, so a product's slots beyond its length hold the same
    products again (``g x_1`` in the clear at the slots a mask of the vector's length leaves
    bare). The imaginary part: the masked values are real, so without ``R'`` the imaginary
    parts of a slot hold only noise terms such as ``x_1 e_G + g e_Q`` (the owner knows its own
    error ``e_G``). ``R`` (its first entries) is what the server subtracts from the release.
    """
    real = masks.draw(slots)
    return real, real + 1j * masks.draw(slots)


def mask_hiding_distance(slot_error_bound: float, mask_bound: float) -> float:
    """Statistical distance, per slot and part, between a masked product's slot and the same
    slot without its key-dependent error: ``|e| / (2 M)`` for ``e`` within ``slot_error_bound``
    and a uniform mask on ``[-M, M]`` (the distance of two shifted uniforms)."""
    if slot_error_bound <= 0 or mask_bound <= 0:
        raise ValueError("slot_error_bound and mask_bound must be > 0")
    return slot_error_bound / (2.0 * mask_bound)


IMAGINARY_STD = 2.0**-4
"""The least std of the Gaussian noise on the imaginary part of every slot of a returned output
or input gradient (no party reads it; it holds noise terms of the computation, a fresh error
times the values): the floor (:func:`~securefed.crypto.flooding.flooding_floor`) at 20 bits of
a per-slot error bound of ``8.6e-5`` (FedSlate's output bounds at the default chains are below
``3e-5``); larger where a masked product's per-slot bound needs it, at most ``2^-13`` of the
deepest level's room (:meth:`CKKSModuleFusionChannel._imaginary_std`). Its cost on the real
parts is the decoder's floating-point error, about ``2^-43`` of it."""


def check_imaginary_flooding(slot_error_bound: float, std: float) -> float:
    """The margin ``std / flooding_floor(slot_error_bound, 20)``, refused below 1: the
    imaginary noise of a returned ciphertext must flood a masked product's per-slot error
    bound at the floor level (:data:`~securefed.crypto.flooding.MIN_FLOODING_SECURITY_BITS`).

    Raises:
        InsecureParameterError: the std is below the floor (a small deepest level).
    """
    floor = flooding_floor(slot_error_bound, MIN_FLOODING_SECURITY_BITS)
    if std < floor:
        raise InsecureParameterError(
            f"the imaginary re-randomizing noise std {std:g} is below the floor {floor:g} of a "
            f"per-slot error bound of {slot_error_bound:g}: the chain's deepest level is too "
            "small (raise its room or the scale)"
        )
    return std / floor


def check_mask_hiding(slot_error_bound: float, mask_bound: float, security_bits: float) -> float:
    """:func:`mask_hiding_distance`, refused above ``2^-security_bits`` (the masks must hide
    the noise terms of the imaginary parts at least at the floor level).

    Raises:
        InsecureParameterError: the masks are too small for the circuit's error bound.
    """
    distance = mask_hiding_distance(slot_error_bound, mask_bound)
    if distance > 2.0**-security_bits:
        raise InsecureParameterError(
            f"masks of {mask_bound:g} hide a masked product's noise terms (error bound "
            f"{slot_error_bound:g} per slot) only up to {distance:.3g} per slot, above "
            f"2^-{security_bits:g}: raise mask_bits or the scale"
        )
    return distance


def tenseal_vector_bytes(ciphertext, size: int) -> bytes:
    """The bytes of TenSEAL's ``CKKSVector`` message for a SEAL ciphertext (its protobuf
    ``CKKSVectorProto``: field 1 the packed length, field 2 SEAL's own serialization, field 3
    the scale), what :meth:`ModuleKeyParty.receive` parses: the wire format is TenSEAL's.
    SEAL's Python binding saves to a file only."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "ciphertext")
        ciphertext.save(path)
        with open(path, "rb") as handle:
            body = handle.read()
    length = _varint(size)
    return (b"\x0a" + _varint(len(length)) + length + b"\x12" + _varint(len(body)) + body
            + b"\x19" + struct.pack("<d", ciphertext.scale))  # fmt: skip


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


class FreshEncryptor:
    """Fresh public-key encryptions of complex slot values under one party's public context, at
    a ciphertext's own level and scale (SEAL's objects: TenSEAL encrypts real vectors at the
    top level only).

    Args:
        context: the server's TenSEAL context for the party (its public key).
    """

    def __init__(self, context: ts.Context) -> None:
        data = context.data
        seal = data.seal_context()
        self.evaluator = sealapi.Evaluator(seal)
        self.encoder = sealapi.CKKSEncoder(seal)
        self.encryptor = sealapi.Encryptor(seal, data.public_key())

    def added(self, ciphertext, values: np.ndarray):
        """``ciphertext + Enc(values)`` (a new ciphertext; ``values`` complex, one per slot)."""
        plain = sealapi.Plaintext()
        values = np.asarray(values, dtype=np.complex128).tolist()
        self.encoder.encode(values, ciphertext.parms_id(), ciphertext.scale, plain)
        fresh, out = sealapi.Ciphertext(), sealapi.Ciphertext()
        self.encryptor.encrypt(plain, fresh)
        self.evaluator.add(ciphertext, fresh, out)
        return out


def _context_of(vector: ts.CKKSVector, context) -> ts.CKKSVector:
    """Hand a ciphertext over in memory: link it to the receiver's context (no copy, no bytes)."""
    vector.link_context(context.tenseal)
    return vector


# ----------------------------------------------------------------------------- the channel
class CKKSModuleFusionChannel(TorchServerChannel):
    """A per-position polynomial server module under CKKS, each party with its own key.

    Behind the :class:`~securefed.fusion.base.FusionChannel` seam, the ``"per_party"`` layout
    (``(members, batch, width)`` vectors, own party first in each evaluation). The module
    provides ``polynomial_network()`` (a :class:`~securefed.fusion.expansion.PolynomialNetwork`
    of its parameters); its optimiser steps on the gradients the masked exchange yields.

    Args:
        parties: party names.
        module: the server's torch module (``polynomial_network()``).
        optimiser: its optimiser (the server's own; any torch optimiser).
        target: the frozen copy for ``network="target"`` (its weights are overwritten), or None.
        members: the vectors' leading axis.
        cross: ``False`` evaluates each party's output with the others' inputs at 0 (they
            then send nothing).
        seeds: the run's seed tree (masks and noise; ChaCha20 in secure mode).
        config: channel parameters.
        keep_payloads, total_rounds: as for every fusion channel's view.
        public: extra public parameters for the view.
        public_contexts: party -> the bytes of its public context, for the server half alone
            (its parties on other machines, each holding its own :class:`ModuleKeyParty`):
            the channel then holds no key party (``keys`` is empty), builds its contexts from
            these bytes (:func:`server_context_from_bytes`, refusing a secret key) and is
            driven by :meth:`serve_forward`, :meth:`serve_backward` and
            :meth:`finish_backward` on serialized ciphertexts; ``forward``/``backward`` on
            values are refused (the server has none).

    Raises:
        ValueError: bad parties or members, a module without a polynomial form, a chain too
            short for its degree, or flooding below the floor of its error bound.
    """

    name = "ckks"

    def __init__(
        self,
        parties: Sequence[str],
        module: Any,
        optimiser: Any,
        *,
        target: Any = None,
        members: int = 1,
        cross: bool = True,
        seeds: SeedTree,
        config: CKKSModuleConfig | None = None,
        keep_payloads: RoundSelection = NO_PAYLOADS,
        total_rounds: int | None = None,
        public: Mapping[str, object] | None = None,
        public_contexts: Mapping[str, bytes] | None = None,
    ) -> None:
        import torch

        self._torch = torch
        if not isinstance(seeds, SeedTree):
            raise TypeError(f"seeds must be a SeedTree, got {type(seeds).__name__}")
        names = self._adopt(parties, module, optimiser, target, members, cross)
        self.config = CKKSModuleConfig() if config is None else config
        network = module.polynomial_network()
        if network.inputs != len(names) or network.members != members:
            raise ValueError(
                f"the module's polynomial takes {network.inputs} inputs for {network.members} "
                f"members; the channel has {len(names)} parties and {members} members"
            )
        self.degree = network.degree
        self.basis = monomials(len(names), self.degree)
        self.levels = circuit_levels(self.degree)
        self.remote = public_contexts is not None
        if not self.remote:
            self.keys = {name: self._new_party(name) for name in names}
            self.params = self.keys[names[0]].public.params
            # The server half: public contexts built from the bytes each party sends (a test
            # tries to decrypt with them; one holding a secret key is refused).
            self.server_contexts: dict[str, PublicContext] = {
                n: server_context(k) for n, k in self.keys.items()
            }
        else:
            if sorted(public_contexts) != sorted(names):
                raise ValueError(
                    f"public contexts of parties {sorted(public_contexts)}, the channel has "
                    f"{sorted(names)}"
                )
            self.keys = {}
            self.params = self._remote_params()
            self.server_contexts = {
                n: server_context_from_bytes(public_contexts[n], self.params, f"party {n!r}")
                for n in names
            }
        self.handed_bytes: Counter = Counter()
        self.min_weight = 2.0 ** -(self.params.scale_bits - 1)
        mask_bits = (
            self.config.mask_bits if self.config.mask_bits is not None else self._mask_bits()
        )
        self.masks = _MaskSource(seeds, 2.0**mask_bits)
        self.base_error = decryption_error_bound(self.params, 1)
        self._flood_noise = noise_source(seeds, "ckks-module-fusion", "flood")
        self._output_noise = noise_source(seeds, "ckks-module-fusion", "output-noise")
        self._pending: dict | None = None
        self._flood_std: dict[int, tuple[float, float]] = {}
        self.seconds = dict.fromkeys(STEP_STAGES, 0.0)
        self.counts: Counter = Counter()
        first = self.server_contexts[names[0]]
        self.ciphertext_bytes = len(first.encrypt_vector(np.zeros(1)).serialize())
        self.view = FusionView(
            self.name,
            names,
            keep_payloads=keep_payloads,
            total_rounds=total_rounds,
            public=self._module_public()
            | {
                "ckks": self.params.public(),
                "keys": "one key pair per party; the server holds public contexts only",
                "polynomial_degree": self.degree,
                "monomials": len(self.basis),
                "value_bound": self.config.value_bound,
                "grad_bound": self.config.grad_bound,
                "mask_bound": self.masks.bound,
                "flooding": self.config.flooding.public(),
                "per_operation_error": self.base_error,
                "output_noise_std": self.config.output_noise_std,
                "seeded": not seeds.secure,
                "ciphertext_bytes": self.ciphertext_bytes,
            }
            | dict(public or {}),
        )
        self._fresh: dict[str, FreshEncryptor] = {}
        self._setup_circuit()
        self.mask_hiding = check_mask_hiding(
            self._sum_error_bound(1), self.masks.bound, MIN_FLOODING_SECURITY_BITS
        )
        check_imaginary_flooding(self._sum_error_bound(1), self._imaginary_std())
        self.view.public["exchange_mask"] = {
            "parts": "real and imaginary, every slot, in a fresh public-key encryption",
            "hiding_per_slot": self.mask_hiding,
        }

    def _setup_circuit(self) -> None:
        """What a circuit adds to the channel once its keys and view exist (nothing here)."""

    def _new_party(self, name: str) -> ModuleKeyParty:
        """One party's half, with a fresh key pair (:meth:`_new_key`)."""
        return ModuleKeyParty(name, self._new_key())

    def _new_key(self) -> SecretContext:
        """One party's key pair for this circuit's levels (public-key encryption)."""
        return ckks_context(**module_key_circuit(self.config, self.degree))

    def _remote_params(self):
        """The parameters of the parties' keys, derived from the public configuration (the
        server half of parties on other machines)."""
        return parameters_for(**module_key_circuit(self.config, self.degree))

    def _mask_bits(self) -> int:
        """The default mask size: what the level of the masked exchange holds."""
        return self.params.mask_bits

    def flooding_std(self, n_slots: int) -> tuple[float, float]:
        """``(error bound, flooding std)`` of a released sum of ``n_slots`` slots."""
        if n_slots not in self._flood_std:
            bound = self._sum_error_bound(n_slots)
            self._flood_std[n_slots] = (bound, self.config.flooding.std_for(bound))
        return self._flood_std[n_slots]

    def _sum_error_bound(self, n_slots: int) -> float:
        """The circuit's bound on the error of one released sum (:func:`masked_sum_error_bound`)."""
        return masked_sum_error_bound(
            self.base_error, self.degree, self.config.value_bound, self.config.grad_bound, n_slots
        )

    def error_bounds(self, network: str = "online") -> dict[str, np.ndarray]:
        """Per member, the stated bounds on the error of an output entry and of an input
        gradient entry for the current weights (:func:`polynomial_error_bound`,
        :func:`input_gradient_error_bound`)."""
        check_network(network, False)
        module = self.module if network == "online" else self.target
        coefficients = self._coefficients(module, grad=False).numpy()
        source, factor = derivative(len(self._parties), self.degree, 0)
        smaller = monomials(len(self._parties), max(self.degree - 1, 0))
        noise, bound = self.config.output_noise_std, self.config.value_bound
        return {
            "output": np.array([
                polynomial_error_bound(self.base_error, c, self.basis, bound, noise)
                for c in coefficients
            ]),
            "input_gradient": np.array([
                input_gradient_error_bound(
                    self.base_error, c[source] * factor, smaller, bound, self.config.grad_bound,
                    noise,
                )
                for c in coefficients
            ]),
        }  # fmt: skip

    def _coefficients(self, module, *, grad: bool):
        zero = () if self.cross else tuple(range(1, len(self._parties)))
        network = module.polynomial_network()
        if grad:
            return expand(network, zero_inputs=zero)
        with self._torch.no_grad():
            return expand(network, zero_inputs=zero)

    def _check(self, inputs: Mapping[str, Any], bound: float, what: str) -> tuple[dict, tuple]:
        """Numpy float64 copies of ``(members, batch, width)`` vectors, within ``bound``."""
        arrays, leading, dtype = {}, None, None
        for party, value in inputs.items():
            if hasattr(value, "detach"):
                dtype = value.dtype
            array = np.asarray(as_numpy(value), dtype=np.float64)
            if array.ndim != 3 or array.shape[0] != self.members:
                raise ValueError(
                    f"party {party!r} {what} has shape {array.shape}; expected ({self.members}, "
                    "batch, width)"
                )
            if leading is None:
                leading = array.shape
            elif array.shape != leading:
                raise ValueError(
                    f"party {party!r} {what} has shape {array.shape}, expected {leading} "
                    "(every party sends the same users, in the same order)"
                )
            if not np.isfinite(array).all():
                raise ValueError(f"party {party!r} {what} contains NaN or infinity")
            peak = float(np.abs(array).max()) if array.size else 0.0
            if peak > bound:
                raise ValueError(
                    f"party {party!r} {what} reaches |{peak:.4g}|, above the channel's public "
                    f"bound {bound:g} (the flooding's error bound rests on it; raise "
                    "value_bound/grad_bound in CKKSModuleConfig)"
                )
            arrays[party] = array
        return arrays, (leading, dtype)

    def _coefficient_vectors(self, coefficients: np.ndarray, start: int, stop: int, per_member):
        """Per monomial, the plain multiplier of chunk ``[start, stop)``: a scalar with one
        member, else each slot's member's coefficient (``None`` where it encodes to zero)."""
        if self.members == 1:
            values = [float(c) for c in coefficients[0]]
            return [v if abs(v) >= self.min_weight else None for v in values]
        owner = np.arange(start, stop) // per_member
        out = []
        for m in range(coefficients.shape[1]):
            column = coefficients[owner, m]
            out.append(column.tolist() if np.abs(column).max() >= self.min_weight else None)
        return out

    def _monomials(self, variables: list, needed_degree: int) -> dict:
        """``x^m`` for every monomial up to ``needed_degree`` (degree 0 omitted)."""
        out = {}
        for exponent in self.basis:
            total = sum(exponent)
            if total == 0 or total > needed_degree:
                continue
            if total == 1:
                out[exponent] = variables[exponent.index(1)]
                continue
            first, second = split_monomial(exponent)
            out[exponent] = out[first] * out[second]
            self.counts["cipher_mul"] += 1
        return out

    def _combine(self, terms: list, constant) -> ts.CKKSVector:
        """``sum_k multiplier_k * vector_k + constant`` (terms ``(vector, multiplier)``)."""
        acc = None
        for vector, multiplier in terms:
            if multiplier is None:
                continue
            product = vector * multiplier
            self.counts["plain_mul"] += 1
            acc = product if acc is None else acc.add_(product)
        if acc is None:  # everything encodes to zero: a negligible multiple keeps a ciphertext
            vector = terms[0][0]
            acc = vector * 2.0 ** -(self.params.scale_bits - 4)
        if constant is not None:
            acc.add_(constant)
        return acc

    def _return(self, vector: ts.CKKSVector, party: str) -> ts.CKKSVector:
        """Re-randomize with a fresh encryption under ``party``'s key, at the vector's level, of
        complex noise on every slot: ``N(0, output_noise_std^2)`` on the real parts,
        :meth:`_hiding_std` on the imaginary parts (they hold only noise terms of the
        computation, such as ``x_1`` times the owner's own error, which no party reads)."""
        slots = self.params.slots
        noise = self._output_noise.normal(self.config.output_noise_std, slots)
        noise = noise + 1j * self._output_noise.normal(self._imaginary_std(), slots)
        self.counts["rerandomize"] += 1
        return self._rerandomized(vector, party, noise)

    def _imaginary_std(self) -> float:
        """The std of the noise on every imaginary part of a returned ciphertext:
        :data:`IMAGINARY_STD`, or the 20-bit floor of a masked product's per-slot error bound
        where that is larger (``ckks+dp``'s wide gradient bound), at most ``2^-13`` of the
        deepest level's room (8192 std within it)."""
        room = self.params.max_abs_value(self.params.levels) * 2.0**-13
        floor = flooding_floor(self._sum_error_bound(1), MIN_FLOODING_SECURITY_BITS)
        return min(room, max(IMAGINARY_STD, floor))

    def _rerandomized(self, vector: ts.CKKSVector, party: str, values: np.ndarray):
        """``vector + Enc(values)``, a fresh public-key encryption under ``party``'s key at the
        vector's level (``values`` complex, one per slot), as a ``CKKSVector`` of the server's
        context."""
        if party not in self._fresh:
            self._fresh[party] = FreshEncryptor(self.server_contexts[party].tenseal)
        [ciphertext] = vector.data.ciphertext()
        out = self._fresh[party].added(ciphertext, values)
        blob = tenseal_vector_bytes(out, vector.size())
        return ts.ckks_vector_from(self.server_contexts[party].tenseal, blob)

    def _to_party(self, vector: ts.CKKSVector, party: str) -> ts.CKKSVector | bytes:
        """A ciphertext the server hands to ``party`` (the party's :meth:`ModuleKeyParty.receive`
        takes it): the vector itself, or its serialized bytes (``serialize_handovers``).

        Raises:
            RuntimeError: the ciphertext has more than two components (an unrelinearized
                product): its re-randomization would leave the third one as the server
                computed it, a function of the server's coefficients beyond the values.
        """
        components = vector.data.ciphertext()[0].size()
        if components != 2:
            raise RuntimeError(
                f"a ciphertext handed to {party!r} has {components} components: only a "
                "relinearized (size-2) ciphertext is re-randomized whole (circuit privacy)"
            )
        if not (self.config.serialize_handovers or self.remote):
            return vector
        blob = vector.serialize()
        self.handed_bytes["to_parties"] += len(blob)
        return blob

    def _to_server(self, vector: ts.CKKSVector, party: str) -> ts.CKKSVector:
        """A ciphertext under ``party``'s key handed to the server: linked to, or deserialized
        under (``serialize_handovers``), the server's public context for that key."""
        context = self.server_contexts[party]
        if isinstance(vector, (bytes, bytearray, memoryview)):  # what a message carried
            blob = bytes(vector)
        elif not self.config.serialize_handovers:
            return _context_of(vector, context)
        else:
            blob = vector.serialize()
        self.handed_bytes["to_server"] += len(blob)
        return ts.ckks_vector_from(context.tenseal, blob)

    # ------------------------------------------------------------------ forward
    def _forward(self, inquiry: Inquiry) -> dict[str, Any]:
        """Each party in ``outputs`` gets ``f`` on its vector first, under its own key.

        Arguments and return types as :meth:`securefed.fusion.module.ModuleFusionChannel.forward`
        (positions are picked by the party after decryption: the server does not see them).
        """
        self._refuse_remote("forward")
        inputs, outputs, network, train, tag = (
            inquiry.inputs, inquiry.outputs, inquiry.network, inquiry.train, inquiry.tag
        )  # fmt: skip
        arrays, shape, dtype, chosen, module = self._inquiry(inquiry)
        numpy_in = all(isinstance(v, np.ndarray) for v in inputs.values())
        start = time.process_time()
        coefficients = self._coefficients(module, grad=False).numpy()
        self.seconds["server_evaluation"] += time.process_time() - start
        length = int(np.prod(shape))
        per_member = shape[1] * shape[2]
        slots = self.params.slots
        bounds = [(a, min(length, a + slots)) for a in range(0, length, slots)]
        senders = self._parties if self.cross else None
        result, pending = {}, {}
        for p in outputs:
            start = time.process_time()
            order = [p, *[q for q in self._parties if q != p]]
            ordered = [q for q in order if senders is not None or q == p]
            encrypted = {
                q: self.keys[q].encrypt_for(arrays[q].reshape(-1), self.keys[p]) for q in ordered
            }
            self.counts["encrypt"] += sum(len(v) for v in encrypted.values())
            now = time.process_time()
            self.seconds["encryption"] += now - start
            start = now
            returned, chunk_monomials = self._evaluate_for(
                p, encrypted, coefficients, bounds, per_member
            )
            now = time.process_time()
            self.seconds["server_evaluation"] += now - start
            start = now
            fused = self.keys[p].decrypt(returned, length).reshape(shape)
            self.seconds["decryption"] += time.process_time() - start
            result[p] = self._deliver(fused, chosen.get(p), inputs, dtype, numpy_in and not train)
            pending[p] = (chunk_monomials, chosen.get(p))
        if train:
            self._pending = {"shape": shape, "bounds": bounds, "parties": pending, "tag": tag,
                             "dtype": dtype}  # fmt: skip
        n_up = len(bounds) * (len(self._parties) if self.cross else 1)

        def senders_or(named):
            return self._parties if self.cross else named

        self._record(
            "forward",
            network=network,
            tag=tag,
            train=train,
            outputs=outputs,
            up={q: n_up * self.ciphertext_bytes for q in senders_or(outputs)},
            down={p: len(bounds) * self.ciphertext_bytes for p in outputs},
        )
        return result

    def _order(self, p: str) -> tuple[list[str], list[str]]:
        """``(order, sent)``: the parties in ``p``'s evaluation (``p`` first) and those whose
        vectors are sent (all of them, or ``p`` alone with ``cross=False``)."""
        order = [p, *[q for q in self._parties if q != p]]
        return order, (order if self.cross else [p])

    def _evaluate_for(self, p, encrypted, coefficients, bounds, per_member):
        """The server's evaluation of ``p``'s output on its parties' chunks (ciphertexts or
        the bytes a message carried, under ``p``'s key): ``(returned, chunk_monomials)``, the
        re-randomized outputs handed to ``p`` and the monomials kept for the backward."""
        order, sent = self._order(p)
        chunk_monomials, returned = [], []
        for c, (a, b) in enumerate(bounds):
            variables = [self._to_server(encrypted[q][c], p) for q in sent]
            if len(variables) < len(order):  # cross=False: the others are not sent
                variables += [variables[0]] * (len(order) - len(variables))
            powers = self._monomials(variables, self.degree)
            multipliers = self._coefficient_vectors(coefficients, a, b, per_member)
            terms = [(powers[m], multipliers[k]) for k, m in enumerate(self.basis) if k]
            value = self._combine(terms, multipliers[0])
            returned.append(self._to_party(self._return(value, p), p))
            chunk_monomials.append(powers)
        return returned, chunk_monomials

    # ------------------------------------------------------------------ backward
    def _backward(
        self, grads: Mapping[str, Any], recipients: Sequence[str] | None
    ) -> dict[str, Any]:
        """``p`` sends ``[[dL/dy_p]]``; the masked exchange yields the batch sums, the server
        steps its optimiser, ``p`` gets ``[[dL/dx_p]]`` under its key.

        Only a party that received an output can receive its input gradient (it is computed
        under its key); ``recipients`` defaults to those parties.

        Raises:
            RuntimeError: without a training forward since the last backward.
            ValueError: a gradient of a party without output, of the wrong shape, above
                ``grad_bound``, or a recipient without an output in that forward.
        """
        self._refuse_remote("backward")
        torch = self._torch
        pending, recipients, full = self._output_gradients(grads, recipients)
        shape, bounds = pending["shape"], pending["bounds"]
        coefficients_t = self._coefficients(self.module, grad=True)
        coefficients = coefficients_t.detach().numpy()
        per_member = shape[1] * shape[2]
        length = int(np.prod(shape))
        sums = np.zeros((self.members, len(self.basis)))
        source, factor = derivative(len(self._parties), self.degree, 0)
        smaller = monomials(len(self._parties), max(self.degree - 1, 0))
        derivative_coefficients = coefficients[:, source] * factor
        result = {}
        for p, g in full.items():
            start = time.process_time()
            encrypted = self.keys[p].encrypt_for(g.reshape(-1), self.keys[p])
            self.counts["encrypt"] += len(encrypted)
            now = time.process_time()
            self.seconds["encryption"] += now - start
            chunk_monomials = pending["parties"][p][0]
            returned = []
            for c, (a, b) in enumerate(bounds):
                start = time.process_time()
                g_c = self._to_server(encrypted[c], p)
                powers = chunk_monomials[c]
                segments = _segments(a, b, per_member)
                for k, m in enumerate(self.basis):
                    product = g_c if k == 0 else g_c * powers[m]
                    if k:
                        self.counts["cipher_mul"] += 1
                    self.seconds["server_evaluation"] += time.process_time() - start
                    sums[:, k] += self._masked_sums(product, p, segments, a, per_member)
                    start = time.process_time()
                acc = self._input_gradient(
                    g_c, powers, derivative_coefficients, smaller, a, b, per_member
                )
                returned.append(self._to_party(self._return(acc, p), p))
                self.seconds["server_evaluation"] += time.process_time() - start
            if p in recipients:
                start = time.process_time()
                dx = self.keys[p].decrypt(returned, length).reshape(shape)
                self.seconds["decryption"] += time.process_time() - start
                result[p] = torch.from_numpy(dx).to(pending["dtype"] or torch.float64)
        self._step(coefficients_t, sums, pending, result, tuple(full), len(bounds),
                   1 + len(self.basis))  # fmt: skip
        return result

    # ------------------------------------------------------------------ the server half alone
    def _refuse_remote(self, what: str) -> None:
        if self.remote:
            raise RuntimeError(
                f"{what}() on values needs the parties' keys; this is the server half alone "
                "(built from public contexts): it serves ciphertexts (serve_forward, "
                "serve_backward, finish_backward)"
            )

    def chunk_bounds(self, length: int) -> list[tuple[int, int]]:
        """The flat ranges each ciphertext of a ``length``-entry vector holds (public: what a
        party on another machine encrypts and decrypts by)."""
        slots = self.params.slots
        return [(a, min(length, a + slots)) for a in range(0, length, slots)]

    def serve_forward(
        self,
        ciphertexts: Mapping[str, Mapping[str, Sequence[bytes]]],
        *,
        shape: Sequence[int],
        outputs: Sequence[str],
        network: str = "online",
        train: bool = False,
        tag: str | None = None,
    ) -> dict[str, list[bytes]]:
        """A forward on ciphertexts its parties sent (the server half alone, ``remote``).

        Args:
            ciphertexts: output party ``p`` -> sending party ``q`` -> the serialized chunks of
                ``q``'s flattened ``(members, batch, width)`` vector under ``p``'s key (every
                party with ``cross``, ``p`` alone without).
            shape: the vectors' ``(members, batch, width)`` (public).
            outputs, network, train, tag: as :meth:`forward` (no positions: a party picks its
                entries after decryption).

        Returns:
            ``p`` -> its output's serialized chunks under its key (re-randomized).

        Raises:
            RuntimeError: the channel holds key parties (use :meth:`forward`).
            ValueError: ciphertexts of the wrong parties or chunk counts, a bad shape.
        """
        if not self.remote:
            raise RuntimeError("serve_forward is the server half's; this channel holds the keys")
        shape = tuple(int(v) for v in shape)
        if len(shape) != 3 or shape[0] != self.members:
            raise ValueError(f"shape must be ({self.members}, batch, width), got {shape}")
        check_network(network, train)
        if network == "target" and self.target is None:
            raise RuntimeError("this channel has no target network (built with target=None)")
        module = self.module if network == "online" else self.target
        length, per_member = int(np.prod(shape)), shape[1] * shape[2]
        bounds = self.chunk_bounds(length)
        if sorted(ciphertexts) != sorted(outputs):
            raise ValueError(f"ciphertexts for outputs {sorted(ciphertexts)}, asked {outputs}")
        start = time.process_time()
        coefficients = self._coefficients(module, grad=False).numpy()
        result, pending = {}, {}
        for p in outputs:
            _, sent = self._order(p)
            got = ciphertexts[p]
            if sorted(got) != sorted(sent) or any(len(got[q]) != len(bounds) for q in sent):
                raise ValueError(
                    f"{p!r}'s forward needs {len(bounds)} chunk(s) from each of {sent}, got "
                    f"{ {q: len(v) for q, v in got.items()} }"
                )
            result[p], chunk_monomials = self._evaluate_for(
                p, got, coefficients, bounds, per_member
            )
            pending[p] = (chunk_monomials, None)
        self.seconds["server_evaluation"] += time.process_time() - start
        if train:
            self._pending = {"shape": shape, "bounds": bounds, "parties": pending, "tag": tag,
                             "dtype": None}  # fmt: skip
        n_up = len(bounds) * (len(self._parties) if self.cross else 1)
        self._record(
            "forward",
            network=network,
            tag=tag,
            train=train,
            outputs=list(outputs),
            up={
                q: n_up * self.ciphertext_bytes for q in (self._parties if self.cross else outputs)
            },
            down={p: len(bounds) * self.ciphertext_bytes for p in outputs},
        )
        return result

    def serve_backward(self, gradients: Mapping[str, Sequence[bytes]]) -> dict[str, dict]:
        """The first half of a backward on the output gradients its parties sent (``remote``):
        ``p`` -> ``{"masked": [[bytes per monomial] per chunk], "input_gradient": [bytes per
        chunk]}``, what ``p`` receives: the masked products ``[[g x^m + R]]`` to release (it
        sums each member's slots of a chunk, floods and rounds) and ``[[dL/dx_p]]``. The
        released sums go to :meth:`finish_backward`.

        Args:
            gradients: ``p`` -> the serialized chunks of ``[[dL/dy_p]]`` under its key, the full
                ``(members, batch, width)`` gradient (zeros where it did not ask).

        Raises:
            RuntimeError: without a training :meth:`serve_forward` since the last backward.
            ValueError: a gradient of a party without output there, or the wrong chunk count.
        """
        if self._pending is None or "masks" in self._pending:
            raise RuntimeError("serve_backward needs a serve_forward(train=True) first (once)")
        pending = self._pending
        unknown = sorted(set(gradients) - set(pending["parties"]))
        if unknown:
            raise ValueError(f"no forward output for parties {unknown}")
        shape, bounds = pending["shape"], pending["bounds"]
        start = time.process_time()
        coefficients_t = self._coefficients(self.module, grad=True)
        coefficients = coefficients_t.detach().numpy()
        per_member = shape[1] * shape[2]
        source, factor = derivative(len(self._parties), self.degree, 0)
        smaller = monomials(len(self._parties), max(self.degree - 1, 0))
        derivative_coefficients = coefficients[:, source] * factor
        out, masks = {}, {}
        for p, chunks in gradients.items():
            if len(chunks) != len(bounds):
                raise ValueError(f"{p!r} sent {len(chunks)} gradient chunk(s), {len(bounds)} due")
            masked, returned, kept = [], [], []
            for c, (a, b) in enumerate(bounds):
                g_c = self._to_server(chunks[c], p)
                powers = pending["parties"][p][0][c]
                row, row_masks = [], []
                for k, m in enumerate(self.basis):
                    product = g_c if k == 0 else g_c * powers[m]
                    if k:
                        self.counts["cipher_mul"] += 1
                    blob, mask = self._mask(product, p)
                    row.append(blob)
                    row_masks.append(mask)
                masked.append(row)
                kept.append(row_masks)
                returned.append(
                    self._to_party(
                        self._return(
                            self._input_gradient(g_c, powers, derivative_coefficients, smaller,
                                                 a, b, per_member),
                            p,
                        ),
                        p,
                    )
                )  # fmt: skip
            out[p] = {"masked": masked, "input_gradient": returned}
            masks[p] = kept
        self.seconds["server_evaluation"] += time.process_time() - start
        pending["masks"], pending["coefficients_t"] = masks, coefficients_t
        return out

    def finish_backward(self, released: Mapping[str, Sequence[Sequence[np.ndarray]]]) -> None:
        """The second half (``remote``): each party's released sums ``[chunk][monomial]`` (one
        number per member segment of the chunk), unmasked into the batch sums; the optimiser
        steps.

        Raises:
            RuntimeError: without :meth:`serve_backward` first.
            ValueError: releases of other parties, or of the wrong shape.
        """
        if self._pending is None or "masks" not in self._pending:
            raise RuntimeError("finish_backward needs serve_backward first")
        pending = self._pending
        masks = pending["masks"]
        if sorted(released) != sorted(masks):
            raise ValueError(f"releases of {sorted(released)}, due from {sorted(masks)}")
        shape, bounds = pending["shape"], pending["bounds"]
        per_member = shape[1] * shape[2]
        sums = np.zeros((self.members, len(self.basis)))
        for p, rows in released.items():
            if len(rows) != len(bounds):
                raise ValueError(f"{p!r} released {len(rows)} chunk(s), {len(bounds)} due")
            for c, (a, b) in enumerate(bounds):
                segments = _segments(a, b, per_member)
                for k in range(len(self.basis)):
                    values = np.asarray(rows[c][k], dtype=np.float64).reshape(-1)
                    if values.shape != (len(segments),) or not np.isfinite(values).all():
                        raise ValueError(
                            f"{p!r}'s release of chunk {c}, monomial {k}: {values.shape[0]} "
                            f"finite number(s) due per member segment ({len(segments)})"
                        )
                    sums[:, k] += self._unmask(values, masks[p][c][k], segments, a, per_member)
        chunks = len(bounds)
        self._step(pending["coefficients_t"], sums, pending, dict.fromkeys(released),
                   tuple(released), chunks, 1 + len(self.basis))  # fmt: skip

    def _input_gradient(self, g_c, powers, derivative_coefficients, smaller, a, b, per_member):
        """``[[g * df/dx_p]]`` of one chunk, as ``sum_k (g d_k) x^k``."""
        multipliers = self._coefficient_vectors(derivative_coefficients, a, b, per_member)
        acc = None
        for k, m in enumerate(smaller):
            if multipliers[k] is None:
                continue
            term = g_c * multipliers[k]
            self.counts["plain_mul"] += 1
            if k:
                term = term * powers[m]
                self.counts["cipher_mul"] += 1
            acc = term if acc is None else acc.add_(term)
        if acc is None:
            acc = g_c * 2.0 ** -(self.params.scale_bits - 4)
        return acc

    # ------------------------------------------------------------------ shared checks
    def _inquiry(self, inquiry: Inquiry):
        """A forward's inputs checked: ``(arrays, shape, dtype, chosen, module)`` (``arrays``:
        float64 copies within ``value_bound``; ``dtype``: the tensors' dtype)."""
        check_input_parties(self._parties, inquiry.inputs)
        arrays, (shape, dtype) = self._check(inquiry.inputs, self.config.value_bound, "input")
        chosen = check_positions(inquiry.positions, inquiry.outputs, shape[:2])
        if inquiry.network == "target" and self.target is None:
            raise RuntimeError("this channel has no target network (built with target=None)")
        module = self.module if inquiry.network == "online" else self.target
        return arrays, shape, dtype, chosen, module

    def _deliver(self, fused: np.ndarray, index, inputs, dtype, numpy_out: bool):
        """What the party keeps of its decrypted ``(members, batch, width)`` values: the entries
        at its positions (picked by it, after decryption), as numpy or a tensor."""
        fused = pick(fused, None if index is None else as_numpy(index))
        if numpy_out:
            return fused.astype(np.result_type(*inputs.values()))
        return self._torch.from_numpy(fused).to(dtype or self._torch.float64)

    def _output_gradients(self, grads, recipients):
        """A backward's arguments checked: ``(pending, recipients, full)``, ``full`` the
        ``(members, batch, width)`` float64 gradient per sending party (zeros at the positions
        it did not ask for), within ``grad_bound``."""
        if self._pending is None:
            raise RuntimeError("backward() needs a forward(train=True) first (once per forward)")
        pending = self._pending
        received = tuple(pending["parties"])
        recipients = (
            received
            if recipients is None
            else check_parties_named("recipients", self._parties, recipients)
        )
        outside = [q for q in recipients if q not in received]
        if outside:
            raise ValueError(
                f"parties {outside} received no output in the last forward: their input "
                "gradient would be computed under another party's key"
            )
        unknown = set(grads) - set(received)
        if unknown:
            raise ValueError(f"no forward output for parties {sorted(unknown)}")
        shape = pending["shape"]
        full = {}
        for p, g in grads.items():
            array = np.asarray(as_numpy(g), dtype=np.float64)
            index = pending["parties"][p][1]
            expected = shape if index is None else (*shape[:2], index.shape[-1])
            if array.shape != tuple(expected):
                raise ValueError(
                    f"party {p!r} output gradient must have shape {tuple(expected)}, got "
                    f"{array.shape}"
                )
            if index is not None:
                array = scatter_positions(array, as_numpy(index), shape[2])
            full[p] = array
        full, _ = self._check(full, self.config.grad_bound, "output gradient")
        return pending, recipients, full

    def _step(self, coefficients_t, sums, pending, result, senders, chunks, down_per_chunk):
        """The server's optimiser step on the released batch sums (``sum_m C_m(theta) S_m``),
        and the backward's record: each sender's ciphertext and released numbers up per chunk,
        ``down_per_chunk`` ciphertexts down."""
        start = time.process_time()
        self.optimiser.zero_grad(set_to_none=True)
        surrogate = (coefficients_t * self._torch.from_numpy(sums)).sum()
        surrogate.backward()
        self.optimiser.step()
        self.seconds["server_evaluation"] += time.process_time() - start
        self._pending = None
        self.last_sums = sums
        up = chunks * (self.ciphertext_bytes + len(self.basis) * 8 * self.members)
        self._record(
            "backward",
            network="online",
            tag=pending["tag"],
            train=True,
            outputs=list(result),
            up=dict.fromkeys(senders, up),
            down=dict.fromkeys(senders, chunks * down_per_chunk * self.ciphertext_bytes),
            aggregate={"batch_sums": sums},
        )

    def _masked_sums(self, product, party: str, segments, start: int, per_member) -> np.ndarray:
        """The masked exchange for one ciphertext: per-member sums (zeros for absent members)."""
        tick = time.process_time()
        masked, mask = self._mask(product, party)
        local = [(a - start, b - start) for a, b in segments]
        _, std = self.flooding_std(max(b - a for a, b in segments))
        released = self.keys[party].release_sums(
            masked, local, self.config.flooding, std, self._flood_noise
        )
        out = self._unmask(released, mask, segments, start, per_member)
        self.seconds["exchange"] += time.process_time() - tick
        return out

    def _mask(self, product, party: str):
        """``(masked, mask)``: ``[[product + R + i R']]`` as handed to ``party`` (the mask of
        :func:`every_slot_mask` on every slot, added as a fresh public-key encryption: the
        product is re-randomized, its imaginary parts and its replicas masked), and ``R``.
        The server half (:meth:`serve_backward`) and the in-process exchange both call it."""
        mask, both = every_slot_mask(self.masks, self.params.slots)
        self.counts["fresh_mask"] += 1
        return self._to_party(self._rerandomized(product, party, both), party), mask

    def _unmask(self, released, mask, segments, start: int, per_member) -> np.ndarray:
        """The per-member sums of one masked exchange, its mask's sums subtracted."""
        out = np.zeros(self.members)
        for (a, b), value in zip(segments, released, strict=True):
            out[a // per_member] += value - mask[a - start : b - start].sum()
        self.counts["exchange"] += 1
        return out

    def _record(self, kind, *, network, tag, train, outputs, up, down, aggregate=None) -> None:
        self.view.record(
            kind,
            network=network,
            tag=tag,
            train=train,
            outputs=outputs,
            bytes_up=up,
            bytes_down=down,
            aggregate=aggregate if self.view.keeps_current else None,
        )


def _segments(start: int, stop: int, per_member: int) -> list[tuple[int, int]]:
    """The flat ranges of ``[start, stop)`` that belong to one member each."""
    out, a = [], start
    while a < stop:
        b = min(stop, (a // per_member + 1) * per_member)
        out.append((a, b))
        a = b
    return out
