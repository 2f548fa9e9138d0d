"""Rating files as they really come (issue 20): whitespace separated, repeated pairs under a stated
policy, a stated scale, and the message for a file whose format is not recognised."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from securefed.bench.cli import main
from securefed.recsys.data import (
    DUPLICATE_POLICIES,
    FORMAT_DESCRIPTIONS,
    ML100K_SCALE,
    DataFormatError,
    RatingScale,
    load_dataset,
    read_ratings_file,
)


def _write(folder: Path, name: str, content: str) -> Path:
    path = folder / name
    path.write_text(content, encoding="utf-8")
    return path


# ------------------------------------------------------------------------------ whitespace


@pytest.mark.parametrize(
    "content",
    [
        "1 10 4\n2 10 3\n1 11 5\n",  # single spaces
        "1   10    4\n2  10 3\n1 11     5\n",  # runs of spaces
        "1\t10\t4\n2\t10\t3\n1\t11\t5\n",  # tabs, three fields
        "1 \t 10\t\t4\n  2 10 3  \n1\t 11 5\r\n",  # mixed runs, leading and trailing blanks, CRLF
    ],
    ids=["spaces", "space-runs", "tabs-3-fields", "mixed"],
)
def test_whitespace_files_split_on_any_run_of_spaces_or_tabs(tmp_path, content):
    raw = read_ratings_file(_write(tmp_path, "ratings.txt", content))
    assert raw.fmt == "whitespace"
    assert raw.users.tolist() == [1, 2, 1]
    assert raw.items.tolist() == [10, 10, 11]
    assert raw.ratings.tolist() == [4.0, 3.0, 5.0]
    assert raw.timestamps is None
    assert raw.report.fmt == "whitespace" and raw.report.data_lines == 3


def test_whitespace_with_header_and_timestamps_in_any_column_order(tmp_path):
    content = "timestamp  rating user item\n100 4.5 1 10\n101   2 2 10\n"
    raw = read_ratings_file(_write(tmp_path, "ratings.txt", content))
    assert raw.fmt == "whitespace" and raw.report.header
    assert raw.users.tolist() == [1, 2] and raw.items.tolist() == [10, 10]
    assert raw.ratings.tolist() == [4.5, 2.0] and raw.timestamps.tolist() == [100, 101]
    assert raw.scale == RatingScale(2.0, 4.5, 0.5)  # inferred, as for plain csv


def test_whitespace_format_can_be_forced_and_names_a_bad_line(tmp_path):
    path = _write(tmp_path, "data.log", "1 10 4 7\n2 10 3 8 9\n")
    with pytest.raises(DataFormatError) as caught:
        read_ratings_file(path, fmt="whitespace")
    assert caught.value.line == 2
    assert caught.value.cause == "too many fields: expected 4, found 5"
    short = _write(tmp_path, "short.txt", "1 10\n")
    with pytest.raises(DataFormatError, match=r"too few fields: expected 3 or 4 \(user item"):
        read_ratings_file(short, fmt="whitespace")


def test_tab_separated_movielens_lines_keep_their_format(tmp_path):
    raw = read_ratings_file(_write(tmp_path, "x.tsv", "196\t242\t3\t881250949\n186\t302\t1\t9\n"))
    assert raw.fmt == "movielens100k" and raw.scale == ML100K_SCALE
    assert raw.report.scale_source == "format"


def test_a_whitespace_file_loads_through_load_dataset(tmp_path):
    lines = [f"{u} {i} {1 + (u + i) % 5}" for u in range(1, 11) for i in range(1, 6)]
    split = load_dataset(_write(tmp_path, "r.txt", "\n".join(lines) + "\n"), test_fraction=0.2)
    assert len(split.train) + len(split.test) == 50
    assert split.train.load_report.fmt == "whitespace"
    assert split.train.load_report is split.test.load_report


# ------------------------------------------------------------------------------ duplicates

_REPEATS = "1,10,4,100\n2,10,3,101\n1,10,5,102\n1,11,2,103\n1,10,4,100\n"
"""User 1 rates item 10 on lines 1, 3 and 5 (line 5 repeats line 1 exactly)."""


def test_repeated_pairs_are_an_error_naming_both_lines_by_default(tmp_path):
    path = _write(tmp_path, "x.csv", _REPEATS)
    for call in (lambda: read_ratings_file(path), lambda: load_dataset(path)):
        with pytest.raises(DataFormatError) as caught:
            call()
        assert caught.value.line == 3
        assert caught.value.cause.startswith(
            "duplicate rating of item 10 by user 1 (first given on line 1); pass "
            "duplicates='first', 'last' or 'mean' (--duplicates)"
        )


@pytest.mark.parametrize(
    ("policy", "rating", "timestamp"),
    [("first", 4.0, 100), ("last", 4.0, 100), ("mean", 4.0, 102)],
)
def test_each_duplicates_policy(tmp_path, policy, rating, timestamp):
    raw = read_ratings_file(_write(tmp_path, "x.csv", _REPEATS), duplicates=policy)
    pairs = list(zip(raw.users.tolist(), raw.items.tolist(), strict=True))
    assert sorted(pairs) == [(1, 10), (1, 11), (2, 10)]
    at = pairs.index((1, 10))
    assert raw.ratings[at] == rating and raw.timestamps[at] == timestamp
    report = raw.report
    assert report.duplicates == policy
    assert (report.data_lines, report.ratings) == (5, 3)
    assert report.repeated_pairs == 2 and report.exact_repeats == 1
    assert report.rounded_means == (1 if policy == "mean" else 0)  # mean of 4, 5, 4: 4.33
    assert "2 repeated (user, item) pairs" in report.summary()
    assert "1 exact repeated lines" in report.summary()


def test_first_and_last_keep_different_lines_in_file_order(tmp_path):
    path = _write(tmp_path, "x.csv", "1,10,2,100\n2,10,3,101\n1,10,5,102\n")
    first = read_ratings_file(path, duplicates="first")
    last = read_ratings_file(path, duplicates="last")
    assert first.ratings.tolist() == [2.0, 3.0] and first.timestamps.tolist() == [100, 101]
    assert last.ratings.tolist() == [3.0, 5.0] and last.timestamps.tolist() == [101, 102]


def test_mean_rounds_between_levels_halves_up_and_keeps_the_scale(tmp_path):
    path = _write(tmp_path, "x.csv", "1,10,3\n1,10,4\n2,10,1\n2,11,5\n2,11,5\n")
    raw = read_ratings_file(path, duplicates="mean", scale=ML100K_SCALE)
    assert raw.ratings.tolist() == [4.0, 1.0, 5.0]  # 3.5 rounds up; 5 and 5 stay 5
    assert raw.report.rounded_means == 1 and raw.report.exact_repeats == 1
    half = read_ratings_file(path, duplicates="mean", scale=RatingScale(0.5, 5, 0.5))
    assert half.ratings.tolist() == [3.5, 1.0, 5.0] and half.report.rounded_means == 0


def test_exact_repeats_without_conflict_are_counted_too(tmp_path):
    raw = read_ratings_file(_write(tmp_path, "x.csv", "1,1,3\n1,1,3\n2,1,4\n"), duplicates="first")
    assert raw.report.repeated_pairs == 1 and raw.report.exact_repeats == 1
    assert raw.ratings.tolist() == [3.0, 4.0]


def test_unknown_duplicates_policy_is_refused(tmp_path):
    path = _write(tmp_path, "x.csv", "1,1,3\n2,1,4\n")
    with pytest.raises(ValueError, match="unknown duplicates policy 'average'"):
        read_ratings_file(path, duplicates="average")
    assert DUPLICATE_POLICIES == ("error", "first", "last", "mean")


def test_load_dataset_applies_the_policy(tmp_path):
    lines = [f"{u},{i},{1 + (u * i) % 5}" for u in range(1, 9) for i in range(1, 6)]
    lines.append("1,1,5")  # repeats the pair (1, 1), first rated 2
    split = load_dataset(_write(tmp_path, "x.csv", "\n".join(lines) + "\n"), duplicates="last")
    assert len(split.train) + len(split.test) == 40
    assert split.train.load_report.repeated_pairs == 1
    both = [split.train, split.test]
    ratings = {
        (int(r.user_ids[u]), int(r.item_ids[i])): v
        for r in both
        for u, i, v in zip(r.users, r.items, r.ratings, strict=True)
    }
    assert ratings[(1, 1)] == 5.0


# ------------------------------------------------------------------------------ stated scale


def test_scale_parses_min_max_step():
    assert RatingScale.parse("0.5:4:0.5") == RatingScale(0.5, 4.0, 0.5)
    assert RatingScale.parse(" 1:10:1 ") == RatingScale(1.0, 10.0, 1.0)
    for text, message in (
        ("1:5", "written MIN:MAX:STEP"),
        ("a:b:c", "written MIN:MAX:STEP"),
        ("1:5:1:1", "written MIN:MAX:STEP"),
        ("1:4:0.7", "not a whole number of steps"),
        ("5:1:1", "must be greater than minimum"),
    ):
        with pytest.raises(ValueError, match=message):
            RatingScale.parse(text)


def test_a_stated_scale_replaces_the_inferred_one(tmp_path):
    path = _write(tmp_path, "x.csv", "1,1,1\n1,2,3.5\n2,1,2\n")
    assert read_ratings_file(path).scale == RatingScale(1.0, 3.5, 0.5)  # inferred
    raw = read_ratings_file(path, scale=RatingScale.parse("0.5:4:0.5"))
    assert raw.scale == RatingScale(0.5, 4.0, 0.5) and raw.report.scale_source == "given"
    split = load_dataset(path, scale="0.5:4:0.5", test_fraction=0.34)
    assert split.train.scale == RatingScale(0.5, 4.0, 0.5)


@pytest.mark.parametrize(
    ("content", "line", "cause"),
    [
        ("1,1,1\n1,2,4.5\n", 2, "rating 4.5 is off the scale 0.5..4 step 0.5: above its maximum"),
        ("1,1,0\n", 1, "rating 0 is off the scale 0.5..4 step 0.5: below its minimum"),
        ("1,1,1\n2,2,2.25\n", 2, "rating 2.25 is off the scale 0.5..4 step 0.5: between two"),
    ],
    ids=["above", "below", "off-grid"],
)
def test_ratings_off_the_stated_scale_name_the_line(tmp_path, content, line, cause):
    path = _write(tmp_path, "x.csv", content)
    with pytest.raises(DataFormatError) as caught:
        load_dataset(path, scale="0.5:4:0.5")
    assert caught.value.line == line
    assert caught.value.cause.startswith(cause)


def test_a_stated_scale_overrides_the_formats_own(tmp_path):
    path = _write(tmp_path, "u.data", "1\t1\t4.5\t9\n2\t1\t1\t9\n")
    with pytest.raises(DataFormatError, match=r"off the scale 1\.\.5 step 1"):
        read_ratings_file(path)
    raw = read_ratings_file(path, scale=RatingScale.parse("0.5:5:0.5"))
    assert raw.ratings.tolist() == [4.5, 1.0]


# ------------------------------------------------------------------------------ header message


@pytest.mark.parametrize("first_line", ["1;2;3", "1|2|3", "7;8;4.5;881250949"])
def test_a_data_line_taken_for_a_header_says_the_format_was_not_recognised(tmp_path, first_line):
    path = _write(tmp_path, "x.csv", f"{first_line}\n1;3;4\n")
    for fmt in ("auto", "csv", "ml-latest"):
        with pytest.raises(DataFormatError) as caught:
            read_ratings_file(path, fmt=fmt)
        cause = caught.value.cause
        assert caught.value.line == 1
        assert cause.startswith(f"format not recognised: the first line {first_line!r}")
        assert "header lacks" not in cause
        for name, description in FORMAT_DESCRIPTIONS.items():
            assert f"{name}: {description}" in cause


def test_a_real_header_lacking_a_column_keeps_its_message(tmp_path):
    path = _write(tmp_path, "x.csv", "uid,iid,score\n1,2,3\n")
    with pytest.raises(DataFormatError) as caught:
        read_ratings_file(path)
    assert caught.value.cause == (
        "header lacks the column 'user' (expected user,item,rating[,timestamp], comma "
        "separated; found 'uid,iid,score')"
    )
    spaced = _write(tmp_path, "y.txt", "uid iid score\n1 2 3\n")
    with pytest.raises(DataFormatError, match="whitespace separated; found 'uid iid score'"):
        read_ratings_file(spaced)


# ------------------------------------------------------------------------------ command line


def test_cli_reads_duplicates_and_scale_and_prints_the_load_report(tmp_path, capsys):
    rng = np.random.default_rng(0)
    lines = [
        f"{u}\t{i}  {rng.integers(1, 9) / 2}"
        for u in range(1, 21)
        for i in rng.choice(40, 8, replace=False) + 1
    ]
    lines += [lines[0], lines[1].rsplit(" ", 1)[0] + " 0.5"]  # an exact repeat, a conflict
    path = _write(tmp_path, "ratings.txt", "\n".join(lines) + "\n")
    base = ["fedmf", "--data", str(path), "--rounds", "1", "--no-progress", "--dim", "2"]
    assert main(base) == 2
    assert "duplicate rating of item" in capsys.readouterr().err
    assert main([*base, "--duplicates", "last", "--scale", "0.5:4:0.5"]) == 0
    err = capsys.readouterr().err
    assert "whitespace, 162 lines, 160 ratings, scale 0.5..4 step 0.5 (given)" in err
    assert "2 repeated (user, item) pairs resolved by duplicates='last'" in err
    assert "1 exact repeated lines" in err
    assert main([*base, "--duplicates", "first", "--scale", "1:4:1"]) == 2
    assert "is off the scale 1..4 step 1: between two of its levels" in capsys.readouterr().err
