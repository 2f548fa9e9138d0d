"""Episode-boundary checkpoints for the RL training loops (SlateQ, FedSlate).

A 5000-episode FedSlate run on the (500, 10) setting takes the better part of two hours on one
core; an interruption must not cost it. The loops save their whole mutable state at the end of
every ``every``-th episode and, given an existing checkpoint of the same configuration, resume
from it. Between episodes the simulator holds nothing but its random streams (``reset`` draws
new users and candidates), so the state is: the networks and their optimisers, the replay
buffer, every random generator, the rewards so far, the loop's counters and (FedSlate) the
fusion channel's view of what the server saw (:class:`FusionViewState`). A resumed run is the
uninterrupted run, number for number (tests/test_fedslate.py).

Format: one ``torch.save`` file of tensors, numbers and strings only (loaded with
``weights_only=True``: no pickled code runs on load), written beside the old one and swapped in
with ``os.replace``, so an interruption while saving leaves the previous checkpoint intact.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from securefed import CheckpointError
from securefed.views import FusionView

__all__ = ["EpisodeCheckpoints", "FusionViewState", "TrainingState"]

CHECKPOINT_FORMAT = "securefed-rl-episodes"
CHECKPOINT_VERSION = 1


class Stateful(Protocol):
    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> object: ...


@dataclass(frozen=True)
class EpisodeCheckpoints:
    """Where and how often a training loop checkpoints.

    Args:
        path: the checkpoint file (its directory is created).
        every: save after every ``every``-th episode (and after the last).
        resume: continue from ``path`` when it exists (``False``: start over, overwriting it).
    """

    path: str | os.PathLike
    every: int = 50
    resume: bool = True

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError(f"every must be >= 1 episode, got {self.every}")

    def due(self, episodes_done: int, episodes: int) -> bool:
        return episodes_done % self.every == 0 or episodes_done == episodes

    def should_resume(self) -> bool:
        return self.resume and Path(self.path).is_file()


class FusionViewState:
    """A :class:`~securefed.views.FusionView` as a checkpoint entry: its manifest as JSON and its
    arrays as tensors, restored into the same view object.

    Args:
        view: the live view (restored in place).
    """

    def __init__(self, view: FusionView) -> None:
        self.view = view

    def state_dict(self) -> dict[str, object]:
        manifest, arrays = self.view.to_arrays()
        return {
            "manifest": json.dumps(manifest),
            "arrays": {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in arrays.items()},
        }

    def load_state_dict(self, state: Mapping[str, object]) -> None:
        """Restore the saved view.

        Raises:
            CheckpointError: the saved view is malformed or of another channel, parties or
                payload selection.
        """
        try:
            arrays = {k: v.numpy() for k, v in state["arrays"].items()}
            saved = FusionView.from_arrays(json.loads(state["manifest"]), arrays, "checkpoint")
            self.view.restore_from(saved)
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise CheckpointError(f"the checkpoint's fusion view: {error}") from error


class TrainingState:
    """The mutable parts of a training loop, by name, saved and restored in place.

    Args:
        stateful: objects with ``state_dict`` / ``load_state_dict`` (networks, optimisers,
            the replay buffer).
        generators: numpy generators (their bit-generator states are saved as JSON).
        arrays: numpy arrays restored in place (e.g. the episode rewards so far).
    """

    def __init__(
        self,
        *,
        stateful: Mapping[str, Stateful],
        generators: Mapping[str, np.random.Generator],
        arrays: Mapping[str, np.ndarray],
    ) -> None:
        self.stateful, self.generators, self.arrays = stateful, generators, arrays

    def save(
        self, path: str | os.PathLike, counters: Mapping[str, object], fingerprint: Mapping
    ) -> Path:
        """Write the state with the loop's ``counters`` (JSON-ready) atomically to ``path``."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "meta": json.dumps(
                {
                    "format": CHECKPOINT_FORMAT,
                    "version": CHECKPOINT_VERSION,
                    "fingerprint": fingerprint,
                    "counters": counters,
                    "generators": {
                        name: g.bit_generator.state for name, g in self.generators.items()
                    },
                },
                default=str,
            ),
            "stateful": {name: obj.state_dict() for name, obj in self.stateful.items()},
            "arrays": {name: torch.from_numpy(a) for name, a in self.arrays.items()},
        }
        staging = path.with_name(path.name + ".staging")
        torch.save(payload, staging)
        os.replace(staging, path)
        return path

    def restore(self, path: str | os.PathLike, fingerprint: Mapping) -> dict[str, object]:
        """Load ``path`` into the registered objects; return the saved counters.

        Raises:
            CheckpointError: unreadable, of another format, or written by another
                configuration (the differing fields are named).
        """
        try:
            payload = torch.load(Path(path), weights_only=True)
            meta = json.loads(payload["meta"])
        except (OSError, RuntimeError, KeyError, json.JSONDecodeError) as error:
            raise CheckpointError(f"{path}: unreadable checkpoint ({error})") from error
        if meta.get("format") != CHECKPOINT_FORMAT or meta.get("version") != CHECKPOINT_VERSION:
            raise CheckpointError(f"{path}: not a {CHECKPOINT_FORMAT} checkpoint of version 1")
        wanted = json.loads(json.dumps(fingerprint, default=str))
        if meta["fingerprint"] != wanted:
            changed = sorted(
                k
                for k in set(meta["fingerprint"]) | set(wanted)
                if meta["fingerprint"].get(k) != wanted.get(k)
            )
            raise CheckpointError(
                f"{path} was written by a different configuration (differs in {changed}); "
                "delete it or checkpoint elsewhere"
            )
        missing = (
            (set(self.stateful) - set(payload["stateful"]))
            | (set(self.generators) - set(meta["generators"]))
            | (set(self.arrays) - set(payload["arrays"]))
        )
        if missing:
            raise CheckpointError(f"{path} lacks {sorted(missing)}")
        for name, obj in self.stateful.items():
            obj.load_state_dict(payload["stateful"][name])
        for name, g in self.generators.items():
            g.bit_generator.state = meta["generators"][name]
        for name, array in self.arrays.items():
            array[...] = payload["arrays"][name].numpy()
        return meta["counters"]
