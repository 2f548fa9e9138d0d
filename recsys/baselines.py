"""The global-mean + damped-biases baseline: the floor a recommender must beat on any data set.

Koren 2010 ("Factor in the neighbors", section 2.1): with ``mu`` the global mean,
``b_i = sum_{u in R(i)} (r_ui - mu) / (lambda_i + |R(i)|)`` and then
``b_u = sum_{i in R(u)} (r_ui - mu - b_i) / (lambda_u + |R(u)|)``; the prediction is
``mu + b_u + b_i``, clipped to the scale. The damping terms shrink the biases of users and items
with few ratings towards zero (Koren's values: ``lambda_i = 25``, ``lambda_u = 10``).
Centralised and closed form: a reference, not a federated protocol.

:func:`baseline_rmses` scores the floors on a split and :func:`baselines_beaten` /
:func:`baseline_warning` say whether a model beat them: every ``securefed fedmf`` run prints and
records them beside its own RMSE (a model that does not beat the damped biases has learnt
nothing a closed form would not give).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from securefed.recsys.data import Ratings, RatingScale, Split
from securefed.recsys.metrics import rmse

BASELINE_LABELS = {"global_mean": "global mean", "damped_biases": "damped biases"}
"""How each floor of :func:`baseline_rmses` is named in messages."""


@dataclass(frozen=True)
class DampedBaseline:
    """A fitted ``mu + b_u + b_i`` predictor (see the module docstring)."""

    mean: float
    user_bias: np.ndarray
    item_bias: np.ndarray
    scale: RatingScale

    def predict(self, users: np.ndarray, items: np.ndarray) -> np.ndarray:
        """Predicted ratings, clipped to the rating scale."""
        users, items = np.asarray(users), np.asarray(items)
        return self.scale.clip(self.mean + self.user_bias[users] + self.item_bias[items])


def damped_baseline(
    train: Ratings, *, item_damping: float = 25.0, user_damping: float = 10.0
) -> DampedBaseline:
    """Fit the damped-biases baseline on ``train``.

    Raises:
        ValueError: ``train`` is empty or a damping is negative or not finite.
    """
    if len(train) == 0:
        raise ValueError("the damped-biases baseline needs at least one training rating")
    for name, value in (("item_damping", item_damping), ("user_damping", user_damping)):
        if not (np.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
    mean = float(np.mean(train.ratings))
    residual = train.ratings - mean
    item_sum = np.bincount(train.items, residual, minlength=train.n_items)
    item_count = np.bincount(train.items, minlength=train.n_items)
    item_bias = _damped_mean(item_sum, item_count, item_damping)
    residual = residual - item_bias[train.items]
    user_sum = np.bincount(train.users, residual, minlength=train.n_users)
    user_count = np.bincount(train.users, minlength=train.n_users)
    user_bias = _damped_mean(user_sum, user_count, user_damping)
    return DampedBaseline(mean, user_bias, item_bias, train.scale)


def _damped_mean(total: np.ndarray, count: np.ndarray, damping: float) -> np.ndarray:
    """``total / (damping + count)``, 0 where the divisor is 0 (undamped and unrated)."""
    divisor = damping + count
    return np.divide(total, divisor, out=np.zeros_like(total), where=divisor > 0)


def baseline_rmses(split: Split) -> dict[str, float]:
    """Test RMSE of the floors fitted on ``split.train``: the global mean and the damped biases.

    Returns:
        ``{"global_mean": rmse, "damped_biases": rmse}`` (keys of :data:`BASELINE_LABELS`).

    Raises:
        ValueError: an empty training or test set.
    """
    if len(split.train) == 0:
        raise ValueError("the baselines need at least one training rating")
    test = split.test
    mean = float(np.mean(split.train.ratings))
    global_mean = split.train.scale.clip(np.full(len(test), mean))
    damped = damped_baseline(split.train).predict(test.users, test.items)
    return {
        "global_mean": rmse(global_mean, test.ratings),
        "damped_biases": rmse(damped, test.ratings),
    }


def baselines_beaten(model_rmse: float, baselines: Mapping[str, float]) -> dict[str, bool]:
    """For each floor, whether ``model_rmse`` is strictly below it (a NaN beats nothing)."""
    return {name: bool(model_rmse < value) for name, value in baselines.items()}


def baseline_warning(
    model_rmse: float, baselines: Mapping[str, float], hint: str = ""
) -> str | None:
    """A one-line warning naming every floor ``model_rmse`` does not beat, or ``None``.

    ``hint``, when given, is appended in brackets (the command line names its own options).
    """
    lost = [name for name, beaten in baselines_beaten(model_rmse, baselines).items() if not beaten]
    if not lost:
        return None
    floors = ", ".join(f"{BASELINE_LABELS.get(name, name)} {baselines[name]:.4f}" for name in lost)
    warning = (
        f"warning: the model's test RMSE {model_rmse:.4f} does not beat {floors}: it predicts "
        "no better than a closed-form baseline"
    )
    return f"{warning} ({hint})" if hint else warning
