"""Choosing the number of rounds: a validation part of the training ratings, early stopping.

The rule (docs/fedmf.md, "Choosing rounds and regularisation"): hold out ``fraction`` of every
user's *training* ratings (never the test set), train on the rest, evaluate the validation RMSE
every ``every`` rounds, smooth the curve with a centred moving mean of ``smoothing`` rounds, and
stop once ``patience`` rounds have passed since the best smoothed evaluation at or after
``min_rounds`` (improvements under ``min_delta`` do not count); the best evaluation's round is
the number of rounds to train for on all the training ratings. The minimum and the smoothing
keep an early dip of the curve (the biases fit in a few rounds, before the factors help) from
ending the run: counted in evaluations of every 5 rounds, with neither, one split of a
half-star file stopped at round 5 at 0.8097 where 35 fixed rounds gave 0.8012 (issue 29). The
regularisation is chosen the same way: the value whose best validation RMSE is lowest
(``securefed bench fedmf-vs-centralised`` records the defaults' curve).

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
    """When to stop a validated run (module docstring; :func:`best_round` applies it).

    Attributes:
        patience: rounds (not evaluations) after the best smoothed evaluation without a better
            one before stopping (>= 1).
        every: rounds between two evaluations (>= 1; every round by default: an evaluation is
            one prediction per held-out rating, far cheaper than a round).
        min_delta: an improvement smaller than this does not count (>= 0).
        min_rounds: no round before this one is picked, and the run does not stop before it
            (>= 1): the first rounds fit the biases fast and the curve can dip there before
            the factors start to help (ml-latest-small's curve is flat from round 11 to 17,
            benchmarks/results/cli_defaults/).
        smoothing: width in rounds of the centred moving mean taken of the curve before
            choosing (>= 1; 1: none). Evaluations within ``smoothing // 2`` rounds of one are
            averaged into it (the last ones have fewer neighbours), so one noisy evaluation
            neither picks the round nor stops the run.
    """

    patience: int = 10
    every: int = 1
    min_delta: float = 1e-4
    min_rounds: int = 10
    smoothing: int = 5

    def __post_init__(self) -> None:
        for name in ("patience", "every", "min_rounds", "smoothing"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"early stopping {name} must be an integer >= 1, got {value!r}")
        if not (np.isfinite(self.min_delta) and self.min_delta >= 0):
            raise ValueError(f"early stopping min_delta must be >= 0, got {self.min_delta!r}")

    def evaluates(self, round_id: int) -> bool:
        """Whether the validation RMSE is computed after round ``round_id`` (0-based)."""
        return (round_id + 1) % self.every == 0


def smoothed_curve(curve: list[tuple[int, float]], width: int) -> list[float]:
    """The centred moving mean of ``curve``'s values over ``width`` rounds (see ``smoothing``).

    Raises:
        ValueError: a non-finite RMSE.
    """
    rounds = np.array([r for r, _ in curve], dtype=np.int64)
    values = np.array([v for _, v in curve], dtype=np.float64)
    for r, value in curve:
        if not np.isfinite(value):
            raise ValueError(f"validation RMSE after {r} rounds is {value}")
    half = width // 2
    return [float(values[np.abs(rounds - r) <= half].mean()) for r in rounds]


def best_round(curve: list[tuple[int, float]], stopping: EarlyStopping) -> tuple[int, bool]:
    """The number of rounds the rule picks from a validation curve, and whether it stopped.

    The curve is smoothed (:func:`smoothed_curve`); among the evaluations at or after
    ``min_rounds`` (all of them while none is), the best is the first one lower than every
    earlier one by more than ``min_delta``; the run has stopped once the last evaluation lies
    ``patience`` rounds or more after the best, and at or after ``min_rounds``.

    Args:
        curve: ``(rounds trained, validation RMSE)`` in order of evaluation.
        stopping: the rule.

    Returns:
        ``(rounds, stopped)``: the rounds of the best smoothed evaluation, and whether the
        rule stops there.

    Raises:
        ValueError: an empty curve or a non-finite RMSE.
    """
    if not curve:
        raise ValueError("an empty validation curve picks no round")
    smoothed = smoothed_curve(curve, stopping.smoothing)
    eligible = [k for k, (r, _) in enumerate(curve) if r >= stopping.min_rounds]
    candidates = eligible or list(range(len(curve)))
    best = candidates[0]
    for k in candidates[1:]:
        if smoothed[k] < smoothed[best] - stopping.min_delta:
            best = k
    last_rounds, best_rounds = curve[-1][0], curve[best][0]
    stopped = bool(eligible) and last_rounds - best_rounds >= stopping.patience
    return best_rounds, stopped
