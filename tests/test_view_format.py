"""The saved ServerView: its documentation, its size, and `securefed attack` on a saved view.

docs/serverview.md documents the saved format field by field; these tests save a view through
every registered transport and check that every key the files hold is named in that page (so
the page cannot fall out of step again), that aggregates are kept only in the selected rounds,
and that the ``attack`` command scores a saved view against the run's ratings and refuses a
truth that is not the run's.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from securefed import RoundSelection, RunOptions, SeedTree, TransportUnavailable, run_rounds
from securefed.bench.cli import main
from securefed.recsys.data import ML100K_SCALE, random_split, synthetic_ratings
from securefed.recsys.fedmf import FedMF, FedMFConfig
from securefed.transport import build_transport, option_groups, transport_names

DOC = Path(__file__).resolve().parents[1] / "docs" / "serverview.md"


@pytest.fixture(scope="module")
def split():
    ratings = synthetic_ratings(14, 12, 90, rank=3, noise=0.3, scale=ML100K_SCALE, seed=5)
    return random_split(ratings, 0.2, np.random.default_rng(0))


def documented_names() -> set[str]:
    """Every `name` written in backticks in docs/serverview.md (split on / and . too)."""
    text = DOC.read_text()
    names = set()
    for quoted in re.findall(r"`([^`]+)`", text):
        names.add(quoted)
        names.update(part for part in re.split(r"[/{}.\s\[\]]+", quoted) if part)
    return names


def saved_view(split, name: str, directory: Path, rounds: int = 3, keep: str = "last:2"):
    options = {"noise_multiplier": 1.0, "dp.clip": 1.0} if "dp" in option_groups(name) else None
    if name == "ckks+dp":  # it has no default mechanism: the float one, chosen
        options["mechanism"] = "gaussian"
    try:
        transport = build_transport(
            name,
            options,
            n_clients=split.train.n_users,
            total_rounds=rounds,
            keep_payloads=RoundSelection.parse(keep),
        )
    except TransportUnavailable as missing:
        pytest.skip(str(missing))
    model = FedMF(split.train, FedMFConfig(dim=3, rounds=rounds), SeedTree(0))
    run_rounds(model, transport, SeedTree(0), RunOptions(rounds=rounds, progress=False))
    transport.view.save(directory)
    return transport.view, json.loads((directory / "manifest.json").read_text())


@pytest.mark.parametrize("name", transport_names())
def test_every_field_a_saved_view_holds_is_documented(split, name, tmp_path):
    _, manifest = saved_view(split, name, tmp_path)
    documented = documented_names()
    keys = set(manifest) | {k for r in manifest["rounds"] for k in r}
    fields = set()
    for entry in manifest["rounds"]:
        fields.update(f for names in entry["payload_fields"].values() for f in names)
        fields.update(entry["aggregate"] + entry["broadcast"])
    missing = sorted((keys | fields) - documented)
    assert not missing, f"docs/serverview.md does not document {missing} ({name})"
    assert len(manifest["rounds"]) == 3 and manifest["version"] == 2


def test_only_selected_rounds_keep_their_aggregates(split, tmp_path):
    view, manifest = saved_view(split, "plaintext", tmp_path, rounds=4, keep="last:1")
    assert [sorted(r["aggregate"]) for r in manifest["rounds"]] == [[], [], [], ["total", "weight"]]
    assert [bool(r.aggregate) for r in view] == [False, False, False, True]
    assert all(r.bytes_up.sum() > 0 for r in view)  # the byte ledger stays for every round


def test_attack_command_scores_a_saved_view_and_refuses_another_split(tmp_path, capsys):
    view_dir, report = tmp_path / "view", tmp_path / "attack.json"
    base = ["fedmf", "--rounds", "2", "--dim", "4", "--seed", "0", "--no-progress"]
    assert main([*base, "--save-view", str(view_dir), "--view-rounds", "last:2"]) == 0
    capsys.readouterr()
    assert main(["attack", str(view_dir), "--truth", "ml-latest-small", "--json", str(report)]) == 0
    shown = capsys.readouterr().out
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in shown.splitlines()]
    assert ["ratings recovered exactly (share)", "1.0000"] in [r[:2] for r in rows]  # plaintext
    record = json.loads(report.read_text())
    assert record["overall"]["exact_share"] == 1.0 and record["baseline"]["exact_share"] < 0.2
    assert record["truth"]["split_seed"] == 0 and "per_user" not in record
    wrong = ["attack", str(view_dir), "--truth", "ml-latest-small", "--split-seed", "3"]
    assert main(wrong) == 2
    assert "contradicts the view" in capsys.readouterr().err
