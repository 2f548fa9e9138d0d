"""A node's own privacy floors: what it refuses whatever the server's messages say.

On Flower the server tells the nodes the public parameters of every round (the DP clip and
noise, the secure-aggregation threat model, ring, neighbours and threshold). An honest server
tells them what the run configured; a malicious one could weaken them: switch to the
honest-but-curious protocol (whose nodes check no signature), lower the threshold, raise the
clip or lower the noise. A node therefore holds its own configuration, set by whoever runs the
node (``--node-config``), and refuses a round whose parameters are weaker, with a message naming
the parameter (an :class:`~securefed.errors.InsecureParameterError` refusal: the round is
refused, nothing is revealed).

What a node checks (:meth:`NodeFloors.check`):

* ``secagg-server = "malicious"`` (the default): a secure-aggregation round must run the
  malicious-server variant (signed advertisements checked against the registry pinned at
  enrolment, ConsistencyCheck); ``"honest_but_curious"`` also accepts that variant.
* ``secagg-colluders`` / ``secagg-security-bits``: the node's own colluder bound, with which its
  client checks the ``k`` and ``t`` of every round (``SecAggConfig.check_parameters``), in place
  of the bound the server would state; ``secagg-min-threshold``: a Shamir threshold below it is
  refused.
* ``dp-noise-multiplier`` (0: no floor): every round must carry noise that the node adds itself
  (local or distributed placement; central noise is the server's to add, which a node that
  distrusts the server cannot check), with a multiplier of at least this much: the std of the
  sum's noise over the clip, the noise calibrated for the stated contributors (for the integer
  mechanisms ``sqrt(m * per-client variance) * gamma / clip``, as ``dp_sigma_effective`` is in
  one process); ``dp-max-clip`` (0: no ceiling): the clip may not exceed it. The privacy ledger
  (epsilon, the rounding's sensitivity) stays the server's: a node checks the noise it adds.

Distributed noise calibrated for ``m`` contributors adds up to the stated multiplier only when
``m`` contributors are in the sum; under the malicious-server protocol every node checks, at
Unmasking, the signed member counts of the parties it endorsed (``securefed.flower.client``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from securefed.errors import InsecureParameterError
from securefed.transport.ddp import DistributedIntegerMechanism
from securefed.transport.secagg import SecAggConfig
from securefed.transport.secagg.config import SERVER_MODELS, check_colluders

NODE_CONFIG_KEYS = (
    "secagg-server",
    "secagg-colluders",
    "secagg-security-bits",
    "secagg-min-threshold",
    "dp-noise-multiplier",
    "dp-max-clip",
)
"""The ``--node-config`` keys read by :meth:`NodeFloors.from_node_config`."""


@dataclass(frozen=True)
class NodeFloors:
    """A node's own floors (module docstring).

    Attributes:
        secagg_server: the weakest threat model the node takes part in.
        colluders: the node's colluder bound (a fraction, or a count): its client checks every
            round's ``k`` and ``t`` against it.
        security_bits: the colluder bound's failure probability ``2^-security_bits``.
        min_threshold: the smallest Shamir threshold accepted (0: the colluder bound only).
        dp_noise_multiplier: the smallest noise multiplier accepted (0: no DP required).
        dp_max_clip: the largest DP clip accepted (0: no ceiling).
    """

    secagg_server: str = "malicious"
    colluders: float | int = SecAggConfig.colluders
    security_bits: int = SecAggConfig.security_bits
    min_threshold: int = 0
    dp_noise_multiplier: float = 0.0
    dp_max_clip: float = 0.0

    def __post_init__(self) -> None:
        if self.secagg_server not in SERVER_MODELS:
            raise ValueError(
                f"secagg-server must be one of {SERVER_MODELS}, got {self.secagg_server!r}"
            )
        check_colluders(self.colluders)
        if self.security_bits < 1 or self.min_threshold < 0:
            raise ValueError("secagg-security-bits must be >= 1 and secagg-min-threshold >= 0")
        if not (self.dp_noise_multiplier >= 0 and self.dp_max_clip >= 0):
            raise ValueError("dp-noise-multiplier and dp-max-clip must be >= 0")

    @classmethod
    def from_node_config(
        cls, node_config: Mapping[str, object], default: NodeFloors | None = None
    ) -> NodeFloors:
        """The floors in a SuperNode's ``--node-config`` (keys :data:`NODE_CONFIG_KEYS`),
        ``default``'s where a key is absent."""
        base = cls() if default is None else default
        colluders = node_config.get("secagg-colluders", base.colluders)
        if isinstance(colluders, float) and colluders.is_integer() and colluders >= 1:
            colluders = int(colluders)
        return cls(
            secagg_server=str(node_config.get("secagg-server", base.secagg_server)),
            colluders=colluders,
            security_bits=int(node_config.get("secagg-security-bits", base.security_bits)),
            min_threshold=int(node_config.get("secagg-min-threshold", base.min_threshold)),
            dp_noise_multiplier=float(
                node_config.get("dp-noise-multiplier", base.dp_noise_multiplier)
            ),
            dp_max_clip=float(node_config.get("dp-max-clip", base.dp_max_clip)),
        )

    # -- the checks ----------------------------------------------------------------------
    def secagg_config(self, config: Mapping[str, object]) -> SecAggConfig:
        """The node's client configuration for a round: the ring and codec the server states,
        the threat model checked against :attr:`secagg_server`, the colluder bound the node's own.

        Raises:
            InsecureParameterError: an honest-but-curious round at a node that requires the
                malicious-server variant.
        """
        server = str(config["secagg_server"])
        if self.secagg_server == "malicious" and server != "malicious":
            raise InsecureParameterError(
                f"the server asks for secure aggregation with server={server!r}; this node "
                "takes part only in the malicious-server variant (signed advertisements, "
                "ConsistencyCheck): a server could otherwise relay its own keys as a "
                "neighbour's and lie about dropouts (node config secagg-server)"
            )
        return SecAggConfig(
            bits=int(config["secagg_bits"]),
            scale=float(config["secagg_scale"]),
            clip=float(config["secagg_clip"]),
            prg=str(config["secagg_prg"]),
            aead=str(config["secagg_aead"]),
            server=server,
            colluders=self.colluders,
            security_bits=self.security_bits,
        )

    def check_threshold(self, threshold: int) -> None:
        """Raises InsecureParameterError: a threshold below :attr:`min_threshold`."""
        if threshold < self.min_threshold:
            raise InsecureParameterError(
                f"the server asks for a {threshold}-out-of-k sharing; this node's minimum "
                f"threshold is {self.min_threshold} (node config secagg-min-threshold)"
            )

    def check_dp(
        self, config: Mapping[str, object], mechanism: DistributedIntegerMechanism | None
    ) -> None:
        """Refuse DP parameters weaker than the node's own.

        Raises:
            InsecureParameterError: no node-side noise while the node requires DP, a clip above
                its ceiling, or a noise multiplier below its floor (naming each figure).
        """
        if self.dp_max_clip and "dp_clip" in config and float(config["dp_clip"]) > self.dp_max_clip:
            raise InsecureParameterError(
                f"the server's DP clip {float(config['dp_clip']):g} exceeds this node's ceiling "
                f"{self.dp_max_clip:g} (node config dp-max-clip): a larger clip is a larger "
                "sensitivity for the same noise"
            )
        if not self.dp_noise_multiplier:
            return
        placement = str(config.get("dp_placement", ""))
        if placement not in ("local", "distributed"):
            what = "no DP" if not placement else f"{placement} DP (noise added by the server)"
            raise InsecureParameterError(
                f"the server's round carries {what}; this node requires noise it adds itself "
                f"with a multiplier of at least {self.dp_noise_multiplier:g} (node config "
                "dp-noise-multiplier)"
            )
        clip = float(config["dp_clip"])
        if mechanism is not None:
            shares = mechanism.min_contributors
            sigma = mechanism.noise_std_units(shares) * mechanism.gamma / clip
        else:
            shares = int(config.get("dp_shares", 1)) if placement == "distributed" else 1
            sigma = float(config["dp_std"]) * math.sqrt(shares) / clip
        if sigma < self.dp_noise_multiplier * (1 - 1e-12):
            raise InsecureParameterError(
                f"the server's DP parameters give a noise multiplier of {sigma:.6g} ({placement}, "
                f"calibrated for {shares} contributor(s)), below this node's floor of "
                f"{self.dp_noise_multiplier:g} (node config dp-noise-multiplier)"
            )
