"""Central DP with noise correlated across rounds: DP-FTRL tree aggregation, banded matrices.

``CorrelatedDPTransport(inner, clip=C, noise_multiplier=sigma, correlation=..., groups=b,
total_rounds=T)`` is :class:`~securefed.transport.dp.DPTransport` at the central placement with
the per-round noise of :mod:`securefed.privacy.correlated`: round ``t``'s released sum is the
clipped sum plus ``sigma C w_t``, where ``w`` is i.i.d. (``"independent"``, DP-FedAvg),
tree-aggregated (``"tree"``, DP-FTRL, one tree per pass over the groups) or the banded matrix
mechanism's ``C^-1 z`` (``"banded"``). An SGD server step on the released sums then carries the
strategy's prefix-sum noise.

Stages of a round:

1. **Schedule** (:meth:`CorrelatedDPTransport.open_round`): the clients asked must be members of
   the round's group (:class:`~securefed.privacy.correlated.CyclicParticipation`), the round
   must be the next one (the noise is a stream) and within ``total_rounds`` (the calibration's).
   Anything else is refused before the round opens: the sensitivity is computed for this
   schedule only.
2. **Clip** each client's whole update to ``C`` (weights at most 1), as ``DPTransport``.
3. **Account, then noise** (:meth:`CorrelatedDPRound._finish`): the ledger is charged the
   increment of ``Delta_t^2`` as one Gaussian step ``(sigma / sqrt(increment), 1.0)`` against
   the released model's observers (no amplification by sampling: the server picks the clients),
   and in the clear against the server (central DP: it computes the clipped sum itself). Only
   then does the noisy sum leave the round; a refused charge releases nothing and does not move
   the stream.

Not offered, and refused: the local and distributed placements (``secagg+dp``, ``ckks+dp``,
``dp-local``). Correlated noise ``w_t`` is a combination of draws of earlier rounds; under
distributed DP each round's clients add their own shares, and no client of round ``t`` holds the
earlier rounds' draws (a trusted noise party would be the server of central DP). Integer
mechanisms, colluders and a minimum of contributors belong to those placements and are refused
too. Checkpoint resume is refused: the stream's past draws are not saved (in secure mode they
cannot be recomputed).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from securefed.audit.findings import register_known_keys
from securefed.errors import InsecureParameterError, UnsupportedTransport
from securefed.privacy.correlated import (
    CyclicParticipation,
    NoiseCorrelation,
    SensitivityTracker,
    correlation_named,
    step_multiplier,
    total_sensitivity_sq,
)
from securefed.privacy.ledger import PrivacyLedger
from securefed.randomness import SeedTree
from securefed.transport.base import Aggregate, Transport
from securefed.transport.dp import DPRound, DPTransport

PUBLIC_KEYS = frozenset(
    {
        "dp_correlation",
        "dp_groups",
        "dp_total_rounds",
        "dp_bands",
        "dp_tree_restart",
        "dp_sensitivity_sq",
    }
)
"""The public parameters this transport adds to a view (known to :mod:`securefed.audit`)."""


def audit_keys() -> frozenset[str]:
    """:data:`PUBLIC_KEYS`, for the ``securefed.audit_keys`` entry point."""
    return PUBLIC_KEYS


register_known_keys("dp-correlated", PUBLIC_KEYS)


class CorrelatedDPRound(DPRound):
    """A central round of :class:`CorrelatedDPTransport`: charge the increment, add ``w_t``."""

    def _finish(self) -> Aggregate:
        transport: CorrelatedDPTransport = self.transport
        inner = self.inner.result()
        sigma = self.config.noise_multiplier
        increment = transport.tracker.increment(self.round_id)
        step = step_multiplier(sigma, increment)
        if step is not None:
            transport.ledger.charge(step, 1.0, server=None)  # raises: nothing is released
        transport.tracker.release(self.round_id)
        source = self._source("server")
        shape = inner.total.shape
        residual = transport.stream.residual(self.round_id, lambda: source.normal(1.0, shape))
        self.view.public["dp_sigma_effective"] = sigma
        self.view.public["dp_correlation"] = transport.correlation.name
        self.view.public["dp_sensitivity_sq"] = transport.tracker.squared
        transport._report(self.view)
        return Aggregate(
            inner.total + sigma * self.config.clip * residual, inner.weight, inner.contributors
        )


class CorrelatedDPTransport(DPTransport):
    """Central DP with correlated noise across rounds (module docstring).

    Args:
        inner: the transport that carries the clipped updates (the server sees them: central).
        clip: L2 bound on each client's whole update.
        noise_multiplier: ``sigma``: std of each i.i.d. draw ``z`` over the clip (the
            per-round noise is ``sigma C w_t``).
        correlation: a strategy of :mod:`securefed.privacy.correlated`, or its name
            (``"independent"``, ``"tree"``, ``"banded"``: :func:`correlation_named`).
        groups: the cyclic schedule's groups ``b`` (client ``c`` in rounds ``t % b == c % b``).
        total_rounds: the rounds the run may release (refused beyond).
        bands: the banded strategy's bands (default ``groups``).
        restart: the tree's rounds between restarts (default ``groups``).
        ledger, delta, secure: as :class:`DPTransport`.

    Raises:
        InsecureParameterError: a placement other than central, or an option that belongs to
            the distributed placement.
    """

    def __init__(
        self,
        inner: Transport,
        *,
        clip: float,
        noise_multiplier: float,
        correlation: str | NoiseCorrelation,
        groups: int,
        total_rounds: int,
        bands: int | None = None,
        restart: int | None = None,
        ledger: PrivacyLedger | None = None,
        delta: float | None = None,
        secure: bool = False,
    ) -> None:
        self.participation = CyclicParticipation(groups)
        if isinstance(correlation, str):
            correlation = correlation_named(
                correlation, groups=groups, bands=bands, restart=restart
            )
        elif bands is not None or restart is not None:
            raise ValueError("bands and restart are given by the strategy object itself")
        if isinstance(total_rounds, bool) or int(total_rounds) != total_rounds or total_rounds < 1:
            raise ValueError(f"total_rounds must be an integer >= 1, got {total_rounds!r}")
        self.correlation = correlation
        self.total_rounds = int(total_rounds)
        self.tracker = SensitivityTracker(correlation, self.participation)
        self.stream = correlation.stream()
        super().__init__(
            inner,
            clip=clip,
            noise_multiplier=noise_multiplier,
            placement="central",
            ledger=ledger,
            sample_rate=1.0,
            secure=secure,
            delta=delta,
        )
        self.name = f"{inner.name}+dp-{correlation.name}"
        self.view.transport = self.name
        self.view.public.update(self.public_parameters())

    @property
    def sensitivity_sq(self) -> float:
        """``Delta_T^2`` of the whole run over the clip (what the noise is calibrated for)."""
        return total_sensitivity_sq(self.correlation, self.participation, self.total_rounds)

    def open_round(
        self,
        round_id: int,
        clients: Sequence[int] | np.ndarray,
        *,
        shape: tuple[int, int],
        seeds: SeedTree,
    ) -> CorrelatedDPRound:
        """Check the schedule and the budget, then open the inner round (module docstring).

        Raises:
            InsecureParameterError: a client outside the round's group, ``secure`` with a
                seeded tree.
            ValueError: a round out of order or beyond ``total_rounds``.
            PrivacyBudgetExceeded: the round's charge would overrun the budget.
        """
        if self.config.secure and not seeds.secure:
            from securefed.privacy.noise import noise_source

            noise_source(seeds, secure=True)  # raises with the explanation
        if not 0 <= round_id < self.total_rounds:
            raise ValueError(
                f"round {round_id} lies outside the {self.total_rounds} rounds this correlated "
                "noise was calibrated for: its epsilon would exceed the target"
            )
        if round_id != self.stream_round:
            raise ValueError(
                f"correlated noise is drawn round after round: round {round_id} asked, round "
                f"{self.stream_round} is next (a warm start, a resume or a skipped round breaks "
                "the stream)"
            )
        clients = np.asarray(clients, dtype=np.int64)
        group = self.participation.round_group(round_id)
        outside = clients[self.participation.group_of(clients) != group]
        if outside.size:
            raise InsecureParameterError(
                f"round {round_id} asks client(s) {outside[:5].tolist()} outside its group "
                f"{group} of {self.participation.groups}: the sensitivity of correlated noise is "
                "computed for the cyclic schedule (ClientSampling('cyclic', groups=...)); a "
                "client outside it could take part more often than accounted"
            )
        step = step_multiplier(self.config.noise_multiplier, self.tracker.increment(round_id))
        if step is not None and self.ledger.would_exceed(step, 1.0, server=None):
            self.ledger.charge(step, 1.0, server=None)  # raises with the figures
        inner_round = self.inner.open_round(round_id, clients, shape=shape, seeds=seeds)
        secure = self.config.secure or seeds.secure
        self.view.public["seeded"] = seeds.seed is not None
        self.view.public["secure"] = secure
        self.view.public["sampling"] = self.ledger.sampling
        inner_round.view.public.update(
            {
                "dp_clip": self.config.clip,
                "dp_sigma": self.config.noise_multiplier,
                "dp_placement": "central",
                "dp_sample_rate": 1.0,
                "dp_noise": "secure" if secure else "seeded-numpy",
                "dp_correlation": self.correlation.name,
                "epsilon": self.epsilon(),
                "epsilon_server": self.epsilon(against="server"),
                "delta": self.delta,
            }
        )
        return CorrelatedDPRound(self, inner_round)

    @property
    def stream_round(self) -> int:
        """The next round the noise stream draws for."""
        return self.tracker.next_round

    def public_parameters(self) -> dict[str, object]:
        params = super().public_parameters()
        params.update(
            {
                "dp_correlation": self.correlation.name,
                "dp_groups": self.participation.groups,
                "dp_total_rounds": self.total_rounds,
                "dp_bands": getattr(self.correlation, "bands", None),
                "dp_tree_restart": getattr(self.correlation, "restart", None),
                "accountant": f"{self.ledger.accountant} (Gaussian matrix mechanism, "
                "cyclic participation, no sampling amplification)",
            }
        )
        return params

    def state_dict(self) -> dict[str, object]:
        """Refused: the noise stream's past draws are not saved.

        Raises:
            UnsupportedTransport: always (a resumed stream would draw uncorrelated noise).
        """
        raise UnsupportedTransport(
            f"the {self.name!r} transport cannot be checkpointed: its noise stream holds past "
            "draws that a resumed run could not restore; run without checkpoints"
        )


def noise_for_correlated_target(
    epsilon: float,
    delta: float,
    correlation: NoiseCorrelation,
    participation: CyclicParticipation,
    rounds: int,
    accountant: str = "rdp",
) -> float:
    """``sigma`` whose whole run spends at most ``epsilon``: the run is one Gaussian mechanism of
    multiplier ``sigma / Delta_T``, so ``sigma = Delta_T * noise_for_target(epsilon, delta, q=1,
    one round)`` (:func:`securefed.privacy.calibration.noise_for_target`)."""
    from securefed.privacy.calibration import noise_for_target

    delta_sq = total_sensitivity_sq(correlation, participation, rounds)
    return math.sqrt(delta_sq) * noise_for_target(epsilon, delta, 1.0, 1, accountant)


def refuse_correlated(placement: str, name: str) -> None:
    """Refuse correlated noise outside the central placement (module docstring).

    Raises:
        InsecureParameterError: naming the cause.
    """
    if placement != "central":
        raise InsecureParameterError(
            f"correlated noise over {name!r} ({placement} placement) is not offered: round t's "
            "noise combines draws of earlier rounds, which no client of round t holds under "
            "distributed or local DP; use the 'dp' transport (central noise) with correlation, "
            "or leave correlation unset"
        )
