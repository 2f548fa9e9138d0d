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
