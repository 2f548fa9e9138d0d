"""Errors and help of the command line (issue 29, item 6): one line naming the cause and the fix.

Each message is produced through ``securefed.bench.cli.main`` (usage errors: exit code 2, the
message on standard error, no traceback), and docs/cli.md quotes only messages these tests
produce.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from securefed.bench import registry
from securefed.bench.cli import build_parser, main

REPO_ROOT = Path(__file__).resolve().parents[1]


def _fails_with(capsys, argv: list[str]) -> str:
    """Run ``securefed ARGV``, check exit code 2 and no traceback; return the error line (after
    at most the loader's ``securefed: read ...`` line)."""
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in "\n".join(lines)
    assert lines[-1].startswith("securefed: error: "), lines
    assert all(line.startswith("securefed: read ") for line in lines[:-1]), lines
    return lines[-1]


def _ratings(path: Path, rows: list[str]) -> Path:
    path.write_text("\n".join(rows) + "\n")
    return path


# ---------------------------------------------------------------- secure aggregation's round size


def test_a_one_user_file_under_secagg_is_one_line_naming_the_fix(tmp_path, capsys):
    data = _ratings(tmp_path / "one.csv", ["1,1,4", "1,2,3", "1,3,5"])
    argv = ["fedmf", "--data", str(data), "--transport", "secagg", "--rounds", "1"]
    message = _fails_with(capsys, [*argv, "--no-progress"])
    assert "needs at least 2 clients in a round and the data has 1 user" in message
    assert "--transport plaintext" in message


@pytest.mark.parametrize(
    ("sampling", "expected"),
    [
        ("poisson", "poisson sampling of clients_per_round=1 (--clients-per-round) gives rounds"),
        ("fixed", "fixed sampling of clients_per_round=1 (--clients-per-round) gives rounds of 1"),
    ],
)
def test_one_client_per_round_under_secagg_is_refused_before_any_round(capsys, sampling, expected):
    argv = ["fedmf", "--transport", "secagg", "--clients-per-round", "1", "--sampling", sampling]
    message = _fails_with(capsys, [*argv, "--rounds", "2", "--seed", "1", "--no-progress"])
    assert expected in message and "not part of round" not in message
    assert "sample at least 2 clients per round" in message


def test_an_empty_round_places_nobody():
    """A Poisson round may draw nobody; placing no clients is no error (it said
    ``client(s) [] are not part of round 0``)."""
    from securefed.views import RoundView

    assert RoundView(round_id=0, clients=[]).positions([]).tolist() == []


def test_a_round_of_one_client_names_the_sampling_fix():
    from securefed import SeedTree
    from securefed.errors import AggregationError
    from securefed.transport import build_transport

    transport = build_transport("secagg")
    with pytest.raises(AggregationError, match=r"round 3 has 1 client.*clients_per_round"):
        transport.open_round(3, [5], shape=(1, 4), seeds=SeedTree(0))


def test_the_round_size_check_is_the_capability_of_the_transport():
    from securefed.transport import build_transport
    from securefed.transport.capabilities import round_size_findings

    secagg = build_transport("secagg").capabilities
    assert secagg.min_round_clients == 2
    assert build_transport("secagg+dp", {"noise_multiplier": 1.0}).capabilities.min_round_clients
    assert build_transport("plaintext").capabilities.min_round_clients == 1
    assert round_size_findings("secagg", secagg, 10, "poisson", 2) == []
    assert round_size_findings("secagg", secagg, 10, "all", None) == []
    assert len(round_size_findings("secagg", secagg, 1, "all", None)) == 1
    plain = build_transport("plaintext").capabilities
    assert round_size_findings("plaintext", plain, 1, "fixed", 1) == []


# ------------------------------------------------------------------------------ the rating scale


def test_a_tab_file_with_half_stars_names_the_scale_flag(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _ratings(tmp_path / "half.tsv", ["1\t1\t3.5\t100", "1\t2\t4\t101", "2\t1\t2.5\t102"])
    message = _fails_with(capsys, ["fedmf", "--data", "half.tsv", "--rounds", "1"])
    assert "taken for movielens100k from its first line" in message
    assert "pass --scale MIN:MAX:STEP (e.g. --scale 1:5:0.5)" in message
    assert "scale=" not in message
    # The flag it names works.
    assert main(["fedmf", "--data", "half.tsv", "--scale", "1:5:0.5", "--rounds", "1"]) == 0
    capsys.readouterr()


def test_the_python_api_names_the_keyword_not_the_flag(tmp_path):
    from securefed.recsys.data import DataFormatError, load_ratings

    path = _ratings(tmp_path / "half.tsv", ["1\t1\t3.5\t100", "2\t1\t2\t102"])
    with pytest.raises(DataFormatError) as error:
        load_ratings(path)
    assert "pass scale='1:5:0.5'" in str(error.value) and "--scale" not in str(error.value)
    assert "--scale 1:5:0.5" in error.value.command_line_message
    assert error.value.line == 1
    # A file named u.data is MovieLens 100K by name: not "taken for" it from its content.
    named = _ratings(tmp_path / "u.data", ["1\t1\t3.5\t100", "2\t1\t2\t102"])
    with pytest.raises(DataFormatError, match="movielens100k format's scale") as by_name:
        load_ratings(named)
    assert "taken for" not in str(by_name.value)


@pytest.mark.parametrize(
    ("rows", "python", "flag"),
    [
        (["1,1,3.7", "2,1,2"], "pass scale='0:1:0.25'", "pass --scale MIN:MAX:STEP"),
        (
            ["1,1,4", "2,1,4"],
            "pass scale='1:5:1'",
            "pass --scale MIN:MAX:STEP (e.g. --scale 1:5:1)",
        ),
    ],
)
def test_an_uninferable_scale_names_the_flag_on_the_command_line(
    tmp_path, capsys, rows, python, flag
):
    from securefed.recsys.data import DataFormatError, load_ratings

    path = _ratings(tmp_path / "r.csv", rows)
    with pytest.raises(DataFormatError, match=re.escape(python)):
        load_ratings(path)
    message = _fails_with(capsys, ["fedmf", "--data", str(path), "--rounds", "1"])
    assert flag in message and "scale=" not in message


def test_a_data_format_error_pickles_with_both_wordings():
    import pickle

    from securefed.recsys.data import DataFormatError

    error = DataFormatError("r.csv", 3, "cause; pass scale=", "cause; pass --scale")
    again = pickle.loads(pickle.dumps(error))
    assert str(again) == "r.csv, line 3: cause; pass scale="
    assert again.command_line_message == "r.csv, line 3: cause; pass --scale"
    assert DataFormatError("r.csv", None, "empty").command_line_message == "r.csv: empty"


# ------------------------------------------------------------------------------------------- help


def _commands() -> list[list[str]]:
    chains = []
    for name, command in registry.COMMANDS.items():
        if command.subcommands:
            chains += [[name, sub.name] for sub in command.subcommands]
        else:
            chains.append([name])
    return chains


def _chosen_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = build_parser(argv)
    for word in argv:
        (subparsers,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        parser = subparsers.choices[word]
    return parser


def _leaves(
    parser: argparse.ArgumentParser, name: str
) -> list[tuple[str, argparse.ArgumentParser]]:
    """The parser and, for a command with its own subcommands (``privacy``), theirs."""
    nested = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    found = [(name, parser)]
    for action in nested:
        for word, child in action.choices.items():
            found += _leaves(child, f"{name} {word}")
    return found


@pytest.mark.parametrize("argv", _commands(), ids=" ".join)
def test_every_option_of_every_command_has_help(argv):
    try:
        chosen = _chosen_parser(argv)
    except registry.ExtraNotInstalled as missing:
        pytest.skip(str(missing))
    leaves = _leaves(chosen, " ".join(argv))
    options = [(n, a) for n, parser in leaves for a in parser._actions if a.option_strings]
    assert len(options) > len(leaves)  # more than each parser's --help
    bare = [f"{n} {a.option_strings[-1]}" for n, a in options if not (a.help or "").strip()]
    assert bare == [], f"options without help: {bare}"


def test_fedslate_lists_only_the_transports_that_serve_it(capsys):
    pytest.importorskip("torch")
    with pytest.raises(SystemExit) as stop:
        main(["fedslate", "--help"])
    assert stop.value.code == 0
    shown = capsys.readouterr().out
    assert "--transport {plaintext,ckks,dp,ckks+dp}" in shown and "secagg" not in shown
    with pytest.raises(SystemExit) as stop:
        main(["fedslate", "--transport", "secagg"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "secure aggregation does not apply to the fusion shape" in err
    assert "Traceback" not in err


# ------------------------------------------------------------------------------- torch is missing

_BLOCK_TORCH = """
import importlib.abc, sys

class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoTorch())
"""


def test_securefed_torch_without_torch_names_the_extra():
    probe = _BLOCK_TORCH + textwrap.dedent(
        """
        try:
            import securefed.torch
        except ImportError as error:
            print(type(error).__name__, error.name, error, sep="|")
        else:
            print("imported")
        """
    )
    done = subprocess.run(
        [sys.executable, "-P", "-c", probe],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO_ROOT,
    )
    assert done.returncode == 0, done.stderr
    kind, name, message = done.stdout.strip().split("|")
    assert kind == "ModuleNotFoundError" and name == "torch"
    assert "pip install 'securefed[torch]'" in message
    assert "Traceback" not in done.stderr


# ----------------------------------------------------------------------------- where data is found


def test_a_named_data_set_is_sought_beside_the_working_directory(tmp_path, monkeypatch):
    from securefed.bench import datasets

    monkeypatch.delenv("SECUREFED_DATA", raising=False)
    wheel_like = tmp_path / "site-packages" / "securefed"  # no pyproject.toml: not a checkout
    wheel_like.mkdir(parents=True)
    monkeypatch.setattr(datasets, "REPO_ROOT", wheel_like)
    work = tmp_path / "project" / "repo"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    with pytest.raises(datasets.DataUnavailable) as missing:
        datasets.resolve("ml-100k")
    message = str(missing.value)
    assert "site-packages" not in message
    assert str(tmp_path / "project" / "shared" / "data" / "ml-100k") in message
    assert "set SECUREFED_DATA" in message and "--data /path/to/ml-100k" in message
    found = tmp_path / "project" / "shared" / "data" / "ml-100k"
    found.mkdir(parents=True)
    assert datasets.resolve("ml-100k") == work.parent / "shared" / "data" / "ml-100k"
    monkeypatch.setenv("SECUREFED_DATA", str(tmp_path / "elsewhere"))
    assert datasets.data_roots()[0] == tmp_path / "elsewhere"


def test_a_checkout_still_looks_beside_itself(tmp_path, monkeypatch):
    from securefed.bench import datasets

    monkeypatch.delenv("SECUREFED_DATA", raising=False)
    roots = datasets.data_roots(cwd=tmp_path)
    assert roots[0] == REPO_ROOT.parent / "shared" / "data"
    assert len(roots) == len({root.absolute() for root in roots})


# ------------------------------------------------------------------------------ records and tables


@pytest.mark.parametrize(
    ("rounds", "tail", "expected"),
    [
        (2, 2, "Every round of every cell went through its transport."),
        (6, 0, "Every round of every cell went through its transport."),
        (3, 2, "cells: round 1 over their clear counterpart, the last 2"),
        (30, 2, "cells: rounds 1..28 over their clear counterpart, the last 2"),
    ],
)
def test_the_leak_utility_header_counts_the_clear_rounds(rounds, tail, expected):
    from securefed.bench.leak_utility import transport_rounds_note

    note = transport_rounds_note(rounds, tail)
    assert expected in note and "1..0" not in note


def _refuse(token: str):
    raise ValueError(f"not strict JSON: {token}")


def strict_loads(text: str) -> object:
    """A strict JSON parser: the non-standard tokens Infinity, -Infinity, NaN are errors."""
    return json.loads(text, parse_constant=_refuse)


def test_records_are_strict_json_and_read_back():
    from securefed.records import dumps_record, loads_record

    record = {"eps": math.inf, "low": -math.inf, "nan": [1.0, math.nan], "ok": 2.5, "s": "x"}
    with pytest.raises(ValueError, match="not strict JSON"):
        strict_loads(json.dumps(record))  # what json.dumps writes
    text = dumps_record(record, indent=1)
    parsed = strict_loads(text)
    assert parsed["eps"] == "Infinity" and parsed["low"] == "-Infinity"
    assert parsed["nan"] == [1.0, "NaN"]
    back = loads_record(text)
    assert back["eps"] == math.inf and back["low"] == -math.inf and math.isnan(back["nan"][1])
    assert back["ok"] == 2.5 and back["s"] == "x"
    assert float(parsed["eps"]) == math.inf  # Python's float() reads the strings


def test_the_fedmf_record_is_strict_json(tmp_path, capsys):
    out = tmp_path / "run.json"
    argv = ["fedmf", "--rounds", "1", "--transport", "dp", "--noise-multiplier", "1.0"]
    assert main([*argv, "--clip", "1.0", "--json", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    strict_loads(printed)
    strict_loads(out.read_text())


def test_no_record_writer_calls_json_dumps_directly():
    """Every record the app layer writes goes through securefed.records.dumps_record; the
    json.dumps calls left build cache keys (sorted, ``default=str``), never a record."""
    left = [
        f"{path.name}: {line.strip()}"
        for path in sorted((REPO_ROOT / "benchmarks").glob("*.py"))
        for line in path.read_text().splitlines()
        if "json.dumps(" in line and "default=str)" not in line
    ]
    assert left == []


# ------------------------------------------------------------------------- docs/cli.md's messages

_QUOTE = re.compile(
    r"`((?:securefed(?: fedslate)?: |ModuleNotFoundError: )[^`]+)`|^(securefed: [^\n]+)$", re.M
)


def quoted_messages(markdown: str) -> list[str]:
    """The messages docs/cli.md quotes (in backticks or a code block's line), spaces folded."""
    return [" ".join((inline or line).split()) for inline, line in _QUOTE.findall(markdown)]


def _produced(capsys, monkeypatch, tmp_path) -> list[str]:
    """Every message docs/cli.md quotes, as the code prints it now."""
    messages = []
    monkeypatch.setitem(registry.EXTRA_MODULES, "rl", ("securefed_no_such_module_for_tests",))
    main(["fedslate", "--help"])
    messages.append(capsys.readouterr().err)
    monkeypatch.undo()
    from securefed.errors import TransportUnavailable
    from securefed.transport import build_transport
    from securefed.transport import registry as transports

    monkeypatch.setattr(transports, "_module_present", lambda module: module != "tenseal")
    with pytest.raises(TransportUnavailable) as unavailable:
        build_transport("ckks")
    messages.append(f"securefed: {unavailable.value}")
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    _ratings(tmp_path / "one.csv", ["1,1,4", "1,2,3"])
    _ratings(tmp_path / "half.tsv", ["1\t1\t3.5\t100", "1\t2\t4\t101", "2\t1\t2.5\t102"])
    for argv in (
        ["fedmf", "--data", "one.csv", "--transport", "secagg"],
        ["fedmf", "--transport", "secagg", "--clients-per-round", "1"],
        ["fedmf", "--data", "half.tsv"],
        ["fedmf", "--data", "ml-100k-not-here"],
    ):
        main([*argv, "--rounds", "1", "--no-progress"])
        messages.append(capsys.readouterr().err.strip().splitlines()[-1])
    pytest.importorskip("torch")
    with pytest.raises(SystemExit):
        main(["fedslate", "--transport", "secagg"])
    messages.append(capsys.readouterr().err.strip().splitlines()[-1])
    joint = ["fedslate", "--transport", "dp", "--epsilon", "8", "--dp-acting", "own"]
    assert main([*joint, "--dp-server-clip", "0.07", "--episodes", "1"]) == 2
    messages.append(capsys.readouterr().err.strip().splitlines()[-1])
    return [" ".join(message.split()) for message in messages]


def test_docs_cli_quotes_the_messages_the_code_prints(capsys, monkeypatch, tmp_path):
    quotes = quoted_messages((REPO_ROOT / "docs" / "cli.md").read_text())
    assert len(quotes) >= 8
    produced = _produced(capsys, monkeypatch, tmp_path)
    produced.append(
        "ModuleNotFoundError: securefed.torch needs PyTorch, which is not installed: pip install "
        "'securefed[torch]' (torch==2.13.0, CPU)"
    )
    torch_source = (REPO_ROOT / "securefed" / "torch.py").read_text()
    assert "securefed.torch needs PyTorch, which is not installed: pip install " in torch_source
    for quote in quotes:
        pattern = ".*".join(re.escape(part) for part in quote.replace("ml-100k", "@").split("..."))
        pattern = pattern.replace("@", r"ml-100k(-not-here)?")
        assert any(re.search(pattern, message) for message in produced), (quote, produced)
