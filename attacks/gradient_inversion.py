"""FedMF gradient inversion: a user's ratings from the item gradients the server saw.

Chai et al. 2020 ("Secure Federated Matrix Factorization", arXiv 1906.05108) show that a server
holding two consecutive plaintext uploads of one user recovers its ratings; specs/fedmf.md
section 2 gives the algebra. This module replays it on what :mod:`securefed.recsys.fedmf` uploads
(its
module docstring): user ``u``'s item row ``i`` carries ``[p_u g_ui, p_u]`` with

    g_ui = -2 e_ui U_u + 2 mu V_i,        e_ui = r_ui - <U_u, V_i>,

and the user steps ``U_u <- U_u - gamma (-2 sum_{i real} e_ui V_i / N_u + 2 lambda U_u)``
(``N_u = n_u`` real items for ``user_step="mean"``, ``1`` for ``"sum"``), ``local_steps`` times.

Notation (section 2 of the spec). For one upload, ``h_i = g_i - 2 mu V_i = -2 e_i U`` is parallel to
the user vector ``U`` the gradient was computed with. With ``w`` the unit direction of the rows
``h_i`` (leading right singular vector: least squares over all rows) and ``U = a w``:

    c_i = <h_i, w> = -2 a e_i,    m_i = <w, V_i>,    r_i(a) = a m_i - c_i / (2 a).      (R)

Every uploaded row (rated or pseudo) obeys (R) with the same unknown scalar ``a``; pseudo rows
give their virtual rating. One scalar stands between the server and the ratings.

Two rounds, closed form (:func:`invert_two_rounds`). Let round ``t-1`` give ``(w, c, m)`` and
round ``t`` the direction ``z`` of its user vector ``b z``. The user's local steps between the two
user vectors are linear in ``U`` and in the ratings: ``U <- M U + (2 gamma / N) sum_i r_i V_i``
with ``M = (1 - 2 gamma lambda) I - (2 gamma / N) sum_i V_i V_i^T`` over the real rows, ``V`` the
item factors of the round in which the steps happen. Substituting (R) and starting from ``a w``,
``L`` steps give ``U_end = a P_L - Q_L / a`` with

    P_0 = w, Q_0 = 0,  P_{k+1} = M P_k + (2 gamma / N) sum_i m_i V_i,
                       Q_{k+1} = M Q_k + (gamma / N) sum_i c_i V_i.

(For ``L = 1`` and ``gradient_user_vector="before"``, ``P_1 = (1 - 2 gamma lambda) w`` and
``Q_1 = (gamma / N) s`` with the spec's ``s``.) Multiplying ``b z = a P - Q / a`` by ``a`` makes it
linear in ``alpha = a^2`` and ``beta = a b``:

    alpha P - beta z = Q          (dim equations, 2 unknowns: least squares)

so ``a = +-sqrt(alpha)``; the sign that puts (R) on the rating scale wins (``r(-a) = -r(a)``).
Which vectors enter depends on ``gradient_user_vector``:

* ``"before"`` (the spec's equations): round ``t-1``'s gradient uses the vector at the start of
  round ``t-1``, round ``t``'s the vector at the start of round ``t``; the steps in between are
  round ``t-1``'s, with ``V^{t-1}``.
* ``"after"`` (the FedMF code's order): round ``t-1``'s gradient uses the vector after round
  ``t-1``'s steps, which is where round ``t`` starts; round ``t``'s gradient uses the vector after
  round ``t``'s steps. The steps in between are round ``t``'s, with ``V^t``, and the ratings in
  them are still (R) of round ``t-1``. Same closed form, ``V^t`` in ``M`` and the sums.

One round (:func:`invert_one_round`). With ``"after"``, what does one round give? The rows give
``z``, ``c`` and ``m`` for the vector ``U_new = b z`` after the step. The step itself,
``U_new = (1 - 2 gamma lambda) U_old + (2 gamma / N) sum_i (r_i - <U_old, V_i>) V_i``, brings
``dim`` equations but also the ``dim`` unknowns of ``U_old``: for every ``b`` there is exactly one
``U_old`` that fits (``[(1 - 2 gamma lambda) I - (2 gamma / N) sum V_i V_i^T] U_old = U_new -
(2 gamma / N) sum r_i(b) V_i``), so the algebra of one round leaves the one-parameter family
``r_i(b) = b m_i - c_i / (2 b)`` and nothing more (the statistics rows repeat ``sum g`` and
``sum g^2``). What pins ``b`` is that ratings lie on a grid: row ``i`` hits level ``k`` exactly at
the roots of ``m_i b^2 - k b - c_i / 2 = 0``, and the true ``b`` is a root for *every* real row.
We enumerate the roots of a few seed rows for every level, count for each candidate how many rows
land on the grid, keep the best, and polish it by Gauss-Newton on the rows it put on the grid.
The same search works for ``"before"`` (one round, ``a`` in place of ``b``), and it is the
inversion used under hybrid filling: it needs no knowledge of which rows are real, because pseudo
rows only have to *not* conspire at the same ``b`` (their virtual ratings are off the grid under
FedRec; on it under FedRec+, where they simply join the cluster). A spurious candidate needs two
or more rows on the grid at the same wrong ``b`` within ``1e-6`` steps: negligible for users with
at least three real ratings, possible for one or two.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from scipy import stats

from securefed.recsys.data import RatingScale

GRID_TOLERANCE = 1e-6
"""A value is "on the rating grid" within this many rating steps."""

FALSE_ROWS_PER_BLOCK = 0.05
"""Expected number of non-uploaded rows a noisy dense block lets through as uploaded."""

_CANDIDATE_CHUNK = 2_000_000
"""Largest candidates x rows matrix evaluated at once by the grid search."""


class InversionError(ValueError):
    """The upload cannot be inverted (degenerate rows, missing fields, inconsistent rounds)."""


# ------------------------------------------------------------------------------ protocol


@dataclass(frozen=True)
class FedMFProtocol:
    """The public parameters of a FedMF-family run that the attack needs (``view.public``).

    Attributes:
        lr: the users' step size gamma (a round's ``public["lr"]`` overrides it for that round).
        reg_user: lambda.
        reg_item: mu.
        user_step: ``"mean"`` (divide by the real item count) or ``"sum"``.
        gradient_user_vector: ``"before"`` or ``"after"`` the local steps.
        local_steps: L, user-vector steps per round.
        dim: latent dimension.
        n_items: catalogue size (item rows are ``0..n_items-1``; two statistics rows follow).
        scale: the rating scale the protocol learns on: the data's, divided by
            ``rating_unit`` (FedMF's ``rating_unit="scale"``, public).
        variant: ``"fedmf"``, ``"fedrec"`` or ``"fedrec+"``.
        rho: pseudo items per rated item.
        fills: whether clients upload pseudo items.
        pseudo_resampled: whether pseudo sets are drawn afresh every round.
        virtual_on_scale: whether virtual ratings are snapped onto the scale.
        warmup_rounds: T', rounds before virtual ratings become the user's own prediction.
        aggregation: ``"mean"``, ``"sum"`` or ``"fixed"`` (no weight column: rows are read by
            their gradient, see :func:`extract_upload`; the values by
            :mod:`securefed.attacks.offset_inversion`, not by these closed forms).
        offset: ``"none"`` or ``"user_mean"`` (ratings shifted by a private per-user mean; the
            values by :mod:`securefed.attacks.offset_inversion`).
        biases: whether item rows carry the item-bias gradient (``public["item_bias_column"]``,
            column ``dim`` of the row; FedMF with ``biases``).
        reg_bias: the item-bias regulariser each uploaded row carries (``mu_b``, scaled per
            rating under filling as FedMF's ``row_reg_bias``; 0 under ``aggregation="fixed"``,
            where the server applies it).
        virtual_source: where virtual ratings come from (``"hybrid"``, ``"similar"``,
            ``"prediction"``; ``public["virtual_rating"]``).
        reg_user_bias: the L2 weight of the user's own bias step (FedMF's ``reg_bias``).
        user_damping: FedMF's ``user_damping`` ``k_u``: the device's L2 weights are scaled by
            ``1 + k_u / n_u`` for a user with ``n_u`` ratings (:meth:`device_reg`).
        rating_mean: the global mean the run obtained (``biases`` with ``offset="none"``).
    """

    lr: float
    reg_user: float
    reg_item: float
    user_step: str
    gradient_user_vector: str
    local_steps: int
    dim: int
    n_items: int
    scale: RatingScale
    variant: str = "fedmf"
    rho: float = 0.0
    fills: bool = False
    pseudo_resampled: bool = False
    virtual_on_scale: bool = True
    warmup_rounds: int = 0
    aggregation: str = "mean"
    offset: str = "none"
    biases: bool = False
    reg_bias: float = 0.0
    virtual_source: str = "hybrid"
    reg_user_bias: float = 0.0
    rating_mean: float | None = None
    user_damping: float = 0.0
    rating_unit: float = 1.0

    def device_reg(self, reg: float, n_rated: float) -> float:
        """The L2 weight ``reg`` as a user with ``n_rated`` ratings applies it on its device."""
        return reg * (1.0 + self.user_damping / max(float(n_rated), 1.0))

    @property
    def width(self) -> int:
        """Gradient columns of an item row: ``dim``, plus the item bias's with ``biases``."""
        return self.dim + int(self.biases)

    @property
    def values_invertible(self) -> bool:
        """Whether the closed forms apply: an exact client weight and no private offset."""
        return self.aggregation != "fixed" and self.offset == "none"

    REQUIRED = (
        "lr",
        "reg_user",
        "reg_item",
        "user_step",
        "gradient_user_vector",
        "local_steps",
        "dim",
        "n_items",
        "rating_scale",
    )

    @classmethod
    def from_public(cls, public: Mapping[str, object]) -> FedMFProtocol:
        """Read the protocol from ``view.public`` (what ``FedMF.public_parameters()`` stores).

        Raises:
            InversionError: naming the missing keys or the unsupported values.
        """
        missing = [key for key in cls.REQUIRED if key not in public]
        if missing:
            raise InversionError(
                f"view.public lacks {missing}: not the public parameters of a FedMF run"
            )
        user_step = str(public["user_step"])
        vector = str(public["gradient_user_vector"])
        if user_step not in ("mean", "sum"):
            raise InversionError(f"unknown user_step {user_step!r} (expected mean or sum)")
        if vector not in ("before", "after"):
            raise InversionError(f"unknown gradient_user_vector {vector!r} (expected before/after)")
        minimum, maximum, step = (float(x) for x in public["rating_scale"])  # type: ignore[union-attr]
        # FedMF learns on ratings divided by its public unit (rating_unit="scale"): so do we.
        unit = float(public.get("rating_unit_size", 1.0))  # type: ignore[arg-type]
        if not (np.isfinite(unit) and unit > 0):
            raise InversionError(f"rating_unit_size must be finite and > 0, got {unit!r}")
        if unit != 1.0:
            minimum, maximum, step = minimum / unit, maximum / unit, step / unit
        variant = str(public.get("variant", "fedmf"))
        rho = float(public.get("rho", 0.0))  # type: ignore[arg-type]
        fills = variant != "fedmf" and rho > 0
        aggregation = str(public.get("aggregation", "mean"))
        biases = public.get("item_bias_column") is not None
        if biases and int(public["item_bias_column"]) != int(public["dim"]):  # type: ignore[call-overload]
            raise InversionError(
                f"item_bias_column {public['item_bias_column']!r} is not column dim = "
                f"{public['dim']!r}: not the row layout of FedMF with biases"
            )
        reg_bias = float(public.get("reg_bias", 0.0)) if biases else 0.0  # type: ignore[arg-type]
        if fills and public.get("filling_regularisation", "per_rating") == "per_rating":
            reg_bias /= 1.0 + rho
        if aggregation == "fixed":
            reg_bias = 0.0
        return cls(
            lr=float(public["lr"]),  # type: ignore[arg-type]
            reg_user=float(public["reg_user"]),  # type: ignore[arg-type]
            # The regulariser each uploaded row carries (FedMF's row_reg_item when filling).
            reg_item=float(public.get("row_reg_item", public["reg_item"])),  # type: ignore[arg-type]
            user_step=user_step,
            gradient_user_vector=vector,
            local_steps=int(public["local_steps"]),  # type: ignore[call-overload]
            dim=int(public["dim"]),  # type: ignore[call-overload]
            n_items=int(public["n_items"]),  # type: ignore[call-overload]
            scale=RatingScale(minimum, maximum, step),
            variant=variant,
            rho=rho,
            fills=fills,
            pseudo_resampled=bool(public.get("pseudo_items_resampled", fills)),
            virtual_on_scale=bool(public.get("virtual_ratings_on_scale", not fills)),
            warmup_rounds=int(public.get("warmup_rounds", 0)),  # type: ignore[call-overload]
            aggregation=aggregation,
            offset=str(public.get("offset", "none")),
            biases=biases,
            reg_bias=reg_bias,
            reg_user_bias=float(public.get("reg_bias", 0.0)) if biases else 0.0,  # type: ignore[arg-type]
            user_damping=float(public.get("user_damping", 0.0)),  # type: ignore[arg-type]
            rating_unit=unit,
            rating_mean=(
                float(public["rating_mean"])  # type: ignore[arg-type]
                if public.get("rating_mean") is not None
                else None
            ),
            virtual_source=str(
                public.get("virtual_rating", "similar" if variant == "fedrec+" else "hybrid")
            ),
        )


# ------------------------------------------------------------------------------ uploads


@dataclass(frozen=True, eq=False)
class ClientUpload:
    """One client's item gradients as the server can estimate them from a plaintext payload.

    Attributes:
        client: client id.
        items: uploaded item rows, in the order they arrived.
        gradients: ``(len(items), dim)`` estimates of ``g_ui`` (weight divided out).
        noise_std: estimated standard deviation of the noise on each gradient coordinate
            (0 when the payload is exact, e.g. plaintext or central DP).
        bias_gradients: the item-bias gradient of each row (``-2 e_ui + 2 mu_b b_i``, weight
            divided out), when the rows carry one (``protocol.biases``); else ``None``.
        listed: every item row the payload listed, uploaded or not (a weightless payload lists
            rows whose gradient is exactly zero: under hybrid filling, pseudo rows whose virtual
            rating equals the prediction).
    """

    client: int
    items: np.ndarray
    gradients: np.ndarray
    noise_std: float = 0.0
    bias_gradients: np.ndarray | None = None
    listed: np.ndarray | None = None

    @property
    def exact(self) -> bool:
        return self.noise_std == 0.0


def robust_std(values: np.ndarray) -> float:
    """``1.4826 * median(|x - median(x)|)``: the Gaussian scale, unmoved by a minority of rows."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        return 0.0
    return float(1.4826 * np.median(np.abs(values - np.median(values))))


def extract_upload(
    client: int,
    payload: Mapping[str, np.ndarray],
    protocol: FedMFProtocol,
    *,
    noise_std: float | None = None,
) -> ClientUpload:
    """Turn a payload ``{"rows", "values"[, "weight"]}`` into gradient estimates.

    Sparse payloads (FedMF-Part, plaintext) list the uploaded rows: the gradient of row ``i`` is
    ``values[i, :dim] / values[i, dim]`` (the client weight ``p_u`` is the last column; a DP
    clipping factor cancels in the ratio). Dense payloads (every row of the block, e.g. after local
    DP densified them) also carry rows the client did not upload: those are the rows whose weight
    column is indistinguishable from noise. The noise scale is ``noise_std`` when the caller knows
    it (the DP transport's public ``dp_sigma * dp_clip``), else estimated robustly from the weight
    column (:func:`robust_std`: most rows of a dense block are not uploaded); a row counts as
    uploaded when its weight exceeds ``isf(FALSE_ROWS_PER_BLOCK / n_items)`` noise standard
    deviations; with no noise, when it is non-zero. The weight is then estimated as the median
    weight of the uploaded rows.

    Under ``aggregation="fixed"`` the weight column is zero: a row counts as uploaded when its
    gradient is non-zero (dense noisy payloads: when its squared norm exceeds the chi-square
    threshold of ``dim`` noise coordinates), and the gradients are returned as they arrived,
    scaled by the client's unknown clipping factor.

    Args:
        client: the client id.
        payload: its payload fields.
        protocol: the public parameters.
        noise_std: known per-coordinate noise standard deviation of dense payloads.

    Raises:
        InversionError: if fields are missing, shapes are wrong, or nothing was uploaded.
    """
    for name in ("rows", "values"):
        if name not in payload:
            raise InversionError(f"client {client}'s payload has no {name!r} field")
    rows = np.asarray(payload["rows"], dtype=np.int64).reshape(-1)
    values = np.asarray(payload["values"], dtype=np.float64)
    width = protocol.width + 1
    if values.ndim != 2 or values.shape != (len(rows), width):
        layout = "dim + 2: factors, item bias, weight" if protocol.biases else "dim + 1"
        raise InversionError(
            f"client {client}: values of shape {values.shape} do not match {len(rows)} rows x "
            f"{width} columns ({layout})"
        )
    if not np.all(np.isfinite(values)):
        raise InversionError(f"client {client}: payload holds NaN or infinite values")
    n_items = protocol.n_items
    item_rows = rows < n_items
    items, block = rows[item_rows], values[item_rows]
    weights = block[:, -1]
    dense = len(items) == n_items and len(np.unique(items)) == n_items
    if protocol.aggregation == "fixed":
        return _rows_by_gradient(client, items, block[:, :-1], dense, noise_std, protocol.dim)
    noise = 0.0
    if dense:
        noise = robust_std(weights) if noise_std is None else float(noise_std)
    if noise > 0:
        threshold = float(stats.norm.isf(FALSE_ROWS_PER_BLOCK / max(n_items, 2)))
        uploaded = weights > threshold * noise
    else:
        uploaded = weights != 0
    if not np.any(uploaded):
        raise InversionError(f"client {client}: no item row carries a usable weight")
    weight = float(np.median(weights[uploaded]))
    if weight <= 0:
        raise InversionError(f"client {client}: non-positive client weight {weight:g}")
    gradients = block[uploaded, : protocol.dim] / weight
    bias = block[uploaded, protocol.dim] / weight if protocol.biases else None
    return ClientUpload(
        int(client), items[uploaded], gradients, noise / weight, bias, None if dense else items
    )


def _rows_by_gradient(
    client: int,
    items: np.ndarray,
    gradients: np.ndarray,
    dense: bool,
    noise_std: float | None,
    dim: int,
) -> ClientUpload:
    """Uploaded rows of a weightless (``aggregation="fixed"``) payload: the non-zero gradients
    (``gradients``: the factor columns, then the item bias's when there is one)."""
    squared = np.einsum("ij,ij->i", gradients, gradients)
    noise = 0.0
    if dense:
        noise = robust_std(gradients.ravel()) if noise_std is None else float(noise_std)
    if noise > 0:
        threshold = float(
            stats.chi2.isf(FALSE_ROWS_PER_BLOCK / max(len(items), 2), gradients.shape[1])
        )
        uploaded = squared > threshold * noise**2
    else:
        uploaded = squared > 0
    if not np.any(uploaded):
        raise InversionError(f"client {client}: no item row carries a gradient")
    bias = gradients[uploaded, dim] if gradients.shape[1] > dim else None
    return ClientUpload(
        int(client),
        items[uploaded],
        gradients[uploaded, :dim],
        noise,
        bias,
        None if dense else items,
    )


# ------------------------------------------------------------------------------ the algebra


def centred_gradients(
    gradients: np.ndarray, item_factors: np.ndarray, reg_item: float
) -> np.ndarray:
    """``h_i = g_i - 2 mu V_i = -2 e_i U`` (spec section 2, step 1)."""
    return np.asarray(gradients, dtype=np.float64) - 2.0 * reg_item * np.asarray(item_factors)


def user_direction(h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The unit direction ``w`` shared by the rows of ``h`` and ``c_i = <h_i, w>``.

    ``w`` is the leading right singular vector of ``h`` (the least-squares rank-one fit, robust
    to noise), computed as the leading eigenvector of the ``dim x dim`` Gram matrix ``h^T h``
    (much cheaper than an SVD of a tall ``h``; the rank-one gap keeps it accurate), with the sign
    fixed so that its largest-magnitude coordinate is positive.

    Raises:
        InversionError: if every row is zero (the user's errors vanished: nothing to invert).
    """
    h = np.asarray(h, dtype=np.float64)
    if h.ndim != 2 or h.shape[0] == 0:
        raise InversionError("no gradient rows to invert")
    eigenvalues, eigenvectors = np.linalg.eigh(h.T @ h)
    if eigenvalues[-1] <= 1e-300:
        raise InversionError("all gradient rows are zero: the user's direction is undefined")
    w = eigenvectors[:, -1]
    if w[np.argmax(np.abs(w))] < 0:
        w = -w
    return w, h @ w


def ratings_at(a: float, m: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Equation (R): ``r_i = a m_i - c_i / (2 a)``."""
    return a * np.asarray(m) - np.asarray(c) / (2.0 * a)


def step_response(
    w: np.ndarray,
    m: np.ndarray,
    c: np.ndarray,
    step_factors: np.ndarray,
    *,
    lr: float,
    reg_user: float,
    normaliser: float,
    steps: int,
) -> tuple[np.ndarray, np.ndarray]:
    """``(P_L, Q_L)`` with ``U_end = a P_L - Q_L / a`` after ``steps`` user steps from ``a w``.

    Args:
        w: unit direction of the starting user vector.
        m: ``<w, V_i>`` of the real rows (item factors of the round that gave ``w``).
        c: ``c_i`` of the real rows.
        step_factors: the real rows' item factors in the round of the steps.
        lr, reg_user: gamma and lambda.
        normaliser: ``N_u`` (``n_u`` for ``user_step="mean"``, 1 for ``"sum"``).
        steps: L.
    """
    step_factors = np.asarray(step_factors, dtype=np.float64)
    dim = len(w)
    coef = 2.0 * lr / normaliser
    system = (1.0 - 2.0 * lr * reg_user) * np.eye(dim) - coef * step_factors.T @ step_factors
    drift_p = coef * step_factors.T @ np.asarray(m)
    drift_q = 0.5 * coef * step_factors.T @ np.asarray(c)
    p, q = np.asarray(w, dtype=np.float64), np.zeros(dim)
    for _ in range(steps):
        p, q = system @ p + drift_p, system @ q + drift_q
    return p, q


def solve_scale_pair(p: np.ndarray, q: np.ndarray, z: np.ndarray) -> tuple[float, float, float]:
    """Least squares for ``alpha P - beta z = Q``; returns ``(alpha, beta, relative residual)``."""
    design = np.column_stack([p, -np.asarray(z)])
    solution, *_ = np.linalg.lstsq(design, q, rcond=None)
    alpha, beta = (float(x) for x in solution)
    residual = float(np.linalg.norm(design @ solution - q) / max(np.linalg.norm(q), 1e-300))
    return alpha, beta, residual


def scale_misfit(values: np.ndarray, scale: RatingScale) -> float:
    """Mean squared distance of ``values`` to ``[minimum, maximum]`` (0 when all inside)."""
    values = np.asarray(values, dtype=np.float64)
    outside = values - np.clip(values, scale.minimum, scale.maximum)
    return float(np.mean(outside**2)) if values.size else 0.0


def orient_to_scale(a: float, m: np.ndarray, c: np.ndarray, scale: RatingScale) -> float:
    """Pick the sign of ``a`` whose ratings (R) sit on the scale (spec section 2, step 4).

    ``r(-a) = -r(a)``; the sign with the smaller :func:`scale_misfit` wins, ties going to the one
    whose mean is nearer the middle of the scale.
    """
    a = abs(a)
    plus = ratings_at(a, m, c)
    centre = 0.5 * (scale.minimum + scale.maximum)
    key_plus = (scale_misfit(plus, scale), abs(float(np.mean(plus)) - centre))
    key_minus = (scale_misfit(-plus, scale), abs(float(np.mean(-plus)) - centre))
    return a if key_plus <= key_minus else -a


def grid_offsets(values: np.ndarray, scale: RatingScale) -> tuple[np.ndarray, np.ndarray]:
    """Distance (in steps) of each value to its nearest level, and whether that level is on the
    scale's range."""
    positions = (np.asarray(values, dtype=np.float64) - scale.minimum) / scale.step
    nearest = np.rint(positions)
    in_range = (nearest >= 0) & (nearest <= scale.n_levels - 1)
    return np.abs(positions - nearest), in_range


def on_grid(values: np.ndarray, scale: RatingScale, tol: float = GRID_TOLERANCE) -> np.ndarray:
    """Whether each value is a rating of ``scale`` within ``tol`` steps."""
    offset, in_range = grid_offsets(values, scale)
    return (offset <= tol) & in_range


def grid_candidates(m: np.ndarray, c: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """All ``b`` with ``b m_i - c_i / (2 b) = k`` for some row ``i`` and level ``k``.

    The roots of ``m b^2 - k b - c / 2 = 0``, computed in the cancellation-free form
    ``q = (k + sign(k) sqrt(D)) / 2``, ``b = q / m`` and ``b = -c / (2 q)``. Roots of magnitude
    outside ``(1e-12, 1e12)`` (degenerate rows) are dropped.
    """
    m = np.asarray(m, dtype=np.float64)[:, None]
    c = np.asarray(c, dtype=np.float64)[:, None]
    k = np.asarray(levels, dtype=np.float64)[None, :]
    disc = k**2 + 2.0 * m * c
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        root = np.sqrt(np.where(disc >= 0, disc, np.nan))
        sign = np.where(k >= 0, 1.0, -1.0)
        q = 0.5 * (k + sign * root)
        first = q / m
        second = -c / (2.0 * q)
    candidates = np.concatenate([first.ravel(), second.ravel()])
    size = np.abs(candidates)
    candidates = candidates[np.isfinite(candidates) & (size > 1e-12) & (size < 1e12)]
    return np.unique(candidates)


def grid_scores(
    candidates: np.ndarray, m: np.ndarray, c: np.ndarray, scale: RatingScale, tol: float
) -> tuple[np.ndarray, np.ndarray]:
    """For each candidate ``b``: how many rows (R) puts on the grid, and their summed offset."""
    counts = np.zeros(len(candidates), dtype=np.int64)
    offsets = np.zeros(len(candidates))
    chunk = max(1, _CANDIDATE_CHUNK // max(len(m), 1))
    for start in range(0, len(candidates), chunk):
        b = candidates[start : start + chunk, None]
        offset, in_range = grid_offsets(b * m[None, :] - c[None, :] / (2.0 * b), scale)
        hit = (offset <= tol) & in_range
        counts[start : start + chunk] = hit.sum(axis=1)
        offsets[start : start + chunk] = np.where(hit, offset, 0.0).sum(axis=1)
    return counts, offsets


def refine_on_grid(
    b: float, m: np.ndarray, c: np.ndarray, targets: np.ndarray, iterations: int = 8
) -> float:
    """Gauss-Newton on ``sum_i (b m_i - c_i / (2 b) - k_i)^2`` over rows with levels ``k_i``."""
    for _ in range(iterations):
        residual = b * m - c / (2.0 * b) - targets
        slope = m + c / (2.0 * b * b)
        denominator = float(slope @ slope)
        if denominator <= 0:
            break
        update = float(slope @ residual) / denominator
        b -= update
        if abs(update) <= 1e-15 * abs(b):
            break
    return b


# ------------------------------------------------------------------------------ attacks


@dataclass(frozen=True, eq=False)
class Inversion:
    """What one inversion recovered for one client.

    Attributes:
        client: client id.
        round_id: round whose rows ``items`` / ``values`` belong to.
        items: the round's uploaded item rows (upload order).
        values: recovered rating of each row (real rows) or virtual rating (pseudo rows).
        scale_factor: ``a`` with ``U = a w`` for the vector behind the round's gradients.
        direction: ``w``.
        coefficients: ``c_i``.
        projections: ``m_i = <w, V_i>``.
        method: ``"closed_form"`` (two rounds) or ``"rating_grid"`` (one round).
        residual: relative residual of the fit (closed form) or the share of rows left off the
            grid (rating grid).
        support: rows that determined the scalar (closed form: the real rows used; rating grid:
            the rows on the grid at the chosen scalar).
    """

    client: int
    round_id: int
    items: np.ndarray
    values: np.ndarray
    scale_factor: float
    direction: np.ndarray
    coefficients: np.ndarray
    projections: np.ndarray
    method: str
    residual: float
    support: np.ndarray

    @property
    def user_vector(self) -> np.ndarray:
        """The recovered user vector ``a w`` behind this round's gradients."""
        return self.scale_factor * self.direction


def _round_geometry(upload: ClientUpload, item_factors: np.ndarray, reg_item: float):
    """``(w, c, m)`` of one upload (``item_factors``: the broadcast ``V`` of its round)."""
    rows = np.asarray(item_factors)[upload.items]
    w, c = user_direction(centred_gradients(upload.gradients, rows, reg_item))
    return w, c, rows @ w


def invert_two_rounds(
    previous: ClientUpload,
    following: ClientUpload,
    factors_previous: np.ndarray,
    factors_following: np.ndarray,
    protocol: FedMFProtocol,
    *,
    lr: float | None = None,
    real: np.ndarray | None = None,
    round_id: int = -1,
) -> Inversion:
    """Closed-form inversion from rounds ``t-1`` and ``t`` (module docstring; spec section 2).

    Args:
        previous: the client's upload in round ``t-1`` (its rows are the ones recovered).
        following: its upload in round ``t`` (only its direction ``z`` is used).
        factors_previous: ``V^{t-1}``, broadcast at the start of round ``t-1``.
        factors_following: ``V^t``.
        protocol: the public parameters.
        lr: gamma of the round whose steps link the two vectors (``t-1`` for ``"before"``,
            ``t`` for ``"after"``); default ``protocol.lr``.
        real: mask of ``previous.items`` that are real ratings (default: all, as in vanilla
            FedMF). Only real rows enter the user's step.
        round_id: recorded in the result.

    Raises:
        InversionError: if the fit is degenerate (``alpha <= 0``, no real rows).
    """
    gamma = protocol.lr if lr is None else float(lr)
    real = np.ones(len(previous.items), bool) if real is None else np.asarray(real, bool)
    if real.shape != previous.items.shape or not real.any():
        raise InversionError(f"client {previous.client}: no real rows to link the two rounds")
    w, c, m = _round_geometry(previous, factors_previous, protocol.reg_item)
    z, _, _ = _round_geometry(following, factors_following, protocol.reg_item)
    step_round = (
        factors_previous if protocol.gradient_user_vector == "before" else factors_following
    )
    normaliser = float(real.sum()) if protocol.user_step == "mean" else 1.0
    p, q = step_response(
        w,
        m[real],
        c[real],
        np.asarray(step_round)[previous.items[real]],
        lr=gamma,
        reg_user=protocol.device_reg(protocol.reg_user, real.sum()),
        normaliser=normaliser,
        steps=protocol.local_steps,
    )
    alpha, _, residual = solve_scale_pair(p, q, z)
    if not np.isfinite(alpha) or alpha <= 0:
        raise InversionError(
            f"client {previous.client}: the two rounds give a^2 = {alpha:g} <= 0 (rounds not "
            "consecutive for this user, or the payload is too noisy)"
        )
    a = orient_to_scale(float(np.sqrt(alpha)), m, c, protocol.scale)
    return Inversion(
        previous.client,
        round_id,
        previous.items,
        ratings_at(a, m, c),
        a,
        w,
        c,
        m,
        "closed_form",
        residual,
        real,
    )


def invert_one_round(
    upload: ClientUpload,
    item_factors: np.ndarray,
    protocol: FedMFProtocol,
    *,
    tol: float = GRID_TOLERANCE,
    seed_rows: int = 48,
    round_id: int = -1,
) -> Inversion:
    """One-round inversion by the rating grid (module docstring, "One round").

    Candidates for the scalar are the roots that put one of ``seed_rows`` rows (those of largest
    ``|c_i|``, the best conditioned) on one of the scale's levels; each candidate is scored by the
    number of rows on the grid (ties: smaller summed offset), the winner is polished by
    Gauss-Newton on those rows. No knowledge of which rows are real is needed; a seed set made of
    pseudo rows only (probability ``(rho / (1 + rho))^seed_rows``) would miss the true scalar.

    Raises:
        InversionError: if no candidate puts any row on the grid.
    """
    w, c, m = _round_geometry(upload, item_factors, protocol.reg_item)
    scale = protocol.scale
    seeds = np.argsort(-np.abs(c), kind="stable")[: max(1, seed_rows)]
    candidates = grid_candidates(m[seeds], c[seeds], scale.levels)
    if len(candidates) == 0:
        raise InversionError(f"client {upload.client}: no scalar puts any row on the rating grid")
    counts, offsets = grid_scores(candidates, m, c, scale, tol)
    best = np.lexsort((offsets, -counts))[0]
    if counts[best] == 0:
        raise InversionError(f"client {upload.client}: no scalar puts any row on the rating grid")
    b = float(candidates[best])
    hit = on_grid(ratings_at(b, m, c), scale, tol)
    targets = scale.snap(ratings_at(b, m, c))
    b = refine_on_grid(b, m[hit], c[hit], targets[hit])
    values = ratings_at(b, m, c)
    hit = on_grid(values, scale, tol)
    return Inversion(
        upload.client,
        round_id,
        upload.items,
        values,
        b,
        w,
        c,
        m,
        "rating_grid",
        float(1.0 - hit.mean()),
        hit,
    )
