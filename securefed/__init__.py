"""securefed: private federated learning for recommenders.

The privacy layer: transports that carry client updates to a server (plaintext; secure
aggregation, CKKS and differential privacy plug into the same seam), the :class:`ServerView` that
records what the server saw, the seed tree, and the round loop with checkpoints. It knows nothing
of recommenders; ``recsys`` and ``rl`` are its reference users.
"""

from securefed.errors import (
    AggregationError,
    AlgorithmContractError,
    CheckpointError,
    InsecureParameterError,
    LedgerFormatError,
    PrivacyBudgetExceeded,
    SecurefedError,
    TransportUnavailable,
    UnsupportedTransport,
    ViewFormatError,
)
from securefed.randomness import SeedTree
from securefed.runtime import (
    ClientSampling,
    FederatedAlgorithm,
    RunHistory,
    RunOptions,
    check_algorithm,
    run_rounds,
)
from securefed.transport import (
    Aggregate,
    AggregationRound,
    FactoredRows,
    PlaintextTransport,
    RowUpdates,
    Transport,
    TransportCapabilities,
    TransportNeeds,
    available_transports,
    build_transport,
)
from securefed.views import ALL_PAYLOADS, NO_PAYLOADS, RoundSelection, RoundView, ServerView

__version__ = "0.1.0"

__all__ = [
    "ALL_PAYLOADS",
    "NO_PAYLOADS",
    "Aggregate",
    "AggregationError",
    "AggregationRound",
    "AlgorithmContractError",
    "CheckpointError",
    "ClientSampling",
    "FactoredRows",
    "FederatedAlgorithm",
    "InsecureParameterError",
    "LedgerFormatError",
    "PlaintextTransport",
    "PrivacyBudgetExceeded",
    "RoundSelection",
    "RoundView",
    "RowUpdates",
    "RunHistory",
    "RunOptions",
    "SecurefedError",
    "SeedTree",
    "ServerView",
    "Transport",
    "TransportCapabilities",
    "TransportNeeds",
    "TransportUnavailable",
    "UnsupportedTransport",
    "ViewFormatError",
    "available_transports",
    "build_transport",
    "check_algorithm",
    "run_rounds",
]
