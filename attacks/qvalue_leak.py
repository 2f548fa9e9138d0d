"""Q-value leak (FedSlate): what the fusion server learns about a user from the platforms' Q-values.

FedSlate (docs/fedslate.md) has every platform send its Q-value vector over its ``N`` candidates
to the server once per round ("acting inquiry"); the server fuses them and sends fused values
back. With the default per-item local network, platform ``p``'s values are a cubic in each
candidate's kaleness whose coefficients are a function of the platform's private user features
(observed satisfaction, engagement history): the vector carries the platform's view of the user.

Threat model: an honest-but-curious server running the fusion as specified. It keeps every
acting inquiry: the fusion channel's view (:class:`~securefed.views.FusionView`,
``run_fedslate(config, keep_payloads=ALL_PAYLOADS).fusion_view``, or a saved one) holds what the
server received, and :func:`read_inquiries` stacks its exchanges tagged ``"act"``. It knows the
public protocol: the episode length (``steps_per_platform`` rounds of one user) and the round
counter, so it can link the inquiries of one user within an episode. It does not know the local
networks, the candidates,
the slates, the clicks or the rewards. Auxiliary knowledge: the true hidden state of a labelled
fraction of the users of the same deployment, spread over the run (e.g. accounts it controls,
or users who disclosed it), as in attribute-inference attacks. A second threat model, the
*shadow* attacker, has no labelled victims: it fits on deployments it simulated itself with the
public simulator (here: the run's other members, independent deployments with their own seeds
and networks). Learning messages (replay-batch Q-values, clicked positions, loss gradients) are
counted, not attacked.

Stages of :func:`verify_qvalue_leak`:

1. **Features** (:func:`inquiry_features`). Per inquiry, for each platform, the quantiles (min,
   quartiles, max), mean and standard deviation of its Q-values (the candidates' order is
   random: only the set carries information); their discounted sums over the user's earlier
   inquiries of the episode (the hidden state integrates the user's past consumption:
   ``nke' = 0.9 nke - 2 (k - 0.5)`` per step); and a hat-function basis of the step index in
   the episode.
2. **Fit** (:func:`ridge_fit`). Ridge regression, standardised features, the penalty chosen by
   user-grouped cross-validation on the labelled users, one model per deployment (each
   deployment's networks map the state to Q-values their own way; the shadow row measures how
   badly a model transfers between deployments).
3. **Score** on the unlabelled users: R^2, MAE, RMSE of the inferred value against the truth,
   beside two baselines: *mean* (the chance baseline: the labelled users' mean) and *step* (the
   same ridge on the step basis alone: what the public schedule tells without any Q-value).

Targets (:class:`HiddenStates`, recovered for scoring by :func:`replay_truth`): the user's net
kale exposure ``nke`` and satisfaction ``sat = sigmoid(0.01 nke)`` (the hidden state; ``sat``
varies by only about +-0.02 around 0.5, so its R^2 equals ``nke``'s), each platform's private
noisy observation of ``sat`` (noise std 0.1, five times the spread of ``sat``: the platforms
themselves barely see it), and the user's recent engagement on the first platform with feedback
(the sum of its last ``history_length`` engagements, private to that platform).

Under the DP fusion channel (``run_fedslate`` with ``fusion="dp"``) the view holds the clipped,
noised Q-values, and the attack runs on them as recorded (:mod:`securefed.attacks.fedslate_leak`
measures it beside the other leaks); :func:`perturb_record` adds Gaussian noise to a plaintext
record after the run instead (no retraining under that noise). Secure aggregation does not
apply to the fusion (it is not a sum), and under CKKS the server holds ciphertexts only (its
view keeps their sizes and digests, and :func:`read_inquiries` refuses it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
from scipy.signal import lfilter

from securefed import SeedTree
from securefed.attacks.verify import _jsonable
from securefed.rl.envs.choc_kale import ChocKaleBatch, EnvStreams
from securefed.rl.fedslate import ACT, PLATFORM_NAMES, FedSlateConfig
from securefed.rl.slateq import (
    RunResult,
    choice_weights,
    explore,
    features,
    make_choice_model,
    select_slates,
)
from securefed.views import FusionView

TARGETS = ("nke", "sat", "observed_sat_A", "observed_sat_B", "recent_engagement_A")
"""Default targets of :func:`verify_qvalue_leak` (platform letters as in ``PLATFORM_NAMES``)."""


# ------------------------------------------------------------------------------ recording


@dataclass(eq=False)
class FusionRecord:
    """The acting inquiries of a fusion view, stacked (:func:`read_inquiries`), and how many other
    messages the server saw.

    Attributes:
        parties: party names in platform order.
        inputs: per party, ``(T, S, N)`` Q-values of the ``T`` acting inquiries (``S`` members).
        outputs: per party, ``(T, S, N)`` fused values the server sent back.
        learning_forwards: forward exchanges of the online network outside acting (replay
            batches: updates and B's slate selection).
        target_forwards: forward exchanges of the target network.
        backwards: backward exchanges (loss gradients received).
        noise_std: Gaussian noise added to the inputs after the run (:func:`perturb_record`).
    """

    parties: tuple[str, ...] = ()
    inputs: dict[str, np.ndarray] = field(default_factory=dict)
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    learning_forwards: int = 0
    target_forwards: int = 0
    backwards: int = 0
    noise_std: float = 0.0

    @property
    def inquiries(self) -> int:
        """``T``, acting inquiries recorded."""
        first = next(iter(self.inputs.values()), None)
        return 0 if first is None else first.shape[0]

    @property
    def members(self) -> int:
        first = next(iter(self.inputs.values()), None)
        return 0 if first is None else first.shape[1]


def read_inquiries(view: FusionView, tag: str = ACT) -> FusionRecord:
    """The acting inquiries the server saw, from a FedSlate run's fusion view.

    An inquiry is one round's exchanges tagged ``tag``: for each party, the Q-values it sent to
    the exchange that answered it (one exchange for all parties with position alignment, one
    per party with item alignment) and the fused values it got back; the members' rows
    ``(S, 1, N)`` of every round become ``(T, S, N)``.

    Args:
        view: the channel's view (``RunResult.fusion_view`` or :meth:`FusionView.load`); it must
            have kept the payloads of every round with an inquiry (``ALL_PAYLOADS``).
        tag: the acting exchanges' tag.

    Raises:
        ValueError: the view kept only some inquiries, holds no Q-values in the clear (an
            encrypted channel), or a round's inquiry misses a party.
    """
    acting = view.exchanges_of(tag=tag, kind="forward")
    sent = view.count(kind="forward", tag=tag)
    if not sent:
        raise ValueError(f"the view of channel {view.channel!r} holds no exchange tagged {tag!r}")
    if len(acting) != sent:
        raise ValueError(
            f"the view kept the payloads of {len(acting)} of {sent} acting exchanges; record "
            "the run with keep_payloads=ALL_PAYLOADS"
        )
    parties = view.parties
    rounds: dict[int, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
    for exchange in acting:
        seen = rounds.setdefault(exchange.round_id, {})
        for party in exchange.outputs:
            fields = exchange.payloads.get(party, {})
            if "input" not in fields or "output" not in fields:
                raise ValueError(
                    f"exchange {exchange.step} of channel {view.channel!r} holds no Q-values in "
                    f"the clear for party {party!r} (fields {sorted(fields)}): nothing to fit"
                )
            seen[party] = (fields["input"], fields["output"])
    inputs = {p: [] for p in parties}
    outputs = {p: [] for p in parties}
    for round_id in sorted(rounds):
        missing = set(parties) - set(rounds[round_id])
        if missing:
            raise ValueError(f"round {round_id}'s inquiry answered no {sorted(missing)}")
        for p in parties:
            q_values, fused = rounds[round_id][p]
            inputs[p].append(np.asarray(q_values, np.float64)[:, 0])
            outputs[p].append(np.asarray(fused, np.float64)[:, 0])
    online = view.count(kind="forward", network="online")
    return FusionRecord(
        parties=tuple(parties),
        inputs={p: np.stack(v) for p, v in inputs.items()},
        outputs={p: np.stack(v) for p, v in outputs.items()},
        learning_forwards=online - sent,
        target_forwards=view.count(kind="forward", network="target"),
        backwards=view.count(kind="backward"),
    )


def perturb_record(record: FusionRecord, std: float, rng: np.random.Generator) -> FusionRecord:
    """A copy of ``record`` whose Q-values carry Gaussian noise of std ``std`` (post hoc).

    Emulates what the server would see from a fusion channel that noises the Q-values (the DP
    placement of DESIGN.md); the run itself is not retrained under that noise.
    """
    if not (math.isfinite(std) and std >= 0):
        raise ValueError(f"std must be finite and >= 0, got {std!r}")
    noisy = {p: v + rng.normal(0.0, std, v.shape) if std else v.copy()
             for p, v in record.inputs.items()}  # fmt: skip
    return replace(record, inputs=noisy, noise_std=float(std))


# ------------------------------------------------------------------------------ the truth


@dataclass(frozen=True, eq=False)
class HiddenStates:
    """The truth at each acting inquiry (before the round's steps), arrays ``(T, S)``.

    Attributes:
        nke: net kale exposure. sat: true satisfaction.
        observed_sat: ``(T, S, K)`` each platform's noisy observation of ``sat``.
        recent_engagement: sum of the last ``history_length`` engagements the first platform
            with feedback observed (``None`` without such a platform).
        episode: episode index of each inquiry ``(T,)``. step: step within the episode ``(T,)``.
        parties: party names.
        feedback_party: the first platform with feedback.
        slates: ``(T, S, K, n)`` the slates shown (after exploration); greedy_slates: the
            greedy slates on the fused values before exploration (``None`` if not replayed).
    """

    nke: np.ndarray
    sat: np.ndarray
    observed_sat: np.ndarray
    recent_engagement: np.ndarray | None
    episode: np.ndarray
    step: np.ndarray
    parties: tuple[str, ...]
    feedback_party: str | None = None
    slates: np.ndarray | None = None
    greedy_slates: np.ndarray | None = None

    def target(self, name: str) -> np.ndarray:
        """The ``(T, S)`` array of a target named as in :data:`TARGETS`."""
        if name in ("nke", "sat"):
            return getattr(self, name)
        if name.startswith("observed_sat_") and name[13:] in self.parties:
            return self.observed_sat[:, :, self.parties.index(name[13:])]
        engagement = self.recent_engagement
        if name == f"recent_engagement_{self.feedback_party}" and engagement is not None:
            return engagement
        raise ValueError(f"unknown target {name!r} for parties {self.parties}")


def replay_truth(
    config: FedSlateConfig, record: FusionRecord, result: RunResult | None = None
) -> HiddenStates:
    """Recover the users' hidden states by replaying the public simulator (scoring only).

    FedSlate's environment streams come from ``SeedTree(config.seed)``; given the fused values
    the platforms received (recorded), their slates follow from the same selection and
    exploration rule as in :func:`securefed.rl.fedslate.run_fedslate`, so the replay walks the users
    through the very same states. This is the scorer's access to the truth, not the attacker's.

    Raises:
        ValueError: if the record does not cover ``config.episodes`` episodes, or the replayed
            episode rewards differ from ``result.episode_rewards`` (the replay went astray).
    """
    cfg_env = config.env_config()
    k_plat, members, n_cand, n = (
        config.num_platforms, config.members, config.num_candidates, config.slate_size,
    )  # fmt: skip
    names = PLATFORM_NAMES[:k_plat]
    length = config.steps_per_platform
    if record.inquiries != config.episodes * length:
        raise ValueError(
            f"the record holds {record.inquiries} inquiries, the run has "
            f"{config.episodes} x {length}"
        )
    if config.seed is None:
        raise ValueError(
            "replay_truth rebuilds the environment from the run's seed, and a secure-mode run "
            "(seed=None) has none: the truth of a secure run is not recomputable"
        )
    tree = SeedTree(config.seed)
    env = ChocKaleBatch(
        cfg_env, members,
        EnvStreams.from_tree(tree, k_plat, "env", shared_corpus=config.shared_corpus),
    )  # fmt: skip
    choice = make_choice_model(config.choice_model)
    act_rng = tree.generator("agent", "explore")
    feedback = [p for p in range(k_plat) if cfg_env.feedback[p]]
    total = record.inquiries
    nke, sat = np.zeros((total, members)), np.zeros((total, members))
    observed = np.zeros((total, members, k_plat))
    engagement = np.zeros((total, members)) if feedback else None
    rewards = np.zeros((config.episodes, members, k_plat))
    shown = np.zeros((total, members, k_plat, n), np.int64)
    greedy = np.zeros((total, members, k_plat, n), np.int64)
    t = 0
    for episode in range(config.episodes):
        env.reset()
        x = [features(env.observation(p), config) for p in range(k_plat)]
        done = False
        while not done:
            nke[t], sat[t] = env.nke, env.sat
            observed[t] = np.stack([x[p][:, 0] for p in range(k_plat)], axis=1)
            if engagement is not None:
                engagement[t] = env.history[:, feedback[0]].sum(axis=(1, 2))
            width = max(a.shape[1] for a in x)
            x_all = np.concatenate([np.pad(a, ((0, 0), (0, width - a.shape[1]))) for a in x])
            v, v_null = choice_weights(choice, x_all, n_cand)
            q_all = np.concatenate([record.outputs[names[p]][t] for p in range(k_plat)])
            slates = select_slates(config.slate_method, q_all, v, v_null, n)
            greedy[t] = slates.reshape(k_plat, members, n).transpose(1, 0, 2)
            eps = config.epsilon(t)
            slates = explore(slates, eps, act_rng, n_cand).reshape(k_plat, members, n)
            shown[t] = slates.transpose(1, 0, 2)
            for p in range(k_plat):
                out = env.step(p, slates[p])
                rewards[episode, :, p] += out.engagement
                x[p] = features(env.observation(p), config)
                done = out.done
            t += 1
    if result is not None and not np.allclose(rewards, result.episode_rewards, rtol=0, atol=1e-9):
        raise ValueError(
            "the replayed episode rewards differ from the run's: the replay does not follow "
            "run_fedslate's acting loop (was the run made with this config and view?)"
        )
    steps = np.arange(total)
    return HiddenStates(
        nke, sat, observed, engagement, steps // length, steps % length, tuple(names),
        names[feedback[0]] if feedback else None, shown, greedy,
    )  # fmt: skip


# ------------------------------------------------------------------------------ features


@dataclass(frozen=True)
class QLeakConfig:
    """Settings of the Q-value attack (module docstring, stages 1-2).

    Attributes:
        labelled_fraction: share of each deployment's users whose target the server knows.
        decays: discount factors of the running feature sums over a user's inquiries.
        step_bins: hat functions over the step index in the episode.
        alphas: ridge penalties tried.
        folds: user-grouped cross-validation folds for the penalty.
        seed: which users are labelled, and the folds.
    """

    labelled_fraction: float = 0.25
    decays: tuple[float, ...] = (0.9, 0.5)
    step_bins: int = 8
    alphas: tuple[float, ...] = (0.1, 1.0, 10.0, 100.0, 1e3, 1e4, 1e5)
    folds: int = 5
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.labelled_fraction < 1:
            raise ValueError(f"labelled_fraction must lie in (0, 1), got {self.labelled_fraction}")
        object.__setattr__(self, "decays", tuple(float(d) for d in self.decays))
        if any(not 0 < d < 1 for d in self.decays):
            raise ValueError(f"decays must lie in (0, 1), got {self.decays}")
        if self.step_bins < 2 or self.folds < 2:
            raise ValueError("step_bins and folds must be >= 2")
        object.__setattr__(self, "alphas", tuple(float(a) for a in self.alphas))
        if not self.alphas or any(not a > 0 for a in self.alphas):
            raise ValueError(f"alphas must be > 0, got {self.alphas}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")


def step_basis(step: np.ndarray, length: int, bins: int) -> np.ndarray:
    """``(T, bins)`` hat functions over the step index (a piecewise-linear basis)."""
    centres = np.linspace(0.0, max(length - 1, 1), bins)
    width = centres[1] - centres[0]
    return np.maximum(0.0, 1.0 - np.abs(np.asarray(step, float)[:, None] - centres) / width)


def discounted_sums(values: np.ndarray, length: int, decay: float) -> np.ndarray:
    """``s_t = decay s_{t-1} + values_t`` within each episode of ``length`` rows (restarted at
    every episode's first row).

    Args:
        values: ``(T, F)`` with ``T`` a multiple of ``length``.
    """
    values = np.asarray(values, dtype=np.float64)
    if len(values) % length:
        raise ValueError(f"{len(values)} rows are not whole episodes of {length}")
    episodes = values.reshape(len(values) // length, length, -1)
    return lfilter([1.0], [1.0, -decay], episodes, axis=1).reshape(values.shape)


def q_summary(q: np.ndarray) -> np.ndarray:
    """``(T, 7)`` per inquiry: min, quartiles, max, mean and standard deviation of the Q-values
    (the candidates' order is random: only the set of values carries information)."""
    q = np.asarray(q, np.float64)
    quantiles = np.quantile(q, [0.0, 0.25, 0.5, 0.75, 1.0], axis=1).T
    return np.concatenate([quantiles, q.mean(1, keepdims=True), q.std(1, keepdims=True)], 1)


def inquiry_features(
    q_values: Sequence[np.ndarray], length: int, config: QLeakConfig
) -> np.ndarray:
    """Permutation-invariant features of one deployment's inquiries (module docstring, stage 1).

    Args:
        q_values: per party, ``(T, N)`` Q-values (``T`` a multiple of ``length``).
        length: episode length (inquiries per user).
        config: decays and step bins.

    Returns:
        ``(T, F)``.
    """
    current = np.concatenate([q_summary(q) for q in q_values], axis=1)
    step = np.arange(len(current)) % length
    parts = [current] + [discounted_sums(current, length, d) for d in config.decays]
    return np.concatenate([*parts, step_basis(step, length, config.step_bins)], axis=1)


# ------------------------------------------------------------------------------ the regression


def _gram(x: np.ndarray, y: np.ndarray, groups: np.ndarray, users: np.ndarray):
    """Per user, ``[x, 1]^T [x, 1]`` and ``[x, 1]^T y``: any fold's ridge is a sum of them."""
    design = np.concatenate([x, np.ones((len(x), 1))], axis=1)
    grams, moments = [], []
    for user in users.tolist():
        rows = design[groups == user]
        grams.append(rows.T @ rows)
        moments.append(rows.T @ y[groups == user])
    return design, np.stack(grams), np.stack(moments)


def _solve(gram: np.ndarray, moment: np.ndarray, alpha: float) -> np.ndarray:
    """Ridge coefficients (the last one, the intercept, unpenalised)."""
    penalty = np.full(len(gram), alpha)
    penalty[-1] = 0.0
    return np.linalg.solve(gram + np.diag(penalty), moment)


def ridge_fit(
    x: np.ndarray,
    y: np.ndarray,
    groups: np.ndarray,
    train: np.ndarray,
    alphas: Sequence[float],
    folds: int,
    rng: np.random.Generator,
) -> tuple[np.ndarray, float]:
    """Ridge predictions for every row, fitted on ``train`` rows, penalty by grouped CV.

    Features are standardised on the ``train`` rows; the intercept is not penalised. Each
    user's Gram matrix is computed once, so every fold's fit is a sum and a small solve.

    Args:
        x: ``(T, F)`` features; y: ``(T,)`` targets (only ``train`` rows are read).
        groups: ``(T,)`` user ids (folds never split a user).
        train: ``(T,)`` bool, the labelled rows.
        alphas: penalties tried; folds: cross-validation folds (fewer if fewer users).
        rng: fold assignment.

    Returns:
        ``(predictions (T,), chosen alpha)``.
    """
    mean, std = x[train].mean(axis=0), x[train].std(axis=0)
    std = np.where(std > 1e-12, std, 1.0)
    users = np.unique(groups[train])
    design, grams, moments = _gram((x - mean) / std, np.where(train, y, 0.0), groups, users)
    order = rng.permutation(len(users))
    splits = [s for s in np.array_split(order, min(folds, len(users))) if len(s)]
    gram_all, moment_all = grams.sum(axis=0), moments.sum(axis=0)

    def cv_error(alpha: float) -> float:
        error = 0.0
        for held in splits:
            beta = _solve(gram_all - grams[held].sum(0), moment_all - moments[held].sum(0), alpha)
            rows = train & np.isin(groups, users[held])
            error += float(np.sum((design[rows] @ beta - y[rows]) ** 2))
        return error

    alpha = min(alphas, key=cv_error) if len(splits) >= 2 else max(alphas)
    return design @ _solve(gram_all, moment_all, alpha), float(alpha)


def regression_scores(predicted: np.ndarray, truth: np.ndarray) -> dict[str, float]:
    """``r2`` (1 - SSE / SST around the truth's mean), ``mae``, ``rmse``, ``pearson``
    (0 when undefined)."""
    predicted, truth = np.asarray(predicted, float).ravel(), np.asarray(truth, float).ravel()
    error = predicted - truth
    total = float(np.sum((truth - truth.mean()) ** 2))
    r2 = 1.0 - float(np.sum(error**2)) / total if total > 0 else float("nan")
    pearson = (
        float(np.corrcoef(predicted, truth)[0, 1])
        if np.ptp(predicted) > 0 and np.ptp(truth) > 0
        else 0.0
    )
    return {
        "r2": r2,
        "mae": float(np.abs(error).mean()),
        "rmse": float(np.sqrt(np.mean(error**2))),
        "pearson": pearson,
    }


def deployment_scores(
    predicted: np.ndarray, truth: np.ndarray, rows: np.ndarray | None = None
) -> dict[str, object]:
    """Scores per deployment (column) on ``rows`` (default all), and their mean.

    Each deployment has its own networks, policy and users, so R^2 is taken within each (a
    pooled R^2 would credit the differences between deployments); MAE and RMSE are pooled.

    Returns:
        :func:`regression_scores` keys (``r2`` and ``pearson`` averaged over deployments) plus
        ``r2_per_deployment``.
    """
    rows = np.ones(truth.shape, dtype=bool) if rows is None else rows
    per = [regression_scores(predicted[rows[:, m], m], truth[rows[:, m], m])
           for m in range(truth.shape[1])]  # fmt: skip
    pooled = regression_scores(predicted[rows], truth[rows])
    return {
        "r2": float(np.mean([p["r2"] for p in per])),
        "mae": pooled["mae"],
        "rmse": pooled["rmse"],
        "pearson": float(np.mean([p["pearson"] for p in per])),
        "r2_per_deployment": [p["r2"] for p in per],
    }


# ------------------------------------------------------------------------------ the attack


def labelled_users(
    episodes: int, members: int, fraction: float, rng: np.random.Generator
) -> np.ndarray:
    """``(episodes, members)`` bool: the users (one per member and episode) whose truth the
    server knows: ``ceil(fraction * episodes)`` per deployment (at least 2), one drawn from each
    of as many consecutive blocks of episodes.

    Spread over the run because the networks drift as they learn (the map from Q-values to the
    state changes): auxiliary users the server controls would be active throughout. Measured on
    the runs of docs/attacks.md, a uniform draw at a quarter labelled gave a mean R^2 of -0.03
    (clusters leave later users to extrapolation), the spread draw 0.31.
    """
    if episodes < 3:
        raise ValueError(f"need at least 3 episodes (users) per deployment, got {episodes}")
    count = min(episodes - 1, max(2, math.ceil(fraction * episodes)))
    blocks = np.array_split(np.arange(episodes), count)
    mask = np.zeros((episodes, members), dtype=bool)
    for m in range(members):
        mask[[int(rng.choice(block)) for block in blocks], m] = True
    return mask


def infer_hidden_state(
    record: FusionRecord,
    labels: np.ndarray,
    length: int,
    config: QLeakConfig,
    rng: np.random.Generator,
) -> dict[str, np.ndarray]:
    """The attack: per deployment, fit on the labelled users and predict every inquiry.

    Args:
        record: the server's record of the acting inquiries.
        labels: ``(T, S)`` the target where the server knows it, NaN elsewhere (whole users).
        length: episode length (public).
        config: the attack's settings.
        rng: cross-validation folds.

    Returns:
        ``{"attack": (T, S), "step": (T, S), "mean": (T, S)}`` predictions (the attack and its
        two baselines, module docstring stage 3).
    """
    total, members = labels.shape
    if total != record.inquiries or members != record.members:
        raise ValueError(f"labels {labels.shape} do not match the record ({record.inquiries}, "
                         f"{record.members})")  # fmt: skip
    step = np.arange(total) % length
    groups = np.arange(total) // length
    out = {name: np.zeros((total, members)) for name in ("attack", "step", "mean")}
    for m in range(members):
        known = ~np.isnan(labels[:, m])
        if len(np.unique(groups[known])) < 2:
            raise ValueError(f"deployment {m} needs labelled inquiries of >= 2 users")
        y = np.where(known, labels[:, m], 0.0)
        x = inquiry_features([record.inputs[p][:, m] for p in record.parties], length, config)
        basis = step_basis(step, length, config.step_bins)
        out["attack"][:, m] = ridge_fit(x, y, groups, known, config.alphas, config.folds, rng)[0]
        out["step"][:, m] = ridge_fit(basis, y, groups, known, config.alphas, config.folds, rng)[0]
        out["mean"][:, m] = y[known].mean()
    return out


def infer_shadow(
    record: FusionRecord, truth: np.ndarray, length: int, config: QLeakConfig
) -> np.ndarray:
    """The shadow attacker: for each deployment, a model fitted on all users of the others.

    Args:
        truth: ``(T, S)`` the target (the shadow deployments' truth is the attacker's own).

    Returns:
        ``(T, S)`` predictions (penalty by leave-one-deployment-out over the shadow deployments).
    """
    total, members = truth.shape
    if members < 2:
        raise ValueError("the shadow attacker needs at least 2 deployments (members)")
    x = [
        inquiry_features([record.inputs[p][:, m] for p in record.parties], length, config)
        for m in range(members)
    ]
    out = np.zeros((total, members))
    for m in range(members):
        others = [o for o in range(members) if o != m]
        xs = np.concatenate([x[o] for o in others] + [x[m]])
        ys = np.concatenate([truth[:, o] for o in others] + [np.zeros(total)])
        groups = np.repeat(np.arange(members), total)
        train = groups < len(others)
        order = np.random.default_rng(config.seed)  # the folds are whole deployments
        pred, _ = ridge_fit(xs, ys, groups, train, config.alphas, len(others), order)
        out[:, m] = pred[~train]
    return out


# ------------------------------------------------------------------------------ the report


@dataclass(frozen=True, eq=False)
class QValueLeakReport:
    """The Q-value leak of one record, per target, scored on the unlabelled users.

    Attributes:
        targets: per target, ``{"attack": scores, "mean": scores, "step": scores,
            "shadow": scores (if members >= 2), "target_std": float}`` with
            :func:`deployment_scores` dicts (the shadow attacker is scored on every user).
        inquiries: acting inquiries recorded; members: deployments.
        labelled_users: labelled users per deployment; users: users per deployment.
        noise_std: post-hoc Gaussian noise on the Q-values (0: the plaintext view).
        messages: counts of the other messages the server saw (not attacked).
        notes: threat model reminders and caveats.
    """

    targets: dict[str, dict[str, object]]
    inquiries: int
    members: int
    labelled_users: int
    users: int
    noise_std: float = 0.0
    messages: dict[str, int] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, object]:
        """JSON-ready copy (NaN becomes ``None``)."""
        return {
            "attack": "fedslate_qvalue_regression",
            "inquiries": self.inquiries,
            "members": self.members,
            "labelled_users": self.labelled_users,
            "users": self.users,
            "noise_std": self.noise_std,
            "messages": dict(self.messages),
            "notes": list(self.notes),
            "targets": _jsonable(self.targets),
        }


def verify_qvalue_leak(
    record: FusionRecord,
    truth: HiddenStates,
    length: int,
    *,
    config: QLeakConfig | None = None,
    targets: Sequence[str] = TARGETS,
    shadow: bool = True,
) -> QValueLeakReport:
    """Run the Q-value attack for each target and score it on the unlabelled users.

    Args:
        record: what the server saw (:func:`read_inquiries` of the run's fusion view, or
            :func:`perturb_record`).
        truth: :func:`replay_truth` of the run.
        length: episode length (``config.steps_per_platform``).
        config: the attack's settings.
        targets: names from :data:`TARGETS` (those the run lacks are skipped with a note).
        shadow: also score the shadow attacker (needs >= 2 members).

    Returns:
        A :class:`QValueLeakReport`.
    """
    config = config or QLeakConfig()
    total, members = truth.nke.shape
    if total != record.inquiries or members != record.members:
        raise ValueError("the truth and the record cover different inquiries")
    if total % length:
        raise ValueError(f"{total} inquiries are not whole episodes of {length}")
    episodes = total // length
    rng = np.random.default_rng(config.seed)
    mask = labelled_users(episodes, members, config.labelled_fraction, rng)
    known = np.repeat(mask, length, axis=0)
    notes = [
        f"auxiliary knowledge: the true target of {int(mask[:, 0].sum())} of {episodes} users per "
        "deployment; scores are over the other users",
        "the server links a user's inquiries by the round counter and the public episode length",
    ]
    results: dict[str, dict[str, object]] = {}
    for name in targets:
        try:
            y = truth.target(name)
        except ValueError as error:
            notes.append(f"target {name!r} skipped: {error}")
            continue
        predictions = infer_hidden_state(record, np.where(known, y, np.nan), length, config, rng)
        if shadow and members >= 2:
            predictions["shadow"] = infer_shadow(record, y, length, config)
        held = ~known
        entry: dict[str, object] = {
            key: deployment_scores(pred, y, held if key != "shadow" else None)
            for key, pred in predictions.items()
        }
        entry["target_std"] = float(np.mean(y.std(axis=0)))
        results[name] = entry
    if shadow and members < 2:
        notes.append("shadow attacker not scored: it needs >= 2 deployments (members)")
    return QValueLeakReport(
        targets=results,
        inquiries=total,
        members=members,
        labelled_users=int(mask[:, 0].sum()),
        users=episodes,
        noise_std=record.noise_std,
        messages={
            "learning_forwards": record.learning_forwards,
            "target_forwards": record.target_forwards,
            "backwards": record.backwards,
        },
        notes=tuple(notes),
    )


__all__ = [
    "TARGETS",
    "FusionRecord",
    "HiddenStates",
    "QLeakConfig",
    "QValueLeakReport",
    "discounted_sums",
    "infer_hidden_state",
    "infer_shadow",
    "inquiry_features",
    "labelled_users",
    "perturb_record",
    "read_inquiries",
    "regression_scores",
    "replay_truth",
    "ridge_fit",
    "step_basis",
    "verify_qvalue_leak",
]
