"""Tests of the rating data layer (securefed.recsys.data): readers, errors, splits, synthetic
data."""

from __future__ import annotations

import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from securefed.recsys.data import (
    ML100K_SCALE,
    ML_LATEST_SCALE,
    DataFormatError,
    Ratings,
    RatingScale,
    Split,
    embedded_default_path,
    load_dataset,
    load_movielens_100k,
    load_ratings,
    random_split,
    read_ratings_file,
    reindex,
    synthetic_ratings,
    temporal_split,
)

REPO_ROOT = Path(__file__).resolve().parents[1]


def _ml100k_dir() -> Path | None:
    """Locate MovieLens 100K via $SECUREFED_DATA or ../shared/data next to the repository."""
    base = os.environ.get("SECUREFED_DATA")
    root = Path(base) if base else REPO_ROOT.parent / "shared" / "data"
    folder = root / "ml-100k"
    return folder if (folder / "u.data").is_file() else None


def _write(folder: Path, name: str, content: str | bytes) -> Path:
    path = folder / name
    if isinstance(content, str):
        content = content.encode("utf-8")
    path.write_bytes(content)
    return path


def _ratings(users, items, values, timestamps=None, n_users=None, n_items=None, scale=None):
    users = np.asarray(users, dtype=np.int32)
    items = np.asarray(items, dtype=np.int32)
    n_users = int(users.max()) + 1 if n_users is None else n_users
    n_items = int(items.max()) + 1 if n_items is None else n_items
    return Ratings(
        users=users,
        items=items,
        ratings=np.asarray(values, dtype=np.float64),
        timestamps=None if timestamps is None else np.asarray(timestamps, dtype=np.int64),
        n_users=n_users,
        n_items=n_items,
        scale=ML100K_SCALE if scale is None else scale,
        user_ids=np.arange(n_users) + 100,
        item_ids=np.arange(n_items) + 1000,
        name="toy",
    )


# --------------------------------------------------------------------------------------
# RatingScale
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("minimum", "maximum", "step", "error"),
    [
        (1.0, 5.0, 0.0, ValueError),
        (1.0, 5.0, -1.0, ValueError),
        (5.0, 1.0, 1.0, ValueError),
        (1.0, 1.0, 1.0, ValueError),
        (1.0, 5.0, 1.5, ValueError),
        (float("nan"), 5.0, 1.0, ValueError),
        (1.0, float("inf"), 1.0, ValueError),
        ("1", 5.0, 1.0, TypeError),
    ],
)
def test_rating_scale_rejects_invalid_grids(minimum, maximum, step, error):
    with pytest.raises(error):
        RatingScale(minimum, maximum, step)


def test_standard_scales():
    assert ML100K_SCALE.levels.tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert ML_LATEST_SCALE.levels.tolist() == [0.5 * k for k in range(1, 11)]
    assert str(ML_LATEST_SCALE) == "0.5..5 step 0.5"
    assert RatingScale(0, 1, 0.1).n_levels == 11  # 1/0.1 is integral within tolerance


def test_rating_scale_contains_clip_snap():
    scale = ML_LATEST_SCALE
    values = np.array([0.5, 0.75, 5.0, 5.5, 0.0, np.nan, np.inf, 3.0 + 1e-12])
    assert scale.contains(values).tolist() == [True, False, True, False, False, False, False, True]
    assert scale.clip([-1.0, 2.2, 9.0]).tolist() == [0.5, 2.2, 5.0]
    assert scale.snap([-1.0, 2.2, 2.3, 9.0, 4.74]).tolist() == [0.5, 2.0, 2.5, 5.0, 4.5]
    assert np.isnan(scale.snap([np.nan])[0])


@settings(max_examples=200, deadline=None)
@given(
    minimum=st.integers(-20, 20).map(lambda k: k * 0.25),
    n_steps=st.integers(1, 40),
    step=st.sampled_from([0.1, 0.25, 0.5, 1.0, 2.0, 0.3]),
    values=st.lists(
        st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False), min_size=1, max_size=30
    ),
)
def test_snap_is_idempotent_and_lands_on_levels(minimum, n_steps, step, values):
    scale = RatingScale(minimum, minimum + n_steps * step, step)
    snapped = scale.snap(values)
    assert np.isin(snapped, scale.levels).all()
    assert scale.contains(snapped).all()
    np.testing.assert_array_equal(scale.snap(snapped), snapped)
    # Snapping never moves a value by more than half a step unless it was out of range.
    inside = (np.asarray(values) >= scale.minimum) & (np.asarray(values) <= scale.maximum)
    assert np.all(np.abs(snapped - values)[inside] <= step / 2 + 1e-9)


# --------------------------------------------------------------------------------------
# Ratings and Split containers
# --------------------------------------------------------------------------------------


def test_ratings_coerces_dtypes_and_reports_size():
    ratings = _ratings([0, 1, 1], [2, 0, 1], [5, 3, 1], timestamps=[3, 2, 1])
    assert ratings.users.dtype == np.int32 and ratings.items.dtype == np.int32
    assert ratings.ratings.dtype == np.float64 and ratings.timestamps.dtype == np.int64
    assert len(ratings) == 3
    assert ratings.nbytes == 3 * (4 + 4 + 8 + 8)
    assert _ratings([0], [0], [1]).nbytes == 4 + 4 + 8


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"users": [0, 1], "items": [0], "values": [1]}, "equal lengths"),
        ({"users": [0, 5], "items": [0, 1], "values": [1, 2], "n_users": 2}, r"\[0, 2\)"),
        ({"users": [0, 1], "items": [0, 1], "values": [1, np.nan]}, "NaN"),
        ({"users": [0, 1], "items": [0, 1], "values": [1, 2.5]}, "off the scale"),
        ({"users": [0, 1, 0], "items": [1, 0, 1], "values": [1, 2, 3]}, "rows 0 and 2"),
    ],
)
def test_ratings_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        _ratings(**kwargs)


def test_ratings_rejects_float_indices():
    with pytest.raises(TypeError):
        Ratings(
            users=np.array([0.0]),
            items=np.array([0]),
            ratings=np.array([1.0]),
            timestamps=None,
            n_users=1,
            n_items=1,
            scale=ML100K_SCALE,
            user_ids=np.array([7]),
            item_ids=np.array([8]),
        )


def test_subset_keeps_index_space():
    ratings = _ratings([0, 1, 2, 2], [0, 1, 0, 3], [1, 2, 3, 4], timestamps=[1, 2, 3, 4])
    by_mask = ratings.subset(np.array([True, False, False, True]))
    by_index = ratings.subset(np.array([3, 0]))
    assert by_mask.users.tolist() == [0, 2] and by_mask.ratings.tolist() == [1, 4]
    assert by_index.items.tolist() == [3, 0] and by_index.timestamps.tolist() == [4, 1]
    for part in (by_mask, by_index, ratings.subset(np.array([], dtype=int))):
        assert (part.n_users, part.n_items) == (3, 4)
        assert part.user_ids is ratings.user_ids and part.scale == ratings.scale
    with pytest.raises(ValueError):
        ratings.subset(np.array([True, False]))


def test_to_csr_matches_dense_matrix():
    ratings = _ratings([2, 0, 1, 0], [1, 3, 0, 0], [5, 4, 3, 2], n_users=4, n_items=5)
    matrix = ratings.to_csr()
    dense = np.zeros((4, 5))
    dense[ratings.users, ratings.items] = ratings.ratings
    assert matrix.shape == (4, 5)
    assert matrix.has_sorted_indices
    np.testing.assert_array_equal(matrix.toarray(), dense)


def test_split_requires_one_index_space():
    ratings = _ratings([0, 1], [0, 1], [1, 2])
    other = _ratings([0, 1], [0, 1], [1, 2], n_items=3)
    Split(ratings.subset([0]), ratings.subset([1]))
    with pytest.raises(ValueError, match="index space"):
        Split(ratings, other)
    with pytest.raises(ValueError, match="scale"):
        Split(ratings, _ratings([0, 1], [0, 1], [1, 2], scale=ML_LATEST_SCALE))


def test_reindex_maps_sorted_ids_to_dense_indices():
    users, items, user_ids, item_ids = reindex([30, 10, 30, 20], [7, 7, 9, 5])
    assert user_ids.tolist() == [10, 20, 30] and item_ids.tolist() == [5, 7, 9]
    assert users.tolist() == [2, 0, 2, 1] and items.tolist() == [1, 1, 2, 0]
    assert users.dtype == np.int32 and user_ids.dtype == np.int64


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(-50, 50), st.integers(0, 10**12)), min_size=1))
def test_reindex_round_trips(pairs):
    raw_users, raw_items = (np.array(column) for column in zip(*pairs, strict=True))
    users, items, user_ids, item_ids = reindex(raw_users, raw_items)
    np.testing.assert_array_equal(user_ids[users], raw_users)
    np.testing.assert_array_equal(item_ids[items], raw_items)
    assert np.all(np.diff(user_ids) > 0) and np.all(np.diff(item_ids) > 0)


# --------------------------------------------------------------------------------------
# File formats
# --------------------------------------------------------------------------------------


def test_reads_movielens_100k_layout(tmp_path):
    path = _write(tmp_path, "u.data", "196\t242\t3\t881250949\n186\t302\t3\t891717742\n")
    raw = read_ratings_file(path)
    assert raw.fmt == "movielens100k" and raw.scale == ML100K_SCALE
    assert raw.users.tolist() == [196, 186] and raw.items.tolist() == [242, 302]
    assert raw.timestamps.tolist() == [881250949, 891717742]
    assert read_ratings_file(_write(tmp_path, "u3.test", "1\t2\t5\t9\n")).fmt == "movielens100k"


def test_reads_dat_layout(tmp_path):
    path = _write(tmp_path, "ratings.dat", "1::1193::5::978300760\n1::661::3::978302109\n")
    ratings = load_ratings(path)
    assert ratings.scale == ML100K_SCALE and ratings.name == tmp_path.name
    assert ratings.item_ids.tolist() == [661, 1193]
    assert ratings.items.tolist() == [1, 0] and ratings.ratings.tolist() == [5.0, 3.0]


def test_reads_ml_latest_layout_with_crlf_and_bom(tmp_path):
    text = "\ufeffuserId,movieId,rating,timestamp\r\n1,31,2.5,1260759144\r\n2,31,3,1260759179\r\n"
    raw = read_ratings_file(_write(tmp_path, "ratings.csv", text))
    assert raw.fmt == "ml-latest" and raw.scale == ML_LATEST_SCALE
    assert raw.ratings.tolist() == [2.5, 3.0]
    assert raw.timestamps.tolist() == [1260759144, 1260759179]


def test_ml_latest_header_columns_may_be_reordered(tmp_path):
    text = "movieId,timestamp,userId,rating\n31,100,7,4.5\n"
    raw = read_ratings_file(_write(tmp_path, "ratings.csv", text))
    assert (raw.users[0], raw.items[0], raw.ratings[0], raw.timestamps[0]) == (7, 31, 4.5, 100)


def test_reads_plain_csv_with_header_and_without(tmp_path):
    with_header = _write(tmp_path, "a.csv", "User, Item ,rating\n5,6,2\n5,7,4\n")
    raw = read_ratings_file(with_header)
    assert raw.fmt == "csv" and raw.timestamps is None
    assert raw.scale == RatingScale(2, 4, 1)
    three = read_ratings_file(_write(tmp_path, "b.csv", "1,2,1.5\n1,3,4\n"))
    assert three.timestamps is None and three.scale == RatingScale(1.5, 4, 0.5)
    four = read_ratings_file(_write(tmp_path, "c.csv", "1,2,1,10\n\n1,3,10,11\n"))
    assert four.timestamps.tolist() == [10, 11] and four.scale == RatingScale(1, 10, 1)


def test_plain_csv_uses_given_scale(tmp_path):
    path = _write(tmp_path, "d.csv", "1,2,3\n2,2,4\n")
    assert read_ratings_file(path, scale=ML100K_SCALE).scale == ML100K_SCALE
    with pytest.raises(DataFormatError, match=re.escape("off the scale 0.5..2 step 0.5")):
        read_ratings_file(path, scale=RatingScale(0.5, 2, 0.5))


def test_explicit_format_and_unknown_format(tmp_path):
    path = _write(tmp_path, "mine.txt", "1 2 3 4\n")
    assert read_ratings_file(path, fmt="movielens100k").users.tolist() == [1]
    with pytest.raises(ValueError, match="unknown format"):
        read_ratings_file(path, fmt="parquet")


def test_whitespace_only_lines_are_skipped_and_counted(tmp_path):
    path = _write(tmp_path, "e.csv", "1,2,3\n   \n1,3,4\n\t\n1,4,x\n")
    with pytest.raises(DataFormatError) as caught:
        read_ratings_file(path)
    assert caught.value.line == 5
    assert read_ratings_file(_write(tmp_path, "f.csv", "1,2,3\n  \n1,3,4\n")).users.size == 2


# --------------------------------------------------------------------------------------
# Malformed input
# --------------------------------------------------------------------------------------

_HEADER = "userId,movieId,rating,timestamp\n"

MALFORMED = [
    pytest.param(
        "ratings.csv",
        _HEADER + "1,10,4.0,100\n1,11,3.5\n",
        3,
        "too few fields: expected 4, found 3",
        id="too-few-fields",
    ),
    pytest.param(
        "u.data",
        "1\t2\t3\t100\n1\t3\t4\t101\t7\n",
        2,
        "too many fields: expected 4, found 5",
        id="too-many-fields",
    ),
    pytest.param(
        "x.csv", "1,2\n", 1, "too few fields: expected 3 or 4", id="csv-first-line-too-short"
    ),
    pytest.param(
        "u.data",
        "1\t2\t3\t100\n1\t3\tfour\t101\n",
        2,
        "non-numeric rating field 'four'",
        id="non-numeric",
    ),
    pytest.param(
        "ratings.dat", "1::2::3::4\n1::x1::3::5\n", 2, "non-numeric item field 'x1'", id="dat-text"
    ),
    pytest.param(
        "x.csv", "1,2,3\n1.5,3,4\n", 2, "user '1.5' is not an integer", id="fractional-id"
    ),
    pytest.param(
        "ratings.csv",
        _HEADER + "1,10,4.0,100\n2,10,5.0,100\n3,11,7.0,100\n",
        4,
        "rating 7.0 is off the scale 0.5..5 step 0.5",
        id="off-scale",
    ),
    pytest.param(
        "u.data",
        "1\t2\t3\t1\n1\t3\tnan\t2\n",
        2,
        "non-finite rating 'nan'",
        id="nan",
    ),
    pytest.param(
        "ratings.dat",
        "1::2::3::10\n1::3::4::11\n\n1::2::5::12\n",
        4,
        "duplicate rating of item 2 by user 1 (first given on line 1)",
        id="duplicate-pair",
    ),
    pytest.param("u.data", "", None, "empty file", id="empty"),
    pytest.param("u.data", "\n \n", None, "empty file", id="blank"),
    pytest.param("ratings.csv", _HEADER, None, "no ratings", id="header-only"),
    pytest.param(
        "x.csv",
        b"1,2,3\n1,3,4\n1,4,\xff5\n",
        3,
        "not valid UTF-8: byte 0xff at column 5",
        id="bad-utf8",
    ),
    pytest.param(
        "ratings.csv",
        "userId,rating,timestamp\n1,4,100\n",
        1,
        "header lacks the column 'movieId'",
        id="ml-latest-missing-column",
    ),
    pytest.param(
        "x.csv",
        "user,item,timestamp\n1,2,100\n",
        1,
        "header lacks the column 'rating'",
        id="csv-missing-column",
    ),
    pytest.param(
        "x.csv",
        "1,2,3.7\n1,3,4\n",
        1,
        "rating 3.7 is neither a whole nor a half number",
        id="scale-not-inferable",
    ),
    pytest.param("x.csv", "1,2,4\n1,3,4\n", None, "every rating is 4", id="single-rating-value"),
]


@pytest.mark.parametrize(("name", "content", "line", "cause"), MALFORMED)
def test_malformed_files_name_file_line_and_cause(tmp_path, name, content, line, cause):
    path = _write(tmp_path, name, content)
    with pytest.raises(DataFormatError) as caught:
        load_ratings(path)
    error = caught.value
    assert error.line == line
    assert Path(error.path).name == name
    assert cause in error.cause
    where = str(path) if line is None else f"{path}, line {line}"
    assert str(error) == f"{where}: {error.cause}"
    assert isinstance(error, ValueError)


def test_ml_latest_requires_its_header(tmp_path):
    path = _write(tmp_path, "plain.csv", "1,2,3,4\n")
    with pytest.raises(DataFormatError, match="line 1: missing header line"):
        read_ratings_file(path, fmt="ml-latest")


def test_data_format_error_pickles():
    error = DataFormatError("ratings.csv", 17, "rating 7.0 is off the scale 0.5..5 step 0.5")
    assert str(error) == "ratings.csv, line 17: rating 7.0 is off the scale 0.5..5 step 0.5"
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.path, copy.line, copy.cause, str(copy)) == (
        error.path,
        error.line,
        error.cause,
        str(error),
    )


def test_missing_file_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_ratings(tmp_path / "absent.csv")


# --------------------------------------------------------------------------------------
# Splits
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def synthetic():
    return synthetic_ratings(300, 200, 6000, seed=3)


def test_random_split_is_deterministic_disjoint_and_covering(synthetic):
    first = random_split(synthetic, 0.2, np.random.default_rng(5))
    again = random_split(synthetic, 0.2, np.random.default_rng(5))
    other = random_split(synthetic, 0.2, np.random.default_rng(6))
    assert len(first.test) == 1200 and len(first.train) == 4800
    np.testing.assert_array_equal(first.test.users, again.test.users)
    np.testing.assert_array_equal(first.test.items, again.test.items)
    assert not np.array_equal(first.test.items, other.test.items)
    n_items = synthetic.n_items
    train_keys = first.train.users.astype(np.int64) * n_items + first.train.items
    test_keys = first.test.users.astype(np.int64) * n_items + first.test.items
    all_keys = synthetic.users.astype(np.int64) * n_items + synthetic.items
    assert np.intersect1d(train_keys, test_keys).size == 0
    np.testing.assert_array_equal(
        np.sort(np.concatenate([train_keys, test_keys])), np.sort(all_keys)
    )
    with pytest.raises(ValueError):
        random_split(synthetic, 1.0, np.random.default_rng(0))


def test_temporal_split_holds_out_each_users_latest(synthetic):
    split = temporal_split(synthetic, 0.25)
    counts = np.bincount(synthetic.users, minlength=synthetic.n_users)
    test_counts = np.bincount(split.test.users, minlength=synthetic.n_users)
    expected = np.minimum(np.floor(0.25 * counts + 0.5), counts - 1)
    np.testing.assert_array_equal(test_counts, expected)
    for user in range(synthetic.n_users):
        held = split.test.timestamps[split.test.users == user]
        kept = split.train.timestamps[split.train.users == user]
        assert kept.size >= 1
        if held.size:
            assert held.min() > kept.max()


def test_temporal_split_breaks_ties_by_order_and_keeps_single_ratings():
    ratings = _ratings([0, 0, 1, 2, 2], [0, 1, 0, 0, 1], [1, 2, 3, 4, 5], [7, 7, 1, 9, 3])
    split = temporal_split(ratings, 0.5)
    assert split.test.items[split.test.users == 0].tolist() == [1]  # later row of the tie
    assert 1 not in split.test.users  # a single rating stays in train
    assert split.test.timestamps[split.test.users == 2].tolist() == [9]


def test_temporal_split_needs_timestamps():
    with pytest.raises(ValueError, match="timestamps"):
        temporal_split(_ratings([0, 1], [0, 0], [1, 2]), 0.2)


# --------------------------------------------------------------------------------------
# Synthetic data
# --------------------------------------------------------------------------------------


def test_synthetic_is_deterministic_and_well_formed(synthetic):
    again = synthetic_ratings(300, 200, 6000, seed=3)
    other = synthetic_ratings(300, 200, 6000, seed=4)
    for field in ("users", "items", "ratings", "timestamps"):
        np.testing.assert_array_equal(getattr(synthetic, field), getattr(again, field))
    assert not np.array_equal(synthetic.items, other.items)
    assert (len(synthetic), synthetic.n_users, synthetic.n_items) == (6000, 300, 200)
    keys = synthetic.users.astype(np.int64) * synthetic.n_items + synthetic.items
    assert np.unique(keys).size == keys.size
    assert np.bincount(synthetic.users, minlength=300).min() >= 1
    assert synthetic.scale.contains(synthetic.ratings).all()
    assert np.all(np.diff(synthetic.timestamps) > 0)
    assert len(np.unique(synthetic.ratings)) == 5


def _top_decile_share(ratings: Ratings) -> float:
    counts = np.sort(np.bincount(ratings.items, minlength=ratings.n_items))[::-1]
    return counts[: max(1, ratings.n_items // 10)].sum() / counts.sum()


def test_synthetic_popularity_is_long_tailed():
    skewed = synthetic_ratings(3000, 1000, 30000, seed=1)
    flat = synthetic_ratings(3000, 1000, 30000, popularity_exponent=0.0, seed=1)
    assert _top_decile_share(skewed) > 0.45
    assert _top_decile_share(flat) < 0.2


def test_synthetic_handles_full_and_tiny_matrices():
    full = synthetic_ratings(20, 15, 300, seed=2)
    assert np.unique(full.users.astype(np.int64) * 15 + full.items).size == 300
    nearly = synthetic_ratings(20, 15, 290, scale=ML_LATEST_SCALE, seed=2)
    assert len(nearly) == 290 and ML_LATEST_SCALE.contains(nearly.ratings).all()
    assert len(synthetic_ratings(1, 1, 1)) == 1


def test_synthetic_survives_extreme_popularity():
    # Nearly all draws hit one item, so weighted sampling stalls and uniform draws finish.
    ratings = synthetic_ratings(100, 1000, 5000, popularity_exponent=50.0, seed=0)
    keys = ratings.users.astype(np.int64) * ratings.n_items + ratings.items
    assert len(ratings) == 5000 and np.unique(keys).size == 5000


@pytest.mark.parametrize(
    ("args", "message"),
    [((3, 2, 7), "do not fit"), ((10, 10, 5), "every user"), ((0, 10, 5), "n_users")],
)
def test_synthetic_rejects_impossible_sizes(args, message):
    with pytest.raises(ValueError, match=message):
        synthetic_ratings(*args)


# --------------------------------------------------------------------------------------
# Data sets
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def embedded():
    return load_dataset()


def test_embedded_default_loads(embedded):
    assert embedded_default_path().is_file()
    train, test = embedded.train, embedded.test
    assert len(train) + len(test) == 100004
    assert (train.n_users, train.n_items) == (671, 9066)
    assert train.scale == ML_LATEST_SCALE == RatingScale(0.5, 5.0, 0.5)
    assert len(test) == 20001
    assert train.name == "ml-latest-small"


def test_embedded_default_is_found_outside_the_repository(tmp_path):
    # Run from elsewhere, so that the repository's folders are not importable by their own names.
    script = (
        "from securefed.recsys.data import embedded_default_path; print(embedded_default_path())"
    )
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    found = Path(done.stdout.strip())
    assert found.is_file() and found.parent.name == "ml-latest-small"
    assert found.read_bytes() == embedded_default_path().read_bytes()


def test_embedded_default_temporal_split():
    split = load_dataset("ml-latest-small", split="temporal")
    assert len(split.train) + len(split.test) == 100004
    assert split.name == "ml-latest-small/temporal"


def _mini_ml100k(folder: Path) -> Path:
    rows = [(1, 10, 3, 5), (1, 20, 4, 6), (2, 10, 5, 7), (3, 30, 1, 8), (2, 30, 2, 9)]
    lines = [f"{u}\t{i}\t{r}\t{t}\n" for u, i, r, t in rows]
    folder.mkdir()
    _write(folder, "u.data", "".join(lines))
    _write(folder, "u1.base", "".join(lines[:3]))
    _write(folder, "u1.test", "".join(lines[3:]))
    return folder


def test_load_movielens_100k_indexes_train_and_test_together(tmp_path):
    root = _mini_ml100k(tmp_path / "ml-100k")
    split = load_movielens_100k(root, "u1")
    assert split.name == "ml-100k/u1"
    assert split.train.user_ids.tolist() == [1, 2, 3]
    assert split.train.item_ids.tolist() == [10, 20, 30]
    assert split.test.users.tolist() == [2, 1] and split.test.items.tolist() == [2, 2]
    assert load_dataset(root).name == "ml-100k/u1"
    random = load_dataset(root, split="random", test_fraction=0.4, seed=1)
    assert (len(random.train), len(random.test)) == (3, 2)
    with pytest.raises(ValueError):
        load_movielens_100k(root, "u9")
    with pytest.raises(ValueError):
        load_dataset(root, split="by-genre")
    with pytest.raises(FileNotFoundError):
        load_movielens_100k(root, "u2")


def test_load_movielens_100k_rejects_unknown_ids(tmp_path):
    root = _mini_ml100k(tmp_path / "ml-100k")
    _write(root, "u1.test", "9\t10\t3\t1\n")
    with pytest.raises(DataFormatError, match=re.escape("user id 9 does not occur in u.data")):
        load_movielens_100k(root)


def test_load_dataset_from_files_and_folders(tmp_path):
    text = _HEADER + "".join(
        f"{u},{i},{(u + i) % 10 / 2 + 0.5},{u * 10 + i}\n" for u in range(5) for i in range(4)
    )
    folder = tmp_path / "mine"
    folder.mkdir()
    path = _write(folder, "ratings.csv", text)
    by_folder = load_dataset(folder, seed=1)
    by_file = load_dataset(path, seed=1)
    assert (len(by_folder.train), len(by_folder.test)) == (16, 4)
    np.testing.assert_array_equal(by_folder.test.items, by_file.test.items)
    temporal = load_dataset(folder, split="temporal", test_fraction=0.25)
    assert len(temporal.test) == 5
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_dataset(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="holds none"):
        load_dataset(tmp_path)
    with pytest.raises(ValueError):
        load_dataset(folder, test_fraction=0)


@pytest.mark.needs_data
def test_movielens_100k_u1_split():
    root = _ml100k_dir()
    if root is None:
        pytest.skip(
            "MovieLens 100K not found: set SECUREFED_DATA to a folder holding ml-100k/ "
            "or place it in ../shared/data next to the repository"
        )
    split = load_movielens_100k(root, "u1")
    assert (len(split.train), len(split.test)) == (80000, 20000)
    assert (split.train.n_users, split.train.n_items) == (943, 1682)
    assert split.train.scale == ML100K_SCALE
    keys = [part.users.astype(np.int64) * 1682 + part.items for part in (split.train, split.test)]
    assert np.intersect1d(*keys).size == 0
    everything = load_ratings(root / "u.data")
    assert (len(everything), everything.n_users, everything.n_items) == (100000, 943, 1682)
