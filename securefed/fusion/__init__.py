"""The fusion shape (vertical FL): a server network on the parties' concatenated vectors.

* :mod:`securefed.fusion.base`: :class:`FusionSpec`, :class:`FusionWeights`, the
  :class:`FusionChannel` protocol and the plaintext (torch) channel.
* :mod:`securefed.fusion.ckks`: the same network on CKKS ciphertexts, trained through the masked
  gradient exchange (needs the ``he`` extra, TenSEAL); import it from there.

See docs/ckks.md.
"""

from securefed.fusion.base import (
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

__all__ = [
    "RELU_FIT",
    "FusionChannel",
    "FusionSpec",
    "FusionWeights",
    "Party",
    "PlaintextFusionChannel",
    "forward_numpy",
    "init_weights",
    "polynomial",
]
