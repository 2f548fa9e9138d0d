"""What a person sees of the leak-utility benchmark: words in the table, a bar that moves."""

from __future__ import annotations

import math

from securefed.bench.leak_utility import (
    LeakUtilityConfig,
    RoundProgress,
    cell_text,
    column_title,
    human_table,
    human_transport,
    load_split,
    run_cell,
)


class Counter:
    """Stands in for a tqdm bar: counts the steps it is moved by."""

    def __init__(self) -> None:
        self.n = 0

    def update(self, step: int) -> None:
        self.n += step


def test_the_bar_moves_once_per_round_of_a_cell_warm_start_included():
    split = load_split(LeakUtilityConfig(max_users=30, max_items=40))
    config = LeakUtilityConfig(rounds=5, transport_rounds=2, progress=False)
    bar = Counter()
    row = run_cell(split, "fedmf", "secagg", config, progress=RoundProgress(bar))
    assert row["status"] == "ok" and row["transport_rounds"] == 2  # 3 warm rounds + 2 through it
    assert bar.n == 5


def test_tables_say_words_not_raw_names_or_none():
    rows = [
        {
            "variant": "fedrec+",
            "transport": "dp:4",
            "status": "ok",
            "rmse": 1.0351,
            "epsilon": 3.9901,
            "epsilon_server": math.inf,
            "leak_exact_share": 0.3424,
        },
        {
            "variant": "fedmf",
            "transport": "secagg",
            "status": "ok",
            "rmse": 0.9286,
            "epsilon": None,
            "epsilon_server": None,
            "leak_exact_share": 0.3424,
        },
    ]
    columns = ["variant", "transport", "rmse", "epsilon", "epsilon_server", "leak_exact_share"]
    table = human_table(rows, columns)
    assert "None" not in table and "leak_" not in table and "epsilon_server" not in table
    assert table.splitlines()[0] == (
        "| variant | transport | test RMSE | epsilon (released model) | epsilon (server) | "
        "ratings recovered exactly |"
    )
    assert "| FedRec+ | central DP, epsilon 4 | 1.0351 | 3.99 | none (inf) | 34.2% |" in table
    assert "| FedMF | secure aggregation | 0.9286 | – | – | 34.2% |" in table
    assert human_transport("secagg+dp:4") == "distributed DP (secagg), epsilon 4"
    assert column_title("chance_f1") == "chance" and cell_text("rmse", float("nan")) == "–"


def test_merge_replaces_the_re_run_cells_and_refuses_another_record(tmp_path):
    import json

    import pytest

    from securefed.bench.leak_utility import merge_rows

    meta = {"data": "d", "users": 3, "items": 4, "train": 10, "test": 2, "rounds": 5, "seed": 0}
    old = [
        {"variant": "fedmf", "transport": "dp:4", "leak_exact_share": 0.9},
        {"variant": "fedrec", "transport": "dp:4", "leak_exact_share": 0.3, "notes": "lower bound"},
    ]
    path = tmp_path / "leak_utility.json"
    path.write_text(json.dumps({"meta": meta, "rows": old}))
    fresh = [
        {"variant": "fedrec", "transport": "dp:4", "leak_exact_share": 0.95},
        {"variant": "fedrec+", "transport": "dp:4", "leak_exact_share": 0.94},
    ]
    merged = merge_rows(path, meta, fresh)
    assert [(r["variant"], r["leak_exact_share"]) for r in merged] == [
        ("fedmf", 0.9),
        ("fedrec", 0.95),
        ("fedrec+", 0.94),
    ]
    with pytest.raises(ValueError, match="has rounds = 5, this run 200"):
        merge_rows(path, meta | {"rounds": 200}, fresh)
    with pytest.raises(ValueError, match="no record"):
        merge_rows(tmp_path / "missing.json", meta, fresh)
    assert column_title("leak_filled_identified") == "filled rows identified"
    assert cell_text("leak_filled_identified", 0.5) == "50.0%"
