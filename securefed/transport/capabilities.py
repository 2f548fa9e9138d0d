"""What a transport serves, and what an algorithm needs from one, as data.

A recommender never asks which transport it has (DESIGN.md, "Seams, names and observers"). Each
transport declares its :class:`TransportCapabilities`; an algorithm states the
:class:`TransportNeeds` of its configuration, each need naming the option that asks for it; and
:func:`require_capabilities` refuses the pairing when the run is built, with a message that names
that option::

    needs = TransportNeeds("FedMF", encrypted_state="server_state='encrypted'")
    require_capabilities(transport, needs)
    # UnsupportedTransport: FedMF cannot run over the 'secagg' transport: server_state='encrypted'
    # needs a transport with encrypted server state; 'secagg' has none

:func:`capability_findings` is the same check returning its findings instead of raising (the
validator pattern of Opacus: a list of findings, or an error in strict use).

The capabilities that describe privacy (:attr:`TransportCapabilities.server_sees`,
:attr:`TransportCapabilities.dense_wire`) are claims about the ServerView: the transport matrix
test checks every transport's claims against what its view recorded. The default declaration of
:class:`~securefed.transport.base.Transport` is the conservative one (the server sees every
update in the clear), so a transport that declares nothing is never credited with hiding anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from securefed.errors import UnsupportedTransport

if TYPE_CHECKING:
    from securefed.transport.base import Transport

SHAPES = ("aggregation", "fusion")
SERVER_SEES = ("updates", "clipped updates", "noisy updates", "masked updates", "ciphertexts")
"""What the server holds of each client's update, from most to least revealing."""
HIDING = ("masked updates", "ciphertexts")
"""The :data:`SERVER_SEES` values under which no single update reaches the server readable."""
DP_PLACEMENTS = ("central", "local", "distributed")


@dataclass(frozen=True)
class TransportCapabilities:
    """What a transport serves.

    Attributes:
        shapes: the round shapes it serves (``"aggregation"``: ``open_round`` / ``submit`` /
            ``result``; the fusion shape is :mod:`securefed.fusion`'s channels).
        in_process_clients: its rounds take the clients' updates in this process
            (``submit`` / ``submit_batch``) and produce the aggregate here. False for the server
            half of a federation whose clients (or key holders) run elsewhere, e.g.
            ``SecAggTransport(remote_clients=True)`` or CKKS built from the public context.
        encrypted_state: :meth:`~securefed.transport.base.Transport.encrypted_state` keeps a
            matrix encrypted at the server and the transport's rounds ``fold_into`` it
            (Chai et al. 2020's ``[[V]]``): the server never reads the matrix or an aggregate.
        dense_wire: every upload travels as the full block (a sparse ``RowUpdates`` is
            densified), so the server cannot tell which rows a client touched.
        server_sees: what the server holds of each client's update (one of
            :data:`SERVER_SEES`).
        dp_placement: where differential-privacy noise is added (``"central"``, ``"local"``,
            ``"distributed"``), ``None`` without DP.
        min_round_clients: the fewest clients a non-empty round may have (secure aggregation's
            masks cancel only between two or more clients: 2); :func:`round_size_findings`
            refuses a run whose data or sampling cannot give that many.
    """

    shapes: tuple[str, ...] = ("aggregation",)
    in_process_clients: bool = True
    encrypted_state: bool = False
    dense_wire: bool = False
    server_sees: str = "updates"
    dp_placement: str | None = None
    min_round_clients: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "shapes", tuple(self.shapes))
        unknown = [shape for shape in self.shapes if shape not in SHAPES]
        if not self.shapes or unknown:
            raise ValueError(f"shapes must be a non-empty subset of {SHAPES}, got {self.shapes}")
        if self.server_sees not in SERVER_SEES:
            raise ValueError(f"server_sees must be one of {SERVER_SEES}, got {self.server_sees!r}")
        if self.dp_placement not in (None, *DP_PLACEMENTS):
            raise ValueError(
                f"dp_placement must be one of {DP_PLACEMENTS} or None, got {self.dp_placement!r}"
            )
        for name in ("in_process_clients", "encrypted_state", "dense_wire"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if (
            isinstance(self.min_round_clients, bool)
            or not isinstance(self.min_round_clients, int)
            or self.min_round_clients < 1
        ):
            raise ValueError(
                f"min_round_clients must be an int >= 1, got {self.min_round_clients!r}"
            )

    @property
    def hides_updates(self) -> bool:
        """No single client's update reaches the server readable (masked or encrypted)."""
        return self.server_sees in HIDING


@dataclass(frozen=True)
class TransportNeeds:
    """What an algorithm's configuration needs from its transport.

    Each need is ``None`` (not needed) or the option that needs it, as the refusal names it.

    Attributes:
        algorithm: who needs it (named in the refusal).
        shape: the round shape the algorithm runs.
        in_process_clients: the clients compute and submit in this process (e.g.
            ``"run_rounds"``, whose algorithm steps every client itself).
        encrypted_state: a server state that stays encrypted (e.g.
            ``"server_state='encrypted'"``).
    """

    algorithm: str
    shape: str = "aggregation"
    in_process_clients: str | None = None
    encrypted_state: str | None = None

    def __post_init__(self) -> None:
        if not self.algorithm:
            raise ValueError("TransportNeeds needs the algorithm's name")
        if self.shape not in SHAPES:
            raise ValueError(f"shape must be one of {SHAPES}, got {self.shape!r}")
        for name in ("in_process_clients", "encrypted_state"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, str) and value):
                raise ValueError(f"{name} must be None or the option that needs it, got {value!r}")


def capability_findings(
    name: str, capabilities: TransportCapabilities, needs: TransportNeeds
) -> list[str]:
    """Every need of ``needs`` that a transport called ``name`` with ``capabilities`` cannot serve.

    Returns:
        One sentence per unmet need, naming the option that needs it; empty when all are met.
    """
    findings = []
    if needs.shape not in capabilities.shapes:
        findings.append(
            f"{needs.algorithm} runs {needs.shape} rounds; {name!r} serves "
            f"{' and '.join(capabilities.shapes)} rounds only"
        )
    if needs.encrypted_state and not capabilities.encrypted_state:
        findings.append(
            f"{needs.encrypted_state} needs a transport with encrypted server state; "
            f"{name!r} has none"
        )
    if needs.in_process_clients and not capabilities.in_process_clients:
        findings.append(
            f"{needs.in_process_clients} needs a transport whose clients submit in this "
            f"process; {name!r} is the server half of a federation whose clients (or key "
            "holders) run elsewhere"
        )
    return findings


def round_size_findings(
    name: str,
    capabilities: TransportCapabilities,
    n_clients: int,
    mode: str,
    clients_per_round: int | None,
) -> list[str]:
    """Why rounds of a run would have fewer clients than the transport needs, if they would.

    Args:
        name: the transport's name, for the findings.
        capabilities: what it serves (:attr:`TransportCapabilities.min_round_clients`).
        n_clients: the clients (users) the data has.
        mode: the client sampling (``"all"``, ``"poisson"`` or ``"fixed"``).
        clients_per_round: the exact (fixed) or expected (poisson) clients per round.

    Returns:
        One sentence per cause, naming the fix; empty when every round can be served. Poisson
        rounds are random: one expected to hold ``min_round_clients`` or more may still draw
        fewer, and is refused when it does (the round's own error).
    """
    needed = capabilities.min_round_clients
    if needed <= 1:
        return []
    if n_clients < needed:
        return [
            f"the {name!r} transport needs at least {needed} clients in a round and the data has "
            f"{n_clients} user{'s' if n_clients != 1 else ''} (each user is a client): use more "
            "users, or the 'plaintext' transport (--transport plaintext)"
        ]
    if mode != "all" and clients_per_round is not None and clients_per_round < needed:
        drawn = (
            f"rounds of {clients_per_round} client"
            if mode == "fixed"
            else f"rounds of {clients_per_round} client on average (often none)"
        )
        return [
            f"the {name!r} transport needs at least {needed} clients in a round and "
            f"{mode} sampling of clients_per_round={clients_per_round} (--clients-per-round) gives "
            f"{drawn}: sample at least {needed} clients per round"
        ]
    return []


def require_capabilities(transport: Transport, needs: TransportNeeds) -> None:
    """Refuse ``transport`` if it cannot serve ``needs`` (call it when the run is built).

    Raises:
        UnsupportedTransport: naming every unmet need and the option behind it.
    """
    findings = capability_findings(transport.name, transport.capabilities, needs)
    if findings:
        raise UnsupportedTransport(
            f"{needs.algorithm} cannot run over the {transport.name!r} transport: "
            + "; ".join(findings)
        )
