"""The fusion shape (vertical FL): a server function of the parties' vectors, trained through them.

* :mod:`securefed.fusion.base`: the :class:`FusionChannel` protocol, what every channel shares
  (:class:`~securefed.fusion.base.FusionChannelBase`: the seam's signatures and checks, the
  rounds; the checks, picks, scatters and records of the exchanges), :class:`FusionSpec`,
  :class:`FusionWeights` and the plaintext channel of a FusionSpec network.
* :mod:`securefed.fusion.module`: :class:`ModuleFusionChannel`, plaintext fusion around any
  torch server module (members side by side, selected outputs, a target network, its optimiser).
* :mod:`securefed.fusion.dp`: :class:`DPFusionChannel`, any channel behind per-party clipping
  and Gaussian noise with a privacy ledger per party (:class:`DPFusionOptions`).
* :mod:`securefed.fusion.registry`: channels by name (:func:`build_fusion_channel`), and why a
  channel cannot serve a server function (:func:`fusion_refusal`).
* :mod:`securefed.fusion.ckks`: a FusionSpec network on CKKS ciphertexts, trained through the
  masked gradient exchange (needs the ``he`` extra, TenSEAL); import it from there.
* :mod:`securefed.fusion.expansion`: a per-position MLP with a polynomial activation as the
  polynomial it is (coefficients differentiable in the weights; pure math, torch).
* :mod:`securefed.fusion.ckks_module`: such a torch module on CKKS ciphertexts, one key per party,
  members packed in the slots, its own optimiser on the masked exchange's batch sums (what
  ``build_fusion_channel("ckks", ...)`` builds with the default ``circuit="monomials"``; needs
  ``he``).
* :mod:`securefed.fusion.ckks_packed`: the same for networks of degree <= 2 in a packed circuit
  (powers in the clear, regions in the slots, one masked exchange a backward;
  ``CKKSModuleConfig(circuit="packed")``, FedSlate's CKKS channel; needs ``he``).

Every channel records what its server saw in a :class:`~securefed.views.FusionView`. Importing
this package imports neither torch nor tenseal. See docs/ckks.md.
"""

from securefed.fusion.base import (
    NETWORKS,
    RELU_FIT,
    FusionChannel,
    FusionSpec,
    FusionWeights,
    Party,
    PlaintextFusionChannel,
    forward_numpy,
    init_weights,
    polynomial,
)
from securefed.fusion.dp import DPFusionChannel, DPFusionOptions
from securefed.fusion.module import ModuleFusionChannel
from securefed.fusion.registry import (
    DP_CHANNELS,
    FUSION_CHANNELS,
    MODULE_CHANNELS,
    FusionNeeds,
    FusionNotApplicable,
    build_fusion_channel,
    fusion_refusal,
)

__all__ = [
    "DP_CHANNELS",
    "FUSION_CHANNELS",
    "MODULE_CHANNELS",
    "NETWORKS",
    "RELU_FIT",
    "DPFusionChannel",
    "DPFusionOptions",
    "FusionChannel",
    "FusionNeeds",
    "FusionNotApplicable",
    "FusionSpec",
    "FusionWeights",
    "ModuleFusionChannel",
    "Party",
    "PlaintextFusionChannel",
    "build_fusion_channel",
    "forward_numpy",
    "fusion_refusal",
    "init_weights",
    "polynomial",
]
