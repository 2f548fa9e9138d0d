"""FedMF canaries for the empirical privacy audit (:mod:`securefed.audit.empirical`).

Two kinds of canary, each included in a run independently with probability 1/2 (Steinke, Nasr
and Jagielski 2023, "Privacy Auditing with One (1) Training Run"):

* **Rating canaries**: extra users with a distinctive set of ratings (``items_per_canary``
  random items, each rated at the bottom or the top of the scale at random). An included canary
  rates them; an excluded one takes part with no ratings (its upload is zero), so who takes part
  is the same either way and only the data differs. Scored

  - black-box (:func:`rating_fit_score`), on the released item factors ``V`` alone: how well
    the best ridge-fitted user vector explains the canary's ratings (an included canary has
    pulled its items' factors towards its pattern);
  - white-box (:func:`rating_payload_score`), on the ServerView with this package's attacks:
    the items its upload reveals (:func:`~securefed.attacks.gradient_inversion.extract_upload`)
    and, where the protocol allows it, the ratings the one-round inversion
    (:func:`~securefed.attacks.gradient_inversion.invert_one_round`) recovers.

* **Direction canaries** (white-box, the "Dirac canary" of the one-run paper): extra clients
  whose update is one crafted direction: ``direction_norm`` at one coordinate of FedMF's upload
  block that every real user leaves at zero under ``aggregation="fixed"`` (the count column of
  the item rows and the two statistics rows; :func:`direction_coordinates`), and zero elsewhere.
  An excluded one submits zeros. Correct DP clips the canary to the clip norm and buries it in
  noise of std ``sigma * clip``; the score is the coordinate's value summed over the rounds of
  the released aggregates (:func:`direction_release_score`: the released model's observers) or
  of what the server itself saw (:func:`direction_server_score`: each client's payload where the
  transport shows it, else the sum it decoded). The server's step ignores those coordinates, so
  the canaries leave the model untouched.

:class:`CanaryFedMF` runs a :class:`~securefed.recsys.fedmf.FedMF` with the direction canaries
as extra clients (a :class:`~securefed.runtime.FederatedAlgorithm`);
:func:`with_rating_canaries` appends the rating canaries to the training data.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from securefed import RoundSelection, RowUpdates, SeedTree, Transport
from securefed.attacks.gradient_inversion import (
    FedMFProtocol,
    InversionError,
    extract_upload,
    invert_one_round,
)
from securefed.recsys.data import Ratings, RatingScale
from securefed.recsys.fedmf import FedMF, FedMFConfig
from securefed.views import ServerView

RELEASED_SUMS = ("dp_total", "total")
"""The aggregates the direction scores sum over rounds (``dp_total`` falls back to ``total``)."""


# ----------------------------------------------------------------------------- rating canaries
@dataclass(frozen=True, eq=False)
class RatingCanaries:
    """The distinctive rating sets of ``n`` canary users (CSR by canary).

    Attributes:
        indptr: ``n + 1`` offsets into ``items`` and ``ratings``.
        items: item of each canary rating (sorted within a canary).
        ratings: rating of each.
    """

    indptr: np.ndarray
    items: np.ndarray
    ratings: np.ndarray

    def __len__(self) -> int:
        return len(self.indptr) - 1

    def of(self, canary: int) -> tuple[np.ndarray, np.ndarray]:
        """``(items, ratings)`` of one canary."""
        lo, hi = self.indptr[canary], self.indptr[canary + 1]
        return self.items[lo:hi], self.ratings[lo:hi]


def draw_rating_canaries(
    n_canaries: int,
    n_items: int,
    items_per_canary: int,
    scale: RatingScale,
    rng: np.random.Generator,
) -> RatingCanaries:
    """``n_canaries`` users, each rating ``items_per_canary`` random items at a scale extreme.

    Raises:
        ValueError: no canary, or more items per canary than the catalogue holds.
    """
    if n_canaries < 1:
        raise ValueError(f"n_canaries must be >= 1, got {n_canaries}")
    if not 1 <= items_per_canary <= n_items:
        raise ValueError(f"items_per_canary must lie in [1, {n_items}], got {items_per_canary}")
    items = np.concatenate(
        [np.sort(rng.choice(n_items, items_per_canary, replace=False)) for _ in range(n_canaries)]
    )
    extremes = np.array([scale.minimum, scale.maximum])
    ratings = extremes[rng.integers(0, 2, len(items))]
    indptr = np.arange(n_canaries + 1, dtype=np.int64) * items_per_canary
    return RatingCanaries(indptr, items.astype(np.int64), ratings.astype(np.float64))


def with_rating_canaries(train: Ratings, canaries: RatingCanaries, included: np.ndarray) -> Ratings:
    """``train`` with the canaries appended as users ``train.n_users + i``.

    Canary ``i`` rates its items when ``included[i]``; otherwise it is a user without ratings
    (it takes part and uploads nothing of its own).

    Raises:
        ValueError: ``included`` does not have one entry per canary.
    """
    included = np.asarray(included, dtype=bool)
    if included.shape != (len(canaries),):
        raise ValueError(f"included has {included.size} entries for {len(canaries)} canaries")
    users, items, ratings = [train.users], [train.items], [train.ratings]
    for i in np.flatnonzero(included):
        canary_items, canary_ratings = canaries.of(int(i))
        users.append(np.full(len(canary_items), train.n_users + i))
        items.append(canary_items)
        ratings.append(canary_ratings)
    timestamps = None
    if train.timestamps is not None:
        extra = sum(len(u) for u in users[1:])
        last = int(train.timestamps.max()) if len(train.timestamps) else 0
        timestamps = np.concatenate([train.timestamps, last + 1 + np.arange(extra)])
    n_users = train.n_users + len(canaries)
    canary_ids = np.arange(len(canaries)) + (int(train.user_ids.max()) + 1 if train.n_users else 0)
    return Ratings(
        users=np.concatenate(users),
        items=np.concatenate(items),
        ratings=np.concatenate(ratings),
        timestamps=timestamps,
        n_users=n_users,
        n_items=train.n_items,
        scale=train.scale,
        user_ids=np.concatenate([train.user_ids, canary_ids]),
        item_ids=train.item_ids,
        name=f"{train.name}+{len(canaries)} rating canaries",
    )


def rating_fit_score(
    item_factors: np.ndarray,
    items: np.ndarray,
    ratings: np.ndarray,
    *,
    offset: float,
    ridge: float = 1e-3,
) -> float:
    """Black-box score: minus the mean squared residual of the best ridge fit of one user vector.

    ``u = argmin ||V_I u - (r - offset)||^2 + ridge ||u||^2`` over the canary's items ``I``
    (FedMF's model ``r ~ offset + <U_u, V_i>``; ``offset`` is the canary's own mean under
    ``offset="user_mean"``, else 0). Needs more items than latent dimensions to mean anything.
    """
    rows = np.asarray(item_factors)[np.asarray(items)]
    target = np.asarray(ratings, dtype=np.float64) - offset
    gram = rows.T @ rows + ridge * np.eye(rows.shape[1])
    user = np.linalg.solve(gram, rows.T @ target)
    residual = target - rows @ user
    return -float(residual @ residual) / max(len(target), 1)


def rating_payload_score(
    view: ServerView,
    client: int,
    items: np.ndarray,
    ratings: np.ndarray,
    protocol: FedMFProtocol,
) -> float:
    """White-box score from the canary's own payloads: items revealed, ratings recovered.

    In every round that kept payloads: the share of the canary's items among the rows its
    upload reveals (:func:`extract_upload`), plus, when the protocol's values are invertible
    (:attr:`FedMFProtocol.values_invertible`), the share of its ratings that the one-round
    inversion recovers exactly (on the rating grid). An upload with nothing to read scores 0.

    Raises:
        ValueError: the view kept no payload of ``client`` (the transport hides it, or no round
            kept payloads): there is nothing white-box to score.
    """
    total, seen = 0.0, 0
    for rnd in view:
        if not rnd.keep_payloads or int(client) not in rnd.payloads:
            continue
        seen += 1
        payload = rnd.payload(int(client))
        if "rows" not in payload or "values" not in payload:
            raise ValueError(
                f"client {client}'s payload in round {rnd.round_id} holds no clear rows "
                "(a hiding transport): score this observer from the aggregate instead"
            )
        try:
            upload = extract_upload(int(client), payload, protocol)
        except InversionError:
            continue  # nothing of its own uploaded: no trace
        found = np.isin(items, upload.items)
        total += float(found.mean())
        if protocol.values_invertible and "V" in rnd.broadcast:
            try:
                inverted = invert_one_round(upload, rnd.broadcast["V"], protocol)
            except InversionError:
                continue
            by_item = dict(zip(inverted.items.tolist(), inverted.values.tolist(), strict=True))
            recovered = [
                abs(by_item.get(int(item), np.inf) - rating) < 0.25
                for item, rating in zip(items.tolist(), ratings.tolist(), strict=True)
            ]
            total += float(np.mean(recovered))
    if seen == 0:
        raise ValueError(f"the view kept no payload of client {client}: nothing white-box to score")
    return total / seen


# ----------------------------------------------------------------------------- direction canaries
def direction_coordinates(
    n_items: int, dim: int, n_canaries: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, columns)`` of distinct block coordinates that real FedMF users leave at zero.

    Under ``aggregation="fixed"`` the weight column of every item row and both statistics rows
    are zero in every real upload (:mod:`securefed.recsys.fedmf`), and the server's step reads
    neither: a canary there interferes with no user and moves nothing.

    Raises:
        ValueError: more canaries than such coordinates (``n_items + 2 (dim + 1)``).
    """
    free = [(i, dim) for i in range(n_items)]
    free += [(n_items + s, c) for s in range(2) for c in range(dim + 1)]
    if not 1 <= n_canaries <= len(free):
        raise ValueError(
            f"{n_canaries} direction canaries, but the block has {len(free)} coordinates that "
            "real users leave at zero (n_items + 2 (dim + 1)): use fewer"
        )
    chosen = rng.choice(len(free), n_canaries, replace=False)
    coords = np.array(free, dtype=np.int64)[chosen]
    return coords[:, 0], coords[:, 1]


def direction_updates(
    clients: np.ndarray,
    rows: np.ndarray,
    columns: np.ndarray,
    magnitudes: np.ndarray,
    n_rows: int,
    width: int,
    dense: bool,
) -> RowUpdates:
    """One update per canary client: ``magnitude`` at its coordinate, zero elsewhere."""
    values = np.zeros((len(clients), width))
    values[np.arange(len(clients)), columns] = magnitudes
    return RowUpdates(
        np.asarray(clients, dtype=np.int64),
        np.arange(len(clients) + 1, dtype=np.int64),
        np.asarray(rows, dtype=np.int64),
        values,
        n_rows,
        dense,
    )


class _WrapsFedMF:
    """The state and public parameters of a wrapped :class:`FedMF` (``self.model``)."""

    model: FedMF

    def state_dict(self) -> dict[str, np.ndarray]:
        return self.model.state_dict()

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        self.model.load_state_dict(state)

    def public_parameters(self) -> dict[str, object]:
        return self.model.public_parameters()


class CanaryFedMF(_WrapsFedMF):
    """A :class:`FedMF` run with direction canaries as extra clients ``model.n_clients + i``.

    Every canary client takes part in every round it is sampled for; an included one submits
    ``norm`` at its coordinate, an excluded one zeros (who takes part is public either way).

    Args:
        model: the FedMF model (``aggregation="fixed"`` and a plain server state when there are
            canaries).
        rows, columns: each canary's coordinate (:func:`direction_coordinates`).
        included: which canaries take part with their direction.
        norm: the crafted update's L2 norm (above the DP clip, so that a clip is needed).

    Raises:
        ValueError: a model whose real users write the canaries' coordinates, or mismatched
            arrays.
    """

    def __init__(
        self,
        model: FedMF,
        rows: np.ndarray,
        columns: np.ndarray,
        included: np.ndarray,
        *,
        norm: float,
    ) -> None:
        cfg = model.config
        if len(rows) and (cfg.aggregation != "fixed" or cfg.server_state != "plain"):
            raise ValueError(
                "direction canaries need aggregation='fixed' and server_state='plain': "
                f"got aggregation={cfg.aggregation!r}, server_state={cfg.server_state!r} (real "
                "users write the canaries' coordinates otherwise)"
            )
        self.rows = np.asarray(rows, dtype=np.int64)
        self.columns = np.asarray(columns, dtype=np.int64)
        self.included = np.asarray(included, dtype=bool)
        if not (self.rows.shape == self.columns.shape == self.included.shape):
            raise ValueError("rows, columns and included must have one entry per canary")
        if not (np.isfinite(norm) and norm > 0):
            raise ValueError(f"norm must be finite and > 0, got {norm!r}")
        self.model = model
        self.norm = float(norm)
        self.first_canary = model.n_clients
        self.n_clients = model.n_clients + len(self.rows)

    def run_round(
        self, round_id: int, clients: np.ndarray, transport: Transport, seeds: SeedTree
    ) -> dict[str, float]:
        """FedMF's round (:meth:`FedMF.run_round`) with the sampled canaries submitting too."""
        model = self.model
        rnd, active = model.open_round(round_id, np.asarray(clients), transport, seeds)
        real = active[active < self.first_canary]
        canaries = active[active >= self.first_canary]
        squared_error, n_ratings = model.client_step(round_id, real, seeds, rnd.submit_batch)
        if len(canaries):
            index = canaries - self.first_canary
            rnd.submit_batch(
                direction_updates(
                    canaries,
                    self.rows[index],
                    self.columns[index],
                    np.where(self.included[index], self.norm, 0.0),
                    model.n_items + 2,
                    model.config.dim + 1,
                    model.config.upload == "full",
                )
            )
        model.close_round(rnd)
        return {"train_rmse": np.sqrt(squared_error / n_ratings) if n_ratings else float("nan")}


class WhiteBoxFedMF(_WrapsFedMF):
    """A :class:`FedMF` run with isotropic white-box canary clients in its aggregation rounds.

    The canaries of :class:`securefed.audit.whitebox.CanaryHook` (random unit directions of
    FedMF's whole upload block, ``(n_items + 2, dim + 1)``; Andrew et al., ICLR 2024) submit
    next to the real users in every round, through FedMF's public round stages
    (:meth:`FedMF.open_round`, :meth:`FedMF.client_step`, :meth:`FedMF.close_round`). Unlike
    the Dirac direction canaries they move the model (as in the paper); the released sums or the
    final ``V`` are scored with :func:`securefed.audit.whitebox.estimate_from_model_delta`.

    Raises:
        ValueError: a hook whose clients do not follow the model's, or whose block is not
            FedMF's.
    """

    def __init__(self, model: FedMF, hook) -> None:
        block = (model.n_items + 2, model.config.dim + 1)
        if tuple(hook.shape) != block or hook.first_client != model.n_clients:
            raise ValueError(
                f"the hook must cover FedMF's block {block} with clients from {model.n_clients}"
                f" (got {tuple(hook.shape)} from {hook.first_client})"
            )
        self.model, self.hook = model, hook
        self.n_clients = model.n_clients + len(hook.directions)

    def run_round(
        self, round_id: int, clients: np.ndarray, transport: Transport, seeds: SeedTree
    ) -> dict[str, float]:
        """FedMF's round with every canary client submitting its scheduled update.

        Raises:
            ValueError: a round that did not sample every canary (run with every client).
        """
        model = self.model
        rnd, active = model.open_round(round_id, np.asarray(clients), transport, seeds)
        if np.count_nonzero(active >= model.n_clients) != len(self.hook.directions):
            raise ValueError("white-box canaries take part in every round: sample every client")
        real = active[active < model.n_clients]
        squared_error, n_ratings = model.client_step(round_id, real, seeds, rnd.submit_batch)
        self.hook.submit(rnd, round_id)
        model.close_round(rnd)
        return {"train_rmse": np.sqrt(squared_error / n_ratings) if n_ratings else float("nan")}


# ----------------------------------------------------------------------------- scores
@dataclass(eq=False)
class CanaryObservation:
    """What one audited run left to its observers.

    Attributes:
        view: the server's view (every round's aggregate; payloads of the rounds kept).
        item_factors: the released ``V``.
        epsilons: the ledger's epsilon per observer (``inf`` without DP).
        rating_canaries, first_rating_client: the rating canaries and the client id of the first.
        direction_rows, direction_columns, first_direction_client: the direction canaries.
        protocol: FedMF's public parameters (for the white-box attacks).
        offsets: each rating canary's own mean rating when the model uses ``user_mean``.
        delta: the ledger's delta (``None`` without DP).
    """

    view: ServerView
    item_factors: np.ndarray
    epsilons: dict[str, float]
    rating_canaries: RatingCanaries | None = None
    first_rating_client: int = 0
    direction_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    direction_columns: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    first_direction_client: int = 0
    protocol: FedMFProtocol | None = None
    user_mean_offset: bool = False
    delta: float | None = None
    _sums: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    def summed(self, key: str) -> np.ndarray:
        """The sum over rounds of ``aggregate[key]`` (``"dp_total"`` falls back to ``"total"``
        in rounds without DP, where the sum the server computed is what it releases)."""
        if key not in self._sums:
            total = None
            for rnd in self.view:
                value = rnd.aggregate.get(key, rnd.aggregate.get("total"))
                if value is None:
                    raise ValueError(f"round {rnd.round_id} of the view holds no aggregate")
                total = np.array(value, dtype=np.float64) if total is None else total + value
            if total is None:
                raise ValueError("the view holds no round")
            self._sums[key] = total
        return self._sums[key]


def direction_release_score(observation: CanaryObservation, canary: int) -> float:
    """Released-model observer: the canary's coordinate in the released sums, over all rounds."""
    released = observation.summed("dp_total")
    return float(
        released[observation.direction_rows[canary], observation.direction_columns[canary]]
    )


def direction_server_score(observation: CanaryObservation, canary: int) -> float:
    """Server observer: the canary's own payloads where the view shows them, else the sum it
    decoded (``aggregate["total"]``: under central DP the clean sum, under secure aggregation
    the noisy one)."""
    client = observation.first_direction_client + canary
    row, column = observation.direction_rows[canary], observation.direction_columns[canary]
    clear = [
        rnd.payload(client)
        for rnd in observation.view
        if rnd.keep_payloads and client in rnd.payloads and "rows" in rnd.payloads[client]
    ]
    if clear:
        value = 0.0
        for payload in clear:
            hit = np.asarray(payload["rows"]).reshape(-1) == row
            value += float(np.asarray(payload["values"])[hit, column].sum())
        return value
    return float(server_decoded_sums(observation)[row, column])


def server_decoded_sums(observation: CanaryObservation) -> np.ndarray:
    """The sum over rounds of what the server decoded, in the model's block shape.

    ``aggregate["total"]`` is the sum the server computed: under central DP the clean sum (which
    it sees), under secure aggregation with a float mechanism the noisy sum. Under an integer
    mechanism (the ``secagg+dp`` default) it is the ``(1, D)`` ring sum of the rotated integer
    vectors, and what the server decodes from it is the released noisy sum (``dp_total``): the
    server's view of the block is that.
    """
    total = observation.summed("total")
    released = observation.summed("dp_total")
    return total if total.shape == released.shape else released


def rating_black_box_score(observation: CanaryObservation, canary: int) -> float:
    """Released-model observer: :func:`rating_fit_score` on the released ``V``."""
    items, ratings = observation.rating_canaries.of(canary)
    offset = float(ratings.mean()) if observation.user_mean_offset else 0.0
    return rating_fit_score(observation.item_factors, items, ratings, offset=offset)


def rating_white_box_score(observation: CanaryObservation, canary: int) -> float:
    """Server observer: :func:`rating_payload_score` on the canary's payloads."""
    items, ratings = observation.rating_canaries.of(canary)
    return rating_payload_score(
        observation.view,
        observation.first_rating_client + canary,
        items,
        ratings,
        observation.protocol,
    )


# ----------------------------------------------------------------------------- the audited job
@dataclass(frozen=True)
class CanaryPlan:
    """How many canaries of each kind a FedMF audit inserts, and how they look.

    Canary ``i`` of the audit is rating canary ``i`` for ``i < n_rating``, then direction
    canary ``i - n_rating``.

    Attributes:
        n_rating: rating canaries (extra users).
        n_direction: direction canaries (extra clients; needs ``aggregation="fixed"``).
        items_per_canary: ratings of each rating canary (more than the latent dimension).
        direction_norm: L2 norm of each direction canary's update (above the DP clip).
    """

    n_rating: int = 0
    n_direction: int = 0
    items_per_canary: int = 30
    direction_norm: float = 10.0

    def __post_init__(self) -> None:
        if self.n_rating < 0 or self.n_direction < 0 or self.n_rating + self.n_direction < 1:
            raise ValueError(
                f"a plan needs canaries: got {self.n_rating} rating, {self.n_direction} direction"
            )
        if self.items_per_canary < 1:
            raise ValueError(f"items_per_canary must be >= 1, got {self.items_per_canary}")
        if not (np.isfinite(self.direction_norm) and self.direction_norm > 0):
            raise ValueError(f"direction_norm must be finite and > 0, got {self.direction_norm!r}")

    @property
    def n_canaries(self) -> int:
        return self.n_rating + self.n_direction

    @property
    def rating_indices(self) -> np.ndarray:
        return np.arange(self.n_rating)

    @property
    def direction_indices(self) -> np.ndarray:
        return np.arange(self.n_rating, self.n_canaries)


@dataclass(frozen=True, eq=False)
class FedMFCanaryJob:
    """One FedMF run with canaries: ``job(included) -> CanaryObservation``.

    The canaries' design (items, ratings, coordinates) comes from the seed tree's
    ``("canaries", ...)`` streams, so it does not depend on which canaries are included.

    Attributes:
        train: the training ratings (without canaries).
        config: the FedMF configuration (``aggregation="fixed"`` for direction canaries).
        transport: a transport name or spec of :mod:`securefed.transport.registry`.
        transport_options: its options (``{"epsilon": 4.0, "clip": 1.0}``).
        plan: the canaries.
        seed: the run's seed (the audit of a seeded run is reproducible).
        keep_payloads: rounds whose payloads the view keeps (the white-box payload scores;
            ``None``: none).
    """

    train: Ratings
    config: FedMFConfig
    transport: str
    plan: CanaryPlan
    transport_options: Mapping[str, object] = field(default_factory=dict)
    seed: int = 0
    keep_payloads: RoundSelection | None = None

    def rating_design(self) -> RatingCanaries | None:
        if self.plan.n_rating == 0:
            return None
        rng = SeedTree(self.seed).generator("canaries", "ratings")
        return draw_rating_canaries(
            self.plan.n_rating,
            self.train.n_items,
            self.plan.items_per_canary,
            self.train.scale,
            rng,
        )

    def direction_design(self) -> tuple[np.ndarray, np.ndarray]:
        if self.plan.n_direction == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        rng = SeedTree(self.seed).generator("canaries", "directions")
        return direction_coordinates(
            self.train.n_items, self.config.dim, self.plan.n_direction, rng
        )

    def __call__(self, included: np.ndarray) -> CanaryObservation:
        from securefed import ClientSampling, RunOptions, run_rounds
        from securefed.transport import build_transport

        included = np.asarray(included, dtype=bool)
        if included.shape != (self.plan.n_canaries,):
            raise ValueError(
                f"included has {included.size} entries, the plan {self.plan.n_canaries} canaries"
            )
        seeds = SeedTree(self.seed)
        ratings = self.rating_design()
        train = self.train
        if ratings is not None:
            train = with_rating_canaries(train, ratings, included[self.plan.rating_indices])
        model = FedMF(train, self.config, seeds)
        rows, columns = self.direction_design()
        algorithm = CanaryFedMF(
            model,
            rows,
            columns,
            included[self.plan.direction_indices],
            norm=self.plan.direction_norm,
        )
        keep = self.keep_payloads if self.keep_payloads is not None else RoundSelection()
        transport = build_transport(
            self.transport,
            dict(self.transport_options),
            keep_payloads=keep,
            total_rounds=self.config.rounds,
            n_clients=algorithm.n_clients,
            sample_rate=1.0,
        )
        sums: dict[str, np.ndarray] = {}

        def add_round_sums(round_id: int, metrics) -> None:
            # Summed as each round ends: a view keeps the aggregates of its selected rounds only.
            aggregate = transport.view.round(round_id).aggregate
            for key in RELEASED_SUMS:
                value = aggregate.get(key, aggregate.get("total"))
                if value is None:
                    raise ValueError(f"round {round_id} of the view holds no aggregate")
                sums[key] = np.array(value, np.float64) + sums.get(key, 0.0)

        run_rounds(
            algorithm,
            transport,
            seeds,
            RunOptions(rounds=self.config.rounds, sampling=ClientSampling(), progress=False),
            on_round=add_round_sums,
        )
        epsilons = {"released_model": float("inf"), "server": float("inf")}
        if transport.ledger is not None:
            epsilons = {
                "released_model": float(transport.epsilon()),
                "server": float(transport.epsilon(against="server")),
            }
        return CanaryObservation(
            view=transport.view,
            item_factors=model.V.copy(),
            epsilons=epsilons,
            rating_canaries=ratings,
            first_rating_client=self.train.n_users,
            direction_rows=rows,
            direction_columns=columns,
            first_direction_client=model.n_clients,
            protocol=FedMFProtocol.from_public(transport.view.public),
            user_mean_offset=self.config.offset == "user_mean",
            delta=None if transport.ledger is None else transport.delta,
            _sums=sums,
        )

    def scorers(self, *, white_box_payloads: bool) -> dict[str, object]:
        """The scorers of this plan (:class:`securefed.audit.empirical.Scorer` by name).

        ``white_box_payloads``: score the rating canaries on their payloads too (only where
        the view keeps clear payloads: plaintext, central DP).
        """
        from securefed.audit.empirical import Scorer

        scorers: dict[str, object] = {}
        if self.plan.n_direction:
            direction = self.plan.direction_indices
            scorers["direction/released"] = Scorer(
                "released_model",
                lambda obs, i: direction_release_score(obs, i - self.plan.n_rating),
                direction,
                "direction canaries: their coordinate in the released sums",
            )
            scorers["direction/server"] = Scorer(
                "server",
                lambda obs, i: direction_server_score(obs, i - self.plan.n_rating),
                direction,
                "direction canaries: their payloads, else the sum the server decoded",
            )
        if self.plan.n_rating:
            rating = self.plan.rating_indices
            scorers["ratings/black-box"] = Scorer(
                "released_model",
                rating_black_box_score,
                rating,
                "rating canaries: ridge fit of their ratings on the released V",
            )
            if white_box_payloads:
                scorers["ratings/white-box"] = Scorer(
                    "server",
                    rating_white_box_score,
                    rating,
                    "rating canaries: items (and ratings) their payloads reveal",
                )
        return scorers


def ledger_epsilon(observation: CanaryObservation, observer: str) -> float:
    """The ledger's epsilon for ``observer`` in the audited run (``epsilon_of`` of the driver)."""
    return observation.epsilons[observer]


def ledger_delta(observation: CanaryObservation) -> float | None:
    """The ledger's delta in the audited run (``delta_of`` of the driver)."""
    return observation.delta
