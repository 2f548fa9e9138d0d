"""Choosing the number of rounds: a validation part of the training ratings, early stopping.

The rule (docs/fedmf.md, "Choosing rounds and regularisation"): hold out ``fraction`` of every
user's *training* ratings (never the test set), train on the rest, evaluate the validation RMSE
every ``every`` rounds, and stop once ``patience`` evaluations in a row have not improved the best
by more than ``min_delta``; the best evaluation's round is the number of rounds to train for on
all the training ratings. The regularisation is chosen the same way: the value whose best
validation RMSE is lowest (``securefed bench fedmf-vs-centralised`` records the defaults' curve).

Each user holds out ``round(fraction * n_u)`` of its ratings (halves rounded up) but keeps at
least one for training, so every user still trains; the held-out set is drawn from an explicit
generator. In a deployment each user evaluates its own held-out ratings and the server needs
only the two sums ``(squared error, count)``; this simulation computes them in one process.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from securefed.recsys.data import Ratings, Split


def holdout_split(train: Ratings, fraction: float, rng: np.random.Generator) -> Split:
    """Split ``train`` into a fitting part and a validation part, per user.

    Args:
        train: the training ratings (the test set must stay out of any choice).
        fraction: share of each user's ratings to hold out, in (0, 0.5].
        rng: source of the random choice.

    Returns:
        ``Split(fit, validation)`` in ``train``'s index space.

    Raises:
        ValueError: ``fraction`` outside (0, 0.5], or nothing would be held out.
    """
    if not (np.isfinite(fraction) and 0 < fraction <= 0.5):
        raise ValueError(f"validation fraction must lie in (0, 0.5], got {fraction!r}")
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy Generator, got {type(rng).__name__}")
    order = np.lexsort((rng.random(len(train)), train.users))  # random order within each user
    users = train.users[order]
    counts = np.bincount(users, minlength=train.n_users)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rank = np.arange(len(order)) - starts[users]  # position within the user's shuffled ratings
    n_held = np.minimum(np.floor(fraction * counts + 0.5), np.maximum(counts - 1, 0))
    held = np.zeros(len(train), dtype=bool)
    held[order[rank < n_held[users]]] = True
    if not held.any():
        raise ValueError(
            f"a validation fraction of {fraction} holds out no rating of {train.name or 'train'}"
        )
    return Split(train.subset(~held), train.subset(held), f"{train.name}/validation")


@dataclass(frozen=True)
class EarlyStopping:
    """When to stop a validated run (module docstring).

    Attributes:
        patience: evaluations without improvement before stopping (>= 1).
        every: rounds between two evaluations (>= 1).
        min_delta: an improvement smaller than this does not count (>= 0).
    """

    patience: int = 4
    every: int = 5
    min_delta: float = 1e-4

    def __post_init__(self) -> None:
        for name in ("patience", "every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"early stopping {name} must be an integer >= 1, got {value!r}")
        if not (np.isfinite(self.min_delta) and self.min_delta >= 0):
            raise ValueError(f"early stopping min_delta must be >= 0, got {self.min_delta!r}")

    def evaluates(self, round_id: int) -> bool:
        """Whether the validation RMSE is computed after round ``round_id`` (0-based)."""
        return (round_id + 1) % self.every == 0


def best_round(curve: list[tuple[int, float]], stopping: EarlyStopping) -> tuple[int, bool]:
    """The number of rounds the rule picks from a validation curve, and whether it stopped.

    Args:
        curve: ``(rounds trained, validation RMSE)`` in order of evaluation.
        stopping: the rule.

    Returns:
        ``(rounds, stopped)``: the rounds of the best evaluation (the first of equals), and
        whether ``patience`` evaluations after it failed to improve by ``min_delta``.

    Raises:
        ValueError: an empty curve or a non-finite RMSE.
    """
    if not curve:
        raise ValueError("an empty validation curve picks no round")
    best_rounds, best_rmse, since = curve[0][0], curve[0][1], 0
    for rounds, value in curve:
        if not np.isfinite(value):
            raise ValueError(f"validation RMSE after {rounds} rounds is {value}")
        if value < best_rmse - stopping.min_delta:
            best_rounds, best_rmse, since = rounds, value, 0
        elif rounds != best_rounds:
            since += 1
    return best_rounds, since >= stopping.patience
