"""A DP fusion channel: each party clips and noises what it sends before it leaves (local DP).

:class:`DPFusionChannel` wraps any :class:`~securefed.fusion.base.FusionChannel` (the plaintext
module channel, the CKKS channel, ...). Before a party's message reaches the wrapped channel,
every *row* of it (a vector along the last axis: one platform's Q-values of one state, or the
gradient it sends for one state) is clipped to L2 norm ``C`` and Gaussian noise is added; the
wrapped channel, its server and every party that receives a fused value see only noised rows
and post-processings of them (Dwork and Roth, "The Algorithmic Foundations of Differential
Privacy", 2014, Proposition 2.1 and Appendix A)::

    channel = DPFusionChannel(inner, DPFusionOptions(epsilon=4.0, releases_per_unit=4000, ...),
                              noise={"A": rng_a, "B": rng_b})
    channel.forward({"A": q_a, "B": q_b}, outputs=["A"])    # the inner channel sees noised rows
    channel.epsilon("A")                                   # what A's worst-case unit spent

**Unit of privacy and sensitivity.** The channel protects a *unit*: a group of rows that one
subject contributes (for FedSlate, one user's episode on one platform: a user is the subject of
the privacy claim, an episode is all a platform ever holds of that user, since every episode
draws a fresh user; docs/fedslate.md section 9). Neighbouring runs differ in one unit's data,
the rows are present in both (replacement adjacency), so a clipped row moves by at most ``2 C``
in L2 norm: the noise has standard deviation ``sigma * 2 C`` for a noise multiplier ``sigma``.
Gaussian releases compose additively in Rényi DP whichever messages they travel in (``k`` rows
of a unit in one message cost what ``k`` single-row releases cost), so a unit's privacy loss
depends only on how many of its rows are released: at most
:attr:`DPFusionOptions.releases_per_unit`, a bound the caller derives from its schedule (for a
bound that holds only with probability ``1 - tail_delta``, e.g. one over random replay draws,
``tail_delta`` is part of ``delta``).

**Ledgers.** One :class:`~securefed.privacy.ledger.PrivacyLedger` per party, for that party's
worst-case unit, with the budget ``(epsilon, delta - tail_delta)`` against the released model
and the server (the server sees every noised row and knows which party sent it: no
amplification is claimed). The channel charges each ledger the unit's ``releases_per_unit``
releases when it is built, before anything is released, so a schedule that would overrun the
budget (an explicit noise multiplier too small for it) is refused with
:class:`~securefed.errors.PrivacyBudgetExceeded` and nothing leaves. At run time it counts the
rows it released (:meth:`DPFusionChannel.releases`) and refuses an exchange whose tag the
caller's accounting did not count (``DPFusionOptions.tags``).

**Clamped releases** (``DPFusionOptions.clamp_sigmas = c``, what ``"ckks+dp"`` needs). A
channel that rests on public bounds of the values it receives (the CKKS channel's polynomial
range and its flooding) cannot take Gaussian noise, which is unbounded. With a clamp every noised
input entry is clamped to ``[-B, B]``, ``B = C (1 + 2 c sigma)`` (the clip plus ``c`` noise
standard deviations), and divided by ``B``, so that it lies in ``[-1, 1]``; every noised
gradient entry is clamped to ``B_g = C_g (1 + 2 c sigma)``. Both are post-processings of the
Gaussian release (Dwork and Roth 2014, Proposition 2.1): the privacy guarantee and the ledgers
are unchanged. An entry is clamped with probability at most ``2 Phi(-c)`` (``6.3e-5`` at
``c = 4``); :meth:`DPFusionChannel.clamp_rates` reports the share clamped, per party and kind.

What this channel does not cover: a party's own computations between releases. Its noised rows
are all the server sees of it, but if the party's later rows depend on a unit's data through
something the channel does not noise (a local network trained on the raw data, positions asked
for in the clear), those rows carry the unit's data unaccounted. The caller closes that gap:
FedSlate trains its local networks with DP-SGD (:func:`gaussian_sum`) charged to the same
ledgers and asks for every position (docs/fedslate.md section 9, "Accounting that covers the
local networks"). The fused values and input gradients a party receives are post-processings
of the others' noised rows. Noise from a seeded generator is for tests and
benchmarks (``view.public["dp"]["noise_secure"]`` says which).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from securefed._checks import finite_array
from securefed.fusion.base import as_numpy
from securefed.privacy.calibration import noise_for_target
from securefed.privacy.ledger import ACCOUNTANTS, PrivacyBudget, PrivacyLedger
from securefed.privacy.noise import NoiseSource, as_noise_source

__all__ = [
    "REPLACEMENT_SENSITIVITY",
    "DPFusionChannel",
    "DPFusionOptions",
    "DPParty",
    "check_counted_tag",
    "clamp_entries",
    "clip_rows_last_axis",
    "gaussian_rows",
    "gaussian_sum",
    "scaled_gradient",
    "unit_ledger",
]

REPLACEMENT_SENSITIVITY = 2.0
"""L2 sensitivity of a row clipped to norm ``C``, in units of ``C``: under replacement
adjacency (the row is present in both neighbouring runs) it moves by at most ``2 C``."""


@dataclass(frozen=True)
class DPFusionOptions:
    """The DP channel's mechanism and accounting.

    Attributes:
        epsilon: the budget per unit and party (> 0).
        delta: the budget's delta, in (0, 1); it includes ``tail_delta``.
        clip: L2 bound on each row of a party's input message (> 0).
        grad_clip: L2 bound on each row of an output gradient a party sends (> 0).
        releases_per_unit: the most rows of one unit that one party releases over the run
            (inputs and gradients together; >= 0: 0 with ``tags=()``, a channel that releases
            nothing, as under FedSlate's per-step sums, where the caller's DP-SGD releases are
            the only ones, charged to the same ledgers).
        tail_delta: the probability that ``releases_per_unit`` is exceeded (0 for a bound that
            always holds), in ``[0, delta)``.
        accountant: ``"rdp"`` or ``"prv"`` (:mod:`securefed.privacy.ledger`).
        noise_multiplier: ``sigma``; ``None`` (default): the smallest that keeps
            ``releases_per_unit`` releases within ``(epsilon, delta - tail_delta)``.
        tags: the exchange tags the caller's accounting counted; an exchange with another tag
            is refused (``None``: any tag; ``()``: none, with ``releases_per_unit`` 0).
        clamp_sigmas: ``c``; ``None`` (default): the noised rows are released as they are.
            Else every noised entry is clamped to ``[-B, B]`` with ``B = clip + c * std`` (the
            noise's standard deviation ``std = sigma * 2 clip``) and divided by ``B``, so that
            every released input entry lies in ``[-1, 1]``; output gradients are clamped to
            ``B_g = grad_clip + c * std_g`` (not rescaled). Post-processing of the Gaussian
            release: the privacy guarantee is unchanged (Dwork and Roth 2014, Proposition
            2.1). What a channel that rests on public value bounds needs (``"ckks+dp"``).
    """

    epsilon: float
    delta: float = 1e-5
    clip: float = 1.0
    grad_clip: float = 1.0
    releases_per_unit: int = 1
    tail_delta: float = 0.0
    accountant: str = "rdp"
    noise_multiplier: float | None = None
    tags: tuple[str, ...] | None = None
    clamp_sigmas: float | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.epsilon) and self.epsilon > 0):
            raise ValueError(f"DP epsilon must be finite and > 0, got {self.epsilon!r}")
        if not (0 < self.delta < 1):
            raise ValueError(f"DP delta must lie in (0, 1), got {self.delta!r}")
        for name in ("clip", "grad_clip"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"DP {name} must be finite and > 0, got {value!r}")
        releases = self.releases_per_unit
        if isinstance(releases, bool) or int(releases) != releases or releases < 0:
            raise ValueError(f"releases_per_unit must be an integer >= 0, got {releases!r}")
        if releases == 0 and self.tags != ():
            raise ValueError(
                "releases_per_unit 0 (no row charged) needs tags=(): a channel that charged no "
                f"row must refuse every exchange, got tags {self.tags!r}"
            )
        if not (0 <= self.tail_delta < self.delta):
            raise ValueError(
                f"tail_delta must lie in [0, delta={self.delta:g}), got {self.tail_delta!r}"
            )
        if self.accountant not in ACCOUNTANTS:
            raise ValueError(f"accountant must be one of {ACCOUNTANTS}, got {self.accountant!r}")
        sigma = self.noise_multiplier
        if sigma is not None and not (math.isfinite(sigma) and sigma > 0):
            raise ValueError(f"noise_multiplier must be finite and > 0, got {sigma!r}")
        if self.tags is not None:
            tags = tuple(self.tags)
            if (not tags and releases) or not all(isinstance(t, str) for t in tags):
                raise ValueError(f"tags must be a non-empty tuple of strings, got {self.tags!r}")
            object.__setattr__(self, "tags", tags)
        clamp = self.clamp_sigmas
        if clamp is not None and not (
            isinstance(clamp, (int, float)) and math.isfinite(clamp) and clamp > 0
        ):
            raise ValueError(f"clamp_sigmas must be finite and > 0, got {clamp!r}")
        object.__setattr__(self, "releases_per_unit", int(releases))

    @property
    def mechanism_delta(self) -> float:
        """The delta left to the Gaussian mechanism: ``delta - tail_delta``."""
        return self.delta - self.tail_delta

    def sigma(self) -> float:
        """The noise multiplier: the given one, or the one calibrated to the budget."""
        if self.noise_multiplier is not None:
            return float(self.noise_multiplier)
        return noise_for_target(
            self.epsilon, self.mechanism_delta, 1.0, self.releases_per_unit, self.accountant
        )

    def clamp_bounds(self) -> dict[str, float] | None:
        """``{"input": B, "grad": B_g}``, the public clamp bounds (``None`` without a clamp).

        ``B = clip (1 + 2 c sigma)`` and ``B_g = grad_clip (1 + 2 c sigma)``: a clipped entry is
        at most its row's clip, plus ``c`` noise standard deviations."""
        if self.clamp_sigmas is None:
            return None
        widening = 1.0 + self.clamp_sigmas * REPLACEMENT_SENSITIVITY * self.sigma()
        return {"input": self.clip * widening, "grad": self.grad_clip * widening}


# ----------------------------------------------------------------------------- the arithmetic
def clip_rows_last_axis(values: np.ndarray, clip: float) -> tuple[np.ndarray, np.ndarray]:
    """Each vector along the last axis scaled to L2 norm at most ``clip``.

    Returns:
        ``(clipped, factors)``: ``factors`` has the leading shape and a last axis of 1, the
        scale ``min(1, clip / norm)`` applied to each row (1 for a zero row).
    """
    norms = np.linalg.norm(values, axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        factors = np.where(norms > clip, clip / np.where(norms > 0, norms, 1.0), 1.0)
    return values * factors, factors


def gaussian_rows(
    values: np.ndarray, clip: float, sigma: float, noise: NoiseSource
) -> tuple[np.ndarray, np.ndarray]:
    """Clip each row to ``clip`` and add ``N(0, (sigma * 2 clip)^2)`` to every entry.

    The Gaussian mechanism per row with sensitivity ``2 clip`` (replacement adjacency) and
    noise multiplier ``sigma`` (Dwork and Roth 2014, Theorem A.1; Mironov 2017 for its RDP).

    Returns:
        ``(noised, clip factors)`` (:func:`clip_rows_last_axis`).
    """
    clipped, factors = clip_rows_last_axis(values, clip)
    std = sigma * REPLACEMENT_SENSITIVITY * clip
    return clipped + noise.normal(std, clipped.shape), factors


def gaussian_sum(
    unit_rows: np.ndarray, clip: float, sigma: float, noise: NoiseSource
) -> np.ndarray:
    """DP-SGD's release: clip each unit's row to ``clip``, sum over the units (axis ``-2``) and
    add ``N(0, (sigma * 2 clip)^2)`` to every entry of the sum.

    Abadi et al., "Deep Learning with Differential Privacy", CCS 2016, Algorithm 1, with a
    *unit*'s gradient (all its records in the batch summed) clipped as a whole: user-level
    clipping (McMahan et al., "Learning Differentially Private Recurrent Language Models", ICLR
    2018). Under replacement adjacency the sum moves by at most ``2 clip``.

    Args:
        unit_rows: ``(..., units, width)``; a row of zeros for a slot no unit fills.
        clip: L2 bound per unit (> 0).
        sigma: noise multiplier (> 0).
        noise: the noise source.

    Returns:
        ``(..., width)`` the noised sum.
    """
    clipped, _ = clip_rows_last_axis(unit_rows, clip)
    total = clipped.sum(axis=-2)
    return total + noise.normal(sigma * REPLACEMENT_SENSITIVITY * clip, total.shape)


def clamp_entries(values: np.ndarray, bound: float) -> tuple[np.ndarray, int]:
    """Every entry clamped to ``[-bound, bound]``; returns ``(clamped, entries clamped)``."""
    outside = np.abs(values) > bound
    return np.clip(values, -bound, bound), int(np.count_nonzero(outside))


def unit_ledger(options: DPFusionOptions, sigma: float) -> PrivacyLedger:
    """A ledger of one party's worst-case unit, charged with its whole schedule
    (``options.releases_per_unit`` Gaussian releases at noise multiplier ``sigma``).

    Raises:
        PrivacyBudgetExceeded: the schedule overruns ``(epsilon, delta - tail_delta)``.
    """
    budget = PrivacyBudget(
        options.epsilon, options.mechanism_delta, against=("released_model", "server")
    )
    ledger = PrivacyLedger(options.accountant, budget=budget)
    if options.releases_per_unit:  # 0: a channel that releases no row (it refuses every tag)
        ledger.charge(sigma, 1.0, steps=options.releases_per_unit, server=(sigma, 1.0))
    return ledger


# ----------------------------------------------------------------------------- the channel
class DPFusionChannel:
    """Any fusion channel behind per-party clipping and Gaussian noise (module docstring).

    Args:
        inner: the wrapped channel (it sees the noised rows; its view records them).
        options: the mechanism and the accounting.
        noise: per party, its noise source (a :class:`~securefed.privacy.noise.NoiseSource`,
            or a numpy generator: seeded noise, for tests and benchmarks only).
        keep_clean: tags of the forwards whose rows *before* clipping and noise the channel
            keeps in :attr:`clean_inputs` (``(round, {party: rows})`` per forward), for scoring
            a leak against the truth (benchmarks only: those rows never reach the wrapped
            channel or its view).

    Raises:
        PrivacyBudgetExceeded: ``options.releases_per_unit`` releases at the noise multiplier
            would overrun a party's budget (nothing is released).
        ValueError: noise sources that are not one per party of ``inner``.
    """

    def __init__(
        self,
        inner: Any,
        options: DPFusionOptions,
        *,
        noise: Mapping[str, NoiseSource | np.random.Generator],
        keep_clean: Sequence[str] = (),
    ) -> None:
        if not isinstance(options, DPFusionOptions):
            raise TypeError(f"options must be DPFusionOptions, got {type(options).__name__}")
        parties = tuple(inner.parties)
        if set(noise) != set(parties):
            raise ValueError(
                f"the DP channel needs one noise source per party {list(parties)}, got "
                f"{sorted(noise)}"
            )
        self.inner = inner
        self.options = options
        self.name = "dp" if inner.name == "plaintext" else f"{inner.name}+dp"
        self.noise_multiplier = options.sigma()
        self.party_halves = {
            p: DPParty(p, options, noise[p], self.noise_multiplier) for p in parties
        }
        self._noise = {p: half.noise for p, half in self.party_halves.items()}
        self.ledgers = {p: half.ledger for p, half in self.party_halves.items()}
        self._released = {p: half.released for p, half in self.party_halves.items()}
        self.bounds = options.clamp_bounds()
        self._clamped = {p: half.clamped for p, half in self.party_halves.items()}
        self._pending: dict[str, np.ndarray] | None = None
        self._pending_tag = ""
        self.keep_clean = tuple(keep_clean)
        self.clean_inputs: list[tuple[int | None, dict[str, np.ndarray]]] = []
        self.view.channel = self.name
        self.view.public["dp"] = self.public()

    # ------------------------------------------------------------------ the seam
    @property
    def parties(self) -> tuple[str, ...]:
        return tuple(self.inner.parties)

    @property
    def view(self):
        """The wrapped channel's view: what its server saw (the noised rows)."""
        return self.inner.view

    @property
    def module(self):
        """The server's module of the wrapped channel (checkpoints, results)."""
        return self.inner.module

    @property
    def target(self):
        return self.inner.target

    @property
    def optimiser(self):
        return self.inner.optimiser

    def open_round(self, round_id: int) -> None:
        self.inner.open_round(round_id)

    def sync_target(self) -> None:
        self.inner.sync_target()

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
        """The wrapped forward on every party's clipped, noised input (same arguments)."""
        self._check_tag(tag)
        self._check_parties(inputs, "inputs")
        if tag in self.keep_clean:
            clean = {p: np.array(as_numpy(v)) for p, v in inputs.items()}
            self.clean_inputs.append((self.view.current_round, clean))
        released, factors = {}, {}
        for party, value in inputs.items():
            released[party], factors[party] = self._release(
                party, value, self.options.clip, f"{tag}:input", "input"
            )
        result = self.inner.forward(
            released,
            outputs=outputs,
            positions=positions,
            network=network,
            train=train,
            tag=tag,
        )
        if train:
            self._pending, self._pending_tag = factors, tag
        return result

    def backward(
        self, grads: Mapping[str, Any], *, recipients: Sequence[str] | None = None
    ) -> dict[str, Any]:
        """The wrapped backward on the parties' clipped, noised output gradients.

        The input gradients returned are with respect to the noised rows the server received;
        each is scaled by its row's clip factor (the chain rule through the clipping, the
        factor held constant as DP-SGD does) before it goes back to its party.

        Raises:
            RuntimeError: without a training forward since the last backward.
        """
        if self._pending is None:
            raise RuntimeError("backward() needs a forward(train=True) first (once per forward)")
        self._check_parties(grads, "grads")
        factors, tag = self._pending, self._pending_tag
        noised = {
            party: self._release(party, g, self.options.grad_clip, f"{tag}:grad", "grad")[0]
            for party, g in grads.items()
        }
        result = self.inner.backward(noised, recipients=recipients)
        self._pending = None
        return {q: _scaled(g, factors[q]) for q, g in result.items()}

    # ------------------------------------------------------------------ accounting
    def epsilon(self, party: str, *, against: str = "server") -> float:
        """Epsilon of ``party``'s worst-case unit at ``delta - tail_delta`` (plus
        ``tail_delta``: the figure holds at ``options.delta``)."""
        return self.ledgers[party].epsilon(against=against)

    def releases(self) -> dict[str, dict[str, int]]:
        """Rows released so far, per party and ``"tag:input"`` / ``"tag:grad"``."""
        return {p: dict(counts) for p, counts in self._released.items()}

    def clamp_rates(self) -> dict[str, dict[str, float]] | None:
        """Per party and ``"input"`` / ``"grad"``, the share of released entries the clamp
        changed so far (``None`` without a clamp; a kind with no entries yet is absent)."""
        if self.bounds is None:
            return None
        return {
            p: {kind: clamped / total for kind, (clamped, total) in kinds.items() if total}
            for p, kinds in self._clamped.items()
        }

    def public(self) -> dict[str, object]:
        """The mechanism's public parameters (recorded in the view)."""
        options = self.options
        return {
            "placement": "local",
            "unit_releases": options.releases_per_unit,
            "noise_multiplier": self.noise_multiplier,
            "sensitivity": f"{REPLACEMENT_SENSITIVITY:g} x clip (replacement adjacency)",
            "clip": options.clip,
            "grad_clip": options.grad_clip,
            "noise_std_input": self.noise_multiplier * REPLACEMENT_SENSITIVITY * options.clip,
            "noise_std_grad": self.noise_multiplier * REPLACEMENT_SENSITIVITY * options.grad_clip,
            "epsilon_budget": options.epsilon,
            "delta": options.delta,
            "tail_delta": options.tail_delta,
            "accountant": options.accountant,
            "epsilon_spent": {p: self.epsilon(p) for p in self.parties},
            "noise_secure": all(source.secure for source in self._noise.values()),
            "tags": None if options.tags is None else list(options.tags),
            "clamp_sigmas": options.clamp_sigmas,
            "clamp_rates": self.clamp_rates(),
            "clamp_bounds": self.bounds,
            "input_scale": None if self.bounds is None else 1.0 / self.bounds["input"],
        }

    # ------------------------------------------------------------------ internals
    def _check_tag(self, tag: str) -> None:
        check_counted_tag(self.options, tag)

    def _check_parties(self, values: Mapping[str, Any], what: str) -> None:
        unknown = set(values) - set(self.parties)
        if unknown:
            raise ValueError(f"{what} of parties {sorted(unknown)} that are not {self.parties}")

    def _release(self, party: str, value: Any, clip: float, key: str, kind: str):
        """One party's message released by that party's half (:meth:`DPParty.release`)."""
        return self.party_halves[party].release(value, clip, key, kind)


def check_counted_tag(options: DPFusionOptions, tag: str) -> None:
    """Refuse an exchange whose tag the caller's accounting did not count.

    Raises:
        ValueError: ``tag`` is not in ``options.tags`` (when tags are given).
    """
    tags = options.tags
    if tags is not None and tag not in tags:
        raise ValueError(
            f"the DP accounting counted no exchange tagged {tag!r} (it counted {list(tags)}): "
            "its rows would leave without being charged"
        )


class DPParty:
    """One party's half of the DP channel: its noise source, its ledger, its release counts.

    What runs where the party's data lives (in one process inside :class:`DPFusionChannel`; on
    Flower on the party's node, ``securefed.rl.flower_fedslate``): every row the party sends
    is clipped and noised here before it leaves (:func:`gaussian_rows`), and the party's ledger
    is charged with its unit's whole schedule when the half is built (:func:`unit_ledger`).

    Args:
        name: the party.
        options: the mechanism and the accounting (shared by every party).
        noise: the party's noise source (or a numpy generator: seeded, tests only).
        sigma: the noise multiplier (``None``: ``options.sigma()``).

    Raises:
        PrivacyBudgetExceeded: the schedule overruns the budget at ``sigma``.
    """

    def __init__(
        self,
        name: str,
        options: DPFusionOptions,
        noise: NoiseSource | np.random.Generator,
        sigma: float | None = None,
    ) -> None:
        self.name = name
        self.options = options
        self.noise_multiplier = options.sigma() if sigma is None else float(sigma)
        self.noise = as_noise_source(noise)
        self.ledger = unit_ledger(options, self.noise_multiplier)
        self.released: dict[str, int] = {}
        self.bounds = options.clamp_bounds()
        self.clamped: dict[str, list[int]] = {}

    def release(self, value: Any, clip: float, key: str, kind: str):
        """The party's message, every row clipped and noised (and, with a clamp, every entry
        clamped; inputs also divided by their bound), in the type it came in. Returns
        ``(released, factors)``: the factors are what an input gradient is multiplied by on
        its way back (clip factor / bound; :func:`scaled_gradient`)."""
        party = self.name
        is_tensor = hasattr(value, "detach")
        array = as_numpy(value)
        dtype = array.dtype
        array = finite_array(f"party {party!r} {key}", array)
        if array.ndim < 1 or array.shape[-1] < 1:
            raise ValueError(f"party {party!r} {key} has shape {array.shape}: no rows to release")
        noised, factors = gaussian_rows(array, clip, self.noise_multiplier, self.noise)
        if self.bounds is not None:
            bound = self.bounds[kind]
            noised, clamped = clamp_entries(noised, bound)
            tally = self.clamped.setdefault(kind, [0, 0])
            tally[0] += clamped
            tally[1] += noised.size
            if kind == "input":
                # Released in [-1, 1]; the chain rule through the scaling on the way back.
                noised, factors = noised / bound, factors / bound
        rows = int(np.prod(array.shape[:-1], dtype=np.int64))
        self.released[key] = self.released.get(key, 0) + rows
        noised = noised.astype(dtype, copy=False)
        if is_tensor:
            import torch

            return torch.from_numpy(noised), factors
        return noised, factors


def scaled_gradient(gradient: Any, factors: np.ndarray) -> Any:
    """An input gradient returned for noised rows, times their release factors (the chain
    rule through the clipping, the factor held constant as DP-SGD does)."""
    return _scaled(gradient, factors)


def _scaled(gradient: Any, factors: np.ndarray) -> Any:
    """``gradient * factors`` in the gradient's own type (tensor or array)."""
    if hasattr(gradient, "detach"):
        import torch

        return gradient * torch.from_numpy(factors.astype(np.float64)).to(gradient.dtype)
    return np.asarray(gradient) * factors
