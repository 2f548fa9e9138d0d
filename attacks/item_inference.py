"""Which uploaded rows are a user's rated items: tests against hybrid filling.

FedRec (Lin et al. 2020) hides a user's rated items among ``rho * n_u`` pseudo items with virtual
ratings; specs/fedmf.md section 3 lists why that still leaks. Each function here is one test: it
takes what the inversion (:mod:`securefed.attacks.gradient_inversion`) recovered and returns a
boolean mask
over the rows of one round, ``True`` for "kept as rated", or ``None`` when the test cannot decide
for this user (it then keeps every row).

* :func:`rating_scale_test`: real ratings lie on the rating grid; FedRec's virtual ratings (the
  user's mean, then a clipped prediction) mostly do not. A virtual rating that happens to be on the
  grid (an integer mean, a prediction clipped to an end of the scale) passes.
* :func:`intersection_test`: the rated set is the same in every round; pseudo items drawn afresh
  each round rarely repeat (about ``rho n_u / (n_items - n_u)`` of them do).
* :func:`upload_order_test`: an implementation leak, not a protocol one. If a client lists its
  rated rows, then its pseudo rows, each sorted, the item rows form two ascending runs whose
  lengths are ``n_u`` and ``round(rho n_u)``: the first run is the rated set. Applies only when the
  rows show exactly that shape.
* :func:`virtual_rating_test`: after the warm-up (round >= T'), a pseudo row's virtual rating is
  the user's own prediction ``clip(<U, V_i>)`` (snapped under FedRec+), computed with the vector
  ``U`` at the start of the round, which the inversion recovers (``a w`` for ``"before"``; for
  ``"after"``, the vector behind the previous round's gradients). So every pseudo row has
  ``r_i == virtual(U, V_i)``, while a real rating equals it only by coincidence (it matches the
  user's rounded prediction, or a prediction beyond an end of the scale). Rows that differ are
  surely real. Rows that match mix the pseudo rows with the coincidences; the number of real rows
  ``n_u`` follows from the number of uploaded rows by the public pseudo-count rule
  (:func:`rated_count`), so the attacker keeps or drops the matching rows, whichever gives the
  higher F1 *computable without the truth* (dropping: ``2 d / (d + n_u)`` for ``d`` differing
  rows; keeping all: ``2 n_u / (m + n_u)``). Early in training (predictions beyond an end of the
  scale) and for FedRec's continuous virtual ratings this is nearly exact; for FedRec+ late in
  training, where real ratings often equal the rounded prediction, it falls back to keeping all.
* :func:`update_consistency_test`: "least squares over subsets". Between two rounds the user's
  vector moves by ``(2 gamma / N) sum_{i real} e_i V_i`` (one local step), a known linear
  combination of known vectors ``e_i V_i`` with 0/1 coefficients: with the two scalars ``a`` and
  ``b`` from the inversions, ``sum_i x_i e_i V_i = N (b z - (1 - 2 gamma lambda) a w) / (2 gamma)``,
  ``dim`` equations for the ``m`` unknowns ``x_i``. When ``m <= dim`` and the vectors are
  independent, least squares returns ``x / N``: entries ``0`` or ``1 / N``, whatever ``N`` is, so
  ``x`` is read off without knowing which rows (or how many) are real. This breaks FedRec+'s stable,
  on-scale pseudo sets for light users (``(1 + rho) n_u <= dim``); for heavier users the system is
  under-determined and the test abstains.

:func:`combine_tests` gives the headline prediction: the update-consistency answer where it was
determined, otherwise the conjunction of the other tests.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from securefed.attacks.gradient_inversion import GRID_TOLERANCE, FedMFProtocol, Inversion, on_grid

TEST_NAMES = (
    "rating_scale",
    "intersection",
    "upload_order",
    "virtual_rating",
    "update_consistency",
)
"""The item-inference tests, in the order :func:`combine_tests` reads them."""


def rating_scale_test(
    inversion: Inversion, protocol: FedMFProtocol, *, tol: float = GRID_TOLERANCE
) -> np.ndarray:
    """Rows whose recovered value is a rating of the scale (spec section 3, "on the scale")."""
    return on_grid(inversion.values, protocol.scale, tol)


def intersection_test(items: np.ndarray, other_round_items: np.ndarray) -> np.ndarray:
    """Rows of one round that the same client also uploaded in another round."""
    return np.isin(np.asarray(items), np.asarray(other_round_items))


def ascending_runs(items: np.ndarray) -> np.ndarray:
    """Start offsets of the maximal strictly ascending runs of ``items`` (in upload order)."""
    items = np.asarray(items)
    if len(items) == 0:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([[0], np.flatnonzero(np.diff(items) <= 0) + 1]).astype(np.int64)


def upload_order_test(items: np.ndarray, protocol: FedMFProtocol) -> np.ndarray | None:
    """The first of two ascending runs, when their lengths are ``n_u`` and the pseudo count.

    The pseudo count is ``min(round(rho n_u), n_items - n_u)`` (the protocol's public rule).

    Returns:
        A mask over ``items``, or ``None`` when the rows do not have that shape (sorted or shuffled
        uploads, vanilla FedMF).
    """
    if not protocol.fills:
        return None
    starts = ascending_runs(items)
    if len(starts) != 2:
        return None
    n_first = int(starts[1])
    n_second = len(items) - n_first
    expected = min(int(np.rint(protocol.rho * n_first)), protocol.n_items - n_first)
    if n_second != expected:
        return None
    mask = np.zeros(len(items), dtype=bool)
    mask[:n_first] = True
    return mask


def rated_count(uploaded: int, protocol: FedMFProtocol) -> int | None:
    """``n_u`` with ``n_u + min(round(rho n_u), n_items - n_u) = uploaded`` (``None`` if no
    single ``n_u`` fits): the public pseudo-count rule run backwards."""
    candidates = [
        n
        for n in range(uploaded + 1)
        if n + min(int(np.rint(protocol.rho * n)), protocol.n_items - n) == uploaded
    ]
    return candidates[0] if len(candidates) == 1 else None


def virtual_rating_test(
    items: np.ndarray,
    values: np.ndarray,
    start_vector: np.ndarray,
    item_factors: np.ndarray,
    protocol: FedMFProtocol,
    *,
    n_rated: int | None = None,
    tol: float = GRID_TOLERANCE,
) -> np.ndarray | None:
    """Rows whose recovered value is *not* the user's own virtual rating (module docstring).

    Args:
        items: the round's rows.
        values: their recovered values.
        start_vector: the user's vector at the start of the round (what FedMF predicts with).
        item_factors: the round's broadcast ``V``.
        protocol: the public parameters (scale, whether virtual ratings are snapped).
        n_rated: the user's number of real rows, if known (:func:`rated_count`): then the
            matching rows are dropped only when that gives the higher expected F1.
        tol: match tolerance, in rating steps.

    Returns:
        A mask over ``items``, or ``None`` when keeping every row is the better choice.
    """
    virtual = protocol.scale.clip(np.asarray(item_factors)[items] @ np.asarray(start_vector))
    if protocol.virtual_on_scale:
        virtual = protocol.scale.snap(virtual)
    differs = np.abs(np.asarray(values) - virtual) > tol * protocol.scale.step
    if n_rated is not None and n_rated > 0:
        strict = 2.0 * differs.sum() / (differs.sum() + n_rated)
        keep_all = 2.0 * n_rated / (len(items) + n_rated)
        if keep_all > strict:
            return None
    return differs


def update_consistency_test(
    previous: Inversion,
    following: Inversion,
    factors_previous: np.ndarray,
    factors_following: np.ndarray,
    protocol: FedMFProtocol,
    *,
    lr: float | None = None,
    residual_tol: float = 1e-6,
    binary_tol: float = 1e-3,
    condition_limit: float = 1e8,
) -> np.ndarray | None:
    """Real rows of ``previous`` from the user's step between the two rounds (module docstring).

    With ``U_start = a w`` from ``previous`` and ``U_end = b z`` from ``following`` (both scalars
    from the rating-grid inversion), the step's error on row ``i`` is ``e_i = r_i - a <w, V_i>``
    with the item factors of the round of the step (``V^{t-1}`` for ``"before"``, where
    ``e_i = -c_i / (2 a)``; ``V^t`` for ``"after"``).

    Returns:
        A mask over ``previous.items``, or ``None`` when the test cannot decide: more rows than
        latent dimensions, an ill-conditioned system, several local steps (the step is then not
        linear in the unknown set), a residual above ``residual_tol`` (relative) or a solution that
        is not a scaled 0/1 vector within ``binary_tol``.
    """
    if protocol.local_steps != 1:
        return None
    n_rows, dim = len(previous.items), len(previous.direction)
    if n_rows == 0 or n_rows > dim:
        return None
    gamma = protocol.lr if lr is None else float(lr)
    step_round = (
        factors_previous if protocol.gradient_user_vector == "before" else factors_following
    )
    step_rows = np.asarray(step_round)[previous.items]
    a = previous.scale_factor
    errors = previous.values - a * (step_rows @ previous.direction)
    design = (errors[:, None] * step_rows).T  # dim x rows
    reg_user = protocol.device_reg(protocol.reg_user, len(previous.items))
    target = following.user_vector - (1.0 - 2.0 * gamma * reg_user) * previous.user_vector
    target = target / (2.0 * gamma)
    singular = np.linalg.svd(design, compute_uv=False)
    if singular[-1] <= singular[0] / condition_limit:
        return None
    solution, *_ = np.linalg.lstsq(design, target, rcond=None)
    residual = np.linalg.norm(design @ solution - target) / max(np.linalg.norm(target), 1e-300)
    if residual > residual_tol or solution.max() <= 0:
        return None
    indicator = solution / solution.max()
    if protocol.user_step == "sum":
        indicator = solution
    if np.max(np.abs(indicator - np.rint(indicator))) > binary_tol:
        return None
    mask = np.rint(indicator) == 1
    if not mask.any() or np.any((np.rint(indicator) != 0) & ~mask):
        return None
    return mask


def combine_tests(tests: Mapping[str, np.ndarray | None], n_rows: int) -> np.ndarray:
    """Headline rated rows: the update-consistency answer if determined, else every other test.

    Tests given as ``None`` (could not decide) keep every row.
    """
    exact = tests.get("update_consistency")
    if exact is not None:
        return np.asarray(exact, dtype=bool)
    kept = np.ones(n_rows, dtype=bool)
    for name, mask in tests.items():
        if name != "update_consistency" and mask is not None:
            kept &= np.asarray(mask, dtype=bool)
    return kept
