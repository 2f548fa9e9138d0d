"""FedHPD (``securefed.rl.fedhpd``) on Flower: the agents on the SuperNodes, the consensus on the
server.

The split follows ``securefed.flower``'s protocol (docs/flower.md): one Flower training round is
one transport round of the run, i.e. one part of ``S_p`` in one loop of one distillation event
(``FedHPDConfig.aggregation_rounds()`` rounds in all).

* :class:`FedHPDServer` (``ServerAlgorithm``) holds ``S_p`` and the last consensus. It opens each
  transport round (client id = agent index, as ``aggregate_uploads``), broadcasts the previous
  round's consensus (and ``S_p`` once, in round 0), and keeps only the transport's mean
  (:func:`securefed.rl.fedhpd.consensus`).
* :class:`FedHPDNode` (``ClientNode``) hosts the agents ``partition_users(n_agents,
  num-partitions, partition-id)``. For round ``j`` it first takes the KL step on the consensus of
  round ``j - 1`` (if it uploaded in it), plays the episodes and REINFORCE steps of the rounds up
  to the event of ``j``, then uploads its agents' distributions on the part of ``j``. The final
  ``evaluate`` message carries the last consensus: the node takes that KL step and plays the
  rounds after the last event. Agents, optimisers, schedules, episode counters and the
  environments' generators stay on the node, in its Flower ``Context.state`` as numpy arrays
  (:meth:`FedHPDNode.state_dict`: torch state dicts as arrays, no pickle).

Each agent runs :class:`securefed.rl.fedhpd.Agent`, the step-by-step reference learner, so a seeded
plaintext run equals :class:`securefed.rl.fedhpd.ReferenceRun` (``tests/test_flower_fedhpd.py``).

Dropouts: the broadcast keeps the consensus of the last ``rejoin_window`` rounds with the agents
each counted, so a node lost after uploading rejoins at the next message it gets, as an agent
absent from the rounds it missed does in one process (``RunSpec.absent``); one lost for longer
is left out (``tests/test_flower_fedhpd_recovery.py``). :class:`FedHPDApp` reads the
``flwr run`` app's run config (``rl/flower_app``, :data:`APP_DIR`); ``seed=-1``, the default, is
secure mode.

This module is the app layer: it imports ``rl`` and ``securefed.flower``; ``securefed`` knows
nothing of FedHPD.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from flwr.app import Context

from securefed import PlaintextTransport, RowUpdates, SeedTree, Transport
from securefed.flower import (
    ClientSetup,
    FlowerRunOptions,
    FlowerRunResult,
    ServerSetup,
    make_client_app,
    make_server_app,
    partition_users,
)
from securefed.flower.floors import NodeFloors
from securefed.flower.identity import NodeIdentity
from securefed.flower.identity import node_identity as identity_from_config
from securefed.flower.journal import STATE_DIR_KEY, NodeJournal, lineage_digest
from securefed.integrity import read_key_file
from securefed.records import dumps_record
from securefed.rl.fast import make_public_states
from securefed.rl.fedhpd import (
    Agent,
    FedHPDConfig,
    consensus,
    initial_policies,
    make_env,
    round_noise,
    stream_seed,
)
from securefed.rl.policies import AGENTS
from securefed.transport.base import AggregationRound
from securefed.transport.secagg import SecAggConfig, SecAggTransport

_MASK64 = (1 << 64) - 1


# ----------------------------------------------------------------------------- the schedule
@dataclass(frozen=True)
class Schedule:
    """Where transport round ``j`` of a FedHPD run falls (public: both halves compute it).

    Args:
        config: the run's configuration (``algorithm="fedhpd"``).

    Raises:
        ValueError: for NoFed or DPA-FedRL (not carried on Flower).
    """

    config: FedHPDConfig

    def __post_init__(self) -> None:
        if self.config.algorithm != "fedhpd":
            raise ValueError(
                "securefed.rl.flower_fedhpd carries FedHPD only, "
                f"got algorithm={self.config.algorithm!r}"
            )

    @property
    def rounds(self) -> int:
        """Transport (and Flower training) rounds of the run."""
        return self.config.aggregation_rounds()

    @property
    def width(self) -> int:
        """Values per public state in an upload (probabilities, or ``[mean, std]``)."""
        spec = self.config.spec
        return spec.act_dim if spec.kind == "categorical" else 2 * spec.act_dim

    def part_slice(self, round_id: int) -> slice:
        """The states of ``S_p`` whose distributions round ``round_id`` aggregates."""
        part = round_id % self.config.n_parts()
        start = part * self.config.part_size
        return slice(start, min(start + self.config.part_size, self.config.public_size))

    def played_before(self, round_id: int) -> int:
        """Training rounds played before the upload of ``round_id`` (through its event)."""
        per_event = self.config.distill_loops * self.config.n_parts()
        return (round_id // per_event + 1) * self.config.d

    def check(self, round_id: int) -> None:
        if not 0 <= round_id < self.rounds:
            raise ValueError(f"round {round_id} outside the run's {self.rounds} transport rounds")


# ----------------------------------------------------------------------------- the server half
class FedHPDServer:
    """The server half: ``S_p``, the transport rounds and the consensus (only the mean).

    The broadcast carries the consensus of each of the last ``rejoin_window`` rounds with the
    agents it counted (``consensus.<j>``, ``counted.<j>``): a node that uploaded in round ``j``
    and was then lost finds its consensus there when it rejoins, and a node whose upload the
    round left out sees that it was not counted (docs/flower.md, "FedHPD dropouts").

    Args:
        config: the run's configuration.
        public_states: ``S_p`` (``(public_size, obs_dim)``), made once by the server.
        rejoin_window: rounds whose consensus the broadcast keeps (default: one distillation
            event, ``distill_loops x parts`` rounds); a node lost for longer is left out.
    """

    def __init__(
        self, config: FedHPDConfig, public_states: np.ndarray, rejoin_window: int = 0
    ) -> None:
        self.schedule = Schedule(config)
        self.config = config
        self.public = np.ascontiguousarray(public_states)
        expected = (config.public_size, config.spec.obs_dim)
        if self.public.shape != expected:
            raise ValueError(f"public_states must have shape {expected}, got {self.public.shape}")
        if rejoin_window < 0:
            raise ValueError(f"rejoin_window must be >= 0 (0: one event), got {rejoin_window}")
        self.window = rejoin_window or config.distill_loops * config.n_parts()
        self.n_clients = config.n_agents
        self.round_id = -1
        self.consensus: np.ndarray | None = None
        self.history: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def open_round(
        self, round_id: int, clients: np.ndarray, transport: Transport, seeds: SeedTree
    ) -> tuple[AggregationRound, np.ndarray]:
        self.schedule.check(round_id)
        n = len(range(self.config.public_size)[self.schedule.part_slice(round_id)])
        rnd = transport.open_round(round_id, clients, shape=(n, self.schedule.width), seeds=seeds)
        self.round_id = round_id
        return rnd, np.asarray(clients, np.int64)

    def broadcast_state(self) -> dict[str, np.ndarray]:
        state: dict[str, np.ndarray] = {}
        if self.round_id == 0:  # S_p travels once, with the first round
            state["public"] = self.public
        for round_id, (mean, counted) in self.history.items():
            state[f"consensus.{round_id}"] = mean
            state[f"counted.{round_id}"] = counted
        return state

    def close_round(self, rnd: AggregationRound) -> None:
        spec = self.config.spec
        aggregate = rnd.result()
        self.consensus = consensus(aggregate.mean(), spec.kind, spec.act_dim)
        counted = np.asarray(aggregate.contributors, np.int64)
        self.history[self.round_id] = (self.consensus, np.sort(counted))
        for old in [r for r in self.history if r <= self.round_id - self.window]:
            del self.history[old]

    def state_dict(self) -> dict[str, np.ndarray]:
        """``S_p``, the last round and the consensus window, for the ServerApp's checkpoint."""
        state = {"public": self.public, "round_id": np.array(self.round_id, np.int64)}
        state["history_rounds"] = np.array(sorted(self.history), np.int64)
        for round_id, (mean, counted) in self.history.items():
            state[f"consensus.{round_id}"], state[f"counted.{round_id}"] = mean, counted
        return state

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Restore :meth:`state_dict` (a checkpoint of the same configuration).

        Raises:
            ValueError: ``S_p`` of another shape.
        """
        if state["public"].shape != self.public.shape:
            raise ValueError(
                f"the checkpoint's S_p has shape {state['public'].shape}, not {self.public.shape}"
            )
        self.public = np.ascontiguousarray(state["public"])
        self.round_id = int(state["round_id"])
        self.history = {
            int(r): (np.array(state[f"consensus.{r}"]), np.array(state[f"counted.{r}"]))
            for r in state["history_rounds"].tolist()
        }
        self.consensus = self.history[self.round_id][0] if self.round_id in self.history else None


# ----------------------------------------------------------------------------- agent state
def _rng_words(generator: np.random.Generator) -> np.ndarray:
    state = generator.bit_generator.state
    if state["bit_generator"] != "PCG64":
        raise TypeError(f"cannot save a {state['bit_generator']} environment generator")
    inner = state["state"]
    return np.array(
        [
            inner["state"] >> 64,
            inner["state"] & _MASK64,
            inner["inc"] >> 64,
            inner["inc"] & _MASK64,
            state["has_uint32"],
            state["uinteger"],
        ],
        np.uint64,
    )


def _rng_from_words(words: np.ndarray) -> np.random.Generator:
    w = [int(x) for x in np.asarray(words, np.uint64)]
    generator = np.random.Generator(np.random.PCG64())
    generator.bit_generator.state = {
        "bit_generator": "PCG64",
        "state": {"state": (w[0] << 64) | w[1], "inc": (w[2] << 64) | w[3]},
        "has_uint32": w[4],
        "uinteger": w[5],
    }
    return generator


def agent_state(agent: Agent, prefix: str) -> dict[str, np.ndarray]:
    """Everything an agent carries between messages, as numpy arrays under ``prefix``.

    Parameters, the optimiser's per-parameter state and learning rate, the schedule's counters,
    the episode count, and the environment's generator (the agent is always between episodes
    here, so the generator is the environment's whole state).
    """
    arrays = {
        f"{prefix}param.{name}": value.detach().numpy().copy()
        for name, value in agent.policy.state_dict().items()
    }
    optimizer = agent.optimizer.state_dict()
    for index, entries in optimizer["state"].items():
        for name, value in entries.items():
            arrays[f"{prefix}opt.{index}.{name}"] = torch.as_tensor(value).numpy().copy()
    arrays[f"{prefix}lr"] = np.array(optimizer["param_groups"][0]["lr"], np.float64)
    if agent.scheduler is not None:
        schedule = agent.scheduler.state_dict()
        arrays[f"{prefix}sched"] = np.array(
            [schedule["last_epoch"], schedule["_step_count"]], np.int64
        )
        arrays[f"{prefix}sched_lr"] = np.array(schedule["_last_lr"], np.float64)
    arrays[f"{prefix}episodes"] = np.array(agent.episodes, np.int64)
    if agent.episodes:
        arrays[f"{prefix}env_rng"] = _rng_words(agent.env.unwrapped.np_random)
    return arrays


def load_agent_state(agent: Agent, state: Mapping[str, np.ndarray], prefix: str) -> None:
    """Restore :func:`agent_state` into a freshly built agent (same spec and task).

    Raises:
        ValueError: the saved parameters do not fit the agent.
    """
    params = {
        name[len(prefix) + len("param.") :]: torch.from_numpy(np.array(value))
        for name, value in state.items()
        if name.startswith(f"{prefix}param.")
    }
    try:
        agent.policy.load_state_dict(params)
    except RuntimeError as error:
        raise ValueError(
            f"saved parameters under {prefix!r} do not fit the agent: {error}"
        ) from None
    optimizer = agent.optimizer.state_dict()
    entries: dict[int, dict[str, torch.Tensor]] = {}
    opt_prefix = f"{prefix}opt."
    for name, value in state.items():
        if name.startswith(opt_prefix):
            index, field_name = name[len(opt_prefix) :].split(".", 1)
            entries.setdefault(int(index), {})[field_name] = torch.from_numpy(np.array(value))
    optimizer["state"] = entries
    optimizer["param_groups"][0]["lr"] = float(state[f"{prefix}lr"])
    agent.optimizer.load_state_dict(optimizer)
    if agent.scheduler is not None:
        schedule = agent.scheduler.state_dict()
        last_epoch, step_count = (int(x) for x in state[f"{prefix}sched"])
        schedule |= {
            "last_epoch": last_epoch,
            "_step_count": step_count,
            "_last_lr": [float(x) for x in state[f"{prefix}sched_lr"]],
        }
        agent.scheduler.load_state_dict(schedule)
    agent.episodes = int(state[f"{prefix}episodes"])
    if agent.episodes:
        agent.env.unwrapped.np_random = _rng_from_words(state[f"{prefix}env_rng"])


# ----------------------------------------------------------------------------- the node half
class FedHPDNode:
    """The agents one SuperNode hosts: their policies, optimisers and environments.

    Built fresh for every message (agents from their ``("init", k)`` draws); the saved state, if
    any, is then loaded by ``securefed.flower`` through :meth:`load_state_dict`.

    Args:
        config: the run's configuration.
        agents: the global indices of the hosted agents.
        seeds: the node's seed tree (the run's ``SeedTree(seed)`` for a reproducible run).
    """

    def __init__(self, config: FedHPDConfig, agents: np.ndarray, seeds: SeedTree) -> None:
        self.schedule = Schedule(config)
        self.config = config
        self.users = np.asarray(agents, np.int64)
        if len(self.users) and not (self.users.min() >= 0 and self.users.max() < config.n_agents):
            raise ValueError(f"agents must lie in [0, {config.n_agents}), got {self.users}")
        self.seeds = seeds
        spec = config.spec
        policies = initial_policies(config, seeds)
        self.agents = {
            int(k): Agent(
                policies[k],
                config.agent_specs[k],
                spec,
                make_env(spec),
                stream_seed(seeds, "env", int(k)),
            )
            for k in self.users
        }
        self.returns = np.zeros((config.rounds, len(self.users)))
        self.played = 0
        self.uploaded = 0  # transport rounds this node has uploaded in
        self.pending = -1  # the round whose consensus this node still has to step on
        self.public: np.ndarray | None = None

    # -- the protocol -------------------------------------------------------------------
    def train(
        self,
        round_id: int,
        clients: np.ndarray,
        broadcast: Mapping[str, np.ndarray],
        seeds: SeedTree,
    ) -> tuple[list[RowUpdates], dict[str, float]]:
        """Step on the last consensus, play up to this round's event, upload the part."""
        self.schedule.check(round_id)
        self._absorb(broadcast)
        if self.public is None:
            raise ValueError("this node never received the public state set S_p (round 0)")
        before = self.played
        self._play(self.schedule.played_before(round_id))
        played = self.returns[before : self.played]
        hosted = {int(k): j for j, k in enumerate(self.users)}
        clients = [int(c) for c in clients if int(c) in hosted]
        part = self._part(round_id)
        uploads = np.stack([self.agents[c].upload(part) for c in clients]).astype(np.float64)
        k, n, w = uploads.shape
        batch = RowUpdates(
            clients=np.asarray(clients, np.int64),
            indptr=np.arange(k + 1, dtype=np.int64) * n,
            rows=np.tile(np.arange(n, dtype=np.int64), k),
            values=uploads.reshape(k * n, w),
            n_rows=n,
            dense=True,
        )
        self.pending, self.uploaded = round_id, round_id + 1
        return [batch], {"return_sum": float(played.sum()), "episodes": float(played.size)}

    def evaluate(self, broadcast: Mapping[str, np.ndarray]) -> dict[str, float]:
        """After the last round: the last KL step and the rounds after the last event (also
        for a node lost in the last rounds: its agents go on playing, as absent agents do in
        one process).

        Returns:
            Sums over the hosted agents of their return in the last round, and their count.
        """
        self._absorb(broadcast)
        self._play(self.config.rounds)
        last = self.returns[self.played - 1] if self.played else np.zeros(len(self.users))
        return {"final_return_sum": float(last.sum()), "agents": float(len(self.users))}

    def state_dict(self) -> dict[str, np.ndarray]:
        state = {
            "agents": self.users,
            "returns": self.returns,
            "counters": np.array([self.played, self.uploaded, self.pending], np.int64),
        }
        if self.public is not None:
            state["public"] = self.public
        for k, agent in self.agents.items():
            state |= agent_state(agent, f"agent{k}.")
        return state

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        if not np.array_equal(state["agents"], self.users):
            raise ValueError(
                f"the saved state is of agents {state['agents'].tolist()}, this node hosts "
                f"{self.users.tolist()}"
            )
        self.returns = np.array(state["returns"])
        self.played, self.uploaded, self.pending = (int(x) for x in state["counters"])
        self.public = np.array(state["public"]) if "public" in state else None
        for k, agent in self.agents.items():
            load_agent_state(agent, state, f"agent{k}.")

    def parameters(self) -> dict[int, np.ndarray]:
        """Each hosted agent's parameters, flat in ``parameters()`` order."""
        from securefed.rl.policies import policy_vector

        return {k: policy_vector(agent.policy) for k, agent in self.agents.items()}

    # -- the learner ----------------------------------------------------------------------
    def _absorb(self, broadcast: Mapping[str, np.ndarray]) -> None:
        """Keep ``S_p`` if it came; step on the consensus of the round uploaded last.

        Only the agents that round counted step on it (a node whose upload did not arrive was
        left out of the mean, as an absent agent in one process). A node that rejoins after
        being lost finds that consensus in the broadcast's window.

        Raises:
            ValueError: the consensus of the round this node uploaded in is not in the
                broadcast (lost for longer than the server's ``rejoin_window``).
        """
        if "public" in broadcast:
            self.public = np.array(broadcast["public"])
        if self.pending < 0:
            return
        key = f"consensus.{self.pending}"
        if key not in broadcast:
            kept = sorted(int(k.split(".")[1]) for k in broadcast if k.startswith("consensus."))
            raise ValueError(
                f"the broadcast lacks the consensus of round {self.pending}, which this node "
                f"uploaded in (it keeps rounds {kept}): the node was lost for longer than the "
                "server's rejoin_window and is left out"
            )
        counted = set(np.asarray(broadcast[f"counted.{self.pending}"]).tolist())
        part = self._part(self.pending)
        target = torch.as_tensor(broadcast[key], dtype=self.config.torch_dtype)
        for k, agent in self.agents.items():
            if k in counted:
                agent.distill_step(part, target, self.config.direction)
        self.pending = -1

    def _part(self, round_id: int) -> torch.Tensor:
        public = torch.as_tensor(self.public, dtype=self.config.torch_dtype)
        return public[self.schedule.part_slice(round_id)]

    def _play(self, until: int) -> None:
        for round_id in range(self.played, until):
            noise = round_noise(self.seeds, round_id, self.config)
            for j, k in enumerate(self.users):
                self.returns[round_id, j] = self.agents[int(k)].play_and_learn(
                    noise[k], self.config.gamma
                )
        self.played = max(self.played, until)


# ----------------------------------------------------------------------------- the apps
@dataclass(frozen=True)
class FedHPDFlowerRun:
    """One FedHPD run on Flower.

    Attributes:
        config: the run's configuration (``algorithm="fedhpd"``).
        seed: ``-1`` (the default) is secure mode: the server and every node draw from their own
            operating-system entropy (``SeedTree.secure_mode()``: agents' initial weights,
            environments, exploration noise, secure aggregation's keys and masks), nothing is
            reproducible. A seed ``>= 0`` gives server and nodes ``SeedTree(seed)``, so the run
            is reproducible and equals ``ReferenceRun`` in plaintext: for tests and benchmarks
            only (the server knows every node's keys).
        min_nodes: SuperNodes the server waits for (the agents are split over them).
        output_dir: where each node writes ``node-<partition>.npz`` (its agents, returns and
            parameters) after the run (``""``: nothing is written).
        timeout: seconds one message round may take (a node slower than that is lost for the
            round).
        rejoin_window: rounds of consensus the broadcast keeps for nodes that rejoin (0: one
            distillation event; :class:`FedHPDServer`).
        checkpoint_dir: where the server checkpoints every round and from which a ServerApp
            started again resumes (docs/flower.md, "Resume after a SuperLink crash"; the nodes
            need their journal, node config ``state-dir``); ``""``: none.
        checkpoint_key_file: the checkpoint key's file (0600, >= 16 bytes); secure mode with a
            ``checkpoint_dir`` needs it.
        merge_share_mask: secure aggregation's ShareKeys and MaskedInputCollection in one
            message round (``FlowerRunOptions.merge_share_mask``, run-config key
            ``secagg-merge``): one message round fewer per transport round; a node lost in it
            refuses the round instead of counting as dropped (docs/flower.md, "Fewer message
            rounds"). Secure aggregation only; not with ``checkpoint_dir``.
        advertise_ahead: the next round's AdvertiseKeys with this round's Unmasking
            (``FlowerRunOptions.advertise_ahead``, ``secagg-advertise-ahead``): one message
            round fewer per transport round after the first (a node whose reply is lost sits
            the next round out). Secure aggregation only; not with ``checkpoint_dir``.
    """

    config: FedHPDConfig
    seed: int = -1
    min_nodes: int = 1
    output_dir: str = ""
    timeout: float = 600.0
    rejoin_window: int = 0
    checkpoint_dir: str = ""
    checkpoint_key_file: str = ""
    merge_share_mask: bool = False
    advertise_ahead: bool = False

    def __post_init__(self) -> None:
        Schedule(self.config)
        merged = [
            key
            for key, value in (
                ("secagg-merge", self.merge_share_mask),
                ("secagg-advertise-ahead", self.advertise_ahead),
            )
            if value
        ]
        if self.checkpoint_dir and merged:
            raise ValueError(
                f"checkpoint-dir with {' and '.join(merged)}: a resumed run's merged message "
                "rounds are not covered by the nodes' journals (each node answers a round once); "
                "use one or the other"
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < -1:
            raise ValueError(
                f"seed must be an int >= 0 (seeded: tests and benchmarks), or -1 for secure "
                f"mode; got {self.seed!r}"
            )
        if self.min_nodes < 1:
            raise ValueError(f"min_nodes must be >= 1, got {self.min_nodes}")
        if isinstance(self.rejoin_window, bool) or self.rejoin_window < 0:
            raise ValueError(f"rejoin_window must be >= 0, got {self.rejoin_window!r}")

    @property
    def secure(self) -> bool:
        return self.seed == -1

    def fingerprint(self) -> dict[str, object]:
        """What a checkpoint and a node's journal belong to: the configuration, the seed and
        the rejoin window (not where files go, nor how long to wait)."""
        return {"config": repr(self.config), "seed": self.seed, "rejoin_window": self.rejoin_window}

    def seeds(self) -> SeedTree:
        """The seed tree of a server or node process (fresh OS entropy in secure mode)."""
        return SeedTree.secure_mode() if self.secure else SeedTree(self.seed)


@dataclass
class FedHPDOutcome:
    """What the server ends with (filled when the run finishes)."""

    server: FedHPDServer | None = None
    transport: Transport | None = None
    result: FlowerRunResult | None = None


def _train_metrics(sums: Mapping[str, float]) -> dict[str, float]:
    n = sums.get("episodes", 0.0)
    return {"mean_return": sums.get("return_sum", 0.0) / n if n else math.nan, "episodes": n}


def _evaluation_metrics(sums: Mapping[str, float]) -> dict[str, float]:
    n = sums.get("agents", 0.0)
    return {"final_mean_return": sums["final_return_sum"] / n if n else math.nan}


def server_setup(
    run: FedHPDFlowerRun,
    transport: Transport | None = None,
    public_states: np.ndarray | None = None,
    outcome: FedHPDOutcome | None = None,
) -> ServerSetup:
    """The server's setup: ``S_p`` (made here when not given), the transport, the loop.

    ``transport`` defaults to plaintext; secure aggregation must be
    ``SecAggTransport(..., remote_clients=True)`` (its clients are the nodes).
    """
    config = run.config
    public = make_public_states(config) if public_states is None else public_states
    server = FedHPDServer(config, public, run.rejoin_window)
    transport = PlaintextTransport() if transport is None else transport
    outcome = FedHPDOutcome() if outcome is None else outcome

    def finish(result: FlowerRunResult) -> None:
        outcome.server, outcome.transport, outcome.result = server, transport, result
        if run.output_dir:
            summary = {
                "rounds": result.rounds,
                "evaluations": result.evaluations,
                "message_bytes": result.message_bytes,
                "message_rounds": result.message_rounds,
                "message_seconds": result.message_seconds,
                "nodes": result.nodes,
                "secure_mode": run.secure,
                "transport": transport.name,
            }
            out = Path(run.output_dir)
            out.mkdir(parents=True, exist_ok=True)
            (out / "result.json").write_text(dumps_record(summary, indent=1))

    options = FlowerRunOptions(
        rounds=server.schedule.rounds,
        min_nodes=run.min_nodes,
        timeout=run.timeout,
        checkpoint_dir=run.checkpoint_dir or None,
        fingerprint=run.fingerprint() | {"transport": transport.name},
        checkpoint_key=read_key_file(run.checkpoint_key_file) if run.checkpoint_key_file else None,
        merge_share_mask=run.merge_share_mask,
        advertise_ahead=run.advertise_ahead,
    )
    return ServerSetup(
        server,
        transport,
        run.seeds(),
        options,
        train_metrics=_train_metrics,
        evaluation_metrics=_evaluation_metrics,
        on_finish=finish,
    )


def client_setup(
    run: FedHPDFlowerRun, context: Context, floors: NodeFloors | None = None
) -> ClientSetup:
    """The node's setup for one message: its agents from its ``partition-id``; its privacy
    floors from its node config (``floors`` where a key is absent, else :class:`NodeFloors`'
    defaults), as the FedMF app's nodes."""
    node_config = context.node_config
    if "partition-id" not in node_config or "num-partitions" not in node_config:
        raise ValueError(
            "this SuperNode has no partition: start it with --node-config "
            "'partition-id=<i> num-partitions=<n>'"
        )
    partition = int(node_config["partition-id"])
    agents = partition_users(run.config.n_agents, int(node_config["num-partitions"]), partition)
    node = FedHPDNode(run.config, agents, run.seeds())
    on_evaluate: Callable[[FedHPDNode], None] | None = None
    if run.output_dir:

        def on_evaluate(done: FedHPDNode) -> None:
            path = Path(run.output_dir) / f"node-{partition}.npz"
            path.parent.mkdir(parents=True, exist_ok=True)
            params = {f"param{k}": v for k, v in done.parameters().items()}
            np.savez(path, agents=done.users, returns=done.returns, **params)

    schedule = node.schedule
    shape = (len(range(run.config.public_size)[schedule.part_slice(0)]), schedule.width)
    # The agents' long-term identities for malicious-server secure aggregation (seeded runs:
    # derived from the run's seed, securefed.flower.identity).
    state_dir = str(node_config.get(STATE_DIR_KEY, ""))
    return ClientSetup(
        node,
        node.seeds,
        shape,
        on_evaluate,
        identity=lambda: node_identity(run, context, agents),
        floors=NodeFloors.from_node_config(node_config, floors),
        journal=NodeJournal(state_dir, lineage_digest(run.fingerprint()), partition)
        if state_dir
        else None,
    )


def node_identity(run: FedHPDFlowerRun, context: Context, agents: np.ndarray) -> NodeIdentity:
    """The hosted agents' long-term identities (malicious-server secure aggregation): provisioned
    files when the node config names them (``secagg-identity-path``, ``secagg-registry-path``,
    ``secagg-registry-digest``; :func:`securefed.flower.identity.provision_identities`), which
    secure mode needs; else derived from the run's seed (seeded runs only)."""
    return identity_from_config(context.node_config, run.seeds(), agents, run.config.n_agents)


@dataclass
class FedHPDApps:
    """A ServerApp and ClientApp for one run, and where the server's outcome lands."""

    server: object
    client: object
    outcome: FedHPDOutcome = field(default_factory=FedHPDOutcome)


def build_apps(
    run: FedHPDFlowerRun,
    transport: Callable[[], Transport] | None = None,
    public_states: np.ndarray | None = None,
) -> FedHPDApps:
    """Apps bound to ``run`` (for the simulation engine, whose Python API has no run config).

    Args:
        run: the run.
        transport: makes the server's transport (default: plaintext).
        public_states: ``S_p`` (default: made by the server with ``make_public_states``).
    """
    outcome = FedHPDOutcome()
    server_app = make_server_app(
        lambda context: server_setup(
            run, None if transport is None else transport(), public_states, outcome
        )
    )
    client_app = make_client_app(lambda context: client_setup(run, context))
    return FedHPDApps(server_app, client_app, outcome)


# ----------------------------------------------------------------------------- `flwr run`
APP_DIR = Path(__file__).resolve().parent / "flower_app"
"""The FedHPD app that ``flwr run`` submits: ``pyproject.toml`` (its ``[tool.flwr.app.config]``
is read by :meth:`FedHPDApp.from_run_config`) and the package ``securefed_fedhpd_app``."""

TRANSPORTS = ("plaintext", "secagg")
"""What the app carries (``transport`` key): plaintext, or securefed's secure aggregation with
each node one party (``SecAggTransport(remote_clients=True)``)."""


@dataclass(frozen=True)
class FedHPDApp:
    """A FedHPD run as the app's run config describes it (``flwr run ... -c 'key=value'``).

    Attributes:
        run: the run (its ``seed`` ``-1``, the default, is secure mode).
        transport: one of :data:`TRANSPORTS`.
        secagg: the secure-aggregation parameters (``transport = "secagg"``).
    """

    run: FedHPDFlowerRun
    transport: str = "plaintext"
    secagg: SecAggConfig | None = None

    def __post_init__(self) -> None:
        if self.transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}, got {self.transport!r}")
        if (self.transport == "secagg") != (self.secagg is not None):
            raise ValueError("secagg parameters go with transport='secagg' and with no other")
        for key, value in (
            ("secagg-merge", self.run.merge_share_mask),
            ("secagg-advertise-ahead", self.run.advertise_ahead),
        ):
            if value and self.transport != "secagg":
                raise ValueError(
                    f"{key} merges secure aggregation's message rounds; transport "
                    f"{self.transport!r} has none"
                )

    def make_transport(self) -> Transport:
        if self.secagg is None:
            return PlaintextTransport()
        return SecAggTransport(self.secagg, remote_clients=True)

    @classmethod
    def from_run_config(cls, values: Mapping[str, object]) -> FedHPDApp:
        """Read the app's ``[tool.flwr.app.config]`` keys (``rl/flower_app/pyproject.toml``).

        ``agents`` is ``""`` (the task's ten) or comma-separated indices into the task's
        agents; ``public-size`` and ``virtual-rounds`` ``0`` take the task's values.

        Raises:
            ValueError: a bad value (by :class:`FedHPDConfig` and the classes above).
        """
        task = str(values["task"])
        chosen = str(values.get("agents", "")).strip()
        agents = None
        if chosen:
            agents = tuple(AGENTS[task][int(k)] for k in chosen.split(","))
        config = FedHPDConfig(
            task=task,
            d=int(values["d"]),
            rounds=int(values["rounds"]),
            agent_specs=agents,
            distill_loops=int(values["distill-loops"]),
            part_size=int(values["part-size"]),
            public_size=int(values["public-size"]) or None,
            virtual_rounds=int(values["virtual-rounds"]) or None,
        )
        run = FedHPDFlowerRun(
            config,
            seed=int(values["seed"]),
            min_nodes=int(values["min-nodes"]),
            output_dir=str(values.get("output-dir", "")),
            timeout=float(values["timeout"]),
            rejoin_window=int(values.get("rejoin-window", 0)),
            checkpoint_dir=str(values.get("checkpoint-dir", "")),
            checkpoint_key_file=str(values.get("checkpoint-key-file", "")),
            merge_share_mask=_flag(values, "secagg-merge"),
            advertise_ahead=_flag(values, "secagg-advertise-ahead"),
        )
        transport = str(values["transport"])
        secagg = None
        if transport == "secagg":
            secagg = SecAggConfig(
                bits=int(values["secagg-bits"]),
                scale=float(values["secagg-scale"]),
                clip=float(values["secagg-clip"]),
                server=str(values["secagg-server"]),
            )
        return cls(run, transport, secagg)


def _flag(values: Mapping[str, object], key: str) -> bool:
    """A boolean run-config key (absent: ``False``); anything but ``true``/``false`` is refused."""
    value = values.get(key, False)
    if not isinstance(value, bool):
        raise ValueError(f"{key} must be true or false, got {value!r}")
    return value


def app_server_setup(context: Context) -> ServerSetup:
    """The ServerApp's setup from the run config (what ``securefed_fedhpd_app.app:server``
    runs)."""
    app = FedHPDApp.from_run_config(context.run_config)
    return server_setup(app.run, app.make_transport())


def app_client_setup(context: Context) -> ClientSetup:
    """The ClientApp's setup from the run config and the node's partition."""
    return client_setup(FedHPDApp.from_run_config(context.run_config).run, context)


def write_fedhpd_app(dest: str | Path, run_config: Mapping[str, object] | None = None) -> Path:
    """Copy the FedHPD app to ``dest`` with ``run_config`` in its ``[tool.flwr.app.config]``."""
    from securefed.flower.loopback import write_app

    return write_app(APP_DIR, dest, run_config)


def node_results(out_dir: str | Path, nodes: int, n_agents: int) -> tuple[np.ndarray, list]:
    """Join the nodes' ``node-<partition>.npz``: returns ``(rounds, agents)`` and parameters."""
    returns, params = None, [None] * n_agents
    for partition in range(nodes):
        saved = np.load(Path(out_dir) / f"node-{partition}.npz")
        if returns is None:
            returns = np.full((saved["returns"].shape[0], n_agents), np.nan)
        for j, k in enumerate(saved["agents"].tolist()):
            returns[:, k] = saved["returns"][:, j]
            params[k] = saved[f"param{k}"]
    return returns, params


__all__ = [
    "APP_DIR",
    "TRANSPORTS",
    "FedHPDApp",
    "FedHPDApps",
    "FedHPDFlowerRun",
    "FedHPDNode",
    "FedHPDOutcome",
    "FedHPDServer",
    "Schedule",
    "agent_state",
    "app_client_setup",
    "app_server_setup",
    "build_apps",
    "client_setup",
    "load_agent_state",
    "node_results",
    "server_setup",
    "write_fedhpd_app",
]
