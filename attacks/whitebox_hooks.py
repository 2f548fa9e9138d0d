"""White-box canary hooks for the RL recommenders: FedHPD's aggregation, FedSlate's DP fusion.

Both follow Andrew, Kairouz, Oh, Oprea, McMahan and Suriyakumar (ICLR 2024): canaries whose
contribution is a fixed random unit direction, a null from directions never inserted, and a
Gaussian-DP *estimate* (:mod:`securefed.audit.whitebox`), kept apart from the rigorous one-run
bound (Steinke, Nasr and Jagielski 2023). The hooks only use what the models expose publicly,
so they keep working when the models' accounting changes: each reads the ledger, the clip and
the noise multiplier that its channel *declares*, and audits what it *does*.

* **FedHPD** sends every agent's ``(part_size, width)`` distributions through an aggregation
  round (:func:`securefed.rl.fedhpd.aggregate_uploads`). The generic hook
  (:class:`securefed.audit.hooks.CanaryTransport`) audits it unchanged: give the run a
  ``CanaryTransport`` whose hook has :func:`fedhpd_block`'s shape and client ids from
  ``config.n_agents``; the canary agents submit next to the real ones in every distillation
  round.
* **FedSlate** protects a unit (one user's episode on one platform) whose rows each leave the
  platform clipped and noised (local DP, :class:`securefed.fusion.dp.DPFusionChannel`). A
  canary is a unit whose every row is ``norm`` times its random unit direction ``d_j``, sent
  through the channel's public ``forward`` (as a platform's acting inquiry) as many times as the
  channel's accounting allows one unit (``options.releases_per_unit``). The rows are read where
  they leave the DP layer (what the server's channel receives; :class:`RowRecorder`). Each
  canary is scored on the sum of its released rows: along ``d_j`` (inserted) and along
  ``width - 1`` directions orthogonal to it (the null). Adjacency is by replacement (the
  channel's: a row moves by at most ``2 C``), so the mean-shift estimate doubles the shift
  (the neighbour of ``+C d_j`` is ``-C d_j``), and the noise family's declared sensitivity is
  ``2 C K`` for ``K`` rows (:func:`fusion_whitebox_audit`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from securefed.audit.empirical import (
    EmpiricalAuditConfig,
    EmpiricalAuditResult,
    audit_scores,
    draw_inclusions,
)
from securefed.audit.whitebox import (
    WhiteBoxConfig,
    WhiteBoxReport,
    contradictions,
    gdp_estimate,
    noise_estimate,
)
from securefed.fusion.dp import REPLACEMENT_SENSITIVITY, DPFusionChannel

__all__ = [
    "FusionCanaryConfig",
    "RowRecorder",
    "fedhpd_block",
    "fusion_canary_frames",
    "fusion_whitebox_audit",
    "unit_row_statistics",
]


def fedhpd_block(config) -> tuple[int, int]:
    """The shape of one FedHPD agent's upload in a distillation round: ``(part_size, width)``,
    ``width`` the action count (categorical) or means and stds (Gaussian)."""
    spec = config.spec
    return config.part_size, spec.act_dim * (1 if spec.kind == "categorical" else 2)


# ----------------------------------------------------------------------------- FedSlate
def fusion_canary_frames(n_units: int, width: int, rng: np.random.Generator) -> np.ndarray:
    """``(n_units, width, width)``: per canary unit a Haar-random orthonormal frame; row 0 is
    its direction, rows ``1..width-1`` its null directions (QR of a Gaussian, signs fixed by
    ``R``'s diagonal: Mezzadri 2007).

    Raises:
        ValueError: fewer than 2 units or a width below 2 (no null direction).
    """
    if n_units < 2 or width < 2:
        raise ValueError(f"need >= 2 canary units and a row width >= 2, got {n_units}, {width}")
    q, r = np.linalg.qr(rng.standard_normal((n_units, width, width)))
    signs = np.sign(np.diagonal(r, axis1=1, axis2=2))
    return np.swapaxes(q * signs[:, None, :], 1, 2)


def unit_row_statistics(frames: np.ndarray, summed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Inserted and null statistics of canary units from the sums of their released rows.

    ``summed[j]`` is unit ``j``'s released rows summed, ``(width,)``. Inserted: ``<d_j,
    summed_j>``; null: its projections on the frame's other rows (pure noise, by isotropy).
    """
    projections = np.einsum("jkw,jw->jk", frames, summed)
    return projections[:, 0], projections[:, 1:].reshape(-1)


class RowRecorder:
    """Stands in for a DP fusion channel's inner channel during canary exchanges: keeps the rows
    the DP layer releases (what the server's channel would receive) and computes no fusion."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.received: list[dict[str, np.ndarray]] = []

    @property
    def parties(self) -> tuple[str, ...]:
        return tuple(self.inner.parties)

    @property
    def view(self):
        return self.inner.view

    @property
    def name(self) -> str:
        return self.inner.name

    def forward(
        self,
        inputs: Mapping[str, Any],
        *,
        outputs: Sequence[str] | None = None,
        positions: Mapping[str, Any] | None = None,
        network: str = "online",
        train: bool = True,
        tag: str = "",
    ) -> dict[str, Any]:
        """Record ``inputs``; no output is asked of a canary exchange."""
        if outputs:
            raise ValueError("a canary exchange asks for no fused output")
        self.received.append({p: np.array(v, dtype=np.float64) for p, v in inputs.items()})
        return {}


@dataclass(frozen=True)
class FusionCanaryConfig:
    """Canary units of a FedSlate DP fusion audit.

    Attributes:
        n_units: canary units (each ``releases_per_unit`` rows: the budget of one unit).
        norm: each row's norm before the clip (above it, so that the clip must act).
        party: the platform whose rows carry the canaries (``None``: the channel's first).
        tag: the exchange tag the canary rows travel under (one the accounting counts).
        rows_per_unit: ``None``: the channel's ``options.releases_per_unit`` (tight); fewer
            rows audit a weaker unit (valid, looser).
        confidence: of the estimates' limits and the rigorous bound.
        chunk_rows: rows per forward call (memory).
    """

    n_units: int = 200
    norm: float = 10.0
    party: str | None = None
    tag: str = "act"
    rows_per_unit: int | None = None
    confidence: float = 0.95
    chunk_rows: int = 200_000

    def __post_init__(self) -> None:
        if self.n_units < 2:
            raise ValueError(f"n_units must be >= 2, got {self.n_units}")
        if not (math.isfinite(self.norm) and self.norm > 0):
            raise ValueError(f"norm must be finite and > 0, got {self.norm!r}")
        if self.rows_per_unit is not None and self.rows_per_unit < 1:
            raise ValueError(f"rows_per_unit must be >= 1, got {self.rows_per_unit}")
        if not 0 < self.confidence < 1 or self.chunk_rows < 1:
            raise ValueError("confidence must lie in (0, 1) and chunk_rows be >= 1")


def _released_sums(
    channel: DPFusionChannel,
    party: str,
    rows: np.ndarray,
    per_unit: int,
    config: FusionCanaryConfig,
) -> np.ndarray:
    """Send ``per_unit`` copies of each unit's row (``rows``: ``(n, width)``) through the
    channel's public forward; the sums per unit of the rows the DP layer released."""
    n, width = rows.shape
    recorder = RowRecorder(channel.inner)
    sums = np.zeros((n, width))
    units_per_call = max(1, config.chunk_rows // per_unit)
    channel.inner = recorder
    try:
        for start in range(0, n, units_per_call):
            block = rows[start : start + units_per_call]
            message = np.repeat(block, per_unit, axis=0)[:, None, :]
            channel.forward({party: message}, outputs=[], train=False, tag=config.tag)
            released = recorder.received[-1][party].reshape(len(block), per_unit, width)
            sums[start : start + len(block)] = released.sum(axis=1)
    finally:
        channel.inner = recorder.inner
    return sums


def fusion_whitebox_audit(
    channel: DPFusionChannel,
    width: int,
    config: FusionCanaryConfig,
    rng: np.random.Generator,
    *,
    rigorous: bool = True,
) -> WhiteBoxReport:
    """Audit a FedSlate DP fusion channel with canary units (module docstring).

    Estimates (server observer; the released model's figure is the same ledger's): family
    ``"own-payloads"`` (mean shift, doubled for replacement adjacency) and ``"own-noise"``
    (declared sensitivity ``2 C K s`` over the null's spread, ``s`` the released rows' scale:
    ``1 / B`` under a clamp). With ``rigorous``, a second set of units, each sending its rows
    with probability 1/2 (else zero rows, a valid replacement), scored by the same projection,
    gives the one-run bound.

    Raises:
        ValueError: a channel that is not a DP fusion channel, or a party it does not have.
    """
    if not isinstance(channel, DPFusionChannel):
        raise ValueError(f"the fusion audit needs a DP fusion channel, got {type(channel)}")
    party = config.party or channel.parties[0]
    if party not in channel.parties:
        raise ValueError(f"party {party!r} is not one of {channel.parties}")
    options = channel.options
    per_unit = config.rows_per_unit or options.releases_per_unit
    bounds = channel.bounds
    scale = 1.0 if bounds is None else 1.0 / bounds["input"]
    frames = fusion_canary_frames(config.n_units, width, rng)
    sums = _released_sums(channel, party, config.norm * frames[:, 0], per_unit, config)
    inserted, null = unit_row_statistics(frames, sums)
    delta = options.delta
    sensitivity = REPLACEMENT_SENSITIVITY * min(config.norm, options.clip) * per_unit * scale
    estimates = {
        "server/own-payloads": gdp_estimate(
            REPLACEMENT_SENSITIVITY * inserted, null, delta=delta, confidence=config.confidence
        ),
        "server/own-noise": noise_estimate(
            null, sensitivity, delta=delta, confidence=config.confidence
        ),
    }
    ledger = {o: float(channel.epsilon(party, against=o)) for o in ("released_model", "server")}
    summary = WhiteBoxConfig(
        n_constant=config.n_units,
        n_alternating=0,
        n_held_out=len(null),
        rounds=1,
        confidence=config.confidence,
        delta=delta,
    )
    bounds_out: dict[str, EmpiricalAuditResult] = {}
    if rigorous:
        second = fusion_canary_frames(config.n_units, width, rng)
        included = draw_inclusions(config.n_units, rng)
        rows = config.norm * second[:, 0] * included[:, None]
        scores = np.einsum(
            "jw,jw->j", second[:, 0], _released_sums(channel, party, rows, per_unit, config)
        )
        audit = EmpiricalAuditConfig(
            n_canaries=config.n_units, confidence=config.confidence, delta=delta
        )
        bounds_out["server"] = audit_scores(
            scores,
            included,
            audit,
            observer="server",
            epsilon_ledger=ledger["server"],
            description="FedSlate canary units: projection of the summed released rows",
            delta_ledger=delta,
        )
    contradicted = contradictions(estimates, ledger, summary)
    return WhiteBoxReport(estimates, ledger, delta, contradicted, bounds_out, summary)
