"""Plaintext aggregation: the server sees every update in the clear.

This is the baseline every private transport is measured against, and what the attacks in
``attacks/`` exploit: each client's rows and values land in the view exactly as sent.
"""

from __future__ import annotations

import numpy as np

from securefed.transport.base import Aggregate, AggregationRound, RowUpdates, Transport
from securefed.transport.capabilities import TransportCapabilities


class PlaintextRound(AggregationRound):
    """Sums updates as they arrive (a client that drops after submitting stays in the sum)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._total = np.zeros(self.shape)
        self._weight = 0.0

    def _accept(self, updates: RowUpdates) -> None:
        self._total += updates.weighted_sum()
        weights = updates.client_weights()
        self._weight += float(weights.sum())
        self.view.add_bytes_up(updates.clients, updates.wire_bytes())
        if not self.view.keep_payloads:
            return
        for k, client in enumerate(updates.clients.tolist()):
            rows, values = updates.client_rows(k)
            fields = {"rows": rows, "values": values}
            if updates.weights is not None:
                fields["weight"] = np.array(weights[k])
            self.view.record_payload(client, fields)

    def _finish(self) -> Aggregate:
        contributors = np.array(sorted(self.submitted), dtype=np.int64)
        return Aggregate(self._total, self._weight, contributors)


class PlaintextTransport(Transport):
    """No protection: the reference for utility and cost, and the attacks' easy target."""

    name = "plaintext"

    def _round_class(self) -> type[AggregationRound]:
        return PlaintextRound

    @property
    def capabilities(self) -> TransportCapabilities:
        """Aggregation in this process; sparse rows on the wire; the server reads every update."""
        return TransportCapabilities(server_sees="updates", dense_wire=False)
