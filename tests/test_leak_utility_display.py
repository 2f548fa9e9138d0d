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
    leak_axis_limits,
    load_split,
    plot_cells,
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
    cells = [[c.strip() for c in line.strip().strip("|").split("|")] for line in table.splitlines()]
    assert cells[0] == [
        "variant",
        "transport",
        "test RMSE",
        "epsilon (released model)",
        "epsilon (server)",
        "ratings recovered exactly",
    ]
    assert set(cells[1]) <= {"-" * n for n in range(3, 80)}  # the header's rule
    assert ["FedRec+", "central DP, epsilon 4", "1.0351", "3.99", "none (inf)", "34.2%"] in cells
    assert ["FedMF", "secure aggregation", "0.9286", "–", "–", "34.2%"] in cells
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


def _cells():
    """The demo record's F1 panel in small: FedRec's chance differs under central DP."""
    table = [
        ("fedmf", "plaintext", 1.011, 1.0, 0.589),
        ("fedmf", "dp:8", 0.858, 1.0, 0.589),
        ("fedrec", "secagg", 0.825, 0.559, 0.559),
        ("fedrec", "dp:8", 0.858, 0.999, 0.589),
    ]
    return [
        {"status": "ok", "variant": v, "transport": t, "rmse": r, "leak_f1": f, "chance_f1": c}
        for v, t, r, f, c in table
    ]


def test_the_plot_draws_each_cells_own_chance_and_moves_no_point(tmp_path, monkeypatch):
    import matplotlib.axes

    drawn = {"points": [], "lines": []}
    scatter, plot = matplotlib.axes.Axes.scatter, matplotlib.axes.Axes.plot

    def record_scatter(self, x, y, **options):
        drawn["points"].append((float(x), float(y), options.get("marker"), options.get("s")))
        return scatter(self, x, y, **options)

    def record_plot(self, x, y, **options):
        drawn["lines"].append((tuple(x), tuple(y)))
        return plot(self, x, y, **options)

    monkeypatch.setattr(matplotlib.axes.Axes, "scatter", record_scatter)
    monkeypatch.setattr(matplotlib.axes.Axes, "plot", record_plot)
    rows = _cells()
    assert plot_cells(rows, tmp_path / "p.png", "t", ("rmse", "RMSE"), [("f1", "F1")])
    assert (tmp_path / "p.png").stat().st_size > 0
    points = [p for p in drawn["points"] if p[2] != "|"]
    ticks = [p for p in drawn["points"] if p[2] == "|"]
    # every cell at its own (leak, utility): nothing dodged, nothing past F1 = 1
    assert sorted(p[:2] for p in points) == sorted((r["leak_f1"], r["rmse"]) for r in rows)
    assert max(p[0] for p in points) <= 1.0
    # each cell's chance tick on its own row: FedRec under secagg at its 0.559, not a mean
    assert sorted(t[:2] for t in ticks) == sorted((r["chance_f1"], r["rmse"]) for r in rows)
    # FedMF's and FedRec's central-DP cells share a place: drawn concentric, both visible
    shared = sorted(p[3] for p in points if p[1] == 0.858)
    assert len(shared) == 2 and shared[0] < shared[1]


def test_the_leak_axis_is_honest_and_an_empty_record_is_not_plotted(tmp_path, capsys):
    low, high = leak_axis_limits([0.559, 1.0])
    assert 0.5 < low < 0.559 and 1.0 < high < 1.02
    assert leak_axis_limits([0.0, 0.3])[0] == 0.0
    rows = [{"status": "failed: x", "variant": "fedmf", "transport": "plaintext"}]
    assert not plot_cells(rows, tmp_path / "none.png", "t", ("rmse", "RMSE"), [("f1", "F1")])
    assert not (tmp_path / "none.png").exists()
    assert "no finished cell to plot" in capsys.readouterr().out
