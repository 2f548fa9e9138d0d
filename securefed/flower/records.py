"""Flower records from and to securefed's arrays: how updates and broadcasts travel.

Every payload travels as an ``ArrayRecord`` of numpy arrays (serialized by Flower with
``np.save(allow_pickle=False)``: no pickle anywhere) and scalars as a ``ConfigRecord``. A batch of
:class:`~securefed.RowUpdates` becomes its CSR arrays (``clients``, ``indptr``, ``rows``,
``values``, ``n_rows``, ``dense`` and, when weighted, ``weights``), so a node hosting many users
sends one message per round, not one per user.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict

from securefed.transport.base import RowUpdates

ARRAYS = "arrays"
CONFIG = "config"
REFUSAL = "refusal"
"""Config key of a node's refusal reply: why it refused (the server then refuses the round)."""
REFUSAL_KIND = "refusal_kind"
"""Config key naming the refused check's error class (``ShareDecryptionError``, ...)."""
UPDATE_FIELDS = ("clients", "indptr", "rows", "values", "n_rows", "dense")


def arrays_record(arrays: Mapping[str, np.ndarray]) -> ArrayRecord:
    """Named numpy arrays as an ``ArrayRecord``."""
    return ArrayRecord(
        array_dict={
            name: Array(np.require(value, requirements="C")) for name, value in arrays.items()
        }
    )


def record_arrays(record: ArrayRecord) -> dict[str, np.ndarray]:
    """The numpy arrays of an ``ArrayRecord``."""
    return {name: array.numpy() for name, array in record.items()}


def content(
    arrays: Mapping[str, np.ndarray] | None = None, config: Mapping[str, object] | None = None
) -> RecordDict:
    """A message's content: ``arrays`` and ``config`` records (each optional)."""
    records: dict[str, ArrayRecord | ConfigRecord] = {}
    if arrays:
        records[ARRAYS] = arrays_record(arrays)
    records[CONFIG] = ConfigRecord(dict(config or {}))
    return RecordDict(records)


def message_arrays(message: Message) -> dict[str, np.ndarray]:
    """The arrays a message carries (empty if none)."""
    records = message.content.array_records
    return record_arrays(records[ARRAYS]) if ARRAYS in records else {}


def message_config(message: Message) -> dict[str, object]:
    """The scalars a message carries (empty if none)."""
    records = message.content.config_records
    return dict(records[CONFIG]) if CONFIG in records else {}


def message_nbytes(message: Message) -> int:
    """Bytes of the array payloads of a message (what dominates its size on the wire)."""
    if not message.has_content():
        return 0
    return sum(int(record.count_bytes()) for record in message.content.array_records.values())


def updates_to_arrays(updates: RowUpdates, prefix: str = "") -> dict[str, np.ndarray]:
    """The CSR arrays of a batch (``prefix`` namespaces them inside a larger record)."""
    arrays = {
        "clients": updates.clients,
        "indptr": updates.indptr,
        "rows": updates.rows,
        "values": updates.values,
        "n_rows": np.array(updates.n_rows, np.int64),
        "dense": np.array(updates.dense),
    }
    if updates.weights is not None:
        arrays["weights"] = updates.weights
    return {prefix + name: value for name, value in arrays.items()}


def arrays_to_updates(arrays: Mapping[str, np.ndarray], prefix: str = "") -> RowUpdates:
    """Rebuild a batch from :func:`updates_to_arrays` (validated by ``RowUpdates`` itself).

    Raises:
        ValueError: a field is missing, or the arrays do not form a valid batch.
    """
    missing = [name for name in UPDATE_FIELDS if prefix + name not in arrays]
    if missing:
        raise ValueError(f"an update message lacks {missing}")
    return RowUpdates(
        arrays[prefix + "clients"],
        arrays[prefix + "indptr"],
        arrays[prefix + "rows"],
        arrays[prefix + "values"],
        int(arrays[prefix + "n_rows"]),
        bool(arrays[prefix + "dense"]),
        arrays.get(prefix + "weights"),
    )


def concat_updates(batches: Sequence[RowUpdates], n_rows: int, width: int) -> RowUpdates:
    """One batch holding every client of ``batches`` (in order); an empty batch if none.

    Raises:
        ValueError: batches of different shapes, wire formats or weighting.
    """
    if not batches:
        return RowUpdates(
            np.zeros(0, np.int64),
            np.zeros(1, np.int64),
            np.zeros(0, np.int64),
            np.zeros((0, width)),
            n_rows,
        )
    if len({(b.shape, b.dense, b.weights is None) for b in batches}) > 1:
        raise ValueError("batches to join differ in shape, wire format or weighting")
    if len(batches) == 1:
        return batches[0]
    offsets = np.cumsum([0] + [len(b.rows) for b in batches[:-1]])
    indptr = np.concatenate(
        [[0]] + [b.indptr[1:] + offset for b, offset in zip(batches, offsets, strict=True)]
    )
    weights = None if batches[0].weights is None else np.concatenate([b.weights for b in batches])
    return RowUpdates(
        np.concatenate([b.clients for b in batches]),
        indptr,
        np.concatenate([b.rows for b in batches]),
        np.concatenate([b.values for b in batches]),
        batches[0].n_rows,
        batches[0].dense,
        weights,
    )


def bytes_rows(blobs: Sequence[bytes], width: int) -> np.ndarray:
    """Equal-length byte strings as a ``(len, width)`` uint8 array (keys, sealed shares)."""
    if any(len(b) != width for b in blobs):
        raise ValueError(f"every byte string must be {width} bytes")
    if not blobs:
        return np.zeros((0, width), np.uint8)
    return np.frombuffer(b"".join(blobs), np.uint8).reshape(len(blobs), width).copy()


def rows_bytes(array: np.ndarray) -> list[bytes]:
    """The byte strings of :func:`bytes_rows`."""
    array = np.asarray(array, np.uint8)
    return [row.tobytes() for row in array.reshape(len(array), -1)]
