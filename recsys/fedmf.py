"""FedMF, FedRec hybrid filling and FedRec+, vectorised over the clients of a round.

Model (Chai et al. 2020, "Secure Federated Matrix Factorization"; specs/fedmf.md section 1): the
server holds the item factors ``V``; user ``u`` holds ``U_u`` and its ratings. Each round

1. the server broadcasts ``V`` (the whole matrix: sending only the rows a user asks for would
   reveal its items);
2. user ``u`` computes ``e_ui = r_ui - <U_u, V_i>`` on its rated items and steps its own vector,
   ``U_u <- U_u - gamma * (-2 sum_i e_ui V_i + 2 lambda U_u) / n_u`` (``user_step="mean"``, this
   project's default: the user's own objective averaged over its ``n_u`` ratings, so that one
   learning rate suits light and heavy users) or without the ``/ n_u`` (``user_step="sum"``,
   Chai et al.'s literal form, which needs a much smaller ``gamma``);
3. uploads item gradients ``g_ui = -2 e_ui U_u + 2 mu V_i`` with ``U_u`` the vector before the
   step (``gradient_user_vector="before"``, the spec's equations) or after it (``"after"``, as the
   FedMF code does per rating); Part upload sends rated rows only, Full sends the whole block;
4. the server averages each item's gradient over its uploaders (``aggregation="mean"``), sums
   them (``"sum"``) or divides their sum by the public expected number of clients
   (``"fixed"``, for user-level DP) and steps ``V <- V - eta * G``.

With ``offset="user_mean"`` every user models ``r_ui - m_u`` (its own mean rating, kept on the
device and never uploaded): ``r_ui ~ m_u + <U_u, V_i>``. Under DP noise this keeps the model
useful when ``V`` learns little (the user-mean predictor), at no privacy cost.

FedRec (Lin et al. 2020, section 3 of the spec) adds ``rho * n_u`` pseudo items per user with
virtual ratings (the user's mean for ``warmup_rounds`` rounds, then the prediction), resampled
each round, values off the scale. FedRec+ (arXiv 2310.20193) picks pseudo items by cosine
similarity of the item factors and weights clients by a Wasserstein distance
(:mod:`securefed.recsys.weights`). This project's FedRec+ keeps each user's pseudo set for the
whole run
and snaps virtual ratings onto the rating scale, which closes the two leaks of section 3.

What a client uploads is one ``(n_items + 2, dim + 1)`` block (a :class:`RowUpdates` row set):

* item row ``i``: ``[p_u * g_ui, p_u]`` for every uploaded item (rated or pseudo); the last
  column sums to the (weighted) uploader count the server divides by (zero under
  ``aggregation="fixed"``, which needs no count: a column of ones would spend most of a DP
  clipping bound on a constant);
* row ``n_items``: ``[sum_i g_ui, m_u]`` and row ``n_items + 1``: ``[sum_i g_ui^2, p_u]``, the
  statistics from which the server computes the global update distribution that FedRec+'s
  Wasserstein weights need (and ``sum_u p_u`` for ``aggregation="sum"``); both zero under
  ``aggregation="fixed"``.

With ``biases`` (docs/fedmf.md) the block is ``(n_items + 2, dim + 2)``: item row ``i`` is
``[p_u * g_ui, p_u * s (-2 e_ui + 2 mu_b b_i), p_u]``, the item bias's gradient one extra column
of the item row (index ``dim``; ``s`` is ``bias_upload_scale``, 1 by default), before the count
column; the statistics rows carry zero there.
The user bias never leaves the device; the global mean comes from one aggregation round of
``[sum of ratings, count]`` (:meth:`FedMF.rating_mean_round`).

Every quantity is a sum over clients, so the same code runs under secure aggregation or CKKS.
For a synchronous round the users are independent given ``V``, so computing all of them with a
few sparse products is exact (``tests/test_fedmf.py`` checks it against a per-client loop).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Literal, Protocol

import numpy as np
from scipy import sparse

from securefed import AggregationRound, FactoredRows, RowUpdates, SeedTree, Transport
from securefed.audit.findings import register_known_keys
from securefed.errors import UnsupportedTransport
from securefed.recsys.data import Ratings, RatingScale
from securefed.recsys.filling import (
    keyed_uniforms,
    most_similar_unrated,
    pseudo_counts,
    sample_unrated,
    similarity_weighted_ratings,
    stochastic_snap,
    user_mean_ratings,
)
from securefed.recsys.sparse_rows import (
    merge_rows,
    merge_sorted,
    rated_dot,
    rating_rows,
    restrict_rows,
    row_ids,
    segment_sum,
    take_rows,
)
from securefed.recsys.user_state import LazyRows, keyed_normals
from securefed.recsys.weights import WEIGHTINGS, client_weights, moments_from_sums
from securefed.server_optim import ServerOptimiser, ServerOptimiserConfig
from securefed.transport import TransportNeeds, require_capabilities

VARIANTS = ("fedmf", "fedrec", "fedrec+")
RATING_UNITS = ("one", "scale")
# The transport round id of the global-mean round (FedMF.rating_mean_round): apart from the
# training rounds, which count from 0, so its masks and keys are its own.
RATING_MEAN_ROUND = 1 << 30
SERVER_OPTIMISER_PREFIX = "server_optimiser."


@dataclass(frozen=True)
class FedMFConfig:
    """Hyper-parameters of the FedMF family (defaults tuned on MovieLens 100K, u1 split).

    Attributes:
        variant: ``"fedmf"`` (Chai et al.), ``"fedrec"`` (hybrid filling) or ``"fedrec+"``.
        dim: latent dimension.
        rounds: number of rounds.
        lr: the users' step size gamma.
        server_lr: the server's step size eta on the aggregated item gradient.
        reg_user: lambda, the L2 weight on user vectors.
        reg_item: mu, the L2 weight on item vectors (per rating, in the clients' gradients;
            under ``aggregation="fixed"`` the server's own decay of ``V`` per round,
            ``V <- V - eta (G + 2 mu V)``, which costs no privacy and stays out of the clip).
        filling_regularisation: what the item regulariser of FedRec/FedRec+ uploads is
            counted per. ``"per_rating"`` (default, this project's choice): every uploaded row
            carries ``mu / (1 + rho)`` (:attr:`row_reg_item`), so an item's regularisation per
            real rating stays ``mu``, as in vanilla FedMF. ``"per_row"``: ``mu`` on every row,
            rated or pseudo, as FedRec's per-user loss reads; the pseudo rows then add ``rho
            mu`` of shrinkage per rating (measured: +0.0125 RMSE over vanilla on ML-100K, five
            splits). Rows of one upload stay indistinguishable either way.
        init_std: standard deviation of the Gaussian initial factors.
        upload: ``"part"`` (rated and pseudo rows only) or ``"full"`` (the whole block, zeros
            elsewhere: under a hiding transport the server cannot see which rows were touched).
        aggregation: ``"mean"`` (per-item weighted mean over uploaders), ``"sum"``, or
            ``"fixed"``: the sum divided by ``expected_clients``, a public constant (DP-FedAvg's
            fixed denominator, McMahan et al. ICLR 2018): neither per-item counts nor the
            realised number of clients, which depend on who took part, enter the update, and
            each client's block holds only its gradient rows (for user-level DP).
        expected_clients: the denominator of ``aggregation="fixed"`` (``None``: every user,
            times ``1 - dropout``; set ``sample_rate * n_users`` under Poisson sampling).
        offset: ``"none"`` (``r ~ <U_u, V_i>``, Chai et al.) or ``"user_mean"`` (``r ~ m_u +
            <U_u, V_i>`` with the user's own mean rating ``m_u``, which never leaves the device).
        user_step: ``"mean"`` or ``"sum"`` normalisation of the user's gradient (module docstring).
        gradient_user_vector: ``"before"`` or ``"after"`` the user's local steps.
        local_steps: L, user-vector steps per round.
        rho: pseudo items per rated item (``None``: 1 for FedRec, as published; 0.5 for
            FedRec+, this project's choice: FedRec+'s stable, on-scale virtual ratings bias the
            items they touch: on ML-100K u1, 0.9509 at rho = 1 and 0.9401 at 0.5 against
            vanilla's 0.9270 (five splits at 0.5: +0.0047). The price is fewer decoys per rated
            item: "every row is rated" scores F1 = 2 / (2 + rho) = 0.8 instead of 0.67; README
            "Choices").
        warmup_rounds: T', FedRec's rounds of user-average virtual ratings before it switches to
            the model's prediction (FedRec+ always rates pseudo items from the similar rated
            items: a prediction would be recomputable by the server, see docs/attacks.md).
        resample_pseudo: draw new pseudo items every round (``None``: True for FedRec, as
            published; False for FedRec+).
        virtual_on_scale: snap virtual ratings onto the rating scale (``None``: False for FedRec,
            as published; True for FedRec+).
        virtual_rating: where virtual ratings come from: ``"hybrid"`` (FedRec: the user's mean
            for ``warmup_rounds``, then its prediction), ``"similar"`` (similarity-weighted mean
            of the user's ratings; FedRec+ default; with ``biases``, of its ratings net of their
            item biases, plus the pseudo item's bias) or ``"prediction"`` (the user's prediction
            from the start: most accurate, but recomputable by the server). ``None``: the
            variant's default.
        virtual_rounding: how virtual ratings are put on the scale: ``"nearest"`` grid point, or
            ``"stochastic"`` (the grid point below or above with probabilities that keep the
            expected value, fresh each round: unbiased filling at the price of noise).
        weighting: client weights, ``"uniform"``, ``"count"`` or ``"wasserstein"`` (``None``:
            Wasserstein for FedRec+, uniform otherwise).
        tau: temperature of the Wasserstein weights.
        count_cap: public cap dividing counts so weights lie in [0, 1].
        dropout: fraction of each round's clients that drop out before uploading (simulation).
        min_item_weight: floor of the per-item divisor of ``aggregation="mean"`` (items whose
            aggregated weight is not positive get no update). Under DP use
            ``aggregation="fixed"`` instead (:func:`user_level_dp_config`): noisy counts near
            zero blow the mean up.
        server_state: ``"plain"`` (the server holds ``V``) or ``"encrypted"`` (Chai et al.'s
            variant: ``[[V]]`` stays encrypted on the server, every round's users download and
            decrypt it, apply ``-server_lr`` to their own item gradients and upload them, and the
            server adds the ciphertexts into ``[[V]]``; needs a transport whose capabilities
            include an encrypted server state (:attr:`FedMF.transport_needs`; refused when the
            run is built otherwise), ``aggregation="sum"`` and ``weighting="uniform"``, since
            the server can neither divide nor weigh what it cannot read).
        chunk_ratings: clients are processed in groups of about this many ratings, which bounds
            the round's working memory on large data sets (results do not depend on it).
        biases: model ``r_ui ~ base_u + b_u + b_i + <U_u, V_i>`` (Koren et al. 2009, eq. 4) with
            ``base_u`` the global mean (``offset="none"``) or the user's own mean
            (``offset="user_mean"``). ``b_u`` stays on the device and steps like ``U_u``; ``b_i``
            lives on the server beside ``V_i`` and its gradient ``-2 e_ui + 2 mu_b b_i`` is
            uploaded as one more column of the item row (module docstring), so the same
            transports protect it. Off by default in the library (the ML-100K pin and the
            attacks' block layout); on in :func:`biased_config`, the command line's default.
        reg_bias: mu_b, the L2 weight on ``b_u`` and ``b_i`` (counted per uploaded row like
            ``reg_item``; under ``aggregation="fixed"`` the server's own decay of ``b_i``).
        bias_upload_scale: ``s``, the factor on the item-bias column of every uploaded row
            (``biases`` only): a client uploads ``s (-2 e_ui + 2 mu_b b_i)`` and the server divides
            the column's sum by ``s``. Without DP nothing changes (up to rounding). Under DP the
            transport clips each client's whole block ``[g, s g_b]`` to the one L2 bound ``C``,
            so the sensitivity stays ``C`` whatever ``s``, and ``s`` chooses how that norm is
            shared: the bias column alone is ``-2 e`` per row against the factor columns'
            ``-2 e U_u`` with small ``U_u``, so at ``s = 1`` it takes most of the clip and the
            factor gradients shrink under the same noise; a smaller ``s`` gives the factors more
            of the norm and the bias more noise (``sigma C / s`` after the division). Public.
        item_damping: ``k``, a prior the server adds to every touched item's mean
            (``aggregation="mean"`` only): ``k`` rows of zero error, so item ``i`` steps with
            ``(G_i + 2 mu k V_i) / (n_i + k)`` (and ``b_i`` likewise with ``mu_b``) instead of
            ``G_i / n_i``, where ``G_i`` sums the ``n_i`` uploaded rows (weights, if any). An
            item with many ratings keeps the per-rating regulariser ``mu``; one with few is
            shrunk towards zero as if it had ``k`` more ratings at its prediction: Koren's
            damping (2010, section 2.1; :mod:`securefed.recsys.baselines`' ``lambda_i``)
            applied to ``V`` and ``b_i``. Server-side on the ``V`` and counts it already holds:
            no upload changes. 0 (default): today's step, bit for bit.
        user_damping: ``k_u``, the same prior on the device (``user_step="mean"`` only): user
            ``u`` regularises ``U_u`` and ``b_u`` with ``lambda (1 + k_u / n_u)`` instead of
            ``lambda``, as if its mean loss had ``k_u`` more ratings at its prediction. Local:
            nothing uploaded changes form. 0 (default): today's step, bit for bit.
        server_optimiser: the server's rule for ``V`` and ``b_i`` (FedOpt, Reddi et al. 2021;
            :mod:`securefed.server_optim`): ``"sgd"`` is ``V <- V - eta G``, today's path, bit
            for bit; ``"momentum"``, ``"adam"``, ``"adagrad"``, ``"yogi"`` treat ``-G`` as the
            pseudo-gradient with step ``server_lr``. Under ``aggregation="mean"`` only the items
            some uploader touched step (their moments alone advance).
        server_momentum, server_beta1, server_beta2, server_tau: the server rule's
            hyperparameters (:class:`securefed.server_optim.ServerOptimiserConfig`).
        rating_unit: what one rating unit is while the model learns: ``"one"`` (the ratings as
            they are, the library default) or ``"scale"``: ratings divided by
            ``(maximum - minimum) / 4`` of the public rating scale (1 on MovieLens' 1..5, 2 on
            a 2..10 scale, 0.875 on 0.5..4), predictions multiplied back. Every setting that
            depends on the size of a rating (``init_std``, ``lr``, the L2 weights, a DP clip
            of the uploads) then means on any scale what it means on 1..5: MovieLens 100K with
            every rating doubled scores the undoubled RMSE, doubled (benchmarks/results/
            cli_defaults/). On by :func:`biased_config`. Public: the scale is.
        item_blocks: ``B``, how many public item blocks the catalogue is cut into (1: every
            round aggregates the whole item matrix, today's design). With ``B > 1`` round ``t``
            aggregates only block ``t mod B`` (:func:`item_block`: every ``B``-th item from
            ``t mod B``, public and the same for every client): each client's block is those
            item rows plus the two statistics rows, so a hiding transport masks (or encrypts,
            or noises) about ``1 / B`` of the dense block, and the round's sums are exactly the
            dense design's restricted to that block. Users still step ``U_u`` on all their
            ratings (the whole ``V`` is broadcast: which rows a user needs stays private).
            Every item steps once every ``B`` rounds. What the server sees per round is the
            dense design's view restricted to a block the server chose before any upload, so
            a hiding transport hides as much (docs/fedmf.md, "Item blocks"). Refused with
            ``server_state="encrypted"`` (``[[V]]`` is folded whole).
    """

    variant: Literal["fedmf", "fedrec", "fedrec+"] = "fedmf"
    dim: int = 20
    rounds: int = 500
    lr: float = 0.1
    server_lr: float = 0.1
    reg_user: float = 0.12
    reg_item: float = 0.12
    filling_regularisation: Literal["per_rating", "per_row"] = "per_rating"
    init_std: float = 0.3
    upload: Literal["part", "full"] = "part"
    aggregation: Literal["mean", "sum", "fixed"] = "mean"
    expected_clients: float | None = None
    offset: Literal["none", "user_mean"] = "none"
    user_step: Literal["mean", "sum"] = "mean"
    gradient_user_vector: Literal["before", "after"] = "before"
    local_steps: int = 1
    rho: float | None = None
    warmup_rounds: int = 10
    resample_pseudo: bool | None = None
    virtual_on_scale: bool | None = None
    virtual_rating: Literal["hybrid", "similar", "prediction"] | None = None
    virtual_rounding: Literal["nearest", "stochastic"] = "nearest"
    weighting: Literal["uniform", "count", "wasserstein"] | None = None
    tau: float = 1.0
    count_cap: float = 1000.0
    dropout: float = 0.0
    min_item_weight: float = 1e-12
    server_state: Literal["plain", "encrypted"] = "plain"
    chunk_ratings: int = 1 << 20
    biases: bool = False
    reg_bias: float = 0.01
    bias_upload_scale: float = 1.0
    item_damping: float = 0.0
    user_damping: float = 0.0
    server_optimiser: str = "sgd"
    server_momentum: float = 0.9
    server_beta1: float = 0.9
    server_beta2: float = 0.99
    server_tau: float = 1e-3
    rating_unit: Literal["one", "scale"] = "one"
    item_blocks: int = 1

    def __post_init__(self) -> None:
        choices = {
            "variant": VARIANTS,
            "upload": ("part", "full"),
            "aggregation": ("mean", "sum", "fixed"),
            "offset": ("none", "user_mean"),
            "user_step": ("mean", "sum"),
            "gradient_user_vector": ("before", "after"),
            "filling_regularisation": ("per_rating", "per_row"),
            "rating_unit": RATING_UNITS,
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.virtual_rating not in (None, "hybrid", "similar", "prediction"):
            raise ValueError(
                f"virtual_rating must be hybrid, similar or prediction, got {self.virtual_rating!r}"
            )
        if self.virtual_rounding not in ("nearest", "stochastic"):
            raise ValueError(
                f"virtual_rounding must be nearest or stochastic, got {self.virtual_rounding!r}"
            )
        if self.weighting is not None and self.weighting not in WEIGHTINGS:
            raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {self.weighting!r}")
        if not isinstance(self.item_blocks, int) or isinstance(self.item_blocks, bool):
            raise ValueError(f"item_blocks must be an integer, got {self.item_blocks!r}")
        for name in ("dim", "local_steps", "chunk_ratings", "item_blocks"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.rounds < 1:
            raise ValueError(
                f"rounds must be >= 1 (a run of no round trains nothing), got {self.rounds}"
            )
        if self.warmup_rounds < 0:
            raise ValueError(f"warmup_rounds must be >= 0, got {self.warmup_rounds}")
        for name in ("lr", "server_lr", "init_std", "tau", "count_cap", "min_item_weight"):
            value = getattr(self, name)
            if not np.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be finite and > 0, got {value!r}")
        for name, value in (
            ("reg_user", self.reg_user),
            ("reg_item", self.reg_item),
            ("rho", self.pseudo_ratio),
        ):
            if not np.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
        if self.server_state not in ("plain", "encrypted"):
            raise ValueError(f"server_state must be plain or encrypted, got {self.server_state!r}")
        if self.server_state == "encrypted" and (
            self.aggregation != "sum" or self.client_weighting != "uniform"
        ):
            raise ValueError(
                "server_state='encrypted' needs aggregation='sum' and uniform weighting: the "
                "server cannot divide or weigh an item matrix it cannot read"
            )
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must lie in [0, 1), got {self.dropout!r}")
        if self.expected_clients is not None and not (
            np.isfinite(self.expected_clients) and self.expected_clients > 0
        ):
            raise ValueError(
                f"expected_clients must be finite and > 0, got {self.expected_clients!r}"
            )
        if not isinstance(self.biases, bool):
            raise ValueError(f"biases must be True or False, got {self.biases!r}")
        if not np.isfinite(self.reg_bias) or self.reg_bias < 0:
            raise ValueError(f"reg_bias must be finite and >= 0, got {self.reg_bias!r}")
        if not (np.isfinite(self.bias_upload_scale) and self.bias_upload_scale > 0):
            raise ValueError(
                f"bias_upload_scale must be finite and > 0, got {self.bias_upload_scale!r}"
            )
        if not (np.isfinite(self.item_damping) and self.item_damping >= 0):
            raise ValueError(f"item_damping must be finite and >= 0, got {self.item_damping!r}")
        if not (np.isfinite(self.user_damping) and self.user_damping >= 0):
            raise ValueError(f"user_damping must be finite and >= 0, got {self.user_damping!r}")
        if self.user_damping > 0 and self.user_step != "mean":
            raise ValueError(
                f"user_damping={self.user_damping!r} with user_step={self.user_step!r}: the "
                "damping scales the regulariser of the user's mean loss; use user_step='mean'"
            )
        if self.item_damping > 0 and self.aggregation != "mean":
            raise ValueError(
                f"item_damping={self.item_damping!r} with aggregation={self.aggregation!r}: the "
                "damping divides by each item's uploader count, which only aggregation='mean' "
                "has; use aggregation='mean' or item_damping=0"
            )
        if self.bias_upload_scale != 1.0 and not self.biases:
            raise ValueError(
                f"bias_upload_scale={self.bias_upload_scale!r} without biases: there is no "
                "item-bias column to scale; set biases=True or leave it at 1"
            )
        _ = self.server_optimiser_config  # validates the server rule and its hyperparameters
        if self.biases and self.server_state == "encrypted":
            raise ValueError(
                "biases=True with server_state='encrypted': the encrypted state holds V only, "
                "the item biases would have nowhere to go; use server_state='plain'"
            )
        if self.server_optimiser != "sgd" and self.server_state == "encrypted":
            raise ValueError(
                f"server_optimiser={self.server_optimiser!r} with server_state='encrypted': the "
                "server cannot keep moments of a matrix it cannot read; use 'sgd'"
            )
        if self.item_blocks > 1 and self.server_state == "encrypted":
            raise ValueError(
                f"item_blocks={self.item_blocks} with server_state='encrypted': the encrypted "
                "state folds every client's whole item matrix into [[V]]; use item_blocks=1"
            )
        if self.aggregation == "fixed" and self.client_weighting == "wasserstein":
            raise ValueError(
                "aggregation='fixed' uploads no statistics rows, which Wasserstein weights need: "
                "use weighting='uniform' or 'count'"
            )

    @property
    def server_optimiser_config(self) -> ServerOptimiserConfig:
        """The server rule as :class:`ServerOptimiserConfig` (lr ``server_lr``)."""
        return ServerOptimiserConfig(
            name=self.server_optimiser,
            lr=self.server_lr,
            momentum=self.server_momentum,
            beta1=self.server_beta1,
            beta2=self.server_beta2,
            tau=self.server_tau,
        )

    @property
    def width(self) -> int:
        """Columns of an item row's gradient: ``dim``, plus the item bias's with ``biases``."""
        return self.dim + int(self.biases)

    @property
    def row_reg_bias(self) -> float:
        """The bias regulariser each uploaded row carries (scaled as :attr:`row_reg_item`)."""
        if self.fills and self.filling_regularisation == "per_rating":
            return self.reg_bias / (1.0 + self.pseudo_ratio)
        return self.reg_bias

    @property
    def fills(self) -> bool:
        """Whether clients upload pseudo items (FedRec and FedRec+)."""
        return self.variant != "fedmf" and self.pseudo_ratio > 0

    @property
    def pseudo_ratio(self) -> float:
        """rho, resolved: pseudo items per rated item (see ``rho``)."""
        if self.rho is not None:
            return float(self.rho)
        return 0.5 if self.variant == "fedrec+" else 1.0

    @property
    def row_reg_item(self) -> float:
        """The item regulariser each uploaded row carries (see ``filling_regularisation``)."""
        if self.fills and self.filling_regularisation == "per_rating":
            return self.reg_item / (1.0 + self.pseudo_ratio)
        return self.reg_item

    @property
    def pseudo_resampled(self) -> bool:
        if self.resample_pseudo is not None:
            return self.resample_pseudo
        return self.variant == "fedrec"

    @property
    def virtual_snapped(self) -> bool:
        if self.virtual_on_scale is not None:
            return self.virtual_on_scale
        return self.variant == "fedrec+"

    @property
    def virtual_source(self) -> str:
        if self.virtual_rating is not None:
            return self.virtual_rating
        return "similar" if self.variant == "fedrec+" else "hybrid"

    @property
    def client_weighting(self) -> str:
        if self.weighting is not None:
            return self.weighting
        return "wasserstein" if self.variant == "fedrec+" else "uniform"

    def public(self) -> dict[str, object]:
        """The protocol's public parameters (what the server and an auditor know)."""
        return asdict(self) | {
            "protocol": "fedmf",
            "pseudo_items_resampled": self.fills and self.pseudo_resampled,
            "virtual_ratings_on_scale": (not self.fills) or self.virtual_snapped,
            "weighting": self.client_weighting,
            "virtual_rating": self.virtual_source,
            "row_reg_item": self.row_reg_item,
            "rho": self.pseudo_ratio,
        }


RUN_PUBLIC_KEYS = (
    "n_users",
    "n_items",
    "rating_scale",
    "rating_unit_size",
    "block_rows",
    "block_columns",
    "item_bias_column",
    "rating_mean",
    "rating_mean_round",
    "item_block",
)
"""What a FedMF run records besides its configuration (:meth:`FedMF.public_parameters`; a
round's ``item_block`` under ``item_blocks``)."""


def audit_keys() -> frozenset[str]:
    """Every public key a FedMF run records, for :mod:`securefed.audit`.

    Derived from :class:`FedMFConfig`'s fields and :meth:`FedMFConfig.public` (a new field is
    known to the audit without a list to edit), with :data:`RUN_PUBLIC_KEYS`. Registered at
    import and through the ``securefed.audit_keys`` entry point.
    """
    config = FedMFConfig()
    return (
        frozenset(item.name for item in fields(FedMFConfig))
        | frozenset(config.public())
        | frozenset(RUN_PUBLIC_KEYS)
    )


register_known_keys("fedmf", audit_keys())


BIASED_SETTINGS: dict[str, object] = {
    "biases": True,
    "dim": 100,
    "init_std": 0.03,
    "lr": 0.3,
    "reg_user": 0.08,
    "user_damping": 30.0,
    "reg_item": 0.07,
    "item_damping": 25.0,
    "server_optimiser": "adam",
    "server_lr": 0.03,
    "reg_bias": 0.02,
    "rounds": 35,
    "rating_unit": "scale",
}
"""The settings of :func:`biased_config` (chosen in benchmarks/results/fedmf_biases/)."""

BIASED_VARIANT_SETTINGS: dict[str, dict[str, object]] = {
    # Pseudo rows already shrink rarely rated items (they add uploaders of near-zero error to
    # every item's mean), so the filling variants need less, or no, server-side damping.
    "fedrec": {"item_damping": 0.0, "reg_item": 0.11},
    # FedRec+ pads light users to dim + 1 uploaded rows (a defence), so its cost grows with dim:
    # dim 50 costs 0.0008 validation RMSE against 100 and uploads a third fewer pseudo rows
    # (benchmarks/results/fedmf_biases/README.md, "Time").
    "fedrec+": {"item_damping": 10.0, "rounds": 40, "dim": 50},
}
"""What :func:`biased_config` changes for FedRec and FedRec+ (chosen the same way)."""


def biased_config(**overrides) -> FedMFConfig:
    """FedMF with biases and Adam on the server: the settings for a first run on a new file.

    ``r_ui ~ mu + b_u + b_i + <U_u, V_i>`` (``biases``): on a data set whose scale or mean
    differs from MovieLens the biases carry most of what can be predicted, and the factors only
    the interactions, so the model starts at the baseline rather than below the global mean.
    FedAdam (Reddi et al. 2021) on ``V`` and ``b_i`` at ``server_lr`` 0.03 with a user step of
    0.3; ``dim`` 100 with small initial factors (0.03); L2 weights per rating 0.08 (users),
    0.07 (items), 0.02 (biases), with Koren's damping (``user_damping`` 30 on the device,
    ``item_damping`` 25 on the server) so that users and items with few ratings are shrunk
    more; 35 rounds; ratings learnt in units of a quarter of the scale's range
    (``rating_unit="scale"``), so that these settings hold on any scale. Chosen on 10%
    validation parts of ML-100K u1.base and u2.base (never a test fold) by the rule of
    docs/fedmf.md, "Choosing rounds and regularisation", which ``--validation`` applies to
    another data set. FedRec and FedRec+ get :data:`BIASED_VARIANT_SETTINGS` on top
    (``variant`` in ``overrides``): FedRec no item damping and an item L2 weight of 0.11,
    FedRec+ item damping 10, 40 rounds and ``dim`` 50.
    """
    variant = overrides.get("variant", BIASED_SETTINGS.get("variant", "fedmf"))
    return FedMFConfig(**(BIASED_SETTINGS | BIASED_VARIANT_SETTINGS.get(variant, {}) | overrides))


def user_level_dp_config(**overrides) -> FedMFConfig:
    """FedMF settings for user-level DP (tuned on MovieLens 100K u1, clip 1, every user each round).

    Chai et al.'s per-item mean divides by the number of uploaders, which DP must noise too:
    items with a handful of raters then get steps divided by a number near zero, and FedMF
    diverged in every setting tried. These settings keep the sensitivity in the gradients:
    ``aggregation="fixed"`` (sum over the public expected number of clients, no count column),
    the user's own mean as offset (so a ``V`` that learns little still predicts like the user
    mean), small initial factors, ``dim`` 10 (less noise to absorb), a large server step
    (clipped sums are small) and a light server-side decay of ``V``. Measured in the README's DP
    table (``securefed bench fedmf-dp``).
    """
    settings = {
        "variant": "fedmf",
        "aggregation": "fixed",
        "offset": "user_mean",
        "dim": 10,
        "init_std": 0.1,
        "server_lr": 4.0,
        "reg_item": 0.002,
        "rounds": 100,
    }
    return FedMFConfig(**(settings | overrides))


DP_BIASED_SETTINGS: dict[str, object] = {"biases": True, "bias_upload_scale": 0.3}
"""What :func:`dp_biased_config` adds to the DP preset (benchmarks/results/fedmf_biases/)."""


def dp_biased_config(**overrides) -> FedMFConfig:
    """The DP preset with item and user biases, the item bias uploaded at a third of its scale.

    :func:`user_level_dp_config` plus ``biases`` (``r_ui ~ m_u + b_u + b_i + <U_u, V_i>``: the
    user's own mean stays the offset, so no global-mean round is needed) and
    ``bias_upload_scale`` 0.3: the item-bias column ``-2 e`` would otherwise take most of each
    user's clip norm (the factor columns are ``-2 e U_u`` with small ``U_u``), shrinking the
    factor gradients under the same noise. The transport still clips each user's whole block
    to ``C``, so the sensitivity, and the epsilon of a run, are the DP preset's. Measured on
    ML-100K u1 at epsilon 8 (distributed, clip 1, delta 1e-5, 100 rounds): 1.0083 against the
    DP preset's 1.0133 (``dp_eps8_s9_*.json``). The DP preset itself is unchanged: the attacks'
    tests and records are built on it.
    """
    return user_level_dp_config(**(DP_BIASED_SETTINGS | overrides))


def rating_unit(name: str, scale: RatingScale) -> float:
    """The size of one learning unit of ratings (``FedMFConfig.rating_unit``).

    ``"one"``: 1. ``"scale"``: a quarter of the scale's range, so that MovieLens' 1..5 is 1.

    Raises:
        ValueError: an unknown name.
    """
    if name == "one":
        return 1.0
    if name == "scale":
        return (scale.maximum - scale.minimum) / 4.0
    raise ValueError(f"rating_unit must be one of {RATING_UNITS}, got {name!r}")


def _scale_in_units(scale: RatingScale, unit: float) -> RatingScale:
    """``scale`` with every value divided by ``unit`` (itself when the unit is 1)."""
    if unit == 1.0:
        return scale
    return RatingScale(scale.minimum / unit, scale.maximum / unit, scale.step / unit)


def item_block(round_id: int, n_items: int, blocks: int) -> np.ndarray:
    """The items round ``round_id`` aggregates under ``item_blocks=blocks`` (sorted).

    Every ``blocks``-th item from ``round_id mod blocks``: public (the server's choice, made
    before any upload and the same for every client), disjoint across ``blocks`` consecutive
    rounds, which together cover the catalogue once. ``blocks=1``: every item.

    Raises:
        ValueError: ``blocks`` below 1 or ``round_id`` negative.
    """
    if blocks < 1 or round_id < 0:
        raise ValueError(f"need blocks >= 1 and round_id >= 0, got {blocks}, {round_id}")
    return np.arange(round_id % blocks, n_items, blocks, dtype=np.int64)


def _item_steps(uploads: RowUpdates, server_lr: float) -> RowUpdates:
    """The item rows of each client's block, times ``-server_lr`` (encrypted server state)."""
    n_items = uploads.n_rows - 2
    keep = uploads.rows < n_items
    counts = np.add.reduceat(keep, uploads.indptr[:-1]) if len(keep) else np.zeros(0, int)
    counts[np.diff(uploads.indptr) == 0] = 0
    indptr = np.concatenate([[0], np.cumsum(counts)])
    return RowUpdates(
        uploads.clients,
        indptr,
        uploads.rows[keep],
        -server_lr * uploads.values[keep, :-1],
        n_items,
        dense=True,
    )


@dataclass(frozen=True)
class _GroupRows:
    """A group of clients' ratings (CSR by local client, in learning units) and offsets."""

    indptr: np.ndarray
    items: np.ndarray
    ratings: np.ndarray
    offsets: np.ndarray
    user_mean: np.ndarray


class OnDemandUsers(Protocol):
    """Users whose ratings are generated when a round needs them (``FedMF(population, ...)``)."""

    n_users: int
    n_items: int
    scale: RatingScale

    def rows(self, users: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(indptr, items, ratings)`` of ``users``, CSR in that order, items sorted."""

    def counts(self, users: np.ndarray) -> np.ndarray:
        """Each user's number of ratings."""


def _check_on_demand(config: FedMFConfig) -> None:
    """Refuse, for an on-demand population, what needs every user at once."""
    if config.fills and not config.pseudo_resampled:
        raise ValueError(
            f"variant={config.variant!r} keeps each user's pseudo set for the whole run (stable "
            "pseudo sets), state for every user: not with an on-demand population; use "
            "resample_pseudo=True or a stored Ratings"
        )
    if config.biases and config.offset == "none":
        raise ValueError(
            "biases=True with offset='none' needs a global-mean round over every user: not with "
            "an on-demand population; use offset='user_mean'"
        )


@dataclass(frozen=True)
class _RoundData:
    """The uploads of one round, CSR by participating client (local index)."""

    indptr: np.ndarray
    items: np.ndarray
    errors: np.ndarray
    n_real: np.ndarray


@dataclass(frozen=True)
class _PseudoRows:
    """A group's pseudo items (CSR by local client) merged with its rated items.

    ``owners`` and ``items`` list every uploaded row, rated and pseudo, sorted by (client, item);
    ``at_real`` and ``at_pseudo`` say where the rated and the pseudo entries landed.
    """

    indptr: np.ndarray
    pseudo_items: np.ndarray
    at_real: np.ndarray
    at_pseudo: np.ndarray
    owners: np.ndarray
    items: np.ndarray


class FedMF:
    """The FedMF family as a :class:`securefed.runtime.FederatedAlgorithm`.

    Args:
        train: training ratings; every user is one client. Or a population generated on demand
            (:class:`~securefed.recsys.population.OnDemandPopulation`, any object with its
            ``rows``, ``counts``, ``n_users``, ``n_items`` and ``scale``): a round then reads only
            its own users' ratings, and the users' vectors and biases are
            :class:`~securefed.recsys.user_state.LazyRows` (initial values keyed by user id,
            memory only for the users who took part), so a run over a million users with a
            thousand sampled per round holds a thousand users' state. That mode refuses what
            needs every user at once: FedRec+'s stable pseudo sets (kept for every user) and
            ``biases`` with ``offset="none"`` (a global-mean round over every user).
        config: hyper-parameters.
        seeds: the run's seed tree (initial factors come from its ``("init", ...)`` streams).

    Raises:
        ValueError: an on-demand population with an option that needs every user at once.
    """

    def __init__(
        self, train: Ratings | OnDemandUsers, config: FedMFConfig, seeds: SeedTree
    ) -> None:
        self.config = config
        self.rating_scale: RatingScale = train.scale  # the data's own, which predictions are on
        self.unit = rating_unit(config.rating_unit, train.scale)
        # The scale in learning units (config.rating_unit): every rating below is divided by it.
        self.scale: RatingScale = _scale_in_units(train.scale, self.unit)
        self.n_clients = train.n_users
        self.n_items = train.n_items
        self.population: OnDemandUsers | None = None if isinstance(train, Ratings) else train
        self.expected_clients = config.expected_clients or self.n_clients * (1 - config.dropout)
        if self.population is None:
            self.indptr, self.items, ratings = rating_rows(train)
            self.ratings = ratings / self.unit
            self.user_mean = user_mean_ratings(self.indptr, self.ratings)
            # What each user subtracts from its ratings before factorising (local, never
            # uploaded).
            self.offsets = self._offsets_of(self.indptr, self.user_mean)
            self.U = seeds.generator("init", "users").normal(
                0, config.init_std, (self.n_clients, config.dim)
            )
            self.user_bias = np.zeros(self.n_clients)
        else:
            _check_on_demand(config)
            self.indptr = self.items = self.ratings = self.user_mean = self.offsets = None
            key = int.from_bytes(seeds.key("init", "users", nbytes=8), "little")
            dim, std = config.dim, config.init_std
            self.U = LazyRows(
                self.n_clients,
                (dim,),
                lambda ids: std * keyed_normals(key, ids[:, None] * dim + np.arange(dim)),
            )
            self.user_bias = LazyRows(self.n_clients, (), lambda ids: np.zeros(len(ids)))
        self.V = seeds.generator("init", "items").normal(
            0, config.init_std, (self.n_items, config.dim)
        )
        self.global_mean: np.ndarray | None = None
        self.global_std: np.ndarray | None = None
        # Biases (config.biases): b_u on the devices, b_i on the server beside V.
        self.item_bias = np.zeros(self.n_items)
        self.rating_mean: float | None = None  # the global mean, from RATING_MEAN_ROUND
        self.server_optimiser = ServerOptimiser(config.server_optimiser_config)
        self._state = None  # [[V]] under server_state="encrypted" (transport.encrypted_state)
        # Stable pseudo sets (FedRec+ default): chosen once per user at its first round.
        self.pseudo_chosen = np.zeros(self.n_clients, dtype=bool)
        self.pseudo_indptr = np.zeros(self.n_clients + 1, dtype=np.int64)
        self.pseudo_items = np.zeros(0, dtype=np.int64)

    def _offsets_of(self, indptr: np.ndarray, user_mean: np.ndarray) -> np.ndarray:
        """What each user subtracts from its ratings (``config.offset``; the global mean once
        :meth:`rating_mean_round` obtained it)."""
        if self.config.offset == "user_mean":
            midpoint = (self.scale.minimum + self.scale.maximum) / 2
            return np.where(np.diff(indptr) > 0, user_mean, midpoint)
        return np.zeros(len(indptr) - 1)

    def _group_rows(self, clients: np.ndarray) -> _GroupRows:
        """The ratings (in learning units) and offsets of ``clients``: from the stored CSR, or
        generated on demand for an on-demand population."""
        if self.population is None:
            entries, indptr = take_rows(self.indptr, clients)
            return _GroupRows(
                indptr,
                self.items[entries],
                self.ratings[entries],
                self.offsets[clients],
                self.user_mean[clients],
            )
        indptr, items, ratings = self.population.rows(clients)
        ratings = ratings / self.unit
        user_mean = user_mean_ratings(indptr, ratings)
        return _GroupRows(indptr, items, ratings, self._offsets_of(indptr, user_mean), user_mean)

    def _rating_counts(self, clients: np.ndarray) -> np.ndarray:
        if self.population is None:
            return self.indptr[clients + 1] - self.indptr[clients]
        return self.population.counts(clients)

    @property
    def transport_needs(self) -> TransportNeeds:
        """What this configuration needs from a transport (checked when the run is built)."""
        encrypted = self.config.server_state == "encrypted"
        return TransportNeeds(
            "FedMF", encrypted_state="server_state='encrypted'" if encrypted else None
        )

    # ------------------------------------------------------------------ the round
    def run_round(
        self, round_id: int, clients: np.ndarray, transport: Transport, seeds: SeedTree
    ) -> dict[str, float]:
        """One synchronous round over ``clients`` (see the module docstring).

        The round is :meth:`open_round` (server), :meth:`client_step` (the clients, vectorised)
        and :meth:`close_round` (server); ``securefed.flower`` runs the same three parts with
        the client step on the nodes that hold the users.
        """
        if self.needs_rating_mean:
            self.rating_mean_round(transport, seeds)
        rnd, clients = self.open_round(round_id, clients, transport, seeds)
        submit = lambda uploads: rnd.submit_batch(self.client_uploads(uploads))  # noqa: E731
        squared_error, n_ratings = self.client_step(round_id, clients, seeds, submit)
        self.close_round(rnd)
        return {"train_rmse": np.sqrt(squared_error / n_ratings) if n_ratings else float("nan")}

    def client_uploads(self, uploads: RowUpdates) -> RowUpdates:
        """What a group of clients hands the transport: its uploads, or under
        ``server_state="encrypted"`` the item rows times ``-server_lr`` (Chai et al. 2020,
        Sec. 3.2: each user applies the step size and the server adds ``[[-eta g]]`` into
        ``[[V]]``). The same on a node of ``securefed.flower`` as in :meth:`run_round`."""
        if self.config.server_state == "encrypted":
            return _item_steps(uploads, self.config.server_lr)
        return uploads

    @property
    def update_shape(self) -> tuple[int, int]:
        """The shape of one client's dense upload block (:meth:`client_uploads`)."""
        if self.config.server_state == "encrypted":
            return (self.n_items, self.config.dim)
        return (self.n_items + 2, self.config.width + 1)

    @property
    def needs_rating_mean(self) -> bool:
        """Whether the global mean is still to be obtained (``biases`` with ``offset="none"``)."""
        return self.config.biases and self.config.offset == "none" and self.rating_mean is None

    def rating_mean_round(self, transport: Transport, seeds: SeedTree) -> float:
        """Obtain the global mean rating with one aggregation round through ``transport``.

        Every user uploads the single row ``[sum of its ratings, its number of ratings]`` in a
        transport round of id :data:`RATING_MEAN_ROUND`; the server divides the two sums. Under
        secure aggregation or CKKS the server so learns only the population's two totals, never
        one user's (``tests/test_fedmf_biases.py`` looks for them in the masked uploads); in
        plaintext it sees each user's totals, as it sees every gradient. The view keeps the
        result, ``public["rating_mean"]`` and ``public["rating_mean_round"]``, but not this
        round's record, whose id lies past the training rounds that checkpoints truncate the
        view to (its bytes are therefore not in the view's totals). A transport that charges a
        privacy ledger is refused: that budget is planned for the training rounds, and a sum of
        ratings would need its own clip; the DP preset uses ``offset="user_mean"`` (each user's
        mean stays on its device), which needs no global mean. The mean is kept in the
        checkpoint, so a resumed run does not repeat the round.

        Raises:
            UnsupportedTransport: ``transport`` charges a privacy ledger.
        """
        if transport.privacy_ledgers():
            raise UnsupportedTransport(
                f"biases=True with offset='none' over the {transport.name!r} transport: the "
                "global-mean round is not in the DP budget; use offset='user_mean' (the DP "
                "preset's), which needs no global mean"
            )
        require_capabilities(transport, self.transport_needs)
        clients = np.arange(self.n_clients, dtype=np.int64)
        rnd = transport.open_round(RATING_MEAN_ROUND, clients, shape=(1, 2), seeds=seeds)
        counts = np.diff(self.indptr).astype(np.float64)
        sums = segment_sum(self.ratings[:, None], self.indptr)[:, 0]
        rnd.submit_batch(
            RowUpdates(
                clients,
                np.arange(self.n_clients + 1, dtype=np.int64),
                np.zeros(self.n_clients, dtype=np.int64),
                np.column_stack([sums, counts]),
                1,
            )
        )
        rating_sum, rating_count = rnd.result().total[0]
        if not rating_count > 0:
            raise ValueError("the global-mean round summed no rating: the training set is empty")
        self._set_rating_mean(float(rating_sum / rating_count))
        transport.view.rounds = [r for r in transport.view if r.round_id != RATING_MEAN_ROUND]
        transport.view.public["rating_mean"] = self.rating_mean
        transport.view.public["rating_mean_round"] = {
            "transport": transport.name,
            "clients": self.n_clients,
            "rows": [["sum of the user's ratings", "number of the user's ratings"]],
        }
        return self.rating_mean

    def _set_rating_mean(self, value: float) -> None:
        self.rating_mean = value
        self.offsets = np.full(self.n_clients, value)

    def open_round(
        self, round_id: int, clients: np.ndarray, transport: Transport, seeds: SeedTree
    ) -> tuple[AggregationRound, np.ndarray]:
        """Server side, first half: open the transport round, broadcast, simulate dropouts.

        Returns:
            The open round and the clients that will compute (``config.dropout`` removes some).
        """
        cfg = self.config
        require_capabilities(transport, self.transport_needs)
        if self.needs_rating_mean:
            raise ValueError(
                "biases=True with offset='none' needs the global mean first: run_round obtains "
                "it with rating_mean_round before round 0 (a split client/server deployment "
                "must call rating_mean_round itself)"
            )
        encrypted = cfg.server_state == "encrypted"
        block_rows = self.block_rows(round_id)
        n_rows = self.n_items + 2 if block_rows is None else len(block_rows)
        n_rows, width = (self.n_items, cfg.dim) if encrypted else (n_rows, cfg.width + 1)
        rnd = transport.open_round(round_id, clients, shape=(n_rows, width), seeds=seeds)
        if transport.view.public.get("protocol") != "fedmf":  # also after a warm start
            transport.view.public.update(self.public_parameters())
        rnd.view.public.update({"lr": cfg.lr, "server_lr": cfg.server_lr})
        if block_rows is not None:  # row k of this round's block is item offset + k * stride
            rnd.view.public["item_block"] = {
                "offset": round_id % cfg.item_blocks,
                "stride": cfg.item_blocks,
            }
        if encrypted:
            state = self._encrypted_state(transport)
            if state.can_reveal:
                self.V = state.download(rnd)  # users decrypt [[V]]
            else:  # a federation's server: broadcast_state() carries [[V]], the nodes decrypt
                state.send(rnd)
        else:
            rnd.broadcast("V", self.V)
        if cfg.biases:  # every client needs b_i for its errors; the server holds it anyway
            rnd.broadcast("item_bias", self.item_bias)
        if self.global_mean is not None and cfg.client_weighting == "wasserstein":
            rnd.broadcast("global_stats", np.stack([self.global_mean, self.global_std]))
        clients = rnd.clients
        if cfg.dropout > 0 and len(clients):
            gone = seeds.generator("dropout", round_id).random(len(clients)) < cfg.dropout
            for client in clients[gone]:
                rnd.drop(int(client))
            clients = clients[~gone]
        return rnd, clients

    def broadcast_state(self) -> dict[str, np.ndarray]:
        """What :meth:`open_round` sends every client: ``V``, the item biases (with ``biases``) and
        FedRec+'s global statistics.

        Under ``server_state="encrypted"`` on a server without the key (``securefed.flower``)
        ``V`` goes as its ciphertexts, ``V.ct_*`` (:meth:`EncryptedState.to_arrays`), which the
        nodes decrypt with the users' shared key before :meth:`load_broadcast`.
        """
        if self._state is not None and not self._state.can_reveal:
            state = self._state.to_arrays("V")
        else:
            state = {"V": self.V}
        if self.config.biases:
            state["item_bias"] = self.item_bias
        if self.global_mean is not None and self.config.client_weighting == "wasserstein":
            state["global_stats"] = np.stack([self.global_mean, self.global_std])
        return state

    def load_broadcast(self, state: Mapping[str, np.ndarray]) -> None:
        """Client side: take what :meth:`broadcast_state` sent (on a node holding some users)."""
        if "V" not in state:
            raise ValueError(
                "the broadcast lacks V"
                + (
                    ": it holds the encrypted [[V]], which the node decrypts with the users' "
                    "shared key first (securefed.flower: ckks-secret-path)"
                    if "V.ct_bytes" in state
                    else ""
                )
            )
        V = np.asarray(state["V"], dtype=np.float64)
        if V.shape != self.V.shape:
            raise ValueError(f"the broadcast V has shape {V.shape}, expected {self.V.shape}")
        self.V = V
        if self.config.biases:
            if "item_bias" not in state:
                raise ValueError("the broadcast lacks item_bias, which a model with biases needs")
            self.item_bias = np.asarray(state["item_bias"], dtype=np.float64)
        if "global_stats" in state:
            self.global_mean, self.global_std = np.asarray(state["global_stats"], np.float64)

    def client_step(
        self,
        round_id: int,
        clients: np.ndarray,
        seeds: SeedTree,
        submit: Callable[[RowUpdates], None],
    ) -> tuple[float, int]:
        """Client side: each of ``clients`` steps its vector and hands ``submit`` its upload.

        Returns:
            The clients' summed squared training error and their number of ratings.
        """
        squared_error, n_ratings = 0.0, 0
        for group in self._client_groups(np.asarray(clients, dtype=np.int64)):
            new_vectors, new_biases, uploads, errors = self._clients_compute(round_id, group, seeds)
            submit(uploads)
            # Safe before the aggregate: groups are disjoint and V only changes below.
            self.U[group] = new_vectors
            self.user_bias[group] = new_biases
            squared_error, n_ratings = (
                squared_error + float(errors @ errors),
                n_ratings + len(errors),
            )
        return squared_error, n_ratings

    def close_round(self, rnd: AggregationRound) -> None:
        """Server side, second half: read the aggregate and step ``V`` (or fold ``[[V]]``)."""
        if self.config.server_state == "encrypted":
            rnd.fold_into(self._state)  # [[V]] += sum of [[-eta g]]: nothing is decrypted
            if self._state.can_reveal:  # in one process: the users' view, for evaluation
                self.V = self._state.reveal()
        else:
            aggregate = rnd.result()
            total, block_rows = aggregate.total, self.block_rows(rnd.round_id)
            if block_rows is not None:  # the block's sums in place, zero elsewhere
                total = np.zeros((self.n_items + 2, total.shape[1]))
                total[block_rows] = aggregate.total
            self._server_step(total, len(aggregate.contributors), block_rows)

    def block_rows(self, round_id: int) -> np.ndarray | None:
        """The rows of the dense block that round ``round_id`` aggregates under ``item_blocks``:
        its items (:func:`item_block`) and the two statistics rows; ``None`` with one block."""
        if self.config.item_blocks == 1:
            return None
        items = item_block(round_id, self.n_items, self.config.item_blocks)
        return np.concatenate([items, [self.n_items, self.n_items + 1]])

    def _encrypted_state(self, transport: Transport):
        """``[[V]]`` on the server, encrypted by a key holder when first needed (in one process;
        a federation's server is given it with :meth:`load_encrypted_state`)."""
        if self._state is None:
            self._state = transport.encrypted_state(self.V)
        return self._state

    @property
    def encrypted_state(self):
        """``[[V]]`` under ``server_state="encrypted"`` once made or loaded, else ``None``."""
        return self._state

    def initial_state(self) -> np.ndarray:
        """The matrix a key holder encrypts into the initial ``[[V]]``: FedMF's initial ``V``
        (on a ``securefed.flower`` node, whose model is built afresh for every message)."""
        return self.V

    def load_encrypted_state(self, state) -> None:
        """Server side: hold ``state``, a key holder's ``[[V]]`` (``securefed.flower``).

        On a server without the key the plaintext ``V`` is then forgotten (set to NaN, so a
        stray use fails visibly): from here on the server holds ``[[V]]`` only.

        Raises:
            ValueError: plaintext server state, or a state of another shape than ``V``.
        """
        if self.config.server_state != "encrypted":
            raise ValueError("load_encrypted_state needs server_state='encrypted'")
        if tuple(state.shape) != tuple(self.V.shape):
            raise ValueError(f"the encrypted state has shape {state.shape}, V {self.V.shape}")
        self._state = state
        if not state.can_reveal:
            self.V = np.full(self.V.shape, np.nan)

    def _client_groups(self, clients: np.ndarray) -> list[np.ndarray]:
        """Split the round's clients into groups of about ``chunk_ratings`` ratings."""
        sizes = np.cumsum(self._rating_counts(clients))
        cuts = (
            np.searchsorted(
                sizes,
                np.arange(1, 1 + sizes[-1] // self.config.chunk_ratings)
                * self.config.chunk_ratings,
                side="right",
            )
            if len(sizes)
            else []
        )
        return [g for g in np.split(clients, np.unique(cuts)) if len(g)]

    def _clients_compute(
        self, round_id: int, clients: np.ndarray, seeds: SeedTree
    ) -> tuple[np.ndarray, RowUpdates, np.ndarray]:
        """Everything a group of clients does locally, vectorised over them.

        Returns:
            The clients' new vectors, their uploads, and their training errors (for metrics).
        """
        cfg = self.config
        group = self._group_rows(clients)
        indptr, items = group.indptr, group.items
        owner = row_ids(indptr)
        ratings = group.ratings - group.offsets[owner]
        counts = np.diff(indptr).astype(np.float64)
        user, user_bias = self.U[clients], self.user_bias[clients]
        pseudo = self._pseudo_rows(round_id, clients, indptr, items, seeds) if cfg.fills else None
        pseudo_dot = None
        if pseudo is not None and cfg.gradient_user_vector == "before":
            # The pseudo rows' gradients use the same vectors: one scoring pass for both lists.
            scores = self._scores(user, user_bias, pseudo.owners, pseudo.items)
            real_scores, pseudo_dot = scores[pseudo.at_real], scores[pseudo.at_pseudo]
        else:
            real_scores = self._scores(user, user_bias, owner, items)
        errors = ratings - real_scores
        if not np.isfinite(errors).all():
            raise FloatingPointError(
                f"FedMF diverged by round {round_id}: predictions are no longer finite; "
                "lower lr / server_lr (under DP: aggregation='fixed', user_level_dp_config)"
            )
        before, bias_before, errors_before = user, user_bias, errors
        for step in range(cfg.local_steps):
            if step:
                errors = ratings - self._scores(user, user_bias, owner, items)
            user, user_bias = self._user_step(user, user_bias, errors, items, indptr, counts)
        after = cfg.gradient_user_vector == "after"
        gradient_user, gradient_bias = (user, user_bias) if after else (before, bias_before)
        real_errors = (
            ratings - self._scores(user, user_bias, owner, items) if after else errors_before
        )
        data = self._with_pseudo_items(
            round_id,
            clients,
            group,
            real_errors,
            (gradient_user, gradient_bias),
            seeds,
            pseudo,
            pseudo_dot,
        )
        uploads = self._encode_uploads(round_id, clients, data, gradient_user)
        return user, user_bias, uploads, errors_before

    def _scores(self, user, user_bias, owner, items) -> np.ndarray:
        """``<U_u, V_i>`` (plus ``b_u + b_i`` with biases) for entries ``(owner, items)``."""
        dot = rated_dot(user, self.V, owner, items)
        if self.config.biases:
            dot = dot + user_bias[owner] + self.item_bias[items]
        return dot

    def _user_step(self, user, user_bias, errors, items, indptr, counts):
        """``U_u <- U_u - gamma (-2 sum_i e_ui V_i [/ n_u] + 2 lambda U_u)`` for every client,
        and with biases ``b_u <- b_u - gamma (-2 sum_i e_ui [/ n_u] + 2 mu_b b_u)``."""
        cfg = self.config
        residuals = sparse.csr_matrix((errors, items, indptr), shape=(len(user), self.n_items))
        pull = residuals @ self.V
        if cfg.user_step == "mean":
            pull = pull / np.maximum(counts, 1)[:, None]
        # user_damping: k zero-error ratings more in the user's mean, so that a light user's
        # vector is shrunk as if it had k more ratings at its prediction (1 when k = 0).
        damping = 1.0 + cfg.user_damping / np.maximum(counts, 1) if cfg.user_damping else 1.0
        reg_user = cfg.reg_user * (damping[:, None] if cfg.user_damping else 1.0)
        new_user = user - cfg.lr * (-2.0 * pull + 2.0 * reg_user * user)
        if not cfg.biases:
            return new_user, user_bias
        bias_pull = segment_sum(errors[:, None], indptr)[:, 0]
        if cfg.user_step == "mean":
            bias_pull = bias_pull / np.maximum(counts, 1)
        reg_bias = cfg.reg_bias * damping
        return new_user, user_bias - cfg.lr * (-2.0 * bias_pull + 2.0 * reg_bias * user_bias)

    def _pseudo_rows(self, round_id, clients, indptr, items, seeds) -> _PseudoRows:
        """The group's pseudo items and where rated and pseudo rows land in each client's upload.

        Each client's rows are sorted by item (rated-then-pseudo order would tell them apart):
        both lists are sorted by (client, item) already, so one merge places every entry.
        """
        pseudo_indptr, pseudo_items = self._pseudo_sets(round_id, clients, indptr, items, seeds)
        pseudo_owner = row_ids(pseudo_indptr)
        at_real, at_pseudo = merge_sorted(
            row_ids(indptr) * self.n_items + items, pseudo_owner * self.n_items + pseudo_items
        )
        all_items = np.empty(len(items) + len(pseudo_items), dtype=np.int64)
        all_items[at_real], all_items[at_pseudo] = items, pseudo_items
        return _PseudoRows(
            pseudo_indptr,
            pseudo_items,
            at_real,
            at_pseudo,
            row_ids(indptr + pseudo_indptr),
            all_items,
        )

    def _with_pseudo_items(
        self,
        round_id,
        clients,
        group: _GroupRows,
        real_errors,
        gradient_vectors,
        seeds,
        pseudo: _PseudoRows | None,
        pseudo_dot: np.ndarray | None,
    ) -> _RoundData:
        """Append each client's pseudo items and the errors of their virtual ratings.

        ``pseudo_dot``: the pseudo rows' scores at ``gradient_vectors`` if already computed.
        """
        cfg = self.config
        indptr, items = group.indptr, group.items
        n_real = np.diff(indptr)
        if pseudo is None:
            return _RoundData(indptr, items, real_errors, n_real)
        pseudo_indptr, pseudo_items = pseudo.indptr, pseudo.pseudo_items
        pseudo_owner = row_ids(pseudo_indptr)
        if pseudo_dot is None:
            pseudo_dot = self._scores(*gradient_vectors, pseudo_owner, pseudo_items)
        # With the gradient taken at the vector before the step, that is the prediction too.
        current_dot = pseudo_dot if cfg.gradient_user_vector == "before" else None
        virtual = self._virtual_ratings(
            round_id, clients, group, pseudo_indptr, pseudo_items, seeds, current_dot
        )
        pseudo_errors = virtual - group.offsets[pseudo_owner] - pseudo_dot
        all_errors = np.empty(len(pseudo.items))
        all_errors[pseudo.at_real], all_errors[pseudo.at_pseudo] = real_errors, pseudo_errors
        return _RoundData(indptr + pseudo_indptr, pseudo.items, all_errors, n_real)

    def _pseudo_counts(self, rated_counts: np.ndarray) -> np.ndarray:
        """``rho * n_u`` pseudo items; FedRec+ pads light users to more than ``dim`` uploaded rows,
        since with at most ``dim`` rows one user step pins down which rows are real."""
        minimum = self.config.dim + 1 if self.config.variant == "fedrec+" else 0
        ratio = self.config.pseudo_ratio
        return pseudo_counts(rated_counts, self.n_items, ratio, minimum_rows=minimum)

    def _pseudo_sets(self, round_id, clients, indptr, items, seeds):
        cfg = self.config
        counts = self._pseudo_counts(np.diff(indptr))
        if cfg.pseudo_resampled:
            return sample_unrated(
                indptr, items, self.n_items, counts, seeds.generator("pseudo", round_id)
            )
        new = clients[~self.pseudo_chosen[clients]]
        if len(new):
            self._choose_stable_sets(new, round_id, seeds)
        entries, pseudo_indptr = take_rows(self.pseudo_indptr, clients)
        return pseudo_indptr, self.pseudo_items[entries]

    def _choose_stable_sets(self, users: np.ndarray, round_id: int, seeds: SeedTree) -> None:
        """Fix the pseudo sets of ``users`` for the rest of the run (FedRec+: by similarity)."""
        entries, indptr = take_rows(self.indptr, users)
        items = self.items[entries]
        counts = self._pseudo_counts(np.diff(indptr))
        if self.config.variant == "fedrec+":
            new_indptr, new_items = most_similar_unrated(indptr, items, self.V, counts)
        else:
            rng = seeds.generator("pseudo", "stable", round_id)
            new_indptr, new_items = sample_unrated(indptr, items, self.n_items, counts, rng)
        # Rebuild the population's CSR with the new users' sets in place.
        lengths = np.diff(self.pseudo_indptr)
        lengths[users] = np.diff(new_indptr)
        old_entries, _ = take_rows(self.pseudo_indptr, np.arange(self.n_clients))
        per_user_items = np.split(self.pseudo_items[old_entries], self.pseudo_indptr[1:-1])
        for k, user in enumerate(users):
            per_user_items[user] = new_items[new_indptr[k] : new_indptr[k + 1]]
        self.pseudo_items = np.concatenate(per_user_items).astype(np.int64)
        self.pseudo_indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        self.pseudo_chosen[users] = True

    def _virtual_ratings(
        self, round_id, clients, group: _GroupRows, pseudo_indptr, pseudo_items, seeds, current_dot
    ):
        """Virtual ratings of the pseudo items (``current_dot``: ``<U_u, V_j>`` if known)."""
        cfg = self.config
        indptr, items = group.indptr, group.items
        owner = row_ids(pseudo_indptr)
        if cfg.virtual_source == "similar":
            # From the similar rated items: a prediction <U_u, V_j> would equal what the server
            # computes from the recovered U_u, marking the pseudo rows (docs/attacks.md).
            rated = group.ratings
            if cfg.biases:  # the neighbours' ratings net of their item bias, plus the item's own
                rated = rated - self.item_bias[items]
            virtual = similarity_weighted_ratings(
                indptr, items, rated, pseudo_indptr, pseudo_items, self.V
            )
            if cfg.biases:
                virtual = virtual + self.item_bias[pseudo_items]
        elif round_id >= cfg.warmup_rounds or cfg.virtual_source == "prediction":
            if current_dot is None:
                current_dot = self._scores(
                    self.U[clients], self.user_bias[clients], owner, pseudo_items
                )
            virtual = group.offsets[owner] + current_dot
        else:
            virtual = group.user_mean[owner]
        virtual = self.scale.clip(virtual)
        if not cfg.virtual_snapped:
            return virtual
        if cfg.virtual_rounding == "nearest":
            return self.scale.snap(virtual)
        seed = int.from_bytes(seeds.key("virtual", round_id, nbytes=8), "little")
        uniforms = keyed_uniforms(seed, clients[owner] * self.n_items + pseudo_items)
        return self.scale.clip(
            stochastic_snap(virtual, self.scale.minimum, self.scale.step, uniforms)
        )

    def _encode_uploads(
        self, round_id: int, clients: np.ndarray, data: _RoundData, gradient_user: np.ndarray
    ) -> RowUpdates:
        """Build the ``(n_items + 2, dim + 1)`` row blocks of a group of clients.

        Each client's two statistics rows are laid out after its item rows with a zero item
        vector and a zero error, so every row comes out of one vectorised pass and only the
        ``2 * len(clients)`` statistics rows are written afterwards. Under ``item_blocks`` the
        entries outside the round's block are then dropped and the rows renumbered (the
        statistics, computed from every uploaded row, are kept as they are).
        """
        cfg = self.config
        n, d, b = len(clients), cfg.dim, int(cfg.biases)
        stats_indptr = np.arange(0, 2 * n + 1, 2, dtype=np.int64)
        indptr, at_items, at_stats = merge_rows(data.indptr, stats_indptr)
        rows = np.empty(indptr[-1], dtype=np.int64)
        errors = np.zeros(indptr[-1])
        rows[at_items], errors[at_items] = data.items, data.errors
        rows[at_stats] = np.tile([self.n_items, self.n_items + 1], n)
        owner = row_ids(indptr)
        # Row k is [-2 e_k U_owner + 2 mu V_item, 1]: a client factor [U, 0] times -2 e_k plus a
        # row factor [2 mu V, 1] (statistics rows have e = 0 and a zero row factor). Kept
        # factored: a plaintext sum never builds the (nnz, dim + 1) values (FactoredRows).
        # With biases the item bias's gradient -2 e_k + 2 mu_b b_item is column d: client
        # factor [U, s, 0], row factor [2 mu V, 2 mu_b s b, 1] (s = bias_upload_scale).
        bias_scale = cfg.bias_upload_scale
        user_part = np.hstack([gradient_user, np.full((n, b), bias_scale), np.zeros((n, 1))])
        item_part = np.zeros((self.n_items + 2, d + b + 1))
        fixed = cfg.aggregation == "fixed"
        if not fixed:  # under "fixed" the server applies mu itself (public, outside the clip)
            item_part[: self.n_items, :d] = 2.0 * cfg.row_reg_item * self.V
            if b:
                item_part[: self.n_items, d] = 2.0 * cfg.row_reg_bias * bias_scale * self.item_bias
            item_part[: self.n_items, d + b] = 1.0
        coef = -2.0 * errors
        uploaded = np.diff(data.indptr).astype(np.float64)
        if cfg.client_weighting == "wasserstein":
            gradient_sum, gradient_sq = self._gradient_moments(data, gradient_user)
        else:  # the statistics only feed the Wasserstein weights
            gradient_sum = gradient_sq = np.zeros((n, d))
        weights = client_weights(
            cfg.client_weighting,
            uploaded,
            gradient_sum,
            gradient_sq,
            self.global_mean,
            self.global_std,
            cfg.tau,
            cfg.count_cap,
        )
        scale = None
        if cfg.client_weighting != "uniform":
            scale = weights[owner]
            coef = coef * scale
        explicit_at, explicit = np.zeros(0, dtype=np.int64), None
        if not fixed:
            explicit_at = np.concatenate([at_stats[0::2], at_stats[1::2]])
            no_bias = np.zeros((n, b))  # the statistics describe the factor gradients only
            explicit = np.vstack(
                [
                    np.hstack([gradient_sum, no_bias, uploaded[:, None]]),
                    np.hstack([gradient_sq, no_bias, weights[:, None]]),
                ]
            )
        block_rows = self.block_rows(round_id)
        if block_rows is not None:
            indptr, rows, kept = restrict_rows(indptr, rows, block_rows, self.n_items + 2)
            coef, scale = coef[kept], None if scale is None else scale[kept]
            explicit_at = (np.cumsum(kept) - 1)[explicit_at]
            item_part = item_part[block_rows]
        values = FactoredRows(coef, user_part, item_part, scale, explicit_at, explicit)
        return RowUpdates(clients, indptr, rows, values, len(item_part), dense=cfg.upload == "full")

    def _gradient_moments(
        self, data: _RoundData, gradient_user: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Each client's sum and sum of squares of its uploaded factor gradients (FedRec+).

        Row ``k`` of client ``u`` is ``c_k U_u + P_k`` with ``c_k = -2 e_k`` and ``P_k = 2 mu'
        V_{i_k}``, so ``sum_k g_k = U_u sum_k c_k + sum_k P_k`` and, per coordinate,
        ``sum_k g_k^2 = U_u^2 sum_k c_k^2 + 2 U_u sum_k c_k P_k + sum_k P_k^2``: three sparse
        products with ``V``'s rows instead of building the ``(rows, dim)`` gradients (equal up to
        rounding; a variance that rounding pushes below zero is clamped by
        :func:`moments_from_sums`).
        """
        coef = -2.0 * data.errors
        shape = (len(gradient_user), self.n_items)
        row_factor = 2.0 * self.config.row_reg_item * self.V
        rated = sparse.csr_matrix((np.ones(len(coef)), data.items, data.indptr), shape=shape)
        weighted = sparse.csr_matrix((coef, data.items, data.indptr), shape=shape)
        coef_sum = segment_sum(coef, data.indptr)[:, None]
        coef_sq = segment_sum(coef * coef, data.indptr)[:, None]
        d = row_factor.shape[1]
        rated_sums = rated @ np.hstack([row_factor, row_factor * row_factor])  # one pass
        gradient_sum = gradient_user * coef_sum + rated_sums[:, :d]
        gradient_sq = (
            gradient_user**2 * coef_sq
            + 2.0 * gradient_user * (weighted @ row_factor)
            + rated_sums[:, d:]
        )
        return np.asarray(gradient_sum), np.asarray(gradient_sq)

    def _server_step(
        self, total: np.ndarray, contributors: int, block_rows: np.ndarray | None = None
    ) -> None:
        """Step ``V`` with the aggregated gradient and refresh the global statistics.

        ``"mean"`` divides each item's weighted gradient sum by its weighted uploader count;
        ``"sum"`` rescales the weighted sum so that the client weights average to one;
        ``"fixed"`` divides the sum by the public ``expected_clients``. With ``block_rows``
        (``item_blocks``) only the round's block steps (``total`` is zero elsewhere).
        """
        cfg = self.config
        d, n = cfg.dim, self.n_items
        item_gradient, item_weight = total[:n, :d], total[:n, -1]
        # The item-bias column arrives times bias_upload_scale (exactly 1 by default: no change).
        bias_gradient = total[:n, d] / cfg.bias_upload_scale if cfg.biases else None
        stats_sum, stats_sq = total[n, [*range(d), -1]], total[n + 1, [*range(d), -1]]
        if cfg.aggregation == "mean":
            touched = item_weight > 1e-12
            if cfg.item_damping > 0:  # k zero-error rows per item, added by the server
                k = cfg.item_damping
                item_gradient = item_gradient + 2.0 * k * cfg.row_reg_item * self.V
                if cfg.biases:
                    bias_gradient = bias_gradient + 2.0 * k * cfg.row_reg_bias * self.item_bias
                item_weight = item_weight + k
            floor = np.maximum(item_weight, cfg.min_item_weight)
            scale = np.divide(1.0, floor, out=np.zeros_like(floor), where=touched)
        elif cfg.aggregation == "fixed":
            # The server regularises the V it holds: no privacy cost, and it damps the random
            # walk that DP noise would otherwise leave in rarely rated items.
            step = item_gradient / self.expected_clients + 2 * cfg.reg_item * self.V
            bias_step = None
            if cfg.biases:
                bias_step = (
                    bias_gradient / self.expected_clients + 2 * cfg.reg_bias * self.item_bias
                )
            block = None if block_rows is None else block_rows[:-2]
            if cfg.server_optimiser == "sgd":
                if block is not None:  # the server's decay too: only the round's block steps
                    step[np.setdiff1d(np.arange(n), block)] = 0.0
                    if cfg.biases:
                        bias_step[np.setdiff1d(np.arange(n), block)] = 0.0
                self.V = self.V - cfg.server_lr * step
                if cfg.biases:
                    self.item_bias = self.item_bias - cfg.server_lr * bias_step
            else:
                self._optimiser_step(step, bias_step, rows=block)
            return
        else:
            weight_total = stats_sq[-1]
            factor = contributors / weight_total if weight_total > 1e-12 else 0.0
            scale = np.full(self.n_items, factor)
            touched = None
            if block_rows is not None:
                touched = np.zeros(self.n_items, dtype=bool)
                touched[block_rows[:-2]] = True
        if cfg.server_optimiser == "sgd":
            self.V = self.V - cfg.server_lr * scale[:, None] * item_gradient
            if cfg.biases:
                self.item_bias = self.item_bias - cfg.server_lr * scale * bias_gradient
        else:
            rows = None if touched is None else np.flatnonzero(touched)
            bias_step = scale * bias_gradient if cfg.biases else None
            self._optimiser_step(scale[:, None] * item_gradient, bias_step, rows=rows)
        if stats_sum[-1] > 0:
            mean, std = moments_from_sums(stats_sum[:-1], stats_sq[:-1], stats_sum[-1])
            self.global_mean, self.global_std = mean, std

    def _optimiser_step(self, step, bias_step, rows) -> None:
        """Move ``V`` (and ``b_i``) against the aggregated gradient with the server rule."""
        self.V = self.server_optimiser.step("V", self.V, -step, rows=rows)
        if bias_step is not None:
            self.item_bias = self.server_optimiser.step(
                "item_bias", self.item_bias, -bias_step, rows=rows
            )

    # ------------------------------------------------------------------ evaluation and state
    def predict(self, users: np.ndarray, items: np.ndarray) -> np.ndarray:
        """Predicted ratings, clipped to the rating scale."""
        users, items = np.asarray(users), np.asarray(items)
        if self.needs_rating_mean:
            raise ValueError("biases=True with offset='none': no prediction before round 0")
        if self.population is not None:  # the predicted users' state only
            distinct, at = np.unique(users, return_inverse=True)
            offsets = self._group_rows(distinct).offsets[at]
            scores = self._scores(self.U[distinct], self.user_bias[distinct], at, items)
            return self.rating_scale.clip(self.unit * (offsets + scores))
        scores = self._scores(self.U, self.user_bias, users, items)
        return self.rating_scale.clip(self.unit * (self.offsets[users] + scores))

    def public_parameters(self) -> dict[str, object]:
        return self.config.public() | {
            "n_users": self.n_clients,
            "n_items": self.n_items,
            "rating_scale": [
                self.rating_scale.minimum,
                self.rating_scale.maximum,
                self.rating_scale.step,
            ],
            "rating_unit_size": self.unit,
            "block_rows": self.n_items + 2,
            "block_columns": self.config.width + 1,
            "item_bias_column": self.config.dim if self.config.biases else None,
        }

    def state_dict(self) -> dict[str, np.ndarray]:
        """Everything needed to continue (an on-demand population's users: those who took
        part, ``U_users`` with their ``U`` rows and ``user_bias``)."""
        if self.population is not None:
            users, vectors = self.U.state()
            state = {
                "U_users": users,
                "U": vectors,
                "user_bias": self.user_bias[users],
                "V": self.V,
                "item_bias": self.item_bias,
            }
            if self.global_mean is not None:
                state["global_mean"], state["global_std"] = self.global_mean, self.global_std
            for key, value in self.server_optimiser.state_dict().items():
                state[SERVER_OPTIMISER_PREFIX + key] = value
            return state
        state = {
            "U": self.U,
            "V": self.V,
            "pseudo_chosen": self.pseudo_chosen,
            "pseudo_indptr": self.pseudo_indptr,
            "pseudo_items": self.pseudo_items,
        }
        if self.global_mean is not None:
            state["global_mean"], state["global_std"] = self.global_mean, self.global_std
        if self.config.biases:
            state["user_bias"], state["item_bias"] = self.user_bias, self.item_bias
        if self.rating_mean is not None:
            state["rating_mean"] = np.array(self.rating_mean)
        for key, value in self.server_optimiser.state_dict().items():
            state[SERVER_OPTIMISER_PREFIX + key] = value
        return state

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        if self.population is not None:
            if "U_users" not in state or state["V"].shape != self.V.shape:
                raise ValueError(
                    "not a checkpoint of an on-demand population of this shape (needs U_users "
                    f"and V of shape {self.V.shape})"
                )
            users = np.asarray(state["U_users"], dtype=np.int64)
            self.U.load(users, np.asarray(state["U"], dtype=np.float64))
            self.user_bias.load(users, np.asarray(state["user_bias"], dtype=np.float64))
            self.V = np.array(state["V"], dtype=np.float64)
            self.item_bias = np.array(state["item_bias"], dtype=np.float64)
            self.global_mean = np.array(state["global_mean"]) if "global_mean" in state else None
            self.global_std = np.array(state["global_std"]) if "global_std" in state else None
            self._load_optimiser(state)
            return
        for name in ("U", "V"):
            if state[name].shape != getattr(self, name).shape:
                raise ValueError(
                    f"checkpoint {name} has shape {state[name].shape}, "
                    f"expected {getattr(self, name).shape}"
                )
        self.U, self.V = np.array(state["U"]), np.array(state["V"])
        self.pseudo_chosen = np.array(state["pseudo_chosen"])
        self.pseudo_indptr = np.array(state["pseudo_indptr"])
        self.pseudo_items = np.array(state["pseudo_items"])
        self.global_mean = np.array(state["global_mean"]) if "global_mean" in state else None
        self.global_std = np.array(state["global_std"]) if "global_std" in state else None
        if self.config.biases:
            for name in ("user_bias", "item_bias"):
                if name not in state or state[name].shape != getattr(self, name).shape:
                    raise ValueError(
                        f"checkpoint lacks {name} of shape {getattr(self, name).shape} "
                        "(biases=True)"
                    )
            self.user_bias = np.array(state["user_bias"], dtype=np.float64)
            self.item_bias = np.array(state["item_bias"], dtype=np.float64)
        if "rating_mean" in state:
            self._set_rating_mean(float(state["rating_mean"]))
        self._load_optimiser(state)

    def _load_optimiser(self, state: Mapping[str, np.ndarray]) -> None:
        optimiser_state = {
            key[len(SERVER_OPTIMISER_PREFIX) :]: value
            for key, value in state.items()
            if key.startswith(SERVER_OPTIMISER_PREFIX)
        }
        if optimiser_state:  # checkpoints from before server optimisers hold none (plain sgd)
            self.server_optimiser.load_state_dict(optimiser_state)
