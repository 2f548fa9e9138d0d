"""Differential privacy as a wrapper around any transport: clip, add Gaussian noise, account.

``DPTransport(inner, clip=C, noise_multiplier=sigma, placement=..., ledger=...)`` is a
:class:`~securefed.transport.base.Transport` whose rounds wrap ``inner``'s rounds (the pattern of
Flower's DP strategy wrappers, with the accounting of Opacus). Stages of a round:

1. **Clip** (client side): each client's whole update ``x`` (all its rows together) becomes
   ``x * min(1, C / ||x||_2)`` (McMahan et al., "Learning Differentially Private Recurrent
   Language Models", ICLR 2018). Per-client norms of a :class:`RowUpdates` batch are computed
   vectorised over its CSR segments. Weights must be at most 1 (larger ones are refused), so that
   a client's weighted contribution ``w * x`` has norm at most ``C``: the sensitivity of the sum
   under adding or removing one client.
2. **Noise**, by placement:

   * ``"central"``: the server adds ``N(0, (sigma C)^2)`` to every coordinate of the aggregate
     after the inner round's result. The inner transport, and so the server's view, sees the
     clipped but *un-noised* updates and sum: central DP protects the released model against
     everyone downstream of the server, not against the server itself.
   * ``"local"``: every client adds ``N(0, (sigma C)^2)`` to every coordinate of its clipped
     update before it submits (a sparse batch is densified: ``dense=True``, since noise only on
     the rows a client touched would reveal which rows those are). The server sees noisy updates.
   * ``"distributed"``: every client adds ``N(0, (sigma C)^2 / n)``, ``n`` = clients asked in the
     round, so that the sum over all of them carries ``(sigma C)^2`` (specs/transport.md; Kairouz,
     Liu and Steinke, "The Distributed Discrete Gaussian Mechanism for Federated Learning with
     Secure Aggregation", ICML 2021, for the setting). Only meaningful under secure aggregation:
     over a plaintext inner transport each update carries ``sqrt(n)`` times too little noise for
     its own release, and a warning is raised (the audit reports an error).
3. **Account**: the ledger is charged once per round, where the noise is added and before
   anything noisy is released, against each observer (:mod:`securefed.privacy.ledger`): the
   released model's observers at the sampling rate ``q``, the server at rate 1 (it picks the
   round's clients and sees who contributed) with the multiplier of what it sees
   (:meth:`DPTransport.server_exposure`):

   * central: at :meth:`DPRound.result`, ``(sigma, q)``, before the noisy aggregate leaves; a
     budget overrun raises and nothing is released. Against the server: nothing (it computes
     the clipped sum in the clear), so its epsilon is infinite.
   * distributed: at the inner round's decoding (:meth:`DPRound.result`, or the inner round's own
     ``result``, which is sealed behind the charge), with the *effective* multiplier
     ``sigma_eff = sigma * sqrt(sum_k w_k^2 / m)`` over the contributors ``k`` actually in the
     sum, ``m`` the count each share is calibrated for (``min_contributors``, else the clients
     asked): with dropouts (or weights < 1) the sum carries less noise than planned and the
     ledger is charged for what it carries, never for what was planned. Against the server
     ``(sigma_honest, 1)``: the noise of the honest contributors only, since each of the
     ``colluders`` clients assumed to collude with it (``DPTransport(colluders=...)``, default
     0) subtracts its own share (``sigma_honest = sigma * sqrt((sum_k w_k^2 - the c largest
     w_k^2) / m)``; ``sigma_eff`` with none; no guarantee when none is honest). Over
     malicious-server secure aggregation the clients hold ``m`` themselves (Kairouz et al. 2021
     fix a minimum of contributors in advance; issue 30 item 1): each endorses and unmasks only a
     survivor set that ``m`` clients endorsed, and the server is charged for the least noisy sum
     they allow, ``sigma * sqrt(sum of the m - c smallest w_k^2 / m)``. Over a plaintext inner
     transport, where it reads each update, ``(sigma / sqrt(n), 1)``.
   * local: at :meth:`DPTransport.open_round`, ``(sigma, 1.0)`` against both. Each client's own
     release is a Gaussian mechanism with multiplier ``sigma`` under add/remove-one adjacency
     (its update vs no update), and the server knows who submitted, so no amplification by
     sampling is claimed: the ledger tracks the worst-case client (one in every round).

   In central and distributed placement :meth:`DPTransport.open_round` also checks, without
   recording, that a round fits the budget, so a spent budget stops a run before the round does
   anything. A transport built without a ledger builds its own: no release goes unrecorded.

The accounting assumes Poisson sampling of clients at ``sample_rate`` (see
:mod:`securefed.privacy.ledger`). The runtime tells the ledger its sampling mode and rate
(``run_rounds``), and the ledger refuses a charge at ``sample_rate < 1`` when everyone takes part
every round, or below the runtime's rate; ``"fixed"`` with ``sample_rate < 1`` warns (fixed-size
sampling spends more than the Poisson figure), and the audit reports it.

What is *not* protected: ``Aggregate.weight`` (the sum of weights) and ``Aggregate.contributors``
are released exactly, as by the inner transport. With data-dependent weights use a fixed
denominator (e.g. the expected weight) rather than ``Aggregate.mean()``.

The wrapper shares the inner transport's :class:`~securefed.views.ServerView` (``self.view is
inner.view``); it renames the view's transport to ``"<inner>+dp"`` and adds its public
parameters (``dp_clip``, ``dp_noise_multiplier``, ``dp_placement``, ``sample_rate``,
``accountant``, ``accountant_sampling``, ``sampling``, ``epsilon`` (against the released
model), ``epsilon_server``, ``delta``, ``epsilon_budget``, ``epsilon_budget_against``,
``seeded``, ``secure``, ``privacy_ledger``) to ``view.public``, and per round ``dp_clip``,
``dp_sigma``, ``dp_placement``, ``dp_sample_rate``, ``dp_noise``, ``dp_sigma_effective`` and
``epsilon``/``epsilon_server``/``delta`` so far to the round's ``public`` dict.

Randomness: seeded noise comes from ``seeds.generator("dp", round_id, client)`` (local,
distributed) and ``seeds.generator("dp", round_id, "server")`` (central); when the seed tree is
in secure mode, or ``secure=True``, from :class:`~securefed.privacy.noise.SecureGaussian`
(``secure=True`` with a seeded tree is refused).
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from securefed.errors import AggregationError, InsecureParameterError
from securefed.privacy.discrete import DiscreteRelease, SecureIntegers
from securefed.privacy.ledger import SAMPLING_MODES, PrivacyLedger, _check_sampling
from securefed.privacy.noise import (
    NoiseSource,
    SecureGaussian,
    clip_factors,
    noise_source,
    segment_norms,
)
from securefed.randomness import SeedTree
from securefed.transport.base import Aggregate, AggregationRound, RowUpdates, Transport
from securefed.transport.capabilities import HIDING, TransportCapabilities
from securefed.transport.ddp import (
    INTEGER_MECHANISMS,
    MECHANISMS,
    DistributedIntegerMechanism,
    noise_for_integer_target,
    plan_mechanism,
    rotation_signs,
)

PLACEMENTS = ("central", "local", "distributed")
# Densified local/distributed batches are noised and submitted in chunks of about this many
# numbers, so that thousands of dense client blocks never sit in memory at once.
_DENSE_CHUNK = 1 << 23
# Integer mechanisms encode about this many coordinates (clients x padded length) per call.
_INTEGER_CHUNK = 1 << 22


def _shows_single_updates(transport: Transport) -> bool:
    """Whether the server reads each client's update of ``transport`` (its capabilities)."""
    return transport.capabilities.server_sees not in HIDING


@dataclass(frozen=True)
class DPConfig:
    """Parameters of :class:`DPTransport` (validated on construction).

    Attributes:
        clip: L2 bound ``C`` on each client's whole update (> 0).
        noise_multiplier: ``sigma``: noise std on the sum over ``C`` (> 0).
        placement: ``"central"``, ``"local"`` or ``"distributed"``.
        sample_rate: Poisson rate ``q`` charged per round (central, distributed), in (0, 1].
        sampling: runtime client sampling mode (``"all"``, ``"poisson"``, ``"fixed"`` or None).
        secure: require cryptographic noise (refuses a seeded tree).
        delta: delta at which epsilon is reported when the ledger has no budget.
        mechanism: the noise: ``"gaussian"`` (float noise, the default: inexact after secure
            aggregation's rounding and wrap, flagged by the audit under distributed placement),
            ``"discrete_gaussian"`` or ``"skellam"`` (integers, distributed placement only:
            :mod:`securefed.transport.ddp`).
        modulus_bits: the integer mechanisms' modulus ``2^modulus_bits`` (bits per coordinate),
            2..32.
        wrap_target: the integer mechanisms' bound on the chance that the sum wraps the
            modulus in a round (chooses the granularity).
        min_contributors: the count each client's distributed noise share is calibrated for
            (``sigma C / sqrt(min_contributors)``); a distributed release of fewer contributors
            is refused. ``None``: every client asked. Over malicious-server secure aggregation
            the clients hold it themselves (``SecAggRound.require_contributors``) and count the
            endorsers of the survivor set before they reveal; elsewhere only the server's
            round checks it, and with ``None`` a Gaussian round over such a transport releases
            a sum of fewer contributors, charged for the noise it carries.
        colluders: clients assumed to collude with the server (distributed placement only):
            an ``int`` count, or a ``float`` fraction in ``[0, 1)`` of the clients asked in a
            round (rounded up). Each colluder knows its own noise share and subtracts it, so
            the epsilon against the server is charged for the honest contributors' noise only
            (:func:`colluders_in_round`, :func:`honest_weight_sq`). Default ``0``: the server
            alone.
    """

    clip: float
    noise_multiplier: float
    placement: str = "central"
    sample_rate: float = 1.0
    sampling: str | None = None
    secure: bool = False
    delta: float | None = None
    mechanism: str = "gaussian"
    modulus_bits: int = 20
    wrap_target: float = 1e-6
    min_contributors: int | None = None
    colluders: int | float = 0

    def __post_init__(self) -> None:
        check_colluders(self.colluders)
        if self.colluders and self.placement != "distributed":
            raise InsecureParameterError(
                f"colluders={self.colluders!r} applies to the distributed placement (colluding "
                f"clients subtract their own noise shares); under {self.placement!r} placement "
                "each release's noise does not depend on them: leave colluders=0"
            )
        if not (math.isfinite(self.clip) and self.clip > 0):
            raise ValueError(f"clip must be finite and > 0, got {self.clip!r}")
        if not (math.isfinite(self.noise_multiplier) and self.noise_multiplier > 0):
            raise ValueError(
                f"noise_multiplier must be finite and > 0, got {self.noise_multiplier!r}"
            )
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, got {self.placement!r}")
        if not (0 < self.sample_rate <= 1):
            raise ValueError(f"sample_rate must lie in (0, 1], got {self.sample_rate!r}")
        if self.sampling not in (None, *SAMPLING_MODES):
            raise ValueError(f"sampling must be one of {SAMPLING_MODES} or None")
        if self.delta is not None and not (0 < self.delta < 1):
            raise ValueError(f"delta must lie in (0, 1), got {self.delta!r}")
        if self.mechanism not in MECHANISMS:
            raise ValueError(f"mechanism must be one of {MECHANISMS}, got {self.mechanism!r}")
        if self.mechanism in INTEGER_MECHANISMS:
            if self.placement != "distributed":
                raise InsecureParameterError(
                    f"mechanism {self.mechanism!r} is the distributed placement's (each client "
                    f"adds integer noise under secure aggregation); placement "
                    f"{self.placement!r} takes mechanism='gaussian'"
                )
            if self.secure and self.mechanism == "skellam":
                raise InsecureParameterError(
                    "mechanism 'skellam' has no cryptographic sampler (numpy's Poisson draws "
                    "from a numpy Generator: seeded mode only); in secure mode use "
                    "mechanism='discrete_gaussian' (exact, from a CSPRNG)"
                )
        if isinstance(self.modulus_bits, bool) or not 2 <= int(self.modulus_bits) <= 32:
            raise ValueError(
                f"modulus_bits must be an integer in [2, 32], got {self.modulus_bits!r}"
            )
        if not 0 < self.wrap_target < 1:
            raise ValueError(f"wrap_target must lie in (0, 1), got {self.wrap_target!r}")
        if self.min_contributors is not None and (
            isinstance(self.min_contributors, bool) or self.min_contributors < 1
        ):
            raise ValueError(f"min_contributors must be >= 1 or None, got {self.min_contributors}")
        if self.sampling == "all" and self.sample_rate < 1 and self.placement != "local":
            raise InsecureParameterError(
                f"sampling 'all' puts every client in every round, but sample_rate "
                f"{self.sample_rate:g} < 1 would charge for Poisson subsampling that never "
                "happens: use sample_rate=1.0 or ClientSampling('poisson', ...)"
            )


def check_colluders(colluders: object) -> None:
    """Refuse a ``colluders`` value that is not an ``int >= 0`` or a ``float`` in ``[0, 1)``.

    Raises:
        TypeError: a bool, a string or any other type.
        ValueError: a negative count, or a fraction outside ``[0, 1)`` (a count is an int).
    """
    if isinstance(colluders, bool) or not isinstance(colluders, (numbers.Integral, float)):
        raise TypeError(
            f"colluders must be an int (a count) or a float in [0, 1) (a fraction of the "
            f"clients asked), got {type(colluders).__name__} {colluders!r}"
        )
    if isinstance(colluders, numbers.Integral) and colluders < 0:
        raise ValueError(f"colluders must be a count >= 0, got {colluders}")
    if isinstance(colluders, float) and not 0 <= colluders < 1:
        raise ValueError(
            f"colluders as a float is a fraction in [0, 1) of the clients asked, got "
            f"{colluders!r} (give a count as an int)"
        )


def colluders_in_round(colluders: int | float, n_asked: int, n_contributors: int) -> int:
    """How many of a round's contributors are assumed to collude with the server.

    A count is taken as is, a fraction of the ``n_asked`` clients rounded up; at most all
    ``n_contributors`` (the worst case: every colluder contributes, so the honest noise in the
    sum is the least the rule allows).
    """
    integral = isinstance(colluders, numbers.Integral)
    count = colluders if integral else math.ceil(colluders * n_asked)
    return min(int(count), int(n_contributors))


def honest_weight_sq(weight_sq: Sequence[float], colluders: int) -> float:
    """``sum w_k^2`` over the contributors once the ``colluders`` heaviest are removed.

    A client's noise share is proportional to its weight (``w_k N(0, (sigma C)^2 / n)``); the
    colluders whose shares the server can subtract are, at worst, those of the largest weights.
    """
    ordered = sorted(float(w) for w in weight_sq)
    return float(sum(ordered[: max(0, len(ordered) - int(colluders))]))


def clip_row_updates(updates: RowUpdates, clip: float) -> tuple[RowUpdates, np.ndarray]:
    """Clip each client's whole update in a batch to L2 norm ``clip``.

    Returns:
        The clipped batch (same rows, weights and wire format) and the per-client norms
        before clipping.
    """
    norms = segment_norms(updates.values, updates.indptr)
    factors = clip_factors(norms, clip)
    values = updates.values * np.repeat(factors, np.diff(updates.indptr))[:, None]
    clipped = RowUpdates(
        updates.clients,
        updates.indptr,
        updates.rows,
        values,
        updates.n_rows,
        updates.dense,
        updates.weights,
    )
    return clipped, norms


def check_client_weights(updates: RowUpdates) -> np.ndarray:
    """The batch's client weights, refused above 1 (the sum's sensitivity would exceed the clip).

    Raises:
        InsecureParameterError: naming the first client whose weight exceeds 1.
    """
    weights = updates.client_weights()
    if np.any(weights > 1):
        worst = int(np.argmax(weights))
        raise InsecureParameterError(
            f"client {int(updates.clients[worst])} has weight {weights[worst]:g} > 1: under "
            "DP each weight must be at most 1 so that a client moves the sum by at most the "
            "clip norm; rescale the weights (e.g. divide by their maximum)"
        )
    return weights


def client_noise_std(
    placement: str, clip: float, noise_multiplier: float, n_round_clients: int
) -> float:
    """Per-client noise std: ``sigma C`` (local) or ``sigma C / sqrt(n)`` (distributed).

    ``n_round_clients`` is the number of clients asked in the round.

    Raises:
        ValueError: central placement (no client-side noise) or an unknown one.
    """
    if placement not in PLACEMENTS or placement == "central":
        raise ValueError(f"client-side noise needs placement local or distributed, got {placement}")
    scale = noise_multiplier * clip
    if placement == "distributed":
        if n_round_clients < 1:
            raise ValueError(f"a distributed round needs clients, got {n_round_clients}")
        return scale / math.sqrt(n_round_clients)
    return scale


def noise_dense_blocks(
    dense: RowUpdates, std: float, source: Callable[[int], NoiseSource]
) -> RowUpdates:
    """``dense`` with ``N(0, std^2)`` added to every coordinate of every client's block.

    Client ``c``'s block draws from ``source(c)`` (its own seeded stream, or the one secure
    source), so the same seed gives the same noise wherever the block is noised.
    """
    values = dense.values.copy()
    n_rows = dense.n_rows
    for k, client in enumerate(dense.clients.tolist()):
        block = slice(k * n_rows, (k + 1) * n_rows)
        values[block] += source(int(client)).normal(std, (n_rows, dense.width))
    return RowUpdates(dense.clients, dense.indptr, dense.rows, values, n_rows, True, dense.weights)


def densify(updates: RowUpdates) -> RowUpdates:
    """The same batch with every client sending its full ``(n_rows, width)`` block."""
    k, n_rows = len(updates.clients), updates.n_rows
    counts = np.diff(updates.indptr)
    values = np.zeros((k * n_rows, updates.width))
    owner = np.repeat(np.arange(k), counts)
    values[owner * n_rows + updates.rows] = updates.values
    return RowUpdates(
        updates.clients,
        np.arange(k + 1) * n_rows,
        np.tile(np.arange(n_rows), k),
        values,
        n_rows,
        True,
        updates.weights,
    )


class DPRound(AggregationRound):
    """One round of :class:`DPTransport`: clips and noises, then delegates to the inner round."""

    def __init__(self, transport: DPTransport, inner: AggregationRound) -> None:
        super().__init__(
            inner.round_id, inner.clients, shape=inner.shape, view=inner.view, seeds=inner.seeds
        )
        self.transport = transport
        self.config = transport.config
        self.inner = inner
        self._weight_sq: dict[int, float] = {}
        self._secure_source: NoiseSource | None = None
        self._secure_integers: SecureIntegers | None = None
        self._charged = False
        self.mechanism: DistributedIntegerMechanism | None = transport._pending_mechanism
        self._signs: np.ndarray | None = transport._pending_signs
        # The count each client's distributed noise share is calibrated for, and whether the
        # clients themselves refuse to unmask a sum of fewer (malicious-server secagg).
        self.min_contributors, self.clients_enforce = transport._pending_minimum
        self._block = inner.shape if self.mechanism is None else transport._pending_shape
        if self.mechanism is not None:
            self.shape = self._block  # the callers' block; the inner round carries (1, D)
        if self.config.placement == "distributed":
            # Under distributed placement the inner round's decoding *is* the release of the
            # noisy sum. Its ``result`` is sealed on this instance, so that whoever holds the
            # inner round (this round, the Flower server, any caller) is charged first, and a
            # round refused for its budget can never be decoded.
            self._decode = inner.result
            inner.result = self._release_distributed

    # -- noise ------------------------------------------------------------------------
    def _source(self, *who: int | str) -> NoiseSource:
        secure = self.config.secure or self.seeds.secure
        if secure:
            if self._secure_source is None:
                self._secure_source = noise_source(self.seeds, secure=True)
            return self._secure_source
        return noise_source(self.seeds, "dp", self.round_id, *who)

    # -- template hooks ---------------------------------------------------------------
    def _accept(self, updates: RowUpdates) -> None:
        weights = check_client_weights(updates)
        clipped, _ = clip_row_updates(updates, self.config.clip)
        if self.mechanism is not None:
            self._accept_integers(clipped, weights)
            return
        if self.config.placement == "central":
            self.inner.submit_batch(clipped)
            return
        for client, weight in zip(clipped.clients.tolist(), weights.tolist(), strict=True):
            self._weight_sq[int(client)] = weight * weight
        cfg = self.config
        shares = self.min_contributors if cfg.placement == "distributed" else len(self.clients)
        std = client_noise_std(cfg.placement, cfg.clip, cfg.noise_multiplier, shares)
        per_client = max(1, clipped.n_rows * clipped.width)
        step = max(1, _DENSE_CHUNK // per_client)
        for start in range(0, len(clipped.clients), step):
            part = _slice_clients(clipped, start, min(len(clipped.clients), start + step))
            self.inner.submit_batch(noise_dense_blocks(densify(part), std, self._source))

    def _accept_integers(self, clipped: RowUpdates, weights: np.ndarray) -> None:
        """Encode each client's clipped block into noisy integers; submit them to the inner round.

        Raises:
            InsecureParameterError: a weight other than 1 (the integer mechanisms' sensitivity
                is one client's rounded vector; weights are not encoded).
        """
        if clipped.weights is not None and np.any(weights != 1):
            raise InsecureParameterError(
                f"mechanism {self.mechanism.mechanism!r} takes unweighted updates (weight 1): "
                "scale the update instead of weighting it"
            )
        mechanism, signs = self.mechanism, self._signs
        clients = clipped.clients.tolist()
        # The exact samplers loop over shrinking sets of pending draws: one call for many
        # clients costs about 1 us a draw, one per small client tens of times more. Seeded, each
        # client draws from its own stream (("dp", round, "integers", client)), so that a
        # federation whose nodes encode their own users (securefed.flower) draws the same
        # integers; at a FedMF block (1792 values) one call per client costs as much as one for
        # 120 clients (68 vs 78 ms on the 2-core machine).
        secure = self.config.secure or self.seeds.secure
        step = max(1, _INTEGER_CHUNK // mechanism.padded) if secure else 1
        for start in range(0, len(clients), step):
            chunk = clients[start : start + step]
            flat = np.stack(
                [clipped.client_block(k).reshape(-1) for k in range(start, start + len(chunk))]
            )
            integers = mechanism.encode(flat, signs, self._integer_source(int(chunk[0])))
            for row, client in zip(integers, chunk, strict=True):
                self._weight_sq[int(client)] = 1.0
                self.inner.submit(int(client), row.astype(np.float64))

    def _integer_source(self, first_client: int) -> np.random.Generator | SecureIntegers:
        """The integer mechanism's randomness for a chunk of clients starting at ``first_client``.

        Secure mode (``secure=True`` or a secure seed tree): one :class:`SecureIntegers` per
        round (an AES-256-CTR keystream keyed from ``os.urandom``). Seeded: the chunk's stream
        ``seeds.generator("dp", round_id, "integers", first_client)`` (tests and benchmarks).

        Raises:
            InsecureParameterError: Skellam in secure mode (no cryptographic Poisson sampler).
        """
        if self.config.secure or self.seeds.secure:
            if self.mechanism.mechanism != "discrete_gaussian":
                raise InsecureParameterError(
                    f"mechanism {self.mechanism.mechanism!r} has no cryptographic sampler; in "
                    "secure mode use mechanism='discrete_gaussian'"
                )
            if self._secure_integers is None:
                self._secure_integers = SecureIntegers()
            return self._secure_integers
        return self.seeds.generator("dp", self.round_id, "integers", first_client)

    def _on_drop(self, client: int) -> None:
        self.inner.drop(client)

    def broadcast(
        self, name: str, value: np.ndarray, *, bytes_per_client: int | None = None
    ) -> None:
        """Broadcast through the inner round (which may encode it its own way)."""
        self.inner.broadcast(name, value, bytes_per_client=bytes_per_client)

    def _release_distributed(self) -> Aggregate:
        """Charge the ledger for the noise the sum carries, then let the inner round decode it.

        Charged before the inner round decodes the sum: under secure aggregation that decoding
        is the release. The contributors are the clients that submitted (a client that drops
        after submitting stays in the sum: AggregationRound.drop). A refused charge raises every
        time it is asked again, so the sum is never decoded.
        """
        self.charge_release()
        return self._decode()

    def charge_release(self) -> None:
        """Charge the ledger for the distributed release now (once; a refused charge raises
        every time it is asked again).

        ``result`` does it before the inner round decodes; a caller whose inner round is
        decrypted elsewhere (``securefed.flower``: a key-holder node decrypts the CKKS sum)
        calls it before it sends the decryption request, so that a round refused for its
        budget is never decrypted.

        Raises:
            AggregationError: fewer contributors than the minimum.
            PrivacyBudgetExceeded: the charge would overrun the budget.
        """
        if not self._charged and self.mechanism is not None:
            self._charge_integers()
        if not self._charged:
            contributors = sorted(self.submitted)
            self._check_minimum(len(contributors))
            sigma_eff = self._effective_sigma(contributors)
            colluders = self.transport.colluders_in(len(self.clients), len(contributors))
            honest = self._effective_sigma(contributors, colluders=colluders)
            if self.clients_enforce:
                # The server can unmask any set of at least the minimum that endorsed it.
                honest = min(honest, self._weakest_sigma(contributors, colluders))
            self.view.public["dp_sigma_effective"] = sigma_eff
            self.view.public["dp_colluders_assumed"] = colluders
            self.view.public["dp_sigma_server"] = honest
            if sigma_eff > 0:
                server = self.transport.server_exposure(
                    sigma_eff, len(self.clients), honest_sigma=honest
                )
                self.transport._charge(sigma_eff, self.config.sample_rate, self.view, server)
            self._charged = True

    def _check_minimum(self, n_contributors: int) -> None:
        """Refuse a gaussian distributed release of fewer contributors than its noise shares
        were calibrated for (a stated ``min_contributors``, or the clients' own check).

        Raises:
            AggregationError: nothing is decoded.
        """
        stated = self.config.min_contributors is not None or self.clients_enforce
        if stated and n_contributors < self.min_contributors:
            raise AggregationError(
                f"round {self.round_id}: {n_contributors} contributor(s), fewer than the minimum "
                f"of {self.min_contributors} that each client's noise share is calibrated for "
                "(each adds 1/minimum of the variance): refused, nothing is decoded"
            )

    def _weakest_sigma(self, contributors: list[int], colluders: int = 0) -> float:
        """The multiplier of the least noisy sum the clients allow: ``minimum`` endorsers, the
        ``colluders`` among them subtracting their shares, the rest the lightest contributors
        (``sigma`` when every weight is 1 and no one colludes)."""
        weights = sorted(self._weight_sq.get(int(c), 0.0) for c in contributors)
        minimum = self.min_contributors
        honest = weights[: max(0, minimum - int(colluders))]
        return self.config.noise_multiplier * math.sqrt(sum(honest) / minimum)

    def _charge_integers(self) -> None:
        """Refuse too few contributors; charge the integer mechanism's accountant for the sum.

        Raises:
            AggregationError: fewer contributors than the minimum (nothing is released).
            PrivacyBudgetExceeded: the charge would overrun the budget.
        """
        n = len(self.submitted)
        minimum = self.mechanism.min_contributors
        if n < minimum:
            raise AggregationError(
                f"round {self.round_id}: {n} contributor(s), fewer than the minimum of {minimum} "
                f"for a DP release of {self.mechanism.mechanism!r} noise (each contributor adds "
                "1/n of it): refused, nothing is decoded"
            )
        release = self.mechanism.release(n)
        # Where the clients check the minimum, the server can unmask any set of at least the
        # minimum that endorsed it: it is charged for the least noisy one.
        server = self.transport.server_release(
            self.mechanism, minimum if self.clients_enforce else n, n_asked=len(self.clients)
        )
        self.transport.ledger.charge_discrete(release, server=server)
        self.view.public["dp_contributors"] = n
        self.view.public["dp_colluders_assumed"] = self.transport.colluders_in(len(self.clients), n)
        self.view.public["ddp_wrap_bound"] = self.mechanism.wrap_bound(n)
        self.view.public["dp_sigma_effective"] = (
            self.mechanism.noise_std_units(n) * self.mechanism.gamma / self.config.clip
        )
        self.transport._report(self.view)
        self._charged = True

    def _finish(self) -> Aggregate:
        placement = self.config.placement
        sigma = self.config.noise_multiplier
        if self.mechanism is not None:
            inner = self.inner.result()  # the sealed release: charges first
            total = self.mechanism.decode(inner.total, self._signs).reshape(self._block)
            return Aggregate(total, float(len(inner.contributors)), inner.contributors)
        if placement == "local":
            return self.inner.result()
        if placement == "distributed":
            planned = sorted(self.submitted)
            inner = self.inner.result()  # the sealed release: charges first
            sigma_eff = self.view.public["dp_sigma_effective"]
            actual = sorted(int(c) for c in inner.contributors.tolist())
            if actual != planned and self._effective_sigma(actual) < sigma_eff:
                warnings.warn(
                    f"round {self.round_id}: the inner transport summed {len(actual)} clients, "
                    f"not the {len(planned)} that submitted; the sum carries less noise than the "
                    "ledger was charged for",
                    stacklevel=3,
                )
            return inner
        inner = self.inner.result()
        self.view.public["dp_sigma_effective"] = sigma
        server = self.transport.server_exposure(  # central: None; a stand-in: its deployment's
            sigma, len(self.clients), honest_sigma=self.transport.honest_sigma(len(self.clients))
        )
        self.transport._charge(sigma, self.config.sample_rate, self.view, server)
        noise = self._source("server").normal(sigma * self.config.clip, inner.total.shape)
        return Aggregate(inner.total + noise, inner.weight, inner.contributors)

    def _effective_sigma(self, contributors: list[int], *, colluders: int = 0) -> float:
        """``sigma * sqrt(sum_k w_k^2 / m)``: the multiplier the distributed sum really carries
        (``m`` the count each share is calibrated for: the minimum, else the clients asked).

        With ``colluders``, the sum runs over the honest contributors only: the ``colluders``
        of largest weight are taken out (:func:`honest_weight_sq`), their shares being known to
        the server they collude with.
        """
        weights = [self._weight_sq.get(int(c), 0.0) for c in contributors]
        weight_sq = honest_weight_sq(weights, colluders)
        return self.config.noise_multiplier * math.sqrt(weight_sq / self.min_contributors)

    def result(self) -> Aggregate:
        """The aggregate with DP noise (central: the server's noise; else the clients').

        The view's ``aggregate["total"]`` is what the server computed (for central placement
        the un-noised sum, which the server sees); the released sum is also recorded as
        ``aggregate["dp_total"]``.

        Raises:
            PrivacyBudgetExceeded: the round's charge would overrun the budget; nothing is
                released (central: the server has computed the clean sum, which it sees anyway;
                distributed: the inner round is not asked to decode). A distributed round whose
                decoding then fails has still been charged (conservative).
            AggregationError: when the inner transport cannot produce the sum.
        """
        if self._result is None:
            self._result = self._finish()
            self.view.aggregate["dp_total"] = self._result.total
        return self._result


def _check_integer_inner(inner: Transport, mechanism: str) -> None:
    """Refuse an inner transport that cannot sum integers exactly for ``mechanism``.

    Secure aggregation must encode at scale 1 (its codec is then the identity on integers); its
    clients run in this process or on Flower nodes (``securefed.flower.dp.integers_on_client``,
    the same encoding and the same per-client streams); CKKS sums
    approximately. A plaintext inner transport sums float64 integers exactly (a stand-in, which
    warns as every distributed placement over it does).

    Raises:
        InsecureParameterError: naming what does not fit.
    """
    from securefed.transport.plaintext import PlaintextTransport
    from securefed.transport.secagg import SecAggTransport

    if isinstance(inner, SecAggTransport):
        if inner.config.scale != 1.0:
            raise InsecureParameterError(
                f"mechanism {mechanism!r} submits integers: the inner secure aggregation must "
                f"encode at scale 1 (SecAggConfig(scale=1.0, ...)), not {inner.config.scale!r}"
            )
        return  # remote (Flower) clients encode on their nodes: securefed.flower.dp
    if isinstance(inner, PlaintextTransport):
        return
    raise InsecureParameterError(
        f"mechanism {mechanism!r} needs an inner transport that sums integers exactly (secagg, or "
        f"plaintext as a stand-in), not {inner.name!r}"
    )


def _slice_clients(updates: RowUpdates, start: int, stop: int) -> RowUpdates:
    """Clients ``start:stop`` of a batch, as a batch."""
    lo, hi = updates.indptr[start], updates.indptr[stop]
    return RowUpdates(
        updates.clients[start:stop],
        updates.indptr[start : stop + 1] - lo,
        updates.rows[lo:hi],
        updates.values[lo:hi],
        updates.n_rows,
        updates.dense,
        None if updates.weights is None else updates.weights[start:stop],
    )


class DPTransport(Transport):
    """Clip, noise and account around any transport (see the module docstring for the stages).

    Args:
        inner: the transport that carries the (clipped, possibly noised) updates.
        clip: L2 bound on each client's whole update.
        noise_multiplier: ``sigma``; the sum carries noise of std ``sigma * clip``.
        placement: ``"central"`` (server adds noise), ``"local"`` (each client adds all of it)
            or ``"distributed"`` (each client adds a ``1/n`` share of the variance; needs secure
            aggregation).
        ledger: charged once per round. ``None`` builds a ledger of this transport's own (no
            budget, the RDP accountant): no release goes unrecorded, and ``transport.ledger``
            and :meth:`epsilon` report what the run spent.
        sample_rate: Poisson sampling rate charged per round in central/distributed placement.
        sampling: the runtime's sampling mode or ``ClientSampling`` (recorded, also in the
            ledger; ``"all"`` with ``sample_rate < 1`` is refused).
        secure: require cryptographic noise: a seeded ``SeedTree`` is refused at ``open_round``.
        delta: delta for reporting epsilon when the ledger has no budget.
        colluders: clients assumed to collude with the server under the distributed placement
            (an int count, or a float fraction in ``[0, 1)`` of each round's clients, rounded
            up; default ``0``): the epsilon against the server is charged for the honest
            contributors' noise only, and an integer mechanism calibrated to a target epsilon
            (``target_epsilon``) meets it against the server with that many colluders.

    Example:
        >>> from securefed import PlaintextTransport, SeedTree
        >>> ledger = PrivacyLedger(budget=(8.0, 1e-5))
        >>> dp = DPTransport(PlaintextTransport(), clip=1.0, noise_multiplier=1.0, ledger=ledger)
        >>> rnd = dp.open_round(0, [0, 1], shape=(1, 3), seeds=SeedTree(0))
        >>> rnd.submit(0, np.ones(3)); rnd.submit(1, np.zeros(3))
        >>> rnd.result().total.shape
        (1, 3)
        >>> ledger.steps
        1
    """

    def __init__(
        self,
        inner: Transport,
        *,
        clip: float,
        noise_multiplier: float,
        placement: str = "central",
        ledger: PrivacyLedger | None = None,
        sample_rate: float = 1.0,
        sampling: object = None,
        secure: bool = False,
        delta: float | None = None,
        mechanism: str = "gaussian",
        modulus_bits: int = 20,
        wrap_target: float = 1e-6,
        min_contributors: int | None = None,
        colluders: int | float = 0,
        target_epsilon: float | None = None,
        target_rounds: int | None = None,
    ) -> None:
        if not isinstance(inner, Transport):
            raise TypeError(f"inner must be a Transport, got {type(inner).__name__}")
        if isinstance(inner, DPTransport):
            raise ValueError("inner is already a DPTransport: wrap the base transport once")
        if ledger is None:
            ledger = PrivacyLedger()
        elif not isinstance(ledger, PrivacyLedger):
            raise TypeError(f"ledger must be a PrivacyLedger, got {type(ledger).__name__}")
        sampling = _check_sampling(sampling)
        if sampling is None:
            sampling = ledger.sampling
        self.config = DPConfig(
            clip=float(clip),
            noise_multiplier=float(noise_multiplier),
            placement=placement,
            sample_rate=float(sample_rate),
            sampling=sampling,
            secure=bool(secure),
            delta=delta,
            mechanism=mechanism,
            modulus_bits=int(modulus_bits),
            wrap_target=float(wrap_target),
            min_contributors=min_contributors,
            colluders=colluders,
        )
        self.inner = inner
        self._pending_mechanism: DistributedIntegerMechanism | None = None
        self._pending_signs: np.ndarray | None = None
        self._pending_shape: tuple[int, int] = (0, 0)
        self._pending_minimum: tuple[int, bool] = (0, False)
        self._target: tuple[float, int] | None = None
        if target_epsilon is not None or target_rounds is not None:
            if self.config.mechanism not in INTEGER_MECHANISMS:
                raise ValueError(
                    "target_epsilon/target_rounds calibrate an integer mechanism at its first "
                    "round; the gaussian mechanism takes a calibrated noise_multiplier"
                )
            if target_epsilon is None or target_rounds is None or target_rounds < 1:
                raise ValueError("give both target_epsilon and target_rounds >= 1")
            if ledger.budget is None and delta is None:
                raise ValueError("calibrating to a target epsilon needs a delta (or a budget)")
            self._target = (float(target_epsilon), int(target_rounds))
        if self.config.mechanism in INTEGER_MECHANISMS:
            _check_integer_inner(inner, self.config.mechanism)
        self.ledger: PrivacyLedger = ledger
        self.name = f"{inner.name}+dp"
        if self.config.sampling is not None:
            ledger.record_sampling(self.config.sampling)
        if self.config.placement != "local":
            ledger.check_sample_rate(self.config.sample_rate)  # refuse or warn now, not later
        self._charged_as: DPTransport | None = None
        if self.config.placement == "distributed" and _shows_single_updates(inner):
            warnings.warn(
                f"distributed DP over the {inner.name!r} transport: the server sees every update "
                "with only 1/sqrt(n) of the noise; use secure aggregation underneath, or "
                "placement='local'",
                stacklevel=2,
            )
        self.view = inner.view
        self.view.transport = self.name
        self.view.public.update(self.public_parameters())

    # -- accounting -------------------------------------------------------------------
    @property
    def delta(self) -> float | None:
        """Delta at which epsilon is reported (the budget's, else ``config.delta``)."""
        if self.ledger.budget is not None:
            return self.ledger.budget.delta
        return self.config.delta

    def epsilon(self, *, against: str = "released_model") -> float | None:
        """Epsilon spent so far against an observer (``"released_model"`` or ``"server"``).

        ``None`` when no delta is known (no budget and no ``delta``).
        """
        if self.delta is None:
            return None
        return self.ledger.epsilon(self.delta, against=against)

    def server_exposure(
        self, sigma: float, n_round_clients: int, *, honest_sigma: float | None = None
    ) -> tuple[float, float] | None:
        """``(noise multiplier, sample rate)`` of a round's release as the server sees it.

        The server picks the round's clients and knows who contributed, so the rate is always 1.
        Central: ``None`` (it sees the clipped sum in the clear). Local: ``(sigma, 1)``, each
        update carries all the noise. Distributed: under a transport that hides single updates,
        the multiplier of the honest contributors' noise, ``honest_sigma`` (the server and its
        colluders subtract the colluders' shares; ``None``: ``sigma``, no colluder), and
        ``None`` when no honest noise is left; over a clear one (plaintext) each update carries
        ``1/sqrt(n)`` of it, ``(sigma / sqrt(n), 1)``, whoever colludes.
        """
        if self._charged_as is not None:
            return self._charged_as.server_exposure(
                sigma, n_round_clients, honest_sigma=honest_sigma
            )
        placement = self.config.placement
        if placement == "central":
            return None
        if placement == "distributed" and _shows_single_updates(self.inner):
            return (sigma / math.sqrt(max(n_round_clients, 1)), 1.0)
        if placement == "distributed" and honest_sigma is not None:
            return (honest_sigma, 1.0) if honest_sigma > 0 else None
        return (sigma, 1.0)

    def honest_sigma(self, n_asked: int) -> float:
        """The multiplier of the honest clients' noise in a round where all ``n_asked``
        contribute with weight 1: ``sigma * sqrt((n - c) / n)``, ``c`` the colluders."""
        honest = n_asked - self.colluders_in(n_asked, n_asked)
        return self.config.noise_multiplier * math.sqrt(honest / max(n_asked, 1))

    def colluders_in(self, n_asked: int, n_contributors: int) -> int:
        """The contributors of a round assumed to collude with the server
        (:func:`colluders_in_round` of ``config.colluders``; a stand-in's are its deployment's)."""
        config = self.config if self._charged_as is None else self._charged_as.config
        return colluders_in_round(config.colluders, n_asked, n_contributors)

    def charge_server_as(self, deployed: DPTransport) -> None:
        """Charge the server's account as ``deployed`` would be charged, for a stand-in.

        A benchmark may run early rounds over a cheaper transport that releases the same noisy
        sums as the deployment it measures (central noise in the clear standing for distributed
        noise under secure aggregation: the same distribution). Its releases then cost the
        server what the deployment's would, not what the stand-in shows; only a stand-in whose
        view is discarded may say so.

        Raises:
            ValueError: a stand-in with another noise multiplier or ledger than ``deployed``.
        """
        if deployed.ledger is not self.ledger or (
            deployed.config.noise_multiplier != self.config.noise_multiplier
        ):
            raise ValueError(
                "a stand-in must release what the deployment releases: the same ledger and "
                "noise multiplier"
            )
        self._charged_as = deployed

    def privacy_ledgers(self) -> tuple[PrivacyLedger, ...]:
        """This transport's ledger, then any its inner transport charges."""
        return (self.ledger, *self.inner.privacy_ledgers())

    def _charge(
        self, sigma: float, sample_rate: float, round_view, server: tuple[float, float] | None
    ) -> None:
        self.ledger.charge(sigma, sample_rate, server=server)
        self._report(round_view)

    def _report(self, round_view) -> None:
        """Epsilon against each observer so far, into the round's and the run's public dicts."""
        for target in (round_view.public, self.view.public):
            target["epsilon"] = self.epsilon()
            target["epsilon_server"] = self.epsilon(against="server")
        self.view.public["privacy_ledger"] = self.ledger.state_dict()

    # -- Transport API ----------------------------------------------------------------
    def open_round(
        self,
        round_id: int,
        clients: Sequence[int] | np.ndarray,
        *,
        shape: tuple[int, int],
        seeds: SeedTree,
    ) -> DPRound:
        """Open the inner round and wrap it; charge (local) or pre-check (central, distributed).

        Raises:
            InsecureParameterError: ``secure=True`` but ``seeds`` is seeded.
            PrivacyBudgetExceeded: the round would overrun the budget (nothing is opened).
        """
        secure = self.config.secure or seeds.secure
        if self.config.secure and not seeds.secure:
            noise_source(seeds, secure=True)  # raises with the explanation
        sigma = self.config.noise_multiplier
        local = self.config.placement == "local"
        rate = 1.0 if local else self.config.sample_rate
        n_asked = len(np.unique(np.asarray(clients)))
        if self.config.mechanism in INTEGER_MECHANISMS:
            return self._open_integer_round(round_id, clients, n_asked, shape, seeds)
        server = self.server_exposure(sigma, n_asked, honest_sigma=self.honest_sigma(n_asked))
        if self.ledger.would_exceed(sigma, rate, server=server):
            self.ledger.charge(sigma, rate, server=server)  # raises with the figures
        minimum = n_asked if self.config.min_contributors is None else self.config.min_contributors
        if self.config.placement == "distributed" and n_asked < minimum:
            raise AggregationError(
                f"round {round_id} asks {n_asked} client(s), fewer than the minimum of "
                f"{minimum} contributors for a DP release"
            )
        inner_round = self.inner.open_round(round_id, clients, shape=shape, seeds=seeds)
        enforced = self.config.placement == "distributed" and self._hold_minimum(
            inner_round, minimum
        )
        if local:
            self.ledger.charge(sigma, 1.0, server=server)  # clients release at submit
        self.view.public["seeded"] = seeds.seed is not None
        self.view.public["secure"] = secure
        self.view.public["sampling"] = self.ledger.sampling  # as the runtime told the ledger
        round_public = inner_round.view.public
        round_public.update(
            {
                "dp_clip": self.config.clip,
                "dp_sigma": sigma,
                "dp_placement": self.config.placement,
                "dp_sample_rate": rate,
                "dp_noise": SecureGaussian.name if secure else "seeded-numpy",
                "epsilon": self.epsilon(),
                "epsilon_server": self.epsilon(against="server"),
                "delta": self.delta,
            }
        )
        if local:
            self._report(inner_round.view)
        self._pending_minimum = (minimum, enforced)
        try:
            return DPRound(self, inner_round)
        finally:
            self._pending_minimum = (0, False)

    @staticmethod
    def _hold_minimum(inner_round: AggregationRound, minimum: int) -> bool:
        """Hand the inner round's clients the minimum of contributors their noise shares are
        calibrated for, where they can check it themselves (malicious-server secure
        aggregation: ``SecAggRound.require_contributors``); whether they do."""
        require = getattr(inner_round, "require_contributors", None)
        return bool(require(minimum)) if require is not None else False

    def plan(self, n_clients: int, shape: tuple[int, int]) -> DistributedIntegerMechanism:
        """The integer mechanism of a round of ``n_clients`` asked, for ``shape`` blocks.

        Raises:
            ValueError: the transport's mechanism is ``"gaussian"``, or no granularity fits.
        """
        cfg = self.config
        if cfg.mechanism not in INTEGER_MECHANISMS:
            raise ValueError("the gaussian mechanism has no integer plan")
        minimum = n_clients if cfg.min_contributors is None else cfg.min_contributors
        return plan_mechanism(
            cfg.mechanism,
            bits=cfg.modulus_bits,
            clip=cfg.clip,
            noise_std=cfg.noise_multiplier * cfg.clip,
            n_clients=n_clients,
            dim=int(shape[0]) * int(shape[1]),
            min_contributors=minimum,
            wrap_target=cfg.wrap_target,
        )

    def _calibrate(self, n_asked: int, shape: tuple[int, int]) -> None:
        """Fix the noise multiplier at the first round: the smallest whose integer plan spends
        at most the target epsilon over the target rounds (its own accountant), with the
        round's clients and block (:func:`~securefed.transport.ddp.noise_for_integer_target`).
        """
        epsilon, rounds = self._target
        cfg = self.config
        minimum = n_asked if cfg.min_contributors is None else cfg.min_contributors
        colluders = self.colluders_in(n_asked, minimum)
        sigma = noise_for_integer_target(
            cfg.mechanism,
            epsilon,
            self.delta,
            rounds,
            bits=cfg.modulus_bits,
            clip=cfg.clip,
            n_clients=n_asked,
            dim=int(shape[0]) * int(shape[1]),
            min_contributors=minimum,
            wrap_target=cfg.wrap_target,
            colluders=colluders,
        )
        self.config = replace(cfg, noise_multiplier=sigma)
        self._target = None
        self.view.public.update(self.public_parameters())

    def server_release(
        self, mechanism: DistributedIntegerMechanism, n_contributors: int, *, n_asked: int
    ) -> DiscreteRelease | None:
        """The integer release as the server sees it: under a hiding transport the sum of the
        honest contributors' noise (the colluders', :meth:`colluders_in`, subtracted; ``None``,
        in the clear, when none is left), one client's noisy vector (its own noise only) where
        the server reads each update. A stand-in (:meth:`charge_server_as`) charges what the
        deployment's server sees."""
        if self._charged_as is not None:
            return self._charged_as.server_release(mechanism, n_contributors, n_asked=n_asked)
        if _shows_single_updates(self.inner):
            return mechanism.release(1)
        honest = n_contributors - self.colluders_in(n_asked, n_contributors)
        return mechanism.release(honest) if honest > 0 else None

    def _open_integer_round(
        self,
        round_id: int,
        clients: Sequence[int] | np.ndarray,
        n_asked: int,
        shape: tuple[int, int],
        seeds: SeedTree,
    ) -> DPRound:
        """Plan the round's integer mechanism, pre-check the budget, open the inner round.

        The inner round carries each client's ``(1, D)`` integer vector; the rotation's signs
        come from the round's public seed (``seeds.key("dp", "rotation", round_id)``).

        Raises:
            PrivacyBudgetExceeded: the round would overrun the budget with all clients asked.
            InsecureParameterError: the inner secure aggregation cannot hold a client's
                integers (its clip is below the mechanism's per-client bound).
            AggregationError: fewer clients asked than the minimum of contributors.
        """
        if self._target is not None:
            self._calibrate(n_asked, shape)
        mechanism = self.plan(n_asked, shape)
        if n_asked < mechanism.min_contributors:
            raise AggregationError(
                f"round {round_id} asks {n_asked} client(s), fewer than the minimum of "
                f"{mechanism.min_contributors} contributors for a DP release"
            )
        release = mechanism.release(n_asked)
        server = self.server_release(mechanism, n_asked, n_asked=n_asked)
        if self.ledger.would_exceed_discrete(release, server=server):
            self.ledger.charge_discrete(release, server=server)  # raises with the figures
        inner_clip = getattr(getattr(self.inner, "config", None), "clip", None)
        if inner_clip is not None and inner_clip < mechanism.client_bound():
            raise InsecureParameterError(
                f"the inner secure aggregation's clip {inner_clip:g} is below the integer "
                f"mechanism's per-client bound {mechanism.client_bound()} (rounding bound plus "
                "40 noise stds): a client's integers could be refused, which would depend on "
                "its noise; raise the clip (scale 1) or lower bits"
            )
        signs = rotation_signs(seeds.key("dp", "rotation", round_id), mechanism.padded)
        inner_round = self.inner.open_round(
            round_id, clients, shape=(1, mechanism.padded), seeds=seeds
        )
        secure = self.config.secure or seeds.secure
        if secure and mechanism.mechanism != "discrete_gaussian":
            raise InsecureParameterError(
                f"mechanism {mechanism.mechanism!r} has no cryptographic sampler; in secure "
                "mode use mechanism='discrete_gaussian'"
            )
        self.view.public["seeded"] = seeds.seed is not None
        self.view.public["secure"] = secure
        self.view.public["sampling"] = self.ledger.sampling
        if mechanism.mechanism == "skellam":
            noise = "skellam (numpy Poisson, seeded)"
        elif secure:
            noise = f"exact discrete_gaussian ({SecureIntegers.name} integers)"
        else:
            noise = "exact discrete_gaussian (seeded numpy integers)"
        inner_round.view.public.update(
            {
                "dp_clip": self.config.clip,
                "dp_sigma": self.config.noise_multiplier,
                "dp_placement": self.config.placement,
                "dp_sample_rate": 1.0,
                "dp_noise": noise,
                "epsilon": self.epsilon(),
                "epsilon_server": self.epsilon(against="server"),
                "delta": self.delta,
                **mechanism.public(),
            }
        )
        self._pending_mechanism, self._pending_signs = mechanism, signs
        self._pending_shape = (int(shape[0]), int(shape[1]))
        enforced = self._hold_minimum(inner_round, mechanism.min_contributors)
        self._pending_minimum = (mechanism.min_contributors, enforced)
        try:
            return DPRound(self, inner_round)
        finally:
            self._pending_mechanism, self._pending_signs = None, None
            self._pending_minimum = (0, False)

    def _round_class(self) -> type[AggregationRound]:
        return DPRound  # not used: open_round builds DPRound around the inner round

    @property
    def capabilities(self) -> TransportCapabilities:
        """The inner transport's, with the DP stage applied.

        What the server sees of an update is the inner transport's when that hides it (masked,
        encrypted); otherwise the update as the DP stage leaves it: clipped (central) or noisy
        (local, distributed). Client-side noise densifies every upload. No encrypted state: the
        noise is added around rounds whose result is released, which a folded round never is.
        """
        inner = self.inner.capabilities
        placement = self.config.placement
        sees = inner.server_sees
        if not inner.hides_updates:
            sees = "clipped updates" if placement == "central" else "noisy updates"
        return replace(
            inner,
            encrypted_state=False,
            dense_wire=inner.dense_wire or placement != "central",
            server_sees=sees,
            dp_placement=placement,
        )

    def public_parameters(self) -> dict[str, object]:
        """The inner transport's public parameters plus the DP ones (JSON-serialisable)."""
        params = dict(self.inner.public_parameters())
        params.update(
            {
                "transport": self.name,
                "inner_transport": self.inner.name,
                "dp_clip": self.config.clip,
                "dp_noise_multiplier": self.config.noise_multiplier,
                "dp_placement": self.config.placement,
                "placement": self.config.placement,
                "sample_rate": self.config.sample_rate,
                "sampling": self.config.sampling,
                "accountant": self.ledger.accountant
                if self.config.mechanism == "gaussian"
                else f"{self.config.mechanism} (Rényi bound, no sampling amplification)",
                "accountant_sampling": PrivacyLedger.accounting_sampling,
                "dp_mechanism": self.config.mechanism,
                "dp_modulus_bits": None
                if self.config.mechanism == "gaussian"
                else self.config.modulus_bits,
                "dp_min_contributors": self.config.min_contributors,
                "dp_colluders": self.config.colluders,
                "epsilon": self.epsilon(),
                "epsilon_server": self.epsilon(against="server"),
                "delta": self.delta,
                "epsilon_budget": None
                if self.ledger.budget is None
                else self.ledger.budget.epsilon,
                "epsilon_budget_against": None
                if self.ledger.budget is None
                else list(self.ledger.budget.against),
            }
        )
        return params

    # -- checkpoints ------------------------------------------------------------------
    def state_dict(self) -> dict[str, object]:
        """JSON-ready state to save with a checkpoint (the ledger's)."""
        return {"ledger": self.ledger.state_dict()}

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore :meth:`state_dict` into a fresh ledger (or one that holds the same history).

        :func:`securefed.runtime.run_rounds` does this itself on resume (through
        :meth:`privacy_ledgers`); this is for a caller that keeps its own state.

        Raises:
            ValueError: the state holds no ledger, or one this ledger cannot continue from
                (another accountant or budget, or a history this ledger does not hold:
                :meth:`PrivacyLedger.resume_conflicts`); nothing is changed.
        """
        saved = state.get("ledger")
        if saved is None:
            raise ValueError("the state holds no privacy ledger: its releases cannot be restored")
        causes = self.ledger.resume_conflicts(saved)
        if causes:
            raise ValueError("cannot restore the privacy ledger: " + "; ".join(causes))
        self.ledger.load_state_dict(saved)
        self.view.public["epsilon"] = self.epsilon()
        self.view.public["epsilon_server"] = self.epsilon(against="server")
        self.view.public["privacy_ledger"] = self.ledger.state_dict()
