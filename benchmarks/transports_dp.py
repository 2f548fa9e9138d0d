"""``dp`` and ``secagg+dp``: client-level differential privacy around a transport.

``dp`` adds the noise at the server (central placement) over plaintext; ``secagg+dp`` has every
client add its share ``sigma * C / sqrt(n)`` under secure aggregation (distributed placement), so
the server never sees a single update, noisy or not. ``--epsilon`` calibrates the noise for the
whole run through Opacus's RDP accountant; ``--noise-multiplier`` sets it directly.
"""

from __future__ import annotations

from securefed.bench.transports import PlaintextTransport, TransportOptions, register
from securefed.privacy.calibration import noise_for_target
from securefed.privacy.ledger import PrivacyLedger
from securefed.transport.dp import DPTransport

DEFAULT_CLIP = 1.0


def noise_multiplier(options: TransportOptions) -> float:
    """The noise multiplier: given, or calibrated to ``epsilon`` over the run's rounds."""
    if options.noise_multiplier is not None:
        return options.noise_multiplier
    if options.epsilon is None:
        raise ValueError("a DP transport needs --epsilon or --noise-multiplier")
    return noise_for_target(
        options.epsilon, options.delta, options.sample_rate, options.total_rounds or 1
    )


def _wrap(inner, options: TransportOptions, placement: str) -> DPTransport:
    budget = None if options.epsilon is None else (options.epsilon * 1.0001, options.delta)
    return DPTransport(
        inner,
        clip=options.clip or DEFAULT_CLIP,
        noise_multiplier=noise_multiplier(options),
        placement=options.extra.get("placement", placement),
        # A caller may share one ledger between transports (a plaintext-inner warm start).
        ledger=options.extra.get("ledger") or PrivacyLedger(budget=budget),
        sample_rate=options.sample_rate,
        delta=options.delta,
    )


def _dp(options: TransportOptions) -> DPTransport:
    inner = PlaintextTransport(
        keep_payloads=options.keep_payloads, total_rounds=options.total_rounds
    )
    return _wrap(inner, options, "central")


def _secagg_dp(options: TransportOptions) -> DPTransport:
    from securefed.bench.transports_secagg import _secagg

    return _wrap(_secagg(options), options, "distributed")


register("dp", _dp)
register("secagg+dp", _secagg_dp)
