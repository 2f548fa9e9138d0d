"""Transports: how client updates reach the server (plaintext, secure aggregation, DP, ...)."""

from securefed.transport.base import Aggregate, AggregationRound, RowUpdates, Transport
from securefed.transport.plaintext import PlaintextTransport

__all__ = ["Aggregate", "AggregationRound", "PlaintextTransport", "RowUpdates", "Transport"]
