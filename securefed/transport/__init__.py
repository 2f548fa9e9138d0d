"""Transports: how client updates reach the server (plaintext, secure aggregation, DP, ...).

Build one by name with :func:`build_transport` (:mod:`securefed.transport.registry`); each
declares what it serves as :class:`TransportCapabilities`
(:mod:`securefed.transport.capabilities`).
"""

from securefed.transport.base import (
    Aggregate,
    AggregationRound,
    EncryptedServerState,
    FactoredRows,
    RowUpdates,
    Transport,
)
from securefed.transport.capabilities import (
    TransportCapabilities,
    TransportNeeds,
    capability_findings,
    require_capabilities,
)
from securefed.transport.plaintext import PlaintextTransport
from securefed.transport.registry import (
    BuildContext,
    CKKSOptions,
    DPOptions,
    SecAggOptions,
    TransportAvailability,
    TransportSpec,
    available_transports,
    build_transport,
    option_groups,
    option_names,
    parse_transport_spec,
    register_transport,
    resolve_options,
    transport_names,
)

__all__ = [
    "Aggregate",
    "AggregationRound",
    "BuildContext",
    "CKKSOptions",
    "DPOptions",
    "EncryptedServerState",
    "FactoredRows",
    "PlaintextTransport",
    "RowUpdates",
    "SecAggOptions",
    "Transport",
    "TransportAvailability",
    "TransportCapabilities",
    "TransportNeeds",
    "TransportSpec",
    "available_transports",
    "build_transport",
    "capability_findings",
    "option_groups",
    "option_names",
    "parse_transport_spec",
    "register_transport",
    "require_capabilities",
    "resolve_options",
    "transport_names",
]
