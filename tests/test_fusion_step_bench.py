"""The fusion-step benchmark's curve comparison and its option checks (no encryption here)."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from securefed.bench import bench_fusion_step
from securefed.bench.bench_fusion_step import curve_agreement


def test_curve_agreement_is_one_for_the_same_curve_and_falls_with_a_shift():
    rng = np.random.default_rng(0)
    rewards = rng.normal(150.0, 20.0, (60, 3, 2))  # [episode][member][platform]
    same = curve_agreement(rewards, rewards.copy(), window=10)
    for platform in ("A", "B"):
        assert same[platform]["fraction_within_one_sd"] == 1.0
        assert same[platform]["max_mean_gap"] == 0.0 and same[platform]["run_mean_gap"] == 0.0
    shifted = rewards.copy()
    shifted[30:, :, 0] += 100.0  # platform A's second half far off
    moved = curve_agreement(rewards, shifted, window=10)
    assert moved["A"]["fraction_within_one_sd"] < 0.5
    assert moved["A"]["max_mean_gap"] == pytest.approx(100.0)
    assert moved["B"]["fraction_within_one_sd"] == 1.0
    assert moved["A"]["ckks_mean"] == pytest.approx(rewards[:, :, 0].mean() + 50.0)


def test_curves_refuse_the_step_only_ckks_options():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    bench_fusion_step.register(sub)
    for option in (["--flooding-bits", "40"], ["--poly-degree", "16384"]):
        args = parser.parse_args(["fusion-step", "--mode", "curves", *option])
        with pytest.raises(ValueError, match="apply to --mode step only"):
            bench_fusion_step.run(args)


def test_the_projection_charges_one_acting_inquiry_per_learning_step_at_its_after_step_cost():
    """The acting inquiry right after a learning step runs on new weights (the packed circuit
    encodes them anew); the projection counts one per learning step at that cost, the other
    rounds at the cost of an inquiry on unchanged weights, and without the measurement every
    round at the latter."""
    from types import SimpleNamespace

    config = SimpleNamespace(steps_per_platform=10, burn_in=4, learn_every=3)
    record = {
        "learning_step": {"cpu_s": 1.0},
        "acting_inquiry": {"cpu_s": 0.1},
        "acting_after_step": {"cpu_s": 0.4},
    }
    out = bench_fusion_step.project(record, 2, config)
    assert out["rounds"] == 20 and out["learning_steps"] == 5
    assert out["acting_s"] == pytest.approx(5 * 0.4 + 15 * 0.1)
    del record["acting_after_step"]
    assert bench_fusion_step.project(record, 2, config)["acting_s"] == pytest.approx(2.0)
