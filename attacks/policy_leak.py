"""Policy leak (FedHPD): what an honest-but-curious server learns about each agent from its uploads.

FedHPD (Jiang et al., AAMAS 2025; docs/fedhpd.md) has every agent upload its action distributions
on the public state set ``S_p`` at each distillation event; the protocol needs only their mean,
but a plaintext transport shows the server every agent's upload (``rows``/``values`` payloads of
the :class:`~securefed.views.ServerView`, client id = agent index). Those uploads are the agent's
policy evaluated on a few thousand states: the server can clone the policy and measure what the
agent's private training has achieved, without ever seeing its environment or its returns.

Threat model: an honest-but-curious server that runs the protocol as specified. It knows what it
made or chose (``S_p``, the schedule: ``d``, loops, parts; the task, hence a simulator of its own,
as it already has one to make ``S_p``) and what its :class:`~securefed.views.ServerView` holds. It
does not know the agents' networks, environments, seeds or returns. Active attacks are not covered.

Stages of :func:`verify_policy_leak`:

1. **Read** (:func:`read_event`). For each distillation event, the uploads of one loop (default the
   first: the policy that played the rounds just before the event, before any distillation step),
   concatenated over the parts of ``S_p``. Payloads without ``rows``/``values`` (secure
   aggregation's masked integers, ciphertexts) hold nothing per agent: those events fall back to
   the chance baseline with a note. Noisy payloads (local DP) are used as they are; the noise std
   comes from the DP transport's public record (:func:`securefed.attacks.verify.dp_noise_std`).
   Categorical
   uploads are divided by their mean row sum (1 for exact uploads; it undoes a DP clipping factor
   and is an average over all rows under noise).
2. **Clone** (:func:`fit_clones`). One small MLP per agent and event (one hidden tanh layer, all
   clones stacked and fitted together), fitted to the uploads by squared error on the
   distribution (probabilities; Gaussian ``[mean, std]``). Why this clone and not the nearest
   public state: the rollouts leave ``S_p`` (a weak agent visits states the server's competent
   virtual agent never did), where a smooth parametric policy extrapolates and a lookup table does
   not; and squared error is unbiased under zero-mean noise (``E||f - (p + e)||^2 = ||f - p||^2 +
   const``), so the same fit pools local-DP noise over every public state, where KL would break
   on negative noisy "probabilities".
3. **Roll out** (:func:`clone_returns`). Each clone plays ``episodes`` episodes in the server's
   own copy of the environment (vectorised CartPole from :mod:`securefed.rl.fast`; gymnasium
   otherwise),
   sampling actions as the agents do; the mean return estimates the agent's recent performance.
4. **Link** (:func:`link_accuracy`). Whether the server could re-identify agents across events if
   uploads were anonymous: the uploads of consecutive events are matched by the assignment that
   minimises the total mean absolute difference (Hungarian method); chance is ``1 / K``.
5. **Score** (:func:`score_estimates`) against the truth, the agents' mean return over the
   ``window`` training rounds before each event (``RunResult.returns``), beside the chance
   baseline: every agent gets the population's mean true return at that event (which knows the
   population's progress over time, so it is a hard baseline to beat) and a random ranking
   (expected rank correlation 0).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from scipy.stats import spearmanr

from securefed import SeedTree, ServerView
from securefed.attacks.verify import _jsonable, dp_noise_std
from securefed.rl.fedhpd import FedHPDConfig, TaskSpec, stream_seed, task_spec
from securefed.rl.policies import (
    MIN_STD,
    sample_categorical,
    sample_gaussian,
    softmax_np,
    softplus_np,
)

PLAINTEXT_FIELDS = frozenset({"rows", "values"})
METRICS = ("mae", "rmse", "spearman", "spearman_within_event")


# ------------------------------------------------------------------------------ configuration


@dataclass(frozen=True)
class PolicyProtocol:
    """FedHPD's public schedule: what the server knows because it runs it (docs/fedhpd.md).

    Transport round ``r`` of the run is event ``r // (loops * parts)``, loop
    ``(r // parts) % loops``, part ``r % parts``; event ``e`` follows training round
    ``(e + 1) * d`` (1-based).

    Attributes:
        task: task name (``cartpole``, ...).
        d: distillation interval.
        rounds: training rounds of the run.
        n_agents: agents (client ids ``0..n_agents-1``).
        distill_loops: loops over ``S_p`` per event.
        part_size: states per part.
        public_size: size of ``S_p``.
    """

    task: str
    d: int
    rounds: int
    n_agents: int
    distill_loops: int
    part_size: int
    public_size: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "task", task_spec(self.task).name)
        for name in ("d", "rounds", "n_agents", "distill_loops", "part_size", "public_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or int(value) != value or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
            object.__setattr__(self, name, int(value))

    @classmethod
    def from_config(cls, config: FedHPDConfig) -> PolicyProtocol:
        """The public schedule of a FedHPD run (``algorithm="fedhpd"`` only)."""
        if config.algorithm != "fedhpd":
            raise ValueError(f"the policy leak attacks FedHPD uploads, not {config.algorithm!r}")
        return cls(
            config.task,
            config.d,
            config.rounds,
            config.n_agents,
            config.distill_loops,
            config.part_size,
            config.public_size,
        )

    @property
    def spec(self) -> TaskSpec:
        return task_spec(self.task)

    @property
    def n_parts(self) -> int:
        return math.ceil(self.public_size / self.part_size)

    @property
    def n_events(self) -> int:
        return self.rounds // self.d

    def transport_round(self, event: int, loop: int, part: int) -> int:
        """The transport round id of ``(event, loop, part)``."""
        if not (0 <= event < self.n_events and 0 <= loop < self.distill_loops):
            raise ValueError(f"no event {event} / loop {loop} in this schedule")
        if not 0 <= part < self.n_parts:
            raise ValueError(f"no part {part} (the schedule has {self.n_parts})")
        return (event * self.distill_loops + loop) * self.n_parts + part

    def event_end(self, event: int) -> int:
        """Training rounds played before event ``event``."""
        return (event + 1) * self.d


@dataclass(frozen=True)
class CloneConfig:
    """How the server clones and evaluates a policy (stages 1-3 of the module docstring).

    Attributes:
        loop: which loop's uploads of each event to clone (0: before any distillation step).
        hidden: tanh units of the clone's hidden layer.
        steps: full-batch Adam steps of the fit.
        lr: Adam learning rate of the fit.
        episodes: rollouts per clone.
        chunk: clones fitted and rolled out together (bounds memory).
        seed: the attack's own randomness (clone initialisation, rollouts).
    """

    loop: int = 0
    hidden: int = 32
    steps: int = 200
    lr: float = 0.02
    episodes: int = 32
    chunk: int = 64
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("hidden", "steps", "episodes", "chunk"):
            value = getattr(self, name)
            if isinstance(value, bool) or int(value) != value or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if isinstance(self.loop, bool) or int(self.loop) != self.loop or self.loop < 0:
            raise ValueError(f"loop must be a non-negative integer, got {self.loop!r}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be finite and > 0, got {self.lr!r}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")


# ------------------------------------------------------------------------------ stage 1: read


@dataclass(frozen=True, eq=False)
class EventUploads:
    """One event's uploads as the server can read them.

    Attributes:
        event: the event index.
        clients: agent ids, sorted (empty when nothing was readable).
        values: ``(K, public_size, width)`` uploads, or ``None`` when unreadable.
        noise_std: per-coordinate noise std of the payloads (0: exact; ``None``: unknown).
        reason: why ``values`` is ``None`` (empty otherwise).
    """

    event: int
    clients: np.ndarray
    values: np.ndarray | None
    noise_std: float | None = 0.0
    reason: str = ""


def read_event(
    view: ServerView, protocol: PolicyProtocol, event: int, loop: int = 0
) -> EventUploads:
    """Every agent's upload of ``(event, loop)``, concatenated over the parts of ``S_p``.

    Only agents with a readable payload in every part are kept. Categorical uploads are divided
    by their mean row sum (see the module docstring).
    """
    empty = np.zeros(0, np.int64)
    if loop >= protocol.distill_loops:
        raise ValueError(f"loop {loop} >= distill_loops {protocol.distill_loops}")
    blocks: dict[int, list[np.ndarray]] = {}
    noise: list[float | None] = []
    for part in range(protocol.n_parts):
        round_id = protocol.transport_round(event, loop, part)
        try:
            rnd = view.round(round_id)
        except KeyError:
            return EventUploads(event, empty, None, None, f"round {round_id} is not in the view")
        if not rnd.keep_payloads:
            return EventUploads(event, empty, None, None, f"round {round_id} kept no payloads")
        fields = {name for payload in rnd.payloads.values() for name in payload}
        if not fields >= PLAINTEXT_FIELDS:
            return EventUploads(
                event, empty, None, None,
                f"payload fields {sorted(fields)} carry no per-agent plaintext rows "
                "(masked or encrypted)",
            )  # fmt: skip
        noise.append(dp_noise_std(view, round_id))
        rows = min(protocol.part_size, protocol.public_size - part * protocol.part_size)
        for client, payload in rnd.payloads.items():
            values = _dense_rows(payload, rows)
            if values is not None:
                blocks.setdefault(int(client), []).append(values)
    complete = sorted(c for c, parts in blocks.items() if len(parts) == protocol.n_parts)
    if not complete:
        return EventUploads(event, empty, None, None, "no agent has a readable upload per part")
    values = np.stack([np.concatenate(blocks[c]) for c in complete])
    if protocol.spec.kind == "categorical":
        values = unscale_probabilities(values)
    known = [n for n in noise if n is not None]
    noise_std = max(known) if len(known) == len(noise) else None
    return EventUploads(event, np.array(complete, np.int64), values, noise_std)


def _dense_rows(payload: dict[str, np.ndarray], n_rows: int) -> np.ndarray | None:
    """The ``(n_rows, width)`` block of a ``rows``/``values`` payload (``None`` if malformed)."""
    rows = np.asarray(payload["rows"], dtype=np.int64)
    values = np.asarray(payload["values"], dtype=np.float64)
    if values.ndim != 2 or len(rows) != len(values) or len(rows) == 0:
        return None
    if rows.min() < 0 or rows.max() >= n_rows:
        return None
    dense = np.zeros((n_rows, values.shape[1]))
    dense[rows] = values
    return dense


def unscale_probabilities(values: np.ndarray) -> np.ndarray:
    """Divide each agent's probability rows by their mean row sum (exactly 1 when unscaled).

    Args:
        values: ``(K, n, A)`` uploads.
    """
    scale = values.sum(axis=-1).mean(axis=-1)
    scale = np.where(scale > 1e-12, scale, 1.0)
    return values / scale[:, None, None]


# ------------------------------------------------------------------------------ stage 2: clone


@dataclass(frozen=True, eq=False)
class CloneWeights:
    """Stacked one-hidden-layer clones ``(C, ...)`` and the state normaliser they expect.

    Attributes:
        w1: ``(C, obs, hidden)``; b1: ``(C, 1, hidden)``; w2: ``(C, hidden, width)``;
            b2: ``(C, 1, width)``.
        mean, std: state normaliser (of ``S_p``).
        kind: ``categorical`` or ``gaussian``.
    """

    w1: np.ndarray
    b1: np.ndarray
    w2: np.ndarray
    b2: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    kind: str

    @property
    def size(self) -> int:
        return self.w1.shape[0]


def _clone_output(out: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "categorical":
        return torch.softmax(out, dim=-1)
    a = out.shape[-1] // 2
    return torch.cat([out[..., :a], torch.nn.functional.softplus(out[..., a:]) + MIN_STD], -1)


def fit_clones(
    states: np.ndarray,
    targets: np.ndarray,
    kind: str,
    config: CloneConfig,
    generator: torch.Generator,
) -> CloneWeights:
    """Fit one clone per upload by squared error on the distribution (full-batch Adam).

    Args:
        states: ``(n, obs)`` the public states.
        targets: ``(C, n, width)`` uploads (probabilities, or ``[mean, std]``).
        kind: ``categorical`` or ``gaussian``.
        config: hidden width, steps, learning rate.
        generator: initial weights.
    """
    states = np.asarray(states, dtype=np.float64)
    targets = np.asarray(targets, dtype=np.float64)
    if targets.ndim != 3 or targets.shape[1] != len(states):
        raise ValueError(f"targets must be (C, {len(states)}, width), got {targets.shape}")
    mean, std = states.mean(axis=0), states.std(axis=0) + 1e-8
    c, _, width = targets.shape
    obs, hidden = states.shape[1], config.hidden
    x = torch.as_tensor((states - mean) / std, dtype=torch.float32).expand(c, -1, -1)
    y = torch.as_tensor(targets, dtype=torch.float32)
    w1 = (torch.randn(c, obs, hidden, generator=generator) / math.sqrt(obs)).requires_grad_()
    b1 = torch.zeros(c, 1, hidden, requires_grad=True)
    w2 = (torch.randn(c, hidden, width, generator=generator) * 0.1).requires_grad_()
    b2 = torch.zeros(c, 1, width, requires_grad=True)
    optimiser = torch.optim.Adam([w1, b1, w2, b2], lr=config.lr)
    for _ in range(config.steps):
        out = torch.baddbmm(b2, torch.tanh(torch.baddbmm(b1, x, w1)), w2)
        loss = ((_clone_output(out, kind) - y) ** 2).sum(dim=-1).mean(dim=-1).sum()
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    arrays = [t.detach().numpy().astype(np.float64) for t in (w1, b1, w2, b2)]
    return CloneWeights(*arrays, mean=mean, std=std, kind=kind)


def clone_distribution(weights: CloneWeights, obs: np.ndarray) -> np.ndarray:
    """``(C, B, width)`` distributions of the clones at ``obs`` ``(C, B, obs_dim)``."""
    x = (np.asarray(obs, dtype=np.float64) - weights.mean) / weights.std
    out = np.matmul(np.tanh(np.matmul(x, weights.w1) + weights.b1), weights.w2) + weights.b2
    if weights.kind == "categorical":
        return softmax_np(out)
    a = out.shape[-1] // 2
    return np.concatenate([out[..., :a], softplus_np(out[..., a:]) + MIN_STD], axis=-1)


# ------------------------------------------------------------------------------ stage 3: roll out


def clone_returns(
    weights: CloneWeights, spec: TaskSpec, episodes: int, tree: SeedTree, *path: int | str
) -> np.ndarray:
    """Mean return of each clone over ``episodes`` episodes in the server's own environment.

    Actions are sampled from the clone's distribution (categorical inverse CDF, or ``mean + std
    z``), as the agents sample theirs. Randomness: environment seeds and action noise from
    ``tree`` at ``path``.

    Returns:
        ``(C,)`` mean episode returns.
    """
    from securefed.rl.fast import make_env_batch

    c, n = weights.size, weights.size * episodes
    rng = tree.generator("rollout", *path)
    envs = make_env_batch(spec, n)
    seeds = [stream_seed(tree, "rollout-env", *path, i) for i in range(n)]
    obs = envs.reset(np.arange(n), seeds)
    alive = np.ones(n, dtype=bool)
    total = np.zeros(n)
    for _ in range(spec.episode_cap):
        dist = clone_distribution(weights, obs.reshape(c, episodes, -1)).reshape(n, -1)
        if spec.kind == "categorical":
            actions = sample_categorical(dist, rng.random(n))
        else:
            a = spec.act_dim
            actions = sample_gaussian(dist[:, :a], dist[:, a:], rng.standard_normal((n, a)))
        obs, reward, done = envs.step(actions, alive)
        total += np.where(alive, reward, 0.0)
        alive &= ~np.asarray(done, dtype=bool)
        if not alive.any():
            break
    envs.close()
    return total.reshape(c, episodes).mean(axis=1)


# ------------------------------------------------------------------------------ stage 4: link


def link_accuracy(first: np.ndarray, second: np.ndarray) -> float:
    """Share of agents re-identified across two uploads by the minimum-cost assignment.

    Args:
        first, second: ``(K, n, width)`` uploads of the same agents, in the same order (the
            order is the truth; the matching does not use it).

    Returns:
        The fraction of ``k`` matched to ``k`` (chance: ``1 / K``).
    """
    first, second = np.asarray(first), np.asarray(second)
    if first.shape != second.shape or first.ndim != 3:
        raise ValueError(
            f"uploads must share a (K, n, width) shape, got {first.shape} and {second.shape}"
        )
    cost = np.abs(first[:, None] - second[None]).mean(axis=(-2, -1))
    rows, cols = linear_sum_assignment(cost)
    return float(np.mean(cols[np.argsort(rows)] == np.arange(len(first))))


# ------------------------------------------------------------------------------ stage 5: score


def recent_returns(returns: np.ndarray, protocol: PolicyProtocol, window: int = 10) -> np.ndarray:
    """The truth: each agent's mean return over the ``window`` rounds before each event.

    Args:
        returns: ``(rounds, K)`` episode returns (``RunResult.returns``).

    Returns:
        ``(n_events, K)``.
    """
    returns = np.asarray(returns, dtype=np.float64)
    if returns.ndim != 2 or returns.shape[0] < protocol.rounds:
        raise ValueError(
            f"returns must be (>= {protocol.rounds} rounds, agents), got {returns.shape}"
        )
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    ends = [protocol.event_end(e) for e in range(protocol.n_events)]
    return np.stack([returns[max(0, end - window) : end].mean(axis=0) for end in ends])


def population_baseline(truth: np.ndarray) -> np.ndarray:
    """The chance baseline: every agent gets its event's population mean return."""
    truth = np.asarray(truth, dtype=np.float64)
    return np.broadcast_to(truth.mean(axis=1, keepdims=True), truth.shape).copy()


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation; 0 (a random ranking's expectation) when undefined."""
    if len(a) < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return 0.0
    return float(spearmanr(a, b).statistic)


def score_estimates(estimates: np.ndarray, truth: np.ndarray) -> dict[str, float]:
    """Error and rank agreement of ``(events, K)`` estimates with the truth.

    Returns:
        ``mae``, ``rmse``; ``spearman`` over all (event, agent) pairs; ``spearman_within_event``:
        the mean over events of the rank correlation across agents (which agent is better now);
        a constant prediction scores 0 there (a random ranking's expectation).
    """
    estimates, truth = np.asarray(estimates, float), np.asarray(truth, float)
    if estimates.shape != truth.shape or estimates.ndim != 2:
        raise ValueError(f"estimates {estimates.shape} and truth {truth.shape} must be (events, K)")
    error = estimates - truth
    within = [_spearman(e, t) for e, t in zip(estimates, truth, strict=True)]
    return {
        "mae": float(np.abs(error).mean()),
        "rmse": float(np.sqrt(np.mean(error**2))),
        "spearman": _spearman(estimates.ravel(), truth.ravel()),
        "spearman_within_event": float(np.mean(within)) if within else 0.0,
    }


# ------------------------------------------------------------------------------ the attack


@dataclass(frozen=True, eq=False)
class PolicyAttack:
    """What the server inferred from a view (no truth involved).

    Attributes:
        events: event indices looked at.
        estimates: ``(events, K)`` estimated recent returns (NaN where nothing was readable).
        readable: ``(events,)`` whether the event's uploads could be read.
        linkage: per consecutive readable pair ``(e, e + 1)``, the re-identification accuracy.
        noise_std: the largest per-coordinate noise std of the payloads read (0: exact;
            ``None``: unknown, or nothing was read).
        notes: what did not apply, and why.
    """

    events: np.ndarray
    estimates: np.ndarray
    readable: np.ndarray
    linkage: dict[int, float]
    noise_std: float | None
    notes: tuple[str, ...]


def attack_policies(
    view: ServerView,
    protocol: PolicyProtocol,
    public_states: np.ndarray,
    config: CloneConfig | None = None,
    events: Sequence[int] | None = None,
) -> PolicyAttack:
    """Clone every agent's policy at every readable event and estimate its recent return.

    Args:
        view: what the server saw.
        protocol: the public schedule.
        public_states: ``S_p`` (the server made it).
        config: the clone's settings.
        events: events to attack (default: all of the schedule).
    """
    config = config or CloneConfig()
    public_states = np.asarray(public_states, dtype=np.float64)
    if public_states.shape != (protocol.public_size, protocol.spec.obs_dim):
        raise ValueError(
            f"public_states must be ({protocol.public_size}, {protocol.spec.obs_dim}), "
            f"got {public_states.shape}"
        )
    chosen = np.arange(protocol.n_events) if events is None else np.asarray(events, np.int64)
    k = protocol.n_agents
    estimates = np.full((len(chosen), k), np.nan)
    reads = [read_event(view, protocol, int(e), config.loop) for e in chosen]
    readable = np.array([r.values is not None for r in reads], dtype=bool)
    notes = _read_notes(reads)
    tree = SeedTree(config.seed)
    generator = torch.Generator().manual_seed(stream_seed(tree, "clone-init"))
    jobs = [(i, j, int(c)) for i, r in enumerate(reads) if r.values is not None
            for j, c in enumerate(r.clients.tolist())]  # fmt: skip
    for start in range(0, len(jobs), config.chunk):
        batch = jobs[start : start + config.chunk]
        targets = np.stack([reads[i].values[j] for i, j, _ in batch])
        weights = fit_clones(public_states, targets, protocol.spec.kind, config, generator)
        returns = clone_returns(weights, protocol.spec, config.episodes, tree, start)
        for (i, _, client), value in zip(batch, returns, strict=True):
            estimates[i, client] = value
    linkage = {}
    for i in range(len(chosen) - 1):
        a, b = reads[i], reads[i + 1]
        if chosen[i + 1] == chosen[i] + 1 and a.values is not None and b.values is not None:
            common = np.intersect1d(a.clients, b.clients)
            if len(common) >= 2:
                pick_a = np.searchsorted(a.clients, common)
                pick_b = np.searchsorted(b.clients, common)
                linkage[int(chosen[i])] = link_accuracy(a.values[pick_a], b.values[pick_b])
    stds = [r.noise_std for r in reads if r.values is not None]
    noise = None if not stds or any(s is None for s in stds) else max(stds)
    return PolicyAttack(chosen, estimates, readable, linkage, noise, notes)


def _read_notes(reads: Sequence[EventUploads]) -> tuple[str, ...]:
    notes = []
    reasons: dict[str, int] = {}
    for r in reads:
        if r.values is None:
            reasons[r.reason] = reasons.get(r.reason, 0) + 1
    for reason, count in reasons.items():
        notes.append(
            f"{count} event(s) unreadable ({reason}): nothing per agent to clone there; those "
            "agents get the chance baseline"
        )
    noisy = [r.noise_std for r in reads if r.values is not None and r.noise_std]
    if noisy:
        notes.append(
            f"payloads are noisy (per-coordinate noise std up to {max(noisy):.3g}, e.g. local DP): "
            "the clones are fitted to the noisy values (squared error pools the noise over S_p)"
        )
    return tuple(notes)


# ------------------------------------------------------------------------------ the report


@dataclass(frozen=True, eq=False)
class PolicyLeakReport:
    """The policy leak of one view, scored against the agents' true recent returns.

    Attributes:
        transport: ``view.transport``.
        method: ``"clone"`` when at least one event was cloned, else ``"baseline"``.
        events: event indices scored.
        estimates: ``(events, K)`` the attack's estimates (baseline where unreadable).
        truth: ``(events, K)`` mean true return over ``window`` rounds before each event.
        baseline_estimates: ``(events, K)`` the chance baseline.
        overall: :func:`score_estimates` of the attack, plus ``events_cloned``, ``link_accuracy``
            (mean over event pairs; chance without pairs) and ``link_chance``.
        baseline: :func:`score_estimates` of the baseline (``link_accuracy`` = chance).
        noise_std: per-coordinate noise std of the payloads read (0: exact, ``None``: unknown).
        window: rounds averaged for the truth.
        notes: caveats and what did not apply.
    """

    transport: str
    method: str
    events: np.ndarray
    estimates: np.ndarray
    truth: np.ndarray
    baseline_estimates: np.ndarray
    overall: dict[str, float] = field(default_factory=dict)
    baseline: dict[str, float] = field(default_factory=dict)
    noise_std: float | None = 0.0
    window: int = 10
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, object]:
        """JSON-ready copy (lists and floats; NaN becomes ``None``)."""
        return {
            "attack": "fedhpd_policy_clone",
            "transport": self.transport,
            "method": self.method,
            "window": self.window,
            "noise_std": self.noise_std,
            "notes": list(self.notes),
            "overall": _jsonable(self.overall),
            "baseline": _jsonable(self.baseline),
            "events": _jsonable(self.events),
            "estimates": _jsonable(self.estimates),
            "truth": _jsonable(self.truth),
            "baseline_estimates": _jsonable(self.baseline_estimates),
        }


def verify_policy_leak(
    view: ServerView,
    protocol: PolicyProtocol,
    public_states: np.ndarray,
    returns: np.ndarray,
    *,
    config: CloneConfig | None = None,
    window: int = 10,
    events: Sequence[int] | None = None,
) -> PolicyLeakReport:
    """Run the policy-clone attack on ``view`` and score it against the true returns.

    Args:
        view: what the server saw (``ServerView`` of the run's transport).
        protocol: the public schedule (:meth:`PolicyProtocol.from_config`).
        public_states: ``S_p``.
        returns: ``(rounds, K)`` the run's episode returns (truth, for scoring only).
        config: the clone's settings.
        window: rounds before each event averaged for the truth.
        events: events to attack (default: all).

    Returns:
        A :class:`PolicyLeakReport`; where an event is unreadable (masked or encrypted payloads)
        its agents get the chance baseline, and the notes say so.
    """
    attack = attack_policies(view, protocol, public_states, config, events)
    truth = recent_returns(returns, protocol, window)[attack.events]
    baseline = population_baseline(truth)
    estimates = np.where(np.isnan(attack.estimates), baseline, attack.estimates)
    cloned = int(attack.readable.sum())
    chance = 1.0 / protocol.n_agents
    links = list(attack.linkage.values())
    overall = score_estimates(estimates, truth) | {
        "events_cloned": float(cloned),
        "link_accuracy": float(np.mean(links)) if links else chance,
        "link_chance": chance,
    }
    base = score_estimates(baseline, truth) | {
        "events_cloned": 0.0,
        "link_accuracy": chance,
        "link_chance": chance,
    }
    notes = list(attack.notes)
    if cloned == 0:
        notes.append("no event was readable: the report is the chance baseline")
    if not links:
        notes.append("no two consecutive events readable: link_accuracy is chance (a guess)")
    else:
        notes.append(
            "link_accuracy: re-identification of agents across consecutive events from the "
            "uploads alone (a plaintext view also carries the client ids)"
        )
    return PolicyLeakReport(
        transport=view.transport,
        method="clone" if cloned else "baseline",
        events=attack.events,
        estimates=estimates,
        truth=truth,
        baseline_estimates=baseline,
        overall=overall,
        baseline=base,
        noise_std=attack.noise_std,
        window=window,
        notes=tuple(notes),
    )


__all__ = [
    "METRICS",
    "CloneConfig",
    "CloneWeights",
    "EventUploads",
    "PolicyAttack",
    "PolicyLeakReport",
    "PolicyProtocol",
    "attack_policies",
    "clone_distribution",
    "clone_returns",
    "fit_clones",
    "link_accuracy",
    "population_baseline",
    "read_event",
    "recent_returns",
    "score_estimates",
    "unscale_probabilities",
    "verify_policy_leak",
]
