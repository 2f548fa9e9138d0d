"""Multi-platform "choc vs kale" simulator (RecSim long-term satisfaction, the colab variant).

The user model of FedSlate's experiments (specs/fedslate.md section 1; RecSim 0.2.4
``long_term_satisfaction`` with the "Developing an Environment" colab's parameters): one user
shared by ``K`` platforms that take turns (A steps, then B, ...) until a shared time budget of
``61 * K`` steps is spent.

* State: net kale exposure ``nke``, initially ``U[-0.5, 0.5) / (1 - beta)``; satisfaction
  ``sat = sigmoid(tau * nke)``.
* Documents: one feature ``k ~ U[0, 1)`` ("kaleness"); each platform has its own corpus (its own
  random stream), resampled after each of its steps.
* Choice: multinomial logit with score ``1 - k`` and no null item, so the user clicks exactly one
  document of the slate: ``P(i | A) = exp(1 - k_i) / sum_{j in A} exp(1 - k_j)``.
* Engagement of the clicked document: ``exp(Normal((k mu_c + (1-k) mu_k) sat, k sigma_c +
  (1-k) sigma_k))`` with the code's naming (high ``k`` behaves like chocolate).
* Transition on the clicked document only: ``nke' = beta nke - 2 (k - 0.5) + Normal(0, eta)``.
* Observation of a platform: ``sat`` plus normal noise (std 0.1, truncated at +-1.0), its
  candidates' ``k`` values and, for platforms with feedback, its last 5 engagement vectors (the
  clicked position holds the engagement, the others 0). A platform's observation is frozen while
  the user is on another platform (paper assumption A2).

Two forms share the dynamics: :class:`ChocKaleBatch` steps many users at once with numpy
(training, baselines) and :class:`ChocKaleEnv` is the single-user Gymnasium environment (it
passes ``gymnasium.utils.env_checker.check_env``).

Randomness comes from :class:`securefed.SeedTree` streams (``EnvStreams.from_tree``): the user's
initial state, each platform's corpus, the user's responses and the observation noise are
independent streams. ``shared_corpus=True`` reproduces a defect of the paper's run script (A and B
drawing identical corpora) so that its effect can be measured; it is off by default.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np

from securefed import SeedTree

__all__ = [
    "ChocKaleBatch",
    "ChocKaleConfig",
    "ChocKaleEnv",
    "EnvStreams",
    "PlatformObservation",
    "StepOutcome",
    "choice_probabilities",
    "distinct_mask",
    "expected_engagement",
]


@dataclass(frozen=True)
class ChocKaleConfig:
    """Parameters of the multi-platform simulator (defaults: specs/fedslate.md section 1).

    Args:
        num_candidates: ``N``, candidate documents per platform and step.
        slate_size: ``n``, documents shown per step (``n <= N``).
        num_platforms: ``K`` platforms sharing one user.
        steps_per_platform: steps of each platform per episode (budget ``K * steps``).
        feedback: per platform, whether it observes clicks and engagements (default: the first
            platform only, the paper's A with feedback and B without).
        feedback_prob: probability that a feedback platform observes a step's click and
            engagement (1.0: always; < 1: the "sparse team reward" setting of this project).
        shared_corpus: all platforms draw identical candidates (the paper script's defect).
        memory_discount: ``beta``.
        sensitivity: ``tau``.
        innovation_stddev: ``eta``.
        choc_mean, choc_stddev, kale_mean, kale_stddev: engagement parameters.
        observation_noise: std of the noise on the observed satisfaction.
        noise_bound: the noise is a normal truncated at +-``noise_bound``.
        history_length: engagement vectors kept in a feedback platform's observation.
    """

    num_candidates: int = 10
    slate_size: int = 3
    num_platforms: int = 2
    steps_per_platform: int = 61
    feedback: tuple[bool, ...] | None = None
    feedback_prob: float = 1.0
    shared_corpus: bool = False
    memory_discount: float = 0.9
    sensitivity: float = 0.01
    innovation_stddev: float = 0.05
    choc_mean: float = 5.0
    choc_stddev: float = 1.0
    kale_mean: float = 4.0
    kale_stddev: float = 1.0
    observation_noise: float = 0.1
    noise_bound: float = 1.0
    history_length: int = 5

    def __post_init__(self) -> None:
        for name in ("num_candidates", "slate_size", "num_platforms", "steps_per_platform"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.slate_size > self.num_candidates:
            raise ValueError(
                f"slate_size ({self.slate_size}) cannot exceed num_candidates "
                f"({self.num_candidates})"
            )
        if self.history_length < 0:
            raise ValueError(f"history_length must be >= 0, got {self.history_length}")
        if self.feedback is None:
            object.__setattr__(self, "feedback", (True,) + (False,) * (self.num_platforms - 1))
        flags = tuple(bool(f) for f in self.feedback)
        if len(flags) != self.num_platforms:
            raise ValueError(f"feedback has {len(flags)} flags for {self.num_platforms} platforms")
        object.__setattr__(self, "feedback", flags)
        if not 0.0 < self.feedback_prob <= 1.0:
            raise ValueError(f"feedback_prob must lie in (0, 1], got {self.feedback_prob}")
        if not 0.0 <= self.memory_discount < 1.0:
            raise ValueError(f"memory_discount must lie in [0, 1), got {self.memory_discount}")
        for name in (
            "sensitivity",
            "innovation_stddev",
            "choc_stddev",
            "kale_stddev",
            "observation_noise",
        ):
            value = getattr(self, name)
            if not np.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
        if not self.noise_bound > 0:
            raise ValueError(f"noise_bound must be > 0, got {self.noise_bound}")

    @property
    def budget(self) -> int:
        """Steps per episode over all platforms."""
        return self.num_platforms * self.steps_per_platform

    def state_dim(self, platform: int) -> int:
        """Length of :meth:`PlatformObservation.features` for ``platform``."""
        history = self.history_length * self.slate_size if self.feedback[platform] else 0
        return 1 + self.num_candidates + history


@dataclass
class EnvStreams:
    """The simulator's independent random streams.

    Attributes:
        user: initial user states.
        docs: one stream per platform (its corpus).
        response: clicks, engagements, transitions and feedback reveals.
        noise: observation noise.
    """

    user: np.random.Generator
    docs: tuple[np.random.Generator, ...]
    response: np.random.Generator
    noise: np.random.Generator

    @classmethod
    def from_tree(
        cls, tree: SeedTree, num_platforms: int, *prefix: int | str, shared_corpus: bool = False
    ) -> EnvStreams:
        """Streams at ``prefix + ("user",)`` etc. of ``tree``.

        With ``shared_corpus`` every platform's corpus stream starts from the same seed, so all
        platforms draw identical candidates (the paper script's defect, for measuring it).
        """
        docs = tuple(
            tree.generator(*prefix, "docs", 0 if shared_corpus else p) for p in range(num_platforms)
        )
        return cls(
            user=tree.generator(*prefix, "user"),
            docs=docs,
            response=tree.generator(*prefix, "response"),
            noise=tree.generator(*prefix, "noise"),
        )

    def named(self) -> dict[str, np.random.Generator]:
        """Every stream by name (``user``, ``docs.0``, ...), e.g. to checkpoint their states."""
        docs = {f"docs.{p}": g for p, g in enumerate(self.docs)}
        return {"user": self.user, **docs, "response": self.response, "noise": self.noise}


@dataclass
class PlatformObservation:
    """What one platform observes of each user (arrays over users).

    Attributes:
        sat: ``(U,)`` noisy satisfaction.
        docs: ``(U, N)`` kaleness of the platform's candidates.
        history: ``(U, H, n)`` last engagement vectors (most recent last), or ``None`` for a
            platform without feedback.
    """

    sat: np.ndarray
    docs: np.ndarray
    history: np.ndarray | None

    def features(self, history_scale: float = 1.0) -> np.ndarray:
        """``(U, 1 + N [+ H n])`` float32 state vector ``[sat, k_1..k_N, history]``."""
        parts = [self.sat[:, None], self.docs]
        if self.history is not None:
            parts.append(self.history.reshape(len(self.sat), -1) * history_scale)
        return np.concatenate(parts, axis=1).astype(np.float32)


@dataclass
class StepOutcome:
    """Result of one platform's step for every user.

    Attributes:
        clicked: ``(U,)`` index (into the candidates) of the clicked document.
        position: ``(U,)`` position of the clicked document in the slate.
        engagement: ``(U,)`` engagement (the reward, ground truth for metrics).
        revealed: ``(U,)`` whether the platform observed the click and engagement.
        done: whether the shared budget is spent (the episode is over).
    """

    clicked: np.ndarray
    position: np.ndarray
    engagement: np.ndarray
    revealed: np.ndarray
    done: bool

    @property
    def feedback(self) -> np.ndarray:
        """``(U,)`` engagement where revealed, NaN elsewhere (what a learner may use)."""
        return np.where(self.revealed, self.engagement, np.nan)


def distinct_mask(slates: np.ndarray) -> np.ndarray:
    """``(U, n)`` bool: True at the first occurrence of each document in each slate.

    A slate that repeats a document shows it once (the user chooses among distinct documents).
    """
    slates = np.asarray(slates)
    equal = slates[:, :, None] == slates[:, None, :]
    return ~np.tril(equal, k=-1).any(axis=2)


def choice_probabilities(k_slate: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """True choice model: ``P(i | A) = exp(1 - k_i) / sum_{j in A} exp(1 - k_j)``.

    Args:
        k_slate: ``(U, n)`` kaleness of the shown documents.
        mask: ``(U, n)`` bool, documents that count (see :func:`distinct_mask`); default all.

    Returns:
        ``(U, n)`` probabilities (0 where masked), each row summing to 1.
    """
    weights = np.exp(1.0 - np.asarray(k_slate, dtype=np.float64))
    if mask is not None:
        weights = weights * mask
    return weights / weights.sum(axis=1, keepdims=True)


def expected_engagement(k: np.ndarray, sat: np.ndarray, config: ChocKaleConfig) -> np.ndarray:
    """Mean of the log-normal engagement, ``exp(loc + scale^2 / 2)``, of documents ``k``."""
    k = np.asarray(k, dtype=np.float64)
    loc = (k * config.choc_mean + (1.0 - k) * config.kale_mean) * sat
    scale = k * config.choc_stddev + (1.0 - k) * config.kale_stddev
    return np.exp(loc + 0.5 * scale**2)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


class ChocKaleBatch:
    """``U`` independent users, each shared by ``K`` platforms, stepped in lockstep.

    Every user runs its own episode; all users share the turn order and the budget, so one call
    to :meth:`step` moves platform ``turn`` one step for every user.

    Args:
        config: the simulator's parameters.
        num_users: ``U``.
        streams: the random streams (:meth:`EnvStreams.from_tree`).

    Example:
        >>> tree = SeedTree(0)
        >>> cfg = ChocKaleConfig()
        >>> env = ChocKaleBatch(cfg, 4, EnvStreams.from_tree(tree, cfg.num_platforms, "env"))
        >>> env.reset()
        >>> out = env.step(0, np.tile(np.arange(3), (4, 1)))
        >>> out.engagement.shape, env.turn
        ((4,), 1)
    """

    def __init__(self, config: ChocKaleConfig, num_users: int, streams: EnvStreams) -> None:
        if isinstance(num_users, bool) or int(num_users) != num_users or num_users < 1:
            raise ValueError(f"num_users must be a positive integer, got {num_users!r}")
        if len(streams.docs) != config.num_platforms:
            raise ValueError(
                f"streams have {len(streams.docs)} corpus streams for "
                f"{config.num_platforms} platforms"
            )
        self.config = config
        self.num_users = int(num_users)
        self.streams = streams
        shape_k = (self.num_users, config.num_platforms)
        self.nke = np.zeros(self.num_users)
        self.docs = np.zeros((*shape_k, config.num_candidates))
        self.obs_sat = np.zeros(shape_k)
        self.history = np.zeros(
            (*shape_k, config.history_length, config.slate_size), dtype=np.float64
        )
        self.turn = 0
        self.remaining = 0
        self._started = False
        self._rows = np.arange(self.num_users)

    @property
    def sat(self) -> np.ndarray:
        """``(U,)`` true satisfaction."""
        return _sigmoid(self.config.sensitivity * self.nke)

    def reset(self) -> None:
        """Start a new episode for every user: new users, new candidates, new observations."""
        cfg = self.config
        low, high = -0.5 / (1.0 - cfg.memory_discount), 0.5 / (1.0 - cfg.memory_discount)
        self.nke = self.streams.user.uniform(low, high, self.num_users)
        self.history[:] = 0.0
        sat = self.sat
        for p in range(cfg.num_platforms):
            self.docs[:, p] = self.streams.docs[p].random((self.num_users, cfg.num_candidates))
            self.obs_sat[:, p] = sat + self._noise(self.num_users)
        self.turn = 0
        self.remaining = cfg.budget
        self._started = True

    def _noise(self, size: int) -> np.ndarray:
        """Normal(0, observation_noise) truncated at +-noise_bound (by rejection)."""
        cfg = self.config
        noise = self.streams.noise.normal(0.0, cfg.observation_noise, size)
        bad = np.abs(noise) > cfg.noise_bound
        while bad.any():
            noise[bad] = self.streams.noise.normal(0.0, cfg.observation_noise, int(bad.sum()))
            bad = np.abs(noise) > cfg.noise_bound
        return noise

    def observation(self, platform: int) -> PlatformObservation:
        """The (frozen) current observation of ``platform`` for every user (copies)."""
        self._check_platform(platform)
        history = self.history[:, platform].copy() if self.config.feedback[platform] else None
        return PlatformObservation(
            sat=self.obs_sat[:, platform].copy(),
            docs=self.docs[:, platform].copy(),
            history=history,
        )

    def _check_platform(self, platform: int) -> None:
        if not 0 <= platform < self.config.num_platforms:
            raise ValueError(
                f"platform must lie in [0, {self.config.num_platforms}), got {platform}"
            )

    def check_slates(self, slates: np.ndarray) -> np.ndarray:
        """Validate ``(U, n)`` candidate indices; returns them as an int64 array."""
        cfg = self.config
        slates = np.asarray(slates)
        if slates.shape != (self.num_users, cfg.slate_size):
            raise ValueError(
                f"slates must have shape ({self.num_users}, {cfg.slate_size}), got {slates.shape}"
            )
        if not np.issubdtype(slates.dtype, np.integer):
            raise ValueError(f"slates must hold integer indices, got dtype {slates.dtype}")
        if slates.size and (slates.min() < 0 or slates.max() >= cfg.num_candidates):
            raise ValueError(f"slate indices must lie in [0, {cfg.num_candidates})")
        return slates.astype(np.int64, copy=False)

    def step(self, platform: int, slates: np.ndarray) -> StepOutcome:
        """Platform ``platform`` (whose turn it must be) shows ``slates`` to every user.

        Args:
            platform: the platform acting; must equal :attr:`turn`.
            slates: ``(U, n)`` indices into the platform's current candidates. A repeated index
                shows that document once.

        Returns:
            The clicks, engagements and feedback reveals of this step.

        Raises:
            RuntimeError: before :meth:`reset` or after the episode ended.
            ValueError: a platform out of turn or malformed slates.
        """
        cfg = self.config
        if not self._started or self.remaining <= 0:
            raise RuntimeError("call reset() before stepping (the episode is over or not begun)")
        self._check_platform(platform)
        if platform != self.turn:
            raise ValueError(f"it is platform {self.turn}'s turn, not platform {platform}'s")
        slates = self.check_slates(slates)
        rows = self._rows
        response = self.streams.response

        k_slate = self.docs[rows[:, None], platform, slates]
        weights = np.exp(1.0 - k_slate) * distinct_mask(slates)
        # Inverse-CDF sampling of one click per user (exactly one: no null item).
        cdf = np.cumsum(weights, axis=1)
        u = response.random(self.num_users) * cdf[:, -1]
        position = np.minimum((cdf < u[:, None]).sum(axis=1), cfg.slate_size - 1)
        clicked = slates[rows, position]
        k = k_slate[rows, position]

        sat = self.sat
        loc = (k * cfg.choc_mean + (1.0 - k) * cfg.kale_mean) * sat
        scale = k * cfg.choc_stddev + (1.0 - k) * cfg.kale_stddev
        engagement = np.exp(response.normal(loc, scale))
        innovation = response.normal(0.0, cfg.innovation_stddev, self.num_users)
        self.nke = cfg.memory_discount * self.nke - 2.0 * (k - 0.5) + innovation

        if cfg.feedback[platform]:
            if cfg.feedback_prob < 1.0:
                revealed = response.random(self.num_users) < cfg.feedback_prob
            else:
                revealed = np.ones(self.num_users, dtype=bool)
        else:
            revealed = np.zeros(self.num_users, dtype=bool)
        if cfg.history_length and cfg.feedback[platform]:
            hist = self.history[:, platform]
            hist[:, :-1] = hist[:, 1:]
            hist[:, -1] = 0.0
            hist[rows, -1, position] = np.where(revealed, engagement, 0.0)

        self.docs[:, platform] = self.streams.docs[platform].random(
            (self.num_users, cfg.num_candidates)
        )
        self.obs_sat[:, platform] = self.sat + self._noise(self.num_users)
        self.remaining -= 1
        self.turn = (self.turn + 1) % cfg.num_platforms
        return StepOutcome(
            clicked=clicked,
            position=position,
            engagement=engagement,
            revealed=revealed,
            done=self.remaining == 0,
        )


@dataclass
class _Seeded:
    tree: SeedTree | None = None
    streams: EnvStreams | None = field(default=None)


class ChocKaleEnv(gym.Env):
    """Single-user Gymnasium form of :class:`ChocKaleBatch`.

    Each :meth:`step` is the move of the platform whose turn it is (``obs["platform"]``); the
    returned observation is the (frozen) view of the next platform to act. The reward is the
    engagement of the step (ground truth: an agent of a platform without feedback must not learn
    from it, which is the training code's business; ``info["feedback"]`` is what the platform
    observes: NaN when it observes nothing).

    Observation (``Dict``): ``platform`` (Discrete K), ``user`` (noisy satisfaction, Box
    [-2, 2]), ``docs`` (kaleness of the N candidates, Box [0, 1]), ``engagement`` (last H
    engagement vectors, zeros for a platform without feedback). Action: ``MultiDiscrete([N]*n)``,
    the slate; repeated indices show a document once.
    """

    metadata = {"render_modes": []}  # noqa: RUF012 (Gymnasium's class attribute)

    def __init__(self, config: ChocKaleConfig | None = None) -> None:
        super().__init__()
        self.config = config if config is not None else ChocKaleConfig()
        cfg = self.config
        n, big = cfg.slate_size, np.finfo(np.float32).max
        self.observation_space = gym.spaces.Dict(
            {
                "platform": gym.spaces.Discrete(cfg.num_platforms),
                "user": gym.spaces.Box(-2.0, 2.0, (1,), dtype=np.float32),
                "docs": gym.spaces.Box(0.0, 1.0, (cfg.num_candidates,), dtype=np.float32),
                "engagement": gym.spaces.Box(0.0, big, (cfg.history_length, n), np.float32),
            }
        )
        self.action_space = gym.spaces.MultiDiscrete(np.full(n, cfg.num_candidates))
        self._seeded = _Seeded()
        self._batch: ChocKaleBatch | None = None

    def _observe(self, platform: int) -> dict[str, object]:
        obs = self._batch.observation(platform)
        history = (
            obs.history[0]
            if obs.history is not None
            else np.zeros((self.config.history_length, self.config.slate_size))
        )
        return {
            "platform": int(platform),
            "user": np.clip(obs.sat, -2.0, 2.0).astype(np.float32),
            "docs": obs.docs[0].astype(np.float32),
            "engagement": np.minimum(history, np.finfo(np.float32).max).astype(np.float32),
        }

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        """Start an episode; ``seed`` rebuilds the streams from ``SeedTree(seed)``."""
        super().reset(seed=seed)
        if seed is not None or self._seeded.streams is None:
            tree = SeedTree(seed)
            streams = EnvStreams.from_tree(
                tree, self.config.num_platforms, "env", shared_corpus=self.config.shared_corpus
            )
            self._seeded = _Seeded(tree, streams)
            self._batch = ChocKaleBatch(self.config, 1, streams)
            # Gymnasium's bookkeeping generator is the response stream (it advances with steps).
            self._np_random = streams.response
        self._batch.reset()
        return self._observe(0), {"remaining": self._batch.remaining}

    def step(self, action):
        if self._batch is None:
            raise RuntimeError("call reset() before step()")
        platform = self._batch.turn
        slate = np.asarray(action, dtype=np.int64).reshape(1, -1)
        out = self._batch.step(platform, slate)
        info = {
            "platform": platform,
            "clicked": int(out.clicked[0]) if out.revealed[0] else -1,
            "engagement": float(out.engagement[0]),
            "feedback": float(out.feedback[0]),
            "remaining": self._batch.remaining,
        }
        obs = self._observe(self._batch.turn)
        return obs, float(out.engagement[0]), bool(out.done), False, info
