"""Digests of saved files: every view, checkpoint and ledger file says whether it was modified.

A saved artefact is a JSON document (a view's ``manifest.json``, a ``checkpoint.json``, a ledger
file) and the binary files it names (``arrays.npz``, ``state.npz``). :func:`seal` adds a
``"digest"`` entry to the document::

    "digest": {"algorithm": "sha256", "content": "<hex>", "files": {"arrays.npz": "<hex>"}}

* ``content``: SHA-256 over the document's canonical JSON (keys sorted, no whitespace, ASCII,
  the ``digest`` entry left out), so any change to what the document *says* shows, however the
  file is formatted.
* ``files``: SHA-256 over the raw bytes of each named file (paths relative to the document's
  folder), so a binary file cannot be swapped, truncated or flipped without notice.
* ``algorithm: "hmac-sha256"`` when a key is given (RFC 2104 HMAC with SHA-256, the key at least
  16 bytes). A bare SHA-256 detects corruption; only the keyed form detects a *deliberate* edit,
  since anyone can recompute a hash. A keyed reader refuses an unkeyed file (it could have been
  re-sealed by anyone), and an unkeyed reader refuses a keyed file (it cannot check it).

:func:`verify` checks all of it and raises the caller's error type (``ViewFormatError``,
``CheckpointError``, ...) naming the file and the cause. Loaders then check the structure, since a
digest proves only that the file is what its writer wrote.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

DIGEST_FIELD = "digest"
ALGORITHMS = ("sha256", "hmac-sha256")
MIN_KEY_BYTES = 16
_CHUNK = 1 << 20


def check_key(key: bytes | None) -> bytes | None:
    """Refuse a key that is not bytes or is shorter than :data:`MIN_KEY_BYTES`."""
    if key is None:
        return None
    if not isinstance(key, (bytes, bytearray)):
        raise TypeError(f"an integrity key must be bytes, got {type(key).__name__}")
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"an integrity key needs at least {MIN_KEY_BYTES} bytes, got {len(key)}")
    return bytes(key)


def _hasher(key: bytes | None):
    return hashlib.sha256() if key is None else hmac.new(key, digestmod=hashlib.sha256)


def canonical_json(document: Mapping[str, object]) -> bytes:
    """The document without its digest entry, as sorted, compact, ASCII JSON bytes."""
    body = {k: v for k, v in document.items() if k != DIGEST_FIELD}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def content_digest(document: Mapping[str, object], key: bytes | None = None) -> str:
    """Hex SHA-256 (HMAC-SHA256 with ``key``) of :func:`canonical_json`."""
    hasher = _hasher(check_key(key))
    hasher.update(canonical_json(document))
    return hasher.hexdigest()


def file_digest(path: str | os.PathLike, key: bytes | None = None) -> str:
    """Hex SHA-256 (HMAC-SHA256 with ``key``) of a file's bytes."""
    hasher = _hasher(check_key(key))
    with open(path, "rb") as stream:
        while chunk := stream.read(_CHUNK):
            hasher.update(chunk)
    return hasher.hexdigest()


def seal(
    document: Mapping[str, object],
    folder: str | os.PathLike,
    files: Iterable[str] = (),
    *,
    key: bytes | None = None,
    default: Callable[[object], object] | None = None,
) -> dict[str, object]:
    """``document`` as JSON values, with its ``digest`` entry (content and ``files`` in ``folder``).

    ``default`` converts values JSON does not know (as in :func:`json.dumps`). The digest is
    computed over the document as it will read back (tuples as lists, keys as strings).
    """
    key = check_key(key)
    body = {k: v for k, v in document.items() if k != DIGEST_FIELD}
    body = json.loads(json.dumps(body, default=default))
    folder = Path(folder)
    digest = {
        "algorithm": "sha256" if key is None else "hmac-sha256",
        "content": content_digest(body, key),
        "files": {name: file_digest(folder / name, key) for name in sorted(files)},
    }
    return body | {DIGEST_FIELD: digest}


def write_sealed_json(
    path: str | os.PathLike,
    document: Mapping[str, object],
    files: Iterable[str] = (),
    *,
    key: bytes | None = None,
    default: Callable[[object], object] | None = None,
) -> Path:
    """Seal ``document`` (``files`` relative to the file's folder) and write it atomically."""
    path = Path(path)
    sealed = seal(document, path.parent, files, key=key, default=default)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(sealed, indent=1))
    os.replace(tmp, path)
    return path


def read_json(path: str | os.PathLike, error: type[Exception]) -> dict[str, object]:
    """A JSON object from ``path``; ``error`` names the file when it is missing or unreadable."""
    path = Path(path)
    if not path.is_file():
        raise error(f"{path} is missing")
    try:
        document = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as cause:
        raise error(f"{path}: not valid JSON ({cause}): the file is corrupt") from cause
    if not isinstance(document, dict):
        raise error(f"{path}: expected a JSON object, found {type(document).__name__}")
    return document


def verify(
    document: Mapping[str, object],
    path: str | os.PathLike,
    files: Iterable[str],
    *,
    key: bytes | None,
    error: type[Exception],
) -> None:
    """Check the digest of a document read from ``path`` and of the ``files`` it must name.

    Raises:
        error: naming the file and the cause: no digest, an unknown algorithm, a keyed file
            read without its key (or an unkeyed one with a key), a different set of files, a
            missing file, or a digest that does not match (modified or corrupt).
    """
    key = check_key(key)
    path = Path(path)
    digest = document.get(DIGEST_FIELD)
    if not isinstance(digest, dict):
        raise error(f"{path} carries no digest: refused (a saved file must say it is intact)")
    algorithm = digest.get("algorithm")
    if algorithm not in ALGORITHMS:
        raise error(f"{path}: unknown digest algorithm {algorithm!r} (expected {ALGORITHMS})")
    if key is not None and algorithm != "hmac-sha256":
        raise error(
            f"{path} is sealed with a plain SHA-256, but a key was given: anyone could have "
            "re-sealed it after an edit; refused"
        )
    if key is None and algorithm == "hmac-sha256":
        raise error(f"{path} is sealed with a key (HMAC-SHA256): pass the key to check it")
    expected_files = sorted(files)
    recorded = digest.get("files")
    if not isinstance(recorded, dict) or sorted(recorded) != expected_files:
        named = sorted(recorded) if isinstance(recorded, dict) else recorded
        raise error(f"{path}: its digest covers files {named}, expected {expected_files}")
    content = digest.get("content")
    if not isinstance(content, str) or not hmac.compare_digest(
        content, content_digest(document, key)
    ):
        raise error(f"{path}: content digest mismatch: the file was modified or is corrupt")
    for name in expected_files:
        target = path.parent / name
        if not target.is_file():
            raise error(f"{target} is missing (named by the digest of {path})")
        value = recorded[name]
        if not isinstance(value, str) or not hmac.compare_digest(value, file_digest(target, key)):
            raise error(
                f"{target}: digest mismatch with the one {path} records: one of the two was "
                "modified or is corrupt"
            )


KEY_PURPOSES: dict[str, bytes] = {
    "entropy": b"securefed checkpoint: root entropy sealing v1",
    "client-state": b"securefed checkpoint: client-private state sealing v1",
    "view-mac": b"securefed checkpoint: view and checkpoint MACs v1",
}
"""What a checkpoint key is used for, each through its own key (:func:`derive_key`): sealing
the root entropy, sealing the algorithm's (client-private) state, and the HMAC digests of the
checkpoint and its view. The HKDF ``info`` labels differ, so no derived key tells anything of
another (RFC 5869, section 3.2) and a tag made under one purpose never verifies under another."""
KEY_FILE_MODE = 0o600
"""The mode a key file must have: read and written by its owner only."""


def derive_key(key: bytes, purpose: str) -> bytes:
    """The 32-byte key for ``purpose`` (:data:`KEY_PURPOSES`): HKDF-SHA256 of ``key``.

    Raises:
        ValueError: an unknown purpose, or a key shorter than :data:`MIN_KEY_BYTES`.
    """
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    if purpose not in KEY_PURPOSES:
        raise ValueError(f"unknown key purpose {purpose!r}; one of {sorted(KEY_PURPOSES)}")
    key = check_key(key)
    if key is None:
        raise ValueError(f"deriving the {purpose} key needs a key")
    info = KEY_PURPOSES[purpose]
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(key)


def read_key_file(path: str | os.PathLike) -> bytes:
    """The key in file ``path``, refused unless only its owner can read or write it (0600).

    Raises:
        InsecureParameterError: the file is readable or writable by its group or others
            (naming the path and ``chmod 600``).
        FileNotFoundError: no such file.
        ValueError: a key shorter than :data:`MIN_KEY_BYTES`.
    """
    import stat

    from securefed.errors import InsecureParameterError

    path = Path(path)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise InsecureParameterError(
            f"key file {path} has mode {mode:04o}: its group or other users can read or change "
            f"the key; refused (run: chmod 600 {path})"
        )
    key = path.read_bytes()
    check_key(key)
    return key


def seal_bytes(key: bytes, data: bytes, context: str) -> bytes:
    """``nonce || AES-256-GCM(data)`` under ``key`` (32 bytes, from :func:`derive_key`), with
    ``context`` as associated data (opening it for another context fails)."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    nonce = os.urandom(12)
    return nonce + AESGCM(key).encrypt(nonce, data, context.encode())


def open_bytes(key: bytes, sealed: bytes, context: str, *, error: type[Exception]) -> bytes:
    """Decrypt what :func:`seal_bytes` wrote; ``error`` naming the context if it cannot."""
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    try:
        return AESGCM(key).decrypt(sealed[:12], sealed[12:], context.encode())
    except (ValueError, TypeError, InvalidTag) as cause:
        raise error(
            f"the {context} cannot be decrypted: another key, or the file was edited"
        ) from cause


SECRET_INFO = b"securefed sealed secret v1"


def seal_secret(key: bytes, secret: bytes, context: str) -> str:
    """Encrypt ``secret`` under ``key`` (AES-256-GCM, a key derived by HKDF-SHA256) for a file.

    Args:
        key: the caller's key (at least :data:`MIN_KEY_BYTES` bytes).
        secret: the bytes to protect.
        context: what the secret is (authenticated: opening it for another context fails).

    Returns:
        ``nonce || ciphertext`` in hex.
    """
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    nonce = os.urandom(12)
    sealed = AESGCM(_secret_key(key)).encrypt(nonce, secret, context.encode())
    return (nonce + sealed).hex()


def open_secret(key: bytes, token: str, context: str, *, error: type[Exception]) -> bytes:
    """Decrypt what :func:`seal_secret` wrote; ``error`` (naming the cause) if it cannot."""
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    try:
        raw = bytes.fromhex(token)
        return AESGCM(_secret_key(key)).decrypt(raw[:12], raw[12:], context.encode())
    except (ValueError, TypeError, InvalidTag) as cause:
        raise error(
            f"the {context} cannot be decrypted: another key, or the file was edited"
        ) from cause


def _secret_key(key: bytes) -> bytes:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    key = check_key(key)
    if key is None:
        raise ValueError("sealing a secret needs a key")
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=SECRET_INFO).derive(key)
