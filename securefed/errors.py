"""Exception types of securefed.

Every error names its cause; library code never validates with ``assert``.
"""

from __future__ import annotations


class SecurefedError(Exception):
    """Base class of securefed's own errors."""


class AggregationError(SecurefedError, RuntimeError):
    """An aggregation round cannot produce a correct result (too few survivors, protocol misuse)."""


class CheckpointError(SecurefedError, RuntimeError):
    """A checkpoint is missing, corrupt, or belongs to a different configuration."""


class LedgerFormatError(CheckpointError, ValueError):
    """A saved privacy ledger is missing, corrupt, or not the documented format."""


class ViewFormatError(SecurefedError, ValueError):
    """A saved ServerView does not follow the documented format."""


class InsecureParameterError(SecurefedError, ValueError):
    """Parameters that would void the privacy guarantee (refused rather than run)."""


class PrivacyBudgetExceeded(SecurefedError, RuntimeError):
    """A noisy round would spend more privacy than the configured budget allows."""


class TransportUnavailable(SecurefedError, RuntimeError):
    """A transport cannot be built here: an optional extra it needs is not installed.

    The message names the extra to install (e.g. ``pip install 'securefed[he]'``).
    """


class UnsupportedTransport(SecurefedError, ValueError):
    """A transport cannot serve what an algorithm's configuration needs.

    Raised when the run is built (``run_rounds``' first step, or the algorithm's own), naming the
    option that needs what the transport lacks; never half-way through a run.
    """


class AlgorithmContractError(SecurefedError, TypeError):
    """An object handed to ``run_rounds`` lacks a member of the ``FederatedAlgorithm`` contract.

    Raised when the run is built, naming every missing or malformed member.
    """
