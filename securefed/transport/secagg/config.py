"""Secure aggregation's public parameters: the ring, the codec, the graph degree, the threshold.

:class:`SecAggConfig` holds what every party of a round knows; the pure functions size the
neighbourhood graph (SecAgg+'s ``k = ceil(2 log2 n)``, Bell et al. 2020), the Shamir threshold
(``floor(k / 2) + 1``, Bonawitz et al. 2017) and bound the chance that a round cannot be unmasked
when clients drop out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from securefed.crypto import keys as kx
from securefed.crypto import prg as prg_mod
from securefed.crypto.fixed_point import FixedPoint, largest_safe_scale
from securefed.errors import InsecureParameterError
from securefed.transport.secagg.signatures import AUTH_MODES

AUTOMATIC_SCALE = "largest 2^e with n*ceil(clip*2^e) <= 2^(bits-1)-1"
"""How :meth:`SecAggConfig.public` records an automatic scale (each round records its value)."""


@dataclass(frozen=True)
class SecAggConfig:
    """Parameters of secure aggregation (all public).

    Attributes:
        bits: the ring Z_{2^bits}, 32 or 64; uploads cost ``bits / 8`` bytes per value.
        scale: fixed-point scale; resolution and per-client rounding error below ``1 / scale``.
            ``None`` (the default) is chosen per round: the largest power of two at which the
            round's ``n`` clients cannot wrap the ring,
            ``n * ceil(clip * scale) <= 2^(bits-1) - 1``
            (:func:`~securefed.crypto.fixed_point.largest_safe_scale`). A fixed scale is checked
            against each round's ``n`` instead (``ModulusOverflowError`` when it could wrap).
        clip: update values (after weighting) must lie in ``[-clip, clip]``; weights in
            ``[0, clip]``.
        out_of_range: what a client does with a value outside ``[-clip, clip]``: ``"refuse"``
            (the default: the round fails naming the client and the count, nothing is changed
            silently) or ``"clip"`` (clip it, and the round's view records how many values were
            clipped, ``secagg_values_clipped``).
        neighbours: SecAgg+ neighbourhood size ``k``; ``None`` is automatic: ``ceil(2 log2 n)``,
            raised when ``expected_dropout > 0`` to the smallest ``k`` that meets
            ``failure_target`` (:func:`neighbours_for_dropout`). Capped at ``n - 1`` (the
            complete graph: Bonawitz et al.); an odd ``k`` with an odd ``n`` is raised by one (a
            ``k``-regular graph needs ``n k`` even).
        threshold: Shamir threshold ``t``; ``None`` is ``floor(k / 2) + 1``. Must satisfy
            ``k / 2 < t <= k``.
        expected_dropout: fraction of a round's clients expected to drop (before or after
            submitting), used only by the automatic ``k``. Below 0.5: the threshold is a majority
            of each neighbourhood, so more than half of it must survive.
        failure_target: the automatic ``k`` keeps the union bound on the chance that a round
            cannot be unmasked (independent dropouts at ``expected_dropout``) below this.
        prg: mask PRG, ``"aes-256-ctr"`` or ``"chacha20"``.
        aead: share encryption, ``"aes-256-gcm"`` or ``"chacha20-poly1305"``.
        server: the threat model, ``"malicious"`` (the default: Bonawitz et al. 2017, Sec. 6:
            signed advertisements checked against a key registry from set-up, the
            ConsistencyCheck round, a client reveals nothing without ``t`` consistent
            signatures of its neighbours; :mod:`~securefed.transport.secagg.signatures`) or
            ``"honest_but_curious"`` (no signatures, no ConsistencyCheck: a server that relays
            its own keys in a neighbour's place and lies about who dropped decodes an update,
            tests/test_secagg_malicious.py).
        auth: how the malicious-server variant authenticates advertisements and survivor sets:
            ``"macs"`` (the default: HMAC-SHA256 under static pairwise keys agreed once from
            the registry's long-term X25519 keys) or ``"signatures"`` (Ed25519, Bonawitz et al.
            2017's); the same guarantee, argued in
            :mod:`~securefed.transport.secagg.signatures`. Refused with
            ``server="honest_but_curious"`` unless left at its default (nothing is
            authenticated there).
    """

    bits: int = 32
    scale: float | None = None
    clip: float = 1.0
    neighbours: int | None = None
    threshold: int | None = None
    prg: str = "aes-256-ctr"
    aead: str = "aes-256-gcm"
    expected_dropout: float = 0.0
    failure_target: float = 1e-3
    out_of_range: str = "refuse"
    server: str = "malicious"
    auth: str = "signatures"

    def __post_init__(self) -> None:
        self.fixed_point_for(2)  # validates bits, scale and clip: at least 2 clients must fit
        if self.out_of_range not in OUT_OF_RANGE:
            raise ValueError(
                f"out_of_range must be one of {OUT_OF_RANGE}, got {self.out_of_range!r}"
            )
        if self.server not in SERVER_MODELS:
            raise ValueError(f"server must be one of {SERVER_MODELS}, got {self.server!r}")
        if self.auth not in AUTH_MODES:
            raise ValueError(f"auth must be one of {AUTH_MODES}, got {self.auth!r}")
        if not self.malicious and self.auth != AUTH_MODES[0]:
            raise ValueError(
                f"auth={self.auth!r} applies only to server='malicious': an honest-but-curious "
                "round authenticates nothing"
            )
        if self.neighbours is not None and (
            isinstance(self.neighbours, bool) or self.neighbours < 1
        ):
            raise ValueError(f"neighbours must be >= 1 or None, got {self.neighbours!r}")
        if self.threshold is not None and (isinstance(self.threshold, bool) or self.threshold < 1):
            raise ValueError(f"threshold must be >= 1 or None, got {self.threshold!r}")
        if self.prg not in prg_mod.PRG_NAMES:
            raise ValueError(f"prg must be one of {prg_mod.PRG_NAMES}, got {self.prg!r}")
        if self.aead not in kx.AEAD_NAMES:
            raise ValueError(f"aead must be one of {kx.AEAD_NAMES}, got {self.aead!r}")
        if not 0 <= self.expected_dropout < 0.5:
            raise ValueError(
                f"expected_dropout must lie in [0, 0.5), got {self.expected_dropout!r}: the "
                "threshold is a majority of each neighbourhood, so most neighbours must survive"
            )
        if not 0 < self.failure_target < 1:
            raise ValueError(f"failure_target must lie in (0, 1), got {self.failure_target!r}")

    @property
    def malicious(self) -> bool:
        """Whether the round runs the malicious-server variant (signatures, ConsistencyCheck)."""
        return self.server == "malicious"

    @property
    def automatic_scale(self) -> bool:
        """Whether each round picks its own scale (``scale=None``)."""
        return self.scale is None

    @property
    def fixed_point(self) -> FixedPoint:
        """The codec of a fixed scale (an automatic one depends on the round: :meth:`for_round`).

        Raises:
            ValueError: the scale is automatic.
        """
        if self.scale is None:
            raise ValueError(
                "this SecAggConfig picks its scale per round (scale=None): use "
                "fixed_point_for(n_clients), or the round's config (config.for_round(n))"
            )
        return FixedPoint(self.bits, self.scale, self.clip)

    def fixed_point_for(self, n_clients: int) -> FixedPoint:
        """The codec of a round of ``n_clients``: the automatic scale, or the fixed one checked.

        Rounds of fewer than two clients are refused elsewhere; they get the codec of two.

        Raises:
            ModulusOverflowError: the sum of ``n_clients`` inputs could wrap at the fixed scale,
                or no scale fits that many clients.
        """
        n_clients = max(int(n_clients), 2)
        if self.scale is None:
            return FixedPoint(
                self.bits, largest_safe_scale(n_clients, self.clip, self.bits), self.clip
            )
        fixed_point = FixedPoint(self.bits, self.scale, self.clip)
        fixed_point.check_clients(n_clients)
        return fixed_point

    def for_round(self, n_clients: int) -> SecAggConfig:
        """This configuration with the scale of a round of ``n_clients`` fixed (what its parties
        use; validated like :meth:`fixed_point_for`)."""
        return replace(self, scale=self.fixed_point_for(n_clients).scale)

    def round_parameters(self, n_clients: int) -> tuple[int, int]:
        """``(k, t)`` for a round of ``n_clients >= 2``, validated.

        Raises:
            InsecureParameterError: ``t <= k / 2`` (a minority of a neighbourhood could rebuild a
                mask), ``t > k`` (no secret could ever be rebuilt), or ``k = 1`` with more than two
                clients (the graph is a perfect matching: each pair's sum would leak).
        """
        requested = self.neighbours
        if requested is None and self.expected_dropout > 0:
            requested = neighbours_for_dropout(
                n_clients, self.expected_dropout, self.failure_target, threshold=self.threshold
            )
        k = effective_neighbours(n_clients, requested)
        if k < 2 and n_clients > 2:
            raise InsecureParameterError(
                f"{k} neighbour(s) per client on {n_clients} clients gives a disconnected graph: "
                "the server would learn the sum of each pair; use neighbours >= 2"
            )
        t = default_threshold(k) if self.threshold is None else self.threshold
        check_threshold(t, k)
        return k, t

    def public(self) -> dict[str, object]:
        """JSON-ready public parameters."""
        return {
            "bits": self.bits,
            "scale": AUTOMATIC_SCALE if self.scale is None else self.scale,
            "clip": self.clip,
            "neighbours": "ceil(2 log2 n)" if self.neighbours is None else self.neighbours,
            "threshold": "floor(k/2)+1" if self.threshold is None else self.threshold,
            "expected_dropout": self.expected_dropout,
            "failure_target": self.failure_target,
            "out_of_range": self.out_of_range,
            "prg": self.prg,
            "aead": self.aead,
            "server": self.server,
            "auth": self.auth if self.malicious else "none",
            "signatures": self._authentication(),
            "key_agreement": "X25519",
            "kdf": "HKDF-SHA256",
            "shamir_field": "GF(2^256+297)",
        }

    def _authentication(self) -> str:
        if not self.malicious:
            return "none"
        if self.auth == "signatures":
            return "Ed25519, key registry from set-up"
        return (
            "HMAC-SHA256 under static pairwise keys (X25519 of the long-term keys in the "
            "registry from set-up, agreed once per pair)"
        )


SERVER_MODELS = ("malicious", "honest_but_curious")
"""The threat models of :attr:`SecAggConfig.server`."""

OUT_OF_RANGE = ("refuse", "clip")
"""What a client does with a value outside ``[-clip, clip]`` (:attr:`SecAggConfig.out_of_range`)."""


# ----------------------------------------------------------------------------- pure protocol math
def default_neighbours(n_clients: int) -> int:
    """SecAgg+'s ``k = ceil(2 log2 n)`` (Bell et al. 2020: O(log n) neighbours), capped at n - 1."""
    if n_clients < 2:
        return 0
    return min(n_clients - 1, math.ceil(2 * math.log2(n_clients)))


def effective_neighbours(n_clients: int, requested: int | None) -> int:
    """The degree of the round's regular graph: requested (or default), capped, made even if needed.

    A ``k``-regular graph on ``n`` vertices exists only when ``n k`` is even, so an odd ``k`` on an
    odd ``n`` becomes ``k + 1`` (still at most ``n - 1``).
    """
    k = default_neighbours(n_clients) if requested is None else min(requested, n_clients - 1)
    if k % 2 == 1 and n_clients % 2 == 1:
        k += 1
    return k


def default_threshold(k: int) -> int:
    """``floor(k / 2) + 1``: more than half of a neighbourhood."""
    return k // 2 + 1


def check_threshold(t: int, k: int) -> None:
    """Refuse a threshold outside ``(k / 2, k]``.

    Raises:
        InsecureParameterError: naming the bound that is violated.
    """
    if 2 * t <= k:
        raise InsecureParameterError(
            f"threshold {t} is at most half of the {k} neighbours: a minority of a client's "
            f"neighbourhood (or a server and {t} colluders) could rebuild its masks; "
            f"use t > {k / 2}"
        )
    if t > k:
        raise InsecureParameterError(
            f"threshold {t} exceeds the neighbourhood size {k}: no secret could ever be rebuilt"
        )


def binomial_cdf(m: int, k: int, p: float) -> float:
    """``P(Binomial(k, p) <= m)``, summed in log space (exact enough for k in the thousands)."""
    if m < 0:
        return 0.0
    if m >= k:
        return 1.0
    if p <= 0:
        return 1.0
    if p >= 1:
        return 0.0
    log_p, log_q = math.log(p), math.log1p(-p)
    log_choose = math.lgamma(k + 1)
    return min(
        1.0,
        sum(
            math.exp(
                log_choose
                - math.lgamma(i + 1)
                - math.lgamma(k - i + 1)
                + i * log_p
                + (k - i) * log_q
            )
            for i in range(m + 1)
        ),
    )


def unmasking_failure_bound(n_clients: int, k: int, t: int, dropout: float) -> float:
    """Union bound on the chance that some client's secret lacks ``t`` surviving neighbours.

    Each of the ``n`` secrets needs ``t`` of its owner's ``k`` neighbours to survive; with
    independent dropouts at rate ``dropout`` one fails with ``P(Binomial(k, 1 - dropout) < t)``
    (Bell et al. 2020 size SecAgg+'s graph by this kind of tail bound).
    """
    return min(1.0, n_clients * binomial_cdf(t - 1, k, 1.0 - dropout))


def neighbours_for_dropout(
    n_clients: int, dropout: float, target: float, *, threshold: int | None = None
) -> int:
    """The smallest ``k >= ceil(2 log2 n)`` whose unmasking failure bound is below ``target``.

    Returns ``n - 1`` (the complete graph, the most robust choice) when no smaller ``k`` does.
    """
    start = default_neighbours(n_clients)
    for requested in range(start, n_clients):
        k = effective_neighbours(n_clients, requested)
        t = default_threshold(k) if threshold is None else threshold
        if t <= k and unmasking_failure_bound(n_clients, k, t, dropout) <= target:
            return k
    return max(n_clients - 1, 0)
