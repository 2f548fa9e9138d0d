"""Loader claims (issue 17, item 12): ids are read exactly, and every error names its real cause.

Each test replays an input that the readers got wrong: distinct ids at or above 2^53 merged into
one user (ids went through float64), an ``inf`` rating was reported as "every rating is 4", a NaN
as "off the scale" of a scale inferred without it, a data line as a header that lacks a column.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from securefed.recsys.data import (
    ML100K_SCALE,
    DataFormatError,
    load_movielens_100k,
    load_ratings,
    read_ratings_file,
    reindex,
)

BIG = 2**53  # the first integer whose successor float64 cannot hold
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def _lines(rows, separator: str) -> str:
    return "".join(separator.join(str(field) for field in row) + "\n" for row in rows)


# Two users 2^53 + 1 and 2^53 rate one item; one user rates two items 2^53 + 1 and 2^53; the
# timestamps differ by one above 2^53 too. Read through float64, each pair collapses into one.
ROWS = [
    (BIG + 1, 7, 3, BIG + 1),
    (BIG, 7, 4, BIG),
    (5, BIG + 1, 2, BIG + 3),
    (5, BIG, 1, BIG + 2),
]
EVERY_LAYOUT = [
    pytest.param("u.data", _lines(ROWS, "\t"), True, id="movielens100k"),
    pytest.param("ratings.dat", _lines(ROWS, "::"), True, id="dat"),
    pytest.param(
        "ratings.csv", "userId,movieId,rating,timestamp\n" + _lines(ROWS, ","), True, id="ml-latest"
    ),
    pytest.param("plain.csv", _lines(ROWS, ","), True, id="csv-four-columns"),
    pytest.param(
        "plain.csv", _lines([row[:3] for row in ROWS], ","), False, id="csv-three-columns"
    ),
    pytest.param(
        "header.csv",
        "user,item,rating,timestamp\n" + _lines(ROWS, ","),
        True,
        id="csv-with-header",
    ),
    # An unused text column sends the file down the line-by-line path.
    pytest.param(
        "notes.csv",
        "user,item,rating,timestamp,note\n" + _lines([(*row, "ok") for row in ROWS], ","),
        True,
        id="csv-line-by-line",
    ),
]


@pytest.mark.parametrize(("name", "text", "timed"), EVERY_LAYOUT)
def test_ids_at_or_above_2_53_stay_distinct_in_every_reader(tmp_path, name, text, timed):
    raw = read_ratings_file(_write(tmp_path, name, text))
    assert raw.users.dtype == np.int64 and raw.items.dtype == np.int64
    assert raw.users.tolist() == [row[0] for row in ROWS]
    assert raw.items.tolist() == [row[1] for row in ROWS]
    if timed:
        assert raw.timestamps.tolist() == [row[3] for row in ROWS]
    ratings = load_ratings(tmp_path / name)
    assert ratings.user_ids.tolist() == [5, BIG, BIG + 1]
    assert ratings.item_ids.tolist() == [7, BIG, BIG + 1]
    assert (ratings.n_users, ratings.n_items, len(ratings)) == (3, 3, 4)


def test_movielens_100k_splits_keep_large_ids_distinct(tmp_path):
    root = tmp_path / "ml-100k"
    root.mkdir()
    _write(root, "u.data", _lines(ROWS, "\t"))
    _write(root, "u1.base", _lines(ROWS[:2], "\t"))
    _write(root, "u1.test", _lines(ROWS[2:], "\t"))
    split = load_movielens_100k(root, "u1")
    assert split.train.user_ids.tolist() == [5, BIG, BIG + 1]
    assert split.train.users.tolist() == [2, 1] and split.test.users.tolist() == [0, 0]
    assert split.test.items.tolist() == [2, 1]
    assert split.test.timestamps.tolist() == [BIG + 3, BIG + 2]


@pytest.mark.parametrize(
    ("token", "value"),
    [
        (str(INT64_MAX), INT64_MAX),
        (str(INT64_MIN), INT64_MIN),
        (str(BIG + 2), BIG + 2),  # a float64 holds it, but it used to be "not an integer"
        (str(-(BIG + 1)), -(BIG + 1)),
        (f"{BIG + 1}.0", BIG + 1),  # integral spellings are read exactly, not through float64
        ("1e3", 1000),
    ],
)
def test_ids_are_read_exactly_up_to_the_int64_range(tmp_path, token, value):
    raw = read_ratings_file(_write(tmp_path, "x.csv", f"{token},1,3\n1,2,4\n"))
    assert raw.users.tolist() == [value, 1]


@settings(max_examples=60, deadline=None)
@given(
    ids=st.lists(
        st.tuples(st.integers(INT64_MIN, INT64_MAX), st.integers(INT64_MIN, INT64_MAX)),
        min_size=1,
        max_size=12,
        unique=True,
    ),
    suffix=st.sampled_from(["", ".0"]),  # ".0" takes the line-by-line path
)
def test_every_int64_id_round_trips_exactly(tmp_path_factory, ids, suffix):
    folder = tmp_path_factory.mktemp("ids")
    lines = [
        f"{user}{suffix},{item}{suffix},{1 + row % 2}\n" for row, (user, item) in enumerate(ids)
    ]
    raw = read_ratings_file(_write(folder, "x.csv", "".join(lines)), scale=ML100K_SCALE)
    assert raw.users.tolist() == [user for user, _ in ids]
    assert raw.items.tolist() == [item for _, item in ids]


@pytest.mark.parametrize(
    ("text", "line", "cause"),
    [
        (f"1,2,3\n{INT64_MAX + 1},3,4\n", 2, f"user '{INT64_MAX + 1}' is outside the int64 range"),
        (f"1,{INT64_MIN - 1},3\n1,3,4\n", 1, f"item '{INT64_MIN - 1}' is outside the int64 range"),
        ("1,2,3,1e40\n1,3,4,1\n", 1, "timestamp '1e40' is outside the int64 range"),
        # float64 rounds this to 1.0; read exactly it is not a whole number.
        ("1.0000000000000001,2,3\n2,2,4\n", 1, "user '1.0000000000000001' is not an integer"),
        (f"{BIG + 1}.5,2,3\n2,2,4\n", 1, f"user '{BIG + 1}.5' is not an integer"),
    ],
)
def test_ids_that_are_no_int64_name_why(tmp_path, text, line, cause):
    path = _write(tmp_path, "x.csv", text)
    with pytest.raises(DataFormatError) as caught:
        read_ratings_file(path)
    assert (caught.value.line, caught.value.cause) == (line, cause)


def test_negative_ids_are_read_exactly_and_kept_apart(tmp_path):
    text = f"-1,2,3\n1,2,4\n{-(BIG + 1)},2,5\n{-BIG},2,1\n"
    ratings = load_ratings(_write(tmp_path, "x.csv", text))
    assert ratings.user_ids.tolist() == [-(BIG + 1), -BIG, -1, 1]
    assert ratings.users.tolist() == [2, 3, 0, 1]


def test_reindex_refuses_ids_it_cannot_hold_exactly():
    with pytest.raises(TypeError, match="float64"):
        reindex(np.array([1.5, 2.0]), np.array([0, 0]))
    with pytest.raises(TypeError, match="float64"):
        reindex(np.array([0, 1]), np.array([float(BIG), float(BIG + 2)]))
    with pytest.raises(ValueError, match="int64 range"):
        reindex(np.array([2**63], dtype=np.uint64), np.array([0]))
    with pytest.raises(ValueError, match="int64 range"):
        reindex([1], [2**64])
    users, _, user_ids, _ = reindex(np.array([BIG + 1, BIG], dtype=np.uint64), [0, 0])
    assert user_ids.tolist() == [BIG, BIG + 1] and users.tolist() == [1, 0]
    assert reindex([], [])[2].dtype == np.int64


NON_FINITE = [
    pytest.param("x.csv", "1,2,4\n1,3,inf\n", 2, "inf", id="inf-was-every-rating-is-4"),
    pytest.param("x.csv", "1,2,3\n1,3,nan\n1,4,4\n", 2, "nan", id="nan-was-off-inferred-scale"),
    pytest.param("x.csv", "1,2,NaN\n1,3,inf\n", 1, "NaN", id="no-finite-rating-had-no-line"),
    pytest.param("x.csv", "1,2,4\n1,3,-inf\n1,4,5\n", 2, "-inf", id="minus-inf"),
    pytest.param("u.data", "1\t2\t3\t1\n1\t3\tnan\t2\n", 2, "nan", id="movielens100k-nan"),
    pytest.param("ratings.dat", "1::2::Infinity::5\n", 1, "Infinity", id="dat-infinity"),
    pytest.param(
        "ratings.csv",
        "userId,movieId,rating,timestamp\n1,2,4,5\n\n1,3,inf,6\n",
        4,
        "inf",
        id="ml-latest-inf",
    ),
]


@pytest.mark.parametrize(("name", "text", "line", "token"), NON_FINITE)
def test_a_non_finite_rating_is_named_with_its_line(tmp_path, name, text, line, token):
    path = _write(tmp_path, name, text)
    with pytest.raises(DataFormatError) as caught:
        load_ratings(path)
    assert str(caught.value) == f"{path}, line {line}: non-finite rating {token!r}"
    assert caught.value.line == line


def test_a_non_finite_rating_is_named_also_with_a_given_scale(tmp_path):
    path = _write(tmp_path, "x.csv", "1,2,4\n1,3,inf\n")
    with pytest.raises(DataFormatError, match=r"line 2: non-finite rating 'inf'$"):
        read_ratings_file(path, scale=ML100K_SCALE)


def test_a_single_rating_value_is_still_named_as_such(tmp_path):
    path = _write(tmp_path, "x.csv", "1,2,4\n1,3,4\n")
    with pytest.raises(DataFormatError, match="every rating is 4, so no scale can be inferred"):
        load_ratings(path)


def test_a_data_line_with_a_text_id_is_not_taken_for_a_header(tmp_path):
    path = _write(tmp_path, "x.csv", "alice,1,5\nbob,2,4\n")
    with pytest.raises(DataFormatError) as caught:
        load_ratings(path)
    assert (caught.value.line, caught.value.cause) == (1, "non-numeric user field 'alice'")


def test_ml_latest_without_its_header_says_so_even_when_the_first_field_is_text(tmp_path):
    path = _write(tmp_path, "x.csv", "alice,31,2.5,100\n")
    with pytest.raises(DataFormatError) as caught:
        read_ratings_file(path, fmt="ml-latest")
    assert caught.value.line == 1
    assert caught.value.cause == "missing header line 'userId,movieId,rating,timestamp'"


@pytest.mark.parametrize(
    ("name", "text", "column"),
    [
        ("x.csv", "user,item,rating,user\n1,2,3,4\n", "user"),
        ("ratings.csv", "userId,movieId,rating,MovieID\n1,2,3,4\n", "movieId"),
    ],
)
def test_a_header_naming_a_column_twice_is_refused(tmp_path, name, text, column):
    path = _write(tmp_path, name, text)
    with pytest.raises(DataFormatError) as caught:
        read_ratings_file(path)
    assert caught.value.line == 1
    assert caught.value.cause.startswith(f"header names the column {column!r} twice")


def test_a_header_lacking_a_column_shows_what_it_found(tmp_path):
    path = _write(tmp_path, "x.csv", "user;item;rating\n1;2;3\n")
    with pytest.raises(DataFormatError) as caught:
        read_ratings_file(path)
    assert caught.value.cause == (
        "header lacks the column 'user' (expected user,item,rating[,timestamp], comma "
        "separated; found 'user;item;rating')"
    )
