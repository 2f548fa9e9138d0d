"""The saved ServerView: its documentation, its size, and `securefed attack` on a saved view.

docs/serverview.md documents the saved format field by field; these tests save a view through
every registered transport and check that every key the files hold is named in that page (so
the page cannot fall out of step again), that aggregates are kept only in the selected rounds,
and that the ``attack`` command scores a saved view against the run's ratings and refuses a
truth that is not the run's.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest

from securefed import RoundSelection, RunOptions, SeedTree, TransportUnavailable, run_rounds
from securefed.bench.cli import main
from securefed.recsys.data import ML100K_SCALE, random_split, synthetic_ratings
from securefed.recsys.fedmf import FedMF, FedMFConfig
from securefed.transport import (
    build_transport,
    option_groups,
    parse_transport_spec,
    transport_names,
)
from securefed.views import (
    Concatenation,
    ServerView,
    ViewFormatError,
    load_record,
    save_record,
    saved_bytes_by_round,
    write_arrays,
)

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


def saved_view(
    split, name: str, directory: Path, rounds: int = 3, keep: str = "last:2", dim: int = 3
):
    groups = option_groups(parse_transport_spec(name).name)
    options = {"noise_multiplier": 1.0, "dp.clip": 1.0} if "dp" in groups else None
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
    model = FedMF(split.train, FedMFConfig(dim=dim, rounds=rounds), SeedTree(0))
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
    # Every part of every array name, less the round and client ids and the fields above.
    parts = {
        p for a in manifest["arrays"] for p in re.split(r"/", a) if not re.fullmatch(r"r?\d+", p)
    }
    missing = sorted((keys | fields | parts) - documented)
    assert not missing, f"docs/serverview.md does not document {missing} ({name})"
    assert len(manifest["rounds"]) == 3 and manifest["version"] == 3


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


def test_a_kept_secure_aggregation_round_costs_at_most_four_plaintext_rounds(tmp_path):
    """Issue 29, item 4: a kept secagg round held every client's dense masked block (42x the
    plaintext round on ml-latest-small); it keeps their digests now. Bytes are portable.

    The subset keeps the shape of a real run (20 training ratings a user, dim 8; ml-latest-small
    has about 120, dim 20): secure aggregation's own messages cost about 2 KB per client
    whatever the model (keys, k sealed shares and MACs, k revealed shares; k = 10 here), so a
    toy model whose plaintext upload is a few hundred bytes would fail any such bound.
    """
    ratings = synthetic_ratings(30, 300, 750, rank=3, noise=0.3, scale=ML100K_SCALE, seed=5)
    subset = random_split(ratings, 0.2, np.random.default_rng(0))
    kept = {}
    for name in ("plaintext", "secagg", "secagg:keep_masked=true"):
        saved_view(subset, name, tmp_path / name, rounds=2, keep="last:1", dim=8)
        kept[name] = saved_bytes_by_round(tmp_path / name)[1]
    assert kept["secagg"] <= 4 * kept["plaintext"], kept
    # What every kept round cost before (the masked integers, here 10x): the bound needs the digest.
    assert kept["secagg:keep_masked=true"] > 4 * kept["plaintext"], kept
    masked = build_transport(
        "secagg:keep_masked=true",
        n_clients=subset.train.n_users,
        total_rounds=1,
        keep_payloads=RoundSelection.parse("all"),
    )
    assert masked.keep_masked and not build_transport("secagg").keep_masked


def test_a_masked_upload_is_recorded_by_its_digest_unless_kept(split, tmp_path):
    views = {}
    for name in ("secagg", "secagg:keep_masked=true"):
        views[name], _ = saved_view(split, name, tmp_path / name.replace(":", "_"), rounds=1)
    digest, kept = (views[n].round(0) for n in ("secagg", "secagg:keep_masked=true"))
    assert views["secagg"].public["view_keeps_masked"] is False
    for client in digest.clients.tolist():
        assert "masked" not in digest.payload(client)
        wire = kept.payload(client)["masked"].astype("<u8").tobytes()  # the default 64-bit ring
        expected = np.frombuffer(hashlib.sha256(wire).digest(), np.uint8)
        np.testing.assert_array_equal(digest.payload(client)["masked_sha256"], expected)


@pytest.mark.parametrize("name", ["plaintext", "secagg", "dp-local", "ckks"])
def test_attacks_measure_the_same_on_a_view_in_memory_and_reloaded(split, name, tmp_path):
    from securefed.attacks.verify import verify

    view, _ = saved_view(split, name, tmp_path)
    loaded = ServerView.load(tmp_path)
    for before, after in zip(view, loaded, strict=True):  # the same rounds, payloads, arrays
        assert sorted(before.payloads) == sorted(after.payloads)
        for client, fields in before.payloads.items():
            assert sorted(fields) == sorted(after.payloads[client])
            for field, value in fields.items():
                np.testing.assert_array_equal(value, after.payloads[client][field])
                assert np.asarray(value).dtype == after.payloads[client][field].dtype
    in_memory, reloaded = (verify(v, split.train).to_dict() for v in (view, loaded))
    assert json.dumps(in_memory, sort_keys=True) == json.dumps(reloaded, sort_keys=True)
    assert in_memory["attacks_applied"] or name != "plaintext"


def test_version_2_views_are_still_read(split, tmp_path):
    """A version 2 file: payloads one array per client and field, arrays not compressed."""
    view, manifest = saved_view(split, "plaintext", tmp_path / "v3", rounds=2, keep="last:1")
    arrays = {}
    for entry in manifest["rounds"]:
        r = entry["round"]
        rnd = view.round(r)
        arrays |= {f"r{r}/clients": rnd.clients, f"r{r}/bytes_up": rnd.bytes_up}
        arrays |= {f"r{r}/bytes_down": rnd.bytes_down}
        for client, fields in rnd.payloads.items():
            arrays |= {f"r{r}/payload/{client}/{k}": v for k, v in fields.items()}
        arrays |= {f"r{r}/aggregate/{k}": v for k, v in rnd.aggregate.items()}
        arrays |= {f"r{r}/broadcast/{k}": v for k, v in rnd.broadcast.items()}
    body = {k: v for k, v in manifest.items() if k not in ("arrays", "digest")} | {"version": 2}
    save_record(tmp_path / "v2", body, arrays)
    old = ServerView.load(tmp_path / "v2")
    for client, fields in view.round(1).payloads.items():
        for field, value in fields.items():
            np.testing.assert_array_equal(old.round(1).payload(client)[field], value)
    body["version"] = 1
    save_record(tmp_path / "v1", body, arrays)
    with pytest.raises(ViewFormatError, match=r"unsupported version 1 .*reads version 2, 3"):
        ServerView.load(tmp_path / "v1")


def test_a_packed_field_whose_lengths_do_not_split_it_is_refused(split, tmp_path):
    saved_view(split, "plaintext", tmp_path, rounds=1, keep="all")
    manifest, arrays = load_record(tmp_path, format_name="securefed.server_view", versions=(3,))
    arrays["r0/packed/rows/lengths"] = arrays["r0/packed/rows/lengths"] + 1
    save_record(tmp_path / "bad", manifest, arrays)
    with pytest.raises(ViewFormatError, match="do not split its"):
        ServerView.load(tmp_path / "bad")


def test_a_packed_field_is_written_as_its_concatenation(tmp_path):
    pieces = [np.arange(6.0).reshape(3, 2), np.zeros((0, 2)), np.asfortranarray([[7.0, 8.0]])]
    write_arrays(tmp_path / "a.npz", {"x": Concatenation(pieces), "y": np.arange(3)})
    with np.load(tmp_path / "a.npz", allow_pickle=False) as stored:
        np.testing.assert_array_equal(stored["x"], np.concatenate(pieces))
        assert stored["x"].dtype == np.float64 and stored["y"].tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="one dtype"):
        Concatenation([np.zeros(2), np.zeros(2, np.int64)])
