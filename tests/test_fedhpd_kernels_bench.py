"""``python -m securefed.bench.bench_fedhpd_kernels``: the statistics of its summary, and (slow)
a tiny run of both kernel sets end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("scipy")

from securefed.bench import bench_fedhpd_kernels as bench


def test_the_permutation_test_tells_a_shift_from_noise():
    rng = np.random.default_rng(3)
    a, b = rng.normal(0, 1, 12), rng.normal(0, 1, 12)
    assert bench.permutation_p(a, a.copy(), n=2000) == 1.0
    assert bench.permutation_p(a, b, n=2000) > 0.05
    assert bench.permutation_p(a + 3.0, b, n=2000) < 0.001


def test_the_summary_pairs_seeds_and_settings():
    fast = {
        "rounds": 10,
        "chunks": [
            {"labels": ["NoFed"] * 3, "seeds": [1, 2, 3], "system_average_reward": [10, 20, 30]},
            {"labels": ["NoFed"], "seeds": [4], "system_average_reward": [40]},
        ],
    }
    # The torch process finished one chunk only: seed 4 is left out of the comparison.
    slow = {
        "rounds": 10,
        "chunks": [{"labels": ["NoFed"] * 3, "seeds": [1, 2, 3], "sar": [11, 19, 33]}],
    }
    row = bench.summarise({"fast": fast, "torch": slow})["NoFed"]
    assert row["seeds"] == [1, 2, 3]
    assert row["mean_fast"] == pytest.approx(20.0)
    assert row["mean_torch"] == pytest.approx(21.0)
    assert row["paired_difference_mean"] == pytest.approx(-1.0)
    assert 0 < row["welch_p"] <= 1 and 0 < row["permutation_p"] <= 1


@pytest.mark.slow
def test_a_tiny_run_of_both_kernel_sets(tmp_path, capsys):
    assert (
        bench.main(["--seeds", "1,2", "--rounds", "3", "--chunk", "1", "--out", str(tmp_path)]) == 0
    )
    record = json.loads((tmp_path / "fedhpd_kernels_3rounds.json").read_text())
    row = record["summary"]["NoFed"]
    assert row["seeds"] == [1, 2]
    # Three rounds from the same initial policies: the draws cannot have parted yet.
    assert row["fast"] == row["torch"]
    assert row["paired_t_p"] == row["wilcoxon_p"] == 1.0
    assert "fast" in capsys.readouterr().out
