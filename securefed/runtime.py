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

import io
import itertools
import json
import os
import shutil
import sys
import zipfile
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

from securefed.errors import (
    AlgorithmContractError,
    CheckpointError,
    PrivacyBudgetExceeded,
    UnsupportedTransport,
    ViewFormatError,
)
from securefed.integrity import (
    check_key,
    derive_key,
    open_bytes,
    open_secret,
    read_json,
    seal_bytes,
    seal_secret,
    verify,
    write_sealed_json,
)
from securefed.randomness import SeedTree
from securefed.transport.base import Transport
from securefed.transport.capabilities import (
    TransportNeeds,
    require_capabilities,
    round_size_findings,
)
from securefed.views import ARRAYS_FILE, MANIFEST_FILE, ServerView

if TYPE_CHECKING:
    from securefed.privacy.ledger import PrivacyLedger

CHECKPOINT_FORMAT = "securefed.checkpoint"
CHECKPOINT_VERSION = 3


@dataclass(frozen=True)
class ClientSampling:
    """How clients are picked each round.

    Attributes:
        mode: ``"all"`` (every client every round), ``"poisson"`` (each client independently with
            probability ``clients_per_round / n_clients``: the sampling that DP accountants such as
            Opacus's RDP and PRV assume), ``"fixed"`` (exactly ``clients_per_round`` without
            replacement), or ``"cyclic"`` (a public schedule of ``groups`` groups: round ``r``
            takes the clients ``c`` with ``c % groups == r % groups``; deterministic, so it gives
            no amplification by sampling: the correlated-noise transports account for it,
            :mod:`securefed.privacy.correlated`).
        clients_per_round: exact (fixed) or expected (poisson) number of clients per round.
        groups: the groups of ``"cyclic"`` (>= 1; only there).
    """

    mode: Literal["all", "poisson", "fixed", "cyclic"] = "all"
    clients_per_round: int | None = None
    groups: int | None = None

    def __post_init__(self) -> None:
        if self.mode not in ("all", "poisson", "fixed", "cyclic"):
            raise ValueError(
                f"sampling mode must be all, poisson, fixed or cyclic, got {self.mode!r}"
            )
        if self.mode == "cyclic":
            if self.groups is None or isinstance(self.groups, bool) or self.groups < 1:
                raise ValueError(f"cyclic sampling needs groups >= 1, got {self.groups!r}")
            if self.clients_per_round is not None:
                raise ValueError("cyclic sampling takes groups, not clients_per_round")
            return
        if self.groups is not None:
            raise ValueError(f"groups={self.groups!r} belongs to cyclic sampling, not {self.mode}")
        if self.mode != "all" and (self.clients_per_round is None or self.clients_per_round < 1):
            raise ValueError(f"{self.mode} sampling needs clients_per_round >= 1")

    def rate(self, n_clients: int) -> float:
        """The sampling rate q (expected fraction of clients per round)."""
        if self.mode == "all":
            return 1.0
        if self.mode == "cyclic":
            return min(1.0, 1.0 / self.groups)
        return min(1.0, self.clients_per_round / n_clients)

    def sample(
        self, n_clients: int, rng: np.random.Generator, *, round_id: int | None = None
    ) -> np.ndarray:
        """Sorted ids of the clients taking part in a round (may be empty under Poisson).

        Raises:
            ValueError: cyclic sampling without ``round_id``.
        """
        if self.mode == "cyclic":
            if round_id is None:
                raise ValueError("cyclic sampling needs the round id")
            return np.arange(int(round_id) % self.groups, n_clients, self.groups, dtype=np.int64)
        if self.mode == "all" or (self.mode == "fixed" and self.clients_per_round >= n_clients):
            return np.arange(n_clients, dtype=np.int64)
        if self.mode == "fixed":
            return np.sort(rng.choice(n_clients, self.clients_per_round, replace=False)).astype(
                np.int64
            )
        return np.flatnonzero(rng.random(n_clients) < self.rate(n_clients)).astype(np.int64)


class FederatedAlgorithm(Protocol):
    """What :func:`run_rounds` needs from an algorithm (checked by :func:`check_algorithm`).

    Members:
        n_clients: how many clients there are (an ``int >= 1``); client ids are
            ``0 .. n_clients - 1`` and the sampling draws from them.
        run_round: one round with the sampled clients (below).
        state_dict, load_state_dict: everything needed to continue training, for checkpoints.
        transport_needs: optional, a :class:`~securefed.transport.capabilities.TransportNeeds`
            stating what the algorithm's configuration needs from the transport; without one it
            needs aggregation rounds only.
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
        checkpoint_key: optional key (at least 16 bytes) from which the checkpoints' keys
            derive: the HMAC digests (else SHA-256, which detects corruption but not a
            deliberate edit) and the AES-256-GCM sealing of the algorithm's client-private
            state and of a secure run's root entropy (:class:`Checkpoints`).
        on_budget_exhausted: what a round refused for its privacy budget does: ``"stop"`` ends
            the run there and returns the history of the rounds done, with
            :attr:`RunHistory.stop_reason` saying why; ``"raise"`` lets
            :class:`~securefed.errors.PrivacyBudgetExceeded` propagate (the history is lost).
        blas_threads: the BLAS threads (OpenBLAS, MKL: what numpy and scipy call) while the
            rounds run, set with threadpoolctl and restored afterwards; ``None`` leaves the
            process's setting. 1 by default: a round is many small matrix products per client
            group, for which a BLAS thread pool costs more in hand-offs than it gains (on the
            2-core dev box a FedMF run on ML-100K u1 took 2.3x to 3.5x as long with OpenBLAS's
            default of one thread per core, benchmarks/results/blas_threads/).
    """

    rounds: int
    sampling: ClientSampling = field(default_factory=ClientSampling)
    checkpoint_dir: str | os.PathLike | None = None
    checkpoint_every: int = 10
    resume: bool = True
    progress: bool | None = None
    fingerprint: Mapping[str, object] = field(default_factory=dict)
    first_round: int = 0
    checkpoint_key: bytes | None = field(default=None, repr=False)
    on_budget_exhausted: Literal["stop", "raise"] = "stop"
    blas_threads: int | None = 1

    def __post_init__(self) -> None:
        check_key(self.checkpoint_key)
        check_blas_threads(self.blas_threads)
        if self.on_budget_exhausted not in BUDGET_EXHAUSTED_ACTIONS:
            raise ValueError(
                f"on_budget_exhausted must be one of {BUDGET_EXHAUSTED_ACTIONS}, got "
                f"{self.on_budget_exhausted!r}"
            )
        if self.rounds < 1:
            raise ValueError(
                f"rounds must be >= 1 (a run of no round trains nothing), got {self.rounds}"
            )
        if not 0 <= self.first_round <= self.rounds:
            raise ValueError(f"first_round must lie in [0, rounds], got {self.first_round}")
        if self.checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be >= 1, got {self.checkpoint_every}")


BUDGET_EXHAUSTED_ACTIONS = ("stop", "raise")


def check_blas_threads(threads: int | None) -> None:
    """Refuse a BLAS thread count that is neither ``None`` nor an integer >= 1.

    Raises:
        ValueError: naming the value.
    """
    if threads is None:
        return
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(
            f"blas_threads must be None (the process's setting) or an integer >= 1, got {threads!r}"
        )


def blas_thread_limit(threads: int | None) -> threadpool_limits:
    """A context that runs its body with ``threads`` BLAS threads, restoring them after.

    ``None`` changes nothing (threadpoolctl's ``limits=None``).

    Raises:
        ValueError: an invalid count (:func:`check_blas_threads`).
    """
    check_blas_threads(threads)
    return threadpool_limits(limits=threads, user_api="blas")


def blas_threads_in_use() -> list[dict[str, object]]:
    """The BLAS libraries loaded in this process and their thread counts, as threadpoolctl
    reports them (``[{"internal_api": "openblas", "num_threads": 2, ...}]``)."""
    return [
        {key: info[key] for key in ("internal_api", "prefix", "num_threads", "version")}
        for info in threadpool_info()
        if info.get("user_api") == "blas"
    ]


@dataclass
class RunHistory:
    """Per-round metrics of a run (restored with the checkpoint).

    Attributes:
        rounds: one dict of metrics per completed round.
        resumed_from: the round the run started from (a checkpoint's next round, else 0 or
            ``first_round``).
        stop_reason: ``None`` when every round ran; otherwise why the run ended early (the
            budget refusal's message, ``RunOptions(on_budget_exhausted="stop")``).
        stopped_at: the round that was refused (``None`` when every round ran). Its aggregate
            was not released and the server model is the one after round ``stopped_at - 1``;
            client-side work done before the refusal is not rolled back.
    """

    rounds: list[dict[str, float]] = field(default_factory=list)
    resumed_from: int = 0
    stop_reason: str | None = None
    stopped_at: int | None = None

    @property
    def completed(self) -> bool:
        """Whether the run did every round it was asked to."""
        return self.stop_reason is None

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
    algorithm, which derives every other draw from streams addressed by ``r``. Checkpoints hold
    the privacy ledgers the transport charges (:meth:`Transport.privacy_ledgers`), and a resume
    restores them (:meth:`Checkpoints.restore`), so epsilon and the budget continue where the
    checkpoint left them.

    Returns:
        The per-round metrics; ``transport.view`` holds what the server saw.

    A round refused for its privacy budget (:class:`~securefed.errors.PrivacyBudgetExceeded`)
    ends the run there: the history of the rounds done is returned with its ``stop_reason`` and
    ``stopped_at`` (``options.on_budget_exhausted="raise"``: the exception propagates instead).
    No checkpoint is written for the refused round.

    Raises:
        AlgorithmContractError: before any round, when ``algorithm`` lacks a member of
            :class:`FederatedAlgorithm` (naming each).
        UnsupportedTransport: before any round, when ``transport`` cannot serve what the
            algorithm needs (naming the option that needs it), or when the data or the sampling
            gives rounds of fewer clients than the transport needs (secure aggregation: 2).
        PrivacyBudgetExceeded: a refused round under ``on_budget_exhausted="raise"``.
    """
    with blas_thread_limit(options.blas_threads):  # restored on return and on any exception
        return _run_rounds(algorithm, transport, seeds, options, on_round)


def _run_rounds(
    algorithm: FederatedAlgorithm,
    transport: Transport,
    seeds: SeedTree,
    options: RunOptions,
    on_round: Callable[[int, Mapping[str, float]], None] | None,
) -> RunHistory:
    """:func:`run_rounds` under its BLAS thread limit."""
    check_algorithm(algorithm)
    require_capabilities(transport, loop_needs(algorithm))
    _require_round_sizes(transport, algorithm.n_clients, options.sampling)
    if options.checkpoint_dir and seeds.seed is None and options.checkpoint_key is None:
        raise ValueError(
            "an unseeded (secure-mode) run keeps its root entropy secret, and its checkpoints "
            "store it only encrypted: give RunOptions(checkpoint_key=...) (at least 16 bytes, "
            "kept apart from the checkpoints; on the command line --checkpoint-key-file), or "
            "no checkpoint_dir"
        )
    transport.view.public["seeds"] = seeds.describe()
    transport.view.public["randomness"] = seeds.randomness
    history = RunHistory()
    start = options.first_round
    ledgers = transport.privacy_ledgers()
    rate = options.sampling.rate(algorithm.n_clients)
    for ledger in ledgers:  # the runtime says how it picks clients, whoever built the ledger
        ledger.record_sampling(options.sampling, rate=rate)
    checkpoints = (
        Checkpoints(options.checkpoint_dir, key=options.checkpoint_key)
        if options.checkpoint_dir
        else None
    )
    if checkpoints and options.resume and checkpoints.exists():
        start, history = checkpoints.restore(
            algorithm, transport.view, seeds, options.fingerprint, ledgers=ledgers
        )
    progress = _progress_bar(options, start)
    try:
        for round_id in range(start, options.rounds):
            clients = options.sampling.sample(
                algorithm.n_clients, seeds.generator("sampling", round_id), round_id=round_id
            )
            try:
                metrics = dict(algorithm.run_round(round_id, clients, transport, seeds))
            except PrivacyBudgetExceeded as error:
                if options.on_budget_exhausted == "raise":
                    raise
                history.stop_reason = f"privacy budget exhausted at round {round_id}: {error}"
                history.stopped_at = round_id
                break
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
                    done,
                    algorithm,
                    transport.view,
                    seeds,
                    options.fingerprint,
                    history,
                    ledgers=ledgers,
                )
    finally:
        if progress is not None:
            progress.close()
    return history


def _require_round_sizes(transport: Transport, n_clients: int, sampling: ClientSampling) -> None:
    """Refuse, before any round, data or sampling that gives rounds too small for ``transport``."""
    findings = round_size_findings(
        transport.name,
        transport.capabilities,
        n_clients,
        sampling.mode,
        sampling.clients_per_round,
    )
    if findings:
        raise UnsupportedTransport("; ".join(findings))


_CONTRACT_METHODS = ("run_round", "state_dict", "load_state_dict")


def check_algorithm(algorithm: object) -> None:
    """Refuse an object that does not meet the :class:`FederatedAlgorithm` contract.

    Raises:
        AlgorithmContractError: naming every missing or malformed member (``n_clients`` must be
            an ``int >= 1``; ``run_round``, ``state_dict``, ``load_state_dict`` callables;
            ``transport_needs``, if present, a ``TransportNeeds``).
    """
    kind = type(algorithm).__name__
    problems = []
    n_clients = getattr(algorithm, "n_clients", None)
    if n_clients is None:
        problems.append("an 'n_clients' attribute (how many clients; ids 0 .. n_clients - 1)")
    elif isinstance(n_clients, bool) or not isinstance(n_clients, (int, np.integer)):
        problems.append(f"'n_clients' as an int, not {type(n_clients).__name__}")
    elif n_clients < 1:
        problems.append(f"'n_clients' >= 1, not {n_clients}")
    for name in _CONTRACT_METHODS:
        if not callable(getattr(algorithm, name, None)):
            problems.append(f"a '{name}' method")
    needs = getattr(algorithm, "transport_needs", None)
    if needs is not None and not isinstance(needs, TransportNeeds):
        problems.append(f"'transport_needs' as a TransportNeeds, not {type(needs).__name__}")
    if problems:
        raise AlgorithmContractError(
            f"{kind} is not a FederatedAlgorithm: it needs " + "; ".join(problems) + " (see "
            "securefed.runtime.FederatedAlgorithm and docs/byom.md)"
        )


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
    """Atomic checkpoints in a directory.

    ``latest/`` holds ``checkpoint.json`` (the next round, the seeds, the fingerprint, the
    per-round history and the state of every privacy ledger the transport charges), the
    algorithm's arrays and the ServerView so far (``view/``). A new checkpoint is written beside
    it (``staging-N/``) and swapped in, so an interruption never leaves a half-written one: if it
    strikes mid-swap, ``previous/`` still holds the last complete checkpoint and is restored.

    The algorithm's arrays hold client secrets (FedMF: every user's vector ``U``; FedRec: the
    pseudo-item sets, derived from the root entropy). With ``key`` they are written sealed,
    ``state.npz.sealed`` (AES-256-GCM of the ``.npz`` bytes), and a secure run's root entropy is
    sealed in ``checkpoint.json``; without a key (allowed for seeded runs only, which are not
    private) they are ``state.npz`` in the clear. The key is separated by purpose
    (:func:`~securefed.integrity.derive_key`): one derived key seals the entropy, another the
    state, a third makes the HMAC digests of ``checkpoint.json`` and of the view.

    Every file carries a digest (:mod:`securefed.integrity`): ``checkpoint.json`` covers its own
    content and the bytes of the state file and of the view's two files, and the view is sealed
    as any saved view. With ``key`` the digests are HMAC-SHA256 (under the view-MAC key).

    Args:
        directory: where checkpoints live.
        key: optional key (at least 16 bytes) from which the sealing and MAC keys derive; the
            same key must be given to resume.
    """

    def __init__(self, directory: str | os.PathLike, *, key: bytes | None = None) -> None:
        self.directory = Path(directory)
        self._key = check_key(key)
        keyed = self._key is not None
        self._mac_key = derive_key(self._key, "view-mac") if keyed else None
        self._state_key = derive_key(self._key, "client-state") if keyed else None
        self._entropy_key = derive_key(self._key, "entropy") if keyed else None

    @property
    def state_file(self) -> str:
        """The algorithm's arrays: sealed with a key, in the clear without."""
        return STATE_FILE if self._key is None else SEALED_STATE_FILE

    def _digest_files(self) -> tuple[str, ...]:
        return (self.state_file, f"{VIEW_DIR}/{MANIFEST_FILE}", f"{VIEW_DIR}/{ARRAYS_FILE}")

    @property
    def latest(self) -> Path:
        return self.directory / "latest"

    @property
    def previous(self) -> Path:
        return self.directory / "previous"

    def exists(self) -> bool:
        """Whether there is a checkpoint to resume (complete or not: restore checks)."""
        return self.latest.exists() or self.previous.exists()

    def save(
        self,
        next_round: int,
        algorithm: FederatedAlgorithm,
        view: ServerView,
        seeds: SeedTree,
        fingerprint: Mapping[str, object],
        history: RunHistory,
        *,
        ledgers: Sequence[PrivacyLedger] = (),
    ) -> Path:
        """Write a checkpoint after round ``next_round - 1``, ledgers included, and swap it in."""
        self.directory.mkdir(parents=True, exist_ok=True)
        staging = self.directory / f"staging-{next_round}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        state = {k: np.asarray(v) for k, v in algorithm.state_dict().items()}
        if self._state_key is None:
            np.savez(staging / STATE_FILE, **state)
        else:
            buffer = io.BytesIO()
            np.savez(buffer, **state)
            sealed = seal_bytes(self._state_key, buffer.getvalue(), STATE_CONTEXT)
            (staging / SEALED_STATE_FILE).write_bytes(sealed)
        view.save(staging / VIEW_DIR, key=self._mac_key)
        meta = {
            "format": CHECKPOINT_FORMAT,
            "version": CHECKPOINT_VERSION,
            "next_round": next_round,
            "seeds": self._seeds_record(seeds),
            "fingerprint": _jsonable(fingerprint),
            "history": history.rounds,
            "ledgers": [ledger.state_dict() for ledger in ledgers],
        }
        write_sealed_json(staging / CHECKPOINT_FILE, meta, self._digest_files(), key=self._mac_key)
        # At every instant latest/ or previous/ holds a complete checkpoint.
        if self.latest.exists():
            shutil.rmtree(self.previous, ignore_errors=True)
            os.replace(self.latest, self.previous)
        os.replace(staging, self.latest)
        shutil.rmtree(self.previous, ignore_errors=True)
        return self.latest

    def restore(
        self,
        algorithm: FederatedAlgorithm,
        view: ServerView,
        seeds: SeedTree,
        fingerprint: Mapping[str, object],
        *,
        ledgers: Sequence[PrivacyLedger] = (),
    ) -> tuple[int, RunHistory]:
        """Load the latest checkpoint into ``algorithm``, ``view`` and ``ledgers``.

        Everything is read and checked before anything is changed. The ledgers must be the ones
        the checkpoint holds, one for one: each fresh (then the checkpoint's history is loaded
        into it) or already holding exactly that history, with the same accountant and budget.

        Returns:
            ``(next round, history)``.

        Raises:
            CheckpointError: naming the file and the cause: a missing, corrupt or modified file
                (digests), another format or version, another configuration or seed, a
                checkpoint that holds no privacy ledger where the transport charges one (or the
                reverse), or a ledger that differs from the checkpoint's.
        """
        source = self.latest if self.latest.exists() else self.previous
        path = source / CHECKPOINT_FILE
        meta = read_json(path, CheckpointError)
        if meta.get("format") != CHECKPOINT_FORMAT or meta.get("version") != CHECKPOINT_VERSION:
            raise CheckpointError(
                f"{path}: not a securefed checkpoint of version {CHECKPOINT_VERSION} (format "
                f"{meta.get('format')!r}, version {meta.get('version')!r}; version 1 checkpoints "
                "carry no digest and no privacy ledger, version 2 ones hold the client state "
                "in the clear and one key for every purpose)"
            )
        verify(meta, path, self._digest_files(), key=self._mac_key, error=CheckpointError)
        next_round, rounds = _check_meta(meta, path)
        if meta["fingerprint"] != _jsonable(fingerprint):
            changed = sorted(
                k
                for k in set(meta["fingerprint"]) | set(_jsonable(fingerprint))
                if meta["fingerprint"].get(k) != _jsonable(fingerprint).get(k)
            )
            raise CheckpointError(
                f"{source} was written by a different configuration (differs in {changed}); "
                "use another checkpoint directory or resume=False"
            )
        entropy = self._saved_entropy(meta["seeds"], seeds, source)
        _check_ledgers(meta["ledgers"], ledgers, path)
        state = self._read_state(source)
        try:
            saved_view = ServerView.load(source / VIEW_DIR, key=self._mac_key)
        except ViewFormatError as error:
            raise CheckpointError(f"{source}: its server view is unusable: {error}") from error
        late = [r.round_id for r in saved_view.rounds if r.round_id >= next_round]
        if late:
            raise CheckpointError(
                f"{source / VIEW_DIR}: holds round(s) {late[:5]} at or after the checkpoint's "
                f"next round {next_round} ({path})"
            )
        try:
            algorithm.load_state_dict(state)
        except (KeyError, ValueError) as error:
            raise CheckpointError(
                f"{source / self.state_file}: does not fit the algorithm ({error})"
            ) from error
        view.rounds = saved_view.rounds
        view.public.update(saved_view.public)
        for ledger, saved in zip(ledgers, meta["ledgers"], strict=True):
            ledger.load_state_dict(saved)
        if entropy is not None:
            seeds.resume_from(entropy)
        return next_round, RunHistory(rounds, next_round)

    def _read_state(self, source: Path) -> dict[str, np.ndarray]:
        """The algorithm's arrays of the checkpoint in ``source`` (opened, with a key)."""
        path = source / self.state_file
        if self._state_key is None:
            return _read_state(path)
        if not path.is_file():
            raise CheckpointError(f"{path} is missing")
        opened = open_bytes(
            self._state_key, path.read_bytes(), STATE_CONTEXT, error=CheckpointError
        )
        return _read_state(io.BytesIO(opened), path)

    # The root entropy of an unseeded run, as the checkpoint stores it (encrypted).
    ENTROPY_CONTEXT = "root entropy of a securefed run"

    def _seeds_record(self, seeds: SeedTree) -> dict[str, object]:
        """How the run's randomness is stored: a seeded run's entropy is its (public) seed; an
        unseeded run's is secret and stored only encrypted under the checkpoint key."""
        if seeds.seed is not None:
            return seeds.describe() | {"entropy": str(seeds.entropy)}
        if self._key is None:
            raise CheckpointError(
                f"{self.directory}: an unseeded run's root entropy is secret and is stored only "
                "encrypted; these checkpoints have no key (Checkpoints(..., key=...))"
            )
        sealed = seal_secret(self._entropy_key, str(seeds.entropy).encode(), self.ENTROPY_CONTEXT)
        return seeds.describe() | {"entropy_sealed": sealed}

    def _saved_entropy(
        self, saved: Mapping[str, object], seeds: SeedTree, source: Path
    ) -> int | None:
        """Check the checkpoint's randomness against ``seeds``; an unseeded run's entropy.

        Raises:
            CheckpointError: another seed, another mode, or sealed entropy that does not open.
        """
        if not isinstance(saved, Mapping):
            raise CheckpointError(f"{source}: 'seeds' is not an object")
        if saved.get("seed") != seeds.seed or bool(saved.get("secure")) != seeds.secure:
            raise CheckpointError(
                f"{source} was written with {saved.get('randomness', 'other randomness')} "
                f"(seed {saved.get('seed')!r}), this run has {seeds.randomness} "
                f"(seed {seeds.seed!r})"
            )
        if seeds.seed is not None:
            if saved.get("entropy") != str(seeds.entropy):
                raise CheckpointError(f"{source} was written with a different seed")
            return None
        if "entropy" in saved or not isinstance(saved.get("entropy_sealed"), str):
            raise CheckpointError(
                f"{source}: an unseeded run's checkpoint must hold its entropy sealed, not in "
                "the clear"
            )
        if self._key is None:
            raise CheckpointError(
                f"{source}: the run's entropy is sealed; resume with the checkpoint key"
            )
        token = saved["entropy_sealed"]
        opened = open_secret(self._entropy_key, token, self.ENTROPY_CONTEXT, error=CheckpointError)
        try:
            return int(opened.decode())
        except ValueError as error:
            raise CheckpointError(f"{source}: the sealed entropy is not a number") from error


CHECKPOINT_FILE = "checkpoint.json"
STATE_FILE = "state.npz"
SEALED_STATE_FILE = "state.npz.sealed"
STATE_CONTEXT = "client-private state of a securefed checkpoint"
VIEW_DIR = "view"
_META_KEYS = frozenset(
    {"format", "version", "next_round", "seeds", "fingerprint", "history", "ledgers", "digest"}
)


def _check_meta(meta: Mapping[str, object], path: Path) -> tuple[int, list[dict[str, float]]]:
    """The next round and the history of a checkpoint.json, every field checked."""
    missing, unknown = sorted(_META_KEYS - set(meta)), sorted(set(meta) - _META_KEYS)
    if missing or unknown:
        raise CheckpointError(f"{path}: missing fields {missing}, unknown fields {unknown}")
    next_round = meta["next_round"]
    if isinstance(next_round, bool) or not isinstance(next_round, int) or next_round < 0:
        raise CheckpointError(f"{path}: next_round must be an integer >= 0, got {next_round!r}")
    if not isinstance(meta["seeds"], dict) or not isinstance(meta["fingerprint"], dict):
        raise CheckpointError(f"{path}: seeds and fingerprint must be JSON objects")
    rounds = meta["history"]
    if not isinstance(rounds, list) or not all(isinstance(r, dict) for r in rounds):
        raise CheckpointError(f"{path}: history must be a list of per-round metrics")
    ids = [r.get("round") for r in rounds]
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids) or any(
        b <= a for a, b in itertools.pairwise(ids)
    ):
        raise CheckpointError(f"{path}: history rounds must be increasing round ids, got {ids}")
    if ids and ids[-1] >= next_round:
        raise CheckpointError(f"{path}: history holds round {ids[-1]} >= next_round {next_round}")
    if not isinstance(meta["ledgers"], list):
        raise CheckpointError(f"{path}: ledgers must be a list of privacy ledger states")
    return next_round, list(rounds)


def _check_ledgers(saved: list[object], ledgers: Sequence[PrivacyLedger], path: Path) -> None:
    """Refuse to resume unless every ledger can continue from the checkpoint's."""
    if len(saved) != len(ledgers):
        if not saved:
            raise CheckpointError(
                f"{path} holds no privacy ledger, but the transport charges {len(ledgers)}: it "
                "was written by a run without DP; resuming would restart the accounting from "
                "zero (use another checkpoint directory, or resume=False)"
            )
        if not ledgers:
            raise CheckpointError(
                f"{path} holds {len(saved)} privacy ledger(s), but the transport charges none: "
                "it was written by a DP run, whose releases this run would not account for"
            )
        raise CheckpointError(
            f"{path} holds {len(saved)} privacy ledger(s), the transport charges {len(ledgers)}"
        )
    for position, (ledger, state) in enumerate(zip(ledgers, saved, strict=True)):
        try:
            causes = ledger.resume_conflicts(state)
        except ValueError as error:
            raise CheckpointError(
                f"{path}: privacy ledger {position} is malformed ({error})"
            ) from error
        if causes:
            raise CheckpointError(
                f"{path}: privacy ledger {position} differs from the transport's: "
                + "; ".join(causes)
            )


def _read_state(path: Path | io.BytesIO, name: Path | None = None) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` file (or its opened bytes); errors name ``name`` or ``path``."""
    try:
        with np.load(path, allow_pickle=False) as state:
            return {k: state[k] for k in state.files}
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as error:
        where = path if name is None else name
        raise CheckpointError(f"{where}: unreadable ({type(error).__name__}: {error})") from error


def _jsonable(value: object) -> object:
    """Round-trip a fingerprint through JSON so that tuples and lists compare equal."""
    return json.loads(json.dumps(value, default=str))
