"""Secure aggregation behind the aggregation seam: :class:`SecAggTransport`."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from securefed.errors import AggregationError
from securefed.randomness import SeedTree
from securefed.transport.base import AggregationRound, Transport
from securefed.transport.capabilities import TransportCapabilities
from securefed.transport.secagg.config import SecAggConfig
from securefed.transport.secagg.server import SecAggRound
from securefed.transport.secagg.signatures import KeyRegistry, SimulatedSigners
from securefed.views import NO_PAYLOADS, RoundSelection


class SecAggTransport(Transport):
    """Secure aggregation (SecAgg / SecAgg+) behind the aggregation seam.

    Args:
        config: protocol parameters (default :class:`SecAggConfig`).
        keep_payloads: rounds whose per-client payloads the view keeps (the masked vectors, the
            public keys, the relayed ciphertexts and the shares revealed at unmasking).
        total_rounds: run length, to resolve ``RoundSelection(last=k)``.
        remote_clients: the clients run elsewhere and talk to the server's stage methods through
            a message layer (``securefed.flower``); the rounds then hold no client secrets and
            refuse a plaintext ``submit`` (:class:`SecAggRound`).
        registry: (malicious-server variant, remote clients) the key registry of set-up, for the
            server's own early check of signed advertisements (``auth="signatures"``; a MAC
            only its recipient can check); the clients check them regardless. Simulated
            clients get their long-term keys and a registry from the transport's set-up
            (:class:`~securefed.transport.secagg.signatures.SimulatedSigners`, kept across
            rounds with the static pairwise keys they agree).
        keep_masked: in the rounds ``keep_payloads`` selects, keep each client's masked
            integers (``masked``); by default the view keeps their SHA-256 (``masked_sha256``):
            they are uniform to the server, and a block per client (docs/serverview.md).

    Example:
        >>> from securefed import SeedTree
        >>> transport = SecAggTransport(SecAggConfig(neighbours=4))
        >>> rnd = transport.open_round(0, range(6), shape=(1, 3), seeds=SeedTree(0))
        >>> for c in range(6):
        ...     rnd.submit(c, np.full(3, 0.25))
        >>> np.round(rnd.result().total, 3).tolist()
        [[1.5, 1.5, 1.5]]
    """

    name = "secagg"

    def __init__(
        self,
        config: SecAggConfig | None = None,
        *,
        keep_payloads: RoundSelection = NO_PAYLOADS,
        total_rounds: int | None = None,
        remote_clients: bool = False,
        registry: KeyRegistry | None = None,
        keep_masked: bool = False,
    ) -> None:
        self.config = SecAggConfig() if config is None else config
        self.remote_clients = bool(remote_clients)
        self.keep_masked = bool(keep_masked)
        if registry is not None and not (self.config.malicious and self.remote_clients):
            raise ValueError(
                "a key registry applies to server='malicious' with remote clients (simulated "
                "clients get theirs from the transport's set-up)"
            )
        self.registry = registry
        self._signers = SimulatedSigners()
        # (graph round, cohort digest) -> how many times its graph was redrawn (signed epoch
        # sessions that broke: SecAggRound.receive_keys).
        self._graph_draws: dict[tuple[int, bytes], int] = {}
        super().__init__(keep_payloads=keep_payloads, total_rounds=total_rounds)

    def open_round(
        self,
        round_id: int,
        clients: Sequence[int] | np.ndarray,
        *,
        shape: tuple[int, int],
        seeds: SeedTree,
    ) -> SecAggRound:
        """Start a round: check the parameters for its clients, then AdvertiseKeys and ShareKeys.

        Raises:
            ModulusOverflowError: if the clients' sum could wrap the modulus at the configured
                scale (an automatic scale is the largest that cannot, for these clients).
            InsecureParameterError: for a threshold or neighbourhood that voids the guarantee.
            AggregationError: for a round of a single client.
        """
        ids = np.unique(np.asarray(clients, dtype=np.int64))
        if len(ids) == 1:
            raise AggregationError(
                f"round {round_id} has 1 client and secure aggregation needs at least 2 in a "
                "round (a single masked update would be the aggregate): sample more clients per "
                "round (clients_per_round, --clients-per-round), or use the 'plaintext' transport"
            )
        if len(ids):
            self.config.fixed_point_for(len(ids))  # refuses a fixed scale that could wrap
            self.config.round_parameters(len(ids))
        round_view = self.view.open(round_id, ids)
        signers, registry = None, self.registry
        setup_before = self._signers.setup_seconds
        if self.config.malicious and not self.remote_clients:
            signers, registry = self._signers.set_up(ids.tolist(), seeds)
        return SecAggRound(
            round_id,
            ids,
            shape=shape,
            view=round_view,
            seeds=seeds,
            config=self.config,
            remote_clients=self.remote_clients,
            signers=signers,
            registry=registry,
            setup_seconds=self._signers.setup_seconds - setup_before,
            keep_masked=self.keep_masked,
            graph_draws=self._graph_draws,
        )

    @property
    def signers(self) -> SimulatedSigners:
        """The set-up of the simulated clients (long-term identities and the registry)."""
        return self._signers

    @property
    def capabilities(self) -> TransportCapabilities:
        """Masked full-block uploads; with ``remote_clients`` the clients submit elsewhere."""
        return TransportCapabilities(
            in_process_clients=not self.remote_clients,
            dense_wire=True,
            server_sees="masked updates",
            min_round_clients=2,
        )

    def _round_class(self) -> type[AggregationRound]:
        return SecAggRound

    def public_parameters(self) -> dict[str, object]:
        return {
            "transport": self.name,
            "protocol": "SecAgg+ (Bell et al. 2020) over Bonawitz et al. 2017, "
            + (
                f"malicious server ({self.config.auth}, ConsistencyCheck)"
                if self.config.malicious
                else "honest-but-curious"
            ),
            **self.config.public(),
            "view_keeps_masked": self.keep_masked,
        }
