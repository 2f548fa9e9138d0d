"""Transports: how client updates reach the server (plaintext, secure aggregation, DP, ...)."""

from securefed.transport.base import (
    Aggregate,
    AggregationRound,
    FactoredRows,
    RowUpdates,
    Transport,
)
from securefed.transport.plaintext import PlaintextTransport

__all__ = [
    "Aggregate",
    "AggregationRound",
    "FactoredRows",
    "PlaintextTransport",
    "RowUpdates",
    "Transport",
]
