"""Fusion channels by name for a torch server module; a channel that cannot serve it says why.

A caller describes what its server function needs (:class:`FusionNeeds`: members side by side,
the hidden activation, the layout, the optimiser) and asks for a channel by name
(:data:`FUSION_CHANNELS`). :func:`fusion_refusal` gives the reason a channel cannot serve those
needs (``None`` when it can) without building anything; :func:`build_fusion_channel` builds the
channel or raises :class:`FusionNotApplicable` with that reason, before any exchange.

* ``"plaintext"``: :class:`~securefed.fusion.module.ModuleFusionChannel` serves any torch
  module.
* ``"ckks"``: :class:`~securefed.fusion.ckks_module.CKKSModuleFusionChannel` evaluates a
  torch module that acts position by position (``elementwise``) with a polynomial activation
  (its ``polynomial_network()``) on ciphertexts, one key per party, any number of members, its
  optimiser stepped on the batch gradients of the masked exchange; the refusal lists every need
  it does not meet. (:class:`~securefed.fusion.ckks.CKKSFusionChannel`, the shared-key
  FusionSpec network on concatenated vectors, is built directly.)
* ``"dp"``: :class:`~securefed.fusion.dp.DPFusionChannel` around the plaintext channel: each
  party clips and noises its rows before they leave (needs :class:`~securefed.fusion.dp.
  DPFusionOptions` and one noise source per party); it serves whatever the plaintext one does.
* ``"ckks+dp"``: the DP wrapper around the ``"ckks"`` channel: each party clips and noises
  its rows (the ``"dp"`` mechanism, a ledger per party), clamps every noised entry to the public
  bound ``B = clip + c * std`` (``DPFusionOptions.clamp_sigmas = c``, required here) and divides
  it by ``B``, then encrypts: the CKKS channel's value bound is 1 and its gradient bound the
  gradients' clamp bound, so its polynomial's range and its flooding rest on bounds that hold
  (the clamp is post-processing: the DP guarantee is the ``"dp"`` channel's).
* ``"secagg"``: secure aggregation computes sums; a fusion network is not one.

Importing this module imports neither torch nor tenseal.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from securefed.errors import SecurefedError
from securefed.randomness import SeedTree
from securefed.views import NO_PAYLOADS, RoundSelection

__all__ = [
    "DP_CHANNELS",
    "FUSION_CHANNELS",
    "LAYOUTS",
    "MODULE_CHANNELS",
    "FusionNeeds",
    "FusionNotApplicable",
    "build_fusion_channel",
    "fusion_refusal",
]

FUSION_CHANNELS = ("plaintext", "ckks", "dp", "ckks+dp", "secagg")
MODULE_CHANNELS = tuple(name for name in FUSION_CHANNELS if name != "secagg")
"""The channels that can serve some torch server module (what a command line offers):
``"secagg"`` never can, since secure aggregation computes only sums."""
DP_CHANNELS = {"dp": "plaintext", "ckks+dp": "ckks"}
"""The DP channels by name, and the channel each one wraps."""
LAYOUTS = ("per_party", "concatenated")
POLYNOMIAL_ACTIVATIONS = ("polynomial", "identity")
"""Activation names a CKKS evaluation can compute exactly (``identity`` is degree 1)."""


class FusionNotApplicable(SecurefedError, ValueError):
    """A fusion channel cannot serve the server function asked of it (refused when built)."""


@dataclass(frozen=True)
class FusionNeeds:
    """What a server function asks of a fusion channel.

    Attributes:
        members: independent copies evaluated side by side (the vectors' leading axis).
        activation: the server network's hidden activation (``"polynomial"`` for a polynomial,
            else its name, e.g. ``"relu"``, ``"silu"``, ``"identity"``).
        layout: ``"per_party"`` (one shared function evaluated once per output party on the
            vectors ordered with that party's first) or ``"concatenated"`` (one evaluation on
            the fixed concatenation, each party's output a slice).
        optimiser: the server optimiser's name, lower case (``"sgd"``, ``"adam"``, ...).
        elementwise: the function acts position by position on the parties' aligned entries,
            ``y_p[..., i] = f(x_p[..., i], x_others[..., i])`` (FedSlate's per-position server).
    """

    members: int = 1
    activation: str = "polynomial"
    layout: str = "per_party"
    optimiser: str = "sgd"
    elementwise: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.members, bool) or int(self.members) != self.members or self.members < 1:
            raise ValueError(f"members must be an integer >= 1, got {self.members!r}")
        if not isinstance(self.activation, str) or not self.activation:
            raise ValueError(f"activation must be a non-empty name, got {self.activation!r}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
        if not isinstance(self.optimiser, str) or not self.optimiser:
            raise ValueError(f"optimiser must be a non-empty name, got {self.optimiser!r}")


def _ckks_gaps(needs: FusionNeeds) -> list[str]:
    gaps = []
    if needs.activation not in POLYNOMIAL_ACTIVATIONS:
        gaps.append(
            f"its hidden activation must be a polynomial (CKKS evaluates only additions and "
            f"multiplications), the server network's is {needs.activation!r}"
        )
    if needs.layout != "per_party":
        gaps.append(
            "it evaluates a torch module once per output party with that party's vector first; "
            "the concatenated layout is CKKSFusionChannel's (securefed.fusion.ckks), built "
            "directly"
        )
    if not needs.elementwise:
        gaps.append(
            "it evaluates a function of the parties' aligned entries position by position "
            "(y_p[..., i] = f(x_p[..., i], x_others[..., i])), the server function mixes "
            "positions"
        )
    return gaps


def fusion_refusal(name: str, needs: FusionNeeds) -> str | None:
    """Why the channel ``name`` cannot serve a torch server module with ``needs``; ``None``: it can.

    Raises:
        ValueError: an unknown channel name.
    """
    if name not in FUSION_CHANNELS:
        raise ValueError(f"unknown fusion channel {name!r}; choose from {FUSION_CHANNELS}")
    if not isinstance(needs, FusionNeeds):
        raise TypeError(f"needs must be FusionNeeds, got {type(needs).__name__}")
    if name == "plaintext":
        return None
    if name == "ckks":
        gaps = _ckks_gaps(needs)
        if not gaps:
            return None
        return "the ckks fusion channel cannot serve this server function: " + "; ".join(gaps)
    if name in DP_CHANNELS:
        inner = fusion_refusal(DP_CHANNELS[name], needs)
        if inner is not None:
            return f"the {name} fusion channel wraps {inner}"
        return None
    return (
        "secure aggregation does not apply to the fusion shape: it computes only sums of the "
        "parties' vectors, and a fusion network of their vectors is not a sum"
    )


def build_fusion_channel(
    name: str,
    parties: Sequence[str],
    module: Any,
    optimiser: Any,
    needs: FusionNeeds,
    *,
    target: Any = None,
    cross: bool = True,
    keep_payloads: RoundSelection = NO_PAYLOADS,
    total_rounds: int | None = None,
    seeds: SeedTree | None = None,
    ckks_config: Any = None,
    dp: Any = None,
    noise: Mapping[str, Any] | None = None,
):
    """The fusion channel ``name`` around a torch server module (``"per_party"`` layout).

    Args:
        name: one of :data:`FUSION_CHANNELS`.
        parties: party names.
        module: the server's torch module (:mod:`securefed.fusion.module` for its contract).
        optimiser: the server's optimiser; its class must be ``needs.optimiser``.
        needs: what the function needs (checked before anything is built).
        target: a module of the same architecture for the target network, or ``None``.
        cross: ``False``: each party's evaluation sees zeros for the other parties' vectors.
        keep_payloads: which rounds of the channel's view keep full payloads.
        total_rounds: the run's length (for ``keep_payloads``' ``last:K``).
        seeds: the run's seed tree (``"ckks"``: masks and noise; required there).
        ckks_config: ``"ckks"`` only: a :class:`~securefed.fusion.ckks_module.CKKSModuleConfig`
            (``None``: its defaults).

        dp: for ``"dp"`` and ``"ckks+dp"`` (and only for them): the
            :class:`~securefed.fusion.dp.DPFusionOptions`.
        noise: with ``dp``: one noise source (or numpy generator) per party.

    Raises:
        FusionNotApplicable: the channel cannot serve ``needs`` (the message says why), or
            the module has no polynomial form (``"ckks"``).
        ValueError: an unknown name, ``needs`` that do not describe ``optimiser``, DP options
            for a channel without DP or a DP channel without them.
        PrivacyBudgetExceeded: the DP options' schedule overruns their budget.
    """
    why = fusion_refusal(name, needs)
    if why is not None:
        raise FusionNotApplicable(why)
    if name in DP_CHANNELS:
        if dp is None or noise is None:
            raise ValueError(
                f"the {name} fusion channel needs DP options (epsilon, clip, the releases per "
                "unit of privacy) and one noise source per party"
            )
        from securefed.fusion.dp import DPFusionChannel, DPFusionOptions, unit_ledger

        if not isinstance(dp, DPFusionOptions):
            raise TypeError(f"dp must be DPFusionOptions, got {type(dp).__name__}")
        unit_ledger(dp, dp.sigma())  # a schedule over budget is refused before anything is built
        if name == "ckks+dp":
            ckks_config = _clamped_ckks_config(dp, ckks_config)
        inner = build_fusion_channel(
            DP_CHANNELS[name],
            parties,
            module,
            optimiser,
            needs,
            target=target,
            cross=cross,
            keep_payloads=keep_payloads,
            total_rounds=total_rounds,
            seeds=seeds,
            ckks_config=ckks_config,
        )
        return DPFusionChannel(inner, dp, noise=noise)
    if dp is not None or noise is not None:
        raise ValueError(
            f"DP options apply only to the DP fusion channels {sorted(DP_CHANNELS)}, not to "
            f"{name!r} (refused rather than ignored)"
        )
    if needs.layout != "per_party":
        raise FusionNotApplicable(
            f"a torch server module is evaluated per party; needs.layout is {needs.layout!r}"
        )
    declared, actual = needs.optimiser, type(optimiser).__name__.lower()
    if declared != actual:
        raise ValueError(f"needs.optimiser is {declared!r} but the optimiser is {actual!r}")
    if name == "ckks":
        return _build_ckks(
            parties, module, optimiser, needs, target, cross, keep_payloads, total_rounds, seeds,
            ckks_config,
        )  # fmt: skip
    if ckks_config is not None:
        raise ValueError(f"ckks_config applies to the 'ckks' channel only, not {name!r}")
    from securefed.fusion.module import ModuleFusionChannel

    return ModuleFusionChannel(
        parties,
        module,
        optimiser,
        target=target,
        members=needs.members,
        cross=cross,
        keep_payloads=keep_payloads,
        total_rounds=total_rounds,
        public={"activation": needs.activation},
    )


def _clamped_ckks_config(dp: Any, config: Any) -> Any:
    """The ckks channel's parameters under ``ckks+dp``: value bound 1 (the released entries,
    clamped to ``B`` and divided by it), gradient bound ``B_g`` (the clamp of the gradients).

    Raises:
        FusionNotApplicable: DP options without a clamp (the noise is unbounded, and the CKKS
            channel's polynomial range and flooding rest on public bounds of what it encrypts).
    """
    bounds = dp.clamp_bounds()
    if bounds is None:
        raise FusionNotApplicable(
            "the ckks+dp fusion channel needs DPFusionOptions.clamp_sigmas: Gaussian noise is "
            "unbounded, and the ckks channel's polynomial range and flooding rest on public "
            "bounds of the values it encrypts (clamping the noised entries to clip + c * std "
            "is post-processing and keeps the DP guarantee)"
        )
    from dataclasses import replace

    from securefed.fusion.ckks_module import CKKSModuleConfig

    base = CKKSModuleConfig() if config is None else config
    return replace(base, value_bound=1.0, grad_bound=bounds["grad"])


def _build_ckks(
    parties, module, optimiser, needs, target, cross, keep_payloads, total_rounds, seeds, config
):
    if seeds is None:
        raise ValueError("the ckks fusion channel needs the run's seed tree (seeds=...)")
    form = getattr(module, "polynomial_network", None)
    if form is None:
        raise FusionNotApplicable(
            f"the ckks fusion channel cannot serve this server function: the module "
            f"{type(module).__name__} has no polynomial_network() (its polynomial form)"
        )
    try:
        form()
    except ValueError as error:
        raise FusionNotApplicable(
            f"the ckks fusion channel cannot serve this server function: {error}"
        ) from error
    from securefed.fusion.ckks_module import CKKSModuleFusionChannel

    channel_class = CKKSModuleFusionChannel
    if config is not None and config.circuit == "packed":
        from securefed.fusion.ckks_packed import PackedCKKSModuleFusionChannel

        channel_class = PackedCKKSModuleFusionChannel
    return channel_class(
        parties,
        module,
        optimiser,
        target=target,
        members=needs.members,
        cross=cross,
        seeds=seeds,
        config=config,
        keep_payloads=keep_payloads,
        total_rounds=total_rounds,
        public={"activation": needs.activation},
    )
