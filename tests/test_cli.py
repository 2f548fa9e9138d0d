"""The command line and the leak-utility benchmark, end to end on the embedded data."""

from __future__ import annotations

import json
import sys

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
    # Against the server: every client every round (q = 1), so distributed DP costs it the same;
    # the warm rounds stand for the deployment and are charged as it would be. Central DP shows
    # the server the sums un-noised.
    assert distributed["epsilon_server"] == pytest.approx(distributed["epsilon"])
    assert central["epsilon_server"] == float("inf")
    assert masked["leak_exact_share"] == pytest.approx(masked["chance_exact_share"])
    assert abs(masked["rmse"] - plain["rmse"]) < 2e-3  # same run, different transport
    encrypted = by_transport["ckks"]
    assert encrypted["status"] == "ok"
    assert encrypted["leak_exact_share"] == pytest.approx(encrypted["chance_exact_share"])
    assert abs(encrypted["rmse"] - plain["rmse"]) < 2e-3
    for name in ("leak_utility.json", "leak_utility.md", "leak_utility.png"):
        assert (tmp_path / name).stat().st_size > 0
    # Strict JSON (issue 29): the infinite epsilon_server is the string "Infinity", not a token.
    text = (tmp_path / "leak_utility.json").read_text()
    record = json.loads(text, parse_constant=lambda token: pytest.fail(f"non-JSON {token}"))
    assert "Infinity" in {row["epsilon_server"] for row in record["rows"]}


def test_restricted_split_shares_one_index_space():
    split = load_split(LeakUtilityConfig(max_users=30, max_items=50))
    assert split.train.n_users <= 30 and split.train.n_items <= 50
    assert split.test.n_items == split.train.n_items
    row = run_cell(split, "fedrec", "plaintext", LeakUtilityConfig(rounds=3, progress=False))
    assert row["status"] == "ok" and 0 <= row["leak_f1"] <= 1


# -- the command line's structure: a static table, lazy imports, missing extras ------------------
def _help_lines(parser_action) -> dict[str, str]:
    """``{name: help}`` of a subparsers action, as the listing shows them."""
    return {action.dest: action.help for action in parser_action._choices_actions}


def _subparsers(parser):
    import argparse

    (action,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["fedmf", "--help"],
        ["bench", "--help"],
        ["demo", "--out", "x", "-h"],
        ["fedslate", "--help"],  # issue 29: torch only once a run is asked for
        ["privacy", "noise", "--help"],
    ],
)
def test_help_screens_import_no_heavy_module(argv):
    from securefed.bench.bench_startup import heavy_modules_loaded

    loaded = heavy_modules_loaded(sys.executable, argv)
    if argv[0] == "demo":  # demo's --help imports its own module (numpy, scipy.stats), no extra
        loaded = [m for m in loaded if m != "scipy.stats"]
    assert loaded == []


def test_every_command_and_bench_is_listed_from_the_table():
    from securefed.bench.cli import build_parser
    from securefed.bench.registry import BENCHES, COMMANDS

    top = _subparsers(build_parser())
    assert _help_lines(top) == {name: c.help for name, c in COMMANDS.items()}
    assert all(len(p._actions) == 1 for p in top.choices.values())  # stubs: only --help
    group = _subparsers(_subparsers(build_parser(["bench"])).choices["bench"])
    assert _help_lines(group) == {name: c.help for name, c in BENCHES.items()}
    assert all(len(p._actions) == 1 for p in group.choices.values())


def _installed(command) -> bool:
    return not command.missing_extras()


def test_each_chosen_command_gets_its_own_arguments_and_the_tables_help():
    from securefed.bench.cli import build_parser
    from securefed.bench.registry import BENCHES, COMMANDS

    registers: dict[str, set[str]] = {}
    for table, prefix in ((COMMANDS, []), (BENCHES, ["bench"])):
        for name, command in table.items():
            if command.subcommands or not _installed(command):
                continue
            action = _subparsers(build_parser([*prefix, name, "--help"]))
            if prefix:
                action = _subparsers(action.choices["bench"])
            assert _help_lines(action)[name] == command.help  # the listing equals the table
            assert len(action.choices[name]._actions) > 1  # its real options, not a stub
            registers.setdefault(command.register, set()).update(
                n for n, p in action.choices.items() if len(p._actions) > 1
            )
    for register, added in registers.items():  # a module adds exactly what the table lists
        listed = {n for t in (COMMANDS, BENCHES) for n, c in t.items() if c.register == register}
        assert added == listed, register


def test_bench_help_shows_the_chosen_bench_options(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["bench", "startup", "--help"])
    assert stop.value.code == 0
    assert "--repeats" in capsys.readouterr().out


def test_a_missing_extra_stops_with_one_line(capsys, monkeypatch):
    from securefed.bench import registry

    monkeypatch.setitem(registry.EXTRA_MODULES, "rl", ("securefed_no_such_module_for_tests",))
    for argv, command in (
        (["fedslate", "--help"], "fedslate"),
        (["fedhpd", "--task", "cartpole"], "fedhpd"),
        (["bench", "rl-leak", "--quick"], "bench rl-leak"),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err == (
            f"securefed: {command} needs the 'rl' extra: pip install 'securefed[rl]'\n"
        ), err
    with pytest.raises(SystemExit) as stop:  # the others are untouched
        main(["--help"])
    assert stop.value.code == 0
    assert "fedslate" in capsys.readouterr().out


def test_an_import_failing_on_an_extra_module_names_the_extra(capsys, monkeypatch):
    from securefed.bench import registry

    def absent(name):
        raise ModuleNotFoundError(f"No module named {'tenseal'!r}", name="tenseal")

    monkeypatch.setattr(registry, "import_module", absent)
    assert main(["bench", "fedmf-splits", "--help"]) == 2
    message = capsys.readouterr().err
    assert message == (
        "securefed: bench fedmf-splits needs the 'he' extra: pip install 'securefed[he]'\n"
    )

    def broken(name):
        raise ModuleNotFoundError("No module named 'securefed.bench.gone'", name="securefed.gone")

    monkeypatch.setattr(registry, "import_module", broken)
    with pytest.raises(ModuleNotFoundError, match=r"securefed\.bench\.gone"):  # a bug stays loud
        main(["bench", "fedmf-splits", "--help"])


def test_extras_are_named_together():
    from securefed.bench.registry import ExtraNotInstalled

    assert str(ExtraNotInstalled("bench x", ("he", "dp"))) == (
        "bench x needs the 'he' and 'dp' extras: pip install 'securefed[he,dp]'"
    )


def test_a_command_entry_is_validated():
    from securefed.bench.registry import Command

    with pytest.raises(ValueError, match="either register or subcommands"):
        Command("x", "help")
    with pytest.raises(ValueError, match="module:function"):
        Command("x", "help", "securefed.bench.cli")
    with pytest.raises(ValueError, match="unknown extras"):
        Command("x", "help", "m:f", ("gpu",))
    with pytest.raises(ValueError, match="one word"):
        Command("--x", "help", "m:f")


def test_a_register_function_must_add_its_command(monkeypatch):
    from securefed.bench import registry
    from securefed.bench.cli import build_parser

    entry = registry.Command(
        "ghost", "a bench its module forgot", registry.BENCHES["startup"].register
    )
    monkeypatch.setitem(registry.BENCHES, "ghost", entry)
    monkeypatch.setitem(
        registry.COMMANDS,
        "bench",
        registry.Command("bench", "benchmarks", subcommands=tuple(registry.BENCHES.values())),
    )
    with pytest.raises(RuntimeError, match="did not add the command 'ghost'"):
        build_parser(["bench", "ghost"])


def test_demo_takes_a_short_schedule(monkeypatch):
    from securefed.bench import leak_utility

    seen = {}
    monkeypatch.setattr(leak_utility, "run", lambda config, out: seen.update(config=config))
    assert main(["demo", "--rounds", "3", "--out", "unused"]) == 0
    assert seen["config"].rounds == 3
    assert main(["demo", "--rounds", "1", "--out", "unused"]) == 2  # the attack needs two rounds


def test_startup_bench_times_fresh_processes(tmp_path, capsys):
    from securefed.bench.bench_startup import GOAL_SECONDS, time_command

    assert main(["bench", "startup", "--repeats", "1", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert f"goal: under {GOAL_SECONDS:g} s" in printed
    record = json.loads((tmp_path / "startup.json").read_text())
    accounting = "securefed privacy noise --epsilon 8 --sample-rate 0.01 --rounds 1000 --delta 1e-5"
    assert set(record["timings"]) == {
        "securefed --help",
        "securefed fedmf --help",
        "securefed fedslate --help",
        "securefed privacy noise --help",
        "import securefed",
        accounting,
    }
    for timing in record["timings"].values():
        assert len(timing["seconds"]) == 1 and timing["median_seconds"] > 0
    assert record["timings"][accounting]["under_goal"] is None  # timed, with no goal
    for screen in ("--help", "fedslate --help", "privacy noise --help"):
        assert record["heavy_modules_loaded"][f"securefed {screen}"] == []
    with pytest.raises(RuntimeError, match="exited 3"):
        time_command([sys.executable, "-c", "raise SystemExit(3)"], 1)
    with pytest.raises(ValueError, match="repeats"):
        time_command([sys.executable, "-c", "pass"], 0)


def test_fedrec_plus_runs_through_secure_aggregation_from_its_first_round(tmp_path):
    # Its statistics rows exceed 2^12 in the first rounds: silently clipped before, refused when
    # the encoder stopped clipping, and in range with the registry's clip 2^20.
    config = LeakUtilityConfig(
        rounds=2, variants=("fedrec+",), transports=("secagg",), transport_rounds=0,
        progress=False, workers=1,
    )  # fmt: skip
    (row,) = run(config, tmp_path)
    assert row["status"] == "ok", row["status"]


def test_fedmf_command_refuses_dampings_and_scales_that_do_not_apply(capsys):
    argv = ["fedmf", "--rounds", "1", "--no-progress"]
    assert main([*argv, "--preset", "biased", "--aggregation", "sum"]) == 2
    assert "only aggregation='mean'" in capsys.readouterr().err  # the preset's item damping
    assert main([*argv, "--bias-upload-scale", "0.3"]) == 2  # the paper preset has no biases
    assert "without biases" in capsys.readouterr().err
