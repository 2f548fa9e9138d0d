"""FedHPD: heterogeneous federated policy distillation (Jiang et al., "FedHPD: Heterogeneous
Federated Reinforcement Learning via Policy Distillation", AAMAS 2025), with its baselines.

Reads top to bottom, after specs/fedhpd.md:

1. Tasks and the run's configuration (:class:`TaskSpec`, :class:`FedHPDConfig`).
2. The local learner, REINFORCE (spec section 2): discounted returns, normalised per episode on
   discrete tasks; loss ``sum_t -log pi(a_t|s_t) G_t``; Adam (AdamW for InvertedPendulum) with the
   agent's learning rate, times 0.95 every 100 episodes on discrete tasks.
3. The distillation event (spec section 3, the paper's Algorithm 1 lines 6-13): every ``d``
   rounds each agent uploads its action distributions on the public state set ``S_p`` through a
   securefed transport, the server keeps only their mean (:func:`consensus`), and each agent takes
   one optimiser step on a KL term per part of ``S_p`` (5 loops over parts of 2500 states).
4. The public state set ``S_p`` from a virtual agent: StandardScaler -> PCA -> KMeans over the
   states of its greedy checkpoints, drawn equally per cluster. The virtual agent trains with the
   fast learner, so :func:`securefed.rl.fast.make_public_states` makes the set there (this module
   imports nothing of :mod:`securefed.rl.fast`, which builds on it).
5. The baselines: NoFed (REINFORCE alone) and DPA-FedRL (spec section 6).
6. The faithful step-by-step reference learner (:class:`ReferenceRun`): one agent at a time, one
   environment step at a time, the autograd graph kept step by step as in the authors' scripts.
   :mod:`securefed.rl.fast` runs the same mathematics vectorised; ``securefed bench fedhpd-speed``
   and the
   tests check that both give the same returns and parameters.
7. The metric (spec section 4, :func:`system_average_reward`) and the plots.

Randomness is explicit: everything of run ``seed`` comes from ``SeedTree(seed)`` streams (agent
initialisation ``("init", k)``, the first environment reset ``("env", k)``, the round's action noise
``("actions", round)``, DPA's server ``("server_env",)`` and ``("server_actions", round)``); the
public state set comes from ``SeedTree(public_seed)``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from scipy.signal import lfilter
from torch.nn import functional as F

from securefed import PlaintextTransport, RowUpdates, SeedTree, Transport
from securefed.rl.policies import (
    AGENTS,
    MIN_STD,
    AgentSpec,
    MLPPolicy,
    gaussian_log_prob,
    make_policy,
    policy_vector,
    sample_categorical,
    sample_gaussian,
    softmax_np,
)
from securefed.transport import TransportNeeds, require_capabilities

ALGORITHMS = ("fedhpd", "nofed", "dpa")
KL_DIRECTIONS = ("auto", "mean_to_local", "local_to_mean")
DTYPES = {"float32": torch.float32, "float64": torch.float64}
ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8
ADAMW_WEIGHT_DECAY = 1e-2  # torch's AdamW default, as in the authors' InvertedPendulum script
RETURN_EPS = 1e-5


class MissingExtra(ImportError):
    """A task's simulator is not installed (LunarLander needs box2d, InvertedPendulum mujoco)."""


# == 1. Tasks and configuration ===============================================================
@dataclass(frozen=True)
class TaskSpec:
    """One benchmark task (spec sections 1-5 and the paper's Table 3).

    Attributes:
        name: short name (``cartpole``, ``lunarlander``, ``invertedpendulum``).
        env_id: the gymnasium id.
        kind: ``categorical`` or ``gaussian`` policy.
        obs_dim: observation size.
        act_dim: number of actions, or action dimensions.
        rounds: training rounds of the paper.
        episode_cap: steps after which an episode is truncated.
        public_size: size of ``S_p``.
        optimizer: ``adam`` or ``adamw``.
        normalise_returns: normalise each episode's discounted returns.
        lr_decay: StepLR factor every ``lr_decay_every`` REINFORCE steps (``None``: constant).
        lr_decay_every: StepLR period.
        extra: the pip extra that brings its simulator, if any.
        pca_components: PCA dimensions of the public-set clustering (the authors' choice).
        clusters: KMeans clusters of the public-set clustering (the authors' choice).
        virtual_rounds: rounds the virtual agent trains (ours: fewer than the authors').
        checkpoints: rounds after which its greedy checkpoints are rolled out.
        rollouts_per_checkpoint: greedy episodes per checkpoint.
        paper: the paper's Table 2 figures (and DPA-FedRL from the authors' result files).
    """

    name: str
    env_id: str
    kind: Literal["categorical", "gaussian"]
    obs_dim: int
    act_dim: int
    rounds: int
    episode_cap: int
    public_size: int
    optimizer: Literal["adam", "adamw"]
    normalise_returns: bool
    lr_decay: float | None
    lr_decay_every: int
    extra: str | None
    pca_components: int
    clusters: int
    virtual_rounds: int
    checkpoints: tuple[int, ...]
    rollouts_per_checkpoint: int
    paper: Mapping[str, float]

    @property
    def agents(self) -> tuple[AgentSpec, ...]:
        return AGENTS[self.name]


TASKS: dict[str, TaskSpec] = {
    "cartpole": TaskSpec(
        "cartpole", "CartPole-v1", "categorical", 4, 2, 2000, 500, 5000, "adam", True, 0.95,
        100, None, 2, 5, 1000, tuple(range(500, 1001, 100)), 10,
        {"nofed": 243.19, "d5": 338.47, "d10": 319.66, "d20": 286.67, "dpa": 274.29,
         "d2": 375.59, "d40": 281.72, "d80": 269.52},
    ),
    "lunarlander": TaskSpec(
        "lunarlander", "LunarLander-v3", "categorical", 8, 4, 3000, 1000, 10000, "adam", True,
        0.95, 100, "box2d", 3, 10, 1500, tuple(range(1000, 1501, 100)), 10,
        {"nofed": 37.86, "d5": 91.95, "d10": 83.78, "d20": 61.39, "dpa": 58.32,
         "d2": 121.39, "d40": 54.05, "d80": 44.79},
    ),
    "invertedpendulum": TaskSpec(
        "invertedpendulum", "InvertedPendulum-v5", "gaussian", 4, 1, 6000, 1000, 5000, "adamw",
        False, None, 100, "mujoco", 2, 5, 1500, tuple(range(1000, 1501, 100)), 10,
        {"nofed": 153.91, "d5": 327.01, "d10": 293.27, "d20": 266.35},
    ),
}  # fmt: skip
SEEDS = (20, 25, 30, 35, 40)
"""The paper's five seeds."""


def task_spec(name: str) -> TaskSpec:
    """The :class:`TaskSpec` called ``name`` (case-insensitive)."""
    key = name.lower().replace("-", "").replace("_", "")
    if key not in TASKS:
        raise ValueError(f"unknown task {name!r}; known: {', '.join(TASKS)}")
    return TASKS[key]


@dataclass(frozen=True)
class FedHPDConfig:
    """One run's configuration; ``None`` fields take the task's values in ``__post_init__``.

    Attributes:
        task: ``cartpole``, ``lunarlander`` or ``invertedpendulum``.
        algorithm: ``fedhpd``, ``nofed`` (independent REINFORCE) or ``dpa`` (DPA-FedRL).
        d: distillation interval (for ``dpa``: the server's query interval; the paper uses 1).
        rounds: training rounds (task default: 2000 / 3000 / 6000).
        agent_specs: the agents (default: the task's ten).
        kl_direction: ``mean_to_local`` is KL(P_mean || P_k) (the authors' discrete code, which
            produced Table 2), ``local_to_mean`` is KL(P_k || P_mean) (the paper's Algorithm 1, and
            the authors' InvertedPendulum code); ``auto`` picks the code's choice per task.
        distill_loops: loops over ``S_p`` per event (5).
        part_size: states per part; the mean is recomputed before each part (2500).
        public_size: size of ``S_p`` (task default).
        public_seed: seed of the virtual agent that generates ``S_p``.
        virtual_rounds: rounds the virtual agent trains (task default).
        checkpoints: rounds whose greedy policies are rolled out for ``S_p`` (task default,
            clipped to ``virtual_rounds``).
        gamma: discount factor.
        dtype: ``float32`` (as the authors) or ``float64``.
        dpa_schedule_step: DPA-FedRL also steps the learning-rate schedule on each consensus
            update (the authors' DPA code does; it produced the DPA figure).
    """

    task: str = "cartpole"
    algorithm: Literal["fedhpd", "nofed", "dpa"] = "fedhpd"
    d: int = 5
    rounds: int | None = None
    agent_specs: tuple[AgentSpec, ...] | None = None
    kl_direction: Literal["auto", "mean_to_local", "local_to_mean"] = "auto"
    distill_loops: int = 5
    part_size: int = 2500
    public_size: int | None = None
    public_seed: int = 0
    virtual_rounds: int | None = None
    checkpoints: tuple[int, ...] | None = None
    gamma: float = 0.99
    dtype: Literal["float32", "float64"] = "float32"
    dpa_schedule_step: bool = True

    def __post_init__(self) -> None:
        spec = task_spec(self.task)
        object.__setattr__(self, "task", spec.name)
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {self.algorithm!r}")
        if self.algorithm == "dpa" and spec.kind != "categorical":
            raise ValueError("DPA-FedRL averages action probabilities: discrete tasks only")
        if int(self.d) != self.d or self.d < 1:
            raise ValueError(f"d must be a positive integer, got {self.d}")
        if self.kl_direction not in KL_DIRECTIONS:
            raise ValueError(f"kl_direction must be one of {KL_DIRECTIONS}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {tuple(DTYPES)}, got {self.dtype!r}")
        if not 0 < self.gamma <= 1:
            raise ValueError(f"gamma must lie in (0, 1], got {self.gamma}")
        for name in ("distill_loops", "part_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        defaults = {
            "rounds": spec.rounds,
            "agent_specs": spec.agents,
            "public_size": spec.public_size,
            "virtual_rounds": spec.virtual_rounds,
        }
        for name, value in defaults.items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)
        object.__setattr__(self, "agent_specs", tuple(self.agent_specs))
        if self.rounds < 1 or self.virtual_rounds < 1:
            raise ValueError("rounds and virtual_rounds must be >= 1")
        if not self.agent_specs or not all(isinstance(a, AgentSpec) for a in self.agent_specs):
            raise ValueError("agent_specs must be one or more AgentSpec")
        if self.public_size < 1:
            raise ValueError(f"public_size must be >= 1, got {self.public_size}")
        if self.checkpoints is None:
            kept = tuple(c for c in spec.checkpoints if c <= self.virtual_rounds)
            object.__setattr__(self, "checkpoints", kept or (self.virtual_rounds,))
        if any(c < 1 or c > self.virtual_rounds for c in self.checkpoints):
            raise ValueError(f"checkpoints must lie in [1, virtual_rounds={self.virtual_rounds}]")

    @property
    def spec(self) -> TaskSpec:
        return TASKS[self.task]

    @property
    def n_agents(self) -> int:
        return len(self.agent_specs)

    @property
    def direction(self) -> str:
        """The KL direction actually used."""
        if self.kl_direction != "auto":
            return self.kl_direction
        return "mean_to_local" if self.spec.kind == "categorical" else "local_to_mean"

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def distills(self, round_id: int) -> bool:
        """Whether a distillation event (or a DPA query) follows round ``round_id`` (0-based)."""
        return self.algorithm != "nofed" and (round_id + 1) % self.d == 0

    def n_parts(self) -> int:
        return math.ceil(self.public_size / self.part_size)

    def aggregation_rounds(self) -> int:
        """Transport rounds of the run (each event: loops x parts; DPA: one per query)."""
        events = 0 if self.algorithm == "nofed" else self.rounds // self.d
        per_event = 1 if self.algorithm == "dpa" else self.distill_loops * self.n_parts()
        return events * per_event

    def label(self) -> str:
        return {"nofed": "NoFed", "dpa": f"DPA-FedRL (d={self.d})"}.get(
            self.algorithm, f"FedHPD (d={self.d})"
        )

    def describe(self) -> dict[str, object]:
        """JSON-ready description."""
        record = asdict(self)
        record["agent_specs"] = [a.describe() for a in self.agent_specs]
        record["kl_direction_used"] = self.direction
        return record


TRANSPORT_NEEDS = TransportNeeds(
    "FedHPD", in_process_clients="FedHPD's learners (every agent uploads from this process)"
)
"""What a FedHPD run needs of its transport: mean rounds with the agents in this process."""


@dataclass(frozen=True)
class RunSpec:
    """One run for a learner: configuration, seed, transport, public states, snapshots.

    Attributes:
        config: the run's configuration.
        seed: the run's seed (its SeedTree).
        transport: the aggregation transport (default: a fresh plaintext one).
        public_states: ``S_p`` (FedHPD only). When ``None``, the fast learner makes it from
            ``config`` (:func:`securefed.rl.fast.make_public_states`); the reference learner
            refuses a FedHPD run without it.
        snapshot_rounds: rounds after which every agent's parameters are kept.
        absent: ``{transport round: agents}``, the agents left out of that aggregation round
            (FedHPD, reference learner only): a lost agent uploads nothing in it and takes no
            KL step on its consensus, and goes on playing; what a node lost on Flower does
            (``securefed.rl.flower_fedhpd``). Normalised to sorted ``(round, agents)`` pairs.

    Raises:
        UnsupportedTransport: a transport that cannot serve :data:`TRANSPORT_NEEDS`.
        ValueError: ``absent`` outside the run's rounds or agents, leaving a round without an
            agent, or given to a run that is not FedHPD.
    """

    config: FedHPDConfig
    seed: int
    transport: Transport | None = None
    public_states: np.ndarray | None = None
    snapshot_rounds: tuple[int, ...] = ()
    absent: Mapping[int, Sequence[int]] | tuple[tuple[int, tuple[int, ...]], ...] = ()

    def __post_init__(self) -> None:
        if self.transport is not None:
            require_capabilities(self.transport, TRANSPORT_NEEDS)
        object.__setattr__(self, "absent", absent_schedule(self.config, self.absent))

    def absent_from(self, round_id: int) -> frozenset[int]:
        """The agents left out of transport round ``round_id``."""
        return frozenset(dict(self.absent).get(round_id, ()))


def absent_schedule(
    config: FedHPDConfig, absent: Mapping[int, Sequence[int]] | Sequence
) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """``absent`` (``{round: agents}`` or its pairs) checked and as sorted pairs.

    Raises:
        ValueError: naming the round or agent that does not fit ``config``.
    """
    pairs = absent.items() if isinstance(absent, Mapping) else absent
    schedule = {}
    for round_id, agents in pairs:
        agents = tuple(sorted({int(k) for k in agents}))
        if not agents:
            continue
        if config.algorithm != "fedhpd":
            raise ValueError(
                f"absent agents apply to FedHPD's aggregations, not to {config.label()}"
            )
        if not 0 <= int(round_id) < config.aggregation_rounds():
            raise ValueError(
                f"absent round {round_id} outside the run's {config.aggregation_rounds()} "
                "aggregation rounds"
            )
        if agents[0] < 0 or agents[-1] >= config.n_agents:
            raise ValueError(f"absent agents {list(agents)} outside [0, {config.n_agents})")
        if len(agents) == config.n_agents:
            raise ValueError(f"round {round_id} would aggregate no agent: every agent is absent")
        schedule[int(round_id)] = agents
    return tuple(sorted(schedule.items()))


@dataclass
class RunResult:
    """What a run yields.

    Attributes:
        config: the configuration.
        seed: the seed.
        learner: ``fast`` or ``reference``.
        transport: the transport's name.
        returns: ``(rounds, agents)`` episode returns.
        params: each agent's final parameters (flat, in ``parameters()`` order).
        seconds: wall time of the training loop.
        bytes_up: bytes the agents sent (per the transport's ServerView).
        bytes_down: bytes the server sent.
        snapshots: ``{round: [per-agent parameters]}`` for the requested rounds.
        cpu_seconds: CPU time of the process that trained it (a population: all its runs).
    """

    config: FedHPDConfig
    seed: int
    learner: str
    transport: str
    returns: np.ndarray
    params: list[np.ndarray]
    seconds: float
    bytes_up: float = 0.0
    bytes_down: float = 0.0
    snapshots: dict[int, list[np.ndarray]] = field(default_factory=dict)
    cpu_seconds: float = 0.0

    def system_average_reward(self, window: int = 50) -> float:
        return system_average_reward(self.returns[None], window)

    def record(self) -> dict[str, object]:
        """JSON-ready summary (returns as nested lists)."""
        return {
            "config": self.config.describe(),
            "seed": self.seed,
            "learner": self.learner,
            "transport": self.transport,
            "seconds": self.seconds,
            "cpu_seconds": self.cpu_seconds,
            "bytes_up": self.bytes_up,
            "bytes_down": self.bytes_down,
            "returns": self.returns.tolist(),
        }


# == 2. The local learner: REINFORCE (spec section 2) =========================================
def discounted_returns(rewards: np.ndarray, gamma: float, normalise: bool) -> np.ndarray:
    """``G_t = sum_{j >= t} gamma^(j-t) r_j`` in float64, then ``(G - mean) / (std + 1e-5)``.

    The standard deviation is the sample one (``ddof=1``, torch's default); an episode of a single
    step has ``G - mean = 0`` and so a zero loss.
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    g = lfilter([1.0], [1.0, -gamma], rewards[::-1])[::-1]
    if not normalise:
        return np.ascontiguousarray(g)
    std = g.std(ddof=1) if len(g) > 1 else 0.0
    return (g - g.mean()) / (std + RETURN_EPS)


def lr_after(lr: float, schedule_steps: int, spec: TaskSpec) -> float:
    """StepLR: the learning rate after ``schedule_steps`` scheduler steps (multiplied in order)."""
    if spec.lr_decay is None:
        return lr
    for _ in range(schedule_steps // spec.lr_decay_every):
        lr *= spec.lr_decay
    return lr


def round_noise(tree: SeedTree, round_id: int, config: FedHPDConfig) -> np.ndarray:
    """The round's action noise, one row per agent: uniforms ``(K, cap)`` for categorical
    inverse-CDF draws, standard normals ``(K, cap, act_dim)`` for Gaussian ones."""
    spec = config.spec
    rng = tree.generator("actions", round_id)
    if spec.kind == "categorical":
        return rng.random((config.n_agents, spec.episode_cap))
    return rng.standard_normal((config.n_agents, spec.episode_cap, spec.act_dim))


def stream_seed(tree: SeedTree, *path: int | str) -> int:
    """A 32-bit seed for a library that wants an int (gymnasium resets, KMeans)."""
    return int(tree.sequence(*path).generate_state(1, dtype=np.uint32)[0])


def torch_generator(tree: SeedTree, *path: int | str) -> torch.Generator:
    """A ``torch.Generator`` seeded from the stream at ``path``."""
    generator = torch.Generator()
    generator.manual_seed(int(tree.sequence(*path).generate_state(1, dtype=np.uint64)[0]))
    return generator


def initial_policies(config: FedHPDConfig, tree: SeedTree) -> list[MLPPolicy]:
    """Agent ``k``'s initial policy, drawn from ``("init", k)``."""
    spec = config.spec
    return [
        make_policy(
            agent, spec.kind, spec.obs_dim, spec.act_dim, torch_generator(tree, "init", k),
            config.torch_dtype,
        )
        for k, agent in enumerate(config.agent_specs)
    ]  # fmt: skip


def make_env(spec: TaskSpec):
    """The task's gymnasium environment, truncated at the episode cap.

    Raises:
        MissingExtra: when its simulator (box2d, mujoco) is not installed.
    """
    import gymnasium as gym

    try:
        return gym.make(spec.env_id, max_episode_steps=spec.episode_cap)
    except (ImportError, gym.error.DependencyNotInstalled) as error:
        raise MissingExtra(
            f"{spec.env_id} needs the {spec.extra!r} simulator: "
            f'pip install "gymnasium[{spec.extra}]" ({error})'
        ) from error


def require_task(name: str) -> TaskSpec:
    """The task, after checking that its environment can be built here (raises MissingExtra)."""
    spec = task_spec(name)
    make_env(spec).close()
    return spec


# == 3. The distillation event (spec section 3) ===============================================
def aggregate_uploads(
    transport: Transport,
    round_id: int,
    uploads: np.ndarray,
    seeds: SeedTree,
    clients: np.ndarray | None = None,
) -> np.ndarray:
    """Send every agent's ``(n, w)`` upload through ``transport``; the server gets only the mean.

    Args:
        uploads: ``(K, n, w)``, the rows of agent ``clients[j]`` in ``uploads[j]``.
        clients: the agents uploading (client ids; default ``0..K-1``, every agent).

    Returns:
        ``(n, w)`` float64: ``rnd.result().mean()``.
    """
    uploads = np.asarray(uploads, dtype=np.float64)
    if uploads.ndim != 3:
        raise ValueError(f"uploads must be (agents, rows, width), got shape {uploads.shape}")
    k, n, w = uploads.shape
    clients = np.arange(k) if clients is None else np.asarray(clients, np.int64)
    if clients.shape != (k,):
        raise ValueError(f"clients must name the {k} uploads, got {clients.tolist()}")
    rnd = transport.open_round(round_id, clients, shape=(n, w), seeds=seeds)
    rnd.submit_batch(
        RowUpdates(
            clients=clients,
            indptr=np.arange(k + 1) * n,
            rows=np.tile(np.arange(n), k),
            values=uploads.reshape(k * n, w),
            n_rows=n,
            dense=True,
        )
    )
    return rnd.result().mean()


def consensus(mean: np.ndarray, kind: str, act_dim: int) -> np.ndarray:
    """The global consensus from the transport's mean, kept a valid distribution.

    Categorical: probabilities clipped at 0 (a no-op unless a transport perturbed the mean: secure
    aggregation's fixed point, DP noise). Gaussian: ``[mean of means, mean of stds]`` with the stds
    kept at least ``MIN_STD``.
    """
    mean = np.array(mean, dtype=np.float64)
    if kind == "categorical":
        return np.maximum(mean, 0.0)
    mean[:, act_dim:] = np.maximum(mean[:, act_dim:], MIN_STD)
    return mean


def kl_categorical(log_p: torch.Tensor, target: torch.Tensor, direction: str) -> torch.Tensor:
    """Per-copy KL over a part of ``S_p``, averaged over its states (``batchmean``).

    Args:
        log_p: ``(C, n, A)`` the agents' log-probabilities.
        target: ``(C, n, A)`` or ``(n, A)`` the consensus probabilities.
        direction: ``mean_to_local``: KL(P_mean || P_k) (``F.kl_div(log_p, target)``, the
            authors' code); ``local_to_mean``: KL(P_k || P_mean) (the paper's Algorithm 1).

    Returns:
        ``(C,)`` losses.
    """
    n = log_p.shape[-2]
    target = target.expand_as(log_p)
    if direction == "mean_to_local":
        pointwise = F.kl_div(log_p, target, reduction="none")
    elif direction == "local_to_mean":
        log_target = torch.log(target.clamp_min(torch.finfo(target.dtype).tiny))
        pointwise = log_p.exp() * (log_p - log_target)
    else:
        raise ValueError(f"unknown KL direction {direction!r}")
    return pointwise.sum(dim=(-2, -1)) / n


def kl_gaussian(
    mean: torch.Tensor, std: torch.Tensor, target: torch.Tensor, direction: str
) -> torch.Tensor:
    """Per-copy KL between diagonal Gaussians, averaged over states and action dimensions.

    Args:
        mean, std: ``(C, n, A)`` the agents' distributions.
        target: ``(C, n, 2A)`` or ``(n, 2A)``: ``[mean of means, mean of stds]`` (spec section 3).
        direction: ``local_to_mean`` KL(N_k || N_global) (the authors' code) or ``mean_to_local``.

    Returns:
        ``(C,)`` losses: ``0.5 (r + ((mu_p - mu_q) / s_q)^2 - 1 - log r)`` with ``r = (s_p/s_q)^2``.
    """
    a = mean.shape[-1]
    target = target.expand(*mean.shape[:-1], 2 * a)
    g_mean, g_std = target[..., :a], target[..., a:]
    if direction == "local_to_mean":
        p_mean, p_std, q_mean, q_std = mean, std, g_mean, g_std
    elif direction == "mean_to_local":
        p_mean, p_std, q_mean, q_std = g_mean, g_std, mean, std
    else:
        raise ValueError(f"unknown KL direction {direction!r}")
    var_ratio = (p_std / q_std) ** 2
    t1 = ((p_mean - q_mean) / q_std) ** 2
    return (0.5 * (var_ratio + t1 - 1 - var_ratio.log())).mean(dim=(-2, -1))


def distill_loss(
    first: torch.Tensor, std: torch.Tensor | None, target: torch.Tensor, direction: str
) -> torch.Tensor:
    """The KL term of one part for stacked copies: ``first`` is logits or means ``(C, n, A)``."""
    if std is None:
        return kl_categorical(F.log_softmax(first, dim=-1), target, direction)
    return kl_gaussian(first, std, target, direction)


def dpa_loss(probs: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """DPA-FedRL: squared distance to the average at the server's state, per copy ``(C,)``."""
    return ((probs - target) ** 2).sum(dim=(-2, -1))


def parts(states: np.ndarray, part_size: int) -> list[np.ndarray]:
    """``S_p`` split in order into parts of ``part_size`` states (the last may be shorter)."""
    return [states[i : i + part_size] for i in range(0, len(states), part_size)]


# == 5 and 6. The step-by-step reference learner (FedHPD, NoFed, DPA-FedRL) ===================
class Agent:
    """One agent of the reference learner: its policy, optimiser, schedule and environment.

    ``ReferenceRun`` holds all of them in one process; ``securefed.rl.flower_fedhpd`` holds each on
    the node
    that hosts it.
    """

    def __init__(self, policy: MLPPolicy, spec: AgentSpec, task: TaskSpec, env, env_seed: int):
        self.policy, self.task, self.env, self.env_seed = policy, task, env, env_seed
        if task.optimizer == "adamw":
            self.optimizer = torch.optim.AdamW(
                policy.parameters(), lr=spec.lr, betas=ADAM_BETAS, eps=ADAM_EPS,
                weight_decay=ADAMW_WEIGHT_DECAY,
            )  # fmt: skip
        else:
            self.optimizer = torch.optim.Adam(
                policy.parameters(), lr=spec.lr, betas=ADAM_BETAS, eps=ADAM_EPS
            )
        self.scheduler = (
            None
            if task.lr_decay is None
            else torch.optim.lr_scheduler.StepLR(
                self.optimizer, step_size=task.lr_decay_every, gamma=task.lr_decay
            )
        )
        self.episodes = 0

    def step(self, loss: torch.Tensor, *, schedule: bool) -> None:
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        if schedule and self.scheduler is not None:
            self.scheduler.step()

    def upload(self, part: torch.Tensor) -> np.ndarray:
        """The agent's action distributions on a part of ``S_p`` (what it sends to the server)."""
        with torch.no_grad():
            return self.policy.distribution(part).numpy()

    def distill_step(self, part: torch.Tensor, target: torch.Tensor, direction: str) -> None:
        """One optimiser step (no schedule step) on the KL term to the consensus ``target``."""
        first, std = self.policy(part)
        loss = distill_loss(first[None], None if std is None else std[None], target, direction)[0]
        self.step(loss, schedule=False)

    def play_and_learn(self, noise: np.ndarray, gamma: float) -> float:
        """One episode, keeping the graph step by step, then one REINFORCE step."""
        dtype = next(self.policy.parameters()).dtype
        if self.episodes == 0:
            obs, _ = self.env.reset(seed=self.env_seed)
        else:
            obs, _ = self.env.reset()
        self.episodes += 1
        log_probs, rewards = [], []
        for t in range(self.task.episode_cap):
            first, std = self.policy(torch.as_tensor(obs, dtype=dtype).unsqueeze(0))
            if std is None:
                probs = softmax_np(first.detach().numpy())
                action = int(sample_categorical(probs, noise[t : t + 1])[0])
                log_probs.append(F.log_softmax(first, dim=-1)[0, action])
            else:
                action = sample_gaussian(
                    first.detach().numpy()[0], std.detach().numpy()[0], noise[t]
                )
                log_probs.append(
                    gaussian_log_prob(first[0], std[0], torch.as_tensor(action)).mean()
                )
            obs, reward, terminated, truncated, _ = self.env.step(action)
            rewards.append(reward)
            if terminated or truncated:
                break
        rewards = np.asarray(rewards, dtype=np.float64)
        g = discounted_returns(rewards, gamma, self.task.normalise_returns)
        loss = -(torch.stack(log_probs) * torch.as_tensor(g, dtype=dtype)).sum()
        self.step(loss, schedule=True)
        return float(np.sum(rewards))


class ReferenceRun:
    """The faithful step-by-step learner: one agent, one step, one graph at a time.

    Args:
        run: what to run (the transport defaults to plaintext; a FedHPD run brings ``S_p``).

    Raises:
        ValueError: a FedHPD run without its public state set.
    """

    def __init__(self, run: RunSpec) -> None:
        self.config = config = run.config
        self.seed = run.seed
        self.tree = SeedTree(run.seed)
        self.transport = run.transport or PlaintextTransport()
        self.public = None
        if config.algorithm == "fedhpd":
            if run.public_states is None:
                raise ValueError(
                    "a FedHPD run of the reference learner needs its public state set: pass "
                    "RunSpec(public_states=securefed.rl.fast.make_public_states(config))"
                )
            self.public = torch.as_tensor(np.asarray(run.public_states), dtype=config.torch_dtype)
        self.snapshot_rounds = set(run.snapshot_rounds)
        self.run_spec = run
        spec = config.spec
        self.agents = [
            Agent(policy, agent, spec, make_env(spec), stream_seed(self.tree, "env", k))
            for k, (policy, agent) in enumerate(
                zip(initial_policies(config, self.tree), config.agent_specs, strict=True)
            )
        ]
        self.server_env = self.server_obs = None
        if config.algorithm == "dpa":
            self.server_env = make_env(spec)
            self.server_obs, _ = self.server_env.reset(seed=stream_seed(self.tree, "server_env"))
        self.aggregations = 0

    def run(self) -> RunResult:
        config = self.config
        returns = np.zeros((config.rounds, config.n_agents))
        snapshots: dict[int, list[np.ndarray]] = {}
        start, cpu = time.perf_counter(), time.process_time()
        for round_id in range(config.rounds):
            noise = round_noise(self.tree, round_id, config)
            for k, agent in enumerate(self.agents):
                returns[round_id, k] = agent.play_and_learn(noise[k], config.gamma)
            if config.distills(round_id):
                if config.algorithm == "fedhpd":
                    self.distill()
                else:
                    self.dpa_query(round_id)
            if round_id + 1 in self.snapshot_rounds:
                snapshots[round_id + 1] = [policy_vector(a.policy) for a in self.agents]
        seconds = time.perf_counter() - start
        for agent in self.agents:
            agent.env.close()
        up, down = self.transport.view.total_bytes()
        return RunResult(
            config, self.seed, "reference", self.transport.name, returns,
            [policy_vector(a.policy) for a in self.agents], seconds, up, down, snapshots,
            time.process_time() - cpu,
        )  # fmt: skip

    def _consensus(self, uploads: np.ndarray, clients: np.ndarray | None = None) -> np.ndarray:
        mean = aggregate_uploads(self.transport, self.aggregations, uploads, self.tree, clients)
        self.aggregations += 1
        return consensus(mean, self.config.spec.kind, self.config.spec.act_dim)

    def distill(self) -> None:
        """One distillation event: loops x parts, the mean recomputed before each part.

        Agents absent from an aggregation round (``RunSpec.absent``) neither upload in it nor
        step on its consensus.
        """
        config = self.config
        for _ in range(config.distill_loops):
            for part in parts(self.public, config.part_size):
                absent = self.run_spec.absent_from(self.aggregations)
                present = [k for k in range(config.n_agents) if k not in absent]
                uploads = np.stack([self.agents[k].upload(part) for k in present])
                mean = self._consensus(uploads, np.asarray(present, np.int64))
                target = torch.as_tensor(mean, dtype=config.torch_dtype)
                for k in present:
                    self.agents[k].distill_step(part, target, config.direction)

    def dpa_query(self, round_id: int) -> None:
        """DPA-FedRL: the server acts from the agents' average at its state ``s``; each agent steps
        on its squared distance to that average at ``s`` (the authors' code used the next state)."""
        config = self.config
        state = torch.as_tensor(self.server_obs, dtype=config.torch_dtype).unsqueeze(0)
        with torch.no_grad():
            uploads = np.stack([a.policy.distribution(state).numpy() for a in self.agents])
        mean = self._consensus(uploads)
        target = torch.as_tensor(mean, dtype=config.torch_dtype)
        for agent in self.agents:
            loss = dpa_loss(agent.policy.distribution(state)[None], target)[0]
            agent.step(loss, schedule=config.dpa_schedule_step)
        self.server_obs = dpa_server_step(self.server_env, mean, self.tree, round_id)


def dpa_server_step(env, mean: np.ndarray, tree: SeedTree, round_id: int) -> np.ndarray:
    """The DPA server samples its action from the average and steps its own environment."""
    u = tree.generator("server_actions", round_id).random(1)
    action = int(sample_categorical(mean[:1], u)[0])
    obs, _, terminated, truncated, _ = env.step(action)
    if terminated or truncated:
        obs, _ = env.reset()
    return obs


# == 7. The metric and the plots (spec section 4) =============================================
def system_curve(returns: np.ndarray, window: int = 50) -> np.ndarray:
    """Per-round return averaged over seeds then agents, as a ``window``-round moving average.

    Args:
        returns: ``(seeds, rounds, agents)``.
    """
    returns = np.asarray(returns, dtype=np.float64)
    if returns.ndim != 3:
        raise ValueError(f"returns must be (seeds, rounds, agents), got shape {returns.shape}")
    per_round = returns.mean(axis=0).mean(axis=1)
    if len(per_round) < window:
        raise ValueError(f"{len(per_round)} rounds are fewer than the window of {window}")
    return np.convolve(per_round, np.ones(window) / window, mode="valid")


def system_average_reward(returns: np.ndarray, window: int = 50) -> float:
    """The paper's system average reward: the mean of :func:`system_curve` (valid mode)."""
    return float(system_curve(returns, window).mean())


def agent_curves(returns: np.ndarray, window: int = 50) -> np.ndarray:
    """Per-agent curves ``(agents, rounds - window + 1)``: seed mean, then moving average."""
    per_agent = np.asarray(returns, dtype=np.float64).mean(axis=0).T
    kernel = np.ones(window) / window
    return np.stack([np.convolve(row, kernel, mode="valid") for row in per_agent])


FEW_POINTS = 20
"""Curves with fewer points than this are drawn with markers (one point is no line)."""


def plot_system(
    curves: Mapping[str, np.ndarray], path: str | Path, *, window: int = 50, title: str = ""
) -> Path:
    """One line per setting: the system curve (``curves[label]`` is ``(seeds, rounds, agents)``).

    Drawn on a bare :class:`matplotlib.figure.Figure`: no backend is chosen and no pyplot state is
    touched, so the caller's matplotlib setup stays as it was.
    """
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.2))
    ax = fig.subplots()
    for label, returns in curves.items():
        curve = system_curve(returns, window)
        marker = "o" if len(curve) < FEW_POINTS else None  # a short run's curve still shows
        ax.plot(np.arange(window, window + len(curve)), curve, label=label, linewidth=1.2,
                marker=marker)  # fmt: skip
    ax.set_xlabel("round")
    ax.set_ylabel(f"system average reward ({window}-round moving average)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path


def plot_agents(
    curves: Mapping[str, np.ndarray],
    path: str | Path,
    *,
    agent_labels: Sequence[str] = (),
    window: int = 50,
    title: str = "",
) -> Path:
    """One panel per agent, one line per setting (seed mean, moving average); a bare Figure."""
    from matplotlib.figure import Figure

    n_agents = next(iter(curves.values())).shape[2]
    cols = min(5, n_agents)
    rows = math.ceil(n_agents / cols)
    fig = Figure(figsize=(3.2 * cols, 2.6 * rows))
    axes = fig.subplots(rows, cols, squeeze=False)
    for label, returns in curves.items():
        per_agent = agent_curves(returns, window)
        marker = "o" if per_agent.shape[1] < FEW_POINTS else None
        for k in range(n_agents):
            axes.flat[k].plot(np.arange(window, window + per_agent.shape[1]), per_agent[k],
                              label=label, linewidth=1.0, marker=marker)  # fmt: skip
    for k in range(n_agents):
        name = agent_labels[k] if k < len(agent_labels) else ""
        axes.flat[k].set_title(f"agent {k + 1} {name}".strip(), fontsize=8)
        axes.flat[k].grid(alpha=0.3)
    for ax in axes.flat[n_agents:]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path
