"""Rating values behind a private per-user offset and an unknown clipping factor (the DP preset).

Under :func:`securefed.recsys.fedmf.user_level_dp_config` (``aggregation="fixed"``,
``offset="user_mean"``) user ``u`` models ``d_i = r_i - m_u`` with its own mean rating ``m_u``
(never uploaded), its upload carries no weight column, and a DP transport clips its whole block by
an unknown factor ``s = min(1, C / ||g||)``. Item row ``i`` holds ``s g_i = -2 s e_i U`` with
``e_i = d_i - <U, V_i>`` (the item regulariser is the server's own under ``"fixed"``).

The algebra (module docstring of :mod:`securefed.attacks.gradient_inversion` for the notation).
With ``U = a w``, ``c_i = <s g_i, w> = -2 s a e_i`` and ``m_i = <w, V_i>``,

    d_i = a m_i + e_i = a m_i - c_i / (2 s a).

The user's local steps are those of the plain case with ``d`` in place of ``r``; multiplying
``b z = a P - Q / (s a)`` by ``s a`` gives ``alpha P - beta z = Q`` with ``alpha = s a^2``: the
two-round closed form returns ``s a^2`` instead of ``a^2``. Hence

    d_i = a (m_i - c_i / (2 alpha)) = a x_i,        |a| = sqrt(alpha / s) >= sqrt(alpha).   (S)

The shape ``x`` is known exactly; three things are not (:func:`value_hypotheses`):

* the scale ``|a|``, when the user was clipped (``||s g|| = C``): every ``kappa >= 1`` gives an
  algebraically consistent ``(a, s) = (kappa sqrt(alpha / s_true) ..., s_true / kappa^2)``. An
  unclipped user (``||s g|| < C``, or no DP at all) has ``s = 1`` and ``|a| = sqrt(alpha)``. The
  rating grid pins the scale: the differences ``a (x_i - x_j)`` are whole numbers of steps, so
  ``|a| = k step / (max x - min x)`` for one of ``k = 1 .. n_levels - 1``, and the candidates that
  put every row on the grid remain (several when all the user's rating differences share a factor,
  e.g. only 2s and 4s);
* the sign of ``a``: ``(a, s)`` and ``(-a, s)`` explain the view equally, and the negated ratings
  ``m' - d`` fit the scale's bounds whenever ``m + d`` does (the bounds are symmetric), so the
  sign is never settled by the algebra, the grid or the bounds;
* the shift ``m_u``: any ``m`` that puts ``m + d`` on the grid and inside the bounds (unique only
  when the user's ratings span the whole scale; ``offset="none"`` fixes it at 0).

What settles the sign and the shift is the population (:func:`resolve_population`): the
hypotheses of every user are scored by a rating prior (the attacker's assumed distribution of
ratings over the levels; by default :func:`skewed_prior`, "explicit ratings skew to the top of the
scale") and by how well they agree with the other users' current ratings of the same items (a
rating of a good film is high for most users: a flipped user disagrees with everyone), a few
rounds of coordinate ascent. The item-bias column that FedMF with biases uploads removes the sign
and the scale (:func:`item_bias_inversion`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from securefed.attacks.gradient_inversion import (
    GRID_TOLERANCE,
    ClientUpload,
    FedMFProtocol,
    InversionError,
    solve_scale_pair,
    step_response,
    user_direction,
)
from securefed.recsys.data import RatingScale

__all__ = [
    "ItemBiasInversion",
    "OffsetShape",
    "PopulationResolution",
    "clipped",
    "item_bias_inversion",
    "offset_shape",
    "resolve_population",
    "scale_magnitudes",
    "skewed_prior",
    "value_hypotheses",
]

CLIP_TOLERANCE = 1e-7
"""A block whose norm is within this relative distance of the DP clip was clipped."""

CONSTANT_SHAPE = 1e-9
"""A shape whose spread is below this share of its terms' size means equal ratings."""


@dataclass(frozen=True, eq=False)
class OffsetShape:
    """What the two rounds give about one user's ratings behind an offset: (S).

    Attributes:
        client: client id.
        items: the rows of round ``t-1`` (upload order).
        shape: ``x_i`` with ``d_i = r_i - m_u = a x_i``.
        alpha: ``s a^2`` from the closed form.
        clipped: whether the block was clipped (``|a|`` then unknown; else ``|a| = sqrt(alpha)``).
        residual: relative residual of the closed form's least squares.
        constant: whether every rating of the user is the same (``d = 0``).
    """

    client: int
    items: np.ndarray
    shape: np.ndarray
    alpha: float
    clipped: bool
    residual: float
    constant: bool


def clipped(upload: ClientUpload, clip: float | None) -> bool:
    """Whether a weightless block reached the DP clip (``None``: no clip, never clipped)."""
    if clip is None:
        return False
    norm = float(np.linalg.norm(upload.gradients))
    return norm >= clip * (1.0 - CLIP_TOLERANCE)


def offset_shape(
    previous: ClientUpload,
    following: ClientUpload,
    factors_previous: np.ndarray,
    factors_following: np.ndarray,
    protocol: FedMFProtocol,
    *,
    lr: float | None = None,
    clip: float | None = None,
) -> OffsetShape:
    """The shape ``x`` of (S) from rounds ``t-1`` and ``t`` (module docstring).

    Args:
        previous: the client's weightless upload of round ``t-1`` (rows ``-2 s e_i U``).
        following: its upload of round ``t`` (only its direction is used).
        factors_previous: ``V^{t-1}``.
        factors_following: ``V^t``.
        protocol: the public parameters (the regulariser is the server's under ``"fixed"``).
        lr: gamma of the round whose steps link the two vectors (default ``protocol.lr``).
        clip: the DP clip of round ``t-1`` (``None``: not clipped).

    Raises:
        InversionError: if the fit is degenerate (``alpha <= 0``).
    """
    gamma = protocol.lr if lr is None else float(lr)
    reg = 0.0 if protocol.aggregation == "fixed" else protocol.reg_item
    rows = np.asarray(factors_previous)[previous.items]
    w, c = user_direction(previous.gradients - 2.0 * reg * rows)
    m = rows @ w
    following_rows = np.asarray(factors_following)[following.items]
    z, _ = user_direction(following.gradients - 2.0 * reg * following_rows)
    step_round = (
        factors_previous if protocol.gradient_user_vector == "before" else factors_following
    )
    normaliser = float(len(previous.items)) if protocol.user_step == "mean" else 1.0
    p, q = step_response(
        w,
        m,
        c,
        np.asarray(step_round)[previous.items],
        lr=gamma,
        reg_user=protocol.reg_user,
        normaliser=normaliser,
        steps=protocol.local_steps,
    )
    alpha, _, residual = solve_scale_pair(p, q, z)
    if not np.isfinite(alpha) or alpha <= 0:
        raise InversionError(
            f"client {previous.client}: the two rounds give s a^2 = {alpha:g} <= 0 (rounds not "
            "consecutive for this user, or the payload is too noisy)"
        )
    correction = c / (2.0 * alpha)
    shape = m - correction
    size = float(np.max(np.abs(m)) + np.max(np.abs(correction)))
    spread = float(shape.max() - shape.min())
    return OffsetShape(
        int(previous.client),
        previous.items,
        shape,
        alpha,
        clipped(previous, clip),
        residual,
        spread <= CONSTANT_SHAPE * max(size, 1e-300),
    )


def scale_magnitudes(fit: OffsetShape, scale: RatingScale, tol: float = GRID_TOLERANCE):
    """The admissible ``|a|`` of (S): ``sqrt(alpha)`` when unclipped, else the grid's candidates.

    Clipped: ``|a| = k step / (max x - min x)`` for ``k = 1 .. n_levels - 1``, at least
    ``sqrt(alpha)`` (``s <= 1``), that put every row a whole number of steps from the lowest.
    Unclipped: ``sqrt(alpha)`` if it puts the rows on the grid (else nothing: not this model).
    A constant user's scale is irrelevant (``d = 0``): returns ``[sqrt(alpha)]``.
    """
    root = float(np.sqrt(fit.alpha))
    if fit.constant:
        return np.array([root])
    spread = float(fit.shape.max() - fit.shape.min())
    if fit.clipped:
        candidates = scale.step * np.arange(1, scale.n_levels) / spread
        candidates = candidates[candidates >= root * (1.0 - CLIP_TOLERANCE)]
    else:
        candidates = np.array([root])
    relative = fit.shape - fit.shape.min()
    kept = []
    for magnitude in candidates:
        positions = magnitude * relative / scale.step
        if np.all(np.abs(positions - np.rint(positions)) <= tol):
            kept.append(magnitude)
    return np.array(kept)


def value_hypotheses(
    fit: OffsetShape, scale: RatingScale, *, free_shift: bool = True, tol: float = GRID_TOLERANCE
) -> np.ndarray:
    """Every rating vector of the user that (S), the grid and the bounds admit.

    Args:
        fit: the user's shape.
        scale: the rating scale.
        free_shift: ``True`` under ``offset="user_mean"`` (the shift ``m_u`` is unknown); ``False``
            when ratings are modelled without an offset (``d = r``).
        tol: grid tolerance in steps.

    Returns:
        ``(n_hypotheses, n_rows)`` ratings on the scale's levels, distinct rows, possibly none.
    """
    found: list[np.ndarray] = []
    if fit.constant:
        magnitudes, signs = np.array([0.0]), (1.0,)
    else:
        magnitudes, signs = scale_magnitudes(fit, scale, tol), (1.0, -1.0)
    for magnitude in magnitudes:
        for sign in signs:
            d = sign * magnitude * fit.shape
            if not free_shift:
                if np.all(_on_levels(d, scale, tol)):
                    found.append(scale.snap(d))
                continue
            lowest = scale.minimum - d.min()  # the shift that puts the lowest rating at minimum
            room = scale.maximum - (lowest + d.max())
            for k in range(int(np.floor(room / scale.step + tol)) + 1):
                ratings = lowest + k * scale.step + d
                if np.all(_on_levels(ratings, scale, tol)):
                    found.append(scale.snap(ratings))
    if not found:
        return np.zeros((0, len(fit.shape)))
    return np.unique(np.vstack(found), axis=0)


def _on_levels(values: np.ndarray, scale: RatingScale, tol: float) -> np.ndarray:
    positions = (values - scale.minimum) / scale.step
    nearest = np.rint(positions)
    return (np.abs(positions - nearest) <= tol) & (nearest >= 0) & (nearest <= scale.n_levels - 1)


def skewed_prior(scale: RatingScale) -> np.ndarray:
    """The default rating prior: level ``k`` (0-based) has probability proportional to ``k + 1``.

    The attacker's one assumption about the population: explicit ratings skew to the top of the
    scale (MovieLens 100K: mean 3.53 on 1..5). It breaks the symmetry that the sign leaves; the
    item agreement of :func:`resolve_population` does the rest.
    """
    weights = np.arange(1, scale.n_levels + 1, dtype=np.float64)
    return weights / weights.sum()


@dataclass(frozen=True, eq=False)
class PopulationResolution:
    """The hypothesis chosen for every user, and how ambiguous each user was.

    Attributes:
        chosen: per user (in input order), the index of its chosen hypothesis (-1: none).
        values: per user, the chosen ratings (empty when it had no hypothesis).
        n_hypotheses: per user, how many rating vectors (S), the grid and the bounds admitted.
    """

    chosen: np.ndarray
    values: list[np.ndarray]
    n_hypotheses: np.ndarray


def resolve_population(
    hypotheses: list[np.ndarray],
    items: list[np.ndarray],
    n_items: int,
    scale: RatingScale,
    *,
    prior: np.ndarray | None = None,
    rounds: int = 5,
    shrinkage: float = 3.0,
) -> PopulationResolution:
    """Choose one hypothesis per user by the rating prior and the agreement between users.

    First every user takes its most probable hypothesis under ``prior`` (``sum_i log p(r_i)``).
    Then, ``rounds`` times, each user scores its hypotheses by ``sum_i log p(r_i) -
    sum_i (r_i - mu_i)^2 / (2 v)``, with ``mu_i`` the other users' current mean rating of item
    ``i`` shrunk towards the global mean by ``shrinkage`` pseudo-ratings and ``v`` the current
    mean squared disagreement (at least a quarter step squared), and takes the best.

    Args:
        hypotheses: per user, ``(n_hypotheses, n_rows)`` rating vectors.
        items: per user, the item of each row.
        n_items: catalogue size.
        scale: the rating scale.
        prior: probability of each of ``scale.levels`` (default :func:`skewed_prior`).
        rounds: agreement rounds.
        shrinkage: pseudo-ratings of the shrunk item means.

    Raises:
        ValueError: if ``prior`` does not match the scale or is not a distribution.
    """
    prior = skewed_prior(scale) if prior is None else np.asarray(prior, dtype=np.float64)
    if prior.shape != (scale.n_levels,) or np.any(prior < 0) or not np.isclose(prior.sum(), 1):
        raise ValueError(
            f"prior must be {scale.n_levels} probabilities (one per level of {scale}), "
            f"got {prior!r}"
        )
    log_prior = np.log(np.maximum(prior, 1e-12))
    level_scores = [
        log_prior[np.rint((h - scale.minimum) / scale.step).astype(np.intp)].sum(axis=1)
        if len(h)
        else np.zeros(0)
        for h in hypotheses
    ]
    chosen = np.array([int(np.argmax(s)) if len(s) else -1 for s in level_scores])
    for _ in range(rounds):
        sums, counts = np.zeros(n_items), np.zeros(n_items)
        for user, pick in enumerate(chosen):
            if pick >= 0:
                np.add.at(sums, items[user], hypotheses[user][pick])
                np.add.at(counts, items[user], 1.0)
        if counts.sum() == 0:
            break
        global_mean = sums.sum() / counts.sum()
        squared, n_rows = 0.0, 0
        means = []
        for user, pick in enumerate(chosen):
            if pick < 0:
                means.append(None)
                continue
            mine = hypotheses[user][pick]
            others_sum = sums[items[user]] - mine
            others = counts[items[user]] - 1.0
            mu = (others_sum + shrinkage * global_mean) / (others + shrinkage)
            means.append(mu)
            squared += float(((mine - mu) ** 2).sum())
            n_rows += len(mine)
        variance = max(squared / max(n_rows, 1), 0.25 * scale.step**2)
        changed = False
        for user, mu in enumerate(means):
            if mu is None:
                continue
            scores = level_scores[user] - ((hypotheses[user] - mu) ** 2).sum(axis=1) / (
                2.0 * variance
            )
            best = int(np.argmax(scores))
            changed |= best != chosen[user]
            chosen[user] = best
        if not changed:
            break
    values = [
        h[pick] if pick >= 0 else np.zeros(0) for h, pick in zip(hypotheses, chosen, strict=True)
    ]
    return PopulationResolution(chosen, values, np.array([len(h) for h in hypotheses]))


# ------------------------------------------------------------------------------ item biases


@dataclass(frozen=True, eq=False)
class ItemBiasInversion:
    """One upload with item-bias gradients, inverted up to the user's shift.

    Attributes:
        items: the uploaded rows.
        errors: ``e_i``, read from the bias column.
        user_vector: ``U`` (the vector the gradients were computed with), sign and scale exact.
        clip_factor: ``s`` (the DP clipping factor; 1 without clipping).
        centred: ``r_i - C_u = b_i + <U, V_i> + e_i``, with ``C_u`` the user's constant (global
            mean, user bias, private offset).
        residual: relative residual of the linear fit of the factor columns.
    """

    items: np.ndarray
    errors: np.ndarray
    user_vector: np.ndarray
    clip_factor: float
    centred: np.ndarray
    residual: float


def item_bias_inversion(
    rows: np.ndarray,
    gradients: np.ndarray,
    item_factors: np.ndarray,
    item_biases: np.ndarray,
    *,
    reg_item: float = 0.0,
    reg_bias: float = 0.0,
    clip_factor: float | None = None,
) -> ItemBiasInversion:
    """Invert gradient rows ``s [-2 e_i U + 2 mu V_i, -2 e_i + 2 mu_b b_i]`` (FedMF with biases).

    The upload convention: an item row's gradient has ``dim + 1`` entries, the last being the
    item-bias gradient ``-2 e_i + 2 mu_b b_i`` (the user bias stays on the device); a DP transport
    scales the whole block by ``s``. With ``g_i`` the factor columns and ``beta_i`` the bias
    column as uploaded, ``-2 s e_i = beta_i - 2 s mu_b b_i``, so

        g_i = beta_i U - 2 mu_b b_i W + 2 mu s V_i,        W = s U,

    linear in ``(U, W, s)``: ``dim`` equations per row, least squares over the rows (the columns
    of ``W`` only when ``mu_b > 0``, of ``s`` only when ``mu > 0``). The bias gradient reads the
    error directly: ``U`` comes out with its sign and its length (no grid, no prior), and

        e_i = -(beta_i - 2 s mu_b b_i) / (2 s),    r_i - C_u = b_i + <U, V_i> + e_i,

    with ``C_u`` the user's constant (global mean, user bias, private offset), which the grid
    (``r_i`` on the levels), the bounds and the population settle as in
    :func:`resolve_population`. ``s`` comes from the ``mu`` column, else from ``W = s U``; with
    no regulariser on the upload (``aggregation="fixed"``: the server applies them) ``s`` does not
    show in the rows: pass ``clip_factor`` (1 for an unclipped block, which :func:`clipped`
    tells; a clipped block then leaves ``s`` as the one unknown scalar of ``e``, not resolved
    here), else 1 is assumed.

    Args:
        rows: item index of each gradient row.
        gradients: ``(len(rows), dim + 1)`` gradients as uploaded (weight column removed).
        item_factors: the broadcast ``V`` of the round.
        item_biases: the broadcast item biases ``b`` of the round.
        reg_item: the ``mu`` on the uploaded factor rows (0 under ``aggregation="fixed"``).
        reg_bias: the ``mu_b`` on the uploaded bias entries (0 under ``"fixed"``).
        clip_factor: the block's clipping factor ``s`` if known; ``None``: estimated when a
            regulariser shows it, else 1.

    Raises:
        InversionError: on shape mismatches, when the bias column is zero, or when the
            clipping factor is not positive.
    """
    rows = np.asarray(rows, dtype=np.int64)
    gradients = np.asarray(gradients, dtype=np.float64)
    factors = np.asarray(item_factors, dtype=np.float64)
    biases = np.asarray(item_biases, dtype=np.float64)
    dim = factors.shape[1]
    if gradients.shape != (len(rows), dim + 1):
        raise InversionError(
            f"gradients of shape {gradients.shape} do not match {len(rows)} rows x {dim + 1} "
            "columns (dim factor gradients and the item-bias gradient)"
        )
    g, beta = gradients[:, :dim], gradients[:, dim]
    if not np.any(beta):
        raise InversionError("the bias column carries no error: the user vector is undefined")
    eye = np.eye(dim)
    blocks = [np.kron(beta[:, None], eye)]  # coefficient of U in row-major (row, coordinate)
    if reg_bias > 0:
        blocks.append(np.kron(-2.0 * reg_bias * biases[rows][:, None], eye))
    if reg_item > 0:
        blocks.append(2.0 * reg_item * factors[rows].reshape(-1, 1))
    design = np.hstack(blocks)
    solution, *_ = np.linalg.lstsq(design, g.reshape(-1), rcond=None)
    user_vector = solution[:dim]
    if clip_factor is None:
        if reg_item > 0:
            clip_factor = float(solution[-1])
        elif reg_bias > 0:
            clip_factor = float(solution[dim : 2 * dim] @ user_vector / (user_vector @ user_vector))
        else:
            clip_factor = 1.0
    clip_factor = float(clip_factor)
    if not clip_factor > 0:
        raise InversionError(f"the clipping factor must be positive, got {clip_factor:g}")
    residual = float(
        np.linalg.norm(design @ solution - g.reshape(-1)) / max(np.linalg.norm(g), 1e-300)
    )
    errors = -(beta - 2.0 * clip_factor * reg_bias * biases[rows]) / (2.0 * clip_factor)
    centred = biases[rows] + factors[rows] @ user_vector + errors
    return ItemBiasInversion(rows, errors, user_vector, clip_factor, centred, residual)
