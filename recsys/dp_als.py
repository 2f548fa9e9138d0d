"""DP-ALS: private alternating least squares in the billboard (joint DP) model, over any transport.

Chien, Jain, Krichene, Rendle, Song, Thakurta and Zhang, "Private Alternating Least Squares:
Practical Private Matrix Completion with Tighter Rates" (ICML 2021); specs/private-learning.md.
The server releases the item side; each user solves its own vector and bias on its device from
what was released and never uploads them. Everything the server obtains is a sum over users,
taken through the aggregation seam (``open_round`` / ``submit_batch`` / ``result``), so the same
code runs in plaintext, under secure aggregation, CKKS or any DP placement.

Releases (one transport round each; all of one block shape ``(n_items, width)``):

* **Round 0, the bias release.** Each user uploads, for at most ``max_bias_ratings`` of its
  ratings (chosen uniformly on the device), the row ``[clip(r - m, -G_b, G_b), 1]`` at the item,
  ``m`` the scale's midpoint (public). The server reads the global mean
  ``mu = m + sum_i s_i / sum_i n_i`` and the damped item biases
  ``b_i = (s_i - n_i (mu - m)) / (n_i + item_damping)`` (Koren 2010, section 2.1; released counts
  are clamped at 0). Each user then sets its own bias ``b_u`` from all its ratings, on its
  device (``user_damping``): it costs no privacy, nothing about it leaves the device.
* **Rounds 1..passes, the item passes.** Each user solves
  ``u = argmin sum_i (e_ui - u.v_i)^2 + reg_user |u|^2`` over all its ratings, with
  ``e_ui = r_ui - mu - b_u - b_i`` (closed form), clips ``u`` to norm ``C_u`` and uploads, for at
  most ``max_ratings`` of its rated items (the most frequent by the released counts: frequent
  items are the ones the noise leaves learnable, as in Chien et al.'s sampling), the row
  ``[upper triangle of u u^T, clip(e, -G, G) u]``. The server solves each item in closed form,
  ``v_i = (psd(A_i) + (reg_item + noise_shift * s * sqrt(d)) I)^-1 b_i``, where ``psd`` clips the
  noisy ``A_i``'s eigenvalues at 0 and ``s`` is the noise std of the release measured on its
  probe column (below): a symmetric Gaussian matrix with entries of std ``s`` has eigenvalues in
  about ``[-2 s sqrt(d), 2 s sqrt(d)]``, so the shift keeps the solve away from noise-made
  directions. Items released with fewer than ``min_count`` ratings keep ``v_i = 0``: they are
  predicted from their bias.
* After the last pass every user solves its vector once more from the final ``V`` (on device).
  Prediction: ``mu + b_u + b_i + u.v_i``, clipped to the scale.

Every row carries a last **probe column** that every user leaves at 0: its released sum is the
release's noise alone, from which the server reads ``s`` (0 without noise). The server so never
asks which transport it has.

Sensitivity (add/remove one user, L2, one release): the packed upper triangle of ``u u^T`` has
squared norm ``(|u|^4 + sum_j u_j^4) / 2 <= |u|^4`` (equality for ``u`` along an axis), so a row
is at most ``C_u sqrt(C_u^2 + G^2)`` and a user's ``max_ratings`` rows at most
``sqrt(k) C_u sqrt(C_u^2 + G^2) <= sqrt(k) (C_u^2 + G C_u)`` (the paper's bound); the bias rows at
most ``sqrt(k_b (G_b^2 + 1))`` (:func:`pass_sensitivity`, :func:`bias_sensitivity`). Uploads are
divided by the release's bound, so every user's whole upload has L2 norm at most 1: a DP
transport's clip of 1 (its default) is then never active, and its noise multiplier is the noise
on the sum over the sensitivity. Each release charges the transport's ledger once; the budget is
split evenly over the ``1 + passes`` releases by the transport's calibration (its
``total_rounds``). ``passes = 0`` is the private damped-bias model: the whole budget on the bias
release (:func:`private_bias_config`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace

import numpy as np

from securefed import RowUpdates, SeedTree, Transport
from securefed.recsys.data import Ratings, RatingScale
from securefed.recsys.sparse_rows import rating_rows, segment_sum
from securefed.transport import TransportNeeds, require_capabilities

BIAS_ROUND = 0
WEIGHTINGS = ("per_user", "uniform")


@dataclass(frozen=True)
class DPALSConfig:
    """Hyper-parameters of :class:`DPALS` (module docstring for the algorithm).

    The defaults were chosen on MovieLens 100K u1: 10% of each user's training ratings held
    out (``holdout_split``, generator seed 0), central ``dp`` at epsilon 8, the mean validation
    RMSE of seeds 0 and 1, the lowest among the configurations with at least one pass that
    were tried (docs/dp_als.md lists them); ``noise_damping`` on the same holdout at the
    frontier's two ends, epsilon 0.5 and 8 (0 lets items whose noisy count is near 0 take
    biases of several stars: validation RMSE 1.51 at epsilon 0.5, against 1.03 with 5). The test
    folds were never looked at.

    Attributes:
        dim: latent dimension ``d``.
        passes: item releases after the bias release (0: the private bias model).
        reg_user: ``lambda``, the device's ridge weight on its vector.
        reg_item: ``lambda'``, the server's ridge weight on an item.
        noise_shift: ``c``: the server adds ``c * s * sqrt(d)`` to each item's diagonal, ``s``
            the measured noise std of the release's entries.
        user_clip: ``C_u``, the norm bound of a user's vector in the sums.
        rating_clip: ``G``, the bound of a centred residual in the sums.
        bias_clip: ``G_b``, the bound of ``r - midpoint`` in the bias release.
        max_ratings: ``k``, the most items one user adds to the sums of one pass.
        max_bias_ratings: ``k_b``, the most ratings one user adds to the bias release.
        item_damping, user_damping: the damped means' shrinkage (Koren's 25 and 10).
        noise_damping: the item biases' extra shrinkage per unit of released noise variance
            (:func:`damped_biases`; 0: none).
        min_count: items whose released count is below this keep no factor (bias only).
        init_std: std of the public random initial ``V`` (seeded from the run's tree).
        chunk_users: users per vectorised group on the device side (memory only).
        weighting: ``"per_user"`` (each user's rows are scaled by ``sqrt(k / m_u)``, ``m_u``
            the rows it sends, so that every user's upload reaches the bound: a user with few
            ratings weighs more per rating, and the sums are weighted sums, ``A_i = sum_u w_u
            u u^T``, a weighted least squares) or ``"uniform"`` (every row weight 1).
        bias_share: the share of each pass's squared sensitivity given to bias rows
            ``[clip(r - m), 1]`` at the same chosen items (0: none). A pass's upload is
            ``[sqrt(1 - p) x_als / S_als, sqrt(p) x_bias / S_bias]``, still of norm <= 1; the
            server combines every release's bias sums and counts with weights
            ``share / S_bias^2`` (inverse noise variance): the budget allocation between the
            biases and the factors that an even split over rounds would not allow.
    """

    dim: int = 1
    passes: int = 1
    reg_user: float = 0.5
    reg_item: float = 300.0
    noise_shift: float = 2.0
    user_clip: float = 1.0
    rating_clip: float = 1.5
    bias_clip: float = 1.5
    max_ratings: int = 80
    max_bias_ratings: int = 300
    item_damping: float = 60.0
    user_damping: float = 10.0
    min_count: float = 50.0
    init_std: float = 0.3
    chunk_users: int = 4096
    weighting: str = "per_user"
    bias_share: float = 0.5
    noise_damping: float = 5.0

    def __post_init__(self) -> None:
        for name in ("dim", "max_ratings", "max_bias_ratings", "chunk_users"):
            value = getattr(self, name)
            if isinstance(value, bool) or int(value) != value or value < 1:
                raise ValueError(f"DPALSConfig.{name} must be an integer >= 1, got {value!r}")
        if isinstance(self.passes, bool) or int(self.passes) != self.passes or self.passes < 0:
            raise ValueError(f"DPALSConfig.passes must be an integer >= 0, got {self.passes!r}")
        for name in ("user_clip", "rating_clip", "bias_clip", "init_std"):
            value = getattr(self, name)
            if not (np.isfinite(value) and value > 0):
                raise ValueError(f"DPALSConfig.{name} must be finite and > 0, got {value!r}")
        for name in (
            "reg_user",
            "reg_item",
            "noise_shift",
            "item_damping",
            "user_damping",
            "min_count",
            "noise_damping",
        ):
            value = getattr(self, name)
            if not (np.isfinite(value) and value >= 0):
                raise ValueError(f"DPALSConfig.{name} must be finite and >= 0, got {value!r}")
        if not 0 <= self.bias_share < 1:
            raise ValueError(f"DPALSConfig.bias_share must lie in [0, 1), got {self.bias_share!r}")
        if self.weighting not in WEIGHTINGS:
            raise ValueError(f"DPALSConfig.weighting must be one of {WEIGHTINGS}")
        if self.reg_user == 0:
            raise ValueError("DPALSConfig.reg_user must be > 0 (a user with few ratings)")

    @property
    def releases(self) -> int:
        """Transport rounds of a run: the bias release and the passes."""
        return 1 + self.passes

    @property
    def packed(self) -> int:
        """Entries of the upper triangle of a ``d x d`` matrix, ``d (d + 1) / 2``."""
        return self.dim * (self.dim + 1) // 2

    @property
    def width(self) -> int:
        """Columns of a row: the packed ``u u^T``, ``e u``, the two bias columns, the probe."""
        return self.bias_column + 3

    @property
    def bias_column(self) -> int:
        """First of the two bias columns (``r - m``, count); the probe follows them."""
        return self.packed + self.dim if self.passes else 0


def private_bias_config(**overrides) -> DPALSConfig:
    """The private damped-bias model: the bias release alone, with the whole budget."""
    return replace(DPALSConfig(passes=0), **overrides)


def pass_sensitivity(config: DPALSConfig) -> float:
    """L2 bound of one user's whole upload in an item pass (module docstring)."""
    c, g = config.user_clip, config.rating_clip
    return float(np.sqrt(config.max_ratings) * c * np.sqrt(c * c + g * g))


def bias_sensitivity(config: DPALSConfig, ratings: int | None = None) -> float:
    """L2 bound of one user's bias rows: ``sqrt(k_b (G_b^2 + 1))`` (``ratings`` rows: that k)."""
    k = config.max_bias_ratings if ratings is None else ratings
    return float(np.sqrt(k * (config.bias_clip**2 + 1.0)))


def pack_outer(vectors: np.ndarray) -> np.ndarray:
    """Upper triangles (diagonal included, row-major) of ``v v^T`` for each row ``v``."""
    upper = np.triu_indices(vectors.shape[1])
    return vectors[:, upper[0]] * vectors[:, upper[1]]


def unpack_symmetric(packed: np.ndarray, dim: int) -> np.ndarray:
    """``(n, d, d)`` symmetric matrices from ``(n, d (d + 1) / 2)`` upper triangles."""
    upper = np.triu_indices(dim)
    out = np.zeros((len(packed), dim, dim))
    out[:, upper[0], upper[1]] = packed
    out[:, upper[1], upper[0]] = packed
    return out


def clip_norms(vectors: np.ndarray, bound: float) -> np.ndarray:
    """Each row scaled to norm at most ``bound``."""
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors * np.minimum(1.0, bound / np.maximum(norms, 1e-300))


def solve_items(
    packed: np.ndarray, linear: np.ndarray, dim: int, ridge: float, trained: np.ndarray
) -> np.ndarray:
    """``v_i = (psd(A_i) + ridge I)^-1 b_i`` for the ``trained`` items, 0 elsewhere."""
    A = unpack_symmetric(packed[trained], dim)
    values, vectors = np.linalg.eigh(A)
    values = np.maximum(values, 0.0) + ridge
    projected = np.einsum("nij,nkj->nik", vectors * (1.0 / values)[:, None, :], vectors)
    out = np.zeros((len(packed), dim))
    out[trained] = np.einsum("nij,nj->ni", projected, linear[trained])
    return out


def damped_biases(
    sums: np.ndarray,
    counts: np.ndarray,
    midpoint: float,
    damping: float,
    noise_var: float = 0.0,
    noise_damping: float = 0.0,
) -> tuple[float, np.ndarray]:
    """Global mean and damped item biases from the released ``r - midpoint`` sums and counts.

    ``b_i = (s_i - n_i (mu - m)) / (n_i + damping + noise_damping * noise_var / max(n_i, 1))``:
    the posterior mean of ``b_i ~ N(0, s_b^2)`` from ``n_i`` residuals of variance ``s_r^2``
    whose sum carries noise of variance ``noise_var`` is ``s / (n + s_r^2 / s_b^2 +
    noise_var / (n s_b^2))``; Koren's damping is ``s_r^2 / s_b^2`` and ``noise_damping`` is
    ``1 / s_b^2`` (``damping`` itself for ``s_r^2 = 1``).

    Raises:
        ValueError: the released counts sum to nothing positive (no rating was released).
    """
    counts = np.maximum(counts, 0.0)
    total = float(counts.sum())
    if not total > 0:
        raise ValueError("the bias release holds no rating (its counts sum to <= 0)")
    shift = float(sums.sum()) / total
    divisor = counts + damping + noise_damping * noise_var / np.maximum(counts, 1.0)
    bias = np.divide(sums - counts * shift, divisor, out=np.zeros_like(sums), where=divisor > 0)
    return midpoint + shift, bias


def first_k_by_key(indptr: np.ndarray, keys: np.ndarray, k: int) -> np.ndarray:
    """Positions, within each CSR segment, of its ``k`` largest ``keys`` (a boolean mask)."""
    owner = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
    order = np.lexsort((-keys, owner))
    rank = np.empty(len(keys), dtype=np.int64)
    rank[order] = np.arange(len(keys)) - indptr[owner[order]]
    return rank < k


class DPALS:
    """DP-ALS as a :class:`securefed.runtime.FederatedAlgorithm` (module docstring).

    Run it with ``config.releases`` rounds; a DP transport's ``total_rounds`` must be the same,
    so that the calibration splits the budget over the releases.

    Args:
        train: training ratings; every user is one client.
        config: hyper-parameters.
        seeds: the run's seed tree (the initial ``V`` and the devices' item choices).
    """

    def __init__(self, train: Ratings, config: DPALSConfig, seeds: SeedTree) -> None:
        self.config = config
        self.scale: RatingScale = train.scale
        self.n_clients = train.n_users
        self.n_items = train.n_items
        self.indptr, self.items, self.ratings = rating_rows(train)
        self.midpoint = (self.scale.minimum + self.scale.maximum) / 2
        # A public random start (the first pass's user solves need some V); no factor at all
        # in the bias model.
        self.V = seeds.generator("init", "items").normal(
            0, config.init_std if config.passes else 0.0, (self.n_items, config.dim)
        )
        self.U = np.zeros((self.n_clients, config.dim))
        self.mean = self.midpoint
        self.item_bias = np.zeros(self.n_items)
        self.item_count = np.zeros(self.n_items)
        self.user_bias = np.zeros(self.n_clients)
        self.noise_std: list[float] = []  # per release, in upload units (probe column)
        self._bias_statistics = np.zeros((self.n_items, 2))
        self._bias_weight = 0.0
        self._bias_noise: list[float] = []  # unit noise variances of the releases folded in

    @property
    def transport_needs(self) -> TransportNeeds:
        return TransportNeeds("DP-ALS")

    # ------------------------------------------------------------------ rounds
    def run_round(
        self, round_id: int, clients: np.ndarray, transport: Transport, seeds: SeedTree
    ) -> dict[str, float]:
        """Round 0: the bias release; rounds ``1..passes``: one item pass each.

        Raises:
            ValueError: ``clients`` is not every user (a pass needs every user's sums: sample
                clients with ``ClientSampling("all")``), or ``round_id`` is past the releases.
        """
        require_capabilities(transport, self.transport_needs)
        clients = np.asarray(clients, dtype=np.int64)
        if len(clients) != self.n_clients:
            raise ValueError(
                f"DP-ALS sums every user's statistics in each release: round {round_id} asked "
                f"{len(clients)} of {self.n_clients} clients (use ClientSampling('all'))"
            )
        if not 0 <= round_id < self.config.releases:
            raise ValueError(f"round {round_id} is past DP-ALS's {self.config.releases} releases")
        shape = (self.n_items, self.config.width)
        rnd = transport.open_round(round_id, clients, shape=shape, seeds=seeds)
        if transport.view.public.get("protocol") != "dp-als":
            transport.view.public.update(self.public_parameters())
        if round_id == BIAS_ROUND:
            rnd.view.public.update({"protocol": "dp-als", "release": "item biases"})
            rnd.submit_batch(self.bias_uploads(seeds))
            self.apply_bias_release(rnd.result().total)
            self.set_user_biases()
            metrics = {"items_counted": float(np.sum(self.item_count >= self.config.min_count))}
        else:
            rnd.view.public.update({"protocol": "dp-als", "release": f"item pass {round_id}"})
            rnd.broadcast("V", self.V)
            rnd.broadcast("item_bias", self.item_bias)
            self.solve_users()
            rnd.submit_batch(self.pass_uploads())
            self.apply_pass(rnd.result().total)
            metrics = {}
        if round_id == self.config.releases - 1 and self.config.passes:
            self.solve_users()  # the devices' final vectors, from the final V (free)
        metrics["noise_std"] = self.noise_std[-1]
        metrics["train_rmse"] = self.train_rmse()
        return metrics

    # ------------------------------------------------------------------ device side
    def bias_uploads(self, seeds: SeedTree) -> RowUpdates:
        """Every user's bias rows, ``[clip(r - m), 1, 0]`` for ``k_b`` random ratings."""
        cfg = self.config
        keys = seeds.generator("dp-als", "bias-choice").random(len(self.items))
        chosen = first_k_by_key(self.indptr, keys, cfg.max_bias_ratings)
        values = np.zeros((int(chosen.sum()), cfg.width))
        values[:, cfg.bias_column : cfg.bias_column + 2] = self._bias_rows(chosen)
        return self._uploads(chosen, values / bias_sensitivity(cfg), cfg.max_bias_ratings)

    def _bias_rows(self, chosen: np.ndarray) -> np.ndarray:
        """``[clip(r - m, -G_b, G_b), 1]`` at the ``chosen`` ratings."""
        centred = np.clip(
            self.ratings[chosen] - self.midpoint, -self.config.bias_clip, self.config.bias_clip
        )
        return np.column_stack([centred, np.ones(len(centred))])

    def set_user_biases(self) -> None:
        """Each device's damped bias ``b_u`` from all its ratings (never uploaded)."""
        residual = self.ratings - self.mean - self.item_bias[self.items]
        total = segment_sum(residual[:, None], self.indptr)[:, 0]
        self.user_bias = total / (np.diff(self.indptr) + self.config.user_damping)

    def residuals(self) -> np.ndarray:
        """``e_ui = r_ui - mu - b_u - b_i`` for every rating (device side)."""
        owner = np.repeat(np.arange(self.n_clients), np.diff(self.indptr))
        return self.ratings - self.mean - self.user_bias[owner] - self.item_bias[self.items]

    def solve_users(self) -> None:
        """Each device's ridge solve of its vector against the released ``V`` (all ratings)."""
        cfg = self.config
        residual = self.residuals()
        eye = cfg.reg_user * np.eye(cfg.dim)
        for start in range(0, self.n_clients, cfg.chunk_users):
            stop = min(start + cfg.chunk_users, self.n_clients)
            lo, hi = self.indptr[start], self.indptr[stop]
            rows = self.V[self.items[lo:hi]]
            local = self.indptr[start : stop + 1] - lo
            gram = segment_sum(np.einsum("ni,nj->nij", rows, rows).reshape(hi - lo, -1), local)
            gram = gram.reshape(-1, cfg.dim, cfg.dim) + eye
            linear = segment_sum(rows * residual[lo:hi, None], local)
            self.U[start:stop] = np.linalg.solve(gram, linear[:, :, None])[:, :, 0]

    def pass_uploads(self) -> RowUpdates:
        """Every user's pass rows, ``[packed u u^T, clip(e) u, 0]`` for its ``k`` chosen items."""
        cfg = self.config
        chosen = first_k_by_key(self.indptr, self.item_count[self.items], cfg.max_ratings)
        owner = np.repeat(np.arange(self.n_clients), np.diff(self.indptr))[chosen]
        vectors = clip_norms(self.U, cfg.user_clip)[owner]
        residual = np.clip(self.residuals()[chosen], -cfg.rating_clip, cfg.rating_clip)
        values = np.zeros((len(owner), cfg.width))
        als = np.sqrt(1 - cfg.bias_share) / pass_sensitivity(cfg)
        values[:, : cfg.packed] = pack_outer(vectors) * als
        values[:, cfg.packed : cfg.packed + cfg.dim] = residual[:, None] * vectors * als
        if cfg.bias_share:
            bias = np.sqrt(cfg.bias_share) / bias_sensitivity(cfg, cfg.max_ratings)
            values[:, cfg.bias_column : cfg.bias_column + 2] = self._bias_rows(chosen) * bias
        return self._uploads(chosen, values, cfg.max_ratings)

    def _uploads(self, chosen: np.ndarray, values: np.ndarray, k: int) -> RowUpdates:
        """The chosen entries of every user as one batch (users without any submit none).

        ``values`` are already divided by the release's bound; under ``per_user`` weighting a
        user that sends ``m_u < k`` rows scales them by ``sqrt(k / m_u)`` (still within it).
        """
        owner = np.repeat(np.arange(self.n_clients), np.diff(self.indptr))[chosen]
        sent = np.bincount(owner, minlength=self.n_clients)
        if self.config.weighting == "per_user":
            values = values * np.sqrt(k / np.maximum(sent, 1))[owner, None]
        indptr = np.concatenate([[0], np.cumsum(sent)])
        return RowUpdates(
            np.arange(self.n_clients), indptr, self.items[chosen], values, self.n_items
        )

    # ------------------------------------------------------------------ server side
    def _measure_noise(self, total: np.ndarray) -> float:
        """Record the noise std of the release in upload units, read from its probe column."""
        self.noise_std.append(float(np.sqrt(np.mean(total[:, -1] ** 2))))
        return self.noise_std[-1]

    def _add_bias_statistics(self, total: np.ndarray, share: float, sensitivity: float) -> None:
        """Fold one release's bias columns into the running estimate; refresh the biases.

        Releases are weighted by ``share / sensitivity^2``, the inverse of their noise variance
        in rating units (the unit noise is the same in every release of a run).
        """
        cfg = self.config
        columns = total[:, cfg.bias_column : cfg.bias_column + 2] * (sensitivity / np.sqrt(share))
        weight = share / sensitivity**2
        self._bias_statistics = self._bias_statistics + weight * columns
        self._bias_weight += weight
        sums, counts = (self._bias_statistics / self._bias_weight).T
        self.item_count = np.maximum(counts, 0.0)
        # Noise variance of the combined sums in rating units: unit variance / sum of weights.
        self._bias_noise.append(self.noise_std[-1] ** 2)
        noise_var = float(np.mean(self._bias_noise)) / self._bias_weight
        self.mean, self.item_bias = damped_biases(
            sums, counts, self.midpoint, cfg.item_damping, noise_var, cfg.noise_damping
        )

    def apply_bias_release(self, total: np.ndarray) -> None:
        """Global mean, item biases and counts from the released bias block."""
        self._measure_noise(total)
        self._add_bias_statistics(total, 1.0, bias_sensitivity(self.config))

    def apply_pass(self, total: np.ndarray) -> None:
        """Solve every item with enough released ratings from the pass's released sums."""
        cfg = self.config
        unit_noise = self._measure_noise(total)
        scale = pass_sensitivity(cfg) / np.sqrt(1 - cfg.bias_share)
        ridge = cfg.reg_item + cfg.noise_shift * unit_noise * scale * np.sqrt(cfg.dim)
        trained = self.item_count >= cfg.min_count
        if cfg.bias_share:
            k = cfg.max_ratings
            self._add_bias_statistics(total, cfg.bias_share, bias_sensitivity(cfg, k))
            self.set_user_biases()
        self.V = solve_items(
            total[:, : cfg.packed] * scale,
            total[:, cfg.packed : cfg.packed + cfg.dim] * scale,
            cfg.dim,
            ridge,
            trained,
        )

    # ------------------------------------------------------------------ model
    def predict(self, users: np.ndarray, items: np.ndarray) -> np.ndarray:
        """``mu + b_u + b_i + u.v_i`` clipped to the scale (each user's own prediction)."""
        users, items = np.asarray(users), np.asarray(items)
        score = self.mean + self.user_bias[users] + self.item_bias[items]
        score = score + np.einsum("ni,ni->n", self.U[users], self.V[items])
        return self.scale.clip(score)

    def train_rmse(self) -> float:
        users = np.repeat(np.arange(self.n_clients), np.diff(self.indptr))
        error = self.predict(users, self.items) - self.ratings
        return float(np.sqrt(np.mean(error**2))) if len(error) else float("nan")

    def public_parameters(self) -> dict[str, object]:
        """What every client and the server know: the protocol, its config, the midpoint."""
        return {
            "protocol": "dp-als",
            "midpoint": self.midpoint,
            "bias_column": self.config.bias_column,
            **asdict(self.config),
        }

    def state_dict(self) -> dict[str, np.ndarray]:
        return {
            "V": self.V,
            "U": self.U,
            "mean": np.asarray(self.mean),
            "item_bias": self.item_bias,
            "item_count": self.item_count,
            "user_bias": self.user_bias,
            "noise_std": np.asarray(self.noise_std, dtype=np.float64),
            "bias_statistics": self._bias_statistics,
            "bias_weight": np.asarray(self._bias_weight),
            "bias_noise": np.asarray(self._bias_noise, dtype=np.float64),
        }

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        self.V = np.asarray(state["V"], dtype=np.float64)
        self.U = np.asarray(state["U"], dtype=np.float64)
        self.mean = float(state["mean"])
        self.item_bias = np.asarray(state["item_bias"], dtype=np.float64)
        self.item_count = np.asarray(state["item_count"], dtype=np.float64)
        self.user_bias = np.asarray(state["user_bias"], dtype=np.float64)
        self.noise_std = [float(x) for x in np.asarray(state["noise_std"])]
        self._bias_statistics = np.asarray(state["bias_statistics"], dtype=np.float64)
        self._bias_weight = float(state["bias_weight"])
        self._bias_noise = [float(x) for x in np.asarray(state["bias_noise"])]
