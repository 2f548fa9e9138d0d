"""The ServerApp's checkpoint of an encrypted server state (FedMF's ``[[V]]``, issue 33).

Under ``server_state="encrypted"`` the server's item matrix exists only as CKKS ciphertexts under
the users' shared key; the server holds the public context only and cannot encrypt (symmetric
key model), so a restarted ServerApp can neither rebuild ``[[V]]`` from plaintext nor ask for
a fresh encryption of the trained matrix without a node decrypting it for it. The checkpoint
therefore carries the ciphertexts themselves: :class:`EncryptedStateCheckpoint` is the algorithm
as :class:`~securefed.runtime.Checkpoints` sees it, its ``state_dict`` plus, under
``encrypted_state.*``:

* the ciphertext bytes, offsets, lengths and key id of ``[[V]]`` and its shape
  (:meth:`~securefed.transport.ckks.EncryptedState.to_arrays`: TenSEAL's own serialization,
  what the broadcast carries; no secret key, no context, nothing that decrypts);
* the SHA-256 of every ciphertext (a damaged ``[[V]]`` is refused even where the file's digest
  was rewritten around it);
* the SHA-256 of the run's public context and its key id (a checkpoint written under other
  keys is refused by name: the fingerprint leaves the key paths out);
* the number of rounds folded into it, and a binding: the SHA-256 of the run's fingerprint,
  seed and per-round history (the history holds every round's wall-clock seconds, so two runs
  of one configuration have different bindings): a ``[[V]]`` grafted from another run's
  checkpoint into this one is refused.

On restore everything of ``[[V]]`` is checked before the algorithm changes (key and context,
structure, digests, and that every ciphertext parses under the run's public context, which
catches a truncation), the binding once the checkpoint's history is known, and only then the
state goes into the algorithm (``load_encrypted_state``). TenSEAL ciphertexts survive the trip
bit for bit (deserialized and serialized again they are the same bytes:
``tests/test_flower_encrypted_state.py``), so a resumed server continues from exactly the
``[[V]]`` the crashed one held.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence

import numpy as np

from securefed.crypto.ckks import Ciphertext, ContextMismatchError
from securefed.errors import CheckpointError
from securefed.integrity import canonical_json
from securefed.randomness import SeedTree
from securefed.transport.ckks import (
    CKKSTransport,
    EncryptedState,
    arrays_to_ciphertexts,
)

PREFIX = "encrypted_state."
"""The prefix of ``[[V]]``'s arrays in the checkpoint's state file."""
_NAME = PREFIX.rstrip(".")  # EncryptedState.to_arrays(name) gives f"{name}.ct_*"
_CIPHERTEXT_FIELDS = ("ct_bytes", "ct_offsets", "ct_lengths", "ct_counts", "ct_key", "ct_shape")
_META_FIELDS = ("ct_sha256", "context_sha256", "updates", "binding")


def context_sha256(transport: CKKSTransport) -> bytes:
    """SHA-256 of the run's public context (TenSEAL's serialization, no secret key)."""
    return hashlib.sha256(transport.server_context.serialized).digest()


def run_binding(
    fingerprint: Mapping[str, object], seeds: SeedTree, rounds: Sequence[Mapping[str, object]]
) -> bytes:
    """SHA-256 of the run's fingerprint, seed and history (JSON, as the checkpoint reads back)."""
    document = json.loads(
        json.dumps(
            {"fingerprint": fingerprint, "seed": seeds.seed, "history": list(rounds)}, default=str
        )
    )
    return hashlib.sha256(canonical_json(document)).digest()


class EncryptedStateCheckpoint:
    """The algorithm with its encrypted state, as the checkpoints save and restore it.

    Args:
        algorithm: the server's algorithm (``state_dict``, ``load_state_dict``,
            ``encrypted_state``, ``load_encrypted_state``).
        transport: the server's CKKS transport (public context only).
        directory: the checkpoint directory (named in the errors).
        binding: called at save time, the run's current :func:`run_binding`.
    """

    def __init__(self, algorithm, transport: CKKSTransport, directory, binding) -> None:
        self.algorithm = algorithm
        self.transport = transport
        self.directory = directory
        self._binding = binding
        self.restored: EncryptedState | None = None
        """``[[V]]`` as the last restore read and checked it (not yet in the algorithm)."""
        self.restored_updates = 0
        self.restored_binding = b""

    # -- save ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, np.ndarray]:
        state = self.algorithm.encrypted_state
        if state is None:
            raise CheckpointError(
                f"{self.directory}: the server holds no encrypted state to checkpoint yet"
            )
        arrays = dict(self.algorithm.state_dict())
        encrypted = state.to_arrays(_NAME)
        digests = [hashlib.sha256(c.data).digest() for c in state.ciphertexts()]
        encrypted[f"{PREFIX}ct_sha256"] = np.frombuffer(b"".join(digests), np.uint8).reshape(
            len(digests), 32
        )
        encrypted[f"{PREFIX}context_sha256"] = np.frombuffer(
            context_sha256(self.transport), np.uint8
        )
        encrypted[f"{PREFIX}updates"] = np.array(state.updates, np.int64)
        encrypted[f"{PREFIX}binding"] = np.frombuffer(self._binding(), np.uint8)
        return arrays | encrypted

    # -- restore ---------------------------------------------------------------------------
    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Check ``[[V]]``, then load the algorithm's arrays; ``[[V]]`` waits in :attr:`restored`.

        Raises:
            CheckpointError: naming ``[[V]]`` and the cause: missing, under another key or public
                context, malformed or truncated, a ciphertext whose digest differs, or one that
                does not parse under the run's public context.
        """
        fields = {k[len(PREFIX) :]: v for k, v in state.items() if k.startswith(PREFIX)}
        missing = [f for f in (*_CIPHERTEXT_FIELDS, *_META_FIELDS) if f not in fields]
        if missing:
            raise CheckpointError(
                f"{self.directory}: the checkpoint holds no complete encrypted state [[V]] "
                f"(missing {missing}); a server_state='encrypted' run resumes only from one"
            )
        where = f"{self.directory}: the checkpoint's encrypted state [[V]]"
        self._check_context(where, fields)
        ciphertexts, shape = self._structure(where, fields)
        self._check_digests(where, ciphertexts, fields["ct_sha256"])
        restored = self._parse(where, ciphertexts, shape)
        inner = {k: v for k, v in state.items() if not k.startswith(PREFIX)}
        self.algorithm.load_state_dict(inner)
        self.restored = restored
        self.restored_updates = int(np.asarray(fields["updates"]))
        self.restored_binding = np.asarray(fields["binding"], np.uint8).tobytes()

    def _check_context(self, where: str, fields: Mapping[str, np.ndarray]) -> None:
        """The key id and the public context's SHA-256 are this run's."""
        ours = self.transport.server_context
        key = np.asarray(fields["ct_key"], np.uint8).tobytes().decode(errors="replace")
        saved = np.asarray(fields["context_sha256"], np.uint8).tobytes()
        if key != ours.key_id or saved != context_sha256(self.transport):
            raise CheckpointError(
                f"{where} is under another CKKS context (key id {key!r}, public context sha256 "
                f"{saved.hex()[:16]}...) than this run's (key id {ours.key_id!r}, "
                f"{context_sha256(self.transport).hex()[:16]}...): the checkpoint was written "
                "with other keys"
            )

    def _structure(
        self, where: str, fields: Mapping[str, np.ndarray]
    ) -> tuple[list[Ciphertext], tuple[int, ...]]:
        """The ciphertexts (offsets, lengths and counts fitting the bytes) and the shape, the
        algorithm's."""
        try:
            [ciphertexts] = arrays_to_ciphertexts(
                {name: fields[name] for name in _CIPHERTEXT_FIELDS}
            )
            shape = tuple(int(n) for n in np.asarray(fields["ct_shape"], np.int64))
        except (ValueError, TypeError) as error:
            raise CheckpointError(f"{where} is malformed or truncated: {error}") from error
        expected = tuple(np.shape(self.algorithm.initial_state()))
        if shape != expected:
            raise CheckpointError(f"{where} has shape {shape}, the algorithm's state {expected}")
        return ciphertexts, shape

    def _parse(
        self, where: str, ciphertexts: list[Ciphertext], shape: tuple[int, ...]
    ) -> EncryptedState:
        """``[[V]]`` under the run's public context: every ciphertext parsed, as many as the
        packing of ``shape`` needs."""
        try:
            return self.transport.encrypted_state_from(ciphertexts, shape)
        except ContextMismatchError as error:
            raise CheckpointError(
                f"{where} does not parse under the run's public context (truncated or "
                f"corrupt ciphertext bytes): {error}"
            ) from error
        except ValueError as error:
            raise CheckpointError(f"{where} is truncated: {error}") from error

    @staticmethod
    def _check_digests(where: str, ciphertexts: list[Ciphertext], saved: np.ndarray) -> None:
        saved = np.asarray(saved, np.uint8)
        if saved.shape != (len(ciphertexts), 32):
            raise CheckpointError(
                f"{where} is truncated: {len(ciphertexts)} ciphertexts but "
                f"{saved.shape[0] if saved.ndim else 0} digests"
            )
        for index, (ciphertext, digest) in enumerate(zip(ciphertexts, saved, strict=True)):
            if hashlib.sha256(ciphertext.data).digest() != digest.tobytes():
                raise CheckpointError(
                    f"{where}: ciphertext {index} is corrupt (its SHA-256 differs from the one "
                    "saved with it)"
                )

    def _check_binding(self, binding: bytes) -> None:
        if self.restored_binding != binding:
            raise CheckpointError(
                f"{self.directory}: the checkpoint's encrypted state [[V]] belongs to another "
                "run (its binding to the fingerprint, seed and history differs from this "
                "checkpoint's)"
            )

    def install(self, binding: bytes) -> None:
        """Check the binding of the restored ``[[V]]`` to this run, then hand it to the algorithm.

        Raises:
            CheckpointError: ``[[V]]`` was written by another run (another fingerprint, seed or
                history than the checkpoint it sits in).
        """
        if self.restored is None:
            raise CheckpointError(f"{self.directory}: no encrypted state [[V]] was restored")
        self._check_binding(binding)
        self.restored.updates = self.restored_updates
        self.algorithm.load_encrypted_state(self.restored)
        self.restored = None
