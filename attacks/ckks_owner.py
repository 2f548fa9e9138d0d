"""What the key holder of FedSlate's CKKS fusion reads beyond its release (the masked exchange).

In both CKKS circuits (:mod:`securefed.fusion.ckks_module`, :mod:`securefed.fusion.ckks_packed`)
the owner ``p`` of an output holds the secret key of everything computed for it, and the masked
exchange hands it ``[[g x^m + R]]``: the product of its own gradient ciphertext ``G`` with the
other party's values ``x_1`` (encrypted under ``p``'s public key), plus the server's mask. It is
meant to learn one flooded sum per member. Decrypting the ciphertext itself (SEAL's decryptor
through ``tenseal.sealapi``, not ``CKKSVector.decrypt``, which returns the real parts of the
vector's entries only) it sees every slot as a complex number, and three channels open:

* **Replicas** (:func:`replica_estimate`). TenSEAL encrypts a vector shorter than the slot count
  replicated over every slot, so ``G`` and ``x_1``'s ciphertext hold copies of their entries
  beyond the vector's length and so does the product. A mask drawn for the vector's length only
  leaves those slots bare: the owner reads ``g x_1`` in the clear and divides by its own ``g``.
* **Imaginary parts** (:func:`imaginary_estimate`). The values and a real mask sit in the real
  parts; the imaginary part of a slot holds only noise terms, ``x_1 Im(e_G) + g Im(e_Q)`` plus the
  rescaling and relinearization errors (canonical embedding: slot-wise products of the error
  polynomials' embeddings, Cheon, Kim, Kim and Song 2017, section 3). The owner knows ``e_G``:
  it decrypts its own ``G`` and subtracts what it encoded (:func:`own_error`). With ``Im(e_G)``
  of std ``s``, ``Im(E) Im(e_G) / s^2`` is an unbiased estimate of ``x_1`` per slot; it
  correlates with ``x_1`` where ``e_G`` is not buried under the other terms (the monomial
  circuit at ``2^40``, where the owner's public-key error is as large as the rescaling's).
* **A crafted gradient** (:func:`crafted_gradient`, :func:`crafted_estimate`): a malicious owner
  encrypts ``g + i T`` instead of ``g``: the imaginary part of the product is ``T x_1`` plus
  noise, ``x_1`` to ``noise / T``. A CKKS ciphertext of ``g + i T`` is indistinguishable from
  one of ``g`` to whoever lacks the key (RLWE), so the server cannot check it; a mask of bound
  ``M`` hides ``T x_1`` only up to ``T |x_1| / 2M``, and ``T`` is the owner's to choose up to
  the level's room. Not covered (SECURITY.md).

Threat model: the owner runs the protocol (honest-but-curious: its ``G`` is the encryption its
party code makes) and keeps what it was handed, its own ciphertexts, values and secret key; the
last channel is the malicious owner's. The scorer knows ``x_1`` (the other party's values).
"""

from __future__ import annotations

import numpy as np
import tenseal as ts
import tenseal.sealapi as sealapi

from securefed.fusion.ckks_module import tenseal_vector_bytes

__all__ = [
    "correlation",
    "crafted_estimate",
    "crafted_gradient",
    "decrypt_slots",
    "imaginary_estimate",
    "own_error",
    "replica_estimate",
]


def _ciphertext(message, context: ts.Context):
    """The SEAL ciphertext of what the owner was handed (a ``CKKSVector``, its message bytes,
    an object holding ``.ciphertext``, or a SEAL ciphertext)."""
    if isinstance(message, (bytes, bytearray, memoryview)):
        message = ts.ckks_vector_from(context, bytes(message))
    if isinstance(message, ts.CKKSVector):
        [ciphertext] = message.data.ciphertext()
        return ciphertext
    return getattr(message, "ciphertext", message)


def decrypt_slots(context: ts.Context, message) -> np.ndarray:
    """Every slot of a ciphertext under ``context``'s secret key, as complex numbers.

    Args:
        context: the owner's TenSEAL context (with its secret key).
        message: the ciphertext (``CKKSVector``, its bytes, a returned SEAL ciphertext).
    """
    data = context.data
    seal = data.seal_context()
    plain = sealapi.Plaintext()
    sealapi.Decryptor(seal, data.secret_key()).decrypt(_ciphertext(message, context), plain)
    return np.asarray(sealapi.CKKSEncoder(seal).decode_complex(plain), dtype=np.complex128)


def own_error(context: ts.Context, message, values: np.ndarray) -> np.ndarray:
    """The owner's own encryption error slot by slot: its ciphertext of ``values`` decrypted
    (complex) minus ``values`` (the first ``len(values)`` slots)."""
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    return decrypt_slots(context, message)[: len(values)] - values


def replica_estimate(slots: np.ndarray, size: int, known: np.ndarray) -> np.ndarray:
    """The other factor of each product entry read from the slots beyond the vector's length.

    Slot ``size + j`` of a product of two TenSEAL vectors of length ``size`` holds entry
    ``j mod size`` again; where the owner's factor ``known`` is non-zero, ``Re(slot) / known``
    estimates the other factor (``NaN`` where there is no replica or ``known`` is 0).
    """
    known = np.asarray(known, dtype=np.float64).reshape(-1)
    out = np.full(len(known), np.nan)
    extra = slots[size:]
    count = min(len(extra), len(known))
    usable = np.abs(known[:count]) > 0
    first = extra[:count].real
    out[:count][usable] = first[usable] / known[:count][usable]
    return out


def imaginary_estimate(slots: np.ndarray, error: np.ndarray) -> np.ndarray:
    """The honest-but-curious owner's estimate of ``x_1`` per slot from the imaginary parts:
    ``Im(E) Im(e_G) / mean(Im(e_G)^2)`` over the slots of ``error`` (:func:`own_error`)."""
    error = np.asarray(error)
    imaginary = np.asarray(slots)[: len(error)].imag
    return imaginary * error.imag / np.mean(error.imag**2)


def crafted_gradient(context: ts.Context, values: np.ndarray, imaginary: np.ndarray) -> bytes:
    """A malicious owner's gradient ciphertext: a public-key encryption of ``values + i
    imaginary`` under its own key, as TenSEAL ``CKKSVector`` bytes (what the server expects)."""
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    data = context.data
    seal = data.seal_context()
    plain, ciphertext = sealapi.Plaintext(), sealapi.Ciphertext()
    entries = (values + 1j * np.asarray(imaginary, dtype=np.float64).reshape(-1)).tolist()
    sealapi.CKKSEncoder(seal).encode(entries, context.global_scale, plain)
    sealapi.Encryptor(seal, data.public_key()).encrypt(plain, ciphertext)
    return tenseal_vector_bytes(ciphertext, len(values))


def crafted_estimate(slots: np.ndarray, imaginary: np.ndarray) -> np.ndarray:
    """``Im(E) / T`` over the slots of ``imaginary`` (``T``): ``x_1`` of a crafted gradient."""
    imaginary = np.asarray(imaginary, dtype=np.float64).reshape(-1)
    return np.asarray(slots)[: len(imaginary)].imag / imaginary


def correlation(estimate: np.ndarray, truth: np.ndarray) -> tuple[float, int]:
    """``(Pearson correlation, count)`` of ``estimate`` with ``truth`` over the finite entries
    (``(0.0, count)`` where either is constant)."""
    estimate = np.asarray(estimate, dtype=np.float64).reshape(-1)
    truth = np.asarray(truth, dtype=np.float64).reshape(-1)
    keep = np.isfinite(estimate) & np.isfinite(truth)
    a, b = estimate[keep], truth[keep]
    if len(a) < 2 or a.std() == 0 or b.std() == 0:
        return 0.0, len(a)
    return float(np.corrcoef(a, b)[0, 1]), len(a)
