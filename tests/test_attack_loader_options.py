"""`securefed attack` rebuilds a run's truth from the loader options its view records (issue 29,
item 5): runs read with ``--duplicates`` or ``--scale`` are scored, and a source whose SHA-256
is not the recorded one is refused, naming both digests."""

from __future__ import annotations

import json

import numpy as np
import pytest

from securefed.bench.cli import main
from securefed.bench.datasets import LoaderOptions, source_sha256

RUN = ["fedmf", "--rounds", "2", "--dim", "4", "--seed", "0", "--no-progress"]


def write_ratings(path, *, repeats: int, half_stars: bool) -> None:
    """A 4-column tab file (user, item, rating, timestamp), ``repeats`` pairs given twice."""
    rng = np.random.default_rng(7)
    pairs = {(u, i) for u in range(1, 31) for i in rng.choice(np.arange(1, 41), 12, replace=False)}
    levels = np.arange(0.5, 4.01, 0.5) if half_stars else np.arange(1, 6)
    lines = [
        f"{u}\t{i}\t{rng.choice(levels):g}\t{1000 + k}" for k, (u, i) in enumerate(sorted(pairs))
    ]
    for k, (u, i) in enumerate(sorted(pairs)[:repeats]):
        lines.append(f"{u}\t{i}\t{levels[k % len(levels)]:g}\t{5000 + k}")
    path.write_text("\n".join(lines) + "\n")


def saved_run(tmp_path, data, options: list[str]):
    view = tmp_path / "view"
    assert main([*RUN, "--data", str(data), *options, "--save-view", str(view)]) == 0
    return view


def attack(view, data, report, *extra: str) -> int:
    return main(["attack", str(view), "--truth", str(data), "--json", str(report), *extra])


@pytest.mark.parametrize("policy", ["first", "last", "mean"])
def test_a_run_read_with_a_duplicates_policy_is_scored(policy, tmp_path, capsys):
    data = tmp_path / "ratings.tsv"
    write_ratings(data, repeats=9, half_stars=False)
    assert main([*RUN, "--data", str(data)]) == 2  # the reader refuses the repeats by default
    assert "(--duplicates)" in capsys.readouterr().err
    view = saved_run(tmp_path, data, ["--duplicates", policy])
    recorded = json.loads((view / "manifest.json").read_text())["public"]["data"]
    assert recorded["loader"]["duplicates"] == policy
    assert recorded["source_sha256"] == source_sha256(data)
    capsys.readouterr()
    assert attack(view, data, tmp_path / "attack.json") == 0, capsys.readouterr().err
    report = json.loads((tmp_path / "attack.json").read_text())
    assert report["overall"]["exact_share"] == 1.0  # plaintext: every training rating
    assert report["truth"]["loader"] == LoaderOptions(duplicates=policy).to_dict()
    assert attack(view, data, tmp_path / "a.json", "--duplicates", "error") == 2
    assert "contradicts the view" in capsys.readouterr().err


def test_a_run_read_on_a_given_scale_is_scored(tmp_path, capsys):
    data = tmp_path / "half_stars.tsv"
    write_ratings(data, repeats=0, half_stars=True)
    view = saved_run(tmp_path, data, ["--scale", "0.5:4:0.5"])
    capsys.readouterr()
    assert attack(view, data, tmp_path / "attack.json") == 0, capsys.readouterr().err
    report = json.loads((tmp_path / "attack.json").read_text())
    assert report["overall"]["exact_share"] == 1.0
    assert report["truth"]["loader"]["scale"] == "0.5:4:0.5"


def test_a_changed_source_is_refused_naming_both_digests(tmp_path, capsys):
    data = tmp_path / "ratings.tsv"
    write_ratings(data, repeats=0, half_stars=False)
    view = saved_run(tmp_path, data, [])
    recorded = source_sha256(data)
    lines = data.read_text().splitlines()
    lines[0] = lines[0].rsplit("\t", 1)[0] + "\t999"  # another timestamp, the same ratings
    data.write_text("\n".join(lines) + "\n")
    capsys.readouterr()
    assert attack(view, data, tmp_path / "attack.json") == 2
    error = capsys.readouterr().err
    assert recorded in error and source_sha256(data) in error
    assert not (tmp_path / "attack.json").exists()


def test_loader_options_from_a_newer_view_are_refused_by_name():
    with pytest.raises(ValueError, match=r"\['encoding'\].*newer version"):
        LoaderOptions.from_dict({"split": "random", "encoding": "latin-1"})
    assert LoaderOptions.from_dict({}) == LoaderOptions()


def test_a_view_saved_before_loader_options_takes_them_from_the_command_line(tmp_path, capsys):
    """The error for such a view names --duplicates, which the attack now takes."""
    from securefed.views import ServerView

    data = tmp_path / "ratings.tsv"
    write_ratings(data, repeats=9, half_stars=False)
    view = ServerView.load(saved_run(tmp_path, data, ["--duplicates", "last"]))
    recorded = view.public["data"]
    # What views recorded before `loader`: the name, the source, the split and its seed.
    view.public["data"] = {
        "name": recorded["name"],
        "source": str(data),
        "split": None,
        "split_seed": 0,
    }
    view.save(tmp_path / "legacy")
    capsys.readouterr()
    assert attack(tmp_path / "legacy", data, tmp_path / "a.json") == 2
    assert "(--duplicates)" in capsys.readouterr().err
    assert attack(tmp_path / "legacy", data, tmp_path / "a.json", "--duplicates", "last") == 0
    report = json.loads((tmp_path / "a.json").read_text())
    assert report["overall"]["exact_share"] == 1.0 and report["truth"]["source_sha256"] is None
