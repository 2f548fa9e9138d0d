"""CKKS over Flower: the nodes encrypt and decrypt, the server only adds ciphertexts.

The in-process :class:`~securefed.transport.ckks.CKKSTransport` keeps three roles apart in one
process (clients encrypt, the server adds under the public context, a key holder decrypts the
sum and floods it; Chai et al. 2020, Sec. 3; Li and Micciancio 2021 for the flooding). On Flower
the roles live on different machines:

* **provisioning, out of band**: :func:`provision_keys` generates the keys once and writes the
  users' shared secret context (TenSEAL's ``serialize(save_secret_key=True)`` bytes, file mode
  0600, :func:`~securefed.crypto.ckks.save_secret_context`) and the server's public context
  (:func:`~securefed.crypto.ckks.save_public_context`). The secret file is copied to the key
  holders' hosts only; no pickle anywhere, and the server never opens it.
* **the server** holds ``CKKSTransport(config, public=load_public_context(path))``: no secret
  key. It adds the ciphertexts the nodes send (:meth:`CKKSRound.receive_ciphertexts`) and, at the
  end of a round, sends the summed ciphertexts to one key-holder node
  (:meth:`CKKSRound.decryption_request`, one extra Flower message round, ``query.ckks_decrypt``).
* **the nodes** (:class:`NodeKeys`): each packs its users' updates exactly as the in-process
  round does (``pack_update``: ``w * x`` then ``w``), checks the public ``value_bound`` and
  encrypts them (shared model: with the users' secret key; committee model: with the public
  context); a key-holder node decrypts the sum (refusing ciphertexts whose check slot fails:
  relabelled from another key), floods and rounds it with
  :class:`~securefed.crypto.ckks.Flooding` from the stream ``("ckks", "flood", round)`` -- what
  ``KeyHolder.decrypt_aggregate`` does in one process, the std checked against the floor of the
  node's own parameters -- and returns only those values.

Ciphertexts travel as one ``uint8`` array of concatenated TenSEAL serializations with int64
offsets (their sizes vary by a few bytes: SEAL compresses them).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from securefed.crypto.ckks import (
    Ciphertext,
    ContextMismatchError,
    Flooding,
    PublicContext,
    SecretContext,
    load_public_context,
    load_secret_context,
    save_public_context,
    save_secret_context,
)
from securefed.privacy.noise import noise_source
from securefed.randomness import SeedTree
from securefed.transport.base import RowUpdates
from securefed.transport.ckks import (
    FLOOD_STREAM,
    CKKSConfig,
    KeyHolder,
    arrays_to_ciphertexts,
    check_batch_bound,
    ciphertexts_to_arrays,
    encrypt_state,
    encrypted_names,
    pack_update,
    state_from_arrays,
)

__all__ = [
    "PUBLIC_FILE",
    "SECRET_FILE",
    "NodeKeys",
    "arrays_to_ciphertexts",
    "ciphertexts_to_arrays",
    "load_cached_secret",
    "provision_keys",
]

SECRET_FILE = "ckks-secret.bin"
PUBLIC_FILE = "ckks-public.bin"


def provision_keys(directory: str | os.PathLike, config: CKKSConfig) -> tuple[Path, Path]:
    """Generate the keys for ``config`` and write ``(secret file, public file)`` in ``directory``.

    Run once, on a machine the key holders trust; copy the secret file (mode 0600) to each key
    holder's host over a secure channel and the public file to the server's host.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    secret = config.make_keys()
    return (
        save_secret_context(secret, directory / SECRET_FILE),
        save_public_context(secret, directory / PUBLIC_FILE),
    )


@dataclass(frozen=True)
class NodeKeys:
    """The CKKS keys one node holds.

    Attributes:
        secret: the users' shared secret context (shared model: every node; committee model:
            the committee's nodes only), or ``None``.
        public: the public context (committee-model clients encrypt with it); taken from
            ``secret`` when not given.

    Raises:
        ValueError: neither is given, or they are of different keys.
    """

    secret: SecretContext | None = None
    public: PublicContext | None = None

    def __post_init__(self) -> None:
        if self.secret is None and self.public is None:
            raise ValueError("a CKKS node needs the secret context, the public context, or both")
        if self.public is None:
            object.__setattr__(self, "public", self.secret.public())
        if self.secret is not None and self.secret.key_id != self.public.key_id:
            raise ContextMismatchError(
                f"the node's secret context (key {self.secret.key_id}) and public context (key "
                f"{self.public.key_id}) are of different keys"
            )

    @classmethod
    def from_paths(
        cls, secret_path: str | os.PathLike | None, public_path: str | os.PathLike | None
    ) -> NodeKeys:
        """Load the files of :func:`provision_keys` (empty or ``None`` paths are skipped)."""
        secret = load_cached_secret(str(secret_path)) if secret_path else None
        public = load_public_context(public_path) if public_path else None
        return cls(secret, public)

    @property
    def key_id(self) -> str:
        return self.public.key_id

    def check_key(self, key_id: str) -> None:
        """Refuse a round under another key than this node's (naming both).

        Raises:
            ContextMismatchError: the server's key id differs.
        """
        if key_id != self.key_id:
            raise ContextMismatchError(
                f"the server's CKKS key is {key_id}, this node holds key {self.key_id}: "
                "provision both from the same provision_keys() output"
            )

    def encrypt_updates(
        self, updates: RowUpdates, key_model: str, value_bound: float
    ) -> dict[str, np.ndarray]:
        """Pack, bound-check and encrypt every client's update of ``updates`` (one node's users).

        Raises:
            ValueError: an entry beyond ``value_bound`` (naming the client), before anything is
                encrypted.
            ContextMismatchError: the shared model on a node without the secret key.
        """
        if key_model == "shared" and self.secret is None:
            raise ContextMismatchError(
                "the shared key model needs the users' secret context on every node hosting "
                "users: give the node ckks-secret-path"
            )
        encrypt = self.secret.encrypt if key_model == "shared" else self.public.encrypt
        check_batch_bound(updates, value_bound)
        weighted = updates.weights is not None
        weights = updates.client_weights()
        per_client = [
            encrypt(pack_update(updates.client_block(k), weights[k] if weighted else None))
            for k in range(len(updates.clients))
        ]
        return {
            "users": np.asarray(updates.clients, np.int64),
            "weighted": np.array(weighted),
            **ciphertexts_to_arrays(per_client),
        }

    def _shared_secret(self, what: str) -> SecretContext:
        if self.secret is None:
            raise ContextMismatchError(
                f"{what} needs the users' shared secret key on every node hosting users "
                "(server_state='encrypted', shared key model): give the node ckks-secret-path"
            )
        return self.secret

    def encrypt_state(self, initial: np.ndarray) -> dict[str, np.ndarray]:
        """The initial encrypted server state, encrypted here (``[[V_0]]``, Chai et al. 2020,
        Sec. 3.2), as message arrays with its ``shape``
        (:func:`~securefed.transport.ckks.encrypt_state`, as a key holder in one process).

        Raises:
            ContextMismatchError: this node holds no secret key.
        """
        secret = self._shared_secret("encrypting the server's state")
        initial = np.asarray(initial, np.float64)
        arrays = ciphertexts_to_arrays([encrypt_state(secret, initial)])
        return arrays | {"shape": np.array(initial.shape, np.int64)}

    def open_broadcast(self, broadcast: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``broadcast`` with every encrypted matrix (``name.ct_*``, e.g. FedMF's ``[[V]]``)
        decrypted here with the users' shared key; the values never leave the node.

        Raises:
            ContextMismatchError: an encrypted matrix and no secret key, or another key's.
        """
        names = encrypted_names(broadcast)
        if not names:
            return dict(broadcast)
        secret = self._shared_secret("decrypting the broadcast state")
        opened = {
            k: v for k, v in broadcast.items() if not any(k.startswith(f"{n}.") for n in names)
        }
        for name in names:
            opened[name] = state_from_arrays(broadcast, name, secret)
        return opened

    def decrypt_sum(
        self,
        summed: Sequence[Ciphertext],
        length: int,
        flooding: Flooding,
        round_id: int,
        seeds: SeedTree,
        *,
        max_clients: int = 1,
    ) -> np.ndarray:
        """Decrypt the server's summed ciphertexts, flood and round (``KeyHolder``'s release).

        The flooding is checked against the floor for this node's own parameters at
        ``max_clients`` summed ciphertexts (default 1: the smallest bound, when the node is not
        told the federation's size).

        Raises:
            ContextMismatchError: this node holds no secret key, ciphertexts labelled with
                another key, or relabelled ones (their check slot fails).
            InsecureParameterError: ``flooding`` below the floor.
        """
        if self.secret is None:
            raise ContextMismatchError(
                "this node holds no CKKS secret key and cannot decrypt: ask a key holder"
            )
        noise = noise_source(seeds, *FLOOD_STREAM, round_id)
        holder = KeyHolder(self.secret, flooding, max_clients)
        return holder.decrypt_aggregate(summed, length, noise)


_SECRETS: dict[tuple[str, int, int], SecretContext] = {}


def load_cached_secret(path: str) -> SecretContext:
    """:func:`load_secret_context`, cached per process by path, size and modification time.

    A node loads its key for every message (Flower may start a fresh ClientApp per message);
    parsing the context once per process is enough.
    """
    info = Path(path).stat()
    key = (str(Path(path).resolve()), info.st_size, info.st_mtime_ns)
    if key not in _SECRETS:
        _SECRETS.clear()
        _SECRETS[key] = load_secret_context(path)
    return _SECRETS[key]
