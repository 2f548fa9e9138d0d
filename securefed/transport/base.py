"""The aggregation-shaped transport seam.

A recommender never asks which transport it has. Each round it opens an :class:`AggregationRound`
for the clients taking part, declares the shape of what they will send, submits their updates,
and reads the (weighted) sum back::

    rnd = transport.open_round(round_id, clients, shape=(n_rows, width), seeds=seeds)
    rnd.broadcast("V", item_factors)                   # counted as bytes down per client
    rnd.submit_batch(RowUpdates(...))                  # or rnd.submit(client, vector, weight=w)
    rnd.drop(client)                                   # a client that went away
    aggregate = rnd.result()                           # Aggregate(total, weight, contributors)

Everything the server receives is recorded in ``rnd.view`` (a :class:`~securefed.views.RoundView`),
as that transport's server sees it. Implementations subclass :class:`AggregationRound` and fill in
``_accept`` (take a validated batch) and ``_finish`` (produce the aggregate); the template methods
here do the validation and bookkeeping that every transport needs, so no transport can forget it.

What a transport serves is declared as data, :attr:`Transport.capabilities`
(:mod:`securefed.transport.capabilities`); an algorithm states what its configuration needs and is
refused when the run is built, never by asking which transport it has. A server state that stays
encrypted is the seam's optional part: :meth:`Transport.encrypted_state` and
:meth:`AggregationRound.fold_into`, offered where ``capabilities.encrypted_state`` says so.

Weights are applied on the client side: a client with weight ``w`` contributes ``w * update`` and
``w`` (the server learns ``sum w * update`` and ``sum w``, never a single ``w`` under a hiding
transport). That is what lets FedRec+'s aggregation weights survive secure aggregation.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

from securefed._checks import finite_array
from securefed.errors import AggregationError, UnsupportedTransport
from securefed.randomness import SeedTree
from securefed.transport.capabilities import TransportCapabilities
from securefed.views import NO_PAYLOADS, RoundSelection, RoundView, ServerView

if TYPE_CHECKING:
    from securefed.privacy.ledger import PrivacyLedger

FLOAT_BYTES = 8
INDEX_BYTES = 4


@dataclass(frozen=True, eq=False)
class FactoredRows:
    """Entry values of the form ``coef[k] * left[owner[k]] + scale[k] * right[rows[k]]``.

    The shape of every matrix-factorisation upload: a rated item's gradient is the rating's
    error times the user's vector plus a term of the item's own (its regulariser, its count
    column). ``explicit`` rows then overwrite the entries at ``explicit_at`` (e.g. per-client
    statistics rows). A transport that only needs the weighted sum (plaintext, with no
    per-client payload recorded) computes it from the factors with one sparse product, never
    building the ``(nnz, width)`` values; any other reader of :attr:`RowUpdates.values` gets
    them materialised once (the same numbers).

    Attributes:
        coef: ``(nnz,)`` per-entry coefficient of the client factor.
        left: ``(n_clients, width)`` one row per client of the batch (batch order).
        right: ``(n_rows, width)`` one row per row of the block.
        scale: ``(nnz,)`` per-entry multiplier of ``right`` (``None``: all 1).
        explicit_at: entry positions whose values are given explicitly.
        explicit: ``(len(explicit_at), width)`` those values.
    """

    coef: np.ndarray
    left: np.ndarray
    right: np.ndarray
    scale: np.ndarray | None = None
    explicit_at: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    explicit: np.ndarray | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "coef", finite_array("update coefficients", self.coef))
        object.__setattr__(self, "left", finite_array("update client factors", self.left))
        object.__setattr__(self, "right", finite_array("update row factors", self.right))
        object.__setattr__(self, "explicit_at", np.asarray(self.explicit_at, dtype=np.int64))
        width = self.right.shape[1] if self.right.ndim == 2 else -1
        explicit = np.zeros((0, max(width, 0))) if self.explicit is None else self.explicit
        object.__setattr__(self, "explicit", finite_array("update values", explicit))
        if self.scale is not None:
            object.__setattr__(self, "scale", finite_array("update scales", self.scale))
        if self.left.ndim != 2 or self.right.ndim != 2 or self.left.shape[1] != width:
            raise ValueError(
                f"left {self.left.shape} and right {self.right.shape} must be 2-D of one width"
            )
        if self.coef.ndim != 1 or (self.scale is not None and self.scale.shape != self.coef.shape):
            raise ValueError("coef (and scale) must be 1-D, one number per entry")
        if self.explicit.shape != (len(self.explicit_at), width):
            raise ValueError(
                f"explicit values have shape {self.explicit.shape}, expected "
                f"({len(self.explicit_at)}, {width})"
            )

    @property
    def width(self) -> int:
        return self.right.shape[1]

    def formula(self, owner: np.ndarray, rows: np.ndarray, at: slice | np.ndarray = slice(None)):
        """The formula's values (explicit entries not applied) of the entries ``at``.

        Args:
            owner, rows: batch position of the client and row of each of those entries.
            at: which entries (all by default).
        """
        values = np.take(self.left, owner, axis=0)
        values *= self.coef[at, None]
        right = np.take(self.right, rows, axis=0)
        if self.scale is not None:
            right *= self.scale[at, None]
        values += right
        return values

    def materialise(self, owner: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """The ``(nnz, width)`` values, explicit entries included."""
        values = self.formula(owner, rows)
        values[self.explicit_at] = self.explicit
        return values

    def row_sum(
        self, indptr: np.ndarray, rows: np.ndarray, entry_weight: np.ndarray, n_rows: int
    ) -> np.ndarray:
        """``sum_k entry_weight[k] * values[k]`` into the ``(n_rows, width)`` block.

        Args:
            indptr: the batch's CSR offsets by client (entries are grouped by client).
            rows: each entry's row.
            entry_weight: each entry's aggregation weight.
            n_rows: rows of the block.
        """
        from scipy import sparse

        # Column c holds client c's coefficients at its rows (distinct within a client).
        client_term = sparse.csc_matrix(
            (entry_weight * self.coef, rows, indptr), shape=(n_rows, len(self.left))
        )
        row_weight = entry_weight if self.scale is None else entry_weight * self.scale
        total = np.asarray(client_term @ self.left)
        total += np.bincount(rows, weights=row_weight, minlength=n_rows)[:, None] * self.right
        if len(self.explicit_at):
            at = self.explicit_at
            owner = np.searchsorted(indptr, at, side="right") - 1
            correction = self.explicit - self.formula(owner, rows[at], at)
            np.add.at(total, rows[at], entry_weight[at, None] * correction)
        return total


class RowUpdates:
    """A batch of client updates to an ``(n_rows, width)`` block, each client touching some rows.

    Stored like a CSR matrix over clients: client ``clients[k]`` sends rows
    ``rows[indptr[k]:indptr[k+1]]`` with values ``values[indptr[k]:indptr[k+1]]``; rows it does not
    send are zero. ``dense=True`` means the wire format is the full block (every client sends all
    ``n_rows * width`` numbers, zeros included), e.g. FedMF-Full, which hides *which* rows a
    client touched once a hiding transport is used. Immutable.

    Args:
        clients: client ids, distinct.
        indptr: ``len(clients) + 1`` offsets into ``rows`` and ``values``.
        rows: row index of each entry (distinct within a client).
        values: ``(nnz, width)`` float64 values, or a :class:`FactoredRows` that defines them
            (materialised on first read of :attr:`values`; :meth:`weighted_sum` never needs to).
        n_rows: number of rows of the block.
        dense: wire format is the full block.
        weights: per-client aggregation weight (``None``: all 1, and no weight is sent).
    """

    __slots__ = ("_values", "clients", "dense", "factored", "indptr", "n_rows", "rows", "weights")

    def __init__(
        self,
        clients: np.ndarray,
        indptr: np.ndarray,
        rows: np.ndarray,
        values: np.ndarray | FactoredRows,
        n_rows: int,
        dense: bool = False,
        weights: np.ndarray | None = None,
    ) -> None:
        clients = np.asarray(clients, dtype=np.int64)
        indptr = np.asarray(indptr, dtype=np.int64)
        rows = np.asarray(rows, dtype=np.int64)
        if isinstance(values, FactoredRows):
            factored, stored, n_values = values, None, len(values.coef)
            if len(values.left) != len(clients):
                raise ValueError(
                    f"factored values have {len(values.left)} client rows for "
                    f"{len(clients)} clients"
                )
            if len(values.right) != n_rows:
                raise ValueError(f"factored values have {len(values.right)} rows, not {n_rows}")
        else:
            factored, stored = None, finite_array("update values", values)
            if stored.ndim != 2:
                raise ValueError(f"values must be 2-D (entries, width), got shape {stored.shape}")
            n_values = len(stored)
        if clients.ndim != 1 or len(np.unique(clients)) != len(clients):
            raise ValueError("clients must be a 1-D array of distinct ids")
        if indptr.shape != (len(clients) + 1,) or indptr[0] != 0 or np.any(np.diff(indptr) < 0):
            raise ValueError(f"indptr must be {len(clients) + 1} non-decreasing offsets from 0")
        if indptr[-1] != len(rows) or len(rows) != n_values:
            raise ValueError(
                f"indptr ends at {indptr[-1]} but there are {len(rows)} rows and {n_values} values"
            )
        if len(rows) and (rows.min() < 0 or rows.max() >= n_rows):
            raise ValueError(f"row indices must lie in [0, {n_rows})")
        if weights is not None:
            weights = finite_array("weights", weights)
            if weights.shape != clients.shape or np.any(weights < 0):
                raise ValueError("weights must be one non-negative number per client")
        fields = {
            "clients": clients,
            "indptr": indptr,
            "rows": rows,
            "n_rows": int(n_rows),
            "dense": bool(dense),
            "weights": weights,
            "factored": factored,
            "_values": stored,
        }
        for name, value in fields.items():
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value) -> None:
        raise AttributeError(f"RowUpdates is immutable (tried to set {name!r})")

    @property
    def values(self) -> np.ndarray:
        """``(nnz, width)`` values (materialised from :attr:`factored` on first read)."""
        if self._values is None:
            owner = np.repeat(np.arange(len(self.clients)), np.diff(self.indptr))
            object.__setattr__(self, "_values", self.factored.materialise(owner, self.rows))
        return self._values

    @classmethod
    def single(cls, client: int, vector: np.ndarray, *, weight: float | None = None) -> RowUpdates:
        """One client's dense 1-D vector, as a ``(1, len(vector))`` block."""
        vector = np.asarray(vector, dtype=np.float64)
        if vector.ndim != 1:
            raise ValueError(f"a submitted vector must be 1-D, got shape {vector.shape}")
        weights = None if weight is None else np.array([weight], dtype=np.float64)
        return cls(
            np.array([client]), np.array([0, 1]), np.zeros(1), vector[None, :], 1, True, weights
        )

    @property
    def width(self) -> int:
        return self.factored.width if self._values is None else self._values.shape[1]

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n_rows, self.width)

    def client_weights(self) -> np.ndarray:
        return np.ones(len(self.clients)) if self.weights is None else self.weights

    def client_rows(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows and values of the ``k``-th client of the batch (views, not copies)."""
        start, stop = self.indptr[k], self.indptr[k + 1]
        return self.rows[start:stop], self.values[start:stop]

    def client_block(self, k: int) -> np.ndarray:
        """The ``k``-th client's full ``(n_rows, width)`` block, unweighted."""
        block = np.zeros(self.shape)
        rows, values = self.client_rows(k)
        block[rows] = values
        return block

    def weighted_sum(self) -> np.ndarray:
        """``sum_k weight_k * block_k`` computed without densifying any client.

        From the factors when the values are factored (no ``(nnz, width)`` temporary).
        """
        from scipy import sparse  # local: scipy is only needed by the plaintext fast path

        if self.weights is None:
            entry_weight = np.ones(len(self.rows))
        else:
            entry_weight = np.repeat(self.weights, np.diff(self.indptr))
        if self.factored is not None:
            return self.factored.row_sum(self.indptr, self.rows, entry_weight, self.n_rows)
        # Column j of the selector holds entry j's weight at its row: a scatter-add in C.
        selector = sparse.csc_matrix(
            (entry_weight, self.rows, np.arange(len(self.rows) + 1)),
            shape=(self.n_rows, len(self.rows)),
        )
        return np.asarray(selector @ self.values)

    def wire_bytes(self) -> np.ndarray:
        """Plaintext bytes each client sends: the values, row indices unless dense, the weight."""
        counts = np.diff(self.indptr)
        if self.dense:
            per_client = np.full(len(self.clients), self.n_rows * self.width * FLOAT_BYTES)
        else:
            per_client = counts * (INDEX_BYTES + self.width * FLOAT_BYTES)
        if self.weights is not None:
            per_client = per_client + FLOAT_BYTES
        return per_client.astype(np.int64)


@dataclass(frozen=True, eq=False)
class Aggregate:
    """What a round yields: ``total = sum_k w_k x_k`` and ``weight = sum_k w_k``, k contributing."""

    total: np.ndarray
    weight: float
    contributors: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    def mean(self) -> np.ndarray:
        """``total / weight``; raises if no weight arrived."""
        if self.weight <= 0:
            raise AggregationError("no weight was aggregated: the mean is undefined")
        return self.total / self.weight


class AggregationRound(ABC):
    """One round of the aggregation shape (template; transports fill in ``_accept``/``_finish``).

    Args:
        round_id: the round number.
        clients: ids of the clients asked to take part.
        shape: ``(n_rows, width)`` that every client's update has.
        view: where the server's observations of this round are recorded.
        seeds: the run's seed tree (transports derive masks/noise from it, or refuse it in
            secure mode).
    """

    def __init__(
        self,
        round_id: int,
        clients: Sequence[int] | np.ndarray,
        *,
        shape: tuple[int, int],
        view: RoundView,
        seeds: SeedTree,
    ) -> None:
        if len(shape) != 2 or min(shape) < 1:
            raise ValueError(f"shape must be (n_rows >= 1, width >= 1), got {shape}")
        self.round_id = round_id
        self.shape = (int(shape[0]), int(shape[1]))
        self.view = view
        self.seeds = seeds
        self.clients = view.clients
        self.submitted: set[int] = set()
        self.dropped: set[int] = set()
        self._result: Aggregate | None = None

    # -- template methods ---------------------------------------------------------------
    def submit(self, client: int, vector: np.ndarray, *, weight: float | None = None) -> None:
        """Submit one client's update, a 1-D vector of ``n_rows * width`` numbers (row-major)."""
        vector = np.asarray(vector, dtype=np.float64)
        expected = self.shape[0] * self.shape[1]
        if vector.shape != (expected,):
            raise ValueError(
                f"client {client} submitted a vector of shape {vector.shape}; "
                f"this round expects ({expected},) = {self.shape[0]} rows x {self.shape[1]}"
            )
        block = vector.reshape(self.shape)
        weights = None if weight is None else np.array([weight], dtype=np.float64)
        self.submit_batch(
            RowUpdates(
                np.array([client]),
                np.array([0, self.shape[0]]),
                np.arange(self.shape[0]),
                block,
                self.shape[0],
                True,
                weights,
            )
        )

    def submit_batch(self, updates: RowUpdates) -> None:
        """Submit many clients' updates at once (the vectorised path)."""
        self._check_open()
        if updates.shape != self.shape:
            raise ValueError(f"updates have shape {updates.shape}, this round expects {self.shape}")
        self.view.positions(updates.clients)  # raises for clients outside the round
        repeated = self.submitted.intersection(updates.clients.tolist())
        if repeated:
            raise AggregationError(
                f"client(s) {sorted(repeated)[:5]} already submitted in this round"
            )
        gone = self.dropped.intersection(updates.clients.tolist())
        if gone:
            raise AggregationError(f"client(s) {sorted(gone)[:5]} dropped out and cannot submit")
        self._accept(updates)
        self.submitted.update(updates.clients.tolist())

    def drop(self, client: int) -> None:
        """Mark a client as gone silent.

        A client that drops before submitting contributes nothing. One that drops after
        submitting still counts (the server holds its upload); a transport that needs the
        clients' help to finish (secure aggregation's unmasking) must recover without it.
        """
        self._check_open()
        self.view.positions([client])
        self.dropped.add(int(client))
        self.view.dropped = sorted(self.dropped)
        self._on_drop(int(client))

    def broadcast(
        self, name: str, value: np.ndarray, *, bytes_per_client: int | None = None
    ) -> None:
        """Send ``value`` to every client of the round: recorded, and counted as bytes down."""
        value = np.asarray(value)
        nbytes = value.size * FLOAT_BYTES if bytes_per_client is None else bytes_per_client
        self.view.add_bytes_down(self.clients, nbytes)
        self.view.record_broadcast(name, value)

    def result(self) -> Aggregate:
        """The aggregate over the clients that submitted and did not drop.

        Raises:
            AggregationError: when the transport cannot produce a correct result.
        """
        if self._result is None:
            self._result = self._finish()
            self.view.aggregate["total"] = self._result.total
            self.view.aggregate["weight"] = np.array(self._result.weight)
        return self._result

    def _check_open(self) -> None:
        if self._result is not None:
            raise AggregationError(f"round {self.round_id} is finished; open a new round")

    # -- what transports implement ------------------------------------------------------
    @abstractmethod
    def _accept(self, updates: RowUpdates) -> None:
        """Take a validated batch (record what the server sees and the bytes up)."""

    @abstractmethod
    def _finish(self) -> Aggregate:
        """Produce the aggregate of the surviving clients."""

    def _on_drop(self, client: int) -> None:  # noqa: B027 - optional hook
        """React to a dropout (default: nothing to do)."""

    def fold_into(self, state: EncryptedServerState) -> None:
        """Add this round's sum to ``state`` at the server without decrypting anything.

        Offered by transports whose ``capabilities.encrypted_state`` is true; after it,
        :meth:`result` raises (the server never learns the aggregate).

        Raises:
            UnsupportedTransport: this transport keeps no encrypted server state.
        """
        raise UnsupportedTransport(
            f"round {self.round_id} cannot fold into an encrypted server state: its transport "
            "keeps none (capabilities.encrypted_state is False)"
        )


class EncryptedServerState(Protocol):
    """A matrix the server holds encrypted (:meth:`Transport.encrypted_state`).

    Each round its clients download and decrypt it, and the round's summed updates are added
    to it at the server (:meth:`AggregationRound.fold_into`); nothing is decrypted there.
    """

    shape: tuple[int, int]
    updates: int

    def download(self, rnd: AggregationRound) -> np.ndarray:
        """Send the state to ``rnd``'s clients (counted as bytes down); the matrix they see."""

    def reveal(self) -> np.ndarray:
        """The key holders' decryption (what a client sees; evaluation at the end)."""


class Transport(ABC):
    """A way for clients to get an aggregate to the server; owns the run's :class:`ServerView`.

    Args:
        keep_payloads: rounds whose full per-client payloads the view keeps.
        total_rounds: run length, to resolve ``RoundSelection(last=k)``.
    """

    name: str = "abstract"
    ledger: PrivacyLedger | None = None
    """The privacy ledger this transport's noisy releases are charged to (``None``: none)."""

    def __init__(
        self, *, keep_payloads: RoundSelection = NO_PAYLOADS, total_rounds: int | None = None
    ):
        self.view = ServerView(
            self.name,
            keep_payloads=keep_payloads,
            total_rounds=total_rounds,
            public=self.public_parameters(),
        )

    def open_round(
        self,
        round_id: int,
        clients: Sequence[int] | np.ndarray,
        *,
        shape: tuple[int, int],
        seeds: SeedTree,
    ) -> AggregationRound:
        """Start round ``round_id`` for ``clients`` whose updates have ``shape``."""
        round_view = self.view.open(round_id, np.asarray(clients))
        return self._round_class()(round_id, clients, shape=shape, view=round_view, seeds=seeds)

    @abstractmethod
    def _round_class(self) -> type[AggregationRound]:
        """The AggregationRound subclass of this transport."""

    @property
    def capabilities(self) -> TransportCapabilities:
        """What this transport serves.

        The default is the conservative declaration: aggregation rounds with the clients in this
        process, no encrypted state, sparse uploads, and the server seeing every update (a
        transport that declares nothing is credited with hiding nothing).
        """
        return TransportCapabilities()

    def encrypted_state(self, initial: np.ndarray) -> EncryptedServerState:
        """Encrypt ``initial`` into a state that stays encrypted at the server.

        Offered where ``capabilities.encrypted_state`` is true.

        Raises:
            UnsupportedTransport: this transport keeps no encrypted server state.
        """
        raise UnsupportedTransport(
            f"the {self.name!r} transport keeps no encrypted server state "
            "(capabilities.encrypted_state is False)"
        )

    def public_parameters(self) -> dict[str, object]:
        """Parameters every party (and the view) may know, JSON-serialisable."""
        return {"transport": self.name}

    def privacy_ledgers(self) -> tuple[PrivacyLedger, ...]:
        """The privacy ledgers this transport charges, outermost first (none by default).

        A wrapper that adds noise returns its own ledger and then its inner transport's.
        :func:`securefed.runtime.run_rounds` saves them with every checkpoint and restores them
        on resume, so accounting never restarts from zero.
        """
        return ()
