"""Transports by name, for the command line and the benchmarks.

Each name maps to a factory; a transport whose implementation or optional dependency is missing
is reported as unavailable with the reason (benchmarks print that row instead of skipping it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from securefed import PlaintextTransport, RoundSelection, Transport


@dataclass(frozen=True)
class TransportOptions:
    """Options shared by the transport factories (each uses what applies to it)."""

    keep_payloads: RoundSelection = field(default_factory=RoundSelection)
    total_rounds: int | None = None
    n_clients: int | None = None
    dropout: float = 0.0
    epsilon: float | None = None
    delta: float = 1e-5
    noise_multiplier: float | None = None
    clip: float | None = None
    sample_rate: float = 1.0
    extra: dict = field(default_factory=dict)


class TransportUnavailable(RuntimeError):
    """The transport cannot be built here (not implemented yet, or an extra is missing)."""


def _plaintext(options: TransportOptions) -> Transport:
    return PlaintextTransport(
        keep_payloads=options.keep_payloads, total_rounds=options.total_rounds
    )


FACTORIES: dict[str, Callable[[TransportOptions], Transport]] = {"plaintext": _plaintext}


def register(name: str, factory: Callable[[TransportOptions], Transport]) -> None:
    """Make ``name`` available to :func:`make_transport`."""
    FACTORIES[name] = factory


def _load_optional_factories() -> None:
    """Import the factories of optional transports; each registers itself if importable."""
    import importlib

    for module, names in (
        ("securefed.bench.transports_secagg", ("secagg",)),
        ("securefed.bench.transports_ckks", ("ckks",)),
        ("securefed.bench.transports_dp", ("dp", "secagg+dp")),
    ):
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as error:
            if error.name != module:  # the module exists but an optional extra is missing
                for name in names:
                    UNAVAILABLE.setdefault(name, f"missing dependency {error.name!r}")


UNAVAILABLE: dict[str, str] = {}
KNOWN = ("plaintext", "secagg", "ckks", "dp", "secagg+dp")


def make_transport(name: str, options: TransportOptions) -> Transport:
    """Build the transport called ``name``.

    Raises:
        TransportUnavailable: naming why it cannot be built here.
        ValueError: for a name that no transport has.
    """
    _load_optional_factories()
    if name in FACTORIES:
        return FACTORIES[name](options)
    if name not in KNOWN:
        raise ValueError(f"unknown transport {name!r}; known: {', '.join(KNOWN)}")
    reason = UNAVAILABLE.get(name, "not implemented in this version of securefed")
    raise TransportUnavailable(f"transport {name!r} is unavailable: {reason}")
