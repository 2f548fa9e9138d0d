"""FedSlate: federated SlateQ across platforms that share a user (paper sections 3-4).

Each platform ``p`` holds a local Q-network ``Q_p(s_p)`` over its ``N`` candidates; a server
network fuses the platforms' Q-value vectors into ``Qf_p = S([Q_p, Q_others])`` (own platform
first) for each platform, and the platforms build their slates from ``Qf_p`` (SlateQ's
decomposition ``Q(s, A) = sum_{i in A} P(i | s, A) Qf(s, i)``). Only Q-values cross the
platform boundary (paper assumption A4). specs/fedslate.md sections 1-2 hold the facts this
module follows; where it deviates from the paper's code, the docstrings and docs/fedslate.md say
so.

Acting (paper Algorithm 3, "acting phase"). Once per round the server asks every platform for
``Q_p`` on its current (frozen) observation, returns ``Qf_p`` to each, and the platforms take
turns stepping the shared user with their greedy (epsilon-greedy) slates.

Learning (paper Algorithms 1-2; every ``learn_every`` rounds after ``burn_in``). One replay
batch of round indices, the same for every platform (rounds aligned):

1. Targets, for each platform with rewards: ``Y_p = r_p + gamma X_p(s'_p) (1 - done)`` where
   ``X_p = sum_{j in A*} P(j | s'_p, A*) Qf'_p(s'_p, j)`` on the target networks and ``A*`` is the
   greedy slate on ``Qf'_p`` (Q-learning) or the slate taken next (SARSA).
2. Algorithm 1, for each platform with rewards (A): ``Huber(Qf_p(s_p, clicked), Y_p)``; steps
   ``Q_p`` and the server; the other platforms' networks are frozen (their Q-values are inputs).
3. Algorithm 2, for each platform without rewards (B): recompute the other platforms' Q-values
   with their updated networks, take B's greedy slate on ``Qf_B`` and regress its slate value
   ``V_B = sum_{j in A_B} P(j | s_B, A_B) Qf_B(s_B, j)`` onto the team target (A's ``Y_A``; the
   mean of the ``Y_p`` with several platforms with rewards); steps ``Q_B`` and the server. B
   never sees its own rewards (its replay holds NaN for them).

So a learning step updates each local network once and the server network once per platform
(twice with two platforms), as the paper's protocol mandates; :attr:`RunResult.updates` counts
them.

Variants (``FedSlateConfig.variant``):

* ``"fedslate"``: the above.
* ``"extended"``: the paper's Algorithm 4 for sparse team rewards: every platform receives its
  own (possibly sparse) feedback and learns from it with Algorithm 1's update.
* ``"fedq"``: this project's reading of the paper's FedQ baseline ("lacks cross-platform
  consideration"): the same protocol, but the server sees only the platform's own Q-values (the
  other platforms' inputs are zeros), so nothing crosses platforms but the team target.
* ``"linear"``: the paper's ablation: the server is a network with one hidden layer and no
  activation (a linear map).

Alignment (``FedSlateConfig.alignment``). The server fuses ``[Q_p[i], Q_others[i]]`` position by
position. With ``"position"`` (the paper) the other platforms send their Q-values of *their own*
candidates: with separate corpora position ``i`` is a different document on each platform, so
the fusion carries the user's state across platforms but nothing about ``p``'s documents, and a
platform without rewards has no item-level signal (docs/fedslate.md section 5). With ``"item"``
(this project's variant) platform ``q`` evaluates its network on ``p``'s candidates (its own user
features, ``p``'s document features) for ``p``'s fused values, so ``Qf_p[i]`` combines every
platform's value of the same document. The price: each platform's candidate features (its
catalogue, no user data) reach the others.

The server's fusion step goes through :class:`FusionStep`, the seam where a
``securefed.fusion`` channel (CKKS, DP) plugs in; :class:`PlaintextFusion` is the direct one.
The parties exchange only the messages a split deployment would: Q-value vectors up, fused
values down, gradients of the loss with respect to the fused values up, gradients with respect
to the Q-values down.

Deviations from the paper's code (spec section 2), each a parameter: the local networks default
to the per-item form of :class:`~securefed.rl.slateq.LocalQNetwork` (``local_arch="flat"`` is the
paper's)
and the server to a per-position network over the concatenated Q-values (``server_arch="flat"``
is the paper's); SiLU instead of Mish; rewards scaled by 0.01 with a linear output (no Tanh); Adam
lr 1e-3 instead of 0.01; the agents' choice model is the environment's (``choice_model=
"paper_code"`` is the code's); no raw document ids in the state; separate corpora per platform.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from torch import nn

from securefed import SeedTree
from securefed.rl.checkpoint import EpisodeCheckpoints, TrainingState
from securefed.rl.envs.choc_kale import ChocKaleBatch, EnvStreams
from securefed.rl.slateq import (
    PLATFORM_LETTERS,
    EnsembleMLP,
    ReplayBuffer,
    RunResult,
    SlateQConfig,
    checkpoint_if_due,
    choice_weights,
    explore,
    features,
    local_network,
    make_choice_model,
    masked_huber,
    next_values,
    resume_counters,
    select_slates,
    torch_generator,
)

__all__ = [
    "ALIGNMENTS",
    "PLATFORM_NAMES",
    "SERVER_ARCHS",
    "VARIANTS",
    "FedSlateConfig",
    "FusionStep",
    "PlaintextFusion",
    "ServerNetwork",
    "etror",
    "moving_average",
    "optimal_reward",
    "run_fedslate",
    "run_reference",
    "summarize",
]

VARIANTS = ("fedslate", "extended", "fedq", "linear")
SERVER_ARCHS = ("position", "flat")
ALIGNMENTS = ("position", "item")
PLATFORM_NAMES = tuple(PLATFORM_LETTERS)


@dataclass(frozen=True)
class FedSlateConfig(SlateQConfig):
    """Hyper-parameters of one FedSlate run (the shared ones:
    :class:`~securefed.rl.slateq.SlateQConfig`).

    Args:
        variant: one of :data:`VARIANTS` (module docstring).
        server_arch: ``"position"`` (default): one MLP applied at every candidate position to
            the concatenated Q-values ``[Q_p[i], Q_others[i]]`` (own platform first), weights
            shared over positions, so its size does not grow with ``N``; ``"flat"``: the
            paper's MLP on the whole concatenation ``[Q_p, Q_others]`` (``K N`` inputs, ``N``
            outputs).
        server_hidden: hidden widths of the server network (the linear ablation keeps the
            first width and drops the activation).
        server_lr: the server's Adam learning rate (default: ``lr``).
        alignment: ``"position"`` (the paper: every platform's Q-values of its own candidates)
            or ``"item"`` (the others' networks evaluated on the fused platform's candidates;
            module docstring).
    """

    variant: str = "fedslate"
    server_arch: str = "position"
    server_hidden: tuple[int, ...] = (16, 16)
    server_lr: float | None = None
    alignment: str = "position"

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {self.variant!r}")
        if self.variant == "extended":
            # Algorithm 4: every platform has (possibly sparse) access to its own rewards.
            object.__setattr__(self, "feedback", (True,) * self.num_platforms)
        super().__post_init__()
        if self.server_arch not in SERVER_ARCHS:
            raise ValueError(f"server_arch must be one of {SERVER_ARCHS}")
        if self.alignment not in ALIGNMENTS:
            raise ValueError(f"alignment must be one of {ALIGNMENTS}, got {self.alignment!r}")
        hidden = tuple(int(w) for w in self.server_hidden)
        if not hidden or any(w < 1 for w in hidden):
            raise ValueError(f"server_hidden needs >= 1 positive width, got {self.server_hidden}")
        object.__setattr__(self, "server_hidden", hidden)
        if self.server_lr is not None and not self.server_lr > 0:
            raise ValueError(f"server_lr must be > 0, got {self.server_lr}")
        if self.num_platforms > len(PLATFORM_NAMES):
            raise ValueError(f"at most {len(PLATFORM_NAMES)} platforms")
        if not any(self.feedback):
            raise ValueError("FedSlate needs at least one platform with feedback (the team target)")


# --------------------------------------------------------------------------------------------
# The server network and the fusion seam


class ServerNetwork(nn.Module):
    """The server's fusion network ``Qf_p = S([Q_p, Q_others])``, for ``S`` members.

    Args:
        members: ``S``.
        num_platforms: ``K``.
        num_candidates: ``N``.
        hidden: hidden widths.
        arch: ``"position"`` or ``"flat"`` (:class:`FedSlateConfig`).
        activation: hidden activation (``"identity"``: the linear ablation).
        output_activation: output activation.
        generator: for the initial weights.
    """

    def __init__(
        self,
        members: int,
        num_platforms: int,
        num_candidates: int,
        hidden: Sequence[int],
        *,
        arch: str = "position",
        activation: str = "silu",
        output_activation: str = "identity",
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        if arch not in SERVER_ARCHS:
            raise ValueError(f"arch must be one of {SERVER_ARCHS}, got {arch!r}")
        self.arch, self.num_platforms, self.num_candidates = arch, num_platforms, num_candidates
        if arch == "position":
            sizes = [num_platforms, *hidden, 1]
        else:
            sizes = [num_platforms * num_candidates, *hidden, num_candidates]
        self.mlp = EnsembleMLP(
            members,
            sizes,
            activation=activation,
            output_activation=output_activation,
            generator=generator,
        )

    def forward(
        self, ordered: Sequence[torch.Tensor], positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Fused values for one platform.

        Args:
            ordered: ``K`` tensors ``(S, B, N)``, the platform's own Q-values first.
            positions: ``(S, B, m)`` candidate indices to evaluate, or ``None`` for all.

        Returns:
            ``(S, B, m)`` (or ``(S, B, N)``) fused Q-values.
        """
        if len(ordered) != self.num_platforms:
            raise ValueError(f"expected {self.num_platforms} Q-value tensors, got {len(ordered)}")
        if self.arch == "flat":
            out = self.mlp(torch.cat(list(ordered), dim=-1))
            return out if positions is None else torch.gather(out, 2, positions)
        stacked = torch.stack(list(ordered), dim=-1)  # (S, B, N, K)
        if positions is not None:
            index = positions[..., None].expand(*positions.shape, self.num_platforms)
            stacked = torch.gather(stacked, 2, index)
        s, b, m, k = stacked.shape
        return self.mlp(stacked.reshape(s, b * m, k)).reshape(s, b, m)

    def numpy_forward(self, ordered: Sequence[np.ndarray]) -> np.ndarray:
        """:meth:`forward` over all positions in numpy (acting)."""
        if self.arch == "flat":
            return self.mlp.numpy_forward(np.concatenate(list(ordered), axis=-1))
        stacked = np.stack(list(ordered), axis=-1)
        s, b, n, k = stacked.shape
        return self.mlp.numpy_forward(stacked.reshape(s, b * n, k)).reshape(s, b, n)


class FusionStep(Protocol):
    """The server network's fusion step as a channel between the parties and the server.

    The shape of DESIGN.md's ``FusionChannel``: party-keyed tensors in, party-keyed tensors out.

    * :meth:`forward`: each party's Q-value vector ``(S, B, N)`` goes up; for each party in
      ``outputs`` the fused values ``Qf_p`` come down (at ``positions[p]`` only when given, a
      ``(S, B, m)`` index tensor; a channel that cannot evaluate selectively computes all and
      gathers). Under ``torch.no_grad()`` nothing is kept for a backward pass.
    * :meth:`backward`: each party in ``grads`` sends ``dL/dQf_p`` (the shape of its output);
      the server back-propagates through its network (accumulating the gradients of its
      parameters, which the server's optimiser then steps) and returns ``dL/dQ_q`` for every
      party whose Q-values entered the last forward pass.
    """

    def forward(
        self,
        inputs: Mapping[str, torch.Tensor],
        outputs: Sequence[str],
        positions: Mapping[str, torch.Tensor] | None = None,
    ) -> dict[str, torch.Tensor]: ...

    def backward(self, grads: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]: ...


class PlaintextFusion:
    """The direct (plaintext) :class:`FusionStep` around a :class:`ServerNetwork`.

    Args:
        network: the server network (held by the server).
        parties: party names in platform order (:data:`PLATFORM_NAMES`).
        cross: ``False`` zeroes the other parties' inputs (the ``"fedq"`` variant).
    """

    def __init__(self, network: ServerNetwork, parties: Sequence[str], cross: bool = True) -> None:
        if len(parties) != network.num_platforms:
            raise ValueError(f"{len(parties)} parties for a {network.num_platforms}-input server")
        self.network, self.parties, self.cross = network, tuple(parties), cross
        self._inputs: dict[str, torch.Tensor] = {}
        self._outputs: dict[str, torch.Tensor] = {}

    def _ordered(self, inputs: Mapping[str, torch.Tensor], party: str) -> list[torch.Tensor]:
        own = inputs[party]
        others = [
            inputs[q] if self.cross else torch.zeros_like(inputs[q])
            for q in self.parties
            if q != party
        ]
        return [own, *others]

    def forward(
        self,
        inputs: Mapping[str, torch.Tensor],
        outputs: Sequence[str],
        positions: Mapping[str, torch.Tensor] | None = None,
    ) -> dict[str, torch.Tensor]:
        missing = set(self.parties) - set(inputs)
        if missing:
            raise ValueError(f"fusion needs every party's Q-values; missing {sorted(missing)}")
        positions = positions or {}
        if not torch.is_grad_enabled():
            return {p: self.network(self._ordered(inputs, p), positions.get(p)) for p in outputs}
        # What the server received: leaves, so that backward can return dL/dQ per party.
        self._inputs = {q: inputs[q].detach().requires_grad_(True) for q in self.parties}
        self._outputs = {
            p: self.network(self._ordered(self._inputs, p), positions.get(p)) for p in outputs
        }
        return {p: out.detach() for p, out in self._outputs.items()}

    def numpy_forward(
        self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        """Acting shortcut: the fused values of ``outputs`` (default: every party), in numpy."""
        out = {}
        for p in self.parties if outputs is None else outputs:
            others = [
                inputs[q] if self.cross else np.zeros_like(inputs[q])
                for q in self.parties
                if q != p
            ]
            out[p] = self.network.numpy_forward([inputs[p], *others])
        return out

    def backward(self, grads: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if not self._outputs:
            raise RuntimeError("backward() needs a forward() with gradients enabled first")
        unknown = set(grads) - set(self._outputs)
        if unknown:
            raise ValueError(f"no forward output for parties {sorted(unknown)}")
        names = list(grads)
        torch.autograd.backward([self._outputs[p] for p in names], [grads[p] for p in names])
        result = {
            q: (leaf.grad if leaf.grad is not None else torch.zeros_like(leaf))
            for q, leaf in self._inputs.items()
        }
        self._inputs, self._outputs = {}, {}
        return result


FusionFactory = Callable[[ServerNetwork, Sequence[str], bool], FusionStep]


# --------------------------------------------------------------------------------------------
# Metrics (spec section 2: the paper does not define them; these are this project's)


def moving_average(rewards: np.ndarray, window: int = 100) -> np.ndarray:
    """Trailing ``window``-episode moving average; entry ``j`` covers episodes ``j..j+window-1``."""
    rewards = np.asarray(rewards, dtype=np.float64)
    if rewards.ndim != 1 or len(rewards) < window:
        raise ValueError(f"need a 1-D series of >= {window} episodes, got shape {rewards.shape}")
    cumsum = np.concatenate([[0.0], np.cumsum(rewards)])
    return (cumsum[window:] - cumsum[:-window]) / window


def optimal_reward(rewards: np.ndarray, window: int = 100) -> float:
    """The paper's "optimal reward": the best ``window``-episode moving average."""
    return float(moving_average(rewards, window).max())


def etror(rewards: np.ndarray, window: int = 100, fraction: float = 0.99) -> int:
    """Episodes to reach optimal reward: the first episode (1-based, the last episode of the
    window) at which the moving average reaches ``fraction`` of :func:`optimal_reward`."""
    ma = moving_average(rewards, window)
    return int(np.argmax(ma >= fraction * ma.max())) + window


def summarize(result: RunResult, window: int = 100, tail: int = 500) -> dict[str, object]:
    """Per platform and member: optimal reward, ETROR, mean of the last ``tail`` episodes."""
    rewards = result.episode_rewards
    episodes, members, platforms = rewards.shape
    out: dict[str, object] = {}
    for p in range(platforms):
        series = [rewards[:, s, p] for s in range(members)]
        out[PLATFORM_NAMES[p]] = {
            "optimal_reward": [optimal_reward(r, window) for r in series],
            "etror": [etror(r, window) for r in series],
            "final_mean": [float(r[-min(tail, episodes) :].mean()) for r in series],
            "mean": [float(r.mean()) for r in series],
        }
    return out


# --------------------------------------------------------------------------------------------
# Reference policies


REFERENCE_POLICIES = ("random", "highest_k", "lowest_k")


def run_reference(
    config: SlateQConfig, policy: str, users: int = 1000, episodes_at_once: int = 1
) -> RunResult:
    """Episode rewards of fixed policies, ``users`` users in one batch.

    ``policy``: ``"random"`` (uniform slates of distinct candidates; the paper's baseline),
    ``"highest_k"`` (the ``n`` highest-kaleness candidates, the myopic reference of spec
    section 1) or ``"lowest_k"``; or one per platform joined by ``+`` (e.g.
    ``"highest_k+lowest_k"``), to measure how one platform's slates move the others' rewards
    through the shared user. ``config.episodes`` episodes; the result has ``users`` members.

    A fixed policy's episodes are independent draws (a fresh user state and fresh candidates,
    nothing learnt), so ``episodes_at_once`` of them can run side by side in one batch of
    ``users * episodes_at_once`` simulated users: the same distribution of episode rewards (not
    the same numbers as one episode at a time), in far fewer Python-level steps.
    """
    if episodes_at_once < 1:
        raise ValueError(f"episodes_at_once must be >= 1, got {episodes_at_once}")
    per_platform = policy.split("+") if "+" in policy else [policy] * config.num_platforms
    if len(per_platform) != config.num_platforms or any(
        q not in REFERENCE_POLICIES for q in per_platform
    ):
        raise ValueError(
            f"policy must be one of {REFERENCE_POLICIES} or one per platform joined by '+', "
            f"got {policy!r}"
        )
    start = time.perf_counter()
    tree = SeedTree(config.seed)
    cfg_env = config.env_config()
    k_plat, n = config.num_platforms, config.slate_size
    at_once = min(episodes_at_once, config.episodes)
    batch = users * at_once
    env = ChocKaleBatch(
        cfg_env,
        batch,
        EnvStreams.from_tree(tree, k_plat, "env", shared_corpus=config.shared_corpus),
    )
    rng = tree.generator("reference", policy)
    chunks = -(-config.episodes // at_once)
    rewards = np.zeros((chunks * at_once, users, k_plat))
    for chunk in range(chunks):
        # Batch row e * users + u is user u's episode chunk * at_once + e.
        episodes = slice(chunk * at_once, (chunk + 1) * at_once)
        env.reset()
        done = False
        while not done:
            p = env.turn
            if per_platform[p] == "random":
                slates = explore(np.zeros((batch, n), np.int64), 1.0, rng, config.num_candidates)
            else:
                docs = env.observation(p).docs
                sign = -1.0 if per_platform[p] == "highest_k" else 1.0
                slates = np.argpartition(sign * docs, n - 1, axis=1)[:, :n]
            out = env.step(p, slates)
            rewards[episodes, :, p] += out.engagement.reshape(at_once, users)
            done = out.done
    rewards = rewards[: config.episodes]
    return RunResult(
        algorithm=policy,
        config=config.to_dict(),
        episode_rewards=rewards,
        seconds=time.perf_counter() - start,
        rounds=config.episodes * config.steps_per_platform,
        learn_steps=0,
    )


# --------------------------------------------------------------------------------------------
# The FedSlate run


def on_candidates_of(x_other, x_target, num_candidates: int):
    """Platform features ``x_other`` with the candidate block of ``x_target`` (item alignment).

    State features are ``[sat, N candidate features, history...]``
    (``securefed.rl.slateq.features``);
    works on numpy arrays and torch tensors alike.
    """
    docs = slice(1, 1 + num_candidates)
    if isinstance(x_other, torch.Tensor):
        return torch.cat([x_other[..., :1], x_target[..., docs], x_other[..., docs.stop :]], -1)
    return np.concatenate([x_other[..., :1], x_target[..., docs], x_other[..., docs.stop :]], -1)


def run_fedslate(
    config: FedSlateConfig,
    fusion_factory: FusionFactory | None = None,
    checkpoints: EpisodeCheckpoints | None = None,
) -> RunResult:
    """Train FedSlate (or a variant) and return the per-platform episode rewards.

    Args:
        config: the run's configuration.
        fusion_factory: builds the online :class:`FusionStep` from ``(server network, party
            names, cross)``; default :class:`PlaintextFusion`. The target network's fusion (no
            gradients) always uses the same factory.
        checkpoints: save the run's state at episode boundaries and resume from it
            (:mod:`securefed.rl.checkpoint`); ``None``: no checkpoints.
    """
    torch.set_num_threads(config.threads)
    factory = fusion_factory or PlaintextFusion
    cfg_env = config.env_config()
    tree = SeedTree(config.seed)
    members, k_plat, n_cand, n = (
        config.members,
        config.num_platforms,
        config.num_candidates,
        config.slate_size,
    )
    names = PLATFORM_NAMES[:k_plat]
    choice = make_choice_model(config.choice_model)
    env = ChocKaleBatch(
        cfg_env,
        members,
        EnvStreams.from_tree(tree, k_plat, "env", shared_corpus=config.shared_corpus),
    )
    with_rewards = [p for p in range(k_plat) if cfg_env.feedback[p]]  # Algorithm 1 (or 4)
    without_rewards = [p for p in range(k_plat) if not cfg_env.feedback[p]]  # Algorithm 2
    dims = [cfg_env.state_dim(p) for p in range(k_plat)]

    # Parties: a local network (and its target copy and optimiser) per platform.
    local, local_target, local_opt = [], [], []
    for p in range(k_plat):
        net = local_network(config, dims[p], torch_generator(tree, "init", "local", p))
        target = local_network(config, dims[p])
        target.load_state_dict(net.state_dict())
        target.requires_grad_(False)
        local.append(net)
        local_target.append(target)
        local_opt.append(torch.optim.Adam(net.parameters(), lr=config.lr, fused=True))

    # Server: the fusion network, its target copy, its optimiser, and the channels.
    linear = config.variant == "linear"
    server_kwargs = {
        "arch": config.server_arch,
        "activation": "identity" if linear else config.activation,
        "output_activation": config.output_activation,
    }
    hidden = config.server_hidden[:1] if linear else config.server_hidden
    server = ServerNetwork(
        members,
        k_plat,
        n_cand,
        hidden,
        generator=torch_generator(tree, "init", "server"),
        **server_kwargs,
    )
    server_target = ServerNetwork(members, k_plat, n_cand, hidden, **server_kwargs)
    server_target.load_state_dict(server.state_dict())
    server_target.requires_grad_(False)
    server_opt = torch.optim.Adam(server.parameters(), lr=config.server_lr or config.lr, fused=True)
    cross = config.variant != "fedq"
    fusion = factory(server, names, cross)
    target_fusion = factory(server_target, names, cross)
    # Acting in plaintext takes a numpy shortcut (same values, no autograd overhead).
    numpy_acting = PlaintextFusion(server, names, cross) if fusion_factory is None else None
    item_aligned = config.alignment == "item"

    def seen_by(xs: Sequence, q: int, p: int):
        """Platform q's features as they enter platform p's fusion (item alignment: p's docs)."""
        return on_candidates_of(xs[q], xs[p], n_cand) if item_aligned and q != p else xs[q]

    def fuse_for_acting(msgs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        if numpy_acting is not None:
            return {k: t[:, 0] for k, t in numpy_acting.numpy_forward(msgs, outputs).items()}
        with torch.no_grad():
            fused = fusion.forward({k: torch.from_numpy(v) for k, v in msgs.items()}, outputs)
        return {k: t.numpy()[:, 0] for k, t in fused.items()}

    act_rng = tree.generator("agent", "explore")
    replay_rng = tree.generator("agent", "replay")
    replay = ReplayBuffer(config.buffer_size, members, dims, n)
    rewards = np.zeros((config.episodes, members, k_plat))
    updates = {f"local_{names[p]}": 0 for p in range(k_plat)} | {"server": 0}
    sarsa = config.target == "sarsa"
    state = TrainingState(
        stateful={f"local.{p}": local[p] for p in range(k_plat)}
        | {f"local_target.{p}": local_target[p] for p in range(k_plat)}
        | {f"local_opt.{p}": local_opt[p] for p in range(k_plat)}
        | {"server": server, "server_target": server_target, "server_opt": server_opt}
        | {"replay": replay},
        generators={"explore": act_rng, "replay": replay_rng}
        | {f"env.{k}": g for k, g in env.streams.named().items()},
        arrays={"rewards": rewards},
    )
    resumed = resume_counters(state, checkpoints, config.variant, config)
    first_episode, rounds, learn_steps = (resumed[k] for k in ("episodes", "rounds", "learn"))
    updates |= resumed["updates"]
    timings = {"acting": 0.0, "learning": 0.0} | resumed["timings"]
    start = time.perf_counter() - resumed["seconds"]

    def x_round_pad(xs: list[np.ndarray]) -> list[np.ndarray]:
        """Pad the platforms' feature arrays to one width (choice weights read columns
        ``0..N`` only, which every platform's features share)."""
        width = max(a.shape[1] for a in xs)
        return [np.pad(a, ((0, 0), (0, width - a.shape[1]))) for a in xs]

    def step_update(
        p: int,
        loss_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        xs: list[torch.Tensor],
        positions: torch.Tensor | Callable[[dict[str, torch.Tensor]], torch.Tensor],
    ) -> None:
        """One update of platform ``p``'s network and the server through the fusion seam.

        ``positions``: the candidate positions whose fused values ``p``'s loss needs, or a
        function that picks them from the (detached) Q-value messages (B's greedy slate).
        """
        own = local[p](xs[p])
        msgs = {names[p]: own}
        with torch.no_grad():  # the other platforms' networks are frozen for this update
            for q in range(k_plat):
                if q != p:
                    msgs[names[q]] = local[q](seen_by(xs, q, p))
        if callable(positions):
            positions = positions({k: m.detach() for k, m in msgs.items()})
        fused = fusion.forward(msgs, [names[p]], {names[p]: positions})[names[p]]
        fused = fused.requires_grad_(True)  # what party p received
        loss = loss_of(fused, positions)
        local_opt[p].zero_grad(set_to_none=True)
        server_opt.zero_grad(set_to_none=True)
        loss.backward()
        grads = fusion.backward({names[p]: fused.grad})
        own.backward(grads[names[p]])
        local_opt[p].step()
        server_opt.step()
        updates[f"local_{names[p]}"] += 1
        updates["server"] += 1

    def learn() -> None:
        idx = replay.sample(replay_rng, config.batch_size, sarsa)
        xs = [torch.from_numpy(replay.gather(replay.x, p, idx)) for p in range(k_plat)]
        done = replay.done[idx]
        # 1. TD targets of the platforms with rewards, on the target networks.
        targets_y, valid = {}, {}
        with torch.no_grad():
            x_next = [replay.gather(replay.x_next, p, idx) for p in range(k_plat)]

            def next_messages(p: int) -> dict[str, torch.Tensor]:
                return {
                    names[q]: local_target[q](torch.from_numpy(seen_by(x_next, q, p)))
                    for q in range(k_plat)
                }

            shared_next = None if item_aligned else next_messages(0)  # the same for every p
            for p in with_rewards:
                q_next = shared_next if shared_next is not None else next_messages(p)
                qf_next = target_fusion.forward(q_next, [names[p]])[names[p]].numpy()
                nxt = replay.gather(replay.next_slate, p, idx) if sarsa else None
                x_val = next_values(config, choice, qf_next, x_next[p], nxt)
                fb = replay.gather(replay.feedback, p, idx)
                valid[p] = ~np.isnan(fb)
                y = np.where(valid[p], fb, 0.0) * config.reward_scale
                targets_y[p] = (y + config.gamma * x_val * ~done).astype(np.float32)
        # 2. Algorithm 1 for each platform with rewards: Huber(Qf_p(s, clicked), Y_p).
        for p in with_rewards:
            clicked = torch.from_numpy(replay.gather(replay.clicked, p, idx))[..., None]
            y_t, m_t = torch.from_numpy(targets_y[p]), torch.from_numpy(valid[p])

            def loss_clicked(fused, positions, y_t=y_t, m_t=m_t):
                return masked_huber(fused[..., 0], y_t, m_t, config.huber_delta)

            step_update(p, loss_clicked, xs, clicked)
        if not without_rewards:
            return
        # 3. Algorithm 2 for each platform without rewards: V_B(s_B) onto the team target.
        stack_y = np.stack([targets_y[p] for p in with_rewards])
        stack_m = np.stack([valid[p] for p in with_rewards])
        team_valid = stack_m.any(axis=0)
        team_y = (stack_y * stack_m).sum(axis=0) / np.maximum(stack_m.sum(axis=0), 1)
        y_t, m_t = torch.from_numpy(team_y.astype(np.float32)), torch.from_numpy(team_valid)
        for p in without_rewards:
            v, v_null = choice_weights(choice, xs[p].numpy(), n_cand)
            v_t = torch.from_numpy(v.astype(np.float32))
            vn_t = torch.from_numpy(v_null.astype(np.float32))

            def greedy_positions(msgs, p=p, v=v, v_null=v_null):
                # B's greedy slate on Qf_B, from the networks as updated so far this step.
                with torch.no_grad():
                    qf = fusion.forward(msgs, [names[p]])[names[p]].numpy()
                s_, b_ = qf.shape[:2]
                slates = select_slates(
                    config.slate_method,
                    qf.reshape(s_ * b_, n_cand),
                    v.reshape(s_ * b_, n_cand),
                    v_null.reshape(s_ * b_),
                    n,
                )
                return torch.from_numpy(slates.reshape(s_, b_, n))

            def loss_value(fused, slates, v_t=v_t, vn_t=vn_t):
                # fused holds Qf_B at the slate's positions: V_B = sum_j P(j) Qf_B(j).
                chosen_v = torch.gather(v_t, 2, slates)
                probs = chosen_v / (vn_t[..., None] + chosen_v.sum(dim=2, keepdim=True))
                value = (probs * fused).sum(dim=2)
                return masked_huber(value, y_t, m_t, config.huber_delta)

            step_update(p, loss_value, xs, greedy_positions)

    for episode in range(first_episode, config.episodes):
        env.reset()
        x = [features(env.observation(p), config) for p in range(k_plat)]
        done = False
        tock = time.perf_counter()
        while not done:
            eps = config.epsilon(rounds)
            # Acting: one inquiry per round; every platform gets its fused Q-values.
            if item_aligned:  # one fusion per platform, on that platform's candidates
                qf = {}
                for p in range(k_plat):
                    msgs = {
                        names[q]: local[q].numpy_forward(seen_by(x, q, p)[:, None, :])
                        for q in range(k_plat)
                    }
                    qf |= fuse_for_acting(msgs, [names[p]])
            else:
                msgs = {names[p]: local[p].numpy_forward(x[p][:, None, :]) for p in range(k_plat)}
                qf = fuse_for_acting(msgs, list(names))
            # Every platform's slate from the round's inquiry, in one batch (rows p * S + s).
            x_all = np.concatenate(x_round_pad(x))
            v, v_null = choice_weights(choice, x_all, n_cand)
            q_all = np.concatenate([qf[names[p]] for p in range(k_plat)])
            slates_all = select_slates(config.slate_method, q_all, v, v_null, n)
            slates_all = explore(slates_all, eps, act_rng, n_cand).reshape(k_plat, members, n)
            for p in range(k_plat):
                slates = slates_all[p]
                out = env.step(p, slates)
                rewards[episode, :, p] += out.engagement
                x_next = features(env.observation(p), config)
                replay.add(p, x[p], slates, out.clicked, out.feedback, x_next)
                x[p] = x_next
                done = out.done
            tick = time.perf_counter()
            timings["acting"] += tick - tock
            replay.commit(done)
            rounds += 1
            if rounds > config.burn_in and rounds % config.learn_every == 0:
                learn()
                learn_steps += 1
            if rounds % config.target_sync == 0:
                for p in range(k_plat):
                    local_target[p].load_state_dict(local[p].state_dict())
                server_target.load_state_dict(server.state_dict())
            tock = time.perf_counter()
            timings["learning"] += tock - tick
        if config.log_every and (episode + 1) % config.log_every == 0:
            recent = rewards[max(0, episode - config.log_every + 1) : episode + 1].mean(axis=(0, 1))
            print(
                f"fedslate[{config.variant}] episode {episode + 1}: mean reward per platform "
                f"{np.round(recent, 1)}, eps {config.epsilon(rounds):.3f}, "
                f"{time.perf_counter() - start:.0f}s",
                flush=True,
            )
        counters = {"episodes": episode + 1, "rounds": rounds, "learn": learn_steps}
        counters |= {"updates": updates, "timings": timings}
        counters["seconds"] = time.perf_counter() - start
        checkpoint_if_due(state, checkpoints, config.variant, config, counters)
    return RunResult(
        algorithm=config.variant,
        config=config.to_dict(),
        episode_rewards=rewards,
        seconds=time.perf_counter() - start,
        rounds=rounds,
        learn_steps=learn_steps,
        updates=updates,
        timings=timings,
        networks={f"local_{names[p]}": local[p] for p in range(k_plat)} | {"server": server},
    )
