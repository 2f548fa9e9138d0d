"""Bring your own model: a torch two-tower recommender through every transport, attacked.

A user's own pipeline, written the way docs/byom.md says: an ``nn.Module``, a loss, the clients'
tensors, and :class:`securefed.torch.FedAvg`; then a model plug-in and an attack plug-in for the
leak-versus-utility benchmark (:mod:`securefed.bench.plugins`), which trains it on
ml-latest-small (the embedded data) through plaintext, secure aggregation, CKKS, central DP and
distributed DP, and attacks every ServerView.

The model (a two-tower / FISM-style rating predictor): the item tower is an item embedding
``q_i`` and bias ``b_i``; the user tower is ``u = tanh(W h + c)`` with ``h`` the mean of the
user's own rated items' history embeddings ``p_j``, each weighted by its centred rating (leaving
out the rated item being predicted). Prediction: ``mu + b_i + q_i . u``. Every parameter is shared
(nothing per user), so FedAvg over the whole model is the federated algorithm.

The attack ("rated-items"): a client's update moves ``q_i``, ``p_i`` and ``b_i`` only for the items
it rated (their gradients are zero elsewhere), so the server reads the rated set off the non-zero
rows of any update it can read. Its chance baseline guesses, for each user, as many of the most
popular items as the user rated (popularity is public knowledge of a catalogue).

The second model ("ncf"): NCF's generalised matrix factorisation with biases,
``mu + b_u + b_i + p_u . q_i``, in two variants: ``private-user``, the user's ``p_u, b_u``
marked client-private (``FedAvgConfig.private_parameters``: kept on the device, never
uploaded), and ``shared-user``, a user table every client uploads its row of (FedAvg averages
every parameter). Attacked by "rated-items" and by "user-profile" (the server orders each
user's test items with what it holds).

Run (the record under benchmarks/results/byom_example/, the NCF part in ncf/)::

    OMP_NUM_THREADS=1 python examples/byom_two_tower.py --out benchmarks/results/byom_example
    OMP_NUM_THREADS=1 python examples/byom_two_tower.py --ncf-only \
        --out benchmarks/results/byom_example

``--quick`` is the test suite's short schedule.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from torch import nn

from securefed import RunOptions, SeedTree, build_transport, run_rounds
from securefed.bench.leak_utility import LeakUtilityConfig, load_split, run
from securefed.bench.plugins import (
    AttackPlugin,
    CellContext,
    LeakMeasure,
    ModelPlugin,
    ModelRun,
    attack_names,
    model_names,
    register_attack,
    register_model,
)
from securefed.bench.tables import markdown_table
from securefed.server_optim import ServerOptimiserConfig
from securefed.torch import AdaptiveClipping, Client, FedAvg, FedAvgConfig

DIM = 8


# ------------------------------------------------------------------------------ the model
class TwoTower(nn.Module):
    """``mu + b_i + q_i . tanh(W h_u + c)``; ``h_u`` from the user's own rated items."""

    def __init__(self, n_items: int, dim: int, mean_rating: float, generator: torch.Generator):
        super().__init__()
        self.item = nn.Embedding(n_items, dim)
        self.history = nn.Embedding(n_items, dim)
        self.item_bias = nn.Embedding(n_items, 1)
        self.user_layer = nn.Linear(dim, dim)
        with torch.no_grad():
            for table in (self.item.weight, self.history.weight, self.user_layer.weight):
                nn.init.normal_(table, 0.0, 0.1, generator=generator)
            self.item_bias.weight.zero_()
            self.user_layer.bias.zero_()
        self.register_buffer("mean", torch.tensor(float(mean_rating)))

    def user_vectors(self, items: torch.Tensor, ratings: torch.Tensor, leave_out: bool):
        """One user's vector per example (leaving each example's item out), or one for all."""
        weighted = (ratings - self.mean)[:, None] * self.history(items)
        total = weighted.sum(0, keepdim=True)
        if leave_out:
            count = max(len(items) - 1, 1)
            return torch.tanh(self.user_layer((total - weighted) / count))
        return torch.tanh(self.user_layer(total / max(len(items), 1)))

    def predict(self, user: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        return self.mean + self.item_bias(items)[:, 0] + (self.item(items) * user).sum(-1)


def squared_error(model: TwoTower, batch) -> torch.Tensor:
    """The client's loss: mean squared error, each rating predicted from the others."""
    items, ratings = batch
    user = model.user_vectors(items, ratings, leave_out=True)
    return ((model.predict(user, items) - ratings) ** 2).mean()


def client_tensors(train) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], np.ndarray]:
    """Each user with training ratings as a client: ``(items, ratings)``; and their user ids."""
    users = np.unique(train.users)
    order = np.argsort(train.users, kind="stable")
    bounds = np.searchsorted(train.users[order], users)
    bounds = np.append(bounds, len(order))
    clients = []
    for k in range(len(users)):
        rows = order[bounds[k] : bounds[k + 1]]
        clients.append(
            (
                torch.from_numpy(train.items[rows].astype(np.int64)),
                torch.from_numpy(train.ratings[rows].astype(np.float64)),
            )
        )
    return clients, users


def test_rmse(model: TwoTower, split, clients, users) -> float:
    """RMSE on the test ratings of the users with training data (the mean for the others)."""
    predictions = np.full(len(split.test), float(model.mean))
    position = {int(u): k for k, u in enumerate(users)}
    with torch.no_grad():
        for user in np.unique(split.test.users):
            rows = np.flatnonzero(split.test.users == user)
            if int(user) not in position:
                continue
            items, ratings = clients[position[int(user)]]
            vector = model.user_vectors(items, ratings, leave_out=False)
            test_items = torch.from_numpy(split.test.items[rows].astype(np.int64))
            predictions[rows] = model.predict(vector, test_items).numpy()
    low, high = split.train.scale.minimum, split.train.scale.maximum
    predictions = np.clip(predictions, low, high)
    return float(np.sqrt(np.mean((predictions - split.test.ratings) ** 2)))


# ------------------------------------------------------------------------------ plug-ins
@dataclass(frozen=True)
class RatedItemsTruth:
    """What the attack is scored against, and where the item rows sit in an update."""

    rated: tuple[frozenset[int], ...]  # per client
    popularity: np.ndarray  # training count of each item
    item_blocks: tuple[tuple[int, int], ...]  # (offset, width) of each per-item table
    n_items: int


def _fedavg_config(dp: bool, options: dict) -> FedAvgConfig:
    server_lr = float(options.get("server_lr", 1.0))
    return FedAvgConfig(
        local_epochs=int(options.get("local_epochs", 5)),
        batch_size=1 << 16,  # full batch: a user's history is all of its ratings
        client_lr=float(options.get("client_lr", 1.0)),
        weighting="uniform" if dp else "examples",
        server=ServerOptimiserConfig(name=str(options.get("server", "sgd")), lr=server_lr),
    )


def build_two_tower(context: CellContext) -> ModelRun:
    """The benchmark's model factory: the two-tower model and FedAvg for one cell."""
    split = context.split
    clients, users = client_tensors(split.train)
    generator = torch.Generator().manual_seed(int(context.seeds.generator("init").integers(2**62)))
    model = TwoTower(
        split.train.n_items, DIM, float(split.train.ratings.mean()), generator
    ).double()
    options = dict(context.dp_model_options if context.dp else context.model_options)
    algorithm = FedAvg(model, clients, squared_error, _fedavg_config(context.dp, options))
    shapes = algorithm.shapes
    blocks, offset = [], 0
    for name, shape in shapes.items():
        size = int(np.prod(shape))
        if name in ("item.weight", "history.weight", "item_bias.weight"):
            blocks.append((offset, shape[1]))
        offset += size
    truth = RatedItemsTruth(
        tuple(frozenset(c[0].tolist()) for c in clients),
        np.bincount(split.train.items, minlength=split.train.n_items),
        tuple(blocks),
        split.train.n_items,
    )
    return ModelRun(
        algorithm,
        lambda: {"rmse": test_rmse(model, split, clients, users)},
        truth,
    )


def _readable_update(payload: dict) -> np.ndarray | None:
    """The update vector when the server reads it in the clear, else ``None``."""
    if "values" not in payload:
        return None  # masked integers or ciphertexts: nothing per client to read
    return np.asarray(payload["values"], dtype=np.float64).reshape(-1)


def rated_items_attack(view, truth: RatedItemsTruth) -> list[LeakMeasure]:
    """Which items each user rated, from the non-zero item rows of its last readable update."""
    rounds = view.rounds_with_payloads()
    guesses: dict[int, frozenset[int]] = {}
    for round_id in rounds:
        round_view = view.round(round_id)
        for client in round_view.clients.tolist():
            update = _readable_update(round_view.payload(int(client)))
            if update is None:
                continue
            touched = np.zeros(truth.n_items, dtype=bool)
            for offset, width in truth.item_blocks:
                rows = update[offset : offset + truth.n_items * width].reshape(truth.n_items, width)
                touched |= np.abs(rows).max(axis=1) > 0
            guesses[int(client)] = frozenset(np.flatnonzero(touched).tolist())
    popular = np.argsort(-truth.popularity, kind="stable")
    attack, chance = [], []
    for client, rated in enumerate(truth.rated):
        by_popularity = frozenset(popular[: len(rated)].tolist())
        chance.append(_scores(by_popularity, rated))
        attack.append(_scores(guesses.get(client, by_popularity), rated))
    attack, chance = np.mean(attack, axis=0), np.mean(chance, axis=0)
    return [
        LeakMeasure(name, float(a), float(c))
        for name, a, c in zip(("precision", "recall", "f1"), attack, chance, strict=True)
    ]


def _scores(guess: frozenset[int], rated: frozenset[int]) -> tuple[float, float, float]:
    hits = len(guess & rated)
    precision = hits / len(guess) if guess else 0.0
    recall = hits / len(rated) if rated else 0.0
    f1 = 2 * precision * recall / (precision + recall) if hits else 0.0
    return precision, recall, f1


TWO_TOWER = ModelPlugin(
    "two-tower",
    build_two_tower,
    utility_columns=("rmse",),
    attacks=("rated-items",),
    summary="a torch two-tower recommender trained with securefed.torch.FedAvg",
    table_note="Two-tower model, FedAvg (DP cells: uniform weights, fixed denominator).",
)
RATED_ITEMS = AttackPlugin(
    "rated-items",
    rated_items_attack,
    summary="which items a user rated, from the non-zero rows of its update",
)


def register() -> None:
    """Register the example's plug-ins (once per process)."""
    for plugin in (TWO_TOWER, USER_ITEM):
        if plugin.name not in model_names():
            register_model(plugin)
    for plugin in (RATED_ITEMS, USER_PROFILE):
        if plugin.name not in attack_names():
            register_attack(plugin)


# ------------------------------------------------------------------------------ NCF, private users
NCF_VARIANTS = ("private-user", "shared-user")
NCF_CLIENT_LR = 0.1  # the two-tower's 1.0 diverges on a private user vector (5 full-batch epochs)


class UserItemModel(nn.Module):
    """NCF's generalised matrix factorisation (He et al. 2017, eq. 2 with the identity output)
    plus biases: ``mu + b_u + b_i + p_u . q_i``.

    ``user_rows`` is 1 when the user vector is client-private (each device holds its own
    ``p_u, b_u`` in row 0), or the number of users when it is a shared table every client
    uploads its row of (FedAvg averaging every parameter).
    """

    def __init__(self, n_items: int, user_rows: int, dim: int, mean: float, generator):
        super().__init__()
        self.user = nn.Embedding(user_rows, dim)
        self.user_bias = nn.Embedding(user_rows, 1)
        self.item = nn.Embedding(n_items, dim)
        self.item_bias = nn.Embedding(n_items, 1)
        with torch.no_grad():
            for table in (self.user.weight, self.item.weight):
                nn.init.normal_(table, 0.0, 0.1, generator=generator)
            self.user_bias.weight.zero_()
            self.item_bias.weight.zero_()
        self.register_buffer("mean", torch.tensor(float(mean)))

    def forward(self, row: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        user = self.user.weight[row]
        bias = self.user_bias.weight[row, 0] + self.item_bias(items)[:, 0]
        return self.mean + bias + self.item(items) @ user


def ncf_loss(model: UserItemModel, batch) -> torch.Tensor:
    """Squared error of a minibatch; the client's row comes whole, as its context."""
    items, ratings, row = batch
    return ((model(row, items) - ratings) ** 2).mean()


@dataclass(frozen=True)
class UserItemTruth(RatedItemsTruth):
    """The rated items, plus each client's test ratings and the user table's place (if any)."""

    test: tuple[tuple[np.ndarray, np.ndarray], ...] = ()  # per client: (items, ratings)
    user_table: tuple[int, int] | None = None  # (offset, dim) of p_u in the upload, if shared
    item_table: tuple[int, int] = (0, 0)  # (offset, dim) of q_i
    item_bias_offset: int = 0


def build_user_item(context: CellContext) -> ModelRun:
    """The model factory: GMF with private (``private-user``) or shared user vectors."""
    split = context.split
    tensors, users = client_tensors(split.train)
    private = context.variant == "private-user"
    generator = torch.Generator().manual_seed(int(context.seeds.generator("init").integers(2**62)))
    rows = 1 if private else len(users)
    mean = float(split.train.ratings.mean())
    model = UserItemModel(split.train.n_items, rows, DIM, mean, generator).double()
    clients = []
    for k, (items, ratings) in enumerate(tensors):
        row = torch.tensor(0 if private else k)
        own = {}
        if private:  # each device draws its own starting vector (the shared table's row k)
            own = {"user.weight": torch.randn(1, DIM, generator=generator).double() * 0.1}
        clients.append(Client((items, ratings), context=(row,), private=own))
    options = {"client_lr": NCF_CLIENT_LR} | dict(
        context.dp_model_options if context.dp else context.model_options
    )
    config = _fedavg_config(context.dp, options)
    if private:
        config = replace(config, private_parameters=("user.weight", "user_bias.weight"))
    algorithm = FedAvg(model, clients, ncf_loss, config)
    offsets, offset = {}, 0
    for name, shape in algorithm.shapes.items():
        offsets[name] = (offset, shape[1])
        offset += int(np.prod(shape))
    truth = UserItemTruth(
        rated=tuple(frozenset(c[0].tolist()) for c in tensors),
        popularity=np.bincount(split.train.items, minlength=split.train.n_items),
        item_blocks=(offsets["item.weight"], offsets["item_bias.weight"]),
        n_items=split.train.n_items,
        test=tuple(_test_ratings(split, int(u)) for u in users),
        user_table=offsets.get("user.weight"),
        item_table=offsets["item.weight"],
        item_bias_offset=offsets["item_bias.weight"][0],
    )
    return ModelRun(algorithm, lambda: {"rmse": _client_side_rmse(algorithm, split, users)}, truth)


def _test_ratings(split, user: int) -> tuple[np.ndarray, np.ndarray]:
    rows = np.flatnonzero(split.test.users == user)
    return split.test.items[rows].astype(np.int64), split.test.ratings[rows]


def _client_side_rmse(algorithm: FedAvg, split, users: np.ndarray) -> float:
    """Test RMSE, each user predicted on its own device (shared parameters and its own)."""
    predictions = np.full(len(split.test), float(algorithm.model.mean))
    with torch.no_grad():
        for k, user in enumerate(users.tolist()):
            rows = np.flatnonzero(split.test.users == user)
            if len(rows):
                model = algorithm.client_model(k)
                row = algorithm.clients[k].context[0]
                items = torch.from_numpy(split.test.items[rows].astype(np.int64))
                predictions[rows] = model(row, items).numpy()
    predictions = np.clip(predictions, split.train.scale.minimum, split.train.scale.maximum)
    return float(np.sqrt(np.mean((predictions - split.test.ratings) ** 2)))


def user_profile_attack(view, truth: UserItemTruth) -> list[LeakMeasure]:
    """How well the server orders each user's *test* items with what it holds.

    The server holds the last broadcast model and, where it reads a client's update in the
    clear, that client's locally trained model (broadcast plus update). With a shared user
    table that model holds ``p_u`` and the server ranks the user's items by
    ``b_i + p_u . q_i``; without one it knows only ``b_i``: that ranking is the chance level.
    Measure: the share of the user's test pairs with different ratings ordered correctly.
    """
    rounds = [r for r in view.rounds_with_payloads() if "model" in view.round(r).broadcast]
    if not rounds:
        return [LeakMeasure("pair_accuracy", float("nan"), float("nan"))]
    last = view.round(rounds[-1])
    broadcast = np.asarray(last.broadcast["model"], dtype=np.float64).reshape(-1)
    start, dim = truth.item_table
    attack, chance = [], []
    for k, (test_items, ratings) in enumerate(truth.test):
        if len(test_items) < 2 or np.ptp(ratings) == 0:
            continue
        model = broadcast
        if k in last.clients.tolist():
            update = _readable_update(last.payload(k))
            model = broadcast if update is None else broadcast + update
        items = model[start : start + truth.n_items * dim].reshape(truth.n_items, dim)
        known = model[truth.item_bias_offset : truth.item_bias_offset + truth.n_items][test_items]
        guess = known
        if truth.user_table is not None:
            offset, width = truth.user_table
            user = model[offset + k * width : offset + (k + 1) * width]
            guess = known + items[test_items] @ user
        attack.append(_pair_accuracy(guess, ratings))
        chance.append(_pair_accuracy(known, ratings))
    return [LeakMeasure("pair_accuracy", float(np.mean(attack)), float(np.mean(chance)))]


def _pair_accuracy(scores: np.ndarray, ratings: np.ndarray) -> float:
    """Share of pairs with different ratings ordered as the ratings are (ties count half)."""
    i, j = np.triu_indices(len(ratings), 1)
    differ = ratings[i] != ratings[j]
    agree = np.sign(scores[i] - scores[j]) * np.sign(ratings[i] - ratings[j])
    return float(np.mean((agree[differ] + 1) / 2))


USER_ITEM = ModelPlugin(
    "ncf",
    build_user_item,
    utility_columns=("rmse",),
    variants=NCF_VARIANTS,
    attacks=("rated-items", "user-profile"),
    summary="NCF's GMF with biases; user vectors client-private or a shared table",
    table_note="GMF + biases, FedAvg; private-user: p_u, b_u stay on each device.",
)
USER_PROFILE = AttackPlugin(
    "user-profile",
    user_profile_attack,
    summary="order each user's test items with the user vectors the server holds",
)


# ------------------------------------------------------------------------------ runs
@dataclass(frozen=True)
class Schedule:
    """How long the example runs (``FULL``: the record; ``QUICK``: the test suite's)."""

    rounds: int
    max_users: int
    max_items: int
    epsilons: tuple[float, ...]
    local_epochs: int
    workers: int


FULL = Schedule(
    rounds=20, max_users=100, max_items=300, epsilons=(4.0, 8.0), local_epochs=5, workers=2
)
QUICK = Schedule(rounds=2, max_users=16, max_items=30, epsilons=(8.0,), local_epochs=1, workers=1)
DP_CLIP = 0.5


def leak_utility_table(schedule: Schedule, out: Path) -> list[dict]:
    """The leak-utility table of the two-tower model over every transport."""
    register()
    transports = (
        "plaintext",
        "secagg",
        "ckks",
        *(f"dp:{e:g}" for e in schedule.epsilons),
        *(f"secagg+dp:{e:g}" for e in schedule.epsilons),
    )
    config = LeakUtilityConfig(
        rounds=schedule.rounds,
        max_users=schedule.max_users,
        max_items=schedule.max_items,
        transports=transports,
        transport_rounds=0,  # every round through its transport: the utilities compare exactly
        dp_clip=DP_CLIP,
        workers=schedule.workers,
        extra_config={"local_epochs": schedule.local_epochs},
        dp_config={"local_epochs": schedule.local_epochs},
        progress=False,
        model="two-tower",
    )
    return run(config, out)


def private_versus_shared(schedule: Schedule, out: Path) -> list[dict]:
    """The NCF-style model with private user vectors against its shared-table version, through
    plaintext and secure aggregation: utility and both attacks' leak at the server."""
    register()
    config = LeakUtilityConfig(
        rounds=schedule.rounds,
        max_users=schedule.max_users,
        max_items=schedule.max_items,
        transports=("plaintext", "secagg"),
        transport_rounds=0,
        workers=schedule.workers,
        extra_config={"local_epochs": schedule.local_epochs},
        progress=False,
        model="ncf",
    )
    return run(config, out)


def one_round_agreement(schedule: Schedule, out: Path) -> list[dict]:
    """One round from the same model through plaintext, secagg and ckks: how far each mean update
    lies from plaintext's, against the error bound that transport states for it.

    Secure aggregation states its bound on the mean per round (``secagg_error_bound_mean``);
    CKKS states a bound on each decrypted value (``ckks_decryption_error``) and adds Gaussian
    flooding of std ``flood_std`` to it; with ``e`` their sum at 6 std (exceeded with
    probability about 2e-9 per value) on the sum and on the weight, the mean is within
    ``(e + |mean| e) / (weight - e)``.
    """
    register()
    config = LeakUtilityConfig(
        rounds=schedule.rounds,
        max_users=schedule.max_users,
        max_items=schedule.max_items,
        model="two-tower",
    )
    split = load_split(config)
    means, rows = {}, []
    for name in ("plaintext", "secagg", "ckks"):
        options = {"local_epochs": schedule.local_epochs}
        context = CellContext(split, "default", name, False, 1, 0, SeedTree(0), options)
        algorithm = build_two_tower(context).algorithm
        transport = build_transport(name, n_clients=algorithm.n_clients, total_rounds=1)
        before = algorithm.params.copy()
        run_rounds(algorithm, transport, SeedTree(0), RunOptions(rounds=1))
        means[name] = algorithm.params - before  # server sgd, lr 1: the mean update itself
        round_view = transport.view.round(0)
        weight = float(round_view.aggregate["weight"])
        if name == "secagg":
            bound = float(round_view.public["secagg_error_bound_mean"])
        elif name == "ckks":
            public = transport.view.public  # decryption error plus 6 std of the flooding
            error = float(public["ckks_decryption_error"]) + 6 * float(public["flood_std"])
            bound = (error + np.abs(means["plaintext"]).max() * error) / (weight - error)
        else:
            bound = 0.0
        deviation = float(np.abs(means[name] - means["plaintext"]).max())
        rows.append(
            {
                "transport": name,
                "max_abs_deviation_of_the_mean": deviation,
                "stated_bound": float(bound),
                "within": bool(deviation <= bound),
            }
        )
    out.mkdir(parents=True, exist_ok=True)
    (out / "agreement.json").write_text(json.dumps(rows, indent=1))
    lines = [
        f"One FedAvg round of the two-tower model ({split.train.n_users} clients) through each "
        "transport from the same start: the largest deviation of any coordinate of the mean "
        "update from plaintext's, against the transport's stated bound.",
        "",
        markdown_table(
            ("transport", "max deviation of the mean", "stated bound", "within"),
            (
                (
                    r["transport"],
                    f"{r['max_abs_deviation_of_the_mean']:.3g}",
                    f"{r['stated_bound']:.3g}",
                    r["within"],
                )
                for r in rows
            ),
        ),
    ]
    (out / "agreement.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return rows


CLIPPINGS = {
    "fixed": None,
    "adaptive": AdaptiveClipping(),  # Andrew et al.'s defaults: C_0 0.1, median, eta_C 0.2
    "adaptive, eta_C 1": AdaptiveClipping(clip_lr=1.0),
}


def compare_clipping(schedule: Schedule, out: Path) -> list[dict]:
    """DP-FedAvg (central DP) with the fixed clip against adaptive clipping, per epsilon.

    Fixed: the transport's clip ``DP_CLIP``. Adaptive: Andrew et al.'s defaults (``C_0 = 0.1``,
    median target, ``eta_C = 0.2``, ``sigma_b = expected clients / 20``), and the same with
    ``eta_C = 1`` (a short run's clip catches up sooner); the bit count shares the noise (the
    same epsilon).
    """
    register()
    config = LeakUtilityConfig(
        rounds=schedule.rounds,
        max_users=schedule.max_users,
        max_items=schedule.max_items,
        model="two-tower",
    )
    split = load_split(config)
    rows = []
    for epsilon in schedule.epsilons:
        for mode, clipping in CLIPPINGS.items():
            started = time.perf_counter()
            seeds = SeedTree(0)
            options = {"local_epochs": schedule.local_epochs}
            context = CellContext(
                split, "default", "dp", True, config.rounds, 0, seeds, options, options
            )
            model_run = build_two_tower(context)
            algorithm = model_run.algorithm
            if clipping is not None:  # the same model object: model_run.utility() scores it
                algorithm = FedAvg(
                    algorithm.model,
                    algorithm.clients,
                    squared_error,
                    replace(algorithm.config, adaptive_clipping=clipping),
                )
            clip = DP_CLIP if clipping is None else 1.0  # adaptive: the transport's clip is a unit
            transport = build_transport(
                "dp",
                {"dp.epsilon": epsilon, "dp.clip": clip},
                n_clients=algorithm.n_clients,
                total_rounds=config.rounds,
            )
            history = run_rounds(algorithm, transport, seeds, RunOptions(rounds=config.rounds))
            rows.append(
                {
                    "epsilon_target": epsilon,
                    "clipping": mode,
                    "rmse": model_run.utility()["rmse"],
                    "epsilon": transport.epsilon(),
                    "noise_multiplier": transport.config.noise_multiplier,
                    "clip_trajectory": [r.get("clip", clip) for r in history.rounds],
                    "update_norm_median": [r["update_norm_median"] for r in history.rounds],
                    "unclipped_fraction": [r.get("unclipped_fraction") for r in history.rounds],
                    "rounds": len(history.rounds),
                    "seconds": time.perf_counter() - started,
                }
            )
    out.mkdir(parents=True, exist_ok=True)
    (out / "adaptive_clipping.json").write_text(json.dumps(rows, indent=1))
    lines = [
        f"DP-FedAvg on the two-tower model, central DP, {config.rounds} rounds, "
        f"{split.train.n_users} users x {split.train.n_items} items; fixed clip {DP_CLIP} "
        "against adaptive clipping (Andrew et al. 2021: C_0 0.1, median target, eta_C 0.2 "
        "or 1, sigma_b = clients / 20, its noise charged to the same ledger).",
        "",
    ]
    body = []
    for row in rows:
        trajectory = row["clip_trajectory"]
        picks = [trajectory[0], trajectory[len(trajectory) // 2], trajectory[-1]]
        body.append(
            (
                f"{row['epsilon_target']:g}",
                row["clipping"],
                f"{row['rmse']:.4f}",
                f"{row['epsilon']:.3f}",
                f"{row['noise_multiplier']:.3f}",
                ", ".join(f"{c:.3g}" for c in picks),
                f"{row['update_norm_median'][-1]:.3g}",
            )
        )
    headers = [
        "epsilon target",
        "clipping",
        "test RMSE",
        "epsilon spent",
        "sigma",
        "clip: first, middle, last",
        "median update norm, last round",
    ]
    lines.append(markdown_table(headers, body))
    (out / "adaptive_clipping.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="results/byom_example", help="output folder")
    parser.add_argument("--quick", action="store_true", help="the test suite's short schedule")
    parser.add_argument("--skip-clipping", action="store_true", help="only the leak table")
    parser.add_argument(
        "--ncf-only", action="store_true", help="only the NCF private/shared comparison"
    )
    args = parser.parse_args(argv)
    schedule = QUICK if args.quick else FULL
    out = Path(args.out)
    private_versus_shared(schedule, out / "ncf")
    if args.ncf_only:
        return 0
    leak_utility_table(schedule, out)
    one_round_agreement(schedule, out)
    if not args.skip_clipping:
        compare_clipping(schedule, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
