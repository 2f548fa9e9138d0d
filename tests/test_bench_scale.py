"""``securefed bench scale`` on a tiny population: its cells, floors and record."""

from __future__ import annotations

import argparse

import pytest

from securefed.bench.bench_scale import ScaleCell, cells_of, merge_cells, run_cell, summarise
from securefed.recsys.data import synthetic_ratings
from securefed.recsys.population import fit_population

MODEL = fit_population(synthetic_ratings(60, 50, 900, seed=4), rank=3, sweeps=3)


def test_cells_refuse_unknown_names():
    with pytest.raises(ValueError, match="transport"):
        ScaleCell(10, "ckks", "on-demand", 1, 5, 4)
    with pytest.raises(ValueError, match="store"):
        ScaleCell(10, "plaintext", "disk", 1, 5, 4)
    with pytest.raises(ValueError, match="target epsilon"):
        ScaleCell(10, "secagg", "on-demand", 1, 5, 4, epsilon=8.0)
    with pytest.raises(ValueError, match="target epsilon"):
        ScaleCell(10, "secagg+dp", "on-demand", 1, 5, 4, epsilon=0.0)


def test_cells_of_the_command_line():
    args = argparse.Namespace(
        users="1e3,1e6",
        secure_users="1e6",
        item_blocks="1,8",
        transports="plaintext,secagg",
        sampled=100,
        dim=4,
        noise_multiplier=1.0,
        epsilon=None,
        seed=0,
        rounds=3,
        secure_rounds=1,
        stored_max=1000,
    )
    cells = [(c.users, c.transport, c.store, c.item_blocks) for c in cells_of(args)]
    assert cells == [
        (1000, "plaintext", "on-demand", 1),
        (1000, "plaintext", "stored", 1),
        (10**6, "plaintext", "on-demand", 1),
        (10**6, "secagg", "on-demand", 1),
        (10**6, "secagg", "on-demand", 8),
    ]


@pytest.mark.parametrize("store", ["on-demand", "stored"])
def test_a_plaintext_cell_reports_against_its_floors(store):
    result = run_cell(ScaleCell(200, "plaintext", store, 2, 20, 4), MODEL)
    row = summarise(result)
    assert [r["clients"] for r in result["rounds_detail"]] == [20, 20]
    assert row["round_cpu_s"] > 0 and row["floor_cpu_s"] > 0
    # Plaintext sends each uploaded row's values and its index: a little above the values.
    assert 1.0 <= row["bytes_over_floor"] < 1.2
    assert row["memory_floor_mb"] > 0


def test_item_blocks_cut_the_masked_bytes_of_a_secure_cell():
    dense = run_cell(ScaleCell(300, "secagg", "on-demand", 1, 20, 4), MODEL)["rounds_detail"][0]
    blocked = run_cell(ScaleCell(300, "secagg", "on-demand", 1, 20, 4, item_blocks=5), MODEL)
    detail = blocked["rounds_detail"][0]
    assert detail["block_values"] == (10 + 2) * 5 and detail["crypto_floor_cpu_s"] > 0
    assert dense["block_values"] == (50 + 2) * 5
    # The same keys and shares either way; each client masks 40 rows x 5 values fewer, 8 bytes
    # each in the 64-bit ring.
    assert dense["bytes_up"] - detail["bytes_up"] == 20 * 40 * 5 * 8


def test_merge_replaces_a_cell_and_keeps_the_others():
    old = [{"users": 1, "transport": "plaintext", "store": "stored", "item_blocks": 1, "x": 0}]
    new = old[0] | {"x": 1}
    other = new | {"users": 2}
    assert merge_cells(None, [new, other], old) == [new, other]


def test_a_secagg_dp_cell_meets_a_target_epsilon_over_its_rounds():
    # 40 of 400 users a round, the noise calibrated by the discrete Gaussian's accountant.
    cell = ScaleCell(400, "secagg+dp", "on-demand", 2, 40, 4, epsilon=8.0)
    result = run_cell(cell, MODEL)
    assert [r["clients"] for r in result["rounds_detail"]] == [40, 40]
    # The calibration spends at most the target (its own accountant) and not far below it.
    assert 4.0 < result["epsilon_server"] <= 8.0 + 1e-9
    assert result["noise_multiplier_used"] > 0
