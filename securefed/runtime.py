"""The round loop: client sampling, seeds per round, progress, checkpoint and resume.

A federated algorithm implements :class:`FederatedAlgorithm` (one ``run_round`` that opens a
transport round, lets the sampled clients compute and submit, and applies the aggregate, plus a
``state_dict`` for checkpoints). :func:`run_rounds` is the thin template loop around it; its
first step refuses a transport that cannot serve the algorithm's ``transport_needs``
(:mod:`securefed.transport.capabilities`), before any round runs. Since all
randomness of round ``r`` comes from ``seeds`` streams addressed by ``r``, a run resumed from a
checkpoint written after round ``r`` gives bit-identical results to an uninterrupted run.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal, Protocol

import numpy as np

from securefed.errors import CheckpointError
from securefed.randomness import SeedTree
from securefed.transport.base import Transport
from securefed.transport.capabilities import TransportNeeds, require_capabilities
from securefed.views import ServerView

CHECKPOINT_FORMAT = "securefed.checkpoint"
CHECKPOINT_VERSION = 1


@dataclass(frozen=True)
class ClientSampling:
    """How clients are picked each round.

    Attributes:
        mode: ``"all"`` (every client every round), ``"poisson"`` (each client independently with
            probability ``clients_per_round / n_clients``: the sampling that DP accountants such as
            Opacus's RDP and PRV assume), or ``"fixed"`` (exactly ``clients_per_round`` without
            replacement).
        clients_per_round: exact (fixed) or expected (poisson) number of clients per round.
    """

    mode: Literal["all", "poisson", "fixed"] = "all"
    clients_per_round: int | None = None

    def __post_init__(self) -> None:
        if self.mode not in ("all", "poisson", "fixed"):
            raise ValueError(f"sampling mode must be all, poisson or fixed, got {self.mode!r}")
        if self.mode != "all" and (self.clients_per_round is None or self.clients_per_round < 1):
            raise ValueError(f"{self.mode} sampling needs clients_per_round >= 1")

    def rate(self, n_clients: int) -> float:
        """The sampling rate q (expected fraction of clients per round)."""
        if self.mode == "all":
            return 1.0
        return min(1.0, self.clients_per_round / n_clients)

    def sample(self, n_clients: int, rng: np.random.Generator) -> np.ndarray:
        """Sorted ids of the clients taking part in a round (may be empty under Poisson)."""
        if self.mode == "all" or (self.mode == "fixed" and self.clients_per_round >= n_clients):
            return np.arange(n_clients, dtype=np.int64)
        if self.mode == "fixed":
            return np.sort(rng.choice(n_clients, self.clients_per_round, replace=False)).astype(
                np.int64
            )
        return np.flatnonzero(rng.random(n_clients) < self.rate(n_clients)).astype(np.int64)


class FederatedAlgorithm(Protocol):
    """What :func:`run_rounds` needs from an algorithm.

    An algorithm may also state what its configuration needs from the transport as a
    ``transport_needs`` attribute (a :class:`~securefed.transport.capabilities.TransportNeeds`);
    without one it needs aggregation rounds only.
    """

    n_clients: int

    def run_round(
        self, round_id: int, clients: np.ndarray, transport: Transport, seeds: SeedTree
    ) -> Mapping[str, float]:
        """Run one round with ``clients``; return scalar metrics of the round."""

    def state_dict(self) -> dict[str, np.ndarray]:
        """Everything needed to continue training (arrays; scalars as 0-d arrays)."""

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Restore what :meth:`state_dict` returned."""


@dataclass(frozen=True)
class RunOptions:
    """Options of the round loop.

    Attributes:
        rounds: total number of rounds.
        sampling: client sampling per round.
        checkpoint_dir: where to write checkpoints (``None``: no checkpoints).
        checkpoint_every: write a checkpoint every this many rounds (and after the last).
        resume: continue from the checkpoint in ``checkpoint_dir`` if there is one.
        progress: show a progress bar (``None``: only when stderr is a terminal).
        fingerprint: the run's configuration; a checkpoint of a different one is refused.
        first_round: the round to start from when no checkpoint is resumed (a run whose earlier
            rounds went through another transport, e.g. a plaintext warm start).
    """

    rounds: int
    sampling: ClientSampling = field(default_factory=ClientSampling)
    checkpoint_dir: str | os.PathLike | None = None
    checkpoint_every: int = 10
    resume: bool = True
    progress: bool | None = None
    fingerprint: Mapping[str, object] = field(default_factory=dict)
    first_round: int = 0

    def __post_init__(self) -> None:
        if self.rounds < 0:
            raise ValueError(f"rounds must be >= 0, got {self.rounds}")
        if not 0 <= self.first_round <= self.rounds:
            raise ValueError(f"first_round must lie in [0, rounds], got {self.first_round}")
        if self.checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be >= 1, got {self.checkpoint_every}")


@dataclass
class RunHistory:
    """Per-round metrics of a run (restored with the checkpoint)."""

    rounds: list[dict[str, float]] = field(default_factory=list)
    resumed_from: int = 0

    def last(self) -> dict[str, float]:
        return self.rounds[-1] if self.rounds else {}


def run_rounds(
    algorithm: FederatedAlgorithm,
    transport: Transport,
    seeds: SeedTree,
    options: RunOptions,
    *,
    on_round: Callable[[int, Mapping[str, float]], None] | None = None,
) -> RunHistory:
    """Run ``options.rounds`` rounds of ``algorithm`` over ``transport``.

    Round ``r`` samples its clients from the stream ``("sampling", r)`` and hands ``seeds`` to the
    algorithm, which derives every other draw from streams addressed by ``r``.

    Returns:
        The per-round metrics; ``transport.view`` holds what the server saw.

    Raises:
        UnsupportedTransport: before any round, when ``transport`` cannot serve what the
            algorithm needs (naming the option that needs it).
    """
    require_capabilities(transport, loop_needs(algorithm))
    history = RunHistory()
    start = options.first_round
    checkpoints = Checkpoints(options.checkpoint_dir) if options.checkpoint_dir else None
    if checkpoints and options.resume and checkpoints.exists():
        start, history = checkpoints.restore(algorithm, transport.view, seeds, options.fingerprint)
    progress = _progress_bar(options, start)
    try:
        for round_id in range(start, options.rounds):
            clients = options.sampling.sample(
                algorithm.n_clients, seeds.generator("sampling", round_id)
            )
            metrics = dict(algorithm.run_round(round_id, clients, transport, seeds))
            metrics["round"] = round_id
            metrics["clients"] = len(clients)
            history.rounds.append(metrics)
            if on_round is not None:
                on_round(round_id, metrics)
            if progress is not None:
                progress.update(1)
                progress.set_postfix({k: f"{v:.4g}" for k, v in metrics.items() if k != "round"})
            done = round_id + 1
            if checkpoints and (done % options.checkpoint_every == 0 or done == options.rounds):
                checkpoints.save(
                    done, algorithm, transport.view, seeds, options.fingerprint, history
                )
    finally:
        if progress is not None:
            progress.close()
    return history


def loop_needs(algorithm: FederatedAlgorithm) -> TransportNeeds:
    """What :func:`run_rounds` needs of a transport for ``algorithm``: the algorithm's own
    ``transport_needs`` (if it states any), and its clients computing in this process."""
    needs = getattr(algorithm, "transport_needs", None)  # optional member of the protocol
    if needs is None:
        needs = TransportNeeds(type(algorithm).__name__)
    if needs.in_process_clients is None:
        needs = replace(
            needs, in_process_clients="run_rounds (the clients compute in this process)"
        )
    return needs


def _progress_bar(options: RunOptions, start: int):
    show = sys.stderr.isatty() if options.progress is None else options.progress
    if not show:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=options.rounds, initial=start, desc="rounds", unit="round", leave=False)


class Checkpoints:
    """Atomic checkpoints in a directory: ``latest/`` holds ``checkpoint.json``, ``state.npz`` and
    the ServerView so far (``view/``). A new checkpoint is written beside it and swapped in, so an
    interruption never leaves a half-written one.
    """

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)

    @property
    def latest(self) -> Path:
        return self.directory / "latest"

    def exists(self) -> bool:
        return (self.latest / "checkpoint.json").is_file()

    def save(
        self,
        next_round: int,
        algorithm: FederatedAlgorithm,
        view: ServerView,
        seeds: SeedTree,
        fingerprint: Mapping[str, object],
        history: RunHistory,
    ) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        staging = self.directory / f"staging-{next_round}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        state = algorithm.state_dict()
        np.savez(staging / "state.npz", **{k: np.asarray(v) for k, v in state.items()})
        view.save(staging / "view")
        meta = {
            "format": CHECKPOINT_FORMAT,
            "version": CHECKPOINT_VERSION,
            "next_round": next_round,
            "seeds": seeds.describe() | {"entropy": str(seeds.entropy)},
            "fingerprint": _jsonable(fingerprint),
            "history": history.rounds,
        }
        (staging / "checkpoint.json").write_text(json.dumps(meta, indent=1))
        previous = self.directory / "previous"
        shutil.rmtree(previous, ignore_errors=True)
        if self.latest.exists():
            os.replace(self.latest, previous)
        os.replace(staging, self.latest)
        shutil.rmtree(previous, ignore_errors=True)
        return self.latest

    def restore(
        self,
        algorithm: FederatedAlgorithm,
        view: ServerView,
        seeds: SeedTree,
        fingerprint: Mapping[str, object],
    ) -> tuple[int, RunHistory]:
        """Load the latest checkpoint into ``algorithm`` and ``view``; return (next round, history).

        Raises:
            CheckpointError: if it is corrupt or was written by a different configuration or seed.
        """
        try:
            meta = json.loads((self.latest / "checkpoint.json").read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise CheckpointError(f"{self.latest}: unreadable checkpoint ({error})") from error
        if meta.get("format") != CHECKPOINT_FORMAT or meta.get("version") != CHECKPOINT_VERSION:
            raise CheckpointError(f"{self.latest}: not a securefed checkpoint of version 1")
        if meta["fingerprint"] != _jsonable(fingerprint):
            changed = sorted(
                k
                for k in set(meta["fingerprint"]) | set(_jsonable(fingerprint))
                if meta["fingerprint"].get(k) != _jsonable(fingerprint).get(k)
            )
            raise CheckpointError(
                f"{self.latest} was written by a different configuration (differs in {changed}); "
                "use another checkpoint directory or resume=False"
            )
        if meta["seeds"].get("entropy") != str(seeds.entropy):
            raise CheckpointError(f"{self.latest} was written with a different seed")
        with np.load(self.latest / "state.npz", allow_pickle=False) as state:
            algorithm.load_state_dict({k: state[k] for k in state.files})
        saved_view = ServerView.load(self.latest / "view")
        view.rounds = saved_view.rounds
        view.truncate(meta["next_round"])
        return int(meta["next_round"]), RunHistory(list(meta["history"]), int(meta["next_round"]))


def _jsonable(value: object) -> object:
    """Round-trip a fingerprint through JSON so that tuples and lists compare equal."""
    return json.loads(json.dumps(value, default=str))
