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
        threshold: Shamir threshold ``t``; ``None`` is the smallest ``t > k / 2`` that meets the
            colluder bound (``floor(k / 2) + 1`` with no colluders). Must satisfy
            ``k / 2 < t <= k`` and the colluder bound.
        colluders: how many of a round's clients may be corrupt (colluding with the server): a
            fraction in ``[0, 1)`` (``floor(colluders * n)`` of ``n``; the default 0.05) or a
            count (an int). ``k`` and ``t`` are sized so that the union bound over the honest
            clients on "some honest client has ``2t - k`` or more corrupt neighbours" (an
            honest client's ``k`` neighbours a uniformly random subset of the other ``n - 1``:
            a hypergeometric tail; Bell et al. 2020) is at most ``2^-security_bits``
            (:func:`corrupt_neighbour_bound`). Every client checks the ``k`` and ``t`` the server
            sends against the same bound, for the round's ``n``, and refuses them below it.
        security_bits: the colluder bound's ``sigma``: failure probability ``2^-sigma`` (40,
            Bell et al.'s).
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
            ``"signatures"`` (the default: Ed25519, Bonawitz et al. 2017's) or ``"macs"``
            (opt-in: HMAC-SHA256 under static pairwise keys agreed once from the registry's
            long-term X25519 keys; cheaper, but *not* resistant to key-compromise
            impersonation: whoever holds a client's long-term key can forge every other
            client's tags to it; :mod:`~securefed.transport.secagg.signatures`). Refused with
            ``server="honest_but_curious"`` unless left at its default (nothing is
            authenticated there).
        min_contributors: a client's own minimum of contributors (0: none): it reveals no
            unmasking share unless at least this many registered clients endorsed the survivor
            set it endorsed (Ed25519 signatures of ``(round, registry, minimum, U_3)``, checked
            by the client itself; ``auth="signatures"`` only, since a MAC convinces only its
            recipient). What a client that adds distributed-DP noise sets to the count its noise
            share is calibrated for (``securefed.transport.dp``), so that no sum the server
            unmasks carries less noise than planned.
        graph_epoch: how many rounds one neighbourhood graph is kept (1, the default: a fresh
            graph every round, Bell et al. 2020). With ``E > 1`` the rounds ``r`` with the same
            ``r // E`` and the same clients share the graph of the epoch's first round (its seed
            binds that round and the clients), so pair keys agreed in the epoch's first round
            serve the rest of it: with ``auth="macs"`` the static pairwise MAC keys; with
            ``auth="signatures"`` a signed epoch session
            (:class:`~securefed.transport.secagg.signatures.EpochSession`: each client signs
            once per session a fresh epoch X25519 key bound to the round, the epoch and its
            neighbourhood, and later rounds authenticate with MACs under the epoch pair keys;
            ``min_contributors`` is then refused, a MAC convincing only its recipient).
            ``server="malicious"`` only, refused otherwise.
            The masks and shares stay fresh every round (new ``c`` and ``s`` keys); what
            changes is that a neighbourhood is known for ``E`` rounds ahead, so an adversary
            that corrupts clients *after* seeing the graph can pick a target's neighbours for
            the rest of the epoch, and one unlucky draw (a client with too many corrupt
            neighbours) lasts ``E`` rounds instead of one (SECURITY.md, "Pair keys across
            rounds").
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
    colluders: float | int = 0.05
    security_bits: int = 40
    min_contributors: int = 0
    graph_epoch: int = 1

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
        check_colluders(self.colluders)
        if isinstance(self.security_bits, bool) or not isinstance(self.security_bits, int):
            raise ValueError(f"security_bits must be an int, got {self.security_bits!r}")
        if not 1 <= self.security_bits <= 128:
            raise ValueError(f"security_bits must lie in [1, 128], got {self.security_bits!r}")
        if isinstance(self.min_contributors, bool) or not isinstance(self.min_contributors, int):
            raise ValueError(f"min_contributors must be an int, got {self.min_contributors!r}")
        if self.min_contributors < 0:
            raise ValueError(f"min_contributors must be >= 0, got {self.min_contributors!r}")
        if self.min_contributors and not (self.malicious and self.auth == "signatures"):
            raise InsecureParameterError(
                f"min_contributors={self.min_contributors} needs server='malicious' with "
                "auth='signatures': a client checks the count itself from the contributors' "
                "signatures on the survivor set, and a MAC convinces only its recipient"
            )
        if isinstance(self.graph_epoch, bool) or not isinstance(self.graph_epoch, int):
            raise ValueError(f"graph_epoch must be an int, got {self.graph_epoch!r}")
        if self.graph_epoch < 1:
            raise ValueError(f"graph_epoch must be >= 1 (rounds per graph), got {self.graph_epoch}")
        if self.graph_epoch > 1 and not self.malicious:
            raise InsecureParameterError(
                f"graph_epoch={self.graph_epoch} keeps a neighbourhood graph for several rounds "
                "so that pair keys are reused: it applies only to server='malicious' (auth="
                "'macs': the static pairwise keys; auth='signatures': signed epoch sessions); "
                "an honest-but-curious round keeps no per-pair key, so it would only make "
                "neighbourhoods predictable"
            )
        if self.graph_epoch > 1 and self.min_contributors:
            raise InsecureParameterError(
                f"graph_epoch={self.graph_epoch} with min_contributors={self.min_contributors}: "
                "an epoch session endorses survivor sets with MACs under its epoch pair keys, "
                "and a MAC convinces only its recipient, so no client could count the "
                "contributors; use graph_epoch=1"
            )

    def graph_round(self, round_id: int) -> int:
        """The round whose graph ``round_id`` uses: the first of its epoch (itself when
        ``graph_epoch`` is 1)."""
        return int(round_id) - int(round_id) % self.graph_epoch

    @property
    def epoch_signed(self) -> bool:
        """Whether rounds run in signed epoch sessions: ``server="malicious"``,
        ``auth="signatures"`` and ``graph_epoch > 1`` (Ed25519 once per epoch session, MACs
        under its epoch pair keys in between:
        :class:`~securefed.transport.secagg.signatures.EpochSession`)."""
        return self.malicious and self.auth == "signatures" and self.graph_epoch > 1

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

    def corrupt_clients(self, n_clients: int) -> int:
        """How many of a round's ``n_clients`` may be corrupt (:attr:`colluders`)."""
        return corrupt_count(n_clients, self.colluders)

    def round_parameters(self, n_clients: int) -> tuple[int, int]:
        """``(k, t)`` for a round of ``n_clients >= 2``, validated (the server's choice).

        Automatic ``k`` (``neighbours=None``) starts at ``ceil(2 log2 n)`` (raised for
        ``expected_dropout``) and grows until the smallest ``t > k/2`` that meets the colluder
        bound also meets the dropout bound; an automatic ``t`` is that smallest one.

        Raises:
            InsecureParameterError: ``t <= k / 2`` (a minority of a neighbourhood could rebuild a
                mask), ``t > k`` (no secret could ever be rebuilt), ``k = 1`` with more than two
                clients (the graph is a perfect matching: each pair's sum would leak), or
                ``(k, t)`` outside the colluder bound (naming the parameter), or no ``k`` that
                meets it.
        """
        corrupt = self.corrupt_clients(n_clients)
        requested = self.neighbours
        if requested is None and self.expected_dropout > 0:
            requested = neighbours_for_dropout(
                n_clients, self.expected_dropout, self.failure_target, threshold=self.threshold
            )
        k = effective_neighbours(n_clients, requested)
        if self.neighbours is None and self.threshold is None:
            k = self._automatic_neighbours(n_clients, k, corrupt)
        t = self.threshold
        if t is None:
            t = threshold_for_colluders(n_clients, corrupt, k, self.security_bits)
            t = default_threshold(k) if t is None else t
        check_round_parameters(n_clients, k, t, corrupt, self.security_bits, self.colluders)
        return k, t

    def _automatic_neighbours(self, n_clients: int, start: int, corrupt: int) -> int:
        """The smallest ``k >= start`` whose colluder threshold also survives the dropouts."""
        for requested in range(start, n_clients):
            k = effective_neighbours(n_clients, requested)
            t = threshold_for_colluders(n_clients, corrupt, k, self.security_bits)
            if t is None:
                continue
            dropout_ok = self.expected_dropout == 0 or (
                unmasking_failure_bound(n_clients, k, t, self.expected_dropout)
                <= self.failure_target
            )
            if dropout_ok:
                return k
        return effective_neighbours(n_clients, n_clients - 1)

    def check_parameters(self, n_clients: int, k: int, t: int) -> None:
        """A client's check of the ``k`` and ``t`` a server sends for a round of ``n_clients``:
        this configuration's own floor (:func:`check_round_parameters`), and its threshold if it
        fixes one.

        Raises:
            InsecureParameterError: naming the parameter below the floor.
        """
        check_round_parameters(
            n_clients, k, t, self.corrupt_clients(n_clients), self.security_bits, self.colluders
        )

    def public(self) -> dict[str, object]:
        """JSON-ready public parameters."""
        return {
            "bits": self.bits,
            "scale": AUTOMATIC_SCALE if self.scale is None else self.scale,
            "clip": self.clip,
            "neighbours": (
                "ceil(2 log2 n), raised until the threshold meets the colluder bound"
                if self.neighbours is None
                else self.neighbours
            ),
            "threshold": (
                f"smallest t > k/2 with (n - c) P(Hypergeometric(n - 1, c, k) >= 2t - k) <= "
                f"2^-{self.security_bits}, c = {self._colluders_text()}; every client checks it"
                if self.threshold is None
                else self.threshold
            ),
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
            "graph_epoch": self.graph_epoch,
        }

    def _colluders_text(self) -> str:
        if isinstance(self.colluders, float):
            return f"floor({self.colluders:g} n) colluders"
        return f"{self.colluders} colluder(s)"

    def _authentication(self) -> str:
        if not self.malicious:
            return "none"
        if self.epoch_signed:
            return (
                f"Ed25519 (key registry from set-up) once per epoch session of {self.graph_epoch} "
                "rounds, on the round's keys, a fresh epoch X25519 key, the epoch and the "
                "neighbourhood; HMAC-SHA256 under the epoch pair keys in between"
            )
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
def check_colluders(colluders: object) -> None:
    """Refuse a colluder parameter that is neither a fraction in ``[0, 1)`` nor a count >= 0.

    Raises:
        ValueError: naming the value.
    """
    if isinstance(colluders, bool) or not isinstance(colluders, int | float):
        raise ValueError(f"colluders must be a fraction in [0, 1) or a count, got {colluders!r}")
    if isinstance(colluders, float) and not 0 <= colluders < 1:
        raise ValueError(
            f"colluders as a float is a fraction of the round's clients in [0, 1), got "
            f"{colluders!r} (give a count as an int)"
        )
    if isinstance(colluders, int) and colluders < 0:
        raise ValueError(f"colluders must be >= 0, got {colluders!r}")


def corrupt_count(n_clients: int, colluders: float | int) -> int:
    """Corrupt clients among ``n_clients``: ``floor(f n)`` for a fraction, else the count
    (at most ``n - 1``: one client is the honest one the bound protects)."""
    if isinstance(colluders, float):
        return min(math.floor(colluders * n_clients), max(n_clients - 1, 0))
    return min(int(colluders), max(n_clients - 1, 0))


def _log_choose(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def hypergeometric_tail(population: int, marked: int, draws: int, at_least: int) -> float:
    """``P(X >= at_least)`` for ``X ~ Hypergeometric(population, marked, draws)``.

    The number of corrupt clients among ``draws`` neighbours drawn without replacement from
    ``population`` clients of which ``marked`` are corrupt; summed term by term in log space.
    """
    low = max(at_least, 0, draws - (population - marked))
    high = min(draws, marked)
    if low > high:
        return 0.0
    total = _log_choose(population, draws)
    return min(
        1.0,
        sum(
            math.exp(_log_choose(marked, x) + _log_choose(population - marked, draws - x) - total)
            for x in range(low, high + 1)
        ),
    )


def corrupt_neighbour_bound(n_clients: int, corrupt: int, k: int, t: int) -> float:
    """Union bound on the chance that some honest client has ``2t - k`` or more corrupt
    neighbours: ``(n - c) P(X >= 2t - k)``, ``X ~ Hypergeometric(n - 1, c, k)``.

    With that many, a lying server gathers ``t`` shares of both of a client's secrets (each of
    two survivor sets then has ``t`` endorsers: Bonawitz et al. 2017's ``n_C < 2t - n`` on the
    complete graph, Bell et al. 2020's per-neighbourhood version). Assumes each honest client's
    ``k`` neighbours are a uniformly random subset of the others, independent of who is
    corrupt.
    """
    if corrupt <= 0:
        return 0.0
    need = 2 * t - k
    return min(1.0, (n_clients - corrupt) * hypergeometric_tail(n_clients - 1, corrupt, k, need))


def threshold_for_colluders(n_clients: int, corrupt: int, k: int, bits: int) -> int | None:
    """The smallest ``t`` in ``(k/2, k]`` whose corrupt-neighbour bound is at most ``2^-bits``
    (``None``: none is, at this ``k``)."""
    target = 2.0**-bits
    for t in range(default_threshold(k), k + 1):
        if corrupt_neighbour_bound(n_clients, corrupt, k, t) <= target:
            return t
    return None


def check_round_parameters(
    n_clients: int, k: int, t: int, corrupt: int, bits: int, colluders: float | int
) -> None:
    """Refuse ``k`` and ``t`` for a round of ``n_clients`` unless ``k/2 < t <= k``, the graph is
    connected (``k >= 2`` beyond two clients) and the corrupt-neighbour bound holds.

    Raises:
        InsecureParameterError: naming ``neighbours`` (no threshold at this ``k`` meets the
            bound, or ``k = 1``) or ``threshold``.
    """
    if k < 2 and n_clients > 2:
        raise InsecureParameterError(
            f"{k} neighbour(s) per client on {n_clients} clients gives a disconnected graph: "
            "the server would learn the sum of each pair; use neighbours >= 2"
        )
    check_threshold(t, k)
    bound = corrupt_neighbour_bound(n_clients, corrupt, k, t)
    if bound <= 2.0**-bits:
        return
    what = f"{corrupt} corrupt client(s) of {n_clients} (colluders={colluders!r})"
    if threshold_for_colluders(n_clients, corrupt, k, bits) is None:
        raise InsecureParameterError(
            f"neighbours k={k} is below the floor: with {what} no threshold keeps the chance "
            f"that some honest client has 2t - k corrupt neighbours below 2^-{bits}; more "
            "neighbours are needed"
        )
    raise InsecureParameterError(
        f"threshold t={t} is below the floor for k={k} neighbours: with {what} the chance "
        f"that some honest client has {2 * t - k} or more corrupt neighbours is {bound:.2g} "
        f"> 2^-{bits}; use t >= {threshold_for_colluders(n_clients, corrupt, k, bits)}"
    )


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
