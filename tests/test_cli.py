"""The command line and the leak-utility benchmark, end to end on the embedded data."""

from __future__ import annotations

import json

import pytest

from securefed import ServerView
from securefed.bench.cli import main
from securefed.bench.leak_utility import LeakUtilityConfig, load_split, run, run_cell


def test_fedmf_command_writes_json_and_view(tmp_path, capsys):
    out, view_dir = tmp_path / "run.json", tmp_path / "view"
    code = main(
        [
            "fedmf",
            "--rounds",
            "3",
            "--variant",
            "fedrec+",
            "--json",
            str(out),
            "--save-view",
            str(view_dir),
            "--no-progress",
        ]
    )
    assert code == 0
    record = json.loads(out.read_text())
    for key in (
        "rmse",
        "mae",
        "variant",
        "transport",
        "rounds",
        "seconds",
        "bytes_up",
        "bytes_down",
    ):
        assert key in record
    assert record["variant"] == "fedrec+" and record["rounds"] == 3
    assert record["bytes_up"] > 0 and record["bytes_down"] > 0
    view = ServerView.load(view_dir)
    assert view.rounds_with_payloads() == [1, 2]
    assert view.public["variant"] == "fedrec+"


def test_fedmf_command_reports_bad_input(capsys, monkeypatch):
    import sys

    assert main(["fedmf", "--data", "/no/such/ratings.csv", "--rounds", "1"]) == 2
    assert "not found" in capsys.readouterr().err
    assert main(["fedmf", "--transport", "rot13", "--rounds", "1", "--no-progress"]) == 2
    assert "unknown transport 'rot13'; known: plaintext, secagg" in capsys.readouterr().err
    # A DP option on a transport without DP is refused, not silently ignored.
    argv = ["fedmf", "--transport", "secagg", "--epsilon", "8", "--rounds", "1", "--no-progress"]
    assert main(argv) == 2
    assert "takes no option 'dp.epsilon'" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "tenseal", None)  # as if the [he] extra were not installed
    assert main(["fedmf", "--transport", "ckks", "--rounds", "1", "--no-progress"]) == 2
    assert "pip install 'securefed[he]'" in capsys.readouterr().err


def test_privacy_command_is_wired(capsys):
    assert (
        main(
            [
                "privacy",
                "epsilon",
                "--noise-multiplier",
                "1.0",
                "--sample-rate",
                "0.01",
                "--rounds",
                "1000",
                "--delta",
                "1e-5",
            ]
        )
        == 0
    )
    assert "2.10" in capsys.readouterr().out


def test_leak_utility_rows_on_a_small_set(tmp_path):
    config = LeakUtilityConfig(
        rounds=6,
        variants=("fedmf",),
        max_users=40,
        max_items=60,
        transports=("plaintext", "secagg", "ckks", "dp:8", "secagg+dp:8"),
        progress=False,
    )
    rows = run(config, tmp_path)  # two worker processes
    assert [row["transport"] for row in rows] == list(config.transports)
    by_transport = {row["transport"]: row for row in rows}
    plain, masked = by_transport["plaintext"], by_transport["secagg"]
    assert plain["leak_exact_share"] > 0.99  # the gradient leak, in the clear
    assert plain["transport_rounds"] == 6 and masked["transport_rounds"] == 2  # warm start
    central, distributed = by_transport["dp:8"], by_transport["secagg+dp:8"]
    assert central["status"] == distributed["status"] == "ok"
    assert central["leak_f1"] == pytest.approx(1.0)  # central DP: the server reads the rows
    assert distributed["leak_f1"] == pytest.approx(distributed["chance_f1"])
    # The warm rounds are charged to the same ledger: the whole run's epsilon, not two rounds'.
    assert 7.9 < distributed["epsilon"] <= 8.0 * 1.0001
    assert masked["leak_exact_share"] == pytest.approx(masked["chance_exact_share"])
    assert abs(masked["rmse"] - plain["rmse"]) < 2e-3  # same run, different transport
    encrypted = by_transport["ckks"]
    assert encrypted["status"] == "ok"
    assert encrypted["leak_exact_share"] == pytest.approx(encrypted["chance_exact_share"])
    assert abs(encrypted["rmse"] - plain["rmse"]) < 2e-3
    for name in ("leak_utility.json", "leak_utility.md", "leak_utility.png"):
        assert (tmp_path / name).stat().st_size > 0


def test_restricted_split_shares_one_index_space():
    split = load_split(LeakUtilityConfig(max_users=30, max_items=50))
    assert split.train.n_users <= 30 and split.train.n_items <= 50
    assert split.test.n_items == split.train.n_items
    row = run_cell(split, "fedrec", "plaintext", LeakUtilityConfig(rounds=3, progress=False))
    assert row["status"] == "ok" and 0 <= row["leak_f1"] <= 1
