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
and the scale (:func:`item_bias_inversion`): only the shift is left (:func:`biased_value_maps`).

Hybrid filling under the DP preset (FedRec, FedRec+). The closed form needs the rows of the user's
own step (the real ones), which filling hides. One round suffices instead: every row, real or
pseudo, obeys ``d_i = a m_i - t c_i`` with ``t = 1 / (2 s a)``, and the rows whose values lie on
the rating grid (every real row; FedRec+'s snapped virtual ratings; FedRec's virtual ratings only
where the scale's bounds clipped them) differ by whole steps: ``a (m_i - m_j) - t (c_i - c_j) = k
step``. Two such equations from three seed rows give ``(a, t)`` for each pair of step counts; the
candidate that puts the most rows on the grid gives the ratio ``rho = t / a`` (every multiple
``(k a, k t)`` and the sign flip share it), hence the shape ``x = m - rho c`` and ``s a^2 = 1 / (2
rho)`` of (S) (:func:`offset_shape_from_grid`): the same hypotheses as two rounds give, and the
same population step. Rows off the grid are FedRec's pseudo rows (a virtual rating equal to the
prediction has a zero error, hence a zero or vanishing gradient).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

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
    "BiasedValues",
    "ItemBiasInversion",
    "OffsetShape",
    "PopulationResolution",
    "ValueMaps",
    "biased_value_maps",
    "clipped",
    "grid_phase",
    "hypothesis_maps",
    "item_bias_inversion",
    "offset_shape",
    "offset_shape_from_grid",
    "pin_shift",
    "resolve_population",
    "scale_magnitudes",
    "shape_value_maps",
    "similarity_consistent",
    "skewed_prior",
    "user_bias_shift",
    "value_hypotheses",
]

CLIP_TOLERANCE = 1e-7
"""A block whose norm is within this relative distance of the DP clip was clipped."""

ZERO_ERROR = 1e-9
"""A row whose ``|c_i|`` is below this share of the user's largest has a vanishing error."""

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
        residual: relative residual of the closed form's least squares (the grid search: the
            share of rows it left off the grid).
        constant: whether every rating of the user is the same (``d = 0``).
        on_grid: the rows whose values lie on the rating grid (``None``: every row); only they
            decide the hypotheses (:func:`offset_shape_from_grid`).
    """

    client: int
    items: np.ndarray
    shape: np.ndarray
    alpha: float
    clipped: bool
    residual: float
    constant: bool
    on_grid: np.ndarray | None = None

    @property
    def covered(self) -> np.ndarray:
        """Mask of the rows the hypotheses are decided on (:attr:`on_grid`, default all)."""
        return np.ones(len(self.shape), bool) if self.on_grid is None else self.on_grid


def clipped(upload: ClientUpload, clip: float | None) -> bool:
    """Whether a weightless block reached the DP clip (``None``: no clip, never clipped)."""
    if clip is None:
        return False
    norm = float(np.linalg.norm(upload.gradients))
    if upload.bias_gradients is not None:  # the clip bounds the whole block, bias column too
        norm = float(np.hypot(norm, np.linalg.norm(upload.bias_gradients)))
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
        reg_user=protocol.device_reg(protocol.reg_user, len(previous.items)),
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
    shape = fit.shape[fit.covered]
    spread = float(shape.max() - shape.min())
    if fit.clipped:
        candidates = scale.step * np.arange(1, scale.n_levels) / spread
        candidates = candidates[candidates >= root * (1.0 - CLIP_TOLERANCE)]
    else:
        candidates = np.array([root])
    relative = shape - shape.min()
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
        ``(n_hypotheses, n_rows)`` ratings on the scale's levels (over :attr:`OffsetShape.covered`
        rows), distinct rows, possibly none.
    """
    maps = hypothesis_maps(fit, scale, free_shift=free_shift, tol=tol)
    covered = fit.shape[fit.covered]
    if not len(maps):
        return np.zeros((0, len(covered)))
    return np.unique(scale.snap(maps[:, :1] * covered + maps[:, 1:]), axis=0)


def hypothesis_maps(
    fit: OffsetShape, scale: RatingScale, *, free_shift: bool = True, tol: float = GRID_TOLERANCE
) -> np.ndarray:
    """The affine maps ``r = slope x + intercept`` behind :func:`value_hypotheses`.

    Every admissible (scale, sign, shift) of (S) as one ``(slope, intercept)`` row: the maps that
    put every covered row on the scale's levels. Applied to rows off the grid (pseudo rows) they
    give those rows' virtual ratings under the same hypothesis.

    Returns:
        ``(n_maps, 2)`` slopes and intercepts (possibly none).
    """
    found: list[tuple[float, float]] = []
    if fit.constant:
        magnitudes, signs = np.array([0.0]), (1.0,)
    else:
        magnitudes, signs = scale_magnitudes(fit, scale, tol), (1.0, -1.0)
    shape = fit.shape[fit.covered]
    for magnitude in magnitudes:
        for sign in signs:
            slope = sign * magnitude
            d = slope * shape
            if not free_shift:
                if np.all(_on_levels(d, scale, tol)):
                    found.append((slope, 0.0))
                continue
            found.extend((slope, shift) for shift in _shifts(d, scale, tol))
    return np.array(found, dtype=np.float64).reshape(-1, 2)


def _shifts(d: np.ndarray, scale: RatingScale, tol: float) -> list[float]:
    """Every shift ``C`` that puts all of ``d + C`` on the scale's levels."""
    lowest = scale.minimum - d.min()  # the shift that puts the lowest rating at minimum
    room = scale.maximum - (lowest + d.max())
    shifts = []
    for k in range(int(np.floor(room / scale.step + tol)) + 1):
        if np.all(_on_levels(lowest + k * scale.step + d, scale, tol)):
            shifts.append(float(lowest + k * scale.step))
    return shifts


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
    if clip_factor is not None:
        # s known: h_i = g_i - 2 mu s V_i = beta'_i U with beta'_i = beta_i - 2 s mu_b b_i, a
        # rank-one least squares in closed form.
        clip_factor = float(clip_factor)
        if not clip_factor > 0:
            raise InversionError(f"the clipping factor must be positive, got {clip_factor:g}")
        h = g - 2.0 * reg_item * clip_factor * factors[rows]
        centred_beta = beta - 2.0 * clip_factor * reg_bias * biases[rows]
        denominator = float(centred_beta @ centred_beta)
        if denominator <= 0:
            raise InversionError("the bias column carries no error: the user vector is undefined")
        user_vector = centred_beta @ h / denominator
        fit = np.outer(centred_beta, user_vector)
        residual = float(np.linalg.norm(fit - h) / max(np.linalg.norm(g), 1e-300))
        errors = -centred_beta / (2.0 * clip_factor)
        centred = biases[rows] + factors[rows] @ user_vector + errors
        return ItemBiasInversion(rows, errors, user_vector, clip_factor, centred, residual)
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


# ------------------------------------------------------------------------------ value maps


@dataclass(frozen=True, eq=False)
class ValueMaps:
    """One user's rows, known up to one of a few affine maps ``r = slope * basis + intercept``.

    What the population step (:func:`resolve_population`) chooses among, whatever gave the
    basis: the shape of (S) (the maps: scale, sign and shift) or the centred ratings that the
    item-bias column gives (the maps: shifts only).

    Attributes:
        items: the user's rows (upload order).
        basis: one value per row.
        covered: the rows on the rating grid; only they decide (pseudo rows off the grid get
            the chosen map's value, their virtual rating, but are not scored by the prior).
        maps: ``(n_maps, 2)`` admissible slopes and intercepts.
        scored: the covered rows the population scores (``None``: every covered row); FedRec+'s
            rows that look like similarity means are left out (:func:`similarity_consistent`).
    """

    items: np.ndarray
    basis: np.ndarray
    covered: np.ndarray
    maps: np.ndarray
    scored: np.ndarray | None = None

    @property
    def scored_rows(self) -> np.ndarray:
        """Mask of the rows the population step scores the maps on."""
        if self.scored is None or not np.any(self.scored):
            return self.covered
        return self.scored

    def values(self, scale: RatingScale) -> np.ndarray:
        """``(n_maps, n_rows)``: every row's value under each map (covered rows snapped)."""
        values = self.maps[:, :1] * self.basis + self.maps[:, 1:]
        values[:, self.covered] = scale.snap(values[:, self.covered])
        return values


def shape_value_maps(
    fit: OffsetShape, scale: RatingScale, *, free_shift: bool = True, tol: float = GRID_TOLERANCE
) -> ValueMaps:
    """The hypotheses of (S) as :class:`ValueMaps` (:func:`hypothesis_maps`)."""
    maps = hypothesis_maps(fit, scale, free_shift=free_shift, tol=tol)
    return ValueMaps(fit.items, fit.shape, fit.covered, maps)


def grid_phase(values: np.ndarray, step: float, tol: float = GRID_TOLERANCE) -> np.ndarray:
    """The rows that share the most common position between grid points (mask).

    Rows whose values differ by whole steps share their phase ``(value / step) mod 1``; the phase
    that most rows share is the grid's (ties: the first row's), among the phases held by rows at
    two levels or more when there is one. Under filling the minority are pseudo rows whose
    virtual ratings are off the scale.
    """
    positions = np.asarray(values, dtype=np.float64) / step
    best, best_key = np.zeros(len(positions), bool), (False, -1)
    for anchor in positions:
        offset = positions - anchor
        hit = np.abs(offset - np.rint(offset)) <= tol
        # A phase whose rows all sit at one value fixes nothing (FedRec's warm-up pseudo rows,
        # all at the user's mean): a phase with two levels or more wins over it.
        levels = np.rint(offset[hit])
        key = (bool(levels.max() > levels.min()), int(hit.sum()))
        if key > best_key:
            best, best_key = hit, key
        if best_key == (True, len(positions)):
            break
    return best


def offset_shape_from_grid(
    upload: ClientUpload,
    item_factors: np.ndarray,
    protocol: FedMFProtocol,
    *,
    clip: float | None = None,
    tol: float = GRID_TOLERANCE,
    seed_rows: int = 12,
    min_rows: int = 4,
) -> OffsetShape:
    """The shape ``x`` of (S) from one weightless round, by the rating grid (module docstring).

    Every row obeys ``d_i = a m_i - t c_i``; rows on the grid differ by whole steps. For seed
    triples among the ``seed_rows`` rows of largest ``|c_i|`` and every pair of step counts
    ``(k_1, k_2)`` (each within ``+-(n_levels - 1)``), solve ``a dm - t dc = k step`` for ``(a,
    t)``, count the rows it puts a whole number of steps from the first seed, keep the best,
    refine ``(a, t)`` by least squares on its rows, and return the shape ``m - (t / a) c`` with
    ``alpha = a / (2 t)`` (``s a^2``). Needs no knowledge of which rows are real.

    Args:
        upload: the client's weightless upload (rows ``-2 s e_i U``).
        item_factors: the round's broadcast ``V``.
        protocol: the public parameters.
        clip: the DP clip of the round (``None``: not clipped).
        tol: grid tolerance in steps.
        seed_rows: rows the seeds are drawn from.
        min_rows: fewest rows on the grid for a shape (three are always fitted exactly).

    Raises:
        InversionError: when no candidate puts ``min_rows`` rows on the grid, when candidates
            that do disagree on the shape, or when the fit says ``s a^2 <= 0``.
    """
    reg = 0.0 if protocol.aggregation == "fixed" else protocol.reg_item
    rows = np.asarray(item_factors)[upload.items]
    w, c = user_direction(upload.gradients - 2.0 * reg * rows)
    m = rows @ w
    n = len(c)
    if n < min_rows:
        raise InversionError(
            f"client {upload.client}: {n} rows, fewer than the {min_rows} the grid search needs"
        )
    size = float(np.max(np.abs(m)))
    ratio, _, _, _ = np.linalg.lstsq(c[:, None], m, rcond=None)
    if np.max(np.abs(m - ratio[0] * c)) <= CONSTANT_SHAPE * max(size, 1e-300) and ratio[0] > 0:
        # d = 0 for every row (a constant user): c is proportional to m.
        rho = float(ratio[0])
        return OffsetShape(
            int(upload.client), upload.items, m - rho * c, 1.0 / (2.0 * rho),
            clipped(upload, clip), 0.0, True,
        )  # fmt: skip
    step, levels = protocol.scale.step, protocol.scale.n_levels
    # A row with a vanishing error is a virtual rating equal to the prediction (FedRec's pseudo
    # rows): it carries no step count and would let a huge t fit anything. Left off the grid.
    erring = np.abs(c) > ZERO_ERROR * np.max(np.abs(c))
    if erring.sum() < min_rows:
        raise InversionError(
            f"client {upload.client}: {int(erring.sum())} rows with an error, fewer than {min_rows}"
        )
    # Rows with d = 0 share the ratio m_i / c_i (= rho): FedRec's warm-up pseudo rows (virtual
    # rating = the user's own mean). A large such group would outvote the real rows: off the grid.
    with_error = erring.copy()
    erring &= ~_zero_offset_group(m, c, erring, max(min_rows, int(np.ceil(0.25 * n))))
    if erring.sum() < min_rows:
        raise InversionError(
            f"client {upload.client}: {int(erring.sum())} rows off the user's mean, fewer than "
            f"{min_rows}"
        )
    where = np.flatnonzero(erring)
    seeds = where[_spread_seeds(m[where], c[where], seed_rows)]
    counts = np.arange(-(levels - 1), levels)
    k1, k2 = (x.ravel() for x in np.meshgrid(counts, counts, indexing="ij"))
    nonzero = (k1 != 0) | (k2 != 0)
    k1, k2 = k1[nonzero], k2[nonzero]
    best_count, best_hit, disagree = 0, None, False
    best_fit = (0.0, 0.0, 0)
    for first, second, third in _seed_triples(len(seeds)):
        p, q, r = seeds[first], seeds[second], seeds[third]
        system = np.array([[m[q] - m[p], -(c[q] - c[p])], [m[r] - m[p], -(c[r] - c[p])]])
        if abs(np.linalg.det(system)) <= 1e-12 * max(np.abs(system).max() ** 2, 1e-300):
            continue
        solutions = np.linalg.solve(system, step * np.vstack([k1, k2]).astype(np.float64))
        a, t = solutions
        usable = a != 0
        a, t = a[usable], t[usable]
        offsets = (a[:, None] * (m - m[p]) - t[:, None] * (c - c[p])) / step
        hit = (np.abs(offsets - np.rint(offsets)) <= tol) & erring
        span = np.where(hit, offsets, np.nan)
        with np.errstate(invalid="ignore"):
            width = np.nanmax(span, axis=1) - np.nanmin(span, axis=1)
        # Rows all at one level fix nothing (FedRec's warm-up pseudo rows: d = 0 for each).
        hit &= ((width <= levels - 1 + tol) & (width >= 1 - tol))[:, None]
        scores = hit.sum(axis=1)
        top = int(scores.max())
        if top < best_count:
            continue
        winners = np.flatnonzero(scores == top)
        # Candidates that put the same rows on the grid are one solution (multiples, rounding).
        agree = bool(np.all(hit[winners] == hit[winners[0]]))
        if top > best_count:
            best_count, best_hit = top, hit[winners[0]]
            best_fit = (float(a[winners[0]]), float(t[winners[0]]), int(p))
            disagree = not agree
        elif not (agree and np.array_equal(hit[winners[0]], best_hit)):
            disagree = True
        if best_count == len(where) and not disagree:
            break
    if best_count < min_rows or best_hit is None:
        raise InversionError(
            f"client {upload.client}: no (a, t) puts {min_rows} rows on the rating grid"
        )
    if disagree:
        raise InversionError(
            f"client {upload.client}: shapes that put {best_count} rows on the grid disagree"
        )
    rho = _refine_ratio(m, c, best_hit, *best_fit, step)
    # The rows set aside as d = 0 rejoin the grid where they sit whole steps from the others.
    a, t, seed = best_fit
    offsets = (a * (m - m[seed]) - t * (c - c[seed])) / step
    best_hit = best_hit | (with_error & (np.abs(offsets - np.rint(offsets)) <= tol))
    best_count = int(best_hit.sum())
    if not np.isfinite(rho) or rho <= 0:
        raise InversionError(
            f"client {upload.client}: the grid gives s a^2 = {1 / (2 * rho):g} <= 0"
        )
    shape = m - rho * c
    return OffsetShape(
        int(upload.client),
        upload.items,
        shape,
        1.0 / (2.0 * rho),
        clipped(upload, clip),
        float(1.0 - best_count / n),
        False,
        best_hit,
    )


def _zero_offset_group(
    m: np.ndarray, c: np.ndarray, usable: np.ndarray, at_least: int, rtol: float = 1e-9
) -> np.ndarray:
    """The largest group of rows sharing ``m_i / c_i`` (rows with ``d_i = 0``), if it has at least
    ``at_least`` rows; else no row (mask)."""
    group = np.zeros(len(m), bool)
    where = np.flatnonzero(usable)
    if len(where) < at_least:
        return group
    ratios = m[where] / c[where]
    order = np.argsort(ratios, kind="stable")
    sorted_ratios = ratios[order]
    close = np.abs(np.diff(sorted_ratios)) <= rtol * np.abs(sorted_ratios[1:])
    starts = np.flatnonzero(np.concatenate([[True], ~close]))
    lengths = np.diff(np.concatenate([starts, [len(sorted_ratios)]]))
    best = int(np.argmax(lengths))
    if lengths[best] >= at_least:
        group[where[order[starts[best] : starts[best] + lengths[best]]]] = True
    return group


def _spread_seeds(m: np.ndarray, c: np.ndarray, count: int) -> np.ndarray:
    """Seed rows that likely hold different ratings: the largest ``|c_i|`` (best conditioned)
    first, then the extremes and quantiles of ``c`` and ``m`` (rows of one rating level
    cannot fix ``(a, t)``: their differences are zero steps)."""
    order_c, order_m = np.argsort(c, kind="stable"), np.argsort(m, kind="stable")
    quantiles = np.linspace(0, len(c) - 1, max(2, count // 2)).round().astype(np.intp)
    candidates = np.concatenate(
        [
            np.argsort(-np.abs(c), kind="stable")[:3],
            order_c[quantiles],
            order_m[quantiles],
        ]
    )
    _, first = np.unique(candidates, return_index=True)
    return candidates[np.sort(first)][: max(3, count)]


def _seed_triples(n_seeds: int):
    """Seed triples ``(0, 1, 2), (0, 1, 3), ...``: the best-conditioned rows first."""
    for third in range(2, n_seeds):
        for second in range(1, third):
            yield 0, second, third
    for third in range(3, n_seeds):
        yield 1, 2, third


def _refine_ratio(
    m: np.ndarray, c: np.ndarray, hit: np.ndarray, a: float, t: float, seed: int, step: float
) -> float:
    """``rho = t / a`` refined by least squares on the rows the candidate put on the grid.

    With each row's step count ``k_i`` fixed by the candidate ``(a, t)`` (relative to row
    ``seed``), ``a (m_i - m_seed) - t (c_i - c_seed) = k_i step`` is linear in ``(a, t)``.
    """
    dm, dc = m[hit] - m[seed], c[hit] - c[seed]
    k = np.rint((a * dm - t * dc) / step)
    solution, *_ = np.linalg.lstsq(np.column_stack([dm, -dc]), k * step, rcond=None)
    refined_a, refined_t = solution
    return float(refined_t / refined_a) if refined_a != 0 else t / a


# ------------------------------------------------------------------------------ with biases


@dataclass(frozen=True, eq=False)
class BiasedValues:
    """One user's upload with item biases, inverted up to its shift.

    Attributes:
        inversion: what :func:`item_bias_inversion` read (user vector, errors, ``r - C_u``).
        maps: the shifts (slope 1) that put the covered rows on the grid and in the bounds.
        clip_factor_source: ``"weight"`` (divided out), ``"unclipped"``, ``"grid"`` (a clipped
            weightless block: ``s`` from the rating grid).
    """

    inversion: ItemBiasInversion
    maps: ValueMaps
    clip_factor_source: str


def biased_value_maps(
    upload: ClientUpload,
    item_factors: np.ndarray,
    item_biases: np.ndarray,
    protocol: FedMFProtocol,
    *,
    clip: float | None = None,
    tol: float = GRID_TOLERANCE,
) -> BiasedValues:
    """The ratings of one biased upload up to the user's constant (the shift).

    :func:`item_bias_inversion` gives ``U`` with its sign and length and ``r_i - C_u`` exactly
    once the clipping factor ``s`` is known: 1 when the weight column divided it out
    (``aggregation`` other than ``"fixed"``) or when a weightless block was not clipped. A clipped
    weightless block leaves ``t = 1 / (2 s)`` in ``r_i - C_u = b_i + <U, V_i> - t beta_i``: the
    value of ``t >= 1/2`` that puts the most rows whole steps apart is taken (seed pairs of rows,
    every step count). The shift ``C_u`` (global mean or private offset, plus the user bias) is
    left to the population: every shift that puts the grid's rows on the levels is a map.

    Raises:
        InversionError: when the rows carry no bias column or the inversion is degenerate.
    """
    if upload.bias_gradients is None:
        raise InversionError(f"client {upload.client}: the rows carry no item-bias column")
    rows = np.column_stack([upload.gradients, upload.bias_gradients])
    fixed = protocol.aggregation == "fixed"
    source = "weight"
    clip_factor = 1.0
    if fixed:
        source = "grid" if clipped(upload, clip) else "unclipped"
    inversion = item_bias_inversion(
        upload.items,
        rows,
        item_factors,
        item_biases,
        reg_item=0.0 if fixed else protocol.reg_item,
        reg_bias=0.0 if fixed else protocol.reg_bias,
        clip_factor=clip_factor,
    )
    if source == "grid":
        t = _clip_by_grid(inversion, upload.bias_gradients, protocol.scale, tol)
        inversion = item_bias_inversion(
            upload.items, rows, item_factors, item_biases, clip_factor=1.0 / (2.0 * t)
        )
    scale = protocol.scale
    covered = grid_phase(inversion.centred, scale.step, tol)
    shifts = _shifts(inversion.centred[covered], scale, tol)
    maps = np.array([(1.0, shift) for shift in shifts], dtype=np.float64).reshape(-1, 2)
    values = ValueMaps(upload.items, inversion.centred, covered, maps)
    return BiasedValues(inversion, values, source)


def _clip_by_grid(
    unit: ItemBiasInversion, beta: np.ndarray, scale: RatingScale, tol: float, seed_rows: int = 8
) -> float:
    """``t = 1 / (2 s)`` of a clipped weightless biased block, from the rating grid.

    ``unit`` was read with ``s = 1``: its centred values are ``x_i - beta_i / 2`` with ``x_i =
    b_i + <U, V_i>``. For seed pairs and step counts ``k``, ``t = ((x_i - x_j) - k step) / (beta_i
    - beta_j)``; the ``t >= 1/2`` that puts the most rows whole steps apart wins.

    Raises:
        InversionError: when no ``t`` puts three rows on the grid.
    """
    x = unit.centred + 0.5 * beta
    order = np.argsort(-np.abs(beta), kind="stable")[: max(2, seed_rows)]
    counts = np.arange(-(scale.n_levels - 1), scale.n_levels)
    best_t, best_count = np.nan, 0
    for first in order[:2]:
        for other in order:
            if other == first or beta[other] == beta[first]:
                continue
            t = ((x[other] - x[first]) - counts * scale.step) / (beta[other] - beta[first])
            t = t[t >= 0.5 * (1.0 - CLIP_TOLERANCE)]
            if not len(t):
                continue
            offsets = ((x - x[first])[None, :] - t[:, None] * (beta - beta[first])) / scale.step
            scores = (np.abs(offsets - np.rint(offsets)) <= tol).sum(axis=1)
            at = int(np.argmax(scores))
            if scores[at] > best_count:
                best_t, best_count = float(t[at]), int(scores[at])
    if best_count < 3:
        raise InversionError("no clipping factor puts three rows of the block on the rating grid")
    return best_t


def similarity_consistent(
    maps: ValueMaps, item_factors: np.ndarray, scale: RatingScale
) -> np.ndarray:
    """Rows whose value equals the similarity-weighted mean of the user's other rows (mask).

    FedRec+'s virtual rating of a pseudo item ``j`` is ``snap(sum_i (1 + cos_ij) r_i / sum_i (1
    + cos_ij))`` over the user's rated items, with ``cos`` between the rows of ``V``
    (:func:`securefed.recsys.filling.similarity_weighted_ratings`). The server does not know which
    rows are rated, so the mean here runs over every other row; pseudo rows, themselves such
    means, pull it little. A row is consistent under a map when its value is within half a step
    of that mean; the mask is the union over the maps. The weighted mean commutes with the
    affine maps (sign and shift), so the test cannot choose between them; what it does is set
    apart the rows that carry the least about the sign: pseudo rows, and real ratings at the
    user's own mean.
    """
    from securefed.recsys.filling import normalise_rows

    encoded = normalise_rows(np.asarray(item_factors, dtype=np.float64)[maps.items])
    weights = 1.0 + encoded @ encoded.T
    np.fill_diagonal(weights, 0.0)
    totals = weights.sum(axis=1)
    consistent = np.zeros(len(maps.items), bool)
    if len(maps.items) < 2:
        return consistent
    for values in maps.values(scale):
        mean = weights @ values / np.where(totals > 0, totals, 1.0)
        consistent |= np.abs(values - mean) < 0.5 * scale.step
    return consistent


def user_bias_shift(
    previous: BiasedValues,
    following: BiasedValues,
    protocol: FedMFProtocol,
    *,
    lr: float,
    real: np.ndarray | None = None,
) -> float:
    """The user's constant ``C_u = mu + b_u`` of round ``t-1``, from two rounds (no offset).

    Both rounds give ``r_i - mu - b_u`` exactly on the items uploaded in both, so their
    difference is ``D = b_u^t - b_u^{t-1}``; the user's own bias step reads ``b_u^t = b_u^{t-1} -
    gamma (-2 sum_i e_i / n_u + 2 mu_b b_u^{t-1})`` with the errors ``e_i`` of round ``t-1``, so
    ``b_u^{t-1} = (2 gamma sum_i e_i / n_u - D) / (2 gamma mu_b)`` (``mu_b (1 + k_u / n_u)`` with
    user damping ``k_u``). For vanilla FedMF (every row
    rated), one step a round from the vector before it (``gradient_user_vector="before"``);
    under filling, ``real`` names the rated rows of round ``t-1`` (FedRec: the rows on the grid
    in both rounds), whose errors alone enter the step.

    Raises:
        InversionError: when this does not apply (filling, no global mean, ``mu_b = 0``, other
            step orders) or the two rounds share no item.
    """
    if (
        (protocol.fills and real is None)
        or protocol.offset != "none"
        or protocol.rating_mean is None
        or protocol.reg_user_bias <= 0
        or protocol.gradient_user_vector != "before"
        or protocol.local_steps != 1
    ):
        raise InversionError("the user-bias step does not pin this user's shift")
    first, second = previous.inversion, following.inversion
    real = np.ones(len(first.items), bool) if real is None else np.asarray(real, bool)
    if not np.any(real):
        raise InversionError("no rated row to link the user-bias step")
    _, at_first, at_second = np.intersect1d(first.items[real], second.items, return_indices=True)
    if not len(at_first):
        raise InversionError("the two rounds share no item: the user-bias step is not linked")
    drift = float(np.median(first.centred[real][at_first] - second.centred[at_second]))
    n_real = float(real.sum()) if protocol.user_step == "mean" else 1.0
    pull = 2.0 * lr * float(np.sum(first.errors[real])) / n_real
    reg = protocol.device_reg(protocol.reg_user_bias, real.sum())
    bias = (pull - drift) / (2.0 * lr * reg)
    return protocol.rating_mean + bias


def pin_shift(maps: ValueMaps, constant: float, scale: RatingScale, tol: float = 1e-6) -> ValueMaps:
    """Keep the one map whose intercept is ``constant`` (within ``tol`` steps), if there is one."""
    close = np.abs(maps.maps[:, 1] - constant) <= tol * scale.step
    if not np.any(close):
        return maps
    return replace(maps, maps=maps.maps[close][:1])
