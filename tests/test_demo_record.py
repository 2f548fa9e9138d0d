"""``make demo`` prints its record's figures on any machine.

The demo's cheap cells (FedMF and FedRec in plaintext and under central DP) are re-run here with
the demo's own configuration and compared with ``benchmarks/results/demo/leak_utility.json``. The
cells are numpy float64 arithmetic seeded end to end, so another CPU moves them by about 1e-13;
the tolerance of 1e-6 is far below the printed four decimals, so a record that drifted from the
code (a changed default, an unstable ranking choosing other users) fails here. The secure
aggregation cells equal plaintext in RMSE (the record shows it) and take a minute: they are left
to the demo itself.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

RECORD = (
    Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "demo" / "leak_utility.json"
)
CELLS = [("fedmf", "plaintext"), ("fedmf", "dp:8"), ("fedrec", "plaintext")]
COMPARED = ("rmse", "mae", "leak_exact_share", "chance_exact_share", "leak_f1", "chance_f1")


@pytest.fixture(scope="module")
def demo_split():
    from securefed.bench.leak_utility import demo_config, load_split

    config = demo_config()
    return config, load_split(config)


def test_the_demo_subset_is_the_recorded_one(demo_split):
    config, split = demo_split
    meta = json.loads(RECORD.read_text())["meta"]
    assert (split.name, split.train.n_users, split.train.n_items) == (
        meta["data"],
        meta["users"],
        meta["items"],
    )
    assert (len(split.train), len(split.test)) == (meta["train"], meta["test"])
    assert meta["rounds"] == config.rounds


@pytest.mark.parametrize(("variant", "spec"), CELLS)
def test_the_demo_cells_give_the_recorded_figures(demo_split, variant, spec):
    from securefed.bench.leak_utility import run_cell

    config, split = demo_split
    assert spec in config.transports
    if spec.startswith("dp"):
        pytest.importorskip("opacus")
    recorded = {
        (row["variant"], row["transport"]): row for row in json.loads(RECORD.read_text())["rows"]
    }
    expected = recorded[(variant, spec)]
    row = run_cell(split, variant, spec, config)
    for key in COMPARED:
        assert row[key] == pytest.approx(expected[key], abs=1e-6), key
