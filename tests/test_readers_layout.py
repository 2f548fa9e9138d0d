"""Reading what users have (issue 29, item 7): a stated separator and columns, string ids, a
pandas DataFrame, and the same line-numbered errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from securefed.bench.cli import main
from securefed.recsys.data import (
    DataFormatError,
    RatingScale,
    from_dataframe,
    load_dataset,
    load_ratings,
    read_ratings_file,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
ROWS = [("7", "31", "4", "100"), ("7", "12", "3.5", "101"), ("9", "31", "5", "102")]


def _write(tmp_path: Path, text: str, name: str = "ratings.txt") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("sep", "joiner"),
    [(",", ","), ("\t", "\t"), (";", ";"), ("|", "|"), ("::", "::"), (r"\s+", "  \t ")],
    ids=["comma", "tab", "semicolon", "pipe", "double-colon", "whitespace"],
)
@pytest.mark.parametrize("header", [False, True], ids=["no-header", "header"])
def test_a_stated_separator_reads_the_fields(tmp_path, sep, joiner, header):
    lines = [joiner.join(row) for row in ROWS]
    if header:
        lines.insert(0, joiner.join(("user", "item", "rating", "timestamp")))
    raw = read_ratings_file(_write(tmp_path, "\n".join(lines) + "\n"), sep=sep)
    assert raw.users.tolist() == [7, 7, 9] and raw.items.tolist() == [31, 12, 31]
    assert raw.ratings.tolist() == [4.0, 3.5, 5.0] and raw.timestamps.tolist() == [100, 101, 102]
    assert raw.fmt == "delimited" and raw.report.header is header


def test_the_slow_path_reads_what_the_fast_path_reads(tmp_path):
    """A multi-character separator goes through numpy after a replacement; a file with a tab
    in it cannot, and goes line by line: both read the same."""
    fast = read_ratings_file(_write(tmp_path, "7||31||4\n9||12||5\n", "a.txt"), sep="||")
    slow = read_ratings_file(_write(tmp_path, "7||31||4\n9||12||5 \t\n", "b.txt"), sep="||")
    for one, other in zip(fast[:3], slow[:3], strict=True):
        assert one.tolist() == other.tolist()


def test_columns_by_header_name_in_any_order_ignoring_the_rest(tmp_path):
    text = "Score;movie;who;when;comment\n4;31;7;100;fine\n3.5;12;7;101;meh\n5;31;9;102;top\n"
    path = _write(tmp_path, text)
    raw = read_ratings_file(path, sep=";", columns=("who", "MOVIE", "score", "when"))
    assert raw.users.tolist() == [7, 7, 9] and raw.items.tolist() == [31, 12, 31]
    assert raw.ratings.tolist() == [4.0, 3.5, 5.0] and raw.timestamps.tolist() == [100, 101, 102]
    no_time = read_ratings_file(path, sep=";", columns=("who", "movie", "score"))
    assert no_time.timestamps is None


@pytest.mark.parametrize("header", ["", "a,b,c,d\n"], ids=["no-header", "header"])
def test_columns_by_position(tmp_path, header):
    path = _write(tmp_path, header + "x,4,7,31\ny,3.5,7,12\nz,5,9,31\n")
    raw = read_ratings_file(path, sep=",", columns=(2, 3, 1))
    assert raw.users.tolist() == [7, 7, 9] and raw.items.tolist() == [31, 12, 31]
    assert raw.ratings.tolist() == [4.0, 3.5, 5.0]
    assert raw.report.header is bool(header)


def test_string_ids_are_reindexed_and_the_mapping_kept(tmp_path):
    text = "user,item,rating\nalice,tt0111161,4\nbob,tt0068646,3\nalice,tt0068646,5\n"
    ratings = load_ratings(_write(tmp_path, text, "r.csv"), ids="string")
    assert ratings.user_ids.tolist() == ["alice", "bob"]
    assert ratings.item_ids.tolist() == ["tt0068646", "tt0111161"]
    assert ratings.user_ids[ratings.users].tolist() == ["alice", "bob", "alice"]
    assert ratings.item_ids[ratings.items].tolist() == ["tt0111161", "tt0068646", "tt0068646"]
    split = load_dataset(_write(tmp_path, text, "r.csv"), ids="string", test_fraction=0.34)
    assert split.train.user_ids.tolist() == ["alice", "bob"]
    assert len(split.train) + len(split.test) == 3


def test_a_text_id_without_ids_string_names_the_fix(tmp_path, capsys):
    path = _write(tmp_path, "user,item,rating\nalice,1,4\n", "r.csv")
    with pytest.raises(DataFormatError, match=r"line 2: non-numeric user field 'alice'$"):
        load_ratings(path)
    assert main(["fedmf", "--data", str(path), "--rounds", "1"]) == 2
    assert "pass --ids string" in capsys.readouterr().err


def test_duplicates_with_string_ids_name_both_lines(tmp_path):
    path = _write(tmp_path, "u;i;r\nann;x;4\nbo;x;3\nann;x;5\n")
    with pytest.raises(DataFormatError, match=r"line 4: duplicate rating of item x by user ann "):
        read_ratings_file(path, sep=";", columns=("u", "i", "r"), ids="string")
    kept = read_ratings_file(
        path, sep=";", columns=("u", "i", "r"), ids="string", duplicates="last"
    )
    assert kept.users.tolist() == ["bo", "ann"] and kept.ratings.tolist() == [3.0, 5.0]


@pytest.mark.parametrize(
    ("text", "options", "line", "cause"),
    [
        ("u;i;r\n1;2;4\n", {"sep": ";", "columns": ("u", "item", "r")}, 1, "unknown column 'item'"),
        ("1;2;4\n", {"sep": ";", "columns": ("u", "i", "r")}, 1, "is data, not a header"),
        ("1;2;4\n", {"sep": ";", "columns": (0, 1, 5)}, 1, "column 5 is beyond the 3 fields"),
        ("1,2,4\n", {"sep": ";"}, 1, "cuts the first line '1,2,4' into 1 field"),
        ("1;2;4\n1;3;5\n2;4\n", {"sep": ";"}, 3, "too few fields: expected 3, found 2"),
        ("user;item;rating\n1;2;4\n1;3;x\n", {"sep": ";"}, 3, "non-numeric rating field 'x'"),
        ("u;i;r;u\n1;2;4;1\n", {"sep": ";", "columns": ("u", "i", "r")}, 1, "'u' twice"),
        ("a;b;c\n1;2;4\n", {"sep": ";"}, 1, "header lacks the column 'user'"),
    ],
    ids=[
        "unknown-column",
        "names-without-header",
        "position-beyond",
        "separator-absent",
        "short-line",
        "bad-rating",
        "column-twice",
        "no-standard-names",
    ],
)
def test_layout_errors_name_the_line(tmp_path, text, options, line, cause):
    with pytest.raises(DataFormatError) as error:
        read_ratings_file(_write(tmp_path, text), **options)
    assert error.value.line == line and cause in error.value.cause, error.value


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"sep": ""}, "bad separator ''"),
        ({"sep": "."}, r"bad separator '\.'"),
        ({"sep": "x"}, "bad separator 'x'"),
        ({"sep": "\n"}, "bad separator"),
        ({"columns": ("u", "i")}, "3 or 4 entries"),
        ({"columns": ("u", 1, "r")}, "all header names or all 0-based positions"),
        ({"columns": (0, 0, 1)}, "twice"),
        ({"columns": (-1, 0, 1)}, ">= 0"),
        ({"sep": ",", "fmt": "csv"}, "leave fmt='auto'"),
        ({"ids": "uuid"}, "ids must be one of int, string"),
    ],
)
def test_bad_layout_arguments_are_refused(tmp_path, options, match):
    with pytest.raises(ValueError, match=match):
        read_ratings_file(_write(tmp_path, "1,2,4\n"), **options)


def test_a_layout_does_not_apply_to_known_data_sets():
    with pytest.raises(ValueError, match=r"sep= \(--sep\) apply to a ratings file of yours"):
        load_dataset("ml-latest-small", sep=";")


def test_the_command_line_takes_sep_columns_and_ids(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    lines = ["who|what|stars"] + [
        f"u{u}|m{(u * 7 + k) % 9}|{1 + (u + k) % 5}" for u in range(12) for k in range(4)
    ]
    _write(tmp_path, "\n".join(lines) + "\n", "mine.psv")
    argv = ["fedmf", "--data", "mine.psv", "--sep", "|", "--columns", "who,what,stars"]
    assert main([*argv, "--ids", "string", "--rounds", "2", "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "mine.psv: delimited with header, 48 lines, 48 ratings, scale 1..5 step 1" in err
    assert main([*argv[:-1], "who,movie,stars", "--ids", "string", "--rounds", "1"]) == 2
    assert "unknown column 'movie': the header's columns are 'who', 'what', 'stars'" in (
        capsys.readouterr().err
    )
    assert main(["fedmf", "--data", "mine.psv", "--sep", "tab", "--rounds", "1"]) == 2
    assert "the separator '\\t' cuts the first line" in capsys.readouterr().err
    assert main([*argv, "--rounds", "1"]) == 2
    assert "pass --ids string" in capsys.readouterr().err


# ----------------------------------------------------------------------------------- DataFrame


def test_a_dataframe_with_integer_and_string_ids():
    pandas = pytest.importorskip("pandas")
    frame = pandas.DataFrame(
        {"uid": [7, 7, 9], "movie": ["b", "a", "b"], "stars": [4, 3.5, 5], "t": [1, 2, 3]},
        index=[10, 11, 12],
    )
    ratings = from_dataframe(frame, user="uid", item="movie", rating="stars", timestamp="t")
    assert ratings.user_ids.tolist() == [7, 9] and ratings.item_ids.tolist() == ["a", "b"]
    assert ratings.users.tolist() == [0, 0, 1] and ratings.items.tolist() == [1, 0, 1]
    assert ratings.ratings.tolist() == [4.0, 3.5, 5.0] and ratings.timestamps.tolist() == [1, 2, 3]
    assert ratings.scale == RatingScale(3.5, 5.0, 0.5)
    assert ratings.load_report.fmt == "dataframe" and ratings.load_report.scale_source == "inferred"
    given = from_dataframe(frame, user="uid", item="movie", rating="stars", scale="0.5:5:0.5")
    assert given.scale == RatingScale(0.5, 5.0, 0.5) and given.timestamps is None


@pytest.mark.parametrize(
    ("columns", "options", "error", "match"),
    [
        (
            {"user": [1], "item": [2], "rating": [4]},
            {"item": "movie"},
            ValueError,
            r"unknown item column 'movie': the DataFrame's columns are 'user', 'item', 'rating'",
        ),
        (
            {"user": [1, None], "item": [2, 3], "rating": [4, 3]},
            {},
            DataFormatError,
            r"DataFrame: row 1 \(index 'b'\): missing user id",
        ),
        (
            {"user": [1, 2], "item": [2, 3], "rating": [4, "four"]},
            {},
            DataFormatError,
            r"row 1 \(index 'b'\): non-numeric rating 'four'",
        ),
        (
            {"user": [1, 2], "item": [2, 3], "rating": [4, 9]},
            {"scale": "1:5:1"},
            DataFormatError,
            r"row 1 \(index 'b'\): rating 9 is off the scale 1\.\.5 step 1: above its maximum",
        ),
        (
            {"user": [1, 1], "item": [2, 2], "rating": [4, 3]},
            {},
            DataFormatError,
            r"row 1 \(index 'b'\): duplicate rating of item 2 by user 1 \(first given on row 0 ",
        ),
        (
            {"user": [1.5, 2], "item": [2, 3], "rating": [4, 3]},
            {},
            DataFormatError,
            r"row 0 \(index 'a'\): user id 1\.5 is neither",
        ),
        (
            {"user": [1, 2], "item": [2, 3], "rating": [4, float("nan")]},
            {},
            DataFormatError,
            r"row 1 \(index 'b'\): non-finite rating 'nan'",
        ),
    ],
    ids=[
        "unknown-column",
        "missing-id",
        "text-rating",
        "off-scale",
        "duplicate",
        "float-id",
        "nan-rating",
    ],
)
def test_dataframe_errors_name_the_row(columns, options, error, match):
    pandas = pytest.importorskip("pandas")
    frame = pandas.DataFrame(columns, index=["a", "b"][: len(columns["user"])])
    with pytest.raises(error, match=match):
        from_dataframe(frame, **options)


def test_from_dataframe_refuses_what_is_no_dataframe():
    pytest.importorskip("pandas")
    with pytest.raises(TypeError, match="takes a pandas DataFrame, got dict"):
        from_dataframe({"user": [1], "item": [2], "rating": [3]})


def test_without_pandas_from_dataframe_names_the_install_and_the_package_imports():
    probe = """
import importlib.abc, sys

class NoPandas(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoPandas())
from securefed.recsys.data import from_dataframe, load_dataset  # no pandas needed here
try:
    from_dataframe(None)
except ModuleNotFoundError as error:
    print(error.name, error, sep="|")
"""
    done = subprocess.run(
        [sys.executable, "-P", "-c", probe], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    name, message = done.stdout.strip().split("|")
    assert name == "pandas" and "pip install pandas" in message


def test_pandas_is_an_optional_extra_not_a_core_dependency():
    import tomllib

    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert not any(dep.startswith("pandas") for dep in project["dependencies"])
    assert any(dep.startswith("pandas") for dep in project["optional-dependencies"]["pandas"])


def test_leak_utility_reads_a_layout_of_your_own(tmp_path, capsys):
    """``bench leak-utility`` takes --sep/--columns/--ids like ``fedmf`` (where --data is read)."""
    from securefed.bench.leak_utility import LeakUtilityConfig, load_split

    lines = ["who;what;stars"] + [
        f"u{u};m{(u * 7 + k) % 9};{1 + (u + k) % 5}" for u in range(12) for k in range(4)
    ]
    path = _write(tmp_path, "\n".join(lines) + "\n", "mine.csv")
    config = LeakUtilityConfig(
        data=str(path), sep=";", columns=("who", "what", "stars"), ids="string", rounds=2
    )
    split = load_split(config)
    assert split.train.user_ids.dtype.kind == "U" and split.train.n_users == 12
    with pytest.raises(SystemExit) as stop:
        main(["bench", "leak-utility", "--sep", ";", "--columns", "who,what,stars", "--help"])
    assert stop.value.code == 0
    shown = capsys.readouterr().out
    assert "--sep SEP" in shown and "--columns USER,ITEM,RATING[,TIMESTAMP]" in shown


def test_a_saved_view_records_the_layout_and_the_attack_rebuilds_from_it(tmp_path):
    """``--sep``/``--columns``/``--ids`` are loader options: the view records them."""
    from securefed.bench.datasets import LoaderOptions, load_with

    options = LoaderOptions(sep=";", columns=("who", "what", "stars"), ids="string")
    recorded = json.loads(json.dumps(options.to_dict()))  # as a view stores it: lists
    assert LoaderOptions.from_dict(recorded) == options
    lines = ["who;what;stars"] + [f"u{u};m{u % 5};{1 + u % 5}" for u in range(10)]
    path = _write(tmp_path, "\n".join(lines) + "\n", "mine.csv")
    assert load_with(str(path), LoaderOptions.from_dict(recorded)).train.n_users <= 10
    with pytest.raises(ValueError, match="'ids' is 'int' or 'string'"):
        LoaderOptions(ids="uuid")
