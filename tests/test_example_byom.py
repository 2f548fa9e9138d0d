"""examples/byom_two_tower.py on a short schedule: a user's torch model through every transport,
attacked (issue 19's "must show", in small)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("opacus")
pytest.importorskip("tenseal")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "byom_two_tower.py"


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("byom_two_tower", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules["byom_two_tower"] = module
    spec.loader.exec_module(module)
    yield module
    from securefed.bench import plugins

    for name in ("two-tower", "rated-items", "ncf", "user-profile"):
        plugins.unregister(name)
    sys.modules.pop("byom_two_tower", None)


def test_the_example_table_on_a_short_schedule(example, tmp_path):
    rows = example.leak_utility_table(example.QUICK, tmp_path)
    by = {row["transport"]: row for row in rows}
    assert all(row["status"] == "ok" for row in rows), [r["status"] for r in rows]
    plain = by["plaintext"]
    # utility: secure aggregation and CKKS compute plaintext's sums within their stated error
    assert abs(by["secagg"]["rmse"] - plain["rmse"]) < 1e-4
    assert abs(by["ckks"]["rmse"] - plain["rmse"]) < 1e-4
    # the attack: every rated item read off a readable update, chance under hiding transports
    assert plain["leak_f1"] == pytest.approx(1.0) and plain["chance_f1"] < 0.95
    for hidden in ("secagg", "ckks", "secagg+dp:8"):
        assert by[hidden]["leak_f1"] == pytest.approx(by[hidden]["chance_f1"])
    # central DP shows the server clipped updates: the rated rows are still there
    assert by["dp:8"]["leak_f1"] == pytest.approx(1.0)
    for dp in ("dp:8", "secagg+dp:8"):
        assert 7.9 < by[dp]["epsilon"] <= 8.0 * 1.0001
    assert by["dp:8"]["epsilon_server"] == float("inf")
    table = (tmp_path / "leak_utility.md").read_text()
    assert "two-tower" in table and "rated-item F1" in table and "None" not in table
    assert (tmp_path / "leak_utility.png").stat().st_size > 0


def test_one_round_agrees_within_each_transports_stated_bound(example, tmp_path):
    rows = example.one_round_agreement(example.QUICK, tmp_path)
    assert [row["transport"] for row in rows] == ["plaintext", "secagg", "ckks"]
    for row in rows[1:]:
        assert 0 < row["max_abs_deviation_of_the_mean"] <= row["stated_bound"], row


def test_private_user_vectors_leak_no_more_than_a_shared_user_table(example, tmp_path):
    """The NCF-style model with p_u, b_u client-private against its shared-table version."""
    rows = example.private_versus_shared(example.QUICK, tmp_path)
    by = {(row["variant"], row["transport"]): row for row in rows}
    assert all(row["status"] == "ok" for row in rows), [r["status"] for r in rows]
    for transport in ("plaintext", "secagg"):
        private, shared = by["private-user", transport], by["shared-user", transport]
        # the user-profile attack: without user vectors the server is left at chance
        assert private["leak_pair_accuracy"] == private["chance_pair_accuracy"]
        # what the server reads of the rated items is the same with or without them
        assert private["leak_f1"] <= shared["leak_f1"]
        assert private["kib_up_per_client_round"] < shared["kib_up_per_client_round"]
    assert by["private-user", "plaintext"]["leak_f1"] == pytest.approx(1.0)
    assert (tmp_path / "leak_utility.png").stat().st_size > 0
