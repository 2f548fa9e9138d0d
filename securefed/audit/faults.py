"""Deliberate DP bugs, to show that an audit catches them (tests and benchmarks only).

An audit that never fails proves nothing: each fault here breaks what a DP transport *does*
while leaving every parameter it *declares* (and so every ledger figure and every finding of
the parameter audit) unchanged, the way a bug would. They patch the functions the transports
call (:mod:`securefed.transport.dp` for the float Gaussian of every placement,
:mod:`securefed.transport.ddp` for the integer mechanisms, the ``secagg+dp`` default,
:mod:`securefed.fusion.dp` for FedSlate's DP fusion channel's rows; its noise is never reused
across rows, so ``"noise-reused"`` leaves it alone), inside a ``with`` block only::

    with inject_dp_fault("noise/1.5"):
        run(...)  # the ledger still charges for the declared noise multiplier

Faults (:data:`FAULTS`):

* ``"no-noise"``, ``"noise/10"``, ``"noise/1.5"``, ``"noise/3"``: the noise std divided by
  that factor (the noise multiplier overstated to the ledger); integer noise: the discrete
  Gaussian's integer variance or Skellam's ``mu`` divided by the factor squared (at least 1 for
  the discrete Gaussian, as its sampler needs).
* ``"noise-reused"``: every round draws the noise of round 0 (a stream keyed without the round;
  for the integer mechanisms the rounding's coins come from a child stream, so that the noise
  drawn after them is the same whatever the number of rounding retries).
* ``"clip-off"``: updates are not clipped (the float path sums them as they come; the integer
  mechanisms' encoder refuses an update above the clip, so there the run stops with a
  ValueError: that defence is what a test of this fault checks).

Never use these outside a test or a benchmark of the audit itself: they weaken the guarantee
on purpose.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np

FAULTS = ("no-noise", "noise/10", "noise/3", "noise/1.5", "noise-reused", "clip-off")
_FACTORS = {"no-noise": 0.0, "noise/10": 0.1, "noise/3": 1 / 3, "noise/1.5": 1 / 1.5}


class _ScaledNoise:
    """A noise source whose draws carry ``factor`` times the asked std."""

    def __init__(self, source, factor: float) -> None:
        self.source, self.factor = source, factor
        self.secure, self.name = source.secure, source.name

    def normal(self, std, shape):
        return self.source.normal(std * self.factor, shape)


def scaled_integer_variance(sigma2: int, factor: float) -> int:
    """The discrete Gaussian's integer variance with its std scaled by ``factor`` (>= 1)."""
    return max(1, round(sigma2 * factor * factor))


def fault_patches(kind: str) -> list[tuple[object, str, object]]:
    """``(owner, attribute, replacement)`` for each attribute the fault ``kind`` replaces.

    :func:`inject_dp_fault` applies and restores them; a pytest test may apply them with
    ``monkeypatch.setattr(owner, attribute, replacement)``.

    Raises:
        ValueError: an unknown fault (naming those that exist).
    """
    if kind not in FAULTS:
        raise ValueError(f"fault must be one of {FAULTS}, got {kind!r}")
    import securefed.fusion.dp as fusion_module
    import securefed.transport.ddp as ddp_module
    import securefed.transport.dp as dp_module

    patches: list[tuple[object, str, object]] = []

    def patch(owner: object, name: str, value: object) -> None:
        patches.append((owner, name, value))

    if kind in _FACTORS:
        factor = _FACTORS[kind]
        noise_source = dp_module.noise_source
        discrete_gaussian, skellam = ddp_module.discrete_gaussian, ddp_module.skellam

        def scaled_source(seeds, *path, secure=False):
            return _ScaledNoise(noise_source(seeds, *path, secure=secure), factor)

        def scaled_discrete(sigma2, size, rng):
            if factor == 0:
                return np.zeros(size, dtype=np.int64)
            return discrete_gaussian(scaled_integer_variance(sigma2, factor), size, rng)

        def scaled_skellam(mu, size, rng):
            if factor == 0:
                return np.zeros(size, dtype=np.int64)
            return skellam(mu * factor * factor, size, rng)

        fusion_rows = fusion_module.gaussian_rows

        def scaled_rows(values, clip, sigma, noise):
            return fusion_rows(values, clip, sigma * factor, noise)

        patch(dp_module, "noise_source", scaled_source)
        patch(ddp_module, "discrete_gaussian", scaled_discrete)
        patch(ddp_module, "skellam", scaled_skellam)
        patch(fusion_module, "gaussian_rows", scaled_rows)
    elif kind == "noise-reused":
        noise_source = dp_module.noise_source
        integer_source = dp_module.DPRound._integer_source

        def reused_source(seeds, *path, secure=False):
            if len(path) >= 2 and path[0] == "dp":
                path = ("dp", 0, *path[2:])
            return noise_source(seeds, *path, secure=secure)

        def reused_integers(self, first_client):
            round_id = self.round_id
            try:
                self.round_id = 0
                return integer_source(self, first_client)
            finally:
                self.round_id = round_id

        conditional_round = ddp_module.conditional_round

        def rounding_apart(scaled, l2_bound, rng, **options):
            # The rounding's retries consume a data-dependent number of coins: draw them from
            # a child stream (one draw of ``rng``), so that the noise after them is the same
            # draw in every round, as a reused noise seed means.
            if isinstance(rng, np.random.Generator):
                rng = np.random.default_rng(int(rng.integers(1 << 62)))
            return conditional_round(scaled, l2_bound, rng, **options)

        patch(dp_module, "noise_source", reused_source)
        patch(dp_module.DPRound, "_integer_source", reused_integers)
        patch(ddp_module, "conditional_round", rounding_apart)
    else:  # clip-off

        def unclipped(updates, clip):
            return updates, dp_module.segment_norms(updates.values, updates.indptr)

        def rows_unclipped(values, clip):
            return values, np.ones((*np.shape(values)[:-1], 1))

        patch(dp_module, "clip_row_updates", unclipped)
        patch(fusion_module, "clip_rows_last_axis", rows_unclipped)
    return patches


@contextlib.contextmanager
def inject_dp_fault(kind: str) -> Iterator[None]:
    """Break every DP transport of this process the way ``kind`` names, inside the block.

    Raises:
        ValueError: an unknown fault (naming those that exist).
    """
    saved = []
    for owner, name, value in fault_patches(kind):
        saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)
    try:
        yield
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)
