"""Environments of the RL recommenders (the multi-platform choc-vs-kale simulator)."""

from securefed.rl.envs.choc_kale import (
    ChocKaleBatch,
    ChocKaleConfig,
    ChocKaleEnv,
    EnvStreams,
    PlatformObservation,
    StepOutcome,
    choice_probabilities,
    distinct_mask,
    expected_engagement,
)

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
